"""What would make an infeasible job fit, with numbers: best effort, in the order a user can act.

1. On the GPUs given, no new hardware: offload within the host RAM the nodes state (when the
   request did not allow it), torch.compile (FSDP), parameter-efficient fine-tuning (LoRA, QLoRA:
   Hu et al. arXiv:2106.09685, Dettmers et al. arXiv:2305.14314), a shorter sequence.
2. More of the same: the fewest whole nodes of this GPU that fit; offload with the host RAM it
   would need per node, where the nodes do not state that much.
3. Other GPUs (catalog parts with more memory), each in whole nodes of the shape that part ships
   in (8 per HGX/OAM board), the fewest that fit, the layout found there named.

Every suggestion is searched within a share of the request's ``Budget``, after a cheap lower bound
(model states alone; on more or other GPUs, ``space.least_bytes_per_gpu``: the model states
sharded over the most GPUs tried, plus, where the requested launchers run data parallelism only,
the activations and buffers no GPU count shrinks) says it can fit. One that cannot be computed (an
error of the estimator, the budget spent), that a bound rules out, whose search finds no layout that
fits, or whose GPU type cannot run the job as asked (``NoFit``, with the numbers), is left out with
its reason in ``Suggestions.skipped``: a suggestion considered never vanishes without a word, and
none fails the plan.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from service.estimator import evaluate
from service.estimator.comm import FASTEST_NIC_BYTES_PER_S
from service.estimator.defaults import for_gpu
from service.estimator.errors import InvalidTraining
from service.estimator.estimate import estimate
from service.estimator.job import make_job
from service.estimator.memory import cuda_context_bytes, min_frozen_base_bytes_per_gpu
from service.estimator.model_states import fused_expert_adapted_weights, peft_adapts_fused_experts
from service.estimator.scale import MAX_MEMORY_BYTES, MAX_NVME_BYTES
from service.estimator.tuning import Tuning, fitted_die
from service.estimator.types import (
    BaseDtype,
    ClusterSpec,
    Compile,
    Framework,
    GPUSpec,
    Layout,
    Method,
    ModelSpec,
    Offload,
    Optimizer,
    OptimizerImplementation,
    TrainingSpec,
)
from service.estimator.validate import checkpoint_hardware_violation, divisors, hardware_violation
from service.recommender.budget import Budget
from service.recommender.headroom import allowed_bytes, allowed_host_bytes, host_to_state
from service.recommender.rank import gib_needed
from service.recommender.runnable import framework_refusal
from service.recommender.space import (
    largest_runnable_world,
    largest_world,
    least_bytes_per_gpu,
    least_state_bytes,
    offload_devices,
    requested_runnable,
)
from service.recommender.types import Candidate, Constraints, Objective, Skipped, Suggestion

_log = logging.getLogger(__name__)
GiB = 2**30
MAX_NODE_FACTOR = 64  # look for up to 64x the nodes given before giving up
# Layout evaluations one suggestion may spend at most (about a second of work), of the request's budget.
SUGGESTION_EVALUATIONS = 50_000
MAX_HOST_PROBES = 5  # searches bisecting the least host RAM an offload suggestion needs
SHORTEST_SUGGESTED_SEQ = 512  # a shorter sequence is tried by halving, down to this
# The node and network a job placed on more GPUs than the request's one node assumes where its GPU's
# catalog entry states none (a PCIe card, a custom GPU). A part with NVLink-class links: an HGX H100
# node, 8 GPUs sharing 8 x 400 Gb/s NICs (its eight ConnectX-7), 50 GB/s per GPU one way. A PCIe-only
# part: a server of 8 PCIe cards on one 100 Gb/s network port (AWS g5.48xlarge: 8 A10G, g6.48xlarge:
# 8 L4, g4dn.metal: 8 T4, each "100 Gigabit" in EC2's instance specifications), 12.5e9 / 8 per GPU.
REFERENCE_NODE_GPUS = 8
NVLINK_NODE_BYTES_PER_S = 50e9
PCIE_NODE_BYTES_PER_S = 100e9 / 8 / REFERENCE_NODE_GPUS


def node_ladder(
    cluster: ClusterSpec, start_nodes: int, top_nodes: int | None = None, max_gpus: int | None = None
) -> tuple[int, ...]:
    """GPU counts from ``start_nodes`` nodes up to ``top_nodes`` (default: ``MAX_NODE_FACTOR`` x the
    nodes given) and at most ``max_gpus``: each node count to 16, then 3-smooth counts (2^a 3^b), and
    ``top_nodes`` itself when given (a stored cluster's size, a capacity request's max_nodes)."""
    gpn = cluster.gpus_per_node
    top = max(start_nodes, cluster.num_nodes) * MAX_NODE_FACTOR if top_nodes is None else top_nodes
    if max_gpus is not None:
        top = min(top, max_gpus // gpn)
    counts = _node_counts(start_nodes, top)
    if top_nodes is not None and top == top_nodes and top >= start_nodes and counts[-1:] != [top]:
        counts.append(top)
    return tuple(k * gpn for k in counts)


def _node_counts(start: int, top: int) -> list[int]:
    """Every count from ``start`` to 16, then the 3-smooth ones up to ``top``; generated, not
    scanned for: a 100,000-node cluster's ladder (up to 6.4M nodes) took a second of CPU to scan,
    before any budget could stop it."""
    counts = set(range(start, min(16, top) + 1))
    two = 1
    while two <= top:
        k = two
        while k <= top:
            if k >= start:
                counts.add(k)
            k *= 3
        two *= 2
    return sorted(counts)


def with_gpu(
    cluster: ClusterSpec, gpu: GPUSpec, num_nodes: int | None = None, gpus_per_node: int | None = None
) -> ClusterSpec:
    """The same network with another GPU (its own NVLink/PCIe bandwidth), in nodes of
    ``gpus_per_node`` (default: the cluster's). A one-node cluster has no network of its own (its
    "inter-node" bandwidth is its NVLink's): more nodes get ``gpu``'s reference network (a job
    moved to A100s runs on DGX A100 nodes: ``reference_network_bytes_per_s``). The cluster's own GPU
    keeps the cluster's links inside a node, as stated (more of the user's nodes: a stated 150 GB/s
    NVLink was swapped for the catalog's 300 in a more_gpus suggestion, 4% faster than the same
    layout estimated on the user's links; determinism review). The cluster's measured busbw stays
    only on the links it was measured on: not another GPU's NVLink, nor the default network of a
    one-node cluster (the tuning's efficiency applies there). A network faster than any NIC
    (``comm.FASTEST_NIC_BYTES_PER_S``: a GB200 NVL72 rack's NVLink across its trays) is the
    cluster's own GPU's fabric, not a network another GPU's nodes have: they get theirs (MI300X nodes
    were offered "900 GB/s per GPU between nodes": a rack-scale review)."""
    same_link = gpu == cluster.gpu
    return dataclasses.replace(
        cluster,
        gpu=gpu,
        num_nodes=num_nodes or cluster.num_nodes,
        gpus_per_node=gpus_per_node or cluster.gpus_per_node,
        intra_node_bandwidth_bytes_per_s=(
            cluster.intra_node_bandwidth_bytes_per_s if same_link else gpu.intra_node_bandwidth_bytes_per_s
        ),
        inter_node_bandwidth_bytes_per_s=(
            cluster.inter_node_bandwidth_bytes_per_s
            if cluster.num_nodes > 1
            and (same_link or cluster.inter_node_bandwidth_bytes_per_s <= FASTEST_NIC_BYTES_PER_S)
            else reference_network_bytes_per_s(gpu)
        ),
        measured_intra_node_bus_bandwidth_bytes_per_s=(
            cluster.measured_intra_node_bus_bandwidth_bytes_per_s if same_link else None
        ),
        measured_inter_node_bus_bandwidth_bytes_per_s=(
            cluster.measured_inter_node_bus_bandwidth_bytes_per_s if cluster.num_nodes > 1 else None
        ),
    )


def reference_network_bytes_per_s(gpu: GPUSpec) -> float:
    """The network a job of ``gpu`` placed on more nodes than asked is assumed to have: its catalog
    part's reference node's (gpus.toml ``node_network_bytes_per_s``: DGX A100 25e9, DGX-1 V100
    6.25e9), else an HGX node's for a part with NVLink-class links and a PCIe server's for a
    PCIe-only one (a GeForce card is not given a datacenter's 50 GB/s per GPU)."""
    reference = gpu.node_network_bytes_per_s
    if reference is not None:
        return reference
    pcie_only = gpu.intra_node_bandwidth_bytes_per_s <= gpu.pcie_bandwidth_bytes_per_s
    return PCIE_NODE_BYTES_PER_S if pcie_only else NVLINK_NODE_BYTES_PER_S


def reference_node_gpus(gpu: GPUSpec) -> int:
    """GPUs in the node a job of ``gpu`` grows into: its catalog part's reference node's (8 MI250X
    GCDs on a Frontier node), else ``REFERENCE_NODE_GPUS``."""
    return gpu.node_gpus or REFERENCE_NODE_GPUS


@dataclass(frozen=True, slots=True)
class FewestGpus:
    found: tuple[int, float, Layout] | None  # GPUs, tokens/s, the best layout on them
    evaluations: int  # layout evaluations the search spent
    truncated: bool  # its budget ran out before it found a fit or finished the counts
    # why no count can fit, where a cheap bound said so before any search (``climb_bound``)
    unfit: str | None = None


class NoFit(Exception):
    """A suggestion considered and not made, and why (``Suggestions.skipped`` says it): a cheap
    bound showed it cannot fit, its search found no layout that fits, or the part cannot run the
    job. A suggestion considered never vanishes without a word."""


def climb_bound(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
    counts: tuple[int, ...],
) -> tuple[tuple[int, ...], str | None]:
    """The GPU counts of a climb worth searching, and why none is where none is, before any
    search: none past ``space.largest_runnable_world`` (no split a requested launcher runs uses
    more GPUs: the global batch where they run data parallel only), and none at all where
    ``space.least_bytes_per_gpu`` on the most of them (which bounds every fewer count: the model
    states shrink with the GPUs, the rest is the same on any count) exceeds what a GPU allows."""
    largest = largest_world(model, cluster, training)
    runnable = largest_runnable_world(model, cluster, training, constraints.frameworks, constraints.launchers)
    within = tuple(n for n in counts if n <= runnable)
    who = _data_parallel_only_why(training)
    if not within:
        if runnable < largest and counts and min(counts) <= largest:
            return (), (
                f"{who}: at most the global batch ({training.global_batch_size}) GPUs, fewer than the "
                f"{min(counts)} tried first"
            )
        if counts:
            # no split of the job uses that many GPUs: said with what bounds it, not "no layout fits on
            # up to 32,768 GPUs" (QLoRA at global batch 16 uses at most 16; bounded-work review)
            qlora = "; qlora: tp = pp = 1" if training.method is Method.QLORA else ""
            return (), (
                f"no split of this job uses more than {largest:,} GPUs (dp <= global batch "
                f"{training.global_batch_size}{qlora}), fewer than the {min(counts):,} tried first: a larger "
                "training.global_batch_size lets more GPUs in"
            )
        return (), None
    top = max(within)
    trained = for_gpu(training, cluster.gpu, model)
    job = make_job(model, with_gpu(cluster, cluster.gpu, 1, top), trained, tuning)
    offload = offload_devices(constraints.allow_offload, cluster)
    bound = least_bytes_per_gpu(
        job, constraints.frameworks, offload, top, constraints.launchers, constraints.torch_compile
    )
    limit = allowed_bytes(cluster.gpu.memory_bytes, constraints.min_headroom_fraction)
    if bound is None or bound.need_bytes <= limit:
        return within, None
    cut = ""
    if len(within) < len(counts) and runnable < largest:
        cut = f"{who}, on at most the global batch ({training.global_batch_size}) GPUs; "
    return (), f"{cut}no layout of {top:,} GPUs or fewer fits: {bound.words(limit)}"


def fewest_gpus(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
    counts: Iterable[int],
    budget: Budget,
) -> FewestGpus:
    """(GPUs, tokens/s, best layout) at the first count in ``counts`` where a layout fits: the
    fastest layout on that many GPUs (at a fixed count every objective ranks by tokens/s)."""
    from service.recommender import fewest_count

    fewest = dataclasses.replace(constraints, objective=Objective.FEWEST_GPUS, max_gpus=None, top_k=1)
    # the cheap bounds before search: a count no split of the job uses (QLoRA at global batch 1 uses
    # at most 32 GPUs) is skipped, not searched to log its rejections, up to a capacity request's
    # max_nodes of 100,000; and no count is searched where the least memory any of them needs is
    # more than a GPU allows
    counts, unfit = climb_bound(model, cluster, training, constraints, tuning, tuple(counts))
    if not counts:
        return FewestGpus(found=None, evaluations=0, truncated=False, unfit=unfit)
    big = dataclasses.replace(cluster, num_nodes=max(cluster.num_nodes, max(counts) // cluster.gpus_per_node))
    result = fewest_count(model, big, training, fewest, tuning, counts, budget)
    ranked = result.ranked(Objective.FEWEST_GPUS)
    found = None
    if ranked:
        best = ranked[0]
        found = (best.layout.world_size, best.time.tokens_per_s, best.layout)
    return FewestGpus(found=found, evaluations=result.evaluations, truncated=result.truncated)


def _data_parallel_only_why(training: TrainingSpec) -> str:
    """Why the job runs data parallel alone (``space.largest_runnable_world``): QLoRA, whatever was
    asked, or the requested launchers (a QLoRA plan that asked for none was told "the requested
    launchers run data parallelism only": a review of this stop's commits)."""
    if training.method is Method.QLORA:
        return "qlora splits no weight and no target runs it with context parallelism"
    return "the requested launchers run data parallelism only"


def fsdp1_qlora_unfit(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, constraints: Constraints, tried: int
) -> str | None:
    """Why nothing fit a QLoRA job FSDP alone runs, whose FSDP1 shards none of its layouts
    (``_lora_unblocks_qlora``): every sharded one broke the rule, not memory, and the climb went as far
    as data parallelism runs (a review of the ordinary requests; capacity said a larger batch would
    help: a review of this stop's commits); None for any other job."""
    if not _lora_unblocks_qlora(model, training, constraints, Method.LORA):
        return None
    c = constraints
    searched = min(tried, largest_runnable_world(model, cluster, training, c.frameworks, c.launchers))
    return (
        f"no layout fits on up to {searched:,} GPUs: qlora on fsdp shards none of them (its FSDP1 units "
        "leave peft's fused-expert adapters sharded, huggingface/peft#3080), so each holds the whole "
        "model; lora, deepspeed or attention targets only lift that"
    )


def data_parallel_ceiling(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, constraints: Constraints, tried: int
) -> str | None:
    """Why no layout fit up to ``tried`` GPUs where the job's runnable layouts stop before it: data
    parallelism alone runs it, on at most the global batch (the requested launchers run no model
    parallelism, or QLoRA, which splits no weight and runs no context parallelism on any target), so
    the climb stopped there, not where memory did; None where they do not (suggestions review: "no
    layout fits on up to 512 GPUs" for a batch of 16; a QLoRA capacity note said 8,192 GPUs)."""
    c = constraints
    runnable = largest_runnable_world(model, cluster, training, c.frameworks, c.launchers)
    if runnable >= tried or runnable >= largest_world(model, cluster, training):
        return None
    who = _data_parallel_only_why(training)
    return (
        f"no layout fits on up to {runnable:,} GPUs, the most this job uses: {who}, on at most the global "
        f"batch ({training.global_batch_size}) GPUs, and what each GPU holds of a sequence does not shrink "
        "with more; a larger training.global_batch_size lets more GPUs in, a shorter training.seq_len needs "
        "less of each"
    )


def states_unfit(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    tuning: Tuning,
    constraints: Constraints,
    gpus: int,
) -> str | None:
    """Why the model states alone cannot fit ``gpus`` GPUs of the cluster for any framework allowed,
    with the numbers (``space.least_state_bytes``, the bound the search applies per count, with its
    offload rule); None where they can."""
    job = make_job(model, with_gpu(cluster, cluster.gpu, 1, gpus), training, tuning)
    offload = offload_devices(constraints.allow_offload, cluster)
    limit = allowed_bytes(cluster.gpu.memory_bytes, constraints.min_headroom_fraction)
    if training.method is not Method.FULL:
        # LoRA/QLoRA: the frozen base alone, as sharded as any framework shards it (without it, an
        # absurd model's PEFT suggestion searched until the request's budget ran out: hostile review)
        if offload.cpu or offload.nvme:
            return None
        base = min_frozen_base_bytes_per_gpu(job, gpus)
        if base <= limit:
            return None
        what = f"the frozen base alone needs {base / GiB:.1f} GiB per GPU sharded over all {gpus:,} GPUs"
        return f"{what} (nothing offloaded); {limit / GiB:.1f} GiB allowed"
    # of the frameworks a requested launcher runs for this job, as the search bounds them: an
    # infeasible plan quoted Megatron's 115 GiB floor beside the search's 131 GiB for the HF
    # Trainer's, and the "no requested launcher runs megatron" it had said (an infeasible-jobs review)
    runnable = tuple(
        framework
        for framework in constraints.frameworks
        if requested_runnable(framework, model, training, constraints.launchers, cluster.gpu)
    )
    bound = least_state_bytes(job, runnable, offload, gpus) if runnable else None
    if bound is None or bound[0] <= limit:
        return None
    need, framework = bound
    return (
        f"the model states alone need {need / GiB:.1f} GiB per GPU sharded over all {gpus:,} GPUs "
        f"({framework.value}, nothing offloaded); {limit / GiB:.1f} GiB allowed"
    )


@dataclass(frozen=True, slots=True)
class Suggestions:
    made: tuple[Suggestion, ...]  # in the order above
    skipped: tuple[Skipped, ...]  # what could not be computed, and why


@dataclass(slots=True)
class _Collector:
    """Runs each suggestion within its share of the budget; one that fails is skipped, with why."""

    budget: Budget
    made: list[Suggestion] = dataclasses.field(default_factory=list)
    skipped: list[Skipped] = dataclasses.field(default_factory=list)

    def run(
        self, kind: str, parts: int, make: Callable[[Budget], list[Suggestion]], subject: str | None = None
    ) -> None:
        """``subject``: what the suggestion is about (another GPU's name), said where it is skipped for
        want of budget (two "other_gpu: the request's time budget ran out first" named no GPU)."""
        about = f"{subject}: " if subject else ""
        if self.budget.exhausted():
            self.skipped.append(
                Skipped(kind=kind, reason=f"{about}the request's {budget_words(self.budget)} ran out first")
            )
            return
        share = self.budget.share(SUGGESTION_EVALUATIONS, parts)
        try:
            found = make(share)
        except NoFit as exc:  # a bound or its search showed it cannot fit: why, with its numbers
            # unless the search was cut: then what it did not search may fit
            reason = str(exc)
            if share.reason is not None:
                reason = f"{about}the request's {budget_words(share)} ran out before a fit was found"
            self.skipped.append(Skipped(kind=kind, reason=reason))
            return
        except (ValueError, ArithmeticError) as exc:  # the estimator's domain errors are ValueErrors
            self.skipped.append(Skipped(kind=kind, reason=str(exc)))
            return
        except Exception:  # a fault in one suggestion: logged with its traceback, never the answer's 500
            _log.exception("suggestion %s failed", kind)
            reason = "could not be computed: an internal error (logged)"
            self.skipped.append(Skipped(kind=kind, reason=reason))
            return
        if found and share.reason is not None:  # found, but the search was cut: say so
            cut = f" (its search was cut by the request's {budget_words(share)}: a faster layout may exist)"
            found = [dataclasses.replace(s, detail=s.detail + cut, truncated=True) for s in found]
        self.made += found
        if not found and share.reason is not None:
            reason = f"{about}the request's {budget_words(share)} ran out before a fit was found"
            self.skipped.append(Skipped(kind=kind, reason=reason))


def budget_words(budget: Budget) -> str:
    """What stopped a share of the work, in words."""
    return {"time": "time budget", "cancelled": "client (it went away)"}.get(
        budget.reason or "", "evaluation budget"
    )


def suggestions(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
    catalog: Iterable[GPUSpec] = (),
    budget: Budget | None = None,
) -> Suggestions:
    """Every change that makes the job fit, each with the numbers that show it, no-new-hardware
    first; ``catalog`` holds the other GPUs."""
    budget = budget or Budget(constraints.max_evaluations)
    collect = _Collector(budget)
    ask = _Ask(model, cluster, training, constraints, tuning)
    unfit = _gpu_type_unfit(cluster, constraints, tuning)
    if unfit is not None:
        # no change on this GPU type fits: each would search to learn it, and leave the other GPUs,
        # the one answer here, no budget (a 1 MiB custom GPU: bounded-work review, stop 41)
        for kind in ("offload", "lora", "qlora", "shorter_sequence", "more_gpus"):
            collect.skipped.append(Skipped(kind=kind, reason=unfit))
    else:
        _same_gpu_type(collect, ask, training, constraints)
    # 3. other GPUs
    others = [gpu for gpu in catalog if _bigger(gpu, cluster.gpu)]
    for i, gpu in enumerate(others):
        collect.run("other_gpu", len(others) - i, functools.partial(ask.other_gpu, gpu), gpu.name)
    kept, dominated = _undominated(collect.made)
    return Suggestions(made=_in_order(kept), skipped=tuple(collect.skipped) + dominated)


def _undominated(made: list[Suggestion]) -> tuple[list[Suggestion], tuple[Skipped, ...]]:
    """``made`` less each LoRA / QLoRA suggestion at a shorter sequence where the shorter sequence
    alone, at least as long, fits on the GPUs given: the method change buys nothing there ("qlora with
    training.seq_len 16384 fits" beside "training.seq_len 16384 fits", faster; fine-tuner review),
    said among the skipped instead."""
    shorter = [s.seq_len for s in made if s.kind == "shorter_sequence" and s.seq_len is not None]
    longest = max(shorter, default=None)
    kept: list[Suggestion] = []
    skipped: list[Skipped] = []
    for s in made:
        if (
            longest is not None
            and s.kind in ("lora", "qlora")
            and s.seq_len is not None
            and s.seq_len <= longest
        ):
            reason = (
                f"{s.kind} fits only at training.seq_len {s.seq_len}, where the sequence alone, "
                f"training.seq_len {longest}, fits without changing the method"
            )
            skipped.append(Skipped(kind=s.kind, reason=reason))
            continue
        kept.append(s)
    return kept, tuple(skipped)


def _gpu_type_unfit(cluster: ClusterSpec, constraints: Constraints, tuning: Tuning) -> str | None:
    """Why nothing fits on this GPU type whatever the layout, sequence, method or GPU count, or None:
    the CUDA context every process holds (``memory.cuda_context_bytes``), which nothing offloads,
    exceeds what the plan allows of one GPU."""
    floor = cuda_context_bytes(tuning.memory)
    limit = allowed_bytes(cluster.gpu.memory_bytes, constraints.min_headroom_fraction)
    if floor <= limit:
        return None
    return (
        f"the CUDA context alone ({floor / GiB:.2f} GiB) exceeds the {limit / GiB:.4g} GiB allowed of one "
        f"{cluster.gpu.name}: nothing fits on this GPU type"
    )


def _same_gpu_type(collect: _Collector, ask: _Ask, training: TrainingSpec, constraints: Constraints) -> None:
    """The suggestions on this GPU type: on the GPUs given, then more of them."""
    # 1. on the GPUs given
    if not constraints.allow_offload and ask.cluster.cpu_memory_bytes_per_node:
        collect.run("offload", 6, ask.offload_within_the_nodes)
    # Not offered where it cannot apply: asked already, no framework it compiles, or QLoRA, whose
    # compiled layouts the search and estimates refuse (bitsandbytes' NF4 matmuls break the graph:
    # validate.py) whatever else changes. Such a suggestion was never considered, so it is not
    # "skipped" (that lists what was considered and not made) either.
    if not (constraints.torch_compile or Framework.FSDP not in constraints.frameworks
            or training.method is Method.QLORA):  # fmt: skip
        collect.run("torch_compile", 5, ask.compiled)
    if training.base_autocast:
        collect.run("base_dtype", 4, ask.base_in_compute_dtype)
    if training.optimizer_implementation is OptimizerImplementation.FOREACH:
        collect.run("optimizer_implementation", 4, ask.fused_optimizer)
    if training.optimizer is Optimizer.ADAMW and training.method is Method.FULL:
        collect.run("optimizer", 4, ask.eight_bit_optimizer)
    for method in (Method.LORA, Method.QLORA):
        if _order(method) > _order(training.method) or _lora_unblocks_qlora(
            ask.model, training, constraints, method
        ):
            collect.run(method.value, 4, functools.partial(ask.peft, method))
    if training.seq_len > SHORTEST_SUGGESTED_SEQ:
        collect.run("shorter_sequence", 3, ask.shorter_sequence)
    # 2. more of the same
    collect.run("more_gpus", 2, ask.more_gpus)
    collect.run("offload", 2, ask.offload_needs)
    # 2'. where no change alone fits on this GPU type: a shorter sequence with offload, or on more of it
    if not collect.made and training.seq_len // 2 >= SHORTEST_SUGGESTED_SEQ:
        collect.run("offload", 2, functools.partial(ask.shorter_with, "offload"))
        collect.run("more_gpus", 2, functools.partial(ask.shorter_with, "more_gpus"))


def _lora_unblocks_qlora(
    model: ModelSpec, training: TrainingSpec, constraints: Constraints, method: Method
) -> bool:
    """Whether LoRA is worth asking of a QLoRA job: FSDP is all it may run on, and QLoRA's FSDP1
    cannot shard a model whose fused experts peft adapts (``validate``'s peft_fused_experts_fsdp1
    rule), where LoRA's FSDP2 can. QLoRA on Qwen3-30B-A3B over 8 L4s was told to buy other GPUs,
    though LoRA fits the eight (a review of the ordinary requests)."""
    if method is not Method.LORA or training.method is not Method.QLORA or model.moe is None:
        return False
    if constraints.frameworks != (Framework.FSDP,):  # DeepSpeed runs the QLoRA job itself
        return False
    one_expert_group = Layout(framework=Framework.FSDP, zero_stage=3)
    return (
        peft_adapts_fused_experts(model, one_expert_group)
        and fused_expert_adapted_weights(model, training)[0] > 0
    )


def _order(method: Method) -> int:
    return (Method.FULL, Method.LORA, Method.QLORA).index(method)


def _bigger(gpu: GPUSpec, than: GPUSpec) -> bool:
    return gpu.name != than.name and gpu.memory_bytes > than.memory_bytes


_GROUP = {"torch_compile": 0, "base_dtype": 0, "optimizer_implementation": 0, "lora": 0, "qlora": 0,
          "shorter_sequence": 0, "offload": 1, "more_gpus": 2, "other_gpu": 3}  # fmt: skip


def _in_order(made: list[Suggestion]) -> tuple[Suggestion, ...]:
    """On the GPUs given first (offload within the nodes' stated RAM included), then offload with
    host RAM the nodes do not state (no new GPUs), then more of the same GPU, then other GPUs, the
    fewest GPUs first and the fastest among equals."""

    def key(s: Suggestion) -> tuple[int, int, float]:
        group = 0 if s.on_the_gpus_given else _GROUP[s.kind]
        if group < 3:
            return (group, 0, 0.0)  # in the order they were asked (stable sort)
        return (group, s.num_gpus or 0, -(s.tokens_per_s or 0.0))

    return tuple(sorted(made, key=key))


@dataclass(frozen=True, slots=True)
class _Ask:
    """The job as asked, and each way of changing it."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    constraints: Constraints
    tuning: Tuning

    def _best(
        self,
        budget: Budget,
        constraints: Constraints | None = None,
        cluster: ClusterSpec | None = None,
        training: TrainingSpec | None = None,
    ) -> Candidate | None:
        """The best layout of the job so changed, searched with the request's objective."""
        from service.recommender import recommend

        asked = dataclasses.replace(constraints or self.constraints, top_k=1)
        try:
            found = recommend(
                self.model, cluster or self.cluster, training or self.training, asked, self.tuning,
                with_suggestions=False, budget=budget,
            )  # fmt: skip
        except InvalidTraining as refused:
            if refused.rule == "no_launcher":  # no requested framework runs the change: none found
                return None
            raise
        return found.recommended

    def _refused(self, training: TrainingSpec, constraints: Constraints) -> str | None:
        """Why none of the requested frameworks (through the requested launchers) trains ``training``
        with any layout, each one's reason; None where one does."""
        refusals = []
        for framework in constraints.frameworks:
            refusal = framework_refusal(self.model, self.cluster, training, framework, constraints.launchers)
            if refusal is None:
                return None
            refusals.append(f"{framework.value}: {refusal.message}")
        return "; ".join(refusals)

    def _elsewhere(
        self, budget: Budget, kind: str, what: str, training: TrainingSpec, constraints: Constraints
    ) -> list[Suggestion] | None:
        """``what`` where the requested frameworks and launchers train it with no layout (Megatron has
        no PEFT, torchtitan trains full models only): said so, not "no layout fits", with the best
        layout of the frameworks that do train it on the GPUs given, past the request's
        ``constraints.frameworks`` / ``launchers``, where one fits (suggestions review: LoRA of a 70B on
        8 A100-40GB asked of megatron said it did not fit; with deepspeed or fsdp it fits). None where
        a requested framework trains it (its search found no layout that fits)."""
        refused = self._refused(training, constraints)
        if refused is None:
            return None
        others = tuple(
            fw for fw in Framework if framework_refusal(self.model, self.cluster, training, fw) is None
        )
        named = what.split(" (")[0]
        asked = ", ".join(fw.value for fw in constraints.frameworks)
        if not others:
            raise NoFit(f"no framework trains {named}: {refused}")
        relaxed = dataclasses.replace(constraints, frameworks=others, launchers=None)
        found = self._best(budget, relaxed, training=training)
        if found is None:
            raise NoFit(
                f"the requested frameworks ({asked}) do not train {named} ({refused}), and with "
                f"{', '.join(fw.value for fw in others)} no layout fits on the GPUs given"
            )
        # what the layout found steps past: the requested frameworks where it runs another, the
        # requested launchers where they were named (review of stop 48: "past constraints.frameworks
        # (fsdp)" read wrong where fsdp was kept and only torchtitan passed)
        launchers = ", ".join(t.value for t in constraints.launchers or ())
        passed = [f"launchers ({launchers})"] if launchers else []
        if found.layout.framework not in constraints.frameworks:
            passed.insert(0, f"constraints.frameworks ({asked})")
        also = (
            f"{what} with {found.layout.framework.value}, past {' and '.join(passed)}, which do not train it "
            f"({refused})"
        )
        return [_on_the_gpus_given(kind, also, self.cluster, found, training)]

    def offload_within_the_nodes(self, budget: Budget) -> list[Suggestion]:
        found = self._best(budget, dataclasses.replace(self.constraints, allow_offload=True))
        if found is None:
            host = self.cluster.cpu_memory_bytes_per_node / GiB
            raise NoFit(f"no layout fits offloading to the nodes' {host:.0f} GiB of host RAM per node")
        host = found.estimate.memory.cpu_per_node_bytes
        what = (
            f"allow offload (constraints.allow_offload): {gib_needed(host)} GiB of the nodes' host RAM per "
            "node"
        )
        return [_on_the_gpus_given("offload", what, self.cluster, found, self.training)]

    def offload_needs(self, budget: Budget) -> list[Suggestion]:
        """Offload with as much host RAM and NVMe as it takes: what it would need per node, where
        the nodes do not state that much (else the search, allowed to offload, found it)."""
        found = self._offloaded(budget)
        if found is None:
            raise NoFit(
                "no layout fits on these GPUs even offloading to as much host RAM and NVMe as a node may "
                f"state ({MAX_MEMORY_BYTES / 2**40:.0f} TiB and {MAX_NVME_BYTES / 2**50:.0f} PiB)"
            )
        memory = found.estimate.memory
        have = self.cluster.cpu_memory_bytes_per_node
        if have and memory.cpu_per_node_bytes <= allowed_host_bytes(have):
            # within the nodes' host RAM: the plan's own search offloaded so, or, not allowed to,
            # offload_within_the_nodes says it (the same layout, suggested once)
            return []
        least = self._least_host(budget, found)
        needs = least.estimate.memory
        if (
            have
            and needs.cpu_per_node_bytes <= allowed_host_bytes(have)
            and needs.nvme_per_node_bytes <= self.cluster.nvme_bytes_per_node
        ):
            return []  # offload within the nodes: offload_within_the_nodes says it
        return [self._offload_suggestion(least, best=None if least is found else found)]

    def _least_host(self, budget: Budget, fastest: Candidate) -> Candidate:
        """Of the layouts on as many GPUs as ``fastest`` that fit offloading to the nodes' NVMe (as much
        as a node may state where they state none), one that needs the least host RAM per node,
        bisected between the nodes' own (nothing fits there: the plan's search) and the fastest's
        need, at most ``MAX_HOST_PROBES`` searches; ``fastest`` where none fits within their NVMe.
        More host RAM never makes a layout not fit, so the bisection holds. The fastest offload (CPU)
        asked for 1157 GiB per node of 70B on eight A100s where 278 on the same GPUs with the nodes'
        NVMe would do (an offload review)."""
        nvme = self.cluster.nvme_bytes_per_node or MAX_NVME_BYTES
        allowed = dataclasses.replace(self.constraints, allow_offload=True)

        def fitting(host: int) -> Candidate | None:
            on = dataclasses.replace(self.cluster, cpu_memory_bytes_per_node=host, nvme_bytes_per_node=nvme)
            return self._best(budget, allowed, cluster=on)

        best = fastest if fastest.estimate.memory.nvme_per_node_bytes <= nvme else fitting(MAX_MEMORY_BYTES)
        if best is None:
            return fastest
        # nothing fits within the nodes' own where the plan's search offloaded; where it was not allowed
        # to, from none
        # (host RAM a node states: a plan uses what the headroom policy leaves of it, host_to_state)
        low = self.cluster.cpu_memory_bytes_per_node if self.constraints.allow_offload else 0
        high = host_to_state(best.estimate.memory.cpu_per_node_bytes)
        for _ in range(MAX_HOST_PROBES):
            if high - low <= GiB or budget.exhausted():
                break
            middle = -(-(low + high) // (2 * GiB)) * GiB  # whole GiB, as the suggestion says it
            if middle >= high:
                break
            probe = fitting(middle)
            # on as many of the GPUs as the fastest: with less host RAM ZeRO-Infinity's buffers fit on
            # fewer GPUs, down to one at a tenth of the speed (a change review), which is not the answer
            if probe is None or probe.layout.world_size < fastest.layout.world_size:
                low = middle
            else:
                best, high = probe, host_to_state(probe.estimate.memory.cpu_per_node_bytes)
        return best

    def _offloaded(self, budget: Budget) -> Candidate | None:
        """The best layout on these GPUs allowed to offload to as much host RAM and NVMe as a node may
        state (so the suggestion can be sent back: 2**62 bytes suggested 50.7 TiB per node, a 422;
        bounded-work review)."""
        unlimited = dataclasses.replace(
            self.cluster,
            cpu_memory_bytes_per_node=MAX_MEMORY_BYTES,
            nvme_bytes_per_node=MAX_NVME_BYTES,
        )
        allowed = dataclasses.replace(self.constraints, allow_offload=True)
        return self._best(budget, allowed, cluster=unlimited)

    def _offload_suggestion(self, found: Candidate, best: Candidate | None = None) -> Suggestion:
        """``found`` as the suggestion; ``best``, the best offload by the request's objective, which
        needs more host RAM, said beside it."""
        memory = found.estimate.memory
        have = self.cluster.cpu_memory_bytes_per_node
        verdict = "host RAM not stated" if not have else f"the nodes state {have / GiB:.0f} GiB"
        # what a node must state: the layout's need and the 5% a plan keeps free (headroom)
        stated = host_to_state(memory.cpu_per_node_bytes)
        # offload the request did not allow: said, as offload_within_the_nodes says it (applied as its
        # fields say, the plan stayed infeasible; bounded-work review)
        allow = "" if self.constraints.allow_offload else "allow offload (constraints.allow_offload) and "
        # on how many of the GPUs, and how: 343 tokens/s on 1 of 8 GPUs read as the 8-GPU figure (an
        # infeasible-jobs review); the other suggestions say both (_on_the_gpus_given)
        used, given = found.layout.world_size, self.cluster.world_size
        where = f"the {given} GPUs given" if used == given else f"{used} of the {given} GPUs given"
        if given == 1:
            where = "the GPU given"
        return Suggestion(
            kind="offload",
            detail=f"{allow}offload with {stated // GiB} GiB host RAM per node "
            f"({verdict}){_nvme_words(memory.nvme_per_node_bytes, self.cluster)} on {where}: "
            f"{memory.per_gpu.total / GiB:.1f} GiB per GPU, {_speed(found)} with "
            f"{_layout_words(found.layout)}{_best_offload(best, self.constraints.objective)}",
            gpu=self.cluster.gpu.name,
            num_gpus=found.layout.world_size,  # the layout's GPUs, as _on_the_gpus_given says them
            num_nodes=max(1, found.layout.world_size // self.cluster.gpus_per_node),
            # num_nodes x gpus_per_node = num_gpus: part of a node is a node of that many (1 x 8 beside
            # num_gpus 4 was a 422 once applied; bounded-work review)
            gpus_per_node=min(self.cluster.gpus_per_node, found.layout.world_size),
            per_gpu_bytes=memory.per_gpu.total,
            cpu_per_node_bytes=stated,
            nvme_per_node_bytes=memory.nvme_per_node_bytes or None,
            tokens_per_s=_tokens_per_s(found),
            layout=found.layout,
            on_the_gpus_given=bool(have and memory.cpu_per_node_bytes <= allowed_host_bytes(have))
            and memory.nvme_per_node_bytes <= self.cluster.nvme_bytes_per_node,
        )

    def shorter_with(self, kind: str, budget: Budget) -> list[Suggestion]:
        """Where neither a shorter sequence on the GPUs given nor ``kind`` alone (offload with the
        host RAM and NVMe it needs; or more of the same GPU) fits: both together, at the longest of
        seq_len / 2, / 4, ... down to 512 that fits. A shorter sequence only frees activations, so
        what fits at one length fits at every shorter one: the halvings are bisected, the shortest
        asked first (none fits: said, with the shortest tried)."""
        found = self._longest(functools.partial(self._with_sequence, kind, budget=budget))
        if found is None:
            if budget.exhausted():
                return []  # the collector says the budget ran out
            what = "offloading as much as it needs" if kind == "offload" else "on more GPUs"
            raise NoFit(
                f"not even training.seq_len {self._halvings()[-1]} fits {what} (a shorter sequence with "
                "it, where neither fits alone)"
            )
        assert found.seq_len is not None
        what = f"training.seq_len {found.seq_len} (from {self.training.seq_len}), and "
        return [dataclasses.replace(found, detail=what + found.detail)]

    def _halvings(self) -> list[int]:
        """seq_len / 2, / 4, ... down to ``SHORTEST_SUGGESTED_SEQ``, longest first."""
        seq = self.training.seq_len
        return [seq >> k for k in range(1, seq.bit_length()) if seq >> k >= SHORTEST_SUGGESTED_SEQ]

    def _longest(self, made_at: Callable[[int], Suggestion | None]) -> Suggestion | None:
        """``made_at(seq)`` at the longest halving of the sequence where it makes a suggestion, None
        where not even the shortest does. A shorter sequence only frees activations, so what fits at
        one length fits at every shorter one: the halvings are bisected, the shortest asked first."""
        halvings = self._halvings()
        if not halvings:
            return None
        tried: dict[int, Suggestion | None] = {}

        def at(index: int) -> Suggestion | None:
            seq = halvings[index]
            if seq not in tried:
                tried[seq] = made_at(seq)
            return tried[seq]

        last = len(halvings) - 1
        if at(last) is None:
            return None
        return at(evaluate.bisect_smallest(0, last, lambda i: at(i) is not None))

    def _with_sequence(self, kind: str, seq: int, *, budget: Budget) -> Suggestion | None:
        """``kind`` (offload as needed, or more of this GPU) at sequence length ``seq``: the
        suggestion, stating the ``seq_len`` it assumed, or None where nothing fits so."""
        shorter = dataclasses.replace(self, training=dataclasses.replace(self.training, seq_len=seq))
        if kind == "offload":
            found = shorter._offloaded(budget)
            made = None if found is None else shorter._offload_suggestion(found)
        else:
            try:
                (made,) = shorter.more_gpus(budget)
            except NoFit:
                made = None
        return None if made is None else dataclasses.replace(made, seq_len=seq)

    def compiled(self, budget: Budget) -> list[Suggestion]:
        """FSDP compiled with torch.compile, model and loss (no fp32 logits, fused norms)."""
        compiled = dataclasses.replace(self.constraints, torch_compile=True, frameworks=(Framework.FSDP,))
        found = self._best(budget, compiled)
        if found is None:
            raise NoFit("no FSDP layout compiled with torch.compile fits on the GPUs given")
        if found.layout.torch_compile is Compile.NONE:
            return []
        what = "torch.compile of the FSDP model and loss (constraints.torch_compile)"
        return [_on_the_gpus_given("torch_compile", what, self.cluster, found, self.training)]

    def base_in_compute_dtype(self, budget: Budget) -> list[Suggestion]:
        """The LoRA base loaded in the compute dtype instead of fp32: half its bytes, and no 16-bit
        copies for autocast to make."""
        loaded = dataclasses.replace(self.training, base_dtype=BaseDtype.COMPUTE)
        dtype = loaded.precision.weight_dtype
        what = (
            f"the LoRA base loaded in {dtype} (training.base_dtype compute: "
            f"from_pretrained(dtype=torch.{dtype}))"
        )
        found = self._best(budget, self.constraints, training=loaded)
        if found is None:
            elsewhere = self._elsewhere(budget, "base_dtype", what, loaded, self.constraints)
            if elsewhere is not None:
                return elsewhere
            raise NoFit(f"no layout fits on the GPUs given with the LoRA base in {dtype}")
        return [_on_the_gpus_given("base_dtype", what, self.cluster, found, loaded)]

    def fused_optimizer(self, budget: Budget) -> list[Suggestion]:
        """AdamW's fused step instead of torch.optim's foreach one: no temporary of the trainable
        parameters' size (memory.optimizer_temporary_bytes)."""
        what = (
            "AdamW's fused step (training.optimizer_implementation fused: torch.optim.AdamW(fused=True), "
            "HF Trainer optim adamw_torch_fused)"
        )
        return self._optimizer_change(
            budget, "optimizer_implementation", what, optimizer_implementation=OptimizerImplementation.FUSED
        )

    def eight_bit_optimizer(self, budget: Budget) -> list[Suggestion]:
        """bitsandbytes' 8-bit AdamW instead of AdamW: 1 byte per moment and an fp32 scale per block
        where AdamW keeps 4 (model_states.moment_bytes), 6 bytes less per trainable parameter, same
        method and sequence: before LoRA, which trains another model. Megatron-LM and torchtitan build
        no 8-bit optimizer (their launchers refuse it), so it is searched where one is built."""
        what = (
            "8-bit AdamW (training.optimizer adamw_8bit: bitsandbytes' AdamW8bit, HF Trainer optim "
            "adamw_bnb_8bit)"
        )
        return self._optimizer_change(budget, "optimizer", what, optimizer=Optimizer.ADAMW_8BIT)

    def _optimizer_change(
        self, budget: Budget, kind: str, what: str, **change: Optimizer | OptimizerImplementation
    ) -> list[Suggestion]:
        """The training with ``change`` (its one optimizer field) on the GPUs given, the suggestion
        naming the field's new value."""
        changed = dataclasses.replace(self.training, **change)  # type: ignore[arg-type]
        found = self._best(budget, self.constraints, training=changed)
        if found is None:
            elsewhere = self._elsewhere(budget, kind, what, changed, self.constraints)
            if elsewhere is None:
                raise NoFit(f"no layout fits on the GPUs given with {what.split(' (')[0]}")
            made = elsewhere[0]
        else:
            made = _on_the_gpus_given(kind, what, self.cluster, found, changed)
        return [dataclasses.replace(made, **{name: value.value for name, value in change.items()})]  # type: ignore[arg-type]

    def peft(self, method: Method, budget: Budget) -> list[Suggestion]:
        # QLoRA quantises the base: whatever dtype LoRA's base was loaded in
        base = BaseDtype.COMPUTE if method is Method.QLORA else self.training.base_dtype
        peft = dataclasses.replace(self.training, method=method, base_dtype=base)
        compile_it = self.constraints.torch_compile and method is not Method.QLORA
        constraints = dataclasses.replace(self.constraints, torch_compile=compile_it)
        what = f"{method.value} (rank {peft.lora_rank}, training.method {method.value})"
        if compile_it != self.constraints.torch_compile:
            # applied with the request's compile, a 422 (rationale review): said, as frameworks are
            what += (
                " without torch.compile (constraints.torch_compile false: bitsandbytes' NF4 matmuls break "
                "the compiled graph)"
            )
        # the cheap bound first: a frozen base that cannot fit sharded over every GPU fits at no length,
        # on no framework (searched, it took the request's budget from every suggestion after it)
        gpus = self.cluster.world_size
        unfit = states_unfit(self.model, self.cluster, peft, self.tuning, constraints, gpus)
        if unfit is not None:
            raise NoFit(
                f"no layout fits on the GPUs given with {method.value} (rank {peft.lora_rank}): {unfit}"
            )
        found = self._best(budget, constraints, training=peft)
        if found is not None:
            return [_on_the_gpus_given(method.value, what, self.cluster, found, peft)]
        elsewhere = self._elsewhere(budget, method.value, what, peft, constraints)
        if elsewhere is not None:
            return elsewhere
        # not at this length: at the longest shorter one where it does (QLoRA at 4K may serve better
        # than the full method at 1K)

        def at(seq: int) -> Suggestion | None:
            shorter = dataclasses.replace(peft, seq_len=seq)
            fits = self._best(budget, constraints, training=shorter)
            if fits is None:
                return None
            also = f"{what} with training.seq_len {seq} (from {self.training.seq_len})"
            return _on_the_gpus_given(method.value, also, self.cluster, fits, shorter)

        shorter = None if budget.exhausted() else self._longest(at)
        if shorter is None:
            if budget.exhausted():
                return []  # the collector says the budget ran out
            halvings = self._halvings()
            why = f", nor at training.seq_len {halvings[-1]}" if halvings else ""
            raise NoFit(f"no layout fits on the GPUs given with {method.value} (rank {peft.lora_rank}){why}")
        return [shorter]

    def shorter_sequence(self, budget: Budget) -> list[Suggestion]:
        """The longest of seq_len / 2, / 4, ... (down to 512) that fits on the GPUs given; only where
        the model states alone fit (a shorter sequence frees activations, nothing else)."""
        unfit = states_unfit(
            self.model, self.cluster, self.training, self.tuning, self.constraints, self.cluster.world_size
        )
        if unfit is not None:
            raise NoFit(f"{unfit}, whatever the sequence (a shorter one frees activations only)")
        seq = self.training.seq_len // 2
        while seq >= SHORTEST_SUGGESTED_SEQ and not budget.exhausted():
            shorter = dataclasses.replace(self.training, seq_len=seq)
            found = self._best(budget, training=shorter)
            if found is not None:
                what = f"training.seq_len {seq} (from {self.training.seq_len})"
                return [_on_the_gpus_given("shorter_sequence", what, self.cluster, found, shorter)]
            seq //= 2
        if budget.exhausted():
            return []  # the collector says the budget ran out
        longest = self.training.seq_len // 2
        raise NoFit(f"no sequence from {longest} down to {SHORTEST_SUGGESTED_SEQ} fits on the GPUs given")

    def more_gpus(self, budget: Budget) -> list[Suggestion]:
        cluster = self.cluster
        node = reference_node_gpus(cluster.gpu)
        if cluster.num_nodes == 1 and cluster.gpus_per_node < node:
            # one node short of its part's reference node grows into that node first (a second card
            # in the workstation, before a second workstation on a network it does not have), then
            # into more of them on the part's reference network
            grown = with_gpu(cluster, cluster.gpu, 1, node)
            within = tuple(d for d in divisors(node) if cluster.gpus_per_node < d < node)
            counts = within + node_ladder(grown, 1, max_gpus=MAX_SUGGESTED_GPUS)
            return self._fewest("more_gpus", grown, counts, budget)
        cap = self.constraints.max_gpus
        if cap is not None and cap < cluster.world_size:
            # the search stopped at constraints.max_gpus, not at the cluster: the fewest past it, the
            # cluster's own GPUs first (a review's 70B on 64 H100s capped at 4 was told 72, where 16
            # of its 64 fit)
            within = tuple(d for d in divisors(cluster.gpus_per_node) if cap < d < cluster.gpus_per_node)
            ladder = node_ladder(cluster, 1, max_gpus=MAX_SUGGESTED_GPUS)
            counts = within + tuple(c for c in ladder if c > cap)
        else:
            counts = node_ladder(cluster, cluster.num_nodes + 1, max_gpus=MAX_SUGGESTED_GPUS)
        return self._fewest("more_gpus", with_gpu(cluster, cluster.gpu), counts, budget)

    def other_gpu(self, gpu: GPUSpec, budget: Budget) -> list[Suggestion]:
        # in nodes of the part's reference node; on the cluster's own nodes and network where it
        # spans several and the part ships in no node of its own (the same servers, other cards)
        per_node = gpu.node_gpus or (self.cluster.gpus_per_node if self.cluster.num_nodes > 1 else None)
        other = with_gpu(self.cluster, gpu, 1, per_node or reference_node_gpus(gpu))
        training = for_gpu(self.training, gpu, self.model)
        violation = checkpoint_hardware_violation(self.model, gpu) or hardware_violation(other, training)
        if violation is not None:  # the request asked for what this part cannot run (fp8 on an MI250X)
            raise NoFit(f"{gpu.name}: {violation.message.removeprefix(gpu.name).lstrip()}")
        # from one card up: part of a node where that holds the job (one H100 for what needed four L4s)
        within = tuple(d for d in divisors(other.gpus_per_node) if d < other.gpus_per_node)
        counts = within + node_ladder(other, 1, max_gpus=MAX_SUGGESTED_GPUS)
        return self._fewest("other_gpu", other, counts, budget, training)

    def _fewest(
        self,
        kind: str,
        cluster: ClusterSpec,
        counts: tuple[int, ...],
        budget: Budget,
        training: TrainingSpec | None = None,
    ) -> list[Suggestion]:
        training = training or self.training
        if not counts:
            raise NoFit(
                f"{cluster.gpu.name}: more GPUs than the {MAX_SUGGESTED_GPUS:,} a suggestion proposes"
            )
        # runs calibrate their own hardware (its GPU, nodes and GPUs per node: planning.calibration's
        # hardware key), which more or other GPUs are not: an H100's memory factor sized an H200 (and a
        # 2-GPU) suggestion that its own estimate then refused (change reviews)
        constraints = dataclasses.replace(self.constraints, memory_dynamic_factors=())
        # the cheap bound: not even the model states fit on the most GPUs tried
        unfit = states_unfit(self.model, cluster, training, self.tuning, constraints, counts[-1])
        if unfit is not None:
            raise NoFit(f"{cluster.gpu.name}: {unfit}")
        fewest = fewest_gpus(self.model, cluster, training, constraints, self.tuning, counts, budget)
        found = fewest.found
        if found is None and fewest.unfit is not None:
            raise NoFit(f"{cluster.gpu.name}: {fewest.unfit}")
        if found is None:
            unsharded = fsdp1_qlora_unfit(self.model, cluster, training, constraints, counts[-1])
            if unsharded is not None:  # the rule, not the count, stops it: said first
                raise NoFit(f"{cluster.gpu.name}: {unsharded}")
            runs_fewer = data_parallel_ceiling(self.model, cluster, training, constraints, counts[-1])
            if runs_fewer is not None:
                raise NoFit(f"{cluster.gpu.name}: {runs_fewer}")
            raise NoFit(f"{cluster.gpu.name}: no layout fits on up to {counts[-1]:,} GPUs")
        gpus, tokens_per_s, layout = found
        per_node = cluster.gpus_per_node
        nodes = max(1, gpus // per_node)
        network = cluster.inter_node_bandwidth_bytes_per_s if nodes > 1 else None
        across = f", {network / 1e9:g} GB/s per GPU between nodes" if network else ""
        host = None
        if _offloads(layout):  # the host RAM it takes, said and stated: the suggestion needs it
            placed = with_gpu(cluster, cluster.gpu, nodes, min(per_node, gpus))
            memory = estimate(self.model, placed, layout, training, tuning=self.tuning).memory
            host = memory.cpu_per_node_bytes
        offloading = f", offloading to {gib_needed(host)} GiB of host RAM per node" if host else ""
        # more GPUs than the request allows: said, not silently past it (bounded-work review)
        cap = self.constraints.max_gpus
        past = f", past constraints.max_gpus {cap}: raise it" if cap is not None and gpus > cap else ""
        # another GPU's precision and attention: the request's where it stated them, else that GPU's
        # own defaults (defaults.for_gpu), which the numbers depend on (determinism review)
        attention = training.attention.value if training.attention else "the model's"
        timed = f" ({training.precision.value}, {attention} attention)" if kind == "other_gpu" else ""
        assumed = ""
        if kind == "other_gpu" and not fitted_die(self.tuning, cluster.gpu):
            # as its own plan's warning says (caveats.gpu_chip_warnings): its speed is an assumption
            die = cluster.gpu.chip or "its die"
            assumed = f" ({die}'s efficiency is not fitted on a measured run: its speed is assumed)"
        return [
            Suggestion(
                kind=kind,
                detail=f"{gpus} x {cluster.gpu.name} ({cluster.gpu.memory_bytes / GiB:.0f} GiB; {nodes} node"
                f"{'s' if nodes > 1 else ''} of {min(per_node, gpus)}{across}) fit: "
                f"{tokens_per_s:,.0f} tokens/s{timed} with {_layout_words(layout)}{offloading}{past}"
                + assumed,
                gpu=cluster.gpu.name,
                num_gpus=gpus,
                num_nodes=nodes,
                gpus_per_node=min(per_node, gpus),
                inter_node_bandwidth_bytes_per_s=network,
                cpu_per_node_bytes=host or None,
                tokens_per_s=tokens_per_s,
                layout=layout,
            )
        ]


# The most GPUs a suggestion proposes: beyond the largest published training runs' scale
# (Llama 3 405B: 16,384 H100, arXiv:2407.21783 Table 4) a "fit" is not advice.
MAX_SUGGESTED_GPUS = 32_768


def _offloads(layout: Layout) -> bool:
    return (
        layout.offload_optimizer is not Offload.NONE
        or layout.offload_params is not Offload.NONE
        or layout.activation_offload
    )


def _layout_words(layout: Layout) -> str:
    degrees = " ".join(
        f"{name}{getattr(layout, name)}"
        for name in ("dp", "tp", "pp", "cp", "ep")
        if getattr(layout, name) > 1
    )
    zero = f" ZeRO-{layout.zero_stage}" if layout.zero_stage else ""
    return f"{layout.framework.value} {degrees or 'one GPU'}{zero}, micro-batch {layout.micro_batch_size}"


def _tokens_per_s(found: Candidate) -> float | None:
    return found.estimate.time.tokens_per_s if found.estimate.time else None


def _speed(found: Candidate) -> str:
    tokens_per_s = _tokens_per_s(found)
    return f"{tokens_per_s:,.0f} tokens/s" if tokens_per_s is not None else "untimed"


def _on_the_gpus_given(
    kind: str, what: str, cluster: ClusterSpec, found: Candidate, training: TrainingSpec
) -> Suggestion:
    """A change that fits on the cluster as given, with its plan's memory and tokens/s."""
    est = found.estimate
    used, given = found.layout.world_size, cluster.world_size
    where = (
        ("the GPU given" if given == 1 else f"the {given} GPUs given")
        if used == given
        else f"{used} of the {given} GPUs given"
    )
    host = est.memory.cpu_per_node_bytes  # within the nodes' allowance: the search kept it there
    # an offloading layout's host RAM, said where the change named is not the offload itself
    offloading = (
        f", offloading to {gib_needed(host)} GiB of host RAM per node"
        if host and kind != "offload" and _offloads(found.layout)
        else ""
    )
    return Suggestion(
        kind=kind,
        detail=f"{what} fits on {where}: "
        f"{est.memory.per_gpu.total / GiB:.1f} GiB per GPU, {_speed(found)} with "
        f"{_layout_words(found.layout)}{offloading}",
        gpu=cluster.gpu.name,
        num_gpus=found.layout.world_size,
        num_nodes=max(1, found.layout.world_size // cluster.gpus_per_node),
        gpus_per_node=min(cluster.gpus_per_node, found.layout.world_size),
        per_gpu_bytes=est.memory.per_gpu.total,
        cpu_per_node_bytes=host or None,
        tokens_per_s=_tokens_per_s(found),
        layout=found.layout,
        method=training.method.value,
        seq_len=training.seq_len,
        base_dtype=None if training.method is Method.FULL else training.base_dtype.value,
        on_the_gpus_given=True,
    )


# what the request's objective made the best offload: beside a suggestion that needs less host RAM,
# the cheapest per token read "the fastest offload, 2,552 tokens/s" next to 4,734 (rationale review)
BEST_OFFLOAD_WORDS = {
    Objective.THROUGHPUT: "the fastest offload",
    Objective.FEWEST_GPUS: "the offload on the fewest GPUs",
    Objective.COST: "the cheapest offload per token",
    Objective.TIME_TO_TRAIN: "the offload quickest to train",
}


def _best_offload(best: Candidate | None, objective: Objective) -> str:
    """What the best offload by the request's objective needs, beside a suggestion that needs less
    host RAM."""
    if best is None:
        return ""
    # as the suggestion beside it states its own: what a node must state (host_to_state), not the need
    # (a node stating the need got nothing: change review)
    host = host_to_state(best.estimate.memory.cpu_per_node_bytes)
    return (
        f" ({BEST_OFFLOAD_WORDS[objective]}, {_speed(best)} with {_layout_words(best.layout)}, with "
        f"{host // GiB} GiB host RAM per node)"
    )


def _nvme_words(nvme_bytes: int, cluster: ClusterSpec) -> str:
    """The NVMe per node an offload suggestion's layout writes to, where it writes any."""
    if not nvme_bytes:
        return ""
    stated = cluster.nvme_bytes_per_node
    have = f"the nodes state {stated / GiB:.0f} GiB" if stated else "NVMe not stated"
    return f" and {gib_needed(nvme_bytes)} GiB of NVMe per node ({have})"
