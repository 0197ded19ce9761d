"""Errors the service reports to its callers, with the HTTP status each one means.

Raised by routers and by `service.planning` alike; nothing here imports the web framework.
`service.api.problems` renders them (and every other error) as RFC 9457 problem details.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """An error the service reports to the client; `status_code` is the HTTP status."""

    status_code = 400
    slug = "bad-request"

    def __init__(self, detail: str, *, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = errors


class Unauthorized(ServiceError):
    """No credentials, or ones the service does not know; answered with WWW-Authenticate: Bearer."""

    status_code = 401
    slug = "unauthorized"


class Forbidden(ServiceError):
    """A known key without the scope the operation needs."""

    status_code = 403
    slug = "forbidden"


class NotFound(ServiceError):
    status_code = 404
    slug = "not-found"


class Conflict(ServiceError):
    status_code = 409
    slug = "conflict"


class PreconditionFailed(ServiceError):
    """An If-Match the stored resource no longer matches (RFC 9110 13.1.1): nothing changed."""

    status_code = 412
    slug = "precondition-failed"


class Unprocessable(ServiceError):
    status_code = 422
    slug = "validation-error"


class PayloadTooLarge(ServiceError):
    status_code = 413
    slug = "payload-too-large"


class ClientClosedRequest(ServiceError):
    """The client went away while the service computed its answer: nothing of it is stored. (The
    status is nginx's 499; nobody reads it but the access log.)"""

    status_code = 499
    slug = "client-closed-request"


class ServiceUnavailable(ServiceError):
    status_code = 503
    slug = "unavailable"
