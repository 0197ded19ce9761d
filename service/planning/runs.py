"""Observed runs of a plan: stored once per Idempotency-Key, diagnosed against the plan's
estimate (service.feedback), and the calibration they give later estimates."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.contracts.plans import LOG_STATISTIC_IS, RunIn, RunOut
from service.contracts.results import PlanResult, RunDiagnosis, StoredLayout, StoredRequest
from service.errors import Conflict, NotFound, Unprocessable
from service.estimator.calibration import implausibility
from service.feedback import diagnose
from service.persistence.models import PlanRecord, RunRecord
from service.persistence.repository import PlanRepository
from service.planning.calibration import (
    calibration_for,
    calibration_out,
    gpu_count,
    logged_batch_factor,
    logged_ranks,
    observation,
    observed,
    stored_traits,
)
from service.planning.idempotency import Outcome, create_once, request_digests
from service.planning.plans import stored_plan
from service.runlogs import LogNotUnderstood, ParsedLog, parse_log


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
        measured, source = measurements(run, plan, recommended.layout)
        record = RunRecord(**measured, source=source)
        record.diagnosis = diagnose(
            observed(record),
            recommended.estimate,
            StoredLayout.model_validate(recommended.layout),
            StoredRequest.read(plan.request).training.tokens_per_step,
            implausible_reasons(record, plan),
        ).stored()
        try:
            plans.add_run(record, plan)
        except IntegrityError as exc:
            # the run's one reference is its plan (its id is new): a concurrent request deleted the
            # plan after this one read it. The request rolls back; a retry would be told the same
            raise NotFound(f"plan {plan_id!r} does not exist (deleted while this run was stored)") from exc
        # what the runs on this hardware now say for the plan's own job, stored with the run: a retry
        # replays this answer whole (it answered null, and recomputed it would count the runs stored
        # since: concurrency and change reviews)
        target = stored_traits(plan)
        calibration = (
            calibration_for(plans, (plan.hardware_key,), str(plan.framework), target) if target else None
        )
        answered = calibration_out(calibration) if calibration else None
        record.calibration = answered.model_dump(mode="json") if answered else None
        return record.id, run_out(record, answered=True)

    def replay(run_id: str) -> RunOut:
        record = plans.run(run_id)
        if record is None or record.plan_id != plan_id:
            raise NotFound(f"run {run_id} of plan {plan_id} has since been deleted")
        return run_out(record, answered=True)

    return create_once(
        session,
        scope=run_scope(plan_id),
        key=idempotency_key,
        digests=request_digests(run),
        create=create,
        replay=replay,
    )


def measurements(
    run: RunIn, plan: PlanRecord, layout: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The run's stored fields: as typed, or read from its log (with what was read, from which
    lines); a log's figures pass the typed fields' own limits, so both take the same path after."""
    fields = run.model_dump(exclude={"log", "format"})
    if run.log is None:
        return fields, None
    try:
        parsed = parse_log(run.log, run.format)
    except LogNotUnderstood as exc:
        raise Unprocessable(str(exc), errors=[{"field": "log", "message": str(exc)}]) from exc
    training = StoredRequest.read(plan.request).training
    figures, conversions = from_log(
        parsed, seq_len=training.seq_len, global_batch_size=training.global_batch_size, layout=layout
    )
    timed = parsed.step_s or parsed.tokens_per_s_per_gpu or parsed.samples_per_s
    if not figures and timed is not None and not timed.steady:  # from_log left the start-up out
        message = (
            f"the log's {parsed.format} readings are all warm-up (the first steps of a launch, start-up "
            "included), and no memory figure of it is kept: nothing a run stores; paste a log past the first "
            "steps"
        )
        raise Unprocessable(message, errors=[{"field": "log", "message": message}])
    if not figures and conversions:  # a reading left out, and nothing else a run stores
        message = f"the log states no figure a run stores: {'; '.join(conversions)}"
        raise Unprocessable(message, errors=[{"field": "log", "message": message}])
    source = parsed.stored()
    source["conversions"] = conversions
    keep = {"framework_version": run.framework_version, "notes": run.notes}
    try:
        typed = RunIn.model_validate({**figures, **keep})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'run'}: {e['msg']}" for e in exc.errors())
        message = f"the figures read from the log are not a run this service stores ({problems})"
        raise Unprocessable(message, errors=[{"field": "log", "message": message}]) from exc
    return typed.model_dump(exclude={"log", "format"}), source


def from_log(
    parsed: ParsedLog, *, seq_len: int, global_batch_size: int, layout: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The typed run a log of a run of ``layout`` states: its steady step time where it prints one,
    else its throughput as tokens/s of the whole job (torchtitan's tps is per GPU, DeepSpeed's samples
    are sequences of the plan's length, counted by each rank its batch check counts:
    ``logged_batch_factor``); the peak memory with the estimate's statistic its reading is of
    (LOG_STATISTIC_IS), and whether it ran out of memory. Says each conversion."""
    figures: dict[str, Any] = {}
    conversions: list[str] = []
    gpus = gpu_count(layout)
    shape = StoredLayout.model_validate(layout)
    micro_batches = global_batch_size // (shape.micro_batch_size * shape.dp)
    if parsed.format == "accelerate" and parsed.step_s is not None and micro_batches > 1:
        # tqdm's rate is per loop iteration, and what a loop iterates is the script's: a micro-batch
        # (a bar over the DataLoader) or an optimizer step (HF's no_trainer examples tick on
        # sync_gradients). At one micro-batch a step they agree; past it the reading was stored as the
        # step, half the time at two micro-batches, and calibrated every later estimate (batch review)
        conversions.append(
            f"{parsed.step_s.name} left out of the run: tqdm's seconds per loop iteration are one optimizer "
            f"step or one of its {micro_batches} micro-batches, as the script's loop ticks the bar; post "
            "step_s as measured"
        )
        parsed = dataclasses.replace(parsed, step_s=None)
    timed = parsed.step_s or parsed.tokens_per_s_per_gpu or parsed.samples_per_s
    if timed is not None and not timed.steady:
        # start-up alone (the first steps of a launch): kept with the log, not as the run's time, which
        # would move every later plan's step factor by start-up (a log of iteration 1 alone set it to its
        # 3.0 bound; logs review)
        conversions.append(
            f"{timed.name} left out of the run: every reading of it is warm-up (start-up included), which "
            "would calibrate later plans with start-up; a log past the first steps gives the steady figure"
        )
        timed = None
    if timed is not None and parsed.step_s is not None:
        figures["step_s"] = parsed.step_s.value
    elif timed is not None and parsed.tokens_per_s_per_gpu is not None:
        per_gpu = parsed.tokens_per_s_per_gpu.value
        figures["tokens_per_s"] = per_gpu * gpus
        conversions.append(
            f"tokens_per_s = {per_gpu:,.0f} tokens/s per GPU x {gpus} GPUs of the plan's layout"
        )
    elif timed is not None and parsed.samples_per_s is not None:
        samples = parsed.samples_per_s.value
        factor = logged_batch_factor(layout, parsed.format)
        figures["tokens_per_s"] = samples * seq_len / factor
        counted = (
            f" / {factor:g} (its samples count each of the {logged_ranks(layout, parsed.format)} ranks "
            f"DeepSpeed's batch check counts, tensor-parallel peers included, which read the same samples)"
            if factor != 1
            else ""
        )
        per_sample = f"{seq_len} tokens per sample (the plan's seq_len)"
        conversions.append(f"tokens_per_s = {samples:g} samples/s x {per_sample}{counted}")
    if parsed.peak_memory is not None:
        figures["peak_memory_bytes_per_gpu"] = round(parsed.peak_memory.value)
        if parsed.peak_memory.statistic is not None:  # memory_figure always names it
            figures["memory_statistic"] = LOG_STATISTIC_IS[parsed.peak_memory.statistic]
    if parsed.out_of_memory is not None:
        figures["out_of_memory"] = True
        figures.pop("peak_memory_bytes_per_gpu", None)
        figures.pop("memory_statistic", None)
        conversions.append(
            f"out_of_memory from line {parsed.out_of_memory.line.number}; the peak of a run that ran out "
            "is not a peak, so none is stored (the error's figures are kept under out_of_memory)"
        )
    return figures, conversions


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


def run_out(run: RunRecord, *, answered: bool = False) -> RunOut:
    """A stored run in its wire shape; its calibration only in the answer that stored it and its
    replays (``answered``)."""
    return RunOut(
        id=run.id,
        plan_id=run.plan_id,
        created_at=run.created_at,
        peak_memory_bytes_per_gpu=run.peak_memory_bytes_per_gpu,
        memory_statistic=run.memory_statistic,
        step_s=run.step_s,
        tokens_per_s=run.tokens_per_s,
        gpu_utilization=run.gpu_utilization,
        out_of_memory=run.out_of_memory,
        framework_version=run.framework_version,
        notes=run.notes,
        diagnosis=with_plausibility(run).out(),
        source=run.source,
        calibration=run.calibration if answered else None,
    )
