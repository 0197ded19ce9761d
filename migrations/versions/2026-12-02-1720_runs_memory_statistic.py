"""runs memory statistic

Which statistic a run's peak is (allocated, reserved, device_used: estimator.types.MemoryStatistic),
a column calibration and the diagnosis read, so a typed run can say it too (issue 27). A log run's
is backfilled from its source's memory_statistic, the reading the log printed (max_allocated and
allocated are allocated bytes, max_reserved and reserved reserved bytes); a run without a peak
(out of memory) gets none, nor does a typed run stored before (compared as device_used, as before).
A downgrade drops the column: log runs keep theirs in source, a typed run's statistic is lost.

Revision ID: 1481ec12af96
Revises: 3c1f0e7a9b52
Create Date: 2026-12-02 17:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '1481ec12af96'
down_revision: str | None = '3c1f0e7a9b52'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# a log's statistic (service.runlogs.common.MemoryStatistic) -> the statistic of the estimate it is
# a reading of, as of this revision
LOG_STATISTICS = {
    'max_allocated': 'allocated',
    'allocated': 'allocated',
    'max_reserved': 'reserved',
    'reserved': 'reserved',
    'device_used': 'device_used',
}

runs = sa.table(
    'runs',
    sa.column('peak_memory_bytes_per_gpu', sa.BigInteger()),
    sa.column('source', sa.JSON()),
    sa.column('memory_statistic', sa.String(length=20)),
)


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('memory_statistic', sa.String(length=20), nullable=True))
    # JSON's ->> on PostgreSQL, JSON_EXTRACT on SQLite
    logged = runs.c.source['memory_statistic'].as_string()
    op.execute(
        runs.update()
        .where(runs.c.peak_memory_bytes_per_gpu.is_not(None), logged.in_(list(LOG_STATISTICS)))
        .values(memory_statistic=sa.case(LOG_STATISTICS, value=logged))
    )


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('memory_statistic')
