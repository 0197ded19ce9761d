#!/usr/bin/env bash
# Accelerate 1.15.0: run on every node.
# trainplan layout for tiny-llama-0.4b: framework=fsdp, dp=8 tp=1 pp=1 cp=1 ep=1, sequence_parallel=false, zero_stage=2, offload_optimizer=none offload_params=none, recompute=none, micro_batch=4 accumulation=8, global_batch=256 seq_len=4096, precision=fp16, world=8 (1 node(s) x 8 H100-SXM-80GB)
set -euo pipefail
accelerate launch --config_file accelerate_config.yaml train.py
