"""plan hardware key and framework for calibration

Revision ID: a5a8163d31bd
Revises: a08becbb1da6
Create Date: 2026-11-29 10:44:47.871196
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.persistence.db

revision: str = 'a5a8163d31bd'
down_revision: str | None = 'a08becbb1da6'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('plans', schema=None) as batch_op:
        # Rows written before this revision get an empty key (no calibration), then the default goes.
        batch_op.add_column(sa.Column('hardware_key', sa.String(length=64), nullable=False, server_default=''))
        batch_op.add_column(sa.Column('framework', sa.String(length=20), nullable=True))
        batch_op.create_index('ix_plans_hardware_key_framework', ['hardware_key', 'framework'], unique=False)
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.alter_column('hardware_key', server_default=None)


def downgrade() -> None:
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.drop_index('ix_plans_hardware_key_framework')
        batch_op.drop_column('framework')
        batch_op.drop_column('hardware_key')

