"""Service settings, read from the environment with the PLANNER_ prefix."""

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PLANNER_", extra="ignore")

    # SQLite file in the working directory by default; postgresql+psycopg://... for PostgreSQL.
    database_url: str = "sqlite:///./trainplan.db"
    # Origins allowed to call the API from a browser (the platform UI); comma-separated in env.
    cors_origins: list[str] = Field(default_factory=list)
    # Request bodies larger than this are refused with 413 before they are parsed.
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    # SQLite waits this long for a competing writer before failing with "database is locked".
    sqlite_busy_timeout_ms: int = Field(default=5_000, ge=0)
    log_level: str = "INFO"


@lru_cache
def get_settings() -> Settings:
    return Settings()
