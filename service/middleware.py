"""ASGI middleware: request ids, arrival times, HEAD, body-size limit, NUL refusal and request metrics."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from urllib.parse import unquote_to_bytes

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.problems import instance_of, problem_response
from service.logs import request_id_var
from service.metrics import Metrics

log = logging.getLogger("service.errors")
access_log = logging.getLogger("service.access")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class RequestIdMiddleware:
    """Every response carries X-Request-ID: the client's (when well-formed) or a new one.

    Outermost of ours, it also turns an unhandled exception into a problem+json 500 that carries
    the id (Starlette's own last-resort handler sits outside user middleware and would not)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = sent if _REQUEST_ID.match(sent) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        token = request_id_var.set(request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                headers.append((b"x-request-id", request_id.encode()))
                message["headers"] = headers
            await send(message)

        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send_with_id(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unhandled error on %s %s (request %s)", scope["method"], scope["path"], request_id)
            if started:
                raise
            response = problem_response(
                500,
                f"internal server error; request id {request_id} identifies it in the logs",
                slug="internal",
                instance=instance_of(scope),
            )
            await response(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)


class ArrivalTimeMiddleware:
    """Stamps each request's state with its arrival (`arrived_at_s`, time.monotonic()): its headers',
    then its body's last byte's; its wait for the database counts from then, including the time it
    queued for a worker thread. A client's slow upload is its own time: counted from the headers, an
    11 s upload of 40 bytes was a 503 blaming the connection pool (operations review)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["arrived_at_s"] = time.monotonic()

        async def stamped() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                state["arrived_at_s"] = time.monotonic()  # the whole request is here
            return message

        await self.app(scope, stamped, send)


class HeadMiddleware:
    """HEAD as GET without the body (RFC 9110 9.3.2: the same header fields, Content-Length included):
    FastAPI routes a GET alone, so every HEAD was a 405, though "all general-purpose servers MUST
    support the methods GET and HEAD" (9.1). The server (uvicorn) keeps the request's own method, HEAD,
    and sends no body for it; this drops what the GET wrote."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def without_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        inner = {**scope, "method": "GET"}
        try:
            await self.app(inner, receive, without_body)
        finally:
            # the route matched, for the metrics and access log around this, which count it as HEAD
            if "route" in inner:
                scope["route"] = inner["route"]


class NulRefusalMiddleware:
    """A NUL (U+0000, %00) in the path, the query or a header is a 422 before any route runs: no id,
    filter or key holds one, and PostgreSQL text cannot store one (the body's strings are refused by
    the schemas)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        where = None
        if b"\x00" in scope.get("raw_path", b"") or "\x00" in scope["path"]:
            where = "path"
        elif b"\x00" in unquote_to_bytes(scope.get("query_string", b"")):
            where = "query"
        else:
            for name, value in scope["headers"]:
                if b"\x00" in value:
                    where = f"header.{name.decode('latin-1')}"
                    break
        if where is None:
            await self.app(scope, receive, send)
            return
        # the field in the dotted form of every other error (header.Idempotency-Key, query.limit)
        said = where.replace(".", " ", 1)
        response = problem_response(
            422,
            f"the request's {said} contains the NUL character (%00), which no field accepts",
            slug="validation-error",
            errors=[{"field": where, "message": "must not contain NUL (U+0000)"}],
            instance=instance_of(scope),
        )
        await response(scope, receive, send)


_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_FORM = "application/x-www-form-urlencoded"


class JsonBodyMiddleware:
    """An API request's body is JSON, whatever curl said it was. ``curl -d '{...}'`` without ``-H
    'content-type: application/json'`` labels it application/x-www-form-urlencoded, and it was a 422
    "Input should be a valid dictionary" for the object it sent: such a body that parses as JSON is
    read as JSON, when no browser sent it (a page's fetch() may send JSON labelled as a form without a
    preflight; browsers send Origin or Sec-Fetch-Site, curl neither). Any other body under that type,
    under no content type or another one (text/plain: what a cross-site page may send without asking)
    is a 415 that says how to send it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS or not _is_api(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        refused = _refused_body(scope, headers, declared)
        if refused is not None:
            await refused(scope, receive, send)
            return
        if declared == "application/json" or declared.endswith("+json"):
            await self.app(scope, receive, send)
            return
        body, more, messages = b"", True, []
        while more:  # the body, within the limit BodyLimitMiddleware (outside this one) enforces
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            more = message.get("more_body", False) and message["type"] == "http.request"
        replay = iter(messages)

        async def replayed() -> Message:
            return next(replay, None) or await receive()

        if not body.strip():
            await self.app(scope, replayed, send)
            return
        # a browser says where a request comes from (Origin, Sec-Fetch-Site); curl says neither. A
        # page's fetch() may label a JSON body as a form without a preflight, so only a request no
        # browser sent is read so (a cross-site page then changes nothing, as before)
        from_browser = b"origin" in headers or b"sec-fetch-site" in headers
        if declared == _FORM and not from_browser and _is_json(body):
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"] + [
                (b"content-type", b"application/json")
            ]
            await self.app(scope, replayed, send)
            return
        said = f"content-type {declared}" if declared else "no content-type"
        response = _unsupported_media(
            scope,
            f"the body was sent with {said}; send it as JSON with content-type: application/json "
            "(curl: --json '{...}', or -H 'content-type: application/json')",
            "content-type",
            "must be application/json",
        )
        await response(scope, replayed, send)


# A PATCH body is the fields to change (RFC 7396 merge patch, as application/json or
# application/merge-patch+json); a JSON Patch's list of operations (RFC 6902) is another format
_JSON_PATCH = "application/json-patch+json"
_PATCH_FORMATS = "application/json, application/merge-patch+json"


def _refused_body(scope: Scope, headers: dict[bytes, bytes], declared: str) -> Response | None:
    """A 415 for a body the service cannot read as sent (RFC 9110 15.5.16): compressed (a gzip body was a
    400 "not UTF-8", and a plain one labelled gzip was read as if decoded; no coding is decoded here, so
    Accept-Encoding says identity), or a PATCH in JSON Patch's format, whose operations list was a 422
    "Input should be a valid dictionary" (RFC 5789 2.2: 415 with Accept-Patch; HTTP-semantics review)."""
    coding = headers.get(b"content-encoding", b"").decode("latin-1").strip().lower()
    if coding and coding != "identity":
        return _unsupported_media(
            scope,
            f"the body was sent with content-encoding {coding}; this service reads bodies uncompressed "
            "(send it without a content-encoding)",
            "content-encoding",
            "must be identity (or left out)",
            {"Accept-Encoding": "identity"},
        )
    if scope["method"] == "PATCH" and declared == _JSON_PATCH:
        return _unsupported_media(
            scope,
            f"a PATCH here sends the fields to change as a JSON object ({_PATCH_FORMATS}: RFC 7396 merge "
            f"patch), not {_JSON_PATCH}'s list of operations",
            "content-type",
            f"must be one of {_PATCH_FORMATS}",
            {"Accept-Patch": _PATCH_FORMATS},
        )
    return None


def _unsupported_media(
    scope: Scope, detail: str, header: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    """A 415 problem naming the request header that says how the body was sent."""
    return problem_response(
        415,
        detail,
        slug="unsupported-media-type",
        errors=[{"field": f"header.{header}", "message": message}],
        instance=instance_of(scope),
        headers=headers,
    )


def _is_api(path: str) -> bool:
    """The JSON API's paths: /v1/..., and the design's unversioned /plans aliases."""
    return path.startswith("/v1/") or path == "/plans" or path.startswith("/plans/")


def _is_json(body: bytes) -> bool:
    try:
        json.loads(body)
    except ValueError:
        return False
    except RecursionError:
        # nested past the parser's depth: JSON still, answered as a body sent as JSON is (a 400 naming
        # its depth), where this raised out of the middleware as a 500 (operations review)
        return True
    return True


class _BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """Refuse bodies over `max_bytes` with 413, by Content-Length or while streaming."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        if length is None:
            # chunked: read it here, up to the limit, and hand the app what was read. Raised inside
            # the app's body reader, the limit became FastAPI's 400 "error parsing the body".
            buffered: list[Message] = []
            total = 0
            while True:
                message = await receive()
                buffered.append(message)
                if message["type"] != "http.request":
                    break
                total += len(message.get("body", b""))
                if total > self.max_bytes:
                    await self._refuse(scope, receive, send)
                    return
                if not message.get("more_body", False):
                    break

            upstream = receive

            async def replay() -> Message:
                return buffered.pop(0) if buffered else await upstream()

            receive = replay
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if started:
                raise
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem_response(
            413,
            f"request body exceeds the limit of {self.max_bytes} bytes",
            slug="payload-too-large",
            errors=[{"field": "body", "message": "too large", "limit": {"max_bytes": self.max_bytes}}],
            instance=instance_of(scope),
        )
        await response(scope, receive, send)


class MetricsMiddleware:
    """Counts and times every request by route template, and writes its access log line: outside every
    middleware that answers by itself (the body limit's 413, the NUL refusal's 422, CORS preflights,
    HEAD), so each of those has its line and its count too (operations review)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            elapsed_s = time.perf_counter() - start
            route = _route_template(scope)
            # a method no route has is "other": any token a client sends made a label set of its own
            # (15 series each, unauthenticated; operations review)
            method = scope["method"] if scope["method"] in _METHODS else "other"
            self.metrics.observe(method, route, status, elapsed_s)
            access_log.info(
                "%s %s %d",
                scope["method"],
                scope["path"],
                status,
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "route": route,
                    "status": status,
                    "duration_ms": round(elapsed_s * 1000, 2),
                },
            )


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _route_template(scope: Scope) -> str:
    """The matched route's path template (bounded label cardinality), or 'unmatched'."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


_CORS_FIELDS = {
    "origin": "header.origin",
    "method": "header.access-control-request-method",
    "headers": "header.access-control-request-headers",
    "private-network": "header.access-control-request-private-network",
}


class ProblemCORSMiddleware(CORSMiddleware):
    """Starlette's CORS, its refused preflight answered as every other error is: RFC 9457 problem+json
    naming the origin, method or header refused (it was a text/plain "Disallowed CORS origin";
    operations review)."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        refused = bytes(response.body).decode().removeprefix("Disallowed CORS ")
        errors = [
            {
                "field": _CORS_FIELDS.get(what.strip(), what.strip()),
                "message": "not allowed (PLANNER_CORS_ORIGINS)",
            }
            for what in refused.split(",")
        ]
        kept = {
            k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")
        }
        detail = f"CORS preflight refused: {refused}"
        return problem_response(400, detail, slug="cors-refused", errors=errors, headers=kept)
