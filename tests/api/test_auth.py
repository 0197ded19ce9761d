"""API keys and tenancy with PLANNER_REQUIRE_AUTH on: 401 without a valid key, 403 without the
scope, and each owner sees, replays and calibrates only its own clusters, plans, runs and
idempotency keys. Runs on SQLite and, in CI, again on PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from service.api.deps import required_scope
from service.main import create_app
from service.persistence.db import Base
from service.planning import api_keys
from service.settings import Settings
from tests.api.helpers import assert_problem

GPT2_ON_8 = {
    "model": {"preset": "gpt2"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
    "training": {"seq_len": 1024, "global_batch_size": 64},
}
PLAN = GPT2_ON_8 | {"constraints": {"top_k": 1, "frameworks": ["deepspeed"]}, "launchers": ["deepspeed"]}
BOX = {"name": "box", "gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}


@pytest.fixture
def secured(migrated_url: str, db_engine: Engine) -> Iterator[tuple[FastAPI, dict[str, dict[str, str]]]]:
    """An app that requires keys, and the Authorization headers of alice (read, write), bob (read,
    write), a read-only reader of alice's, and an admin."""
    app = create_app(Settings(database_url=migrated_url, require_auth=True))
    headers = {}
    with Session(db_engine) as session:
        for who, owner, scopes in [
            ("alice", "alice", ["read", "write"]),
            ("bob", "bob", ["read", "write"]),
            ("reader", "alice", ["read"]),
            ("admin", "ops", ["admin"]),
        ]:
            _, secret = api_keys.create_key(session, owner=owner, name=who, scopes=scopes)
            headers[who] = {"Authorization": f"Bearer {secret}"}
        session.commit()
    yield app, headers
    with db_engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())


@pytest.fixture
def api(secured: tuple[FastAPI, dict[str, dict[str, str]]]) -> Iterator[tuple[TestClient, dict[str, Any]]]:
    app, headers = secured
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, headers
    assert app.state.metrics.requests_with_status(500) == []


def _example_path(template: str) -> str:
    return re.sub(r"\{[^}]+\}", "01JAAAAAAAAAAAAAAAAAAAAAAA", template)


def test_every_v1_operation_needs_a_key_and_health_does_not(api: tuple[TestClient, Any]) -> None:
    client, _ = api
    operations = client.app.openapi()["paths"]  # type: ignore[attr-defined]
    walked = 0
    for path, methods in operations.items():
        for method in methods:
            response = client.request(method.upper(), _example_path(path), json={})
            if path.startswith(("/v1/", "/plans")):  # /plans: the unversioned aliases of /v1/plans
                problem = assert_problem(response, 401)
                assert response.headers["www-authenticate"].startswith("Bearer")
                assert problem["errors"][0]["field"] == "header.Authorization"
                walked += 1
            else:
                assert response.status_code != 401, (method, path)
    assert walked >= 20
    for open_path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/"):
        assert client.get(open_path).status_code == 200, open_path


@pytest.mark.parametrize(
    "authorization",
    ["Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Bearer tp_not-a-key", "Bearer " + "x" * 300, "tp_abc"],
)
def test_malformed_unknown_and_oversized_keys_are_401(
    api: tuple[TestClient, Any], authorization: str
) -> None:
    client, _ = api
    assert_problem(client.get("/v1/plans", headers={"Authorization": authorization}), 401)


def test_two_authorization_headers_are_refused_not_read_as_the_first(api: tuple[TestClient, Any]) -> None:
    """Authorization is not a list-valued field (RFC 9110 §5.3): with a gateway's header beside the
    client's the request acted as whichever came first, silently (a multi-tenant review)."""
    client, keys = api
    both = [
        ("Authorization", keys["alice"]["Authorization"]),
        ("Authorization", keys["bob"]["Authorization"]),
    ]
    problem = assert_problem(client.get("/v1/clusters", headers=both), 401)
    assert "2 Authorization headers" in problem["detail"]
    assert client.get("/v1/clusters", headers=keys["alice"]).status_code == 200


def test_scopes_gate_writes_computations_and_key_management(api: tuple[TestClient, Any]) -> None:
    client, keys = api
    reader, alice, admin = keys["reader"], keys["alice"], keys["admin"]
    assert client.get("/v1/gpus", headers=reader).status_code == 200
    assert client.get("/v1/plans", headers=reader).status_code == 200
    # Computations store nothing: a read-only key may run them.
    assert (
        client.post("/v1/estimates", json=GPT2_ON_8 | {"layout": {"dp": 8}}, headers=reader).status_code
        == 200
    )
    problem = assert_problem(client.post("/v1/clusters", json=BOX, headers=reader), 403)
    assert "'write'" in problem["detail"] and "['read']" in problem["detail"]
    assert_problem(client.post("/v1/plans", json=PLAN, headers=reader), 403)
    # the unversioned aliases: the same key, the same scopes
    assert_problem(client.post("/plans", json=PLAN), 401)
    assert_problem(client.post("/plans", json=PLAN, headers=reader), 403)
    assert client.get("/plans", headers=reader).status_code == 200
    assert_problem(client.get("/v1/api-keys", headers=alice), 403)
    # An admin manages keys but holds no one's data: its own owner's lists are empty, not alice's.
    assert_problem(client.get("/v1/plans", headers=admin), 403)
    assert client.get("/v1/api-keys", headers=admin).status_code == 200


def test_keys_are_created_once_listed_without_secrets_and_revoked_everywhere(
    api: tuple[TestClient, Any],
) -> None:
    client, keys = api
    admin = keys["admin"]
    created = client.post("/v1/api-keys", json={"owner": "carol", "name": "scheduler"}, headers=admin)
    assert created.status_code == 201, created.text
    key = created.json()
    assert key["secret"].startswith("tp_") and key["scopes"] == ["read", "write"]
    assert key["created_via"] == "api"
    assert created.headers["location"] == f"/v1/api-keys/{key['id']}"
    # the Location answers GET (it was a 405: a data-lifecycle review): the key without its secret
    read = client.get(created.headers["location"], headers=admin)
    assert read.status_code == 200 and read.json() == {k: v for k, v in key.items() if k != "secret"}
    assert client.get(created.headers["location"], headers=keys["alice"]).status_code == 403
    carol = {"Authorization": f"Bearer {key['secret']}"}
    assert client.post("/v1/clusters", json=BOX, headers=carol).status_code == 201

    listed = client.get("/v1/api-keys", params={"owner": "carol"}, headers=admin).json()["items"]
    assert [k["id"] for k in listed] == [key["id"]]
    assert "secret" not in listed[0] and key["secret"] not in str(listed)

    assert client.delete(f"/v1/api-keys/{key['id']}", headers=admin).status_code == 204
    assert_problem(client.get("/v1/clusters", headers=carol), 401)
    revoked = client.get("/v1/api-keys", params={"owner": "carol"}, headers=admin).json()["items"][0]
    assert revoked["revoked_at"] is not None
    assert_problem(client.delete("/v1/api-keys/01JAAAAAAAAAAAAAAAAAAAAAAA", headers=admin), 404)
    assert_problem(client.get("/v1/api-keys/01JAAAAAAAAAAAAAAAAAAAAAAA", headers=admin), 404)
    assert (
        client.get(f"/v1/api-keys/{key['id']}", headers=admin).json()["revoked_at"] == revoked["revoked_at"]
    )
    bad = client.post("/v1/api-keys", json={"owner": "carol", "scopes": ["root"]}, headers=admin)
    assert_problem(bad, 422)
    # a page at a time, as every list (a review's case: ?limit=1 was a 422)
    client.post("/v1/api-keys", json={"owner": "carol", "name": "second"}, headers=admin)
    first = client.get("/v1/api-keys", params={"owner": "carol", "limit": 1}, headers=admin).json()
    assert len(first["items"]) == 1 and first["next_cursor"]
    rest = client.get(
        "/v1/api-keys", params={"owner": "carol", "limit": 1, "cursor": first["next_cursor"]}, headers=admin
    ).json()
    assert len(rest["items"]) == 1 and rest["items"][0]["id"] > first["items"][0]["id"]
    assert_problem(client.get("/v1/api-keys", params={"cursor": "nope"}, headers=admin), 422)


def test_owners_see_only_their_own_clusters_plans_and_runs(api: tuple[TestClient, Any]) -> None:
    client, keys = api
    alice, bob = keys["alice"], keys["bob"]
    cluster = client.post("/v1/clusters", json=BOX, headers=alice).json()
    plan = client.post("/v1/plans", json=PLAN | {"cluster": {"id": cluster["id"]}}, headers=alice).json()
    run = client.post(f"/v1/plans/{plan['id']}/runs", json={"step_s": 1.0}, headers=alice).json()

    # Bob cannot see, use, change or delete any of it, and learns nothing of its existence.
    assert client.get("/v1/clusters", headers=bob).json()["items"] == []
    assert client.get("/v1/plans", headers=bob).json()["items"] == []
    for path in (
        f"/v1/clusters/{cluster['id']}",
        f"/v1/plans/{plan['id']}",
        f"/v1/plans/{plan['id']}/artifacts",
        f"/v1/plans/{plan['id']}/artifacts.zip",
        f"/v1/plans/{plan['id']}/artifacts/ds_config.json",
        f"/v1/plans/{plan['id']}/runs",
        f"/v1/plans/{plan['id']}/runs/{run['id']}",
    ):
        assert_problem(client.get(path, headers=bob), 404)
    assert_problem(client.patch(f"/v1/clusters/{cluster['id']}", json={"gpus_per_node": 4}, headers=bob), 404)
    assert_problem(client.delete(f"/v1/clusters/{cluster['id']}", headers=bob), 404)
    assert_problem(client.delete(f"/v1/plans/{plan['id']}", headers=bob), 404)
    assert_problem(client.post(f"/v1/plans/{plan['id']}/runs", json={"step_s": 1.0}, headers=bob), 404)
    on_alices = client.post("/v1/plans", json=PLAN | {"cluster": {"id": cluster["id"]}}, headers=bob)
    assert assert_problem(on_alices, 404)["errors"][0]["field"] == "cluster.id"
    # Names are per owner: bob may call his cluster "box" too.
    assert client.post("/v1/clusters", json=BOX, headers=bob).status_code == 201
    # Alice still has everything.
    assert client.get(f"/v1/plans/{plan['id']}/runs/{run['id']}", headers=alice).status_code == 200
    assert [c["name"] for c in client.get("/v1/clusters", headers=alice).json()["items"]] == ["box"]


def test_idempotency_keys_and_calibration_are_per_owner(api: tuple[TestClient, Any]) -> None:
    client, keys = api
    alice, bob = keys["alice"], keys["bob"]
    first = client.post("/v1/plans", json=PLAN, headers=alice | {"Idempotency-Key": "nightly"})
    assert first.status_code == 201
    # The same key from bob, with another body: a plan of his own, not a 422 naming alice's plan.
    other = PLAN | {"training": {"seq_len": 512, "global_batch_size": 64}}
    second = client.post("/v1/plans", json=other, headers=bob | {"Idempotency-Key": "nightly"})
    assert second.status_code == 201, second.text
    assert second.json()["id"] != first.json()["id"]
    # ... and with alice's very body: still his own plan, not a replay of hers.
    third = client.post("/v1/plans", json=PLAN, headers=bob | {"Idempotency-Key": "nightly-2"})
    replay = client.post("/v1/plans", json=PLAN, headers=alice | {"Idempotency-Key": "nightly-2"})
    assert replay.status_code == 201 and replay.json()["id"] != third.json()["id"]

    layout = first.json()["recommended"]["layout"]
    estimate = GPT2_ON_8 | {"layout": layout}
    slow = {"step_s": first.json()["recommended"]["estimate"]["time"]["step_s"] * 2}
    assert client.post(f"/v1/plans/{first.json()['id']}/runs", json=slow, headers=alice).status_code == 201
    assert client.post("/v1/estimates", json=estimate, headers=alice).json()["calibration"]["runs"] == 1
    assert client.post("/v1/estimates", json=estimate, headers=bob).json()["calibration"] is None


def test_keys_are_the_operators_on_the_database(api: tuple[TestClient, Any]) -> None:
    """The fixture's keys were made as `trainplan keys create` makes them: on the database."""
    client, keys = api
    listed = client.get("/v1/api-keys", headers=keys["admin"]).json()["items"]
    assert {k["name"]: k["created_via"] for k in listed} == dict.fromkeys(
        ("alice", "bob", "reader", "admin"), "operator"
    )


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/api-keys", {"owner": "mallory", "scopes": ["admin"]}),
        ("POST", "/v1/api-keys", {"owner": "bad owner!"}),  # refused before the body is read
        ("GET", "/v1/api-keys", None),
        ("DELETE", "/v1/api-keys/01JAAAAAAAAAAAAAAAAAAAAAAA", None),
    ],
)
def test_without_require_auth_no_key_can_be_made_listed_or_revoked(
    client: TestClient, db_engine: Engine, method: str, path: str, body: dict[str, Any] | None
) -> None:
    """With authentication off every caller is the local admin: a key made then would be anyone's,
    and would still open the service once authentication is on."""
    problem = assert_problem(client.request(method, path, json=body), 403)
    assert "PLANNER_REQUIRE_AUTH=true" in problem["detail"]
    assert "trainplan keys create OWNER --scope admin" in problem["detail"]
    with Session(db_engine) as session:
        assert api_keys.list_keys(session) == ([], None)


def test_without_require_auth_every_request_is_the_local_owner(client: TestClient) -> None:
    created = client.post("/v1/clusters", json=BOX)
    assert created.status_code == 201
    # A header is ignored, not refused: the local service has no keys to check it against.
    listed = client.get("/v1/clusters", headers={"Authorization": "Bearer tp_whatever"}).json()["items"]
    assert [c["id"] for c in listed] == [created.json()["id"]]


@pytest.mark.parametrize(
    ("method", "route", "scope"),
    [
        ("GET", "/v1/plans", "read"),
        ("HEAD", "/v1/gpus", "read"),
        ("POST", "/v1/estimates", "read"),
        ("POST", "/v1/capacity", "read"),
        ("POST", "/v1/models/resolve", "read"),
        ("POST", "/v1/plans", "write"),
        ("POST", "/v1/plans/{plan_id}/runs", "write"),
        ("PATCH", "/v1/clusters/{cluster_id}", "write"),
        ("DELETE", "/v1/plans/{plan_id}", "write"),
        ("GET", "/v1/api-keys", "admin"),
        ("POST", "/v1/api-keys", "admin"),
        # the unversioned aliases need what their /v1 routes need
        ("POST", "/plans", "write"),
        ("GET", "/plans", "read"),
        ("GET", "/plans/{plan_id}/artifacts/{name}", "read"),
        ("POST", "/plans/{plan_id}/runs", "write"),
        ("DELETE", "/plans/{plan_id}", "write"),
    ],
)
def test_required_scope(method: str, route: str, scope: str) -> None:
    assert required_scope(method, route) == scope


def test_calibration_reads_runs_by_their_index_not_every_plan_on_the_hardware(db_engine: Engine) -> None:
    """The runs of an owner on some hardware are found through ix_runs_owner_hardware_key; each plan
    is then one primary-key lookup (the join used to walk every plan made for that hardware)."""
    if db_engine.dialect.name != "sqlite":
        pytest.skip("EXPLAIN QUERY PLAN is SQLite's")
    from sqlalchemy import event

    from service.persistence.repository import PlanRepository

    sent: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        sent.append((statement, parameters))

    event.listen(db_engine, "before_cursor_execute", capture)
    try:
        with Session(db_engine) as session:
            PlanRepository(session).runs_on_hardware(("hw",))
    finally:
        event.remove(db_engine, "before_cursor_execute", capture)
    (statement, parameters), *_ = sent
    with db_engine.connect() as conn:
        rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
    plan = " | ".join(str(row[-1]) for row in rows)
    assert "ix_runs_owner_hardware_key" in plan, plan
    assert "SCAN plans" not in plan and "ix_plans_hardware_key" not in plan, plan


def test_the_scopes_are_named_once_for_the_schema_the_service_and_the_cli() -> None:
    import typing

    from service.cli import keys_create
    from service.contracts.api_keys import Scope

    choices = next(p for p in keys_create.params if p.name == "scopes").type.choices  # type: ignore[attr-defined]
    assert typing.get_args(Scope) == api_keys.SCOPES == tuple(choices)


def test_the_openapi_document_names_the_api_key_scheme_every_v1_operation_takes(client: TestClient) -> None:
    """Generated clients and /docs' Authorize send a key only where the document declares its scheme:
    it declared none though every /v1 operation answers 401 without a key (a multi-tenant review).
    Optional (the key or nothing): a deployment without PLANNER_REQUIRE_AUTH reads none."""
    document = client.get("/openapi.json").json()
    scheme = document["components"]["securitySchemes"]["apiKey"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            expected = [{"apiKey": []}, {}] if path.startswith(("/v1/", "/plans")) else None
            assert operation.get("security") == expected, (method, path)
