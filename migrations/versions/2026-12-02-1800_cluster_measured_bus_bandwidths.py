"""cluster measured bus bandwidths

A cluster may state the NCCL bus bandwidth it measured (nccl-tests all_reduce_perf busbw) inside a
node and between nodes, which the estimator then uses instead of the nominal link x the tuning's bus
efficiency (issue 27). Both columns are nullable: a cluster stored before has no measurement. A
downgrade would drop measurements the owners stated, and their clusters' estimates would move with
nothing to say so: it is refused while any cluster holds one (PATCH it to null first).

Revision ID: 7b2d9e4c1a30
Revises: 1481ec12af96
Create Date: 2026-12-02 18:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '7b2d9e4c1a30'
down_revision: str | None = '1481ec12af96'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.add_column(sa.Column('measured_intra_node_bus_bandwidth_bytes_per_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('measured_inter_node_bus_bandwidth_bytes_per_s', sa.Float(), nullable=True))


def downgrade() -> None:
    measured = op.get_bind().execute(sa.text(
        "SELECT count(*) FROM clusters WHERE measured_intra_node_bus_bandwidth_bytes_per_s IS NOT NULL "
        "OR measured_inter_node_bus_bandwidth_bytes_per_s IS NOT NULL"
    )).scalar()
    if measured:
        raise RuntimeError(
            f"{measured} cluster(s) state a measured bus bandwidth; set it to null before downgrading"
        )
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.drop_column('measured_inter_node_bus_bandwidth_bytes_per_s')
        batch_op.drop_column('measured_intra_node_bus_bandwidth_bytes_per_s')
