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


def test_keys_stored_before_their_origin_was_recorded_are_revoked(tmp_path: object) -> None:
    """Earlier versions let anyone create keys over the API with authentication off, and stored
    nothing that tells those from the operator's: upgrading revokes every one of them, so a key made
    without authentication does not open the service once it requires keys."""
    from pathlib import Path

    from fastapi.testclient import TestClient
    from sqlalchemy import create_engine, text

    from service.main import create_app
    from service.planning.api_keys import secret_digest
    from service.settings import Settings

    url = f"sqlite:///{Path(str(tmp_path)) / 'before-origins.db'}"
    config = alembic_config(url)
    command.upgrade(config, "fe8d8c9fa53a")  # the last revision without api_keys.created_via
    minted = "tp_minted-over-the-unauthenticated-api"
    engine = create_engine(url)
    with engine.begin() as conn:
        for key_id, secret, revoked_at in [
            ("K1", minted, None),
            ("K2", "tp_revoked-before", "2026-12-01 10:00:00.000000"),
        ]:
            conn.execute(
                text(
                    "INSERT INTO api_keys (id, owner, name, scopes, secret_sha256, created_at, revoked_at)"
                    " VALUES (:id, 'local', '', '[\"admin\"]', :digest, '2026-12-01 00:00:00', :revoked)"
                ),
                {"id": key_id, "digest": secret_digest(secret), "revoked": revoked_at},
            )
    command.upgrade(config, "head")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, created_via, revoked_at FROM api_keys ORDER BY id")).all()
    engine.dispose()
    assert [(key_id, via) for key_id, via, _ in rows] == [("K1", "unknown"), ("K2", "unknown")]
    assert rows[0][2] is not None and rows[1][2].startswith("2026-12-01 10:00:00")  # kept as it was
    with TestClient(create_app(Settings(database_url=url, require_auth=True))) as client:
        refused = client.get("/v1/api-keys", headers={"Authorization": f"Bearer {minted}"})
        assert refused.status_code == 401
