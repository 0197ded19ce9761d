#!/usr/bin/env bash
# trainplan layout for llama-3.1-8b: framework=fsdp, dp=16 tp=2 pp=1 cp=1 ep=1, sequence_parallel=true, zero_stage=3, offload_optimizer=none offload_params=none, recompute=full, micro_batch=1 accumulation=32, global_batch=512 seq_len=8192, precision=bf16, fsdp_hybrid_shard=true (4 replicas), world=32 (4 node(s) x 8 H100-SXM-80GB)
# torchtitan 0.3.0: config module plus --section.field overrides (no TOML since 0.3.0).
# It trains from a fresh initialisation on the config module's dataset and learning-rate
# schedule: to fine-tune, set --checkpoint.initial_load_path to the model's DCP checkpoint, and
# the dataset, --lr_scheduler.warmup_steps and --optimizer.lr for this run's steps.
# Attention is FlexAttention with block-causal masks (each packed document attends within
# itself); the estimate times a causal triangle over the whole sequence at FlashAttention-2's
# rate: more FLOPs than those masks run where documents are shorter than seq_len, at a kernel
# rate FlexAttention's need not reach.
# CUDA graphs are off (--training.disable_cuda_graphs; torchtitan's default captures the forward
# and backward): the estimate times eager kernel launches and frees the gradients at zero_grad;
# a captured step keeps them and a graph memory pool beside the eager one, which it does not model.
set -euo pipefail
# Run this same script on every node; set MASTER_ADDR to the first node's address.
: "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"
export MASTER_PORT="${MASTER_PORT:-29500}"
export JOB_ID="${JOB_ID:-trainplan}"
export PYTORCH_ALLOC_CONF=expandable_segments:True
torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR}:${MASTER_PORT}" \
    --rdzv-id "${JOB_ID}" -m torchtitan.train --module llama3 --config llama3_8b \
    --parallelism.data_parallel_replicate_degree 4 --parallelism.data_parallel_shard_degree 4 \
    --parallelism.tensor_parallel_degree 2 --parallelism.pipeline_parallel_degree 1 \
    --parallelism.context_parallel_degree 1 --parallelism.fsdp_reshard_after_forward always \
    --training.local_batch_size 1 --training.global_batch_size 512 --training.seq_len 8192 \
    --training.steps 2385 --training.max_norm 1.0 --loss.num_chunks 1 --optimizer.implementation fused \
    --training.mixed_precision_param bfloat16 --training.mixed_precision_reduce float32 \
    --compile.no-enable --compile.no-enable-async-tensor-parallel --training.disable_cuda_graphs activation_checkpoint:full
