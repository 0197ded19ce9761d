"""Service settings, read from the environment with the PLANNER_ prefix."""

import json
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PLANNER_", extra="ignore")

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
    database_pool_timeout_s: float = Field(default=10.0, gt=0)
    # CPU-heavy requests (estimates, plans, capacity) run at most this many at once; the next waits
    # up to planning_queue_wait_s for a slot, then gets 503 with Retry-After.
    max_concurrent_planning: int = Field(default=8, ge=1, le=256)
    # Capacity requests (capacity_budget_s of CPU each, every GPU type searched) have their own,
    # fewer slots: a process's threads share one interpreter lock, so n of them at once take n x
    # capacity_budget_s of wall time, and past BUSY_WALL_FACTOR (6) x their budget each stops as
    # "busy" with its work thrown away (ten at once: all ten 503 after 48 s). Two finish within 2 x 8 s
    # beside a full set of plans; the next waits planning_queue_wait_s for one, then 503 at once.
    max_concurrent_capacity: int = Field(default=2, ge=1, le=64)
    planning_queue_wait_s: float = Field(default=5.0, ge=0, le=60)
    # Wall time one planning request may compute (its search, every suggestion, capacity across GPU
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


@lru_cache
def get_settings() -> Settings:
    return Settings()
