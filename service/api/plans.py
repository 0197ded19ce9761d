"""Plans for schedulers: search, render, store in one transaction; artifacts; observed runs."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import zipfile
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response, status
from pydantic import BaseModel
from sqlalchemy.exc import IntegrityError

from service.api.calibration import calibration_for, calibration_out, hardware_key, observed
from service.api.deps import ClusterRepoDep, PlanRepoDep
from service.api.estimates import estimate_out, resolve_cluster
from service.api.problems import PROBLEM_RESPONSES
from service.api.schemas.clusters import ClusterRef
from service.api.schemas.common import Page
from service.api.schemas.plans import ArtifactOut, CandidateOut, PlanOut, PlanRequest, RunIn, RunOut
from service.catalog import catalog_version
from service.catalog.efficiency import default_efficiency
from service.errors import Conflict, NotFound, Unprocessable
from service.estimator import ESTIMATOR_VERSION
from service.estimator.calibration import Calibration
from service.estimator.estimate import estimate as estimate_layout
from service.estimator.params import parameter_counts
from service.estimator.types import ClusterSpec, Layout, ModelSpec, Plan, TrainingSpec
from service.feedback import diagnose
from service.launchers import render
from service.persistence.models import IdempotencyKeyRecord, PlanRecord, RunRecord
from service.persistence.repository import InvalidCursor, PlanFilters, PlanRepository, decode_cursor
from service.recommender import recommend
from service.recommender.space import sub_cluster
from service.recommender.types import Candidate, Constraints, Recommendation

router = APIRouter(prefix="/v1/plans", tags=["plans"], responses=PROBLEM_RESPONSES)

IDEMPOTENCY_SCOPE = "POST /v1/plans"
IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", min_length=1, max_length=255, description="retry-safe key"),
]


# ---------------------------------------------------------------- planning


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
        constraints, min_headroom_fraction=min(0.9, constraints.min_headroom_fraction + extra)
    )


def candidate_out(
    candidate: Candidate,
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    calibration: Calibration,
    gpu_hour_cost: float | None,
    *,
    with_limits: bool = False,
) -> CandidateOut:
    estimate = candidate.estimate
    if with_limits or not calibration.is_identity:
        # The recommended layout gets both limits; calibrated numbers are recomputed whole so
        # that fit, warnings and limits agree with the calibrated memory.
        estimate = estimate_layout(
            model,
            sub_cluster(cluster, candidate.layout.world_size),
            candidate.layout,
            training,
            efficiency=default_efficiency(),
            with_limits=with_limits,
            calibration=calibration,
        )
    total = parameter_counts(model).total
    out = estimate_out(estimate, candidate.layout, training, total, gpu_hour_cost, calibration)
    return CandidateOut(
        layout=out.layout, estimate=out, score=candidate.score, rationale=list(candidate.rationale)
    )


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def plan_result(
    rec: Recommendation,
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    body: PlanRequest,
    calibrations: dict[str, Calibration],
) -> dict[str, Any]:
    cost = body.constraints.gpu_hour_cost

    def out(c: Candidate, recommended: bool = False) -> dict[str, Any]:
        calibration = calibrations.get(c.layout.framework.value, Calibration())
        result = candidate_out(c, model, cluster, training, calibration, cost, with_limits=recommended)
        return result.model_dump(mode="json")

    recommended = rec.recommended
    framework = recommended.layout.framework.value if recommended else None
    return {
        "status": rec.status,
        "recommended": out(recommended, recommended=True) if recommended else None,
        "alternatives": [out(c) for c in rec.alternatives],
        "rejected": [_jsonable(dataclasses.asdict(r)) for r in rec.rejected],
        "suggestions": [_jsonable(dataclasses.asdict(s)) for s in rec.suggestions],
        "search": _jsonable(dataclasses.asdict(rec.search)),
        "calibration": calibration_out(calibrations[framework]) if framework in calibrations else None,
    }


def render_artifacts(
    rec: Recommendation, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, body: PlanRequest
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    if rec.recommended is None or not body.launchers:
        return [], {}
    layout: Layout = rec.recommended.layout
    plan = Plan(
        model=model,
        cluster=sub_cluster(cluster, layout.world_size),
        training=training,
        layout=layout,
        estimate=rec.recommended.estimate,
        rationale=rec.recommended.rationale,
    )
    artifacts, unsupported = render(plan, body.launchers)
    files = [
        {"name": a.name, "target": a.target.value, "media_type": a.media_type, "content": a.content}
        for a in artifacts
    ]
    return files, {target.value: reason for target, reason in unsupported.items()}


# ---------------------------------------------------------------- output


def plan_out(record: PlanRecord) -> PlanOut:
    result = record.result
    base = f"/v1/plans/{record.id}/artifacts/"
    artifacts = [
        ArtifactOut(
            name=a["name"],
            target=a["target"],
            media_type=a["media_type"],
            size_bytes=len(a["content"].encode()),
            url=base + a["name"],
        )
        for a in record.artifacts
    ]
    return PlanOut(
        id=record.id,
        created_at=record.created_at,
        status=result["status"],
        model=record.model_name,
        cluster_id=record.cluster_id,
        request=record.request,
        recommended=result["recommended"],
        alternatives=result["alternatives"],
        rejected=result["rejected"],
        suggestions=result["suggestions"],
        search=result["search"],
        artifacts=artifacts,
        unsupported_targets=result.get("unsupported_targets", {}),
        calibration=result.get("calibration"),
        versions={"catalog": record.catalog_version, "estimator": record.estimator_version},
    )


def stored_resource(repo: PlanRepository, key: str | None, scope: str, digest: str) -> str | None:
    """The id a previous request with this Idempotency-Key created, if any; the same key with
    another body is refused."""
    if key is None:
        return None
    found = repo.idempotency_key(key, scope)
    if found is None:
        return None
    if found.request_sha256 != digest:
        raise Unprocessable(
            f"Idempotency-Key {key!r} was used with another request body (it created {found.resource_id})",
            errors=[
                {
                    "field": "header.Idempotency-Key",
                    "message": "reused with another body",
                    "type": "idempotency",
                }
            ],
        )
    return found.resource_id


def remember(repo: PlanRepository, key: str | None, scope: str, digest: str, resource_id: str) -> None:
    """Record the key in the same transaction as the resource; a concurrent twin fails here."""
    if key is not None:
        record = IdempotencyKeyRecord(key=key, scope=scope, request_sha256=digest, resource_id=resource_id)
        repo.add_idempotency_key(record)


def replayed(response: Response, location: str) -> None:
    response.status_code = status.HTTP_200_OK
    response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = location


def _replay_plan(plan_id: str, key: str | None, repo: PlanRepository, response: Response) -> PlanOut:
    record = repo.get(plan_id)
    if record is None:  # keys outlive what they created, so a retry cannot silently recreate it
        raise NotFound(f"plan {plan_id} created with Idempotency-Key {key!r} has since been deleted")
    replayed(response, f"/v1/plans/{record.id}")
    return plan_out(record)


def request_digest(body: BaseModel) -> str:
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def as_utc(moment: datetime | None) -> datetime | None:
    """Query timestamps without an offset are UTC, as every timestamp this service writes."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def _get_or_404(repo: PlanRepository, plan_id: str) -> PlanRecord:
    record = repo.get(plan_id)
    if record is None:
        raise NotFound(f"plan {plan_id!r} does not exist")
    return record


# ---------------------------------------------------------------- routes


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=PlanOut,
    responses={200: {"description": "a retry with the same Idempotency-Key and body: the stored plan"}},
)
def create_plan(
    body: PlanRequest,
    clusters: ClusterRepoDep,
    plans: PlanRepoDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> PlanOut:
    digest = request_digest(body)
    earlier = stored_resource(plans, idempotency_key, IDEMPOTENCY_SCOPE, digest)
    if earlier is not None:
        return _replay_plan(earlier, idempotency_key, plans, response)
    model = body.model.to_domain()
    cluster = resolve_cluster(body.cluster, clusters)
    training = body.training.to_domain()
    constraints = body.constraints.to_domain()
    key = hardware_key(cluster)
    calibrations = {fw.value: calibration_for(plans, key, fw.value) for fw in constraints.frameworks}
    searched = headroom_for(constraints, calibrations, cluster.gpu.memory_bytes)
    rec = recommend(model, cluster, training, searched, default_efficiency())
    result = plan_result(rec, model, cluster, training, body, calibrations)
    artifacts, unsupported = render_artifacts(rec, model, cluster, training, body)
    result["unsupported_targets"] = unsupported
    record = PlanRecord(
        cluster_id=body.cluster.id if isinstance(body.cluster, ClusterRef) else None,
        cluster_snapshot=_jsonable(dataclasses.asdict(cluster)),
        hardware_key=key,
        framework=rec.recommended.layout.framework.value if rec.recommended else None,
        model_name=body.model.preset or model.name,
        status=rec.status,
        request=body.model_dump(mode="json"),
        result=result,
        artifacts=artifacts,
        catalog_version=catalog_version(),
        estimator_version=ESTIMATOR_VERSION,
    )
    try:
        plans.add(record)
        remember(plans, idempotency_key, IDEMPOTENCY_SCOPE, digest, record.id)
    except IntegrityError:
        # A concurrent request with the same key committed first: it owns the plan.
        plans.session.rollback()
        earlier = stored_resource(plans, idempotency_key, IDEMPOTENCY_SCOPE, digest)
        if earlier is None:
            raise
        return _replay_plan(earlier, idempotency_key, plans, response)
    response.headers["Location"] = f"/v1/plans/{record.id}"
    return plan_out(record)


@router.get("", response_model=Page[PlanOut])
def list_plans(
    plans: PlanRepoDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    cluster_id: Annotated[str | None, Query(max_length=64)] = None,
    model: Annotated[str | None, Query(max_length=200)] = None,
    status_: Annotated[str | None, Query(alias="status", pattern="^(feasible|infeasible)$")] = None,
    created_after: Annotated[datetime | None, Query(description="ISO 8601; without an offset: UTC")] = None,
    created_before: Annotated[datetime | None, Query(description="ISO 8601; without an offset: UTC")] = None,
) -> Page[PlanOut]:
    """Newest first, filtered; pass `next_cursor` back as `cursor` for the next page."""
    try:
        before = decode_cursor(cursor) if cursor else None
    except InvalidCursor as exc:
        raise Unprocessable(str(exc), errors=[{"field": "query.cursor", "message": str(exc)}]) from exc
    filters = PlanFilters(
        cluster_id=cluster_id,
        model=model,
        status=status_,
        created_after=as_utc(created_after),
        created_before=as_utc(created_before),
    )
    rows, next_cursor = plans.list_page(limit=limit, before_id=before, filters=filters)
    return Page[PlanOut](items=[plan_out(r) for r in rows], next_cursor=next_cursor)


@router.get("/{plan_id}", response_model=PlanOut)
def get_plan(plan_id: str, plans: PlanRepoDep) -> PlanOut:
    return plan_out(_get_or_404(plans, plan_id))


@router.delete("/{plan_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_plan(plan_id: str, plans: PlanRepoDep) -> Response:
    plans.delete(_get_or_404(plans, plan_id))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{plan_id}/artifacts", response_model=Page[ArtifactOut])
def list_artifacts(plan_id: str, plans: PlanRepoDep) -> Page[ArtifactOut]:
    return Page[ArtifactOut](items=plan_out(_get_or_404(plans, plan_id)).artifacts)


@router.get(
    "/{plan_id}/artifacts.zip",
    response_class=Response,
    responses={200: {"content": {"application/zip": {}}, "description": "every artifact in one zip"}},
)
def artifacts_bundle(plan_id: str, plans: PlanRepoDep) -> Response:
    record = _get_or_404(plans, plan_id)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for artifact in record.artifacts:
            info = zipfile.ZipInfo(artifact["name"], date_time=record.created_at.timetuple()[:6])
            info.external_attr = (0o755 if artifact["name"].endswith(".sh") else 0o644) << 16
            bundle.writestr(info, artifact["content"])
    return Response(
        buffer.getvalue(),
        media_type="application/zip",
        headers={"Content-Disposition": f'attachment; filename="plan-{record.id}.zip"'},
    )


@router.get(
    "/{plan_id}/artifacts/{name}",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "the file, raw"}},
)
def get_artifact(plan_id: str, name: str, plans: PlanRepoDep) -> Response:
    record = _get_or_404(plans, plan_id)
    for artifact in record.artifacts:
        if artifact["name"] == name:
            return Response(
                artifact["content"],
                media_type=artifact["media_type"],
                headers={"Content-Disposition": f'attachment; filename="{name}"'},
            )
    known = [a["name"] for a in record.artifacts]
    raise NotFound(f"plan {plan_id!r} has no artifact {name!r} (it has: {', '.join(known) or 'none'})")


@router.post("/{plan_id}/runs", status_code=status.HTTP_201_CREATED, response_model=RunOut)
def create_run(
    plan_id: str, body: RunIn, plans: PlanRepoDep, response: Response, idempotency_key: IdempotencyKey = None
) -> RunOut:
    """Store what a run measured; a retry with the same Idempotency-Key is not counted twice."""
    record = _get_or_404(plans, plan_id)
    scope = f"POST /v1/plans/{plan_id}/runs"
    digest = request_digest(body)
    earlier = stored_resource(plans, idempotency_key, scope, digest)
    if earlier is not None:
        return _replay_run(plan_id, earlier, plans, response)
    recommended = record.result.get("recommended")
    if recommended is None:
        raise Conflict(
            f"plan {plan_id!r} is infeasible: it has no layout a run could have measured",
            errors=[{"field": "plan_id", "message": "infeasible plan"}],
        )
    run = RunRecord(plan_id=record.id, **body.model_dump())
    training = record.request["training"]
    run.diagnosis = diagnose(
        observed(run),
        recommended["estimate"],
        recommended["layout"],
        training["seq_len"] * training["global_batch_size"],
    )
    try:
        plans.add_run(run)
        remember(plans, idempotency_key, scope, digest, run.id)
    except IntegrityError:
        plans.session.rollback()
        earlier = stored_resource(plans, idempotency_key, scope, digest)
        if earlier is None:
            raise
        return _replay_run(plan_id, earlier, plans, response)
    calibration = calibration_for(plans, record.hardware_key, str(record.framework))
    response.headers["Location"] = f"/v1/plans/{plan_id}/runs/{run.id}"
    return run_out(run, calibration_out(calibration))


def _replay_run(plan_id: str, run_id: str, plans: PlanRepository, response: Response) -> RunOut:
    run = plans.run(run_id)
    if run is None or run.plan_id != plan_id:
        raise NotFound(f"run {run_id} of plan {plan_id} has since been deleted")
    replayed(response, f"/v1/plans/{plan_id}/runs/{run_id}")
    return run_out(run, None)


@router.get("/{plan_id}/runs/{run_id}", response_model=RunOut)
def get_run(plan_id: str, run_id: str, plans: PlanRepoDep) -> RunOut:
    run = plans.run(run_id)
    if run is None or run.plan_id != plan_id:
        raise NotFound(f"plan {plan_id!r} has no run {run_id!r}")
    return run_out(run, None)


@router.get("/{plan_id}/runs", response_model=Page[RunOut])
def list_runs(plan_id: str, plans: PlanRepoDep) -> Page[RunOut]:
    _get_or_404(plans, plan_id)
    return Page[RunOut](items=[run_out(r, None) for r in plans.runs(plan_id)])


def run_out(run: RunRecord, calibration: dict[str, Any] | None) -> RunOut:
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
        diagnosis=run.diagnosis,
        calibration=calibration,
    )
