"""hf_config builders for Qwen3, Qwen3-MoE, DeepSeek-V2/V3, Gemma 2/3, Llama 4, GPT-OSS, OLMo 2,
Granite, Phi-4, Mistral NeMo and the multimodal wrappers: small configs counted by hand (the formula
is in each test's comments; validation/param_counts.py checks the same families against transformers
on the meta device), and the refusal of keys that change the architecture in ways ModelSpec cannot
express."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from service.estimator.errors import InvalidModel
from service.estimator.hf_config import SUPPORTED_MODEL_TYPES, model_from_hf_config
from service.estimator.params import is_moe_layer, layer_parameters, parameter_counts
from service.estimator.types import AttentionKind, MLASpec, MlpKind, ModelSpec, QKNorm

FULL, SLIDING, CHUNKED = AttentionKind.FULL, AttentionKind.SLIDING, AttentionKind.CHUNKED

# h = 64, V = 100 throughout: the embedding is V*h = 6,400, an untied lm_head another 6,400, the
# final RMSNorm h = 64.
BASE: dict[str, Any] = {"hidden_size": 64, "vocab_size": 100}


def build(config: dict[str, Any]) -> ModelSpec:
    return model_from_hf_config(config, name="t")


def total(config: dict[str, Any]) -> int:
    return parameter_counts(build(config)).total


def refused(config: dict[str, Any]) -> str | None:
    with pytest.raises(InvalidModel) as info:
        build(config)
    assert info.value.rule == "hf_config"
    return info.value.field


def test_every_family_is_supported() -> None:
    assert {
        "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gemma2", "gemma3_text", "gemma3",
        "llama4_text", "llama4", "gpt_oss", "olmo2", "olmoe", "granite", "phi3", "mistral", "mistral3",
    } <= set(SUPPORTED_MODEL_TYPES)  # fmt: skip


# ---------------------------------------------------------------- Qwen3


QWEN3 = {**BASE, "model_type": "qwen3", "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128}  # fmt: skip


def test_qwen3_by_hand() -> None:
    # q = 4*32 = 128, kv = 2*32 = 64. attention h*q + 2*h*kv + q*h = 8192 * 3 = 24,576, + q_norm and
    # k_norm RMSNorm(head_dim) 2*32 = 64 -> 24,640; norms 2h = 128; SwiGLU 3*64*128 = 24,576.
    # layer 49,344; total 2*6,400 + 64 + 2*49,344 = 111,552.
    spec = build(QWEN3)
    assert spec.qk_norm is QKNorm.PER_HEAD and spec.layer_types == ()
    assert layer_parameters(spec, 0) == 49_344
    assert parameter_counts(spec).total == 111_552


def test_qwen3_defaults_head_dim_128_and_32_kv_heads() -> None:
    bare = {k: v for k, v in QWEN3.items() if k not in ("head_dim", "num_key_value_heads")}
    spec = build({**bare, "num_attention_heads": 32})
    assert (spec.head_dim, spec.num_kv_heads) == (128, 32)  # not hidden / heads = 2


def test_qwen3_sliding_window_only_with_use_sliding_window() -> None:
    windowed = {**QWEN3, "num_hidden_layers": 3, "sliding_window": 16, "max_window_layers": 1}
    assert build(windowed).layer_types == ()
    spec = build({**windowed, "use_sliding_window": True})
    assert spec.layer_types == (FULL, SLIDING, SLIDING) and spec.sliding_window == 16
    listed = build({**windowed, "use_sliding_window": True, "layer_types": ["sliding_attention"] * 3})
    assert listed.layer_types == (SLIDING,) * 3


def test_layer_types_must_name_every_layer_with_a_known_kind() -> None:
    base = {**QWEN3, "use_sliding_window": True}
    assert refused({**base, "layer_types": ["full_attention"]}) == "hf_config.layer_types"
    assert refused({**base, "layer_types": ["chunked_attention"] * 2}) == "hf_config.layer_types"


# ---------------------------------------------------------------- Qwen3-MoE, Qwen2-MoE


QWEN3_MOE = {**BASE, "model_type": "qwen3_moe", "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 96, "moe_intermediate_size": 32,
             "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 2,
             "mlp_only_layers": [3]}  # fmt: skip


def test_qwen3_moe_by_hand() -> None:
    # head_dim is not a Qwen3MoeConfig field: hidden / heads = 16; q = 64, kv = 32.
    # attention 64*64 + 2*64*32 + 64*64 + 2*16 = 12,320; norms 128.
    # MoE on (i + 1) % 2 == 0 minus mlp_only_layers [3] -> layer 1 only:
    #   experts 4 * 3*64*32 = 24,576 + router 4*64 = 256 -> 24,832; layer 37,280.
    # dense layers 0, 2, 3: 3*64*96 = 18,432; layer 30,880.
    # total 2*6,400 + 64 + 3*30,880 + 37,280 = 142,784.
    spec = build(QWEN3_MOE)
    assert spec.head_dim == 16 and spec.moe_layers == (1,)
    assert [is_moe_layer(spec, i) for i in range(4)] == [False, True, False, False]
    assert [layer_parameters(spec, i) for i in range(4)] == [30_880, 37_280, 30_880, 30_880]
    assert parameter_counts(spec).total == 142_784
    # the JSON's head_dim wins (Qwen3-30B-A3B: 2048 / 32 = 64, head_dim 128)
    assert build({**QWEN3_MOE, "head_dim": 24}).head_dim == 24


def test_qwen3_moe_window_covers_every_layer() -> None:
    spec = build({**QWEN3_MOE, "use_sliding_window": True, "sliding_window": 8})
    assert spec.layer_types == (SLIDING,) * 4 and spec.sliding_window == 8


def test_qwen2_moe_mlp_only_layers() -> None:
    config = {**BASE, "model_type": "qwen2_moe", "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 4, "intermediate_size": 96, "moe_intermediate_size": 16,
              "shared_expert_intermediate_size": 48, "num_experts": 2, "num_experts_per_tok": 1,
              "mlp_only_layers": [1]}  # fmt: skip
    # attention 4*64*64 + q, k, v biases 3*64 = 16,576; norms 128.
    # MoE (layers 0, 2): experts 2 * 3*64*16 = 6,144 + router 128 + shared 3*64*48 = 9,216 + its
    # gate 64 -> 15,552; layer 32,256. Dense layer 1: 3*64*96 = 18,432; layer 35,136.
    spec = build(config)
    assert spec.moe_layers == (0, 2)
    assert [layer_parameters(spec, i) for i in range(3)] == [32_256, 35_136, 32_256]
    assert parameter_counts(spec).total == 2 * 6_400 + 64 + 2 * 32_256 + 35_136


# ---------------------------------------------------------------- DeepSeek-V2 / V3


DEEPSEEK = {**BASE, "num_attention_heads": 2, "num_key_value_heads": 2, "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8, "v_head_dim": 16, "kv_lora_rank": 32, "n_routed_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 16, "intermediate_size": 96,
            "first_k_dense_replace": 1}  # fmt: skip


def test_deepseek_v2_lite_style_by_hand() -> None:
    # q_lora_rank null: plain q_proj h x n(nope + rope) = 64*2*24 = 3,072 (never biased).
    # kv_a_proj_with_mqa (h + 1 bias)(r + rope) = 65*40 = 2,600, kv_a_layernorm r = 32,
    # kv_b_proj r * n(nope + v) = 32*2*32 = 2,048 -> 4,680. o_proj n*v*h + h = 2,048 + 64 = 2,112.
    # attention 9,864; norms 128.
    # dense layer 0 with mlp_bias: 3*64*96 + 2*96 + 64 = 18,688 -> layer 28,680.
    # MoE layers 1, 2: experts 4 * 3*64*16 = 12,288 (no bias) + router 256 + ONE shared MLP of
    # 2*16 = 32 with bias: 3*64*32 + 2*32 + 64 = 6,272 -> 18,816; layer 28,808.
    # total 2*6,400 + 64 + 28,680 + 2*28,808 = 99,160.
    config = {**DEEPSEEK, "model_type": "deepseek_v2", "num_hidden_layers": 3, "q_lora_rank": None,
              "n_shared_experts": 2, "mlp_bias": True, "attention_bias": True}  # fmt: skip
    spec = build(config)
    assert spec.mla == MLASpec(
        q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16
    )
    assert spec.moe_layers == (1, 2) and spec.mla_bias and spec.num_kv_heads == 2
    assert [layer_parameters(spec, i) for i in range(3)] == [28_680, 28_808, 28_808]
    assert parameter_counts(spec).total == 99_160
    # a missing q_lora_rank is the class default 1536, not null
    default = build({k: v for k, v in config.items() if k != "q_lora_rank"})
    assert default.mla is not None and default.mla.q_lora_rank == 1536
    # an explicit null n_shared_experts builds no shared MLP (modeling_deepseek.py: `if
    # config.n_shared_experts is not None`; it was counted as the class default 2): 2 x 6,272 fewer
    unshared = build({**config, "n_shared_experts": None})
    assert unshared.moe is not None and unshared.moe.num_shared_experts == 0
    assert parameter_counts(unshared).total == 99_160 - 2 * 6_272


def test_deepseek_v3_by_hand() -> None:
    # q_a_proj h*r_q = 64*24 = 1,536, q_a_layernorm 24, q_b_proj r_q * n(nope + rope) = 24*2*24 = 1,152
    # -> 2,712; kv_a 64*40 = 2,560 + 32 + kv_b 2,048 -> 4,640; o_proj 2*16*64 = 2,048.
    # attention 9,400; norms 128. Dense layer 0: 3*64*96 = 18,432 -> 27,960.
    # MoE layer 1: experts 12,288 + router 256 + one shared expert 3*64*16 = 3,072 -> 15,616; 25,144.
    # total 2*6,400 + 64 + 27,960 + 25,144 = 65,968. The MTP layer is not part of the model.
    config = {**DEEPSEEK, "model_type": "deepseek_v3", "num_hidden_layers": 2, "q_lora_rank": 24,
              "n_shared_experts": 1, "num_nextn_predict_layers": 1, "n_group": 2, "topk_group": 1,
              "moe_layer_freq": 1}  # fmt: skip
    spec = build(config)
    assert [layer_parameters(spec, i) for i in range(2)] == [27_960, 25_144]
    assert parameter_counts(spec).total == 65_968
    assert parameter_counts(spec).active_per_token == 65_968 - 2 * 3 * 64 * 16  # 2 of 4 experts idle


@pytest.mark.parametrize(
    "config",
    [
        {**QWEN3_MOE, "mlp_only_layers": [0, 1, 2, 3]},
        {**QWEN3_MOE, "decoder_sparse_step": 8, "mlp_only_layers": []},
        {**DEEPSEEK, "model_type": "deepseek_v3", "num_hidden_layers": 2, "first_k_dense_replace": 2},
    ],
)
def test_a_config_whose_moe_block_is_on_no_layer_is_a_dense_model(config: dict[str, Any]) -> None:
    """transformers builds every layer dense where mlp_only_layers, decoder_sparse_step or
    first_k_dense_replace leave no MoE layer: the model is dense, as ModelSpec (which refuses an MoE
    block on no layer) must be given it."""
    spec = build(config)
    assert spec.moe is None and spec.moe_layers is None and spec.moe_router is None


def test_deepseek_refusals() -> None:
    v3 = {**DEEPSEEK, "model_type": "deepseek_v3", "num_hidden_layers": 2}
    # transformers ignores moe_layer_freq (MoE on every layer >= first_k_dense_replace)
    assert refused({**v3, "moe_layer_freq": 2}) == "hf_config.moe_layer_freq"
    # MLA decompresses a key and a value per head: grouped kv heads cannot be expressed
    assert refused({**v3, "num_key_value_heads": 1}) == "hf_config.num_key_value_heads"
    # DeepseekV3Config's default of 128 kv heads then mismatches 2 heads
    no_kv = {k: v for k, v in v3.items() if k != "num_key_value_heads"}
    assert refused(no_kv) == "hf_config.num_key_value_heads"
    # DeepseekV2Config has no default top-k
    v2 = {k: v for k, v in DEEPSEEK.items() if k != "num_experts_per_tok"}
    assert refused({**v2, "model_type": "deepseek_v2", "num_hidden_layers": 2}) == (
        "hf_config.num_experts_per_tok"
    )


# ---------------------------------------------------------------- Gemma 2 / Gemma 3


GEMMA = {**BASE, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
         "intermediate_size": 128}  # fmt: skip


def test_gemma2_by_hand() -> None:
    # attention 64*64 + 2*64*32 + 64*64 = 12,288; four RMSNorms 4h = 256; GeGLU 3*64*128 = 24,576.
    # layer 37,120; tied: total 6,400 + 64 + 3*37,120 = 117,824.
    spec = build({**GEMMA, "model_type": "gemma2", "num_hidden_layers": 3})
    assert parameter_counts(spec).total == 117_824
    assert spec.layer_types == (SLIDING, FULL, SLIDING) and spec.sliding_window == 4096
    assert spec.final_logit_softcapping and spec.mlp is MlpKind.GEGLU and spec.norms_per_layer == 4
    assert spec.attn_logit_softcapping  # Gemma2Config's 50.0
    off = build({**GEMMA, "model_type": "gemma2", "num_hidden_layers": 3, "final_logit_softcapping": None,
                 "sliding_window": None, "attn_logit_softcapping": None})  # fmt: skip
    assert not off.final_logit_softcapping and off.layer_types == () and not off.attn_logit_softcapping


def test_gemma3_text_and_wrapper_by_hand() -> None:
    # Gemma 2's layer + q_norm and k_norm RMSNorm(head_dim) 2*32 = 64 -> 37,184; six layers, the
    # default pattern 6 (5 sliding : 1 full); tied: total 6,400 + 64 + 6*37,184 = 229,568.
    text = {**GEMMA, "model_type": "gemma3_text", "num_hidden_layers": 6, "sliding_window": 16}
    spec = build(text)
    assert parameter_counts(spec).total == 229_568
    assert spec.layer_types == (SLIDING,) * 5 + (FULL,) and spec.sliding_window == 16
    assert spec.qk_norm is QKNorm.PER_HEAD and not spec.final_logit_softcapping
    wrapped = build({"model_type": "gemma3", "text_config": text, "vision_config": {"hidden_size": 1152}})
    # the wrapper's text model, and a note that its vision tower is not counted
    assert dataclasses.replace(wrapped, config_notes=(), vision_tower=False) == spec
    assert wrapped.family == "gemma3" and wrapped.vision_tower and not spec.vision_tower
    assert len(wrapped.config_notes) == 1 and "vision tower" in wrapped.config_notes[0]
    pattern = build({**text, "sliding_window_pattern": 2})
    assert pattern.layer_types == (SLIDING, FULL) * 3


def test_wrapper_errors_name_the_text_config_key() -> None:
    assert refused({"model_type": "gemma3"}) == "hf_config.text_config"
    bad_type = {"model_type": "gemma3", "text_config": {**GEMMA, "model_type": "gemma2"}}
    assert refused(bad_type) == "hf_config.text_config.model_type"
    missing = {"model_type": "llama4", "text_config": {"hidden_size": 64}}
    assert refused(missing) == "hf_config.text_config.num_hidden_layers"
    text = {**GEMMA, "num_hidden_layers": 2, "use_bidirectional_attention": True}
    bidirectional = {"model_type": "gemma3", "text_config": text}
    assert refused(bidirectional) == "hf_config.text_config.use_bidirectional_attention"


# ---------------------------------------------------------------- Llama 4


LLAMA4 = {**BASE, "model_type": "llama4_text", "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32,
          "intermediate_size_mlp": 96, "num_local_experts": 3, "num_experts_per_tok": 1,
          "interleave_moe_layer_step": 2, "attention_chunk_size": 16}  # fmt: skip


def test_llama4_by_hand() -> None:
    # attention 64*64 + 2*64*32 + 64*64 = 12,288 (the L2 q/k norm has no weights); norms 128.
    # MoE layers 1, 3 (interleave step 2): experts 3 * 3*64*32 = 18,432 + router 192 + one shared
    # expert 3*64*32 = 6,144 -> 24,768; layer 37,184. Dense layers 0, 2: 3*64*96 = 18,432; 30,848.
    # total 2*6,400 + 64 + 2*30,848 + 2*37,184 = 148,928.
    spec = build(LLAMA4)
    assert spec.moe_layers == (1, 3) and spec.ffn_hidden_size == 96
    assert [layer_parameters(spec, i) for i in range(4)] == [30_848, 37_184, 30_848, 37_184]
    assert parameter_counts(spec).total == 148_928
    # RoPE layers are chunked, every 4th (NoPE) layer full
    assert spec.layer_types == (CHUNKED, CHUNKED, CHUNKED, FULL) and spec.attention_chunk_size == 16
    assert spec.qk_norm is QKNorm.L2
    assert build({**LLAMA4, "use_qk_norm": False}).qk_norm is QKNorm.NONE
    assert build({**LLAMA4, "moe_layers": [0]}).moe_layers == (0,)
    wrapped = build({"model_type": "llama4", "text_config": LLAMA4})
    assert dataclasses.replace(wrapped, config_notes=(), vision_tower=False) == spec and wrapped.vision_tower
    # Llama 4 Scout's config.json: llama3 scaling with both frequency factors 1 (transformers
    # warns, the model runs); it was refused
    scout = {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
             "original_max_position_embeddings": 8192, "rope_type": "llama3"}  # fmt: skip
    scaled = build({"model_type": "llama4", "text_config": {**LLAMA4, "rope_scaling": scout}})
    assert scaled.rope_scaling is not None and scaled.rope_scaling.high_freq_factor == 1.0
    assert parameter_counts(scaled).total == 148_928
    # a wrong one inside the wrapper is named where the config has it
    inverted = {
        "model_type": "llama4",
        "text_config": {**LLAMA4, "rope_scaling": scout | {"low_freq_factor": 2.0}},
    }
    assert refused(inverted) == "hf_config.text_config.rope_scaling.high_freq_factor"
    assert refused({**LLAMA4, "rope_scaling": scout | {"low_freq_factor": 2.0}}) == (
        "hf_config.rope_scaling.high_freq_factor"
    )


def test_llama4_refusals() -> None:
    assert refused({**LLAMA4, "moe_layers": [7]}) == "hf_config.moe_layers"
    assert refused({**LLAMA4, "no_rope_layers": [1, 0]}) == "hf_config.no_rope_layers"
    assert refused({**LLAMA4, "interleave_moe_layer_step": 0}) == "hf_config.interleave_moe_layer_step"
    chunked = {**LLAMA4, "attention_chunk_size": None, "layer_types": ["chunked_attention"] * 4}
    assert refused(chunked) == "hf_config.attention_chunk_size"


# ---------------------------------------------------------------- GPT-OSS


def test_gpt_oss_by_hand() -> None:
    # attention 12,288 + q, k, v, o biases (64 + 2*32 + 64) = 192 + 4 sinks -> 12,484; norms 128.
    # MoE on every layer: 3 experts of 3*64*32 + gate_up bias 2*32 + down bias 64 = 6,272 -> 18,816,
    # router 3*64 + 3 bias -> 19,011. layer 31,623; total 2*6,400 + 64 + 2*31,623 = 76,110.
    config = {**BASE, "model_type": "gpt_oss", "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32,
              "num_local_experts": 3, "num_experts_per_tok": 2}  # fmt: skip
    spec = build(config)
    assert parameter_counts(spec).total == 76_110
    assert spec.attention_sinks and spec.moe is not None and spec.moe.expert_bias and spec.moe.router_bias
    assert spec.layer_types == (SLIDING, FULL) and spec.sliding_window == 128


# ---------------------------------------------------------------- OLMo 2, Granite, Phi-4, Mistral


LLAMA_LIKE = {**BASE, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 128}  # fmt: skip


def test_olmo2_by_hand() -> None:
    # attention 12,288 + q_norm RMSNorm(4*16) + k_norm RMSNorm(2*16) = 96 -> 12,384; two post-norms
    # 128; SwiGLU 24,576. layer 37,088; total 2*6,400 + 64 + 2*37,088 = 87,040.
    spec = build({**LLAMA_LIKE, "model_type": "olmo2"})
    assert spec.qk_norm is QKNorm.FULL_WIDTH and spec.norms_per_layer == 2
    assert parameter_counts(spec).total == 87_040


def test_olmoe_1b_7b_by_hand() -> None:
    """allenai/OLMoE-1B-7B-0924's config.json (a 422 before: MoE review). Embeddings 2 x 50,304 x 2,048 =
    206,045,184; a layer: q, k, v, o 4 x 2,048^2 = 16,777,216, q_norm and k_norm 2 x 2,048, two norms
    4,096, router 2,048 x 64 = 131,072, 64 experts of 3 x 2,048 x 1,024 = 402,653,184 -> 419,569,664;
    x 16, + the final norm: 6,919,161,856 (the card's 6.9B), 1.28B active (its 1.3B)."""
    config = {"model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024,
              "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 16,
              "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False, "vocab_size": 50304,
              "tie_word_embeddings": False, "clip_qkv": None, "max_position_embeddings": 4096,
              "rope_theta": 10000.0, "rms_norm_eps": 1e-05}  # fmt: skip
    spec = build(config)
    assert spec.qk_norm is QKNorm.FULL_WIDTH and spec.moe is not None and spec.moe.num_shared_experts == 0
    counts = parameter_counts(spec)
    assert counts.total == 6_919_161_856
    assert counts.active_per_token == 6_919_161_856 - 16 * 56 * 3 * 2048 * 1024  # 56 of 64 experts idle
    assert refused({**config, "clip_qkv": 8.0}) == "hf_config.clip_qkv"


def test_granite_by_hand() -> None:
    # attention 12,288 + biases 64 + 2*32 + 64 = 12,480; MLP 24,576 + biases 2*128 + 64 = 24,896;
    # norms 128. layer 37,504; tied: total 6,400 + 64 + 2*37,504 = 81,472. Multipliers: scalars.
    config = {**LLAMA_LIKE, "model_type": "granite", "attention_bias": True, "mlp_bias": True,
              "tie_word_embeddings": True, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
              "attention_multiplier": 0.0078125, "logits_scaling": 16.0}  # fmt: skip
    assert total(config) == 81_472


def test_phi4_by_hand() -> None:
    # fused qkv_proj (q + 2kv) x h and gate_up_proj 2f x h: 12,288 + 24,576 + 128 = 36,992 per layer;
    # total 2*6,400 + 64 + 2*36,992 = 86,848. sliding_window (default null) covers every layer.
    config = {**LLAMA_LIKE, "model_type": "phi3"}
    assert build(config).layer_types == ()
    assert total(config) == 86_848
    spec = build({**config, "sliding_window": 32})
    assert spec.layer_types == (SLIDING, SLIDING) and spec.sliding_window == 32


def test_mistral_nemo_by_hand() -> None:
    # head_dim 32 != 64 / 4: q 128, kv 64 -> attention 3 * 8,192 = 24,576; MLP 24,576; norms 128.
    # layer 49,280; total 2*6,400 + 64 + 2*49,280 = 111,424.
    nemo = {**LLAMA_LIKE, "model_type": "mistral", "head_dim": 32, "sliding_window": None}
    spec = build(nemo)
    assert parameter_counts(spec).total == 111_424
    assert spec.layer_types == () and spec.sliding_window is None  # null: no window
    # a missing sliding_window is MistralConfig's 4096 on every layer
    default = build({k: v for k, v in nemo.items() if k != "sliding_window"})
    assert default.layer_types == (SLIDING, SLIDING) and default.sliding_window == 4096
    wrapped = build({"model_type": "mistral3", "text_config": nemo, "vision_config": {}})
    assert dataclasses.replace(wrapped, config_notes=(), vision_tower=False) == spec and wrapped.vision_tower


def test_mixtral_sliding_window_when_given() -> None:
    config = {**LLAMA_LIKE, "model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 1}
    assert build(config).layer_types == ()
    assert build({**config, "sliding_window": 8}).layer_types == (SLIDING, SLIDING)


def test_absurd_sizes_are_refused_before_any_work() -> None:
    # a million layers would cost minutes per request: the limit is the explicit-architecture form's
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_hidden_layers": 1_000_000, "vocab_size": 100}  # fmt: skip
    with pytest.raises(InvalidModel, match=r"num_hidden_layers.*exceeds 1,024") as err:
        model_from_hf_config(config)
    assert err.value.field == "hf_config.num_hidden_layers"


def test_dropout_comes_from_the_config_with_its_class_defaults() -> None:
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 100}
    # GPT2Config defaults resid_pdrop, embd_pdrop and attn_pdrop to 0.1: the masks are stored
    spec = model_from_hf_config(gpt2)
    assert (spec.hidden_dropout, spec.attention_dropout) == (0.1, 0.1)
    off = model_from_hf_config(gpt2 | {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})
    assert (off.hidden_dropout, off.attention_dropout) == (0.0, 0.0)
    llama = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
             "num_hidden_layers": 2, "vocab_size": 100}  # fmt: skip
    assert model_from_hf_config(llama).attention_dropout == 0.0
    assert model_from_hf_config(llama | {"attention_dropout": 0.1}).attention_dropout == 0.1
    with pytest.raises(InvalidModel, match="attention_dropout"):
        model_from_hf_config(llama | {"attention_dropout": 1.5})


# google/gemma-3-4b-it's config.json as published: its text_config leaves the heads, kv heads, head_dim
# and vocabulary to Gemma3TextConfig's defaults
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "num_hidden_layers": 27},
}


def test_gemma3_published_config_takes_the_text_config_class_defaults() -> None:
    """A review's case: the published Gemma 3 4B config.json was a 422 "'text_config.num_attention_heads'
    is required"; transformers fills what it leaves out from Gemma3TextConfig (8 heads, 4 kv heads,
    head_dim 256, vocabulary 262,208). 3,880,263,168 parameters: transformers 5.24's count of
    Gemma3ForCausalLM from that text_config on the meta device."""
    spec = model_from_hf_config(GEMMA3_4B)
    assert (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim, spec.vocab_size) == (
        8,
        4,
        256,
        262208,
    )
    assert spec.num_layers == 34 and spec.sliding_window == 1024
    assert parameter_counts(spec).total == 3_880_263_168


QWEN2_SMALL = {
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
    "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
}  # fmt: skip


def test_a_decoder_with_another_head_than_the_language_model_is_refused() -> None:
    """Qwen2ForSequenceClassification scores num_labels on the last token; counted as a causal LM it
    "did not fit" an L4 by its 11 GB of vocabulary logits (small-model review, stop 41). Only the
    language-model head is modelled for decoders: the others are refused naming architectures; the
    causal LM, GPT-2's LMHeadModel and a multimodal checkpoint's ForConditionalGeneration load."""

    for head in ("Qwen2ForSequenceClassification", "Qwen2ForTokenClassification", "Qwen2Model"):
        with pytest.raises(InvalidModel) as refused:
            model_from_hf_config(QWEN2_SMALL | {"architectures": [head]})
        assert refused.value.field == "hf_config.architectures" and head in refused.value.message
    for head in ("Qwen2ForCausalLM", "Qwen2LMHeadModel", "Qwen2VLForConditionalGeneration"):
        assert model_from_hf_config(QWEN2_SMALL | {"architectures": [head]}).vocab_size == 151936
    assert model_from_hf_config(QWEN2_SMALL).vocab_size == 151936  # no architectures: the checkpoint's own


def test_an_unsupported_model_type_of_a_supported_class_says_what_it_would_be_read_as() -> None:
    """Kimi K2's config says model_type kimi_k2 and architectures DeepseekV3ForCausalLM: the refusal
    names the family its class is (2025-26 configs review); another unknown class adds nothing."""
    from service.estimator.errors import InvalidModel
    from service.estimator.hf_config import model_from_hf_config

    with pytest.raises(InvalidModel, match="a 'deepseek_v3' model: sent with model_type 'deepseek_v3'"):
        model_from_hf_config({"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]})
    with pytest.raises(InvalidModel) as refused:
        model_from_hf_config({"model_type": "foo", "architectures": ["FooForCausalLM"]})
    assert "architectures" not in str(refused.value)
    # a wrapper's text-only class is its text model's config (gemma3 would ask for a text_config)
    with pytest.raises(InvalidModel, match="a 'gemma3_text' model"):
        model_from_hf_config({"model_type": "my_gemma3", "architectures": ["Gemma3ForCausalLM"]})
