"""The planning API called directly, as a CLI would: plans and runs are created once per
Idempotency-Key (the HTTP tests check the same through the routers), and the loser of a race
for a key replays the winner's resource."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from service import planning
from service.contracts.estimates import EstimateRequest
from service.contracts.plans import PlanRequest, RunIn
from service.errors import Unprocessable
from service.persistence.models import IdempotencyKeyRecord
from service.planning.idempotency import create_once

BODY: dict[str, Any] = {
    "model": {"preset": "gpt2"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
    "training": {"seq_len": 1024, "global_batch_size": 64},
    "constraints": {"top_k": 1, "frameworks": ["deepspeed"]},
    "launchers": ["deepspeed"],
}


def test_a_plan_is_created_once_per_key(session: Session) -> None:
    request = PlanRequest.model_validate(BODY)
    first = planning.create_plan(session, request, "job-1")
    again = planning.create_plan(session, request, "job-1")
    assert not first.replayed and again.replayed
    assert again.value == first.value
    assert first.value.status == "feasible" and [a.name for a in first.value.artifacts]

    with pytest.raises(Unprocessable, match="another request body"):
        planning.create_plan(session, PlanRequest.model_validate(BODY | {"launchers": []}), "job-1")
    without_key = [planning.create_plan(session, request).value.id for _ in range(2)]
    assert len({first.value.id, *without_key}) == 3


def test_a_run_is_stored_once_per_key_and_calibrates_the_next_estimate(session: Session) -> None:
    plan = planning.create_plan(session, PlanRequest.model_validate(BODY)).value
    assert plan.recommended is not None
    estimated_step_s = plan.recommended.estimate.time.step_s if plan.recommended.estimate.time else 1.0
    run = RunIn(step_s=2 * estimated_step_s)
    first = planning.add_run(session, plan.id, run, "run-1")
    again = planning.add_run(session, plan.id, run, "run-1")
    assert not first.replayed and again.replayed and again.value.id == first.value.id
    assert first.value.calibration is not None and first.value.calibration["runs"] == 1

    estimate = planning.estimate_for(
        session,
        EstimateRequest.model_validate(
            {k: BODY[k] for k in ("model", "cluster", "training")} | {"layout": plan.recommended.layout}
        ),
    )
    assert estimate.calibration is not None and estimate.calibration.runs == 1  # the retry counted once


def test_the_loser_of_a_race_for_a_key_replays_the_winner(db_engine: Engine, session: Session) -> None:
    digest = "0" * 64

    def create() -> tuple[str, str]:
        # The twin request commits its key while this one is still creating its resource.
        with Session(db_engine) as twin, twin.begin():
            twin.add(IdempotencyKeyRecord(key="k", scope="race", request_sha256=digest, resource_id="winner"))
        return "loser", "created by the loser"

    outcome = create_once(
        session, scope="race", key="k", digests=(digest,), create=create, replay=lambda rid: f"replayed {rid}"
    )
    assert outcome == planning.Outcome("replayed winner", replayed=True)


def test_the_evidence_on_one_hardware_is_its_most_recent_runs(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every estimate, plan and run post on a hardware reads its runs: 5,000 of them made an estimate
    take 5.8 s and a plan a 422 (bounded-work review, stop 39). The most recent MAX_EVIDENCE_RUNS
    calibrate; the older ones are kept but no longer read."""
    from service.planning import calibration

    monkeypatch.setattr(calibration, "MAX_EVIDENCE_RUNS", 3)
    plan = planning.create_plan(session, PlanRequest.model_validate(BODY)).value
    assert plan.recommended is not None and plan.recommended.estimate.time is not None
    step_s = plan.recommended.estimate.time.step_s
    for factor in (5.0, 5.0, 1.2, 1.2, 1.2):  # two old, slow runs, then three recent ones
        last = planning.add_run(session, plan.id, RunIn(step_s=factor * step_s)).value
    assert last.calibration is not None and last.calibration["runs"] == 3
    assert last.calibration["factors"]["step_time_learned"] == pytest.approx(1.2, rel=0.05)


def test_another_frameworks_newer_runs_leave_a_frameworks_own_evidence(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest MAX_EVIDENCE_RUNS were taken across frameworks: 256 Megatron runs pushed
    DeepSpeed's out-of-memory run out, and its layout 'fit' again, uncalibrated (calibration review).
    Each framework keeps its own newest."""
    from service.planning import calibration

    monkeypatch.setattr(calibration, "MAX_EVIDENCE_RUNS", 3)
    # a job whose out-of-memory run is plausible (its estimate within 4x of the card)
    body = BODY | {
        "model": {"preset": "llama-3.1-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 64},
    }
    deepspeed = planning.create_plan(session, PlanRequest.model_validate(body)).value
    planning.add_run(session, deepspeed.id, RunIn(out_of_memory=True))
    megatron_body = body | {
        "constraints": {"top_k": 1, "frameworks": ["megatron"]},
        "launchers": ["megatron"],
    }
    megatron = planning.create_plan(session, PlanRequest.model_validate(megatron_body)).value
    assert megatron.recommended is not None and megatron.recommended.estimate.time is not None
    for _ in range(4):
        planning.add_run(session, megatron.id, RunIn(step_s=megatron.recommended.estimate.time.step_s))
    assert deepspeed.recommended is not None
    estimate = planning.estimate_for(
        session,
        EstimateRequest.model_validate(
            {k: body[k] for k in ("model", "cluster", "training")} | {"layout": deepspeed.recommended.layout}
        ),
    )
    assert estimate.calibration is not None and estimate.calibration.out_of_memory_runs == 1
    assert not estimate.fits


def test_a_run_calibrates_only_its_own_precision_and_method(session: Session) -> None:
    """One fp32 run doubled the bf16, tf32 and LoRA estimates of its hardware, at weight 1: the
    estimator's error is the kernels' it times (calibration review). Another precision's or method's
    runs calibrate nothing."""
    fp32 = BODY | {"training": BODY["training"] | {"precision": "fp32"}}
    plan = planning.create_plan(session, PlanRequest.model_validate(fp32)).value
    assert plan.recommended is not None and plan.recommended.estimate.time is not None
    planning.add_run(session, plan.id, RunIn(step_s=2 * plan.recommended.estimate.time.step_s))

    def calibration(training: dict[str, Any]) -> Any:
        body = {"model": BODY["model"], "cluster": BODY["cluster"], "training": training}
        assert plan.recommended is not None
        request = EstimateRequest.model_validate(body | {"layout": plan.recommended.layout})
        return planning.estimate_for(session, request).calibration

    assert calibration(fp32["training"]) is not None
    assert calibration(BODY["training"]) is None  # bf16, the H100's default
    assert calibration(BODY["training"] | {"precision": "tf32"}) is None


# a 1B plan on one H100 whose three runs measured 60% of its estimated dynamic memory (factor 0.8, the
# bound of the memory factor)
SMALL_ON_ONE_H100: dict[str, Any] = {
    "model": {"preset": "llama-3.2-1b"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
    "training": {"seq_len": 16384, "global_batch_size": 8},
    "constraints": {"frameworks": ["fsdp"], "min_headroom_fraction": 0.0, "top_k": 1},
}


def _h100_with_runs_of_less_memory(session: Session) -> dict[str, Any]:
    """``SMALL_ON_ONE_H100`` planned, and its three runs at 60% of the estimated dynamic memory stored."""
    plan = planning.create_plan(session, PlanRequest.model_validate(SMALL_ON_ONE_H100)).value
    assert plan.recommended is not None
    memory = plan.recommended.estimate.memory.per_gpu
    states = memory.parameters + memory.gradients + memory.optimizer_states
    peak = states + int(0.6 * (memory.device_used_bytes - states))
    for _ in range(3):
        planning.add_run(
            session, plan.id, RunIn(peak_memory_bytes_per_gpu=peak, memory_statistic="device_used")
        )
    return SMALL_ON_ONE_H100


def test_runs_that_measured_less_memory_fit_the_search_as_they_do_the_estimate(session: Session) -> None:
    """Factors below 1 were left out of the search: a plan was infeasible where the calibrated estimate
    of its own closest layout fit (calibration review). Runs measuring 60% of the estimated dynamic
    memory (factor 0.8, the bound) let the plan at a longer sequence keep a layout that fits so."""
    body = _h100_with_runs_of_less_memory(session)
    longer = body | {"training": {"seq_len": 36864, "global_batch_size": 8}}
    again = planning.create_plan(session, PlanRequest.model_validate(longer)).value
    assert again.status == "feasible", again.closest
    assert again.recommended is not None and again.recommended.estimate.fits
    assert again.resolved_defaults["search.memory_dynamic_factor"].startswith("fsdp")


def test_another_gpus_suggestion_is_sized_without_this_hardwares_runs(session: Session) -> None:
    """An H100's runs (memory factor 0.8) sized an H200 suggestion, which the H200's own estimate then
    refused (change review): runs calibrate their own hardware only."""
    body = _h100_with_runs_of_less_memory(session)
    longer = body | {"training": {"seq_len": 81920, "global_batch_size": 8}}
    again = planning.create_plan(session, PlanRequest.model_validate(longer)).value
    others = [s for s in again.suggestions if s["kind"] in ("other_gpu", "more_gpus") and s.get("layout")]
    assert others, [s["kind"] for s in again.suggestions]
    for suggestion in others:
        placed = {key: suggestion[key] for key in ("gpu", "num_nodes", "gpus_per_node")}
        request = EstimateRequest.model_validate(
            {
                "model": body["model"],
                "cluster": placed,
                "training": longer["training"],
                "layout": suggestion["layout"],
            }
        )
        assert planning.estimate_for(session, request).fits, suggestion["detail"]
