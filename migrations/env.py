"""Alembic environment: the URL comes from the caller (tests) or from PLANNER_DATABASE_URL."""

import logging
from typing import Any

from alembic import context
from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import IntegrityError

from service.persistence import models  # noqa: F401  (registers the tables on Base.metadata)
from service.persistence.db import Base, make_engine
from service.settings import get_settings

config = context.config
target_metadata = Base.metadata
if config.cmd_opts is not None and not logging.getLogger().handlers:
    # `alembic upgrade` from a shell (no alembic.ini, so no [loggers]): say which revisions ran, as a
    # deploy log should show (it printed nothing; operations review). Called from code (the tests,
    # trainplan's in-process service), the caller's logging is left as it is.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s [%(name)s] %(message)s")
    logging.getLogger("alembic.runtime.migration").setLevel(logging.INFO)
MIGRATION_LOCK_KEY = 0x74706D67  # "tpmg": PostgreSQL's advisory lock key for migrations


def _url() -> str:
    return config.attributes.get("database_url") or get_settings().database_url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    sqlite = engine.dialect.name == "sqlite"
    if sqlite:
        _one_sqlite_transaction(engine)
    with engine.connect() as conn:
        # transactional_ddl: Alembic's SQLite default is a commit per revision (pysqlite ran DDL
        # outside transactions); with the BEGIN below, the whole upgrade is one transaction
        context.configure(
            connection=conn,
            target_metadata=target_metadata,
            render_as_batch=True,
            transactional_ddl=sqlite or None,
        )
        with context.begin_transaction():
            if engine.dialect.name == "postgresql":
                # one migration at a time: containers started together each run `alembic upgrade head`
                # (the image's command), and the second failed on a UniqueViolation; it now waits for
                # the first's commit, then finds the schema at head (operations review)
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
            context.run_migrations()
            if sqlite:
                _check_foreign_keys(conn)
    engine.dispose()


def _one_sqlite_transaction(engine: Engine) -> None:
    """SQLite's procedure for a schema change that rebuilds a table (sqlite.org/lang_altertable.html,
    "Making Other Kinds Of Table Schema Changes"), which Alembic's batch mode does (copy, drop,
    rename): foreign keys off for the connection, everything in one transaction, a foreign-key check
    before it commits. The service's connections turn the keys on (``make_engine``), and with them
    dropping ``clusters`` that a plan refers to failed half-way; and Python's sqlite3 runs DDL outside
    any transaction unless told to BEGIN, so the failure left ``_alembic_tmp_clusters`` behind and
    every retry failed on it. Here a failure rolls the whole upgrade back."""

    @event.listens_for(engine, "connect")
    def _keys_off(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # the driver begins nothing: SQLAlchemy's BEGIN below
        dbapi_connection.execute("PRAGMA foreign_keys=OFF")  # a no-op inside a transaction: set first

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # IMMEDIATE: the write lock first, so a second `alembic upgrade` started meanwhile waits (the
        # busy timeout) and then reads the version this one commits, rather than creating its tables again
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _check_foreign_keys(conn: Connection) -> None:
    """Fail (and roll back) where the migrated rows refer to a row that is not there."""
    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
    if broken:
        tables = sorted({str(row[0]) for row in broken})
        raise IntegrityError(
            "PRAGMA foreign_key_check",
            None,
            Exception(f"{len(broken)} rows of {', '.join(tables)} refer to rows that are not there"),
        )


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
