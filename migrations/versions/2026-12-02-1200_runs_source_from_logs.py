"""runs source from logs

A run posted as a training log keeps what was read from it: the format, each figure with how it
was made and from which lines, the memory statistic, an out-of-memory error's figures (issue 28).
Null for typed runs and for every run stored before.

Revision ID: 3c1f0e7a9b52
Revises: 6091b21a88b1
Create Date: 2026-12-02 12:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '3c1f0e7a9b52'
down_revision: str | None = '6091b21a88b1'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('source', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('source')
