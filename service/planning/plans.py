"""The plan workflow: headroom from calibration, the layout search, result shaping, launcher
files, and the stored plan, created once per Idempotency-Key."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.catalog import catalog_version
from service.catalog.tuning import default_tuning
from service.contracts.clusters import ClusterRef
from service.contracts.estimates import CalibrationOut
from service.contracts.plans import CandidateOut, ClosestOut, PlanOut, PlanRequest
from service.contracts.results import (
    RESULT_VERSION,
    PlanResult,
    RejectionOut,
    SearchStatsOut,
    SkippedOut,
    StoredArtifact,
    SuggestionOut,
)
from service.errors import ClientClosedRequest, NotFound, ServiceUnavailable, Unprocessable
from service.estimator.defaults import chosen_defaults, chosen_link_defaults
from service.estimator.params import parameter_counts
from service.estimator.scale import MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN, MAX_TOKENS_PER_STEP
from service.estimator.types import ClusterSpec, Layout, ModelSpec, Plan, TrainingSpec
from service.estimator.validate import hardware_violation
from service.launchers import Target, render
from service.launchers.job import WRAPPED_TARGETS, WRAPPERS
from service.persistence.models import PlanRecord
from service.persistence.repository import ClusterRepository, PlanRepository
from service.planning.calibrated import calibrated_candidates
from service.planning.calibration import (
    LAYOUT_FAMILIES,
    HardwareRuns,
    Learned,
    calibration_out,
    hardware_key,
    hardware_keys,
    job_traits,
    runs_on,
    searched_with_runs,
)
from service.planning.clusters import cluster_form, domain_cluster, read_from_catalog
from service.planning.estimates import check_priced, check_scale, estimate_out, located
from service.planning.idempotency import Outcome, create_once, request_digests
from service.planning.runnable import no_framework_runs
from service.recommender import headroom, recommend
from service.recommender.budget import NO_DEADLINE, Deadline, busy_words
from service.recommender.space import sub_cluster
from service.recommender.types import Candidate, Constraints, Objective, Recommendation, Rejection
from service.versions import estimator_version

# Stored with every key; the route it was first written for, kept so stored keys still match.
PLAN_SCOPE = "POST /v1/plans"


def create_plan(
    session: Session,
    request: PlanRequest,
    idempotency_key: str | None = None,
    deadline: Deadline = NO_DEADLINE,
) -> Outcome[PlanOut]:
    """Search, shape, render and store a plan; a retry with the same key and body replays it."""
    plans = PlanRepository(session)

    def create() -> tuple[str, PlanOut]:
        record = plan_record(session, request, deadline)
        try:
            plans.add(record)
        except IntegrityError as exc:
            if record.cluster_id is None:
                raise
            # its one reference is the stored cluster it was planned on (its id is new): deleted by a
            # concurrent request after this one read it; what a retry is told, said now (it was a 409
            # naming no field: concurrency review)
            raise NotFound(
                f"cluster {record.cluster_id!r} was deleted while this plan was computed",
                errors=[
                    {
                        "field": "cluster.id",
                        "message": "deleted while the plan was computed",
                        "type": "unknown_cluster",
                    }
                ],
            ) from exc
        return record.id, plan_out(record)

    def replay(plan_id: str) -> PlanOut:
        record = plans.get(plan_id)
        if record is None:  # keys outlive what they created, so a retry cannot silently recreate it
            raise NotFound(
                f"plan {plan_id} created with Idempotency-Key {idempotency_key!r} has since been deleted"
            )
        return plan_out(record)

    return create_once(
        session,
        scope=PLAN_SCOPE,
        key=idempotency_key,
        digests=request_digests(request),
        create=create,
        replay=replay,
    )


def plan_record(session: Session, request: PlanRequest, deadline: Deadline = NO_DEADLINE) -> PlanRecord:
    """The plan for a request, not yet added: searched with the headroom the stored runs ask for,
    within the request's budget (``deadline`` and ``constraints.max_evaluations``)."""
    model = request.model.to_domain()
    form = cluster_form(request.cluster, ClusterRepository(session))
    cluster = domain_cluster(form)
    training = request.training.to_domain(cluster.gpu, model)
    hardware = hardware_violation(cluster, training)  # no layout changes what the GPU can run
    if hardware is not None:
        raise located(hardware)
    check_scale(model, cluster, training)
    constraints = request.constraints.to_domain()
    if constraints.objective is not Objective.COST:  # ranked by cost, the price scales the score
        check_priced(constraints.gpu_hour_cost, training, field="constraints.gpu_hour_cost")
    # the recommendation must run in one of the requested launchers (Slurm and Kubernetes wrap one)
    runners = runner_targets(request.launchers)
    if runners:
        constraints = dataclasses.replace(constraints, launchers=runners)
    unrunnable = _no_framework_runs(model, cluster, training, request, constraints)
    every = tuple(t for t in request.launchers if t not in WRAPPERS)
    if unrunnable is not None and every and set(every) != set(runners):
        # Kubernetes asked with targets none of whose wrapped ones runs the job: any asked runs it
        constraints = dataclasses.replace(constraints, launchers=every)
        unrunnable = _no_framework_runs(model, cluster, training, request, constraints)
    if unrunnable is not None:
        raise unrunnable
    key = hardware_key(cluster)
    plans = PlanRepository(session)
    runs = runs_on(plans, hardware_keys(cluster))
    # no layout chosen yet: each framework and family's memory factor, which the search applies per layout
    before = job_traits(parameter_counts(model).total, training)
    learned = {
        (fw, family): runs.learned(fw.value, dataclasses.replace(before, family=family)).calibration
        for fw in constraints.frameworks
        for family in LAYOUT_FAMILIES
    }
    searched, run_factors = searched_with_runs(constraints, learned)
    budget = deadline.budget(
        constraints.max_evaluations, stated=request.constraints.max_evaluations is not None
    )
    if every and set(every) != set(constraints.launchers or every):
        # Kubernetes asked: a layout its PyTorchJob wraps first; where none fits, any asked target's
        # (Kubernetes then says why it cannot: asking for one more file never makes a feasible job
        # infeasible: DeepSpeed's Ulysses runs through Accelerate alone, new-code review, stop 41)
        rec = recommend(
            model, cluster, training, searched, default_tuning(), budget=budget, with_suggestions=False
        )
        if rec.recommended is None:
            searched = dataclasses.replace(searched, launchers=every)
            rec = recommend(model, cluster, training, searched, default_tuning(), budget=budget)
    else:
        rec = recommend(model, cluster, training, searched, default_tuning(), budget=budget)
    if budget.cancelled_now():  # a plan that finished after its client left is not stored either
        raise ClientClosedRequest("the client closed the connection; the plan was not stored")
    if budget.reason == "busy":  # cut for want of CPU others took: not stored as this job's answer
        raise ServiceUnavailable(busy_words(deadline))
    # Nothing computed in time: the inputs that make the job big are named. A search that ran to its
    # end has its answer (infeasible, and why in rejected) even when the suggestions after it ran out
    # of time, which suggestions_skipped says: a 422 there named a 70B model's 80 layers as too big
    # to plan when the states alone needed 263 GiB per GPU of 91 allowed.
    if (
        budget.reason == "time"
        and rec.search.truncated
        and not (rec.recommended or rec.suggestions or rec.closest)
    ):
        raise too_big_to_plan(model, cluster, training, deadline)
    result, recommended = plan_result(rec, model, cluster, training, request, runs)
    artifacts, unsupported = render_artifacts(recommended, model, cluster, training, request)
    result.unsupported_targets = unsupported
    result.suggestions_skipped = [SkippedOut(kind=s.kind, reason=s.reason) for s in rec.suggestions_skipped]
    result.closest = closest_out(rec.closest, model, training, searched.min_headroom_fraction)
    result.resolved_defaults = (
        chosen_defaults(training)
        | request.training.adapter_defaults()
        | request.training.optimizer_read()
        | chosen_link_defaults(cluster)
        | read_from_catalog(request.model, form)
        | run_factors
    )
    return PlanRecord(
        cluster_id=request.cluster.id if isinstance(request.cluster, ClusterRef) else None,
        cluster_snapshot=_jsonable(dataclasses.asdict(cluster)),
        hardware_key=key,
        framework=recommended.layout.framework.value if recommended else None,
        model_name=request.model.preset or model.name,
        status=rec.status,
        request=request.model_dump(mode="json"),
        result=result.stored(),
        artifacts=[a.model_dump(mode="json") for a in artifacts],
        catalog_version=catalog_version(),
        estimator_version=estimator_version(),
    )


def runner_targets(launchers: list[Target]) -> tuple[Target, ...]:
    """The targets the recommendation must run in, one of them, for the requested ``launchers``
    (empty: any). Slurm and Kubernetes wrap the entry points of ``job.WRAPPED_TARGETS``: asked for
    alone, the layout must run in one of those, or the wrapper renders nothing. Slurm also wraps
    Accelerate's launcher where Accelerate is asked (``launchers.render``), so with Slurm every
    requested target runs it; a Kubernetes PyTorchJob runs torchrun entry points only, so with it
    the layout must run in a wrapped target asked for (Accelerate alone where none is: the
    PyTorchJob then says why it cannot). ``create_plan`` relaxes the Kubernetes rule where no
    wrapped target asked can run the job at all: asking for one more file never makes a 422."""
    runners = tuple(t for t in launchers if t not in WRAPPERS)
    if not any(t in WRAPPERS for t in launchers):
        return runners
    if not runners:
        return WRAPPED_TARGETS
    if Target.KUBERNETES not in launchers:
        return runners
    wrapped = tuple(t for t in runners if t in WRAPPED_TARGETS)
    return wrapped or runners


def _no_framework_runs(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    request: PlanRequest,
    constraints: Constraints,
) -> Unprocessable | None:
    """The 422 for a job no requested framework runs through the requested launchers, naming what
    limited it: the launchers when the frameworks would run it through others, else the frameworks
    when pinned, else the training."""
    frameworks = constraints.frameworks
    if (
        constraints.launchers
        and no_framework_runs(model, cluster, training, frameworks, None, field="") is None
    ):
        field = "launchers"
    elif request.constraints.frameworks:
        field = "constraints.frameworks"
    else:
        field = "training"
    return no_framework_runs(model, cluster, training, frameworks, constraints.launchers, field=field)


def closest_out(
    closest: Candidate | None, model: ModelSpec, training: TrainingSpec, headroom_fraction: float
) -> ClosestOut | None:
    """An infeasible plan's closest layout: its estimate (every memory component) and how far
    over the memory the search allows (the card less the headroom kept free) it is."""
    if closest is None:
        return None
    memory = closest.estimate.memory
    allowed = headroom.allowed_bytes(memory.capacity_bytes, headroom_fraction)
    out = estimate_out(closest.estimate, closest.layout, training, parameter_counts(model).total, None)
    return ClosestOut(
        layout=out.layout,
        estimate=out,
        over_bytes=max(0, memory.per_gpu.total - allowed),
        detail=closest.rationale[0] if closest.rationale else "",
    )


def too_big_to_plan(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, deadline: Deadline
) -> Unprocessable:
    """Nothing useful computed within the request's time: name the inputs that make the job big,
    each against the largest published figure (``estimator.scale``)."""
    values = {
        "model.num_layers": (model.num_layers, MAX_LAYERS),
        "training.seq_len": (training.seq_len, MAX_SEQ_LEN),
        "training.global_batch_size": (training.tokens_per_step, MAX_TOKENS_PER_STEP),
        "cluster.num_nodes": (cluster.world_size, MAX_GPUS),
    }
    ranked = sorted(values.items(), key=lambda kv: -kv[1][0] / kv[1][1].limit)
    errors = [
        {
            "field": name,
            "message": f"{value:,}{f' {bound.quantity}' if bound.quantity else ''} ({bound.reference})",
            "type": "too_big_to_plan",
        }
        for name, (value, bound) in ranked[:2]
    ]
    return Unprocessable(
        f"the job is too large to plan within the request's {deadline.seconds:g} s: no layout, closest "
        f"layout or suggestion was computed; the largest inputs, against published runs: "
        + "; ".join(f"{e['field']} {e['message']}" for e in errors),
        errors=errors,
    )


def stored_plan(plans: PlanRepository, plan_id: str) -> PlanRecord:
    record = plans.get(plan_id)
    if record is None:
        raise NotFound(f"plan {plan_id!r} does not exist")
    return record


def delete_plan(plans: PlanRepository, plan_id: str) -> None:
    """Delete the plan and its runs; NotFound where it is not there, or where a concurrent delete
    removed it first (one of two racing deletes is the 204)."""
    if not plans.delete(stored_plan(plans, plan_id)):
        raise NotFound(f"plan {plan_id!r} does not exist")


def candidate_out(
    candidate: Candidate,
    cluster: ClusterSpec,
    training: TrainingSpec,
    total_parameters: int,
    calibration: CalibrationOut | None,
    gpu_hour_cost: float | None,
) -> CandidateOut:
    """A candidate in its wire shape; its estimate, score and rationale already under
    ``calibration``, the one its estimate applied (planning.calibrated). Its defaults name the link
    figures a custom GPU left out that it is timed on, as an estimate of it names them (a plan's
    candidates named the training's alone: hardware review)."""
    out = estimate_out(
        candidate.estimate, candidate.layout, training, total_parameters, gpu_hour_cost, calibration
    )
    out.resolved_defaults |= chosen_link_defaults(sub_cluster(cluster, candidate.layout.world_size))
    return CandidateOut(
        layout=out.layout, estimate=out, score=candidate.score, rationale=list(candidate.rationale)
    )


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


# What a calibrated plan's rejected figures are: the search's, before the runs' factors, which only the
# candidates shown carry ("at most 139,861 tokens/s" read as beating the recommended 126,724, calibrated
# 15% slower; consistency review)
UNCALIBRATED_FIGURES = (
    " (the search's figures, before the calibration from this hardware's runs, which the layouts shown "
    "carry; its memory limit keeps room for their memory factor)"
)


def _rejection_out(rejection: Rejection, calibrated: bool) -> RejectionOut:
    out = RejectionOut.model_validate(_jsonable(dataclasses.asdict(rejection)))
    if calibrated and (out.per_gpu_bytes is not None or "tokens/s" in out.detail):
        out.detail += UNCALIBRATED_FIGURES
    return out


def plan_result(
    rec: Recommendation,
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    request: PlanRequest,
    runs: HardwareRuns,
) -> tuple[PlanResult, Candidate | None]:
    """The stored result: candidates in their wire shape (estimate, score and rationale under the
    calibration the runs on this hardware give their framework and job, ranked again on those
    figures, the search's uncalibrated ones beside them), rejected families, suggestions, search;
    and the recommended candidate, calibrated."""
    cost = request.constraints.gpu_hour_cost
    total = parameter_counts(model).total
    constraints = request.constraints.to_domain()
    learned: dict[tuple[str, str | None], Learned] = {}

    def learned_for(layout: Layout) -> Learned:
        target = job_traits(total, training, layout)
        key = (layout.framework.value, target.family)
        if key not in learned:
            learned[key] = runs.learned(layout.framework.value, target)
        return learned[key]

    chosen = calibrated_candidates(
        rec, model, cluster, training, constraints, lambda layout: learned_for(layout).calibration
    )
    outs = [
        candidate_out(
            c.candidate,
            cluster,
            training,
            total,
            calibration_out(
                dataclasses.replace(learned_for(c.candidate.layout), calibration=c.calibration),
                None if c.calibration.is_identity else c.searched.estimate,
            ),
            cost,
        )
        for c in chosen
    ]
    recommended = chosen[0].candidate if chosen else None
    calibrated = any(not c.calibration.is_identity for c in chosen)
    result = PlanResult(
        version=RESULT_VERSION,
        status="feasible" if rec.status == "feasible" else "infeasible",
        recommended=outs[0] if outs else None,
        alternatives=outs[1:],
        rejected=[_rejection_out(r, calibrated) for r in rec.rejected],
        suggestions=[SuggestionOut.model_validate(_jsonable(dataclasses.asdict(s))) for s in rec.suggestions],
        search=SearchStatsOut.model_validate(_jsonable(dataclasses.asdict(rec.search))),
        calibration=calibration_out(learned_for(recommended.layout)) if recommended else None,
    )
    return result, recommended


def render_artifacts(
    recommended: Candidate | None,
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    request: PlanRequest,
) -> tuple[list[StoredArtifact], dict[str, str]]:
    """The recommended layout's launcher files, and why each target that cannot express it can't."""
    if recommended is None or not request.launchers:
        return [], {}
    layout = recommended.layout
    plan = Plan(
        model=model,
        cluster=sub_cluster(cluster, layout.world_size),
        training=training,
        layout=layout,
        estimate=recommended.estimate,
        rationale=recommended.rationale,
    )
    artifacts, unsupported = render(plan, request.launchers)
    files = [
        StoredArtifact(name=a.name, target=a.target.value, media_type=a.media_type, content=a.content)
        for a in artifacts
    ]
    return files, {target.value: reason for target, reason in unsupported.items()}


def stored_artifacts(record: PlanRecord) -> list[StoredArtifact]:
    """A stored plan's launcher files."""
    return StoredArtifact.read_all(record.artifacts)


def _with_card(rejected: dict[str, Any], snapshot: Mapping[str, Any] | None) -> dict[str, Any]:
    """A memory miss stored before the card's capacity was (result version < 3: ``PlanResult`` reads
    its figure as allowed_bytes) with the card's from the plan's cluster snapshot, as a plan stored
    now says it (an upgrade review: capacity_bytes read back null)."""
    if rejected.get("capacity_bytes") is not None or rejected.get("allowed_bytes") is None:
        return rejected
    gpu = (snapshot or {}).get("gpu")
    memory = gpu.get("memory_bytes") if isinstance(gpu, Mapping) else None
    return rejected | {"capacity_bytes": memory} if isinstance(memory, int) else rejected


def plan_out(record: PlanRecord) -> PlanOut:
    """A stored plan in its wire shape (a result stored by an earlier version with the keys it
    lacks at their defaults: PlanResult)."""
    result = PlanResult.read(record.result)
    return PlanOut(
        id=record.id,
        created_at=record.created_at,
        status=result.status,
        model=record.model_name,
        cluster_id=record.cluster_id,
        cluster=record.cluster_snapshot,
        request=record.request,
        recommended=result.recommended,
        alternatives=result.alternatives,
        rejected=[_with_card(r.model_dump(mode="json"), record.cluster_snapshot) for r in result.rejected],
        suggestions=[s.model_dump(mode="json") for s in result.suggestions],
        suggestions_skipped=[s.model_dump(mode="json") for s in result.suggestions_skipped],
        closest=result.closest,
        resolved_defaults=result.resolved_defaults,
        search=result.search.model_dump(mode="json"),
        artifacts=[a.out(record.id) for a in stored_artifacts(record)],
        unsupported_targets=result.unsupported_targets,
        calibration=result.calibration.model_dump(mode="json") if result.calibration else None,
        versions={"catalog": record.catalog_version, "estimator": record.estimator_version},
    )
