"""cluster bandwidths as given, null for defaults

Rows written before keep their stored (effective) values, which then count as given.

Revision ID: 12487cdc2b75
Revises: a5a8163d31bd
Create Date: 2026-11-29 11:31:18.583516
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '12487cdc2b75'
down_revision: str | None = 'a5a8163d31bd'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.alter_column('intra_node_bandwidth_bytes_per_s',
               existing_type=sa.FLOAT(),
               nullable=True)
        batch_op.alter_column('inter_node_bandwidth_bytes_per_s',
               existing_type=sa.FLOAT(),
               nullable=True)


def downgrade() -> None:
    # A defaulted (null) bandwidth follows the GPU catalog, which a migration cannot read: refuse
    # rather than invent numbers.
    defaulted = op.get_bind().execute(sa.text(
        "SELECT count(*) FROM clusters WHERE intra_node_bandwidth_bytes_per_s IS NULL "
        "OR inter_node_bandwidth_bytes_per_s IS NULL"
    )).scalar()
    if defaulted:
        raise RuntimeError(f"{defaulted} cluster(s) use default bandwidths; set them before downgrading")
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.alter_column('inter_node_bandwidth_bytes_per_s',
               existing_type=sa.FLOAT(),
               nullable=False)
        batch_op.alter_column('intra_node_bandwidth_bytes_per_s',
               existing_type=sa.FLOAT(),
               nullable=False)

