"""A generated client (openapi-generator's Java and Go, a typed TypeScript client) fills every field
with the default the OpenAPI document states and sends it. Each request must then be answered as the
request that leaves those fields out: a documented default the server reads as "given" changes the
answer or refuses it (LayoutIn.dp documented as 1: a world-size 422 on a node of 8 where left out fills
it; capacity's max_nodes documented as 1,024: refused beside cluster_ids, which take their own nodes)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fastapi.testclient import TestClient

TRAINING = {"seq_len": 1024, "global_batch_size": 32, "tokens": 2 * 10**9}


def _schema(spec: dict[str, Any], ref_or_schema: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema a property refers to (directly, or as the one non-null member of anyOf)."""
    if "$ref" in ref_or_schema:
        return spec["components"]["schemas"][ref_or_schema["$ref"].rsplit("/", 1)[1]]
    members = [m for m in ref_or_schema.get("anyOf", ()) if m.get("type") != "null"]
    if len(members) == 1 and "$ref" in members[0]:
        return _schema(spec, members[0])
    return None


def with_documented_defaults(spec: dict[str, Any], schema: dict[str, Any], body: dict[str, Any]) -> int:
    """Fills ``body`` in place with every documented default the schema's properties (and those of the
    objects the body holds) state, as a generated client does; returns how many it filled."""
    filled = 0
    for name, prop in schema.get("properties", {}).items():
        inner = _schema(spec, prop)
        if name not in body and "default" in prop and prop["default"] is not None:
            body[name] = copy.deepcopy(prop["default"])
            filled += 1
        if inner is not None and isinstance(body.get(name), dict):
            filled += with_documented_defaults(spec, inner, body[name])
    return filled


def _request_schema(spec: dict[str, Any], path: str) -> dict[str, Any]:
    content = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    found = _schema(spec, content)
    assert found is not None
    return found


def _same(path: str, answer: dict[str, Any], expected: dict[str, Any]) -> None:
    if path == "/v1/estimates":
        assert answer["layout"] == expected["layout"]
        assert (answer["memory"], answer["time"]) == (expected["memory"], expected["time"])
    elif path == "/v1/clusters":
        assert (answer["num_nodes"], answer["gpus_per_node"]) == (
            expected["num_nodes"],
            expected["gpus_per_node"],
        )
    elif path == "/v1/plans":
        chosen = [answer["recommended"]["layout"]] + [c["layout"] for c in answer["alternatives"]]
        assert chosen == [expected["recommended"]["layout"]] + [c["layout"] for c in expected["alternatives"]]
    else:
        keys = ("gpu", "cluster_id", "fits", "min_gpus", "layout", "tokens_per_s")
        assert [{k: o.get(k) for k in keys} for o in answer["options"]] == [
            {k: o.get(k) for k in keys} for o in expected["options"]
        ]


BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "estimate": (
        "/v1/estimates",
        {
            "model": {"preset": "llama-3.2-1b"},
            "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
            "training": {"seq_len": 2048, "global_batch_size": 32},
            "layout": {"framework": "fsdp"},
        },
    ),
    "estimate, num_gpus and accumulation steps": (
        "/v1/estimates",
        {
            "model": {"preset": "llama-3.2-1b"},
            "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 16},
            "training": {"seq_len": 2048, "global_batch_size": 64},
            "layout": {"framework": "fsdp", "gradient_accumulation_steps": 2},
        },
    ),
    "cluster from num_gpus": ("/v1/clusters", {"name": "sixteen", "gpu": "h100-sxm-80gb", "num_gpus": 16}),
    "plan": (
        "/v1/plans",
        {
            "model": {"preset": "llama-3.2-1b"},
            "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
            "training": {"seq_len": 2048, "global_batch_size": 32},
            "constraints": {},
        },
    ),
    "capacity, catalog GPUs": (
        "/v1/capacity",
        {"model": {"preset": "gpt2"}, "training": TRAINING, "gpus": ["a100-sxm-80gb"], "constraints": {}},
    ),
    "capacity, stored clusters": (
        "/v1/capacity",
        {"model": {"preset": "gpt2"}, "training": TRAINING, "cluster_ids": [], "constraints": {}},
    ),
}


@pytest.mark.parametrize("case", sorted(BODIES))
def test_every_documented_default_sent_is_the_answer_left_out(client: TestClient, case: str) -> None:
    path, minimal = copy.deepcopy(BODIES[case])
    if "cluster_ids" in minimal:
        made = client.post(
            "/v1/clusters", json={"name": "two", "gpu": "a100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 2}
        )
        minimal["cluster_ids"] = [made.json()["id"]]
    spec = client.get("/openapi.json").json()
    filled = copy.deepcopy(minimal)
    assert with_documented_defaults(spec, _request_schema(spec, path), filled) >= 2
    expected = client.post(path, json=minimal)
    if path == "/v1/clusters":  # the same cluster again, under another name
        filled["name"] = "again"
    answer = client.post(path, json=filled)
    assert expected.status_code < 300, expected.text
    assert answer.status_code < 300, (filled, answer.text)
    _same(path, answer.json(), expected.json())


def test_every_problem_s_errors_are_what_the_document_types_them(client: TestClient) -> None:
    """Problem.errors' items are typed (ProblemError: field and message, the rule's facts beside);
    a sample of every kind of refusal fits that type."""
    from service.contracts.common import ProblemError

    estimate = BODIES["estimate"][1]
    refusals = [
        client.post("/v1/estimates", json=estimate | {"training": {"seq_len": 0, "global_batch_size": 8}}),
        client.post("/v1/estimates", json=estimate | {"training": {"seq_len": 2048, "global_batch_size": 8,
                                                                      "precision": "bf17"}}),
        client.post("/v1/estimates", json=estimate | {"cluster": {"gpu": "H100", "num_nodes": 1}}),
        client.post("/v1/estimates", json=estimate | {"layout": {"framework": "fsdp", "tp": 3}}),
        client.post("/v1/plans", json={**BODIES["plan"][1], "constraints": {"frameworks": ["megatron"]},
                                       "training": {"seq_len": 2048, "global_batch_size": 32,
                                                    "method": "lora"}}),
        client.get("/v1/plans", params={"limit": 0}),
        client.get("/v1/plans", params={"nope": 1}),
    ]  # fmt: skip
    client.post("/v1/clusters", json={"name": "taken", "gpu": "h100-sxm-80gb", "num_nodes": 1})
    refusals.append(
        client.post("/v1/clusters", json={"name": "taken", "gpu": "h100-sxm-80gb", "num_nodes": 1})
    )
    for refused in refusals:
        assert 400 <= refused.status_code < 500, refused.text
        errors = refused.json().get("errors")
        assert errors, refused.text
        for error in errors:
            ProblemError.model_validate(error)
