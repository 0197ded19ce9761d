"""Latency of one estimate: the pure library (with and without the limit searches) and the whole
POST /v1/estimates round trip in-process (TestClient, migrated SQLite in a temporary folder).

    .venv/bin/python -m bench.estimate_latency [--repeats N]

Prints the median and best of N runs in milliseconds; not a test (timings depend on the machine).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from service.catalog.gpus import gpu
from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator import estimate
from service.estimator.types import ClusterSpec, Framework, Layout, Recompute, TrainingSpec

JOBS = {
    "llama-2-7b, 8 x H100, DeepSpeed ZeRO-2": (
        "llama-2-7b", 1, Layout(dp=8, zero_stage=2), TrainingSpec(seq_len=4096, global_batch_size=64)
    ),
    "llama-3.1-405b, 2,304 x H100, Megatron tp8 pp18": (
        "llama-3.1-405b",
        288,
        Layout(
            framework=Framework.MEGATRON, dp=16, tp=8, pp=18, zero_stage=1, sequence_parallel=True,
            recompute=Recompute.SELECTIVE,
        ),
        TrainingSpec(seq_len=4096, global_batch_size=2048),
    ),
}  # fmt: skip


def timed_ms(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    fn()  # warm-up: imports, catalog, caches
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), min(samples)


def library(repeats: int) -> None:
    tuning = default_tuning()
    for label, (name, nodes, layout, training) in JOBS.items():
        spec = model(name).spec
        cluster = ClusterSpec(
            gpu=gpu("h100-sxm-80gb"), num_nodes=nodes, gpus_per_node=8,
            intra_node_bandwidth_bytes_per_s=450e9, inter_node_bandwidth_bytes_per_s=50e9,
        )  # fmt: skip
        for with_limits in (False, True):
            run = functools.partial(
                estimate, spec, cluster, layout, training, tuning=tuning, with_limits=with_limits
            )
            median, best = timed_ms(run, repeats)
            what = "estimate() with limits" if with_limits else "estimate() without limits"
            print(f"{label:50s} {what:28s} median {median:6.2f} ms  best {best:6.2f} ms")


def api(repeats: int) -> None:
    from alembic import command
    from alembic.config import Config
    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings

    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'bench.db'}"
        config = Config(toml_file=str(Path(__file__).resolve().parents[1] / "pyproject.toml"))
        config.attributes["database_url"] = url
        command.upgrade(config, "head")
        body = {
            "model": {"preset": "llama-2-7b"},
            "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
            "training": {"seq_len": 4096, "global_batch_size": 64},
            "layout": {"framework": "deepspeed", "dp": 8, "zero_stage": 2},
        }
        with TestClient(create_app(Settings(database_url=url))) as client:
            median, best = timed_ms(lambda: client.post("/v1/estimates", json=body), repeats)
    label = "POST /v1/estimates (llama-2-7b, limits, TestClient)"
    print(f"{label:79s} median {median:6.2f} ms  best {best:6.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    repeats = parser.parse_args().repeats
    library(repeats)
    api(repeats)


if __name__ == "__main__":
    main()
