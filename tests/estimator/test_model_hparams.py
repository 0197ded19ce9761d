"""The hyperparameters without parameters (RoPE base and scaling, norm epsilon, MoE routing): read
from a pasted config.json, or the transformers configuration class's default where it has none
(transformers v4.56.2 configuration_<family>.py); validated; and read by no memory or time figure."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from service.catalog.models import model, models
from service.estimator.errors import InvalidModel
from service.estimator.hf_config import model_from_hf_config
from service.estimator.params import parameter_counts
from service.estimator.types import (
    Layout,
    MoERouter,
    MoESpec,
    PositionEmbedding,
    RopeScaling,
    RopeScalingKind,
    RouterScore,
    TrainingSpec,
)
from tests.estimator.helpers import memory
from tests.estimator.helpers import time as step_time
from tests.launchers.factories import cluster, small_llama

# Llama-3.1-8B's config.json, the keys this test reads among its architecture
LLAMA_3_1_8B: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}
HPARAM_KEYS = ("rms_norm_eps", "rope_theta", "rope_scaling")


def test_a_pasted_config_json_is_read() -> None:
    spec = model_from_hf_config(LLAMA_3_1_8B)
    assert (spec.rope_theta, spec.norm_eps) == (500000.0, 1e-5)
    assert spec.rope_scaling == RopeScaling(
        kind=RopeScalingKind.LLAMA3,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    assert spec.moe_router is None


def test_missing_keys_take_the_config_class_defaults() -> None:
    # LlamaConfig: rope_theta=10000.0, rms_norm_eps=1e-6, rope_scaling=None
    bare = {k: v for k, v in LLAMA_3_1_8B.items() if k not in HPARAM_KEYS}
    spec = model_from_hf_config(bare)
    assert (spec.rope_theta, spec.norm_eps, spec.rope_scaling) == (10000.0, 1e-6, None)
    # rope_type "default" and null are unscaled
    assert model_from_hf_config(bare | {"rope_scaling": {"rope_type": "default"}}).rope_scaling is None
    assert model_from_hf_config(bare | {"rope_scaling": None}).rope_scaling is None


def test_transformers_5_rope_parameters() -> None:
    bare = {k: v for k, v in LLAMA_3_1_8B.items() if k not in HPARAM_KEYS}
    params = {"rope_theta": 500000.0} | LLAMA_3_1_8B["rope_scaling"]
    spec = model_from_hf_config(bare | {"rope_parameters": params})
    assert spec.rope_theta == 500000.0
    assert spec.rope_scaling == model_from_hf_config(LLAMA_3_1_8B).rope_scaling
    plain = model_from_hf_config(bare | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert (plain.rope_theta, plain.rope_scaling) == (1e6, None)


DEEPSEEK_V3: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "first_k_dense_replace": 1,
    "vocab_size": 100,
}


def test_deepseek_v3_router_defaults_and_keys() -> None:
    # DeepseekV3Config: n_group 8, topk_group 4, routed_scaling_factor 2.5, norm_topk_prob True;
    # DeepseekV3TopkRouter: sigmoid, e_score_correction_bias, groups scored by their top-2 sum
    spec = model_from_hf_config(DEEPSEEK_V3 | {"n_group": 4, "topk_group": 2})
    assert spec.moe_router == MoERouter(
        score=RouterScore.SIGMOID,
        normalize_top_k=True,
        score_correction_bias=True,
        num_groups=4,
        group_top_k=2,
        group_score_top_n=2,
        top_k_scaling_factor=2.5,
    )
    assert (spec.rope_theta, spec.norm_eps, spec.rope_scaling) == (10000.0, 1e-6, None)
    # every group kept routes as plain top-k
    every = model_from_hf_config(DEEPSEEK_V3 | {"n_group": 4, "topk_group": 4}).moe_router
    assert every is not None and every.num_groups is None
    yarn = {
        "type": "yarn",
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    }
    scaling = model_from_hf_config(DEEPSEEK_V3 | {"n_group": 4, "rope_scaling": yarn}).rope_scaling
    assert scaling is not None and scaling.kind is RopeScalingKind.YARN
    assert (scaling.factor, scaling.mscale, scaling.mscale_all_dim) == (40.0, 1.0, 1.0)
    assert (scaling.beta_fast, scaling.beta_slow, scaling.truncate) == (
        32.0,
        1.0,
        True,
    )  # transformers' defaults


def test_deepseek_v2_router() -> None:
    v2 = DEEPSEEK_V3 | {"model_type": "deepseek_v2", "n_shared_experts": 2}
    greedy = model_from_hf_config(v2).moe_router
    # DeepseekV2Config: topk_method greedy, routed_scaling_factor 1.0, norm_topk_prob False
    assert greedy == MoERouter(score=RouterScore.SOFTMAX, normalize_top_k=False)
    grouped = model_from_hf_config(
        v2
        | {
            "topk_method": "group_limited_greedy",
            "n_group": 4,
            "topk_group": 2,
            "routed_scaling_factor": 16.0,
        }
    ).moe_router
    assert grouped is not None
    assert (grouped.num_groups, grouped.group_top_k, grouped.group_score_top_n) == (4, 2, 1)
    assert grouped.top_k_scaling_factor == 16.0
    with pytest.raises(InvalidModel, match="n_group' is required for group-limited routing"):
        model_from_hf_config(v2 | {"topk_method": "group_limited_greedy"})
    with pytest.raises(InvalidModel, match="'n_group' = 3 must divide the 16 routed experts"):
        model_from_hf_config(v2 | {"topk_method": "group_limited_greedy", "n_group": 3, "topk_group": 1})
    with pytest.raises(InvalidModel, match="scoring_func"):
        model_from_hf_config(v2 | {"scoring_func": "sigmoid"})


def test_qwen_moe_norm_topk_prob() -> None:
    qwen3_moe = {
        "model_type": "qwen3_moe",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "vocab_size": 100,
    }
    # Qwen3MoeConfig: norm_topk_prob=False
    assert model_from_hf_config(qwen3_moe).moe_router == MoERouter(normalize_top_k=False)
    assert model_from_hf_config(qwen3_moe | {"norm_topk_prob": True}).moe_router == MoERouter()


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # GPTNeoXConfig spells the base rotary_emb_base; layer_norm_eps 1e-5
        (
            {"model_type": "gpt_neox", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 1,
             "num_attention_heads": 4, "vocab_size": 100, "rotary_emb_base": 20000},
            (20000.0, 1e-5),
        ),
        # FalconConfig with ALiBi: no RoPE base; layer_norm_epsilon
        (
            {"model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
             "vocab_size": 100, "alibi": True, "layer_norm_epsilon": 1e-6},
            (None, 1e-6),
        ),
        # BertConfig: layer_norm_eps=1e-12, learned positions
        (
            {"model_type": "bert", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 1,
             "num_attention_heads": 4, "vocab_size": 100},
            (None, 1e-12),
        ),
        # GPT2Config: layer_norm_epsilon=1e-5
        ({"model_type": "gpt2", "n_embd": 64, "n_layer": 1, "n_head": 4, "vocab_size": 100}, (None, 1e-5)),
    ],
)  # fmt: skip
def test_each_family_spells_its_own_keys(
    config: dict[str, Any], expected: tuple[float | None, float]
) -> None:
    spec = model_from_hf_config(config)
    assert (spec.rope_theta, spec.norm_eps) == expected


def test_wrapper_and_class_default_scalings() -> None:
    # Gemma 3's text_config without the keys: Gemma3TextConfig rope_theta 1e6, rope_local_base_freq 1e4,
    # rms_norm_eps 1e-6
    gemma3 = model("gemma-3-27b").spec
    assert (gemma3.rope_theta, gemma3.rope_local_theta, gemma3.norm_eps) == (1e6, 1e4, 1e-6)
    assert gemma3.rope_scaling == RopeScaling(kind=RopeScalingKind.LINEAR, factor=8.0)
    # GptOssConfig's default rope_scaling is YaRN factor 32, truncate false
    oss = dict(model("gpt-oss-20b").config)
    del oss["rope_scaling"]
    scaling = model_from_hf_config(oss).rope_scaling
    assert scaling is not None and (scaling.kind, scaling.factor, scaling.truncate) == (
        RopeScalingKind.YARN,
        32.0,
        False,
    )


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"rope_theta": -1}, "hf_config.rope_theta", "must be > 0, got -1"),
        ({"rms_norm_eps": 0}, "hf_config.rms_norm_eps", "must be > 0, got 0"),
        ({"rope_theta": "big"}, "hf_config.rope_theta", "must be a finite number"),
        ({"rope_scaling": {"rope_type": "ntk", "factor": 2}}, "hf_config.rope_scaling.rope_type", "'ntk'"),
        ({"rope_scaling": {"rope_type": "linear"}}, "hf_config.rope_scaling.factor", "is required"),
        (
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "original_max_position_embeddings": 8192,
                }
            },
            "hf_config.rope_scaling.low_freq_factor",
            "is required for rope_type 'llama3'",
        ),
        ({"rope_scaling": {"rope_type": "yarn", "factor": -2}}, "hf_config.rope_scaling.factor", "got -2"),
    ],
)
def test_bad_values_are_refused_with_the_number(extra: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(InvalidModel, match=message) as info:
        model_from_hf_config({k: v for k, v in LLAMA_3_1_8B.items() if k not in HPARAM_KEYS} | extra)
    assert info.value.field == field


def test_model_spec_validates_them() -> None:
    base = small_llama()
    for fields, message in (
        ({"rope_theta": 0.0}, "rope_theta must be > 0, got 0.0"),
        ({"norm_eps": -1e-6}, "norm_eps must be > 0, got -1e-06"),
        ({"position_embedding": PositionEmbedding.LEARNED}, "rope_theta needs rotary position embeddings"),
        ({"moe_router": MoERouter()}, "moe_router needs moe"),
        (
            {
                "moe": MoESpec(num_experts=6, top_k=2, expert_ffn_hidden_size=64),
                "moe_router": MoERouter(num_groups=4, group_top_k=2, group_score_top_n=1),
            },
            r"moe.num_experts \(6\) is not a multiple of moe_router.num_groups \(4\)",
        ),
    ):
        with pytest.raises(InvalidModel, match=message):
            dataclasses.replace(base, **fields)
    with pytest.raises(InvalidModel, match=r"rope_scaling\.factor must be > 0, got 0"):
        RopeScaling(kind=RopeScalingKind.LINEAR, factor=0)
    with pytest.raises(InvalidModel, match=r"high_freq_factor \(1.0\) must be at least low_freq_factor"):
        RopeScaling(
            kind=RopeScalingKind.LLAMA3,
            factor=8,
            low_freq_factor=2.0,
            high_freq_factor=1.0,
            original_max_position_embeddings=8192,
        )
    # Llama 4 Scout's config.json: the two factors equal (transformers warns, the model runs)
    RopeScaling(
        kind=RopeScalingKind.LLAMA3,
        factor=16,
        low_freq_factor=1.0,
        high_freq_factor=1.0,
        original_max_position_embeddings=8192,
    )
    with pytest.raises(InvalidModel, match="go together"):
        MoERouter(num_groups=4)
    with pytest.raises(InvalidModel, match=r"group_top_k \(5\) exceeds num_groups \(4\)"):
        MoERouter(num_groups=4, group_top_k=5, group_score_top_n=1)


def without_hparams(name: str) -> tuple[Any, Any]:
    spec = model(name).spec
    bare = dataclasses.replace(
        spec, rope_theta=None, rope_local_theta=None, rope_scaling=None, norm_eps=None, moe_router=None
    )
    return spec, bare


@pytest.mark.parametrize("name", sorted(models()))
def test_no_parameter_count_reads_them(name: str) -> None:
    spec, bare = without_hparams(name)
    assert parameter_counts(spec) == parameter_counts(bare)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "deepseek-v3", "qwen3-30b-a3b", "gpt-oss-20b"])
def test_no_memory_or_time_figure_reads_them(name: str) -> None:
    spec, bare = without_hparams(name)
    nodes = cluster(4)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    layout = Layout(dp=8, tp=2, pp=2, zero_stage=1)
    assert memory(spec, nodes, layout, training) == memory(bare, nodes, layout, training)
    assert step_time(spec, nodes, layout, training) == step_time(bare, nodes, layout, training)
