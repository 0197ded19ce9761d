"""Correction factors learned from observed runs, and their application to an estimate.

The model states (parameters, gradients, optimizer states) are exact arithmetic, so runs only
calibrate what is not: the dynamic part of memory (activations, buffers, overhead, which depend
on kernels, allocator and framework version) and the step time. Factors are medians of the
observed/estimated ratios, bounded so that a few odd runs cannot swing a plan wildly. A run that
ran out of memory sets a floor: the dynamic factor must be large enough that its estimate would
not have fit, plus a margin.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from service.estimator.types import TimeBreakdown, TimeEstimate

# Bounds of the learned factors: outside them a run says more about a broken setup than about
# the estimator, and the plan should not follow it blindly.
MEMORY_FACTOR_BOUNDS = (0.8, 2.0)
TIME_FACTOR_BOUNDS = (0.5, 3.0)
# An out-of-memory run proves the real need exceeded capacity; ask this much more than that.
OOM_MARGIN = 1.05
# Assumption, not fitted: a framework's own step-time factor (on top of the hardware's) is trusted in
# proportion to its runs, n / (n + FRAMEWORK_PRIOR_RUNS): one run moves it a third of the way.
FRAMEWORK_PRIOR_RUNS = 2


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
    # The largest estimated dynamic bytes among the runs: what the factor's surplus is measured on
    # when a search has to leave room for it before it knows a layout.
    reference_dynamic_bytes: int = 0

    @property
    def is_identity(self) -> bool:
        return self.memory_dynamic_factor == 1.0 and self.step_time_factor == 1.0


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


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
    trusted in proportion to its runs (``FRAMEWORK_PRIOR_RUNS``)."""
    own = learn_calibration(framework)
    shared = time_ratios(hardware)
    if not shared:
        return own
    hardware_factor = _clamp(statistics.median(shared), TIME_FACTOR_BOUNDS)
    mine = time_ratios(framework)
    extra = 1.0
    if mine:
        weight = len(mine) / (len(mine) + FRAMEWORK_PRIOR_RUNS)
        extra = (statistics.median(mine) / hardware_factor) ** weight
    return dataclasses.replace(
        own,
        step_time_factor=_clamp(hardware_factor * extra, TIME_FACTOR_BOUNDS),
        hardware_step_time_factor=hardware_factor,
        framework_step_time_factor=extra,
        runs=len(hardware),
        time_runs=len(shared),
    )


def learn_calibration(observations: Sequence[Observation]) -> Calibration:
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
        reference_dynamic_bytes=max((o.dynamic_bytes for o in observations), default=0),
    )


def calibrated_bytes(estimated_bytes: int, factor: float) -> int:
    """A dynamic memory component (activations, buffers, overhead) scaled by the learned factor."""
    return math.ceil(estimated_bytes * factor)


def calibrated_time(time: TimeEstimate, factor: float) -> TimeEstimate:
    """Every part of the step scaled by the learned factor; rates and utilisation follow."""
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


def calibration_note(calibration: Calibration) -> str:
    memory, time = calibration.memory_dynamic_factor, calibration.step_time_factor
    return (
        f"calibrated from {calibration.runs} observed run(s) on this hardware and framework: "
        f"dynamic memory x{memory:.3f}, step time x{time:.3f}"
    )
