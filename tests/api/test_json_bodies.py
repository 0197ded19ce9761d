"""An API body is JSON, whatever curl said it was: ``curl -d '{...}'`` without a content-type header
sends application/x-www-form-urlencoded, and the object it sent was a 422 "Input should be a valid
dictionary". Such a body that parses as JSON is read as JSON when no browser sent it (a page's fetch()
may label JSON as a form without a preflight); a body under no content type or text/plain (what a
cross-site page may send unasked), or a real form, is a 415 that says how to send it."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

BODY = {
    "model": "llama-3.2-1b",
    "cluster": {"gpu": "a100-sxm-80gb"},
    "training": {"seq_len": 2048, "global_batch_size": 32},
}


def _post(client: TestClient, content_type: str | None, body: bytes | None = None) -> object:
    headers = {} if content_type is None else {"content-type": content_type}
    return client.post("/v1/plans", content=body or json.dumps(BODY).encode(), headers=headers)


def test_curls_default_content_type_holding_json_is_json(client: TestClient) -> None:
    response = _post(client, "application/x-www-form-urlencoded")
    assert response.status_code == 201, response.text
    assert response.json()["request"]["model"]["preset"] == "llama-3.2-1b"


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/xml"])
def test_a_body_of_another_type_is_a_415_saying_how(client: TestClient, content_type: str | None) -> None:
    response = _post(client, content_type)
    assert response.status_code == 415
    assert "content-type: application/json" in response.json()["detail"]
    assert response.json()["instance"].startswith("/v1/")
    assert client.get("/v1/plans").json()["items"] == []  # nothing stored


def test_a_browsers_request_is_never_read_so(client: TestClient) -> None:
    """A page's fetch() may send JSON labelled as a form without a preflight: from a browser (Origin,
    Sec-Fetch-Site) such a body changes nothing, as before."""
    for header in ({"origin": "https://elsewhere.example"}, {"sec-fetch-site": "cross-site"}):
        headers = {"content-type": "application/x-www-form-urlencoded", **header}
        response = client.post("/v1/plans", content=json.dumps(BODY).encode(), headers=headers)
        assert response.status_code == 415, header
    assert client.get("/v1/plans").json()["items"] == []


def test_a_real_form_is_the_415_too(client: TestClient) -> None:
    response = _post(client, "application/x-www-form-urlencoded", b"model=llama-3.2-1b&seq_len=2048")
    assert response.status_code == 415


def test_json_types_pass_as_before(client: TestClient) -> None:
    for content_type in ("application/json", "application/json; charset=utf-8", "application/problem+json"):
        assert _post(client, content_type).status_code == 201, content_type
