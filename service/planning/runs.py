"""Observed runs of a plan: stored once per Idempotency-Key, diagnosed against the plan's
estimate (service.feedback), and the calibration they give later estimates."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.contracts.estimates import CalibrationOut
from service.contracts.plans import RunIn, RunOut
from service.contracts.results import PlanResult, RunDiagnosis, StoredLayout, StoredRequest
from service.errors import Conflict, NotFound
from service.estimator.calibration import implausibility
from service.feedback import diagnose
from service.persistence.models import PlanRecord, RunRecord
from service.persistence.repository import PlanRepository
from service.planning.calibration import calibration_for, calibration_out, observation, observed
from service.planning.idempotency import Outcome, create_once, request_digest
from service.planning.plans import stored_plan


def run_scope(plan_id: str) -> str:
    """Stored with every key; the route it was first written for, kept so stored keys still match."""
    return f"POST /v1/plans/{plan_id}/runs"


def add_run(
    session: Session, plan_id: str, run: RunIn, idempotency_key: str | None = None
) -> Outcome[RunOut]:
    """Store and diagnose what a run of the plan measured; a retry with the same key and body
    replays it (and is not counted twice by calibration)."""
    plans = PlanRepository(session)
    plan = stored_plan(plans, plan_id)

    def create() -> tuple[str, RunOut]:
        recommended = PlanResult.read(plan.result).recommended
        if recommended is None:
            raise Conflict(
                f"plan {plan_id!r} is infeasible: it has no layout a run could have measured",
                errors=[{"field": "plan_id", "message": "infeasible plan"}],
            )
        record = RunRecord(**run.model_dump())
        record.diagnosis = diagnose(
            observed(record),
            recommended.estimate,
            StoredLayout.model_validate(recommended.layout),
            StoredRequest.read(plan.request).training.tokens_per_step,
            implausible_reasons(record, plan),
        ).stored()
        plans.add_run(record, plan)
        calibration = calibration_for(plans, plan.hardware_key, str(plan.framework))
        return record.id, run_out(record, calibration_out(calibration))

    def replay(run_id: str) -> RunOut:
        record = plans.run(run_id)
        if record is None or record.plan_id != plan_id:
            raise NotFound(f"run {run_id} of plan {plan_id} has since been deleted")
        return run_out(record, None)

    return create_once(
        session,
        scope=run_scope(plan_id),
        key=idempotency_key,
        digest=request_digest(run),
        create=create,
        replay=replay,
    )


def implausible_reasons(run: RunRecord, plan: PlanRecord) -> tuple[str, ...]:
    """Why the run cannot be what its plan measured: the check calibration makes (``observation``
    and ``implausibility`` read only what is stored, so runs stored before the check get it too)."""
    obs = observation(run, plan)
    return implausibility(obs) if obs is not None else ()


def with_plausibility(run: RunRecord) -> RunDiagnosis:
    """The stored diagnosis; a run stored before runs were checked gets the check's verdict, as
    calibration applies it to that run (its advice is left as it was stored)."""
    diagnosis = RunDiagnosis.read(run.diagnosis)
    if diagnosis.implausible is None:
        reasons = implausible_reasons(run, run.plan)
        diagnosis.implausible, diagnosis.implausible_reasons = bool(reasons), list(reasons)
    return diagnosis


def run_out(run: RunRecord, calibration: CalibrationOut | None) -> RunOut:
    """A stored run in its wire shape; `calibration` only in the answer that stored it."""
    return RunOut(
        id=run.id,
        plan_id=run.plan_id,
        created_at=run.created_at,
        peak_memory_bytes_per_gpu=run.peak_memory_bytes_per_gpu,
        step_s=run.step_s,
        tokens_per_s=run.tokens_per_s,
        gpu_utilization=run.gpu_utilization,
        out_of_memory=run.out_of_memory,
        framework_version=run.framework_version,
        notes=run.notes,
        diagnosis=with_plausibility(run).out(),
        calibration=calibration.model_dump(mode="json") if calibration else None,
    )
