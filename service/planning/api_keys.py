"""API keys: create (the secret is shown once), list, revoke, and authenticate a presented secret.

Keys exist only under authentication: the first admin key is made by the operator on the database
(`trainplan keys create OWNER --scope admin`, no HTTP involved), later ones by an authenticated admin
over the API (which refuses with 403 while PLANNER_REQUIRE_AUTH is off). Each key records which.

A secret is ``tp_`` and 32 random bytes (256 bits, URL-safe base64); only its SHA-256 is stored. A
fast hash is enough for secrets this random (a slow password hash protects guessable passwords, which
these are not), and lets every request find its key by one indexed lookup.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import NotFound, Unprocessable
from service.persistence.db import utcnow
from service.persistence.models import LOCAL_OWNER, ApiKeyRecord
from service.persistence.repository import InvalidCursor, ascending_page, decode_cursor, keys_list

# read: GET everything the owner has, and computations that store nothing (estimates, capacity,
# model resolution);
# write: create, change and delete clusters, plans and runs; admin: manage API keys of every owner.
SCOPES = ("read", "write", "admin")
SECRET_PREFIX = "tp_"
# How a new key is made (the "unknown" of keys from before this was recorded is never given again).
KeyOrigin = Literal["operator", "api"]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request acts as: the owner of its rows, and what it may do."""

    owner: str
    scopes: frozenset[str]
    key_id: str | None  # None: authentication is off


LOCAL = Principal(owner=LOCAL_OWNER, scopes=frozenset(SCOPES), key_id=None)


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_key(
    session: Session, *, owner: str, name: str, scopes: Sequence[str], created_via: KeyOrigin = "operator"
) -> tuple[ApiKeyRecord, str]:
    """A new key and its secret (returned once, never stored); made by the operator on the database
    unless `created_via` says the API made it."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    ordered = [scope for scope in SCOPES if scope in set(scopes)]
    record = ApiKeyRecord(
        owner=owner, name=name, scopes=ordered, secret_sha256=secret_digest(secret), created_via=created_via
    )
    session.add(record)
    session.flush()
    return record, secret


def list_keys(
    session: Session, owner: str | None = None, *, limit: int = 50, cursor: str | None = None
) -> tuple[Sequence[ApiKeyRecord], str | None]:
    """A page of keys in id order after ``cursor`` (a previous page's next_cursor), and the next
    page's cursor (None: the last page), as every list pages."""
    try:
        after = decode_cursor(cursor, keys_list(owner)) if cursor else None
    except InvalidCursor as exc:
        raise Unprocessable(str(exc), errors=[{"field": "query.cursor", "message": str(exc)}]) from exc
    query = select(ApiKeyRecord)
    if owner is not None:
        query = query.where(ApiKeyRecord.owner == owner)
    return ascending_page(session, query, ApiKeyRecord.id, limit=limit, after_id=after, kind=keys_list(owner))


def get_key(session: Session, key_id: str) -> ApiKeyRecord:
    """One key's record (never its secret, which only its digest keeps)."""
    record = session.get(ApiKeyRecord, key_id)
    if record is None:
        raise NotFound(f"API key {key_id!r} does not exist")
    return record


def revoke_key(session: Session, key_id: str) -> ApiKeyRecord:
    """Revoked from the next request on, on every replica (each request looks its key up)."""
    record = get_key(session, key_id)
    if record.revoked_at is None:
        record.revoked_at = utcnow()
        session.flush()
    return record


def authenticate(session: Session, secret: str) -> Principal | None:
    """The principal of a presented secret; None when it is unknown or revoked."""
    if not secret.startswith(SECRET_PREFIX) or len(secret) > 200:
        return None
    record = session.scalars(
        select(ApiKeyRecord).where(ApiKeyRecord.secret_sha256 == secret_digest(secret))
    ).first()
    if record is None or record.revoked_at is not None:
        return None
    return Principal(owner=record.owner, scopes=frozenset(record.scopes), key_id=record.id)
