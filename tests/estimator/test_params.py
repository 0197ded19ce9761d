"""Exact parameter counts: hand-computed tiny models, Narayanan's closed form, published totals."""

from __future__ import annotations

from fractions import Fraction

import pytest

from service.catalog.models import model
from service.estimator import pipeline
from service.estimator.errors import InvalidLayout, InvalidModel
from service.estimator.hf_config import model_from_hf_config
from service.estimator.params import (
    attention_parameters,
    is_moe_layer,
    layer_parameters,
    mlp_parameters,
    parameter_counts,
    stage_parameter_counts,
)
from service.estimator.types import Layout, MlpKind, ModelSpec, MoESpec, NormKind, PositionEmbedding


def tiny_llama(**overrides: object) -> ModelSpec:
    fields: dict[str, object] = {
        "name": "tiny-llama",
        "num_layers": 2,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "num_kv_heads": 1,
        "ffn_hidden_size": 16,
        "vocab_size": 10,
    }
    fields.update(overrides)
    return ModelSpec(**fields)  # type: ignore[arg-type]


def gpt(*, num_layers: int, hidden: int, vocab: int, seq: int) -> ModelSpec:
    """GPT-2/3 layout: learned positions, 4h GELU MLP, biases everywhere, LayerNorm, tied."""
    return ModelSpec(
        name="gpt",
        family="gpt2",
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=4,
        num_kv_heads=4,
        ffn_hidden_size=4 * hidden,
        vocab_size=vocab,
        max_position_embeddings=seq,
        mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM,
        position_embedding=PositionEmbedding.LEARNED,
        tied_embeddings=True,
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
    )


# ---------------------------------------------------------------- hand-computed


def test_tiny_llama_gqa_by_hand() -> None:
    # h=8, 2 heads of head_dim 4, 1 kv head, f=16, V=10, 2 layers, untied, RMSNorm, no biases.
    m = tiny_llama()
    # q 8x8=64, k 8x4=32, v 8x4=32, o 8x8=64 -> 192
    assert attention_parameters(m) == 192
    # gate, up 8x16 each, down 16x8 -> 3*128 = 384
    assert mlp_parameters(m) == 384
    counts = parameter_counts(m)
    assert counts.norms_per_layer == 16  # 2 RMSNorms x 8
    assert counts.embedding == 80  # 10 x 8
    assert counts.output == 80  # untied lm_head 8 x 10
    assert counts.final_norm == 8
    # layer = 192 + 384 + 16 = 592; total = 80 + 80 + 8 + 2*592 = 1352
    assert layer_parameters(m, 0) == 592
    assert counts.total == 1352
    assert counts.layers_total == 1184
    assert counts.active_per_token == counts.total  # dense: every parameter is active
    assert counts.largest_module == 128  # gate_proj / up_proj / down_proj, 8 x 16


def test_tiny_head_dim_not_hidden_over_heads() -> None:
    # head_dim 6 != 8/2: q 8x12=96, k 8x6=48, v 48, o 12x8=96 -> 288
    assert attention_parameters(tiny_llama(head_dim=6)) == 288


def test_tiny_biases() -> None:
    # qkv bias adds q + k + v widths = 8 + 4 + 4 = 16; output bias adds h = 8
    assert attention_parameters(tiny_llama(qkv_bias=True)) == 192 + 16
    assert attention_parameters(tiny_llama(qkv_bias=True, attn_out_bias=True)) == 192 + 24
    # gated MLP bias: gate 16 + up 16 + down 8 = 40
    assert mlp_parameters(tiny_llama(mlp_bias=True)) == 384 + 40


def test_tiny_gpt_by_hand() -> None:
    # h=4, 1 layer, V=10, s=6, f=16, LayerNorm, learned positions, tied.
    m = gpt(num_layers=1, hidden=4, vocab=10, seq=6)
    counts = parameter_counts(m)
    # attention: 4 weights 4x4 = 64, biases 3*4 (qkv) + 4 (out) = 16 -> 80
    assert counts.attention_per_layer == 80
    # MLP: 4x16 + 16x4 = 128, biases 16 + 4 = 20 -> 148
    assert counts.dense_mlp_per_layer == 148
    assert counts.norms_per_layer == 16  # 2 LayerNorms x (weight 4 + bias 4)
    assert counts.embedding == 64  # (V + s) x h = 16 x 4
    assert counts.output == 0  # tied
    assert counts.final_norm == 8
    # 64 + 8 + (80 + 148 + 16) = 316
    assert counts.total == 316


def test_embedding_norm_and_single_norm() -> None:
    # BLOOM's embedding LayerNorm adds 2h to the embedding; Falcon-7B keeps one norm per layer.
    m = tiny_llama(norm=NormKind.LAYERNORM, embedding_norm=True, norms_per_layer=1)
    counts = parameter_counts(m)
    assert counts.embedding == 80 + 16  # V*h + (weight + bias) 2*8
    assert counts.norms_per_layer == 16  # one LayerNorm of 2*8


def test_tiny_moe_by_hand() -> None:
    # 4 experts of width 6, top-2, router with bias, one shared expert of width 10 with a gate.
    moe = MoESpec(
        num_experts=4,
        top_k=2,
        expert_ffn_hidden_size=6,
        num_shared_experts=1,
        shared_expert_ffn_hidden_size=10,
        shared_expert_gate=True,
        router_bias=True,
        layer_frequency=2,
    )
    m = tiny_llama(moe=moe)
    counts = parameter_counts(m)
    assert [is_moe_layer(m, i) for i in range(2)] == [False, True]  # (i + 1) % 2 == 0
    assert counts.moe_layers == 1 and counts.dense_layers == 1
    assert counts.experts_per_moe_layer == 4 * 3 * 8 * 6  # 4 experts x 3 matrices x h x f_e = 576
    assert counts.router_per_moe_layer == 8 * 4 + 4  # h x E + E bias = 36
    assert counts.shared_experts_per_moe_layer == 3 * 8 * 10 + 8  # 240 + gate h -> 1 = 248
    # layer 0 dense: 592; layer 1: 192 + 16 + 576 + 36 + 248 = 1068
    assert layer_parameters(m, 1) == 1068
    assert counts.total == 80 + 80 + 8 + 592 + 1068
    # a token skips 2 of 4 experts (2 x 144) in the one MoE layer
    assert counts.active_per_token == counts.total - 2 * 144
    assert counts.largest_module == 576  # transformers 5 keeps all experts in one module


# ---------------------------------------------------------------- cross-check


@pytest.mark.parametrize(
    ("num_layers", "hidden", "vocab", "seq"),
    [(12, 768, 50257, 1024), (96, 12288, 50257, 2048), (3, 64, 1000, 128), (40, 5120, 51200, 2048)],
)
def test_narayanan_eq2_matches_term_by_term(num_layers: int, hidden: int, vocab: int, seq: int) -> None:
    # Narayanan et al. 2021 (arXiv:2104.04473) Eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12lh)),
    # i.e. 12h^2 + 13h per layer plus (V + s) h embeddings. It leaves out the final LayerNorm (2h).
    layers, h = num_layers, hidden
    closed = 12 * layers * h**2 * (1 + Fraction(13, 12 * h) + Fraction(vocab + seq, 12 * layers * h))
    assert closed.denominator == 1
    assert parameter_counts(gpt(num_layers=layers, hidden=h, vocab=vocab, seq=seq)).total == closed + 2 * h


# ---------------------------------------------------------------- published totals


@pytest.mark.parametrize(
    ("preset", "total"),
    [
        ("gpt2", 124_439_808),
        ("llama-2-7b", 6_738_415_616),
        ("llama-3-8b", 8_030_261_248),
        ("mistral-7b", 7_241_732_096),
        ("mixtral-8x7b", 46_702_792_704),
        ("qwen2.5-0.5b", 494_032_768),
        ("llama-3.1-405b", 405_853_388_800),
        ("bloom-176b", 176_247_271_424),
    ],
)
def test_published_totals(preset: str, total: int) -> None:
    # Each also measured with PyTorch on the meta device (validation/data/param_counts.json).
    assert parameter_counts(model(preset).spec).total == total


def test_mixtral_active_parameters() -> None:
    # Mixtral's "12.9B active": 32 layers skip 6 of 8 experts of 3 x 4096 x 14336 each.
    counts = parameter_counts(model("mixtral-8x7b").spec)
    assert counts.active_per_token == 46_702_792_704 - 32 * 6 * 3 * 4096 * 14336 == 12_879_925_248
    assert counts.largest_module == 8 * 3 * 4096 * 14336  # one layer's experts module


def test_largest_module_is_the_embedding_for_dense_llama() -> None:
    assert parameter_counts(model("llama-3-8b").spec).largest_module == 128256 * 4096


# ---------------------------------------------------------------- pipeline stages


def test_stages_sum_to_total_when_untied() -> None:
    m = model("llama-2-7b").spec
    stages = stage_parameter_counts(m, Layout(pp=4))
    counts = parameter_counts(m)
    assert sum(stages) == counts.total
    per_layer = layer_parameters(m, 0)
    assert stages[0] == counts.embedding + 8 * per_layer
    assert stages[1] == stages[2] == 8 * per_layer
    assert stages[3] == 8 * per_layer + counts.final_norm + counts.output


def test_tied_last_stage_holds_an_embedding_copy() -> None:
    # Megatron keeps a copy of the word embedding on the last stage for the output layer.
    m = model("gpt2").spec
    total = parameter_counts(m).total
    assert stage_parameter_counts(m, Layout()) == (total,)
    stages = stage_parameter_counts(m, Layout(pp=3))
    assert sum(stages) == total + 50257 * 768
    # first stage: token + position embeddings; last: 4 layers + ln_f + the copy
    assert stages[0] - stages[1] == 50257 * 768 + 1024 * 768


def test_stage_counts_follow_moe_placement() -> None:
    moe = MoESpec(num_experts=4, top_k=1, expert_ffn_hidden_size=6, layer_frequency=2)
    m = tiny_llama(num_layers=4, moe=moe)
    stages = stage_parameter_counts(m, Layout(pp=2))
    assert sum(stages) == parameter_counts(m).total
    assert stages[0] - 80 == layer_parameters(m, 0) + layer_parameters(m, 1)


@pytest.mark.parametrize(
    ("pp", "split"),
    [
        (3, (11, 11, 10)),  # 34 units = 12 + 11 + 11, less the embedding and the loss
        (5, (6, 7, 7, 7, 5)),  # 34 = 7 + 7 + 7 + 7 + 6
        (6, (5, 6, 6, 6, 5, 4)),  # 34 = 6 x 4 + 5 x 2, the remainder to the first stages
    ],
)
def test_stages_that_do_not_divide_the_layers_count_the_embedding_and_loss_as_layers(
    pp: int, split: tuple[int, ...]
) -> None:
    # torchtitan's split (pipeline_module_split): L + 2 units, the first (L + 2) % S stages one more,
    # then the first stage gives one back to the embedding and the last to the loss
    m = model("llama-2-7b").spec
    layout = Layout(pp=pp)
    assert pipeline.stage_layers(m.num_layers, layout) == split
    stages = stage_parameter_counts(m, layout)
    assert sum(stages) == parameter_counts(m).total
    per_layer = layer_parameters(m, 0)
    assert stages[1] == split[1] * per_layer


def test_published_uneven_splits() -> None:
    # Llama 3 (arXiv:2407.21783 §3.3.2): 126 layers on 16 stages, one fewer on the first and the
    # last; BLOOM (tr11, partition 'type:transformer|embedding'): 70 layers on 12 stages.
    assert pipeline.stage_layers(126, Layout(pp=16)) == (7, *(8,) * 14, 7)
    assert pipeline.stage_layers(70, Layout(pp=12)) == (5, *(6,) * 10, 5)
    # an even split stays even unless the flags ask for Megatron's account-for split
    assert pipeline.stage_layers(32, Layout(pp=4)) == (8, 8, 8, 8)
    flags = Layout(pp=4, pipeline_account_for_embedding=True, pipeline_account_for_loss=True)
    assert pipeline.stage_layers(32, flags) == (8, 9, 8, 7)
    assert pipeline.describe(126, Layout(pp=16)) == "7, 8 x 14, 7"


def test_stage_counts_reject_non_positive_pp() -> None:
    with pytest.raises(InvalidLayout):
        stage_parameter_counts(tiny_llama(), Layout(pp=0))


# ---------------------------------------------------------------- resolving hf configs


def test_hf_config_unknown_model_type() -> None:
    with pytest.raises(InvalidModel, match="'t5' is not supported") as info:
        model_from_hf_config({"model_type": "t5"})
    assert info.value.field == "hf_config.model_type"


def test_hf_config_missing_field_is_named() -> None:
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}
    with pytest.raises(InvalidModel, match="'num_hidden_layers' is required") as info:
        model_from_hf_config(config)
    assert info.value.field == "hf_config.num_hidden_layers"


def test_hf_config_wrong_type_is_named() -> None:
    config = dict(model("llama-2-7b").config, num_key_value_heads="8")
    with pytest.raises(InvalidModel, match="'num_key_value_heads' must be an integer"):
        model_from_hf_config(config)


@pytest.mark.parametrize(
    ("model_type", "key", "value"),
    [
        ("phi", "qk_layernorm", True),
        ("deepseek_v3", "moe_layer_freq", 2),
        ("gemma2", "use_bidirectional_attention", True),
        ("gemma3_text", "use_bidirectional_attention", True),
    ],
)
def test_hf_config_rejects_what_modelspec_cannot_express(model_type: str, key: str, value: object) -> None:
    config = {
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
        key: value,
    }
    with pytest.raises(InvalidModel) as info:
        model_from_hf_config(config)
    assert info.value.field == f"hf_config.{key}"


def test_hf_config_defaults_follow_transformers() -> None:
    base = {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2, "vocab_size": 100}
    # Missing kv heads: LlamaConfig None (= heads), MistralConfig 8, Qwen2Config 32.
    llama = model_from_hf_config({"model_type": "llama", "num_attention_heads": 64, **base})
    mistral = model_from_hf_config({"model_type": "mistral", "num_attention_heads": 64, **base})
    qwen2 = model_from_hf_config({"model_type": "qwen2", "num_attention_heads": 64, **base})
    assert (llama.num_kv_heads, mistral.num_kv_heads, qwen2.num_kv_heads) == (64, 8, 32)
    assert qwen2.qkv_bias and not qwen2.attn_out_bias
    # GemmaConfig: 16 kv heads, head_dim 256, tied; GPT-2: n_inner 4h; GPT-NeoX: rotary_pct 0.25.
    gemma = model_from_hf_config({"model_type": "gemma", "num_attention_heads": 16, **base})
    assert gemma.head_dim == 256 and gemma.tied_embeddings and gemma.mlp is MlpKind.GEGLU
    gpt2 = model_from_hf_config(
        {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 9}
    )
    assert gpt2.ffn_hidden_size == 256 and gpt2.max_position_embeddings == 1024
    neox = model_from_hf_config({"model_type": "gpt_neox", "num_attention_heads": 8, **base})
    assert neox.rotary_fraction == 0.25 and neox.parallel_attn_mlp and not neox.tied_embeddings


def test_hf_config_falcon_layouts() -> None:
    base = {"model_type": "falcon", "hidden_size": 256, "num_hidden_layers": 2, "vocab_size": 100}
    old = model_from_hf_config({**base, "num_attention_heads": 8})
    assert (old.num_kv_heads, old.norms_per_layer, old.ffn_hidden_size) == (1, 1, 1024)
    new = model_from_hf_config(
        {**base, "num_attention_heads": 16, "num_kv_heads": 4, "new_decoder_architecture": True}
    )
    assert (new.num_kv_heads, new.norms_per_layer) == (4, 2)


def test_multi_token_prediction_adds_its_layer_block_and_embedding_copy_to_the_last_stage() -> None:
    # tiny Llama (h 8, V 10, untied): one MTP depth = a decoder layer + eh_proj 2h x h + 3 RMSNorms (h
    # each); with pp 2 the last stage also embeds the shifted tokens: its own V x h copy
    m = tiny_llama()
    plain = stage_parameter_counts(m, Layout(pp=2))
    with_mtp = stage_parameter_counts(m, Layout(pp=2), mtp_layers=1)
    assert with_mtp[0] == plain[0]
    assert with_mtp[1] - plain[1] == layer_parameters(m, 1) + 2 * 8 * 8 + 3 * 8 + 10 * 8
    # on one stage the embedding is there already; two depths, two blocks
    assert stage_parameter_counts(m, Layout(), mtp_layers=2)[0] - stage_parameter_counts(m, Layout())[0] == (
        2 * (layer_parameters(m, 1) + 2 * 8 * 8 + 3 * 8)
    )


def test_a_models_own_lora_module_names_read_as_the_targets_they_hold() -> None:
    """A review's case: Phi-3's qkv_proj / gate_up_proj and BERT's query / value (PEFT's own default
    for BERT) were 422 "unknown lora_targets"; only Llama's spellings were read. peft matches a
    target as a suffix of the module path, so GPT-2's c_proj is both its attention output and MLP down."""
    from service.estimator.params import canonical_lora_targets

    phi3 = model("phi-3-mini").spec
    assert canonical_lora_targets(phi3, ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")) == (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    )  # fmt: skip
    gpt2 = model("gpt2").spec
    assert canonical_lora_targets(gpt2, ("c_attn",)) == ("q_proj", "k_proj", "v_proj")
    assert canonical_lora_targets(gpt2, ("c_proj",)) == ("o_proj", "down_proj")
    neox = model("gpt-neox-20b").spec
    assert canonical_lora_targets(neox, ("query_key_value", "dense")) == (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
    )
    bert = model("bert-base-uncased").spec
    assert canonical_lora_targets(bert, ("query", "value")) == ("q_proj", "v_proj")
    assert canonical_lora_targets(bert, ("dense",)) == ("o_proj", "up_proj", "down_proj")
    llama = model("llama-3-8b").spec
    assert canonical_lora_targets(llama, ("q_proj", "v_proj")) == ("q_proj", "v_proj")
    # the module's parent too, as peft matches a suffix (fine-tuner review): every layer's q_proj; a
    # path peft would not match, or that picks one layer, stays for TrainingSpec to refuse
    assert canonical_lora_targets(llama, ("self_attn.q_proj", "mlp.down_proj")) == ("q_proj", "down_proj")
    for unmatched in ("mlp.q_proj", "layers.0.self_attn.q_proj"):
        assert canonical_lora_targets(llama, (unmatched,)) == (unmatched,)
    # Phi-3's fused modules under the same parents; an MoE model's attention (its experts are no
    # "mlp." suffix); GPT-2's modules sit under attn and mlp, never self_attn (change review)
    assert canonical_lora_targets(phi3, ("self_attn.qkv_proj", "mlp.gate_up_proj")) == (
        "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj",
    )  # fmt: skip
    mixtral = model("mixtral-8x7b").spec
    assert canonical_lora_targets(mixtral, ("self_attn.q_proj",)) == ("q_proj",)
    assert canonical_lora_targets(mixtral, ("mlp.down_proj",)) == ("mlp.down_proj",)
    # where peft moves the MLP targets onto fused experts it maps any name ending in the experts' own
    # ("mlp.down_proj" on Qwen3-MoE, "block_sparse_moe.experts.w2" on Mixtral: _convert_peft_config_moe)
    assert canonical_lora_targets(mixtral, ("block_sparse_moe.experts.w2",)) == ("down_proj",)
    qwen3_moe = model("qwen3-30b-a3b").spec
    assert canonical_lora_targets(qwen3_moe, ("mlp.down_proj", "self_attn.q_proj")) == ("down_proj", "q_proj")
    assert canonical_lora_targets(qwen3_moe, ("mlp.experts.gate_proj",)) == ("gate_proj",)
    assert canonical_lora_targets(model("deepseek-v3").spec, ("mlp.up_proj",)) == ("up_proj",)
    # and its latent attention's modules under self_attn, as peft matches them
    deepseek = model("deepseek-v3").spec
    assert canonical_lora_targets(deepseek, ("self_attn.o_proj",)) == ("o_proj",)
    assert canonical_lora_targets(deepseek, ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa")) == (
        "q_proj", "k_proj", "v_proj",
    )  # fmt: skip
    assert canonical_lora_targets(gpt2, ("self_attn.c_attn",)) == ("self_attn.c_attn",)
    assert canonical_lora_targets(gpt2, ("attn.c_attn",)) == ("q_proj", "k_proj", "v_proj")
    assert canonical_lora_targets(llama, ("qkv_proj",)) == ("qkv_proj",)  # not Llama's: refused later
