#!/usr/bin/env bash
# Accelerate 1.15.0: run on every node.
# optimizer: train.py must build torch.optim.AdamW(..., fused=True), as estimated (training.optimizer_implementation); torch.optim's default on CUDA is foreach, which makes a temporary of the trainable parameters' size during the step.
# tp=2: train.py must load the model with from_pretrained(..., tp_size=2, tp_plan='auto', device_mesh=accelerator.torch_device_mesh): transformers shards it; without them the model is not split and the estimate does not hold.
# fsdp gradient reduce: before the model is prepared (accelerator.prepare; the Trainer's train() prepares it), set accelerator.state.fsdp_plugin.mixed_precision_policy = torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.bfloat16): the estimate reduce-scatters gradients in float32, the plugin's own policy in bfloat16.
# trainplan layout for llama-3.1-8b: framework=fsdp, dp=16 tp=2 pp=1 cp=1 ep=1, sequence_parallel=true, zero_stage=3, offload_optimizer=none offload_params=none, recompute=full, micro_batch=1 accumulation=32, global_batch=512 seq_len=8192, precision=bf16, fsdp_hybrid_shard=true, world=32 (4 node(s) x 8 H100-SXM-80GB)
set -euo pipefail
# Run this same script on every node; set MASTER_ADDR to the first node's address.
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"
export MASTER_PORT="${MASTER_PORT:-29500}"
export JOB_ID="${JOB_ID:-trainplan}"
: "${NODE_RANK:?set NODE_RANK to the index of this node, 0 on the first}"
accelerate launch --config_file accelerate_config.yaml --machine_rank "${NODE_RANK}" \
    --main_process_ip "${MASTER_ADDR}" --main_process_port "${MASTER_PORT}" train.py
