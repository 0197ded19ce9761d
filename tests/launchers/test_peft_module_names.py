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
    mlp = 3 * (h + v3.ffn_hidden_size)
    # the MoE layers' MLP adapters are their shared experts' (transformers 5 fuses the routed ones)
    assert v3.moe is not None
    shared = 3 * (h + v3.moe.shared_expert_ffn_hidden_size * v3.moe.num_shared_experts)
    dense_layers = rp.layers - rp.moe_layers
    expected = 8 * (rp.layers * attention + dense_layers * mlp + rp.moe_layers * shared)
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
        ("mixtral-8x7b", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
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
        "training": {"seq_len": 512, "global_batch_size": 8, "method": "lora", "lora_targets": ["w1", "w2"]},
        "layout": {"framework": "fsdp"},
    }
    answer = client.post("/v1/estimates", json=body)
    assert answer.status_code == 422, answer.text
    (error,) = answer.json()["errors"]
    assert error["field"] == "training.lora_targets"
    assert all(repr(name) in error["message"] for name in modules), error["message"]
    assert "gate_proj" not in error["message"] or preset != "bert-base-uncased"
