"""FLOPs per step: a hand-computed tiny model, the papers' closed forms, and monotonic properties."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.catalog.models import model as catalog_model
from service.estimator import flops
from service.estimator.params import LayerKind, is_moe_layer, parameter_counts
from service.estimator.types import (
    Attention,
    AttentionKind,
    Method,
    ModelSpec,
    MoESpec,
    Recompute,
    TrainingSpec,
)
from validation.cases import gpt

TINY = ModelSpec(
    name="tiny",
    num_layers=1,
    hidden_size=4,
    num_attention_heads=2,
    num_kv_heads=1,  # GQA: k and v are 2 wide (head_dim 2)
    ffn_hidden_size=8,
    vocab_size=10,
)
TINY_TRAINING = TrainingSpec(seq_len=3, global_batch_size=2)


def test_tiny_model_by_hand() -> None:
    # h=4, q_size=4, kv_size=2, ffn=8 (SwiGLU: 3 matrices), V=10, s=3, B=2 -> 6 tokens per step
    assert flops.attention_projection_flops(TINY) == 96  # 2*(4*4 + 2*4*2 + 4*4) = 2*48
    assert flops.attention_core_flops(TINY, 3) == 48  # the square: 4*s*q_size = 4*3*4
    assert flops.mlp_flops(TINY, 8) == 192  # 2*3*4*8
    assert flops.logits_flops(TINY) == 80  # 2*4*10
    # the causal triangle: queries see 1, 2, 3 keys, 2 on average: 2 x 2 x (q + v = 8) = 32
    assert flops.layer_core_causal_flops(TINY, LayerKind(moe=False), 3) == 32
    # forward per token 96+32+192+80 = 400; training 3x = 1200; x 6 tokens = 7200
    assert flops.model_flops_per_step(TINY, TINY_TRAINING, fused_experts=True) == 7200
    # full recompute: one more forward of the layer, 96+32+192 = 320 per token -> +1920
    assert (
        flops.hardware_flops_per_step(TINY, TINY_TRAINING, Recompute.FULL, fused_experts=True) == 7200 + 1920
    )
    # selective: attention core only, 32 per token -> +192
    assert (
        flops.hardware_flops_per_step(TINY, TINY_TRAINING, Recompute.SELECTIVE, fused_experts=True)
        == 7200 + 192
    )
    assert flops.hardware_flops_per_step(TINY, TINY_TRAINING, Recompute.NONE, fused_experts=True) == 7200
    # eager attention executes the whole square, 48 per token: 3 passes x 16 more x 6 tokens = +288,
    # and its recompute redoes the square (+288 rather than +192); model FLOPs stay the triangle's
    eager = dataclasses.replace(TINY_TRAINING, attention=Attention.EAGER)
    assert flops.model_flops_per_step(TINY, eager, fused_experts=True) == 7200
    assert flops.hardware_flops_per_step(TINY, eager, Recompute.NONE, fused_experts=True) == 7488
    assert flops.hardware_flops_per_step(TINY, eager, Recompute.SELECTIVE, fused_experts=True) == 7488 + 288


def test_causal_core_one_layer_s4_exactly() -> None:
    # TINY (q + v = 8), one sequence of s = 4: queries 0..3 see 1, 2, 3, 4 keys = 10 (query, key)
    # pairs of the square's 16; each pair costs 2 (QK^T) + 2 (AV) FLOPs per unit of width, so the
    # forward core is 2 x 10 x 8 = 160 FLOPs per sequence (the square's 2 x 16 x 8 = 256), 40 per token
    kind, training = LayerKind(moe=False), TrainingSpec(seq_len=4, global_batch_size=1)
    assert flops.layer_core_causal_flops(TINY, kind, 4) == 40
    assert flops.layer_core_flops(TINY, kind, 4) == 64
    # the step: weights 3 x (96 + 192) + core 3 x 40 + logits 3 x 80 = 864 + 120 + 240 = 1224 per token,
    # x 4 tokens = 4896 (the square would count 3 x 64 = 192 for the core: 5184)
    assert flops.model_flops_per_token(TINY, training, True) == 1224
    assert flops.model_flops_per_step(TINY, training, fused_experts=True) == 4896
    assert flops.hardware_flops_per_step(TINY, training, Recompute.NONE, fused_experts=True) == 4896
    # a sliding window of 2: queries see 1, 2, 2, 2 keys = 7 pairs -> 2 x 7 x 8 / 4 = 28 per token
    sliding = dataclasses.replace(
        TINY, sliding_window=2, layer_types=(AttentionKind.SLIDING,) * TINY.num_layers
    )
    assert (
        flops.layer_core_causal_flops(sliding, LayerKind(moe=False, attention=AttentionKind.SLIDING), 4) == 28
    )
    # chunks of 3: 1, 2, 3 | 1 = 7 pairs, 28 per token as well
    chunked = dataclasses.replace(
        TINY, attention_chunk_size=3, layer_types=(AttentionKind.CHUNKED,) * TINY.num_layers
    )
    assert (
        flops.layer_core_causal_flops(chunked, LayerKind(moe=False, attention=AttentionKind.CHUNKED), 4) == 28
    )


def test_tiny_lora_by_hand() -> None:
    training = TrainingSpec(
        seq_len=3, global_batch_size=2, method=Method.LORA, lora_rank=2, lora_targets=("q_proj", "down_proj")
    )
    # adapters: q_proj 2*r*(4+4) = 32, down_proj 2*r*(8+4) = 48 -> 80 forward per token
    assert flops.lora_adapter_flops(TINY, is_moe_layer(TINY, 0), training, fused_experts=True) == 80
    # frozen weights 2x (96+192+80 = 368 -> 736), causal core 3x32 = 96, adapters 3x80 = 240 -> 1072 per token
    assert flops.model_flops_per_token(TINY, training, True) == 1072
    assert flops.model_flops_per_step(TINY, training, fused_experts=True) == 6 * 1072


def test_tiny_moe_by_hand() -> None:
    moe = MoESpec(
        num_experts=4,
        top_k=2,
        expert_ffn_hidden_size=6,
        num_shared_experts=1,
        shared_expert_ffn_hidden_size=8,
        shared_expert_gate=True,
    )
    model = ModelSpec(
        name="tiny-moe",
        num_layers=1,
        hidden_size=4,
        num_attention_heads=2,
        num_kv_heads=1,
        ffn_hidden_size=8,
        vocab_size=10,
        moe=moe,
    )
    # routed 2 x 2*3*4*6 = 288, shared 1 x 2*3*4*8 = 192, router 2*4*4 = 32, shared gate 2*4 = 8 -> 520
    assert flops.moe_flops(model, moe) == 520
    assert flops.layer_matmul_flops(model, is_moe_layer(model, 0)) == 96 + 520


@pytest.mark.parametrize(
    ("layers", "hidden", "heads", "batch"),
    [(48, 6144, 64, 4), (96, 12288, 96, 64), (128, 25600, 160, 512), (24, 2304, 24, 512)],
)
def test_korthikanti_eq7_and_narayanan_eq3_exactly(layers: int, hidden: int, heads: int, batch: int) -> None:
    """The papers count attention's full square, as eager attention executes it: our hardware count
    of eager attention is theirs exactly; the model count (causal triangle) is Eq. 7 less the masked
    half, 6 B L h s (s - 1): per layer and sequence 3 passes x 4 h FLOPs x the s (s - 1) / 2 pairs
    above the diagonal."""
    s, v = 2048, 51200
    model = gpt(layers, hidden, heads, v, s)
    eager = TrainingSpec(seq_len=s, global_batch_size=batch, attention=Attention.EAGER)
    flash = dataclasses.replace(eager, attention=Attention.FLASH)
    b, L, h = batch, layers, hidden
    # Korthikanti Eq. 7: 72 B L s h^2 (1 + s/(6h) + v/(12 h L)), expanded to integers
    eq7 = 72 * b * L * s * h**2 + 12 * b * L * s**2 * h + 6 * b * s * h * v
    assert flops.hardware_flops_per_step(model, eager, Recompute.NONE, fused_experts=True) == eq7
    masked = 6 * b * L * h * s * (s - 1)
    assert (
        flops.model_flops_per_step(model, eager, fused_experts=True)
        == flops.model_flops_per_step(model, flash, fused_experts=True)
        == eq7 - masked
    )
    assert flops.hardware_flops_per_step(model, flash, Recompute.NONE, fused_experts=True) == eq7 - masked
    # Narayanan Eq. 3 (counts the full-recompute forward): 96 B s l h^2 (1 + s/(6h) + V/(16 l h));
    # a flash kernel runs 4 of the 3 + 1 passes' square as the triangle
    eq3 = 96 * b * L * s * h**2 + 16 * b * L * s**2 * h + 6 * b * s * h * v
    assert flops.hardware_flops_per_step(model, eager, Recompute.FULL, fused_experts=True) == eq3
    assert (
        flops.hardware_flops_per_step(model, flash, Recompute.FULL, fused_experts=True)
        == eq3 - masked * 4 // 3
    )
    # Korthikanti Eq. 8 (selective) = 72 B L s h^2 (1 + s/(3h) + ...) adds 12 B L s^2 h over Eq. 7;
    # recomputing QK^T and AV once costs 4 B L s^2 h, so our HFU count is 8 B L s^2 h below Eq. 8
    eq8 = 72 * b * L * s * h**2 + 24 * b * L * s**2 * h + 6 * b * s * h * v
    assert (
        flops.hardware_flops_per_step(model, eager, Recompute.SELECTIVE, fused_experts=True)
        + 8 * b * L * s**2 * h
        == eq8
    )


def test_megatron_num_floating_point_operations_causal_term() -> None:
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py, NVIDIA/Megatron-LM
    d98e8a6) counts a GQA layer's core attention as 3 x 2 x q_proj / 2 x 2 per token per key: the
    square halved, "causal mask (only half of the mask is non-zero)". Ours keeps the diagonal,
    s (s + 1) / 2 pairs rather than s^2 / 2: exactly 3 x 2 x 2 x q_proj / 2 per token more per layer
    (q_size = v_size for a GPT)."""
    s, v, L, h, heads = 4096, 32000, 32, 4096, 32
    model = gpt(L, h, heads, v, s)
    training = TrainingSpec(seq_len=s, global_batch_size=1)
    ours = flops.model_flops_per_token(model, training, True)
    square = flops.model_flops_per_token(model, training, True) + 3 * L * (
        flops.layer_core_flops(model, LayerKind(moe=False), s)
        - flops.layer_core_causal_flops(model, LayerKind(moe=False), s)
    )
    megatron_core = 3 * 2 * h / 2 * 2 * s * L  # standard_self_attn_core_term x seq_length x layers
    megatron = square - 12 * L * h * s + megatron_core
    assert ours - megatron == pytest.approx(6 * L * h)  # the diagonal's other half
    assert ours == pytest.approx(megatron, rel=2e-4)


def test_llama_3_8b_against_megatron_bridges_published_model_flops() -> None:
    """NeMo / Megatron-Bridge print model TFLOP/s with Megatron's count: Llama-3-8B at 8,192 tokens on
    8 H100 (validation/data/published_runs.json, mb2509-l3-8b-h100x8-mfsdp: 725 TFLOP/s per GPU at
    14,079 tokens/s per GPU) is 5.149e10 FLOPs per token. Ours is within 0.3% (they count the
    square's half, s^2 / 2 pairs, we s (s + 1) / 2; neither counts norms); the full square, as PaLM
    and torchtitan count it, would be 12% more."""
    spec = catalog_model("llama-3-8b").spec
    training = TrainingSpec(seq_len=8192, global_batch_size=1)
    published = 725e12 / 14079
    ours = flops.model_flops_per_token(spec, training, True)
    assert ours == pytest.approx(published, rel=3e-3)
    square = ours + 3 * spec.num_layers * (
        flops.layer_core_flops(spec, LayerKind(moe=False), 8192)
        - flops.layer_core_causal_flops(spec, LayerKind(moe=False), 8192)
    )
    assert square / published > 1.12


def test_llama_against_6n_plus_12lhqt() -> None:
    # nanoGPT/PaLM: 6N + 12 L H Q T per token, N without the input embedding (a lookup, no FLOPs)
    llama = ModelSpec(
        name="llama-like",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        ffn_hidden_size=14336,
        vocab_size=128256,
    )
    s = 8192
    counts = parameter_counts(llama)
    n = counts.total - llama.vocab_size * llama.hidden_size
    palm = 6 * n + 12 * llama.num_layers * llama.q_size * s
    # PaLM (App. B) counts attention's full square, 12 L H Q T; we count the causal triangle,
    # 6 L H Q (T + 1): eager attention executes the square, and its hardware count is PaLM's
    eager = TrainingSpec(seq_len=s, global_batch_size=1, attention=Attention.EAGER)
    ours = flops.model_flops_per_token(llama, eager, True)
    assert ours == pytest.approx(palm - 6 * llama.num_layers * llama.q_size * (s - 1), rel=1e-4)
    executed = flops.hardware_flops_per_step(llama, eager, Recompute.NONE, fused_experts=True) / s
    # the only difference is the norms' weights, which 6N counts and we do not
    assert executed == pytest.approx(palm, rel=1e-4)
    assert executed < palm


def test_lora_is_about_two_thirds_of_full() -> None:
    model = gpt(24, 2048, 16)
    full = flops.model_flops_per_step(
        model, TrainingSpec(seq_len=2048, global_batch_size=8), fused_experts=True
    )
    lora = TrainingSpec(
        seq_len=2048, global_batch_size=8, method=Method.LORA, lora_targets=("q_proj", "v_proj")
    )
    ratio = flops.model_flops_per_step(model, lora, fused_experts=True) / full
    # 4/6 for the frozen matmuls, a little more for attention's core (3x) and the adapters
    assert 4 / 6 < ratio < 0.72


@given(
    layers=st.integers(1, 8),
    heads=st.sampled_from([1, 2, 4, 8]),
    head_dim=st.sampled_from([8, 16, 64]),
    seq_len=st.integers(1, 4096),
    batch=st.integers(1, 16),
)
def test_recompute_never_reduces_hardware_flops(
    layers: int, heads: int, head_dim: int, seq_len: int, batch: int
) -> None:
    model = gpt(layers, heads * head_dim, heads, vocab=1000, seq_len=seq_len)
    training = TrainingSpec(seq_len=seq_len, global_batch_size=batch)
    none = flops.hardware_flops_per_step(model, training, Recompute.NONE, fused_experts=True)
    selective = flops.hardware_flops_per_step(model, training, Recompute.SELECTIVE, fused_experts=True)
    full = flops.hardware_flops_per_step(model, training, Recompute.FULL, fused_experts=True)
    assert none == pytest.approx(flops.model_flops_per_step(model, training, fused_experts=True), rel=1e-12)
    assert none < selective < full


@given(
    layers=st.integers(1, 4),
    heads=st.sampled_from([1, 4, 32]),
    head_dim=st.sampled_from([8, 64, 128]),
    seq_len=st.integers(1, 2**20),
    window=st.one_of(st.none(), st.integers(1, 2**16)),
    attention=st.sampled_from(list(Attention)),
)
def test_model_flops_never_exceed_executed_flops(
    layers: int, heads: int, head_dim: int, seq_len: int, window: int | None, attention: Attention
) -> None:
    """MFU <= HFU follows: the triangle is at most what any kernel executes (flash: the same; eager:
    the square, at least the triangle), and the square at most twice the triangle's count."""
    model = gpt(layers, heads * head_dim, heads, vocab=1000, seq_len=seq_len)
    if window is not None:  # every layer sliding; the full layer's core is checked below all the same
        sliding = (AttentionKind.SLIDING,) * layers
        model = dataclasses.replace(model, sliding_window=window, layer_types=sliding)
    training = TrainingSpec(seq_len=seq_len, global_batch_size=1, attention=attention)
    for kind in (LayerKind(moe=False), LayerKind(moe=False, attention=AttentionKind.SLIDING)):
        causal = flops.layer_core_causal_flops(model, kind, seq_len)
        square = flops.layer_core_flops(model, kind, seq_len)
        assert square / 2 < causal <= square
    assert flops.model_flops_per_step(model, training, fused_experts=True) <= flops.hardware_flops_per_step(
        model, training, Recompute.NONE, fused_experts=True
    ) * (1 + 1e-12)


def test_multi_token_prediction_flops_by_hand() -> None:
    # each depth: a layer of the last kind, eh_proj (2h -> h) and another output layer, all trained

    training = TrainingSpec(seq_len=TINY_TRAINING.seq_len, global_batch_size=1)
    mtp = dataclasses.replace(training, mtp_num_layers=1)
    h, v = TINY.hidden_size, TINY.vocab_size
    layer = flops.layer_model_flops(TINY, LayerKind(moe=False), training, fused_experts=True)
    extra = flops.model_flops_per_token(TINY, mtp, True) - flops.model_flops_per_token(TINY, training, True)
    assert extra == layer + 3 * 2 * 2 * h * h + 3 * 2 * h * v


def _lora(targets: tuple[str, ...]) -> TrainingSpec:
    return TrainingSpec(
        seq_len=2048, global_batch_size=8, method=Method.LORA, lora_rank=16, lora_targets=targets
    )


ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_lora_on_fused_experts_runs_no_adapter_per_token_on_them() -> None:
    """Per token, forward: 2 r (in + out) per adapter module. Qwen3-30B-A3B (h 2048, 32 heads and 4 KV
    heads of 128): q 2048->4096, k and v 2048->512, o 4096->2048; peft moves its MLP targets onto the
    fused experts (qwen3_moe), folded into the weight once per micro-batch, so no token runs an MLP
    adapter. GPT-OSS-20B (gpt_oss: not moved) keeps fused experts no target_modules reaches at ep 1;
    under a framework's expert modules (ep > 1) each of its top_k = 4 experts runs three adapters
    (h 2880 -> f 2880). The estimate counted top_k MLP adapters per token in both (review, stop 44)."""
    qwen = catalog_model("qwen3-30b-a3b").spec
    attention = 2 * 16 * ((2048 + 4096) + 2 * (2048 + 512) + (4096 + 2048))
    moe = LayerKind(moe=True)
    assert flops.lora_adapter_flops(qwen, True, _lora(ALL), fused_experts=True) == attention
    assert flops.lora_adapter_flops(qwen, True, _lora(ALL[:4]), fused_experts=True) == attention
    assert flops.layer_training_flops(
        qwen, moe, _lora(ALL), fused_experts=True
    ) == flops.layer_training_flops(qwen, moe, _lora(ALL[:4]), fused_experts=True)
    oss = catalog_model("gpt-oss-20b").spec
    only_attention = flops.lora_adapter_flops(oss, True, _lora(ALL[:4]), fused_experts=True)
    assert flops.lora_adapter_flops(oss, True, _lora(ALL), fused_experts=True) == only_attention
    experts = 4 * 3 * 2 * 16 * (2880 + 2880)
    assert flops.lora_adapter_flops(oss, True, _lora(ALL), fused_experts=False) == only_attention + experts


def test_mla_layers_run_their_own_projections() -> None:
    """DeepSeek's attention is wq_a, wq_b, wkv_a, wkv_b and wo (torchtitan models/deepseek_v3), not
    q/k/v/o of a grouped-query model: per-op AC saved 875 MB of a V3 layer where those save 548, and
    recomputed 1.00 GFLOP a token for 0.61 (architecture review). The latents' projections run whole
    on every TP rank (NoParallel)."""
    from service.catalog.models import model as preset

    v3 = preset("deepseek-v3").spec
    assert v3.mla is not None
    attention = flops.layer_matmuls(v3, False)[:5]
    assert [m.out_features for m in attention] == [1536, 128 * 192, 512 + 64, 128 * (128 + 128), 7168]
    assert [m.replicated for m in attention] == [True, False, True, False, False]
    assert [m.row_parallel for m in attention] == [False, False, False, False, True]
    assert sum(m.flops for m in attention) == flops.mla_projection_flops(v3)
    lite = preset("deepseek-v2-lite").spec  # no q_lora_rank: a plain wq
    assert [m.out_features for m in flops.layer_matmuls(lite, False)[:4]] == [
        16 * 192,
        512 + 64,
        16 * 256,
        2048,
    ]
