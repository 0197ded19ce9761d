"""runs calibration answered

A run stores the calibration the answer that stored it gave (what the runs on its hardware said for
its plan's job then), so that a retry with the same Idempotency-Key replays that answer whole: it
answered null, and recomputing it counts the runs stored since. Null for runs stored before.

Revision ID: 8e3a6c0d2f51
Revises: 5c1e8a2f7d44
Create Date: 2026-12-07 00:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8e3a6c0d2f51"
down_revision: str | None = "5c1e8a2f7d44"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("calibration", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("calibration")
