"""problem+json (RFC 9457): how every error is rendered, and how the routers document it.

Every error, ours (`service.errors`, `EstimatorError`, `UnknownCatalogEntry`) or FastAPI's own
(404, 405, 422), goes through the handlers `install_handlers` registers; `PROBLEM_RESPONSES` is
their OpenAPI documentation, shared by every router.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from service.api.schemas.common import Problem
from service.catalog.errors import UnknownCatalogEntry
from service.errors import ServiceError
from service.estimator.errors import EstimatorError

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://trainplan.dev/problems/"

_PROBLEM_CONTENT = {PROBLEM_MEDIA_TYPE: {"schema": Problem.model_json_schema()}}

PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "Malformed request (e.g. invalid JSON)", "content": _PROBLEM_CONTENT},
    404: {"description": "Not found", "content": _PROBLEM_CONTENT},
    409: {"description": "Conflict with stored state", "content": _PROBLEM_CONTENT},
    413: {"description": "Request body too large", "content": _PROBLEM_CONTENT},
    422: {
        "description": "Validation error; `errors` names each field and limit",
        "content": _PROBLEM_CONTENT,
    },
}


def problem_response(
    status: int,
    detail: str,
    *,
    slug: str,
    errors: list[dict[str, Any]] | None = None,
    instance: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + slug,
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    if instance is not None:
        body["instance"] = instance
    if errors:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


# Tags of discriminated unions in api/schemas/: they are not fields, so locations omit them.
_UNION_TAGS = {"by_id", "inline", "str", "CustomGPU"}


def _field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """('body', 'gpu', 'memory_bytes') -> 'gpu.memory_bytes'; query and path keep their prefix."""
    parts = [str(p) for p in loc if p not in _UNION_TAGS]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or "body"


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        entry: dict[str, Any] = {"field": _field_path(err.get("loc", ())), "message": err.get("msg", "")}
        entry["type"] = err.get("type", "invalid")
        ctx = err.get("ctx") or {}
        limits = {k: v for k, v in ctx.items() if k in ("gt", "ge", "lt", "le", "max_length", "min_length")}
        if limits:
            entry["limit"] = {
                k: (v if isinstance(v, int | float | str) else str(v)) for k, v in limits.items()
            }
        out.append(entry)
    return out


async def _service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    return problem_response(
        exc.status_code, exc.detail, slug=exc.slug, errors=exc.errors, instance=request.url.path
    )


async def _estimator_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EstimatorError)
    errors = [{"field": exc.field or "body", "rule": exc.rule, "message": exc.message}]
    return problem_response(422, exc.message, slug=exc.rule, errors=errors, instance=request.url.path)


async def _unknown_entry(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UnknownCatalogEntry)
    # Reached from path lookups (GET /v1/gpus/{name}); names inside a body are turned into 422s
    # naming the field where the body is resolved (api/schemas/).
    return problem_response(404, str(exc), slug="not-found", instance=request.url.path)


async def _request_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = _validation_errors(exc)
    if any(e["type"] == "json_invalid" for e in errors):
        return problem_response(
            400, "Malformed JSON body", slug="malformed-json", errors=errors, instance=request.url.path
        )
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
    return problem_response(422, detail, slug="validation-error", errors=errors, instance=request.url.path)


async def _http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(status).phrase
    if status == 404 and detail == "Not Found":
        detail = f"No route matches {request.method} {request.url.path}"
    headers = dict(exc.headers or {})
    if status == 405:
        allowed = allowed_methods(request)
        headers["Allow"] = ", ".join(allowed)
        detail = (
            f"Method {request.method} is not allowed on {request.url.path}; allowed: {', '.join(allowed)}"
        )
    slug = {404: "not-found", 405: "method-not-allowed"}.get(status, "http-error")
    return problem_response(status, detail, slug=slug, instance=request.url.path, headers=headers or None)


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves on this path (Starlette's 405 names only the first route's)."""
    routes = request.app.router.routes
    return [
        method
        for method in METHODS
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)
    ]


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(EstimatorError, _estimator_error)
    app.add_exception_handler(UnknownCatalogEntry, _unknown_entry)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
