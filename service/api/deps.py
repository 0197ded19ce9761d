"""Dependencies as Annotated aliases: settings, the request's session (the one place that
commits), and repositories."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from service.errors import ServiceUnavailable
from service.persistence.db import sqlite_file_identity
from service.persistence.repository import ClusterRepository, PlanRepository
from service.settings import Settings


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def check_database_file(request: Request) -> None:
    """503 when the SQLite file the service opened was deleted or replaced: its writes would be lost."""
    opened = request.app.state.database_identity
    if opened is not None and sqlite_file_identity(request.app.state.engine) != opened:
        raise ServiceUnavailable(
            f"the database file {opened[0]} was removed or replaced while the service ran; "
            "restore it and restart the service"
        )


def get_session(request: Request) -> Iterator[Session]:
    """Commit when the handler returns, roll back when it raises: nothing is half-written."""
    check_database_file(request)
    factory: sessionmaker[Session] = request.app.state.sessionmaker
    with factory() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def planning_slot(request: Request) -> Iterator[None]:
    """One of the bounded slots for CPU-heavy planning (estimates, plans, capacity): waits up to
    ``planning_queue_wait_s`` for one, else 503 with Retry-After. Health checks and reads never
    queue behind a burst of searches."""
    settings: Settings = request.app.state.settings
    slots: threading.BoundedSemaphore = request.app.state.planning_slots
    if not slots.acquire(timeout=settings.planning_queue_wait_s):
        raise ServiceUnavailable(
            f"all {settings.max_concurrent_planning} planning slots are busy "
            f"(waited {settings.planning_queue_wait_s:g} s for one)"
        )
    try:
        yield
    finally:
        slots.release()


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
PlanningSlot = Depends(planning_slot)
# scope="function": commit before the response is sent, so a failed commit is never a 2xx.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def get_cluster_repository(session: SessionDep) -> ClusterRepository:
    return ClusterRepository(session)


ClusterRepoDep = Annotated[ClusterRepository, Depends(get_cluster_repository)]


def get_plan_repository(session: SessionDep) -> PlanRepository:
    return PlanRepository(session)


PlanRepoDep = Annotated[PlanRepository, Depends(get_plan_repository)]
