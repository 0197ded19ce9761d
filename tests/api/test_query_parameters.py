"""A query parameter a route does not take is refused, naming it and those the route takes: GET
/v1/gpus?vendor=amd and /v1/models?familly=llama were answered with every entry, as if filtered, and
/v1/plans?modle=... with every plan (an input the service does not use is refused, not ignored)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient


@pytest.mark.parametrize(
    ("path", "unknown", "takes"),
    [
        ("/v1/plans?modle=llama-3.1-8b", "modle", "model"),
        ("/v1/models?familly=llama", "familly", "family"),
        ("/v1/clusters?name=lab", "name", "cursor, limit"),
        ("/v1/gpus?memory=80", "memory", "vendor"),
        ("/v1/gpus/h100-sxm-80gb?verbose=1", "verbose", "no query parameters"),
    ],
)
def test_an_unknown_query_parameter_is_a_422_naming_it(
    client: TestClient, path: str, unknown: str, takes: str
) -> None:
    response = client.get(path)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert [e["field"] for e in problem["errors"]] == [f"query.{unknown}"]
    assert takes in problem["detail"]


def test_declared_parameters_still_filter(client: TestClient) -> None:
    assert client.get("/v1/plans?limit=5").status_code == 200
    assert client.get("/v1/models?family=llama").status_code == 200
    amd = client.get("/v1/gpus?vendor=AMD")
    assert amd.status_code == 200
    assert {g["vendor"] for g in amd.json()["items"]} == {"amd"}
    assert {g["name"] for g in amd.json()["items"]} >= {"mi250x-gcd-64gb", "mi300x-192gb"}
    unknown = client.get("/v1/gpus?vendor=intel")
    assert unknown.status_code == 422
    assert [e["field"] for e in unknown.json()["errors"]] == ["query.vendor"]


def test_the_page_and_probes_take_any_query(client: TestClient) -> None:
    """Only the /v1 API refuses them: the page's links may carry tracking parameters."""
    assert client.get("/?utm_source=mail").status_code == 200
    assert client.get("/healthz?probe=1").status_code == 200


def test_catalog_lists_page_as_every_list_does(client: TestClient) -> None:
    """The CLI and the page ask every list for ?limit=200 and follow next_cursor: the catalogs take them
    too (they were silently ignored; refused now that unknown parameters are)."""
    whole = client.get("/v1/gpus").json()
    assert whole["next_cursor"] is None
    names, cursor = [], None
    while True:
        page = client.get("/v1/gpus", params={"limit": 5, **({"cursor": cursor} if cursor else {})}).json()
        names += [g["name"] for g in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert names == [g["name"] for g in whole["items"]]
    models = client.get("/v1/models", params={"limit": 200}).json()
    assert len(models["items"]) >= 50 and models["next_cursor"] is None
    assert client.get("/v1/models", params={"cursor": "x"}).status_code == 422


def test_a_catalog_list_pages_by_50_unless_asked_as_every_list_does(client: TestClient) -> None:
    """api.md: lists are paginated with limit (default 50, max 500); the catalogs answered 500 by
    default, one contract for plans and another for models. 53 presets: a page of 50 and its cursor."""
    first = client.get("/v1/models").json()
    assert len(first["items"]) == 50 and first["next_cursor"] is not None
    rest = client.get("/v1/models", params={"cursor": first["next_cursor"]}).json()
    whole = client.get("/v1/models", params={"limit": 500}).json()
    assert [m["name"] for m in first["items"] + rest["items"]] == [m["name"] for m in whole["items"]]
    assert whole["next_cursor"] is None
