#!/usr/bin/env bash
# trainplan layout for tiny-llama-0.4b: framework=deepspeed, dp=16 tp=1 pp=1 cp=1 ep=1, sequence_parallel=false, zero_stage=3, offload_optimizer=cpu offload_params=cpu, recompute=full, micro_batch=2 accumulation=8, global_batch=256 seq_len=4096, precision=bf16, world=16 (2 node(s) x 8 H100-SXM-80GB)
# Accelerate 1.15.0: run on every node.
# attention: train.py must load the model with from_pretrained(..., attn_implementation="flash_attention_2"): the estimate times flash attention.
# batch: train.py's DataLoader must give each process micro-batches of 2 sequences of 4096 tokens, ds_config's train_micro_batch_size_per_gpu: Accelerate does not check the DataLoader against it, and DeepSpeed steps the optimizer every 8 micro-batches (gradient_accumulation_steps), a global batch of 256 sequences as estimated only with that micro-batch.
# recompute full: train.py must call model.activation_checkpointing_enable() (transformers 5.24; gradient_checkpointing_enable() is its deprecated alias, and the name before 5.x) so that every decoder layer keeps only its input, as estimated, before handing the model to the launcher.
# optimizer adamw: ds_config.json builds DeepSpeed's AdamW, as estimated; train.py must pass accelerate.utils.DummyOptim(model.parameters()) to accelerator.prepare in its place (Accelerate refuses a torch optimizer beside ds_config's).
# optimizer settings (lr 0.0003, betas 0.9/0.95, weight decay 0.1, gradient clipping 1) are the Llama 2 pretraining recipe's, placeholders the estimate does not read: set this run's (a fine-tune takes a smaller learning rate).
# Run from the directory holding accelerate_config.yaml and ds_config.json (relative paths).
set -euo pipefail
# Run this same script on every node; set MASTER_ADDR to the first node's address.
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"
export MASTER_PORT="${MASTER_PORT:-29500}"
export JOB_ID="${JOB_ID:-trainplan}"
: "${NODE_RANK:?set NODE_RANK to the index of this node, 0 on the first}"
accelerate launch --config_file accelerate_config.yaml --machine_rank "${NODE_RANK}" \
    --main_process_ip "${MASTER_ADDR}" --main_process_port "${MASTER_PORT}" train.py
