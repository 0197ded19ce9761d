#!/usr/bin/env bash
# trainplan layout for tiny-llama-0.4b: framework=megatron, dp=2 tp=2 pp=2 cp=1 ep=1, sequence_parallel=true, zero_stage=1, offload_optimizer=none offload_params=none, recompute=selective, micro_batch=1 accumulation=128, global_batch=256 seq_len=4096, precision=bf16, virtual_pipeline_stages=2, world=8 (1 node(s) x 8 H100-SXM-80GB)
# Megatron-LM (main @d98e8a6): run from the Megatron-LM checkout, where pretrain_gpt.py lives.
# It trains from random weights on mock data (--mock-data, a NullTokenizer of the model's
# vocabulary): to fine-tune, add --load/--pretrained-checkpoint with a Megatron checkpoint of the
# model and --finetune, and --data-path with --tokenizer-type/--tokenizer-model for real data.
# optimizer settings (lr 0.0003, betas 0.9/0.95, weight decay 0.1, gradient clipping 1) are the Llama 2 pretraining recipe's, placeholders the estimate does not read: set this run's (a fine-tune takes a smaller learning rate).
# The estimate's 2-byte master (--use-precision-aware-optimizer, store_param_remainders) needs
# Transformer Engine >= 2.1: an older one keeps a 4-byte fp32 master.
set -euo pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --standalone --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 2 --context-parallel-size 1 --sequence-parallel --tp-comm-overlap \
    --num-layers-per-virtual-pipeline-stage 4 --use-distributed-optimizer --overlap-grad-reduce \
    --overlap-param-gather --grad-reduce-in-bf16 --use-precision-aware-optimizer --micro-batch-size 1 \
    --global-batch-size 256 --train-iters 1000 --recompute-granularity selective --bf16 --num-layers 16 \
    --hidden-size 1024 --ffn-hidden-size 2816 --num-attention-heads 16 --group-query-attention \
    --num-query-groups 4 --seq-length 4096 --max-position-embeddings 4096 --position-embedding-type rope \
    --rotary-base 10000 --swiglu --normalization RMSNorm --norm-epsilon 1e-05 \
    --untie-embeddings-and-output-weights --disable-bias-linear --hidden-dropout 0.0 --attention-dropout 0.0 \
    --mock-data --tokenizer-type NullTokenizer --vocab-size 32000 \
    --no-create-attention-mask-in-dataloader --optimizer adam --lr 0.0003 --min-lr 3e-05 --lr-decay-style cosine \
    --clip-grad 1.0 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-08 --log-interval 10 \
    --eval-interval 1000 --eval-iters 10
