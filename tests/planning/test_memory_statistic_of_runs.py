"""A run's peak is compared with the estimate's figure of the same statistic: a log that prints
PyTorch's max reserved (torchtitan, Megatron) or max allocated (DeepSpeed), or a typed peak that says
it is one of those (memory_statistic), is diagnosed against peak reserved / peak allocated, and
calibrates as the device memory it implies (plus the CUDA context, NCCL's buffers and TE's
userbuffers the estimate counts outside the allocator), exactly as a typed nvidia-smi figure of that
much would. A typed peak that does not say is taken as device used, and the diagnosis says it assumed so."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service import planning
from service.contracts.plans import PlanRequest, RunIn
from service.contracts.results import RunDiagnosis, StoredLayout
from service.estimator.types import MemoryStatistic
from service.feedback import diagnose, estimated_peak
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
    left_out = per_gpu.device_used_bytes - per_gpu.peak_reserved_bytes  # outside the allocator
    assert (
        left_out
        == (per_gpu.cuda_context or 0) + (per_gpu.nccl_buffers or 0) + (per_gpu.tp_comm_buffers or 0)
        > 0
    )

    reserved = per_gpu.peak_reserved_bytes + GIB // 2
    logged = RunRecord(
        peak_memory_bytes_per_gpu=reserved,
        out_of_memory=False,
        framework_version="",
        notes="",
        diagnosis={},
        memory_statistic="reserved",
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
        memory_statistic="allocated",
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
    # a typed peak that does not say which it is: device used, and the diagnosis says so
    assert typed.memory_statistic is None
    assert typed.diagnosis["memory_statistic"] == "device_used"
    assert typed.diagnosis["memory_statistic_assumed"] is True
    assert any("memory_statistic allocated or reserved" in a for a in typed.diagnosis["advice"])
    assert typed.diagnosis["estimated_peak_memory_bytes_per_gpu"] == per_gpu.device_used_bytes
    assert typed.diagnosis["memory_error"] == 0
    # a stored run read as reserved bytes: its statistic read from its column
    stored = PlanRepository(session).run(typed.id)
    assert stored is not None
    stored.memory_statistic = "reserved"

    assert per_gpu.peak_reserved_bytes is not None and per_gpu.peak_allocated_bytes is not None
    reserved, allocated = MemoryStatistic.RESERVED, MemoryStatistic.ALLOCATED
    assert estimated_peak(per_gpu, reserved) == (reserved, per_gpu.peak_reserved_bytes)
    assert estimated_peak(per_gpu, allocated) == (allocated, per_gpu.peak_allocated_bytes)
    assert estimated_peak(per_gpu, None) == (MemoryStatistic.DEVICE_USED, per_gpu.device_used_bytes)
    # a plan stored before the statistics were named has only device used: compared as that
    old = per_gpu.model_copy(update={"peak_allocated_bytes": None, "peak_reserved_bytes": None})
    assert estimated_peak(old, allocated) == (MemoryStatistic.DEVICE_USED, per_gpu.device_used_bytes)
    layout = plan.recommended.layout
    diagnosis = diagnose(
        observed(stored), plan.recommended.estimate, StoredLayout.model_validate(layout), 64 * 1024
    )
    assert diagnosis.memory_statistic == "reserved" and diagnosis.memory_statistic_assumed is False
    assert not any("memory_statistic" in a for a in diagnosis.advice)
    assert diagnosis.estimated_peak_memory_bytes_per_gpu == per_gpu.peak_reserved_bytes
    assert (
        diagnosis.memory_error
        == (per_gpu.device_used_bytes - per_gpu.peak_reserved_bytes) / per_gpu.peak_reserved_bytes
    )


def test_a_typed_allocated_peak_calibrates_as_the_device_memory_it_implies(session: Session) -> None:
    """The same bytes posted as torch.cuda.max_memory_allocated() and as nvidia-smi's figure are two
    different runs: the allocated one is the estimate's peak allocated exactly (no error, the
    factor stays 1), the device-used one reads low by the CUDA context, NCCL's buffers and
    fragmentation (a factor below 1)."""
    record = stored_plan(session)
    plan = planning.plan_out(record)
    assert plan.recommended is not None
    per_gpu = plan.recommended.estimate.memory.per_gpu
    assert per_gpu.peak_allocated_bytes is not None
    peak = per_gpu.peak_allocated_bytes
    as_allocated = planning.add_run(
        session, plan.id, RunIn(peak_memory_bytes_per_gpu=peak, memory_statistic=MemoryStatistic.ALLOCATED)
    ).value
    assert as_allocated.memory_statistic == "allocated"
    assert as_allocated.diagnosis["memory_statistic"] == "allocated"
    assert as_allocated.diagnosis["memory_statistic_assumed"] is False
    assert as_allocated.diagnosis["estimated_peak_memory_bytes_per_gpu"] == peak
    assert as_allocated.diagnosis["memory_error"] == 0
    stored = PlanRepository(session).run(as_allocated.id)
    assert stored is not None and stored.memory_statistic == "allocated"
    seen = observation(stored, record)
    assert seen is not None and seen.measured_peak_bytes == per_gpu.device_used_bytes

    as_device_used = RunRecord(
        peak_memory_bytes_per_gpu=peak, out_of_memory=False, framework_version="", notes="", diagnosis={}
    )
    low = observation(as_device_used, record)
    assert low is not None and low.measured_peak_bytes == peak < per_gpu.device_used_bytes


def test_diagnoses_stored_before_version_2_read_in_the_estimates_words() -> None:
    """Version 1 named a log's reading (max_reserved) and nothing for a typed peak (compared as
    device used): read back as the statistic compared, the typed one as assumed."""
    logged = RunDiagnosis.read({"version": 1, "memory_statistic": "max_reserved"})
    assert logged.memory_statistic is MemoryStatistic.RESERVED and logged.memory_statistic_assumed is False
    typed = RunDiagnosis.read({"version": 1, "memory_statistic": None, "memory_error": -0.2})
    assert typed.memory_statistic is MemoryStatistic.DEVICE_USED and typed.memory_statistic_assumed is True
    before_versions = RunDiagnosis.read({"memory_error": 0.1})
    assert before_versions.memory_statistic is MemoryStatistic.DEVICE_USED
    assert before_versions.memory_statistic_assumed is True
    # a run without a peak compared nothing: nothing was assumed
    assert RunDiagnosis.read({"version": 1, "memory_error": None}).memory_statistic_assumed is False
    # read and stored again, it reads the same
    assert RunDiagnosis.read(typed.stored()) == typed
