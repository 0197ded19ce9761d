"""Fixtures: a database built by `alembic upgrade head` (SQLite by default, PostgreSQL when
PLANNER_TEST_DATABASE_URL is set), an app bound to it, and a TestClient. Rows are deleted
after each test, so tests can also exercise real commits and concurrency."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine, make_url, text

from service.main import create_app
from service.persistence import (
    models,  # noqa: F401  (registers tables)
    schema,
)
from service.persistence.db import Base, make_engine
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DB_FIXTURES = {"migrated_url", "db_engine", "app", "client"}


def alembic_config(url: str) -> Config:
    return schema.alembic_config(url)


def reset_postgres_schema(url: str) -> None:
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


def sibling_postgres_database(url: str, suffix: str) -> str:
    """A database named `<that database>_<suffix>` on the same server (created when missing), for a
    test that must not share tables with the others (the fuzzer, several service processes)."""
    base = make_url(url)
    name = f"{base.database}_{suffix}"
    engine = make_engine(url)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        exists = conn.scalar(text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": name})
        if not exists:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return base.set(database=name).render_as_string(hide_password=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """With TRAINPLAN_NO_SKIPS=1 (CI's heavy pass) a test that skips for a missing tool fails:
    the real parsers and measurements must have run, not been skipped."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("TRAINPLAN_NO_SKIPS") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped, but TRAINPLAN_NO_SKIPS=1 requires it to run: {report.longrepr}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test that touches the database is marked `db`; CI runs those again on PostgreSQL.
    for item in items:
        if DB_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.db)


@pytest.fixture(scope="session")
def migrated_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = os.environ.get("PLANNER_TEST_DATABASE_URL")
    if url:
        reset_postgres_schema(url)
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'test.db'}"
    command.upgrade(alembic_config(url), "head")
    return url


@pytest.fixture(scope="session")
def db_engine(migrated_url: str) -> Iterator[Engine]:
    engine = make_engine(migrated_url)
    yield engine
    engine.dispose()


@pytest.fixture
def app(migrated_url: str, db_engine: Engine) -> Iterator[FastAPI]:
    # Tests assert on answers, not on the wall-time budget (the machine's load would make that
    # flaky): a generous one here; the budget's own tests set theirs.
    settings = Settings(database_url=migrated_url, max_body_bytes=256 * 1024, request_budget_s=60.0)
    yield create_app(settings)
    with db_engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client
    # No test, however bad its input, may meet an internal error.
    assert app.state.metrics.requests_with_status(500) == [], "a request was answered with 500"


@pytest.fixture(autouse=True, scope="session")
def _memo_keys_complete() -> Iterator[None]:
    """Every estimate the suite computes, across all its tests: no memoised part read a layout field
    its key leaves out (``service.estimator.job.UNKEYED_READS``; the tests that plant a short key
    patch their own record)."""
    from service.estimator import job

    job.UNKEYED_READS.clear()
    yield
    assert not job.UNKEYED_READS, f"memoised parts read fields their keys do not name: {job.UNKEYED_READS}"
