"""One layout's numbers for the estimator tests, the way the estimator computes them.

Each helper builds a fresh job (``make_job``: empty memos, so no test sees what another one
memoised) and asks ``service.estimator.evaluate``, the one place the parts are summed, or the part
functions of ``memory`` and ``activations``. ``tuning`` defaults to the catalog's.
"""

from __future__ import annotations

from service.catalog.tuning import default_tuning
from service.estimator import activations, evaluate
from service.estimator import memory as memory_parts
from service.estimator.job import Job, make_job
from service.estimator.model_states import ModelStates
from service.estimator.tuning import Tuning
from service.estimator.types import (
    ClusterSpec,
    Layout,
    MemoryEstimate,
    ModelSpec,
    TimeEstimate,
    TrainingSpec,
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
    layer = activations.layer_activations(job(model, cluster, training), layout)
    in_flight = activations.micro_batches_in_flight(layout, rank, micro_batches)
    return activations.stage_activation_bytes(model, layout, layer, rank, in_flight)
