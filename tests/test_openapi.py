"""openapi/openapi.json must be what the running code serves."""

from service.openapi import OPENAPI_PATH, render


def test_committed_openapi_document_is_current() -> None:
    assert OPENAPI_PATH.read_text() == render(), "openapi/openapi.json is stale: run `make openapi`"


def test_contract_paths_are_documented() -> None:
    import json

    paths = json.loads(render())["paths"]
    for path in (
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/gpus",
        "/v1/gpus/{name}",
        "/v1/clusters",
        "/v1/clusters/{cluster_id}",
    ):
        assert path in paths, path
