"""Objectives, and the rationale of a ranking in words and numbers.

Each objective turns (GPUs, tokens/s) into a sort key, smaller first, and a score to report:
throughput and time to train rank by tokens/s (Narayanan et al. arXiv:2104.04473 Eq. 4: time =
tokens / throughput), fewest GPUs by the count then tokens/s, cost by GPU-hours (x price) per token.
"""

from __future__ import annotations

from typing import Protocol

from service.estimator.comm import expert_stride, group_strides, link_for_group
from service.estimator.model_states import (
    hsdp_replicas,
    megatron_fused_adam_on_gpu,
    megatron_master_remainders,
    shard_degrees,
)
from service.estimator.step_time import gpu_hours, time_to_train_s
from service.estimator.types import (
    ClusterSpec,
    Compile,
    Estimate,
    Framework,
    Layout,
    Offload,
    Recompute,
    TrainingSpec,
)
from service.estimator.validate import FRAMEWORK_CAPABILITIES
from service.recommender.space import RECOMPUTE_COST_ORDER
from service.recommender.types import Constraints, Objective

GiB = 2**30


def gib_needed(n_bytes: float) -> int:
    """A need in whole GiB, rounded up: a node given the figure said holds it (a suggestion of "40 GiB
    host RAM per node" for 40.3 did not fit once applied; PEFT review)."""
    return -(-int(n_bytes) // GiB)


# Differences below this share of the step or of tokens/s are within the model's own noise.
TIE_FRACTION = 0.005
# A gain in the objective smaller than this share of tokens/s does not buy a model-parallel degree
# (pipeline, context, tensor or expert parallelism): the simplest of the layouts within it is
# recommended (``near_tie_winner``). The efficiencies the step time is built from are stated to two
# significant figures (tuning.toml: compute 0.65, GEMM factors 0.55-0.97, bus 0.8 and 0.9), so
# half a unit in their last place is 0.5-0.9% of the time each prices: a gain under 1% is within
# what the inputs state, and a layout with one more way to fail (a pipeline's schedule, its stage
# balance) is no better for it.
NEAR_TIE_FRACTION = 0.01


def sort_key(objective: Objective, layout: Layout, tokens_per_s: float) -> tuple[float, ...]:
    """Smaller is better. Throughput equal to 4 significant digits goes to the simpler layout."""
    return (*primary_key(objective, layout.world_size, tokens_per_s), *simplicity(layout))


def primary_key(objective: Objective, gpus: int, tokens_per_s: float) -> tuple[float, float]:
    """The objective's part of ``sort_key``: never larger for more tokens/s on the same GPUs."""
    rounded = float(f"{tokens_per_s:.4g}")
    if objective is Objective.FEWEST_GPUS:
        return (gpus, -rounded)
    if objective is Objective.COST:
        return (float(f"{gpus / tokens_per_s:.4g}"), -rounded)
    return (-rounded, gpus)


def hopeful_key(objective: Objective, gpus: int, tokens_per_s: float) -> tuple[float, float]:
    """``primary_key`` of a layout ``NEAR_TIE_FRACTION`` faster: where it is no larger than the
    k-th best's, the layout may still be recommended (a near tie with fewer model-parallel
    degrees), so the search must not prune it."""
    return primary_key(objective, gpus, tokens_per_s * (1 + NEAR_TIE_FRACTION))


class Degrees(Protocol):
    """A layout or a search structure: what ``parallel_degrees`` reads."""

    @property
    def pp(self) -> int: ...
    @property
    def cp(self) -> int: ...
    @property
    def tp(self) -> int: ...
    @property
    def ep(self) -> int: ...


def parallel_degrees(split: Degrees) -> tuple[int, int, int, int]:
    """The model-parallel degrees of a layout or a search structure, in ``simplicity``'s order:
    pipeline, context, tensor, expert."""
    return (split.pp, split.cp, split.tp, split.ep)


def near_tie(
    objective: Objective, layout: Layout, tokens_per_s: float, best: Layout, best_tokens_per_s: float
) -> bool:
    """Whether ``layout`` is within ``NEAR_TIE_FRACTION`` of ``best`` on the objective, on as many GPUs."""
    return layout.world_size == best.world_size and hopeful_key(
        objective, layout.world_size, tokens_per_s
    ) <= primary_key(objective, best.world_size, best_tokens_per_s)


def near_tie_winner(objective: Objective, ranked: list[tuple[Layout, float]]) -> int:
    """The index in ``ranked`` (best first by ``sort_key``) of the layout to recommend: of those
    within ``NEAR_TIE_FRACTION`` of the first on the objective (as many GPUs), the one whose
    model-parallel degrees (``parallel_degrees``: pp, cp, tp, ep) are lexicographically smallest (no
    pipeline before narrower TP), the better ranked among equals. Only the
    degrees decide: ZeRO stage, recompute and micro-batch stay the objective's. ``ranked`` is not
    empty."""
    best, best_tokens_per_s = ranked[0]
    tied = [
        i for i, (layout, tokens_per_s) in enumerate(ranked)
        if near_tie(objective, layout, tokens_per_s, best, best_tokens_per_s)
    ]  # fmt: skip
    return min(tied, key=lambda i: (parallel_degrees(ranked[i][0]), i))


def recompute_words(layout: Layout) -> str:
    """The recompute policy: its name, and how many layers of each stage when not all."""
    n, every = layout.recompute_num_layers, layout.recompute_every_n_layers
    if layout.recompute_modules is not None:
        return f"{layout.recompute.value} ({', '.join(module.value for module in layout.recompute_modules)})"
    if every is not None:
        return f"{layout.recompute.value} (every {every}th layer)"
    if n is None:
        return layout.recompute.value
    return f"{layout.recompute.value} ({n} layer{'s' if n > 1 else ''} of each stage)"


def simplicity(layout: Layout) -> tuple[int, ...]:
    """Fewer moving parts first: no pipeline, no CP, narrow TP, no offload (nor a chunked loss, which
    one launcher runs), low ZeRO stage, no recompute."""
    offload = (
        int(layout.offload_optimizer is not Offload.NONE)
        + int(layout.offload_params is not Offload.NONE)
        + int(layout.chunked_loss)
    )
    recompute = RECOMPUTE_COST_ORDER.index(layout.recompute)
    return (
        layout.pp,
        layout.cp,
        layout.tp,
        layout.ep,
        offload,
        layout.virtual_pipeline_stages,
        layout.zero_stage,
        recompute,
    )


def gpu_hours_per_million_tokens(tokens_per_s: float, gpus: int) -> float:
    """GPU-hours a million tokens take on ``gpus`` GPUs at ``tokens_per_s``: what objective cost ranks
    by (times the price), and what its rationale compares."""
    return gpu_hours(1e6 / tokens_per_s, gpus)


def score(constraints: Constraints, gpus: int, tokens_per_s: float, training: TrainingSpec) -> float:
    """The objective's value: tokens/s, GPUs, price (or GPU-hours) per million tokens, or seconds (the
    whole steps of ``training.tokens``, as the estimate's time to train)."""
    objective = constraints.objective
    if objective is Objective.FEWEST_GPUS:
        return float(gpus)
    if objective is Objective.COST:
        per_million = gpu_hours_per_million_tokens(tokens_per_s, gpus)
        # the price as given, 0 too (a free cluster's score is 0, as documented); GPU-hours without one
        price = constraints.gpu_hour_cost
        return per_million * (1.0 if price is None else price)
    if objective is Objective.TIME_TO_TRAIN and training.tokens:
        return time_to_train_s(training.tokens, training.tokens_per_step, tokens_per_s)
    return tokens_per_s


def describe(layout: Layout) -> str:
    """One line: framework and every parallel degree that is not 1."""
    parts = [layout.framework.value, f"dp={layout.dp}"]
    parts += [f"{name}={value}" for name, value in (("tp", layout.tp), ("pp", layout.pp)) if value > 1]
    parts += [f"{name}={value}" for name, value in (("cp", layout.cp), ("ep", layout.ep)) if value > 1]
    if layout.etp is not None:
        parts.append(f"etp={layout.etp}")
    if layout.virtual_pipeline_stages > 1:
        parts.append(f"v={layout.virtual_pipeline_stages}")
    parts.append(f"zero={layout.zero_stage}")
    if layout.offload_optimizer is not Offload.NONE:
        parts.append(f"offload_optimizer={layout.offload_optimizer.value}")
    if layout.offload_params is not Offload.NONE:
        parts.append(f"offload_params={layout.offload_params.value}")
    parts += [f"recompute={recompute_words(layout)}", f"micro_batch={layout.micro_batch_size}"]
    if layout.torch_compile is not Compile.NONE:
        parts.append(f"torch_compile={layout.torch_compile.value}")
    if layout.chunked_loss:
        parts.append("chunked_loss")
    if layout.moe_a2a_overlap:
        parts.append("a2a_overlap")
    return " ".join(parts)


def _sharding_words(layout: Layout, cluster: ClusterSpec, training: TrainingSpec | None) -> str:
    shards = layout.dp * layout.cp
    offload = [
        f"{what} offloaded to {device.value}"
        for what, device in (("optimizer", layout.offload_optimizer), ("parameters", layout.offload_params))
        if device is not Offload.NONE
    ]
    tail = f"; {', '.join(offload)}" if offload else ""
    if layout.zero_stage == 0:
        return "no ZeRO sharding (model states replicated)" + tail
    if layout.framework is Framework.MEGATRON:
        kept = ""
        if training is not None and megatron_fused_adam_on_gpu(layout, training):
            master = "a 2-byte master" if megatron_master_remainders(layout, training) else "its fp32 master"
            kept = f" (precision-aware: {master}, no fp32 copy of the grads)"
        dense, experts = shard_degrees(layout, cluster)
        # the experts' states shard over their own data parallelism (Megatron's expert grid)
        routed = f"; the experts' over their data parallelism, {experts}" if layout.ep > 1 else ""
        if dense == 1:
            unsharded = "dense states unsharded" if layout.ep > 1 else "sharding nothing"
            return f"distributed optimizer on one data-parallel rank, {unsharded}{routed}{kept}" + tail
        return f"distributed optimizer shards optimizer states over dp x cp = {shards}{routed}{kept}" + tail
    if layout.framework is Framework.FSDP:
        mode = "FULL_SHARD" if layout.zero_stage == 3 else "SHARD_GRAD_OP"
        replicas = hsdp_replicas(layout, cluster)
        if replicas > 1:
            inside = shard_degrees(layout, cluster)[0]
            return f"FSDP {mode} (HSDP) over {inside} ranks, {replicas} replicas of them" + tail
        return f"FSDP {mode} over {shards} ranks" + tail
    return f"ZeRO-{layout.zero_stage} over {shards} ranks" + tail


def _biggest_overhead(estimate: Estimate) -> str:
    assert estimate.time is not None
    b = estimate.time.breakdown
    step = b.step_s
    parts = {
        "recompute": b.recompute_s,
        "TP communication": b.tp_comm_s,
        "CP communication": b.cp_comm_s,
        "EP all-to-all": b.ep_comm_s,
        "pipeline bubble": b.pp_bubble_s,
        "pipeline p2p": b.pp_comm_s,
        "exposed DP communication": b.dp_comm_exposed_s,
        "offload traffic": b.offload_s,
        "optimizer step": b.optimizer_s,
    }
    name, seconds = max(parts.items(), key=lambda kv: kv[1])
    if seconds < TIE_FRACTION * step:
        return f"compute-bound: {b.compute_s / step:.1%} of the {step:.3g} s step is forward and backward"
    return (
        f"limited by {name}: {seconds / step:.1%} of the {step:.3g} s step (compute {b.compute_s / step:.0%})"
    )


def _spans_nodes(cluster: ClusterSpec, size: int, stride: int) -> bool:
    return link_for_group(cluster, size, stride).spans_nodes


def rationale(
    layout: Layout,
    estimate: Estimate,
    cluster: ClusterSpec,
    runner_up: tuple[Layout, Estimate] | None,
    fits_without_pp: bool,
    gpu_use: str,
    largest_micro_batch: int | None = None,
    batch_cap: int | None = None,
    objective: Objective = Objective.THROUGHPUT,
    training: TrainingSpec | None = None,
) -> tuple[str, ...]:
    """Why this layout wins and what limits it, each line with its numbers; every claim about the
    layout is read from its fields and the cluster (tests/recommender/test_rationale.py checks them).
    ``largest_micro_batch``: the largest that fits within the plan's headroom (default: the
    estimate's limit, against the whole card); ``batch_cap``: the largest micro-batch the global
    batch allows the layout at all, which, when that one fits, is what bounds it, not memory;
    ``objective``: what it was ranked by, in whose terms it is compared with the next; ``training``:
    what the layout trains (Megatron's optimizer under it)."""
    assert estimate.time is not None
    t = estimate.time
    strides = group_strides(layout)
    gpus_per_node = cluster.gpus_per_node
    lines = [f"{t.tokens_per_s:,.0f} tokens/s, {t.tflops_per_gpu:.0f} TFLOP/s per GPU, MFU {t.mfu:.1%}"]
    lines.append(gpu_use)
    other_gpus = runner_up[0].world_size if runner_up is not None else layout.world_size
    if runner_up is not None and runner_up[1].time is not None and other_gpus != layout.world_size:
        # on other GPU counts the objective is not tokens/s: a cost plan "tied within 0.5% of tokens/s"
        # with a runner-up twice as fast on twice the GPUs (cost review)
        lines.append(_compared_across_counts(objective, layout, t.tokens_per_s, runner_up))
    elif runner_up is not None and runner_up[1].time is not None:
        gain = t.tokens_per_s / runner_up[1].time.tokens_per_s - 1
        if gain < 0 and _simpler_near_tie(layout, runner_up[0]):  # near_tie_winner put it first
            # on as many GPUs, faster is as much cheaper per token and shorter to train: said in the
            # objective's terms where it is one of those (cost review: a 15T-token run's 1% is 45 days)
            # gain = ours / theirs - 1 < 0: theirs is 1 / (1 + gain) - 1 faster and saves -gain of the
            # GPU-hours and the time (review of this stop: the two were swapped, a third figure printed)
            faster, saving = 1 / (1 + gain) - 1, -gain
            terms = {
                Objective.COST: f" ({saving:.1%} fewer GPU-hours per token)",
                Objective.TIME_TO_TRAIN: f" ({saving:.1%} less time to train)",
            }.get(objective, "")
            lines.append(
                f"the next ({describe(runner_up[0])}) is {faster:.1%} faster{terms}: a gain under "
                f"{NEAR_TIE_FRACTION:.0%} (what the estimate's two-figure efficiencies resolve) does not buy "
                f"a model-parallel degree, and this layout's are lower, compared in order (pp, cp, tp, ep: "
                f"{', '.join(map(str, parallel_degrees(layout)))} against "
                f"{', '.join(map(str, parallel_degrees(runner_up[0])))})"
            )
        elif gain < TIE_FRACTION:
            lines.append(
                f"ties with the next ({describe(runner_up[0])}): within {TIE_FRACTION:.1%} of tokens/s, "
                "below what the model resolves; either is a good choice"
            )
        else:
            lines.append(f"tokens/s {gain:.1%} higher than the next ({describe(runner_up[0])})")
    if layout.tp > 1:
        where = "ACROSS nodes" if _spans_nodes(cluster, layout.tp, strides.tp) else "inside the node"
        sp = "on" if layout.sequence_parallel else "off"
        # a job on part of one node runs on a sub-cluster as large as itself: its node size is not the
        # cluster's ("TP=2 inside the node (2 GPUs per node)" on nodes of 8: cost review)
        per_node = f" ({gpus_per_node} GPUs per node)" if cluster.num_nodes > 1 else ""
        lines.append(f"TP={layout.tp} {where}{per_node}, sequence parallel {sp}")
    else:
        lines.append("TP=1: the model fits without tensor parallelism")
    if layout.cp > 1:
        where = "across nodes" if _spans_nodes(cluster, layout.cp, strides.cp) else "inside the node"
        how = (
            "Ulysses: all-to-alls regroup it by heads for attention"
            if FRAMEWORK_CAPABILITIES[layout.framework].ulysses_context_parallel
            else "ring attention"
        )
        lines.append(f"CP={layout.cp} {where}: each rank holds 1/{layout.cp} of the sequence ({how})")
    if layout.ep > 1:
        where = (
            "across nodes" if _spans_nodes(cluster, layout.ep, expert_stride(layout)) else "inside the node"
        )
        split = {None: "", 1: ", each expert whole (etp=1, not split over tp)"}.get(
            layout.etp, f", each split over etp={layout.etp} ranks"
        )
        overlap = (
            "; its all-to-alls run under another micro-batch's compute (--overlap-moe-expert-parallel-comm, "
            f"{t.breakdown.ep_comm_s / t.step_s:.1%} of the step left exposed)"
            if layout.moe_a2a_overlap
            else ""
        )
        lines.append(
            f"EP={layout.ep} {where}: each rank holds 1/{layout.ep} of the routed experts{split}{overlap}"
        )
    if layout.pp > 1:
        bubble = t.breakdown.pp_bubble_s / t.step_s
        why = "" if not fits_without_pp else " (a layout without PP also fits, but is slower)"
        where = "across nodes" if _spans_nodes(cluster, layout.pp, strides.pp) else "inside the node"
        lines.append(
            f"PP={layout.pp} {where}, v={layout.virtual_pipeline_stages}: bubble {bubble:.1%} of step{why}"
        )
    else:
        lines.append("PP=1: no pipeline bubble")
    if layout.dp > 1:
        # which link the data-parallel group's reductions cross, as TP's, CP's and PP's lines say theirs
        # (a 16-rank reduce-scatter over a 3.125 GB/s network went unnamed: network review)
        network = cluster.inter_node_bandwidth_bytes_per_s / 1e9
        on = (
            f"across nodes, over the network ({network:,.4g} GB/s per GPU)"
            if _spans_nodes(cluster, layout.dp, strides.dp)
            else "inside the node"
        )
        lines.append(f"DP={layout.dp} {on}: the gradients' reduction (and the shards' gathers) run there")
    lines.append(_sharding_words(layout, cluster, training))
    largest = estimate.max_micro_batch_size if largest_micro_batch is None else largest_micro_batch
    # within the plan's headroom where the search chose it so: beside limits.max_micro_batch_size (the
    # whole card's) "largest that fits: 2" read as a contradiction of its 4 (consistency review)
    within = (
        " within the plan's headroom"
        if largest_micro_batch is not None and largest_micro_batch != estimate.max_micro_batch_size
        else ""
    )
    bound = (
        f"the largest the global batch allows, {largest}, fits{within}"
        if largest is not None and largest == batch_cap
        else f"largest that fits{within}: {largest}"
    )  # "largest that fits: 16" read as memory's limit where 16 sequences were each rank's whole batch
    lines.append(
        f"micro-batch {layout.micro_batch_size} ({bound}), recompute {recompute_words(layout)}"
        + ("" if layout.recompute is Recompute.NONE else " to fit activations")
    )
    memory = estimate.memory
    lines.append(
        f"{memory.per_gpu.total / GiB:.1f} GiB of {memory.capacity_bytes / GiB:.1f} GiB per GPU: "
        f"{memory.headroom_bytes / GiB:.1f} GiB headroom "
        f"({memory.headroom_bytes / memory.capacity_bytes:.0%})"
    )
    if memory.cpu_per_node_bytes:
        lines.append(f"offload needs {gib_needed(memory.cpu_per_node_bytes)} GiB host RAM per node")
    if layout.chunked_loss:
        lines.append(
            "chunked loss (torchtitan's ChunkedLossWrapper): the logits an eighth of the sequence at a time, "
            "to fit; only the torchtitan launcher runs it"
        )
    if layout.torch_compile is not Compile.NONE:
        loss = " and the loss (no fp32 logits)" if layout.torch_compile is Compile.MODEL_AND_LOSS else ""
        lines.append(f"torch.compile: inductor fuses the pointwise ops between the GEMMs{loss}")
    lines.append(_biggest_overhead(estimate))
    return tuple(lines)


def _compared_across_counts(
    objective: Objective, layout: Layout, tokens_per_s: float, runner_up: tuple[Layout, Estimate]
) -> str:
    """The recommended layout against a runner-up on another GPU count, in the objective's terms:
    GPU-hours per token for cost, GPUs for fewest GPUs, tokens/s for throughput and time to train
    (the same GPUs' cost, and the time at any token count, are in proportion to it)."""
    other, estimate = runner_up
    assert estimate.time is not None
    other_tokens_per_s, next_one = (
        estimate.time.tokens_per_s,
        f"the next ({describe(other)}, {other.world_size:,} GPUs)",
    )
    gpus, other_gpus = layout.world_size, other.world_size
    # where the next does better on the objective (a calibrated plan keeps the search's GPU count:
    # planning.calibrated.ranked_again), it is said so, never as a tie (review of this stop)
    kept = "; the plan keeps the GPU count the search chose, before this hardware's runs were applied"
    if objective is Objective.FEWEST_GPUS:
        if other_gpus < gpus:
            return f"{next_one} uses fewer GPUs{kept}"
        return f"{gpus:,} GPUs, fewer than {next_one}"
    if objective is Objective.COST:
        per_million = gpu_hours_per_million_tokens(tokens_per_s, gpus)
        other_per_million = gpu_hours_per_million_tokens(other_tokens_per_s, other_gpus)
        saving = 1 - per_million / other_per_million
        said = f"{per_million:.4g} GPU-hours per million tokens against {other_per_million:.4g}"
        if abs(saving) < TIE_FRACTION:
            return (
                f"ties on cost with {next_one}: {said}, within {TIE_FRACTION:.1%}, below what the model "
                "resolves; either is a good choice"
            )
        if saving < 0:
            fewer = 1 - other_per_million / per_million
            return f"{next_one} takes {fewer:.1%} fewer GPU-hours per token ({said}){kept}"
        return f"GPU-hours per token {saving:.1%} fewer than {next_one}: {said}"
    gain = tokens_per_s / other_tokens_per_s - 1
    if abs(gain) < TIE_FRACTION:
        return (
            f"ties with {next_one}: within {TIE_FRACTION:.1%} of tokens/s, below what the model resolves; "
            "either is a good choice"
        )
    if gain < 0:
        return f"{next_one} is {1 / (1 + gain) - 1:.1%} faster{kept}"
    return f"tokens/s {gain:.1%} higher than {next_one}"


def _simpler_near_tie(chosen: Layout, faster: Layout) -> bool:
    """Whether ``chosen`` can have been put before the faster layout by ``near_tie_winner``: as many
    GPUs, fewer model-parallel degrees (else the objective ranks it first: fewer GPUs, cost)."""
    return chosen.world_size == faster.world_size and parallel_degrees(chosen) < parallel_degrees(faster)


def alternative_rationale(
    layout: Layout,
    estimate: Estimate,
    best_layout: Layout,
    best: Estimate,
    objective: Objective = Objective.THROUGHPUT,
) -> tuple[str, ...]:
    """How an alternative compares with the recommended layout: in tokens/s, and on another GPU count
    under objective cost in GPU-hours per token too (a cost plan's alternative read "98.9% above the
    recommended" on twice the GPUs: review of this stop)."""
    assert estimate.time is not None and best.time is not None
    slower = 1 - estimate.time.tokens_per_s / best.time.tokens_per_s
    headroom = estimate.memory.headroom_bytes / GiB
    if layout.world_size != best_layout.world_size and objective is Objective.COST:
        ours = gpu_hours_per_million_tokens(estimate.time.tokens_per_s, layout.world_size)
        theirs = gpu_hours_per_million_tokens(best.time.tokens_per_s, best_layout.world_size)
        more = ours / theirs - 1
        how = f"{more:.1%} more" if more >= 0 else f"{-more:.1%} fewer"
        return (
            f"{estimate.time.tokens_per_s:,.0f} tokens/s on {layout.world_size:,} GPUs: {ours:.4g} GPU-hours "
            f"per million tokens, {how} than the recommended; {headroom:.1f} GiB headroom",
            _biggest_overhead(estimate),
        )
    if slower >= 0:
        compared = f"{slower:.1%} below the recommended"
    elif _simpler_near_tie(best_layout, layout):
        compared = (
            f"{-slower:.1%} above the recommended, which has fewer model-parallel degrees: a gain "
            f"under {NEAR_TIE_FRACTION:.0%} does not buy one"
        )
    else:
        compared = f"{-slower:.1%} above the recommended"
    return (
        f"{estimate.time.tokens_per_s:,.0f} tokens/s ({compared}), {headroom:.1f} GiB headroom",
        _biggest_overhead(estimate),
    )
