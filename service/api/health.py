"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from sqlalchemy import Engine, text

from service.errors import ServiceUnavailable

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


# Load balancers probe with HEAD: the same answers without a body (not in the OpenAPI document).
@router.head("/healthz", include_in_schema=False)
def healthz_head() -> Response:
    return Response(status_code=200)


@router.head("/readyz", include_in_schema=False)
def readyz_head(request: Request) -> Response:
    readyz(request)
    return Response(status_code=200)


@router.get("/readyz", responses={503: {"description": "the database does not answer"}})
def readyz(request: Request) -> dict[str, str]:
    engine: Engine = request.app.state.engine
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        raise ServiceUnavailable(f"database not reachable: {type(exc).__name__}") from exc
    return {"status": "ready", "database": engine.dialect.name}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request) -> PlainTextResponse:
    return PlainTextResponse(
        request.app.state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
    )
