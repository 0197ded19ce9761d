"""Recommend layouts for a job: search the valid ones, keep those that fit, rank by an objective.

``recommend(model, cluster, training, constraints, tuning)`` searches, for each GPU count the
objective needs, every ``space.Structure`` x framework sharding (``FRAMEWORK_CAPABILITIES``) x
interleaving x recompute, and for each the micro-batches that fit (binary search: memory grows with
the micro-batch). Each GPU count is one estimator ``Job``; the memory and time of each candidate are
the estimator's own (``estimator.evaluate``: plain numbers to decide fit and rank, result objects
only for the layouts returned), and what is returned is its ``estimate``. Families that cannot fit at
micro-batch 1 are cut before any time is computed; more recompute is only tried when it allows a
larger micro-batch, offload only where its twin without offload does not fit (a lighter recompute or a
larger micro-batch than that twin's). The search's budget counts layout
evaluations, so its answer depends on the request alone. A pure library, like the estimator.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

from service.estimator import evaluate
from service.estimator.activations import CHUNKED_LOSS_CHUNKS
from service.estimator.calibration import Calibration
from service.estimator.defaults import for_gpu
from service.estimator.errors import EstimatorError, InvalidTraining
from service.estimator.estimate import estimate_valid
from service.estimator.job import Job, make_job, shared_memory_memos
from service.estimator.memory import (
    gradients_follow_activations,
    most_model_states_bytes,
    stage_activations,
    stage_states,
)
from service.estimator.pipeline import stage_layers
from service.estimator.tuning import Tuning
from service.estimator.types import (
    ClusterSpec,
    Compile,
    Estimate,
    Framework,
    GPUSpec,
    Head,
    Layout,
    Method,
    ModelSpec,
    MoeDispatcher,
    Offload,
    Plan,
    Recompute,
    TimeBreakdown,
    TimeEstimate,
    TrainingSpec,
    step_total_s,
)
from service.estimator.validate import (
    FRAMEWORK_CAPABILITIES,
    Violation,
    flex_dispatcher_hardware,
    hardware_violation,
    layout_violation,
    moe_a2a_overlap_violation,
    moe_dispatcher_violation,
    training_violation,
    valid_micro_batch_sizes,
    validate_layout,
)
from service.frameworks import FRAMEWORKS, sequence_parallel_default
from service.launchers import (
    Target,
    data_parallel_only,
    framework_job_refusal,
    framework_structure_refusal,
    runnable_targets,
)
from service.launchers.torchtitan import job_refusal as torchtitan_job_refusal
from service.recommender import headroom, rank
from service.recommender.budget import Budget
from service.recommender.collector import fewer_collections
from service.recommender.runnable import framework_refusal
from service.recommender.space import (
    MegatronLmSwitches,
    OffloadDevices,
    RejectionLog,
    Sharding,
    Structure,
    Unsupported,
    data_parallel_split,
    gpu_counts,
    largest_world,
    least_bytes_per_gpu,
    least_state_bytes,
    make_layout,
    max_cp,
    megatron_lm_switches,
    micro_batch_sizes,
    offload_devices,
    recompute_order,
    search_compile,
    sharded_example,
    shardings,
    structures,
    sub_cluster,
    virtual_stages,
)
from service.recommender.types import (
    Candidate,
    Constraints,
    Objective,
    Recommendation,
    Rejection,
    SearchStats,
    Skipped,
)

__all__ = ["Constraints", "Objective", "Recommendation", "recommend", "search"]

MAX_MICRO_BATCHES_TIMED = 4  # with pp > 1, the largest few micro-batches that fit are timed
MEMORY_REJECTION = "does not fit in GPU memory"
SEARCH_TIME_FRACTION = 0.7  # of a request's time, the most its main search takes when it may suggest


@dataclass(frozen=True, slots=True)
class Scored:
    """A layout the search keeps (the best of its family so far) and its sort key. Most are
    replaced or never shown: the step's breakdown is built only when asked (``time``)."""

    layout: Layout
    job: Job
    key: tuple[float, ...]
    tokens_per_s: float

    @property
    def time(self) -> TimeEstimate:
        return evaluate.time_estimate(self.job, self.layout)


@dataclass(slots=True)
class SearchResult:
    """Best candidate per family, what was rejected and how much work it took."""

    best: dict[tuple[object, ...], Scored] = field(default_factory=dict)
    log: RejectionLog = field(default_factory=RejectionLog)
    jobs: dict[int, Job] = field(default_factory=dict)  # one per GPU count searched
    families: int = 0
    candidates: int = 0
    memory_evaluations: int = 0
    time_evaluations: int = 0
    truncated: bool = False
    valid_structures: int = 0
    # why the GPU counts above the one searched last gave no layout (the throughput objective's fallback)
    idle_reason: str | None = None
    # per count searched, the leanest layout that fits (``_viable_structures``): kept if the budget
    # cuts the search before it keeps any other
    fallbacks: list[tuple[Job, Layout]] = field(default_factory=list)
    # of ``evaluations``, those already charged to a budget (by an earlier search into this result,
    # or a probe's whose work was added): a search's budget checks count only the rest
    charged: int = 0

    _threshold: tuple[float, ...] | None = None  # the k-th best key's objective part, until best changes
    # per GPU count, the best layout kept on it (``_admission_key``)
    leaders: dict[int, Scored] = field(default_factory=dict)
    # the largest micro-batch index that fits without offload, by family (structure, sharding,
    # interleaving, TP overlap) and recompute (-1: none): what an offloaded twin family can only add to
    plain_tops: dict[tuple[object, ...], dict[Recompute, int]] = field(default_factory=dict)
    # the families without offload (structure, sharding, interleaving) that ``_dominated`` cut: their
    # offloaded twins, no faster, are cut unevaluated
    dominated_plain: set[tuple[object, ...]] = field(default_factory=set)
    # the memory factor each layout is fitted under (``Constraints.dynamic_factor``; set by ``search``)
    dynamic_factor: Callable[[Layout], float] = field(default=lambda layout: 1.0)

    def ranked(self, objective: Objective | None = None) -> list[Scored]:
        """Best first by ``rank.sort_key``; with the ``objective``, the first is the layout with the
        fewest model-parallel degrees of those within ``rank.NEAR_TIE_FRACTION`` of the best on it
        (``rank.near_tie_winner``), the others in their order. What is recommended ranks with it."""
        ordered = sorted(self.best.values(), key=lambda s: s.key)
        if not ordered or objective is None:
            return ordered
        first = rank.near_tie_winner(objective, [(s.layout, s.tokens_per_s) for s in ordered])
        return [ordered[first], *ordered[:first], *ordered[first + 1 :]]

    def keep(self, family: tuple[object, ...], scored: Scored) -> None:
        self.best[family] = scored
        self._threshold = None
        gpus = scored.layout.world_size
        if gpus not in self.leaders or scored.key < self.leaders[gpus].key:
            self.leaders[gpus] = scored

    def threshold(self, top_k: int) -> tuple[float, ...]:
        """The objective part (first two entries) of the ``top_k``-th best key; needs k held."""
        if self._threshold is None:
            self._threshold = heapq.nsmallest(top_k, (h.key for h in self.best.values()))[-1][:2]
        return self._threshold

    @property
    def evaluations(self) -> int:
        return self.memory_evaluations + self.time_evaluations

    @property
    def uncharged(self) -> int:
        """The evaluations no budget has been charged with yet: those of the search under way (a
        search into a result that held earlier work checked its budget against all of it, charged
        already, and stopped early: ``_fewer_if_faster``, a first fit's fewer GPUs)."""
        return self.evaluations - self.charged

    def add_charged(self, other: SearchResult) -> None:
        """Count ``other``'s work (a probe's, charged to the budget by its own search) in this result."""
        self.memory_evaluations += other.memory_evaluations
        self.time_evaluations += other.time_evaluations
        self.charged += other.evaluations

    def memory_numbers(self, job: Job, layout: Layout) -> tuple[int, int, int]:
        """``evaluate.memory_numbers`` under the stored runs' memory factor of the layout's family
        (``Constraints.dynamic_factor``), counted against the budget."""
        self.memory_evaluations += 1
        return evaluate.memory_numbers(job, layout, self.dynamic_factor(layout))

    def fits(self, job: Job, layout: Layout, limit: int) -> bool:
        return _numbers_fit(job, self.memory_numbers(job, layout), limit)

    def step_numbers(self, job: Job, layout: Layout) -> tuple[float, float]:
        """``evaluate.step_numbers``, counted against the budget."""
        self.time_evaluations += 1
        return evaluate.step_numbers(job, layout)

    def floor_s(self, job: Job, layout: Layout, most_micro_batches: int | None = None) -> float:
        """``evaluate.floor_s``, counted against the budget."""
        self.time_evaluations += 1
        return evaluate.floor_s(job, layout, most_micro_batches)

    def time_parts(self, job: Job, layout: Layout) -> tuple[float, ...]:
        """``evaluate.time_parts`` (the step's parts, without the estimate built of them), counted
        against the budget."""
        self.time_evaluations += 1
        return evaluate.time_parts(job, layout)


@dataclass(frozen=True, slots=True)
class _Search:
    """What one search is asked: the job's inputs, the constraints and where it may offload."""

    model: ModelSpec
    training: TrainingSpec
    constraints: Constraints
    tuning: Tuning
    offload: OffloadDevices
    budget: Budget
    # Megatron-LM's own switches where no requested launcher renders NVIDIA's recipe ones
    megatron_lm: MegatronLmSwitches | None = None
    # the caller reads the rejection log (``search``'s ``rejections``): every miss is evaluated
    rejections: bool = True
    # ``chunked`` by framework, asked for every structure of every count
    _chunked: dict[Framework, bool] = field(default_factory=dict, compare=False)

    @property
    def job(self) -> tuple[ModelSpec, TrainingSpec]:
        """The model and training every layout of the search trains (``space.shardings``' job)."""
        return self.model, self.training

    def shardings(self, job: Job, framework: Framework, s: Structure) -> tuple[list[Sharding], list[str]]:
        """``space.shardings`` of ``framework`` at ``s`` as this search asks it (its offload devices,
        compile, Megatron-LM switches and job), memoised with the job's memory parts: the lean check,
        the ceilings and the structure search each ask it, for every structure of every count, and
        the GPU types of a sweep ask the same. Callers read the lists, never change them."""
        if not data_parallel_split(s.tp, s.pp, s.cp, s.ep) and self.data_parallel_only(framework):
            # no layout of the split runs on a requested launcher (``launchers.data_parallel_only``):
            # none is built; a plan's search logs the split once, a climb (whose log nobody reads) not
            if not self.rejections:
                return [], []
            if not self.model.bidirectional:  # an encoder's split: space.shardings says why, below
                return [], [self.data_parallel_reason(framework)]
        compiled = self.compiled(framework)
        memo = job.memory_memos[_Search.shardings]  # the model and training are the memory inputs'
        # what space.shardings reads of the structure: whether etp is set, the degrees the launchers'
        # refusals read, and whether anything is data parallel
        split = (s.etp is None, s.tp, s.pp, s.cp, s.ep, s.dp * s.cp > 1)
        chunked = self.chunked(framework)
        key = (framework, split, self.offload, compiled, self.megatron_lm, chunked)
        found = memo.get(key)
        if found is None:
            found = memo[key] = shardings(
                framework, s, self.offload, compiled, self.megatron_lm, self.job, chunked
            )
        return cast(tuple[list[Sharding], list[str]], found)

    def chunked(self, framework: Framework) -> bool:
        found = self._chunked.get(framework)
        if found is None:
            found = self._chunked[framework] = self._chunks(framework)
        return found

    def _chunks(self, framework: Framework) -> bool:
        """Whether the search tries ``framework``'s layouts with a chunked loss too: torchtitan's
        ChunkedLossWrapper (``--loss.num_chunks``), which only it renders, where a requested launcher is
        torchtitan and it trains the job with its sequence in whole chunks (a plan used 4 GPUs for Llama
        3.1 8B at 16k tokens where 2 fit chunked; search optimality review). Its layouts are searched as
        offloaded ones are, where their twin without it does not fit (``Sharding.frees_memory``)."""
        return (
            Target.TORCHTITAN in FRAMEWORKS[framework].targets
            and (self.constraints.launchers is None or Target.TORCHTITAN in self.constraints.launchers)
            and self.model.head is Head.CAUSAL_LM
            # it frees memory where the vocabulary is at least the hidden size (every LLM's): its fp32
            # hidden-state gradient, 4h + 2h per token, against the plain loss's fp32 logits, 12 V at
            # its peak (activations.last_stage_extra_bytes, loss_workspace_bytes), so a lean layout
            # that misses with it misses without it (_lean_fit)
            and self.model.vocab_size >= self.model.hidden_size
            and self.training.seq_len % CHUNKED_LOSS_CHUNKS == 0
            and torchtitan_job_refusal(self.model, self.training) is None
        )

    def data_parallel_only(self, framework: Framework) -> bool:
        """``launchers.data_parallel_only`` of ``framework`` for this search's model and launchers."""
        return data_parallel_only(framework, self.model, self.constraints.launchers)

    def data_parallel_reason(self, framework: Framework) -> str:
        """Why a split with model parallelism is not searched for ``framework``: every requested
        launcher that runs it runs data parallelism only (those it names; the others do not run it)."""
        runs = FRAMEWORKS[framework].targets
        names = [t.value for t in self.constraints.launchers or () if t in runs]
        run = "runs" if len(names) == 1 else "run"
        launchers = ", ".join(names)
        what = f"{launchers} {run} data parallelism only"
        return f"no requested launcher runs {framework.value} at this split: {what}"

    def compiled(self, framework: Framework) -> Compile:
        """How the search compiles ``framework``'s layouts: model and loss where asked
        (``Constraints.torch_compile``; ``search`` refuses it with QLoRA) and modelled (FSDP)."""
        return search_compile(self.constraints.torch_compile, framework)


_UNSET = object()


def _violation(job: Job, layout: Layout) -> Violation:
    """``layout_violation`` of the job's model, cluster and training, memoised with the memory parts
    (``Job.memory_memos``): besides the model and training (in ``memory_inputs``), the rules read of
    the cluster only its GPU count and GPUs per node, and the GPU's precision and kernel support
    (``hardware_violation``), the same for every layout of the job, and, for the flex dispatcher
    only, the GPU's die and NVLink (``flex_dispatcher_hardware``), then part of the key. Where the GPU
    runs the job, the answer is then the same on every GPU type, and a sweep across them validates
    each layout once."""
    hardware = job.memos[_violation]
    if "gpu" not in hardware:
        hardware["gpu"] = hardware_violation(job.cluster, job.training)
    if hardware["gpu"] is not None:  # every layout breaks it, in the rule's order: not shared
        return layout_violation(job.model, job.cluster, layout, job.training)
    memo = job.memory_memos[_violation]
    key: tuple[object, ...] = (layout, job.cluster.world_size)
    if layout.moe_dispatcher is not MoeDispatcher.ALLTOALL:
        key = (*key, *flex_dispatcher_hardware(job.cluster))
    found = memo.get(key, _UNSET)
    if found is _UNSET:
        found = memo[key] = layout_violation(job.model, job.cluster, layout, job.training)
    return cast(Violation, found)


def _family_key(layout: Layout) -> tuple[object, ...]:
    return (
        layout.world_size,
        layout.framework,
        layout.tp,
        layout.pp,
        layout.cp,
        layout.ep,
        layout.zero_stage,
        layout.offload_optimizer,
        layout.offload_params,
    )


def _log_memory(
    result: SearchResult,
    cluster: ClusterSpec,
    layout: Layout,
    memory: tuple[int, int, int],
    limit: int,
    count: int,
    launched: tuple[_Search, Job] | None = None,
) -> None:
    """Log a miss. ``launched``: the search and job whose requested launchers the closest memory
    miss should prefer (a plan's search, which shows it); None where no example is read. A GPU miss
    that also needs more host RAM than the nodes state says both (an offloading 405B layout was "8.4
    GiB over" on the GPU while it needed 6 TiB of host RAM against 2 stated: an infeasible-jobs
    review)."""
    total, cpu, _ = memory  # evaluate.memory_numbers
    if total > limit:
        runs = None if launched is None else functools.partial(_launchable, *launched, layout)
        have = cluster.cpu_memory_bytes_per_node
        host = ""
        if have and cpu > headroom.allowed_host_bytes(have):
            allowed = headroom.allowed_host_bytes(have) / 2**30
            host = (
                f", and {rank.gib_needed(cpu)} GiB host RAM per node over the {allowed:.1f} GiB a plan "
                f"uses of the nodes' {have / 2**30:.1f}"
            )
        result.log.add_memory(MEMORY_REJECTION, count, layout, total, limit, runs=runs, also=host)
    else:
        have = cluster.cpu_memory_bytes_per_node
        if have and cpu > headroom.allowed_host_bytes(have):
            allowed = headroom.allowed_host_bytes(have) / 2**30
            detail = (
                f"needs {rank.gib_needed(cpu)} GiB host RAM per node, over the {allowed:.1f} GiB a plan uses "
                f"of the nodes' {have / 2**30:.1f} ({headroom.HOST_FRACTION:.0%} kept for the OS and the "
                "training processes)"
            )
            result.log.add("does not fit in host memory", count, layout, detail)
        else:  # the NVMe the nodes state (numbers_fit)
            nvme, stated = memory[2], cluster.nvme_bytes_per_node / 2**30
            detail = f"needs {rank.gib_needed(nvme)} GiB NVMe per node, over the nodes' {stated:.1f}"
            result.log.add("does not fit in NVMe", count, layout, detail)


def _search_memory_family(
    search: _Search,
    job: Job,
    result: SearchResult,
    family: tuple[Structure, Sharding, int],
    sizes: tuple[int, ...],
    limit: int,
    tp_overlap: bool = True,
) -> bool:
    """Every recompute mode of one family (structure, sharding, interleaving); True if any fits.

    Where the family overlaps TP communication by default (Megatron's userbuffers: 12 buffers of the
    micro-batch's tokens x hidden, 6 GiB per GPU for a 70B at 32k tokens) and a layout it could not
    fit (a recompute mode's first miss, or one layer fewer recomputed) would fit without the buffers,
    its twin with the overlap off is searched too, unless its bound cannot enter the top k: slower
    collectives may fit where the buffers do not (a review: Llama 3.1 70B at 32k tokens on 16 H100 had
    become infeasible when the buffers were counted, though tp 8 pp 2 with the overlap off fits at
    74.7 GiB)."""
    s, sh, virtual = family
    if not sizes:
        result.log.add(
            "invalid: virtual_pp",
            1,
            make_layout(
                s,
                sh,
                Recompute.NONE,
                virtual,
                1,
                job.cluster.gpu.tp_overlap_peer_access,
                seq_len=job.training.seq_len,
            ),
            "no micro-batch gives a multiple of pp micro-batches",
        )
        return False
    best_index, fitted = -1, False
    peer = job.cluster.gpu.tp_overlap_peer_access
    # the overlap-off twin is searched where a layout this family could not fit (the first miss of each
    # recompute mode, or one layer fewer recomputed) would fit without TE's userbuffers
    twin_may_fit = False
    tops = result.plain_tops.setdefault((s, sh.plain, virtual, tp_overlap), {})
    for recompute in recompute_order(sh.framework):
        # Megatron's block method: the memory freed may buy fewer recomputed layers at a micro-batch
        # the twin fits too (SmolLM2 1.7B at 16k tokens on an A100-40GB: 7 layers offloaded at 11,296
        # tokens/s where the twin recomputes 19 at 10,429; change review), so no twin bound applies
        partial = recompute is Recompute.FULL and FRAMEWORK_CAPABILITIES[sh.framework].partial_recompute
        if sh.frees_memory and not partial and tops.get(recompute) == len(sizes) - 1:
            # its plain twin fits every micro-batch at this recompute, no slower and without host RAM
            # or a chunked loss (_twin_fits)
            continue
        result.families += 1
        first = make_layout(
            s, sh, recompute, virtual, sizes[0], peer, tp_overlap, seq_len=job.training.seq_len
        )
        violation = _violation(job, first)
        if violation is not None:
            result.log.add(f"invalid: {violation.rule}", 1, first, str(violation))
            continue

        def sized(i: int, recompute: Recompute = recompute) -> Layout:
            return make_layout(
                s, sh, recompute, virtual, sizes[i], peer, tp_overlap, seq_len=job.training.seq_len
            )

        known = tops.get(recompute, -1) if sh.frees_memory and not partial else -1
        if known >= 0:
            # the twin without offload fits up to sizes[known], faster: only a larger micro-batch can gain
            if result.fits(job, sized(known + 1), limit):
                top = _largest_fitting(result, job, sized, len(sizes), limit, known + 1)
            else:
                top = _only_micro_batch_fitting(result, job, sized(len(sizes) - 1), len(sizes) - 1, limit)
                if top < 0:
                    continue
        elif _numbers_fit(job, memory := result.memory_numbers(job, first), limit):
            top = _largest_fitting(result, job, sized, len(sizes), limit)  # sizes[0] fits
            if tp_overlap and top < len(sizes) - 1:
                twin_may_fit = twin_may_fit or _fits_without_userbuffers(result, job, sized(top + 1), limit)
        else:
            twin_may_fit = twin_may_fit or (
                tp_overlap and _fits_without_userbuffers(result, job, first, limit)
            )
            # the one micro-batch of a step whose gradients follow its activations may fit where
            # the smallest, accumulating, does not (evaluate.largest_fitting)
            top = _only_micro_batch_fitting(result, job, sized(len(sizes) - 1), len(sizes) - 1, limit)
            if top < 0:
                if not sh.frees_memory:
                    tops[recompute] = -1
                _log_memory(result, job.cluster, first, memory, limit, 1, _shown(search, job))
                continue
        if not sh.frees_memory:
            tops[recompute] = top
        fitted = True
        if top <= best_index:
            continue  # more recompute without a larger micro-batch only costs time
        # time falls with the micro-batch but for the pipeline's bubble and an overlapped EP all-to-all
        # (evaluate.rising_ep_comm_s): there the largest that fits may not be the fastest
        single = s.pp == 1 and s.ep == 1
        timed = [top] if single else _micro_batches_timed(result, job, sized, top)
        if partial and top > 0:
            # recomputing only some layers, a smaller micro-batch leaves room to recompute fewer of them:
            # the smallest, and the few largest that fit, each at its fewest (Llama 3.1 8B at 1M tokens
            # on 64 H100s: micro-batch 1 recomputing 14 layers, 6% faster than micro-batch 2 recomputing
            # 28, was never timed; MoE review)
            window = range(max(0, top - MAX_MICRO_BATCHES_TIMED + 1), top + 1)
            timed = sorted({0, *window, *timed})
        refused = True  # every layout of this recompute timed here runs on no requested launcher
        for i in timed:
            layout = sized(i)
            if sh.frees_memory and not _may_enter_top(search, job, result, _plain_bound(layout)):
                # no faster than its plain twin without recompute (offload only adds time, a chunked loss
                # none), which cannot enter the top k: nor can this, whatever it recomputes
                refused = False
                continue
            if partial and _may_enter_top(
                search, job, result, dataclasses.replace(layout, recompute=Recompute.NONE)
            ):
                layout = _fewest_recomputed_layers(search, job, result, layout, limit)
                fewer = (
                    layout.recompute_num_layers or max(stage_layers(search.model.num_layers, layout))
                ) - 1
                if tp_overlap and fewer >= 1 and not twin_may_fit:
                    twin_may_fit = _fits_without_userbuffers(
                        result, job, dataclasses.replace(layout, recompute_num_layers=fewer), limit
                    )
            if sh.frees_memory and _twin_fits(result, job, layout, limit):
                # the same layout (as many layers recomputed) without offload or a chunked loss fits: as
                # fast or faster, needing no host RAM and running on more launchers, so this one only
                # shadows it among the alternatives (the 405B's runner-up was the winner plus CPU
                # offload once offload was searched beside layouts that fit)
                refused = False
                continue
            refused &= _time_candidate(search, job, result, layout)
            for twin in _dispatch_variants(search, job, layout)[1:]:
                # the overlapped all-to-all holds one more micro-batch in flight; flex its own buffers
                if _numbers_fit(job, result.memory_numbers(job, twin), limit):
                    refused &= _time_candidate(search, job, result, twin)
        if refused:
            continue  # it bounds nothing: the heavier recompute that follows may run at this size
        best_index = top
        if top == len(sizes) - 1:
            break
    if twin_may_fit and not _dominated(search, job, result, family, sizes, {}, tp_overlap=False):
        fitted |= _search_memory_family(search, job, result, family, sizes, limit, tp_overlap=False)
    return fitted


def _plain_bound(layout: Layout) -> Layout:
    """``layout``'s plain twin (``_twin_fits``) without recompute: at least as fast."""
    return dataclasses.replace(
        layout,
        recompute=Recompute.NONE,
        recompute_num_layers=None,
        offload_optimizer=Offload.NONE,
        offload_params=Offload.NONE,
        chunked_loss=False,
    )


def _numbers_fit(job: Job, numbers: tuple[int, int, int], limit: int) -> bool:
    """``evaluate.numbers_fit`` as a plan allows: within ``limit`` per GPU, and within the host RAM
    per node the headroom policy leaves of the nodes' (``headroom.allowed_host_bytes``): a plan never
    proposes what its estimate calls thin."""
    host = headroom.allowed_host_bytes(job.cluster.cpu_memory_bytes_per_node)
    return evaluate.numbers_fit(job.cluster, numbers, limit, host)


def _twin_fits(result: SearchResult, job: Job, layout: Layout, limit: int) -> bool:
    """Whether ``layout`` without its offloads and chunked loss fits (and is valid)."""
    twin = dataclasses.replace(
        layout, offload_optimizer=Offload.NONE, offload_params=Offload.NONE, chunked_loss=False
    )
    return _violation(job, twin) is None and result.fits(job, twin, limit)


def _fits_without_userbuffers(result: SearchResult, job: Job, layout: Layout, limit: int) -> bool:
    """Whether ``layout``, which does not fit, would with its TP communication exposed (its twin,
    evaluated as every layout is: no TE userbuffers). False where it overlaps none."""
    if not layout.tp_comm_overlap:
        return False
    return result.fits(job, dataclasses.replace(layout, tp_comm_overlap=False), limit)


def _micro_batches_timed(
    result: SearchResult, job: Job, sized: Callable[[int], Layout], top: int
) -> list[int]:
    """The micro-batch sizes (indices) a pipelined or expert-parallel family is timed at: its
    ``MAX_MICRO_BATCHES_TIMED`` largest that fit, and, below them, the fastest reached climbing from
    the smallest while the step gets faster (a deep pipeline's bubble can favour micro-batch 1 over
    every larger size: on H200 the largest four that fit, 3 to 8, were all slower than 1)."""
    window = list(range(max(0, top - MAX_MICRO_BATCHES_TIMED + 1), top + 1))
    if window[0] == 0:
        return window
    best, best_tokens_per_s = 0, result.step_numbers(job, sized(0))[1]
    while best + 1 < window[0]:
        tokens_per_s = result.step_numbers(job, sized(best + 1))[1]
        if tokens_per_s <= best_tokens_per_s:
            break
        best, best_tokens_per_s = best + 1, tokens_per_s
    return [best, *window]


def _overlapped(search: _Search, layout: Layout) -> Layout | None:
    """``layout`` with Megatron's EP all-to-all overlap, where its rules allow it (MoE, ep > 1,
    interleaved when pipelined, no full recompute); None elsewhere. It hides the all-to-alls under
    the other micro-batch's compute for one more micro-batch in flight: the search times both."""
    overlaps = FRAMEWORKS[layout.framework].capabilities.moe_a2a_overlap
    if not overlaps or layout.ep == 1 or search.model.moe is None or search.megatron_lm is not None:
        return None
    overlapped = dataclasses.replace(layout, moe_a2a_overlap=True)
    return (
        overlapped if moe_a2a_overlap_violation(search.model, overlapped, search.training) is None else None
    )


def _flexed(search: _Search, job: Job, layout: Layout) -> Layout | None:
    """``layout`` with Megatron's flex token dispatcher (HybridEP), where its rules allow it (Megatron,
    MoE, ep > 1, etp 1, Hopper or Blackwell GPUs on NVLink: ``moe_dispatcher_violation``); None
    elsewhere. Its dispatch is timed on its own links (``step_time.flex_dispatch_s``): the search
    times both (a Qwen3-235B plan on 64 H100s was limited by its all-to-all, flex 6% faster at the same
    memory; search optimality review)."""
    flex = FRAMEWORKS[layout.framework].capabilities.flex_dispatcher
    if not flex or layout.ep == 1 or search.model.moe is None or search.megatron_lm is not None:
        return None
    flexed = dataclasses.replace(layout, moe_dispatcher=MoeDispatcher.FLEX)
    return flexed if moe_dispatcher_violation(search.model, job.cluster, flexed) is None else None


def _dispatch_variants(
    search: _Search, job: Job, layout: Layout, least_exposed: bool = False
) -> list[Layout]:
    """``layout`` and its twins the search also times: with the EP all-to-all overlapped
    (``_overlapped``), with the flex dispatcher (``_flexed``), and with both where the rules allow.
    ``least_exposed``: only those a bound needs, the overlapped one in place of ``layout`` (the
    overlap only hides the all-to-all) and its flex twin."""
    overlapped = _overlapped(search, layout)
    if least_exposed:
        found = [overlapped or layout]
    else:
        found = [layout, *([overlapped] if overlapped is not None else [])]
    for base in list(found):
        flexed = _flexed(search, job, base)
        if flexed is not None and _violation(job, flexed) is None:
            found.append(flexed)
    return found


def _may_enter_top(search: _Search, job: Job, result: SearchResult, bound: Layout) -> bool:
    """Whether a layout as fast as ``bound`` would enter the current top k (a layout recomputing
    some of its layers is never faster than the same one recomputing none)."""
    top_k = search.constraints.top_k
    if len(result.best) < top_k:
        return True
    _, tokens_per_s = result.step_numbers(job, bound)
    degrees = rank.parallel_degrees(bound)
    return _admission_key(search, result, degrees, bound.world_size, tokens_per_s) <= result.threshold(top_k)


def _fewest_recomputed_layers(
    search: _Search, job: Job, result: SearchResult, layout: Layout, limit: int
) -> Layout:
    """``layout`` (full recompute, which fits) with the fewest layers of each stage recomputed that
    still fit (Megatron's block method): memory falls as more layers recompute, so a binary search."""
    most = max(stage_layers(search.model.num_layers, layout))

    def with_layers(n: int) -> Layout:
        return dataclasses.replace(layout, recompute_num_layers=n)

    def fits(n: int) -> bool:
        return result.fits(job, with_layers(n), limit)

    # every layer recomputing (n = most) is the layout itself, which fits
    fewest = evaluate.bisect_smallest(1, most, fits)
    return layout if fewest == most else with_layers(fewest)


def _largest_fitting(
    result: SearchResult, job: Job, sized: Callable[[int], Layout], count: int, limit: int, known_fit: int = 0
) -> int:
    """``evaluate.largest_fitting`` above ``known_fit`` (which fits), each layout it evaluates counted
    against the budget."""

    def counted(i: int) -> Layout:
        result.memory_evaluations += 1
        return sized(i)

    # the family's micro-batches share its framework and degrees: one memory factor
    factor = result.dynamic_factor(sized(0))
    host = headroom.allowed_host_bytes(job.cluster.cpu_memory_bytes_per_node)
    return evaluate.largest_fitting(
        job, counted, count, limit, factor, known_fit=known_fit, peek=sized, host_limit_bytes=host
    )


def _only_micro_batch_fitting(result: SearchResult, job: Job, layout: Layout, index: int, limit: int) -> int:
    """``index`` when ``layout`` (the family's largest micro-batch) is its step's only one, its
    gradients follow its activations and it fits; else -1."""
    if index == 0 or not gradients_follow_activations(job, layout):
        return -1
    return index if _numbers_fit(job, result.memory_numbers(job, layout), limit) else -1


def _time_candidate(search: _Search, job: Job, result: SearchResult, layout: Layout) -> bool:
    """Time ``layout`` and keep it where it enters its family's best; True when no requested
    launcher runs it (nor its fallback), so that it bounds nothing: a family's heavier recompute
    at the same micro-batch may still run (Accelerate's FSDP has no per-op checkpointing, which
    only torchtitan runs: a selective_op layout refused there hid the full-recompute one 20%
    faster than what was kept)."""
    result.candidates += 1
    _, tokens_per_s = result.step_numbers(job, layout)
    key = rank.sort_key(search.constraints.objective, layout, tokens_per_s)
    family = _family_key(layout)
    held = result.best.get(family)
    if held is not None and key >= held.key:
        return False
    # a layout that could be shown (the top k) must run as written; one that cannot reach the top k
    # now never will (the k-th key only improves), so its launchers are not asked
    top_k = search.constraints.top_k
    admitted = _admission_key(search, result, rank.parallel_degrees(layout), layout.world_size, tokens_per_s)
    shown = len(result.best) < top_k or admitted <= result.threshold(top_k)
    if shown and not _runs(search, job, result, layout):
        if layout.tp_comm_overlap:
            # only the torchtitan and megatron targets overlap TP: another launcher may run the layout
            # with its TP collectives exposed, at that (slower) time
            return _time_candidate(search, job, result, dataclasses.replace(layout, tp_comm_overlap=False))
        return True
    result.keep(family, Scored(layout, job, key, tokens_per_s))
    return False


def _admission_key(
    search: _Search, result: SearchResult, degrees: tuple[int, int, int, int], gpus: int, tokens_per_s: float
) -> tuple[float, ...]:
    """The key a layout of these model-parallel degrees (``rank.parallel_degrees``' order) and
    tokens/s is compared with the k-th best's by: its ``rank.hopeful_key`` where a near tie could
    recommend it over faster layouts (``rank.near_tie_winner``), else its ``rank.primary_key``. It
    cannot where a layout kept on as many GPUs is at least as good and has no more degrees: that
    one, or a faster one as simple, wins any near tie it would be in (kept layouts only improve)."""
    objective = search.constraints.objective
    key = rank.primary_key(objective, gpus, tokens_per_s)
    leader = result.leaders.get(gpus)
    if leader is not None and key >= leader.key[:2] and degrees >= rank.parallel_degrees(leader.layout):
        return key
    return rank.hopeful_key(objective, gpus, tokens_per_s)


NO_LAUNCHER = "no launcher runs it"


def _launchers(search: _Search, job: Job, layout: Layout) -> tuple[list[Target], dict[Target, str]]:
    """``launchers.runnable_targets`` of the layout among the requested ones, up to the first that
    runs it."""
    plan = Plan(model=search.model, cluster=job.cluster, training=search.training, layout=layout)
    return runnable_targets(plan, search.constraints.launchers, first_only=True)


def _launchable(search: _Search, job: Job, layout: Layout) -> bool:
    """Whether a requested launcher runs the layout (``_runs``, without logging why not)."""
    return bool(_launchers(search, job, layout)[0])


def _shown(search: _Search, job: Job) -> tuple[_Search, Job] | None:
    """``_log_memory``'s ``launched`` where the caller reads the rejection log's examples."""
    return (search, job) if search.rejections else None


def _runs(search: _Search, job: Job, result: SearchResult, layout: Layout) -> bool:
    """Whether a launcher of the layout's framework (of the requested ones) runs it: a plan is only
    worth proposing if it can be run as written. Asks each target's refusal, a predicate over the
    plan that renders nothing (tests/launchers/test_refusals.py holds it to what rendering does)."""
    runs, reasons = _launchers(search, job, layout)
    if not runs:
        detail = "; ".join(f"{target.value}: {reason}" for target, reason in reasons.items())
        result.log.add(
            NO_LAUNCHER, 1, layout, detail or "none of the requested launchers runs this framework"
        )
    return bool(runs)


# Micro-batch sizes by (interleaving, SP), and the ceiling keys by (framework, interleaving) of one
# structure (see _dominated).
Sizes = dict[tuple[int, bool], tuple[int, ...]]
Ceilings = dict[tuple[Framework, int], tuple[float, ...] | None]


def _sizes(job: Job, s: Structure, framework: Framework, virtual: int, sizes_of: Sizes) -> tuple[int, ...]:
    sp = sequence_parallel_default(framework, s.tp, s.cp, job.training.seq_len)
    if (virtual, sp) not in sizes_of:
        sizes_of[virtual, sp] = _micro_batches(job, s, virtual, sp, framework)
    return sizes_of[virtual, sp]


def _micro_batches(job: Job, s: Structure, virtual: int, sp: bool, framework: Framework) -> tuple[int, ...]:
    """``micro_batch_sizes`` of the job's training, memoised with the memory parts: they read of
    the job the training alone (in ``memory_inputs``) and of the structure its dp, tp and pp (the
    splits of a count that differ in cp or ep share them), and the lean check asks them once per
    framework of every structure, for every GPU type of a sweep."""
    memo = job.memory_memos[_micro_batches]
    # the pipeline schedule's rule: PyTorch's for FSDP (at pp > 1), Megatron's otherwise (the only
    # part the framework changes: schedule_batches_violation)
    key = (s.dp, s.tp, s.pp, virtual, sp, s.pp > 1 and framework is Framework.FSDP)
    found = memo.get(key)
    if found is None:
        found = memo[key] = micro_batch_sizes(job.training, s, virtual, sp, framework)
    return cast(tuple[int, ...], found)


def _structures(job: Job, cluster: ClusterSpec, gpus: int, log: RejectionLog) -> list[Structure]:
    """``structures`` of ``gpus`` GPUs, its rejections added to ``log``; memoised with the memory
    parts: the splits read the model, the training and the GPUs per node of ``cluster`` (keyed),
    the same for every GPU type of a sweep, which climbs through the same counts."""
    memo = job.memory_memos[_structures]
    key = (gpus, cluster.gpus_per_node)
    if key not in memo:
        own = RejectionLog()
        memo[key] = (list(structures(job.model, cluster, job.training, gpus, own)), own)
    found, rejected = memo[key]
    for reason, group in rejected.groups.items():  # as if each had been added here, in order
        log.add(reason, group.count, group.example, group.detail)
    return cast(list[Structure], found)


def _structure_ceilings(
    search: _Search, job: Job, result: SearchResult, s: Structure
) -> tuple[tuple[float, ...] | None, Sizes, Ceilings]:
    """The best ceiling key of any family of the structure (None: none can be bounded), with the
    sizes and ceilings it computed, which ``_search_structure`` then reuses."""
    sizes_of: Sizes = {}
    ceilings: Ceilings = {}
    for framework in search.constraints.frameworks:
        options, _ = search.shardings(job, framework, s)
        if not options:
            continue
        for virtual in virtual_stages(search.model, framework, s.pp):
            sizes = _sizes(job, s, framework, virtual, sizes_of)
            if sizes:
                most = search.training.global_batch_size // (s.dp * sizes[0])
                family = (s, options[0], virtual)
                ceilings[framework, virtual] = _ceiling_key(search, job, result, family, sizes[-1], most)
    keys = [key for key in ceilings.values() if key is not None]
    return (min(keys) if keys else None), sizes_of, ceilings


def _search_structure(
    search: _Search, job: Job, result: SearchResult, s: Structure, limit: int, known: tuple[Sizes, Ceilings]
) -> None:
    sizes_of, ceilings = known
    for framework in search.constraints.frameworks:
        options, unsupported = search.shardings(job, framework, s)
        _log_unsupported(job, result, s, framework, unsupported)
        virtuals = virtual_stages(search.model, framework, s.pp)
        # the interleavings where a plain sharding (no offload, no chunked loss) fitted its family's fastest
        # member: offload only frees memory (it adds host traffic and a host step), and so does a chunked
        # loss, so there they buy nothing; elsewhere
        # it may buy less recompute or a larger micro-batch (a 1B on one A100 recomputed everything at
        # 14,679 tokens/s where optimizer offload ran without recompute at 18,435; search optimality
        # review: offload was searched only where nothing fitted without it)
        roomy: set[int] = set()
        for sh in options:
            if sh.frees_memory and roomy.issuperset(virtuals):
                continue
            if _ceilings_lose(search, result, [ceilings.get((framework, v)) for v in virtuals]):
                result.log.groups[DOMINATED].count += len(virtuals)  # no sharding changes a ceiling
                continue
            probe = make_layout(
                s,
                sh,
                Recompute.FULL,
                1,
                1,
                job.cluster.gpu.tp_overlap_peer_access,
                seq_len=job.training.seq_len,
            )
            valid = _violation(job, probe) is None
            if valid and not _states_fit(job, probe, limit):  # an invalid one is logged as such below
                result.families += 1
                if search.rejections:  # evaluated for the log alone
                    numbers = result.memory_numbers(job, probe)
                    _log_memory(result, job.cluster, probe, numbers, limit, 1, (search, job))
                continue
            for virtual in virtuals:
                sizes = _sizes(job, s, framework, virtual, sizes_of)
                if sh.frees_memory and virtual in roomy:
                    continue
                plain = (s, sh.plain, virtual)
                if sh.frees_memory and plain in result.dominated_plain:
                    # offload only adds time to its twin's, a chunked loss none: the twin's bound lost
                    result.log.groups[DOMINATED].count += 1
                    continue
                if _dominated(search, job, result, (s, sh, virtual), sizes, ceilings):
                    if not sh.frees_memory:
                        result.dominated_plain.add(plain)
                    continue
                fitted = _search_memory_family(search, job, result, (s, sh, virtual), sizes, limit)
                if (
                    fitted
                    and not sh.frees_memory
                    and _fastest_fits(search, result, job, (s, sh, virtual), sizes, limit)
                ):
                    roomy.add(virtual)
                if search.budget.exhausted(result.uncharged):
                    result.truncated = True
                    return


def _fastest_fits(
    search: _Search,
    result: SearchResult,
    job: Job,
    family: tuple[Structure, Sharding, int],
    sizes: tuple[int, ...],
    limit: int,
) -> bool:
    """Whether the family's fastest member fits: its framework's fastest recompute at the largest
    micro-batch, with Megatron's EP all-to-all overlap where it applies (one more micro-batch in
    flight): no other member of its structure, offloaded or not, is faster for the memory it frees."""
    s, sh, virtual = family
    fastest = make_layout(
        s,
        sh,
        recompute_order(sh.framework)[0],
        virtual,
        sizes[-1],
        job.cluster.gpu.tp_overlap_peer_access,
        seq_len=job.training.seq_len,
    )
    if _violation(job, fastest) is not None:
        return False
    return all(result.fits(job, layout, limit) for layout in _dispatch_variants(search, job, fastest))


def _log_unsupported(
    job: Job, result: SearchResult, s: Structure, framework: Framework, unsupported: list[str]
) -> None:
    """Log why ``framework`` builds none of some shardings of ``s`` (``_Search.shardings``)."""
    for reason in unsupported:
        if reason in result.log.groups:
            result.log.groups[reason].count += 1  # the example is kept from the first
        else:
            stage = reason.zero_stage if isinstance(reason, Unsupported) else 0
            example = make_layout(
                s,
                Sharding(framework, stage),
                Recompute.NONE,
                1,
                1,
                job.cluster.gpu.tp_overlap_peer_access,
                seq_len=job.training.seq_len,
            )
            result.log.add(reason, 1, example, reason)


DOMINATED = "dominated: cannot beat the top k at any micro-batch"
PP_BUBBLE = [f.name for f in dataclasses.fields(TimeBreakdown)].index("pp_bubble_s")  # in time_parts
EP_COMM = [f.name for f in dataclasses.fields(TimeBreakdown)].index("ep_comm_s")
DP_COMM = [f.name for f in dataclasses.fields(TimeBreakdown)].index("dp_comm_exposed_s")
# Float slack on the floor below: its sum and ``step_s - pp_bubble_s`` round differently (~1e-15).
_FLOOR_SLACK = 1e-9


def _ceilings_lose(search: _Search, result: SearchResult, ceilings: list[tuple[float, ...] | None]) -> bool:
    """Whether every family of these ceilings is dominated (``_dominated``'s cheap test), once the
    first dominated family has been logged with its exact bound."""
    top_k = search.constraints.top_k
    if len(result.best) < top_k or DOMINATED not in result.log.groups:
        return False
    threshold = result.threshold(top_k)
    return all(ceiling is not None and ceiling > threshold for ceiling in ceilings)


def _dominated(
    search: _Search,
    job: Job,
    result: SearchResult,
    family: tuple[Structure, Sharding, int],
    sizes: tuple[int, ...],
    ceilings: Ceilings,
    tp_overlap: bool = True,
) -> bool:
    """True when even the most favourable micro-batch cannot beat the current top k (``tp_overlap``
    False: of the family's twin with its TP communication exposed, which the ceiling, of the default
    overlapped layouts, bounds too, being faster).

    Step time falls with the micro-batch (GEMM efficiency, fewer collectives) except the pipeline
    bubble and an overlapped EP all-to-all (``evaluate.rising_ep_comm_s``), and recompute only adds
    time: the time of the largest micro-batch without recompute, less those two, plus the least
    bubble any member has ((p-1)/(v m) of that time, m the most micro-batches, at the smallest
    micro-batch), bounds every member of the family from below (``tests/recommender/test_bounds.py``).

    Cheaper first, per (framework, interleaving) of the structure: ``ceilings`` holds the sort key of
    ``evaluate.floor_s``, the part of that bound no sharding changes (DP, offload and optimizer time
    are >= 0, and the key never gets larger with more tokens/s), or None when the optimistic layout
    is invalid (``shardings`` yields only what the framework allows, so the sharding does not change
    validity: ``tests/recommender/test_space.py`` checks it). Past the first family, one whose
    ceiling loses is counted without building its layout; the first is logged with its exact bound.
    """
    top_k = search.constraints.top_k
    if len(result.best) < top_k or not sizes:
        return False
    s, sh, virtual = family
    most = search.training.global_batch_size // (s.dp * sizes[0])  # micro-batches at the smallest
    if (sh.framework, virtual) not in ceilings:
        ceilings[sh.framework, virtual] = _ceiling_key(search, job, result, family, sizes[-1], most)
    ceiling = ceilings[sh.framework, virtual]
    if ceiling is None:
        return False
    threshold = result.threshold(top_k)
    if ceiling > threshold and DOMINATED in result.log.groups:
        result.log.groups[DOMINATED].count += 1
        return True
    peer = job.cluster.gpu.tp_overlap_peer_access
    plain = make_layout(
        s, sh, Recompute.NONE, virtual, sizes[-1], peer, tp_overlap, seq_len=job.training.seq_len
    )
    if _violation(job, plain) is not None:
        return False
    best_tokens_per_s, optimistic = 0.0, plain
    for variant in _dispatch_variants(search, job, plain, least_exposed=True):
        parts = result.time_parts(job, variant)
        least_bubble_s = result.floor_s(job, variant, most) - result.floor_s(job, variant)
        rising_s = evaluate.rising_ep_comm_s(variant, parts[EP_COMM])  # floor_s leaves it out too
        step_s = step_total_s(*parts) - parts[PP_BUBBLE] - rising_s + least_bubble_s
        if search.training.tokens_per_step / step_s > best_tokens_per_s:
            best_tokens_per_s, optimistic = search.training.tokens_per_step / step_s, variant
    if _admission_key(search, result, rank.parallel_degrees(s), s.gpus, best_tokens_per_s) <= threshold:
        return False
    result.log.add(
        DOMINATED,
        1,
        optimistic,
        f"at most {best_tokens_per_s:,.0f} tokens/s (micro-batch {sizes[-1]}, no recompute, least bubble)",
    )
    return True


def _ceiling_key(
    search: _Search,
    job: Job,
    result: SearchResult,
    family: tuple[Structure, Sharding, int],
    micro_batch: int,
    most_micro_batches: int,
) -> tuple[float, ...] | None:
    s, sh, virtual = family
    optimistic = make_layout(
        s,
        sh,
        Recompute.NONE,
        virtual,
        micro_batch,
        job.cluster.gpu.tp_overlap_peer_access,
        seq_len=job.training.seq_len,
    )
    if _violation(job, optimistic) is not None:
        return None
    variants = _dispatch_variants(search, job, optimistic, least_exposed=True)
    floor = min(result.floor_s(job, variant, most_micro_batches) for variant in variants)
    ceiling = search.training.tokens_per_step / (floor * (1 - _FLOOR_SLACK))
    return _admission_key(search, result, rank.parallel_degrees(s), s.gpus, ceiling)


def _states_fit(job: Job, layout: Layout, limit: int) -> bool:
    # model states and what the optimizer step allocates beside them (no activations, buffers or
    # overhead): the step moment's least, a lower bound on every rank's need, read off stage_states,
    # which the family's members then share (its temporaries read the sharding alone)
    for rank_states in stage_states(job, layout):
        states = rank_states.states
        if (
            states.parameters + states.gradients + states.optimizer_states + rank_states.optimizer_temporary
            > limit
        ):
            return False
    return True


def _states_exceed(job: Job, layout: Layout, limit: int) -> bool:
    """Whether the model states alone of ``layout``'s sharding exceed ``limit`` (``_states_fit``),
    computed without the buffers (``most_model_states_bytes``): the lean check asks it first, and
    most lean layouts of a fewest-GPU search miss on it, so ``stage_states`` is never built for
    them. False where they cannot be computed (a split the rules refuse; the caller asks them)."""
    try:
        return most_model_states_bytes(job, layout) > limit
    except EstimatorError:
        return False


def _count_can_fit(search: _Search, job: Job, gpus: int, limit: int, result: SearchResult) -> bool:
    """False when the model states alone, fully sharded over every GPU, exceed the limit (no offload)."""
    bound = least_state_bytes(job, search.constraints.frameworks, search.offload, gpus)
    if bound is None or bound[0] <= limit:
        return True
    need, framework = bound
    # the bound's layout: every state sharded over every GPU, as the framework can
    example = sharded_example(job, framework, gpus, recompute_order(framework)[-1])
    what = f"the model states alone, sharded over all {gpus} GPUs, need"
    result.log.add_memory(MEMORY_REJECTION, 1, example, need, limit, what)
    return False


def _climb_can_fit(search: _Search, job: Job, gpus: int, limit: int, result: SearchResult) -> bool:
    """False when ``space.least_bytes_per_gpu`` (the model states sharded over all ``gpus`` GPUs,
    plus, for a framework the requested launchers run data parallel only, the activations and
    buffers no GPU count shrinks) exceeds the limit: no layout a requested launcher runs on this
    many GPUs fits. Asked by a climb alone (a search whose log nobody reads: ``rejections``)."""
    if search.rejections:
        return True
    bound = least_bytes_per_gpu(
        job,
        search.constraints.frameworks,
        search.offload,
        gpus,
        search.constraints.launchers,
        search.constraints.torch_compile,
    )
    if bound is None:
        return True
    # stored runs that measured less dynamic memory than estimated (a factor below 1) lower the floor
    # of every layout: the bound stays one
    least_factor = min((factor for _, _, factor in search.constraints.memory_dynamic_factors), default=1.0)
    if bound.need_bytes - max(0.0, 1.0 - least_factor) * bound.dynamic_bytes <= limit:
        return True
    what = "the model states sharded over all GPUs, and what no data parallelism shrinks, need"
    result.log.add_memory(MEMORY_REJECTION, 1, bound.example, bound.need_bytes, limit, what)
    return False


def _viable_structures(
    search: _Search,
    job: Job,
    result: SearchResult,
    found: list[Structure],
    limit: int,
    every: bool,
    until_fit: bool = False,
) -> list[Structure]:
    """The structures of this GPU count that may hold a layout that fits. Each sharding's leanest
    member (the most recompute, no interleaving, the smallest micro-batch) is checked for memory
    alone, which no other member of its family needs less of: a count where none fits is cut before
    any step time is computed (the fewest-GPU searches climb through such counts), and its first
    lean layout that fits is kept as the count's fallback.

    ``every``: check each structure, and leave out (logged) those where none fits, so that no step
    floor is computed for them: worth it where memory is tight (a fewest-GPU search stops at the
    first count where anything fits, and there most structures fit nothing); a search of a count
    where most fit stops at the first, and the step floors prune the rest, which is cheaper.

    ``until_fit``: stop at the first structure whose lean layout fits (its job's entry in
    ``result.fallbacks``), returning the viable ones found and those not checked (still a superset of
    the viable structures, which ``_record_viable`` may keep); past a structure that may fit without
    a lean layout that fits (one broke a rule), go on: whether a layout fits is the question."""
    runnable = _runnable(search, job)
    viable: list[Structure] = []
    for i, s in enumerate(found):
        if search.budget.exhausted(result.uncharged):
            # cut: the structures not checked stay (unbounded); the search that follows stops at once
            result.truncated = True
            return viable + found[i:]
        may_fit, lean = _lean_fit(search, job, result, s, runnable, limit)
        if not may_fit:
            continue
        if lean is not None and not any(j is job for j, _ in result.fallbacks):
            result.fallbacks.append((job, lean))
        viable.append(s)
        if until_fit and lean is not None:
            return viable + found[i + 1 :]
        if not every and not until_fit:
            return found
    return viable


def _runnable(search: _Search, job: Job) -> tuple[Framework, ...]:
    """The frameworks that can train the job at all (LoRA on Megatron cannot): those the lean
    check bounds."""
    return tuple(
        framework
        for framework in search.constraints.frameworks
        if training_violation(
            search.model,
            job.cluster,
            Layout(framework=framework),
            search.training,
            FRAMEWORK_CAPABILITIES[framework],
        )
        is None
    )  # fmt: skip


LeanKey = tuple[object, ...]


def _lean_key(search: _Search, job: Job, cluster: ClusterSpec) -> LeanKey | None:
    """What the lean check of a count reads besides the memory inputs and the limit: the count and
    the GPUs per node (the splits, the validity rules), the frameworks it bounds, their shardings
    (offload devices, compile, Megatron-LM's switches) and the host RAM and NVMe the fit compares
    with. None where the GPU breaks a rule of the training (every layout is invalid: no bound)."""
    if hardware_violation(job.cluster, job.training) is not None:
        return None
    runnable = _runnable(search, job)
    return (
        job.cluster.world_size,
        cluster.gpus_per_node,
        runnable,
        # a climb builds no split of these but data parallel ones (``_Search.shardings``; a plan's
        # search builds them all, a record a climb may share: it narrows less)
        tuple(search.data_parallel_only(f) for f in runnable),
        search.offload,
        search.constraints.torch_compile,
        search.megatron_lm,
        job.cluster.cpu_memory_bytes_per_node,
        job.cluster.nvme_bytes_per_node,
        search.constraints.memory_dynamic_factors,  # the stored runs' memory factors the fits used
    )


def _narrowed(job: Job, key: LeanKey | None, limit: int, splits: list[Structure]) -> list[Structure]:
    """``splits`` less those a lean check of the same memory inputs and ``key`` found unable to fit
    under a limit at least ``limit`` (``_record_viable``): memory does not depend on the GPU
    (``memory_inputs``), validity is shared where the GPU breaks no rule (``_violation``), and each
    lean check only compares a need with the limit (``numbers_fit``, ``_leanest_states_exceed``),
    so under a smaller limit each of its checks fails again. The GPU types of a sweep, largest
    first, climb the same counts: a smaller card checks only what fitted a larger one."""
    if key is None:
        return splits
    known = [viable for above, viable in job.memory_memos[_narrowed].get(key, ()) if above >= limit]
    if not known:
        return splits
    # each record holds every structure that may fit under its limit (a complete check's viable ones,
    # or an early stop's with those it did not check): a structure must be in all of them
    viable = frozenset.intersection(*known)
    return [s for s in splits if s in viable]


def _record_viable(job: Job, key: LeanKey | None, limit: int, viable: list[Structure]) -> None:
    """Record the structures of a count that a complete lean check under ``limit`` left (every
    other structure of the count fits nothing under it): ``_narrowed``."""
    if key is not None:
        job.memory_memos[_narrowed].setdefault(key, []).append((limit, frozenset(viable)))


def _lean_fit(
    search: _Search, job: Job, result: SearchResult, s: Structure, runnable: tuple[Framework, ...], limit: int
) -> tuple[bool, Layout | None]:
    """Whether ``s`` may hold a layout that fits (``_viable_structures``), and the first of its lean
    layouts that fits; (True, None) where a lean layout breaks a rule before any fits (no bound:
    the family's other members may be valid). A structure that may not fit logs why a framework
    builds no sharding of it (a plan's search: ``_search_structure`` logs it for the others), so
    that an infeasible plan says which launcher kept a split from the search (the HF Trainer's data
    parallelism alone hid context parallelism at 128k tokens; long-context review)."""
    unbuilt: list[tuple[Framework, list[str]]] = []
    for framework in runnable:
        options, unsupported = search.shardings(job, framework, s)
        if unsupported and search.rejections:
            unbuilt.append((framework, unsupported))
        sp = sequence_parallel_default(framework, s.tp, s.cp, job.training.seq_len)
        sizes = _micro_batches(job, s, 1, sp, framework)
        if not options or not sizes:
            continue
        ordered = options[::-1]  # the most sharded and offloaded first: the likeliest to fit
        if search.chunked(framework):
            # each chunked-loss sharding needs less than its plain twin (_Search.chunked): the twins
            # would only miss again
            ordered = [sh for sh in ordered if sh.chunked_loss]
        for i, sh in enumerate(ordered):
            # no TP overlap: its buffers are memory the family's overlap-off twin does without
            lean = make_layout(
                s,
                sh,
                recompute_order(framework)[-1],
                1,
                sizes[0],
                job.cluster.gpu.tp_overlap_peer_access,
                False,
                seq_len=job.training.seq_len,
            )
            if not search.rejections and _states_exceed(job, lean, limit):
                # a miss only the log would hold: its model states alone exceed the limit, and so
                # do those of every member of its sharding, valid or not (states read the sharding
                # alone: memory.MODEL_STATE_FIELDS), so no rule need be asked first; what follows
                # its evaluation below, without the activations (_leanest_states_exceed's sum holds
                # these states, so it exceeds the limit where the ordering lets it bound)
                if i == 0 and _shards_most(ordered):
                    break
                continue
            if _violation(job, lean) is not None:
                return True, None
            memory = result.memory_numbers(job, lean)
            if _numbers_fit(job, memory, limit):
                return True, lean
            _log_memory(result, job.cluster, lean, memory, limit, 1, _shown(search, job))
            if i == 0 and _leanest_states_exceed(job, lean, ordered, limit):
                break  # no other sharding of the framework holds fewer model states
    for framework, unsupported in unbuilt:
        _log_unsupported(job, result, s, framework, unsupported)
    return False, None


def _shards_most(ordered: list[Sharding]) -> bool:
    """Whether the first sharding shards (ZeRO stage) and offloads at least as much as every other:
    then its model states per rank are the fewest any of them holds (each stage shards more, each
    offload moves more off the GPU)."""
    first = ordered[0]
    return not any(
        other.zero_stage > first.zero_stage
        or (other.offload_params is not Offload.NONE and first.offload_params is Offload.NONE)
        or (other.offload_optimizer is not Offload.NONE and first.offload_optimizer is Offload.NONE)
        for other in ordered[1:]
    )


def _leanest_states_exceed(job: Job, lean: Layout, ordered: list[Sharding], limit: int) -> bool:
    """Whether every sharding in ``ordered`` needs more than ``limit`` for this lean layout, from
    the first one's evaluation: where it shards most (``_shards_most``), its model states per rank
    are the fewest any of them holds, and the activations, their buffers and what lies outside the
    allocator (CUDA context, NCCL, userbuffers) are the same for all (``memory.ACTIVATION_FIELDS``
    hold no sharding). That sum on the most-loaded rank, less every buffer and the fragmentation the
    states add, bounds all of them."""
    if not _shards_most(ordered):
        return False
    ranks = zip(stage_states(job, lean), stage_activations(job, lean), strict=True)
    least = max(
        states.parameters + states.gradients + states.optimizer_states
        + acts.on_gpu_bytes + acts.buffers + acts.outside_allocator
        for states, acts in ranks
    )  # fmt: skip
    return least > limit


MAX_FALLBACKS_TIMED = 3


def _fall_back(search: _Search, result: SearchResult) -> None:
    """A search the budget cut before it kept any layout keeps the leanest layout that fits, of
    the counts it reached (a slow layout that runs beats no answer; ``truncated`` says the search
    did not finish). A few evaluations past the budget, at most ``MAX_FALLBACKS_TIMED``."""
    for job, layout in result.fallbacks[:MAX_FALLBACKS_TIMED]:
        if result.best:
            return
        _time_candidate(search, job, result, layout)


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
    counts: tuple[int, ...],
    *,
    stop_at_first_fit: bool = False,
    budget: Budget | None = None,
    rejections: bool = True,
    into: SearchResult | None = None,
    probe: bool = False,
    lean_first: bool = False,
) -> SearchResult:
    """Search over the given GPU counts (in order), within ``budget`` (default: a budget of
    ``constraints.max_evaluations``), which is charged with what the search spent.

    ``probe``: only whether a count may hold a layout that fits: its structures' lean checks, up to
    the first that fits (kept in ``fallbacks``), and no structure searched (``first_fit_between``).
    ``lean_first`` (with ``stop_at_first_fit``): the climb stops, unsearched, at the first count where
    a lean layout fits (its job's entry in ``fallbacks``), which the caller bisects below before any
    count is searched in full (``fewest_count``); a count whose structures may fit though no lean
    layout of them does (one broke a rule) is searched as without it.

    ``rejections=False``: the caller reads of the result only what it keeps (``best``, the work,
    ``truncated``), not its rejection log, so a count known to fit nothing is skipped unlogged
    (``_narrowed``: a structure is not checked where a larger card of the same memory inputs
    found it fitting nothing). ``into``: a result to search on into, whose top k bounds these counts."""
    training = for_gpu(training, cluster.gpu, model)  # what the request left to the hardware, for this GPU
    budget = budget or Budget(constraints.max_evaluations)
    climbed: Iterable[int] = counts
    if stop_at_first_fit and not probe:
        climbed = _with_splits(model, cluster, training, counts, constraints.frameworks, budget)
    result = into if into is not None else SearchResult()
    result.dynamic_factor = constraints.dynamic_factor
    try:
        with shared_memory_memos():  # or the caller's: a sweep over GPU types asks the same layouts
            _search_counts(
                model, cluster, training, constraints, tuning, climbed, stop_at_first_fit, budget, result,
                rejections, probe, lean_first,
            )  # fmt: skip
    finally:
        budget.charge(result.uncharged)
        result.charged = result.evaluations
    return result


def _search_counts(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
    counts: Iterable[int],
    stop_at_first_fit: bool,
    budget: Budget,
    result: SearchResult,
    rejections: bool,
    probe: bool = False,
    lean_first: bool = False,
) -> None:
    if constraints.torch_compile and training.method is Method.QLORA:
        raise InvalidTraining(
            "torch_compile with qlora: bitsandbytes' NF4 matmuls break the compiled graph (not modelled)",
            field="constraints.torch_compile",
            rule="torch_compile",
        )
    launchable = _launchable_frameworks(model, cluster.gpu, training, constraints, result)
    if launchable is None:
        return  # no requested framework runs this model: nothing to search, the log says why
    constraints = launchable
    request = _Search(
        model,
        training,
        constraints,
        tuning,
        offload_devices(constraints.allow_offload, cluster),
        budget,
        megatron_lm_switches(constraints.launchers, training.precision),
        rejections,
    )
    largest = largest_world(model, cluster, training)
    for gpus in counts:
        if budget.exhausted(result.uncharged):
            result.truncated = True
            break
        if gpus > largest:  # the cheap bound: no split uses this many GPUs, so none is built
            detail = (
                f"{gpus} GPUs: no split of this job uses more than {largest:,} (dp <= global batch "
                f"{training.global_batch_size}, tp <= a node, pp <= layers + 2, "
                f"cp <= {max_cp(training.seq_len)} and "
                f"seq_len / 2{'; qlora: tp = pp = 1' if training.method is Method.QLORA else ''})"
            )
            result.log.add("invalid: past_every_split", 1, Layout(dp=gpus), detail)
            continue
        job = make_job(model, sub_cluster(cluster, gpus), training, tuning)
        result.jobs[gpus] = job
        limit = headroom.allowed_bytes(job.cluster.gpu.memory_bytes, constraints.min_headroom_fraction)
        before = len(result.best)
        if not _count_can_fit(request, job, gpus, limit, result):
            continue
        if not _climb_can_fit(request, job, gpus, limit, result):
            continue
        splits = _structures(job, cluster, gpus, result.log)
        lean = _lean_key(request, job, cluster)
        if not rejections:  # a structure known to fit nothing would only be logged
            splits = _narrowed(job, lean, limit, splits)
        until_fit = probe or lean_first  # whether a lean layout fits: the first that does answers
        found = _viable_structures(
            request, job, result, splits, limit, every=stop_at_first_fit and not probe, until_fit=until_fit
        )
        lean_fits = until_fit and any(j is job for j, _ in result.fallbacks)
        if (stop_at_first_fit or until_fit or not found) and not result.truncated:
            # each structure checked, or (until_fit) those not checked kept with the viable ones
            _record_viable(job, lean, limit, found)
        if not found or probe:
            continue
        if lean_fits:
            return  # a lean layout fits: the caller bisects below this count before searching one
        if not _search_count(request, job, result, found, limit):
            break
        if stop_at_first_fit and len(result.best) > before:
            return
    if result.truncated and not result.best:
        _fall_back(request, result)


def _launchable_frameworks(
    model: ModelSpec, gpu: GPUSpec, training: TrainingSpec, constraints: Constraints, result: SearchResult
) -> Constraints | None:
    """``constraints`` without the frameworks no requested target runs, or no target runs for this
    model and training on this GPU whatever the layout (``launchers.framework_job_refusal``:
    Megatron-LM's GPT model is not Llama 4, Gemma 2 or GPT-OSS, nor trained in TF32, nor on a GPU
    before Ampere), each logged once: their layouts would be evaluated, then refused one by one by
    every launcher (for a large MoE model, most of a search's evaluations). None when none is left."""
    kept = []
    requested = constraints.launchers
    for framework in constraints.frameworks:
        targets = FRAMEWORKS[framework].targets
        reason = framework_job_refusal(framework, model, training, gpu)
        adapters = training.method is not Method.FULL and not FRAMEWORK_CAPABILITIES[framework].peft
        if requested is not None and not set(targets) & set(requested):
            # none of the requested launchers runs the framework at all: its layouts were built,
            # evaluated and refused one by one ("none of the requested launchers runs this framework")
            what = f"no requested launcher runs {framework.value}"
            runs = ", ".join(t.value for t in targets)
            result.log.add(what, 1, Layout(framework=framework), f"{framework.value} runs on {runs}")
        elif reason is not None:
            what = f"no launcher runs {framework.value} for this model, training and GPU"
            result.log.add(what, 1, Layout(framework=framework), reason)
        elif adapters:
            # no split of it trains adapters: its splits were logged as launchers' refusals of one
            # parallel degree ("no launcher runs megatron at this split: qlora with cp=2"; search review)
            what = f"{framework.value} trains no {training.method.value}"
            detail = f"{training.method.value} needs PEFT adapters, which {framework.value} does not have"
            result.log.add(what, 1, Layout(framework=framework), detail)
        else:
            kept.append(framework)
    if len(kept) == len(constraints.frameworks):
        return constraints
    return dataclasses.replace(constraints, frameworks=tuple(kept)) if kept else None


CEILINGS_TIME_FRACTION = 0.5  # of the time left (and of the evaluations, under a stated cap) for ordering


def _search_count(
    search: _Search, job: Job, result: SearchResult, found: list[Structure], limit: int
) -> bool:
    """Every structure of one GPU count, the most promising first (their ceiling: the step without
    DP, offload and optimizer time, at the least bubble), so the top k fills early and bounds the
    rest; False when the budget cut it (``result.truncated``)."""
    # The ceilings take at most half of the time left: past it, the structures not yet bounded are
    # searched after the bounded ones, in their own order, their ceilings computed as they come (a
    # 2.5T-parameter MoE on 4,096 H100s spent its whole budget on 1,814 of 2,473 structures' ceilings,
    # searched none and answered a fallback 1,000x slower than the search finds; bounded-work review)
    # (of the evaluations left, where the request set its cap: Budget.split_by_evaluations; the
    # ceilings' evaluations are charged with the search's, so they are counted here as they come)
    ordering = search.budget.share(
        time_fraction=CEILINGS_TIME_FRACTION,
        evaluation_fraction=CEILINGS_TIME_FRACTION,
        pending=result.uncharged,
    )
    before = result.evaluations
    bounded: list[tuple[tuple[tuple[float, ...] | None, Sizes, Ceilings], int, Structure]] = []
    for i, s in enumerate(found):
        if search.budget.exhausted(result.uncharged):
            result.truncated = True
            return False
        if ordering.exhausted(result.evaluations - before):
            bounded.append(((None, {}, {}), i, s))
            continue
        bounded.append((_structure_ceilings(search, job, result, s), i, s))
    bounded.sort(key=lambda b: (b[0][0] is None, b[0][0] or (), b[1]))
    for (_, sizes_of, ceilings), _, s in bounded:
        result.valid_structures += 1
        _search_structure(search, job, result, s, limit, (sizes_of, ceilings))
        if result.truncated:
            return False
    return True


# ---------------------------------------------------------------- the recommendation


def _counts_for(cluster: ClusterSpec, constraints: Constraints) -> tuple[tuple[int, ...], bool]:
    """GPU counts to search, in order, and whether to stop at the first that fits."""
    counts = gpu_counts(cluster, constraints.max_gpus)
    if constraints.objective in (Objective.FEWEST_GPUS, Objective.COST):
        return counts, constraints.objective is Objective.FEWEST_GPUS
    return tuple(reversed(counts)), False


def _merge(found: SearchResult, more: SearchResult) -> None:
    found.best.update(more.best)
    found._threshold = None
    for gpus, leader in more.leaders.items():
        if gpus not in found.leaders or leader.key < found.leaders[gpus].key:
            found.leaders[gpus] = leader
    found.jobs.update(more.jobs)
    found.families += more.families
    found.candidates += more.candidates
    found.add_charged(more)
    found.truncated |= more.truncated


MAX_FIRST_FIT_PROBES = 5  # whole-node counts bisected between two ladder steps (up to 32 nodes apart)
# The whole-node counts below a ladder step with no split at all that a climb looks through for the
# largest with one (``_with_splits``)
MAX_SPLIT_SCAN = 16


def _has_split(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    gpus: int,
    frameworks: tuple[Framework, ...],
) -> bool:
    """Whether any split of ``gpus`` GPUs is valid (``structures`` yields one) and some of
    ``frameworks`` has a target that runs it (``framework_structure_refusal``): a data-parallel-only
    job (QLoRA: no target runs its context parallelism) splits only counts its global batch divides.
    The splits read the GPUs per node, not the GPU: every type of a capacity sweep asks the same
    (``_SPLITS``)."""
    key = (model, cluster.gpus_per_node, training, gpus, frameworks)
    found = _SPLITS.get(key)
    if found is None:
        if len(_SPLITS) >= MAX_SPLIT_MEMO:
            _SPLITS.clear()
        found = _SPLITS[key] = any(
            framework_structure_refusal(framework, model, training, s.tp, s.pp, s.cp, s.ep) is None
            for s in structures(model, cluster, training, gpus, RejectionLog())
            for framework in frameworks
        )
    return found


# whether a count has a split, by (model, GPUs per node, training, count): process-wide, bounded
MAX_SPLIT_MEMO = 4096
_SPLITS: dict[tuple[ModelSpec, int, TrainingSpec, int, tuple[Framework, ...]], bool] = {}


def _with_splits(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    counts: tuple[int, ...],
    frameworks: tuple[Framework, ...],
    budget: Budget,
) -> Iterator[int]:
    """A climb's ``counts``, each past one node that no split uses replaced by the largest whole-node
    count below it (and above the step before) that one does, where any within ``MAX_SPLIT_SCAN``
    nodes: past 16 nodes the ladder's 3-smooth steps may all miss the counts a batch splits over (QLoRA
    of 405B on L4s at a batch of 320: 18, 24, 27, 32, 36 nodes, none dividing it, answered 'no layout
    fits' where 20 nodes do; capacity review)."""
    gpn = cluster.gpus_per_node
    largest = largest_world(model, cluster, training)
    previous = 0
    for count in counts:  # lazily: a climb stops at its first fit
        if (
            count <= gpn
            or count % gpn
            or count > largest
            or _has_split(model, cluster, training, count, frameworks)
        ):
            yield count  # (past every split: logged so by the search, cheaply)
        else:
            low = max(previous // gpn, count // gpn - MAX_SPLIT_SCAN - 1)
            for nodes in range(count // gpn - 1, low, -1):
                if budget.exhausted():  # the scan is the request's work too (change review: 3 s)
                    break
                if _has_split(model, cluster, training, nodes * gpn, frameworks):
                    yield nodes * gpn
                    break
            else:
                yield count  # logged as the rules refuse it
        previous = count


def first_fit_between(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
    counts: tuple[int, ...],
    found: SearchResult,
    budget: Budget,
    rejections: bool = True,
) -> None:
    """The fewest GPUs a first-fit search found, among every whole-node count below it: past 16 nodes
    the ladder climbs 3-smooth node counts (16, 18, 24, 27, 32, ...), so the first that fits may be a
    quarter above the fewest (capacity-planner review: DeepSeek-V3 answered 24 nodes where 21 fit,
    faster and cheaper). The whole-node counts between the last step that fit nothing and the first
    that fits are bisected by lean checks alone (``fewest_between``), and the fewest found is
    searched into ``found``, within the budget."""
    ranked = found.ranked(Objective.FEWEST_GPUS)
    if not ranked or found.truncated:
        return
    fit = ranked[0].layout.world_size
    fewest = fewest_between(model, cluster, training, constraints, tuning, counts, fit, found, budget)
    if fewest < fit and not budget.exhausted():
        search(
            model, cluster, training, constraints, tuning, (fewest,), stop_at_first_fit=True,
            budget=budget, rejections=rejections, into=found,
        )  # fmt: skip


def fewest_count(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
    counts: tuple[int, ...],
    budget: Budget,
) -> SearchResult:
    """The fastest layout on the fewest of ``counts`` (and the whole-node counts between them) where
    one fits, for a caller that reads no rejection log (a capacity option). The climb checks each
    count's lean layouts and stops at the first where one fits, unsearched; the whole-node counts
    below it are bisected by lean checks (``fewest_between``), and only the count found is searched
    in full: a first-fit search followed by ``first_fit_between`` searched the ladder's count in full
    too, then the fewer GPUs it found (10 of DeepSeek-V3's 19 catalog options). The answer is the
    same: where the count found holds no layout that fits and runs after all (a lean layout fits but
    none is runnable), the climb goes on in full from the lean one, as a first-fit search does.
    Its searches share their memory memos, so each reads what the lean checks before it recorded
    (``_narrowed``)."""
    with shared_memory_memos():
        result = search(
            model, cluster, training, constraints, tuning, counts, stop_at_first_fit=True, budget=budget,
            rejections=False, lean_first=True,
        )  # fmt: skip
        if result.best or result.truncated or not result.fallbacks:
            first_fit_between(model, cluster, training, constraints, tuning, counts, result, budget, False)
            return result
        lean = result.fallbacks[-1][0].cluster.world_size  # the first count where a lean layout fits
        fewest = fewest_between(model, cluster, training, constraints, tuning, counts, lean, result, budget)
        # searched even where the probes spent the budget: cut at once, that search times the lean layout
        # that fits (``_fall_back``), a truncated fit where returning here answered none (review)
        search(
            model, cluster, training, constraints, tuning, (fewest,), stop_at_first_fit=True, budget=budget,
            rejections=False, into=result,
        )  # fmt: skip
        if result.best or result.truncated:
            return result
        # the lean count and those above it, searched in full as the first-fit climb would have
        rest = tuple(count for count in counts if count >= lean and count != fewest)
        search(
            model, cluster, training, constraints, tuning, rest, stop_at_first_fit=True, budget=budget,
            rejections=False, into=result,
        )  # fmt: skip
        first_fit_between(model, cluster, training, constraints, tuning, counts, result, budget, False)
        return result


def fewest_between(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
    counts: tuple[int, ...],
    fit: int,
    found: SearchResult,
    budget: Budget,
) -> int:
    """The fewest whole-node GPUs, between the last of ``counts`` below ``fit`` and ``fit``, where a
    lean layout fits (``fit`` itself where none below does, or the counts are not whole nodes): a
    bisection of lean checks alone (search(probe=True)), a fit taken to hold for more nodes, as the
    climb takes it; their work is added to ``found``."""
    gpn = cluster.gpus_per_node
    below = [count for count in counts if count < fit]
    if not below or fit % gpn or below[-1] % gpn:
        return fit
    lo, hi = below[-1] // gpn, fit // gpn  # nodes: lo fits nothing, hi fits
    # the node counts between that any split uses: a count none does fits nothing, and a bisection
    # over all of them took 21, 22 and 23 nodes (none dividing a QLoRA batch of 960) to say 24 where 20
    # fit (capacity review). A count without a split is dropped as the bisection meets it (within the
    # budget), so a job every count splits asks no more than its probes
    between = list(range(lo + 1, hi))
    trained = for_gpu(training, cluster.gpu, model)
    a, b = -1, len(between)  # indices: a fits nothing (lo), b fits (hi)
    probes = 0
    while b - a > 1 and probes < MAX_FIRST_FIT_PROBES and not budget.exhausted():
        mid = (a + b) // 2
        if not _has_split(model, cluster, trained, between[mid] * gpn, constraints.frameworks):
            # (every such count dropped: probed, one would move the bound past the splittable counts
            # below it; capped at 16 it answered 192 nodes where 168 fit: change review)
            del between[mid]
            b -= 1
            continue
        probes += 1
        probed = search(
            model, cluster, training, constraints, tuning, (between[mid] * gpn,), budget=budget,
            rejections=False, probe=True,
        )  # fmt: skip
        found.add_charged(probed)
        if any(job.cluster.world_size == between[mid] * gpn for job, _ in probed.fallbacks):
            b = mid
        else:
            a = mid
    return (between[b] if b < len(between) else hi) * gpn


def _run_search(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
    budget: Budget,
) -> SearchResult:
    counts, first_fit = _counts_for(cluster, constraints)
    if constraints.objective is Objective.COST:
        found = search(
            model, cluster, training, constraints, tuning, counts, stop_at_first_fit=True, budget=budget
        )
        if not found.best or found.truncated:
            return found
        # every larger count, within the budget: GPU-hours per token need not grow with the GPUs, nor
        # fall and rise once (a split that fits more per GPU runs faster per GPU; a batch that splits
        # over more data-parallel ranks). Four counts sampled at a fixed stride left a 7-node cluster's
        # own 56 out and answered 48 GPUs, $45k dearer and 506 days slower on a 15T-token 70B run, and
        # the answer moved with the cluster's size; no sample found Llama 3.1 405B's cheapest 512 H100s
        # on both 256 and 2,048 nodes (cost review)
        smallest = min(s.layout.world_size for s in found.best.values())
        larger = tuple(n for n in counts if n > smallest)
        _merge(found, search(model, cluster, training, constraints, tuning, larger, budget=budget))
        return found
    if first_fit:
        found = search(
            model, cluster, training, constraints, tuning, counts, stop_at_first_fit=True, budget=budget
        )
        first_fit_between(model, cluster, training, constraints, tuning, counts, found, budget)
        return found
    # throughput / time to train: all the GPUs allowed; fewer only if no layout of them fits and runs
    skipped: list[str] = []
    searched = 0  # counts with valid splits that were searched in full (invalid ones cost little)
    tried: list[SearchResult] = []  # each count's search, the most GPUs first
    work = SearchResult()  # the work of every count searched, which the answer reports
    for gpus in counts:
        result = search(model, cluster, training, constraints, tuning, (gpus,), budget=budget)
        tried.append(result)
        if result.best or result.truncated:
            if skipped:  # the largest count's reason, and how many more counts failed
                more = f"; nor {len(skipped) - 1} smaller counts" if len(skipped) > 1 else ""
                result.idle_reason = skipped[0] + more
            if result.best and not result.truncated:
                _fewer_if_faster(model, cluster, training, constraints, tuning, counts, gpus, result, budget)
            _add_work(work, result)  # with the fewer GPUs searched into it
            return _with_work(result, work)
        _add_work(work, result)
        common = max(result.log.groups.items(), key=lambda kv: kv[1].count, default=None)
        why = f"{common[0]}: {common[1].detail}" if common else "no structure"
        what = "valid split" if not result.valid_structures else "layout that fits and runs"
        skipped.append(f"no {what} of {gpus} GPUs ({why})")
        searched += 1 if result.valid_structures else 0
        if searched >= MAX_FALLBACK_COUNTS:
            break
    if not tried:
        return result
    # nothing fits on any count: the rejections and the closest miss of the most GPUs with a valid
    # split (all the GPUs allowed, unless none of their splits runs), with the reasons of the counts
    # above it, and the work of every count searched. Llama 3.1 70B at batch 16 on 32 H100s through
    # the HF Trainer (data parallel only: 16 GPUs at most) answered the 32 GPUs' invalid splits alone,
    # no memory miss and no closest layout, where 16 GPUs miss by 8.2 GiB (suggestions review)
    reported = next((r for r in tried if r.valid_structures or MEMORY_REJECTION in r.log.groups), tried[0])
    for above in tried[: tried.index(reported)]:
        for reason, group in above.log.groups.items():
            reported.log.add(reason, group.count, group.example, group.detail)
    return _with_work(reported, work)


MAX_RESHAPES = 6  # fewer-GPU steps tried after one that trained faster (each at most half the GPUs)


def _fewer_if_faster(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
    counts: tuple[int, ...],
    gpus: int,
    result: SearchResult,
    budget: Budget,
) -> None:
    """Search the fewer GPUs ``_better_shaped`` names into ``result``, and again below each count that
    trains faster, while one does (capacity-planner review: Llama 3.1 70B LoRA on 1,024 H100 NVLs
    stopped at 512 GPUs, 18,030 tokens/s, where 32 train at 20,412; at most ``MAX_RESHAPES`` steps);
    ``idle_reason`` says why fewer than all of them."""
    first = leader = result.ranked()[0]
    at, tried, reasons = gpus, {gpus}, []
    for _ in range(MAX_RESHAPES):
        shaped, why = _better_shaped(counts, at, cluster, training, leader, result)
        shaped = tuple(count for count in shaped if count not in tried)
        if not shaped or budget.exhausted(result.uncharged):
            break
        tried.update(shaped)
        search(model, cluster, training, constraints, tuning, shaped, budget=budget, into=result)
        best = result.ranked()[0]
        if best.layout.world_size >= at:
            break
        reasons.append(why)
        leader, at = best, best.layout.world_size
    if at < gpus:  # gpu_use says why not all of them
        # where ``gpus`` is already fewer than the cluster's, the reason its larger counts ran nothing
        # (``_run_search``) stays first: "than all 60" of a 70-GPU cluster hid why 70 had no split
        # (odd-clusters review)
        whole = "all " if gpus == cluster.world_size else ""
        faster = (
            f"{at} GPUs train faster ({leader.tokens_per_s:,.0f} tokens/s) than {whole}{gpus} "
            f"({first.tokens_per_s:,.0f}): {reasons[0]}"
        )
        result.idle_reason = f"{result.idle_reason}; and {faster}" if result.idle_reason else faster


def _better_shaped(
    counts: tuple[int, ...],
    gpus: int,
    cluster: ClusterSpec,
    training: TrainingSpec,
    leader: Scored,
    result: SearchResult,
) -> tuple[tuple[int, ...], str]:
    """Fewer GPUs than ``gpus`` that may train faster than all of them, and why, given the fastest
    layout of all of them (``leader``); the search of them starts from the top k found, so most of
    their families are cut by their ceilings.

    * The number of nodes does not divide the global batch: a factor of it the batch does not share
      is left to pp, cp or tp (136 H100s, 17 nodes, put Llama 3 8B at batch 256 on pp 17 at half the
      throughput of 128). The largest whole-node count below with a power-of-two number of nodes, and
      the largest whose number of nodes divides the global batch.
    * Every data-parallel rank already trains one sequence a step and the leader splits the model
      besides: the GPUs the batch cannot fill went to a split memory may not need (GPT-2 at batch 64 on
      128 GPUs: dp 64 tp 2, slower than dp 64 on 64: consistency review, stop 41). The largest count
      up to the batch's sequences is searched.
    * The leader's exposed data-parallel communication is half its step or more: on a slow network
      fewer replicas may step faster (gpt-oss-120b on 64 V100 nodes at 6.25 GB/s: slower than on 32).
    The last searches half the GPUs (the largest count up to it). ``result``: the search of all of
    them, which counts the leader's step parts it reads."""
    gpn = cluster.gpus_per_node
    if gpus <= 1:
        return (), ""
    smaller = [c for c in counts if c < gpus and (c % gpn == 0 or c < gpn)]
    found: set[int] = set()
    why = []
    if gpus > gpn and training.global_batch_size % (gpus // gpn):
        whole = [c for c in smaller if c % gpn == 0]
        two = [c for c in whole if (c // gpn) & (c // gpn - 1) == 0]
        batch = [c for c in whole if training.global_batch_size % (c // gpn) == 0]
        found |= {max(group) for group in (two, batch) if group}
        why.append(
            f"{gpus // gpn} nodes do not divide the global batch ({training.global_batch_size}), so data "
            "parallelism cannot span them all"
        )
    lo = leader.layout
    half = [c for c in smaller if c <= gpus // 2]
    filled = [c for c in smaller if c <= training.global_batch_size]
    if filled and lo.dp >= training.global_batch_size and lo.model_parallel_size > 1:
        # the most GPUs data parallelism alone fills: as many as the batch has sequences (half the GPUs
        # may still be padded with a split: GPT-2 at batch 16 on 64 GPUs, review of stop 41's first fix),
        # and half the GPUs, a split half as wide (Qwen3-30B-A3B at batch 512 on 2,048 V100s: dp 512 x
        # tp 4 x ep 2 steps slower than dp 512 x tp 2 x ep 4 on 1,024; capacity-planner review)
        found.add(max(filled))
        if half:
            found.add(max(half))
        why.append(
            f"the global batch ({training.global_batch_size}) gives each of the {lo.dp} data-parallel ranks "
            "one sequence, so the GPUs it cannot fill split the model instead"
        )
    elif half:
        parts = result.time_parts(leader.job, lo)  # counted: the search's own evaluation
        step_s, dp_s = step_total_s(*parts), parts[DP_COMM]
        if dp_s >= 0.5 * step_s:
            found.add(max(half))
            why.append(
                f"the data-parallel communication left exposed ({dp_s:.3g} s) is half the step or more "
                f"({step_s:.3g} s), so fewer replicas step faster"
            )
    return tuple(sorted(found, reverse=True)), "; ".join(why)


def _add_work(work: SearchResult, result: SearchResult) -> None:
    """Add the evaluations and families of ``result`` to ``work``."""
    work.add_charged(result)
    work.families += result.families


def _with_work(result: SearchResult, work: SearchResult) -> SearchResult:
    """``result`` reporting the evaluations and families of ``work`` (every count searched)."""
    result.memory_evaluations = work.memory_evaluations
    result.time_evaluations = work.time_evaluations
    result.charged = work.charged
    result.families = work.families
    return result


# GPU counts with valid splits searched below the cluster's before a throughput search gives up
MAX_FALLBACK_COUNTS = 8


def _refuse_unrunnable(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, constraints: Constraints
) -> None:
    """A domain error where no requested framework runs the job with any layout
    (``runnable.framework_refusal``), as the API's 422 before its search (``planning.runnable``): a
    library caller's search rejected every layout and its suggestions said no layout fitted on up to
    1,024 GPUs, of a 1B model Megatron-LM refused for its RoPE scaling (library review)."""
    refusals = {
        framework: framework_refusal(model, cluster, training, framework, constraints.launchers)
        for framework in constraints.frameworks
    }
    if all(refusal is not None for refusal in refusals.values()):
        reasons = " | ".join(
            f"{framework.value}: {refusal.message}" for framework, refusal in refusals.items() if refusal
        )
        raise InvalidTraining(
            f"no requested framework can run this model and training with any layout: {reasons}",
            rule="no_launcher",
            field="constraints.frameworks",
        )


def _full_estimate(job: Job, layout: Layout, memory_factor: float = 1.0) -> Estimate:
    """The estimate of a layout the search keeps: everything but the sequence-length limit, its memory
    scaled by the factor the search fitted it with (``Constraints.dynamic_factor``: a library caller's
    stored-run factors; its candidates read "fits: false" where the search had fitted them scaled;
    library review)."""
    calibration = Calibration(memory_dynamic_factor=memory_factor)
    result = estimate_valid(job, layout, with_limits=False, calibration=calibration)
    most = evaluate.max_micro_batch_size(job, layout, memory_factor)
    return dataclasses.replace(result, max_micro_batch_size=most)


def recommend(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints | None = None,
    tuning: Tuning | None = None,
    *,
    with_suggestions: bool = True,
    budget: Budget | None = None,
    catalog: Sequence[GPUSpec] | None = None,
) -> Recommendation:
    """The best ``top_k`` layouts by the objective, the rejected families, and what would fit.

    The search and the suggestions share ``budget`` (default: ``constraints.max_evaluations``
    evaluations, no deadline); suggestions name other GPUs of ``catalog`` (default: the GPU
    catalog)."""
    if tuning is None:
        raise TypeError("recommend needs the tuning numbers: pass catalog.tuning.default_tuning()")
    # the search and the suggestions (other GPUs, the same layouts) share the memory memos
    with shared_memory_memos(), fewer_collections():
        return _recommend(model, cluster, training, constraints, tuning, with_suggestions, budget, catalog)


def _recommend(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints | None,
    tuning: Tuning,
    with_suggestions: bool,
    budget: Budget | None,
    catalog: Sequence[GPUSpec] | None,
) -> Recommendation:
    from service.recommender.suggest import suggestions

    constraints = constraints or Constraints()
    budget = budget or Budget(constraints.max_evaluations)
    started = time.perf_counter()
    training = for_gpu(training, cluster.gpu, model)
    _refuse_unrunnable(model, cluster, training, constraints)
    # with suggestions to make if nothing fits, the search leaves them a part of the time: a search
    # the budget cuts keeps the leanest layout that fits, so its answer is still a plan
    searched_within = budget.share(time_fraction=SEARCH_TIME_FRACTION) if with_suggestions else budget
    result = _run_search(model, cluster, training, constraints, tuning, searched_within)
    chosen: list[tuple[Layout, Job, Estimate]] = []
    ranked = result.ranked(constraints.objective)
    for scored in ranked[: constraints.top_k]:
        job = result.jobs[scored.layout.world_size]
        factor = constraints.dynamic_factor(scored.layout)
        chosen.append((scored.layout, job, _full_estimate(job, scored.layout, factor)))
    # a near tie put a slower layout first and top_k 1 shows nothing after it: its rationale still
    # names the faster layout it was preferred to, and by how much
    passed_over = None
    if constraints.top_k == 1 and len(ranked) > 1 and ranked[1].key < ranked[0].key:
        faster = ranked[1]
        factor = constraints.dynamic_factor(faster.layout)
        passed_over = (
            faster.layout,
            _full_estimate(result.jobs[faster.layout.world_size], faster.layout, factor),
        )
    candidates = _candidates(
        chosen, constraints, training, result, cluster.world_size, passed_over, searched_within.reason
    )
    rejected = tuple(
        Rejection(
            reason=reason,
            count=group.count,
            example=_requested_framework(group.example, constraints),
            detail=group.detail,
            per_gpu_bytes=group.per_gpu_bytes,
            allowed_bytes=group.allowed_bytes,
            capacity_bytes=None if group.allowed_bytes is None else cluster.gpu.memory_bytes,
        )
        for reason, group in sorted(result.log.groups.items(), key=lambda kv: -kv[1].count)
    )
    searched = SearchStats(
        candidates_evaluated=result.candidates,
        duration_s=time.perf_counter() - started,
        truncated=result.truncated,
        truncated_by=searched_within.reason if result.truncated else None,
        families_considered=result.families,
        memory_evaluations=result.memory_evaluations,
        time_evaluations=result.time_evaluations,
        full_estimates=len(chosen),
    )
    if candidates or not with_suggestions:
        return Recommendation(
            status="feasible" if candidates else "infeasible",
            recommended=candidates[0] if candidates else None,
            alternatives=tuple(candidates[1:]),
            rejected=rejected,
            search=searched,
        )
    tips = suggestions(model, cluster, training, constraints, tuning, _catalog(catalog), budget)
    closest, unestimated = _closest(model, result, training)
    skipped = (
        tips.skipped if unestimated is None else (*tips.skipped, Skipped(kind="closest", reason=unestimated))
    )
    return Recommendation(
        status="infeasible",
        recommended=None,
        rejected=rejected,
        suggestions=tips.made,
        suggestions_skipped=skipped,
        closest=closest,
        search=searched,
    )


def _catalog(given: Sequence[GPUSpec] | None) -> Sequence[GPUSpec]:
    if given is not None:
        return given
    from service.catalog.gpus import gpu_entries

    return [entry.spec for entry in gpu_entries()]


def _requested_framework(example: Layout, constraints: Constraints) -> Layout:
    """A rejection's example in a requested framework: a split's rule holds for every framework, and
    its example was built in the default one (DeepSpeed beside frameworks ["megatron"]; MoE review)."""
    if example.framework in constraints.frameworks or not constraints.frameworks:
        return example
    return dataclasses.replace(example, framework=constraints.frameworks[0])


def _closest(
    model: ModelSpec, result: SearchResult, training: TrainingSpec
) -> tuple[Candidate | None, str | None]:
    """The layout that came closest to fitting (the least memory the search saw over the limit),
    fully estimated: how far the best layout is from fitting, and its memory breakdown; and, where
    there is a miss but no layout to show, why (a suggestion skipped: it was silently null for a
    bound's example the global batch does not split over; bounded-work review). A bound's example
    (the model states alone) is shown with its whole estimate beside the bound's words, which
    counted the states only."""
    group = result.log.groups.get(MEMORY_REJECTION)
    if group is None:
        return None, None
    layout = group.example
    job = result.jobs.get(layout.world_size)
    if job is None:
        return None, None
    try:
        validate_layout(model, job.cluster, layout, training)
        estimate = estimate_valid(job, layout, with_limits=False)
    except EstimatorError as error:
        return (
            None,
            f"the closest miss ({group.detail}) is a bound, not a layout to estimate: {error.message}",
        )
    detail = group.detail
    if group.per_gpu_bytes is not None and estimate.memory.per_gpu.total != group.per_gpu_bytes:
        # a bound's words (the states alone) beside the whole estimate over_bytes is read from
        whole = estimate.memory.per_gpu.total / 2**30
        over = (estimate.memory.per_gpu.total - (group.allowed_bytes or 0)) / 2**30
        detail += f"; the whole layout estimated: {whole:.1f} GiB per GPU ({over:.1f} GiB over)"
    if group.example_runs is False:
        # every layout a requested launcher runs missed by more or was bounded: shown as the closest
        # of all, said (it read as a layout to run: an infeasible-jobs review)
        detail += "; no requested launcher runs this layout: every one they run misses by more"
    total = estimate.memory.per_gpu.total
    if group.allowed_bytes is not None and estimate.fits and total > group.allowed_bytes:
        # fits the card, not the headroom the plan keeps: its estimate's "fits" alone read as a fit
        allowed = group.allowed_bytes / 2**30
        said = f"fits the card but not the {allowed:.1f} GiB per GPU the plan allows (its headroom)"
        estimate = dataclasses.replace(estimate, warnings=(*estimate.warnings, said))
    return Candidate(layout=layout, estimate=estimate, score=0.0, rationale=(detail,)), None


def _tokens_per_s(est: Estimate) -> float:
    assert est.time is not None  # estimate() always times a valid layout
    return est.time.tokens_per_s


def gpu_use(
    layout: Layout, constraints: Constraints, result: SearchResult, total_gpus: int, cut_by: str | None = None
) -> str:
    """How many of the cluster's GPUs the layout uses, and why not the others; and where the search
    stopped at its budget, that this is the best it reached (a cut search's answer read as the best
    of all: bounded-work review), and, where its time (``cut_by``) cut it, how to have the same cut on
    any machine: the CPU time a search gets depends on the machine's load, so identical requests
    recommended different layouts (determinism review), where a ``constraints.max_evaluations`` the
    time allows splits and cuts the work by evaluations alone (``Budget.split_by_evaluations``)."""
    use = _gpu_use(layout, constraints, result, total_gpus)
    if result.truncated:
        use += (
            f"; the search stopped at its budget after {result.families:,} layout families: the best "
            "it reached, a faster layout may exist"
        )
        if cut_by == "time":
            use += (
                f" (its CPU time, which the machine's load decides, after {result.evaluations} "
                "evaluations; a constraints.max_evaluations the time allows cuts by evaluations "
                "alone, the same on every machine)"
            )
    return use


def _gpu_use(layout: Layout, constraints: Constraints, result: SearchResult, total_gpus: int) -> str:
    used, limit = layout.world_size, constraints.max_gpus
    if used == total_gpus:
        return "uses its one GPU" if total_gpus == 1 else f"uses all {total_gpus} GPUs"
    capped = limit is not None and limit < total_gpus
    if capped and used == limit:
        return f"uses {used} of {total_gpus} GPUs: max_gpus {limit}"
    if constraints.objective is Objective.FEWEST_GPUS:
        return f"uses {used} of {total_gpus} GPUs: the objective (fewest_gpus) prefers fewer"
    if constraints.objective is Objective.COST:
        # cost is GPU-hours per token: fewer GPUs only where they train no slower per GPU (FinOps review:
        # "prefers fewer" beside 48 of 64 chosen over a 16-GPU fit that cost more)
        return f"uses {used} of {total_gpus} GPUs: the fewest GPU-hours per token (the objective: cost)"
    reason = result.idle_reason or "no larger count this cluster's node shape allows has a valid split"
    cap = f" (max_gpus {limit})" if capped else ""
    return f"uses {used} of {total_gpus} GPUs{cap}: {reason}"


def _candidates(
    chosen: list[tuple[Layout, Job, Estimate]],
    constraints: Constraints,
    training: TrainingSpec,
    result: SearchResult,
    total: int,
    passed_over: tuple[Layout, Estimate] | None = None,
    cut_by: str | None = None,
) -> tuple[Candidate, ...]:
    if not chosen:
        return ()
    best_layout, best_job, best = chosen[0]
    no_pp = any(s.layout.pp == 1 for s in result.best.values())
    runner_up = (chosen[1][0], chosen[1][2]) if len(chosen) > 1 else passed_over
    cluster = best_job.cluster
    out = [
        Candidate(
            layout=best_layout,
            estimate=best,
            score=rank.score(constraints, best_layout.world_size, _tokens_per_s(best), training),
            rationale=rank.rationale(
                best_layout,
                best,
                cluster,
                runner_up,
                no_pp,
                gpu_use(best_layout, constraints, result, total, cut_by),
                # within the headroom the plan keeps, as the search chose it (the estimate's limit is
                # against the whole card: "largest that fits: 4" where 4 was over the plan's 95%)
                evaluate.max_micro_batch_size(
                    best_job,
                    best_layout,
                    constraints.dynamic_factor(best_layout),  # as the search fitted it (change review)
                    limit_bytes=headroom.allowed_bytes(
                        cluster.gpu.memory_bytes, constraints.min_headroom_fraction
                    ),
                ),
                max(valid_micro_batch_sizes(best_job.training, best_layout), default=None),
                constraints.objective,
                best_job.training,
            ),
        )
    ]
    for layout, _, est in chosen[1:]:
        out.append(
            Candidate(
                layout=layout,
                estimate=est,
                score=rank.score(constraints, layout.world_size, _tokens_per_s(est), training),
                rationale=rank.alternative_rationale(layout, est, best_layout, best, constraints.objective),
            )
        )
    return tuple(out)
