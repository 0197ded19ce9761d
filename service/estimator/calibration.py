"""Correction factors learned from observed runs, and their application to an estimate.

The model states (parameters, gradients, optimizer states) are exact arithmetic, so runs only
calibrate what is not: the dynamic part of memory (activations, buffers, overhead, which depend
on kernels, allocator and framework version) and the step time. Factors are medians of the
observed/estimated ratios, bounded so that a few odd runs cannot swing a plan wildly. A run that
ran out of memory sets a floor: the dynamic factor must be large enough that its estimate would
not have fit, plus a margin.

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
import statistics
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """One stored run next to the estimate its plan recommended."""

    model_state_bytes: int  # estimated parameters + gradients + optimizer states per GPU
    dynamic_bytes: int  # estimated activations + buffers + overhead per GPU
    capacity_bytes: int
    measured_peak_bytes: int | None
    out_of_memory: bool
    estimated_step_s: float | None
    measured_step_s: float | None
    # the step's hardware FLOPs per GPU (recompute included) at the GPU's dense peak of the
    # precision: the step time at HFU 1 (evaluate.time_estimate: hfu = hardware FLOPs / (step x peak))
    peak_step_s: float | None = None


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

    @property
    def is_identity(self) -> bool:
        return self.memory_dynamic_factor == 1.0 and self.step_time_factor == 1.0


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


GB = 1e9


def implausibility(obs: Observation) -> tuple[str, ...]:
    """Why the run cannot be what the plan's layout measured on its hardware, with the numbers;
    empty when it can. Such a run is stored and diagnosed but moves no factor."""
    reasons = []
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
    peak = obs.measured_peak_bytes
    if peak is not None and not obs.out_of_memory:
        # parameters, gradients and optimizer states sit on the GPU for the whole step
        if peak < obs.model_state_bytes:
            reasons.append(
                f"peak {peak / GB:.4g} GB is below the {obs.model_state_bytes / GB:.4g} GB of model "
                "states (parameters, gradients, optimizer states) the most loaded GPU holds throughout"
            )
        estimated_bytes = obs.model_state_bytes + obs.dynamic_bytes
        if estimated_bytes > 0 and not (
            estimated_bytes / IMPLAUSIBLE_RATIO <= peak <= estimated_bytes * IMPLAUSIBLE_RATIO
        ):
            reasons.append(
                f"peak {peak / GB:.4g} GB is {peak / estimated_bytes:.3g}x the estimated "
                f"{estimated_bytes / GB:.4g} GB, more than {IMPLAUSIBLE_RATIO:g}x off: another job than "
                "the plan's, or a broken measurement"
            )
    if obs.out_of_memory:
        estimated_bytes = obs.model_state_bytes + obs.dynamic_bytes
        if 0 < estimated_bytes * IMPLAUSIBLE_RATIO < obs.capacity_bytes:
            reasons.append(
                f"ran out of {obs.capacity_bytes / GB:.4g} GB where the estimate is "
                f"{estimated_bytes / GB:.4g} GB, more than {IMPLAUSIBLE_RATIO:g}x off: another job than "
                "the plan's, or a leak"
            )
    return tuple(reasons)


def plausible(observations: Sequence[Observation]) -> list[Observation]:
    """The runs that may move a factor."""
    return [o for o in observations if not implausibility(o)]


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


def time_ratios(observations: Sequence[Observation]) -> list[float]:
    """measured / estimated step time of the runs that finished and reported one."""
    return [
        o.measured_step_s / o.estimated_step_s
        for o in observations
        if o.measured_step_s and o.estimated_step_s and not o.out_of_memory
    ]


def shared_calibration(hardware: Sequence[Observation], framework: Sequence[Observation]) -> Calibration:
    """The calibration of one framework on one hardware: memory from the framework's own runs (its
    allocator and buffers), step time from every run on the hardware (what they say about its links,
    clocks and host is the same for every framework) times the framework's own deviation from that,
    trusted in proportion to its runs (``FRAMEWORK_PRIOR_RUNS``). Implausible runs move nothing."""
    own = learn_calibration(framework)
    usable = plausible(hardware)
    shared = time_ratios(usable)
    if not shared:
        return own
    hardware_factor = _clamp(statistics.median(shared), TIME_FACTOR_BOUNDS)
    mine = time_ratios(plausible(framework))
    extra = 1.0
    if mine:
        weight = len(mine) / (len(mine) + FRAMEWORK_PRIOR_RUNS)
        extra = (statistics.median(mine) / hardware_factor) ** weight
    return dataclasses.replace(
        own,
        step_time_factor=_clamp(hardware_factor * extra, TIME_FACTOR_BOUNDS),
        hardware_step_time_factor=hardware_factor,
        framework_step_time_factor=extra,
        runs=len(usable),
        time_runs=len(shared),
        implausible_runs=len(hardware) - len(usable),
    )


def learn_calibration(stored: Sequence[Observation]) -> Calibration:
    """Factors from one framework's runs, the implausible ones left out."""
    observations = plausible(stored)
    ratios = [r for r in map(memory_ratio, observations) if r is not None]
    floors = [f for f in map(oom_floor, observations) if f is not None]
    memory = statistics.median(ratios) if ratios else 1.0
    if floors:
        memory = max(memory, *floors)
    times = time_ratios(observations)
    return Calibration(
        memory_dynamic_factor=_clamp(memory, MEMORY_FACTOR_BOUNDS) if ratios or floors else 1.0,
        step_time_factor=_clamp(statistics.median(times), TIME_FACTOR_BOUNDS) if times else 1.0,
        framework_step_time_factor=_clamp(statistics.median(times), TIME_FACTOR_BOUNDS) if times else 1.0,
        runs=len(observations),
        memory_runs=len(ratios),
        time_runs=len(times),
        oom_runs=len(floors),
        implausible_runs=len(stored) - len(observations),
        reference_dynamic_bytes=max((o.dynamic_bytes for o in observations), default=0),
    )


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
