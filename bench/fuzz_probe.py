"""A systematic probe of ordinary (and a few absurd) requests through the API in-process, with the
checks a user would make of each answer. Not a test: it times answers (CPU seconds of the process
per request) and the machine is noisy.

Groups: ``grid`` (every preset x a spread of catalog GPUs, old ones too, x method x framework, no
optional field), ``infeasible`` (models too big for their cluster), ``combos`` (LoRA/QLoRA with
expert parallelism under ZeRO-3/FSDP, custom GPUs, custom architectures), ``extreme`` (valid edges:
seq_len 1 and 1M, batch 1 and huge, 1 and 100k GPUs, huge token counts), ``absurd`` (must be 4xx
problem+json naming the field), ``cli`` (the CLI's JSON against the API's for the same request).

    PYTHONPATH=. .venv/bin/python -m bench.fuzz_probe [--groups grid,infeasible,...] [--json out.json]

Prints the totals (requests, statuses), the findings, and the ten slowest requests with bodies.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import random
import re
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GPUS_SPREAD = [
    "h100-sxm-80gb",
    "a100-sxm-40gb",
    "v100-sxm2-16gb",
    "v100-sxm2-32gb",
    "a10-24gb",
    "l4-24gb",
    "l40s-48gb",
    "rtx-3090-24gb",
    "mi250x-128gb",
    "mi300x-192gb",
    "b200-sxm-180gb",
    "a100-pcie-40gb",
]
METHODS = ("full", "lora", "qlora")
FRAMEWORKS = (None, "fsdp", "deepspeed", "megatron")
SLOW_CPU_S = 2.0
# refusals the service makes by design (tests/api/test_ordinary_requests.py and the contract): a
# framework or launcher that cannot run the method or model at all, a GPU not in the catalog. (A custom
# GPU without its intra-node bandwidth was one; it now takes its PCIe link: OLD_CUSTOM_GPU below.)
DESIGN_422 = (
    "no requested framework can run",
    "unknown gpu",
)

Req = tuple[str, str, dict[str, Any], str]  # (group, path, body, what is expected: ok | 4xx | any)


def presets() -> list[str]:
    return list(tomllib.loads((ROOT / "service/catalog/models.toml").read_text()))


def _cluster(gpu: Any, gpus: int, per_node: int = 8) -> dict[str, Any]:
    nodes = max(1, gpus // per_node) if gpus >= per_node else 1
    c: dict[str, Any] = {"gpu": gpu, "num_nodes": nodes, "gpus_per_node": gpus if nodes == 1 else per_node}
    if nodes > 1:
        c["inter_node_bandwidth_bytes_per_s"] = 50e9
    return c


def _within_positions(preset: str, seq: int) -> int:
    """``seq``, or the rows of the preset's learned position table where it has fewer (GPT-2, BERT,
    GPT-3: past them the request is refused, as it should be)."""
    from service.catalog.models import model
    from service.estimator.validate import learned_positions

    rows = learned_positions(model(preset).spec)
    return seq if rows is None else min(seq, rows)


def grid(rng: random.Random) -> Iterator[Req]:
    for i, preset in enumerate(presets()):
        for j, gpu in enumerate(GPUS_SPREAD):
            if (i + j) % 3:  # a third of the pairs, every preset and every GPU still seen
                continue
            method = METHODS[(i + j) % 3]
            framework = FRAMEWORKS[(i * 7 + j) % 4]
            gpus = (1, 2, 8, 16)[(i + 2 * j) % 4]
            body: dict[str, Any] = {
                "model": {"preset": preset},
                "cluster": _cluster(gpu, gpus),
                "training": {
                    "seq_len": _within_positions(preset, (1024, 2048, 4096)[j % 3]),
                    "global_batch_size": 16,
                    "method": method,
                },
            }
            if framework is not None:
                body["constraints"] = {"frameworks": [framework]}
            yield "grid", "/v1/plans", body, "ok"


def infeasible(rng: random.Random) -> Iterator[Req]:
    cases = [
        ("llama-3.1-405b", "rtx-4090-24gb", 1, "full"),
        ("llama-3.1-405b", "rtx-4090-24gb", 1, "qlora"),
        ("deepseek-v3", "l4-24gb", 2, "qlora"),
        ("deepseek-v3", "h100-sxm-80gb", 8, "full"),
        ("gpt-3-175b", "v100-sxm2-16gb", 8, "full"),
        ("bloom-176b", "a10-24gb", 4, "lora"),
        ("llama-3-70b", "t4", 1, "qlora"),
        ("llama-3-70b", "v100-sxm2-16gb", 1, "qlora"),
        ("qwen3-235b-a22b", "l40s-48gb", 4, "qlora"),
        ("llama-4-maverick-17b-128e", "a100-sxm-40gb", 8, "lora"),
        ("mixtral-8x7b", "rtx-3090-24gb", 1, "qlora"),
        ("llama-3.1-70b", "mi250x-128gb", 1, "full"),
    ]
    for preset, gpu, gpus, method in cases:
        seq = 2048 if preset == "gpt-3-175b" else 4096  # GPT-3's learned positions: 2,048 rows
        for extra in (
            {},
            {"constraints": {"frameworks": ["megatron"]}},
            {"launchers": ["slurm", "kubernetes"]},
            {"constraints": {"objective": "fewest_gpus", "max_gpus": 4}},
            {"training_more": {"tokens": 10**12}, "constraints": {"gpu_hour_cost": 2.5}},
        ):
            body: dict[str, Any] = {
                "model": {"preset": preset},
                "cluster": _cluster(gpu, gpus),
                "training": {"seq_len": seq, "global_batch_size": 64, "method": method},
            }
            extra = copy.deepcopy(extra)
            body["training"].update(extra.pop("training_more", {}))
            body.update(extra)
            yield "infeasible", "/v1/plans", body, "ok"
        yield (
            "infeasible",
            "/v1/capacity",
            {
                "model": {"preset": preset},
                "training": {"seq_len": seq, "global_batch_size": 64, "method": method},
            },
            "ok",
        )


CUSTOM_GPU = {
    "name": "my-card",
    "memory_bytes": 48 * 2**30,
    "peak_flops_per_s": {"fp32": 40e12, "tf32": 150e12, "bf16": 300e12, "fp16": 300e12, "fp8": 600e12},
    "hbm_bandwidth_bytes_per_s": 2.0e12,
    "intra_node_bandwidth_bytes_per_s": 100e9,
    "pcie_bandwidth_bytes_per_s": 32e9,
}
OLD_CUSTOM_GPU = {  # a T4-like card with no bf16, no tf32, no fp8, nor its intra-node link (its PCIe then)
    "name": "t4-like",
    "memory_bytes": 16 * 2**30,
    "peak_flops_per_s": {"fp32": 8.1e12, "fp16": 65e12},
    "hbm_bandwidth_bytes_per_s": 320e9,
    "pcie_bandwidth_bytes_per_s": 16e9,
}
ARCHS = [
    {
        "num_layers": 12,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "num_kv_heads": 12,
        "ffn_hidden_size": 3072,
        "vocab_size": 50257,
        "mlp": "gelu",
        "norm": "layernorm",
        "tied_embeddings": True,
        "qkv_bias": True,
    },
    {
        "num_layers": 24,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_kv_heads": 4,
        "ffn_hidden_size": 5632,
        "vocab_size": 32000,
        "mlp": "swiglu",
        "norm": "rmsnorm",
    },
    {
        "num_layers": 16,
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_kv_heads": 8,
        "ffn_hidden_size": 1024,
        "vocab_size": 32000,
        "mlp": "swiglu",
        "norm": "rmsnorm",
        "moe": {"num_experts": 64, "top_k": 6, "expert_ffn_hidden_size": 1024},
    },
    {
        "num_layers": 1,
        "hidden_size": 64,
        "num_attention_heads": 1,
        "num_kv_heads": 1,
        "ffn_hidden_size": 128,
        "vocab_size": 2,
        "mlp": "gelu",
        "norm": "layernorm",
    },
    {
        "num_layers": 7,
        "hidden_size": 1000,
        "num_attention_heads": 10,
        "num_kv_heads": 5,
        "ffn_hidden_size": 3001,
        "vocab_size": 30001,
        "mlp": "swiglu",
        "norm": "rmsnorm",
    },
]


def combos(rng: random.Random) -> Iterator[Req]:
    moe = ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "gpt-oss-20b", "llama-4-scout-17b-16e"]
    for preset in moe:
        for method in METHODS:
            for framework, zero in (("fsdp", 3), ("deepspeed", 3), ("deepspeed", 2), ("megatron", 1)):
                for ep in (2, 4, 8):
                    body = {
                        "model": {"preset": preset},
                        "cluster": _cluster("h100-sxm-80gb", 8),
                        "training": {"seq_len": 2048, "global_batch_size": 32, "method": method},
                        "layout": {"framework": framework, "zero_stage": zero, "ep": ep},
                    }
                    yield "combos", "/v1/estimates", body, "ok_or_named_422"
        for method in METHODS:
            yield (
                "combos",
                "/v1/plans",
                {
                    "model": {"preset": preset},
                    "cluster": _cluster("h100-sxm-80gb", 16),
                    "training": {"seq_len": 2048, "global_batch_size": 64, "method": method},
                    "constraints": {"frameworks": [rng.choice(["fsdp", "deepspeed"])]},
                },
                "ok",
            )
    for gpu in (CUSTOM_GPU, OLD_CUSTOM_GPU, {**CUSTOM_GPU, "chip": "gh100"}):
        for preset in ("llama-3-8b", "qwen2.5-0.5b", "mixtral-8x7b", "gemma-2-9b"):
            for method in METHODS:
                yield (
                    "combos",
                    "/v1/plans",
                    {
                        "model": {"preset": preset},
                        "cluster": _cluster(gpu, 8),
                        "training": {"seq_len": 2048, "global_batch_size": 16, "method": method},
                    },
                    "ok",
                )
            yield (
                "combos",
                "/v1/estimates",
                {
                    "model": {"preset": preset},
                    "cluster": _cluster(gpu, 4),
                    "training": {"seq_len": 2048, "global_batch_size": 16},
                    "layout": {"framework": "fsdp", "zero_stage": 3},
                },
                "ok_or_named_422",
            )
        yield (
            "combos",
            "/v1/capacity",
            {
                "model": {"preset": "llama-3-8b"},
                "training": {"seq_len": 2048, "global_batch_size": 16},
                "gpus": ["h100-sxm-80gb"],
            },
            "ok",
        )
    for arch in ARCHS:
        for method in METHODS:
            for gpu_name in ("a100-sxm-80gb", "l4-24gb", "v100-sxm2-32gb"):
                yield (
                    "combos",
                    "/v1/plans",
                    {
                        "model": {"architecture": arch},
                        "cluster": _cluster(gpu_name, 4),
                        "training": {"seq_len": 1024, "global_batch_size": 8, "method": method},
                    },
                    "ok",
                )
        yield "combos", "/v1/models/resolve", {"model": {"architecture": arch}}, "ok"
        yield (
            "combos",
            "/v1/estimates",
            {
                "model": {"architecture": arch},
                "cluster": _cluster("h100-sxm-80gb", 8),
                "training": {"seq_len": 1024, "global_batch_size": 8},
                "layout": {"framework": "megatron", "tp": 2, "zero_stage": 1},
            },
            "ok_or_named_422",
        )


def extreme(rng: random.Random) -> Iterator[Req]:
    base_models = [
        "llama-3-8b",
        "qwen2.5-0.5b",
        "mixtral-8x7b",
        "deepseek-v3",
        "gpt2",
        "bert-base-uncased",
        "llama-3.1-405b",
        "gemma-3-27b",
    ]
    for preset in base_models:
        for seq, batch in ((1, 1), (1, 10**6), (2**20, 1), (2**20, 8), (131072, 64), (4096, 10**7), (3, 5)):
            for gpus in (1, 8, 1024, 100_000):
                if rng.random() < 0.45:
                    continue
                for method in METHODS:
                    if rng.random() < 0.5:
                        continue
                    body: dict[str, Any] = {
                        "model": {"preset": preset},
                        "cluster": _cluster("h100-sxm-80gb", gpus),
                        "training": {"seq_len": seq, "global_batch_size": batch, "method": method},
                    }
                    if rng.random() < 0.3:
                        body["training"]["tokens"] = rng.choice([10**15, 10**18, 1])
                    if rng.random() < 0.3:
                        body["constraints"] = (
                            {"gpu_hour_cost": 2.0}
                            if "tokens" in body["training"]
                            else {"objective": rng.choice(["fewest_gpus", "throughput"])}
                        )
                    yield "extreme", "/v1/plans", body, "ok_or_named_422"
                    if rng.random() < 0.3:
                        est = copy.deepcopy(body)
                        est.pop("constraints", None)
                        est["layout"] = {"framework": "fsdp", "zero_stage": 3}
                        yield "extreme", "/v1/estimates", est, "ok_or_named_422"
    for gpu_names in (["a10-24gb"], ["h100-sxm-80gb", "v100-sxm2-16gb", "l4-24gb", "mi300x-192gb"]):
        for seq in (1, 2**20):
            yield (
                "extreme",
                "/v1/capacity",
                {
                    "model": {"preset": "llama-3-70b"},
                    "training": {"seq_len": seq, "global_batch_size": 1024, "tokens": 10**15},
                    "gpus": gpu_names,
                },
                "ok_or_named_422",
            )


def absurd(rng: random.Random) -> Iterator[Req]:
    ok = {
        "model": {"preset": "llama-3-8b"},
        "cluster": _cluster("h100-sxm-80gb", 8),
        "training": {"seq_len": 2048, "global_batch_size": 16},
    }
    mutations: list[tuple[str, Any]] = [
        ("training.seq_len", 0),
        ("training.seq_len", -1),
        ("training.seq_len", 10**12),
        ("training.seq_len", 1.5),
        ("training.seq_len", "2048x"),
        ("training.seq_len", None),
        ("training.global_batch_size", 0),
        ("training.global_batch_size", 10**30),
        ("training.tokens", -5),
        ("training.tokens", 10**40),
        ("training.lora_rank", 0),
        ("training.lora_rank", 10**9),
        ("training.method", "dora"),
        ("training.precision", "int4"),
        ("training.attention", "ring"),
        ("training.optimizer", "rmsprop"),  # "adam" is AdamW's states (HF_OPTIM_NAMES)
        ("cluster.num_nodes", 0),
        ("cluster.num_nodes", 10**9),
        ("cluster.gpus_per_node", 0),
        ("cluster.gpus_per_node", 1000),
        ("cluster.gpu", "h100"),
        ("cluster.gpu", ""),
        ("cluster.gpu", 5),
        ("cluster.inter_node_bandwidth_bytes_per_s", -1),
        ("cluster.intra_node_bandwidth_bytes_per_s", 0),
        ("cluster.intra_node_bandwidth_bytes_per_s", 1e30),
        ("cluster.cpu_memory_bytes_per_node", -1),
        ("model.preset", "llama-9"),
        ("model", {}),
        ("model", {"preset": "gpt2", "hf_config": {}}),
        ("constraints.max_gpus", 0),
        ("constraints.max_gpus", -3),
        ("constraints.top_k", 0),
        ("constraints.top_k", 10**6),
        ("constraints.min_headroom_fraction", 1.5),
        ("constraints.min_headroom_fraction", -0.1),
        ("constraints.gpu_hour_cost", -1),
        ("constraints.objective", "fastest"),
        ("constraints.frameworks", []),
        ("constraints.frameworks", ["jax"]),
        ("launchers", ["pbs"]),  # ([] is the default, no launch files: answered, not absurd)
        ("cluster.gpu", {**CUSTOM_GPU, "memory_bytes": 0}),
        ("cluster.gpu", {**CUSTOM_GPU, "memory_bytes": 10**20}),
        ("cluster.gpu", {**CUSTOM_GPU, "peak_flops_per_s": {}}),
        ("cluster.gpu", {**CUSTOM_GPU, "peak_flops_per_s": {"bf16": -1}}),
        ("cluster.gpu", {**CUSTOM_GPU, "hbm_bandwidth_bytes_per_s": 0}),
        ("cluster.gpu", {**CUSTOM_GPU, "chip": "zz99"}),
        ("model", {"architecture": {**ARCHS[1], "num_layers": 0}}),
        ("model", {"architecture": {**ARCHS[1], "num_layers": 10**7}}),
        ("model", {"architecture": {**ARCHS[1], "hidden_size": 10**7}}),
        ("model", {"architecture": {**ARCHS[1], "num_attention_heads": 7}}),
        ("model", {"architecture": {**ARCHS[1], "num_kv_heads": 3}}),
        ("model", {"architecture": {**ARCHS[1], "vocab_size": 10**10}}),
        (
            "model",
            {
                "architecture": {
                    **ARCHS[2],
                    "moe": {"num_experts": 4, "top_k": 8, "expert_ffn_hidden_size": 1024},
                }
            },
        ),
        (
            "model",
            {
                "architecture": {
                    **ARCHS[2],
                    "moe": {"num_experts": 10**6, "top_k": 2, "expert_ffn_hidden_size": 1024},
                }
            },
        ),
        ("model", {"hf_config": {"model_type": "llama"}}),
        (
            "model",
            {
                "hf_config": {
                    "model_type": "llama",
                    "hidden_size": 4096,
                    "intermediate_size": 11008,
                    "num_hidden_layers": 32,
                    "num_attention_heads": 32,
                    "vocab_size": -1,
                }
            },
        ),
    ]
    for field, value in mutations:
        for path in ("/v1/plans", "/v1/estimates"):
            body = copy.deepcopy(ok)
            if path == "/v1/estimates":
                if field.startswith(("constraints", "launchers")):
                    continue
                body["layout"] = {"framework": "fsdp", "zero_stage": 3}
            _set(body, field, value)
            yield "absurd", path, body, "4xx:" + field
    layout_mutations: list[tuple[str, Any]] = [
        ("layout.tp", 0),
        ("layout.tp", 3),
        ("layout.tp", 10**6),
        ("layout.pp", 10**6),
        ("layout.dp", 10**9),
        ("layout.zero_stage", 4),
        ("layout.micro_batch_size", 0),
        ("layout.micro_batch_size", 10**9),
        ("layout.gradient_accumulation_steps", 10**12),
        ("layout.virtual_pipeline_stages", 10**6),
        ("layout.cp", 10**6),
        ("layout.ep", 10**6),
        ("layout.framework", "colossal"),
        ("layout.recompute_num_layers", -1),
        ("layout.pipeline_layers", [1, 2, 3]),
        ("layout.offload_optimizer", "disk"),
    ]
    for field, value in layout_mutations:
        body = copy.deepcopy(ok)
        body["layout"] = {"framework": "megatron", "zero_stage": 1}
        _set(body, field, value)
        yield "absurd", "/v1/estimates", body, "4xx:" + field


def _set(body: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = body
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def cli_requests(rng: random.Random) -> Iterator[Req]:
    for preset, gpu, gpus, method in (
        ("llama-3-8b", "v100-sxm2-32gb", 8, "lora"),
        ("qwen2.5-0.5b", "l4-24gb", 1, "full"),
        ("mixtral-8x7b", "h100-sxm-80gb", 16, "qlora"),
        ("gemma-2-9b", "mi300x-192gb", 8, "full"),
        ("gpt2", "a10-24gb", 2, "full"),
        ("llama-3.1-405b", "rtx-4090-24gb", 8, "qlora"),
    ):
        yield (
            "cli",
            "/v1/plans",
            {
                "model": {"preset": preset},
                "cluster": _cluster(gpu, gpus),
                "training": {
                    "seq_len": _within_positions(preset, 2048),
                    "global_batch_size": 32,
                    "method": method,
                },
            },
            "cli",
        )
        yield (
            "cli",
            "/v1/estimates",
            {
                "model": {"preset": preset},
                "cluster": _cluster(gpu, gpus),
                "training": {
                    "seq_len": _within_positions(preset, 2048),
                    "global_batch_size": 32,
                    "method": method,
                },
                "layout": {"framework": "deepspeed", "zero_stage": 3},
            },
            "cli",
        )


def options(rng: random.Random) -> Iterator[Req]:
    """Random ordinary requests over the optional fields: training options, constraints, launchers,
    layout switches; each must answer 2xx or a 422 naming the field."""
    models = [
        "llama-3-8b",
        "qwen2.5-0.5b",
        "mixtral-8x7b",
        "gemma-2-9b",
        "phi-3-mini",
        "gpt-neox-20b",
        "falcon-7b",
        "qwen3-30b-a3b",
        "deepseek-v2-lite",
        "gpt2",
        "llama-3.2-1b",
        "gpt-oss-20b",
        "olmo-2-7b",
        "bloom-176b",
        "gemma-3-12b",
        "llama-4-scout-17b-16e",
        "bert-base-uncased",
        "mistral-nemo-12b",
        "phi-4",
    ]
    gpus = [
        "h100-sxm-80gb",
        "a100-sxm-80gb",
        "v100-sxm2-32gb",
        "l4-24gb",
        "a10-24gb",
        "mi300x-192gb",
        "mi250x-128gb",
        "rtx-4090-24gb",
        "h200-sxm-141gb",
        CUSTOM_GPU,
    ]
    for _ in range(260):
        t: dict[str, Any] = {
            "seq_len": rng.choice([512, 2048, 4096, 8192, 32768]),
            "global_batch_size": rng.choice([1, 4, 16, 64, 512]),
        }
        for key, values in (
            ("method", ["full", "lora", "qlora"]),
            ("precision", ["bf16", "fp16", "fp32", "fp8", "bf16_pure", "tf32"]),
            ("optimizer", ["adamw", "adamw_8bit", "sgd", "adafactor", "lion"]),
            ("attention", ["flash", "sdpa", "eager"]),
            ("lora_rank", [4, 16, 64, 256]),
            ("lora_targets", ["all-linear", ["q_proj", "v_proj"], ["gate_proj"], ["o_proj"]]),
            ("tokens", [10**9, 10**12]),
        ):
            if rng.random() < 0.35:
                t[key] = rng.choice(values)
        nodes = rng.choice([1, 1, 2, 4])
        c: dict[str, Any] = {
            "gpu": rng.choice(gpus),
            "num_nodes": nodes,
            "gpus_per_node": rng.choice([1, 2, 4, 8]),
        }
        if nodes > 1:
            c["inter_node_bandwidth_bytes_per_s"] = rng.choice([12.5e9, 50e9])
        if rng.random() < 0.2:
            c["cpu_memory_bytes_per_node"] = rng.choice([256, 1024, 2048]) * 2**30
        body: dict[str, Any] = {"model": {"preset": rng.choice(models)}, "cluster": c, "training": t}
        if rng.random() < 0.6:
            k: dict[str, Any] = {}
            for key, values in (  # type: ignore[assignment]
                ("objective", ["throughput", "fewest_gpus", "cost", "time_to_train"]),
                ("max_gpus", [1, 2, 4, 16]),
                ("frameworks", [["fsdp"], ["deepspeed"], ["megatron"], ["megatron", "fsdp"]]),
                ("allow_offload", [True, False]),
                ("min_headroom_fraction", [0.0, 0.1, 0.5]),
                ("top_k", [1, 5, 20]),
                ("torch_compile", [True, False]),
                ("gpu_hour_cost", [1.0]),
            ):
                if rng.random() < 0.3:
                    k[key] = rng.choice(values)
            body["constraints"] = k
        if rng.random() < 0.4:
            body["launchers"] = rng.sample(
                ["slurm", "kubernetes", "accelerate", "torchtitan", "deepspeed", "hf_trainer", "megatron"],
                rng.choice([1, 2, 3]),
            )
        if rng.random() < 0.7:
            yield "options", "/v1/plans", body, "ok_or_named_422"
        else:
            body.pop("launchers", None)
            k = body.pop("constraints", {})
            if "gpu_hour_cost" in k:
                body["gpu_hour_cost"] = k["gpu_hour_cost"]
            fw = rng.choice(["fsdp", "deepspeed", "megatron"])
            lay: dict[str, Any] = {"framework": fw}
            for key, values in (  # type: ignore[assignment]
                ("zero_stage", [0, 1, 2, 3]),
                ("tp", [1, 2, 4]),
                ("pp", [1, 2]),
                ("cp", [1, 2]),
                ("ep", [1, 2]),
                ("recompute", ["none", "selective", "full", "selective_op"]),
                ("micro_batch_size", [1, 2]),
                ("offload_optimizer", ["none", "cpu", "nvme"]),
                ("offload_params", ["cpu"]),
                ("activation_offload", [True]),
                ("optimizer_in_backward", [True]),
                ("chunked_loss", [True]),
                ("sequence_parallel", [True]),
                ("torch_compile", ["model", "model_and_loss"]),
                ("virtual_pipeline_stages", [2]),
                ("fsdp_hybrid_shard", [True]),
            ):
                if rng.random() < 0.25:
                    lay[key] = rng.choice(values)
            body["layout"] = lay
            yield "options", "/v1/estimates", body, "ok_or_named_422"


def capacity_requests(rng: random.Random) -> Iterator[Req]:
    """POST /v1/capacity over presets, methods, node sizes, max_nodes, at_gpus and prices."""
    names = presets()
    gpus = ["h100-sxm-80gb", "a100-sxm-40gb", "v100-sxm2-16gb", "l4-24gb", "mi300x-192gb", "rtx-4090-24gb"]
    for _ in range(60):
        t: dict[str, Any] = {
            "seq_len": rng.choice([1, 2048, 8192, 131072]),
            "global_batch_size": rng.choice([1, 8, 512, 4096]),
            "method": rng.choice(METHODS),
        }
        body: dict[str, Any] = {"model": {"preset": rng.choice(names)}, "training": t}
        if rng.random() < 0.7:
            body["gpus"] = rng.sample(gpus, rng.choice([1, 2, 3]))
        if rng.random() < 0.3:
            body["max_nodes"] = rng.choice([1, 4, 1024, 100_000])
        if rng.random() < 0.3:
            body["gpus_per_node"] = rng.choice([1, 4, 8])
        if rng.random() < 0.2:
            body["at_gpus"] = rng.choice([8, 1024, 10**6])
        if rng.random() < 0.3:
            t["tokens"] = 10**12
            body["gpu_hour_cost"] = 2.0
        yield "capacity", "/v1/capacity", body, "ok_or_named_422"


GROUPS = {
    "grid": grid,
    "options": options,
    "capacity": capacity_requests,
    "infeasible": infeasible,
    "combos": combos,
    "extreme": extreme,
    "absurd": absurd,
    "cli": cli_requests,
}


# ---------------------------------------------------------------- checks of one answer


def check(path: str, body: dict[str, Any], status: int, answer: Any, expect: str, post: Any) -> list[str]:
    out: list[str] = []
    ctype_problem = isinstance(answer, dict) and "title" in answer and "status" in answer
    if status >= 500:
        return [f"5xx {status}: {str(answer)[:300]}"]
    if expect.startswith("4xx:"):
        field = expect[4:]
        if status < 400:
            return [f"{status} for absurd {field}"]
        if not ctype_problem:
            return [f"{status} not problem+json"]
        fields = [str(e.get("field", "")) for e in answer.get("errors", [])]
        if not any(f == field or f.startswith(field + ".") or field.startswith(f + ".") for f in fields):
            out.append(f"{status} does not name {field}: fields {fields}, {str(answer.get('detail'))[:150]}")
        return out
    if status >= 400:
        if not ctype_problem or (
            expect == "ok" and not any(w in str(answer.get("detail")) for w in DESIGN_422)
        ):
            out.append(f"{status} for an ordinary request: {str(answer.get('detail', answer))[:300]}")
        elif not answer.get("errors") and "detail" not in answer:
            out.append(f"{status} naming nothing")
        return out
    if path == "/v1/plans":
        out += check_plan(body, answer, post)
    if path == "/v1/estimates":
        resolved = answer.get("resolved_defaults") or {}
        for key in ("precision", "attention"):
            if key not in body["training"] and f"training.{key}" not in resolved:
                out.append(f"estimate: training.{key} left out, not in resolved_defaults: {sorted(resolved)}")
    return out


def check_plan(body: dict[str, Any], plan: dict[str, Any], post: Any) -> list[str]:
    out = []
    if plan.get("status") not in ("feasible", "infeasible"):
        out.append(f"plan status {plan.get('status')}")
    rec = plan.get("recommended")
    if plan.get("status") == "infeasible":
        if not plan.get("suggestions") and not plan.get("suggestions_skipped"):
            # none made is an answer where each suggestion considered says why it was not made
            out.append("infeasible with no suggestion, and none said why it was not made")
        if rec is not None and rec.get("estimate", {}).get("fits"):
            out.append("infeasible yet its recommended layout fits")
    for i, alt in enumerate(plan.get("alternatives") or []):
        if i >= 2:
            break
        est = {
            "model": body["model"],
            "cluster": _sub_cluster(body["cluster"], _world(alt["layout"])),
            "training": body["training"],
            "layout": alt["layout"],
        }
        if (cost := (body.get("constraints") or {}).get("gpu_hour_cost")) is not None and body[
            "training"
        ].get("tokens"):
            est["gpu_hour_cost"] = cost
        status, answer = post("/v1/estimates", est)
        if status != 200:
            out.append(f"alternative re-estimate HTTP {status}: {str(answer.get('detail', answer))[:200]}")
        else:
            for key in (
                "fits",
                "memory",
                "time",
                "time_to_train_s",
                "cost_to_train",
            ):  # limits: recommended only
                if _norm(alt["estimate"].get(key)) != _norm(answer.get(key)):
                    out.append(
                        f"alternative re-estimate differs in {key}: "
                        f"{_diff(alt['estimate'].get(key), answer.get(key))}"
                    )
    if rec is not None:
        resolved = rec["estimate"].get("resolved_defaults") or plan.get("resolved_defaults") or {}
        for key in ("training.precision", "training.attention"):
            if (
                key.split(".")[1] not in body["training"]
                and key not in resolved
                and key not in json.dumps(plan)[:0]
            ):
                out.append(f"{key} left out, not in resolved_defaults: {sorted(resolved)}")
        # consistency: the recommended layout estimated alone gives the plan's numbers
        est = {
            "model": body["model"],
            "cluster": _sub_cluster(body["cluster"], _world(rec["layout"])),
            "training": body["training"],
            "layout": rec["layout"],
        }
        if (cost := (body.get("constraints") or {}).get("gpu_hour_cost")) is not None and body[
            "training"
        ].get("tokens"):
            est["gpu_hour_cost"] = cost
        status, answer = post("/v1/estimates", est)
        if status != 200:
            out.append(f"re-estimate HTTP {status}: {str(answer.get('detail', answer))[:200]}")
        else:
            for key in ("fits", "memory", "time", "limits", "time_to_train_s", "cost_to_train"):
                if _norm(rec["estimate"].get(key)) != _norm(answer.get(key)):
                    out.append(
                        f"re-estimate differs in {key}: {_diff(rec['estimate'].get(key), answer.get(key))}"
                    )
    return out


def _norm(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.9g}")
    if isinstance(x, dict):
        return {k: _norm(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_norm(v) for v in x]
    return x


def _diff(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if _norm(a.get(k)) != _norm(b.get(k)):
                return _diff(a.get(k), b.get(k), f"{path}.{k}")
    return f"{path}: {str(a)[:80]} vs {str(b)[:80]}"


def _world(layout: dict[str, Any]) -> int:
    return int(layout["dp"] * layout["tp"] * layout["pp"] * layout["cp"])


def _sub_cluster(cluster: dict[str, Any], world: int) -> dict[str, Any]:
    out = dict(cluster)
    per = cluster["gpus_per_node"]
    if world <= per:
        out["num_nodes"], out["gpus_per_node"] = 1, world
    else:
        out["num_nodes"] = world // per
    if out["num_nodes"] == 1:
        out.pop("inter_node_bandwidth_bytes_per_s", None)
    return out


# ---------------------------------------------------------------- CLI


def cli_check(path: str, body: dict[str, Any], api_answer: Any, url: str) -> list[str]:
    from click.testing import CliRunner

    from service.cli import main
    from service.settings import get_settings

    c, t = body["cluster"], body["training"]
    gpus = f"{c['num_nodes']}x{c['gpus_per_node']}x{c['gpu']}"
    args = [
        "plan" if path == "/v1/plans" else "estimate",
        "--model",
        body["model"]["preset"],
        "--gpus",
        gpus,
        "--seq",
        str(t["seq_len"]),
        "--batch",
        str(t["global_batch_size"]),
        "--method",
        t["method"],
    ]
    if c["num_nodes"] > 1:
        args += ["--inter-gbps", str(c["inter_node_bandwidth_bytes_per_s"] / 1e9)]
    if "layout" in body:
        args += ["--framework", body["layout"]["framework"], "--zero", str(body["layout"]["zero_stage"])]
    os.environ["PLANNER_DATABASE_URL"] = url
    os.environ["PLANNER_REQUEST_BUDGET_S"] = "60"
    get_settings.cache_clear()
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=True)
    try:
        cli = json.loads(result.stdout)
    except ValueError:
        return [f"CLI exit {result.exit_code}, no JSON: {result.output[-300:]}"]
    volatile = ("id", "created_at", "request", "search")
    a = {k: v for k, v in api_answer.items() if k not in volatile}
    b = {k: v for k, v in cli.items() if k not in volatile}
    if _norm(a) != _norm(b):
        return [f"CLI differs: {_diff(a, b)}"]
    return []


# ---------------------------------------------------------------- main


def make_client(budget_s: float | None = None) -> tuple[Any, str]:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    from fastapi.testclient import TestClient

    from service.cli import migrate
    from service.main import create_app
    from service.settings import Settings

    url = f"sqlite:///{tempfile.mkdtemp(prefix='fuzz-')}/probe.db"
    migrate(url)
    logging.disable(logging.CRITICAL)
    kw: dict[str, Any] = {"request_budget_s": budget_s} if budget_s else {}
    app = create_app(Settings(database_url=url, log_level="CRITICAL", **kw))
    return TestClient(app, raise_server_exceptions=False).__enter__(), url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", default=",".join(GROUPS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--no-consistency", action="store_true")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    rng = random.Random(args.seed)
    api, _ = make_client()
    unhurried, url2 = make_client(60.0)

    def post(path: str, body: dict[str, Any], on: Any = api) -> tuple[int, Any]:
        r = on.post(path, json=body)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, {"detail": r.text[:300]}

    statuses: Counter[str] = Counter()
    timings: list[tuple[float, float, str, dict[str, Any], int]] = []
    findings: list[dict[str, Any]] = []
    n = 0
    refusals: Counter[str] = Counter()
    examples: dict[str, Any] = {}
    for group in args.groups.split(","):
        for g, path, body, expect in GROUPS[group](rng):
            on = unhurried if expect == "cli" else api
            cpu0, wall0 = time.process_time(), time.perf_counter()
            status, answer = post(path, body, on)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            n += 1
            statuses[f"{g} {path} {status}"] += 1
            timings.append((cpu, wall, path, body, status))
            if status == 422 and not expect.startswith("4xx"):
                detail = json.dumps([e.get("loc", e.get("field")) for e in answer.get("errors", [])])[:80]
                folded = re.sub(r"\d+(\.\d+)?", "N", detail + " " + str(answer.get("detail", "")))[:150]
                refusals[f"{g} {path} {folded}"] += 1
                examples.setdefault(f"{g} {path} {folded}", body)
            extra: Callable[..., Any] = (
                functools.partial(post, on=on) if not args.no_consistency else (lambda p, b: (200, {}))
            )
            problems = check(path, body, status, answer, expect if expect != "cli" else "ok", extra)
            if expect == "cli" and status < 300:
                problems += cli_check(path, body, answer, url2)
            if cpu > SLOW_CPU_S:
                problems.append(f"slow: {cpu:.2f} s CPU, {wall:.2f} s wall")
            for p in problems:
                findings.append({"group": g, "path": path, "status": status, "finding": p, "body": body})
            if n % 50 == 0:
                print(f"  {n} requests, {len(findings)} findings", file=sys.stderr, flush=True)
    print(json.dumps({"requests": n, "findings": len(findings)}))
    for key, count in sorted(statuses.items()):
        print(f"  {key}: {count}")
    print("422s of requests not made wrong on purpose:")
    for text, count in refusals.most_common():
        print(f"  x{count} {text}\n      e.g. {json.dumps(examples[text], separators=(',', ':'))[:600]}")
    slowest = sorted(timings, key=lambda t: -t[0])[:10]
    print("slowest 10 (CPU s, wall s):")
    for cpu, wall, path, body, status in slowest:
        print(f"  {cpu:.2f} {wall:.2f} {path} {status} {json.dumps(body, separators=(',', ':'))}")
    kinds: Counter[str] = Counter(f"{f['group']}: {f['finding'][:90]}" for f in findings)
    print("findings by kind:")
    for text, count in kinds.most_common():
        print(f"  x{count} {text}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "statuses": dict(statuses),
                    "findings": findings,
                    "slowest": [(cpu, wall, path, body) for cpu, wall, path, body, _ in slowest],
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
