"""api keys created via

Each API key records how it was made: "operator" (on the database, `trainplan keys create` without
--url) or "api" (POST /v1/api-keys by an authenticated admin; the API refuses to manage keys while
authentication is off). Earlier versions let anyone create keys over the API with authentication
off (the default), and nothing stored tells those keys from the operator's: every key stored before
this revision is marked "unknown" and revoked, so none made without authentication opens a service
that requires keys. The operator makes a new admin key with `trainplan keys create OWNER --scope
admin` and the other keys through it. A downgrade drops the column; the revocations stay.

Revision ID: 6091b21a88b1
Revises: fe8d8c9fa53a
Create Date: 2026-12-02 04:40:00.000000
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

import service.persistence.db

revision: str = '6091b21a88b1'
down_revision: str | None = 'fe8d8c9fa53a'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

api_keys = sa.table(
    'api_keys',
    sa.column('created_via', sa.String(length=20)),
    sa.column('revoked_at', service.persistence.db.UTCDateTime(timezone=True)),
)


def upgrade() -> None:
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.add_column(sa.Column('created_via', sa.String(length=20), nullable=True))
    op.execute(api_keys.update().values(created_via='unknown'))
    op.execute(api_keys.update().where(api_keys.c.revoked_at.is_(None)).values(revoked_at=datetime.now(UTC)))
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.alter_column('created_via', existing_type=sa.String(length=20), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.drop_column('created_via')
