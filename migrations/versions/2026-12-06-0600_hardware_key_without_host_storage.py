"""hardware key without host storage

Calibration files runs under a hash of the cluster's hardware (service.planning.calibration
.hardware_key). It hashed the host RAM and NVMe per node too, so the same GPUs, nodes and network
calibrated an estimate when the request stated 2 TiB of host RAM and not when it left it out. They are
now hashed at their "not stated" value, 0: the keys of clusters that never stated them do not move.
This revision rekeys the plans (and their runs) whose cluster stated either, from the plan's stored
cluster snapshot: each row's key is recomputed the old way first and rekeyed only where that
reproduces the stored key (so a row whose key came from elsewhere is left as it is). The downgrade
recomputes the old keys the same way, so it rekeys only rows keyed as this revision keyed them: a row
stored by a later release, whose key hashes fields this frozen hash does not (the GPU's notes,
peer_to_peer, mesh_links), is left under its key, which the release before this revision never
computes (its runs calibrate nothing there; a data-lifecycle review found the docstring promised more).

The hashing is frozen here as it was written on 2026-12-06 (a migration must not follow later code).

Revision ID: 5c1e8a2f7d44
Revises: 7b2d9e4c1a30
Create Date: 2026-12-06 06:00:00.000000
"""

import copy
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "5c1e8a2f7d44"
down_revision: str | None = "7b2d9e4c1a30"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

HOST_STORAGE = ("cpu_memory_bytes_per_node", "nvme_bytes_per_node")
OPTIONAL = ("measured_intra_node_bus_bandwidth_bytes_per_s", "measured_inter_node_bus_bandwidth_bytes_per_s")


def _key(snapshot: dict[str, Any], without_host_storage: bool) -> str | None:
    """hardware_key of the cluster a plan stored (the JSON of dataclasses.asdict(cluster), the same
    text the key hashed); None where the snapshot is not a cluster's."""
    fields = copy.deepcopy(snapshot)
    gpu = fields.get("gpu")
    if not isinstance(gpu, dict) or not all(name in fields for name in HOST_STORAGE):
        return None
    if without_host_storage:
        for name in HOST_STORAGE:
            fields[name] = 0
    for name in OPTIONAL:
        if name in fields and fields[name] is None:
            del fields[name]
    for name in ("defaulted", "node_network_bytes_per_s", "node_gpus"):
        gpu.pop(name, None)
    canonical = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _rekey(to_new: bool) -> None:
    bind = op.get_bind()
    plans = sa.table(
        "plans",
        sa.column("id", sa.String()),
        sa.column("hardware_key", sa.String()),
        sa.column("cluster_snapshot", sa.JSON()),
    )
    rows = bind.execute(sa.select(plans.c.id, plans.c.hardware_key, plans.c.cluster_snapshot)).all()
    changed = 0
    for plan_id, stored, snapshot in rows:
        if isinstance(snapshot, str):
            snapshot = json.loads(snapshot)
        if not isinstance(snapshot, dict) or not any(snapshot.get(name) for name in HOST_STORAGE):
            continue  # nothing stated: its key is the same either way
        before, after = _key(snapshot, not to_new), _key(snapshot, to_new)
        if before is None or after is None or before != stored:
            continue  # not a key this hashing made: left as it is
        bind.execute(sa.update(plans).where(plans.c.id == plan_id).values(hardware_key=after))
        changed += 1
    if changed:
        bind.execute(
            sa.text(
                "UPDATE runs SET hardware_key = (SELECT plans.hardware_key FROM plans WHERE plans.id = runs.plan_id) "
                "WHERE EXISTS (SELECT 1 FROM plans WHERE plans.id = runs.plan_id)"
            )
        )


def upgrade() -> None:
    _rekey(to_new=True)


def downgrade() -> None:
    _rekey(to_new=False)
