"""A small Prometheus text-format registry: request counts and latency by route and status, layout
searches (duration, evaluations, cut short by the budget) and database unavailability by reason."""

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
        self._searches = self._search_evaluations = self._search_truncated = 0
        self._search_s = 0.0
        self._search_buckets = [0] * len(BUCKETS_S)
        self._database_unavailable: dict[str, int] = defaultdict(int)

    def observe(self, method: str, route: str, status: int, duration_s: float) -> None:
        with self._lock:
            self._requests[(method, route, status)] += 1
            key = (method, route)
            for i, bound in enumerate(BUCKETS_S):
                if duration_s <= bound:
                    self._buckets[key][i] += 1
            self._sum_s[key] += duration_s
            self._count[key] += 1

    def observe_search(self, duration_s: float, evaluations: int, truncated: bool) -> None:
        """One layout search of a plan (not a replayed one)."""
        with self._lock:
            self._searches += 1
            self._search_s += duration_s
            self._search_evaluations += evaluations
            self._search_truncated += int(truncated)
            for i, bound in enumerate(BUCKETS_S):
                if duration_s <= bound:
                    self._search_buckets[i] += 1

    def observe_database_unavailable(self, reason: str) -> None:
        """A request answered 503 because the database could not serve it."""
        with self._lock:
            self._database_unavailable[reason] += 1

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
            lines += [
                "# HELP trainplan_search_duration_seconds Time of each plan's layout search.",
                "# TYPE trainplan_search_duration_seconds histogram",
            ]
            for bound, n in zip(BUCKETS_S, self._search_buckets, strict=True):
                lines.append(f'trainplan_search_duration_seconds_bucket{{le="{bound}"}} {n}')
            lines.append(f'trainplan_search_duration_seconds_bucket{{le="+Inf"}} {self._searches}')
            lines.append(f"trainplan_search_duration_seconds_sum {self._search_s}")
            lines.append(f"trainplan_search_duration_seconds_count {self._searches}")
            lines += [
                "# HELP trainplan_search_evaluations_total Layout evaluations the searches spent.",
                "# TYPE trainplan_search_evaluations_total counter",
                f"trainplan_search_evaluations_total {self._search_evaluations}",
                "# HELP trainplan_search_truncated_total Searches the evaluation budget cut short.",
                "# TYPE trainplan_search_truncated_total counter",
                f"trainplan_search_truncated_total {self._search_truncated}",
                "# HELP trainplan_database_unavailable_total 503s because of the database, by reason.",
                "# TYPE trainplan_database_unavailable_total counter",
            ]
            for reason, n in sorted(self._database_unavailable.items()):
                lines.append(f'trainplan_database_unavailable_total{{reason="{_escape(reason)}"}} {n}')
        return "\n".join(lines) + "\n"
