"""Candidate generation rules, and the fast evaluator equal to the estimator."""

from __future__ import annotations

import itertools
import random

import pytest

from service.catalog.efficiency import default_efficiency
from service.catalog.gpus import gpu
from service.catalog.models import model
from service.estimator.errors import InvalidLayout
from service.estimator.memory import memory_estimate
from service.estimator.step_time import time_estimate
from service.estimator.types import (
    Attention,
    ClusterSpec,
    Framework,
    Layout,
    Method,
    Offload,
    Recompute,
    TrainingSpec,
)
from service.estimator.validate import validate_layout
from service.recommender.fast import Evaluator
from service.recommender.space import (
    RejectionLog,
    Structure,
    divisors,
    gpu_counts,
    make_layout,
    micro_batch_sizes,
    shardings,
    structures,
    virtual_stages,
)


def cluster(name: str = "h100-sxm-80gb", nodes: int = 1, per_node: int = 8) -> ClusterSpec:
    g = gpu(name)
    return ClusterSpec(
        gpu=g,
        num_nodes=nodes,
        gpus_per_node=per_node,
        intra_node_bandwidth_bytes_per_s=g.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=50e9,
    )


def test_divisors() -> None:
    assert divisors(12) == (1, 2, 3, 4, 6, 12)
    assert divisors(1) == (1,)


def test_gpu_counts_are_node_multiples_past_one_node() -> None:
    counts = gpu_counts(cluster(nodes=4))
    assert counts == (1, 2, 4, 8, 16, 24, 32)
    assert gpu_counts(cluster(nodes=4), max_gpus=20) == (1, 2, 4, 8, 16)


def test_structures_respect_the_rules() -> None:
    # Llama-3.1-405B: 128 heads, 8 kv heads, 126 layers; 16 nodes of 8
    spec = model("llama-3.1-405b").spec
    training = TrainingSpec(seq_len=8192, global_batch_size=512)
    log = RejectionLog()
    found = list(structures(spec, cluster(nodes=16), training, 128, log))
    assert found
    for s in found:
        assert s.dp * s.tp * s.pp * s.cp == 128
        assert s.tp <= 8 and spec.num_kv_heads % s.tp == 0
        assert spec.num_layers % s.pp == 0  # 126 = 2 x 63: pp in {1, 2}
        assert training.global_batch_size % s.dp == 0
    assert {s.pp for s in found} == {1, 2}
    assert log.groups["invalid: tp_node"].count > 0
    assert "num_layers (126) % pp (4)" in log.groups["invalid: pp_layers"].detail


def test_shardings_follow_the_capability_table() -> None:
    s = Structure(gpus=16, dp=2, tp=4, pp=2, cp=1, ep=1)
    megatron, missing = shardings(Framework.MEGATRON, s, offload=False)
    assert {sh.zero_stage for sh in megatron} == {0, 1}
    assert "megatron does not support zero_stage 3" in missing
    deepspeed, missing = shardings(Framework.DEEPSPEED, s, offload=False)
    assert {sh.zero_stage for sh in deepspeed} == {0, 1}  # ZeRO-2/3 are incompatible with PP
    assert "deepspeed does not support zero_stage 2 with pp > 1" in missing
    fsdp, _ = shardings(Framework.FSDP, Structure(gpus=8, dp=8, tp=1, pp=1, cp=1, ep=1), offload=True)
    # FSDP offloads parameters and optimizer together, FULL_SHARD only
    assert all(sh.offload_params is sh.offload_optimizer for sh in fsdp)
    assert {sh.zero_stage for sh in fsdp if sh.offloads} == {3}


def test_interleaving_and_micro_batches() -> None:
    spec = model("llama-2-7b").spec  # 32 layers
    assert virtual_stages(spec, Framework.DEEPSPEED, 4) == (1,)
    assert virtual_stages(spec, Framework.MEGATRON, 4) == (1, 2, 4, 8)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    s = Structure(gpus=16, dp=4, tp=1, pp=4, cp=1, ep=1)
    assert micro_batch_sizes(training, s, 1, False) == (1, 2, 4, 8, 16)
    assert micro_batch_sizes(training, s, 2, False) == (1, 2, 4)  # 16 / b micro-batches % pp == 0


def _sample_layouts(nodes: int, moe: bool) -> list[Layout]:
    out = []
    for fw, tp, pp, zero, recompute, off in itertools.product(
        list(Framework), (1, 8), (1, 2), (0, 1, 3), list(Recompute), (Offload.NONE, Offload.CPU)
    ):
        dp = nodes * 8 // (tp * pp)
        out.append(
            Layout(
                framework=fw,
                dp=dp,
                tp=tp,
                pp=pp,
                ep=8 if moe and dp % 8 == 0 else 1,
                zero_stage=zero,
                recompute=recompute,
                sequence_parallel=tp > 1,
                virtual_pipeline_stages=2 if pp > 1 and fw is not Framework.DEEPSPEED else 1,
                micro_batch_size=2,
                offload_optimizer=off,
                offload_params=off if zero == 3 else Offload.NONE,
                tp_comm_overlap=fw is Framework.MEGATRON and tp > 1,
            )
        )
    return out


@pytest.mark.parametrize(
    ("name", "nodes", "attention"),
    [
        ("llama-3-8b", 2, Attention.FLASH),
        ("mixtral-8x7b", 4, Attention.FLASH),
        ("llama-2-7b", 2, Attention.EAGER),
    ],
)
def test_fast_evaluator_equals_the_estimator(name: str, nodes: int, attention: Attention) -> None:
    # eager attention exercises the s x s terms (stored scores, selective recompute traffic)
    spec = model(name).spec
    c = cluster(nodes=nodes)
    training = TrainingSpec(seq_len=4096, global_batch_size=256, attention=attention)
    curve = default_efficiency()
    ev = Evaluator(spec, c, training, curve)
    for layout in _sample_layouts(nodes, spec.moe is not None)[::3]:
        assert ev.memory(layout) == memory_estimate(spec, c, layout, training), layout
        assert ev.time(layout) == time_estimate(spec, c, layout, training, None, curve), layout


def _shared_key_layouts(moe: bool) -> list[Layout]:
    # 8 and 16 GPUs split so that many layouts share the Evaluator's memo keys: (dp, cp) pairs with
    # the same ZeRO group dp x cp, every sharding over the same structure, micro-batch and recompute
    # over the same sharding, Megatron's TP overlap on and off, experts split or not.
    out = []
    for (dp, cp), tp, pp, b, recompute, fw, zero, ep in itertools.product(
        ((8, 1), (4, 2), (2, 1), (1, 2)),
        (1, 2),
        (1, 2, 4),
        (1, 4),
        list(Recompute),
        list(Framework),
        (0, 1, 3),
        (1, 2) if moe else (1,),
    ):
        if dp * cp * tp * pp not in (8, 16) or (dp * cp) % ep:
            continue
        out.append(
            Layout(
                framework=fw,
                dp=dp,
                tp=tp,
                pp=pp,
                cp=cp,
                ep=ep,
                zero_stage=zero,
                recompute=recompute,
                micro_batch_size=b,
                sequence_parallel=tp > 1,
                tp_comm_overlap=fw is Framework.MEGATRON and tp > 1,
                offload_optimizer=Offload.CPU if zero == 3 and b == 4 else Offload.NONE,
                virtual_pipeline_stages=2 if pp == 2 and fw is Framework.MEGATRON else 1,
            )
        )
    return out


@pytest.mark.parametrize(("name", "step"), [("llama-3-8b", 2), ("mixtral-8x7b", 5)])
def test_fast_evaluator_memo_hits_equal_the_estimator(name: str, step: int) -> None:
    # The memo keys leave out layout fields on purpose; a shuffled order makes each key's first
    # layout a different one, so a field wrongly left out shows up as a mismatch.
    spec = model(name).spec
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    curve = default_efficiency()
    layouts = _shared_key_layouts(spec.moe is not None)
    random.Random(4).shuffle(layouts)
    evaluators = {n: Evaluator(spec, cluster(nodes=n // 8), training, curve) for n in (8, 16)}
    for layout in layouts[::step]:
        ev = evaluators[layout.world_size]
        c = ev.cluster
        assert ev.memory(layout) == memory_estimate(spec, c, layout, training), layout
        assert ev.time(layout) == time_estimate(spec, c, layout, training, None, curve), layout
        floor = ev.floor_s(layout)
        exact = ev.time(layout).breakdown
        assert floor <= (exact.step_s - exact.pp_bubble_s) * (1 + 1e-12), layout


@pytest.mark.parametrize(
    ("name", "nodes", "training"),
    [
        ("llama-2-7b", 1, TrainingSpec(seq_len=4096, global_batch_size=256)),
        ("mixtral-8x7b", 2, TrainingSpec(seq_len=4096, global_batch_size=64)),
        ("llama-3-8b", 2, TrainingSpec(seq_len=8192, global_batch_size=64, method=Method.LORA)),
        ("llama-2-13b", 2, TrainingSpec(seq_len=2048, global_batch_size=64, attention=Attention.EAGER)),
    ],
)
def test_the_sharding_does_not_change_a_familys_validity(
    name: str, nodes: int, training: TrainingSpec
) -> None:
    # recommender._dominated caches whether a family's optimistic layout (no recompute, largest
    # micro-batch) is valid per (structure, framework, interleaving): shardings() must only yield
    # what the framework allows, whatever the structure.
    spec, c = model(name).spec, cluster(nodes=nodes)
    for s in structures(spec, c, training, c.world_size, RejectionLog()):
        for framework in Framework:
            options, _ = shardings(framework, s, offload=True)
            for virtual in virtual_stages(spec, framework, s.pp):
                sizes = micro_batch_sizes(training, s, virtual, s.tp > 1)
                if not sizes:
                    continue
                verdicts = set()
                for sh in options:
                    try:
                        validate_layout(
                            spec, c, make_layout(s, sh, Recompute.NONE, virtual, sizes[-1]), training
                        )
                        verdicts.add("valid")
                    except InvalidLayout as error:
                        verdicts.add(f"invalid: {error.rule}")
                assert len(verdicts) <= 1, (s, framework, virtual, verdicts)
