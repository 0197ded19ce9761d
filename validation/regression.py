"""Regression corpus: record what the service answers for a fixed set of requests, and compare two
recordings field by field, to show that a refactor changed no number (or only the listed ones).

    python -m validation.regression record --out before.json
    python -m validation.regression compare before.json after.json [--rel-tol 1e-9] [--abs-bytes 0]
        [--ignore 'response.search.candidates_evaluated'] [--ignore 'est-rand-017:response.warnings*']

``record`` builds the app in-process exactly as the tests do (a fresh SQLite database migrated with
``alembic upgrade head``, ``service.main.create_app(Settings(...))``, a ``TestClient``), sends every
request of the corpus and writes a JSON list of ``{"id", "method", "path", "body", "status",
"response"}`` (plans also carry ``"artifacts"``: each launcher file fetched back, raw). It uses the
public HTTP API only. Fields that change between two runs of the same code are normalised away:
``created_at`` / ``updated_at``, ``search.duration_s`` of plans and ``duration_s`` of capacity
answers, and the ids of the plans and clusters it creates (replaced, wherever they appear, e.g. in
artifact URLs and ``cluster_id``, by ``<plan:REQUEST-ID>`` / ``<cluster:NAME>``). Headers (request
ids, ``Location``) are not recorded. Two recordings of unchanged code compare equal.

The corpus is generated in code, deterministically: fixed cases plus draws from a seeded
``random.Random`` (no draw depends on an answer, so two code versions get the same requests).
About 220 ``POST /v1/estimates`` (presets, ``hf_config`` and ``architecture`` models, dense and MoE;
catalog and custom GPUs; 1 to thousands of GPUs; every layout knob), 50 ``POST /v1/plans``
(objectives, frameworks, offload, headroom, top_k, every launcher target, infeasible jobs with
suggestions), 10 ``POST /v1/capacity``, a few stored clusters they refer to, and invalid requests
that must be answered 422 (their problem+json bodies are compared too). ``record`` reports the
count per endpoint and status, the slowest requests, 500s and truncated plan searches (a search
stopped by its time budget would make the recording depend on the machine's speed). The searches
behind an infeasible plan's suggestions have their own 1 s budget each and do not report running
out of it; the corpus keeps every one that can change an answer under 0.2 s on 2 cores.

``compare`` walks both recordings (dicts by key, lists by index), compares floats with a relative
tolerance and integers exactly (``--abs-bytes N`` lets integer byte fields, keys ending in ``bytes``
and the components of ``memory.per_gpu``, differ by up to N), prints each differing path with both
values, grouped by request id, then a summary (requests identical / differing, differing values per
top-level field), and exits 1 when anything differs. ``--ignore GLOB`` (repeatable) skips paths that
match, with or without the ``REQUEST-ID:`` prefix: use it for listed bug fixes.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import fnmatch
import json
import math
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SEED = 20240601
GiB = 2**30
TiB = 2**40

# ---------------------------------------------------------------- the corpus


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    method: str
    path: str
    body: dict[str, Any] | None
    expect: int | None = None  # the status this case is meant to get (checked, reported)


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """A model of the corpus and the numbers that decide which layouts are valid for it."""

    label: str
    ref: dict[str, Any]
    layers: int
    heads: int
    kv_heads: int
    experts: int = 0
    billions: float = 1.0


@dataclass(frozen=True, slots=True)
class GPUChoice:
    name: str
    gpu: str | dict[str, Any]
    memory_gib: int
    bf16: bool = True
    fp8: bool = False


CUSTOM_GPU: dict[str, Any] = {
    "name": "lab-card-48gb",
    "memory_bytes": 48 * GiB,
    "peak_flops_per_s": {"fp32": 4e13, "tf32": 9e13, "bf16": 1.8e14, "fp16": 1.8e14},
    "hbm_bandwidth_bytes_per_s": 1e12,
    "intra_node_bandwidth_bytes_per_s": 3.2e10,
    "pcie_bandwidth_bytes_per_s": 3.2e10,
}

GPUS: tuple[GPUChoice, ...] = (
    GPUChoice("h100", "h100-sxm-80gb", 80, fp8=True),
    GPUChoice("h100-pcie", "h100-pcie-80gb", 80, fp8=True),
    GPUChoice("h200", "h200-sxm-141gb", 141, fp8=True),
    GPUChoice("b200", "b200-sxm-180gb", 180, fp8=True),
    GPUChoice("a100-40", "a100-sxm-40gb", 40),
    GPUChoice("a100-80", "a100-sxm-80gb", 80),
    GPUChoice("a100-pcie-40", "a100-pcie-40gb", 40),
    GPUChoice("v100-16", "v100-sxm2-16gb", 16, bf16=False),
    GPUChoice("v100-32", "v100-sxm2-32gb", 32, bf16=False),
    GPUChoice("a10", "a10-24gb", 24),
    GPUChoice("l4", "l4-24gb", 24, fp8=True),
    GPUChoice("l40s", "l40s-48gb", 48, fp8=True),
    GPUChoice("rtx3090", "rtx-3090-24gb", 24),
    GPUChoice("rtx4090", "rtx-4090-24gb", 24, fp8=True),
    GPUChoice("mi250x", "mi250x-128gb", 128),
    GPUChoice("mi300x", "mi300x-192gb", 192, fp8=True),
    GPUChoice("custom", CUSTOM_GPU, 48),
)
GPU_BY_NAME = {g.name: g for g in GPUS}

HF_QWEN2_MOE: dict[str, Any] = {
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 151936,
    "max_position_embeddings": 8192,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "decoder_sparse_step": 1,
    "tie_word_embeddings": False,
}
HF_MIXTRAL_8X22B: dict[str, Any] = {
    "model_type": "mixtral",
    "hidden_size": 6144,
    "intermediate_size": 16384,
    "num_hidden_layers": 56,
    "num_attention_heads": 48,
    "num_key_value_heads": 8,
    "vocab_size": 32768,
    "max_position_embeddings": 65536,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}
HF_TINYLLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
}
HF_GEMMA2_9B: dict[str, Any] = {
    "model_type": "gemma2",
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_hidden_layers": 42,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "vocab_size": 256000,
    "max_position_embeddings": 8192,
}
HF_PHI2: dict[str, Any] = {
    "model_type": "phi",
    "hidden_size": 2560,
    "intermediate_size": 10240,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "vocab_size": 51200,
    "max_position_embeddings": 2048,
    "partial_rotary_factor": 0.4,
}
HF_FALCON_40B: dict[str, Any] = {
    "model_type": "falcon",
    "hidden_size": 8192,
    "num_hidden_layers": 60,
    "num_attention_heads": 128,
    "num_kv_heads": 8,
    "new_decoder_architecture": True,
    "parallel_attn": True,
    "bias": False,
    "vocab_size": 65024,
}
HF_GPT_NEOX_1B: dict[str, Any] = {
    "model_type": "gpt_neox",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 8,
    "vocab_size": 50304,
    "rotary_pct": 0.25,
    "use_parallel_residual": True,
}
HF_BLOOM_7B: dict[str, Any] = {
    "model_type": "bloom",
    "hidden_size": 4096,
    "n_layer": 30,
    "n_head": 32,
    "vocab_size": 250880,
}
HF_MISTRAL_NEMO: dict[str, Any] = {
    "model_type": "mistral",
    "hidden_size": 5120,
    "intermediate_size": 14336,
    "num_hidden_layers": 40,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 131072,
    "max_position_embeddings": 131072,
}
HF_QWEN2_1_5B: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
HF_PHI3_MEDIUM: dict[str, Any] = {
    "model_type": "phi3",
    "hidden_size": 5120,
    "intermediate_size": 17920,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
    "num_key_value_heads": 10,
    "vocab_size": 32064,
}
HF_GPT2_MEDIUM: dict[str, Any] = {
    "model_type": "gpt2",
    "n_embd": 1024,
    "n_layer": 24,
    "n_head": 16,
    "n_positions": 1024,
    "vocab_size": 50257,
}
ARCH_ODD_HEAD_DIM: dict[str, Any] = {  # 13824 / 128 heads: head_dim 108, off every alignment
    "num_layers": 48,
    "hidden_size": 13824,
    "num_attention_heads": 128,
    "num_kv_heads": 8,
    "ffn_hidden_size": 36864,
    "vocab_size": 64000,
    "mlp": "swiglu",
    "norm": "rmsnorm",
}
ARCH_MOE: dict[str, Any] = {
    "num_layers": 24,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_kv_heads": 8,
    "ffn_hidden_size": 14336,
    "vocab_size": 64000,
    "moe": {
        "num_experts": 16,
        "top_k": 2,
        "expert_ffn_hidden_size": 2048,
        "num_shared_experts": 1,
        "shared_expert_ffn_hidden_size": 4096,
        "shared_expert_gate": True,
        "layer_frequency": 2,
        "router_bias": True,
    },
}
ARCH_GELU: dict[str, Any] = {
    "num_layers": 36,
    "hidden_size": 3072,
    "num_attention_heads": 24,
    "ffn_hidden_size": 12288,
    "vocab_size": 50257,
    "max_position_embeddings": 2048,
    "mlp": "gelu",
    "norm": "layernorm",
    "position_embedding": "learned",
    "tied_embeddings": True,
    "qkv_bias": True,
    "attn_out_bias": True,
    "mlp_bias": True,
}
ARCH_PARALLEL: dict[str, Any] = {
    "num_layers": 40,
    "hidden_size": 5120,
    "num_attention_heads": 40,
    "num_kv_heads": 40,
    "head_dim": 160,
    "ffn_hidden_size": 13824,
    "vocab_size": 100352,
    "mlp": "geglu",
    "norms_per_layer": 1,
    "parallel_attn_mlp": True,
    "rotary_fraction": 0.5,
    "embedding_norm": True,
    "lm_head_bias": True,
}


def _preset(name: str, layers: int, heads: int, kv: int, experts: int = 0, b: float = 1.0) -> ModelChoice:
    return ModelChoice(name, {"preset": name}, layers, heads, kv, experts, b)


MODELS: tuple[ModelChoice, ...] = (
    _preset("gpt2", 12, 12, 12, b=0.124),
    _preset("llama-2-7b", 32, 32, 32, b=7),
    _preset("llama-2-13b", 40, 40, 40, b=13),
    _preset("llama-2-70b", 80, 64, 8, b=70),
    _preset("llama-3-8b", 32, 32, 8, b=8),
    _preset("llama-3-70b", 80, 64, 8, b=70),
    _preset("llama-3.1-8b", 32, 32, 8, b=8),
    _preset("llama-3.1-70b", 80, 64, 8, b=70),
    _preset("llama-3.1-405b", 126, 128, 8, b=405),
    _preset("mistral-7b", 32, 32, 8, b=7),
    _preset("mixtral-8x7b", 32, 32, 8, experts=8, b=47),
    _preset("qwen2.5-0.5b", 24, 14, 2, b=0.5),
    _preset("qwen2.5-7b", 28, 28, 4, b=7),
    _preset("qwen2.5-72b", 80, 64, 8, b=72),
    _preset("gemma-2b", 18, 8, 1, b=2.5),
    _preset("phi-3-mini", 32, 32, 32, b=3.8),
    _preset("gpt-neox-20b", 44, 64, 64, b=20),
    _preset("falcon-7b", 32, 71, 1, b=7),
    _preset("gpt-3-175b", 96, 96, 96, b=175),
    _preset("bloom-176b", 70, 112, 112, b=176),
    ModelChoice("hf-qwen2-moe", {"hf_config": HF_QWEN2_MOE, "name": "qwen1.5-moe-a2.7b"}, 24, 16, 16, 60, 14),
    ModelChoice("hf-mixtral-8x22b", {"hf_config": HF_MIXTRAL_8X22B}, 56, 48, 8, 8, 141),
    ModelChoice("hf-tinyllama", {"hf_config": HF_TINYLLAMA, "name": "tinyllama"}, 22, 32, 4, billions=1.1),
    ModelChoice("hf-gemma2-9b", {"hf_config": HF_GEMMA2_9B}, 42, 16, 8, billions=9),
    ModelChoice("hf-phi2", {"hf_config": HF_PHI2, "name": "phi-2"}, 32, 32, 32, billions=2.7),
    ModelChoice("hf-falcon-40b", {"hf_config": HF_FALCON_40B}, 60, 128, 8, billions=40),
    ModelChoice("hf-gpt-neox-1b", {"hf_config": HF_GPT_NEOX_1B}, 16, 8, 8, billions=1.2),
    ModelChoice("hf-bloom-7b", {"hf_config": HF_BLOOM_7B, "name": "bloom-7b1"}, 30, 32, 32, billions=7),
    ModelChoice("hf-mistral-nemo", {"hf_config": HF_MISTRAL_NEMO}, 40, 32, 8, billions=12),
    ModelChoice("hf-qwen2-1.5b", {"hf_config": HF_QWEN2_1_5B}, 28, 12, 2, billions=1.5),
    ModelChoice("hf-phi3-medium", {"hf_config": HF_PHI3_MEDIUM}, 40, 40, 10, billions=14),
    ModelChoice("hf-gpt2-medium", {"hf_config": HF_GPT2_MEDIUM}, 24, 16, 16, billions=0.35),
    ModelChoice(
        "arch-odd-head-dim", {"architecture": ARCH_ODD_HEAD_DIM, "name": "odd-hd"}, 48, 128, 8, billions=110
    ),
    ModelChoice("arch-moe", {"architecture": ARCH_MOE, "name": "arch-moe"}, 24, 32, 8, 16, 8),
    ModelChoice("arch-gelu", {"architecture": ARCH_GELU}, 36, 24, 24, billions=4),
    ModelChoice(
        "arch-parallel", {"architecture": ARCH_PARALLEL, "name": "arch-par"}, 40, 40, 40, billions=13
    ),
)
MODEL_BY_LABEL = {m.label: m for m in MODELS}

FRAMEWORKS = ("deepspeed", "megatron", "fsdp")
OPTIMIZERS = ("adamw", "adamw", "adamw_8bit", "sgd", "adafactor", "lion")
LORA_TARGETS: tuple[Any, ...] = ("all-linear", ["q_proj", "v_proj"], ["q_proj", "k_proj", "v_proj", "o_proj"])
TARGETS = ("deepspeed", "accelerate", "hf_trainer", "megatron", "torchtitan", "slurm", "kubernetes")
STORED_CLUSTERS: dict[str, dict[str, Any]] = {
    "reg-h100-pod": {
        "gpu": "h100-sxm-80gb",
        "num_nodes": 4,
        "gpus_per_node": 8,
        "inter_node_bandwidth_gbps": 50,
        "cpu_memory_bytes_per_node": 2 * TiB,
        "nvme_bytes_per_node": 8 * TiB,
    },
    "reg-lab": {"gpu": CUSTOM_GPU, "num_nodes": 1, "gpus_per_node": 4},
    "reg-a100-40": {
        "gpu": "a100-sxm-40gb",
        "num_nodes": 2,
        "gpus_per_node": 8,
        "inter_node_bandwidth_bytes_per_s": 25e9,
        "cpu_memory_bytes_per_node": 1 * TiB,
    },
}


def stored(name: str) -> dict[str, str]:
    """A reference to a cluster the setup stores; the placeholder becomes its id when sent."""
    return {"id": f"<cluster:{name}>"}


def cluster_for(
    gpu: GPUChoice,
    world: int,
    *,
    gpus_per_node: int = 8,
    inter_gbps: float = 50,
    cpu_bytes: int | None = None,
    nvme_bytes: int | None = None,
    intra: float | None = None,
    use_gbps: bool = False,
) -> dict[str, Any]:
    """An inline cluster of ``world`` GPUs: one node up to ``gpus_per_node``, whole nodes above."""
    gpn = world if world <= gpus_per_node else gpus_per_node
    nodes = max(1, world // gpn)
    assert nodes * gpn == world, (world, gpus_per_node)
    out: dict[str, Any] = {"gpu": gpu.gpu, "num_nodes": nodes, "gpus_per_node": gpn}
    if nodes > 1:
        if use_gbps:
            out["inter_node_bandwidth_gbps"] = inter_gbps
        else:
            out["inter_node_bandwidth_bytes_per_s"] = inter_gbps * 1e9
    if intra is not None:
        out["intra_node_bandwidth_bytes_per_s"] = intra
    if cpu_bytes is not None:
        out["cpu_memory_bytes_per_node"] = cpu_bytes
    if nvme_bytes is not None:
        out["nvme_bytes_per_node"] = nvme_bytes
    return out


def training(seq_len: int, gbs: int, precision: str = "bf16", **extra: Any) -> dict[str, Any]:
    return {"seq_len": seq_len, "global_batch_size": gbs, "precision": precision, **extra}


def estimate_body(
    model: ModelChoice | str,
    cluster: dict[str, Any],
    train: dict[str, Any],
    layout: dict[str, Any],
    gpu_hour_cost: float | None = None,
) -> dict[str, Any]:
    m = MODEL_BY_LABEL[model] if isinstance(model, str) else model
    body: dict[str, Any] = {"model": m.ref, "cluster": cluster, "training": train, "layout": layout}
    if gpu_hour_cost is not None:
        body["gpu_hour_cost"] = gpu_hour_cost
    return body


def fixed_estimates() -> list[Case]:
    """Hand-picked layouts, one or a few per feature of the estimator."""
    h100, a100_40, a100_80 = GPU_BY_NAME["h100"], GPU_BY_NAME["a100-40"], GPU_BY_NAME["a100-80"]
    v100, l4, rtx, mi300 = (
        GPU_BY_NAME["v100-32"],
        GPU_BY_NAME["l4"],
        GPU_BY_NAME["rtx4090"],
        GPU_BY_NAME["mi300x"],
    )
    h200, b200, custom = GPU_BY_NAME["h200"], GPU_BY_NAME["b200"], GPU_BY_NAME["custom"]
    t = training
    specs: list[tuple[str, dict[str, Any]]] = [
        ("readme-llama2-7b-zero2", estimate_body(
            "llama-2-7b", cluster_for(h100, 8), t(4096, 64, tokens=1_000_000_000),
            {"framework": "deepspeed", "dp": 8, "zero_stage": 2, "recompute": "full"}, 2.5)),
        ("gpt2-1gpu-fp32", estimate_body(
            "gpt2", cluster_for(rtx, 1), t(1024, 32, "fp32"), {"micro_batch_size": 8})),
        ("gpt2-1gpu-eager", estimate_body(
            "gpt2", cluster_for(l4, 1), t(1024, 16, attention="eager"), {"micro_batch_size": 4})),
        ("gpt2-1gpu-sdpa-fp16", estimate_body(
            "gpt2", cluster_for(v100, 1), t(1024, 16, "fp16", attention="sdpa"), {"micro_batch_size": 4})),
        ("llama3-8b-fsdp-full-shard", estimate_body(
            "llama-3-8b", cluster_for(h100, 8), t(8192, 32),
            {"framework": "fsdp", "dp": 8, "zero_stage": 3, "recompute": "selective_op",
             "micro_batch_size": 1})),
        ("llama3-8b-fsdp-cpu-offload", estimate_body(
            "llama-3-8b", cluster_for(rtx, 2, cpu_bytes=256 * GiB), t(2048, 16),
            {"framework": "fsdp", "dp": 2, "zero_stage": 3, "offload_optimizer": "cpu",
             "offload_params": "cpu", "recompute": "full"})),
        ("llama3-8b-ds-nvme", estimate_body(
            "llama-3-8b", cluster_for(l4, 4, cpu_bytes=128 * GiB, nvme_bytes=4 * TiB), t(4096, 32),
            {"framework": "deepspeed", "dp": 4, "zero_stage": 3, "offload_optimizer": "nvme",
             "offload_params": "nvme", "recompute": "full"})),
        ("llama3-8b-ds-cpu-no-host-ram", estimate_body(
            "llama-3-8b", cluster_for(a100_40, 2), t(4096, 16),
            {"framework": "deepspeed", "dp": 2, "zero_stage": 2, "offload_optimizer": "cpu",
             "recompute": "full"})),
        ("llama3-70b-megatron-3d", estimate_body(
            "llama-3-70b", cluster_for(h100, 64, inter_gbps=50), t(8192, 512, tokens=15 * 10**12),
            {"framework": "megatron", "dp": 2, "tp": 8, "pp": 4, "sequence_parallel": True,
             "zero_stage": 1, "recompute": "selective", "virtual_pipeline_stages": 5,
             "tp_comm_overlap": True, "overlap_grad_reduce": True}, 2.0)),
        ("llama3-70b-megatron-no-overlap", estimate_body(
            "llama-3-70b", cluster_for(h100, 64, inter_gbps=25), t(8192, 512),
            {"framework": "megatron", "dp": 2, "tp": 8, "pp": 4, "sequence_parallel": True,
             "zero_stage": 1, "recompute": "full", "overlap_grad_reduce": False})),
        ("llama31-405b-16k-gpus", estimate_body(
            "llama-3.1-405b", cluster_for(h100, 14336, inter_gbps=50), t(8192, 2048, tokens=15 * 10**12),
            {"framework": "megatron", "dp": 128, "tp": 8, "pp": 14, "sequence_parallel": True,
             "zero_stage": 1, "recompute": "none", "virtual_pipeline_stages": 1,
             "gradient_accumulation_steps": 16}, 2.0)),
        ("llama31-405b-cp", estimate_body(
            "llama-3.1-405b", cluster_for(h100, 896, inter_gbps=50), t(131072, 16),
            {"framework": "megatron", "dp": 4, "tp": 8, "pp": 7, "cp": 4, "sequence_parallel": True,
             "zero_stage": 1, "recompute": "full"})),
        ("llama31-405b-fp8-b200", estimate_body(
            "llama-3.1-405b", cluster_for(b200, 1152, inter_gbps=100), t(8192, 1024, "fp8"),
            {"framework": "megatron", "dp": 16, "tp": 8, "pp": 9, "sequence_parallel": True,
             "zero_stage": 1, "recompute": "selective"})),
        ("mixtral-ep8-megatron", estimate_body(
            "mixtral-8x7b", cluster_for(h100, 32, inter_gbps=50), t(4096, 256),
            {"framework": "megatron", "dp": 8, "tp": 2, "pp": 2, "ep": 8, "sequence_parallel": True,
             "zero_stage": 1, "recompute": "selective"})),
        ("mixtral-ep4-ds", estimate_body(
            "mixtral-8x7b", cluster_for(mi300, 8), t(4096, 64),
            {"framework": "deepspeed", "dp": 8, "ep": 4, "zero_stage": 2, "recompute": "full"})),
        ("mixtral-ep-fsdp-hybrid", estimate_body(
            "mixtral-8x7b", cluster_for(h200, 32, inter_gbps=50), t(8192, 128),
            {"framework": "fsdp", "dp": 16, "tp": 2, "ep": 8, "zero_stage": 3, "fsdp_hybrid_shard": True,
             "recompute": "full", "chunked_loss": True})),
        ("qwen-moe-hf-ep4", estimate_body(
            "hf-qwen2-moe", cluster_for(a100_80, 8), t(4096, 64),
            {"framework": "megatron", "dp": 8, "ep": 4, "zero_stage": 1, "recompute": "selective"})),
        ("arch-moe-shared-ep2", estimate_body(
            "arch-moe", cluster_for(h100, 16, inter_gbps=50), t(4096, 128),
            {"framework": "megatron", "dp": 8, "tp": 2, "ep": 2, "zero_stage": 1,
             "sequence_parallel": True})),
        ("odd-head-dim-eager", estimate_body(
            "arch-odd-head-dim", cluster_for(h100, 64, inter_gbps=50), t(4096, 256, attention="eager"),
            {"framework": "megatron", "dp": 4, "tp": 8, "pp": 2, "zero_stage": 1, "recompute": "full",
             "sequence_parallel": True})),
        ("odd-head-dim-flash", estimate_body(
            "arch-odd-head-dim", cluster_for(h100, 64, inter_gbps=50), t(4096, 256),
            {"framework": "megatron", "dp": 4, "tp": 8, "pp": 2, "zero_stage": 1, "recompute": "selective",
             "sequence_parallel": True})),
        ("odd-head-dim-fp32-eager", estimate_body(
            "arch-odd-head-dim", cluster_for(a100_80, 128, inter_gbps=25),
            t(2048, 256, "fp32", attention="eager"),
            {"framework": "fsdp", "dp": 16, "tp": 8, "zero_stage": 3, "recompute": "full"})),
        ("gemma2-head256-flash", estimate_body(
            "hf-gemma2-9b", cluster_for(h100, 8), t(8192, 64, attention="flash"),
            {"framework": "fsdp", "dp": 8, "zero_stage": 3, "recompute": "full"})),
        ("gemma-2b-lora", estimate_body(
            "gemma-2b", cluster_for(l4, 1), t(2048, 16, method="lora", lora_rank=64),
            {"micro_batch_size": 2, "recompute": "full"})),
        ("llama2-13b-qlora-4090", estimate_body(
            "llama-2-13b", cluster_for(rtx, 1), t(2048, 16, method="qlora", lora_rank=16,
                                                  lora_targets=["q_proj", "v_proj"], optimizer="adamw_8bit"),
            {"recompute": "full", "chunked_loss": True})),
        ("llama2-70b-qlora-2xa100", estimate_body(
            "llama-2-70b", cluster_for(a100_80, 2), t(4096, 16, method="qlora", lora_rank=64),
            {"framework": "fsdp", "dp": 2, "zero_stage": 3, "recompute": "full"})),
        ("llama3-8b-lora-tp2-ds", estimate_body(
            "llama-3-8b", cluster_for(a100_40, 4), t(4096, 32, method="lora"),
            {"framework": "deepspeed", "dp": 2, "tp": 2, "zero_stage": 1})),
        ("phi3-bf16-pure-optbwd", estimate_body(
            "phi-3-mini", cluster_for(rtx, 4), t(4096, 4, "bf16_pure"),
            {"framework": "fsdp", "dp": 4, "zero_stage": 3, "optimizer_in_backward": True,
             "recompute": "full", "activation_offload": True, "chunked_loss": True})),
        ("phi3-bf16-pure-sgd", estimate_body(
            "phi-3-mini", cluster_for(l4, 8, cpu_bytes=512 * GiB), t(2048, 64, "bf16_pure", optimizer="sgd"),
            {"framework": "fsdp", "dp": 8, "zero_stage": 2})),
        ("ds-activation-offload", estimate_body(
            "mistral-7b", cluster_for(a100_40, 8, cpu_bytes=1 * TiB), t(8192, 32),
            {"framework": "deepspeed", "dp": 8, "zero_stage": 3, "recompute": "full",
             "activation_offload": True})),
        ("megatron-activation-offload", estimate_body(
            "mistral-7b", cluster_for(a100_40, 8, cpu_bytes=1 * TiB), t(8192, 32),
            {"framework": "megatron", "dp": 4, "tp": 2, "zero_stage": 1, "recompute": "selective",
             "activation_offload": True, "sequence_parallel": True})),
        ("gpt-neox-20b-v100", estimate_body(
            "gpt-neox-20b", cluster_for(v100, 32, inter_gbps=12.5), t(2048, 256, "fp16"),
            {"framework": "megatron", "dp": 2, "tp": 4, "pp": 4, "zero_stage": 1, "recompute": "full"})),
        ("falcon-7b-mqa", estimate_body(
            "falcon-7b", cluster_for(a100_80, 8), t(2048, 128),
            {"framework": "deepspeed", "dp": 8, "zero_stage": 3, "recompute": "full"})),
        ("bloom-176b-a100", estimate_body(
            "bloom-176b", cluster_for(a100_80, 448, inter_gbps=25), t(2048, 2048),
            {"framework": "megatron", "dp": 8, "tp": 4, "pp": 14, "zero_stage": 1, "recompute": "full"})),
        ("bloom-176b-ds-pp", estimate_body(
            "bloom-176b", cluster_for(a100_80, 320, inter_gbps=25), t(2048, 2048),
            {"framework": "deepspeed", "dp": 8, "tp": 4, "pp": 10, "zero_stage": 1, "recompute": "full"})),
        ("gpt3-175b-a100", estimate_body(
            "gpt-3-175b", cluster_for(a100_80, 1024, inter_gbps=25), t(2048, 1536, tokens=300 * 10**9),
            {"framework": "megatron", "dp": 16, "tp": 8, "pp": 8, "zero_stage": 1, "recompute": "selective",
             "virtual_pipeline_stages": 2, "sequence_parallel": True}, 1.2)),
        ("custom-gpu-4", estimate_body(
            "llama-3-8b", cluster_for(custom, 4), t(4096, 32, "bf16"),
            {"framework": "fsdp", "dp": 4, "zero_stage": 3, "recompute": "selective_op"})),
        ("custom-gpu-2nodes-gbps", estimate_body(
            "qwen2.5-7b", cluster_for(custom, 16, gpus_per_node=4, inter_gbps=12.5, use_gbps=True),
            t(4096, 64), {"framework": "deepspeed", "dp": 16, "zero_stage": 2})),
        ("intra-override", estimate_body(
            "llama-2-13b", cluster_for(a100_80, 8, intra=100e9), t(4096, 64),
            {"framework": "megatron", "dp": 2, "tp": 4, "zero_stage": 1})),
        ("gas-explicit", estimate_body(
            "llama-3.1-8b", cluster_for(h100, 16, inter_gbps=50), t(8192, 256),
            {"framework": "fsdp", "dp": 16, "zero_stage": 3, "micro_batch_size": 2,
             "gradient_accumulation_steps": 8, "overlap_grad_reduce": False})),
        ("optimizers-lion", estimate_body(
            "qwen2.5-7b", cluster_for(h200, 8), t(4096, 64, optimizer="lion"),
            {"framework": "deepspeed", "dp": 8, "zero_stage": 1})),
        ("optimizers-adafactor", estimate_body(
            "qwen2.5-7b", cluster_for(h200, 8), t(4096, 64, optimizer="adafactor"),
            {"framework": "deepspeed", "dp": 8, "zero_stage": 1})),
        ("optimizers-adamw8bit", estimate_body(
            "qwen2.5-7b", cluster_for(h200, 8), t(4096, 64, optimizer="adamw_8bit"),
            {"framework": "deepspeed", "dp": 8, "zero_stage": 1})),
        ("qwen-0.5b-1gpu-long", estimate_body(
            "qwen2.5-0.5b", cluster_for(l4, 1), t(32768, 8), {"recompute": "full", "chunked_loss": True})),
        ("qwen-72b-does-not-fit", estimate_body(
            "qwen2.5-72b", cluster_for(a100_40, 8), t(4096, 64),
            {"framework": "deepspeed", "dp": 8, "zero_stage": 0})),
        ("stored-h100-pod", estimate_body(
            "llama-3-70b", stored("reg-h100-pod"), t(4096, 128),
            {"framework": "megatron", "dp": 4, "tp": 8, "zero_stage": 1, "offload_optimizer": "cpu",
             "sequence_parallel": True, "recompute": "full"})),
        ("stored-lab", estimate_body(
            "llama-3-8b", stored("reg-lab"), t(2048, 16),
            {"framework": "fsdp", "dp": 4, "zero_stage": 3, "recompute": "full"})),
        ("hf-falcon-40b-tp8", estimate_body(
            "hf-falcon-40b", cluster_for(h100, 32, inter_gbps=50), t(2048, 256),
            {"framework": "megatron", "dp": 2, "tp": 8, "pp": 2, "zero_stage": 1,
             "sequence_parallel": True})),
        ("hf-bloom-7b-alibi", estimate_body(
            "hf-bloom-7b", cluster_for(a100_80, 8), t(2048, 64),
            {"framework": "deepspeed", "dp": 8, "zero_stage": 2, "recompute": "full"})),
        # Qwen2-MoE's dense MLP layers (mlp_only_layers): answered since hf_config reads them
        ("hf-qwen-moe-mlp-only", {**estimate_body(
            "llama-3-8b", cluster_for(h100, 8), t(4096, 64), {"framework": "deepspeed", "dp": 8,
                                                              "zero_stage": 2, "recompute": "full"}),
            "model": {"hf_config": {**HF_QWEN2_MOE, "mlp_only_layers": [0, 1]}}}),
    ]  # fmt: skip
    return [
        Case(f"est-fixed-{i:02d}-{name}", "POST", "/v1/estimates", body)
        for i, (name, body) in enumerate(specs)
    ]


def _divisors(n: int, among: Sequence[int]) -> list[int]:
    return [d for d in among if n % d == 0]


# Each framework's recompute policies, written out rather than read from service.frameworks: the
# corpus must be the same requests for the two code versions it compares, whatever their registries.
RECOMPUTE_OF = {
    "deepspeed": ("none", "full", "full"),
    "fsdp": ("none", "selective_op", "full"),
    "megatron": ("none", "selective", "full"),
}


def random_estimate(rng: random.Random) -> dict[str, Any]:
    """One layout drawn so that it is valid by construction (the rules of the public contract);
    a few still break a rule the draw does not know, and are recorded as 422s."""
    m = rng.choice(MODELS)
    gpu = rng.choice(GPUS)
    framework = rng.choice(FRAMEWORKS)
    precisions = ["bf16", "bf16", "bf16", "fp16", "fp32", "bf16_pure"] + (["fp8", "fp8"] if gpu.fp8 else [])
    if not gpu.bf16:
        precisions = ["fp16", "fp16", "fp32"]
    precision = rng.choice(precisions)
    tp = rng.choice(_divisors(math.gcd(m.heads, m.kv_heads), (1, 1, 2, 4, 8)))
    pp = rng.choice(_divisors(m.layers, (1, 1, 1, 2, 4, 8, 16)))
    attention = rng.choice(("flash", "flash", "flash", "sdpa", "eager"))
    if attention == "flash" and precision == "fp32":
        attention = "sdpa"  # flash takes 16-bit inputs only (a 422); no draw, so later ones stay put
    cp = 1
    if attention != "eager" and rng.random() < 0.2 and (framework != "deepspeed" or m.heads % 2 == 0):
        cp = 2
    big = m.billions >= 60
    dp = rng.choice((1, 2, 4, 8, 16, 32, 64, 128, 256) if big else (1, 1, 2, 4, 8, 16, 32, 64))
    ep = 1
    if m.experts:
        ep = rng.choice([e for e in (1, 2, 4, 8) if m.experts % e == 0 and (dp * cp) % e == 0])
    mbs = rng.choice((1, 1, 1, 2, 4, 8))
    gas = rng.choice((1, 2, 4, 8, 16))
    layout: dict[str, Any] = {"framework": framework, "dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep}
    if framework == "deepspeed":
        zero = rng.choice((0, 1) if pp > 1 else (0, 1, 2, 3))
    elif framework == "megatron":
        zero = rng.choice((0, 1))
    else:
        zero = rng.choice((0, 2, 3))
    layout["zero_stage"] = zero
    if rng.random() < 0.25:
        if framework == "deepspeed" and zero >= 1:
            layout["offload_optimizer"] = rng.choice(("cpu", "nvme"))
            if zero == 3 and rng.random() < 0.5:
                layout["offload_params"] = rng.choice(("cpu", "nvme"))
        elif framework == "megatron" and zero == 1:
            layout["offload_optimizer"] = "cpu"
        elif framework == "fsdp" and zero == 3:
            layout["offload_optimizer"] = layout["offload_params"] = "cpu"
    # each framework's own policies (service.frameworks' capabilities): Megatron's selective is its
    # core attention, FSDP's per-op selective is torchtitan's, DeepSpeed checkpoints whole layers
    layout["recompute"] = rng.choice(RECOMPUTE_OF[framework])
    layout["micro_batch_size"] = mbs
    if rng.random() < 0.5:
        layout["gradient_accumulation_steps"] = gas
    if framework != "deepspeed" and pp > 1 and gas % pp == 0 and rng.random() < 0.5:
        choices = [v for v in (2, 3, 4, 5) if m.layers % (pp * v) == 0]
        if choices:
            layout["virtual_pipeline_stages"] = rng.choice(choices)
    if tp > 1 and rng.random() < 0.6:
        layout["sequence_parallel"] = True
    if tp > 1 and rng.random() < 0.3:
        layout["tp_comm_overlap"] = True
    if rng.random() < 0.15:
        layout["activation_offload"] = True
        if framework == "deepspeed":
            layout["recompute"] = "full"
    if framework == "fsdp" and gas == 1 and rng.random() < 0.4:
        layout["optimizer_in_backward"] = True
    if rng.random() < 0.3:
        layout["chunked_loss"] = True
    overlap = rng.choice((None, None, True, False))
    if overlap is not None:
        layout["overlap_grad_reduce"] = overlap
    if framework == "fsdp" and zero in (2, 3) and rng.random() < 0.3:
        layout["fsdp_hybrid_shard"] = True
    method = "full"
    if rng.random() < 0.25 and not (framework == "megatron" and (tp > 1 or pp > 1)):
        # QLoRA trains data-parallel only (an NF4 base is not sliced: qlora_model_parallel)
        method = rng.choice(("lora", "qlora") if tp == pp == ep == 1 else ("lora", "lora"))
    seq = rng.choice((512, 1024, 2048, 4096, 4096, 8192, 16384, 32768))
    train = training(seq, mbs * dp * gas, precision, optimizer=rng.choice(OPTIMIZERS), attention=attention)
    if method != "full":
        train["method"] = method
        train["lora_rank"] = rng.choice((8, 16, 64, 256))
        train["lora_targets"] = rng.choice(LORA_TARGETS)
    if rng.random() < 0.5:
        train["tokens"] = rng.choice((10**9, 10**10, 3 * 10**11, 15 * 10**12))
    world = dp * tp * pp * cp
    cluster = cluster_for(
        gpu,
        world,
        gpus_per_node=rng.choice((8, 8, 8, 4, 2)),
        inter_gbps=rng.choice((12.5, 25, 50, 100)),
        cpu_bytes=rng.choice((None, None, 0, 256 * GiB, 2 * TiB)),
        nvme_bytes=rng.choice((None, None, 2 * TiB, 30 * TiB)),
        intra=rng.choice((None, None, None, None, 64e9)),
        use_gbps=rng.random() < 0.3,
    )
    cost = rng.choice((None, None, 0.0, 1.1, 2.5, 4.0))
    if "tokens" not in train:
        cost = None  # a price without tokens is refused (it prices the time to train): drawn, unused
    return estimate_body(m, cluster, train, layout, cost)


def plan_body(
    model: ModelChoice | str,
    cluster: dict[str, Any],
    train: dict[str, Any],
    constraints: dict[str, Any] | None = None,
    launchers: Sequence[str] = (),
) -> dict[str, Any]:
    m = MODEL_BY_LABEL[model] if isinstance(model, str) else model
    body: dict[str, Any] = {"model": m.ref, "cluster": cluster, "training": train}
    if constraints is not None:
        body["constraints"] = constraints
    if launchers:
        body["launchers"] = list(launchers)
    return body


def fixed_plans() -> list[Case]:
    h100, a100_40, a100_80 = GPU_BY_NAME["h100"], GPU_BY_NAME["a100-40"], GPU_BY_NAME["a100-80"]
    rtx, l4, v100, mi300 = (
        GPU_BY_NAME["rtx4090"],
        GPU_BY_NAME["l4"],
        GPU_BY_NAME["v100-16"],
        GPU_BY_NAME["mi300x"],
    )
    h200, b200, custom = GPU_BY_NAME["h200"], GPU_BY_NAME["b200"], GPU_BY_NAME["custom"]
    t = training
    specs: list[tuple[str, dict[str, Any]]] = [
        ("readme-llama3-8b-stored", plan_body(
            "llama-3-8b", stored("reg-h100-pod"), t(8192, 512, tokens=10**11),
            {"objective": "throughput", "top_k": 3, "gpu_hour_cost": 2.5},
            ("deepspeed", "accelerate", "megatron", "torchtitan", "slurm", "kubernetes"))),
        ("llama3-8b-all-targets", plan_body(
            "llama-3-8b", cluster_for(h100, 8), t(4096, 64), None, TARGETS)),
        ("llama3-8b-fewest", plan_body(
            "llama-3-8b", cluster_for(h100, 32, inter_gbps=50), t(4096, 256),
            {"objective": "fewest_gpus"}, ("deepspeed", "hf_trainer"))),
        ("llama3-8b-cost", plan_body(
            "llama-3-8b", cluster_for(a100_80, 32, inter_gbps=25), t(4096, 256, tokens=10**11),
            {"objective": "cost", "gpu_hour_cost": 1.8, "top_k": 5}, ("accelerate",))),
        ("llama3-8b-ttt", plan_body(
            "llama-3-8b", cluster_for(a100_80, 32, inter_gbps=25), t(4096, 256, tokens=10**11),
            {"objective": "time_to_train", "max_gpus": 16}, ("slurm", "kubernetes"))),
        ("llama3-70b-megatron-only", plan_body(
            "llama-3-70b", cluster_for(h100, 64, inter_gbps=50), t(8192, 512),
            {"frameworks": ["megatron"], "top_k": 2}, ("megatron", "slurm"))),
        ("llama3-70b-fsdp-only", plan_body(
            "llama-3-70b", cluster_for(h100, 64, inter_gbps=50), t(8192, 512),
            {"frameworks": ["fsdp"]}, ("torchtitan", "accelerate", "kubernetes"))),
        ("llama31-405b-2048", plan_body(
            "llama-3.1-405b", cluster_for(h100, 2048, inter_gbps=50), t(8192, 2048, tokens=15 * 10**12),
            {"objective": "throughput", "frameworks": ["megatron"]}, ("megatron",))),
        ("llama31-405b-max1024", plan_body(
            "llama-3.1-405b", cluster_for(h100, 2048, inter_gbps=50), t(8192, 2048),
            {"objective": "fewest_gpus", "max_gpus": 1024, "frameworks": ["megatron", "fsdp"]})),
        ("mixtral-plan", plan_body(
            "mixtral-8x7b", cluster_for(h100, 16, inter_gbps=50), t(4096, 256),
            None, ("megatron", "deepspeed", "torchtitan"))),
        ("qwen-moe-plan", plan_body(
            "hf-qwen2-moe", cluster_for(a100_80, 8), t(4096, 64), {"top_k": 4})),
        ("arch-moe-plan", plan_body(
            "arch-moe", cluster_for(mi300, 8), t(4096, 128), {"frameworks": ["megatron", "deepspeed"]})),
        ("odd-head-dim-plan", plan_body(
            "arch-odd-head-dim", cluster_for(h100, 64, inter_gbps=50), t(4096, 256, attention="eager"))),
        ("gpt2-1gpu-all-targets", plan_body("gpt2", cluster_for(rtx, 1), t(1024, 32), None, TARGETS)),
        ("custom-gpu-plan", plan_body(
            "qwen2.5-7b", cluster_for(custom, 4), t(4096, 32), {"min_headroom_fraction": 0.1})),
        ("stored-lab-plan", plan_body(
            "llama-3-8b", stored("reg-lab"), t(2048, 32), {"allow_offload": False}, ("accelerate",))),
        ("stored-a100-plan", plan_body(
            "llama-2-13b", stored("reg-a100-40"), t(4096, 64), {"objective": "fewest_gpus"}, ("deepspeed",))),
        # infeasible: suggestions (more GPUs, other GPUs, offload, LoRA / QLoRA)
        ("infeasible-70b-1x4090", plan_body(
            "llama-3-70b", cluster_for(rtx, 1), t(4096, 16), {"allow_offload": False}, TARGETS)),
        ("infeasible-70b-8xl4-host", plan_body(
            "llama-2-70b", cluster_for(l4, 8, cpu_bytes=256 * GiB), t(4096, 64), {"allow_offload": False})),
        ("infeasible-13b-v100-16", plan_body(
            "llama-2-13b", cluster_for(v100, 2), t(4096, 16, "fp16"), {"allow_offload": False})),
        ("infeasible-405b-8xh100", plan_body(
            "llama-3.1-405b", cluster_for(h100, 8), t(8192, 64), {"allow_offload": False})),
        ("infeasible-headroom", plan_body(
            "llama-3-8b", cluster_for(a100_40, 1), t(8192, 8),
            {"min_headroom_fraction": 0.5, "allow_offload": False})),
        ("infeasible-lora-method", plan_body(
            "qwen2.5-72b", cluster_for(l4, 4), t(2048, 16, method="lora"), {"allow_offload": False})),
        ("offload-allowed-8b-4090", plan_body(
            "llama-3-8b", cluster_for(rtx, 2, cpu_bytes=128 * GiB, nvme_bytes=2 * TiB), t(2048, 16),
            {"allow_offload": True}, ("deepspeed", "accelerate"))),
        ("h200-70b-lora", plan_body(
            "llama-3.1-70b", cluster_for(h200, 8), t(8192, 64, method="lora", lora_rank=32),
            {"top_k": 1}, ("hf_trainer", "accelerate"))),
        ("b200-fp8", plan_body(
            "llama-3.1-70b", cluster_for(b200, 64, inter_gbps=100), t(8192, 1024, "fp8", tokens=10**12),
            {"objective": "time_to_train", "gpu_hour_cost": 6.0})),
        ("qwen-0.5b-fp32-eager", plan_body(
            "qwen2.5-0.5b", cluster_for(a100_40, 1), t(2048, 64, "fp32", attention="eager"), {"top_k": 10})),
    ]  # fmt: skip
    return [
        Case(f"plan-fixed-{i:02d}-{name}", "POST", "/v1/plans", body) for i, (name, body) in enumerate(specs)
    ]


# (model label, world sizes that keep the search quick) for the drawn plans
PLAN_POOL: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("gpt2", (1, 2, 4)),
    ("qwen2.5-0.5b", (1, 2, 8)),
    ("gemma-2b", (1, 4, 8)),
    ("phi-3-mini", (2, 4, 8)),
    ("llama-2-7b", (4, 8, 16)),
    ("llama-3-8b", (8, 16, 32)),
    ("mistral-7b", (8, 16)),
    ("qwen2.5-7b", (4, 8, 16)),
    ("falcon-7b", (8, 16)),
    ("llama-2-13b", (8, 16, 32)),
    ("gpt-neox-20b", (16, 32, 64)),
    ("mixtral-8x7b", (8, 16, 32)),
    ("llama-3-70b", (32, 64, 128)),
    ("qwen2.5-72b", (64, 128)),
    ("hf-tinyllama", (1, 2, 8)),
    ("hf-gemma2-9b", (8, 16)),
    ("hf-phi2", (1, 4)),
    ("hf-mistral-nemo", (8, 16)),
    ("hf-phi3-medium", (8, 16)),
    ("hf-qwen2-1.5b", (1, 2, 4)),
    ("arch-gelu", (4, 8)),
    ("arch-parallel", (8, 16)),
)


def random_plan(rng: random.Random) -> dict[str, Any]:
    label, worlds = rng.choice(PLAN_POOL)
    world = rng.choice(worlds)
    gpu = rng.choice([g for g in GPUS if g.name not in ("v100-16",)])
    precisions = ["bf16", "bf16", "fp16", "bf16_pure"] + (["fp8"] if gpu.fp8 else [])
    if not gpu.bf16:
        precisions = ["fp16", "fp32"]
    seq = rng.choice((1024, 2048, 4096, 8192))
    gbs = rng.choice((16, 32, 64, 128, 256)) * max(1, world // 8)
    train = training(seq, gbs, rng.choice(precisions), optimizer=rng.choice(OPTIMIZERS))
    if rng.random() < 0.2:
        train["method"] = rng.choice(("lora", "qlora"))
        train["lora_targets"] = rng.choice(LORA_TARGETS)
    if rng.random() < 0.2:
        train["attention"] = rng.choice(("sdpa", "eager"))
    if rng.random() < 0.5:
        train["tokens"] = rng.choice((10**10, 10**11, 10**12))
    constraints: dict[str, Any] = {
        "objective": rng.choice(("throughput", "fewest_gpus", "cost", "time_to_train"))
    }
    if rng.random() < 0.4:
        constraints["frameworks"] = rng.sample(FRAMEWORKS, rng.choice((1, 2)))
    if rng.random() < 0.3 and world > 1:
        # not far below the cluster: an infeasible job's suggestions search up to 64x the nodes,
        # each search with a 1 s budget that must not run out (it would make answers machine-bound)
        constraints["max_gpus"] = rng.choice([w for w in (1, 2, 4, 8, 16, 24) if world // 4 <= w < world])
    if rng.random() < 0.4:
        constraints["allow_offload"] = rng.random() < 0.5
    if rng.random() < 0.4:
        constraints["min_headroom_fraction"] = rng.choice((0.0, 0.02, 0.1, 0.2))
    if rng.random() < 0.5:
        constraints["top_k"] = rng.choice((1, 2, 5, 8))
    if rng.random() < 0.5:
        constraints["gpu_hour_cost"] = rng.choice((0.8, 2.0, 3.5))
    cluster = cluster_for(
        gpu,
        world,
        inter_gbps=rng.choice((25, 50)),
        cpu_bytes=rng.choice((None, 512 * GiB, 2 * TiB)),
        nvme_bytes=rng.choice((None, None, 8 * TiB)),
    )
    launchers = rng.sample(TARGETS, rng.choice((0, 1, 2, 3, 7)))
    return plan_body(label, cluster, train, constraints, launchers)


def capacity_cases() -> list[Case]:
    t = training
    specs: list[tuple[str, dict[str, Any]]] = [
        ("readme-70b", {
            "model": {"preset": "llama-3-70b"}, "training": t(8192, 1024, tokens=10**12),
            "gpus": ["h100-sxm-80gb", "a100-sxm-80gb", "mi300x-192gb"], "gpu_hour_cost": 2.0}),
        ("8b-price-per-gpu", {
            "model": {"preset": "llama-3-8b"}, "training": t(4096, 512, tokens=10**11),
            "gpus": ["h100-sxm-80gb", "a100-sxm-40gb", "l4-24gb", "rtx-4090-24gb"],
            "gpu_hour_cost": {"h100-sxm-80gb": 2.5, "a100-sxm-40gb": 1.2, "l4-24gb": 0.5}}),
        ("7b-at-gpus", {
            "model": {"preset": "mistral-7b"}, "training": t(4096, 256, tokens=5 * 10**10),
            "gpus": ["h200-sxm-141gb", "b200-sxm-180gb", "v100-sxm2-32gb"], "at_gpus": 64}),
        ("mixtral-gpn4", {
            "model": {"preset": "mixtral-8x7b"}, "training": t(4096, 512, tokens=10**11),
            "gpus": ["h100-sxm-80gb", "mi300x-192gb"], "gpus_per_node": 4, "max_nodes": 64}),
        ("405b-small-max", {
            "model": {"preset": "llama-3.1-405b"}, "training": t(8192, 2048, tokens=15 * 10**12),
            "gpus": ["h100-sxm-80gb", "b200-sxm-180gb"], "max_nodes": 512,
            "constraints": {"frameworks": ["megatron"]}}),
        ("stored-clusters", {
            "model": {"preset": "llama-2-13b"}, "training": t(4096, 256, tokens=10**11),
            "cluster_ids": ["<cluster:reg-h100-pod>", "<cluster:reg-a100-40>", "<cluster:reg-lab>"]}),
        ("qwen-moe-hf-offload", {
            "model": {"hf_config": HF_QWEN2_MOE}, "training": t(4096, 128, tokens=10**10),
            "gpus": ["a100-sxm-40gb", "l40s-48gb"],
            "constraints": {"allow_offload": True, "min_headroom_fraction": 0.1}}),
        ("odd-head-dim-arch", {
            "model": {"architecture": ARCH_ODD_HEAD_DIM}, "training": t(4096, 512, tokens=10**12),
            "gpus": ["h100-sxm-80gb", "a100-sxm-80gb"], "max_nodes": 128}),
        ("gpt2-lora-no-tokens", {
            "model": {"preset": "gpt2"}, "training": t(1024, 64, method="lora"),
            "gpus": ["rtx-3090-24gb", "a10-24gb", "l4-24gb"], "gpus_per_node": 1, "max_nodes": 8}),
        ("gemma-fsdp-fp32", {
            "model": {"preset": "gemma-2b"}, "training": t(2048, 128, "fp32", tokens=10**10),
            "gpus": ["a100-pcie-40gb", "v100-sxm2-16gb", "mi250x-128gb"],
            "constraints": {"frameworks": ["fsdp"], "top_k": 1}, "gpu_hour_cost": 1.0}),
    ]  # fmt: skip
    return [Case(f"cap-{i:02d}-{name}", "POST", "/v1/capacity", body) for i, (name, body) in enumerate(specs)]


def invalid_cases() -> list[Case]:
    h100 = GPU_BY_NAME["h100"]
    ok_train = training(4096, 64)
    ok_layout: dict[str, Any] = {"framework": "deepspeed", "dp": 8, "zero_stage": 2}
    ok_cluster = cluster_for(h100, 8)

    def est(**change: Any) -> dict[str, Any]:
        body = estimate_body("llama-3-8b", ok_cluster, ok_train, ok_layout)
        body.update(copy.deepcopy(change))
        return body

    plan_ok = plan_body("llama-3-8b", ok_cluster, ok_train)
    specs: list[tuple[str, str, dict[str, Any]]] = [
        ("unknown-preset", "/v1/estimates", est(model={"preset": "llama-9-1b"})),
        ("unknown-gpu", "/v1/estimates", est(
            cluster={"gpu": "h900-sxm-1tb", "num_nodes": 1, "gpus_per_node": 8})),
        # a PCIe part has no reference node whose network could stand in (an SXM part's does)
        ("missing-inter-node", "/v1/estimates", est(
            cluster={"gpu": "h100-pcie-80gb", "num_nodes": 2, "gpus_per_node": 4})),
        ("tp-not-dividing-heads", "/v1/estimates", estimate_body(
            "falcon-7b", ok_cluster, ok_train, {"framework": "megatron", "dp": 4, "tp": 2})),
        ("world-size-mismatch", "/v1/estimates", est(layout={"framework": "fsdp", "dp": 4, "zero_stage": 3})),
        ("extra-layout-field", "/v1/estimates", est(layout={**ok_layout, "zero": 2})),
        ("zero-stage-5", "/v1/estimates", est(layout={**ok_layout, "zero_stage": 5})),
        ("two-model-sources", "/v1/estimates", est(model={"preset": "gpt2", "hf_config": HF_TINYLLAMA})),
        ("hf-unsupported-type", "/v1/estimates", est(
            model={"hf_config": {"model_type": "t5", "d_model": 512}})),
        ("seq-len-zero", "/v1/estimates", est(training={**ok_train, "seq_len": 0})),
        ("fp8-on-a100", "/v1/estimates", est(
            cluster=cluster_for(GPU_BY_NAME["a100-80"], 8), training={**ok_train, "precision": "fp8"})),
        ("global-batch-mismatch", "/v1/estimates", est(
            layout={**ok_layout, "micro_batch_size": 2, "gradient_accumulation_steps": 3})),
        ("plan-bad-objective", "/v1/plans", {**plan_ok, "constraints": {"objective": "fastest"}}),
        ("plan-top-k-50", "/v1/plans", {**plan_ok, "constraints": {"top_k": 50}}),
        ("plan-unknown-target", "/v1/plans", {**plan_ok, "launchers": ["ray"]}),
        ("capacity-two-sources", "/v1/capacity", {
            "model": {"preset": "gpt2"}, "training": ok_train, "gpus": ["l4-24gb"], "cluster_ids": ["x"]}),
        ("capacity-negative-price", "/v1/capacity", {
            "model": {"preset": "gpt2"}, "training": ok_train, "gpus": ["l4-24gb"],
            "gpu_hour_cost": {"l4-24gb": -1.0}}),
    ]  # fmt: skip
    return [
        Case(f"invalid-{i:02d}-{name}", "POST", path, body, 422) for i, (name, path, body) in enumerate(specs)
    ]


N_RANDOM_ESTIMATES = 160
N_RANDOM_PLANS = 25


def corpus() -> list[Case]:
    """Every request, in the order it is sent (deterministic: fixed cases, then seeded draws)."""
    rng = random.Random(SEED)
    cases = fixed_estimates()
    cases += [
        Case(f"est-rand-{i:03d}", "POST", "/v1/estimates", random_estimate(rng))
        for i in range(N_RANDOM_ESTIMATES)
    ]
    cases += fixed_plans()
    plan_rng = random.Random(SEED + 1)
    cases += [
        Case(f"plan-rand-{i:02d}", "POST", "/v1/plans", random_plan(plan_rng)) for i in range(N_RANDOM_PLANS)
    ]
    cases += capacity_cases()
    cases += invalid_cases()
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids), "duplicate case ids"
    return cases


def setup_cases() -> list[Case]:
    return [
        Case(f"setup-cluster-{name}", "POST", "/v1/clusters", {"name": name, **spec}, 201)
        for name, spec in STORED_CLUSTERS.items()
    ]


# ---------------------------------------------------------------- recording


def _walk_strings(value: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [_walk_strings(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _walk_strings(v, fn) for k, v in value.items()}
    return value


VOLATILE_KEYS = frozenset({"created_at", "updated_at"})


def _strip_volatile(value: Any, parent: str | None, depth: int) -> Any:
    if isinstance(value, list):
        return [_strip_volatile(v, parent, depth + 1) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if key in VOLATILE_KEYS:
            continue
        if key == "duration_s" and (depth == 0 or parent == "search"):
            continue  # wall time of the search (plans) or of the whole answer (capacity)
        out[key] = _strip_volatile(item, key, depth + 1)
    return out


@dataclass
class Recorder:
    client: Any  # fastapi.testclient.TestClient
    ids: dict[str, str] = field(default_factory=dict)  # created id -> placeholder
    timings: list[tuple[float, str]] = field(default_factory=list)

    def placeholders_in(self, value: Any) -> Any:
        """The body as sent: placeholders of stored resources replaced by their ids."""
        back = {v: k for k, v in self.ids.items()}
        return _walk_strings(value, lambda s: back.get(s, s))

    def normalise(self, value: Any) -> Any:
        def swap(s: str) -> str:
            for real, placeholder in self.ids.items():
                if real in s:
                    s = s.replace(real, placeholder)
            return s

        return _strip_volatile(_walk_strings(value, swap), None, 0)

    def send(self, case: Case) -> dict[str, Any]:
        body = self.placeholders_in(case.body)
        started = time.perf_counter()
        response = self.client.request(case.method, case.path, json=body)
        self.timings.append((time.perf_counter() - started, case.id))
        try:
            payload: Any = response.json()
        except ValueError:
            payload = response.text
        created = (
            response.status_code == 201 and isinstance(payload, dict) and isinstance(payload.get("id"), str)
        )
        if created:
            if case.path == "/v1/clusters":
                self.ids[payload["id"]] = f"<cluster:{case.body['name'] if case.body else case.id}>"
            else:
                self.ids[payload["id"]] = f"<plan:{case.id}>"
        entry: dict[str, Any] = {
            "id": case.id,
            "method": case.method,
            "path": case.path,
            "body": case.body,
            "status": response.status_code,
            "response": self.normalise(payload),
        }
        if case.path == "/v1/plans" and created:
            entry["artifacts"] = self.artifacts(payload)
        return entry

    def artifacts(self, plan: dict[str, Any]) -> dict[str, Any]:
        """Each launcher file of a plan, fetched back raw (their content is what a scheduler runs)."""
        out: dict[str, Any] = {}
        for artifact in plan.get("artifacts", []):
            got = self.client.get(artifact["url"])
            out[artifact["name"]] = {
                "status": got.status_code,
                "media_type": got.headers.get("content-type", ""),
                "content": self.normalise(got.text),
            }
        return out


def migrated_sqlite_url(directory: Path) -> str:
    from alembic import command
    from alembic.config import Config

    url = f"sqlite:///{directory / 'regression.db'}"
    config = Config(toml_file=str(ROOT / "pyproject.toml"))
    config.attributes["database_url"] = url
    command.upgrade(config, "head")
    return url


def record(out: Path, *, only: str | None = None) -> int:
    from fastapi.testclient import TestClient

    from service.main import create_app
    from service.settings import Settings

    cases = corpus()
    if only:
        cases = [c for c in cases if fnmatch.fnmatch(c.id, only)]
    started = time.perf_counter()
    entries: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="trainplan-regression-") as tmp:
        url = migrated_sqlite_url(Path(tmp))
        app = create_app(Settings(database_url=url, log_level="WARNING"))
        with TestClient(app, raise_server_exceptions=False) as client:
            recorder = Recorder(client)
            for case in setup_cases() + cases:
                entries.append(recorder.send(case))
    elapsed = time.perf_counter() - started
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    return report_recording(entries, setup_cases() + cases, recorder.timings, elapsed, out, full=not only)


def report_recording(
    entries: list[dict[str, Any]],
    cases: list[Case],
    timings: list[tuple[float, str]],
    elapsed: float,
    out: Path,
    *,
    full: bool = True,
) -> int:
    counts: Counter[tuple[str, str, int]] = Counter()
    for e in entries:
        counts[(e["method"], e["path"], e["status"])] += 1
    print(f"recorded {len(entries)} requests in {elapsed:.1f} s -> {out}")
    for (method, path, status), n in sorted(counts.items()):
        print(f"  {method} {path:16} {status}: {n}")
    problems = 0
    expected = {c.id: c.expect for c in cases}
    for e in entries:
        want = expected.get(e["id"])
        if e["status"] >= 500:
            problems += 1
            print(f"ERROR {e['id']}: status {e['status']}: {e['response']}")
        elif want is not None and e["status"] != want:
            problems += 1
            print(f"ERROR {e['id']}: status {e['status']}, expected {want}")
        response = e["response"]
        search = response.get("search") if isinstance(response, dict) else None
        if isinstance(search, dict) and search.get("truncated"):
            problems += 1
            print(f"WARNING {e['id']}: search.truncated: the answer depends on the machine's speed")
    ok_estimates = counts[("POST", "/v1/estimates", 200)]
    if full and ok_estimates < 150:
        problems += 1
        print(f"WARNING only {ok_estimates} estimates answered 200 (want >= 150)")
    slow = sorted(timings, reverse=True)[:5]
    print("slowest: " + ", ".join(f"{case_id} {s:.2f} s" for s, case_id in slow))
    return 1 if problems else 0


# ---------------------------------------------------------------- comparing


@dataclass(frozen=True, slots=True)
class Difference:
    path: str
    a: Any
    b: Any
    note: str = ""


@dataclass(frozen=True, slots=True)
class Tolerance:
    rel_tol: float
    abs_bytes: int
    ignore: tuple[str, ...]


MISSING = "<missing>"


def _is_byte_field(key: str | None, parent: str | None) -> bool:
    return key is not None and (key.endswith("bytes") or parent == "per_gpu")


def _numbers_equal(a: float, b: float, rel_tol: float) -> bool:
    if a == b or (math.isnan(a) and math.isnan(b)):
        return True
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= rel_tol * max(abs(a), abs(b))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def diff_values(
    a: Any, b: Any, path: str, tol: Tolerance, key: str | None = None, parent: str | None = None
) -> Iterator[Difference]:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{k}" if path else str(k)
            if k not in a:
                yield Difference(sub, MISSING, b[k])
            elif k not in b:
                yield Difference(sub, a[k], MISSING)
            else:
                yield from diff_values(a[k], b[k], sub, tol, str(k), key)
        return
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b) and all(isinstance(x, str) for x in a + b):
            # warnings, assumptions, rationale: one difference naming what went and what came
            gone, came = [x for x in a if x not in b], [x for x in b if x not in a]
            yield Difference(path, a, b, f"{len(a)} -> {len(b)} items; removed {gone}; added {came}")
            return
        for i in range(max(len(a), len(b))):
            sub = f"{path}[{i}]"
            if i >= len(a):
                yield Difference(sub, MISSING, b[i])
            elif i >= len(b):
                yield Difference(sub, a[i], MISSING)
            else:
                yield from diff_values(a[i], b[i], sub, tol, key, parent)
        return
    if _is_number(a) and _is_number(b):
        if isinstance(a, int) and isinstance(b, int):
            slack = tol.abs_bytes if _is_byte_field(key, parent) else 0
            if abs(a - b) > slack:
                yield Difference(path, a, b, "" if key is None else f"delta {b - a:+d}")
            return
        if type(a) is not type(b):
            yield Difference(path, a, b, f"type {type(a).__name__} -> {type(b).__name__}")
        elif not _numbers_equal(float(a), float(b), tol.rel_tol):
            rel = abs(b - a) / max(abs(a), abs(b)) if max(abs(a), abs(b)) else math.inf
            yield Difference(path, a, b, f"rel {rel:.3g}")
        return
    if type(a) is not type(b) or a != b:
        yield Difference(path, a, b)


def _ignored(case_id: str, path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(f"{case_id}:{path}", p) for p in patterns)


def _top_field(path: str) -> str:
    """response.memory.per_gpu.total -> memory; status -> status; artifacts.x -> artifacts."""
    parts = path.replace("[", ".[").split(".")
    if parts[0] == "response" and len(parts) > 1:
        return parts[1] if not parts[1].startswith("[") else "response"
    return parts[0]


def _show(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 300 else text[:300] + f"... ({len(text)} chars)"


def _print_difference(d: Difference) -> None:
    if isinstance(d.a, str) and isinstance(d.b, str) and ("\n" in d.a or "\n" in d.b):
        print(f"    {d.path}: text differs")
        lines = difflib.unified_diff(d.a.splitlines(), d.b.splitlines(), "A", "B", lineterm="", n=1)
        for line in list(lines)[:40]:
            print(f"      {line}")
        return
    if isinstance(d.a, list) and isinstance(d.b, list) and d.note:
        print(f"    {d.path}: {d.note}")
        return
    note = f"  ({d.note})" if d.note else ""
    print(f"    {d.path}: {_show(d.a)} -> {_show(d.b)}{note}")


def compare(path_a: Path, path_b: Path, tol: Tolerance) -> int:
    a_entries: list[dict[str, Any]] = json.loads(path_a.read_text())
    b_entries: list[dict[str, Any]] = json.loads(path_b.read_text())
    a_by_id = {e["id"]: e for e in a_entries}
    b_by_id = {e["id"]: e for e in b_entries}
    order = [e["id"] for e in a_entries] + [e["id"] for e in b_entries if e["id"] not in a_by_id]
    identical = 0
    differing: list[str] = []
    only_one: list[str] = []
    per_field_values: Counter[str] = Counter()
    per_field_requests: Counter[str] = Counter()
    for case_id in order:
        a, b = a_by_id.get(case_id), b_by_id.get(case_id)
        if a is None or b is None:
            only_one.append(case_id)
            print(f"{case_id}: only in {path_a if b is None else path_b}")
            continue
        diffs: list[Difference] = []
        for key in ("method", "path", "body"):
            if a.get(key) != b.get(key):
                diffs.append(Difference(key, a.get(key), b.get(key), "the request differs: corpus changed"))
        for key in ("status", "response", "artifacts"):
            diffs += diff_values(a.get(key), b.get(key), key, tol)
        diffs = [d for d in diffs if not _ignored(case_id, d.path, tol.ignore)]
        if not diffs:
            identical += 1
            continue
        differing.append(case_id)
        print(f"{case_id}  ({a['method']} {a['path']}, status {a['status']} -> {b['status']}): {len(diffs)}")
        fields = set()
        for d in diffs:
            _print_difference(d)
            top = _top_field(d.path)
            per_field_values[top] += 1
            fields.add(top)
        per_field_requests.update(fields)
    total = identical + len(differing)
    print()
    print(f"compared {total} requests: {identical} identical, {len(differing)} differing", end="")
    print(f", {len(only_one)} in only one recording" if only_one else "")
    print(f"(rel_tol {tol.rel_tol:g}, abs_bytes {tol.abs_bytes}, ignored {list(tol.ignore) or 'nothing'})")
    if per_field_values:
        print("differing values per top-level field (values / requests):")
        for name, n in per_field_values.most_common():
            print(f"  {name:24} {n:6} / {per_field_requests[name]}")
    by_endpoint: dict[str, int] = defaultdict(int)
    for case_id in differing:
        by_endpoint[a_by_id[case_id]["path"]] += 1
    if by_endpoint:
        print(
            "differing requests per endpoint: "
            + ", ".join(f"{p} {n}" for p, n in sorted(by_endpoint.items()))
        )
    return 1 if differing or only_one else 0


# ---------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m validation.regression", description=(__doc__ or "").split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="send the corpus to an in-process app and write the answers")
    rec.add_argument("--out", type=Path, required=True, help="JSON file to write")
    rec.add_argument("--only", help="record only the case ids matching this glob (for debugging)")
    cmp_ = sub.add_parser("compare", help="compare two recordings; exit 1 when anything differs")
    cmp_.add_argument("a", type=Path)
    cmp_.add_argument("b", type=Path)
    cmp_.add_argument("--rel-tol", type=float, default=1e-9, help="relative tolerance on floats")
    cmp_.add_argument("--abs-bytes", type=int, default=0, help="allowed difference of integer byte fields")
    cmp_.add_argument(
        "--ignore", action="append", default=[], metavar="GLOB", help="skip paths like 'response.search.*'"
    )
    sub.add_parser("list", help="print the corpus ids, endpoint by endpoint")
    args = parser.parse_args(argv)
    if args.command == "record":
        return record(args.out, only=args.only)
    if args.command == "compare":
        return compare(args.a, args.b, Tolerance(args.rel_tol, args.abs_bytes, tuple(args.ignore)))
    cases = setup_cases() + corpus()
    for case in cases:
        print(f"{case.id:48} {case.method} {case.path}")
    print(Counter(c.path for c in cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
