"""Service settings, read from the environment with the PLANNER_ prefix.

``python -m service.settings`` checks them and exits 2 naming each bad or misspelt variable: ``make
serve`` and the image run it before uvicorn, whose worker processes would otherwise each fail on them
and be started again and again, the port closed (operations review)."""

import contextlib
import difflib
import json
import os
import re
import sys
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PREFIX = "PLANNER_"
# PLANNER_ variables that are not the service's settings: the test suite's PostgreSQL database
# (tests/conftest.py, .ci/run), and the service links Kubernetes puts in every pod for a Service named
# "planner" (PLANNER_SERVICE_HOST, PLANNER_PORT, PLANNER_PORT_8000_TCP_ADDR, ...)
NOT_SETTINGS = frozenset({"PLANNER_TEST_DATABASE_URL"})
_SERVICE_LINK = re.compile(
    r"^PLANNER_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_\d+_(TCP|UDP|SCTP)(_[A-Z]+)?)?)$"
)
_MISSPELT = 0.8  # difflib's ratio past which an unknown variable is taken for a misspelt setting
# scheme://host[:port], as a browser's Origin header is (an app's own scheme too: tauri://localhost)
_ORIGIN = re.compile(r"^[a-z][a-z0-9+.-]*://[^/\s?#]+$", re.IGNORECASE)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore")

    # SQLite file in the working directory by default; postgresql+psycopg://... for PostgreSQL.
    database_url: str = "sqlite:///./trainplan.db"
    # Origins allowed to call the API from a browser (the platform UI): a JSON list or
    # comma-separated in the environment.
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Request bodies larger than this are refused with 413 before they are parsed.
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    # SQLite waits this long for a competing writer before failing with "database is locked".
    sqlite_busy_timeout_ms: int = Field(default=5_000, ge=0)
    # A request waits for its turn at the database (a connection of the pool) at most
    # database_pool_timeout_s from its arrival, then PostgreSQL gets at most
    # database_connect_timeout_s to open a connection (psycopg's floor is 2 s), and the server
    # cancels each statement after database_statement_timeout_ms. Past any of them: a 503 with
    # Retry-After. A database that never answers: every request's 503 within pool + connect.
    database_connect_timeout_s: int = Field(default=5, ge=2)
    database_statement_timeout_ms: int = Field(default=30_000, ge=100)
    database_pool_timeout_s: float = Field(default=10.0, gt=0, le=3600)  # inf overflowed a deadline
    # Connections each worker process opens at most (and requests it lets use the database at once):
    # every worker of every replica takes its own against PostgreSQL's max_connections (100 by default).
    database_pool_connections: int = Field(default=15, ge=1, le=1000)
    # CPU-heavy requests (estimates, plans, capacity) run at most this many at once; the next waits
    # up to planning_queue_wait_s for a slot, then gets 503 with Retry-After. A process's threads
    # share one interpreter lock, so n plans at once take n x request_budget_s of wall time, and past
    # BUSY_WALL_FACTOR (6) x their budget each stops as "busy" with its work thrown away (eight at
    # once on 2 cores: five 503 after 9.6 s, concurrency review): four finish within 4 x 1.5 s, with
    # room beside them for estimates and a capacity request; the others wait, computing nothing.
    max_concurrent_planning: int = Field(default=4, ge=1, le=256)
    # Capacity requests (capacity_budget_s of CPU each, every GPU type searched) have their own,
    # fewer slots: a process's threads share one interpreter lock, so n of them at once take n x
    # capacity_budget_s of wall time, and past BUSY_WALL_FACTOR (6) x their budget each stops as
    # "busy" with its work thrown away (ten at once: all ten 503 after 48 s). Two finish within 2 x 8 s
    # beside a full set of plans; the next waits planning_queue_wait_s for one, then 503 at once.
    max_concurrent_capacity: int = Field(default=2, ge=1, le=64)
    planning_queue_wait_s: float = Field(default=5.0, ge=0, le=60)
    # CPU time one planning request may compute (its search, every suggestion, capacity across GPU
    # types), from when it gets its slot; what the budget cut says so (search.truncated_by). 1.5 s
    # of work keeps a plan's answer, stored and rendered, within 2 s on a 2-core machine.
    request_budget_s: float = Field(default=1.5, gt=0, le=600)
    # The same for POST /v1/capacity, which searches every GPU type of the catalog: a 400B-class
    # model takes about a second of search per type today, so its answer needs more than a plan's.
    capacity_budget_s: float = Field(default=8.0, gt=0, le=600)
    # Off: every request acts as the owner "local" with every scope (one user on a laptop). On: every
    # /v1 request needs `Authorization: Bearer <API key>` (create keys with `trainplan keys create`).
    require_auth: bool = False
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    # One JSON object per line (with the request id) for log shippers; "text" for a terminal.
    log_format: Literal["json", "text"] = "json"

    @field_validator("log_level", mode="before")
    @classmethod
    def _level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("database_url")
    @classmethod
    def _database(cls, value: str) -> str:
        # checked here, not at the first connection: a URL SQLAlchemy cannot parse, a dialect or
        # driver it cannot load, or an SQLite file in no directory made every worker fail at startup
        # with a traceback while `python -m service.settings` passed (operator review)
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError

        try:
            url = make_url(value)
        except ArgumentError:
            raise ValueError(
                "not a database URL: sqlite:///path/to/file.db or postgresql+psycopg://user@host/database"
            ) from None
        shown = url.render_as_string(hide_password=True)
        if url.drivername.split("+")[0] == "postgres":
            # libpq's and many platforms' scheme, which SQLAlchemy 1.4+ does not take
            raise ValueError(f"{shown}: write postgresql+psycopg:// (SQLAlchemy has no dialect postgres)")
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError(f"{shown}: the service runs on SQLite or PostgreSQL (postgresql+psycopg://...)")
        try:
            url.get_dialect().import_dbapi()
        except (NoSuchModuleError, ImportError) as exc:
            raise ValueError(
                f"{shown}: its driver is not installed ({exc}); PostgreSQL: postgresql+psycopg://"
            ) from None
        database = url.database or ""
        if (
            url.get_backend_name() == "sqlite"
            and database
            and database != ":memory:"
            and not database.startswith("file:")
        ):
            folder = os.path.dirname(os.path.abspath(database))
            if not os.path.isdir(folder):
                raise ValueError(f"{shown}: the SQLite file's folder {folder} does not exist")
        return value

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"PLANNER_CORS_ORIGINS is not a valid JSON list: {exc}") from None
        return [origin.strip() for origin in text.split(",") if origin.strip()]

    @field_validator("cors_origins")
    @classmethod
    def _origins_match_headers(cls, origins: list[str]) -> list[str]:
        # a browser's Origin is scheme://host[:port]: "https://ui.example/" (a trailing slash, a path)
        # never equals one, so the page would be refused while the setting looked right
        bad = [origin for origin in origins if origin not in ("*", "null") and not _ORIGIN.match(origin)]
        if bad:
            raise ValueError(f"{', '.join(bad)}: an origin is scheme://host[:port], without a path or slash")
        # ... and browsers serialise it with the host in lower case and without the scheme's default
        # port (WHATWG URL, HTML's origin serialisation): "https://UI.example" or ":443" never matches
        unsent = [origin for origin in origins if origin not in ("*", "null") and _as_sent(origin) != origin]
        if unsent:
            said = ", ".join(f"{origin} (a browser sends {_as_sent(origin)})" for origin in unsent)
            raise ValueError(f"{said}: write each origin as browsers send it")
        return origins


_DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443"}


def _as_sent(origin: str) -> str:
    """``origin`` as a browser's Origin header writes it (WHATWG URL serialisation): the scheme and
    host in lower case, an international host in punycode, the port as a number, left out where it is
    the scheme's default (https://UI.example.com:443 -> https://ui.example.com, http://x:080 -> http://x,
    https://bücher.example -> https://xn--bcher-kva.example; operator and change reviews)."""
    scheme, _, rest = origin.partition("://")
    scheme = scheme.lower()
    host, port = rest, ""
    if not rest.endswith("]"):  # an IPv6 literal's colons are its own
        before, colon, after = rest.rpartition(":")
        if colon and after.isdigit():
            host, port = before, str(int(after))
    if not host.startswith("["):
        # a name IDNA does not encode is compared as written, lower-cased
        with contextlib.suppress(UnicodeError):
            host = host.encode("idna").decode("ascii")
    if port and _DEFAULT_PORTS.get(scheme) == port:
        port = ""
    return f"{scheme}://{host.lower()}" + (f":{port}" if port else "")


class SettingsError(Exception):
    """The environment's PLANNER_ variables do not make settings: each problem names its variable."""


def load_settings() -> Settings:
    """The settings of the environment; ``SettingsError`` naming every PLANNER_ variable with a bad
    value or that reads as a setting misspelt (a misspelt PLANNER_REQUIRE_AUTHENTICATION=true was
    ignored, and the service served without keys; operations review)."""
    known = {PREFIX + name.upper() for name in Settings.model_fields}
    problems = []
    for name in sorted(os.environ):
        upper = name.upper()
        if (
            not upper.startswith(PREFIX)
            or upper in known
            or upper in NOT_SETTINGS
            or _SERVICE_LINK.match(upper)
        ):
            continue
        # refused where it reads as a setting misspelt; another PLANNER_ variable is someone else's
        close = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=_MISSPELT)
        if close:
            problems.append(f"{name}: not a setting of this service (did you mean {close[0]}?)")
    try:
        settings = Settings()
    except ValidationError as exc:
        for error in exc.errors():
            field = PREFIX + str(error["loc"][0]).upper() if error["loc"] else "settings"
            problems.append(f"{field}: {error['msg']}")
    if problems:
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(problems))
    return settings


@lru_cache
def get_settings() -> Settings:
    return load_settings()


def main() -> None:
    """Check the environment's settings: exit 0, or 2 with each bad variable on stderr."""
    try:
        load_settings()
    except SettingsError as exc:
        print(f"trainplan: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
