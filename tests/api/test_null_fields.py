"""A JSON null for an input field that has a default is the field left out: Go, Java and TypeScript
encoders serialise an unset optional field as null, and `{"layout": {"cp": null}}` was a 422 "Input
should be a valid integer" (as were null constraints, launchers, optimizer, method, ...). The answer is
then the one the request without the field gets, and the OpenAPI document says such a field takes null.
A null whose meaning is its own (a PATCH removing a measured bandwidth) is untouched."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.contracts.common import null_means_default
from service.contracts.estimates import EstimateRequest
from service.contracts.plans import PlanRequest

ESTIMATE: dict[str, Any] = {
    "model": {"preset": "llama-3.2-1b"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
    "training": {"seq_len": 2048, "global_batch_size": 32},
    "layout": {"framework": "deepspeed", "zero_stage": 2, "dp": 8},
}


def _fields(schema: dict[str, Any], name: str) -> set[str]:
    properties = schema["components"]["schemas"][name]
    return set(properties["properties"]) - set(properties.get("required", ()))


def test_every_null_of_an_estimate_is_the_field_left_out(client: TestClient) -> None:
    plain = client.post("/v1/estimates", json=ESTIMATE)
    assert plain.status_code == 200, plain.text
    spec = client.get("/openapi.json").json()
    tried = 0
    for section, schema in (("cluster", "ClusterIn"), ("training", "TrainingIn"), ("layout", "LayoutIn")):
        for field in sorted(_fields(spec, schema)):
            body = copy.deepcopy(ESTIMATE)
            body[section][field] = None
            response = client.post("/v1/estimates", json=body)
            assert response.status_code == 200, (section, field, response.text)
            left_out = copy.deepcopy(ESTIMATE)
            left_out[section].pop(field, None)
            expected = client.post("/v1/estimates", json=left_out)
            assert response.json() == expected.json(), (section, field)
            tried += 1
    assert tried > 30


def test_a_null_dp_fills_the_cluster_as_a_left_out_dp_does(client: TestClient) -> None:
    body = copy.deepcopy(ESTIMATE)
    body["layout"] = {"framework": "fsdp", "dp": None, "tp": None, "cp": None}
    answer = client.post("/v1/estimates", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["layout"]["dp"] == 8
    assert answer.json()["resolved_defaults"]["layout.dp"] == "8"


@pytest.mark.parametrize("field", ["constraints", "launchers"])
def test_a_null_section_of_a_plan_is_its_default(client: TestClient, field: str) -> None:
    body = {k: v for k, v in ESTIMATE.items() if k != "layout"}
    response = client.post("/v1/plans", json=body | {field: None})
    assert response.status_code == 201, response.text


def test_a_catalog_filled_node_size_given_as_null_is_filled_in(client: TestClient) -> None:
    body = copy.deepcopy(ESTIMATE)
    body["cluster"] = {"gpu": "h100-sxm-80gb", "num_nodes": None, "gpus_per_node": None}
    answer = client.post("/v1/estimates", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["resolved_defaults"]["cluster.gpus_per_node"] == "8"


def test_a_required_field_given_as_null_is_still_refused(client: TestClient) -> None:
    body = copy.deepcopy(ESTIMATE)
    body["training"]["seq_len"] = None
    refused = client.post("/v1/estimates", json=body)
    assert refused.status_code == 422
    assert [e["field"] for e in refused.json()["errors"]] == ["training.seq_len"]


def test_the_openapi_document_says_which_fields_take_null(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for model, name in ((EstimateRequest, "EstimateRequest"), (PlanRequest, "PlanRequest")):
        for field in null_means_default(model):
            prop = schemas[name]["properties"][field]
            assert {"type": "null"} in prop.get("anyOf", []), (name, field, prop)
    layout = schemas["LayoutIn"]["properties"]["cp"]
    assert {"type": "null"} in layout["anyOf"] and layout["default"] == 1


# ---- what generated clients send (client-integration review, stop 44)


def test_every_integer_of_the_document_is_64_bit(client: TestClient) -> None:
    """Go's and Java's generated clients read an integer without a format as 32 bits: an H100's
    memory_bytes (85,899,345,920) failed to decode."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "integer":
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(client.get("/openapi.json").json())
    assert len(found) > 50 and all(node["format"] == "int64" for node in found)


def test_a_null_gbps_twin_beside_its_field_is_left_out(client: TestClient) -> None:
    cluster = {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
    for twins in (
        {"intra_node_bandwidth_bytes_per_s": None, "intra_node_bandwidth_gbps": None},
        {"intra_node_bandwidth_bytes_per_s": 4e11, "intra_node_bandwidth_gbps": None},
        {"intra_node_bandwidth_bytes_per_s": None, "intra_node_bandwidth_gbps": 400},
    ):
        body = copy.deepcopy(ESTIMATE) | {"cluster": cluster | twins}
        assert client.post("/v1/estimates", json=body).status_code == 200, twins
    both = copy.deepcopy(ESTIMATE) | {
        "cluster": cluster | {"intra_node_bandwidth_bytes_per_s": 4e11, "intra_node_bandwidth_gbps": 400}
    }
    assert client.post("/v1/estimates", json=both).status_code == 422


def test_capacity_constraints_sent_whole_with_their_defaults(client: TestClient) -> None:
    """A generated client sends every default of the constraints it builds: capacity's are its own
    (fewest_gpus, no offload), so sending them whole, or only max_gpus, changes nothing (offload had
    turned on once constraints were sent)."""
    schema = client.get("/openapi.json").json()["components"]["schemas"]["CapacityConstraintsIn"][
        "properties"
    ]
    defaults = {name: prop["default"] for name, prop in schema.items() if "default" in prop}
    assert defaults["objective"] == "fewest_gpus" and defaults["allow_offload"] is False
    body = {
        "model": {"preset": "llama-3.1-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 64},
        "gpus": ["h100-sxm-80gb"],
    }
    plain = client.post("/v1/capacity", json=body).json()["options"]
    whole = client.post("/v1/capacity", json=body | {"constraints": defaults}).json()["options"]
    assert [o["min_gpus"] for o in whole] == [o["min_gpus"] for o in plain]


def test_a_run_sent_with_every_default_is_read(client: TestClient) -> None:
    plan = client.post("/v1/plans", json={k: v for k, v in ESTIMATE.items() if k != "layout"}).json()
    runs = f"/v1/plans/{plan['id']}/runs"
    typed = {"step_s": 10.0, "format": "auto", "out_of_memory": False, "log": None}
    assert client.post(runs, json=typed).status_code == 201, client.post(runs, json=typed).text
    logged = {"log": "step: 10 loss: 2.0 tps: 1000", "out_of_memory": False, "step_s": None, "format": "auto"}
    response = client.post(runs, json=logged)
    assert response.status_code in (201, 422), response.text
    if response.status_code == 422:  # a log it cannot read: said as such, not as "not both"
        assert "not both" not in response.text


def test_a_patch_field_whose_null_is_refused_is_not_nullable_in_the_document(client: TestClient) -> None:
    from service.contracts.clusters import ClusterPatch

    schema = client.get("/openapi.json").json()["components"]["schemas"]["ClusterPatch"]["properties"]
    for name in ClusterPatch.null_refused:
        assert {"type": "null"} not in schema[name].get("anyOf", []), name
        assert schema[name].get("type") != "null", name
    # a measured bandwidth's null removes it: nullable
    assert {"type": "null"} in schema["measured_inter_node_bus_bandwidth_bytes_per_s"]["anyOf"]
