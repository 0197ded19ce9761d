"""Calibration shared across frameworks: the hardware's step-time factor from every run on it, a
framework's own deviation trusted in proportion to its runs; memory from the framework's own runs.
Runs that could not have happened move nothing, and no factor takes an estimate past the GPU's peak."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator.calibration import (
    FRAMEWORK_PRIOR_RUNS,
    IMPLAUSIBLE_RATIO,
    MEMORY_FACTOR_BOUNDS,
    OLDER_ESTIMATOR_WEIGHT,
    OTHER_FAMILY_WEIGHT,
    RECENCY_HALF_LIFE_DAYS,
    TIME_FACTOR_BOUNDS,
    Calibration,
    Evidence,
    JobTraits,
    Observation,
    applied_calibration,
    calibrated_time,
    capped_step_time_factor,
    evidence_weight,
    implausibility,
    layout_family,
    learn_calibration,
    shared_calibration,
    weighted_median,
)
from service.estimator.estimate import estimate
from service.estimator.types import Estimate, Framework, Layout, Recompute, TrainingSpec
from tests.recommender.helpers import cluster


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


# ---------------------------------------------------------------- runs checked before they count

GB = 2**30  # the answers' unit: the messages say GiB, as every memory figure does


def measured(
    step_s: float | None = None, peak: int | None = None, oom: bool = False, peak_step_s: float | None = 2.0
) -> Observation:
    """A run of a plan estimated at 4 s a step (2 s: the step's FLOPs at the dense peak, HFU 0.5)
    and 30 GiB per GPU, 20 GiB of them model states, on an 80 GiB card."""
    return Observation(
        model_state_bytes=20 * GB,
        dynamic_bytes=10 * GB,
        capacity_bytes=80 * GB,
        measured_peak_bytes=peak,
        out_of_memory=oom,
        estimated_step_s=4.0,
        measured_step_s=step_s,
        peak_step_s=peak_step_s,
    )


def test_a_plausible_run_has_no_reason_against_it() -> None:
    for run in (measured(3.0, 28 * GB), measured(2.0), measured(16.0), measured(peak=21 * GB)):
        assert implausibility(run) == ()


def test_a_step_faster_than_the_dense_peak_allows_is_implausible() -> None:
    # the run: 0.001 s where the step's FLOPs need 2 s at the peak (HFU 2000)
    reasons = implausibility(measured(0.001))
    assert "faster than the dense peak allows" in reasons[0] and "HFU 2e+03 > 1" in reasons[0]
    assert "more than 4x off" in reasons[1]
    # just past the peak: HFU 1.05, within 4x of the estimate, still impossible
    (reason,) = implausibility(measured(2.0 / 1.05))
    assert "at least 2 s per GPU at peak, HFU 1.05 > 1" in reason


def test_where_the_estimate_itself_is_above_hfu_1_its_own_step_is_the_floor() -> None:
    # an estimate whose own HFU is 1.25 (none is now that flops.py counts what the kernels execute;
    # the floor stays for any that would be)
    over = measured(3.9, peak_step_s=5.0)
    assert "faster than the dense peak" in implausibility(over)[0]
    assert implausibility(measured(4.5, peak_step_s=5.0)) == ()


def test_a_step_more_than_the_stated_factor_off_the_estimate_is_implausible() -> None:
    assert IMPLAUSIBLE_RATIO == 4.0
    (slow,) = implausibility(measured(16.1))
    assert "step 16.1 s is 4.03x the estimated 4 s, more than 4x off" in slow
    assert implausibility(measured(16.0)) == ()
    # 0.99 s is 0.2475x: below the peak's 1 s as well as more than 4x faster
    assert len(implausibility(measured(0.99))) == 2


def test_a_peak_below_the_model_states_is_implausible() -> None:
    # the 1 MiB peak, and a peak just under the 20 GiB of states
    tiny = implausibility(measured(peak=2**20))
    assert "below the 20 GiB of model states" in tiny[0] and "more than 4x off" in tiny[1]
    (under,) = implausibility(measured(peak=20 * GB - 1))
    assert under.startswith("peak 20 GiB is below the 20 GiB of model states")
    (huge,) = implausibility(measured(peak=121 * GB))
    assert "4.03x the estimated 30 GiB" in huge


def test_a_peak_above_the_card_without_an_oom_is_implausible() -> None:
    # 90 GiB reported on an 80 GiB card: within 4x of the 30 GiB estimate, above the card
    above = dataclasses.replace(measured(peak=90 * GB), reported_peak_bytes=90 * GB)
    reasons = implausibility(above)
    assert reasons == ("peak 90 GiB is above the card's 80 GiB, and the run did not run out of memory: no "
                       "memory statistic of a GPU exceeds its memory",)  # fmt: skip
    # the card's whole memory is a possible peak; an OOM's reported figure is not a peak
    assert implausibility(dataclasses.replace(above, reported_peak_bytes=80 * GB)) == ()
    assert not any(
        "above the card" in r for r in implausibility(dataclasses.replace(above, out_of_memory=True))
    )


def test_an_out_of_memory_run_far_above_the_estimate_is_implausible() -> None:
    assert implausibility(measured(oom=True)) == ()  # 80 GiB < 4 x 30 GiB
    small = dataclasses.replace(measured(oom=True), model_state_bytes=GB, dynamic_bytes=GB)
    assert "ran out of 80 GiB where the estimate is 2 GiB" in implausibility(small)[0]


def test_implausible_runs_move_no_factor_and_are_counted() -> None:
    absurd = [measured(0.001), measured(peak=2**20), measured(100.0, 200 * GB)]
    alone = learn_calibration(absurd)
    assert alone.is_identity and alone.runs == 0 and alone.implausible_runs == 3
    shared = shared_calibration(absurd, absurd)
    assert shared.is_identity and shared.runs == 0 and shared.implausible_runs == 3
    # next to a plausible run, the factors are that run's alone
    with_one = shared_calibration([*absurd, measured(6.0, 35 * GB)], [*absurd, measured(6.0, 35 * GB)])
    assert with_one.step_time_factor == 1.5 and with_one.memory_dynamic_factor == 1.5
    assert with_one.runs == 1 and with_one.implausible_runs == 3
    assert (with_one.hardware_step_time_factor, with_one.framework_step_time_factor) == (1.5, 1.0)


# ---------------------------------------------------------------- calibrated numbers capped by physics

H100 = cluster("h100-sxm-80gb", 1)
# (model, layout, training): low HFU (GPT-2, short sequences) to high (8B at 32k with full recompute)
SHAPES = [
    ("gpt2", Layout(dp=8, zero_stage=1), TrainingSpec(seq_len=1024, global_batch_size=64)),
    (
        "llama-3.1-8b",
        Layout(framework=Framework.MEGATRON, tp=2, dp=4, zero_stage=1, sequence_parallel=True),
        TrainingSpec(seq_len=8192, global_batch_size=128),
    ),
    (
        "llama-3.1-8b",
        Layout(framework=Framework.MEGATRON, cp=8, zero_stage=1, recompute=Recompute.FULL),
        TrainingSpec(seq_len=32768, global_batch_size=8),
    ),
]


def uncalibrated_and_calibrated(factor: float) -> list[tuple[Estimate, Estimate]]:
    pairs = []
    for name, layout, training in SHAPES:
        spec = model(name).spec
        plain = estimate(spec, H100, layout, training, tuning=default_tuning(), with_limits=False)
        runs = Calibration(step_time_factor=factor, memory_dynamic_factor=MEMORY_FACTOR_BOUNDS[0], runs=1)
        calibrated = estimate(spec, H100, layout, training, tuning=default_tuning(), calibration=runs)
        pairs.append((plain, calibrated))
    return pairs


@pytest.mark.parametrize("factor", [TIME_FACTOR_BOUNDS[0], 0.6, 1.0, 1.5])
def test_no_calibrated_estimate_exceeds_the_gpus_dense_peak(factor: float) -> None:
    for plain, calibrated in uncalibrated_and_calibrated(factor):
        assert plain.time is not None and calibrated.time is not None
        t = calibrated.time
        assert t.hfu <= 1 + 1e-12 and t.mfu <= t.hfu
        assert H100.gpu.peak_flops_per_s.bf16 is not None
        peak_tflops = H100.gpu.peak_flops_per_s.bf16 / 1e12
        assert t.hardware_tflops_per_gpu <= peak_tflops * (1 + 1e-12)
        # never below the step's FLOPs at the peak, never faster than the runs say either
        assert t.step_s >= plain.time.step_s * min(plain.time.hfu, 1.0) * (1 - 1e-12)
        assert t.step_s >= plain.time.step_s * factor * (1 - 1e-12)
        if factor >= 1.0 or plain.time.hfu <= factor:
            assert t.step_s == pytest.approx(plain.time.step_s * factor)  # nothing to cap
        else:
            assert t.hfu == pytest.approx(1.0)
            assert any("capped at" in note and "HFU 1" in note for note in calibrated.assumptions)
        # the lowest memory factor scales only the dynamic part: never below the model states
        states = calibrated.memory.per_gpu
        assert states.total >= states.parameters + states.gradients + states.optimizer_states
        assert (states.parameters, states.gradients) == (
            plain.memory.per_gpu.parameters,
            plain.memory.per_gpu.gradients,
        )


def test_the_cap_lies_between_the_factor_and_the_uncalibrated_step() -> None:
    (_, _, (name, layout, training)) = SHAPES
    time = estimate(model(name).spec, H100, layout, training, tuning=default_tuning()).time
    assert time is not None and 0.3 < time.hfu < 1.0  # the 8B at 32k: the cap binds at 0.3
    assert capped_step_time_factor(time, 0.3) == time.hfu
    assert capped_step_time_factor(time, 2.0) == 2.0
    assert calibrated_time(time, 0.3).hfu == pytest.approx(1.0)
    # an estimate above HFU 1 (none is now: flops.py counts what the kernels execute) is slowed to HFU 1
    over = dataclasses.replace(time, hfu=1.25)
    assert capped_step_time_factor(over, 0.5) == capped_step_time_factor(over, 1.2) == 1.25
    assert capped_step_time_factor(over, 1.5) == 1.5
    assert applied_calibration(Calibration(), over) == Calibration()  # no runs: the estimate as it is
    applied = applied_calibration(Calibration(step_time_factor=0.3, runs=1), time)
    assert applied.step_time_factor == time.hfu and applied.learned_step_time_factor == 0.3
    slower = applied_calibration(Calibration(step_time_factor=1.5, runs=1), time)
    assert slower.step_time_factor == 1.5 and slower.learned_step_time_factor is None


def test_the_long_sequence_case_is_within_the_peak_calibrated_or_not() -> None:
    # A small model at 64k tokens on one A100 with full recompute (the invariant suite's case, there
    # GPT-2's, whose 1,024 learned positions now refuse it): the FLOPs once counted attention's full
    # square while the time ran its causal triangle, HFU 1.14; now both count what the flash kernel
    # executes, the step's FLOPs run at the A100's GEMM rate at most
    spec, a100 = model("qwen2.5-0.5b").spec, cluster("a100-sxm-40gb", 1, per_node=1)
    layout, training = Layout(recompute=Recompute.FULL), TrainingSpec(seq_len=65536, global_batch_size=1)
    plain = estimate(spec, a100, layout, training, tuning=default_tuning()).time
    assert plain is not None and plain.mfu < plain.hfu < 1
    for factor in (TIME_FACTOR_BOUNDS[0], 1.0, 1.01):
        runs = Calibration(step_time_factor=factor, memory_dynamic_factor=1.1, runs=1)
        time = estimate(spec, a100, layout, training, tuning=default_tuning(), calibration=runs).time
        assert time is not None and time.mfu < time.hfu <= 1 + 1e-12
        # a factor below the estimate's HFU is capped there, at HFU 1; others apply as they are
        expected = 1.0 if factor < plain.hfu else plain.hfu / factor
        assert time.hfu == pytest.approx(expected)


# ---------------------------------------------------------------- runs weighed as evidence

TARGET = JobTraits(parameters=8 * 10**9, seq_len=8192, family="model-parallel")


def evidence(**changes: object) -> Evidence:
    base = Evidence(age_days=0, same_estimator=True, job=TARGET)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_a_run_of_the_same_job_today_under_this_estimator_counts_fully() -> None:
    assert evidence_weight(evidence(), TARGET) == (1.0, ())


@pytest.mark.parametrize(
    ("changes", "weight", "said"),
    [
        ({"age_days": RECENCY_HALF_LIFE_DAYS}, 0.5, "30 days old"),
        ({"age_days": 2 * RECENCY_HALF_LIFE_DAYS}, 0.25, "60 days old"),
        ({"same_estimator": False}, OLDER_ESTIMATOR_WEIGHT, "older estimator"),
        ({"job": dataclasses.replace(TARGET, parameters=16 * 10**9)}, 1 / 2, "16B parameters for 8B"),
        ({"job": dataclasses.replace(TARGET, parameters=2 * 10**9)}, 1 / 3, "2B parameters for 8B"),
        ({"job": dataclasses.replace(TARGET, seq_len=4096)}, 1 / 2, "sequence 4,096 for 8,192"),
        ({"job": dataclasses.replace(TARGET, family="data-parallel")}, OTHER_FAMILY_WEIGHT, "data-parallel"),
    ],
)
def test_each_difference_lowers_the_weight_by_its_stated_factor(
    changes: dict[str, object], weight: float, said: str
) -> None:
    got, why = evidence_weight(evidence(**changes), TARGET)
    assert got == pytest.approx(weight)
    assert len(why) == 1 and said in why[0]


def test_the_factors_multiply_and_a_search_without_a_layout_ignores_the_family() -> None:
    other = evidence(
        age_days=30,
        same_estimator=False,
        job=JobTraits(parameters=4 * 10**9, seq_len=8192, family="data-parallel"),
    )
    assert evidence_weight(other, TARGET)[0] == pytest.approx(
        0.5 * OLDER_ESTIMATOR_WEIGHT * 0.5 * OTHER_FAMILY_WEIGHT
    )
    anyfamily = dataclasses.replace(TARGET, family=None)
    assert evidence_weight(other, anyfamily)[0] == pytest.approx(0.5 * OLDER_ESTIMATOR_WEIGHT * 0.5)


def test_layout_families() -> None:
    assert layout_family(tp=1, pp=1, cp=1, ep=1) == "data-parallel"
    assert {layout_family(tp=2, pp=1, cp=1, ep=1), layout_family(tp=1, pp=4, cp=1, ep=1)} == {
        "model-parallel"
    }
    assert layout_family(tp=1, pp=1, cp=2, ep=1) == "model-parallel"
    assert layout_family(tp=2, pp=1, cp=1, ep=8) == "expert-parallel"


@given(st.lists(st.floats(0.1, 10), min_size=1, max_size=9))
def test_equal_weights_give_the_plain_median(values: list[float]) -> None:
    assert weighted_median(values, [0.7] * len(values)) == pytest.approx(statistics.median(values))


def test_the_weighted_median_follows_the_heavier_runs() -> None:
    assert weighted_median([1.0, 2.0, 3.0], [0.1, 0.1, 1.0]) == 3.0
    assert weighted_median([1.0, 2.0], [1.0, 1.0]) == 1.5  # cumulative weight stops at half: the mean
    with pytest.raises(ValueError, match="positive weights"):
        weighted_median([1.0], [0.0])


def test_close_recent_runs_outweigh_far_old_ones_and_ids_say_which_moved_what() -> None:
    fresh = dataclasses.replace(run(1.2, peak=130), run_id="fresh")  # dynamic 120 of 100: x1.2
    old = [dataclasses.replace(run(2.0, peak=210), run_id=f"old{i}", weight=0.1) for i in range(2)]
    unweighted = learn_calibration([dataclasses.replace(o, weight=1.0) for o in old] + [fresh])
    weighted = learn_calibration([*old, fresh])
    assert unweighted.step_time_factor == 2.0 and weighted.step_time_factor == pytest.approx(1.2)
    assert weighted.memory_dynamic_factor == pytest.approx(1.2)
    assert weighted.memory_run_ids == weighted.framework_time_run_ids == ("old0", "old1", "fresh")
    # a framework's own deviation is trusted by its evidence (summed weights), not its count
    hardware = [dataclasses.replace(run(1.0), run_id="other")]
    mine = [dataclasses.replace(run(2.0), run_id="mine", weight=0.5)]
    shared = shared_calibration(hardware + mine, mine)
    assert shared.hardware_step_time_factor == 1.0  # the weighted median: the heavier run
    weight = 0.5 / (0.5 + FRAMEWORK_PRIOR_RUNS)
    assert shared.framework_step_time_factor == pytest.approx((2.0 / 1.0) ** weight)
    assert shared.hardware_time_run_ids == ("other", "mine") and shared.framework_time_run_ids == ("mine",)


def test_a_run_set_aside_is_named_with_its_reasons() -> None:
    absurd = dataclasses.replace(measured(step_s=40.0), run_id="absurd")
    calibration = shared_calibration([absurd], [absurd])
    assert [run_id for run_id, _ in calibration.set_aside] == ["absurd"]
    assert "more than 4x off" in calibration.set_aside[0][1][0]


def test_an_out_of_memory_run_below_its_model_states_is_implausible() -> None:
    """An OOM "at 1 GiB" on an 80 GiB card with 20 GiB of resident model states: not the peak the run
    reached (it set a memory factor of 1.6 for every later plan; bounded-work review)."""
    (below,) = implausibility(dataclasses.replace(measured(peak=GB), out_of_memory=True))
    assert below.startswith("ran out of memory at a reported peak of 1 GiB, below the 20 GiB of model states")
    assert implausibility(dataclasses.replace(measured(peak=70 * GB), out_of_memory=True)) == ()


def test_an_oom_floor_holds_past_the_factor_bounds() -> None:
    # ran out of memory with (80 - 20) GiB free for an estimated 10 GiB of dynamic memory: the factor
    # must reach 1.05 x 60 / 10 = 6.3 for that layout not to fit again; clamped to the bounds' 2.0 the
    # same layout was recommended again, "fits" (calibration review). Measured ratios stay bounded.
    floor = learn_calibration([measured(oom=True)])
    assert floor.memory_dynamic_factor == pytest.approx(1.05 * 60 / 10)
    assert floor.memory_dynamic_factor > MEMORY_FACTOR_BOUNDS[1]
    sized = learn_calibration([measured(peak=20 * GB + 35 * GB)])  # 3.5x the dynamic estimate
    assert sized.memory_dynamic_factor == MEMORY_FACTOR_BOUNDS[1]


def test_an_oom_floor_holds_as_far_as_its_job_is_this_one() -> None:
    # floor ** weight: whole for the same job, toward 1 for another (a phi-3-mini run's floor of 8.04
    # multiplied an 8B job's dynamic memory at weight 0.08: change review)
    floor = 1.05 * 60 / 10
    far = learn_calibration([dataclasses.replace(measured(oom=True), weight=0.25)])
    assert far.memory_dynamic_factor == pytest.approx(floor**0.25)
    assert learn_calibration([measured(oom=True)]).memory_dynamic_factor == pytest.approx(floor)


def test_an_oom_floor_at_or_below_one_is_kept_whatever_its_weight() -> None:
    # raised to a weight below 1 a floor under 1 grew toward 1 (above a same-job factor of 0.85), and a
    # negative one (states past the card) became complex (change review)
    from service.estimator.calibration import _weakened

    assert _weakened(0.35, 0.05) == 0.35
    assert _weakened(-0.5, 0.5) == -0.5
    assert _weakened(4.0, 0.5) == pytest.approx(2.0)
