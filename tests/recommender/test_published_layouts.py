"""Published training runs (reference/cases/visible.json, kind "throughput").

For each run: our estimator says the published layout fits; the recommender's top layout is, by our
model, at least as fast; TP stays inside a node; PP = 1 when the model fits without it. Where one
source measured several layouts of one job (Korthikanti Tables 4-5), our ranking matches theirs.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from service.catalog.gpus import gpu
from service.catalog.tuning import default_tuning
from service.estimator.estimate import estimate
from service.estimator.types import (
    ClusterSpec,
    Framework,
    Layout,
    MlpKind,
    ModelSpec,
    NormKind,
    PositionEmbedding,
    Precision,
    Recompute,
    TrainingSpec,
)
from service.recommender import Constraints, recommend
from validation.cases import korthikanti_layer_time_s

CASES = Path("/work/shared/reference/cases/visible.json")
if not CASES.exists():  # the shared reference set lives outside the repository
    pytest.skip("reference cases not available", allow_module_level=True)
BY_ID: dict[str, dict[str, Any]] = {c["id"]: c for c in json.loads(CASES.read_text())}

# id -> (micro-batch, recompute, sequence parallel, virtual stages, framework, zero, precision)
# Narayanan: sc21 run_table_1.sh; Korthikanti: Table 3; Megatron-Core H100: README (micro-batch
# not stated: 1; --overlap-* and --tp-comm-overlap on); BLOOM: chronicles-prequel (Megatron-DeepSpeed).
PUBLISHED: dict[str, tuple[int, Recompute, bool, int, Framework, int, Precision]] = {
    "narayanan-table1-1.7B": (16, Recompute.FULL, False, 1, Framework.MEGATRON, 0, Precision.FP16),
    "narayanan-table1-18B": (8, Recompute.FULL, False, 1, Framework.MEGATRON, 0, Precision.FP16),
    "narayanan-table1-145B": (2, Recompute.FULL, False, 2, Framework.MEGATRON, 0, Precision.FP16),
    "korthikanti-table5-22B": (4, Recompute.SELECTIVE, True, 1, Framework.MEGATRON, 0, Precision.FP16),
    "megatron-h100-weak-scaling-1.7B": (1, Recompute.NONE, False, 1, Framework.MEGATRON, 1, Precision.BF16),
    "megatron-h100-weak-scaling-32B": (
        1,
        Recompute.SELECTIVE,
        True,
        1,
        Framework.MEGATRON,
        1,
        Precision.BF16,
    ),
    "megatron-h100-weak-scaling-177B": (
        1,
        Recompute.SELECTIVE,
        True,
        1,
        Framework.MEGATRON,
        1,
        Precision.BF16,
    ),
    "bloom-prequel-bf16-20B-8gpu": (1, Recompute.FULL, True, 1, Framework.DEEPSPEED, 1, Precision.BF16),
}


def _model(case: dict[str, Any]) -> ModelSpec:
    m = case["model"]
    hidden, heads = m["hidden"], m["heads"]
    gpt: dict[str, Any] = {
        "mlp": MlpKind.GELU,
        "norm": NormKind.LAYERNORM,
        "qkv_bias": True,
        "attn_out_bias": True,
        "mlp_bias": True,
    }
    if case["id"].startswith("bloom"):
        return ModelSpec(
            name=case["id"],
            num_layers=m["layers"],
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=heads,
            ffn_hidden_size=4 * hidden,
            vocab_size=250_680,
            family="bloom",
            position_embedding=PositionEmbedding.ALIBI,
            embedding_norm=True,
            tied_embeddings=True,
            **gpt,
        )
    learned = (
        PositionEmbedding.LEARNED if not case["id"].startswith("megatron-h100") else PositionEmbedding.ROPE
    )
    return ModelSpec(
        name=case["id"],
        num_layers=m["layers"],
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=m.get("ffn", 4 * hidden),
        vocab_size=m.get("vocab", 51200),
        max_position_embeddings=m["seq_len"],
        family="gpt2",
        position_embedding=learned,
        tied_embeddings=True,
        **gpt,
    )


def _cluster(case: dict[str, Any]) -> ClusterSpec:
    h100 = "H100" in case["cluster"]["gpu"]
    g = gpu("h100-sxm-80gb" if h100 else "a100-sxm-80gb")
    gpus = case["cluster"]["gpus"]
    # Selene: 8 x 200 Gb/s HDR per 8 GPUs = 25e9 B/s per GPU; H100 systems 8 x 400 Gb/s = 50e9
    return ClusterSpec(
        gpu=g,
        num_nodes=max(1, gpus // 8),
        gpus_per_node=min(8, gpus),
        intra_node_bandwidth_bytes_per_s=g.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=50e9 if h100 else 25e9,
    )


def _published(case: dict[str, Any]) -> tuple[ModelSpec, ClusterSpec, TrainingSpec, Layout]:
    b, recompute, sp, v, framework, zero, precision = PUBLISHED[case["id"]]
    t = case["training"]
    training = TrainingSpec(
        seq_len=case["model"]["seq_len"], global_batch_size=t["global_batch"], precision=precision
    )
    megatron = framework is Framework.MEGATRON
    layout = Layout(
        framework=framework,
        dp=t.get("dp", 1),
        tp=t["tp"],
        pp=t["pp"],
        micro_batch_size=b,
        recompute=recompute,
        sequence_parallel=sp,
        virtual_pipeline_stages=v,
        zero_stage=zero,
        tp_comm_overlap=megatron and sp and case["id"].startswith("megatron-h100"),
        overlap_grad_reduce=True if case["id"].startswith("megatron-h100") else None,
    )
    return _model(case), _cluster(case), training, layout


@pytest.mark.parametrize("case_id", sorted(PUBLISHED))
def test_published_layout_fits_and_recommender_is_at_least_as_fast(case_id: str) -> None:
    model, cluster, training, layout = _published(BY_ID[case_id])
    tuning = default_tuning()
    published = estimate(model, cluster, layout, training, tuning=tuning, with_limits=False)
    assert published.fits, published.warnings
    result = recommend(
        model,
        cluster,
        training,
        Constraints(min_headroom_fraction=0.0, top_k=1),
        tuning,
        with_suggestions=False,
    )
    assert result.recommended is not None and result.recommended.estimate.time is not None
    assert published.time is not None
    best = result.recommended
    assert best.estimate.time is not None
    assert best.estimate.time.tokens_per_s >= published.time.tokens_per_s * (1 - 1e-3)
    assert best.layout.tp <= cluster.gpus_per_node  # TP inside a node
    if layout.pp == 1:  # the model fits without a pipeline: so does our pick
        assert best.layout.pp == 1


def test_korthikanti_table4_pairs_we_agree_on() -> None:
    # SP alone is fastest; more recompute is slower; full recompute is slowest by far
    sp = _korthikanti_step_s(Recompute.NONE, True)
    assert sp < _korthikanti_step_s(Recompute.NONE, False)
    assert _korthikanti_step_s(Recompute.SELECTIVE, True) < _korthikanti_step_s(Recompute.SELECTIVE, False)
    assert _korthikanti_step_s(Recompute.SELECTIVE, False) < _korthikanti_step_s(Recompute.FULL, False)


def _korthikanti_step_s(recompute: Recompute, sp: bool, full_layer_count: int = 48) -> float:
    case = BY_ID["korthikanti-table5-22B"]
    model, cluster, training, _ = _published(case)
    layout = Layout(
        framework=Framework.MEGATRON, tp=8, micro_batch_size=4, recompute=recompute, sequence_parallel=sp
    )
    est = estimate(model, cluster, layout, training, tuning=default_tuning(), with_limits=False)
    assert est.time is not None
    return est.time.step_s


def test_korthikanti_table5_ranking() -> None:
    # measured: present work (SP + selective) 1.10 s per iteration < full recompute 1.42 s
    assert _korthikanti_step_s(Recompute.SELECTIVE, True) < _korthikanti_step_s(Recompute.FULL, False)


def test_korthikanti_table4_ranking() -> None:
    # measured per-layer forward+backward (Table 4, eager attention, tp 8, micro-batch 4):
    # SP 19.0 < baseline 19.6 < sel+SP 20.3 < sel 20.9 < full 27.2 ms
    measured = [
        (True, Recompute.NONE),
        (False, Recompute.NONE),
        (True, Recompute.SELECTIVE),
        (False, Recompute.SELECTIVE),
        (False, Recompute.FULL),
    ]
    ours = sorted(measured, key=lambda cfg: korthikanti_layer_time_s(*cfg))
    assert ours == measured


def _nodes_of_8(name: str, nodes: int, inter_bytes_per_s: float) -> ClusterSpec:
    g = gpu(name)
    return ClusterSpec(
        gpu=g,
        num_nodes=nodes,
        gpus_per_node=8,
        intra_node_bandwidth_bytes_per_s=g.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=inter_bytes_per_s,
    )


def test_published_uneven_pipelines_estimate() -> None:
    # BLOOM-176B trained 70 layers on PP12 (TP4 PP12 DP8 on 48 nodes of A100-80GB, bigscience tr11;
    # stages 5, 6 x 10, 5); Llama-3.1-405B 126 layers on PP16 (TP8 CP1 PP16 DP128, Llama 3 Table 4;
    # stages 7, 8 x 14, 7). Both used to be refused (num_layers % pp != 0).
    from service.catalog.models import model

    bloom = estimate(
        model("bloom-176b").spec,
        _nodes_of_8("a100-sxm-80gb", 48, 12.5e9),
        Layout(
            framework=Framework.MEGATRON,
            dp=8,
            tp=4,
            pp=12,
            sequence_parallel=True,
            zero_stage=1,
            recompute=Recompute.FULL,
            micro_batch_size=2,
        ),
        TrainingSpec(seq_len=2048, global_batch_size=2048),
        tuning=default_tuning(),
    )
    assert bloom.fits and bloom.time is not None
    assert any("layers per stage 5, 6 x 10, 5" in note for note in bloom.assumptions)
    meta = estimate(
        model("llama-3.1-405b").spec,
        _nodes_of_8("h100-sxm-80gb", 2048, 50e9),
        Layout(
            framework=Framework.MEGATRON,
            dp=128,
            tp=8,
            pp=16,
            sequence_parallel=True,
            zero_stage=1,
            recompute=Recompute.FULL,
            virtual_pipeline_stages=8,
        ),
        TrainingSpec(seq_len=8192, global_batch_size=2048),
        tuning=default_tuning(),
    )
    assert meta.fits and meta.time is not None
    # 128 virtual stages: the first holds only the embedding, the last only the loss
    assert any("layers per stage 0, 1 x 126, 0" in note for note in meta.assumptions)


def test_405b_plan_on_16384_h100_is_as_fast_as_metas_layout() -> None:
    """Llama 3 paper Table 4: Llama-3.1-405B on 16,384 H100 (TP8 CP1 PP16 DP128, 8K sequences, 16M
    tokens per batch) at 400 TFLOP/s per GPU, 6.689 s a step (validation/data/published_runs.json,
    llama3paper-t4-405b-h100x16384-tp8pp16dp128). Meta's layout as §3.3.2 describes it: no
    activation checkpointing ("we could pre-train Llama 3 on sequences of 8K tokens without
    activation checkpointing"), and V = 8 virtual stages per rank, since "the first model chunk on the
    first stage has only the embedding": 126 layers + embedding + loss = 128 units over 16 x V chunks
    leaves a chunk of one unit only at V = 8. The search, which now tries every pp, must recommend a
    layout within 10% of the tokens/s our model gives that layout, and within 10% of the measured
    tokens/s. Megatron's memory for those degrees (full fp32 main gradients under ZeRO-1) does not fit
    80 GB without recompute; Meta's FSDP sharded the gradients too and freed each stage's input and
    output tensors early, so the layout's speed is compared whether or not it fits our Megatron
    memory, as the paper says it ran. Meta reduce-scattered the gradients in fp32 (§3.3.4), where the
    search's Megatron layouts take NVIDIA's recipes' bf16 buffer: against the measurement, both are
    estimated with fp32 gradients, as Meta ran them."""
    from service.catalog.models import model

    spec = model("llama-3.1-405b").spec
    cluster = _nodes_of_8("h100-sxm-80gb", 2048, 50e9)  # 400 Gb/s RoCE per GPU (paper §3.3.1)
    training = TrainingSpec(seq_len=8192, global_batch_size=2048)
    tuning = default_tuning()
    plan = recommend(spec, cluster, training, Constraints(), tuning)
    assert plan.recommended is not None and plan.recommended.estimate.time is not None
    ours = plan.recommended.estimate.time.tokens_per_s
    metas_layout = Layout(
        framework=Framework.MEGATRON, dp=128, tp=8, pp=16, sequence_parallel=True, zero_stage=1,
        recompute=Recompute.NONE, virtual_pipeline_stages=8, tp_comm_overlap=True,
        overlap_grad_reduce=True,
    )  # fmt: skip
    metas = estimate(spec, cluster, metas_layout, training, tuning=tuning)
    assert any("layers per stage 0, 1 x 126, 0" in note for note in metas.assumptions)
    assert metas.time is not None
    assert abs(ours - metas.time.tokens_per_s) / metas.time.tokens_per_s <= 0.10
    measured = 2048 * 8192 / 6.689
    for layout in (metas_layout, plan.recommended.layout):
        as_meta_ran = estimate(spec, cluster, dataclasses.replace(layout, grad_reduce_in_fp32=True), training,
                               tuning=tuning)  # fmt: skip
        assert as_meta_ran.time is not None
        assert abs(as_meta_ran.time.tokens_per_s - measured) / measured <= 0.10, layout
    # and no layout of Meta's degrees that fits our Megatron memory (some recompute) beats the plan
    megatrons = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    for virtual, recompute in itertools.product((1, 2, 4, 8), megatrons):
        layout = dataclasses.replace(metas_layout, recompute=recompute, virtual_pipeline_stages=virtual)
        est = estimate(spec, cluster, layout, training, tuning=tuning)
        if est.fits and est.time is not None:
            assert est.time.tokens_per_s <= ours * 1.01, (virtual, recompute)
