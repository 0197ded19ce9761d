#!/usr/bin/env bash
# trainplan layout for tiny-llama-0.4b: framework=deepspeed, dp=16 tp=1 pp=1 cp=1 ep=1, sequence_parallel=false, zero_stage=3, offload_optimizer=cpu offload_params=cpu, recompute=full, micro_batch=2 accumulation=8, global_batch=256 seq_len=4096, precision=bf16, world=16 (2 node(s) x 8 H100-SXM-80GB)
# HF Trainer (transformers 5.24.0): train.py parses TrainingArguments with HfArgumentParser,
# from these flags or from training_args.json (parse_json_file).
# attention: train.py must load the model with from_pretrained(..., attn_implementation="flash_attention_2"): the estimate times flash attention.
# optimizer settings (lr 0.0003, betas 0.9/0.95, weight decay 0.1, gradient clipping 1) are the Llama 2 pretraining recipe's, placeholders the estimate does not read: set this run's (a fine-tune takes a smaller learning rate).
set -euo pipefail
# Run this same script on every node; set MASTER_ADDR to the first node's address.
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"
export MASTER_PORT="${MASTER_PORT:-29500}"
export JOB_ID="${JOB_ID:-trainplan}"
torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR}:${MASTER_PORT}" \
    --rdzv-id "${JOB_ID}" train.py --output_dir output --max_steps 1000 --per_device_train_batch_size 2 \
    --gradient_accumulation_steps 8 --optim adamw_torch_fused --learning_rate 0.0003 --adam_beta1 0.9 \
    --adam_beta2 0.95 --adam_epsilon 1e-08 --weight_decay 0.1 --max_grad_norm 1.0 --bf16 true \
    --activation_checkpointing true --dataloader_num_workers 4 --dataloader_prefetch_factor 2 \
    --dataloader_pin_memory true --dataloader_persistent_workers true --logging_steps 10 --save_steps 500 \
    --report_to none --deepspeed ds_config.json
