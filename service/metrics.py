"""Prometheus metrics through ``prometheus_client``: request counts and latency by route and status,
layout searches (duration, evaluations, cut short by the budget) and database unavailability by reason.

One process (the default): each app keeps its own registry, so that every app a test makes starts
from zero. Several worker processes (``uvicorn --workers N``, gunicorn): set ``PROMETHEUS_MULTIPROC_DIR``
to an empty directory, writable by every worker, before the server starts. Each worker then writes its
values to its own files there (prometheus_client's multiprocess mode, chosen when prometheus_client is
first imported) and ``/metrics`` sums every worker's files, so one scrape counts the requests of all of
them, whichever worker answers it. The directory must be emptied between runs of the server (``make
serve`` does): counts left from an earlier run would be added in.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

# No `*_created` series: the exposition stays what the service has always exposed (multiprocess mode
# has none either).
disable_created_metrics()  # type: ignore[no-untyped-call]

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Latency histogram buckets, seconds (Prometheus client defaults, trimmed).
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def multiprocess_dir() -> Path | None:
    """The directory the workers share their values through, or None (one process). Set at all,
    even empty, the variable turns prometheus_client's multiprocess mode on, so it must then name a
    directory (its older lower-case spelling likewise)."""
    for name in (MULTIPROC_DIR_ENV, MULTIPROC_DIR_ENV.lower()):
        if name in os.environ:
            value = os.environ[name]
            if not value or not Path(value).is_dir():
                raise RuntimeError(f"{name}={value!r} is not a directory: create it before the server starts")
            return Path(value)
    return None


class Metrics:
    def __init__(self) -> None:
        self.multiprocess_dir = multiprocess_dir()
        # Multiprocess: the values live in the shared files, read back at each scrape; the metric
        # objects register nowhere (two apps in one process would otherwise clash by name).
        registry = CollectorRegistry(auto_describe=True) if self.multiprocess_dir is None else None
        self._registry = registry
        self._requests = Counter(
            "trainplan_http_requests_total",
            "HTTP requests by method, route template and status.",
            ("method", "route", "status"),
            registry=registry,
        )
        self._duration = Histogram(
            "trainplan_http_request_duration_seconds",
            "Time to produce a response.",
            ("method", "route"),
            buckets=BUCKETS_S,
            registry=registry,
        )
        self._search_duration = Histogram(
            "trainplan_search_duration_seconds",
            "Time of each plan's layout search.",
            buckets=BUCKETS_S,
            registry=registry,
        )
        self._search_evaluations = Counter(
            "trainplan_search_evaluations_total", "Layout evaluations the searches spent.", registry=registry
        )
        self._search_truncated = Counter(
            "trainplan_search_truncated_total", "Searches the evaluation budget cut short.", registry=registry
        )
        self._database_unavailable = Counter(
            "trainplan_database_unavailable_total",
            "503s because of the database, by reason.",
            ("reason",),
            registry=registry,
        )

    def observe(self, method: str, route: str, status: int, duration_s: float) -> None:
        self._requests.labels(method, route, str(status)).inc()
        self._duration.labels(method, route).observe(duration_s)

    def observe_search(self, duration_s: float, evaluations: int, truncated: bool) -> None:
        """One layout search of a plan (not a replayed one)."""
        self._search_duration.observe(duration_s)
        self._search_evaluations.inc(evaluations)
        if truncated:
            self._search_truncated.inc()

    def observe_database_unavailable(self, reason: str) -> None:
        """A request answered 503 because the database could not serve it."""
        self._database_unavailable.labels(reason).inc()

    def requests_with_status(self, status: int) -> list[tuple[str, str]]:
        """(method, route) of every request this process answered with `status` so far."""
        found: list[tuple[str, str]] = []
        for family in self._requests.collect():
            for sample in family.samples:
                labels = sample.labels
                if sample.name.endswith("_total") and labels["status"] == str(status):
                    found += [(labels["method"], labels["route"])] * int(sample.value)
        return found

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4): this app's registry, or every worker's
        files in multiprocess mode."""
        if self.multiprocess_dir is None:
            assert self._registry is not None
            return generate_latest(self._registry).decode()
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.multiprocess_dir))  # type: ignore[no-untyped-call]
        return generate_latest(registry).decode()
