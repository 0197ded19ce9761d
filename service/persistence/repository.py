"""Repositories: a session in __init__, `add`/`flush` only; the session dependency commits."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.persistence.models import ClusterRecord, PlanRecord


class InvalidCursor(ValueError):
    pass


def encode_cursor(last_id: str) -> str:
    return base64.urlsafe_b64encode(last_id.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
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
