"""Plans for schedulers: create (retry-safe), list, fetch, delete; artifacts; observed runs.

The workflow is `service.planning`; this router translates HTTP: the Idempotency-Key header,
201 with Location, and Idempotent-Replayed on a retry (the stored answer, its status included).
"""

from __future__ import annotations

import io
import re
import zipfile
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.routing import APIRoute
from pydantic import AfterValidator, BeforeValidator

from service import planning
from service.api.deps import (
    CatalogPage,
    IdempotencyKey,
    PlanningDeadline,
    PlanRepoDep,
    SessionDep,
    created,
    paged,
)
from service.api.problems import PROBLEM_RESPONSES
from service.catalog.models import model as catalog_model
from service.contracts.common import Page, catalog_slug
from service.contracts.plans import ArtifactOut, PlanOut, PlanRequest, RunIn, RunOut
from service.contracts.results import SearchStatsOut
from service.errors import NotFound, Unprocessable
from service.launchers.common import JSON, MEDIA_TYPES
from service.persistence.repository import (
    PLANS_LIST,
    InvalidCursor,
    PlanFilters,
    decode_cursor,
    encode_cursor,
    runs_list,
)

router = APIRouter(prefix="/v1/plans", tags=["plans"], responses=PROBLEM_RESPONSES)

_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


def date_time_only(value: object) -> object:
    """A query timestamp is an ISO 8601 date-time, as the OpenAPI's format says: pydantic would also
    read a number (`created_before=0.5`, seconds since 1970) or a bare date."""
    if isinstance(value, str) and not _DATE_TIME.match(value):
        raise ValueError(f"expected an ISO 8601 date-time such as 2026-12-01T00:00:00Z, got {value!r}")
    return value


def in_utc(moment: datetime) -> datetime:
    """The moment in UTC; one without an offset is UTC, as every timestamp this service writes. A
    moment UTC cannot hold (9999-12-31T23:59:59-05:00 is in the year 10000) is refused, naming the
    parameter, rather than a 500 from the database layer's conversion."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{moment.isoformat()} is outside the years 1 to 9999 in UTC") from None


QueryTime = Annotated[datetime, BeforeValidator(date_time_only), AfterValidator(in_utc)]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=PlanOut,
)
def create_plan(
    body: PlanRequest,
    deadline: PlanningDeadline,
    session: SessionDep,
    request: Request,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> PlanOut:
    outcome = planning.create_plan(session, body, idempotency_key, deadline)
    created(response, f"/v1/plans/{outcome.value.id}", outcome.replayed)
    if not outcome.replayed:
        search = SearchStatsOut.model_validate(outcome.value.search)
        request.app.state.metrics.observe_search(search.duration_s, search.evaluations, search.truncated)
    return outcome.value


@router.get("", response_model=Page[PlanOut])
def list_plans(
    plans: PlanRepoDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    cluster_id: Annotated[str | None, Query(max_length=64)] = None,
    model: Annotated[str | None, Query(max_length=200)] = None,
    # a Literal, not a pattern: its 422 lists the values (`allowed`; scheduler review)
    status_: Annotated[Literal["feasible", "infeasible"] | None, Query(alias="status")] = None,
    created_after: Annotated[QueryTime | None, Query(description="ISO 8601; without an offset: UTC")] = None,
    created_before: Annotated[QueryTime | None, Query(description="ISO 8601; without an offset: UTC")] = None,
) -> Response:
    """Newest first, filtered; pass `next_cursor` back as `cursor` for the next page."""
    try:
        before = decode_cursor(cursor, PLANS_LIST) if cursor else None
    except InvalidCursor as exc:
        raise Unprocessable(str(exc), errors=[{"field": "query.cursor", "message": str(exc)}]) from exc
    filters = PlanFilters(
        cluster_id=cluster_id,
        models=_model_names(model),
        status=status_,
        created_after=created_after,
        created_before=created_before,
    )
    # Read in chunks and answered up to MAX_PAGE_BYTES: a plan is a few KB to a few hundred (its
    # files, top_k alternatives, the runs behind a calibration), and 500 of the largest made one GET
    # 84 MB and six at once 2 GB of memory. The page ends early where the bytes do; its cursor says
    # where the next begins, as for any page.
    items: list[str] = []
    size = 0
    while True:
        want = min(PAGE_CHUNK, limit - len(items))
        rows, more = plans.list_page(limit=want, before_id=before, filters=filters)
        for row in rows:
            text = planning.plan_out(row).model_dump_json()
            if items and size + len(text) > MAX_PAGE_BYTES:
                return _page_response(items, before)  # ends after the last plan it holds
            items.append(text)
            size += len(text)
            before = row.id
        if more is None:
            return _page_response(items, None)
        if len(items) == limit:
            return _page_response(items, before)


MAX_PAGE_BYTES = 8 * 2**20  # a list page's items, serialized
PAGE_CHUNK = 50  # plans read from the database at a time


def _page_response(items: list[str], last_id: str | None) -> Response:
    """A ``Page[PlanOut]`` of items already serialized (each once, as its size was counted), whose
    next page begins after ``last_id`` (None: this is the last)."""
    cursor = "null" if last_id is None else f'"{encode_cursor(last_id, PLANS_LIST)}"'
    body = '{"items":[' + ",".join(items) + '],"next_cursor":' + cursor + "}"
    return Response(content=body, media_type="application/json")


def _model_names(model: str | None) -> tuple[str, ...]:
    """The stored model names a ``model`` filter matches: as given (a custom model's label), and the
    slug of the preset it names, if it names one ("Llama 3.1 8B" finds the plans of llama-3.1-8b, which
    is what a plan stores for it)."""
    if model is None:
        return ()
    return tuple(dict.fromkeys((model, catalog_slug(model, lambda name: catalog_model(name).name))))


@router.get("/{plan_id}", response_model=PlanOut)
def get_plan(plan_id: str, plans: PlanRepoDep) -> PlanOut:
    return planning.plan_out(planning.stored_plan(plans, plan_id))


@router.delete("/{plan_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_plan(plan_id: str, plans: PlanRepoDep) -> Response:
    planning.delete_plan(plans, plan_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{plan_id}/artifacts", response_model=Page[ArtifactOut])
def list_artifacts(plan_id: str, plans: PlanRepoDep, page: CatalogPage) -> Page[ArtifactOut]:
    """The plan's files (a few: one page unless `limit` asks for less)."""
    artifacts = planning.plan_out(planning.stored_plan(plans, plan_id)).artifacts
    shown, next_cursor = paged(artifacts, page)
    return Page[ArtifactOut](items=shown, next_cursor=next_cursor)


@router.get(
    "/{plan_id}/artifacts.zip",
    response_class=Response,
    responses={200: {"content": {"application/zip": {}}, "description": "every artifact in one zip"}},
)
def artifacts_bundle(plan_id: str, plans: PlanRepoDep) -> Response:
    record = planning.stored_plan(plans, plan_id)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for artifact in planning.stored_artifacts(record):
            info = zipfile.ZipInfo(artifact.name, date_time=record.created_at.timetuple()[:6])
            info.external_attr = (0o755 if artifact.name.endswith(".sh") else 0o644) << 16
            bundle.writestr(info, artifact.content)
    return Response(
        buffer.getvalue(),
        media_type="application/zip",
        headers={"Content-Disposition": f'attachment; filename="plan-{record.id}.zip"'},
    )


@router.get(
    "/{plan_id}/artifacts/{name}",
    response_class=Response,
    responses={
        200: {
            # a JSON file's schema is the parsed body's (OpenAPI 3.1): any JSON value, here an object; the
            # others are text (scheduler review: declared a string, a generated client refused the object)
            "content": {
                media_type: {"schema": {"type": "object"} if media_type == JSON else {"type": "string"}}
                for media_type in MEDIA_TYPES
            },
            "description": "the file, raw, as its media type (the artifact's `media_type`)",
        }
    },
)
def get_artifact(plan_id: str, name: str, plans: PlanRepoDep) -> Response:
    artifacts = planning.stored_artifacts(planning.stored_plan(plans, plan_id))
    for artifact in artifacts:
        if artifact.name == name:
            return Response(
                artifact.content,
                media_type=artifact.media_type,
                headers={"Content-Disposition": f'attachment; filename="{name}"'},
            )
    known = [a.name for a in artifacts]
    raise NotFound(f"plan {plan_id!r} has no artifact {name!r} (it has: {', '.join(known) or 'none'})")


@router.post("/{plan_id}/runs", status_code=status.HTTP_201_CREATED, response_model=RunOut)
def create_run(
    plan_id: str, body: RunIn, session: SessionDep, response: Response, idempotency_key: IdempotencyKey = None
) -> RunOut:
    """Store what a run measured; a retry with the same Idempotency-Key is not counted twice."""
    outcome = planning.add_run(session, plan_id, body, idempotency_key)
    created(response, f"/v1/plans/{plan_id}/runs/{outcome.value.id}", outcome.replayed)
    return outcome.value


@router.get("/{plan_id}/runs/{run_id}", response_model=RunOut)
def get_run(plan_id: str, run_id: str, plans: PlanRepoDep) -> RunOut:
    run = plans.run(run_id)
    if run is None or run.plan_id != plan_id:
        raise NotFound(f"plan {plan_id!r} has no run {run_id!r}")
    return planning.run_out(run)


@router.get("/{plan_id}/runs", response_model=Page[RunOut])
def list_runs(
    plan_id: str,
    plans: PlanRepoDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[
        str | None, Query(max_length=200, description="next_cursor of the previous page")
    ] = None,
) -> Page[RunOut]:
    """Oldest first; pass `next_cursor` back as `cursor` for the next page."""
    planning.stored_plan(plans, plan_id)
    try:
        after = decode_cursor(cursor, runs_list(plan_id)) if cursor else None
    except InvalidCursor as exc:
        raise Unprocessable(str(exc), errors=[{"field": "query.cursor", "message": str(exc)}]) from exc
    rows, next_cursor = plans.runs_page(plan_id, limit=limit, after_id=after)
    return Page[RunOut](items=[planning.run_out(r) for r in rows], next_cursor=next_cursor)


# The design's unversioned paths (`POST /plans` for schedulers): the same handlers, dependencies and
# answers as /v1/plans (Location names the /v1 path), listed in the OpenAPI document as deprecated.
# Scopes come from the method and path (deps.required_scope): write for POST and DELETE, read for GET.
UNVERSIONED_PREFIX = "/plans"
unversioned = APIRouter(prefix=UNVERSIONED_PREFIX, tags=["plans (unversioned, deprecated)"])
for _route in router.routes:
    if isinstance(_route, APIRoute):
        _methods = sorted(_route.methods or ())
        unversioned.add_api_route(
            _route.path.removeprefix(router.prefix),
            _route.endpoint,
            methods=_methods,
            status_code=_route.status_code,
            response_model=_route.response_model,
            response_class=_route.response_class,
            responses={**PROBLEM_RESPONSES, **_route.responses},
            name=f"{_route.name}_unversioned",
            summary=f"{_route.summary or _route.name.replace('_', ' ').capitalize()} (alias)",
            description=(
                f"Deprecated alias of `{', '.join(_methods)} {_route.path}`: the same "
                "handler, authentication and answer. New integrations should call the /v1 path."
            ),
            deprecated=True,
        )
