"""One layout's numbers for the estimator tests, the way the estimator computes them.

Each helper builds a fresh job (``make_job``: empty memos, so no test sees what another one
memoised) and asks ``service.estimator.evaluate``, the one place the parts are summed, or the part
functions of ``memory`` and ``activations``. ``tuning`` defaults to the catalog's.
"""

from __future__ import annotations

from service.catalog.tuning import default_tuning
from service.estimator import activations, evaluate, model_states, pipeline
from service.estimator import memory as memory_parts
from service.estimator.job import Job, make_job, rank_kind_counts
from service.estimator.model_states import ModelStates, RankParameters
from service.estimator.params import parameter_counts
from service.estimator.tuning import Tuning
from service.estimator.types import (
    ClusterSpec,
    GPUSpec,
    Layout,
    MemoryEstimate,
    ModelSpec,
    MoESpec,
    PeakFlops,
    TimeEstimate,
    TrainingSpec,
)

# a cluster and training for the helpers that need a job but read neither
ONE_GPU = ClusterSpec(
    gpu=GPUSpec(
        name="any",
        memory_bytes=2**30,
        peak_flops_per_s=PeakFlops(fp32=1e12, bf16=1e12, fp16=1e12),
        hbm_bandwidth_bytes_per_s=1e12,
        intra_node_bandwidth_bytes_per_s=1e11,
        pcie_bandwidth_bytes_per_s=1e10,
    ),
    num_nodes=1,
    gpus_per_node=1,
    intra_node_bandwidth_bytes_per_s=1e11,
    inter_node_bandwidth_bytes_per_s=1e10,
)
SHORT = TrainingSpec(seq_len=16, global_batch_size=1)
# Qwen3-30B-A3B's MoE block on a small trunk: 128 experts of 768, 8 active, h 2048
FINE_MOE = ModelSpec(
    name="fine-moe",
    num_layers=4,
    hidden_size=2048,
    num_attention_heads=32,
    num_kv_heads=4,
    head_dim=128,
    ffn_hidden_size=6144,
    vocab_size=32000,
    moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=768),
)


def job(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, tuning: Tuning | None = None) -> Job:
    """A new job (empty memos) under ``tuning``, the catalog's by default."""
    return make_job(model, cluster, training, default_tuning() if tuning is None else tuning)


def memory(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    training: TrainingSpec,
    tuning: Tuning | None = None,
) -> MemoryEstimate:
    """Per-GPU memory of the most loaded rank, host and NVMe per node (``evaluate.memory_estimate``)."""
    return evaluate.memory_estimate(job(model, cluster, training, tuning), layout)


def time(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    training: TrainingSpec,
    tuning: Tuning | None = None,
) -> TimeEstimate:
    """Step time, throughput and utilisation (``evaluate.time_estimate``)."""
    return evaluate.time_estimate(job(model, cluster, training, tuning), layout)


def fits(model: ModelSpec, cluster: ClusterSpec, layout: Layout, training: TrainingSpec) -> bool:
    """Whether the layout fits the GPU's whole capacity and the node's host RAM and NVMe."""
    return evaluate.fits(job(model, cluster, training), layout)


def states(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, training: TrainingSpec, rank: int = 0
) -> ModelStates:
    """Weights, gradients and optimizer states of pipeline rank ``rank`` after sharding and offload."""
    return memory_parts.rank_states(job(model, cluster, training), layout, rank).states


def stage_activation_bytes(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    training: TrainingSpec,
    rank: int,
    micro_batches: int,
) -> int:
    """Activations pipeline rank ``rank`` holds at its peak with ``micro_batches`` per step."""
    j = job(model, cluster, training)
    layer = activations.layer_activations(j, layout)
    in_flight = activations.micro_batches_in_flight(layout, rank, micro_batches)
    recomputed = pipeline.rank_recomputed_fractions(model.num_layers, layout)
    per_micro = activations.rank_micro_batch_bytes(layer, rank_kind_counts(j, layout)[rank], recomputed[rank])
    return activations.stage_activation_bytes(layout, layer, per_micro, rank, in_flight)


def rank_parameters(model: ModelSpec, layout: Layout, rank: int) -> RankParameters:
    """``model_states.rank_parameters`` of pipeline rank ``rank`` under the layout's split."""
    layers = rank_kind_counts(job(model, ONE_GPU, SHORT), layout)[rank]
    return model_states.rank_parameters(model, parameter_counts(model), layout, rank, layers)
