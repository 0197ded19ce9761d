"""The published memory formulas, reproduced exactly, that validation compares the estimator with.

They are the references of ``validation/REPORT.md``'s published-memory section and of
``tests/estimator/test_reference_memory.py``, not part of the estimator (which never calls them):

* DeepSpeed's ``estimate_zero2_model_states_mem_needs`` and ``estimate_zero3_model_states_mem_needs``
  (deepspeed/runtime/zero/stage_1_and_2.py and stage3.py @edaa722);
* Megatron-LM's ``compute_weight_and_optimizer_memory`` and its activation memory
  (megatron/training/theoretical_memory_usage.py @d98e8a6);
* Korthikanti et al. (arXiv:2205.05198) Table 2, activation bytes per transformer layer.
"""

from __future__ import annotations

from service.estimator.types import ParameterCounts

# ---------------------------------------------------------------- model states (DeepSpeed, Megatron-LM)


def deepspeed_zero2_estimate(
    total_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    additional_buffer_factor: float = 1.5,
    legacy: bool = False,
) -> tuple[int, int]:
    """DeepSpeed ``estimate_zero2_model_states_mem_needs`` (@edaa722): (gpu_bytes, cpu_bytes).

    ``legacy`` gives the formula before PR #5099 (4P + 16P/G), which the docs' 15.93 GB still shows.
    """
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        # 2 = 16-bit params on the GPU; the host holds fp32 params, grads and moments per GPU.
        gpu = 2 * total_params
        cpu = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        # 18 = 2 grads16 + 4 grads32 + 4 params32 + 8 optimizer states32, partitioned.
        gpu = (
            4 * total_params + int(16 * total_params / total_gpus)
            if legacy
            else 2 * total_params + int(18 * total_params / total_gpus)
        )
        cpu = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(gpu), int(cpu)


def deepspeed_zero3_estimate(
    total_params: int,
    largest_layer_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    cpu_offload_params: bool = True,
    zero_init: bool = True,
    additional_buffer_factor: float = 1.5,
) -> tuple[int, int]:
    """DeepSpeed ``estimate_zero3_model_states_mem_needs`` (@edaa722): (gpu_bytes, cpu_bytes)."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer = 4 * largest_layer_params  # 16-bit params + grads of the largest layer
    # Host multipliers: 18 = 16 (fp32 params, grads, 2 moments) + 2 (16-bit params); 4 x GPUs per
    # node = the fp32 model each process builds on the CPU without zero.Init.
    if cpu_offload and cpu_offload_params:
        gpu, per = largest_layer, 18.0
    elif cpu_offload:
        gpu, per = largest_layer + int(2 * total_params / total_gpus), 16.0
    else:
        gpu = largest_layer + int(18 * total_params / total_gpus)
        host = (largest_layer_params if zero_init else total_params) * 4 * num_gpus_per_node
        return int(gpu), int(host * additional_buffer_factor)
    cpu: float
    if zero_init:
        cpu = total_params * per * gpus_factor * additional_buffer_factor
    else:
        cpu = total_params * max(4 * num_gpus_per_node, per * gpus_factor) * additional_buffer_factor
    return int(gpu), int(cpu)


def megatron_weight_and_optimizer_bytes(
    counts: ParameterCounts,
    *,
    tp: int,
    pp: int,
    dp: int,
    ep: int = 1,
    etp: int | None = None,
    cp: int = 1,
    distributed_optimizer: bool = True,
) -> float:
    """Megatron-LM ``compute_weight_and_optimizer_memory`` (d98e8a6) for the most-loaded shard."""
    etp = tp if etp is None else etp
    layers = counts.dense_layers + counts.moe_layers
    block = counts.attention_per_layer * layers + counts.dense_mlp_per_layer * counts.dense_layers
    block += counts.shared_experts_per_moe_layer * counts.moe_layers
    tp_sharded = (block / pp + counts.embedding + (counts.output if pp == 1 else 0)) / tp
    replicated = (
        counts.norms_per_layer * layers + counts.router_per_moe_layer * counts.moe_layers + counts.final_norm
    ) / pp
    expert = counts.experts_per_moe_layer * counts.moe_layers / (pp * etp * ep)
    expert_dp = dp * tp * pp * cp // (etp * ep * pp)

    def per_param(data_parallel: int) -> float:
        # bf16 params, fp32 main grads, fp32 main params and Adam: 18, or 6 + 12/d distributed.
        return 6 + 12 / data_parallel if distributed_optimizer else 18

    return (tp_sharded + replicated) * per_param(dp) + expert * per_param(expert_dp)


# ---------------------------------------------------------------- activations (Korthikanti, Megatron-LM)


def korthikanti_layer_bytes(
    *, s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False, selective: bool = False
) -> float:
    """Korthikanti et al. Table 2: bytes per transformer layer (16-bit, 1-byte masks, 4h GeLU)."""
    # sbh(10 + 24/t + 5as/(ht)); SP shards the 10: sbh(34/t + 5as/(ht)); selective drops 5as/(ht).
    replicated = 10 * s * b * h / (t if sequence_parallel else 1)
    sharded = 24 * s * b * h / t
    scores = 0.0 if selective else 5 * a * s * s * b / t
    return replicated + sharded + scores


def megatron_theoretical_activation_bytes(
    *,
    seq_length: int,
    micro_batch_size: int,
    hidden_size: int,
    ffn_hidden_size: int,
    num_layers: int,
    padded_vocab_size: int,
    tp: int,
    pp: int,
    virtual_pp: int | None = None,
    num_microbatches: int | None = None,
    sequence_parallel: bool = False,
    selective_recompute: bool = False,
) -> float:
    """Megatron-LM ``theoretical_memory_usage.py`` (d98e8a6) activation memory, dense models."""
    sbh = seq_length * micro_batch_size * hidden_size
    with_sp = sequence_parallel and selective_recompute
    per_layer = sbh * (18 + 4 * ffn_hidden_size / hidden_size) if with_sp else sbh * (10 + 24 / tp)
    total = per_layer * num_layers + 8 * seq_length * micro_batch_size * pp + sbh * pp
    if virtual_pp is not None:
        total *= 1 + (pp - 1) / (pp * virtual_pp)
    elif pp > 1 and num_microbatches is not None:
        total *= min(1, num_microbatches / pp)
    if pp == 1 and with_sp:
        total += sbh * 4 * (1 + padded_vocab_size / hidden_size)
    elif pp == 1:
        total += 2 * (seq_length * micro_batch_size * padded_vocab_size / tp + sbh)
    return total / tp if with_sp else total * 1.05
