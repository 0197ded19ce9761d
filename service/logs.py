"""Structured logs: one JSON object per line on stderr, each carrying the request id it was written
under (set by RequestIdMiddleware, carried into worker threads by contextvars), plus one access line
per request from our own middleware (uvicorn's access log cannot carry the id)."""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

# Attributes every LogRecord has; anything else came from `extra=` and is written as a field.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class RequestIdFilter(logging.Filter):
    """Stamps each record with the current request's id (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")


_HANDLER_NAME = "trainplan"


def configure_logging(level: str, log_format: str) -> None:
    """One handler on the `service` logger (replaced, not stacked, when an app is created again), and
    the same on uvicorn's server logger in place of its own, so that its lines after the app is made
    (startup, shutdown, "Invalid HTTP request received") are in the format too: they were plain text
    among the JSON lines (operations review). uvicorn's access log stays off (the service writes one)."""
    logger = logging.getLogger("service")
    logger.setLevel(level.upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    for target in (logger, logging.getLogger("uvicorn")):  # uvicorn.error propagates to uvicorn
        for old in list(target.handlers):
            if target is not logger or old.get_name() == _HANDLER_NAME:
                target.removeHandler(old)
        target.addHandler(handler)
        target.propagate = False
