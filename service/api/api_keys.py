"""API keys (admin scope): create one for an owner (its secret is answered once), list, read one, revoke.

Only under authentication: with PLANNER_REQUIRE_AUTH off every caller is the local owner with every
scope, so anyone who reaches the port could make an admin key that stays valid once authentication
is turned on. The first admin key is made by the operator on the database instead
(`trainplan keys create OWNER --scope admin`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response, status

from service.api.deps import CursorQuery, LimitQuery, SessionDep, SettingsDep
from service.api.problems import PROBLEM_RESPONSES
from service.contracts.api_keys import ApiKeyCreate, ApiKeyCreated, ApiKeyOut
from service.contracts.common import Page
from service.errors import Forbidden
from service.persistence.models import OWNER_MAX_LENGTH, ApiKeyRecord
from service.planning import api_keys


def require_authentication(settings: SettingsDep) -> None:
    """403 while the service does not authenticate: no caller can be told apart from another."""
    if not settings.require_auth:
        raise Forbidden(
            "API keys are managed only when the service requires them (PLANNER_REQUIRE_AUTH=true); "
            "without authentication any caller could make an admin key. Make the first admin key on "
            "the database with `trainplan keys create OWNER --scope admin`, then turn authentication on"
        )


router = APIRouter(
    prefix="/v1/api-keys",
    tags=["api-keys"],
    responses={
        **PROBLEM_RESPONSES,
        403: {
            **PROBLEM_RESPONSES[403],
            "description": "The API key lacks the admin scope, or the service does not require keys "
            "(PLANNER_REQUIRE_AUTH=false), when none can be managed",
        },
    },
    dependencies=[Depends(require_authentication)],
)


def to_out(record: ApiKeyRecord) -> ApiKeyOut:
    return ApiKeyOut.model_validate(record, from_attributes=True)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ApiKeyCreated)
def create_api_key(body: ApiKeyCreate, session: SessionDep, response: Response) -> ApiKeyCreated:
    record, secret = api_keys.create_key(
        session, owner=body.owner, name=body.name, scopes=body.scopes, created_via="api"
    )
    response.headers["Location"] = f"/v1/api-keys/{record.id}"
    return ApiKeyCreated(**to_out(record).model_dump(), secret=secret)


@router.get("", response_model=Page[ApiKeyOut])
def list_api_keys(
    session: SessionDep,
    owner: Annotated[str | None, Query(max_length=OWNER_MAX_LENGTH)] = None,
    limit: LimitQuery = 50,
    cursor: CursorQuery = None,
) -> Page[ApiKeyOut]:
    """The keys (revoked ones too, with when), optionally of one owner, a page at a time; never a
    secret."""
    rows, next_cursor = api_keys.list_keys(session, owner, limit=limit, cursor=cursor)
    return Page[ApiKeyOut](items=[to_out(r) for r in rows], next_cursor=next_cursor)


@router.get("/{key_id}", response_model=ApiKeyOut)
def get_api_key(key_id: str, session: SessionDep) -> ApiKeyOut:
    """One key (revoked or not, with when); never its secret. What a created key's Location names
    (it answered 405 to GET: a data-lifecycle review)."""
    return to_out(api_keys.get_key(session, key_id))


@router.delete("/{key_id}", status_code=status.HTTP_204_NO_CONTENT)
def revoke_api_key(key_id: str, session: SessionDep) -> Response:
    """Revoke: the key is refused (401) from the next request on; the row stays, with revoked_at."""
    api_keys.revoke_key(session, key_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
