"""Calibration from stored runs: which runs apply to an estimate, the factors they give, and the
headroom a plan's search keeps because of them.

Runs apply to later estimates on the same hardware (a fingerprint of the resolved cluster, so a
stored cluster and an identical inline one share it, and editing a cluster's hardware starts
afresh) and the same framework.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable

from service.contracts.estimates import CalibrationFactors, CalibrationOut
from service.contracts.results import PlanResult, StoredRequest
from service.estimator.calibration import Calibration, Observation, shared_calibration
from service.estimator.types import ClusterSpec
from service.feedback import ObservedRun, measured_step_s
from service.persistence.models import PlanRecord, RunRecord
from service.persistence.repository import PlanRepository
from service.recommender import headroom
from service.recommender.types import Constraints


def hardware_key(cluster: ClusterSpec) -> str:
    canonical = json.dumps(dataclasses.asdict(cluster), sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def observed(run: RunRecord) -> ObservedRun:
    return ObservedRun(
        peak_memory_bytes_per_gpu=run.peak_memory_bytes_per_gpu,
        step_s=run.step_s,
        tokens_per_s=run.tokens_per_s,
        gpu_utilization=run.gpu_utilization,
        out_of_memory=run.out_of_memory,
    )


def observation(run: RunRecord, plan: PlanRecord) -> Observation | None:
    """The run next to its plan's *uncalibrated* estimate (factors applied then are divided out)."""
    recommended = PlanResult.read(plan.result).recommended
    if recommended is None:
        return None
    estimate = recommended.estimate
    factors = estimate.calibration.factors if estimate.calibration else CalibrationFactors()
    per_gpu = estimate.memory.per_gpu
    states = per_gpu.parameters + per_gpu.gradients + per_gpu.optimizer_states
    dynamic = (per_gpu.activations + per_gpu.buffers + per_gpu.overhead) / factors.memory_dynamic
    time = estimate.time
    tokens_per_step = StoredRequest.read(plan.request).training.tokens_per_step
    # step x HFU is the step's hardware FLOPs per GPU over the dense peak: the step at HFU 1, the same
    # before and after a step-time factor (which divides HFU as it multiplies the step)
    peak_step_s = time.step_s * time.hfu if time and time.hfu else None
    return Observation(
        model_state_bytes=states,
        dynamic_bytes=round(dynamic),
        capacity_bytes=estimate.memory.capacity_bytes,
        measured_peak_bytes=run.peak_memory_bytes_per_gpu,
        out_of_memory=run.out_of_memory,
        estimated_step_s=time.step_s / factors.step_time if time else None,
        measured_step_s=measured_step_s(observed(run), tokens_per_step),
        peak_step_s=peak_step_s,
    )


def calibration_for(repo: PlanRepository, key: str, framework: str) -> Calibration:
    """The framework's calibration on this hardware: step time from every framework's runs on it,
    memory and the framework's own deviation from its own (``shared_calibration``)."""
    return calibrations_for(repo, key, (framework,))[framework]


def calibrations_for(repo: PlanRepository, key: str, frameworks: Iterable[str]) -> dict[str, Calibration]:
    """``calibration_for`` of each framework, from one read of the runs on this hardware."""
    pairs = [(o, plan.framework) for run, plan in repo.runs_on_hardware(key) if (o := observation(run, plan))]
    every = [o for o, _ in pairs]
    return {fw: shared_calibration(every, [o for o, own in pairs if own == fw]) for fw in frameworks}


def calibration_out(calibration: Calibration) -> CalibrationOut | None:
    """The factors and the runs they come from; ``step_time`` is the factor applied (capped where the
    step would beat the dense peak), ``step_time_learned`` what the runs say."""
    if calibration.runs == 0 and calibration.implausible_runs == 0:
        return None
    learned = calibration.learned_step_time_factor
    return CalibrationOut(
        factors=CalibrationFactors(
            memory_dynamic=calibration.memory_dynamic_factor,
            step_time=calibration.step_time_factor,
            step_time_learned=calibration.step_time_factor if learned is None else learned,
            step_time_hardware=calibration.hardware_step_time_factor,
            step_time_framework=calibration.framework_step_time_factor,
        ),
        runs=calibration.runs,
        memory_runs=calibration.memory_runs,
        time_runs=calibration.time_runs,
        out_of_memory_runs=calibration.oom_runs,
        implausible_runs=calibration.implausible_runs,
    )


def headroom_for(
    constraints: Constraints, calibrations: dict[str, Calibration], capacity_bytes: int
) -> Constraints:
    """Make the search as conservative as the runs ask: a dynamic-memory factor above 1 (an OOM
    sets one) widens the required headroom by the extra bytes it implies for that hardware."""
    extra = 0.0
    for calibration in calibrations.values():
        if calibration.memory_dynamic_factor > 1.0 and calibration.reference_dynamic_bytes:
            surplus = (calibration.memory_dynamic_factor - 1.0) * calibration.reference_dynamic_bytes
            extra = max(extra, surplus / capacity_bytes)
    if extra == 0.0:
        return constraints
    return dataclasses.replace(
        constraints, min_headroom_fraction=headroom.widened(constraints.min_headroom_fraction, extra)
    )
