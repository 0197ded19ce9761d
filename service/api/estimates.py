"""POST /v1/estimates: every number for one layout; nothing is stored."""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter

from service.api.calibration import calibration_for, calibration_out, hardware_key
from service.api.clusters import record_fields
from service.api.deps import ClusterRepoDep, PlanRepoDep
from service.api.problems import PROBLEM_RESPONSES
from service.api.schemas.clusters import ClusterCreate, ClusterRef
from service.api.schemas.estimates import (
    EstimateOut,
    EstimateRequest,
    LimitsOut,
    MemoryOut,
    MemoryPerGPUOut,
    TimeBreakdownOut,
    TimeOut,
)
from service.catalog.efficiency import default_efficiency
from service.errors import Unprocessable
from service.estimator import estimate
from service.estimator.calibration import Calibration
from service.estimator.errors import EstimatorError
from service.estimator.params import parameter_counts
from service.estimator.step_time import cost
from service.estimator.types import ClusterSpec, Estimate, Layout, ModelSpec, TrainingSpec
from service.persistence.repository import ClusterRepository, PlanRepository

router = APIRouter(prefix="/v1/estimates", tags=["estimates"], responses=PROBLEM_RESPONSES)


def resolve_cluster(cluster: object, repo: ClusterRepository) -> ClusterSpec:
    """A stored cluster id or an inline cluster -> ClusterSpec; an unknown id is a 422 naming it."""
    if isinstance(cluster, ClusterRef):
        record = repo.get(cluster.id)
        if record is None:
            raise Unprocessable(
                f"cluster {cluster.id!r} does not exist",
                errors=[
                    {
                        "field": "cluster.id",
                        "message": "no stored cluster has this id",
                        "type": "unknown_cluster",
                    }
                ],
            )
        return ClusterCreate.model_validate(record_fields(record)).to_domain()
    assert hasattr(cluster, "to_domain")
    spec: ClusterSpec = cluster.to_domain()
    return spec


def estimate_out(
    result: Estimate,
    layout: Layout,
    training: TrainingSpec,
    total_parameters: int,
    gpu_hour_cost: float | None,
    calibration: Calibration | None = None,
) -> EstimateOut:
    memory, time = result.memory, result.time
    per_gpu = memory.per_gpu
    time_out = None
    if time is not None:
        breakdown = TimeBreakdownOut(**dataclasses.asdict(time.breakdown))
        time_out = TimeOut(
            step_s=time.step_s,
            tokens_per_s=time.tokens_per_s,
            tflops_per_gpu=time.tflops_per_gpu,
            mfu=time.mfu,
            hardware_tflops_per_gpu=time.hardware_tflops_per_gpu,
            hfu=time.hfu,
            breakdown=breakdown,
        )
    cost_to_train = None
    if gpu_hour_cost is not None and result.time_to_train_s is not None:
        cost_to_train = cost(result.time_to_train_s, layout.world_size, gpu_hour_cost)
    resolved = dataclasses.replace(
        layout, gradient_accumulation_steps=layout.accumulation_steps(training.global_batch_size)
    )
    return EstimateOut(
        fits=result.fits,
        memory=MemoryOut(
            per_gpu=MemoryPerGPUOut(**dataclasses.asdict(per_gpu), total=per_gpu.total),
            capacity_bytes=memory.capacity_bytes,
            headroom_bytes=memory.headroom_bytes,
            cpu_per_node_bytes=memory.cpu_per_node_bytes,
            nvme_per_node_bytes=memory.nvme_per_node_bytes,
        ),
        time=time_out,
        limits=LimitsOut(max_micro_batch_size=result.max_micro_batch_size, max_seq_len=result.max_seq_len),
        time_to_train_s=result.time_to_train_s,
        cost_to_train=cost_to_train,
        layout=dataclasses.asdict(resolved),
        parameters_total=total_parameters,
        warnings=list(result.warnings),
        assumptions=list(result.assumptions),
        calibration=calibration_out(calibration) if calibration else None,
    )


TRAINING_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainingSpec))
LAYOUT_FIELDS = frozenset(f.name for f in dataclasses.fields(Layout))


def located(exc: EstimatorError) -> EstimatorError:
    """The same error with its field named as the request body names it (layout.tp, training.seq_len)."""
    field = exc.field or ""
    if field in LAYOUT_FIELDS:
        field = f"layout.{field}"
    elif field in TRAINING_FIELDS:
        field = f"training.{field}"
    return type(exc)(exc.message, rule=exc.rule, field=field or None)


def calibrated_estimate(
    plans: PlanRepository, model: ModelSpec, cluster: ClusterSpec, layout: Layout, training: TrainingSpec
) -> tuple[Estimate, Calibration]:
    """The estimate with the factors learned from runs on this hardware and framework applied."""
    calibration = calibration_for(plans, hardware_key(cluster), layout.framework.value)
    try:
        result = estimate(
            model, cluster, layout, training, efficiency=default_efficiency(), calibration=calibration
        )
    except EstimatorError as exc:
        raise located(exc) from exc
    return result, calibration


@router.post("", response_model=EstimateOut)
def create_estimate(body: EstimateRequest, clusters: ClusterRepoDep, plans: PlanRepoDep) -> EstimateOut:
    model = body.model.to_domain()
    cluster = resolve_cluster(body.cluster, clusters)
    training = body.training.to_domain()
    layout = body.layout.to_domain()
    result, calibration = calibrated_estimate(plans, model, cluster, layout, training)
    return estimate_out(
        result, layout, training, parameter_counts(model).total, body.gpu_hour_cost, calibration
    )
