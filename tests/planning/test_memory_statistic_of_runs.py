"""A run's peak is compared with the estimate's figure of the same statistic: a log that prints
PyTorch's max reserved (torchtitan, Megatron) or max allocated (DeepSpeed) is diagnosed against peak
reserved / peak allocated, and calibrates as the device memory it implies (plus the CUDA context and
NCCL's buffers the estimate counts outside the allocator), exactly as a typed nvidia-smi figure of
that much would."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service import planning
from service.contracts.plans import PlanRequest, RunIn
from service.contracts.results import StoredLayout
from service.feedback import diagnose, estimated_peak_bytes
from service.persistence.models import RunRecord
from service.persistence.repository import PlanRepository
from service.planning.calibration import observation, observed
from tests.planning.test_results_contract import BODY, stored_plan

GIB = 2**30


def test_a_reserved_peak_is_diagnosed_against_peak_reserved_and_calibrates_as_device_used(
    session: Session,
) -> None:
    record = stored_plan(session)
    plan = planning.plan_out(record)
    assert plan.recommended is not None
    per_gpu = plan.recommended.estimate.memory.per_gpu
    assert per_gpu.peak_reserved_bytes is not None and per_gpu.peak_allocated_bytes is not None
    left_out = per_gpu.device_used_bytes - per_gpu.peak_reserved_bytes  # CUDA context + NCCL buffers
    assert left_out == (per_gpu.cuda_context or 0) + (per_gpu.nccl_buffers or 0) > 0

    reserved = per_gpu.peak_reserved_bytes + GIB // 2
    logged = RunRecord(
        peak_memory_bytes_per_gpu=reserved,
        out_of_memory=False,
        framework_version="",
        notes="",
        diagnosis={},
        source={"format": "torchtitan", "memory_statistic": "max_reserved"},
    )
    typed = RunRecord(
        peak_memory_bytes_per_gpu=reserved + left_out,
        out_of_memory=False,
        framework_version="",
        notes="",
        diagnosis={},
    )
    from_log, from_typed = observation(logged, record), observation(typed, record)
    assert from_log is not None and from_typed is not None
    assert from_log.measured_peak_bytes == from_typed.measured_peak_bytes == reserved + left_out

    # allocated bytes leave out the allocator's fragmentation too
    allocated = RunRecord(
        peak_memory_bytes_per_gpu=per_gpu.peak_allocated_bytes,
        out_of_memory=False,
        framework_version="",
        notes="",
        diagnosis={},
        source={"format": "deepspeed", "memory_statistic": "max_allocated"},
    )
    seen = observation(allocated, record)
    assert seen is not None and seen.measured_peak_bytes == per_gpu.device_used_bytes


def test_the_diagnosis_names_the_statistic_and_its_error_is_against_the_same_one(session: Session) -> None:
    plan = planning.create_plan(session, PlanRequest.model_validate(BODY)).value
    assert plan.recommended is not None
    per_gpu = plan.recommended.estimate.memory.per_gpu
    typed = planning.add_run(
        session, plan.id, RunIn(peak_memory_bytes_per_gpu=per_gpu.device_used_bytes)
    ).value
    assert typed.diagnosis["memory_statistic"] is None
    assert typed.diagnosis["estimated_peak_memory_bytes_per_gpu"] == per_gpu.device_used_bytes
    assert typed.diagnosis["memory_error"] == 0
    # a stored log run: its statistic read from its source
    stored = PlanRepository(session).run(typed.id)
    assert stored is not None
    stored.source = {"format": "torchtitan", "memory_statistic": "max_reserved"}

    assert per_gpu.peak_reserved_bytes is not None
    assert estimated_peak_bytes(per_gpu, "max_reserved") == per_gpu.peak_reserved_bytes
    assert estimated_peak_bytes(per_gpu, "allocated") == per_gpu.peak_allocated_bytes
    assert estimated_peak_bytes(per_gpu, "device_used") == per_gpu.device_used_bytes
    layout = plan.recommended.layout
    diagnosis = diagnose(
        observed(stored), plan.recommended.estimate, StoredLayout.model_validate(layout), 64 * 1024
    )
    assert diagnosis.memory_statistic == "max_reserved"
    assert diagnosis.estimated_peak_memory_bytes_per_gpu == per_gpu.peak_reserved_bytes
    assert (
        diagnosis.memory_error
        == (per_gpu.device_used_bytes - per_gpu.peak_reserved_bytes) / per_gpu.peak_reserved_bytes
    )
