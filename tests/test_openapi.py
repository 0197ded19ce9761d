"""openapi/openapi.json must be what the running code serves, and must document the contract."""

import json

from service.openapi import OPENAPI_PATH, render

# Every method and path of ../shared/design/api.md's endpoint table, plus what we added.
CONTRACT = {
    ("get", "/healthz"), ("get", "/readyz"), ("get", "/metrics"),
    ("get", "/v1/gpus"), ("get", "/v1/gpus/{name}"),
    ("get", "/v1/models"), ("get", "/v1/models/{name}"), ("post", "/v1/models/resolve"),
    ("post", "/v1/clusters"), ("get", "/v1/clusters"),
    ("get", "/v1/clusters/{cluster_id}"), ("put", "/v1/clusters/{cluster_id}"),
    ("patch", "/v1/clusters/{cluster_id}"), ("delete", "/v1/clusters/{cluster_id}"),
    ("post", "/v1/estimates"),
    ("post", "/v1/plans"), ("get", "/v1/plans"),
    ("get", "/v1/plans/{plan_id}"), ("delete", "/v1/plans/{plan_id}"),
    ("get", "/v1/plans/{plan_id}/artifacts"), ("get", "/v1/plans/{plan_id}/artifacts/{name}"),
    ("get", "/v1/plans/{plan_id}/artifacts.zip"),
    ("post", "/v1/plans/{plan_id}/runs"), ("get", "/v1/plans/{plan_id}/runs"),
    ("get", "/v1/plans/{plan_id}/runs/{run_id}"),
    ("post", "/v1/capacity"),
    ("post", "/v1/api-keys"), ("get", "/v1/api-keys"), ("get", "/v1/api-keys/{key_id}"),
    ("delete", "/v1/api-keys/{key_id}"),
}  # fmt: skip
# The design's unversioned plan paths: deprecated aliases of /v1/plans (issue 28).
CONTRACT |= {(method, path.removeprefix("/v1")) for method, path in CONTRACT if path.startswith("/v1/plans")}


def test_committed_openapi_document_is_current() -> None:
    assert OPENAPI_PATH.read_text() == render(), "openapi/openapi.json is stale: run `make openapi`"


def test_every_contract_endpoint_is_documented_with_problem_responses() -> None:
    paths = json.loads(render())["paths"]
    served = {(method, path) for path, methods in paths.items() for method in methods}
    assert served == CONTRACT, f"missing: {CONTRACT - served}; undocumented in the test: {served - CONTRACT}"
    for method, path in CONTRACT - {("get", "/healthz"), ("get", "/readyz"), ("get", "/metrics")}:
        responses = paths[path][method]["responses"]
        assert "422" in responses and "application/problem+json" in responses["422"]["content"], (
            method,
            path,
        )
        if path.startswith(("/v1/", "/plans")):  # PLANNER_REQUIRE_AUTH=true: no key, or not the scope
            assert {"401", "403"} <= set(responses), (method, path)


def test_the_schema_accepts_the_inputs_the_server_accepts() -> None:
    """An integrator's review: a schema-validating client refused the README's own requests (a
    `*_gbps` field, a cluster leaving its catalog part's gpus_per_node out); the document says both,
    checked here with a JSON Schema validator against bodies the API answers."""
    import jsonschema

    document = json.loads(render())

    def validator(name: str) -> jsonschema.Draft202012Validator:
        schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
        return jsonschema.Draft202012Validator(schema)

    cluster = validator("ClusterIn")
    for body in (
        {"gpu": "h100-sxm-80gb", "num_nodes": 2, "inter_node_bandwidth_gbps": 50},
        {"gpu": "h100-sxm-80gb", "num_gpus": 16},
        {"gpu": "h100-sxm-80gb", "num_nodes": 1, "measured_intra_node_bus_bandwidth_gbps": None},
    ):
        assert not list(cluster.iter_errors(body)), body
    assert list(cluster.iter_errors({"gpu": "h100-sxm-80gb", "flux_capacitor": 1}))  # still strict


def test_every_v1_operation_documents_its_503_and_retry_after() -> None:
    """An integrator's review: no /v1 operation documented the 503 (a busy database, full slots, a
    request that did not get the CPU) that every one of them can answer, nor its Retry-After."""
    paths = json.loads(render())["paths"]
    for path, methods in paths.items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in methods.items():
            busy = operation["responses"].get("503")
            assert busy is not None and "Retry-After" in busy["headers"], (method, path)


def test_no_documented_maximum_contradicts_its_own_branch() -> None:
    """A nullable field documented with the planner's bound beside an integer branch that kept the
    field's looser ``le`` (at_gpus: 262,144 outside, 10,000,000 inside): a generated client reading
    the branch accepted what the server refuses (integrator review)."""
    found: list[tuple[str, object, list[object]]] = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            if "maximum" in node and "anyOf" in node:
                inner = [branch["maximum"] for branch in node["anyOf"] if "maximum" in branch]
                if any(value != node["maximum"] for value in inner):
                    found.append((path, node["maximum"], inner))
            for key, value in node.items():
                walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{path}[{index}]")

    walk(json.loads(render()), "")
    assert not found
