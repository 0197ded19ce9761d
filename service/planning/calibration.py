"""Calibration from stored runs: which runs apply to an estimate, the factors they give, and the
headroom a plan's search keeps because of them.

Runs apply to later estimates on the same hardware (a fingerprint of the resolved cluster, so a
stored cluster and an identical inline one share it, and editing a cluster's hardware starts
afresh): the step time from every framework's runs, memory from the same framework's. Each run
counts by its weight for the job being estimated (``evidence_weight``: recency, estimator version,
model size, sequence, layout family).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from service.contracts.estimates import (
    CalibrationFactors,
    CalibrationOut,
    RunEvidenceOut,
    SetAsideRunOut,
    UncalibratedOut,
)
from service.contracts.plans import CandidateOut
from service.contracts.results import PlanResult, StoredLayout, StoredRequest
from service.estimator.calibration import (
    Calibration,
    Evidence,
    JobTraits,
    Observation,
    comparable,
    evidence_weight,
    layout_family,
    shared_calibration,
)
from service.estimator.types import (
    CUSTOM_GPU_SOURCE,
    ClusterSpec,
    Estimate,
    Framework,
    Layout,
    MemoryStatistic,
    TrainingSpec,
)
from service.feedback import ObservedRun, estimated_peak, measured_step_s
from service.frameworks import Target, frameworks_of
from service.launchers.deepspeed import counted_ranks
from service.persistence.db import utcnow
from service.persistence.models import PlanRecord, RunRecord
from service.persistence.repository import PlanRepository
from service.recommender.types import Constraints
from service.versions import estimator_version

# Fields a cluster may leave out, hashed only when given: a cluster that does not state them keeps the
# key it had before they existed (and the runs stored under it), one that does is new hardware knowledge.
OPTIONAL_HARDWARE_FIELDS = (
    "measured_intra_node_bus_bandwidth_bytes_per_s",
    "measured_inter_node_bus_bandwidth_bytes_per_s",
)


# What a node stores, not what computes or links: a run's speed and memory on the GPUs do not depend on
# it, so a cluster that states its host RAM or NVMe is the same hardware as one that does not (the same
# 16 H100s were calibrated by a run with 2 TiB of host RAM stated and not without it; consistency
# review). Hashed at their "not stated" value, 0, so the keys of clusters that never stated them stay
# (migration 2026-12-06 rekeys the plans and runs stored with them).
HOST_STORAGE_FIELDS = ("cpu_memory_bytes_per_node", "nvme_bytes_per_node")


def hardware_key(cluster: ClusterSpec) -> str:
    """The key a plan and its runs are stored under: a hash of the hardware (``_hardware_fields``)."""
    return _digest(_hardware_fields(cluster))


# GPUSpec fields added after releases had stored runs under keys that hashed no such field, newest
# first: the sustained clocks (9db0d3c, left at None unless stated), and the die with its flash
# kernels (80792dc, ea0052f). An upgrade review: runs stored by a Dec 2 release stopped calibrating
# the same hardware, their keys hashing none of these.
_LATER_GPU_FIELDS = (
    ("rated_power_w", "power_limit_w", "peak_clock_hz", "sustained_clock_hz"),
    ("chip", "flash_attention"),
)


def hardware_keys(cluster: ClusterSpec) -> tuple[str, ...]:
    """``hardware_key``, then the keys earlier releases computed for the same hardware, where they
    could have known it (no clock stated): calibration looks runs up under all of them."""
    fields = _hardware_fields(cluster)
    keys = [_digest(fields)]
    gpu = fields["gpu"]
    if any(gpu[name] is not None for name in _LATER_GPU_FIELDS[0]):
        return tuple(keys)  # a stated clock: hardware no earlier release could describe
    for added in _LATER_GPU_FIELDS:
        for name in added:
            del gpu[name]
        keys.append(_digest(fields))
    return tuple(keys)


def _digest(fields: dict[str, Any]) -> str:
    canonical = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _hardware_fields(cluster: ClusterSpec) -> dict[str, Any]:
    fields = dataclasses.asdict(cluster)
    for name in HOST_STORAGE_FIELDS:
        fields[name] = 0
    for name in OPTIONAL_HARDWARE_FIELDS:
        if fields[name] is None:
            del fields[name]
    # how a custom GPU's links were chosen is not hardware: a figure left out and the same figure
    # stated are one GPU (and keep the key clusters had before links could be left out)
    del fields["gpu"]["defaulted"]
    del fields["gpu"]["notes"]  # what the request's figures look like, not hardware
    # nor is the node the part ships in (its network and size): the cluster's own are
    # inter_node_bandwidth and gpus_per_node
    del fields["gpu"]["node_network_bytes_per_s"]
    del fields["gpu"]["node_gpus"]
    # nor a driver's peer access or the links' topology (a mesh's links), which the part's name
    # already says (and keeps the keys of before: mesh_links in the hash re-keyed every cluster's runs;
    # review of stop 49)
    del fields["gpu"]["peer_to_peer"]
    del fields["gpu"]["mesh_links"]
    # a custom GPU's maker (stated, or its die's since 2026-12-06) is hashed as the "custom" every one
    # was before: the same part keeps the key its runs are stored under
    if fields["gpu"]["source"] == CUSTOM_GPU_SOURCE:
        fields["gpu"]["vendor"] = "custom"
    return fields


def observed(run: RunRecord) -> ObservedRun:
    return ObservedRun(
        peak_memory_bytes_per_gpu=run.peak_memory_bytes_per_gpu,
        step_s=run.step_s,
        tokens_per_s=run.tokens_per_s,
        gpu_utilization=run.gpu_utilization,
        out_of_memory=run.out_of_memory,
        memory_statistic=MemoryStatistic(run.memory_statistic) if run.memory_statistic else None,
    )


PARTS_ROUNDING_BYTES = 64  # more than the per-GPU parts (each rounded up to a byte) can add up to


def observation(run: RunRecord, plan: PlanRecord) -> Observation | None:
    """The run next to its plan's *uncalibrated* estimate: the figures stored beside the calibrated
    ones, or (plans stored before they were) the factors applied then divided out."""
    recommended = PlanResult.read(plan.result).recommended
    if recommended is None:
        return None
    estimate = recommended.estimate
    stored = estimate.calibration
    factors = stored.factors if stored else CalibrationFactors()
    per_gpu = estimate.memory.per_gpu
    states = per_gpu.parameters + per_gpu.gradients + per_gpu.optimizer_states
    dynamic = (per_gpu.activations + per_gpu.buffers + per_gpu.overhead) / factors.memory_dynamic
    time = estimate.time
    estimated_step_s = time.step_s / factors.step_time if time else None
    if stored and stored.uncalibrated:
        dynamic = stored.uncalibrated.memory_per_gpu_bytes - states
        estimated_step_s = stored.uncalibrated.step_s
    tokens_per_step = StoredRequest.read(plan.request).training.tokens_per_step
    run_observed = observed(run)
    measured_peak = run.peak_memory_bytes_per_gpu
    if measured_peak is not None:
        # a peak of another statistic than device used (a torchtitan log's max reserved, a typed
        # max_memory_allocated) is compared as device used: plus what the estimate says it leaves out
        # (CUDA context, NCCL's buffers and TE's userbuffers; and fragmentation for allocated bytes),
        # uncalibrated as
        # the dynamic parts are
        _, estimated = estimated_peak(per_gpu, run_observed.memory_statistic)
        left_out = per_gpu.device_used_bytes - estimated
        measured_peak += round(left_out / factors.memory_dynamic)
        if not run.out_of_memory:
            # a run that did not run out of memory used at most the card (less a few bytes: each
            # calibrated part is rounded up to a byte): what the estimate adds to an allocated peak
            # (its own fragmentation, sized for its own allocations) cannot put it past (34.5 GiB
            # allocated on a 40 GB A100 became 40.5 GiB of device used, and the layout that ran was
            # said not to fit; memory review)
            measured_peak = min(measured_peak, estimate.memory.capacity_bytes - PARTS_ROUNDING_BYTES)
    # step x HFU is the step's hardware FLOPs per GPU over the dense peak: the step at HFU 1, the same
    # before and after a step-time factor (which divides HFU as it multiplies the step)
    peak_step_s = time.step_s * time.hfu if time and time.hfu else None
    return Observation(
        model_state_bytes=states,
        dynamic_bytes=round(dynamic),
        capacity_bytes=estimate.memory.capacity_bytes,
        measured_peak_bytes=measured_peak,
        reported_peak_bytes=run.peak_memory_bytes_per_gpu,
        out_of_memory=run.out_of_memory,
        estimated_step_s=estimated_step_s,
        measured_step_s=measured_step_s(run_observed, tokens_per_step),
        peak_step_s=peak_step_s,
        run_id=run.id,
        another_job=another_job(run, plan, estimate.memory.capacity_bytes),
    )


def gpu_count(layout: dict[str, Any]) -> int:
    """GPUs a stored layout runs on (expert parallelism folds into the others)."""
    count = 1
    for axis in ("dp", "tp", "pp", "cp"):
        count *= int(layout.get(axis) or 1)
    return count


def logged_ranks(layout: dict[str, Any], log_format: object) -> int:
    """The world size a log of ``log_format`` states for a run of ``layout``: DeepSpeed's config print
    logs the ranks its batch check counts, and its train_batch_size and samples/s count them
    (``launchers.deepspeed.counted_ranks``: dp under its pipeline engine, every rank, tensor-parallel
    peers included, under AutoTP); the others every GPU. A DeepSpeed plan's own log read as another
    job's: its pipeline's world_size was dp, its AutoTP's batch tp times the plan's (a batch review)."""
    if log_format == "deepspeed":
        shape = StoredLayout.model_validate(layout)
        return counted_ranks(dp=shape.dp, tp=shape.tp, pp=shape.pp)
    return gpu_count(layout)


def logged_batch_factor(layout: dict[str, Any], log_format: object) -> float:
    """How many times the global batch a log of ``log_format`` counts for ``layout`` (its
    train_batch_size, and the samples its samples/s count): ``logged_ranks`` over dp for DeepSpeed's,
    1 for the others."""
    if log_format == "deepspeed":
        return logged_ranks(layout, log_format) / StoredLayout.model_validate(layout).dp
    return 1.0


# A log's card may report a little less than the catalog's (the driver's reserve: 79.1 GiB of an H100's
# 80); more apart than this, it ran on another card.
CAPACITY_TOLERANCE = 0.1


# How far a log's own FLOPs per step (its printed TFLOP/s per GPU x GPUs x step) may be from the plan's
# model FLOPs before it is another job's: the frameworks' FLOP formulas differ from ours by up to ~20%
# (causal attention counted whole or halved, the logits layer); a 16-GPU log (0.5x) and a 13B one on an
# 8B plan (1.65x) calibrated it (runs review).
STATED_FLOPS_RATIO = 1.4


def _stated_flops_ratio(
    run: RunRecord, source: dict[str, Any], recommended: CandidateOut | None
) -> float | None:
    """The log's FLOPs per step (its TFLOP/s per GPU x its GPUs, else the plan's, x the measured step)
    over the plan's model FLOPs per step; None where either is not known."""
    if recommended is None or recommended.estimate.time is None or not run.step_s:
        return None
    tflops = next(
        (f.get("value") for f in source.get("figures") or [] if f.get("name") == "tflops_per_gpu"), None
    )
    if not isinstance(tflops, int | float) or tflops <= 0:
        return None
    time = recommended.estimate.time
    gpus = gpu_count(recommended.layout)
    world = source.get("world_size")
    logged_gpus = world if isinstance(world, int) and world > 0 else gpus
    planned = time.tflops_per_gpu * gpus * time.step_s
    return tflops * logged_gpus * run.step_s / planned if planned > 0 else None


def another_job(run: RunRecord, plan: PlanRecord, capacity_bytes: int) -> tuple[str, ...]:
    """What the run's log states that makes it another job than its plan's (runs review, stop 39: a
    log at global batch 96 posted to a batch-128 plan, or an OOM on a 79 GiB card posted to a 40 GiB
    plan, calibrated the hardware as if they had measured it)."""
    source = run.source or {}
    if source.get("kind") != "log":
        return ()
    reasons = []
    # a log printed by a launcher that runs none of the plan's framework: another framework's step
    # (a torchtitan log posted to a Megatron plan set its memory factor; runs review)
    printed = source.get("format")
    if printed in {t.value for t in Target} and plan.framework:
        runs = [f.value for f in frameworks_of(Target(printed))]
        if runs and plan.framework not in runs:
            reasons.append(
                f"its log is {printed}'s, which runs {' or '.join(runs)}; the plan's framework is "
                f"{plan.framework}: another framework's step"
            )
    planned = StoredRequest.read(plan.request).training.global_batch_size
    recommended = PlanResult.read(plan.result).recommended
    batch = source.get("global_batch_size")
    factor = logged_batch_factor(recommended.layout, printed) if recommended is not None else 1.0
    if isinstance(batch, int) and batch != planned * factor:
        counted = f" ({planned * factor:g} as its {printed} log counts it)" if factor != 1 else ""
        reasons.append(
            f"its log trains global batch {batch}, the plan {planned}{counted}: another job's step"
        )
    world = source.get("world_size")
    if recommended is not None and isinstance(world, int):
        gpus, ranks = gpu_count(recommended.layout), logged_ranks(recommended.layout, printed)
        if world != ranks:
            counted = f" ({ranks} ranks as its {printed} log counts them)" if ranks != gpus else ""
            reasons.append(
                f"its log ran on {world} GPUs, the plan's layout on {gpus}{counted}: another job's"
            )
    stated = _stated_flops_ratio(run, source, recommended)
    if stated is not None and not 1 / STATED_FLOPS_RATIO <= stated <= STATED_FLOPS_RATIO:
        reasons.append(
            f"its log's own TFLOP/s per GPU x GPUs x step make {stated:.3g}x the plan's model FLOPs per "
            "step: another model, batch or GPU count"
        )
    oom = source.get("out_of_memory") or {}
    card = oom.get("capacity_bytes")
    if isinstance(card, int) and abs(card - capacity_bytes) > CAPACITY_TOLERANCE * capacity_bytes:
        reasons.append(
            f"its log's GPU has {card / 2**30:.4g} GiB, the plan's card {capacity_bytes / 2**30:.4g} GiB: "
            "another card"
        )
    return tuple(reasons)


# layout_family's answers
LAYOUT_FAMILIES = ("data-parallel", "model-parallel", "expert-parallel")


def job_traits(parameters: int, training: TrainingSpec, layout: Layout | None = None) -> JobTraits:
    """The job being estimated (its training resolved for the GPU); without a layout (a search that
    has not chosen one) any family."""
    family = None
    if layout is not None:
        family = layout_family(tp=layout.tp, pp=layout.pp, cp=layout.cp, ep=layout.ep)
    return JobTraits(
        parameters=parameters,
        seq_len=training.seq_len,
        family=family,
        precision=training.precision.value,
        method=training.method.value,
    )


def stored_traits(plan: PlanRecord) -> JobTraits | None:
    """The job a stored plan's recommended layout ran."""
    recommended = PlanResult.read(plan.result).recommended
    if recommended is None:
        return None
    layout = StoredLayout.model_validate(recommended.layout)
    training = StoredRequest.read(plan.request).training
    stated = training.model_extra or {}
    # the precision the request gave, else the one the GPU resolved it to (resolved_defaults)
    precision = stated.get("precision") or PlanResult.read(plan.result).resolved_defaults.get(
        "training.precision"
    )
    return JobTraits(
        parameters=recommended.estimate.parameters_total,
        seq_len=training.seq_len,
        family=layout_family(tp=layout.tp, pp=layout.pp, cp=layout.cp, ep=layout.ep),
        precision=str(precision) if precision else None,
        method=str(stated.get("method") or "full"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredRun:
    """A stored run as calibration reads it."""

    observation: Observation
    plan_id: str
    framework: str
    evidence: Evidence


@dataclass(frozen=True, slots=True, kw_only=True)
class Learned:
    """A framework's calibration for one job, and every run it weighed: (run, weight, why)."""

    calibration: Calibration
    weighed: tuple[tuple[StoredRun, float, tuple[str, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class HardwareRuns:
    """The runs an owner stored on one hardware, read once, weighed for each job asked about."""

    runs: tuple[StoredRun, ...]

    def learned(self, framework: str, target: JobTraits) -> Learned:
        """The framework's calibration on this hardware for ``target`` (``shared_calibration``), each
        run weighted by ``evidence_weight``."""
        weighed = tuple(
            (run, *evidence_weight(run.evidence, target))
            for run in self.runs
            if comparable(run.evidence.job, target)  # another precision's or method's calibrate nothing
        )
        every = [dataclasses.replace(run.observation, weight=weight) for run, weight, _ in weighed]
        own = [o for o, (run, _, _) in zip(every, weighed, strict=True) if run.framework == framework]
        return Learned(calibration=shared_calibration(every, own), weighed=weighed)


# The most recent runs of each framework on one hardware that calibrate its estimates. Every request on
# the hardware reads them (an estimate, a plan, a run posted): 5,000 stored runs made an estimate take
# 5.8 s and a plan a 422 (bounded-work review, stop 39). Older ones weigh less anyway (Evidence.age_days).
MAX_EVIDENCE_RUNS = 256


def runs_on(repo: PlanRepository, keys: Sequence[str], now: datetime | None = None) -> HardwareRuns:
    """The most recent ``MAX_EVIDENCE_RUNS`` runs of each framework on this hardware with what makes
    each evidence: its age, the estimator version its plan's estimate came from, the job it ran. Per
    framework: memory is calibrated by a framework's own runs, and 256 newer Megatron runs pushed
    DeepSpeed's out-of-memory run out of the newest 256, its layout "fits" again (calibration review)."""
    now = now or utcnow()
    current = estimator_version()
    out = []
    traits_of: dict[str, JobTraits | None] = {}  # a plan's stored traits, parsed once for its runs
    newest = sorted(
        (
            pair
            for framework in Framework
            for pair in repo.runs_on_hardware(keys, framework.value, limit=MAX_EVIDENCE_RUNS)
        ),
        key=lambda pair: pair[0].id,  # ULIDs: oldest first, as each framework's come
    )
    for run, plan in newest:
        if plan.id not in traits_of:
            traits_of[plan.id] = stored_traits(plan)
        obs, traits = observation(run, plan), traits_of[plan.id]
        if obs is None or traits is None:
            continue
        age_days = (now - run.created_at).days
        evidence = Evidence(age_days=age_days, same_estimator=plan.estimator_version == current, job=traits)
        out.append(
            StoredRun(observation=obs, plan_id=plan.id, framework=str(plan.framework), evidence=evidence)
        )
    return HardwareRuns(tuple(out))


def calibration_for(repo: PlanRepository, keys: Sequence[str], framework: str, target: JobTraits) -> Learned:
    """The framework's calibration on this hardware (its ``hardware_keys``) for ``target``: step time
    from every framework's runs on it, memory and the framework's own deviation from its own
    (``shared_calibration``)."""
    return runs_on(repo, keys).learned(framework, target)


def calibration_out(learned: Learned, uncalibrated: Estimate | None = None) -> CalibrationOut | None:
    """The factors, the runs behind each with their weight, the runs set aside with why, and (for an
    estimate) its figures without calibration; ``step_time`` is the factor applied (capped where the
    step would beat the dense peak), ``step_time_learned`` what the runs say."""
    calibration = learned.calibration
    if calibration.runs == 0 and calibration.implausible_runs == 0:
        return None
    behind: dict[str, list[str]] = {}
    for factor, ids in (
        ("memory_dynamic", calibration.memory_run_ids),
        ("step_time_hardware", calibration.hardware_time_run_ids),
        ("step_time_framework", calibration.framework_time_run_ids),
    ):
        for run_id in ids:
            behind.setdefault(run_id, []).append(factor)
    aside = dict(calibration.set_aside)
    learned_factor = calibration.learned_step_time_factor
    return CalibrationOut(
        factors=CalibrationFactors(
            memory_dynamic=calibration.memory_dynamic_factor,
            step_time=calibration.step_time_factor,
            step_time_learned=calibration.step_time_factor if learned_factor is None else learned_factor,
            step_time_hardware=calibration.hardware_step_time_factor,
            step_time_framework=calibration.framework_step_time_factor,
        ),
        runs=calibration.runs,
        memory_runs=calibration.memory_runs,
        time_runs=calibration.time_runs,
        out_of_memory_runs=calibration.oom_runs,
        implausible_runs=calibration.implausible_runs,
        evidence=[
            RunEvidenceOut(
                run_id=run.observation.run_id,
                plan_id=run.plan_id,
                framework=run.framework,
                weight=weight,
                weighted_because=list(why),
                factors=behind[run.observation.run_id],
            )
            for run, weight, why in learned.weighed
            if run.observation.run_id in behind
        ],
        set_aside=[
            SetAsideRunOut(run_id=run.observation.run_id, plan_id=run.plan_id, reasons=list(reasons))
            for run, _, _ in learned.weighed
            if (reasons := aside.get(run.observation.run_id))
        ],
        uncalibrated=uncalibrated_out(uncalibrated) if uncalibrated is not None else None,
    )


def uncalibrated_out(estimate: Estimate) -> UncalibratedOut:
    time = estimate.time
    return UncalibratedOut(
        fits=estimate.fits,
        memory_per_gpu_bytes=estimate.memory.per_gpu.total,
        step_s=time.step_s if time else None,
        tokens_per_s=time.tokens_per_s if time else None,
        mfu=time.mfu if time else None,
    )


def searched_with_runs(
    constraints: Constraints, learned: Mapping[tuple[Framework, str], Calibration]
) -> tuple[Constraints, dict[str, str]]:
    """Fit the search's layouts as the runs measure them: each framework and layout family whose runs
    on this hardware set a dynamic-memory factor other than 1 (an out-of-memory run sets one above)
    has every layout fitted with its activations, buffers and overhead scaled by it, as the plan's
    calibrated estimate of a kept layout then shows them (``Constraints.memory_dynamic_factors``).
    Below 1 too: searched uncalibrated, a plan was infeasible where the calibrated estimate of its own
    closest layout fit with 7 GiB to spare (calibration review). A flat
    headroom for the largest surplus refused layouts that need less: one out-of-memory run at 25.6
    GiB of activations took 17 GiB off every layout's room, and an 8B plan on 2 GPUs said infeasible
    where its calibrated tp 2 layout fits (scheduler review). With what ``resolved_defaults`` names."""
    raised = {key: c for key, c in learned.items() if c.memory_dynamic_factor != 1.0}
    if not raised:
        return constraints, {}
    factors = tuple((fw, family, c.memory_dynamic_factor) for (fw, family), c in raised.items())

    def runs(c: Calibration) -> str:
        stored = [f"{c.memory_runs} with a measured peak" if c.memory_runs else "",
                  f"{c.oom_runs} out of memory" if c.oom_runs else ""]  # fmt: skip
        return " and ".join(words for words in stored if words) or f"{c.runs}"

    grouped: dict[tuple[Framework, float, str], list[str]] = {}
    for (fw, family), c in raised.items():
        grouped.setdefault((fw, c.memory_dynamic_factor, runs(c)), []).append(family)
    said = "; ".join(
        f"{fw.value} {'every' if len(families) == len(LAYOUT_FAMILIES) else ', '.join(families)} layout "
        f"x{factor:.2f} ({words} run(s))"
        for (fw, factor, words), families in grouped.items()
    )
    return (
        dataclasses.replace(constraints, memory_dynamic_factors=factors),
        {
            "search.memory_dynamic_factor": said + ": the stored runs on this hardware; each layout of these "
            "is fitted with its activations, buffers and overhead scaled so, as its calibrated estimate shows"
        },
    )
