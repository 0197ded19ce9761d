"""Capacity planning: for a model and a token budget, how many GPUs of each type, and how long.

For each GPU type of the catalog (or each cluster given), the fewest GPUs, in whole nodes, for
which a layout fits (``suggest.fewest_gpus``), then the time and cost to train ``training.tokens``
at the best layout on that many GPUs, or on ``at_gpus`` GPUs when asked (a stored cluster cannot grow:
``at_gpus`` is capped at its size). Training time is tokens / throughput (Narayanan et al.
arXiv:2104.04473 Eq. 4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from service.estimator.caveats import gpu_chip_warnings
from service.estimator.comm import link_default_notes
from service.estimator.defaults import chosen_defaults, for_gpu
from service.estimator.job import shared_memory_memos
from service.estimator.step_time import gpu_hours, time_to_train_s
from service.estimator.tuning import Tuning
from service.estimator.types import ClusterSpec, GPUSpec, Layout, ModelSpec, TrainingSpec
from service.estimator.validate import checkpoint_hardware_violation, divisors, hardware_violation
from service.recommender.budget import Budget
from service.recommender.collector import fewer_collections
from service.recommender.space import sub_cluster
from service.recommender.suggest import (
    PCIE_NODE_BYTES_PER_S,
    SUGGESTION_EVALUATIONS,
    budget_words,
    data_parallel_ceiling,
    fewest_gpus,
    fsdp1_qlora_unfit,
    node_ladder,
    reference_network_bytes_per_s,
    reference_node_gpus,
    states_unfit,
    with_gpu,
)
from service.recommender.types import Constraints, Objective


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityOption:
    gpu: str
    # None: unknown, its share of the request's budget ran out before a fit was found (told "false", a
    # client reading the boolean took the GPU type for one that cannot run the job: hostile review)
    fits: bool | None
    min_gpus: int | None = None
    min_nodes: int | None = None
    gpus_per_node: int | None = None  # the nodes it was placed in
    # the network between them, where its GPUs span nodes (the cluster's, or the part's reference)
    inter_node_bandwidth_bytes_per_s: float | None = None
    layout: Layout | None = None  # the fastest layout on min_gpus (or on the cluster given)
    num_gpus: int | None = None  # where the time below was computed
    tokens_per_s: float | None = None
    time_to_train_s: float | None = None
    gpu_hours: float | None = None
    cost: float | None = None  # gpu_hours x the hourly price, when one is known
    note: str = ""
    evaluations: int = 0  # layout evaluations spent on this option (of the request's budget)
    truncated: bool = False  # its share of the request's budget ran out before the search ended
    source: int = 0  # the index of its cluster (or GPU type) among those given


def default_cluster(gpu: GPUSpec, num_nodes: int = 1, gpus_per_node: int | None = None) -> ClusterSpec:
    """Nodes of ``gpus_per_node`` GPUs (default: the part's reference node, ``suggest.
    reference_node_gpus``) on its own NVLink/PCIe, on the GPU's reference network between nodes
    (``suggest.reference_network_bytes_per_s``)."""
    return ClusterSpec(
        gpu=gpu,
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node or reference_node_gpus(gpu),
        intra_node_bandwidth_bytes_per_s=gpu.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=reference_network_bytes_per_s(gpu),
    )


def _within_node(gpus_per_node: int) -> tuple[int, ...]:
    """The counts below one node a capacity climb tries: every divisor of the node, as a plan's
    search does (``space.gpu_counts``; 1, 2 and 4 alone reported 12 for a job that fits on 6 of a
    12-GPU node)."""
    return tuple(d for d in divisors(gpus_per_node) if d < gpus_per_node)


def _option(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
    counts: tuple[int, ...],
    price: float | None,
    at_gpus: int | None,
    budget: Budget,
    notes: tuple[str, ...] = (),
) -> CapacityOption:
    """The option of one GPU type or cluster, within its share of the request's budget."""
    from service.recommender import recommend

    name = cluster.gpu.name
    cap = constraints.max_gpus
    if cap is not None:  # the counts within the request's cap, and an option past it says so
        within = tuple(count for count in counts if count <= cap)
        # the cap's own whole nodes, where the ladder steps past it (a cap of 21 nodes between the
        # steps 18 and 24 answered "no fit up to 18 nodes" where 21 fit; stop 44 review), so that the
        # fewest GPUs are bisected up to it
        top = cap // cluster.gpus_per_node * cluster.gpus_per_node
        if within and within[-1] < top <= counts[-1] and top >= cluster.gpus_per_node:
            within = (*within, top)  # (never past the counts the option may use: its cluster, max_nodes)
        if cap < cluster.gpus_per_node and cap not in within and cap <= counts[-1]:
            # a cap inside one node is a count of its own, as a plan's (space.gpu_counts: 6 of an
            # 8-GPU node answered "no fit" where a fewest-GPU plan fits 6; change review)
            within = tuple(sorted((*within, cap)))
        if not within:
            return CapacityOption(
                gpu=name,
                fits=False,
                note=f"constraints.max_gpus {cap:,} is fewer than the {min(counts):,} GPUs searched first",
            )
        counts = within
    if (stored := checkpoint_hardware_violation(model, cluster.gpu)) is not None:
        # no precision runs a stored 4-bit checkpoint's compute dtype here: its own reason, not "ask for
        # another precision", which the checkpoint refuses (change review)
        return CapacityOption(gpu=name, fits=False, note=stored.message)
    training = for_gpu(training, cluster.gpu, model)
    unrunnable = hardware_violation(cluster, training)
    if unrunnable is not None:  # say why, rather than "nothing fits"
        return CapacityOption(
            gpu=name, fits=False, note=f"{unrunnable.message}: ask for another {unrunnable.field}"
        )
    chosen = chosen_defaults(training)
    if chosen:
        notes = (*notes, "defaults for this GPU: " + ", ".join(f"{k} {v}" for k, v in chosen.items()))
    notes = (*notes, *link_default_notes(cluster))  # a custom GPU's links it left out, as assumed
    notes = (*notes, *gpu_chip_warnings(cluster.gpu, tuning))  # a custom GPU's efficiency, as a plan says
    notes = (*notes, *cluster.gpu.notes)  # and its figures that look mistaken
    unfit = states_unfit(model, cluster, training, tuning, constraints, max(counts))
    if unfit is not None:
        capped = f" (constraints.max_gpus {cap:,})" if cap is not None else ""
        return CapacityOption(gpu=name, fits=False, note=unfit + capped)
    fewest = fewest_gpus(model, cluster, training, constraints, tuning, counts, budget)
    spent, truncated = fewest.evaluations, fewest.truncated
    if fewest.found is None:
        why = (
            f"the request's {budget_words(budget)} ran out ({spent:,} layouts evaluated for this GPU) "
            "before a fit"
            if truncated
            else fewest.unfit
            or fsdp1_qlora_unfit(model, cluster, training, constraints, max(counts))
            or data_parallel_ceiling(model, cluster, training, constraints, max(counts))
            or f"no layout fits up to {max(counts)} GPUs"
            + (f" (constraints.max_gpus {cap:,})" if cap is not None else "")
        )
        fits = None if truncated else False
        return CapacityOption(gpu=name, fits=fits, note=why, evaluations=spent, truncated=truncated)
    gpus, tokens_per_s, layout = fewest.found
    gpn = cluster.gpus_per_node
    nodes = max(1, gpus // gpn)
    said = list(notes)
    run_gpus = gpus
    if at_gpus is not None and at_gpus < gpus:
        said.append(f"asked for {at_gpus:,} GPUs; no layout fits fewer than {gpus:,}: timed on {gpus:,}")
    elif at_gpus is not None and at_gpus > gpn and at_gpus % gpn:
        # the option's GPUs are whole nodes of gpus_per_node (a part of one node below it)
        run_gpus = max(gpus, at_gpus // gpn * gpn)
        said.append(
            # (below one node, a part of one: sub_cluster; past it, the whole nodes the count fills: FinOps
            # review read "whole nodes" beside 3 GPUs timed as 3)
            f"asked for {at_gpus:,} GPUs; past one node this option places whole nodes of {gpn}, as many as "
            f"the count fills: timed on {run_gpus:,}"
        )
    elif at_gpus is not None:
        run_gpus = at_gpus
    if run_gpus != gpus:
        # a part of one node where fewer GPUs than a node are asked (sub_cluster), else whole nodes
        target = sub_cluster(cluster, run_gpus)
        fastest = dataclasses.replace(constraints, top_k=1, objective=Objective.THROUGHPUT)
        best = recommend(model, target, training, fastest, tuning, with_suggestions=False, budget=budget)
        spent += best.search.memory_evaluations + best.search.time_evaluations
        truncated |= best.search.truncated
        if best.recommended is not None and best.recommended.estimate.time is not None:
            layout, tokens_per_s = best.recommended.layout, best.recommended.estimate.time.tokens_per_s
            if layout.world_size < run_gpus:  # the num_gpus answered is not the count asked: say why
                found_on = layout.world_size
                said.append(
                    f"on {run_gpus:,} GPUs the fastest layout found uses {found_on:,}, timed on those"
                )
        else:
            # keep GPU count and throughput from the same layout: the one found on min_gpus
            said.append(f"no layout found on {run_gpus} GPUs; time is for the {layout.world_size}-GPU layout")
        run_gpus = layout.world_size
    if truncated:
        said.append(f"the request's {budget_words(budget)} cut this search: its layout is the best it found")
    seconds = (
        time_to_train_s(training.tokens, training.tokens_per_step, tokens_per_s) if training.tokens else None
    )
    hours = gpu_hours(seconds, run_gpus) if seconds is not None else None
    spans = max(gpus, run_gpus) > cluster.gpus_per_node
    return CapacityOption(
        gpu=name,
        fits=True,
        min_gpus=gpus,
        min_nodes=nodes,
        gpus_per_node=cluster.gpus_per_node,
        inter_node_bandwidth_bytes_per_s=cluster.inter_node_bandwidth_bytes_per_s if spans else None,
        layout=layout,
        num_gpus=run_gpus,
        tokens_per_s=tokens_per_s,
        time_to_train_s=seconds,
        gpu_hours=hours,
        cost=hours * price if hours is not None and price is not None else None,
        note="; ".join(said),
        evaluations=spent,
        truncated=truncated,
    )


def capacity(
    model: ModelSpec,
    training: TrainingSpec,
    tuning: Tuning,
    *,
    gpus: Iterable[GPUSpec] = (),
    clusters: Iterable[ClusterSpec] = (),
    constraints: Constraints | None = None,
    gpus_per_node: int | None = None,
    max_nodes: int = 4096,
    at_gpus: int | None = None,
    gpu_hour_cost: Mapping[str, float] | None = None,
    budget: Budget | None = None,
) -> tuple[CapacityOption, ...]:
    """One option per GPU type (default: the catalog) or per stored cluster, sorted by time to train.

    The whole request searches within ``budget`` (default: ``constraints.max_evaluations`` layout
    evaluations), as one plan does: each GPU type or cluster, in turn, gets an equal share of what
    is left (what one leaves unused goes to the ones after it), and an option whose share ran out
    says so."""
    # every GPU type searches the same layouts of the model: their memory is computed once
    with shared_memory_memos(), fewer_collections():
        return _capacity(
            model, training, tuning, gpus, clusters, constraints, gpus_per_node, max_nodes, at_gpus,
            gpu_hour_cost, budget,
        )  # fmt: skip


def _capacity(
    model: ModelSpec,
    training: TrainingSpec,
    tuning: Tuning,
    gpus: Iterable[GPUSpec],
    clusters: Iterable[ClusterSpec],
    constraints: Constraints | None,
    gpus_per_node: int | None,
    max_nodes: int,
    at_gpus: int | None,
    gpu_hour_cost: Mapping[str, float] | None,
    budget: Budget | None,
) -> tuple[CapacityOption, ...]:
    constraints = constraints or Constraints(objective=Objective.FEWEST_GPUS)
    budget = budget or Budget(constraints.max_evaluations)
    prices = gpu_hour_cost or {}
    options: list[CapacityOption] = []
    cluster_list = list(clusters)
    specs = [] if cluster_list else list(gpus)
    if not cluster_list and not specs:
        from service.catalog.gpus import gpus as catalog

        specs = list(catalog().values())
    sources = len(cluster_list) or len(specs)

    def share() -> Budget:
        return budget.share(SUGGESTION_EVALUATIONS, parts=sources - len(options))

    for index, cluster in enumerate(cluster_list):
        first = dataclasses.replace(cluster, num_nodes=1)
        counts = node_ladder(first, 1, top_nodes=cluster.num_nodes)
        counts = _within_node(cluster.gpus_per_node) + counts
        price = prices.get(cluster.gpu.name, constraints.gpu_hour_cost)
        # a stored cluster cannot grow: at most its own GPUs
        asked = at_gpus or cluster.world_size
        run_at = min(asked, cluster.world_size)
        clamped = (
            (f"asked for {asked} GPUs; the stored cluster has {cluster.world_size}, timed on those",)
            if asked > cluster.world_size
            else ()
        )
        found = _option(
            model, cluster, training, constraints, tuning, counts, price, run_at, share(), clamped
        )
        options.append(dataclasses.replace(found, source=index))
    # the largest cards first: the request's time goes where a large job can fit, and a cut
    # (an option that says its budget ran out) falls on the cards that would need the most of them
    for index, gpu in sorted(enumerate(specs), key=lambda pair: -pair[1].memory_bytes):
        cluster = default_cluster(gpu, max_nodes, gpus_per_node)
        # up to max_nodes, as asked (the ladder's default stops at 64 nodes: "no layout fits up to
        # 512 GPUs" for a job that fits on 1,024 of a 1,024-node default)
        ladder = node_ladder(with_gpu(cluster, gpu, 1), 1, top_nodes=max_nodes)
        counts = _within_node(cluster.gpus_per_node) + ladder
        price = prices.get(gpu.name, constraints.gpu_hour_cost)
        timed_at: int | None = at_gpus
        capped: tuple[str, ...] = _placement_notes(gpu, gpus_per_node)
        if at_gpus is not None and at_gpus > cluster.world_size:  # max_nodes bounds the option
            timed_at = cluster.world_size
            capped += (
                f"asked for {at_gpus:,} GPUs; max_nodes {max_nodes:,} of {cluster.gpus_per_node} GPUs holds "
                f"{timed_at:,}: timed on those",
            )
        found = _option(
            model, cluster, training, constraints, tuning, counts, price, timed_at, share(), capped
        )
        options.append(dataclasses.replace(found, source=index))
    return tuple(sorted(options, key=option_order))


def _placement_notes(gpu: GPUSpec, gpus_per_node: int | None) -> tuple[str, ...]:
    """What a catalog part without a reference node (or network) in its entry was placed in, which
    GET /v1/gpus leaves null: said, as an inline cluster's defaults are (a PCIe card's capacity row
    stated its 8-GPU nodes and 100 Gb/s port in fields alone)."""
    said = []
    if gpus_per_node is None and gpu.node_gpus is None:
        said.append(
            f"nodes of {reference_node_gpus(gpu)} {gpu.name} (its catalog entry has no reference node; "
            "gpus_per_node sets another)"
        )
    if gpu.node_network_bytes_per_s is None:
        network = reference_network_bytes_per_s(gpu)
        kind = (
            "a PCIe server's 100 Gb/s port per 8 GPUs (EC2 g5/g6/g4dn)"
            if network == PCIE_NODE_BYTES_PER_S
            else "an HGX node's 400 Gb/s NIC per GPU"
        )
        said.append(f"between nodes {network / 1e9:g} GB/s per GPU: {kind}, as no network is in its entry")
    return tuple(said)


def option_order(option: CapacityOption) -> tuple[int, float, float, int]:
    """Fitting first, fastest to train first, then the unknown (searches the budget cut), then those
    that do not fit; without tokens to train (no time), the highest throughput first; then the fewest
    GPUs."""
    return (
        0 if option.fits else 1 if option.fits is None else 2,
        option.time_to_train_s or float("inf"),
        -(option.tokens_per_s or 0.0),
        option.min_gpus or 0,
    )
