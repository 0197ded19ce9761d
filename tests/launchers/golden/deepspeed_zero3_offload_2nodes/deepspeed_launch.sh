#!/usr/bin/env bash
# trainplan layout for tiny-llama-0.4b: framework=deepspeed, dp=16 tp=1 pp=1 cp=1 ep=1, sequence_parallel=false, zero_stage=3, offload_optimizer=cpu offload_params=cpu, recompute=full, micro_batch=2 accumulation=8, global_batch=256 seq_len=4096, precision=bf16, world=16 (2 node(s) x 8 H100-SXM-80GB)
# DeepSpeed 0.19.8 launcher: starts every rank over ssh (pdsh) from this node.
# recompute full: train.py must call model.activation_checkpointing_enable() (transformers 5.24; gradient_checkpointing_enable() is its deprecated alias, and the name before 5.x) so that every decoder layer keeps only its input, as estimated, before handing the model to the launcher.
# optimizer settings (lr 0.0003, betas 0.9/0.95, weight decay 0.1, gradient clipping 1) are the Llama 2 pretraining recipe's, placeholders the estimate does not read: set this run's (a fine-tune takes a smaller learning rate).
# attention: train.py must load the model with from_pretrained(..., attn_implementation="flash_attention_2"): the estimate times flash attention.
set -euo pipefail
# Run this script once, on the first node.
export MASTER_ADDR="${MASTER_ADDR:-node-0}"
export MASTER_PORT="${MASTER_PORT:-29500}"
deepspeed --hostfile=hostfile --num_nodes=2 --num_gpus=8 --master_addr="${MASTER_ADDR}" --master_port="${MASTER_PORT}" train.py \
    --deepspeed --deepspeed_config ds_config.json
