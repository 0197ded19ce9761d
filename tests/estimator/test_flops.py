"""FLOPs per step: a hand-computed tiny model, the papers' closed forms, and monotonic properties."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.estimator import flops
from service.estimator.params import is_moe_layer, parameter_counts
from service.estimator.types import (
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
    assert flops.attention_core_flops(TINY, 3) == 48  # 4*s*q_size = 4*3*4
    assert flops.mlp_flops(TINY, 8) == 192  # 2*3*4*8
    assert flops.logits_flops(TINY) == 80  # 2*4*10
    # forward per token 96+48+192+80 = 416; training 3x = 1248; x 6 tokens = 7488
    assert flops.model_flops_per_step(TINY, TINY_TRAINING) == 7488
    # full recompute: one more forward of the layer, 96+48+192 = 336 per token -> +2016
    assert flops.hardware_flops_per_step(TINY, TINY_TRAINING, Recompute.FULL) == 7488 + 2016
    # selective: attention core only, 48 per token -> +288
    assert flops.hardware_flops_per_step(TINY, TINY_TRAINING, Recompute.SELECTIVE) == 7488 + 288
    assert flops.hardware_flops_per_step(TINY, TINY_TRAINING, Recompute.NONE) == 7488


def test_tiny_lora_by_hand() -> None:
    training = TrainingSpec(
        seq_len=3, global_batch_size=2, method=Method.LORA, lora_rank=2, lora_targets=("q_proj", "down_proj")
    )
    # adapters: q_proj 2*r*(4+4) = 32, down_proj 2*r*(8+4) = 48 -> 80 forward per token
    assert flops.lora_adapter_flops(TINY, is_moe_layer(TINY, 0), training) == 80
    # frozen weights 2x (96+192+80 = 368 -> 736), core 3x48 = 144, adapters 3x80 = 240 -> 1120 per token
    assert flops.model_flops_per_token(TINY, training) == 1120
    assert flops.model_flops_per_step(TINY, training) == 6 * 1120


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
    s, v = 2048, 51200
    model = gpt(layers, hidden, heads, v, s)
    training = TrainingSpec(seq_len=s, global_batch_size=batch)
    b, L, h = batch, layers, hidden
    # Korthikanti Eq. 7: 72 B L s h^2 (1 + s/(6h) + v/(12 h L)), expanded to integers
    eq7 = 72 * b * L * s * h**2 + 12 * b * L * s**2 * h + 6 * b * s * h * v
    assert flops.model_flops_per_step(model, training) == eq7
    # Narayanan Eq. 3 (counts the full-recompute forward): 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
    eq3 = 96 * b * L * s * h**2 + 16 * b * L * s**2 * h + 6 * b * s * h * v
    assert flops.hardware_flops_per_step(model, training, Recompute.FULL) == eq3
    # Korthikanti Eq. 8 (selective) = 72 B L s h^2 (1 + s/(3h) + ...) adds 12 B L s^2 h over Eq. 7;
    # recomputing QK^T and AV once costs 4 B L s^2 h, so our HFU count is 8 B L s^2 h below Eq. 8
    eq8 = 72 * b * L * s * h**2 + 24 * b * L * s**2 * h + 6 * b * s * h * v
    assert flops.hardware_flops_per_step(model, training, Recompute.SELECTIVE) + 8 * b * L * s**2 * h == eq8


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
    ours = flops.model_flops_per_token(llama, TrainingSpec(seq_len=s, global_batch_size=1))
    # the only difference is the norms' weights, which 6N counts and we do not
    assert ours == pytest.approx(palm, rel=1e-4)
    assert ours < palm


def test_lora_is_about_two_thirds_of_full() -> None:
    model = gpt(24, 2048, 16)
    full = flops.model_flops_per_step(model, TrainingSpec(seq_len=2048, global_batch_size=8))
    lora = TrainingSpec(
        seq_len=2048, global_batch_size=8, method=Method.LORA, lora_targets=("q_proj", "v_proj")
    )
    ratio = flops.model_flops_per_step(model, lora) / full
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
    none = flops.hardware_flops_per_step(model, training, Recompute.NONE)
    selective = flops.hardware_flops_per_step(model, training, Recompute.SELECTIVE)
    full = flops.hardware_flops_per_step(model, training, Recompute.FULL)
    assert none == flops.model_flops_per_step(model, training) < selective < full


def test_multi_token_prediction_flops_by_hand() -> None:
    # each depth: a layer of the last kind, eh_proj (2h -> h) and another output layer, all trained
    from service.estimator.params import LayerKind

    training = TrainingSpec(seq_len=TINY_TRAINING.seq_len, global_batch_size=1)
    mtp = dataclasses.replace(training, mtp_num_layers=1)
    h, v = TINY.hidden_size, TINY.vocab_size
    layer = flops.layer_training_flops(TINY, LayerKind(moe=False), training)
    extra = flops.model_flops_per_token(TINY, mtp) - flops.model_flops_per_token(TINY, training)
    assert extra == layer + 3 * 2 * 2 * h * h + 3 * 2 * h * v
