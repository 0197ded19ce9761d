"""The schema exists only through Alembic: a fresh database is built by `upgrade head`, the
models and the migrations agree, and the migrations go down and up again cleanly."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect

from service.persistence.db import Base
from tests.conftest import alembic_config


def test_upgrade_head_creates_every_table(db_engine: Engine) -> None:
    tables = set(inspect(db_engine).get_table_names())
    assert {"clusters", "plans", "runs", "idempotency_keys", "alembic_version"} <= tables


def test_models_and_migrations_agree(db_engine: Engine) -> None:
    with db_engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    assert diff == [], f"models and migrations disagree; autogenerate would do: {diff}"


def test_downgrade_base_then_upgrade_head(tmp_path: object) -> None:
    from pathlib import Path

    url = f"sqlite:///{Path(str(tmp_path)) / 'roundtrip.db'}"
    config = alembic_config(url)
    command.upgrade(config, "head")
    command.downgrade(config, "base")
    command.upgrade(config, "head")


def test_sqlite_runs_in_wal_mode_with_foreign_keys(db_engine: Engine) -> None:
    if db_engine.dialect.name != "sqlite":
        return
    with db_engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
