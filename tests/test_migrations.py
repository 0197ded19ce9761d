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


def test_rows_stored_before_owners_belong_to_local_and_runs_get_their_plans_hardware(
    tmp_path: object,
) -> None:
    from pathlib import Path

    from sqlalchemy import create_engine, text

    url = f"sqlite:///{Path(str(tmp_path)) / 'before-owners.db'}"
    config = alembic_config(url)
    command.upgrade(config, "c3f1a7d2e9b4")  # the last revision without owners
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO plans (id, cluster_snapshot, hardware_key, model_name, status, request, result,"
                " artifacts, catalog_version, estimator_version, created_at) VALUES ('P1', '{}', 'hw-1', 'm',"
                " 'feasible', '{}', '{}', '[]', 'c', 'e', '2026-12-01 00:00:00')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO runs (id, plan_id, out_of_memory, framework_version, notes, diagnosis,"
                " created_at) VALUES ('R1', 'P1', 0, '', '', '{}', '2026-12-01 00:00:00')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO idempotency_keys (key, scope, request_sha256, resource_id, created_at)"
                " VALUES ('k', 'POST /v1/plans', 'd', 'P1', '2026-12-01 00:00:00')"
            )
        )
    command.upgrade(config, "head")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT owner FROM plans")).all() == [("local",)]
        assert conn.execute(text("SELECT owner, hardware_key FROM runs")).all() == [("local", "hw-1")]
        assert conn.execute(text("SELECT owner, key FROM idempotency_keys")).all() == [("local", "k")]
    engine.dispose()
