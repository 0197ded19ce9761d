"""problem+json (RFC 9457): how every error is rendered, and how the routers document it.

Every error, ours (`service.errors`, `EstimatorError`, `UnknownCatalogEntry`) or FastAPI's own
(404, 405, 422), goes through the handlers `install_handlers` registers; `PROBLEM_RESPONSES` is
their OpenAPI documentation, shared by every router.
"""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import sqlalchemy.exc
import sqlalchemy.orm.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from service.catalog.errors import UnknownCatalogEntry
from service.contracts.common import GB_PER_S, FieldError, Problem
from service.contracts.gpus import PeakFlopsIn
from service.errors import ServiceError
from service.estimator.errors import EstimatorError
from service.estimator.scale import MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN
from service.persistence.db import ConnectionWaitTimeout, WriterBusy, driver_message

log = logging.getLogger("service.errors")
PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://trainplan.dev/problems/"

# Every error response refers to one Problem schema in the document's components
# (``document_problem_schema`` puts it there), instead of repeating it in each of them.
_PROBLEM_CONTENT = {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}

PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "Malformed request (e.g. invalid JSON)", "content": _PROBLEM_CONTENT},
    401: {
        "description": "No valid API key (only when the service requires one: PLANNER_REQUIRE_AUTH=true)",
        "content": _PROBLEM_CONTENT,
    },
    403: {"description": "The API key lacks the scope this operation needs", "content": _PROBLEM_CONTENT},
    404: {"description": "Not found", "content": _PROBLEM_CONTENT},
    409: {"description": "Conflict with stored state", "content": _PROBLEM_CONTENT},
    413: {"description": "Request body too large", "content": _PROBLEM_CONTENT},
    415: {
        "description": "A body sent as neither JSON nor curl's default form type holding JSON",
        "content": _PROBLEM_CONTENT,
    },
    422: {
        "description": (
            "Validation error; `errors` names each field and its limit (`limit`: a bound; `allowed`: "
            "the values an enum takes)"
        ),
        "content": _PROBLEM_CONTENT,
    },
    503: {
        "description": "Busy, try again after Retry-After seconds: the database did not answer in time, "
        "every planning (or capacity, or estimate) slot stayed taken, or the request's work did not get "
        "the CPU it needs; nothing was stored",
        "content": _PROBLEM_CONTENT,
        "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}},
    },
}
# A write with If-Match (clusters): its own routes document it.
PRECONDITION_RESPONSES: dict[int | str, dict[str, Any]] = {
    412: {"description": "If-Match names an older version: nothing changed", "content": _PROBLEM_CONTENT}
}


# statuses outside the IANA registry that the service answers (nginx's, for a client that hung up)
_UNREGISTERED_PHRASES = {499: "Client Closed Request"}


def status_phrase(status: int) -> str:
    """The status's reason phrase: HTTPStatus knows no 499, whose lookup raised ValueError, so a plan
    whose client hung up was logged as an unhandled error and counted as a 500 (operations review)."""
    if status in _UNREGISTERED_PHRASES:
        return _UNREGISTERED_PHRASES[status]
    return HTTPStatus(status).phrase


def instance_of(scope: Mapping[str, Any]) -> str:
    r"""The request's path as a URI reference (RFC 9457 3.1.5): the path as sent (ASGI's raw_path, still
    percent-encoded: %2F and bytes that are not UTF-8 stay what they were), any byte a URI cannot hold
    encoded. The decoded path was answered raw ("/v1/plans/é x"; HTTP-semantics review), then encoded
    again (%2F became a slash, Starlette's url.path re-encoded ? # \ twice; change reviews)."""
    raw = scope.get("raw_path")
    sent = raw if isinstance(raw, bytes) and raw else str(scope.get("path", "")).encode()
    return quote(sent, safe="/:@!$&'()*+,;=%")


def problem_response(
    status: int,
    detail: str,
    *,
    slug: str,
    errors: list[dict[str, Any]] | None = None,
    instance: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + slug,
        "title": status_phrase(status),
        "status": status,
        "detail": detail,
    }
    if instance is not None:
        body["instance"] = instance
    if errors:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers)


# Tags of discriminated unions in api/schemas/: they are not fields, so locations omit them.
_UNION_TAGS = {"by_id", "inline", "str", "CustomGPU"}


def _field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """('body', 'gpu', 'memory_bytes') -> 'gpu.memory_bytes'; query and path keep their prefix."""
    parts = [str(p) for p in loc if p not in _UNION_TAGS]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or "body"


def _branch_noise(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A GPU is a catalog name or a custom spec (``str | CustomGPU``): an object that fails the spec's
    checks also fails the name branch ("Input should be a valid string"), which says nothing about
    what was sent; that error is dropped where the object's own are there. A value that is neither
    keeps both branches' errors: either shape would do."""
    objects = {tuple(e["loc"][: e["loc"].index("CustomGPU")]) for e in errors if "CustomGPU" in e["loc"]}
    return [
        e
        for e in errors
        if not (e["loc"][-1:] == ("str",) and isinstance(e.get("input"), dict) and e["loc"][:-1] in objects)
    ]


def _as_sent(err: dict[str, Any], body: Any) -> dict[str, Any]:
    """An error at `X_bytes_per_s` where the request sent its twin `X_gbps` (``common.GB_PER_S``),
    located at the twin, its bounds and input in GB/s: "inter_node_bandwidth_bytes_per_s: >= 1000000"
    answered a request that never named that field."""
    loc = err["loc"]
    path = [p for p in loc if p not in _UNION_TAGS]
    if len(path) < 2 or path[0] != "body" or not str(path[-1]).endswith("_bytes_per_s"):
        return err
    parent = body
    for part in path[1:-1]:
        inside = isinstance(parent, list) and isinstance(part, int) and 0 <= part < len(parent)
        if not (inside or (isinstance(parent, dict) and part in parent)):
            return err
        parent = parent[part]
    twin = str(path[-1]).removesuffix("_bytes_per_s") + "_gbps"
    if not isinstance(parent, dict) or path[-1] in parent or twin not in parent:
        return err
    ctx = dict(err.get("ctx") or {})
    for bound in ("gt", "ge", "lt", "le"):
        if isinstance(ctx.get(bound), int | float):
            ctx[bound] = ctx[bound] / GB_PER_S
    message = err.get("msg", "")
    for bound, words in _BOUND_WORDS.items():
        if bound in ctx:
            message = f"Input should be {words} {ctx[bound]:g} (GB/s)"
    return {**err, "loc": (*loc[:-1], twin), "ctx": ctx, "msg": message, "input": parent[twin]}


_BOUND_WORDS = {
    "gt": "greater than",
    "ge": "greater than or equal to",
    "lt": "less than",
    "le": "less than or equal to",
}


# What a value past a field's upper bound usually means, said with the bound: 72 GPUs per node is a
# GB200 NVL72 rack, an NVLink domain of 18 compute trays of 4 (refused with the bare limit: hardware review)
_PAST_THE_BOUND = {
    "gpus_per_node": "a node is what one host runs (the launch files start gpus_per_node processes on "
    "each); an NVLink domain across nodes, such as a GB200 NVL72 rack (18 trays of 4), is nodes of 4 with "
    "the fabric's bandwidth per GPU as inter_node_bandwidth_bytes_per_s (NVLink 5: 900e9), for one rack: "
    "racks are joined by NICs",
    # the scale bounds the schema documents as the fields' maxima (``scale.py``), with their reason: a
    # looser first check said 10,000,000 where the documented maximum and the next check said 4,194,304
    # (a surfaces review)
    **{
        name: f"past the {bound.limit:,} this service plans for (the largest published: {bound.reference})"
        for name, bound in (
            ("seq_len", MAX_SEQ_LEN),
            ("num_layers", MAX_LAYERS),
            ("num_gpus", MAX_GPUS),
            ("at_gpus", MAX_GPUS),
        )
    },
}


# What an object takes, said where a key it does not take was sent (a GPU datasheet's fp4 and fp6 peaks,
# copied into a custom GPU, read "Extra inputs are not permitted": hardware review)
_KEYS_TAKEN = {
    "peak_flops_per_s": f"a custom GPU's peaks are {', '.join(PeakFlopsIn.model_fields)} (fp32 "
    "required), the precisions a run trains in here; leave out the others (fp4, fp6, int8)",
}


def _validation_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    errors = [_as_sent({**e, "loc": tuple(e.get("loc", ()))}, exc.body) for e in exc.errors()]
    for err in _branch_noise(errors):
        loc = err.get("loc", ())
        refused = (err.get("ctx") or {}).get("error")
        message = err.get("msg", "")
        limit: int | None = None
        least: float | None = None
        details: dict[str, Any] = {}
        if isinstance(refused, FieldError):  # a model validator's: it names the field it refuses
            loc = (*loc, *refused.field.split("."))
            message = str(refused)  # its words, without pydantic's "Value error, "
            limit, least = refused.limit, refused.least
            details = refused.details
        if err.get("type") == "less_than_equal" and loc and loc[-1] in _PAST_THE_BOUND:
            message = f"{message}: {_PAST_THE_BOUND[loc[-1]]}"
        if err.get("type") == "extra_forbidden" and len(loc) > 1 and loc[-2] in _KEYS_TAKEN:
            message = f"{message}: {_KEYS_TAKEN[loc[-2]]}"
        entry: dict[str, Any] = {"field": _field_path(loc), "message": message}
        if err.get("type") == "json_invalid":
            # its loc is ("body", character position): the field is the body, the position said
            at = loc[-1] if loc and isinstance(loc[-1], int) else None
            why = (err.get("ctx") or {}).get("error")  # json's own words ("Expecting ',' delimiter")
            message = f"{message}: {why}" if isinstance(why, str) else message
            entry = {"field": "body", "message": message + ("" if at is None else f" (at character {at})")}
        entry["type"] = err.get("type", "invalid")
        entry.update(details)
        if err.get("type") == "enum":  # the values it takes, as a bound's limit is given (integrator review)
            entry["allowed"] = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
        elif err.get("type") == "literal_error":  # zero_stage's 0, 1, 2 or 3 (scheduler review)
            entry["allowed"] = _literal_values(str((err.get("ctx") or {}).get("expected", "")))
        ctx = err.get("ctx") or {}
        limits = {k: v for k, v in ctx.items() if k in ("gt", "ge", "lt", "le", "max_length", "min_length")}
        if limits:
            entry["limit"] = {
                k: (v if isinstance(v, int | float | str) else str(v)) for k, v in limits.items()
            }
        elif limit is not None:
            entry["limit"] = {"le": limit}
        elif least is not None:
            entry["limit"] = {"ge": least}
        out.append(entry)
    return out


RETRY_AFTER_S = 2  # what a 503 asks a client to wait: a busy database frees within seconds


async def _service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status_code == 503 else None
    if exc.status_code == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="trainplan"'}
    return problem_response(
        exc.status_code,
        exc.detail,
        slug=exc.slug,
        errors=exc.errors,
        instance=instance_of(request.scope),
        headers=headers,
    )


SCHEMA_MISMATCH = (
    "the database's schema is not this service's (run `alembic upgrade head`; or a later release's "
    "migration took away what this code reads)"
)
# PostgreSQL's undefined_table and undefined_column; SQLite says it in words
_UNDEFINED_SQLSTATES = frozenset({"42P01", "42703"})
_SQLITE_MISSING = ("no such table", "no such column", "has no column named")


def _missing_schema(exc: BaseException) -> bool:
    """Whether a statement failed on a table or column the database lacks: a database not (or not yet)
    migrated to this code, which a migration fixes (not a bug of the request: a 503, not a 500)."""
    if not isinstance(exc, sqlalchemy.exc.ProgrammingError | sqlalchemy.exc.OperationalError):
        return False
    if getattr(exc.orig, "sqlstate", None) in _UNDEFINED_SQLSTATES:
        return True
    message = str(exc.orig).lower() if exc.orig is not None else ""
    return any(words in message for words in _SQLITE_MISSING)


def database_unavailable_detail(exc: BaseException) -> str | None:
    """Why the database cannot serve the request now, when that is the error (busy, locked,
    unreachable, timed out, read-only): the request may succeed later, so it is a 503, not a 500.
    None for any other error (a bug stays a 500)."""
    if isinstance(exc, WriterBusy):
        return f"the database is busy ({exc})"  # one of two fixed sentences: a metrics label
    if isinstance(exc, ConnectionWaitTimeout):
        return "no database connection came free within the pool timeout"
    if isinstance(exc, sqlalchemy.exc.TimeoutError):
        return "the database connection pool is exhausted"
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated:
        return "the database connection was lost"
    if _missing_schema(exc):
        return SCHEMA_MISMATCH
    if isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        message = str(exc.orig).lower() if exc.orig is not None else ""
        for words, why in (
            ("locked", "the database is busy (locked by another writer)"),
            ("busy", "the database is busy"),
            ("readonly", "the database is read-only"),
            ("read-only", "the database is read-only"),
            ("statement timeout", "the database did not answer within the statement timeout"),
            ("timeout", "the database did not answer in time"),
            ("timed out", "the database did not answer in time"),
        ):
            if words in message:
                return why
        return "the database cannot be reached"
    return None


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, sqlalchemy.exc.IntegrityError):
        # a check passed, then a concurrent writer changed the rows it read (took a name, deleted a
        # referenced cluster): the rolled-back request may be retried against the new state
        return _concurrent_change(
            request, "a concurrent change conflicts with it (a name taken, a row deleted)"
        )
    why = database_unavailable_detail(exc)
    if why is None:
        raise exc
    log.warning(
        "503 on %s %s: %s (%s: %s)",
        request.method,
        request.url.path,
        why,
        type(exc).__name__,
        driver_message(exc),
    )
    request.app.state.metrics.observe_database_unavailable(why)
    return problem_response(
        503,
        f"{why}; nothing was stored; retry after {RETRY_AFTER_S} s",
        slug="unavailable",
        instance=instance_of(request.scope),
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def _estimator_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EstimatorError)
    error: dict[str, Any] = {"field": exc.field or "body", "rule": exc.rule, "message": exc.message}
    if exc.limit is not None:
        error["limit"] = {"le": exc.limit}  # as pydantic's bounds say theirs
    if exc.allowed is not None:
        error["allowed"] = list(exc.allowed)  # as a literal's values are said
    errors = [error]
    return problem_response(
        422, exc.message, slug=exc.rule, errors=errors, instance=instance_of(request.scope)
    )


async def _unknown_entry(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, UnknownCatalogEntry)
    # Reached from path lookups (GET /v1/gpus/{name}); names inside a body are turned into 422s
    # naming the field where the body is resolved (api/schemas/).
    return problem_response(404, str(exc), slug="not-found", instance=instance_of(request.scope))


async def _request_validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = _validation_errors(exc)
    if any(e["type"] == "json_invalid" for e in errors):
        return problem_response(
            400,
            "Malformed JSON body",
            slug="malformed-json",
            errors=errors,
            instance=instance_of(request.scope),
        )
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
    return problem_response(
        422, detail, slug="validation-error", errors=errors, instance=instance_of(request.scope)
    )


# FastAPI's answer to a body json.loads raised on with anything but a JSONDecodeError (fastapi/routing.py)
_UNPARSED_BODY = "There was an error parsing the body"


def _unparsed_body_reason(cause: BaseException | None) -> str:
    """Why json.loads could not read the body, in the client's terms."""
    if isinstance(cause, UnicodeDecodeError):
        return f"it is not UTF-8 (byte 0x{cause.object[cause.start]:02x} at byte {cause.start})"
    if isinstance(cause, RecursionError):
        return "its arrays or objects nest too deep"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return "an integer in it has more digits than Python reads (4,300)"
    return "it is not JSON"


async def _http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    if status == 400 and exc.detail == _UNPARSED_BODY:
        # a review's bodies (invalid UTF-8 in a string, a 5,000-digit integer, 5,000 levels of nesting)
        # got a bare "http-error" without the field, where any other malformed body is malformed-json
        reason = _unparsed_body_reason(exc.__cause__)
        errors = [{"field": "body", "message": f"the body cannot be read: {reason}", "type": "json_invalid"}]
        return problem_response(
            400,
            f"Malformed JSON body: {reason}",
            slug="malformed-json",
            errors=errors,
            instance=instance_of(request.scope),
        )
    detail = exc.detail if isinstance(exc.detail, str) else status_phrase(status)
    if status == 404 and detail == "Not Found":
        detail = f"No route matches {request.method} {request.url.path}"
    headers = dict(exc.headers or {})
    if status == 405:
        allowed = allowed_methods(request)
        headers["Allow"] = ", ".join(allowed)
        detail = (
            f"Method {request.method} is not allowed on {request.url.path}; allowed: {', '.join(allowed)}"
        )
    slug = {404: "not-found", 405: "method-not-allowed"}.get(status, "http-error")
    return problem_response(
        status, detail, slug=slug, instance=instance_of(request.scope), headers=headers or None
    )


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def _literal_values(expected: str) -> list[Any]:
    """A literal error's expected values as JSON values: pydantic writes them as reprs joined by ", "
    and " or " (``0, 1, 2 or 3``; ``'a' or 'b'``)."""
    values: list[Any] = []
    for word in re.split(r", | or ", expected):
        try:
            values.append(ast.literal_eval(word))
        except (ValueError, SyntaxError):
            values.append(word)
    return values


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves on this path (Starlette's 405 names only the first route's)."""
    routes = request.app.router.routes
    served = [
        method
        for method in METHODS
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)
    ]
    # HeadMiddleware answers HEAD wherever GET is served, outside the routes (FastAPI's routes, unlike
    # Starlette's, do not add it): a 405's Allow named GET alone on every /v1 route (RFC 9110 15.5.6)
    if "GET" in served and "HEAD" not in served:
        served.insert(served.index("GET") + 1, "HEAD")
    return served


def _concurrent_change(request: Request, why: str) -> JSONResponse:
    return problem_response(
        409,
        f"{why}; nothing was stored: read the resource again and retry",
        slug="conflict",
        instance=instance_of(request.scope),
    )


async def _stale_row(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, sqlalchemy.orm.exc.StaleDataError)
    why = "the row changed or was deleted while this request ran"
    if "if-match" in request.headers:
        # its precondition failed, as the earlier check would have said had the other write landed
        # first (RFC 9110 13.1.1: 412): racing writers with one If-Match got 409 or 412 by timing
        return problem_response(
            412,
            f"If-Match {request.headers['if-match']}: {why}; nothing was stored: read it again",
            slug="precondition-failed",
            instance=instance_of(request.scope),
        )
    return _concurrent_change(request, why)


def _integers_as_int64(node: Any) -> None:
    """Mark every integer of the document ``format: int64``: sizes in bytes, parameter and token counts
    pass 2^31, and Go's and Java's generated clients read an integer without a format as 32 bits
    (openapi-generator: int32 / Integer; Jackson refused an H100's 85,899,345,920 memory bytes: a
    client-integration review)."""
    if isinstance(node, dict):
        if node.get("type") == "integer" and "format" not in node:
            node["format"] = "int64"
        for value in node.values():
            _integers_as_int64(value)
    elif isinstance(node, list):
        for value in node:
            _integers_as_int64(value)


# The API key scheme (PLANNER_REQUIRE_AUTH=true: deps.get_principal reads it), named in the document
# so that generated clients and /docs' Authorize send it: the document declared none, though every /v1
# operation answers 401 without one (a multi-tenant review).
BEARER_SCHEME = {
    "type": "http",
    "scheme": "bearer",
    "description": "an API key (tp_...) as 'Authorization: Bearer <key>', where the service runs with "
    "PLANNER_REQUIRE_AUTH=true; without it no key is read",
}


def _document_bearer_security(document: dict[str, Any]) -> None:
    """Every /v1 operation (and the /plans aliases) takes the API key, or none where the deployment
    requires none: OpenAPI's optional security, the key or the empty requirement."""
    document.setdefault("components", {}).setdefault("securitySchemes", {})["apiKey"] = BEARER_SCHEME
    for path, operations in document.get("paths", {}).items():
        if path.startswith(("/v1/", "/plans")):
            for operation in operations.values():
                operation["security"] = [{"apiKey": []}, {}]


def document_problem_schema(app: FastAPI) -> None:
    """Add the Problem schema to the OpenAPI document's components, where PROBLEM_RESPONSES refer,
    mark its integers 64-bit (``_integers_as_int64``), and name the API key scheme the /v1
    operations take (``_document_bearer_security``)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            problem = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(problem.pop("$defs", {}))  # ProblemError, which its errors' items refer to
            schemas["Problem"] = problem
            _integers_as_int64(document)
            _document_bearer_security(document)
        return app.openapi_schema or generate()

    app.openapi = openapi  # type: ignore[method-assign]


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(sqlalchemy.exc.SQLAlchemyError, _database_error)
    app.add_exception_handler(sqlalchemy.orm.exc.StaleDataError, _stale_row)
    app.add_exception_handler(EstimatorError, _estimator_error)
    app.add_exception_handler(UnknownCatalogEntry, _unknown_entry)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(StarletteHTTPException, _http_exception)
