"""A layout evaluated against a prepared job: the one place where the parts of memory and of the
step time are summed, and the searches over one layout's micro-batch and sequence length.

Two faces of the same sums: plain numbers (``memory_numbers``, ``step_numbers``: what a search
needs to decide fit and rank) and result objects (``memory_estimate``, ``time_estimate``: what an
estimate reports). The parts come from ``memory`` (model states and activations of the first and
the last pipeline stage) and ``step_time``, memoised on the job by the layout fields they read.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

from service.estimator import activations, dp_comm, flops
from service.estimator import step_time as st
from service.estimator.calibration import calibrated_bytes
from service.estimator.errors import EstimatorError
from service.estimator.job import Job, layout_memo, make_job
from service.estimator.memory import (
    MEMORY_FIELDS,
    RankActivations,
    RankStates,
    autocast_weight_bytes,
    fragmentation_bytes,
    gradients_follow_activations,
    pipeline_ranks,
    rank_states,
    stage_activations,
    stage_states,
)
from service.estimator.model_states import fused_experts
from service.estimator.pipeline import recomputed_fraction
from service.estimator.scale import MAX_TOKENS_PER_STEP
from service.estimator.types import (
    ClusterSpec,
    Layout,
    MemoryBreakdown,
    MemoryEstimate,
    StageMemory,
    TimeBreakdown,
    TimeEstimate,
    step_total_s,
)
from service.estimator.validate import (
    learned_positions,
    sequence_divisor,
    valid_micro_batch_sizes,
    validate_layout,
)

# (parameters, gradients, optimizer states, activations, buffers, fragmentation, CUDA context, NCCL
# buffers, TP userbuffers) of one GPU, in bytes: the first five are what PyTorch allocates, +
# fragmentation what its caching allocator reserves, + the last three what nvidia-smi shows
# (``MemoryBreakdown``)
MemoryParts = tuple[int, int, int, int, int, int, int, int, int]

# ---------------------------------------------------------------- memory


def rank_buffer_bytes(states: RankStates, acts: RankActivations, autocast_bytes: float) -> float:
    """One pipeline rank's buffers: the model states' (buckets, gathered parameters), the
    activations' (pipeline receive buffers, dequantisation, the loss workspace) and the autocast copies
    of a frozen fp32 base (``memory.autocast_weight_bytes``)."""
    return states.buffers + acts.buffers + autocast_bytes


def rank_peak_parts(
    job: Job, states: RankStates, acts: RankActivations, autocast_bytes: float
) -> tuple[int, int, int, int]:
    """(gradients, activations, buffers, overhead) of one pipeline rank at its peak, in whole bytes:
    the parameters and optimizer states are alive throughout; what else is depends on the moment,
    and the peak is the moment that allocates the most:

    * the backward's start: every activation and buffer, with every gradient where they meet
      (gradient accumulation, a pipeline, Megatron's and DeepSpeed's gradient buffers) and else only
      the output layer's (``RankStates.head_gradients``; ``memory.gradients_follow_activations``);
    * the backward's end, where gradients follow activations: every gradient, the first layer's
      working set (``RankActivations.backward_end``), the buffers held through the backward and a tied
      embedding's second gradient;
    * the optimizer step: every gradient, the held buffers and what the step allocates
      (``RankStates.optimizer_temporary``).

    The overhead: the CUDA context, NCCL's buffers, Transformer Engine's userbuffers and the
    allocator's fragmentation, a fraction of
    what each moment allocates and frees; the reserved peak is the largest moment's reservation, the
    start's with the gradients made later where they come from another stream's pool
    (``RankStates.gradients_apart``)."""
    buffers = rank_buffer_bytes(states, acts, autocast_bytes)
    fraction = job.assume.fragmentation_fraction
    working = acts.backward_end  # None: gradients meet activations (no backward-end moment)
    start_gradients = float(states.gradients) if working is None else states.head_gradients
    start = start_gradients + acts.on_gpu + buffers
    made = states.gradients - start_gradients  # gradients allocated after the start
    # gradients made on another stream's blocks cannot reuse the activations' (gradients_in_own_pool)
    apart = made if states.gradients_apart else 0.0
    reserved = start + fragmentation_bytes(acts.on_gpu + buffers, fraction) + apart
    moment = (math.ceil(start_gradients), acts.on_gpu_bytes, math.ceil(buffers))
    peak = start
    if working is not None:
        end_buffers = states.held_buffers + states.tied_embedding_transient
        end = states.gradients + working + end_buffers
        reserved = max(reserved, end + fragmentation_bytes(made + working + end_buffers, fraction))
        if end > peak:
            moment, peak = (states.gradients, math.ceil(working), math.ceil(end_buffers)), end
    if states.optimizer_temporary:
        step_buffers = states.held_buffers + states.optimizer_temporary
        step = states.gradients + step_buffers
        reserved = max(reserved, step + fragmentation_bytes(made + states.optimizer_temporary, fraction))
        if step > peak:
            moment, peak = (states.gradients, 0, math.ceil(step_buffers)), step
    return (*moment, math.ceil(acts.outside_allocator + reserved - peak))


def rank_memory_parts(
    job: Job, states: RankStates, acts: RankActivations, dynamic_factor: float, autocast_bytes: float
) -> MemoryParts:
    """One pipeline rank's bytes by component at its peak (``rank_peak_parts``); ``dynamic_factor``
    (learned from runs) scales the dynamic ones: activations, buffers and the overhead
    (fragmentation, CUDA context, NCCL, userbuffers). ``autocast_bytes``: the 16-bit copies of a frozen
    fp32 base the rank holds (``memory.autocast_weight_bytes``), a buffer."""
    gradients, activations, buffers, overhead = rank_peak_parts(job, states, acts, autocast_bytes)
    # whole bytes already
    context, nccl = math.ceil(acts.cuda_context), math.ceil(acts.nccl_buffers)
    userbuffers = math.ceil(acts.tp_comm_buffers)
    if dynamic_factor == 1.0:
        dynamic = (activations, buffers, overhead)
    else:
        dynamic = (
            calibrated_bytes(activations, dynamic_factor),
            calibrated_bytes(buffers, dynamic_factor),
            calibrated_bytes(overhead, dynamic_factor),
        )
        context, nccl = calibrated_bytes(context, dynamic_factor), calibrated_bytes(nccl, dynamic_factor)
        userbuffers = calibrated_bytes(userbuffers, dynamic_factor)
    # the overhead split so that its parts add up to it exactly: the fit's total is the one it was
    context = min(context, dynamic[2])
    nccl = min(nccl, dynamic[2] - context)
    userbuffers = min(userbuffers, dynamic[2] - context - nccl)
    return (
        states.parameters,
        gradients,
        states.optimizer_states,
        dynamic[0],
        dynamic[1],
        dynamic[2] - context - nccl - userbuffers,
        context,
        nccl,
        userbuffers,
    )


def rank_total_bytes(job: Job, states: RankStates, acts: RankActivations, autocast_bytes: float) -> int:
    """``sum(rank_memory_parts(job, states, acts, 1.0, autocast_bytes))`` without the parts: what a
    search compares with the limit, once per layout it tries (the parts are integers, so any order
    of adding them gives this sum; the overhead's split adds up to the overhead)."""
    return (
        states.parameters + states.optimizer_states + sum(rank_peak_parts(job, states, acts, autocast_bytes))
    )


def rank_autocast_bytes(job: Job, layout: Layout) -> list[float]:
    """``memory.autocast_weight_bytes`` of each of ``pipeline_ranks``."""
    ranks = pipeline_ranks(job, layout)
    if not job.base_autocast:
        return [0.0] * len(ranks)
    return [autocast_weight_bytes(job, layout, rank) for rank in ranks]


def most_loaded(job: Job, layout: Layout, dynamic_factor: float = 1.0) -> tuple[MemoryParts, float, float]:
    """The parts of the most loaded evaluated rank (the first on a tie), and the largest host and
    NVMe bytes per GPU of any evaluated rank."""
    all_states, all_acts = stage_states(job, layout), stage_activations(job, layout)
    casts = rank_autocast_bytes(job, layout)
    heaviest = rank_memory_parts(job, all_states[0], all_acts[0], dynamic_factor, casts[0])
    heaviest_bytes = sum(heaviest)
    for states, acts, cast in zip(all_states[1:], all_acts[1:], casts[1:], strict=True):  # the other ranks
        parts = rank_memory_parts(job, states, acts, dynamic_factor, cast)
        if (total := sum(parts)) > heaviest_bytes:
            heaviest, heaviest_bytes = parts, total
    host, nvme = host_and_nvme_bytes(job, layout, all_states, all_acts)
    return heaviest, host, nvme


def accumulates(job: Job, layout: Layout) -> bool:
    """Whether a step of ``layout`` runs several micro-batches per data-parallel rank (what
    ``RankStates.accumulation_host_bytes`` are allocated for)."""
    return activations.micro_batches_per_step(layout, job.training) > 1


def host_and_nvme_bytes(
    job: Job, layout: Layout, all_states: tuple[RankStates, ...], all_acts: tuple[RankActivations, ...]
) -> tuple[float, float]:
    """Host bytes (offloaded states, their buffers and activations; where a step accumulates, the
    accumulation's host buffers) and NVMe bytes per GPU of the most loaded node, as a share of it
    (x GPUs per node is the node's): each GPU's own where a node holds one pipeline stage, else the
    sum of the stages it holds. Megatron's and DeepSpeed's rank orders put the pipeline outermost
    (tp-cp-ep-dp-pp; PipeDataParallelTopology's ['pipe', 'data']), so a node of G GPUs holds G / (tp cp
    dp) consecutive stages where tp cp dp < G, and only the first and last hold the embedding and the
    output layer: the heaviest stage times G counted Llama 3 8B's pp 8 on one node at 25 B per
    parameter of host RAM where its stages hold 18 (a cross-check review)."""
    host = nvme = extra = 0.0
    for states, acts in zip(all_states, all_acts, strict=True):  # a loop: every layout evaluated asks it
        host = max(host, states.host_bytes + acts.on_host)
        nvme = max(nvme, states.nvme_bytes)
        extra = max(extra, states.accumulation_host_bytes)
    if not (host or nvme or extra):  # nothing offloaded (the search's common case)
        return 0.0, 0.0
    accumulating = accumulates(job, layout)

    def host_of(states: RankStates, on_host: float) -> float:
        return states.host_bytes + (states.accumulation_host_bytes if accumulating else 0.0) + on_host

    host = max(host_of(s, a.on_host) for s, a in zip(all_states, all_acts, strict=True))
    per_node = job.cluster.gpus_per_node
    inner = layout.world_size // layout.pp  # the GPUs of one stage
    if layout.pp == 1 or inner >= per_node or per_node % inner:
        return host, nvme
    # each stage's states (the evaluated ranks stand for the others only in their activations, whose
    # host part, activation offload, none of the launchers runs: the most of any, an upper bound)
    evaluated = dict(zip(pipeline_ranks(job, layout), all_states, strict=True))
    on_host = max(a.on_host for a in all_acts)
    stages = [evaluated.get(r) or rank_states(job, layout, r) for r in range(layout.pp)]
    hosts = [host_of(s, on_host) for s in stages]
    nvmes = [s.nvme_bytes for s in stages]
    held = per_node // inner  # consecutive stages per node
    node_host = max(sum(hosts[i : i + held]) for i in range(0, layout.pp, held))
    node_nvme = max(sum(nvmes[i : i + held]) for i in range(0, layout.pp, held))
    return node_host * inner / per_node, node_nvme * inner / per_node


def memory_numbers(job: Job, layout: Layout, dynamic_factor: float = 1.0) -> tuple[int, int, int]:
    """``(per-GPU total, host bytes per node, NVMe bytes per node)`` of ``memory_estimate``."""
    if dynamic_factor == 1.0:
        return uncalibrated_memory_numbers(job, layout)
    return _memory_numbers(job, layout, dynamic_factor)


@layout_memo(*MEMORY_FIELDS, memory=True)
def uncalibrated_memory_numbers(job: Job, layout: Layout) -> tuple[int, int, int]:
    """``memory_numbers`` without calibration, what a search asks of every layout it tries:
    memoised with the memory parts (shared by the GPU types of a sweep: ``job.memory_memos``)."""
    return _memory_numbers(job, layout, 1.0)


def _memory_numbers(job: Job, layout: Layout, dynamic_factor: float) -> tuple[int, int, int]:
    gpus_per_node = job.cluster.gpus_per_node
    if dynamic_factor != 1.0:
        parts, host, nvme = most_loaded(job, layout, dynamic_factor)
        return sum(parts), math.ceil(host * gpus_per_node), math.ceil(nvme * gpus_per_node)
    # most_loaded's total, host and NVMe bytes, without building each rank's parts
    all_states, all_acts = stage_states(job, layout), stage_activations(job, layout)
    casts = rank_autocast_bytes(job, layout)
    total = max(map(functools.partial(rank_total_bytes, job), all_states, all_acts, casts))
    host, nvme = host_and_nvme_bytes(job, layout, all_states, all_acts)
    return total, math.ceil(host * gpus_per_node), math.ceil(nvme * gpus_per_node)


def memory_estimate(job: Job, layout: Layout, dynamic_factor: float = 1.0) -> MemoryEstimate:
    """Per-GPU memory of the most-loaded rank (first or last pipeline stage), of each evaluated
    pipeline rank, and host/NVMe per node."""
    parts, host, nvme = most_loaded(job, layout, dynamic_factor)
    gpus_per_node = job.cluster.gpus_per_node
    stages = zip(
        pipeline_ranks(job, layout),
        stage_states(job, layout),
        stage_activations(job, layout),
        rank_autocast_bytes(job, layout),
        strict=True,
    )
    return MemoryEstimate(
        per_gpu=memory_breakdown(parts),
        capacity_bytes=job.cluster.gpu.memory_bytes,
        cpu_per_node_bytes=math.ceil(host * gpus_per_node),
        nvme_per_node_bytes=math.ceil(nvme * gpus_per_node),
        per_stage=tuple(
            StageMemory(
                rank=rank, memory=memory_breakdown(rank_memory_parts(job, states, acts, dynamic_factor, cast))
            )
            for rank, states, acts, cast in stages
        ),
    )


def memory_breakdown(parts: MemoryParts) -> MemoryBreakdown:
    parameters, gradients, optimizer_states, activations, buffers, fragmentation, context, nccl, ub = parts
    return MemoryBreakdown(
        parameters=parameters,
        gradients=gradients,
        optimizer_states=optimizer_states,
        activations=activations,
        buffers=buffers,
        fragmentation=fragmentation,
        cuda_context=context,
        nccl_buffers=nccl,
        tp_comm_buffers=ub,
    )


def numbers_fit(
    cluster: ClusterSpec, numbers: tuple[int, int, int], limit_bytes: int, host_limit_bytes: int | None = None
) -> bool:
    """The one fit predicate: the per-GPU total within ``limit_bytes``, host RAM and NVMe per node
    within the node's where the cluster states them (0 = not stated); host RAM within
    ``host_limit_bytes`` where given (a plan's search keeps some of it free: recommender.headroom)."""
    total, cpu, nvme = numbers
    host = cluster.cpu_memory_bytes_per_node if host_limit_bytes is None else host_limit_bytes
    cpu_ok = not cluster.cpu_memory_bytes_per_node or cpu <= host
    nvme_ok = not cluster.nvme_bytes_per_node or nvme <= cluster.nvme_bytes_per_node
    return total <= limit_bytes and cpu_ok and nvme_ok


def memory_fits(memory: MemoryEstimate, cluster: ClusterSpec) -> bool:
    """``numbers_fit`` of an estimate, against the GPU's whole capacity."""
    numbers = (memory.per_gpu.total, memory.cpu_per_node_bytes, memory.nvme_per_node_bytes)
    return numbers_fit(cluster, numbers, memory.capacity_bytes)


def fits(
    job: Job,
    layout: Layout,
    limit_bytes: int | None = None,
    dynamic_factor: float = 1.0,
    host_limit_bytes: int | None = None,
) -> bool:
    """Whether ``layout`` fits within ``limit_bytes`` per GPU (default: the GPU's capacity) and
    ``host_limit_bytes`` of host RAM per node (default: the node's stated RAM)."""
    limit = job.cluster.gpu.memory_bytes if limit_bytes is None else limit_bytes
    return numbers_fit(job.cluster, memory_numbers(job, layout, dynamic_factor), limit, host_limit_bytes)


# ---------------------------------------------------------------- time


def time_parts(job: Job, layout: Layout) -> tuple[float, ...]:
    """The step's parts in ``TimeBreakdown`` order."""
    parts = st.step_parts(job, layout)
    return (
        parts.compute_s + st.weight_cast_s(job, layout, parts),
        parts.recompute_s,
        parts.tp_comm_s,
        parts.cp_comm_s,
        parts.ep_comm_s,
        parts.pp_bubble_s,
        parts.pp_comm_s,
        dp_comm.dp_comm_exposed_s(job, layout, parts),
        st.offload_s(job, layout, parts),
        st.optimizer_s(job, layout, parts),
    )


def time_breakdown(parts: tuple[float, ...]) -> TimeBreakdown:
    names = [f.name for f in dataclasses.fields(TimeBreakdown)]
    return TimeBreakdown(**dict(zip(names, parts, strict=True)))


def step_numbers(job: Job, layout: Layout) -> tuple[float, float]:
    """``(step_s, tokens_per_s)`` of ``time_estimate``: what a search ranks by."""
    step_s = step_total_s(*time_parts(job, layout))
    return step_s, job.training.tokens_per_step / step_s


def time_estimate(job: Job, layout: Layout) -> TimeEstimate:
    """Step time, throughput and utilisation of ``layout``.

    MFU = model FLOPs / (step x GPUs x dense peak), model FLOPs without recompute and with
    attention's core over the causal triangle, as Megatron-LM's num_floating_point_operations counts
    it since 2025 (not PaLM's full square, App. B's 12 L H Q T, nor torchtitan's, which state they
    ignore causal sparsity: at long sequences that square is twice what a causal kernel runs, and an
    MFU on it passes 1). HFU = what the kernels execute (flash: the triangle; eager: the square),
    recompute included, over the same; the step runs exactly those FLOPs at rates at most the dense
    peak (step_time.compute_s, recompute_s; ``utilisation_peak_flops_per_s``), so MFU <= HFU <= 1."""
    breakdown = time_breakdown(time_parts(job, layout))
    step_s, gpus = breakdown.step_s, layout.world_size
    model, training = job.model, job.training
    peak = st.utilisation_peak_flops_per_s(job.cluster, training.precision)
    fused = fused_experts(model, layout)
    model_flops = flops.model_flops_per_step(model, training, fused_experts=fused)
    recomputed = recomputed_fraction(model.num_layers, layout)
    hardware_flops = flops.hardware_flops_per_step(
        model, training, layout.recompute, recomputed, layout.selective_modules, fused_experts=fused
    ) + training.tokens_per_step * st.adapted_experts_hardware_flops_per_token(job, layout)
    return TimeEstimate(
        breakdown=breakdown,
        tokens_per_s=training.tokens_per_step / step_s,
        tflops_per_gpu=model_flops / (step_s * gpus) / 1e12,
        mfu=model_flops / (step_s * gpus * peak),
        hardware_tflops_per_gpu=hardware_flops / (step_s * gpus) / 1e12,
        hfu=hardware_flops / (step_s * gpus * peak),
    )


def floor_s(job: Job, layout: Layout, most_micro_batches: int | None = None) -> float:
    """The step less its DP, offload and optimizer time (all >= 0), less its bubble and less an
    overlapped EP all-to-all (``rising_ep_comm_s``): a lower bound on the step of every sharding and
    framework that shares the layout's ``PARTS_FIELDS`` and, at the largest micro-batch, on every
    smaller micro-batch of it (each part left falls as the micro-batch grows).
    ``most_micro_batches``: the most micro-batches a member of the family runs (its smallest
    micro-batch); the bubble of any member is then at least (p-1)/(v m) of this layout's ideal."""
    p = st.step_parts(job, layout)
    ideal = p.compute_s + p.recompute_s + p.tp_comm_s + p.cp_comm_s + p.ep_comm_s
    ideal -= rising_ep_comm_s(layout, p.ep_comm_s)
    bubble = 0.0 if most_micro_batches is None else st.bubble_fraction(layout, most_micro_batches) * ideal
    return ideal + p.pp_comm_s + bubble


def rising_ep_comm_s(layout: Layout, ep_comm_s: float) -> float:
    """The part of the layout's exposed EP all-to-all time that a bound over its micro-batches must
    leave out: all of it where the all-to-alls overlap another micro-batch's compute
    (``moe_a2a_overlap``). Then only the passes no other micro-batch pairs with expose them in full
    (``step_time.paired_fraction``), a share that grows as fewer, larger micro-batches run: Qwen3-30B-A3B
    dp2 tp2 pp2 ep4 v3 on 8 H100 exposes 0.03 s at micro-batch 1 and 1.44 s at 64, so the largest
    micro-batch's floor was above a smaller one's whole step and the search pruned the fastest layout.
    Without the overlap the all-to-alls' latency amortises over larger micro-batches: that time falls."""
    return ep_comm_s if layout.moe_a2a_overlap else 0.0


# ---------------------------------------------------------------- the largest micro-batch and sequence


def bisect_largest(low: int, high: int, ok: Callable[[int], bool]) -> int:
    """The largest ``x`` in [low, high] for which ``ok`` holds, where ``ok`` holds up to a point and
    not after it, and holds at ``low`` (never asked: ``low`` may be a sentinel below the range, such
    as -1 for "none"). Every search of the estimator and the recommender bisects through here."""
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if ok(middle) else (low, middle - 1)
    return low


def bisect_smallest(low: int, high: int, ok: Callable[[int], bool]) -> int:
    """The smallest ``x`` in [low, high] for which ``ok`` holds, where ``ok`` fails up to a point and
    holds after it, and holds at ``high`` (never asked): ``bisect_largest`` on the mirrored range."""
    return -bisect_largest(-high, -low, lambda x: ok(-x))


def largest_satisfying(
    low: int, high: int, step: int, ok: Callable[[int], bool], guess: int | None = None
) -> int:
    """Largest multiple of ``step`` in [low, high] for which the monotone predicate ``ok`` holds, else 0.

    ``guess``: where the answer probably is. The search then gallops from it (steps of 1, 2, 4, ...
    multiples of ``step``, up while ``ok`` holds, down while it does not) to a bracket, and bisects
    that: about 2 log2(distance) calls instead of log2(high / step). Exact whatever the guess."""
    if high < low or not ok(low):
        return 0
    lo, hi = low // step, high // step  # ok(lo * step) holds; the answer is in [lo, hi]
    if guess is not None and lo < hi:
        at, width = min(max(guess // step, lo + 1), hi), 1
        if ok(at * step):
            lo = at
            while lo < hi:
                probe = min(hi, lo + width)
                if not ok(probe * step):
                    hi = probe - 1
                    break
                lo, width = probe, 2 * width
        else:
            hi = at - 1
            while lo < hi:
                probe = max(lo + 1, hi - width + 1)
                if ok(probe * step):
                    lo = probe
                    break
                hi, width = probe - 1, 2 * width
    return bisect_largest(lo, hi, lambda i: ok(i * step)) * step


def largest_fitting(
    job: Job,
    layouts: Callable[[int], Layout],
    count: int,
    limit_bytes: int,
    dynamic_factor: float = 1.0,
    *,
    known_fit: int = -1,
    peek: Callable[[int], Layout] | None = None,
    host_limit_bytes: int | None = None,
) -> int:
    """The index of the largest of ``count`` layouts ``layouts(0..count-1)`` (micro-batches in
    ascending order) that fits; -1 if none. ``known_fit``: an index already known to fit, so the
    search starts above it. ``peek``: builds a layout only to look at it (``layouts`` where None;
    a search counts the layouts it evaluates through ``layouts``).

    Memory grows with the micro-batch, by binary search, except at the last one when it is the
    step's only micro-batch and its gradients follow its activations
    (``memory.gradients_follow_activations``): then they never meet, and it may need less than the
    one before it. That one is tried first."""
    last = count - 1
    if last > known_fit and gradients_follow_activations(job, (peek or layouts)(last)):
        if fits(job, layouts(last), limit_bytes, dynamic_factor, host_limit_bytes):
            return last
        last -= 1
    return bisect_largest(
        known_fit, last, lambda i: fits(job, layouts(i), limit_bytes, dynamic_factor, host_limit_bytes)
    )


def max_micro_batch_size(
    job: Job, layout: Layout, dynamic_factor: float = 1.0, limit_bytes: int | None = None
) -> int:
    """Largest valid micro-batch that fits this layout within ``limit_bytes`` per GPU (default: the
    GPU's capacity); 0 if none does."""
    sizes = valid_micro_batch_sizes(job.training, layout)

    def with_size(i: int) -> Layout:
        return dataclasses.replace(layout, micro_batch_size=sizes[i], gradient_accumulation_steps=None)

    limit = job.cluster.gpu.memory_bytes if limit_bytes is None else limit_bytes
    found = largest_fitting(job, with_size, len(sizes), limit, dynamic_factor)
    return sizes[found] if found >= 0 else 0


MAX_SEQ_LEN_SEARCHED = 2**22  # 4M tokens: beyond any context length in the catalog


def max_seq_len(job: Job, layout: Layout, dynamic_factor: float = 1.0) -> int:
    """Largest sequence length that fits, a multiple of what the layout splits it by
    (``validate.sequence_divisor``); 0 if none does."""
    step = sequence_divisor(layout)

    def total_bytes(seq_len: int) -> int:
        training = dataclasses.replace(job.training, seq_len=seq_len)
        other = make_job(job.model, job.cluster, training, job.tuning)  # not shared: one-off
        return memory_numbers(other, layout, dynamic_factor)[0]

    def ok(seq_len: int) -> bool:
        training = dataclasses.replace(job.training, seq_len=seq_len)
        try:
            # the rules that read the sequence, which hold below a length (a window context parallelism
            # cannot cross under FSDP: Mistral's dp 4 cp 2 answered 162,248 tokens, refused past 4,096;
            # limits review)
            validate_layout(job.model, job.cluster, layout, training)
        except EstimatorError:
            return False
        other = make_job(job.model, job.cluster, training, job.tuning)  # not shared: one-off
        return fits(other, layout, dynamic_factor=dynamic_factor)

    # a learned position table has rows for so many positions: no longer sequence runs, whatever fits;
    # nor past the tokens per step the service plans for (an answered 1,630,208 was a 422 at the batch)
    table = learned_positions(job.model)
    top = MAX_SEQ_LEN_SEARCHED if table is None else min(table, MAX_SEQ_LEN_SEARCHED)
    top = min(top, MAX_TOKENS_PER_STEP.limit // job.training.global_batch_size)
    guess = _secant_root(total_bytes, job.cluster.gpu.memory_bytes, job.training.seq_len, step)
    return largest_satisfying(step, top, step, ok, None if guess is None else min(guess, top))


def _secant_root(f: Callable[[int], int], target: int, start: int, step: int, rounds: int = 3) -> int | None:
    """Where the increasing ``f`` reaches ``target``, by a few secant steps from ``start`` and twice
    it: a guess for ``largest_satisfying`` (memory grows about linearly in the sequence, quadratically
    only where attention scores are stored, so it lands within a few tokens). None if ``f`` is flat."""
    a, b = max(start, step), 2 * max(start, step)
    fa, fb = f(a), f(b)
    for _ in range(rounds):
        if fb == fa:
            return None
        c = b + round((target - fb) * (b - a) / (fb - fa))
        c = min(max(c, step), MAX_SEQ_LEN_SEARCHED)
        if c == b:
            break
        a, fa, b, fb = b, fb, c, f(c)
    return b
