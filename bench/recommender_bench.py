"""Recommender speed: full searches, and layouts evaluated per second against llm-analysis.

Run: ``.venv/bin/python -m bench.recommender_bench`` (add ``--llm-analysis PYTHON`` to compare with
llm-analysis installed in another interpreter, e.g. ``.bench-venv/bin/python``). Numbers go to
stdout and, as JSON, to ``--json PATH``. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from service.catalog.efficiency import default_efficiency
from service.catalog.gpus import gpu
from service.catalog.models import model
from service.estimator.types import ClusterSpec, Framework, Layout, Recompute, TrainingSpec
from service.recommender import Constraints, recommend
from service.recommender.fast import Evaluator


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


def full_search(preset: str, nodes: int, seq: int, batch: int, repeats: int = 3) -> dict[str, Any]:
    curve = default_efficiency()
    spec, cluster = model(preset).spec, _cluster("h100-sxm-80gb", nodes)
    training = TrainingSpec(seq_len=seq, global_batch_size=batch)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = recommend(spec, cluster, training, Constraints(), curve)
        times.append(time.perf_counter() - started)
    assert result.recommended is not None
    return {
        "job": f"{preset} on {cluster.world_size} x h100-sxm-80gb, seq {seq}, batch {batch}",
        "best_s": min(times),
        "median_s": sorted(times)[len(times) // 2],
        "candidates_timed": result.search.candidates_evaluated,
        "families": result.search.families_considered,
        "memory_evaluations": result.search.memory_evaluations,
        "full_estimates": result.search.full_estimates,
        "truncated": result.search.truncated,
        "recommended": str(result.recommended.layout),
        "tokens_per_s": result.recommended.estimate.time.tokens_per_s
        if result.recommended.estimate.time
        else None,
    }


# The configurations both tools evaluate: Llama-2-7B shapes on 8 A100-80GB, tp x pp x b x recompute.
CONFIGS = [
    (tp, pp, b, recompute)
    for tp in (1, 2, 4, 8)
    for pp in (1, 2, 4)
    for b in (1, 2, 4)
    for recompute in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    if tp * pp <= 8
]


def ours_per_s(rounds: int = 5) -> float:
    curve = default_efficiency()
    spec, cluster = model("llama-2-7b").spec, _cluster("a100-sxm-80gb", 1)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    evaluator = Evaluator(spec, cluster, training, curve)
    started, n = time.perf_counter(), 0
    for _ in range(rounds):
        for tp, pp, b, recompute in CONFIGS:
            layout = Layout(
                framework=Framework.MEGATRON,
                dp=8 // (tp * pp),
                tp=tp,
                pp=pp,
                micro_batch_size=b,
                recompute=recompute,
                sequence_parallel=tp > 1,
                zero_stage=1,
            )
            evaluator.memory(layout)
            evaluator.time(layout)
            n += 1
    return n / (time.perf_counter() - started)


LLM_ANALYSIS_SNIPPET = r"""
import sys, time, logging, json
logging.disable(logging.CRITICAL)
from llm_analysis.analysis import LLMAnalysis
from llm_analysis.config import ModelConfig, ParallelismConfig
from llm_analysis.config import get_dtype_config_by_name, get_gpu_config_by_name
configs = json.loads(sys.argv[1])
model = ModelConfig(name="llama-2-7b", num_layers=32, n_head=32, hidden_dim=4096, vocab_size=32000,
                    max_seq_len=4096, ffn_embed_dim=11008, mlp_gated_linear_units=True)
gpu = get_gpu_config_by_name("a100-sxm-80gb")
dtype = get_dtype_config_by_name("w16a16e16")
n = 0
started = time.perf_counter()
for tp, pp, b, recompute in configs * 5:
    par = ParallelismConfig(tp_size=tp, pp_size=pp, dp_size=8 // (tp * pp))
    analysis = LLMAnalysis(model, gpu, dtype, par)
    analysis.training(batch_size_per_gpu=b, seq_len=4096, global_batch_size=64,
                      activation_recomputation={"none": 0, "selective": 1, "full": 4}[recompute],
                      ds_zero=1, output_dir=None)
    n += 1
print(n / (time.perf_counter() - started))
"""


def llm_analysis_per_s(python: str) -> float | None:
    configs = [(tp, pp, b, r.value) for tp, pp, b, r in CONFIGS]
    done = subprocess.run(
        [python, "-c", LLM_ANALYSIS_SNIPPET, json.dumps(configs)], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        return None
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llm-analysis", default=None, help="python with llm-analysis installed")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "405b_16384_h100": full_search("llama-3.1-405b", 2048, 8192, 2048),
        "7b_8_h100": full_search("llama-2-7b", 1, 4096, 256, repeats=5),
        "ours_layouts_per_s": ours_per_s(),
    }
    if args.llm_analysis:
        theirs = llm_analysis_per_s(args.llm_analysis)
        report["llm_analysis_layouts_per_s"] = theirs
        if theirs:
            report["speedup"] = report["ours_layouts_per_s"] / theirs
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
