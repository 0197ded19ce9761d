"""Inputs past what the planner can use are refused with a 422 naming the field and the limit, not
a 500 or a resource stored and never usable (bounded-work review, stop 39)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.helpers import assert_problem

LLAMA = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
}


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_a_config_nested_past_its_limit_is_a_422_naming_hf_config(client: TestClient) -> None:
    body = {
        "model": {"hf_config": {**LLAMA, "x": _nested(260)}},
        "cluster": {"gpu": "l40s-48gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 4096, "global_batch_size": 64},
    }
    for path in ("/v1/plans", "/v1/estimates"):
        problem = assert_problem(
            client.post(path, json=body | ({"layout": {}} if "estimates" in path else {})), 422
        )
        assert any("hf_config" in e["field"] and "32 levels" in e["message"] for e in problem["errors"]), (
            problem
        )
    shallow = {**body, "model": {"hf_config": {**LLAMA, "x": _nested(5)}}}
    assert client.post("/v1/plans", json=shallow).status_code == 201


def test_a_cluster_no_request_could_use_is_not_stored(client: TestClient) -> None:
    response = client.post(
        "/v1/clusters",
        json={"name": "huge", "gpu": "h100-sxm-80gb", "num_nodes": 100_000, "gpus_per_node": 64},
    )
    problem = assert_problem(response, 422)
    assert problem["errors"][0]["field"].endswith("num_nodes"), problem
    assert "262,144" in problem["errors"][0]["message"]
    assert problem["errors"][0]["limit"] == {"le": 262_144 // 64}  # nodes of 64, as pydantic's bounds
    assert client.get("/v1/clusters").json()["items"] == []


def test_a_job_past_the_scale_limits_names_the_quantity_and_its_limit(client: TestClient) -> None:
    """A review's case: seq_len 131072 x global_batch_size 16384 said "training.global_batch_size:
    2,147,483,648 is past ...": that is tokens per step, not the batch. It says which it is, and the
    limit comes machine-readable."""
    body = {"model": {"preset": "llama-3.1-8b"}, "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 2,
            "gpus_per_node": 8}, "training": {"seq_len": 131_072, "global_batch_size": 16_384}}  # fmt: skip
    problem = assert_problem(client.post("/v1/plans", json=body), 422)
    assert "2,147,483,648 tokens per step (seq_len x global_batch_size)" in problem["detail"]
    assert problem["errors"][0]["field"] == "training.global_batch_size"
    assert problem["errors"][0]["limit"] == {"le": 1_073_741_824 // 131_072}  # the batch at this seq_len
    assert "training.global_batch_size at most 8,192 here" in problem["detail"]


def test_a_timestamp_utc_cannot_hold_is_a_422(client: TestClient) -> None:
    for query in ("created_after=9999-12-31T23:59:59-05:00", "created_before=0001-01-01T00:00:00%2B01:00"):
        problem = assert_problem(client.get(f"/v1/plans?{query}"), 422)
        assert "outside the years 1 to 9999" in str(problem), problem
    assert client.get("/v1/plans?created_after=2026-01-01T00:00:00-05:00").status_code == 200


def test_a_list_page_ends_where_its_bytes_do_and_its_cursor_goes_on(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """500 plans of 316 KB made one GET 84 MB (six at once: 2 GB of memory); a page now ends at
    MAX_PAGE_BYTES of items, and its cursor leads to the rest, every plan once, as the API shows it."""
    from service.api import plans as plans_api

    body = {
        "model": {"preset": "gpt2"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 1024, "global_batch_size": 64},
        "constraints": {"top_k": 1},
    }
    ids = [client.post("/v1/plans", json=body).json()["id"] for _ in range(5)]
    one = client.get(f"/v1/plans/{ids[0]}").json()
    monkeypatch.setattr(plans_api, "MAX_PAGE_BYTES", 2 * len(json.dumps(one)) + 100)
    monkeypatch.setattr(plans_api, "PAGE_CHUNK", 2)
    seen, cursor, pages = [], None, 0
    while True:
        page = client.get("/v1/plans", params={"limit": 500, **({"cursor": cursor} if cursor else {})}).json()
        assert 1 <= len(page["items"]) <= 2, page  # two plans' bytes a page
        seen += page["items"]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [p["id"] for p in seen] == ids[::-1] and pages == 3
    assert next(p for p in seen if p["id"] == ids[0]) == one  # as GET /v1/plans/{id} shows it


def test_a_capacity_sweep_past_the_gpus_a_plan_may_have_is_refused_before_any_search(
    client: TestClient,
) -> None:
    """A plan's cluster is bounded at 262,144 GPUs (scale.MAX_GPUS); a capacity sweep searched up to
    max_nodes x 8 = 800,000 and timed on at_gpus up to ten million, spending its whole budget (8 s)
    on counts no plan may have (bounded-work review, stop 41). Each is a 422 naming its field and
    the largest count it may reach; within the bound the sweep answers."""
    body: dict[str, Any] = {
        "model": {"preset": "gpt2"},
        "training": {"seq_len": 1024, "global_batch_size": 8},
        "gpus": ["h100-sxm-80gb"],
    }
    problem = assert_problem(client.post("/v1/capacity", json=body | {"max_nodes": 100_000}), 422)
    assert problem["errors"][0]["field"] == "max_nodes" and "at most 32,768 nodes" in problem["detail"]
    assert problem["errors"][0]["limit"] == {"le": 32_768}
    problem = assert_problem(client.post("/v1/capacity", json=body | {"at_gpus": 300_000}), 422)
    assert problem["errors"][0]["field"] == "at_gpus" and "262,144" in problem["detail"]
    assert client.post("/v1/capacity", json=body | {"max_nodes": 32_768}).status_code == 200


ESTIMATE = {
    "model": {"preset": "llama-3.2-1b"},
    "training": {"seq_len": 2048, "global_batch_size": 32},
}


@pytest.mark.parametrize("count", [300_000, 6_000_000, 10**9])
def test_num_gpus_past_the_bound_is_named_as_sent(client: TestClient, count: int) -> None:
    """num_gpus stands for num_nodes x gpus_per_node: past the planner's bound it was refused naming
    num_nodes (a field not sent) with a limit in nodes, twice for 10^9 (the derived nodes' own bound)."""
    for path, body in (
        ("/v1/estimates", ESTIMATE | {"cluster": {"gpu": "h100-sxm-80gb", "num_gpus": count}}),
        ("/v1/clusters", {"name": "big", "gpu": "h100-sxm-80gb", "num_gpus": count}),
    ):
        problem = assert_problem(client.post(path, json=body), 422)
        fields = [e["field"] for e in problem["errors"]]
        assert fields in (["cluster.num_gpus"], ["num_gpus"]), problem
        assert problem["errors"][0]["limit"] == {"le": 262_144}


def test_a_one_gpu_node_past_the_node_bound_names_num_gpus(client: TestClient) -> None:
    body = ESTIMATE | {"cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 150_000, "gpus_per_node": 1}}
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    assert [(e["field"], e["limit"]) for e in problem["errors"]] == [("cluster.num_gpus", {"le": 100_000})]


@pytest.mark.parametrize(
    ("where", "field", "value", "limit"),
    [
        ("cluster", "inter_node_bandwidth_gbps", -5, {"ge": 0.001}),
        ("cluster", "inter_node_bandwidth_gbps", 1e9, {"le": 100_000}),
        ("gpu", "hbm_bandwidth_gbps", 0, {"ge": 0.001}),
    ],
)
def test_a_bandwidth_sent_in_gbps_is_refused_in_gbps(
    client: TestClient, where: str, field: str, value: float, limit: dict[str, float]
) -> None:
    """A bound broken by an `X_gbps` input was reported at `X_bytes_per_s`, with the limit in bytes/s."""
    gpu: Any = "h100-sxm-80gb"
    if where == "gpu":
        gpu = {
            "name": "mine",
            "memory_bytes": 80 * 2**30,
            "peak_flops_per_s": {"bf16": 1e15},
            field: value,
        }
    cluster: dict[str, Any] = {"gpu": gpu, "num_nodes": 2, "gpus_per_node": 8}
    if where == "cluster":
        cluster[field] = value
    problem = assert_problem(client.post("/v1/estimates", json=ESTIMATE | {"cluster": cluster}), 422)
    named = [e for e in problem["errors"] if e["field"].endswith(field)]
    assert named and named[0]["limit"] == limit, problem
    assert not any(e["field"].endswith("_bytes_per_s") for e in problem["errors"]), problem


def test_a_bandwidth_in_gbps_past_any_float_is_a_422_not_a_500(client: TestClient) -> None:
    cluster = {"gpu": "h100-sxm-80gb", "num_nodes": 2, "inter_node_bandwidth_gbps": 10**400}
    problem = assert_problem(client.post("/v1/estimates", json=ESTIMATE | {"cluster": cluster}), 422)
    assert [e["field"] for e in problem["errors"]] == ["cluster.inter_node_bandwidth_gbps"]


@pytest.mark.parametrize(
    ("cluster", "named"),
    [
        (
            {"num_nodes": 2, "inter_node_bandwidth_gbps": 50, "measured_inter_node_bus_bandwidth_gbps": 500},
            "measured_inter_node_bus_bandwidth_gbps",
        ),
        (
            {"num_nodes": 1, "measured_inter_node_bus_bandwidth_gbps": 40},
            "measured_inter_node_bus_bandwidth_gbps",
        ),
    ],
)
def test_a_cluster_rule_broken_by_a_gbps_input_names_it(
    client: TestClient, cluster: dict[str, Any], named: str
) -> None:
    """The rules a cluster checks as a whole (a measured busbw above its link, one with no link to
    describe) named the `_bytes_per_s` field a request that sent `_gbps` never named (review)."""
    body = ESTIMATE | {"cluster": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, **cluster}}
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    assert [e["field"] for e in problem["errors"]] == [f"cluster.{named}"]
    assert "_bytes_per_s" not in problem["detail"]


def test_more_gpus_per_node_than_a_host_runs_says_how_an_nvlink_rack_is_described(client: TestClient) -> None:
    """72 GPUs per node (a GB200 NVL72 rack) was refused with the bare limit: the 422 keeps the limit and
    says that a node is what one host runs, and the rack's fabric is the network (hardware review)."""
    body = {
        "model": {"preset": "llama-3.1-8b"},
        "cluster": {"gpu": "b200-sxm-180gb", "num_nodes": 1, "gpus_per_node": 72},
        "training": {"seq_len": 4096, "global_batch_size": 64},
    }
    problem = assert_problem(client.post("/v1/plans", json=body), 422)
    (error,) = problem["errors"]
    assert error["field"] == "cluster.gpus_per_node" and error["limit"] == {"le": 64}
    assert "less than or equal to 64" in error["message"] and "GB200 NVL72" in error["message"]
