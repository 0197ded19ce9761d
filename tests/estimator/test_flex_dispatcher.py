"""Megatron's flex token dispatcher with the HybridEP backend (``Layout.moe_dispatcher`` flex): the
expected distinct destinations of a token by hand and against enumeration, one dispatch's time by
hand from the bytes each leg carries, never slower than the alltoall dispatcher across nodes, no
second permutation, and the layouts it is refused for."""

from __future__ import annotations

import dataclasses
import itertools
from fractions import Fraction
from math import comb

import pytest

from service.catalog.gpus import gpu
from service.catalog.tuning import default_tuning
from service.estimator.errors import InvalidLayout
from service.estimator.step_time import (
    distinct_groups_reached,
    flex_dispatch_s,
    moe_dispatch_bytes_per_row,
    step_parts,
)
from service.estimator.types import Framework, Layout, ModelSpec, MoeDispatcher, TrainingSpec
from service.estimator.validate import validate_layout
from tests.estimator.helpers import FINE_MOE as FINE
from tests.estimator.helpers import job
from validation.cases import gpu_cluster

H100, A100 = gpu("h100-sxm-80gb"), gpu("a100-sxm-80gb")
TRAINING = TrainingSpec(seq_len=4096, global_batch_size=64)
FLEX = MoeDispatcher.FLEX


def _enumerated(num_experts: int, top_k: int, groups: int) -> Fraction:
    """The mean number of groups a token's k distinct experts fall in, over every choice of them."""
    per_group = num_experts // groups
    choices = list(itertools.combinations(range(num_experts), top_k))
    reached = sum(len({expert // per_group for expert in chosen}) for chosen in choices)
    return Fraction(reached, len(choices))


def test_distinct_groups_reached_by_hand() -> None:
    # 4 experts on 2 nodes ({0, 1}, {2, 3}), top 2: of the 6 pairs, 2 stay on one node and 4 span
    # both, so a token reaches (2 x 1 + 4 x 2) / 6 = 5/3 nodes; the formula: 2 (1 - C(2,2)/C(4,2))
    assert distinct_groups_reached(4, 2, 2) == pytest.approx(5 / 3)
    assert distinct_groups_reached(4, 2, 1) == 1.0  # one node holds every expert
    assert distinct_groups_reached(8, 3, 8) == pytest.approx(3.0)  # one expert a group: k groups
    for num_experts, top_k, groups in ((8, 3, 4), (12, 4, 3), (16, 2, 8), (16, 5, 2)):
        expected = float(_enumerated(num_experts, top_k, groups))
        assert distinct_groups_reached(num_experts, top_k, groups) == pytest.approx(expected)
    # Qwen3-30B-A3B at EP 16 over two nodes: nearly every token reaches both nodes, and 6.6 of the 16
    # GPUs, where the alltoall dispatcher sends 8 copies: 2 (1 - C(64,8)/C(128,8)), 16 (1 - C(120,8)/C(128,8))
    assert distinct_groups_reached(128, 8, 2) == pytest.approx(2 * (1 - comb(64, 8) / comb(128, 8)))
    assert distinct_groups_reached(128, 8, 16) == pytest.approx(16 * (1 - comb(120, 8) / comb(128, 8)))
    assert distinct_groups_reached(128, 8, 16) == pytest.approx(6.5965, abs=1e-4)


def test_one_flex_dispatch_by_hand_across_two_nodes() -> None:
    # Megatron, EP 16 over two nodes of 8 H100 (NVLink 450 GB/s, NIC 50 GB/s per GPU), capacity 1.0
    # (so the busiest rank takes exactly the mean): 4096 tokens of 2048 bf16 values a rank
    c = gpu_cluster(H100, 16, 50e9)
    layout = Layout(framework=Framework.MEGATRON, dp=16, ep=16, zero_stage=1, moe_capacity_factor=1.0)
    layout = dataclasses.replace(layout, moe_dispatcher=FLEX)
    j = job(FINE, c, TRAINING)
    tokens, token_bytes = 4096, 2048 * 2
    tuning = default_tuning()
    # NVLink: the rank receives each token once from every rank that routes one of its experts here
    received = tokens * distinct_groups_reached(128, 8, 16) * token_bytes
    intra_s = received / (450e9 * tuning.flex_intra_node_efficiency)
    # network: each token once to the other node, when one of its experts is there
    sent = tokens * distinct_groups_reached(128, 8, 2) / 2 * token_bytes
    inter_s = sent / (50e9 * 0.573)  # HybridEP's 2-node figure (tuning.toml [moe_dispatch])
    assert inter_s > intra_s
    assert flex_dispatch_s(j, layout, tokens) == pytest.approx(max(intra_s, inter_s))
    # on one node only the NVLink leg is left
    one_node = dataclasses.replace(layout, dp=8, ep=8)
    j8 = job(FINE, gpu_cluster(H100, 8, 50e9), TRAINING)
    received8 = tokens * distinct_groups_reached(128, 8, 8) * token_bytes
    expected8 = received8 / (450e9 * tuning.flex_intra_node_efficiency)
    assert flex_dispatch_s(j8, one_node, tokens) == pytest.approx(expected8)


@pytest.mark.parametrize("gpus", [16, 32, 64])
@pytest.mark.parametrize("top_k", [2, 8])
def test_flex_is_never_slower_than_alltoall_across_nodes(gpus: int, top_k: int) -> None:
    # the EP group spans 2, 4 or 8 nodes: the alltoall dispatcher sends top_k copies of a token at
    # NCCL's efficiency, flex one per destination node at HybridEP's
    model = dataclasses.replace(FINE, moe=dataclasses.replace(FINE.moe, top_k=top_k))
    c = gpu_cluster(H100, gpus, 50e9)
    training = dataclasses.replace(TRAINING, global_batch_size=4 * gpus)
    alltoall = Layout(framework=Framework.MEGATRON, dp=gpus, ep=gpus, zero_stage=1)
    flex = dataclasses.replace(alltoall, moe_dispatcher=FLEX)
    validate_layout(model, c, flex, training)
    before = step_parts(job(model, c, training), alltoall).ep_comm_s
    after = step_parts(job(model, c, training), flex).ep_comm_s
    assert 0.0 < after < before


def test_flex_has_no_second_permutation() -> None:
    # alltoall sorts the received rows by local expert (read + write 2 x 2h bytes, forward and
    # backward); HybridEP hands them to the experts in order
    c = gpu_cluster(H100, 8, 50e9)
    layout = Layout(framework=Framework.MEGATRON, dp=8, ep=8, zero_stage=1)
    j = job(FINE, c, TRAINING)
    alltoall = moe_dispatch_bytes_per_row(j, layout)
    flex = moe_dispatch_bytes_per_row(j, dataclasses.replace(layout, moe_dispatcher=FLEX))
    assert alltoall - flex == 2 * 2 * 2 * 2048


@pytest.mark.parametrize(
    ("layout", "model", "cluster", "rule"),
    [
        # Megatron's dispatcher only
        (Layout(framework=Framework.FSDP, dp=8, ep=8, zero_stage=3), FINE, 8, "moe_dispatcher"),
        (Layout(framework=Framework.DEEPSPEED, dp=8, ep=8, zero_stage=2), FINE, 8, "moe_dispatcher"),
        # nothing to dispatch: a dense model, or ep 1
        (
            Layout(framework=Framework.MEGATRON, dp=8, zero_stage=1),
            dataclasses.replace(FINE, moe=None),
            8,
            "unused",
        ),
        (Layout(framework=Framework.MEGATRON, dp=8, zero_stage=1), FINE, 8, "unused"),
        # expert tensor parallelism: dispatched over etp x ep, not modelled
        (
            Layout(framework=Framework.MEGATRON, dp=4, tp=2, ep=4, sequence_parallel=True, zero_stage=1),
            FINE,
            8,
            "moe_dispatcher",
        ),
    ],
)
def test_flex_is_refused_where_megatron_or_the_model_has_none(
    layout: Layout, model: ModelSpec, cluster: int, rule: str
) -> None:
    c = gpu_cluster(H100, cluster, 50e9)
    with pytest.raises(InvalidLayout) as refused:
        validate_layout(model, c, dataclasses.replace(layout, moe_dispatcher=FLEX), TRAINING)
    assert refused.value.field == "moe_dispatcher" and refused.value.rule == rule
    validate_layout(model, c, layout, TRAINING)  # the same layout with the alltoall dispatcher runs


def test_flex_is_refused_off_hopper_and_blackwell() -> None:
    layout = Layout(framework=Framework.MEGATRON, dp=8, ep=8, zero_stage=1, moe_dispatcher=FLEX)
    validate_layout(FINE, gpu_cluster(H100, 8, 50e9), layout, TRAINING)
    validate_layout(FINE, gpu_cluster(gpu("b200-sxm-180gb"), 8, 50e9), layout, TRAINING)
    with pytest.raises(InvalidLayout) as refused:
        validate_layout(FINE, gpu_cluster(A100, 8, 25e9), layout, TRAINING)
    assert refused.value.field == "moe_dispatcher" and "ga100" in refused.value.message


def test_flex_is_refused_where_a_nodes_gpus_share_no_nvlink() -> None:
    """HybridEP's intra-node leg is NVLink: an H100 PCIe node (its GPUs joined by PCIe alone) is
    refused, as the same die over NVLink is not; a node of one GPU has no intra-node leg."""
    layout = Layout(framework=Framework.MEGATRON, dp=8, ep=8, zero_stage=1, moe_dispatcher=FLEX)
    pcie = gpu("h100-pcie-80gb")
    assert pcie.chip == "gh100"
    with pytest.raises(InvalidLayout) as refused:
        validate_layout(FINE, gpu_cluster(pcie, 8, 50e9), layout, TRAINING)
    assert refused.value.field == "moe_dispatcher" and "NVLink" in refused.value.message
    one_per_node = dataclasses.replace(gpu_cluster(pcie, 8, 50e9), num_nodes=8, gpus_per_node=1)
    validate_layout(FINE, one_per_node, layout, TRAINING)
