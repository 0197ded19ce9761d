#!/usr/bin/env bash
# trainplan layout for tiny-llama-0.4b: framework=fsdp, dp=8 tp=1 pp=1 cp=1 ep=1, sequence_parallel=false, zero_stage=2, offload_optimizer=none offload_params=none, recompute=none, micro_batch=4 accumulation=8, global_batch=256 seq_len=4096, precision=fp16, world=8 (1 node(s) x 8 H100-SXM-80GB)
# HF Trainer (transformers 5.24.0): train.py parses TrainingArguments with HfArgumentParser,
# from these flags or from training_args.json (parse_json_file).
# attention: train.py must load the model with from_pretrained(..., attn_implementation="flash_attention_2"): the estimate times flash attention.
# fsdp gradient reduce: before the model is prepared (accelerator.prepare; the Trainer's train() prepares it), set trainer.accelerator.state.fsdp_plugin.mixed_precision_policy = torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32, output_dtype=torch.float16): the estimate reduce-scatters gradients in float32, the plugin's own policy in float16.
# optimizer settings (lr 0.0003, betas 0.9/0.95, weight decay 0.1, gradient clipping 1) are the Llama 2 pretraining recipe's, placeholders the estimate does not read: set this run's (a fine-tune takes a smaller learning rate).
set -euo pipefail
torchrun --standalone --nnodes 1 --nproc-per-node 8 train.py --output_dir output --max_steps 1000 \
    --per_device_train_batch_size 4 --gradient_accumulation_steps 8 --optim adamw_torch_fused \
    --learning_rate 0.0003 --adam_beta1 0.9 --adam_beta2 0.95 --adam_epsilon 1e-08 --weight_decay 0.1 \
    --max_grad_norm 1.0 --fp16 true --dataloader_num_workers 4 --dataloader_prefetch_factor 2 \
    --dataloader_pin_memory true --dataloader_persistent_workers true --logging_steps 10 --save_steps 500 \
    --report_to none --fsdp --fsdp_config fsdp_config.json --accelerator_config '{"gradient_accumulation_kwargs":{"sync_each_batch":true}}'
