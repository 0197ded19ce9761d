"""Retry-safe writes, for plans and runs alike: the same Idempotency-Key and body create once.

A key is stored in the same transaction as the resource it created, under a scope (which
write it belongs to) and the digest of the request body. A retry with the same body replays
the stored resource; the same key with another body is refused; when two requests with one
key race, the loser's insert of the key fails, its transaction is rolled back and it replays
the winner's resource.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.errors import Conflict, Unprocessable
from service.persistence.models import IdempotencyKeyRecord
from service.persistence.repository import PlanRepository

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What a retry-safe write returns; `replayed` when an earlier request created it."""

    value: T
    replayed: bool


def request_digests(body: BaseModel) -> tuple[str, str, str]:
    """(the digest stored with a new key, and those earlier releases stored): the body's fields as
    the client sent them, its defaults and nulls left out (a null is the field left out: README), so
    that a field a later release adds, or a default it changes, or a client's encoder writing null for
    what it leaves unset, is not another body to a retry (operator review: a retry adding
    "max_gpus": null was refused as 'another request body'); the same with the nulls kept, as a
    release before 2026-12-07 computed it; and every field, defaults included, as one before
    2026-12-06 did (an upgrade review: every retry of a key stored by an earlier release was refused)."""
    sent = body.model_dump(mode="json", exclude_unset=True)
    return _digest(_without_nulls(sent)), _digest(sent), _digest(body.model_dump(mode="json"))


def _without_nulls(value: object) -> object:
    """``value`` with every null member of an object left out, at any depth (list items kept)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def _digest(fields: object) -> str:
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _stored_resource(repo: PlanRepository, key: str, scope: str, digests: tuple[str, ...]) -> str | None:
    """The id a previous request with this key created, if any; the same key with another body
    is refused."""
    found = repo.idempotency_key(key, scope)
    if found is None:
        return None
    if found.request_sha256 not in digests:
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


def is_stored(session: Session, key: str, scope: str) -> bool:
    """Whether a request with this key (of the session's owner, under ``scope``) created a resource:
    a retry to replay, whatever its body (``create_once`` refuses another body)."""
    return PlanRepository(session).idempotency_key(key, scope) is not None


def create_once(
    session: Session,
    *,
    scope: str,
    key: str | None,
    digests: tuple[str, ...],
    create: Callable[[], tuple[str, T]],
    replay: Callable[[str], T],
) -> Outcome[T]:
    """`create()` adds the resource and returns its id and value; `replay(id)` returns the value of
    one created earlier. Without a key, `create()` simply runs. A lost race rolls back the
    caller's whole transaction (PostgreSQL has aborted it at the failed insert anyway), so give
    each retry-safe write a transaction of its own, as every HTTP request has."""
    if key is None:
        return Outcome(create()[1], replayed=False)
    repo = PlanRepository(session)
    earlier = _stored_resource(repo, key, scope, digests)
    if earlier is not None:
        return Outcome(replay(earlier), replayed=True)
    try:
        resource_id, value = create()
        repo.add_idempotency_key(
            IdempotencyKeyRecord(key=key, scope=scope, request_sha256=digests[0], resource_id=resource_id)
        )
    except (IntegrityError, Conflict):
        # A concurrent request with the same key committed first: it owns the resource (its insert of
        # the key, or of what the resource must have alone: a cluster's name, which a create refuses
        # as a Conflict; two concurrent creates of one cluster with one key answered one 201, one 409)
        session.rollback()
        earlier = _stored_resource(repo, key, scope, digests)
        if earlier is None:
            raise
        return Outcome(replay(earlier), replayed=True)
    return Outcome(value, replayed=False)
