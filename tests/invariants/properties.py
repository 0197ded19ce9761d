"""Issue 24's estimator invariants on one ``Case``, shared by the hypothesis tests
(tests/invariants/test_estimator_invariants.py) and the sweep (bench/invariant_sweep.py).

Each property returns None when it holds, the violation in words when it does not, and raises
``NotApplicable`` when the case has no partner to compare with (a doubled micro-batch that does not
divide the batch, no higher ZeRO stage, ...): hypothesis then draws another case.
"""

from __future__ import annotations

import dataclasses

from service.catalog.tuning import default_tuning
from service.estimator.calibration import Calibration
from service.estimator.estimate import estimate
from service.estimator.job import make_job
from service.estimator.memory import gradients_follow_activations
from service.estimator.model_states import MIXED
from service.estimator.types import Framework, GPUSpec, Method, Precision
from service.estimator.validate import FRAMEWORK_CAPABILITIES
from tests.invariants.cases import PEFT_FRAMEWORKS, Case, model_states, peak_of

# The highest model FLOPs utilisation published for end-to-end LLM training that we know of:
# FlashAttention-2 (Dao, arXiv:2307.08691, abstract and §4.3) "reaches training speed of up to
# 225 TFLOPs/s per A100 GPU (72% model FLOPs utilization)" for GPT-style models, FLOPs counted with
# the full attention square as this service counts them (estimator/flops.py). No estimate should
# promise more.
BEST_PUBLISHED_MFU = 0.72

RELATIVE = 1e-9  # float noise allowed where two numbers must be equal
BYTES = 8  # rounding of per-GPU bytes (each component is rounded up once)
GiB = 2**30


class NotApplicable(Exception):
    """The property has nothing to compare for this case."""


def _close(a: float, b: float, slack: float = BYTES) -> bool:
    return abs(a - b) <= slack + RELATIVE * max(abs(a), abs(b))


def _valid(case: Case) -> Case:
    if case.violation() is not None:
        raise NotApplicable(case.violation())
    return case


# ---------------------------------------------------------------- methods


def stage_parameters(case: Case) -> dict[int, int]:
    """The ``parameters`` component of each pipeline rank the estimate reports."""
    return {stage.rank: stage.memory.parameters for stage in case.estimate().memory.per_stage}


def frozen_base_bytes(case: Case) -> dict[int, float]:
    """The frozen base's bytes on each pipeline rank of a LoRA/QLoRA case: parameters on the GPU are
    the frozen base plus the adapters, linear in the rank, so base = 2 P(r=1) - P(r=2)."""
    one, two = stage_parameters(case.replace(lora_rank=1)), stage_parameters(case.replace(lora_rank=2))
    return {rank: 2 * one[rank] - two[rank] for rank in one}


def bytes_per_trained_parameter(case: Case) -> int:
    """Bytes per parameter of full training's ``parameters`` component: the 16-bit weights (fp32
    under fp32), except FSDP, whose sharded parameter is the fp32 master under mixed precision."""
    if case.precision.stores_fp32:
        return 4
    if case.layout.framework is Framework.FSDP and case.precision is not Precision.BF16_PURE:
        return 4
    return 2


def frozen_base_independent_of_method(case: Case) -> str | None:
    """LoRA keeps the base frozen in the training dtype, sharded and split exactly as full training
    shards and splits the same weights: per GPU, the same parameter count."""
    if case.layout.framework not in PEFT_FRAMEWORKS or case.precision is Precision.FP8:
        raise NotApplicable("no adapters in this framework, or fp8 weight caches")
    lora = _valid(case.replace(method=Method.LORA))
    # rank by rank: the most loaded rank of LoRA (adapters, activations) need not be full training's
    full = stage_parameters(lora.replace(method=Method.FULL))
    frozen_bytes = 4 if case.precision.stores_fp32 else 2
    for rank, base in frozen_base_bytes(lora).items():
        expected = full[rank] * frozen_bytes / bytes_per_trained_parameter(case)
        if not _close(base, expected, slack=4 * BYTES):
            return (
                f"pipeline rank {rank}: LoRA's frozen base is {base / GiB:.3f} GiB per GPU; full training "
                f"of the same layout holds {expected / GiB:.3f} GiB of the same weights in that dtype"
            )
    return None


def model_states_qlora_le_lora_le_full(case: Case) -> str | None:
    """Freezing the base never adds bytes, nor does quantising it. Without offload: offloaded, full
    training keeps only the 16-bit weights on the GPU, and LoRA rightly adds its adapters to them."""
    if case.layout.framework not in PEFT_FRAMEWORKS:
        raise NotApplicable("no adapters in this framework")
    if case.layout.offload_optimizer.value != "none" or case.layout.offload_params.value != "none":
        raise NotApplicable("offloaded: full training's GPU holds the bare weights")
    full = model_states(case.replace(method=Method.FULL).estimate().memory.per_gpu)
    lora = model_states(_valid(case.replace(method=Method.LORA)).estimate().memory.per_gpu)
    qlora = model_states(_valid(case.replace(method=Method.QLORA)).estimate().memory.per_gpu)
    if qlora <= lora <= full:
        return None
    return (
        f"model states per GPU: qlora {qlora / GiB:.3f} GiB, lora {lora / GiB:.3f} GiB, "
        f"full {full / GiB:.3f} GiB"
    )


# ---------------------------------------------------------------- monotonicity


def memory_non_decreasing_in_micro_batch(case: Case) -> str | None:
    """Twice the micro-batch (half the accumulation, same global batch) never needs less memory,
    unless it is the one micro-batch of the step and its gradients then never meet its activations
    (``memory.gradients_follow_activations``): the one exception ``evaluate.largest_fitting`` and
    the search try first."""
    bigger = _valid(case.replace(micro_batch_size=2 * case.layout.micro_batch_size))
    job = make_job(bigger.model, bigger.cluster, bigger.training, default_tuning())
    if gradients_follow_activations(job, bigger.layout):
        raise NotApplicable("the larger is the step's one micro-batch: its gradients follow its activations")
    small = case.estimate().memory.per_gpu.total
    large = bigger.estimate().memory.per_gpu.total
    if large >= small:
        return None
    return (
        f"micro-batch {case.layout.micro_batch_size}: {small} B per GPU; "
        f"micro-batch {bigger.layout.micro_batch_size}: {large} B"
    )


def memory_non_decreasing_in_seq_len(case: Case) -> str | None:
    longer = _valid(case.replace(seq_len=2 * case.seq_len))
    short = case.estimate().memory.per_gpu.total
    long = longer.estimate().memory.per_gpu.total
    if long >= short:
        return None
    return f"seq_len {case.seq_len}: {short} B per GPU; seq_len {longer.seq_len}: {long} B"


def model_states_non_increasing_in_zero_stage(case: Case, higher_stage: int | None = None) -> str | None:
    """A higher ZeRO stage (FSDP: SHARD_GRAD_OP then FULL_SHARD) of the same degrees shards more.
    ``higher_stage`` None: the next stage the framework has."""
    caps = FRAMEWORK_CAPABILITIES[case.layout.framework]
    higher = sorted(s for s in caps.zero_stages if s > case.layout.zero_stage)
    if not higher:
        raise NotApplicable("no higher stage")
    if (
        case.layout.framework is Framework.DEEPSPEED
        and case.layout.zero_stage == 0
        and case.training.precision not in MIXED
    ):
        # DeepSpeed's ZeRO-1/2 clone the partition as the master without mixed precision
        # (model_states.deepspeed_master_clone), a copy ZeRO-0 does not hold
        raise NotApplicable("DeepSpeed's ZeRO-1 clones a master ZeRO-0 does not hold")
    other = _valid(case.replace(zero_stage=higher[0] if higher_stage is None else higher_stage))
    low = model_states(case.estimate().memory.per_gpu)
    high = model_states(other.estimate().memory.per_gpu)
    if high <= low:
        return None
    return (
        f"zero_stage {case.layout.zero_stage}: {low} B of model states per GPU; "
        f"zero_stage {other.layout.zero_stage}: {high} B"
    )


def memory_non_increasing_in_zero3_dp(case: Case) -> str | None:
    """ZeRO-3 / FULL_SHARD over twice the data-parallel ranks (same global batch and micro-batch)
    never needs more memory per GPU. From dp 2 up: dp 1 has no data-parallel communicator, whose
    NCCL buffers dp 2 rightly adds."""
    if case.layout.zero_stage != 3 or case.layout.dp < 2:
        raise NotApplicable("not a sharded ZeRO-3 / FULL_SHARD layout")
    wider = _valid(case.replace(dp=2 * case.layout.dp))
    narrow = case.estimate().memory.per_gpu.total
    wide = wider.estimate().memory.per_gpu.total
    if wide <= narrow:
        return None
    return f"dp {case.layout.dp}: {narrow} B per GPU; dp {wider.layout.dp}: {wide} B"


# ---------------------------------------------------------------- no estimate beats the hardware


def within_peak(case: Case, step_time_factor: float = 1.0) -> str | None:
    """Hardware FLOP/s per GPU within the dense peak of the precision, MFU and HFU <= 1, under a
    calibration of the step time by ``step_time_factor`` (1: none)."""
    calibration = Calibration(step_time_factor=step_time_factor) if step_time_factor != 1.0 else None
    time = case.estimate(calibration).time
    assert time is not None
    peak = peak_of(case.cluster.gpu, case.precision)
    problems = []
    if time.hardware_tflops_per_gpu * 1e12 > peak * (1 + RELATIVE):
        problems.append(
            f"{time.hardware_tflops_per_gpu:.1f} TFLOP/s per GPU executed, the {case.gpu}'s dense "
            f"{case.precision.value} peak is {peak / 1e12:.1f}"
        )
    if time.hfu > 1.0:
        problems.append(f"HFU {time.hfu:.3f}")
    if time.mfu > 1.0:
        problems.append(f"MFU {time.mfu:.3f}")
    if not problems:
        return None
    factor = f" (step time calibrated x{step_time_factor:.3f})" if step_time_factor != 1.0 else ""
    return "; ".join(problems) + factor


def mfu_within_best_published(case: Case) -> str | None:
    time = case.estimate().time
    assert time is not None
    if time.mfu <= BEST_PUBLISHED_MFU:
        return None
    return (
        f"MFU {time.mfu:.3f} above the best published end-to-end training MFU ({BEST_PUBLISHED_MFU:.0%}, "
        "FlashAttention-2 on A100)"
    )


# ---------------------------------------------------------------- custom GPUs


def _without_chip(spec: GPUSpec) -> GPUSpec:
    return dataclasses.replace(spec, name=f"custom-{spec.name}", chip="", source="")


def custom_gpu_not_faster(case: Case) -> str | None:
    """A custom GPU with a catalog part's exact peaks and bandwidths but no ``chip`` is estimated
    no faster than that part (issue 24: 38% faster for the H100's numbers)."""
    catalog = case.estimate().time
    cluster = dataclasses.replace(case.cluster, gpu=_without_chip(case.cluster.gpu))
    custom = estimate(
        case.model, cluster, case.layout, case.training, tuning=default_tuning(), with_limits=False
    ).time
    assert catalog is not None and custom is not None
    if custom.step_s >= catalog.step_s * (1 - RELATIVE):
        return None
    return f"custom GPU without chip: step {custom.step_s:.4g} s; {case.gpu}: {catalog.step_s:.4g} s"
