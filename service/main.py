"""The app factory: settings -> engine (in lifespan) -> routers, middleware and error handlers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI
from sqlalchemy.orm import sessionmaker

from service.api.main import api_router
from service.api.problems import document_problem_schema, install_handlers
from service.logs import configure_logging
from service.metrics import Metrics
from service.middleware import (
    ArrivalTimeMiddleware,
    BodyLimitMiddleware,
    HeadMiddleware,
    JsonBodyMiddleware,
    MetricsMiddleware,
    NulRefusalMiddleware,
    ProblemCORSMiddleware,
    RequestIdMiddleware,
)
from service.persistence.db import ConnectionGate, make_engine, serialize_sqlite_writes, sqlite_file_identity
from service.persistence.schema import known_revisions
from service.recommender.collector import freeze_startup_objects
from service.settings import Settings, get_settings
from service.versions import estimator_version

VERSION = "0.1.0"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(
            settings.database_url,
            sqlite_busy_timeout_ms=settings.sqlite_busy_timeout_ms,
            connect_timeout_s=settings.database_connect_timeout_s,
            statement_timeout_ms=settings.database_statement_timeout_ms,
            pool_timeout_s=settings.database_pool_timeout_s,
            pool_connections=settings.database_pool_connections,
        )
        app.state.engine = engine
        app.state.sessionmaker = sessionmaker(engine, expire_on_commit=False)
        app.state.database_identity = None
        release_writer_lock = None
        if engine.dialect.name == "sqlite":
            with contextlib.suppress(Exception), engine.connect():  # SQLite creates its file here
                pass  # a failure is /readyz's to report, not a crash at startup
            identity = app.state.database_identity = sqlite_file_identity(engine)
            release_writer_lock = serialize_sqlite_writes(
                app.state.sessionmaker,
                settings.sqlite_busy_timeout_ms / 1000,
                identity[0] if identity else None,
            )
        # Digest the estimator's source once, before the first plan: concurrent first requests
        # would each parse every file (functools.cache does not hold them back).
        estimator_version()
        known_revisions()  # the migrations' head, which /readyz compares with the database's
        # the slots are the event loop's (their waiters hold no worker thread): made in it
        app.state.planning_slots = anyio.Semaphore(settings.max_concurrent_planning)
        app.state.plans_in_flight = {}  # (owner, Idempotency-Key) -> set when that plan has answered
        app.state.estimate_slots = anyio.Semaphore(settings.max_concurrent_planning)
        app.state.capacity_slots = anyio.Semaphore(settings.max_concurrent_capacity)
        app.state.owner_slots = {}  # (what, owner) -> that owner's share of them (deps.owner_share)
        freeze_startup_objects()  # what startup made lives as long as the process
        try:
            yield
        finally:
            engine.dispose()
            if release_writer_lock is not None:
                release_writer_lock()

    app = FastAPI(
        title="trainplan",
        version=VERSION,
        summary="Plans LLM training layouts that fit in GPU memory, with numbers.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.connection_gate = ConnectionGate(settings.database_pool_connections)
    app.state.metrics = Metrics()
    configure_logging(settings.log_level, settings.log_format)
    install_handlers(app)
    document_problem_schema(app)
    app.include_router(api_router)
    # Outermost last: request id wraps everything so even a 413 or a 500 carries it.
    app.add_middleware(JsonBodyMiddleware)  # inside the body limit: it reads a body to check it
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(NulRefusalMiddleware)
    if settings.cors_origins:
        app.add_middleware(
            ProblemCORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["*"],
            allow_headers=["*"],
            # every header an answer carries that a page reads: the If-Match flow needs ETag, a 503
            # says when to retry, a replayed plan says so (a browser shows a script none of these
            # unless listed: the Fetch standard's CORS-safelisted response headers)
            expose_headers=["X-Request-ID", "Location", "ETag", "Retry-After", "Idempotent-Replayed"],
        )
    app.add_middleware(HeadMiddleware)
    # every answer counted and logged, with its request id (inside): the middlewares above answer too
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    app.add_middleware(ArrivalTimeMiddleware)
    app.add_middleware(RequestIdMiddleware)
    return app
