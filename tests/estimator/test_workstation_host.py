"""What a PCIe workstation's answer says of its host (workstation review): offload that leaves the node
almost no host RAM is warned of; the host-side rates an offloading step was timed at are named; GPUs
without peer-to-peer say their traffic goes through host memory, until a measured figure replaces it."""

from __future__ import annotations

import dataclasses

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator.estimate import estimate
from service.estimator.types import ClusterSpec, Framework, Layout, Offload, Precision, TrainingSpec

GiB = 2**30
RTX4090 = gpu("rtx-4090-24gb")
LLAMA = preset("llama-3.1-8b").spec
TRAINING = TrainingSpec(seq_len=2048, global_batch_size=32, precision=Precision.BF16)
TUNING = default_tuning()
OFFLOADED = Layout(framework=Framework.DEEPSPEED, dp=4, zero_stage=2, offload_optimizer=Offload.CPU)


def node(host_bytes: int, **fields: object) -> ClusterSpec:
    return ClusterSpec(
        gpu=RTX4090,
        num_nodes=1,
        gpus_per_node=4,
        intra_node_bandwidth_bytes_per_s=RTX4090.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=25e9,
        cpu_memory_bytes_per_node=host_bytes,
        **fields,  # type: ignore[arg-type]
    )


def test_offload_that_leaves_under_5_percent_of_host_ram_is_warned_of() -> None:
    need = estimate(LLAMA, node(1024 * GiB), OFFLOADED, TRAINING, tuning=TUNING).memory.cpu_per_node_bytes
    assert need > 100 * GiB
    thin = estimate(LLAMA, node(int(need * 1.01)), OFFLOADED, TRAINING, tuning=TUNING)
    assert any(w.startswith("thin host RAM headroom:") for w in thin.warnings), thin.warnings
    roomy = estimate(LLAMA, node(int(need * 1.06)), OFFLOADED, TRAINING, tuning=TUNING)
    assert not any("host RAM" in w for w in roomy.warnings), roomy.warnings
    short = estimate(LLAMA, node(int(need * 0.99)), OFFLOADED, TRAINING, tuning=TUNING)
    assert any(w.startswith("host RAM:") for w in short.warnings) and not any(
        w.startswith("thin host") for w in short.warnings
    )


def test_the_host_rates_an_offloading_step_was_timed_at_are_named() -> None:
    cpu = estimate(LLAMA, node(1024 * GiB), OFFLOADED, TRAINING, tuning=TUNING)
    host = TUNING.cpu_adam_params_per_s_per_node
    assert any(a.startswith("optimizer step on the host") and f"{host:.3g}" in a for a in cpu.assumptions)
    assert not any(a.startswith("NVMe offload") for a in cpu.assumptions)
    nvme = dataclasses.replace(OFFLOADED, zero_stage=3, offload_optimizer=Offload.NVME)
    cluster = dataclasses.replace(node(1024 * GiB), nvme_bytes_per_node=2 * 10**12)
    said = estimate(LLAMA, cluster, nvme, TRAINING, tuning=TUNING).assumptions
    bandwidth = TUNING.nvme_bandwidth_bytes_per_s_per_node / 1e9
    assert any(a.startswith(f"NVMe offload at {bandwidth:g} GB/s per node") for a in said), said
    plain = estimate(LLAMA, node(1024 * GiB), dataclasses.replace(OFFLOADED, offload_optimizer=Offload.NONE),
                     TRAINING, tuning=TUNING)  # fmt: skip
    assert not any(a.startswith(("optimizer step on the host", "NVMe")) for a in plain.assumptions)


def test_gpus_without_peer_to_peer_say_their_traffic_crosses_host_memory() -> None:
    assert not RTX4090.peer_to_peer
    layout = dataclasses.replace(OFFLOADED, offload_optimizer=Offload.NONE, zero_stage=3)
    said = estimate(LLAMA, node(1024 * GiB), layout, TRAINING, tuning=TUNING).assumptions
    assert any("no peer-to-peer" in a and "measured_intra_node_bus_bandwidth" in a for a in said), said
    measured = node(1024 * GiB, measured_intra_node_bus_bandwidth_bytes_per_s=12e9)
    said = estimate(LLAMA, measured, layout, TRAINING, tuning=TUNING).assumptions
    assert not any("no peer-to-peer" in a for a in said)
    h100 = gpu("h100-pcie-80gb")
    assert h100.peer_to_peer
    intra = h100.intra_node_bandwidth_bytes_per_s
    cluster = dataclasses.replace(node(1024 * GiB), gpu=h100, intra_node_bandwidth_bytes_per_s=intra)
    assert not any(
        "no peer-to-peer" in a for a in estimate(LLAMA, cluster, layout, TRAINING, tuning=TUNING).assumptions
    )
