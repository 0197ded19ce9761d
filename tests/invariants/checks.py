"""Issue 24's API-level invariants as functions over the API's JSON, shared by the tests
(tests/invariants/test_api_invariants.py) and the sweep (bench/invariant_sweep.py).

Each check takes ``post(path, body) -> (status, json)`` and returns the violations it found, one
``Violation`` per broken promise, with the request that shows it. No check raises on a bad answer:
the sweep counts them, the tests assert there are none.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from service.catalog.gpus import gpus
from service.estimator.types import Precision
from tests.invariants.cases import default_precision, peak_of

Post = Callable[[str, dict[str, Any]], tuple[int, Any]]
GiB = 2**30
RELATIVE = 1e-9

# invariant names, as the sweep reports them
NO_5XX = "no_5xx"
MINIMAL_REQUEST_PLANS = "minimal_request_never_422"
REESTIMATE_SAME = "recommended_reestimates_the_same"
TOP_K_SAME = "recommended_independent_of_top_k"
RATIONALE_NUMBERS = "rationale_numbers_equal_the_estimate"
WITHIN_PEAK = "flops_within_peak_mfu_hfu_le_1"
SUGGESTION_FEASIBLE = "suggestion_applied_is_feasible"
SUGGESTION_NUMBERS = "suggestion_numbers_equal_the_estimate"
FROZEN_BASE = "frozen_base_independent_of_method"
METHOD_ORDER = "model_states_qlora_le_lora_le_full"
MICRO_MONOTONE = "memory_non_decreasing_in_micro_batch"
SEQ_MONOTONE = "memory_non_decreasing_in_seq_len"
ZERO_MONOTONE = "model_states_non_increasing_in_zero_stage"
DP_MONOTONE = "memory_non_increasing_in_zero3_dp"
CLI_AGREES = "cli_json_equals_api"
MEMO_KEYS = "memo_keys_name_every_field_read"


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    message: str
    request: dict[str, Any]

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.message}\n    request: {_compact(self.request)}"


def _compact(body: dict[str, Any]) -> str:
    import json

    return json.dumps(body, separators=(",", ":"), sort_keys=False)


# ---------------------------------------------------------------- requests


def minimal_plan_request(
    preset: str, gpu: str, nodes: int, per_node: int, seq_len: int, batch: int, method: str
) -> dict[str, Any]:
    """A plan request naming only model, cluster and training (no precision, no attention);
    ``method`` "full+foreach": full training with torch.optim's foreach AdamW."""
    cluster: dict[str, Any] = {"gpu": gpu, "num_nodes": nodes, "gpus_per_node": per_node}
    if nodes > 1:
        cluster["inter_node_bandwidth_bytes_per_s"] = 50e9
    training: dict[str, Any] = {"seq_len": seq_len, "global_batch_size": batch}
    method, _, implementation = method.partition("+")
    if method != "full":
        training["method"] = method
    if implementation:
        training["optimizer_implementation"] = implementation
    return {"model": {"preset": preset}, "cluster": cluster, "training": training}


def layout_request(layout: dict[str, Any]) -> dict[str, Any]:
    """A layout the API returned (estimate.layout, a suggestion's layout) as a request's layout."""
    return {k: v for k, v in layout.items() if v is not None}


def world_of(layout: dict[str, Any]) -> int:
    return int(layout.get("dp", 1) * layout.get("tp", 1) * layout.get("pp", 1) * layout.get("cp", 1))


def sub_cluster(cluster: dict[str, Any], gpus_used: int) -> dict[str, Any]:
    """The part of an inline cluster a layout of ``gpus_used`` GPUs runs on, as the plan does
    (recommender.space.sub_cluster): whole nodes, or part of one."""
    out = copy.deepcopy(cluster)
    per_node = cluster["gpus_per_node"]
    out["num_nodes"] = max(1, gpus_used // per_node)
    out["gpus_per_node"] = min(gpus_used, per_node)
    if out["num_nodes"] == 1:
        out.pop("inter_node_bandwidth_bytes_per_s", None)
    return out


def precision_of(request: dict[str, Any]) -> Precision:
    """The precision the job runs in: the request's, else the GPU's default (issue 24)."""
    named = request["training"].get("precision")
    return Precision(named) if named else default_precision(gpus()[request["cluster"]["gpu"]])


# ---------------------------------------------------------------- status


def check_status(request: dict[str, Any], status: int, body: Any, *, minimal: bool) -> list[Violation]:
    out = []
    if status >= 500:
        out.append(Violation(NO_5XX, f"HTTP {status}: {_detail(body)}", request))
    elif minimal and status == 422:
        out.append(
            Violation(
                MINIMAL_REQUEST_PLANS,
                f"422 for a request naming only model, cluster and training: {_detail(body)}",
                request,
            )
        )
    return out


def _detail(body: Any) -> str:
    return str(body.get("detail", body))[:300] if isinstance(body, dict) else str(body)[:300]


# ---------------------------------------------------------------- one plan's own numbers


def candidates(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if plan.get("recommended"):
        yield plan["recommended"]
    yield from plan.get("alternatives", [])


def check_within_peak(request: dict[str, Any], estimate: dict[str, Any], what: str) -> list[Violation]:
    """Hardware FLOP/s per GPU within the dense peak of the precision, MFU and HFU <= 1."""
    time = estimate.get("time")
    gpu_name = request["cluster"]["gpu"]
    if time is None or not isinstance(gpu_name, str) or gpu_name not in gpus():
        return []
    peak = peak_of(gpus()[gpu_name], precision_of(request))
    problems = []
    if time["hardware_tflops_per_gpu"] * 1e12 > peak * (1 + RELATIVE):
        problems.append(
            f"{time['hardware_tflops_per_gpu']:.1f} hardware TFLOP/s per GPU > the {gpu_name}'s dense "
            f"{precision_of(request).value} peak {peak / 1e12:.1f}"
        )
    for name in ("mfu", "hfu"):
        if time[name] > 1.0:
            problems.append(f"{name.upper()} {time[name]:.3f} > 1")
    return [Violation(WITHIN_PEAK, f"{what}: {p}", request) for p in problems]


def check_plan_peaks(request: dict[str, Any], plan: dict[str, Any]) -> list[Violation]:
    out = []
    for i, candidate in enumerate(candidates(plan)):
        what = "recommended" if i == 0 and plan.get("recommended") else f"alternative {i}"
        out += check_within_peak(request, candidate["estimate"], what)
    return out


def reestimate_request(request: dict[str, Any], layout: dict[str, Any]) -> dict[str, Any]:
    """``POST /v1/estimates`` for a plan's layout: the plan's model and training, the part of its
    cluster the layout uses."""
    return {
        "model": request["model"],
        "cluster": sub_cluster(request["cluster"], world_of(layout)),
        "training": request["training"],
        "layout": layout_request(layout),
    }


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON values differ (floats within RELATIVE)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                out.append(f"{path}.{key}: only in {'the first' if key in a else 'the second'}")
            else:
                out += _differences(a[key], b[key], f"{path}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items vs {len(b)}"]
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")
        ]
    numbers = isinstance(a, int | float) and isinstance(b, int | float)
    if numbers and (isinstance(a, float) or isinstance(b, float)):
        same = math.isclose(a, b, rel_tol=RELATIVE, abs_tol=1e-12)
    else:
        same = a == b
    return [] if same else [f"{path}: {a!r} vs {b!r}"]


def check_reestimate(post: Post, request: dict[str, Any], plan: dict[str, Any]) -> list[Violation]:
    """The recommended layout, estimated alone, gives the plan's memory, time, fit and limits."""
    rec = plan.get("recommended")
    if not rec:
        return []
    body = reestimate_request(request, rec["layout"])
    status, answer = post("/v1/estimates", body)
    if status != 200:
        return [Violation(REESTIMATE_SAME, f"HTTP {status} re-estimating the recommended layout: "
                          f"{_detail(answer)}", body)]  # fmt: skip
    mine = rec["estimate"]
    diffs = []
    for key in ("fits", "memory", "time", "limits", "time_to_train_s"):
        diffs += _differences(mine.get(key), answer.get(key), key)
    if not diffs:
        return []
    return [Violation(REESTIMATE_SAME, f"plan vs estimate: {'; '.join(diffs[:6])}", body)]


def check_memo_keys(request: dict[str, Any]) -> list[Violation]:
    """No memoised estimator part read a layout field its key leaves out while this request (and its
    checks) ran in this process: such a read is caught on the part's view of its key and answered
    correctly, unmemoised, and recorded in ``service.estimator.job.UNKEYED_READS`` (cleared here)."""
    from service.estimator import job

    if not job.UNKEYED_READS:
        return []
    found = sorted(job.UNKEYED_READS)
    job.UNKEYED_READS.clear()
    return [Violation(MEMO_KEYS, f"memoised parts read fields their keys do not name: {found}", request)]


def check_top_k(post: Post, request: dict[str, Any], plan: dict[str, Any]) -> list[Violation]:
    """The recommended layout does not depend on how many alternatives are asked for: the plan
    asked again with ``constraints.top_k`` 1 recommends the same layout. A search bound that is not
    a bound prunes more with a smaller k (the k-th best is better), so it shows here."""
    rec = plan.get("recommended")
    if not rec:
        return []
    body = copy.deepcopy(request)
    body.setdefault("constraints", {})["top_k"] = 1
    status, answer = post("/v1/plans", body)
    if status != 201:
        return [Violation(TOP_K_SAME, f"HTTP {status} planning with top_k 1: {_detail(answer)}", body)]
    one = answer.get("recommended")
    if one is not None and one["layout"] == rec["layout"]:
        return []
    if one is None:
        what = "nothing"
    else:
        layout, tokens_per_s = one["layout"], one["estimate"]["time"]["tokens_per_s"]
        split = " ".join(f"{k}{layout.get(k)}" for k in ("dp", "tp", "pp", "cp", "ep", "zero_stage"))
        what = f"{tokens_per_s:,.0f} tokens/s ({layout['framework']} {split})"
    mine = rec["estimate"]["time"]["tokens_per_s"]
    asked = request.get("constraints", {}).get("top_k", 3)  # the API's default
    return [Violation(TOP_K_SAME, f"top_k 1 recommends {what}; the plan's top {asked}, {mine:,.0f}", body)]


# ---------------------------------------------------------------- the rationale's numbers


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def rationale_expectations(candidate: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(pattern, the text the estimate says the first group should read, name) for each number the
    recommended candidate's rationale states; the estimate's value formatted as the line formats it."""
    est, layout = candidate["estimate"], candidate["layout"]
    t, m = est.get("time") or {}, est["memory"]
    out: list[tuple[str, str, str]] = []
    if t:
        step = t["step_s"]
        b = t["breakdown"]
        out += [
            (r"^([\d,]+) tokens/s, \d+ TFLOP/s per GPU", f"{t['tokens_per_s']:,.0f}", "tokens/s"),
            (r"^[\d,]+ tokens/s, (\d+) TFLOP/s per GPU", f"{t['tflops_per_gpu']:.0f}", "TFLOP/s per GPU"),
            (r"TFLOP/s per GPU, MFU ([\d.]+%)", f"{t['mfu']:.1%}", "MFU"),
            (r"of the ([\d.e+-]+) s step", f"{step:.3g}", "step seconds"),
            (r"compute-bound: ([\d.]+%) of the", f"{b['compute_s'] / step:.1%}", "compute share"),
            (r"\(compute (\d+%)\)", f"{b['compute_s'] / step:.0%}", "compute share"),
            (r"bubble ([\d.]+%) of step", f"{b['pp_bubble_s'] / step:.1%}", "bubble share"),
            (r"([\d.]+%) of the step left exposed", f"{b['ep_comm_s'] / step:.1%}", "exposed EP share"),
        ]
    out += [
        (r"^([\d.]+) GiB of [\d.]+ GiB per GPU", f"{m['per_gpu']['total'] / GiB:.1f}", "GiB per GPU"),
        (r"^[\d.]+ GiB of ([\d.]+) GiB per GPU", f"{m['capacity_bytes'] / GiB:.1f}", "capacity GiB"),
        (r"GiB per GPU: (-?[\d.]+) GiB headroom", f"{m['headroom_bytes'] / GiB:.1f}", "headroom GiB"),
        (r"GiB headroom \((-?\d+%)\)", f"{m['headroom_bytes'] / m['capacity_bytes']:.0%}", "headroom share"),
        (r"offload needs (\d+) GiB host RAM", f"{m['cpu_per_node_bytes'] / GiB:.0f}", "host RAM GiB"),
        (r"^micro-batch (\d+) ", str(layout["micro_batch_size"]), "micro-batch"),
        (r"^TP=(\d+)", str(layout["tp"]), "tp"),
        (r"^CP=(\d+)", str(layout["cp"]), "cp"),
        (r"^EP=(\d+)", str(layout["ep"]), "ep"),
        (r"^PP=(\d+)", str(layout["pp"]), "pp"),
        (r"^PP=\d+ .*, v=(\d+):", str(layout["virtual_pipeline_stages"]), "virtual stages"),
        (r"^uses all (\d+) GPUs", str(world_of(layout)), "GPUs used"),
        (r"^uses (\d+) of \d+ GPUs", str(world_of(layout)), "GPUs used"),
        (r"^ZeRO-(\d) over", str(layout["zero_stage"]), "ZeRO stage"),
        (r"(?:ZeRO-\d|FSDP \w+) over (\d+) ranks", str(layout["dp"] * layout["cp"]), "sharding ranks"),
        (r"over dp x cp = (\d+)", str(layout["dp"] * layout["cp"]), "sharding ranks"),
    ]
    return out


def check_rationale(request: dict[str, Any], plan: dict[str, Any]) -> list[Violation]:
    """Every number the rationale states equals the estimate's, formatted as the line formats it."""
    out = []
    rec = plan.get("recommended")
    if rec:
        expectations = rationale_expectations(rec)
        for line in rec["rationale"]:
            # the largest micro-batch within the plan's headroom: at least the chosen one, at most
            # what fits the whole card (the estimate's limit)
            largest = re.search(r"largest that fits(?: within the plan's headroom)?: (\d+)\)", line)
            card = rec["estimate"]["limits"]["max_micro_batch_size"]
            chosen = rec["layout"]["micro_batch_size"]
            if largest and not chosen <= int(largest.group(1)) <= card:
                out.append(
                    Violation(
                        RATIONALE_NUMBERS,
                        f"recommended rationale {line!r}: largest micro-batch {largest.group(1)} outside "
                        f"[{chosen}, {card}] (the chosen one, the card's limit)",
                        request,
                    )
                )
            for pattern, expected, name in expectations:
                match = re.search(pattern, line)
                if match and match.group(1) != expected:
                    out.append(
                        Violation(
                            RATIONALE_NUMBERS,
                            f"recommended rationale {line!r}: {name} {match.group(1)} but the estimate "
                            f"says {expected}",
                            request,
                        )
                    )
    best = (rec or {}).get("estimate", {}).get("time")
    for i, alt in enumerate(plan.get("alternatives", []), start=1):
        est, t = alt["estimate"], alt["estimate"].get("time")
        if not t or not best:
            continue
        wanted = [
            (r"^([\d,]+) tokens/s \(", f"{t['tokens_per_s']:,.0f}", "tokens/s"),
            (r"\((-?[\d.]+%) below the recommended", f"{1 - t['tokens_per_s'] / best['tokens_per_s']:.1%}",
             "share below the recommended"),
            # faster than the recommended: a near tie its fewer model-parallel degrees won (rank.py)
            (r"\(([\d.]+%) above the recommended", f"{t['tokens_per_s'] / best['tokens_per_s'] - 1:.1%}",
             "share above the recommended"),
            (r"(-?[\d.]+) GiB headroom", f"{est['memory']['headroom_bytes'] / GiB:.1f}", "headroom GiB"),
            (r"of the ([\d.e+-]+) s step", f"{t['step_s']:.3g}", "step seconds"),
        ]  # fmt: skip
        for line in alt["rationale"]:
            for pattern, expected, name in wanted:
                match = re.search(pattern, line)
                if match and match.group(1) != expected:
                    out.append(
                        Violation(
                            RATIONALE_NUMBERS,
                            f"alternative {i} rationale {line!r}: {name} {match.group(1)} but the estimate "
                            f"says {expected}",
                            request,
                        )
                    )
    return out


# ---------------------------------------------------------------- suggestions


def applied_suggestion(request: dict[str, Any], suggestion: dict[str, Any]) -> dict[str, Any]:
    """The plan request with the suggestion applied as it states: its GPU, GPU count and node
    shape, its method (lora / qlora), the host RAM it says offload needs, any training field it names."""
    out = copy.deepcopy(request)
    out.pop("constraints", None)
    out.pop("launchers", None)
    cluster, training = out["cluster"], out["training"]
    if suggestion.get("gpu"):
        cluster["gpu"] = suggestion["gpu"]
    count = suggestion.get("num_gpus")
    nodes = suggestion.get("num_nodes")
    per_node = suggestion.get("gpus_per_node")
    if count:
        if per_node and not nodes:
            nodes = max(1, count // per_node)
        if nodes and not per_node:
            per_node = count // nodes if count % nodes == 0 else cluster["gpus_per_node"]
        if not nodes:
            per_node = cluster["gpus_per_node"]
            nodes = max(1, count // per_node)
        cluster["num_nodes"], cluster["gpus_per_node"] = nodes, per_node
    for key, value in (suggestion.get("cluster") or {}).items():  # a node shape it states whole
        cluster[key] = value
    if suggestion.get("inter_node_bandwidth_bytes_per_s"):
        cluster["inter_node_bandwidth_bytes_per_s"] = suggestion["inter_node_bandwidth_bytes_per_s"]
    if cluster["num_nodes"] > 1:
        # not stated by the suggestion: the request's network, else 400 Gb/s per GPU
        cluster.setdefault("inter_node_bandwidth_bytes_per_s", 50e9)
    else:
        cluster.pop("inter_node_bandwidth_bytes_per_s", None)
    if suggestion.get("cpu_per_node_bytes"):
        cluster["cpu_memory_bytes_per_node"] = max(
            cluster.get("cpu_memory_bytes_per_node", 0), suggestion["cpu_per_node_bytes"]
        )
    if suggestion.get("nvme_per_node_bytes"):  # the NVMe a ZeRO-Infinity suggestion writes to
        cluster["nvme_bytes_per_node"] = max(
            cluster.get("nvme_bytes_per_node", 0), suggestion["nvme_per_node_bytes"]
        )
    kind = suggestion.get("kind")
    if kind in ("lora", "qlora"):
        training["method"] = kind
    for key, value in (suggestion.get("training") or {}).items():
        training[key] = value
    for key in (
        "seq_len",
        "global_batch_size",
        "method",
        "precision",
        "base_dtype",
        "optimizer_implementation",
        "optimizer",
    ):
        if suggestion.get(key) is not None:
            training[key] = suggestion[key]
    return out


def check_suggestions(
    post: Post, request: dict[str, Any], plan: dict[str, Any], *, replan: bool = True
) -> list[Violation]:
    """Each suggestion applied as it states gives a feasible estimate of its layout (when it names
    one) with the numbers it quotes, and (``replan``) a plan whose status is feasible."""
    out = []
    for suggestion in plan.get("suggestions", []):
        applied = applied_suggestion(request, suggestion)
        label = f"suggestion {suggestion.get('kind')} ({suggestion.get('detail', '')[:120]})"
        layout = suggestion.get("layout")
        if layout:
            body = reestimate_request(applied, layout)
            if world_of(layout) == applied["cluster"]["num_nodes"] * applied["cluster"]["gpus_per_node"]:
                body["cluster"] = applied["cluster"]
            status, est = post("/v1/estimates", body)
            if status != 200:
                out.append(Violation(SUGGESTION_FEASIBLE, f"{label}: its layout is HTTP {status}: "
                                     f"{_detail(est)}", body))  # fmt: skip
                continue
            if not est["fits"]:
                out.append(Violation(SUGGESTION_FEASIBLE, f"{label}: its layout does not fit: "
                                     f"{est['memory']['per_gpu']['total'] / GiB:.2f} GiB of "
                                     f"{est['memory']['capacity_bytes'] / GiB:.2f}; "
                                     f"{'; '.join(est['warnings'])[:200]}", body))  # fmt: skip
            stated = suggestion.get("per_gpu_bytes")
            if stated is not None and stated != est["memory"]["per_gpu"]["total"]:
                out.append(Violation(SUGGESTION_NUMBERS, f"{label}: states {stated / GiB:.2f} GiB per GPU, "
                                     f"its layout estimates {est['memory']['per_gpu']['total'] / GiB:.2f}",
                                     body))  # fmt: skip
            tps = suggestion.get("tokens_per_s")
            if (
                tps is not None
                and est.get("time")
                and not math.isclose(tps, est["time"]["tokens_per_s"], rel_tol=1e-6)
            ):
                out.append(Violation(SUGGESTION_NUMBERS, f"{label}: states {tps:,.0f} tokens/s, its layout "
                                     f"estimates {est['time']['tokens_per_s']:,.0f}", body))  # fmt: skip
        if replan or not layout:
            status, answer = post("/v1/plans", applied)
            if status != 201:
                out.append(Violation(SUGGESTION_FEASIBLE, f"{label}: applied, the plan is HTTP {status}: "
                                     f"{_detail(answer)}", applied))  # fmt: skip
            elif answer["status"] != "feasible":
                out.append(Violation(SUGGESTION_FEASIBLE, f"{label}: applied, the plan is "
                                     f"{answer['status']}", applied))  # fmt: skip
    return out


# ---------------------------------------------------------------- CLI and API


VOLATILE = ("id", "created_at", "request")


def comparable_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """A plan without what differs between two identical requests: id, time, the request echo, and
    the search's wall time."""
    out = {k: v for k, v in plan.items() if k not in VOLATILE}
    out["search"] = {k: v for k, v in plan.get("search", {}).items() if k != "duration_s"}
    return out


def check_cli_agrees(request: dict[str, Any], api_plan: dict[str, Any], cli_plan: dict[str, Any],
                     exit_code: int) -> list[Violation]:  # fmt: skip
    out = []
    diffs = _differences(comparable_plan(api_plan), comparable_plan(cli_plan))
    if diffs:
        out.append(Violation(CLI_AGREES, f"API vs CLI --json: {'; '.join(diffs[:6])}", request))
    wanted = 0 if api_plan.get("status") == "feasible" else 2
    if exit_code != wanted:
        out.append(Violation(CLI_AGREES, f"CLI exit code {exit_code} for a plan the API calls "
                             f"{api_plan.get('status')} (expected {wanted})", request))  # fmt: skip
    return out


def cli_args(request: dict[str, Any]) -> list[str]:
    """``trainplan plan`` arguments for a minimal plan request (no precision: the GPU's default)."""
    cluster, training = request["cluster"], request["training"]
    gpus_arg = f"{cluster['num_nodes']}x{cluster['gpus_per_node']}x{cluster['gpu']}"
    args = ["plan", "--model", request["model"]["preset"], "--gpus", gpus_arg]
    if cluster["num_nodes"] > 1:
        args += ["--inter-gbps", str(cluster["inter_node_bandwidth_bytes_per_s"] / 1e9)]
    args += ["--seq", str(training["seq_len"]), "--batch", str(training["global_batch_size"])]
    if training.get("method", "full") != "full":
        args += ["--method", training["method"]]
    if "optimizer_implementation" in training:
        args += ["--optimizer-implementation", training["optimizer_implementation"]]
    return [*args, "--json"]
