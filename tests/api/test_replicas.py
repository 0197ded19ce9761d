"""Two service processes on one database behave as one service: the service keeps no state outside
the database. Real OS processes (uvicorn) on loopback ports, on a database of their own: PostgreSQL
(a sibling of PLANNER_TEST_DATABASE_URL's database) in CI's second pass, else a SQLite file shared by
both processes (one host)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.cli import migrate
from tests.conftest import ROOT, reset_postgres_schema, sibling_postgres_database
from tests.loopback import free_port

pytestmark = pytest.mark.db

BODY: dict[str, Any] = {
    "model": {"preset": "gpt2"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
    "training": {"seq_len": 1024, "global_batch_size": 64},
    "constraints": {"top_k": 1, "frameworks": ["deepspeed"]},
    "launchers": [],
}


@pytest.fixture(scope="module")
def replicas() -> Iterator[tuple[httpx.Client, httpx.Client]]:
    if os.environ.get("PLANNER_TEST_DATABASE_URL"):
        url = sibling_postgres_database(os.environ["PLANNER_TEST_DATABASE_URL"], "replicas")
        reset_postgres_schema(url)
    else:
        url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='trainplan-replicas-')) / 'shared.db'}"
    migrate(url)
    env = os.environ | {"PLANNER_DATABASE_URL": url, "PLANNER_LOG_LEVEL": "WARNING"}
    processes, clients = [], []
    try:
        for _ in range(2):
            port = free_port()
            command = [sys.executable, "-m", "uvicorn", "service.main:create_app", "--factory"]
            command += ["--no-access-log", "--host", "127.0.0.1", "--port", str(port)]
            processes.append(subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE))
            clients.append(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30))
        for process, client in zip(processes, clients, strict=True):
            deadline = time.monotonic() + 30
            while True:
                assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "a replica did not become ready within 30 s"
                time.sleep(0.1)
        yield clients[0], clients[1]
    finally:
        for client in clients:
            client.close()
        for process in processes:
            process.terminate()
            process.wait(timeout=10)


def test_an_idempotency_key_holds_across_replicas(replicas: tuple[httpx.Client, httpx.Client]) -> None:
    a, b = replicas
    headers = {"Idempotency-Key": "replicas-1"}
    with ThreadPoolExecutor(4) as pool:  # the same retried request lands on both replicas at once
        responses = list(pool.map(lambda c: c.post("/v1/plans", json=BODY, headers=headers), [a, b, a, b]))
    assert [r.status_code for r in responses] == [201] * 4, [r.text for r in responses]
    assert sorted(r.headers.get("idempotent-replayed", "") for r in responses) == ["", "true", "true", "true"]
    assert len({r.json()["id"] for r in responses}) == 1
    plan_id = responses[0].json()["id"]
    for client in (a, b):
        assert [p["id"] for p in client.get("/v1/plans").json()["items"]] == [plan_id]
    other = BODY | {"training": {"seq_len": 2048, "global_batch_size": 64}}
    refused = b.post("/v1/plans", json=other, headers=headers)
    assert refused.status_code == 422 and plan_id in refused.json()["detail"]


def test_clusters_written_on_one_are_read_and_versioned_on_the_other(
    replicas: tuple[httpx.Client, httpx.Client],
) -> None:
    a, b = replicas
    body = {"name": "shared", "gpu": "a100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
    created = a.post("/v1/clusters", json=body)
    assert created.status_code == 201, created.text
    cluster_id = created.json()["id"]
    assert b.get(f"/v1/clusters/{cluster_id}").json()["gpus_per_node"] == 8
    assert b.patch(f"/v1/clusters/{cluster_id}", json={"gpus_per_node": 4}).status_code == 200
    assert a.get(f"/v1/clusters/{cluster_id}").json()["gpus_per_node"] == 4
    assert b.post("/v1/clusters", json=body).status_code == 409  # the name is taken, whichever replica
    assert b.delete(f"/v1/clusters/{cluster_id}").status_code == 204
    assert a.get(f"/v1/clusters/{cluster_id}").status_code == 404


def test_a_run_posted_to_one_calibrates_estimates_on_the_other(
    replicas: tuple[httpx.Client, httpx.Client],
) -> None:
    a, b = replicas
    plan = a.post("/v1/plans", json=BODY | {"training": {"seq_len": 512, "global_batch_size": 32}})
    assert plan.status_code == 201, plan.text
    recommended = plan.json()["recommended"]
    estimate_request = {
        "model": BODY["model"],
        "cluster": BODY["cluster"],
        "training": {"seq_len": 512, "global_batch_size": 32},
        "layout": recommended["layout"],
    }
    before = b.post("/v1/estimates", json=estimate_request).json()
    run = {"step_s": recommended["estimate"]["time"]["step_s"] * 1.5}
    assert a.post(f"/v1/plans/{plan.json()['id']}/runs", json=run).status_code == 201
    after = b.post("/v1/estimates", json=estimate_request).json()
    assert after["calibration"]["runs"] >= 1
    assert after["time"]["step_s"] > before["time"]["step_s"]
