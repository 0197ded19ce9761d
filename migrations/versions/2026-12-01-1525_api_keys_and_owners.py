"""api keys and owners

API keys (SHA-256 of the secret, owner, scopes, revocation) and the owner of each cluster, plan and
idempotency key. Rows stored before this belong to the owner "local", the one every request acts as
when authentication is off. Cluster names and idempotency keys become unique per owner.

Revision ID: 519ccc537fec
Revises: c3f1a7d2e9b4
Create Date: 2026-12-01 15:25:47.671384
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import service.persistence.db

revision: str = '519ccc537fec'
down_revision: str | None = 'c3f1a7d2e9b4'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('api_keys',
    sa.Column('id', sa.String(length=26), nullable=False),
    sa.Column('owner', sa.String(length=100), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('scopes', sa.JSON(), nullable=False),
    sa.Column('secret_sha256', sa.String(length=64), nullable=False),
    sa.Column('created_at', service.persistence.db.UTCDateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', service.persistence.db.UTCDateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('secret_sha256', name=op.f('uq_api_keys_secret_sha256'))
    )
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_api_keys_owner'), ['owner'], unique=False)

    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner', sa.String(length=100), server_default='local', nullable=False))
        batch_op.drop_constraint(batch_op.f('uq_clusters_name'), type_='unique')
        batch_op.create_unique_constraint('uq_clusters_owner_name', ['owner', 'name'])

    with op.batch_alter_table('idempotency_keys', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner', sa.String(length=100), server_default='local', nullable=False))
        batch_op.drop_constraint('pk_idempotency_keys', type_='primary')
        batch_op.create_primary_key('pk_idempotency_keys', ['owner', 'key', 'scope'])

    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner', sa.String(length=100), server_default='local', nullable=False))
        batch_op.create_index('ix_plans_owner_id', ['owner', 'id'], unique=False)



def downgrade() -> None:
    # Back to one owner: other owners' idempotency keys would collide with the local ones, and their
    # clusters' names might; both are removed with their plans before the constraints return.
    op.execute("DELETE FROM idempotency_keys WHERE owner <> 'local'")
    with op.batch_alter_table('idempotency_keys', schema=None) as batch_op:
        batch_op.drop_constraint('pk_idempotency_keys', type_='primary')
        batch_op.create_primary_key('pk_idempotency_keys', ['key', 'scope'])
        batch_op.drop_column('owner')

    op.execute("DELETE FROM runs WHERE plan_id IN (SELECT id FROM plans WHERE owner <> 'local')")
    op.execute("DELETE FROM plans WHERE owner <> 'local'")
    op.execute("DELETE FROM clusters WHERE owner <> 'local'")
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.drop_constraint('uq_clusters_owner_name', type_='unique')
        batch_op.create_unique_constraint(batch_op.f('uq_clusters_name'), ['name'])
        batch_op.drop_column('owner')

    with op.batch_alter_table('plans', schema=None) as batch_op:
        batch_op.drop_index('ix_plans_owner_id')
        batch_op.drop_column('owner')

    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_api_keys_owner'))

    op.drop_table('api_keys')
