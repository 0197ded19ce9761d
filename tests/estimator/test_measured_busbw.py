"""A cluster's measured NCCL bus bandwidth (nccl-tests all_reduce_perf busbw) is the bandwidth its
collectives are timed at, with no assumed efficiency: by hand through the estimator, and against the
other route to the same number (nominal x the tuning's bus efficiency), which must give the same
estimate to the last bit."""

from __future__ import annotations

import dataclasses

import pytest

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator import comm, step_time
from service.estimator.errors import InvalidHardware
from service.estimator.estimate import estimate
from service.estimator.job import make_job
from service.estimator.types import ClusterSpec, Framework, Layout, Precision, Recompute, TrainingSpec
from validation.cases import gpu_cluster

H100 = gpu("h100-sxm-80gb")
LLAMA = preset("llama-3.1-8b").spec
TRAINING = TrainingSpec(seq_len=4096, global_batch_size=8, precision=Precision.BF16)
TUNING = default_tuning()
NODE = gpu_cluster(H100, 8, 50e9)
NODES = gpu_cluster(H100, 32, 50e9)


def measured(cluster: ClusterSpec, intra: float | None = None, inter: float | None = None) -> ClusterSpec:
    return dataclasses.replace(
        cluster,
        measured_intra_node_bus_bandwidth_bytes_per_s=intra,
        measured_inter_node_bus_bandwidth_bytes_per_s=inter,
    )


def test_a_measured_link_is_timed_at_its_busbw_and_the_other_keeps_nominal_x_efficiency() -> None:
    intra_only = comm.link_for_group(
        measured(NODES, intra=370e9), 16, 1, intra_efficiency=0.5, inter_efficiency=0.5
    )
    assert intra_only.intra_bandwidth_bytes_per_s == 370e9
    assert intra_only.inter_bandwidth_bytes_per_s == 50e9 * 0.5
    inter_only = comm.link_for_group(
        measured(NODES, inter=44e9), 16, 1, intra_efficiency=0.5, inter_efficiency=0.5
    )
    assert inter_only.intra_bandwidth_bytes_per_s == H100.intra_node_bandwidth_bytes_per_s * 0.5
    assert inter_only.inter_bandwidth_bytes_per_s == 44e9


def test_tensor_parallel_all_reduces_by_hand_at_the_measured_busbw() -> None:
    """Megatron TP over one node's 8 GPUs, no sequence parallelism nor overlap: 4 all-reduces per layer
    per micro-batch (2 forward, 2 backward), each of the micro-batch's activations b s h in bf16, a ring
    (it beats the tree at 32 MiB): 2(n-1)/n x S / busbw + 2(n-1) steps of the NVLink latency + NCCL's
    base latency (tuning [links], unchanged by a measurement)."""
    busbw = 370e9
    layout = Layout(framework=Framework.MEGATRON, tp=8, sequence_parallel=False, tp_comm_overlap=False)
    answer = estimate(LLAMA, measured(NODE, intra=busbw), layout, TRAINING, tuning=TUNING)
    assert answer.time is not None
    n, size_bytes = 8, 1 * 4096 * LLAMA.hidden_size * 2  # micro-batch 1 x seq 4096 x h 4096 x 2 bytes
    one = (
        TUNING.collective_base_latency_s
        + 2 * (n - 1) * TUNING.intra_node_latency_s
        + 2 * (n - 1) / n * size_bytes / busbw
    )
    assert one == pytest.approx(14e-6 + 14 * 1.9e-6 + 1.75 * 33_554_432 / 370e9)  # 2.488e-4 s
    micro_batches, collectives = 8, 4 * LLAMA.num_layers
    assert answer.time.breakdown.tp_comm_s == pytest.approx(micro_batches * collectives * one, rel=1e-12)
    # the same through the estimator's own link: the tuning's efficiency (0.8) plays no part
    job = make_job(LLAMA, measured(NODE, intra=busbw), TRAINING, TUNING)
    assert step_time.tuned_link(job, 8, 1).intra_bandwidth_bytes_per_s == busbw


CASES = [
    # one node: tp inside it, ZeRO-3 over it
    (NODE, Layout(framework=Framework.MEGATRON, tp=8)),
    (NODE, Layout(framework=Framework.FSDP, dp=8, zero_stage=3)),
    # four nodes: ZeRO-3 over all of them (hierarchical), tp x pp x dp, DDP across nodes
    (NODES, Layout(framework=Framework.FSDP, dp=32, zero_stage=3, recompute=Recompute.FULL)),
    (NODES, Layout(framework=Framework.MEGATRON, tp=8, pp=2, dp=2, zero_stage=1, sequence_parallel=True)),
    (NODES, Layout(framework=Framework.DEEPSPEED, dp=32, zero_stage=2, recompute=Recompute.FULL)),
]


@pytest.mark.parametrize(("cluster", "layout"), CASES)
def test_measuring_nominal_x_the_tunings_efficiency_gives_the_same_estimate(
    cluster: ClusterSpec, layout: Layout
) -> None:
    """Two routes to one bandwidth: leave the measurement out (nominal x efficiency), or state that
    product as measured (efficiency 1). Every number agrees exactly; only the notes say which."""
    training = dataclasses.replace(TRAINING, global_batch_size=64)
    plain = estimate(LLAMA, cluster, layout, training, tuning=TUNING)
    same = measured(
        cluster,
        intra=cluster.intra_node_bandwidth_bytes_per_s * TUNING.intra_node_bus_efficiency,
        inter=cluster.inter_node_bandwidth_bytes_per_s * TUNING.inter_node_bus_efficiency
        if cluster.num_nodes > 1
        else None,
    )
    stated = estimate(LLAMA, same, layout, training, tuning=TUNING)
    assert stated.time == plain.time and stated.memory == plain.memory and stated.warnings == plain.warnings
    assert plain.time is not None and plain.time.breakdown.step_s > plain.time.breakdown.compute_s
    changed = [(a, b) for a, b in zip(plain.assumptions, stated.assumptions, strict=True) if a != b]
    assert len(changed) == (2 if cluster.num_nodes > 1 else 1)  # intra, and inter where there are nodes
    assert all("bus efficiency" in a and "bus bandwidth measured" in b for a, b in changed)


def test_a_lower_measurement_slows_the_collectives_it_covers_and_only_those() -> None:
    layout = Layout(framework=Framework.MEGATRON, tp=8, pp=2, dp=2, zero_stage=1)
    plain = estimate(LLAMA, NODES, layout, TRAINING, tuning=TUNING).time
    slow_nvlink = estimate(LLAMA, measured(NODES, intra=200e9), layout, TRAINING, tuning=TUNING).time
    assert plain is not None and slow_nvlink is not None
    assert slow_nvlink.breakdown.tp_comm_s > plain.breakdown.tp_comm_s  # 360 -> 200 GB/s
    assert slow_nvlink.breakdown.pp_comm_s == plain.breakdown.pp_comm_s  # pp crosses nodes (stride 16)
    slow_network = estimate(LLAMA, measured(NODES, inter=20e9), layout, TRAINING, tuning=TUNING).time
    assert slow_network is not None
    assert slow_network.breakdown.tp_comm_s == plain.breakdown.tp_comm_s
    assert slow_network.breakdown.pp_comm_s > plain.breakdown.pp_comm_s  # 45 -> 20 GB/s


def test_a_measurement_above_the_link_counts_at_the_link() -> None:
    """NVLS / SHARP reduce in the switch, which lifts an all-reduce's busbw above the link (DGX H100:
    ~480 GB/s of 450); the sends, rings and all-to-alls timed here cannot go faster than the link."""
    nvls = measured(NODE, intra=480e9)
    link = comm.link_for_group(nvls, 8, 1, intra_efficiency=0.8)
    assert link.intra_bandwidth_bytes_per_s == H100.intra_node_bandwidth_bytes_per_s == 450e9
    (note,) = comm.bus_bandwidth_notes(nvls, 0.8, 0.9)
    assert note.startswith("intra-node bus bandwidth measured: 480 GB/s per GPU, above the 450 GB/s link")
    assert "used at the link's 450 GB/s" in note


def test_the_notes_say_what_each_link_was_timed_at() -> None:
    assert comm.bus_bandwidth_notes(NODE, 0.8, 0.9) == (
        "intra-node bus bandwidth: nominal 450 GB/s x 0.8 bus efficiency (tuning, not measured) "
        "= 360 GB/s per GPU",
    )
    assert comm.bus_bandwidth_notes(measured(NODES, inter=44e9), 0.8, 0.9)[1] == (
        "inter-node bus bandwidth measured: 44 GB/s per GPU (nominal link 50 GB/s)"
    )
    one_gpu = dataclasses.replace(NODE, gpus_per_node=1)
    assert comm.bus_bandwidth_notes(one_gpu, 0.8, 0.9) == ()  # nothing to cross
    answer = estimate(LLAMA, measured(NODE, intra=370e9), Layout(tp=8), TRAINING, tuning=TUNING)
    assert "intra-node bus bandwidth measured: 370 GB/s per GPU (nominal link 450 GB/s)" in answer.assumptions


@pytest.mark.parametrize(
    ("intra", "inter", "field", "words"),
    [
        (0.0, None, "measured_intra_node_bus_bandwidth_bytes_per_s", "must be > 0"),
        (None, -1.0, "measured_inter_node_bus_bandwidth_bytes_per_s", "must be > 0"),
        (901e9, None, "measured_intra_node_bus_bandwidth_bytes_per_s", "(901 GB/s) is above 2 x"),
        (None, 400e9, "measured_inter_node_bus_bandwidth_bytes_per_s", "(400 GB/s) is above 2 x"),
    ],
)
def test_a_measurement_is_positive_and_at_most_twice_its_link(
    intra: float | None, inter: float | None, field: str, words: str
) -> None:
    with pytest.raises(InvalidHardware) as refused:
        measured(NODES, intra=intra, inter=inter)
    assert refused.value.field == field and words in refused.value.message
    assert measured(NODES, intra=900e9, inter=100e9).measured_intra_node_bus_bandwidth_bytes_per_s == 900e9
