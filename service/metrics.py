"""A small Prometheus text-format registry: request counts and latency by route and status."""

from __future__ import annotations

import threading
from collections import defaultdict

# Latency histogram buckets, seconds (Prometheus client defaults, trimmed).
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self._buckets: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * len(BUCKETS_S))
        self._sum_s: dict[tuple[str, str], float] = defaultdict(float)
        self._count: dict[tuple[str, str], int] = defaultdict(int)

    def observe(self, method: str, route: str, status: int, duration_s: float) -> None:
        with self._lock:
            self._requests[(method, route, status)] += 1
            key = (method, route)
            for i, bound in enumerate(BUCKETS_S):
                if duration_s <= bound:
                    self._buckets[key][i] += 1
            self._sum_s[key] += duration_s
            self._count[key] += 1

    def requests_with_status(self, status: int) -> list[tuple[str, str]]:
        """(method, route) of every request answered with `status` so far."""
        with self._lock:
            return [(m, r) for (m, r, s), n in self._requests.items() if s == status for _ in range(n)]

    def render(self) -> str:
        lines = [
            "# HELP trainplan_http_requests_total HTTP requests by method, route template and status.",
            "# TYPE trainplan_http_requests_total counter",
        ]
        with self._lock:
            for (method, route, status), n in sorted(self._requests.items()):
                labels = f'method="{method}",route="{_escape(route)}",status="{status}"'
                lines.append(f"trainplan_http_requests_total{{{labels}}} {n}")
            lines += [
                "# HELP trainplan_http_request_duration_seconds Time to produce a response.",
                "# TYPE trainplan_http_request_duration_seconds histogram",
            ]
            for (method, route), counts in sorted(self._buckets.items()):
                base = f'method="{method}",route="{_escape(route)}"'
                for bound, n in zip(BUCKETS_S, counts, strict=True):
                    lines.append(f'trainplan_http_request_duration_seconds_bucket{{{base},le="{bound}"}} {n}')
                total = self._count[(method, route)]
                lines.append(f'trainplan_http_request_duration_seconds_bucket{{{base},le="+Inf"}} {total}')
                lines.append(
                    f"trainplan_http_request_duration_seconds_sum{{{base}}} {self._sum_s[(method, route)]}"
                )
                lines.append(f"trainplan_http_request_duration_seconds_count{{{base}}} {total}")
        return "\n".join(lines) + "\n"
