"""Model presets and POST /v1/models/resolve: the three ways to name a model agree."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.helpers import assert_problem

CONTRACT_PRESETS = {
    "gpt2", "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-8b",
    "llama-3.1-70b", "llama-3.1-405b", "mistral-7b", "mixtral-8x7b", "qwen2.5-0.5b", "qwen2.5-7b",
    "qwen2.5-72b", "gemma-2b", "phi-3-mini", "gpt-neox-20b", "falcon-7b", "gpt-3-175b", "bloom-176b",
}  # fmt: skip

LLAMA_2_7B_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


def resolve(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/models/resolve", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_every_contract_preset_is_listed_with_a_source(client: TestClient) -> None:
    items = client.get("/v1/models", params={"limit": 500}).json()["items"]  # the whole catalog
    assert CONTRACT_PRESETS <= {m["name"] for m in items}
    assert all(m["source"] for m in items)


def test_preset_hf_config_and_architecture_resolve_to_the_same_count(client: TestClient) -> None:
    # Llama-2-7B: 6,738,415,616 parameters as PyTorch counts them (validation/param_counts.py).
    by_preset = resolve(client, {"model": {"preset": "llama-2-7b"}})
    by_config = resolve(client, {"model": {"hf_config": LLAMA_2_7B_CONFIG}})
    by_fields = resolve(
        client,
        {
            "model": {
                "architecture": {
                    "num_layers": 32,
                    "hidden_size": 4096,
                    "num_attention_heads": 32,
                    "ffn_hidden_size": 11008,
                    "vocab_size": 32000,
                }
            }
        },
    )
    totals = {r["parameters"]["total"] for r in (by_preset, by_config, by_fields)}
    assert totals == {6_738_415_616}
    assert by_preset["parameters"]["embedding"] == 32000 * 4096


def test_per_stage_counts_sum_to_the_total(client: TestClient) -> None:
    result = resolve(client, {"model": {"preset": "llama-2-7b"}, "pp": 4})
    stages = result["parameters"]["per_stage"]
    assert len(stages) == 4
    assert sum(stages) == result["parameters"]["total"]  # untied: no duplicated embedding


def test_get_one_preset_and_unknown_preset(client: TestClient) -> None:
    body = client.get("/v1/models/mixtral-8x7b").json()
    assert body["architecture"]["moe"]["num_experts"] == 8
    assert_problem(client.get("/v1/models/llama-9"), 404)
    problem = assert_problem(client.post("/v1/models/resolve", json={"model": {"preset": "llama-9"}}), 422)
    assert problem["errors"][0]["field"] == "model.preset"


@pytest.mark.parametrize("method", ["OPTIONS", "GET", "HEAD", "PUT", "DELETE"])
def test_resolve_answers_only_post_not_the_preset_route(client: TestClient, method: str) -> None:
    """/v1/models/resolve is POST's alone: other methods are the 405 every route answers, naming POST,
    not GET /v1/models/{name} looking up a preset called "resolve"."""
    response = client.request(method, "/v1/models/resolve")
    assert response.status_code == 405, response.text
    assert response.headers["allow"] == "POST"
    if method != "HEAD":
        assert "allowed: POST" in assert_problem(response, 405)["detail"]
    assert "/v1/models/{name}" in client.get("/openapi.json").json()["paths"]  # the path as documented


def test_model_needs_exactly_one_form(client: TestClient) -> None:
    both = {"preset": "gpt2", "hf_config": LLAMA_2_7B_CONFIG}
    assert_problem(client.post("/v1/models/resolve", json={"model": both}), 422)
    assert_problem(client.post("/v1/models/resolve", json={"model": {}}), 422)


def test_bad_architecture_names_the_field(client: TestClient) -> None:
    arch = {
        "num_layers": 2,
        "hidden_size": 100,
        "num_attention_heads": 3,
        "ffn_hidden_size": 10,
        "vocab_size": 5,
    }
    problem = assert_problem(client.post("/v1/models/resolve", json={"model": {"architecture": arch}}), 422)
    assert problem["errors"][0]["field"] == "model.architecture.head_dim"
    unsupported = {"model_type": "t5", "d_model": 512}
    problem = assert_problem(
        client.post("/v1/models/resolve", json={"model": {"hf_config": unsupported}}), 422
    )
    assert problem["errors"][0]["field"] == "model.hf_config.model_type"
    # a review's case: a zero config key was named by ModelSpec's field (hf_config.num_layers)
    zero = {"model_type": "llama", "num_hidden_layers": 0, "hidden_size": 512, "num_attention_heads": 8,
            "intermediate_size": 1024, "vocab_size": 1000}  # fmt: skip
    problem = assert_problem(client.post("/v1/models/resolve", json={"model": {"hf_config": zero}}), 422)
    assert problem["errors"][0]["field"] == "model.hf_config.num_hidden_layers"


def test_pp_that_does_not_divide_layers_splits_unevenly(client: TestClient) -> None:
    # gpt2's 12 layers on 5 stages: 14 units with the embedding and the loss, 3 3 3 3 2, less one
    # each at the ends; more stages than 14 units cannot each hold something
    response = client.post("/v1/models/resolve", json={"model": {"preset": "gpt2"}, "pp": 5})
    assert response.status_code == 200, response.text
    parameters = response.json()["parameters"]
    assert parameters["stage_layers"] == [2, 3, 3, 3, 1]
    assert len(parameters["per_stage"]) == 5
    problem = assert_problem(
        client.post("/v1/models/resolve", json={"model": {"preset": "gpt2"}, "pp": 16}), 422
    )
    assert "12" in problem["detail"] and "16" in problem["detail"]


def test_presets_filter_by_family(client: TestClient) -> None:
    listed = client.get("/v1/models", params={"limit": 500}).json()["items"]
    families = {item["family"] for item in listed}
    assert "llama" in families
    llamas = client.get("/v1/models", params={"family": "llama", "limit": 500}).json()["items"]
    assert llamas and {item["family"] for item in llamas} == {"llama"}
    assert {item["name"] for item in llamas} == {item["name"] for item in listed if item["family"] == "llama"}
    problem = assert_problem(client.get("/v1/models", params={"family": "nope"}), 422)
    assert problem["errors"][0]["field"] == "family" and "llama" in problem["detail"]


def test_the_new_architecture_fields_resolve_to_the_count(client: TestClient) -> None:
    # a 4-layer DeepSeek-style miniature: MLA, dense first layer then MoE, sliding layers
    body = {
        "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "ffn_hidden_size": 512,
        "vocab_size": 1000, "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 128},
        "moe_layers": [1, 2, 3],
        "mla": {"q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                "v_head_dim": 16},
        "layer_types": ["sliding", "full", "sliding", "full"], "sliding_window": 128,
    }  # fmt: skip
    got = resolve(client, {"model": {"architecture": body}})["parameters"]
    # MLA: q_a 256*64 + norm 64 + q_b 64*4*24 + kv_a 256*(32+8) + norm 32 + kv_b 32*4*(16+16) + o 4*16*256
    attention = 256 * 64 + 64 + 64 * 4 * 24 + 256 * 40 + 32 + 32 * 4 * 32 + 64 * 256
    assert got["attention_per_layer"] == attention
    # layer 0 dense (3 x 256 x 512), layers 1-3: 8 experts of 3 x 256 x 128 + router 256 x 8
    layers = 4 * (attention + 2 * 256) + 3 * 256 * 512 + 3 * (8 * 3 * 256 * 128 + 256 * 8)
    assert got["total"] == 1000 * 256 * 2 + 256 + layers
    bad = client.post("/v1/models/resolve", json={"model": {"architecture": body | {"sliding_window": None}}})
    assert assert_problem(bad, 422)["errors"][0]["field"] == "model.architecture.sliding_window"


def test_every_presets_architecture_sent_back_is_the_preset(client: TestClient) -> None:
    """What GET /v1/models/{name} and /v1/models/resolve show as the architecture is the explicit form
    itself: sent back as model.architecture it resolves to the same model, counts and all. It carried
    name and family, which the explicit form refused (422: extra fields), and without family a model
    of a fused-QKV family (GPT-2, Falcon, BLOOM) was counted as a custom one."""
    names = [item["name"] for item in client.get("/v1/models", params={"limit": 500}).json()["items"]]
    assert len(names) >= 50
    for name in names:
        shown = client.get(f"/v1/models/{name}").json()
        assert "name" not in shown["architecture"], name
        assert shown["architecture"]["family"] == shown["family"]
        again = resolve(client, {"model": {"architecture": shown["architecture"], "name": name}})
        preset = resolve(client, {"model": {"preset": name}})
        # the notes are what only the config states (a multimodal wrapper's vision tower)
        assert preset["notes"] == shown["notes"] and again.pop("notes") == []
        assert again == {k: v for k, v in preset.items() if k != "notes"}, name
        twice = resolve(client, {"model": {"architecture": again["architecture"], "name": name}})
        assert twice == {k: v for k, v in preset.items() if k != "notes"} | {"notes": []}


def test_an_explicit_family_is_used_and_an_unknown_one_refused(client: TestClient) -> None:
    shown = client.get("/v1/models/gpt2").json()["architecture"]
    estimate = {
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"seq_len": 1024, "global_batch_size": 8},
        "layout": {"framework": "fsdp"},
    }
    by_fields = client.post("/v1/estimates", json={**estimate, "model": {"architecture": shown}})
    by_preset = client.post("/v1/estimates", json={**estimate, "model": {"preset": "gpt2"}})
    assert by_fields.status_code == by_preset.status_code == 200, by_fields.text
    assert by_fields.json()["memory"] == by_preset.json()["memory"]
    custom = client.post(
        "/v1/estimates", json={**estimate, "model": {"architecture": {**shown, "family": "custom"}}}
    )
    assert custom.json()["memory"] != by_preset.json()["memory"]  # GPT-2's fused c_attn is its family's
    problem = assert_problem(
        client.post("/v1/models/resolve", json={"model": {"architecture": {**shown, "family": "gtp2"}}}), 422
    )
    assert problem["errors"][0]["field"] == "model.architecture.family"
    assert "'gtp2' is not a model_type we know" in problem["errors"][0]["message"]


def test_a_config_json_refusal_names_the_key_the_config_states_or_the_default_it_took(
    client: TestClient,
) -> None:
    """A Mixtral config without num_key_value_heads was refused at "model.hf_config.num_kv_heads", a key
    no config has, over MixtralConfig's default 8 it never sent; 2,000 layers were refused at
    "model.num_layers" (past 1,024) though the parse guard had said 10,000 (a review of the ordinary
    requests): a ModelSpec rule names the config's own key, or the config and the default it took, and a
    config's layers have the one limit the service plans for."""
    small = {"hidden_size": 256, "intermediate_size": 256, "num_attention_heads": 2, "vocab_size": 1000}
    resolve = "/v1/models/resolve"
    mixtral = {"model_type": "mixtral", "num_hidden_layers": 2, **small}
    error = assert_problem(client.post(resolve, json={"model": {"hf_config": mixtral}}), 422)["errors"][0]
    assert error["field"] == "model.hf_config" and "states no num_key_value_heads" in error["message"], error
    stated = mixtral | {"num_key_value_heads": 3}
    error = assert_problem(client.post(resolve, json={"model": {"hf_config": stated}}), 422)["errors"][0]
    assert error["field"] == "model.hf_config.num_key_value_heads", error
    deep = {"model_type": "llama", "num_hidden_layers": 2000, **small}
    error = assert_problem(client.post(resolve, json={"model": {"hf_config": deep}}), 422)["errors"][0]
    assert error["field"] == "model.hf_config.num_hidden_layers" and error["limit"] == {"le": 1024}, error


@pytest.mark.parametrize(
    ("config", "key"),
    [
        (
            {"model_type": "qwen3_moe", "hidden_size": 2048, "num_attention_heads": 32,
             "num_key_value_heads": 4, "num_hidden_layers": 4, "intermediate_size": 6144,
             "moe_intermediate_size": 768, "vocab_size": 151936, "num_experts": 128,
             "num_experts_per_tok": 130},
            "num_experts_per_tok",
        ),
        (
            {"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32, "num_hidden_layers": 4,
             "intermediate_size": 8192, "vocab_size": 32064, "partial_rotary_factor": 1.5},
            "partial_rotary_factor",
        ),
        (
            {"model_type": "llama4_text", "hidden_size": 5120, "num_attention_heads": 40,
             "num_key_value_heads": 8, "num_hidden_layers": 4, "intermediate_size": 8192,
             "intermediate_size_mlp": 16384, "vocab_size": 202048, "num_local_experts": 0},
            "num_local_experts",
        ),
    ],
)  # fmt: skip
def test_an_moe_or_rotary_rule_names_the_key_the_config_states(
    client: TestClient, config: dict[str, object], key: str
) -> None:
    """Only the heads, widths and vocabulary were looked up in the config: top_k 130 over 128 experts
    was answered at "model.hf_config", saying the config states no moe.top_k (hybrid review)."""
    problem = assert_problem(client.post("/v1/models/resolve", json={"model": {"hf_config": config}}), 422)
    (error,) = problem["errors"]
    assert error["field"] == f"model.hf_config.{key}", error
    assert "states no" not in error["message"], error
