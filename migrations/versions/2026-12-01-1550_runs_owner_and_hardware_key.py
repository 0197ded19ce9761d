"""runs owner and hardware key

Each run carries its plan's owner and hardware key (copied; neither changes), indexed together, so
calibration reads an owner's runs on some hardware without visiting every plan made for it (the
join used to start from plans: linear in the plans stored for that hardware, on every estimate).

Revision ID: fe8d8c9fa53a
Revises: 519ccc537fec
Create Date: 2026-12-01 15:50:47.886086
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = 'fe8d8c9fa53a'
down_revision: str | None = '519ccc537fec'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner', sa.String(length=100), server_default='local', nullable=False))
        batch_op.add_column(sa.Column('hardware_key', sa.String(length=64), server_default='', nullable=False))
        batch_op.create_index('ix_runs_owner_hardware_key', ['owner', 'hardware_key'], unique=False)
    op.execute(
        "UPDATE runs SET owner = (SELECT plans.owner FROM plans WHERE plans.id = runs.plan_id), "
        "hardware_key = (SELECT plans.hardware_key FROM plans WHERE plans.id = runs.plan_id)"
    )


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index('ix_runs_owner_hardware_key')
        batch_op.drop_column('hardware_key')
        batch_op.drop_column('owner')

