"""API keys on the wire: what an admin sends to create one, and what the service shows of it."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from service.contracts.common import Strict
from service.persistence.models import OWNER_MAX_LENGTH, ApiKeyOrigin

Scope = Literal["read", "write", "admin"]


def _reads_and_writes() -> list[Scope]:
    return ["read", "write"]


class ApiKeyCreate(Strict):
    owner: str = Field(
        min_length=1,
        max_length=OWNER_MAX_LENGTH,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$",
        description="whose clusters, plans and runs the key reads and writes (e.g. a team or a scheduler)",
    )
    name: str = Field(default="", max_length=200, description="a label for people: what uses the key")
    scopes: list[Scope] = Field(
        default_factory=_reads_and_writes,
        min_length=1,
        max_length=3,
        description="read: GETs, estimates and capacity; write: create, change and delete; "
        "admin: manage every owner's API keys",
    )


class ApiKeyOut(BaseModel):
    id: str
    owner: str
    name: str
    scopes: list[Scope]
    created_via: ApiKeyOrigin = Field(
        description="operator: made on the database (`trainplan keys create`); api: by an authenticated "
        "admin; unknown: made before this was recorded, possibly without authentication (revoked on upgrade)"
    )
    created_at: datetime
    revoked_at: datetime | None


class ApiKeyCreated(ApiKeyOut):
    secret: str = Field(description="send as 'Authorization: Bearer <secret>'; shown only now, never stored")
