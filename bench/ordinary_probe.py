"""A randomized probe of ordinary requests: plans, estimates and capacity over presets, GPU types,
methods (full, LoRA, QLoRA), frameworks, launchers and odd values, through the API in-process.

Not a test (it times answers, and the machine is noisy): it reports every 5xx, every 422 whose
request a user would expect answered (a 422 on a request the probe deliberately made wrong is
expected and not reported), and every answer slower than ``--slow`` seconds.

    PYTHONPATH=. .venv/bin/python -m bench.ordinary_probe [--n 500] [--seed 0] [--slow 10]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import tempfile
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GPUS = [
    "h100-sxm-80gb", "h100-pcie-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "a100-sxm-40gb",
    "a100-sxm-80gb", "l40s-48gb", "rtx-4090-24gb", "mi300x-192gb", "v100-sxm2-32gb", "l4-24gb",
    "a10g-24gb", "l40-48gb",
]  # fmt: skip
# the same GPUs as users write them: published names, nvidia-smi's, words only one part carries
GPU_SPELLINGS = ["H100 SXM5 80GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "4090", "MI300X",
                 "Tesla T4", "NVIDIA L40S"]  # fmt: skip
PRESET_SPELLINGS = ["meta-llama/Llama-3.1-8B", "Llama 3.2 1B", "Qwen/Qwen2.5-7B", "mistralai/Mistral-7B-v0.1"]
METHODS = ["full", "lora", "qlora"]
FRAMEWORKS = [None, ["fsdp"], ["deepspeed"], ["megatron"], ["fsdp", "deepspeed"]]
LAUNCHERS = [None, ["slurm"], ["kubernetes"], ["accelerate"], ["slurm", "accelerate"], ["torchtitan"],
             ["deepspeed", "hf_trainer"]]  # fmt: skip
PRECISIONS = [None, None, "bf16", "fp16", "fp8", "tf32", "bfloat16", "float16"]
SEQS = [1, 7, 128, 512, 2048, 4096, 8192, 32768]
BATCHES = [1, 3, 8, 64, 256, 1000]
OBJECTIVES = [None, "throughput", "fewest_gpus", "cost", "time_to_train"]
# custom models a user pastes from a Hugging Face config.json: a ~85M-parameter Llama, odd head
# counts, a tiny MoE
HF_CONFIGS = [
    {"model_type": "llama", "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
     "num_attention_heads": 12, "num_key_value_heads": 12, "vocab_size": 32000},
    {"model_type": "llama", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 7,
     "num_attention_heads": 7, "num_key_value_heads": 1, "vocab_size": 151936},
    {"model_type": "mixtral", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
     "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 32000, "num_local_experts": 4,
     "num_experts_per_tok": 2},
]  # fmt: skip


def client() -> Any:
    from alembic import command
    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings
    from tests.conftest import alembic_config

    url = f"sqlite:///{tempfile.mkdtemp()}/probe.db"
    command.upgrade(alembic_config(url), "head")
    app = create_app(Settings(database_url=url, max_body_bytes=256 * 1024))
    return TestClient(app, raise_server_exceptions=False).__enter__()


def training(rng: random.Random, priced: bool) -> dict[str, Any]:
    t: dict[str, Any] = {"seq_len": rng.choice(SEQS), "global_batch_size": rng.choice(BATCHES)}
    t["method"] = rng.choice(METHODS)
    if (precision := rng.choice(PRECISIONS)) is not None:
        t["precision"] = precision
    if priced or rng.random() < 0.3:
        t["tokens"] = rng.choice([10**8, 10**10, 10**12])
    return t


def cluster(rng: random.Random) -> dict[str, Any]:
    nodes = rng.choice([1, 1, 1, 2, 4])
    c: dict[str, Any] = {
        "gpu": rng.choice(GPUS) if rng.random() < 0.8 else rng.choice(GPU_SPELLINGS),
        "num_nodes": nodes,
        "gpus_per_node": rng.choice([1, 2, 4, 8]),
    }
    if nodes > 1:
        c["inter_node_bandwidth_bytes_per_s"] = rng.choice([12.5e9, 25e9, 50e9])
    if rng.random() < 0.15:  # the node and network left to the catalog (an SXM part has them)
        c = {"gpu": rng.choice(["h100-sxm-80gb", "a100-sxm-80gb", "b200", "NVIDIA H200"])}
        if rng.random() < 0.5:
            c["num_nodes"] = rng.choice([2, 4])
    return c


def request(rng: random.Random, presets: list[str]) -> tuple[str, dict[str, Any]]:
    kind = rng.choice(["plan", "plan", "estimate", "capacity"])
    model: dict[str, Any] = {"preset": rng.choice(presets if rng.random() < 0.85 else PRESET_SPELLINGS)}
    if rng.random() < 0.15:
        model = {"hf_config": rng.choice(HF_CONFIGS)}
    price = rng.random() < 0.3
    if kind == "capacity":
        body: dict[str, Any] = {"model": model, "training": training(rng, price), "gpus": rng.sample(GPUS, 2)}
        if price:
            body["gpu_hour_cost"] = 2.0
        if (fw := rng.choice(FRAMEWORKS)) is not None:
            body["constraints"] = {"frameworks": fw}
        return "/v1/capacity", body
    body = {"model": model, "cluster": cluster(rng), "training": training(rng, price)}
    if kind == "estimate":
        framework = rng.choice(["fsdp", "deepspeed", "megatron"])
        layout: dict[str, Any] = {"framework": framework}
        layout["zero_stage"] = {"fsdp": 3, "deepspeed": rng.choice([0, 1, 2, 3]), "megatron": 1}[framework]
        if framework == "megatron" and rng.random() < 0.5:
            layout["tp"] = rng.choice([1, 2])
        body["layout"] = layout
        if price:
            body["gpu_hour_cost"] = 1.5
        return "/v1/estimates", body
    constraints: dict[str, Any] = {}
    if (fw := rng.choice(FRAMEWORKS)) is not None:
        constraints["frameworks"] = fw
    if (objective := rng.choice(OBJECTIVES)) is not None:
        constraints["objective"] = objective
    if price:
        constraints["gpu_hour_cost"] = 3.0
    if constraints:
        body["constraints"] = constraints
    if (launchers := rng.choice(LAUNCHERS)) is not None:
        body["launchers"] = launchers
    return "/v1/plans", body


# 422s a user who sent such a request would expect: the probe draws these on purpose
EXPECTED_422 = (
    "no framework runs",
    "frameworks that run it",
    "does not support",  # the GPU lacks the precision (fp8 on an A100, bf16 on a V100)
    "support (no",  # the same refusal as worded now: "a100-sxm-80gb has no fp8 support (no fp8 peak ..."
    "needs PEFT adapters",  # an estimate drawn with Megatron-LM and LoRA/QLoRA
    "does not divide the cluster's",  # an estimate drawn with tp 2 on a node of one GPU
    "% tp (",  # tp 2 drawn for a model of 7 heads
    "trained data-parallel only",  # tp 2 drawn for BERT
    "too large to plan",
    "world size",
    "global_batch_size",
    "not used",  # a price without tokens
    "none of the requested launchers",
    "no launcher",
    "learned position table",  # a sequence past GPT-2's, BERT's, GPT-3's rows: the run fails at once
    "never fp8",  # qlora drawn with fp8: bitsandbytes' NF4 layers compute in 16 or 32 bits
    "huggingface/peft#3080",  # qlora on fsdp with adapters on fused experts: the step fails there
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slow", type=float, default=10.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    presets = list(tomllib.loads((ROOT / "service/catalog/models.toml").read_text()))
    rng = random.Random(args.seed)
    api = client()
    statuses: Counter[int] = Counter()
    refusals: Counter[str] = Counter()  # every 422 by its detail, digits folded: what to read first
    slowest: list[tuple[float, str, dict[str, Any]]] = []
    findings: list[dict[str, Any]] = []
    for _ in range(args.n):
        path, body = request(rng, presets)
        started = time.perf_counter()
        response = api.post(path, json=body)
        seconds = time.perf_counter() - started
        statuses[response.status_code] += 1
        detail = response.json().get("detail", "") if response.status_code >= 400 else ""
        if response.status_code == 422:
            refusals[f"{path} " + re.sub(r"\d+(\.\d+)?", "N", str(detail))[:120]] += 1
        slowest = sorted([*slowest, (seconds, path, body)], key=lambda t: -t[0])[:5]
        why = None
        if response.status_code >= 500:
            why = "5xx"
        elif response.status_code == 422 and not any(words in str(detail) for words in EXPECTED_422):
            why = "422"
        elif seconds > args.slow:
            why = "slow"
        if why is not None:
            findings.append({"why": why, "path": path, "status": response.status_code, "s": round(seconds, 2),
                             "detail": str(detail)[:300], "body": body})  # fmt: skip
    print(json.dumps({"statuses": dict(statuses), "findings": len(findings)}))
    for text, count in refusals.most_common():
        print(f"422 x{count}: {text}")
    for seconds, path, body in slowest:
        print(f"slowest {seconds:.2f} s {path} {json.dumps(body)}")
    for finding in findings:
        print(json.dumps(finding))
    if args.json is not None:
        args.json.write_text(json.dumps({"statuses": dict(statuses), "findings": findings}, indent=1) + "\n")


if __name__ == "__main__":
    main()
