"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from sqlalchemy import Engine, text

from service.api.deps import database_file_replaced, database_slot
from service.errors import ServiceUnavailable
from service.persistence.db import driver_message
from service.persistence.schema import database_revision, schema_problem

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)
# readiness failures, counted with the requests' database 503s (fixed sentences: metric labels)
READINESS_UNREACHABLE = "readiness: the database is not reachable"
READINESS_SCHEMA = "readiness: the database's schema is not this service's"
READINESS_REPLACED = "readiness: the SQLite database file was removed or replaced"
READINESS_UNWRITABLE = "readiness: the SQLite database files are not writable"


# async: answered on the event loop, never queued behind the worker threads a burst of plans holds
@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


# Load balancers probe with HEAD: the same answers without a body (not in the OpenAPI document).
@router.head("/healthz", include_in_schema=False)
async def healthz_head() -> Response:
    return Response(status_code=200)


@router.head("/readyz", include_in_schema=False)
def readyz_head(request: Request) -> Response:
    readyz(request)
    return Response(status_code=200)


@router.get("/readyz", responses={503: {"description": "the database does not answer or cannot be written"}})
def readyz(request: Request) -> dict[str, str]:
    engine: Engine = request.app.state.engine
    try:
        with database_slot(request), engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            revision = database_revision(conn)
    except Exception as exc:
        # the driver's words go to the log, not to whoever can reach the probe (hosts, database names)
        log.warning(
            "not ready: the database is not reachable (%s: %s)", type(exc).__name__, driver_message(exc)
        )
        request.app.state.metrics.observe_database_unavailable(READINESS_UNREACHABLE)
        raise ServiceUnavailable(f"database not reachable: {type(exc).__name__}") from exc
    problem = schema_problem(revision)
    if problem is not None:
        log.warning("not ready: %s", problem)
        request.app.state.metrics.observe_database_unavailable(READINESS_SCHEMA)
        raise ServiceUnavailable(problem)
    replaced = database_file_replaced(request)
    if replaced is not None:
        request.app.state.metrics.observe_database_unavailable(READINESS_REPLACED)
        raise ServiceUnavailable(replaced)
    unwritable = _unwritable_sqlite_files(engine)
    if unwritable:
        request.app.state.metrics.observe_database_unavailable(READINESS_UNWRITABLE)
        log.warning("not ready: SQLite database files not writable: %s", ", ".join(unwritable))
        raise ServiceUnavailable("the SQLite database files are not writable (their paths are in the log)")
    return {"status": "ready", "database": engine.dialect.name}


def _unwritable_sqlite_files(engine: Engine) -> list[str]:
    """SQLite writes the database, its WAL and shared-memory files and creates them in the folder:
    any of them read-only and every write would fail while reads still answer."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        return []
    main = Path(database)
    paths = [main.parent, main, *(main.with_name(main.name + suffix) for suffix in ("-wal", "-shm"))]
    return [str(path) for path in paths if path.exists() and not os.access(path, os.W_OK)]


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request) -> PlainTextResponse:
    return PlainTextResponse(
        request.app.state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
    )
