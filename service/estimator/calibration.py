"""Correction factors learned from observed runs, and their application to an estimate.

The model states (parameters, gradients, optimizer states) are exact arithmetic, so runs only
calibrate what is not: the dynamic part of memory (activations, buffers, overhead, which depend
on kernels, allocator and framework version) and the step time. Factors are medians of the
observed/estimated ratios, bounded so that a few odd runs cannot swing a plan wildly. A run that
ran out of memory sets a floor: the dynamic factor must be large enough that its estimate would
not have fit, plus a margin.

Runs count as evidence, weighted (``evidence_weight``): by recency, by whether the estimate they were
compared with came from this estimator version, and by how close the run's job is to the one being
estimated (model size, sequence length, layout family). Medians are weighted medians; with equal
weights they are the plain medians.

Runs are checked before they count (``implausibility``): one that could not have happened on the
plan's hardware (faster than the dense peak does the step's FLOPs, a peak below the model states
the GPU must hold) or that is further off the estimate than ``IMPLAUSIBLE_RATIO`` moves no factor.
And the calibrated numbers obey the same physics whatever the runs say: the step time never goes
below the time the dense peak needs for the step's hardware FLOPs (HFU <= 1, hence MFU <= 1), and
only the dynamic memory is scaled, so memory never drops below the model states.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from service.estimator.types import TimeBreakdown, TimeEstimate

# Bounds of the learned factors: outside them a run says more about a broken setup than about
# the estimator, and the plan should not follow it blindly. The memory factor's lower bound is
# positive and scales only the dynamic part, so calibrated memory never goes below the model states.
MEMORY_FACTOR_BOUNDS = (0.8, 2.0)
TIME_FACTOR_BOUNDS = (0.5, 3.0)
# An out-of-memory run proves the real need exceeded capacity; ask this much more than that.
OOM_MARGIN = 1.05
# Assumption, not fitted: a framework's own step-time factor (on top of the hardware's) is trusted in
# proportion to its runs, n / (n + FRAMEWORK_PRIOR_RUNS): one run moves it a third of the way.
FRAMEWORK_PRIOR_RUNS = 2
# A run whose step time or peak memory is more than this factor off the (uncalibrated) estimate,
# either way, measured another job than the plan's (another batch, sequence length, layout or a
# broken measurement) and moves no factor. 4x: the estimator's worst step-time error on the 110
# published runs of validation/REPORT.md is -47% (measured 1.9x the estimate), memory's -12%; and it
# lies outside TIME_FACTOR_BOUNDS and MEMORY_FACTOR_BOUNDS, so every run those bounds let a factor
# follow is still inside it.
IMPLAUSIBLE_RATIO = 4.0

# Evidence weights: assumptions, not fitted (no set of calibrated plans to fit them on exists), each
# stated in the answer next to the run it weighs. A run's age counts in whole days, so the runs of
# one day weigh alike and the factors do not drift between two requests of the same day.
RECENCY_HALF_LIFE_DAYS = 30  # a month-old run counts half as much as today's
# A run compared with an older estimator's numbers says how far off *that* estimator was.
OLDER_ESTIMATOR_WEIGHT = 0.5
# Another layout family (data parallel with sharding, model parallel, expert parallel) exposes other
# communication and other activation memory: its runs count half.
OTHER_FAMILY_WEIGHT = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """One stored run next to the estimate its plan recommended."""

    model_state_bytes: int  # estimated parameters + gradients + optimizer states per GPU
    dynamic_bytes: int  # estimated activations + buffers + overhead per GPU
    capacity_bytes: int  # the card's memory
    measured_peak_bytes: int | None  # as device used (the estimate's left-out parts added)
    reported_peak_bytes: int | None = None  # the peak as the run reported it, of its own statistic
    out_of_memory: bool
    estimated_step_s: float | None
    measured_step_s: float | None
    # the step's hardware FLOPs per GPU (recompute included) at the GPU's dense peak of the
    # precision: the step time at HFU 1 (evaluate.time_estimate: hfu = hardware FLOPs / (step x peak))
    peak_step_s: float | None = None
    run_id: str = ""
    weight: float = 1.0  # evidence_weight of the run for the job being estimated
    # what the run's own log states that the plan's job is not (another global batch, another card):
    # it measured another job, whatever its numbers
    another_job: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class JobTraits:
    """What makes two jobs alike for calibration: their size, sequence and layout family."""

    parameters: int
    seq_len: int
    family: str | None = None  # layout_family; None: any (a search before it knows a layout)
    # the arithmetic it ran: training.precision and training.method (None: not known, a plan stored
    # before they were read back); another's runs calibrate nothing (``comparable``)
    precision: str | None = None
    method: str | None = None


def comparable(run: JobTraits, target: JobTraits) -> bool:
    """Whether a run of ``run`` may calibrate an estimate of ``target``: the same precision and
    training method where both are known. The estimator's error is the kernels' it times (REPORT: its
    fp32 rows +26%, its tf32 ones -22%, by the fp32 GEMM rate), and LoRA's step is another
    computation: one fp32 run doubled every bf16, tf32 and LoRA estimate on its hardware, at weight 1
    (calibration review)."""
    return all(
        mine is None or theirs is None or mine == theirs
        for mine, theirs in ((run.precision, target.precision), (run.method, target.method))
    )


def layout_family(*, tp: int, pp: int, cp: int, ep: int) -> str:
    """The family whose communication and activation memory a layout shares."""
    if ep > 1:
        return "expert-parallel"
    if tp > 1 or pp > 1 or cp > 1:
        return "model-parallel"
    return "data-parallel"


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """A stored run as evidence: when, against which estimator, of which job."""

    age_days: int
    same_estimator: bool
    job: JobTraits


def _closeness(a: int, b: int) -> float:
    """1 for equal sizes, 1/2 at a factor of 2 apart, 1/3 at 4, 1/(1 + |log2 ratio|)."""
    return 1.0 / (1.0 + abs(math.log2(max(a, 1) / max(b, 1))))


def evidence_weight(evidence: Evidence, target: JobTraits) -> tuple[float, tuple[str, ...]]:
    """How much a run counts for ``target``, in (0, 1], and each factor below 1 with its reason."""
    why = []
    recency = 0.5 ** (max(evidence.age_days, 0) / RECENCY_HALF_LIFE_DAYS)
    if recency < 1.0:
        why.append(f"{evidence.age_days} days old: x{recency:.3g} (half-life {RECENCY_HALF_LIFE_DAYS} days)")
    if not evidence.same_estimator:
        why.append(f"compared with an older estimator version: x{OLDER_ESTIMATOR_WEIGHT:g}")
    job = evidence.job
    size = _closeness(job.parameters, target.parameters)
    if size < 1.0:
        why.append(
            f"model of {job.parameters / 1e9:.3g}B parameters for {target.parameters / 1e9:.3g}B: x{size:.3g}"
        )
    sequence = _closeness(job.seq_len, target.seq_len)
    if sequence < 1.0:
        why.append(f"sequence {job.seq_len:,} for {target.seq_len:,}: x{sequence:.3g}")
    family = 1.0
    if target.family is not None and job.family != target.family:
        family = OTHER_FAMILY_WEIGHT
        why.append(f"{job.family} layout for a {target.family} one: x{OTHER_FAMILY_WEIGHT:g}")
    weight = recency * (1.0 if evidence.same_estimator else OLDER_ESTIMATOR_WEIGHT) * size * sequence * family
    return weight, tuple(why)


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value at half the total weight; where the cumulative weight stops exactly at half, the mean
    of the two values around it, so equal weights give ``statistics.median``."""
    if not values or len(values) != len(weights) or any(w <= 0 for w in weights):
        raise ValueError(f"weighted_median needs as many positive weights as values: {values!r}, {weights!r}")
    pairs = sorted(zip(values, weights, strict=True))
    half = math.fsum(weights) / 2
    cumulative = 0.0
    for index, (value, weight) in enumerate(pairs):
        cumulative += weight
        if math.isclose(cumulative, half, rel_tol=1e-12) and index + 1 < len(pairs):
            return (value + pairs[index + 1][0]) / 2
        if cumulative > half:
            return value
    return pairs[-1][0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    memory_dynamic_factor: float = 1.0  # multiplies activations, buffers and overhead
    step_time_factor: float = 1.0  # multiplies every part of the step time: hardware x framework
    hardware_step_time_factor: float = 1.0  # what every run on the hardware says (links, clocks, host)
    framework_step_time_factor: float = 1.0  # what this framework's runs say beyond the hardware
    runs: int = 0
    memory_runs: int = 0
    time_runs: int = 0
    oom_runs: int = 0
    implausible_runs: int = 0  # stored runs left out by ``implausibility``; not in ``runs``
    # what the runs say, where ``step_time_factor`` is what one estimate may apply (capped at HFU 1)
    learned_step_time_factor: float | None = None
    # The largest estimated dynamic bytes among the runs: what the factor's surplus is measured on
    # when a search has to leave room for it before it knows a layout.
    reference_dynamic_bytes: int = 0
    # The runs behind each factor (Observation.run_id), and those set aside with why
    memory_run_ids: tuple[str, ...] = ()  # the framework's runs with a peak, and its OOMs (a floor)
    hardware_time_run_ids: tuple[str, ...] = ()  # every framework's runs with a step time
    framework_time_run_ids: tuple[str, ...] = ()  # this framework's runs with a step time
    set_aside: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def is_identity(self) -> bool:
        return self.memory_dynamic_factor == 1.0 and self.step_time_factor == 1.0


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


GIB = 2**30  # the unit every memory figure of an answer is read in


def implausibility(obs: Observation) -> tuple[str, ...]:
    """Why the run cannot be what the plan's layout measured on its hardware, with the numbers;
    empty when it can. Such a run is stored and diagnosed but moves no factor."""
    reasons = list(obs.another_job)
    measured, estimated = obs.measured_step_s, obs.estimated_step_s
    if measured and estimated and not obs.out_of_memory:
        # HFU = hardware FLOPs / (step x dense peak) <= 1: no step beats its FLOPs at the peak. The
        # FLOPs are what the kernels run (flops.py: the causal triangle for flash/SDPA), so the
        # estimate stays below HFU 1; its own step is still the floor where a run is faster still.
        if obs.peak_step_s and measured < min(obs.peak_step_s, estimated):
            reasons.append(
                f"step {measured:.4g} s is faster than the dense peak allows: the step's hardware FLOPs "
                f"(recompute included) take at least {obs.peak_step_s:.4g} s per GPU at peak, "
                f"HFU {obs.peak_step_s / measured:.3g} > 1"
            )
        ratio = measured / estimated
        if not 1 / IMPLAUSIBLE_RATIO <= ratio <= IMPLAUSIBLE_RATIO:
            reasons.append(
                f"step {measured:.4g} s is {ratio:.3g}x the estimated {estimated:.4g} s, more than "
                f"{IMPLAUSIBLE_RATIO:g}x off: another job than the plan's, or a broken measurement"
            )
    reported = obs.reported_peak_bytes
    if reported is not None and not obs.out_of_memory and reported > obs.capacity_bytes:
        # device used (nvidia-smi), reserved and allocated are all parts of the card's memory
        reasons.append(
            f"peak {reported / GIB:.4g} GiB is above the card's {obs.capacity_bytes / GIB:.4g} GiB, and the "
            "run did not run out of memory: no memory statistic of a GPU exceeds its memory"
        )
    peak = obs.measured_peak_bytes
    if peak is not None and not obs.out_of_memory:
        # parameters, gradients and optimizer states sit on the GPU for the whole step, allocated: every
        # statistic holds them, so the figure as reported is compared (12 GB allocated against 12.6 GB
        # of states passed as the 21 GB of device used it converts to, and lowered every later
        # estimate; memory review)
        held = reported if reported is not None else peak
        if held < obs.model_state_bytes:
            reasons.append(
                f"peak {held / GIB:.4g} GiB is below the {obs.model_state_bytes / GIB:.4g} GiB of model "
                "states (parameters, gradients, optimizer states) the most loaded GPU holds throughout"
            )
        estimated_bytes = obs.model_state_bytes + obs.dynamic_bytes
        if estimated_bytes > 0 and not (
            estimated_bytes / IMPLAUSIBLE_RATIO <= peak <= estimated_bytes * IMPLAUSIBLE_RATIO
        ):
            reasons.append(
                f"peak {peak / GIB:.4g} GiB is {peak / estimated_bytes:.3g}x the estimated "
                f"{estimated_bytes / GIB:.4g} GiB, more than {IMPLAUSIBLE_RATIO:g}x off: another job than "
                "the plan's, or a broken measurement"
            )
    if obs.out_of_memory and peak is not None and peak < obs.model_state_bytes:
        # the model states are resident before the first step: a peak below them is not one the run
        # reached before it ran out (an OOM "at 1 GB" on an 80 GB card set a memory factor of 1.6 for
        # every later plan; bounded-work review)
        reasons.append(
            f"ran out of memory at a reported peak of {peak / GIB:.4g} GiB, below the "
            f"{obs.model_state_bytes / GIB:.4g} GiB of model states the most loaded GPU holds throughout: "
            "not the peak the run reached"
        )
    if obs.out_of_memory:
        estimated_bytes = obs.model_state_bytes + obs.dynamic_bytes
        if 0 < estimated_bytes * IMPLAUSIBLE_RATIO < obs.capacity_bytes:
            reasons.append(
                f"ran out of {obs.capacity_bytes / GIB:.4g} GiB where the estimate is "
                f"{estimated_bytes / GIB:.4g} GiB, more than {IMPLAUSIBLE_RATIO:g}x off: another job than "
                "the plan's, or a leak"
            )
    return tuple(reasons)


def plausible(observations: Sequence[Observation]) -> list[Observation]:
    """The runs that may move a factor."""
    return [o for o in observations if not implausibility(o)]


def set_aside(observations: Sequence[Observation]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The runs that move no factor, each with why (``implausibility``)."""
    return tuple((o.run_id, why) for o in observations if (why := implausibility(o)))


def memory_ratio(obs: Observation) -> float | None:
    """measured dynamic / estimated dynamic, where the run reported a peak and did not OOM."""
    if obs.out_of_memory or obs.measured_peak_bytes is None or obs.dynamic_bytes <= 0:
        return None
    return max(obs.measured_peak_bytes - obs.model_state_bytes, 0) / obs.dynamic_bytes


def oom_floor(obs: Observation) -> float | None:
    """The smallest dynamic factor under which this OOM run's estimate would not have fit."""
    if not obs.out_of_memory or obs.dynamic_bytes <= 0:
        return None
    return OOM_MARGIN * (obs.capacity_bytes - obs.model_state_bytes) / obs.dynamic_bytes


def time_ratio(obs: Observation) -> float | None:
    """measured / estimated step time, where the run finished and reported one."""
    if obs.measured_step_s and obs.estimated_step_s and not obs.out_of_memory:
        return obs.measured_step_s / obs.estimated_step_s
    return None


def time_ratios(observations: Sequence[Observation]) -> list[float]:
    """``time_ratio`` of the runs that have one."""
    return [r for r in map(time_ratio, observations) if r is not None]


def _timed(observations: Sequence[Observation]) -> list[Observation]:
    return [o for o in observations if time_ratio(o) is not None]


def _weighted_time_median(timed: Sequence[Observation]) -> float:
    return weighted_median([time_ratio(o) or 0.0 for o in timed], [o.weight for o in timed])


def trusted(factor: float, observations: Sequence[Observation]) -> float:
    """``factor`` (a weighted median of runs' ratios) trusted as far as the runs' evidence reaches: a
    run of the job itself, today, weighs 1 and moves it all the way; runs weighing less in all move
    it that fraction of the way (geometrically). A median alone follows one run whatever it weighs:
    a 0.12B model's smoke test (weight 0.03 for a 70B job) multiplied every estimate on its hardware
    by its 2.48 (runs review, stop 39)."""
    evidence = min(1.0, math.fsum(o.weight for o in observations))
    return float(factor**evidence)


def shared_calibration(hardware: Sequence[Observation], framework: Sequence[Observation]) -> Calibration:
    """The calibration of one framework on one hardware: memory from the framework's own runs (its
    allocator and buffers), step time from every run on the hardware (what they say about its links,
    clocks and host is the same for every framework) times the framework's own deviation from that,
    trusted in proportion to its evidence (``FRAMEWORK_PRIOR_RUNS``; a run counts its weight).
    Implausible runs move nothing."""
    own = learn_calibration(framework)
    usable = plausible(hardware)
    shared = _timed(usable)
    if not shared:
        return own
    hardware_factor = _clamp(trusted(_weighted_time_median(shared), shared), TIME_FACTOR_BOUNDS)
    mine = _timed(plausible(framework))
    extra = 1.0
    if mine:
        evidence = math.fsum(o.weight for o in mine)
        weight = evidence / (evidence + FRAMEWORK_PRIOR_RUNS)
        extra = (_weighted_time_median(mine) / hardware_factor) ** weight
    return dataclasses.replace(
        own,
        step_time_factor=_clamp(hardware_factor * extra, TIME_FACTOR_BOUNDS),
        hardware_step_time_factor=hardware_factor,
        framework_step_time_factor=extra,
        runs=len(usable),
        time_runs=len(shared),
        implausible_runs=len(hardware) - len(usable),
        hardware_time_run_ids=tuple(o.run_id for o in shared),
        framework_time_run_ids=tuple(o.run_id for o in mine),
        set_aside=set_aside(hardware),
    )


def learn_calibration(stored: Sequence[Observation]) -> Calibration:
    """Factors from one framework's runs, the implausible ones left out; medians weighted by each
    run's evidence weight. An OOM's floor holds for its own job (weight 1) whatever the bounds, and
    toward 1 as the job differs (floor ** weight)."""
    observations = plausible(stored)
    sized = [o for o in observations if memory_ratio(o) is not None]
    ooms = [o for o in observations if oom_floor(o) is not None]
    memory = (
        _clamp(
            trusted(
                weighted_median([memory_ratio(o) or 0.0 for o in sized], [o.weight for o in sized]), sized
            ),
            MEMORY_FACTOR_BOUNDS,
        )
        if sized
        else 1.0
    )
    if ooms:
        # past the bounds too: clamped to 2.0, a floor of 4.51 let the layout that ran out of memory be
        # recommended again, "fits" (calibration review); as far as its job is this one (floor ** weight,
        # whole for the same job: a phi-3-mini run's floor of 8.04 multiplied an 8B job's at weight 0.08,
        # 178 GiB where 56 fit; change review), as the framework's own time factor is weighed
        memory = max(memory, *(_weakened(oom_floor(o) or 0.0, o.weight) for o in ooms))
    timed = _timed(observations)
    time = _clamp(trusted(_weighted_time_median(timed), timed), TIME_FACTOR_BOUNDS) if timed else 1.0
    return Calibration(
        memory_dynamic_factor=memory,
        step_time_factor=time,
        framework_step_time_factor=time,
        runs=len(observations),
        memory_runs=len(sized),
        time_runs=len(timed),
        oom_runs=len(ooms),
        implausible_runs=len(stored) - len(observations),
        reference_dynamic_bytes=max((o.dynamic_bytes for o in observations), default=0),
        memory_run_ids=tuple(o.run_id for o in (*sized, *ooms)),
        framework_time_run_ids=tuple(o.run_id for o in timed),
        set_aside=set_aside(stored),
    )


def _weakened(floor: float, weight: float) -> float:
    """An OOM floor as far as its job is this one: ``floor ** weight`` above 1 (toward 1 as the job
    differs); a floor at or below 1 raises nothing and is kept as it is (raised to a power it grew
    toward 1, and a negative one, states past the card, has no real power: change review)."""
    return floor**weight if floor > 1.0 else floor


def calibrated_bytes(estimated_bytes: int, factor: float) -> int:
    """A dynamic memory component (activations, buffers, overhead) scaled by the learned factor;
    never negative, so the calibrated total never goes below the model states."""
    return math.ceil(estimated_bytes * max(factor, 0.0))


def capped_step_time_factor(time: TimeEstimate, factor: float) -> float:
    """The step-time factor a calibrated estimate takes: no faster than HFU 1. HFU = hardware FLOPs
    / (step x GPUs x dense peak) (evaluate.time_estimate), so a factor f gives HFU time.hfu / f, and
    f >= time.hfu keeps it <= 1 (and MFU <= HFU with it): a calibrated estimate never quotes more
    than the peak, whatever the runs say."""
    return max(factor, time.hfu)


def applied_calibration(calibration: Calibration, time: TimeEstimate | None) -> Calibration:
    """``calibration`` with the step-time factor an uncalibrated ``time`` may take
    (``capped_step_time_factor``): what a stored estimate says it applied."""
    learned = calibration.step_time_factor
    if time is None or calibration.is_identity or capped_step_time_factor(time, learned) == learned:
        return calibration
    return dataclasses.replace(
        calibration, step_time_factor=capped_step_time_factor(time, learned), learned_step_time_factor=learned
    )


def calibrated_time(time: TimeEstimate, factor: float) -> TimeEstimate:
    """Every part of the step scaled by the learned factor, capped at HFU 1
    (``capped_step_time_factor``); rates and utilisation follow. Only for a calibrated estimate."""
    factor = capped_step_time_factor(time, factor)
    parts = {f.name: getattr(time.breakdown, f.name) * factor for f in dataclasses.fields(time.breakdown)}
    return dataclasses.replace(
        time,
        breakdown=TimeBreakdown(**parts),
        tokens_per_s=time.tokens_per_s / factor,
        tflops_per_gpu=time.tflops_per_gpu / factor,
        mfu=time.mfu / factor,
        hardware_tflops_per_gpu=time.hardware_tflops_per_gpu / factor,
        hfu=time.hfu / factor,
    )


def calibration_note(calibration: Calibration, applied_step_time_factor: float | None = None) -> str:
    memory, applied = calibration.memory_dynamic_factor, calibration.step_time_factor
    time = calibration.learned_step_time_factor or applied
    if applied_step_time_factor is not None:
        applied = applied_step_time_factor
    capped = (
        f" (the runs say x{time:.3f}; capped at x{applied:.3f}, where the step's hardware FLOPs run at "
        "the GPU's dense peak, HFU 1)"
        if applied != time
        else ""
    )
    left_out = ""
    if calibration.implausible_runs:
        left_out = f"; {calibration.implausible_runs} implausible run(s) left out"
    return (
        f"calibrated from {calibration.runs} observed run(s) on this hardware and framework: "
        f"dynamic memory x{memory:.3f}, step time x{applied:.3f}{capped}{left_out}"
    )
