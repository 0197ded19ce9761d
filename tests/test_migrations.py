"""The schema exists only through Alembic: a fresh database is built by `upgrade head`, the
models and the migrations agree, and the migrations go down and up again cleanly."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect, text

from service.persistence.db import Base
from tests.conftest import alembic_config, reset_postgres_schema, sibling_postgres_database


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


def scratch_url(migrated_url: str, tmp_path: Path, name: str) -> str:
    """An empty database of the tests' backend: SQLite, or in CI a sibling PostgreSQL database."""
    if migrated_url.startswith("postgresql"):
        url = sibling_postgres_database(migrated_url, name)
        reset_postgres_schema(url)
        return url
    return f"sqlite:///{tmp_path / f'{name}.db'}"


def test_log_runs_get_the_statistic_their_source_names_and_a_downgrade_drops_it(
    migrated_url: str, tmp_path: Path
) -> None:
    """The runs' memory_statistic column is backfilled from a log run's source in the estimate's
    words (max_reserved -> reserved, max_allocated -> allocated); a run without a peak (out of
    memory) and a typed run stored before get none. Down again, the column goes and the sources stay."""
    url = scratch_url(migrated_url, tmp_path, "memory_statistic")
    config = alembic_config(url)
    command.upgrade(config, "3c1f0e7a9b52")  # the last revision without runs.memory_statistic
    plans = sa.table(
        "plans",
        *(sa.column(name, sa.String()) for name in ("id", "hardware_key", "model_name", "status")),
        *(sa.column(name, sa.JSON()) for name in ("cluster_snapshot", "request", "result", "artifacts")),
        *(sa.column(name, sa.String()) for name in ("catalog_version", "estimator_version")),
        sa.column("created_at", sa.DateTime()),
    )
    runs = sa.table(
        "runs",
        sa.column("id", sa.String()),
        sa.column("plan_id", sa.String()),
        sa.column("peak_memory_bytes_per_gpu", sa.BigInteger()),
        sa.column("out_of_memory", sa.Boolean()),
        sa.column("framework_version", sa.String()),
        sa.column("notes", sa.String()),
        sa.column("diagnosis", sa.JSON()),
        sa.column("source", sa.JSON()),
        sa.column("created_at", sa.DateTime()),
    )
    when = datetime(2026, 12, 1, tzinfo=UTC)
    stored = {
        "R1": (2**34, {"format": "torchtitan", "memory_statistic": "max_reserved"}),
        "R2": (2**34, {"format": "deepspeed", "memory_statistic": "max_allocated"}),
        "R3": (2**34, {"format": "megatron", "memory_statistic": "device_used"}),
        "R4": (2**34, {"format": "hf_trainer", "memory_statistic": "allocated"}),
        "R5": (None, {"format": "megatron", "memory_statistic": "max_reserved"}),  # out of memory
        "R6": (2**34, None),  # typed
        "R7": (None, {"format": "unknown", "memory_statistic": None}),
    }
    engine = create_engine(url)
    with engine.begin() as conn:
        plan: dict[str, Any] = {"id": "P1", "hardware_key": "hw", "model_name": "m", "status": "feasible"}
        plan |= {"cluster_snapshot": {}, "request": {}, "result": {}, "artifacts": []}
        plan |= {"catalog_version": "c", "estimator_version": "e", "created_at": when}
        conn.execute(plans.insert().values(**plan))
        for run_id, (peak, source) in stored.items():
            conn.execute(
                runs.insert().values(
                    id=run_id, plan_id="P1", peak_memory_bytes_per_gpu=peak, out_of_memory=peak is None,
                    framework_version="", notes="", diagnosis={}, source=source, created_at=when,
                )
            )  # fmt: skip
    try:
        command.upgrade(config, "head")
        with engine.connect() as conn:
            backfilled: dict[str, str | None] = dict(
                conn.execute(text("SELECT id, memory_statistic FROM runs")).all()
            )
        assert backfilled == {
            "R1": "reserved",
            "R2": "allocated",
            "R3": "device_used",
            "R4": "allocated",
            "R5": None,
            "R6": None,
            "R7": None,
        }
        command.downgrade(config, "3c1f0e7a9b52")
        assert "memory_statistic" not in {c["name"] for c in inspect(engine).get_columns("runs")}
        with engine.connect() as conn:
            sources = dict(conn.execute(sa.select(runs.c.id, runs.c.source)).all())
        assert sources == {run_id: source for run_id, (_, source) in stored.items()}
        command.upgrade(config, "head")
    finally:
        engine.dispose()


def test_clusters_stored_before_have_no_measurement_and_a_measured_one_refuses_a_downgrade(
    migrated_url: str, tmp_path: Path
) -> None:
    """A cluster stored before the measured bus bandwidths existed has none (the tuning's efficiency
    applies, as before) and reads back through the API unchanged. Down again, a measurement would be
    lost and its cluster's estimates move silently: refused until it is set to null."""
    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings

    url = scratch_url(migrated_url, tmp_path, "measured_busbw")
    config = alembic_config(url)
    command.upgrade(config, "1481ec12af96")  # the last revision without the measured bus bandwidths
    engine = create_engine(url)
    columns = (
        "measured_intra_node_bus_bandwidth_bytes_per_s",
        "measured_inter_node_bus_bandwidth_bytes_per_s",
    )
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO clusters (id, name, description, gpu_name, num_nodes, gpus_per_node,"
                    " inter_node_bandwidth_bytes_per_s, cpu_memory_bytes_per_node, nvme_bytes_per_node,"
                    " created_at, updated_at) VALUES ('C1', 'pod', '', 'h100-sxm-80gb', 2, 8, 5e10, 0, 0,"
                    " '2026-12-01 00:00:00', '2026-12-01 00:00:00')"
                )
            )
        command.upgrade(config, "head")
        with engine.connect() as conn:
            assert conn.execute(text(f"SELECT {', '.join(columns)} FROM clusters")).all() == [(None, None)]
        with TestClient(create_app(Settings(database_url=url))) as client:
            stored = client.get("/v1/clusters/C1").json()
            assert (stored[columns[0]], stored[columns[1]]) == (None, None)
            assert client.patch("/v1/clusters/C1", json={columns[1]: 44e9}).status_code == 200
        with pytest.raises(RuntimeError, match=r"1 cluster\(s\) state a measured bus bandwidth"):
            command.downgrade(config, "1481ec12af96")
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE clusters SET {columns[1]} = NULL"))
        command.downgrade(config, "1481ec12af96")
        names = {c["name"] for c in inspect(engine).get_columns("clusters")}
        assert not names & set(columns) and "inter_node_bandwidth_bytes_per_s" in names
        command.upgrade(config, "head")
    finally:
        engine.dispose()


def _sqlite_with_a_plan_on_a_stored_cluster(tmp_path: object, name: str) -> tuple[str, object]:
    """A SQLite database at the second revision holding a cluster and a plan that refers to it."""
    from pathlib import Path

    from sqlalchemy import create_engine, text

    url = f"sqlite:///{Path(str(tmp_path)) / name}"
    command.upgrade(alembic_config(url), "a5a8163d31bd")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO clusters VALUES ('C1', 'c', '', 'h100-sxm-80gb', NULL, 1, 8, 4.5e11, 4.5e11, 0,"
                " 0, '2026-11-30 00:00:00', '2026-11-30 00:00:00')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO plans VALUES ('P1', 'C1', '{}', 'gpt2', 'feasible', '{}', '{}', '[]', 'x', 'y',"
                " '2026-11-30 00:00:00', 'hk', 'fsdp')"
            )
        )
    return url, engine


def test_sqlite_migrations_rebuild_a_table_other_rows_refer_to(tmp_path: object) -> None:
    """Alembic's batch mode rebuilds a SQLite table (copy, drop, rename): with the service's foreign
    keys on, dropping `clusters` that a plan refers to failed half-way and left `_alembic_tmp_clusters`,
    so every retry failed too. Migrations run with the keys off, checked before they commit, in one
    transaction: up to head and down to the first revision, the plan still on its cluster."""
    from sqlalchemy import inspect, text

    url, engine = _sqlite_with_a_plan_on_a_stored_cluster(tmp_path, "rebuild.db")
    config = alembic_config(url)
    command.upgrade(config, "head")
    with engine.connect() as conn:  # type: ignore[attr-defined]
        assert conn.execute(text("SELECT id, cluster_id FROM plans")).all() == [("P1", "C1")]
    command.downgrade(config, "a08becbb1da6")
    with engine.connect() as conn:  # type: ignore[attr-defined]
        assert conn.execute(text("SELECT id, cluster_id FROM plans")).all() == [("P1", "C1")]
        assert not [t for t in inspect(conn).get_table_names() if t.startswith("_alembic_tmp")]
    engine.dispose()  # type: ignore[attr-defined]


def test_a_sqlite_migration_that_would_leave_a_dangling_reference_changes_nothing(tmp_path: object) -> None:
    """A plan that refers to no cluster (stored with the keys off): the upgrade's foreign-key check
    fails it, and the whole upgrade is rolled back (no table left half-built, the version unchanged),
    so it can be mended and run again."""
    import sqlalchemy
    from sqlalchemy import inspect, text

    url, engine = _sqlite_with_a_plan_on_a_stored_cluster(tmp_path, "dangling.db")
    with engine.begin() as conn:  # type: ignore[attr-defined]
        conn.execute(text("DELETE FROM clusters"))  # SQLAlchemy's own engine: foreign keys off
    config = alembic_config(url)
    with pytest.raises(sqlalchemy.exc.IntegrityError, match="plans"):
        command.upgrade(config, "head")
    with engine.connect() as conn:  # type: ignore[attr-defined]
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "a5a8163d31bd"
        assert not [t for t in inspect(conn).get_table_names() if t.startswith("_alembic_tmp")]
    engine.dispose()  # type: ignore[attr-defined]


def test_plans_and_runs_stored_with_host_storage_are_rekeyed(tmp_path: object) -> None:
    """The hardware key hashed host RAM and NVMe, so the same GPUs calibrated an estimate that stated
    host RAM and not one that left it out (consistency review). The keys of plans whose cluster stated
    either move to what hardware_key computes now, their runs' with them; a key the old hashing did not
    make is left alone; the downgrade restores the old keys."""
    import dataclasses
    import json

    from service.contracts.clusters import ClusterIn
    from service.planning.calibration import hardware_key

    url = f"sqlite:///{Path(str(tmp_path)) / 'rekey.db'}"
    config = alembic_config(url)
    command.upgrade(config, "7b2d9e4c1a30")  # the last revision before
    shape = ClusterIn(
        gpu="h100-sxm-80gb", num_nodes=2, gpus_per_node=8, inter_node_bandwidth_bytes_per_s=50e9,
        cpu_memory_bytes_per_node=2**41,
    )  # fmt: skip
    cluster = shape.to_domain()
    stored_then = json.loads(json.dumps(dataclasses.asdict(cluster), default=str))
    del stored_then["gpu"]["peer_to_peer"]  # GPUSpec had no such fields then
    del stored_then["gpu"]["notes"]
    del stored_then["gpu"]["mesh_links"]
    snapshot = json.dumps(stored_then)
    # the key main stored for it before this revision (service.planning.calibration at 0f0b174)
    old = "5c21f141c582c3e09525a595150f6514e437fd1cc1728ad04f6a044ef1006943"
    engine = create_engine(url)
    with engine.begin() as conn:
        for plan_id, key, stored in (
            ("P1", old, snapshot),
            ("P2", "hw-elsewhere", snapshot),
            ("P3", "hw", "{}"),
        ):
            conn.execute(
                text(
                    "INSERT INTO plans (id, cluster_snapshot, hardware_key, model_name, status, request,"
                    " result, artifacts, catalog_version, estimator_version, created_at) VALUES (:id,"
                    " :snapshot, :key, 'm', 'feasible', '{}', '{}', '[]', 'c', 'e', '2026-12-01 00:00:00')"
                ),
                {"id": plan_id, "snapshot": stored, "key": key},
            )
            conn.execute(
                text(
                    "INSERT INTO runs (id, plan_id, hardware_key, out_of_memory, framework_version,"
                    " notes, diagnosis, created_at) VALUES (:id, :plan, :key, 0, '', '', '{}',"
                    " '2026-12-01 00:00:00')"
                ),
                {"id": f"R{plan_id}", "plan": plan_id, "key": key},
            )

    def keys() -> dict[str, tuple[str, str]]:
        with engine.connect() as conn:
            plans = dict(conn.execute(text("SELECT id, hardware_key FROM plans")).all())
            runs = dict(conn.execute(text("SELECT plan_id, hardware_key FROM runs")).all())
        return {plan_id: (plans[plan_id], runs[plan_id]) for plan_id in plans}

    command.upgrade(config, "head")
    new = hardware_key(cluster)
    assert new != old and new == hardware_key(dataclasses.replace(cluster, cpu_memory_bytes_per_node=0))
    assert keys() == {"P1": (new, new), "P2": ("hw-elsewhere", "hw-elsewhere"), "P3": ("hw", "hw")}
    command.downgrade(config, "7b2d9e4c1a30")
    assert keys() == {"P1": (old, old), "P2": ("hw-elsewhere", "hw-elsewhere"), "P3": ("hw", "hw")}
    engine.dispose()


def test_migrations_started_together_run_one_after_the_other(migrated_url: str, tmp_path: Path) -> None:
    """The image's command migrates in every container: two started together on a fresh PostgreSQL
    database, one exited 1 on a UniqueViolation (operations review). The first holds an advisory lock
    (SQLite: the write lock, BEGIN IMMEDIATE) until it commits; the second then finds the schema at head."""
    import os
    import subprocess
    import sys

    url = scratch_url(migrated_url, tmp_path, "together")
    root = Path(__file__).resolve().parents[1]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")} | {
        "PLANNER_DATABASE_URL": url
    }
    upgrade = [sys.executable, "-m", "alembic", "upgrade", "head"]
    started = [
        subprocess.Popen(upgrade, cwd=root, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(3)
    ]
    outputs = [process.communicate(timeout=120)[0].decode() for process in started]
    assert [process.returncode for process in started] == [0, 0, 0], outputs
    # a deploy log says which revisions ran (alembic printed nothing without an alembic.ini)
    assert sum("Running upgrade" in output for output in outputs) >= 1, outputs
    engine = create_engine(url)
    with engine.connect() as conn:
        versions = conn.execute(text("SELECT version_num FROM alembic_version")).all()
    engine.dispose()
    from service.persistence.schema import known_revisions

    known = known_revisions()
    assert known is not None and versions == [(known[0],)]


def test_the_start_command_migrates_except_a_later_releases_database(
    migrated_url: str, tmp_path: Path
) -> None:
    """The image ran `alembic upgrade head` before serving, which fails on a revision it does not know:
    a replica of the previous release, restarted during a rollout or a rollback, never served (change
    review). `python -m service.persistence.schema` migrates to head, and leaves a later release's
    database as it is, saying so."""
    from service.persistence.schema import known_revisions, migrate_unless_newer

    known = known_revisions()
    assert known is not None
    url = scratch_url(migrated_url, tmp_path, "start")
    assert migrate_unless_newer(url) == f"the database is at {known[0]}"
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'a_later_release'"))
    said = migrate_unless_newer(url)
    assert "a_later_release, a later release's" in said and "not migrated" in said
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).all() == [("a_later_release",)]
    engine.dispose()


def test_a_custom_gpu_stored_with_what_its_die_cannot_have_reads_back_as_the_die_is(
    migrated_url: str, tmp_path: Path
) -> None:
    """A gv100 part stored with flash_attention true and a bf16 peak, before the validators refused
    them, failed validation on every read: a 500 on its cluster, the cluster list and its plans
    (change review). The migration drops the two; the cluster reads back and plans as the die is."""
    import json

    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings

    url = scratch_url(migrated_url, tmp_path, "die_facts")
    config = alembic_config(url)
    command.upgrade(config, "8e3a6c0d2f51")  # the last revision before
    engine = create_engine(url)
    spec = {"name": "my-v100", "chip": "gv100", "memory_bytes": 32 * 2**30, "hbm_bandwidth_bytes_per_s": 9e11,
            "peak_flops_per_s": {"fp32": 1.57e13, "fp16": 1.25e14, "bf16": 1.25e14},
            "flash_attention": True}  # fmt: skip
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO clusters (id, name, description, gpu_name, gpu_spec, num_nodes,"
                    " gpus_per_node, cpu_memory_bytes_per_node, nvme_bytes_per_node, created_at, updated_at)"
                    " VALUES ('C1',"
                    " 'old', '', NULL, :spec, 1, 8, 0, 0, '2026-12-01 00:00:00', '2026-12-01 00:00:00')"
                ),
                {"spec": json.dumps(spec)},
            )
        command.upgrade(config, "head")
        with TestClient(create_app(Settings(database_url=url))) as client:
            stored = client.get("/v1/clusters/C1")
            assert stored.status_code == 200, stored.text
            assert (
                "flash_attention" not in stored.json()["gpu"] or not stored.json()["gpu"]["flash_attention"]
            )
            assert stored.json()["gpu"]["peak_flops_per_s"].get("bf16") is None
            assert client.get("/v1/clusters").status_code == 200
            body = {"model": "llama-3.2-1b", "cluster": {"id": "C1"},
                    "training": {"seq_len": 1024, "global_batch_size": 8}}  # fmt: skip
            planned = client.post("/v1/plans", json=body)
            assert planned.status_code == 201, planned.text
            assert planned.json()["resolved_defaults"]["training.attention"] == "sdpa"
    finally:
        engine.dispose()
