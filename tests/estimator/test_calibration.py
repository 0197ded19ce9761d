"""Calibration shared across frameworks: the hardware's step-time factor from every run on it, a
framework's own deviation trusted in proportion to its runs; memory from the framework's own runs."""

from __future__ import annotations

import pytest

from service.estimator.calibration import (
    FRAMEWORK_PRIOR_RUNS,
    Observation,
    learn_calibration,
    shared_calibration,
)


def run(ratio: float, peak: int | None = None) -> Observation:
    return Observation(
        model_state_bytes=10,
        dynamic_bytes=100,
        capacity_bytes=1000,
        measured_peak_bytes=peak,
        out_of_memory=False,
        estimated_step_s=2.0,
        measured_step_s=2.0 * ratio,
    )


def test_a_framework_without_runs_takes_the_hardware_factor() -> None:
    deepspeed = [run(1.5, peak=210)]  # measured dynamic 200 of an estimated 100
    fsdp = shared_calibration(deepspeed, [])
    assert (fsdp.step_time_factor, fsdp.hardware_step_time_factor, fsdp.framework_step_time_factor) == (
        1.5,
        1.5,
        1.0,
    )
    assert fsdp.memory_dynamic_factor == 1.0  # memory is the framework's own
    assert learn_calibration(deepspeed).memory_dynamic_factor == 2.0


def test_a_frameworks_own_deviation_counts_in_proportion_to_its_runs() -> None:
    deepspeed, fsdp = [run(2.0)], [run(1.0)]
    # hardware: the median of both runs, 1.5; DeepSpeed's own 2.0 / 1.5 with weight 1 / (1 + 2)
    own = shared_calibration(deepspeed + fsdp, deepspeed)
    weight = 1 / (1 + FRAMEWORK_PRIOR_RUNS)
    assert own.hardware_step_time_factor == 1.5
    assert own.framework_step_time_factor == pytest.approx((2.0 / 1.5) ** weight)
    assert own.step_time_factor == pytest.approx(1.5 * (2.0 / 1.5) ** weight)
    # with many runs of its own the framework's factor approaches its own median
    many = [run(2.0)] * 40
    assert shared_calibration(many + fsdp, many).step_time_factor == pytest.approx(2.0, rel=0.05)
