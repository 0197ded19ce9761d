"""Limits as they combine (boundary review): what a search answers can be sent back, a patched cluster
past the service's scale names its field and limit as a new one does, and every bound says its limit."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.api.helpers import assert_problem

TINY = {
    "num_layers": 1, "hidden_size": 64, "num_attention_heads": 1, "num_kv_heads": 1,
    "ffn_hidden_size": 64, "vocab_size": 256, "mlp": "swiglu", "norm": "rmsnorm",
}  # fmt: skip


def test_a_recommended_layout_past_a_million_micro_batches_can_be_sent_back(client: TestClient) -> None:
    """The search answered micro_batch_size 1,048,576 and the layout field took at most 1,000,000."""
    body: dict[str, Any] = {
        "model": {"architecture": TINY},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"seq_len": 16, "global_batch_size": 67_108_864},
    }
    plan = client.post("/v1/plans", json=body)
    assert plan.status_code == 201, plan.text
    layout = plan.json()["recommended"]["layout"]
    assert layout["micro_batch_size"] * (layout["gradient_accumulation_steps"] or 1) == 67_108_864
    again = client.post("/v1/estimates", json=body | {"layout": layout})
    assert again.status_code == 200, again.text


def test_a_patched_cluster_past_the_gpu_limit_names_its_field_and_limit(client: TestClient) -> None:
    cluster = {"name": "big", "gpu": "h100-sxm-80gb", "num_nodes": 32_768, "gpus_per_node": 8}
    created = client.post("/v1/clusters", json=cluster)
    assert created.status_code == 201, created.text
    posted = assert_problem(
        client.post("/v1/clusters", json=cluster | {"name": "b", "num_nodes": 32_769}), 422
    )
    patched = assert_problem(
        client.patch(f"/v1/clusters/{created.json()['id']}", json={"num_nodes": 32_769}), 422
    )
    (post_error,), (patch_error,) = posted["errors"], patched["errors"]
    assert patch_error["field"] == post_error["field"] != ""
    assert patch_error["limit"] == post_error["limit"]


def test_capacitys_hourly_price_past_either_bound_names_the_limit(client: TestClient) -> None:
    body = {
        "model": {"preset": "gpt2"},
        "training": {"seq_len": 1024, "global_batch_size": 8},
        "gpus": ["h100-sxm-80gb"],
    }
    for price, limit in ((1_000_001, {"le": 1_000_000}), (-1, {"ge": 0.0})):
        (error,) = assert_problem(client.post("/v1/capacity", json=body | {"gpu_hour_cost": price}), 422)[
            "errors"
        ]
        assert error["field"] == "gpu_hour_cost" and error["limit"] == limit
