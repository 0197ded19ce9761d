"""initial schema

Revision ID: a08becbb1da6
Revises:
Create Date: 2026-11-29 10:25:02.364701
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.persistence.db

revision: str = 'a08becbb1da6'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('clusters',
    sa.Column('id', sa.String(length=26), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('gpu_name', sa.String(length=100), nullable=True),
    sa.Column('gpu_spec', sa.JSON(), nullable=True),
    sa.Column('num_nodes', sa.Integer(), nullable=False),
    sa.Column('gpus_per_node', sa.Integer(), nullable=False),
    sa.Column('intra_node_bandwidth_bytes_per_s', sa.Float(), nullable=False),
    sa.Column('inter_node_bandwidth_bytes_per_s', sa.Float(), nullable=False),
    sa.Column('cpu_memory_bytes_per_node', sa.BigInteger(), nullable=False),
    sa.Column('nvme_bytes_per_node', sa.BigInteger(), nullable=False),
    sa.Column('created_at', service.persistence.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('updated_at', service.persistence.db.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_clusters')),
    sa.UniqueConstraint('name', name=op.f('uq_clusters_name'))
    )
    op.create_table('idempotency_keys',
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('scope', sa.String(length=100), nullable=False),
    sa.Column('request_sha256', sa.String(length=64), nullable=False),
    sa.Column('resource_id', sa.String(length=26), nullable=False),
    sa.Column('created_at', service.persistence.db.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('key', 'scope', name=op.f('pk_idempotency_keys'))
    )
    op.create_table('plans',
    sa.Column('id', sa.String(length=26), nullable=False),
    sa.Column('cluster_id', sa.String(length=26), nullable=True),
    sa.Column('cluster_snapshot', sa.JSON(), nullable=False),
    sa.Column('model_name', sa.String(length=200), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('result', sa.JSON(), nullable=False),
    sa.Column('artifacts', sa.JSON(), nullable=False),
    sa.Column('catalog_version', sa.String(length=64), nullable=False),
    sa.Column('estimator_version', sa.String(length=64), nullable=False),
    sa.Column('created_at', service.persistence.db.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['cluster_id'], ['clusters.id'], name=op.f('fk_plans_cluster_id_clusters'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_plans'))
    )
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.create_index('ix_plans_cluster_id_id', ['cluster_id', 'id'], unique=False)
        batch_op.create_index('ix_plans_model_name_id', ['model_name', 'id'], unique=False)

    op.create_table('runs',
    sa.Column('id', sa.String(length=26), nullable=False),
    sa.Column('plan_id', sa.String(length=26), nullable=False),
    sa.Column('peak_memory_bytes_per_gpu', sa.BigInteger(), nullable=True),
    sa.Column('step_s', sa.Float(), nullable=True),
    sa.Column('tokens_per_s', sa.Float(), nullable=True),
    sa.Column('gpu_utilization', sa.Float(), nullable=True),
    sa.Column('out_of_memory', sa.Boolean(), nullable=False),
    sa.Column('framework_version', sa.String(length=100), nullable=False),
    sa.Column('notes', sa.Text(), nullable=False),
    sa.Column('diagnosis', sa.JSON(), nullable=False),
    sa.Column('created_at', service.persistence.db.UTCDateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['plan_id'], ['plans.id'], name=op.f('fk_runs_plan_id_plans'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs'))
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_plan_id'), ['plan_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_plan_id'))

    op.drop_table('runs')
    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.drop_index('ix_plans_model_name_id')
        batch_op.drop_index('ix_plans_cluster_id_id')

    op.drop_table('plans')
    op.drop_table('idempotency_keys')
    op.drop_table('clusters')
