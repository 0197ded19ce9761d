#!/usr/bin/env bash
# trainplan layout for tiny-llama-0.4b: framework=fsdp, dp=8 tp=1 pp=1 cp=1 ep=1, sequence_parallel=false, zero_stage=2, offload_optimizer=none offload_params=none, recompute=none, micro_batch=4 accumulation=8, global_batch=256 seq_len=4096, precision=fp16, world=8 (1 node(s) x 8 H100-SXM-80GB)
# Accelerate 1.15.0: run on every node.
# attention: train.py must load the model with from_pretrained(..., attn_implementation="flash_attention_2"): the estimate times flash attention.
# optimizer: train.py must build torch.optim.AdamW(..., fused=True), as estimated (training.optimizer_implementation); torch.optim's default on CUDA is foreach, which makes a temporary of the trainable parameters' size during the step.
# fsdp gradient reduce: before the model is prepared (accelerator.prepare; the Trainer's train() prepares it), set accelerator.state.fsdp_plugin.mixed_precision_policy = torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32, output_dtype=torch.float16): the estimate reduce-scatters gradients in float32, the plugin's own policy in float16.
# batch: train.py's DataLoader must give each process micro-batches of 4 sequences of 4096 tokens, and each step must run inside accelerator.accumulate(model): with ACCELERATE_GRADIENT_ACCUMULATION_STEPS=8 (exported below) the Accelerator steps the optimizer every 8 micro-batches, a global batch of 4 x dp 8 x 8 = 256 sequences, as estimated. FSDP shards the gradients only if every micro-batch reduces them: build Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=8, sync_each_batch=True)); without sync_each_batch, accumulate() skips the reduce-scatter and every rank keeps the whole model's unsharded gradients.
set -euo pipefail
export ACCELERATE_GRADIENT_ACCUMULATION_STEPS=8
accelerate launch --config_file accelerate_config.yaml train.py
