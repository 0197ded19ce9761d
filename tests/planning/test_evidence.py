"""Runs count as evidence for the job being estimated: by recency, by the estimator version their
plan came from and by how close their job is (model size, sequence, layout family). Every calibrated
answer names the runs behind each factor with their weights, the runs set aside with why, and its
figures without calibration."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from service import planning
from service.contracts.estimates import EstimateOut, EstimateRequest
from service.contracts.plans import PlanOut, PlanRequest, RunIn
from service.estimator.calibration import OLDER_ESTIMATOR_WEIGHT, RECENCY_HALF_LIFE_DAYS
from service.persistence.db import utcnow
from service.persistence.models import PlanRecord, RunRecord

CLUSTER = {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
TRAINING = {"seq_len": 1024, "global_batch_size": 64}


def plan(session: Session, preset: str) -> PlanOut:
    body: dict[str, Any] = {
        "model": {"preset": preset},
        "cluster": CLUSTER,
        "training": TRAINING,
        "constraints": {"top_k": 2, "frameworks": ["deepspeed"]},
        "launchers": [],
    }
    return planning.create_plan(session, PlanRequest.model_validate(body)).value


def estimate(session: Session, of: PlanOut) -> EstimateOut:
    assert of.recommended is not None
    body = {
        "model": of.request["model"],
        "cluster": CLUSTER,
        "training": TRAINING,
        "layout": of.recommended.layout,
    }
    return planning.estimate_for(session, EstimateRequest.model_validate(body))


def run_at(session: Session, of: PlanOut, ratio: float) -> str:
    """A run of the plan measuring ``ratio`` times its estimated step."""
    assert of.recommended is not None and of.recommended.estimate.time is not None
    step_s = of.recommended.estimate.time.step_s * ratio
    return planning.add_run(session, of.id, RunIn(step_s=step_s)).value.id


def test_the_closer_job_decides_and_every_run_behind_a_factor_is_named(session: Session) -> None:
    small, large = plan(session, "gpt2"), plan(session, "llama-3.2-1b")
    before = estimate(session, small)
    assert before.calibration is None and before.time is not None

    own = run_at(session, small, 2.0)
    other = run_at(session, large, 1.0)
    after = estimate(session, small)
    calibration = after.calibration
    assert calibration is not None and calibration.uncalibrated is not None and after.time is not None
    # the weighted median of 2.0 (weight 1) and 1.0 (a model 10x larger: weight < 1) is 2.0
    assert calibration.factors.step_time_hardware == 2.0
    by_id = {e.run_id: e for e in calibration.evidence}
    assert by_id[own].weight == 1.0 and by_id[own].weighted_because == []
    assert by_id[other].weight < 0.5 and "parameters for" in by_id[other].weighted_because[0]
    assert by_id[own].plan_id == small.id and by_id[other].plan_id == large.id
    assert set(by_id[own].factors) == {"step_time_hardware", "step_time_framework"}
    # the figures without calibration are the estimate before any run
    assert calibration.uncalibrated.step_s == before.time.step_s
    assert calibration.uncalibrated.memory_per_gpu_bytes == before.memory.per_gpu.total
    assert after.time.step_s > before.time.step_s

    # the same run, older and compared with an older estimator, counts less than the other one now
    record = session.get(RunRecord, own)
    assert record is not None
    record.created_at = utcnow() - timedelta(days=2 * RECENCY_HALF_LIFE_DAYS)
    stored_plan = session.get(PlanRecord, small.id)
    assert stored_plan is not None
    stored_plan.estimator_version = "an older one"
    session.flush()
    aged = estimate(session, small).calibration
    assert aged is not None
    weights = {e.run_id: e for e in aged.evidence}
    assert weights[own].weight == 0.25 * OLDER_ESTIMATOR_WEIGHT
    assert any("days old" in why for why in weights[own].weighted_because)
    assert any("older estimator" in why for why in weights[own].weighted_because)
    assert aged.factors.step_time_hardware == 1.0  # now the heavier run is the other model's


def test_a_plan_names_its_evidence_and_its_uncalibrated_figures_and_sets_runs_aside(session: Session) -> None:
    first = plan(session, "gpt2")
    kept = run_at(session, first, 1.5)
    absurd = run_at(session, first, 10.0)  # more than 4x off: another job or a broken measurement
    again = plan(session, "gpt2")
    assert again.recommended is not None and again.recommended.estimate.time is not None
    calibration = again.recommended.estimate.calibration
    assert calibration is not None and calibration.uncalibrated is not None
    assert [e.run_id for e in calibration.evidence] == [kept]
    assert [(s.run_id, s.plan_id) for s in calibration.set_aside] == [(absurd, first.id)]
    assert "more than 4x off" in calibration.set_aside[0].reasons[0]
    assert first.recommended is not None and first.recommended.estimate.time is not None
    if again.recommended.layout == first.recommended.layout:
        assert calibration.uncalibrated.step_s == first.recommended.estimate.time.step_s
    assert again.calibration is not None and [e["run_id"] for e in again.calibration["evidence"]] == [kept]
    # every alternative under a calibration carries its own uncalibrated figures
    for alternative in again.alternatives:
        assert alternative.estimate.calibration is not None
        assert alternative.estimate.calibration.uncalibrated is not None
