"""Candidate generation rules, and the fast evaluator equal to the estimator."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable

import pytest

from service.catalog.efficiency import default_efficiency
from service.catalog.gpus import gpu
from service.catalog.models import model, models
from service.estimator import flops
from service.estimator.errors import InvalidLayout
from service.estimator.memory import host_fits, memory_estimate, memory_fits
from service.estimator.params import is_moe_layer
from service.estimator.step_time import layer_stored_bytes, time_estimate
from service.estimator.types import (
    Attention,
    ClusterSpec,
    Framework,
    Layout,
    Method,
    ModelSpec,
    MoESpec,
    Offload,
    PositionEmbedding,
    Precision,
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


# 12 layers, MoE every 2nd (layers 1, 3, ..., 11): pp 4 puts 1, 2, 1, 2 MoE layers on its stages,
# pp 2 3 and 3. Qwen2-MoE-like shared expert with its gate; 65536 learned positions (67M) make the
# first stage, with one MoE layer, the largest at pp 4 (the last has two).
SPARSE_MOE = ModelSpec(
    name="moe-every-2nd", num_layers=12, hidden_size=1024, num_attention_heads=16, num_kv_heads=4,
    ffn_hidden_size=2816, vocab_size=32000, qkv_bias=True, max_position_embeddings=65536,
    position_embedding=PositionEmbedding.LEARNED,
    moe=MoESpec(
        num_experts=8, top_k=2, expert_ffn_hidden_size=1408, num_shared_experts=1,
        shared_expert_ffn_hidden_size=2816, shared_expert_gate=True, layer_frequency=2,
    ),
)  # fmt: skip

# head_dim 100: 200-byte rows, off the 16-byte alignment, so eager attention's core runs slowed
UNALIGNED_HEADS = dataclasses.replace(model("llama-2-7b").spec, name="head-dim-100", head_dim=100)
_SPECS = {spec.name: spec for spec in (SPARSE_MOE, UNALIGNED_HEADS)}

_ZERO_STAGES = {Framework.MEGATRON: (0, 1), Framework.DEEPSPEED: (0, 1, 2, 3), Framework.FSDP: (0, 2, 3)}

# (framework, dp, tp, pp, cp, v, micro-batch) on 16 GPUs (2 nodes of 8)
_AXIS_STRUCTURES = (
    (Framework.MEGATRON, 4, 2, 2, 1, 2, 1),
    (Framework.MEGATRON, 2, 2, 4, 1, 1, 2),
    (Framework.MEGATRON, 4, 1, 4, 1, 2, 2),
    (Framework.MEGATRON, 4, 2, 1, 2, 1, 2),
    (Framework.DEEPSPEED, 16, 1, 1, 1, 1, 2),
    (Framework.DEEPSPEED, 4, 2, 2, 1, 1, 1),
    (Framework.FSDP, 16, 1, 1, 1, 1, 1),
    (Framework.FSDP, 4, 2, 1, 2, 1, 2),
    (Framework.FSDP, 8, 1, 2, 1, 1, 2),
)


def _axis_variants(global_batch: int) -> list[tuple[str, Callable[[Layout], Layout]]]:
    # the layout flags the recommender's own sample leaves at their defaults
    def ga(lay: Layout) -> Layout:
        return dataclasses.replace(
            lay, gradient_accumulation_steps=global_batch // (lay.micro_batch_size * lay.dp)
        )

    def offload(kind: Offload) -> Callable[[Layout], Layout]:
        return lambda lay: dataclasses.replace(
            lay, offload_optimizer=kind, offload_params=kind if lay.zero_stage == 3 else Offload.NONE
        )

    return [
        ("plain", lambda lay: lay),
        ("nvme", offload(Offload.NVME)),
        ("nvme optimizer", lambda lay: dataclasses.replace(lay, offload_optimizer=Offload.NVME)),
        ("cpu", offload(Offload.CPU)),
        ("activation offload", lambda lay: dataclasses.replace(lay, activation_offload=True)),
        (
            "activation offload + full",
            lambda lay: dataclasses.replace(lay, activation_offload=True, recompute=Recompute.FULL),
        ),
        ("chunked loss", lambda lay: dataclasses.replace(lay, chunked_loss=True)),
        ("hybrid shard", lambda lay: dataclasses.replace(lay, fsdp_hybrid_shard=True)),
        ("overlap on", lambda lay: dataclasses.replace(lay, overlap_grad_reduce=True)),
        ("overlap off", lambda lay: dataclasses.replace(lay, overlap_grad_reduce=False)),
        ("accumulation", ga),
        ("selective", lambda lay: dataclasses.replace(lay, recompute=Recompute.SELECTIVE)),
        (
            "all flags",
            lambda lay: dataclasses.replace(
                ga(offload(Offload.NVME)(lay)),
                activation_offload=True,
                chunked_loss=True,
                fsdp_hybrid_shard=True,
                overlap_grad_reduce=False,
                recompute=Recompute.FULL,
            ),
        ),
    ]


def _axis_layouts(moe: bool, global_batch: int) -> list[tuple[str, Layout]]:
    # every variant on every (structure, zero stage) pair, so each flag meets every framework, split
    # and sharding
    pairs = [(s, z) for s in _AXIS_STRUCTURES for z in _ZERO_STAGES[s[0]]]
    out = []
    for name, variant in _axis_variants(global_batch):
        for (fw, dp, tp, pp, cp, v, b), zero in pairs:
            base = Layout(
                framework=fw, dp=dp, tp=tp, pp=pp, cp=cp, ep=(2 if dp * cp % 2 == 0 else 1) if moe else 1,
                zero_stage=zero, sequence_parallel=tp > 1, virtual_pipeline_stages=v, micro_batch_size=b,
                tp_comm_overlap=fw is Framework.MEGATRON and tp > 1,
            )  # fmt: skip
            out.append((name, variant(base)))
    return out


@pytest.mark.parametrize(
    ("name", "training"),
    [
        ("llama-3-8b", TrainingSpec(seq_len=4096, global_batch_size=64, method=Method.LORA)),
        ("llama-3-8b", TrainingSpec(seq_len=4096, global_batch_size=64, method=Method.QLORA, lora_rank=8)),
        ("llama-3-8b", TrainingSpec(seq_len=2048, global_batch_size=64, precision=Precision.FP32)),
        (
            "llama-2-7b",
            TrainingSpec(
                seq_len=2048, global_batch_size=64, precision=Precision.BF16_PURE, attention=Attention.EAGER
            ),
        ),
        ("moe-every-2nd", TrainingSpec(seq_len=4096, global_batch_size=64)),
        ("moe-every-2nd", TrainingSpec(seq_len=4096, global_batch_size=64, method=Method.LORA)),
        ("head-dim-100", TrainingSpec(seq_len=2048, global_batch_size=64, attention=Attention.EAGER)),
    ],
)
def test_fast_evaluator_equals_the_estimator_on_every_axis(name: str, training: TrainingSpec) -> None:
    # LoRA / QLoRA, fp32 / pure bf16, NVMe offload, activation offload, chunked loss, FSDP hybrid
    # shard, explicit DP overlap and accumulation steps, MoE on every 2nd layer, an unaligned
    # head_dim under eager attention; shuffled, so memo hits come from layouts with other flags.
    spec = _SPECS[name] if name in _SPECS else model(name).spec
    c = cluster(nodes=2)
    curve = default_efficiency()
    ev = Evaluator(spec, c, training, curve)
    layouts = _axis_layouts(spec.moe is not None, training.global_batch_size)
    assert {n for n, _ in layouts} == {n for n, _ in _axis_variants(training.global_batch_size)}
    random.Random(7).shuffle(layouts)
    for _, layout in layouts:
        assert ev.memory(layout) == memory_estimate(spec, c, layout, training), layout
        assert ev.time(layout) == time_estimate(spec, c, layout, training, None, curve), layout


@pytest.mark.parametrize("spec", [model("llama-3-8b").spec, SPARSE_MOE], ids=["dense", "moe-every-2nd"])
def test_fast_evaluator_equals_the_estimator_with_few_micro_batches(spec: ModelSpec) -> None:
    # Interleaved pipelines with m = pp or fewer micro-batches, where Megatron caps the warm-up at
    # all m x v chunks; pp 4 splits SPARSE_MOE's MoE layers 1, 2, 1, 2 over the stages.
    training = TrainingSpec(seq_len=4096, global_batch_size=16)
    c = cluster(nodes=2)
    curve = default_efficiency()
    ev = Evaluator(spec, c, training, curve)
    layouts = []
    for (dp, tp), pp, v, b, recompute in itertools.product(
        ((1, 4), (2, 2), (4, 1)), (2, 4), (1, 2, 3), (1, 2, 4), (Recompute.NONE, Recompute.FULL)
    ):
        if dp * tp * pp > 16 or spec.num_layers % (pp * v):
            continue
        lay = Layout(
            framework=Framework.MEGATRON, dp=dp, tp=tp, pp=pp, ep=2 if spec.moe and dp % 2 == 0 else 1,
            zero_stage=1, recompute=recompute, sequence_parallel=tp > 1, virtual_pipeline_stages=v,
            micro_batch_size=b,
        )  # fmt: skip
        layouts.append(lay)
    assert any(lay.accumulation_steps(16) <= lay.pp and lay.virtual_pipeline_stages > 1 for lay in layouts)
    random.Random(5).shuffle(layouts)
    for layout in layouts:
        explicit = dataclasses.replace(layout, gradient_accumulation_steps=layout.accumulation_steps(16))
        for lay in (layout, explicit):
            assert ev.memory(lay) == memory_estimate(spec, c, lay, training), lay
            assert ev.time(lay) == time_estimate(spec, c, lay, training, None, curve), lay
        # memory_estimate takes explicit steps as given, even a single micro-batch (time rejects it)
        single = dataclasses.replace(layout, gradient_accumulation_steps=1)
        assert ev.memory(single) == memory_estimate(spec, c, single, training), single


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


@pytest.mark.parametrize(
    ("name", "training"),
    [
        ("llama-3-8b", TrainingSpec(seq_len=4096, global_batch_size=64)),
        ("moe-every-2nd", TrainingSpec(seq_len=4096, global_batch_size=64, method=Method.LORA)),
        ("llama-2-7b", TrainingSpec(seq_len=2048, global_batch_size=64, attention=Attention.EAGER)),
    ],
)
def test_fast_evaluator_numbers_equal_the_estimator(name: str, training: TrainingSpec) -> None:
    # The search path's plain numbers (memory_numbers, fits, step_numbers) equal the estimator's
    # totals exactly, on every axis, shuffled, with a host limit that some offloading layouts break.
    spec = SPARSE_MOE if name == SPARSE_MOE.name else model(name).spec
    c = dataclasses.replace(
        cluster(nodes=2), cpu_memory_bytes_per_node=300 * 2**30, nvme_bytes_per_node=2**40
    )
    curve = default_efficiency()
    ev = Evaluator(spec, c, training, curve)
    layouts = [lay for _, lay in _axis_layouts(spec.moe is not None, training.global_batch_size)]
    random.Random(11).shuffle(layouts)
    verdicts = set()
    for layout in layouts:
        memory = memory_estimate(spec, c, layout, training)
        numbers = (memory.per_gpu.total, memory.cpu_per_node_bytes, memory.nvme_per_node_bytes)
        assert ev.memory_numbers(layout) == numbers, layout
        for limit in (memory.per_gpu.total - 1, memory.per_gpu.total, c.gpu.memory_bytes):
            fits = memory.per_gpu.total <= limit and host_fits(memory, c)
            assert ev.fits(layout, limit) == fits, layout
            verdicts.add(fits)
        assert ev.fits(layout, c.gpu.memory_bytes) == memory_fits(memory, c), layout
        step = time_estimate(spec, c, layout, training, None, curve)
        assert ev.step_numbers(layout) == (step.step_s, step.tokens_per_s), layout
    assert verdicts == {True, False}


@pytest.mark.parametrize("name", sorted(models()))
def test_per_layer_quantities_depend_only_on_the_layer_kind(name: str) -> None:
    # the Evaluator computes per-layer FLOPs and stored bytes once per kind (dense, MoE): it relies
    # on the estimator's per-layer functions reading the layer index only through is_moe_layer
    spec = model(name).spec
    training = TrainingSpec(seq_len=2048, global_batch_size=8, attention=Attention.EAGER)
    layout = Layout(tp=2, sequence_parallel=True)
    per_kind: dict[bool, set[tuple[float, ...]]] = {}
    for i in range(spec.num_layers):
        values = (
            flops.layer_training_flops(spec, i, training),
            *(flops.layer_recompute_flops(spec, i, training, r) for r in Recompute),
            layer_stored_bytes(spec, layout, training, i),
        )
        per_kind.setdefault(is_moe_layer(spec, i), set()).add(values)
    assert all(len(values) == 1 for values in per_kind.values())
