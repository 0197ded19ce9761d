"""Load benchmark: the service as deployed (uvicorn in its own process, on a migrated SQLite file or
PostgreSQL database of its own) under wrk on loopback; requests/s and latency percentiles of
estimates and plans.

    .venv/bin/python -m bench.load [--database sqlite|postgresql|both] [--duration 10]
                                   [--connections 8] [--replicas 1] [--json bench/load_results.json]

Needs wrk (Debian: apt-get install wrk). Not a test: figures depend on the machine (the report
records its CPU count and load average). Every request of a run is distinct (wrk's Lua script counts
requests and varies the global batch size), so no answer is a replay of an earlier one: the caches
that do work are the estimator's own (catalog, model parameter counts), as in production.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from service.cli import migrate

ROOT = Path(__file__).resolve().parents[1]
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

# Each scenario: the path, and a Lua expression of the request counter `n` giving a distinct body.
SCENARIOS: dict[str, tuple[str, str]] = {
    # Llama-2-7B on 8 H100 at 4K, DeepSpeed ZeRO-2: one layout, every component, limits, calibration.
    "estimate 7B / 8 H100": (
        "/v1/estimates",
        '\'{"model":{"preset":"llama-2-7b"},'
        '"cluster":{"gpu":"h100-sxm-80gb","num_nodes":1,"gpus_per_node":8},'
        '"training":{"seq_len":4096,"global_batch_size":\' .. (8 * (1 + n % 4096)) .. \'},'
        '"layout":{"dp":8,"zero_stage":2}}\'',
    ),
    # The whole search for the same job, stored with its rationale (no launcher files asked for).
    "plan 7B / 8 H100": (
        "/v1/plans",
        '\'{"model":{"preset":"llama-2-7b"},'
        '"cluster":{"gpu":"h100-sxm-80gb","num_nodes":1,"gpus_per_node":8},'
        '"training":{"seq_len":4096,"global_batch_size":\' .. (8 * (1 + n % 4096)) .. \'},'
        '"launchers":[]}\'',
    ),
}

LUA = """
n = 0
request = function()
  n = n + 1
  local body = BODY
  return wrk.format("POST", "PATH", {["Content-Type"] = "application/json"}, body)
end
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _fresh_database(kind: str, folder: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{folder / 'load.db'}"
    from sqlalchemy import make_url, text

    from service.persistence.db import make_engine

    url = make_url(os.environ.get("PLANNER_TEST_DATABASE_URL", PG_URL)).set(database="trainplan_load")
    admin = make_engine(url.set(database="postgres").render_as_string(hide_password=False))
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text('DROP DATABASE IF EXISTS "trainplan_load" WITH (FORCE)'))
        conn.execute(text('CREATE DATABASE "trainplan_load"'))
    admin.dispose()
    return url.render_as_string(hide_password=False)


def _wrk_command(url: str, script: Path, duration_s: int, connections: int) -> list[str]:
    return ["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency", "-s", str(script), url]


def _parse_wrk(out: str) -> dict[str, Any]:
    def ms(label: str) -> float:
        found = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        assert found, out
        return float(found[1]) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[found[2]]

    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    failed = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    assert rate and total, out
    return {
        "requests": int(total[1]),
        "requests_per_s": float(rate[1]),
        "p50_ms": ms("50"),
        "p90_ms": ms("90"),
        "p99_ms": ms("99"),
        "non_2xx": int(failed[1]) if failed else 0,
        "socket_errors": errors[1] if errors else None,
    }


def _load(urls: list[str], script: Path, duration_s: int, connections: int) -> dict[str, Any]:
    """One wrk per replica, all at once, the connections split between them. Requests add up; each
    percentile is the worst replica's (wrk's histograms cannot be merged from its text)."""
    share = max(1, connections // len(urls))
    running = [
        subprocess.Popen(_wrk_command(url, script, duration_s, share), stdout=subprocess.PIPE, text=True)
        for url in urls
    ]
    parts = [_parse_wrk(process.communicate()[0]) for process in running]
    merged: dict[str, Any] = {
        "requests": sum(p["requests"] for p in parts),
        "requests_per_s": round(sum(p["requests_per_s"] for p in parts), 2),
        "non_2xx": sum(p["non_2xx"] for p in parts),
        "socket_errors": [p["socket_errors"] for p in parts if p["socket_errors"]] or None,
    }
    for key in ("p50_ms", "p90_ms", "p99_ms"):
        merged[key] = max(p[key] for p in parts)
    return merged


def run(kind: str, duration_s: int, connections: int, replicas: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="trainplan-load-"))
    url = _fresh_database(kind, folder)
    migrate(url)
    env = os.environ | {"PLANNER_DATABASE_URL": url, "PLANNER_LOG_LEVEL": "WARNING"}
    servers, bases = [], []
    for _ in range(replicas):
        port = _free_port()
        command = [sys.executable, "-m", "uvicorn", "service.main:create_app", "--factory", "--no-access-log"]
        command += ["--host", "127.0.0.1", "--port", str(port)]
        servers.append(subprocess.Popen(command, cwd=ROOT, env=env))
        bases.append(f"http://127.0.0.1:{port}")
    try:
        for base in bases:
            for _ in range(300):
                try:
                    if httpx.get(f"{base}/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
        results: dict[str, Any] = {}
        for name, (path, body) in SCENARIOS.items():
            script = folder / f"{path.strip('/').replace('/', '_')}.lua"
            script.write_text(LUA.replace("PATH", path).replace("BODY", body))
            urls = [base + path for base in bases]
            _load(urls, script, 2, connections)  # warm-up: imports, catalog, first connections
            results[name] = _load(urls, script, duration_s, connections)
            print(f"{kind:10} x{replicas} {name:22} {results[name]}", flush=True)
        return results
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--duration", type=int, default=10, help="seconds per scenario")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="service processes on one database, each on its own port with its own wrk (uvicorn's "
        "--workers share one socket, and one worker accepts all of wrk's keep-alive connections)",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (Debian: apt-get install wrk)")
    kinds = ["sqlite", "postgresql"] if args.database == "both" else [args.database]
    load_before = os.getloadavg()
    report = {
        "cpus": os.cpu_count(),
        "replicas": args.replicas,
        "connections": args.connections,
        "duration_s": args.duration,
        "results": {kind: run(kind, args.duration, args.connections, args.replicas) for kind in kinds},
        "load_average_before_after": [load_before[0], os.getloadavg()[0]],
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
