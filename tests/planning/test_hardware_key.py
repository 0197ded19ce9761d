"""The hardware key calibration files runs under: a cluster that states no measured bus bandwidth
keeps the key it had before the field existed (its stored runs still apply), one that states it is
new hardware knowledge and gets its own."""

from __future__ import annotations

import dataclasses

from service.contracts.clusters import ClusterIn
from service.planning.calibration import hardware_key
from tests.custom_gpus import MI325X

POD = ClusterIn(gpu="h100-sxm-80gb", num_nodes=2, gpus_per_node=8, inter_node_bandwidth_bytes_per_s=50e9)
NODE = ClusterIn(gpu="a100-sxm-80gb", num_nodes=1, gpus_per_node=8)


def test_a_cluster_without_a_measurement_keeps_its_key() -> None:
    # the keys of main at 3396171, before ClusterSpec had measured bus bandwidths
    assert hardware_key(POD.to_domain()) == "592a3ab20bbe7e65417db4104ab02f8028a2dcd11f489bfffd0a40f50c01801d"
    assert (
        hardware_key(NODE.to_domain()) == "88a59cdc52dd86a2a203493fb620dc90232524e6cf7a293b1e0fa7e2ea6ef079"
    )


def test_a_measurement_is_other_hardware() -> None:
    plain = POD.to_domain()
    keys = {
        hardware_key(plain),
        hardware_key(dataclasses.replace(plain, measured_inter_node_bus_bandwidth_bytes_per_s=44e9)),
        hardware_key(dataclasses.replace(plain, measured_inter_node_bus_bandwidth_bytes_per_s=40e9)),
        hardware_key(dataclasses.replace(plain, measured_intra_node_bus_bandwidth_bytes_per_s=44e9)),
    }
    assert len(keys) == 4


def test_host_ram_and_nvme_are_not_the_gpus_hardware() -> None:
    """The same 16 H100s were calibrated by a run when the request stated 2 TiB of host RAM and not
    when it left it out (consistency review): host storage is not part of the key."""
    plain = POD.to_domain()
    stated = dataclasses.replace(plain, cpu_memory_bytes_per_node=2**41, nvme_bytes_per_node=2**43)
    assert hardware_key(stated) == hardware_key(plain)
    assert hardware_key(dataclasses.replace(plain, num_nodes=4)) != hardware_key(plain)


def test_a_custom_gpus_maker_keeps_the_key_its_runs_were_stored_under() -> None:
    """A custom GPU is made by its die's maker now (cdna3: amd; it was "custom" for every one, and
    its Kubernetes pods asked for nvidia.com/gpu: hardware review), stated or not: the same part
    keeps the key of main at d02453d, where its vendor was "custom"."""
    inferred = ClusterIn(gpu=MI325X, num_nodes=1, gpus_per_node=8).to_domain()
    stated = ClusterIn(gpu=MI325X | {"vendor": "amd"}, num_nodes=1, gpus_per_node=8).to_domain()
    assert inferred.gpu.vendor == stated.gpu.vendor == "amd"
    key = "52e2579102ea22d19aec5f46ae566a7e601d927088b4bbb24be4593dd6985a72"
    assert hardware_key(inferred) == hardware_key(stated) == key
    # no chip, no vendor: NVIDIA's, as assumed; a stated maker wins over the die's
    bare = {k: v for k, v in MI325X.items() if k != "chip"}
    assert ClusterIn(gpu=bare, num_nodes=1, gpus_per_node=8).to_domain().gpu.vendor == "nvidia"
    assert (
        ClusterIn(gpu=bare | {"vendor": "amd"}, num_nodes=1, gpus_per_node=8).to_domain().gpu.vendor == "amd"
    )
