"""/metrics with several worker processes (issue 26): a real ``uvicorn --workers 2`` on a loopback
port with PROMETHEUS_MULTIPROC_DIR set serves requests on both workers, and one scrape, whichever
worker answers it, counts every one of them. Bounded: the server is stopped (its whole process group)
when the test ends, and every wait has a deadline."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector

from service.cli import migrate
from service.metrics import Metrics
from tests.conftest import ROOT
from tests.loopback import free_port

ROUTE = "/v1/gpus/{name}"
SERIES = f'trainplan_http_requests_total{{method="GET",route="{ROUTE}",status="401"}}'
STARTUP_S = 60  # two spawned workers import the service on a loaded 2-core machine
TEST_S = 60  # the whole exchange after startup


@pytest.fixture
def two_workers(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, the multiprocess directory) of ``uvicorn --workers 2`` with API keys required."""
    url = f"sqlite:///{tmp_path / 'workers.db'}"
    migrate(url)
    shared = tmp_path / "prometheus"
    shared.mkdir()
    port = free_port()
    env = os.environ | {
        "PLANNER_DATABASE_URL": url,
        "PLANNER_LOG_LEVEL": "WARNING",
        "PLANNER_REQUIRE_AUTH": "true",  # /metrics stays open; the counted route answers 401
        "PROMETHEUS_MULTIPROC_DIR": str(shared),
    }
    command = [sys.executable, "-m", "uvicorn", "service.main:create_app", "--factory", "--workers", "2"]
    command += ["--no-access-log", "--host", "127.0.0.1", "--port", str(port)]
    # its own process group: the master and both workers are stopped together, whatever happens
    server = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while len(list(shared.glob("counter_*.db"))) < 2 or not _answers(base):
            # each worker makes its counter file when its app is created
            assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
            assert time.monotonic() < deadline, f"two workers did not start within {STARTUP_S} s"
            time.sleep(0.2)
        yield base, shared
    finally:
        server.terminate()  # uvicorn's master stops its workers
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=5)
        if server.stderr:
            server.stderr.close()


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _per_worker(shared: Path, route: str = ROUTE, status: str = "401") -> dict[str, float]:
    """Requests of one route and status by worker pid, read from each worker's own file."""
    counts = {}
    for path in sorted(shared.glob("counter_*.db")):
        pid = path.stem.removeprefix("counter_")
        counts[pid] = sum(
            sample.value
            for family in MultiProcessCollector.merge([str(path)])
            for sample in family.samples
            if sample.name == "trainplan_http_requests_total"
            and sample.labels == {"method": "GET", "route": route, "status": status}
        )
    return counts


def _scraped(text: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    assert match, f"{series} not in the scrape"
    return float(match.group(1))


def test_one_scrape_counts_the_requests_of_both_workers(two_workers: tuple[str, Path]) -> None:
    base, shared = two_workers
    deadline = time.monotonic() + TEST_S

    def one(_: int) -> int:
        # a new connection each time: the kernel hands each to whichever worker accepts first
        with httpx.Client(base_url=base, timeout=10, headers={"Connection": "close"}) as client:
            return client.get("/v1/gpus/h100-sxm-80gb").status_code

    sent = 0
    with ThreadPoolExecutor(8) as pool:
        # until both workers have answered some (a few rounds at most), within the deadline
        while True:
            statuses = list(pool.map(one, range(40)))
            assert statuses == [401] * 40, statuses  # no key: the route is counted, with its status
            sent += 40
            per_worker = _per_worker(shared)
            if sum(1 for n in per_worker.values() if n > 0) >= 2 or sent >= 400:
                break
            assert time.monotonic() < deadline
    assert len(per_worker) == 2 and all(n > 0 for n in per_worker.values()), per_worker
    assert sum(per_worker.values()) == sent

    histogram = f'trainplan_http_request_duration_seconds_count{{method="GET",route="{ROUTE}"}}'
    scrapes_series = 'trainplan_http_requests_total{method="GET",route="/metrics",status="200"}'
    scrapes = 0
    while True:  # new connections, until both workers have answered a scrape; every scrape agrees
        response = httpx.get(f"{base}/metrics", headers={"Connection": "close"}, timeout=10)
        assert response.status_code == 200  # no key needed, as before
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = response.text
        assert _scraped(text, SERIES) == sent
        assert _scraped(text, histogram) == sent
        # a scrape is counted once answered: each sees every earlier one, whichever worker took it
        assert (_scraped(text, scrapes_series) if scrapes else 0) == scrapes
        assert "# TYPE trainplan_http_requests_total counter" in text
        assert "# HELP trainplan_http_requests_total HTTP requests by method, route template" in text
        for name in (
            "trainplan_search_duration_seconds_count",
            "trainplan_search_evaluations_total",
            "trainplan_search_truncated_total",
        ):
            assert _scraped(text, name) == 0
        assert "_created" not in text
        scrapes += 1
        scrapers = _per_worker(shared, "/metrics", "200")
        if all(n > 0 for n in scrapers.values()) or scrapes >= 40:
            break
        assert time.monotonic() < deadline
    assert all(n > 0 for n in scrapers.values()), scrapers
    print(f"\nsent {sent} requests, per worker {per_worker}; {scrapes} scrapes, per worker {scrapers}")


def test_one_process_exposes_every_family_from_the_start() -> None:
    text = Metrics().render()
    for name, kind in (
        ("trainplan_http_requests_total", "counter"),
        ("trainplan_http_request_duration_seconds", "histogram"),
        ("trainplan_search_duration_seconds", "histogram"),
        ("trainplan_search_evaluations_total", "counter"),
        ("trainplan_search_truncated_total", "counter"),
        ("trainplan_database_unavailable_total", "counter"),
    ):
        assert f"# TYPE {name} {kind}\n" in text
    assert "_created" not in text


@pytest.mark.parametrize("value", ["", "/nonexistent/trainplan-metrics"])
def test_a_multiprocess_directory_that_is_not_one_fails_at_startup(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    # set at all, the variable turns prometheus_client's multiprocess mode on: no silent fallback
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", value)
    with pytest.raises(RuntimeError, match=r"PROMETHEUS_MULTIPROC_DIR=.* is not a directory"):
        Metrics()
