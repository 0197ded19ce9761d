"""Recommender speed: full searches, and layouts evaluated per second against llm-analysis.

Run: ``make bench``, or ``.venv/bin/python -m bench.recommender_bench [--llm-analysis PYTHON]
[--json PATH]``. ``PYTHON`` is an interpreter with ``llm-analysis==0.2.2`` installed (its own venv:
it pins ``transformers==4.31``); it evaluates the same layouts in a subprocess that times itself,
one round at our command, interleaved with ours so both see the machine in the same phase.
Not a test: timings depend on the machine, so they are reported with best and median of repeats.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

from service.catalog.gpus import gpu
from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator import evaluate
from service.estimator.errors import InvalidLayout
from service.estimator.estimate import estimate
from service.estimator.job import make_job
from service.estimator.types import ClusterSpec, Framework, Layout, Recompute, TrainingSpec
from service.estimator.validate import validate_layout
from service.recommender import Constraints, recommend

GiB = 2**30
GPU = "h100-sxm-80gb"


def _cluster(name: str, nodes: int) -> ClusterSpec:
    g = gpu(name)
    return ClusterSpec(
        gpu=g,
        num_nodes=nodes,
        gpus_per_node=8,
        intra_node_bandwidth_bytes_per_s=g.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=50e9,
        cpu_memory_bytes_per_node=2 * 2**40,
    )


def _summary(times: list[float]) -> dict[str, float]:
    return {"best": min(times), "median": statistics.median(times)}


def full_search(preset: str, nodes: int, seq: int, batch: int, repeats: int) -> dict[str, Any]:
    tuning = default_tuning()
    spec, cluster = model(preset).spec, _cluster(GPU, nodes)
    training = TrainingSpec(seq_len=seq, global_batch_size=batch)
    recommend(spec, cluster, training, Constraints(), tuning)  # imports, catalog parsing, lru_caches
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = recommend(spec, cluster, training, Constraints(), tuning)
        times.append(time.perf_counter() - started)
    assert result.recommended is not None and result.recommended.estimate.time is not None
    s = _summary(times)
    return {
        "job": f"{preset} on {cluster.world_size} x {GPU}, seq {seq}, global batch {batch}",
        "repeats": repeats,
        "best_s": s["best"],
        "median_s": s["median"],
        "candidates_timed": result.search.candidates_evaluated,
        "families": result.search.families_considered,
        "memory_evaluations": result.search.memory_evaluations,
        "full_estimates": result.search.full_estimates,
        "truncated": result.search.truncated,
        "recommended": str(result.recommended.layout),
        "tokens_per_s": result.recommended.estimate.time.tokens_per_s,
    }


# ---------------------------------------------------------------- layouts per second

# The layouts both tools evaluate: Llama-2-7B on 8 H100-80GB, seq 4096, global batch 256 (the 7B
# search's job), DeepSpeed ZeRO 0-3 (0-1 with pp > 1) x tp x pp x recompute x micro-batch, SP on
# with tp > 1 (llm-analysis' default sp_size = tp_size). Only layouts our validator accepts.
LA_MODEL, SEQ, GLOBAL_BATCH, GPUS = "llama-2-7b", 4096, 256, 8
LA_RECOMPUTE = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}  # ActivationRecomputation


def comparison_layouts() -> list[Layout]:
    spec, cluster = model(LA_MODEL).spec, _cluster(GPU, 1)
    training = TrainingSpec(seq_len=SEQ, global_batch_size=GLOBAL_BATCH)
    out = []
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4):
            if tp * pp > GPUS:
                continue
            for zero in (0, 1, 2, 3):
                for recompute in Recompute:
                    for b in (1, 2, 4, 8):
                        layout = Layout(
                            framework=Framework.DEEPSPEED,
                            dp=GPUS // (tp * pp),
                            tp=tp,
                            pp=pp,
                            zero_stage=zero,
                            recompute=recompute,
                            micro_batch_size=b,
                            sequence_parallel=tp > 1,
                        )
                        try:
                            validate_layout(spec, cluster, layout, training)
                        except InvalidLayout:
                            continue
                        out.append(layout)
    return out


class _Ours:
    """Rounds of our evaluation of the comparison layouts, a fresh estimator ``Job`` per round (its
    memos only help within a round, as within one search), two ways:

    * numbers (what the search uses to decide fit and rank): ``evaluate.memory_numbers`` (per-GPU
      total, host and NVMe bytes per node) + ``evaluate.step_numbers`` (step time, tokens/s);
    * objects: ``evaluate.memory_estimate`` + ``evaluate.time_estimate``, the full
      ``MemoryEstimate`` / ``TimeEstimate`` with breakdowns.

    Both are the estimator's own sums (``estimate()`` reports the objects); ``estimate()`` itself,
    with its validation, notes and warnings, is timed too."""

    def __init__(self, layouts: list[Layout]) -> None:
        self.layouts = layouts
        self.tuning = default_tuning()
        self.spec, self.cluster = model(LA_MODEL).spec, _cluster(GPU, 1)
        self.training = TrainingSpec(seq_len=SEQ, global_batch_size=GLOBAL_BATCH)

    def numbers_round(self) -> float:
        started = time.perf_counter()
        job = make_job(self.spec, self.cluster, self.training, self.tuning)
        for layout in self.layouts:
            evaluate.memory_numbers(job, layout)
            evaluate.step_numbers(job, layout)
        return len(self.layouts) / (time.perf_counter() - started)

    def objects_round(self) -> float:
        started = time.perf_counter()
        job = make_job(self.spec, self.cluster, self.training, self.tuning)
        for layout in self.layouts:
            evaluate.memory_estimate(job, layout)
            evaluate.time_estimate(job, layout)
        return len(self.layouts) / (time.perf_counter() - started)

    def estimate_round(self) -> float:
        started = time.perf_counter()
        for layout in self.layouts:
            estimate(self.spec, self.cluster, layout, self.training, tuning=self.tuning, with_limits=False)
        return len(self.layouts) / (time.perf_counter() - started)


def _rates(rates: list[float], prefix: str = "") -> dict[str, float]:
    return {f"{prefix}best_per_s": max(rates), f"{prefix}median_per_s": statistics.median(rates)}


# Runs inside the llm-analysis interpreter: argv[1] = JSON {layouts, sample}. Reads commands on stdin,
# one per line: "round" times one pass over the layouts and prints its rate; "sample" prints the memory
# sample; so its rounds interleave with ours and both see the machine in the same phase.
LLM_ANALYSIS_SNIPPET = r"""
import json, logging, sys, time
logging.disable(logging.CRITICAL)
from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
from llm_analysis.config import (ParallelismConfig, get_dtype_config_by_name, get_gpu_config_by_name,
                                 get_model_config_by_name)
job = json.loads(sys.argv[1])
model = get_model_config_by_name("NousResearch_Llama-2-7b-hf")  # its own Llama-2-7B entry
gpu = get_gpu_config_by_name(job["gpu"])
dtype = get_dtype_config_by_name("w16a16e16")  # bf16 weights / activations, fp32 master + Adam

def run(layout):
    dp, tp, pp, zero, recompute, b = layout
    analysis = LLMAnalysis(model, gpu, dtype, ParallelismConfig(tp_size=tp, pp_size=pp, dp_size=dp))
    return analysis.training(batch_size_per_gpu=b, seq_len=job["seq"], global_batch_size=job["batch"],
                             activation_recomputation=ActivationRecomputation(recompute),
                             ds_zero=DSZeRO(zero), output_dir=None)

keys = ("weight_memory_per_gpu", "gradient_memory_per_gpu", "optimizer_state_memory_per_gpu",
        "activation_memory_per_gpu", "memory_left_per_gpu", "latency_per_iter")
print(json.dumps({"ready": True}), flush=True)
for command in sys.stdin:
    if command.strip() == "round":
        started = time.perf_counter()
        for layout in job["layouts"]:
            run(layout)
        print(json.dumps({"rate": len(job["layouts"]) / (time.perf_counter() - started)}), flush=True)
    elif command.strip() == "sample":
        sample = [{k: run(layout)[k] for k in keys} for layout in job["sample"]]
        print(json.dumps({"sample": sample, "capacity_bytes": gpu.mem_per_GPU_in_GB * 1024**3}), flush=True)
    else:
        break
"""


def _la_tuple(layout: Layout) -> list[int]:
    return [
        layout.dp,
        layout.tp,
        layout.pp,
        layout.zero_stage,
        LA_RECOMPUTE[layout.recompute],
        layout.micro_batch_size,
    ]


# A few layouts whose memory per GPU both tools report side by side.
SAMPLE = [
    # (tp, pp, zero, recompute, micro-batch)
    (1, 1, 1, Recompute.NONE, 1),
    (1, 1, 3, Recompute.SELECTIVE, 2),
    (2, 1, 1, Recompute.SELECTIVE, 4),
    (1, 4, 1, Recompute.FULL, 8),
    (8, 1, 0, Recompute.NONE, 8),
]


def _sample_layouts(layouts: list[Layout]) -> list[Layout]:
    wanted = set(SAMPLE)
    return [
        layout
        for layout in layouts
        if (layout.tp, layout.pp, layout.zero_stage, layout.recompute, layout.micro_batch_size) in wanted
    ]


def compare(layouts: list[Layout], rounds: int, python: str | None) -> dict[str, Any]:
    """Layouts per second, ours and (given its Python) llm-analysis', in interleaved rounds.

    Each round runs ours (numbers, objects) and then one llm-analysis round in its subprocess, so the
    two are timed seconds apart, in the same phase of a shared machine whose speed drifts; the
    speed-up is the median (and the worst) of the per-round ratios."""
    ours = _Ours(layouts)
    numbers: list[float] = []
    objects: list[float] = []
    theirs: list[float] = []
    proc = None
    if python:
        sample = _sample_layouts(layouts)
        job = {
            "gpu": GPU,
            "seq": SEQ,
            "batch": GLOBAL_BATCH,
            "layouts": [_la_tuple(layout) for layout in layouts],
            "sample": [_la_tuple(layout) for layout in sample],
        }
        proc = subprocess.Popen(
            [python, "-c", LLM_ANALYSIS_SNIPPET, json.dumps(job)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        _ask(proc, None)  # imports done
        _ask(proc, "round")  # warm-up, as ours warms up in the searches before
    try:
        for _ in range(rounds):
            numbers.append(ours.numbers_round())
            objects.append(ours.objects_round())
            if proc is not None:
                theirs.append(_ask(proc, "round")["rate"])
        report: dict[str, Any] = {"ours": {"layouts": len(layouts), "rounds": rounds}}
        report["ours"] |= _rates(numbers, "numbers_") | _rates(objects, "objects_")
        report["ours"] |= _rates([ours.estimate_round() for _ in range(2)], "estimate_")
        if proc is not None:
            answer = _ask(proc, "sample")
            report["llm_analysis"] = {"layouts": len(layouts), "rounds": rounds} | _rates(theirs)
            report["llm_analysis"]["memory_sample"] = _memory_sample(
                _sample_layouts(layouts), answer["sample"], answer["capacity_bytes"]
            )
            for what, mine in (("numbers", numbers), ("objects", objects)):
                ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
                report[f"speedup_{what}_median"] = statistics.median(ratios)
                report[f"speedup_{what}_worst"] = min(ratios)
        return report
    finally:
        if proc is not None:
            proc.communicate("quit\n", timeout=60)


def _ask(proc: subprocess.Popen[str], command: str | None) -> dict[str, Any]:
    """Send one command to the llm-analysis subprocess and read its one-line JSON answer."""
    assert proc.stdin is not None and proc.stdout is not None
    if command is not None:
        proc.stdin.write(command + "\n")
        proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"llm-analysis subprocess ended (exit {proc.wait()}) on {command!r}")
    answer: dict[str, Any] = json.loads(line)
    return answer


def _memory_sample(
    sample: list[Layout], theirs: list[dict[str, float]], capacity_bytes: float
) -> list[dict[str, Any]]:
    tuning = default_tuning()
    spec, cluster = model(LA_MODEL).spec, _cluster(GPU, 1)
    training = TrainingSpec(seq_len=SEQ, global_batch_size=GLOBAL_BATCH)
    job = make_job(spec, cluster, training, tuning)
    rows = []
    for layout, la in zip(sample, theirs, strict=True):
        ours = evaluate.memory_estimate(job, layout).per_gpu
        rows.append(
            {
                "layout": f"dp={layout.dp} tp={layout.tp} pp={layout.pp} zero={layout.zero_stage} "
                f"recompute={layout.recompute.value} b={layout.micro_batch_size}",
                "ours_gib": {
                    "parameters": ours.parameters / GiB,
                    "gradients": ours.gradients / GiB,
                    "optimizer_states": ours.optimizer_states / GiB,
                    "activations": ours.activations / GiB,
                    "buffers_and_overhead": (ours.buffers + ours.overhead) / GiB,
                    "total": ours.total / GiB,
                },
                "llm_analysis_gib": {
                    "parameters": la["weight_memory_per_gpu"] / GiB,
                    "gradients": la["gradient_memory_per_gpu"] / GiB,
                    "optimizer_states": la["optimizer_state_memory_per_gpu"] / GiB,
                    "activations": la["activation_memory_per_gpu"] / GiB,
                    "total": (capacity_bytes - la["memory_left_per_gpu"]) / GiB,
                },
            }
        )
    return rows


# ---------------------------------------------------------------- report


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "load_average_1min_at_start": os.getloadavg()[0],
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm-analysis", default=None, help="a Python with llm-analysis==0.2.2 installed")
    parser.add_argument("--json", default=None, help="write the report here as JSON")
    parser.add_argument("--repeats", type=int, default=21, help="repeats of the 7B search (405B: a third)")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "machine": _machine(),
        "search_7b_8_h100": full_search("llama-2-7b", 1, 4096, 256, repeats=args.repeats),
        "search_405b_16384_h100": full_search(
            "llama-3.1-405b", 2048, 8192, 2048, repeats=max(3, args.repeats // 3)
        ),
    }
    report |= compare(comparison_layouts(), rounds=15, python=args.llm_analysis)
    report["machine"]["load_average_1min_at_end"] = os.getloadavg()[0]
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if args.llm_analysis and report["speedup_numbers_median"] < 10:
        print(f"speed-up {report['speedup_numbers_median']:.1f}x < 10x (issue 4)", file=sys.stderr)


if __name__ == "__main__":
    main()
