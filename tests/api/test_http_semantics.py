"""HTTP's own rules, as an API gateway or a generated client relies on them (HTTP-semantics review):
conditional requests (If-None-Match), one value per query parameter, cursors bound to their list,
405's Allow, URI-reference problem instances, bodies the service cannot read (a content coding, JSON
Patch), and values no column stores inside free-form objects (a lone surrogate, NaN)."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.helpers import assert_problem

CLUSTER = {"name": "a", "gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
JSON = {"content-type": "application/json"}


def _cluster(client: TestClient, name: str = "a") -> str:
    response = client.post("/v1/clusters", json={**CLUSTER, "name": name})
    assert response.status_code == 201
    return str(response.json()["id"])


def test_a_get_whose_if_none_match_names_the_current_etag_is_a_304_without_a_body(client: TestClient) -> None:
    cluster = _cluster(client)
    for tag in ('"1"', 'W/"1"', '"5", "1"', "*"):
        response = client.get(f"/v1/clusters/{cluster}", headers={"If-None-Match": tag})
        assert response.status_code == 304 and response.content == b""
        assert response.headers["etag"] == '"1"'
    response = client.get(f"/v1/clusters/{cluster}", headers={"If-None-Match": '"2"'})
    assert response.status_code == 200 and response.json()["id"] == cluster


@pytest.mark.parametrize("tag", ["*", '"1"', 'W/"1"'])
@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE"])
def test_a_write_whose_if_none_match_matches_is_a_412_and_changes_nothing(
    client: TestClient, method: str, tag: str
) -> None:
    cluster = _cluster(client)
    body = {"PUT": {**CLUSTER, "num_nodes": 2}, "PATCH": {"num_nodes": 2}, "DELETE": None}[method]
    response = client.request(method, f"/v1/clusters/{cluster}", json=body, headers={"If-None-Match": tag})
    problem = assert_problem(response, 412)
    assert problem["errors"][0]["field"] == "header.If-None-Match"
    stored = client.get(f"/v1/clusters/{cluster}").json()
    assert stored["version"] == 1 and stored["num_nodes"] == 1


def test_a_write_whose_if_none_match_names_another_version_goes_through(client: TestClient) -> None:
    cluster = _cluster(client)
    response = client.patch(
        f"/v1/clusters/{cluster}", json={"num_nodes": 2}, headers={"If-None-Match": '"7"'}
    )
    assert response.status_code == 200 and response.json()["version"] == 2


@pytest.mark.parametrize(
    ("path", "name"),
    [("/v1/gpus?vendor=amd&vendor=nvidia", "vendor"), ("/v1/clusters?limit=2&limit=3", "limit")],
)
def test_a_query_parameter_given_twice_is_refused_naming_it(client: TestClient, path: str, name: str) -> None:
    problem = assert_problem(client.get(path), 422)
    assert problem["errors"] == [
        {"field": f"query.{name}", "message": problem["errors"][0]["message"], "type": "repeated"}
    ]
    assert "2 times" in problem["errors"][0]["message"]


def test_a_cursor_pages_only_the_list_that_issued_it(client: TestClient) -> None:
    for name in ("a", "b", "c"):
        _cluster(client, name)
    first = client.get("/v1/clusters?limit=1").json()
    cursor = first["next_cursor"]
    second = client.get(f"/v1/clusters?limit=1&cursor={cursor}").json()
    assert second["items"][0]["name"] != first["items"][0]["name"]
    plan = client.post(
        "/v1/plans",
        json={
            "model": {"preset": "gpt2"},
            "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
            "training": {"seq_len": 1024, "global_batch_size": 8},
        },
    ).json()
    for path in ("/v1/plans", f"/v1/plans/{plan['id']}/runs"):
        problem = assert_problem(client.get(f"{path}?cursor={cursor}"), 422)
        assert problem["errors"][0]["field"] == "query.cursor"


def test_a_runs_cursor_pages_only_its_own_plans_runs(client: TestClient) -> None:
    """A cursor of plan A's runs paged plan B's from A's position, skipping B's older runs (change review)."""
    body = {
        "model": {"preset": "gpt2"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"seq_len": 1024, "global_batch_size": 8},
    }
    plans = [client.post("/v1/plans", json=body).json()["id"] for _ in range(2)]
    for plan in plans:
        for step_s in (1.0, 1.1, 1.2):
            assert client.post(f"/v1/plans/{plan}/runs", json={"step_s": step_s}).status_code == 201
    cursor = client.get(f"/v1/plans/{plans[0]}/runs?limit=1").json()["next_cursor"]
    assert client.get(f"/v1/plans/{plans[0]}/runs?limit=1&cursor={cursor}").status_code == 200
    problem = assert_problem(client.get(f"/v1/plans/{plans[1]}/runs?limit=1&cursor={cursor}"), 422)
    assert problem["errors"][0]["field"] == "query.cursor"


def test_a_405_allows_head_wherever_get_is_served(client: TestClient) -> None:
    response = client.delete("/v1/gpus")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD"
    assert client.head("/v1/gpus").status_code == 200


@pytest.mark.parametrize(
    "sent",
    [
        "/v1/plans/%C3%A9%20x%3Cy",
        "/v1/plans/x%3Fy",
        "/v1/plans/x%23y%5Cz",
        "/v1/plans/a%2Fb",
        "/v1/plans/%FF",
    ],
)
def test_a_problem_instance_is_a_uri_reference_of_the_path_sent(client: TestClient, sent: str) -> None:
    """Encoded once: ? # and \\ came back as %253F, %2523, %255C (Starlette's url.path re-encodes them;
    change review)."""
    problem = assert_problem(client.get(sent), 404)
    assert problem["instance"] == sent


def test_a_compressed_body_is_a_415_saying_identity_and_nothing_is_stored(client: TestClient) -> None:
    for body in (gzip.compress(json.dumps(CLUSTER).encode()), json.dumps(CLUSTER).encode()):
        response = client.post("/v1/clusters", content=body, headers={**JSON, "content-encoding": "gzip"})
        problem = assert_problem(response, 415)
        assert response.headers["accept-encoding"] == "identity"
        assert problem["errors"][0]["field"] == "header.content-encoding"
    assert client.get("/v1/clusters").json()["items"] == []


def test_a_json_patch_is_a_415_naming_the_patch_formats(client: TestClient) -> None:
    cluster = _cluster(client)
    operations = [{"op": "replace", "path": "/num_nodes", "value": 2}]
    response = client.patch(
        f"/v1/clusters/{cluster}",
        content=json.dumps(operations),
        headers={"content-type": "application/json-patch+json"},
    )
    assert_problem(response, 415)
    assert "application/merge-patch+json" in response.headers["accept-patch"]
    merge = client.patch(
        f"/v1/clusters/{cluster}",
        content=json.dumps({"num_nodes": 2}),
        headers={"content-type": "application/merge-patch+json"},
    )
    assert merge.status_code == 200 and merge.json()["num_nodes"] == 2


HF = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
}


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ('"_name_or_path": "\\ud800x"', "_name_or_path", "surrogate"),
        ('"initializer_range": NaN', "initializer_range", "NaN"),
        ('"initializer_range": -Infinity', "initializer_range", "-Infinity"),
        ('"nested": {"note": "a\\u0000b"}', "nested.note", "NUL"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/plans", "/v1/estimates"])
def test_a_value_no_column_stores_inside_hf_config_is_a_422_naming_its_key(
    client: TestClient, path: str, extra: str, key: str, words: str
) -> None:
    """A lone surrogate stored in a plan's hf_config was a 500 at the insert, a NaN was stored as null."""
    config = json.dumps(HF)[:-1] + ", " + extra + "}"
    body: dict[str, Any] = {
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 1024, "global_batch_size": 64},
    }
    if path == "/v1/estimates":
        body["layout"] = {"dp": 8}
    text = json.dumps(body)[:-1] + ', "model": {"hf_config": ' + config + "}}"
    problem = assert_problem(client.post(path, content=text, headers=JSON), 422)
    assert problem["errors"][0]["field"] == f"model.hf_config.{key}"
    assert words in problem["errors"][0]["message"]
    assert client.get("/v1/plans").json()["items"] == []


def test_a_sequence_past_a_learned_position_table_names_its_limit(client: TestClient) -> None:
    body = {
        "model": {"preset": "gpt2"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"seq_len": 4096, "global_batch_size": 8},
        "layout": {"dp": 1},
    }
    (error,) = assert_problem(client.post("/v1/estimates", json=body), 422)["errors"]
    assert error["field"] == "training.seq_len" and error["limit"] == {"le": 1024}
