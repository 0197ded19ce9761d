"""Dependencies as Annotated aliases: settings, who the request acts as (its API key), the
request's session (the one place that commits, opened for that owner), and repositories."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Annotated, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from fastapi import Depends, Header, Query, Request, Response
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session, sessionmaker

from service.errors import Conflict, Forbidden, ServiceUnavailable, Unauthorized, Unprocessable
from service.persistence.db import ConnectionGate, sqlite_file_identity
from service.persistence.repository import ClusterRepository, PlanRepository
from service.planning import api_keys
from service.planning.api_keys import Principal
from service.planning.idempotency import is_stored
from service.planning.plans import PLAN_SCOPE
from service.recommender.budget import Deadline
from service.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


# the metric's reason for check_database_file's 503s (a fixed sentence: a metric label)
DATABASE_FILE_REPLACED = "the SQLite database file was removed or replaced"


def database_file_replaced(request: Request) -> str | None:
    """Why the SQLite file the service opened can no longer be written (deleted or replaced: its
    writes would be lost), or None."""
    opened = request.app.state.database_identity
    if opened is not None and sqlite_file_identity(request.app.state.engine) != opened:
        # the file's path to the log, not to whoever can reach the API or the probe, a caller without
        # a valid key among them (a multi-tenant review), as the driver's words (health.readyz)
        log.warning("the SQLite database file %s was removed or replaced while the service ran", opened[0])
        return (
            "the SQLite database file was removed or replaced while the service ran (its path is in the "
            "log); restore it and restart the service"
        )
    return None


def check_database_file(request: Request) -> None:
    """503 when the SQLite file the service opened was deleted or replaced, counted in
    trainplan_database_unavailable_total as the README says of every database 503 (an alert on it
    stayed silent while every write was refused; operator review)."""
    why = database_file_replaced(request)
    if why is not None:
        request.app.state.metrics.observe_database_unavailable(DATABASE_FILE_REPLACED)
        raise ServiceUnavailable(why)


IDEMPOTENCY_KEY_CHARS = 255


def database_slot(request: Request) -> contextlib.AbstractContextManager[None]:
    """A turn at the database, waited for until PLANNER_DATABASE_POOL_TIMEOUT_S after the request
    arrived; with at most one connection attempt after it (PLANNER_DATABASE_CONNECT_TIMEOUT_S), the
    request's wait for the database is bounded by their sum."""
    settings: Settings = request.app.state.settings
    gate: ConnectionGate = request.app.state.connection_gate
    return gate.slot(request.state.arrived_at_s + settings.database_pool_timeout_s)


# POSTs that compute and store nothing: a read-only key may call them.
_COMPUTE_ONLY = frozenset({"/v1/estimates", "/v1/capacity", "/v1/models/resolve"})


def required_scope(method: str, route: str) -> str:
    """The scope an operation needs: admin for API keys, read for GETs and pure computations,
    write for everything that stores or deletes."""
    if route.startswith("/v1/api-keys"):
        return "admin"
    if method in ("GET", "HEAD") or route in _COMPUTE_ONLY:
        return "read"
    return "write"


def get_principal(request: Request) -> Principal:
    """Who the request acts as. With PLANNER_REQUIRE_AUTH off, the local owner with every scope;
    on, the owner of the `Authorization: Bearer` key (401 without a valid one, 403 without the
    scope the route needs). Each request looks its key up: a revocation holds on every replica."""
    settings: Settings = request.app.state.settings
    if not settings.require_auth:
        return api_keys.LOCAL
    given = request.headers.getlist("authorization")
    if len(given) > 1:
        # not a list-valued field (RFC 9110 §5.3): which key acts was the first line's, silently, where
        # a gateway added its own beside the client's (a multi-tenant review)
        raise Unauthorized(
            f"the request has {len(given)} Authorization headers; send one 'Authorization: Bearer <key>'",
            errors=[{"field": "header.Authorization", "message": "more than one Authorization header"}],
        )
    scheme, _, secret = (given[0] if given else "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized(
            "this service requires an API key: send it as 'Authorization: Bearer <key>'",
            errors=[{"field": "header.Authorization", "message": "missing or not a Bearer token"}],
        )
    check_database_file(request)
    factory: sessionmaker[Session] = request.app.state.sessionmaker
    with database_slot(request), factory() as session:
        principal = api_keys.authenticate(session, secret.strip())
    if principal is None:
        raise Unauthorized(
            "the API key is not valid: unknown or revoked",
            errors=[{"field": "header.Authorization", "message": "unknown or revoked key"}],
        )
    route = getattr(request.scope.get("route"), "path", request.url.path)
    needed = required_scope(request.method, route)
    if needed not in principal.scopes:
        raise Forbidden(
            f"{request.method} {route} needs the {needed!r} scope; this key has {sorted(principal.scopes)}",
            errors=[{"field": "header.Authorization", "message": f"scope {needed!r} missing"}],
        )
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def get_session(request: Request, principal: PrincipalDep) -> Iterator[Session]:
    """Commit when the handler returns, roll back when it raises: nothing is half-written. The
    session works for the principal's owner (the repositories read `session.info["owner"]`)."""
    check_database_file(request)
    factory: sessionmaker[Session] = request.app.state.sessionmaker
    with database_slot(request), factory(info={"owner": principal.owner}) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def owner_share(count: int) -> int:
    """The most of ``count`` slots one owner holds at once where keys are required: half, rounded up,
    so that one owner's burst leaves the others a slot (four capacity requests of one team made
    another's 0.7 s request a 503: a multi-tenant review); with one slot, that one."""
    return max(1, -(-count // 2))


def _owner_slots(request: Request, what: str, owner: str, count: int) -> anyio.Semaphore | None:
    """The owner's share of the ``what`` slots (``owner_share``) where PLANNER_REQUIRE_AUTH makes
    owners; None where every request is the local owner (its slots are all of them)."""
    settings: Settings = request.app.state.settings
    if not settings.require_auth:
        return None
    shares: dict[tuple[str, str], anyio.Semaphore] = request.app.state.owner_slots
    share = shares.get((what, owner))
    if share is None:
        share = shares[(what, owner)] = anyio.Semaphore(owner_share(count))
    return share


@contextlib.asynccontextmanager
async def _slot(
    request: Request, slots: anyio.Semaphore, what: str, count: int, seconds: float, owner: str
) -> AsyncIterator[Deadline]:
    """One of ``slots`` (and of the owner's share of them, where keys are required): waits up to
    ``planning_queue_wait_s`` for one, else 503 with Retry-After. It waits in the event loop, holding
    no worker thread: a burst of waiting plans once held the 40 threads the reads run in (a GET
    /v1/gpus took 6 s behind 60 plans). Yields the request's deadline: ``seconds`` of work, and
    whether the client has gone."""
    settings: Settings = request.app.state.settings
    share = _owner_slots(request, what, owner, count)
    held: list[anyio.Semaphore] = []
    gates = [gate for gate in (share, slots) if gate is not None]  # the owner's share first
    try:
        if settings.planning_queue_wait_s > 0:
            with anyio.fail_after(settings.planning_queue_wait_s):  # one wait for both
                for gate in gates:
                    await gate.acquire()
                    held.append(gate)
        else:  # 0: never queue. fail_after(0) cancels at acquire's checkpoint even with a slot free,
            for gate in gates:  # so every request was a 503 on an idle server (operations review)
                gate.acquire_nowait()
                held.append(gate)
    except BaseException as exc:  # a cancelled wait (the client gone) too: none of the held stays taken
        for gate in held:
            gate.release()
        if not isinstance(exc, TimeoutError | anyio.WouldBlock):
            raise
        waited = f"waited {settings.planning_queue_wait_s:g} s for one"
        if share is not None and not held:
            raise ServiceUnavailable(
                f"this key's owner holds its {owner_share(count)} of the {count} {what} slots ({waited}): "
                "where keys are required an owner holds at most half of them"
            ) from None
        raise ServiceUnavailable(f"all {count} {what} slots are busy ({waited})") from None
    try:
        yield Deadline(seconds=seconds, cancelled=client_gone(request))
    finally:
        for gate in held:
            gate.release()


async def planning_slot(request: Request, principal: PrincipalDep) -> AsyncIterator[Deadline]:
    """A slot for a plan's search: CPU-heavy, request_budget_s of work. A retry with an
    Idempotency-Key takes none: one whose plan is stored only reads it back (it waited behind
    searches for a slot, a 503 when they were busy), and one whose twin is still searching waits for
    that answer, up to planning_queue_wait_s (then 409), and replays it (four at once with one key
    each searched, and only the first was kept: concurrency review)."""
    settings: Settings = request.app.state.settings
    key = request.headers.get("idempotency-key")
    deadline = Deadline(seconds=settings.request_budget_s, cancelled=client_gone(request))
    if key is None or not 1 <= len(key) <= IDEMPOTENCY_KEY_CHARS:  # a bad key is refused by the route
        async with _planning_slot(request, principal.owner) as deadline:
            yield deadline
        return
    in_flight: dict[tuple[str, str], anyio.Event] = request.app.state.plans_in_flight
    twin = (principal.owner, key)
    while True:
        running = in_flight.get(twin)
        if running is not None:
            with anyio.move_on_after(settings.planning_queue_wait_s):
                await running.wait()
            if not running.is_set():
                raise Conflict(
                    f"a plan with Idempotency-Key {key!r} is still being computed; retry when it has "
                    "answered (the retry replays it)",
                    errors=[
                        {"field": "header.Idempotency-Key", "message": "in progress", "type": "idempotency"}
                    ],
                )
            continue
        if await anyio.to_thread.run_sync(_plan_stored, request, principal, key):
            yield deadline  # the route replays it: no search
            return
        if twin not in in_flight:  # none began while the database was read: this one searches
            break
    done = in_flight[twin] = anyio.Event()
    try:
        async with _planning_slot(request, principal.owner) as deadline:
            yield deadline
    finally:
        del in_flight[twin]
        done.set()


def _planning_slot(request: Request, owner: str) -> contextlib.AbstractAsyncContextManager[Deadline]:
    settings: Settings = request.app.state.settings
    slots, count = request.app.state.planning_slots, settings.max_concurrent_planning
    return _slot(request, slots, "planning", count, settings.request_budget_s, owner)


def _plan_stored(request: Request, principal: Principal, key: str) -> bool:
    check_database_file(request)
    factory: sessionmaker[Session] = request.app.state.sessionmaker
    with database_slot(request), factory(info={"owner": principal.owner}) as session:
        return is_stored(session, key, PLAN_SCOPE)


async def capacity_slot(request: Request, principal: PrincipalDep) -> AsyncIterator[Deadline]:
    """A slot for a capacity request: capacity_budget_s of work, from a pool of its own
    (``Settings.max_concurrent_capacity``: fewer, so that those admitted finish)."""
    settings: Settings = request.app.state.settings
    slots, count = request.app.state.capacity_slots, settings.max_concurrent_capacity
    async with _slot(
        request, slots, "capacity", count, settings.capacity_budget_s, principal.owner
    ) as deadline:
        yield deadline


async def estimate_slot(request: Request, principal: PrincipalDep) -> AsyncIterator[Deadline]:
    """A slot for an estimate (milliseconds of work): its own, so that estimates do not queue behind
    a burst of searches."""
    settings: Settings = request.app.state.settings
    slots, count = request.app.state.estimate_slots, settings.max_concurrent_planning
    async with _slot(
        request, slots, "estimate", count, settings.request_budget_s, principal.owner
    ) as deadline:
        yield deadline


def client_gone(request: Request) -> Callable[[], bool]:
    """Whether the client closed the connection, asked from the worker thread the handler runs in
    (its event loop answers; outside one, as in a direct call, nobody can have gone)."""

    def gone() -> bool:
        try:
            return bool(anyio.from_thread.run(request.is_disconnected))
        except RuntimeError:
            return False

    return gone


def known_query(request: Request) -> None:
    """Refuse a query parameter the route does not take, naming it and those it takes: GET
    /v1/gpus?vendor=amd and /v1/models?familly=llama were answered with every entry, as if filtered
    (an input the service does not use is refused, not ignored)."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    taken = _query_names(route)
    unknown = [name for name in dict.fromkeys(request.query_params) if name not in taken]
    if not unknown:
        _refuse_repeated(request)
        return
    takes = ", ".join(sorted(taken)) or "no query parameters"
    what = f"{request.method} {route.path} takes {takes}"
    errors = [
        {
            "field": f"query.{name}",
            "message": f"not a query parameter of this route: {what}",
            "type": "extra_forbidden",
        }
        for name in unknown
    ]
    raise Unprocessable(f"unknown query parameter {', '.join(map(repr, unknown))}: {what}", errors=errors)


def _refuse_repeated(request: Request) -> None:
    """Refuse a query parameter given twice: every one the routes take holds one value, and the last
    was read alone (GET /v1/gpus?vendor=amd&vendor=nvidia listed NVIDIA's parts only, as if filtered
    by both; HTTP-semantics review)."""
    params = request.query_params
    repeated = [name for name in dict.fromkeys(params) if len(params.getlist(name)) > 1]
    if not repeated:
        return
    errors = [
        {
            "field": f"query.{name}",
            "message": f"given {len(values)} times ({', '.join(map(repr, values))}); it takes one value",
            "type": "repeated",
        }
        for name, values in ((name, params.getlist(name)) for name in repeated)
    ]
    raise Unprocessable(
        f"query parameter {', '.join(map(repr, repeated))} given more than once: each takes one value",
        errors=errors,
    )


def _query_names(route: APIRoute) -> frozenset[str]:
    """The query parameters a route declares, its own and its dependencies' (by their aliases; a walk
    of a few nodes per request: routes are not hashable, so not cached)."""
    names: set[str] = set()
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        names.update(param.alias for param in dependant.query_params)
        pending.extend(dependant.dependencies)
    return frozenset(names)


def catalog_page(
    limit: Annotated[int, Query(ge=1, le=500, description="at most this many items")] = 50,
    cursor: Annotated[
        str | None, Query(max_length=12, pattern=r"^\d+$", description="next_cursor of the page before")
    ] = None,
) -> slice:
    """A catalog listing's page, as every list of the API takes one (``limit``, default 50 as
    api.md states for every list, at most 500; ``cursor``): the whole catalog is one page of 500."""
    start = int(cursor) if cursor is not None else 0
    return slice(start, start + limit)


CatalogPage = Annotated[slice, Depends(catalog_page)]


def paged(items: list[T], page: slice) -> tuple[list[T], str | None]:
    """``items[page]`` and the cursor of the page after it (None: the last)."""
    stop = page.stop if page.stop is not None else len(items)
    return items[page], (str(stop) if stop < len(items) else None)


# every /v1 list's page: at most limit items after cursor (a previous page's next_cursor)
LimitQuery = Annotated[int, Query(ge=1, le=500, description="page size")]
CursorQuery = Annotated[str | None, Query(max_length=200, description="next_cursor of the previous page")]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
Authenticated = Depends(get_principal)  # for routers: every route authenticates, sessions or not
KnownQuery = Depends(known_query)  # for routers: every query parameter is one the route takes
EstimateSlot = Depends(estimate_slot)
# The route's slot and its deadline: ``deadline: PlanningDeadline`` in the handler's parameters.
PlanningDeadline = Annotated[Deadline, Depends(planning_slot)]
CapacityDeadline = Annotated[Deadline, Depends(capacity_slot)]
# scope="function": commit before the response is sent, so a failed commit is never a 2xx.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def get_cluster_repository(session: SessionDep) -> ClusterRepository:
    return ClusterRepository(session)


ClusterRepoDep = Annotated[ClusterRepository, Depends(get_cluster_repository)]


def get_plan_repository(session: SessionDep) -> PlanRepository:
    return PlanRepository(session)


PlanRepoDep = Annotated[PlanRepository, Depends(get_plan_repository)]


IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key", min_length=1, max_length=IDEMPOTENCY_KEY_CHARS, description="retry-safe key"
    ),
]


def created(response: Response, location: str, replayed: bool) -> None:
    """201 with Location (the route's status), and Idempotent-Replayed for a retry: a retry gets the
    answer the first request got, status included (draft-ietf-httpapi-idempotency-key-header: the
    resource's 201 and Location; api.md: POST /v1/plans -> 201 + Location), so a client that checks
    for 201 is not told a retried create failed (a review's case: replays answered 200)."""
    response.headers["Location"] = location
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
