"""The clusters the search derives from the one asked about keep its measured bus bandwidths only
on the links they were measured on: a part of the cluster keeps both, another GPU's NVLink gets
none (the tuning's efficiency applies), and so does the default network of a one-node cluster."""

from __future__ import annotations

import dataclasses

from service.catalog.gpus import gpu
from service.recommender.space import sub_cluster
from service.recommender.suggest import with_gpu
from validation.cases import gpu_cluster

H100, A100 = gpu("h100-sxm-80gb"), gpu("a100-sxm-80gb")
POD = dataclasses.replace(
    gpu_cluster(H100, 32, 50e9),
    measured_intra_node_bus_bandwidth_bytes_per_s=370e9,
    measured_inter_node_bus_bandwidth_bytes_per_s=44e9,
)


def test_a_part_of_the_cluster_keeps_its_measurements() -> None:
    part = sub_cluster(POD, 16)
    assert (part.num_nodes, part.gpus_per_node) == (2, 8)
    assert part.measured_intra_node_bus_bandwidth_bytes_per_s == 370e9
    assert part.measured_inter_node_bus_bandwidth_bytes_per_s == 44e9


def test_another_gpu_keeps_only_the_network_measurement() -> None:
    same = with_gpu(POD, H100, 8)
    assert same.measured_intra_node_bus_bandwidth_bytes_per_s == 370e9
    other = with_gpu(POD, A100, 8)
    assert other.measured_intra_node_bus_bandwidth_bytes_per_s is None
    assert other.measured_inter_node_bus_bandwidth_bytes_per_s == 44e9
    # a one-node cluster's derived nodes get the default network, which nobody measured
    node = dataclasses.replace(POD, num_nodes=1, inter_node_bandwidth_bytes_per_s=450e9)
    assert with_gpu(node, H100, 4).measured_inter_node_bus_bandwidth_bytes_per_s is None


def test_more_of_the_clusters_own_nodes_keep_its_stated_links() -> None:
    """The cluster's own GPU on more nodes keeps the NVLink the user stated (and its measurement), as
    an estimate on those nodes reads it; another GPU takes its catalog link (determinism review: a
    more_gpus suggestion was timed on the catalog's 300 GB/s where the user stated 150)."""
    slow = dataclasses.replace(
        POD, intra_node_bandwidth_bytes_per_s=150e9, measured_intra_node_bus_bandwidth_bytes_per_s=120e9
    )
    more = with_gpu(slow, H100, 64)
    assert more.intra_node_bandwidth_bytes_per_s == 150e9
    assert more.measured_intra_node_bus_bandwidth_bytes_per_s == 120e9
    assert with_gpu(slow, A100, 64).intra_node_bandwidth_bytes_per_s == A100.intra_node_bandwidth_bytes_per_s
