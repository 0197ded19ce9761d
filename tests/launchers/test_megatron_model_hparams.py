"""The Megatron-LM launch file trains the preset's model: its RoPE base and scaling, norm epsilon and
router (megatron/training/arguments.py and transformer_config.py @d98e8a6), or the preset is refused
with the reason. Values checked by hand against each config.json (the preset's source URL)."""

from __future__ import annotations

import dataclasses

import pytest

from service.catalog.models import model, models
from service.estimator.types import (
    Framework,
    ModelSpec,
    MoERouter,
    MoESpec,
    PositionEmbedding,
    RopeScaling,
    RopeScalingKind,
    RouterScore,
)
from service.launchers import Unsupported, megatron
from tests.launchers import checks
from tests.launchers.factories import plan, small_llama, training


def args_of(spec: ModelSpec, **layout: object) -> dict[str, str | None]:
    """The flags pretrain_gpt.py gets for the model (one node of 8 GPUs), as checks parses them."""
    words = megatron.megatron_args(plan(model=spec, framework=Framework.MEGATRON, **layout))
    return checks.megatron_flags(words)


def refusal(spec: ModelSpec) -> str:
    reason = megatron.job_refusal(spec, training())
    assert reason is not None
    with pytest.raises(Unsupported):
        megatron.megatron_args(plan(model=spec, framework=Framework.MEGATRON))
    return reason


def test_llama_3_1_8b_base_llama3_scaling_and_eps() -> None:
    # config.json: rope_theta 500000.0, rope_scaling llama3 factor 8 (low 1, high 4, original 8192),
    # rms_norm_eps 1e-05
    f = args_of(model("llama-3.1-8b").spec)
    assert f["--position-embedding-type"] == "rope"
    assert f["--rotary-base"] == "500000"
    assert "--use-rope-scaling" in f and f["--rope-scaling-factor"] == "8.0"
    assert f["--norm-epsilon"] == "1e-05"
    assert "--rotary-seq-len-interpolation-factor" not in f and "--rope-type" not in f


def test_qwen2_5_7b_base_and_eps() -> None:
    # config.json: rope_theta 1000000.0, rms_norm_eps 1e-06 (Megatron's default is 1e-5), no rope_scaling
    f = args_of(model("qwen2.5-7b").spec)
    assert (f["--rotary-base"], f["--norm-epsilon"]) == ("1000000", "1e-06")
    assert "--use-rope-scaling" not in f and "--add-qkv-bias" in f


def test_mistral_7b_base_and_its_refusal() -> None:
    # Mistral-7B-v0.1 config.json: rope_theta 10000.0, rms_norm_eps 1e-05, sliding_window 4096 on every
    # layer, which pretrain_gpt.py is not given: refused; without the window the base is emitted
    spec = model("mistral-7b").spec
    assert (spec.rope_theta, spec.norm_eps) == (10000.0, 1e-5)
    assert "sliding-window" in (megatron.job_refusal(spec, training(seq_len=8192)) or "")
    # a window of 4,096 keys masks nothing of a 4,096-token sequence: Megatron's full causal attention
    assert megatron.job_refusal(spec, training(seq_len=4096)) is None
    unwindowed = dataclasses.replace(spec, layer_types=(), sliding_window=None)
    f = args_of(unwindowed)
    assert (f["--rotary-base"], f["--norm-epsilon"]) == ("10000", "1e-05")


def test_deepseek_v3_router_and_yarn() -> None:
    # config.json: scoring_func sigmoid, topk_method noaux_tc (e_score_correction_bias), n_group 8,
    # topk_group 4, routed_scaling_factor 2.5, norm_topk_prob true; rope_scaling yarn factor 40,
    # mscale = mscale_all_dim = 1.0, original 4096, beta 32/1; rope_theta 10000; rms_norm_eps 1e-06
    f = args_of(model("deepseek-v3").spec, ep=8)
    assert f["--moe-router-score-function"] == "sigmoid"
    assert "--moe-router-enable-expert-bias" in f
    assert (f["--moe-router-num-groups"], f["--moe-router-group-topk"]) == ("8", "4")
    assert f["--moe-router-topk-scaling-factor"] == "2.5"
    assert "--moe-router-pre-softmax" not in f  # sigmoid weights renormalised (top-8 > 1)
    assert "--multi-latent-attention" in f and f["--position-embedding-type"] == "rope"
    assert f["--rope-type"] == "yarn"
    assert f["--rotary-scaling-factor"] == "40.0"
    assert (f["--mscale"], f["--mscale-all-dim"]) == ("1.0", "1.0")
    assert (f["--rotary-base"], f["--norm-epsilon"]) == ("10000", "1e-06")
    assert "--yarn-original-max-position-embeddings" not in f  # MLA's is fixed at 4096 = the model's


def test_deepseek_v2_lite_pre_softmax_without_groups() -> None:
    # config.json: softmax, topk_method greedy (n_group 1), norm_topk_prob false: the k softmax
    # probabilities as they are (--moe-router-pre-softmax); routed_scaling_factor 1.0; YaRN mscale 0.707
    f = args_of(model("deepseek-v2-lite").spec)
    assert f["--moe-router-score-function"] == "softmax" and "--moe-router-pre-softmax" in f
    assert not {"--moe-router-num-groups", "--moe-router-topk-scaling-factor"} & set(f)
    assert (f["--mscale"], f["--mscale-all-dim"]) == ("0.707", "0.707")


def test_qwen3_moe_norm_topk_prob_is_megatrons_default_softmax() -> None:
    # norm_topk_prob true: softmax, top-8, renormalised = softmax over the 8 selected logits, Megatron's
    # default (no --moe-router-pre-softmax)
    f = args_of(model("qwen3-30b-a3b").spec)
    assert f["--moe-router-score-function"] == "softmax" and "--moe-router-pre-softmax" not in f
    off = dataclasses.replace(model("qwen3-30b-a3b").spec, moe_router=MoERouter(normalize_top_k=False))
    assert "--moe-router-pre-softmax" in args_of(off)


def test_partial_rotary_keeps_its_base() -> None:
    # GPT-NeoX-20B: rotary_pct 0.25, rotary_emb_base 10000, layer_norm_eps 1e-05. Its parallel
    # attention + MLP blocks are refused (Megatron's layers are sequential): the flags of a
    # sequential twin
    neox = model("gpt-neox-20b").spec
    assert "parallel attention and MLP" in str(megatron.job_refusal(neox, training()))
    f = args_of(dataclasses.replace(neox, parallel_attn_mlp=False))
    assert (f["--rotary-percent"], f["--rotary-base"], f["--norm-epsilon"]) == ("0.25", "10000", "1e-05")


@pytest.mark.parametrize("name", sorted(models()))
def test_every_preset_gets_its_base_and_eps_or_is_refused(name: str) -> None:
    spec = model(name).spec
    if megatron.job_refusal(spec, training()) is not None:
        return
    f = args_of(spec)
    if spec.position_embedding is PositionEmbedding.ROPE:
        assert spec.rope_theta is not None
        assert f["--rotary-base"] == str(int(spec.rope_theta))
        assert int(str(f["--rotary-base"])) == spec.rope_theta
    else:
        assert "--rotary-base" not in f
    assert spec.norm_eps is not None and float(str(f["--norm-epsilon"])) == spec.norm_eps


def test_presets_refused_for_what_megatron_cannot_express() -> None:
    # Llama 3.2: llama3 factor 32, but pretrain_gpt.py's model takes factor 8 (--rope-scaling-factor is
    # not passed on by gpt_config_from_args)
    assert "factor 32.0" in refusal(model("llama-3.2-1b").spec)
    # DeepSeek-V2: group_limited_greedy scores a group by its best expert; Megatron by the sum of the
    # best top-k // group-topk = 6 // 3 = 2
    assert "top-k // group-topk = 2" in refusal(model("deepseek-v2").spec)
    # Gemma 3: base 1e6 on the global layers, 1e4 on the sliding ones
    assert "one --rotary-base" in refusal(model("gemma-3-1b").spec)


def test_unstated_hyperparameters_keep_megatrons_defaults() -> None:
    bare = dataclasses.replace(small_llama(), rope_theta=None, norm_eps=None)
    f = args_of(bare)
    assert not {"--rotary-base", "--norm-epsilon", "--use-rope-scaling"} & set(f)


def llama_with(scaling: RopeScaling | None = None, **fields: object) -> ModelSpec:
    return dataclasses.replace(small_llama(), rope_scaling=scaling, **fields)


def test_linear_scaling_is_position_interpolation() -> None:
    # transformers' linear: inv_freq / factor; Megatron: positions / factor (an integer flag)
    f = args_of(llama_with(RopeScaling(kind=RopeScalingKind.LINEAR, factor=4.0)))
    assert f["--rotary-seq-len-interpolation-factor"] == "4"
    refused = refusal(llama_with(RopeScaling(kind=RopeScalingKind.LINEAR, factor=2.5)))
    assert "--rotary-seq-len-interpolation-factor takes an integer" in refused


def test_yarn_without_mla_is_its_own_position_embedding() -> None:
    # Qwen2.5's suggested YaRN (factor 4, original 32768): transformers' attention factor
    # 0.1 ln 4 + 1 = 1.1386 is Megatron's get_mscale(4, 1.0) / get_mscale(4, 0.0)
    yarn = RopeScaling(
        kind=RopeScalingKind.YARN,
        factor=4.0,
        original_max_position_embeddings=32768,
        beta_fast=32.0,
        beta_slow=1.0,
    )
    f = args_of(llama_with(yarn))
    assert f["--position-embedding-type"] == "yarn"
    assert (f["--rotary-scaling-factor"], f["--mscale"], f["--mscale-all-dim"]) == ("4.0", "1.0", "0.0")
    assert f["--yarn-original-max-position-embeddings"] == "32768"
    assert (f["--yarn-beta-fast"], f["--yarn-beta-slow"]) == ("32.0", "1.0")
    assert "--no-yarn-correction-range-round-to-int" not in f
    untruncated = dataclasses.replace(yarn, truncate=False)  # gpt-oss
    assert "--no-yarn-correction-range-round-to-int" in args_of(llama_with(untruncated))
    # an explicit attention factor of 1 differs from the 1.1386 Megatron's flags give
    explicit = dataclasses.replace(yarn, attention_factor=1.0)
    assert "YaRN attention factor 1: Megatron's --mscale / --mscale-all-dim give 1.13863" in refusal(
        llama_with(explicit)
    )


@pytest.mark.parametrize(
    ("scaling", "fields", "expected"),
    [
        (RopeScaling(kind=RopeScalingKind.DYNAMIC, factor=2.0), {}, "dynamic RoPE scaling"),
        (RopeScaling(kind=RopeScalingKind.LONGROPE, factor=32.0), {}, "longrope RoPE scaling"),
        (None, {"rope_theta": 10000.5}, "--rotary-base takes an integer"),
        (
            RopeScaling(
                kind=RopeScalingKind.LLAMA3,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=2.0,
                original_max_position_embeddings=8192,
            ),
            {},
            "high_freq_factor 2.0",
        ),
    ],
)
def test_scalings_megatron_lacks_are_refused(
    scaling: RopeScaling | None, fields: dict[str, object], expected: str
) -> None:
    assert expected in refusal(llama_with(scaling, **fields))


def moe_llama(router: MoERouter, top_k: int = 2) -> ModelSpec:
    moe = MoESpec(num_experts=8, top_k=top_k, expert_ffn_hidden_size=1024)
    return dataclasses.replace(small_llama(), moe=moe, moe_router=router)


@pytest.mark.parametrize(
    ("router", "top_k", "expected"),
    [
        # softmax top-1 renormalised is a weight of 1: Megatron needs --moe-router-pre-softmax at top-1
        (MoERouter(), 1, "--moe-router-pre-softmax at top-1"),
        # sigmoid: Megatron renormalises exactly when top-k > 1
        (MoERouter(score=RouterScore.SIGMOID, normalize_top_k=False), 2, "sigmoid router without"),
        (MoERouter(score=RouterScore.SIGMOID, normalize_top_k=True), 1, "sigmoid router with"),
        (MoERouter(score_correction_bias=True), 2, "score-correction bias on a softmax router"),
        # renormalised softmax with groups summing 2 scores: Megatron would score the logits
        (
            MoERouter(num_groups=4, group_top_k=2, group_score_top_n=2),
            4,
            "scores the groups on the logits",
        ),
    ],
)
def test_routers_megatron_lacks_are_refused(router: MoERouter, top_k: int, expected: str) -> None:
    assert expected in refusal(moe_llama(router, top_k))


def test_routers_megatron_has() -> None:
    assert "--moe-router-pre-softmax" in args_of(moe_llama(MoERouter(normalize_top_k=False), top_k=1))
    llama4 = args_of(moe_llama(MoERouter(score=RouterScore.SIGMOID, normalize_top_k=False), top_k=1))
    assert llama4["--moe-router-score-function"] == "sigmoid"
    grouped = MoERouter(normalize_top_k=False, num_groups=4, group_top_k=2, group_score_top_n=2)
    f = args_of(moe_llama(grouped, top_k=4))
    assert (f["--moe-router-num-groups"], f["--moe-router-group-topk"]) == ("4", "2")
    assert "--moe-router-pre-softmax" in f
    unstated = dataclasses.replace(moe_llama(MoERouter()), moe_router=None)  # Megatron's default router
    assert "--moe-router-score-function" not in args_of(unstated)


def test_multi_token_prediction_runs_with_mla_yarn_only() -> None:
    # validate_args: MTP with --position-embedding-type rope or none; DeepSeek-V3's YaRN is the MLA's
    # own (--rope-type yarn), so its position-embedding type stays rope
    mtp = training(mtp_num_layers=1)
    assert megatron.job_refusal(model("deepseek-v3").spec, mtp) is None
    yarn = RopeScaling(kind=RopeScalingKind.YARN, factor=4.0, original_max_position_embeddings=32768)
    reason = megatron.job_refusal(llama_with(yarn), mtp)
    assert reason is not None and "multi-token prediction with YaRN" in reason


def test_granites_constant_scalings_are_refused() -> None:
    """GraniteModel multiplies the embeddings, attention scores, residual branches and logits by
    constants Megatron-LM's GPT has no flags for (no residual multiplier in Megatron-Core): its files
    trained a plain Llama (2025-26 configs review). A Granite config with the plain values renders."""
    granite = model("granite-3.3-8b").spec
    reason = refusal(granite)
    assert "residual_multiplier" in reason and "logits_scaling" in reason
    plain = dataclasses.replace(granite, scaled_constants=())
    assert megatron.job_refusal(plain, training()) is None


def test_llama_4_is_refused_even_where_its_chunks_mask_nothing() -> None:
    """Llama 4's chunked layers are its RoPE layers, the full ones NoPE, and its MoE scales the experts'
    input by the router scores: at 8,192 tokens its chunks mask nothing, and a Maverick plan rendered RoPE on
    every layer (change review)."""
    maverick = model("llama-4-maverick-17b-128e").spec
    for seq_len in (4096, 8192, 16384):
        reason = megatron.job_refusal(maverick, training(seq_len=seq_len))
        assert reason is not None and "NoPE" in reason
