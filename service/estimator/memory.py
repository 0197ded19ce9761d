"""Per-GPU memory of one pipeline rank, by component, for any layout.

For the first and the last pipeline stage (``pipeline_ranks``): the model states
(``service.estimator.model_states``: ZeRO / FSDP / Megatron distributed optimizer, offload) with the
buffers they size (gradient buckets, gathered ZeRO-3 / FSDP parameters), memoised by the sharding
(``stage_states``); the activations (``service.estimator.activations``: Megatron's Korthikanti
formulas or what Hugging Face models save) with the buffers they size (pipeline receive buffers,
QLoRA dequantisation, the loss workspace) and what the process holds outside PyTorch's allocator (the
CUDA context, NCCL's buffers), memoised without the sharding (``stage_activations``).
``service.estimator.evaluate`` adds them up, with the allocator's fragmentation, into three statistics
(peak allocated, peak reserved, device used: ``types.MemoryStatistic``) and reports the larger stage.
Every allowance lives in ``MemoryAssumptions``, loaded from the catalog with its source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.estimator import activations, pipeline
from service.estimator.job import Job, job_memo, layout_memo, rank_kind_counts
from service.estimator.model_states import (
    BNB_32BIT_STATE_BYTES,
    DS_OPTIMIZER_SWAP_BUFFERS,
    DS_PARAM_SWAP_BUFFERS,
    DS_SUB_GROUP_ELEMENTS,
    SHARD_GROUP_FIELDS,
    MiB,
    ModelStates,
    RankParameters,
    StateBytes,
    deepspeed_assumption,
    deepspeed_bf16_optimizer,
    deepspeed_buckets,
    deepspeed_master_clone,
    deepspeed_param_swap_buffer_elements,
    embedding_table_fraction,
    experts_stay_16_bit,
    frozen_bytes,
    frozen_dtype_bytes,
    fsdp_parameter_bytes,
    fused_expert_adapted_weights,
    fused_experts,
    gathered_weight_bytes,
    grad_reduce_bytes,
    hsdp_replicas,
    layer_quantized_weights,
    lora_expert_parameters,
    lora_parameters,
    megatron_fp8_params,
    megatron_fused_adam_on_gpu,
    megatron_grads_in_fp32,
    megatron_master_remainders,
    peft_adapts_fused_experts,
    qlora_bits_per_weight,
    quantized_weights,
    rank_model_states,
    rank_parameters,
    shard_degrees,
    state_bytes,
    state_bytes_per_parameter,
)
from service.estimator.params import autotp_keeps_vocab_whole, head_matrices
from service.estimator.pipeline import PIPELINE_FIELDS, rank_recomputed_fractions
from service.estimator.tuning import MemoryAssumptions
from service.estimator.types import (
    ClusterSpec,
    Compile,
    Framework,
    Head,
    Layout,
    Method,
    ModelSpec,
    NormKind,
    Offload,
    Optimizer,
    OptimizerImplementation,
    ParameterCounts,
    Precision,
    Recompute,
    TrainingSpec,
)

# ---------------------------------------------------------------- buffers and overhead


def bucket_bytes(
    model: ModelSpec,
    trainable: float,
    sb: StateBytes,
    layout: Layout,
    assume: MemoryAssumptions,
    reduce_bytes: int,
) -> float:
    """Gradient communication buckets (flat copies made for the reduction); ``reduce_bytes``: a
    gradient element as reduced (``model_states.grad_reduce_bytes``). DeepSpeed's BF16_Optimizer
    (``StateBytes.sharded_optimizer_at_zero0``) all-reduces each group's flat gradient buffer in place
    (engine.py ``buffered_allreduce_fallback`` over ``get_grads_for_reduction``: one tensor a bucket,
    which torch's flatten_dense_tensors returns as it is, no copy)."""
    # DeepSpeed 0: gradients flattened in MEMORY_OPT_ALLREDUCE_SIZE chunks for the all-reduce, and the
    # chunk cast to the communication dtype where it differs (engine.py allreduce_bucket:
    # tensor.to(communication_data_type); fp32 under Ulysses); 1-3: reduce_bucket_size buffers in the
    # communication dtype (stage_1_and_2.py / stage3.py allocate the IPG buffer per communication
    # dtype: 16-bit, fp32 under Ulysses).
    # PyTorch DDP (FSDP stage 0 here): buckets copy every gradient unless gradient_as_bucket_view.
    # FSDP 2/3: one unit's unsharded gradients before reduce-scatter. Megatron reduces in place.
    replicas = layout.dp * layout.cp
    if layout.framework is Framework.DEEPSPEED:
        if sb.sharded_optimizer_at_zero0:
            return 0.0
        if layout.zero_stage == 0:
            chunk = min(trainable, assume.ds_stage0_allreduce_elements)
            cast = reduce_bytes if reduce_bytes != sb.gradients else 0
            return chunk * (sb.gradients + cast) if replicas > 1 else 0.0
        return deepspeed_buckets(model, layout).reduce_buffer_elements * reduce_bytes
    if layout.framework is Framework.FSDP and layout.zero_stage == 0:
        return trainable * reduce_bytes if replicas > 1 and not assume.ddp_gradient_as_bucket_view else 0.0
    return 0.0


def gathered_parameter_bytes(
    model: ModelSpec,
    counts: ParameterCounts,
    rp: RankParameters,
    layout: Layout,
    sb: StateBytes,
    shards: tuple[int, float],
    assume: MemoryAssumptions,
    *,
    full: bool,
    reduce_bytes: int,
    quantized: tuple[float, float] = (0.0, 0.0),
) -> tuple[float, float]:
    """Unsharded compute copies of the parameters (and gradients) alive at the peak (ZeRO-3 / FSDP),
    as (held through the backward, released by it): the second is what the backward frees unit by
    unit, so none of it is left when the last gradient is made (``memory.gradients_follow_activations``).
    ``full``: every weight trains (else the frozen base has no gradients to hold). ``reduce_bytes``:
    a gradient element as FSDP holds it for its reduce-scatter (``model_states.grad_reduce_bytes``).
    ``quantized``: QLoRA's NF4 weights of the rank and of its largest layer, which FSDP gathers as
    their packed storage (``model_states.gathered_weight_bytes``)."""
    dense_shard, trainable = shards
    stage = layout.zero_stage if dense_shard > 1 else 0  # FSDP falls back to NO_SHARD on one rank
    grads = 1.0 if full else 0.0
    rank_quantized, layer_quantized = quantized
    if layout.framework is Framework.FSDP:
        if stage in (2, 3) and layout.pp > 1:
            # Under torch.distributed.pipelining every micro-batch but the last runs backward with
            # reshard_after_backward and gradient sync off (PipelineStage.backward_maybe_with_nosync):
            # the stage's parameters stay unsharded from one backward to the next forward, and its
            # unsharded gradients accumulate until the last micro-batch's reduce-scatter, in the
            # reduce dtype (FSDPParam.to_accumulated_grad_if_needed upcasts them after each backward).
            if rank_quantized:
                held = rp.dense + rp.expert
                return gathered_weight_bytes(sb, held, rank_quantized) + grads * reduce_bytes * held, 0.0
            return (sb.weights + grads * reduce_bytes) * (rp.dense + rp.expert), 0.0
        if stage == 3:
            # This layer, the prefetched one, the output unit kept through the loss, and this
            # layer's unsharded gradients before their reduce-scatter, copied into its input in the
            # reduce dtype (_fsdp_collectives.foreach_reduce: reduce_scatter_input).
            layers = 1 + assume.fsdp_prefetch_layers
            if layer_quantized:
                gathered = (
                    layers * gathered_weight_bytes(sb, rp.layer, layer_quantized) + rp.last_unit * sb.weights
                )
                return gathered + grads * rp.layer * reduce_bytes, 0.0
            units = layers * rp.layer + rp.last_unit
            return units * sb.weights + grads * rp.layer * reduce_bytes, 0.0
        if stage == 2:
            # SHARD_GRAD_OP keeps every unsharded parameter from forward to backward (each unit
            # reshards after its backward), + one unit's grads (as reduce-scattered).
            if rank_quantized:
                return grads * rp.layer * reduce_bytes, gathered_weight_bytes(
                    sb, rp.dense + rp.expert, rank_quantized
                )
            return grads * rp.layer * reduce_bytes, (rp.dense + rp.expert) * sb.weights
        # NO_SHARD / DDP under autocast: 16-bit casts of the fp32 weights, saved for backward (each
        # layer's freed by its backward).
        return 0.0, trainable * sb.weights if sb.master else 0.0
    if layout.zero_stage != 3 or layout.framework is Framework.MEGATRON:
        return 0.0, 0.0
    # DeepSpeed gathers module by module plus a prefetch bucket, capped by max_live_parameters,
    # and reduces one module's 16-bit gradients at a time (DeepSpeed's 4 x largest layer); norms
    # (under the persistence threshold) are never partitioned.
    largest = counts.largest_module / layout.tp
    if autotp_keeps_vocab_whole(model, layout):  # the embedding, gathered and reduced whole
        largest = max(largest, counts.embedding)
    ds = deepspeed_buckets(model, layout)
    live = min(largest + ds.prefetch_bucket_elements, ds.max_live_parameters)
    persistent = counts.norms_per_layer * rp.layers + counts.final_norm
    if model.hidden_size >= ds.param_persistence_threshold:
        persistent = 0
    return (live + persistent + grads * largest) * sb.weights, 0.0


def stage_boundary_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    """One micro-batch's hidden states between two pipeline stages (b x s x h / cp, 16-bit; SP keeps
    the tp shard)."""
    d, t = activations.element_bytes(training.precision), activations.local_tokens(layout, training)
    return d * t * model.hidden_size / (layout.tp if layout.sequence_parallel else 1)


def pipeline_buffer_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    # Megatron's and DeepSpeed's 1F1B receive into a new tensor per transfer: a received activation
    # (then the stage's input, counted with the activations) and a received gradient in flight.
    # torch.distributed.pipelining (FSDP) allocates its buffers once: pipelining_buffer_bytes.
    if layout.pp == 1 or layout.framework is Framework.FSDP:
        return 0.0
    return 2 * stage_boundary_bytes(model, layout, training)


def pipelining_buffer_bytes(
    model: ModelSpec, layout: Layout, training: TrainingSpec, rank: int, micro_batches: int, in_flight: float
) -> float:
    """torch.distributed.pipelining's receive buffers on pipeline rank ``rank`` (FSDP with pp > 1):
    PipelineStage allocates, for every micro-batch of the schedule, a forward receive buffer on each
    of its stages but the first and a gradient receive buffer on each but the last, once, and keeps
    them (stage.py ``_setup_forward_recv_info`` / ``_create_grad_recv_info``, one per micro-batch
    index). A forward buffer of an in-flight micro-batch is that micro-batch's stage input, already
    counted with the activations (``in_flight`` micro-batches, ``micro_batches_in_flight``)."""
    if layout.pp == 1 or layout.framework is not Framework.FSDP:
        return 0.0
    v = layout.virtual_pipeline_stages
    receiving = v - (1 if rank == 0 else 0)  # the rank's stages r, r + pp, ...: stage 0 receives nothing
    sending = v - (1 if rank == layout.pp - 1 else 0)  # the last stage gets no gradient
    buffers = sending * micro_batches + receiving * max(0.0, micro_batches - in_flight)
    return buffers * stage_boundary_bytes(model, layout, training)


def dequantize_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    # QLoRA dequantises one NF4 weight to bf16 per matmul (forward and backward): the largest Linear.
    if training.method is not Method.QLORA:
        return 0.0
    return 2 * model.hidden_size * max(model.q_size, model.ffn_hidden_size) / layout.tp


# The layout fields that say how a rank's weights are sharded: the groups, the rank's layers, the stage.
SHARDING_FIELDS = (*SHARD_GROUP_FIELDS, *PIPELINE_FIELDS, "zero_stage")
# The layout fields autocast_weight_bytes reads: the sharding and which recompute.
AUTOCAST_FIELDS = (*SHARDING_FIELDS, "recompute", "recompute_num_layers", "recompute_every_n_layers")


# Bytes per weight: autocast's 16-bit copy, and the cast's traffic (read the fp32 weight, write the copy).
AUTOCAST_COPY_BYTES = 2
AUTOCAST_CAST_TRAFFIC_BYTES = activations.FP32_BYTES + AUTOCAST_COPY_BYTES


def output_layer_weights(job: Job, layout: Layout, rank: int) -> float:
    """The output layer's weights (h x V over tp, tied or not) on pipeline rank ``rank``: the last; an
    encoder's head: its matmuls' weights (``params.head_matrices``; encoders run data parallel only)."""
    if rank != layout.pp - 1:
        return 0.0
    model = job.model
    if model.head is Head.CAUSAL_LM:
        return model.hidden_size * model.vocab_size / layout.tp
    return float(sum(fan_in * fan_out for fan_in, fan_out in head_matrices(model)))


def autocast_casts_weights(job: Job, layout: Layout) -> bool:
    """Whether 16-bit autocast casts a frozen fp32 LoRA base's weights at each use: the base is kept
    in fp32 (``TrainingSpec.base_autocast``) and nothing shards it (DDP, or FSDP on one rank)."""
    if not job.base_autocast or layout.framework is not Framework.FSDP:
        return False
    return layout.zero_stage == 0 or shard_degrees(layout, job.cluster)[0] == 1


@layout_memo(*AUTOCAST_FIELDS, memory=True)
def autocast_weight_bytes(job: Job, layout: Layout, rank: int) -> float:
    """16-bit copies of a frozen fp32 LoRA base held at the peak of pipeline rank ``rank``, where
    autocast makes them (``TrainingSpec.base_autocast``) and nothing shards the weights (DDP, or FSDP
    on one rank).

    Autocast casts a Linear's fp32 weight to 16 bits at every use, and caches the copy only for leaf
    tensors that require grad (aten/src/ATen/autocast_mode.cpp ``cached_cast``): a frozen weight's copy
    is not cached but is what the matmul saves for its input gradient, so each layer whose
    activations are kept holds its Linears' copies until its backward; a checkpointed layer holds
    them only while it is recomputed, one layer at a time. The output layer (h x V, tied or not)
    casts and saves likewise on the last rank. One micro-batch in flight (no PEFT launcher pipelines).
    FSDP's sharded stages cast each fp32 shard before the all-gather (MixedPrecision param_dtype): the
    gathered 16-bit unit is the copy, counted with the gathered parameters."""
    if not autocast_casts_weights(job, layout):
        return 0.0
    rp = rank_parameters_of(job, layout, rank)
    recomputed = 0.0  # selective policies recompute no matmul's weight use (per-op AC: counted as kept)
    if layout.recompute is Recompute.FULL:
        recomputed = rank_recomputed_fractions(job.model.num_layers, layout, job.training.mtp_num_layers)[
            rank
        ]
    held = (1.0 - recomputed) * rp.linear + (rp.layer if recomputed > 0 else 0.0)
    return AUTOCAST_COPY_BYTES * (held + output_layer_weights(job, layout, rank))


def communicator_count(layout: Layout, cluster: ClusterSpec) -> int:
    """Process groups with more than one rank: data (x context), context, tensor, pipeline, expert,
    and HSDP's replicate group beside its shard group (FSDP2 all-gathers and reduce-scatters on the
    shard group, all-reduces on the replicate one: _fsdp_collectives.py; hybrid-sharding review)."""
    groups = (layout.dp * layout.cp > 1) + (layout.cp > 1) + (layout.tp > 1) + (layout.pp > 1)
    return groups + (layout.ep > 1) + (hsdp_replicas(layout, cluster) > 1)


def cuda_context_bytes(assume: MemoryAssumptions) -> float:
    """The CUDA context of the training process: driver state, the kernel images loaded (PyTorch's,
    cuBLAS/cuDNN's, lazily since CUDA 11.7) and the library handles. The driver allocates it outside
    PyTorch's caching allocator, so nvidia-smi counts it and ``memory_reserved`` does not (PyTorch
    "CUDA memory management" notes; pytorch/pytorch#107667, #28113)."""
    return float(assume.cuda_context_bytes)


def nccl_buffer_bytes(layout: Layout, cluster: ClusterSpec, assume: MemoryAssumptions) -> float:
    """NCCL's buffers: each communicator allocates, per channel and per peer it connects to, a FIFO
    per protocol (Simple NCCL_BUFFSIZE = 4 MiB, LL128, LL), with cudaMalloc / cuMem outside PyTorch's
    allocator; communicators do not share them (NVIDIA/nccl#864, #986). One allowance per process
    group with more than one rank (``communicator_count``)."""
    return float(assume.nccl_bytes_per_group * communicator_count(layout, cluster))


# Transformer Engine's userbuffers for Megatron-LM's --tp-comm-overlap (TE >= 2.7 with Megatron-LM main
# @d98e8a6): megatron/training/initialize.py _initialize_tp_communicators hands te initialize_ub the shape
# [seq_length x micro_batch_size / context_parallel_size, hidden_size], and initialize_ub
# (transformer_engine/pytorch/module/base.py) builds 12 communicators whatever is enabled (ring exchange:
# qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad; pipeline: proj_fprop, fc2_fprop; bulk: qkv_dgrad,
# qkv_wgrad, fc1_dgrad, fc1_wgrad; external: proj_wgrad, fc2_wgrad), each with one buffer of that whole
# shape (ring exchange: tp chunks of 1/tp of it; comm_gemm_overlap.cpp), in bf16, or 1 byte for the 8
# all-gather ones under fp8 (fp8_buf), allocated with cuMemCreate / cudaMalloc outside PyTorch's
# allocator. Beside them a cuBLAS workspace per userbuffer stream, a torch tensor (torch.empty(...)
# .repeat(3): inside the allocator, a buffer): 3 x (32 MiB + 1 KiB) on sm90+, 4 MiB each before, taken
# at the larger. Torchtitan's Async TP is a torch.compile pass, not these.
TE_UB_COMMUNICATORS = 12
TE_UB_FP8_GATHERS = 8  # of them, the all-gathers' buffers, 1-byte under fp8
TE_UB_WORKSPACE_BYTES = 3 * (32 * 2**20 + 2**10)


def _te_userbuffers(layout: Layout) -> bool:
    return layout.tp_comm_overlap and layout.framework is Framework.MEGATRON


def tp_comm_buffer_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    """Transformer Engine's userbuffers under Megatron's --tp-comm-overlap (``TE_UB_COMMUNICATORS``),
    outside the allocator: 8B at 8k tokens 0.75 GiB, at 128k over cp 2 6 GiB (long-context review);
    none otherwise."""
    if not _te_userbuffers(layout):
        return 0.0
    elements = training.seq_len * layout.micro_batch_size // layout.cp * model.hidden_size
    if training.precision is Precision.FP8:
        per_element = TE_UB_FP8_GATHERS * 1 + (TE_UB_COMMUNICATORS - TE_UB_FP8_GATHERS) * 2
    else:
        per_element = TE_UB_COMMUNICATORS * 2
    return float(elements * per_element)


def tp_comm_workspace_bytes(layout: Layout) -> float:
    """The cuBLAS workspaces of TE's userbuffer streams (``TE_UB_WORKSPACE_BYTES``), a buffer."""
    return float(TE_UB_WORKSPACE_BYTES) if _te_userbuffers(layout) else 0.0


def fragmentation_bytes(dynamic_bytes: float, fragmentation_fraction: float) -> float:
    """The caching allocator's fragmentation reserve on activations and buffers: blocks freed by one
    phase (the forward's transients, a layer's recompute) stay cached in their segments, so the
    reserved peak (``reserved_bytes.all.peak``) exceeds the allocated one."""
    return fragmentation_fraction * dynamic_bytes


# ---------------------------------------------------------------- one pipeline rank, memoised per job


@layout_memo(*PIPELINE_FIELDS, "framework", memory=True)  # framework: FSDP's receive buffers
def pipeline_ranks(job: Job, layout: Layout) -> tuple[int, ...]:
    """The pipeline ranks whose memory is evaluated: the first (Megatron's theoretical memory models
    it: the embedding and the most micro-batches in flight), the last (the logits), and between them
    the first rank of each layer count the first rank does not have (an uneven split): a later rank
    with the same layers holds fewer micro-batches in flight, so it never needs more. Under FSDP
    (torch.distributed.pipelining) a middle rank keeps forward receive buffers the first rank has
    none of, one per micro-batch not in flight (``pipelining_buffer_bytes``), one more on each later
    rank as one fewer is in flight: its memory is linear in the micro-batches in flight, largest at
    the first or at the last middle rank of its layer count, and both are evaluated whatever the
    first rank's: Llama 3 8B at pp 4 and 1,024 micro-batches needs 101 GiB on rank 1, 72 on rank 0
    (pipeline review); with activations offloaded the later ranks need the most (review of stop 48).
    Interleaved, a rank's chunks count too: of two ranks of as many layers, the later one may hold more
    where its first chunk is heavier (``activations.layers_in_flight``)."""
    counts: tuple[object, ...] = rank_kind_counts(job, layout)
    if layout.virtual_pipeline_stages > 1:
        split = pipeline.stage_layers(job.model.num_layers, layout)
        counts = tuple((counts[rank], split[rank :: layout.pp]) for rank in range(layout.pp))
    if layout.framework is Framework.FSDP:
        first: dict[object, int] = {}
        last: dict[object, int] = {}
        for rank in range(1, layout.pp - 1):
            first.setdefault(counts[rank], rank)
            last[counts[rank]] = rank
        middle = sorted({*first.values(), *last.values()})
        return (0, *middle, layout.pp - 1) if layout.pp > 1 else (0,)
    ranks, seen = [0], {counts[0]}
    for rank in range(1, layout.pp - 1):
        if counts[rank] not in seen:
            ranks.append(rank)
            seen.add(counts[rank])
    if layout.pp > 1:
        ranks.append(layout.pp - 1)
    return tuple(ranks)


@dataclass(slots=True, kw_only=True)  # built on every memo miss: not frozen (frozen __init__ is ~4x)
class RankStates:
    """One pipeline rank's model states (rounded up to bytes, as reported) and the buffers they size."""

    states: ModelStates
    parameters: int
    gradients: int
    optimizer_states: int
    model_states_bytes: int  # the three above: what every layout of this sharding holds
    buffers: float  # gradient buckets + gathered ZeRO-3 / FSDP parameters
    held_buffers: float  # of which held through the backward (gathered_parameter_bytes' first)
    host_bytes: float  # offloaded states and the host buffers DeepSpeed keeps for them
    # DeepSpeed ZeRO-1/2's pinned host copies of the gradients it accumulates under optimizer offload,
    # allocated where a step has several micro-batches (``deepspeed_offload_host_bytes``)
    accumulation_host_bytes: float
    nvme_bytes: float
    head_gradients: float  # head_gradient_bytes: the gradients alive when the backward starts
    optimizer_temporary: float  # optimizer_temporary_bytes: allocated by the step, beside every gradient
    tied_embedding_transient: float  # tied_embedding_transient_bytes
    gradients_apart: bool  # gradients_in_own_pool


@layout_memo(
    *PIPELINE_FIELDS, "tp", "ep", "etp", "framework", memory=True
)  # framework: Megatron's whole MLA down-projections
def rank_parameters_of(job: Job, layout: Layout, rank: int) -> RankParameters:
    """``rank_parameters`` of the job's model on pipeline rank ``rank``."""
    layers = rank_kind_counts(job, layout)[rank]
    return rank_parameters(job.model, job.counts, layout, rank, layers, job.training.mtp_num_layers)


@job_memo
def state_bytes_of(
    job: Job,
    framework: Framework,
    grads_in_fp32: bool = True,
    deepspeed_optimizer: tuple[bool, bool] = (False, False),
    megatron_fused_adam: tuple[bool, bool] = (False, False),
    flat_partitions: bool = False,
) -> StateBytes:
    """``state_bytes`` of the job's training under ``framework`` (Megatron: gradients in fp32 or not,
    its precision-aware FusedAdam or not; DeepSpeed: what its optimizer wrapper keeps, and whether it
    steps flat partitions, ``state_bytes``)."""
    training, model, assume = job.training, job.model, job.assume
    fused = megatron_fused_adam
    return state_bytes(
        training, framework, model, assume, grads_in_fp32, deepspeed_optimizer, fused, flat_partitions
    )


def deepspeed_flat_partitions(layout: Layout, precision: Precision) -> bool:
    """Whether DeepSpeed's optimizer steps flat 1-D partitions: ZeRO-1/2/3, and the pipeline's
    ``BF16_Optimizer`` at ZeRO-0 (``deepspeed_bf16_optimizer``); ZeRO-0 otherwise steps shaped tensors."""
    return layout.framework is Framework.DEEPSPEED and (
        layout.zero_stage >= 1 or deepspeed_bf16_optimizer(layout, precision)
    )


@layout_memo(
    "framework", "zero_stage", "pp", "grad_reduce_in_fp32", "precision_aware_optimizer", "offload_optimizer",
    "fp8_param_gather", memory=True,
)  # fmt: skip
def layout_state_bytes(job: Job, layout: Layout) -> StateBytes:
    """``state_bytes_of`` the layout's framework, Megatron gradient dtype and optimizer, and DeepSpeed
    optimizer (memoised: the memory and the step ask it for every layout they evaluate)."""
    precision = job.training.precision
    deepspeed = (deepspeed_master_clone(layout, precision), deepspeed_bf16_optimizer(layout, precision))
    fused = (
        megatron_fused_adam_on_gpu(layout, job.training),
        megatron_master_remainders(layout, job.training),
    )
    flat = deepspeed_flat_partitions(layout, precision)
    return state_bytes_of(job, layout.framework, megatron_grads_in_fp32(layout), deepspeed, fused, flat)


def rank_states(job: Job, layout: Layout, rank: int) -> RankStates:
    """Model states of pipeline rank ``rank`` after sharding and offload, with their buffers."""
    model, training, assume = job.model, job.training, job.assume
    rp = rank_parameters_of(job, layout, rank)
    sb = layout_state_bytes(job, layout)
    degrees = shard_degrees(layout, job.cluster)
    states = ModelStates.of(rank_model_states(model, layout, training, rp, sb, degrees, assume))
    full = training.method is Method.FULL
    trainable = rp.dense + rp.expert if full else lora_parameters(model, training, layout, rp)
    reduce_bytes = grad_reduce_bytes(training.precision, layout)
    held, released = gathered_parameter_bytes(
        model,
        job.counts,
        rp,
        layout,
        sb,
        (degrees[0], trainable),
        assume,
        full=full,
        reduce_bytes=reduce_bytes,
        quantized=(
            quantized_weights(model, layout, training, rp),
            layer_quantized_weights(model, layout, training, rp),
        ),
    )
    held += bucket_bytes(model, trainable, sb, layout, assume, reduce_bytes)
    parameters, gradients = math.ceil(states.parameters), math.ceil(states.gradients)
    optimizer_states = math.ceil(states.optimizer_states)
    head = head_gradient_bytes(job, layout, rank, states.gradients, trainable) if full else 0.0
    host_buffers, accumulation_host = deepspeed_offload_host_bytes(job, layout, sb, rp, trainable, degrees)
    return RankStates(
        states=states,
        parameters=parameters,
        gradients=gradients,
        optimizer_states=optimizer_states,
        model_states_bytes=parameters + gradients + optimizer_states,
        buffers=held + released,
        held_buffers=held,
        host_bytes=states.host_bytes + host_buffers,
        accumulation_host_bytes=accumulation_host,
        nvme_bytes=states.nvme_bytes,
        head_gradients=head,
        optimizer_temporary=optimizer_temporary_bytes(training, sb, states.optimizer_states)
        + deepspeed_fp32_gradient_bytes(job, layout, sb, rp, trainable, degrees)
        + megatron_fp32_gradient_bytes(job, layout, sb, rp, trainable, degrees),
        tied_embedding_transient=head if job.model.tied_embeddings and layout.pp == 1 else 0.0,
        gradients_apart=gradients_in_own_pool(layout, degrees[0]),
    )


def deepspeed_offload_host_bytes(
    job: Job, layout: Layout, sb: StateBytes, rp: RankParameters, trainable: float, degrees: tuple[int, int]
) -> tuple[float, float]:
    """The host buffers DeepSpeed allocates beside the states it offloads, per GPU: (always, and where a
    step accumulates several micro-batches). Read in DeepSpeed at edaa7221:

    * ZeRO-3 with the optimizer offloaded: the reduced gradient partitions are accumulated in one flat
      buffer of the gradient-accumulation dtype (the weights' 16 bits, fp32 in fp32 training) on the
      host, pinned (stage3.py ``grad_partitions_flat_buffer``, on ``self.device``, the CPU under
      offload): ``sb.gradients`` per partition parameter, beside the fp32 copies the CPU optimizer steps.
    * ZeRO-3 with the optimizer on NVMe: the swapper's ``DS_OPTIMIZER_SWAP_BUFFERS`` pinned fp32 buffers
      of the largest sub-group (at most ``sub_group_size``, ``DS_SUB_GROUP_ELEMENTS``), and the fp32
      gradient buffer of that size the swapped sub-group steps from (stage3.py
      ``initialize_optimizer_states``: ``gradient_buffer``); the states and fp32 gradients themselves
      live on NVMe (``model_states._offloaded``).
    * ZeRO-1/2 with the optimizer offloaded and gradient accumulation: each partition parameter's
      gradient accumulated in a pinned host tensor of the weights' dtype (stage_1_and_2.py
      ``async_accumulate_grad_in_cpu_via_gpu``: ``accumulated_grads_in_cpu``), allocated when a step
      has more than one micro-batch: the second figure.
    * NVMe parameter offload: the parameter swapper's ``DS_PARAM_SWAP_BUFFERS`` pinned buffers of
      ``offload_param.buffer_size`` (``deepspeed_param_swap_buffer_elements``) in the weights' dtype.

    A 13B ZeRO-3 NVMe plan on eight L4s passed a 64 GiB host at 48 GiB where these need about 143; ZeRO-3
    CPU offload was counted 16 B per parameter where DeepSpeed holds 18 (an offload review)."""
    if layout.framework is not Framework.DEEPSPEED:
        return 0.0, 0.0
    host = accumulating = 0.0
    if layout.offload_optimizer is not Offload.NONE:
        partitions = group_partitions(job, layout, rp, trainable, degrees)
        if layout.zero_stage >= 3:
            host += sb.gradients * sum(partitions)
            if layout.offload_optimizer is Offload.NVME:
                largest = min(max(partitions), DS_SUB_GROUP_ELEMENTS)
                host += (DS_OPTIMIZER_SWAP_BUFFERS + 1) * activations.FP32_BYTES * largest
        else:
            accumulating = sb.weights * sum(partitions)
    if layout.offload_params is Offload.NVME:
        buffer = deepspeed_param_swap_buffer_elements(job.model, layout, job.cluster)
        host += DS_PARAM_SWAP_BUFFERS * buffer * sb.weights
    return host, accumulating


def gradients_in_own_pool(layout: Layout, dense_shard: int) -> bool:
    """Whether the rank's gradients are allocated on another CUDA stream than its activations, so
    that the caching allocator cannot put them in the blocks the activations free: PyTorch's caching
    allocator reuses a freed block only for an allocation on the stream it was made on
    (c10/cuda/CUDACachingAllocator.cpp: a free block is looked up in the pool of the allocating
    stream), and FSDP2 allocates the reduce-scatter output that the sharded gradients view in its
    reduce-scatter stream (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce:
    ``with device_handle.stream(reduce_scatter_stream): reduce_output = ...allocate``). Their bytes
    then add to the reservation of the backward's start though they are not allocated then
    (torchtitan's published Llama 3.1 8B runs on 8 H100s: peak reserved within 2% with them, 4-6%
    under without; validation/REPORT.md, published memory)."""
    if layout.framework is not Framework.FSDP:
        return False
    return layout.zero_stage in (2, 3) and dense_shard > 1


def optimizer_temporary_bytes(training: TrainingSpec, sb: StateBytes, optimizer_states: float) -> float:
    """What the optimizer step allocates on the GPU beside the states, alive with every gradient:
    torch.optim.AdamW's multi-tensor step (``OptimizerImplementation.FOREACH``; torch/optim/adam.py
    ``_multi_tensor_adam``: ``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)``) makes a
    new tensor per parameter of a (device, dtype) group at once: the rank's trainable parameters in
    the dtype it updates (``sb.master or sb.weights``), one moment's worth of its
    ``optimizer_states`` (none on the GPU when the step is offloaded). Fused steps allocate nothing
    of that size. Measured on an H200 (validation/data/device_runs.json): llama-3.2-1b's step peak is
    its states and gradients + 4.60 GiB (1.236e9 fp32 parameters) with foreach, + 0 fused; + 2.30
    GiB in bf16."""
    if training.optimizer_implementation is not OptimizerImplementation.FOREACH or not sb.moments:
        return 0.0
    return optimizer_states * (sb.master or sb.weights) / sb.moments


def group_partitions(
    job: Job, layout: Layout, rp: RankParameters, trainable: float, degrees: tuple[int, int]
) -> tuple[float, float]:
    """The rank's partitions of its trainable dense and expert parameters (ZeRO's optimizer shards:
    dense over ``degrees[0]``, routed experts over the expert-data-parallel ``degrees[1]``), which
    DeepSpeed keeps in separate optimizer groups (its MoE param groups)."""
    if job.training.method is Method.FULL:
        dense, expert = rp.dense, rp.expert
    else:
        expert = lora_expert_parameters(job.model, job.training, layout, rp)
        dense = trainable - expert
    return dense / degrees[0], expert / degrees[1]


def deepspeed_fp32_gradient_bytes(
    job: Job, layout: Layout, sb: StateBytes, rp: RankParameters, trainable: float, degrees: tuple[int, int]
) -> float:
    """DeepSpeed's optimizer step under mixed precision: the fp32 copies of the gradients it makes
    for its fp32 master, beside every 16-bit gradient (``group_partitions``: a dense group and an MoE
    model's expert group, each over its own data-parallel group).

    * ZeRO-1/2/3: each group's reduced 16-bit gradient partition converted to fp32 as its master's
      .grad, stepped, and freed before the next group's (stage_1_and_2.py step: ``single_grad_partition
      = self.flatten(self.averaged_gradients[i]).to(fp32)`` ... ``single_partition_of_fp32_groups[i].grad
      = None``; stage3.py ``_prepare_fp32_grad_for_sub_group``, one sub-group of at most
      ``sub_group_size`` elements at a time): 4 bytes per parameter of the largest group's partition.
      DeepSpeed's own estimator counts it (ZeRO-2 GPU = 2P + 18P/G: master 4, moments 8, this 4, the
      16-bit gradient 2; shared/reference/formulas.md section 4); the 7B on eight 24 GB cards peaked
      1.9 GB above the estimate without it (hand-derivation review).
    * ZeRO-0 in the pipeline engine with bf16 weights, ``BF16_Optimizer`` (``deepspeed_bf16_optimizer``):
      every group's gradient partition cast to fp32 before one ``optimizer.step()``, freed after it
      (bf16_optimizer.py ``step``): 4 bytes per parameter of all the partitions at once.
    * ZeRO-0 otherwise (fp16, and bf16 without a pipeline: DDP_BFLOAT16), by the optimizer
      (engine.py ``_configure_fp16_optimizer``): DeepSpeed's FusedAdam (ds_config's AdamW) steps in
      ``FP16_Optimizer``, group by group (dense, then expert) ``_flatten_dense_tensors([p.grad.to(fp32)
      for p in group])``: a 4-byte copy of each of the group's gradients and their 4-byte flat
      concatenation at once, while its 16-bit gradients are freed only after it and the earlier groups'
      flat fp32 gradients stay as their masters' .grad (fp16/fused_optimizer.py ``step``): 8 bytes per
      dense parameter, or 4 for the flat dense gradients less their 16-bit ones, and 8 per expert
      parameter. Any other optimizer (Lion, the script's SGD, 8-bit Adam, Adafactor) steps in
      ``FP16_UnfusedOptimizer``: an fp32 copy of every gradient beside the 16-bit ones, all at once
      (fp16/unfused_optimizer.py ``step``): 4 bytes per parameter.

    Without mixed precision (fp32, tf32, bf16_pure) ZeRO-1/2's master is a clone of the partition in
    the weights' dtype (``deepspeed_master_clone``, a state), and the step's flatten copies the
    gradient partition in that dtype: its bytes per parameter, not 4. None with the optimizer
    offloaded (it steps on the host); none where nothing is cloned (ZeRO-0 and ZeRO-3 step the
    weights' own tensors in fp32 and bf16_pure)."""
    if layout.framework is not Framework.DEEPSPEED or not sb.master:
        return 0.0
    if layout.offload_optimizer is not Offload.NONE:
        return 0.0
    fp32 = activations.FP32_BYTES
    if layout.zero_stage == 0:
        if sb.sharded_optimizer_at_zero0:  # BF16_Optimizer
            return fp32 * sum(group_partitions(job, layout, rp, trainable, degrees))
        dense, expert = group_partitions(job, layout, rp, trainable, (1, 1))
        if job.training.optimizer is not Optimizer.ADAMW:
            return fp32 * (dense + expert)
        return max(2 * fp32 * dense, (fp32 - sb.gradients) * dense + 2 * fp32 * expert)
    largest = max(group_partitions(job, layout, rp, trainable, degrees))
    if layout.zero_stage >= 3:
        largest = min(largest, DS_SUB_GROUP_ELEMENTS)
    return sb.master * largest  # in the master's dtype: fp32, or the weights' own (deepspeed_master_clone)


def megatron_fp32_gradient_bytes(
    job: Job, layout: Layout, sb: StateBytes, rp: RankParameters, trainable: float, degrees: tuple[int, int]
) -> float:
    """Megatron's step under mixed precision with 16-bit main grads (fp16, or bf16/fp8 without
    grad_reduce_in_fp32) and no precision-aware FusedAdam (``StateBytes.casts_gradients``): an fp32 copy
    of every gradient its optimizer steps, the whole rank's (Float16OptimizerWithFloat16Params) or its
    distributed optimizer's shard of each group (``group_partitions``), made before the step and freed
    by the next step's zero_grad: 4 bytes per parameter beside every 16-bit gradient. A Llama 3.2 1B at
    ZeRO-0 on eight 24 GB cards was said to fit by 20 MB with bf16 main grads and not with fp32 ones,
    which peak the same (bytes review). None with the optimizer offloaded (the host's optimizer steps)."""
    if not sb.casts_gradients or layout.offload_optimizer is not Offload.NONE:
        return 0.0
    shards = degrees if layout.zero_stage >= 1 else (1, 1)
    return activations.FP32_BYTES * sum(group_partitions(job, layout, rp, trainable, shards))


def head_gradient_bytes(job: Job, layout: Layout, rank: int, gradients: float, trainable: float) -> float:
    """The output layer's weight gradient on pipeline rank ``rank`` of a full fine-tune: the first
    gradient the backward makes (the loss's backward, then the head's matmul), so the one alive at the
    start of the backward, when every activation still is. ``gradients`` bytes over ``trainable``
    parameters per element (the rank's gradient dtype and sharding).

    A tied embedding gets it again at the end of the backward: ``embedding_dense_backward`` makes a
    V x h gradient that AccumulateGrad adds into the head's (torch/csrc/autograd/functions/
    accumulate_grad.h: a second gradient is added, not stolen), a transient of the same size
    (``RankStates.tied_embedding_transient``; measured on an H200, validation/data/device_runs.json:
    llama-3.2-1b's optimizer-free backward peak is its gradients + 0.98 GiB, V h x 4 bytes)."""
    if trainable <= 0.0:
        return 0.0
    return output_layer_weights(job, layout, rank) * gradients / trainable


# The layout fields model states read: the sharding (not micro-batch, recompute, interleaving or SP).
MODEL_STATE_FIELDS = (
    *SHARDING_FIELDS,
    "offload_optimizer",
    "offload_params",
    "optimizer_in_backward",  # no gradient outlives its unit
    "grad_reduce_in_fp32",  # Megatron's gradient buffer dtype
    "fp8_param_gather",  # Megatron's fp8 weights: no bf16 copy, no fp8 cache
    "precision_aware_optimizer",  # Megatron's FusedAdam: a 2-byte master, no fp32 gradient copy
)
# ... and with the buffers they size
STATE_FIELDS = (
    *MODEL_STATE_FIELDS,
    "overlap_grad_reduce",  # DeepSpeed overlap_comm doubles the ZeRO-1/2 reduce buckets
)


@layout_memo(*STATE_FIELDS, memory=True)
def stage_states(job: Job, layout: Layout) -> tuple[RankStates, ...]:
    """``rank_states`` of each of ``pipeline_ranks``."""
    return tuple(rank_states(job, layout, rank) for rank in pipeline_ranks(job, layout))


@layout_memo(*MODEL_STATE_FIELDS, memory=True)
def most_model_states_bytes(job: Job, layout: Layout) -> float:
    """The most weights, gradients and optimizer states that any of ``pipeline_ranks`` holds on its
    GPU (``rank_model_states``, ``RankStates.states`` of ``stage_states``) with Megatron's step copy
    of its gradients, without the buffers, head gradients and other transients ``rank_states`` adds
    (the step moment holds at least these): a lower bound on every layout of this
    sharding, for a check that rejects most of what it is asked (the search's lean check) without
    sizing the buffers (DeepSeek-V3's catalog capacity: about a fifth less CPU, bench/README.md)."""
    sb = layout_state_bytes(job, layout)
    degrees = shard_degrees(layout, job.cluster)
    # and Megatron's fp32 copy of its 16-bit main grads, which the step holds beside them (a full
    # fine-tune's: Megatron trains no adapters), so that the bound prunes what the step rules out
    copies = sb.casts_gradients and job.training.method is Method.FULL
    most = 0.0
    for rank in pipeline_ranks(job, layout):
        rp = rank_parameters_of(job, layout, rank)
        parameters, gradients, optimizer_states, _, _ = rank_model_states(
            job.model, layout, job.training, rp, sb, degrees, job.assume
        )
        step = parameters + gradients + optimizer_states
        if copies:
            step += megatron_fp32_gradient_bytes(job, layout, sb, rp, rp.dense + rp.expert, degrees)
        most = max(most, step)
    return most


@dataclass(slots=True, kw_only=True)  # built on every memo miss: not frozen (frozen __init__ is ~4x)
class RankActivations:
    """One pipeline rank's activations and the buffers and overhead they size."""

    on_gpu: float
    on_gpu_bytes: int  # rounded up, as reported
    on_host: float  # activation offload
    buffers: float  # pipeline receive buffers, QLoRA dequantisation, the loss workspace (last rank)
    cuda_context: float  # cuda_context_bytes
    nccl_buffers: float  # nccl_buffer_bytes
    tp_comm_buffers: float  # tp_comm_buffer_bytes
    outside_allocator: int  # the three above, each rounded up to whole bytes
    # backward_end_activation_bytes: what the end of the backward holds beside every gradient, or None
    # where gradients and activations peak together (gradients_follow_activations is false)
    backward_end: float | None


def activation_split(
    layout: Layout, layer: activations.LayerActivations, per_micro: float, total: int, in_flight: float
) -> tuple[float, float]:
    """A rank's ``total`` activation bytes split (on GPU, offloaded to host), its layers holding
    ``per_micro`` bytes per micro-batch. Activation offload keeps the layer computing and the next
    one on the GPU."""
    if not layout.activation_offload:
        return float(total), 0.0
    layers = in_flight * per_micro
    kept = min(layers, 2 * layer.largest_layer)  # the layer computing and the next, the larger kind
    return total - layers + kept, layers - kept


def fused_expert_gradient_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    """peft's ParamWrapper on fused experts (``model_states.peft_adapts_fused_experts``): the backward
    of the expert matmuls computes the gradient of the whole adapted weight (W + s x BA requires
    grad through the adapter), a tensor of the parameter's size, before baddbmm's backward reduces it
    to the adapter's: the largest adapted parameter of a layer, one at a time."""
    if training.method is Method.FULL or not peft_adapts_fused_experts(model, layout):
        return 0.0
    _, largest = fused_expert_adapted_weights(model, training)
    return largest * frozen_dtype_bytes(training) / layout.tp


@layout_memo("framework", "pp", "tp", "sequence_parallel", "cp", "ep", "micro_batch_size", "chunked_loss",
             "torch_compile", "tp_comm_overlap")  # fmt: skip
def activation_buffer_bytes(job: Job, layout: Layout) -> tuple[float, float]:
    """The activation-sized buffers of (every rank, the last rank): pipeline receive buffers, QLoRA
    dequantisation, the adapted fused experts' weight gradient, PyTorch's ring attention buffers and
    TE's userbuffer workspaces, and those + the loss workspace."""
    model, training = job.model, job.training
    buffers = (
        pipeline_buffer_bytes(model, layout, training)
        + dequantize_bytes(model, layout, training)
        + fused_expert_gradient_bytes(model, layout, training)
        + activations.torch_ring_buffer_bytes(model, layout, training, job.tuning.ring_attention_repeats_kv)
        + tp_comm_workspace_bytes(layout)
    )
    return buffers, buffers + activations.loss_workspace_bytes(model, layout, training)


# The layout fields activations and their buffers read (not the sharding); they hold every field
# communicator_count reads (dp, cp, tp, pp, ep).
ACTIVATION_FIELDS = (
    "framework",
    "dp",
    "cp",
    "tp",
    *PIPELINE_FIELDS,
    "ep",
    "etp",
    "sequence_parallel",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "recompute",
    "recompute_num_layers",
    "recompute_every_n_layers",
    "recompute_modules",
    "activation_offload",
    "chunked_loss",
    "torch_compile",
    "moe_a2a_overlap",
    "moe_capacity_factor",  # the routed experts' padded capacity (activations._moe_mlp)
    "tp_comm_overlap",  # Transformer Engine's userbuffers (tp_comm_buffer_bytes)
    "fsdp_hybrid_shard",  # HSDP's replicate communicator (nccl_buffer_bytes)
    "dp_replicate",
)


# Every layout field a rank's memory reads: its states and its activations.
MEMORY_FIELDS = tuple(dict.fromkeys((*STATE_FIELDS, *ACTIVATION_FIELDS)))


def gradients_follow_activations(job: Job, layout: Layout) -> bool:
    """Whether a step's gradients are made while its activations are freed, so that the two never
    peak together: one micro-batch per step (a later micro-batch's activations would meet the earlier
    ones' gradients) without a pipeline (whose ranks hold micro-batches in flight while earlier ones'
    gradients accumulate), under PyTorch's own gradients (FSDP / DDP / one GPU: AccumulateGrad or
    FSDP's reduce-scatter output allocates each gradient as the backward reaches its parameter).
    Megatron's and DeepSpeed's gradient buffers are allocated at the start and live through the step.

    Measured on an H200 (validation/data/device_runs.json): a 1B to 8B full fine-tune's peak is the
    larger of the backward's start (every activation, the output layer's gradient) and its end (every
    gradient, the first layer's working set), not their sum."""
    if layout.framework is not Framework.FSDP or layout.pp > 1:
        return False
    return activations.micro_batches_per_step(layout, job.training) == 1


def backward_end_activation_bytes(job: Job, layout: Layout) -> float:
    """What the end of the backward holds beside every gradient: the first layer's activations while
    its backward runs (the largest layer kind's, kept whole: a checkpointed layer is recomputed)."""
    return max(activations.kind_layer_bytes(job, layout, Recompute.NONE).values())


@layout_memo(*ACTIVATION_FIELDS, memory=True)
def stage_activations(job: Job, layout: Layout) -> tuple[RankActivations, ...]:
    """Activations, their buffers, the CUDA context, NCCL's buffers and Transformer Engine's userbuffers
    of each of ``pipeline_ranks``."""
    layer = activations.layer_activations(job, layout)
    backward_end = (
        backward_end_activation_bytes(job, layout) if gradients_follow_activations(job, layout) else None
    )
    every_rank, last_rank = activation_buffer_bytes(job, layout)
    context, nccl = cuda_context_bytes(job.assume), nccl_buffer_bytes(layout, job.cluster, job.assume)
    userbuffers = tp_comm_buffer_bytes(job.model, layout, job.training)
    outside_allocator = math.ceil(context) + math.ceil(nccl) + math.ceil(userbuffers)
    micro_batches = activations.micro_batches_per_step(layout, job.training)
    out = []
    kinds = rank_kind_counts(job, layout)
    recomputed = (
        rank_recomputed_fractions(job.model.num_layers, layout, job.training.mtp_num_layers)
        if layout.recomputes_some_layers
        else (1.0,) * layout.pp
    )
    split = pipeline.stage_layers(job.model.num_layers, layout) if layout.virtual_pipeline_stages > 1 else ()
    for rank in pipeline_ranks(job, layout):
        in_flight = activations.micro_batches_in_flight(layout, rank, micro_batches)
        chunks = split[rank :: layout.pp]
        held = in_flight
        if chunks and min(chunks) != max(chunks):  # the rank's chunks differ
            held = activations.layers_in_flight(layout, rank, micro_batches, chunks)
        per_micro = activations.rank_micro_batch_bytes(layer, kinds[rank], recomputed[rank])
        total = activations.stage_activation_bytes(layout, layer, per_micro, rank, in_flight, held)
        on_gpu, on_host = activation_split(layout, layer, per_micro, total, held)
        received = pipelining_buffer_bytes(job.model, layout, job.training, rank, micro_batches, in_flight)
        out.append(
            RankActivations(
                on_gpu=on_gpu,
                on_gpu_bytes=math.ceil(on_gpu),
                on_host=on_host,
                buffers=(last_rank if rank == layout.pp - 1 else every_rank) + received,
                cuda_context=context,
                nccl_buffers=nccl,
                tp_comm_buffers=userbuffers,
                outside_allocator=outside_allocator,
                backward_end=backward_end,
            )
        )
    return tuple(out)


@layout_memo(*activations.LAYER_FIELDS, *activations.MOE_FIELDS, *PIPELINE_FIELDS, "recompute",
             "recompute_num_layers", "recompute_every_n_layers", "recompute_modules", "chunked_loss",
             "activation_offload")  # fmt: skip
def offloaded_activation_bytes(job: Job, layout: Layout) -> float:
    """Activation bytes one micro-batch sends to the host (and back) under activation offload, on the
    pipeline rank that sends the most: its layers' activations but the two kept on the GPU
    (``activation_split``)."""
    if not layout.activation_offload:
        return 0.0
    layer = activations.layer_activations(job, layout)
    kinds = rank_kind_counts(job, layout)
    recomputed = rank_recomputed_fractions(job.model.num_layers, layout, job.training.mtp_num_layers)
    return max(
        max(
            0.0,
            activations.rank_micro_batch_bytes(layer, kinds[rank], recomputed[rank])
            - 2 * layer.largest_layer,
        )
        for rank in range(layout.pp)
    )


def min_state_bytes_per_gpu(job: Job, framework: Framework, gpus: int) -> int:
    """Model states per GPU with every state sharded over ``gpus`` GPUs and nothing offloaded: no
    layout of ``framework`` on that many GPUs needs less (ZeRO-3 / FULL_SHARD's bound)."""
    # Megatron's bf16 gradient buffer and precision-aware FusedAdam's 2-byte master: the least; and
    # Adafactor factored, as DeepSpeed's ZeRO-0 steps it (shaped tensors, split by tp and pp: fp32
    # Adafactor at tp 8 holds less than ZeRO-3's flat whole second moment over 8, a change review)
    sb = state_bytes_of(job, framework, False, (False, False), (True, True))
    return int(state_bytes_per_parameter(sb, framework) * job.counts.total / gpus)


def min_frozen_base_bytes_per_gpu(job: Job, gpus: int) -> int:
    """LoRA/QLoRA: the frozen base per GPU, each parameter at the fewest bytes it may take
    (``model_states.frozen_bytes``: NF4's packed half byte for QLoRA's quantized Linear weights) and
    sharded over ``gpus`` GPUs (ZeRO-3 and FSDP partition frozen parameters too): no layout on that
    many GPUs holds less of it, whatever its framework."""
    linear, other, _ = frozen_bytes(job.model, job.training, job.assume)
    counts = job.counts
    # QLoRA trains data parallel only (ep 1), where transformers' fused experts stay in the compute
    # dtype (``experts_stay_16_bit``): the bound quoted Qwen3-235B's base at a quarter of what every
    # layout holds (a review of the ordinary requests); nor does bitsandbytes quantize the embedding,
    # the output layer (transformers keeps the lm_head out) or the final norm
    whole = counts.embedding + counts.output + counts.final_norm
    if job.training.method is Method.QLORA and experts_stay_16_bit(job.model, Layout()):
        whole += counts.moe_layers * counts.experts_per_moe_layer
    return int((min(linear, other) * (counts.total - whole) + other * whole) / gpus)


def min_gradient_bytes_per_gpu(job: Job, framework: Framework, gpus: int) -> int:
    """The gradients among ``min_state_bytes_per_gpu`` (rounded down: a lower bound's part)."""
    sb = state_bytes_of(job, framework, False)
    return int(sb.gradients * job.counts.total / gpus)


def _hf_activation_words(model: ModelSpec) -> str:
    """What of a transformers model's saved tensors the activation note names: its norm's (RMSNorm
    upcasts to fp32 and keeps it), and its loss's log-softmax (fp32 for a causal LM, which upcasts the
    logits; an encoder's head takes them in the model dtype: ``activations.last_stage_extra_bytes``).
    BERT's note named RMSNorm and an fp32 log-softmax it has neither of (an encoder review)."""
    norm = "RMSNorm fp32 upcast" if model.norm is NormKind.RMSNORM else "LayerNorm"
    loss = "fp32 log-softmax" if model.head is Head.CAUSAL_LM else "log-softmax in the model dtype"
    return f"{norm}, {loss}"


def _state_bytes_note(job: Job, layout: Layout) -> str:
    sb = layout_state_bytes(job, layout)
    if layout.framework is Framework.FSDP:
        # FSDP keeps one sharded parameter per trainable parameter (fsdp_parameter_bytes): the fp32
        # master under mixed precision, no 16-bit copy beside it
        kept = "master" if sb.master else "weights"
        held = "FSDP's sharded" if layout.zero_stage >= 2 else "DDP's unsharded"  # zero_stage 0: DDP
        states = f"parameter {fsdp_parameter_bytes(sb):g} B ({held} {kept}), gradients {sb.gradients:g} B"
    else:
        states = f"weights {sb.weights:g} B, gradients {sb.gradients:g} B, master {sb.master:g} B"
    note = (
        f"model states per trainable parameter: {states}, optimizer moments {sb.moments:.4g} B "
        f"({job.training.optimizer.value})"
    )
    training = job.training
    full = training.method is Method.FULL
    if layout.framework is Framework.FSDP and training.optimizer is Optimizer.ADAMW_8BIT and full:
        share = embedding_table_fraction(job.model)
        note += (
            f" on average: the embedding tables' {share:.1%} of the parameters keep 32-bit states "
            f"({BNB_32BIT_STATE_BYTES} B; the HF Trainer's override of every nn.Embedding)"
        )
    if layout.framework is Framework.DEEPSPEED and layout.zero_stage == 0 and sb.master:
        if sb.sharded_optimizer_at_zero0:  # BF16_Optimizer
            note += (
                "; DeepSpeed's pipeline engine steps bf16 at ZeRO-0 with BF16_Optimizer: master and moments "
                "partitioned over dp as ZeRO-1, a flat bf16 gradient buffer beside each .grad"
            )
        elif job.training.optimizer is Optimizer.ADAMW:
            note += (
                "; DeepSpeed steps ZeRO-0 with FP16_Optimizer: fp32 copies of each group's gradients "
                "flattened at the step (8 B per parameter beside the 16-bit ones)"
            )
        else:
            note += (
                "; DeepSpeed steps ZeRO-0 with FP16_UnfusedOptimizer (not its FusedAdam): an fp32 copy of "
                "every gradient at the step (4 B per parameter beside the 16-bit ones)"
            )
    if layout.framework is Framework.MEGATRON and job.training.precision in (Precision.BF16, Precision.FP8):
        chosen = (
            "as set"
            if layout.grad_reduce_in_fp32 is not None
            else "NVIDIA's recipes' default; Megatron-LM's own is fp32: grad_reduce_in_fp32 true"
        )
        dtype = "fp32" if megatron_grads_in_fp32(layout) else "bf16 (--grad-reduce-in-bf16)"
        note += f"; gradient buffer and its reduce-scatter in {dtype} ({chosen})"
    if megatron_fused_adam_on_gpu(layout, job.training):
        chosen = (
            "as set"
            if layout.precision_aware_optimizer is not None
            else "NVIDIA's bf16 recipes' default; Megatron-LM's own is off: precision_aware_optimizer false"
        )
        master = (
            "the master as the fp32 weights' low 16 bits (2 B; store_param_remainders, Transformer Engine "
            ">= 2.1: an older one keeps 4 B)"
            if sb.master_remainders
            else "the fp32 master"
        )
        note += (
            f"; --use-precision-aware-optimizer: Transformer Engine's FusedAdam keeps {master} and steps the "
            f"main grads as they are ({chosen})"
        )
    elif sb.casts_gradients and layout.offload_optimizer is Offload.NONE:
        note += (
            "; the step casts the 16-bit main grads to fp32 (4 B per parameter of its optimizer shard, "
            "until the next step)"
        )
    return note


def _state_notes(job: Job, layout: Layout) -> list[str]:
    # the sharding, offload, optimizer and quantisation this layout's model states assume
    model, training, assume = job.model, job.training, job.assume
    notes = []
    if ds_note := deepspeed_assumption(model, layout):
        notes.append(ds_note)
    if layout.framework is Framework.FSDP and layout.zero_stage == 0 and layout.dp * layout.cp > 1:
        notes.append("plain data parallel = PyTorch DDP; its buckets hold one more copy of the gradients")
    if layout.offload_optimizer is not Offload.NONE:
        notes.append(
            f"optimizer offload: host holds fp32 master + moments + a {assume.cpu_adam_grad_bytes}-byte "
            "gradient copy per parameter shard"
            + (
                " (on NVMe where offloaded there), and DeepSpeed's host buffers: ZeRO-3's 16-bit gradient "
                "partitions, ZeRO-Infinity's swap buffers, ZeRO-1/2's accumulated gradients"
                if layout.framework is Framework.DEEPSPEED
                else ""
            )
        )
    if training.optimizer is Optimizer.ADAMW_8BIT:
        notes.append(
            f"8-bit Adam: 1 B per moment + fp32 absmax per {assume.adam_8bit_block_elements} elements"
        )
    if training.optimizer is Optimizer.ADAFACTOR:
        second = (
            "a whole fp32 second moment (DeepSpeed hands it flat 1-D partitions, which it does not factor)"
            if deepspeed_flat_partitions(layout, training.precision)
            else "factored second moment (rows + columns per matrix)"
        )
        notes.append(f"Adafactor: {second}, no first moment")
    # the rest of a QLoRA base in the compute dtype (bnb_4bit_compute_dtype: fp16 where the GPU has no bf16)
    rest = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[training.precision.weight_dtype]
    if training.method is Method.QLORA:
        notes.append(
            f"QLoRA: NF4 Linear weights at {qlora_bits_per_weight(model, assume):.4g} bits (4 bits sharded, "
            f"their constants on every rank); embeddings, head, norms {rest}"
        )
    if training.method is not Method.FULL and fused_experts(model, layout):
        # transformers 5's fused expert parameters: peft's target_modules match modules, bitsandbytes
        # replaces nn.Linear (model_states.fused_experts); said, since it decides the MoE's memory
        # (Mixtral QLoRA: 85 GiB of parameters that "NF4 Linear weights" did not explain; hardware review)
        kept = (
            f"; bitsandbytes leaves them {rest} (it quantizes nn.Linear modules)"
            if training.method is Method.QLORA and experts_stay_16_bit(model, layout)
            else ""
        )
        if peft_adapts_fused_experts(model, layout):
            notes.append(
                "routed experts: Hugging Face's fused expert parameters (transformers 5), onto which peft "
                "0.21 moves LoRA's MLP targets (gate_up_proj at rank 2r, down_proj at r, a ParamWrapper "
                "per parameter; no dense MLP or shared expert keeps one): each MoE layer's forward keeps "
                "its adapted expert weights, W + BA, for backward, and the backward makes their whole "
                f"gradient{kept}"
            )
        else:
            notes.append(
                "routed experts: Hugging Face's fused expert parameters (transformers 5), which LoRA's "
                f"target_modules do not reach: no adapters on them, frozen{kept}"
            )
    return notes


def _pipeline_note(job: Job, layout: Layout) -> str:
    embedding, loss = pipeline.accounts_for(job.model.num_layers, layout)
    how = ""
    if layout.pipeline_layers is None and (embedding or loss):
        counted = " and ".join(name for name, on in (("the embedding", embedding), ("the loss", loss)) if on)
        how = f" ({counted} counted as a layer)"
    ranks = ", ".join(str(rank) for rank in pipeline_ranks(job, layout))
    buffers = (
        "; torch.distributed.pipelining keeps a forward and a gradient receive buffer per micro-batch"
        if layout.framework is Framework.FSDP
        else ""
    )
    return (
        f"pipeline: layers per stage {pipeline.describe(job.model.num_layers, layout)}{how}; ranks {ranks} "
        "evaluated, the most loaded reported; in-flight micro-batches of the 1F1B / interleaved "
        f"schedule{buffers}"
    )


def fp8_note(layout: Layout) -> str:
    """What fp8 training keeps, as this layout runs it."""
    if layout.framework is Framework.FSDP:
        return (
            "fp8: torchao Float8Linear: bf16 weights cast to fp8 in each forward, no cached fp8 copy; "
            "bf16 activations"
        )
    if layout.framework is not Framework.MEGATRON:
        return "fp8: bf16 weights + cached fp8 weight and transpose per GEMM weight (2 B), bf16 activations"
    chosen = "as set" if layout.fp8_param_gather is not None else "NVIDIA's fp8 recipes' default"
    weights = (
        f"fp8 GEMM weights + their fp8 transpose (2 B; --fp8-param-gather, {chosen}: no bf16 copy, "
        "gathered in fp8)"
        if megatron_fp8_params(layout, Precision.FP8)
        else "bf16 weights + cached fp8 weight and transpose per GEMM weight "
        f"(2 B; no --fp8-param-gather, {chosen})"
    )
    return f"fp8: {weights}; Transformer Engine keeps each GEMM's input for backward in fp8 (1 B)"


def _moment_note(job: Job, layout: Layout) -> str:
    """Which moments of the step the peak is the largest of (``evaluate.rank_peak_parts``)."""
    step = ""
    if job.training.optimizer_implementation is OptimizerImplementation.FOREACH:
        step = "; the optimizer step: every gradient + foreach AdamW's temporary (sqrt of exp_avg_sq)"
    if gradients_follow_activations(job, layout):
        return (
            "peak moment: the larger of the backward's start (every activation, the output layer's "
            "gradient) and its end (every gradient, the first layer's working set): one micro-batch per "
            f"step, PyTorch allocating each gradient as the backward reaches it{step}"
        )
    return (
        "peak moment: every gradient with every activation (gradient accumulation, a pipeline, or the "
        f"framework's gradient buffer){step}"
    )


def assumptions(job: Job, layout: Layout) -> tuple[str, ...]:
    """What the memory estimate assumed for this input, in words and numbers."""
    assume = job.assume
    notes = [
        _state_bytes_note(job, layout),
        f"memory statistics: peak allocated = what is alive at the step's largest moment (the breakdown's "
        f"parts: model states, activations, buffers); peak reserved = allocated + the caching allocator's "
        f"fragmentation reserve, {assume.fragmentation_fraction:.0%} of what each moment allocates and "
        f"frees; device used (nvidia-smi) = reserved + CUDA context {assume.cuda_context_bytes // MiB} MiB "
        f"+ NCCL {assume.nccl_bytes_per_group // MiB} MiB per process group"
        + (
            f" + Transformer Engine's TP-overlap userbuffers, {TE_UB_COMMUNICATORS} of tokens x hidden "
            f"({tp_comm_buffer_bytes(job.model, layout, job.training) / MiB:,.0f} MiB)"
            if _te_userbuffers(layout)
            else ""
        )
        + "; the fit compares device used with the card's capacity",
        _moment_note(job, layout),
        "activations: "
        + (
            "Megatron-LM (Korthikanti et al. 2022, 16-bit, 1-byte dropout masks)"
            if layout.framework is Framework.MEGATRON
            else f"Hugging Face transformers tensors saved by autograd ({_hf_activation_words(job.model)})"
        ),
    ]
    if layout.framework is Framework.FSDP and layout.tp > 1 and layout.sequence_parallel:
        notes.append(
            "DTensor tensor parallelism: each column-parallel Linear's all-gathered input is saved whole "
            "(the sequence-parallel shard is not what backward keeps)"
        )
    if layout.pp > 1:
        notes.append(_pipeline_note(job, layout))
    if job.model.moe is not None and (factor := layout.moe_capacity_factor) is not None:
        # the factor asked for (DeepSpeed MoE's default is a warning: caveats.capacity_warnings)
        notes.append(
            f"MoE capacity factor {factor:g}: each expert's routed tokens padded to {factor:g} x its mean "
            "load, the copies routed past it dropped"
        )
    notes += _state_notes(job, layout)
    if job.training.method is not Method.FULL:
        # peft's nn.Dropout before each adapter keeps its output and mask per input element where the
        # dropout is on (PEFT's examples use 0.1, Axolotl's 0.05); the launch files set 0 (fine-tuning
        # tables review: said nowhere)
        notes.append(
            "LoRA dropout 0 (peft's default, as the launch files set it): with lora_dropout > 0 each adapted "
            "Linear also keeps a dropout output and mask of its input, 3 bytes an element in 16 bits"
        )
    if job.training.precision is Precision.FP8:
        notes.append(fp8_note(layout))
    if layout.chunked_loss:
        notes.append(
            f"chunked loss (torchtitan's, {activations.CHUNKED_LOSS_CHUNKS} chunks): one chunk's logits, "
            "log-softmax and gradients at a time, and the fp32 hidden-state gradient they accumulate"
        )
    elif layout.torch_compile is Compile.MODEL_AND_LOSS:
        notes.append(
            "torch.compile: the fused cross-entropy keeps the 16-bit logits and writes their 16-bit gradient "
            "(no fp32 log-softmax)"
        )
    return tuple(notes)
