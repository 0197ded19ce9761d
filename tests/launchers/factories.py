"""Plain factory functions for launcher tests: a small Llama-like model, Llama-3-8B, 8 x H100 nodes."""

from __future__ import annotations

from typing import Any

from service.estimator.types import (
    ClusterSpec,
    GPUSpec,
    Layout,
    ModelSpec,
    PeakFlops,
    Plan,
    RopeScaling,
    RopeScalingKind,
    TrainingSpec,
)


def h100() -> GPUSpec:
    return GPUSpec(
        name="H100-SXM-80GB",
        memory_bytes=80 * 2**30,
        peak_flops_per_s=PeakFlops(fp32=67e12, bf16=989e12, fp16=989e12),
        hbm_bandwidth_bytes_per_s=3.35e12,
        intra_node_bandwidth_bytes_per_s=450e9,
        pcie_bandwidth_bytes_per_s=64e9,
    )


def cluster(nodes: int = 1) -> ClusterSpec:
    return ClusterSpec(
        gpu=h100(),
        num_nodes=nodes,
        gpus_per_node=8,
        intra_node_bandwidth_bytes_per_s=450e9,
        inter_node_bandwidth_bytes_per_s=50e9,
        cpu_memory_bytes_per_node=2 * 2**40,
        nvme_bytes_per_node=8 * 10**12,
    )


def small_llama() -> ModelSpec:
    """A 16-layer Llama-style model (~0.4B parameters): GQA, SwiGLU, RMSNorm, RoPE, untied."""
    return ModelSpec(
        name="tiny-llama-0.4b",
        family="llama",
        num_layers=16,
        hidden_size=1024,
        num_attention_heads=16,
        num_kv_heads=4,
        ffn_hidden_size=2816,
        vocab_size=32000,
        max_position_embeddings=4096,
        rope_theta=10000.0,  # Llama 2's
        norm_eps=1e-5,
    )


def llama3_8b() -> ModelSpec:
    """Llama-3.1-8B's shape, which torchtitan registers as llama3/llama3_8b."""
    return ModelSpec(
        name="llama-3.1-8b",
        family="llama",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        ffn_hidden_size=14336,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=RopeScaling(
            kind=RopeScalingKind.LLAMA3,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        norm_eps=1e-5,
    )


def training(**overrides: Any) -> TrainingSpec:
    values: dict[str, Any] = {"seq_len": 4096, "global_batch_size": 256}
    return TrainingSpec(**(values | overrides))


def plan(
    *,
    nodes: int = 1,
    model: ModelSpec | None = None,
    train: TrainingSpec | None = None,
    **layout: Any,
) -> Plan:
    """A plan on `nodes` x 8 GPUs; dp defaults to whatever tp*pp*cp leaves."""
    world = 8 * nodes
    split = layout.get("tp", 1) * layout.get("pp", 1) * layout.get("cp", 1)
    layout.setdefault("dp", world // split)
    return Plan(
        model=model or small_llama(),
        cluster=cluster(nodes),
        training=train or training(),
        layout=Layout(**layout),
    )
