"""Repositories: a session in __init__, `add`/`flush` only; the session dependency commits.

Every repository works for one owner, the one its session was opened for (``session.info["owner"]``,
set by the request's session dependency from its API key; ``local`` when authentication is off):
it reads only that owner's rows and stamps the rows it adds, so no route can reach another owner's
clusters, plans, runs or idempotency keys by forgetting a filter."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy import CursorResult, Select, delete, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session, defer

from service.persistence.db import WRITER_OPTION
from service.persistence.models import (
    LOCAL_OWNER,
    ApiKeyRecord,
    ClusterRecord,
    IdempotencyKeyRecord,
    PlanRecord,
    RunRecord,
)

Row = TypeVar("Row")


class InvalidCursor(ValueError):
    pass


# the lists a cursor pages (``encode_cursor``'s kind): their tables' names, and for a list within a
# table, whose it is (a plan's runs, an owner's keys: a cursor of plan A's runs paged plan B's from A's
# position, skipping B's older runs; change review)
CLUSTERS_LIST = ClusterRecord.__tablename__
PLANS_LIST = PlanRecord.__tablename__


def runs_list(plan_id: str) -> str:
    return f"{RunRecord.__tablename__}/{plan_id}"


def keys_list(owner: str | None) -> str:
    return f"{ApiKeyRecord.__tablename__}/{'' if owner is None else owner}"


def encode_cursor(last_id: str, kind: str) -> str:
    """The opaque cursor of a page of ``kind`` (a table's name) after ``last_id``: bound to its list,
    so that another list's cursor is refused, not read as a position in this one (a clusters page's
    cursor paged the plans from an arbitrary place; HTTP-semantics review)."""
    return base64.urlsafe_b64encode(f"{kind}:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str, kind: str) -> str:
    """The id a cursor of ``kind``'s list names (``encode_cursor``); InvalidCursor for any other."""
    refused = InvalidCursor(f"cursor {cursor!r} is not one this service issued for this list")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except ValueError as exc:  # binascii.Error, UnicodeDecodeError, non-ASCII input
        raise refused from exc
    issued_for, _, last_id = raw.rpartition(":")
    if issued_for != kind or len(last_id) != 26 or not last_id.isalnum():
        raise refused
    return last_id


def ascending_page(
    session: Session,
    query: Select[Row],
    column: InstrumentedAttribute[str],
    *,
    limit: int,
    after_id: str | None,
    kind: str,
) -> tuple[Sequence[Row], str | None]:
    """``limit`` rows of ``query`` in ``column`` (an id) order after ``after_id``, and the cursor of the
    page after them (the last id of this one; None: the last page)."""
    query = query.order_by(column).limit(limit + 1)
    if after_id is not None:
        query = query.where(column > after_id)
    rows = session.scalars(query).all()
    next_cursor = encode_cursor(getattr(rows[limit - 1], column.key), kind) if len(rows) > limit else None
    return rows[:limit], next_cursor


def session_owner(session: Session) -> str:
    """The owner a session works for."""
    owner: str = session.info.get("owner", LOCAL_OWNER)
    return owner


class ClusterRepository:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.owner = session_owner(session)

    def get(self, cluster_id: str) -> ClusterRecord | None:
        record = self.session.get(ClusterRecord, cluster_id)
        return record if record is not None and record.owner == self.owner else None

    def get_for_write(self, cluster_id: str) -> ClusterRecord | None:
        """The cluster as it is once this transaction holds the right to write it: the row locked
        (PostgreSQL's SELECT ... FOR UPDATE; on SQLite the writer taken first: ``WRITER_OPTION``),
        read afresh. A write that names no version then replaces the latest row; two such writes to
        one cluster queue instead of one failing on the version the other moved."""
        query = (
            select(ClusterRecord)
            .where(ClusterRecord.id == cluster_id, ClusterRecord.owner == self.owner)
            .with_for_update()
            .execution_options(populate_existing=True, **{WRITER_OPTION: True})
        )
        return self.session.scalars(query).first()

    def get_by_name(self, name: str) -> ClusterRecord | None:
        query = select(ClusterRecord).where(ClusterRecord.owner == self.owner, ClusterRecord.name == name)
        return self.session.scalars(query).first()

    def list_page(self, *, limit: int, after_id: str | None) -> tuple[Sequence[ClusterRecord], str | None]:
        query = select(ClusterRecord).where(ClusterRecord.owner == self.owner)
        return ascending_page(
            self.session, query, ClusterRecord.id, limit=limit, after_id=after_id, kind=CLUSTERS_LIST
        )

    def add(self, record: ClusterRecord) -> ClusterRecord:
        record.owner = self.owner
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
        self.owner = session_owner(session)

    def get(self, plan_id: str) -> PlanRecord | None:
        record = self.session.get(PlanRecord, plan_id)
        return record if record is not None and record.owner == self.owner else None

    def add(self, record: PlanRecord) -> PlanRecord:
        record.owner = self.owner
        self.session.add(record)
        self.session.flush()
        return record

    def delete(self, record: PlanRecord) -> bool:
        """The plan and its runs (the database's ON DELETE CASCADE); idempotency keys stay, so a late
        retry learns it was deleted. False where nothing was deleted: a concurrent request deleted it
        between this one's read and its delete (the ORM's delete only warned, and both answered 204)."""
        statement = delete(PlanRecord).where(PlanRecord.id == record.id, PlanRecord.owner == self.owner)
        result = self.session.execute(statement.execution_options(synchronize_session=False))
        deleted = cast(CursorResult[Any], result).rowcount  # a DELETE's result is a cursor's
        self.session.expunge(record)
        return bool(deleted)

    def list_page(
        self, *, limit: int, before_id: str | None, filters: PlanFilters
    ) -> tuple[Sequence[PlanRecord], str | None]:
        """Newest first; the cursor is the last id of the page."""
        query = (
            select(PlanRecord)
            .where(PlanRecord.owner == self.owner)
            .order_by(PlanRecord.id.desc())
            .limit(limit + 1)
        )
        if before_id is not None:
            query = query.where(PlanRecord.id < before_id)
        if filters.cluster_id is not None:
            query = query.where(PlanRecord.cluster_id == filters.cluster_id)
        if filters.models:
            query = query.where(PlanRecord.model_name.in_(filters.models))
        if filters.status is not None:
            query = query.where(PlanRecord.status == filters.status)
        if filters.created_after is not None:
            query = query.where(PlanRecord.created_at >= filters.created_after)
        if filters.created_before is not None:
            query = query.where(PlanRecord.created_at < filters.created_before)
        rows = self.session.scalars(query).all()
        next_cursor = encode_cursor(rows[limit - 1].id, PLANS_LIST) if len(rows) > limit else None
        return rows[:limit], next_cursor

    def idempotency_key(self, key: str, scope: str) -> IdempotencyKeyRecord | None:
        return self.session.get(IdempotencyKeyRecord, (self.owner, key, scope))

    def add_idempotency_key(self, record: IdempotencyKeyRecord) -> None:
        record.owner = self.owner
        self.session.add(record)
        self.session.flush()

    def add_run(self, record: RunRecord, plan: PlanRecord) -> RunRecord:
        record.plan_id, record.owner, record.hardware_key = plan.id, plan.owner, plan.hardware_key
        self.session.add(record)
        self.session.flush()
        return record

    def run(self, run_id: str) -> RunRecord | None:
        """A run of one of this owner's plans."""
        record = self.session.get(RunRecord, run_id)
        return record if record is not None and record.owner == self.owner else None

    def runs_page(
        self, plan_id: str, *, limit: int, after_id: str | None
    ) -> tuple[Sequence[RunRecord], str | None]:
        """The plan's runs, oldest first."""
        query = select(RunRecord).where(RunRecord.owner == self.owner, RunRecord.plan_id == plan_id)
        return ascending_page(
            self.session, query, RunRecord.id, limit=limit, after_id=after_id, kind=runs_list(plan_id)
        )

    def runs_on_hardware(
        self, hardware_keys: Sequence[str], framework: str | None = None, *, limit: int | None = None
    ) -> Sequence[tuple[RunRecord, PlanRecord]]:
        """The runs this owner stored of plans made for this hardware (under any of its keys: the
        current one and earlier releases', ``planning.calibration.hardware_keys``) and this framework,
        if given, oldest first: every one, or the ``limit`` most recent. One owner's runs never
        calibrate another's estimates."""
        query = (
            select(RunRecord, PlanRecord)
            .join(PlanRecord, RunRecord.plan_id == PlanRecord.id)
            # filtered on the run's own columns: the index leads, each plan is one key lookup
            .where(RunRecord.owner == self.owner, RunRecord.hardware_key.in_(hardware_keys))
            .options(defer(PlanRecord.artifacts))
            .order_by(RunRecord.id.desc())  # ULIDs: newest first
        )
        if framework is not None:
            query = query.where(PlanRecord.framework == framework)
        if limit is not None:
            query = query.limit(limit)
        return [(run, plan) for run, plan in reversed(self.session.execute(query).all())]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanFilters:
    cluster_id: str | None = None
    models: tuple[str, ...] = ()  # a plan of any of these model names (none: every model)
    status: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
