"""A cluster of catalog GPUs for the recommender tests."""

from __future__ import annotations

from service.catalog.gpus import gpu
from service.estimator.types import ClusterSpec


def cluster(
    name: str = "h100-sxm-80gb", nodes: int = 1, per_node: int = 8, host_gib: int = 0, inter: float = 50e9
) -> ClusterSpec:
    """``nodes`` nodes of ``per_node`` catalog GPUs, ``inter`` bytes/s per GPU between nodes and
    ``host_gib`` GiB of host RAM per node (0: not stated, so no offload)."""
    g = gpu(name)
    return ClusterSpec(
        gpu=g,
        num_nodes=nodes,
        gpus_per_node=per_node,
        intra_node_bandwidth_bytes_per_s=g.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=inter,
        cpu_memory_bytes_per_node=host_gib * 2**30,
    )
