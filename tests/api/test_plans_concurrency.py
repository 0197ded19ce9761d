"""A scheduler-style client: concurrent POST /v1/plans against a real server on loopback."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

BODY = {
    "model": {"preset": "gpt2"},
    "cluster": {"gpu": "a100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 2},
    "training": {"seq_len": 1024, "global_batch_size": 16},
    "constraints": {"top_k": 1, "frameworks": ["fsdp"]},
    "launchers": ["accelerate"],
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def server(app: FastAPI) -> Iterator[str]:
    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not instance.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    instance.should_exit = True
    thread.join(timeout=20)


def _post(base: str, key: str) -> httpx.Response:
    with httpx.Client(base_url=base, timeout=120) as http:
        return http.post("/v1/plans", json=BODY, headers={"Idempotency-Key": key})


def test_50_distinct_keys_create_50_plans_and_20_retries_create_one(server: str) -> None:
    with ThreadPoolExecutor(max_workers=25) as pool:
        distinct = list(pool.map(lambda i: _post(server, f"job-{i}"), range(50)))
    assert [r.status_code for r in distinct] == [201] * 50, [r.text for r in distinct if r.status_code != 201]
    assert len({r.json()["id"] for r in distinct}) == 50

    with ThreadPoolExecutor(max_workers=20) as pool:
        retries = list(pool.map(lambda _: _post(server, "the-same-job"), range(20)))
    # a replay is the answer the first got (those that arrive while it searches wait for it)
    assert [r.status_code for r in retries] == [201] * 20, [r.text for r in retries if r.status_code != 201]
    assert sum(r.headers.get("idempotent-replayed") != "true" for r in retries) == 1
    assert len({r.json()["id"] for r in retries}) == 1

    with httpx.Client(base_url=server) as http:
        listed = http.get("/v1/plans", params={"limit": 500}).json()["items"]
    assert len(listed) == 51


def test_concurrent_retries_of_one_cluster_create_answer_the_one_cluster(server: str) -> None:
    """A scheduler retrying POST /v1/clusters while its first request is in flight: the retry saw the
    name taken (the first had committed the cluster and its key) and answered 409 "a cluster named ...
    already exists", where a retry with the same Idempotency-Key replays what the first created."""
    body = {"name": "racing", "gpu": "h100-sxm-80gb", "num_nodes": 2, "gpus_per_node": 8}

    def create(_: int) -> httpx.Response:
        with httpx.Client(base_url=server, timeout=60) as http:
            return http.post("/v1/clusters", json=body, headers={"Idempotency-Key": "cluster-job"})

    for _ in range(3):
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(create, range(8)))
        refused = [r.text for r in answers if r.status_code >= 300]
        assert [r.status_code for r in answers] == [201] * 8, refused
        assert len({r.json()["id"] for r in answers}) == 1
    with httpx.Client(base_url=server, timeout=60) as http:
        other = http.post("/v1/clusters", json=body, headers={"Idempotency-Key": "another-job"})
    assert other.status_code == 409  # the name is taken, and that key created nothing
