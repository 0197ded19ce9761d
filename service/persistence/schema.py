"""Whether a database holds the schema this code migrates to: alembic's head of ``migrations/``.

``/readyz`` asks it, so that a replica started before its migration ran (or after a failed one) is not
put in service while every request fails on a missing table or column (operations review: readiness
said ready on a database never migrated, and each request was a 500 or a misleading 503).
"""

from __future__ import annotations

import functools
from pathlib import Path

from alembic.config import Config
from sqlalchemy import Connection, inspect, text

_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"  # holds [tool.alembic]


def alembic_config(database_url: str | None = None) -> Config:
    """The migrations' alembic configuration (pyproject.toml's [tool.alembic]), on ``database_url``
    where given (else migrations/env.py reads PLANNER_DATABASE_URL)."""
    config = Config(toml_file=str(_PYPROJECT))
    if database_url is not None:
        config.attributes["database_url"] = database_url
    return config


@functools.cache
def known_revisions() -> tuple[str, frozenset[str]] | None:
    """(head, every revision from the first to it) of the migrations beside this code; None where
    they are not installed with it (then nothing is checked)."""
    if not _PYPROJECT.exists():
        return None
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    head = script.get_current_head()
    if head is None:
        return None
    return head, frozenset(revision.revision for revision in script.walk_revisions())


def database_revision(conn: Connection) -> str | None:
    """The revision alembic stamped on the database; None where it was never migrated."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    row = conn.execute(text("SELECT version_num FROM alembic_version")).first()
    return None if row is None else str(row[0])


def schema_problem(revision: str | None) -> str | None:
    """Why a database at ``revision`` cannot serve this code, or None: never migrated, or at a revision
    before this code's head. One this code does not know is newer (a later release migrated it first,
    as a rolling deploy does): its expanded schema serves this code, so it passes."""
    known = known_revisions()
    if known is None:
        return None
    head, revisions = known
    if revision is None:
        return f"the database was never migrated: run `alembic upgrade head` (this service needs {head})"
    if revision != head and revision in revisions:
        before = f"the database's schema is at {revision}, before this service's {head}"
        return f"{before}: run `alembic upgrade head`"
    return None


def migrate_unless_newer(database_url: str) -> str:
    """``alembic upgrade head`` on ``database_url``, except where the database is at a revision this
    code does not know (a later release migrated it: alembic would fail on "Can't locate revision", and
    a rolled-back or restarting replica would never serve); what it did, in words."""
    from alembic import command

    from service.persistence.db import make_engine

    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            revision = database_revision(conn)
    finally:
        engine.dispose()
    known = known_revisions()
    if known is not None and revision is not None and revision not in known[1]:
        return (
            f"the database is at {revision}, a later release's (this code's head is {known[0]}): not "
            "migrated; it serves this code as long as that release's migrations only add to the schema"
        )
    command.upgrade(alembic_config(database_url), "head")
    return f"the database is at {known[0] if known else 'head'}"


def main() -> None:
    """``python -m service.persistence.schema``: migrate the database of PLANNER_DATABASE_URL to this
    code's head, unless a later release already migrated it (the image's and ``make serve``'s start)."""
    import logging
    import sys

    from service.settings import SettingsError, get_settings

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s [%(name)s] %(message)s")
    logging.getLogger("alembic.runtime.migration").setLevel(logging.INFO)  # the revisions it runs
    try:
        print(f"trainplan: {migrate_unless_newer(get_settings().database_url)}", file=sys.stderr)
    except SettingsError as exc:
        print(f"trainplan: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
