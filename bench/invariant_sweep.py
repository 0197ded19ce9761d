"""Issue 24's invariant sweep: every model preset x every catalog GPU x full/LoRA/QLoRA (and full
training with torch.optim's foreach AdamW, whose infeasible plans suggest the fused step), each a
plan request naming only model, cluster and training, planned in-process through the API
(TestClient on a SQLite database per worker) and checked with the invariant suite's own checks
(tests/invariants/checks.py for the API's answers, tests/invariants/properties.py for the
estimator's properties around each recommended layout).

    .venv/bin/python -m bench.invariant_sweep [--limit N] [--workers K] [--cli-every N]

writes bench/invariant_sweep.json (counts, every violation with its request) and prints a summary:
plans, 5xx, 422s of minimal requests, and each invariant's violations.

The job of each (preset, GPU, method): GPUs cycle through 1, 2, 4, 8 and 2 x 8 (nodes of up to 8),
sequence length through 2048, 4096 and 8192, global batch 32.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "invariant_sweep.json"
METHODS = ("full", "lora", "qlora", "full+foreach")  # the last: full training, foreach AdamW
SHAPES = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8))  # (nodes, GPUs per node)
SEQ_LENS = (2048, 4096, 8192)
BATCH = 32
UNHURRIED_S = 60.0  # the CLI comparison's wall-time budget (see _start_worker)

Job = tuple[str, str, int, int, int, int, str]


def jobs() -> list[Job]:
    from service.catalog.models import model
    from service.estimator.validate import learned_positions
    from tests.invariants.cases import gpu_names, preset_names

    out = []
    for i, preset in enumerate(sorted(preset_names())):
        # within a learned position table's rows (GPT-2 1,024, BERT 512): past them a request is refused
        rows = learned_positions(model(preset).spec)
        seq = SEQ_LENS[i % len(SEQ_LENS)]
        seq = seq if rows is None or seq <= rows else 2 ** (rows.bit_length() - 1)
        for j, gpu in enumerate(gpu_names()):
            nodes, per_node = SHAPES[(i + j) % len(SHAPES)]
            for method in METHODS:
                out.append((preset, gpu, nodes, per_node, seq, BATCH, method))
    return out


# ---------------------------------------------------------------- one worker


_STATE: dict[str, Any] = {}


def _start_worker() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    from fastapi.testclient import TestClient

    from service.cli import migrate
    from service.main import create_app
    from service.settings import Settings

    directory = tempfile.mkdtemp(prefix="invariant-sweep-")
    url = f"sqlite:///{directory}/sweep.db"
    migrate(url)
    logging.disable(logging.CRITICAL)  # a 500's traceback is counted, not printed
    client = TestClient(
        create_app(Settings(database_url=url, log_level="CRITICAL")), raise_server_exceptions=False
    )
    client.__enter__()
    # The CLI comparison plans the job again on both faces with a wall-time budget no job reaches:
    # the service's own 1.5 s, cut at different moments by the machine's load, would make the two
    # answers differ where the code paths do not.
    unhurried = TestClient(
        create_app(Settings(database_url=url, log_level="CRITICAL", request_budget_s=UNHURRIED_S)),
        raise_server_exceptions=False,
    )
    unhurried.__enter__()
    _STATE.update(client=client, unhurried=unhurried, url=url)


def _post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
    response = _STATE["client"].post(path, json=body)
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, {"detail": response.text[:300]}


def _case_of(request: dict[str, Any], layout: dict[str, Any]) -> Any:
    """The recommended layout as an estimator case (the precision and attention the request left
    to the GPU resolved as issue 24 says), for the estimator's properties."""
    from service.estimator.types import Method
    from tests.invariants.cases import Case, default_attention, gpu, layout_from_api
    from tests.invariants.checks import precision_of

    training = request["training"]
    domain = layout_from_api(layout)
    precision = precision_of(request)
    return Case(
        preset=request["model"]["preset"],
        gpu=request["cluster"]["gpu"],
        seq_len=training["seq_len"],
        global_batch_size=training["global_batch_size"],
        precision=precision,
        attention=default_attention(gpu(request["cluster"]["gpu"]), precision),
        method=Method(training.get("method", "full")),
        layout=domain,
    )


def _properties(request: dict[str, Any], plan: dict[str, Any]) -> list[tuple[str, str]]:
    """The estimator's invariants around the recommended layout: (invariant, message) of each broken."""
    from tests.invariants import checks
    from tests.invariants import properties as prop

    rec = plan.get("recommended")
    if not rec:
        return []
    case = _case_of(request, rec["layout"])
    if case.cluster.world_size != checks.world_of(rec["layout"]) or case.violation() is not None:
        return []  # a node shape the estimator cases do not build (the estimate itself was checked)
    named: list[tuple[str, Callable[[Any], str | None]]] = [
        (checks.MICRO_MONOTONE, prop.memory_non_decreasing_in_micro_batch),
        (checks.SEQ_MONOTONE, prop.memory_non_decreasing_in_seq_len),
        (checks.ZERO_MONOTONE, prop.model_states_non_increasing_in_zero_stage),
        (checks.DP_MONOTONE, prop.memory_non_increasing_in_zero3_dp),
        (checks.METHOD_ORDER, prop.model_states_qlora_le_lora_le_full),
        (checks.FROZEN_BASE, prop.frozen_base_independent_of_method),
        ("custom_gpu_not_faster", prop.custom_gpu_not_faster),
        ("mfu_within_best_published", prop.mfu_within_best_published),
    ]
    out = []
    for name, check in named:
        try:
            message = check(case)
        except prop.NotApplicable:
            continue
        except Exception as exc:  # an estimator crash on a valid neighbour is a finding too
            message = f"raised {type(exc).__name__}: {exc}"
        if message is not None:
            out.append((name, message))
    return out


def _cli(request: dict[str, Any]) -> list[Any]:
    from click.testing import CliRunner

    from service.cli import main
    from service.settings import get_settings
    from tests.invariants import checks

    response = _STATE["unhurried"].post("/v1/plans", json=request)
    plan = response.json()
    if response.status_code != 201:
        return []  # the status was checked on the service as shipped
    os.environ["PLANNER_DATABASE_URL"] = _STATE["url"]
    os.environ["PLANNER_REQUEST_BUDGET_S"] = str(UNHURRIED_S)
    get_settings.cache_clear()
    result = CliRunner().invoke(main, checks.cli_args(request), catch_exceptions=True)
    try:
        cli_plan = json.loads(result.stdout)
    except ValueError:
        return [checks.Violation(checks.CLI_AGREES, f"CLI exit {result.exit_code}, no JSON: "
                                 f"{result.output[-200:]}", request)]  # fmt: skip
    return checks.check_cli_agrees(request, plan, cli_plan, result.exit_code)


def run_job(job: Job, cli: bool = False, replan: bool = False) -> dict[str, Any]:
    from tests.invariants import checks

    if not _STATE:
        _start_worker()
    request = checks.minimal_plan_request(*job)
    started = time.perf_counter()
    violations: list[Any] = []
    status, plan = _post("/v1/plans", request)
    seconds = time.perf_counter() - started
    violations += checks.check_status(request, status, plan, minimal=True)
    plan_status = plan.get("status") if status == 201 else None
    if status == 201:
        plan_checks: list[Callable[[], list[Any]]] = [
            lambda: checks.check_plan_peaks(request, plan),
            lambda: checks.check_reestimate(_post, request, plan),
            lambda: checks.check_top_k(_post, request, plan),
            lambda: checks.check_rationale(request, plan),
            lambda: checks.check_suggestions(_post, request, plan, replan=replan),
        ]
        for check in plan_checks:
            try:
                violations += check()
            except Exception as exc:  # a check that cannot read the answer is reported, not fatal
                violations.append(checks.Violation("check_error", f"{type(exc).__name__}: {exc}", request))
        violations += [
            checks.Violation(name, message, request) for name, message in _properties(request, plan)
        ]
        if cli:
            violations += _cli(request)
    violations += checks.check_memo_keys(request)  # last: over everything computed for this job
    return {
        "job": list(job),
        "http_status": status,
        "status": plan_status,
        "plan_s": round(seconds, 4),
        "suggestions": len(plan.get("suggestions", [])) if status == 201 else 0,
        "violations": [
            {"invariant": v.invariant, "message": v.message, "request": v.request} for v in violations
        ],
    }


def _run_job_star(args: tuple[Job, bool, bool]) -> dict[str, Any]:
    return run_job(*args)


# ---------------------------------------------------------------- the sweep


INVARIANTS = [
    "no_5xx",
    "minimal_request_never_422",
    "flops_within_peak_mfu_hfu_le_1",
    "recommended_reestimates_the_same",
    "recommended_independent_of_top_k",
    "rationale_numbers_equal_the_estimate",
    "suggestion_applied_is_feasible",
    "suggestion_numbers_equal_the_estimate",
    "memory_non_decreasing_in_micro_batch",
    "memory_non_decreasing_in_seq_len",
    "model_states_non_increasing_in_zero_stage",
    "memory_non_increasing_in_zero3_dp",
    "model_states_qlora_le_lora_le_full",
    "frozen_base_independent_of_method",
    "custom_gpu_not_faster",
    "mfu_within_best_published",
    "cli_json_equals_api",
    "memo_keys_name_every_field_read",
]


def summarise(results: list[dict[str, Any]], seconds: float, workers: int) -> dict[str, Any]:
    by_invariant: Counter[str] = Counter()
    examples: dict[str, list[dict[str, Any]]] = {}
    jobs_failing: Counter[str] = Counter()
    for result in results:
        seen = set()
        for v in result["violations"]:
            by_invariant[v["invariant"]] += 1
            examples.setdefault(v["invariant"], [])
            if len(examples[v["invariant"]]) < 5:
                examples[v["invariant"]].append(v)
            seen.add(v["invariant"])
        for name in seen:
            jobs_failing[name] += 1
    statuses = Counter(str(r["http_status"]) for r in results)
    plan_times = sorted(r["plan_s"] for r in results)
    return {
        "plans": len(results),
        "seconds": round(seconds, 1),
        "workers": workers,
        "http_status": dict(sorted(statuses.items())),
        "feasible": sum(r["status"] == "feasible" for r in results),
        "infeasible": sum(r["status"] == "infeasible" for r in results),
        "5xx": sum(r["http_status"] >= 500 for r in results),
        "422_minimal_requests": sum(r["http_status"] == 422 for r in results),
        "plan_s_median": plan_times[len(plan_times) // 2] if plan_times else None,
        "plan_s_max": plan_times[-1] if plan_times else None,
        "violations_by_invariant": dict(by_invariant.most_common()),
        "jobs_failing_by_invariant": dict(jobs_failing.most_common()),
        "invariants_checked": INVARIANTS,
        "examples": examples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, help="only the first N jobs (every k-th of the grid, spread)")
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--cli-every", type=int, default=50, help="compare the CLI's JSON on every N-th job")
    parser.add_argument("--replan", action="store_true", help="also plan every applied suggestion (slow)")
    parser.add_argument("--json", type=Path, default=OUT)
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    grid = jobs()
    if args.limit and args.limit < len(grid):
        stride = len(grid) / args.limit
        grid = [grid[int(i * stride)] for i in range(args.limit)]
    work = [(job, args.cli_every > 0 and i % args.cli_every == 0, args.replan) for i, job in enumerate(grid)]
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    if args.workers <= 1:
        for i, item in enumerate(work):
            results.append(_run_job_star(item))
            _progress(i + 1, len(work), started)
    else:
        with ProcessPoolExecutor(max_workers=args.workers, initializer=_start_worker) as pool:
            for i, result in enumerate(pool.map(_run_job_star, work, chunksize=4)):
                results.append(result)
                _progress(i + 1, len(work), started)
    summary = summarise(results, time.perf_counter() - started, args.workers)
    args.json.write_text(json.dumps({"summary": summary, "results": results}, indent=1) + "\n")
    _print(summary, args.json)
    return 0


def _progress(done: int, total: int, started: float) -> None:
    if done % 100 == 0 or done == total:
        print(f"  {done}/{total} plans, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)


def _print(summary: dict[str, Any], path: Path) -> None:
    print(
        f"{summary['plans']} plans in {summary['seconds']} s ({summary['workers']} workers): "
        f"{summary['feasible']} feasible, {summary['infeasible']} infeasible; HTTP {summary['http_status']}"
    )
    print(f"5xx: {summary['5xx']}   422 for requests naming only model/cluster/training: "
          f"{summary['422_minimal_requests']}")  # fmt: skip
    print("violations by invariant (violations / plans with one):")
    for name in summary["invariants_checked"]:
        count = summary["violations_by_invariant"].get(name, 0)
        print(f"  {name:45s} {count:6d} / {summary['jobs_failing_by_invariant'].get(name, 0)}")
    for name, count in summary["violations_by_invariant"].items():
        if name not in summary["invariants_checked"]:
            print(f"  {name:45s} {count:6d} / {summary['jobs_failing_by_invariant'].get(name, 0)}")
    for name, examples in summary["examples"].items():
        print(f"e.g. [{name}] {examples[0]['message'][:300]}")
        print(f"     {json.dumps(examples[0]['request'], separators=(',', ':'))[:400]}")
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
