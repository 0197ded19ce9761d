"""Whether a database holds the schema this code migrates to: alembic's head of ``migrations/``.

``/readyz`` asks it, so that a replica started before its migration ran (or after a failed one) is not
put in service while every request fails on a missing table or column (operations review: readiness
said ready on a database never migrated, and each request was a 500 or a misleading 503).
"""

from __future__ import annotations

import functools
from pathlib import Path

from sqlalchemy import Connection, inspect, text

_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"  # holds [tool.alembic]


@functools.cache
def known_revisions() -> tuple[str, frozenset[str]] | None:
    """(head, every revision from the first to it) of the migrations beside this code; None where
    they are not installed with it (then nothing is checked)."""
    if not _PYPROJECT.exists():
        return None
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(Config(toml_file=str(_PYPROJECT)))
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
