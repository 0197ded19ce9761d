"""Repositories: a session in __init__, `add`/`flush` only; the session dependency commits."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.persistence.models import ClusterRecord, IdempotencyKeyRecord, PlanRecord, RunRecord


class InvalidCursor(ValueError):
    pass


def encode_cursor(last_id: str) -> str:
    return base64.urlsafe_b64encode(last_id.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except ValueError as exc:  # binascii.Error, UnicodeDecodeError, non-ASCII input
        raise InvalidCursor(f"cursor {cursor!r} is not one this service issued") from exc
    if len(raw) != 26 or not raw.isalnum():
        raise InvalidCursor(f"cursor {cursor!r} is not one this service issued")
    return raw


class ClusterRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, cluster_id: str) -> ClusterRecord | None:
        return self.session.get(ClusterRecord, cluster_id)

    def get_by_name(self, name: str) -> ClusterRecord | None:
        return self.session.scalars(select(ClusterRecord).where(ClusterRecord.name == name)).first()

    def list_page(self, *, limit: int, after_id: str | None) -> tuple[Sequence[ClusterRecord], str | None]:
        query = select(ClusterRecord).order_by(ClusterRecord.id).limit(limit + 1)
        if after_id is not None:
            query = query.where(ClusterRecord.id > after_id)
        rows = self.session.scalars(query).all()
        next_cursor = encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
        return rows[:limit], next_cursor

    def add(self, record: ClusterRecord) -> ClusterRecord:
        self.session.add(record)
        self.session.flush()
        return record

    def delete(self, record: ClusterRecord) -> None:
        self.session.delete(record)
        self.session.flush()

    def plan_count(self, cluster_id: str) -> int:
        query = select(func.count()).select_from(PlanRecord).where(PlanRecord.cluster_id == cluster_id)
        return int(self.session.scalar(query) or 0)


class PlanRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, plan_id: str) -> PlanRecord | None:
        return self.session.get(PlanRecord, plan_id)

    def add(self, record: PlanRecord) -> PlanRecord:
        self.session.add(record)
        self.session.flush()
        return record

    def delete(self, record: PlanRecord) -> None:
        """The plan and its runs; idempotency keys stay, so a late retry learns it was deleted."""
        self.session.delete(record)
        self.session.flush()

    def list_page(
        self, *, limit: int, before_id: str | None, filters: PlanFilters
    ) -> tuple[Sequence[PlanRecord], str | None]:
        """Newest first; the cursor is the last id of the page."""
        query = select(PlanRecord).order_by(PlanRecord.id.desc()).limit(limit + 1)
        if before_id is not None:
            query = query.where(PlanRecord.id < before_id)
        if filters.cluster_id is not None:
            query = query.where(PlanRecord.cluster_id == filters.cluster_id)
        if filters.model is not None:
            query = query.where(PlanRecord.model_name == filters.model)
        if filters.status is not None:
            query = query.where(PlanRecord.status == filters.status)
        if filters.created_after is not None:
            query = query.where(PlanRecord.created_at >= filters.created_after)
        if filters.created_before is not None:
            query = query.where(PlanRecord.created_at < filters.created_before)
        rows = self.session.scalars(query).all()
        next_cursor = encode_cursor(rows[limit - 1].id) if len(rows) > limit else None
        return rows[:limit], next_cursor

    def idempotency_key(self, key: str, scope: str) -> IdempotencyKeyRecord | None:
        return self.session.get(IdempotencyKeyRecord, (key, scope))

    def add_idempotency_key(self, record: IdempotencyKeyRecord) -> None:
        self.session.add(record)
        self.session.flush()

    def add_run(self, record: RunRecord) -> RunRecord:
        self.session.add(record)
        self.session.flush()
        return record

    def run(self, run_id: str) -> RunRecord | None:
        return self.session.get(RunRecord, run_id)

    def runs(self, plan_id: str) -> Sequence[RunRecord]:
        return self.session.scalars(
            select(RunRecord).where(RunRecord.plan_id == plan_id).order_by(RunRecord.id)
        ).all()

    def runs_on_hardware(
        self, hardware_key: str, framework: str | None = None
    ) -> Sequence[tuple[RunRecord, PlanRecord]]:
        """Every stored run of a plan made for this hardware (and this framework, if given)."""
        query = (
            select(RunRecord, PlanRecord)
            .join(PlanRecord, RunRecord.plan_id == PlanRecord.id)
            .where(PlanRecord.hardware_key == hardware_key)
            .order_by(RunRecord.id)
        )
        if framework is not None:
            query = query.where(PlanRecord.framework == framework)
        return [(run, plan) for run, plan in self.session.execute(query).all()]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanFilters:
    cluster_id: str | None = None
    model: str | None = None
    status: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
