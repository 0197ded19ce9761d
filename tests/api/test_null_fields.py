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
