"""The cluster a request names: a stored one by id, or an inline one, resolved to a ClusterSpec."""

from __future__ import annotations

from typing import Any

from service.contracts.clusters import ClusterCreate, ClusterIn, ClusterRef
from service.errors import NotFound
from service.estimator.types import ClusterSpec
from service.persistence.models import ClusterRecord
from service.persistence.repository import ClusterRepository


def record_fields(record: ClusterRecord) -> dict[str, Any]:
    """A stored cluster as the fields of a ClusterCreate body (bandwidth defaults left as None)."""
    return {
        "name": record.name,
        "description": record.description,
        "gpu": record.gpu_spec if record.gpu_spec is not None else record.gpu_name,
        "num_nodes": record.num_nodes,
        "gpus_per_node": record.gpus_per_node,
        "intra_node_bandwidth_bytes_per_s": record.intra_node_bandwidth_bytes_per_s,
        "inter_node_bandwidth_bytes_per_s": record.inter_node_bandwidth_bytes_per_s,
        "cpu_memory_bytes_per_node": record.cpu_memory_bytes_per_node,
        "nvme_bytes_per_node": record.nvme_bytes_per_node,
    }


def resolve_cluster(
    cluster: ClusterRef | ClusterIn, repo: ClusterRepository, field: str = "cluster.id"
) -> ClusterSpec:
    """A stored cluster id or an inline cluster -> ClusterSpec. An unknown id (or another owner's)
    is a 404 naming `field`, as the cluster's own URL answers: the request is well formed, the
    resource it names is not there."""
    if isinstance(cluster, ClusterIn):
        return cluster.to_domain()
    record = repo.get(cluster.id)
    if record is None:
        raise NotFound(
            f"cluster {cluster.id!r} does not exist",
            errors=[{"field": field, "message": "no stored cluster has this id", "type": "unknown_cluster"}],
        )
    return ClusterCreate.model_validate(record_fields(record)).to_domain()
