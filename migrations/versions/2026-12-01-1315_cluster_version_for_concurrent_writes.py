"""cluster version for concurrent writes

A version counter on each cluster row: an UPDATE or DELETE names the version it read, so two
concurrent PATCHes (or a PATCH and a DELETE) cannot combine; the loser gets 409.

Revision ID: c3f1a7d2e9b4
Revises: 12487cdc2b75
Create Date: 2026-12-01 13:15:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = 'c3f1a7d2e9b4'
down_revision: str | None = '12487cdc2b75'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.add_column(sa.Column('version', sa.Integer(), nullable=False, server_default='1'))


def downgrade() -> None:
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.drop_column('version')
