"""Per-GPU memory of the most-loaded rank, by component, for any layout.

``memory_estimate`` adds up, for the first and the last pipeline stage, the model states
(``service.estimator.model_states``: ZeRO / FSDP / Megatron distributed optimizer, offload), the
activations (``service.estimator.activations``: Megatron's Korthikanti formulas or what Hugging Face
models save), the communication buffers and gathered parameters, and the CUDA/NCCL overhead, and
reports the larger stage (Megatron's theoretical memory models the first stage; the last one holds
the logits). ``max_micro_batch_size`` and ``max_seq_len`` search the monotone fit for the largest
value. Every constant lives in ``MemoryAssumptions``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from service.estimator import activations
from service.estimator.calibration import calibrated_memory
from service.estimator.errors import InvalidLayout
from service.estimator.model_states import (
    DEFAULT_ASSUMPTIONS,
    MemoryAssumptions,
    MiB,
    RankParameters,
    StateBytes,
    deepspeed_assumption,
    deepspeed_buckets,
    deepspeed_zero2_estimate,
    deepspeed_zero3_estimate,
    lora_parameters,
    megatron_weight_and_optimizer_bytes,
    rank_model_states,
    rank_parameters,
    shard_degrees,
    state_bytes,
)
from service.estimator.params import moe_layer_count, parameter_counts
from service.estimator.types import (
    ClusterSpec,
    Framework,
    Layout,
    MemoryBreakdown,
    MemoryEstimate,
    Method,
    ModelSpec,
    Offload,
    Optimizer,
    ParameterCounts,
    Precision,
    TrainingSpec,
)
from service.estimator.validate import validate_layout

__all__ = [
    "DEFAULT_ASSUMPTIONS",
    "MemoryAssumptions",
    "assumptions",
    "deepspeed_zero2_estimate",
    "deepspeed_zero3_estimate",
    "fits",
    "max_micro_batch_size",
    "max_seq_len",
    "megatron_weight_and_optimizer_bytes",
    "memory_estimate",
]


# ---------------------------------------------------------------- buffers and overhead


def bucket_bytes(
    model: ModelSpec, trainable: float, sb: StateBytes, layout: Layout, assume: MemoryAssumptions
) -> float:
    """Gradient communication buckets (flat copies made for the reduction)."""
    # DeepSpeed 0: gradients flattened in MEMORY_OPT_ALLREDUCE_SIZE chunks for the all-reduce;
    # 1-3: one reduce_bucket_size buffer in the 16-bit dtype (stage_1_and_2.py / stage3.py).
    # PyTorch DDP (FSDP stage 0 here): buckets copy every gradient unless gradient_as_bucket_view.
    # FSDP 2/3: one unit's unsharded gradients before reduce-scatter. Megatron reduces in place.
    replicas = layout.dp * layout.cp
    if layout.framework is Framework.DEEPSPEED:
        if layout.zero_stage == 0:
            return min(trainable, assume.ds_stage0_allreduce_elements) * sb.gradients if replicas > 1 else 0.0
        return deepspeed_buckets(model, layout).reduce_buffer_elements * sb.weights
    if layout.framework is Framework.FSDP and layout.zero_stage == 0:
        return trainable * sb.gradients if replicas > 1 and not assume.ddp_gradient_as_bucket_view else 0.0
    return 0.0


def gathered_parameter_bytes(
    model: ModelSpec,
    counts: ParameterCounts,
    rp: RankParameters,
    layout: Layout,
    sb: StateBytes,
    shards: tuple[int, float],
    assume: MemoryAssumptions,
) -> float:
    """Unsharded compute copies of the parameters alive at the peak (ZeRO-3 / FSDP)."""
    dense_shard, trainable = shards
    stage = layout.zero_stage if dense_shard > 1 else 0  # FSDP falls back to NO_SHARD on one rank
    if layout.framework is Framework.FSDP:
        if stage == 3:
            # This layer, the prefetched one, the output unit kept through the loss, and this
            # layer's unsharded gradients before their reduce-scatter.
            units = (1 + assume.fsdp_prefetch_layers) * rp.layer + rp.last_unit
            return (units + rp.layer) * sb.weights
        if stage == 2:
            # SHARD_GRAD_OP keeps every unsharded parameter from forward to backward, + one unit's grads.
            return (rp.dense + rp.expert + rp.layer) * sb.weights
        # NO_SHARD / DDP under autocast: 16-bit casts of the fp32 weights, saved for backward.
        return trainable * sb.weights if sb.master else 0.0
    if layout.zero_stage != 3 or layout.framework is Framework.MEGATRON:
        return 0.0
    # DeepSpeed gathers module by module plus a prefetch bucket, capped by max_live_parameters,
    # and reduces one module's 16-bit gradients at a time (DeepSpeed's 4 x largest layer); norms
    # (under the persistence threshold) are never partitioned.
    largest = counts.largest_module / layout.tp
    ds = deepspeed_buckets(model, layout)
    live = min(largest + ds.prefetch_bucket_elements, ds.max_live_parameters)
    persistent = counts.norms_per_layer * model.num_layers / layout.pp + counts.final_norm
    if model.hidden_size >= ds.param_persistence_threshold:
        persistent = 0
    return (live + persistent + largest) * sb.weights


def pipeline_buffer_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    # 1F1B keeps a received activation and a received gradient (b x s x h, 16-bit) per rank.
    if layout.pp == 1:
        return 0.0
    d, t = activations.element_bytes(training.precision), activations.local_tokens(layout, training)
    return 2 * d * t * model.hidden_size / (layout.tp if layout.sequence_parallel else 1)


def dequantize_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    # QLoRA dequantises one NF4 weight to bf16 per matmul (forward and backward): the largest Linear.
    if training.method is not Method.QLORA:
        return 0.0
    return 2 * model.hidden_size * max(model.q_size, model.ffn_hidden_size) / layout.tp


def communicator_count(layout: Layout) -> int:
    """Process groups with more than one rank: data (x context), context, tensor, pipeline, expert."""
    sizes = (layout.dp * layout.cp, layout.cp, layout.tp, layout.pp, layout.ep)
    return sum(1 for size in sizes if size > 1)


def overhead_bytes(layout: Layout, dynamic_bytes: float, assume: MemoryAssumptions) -> float:
    """CUDA context + NCCL buffers + a fragmentation reserve on activations and buffers."""
    nccl = assume.nccl_bytes_per_group * communicator_count(layout)
    return assume.cuda_context_bytes + nccl + assume.fragmentation_fraction * dynamic_bytes


# ---------------------------------------------------------------- entry points


def micro_batches_per_step(layout: Layout, training: TrainingSpec) -> int:
    """Gradient-accumulation steps (tolerant: rounds down instead of raising on a bad split)."""
    if layout.gradient_accumulation_steps is not None:
        return layout.gradient_accumulation_steps
    return max(1, training.global_batch_size // (layout.micro_batch_size * layout.dp))


def activation_split(
    model: ModelSpec, layout: Layout, training: TrainingSpec, rank: int
) -> tuple[float, float]:
    # (on GPU, offloaded to host). Activation offload keeps the layer computing and the next one.
    total = activations.stage_activation_bytes(
        model, layout, training, rank, micro_batches_per_step(layout, training)
    )
    if not layout.activation_offload:
        return float(total), 0.0
    # Weighted like stage_activation_bytes: MoE layers (every layer_frequency-th) and dense ones.
    dense = activations.layer_bytes(model, layout, training, False)
    moe = activations.layer_bytes(model, layout, training, True) if model.moe is not None else dense
    mean = dense + moe_layer_count(model) / model.num_layers * (moe - dense)
    in_flight = activations.micro_batches_in_flight(layout, rank, micro_batches_per_step(layout, training))
    layers = model.num_layers / layout.pp * in_flight * mean
    kept = min(layers, 2 * max(dense, moe))  # the layer computing and the next, the larger kind
    return total - layers + kept, layers - kept


def rank_memory(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    training: TrainingSpec,
    rank: int,
    assume: MemoryAssumptions,
) -> tuple[MemoryBreakdown, float, float]:
    """Breakdown of pipeline rank ``rank``, with its host and NVMe bytes."""
    counts = parameter_counts(model)
    rp = rank_parameters(model, counts, layout, rank)
    sb = state_bytes(training, layout.framework, model, assume)
    degrees = shard_degrees(layout, cluster)
    states = rank_model_states(model, layout, training, rp, sb, degrees, assume)  # = model_state_bytes
    trainable = (
        rp.dense + rp.expert if training.method is Method.FULL else lora_parameters(model, training, layout)
    )
    act_gpu, act_host = activation_split(model, layout, training, rank)
    shards = (degrees[0], trainable)
    buffers = bucket_bytes(model, trainable, sb, layout, assume)
    buffers += gathered_parameter_bytes(model, counts, rp, layout, sb, shards, assume)
    buffers += pipeline_buffer_bytes(model, layout, training) + dequantize_bytes(model, layout, training)
    if rank == layout.pp - 1:
        buffers += activations.loss_workspace_bytes(model, layout, training)
    breakdown = MemoryBreakdown(
        parameters=math.ceil(states.parameters),
        gradients=math.ceil(states.gradients),
        optimizer_states=math.ceil(states.optimizer_states),
        activations=math.ceil(act_gpu),
        buffers=math.ceil(buffers),
        overhead=math.ceil(overhead_bytes(layout, act_gpu + buffers, assume)),
    )
    return breakdown, states.host_bytes + act_host, states.nvme_bytes


def memory_estimate(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    training: TrainingSpec,
    assume: MemoryAssumptions = DEFAULT_ASSUMPTIONS,
) -> MemoryEstimate:
    """Per-GPU memory of the most-loaded rank (first or last pipeline stage) and host/NVMe per node."""
    ranks = sorted({0, layout.pp - 1})
    results = [rank_memory(model, cluster, layout, training, r, assume) for r in ranks]
    breakdown = max((r[0] for r in results), key=lambda b: b.total)
    return MemoryEstimate(
        per_gpu=breakdown,
        capacity_bytes=cluster.gpu.memory_bytes,
        cpu_per_node_bytes=math.ceil(max(r[1] for r in results) * cluster.gpus_per_node),
        nvme_per_node_bytes=math.ceil(max(r[2] for r in results) * cluster.gpus_per_node),
    )


def host_fits(memory: MemoryEstimate, cluster: ClusterSpec) -> bool:
    """Host RAM and NVMe within the node's, where the cluster states them (0 = not stated)."""
    cpu_ok = (
        not cluster.cpu_memory_bytes_per_node
        or memory.cpu_per_node_bytes <= cluster.cpu_memory_bytes_per_node
    )
    nvme_ok = not cluster.nvme_bytes_per_node or memory.nvme_per_node_bytes <= cluster.nvme_bytes_per_node
    return cpu_ok and nvme_ok


def memory_fits(memory: MemoryEstimate, cluster: ClusterSpec) -> bool:
    """The one fit predicate: the GPU total within capacity and the host side within the node's."""
    return memory.headroom_bytes >= 0 and host_fits(memory, cluster)


def calibrated_memory_estimate(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    training: TrainingSpec,
    dynamic_factor: float = 1.0,
) -> MemoryEstimate:
    """memory_estimate with the dynamic part (activations, buffers, overhead) scaled by runs."""
    memory = memory_estimate(model, cluster, layout, training)
    if dynamic_factor == 1.0:
        return memory
    return dataclasses.replace(memory, per_gpu=calibrated_memory(memory.per_gpu, dynamic_factor))


def fits(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    training: TrainingSpec,
    dynamic_factor: float = 1.0,
) -> bool:
    return memory_fits(calibrated_memory_estimate(model, cluster, layout, training, dynamic_factor), cluster)


def largest_satisfying(low: int, high: int, step: int, ok: Callable[[int], bool]) -> int:
    """Largest multiple of ``step`` in [low, high] for which the monotone predicate ``ok`` holds, else 0."""
    if high < low or not ok(low):
        return 0
    lo, hi = low // step, high // step  # ok(lo * step) holds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid * step) else (lo, mid - 1)
    return lo * step


def valid_micro_batch_sizes(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, training: TrainingSpec
) -> list[int]:
    """Micro-batch sizes this layout accepts as it stands (they divide the per-replica batch and
    pass every layout rule), ascending."""
    per_replica = (
        training.global_batch_size // layout.dp if training.global_batch_size % layout.dp == 0 else 0
    )
    out = []
    for b in range(1, per_replica + 1):
        if per_replica % b:
            continue
        candidate = dataclasses.replace(layout, micro_batch_size=b, gradient_accumulation_steps=None)
        try:
            validate_layout(model, cluster, candidate, training)
        except InvalidLayout:
            continue
        out.append(b)
    return out


def max_micro_batch_size(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    training: TrainingSpec,
    dynamic_factor: float = 1.0,
) -> int:
    """Largest valid micro-batch that fits this layout; 0 if none does. Memory grows with the
    micro-batch, so a binary search over the valid sizes (ascending) finds it."""
    sizes = valid_micro_batch_sizes(model, cluster, layout, training)

    def ok(i: int) -> bool:
        candidate = dataclasses.replace(layout, micro_batch_size=sizes[i], gradient_accumulation_steps=None)
        return fits(model, cluster, candidate, training, dynamic_factor)

    if not sizes or not ok(0):
        return 0
    return sizes[largest_satisfying(0, len(sizes) - 1, 1, ok)]


MAX_SEQ_LEN_SEARCHED = 2**22  # 4M tokens: beyond any context length in the catalog


def max_seq_len(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    training: TrainingSpec,
    dynamic_factor: float = 1.0,
) -> int:
    """Largest sequence length (a multiple of 2cp, and of tp under SP) that fits; 0 if none does."""
    step = math.lcm(2 * layout.cp if layout.cp > 1 else 1, layout.tp if layout.sequence_parallel else 1)

    def ok(s: int) -> bool:
        return fits(model, cluster, layout, dataclasses.replace(training, seq_len=s), dynamic_factor)

    return largest_satisfying(step, MAX_SEQ_LEN_SEARCHED, step, ok)


def assumptions(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    training: TrainingSpec,
    assume: MemoryAssumptions = DEFAULT_ASSUMPTIONS,
) -> tuple[str, ...]:
    """What the memory estimate assumed for this input, in words and numbers."""
    sb = state_bytes(training, layout.framework, model, assume)
    notes = [
        f"model states per trainable parameter: weights {sb.weights:g} B, gradients {sb.gradients:g} B, "
        f"master {sb.master:g} B, optimizer moments {sb.moments:.4g} B ({training.optimizer.value})",
        f"CUDA context {assume.cuda_context_bytes // MiB} MiB + NCCL {assume.nccl_bytes_per_group // MiB} "
        f"MiB per process group; fragmentation reserve {assume.fragmentation_fraction:.0%} of activations "
        "+ buffers",
        "activations: "
        + (
            "Megatron-LM (Korthikanti et al. 2022, 16-bit, 1-byte dropout masks)"
            if layout.framework is Framework.MEGATRON
            else "Hugging Face transformers tensors saved by autograd (RMSNorm fp32 upcast, fp32 log-softmax)"
        ),
    ]
    if layout.pp > 1:
        notes.append(
            "pipeline: first and last stage evaluated, the larger reported; 1F1B in-flight micro-batches"
        )
    if ds_note := deepspeed_assumption(model, layout):
        notes.append(ds_note)
    if layout.framework is Framework.FSDP and layout.zero_stage == 0 and layout.dp * layout.cp > 1:
        notes.append("plain data parallel = PyTorch DDP; its buckets hold one more copy of the gradients")
    if layout.offload_optimizer is not Offload.NONE:
        notes.append(
            f"optimizer offload: host holds fp32 master + moments + a {assume.cpu_adam_grad_bytes}-byte "
            "gradient copy per parameter shard"
        )
    if training.optimizer is Optimizer.ADAMW_8BIT:
        notes.append(
            f"8-bit Adam: 1 B per moment + fp32 absmax per {assume.adam_8bit_block_elements} elements"
        )
    if training.optimizer is Optimizer.ADAFACTOR:
        notes.append("Adafactor: factored second moment (rows + columns per matrix), no first moment")
    if training.method is Method.QLORA:
        notes.append(
            f"QLoRA: NF4 Linear weights at {assume.qlora_bits_per_param} bits; embeddings, head, norms bf16"
        )
    if training.precision is Precision.FP8:
        notes.append(
            "fp8: bf16 weights + cached fp8 weight and transpose per GEMM weight (2 B), bf16 activations"
        )
    if layout.chunked_loss:
        notes.append("chunked loss: no full-vocabulary logits, only the hidden-state gradient is kept")
    return tuple(notes)
