"""custom gpus as their die is

A stored custom GPU reads back through the validators of today: one stored before them with a figure its
die cannot have (``flash_attention`` true on a gv100 or tu104 part, FlashAttention-2 needing Ampere or
CDNA 2/3; a peak of a precision the die has no matrix units for: bf16 on gv100, fp8 on ga100) failed
validation on every read, a 500 on its cluster, on the cluster list and on its plans (change review).
Such a figure is dropped: left out, it is the die's, as a request sending it now is told to do. The die
facts are the catalog's at this revision (gpus.toml: the peaks its parts of each die leave out, and their
flash_attention), written here so that the migration does not move with the catalog. Nothing to undo:
the figures dropped were ones no estimate could use.

Revision ID: 3b7d9e1f4a62
Revises: 8e3a6c0d2f51
Create Date: 2026-12-07 08:30:00.000000
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "3b7d9e1f4a62"
down_revision: str | None = "8e3a6c0d2f51"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NO_FLASH_DIES = frozenset({"gv100", "tu104"})
PEAKS_THE_DIE_LACKS = {
    "gv100": ("tf32", "bf16", "fp8"),
    "tu104": ("tf32", "bf16", "fp8"),
    "ga100": ("fp8",),
    "ga102": ("fp8",),
    "cdna2": ("tf32", "fp8"),
}


def as_the_die_is(spec: dict[str, Any]) -> dict[str, Any] | None:
    """``spec`` without what its die cannot have; None where nothing changes."""
    chip = spec.get("chip")
    fixed = dict(spec)
    if chip in NO_FLASH_DIES and fixed.get("flash_attention") is True:
        del fixed["flash_attention"]
    peaks = fixed.get("peak_flops_per_s")
    if isinstance(peaks, dict):
        lacks = PEAKS_THE_DIE_LACKS.get(chip, ())
        kept = {k: v for k, v in peaks.items() if not (k in lacks and v is not None)}
        if kept != peaks:
            fixed["peak_flops_per_s"] = kept
    return fixed if fixed != spec else None


def upgrade() -> None:
    clusters = sa.table("clusters", sa.column("id", sa.String), sa.column("gpu_spec", sa.JSON))
    conn = op.get_bind()
    rows = conn.execute(sa.select(clusters.c.id, clusters.c.gpu_spec).where(clusters.c.gpu_spec.is_not(None)))
    for cluster_id, spec in rows.all():
        fixed = as_the_die_is(spec) if isinstance(spec, dict) else None
        if fixed is not None:
            conn.execute(clusters.update().where(clusters.c.id == cluster_id).values(gpu_spec=fixed))


def downgrade() -> None:
    pass  # the figures dropped were ones no estimate could use: nothing to restore
