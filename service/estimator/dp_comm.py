"""Data-parallel communication as each framework runs it, and how much of it compute hides.

Replicated parameters (ZeRO-0/1/2, Megatron's distributed optimizer, DDP): the gradients are
reduced in buckets, one collective per bucket, each paying NCCL's latency (``comm``); ZeRO-1/2 and
the distributed optimizer then all-gather the updated 16-bit parameters in the same buckets.
ZeRO-2 reduces after every micro-batch, the others once per step. Overlapped (the layout's
``overlap_grad_reduce``, else the framework's default), a reduction hides under its micro-batch's
backward and the gather under the next step's first forward, at most
``dp_overlap_max_hidden_fraction``. PyTorch DDP (fsdp at ZeRO-0) also copies every gradient into its
bucket and back on the compute stream unless its buckets alias the gradients: HBM traffic no overlap
hides (``ddp_bucket_copy_s``).

Sharded parameters (DeepSpeed ZeRO-3, FSDP FULL_SHARD and SHARD_GRAD_OP): every wrapped unit is
all-gathered before its forward, again before its backward when it was resharded after forward, and
its gradients are reduce-scattered after its backward. The unit is a decoder layer (FSDP: torchtitan
and accelerate wrap each block) or each of its modules with parameters (DeepSpeed gathers submodule
by submodule, coalescing up to ``stage3_prefetch_bucket_size`` when prefetching, and reduce-scatters
in ``reduce_bucket_size`` buckets). Under DeepSpeed's full recompute a module the reuse distance
releases after its recomputed forward is gathered a third time for its backward
(``regathered_share``). A unit's gather hides under the forward of the unit before it (one-unit
prefetch: FSDP BACKWARD_PRE, FSDP2's implicit prefetch, DeepSpeed's prefetch bucket), its backward
collectives under its own backward; the first gather and the last reduce-scatter of a pass are
exposed. ``zero3_prefetch_hidden_fraction`` caps what any window hides (NCCL's kernels share the SMs
with the GEMMs they overlap). How often: DeepSpeed every micro-batch (``no_sync`` is refused at
stage 2/3); FSDP without pipelining every micro-batch (torchtitan does not skip the reduce-scatter
while accumulating); FSDP under torch.distributed.pipelining gathers once per step (torchtitan's
``reshard_after_forward`` is False with PP) and reduce-scatters only after the last micro-batch
(``PipelineStage.backward_maybe_with_nosync``). HYBRID_SHARD shards inside a node: gathers and
reduce-scatters there, then all-reduces the gradient shard across the replicas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.estimator import comm, flops
from service.estimator.job import Job, LayerKind, job_memo, layout_memo
from service.estimator.memory import rank_parameters_of, state_bytes_of
from service.estimator.model_states import (
    DS_MAX_REUSE_DISTANCE,
    SHARD_GROUP_FIELDS,
    deepspeed_bf16_optimizer,
    deepspeed_buckets,
    deepspeed_overlap_comm,
    fused_experts,
    grad_reduce_bytes,
    hsdp_replicas,
    megatron_fp8_params,
    shard_degrees,
)
from service.estimator.step_time import (
    SPLIT_FIELDS,
    StepBase,
    StepParts,
    core_s_per_token,
    exposed_s,
    fp8_layer_cast_s,
    group_links,
    kind_core_work_flops,
    kind_recompute_flops,
    recomputed_share,
    routed_expert_flops,
    runs_torch_ring,
    stage_gpu_parameter_groups,
    step_base,
    torch_ring_traffic,
    tuned_link,
)
from service.estimator.tuning import Tuning, dp_overlap_default
from service.estimator.types import Framework, Layout, Method, ModelSpec, Recompute, RecomputeModule

# ---------------------------------------------------------------- the frameworks' bucket sizes

# Megatron-Core's default gradient bucket with --overlap-grad-reduce: max(40M, 1M x dp-cp size)
# parameters ("larger DP sizes need larger buckets to ensure collectives do not become
# latency-bound", core/distributed/distributed_data_parallel_config.py bucket_size); without the
# overlap one bucket holds everything.
MEGATRON_MIN_BUCKET_ELEMENTS = 40_000_000
MEGATRON_BUCKET_ELEMENTS_PER_DP_RANK = 1_000_000
FP8_BYTES = 1  # an fp8 element (E4M3 / E5M2)
# PyTorch DDP bucket_cap_mb = 25 (MiB) (torch.nn.parallel.DistributedDataParallel).
DDP_BUCKET_BYTES = 25 * 1024 * 1024
# DeepSpeed stage 0 all-reduces the flattened gradients in 5e8-element chunks
# (runtime/engine.py MEMORY_OPT_ALLREDUCE_SIZE; the catalog's memory.ds_stage0_allreduce_elements).


def replicated_bucket_elements(job: Job, layout: Layout) -> float:
    """Gradient elements per reduction bucket when the parameters are replicated (ZeRO <= 2)."""
    framework = layout.framework
    if framework is Framework.MEGATRON:
        if not dp_overlapped(job, layout):
            return math.inf
        return max(MEGATRON_MIN_BUCKET_ELEMENTS, MEGATRON_BUCKET_ELEMENTS_PER_DP_RANK * layout.dp * layout.cp)
    if framework is Framework.FSDP:
        return DDP_BUCKET_BYTES / grad_reduce_bytes(job.training.precision, layout)
    if layout.zero_stage == 0:
        return job.assume.ds_stage0_allreduce_elements
    return deepspeed_buckets(job.model, layout).reduce_bucket_elements


def bucketed_s(collective: comm.Collective, size_bytes: float, link: comm.Link, calls: float) -> float:
    """``collective`` of ``size_bytes`` split into ``calls`` collectives: the traffic once, the
    latency ``calls`` times (a fraction when one collective serves several units)."""
    latency_s = collective(0.0, link)
    return collective(size_bytes, link) + (calls - 1.0) * latency_s


# ---------------------------------------------------------------- replicated parameters


def dp_overlapped(job: Job, layout: Layout) -> bool:
    """``grad_reduce_overlapped`` under the job's tuning."""
    return grad_reduce_overlapped(job.tuning, layout)


def grad_reduce_overlapped(tuning: Tuning, layout: Layout) -> bool:
    """Whether the DP reduction runs under backward: DeepSpeed's overlap_comm as the launcher
    renders it, else the layout's choice or the framework's default (what an estimate that leaves
    ``overlap_grad_reduce`` out resolves it to, and names)."""
    if layout.framework is Framework.DEEPSPEED:
        return deepspeed_overlap_comm(layout)
    if layout.overlap_grad_reduce is not None:
        return layout.overlap_grad_reduce
    return dp_overlap_default(tuning, layout.framework)


def replicated_bucket_calls(job: Job, layout: Layout, parameters: float) -> int:
    """Collectives of one reduction (or gather) of ``parameters`` in the framework's buckets: at least
    one (Megatron without overlap reduces everything in one bucket, whose size is unbounded)."""
    return max(1, math.ceil(parameters / replicated_bucket_elements(job, layout)))


def dp_grad_reduce_s(job: Job, layout: Layout, parameters: float, link: comm.Link) -> float:
    """One reduction of ``parameters`` gradients over the DP ``link`` in the framework's buckets:
    all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1/2, dist-opt)."""
    if job.training.method is not Method.FULL:
        return 0.0  # LoRA: only the adapters' gradients are reduced; negligible next to the base
    grad_size = parameters * grad_reduce_bytes(job.training.precision, layout)
    calls = replicated_bucket_calls(job, layout, parameters)
    return bucketed_s(grad_reduce_collective(layout), grad_size, link, calls)


def grad_reduce_collective(layout: Layout) -> comm.Collective:
    """The collective of a gradient bucket with replicated parameters: all-reduce at ZeRO-0; at
    ZeRO-1/2 a reduce-scatter (Megatron's distributed optimizer, FSDP's SHARD_GRAD_OP) except in
    DeepSpeed, which all-reduces each bucket and keeps its own slice (runtime/zero/stage_1_and_2.py
    average_tensor -> allreduce_and_scatter, zero config use_multi_rank_bucket_allreduce default True,
    since DeepSpeed 0.12.4, PR #4695; before it, one dist.reduce per owning rank)."""
    if layout.zero_stage == 0 or layout.framework is Framework.DEEPSPEED:
        return comm.group_all_reduce_s
    return comm.group_reduce_scatter_s


def dp_param_gather_s(job: Job, layout: Layout, parameters: float, link: comm.Link) -> float:
    """ZeRO-1/2 (dist-opt) all-gather of the updated 16-bit parameters after the step, in the
    reduction's buckets (Megatron's param-gather buckets are its gradient buckets); DeepSpeed's in one
    all_gather_into_tensor of the whole group (runtime/utils.py all_gather_dp_groups takes that path
    wherever torch has it, ignoring allgather_bucket_size: a 512-rank gather was charged 479 calls'
    latency, a third of its step; hand-derivation review)."""
    partitioned = layout.zero_stage in (1, 2) or deepspeed_bf16_optimizer(layout, job.training.precision)
    if job.training.method is not Method.FULL or not partitioned:
        return 0.0  # (DeepSpeed's BF16_Optimizer gathers as ZeRO-1 does: update_lp_params)
    size = parameters * gathered_bytes_per_parameter(job, layout)
    if layout.framework is Framework.DEEPSPEED:
        return comm.group_all_gather_s(size, link)
    calls = replicated_bucket_calls(job, layout, parameters)
    return bucketed_s(comm.group_all_gather_s, size, link, calls)


def gathered_bytes_per_parameter(job: Job, layout: Layout) -> float:
    """Bytes per parameter of the distributed optimizer's parameter all-gather: the 16-bit weights,
    or with Megatron's --fp8-param-gather 1 byte for the GEMM weights (their fp8 data; the
    transpose is made after the gather) and 2 for the rest (embedding, norms), by the share of GEMM
    weights on the most loaded stage (core/distributed/param_and_grad_buffer.py: fp8 parameters
    live in a uint8 buffer)."""
    weights = state_bytes_of(job, layout.framework).weights
    if not megatron_fp8_params(layout, job.training.precision):
        return weights
    ranks = (rank_parameters_of(job, layout, rank) for rank in range(layout.pp))
    held = max(ranks, key=lambda rp: rp.dense + rp.expert)
    fp8_share = held.linear / (held.dense + held.expert)
    return weights - (weights - FP8_BYTES) * fp8_share


def gradient_reductions(layout: Layout, micro_batches: int) -> int:
    """Gradient reductions per step with replicated parameters: one, or one per micro-batch for ZeRO-2."""
    # ZeRO-2 keeps only its shard of the gradients, so it reduce-scatters after every micro-batch's
    # backward: DeepSpeed reduces when partition_gradients (stage 2) or at the accumulation boundary
    # (stage 1) (runtime/zero/stage_1_and_2.py, reduce_ready_partitions_and_remove_grads).
    # ZeRO-0/1 and Megatron's distributed optimizer accumulate locally and reduce once per step.
    return micro_batches if layout.zero_stage == 2 else 1


# The layout fields the replicated collectives read: the split and the pipeline split (links and the
# GPU's parameters), the sharding and its groups (the experts' data-parallel group), the framework
# (buckets, gradient bytes) and the overlap (buckets).
REPLICATED_FIELDS = (*SPLIT_FIELDS, "pipeline_layers", "pipeline_account_for_embedding",
                     "pipeline_account_for_loss", "virtual_pipeline_stages", "zero_stage",
                     "framework", "overlap_grad_reduce", "grad_reduce_in_fp32",
                     "fp8_param_gather", "fsdp_hybrid_shard", "dp_replicate")  # fmt: skip


@layout_memo(*REPLICATED_FIELDS)
def replicated_collectives_s(job: Job, layout: Layout) -> tuple[float, float]:
    """(one gradient reduction, the parameter all-gather) with replicated parameters, on the most
    loaded stage: the dense ones over the data-parallel group, the routed experts over the
    expert-data-parallel one (DeepSpeed's MoE param groups reduce over expert_dp_process_group,
    stage_1_and_2.py _configure_moe_settings; Megatron-Core's expert buffers over the expert-DP
    group), nothing where that group is one rank. All of them over the DP group timed a Mixtral on
    ep 8 and two nodes at half its exposed reduction (hand-derivation review)."""
    dense, experts = max(stage_gpu_parameter_groups(job, layout), key=sum)
    link = group_links(job, layout).dp
    reduce_s = dp_grad_reduce_s(job, layout, dense, link)
    gather_s = dp_param_gather_s(job, layout, dense, link)
    if experts and shard_degrees(layout, job.cluster)[1] > 1:
        experts_link = shard_links(job, layout).experts
        reduce_s += dp_grad_reduce_s(job, layout, experts, experts_link)
        gather_s += dp_param_gather_s(job, layout, experts, experts_link)
    return reduce_s, gather_s


def ddp_copies_gradients(job: Job, layout: Layout) -> bool:
    """Whether PyTorch DDP (framework fsdp at ZeRO-0 with more than one replica) copies the gradients
    into its buckets and back: unless ``gradient_as_bucket_view`` (the catalog's
    ``ddp_gradient_as_bucket_view``; False is DDP's default, and ``memory.bucket_bytes`` counts the
    copy it makes)."""
    return (
        layout.framework is Framework.FSDP
        and layout.zero_stage == 0
        and layout.dp * layout.cp > 1
        and job.training.method is Method.FULL
        and not job.assume.ddp_gradient_as_bucket_view
    )


def ddp_bucket_copy_s(job: Job, layout: Layout, parameters: float) -> float:
    """HBM time of one reduction's copies between ``parameters`` gradients and DDP's buckets: each
    gradient read and written into its bucket as backward produces it, and the reduced bucket read
    and written back into the gradient after the last all-reduce, on the compute stream, so nothing
    hides them (4 bytes moved per gradient byte; the bucket holds what the all-reduce reduces)."""
    # torch/csrc/distributed/c10d/reducer.cpp: mark_variable_ready_dense copies each ready gradient
    # into its bucket view (at::mul_out(bucket_view, grad, 1 / div_factor): 'divides while copying');
    # finalize_bucket_dense, at the end of backward, copy_bucket_to_grad (grad.copy_(bucket_view))
    # unless gradient_as_bucket_view, which 'avoids the overhead of copying between gradients and
    # allreduce communication buckets' (DistributedDataParallel docs). apex's DDP (NVIDIA/apex@47da14a
    # apex/parallel/distributed.py allreduce_bucket) flattens, averages and unflattens: 6 bytes.
    if not ddp_copies_gradients(job, layout):
        return 0.0
    copied = parameters * grad_reduce_bytes(job.training.precision, layout)
    return 2 * 2 * copied / job.cluster.gpu.hbm_bandwidth_bytes_per_s


def replicated_exposed_s(job: Job, layout: Layout, parts: StepParts) -> float:
    """Replicated-parameter DP traffic left on the critical path after the framework's overlap, and
    DDP's copies to and from its buckets (``ddp_bucket_copy_s``), which no overlap hides."""
    reduce_s, gather_s = replicated_collectives_s(job, layout)
    reductions = gradient_reductions(layout, parts.micro_batches)
    copies_s = reductions * ddp_bucket_copy_s(job, layout, parts.parameters)
    if not dp_overlapped(job, layout):
        return reductions * reduce_s + gather_s + copies_s
    # each reduction hides under its micro-batch's backward (2/3 of it, + its recompute); the parameter
    # all-gather under the next step's first forward (Megatron --overlap-param-gather) (1/3). The
    # window is the passes' wall time, the TP communication they wait on included: timed by compute
    # alone, a lower clock on PCIe nodes (TP-bound) shrank it and made the step faster (custom-hardware
    # review: 200 W 1.30 s against 350 W 1.32 s)
    per_micro_batch = (parts.compute_s + parts.recompute_s + parts.tp_comm_s) / parts.micro_batches
    hidden = job.tuning.dp_overlap_max_hidden_fraction
    return (
        reductions * exposed_s(reduce_s, 2 / 3 * per_micro_batch, hidden)
        + exposed_s(gather_s, per_micro_batch / 3, hidden)
        + copies_s
    )


# ---------------------------------------------------------------- sharded parameters


def sharded(layout: Layout) -> bool:
    """Whether the parameters themselves are sharded: ZeRO-3, or FSDP at stage 2 or 3 (SHARD_GRAD_OP
    also frees the unsharded parameters after backward and gathers them again before the next
    forward)."""
    if layout.zero_stage == 3:
        return True
    return layout.framework is Framework.FSDP and layout.zero_stage == 2


def layer_modules(model: ModelSpec, kind: LayerKind) -> int:
    """Modules with their own parameters in a decoder layer (DeepSpeed's gathering unit): q, k, v, o
    and the MLP's two or three projections; an MoE layer's router and its fused experts
    (transformers >= 5 keeps each layer's experts as one module's 3-D tensors) and shared experts."""
    mlp = 3 if model.mlp.gated else 2
    if not kind.moe or model.moe is None:
        return 4 + mlp
    return 4 + 1 + 1 + (mlp if model.moe.num_shared_experts else 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitParameters:
    """One decoder layer's parameters on one GPU, by the group that shards them."""

    dense: float  # sharded over the DP (x CP) group
    experts: float  # routed experts, sharded over the expert-data-parallel group


@job_memo
def unit_parameters(job: Job, kind: LayerKind, tp: int, ep: int, etp: int) -> UnitParameters:
    """A decoder layer of ``kind`` on one GPU after tp, and its routed experts after ep and etp (norms
    count with the dense part)."""
    c = job.counts
    dense = c.attention_per_layer + c.norms_per_layer
    if kind.moe and job.model.moe is not None:
        dense += c.router_per_moe_layer + c.shared_experts_per_moe_layer
        return UnitParameters(dense=dense / tp, experts=c.experts_per_moe_layer / ep / etp)
    return UnitParameters(dense=(dense + c.dense_mlp_per_layer) / tp, experts=0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardLinks:
    dense: comm.Link  # the group the dense parameters are sharded over
    experts: comm.Link  # the expert-data-parallel group
    replicas: comm.Link | None  # HYBRID_SHARD: the replicas of each shard, across nodes


@layout_memo(*SHARD_GROUP_FIELDS)
def shard_links(job: Job, layout: Layout) -> ShardLinks:
    """The links of the sharding groups (ranks ordered tp, cp, ep|dp, pp: ``comm``)."""
    dense_shard, expert_shard = shard_degrees(layout, job.cluster)
    copies = hsdp_replicas(layout, job.cluster)
    replicas = None if copies == 1 else tuned_link(job, copies, layout.tp * dense_shard)
    return ShardLinks(
        dense=tuned_link(job, dense_shard, layout.tp),
        experts=tuned_link(job, expert_shard, layout.expert_tp * layout.ep),
        replicas=replicas,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitCollectives:
    """The DP collectives of one decoder layer of a kind, per pass."""

    gather_s: float  # all-gather of its parameters
    reduce_s: float  # reduce-scatter of its gradients (+ HSDP's all-reduce across replicas)


def unit_gather_calls(job: Job, layout: Layout, kind: LayerKind, elements: float) -> float:
    """All-gathers per layer: one per FSDP unit; DeepSpeed one per module, modules coalesced while
    they fit its prefetch bucket (partitioned_param_coordinator.fetch_sub_module)."""
    if layout.framework is not Framework.DEEPSPEED:
        return 1.0
    bucket = deepspeed_buckets(job.model, layout).prefetch_bucket_elements
    return float(min(layer_modules(job.model, kind), max(1, math.ceil(elements / bucket))))


def unit_reduce_calls(job: Job, layout: Layout, elements: float) -> float:
    """Reduce-scatters per layer: one per FSDP unit; DeepSpeed one per ``reduce_bucket_size`` of
    gradients, so a fraction of one when a bucket spans layers."""
    if layout.framework is not Framework.DEEPSPEED:
        return 1.0
    return elements / deepspeed_buckets(job.model, layout).reduce_bucket_elements


# + the buckets DeepSpeed's launcher renders (deepspeed_buckets reads the stage, the overlap and pp)
@layout_memo(*SPLIT_FIELDS, *SHARD_GROUP_FIELDS, "zero_stage", "overlap_grad_reduce", "grad_reduce_in_fp32")
def unit_collectives(job: Job, layout: Layout, kind: LayerKind) -> UnitCollectives:
    links = shard_links(job, layout)
    unit = unit_parameters(job, kind, layout.tp, layout.ep, layout.expert_tp)
    elements = unit.dense + unit.experts
    weight_bytes = state_bytes_of(job, layout.framework).weights
    gathers = unit_gather_calls(job, layout, kind, elements)
    gather_s = bucketed_s(comm.group_all_gather_s, unit.dense * weight_bytes, links.dense, gathers)
    if unit.experts:
        gather_s += comm.group_all_gather_s(unit.experts * weight_bytes, links.experts)
    if job.training.method is not Method.FULL:
        return UnitCollectives(gather_s=gather_s, reduce_s=0.0)  # frozen base: no gradients to reduce
    g = grad_reduce_bytes(job.training.precision, layout)
    reduces = unit_reduce_calls(job, layout, elements)
    reduce_s = bucketed_s(comm.group_reduce_scatter_s, unit.dense * g, links.dense, reduces)
    if unit.experts:
        reduce_s += comm.group_reduce_scatter_s(unit.experts * g, links.experts)
    if links.replicas is not None:
        # HYBRID_SHARD: each parameter group's shard all-reduced across the replicas (torch
        # _fsdp_collectives.py foreach_reduce: the reduce-scatter output), the routed experts' over
        # their own shard group, efsdp = fsdp x tp / ep (torchtitan parallel_dims.py): at efsdp 1 their
        # whole gradient (divided by the dense shard, Qwen3-30B-A3B's HSDP step was 3.6x too fast;
        # hybrid-sharding review)
        dense_shard, expert_shard = shard_degrees(layout, job.cluster)
        shard_elements = unit.dense / dense_shard + unit.experts / expert_shard
        reduce_s += comm.group_all_reduce_s(shard_elements * g, links.replicas)
    return UnitCollectives(gather_s=gather_s, reduce_s=reduce_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardedPasses:
    """How many times per step the layers are gathered and reduced."""

    forward_gathers: int  # passes that gather every layer before its forward
    backward_gathers: int  # passes that gather every layer again before its backward
    reductions: int  # passes that reduce-scatter every layer's gradients


def sharded_passes(layout: Layout, micro_batches: int) -> ShardedPasses:
    m = micro_batches
    if layout.framework is Framework.FSDP and layout.pp > 1:
        # torch.distributed.pipelining: every backward but the last keeps the stage unsharded and its
        # gradients unreduced (PipelineStage.backward_maybe_with_nosync), so one reduce-scatter per
        # step. torchtitan's --parallelism.fsdp_reshard_after_forward as the launcher renders it:
        # "never" (ZeRO-2) gathers once; "always" (ZeRO-3) reshards after each forward, so every
        # backward gathers again, and so do the warm-up forwards (at most pp) before the first backward.
        if layout.zero_stage == 2:
            return ShardedPasses(forward_gathers=1, backward_gathers=0, reductions=1)
        return ShardedPasses(forward_gathers=min(m, layout.pp), backward_gathers=m, reductions=1)
    if layout.framework is Framework.FSDP and layout.zero_stage == 2:
        return ShardedPasses(forward_gathers=m, backward_gathers=0, reductions=m)  # SHARD_GRAD_OP
    return ShardedPasses(forward_gathers=m, backward_gathers=m, reductions=m)


@job_memo
def kind_flops(job: Job, kind: LayerKind, fused: bool) -> tuple[int, float, int, int]:
    """Per token, of a layer of ``kind``: attention's core FLOPs (forward), what its kernels execute
    of them (``kind_core_work_flops``), the forward weight GEMMs' (the adapters' included) and the
    layer's training FLOPs (``flops.layer_training_flops``): what ``kind_windows_s`` splits into its
    windows, the same for every layout of the job with the same ``fused`` (``model_states.fused_experts``)."""
    model, training = job.model, job.training
    core = flops.layer_core_flops(model, kind, training.seq_len)
    adapters = flops.lora_adapter_flops(model, kind.moe, training, fused_experts=fused)
    forward = flops.layer_matmul_flops(model, kind.moe) + adapters
    trained = flops.layer_training_flops(model, kind, training, fused_experts=fused)
    return core, kind_core_work_flops(job, kind), forward, trained


def kind_windows_s(job: Job, layout: Layout, base: StepBase, kind: LayerKind) -> tuple[float, float]:
    """(forward, backward) compute time of one layer of ``kind`` for one micro-batch: what its
    collectives hide under (the backward includes the layer's recomputed forward). Each FLOP runs as
    the step times it (``step_time.gemm_s``): the weight GEMMs at the GEMM rate, an MoE layer's
    routed experts at the grouped GEMM's (``expert_flops_per_s``), attention's core as its kernels
    do (``step_time.core_s_per_token``); so a slower GEMM never widens a window by more than it
    lengthens the step."""
    fused = fused_experts(job.model, layout)
    core, work, forward, training_flops = kind_flops(job, kind, fused)
    backward = float(training_flops - forward - 3 * core)
    recomputed = kind_recompute_flops(job, kind, layout.recompute, layout.selective_modules, fused)
    redone = 1.0 if layout.recomputes_core else 0.0  # full and selective core_attn redo the core
    share = recomputed_share(job, layout, base.stage)
    backward += share * (recomputed - redone * core)
    # the routed experts' share of those FLOPs: forward once, backward (frozen_passes - 1) times, and
    # again where the recompute redoes them (full, or Megatron's moe module), as step_time counts them
    routed = routed_expert_flops(job.model) if kind.moe else 0
    redoes_experts = layout.recompute is Recompute.FULL or RecomputeModule.MOE in layout.selective_modules
    routed_backward = routed * (flops.frozen_passes(job.training) - 1 + (share if redoes_experts else 0.0))
    tokens = base.tokens / layout.tp
    seconds_per_flop = tokens / base.flops_per_s
    seconds_per_routed_flop = tokens / base.expert_flops_per_s
    forward_s = (forward - routed) * seconds_per_flop + routed * seconds_per_routed_flop
    forward_s += tokens * core_s_per_token(base, work, 0.0)
    backward_s = (backward - routed_backward) * seconds_per_flop + routed_backward * seconds_per_routed_flop
    core_backward_s = tokens * core_s_per_token(base, share * redone * work, 2 * work)
    backward_s += core_backward_s
    # and the time the GPU idles in the layer's compute (the host's op issue, the launch floor), which
    # the collectives' stream has to itself: a window of FLOPs alone grew with the work while a
    # host-bound compute did not (a longer sequence made a shorter step); with the idle time added,
    # more work (or a slower GEMM) widens the window by at most what it lengthens the compute
    # and its separate fp8 cast passes (torchao's), compute-stream work a faster fp8 GEMM adds: a
    # window of the GEMMs alone shrank by more than the step did, and fp8 came out slower than bf16
    # on a PCIe node's FSDP (precision review)
    cast_forward_s, cast_backward_s = fp8_layer_cast_s(job, layout, base, kind)
    forward_s += cast_forward_s
    backward_s += cast_backward_s
    per_layer = base.micro_batches * base.layers
    if per_layer:
        forward_s += base.idle_forward_s / per_layer
        backward_s += base.idle_backward_s / per_layer
    if runs_torch_ring(layout) and base.layers:
        # the attention kernels under which PyTorch's ring moves K and V carry that traffic already
        ring = torch_ring_traffic(job, layout, base)
        forward_s = max(0.0, forward_s - ring.forward_hidden_s)
        recomputed_forwards = ring.forwards - 1.0  # in the backward window
        backward_s = max(
            0.0, backward_s - ring.backward_hidden_s - recomputed_forwards * ring.forward_hidden_s
        )
    return forward_s, backward_s


def backward_prefetch_blocked(job: Job, layout: Layout, kind: LayerKind) -> bool:
    """Whether DeepSpeed ZeRO-3 gathers a layer's parameters for backward without prefetching them.

    Under full recompute a layer's parameters, gathered again for its recompute forward, stay live
    until its backward reuses them as far as ``stage3_max_reuse_distance`` (1e9 elements by default)
    reaches (partitioned_param_coordinator ``__params_to_release``; past it, ``regathered_share``:
    gathered a third time). The coordinator prefetches at
    most ``stage3_max_live_parameters`` minus what is live (``fetch_sub_module``:
    ``max_params_to_prefetch = min(max_live - n_available, prefetch_bucket_size)``), so when one
    layer holds more than ``max_live_parameters`` nothing is prefetched while it is live and each
    module waits for its own all-gather.
    """
    if layout.framework is not Framework.DEEPSPEED or layout.recompute is not Recompute.FULL:
        return False
    unit = unit_parameters(job, kind, layout.tp, layout.ep, layout.expert_tp)
    return unit.dense + unit.experts > deepspeed_buckets(job.model, layout).max_live_parameters


def dense_module_parameters(job: Job, tp: int) -> tuple[float, ...]:
    """A dense decoder layer's modules with parameters on one TP rank, in the order their forward
    runs: q, k, v, o, then the MLP's projections (gate, up, down or up, down). Attention's
    parameters are split by the projections' widths (q and o: heads x head_dim, k and v: kv heads x
    head_dim), the MLP's evenly (each projection is h x ffn); biases go with their projections."""
    model, c = job.model, job.counts
    q = model.num_attention_heads
    kv = model.num_kv_heads
    attention = c.attention_per_layer / tp
    widths = (q, kv, kv, q)
    projections = 3 if model.mlp.gated else 2
    mlp = c.dense_mlp_per_layer / tp
    return (
        *(attention * w / sum(widths) for w in widths),
        *(mlp / projections for _ in range(projections)),
    )


def reuse_released(modules: tuple[float, ...], index: int, distance: float) -> bool:
    """Whether DeepSpeed releases module ``index`` after its recomputed forward, so its backward
    gathers it again.

    After a module's forward the coordinator keeps its parameters only if they are used again
    within ``stage3_max_reuse_distance`` elements of the trace (partitioned_param_coordinator.py
    ``__params_to_release``: it walks the modules after the current one, adding their parameters,
    and stops once the sum reaches the distance). In a checkpointed layer's backward the trace after
    module i's recomputed forward is the rest of the recomputed forward, then the backward from the
    last module down to i. (The prefetcher's own look-ahead, which also keeps a parameter, reaches
    one module ahead: never module i's backward while another module lies between.)
    """
    # the modules between its recomputed forward and its own backward: kept if reached in time
    return 2 * sum(modules[index + 1 :]) >= distance


@job_memo
def regathered_share(job: Job, kind: LayerKind, tp: int) -> float:
    """Share of a checkpointed dense layer's parameters DeepSpeed ZeRO-3 gathers a third time per
    micro-batch: released after the recomputed forward (``reuse_released``), gathered again for
    the backward. With the default 1e9-element distance a GPT layer (12 h^2 parameters) keeps every
    module up to h = 6144 (q's backward is 22 h^2 = 0.83e9 elements on) and releases q, k, v and o,
    a third of the layer, at h = 8192-10240. MoE layers (experts fused in one module, sharded over
    another group) are not walked: 0."""
    if kind.moe:
        return 0.0
    modules = dense_module_parameters(job, tp)
    released = sum(
        size for i, size in enumerate(modules) if reuse_released(modules, i, DS_MAX_REUSE_DISTANCE)
    )
    return released / sum(modules)


def backward_gather_factor(job: Job, layout: Layout, kind: LayerKind, stage: int) -> float:
    """Gathers of a layer's parameters in one backward pass, in units of the whole layer: one, plus
    DeepSpeed ZeRO-3's re-gather of what the reuse distance releases between a checkpointed layer's
    recomputed forward and its backward (``regathered_share``), on the recomputed layers."""
    if layout.framework is not Framework.DEEPSPEED or layout.recompute is not Recompute.FULL:
        return 1.0
    return 1.0 + recomputed_share(job, layout, stage) * regathered_share(job, kind, layout.tp)


def sharded_exposed_s(job: Job, layout: Layout) -> float:
    """ZeRO-3/FSDP traffic left on the critical path, layer by layer."""
    base = step_base(job, layout)
    passes = sharded_passes(layout, base.micro_batches)
    hidden = job.tuning.zero3_prefetch_hidden_fraction
    overlapped = dp_overlapped(job, layout)
    forward = backward_gather = backward_reduce = 0.0
    first_gather_s = last_reduce_s = 0.0
    for kind, count in base.counts:
        unit = unit_collectives(job, layout, kind)
        forward_window, backward_window = kind_windows_s(job, layout, base, kind)
        first_gather_s = max(first_gather_s, unit.gather_s)
        forward += count * exposed_s(unit.gather_s, forward_window, hidden)
        # one backward's gathers
        gather_s = backward_gather_factor(job, layout, kind, base.stage) * unit.gather_s
        if overlapped:
            last_reduce_s = max(last_reduce_s, unit.reduce_s)
            reduce_exposed_s = exposed_s(unit.reduce_s, backward_window, hidden)
            if backward_prefetch_blocked(job, layout, kind):  # each module waits for its gather
                backward_gather += count * (gather_s + reduce_exposed_s)
            else:
                backward_gather += count * exposed_s(gather_s + unit.reduce_s, backward_window, hidden)
            backward_reduce += count * reduce_exposed_s
        else:  # each reduce-scatter waits for its layer's backward (DeepSpeed overlap_comm false)
            backward_gather += count * (exposed_s(gather_s, backward_window, hidden) + unit.reduce_s)
            backward_reduce += count * unit.reduce_s
    forward += first_gather_s  # nothing runs before the first layer's gather
    backward_gather += last_reduce_s  # nor after the last layer's reduce-scatter
    backward_reduce += last_reduce_s
    only_reduced = passes.reductions - passes.backward_gathers
    return (
        passes.forward_gathers * forward
        + passes.backward_gathers * backward_gather
        + only_reduced * backward_reduce
    )


# ---------------------------------------------------------------- both


def dp_comm_exposed_s(job: Job, layout: Layout, parts: StepParts) -> float:
    """DP traffic left on the critical path after the framework's overlap."""
    if sharded(layout):
        return sharded_exposed_s(job, layout)
    return replicated_exposed_s(job, layout, parts)
