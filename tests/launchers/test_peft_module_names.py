"""LoRA adapts the model's own modules: Phi-3 fuses q, k, v into qkv_proj and gate, up into
gate_up_proj; GPT-2, GPT-NeoX, Falcon and BLOOM name theirs otherwise (c_attn, query_key_value, ...).
The LoraConfig said q_proj ... down_proj for all of them (fine-tuning review, stop 39): on Phi-3 peft
adapted o_proj and down_proj only, silently; on the others it found no module and raised."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator.errors import EstimatorError
from service.estimator.job import make_job
from service.estimator.memory import rank_parameters_of
from service.estimator.model_states import lora_parameters
from service.estimator.types import ALL_LINEAR, Layout, Method, TrainingSpec
from service.estimator.validate import validate_layout
from tests.recommender.helpers import cluster


@pytest.mark.parametrize(
    "preset,modules",
    [
        ("phi-3-mini", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
        ("gpt2", ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]),
        ("falcon-7b", ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]),
        ("llama-3.1-8b", list(ALL_LINEAR)),
    ],
)
def test_the_lora_config_names_the_models_modules(
    client: TestClient, preset: str, modules: list[str]
) -> None:
    response = client.post(
        "/v1/plans",
        json={
            "model": {"preset": preset},
            "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
            "training": {"seq_len": 1024, "global_batch_size": 8, "method": "lora"},
            "launchers": ["hf_trainer"],
        },
    )
    assert response.status_code == 201, response.text
    plan = response.json()
    config = client.get(f"/v1/plans/{plan['id']}/artifacts/lora_config.json")
    assert config.status_code == 200, config.text
    assert sorted(json.loads(config.text)["target_modules"]) == sorted(modules)


def test_a_fused_module_is_one_adapter_and_is_targeted_whole() -> None:
    phi3 = model("phi-3-mini").spec
    h, q, kv, f = phi3.hidden_size, phi3.q_size, phi3.kv_size, phi3.ffn_hidden_size
    training = TrainingSpec(seq_len=1024, global_batch_size=8, method=Method.LORA, lora_rank=8)
    layout = Layout()
    rp = rank_parameters_of(
        make_job(phi3, cluster("h100-sxm-80gb", per_node=1), training, default_tuning()), layout, 0
    )
    # qkv_proj h -> q + 2 kv, o_proj q -> h, gate_up_proj h -> 2 f, down_proj f -> h: one adapter each
    per_layer = (h + q + 2 * kv) + (q + h) + (h + 2 * f) + (f + h)
    assert lora_parameters(phi3, training, layout, rp) == pytest.approx(8 * per_layer * phi3.num_layers)
    only_q = TrainingSpec(seq_len=1024, global_batch_size=8, method=Method.LORA, lora_targets=("q_proj",))
    with pytest.raises(EstimatorError, match="fuses q_proj, k_proj, v_proj into one module") as refused:
        validate_layout(phi3, cluster("h100-sxm-80gb", per_node=1), layout, only_q)
    assert refused.value.field == "lora_targets"


PHI_2 = {
    "architectures": ["PhiForCausalLM"], "model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 51200,
    "max_position_embeddings": 2048, "partial_rotary_factor": 0.4, "tie_word_embeddings": False,
    "hidden_act": "gelu_new", "layer_norm_eps": 1e-5,
}  # fmt: skip


def test_phi_2_adapts_dense_fc1_and_fc2_by_their_names(client: TestClient) -> None:
    """Phi-1/1.5/2 (modeling_phi.py) name the attention output dense and the MLP fc1, fc2: its own names
    were refused (422 "unknown lora_targets ['dense']"), and the Llama names it accepted rendered a
    LoraConfig peft matched on q and v alone while the estimate counted five adapters (small-model
    review, stop 41)."""
    body = {
        "model": {"hf_config": PHI_2},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"seq_len": 1024, "global_batch_size": 8, "method": "lora",
                     "lora_targets": ["q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"]},
        "launchers": ["hf_trainer"],
    }  # fmt: skip
    plan = client.post("/v1/plans", json=body)
    assert plan.status_code == 201, plan.text
    config = client.get(f"/v1/plans/{plan.json()['id']}/artifacts/lora_config.json").json()
    assert sorted(config["target_modules"]) == ["dense", "fc1", "fc2", "k_proj", "q_proj", "v_proj"]
    llama_names = body | {"training": body["training"] | {"lora_targets": "all-linear"}}
    same = client.post("/v1/plans", json=llama_names).json()
    again = client.get(f"/v1/plans/{same['id']}/artifacts/lora_config.json").json()
    assert sorted(again["target_modules"]) == sorted(config["target_modules"])


def test_latent_attention_adapts_its_own_modules(client: TestClient) -> None:
    """DeepSeek's multi-head latent attention has no k_proj or v_proj: keys and values share the
    kv_a_proj_with_mqa -> kv_b_proj latent, queries pass q_a_proj -> q_b_proj where q_lora_rank is set.
    The LoraConfig named k_proj and v_proj (peft adapts nothing there, silently) and the estimate
    counted Llama-shaped adapters; the module names a DeepSeek recipe gives were refused (config
    review, stop 41)."""
    v3 = model("deepseek-v3").spec
    mla, h, n = v3.mla, v3.hidden_size, v3.num_attention_heads
    assert mla is not None and mla.q_lora_rank is not None
    training = TrainingSpec(seq_len=1024, global_batch_size=8, method=Method.LORA, lora_rank=8)
    layout = Layout()
    rp = rank_parameters_of(
        make_job(v3, cluster("h100-sxm-80gb", per_node=8), training, default_tuning()), layout, 0
    )
    qk, r = mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.kv_lora_rank
    attention = (
        (h + mla.q_lora_rank) + (mla.q_lora_rank + n * qk)  # q_a_proj, q_b_proj
        + (h + r + mla.qk_rope_head_dim) + (r + n * (mla.qk_nope_head_dim + mla.v_head_dim))  # kv_a, kv_b
        + (n * mla.v_head_dim + h)  # o_proj
    )  # fmt: skip
    # the MLP targets peft 0.21 moves onto the fused routed experts (model_states.
    # peft_adapts_fused_experts): gate_up_proj at rank 2r, down_proj at r, r x E rows each; the dense
    # layers' MLPs and the shared experts keep none
    assert v3.moe is not None
    e, f = v3.moe.num_experts, v3.moe.expert_ffn_hidden_size
    experts = 2 * e * (h + 2 * f) + e * (f + h)
    expected = 8 * (rp.layers * attention + rp.moe_layers * experts)
    assert lora_parameters(v3, training, layout, rp) == pytest.approx(expected)

    body = {
        "model": {"preset": "deepseek-v2-lite"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 1024, "global_batch_size": 8, "method": "lora",
                     "lora_targets": ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]},
        "launchers": ["hf_trainer"],
    }  # fmt: skip
    plan = client.post("/v1/plans", json=body)
    assert plan.status_code == 201, plan.text
    config = client.get(f"/v1/plans/{plan.json()['id']}/artifacts/lora_config.json").json()
    assert sorted(config["target_modules"]) == ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "q_proj"]
    llama_names = body | {
        "training": body["training"] | {"lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    }
    same = client.post("/v1/plans", json=llama_names).json()
    again = client.get(f"/v1/plans/{same['id']}/artifacts/lora_config.json").json()
    assert again["target_modules"] == config["target_modules"]
    half = body | {"training": body["training"] | {"lora_targets": ["q_proj", "kv_b_proj"]}}
    # kv_b_proj holds keys and values, as kv_a_proj_with_mqa does: both or neither
    assert client.post("/v1/plans", json=half).status_code == 201


@pytest.mark.parametrize(
    "preset,modules",
    [
        (
            "mixtral-8x7b",
            ["q_proj", "k_proj", "v_proj", "o_proj", "w1", "w3", "w2", "gate_proj", "down_proj"],
        ),
        ("phi-3-mini", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
        ("bert-base-uncased", ["query", "key", "value", "dense"]),
    ],
)
def test_an_unknown_target_is_told_the_models_own_modules(
    client: TestClient, preset: str, modules: list[str]
) -> None:
    """Mixtral's transformers-4 expert names were answered with Llama's seven names alone; the model's
    own (Phi-3's qkv_proj, BERT's query) were accepted yet not listed (config review, stop 41)."""
    body = {
        "model": {"preset": preset},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"seq_len": 512, "global_batch_size": 8, "method": "lora", "lora_targets": ["fc9", "w9"]},
        "layout": {"framework": "fsdp"},
    }
    answer = client.post("/v1/estimates", json=body)
    assert answer.status_code == 422, answer.text
    (error,) = answer.json()["errors"]
    assert error["field"] == "training.lora_targets"
    assert all(repr(name) in error["message"] for name in modules), error["message"]
    assert "gate_proj" not in error["message"] or preset != "bert-base-uncased"


def test_mixtral_s_expert_names_are_what_peft_maps_onto_its_fused_experts(client: TestClient) -> None:
    """peft 0.21 maps Mixtral's transformers-4 expert names, w1 (gate), w3 (up) and w2 (down), onto the
    fused experts (transformers_weight_conversion._MOE_TARGET_MODULE_MAPPING), not Llama's: the launch
    file names them, and naming w1 without w3 is refused as peft refuses it ("Cannot convert PEFT
    target(s) w1 without also targeting w3"; config review, stop 44)."""
    body = {
        "model": {"preset": "mixtral-8x7b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 512, "global_batch_size": 8, "method": "lora", "lora_targets": ["w1", "w2"]},
        "layout": {"framework": "deepspeed", "zero_stage": 3, "dp": 8},
    }
    refused = client.post("/v1/estimates", json=body)
    assert refused.status_code == 422, refused.text
    assert "gate_up_proj" in refused.json()["errors"][0]["message"]
    plan = client.post(
        "/v1/plans",
        json={k: v for k, v in body.items() if k != "layout"}
        | {
            "training": body["training"] | {"lora_targets": ["q_proj", "w1", "w3", "w2"]},
            "launchers": ["hf_trainer"],
        },
    )
    assert plan.status_code == 201, plan.text
    assert plan.json()["status"] == "feasible", plan.json()
    config = client.get(f"/v1/plans/{plan.json()['id']}/artifacts/lora_config.json").json()
    assert sorted(config["target_modules"]) == ["q_proj", "w1", "w2", "w3"]
