"""The stored results are typed (service.contracts.results): a plan's result reads back and stores
again unchanged, and results stored by earlier versions, which lack the keys that came later, read
back with those keys at their defaults, through the wire shape and through calibration alike."""

from __future__ import annotations

import copy
from typing import Any

from sqlalchemy.orm import Session

from service import planning
from service.contracts.plans import PlanRequest, RunIn
from service.contracts.results import RESULT_VERSION, PlanResult, RunDiagnosis
from service.persistence.models import PlanRecord, RunRecord
from service.persistence.repository import PlanRepository
from service.planning.calibration import observation

BODY: dict[str, Any] = {
    "model": {"preset": "gpt2"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
    "training": {"seq_len": 1024, "global_batch_size": 64},
    "constraints": {"top_k": 2, "frameworks": ["deepspeed"]},
    "launchers": ["deepspeed"],
}
# What results stored before each of these keys existed lack (the top level, then the calibration).
LATER_KEYS = ("version", "suggestions_skipped", "closest", "resolved_defaults", "unsupported_targets")
OLD_CALIBRATION = {
    "factors": {"memory_dynamic": 1.25, "step_time": 1.5},
    "runs": 2,
    "memory_runs": 1,
    "time_runs": 1,
    "out_of_memory_runs": 0,
}


def stored_plan(session: Session) -> PlanRecord:
    plan = planning.create_plan(session, PlanRequest.model_validate(BODY)).value
    return planning.stored_plan(PlanRepository(session), plan.id)


def test_a_stored_result_reads_back_and_stores_again_unchanged(session: Session) -> None:
    record = stored_plan(session)
    result = PlanResult.read(record.result)
    assert result.version == RESULT_VERSION and result.recommended is not None
    assert result.stored() == record.result
    assert result.search.evaluations == result.search.memory_evaluations + result.search.time_evaluations > 0


def test_a_result_stored_before_the_later_keys_reads_back_with_their_defaults(session: Session) -> None:
    record = stored_plan(session)
    current = planning.plan_out(record)
    old = {k: v for k, v in copy.deepcopy(record.result).items() if k not in LATER_KEYS}
    old["recommended"]["estimate"]["calibration"] = OLD_CALIBRATION
    old["calibration"] = OLD_CALIBRATION
    for suggestion_or_rejection in old["rejected"]:
        suggestion_or_rejection.pop("capacity_bytes", None)
    record.result = old

    result = PlanResult.read(old)
    assert result.version == 0
    assert (result.suggestions_skipped, result.closest, result.resolved_defaults) == ([], None, {})
    assert result.calibration is not None and result.calibration.implausible_runs == 0
    factors = result.calibration.factors
    assert factors.step_time_learned == 1.5 and factors.step_time_hardware is None  # learned = applied then

    out = planning.plan_out(record)
    assert out.suggestions_skipped == [] and out.closest is None and out.unsupported_targets == {}
    assert out.calibration == OLD_CALIBRATION | {
        "factors": {"memory_dynamic": 1.25, "step_time": 1.5, "step_time_learned": 1.5},
        "implausible_runs": 0,
        "evidence": [],
        "set_aside": [],
        "uncalibrated": None,
    }
    assert out.alternatives == current.alternatives and out.search == current.search
    assert [r["reason"] for r in out.rejected] == [r["reason"] for r in current.rejected]

    # calibration reads the old result too: its factors divided out of the estimate it stored
    run = RunRecord(step_s=1.0, out_of_memory=False, framework_version="", notes="", diagnosis={})
    seen = observation(run, record)
    assert seen is not None and current.recommended is not None and current.recommended.estimate.time
    assert seen.estimated_step_s == current.recommended.estimate.time.step_s / 1.5


def test_a_diagnosis_reads_back_and_goes_out_without_its_version(session: Session) -> None:
    plan = planning.create_plan(session, PlanRequest.model_validate(BODY)).value
    assert plan.recommended is not None and plan.recommended.estimate.time is not None
    run = planning.add_run(session, plan.id, RunIn(step_s=1.2 * plan.recommended.estimate.time.step_s)).value
    stored = PlanRepository(session).run(run.id)
    assert stored is not None and stored.diagnosis["version"] == RESULT_VERSION
    assert RunDiagnosis.read(stored.diagnosis).stored() == stored.diagnosis
    assert "version" not in run.diagnosis and run.diagnosis["implausible"] is False
    # stored before runs were checked: the check's verdict, the rest as stored
    stored.diagnosis = {k: v for k, v in stored.diagnosis.items() if k not in ("version", "implausible")}
    again = planning.run_out(stored)
    assert again.diagnosis == run.diagnosis


def test_the_stored_shapes_name_every_field_of_the_recommenders_results() -> None:
    """A field added to a recommender result must be added to its stored shape (or it is kept only
    as an unnamed extra): the two lists are checked here, field by field."""
    import dataclasses

    from service.contracts.results import RejectionOut, SearchStatsOut, SkippedOut, SuggestionOut
    from service.recommender.types import Rejection, SearchStats, Skipped, Suggestion

    pairs = (
        (Suggestion, SuggestionOut),
        (Rejection, RejectionOut),
        (SearchStats, SearchStatsOut),
        (Skipped, SkippedOut),
    )
    for domain, stored in pairs:
        assert {f.name for f in dataclasses.fields(domain)} == set(stored.model_fields), domain.__name__


MEMORY_MISS_BODY: dict[str, Any] = {
    "model": {"preset": "llama-3.1-70b"},
    "cluster": {"gpu": "a100-sxm-40gb", "num_nodes": 1, "gpus_per_node": 8},
    "training": {"seq_len": 2048, "global_batch_size": 16},
    "constraints": {"frameworks": ["deepspeed"]},
    "launchers": ["deepspeed"],
}


def test_a_memory_miss_names_the_card_and_the_limit_it_was_compared_with(session: Session) -> None:
    """A plan's memory miss said "needs 38.3 GiB, 38.0 allowed" with capacity_bytes 38.0 GiB, where the
    estimate of the same layout (capacity_bytes: the 40 GiB card) fit (consistency review): the limit is
    allowed_bytes, capacity_bytes the card; results stored before read theirs as the limit."""
    plan = planning.create_plan(session, PlanRequest.model_validate(MEMORY_MISS_BODY)).value
    misses = [r for r in plan.rejected if r["per_gpu_bytes"] is not None]
    assert misses
    card = 40 * 2**30
    for miss in misses:
        assert miss["capacity_bytes"] == card and miss["allowed_bytes"] == int(card * 0.95)
    stored = PlanRepository(session).get(plan.id)
    assert stored is not None
    before = copy.deepcopy(stored.result) | {"version": 2}
    for rejection in before["rejected"]:
        if rejection.get("allowed_bytes") is not None:
            rejection["capacity_bytes"] = rejection.pop("allowed_bytes")  # as version 2 stored it
    read = PlanResult.read(before)
    for old, new in zip(read.rejected, PlanResult.read(stored.result).rejected, strict=True):
        assert old.allowed_bytes == new.allowed_bytes
        assert old.capacity_bytes is None if new.allowed_bytes is not None else old == new
