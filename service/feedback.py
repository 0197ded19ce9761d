"""Diagnosis of an observed run against the estimate its plan recommended.

Pure functions over the stored estimate (the typed contract the API returned) and the run's numbers. The
advice follows the usual tuning rules, made concrete with the plan's own breakdown: memory well
below capacity means the job is sharded or recomputed more than it needs; low utilisation means
time goes to communication, the pipeline bubble, offload traffic or the host, and the breakdown
says which.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from service.contracts.estimates import EstimateOut, MemoryPerGPUOut
from service.contracts.plans import UNSTATED_PEAK_STATISTIC
from service.contracts.results import RESULT_VERSION, RunDiagnosis, StoredLayout
from service.estimator.types import MemoryStatistic

GiB = 2**30
# Below this share of GPU memory at peak, the plan left speed on the table.
LOW_MEMORY_FRACTION = 0.6
# Below this utilisation, look for where the step time goes.
LOW_UTILIZATION = 0.7
# A part of the step worth naming in advice.
NOTABLE_SHARE = 0.10


@dataclass(frozen=True, slots=True, kw_only=True)
class ObservedRun:
    peak_memory_bytes_per_gpu: int | None
    step_s: float | None
    tokens_per_s: float | None
    gpu_utilization: float | None
    out_of_memory: bool
    # which statistic the peak is (RunRecord.memory_statistic); None: a typed peak that did not say,
    # taken as UNSTATED_PEAK_STATISTIC
    memory_statistic: MemoryStatistic | None = None


def estimated_peak(
    per_gpu: MemoryPerGPUOut, statistic: MemoryStatistic | None
) -> tuple[MemoryStatistic, int]:
    """The statistic a run's peak is compared as, and the estimate's figure of it: the run's own
    (UNSTATED_PEAK_STATISTIC where it did not say), but device used for a plan stored before the
    statistics were named (it has only that)."""
    statistic = statistic or UNSTATED_PEAK_STATISTIC
    figure = per_gpu.statistic(statistic)
    if figure is None:
        return MemoryStatistic.DEVICE_USED, per_gpu.device_used_bytes
    return statistic, figure


def measured_step_s(run: ObservedRun, tokens_per_step: int) -> float | None:
    """The run's step time, from step_s or from tokens/s and the plan's tokens per step."""
    if run.step_s is not None:
        return run.step_s
    if run.tokens_per_s:
        return tokens_per_step / run.tokens_per_s
    return None


def _relative(measured: float, estimated: float) -> float:
    return (measured - estimated) / estimated


def _memory_advice(run: ObservedRun, estimate: EstimateOut, layout: StoredLayout) -> list[str]:
    memory = estimate.memory
    total, capacity = memory.per_gpu.total, memory.capacity_bytes
    if run.out_of_memory:
        return [
            f"ran out of memory where the estimate said {total / GiB:.1f} GiB of {capacity / GiB:.1f} GiB: "
            "the dynamic part (activations, buffers, allocator) was undercounted; later plans for this "
            "hardware and framework scale it up by the learned factor. Until then: " + _relief(layout)
        ]
    peak = run.peak_memory_bytes_per_gpu
    if peak is None or peak >= LOW_MEMORY_FRACTION * capacity:
        return []
    max_mb = estimate.limits.max_micro_batch_size
    options = []
    if max_mb is not None and max_mb > layout.micro_batch_size:
        options.append(f"a larger micro-batch (up to {max_mb} fits by this plan's model)")
    if layout.zero_stage > 0:
        options.append(f"less sharding (zero_stage {layout.zero_stage} -> {layout.zero_stage - 1})")
    if layout.recompute != "none":
        options.append(f"less recomputation (recompute {layout.recompute} -> none or selective)")
    if layout.tp > 1 or layout.pp > 1:
        options.append(f"less model parallelism (tp={layout.tp}, pp={layout.pp}) and more data parallelism")
    if not options:
        return [f"peak memory {peak / GiB:.1f} GiB is {peak / capacity:.0%} of {capacity / GiB:.1f} GiB"]
    return [
        f"memory well below capacity: peak {peak / GiB:.1f} GiB is {peak / capacity:.0%} of "
        f"{capacity / GiB:.1f} GiB; spend it on speed: " + "; or ".join(options)
    ]


def _relief(layout: StoredLayout) -> str:
    steps = []
    if layout.recompute != "full":
        steps.append("full activation recompute")
    if layout.micro_batch_size > 1:
        steps.append(f"micro_batch_size {layout.micro_batch_size} -> {layout.micro_batch_size // 2}")
    # ZeRO shards over the data-parallel ranks: with one it frees nothing (a single GPU's OOM was told
    # "zero_stage 0 -> 1"; memory review)
    if layout.zero_stage < 3 and layout.framework != "megatron" and layout.dp > 1:
        steps.append(f"zero_stage {layout.zero_stage} -> {layout.zero_stage + 1}")
    return ", ".join(steps) if steps else "more GPUs or optimizer offload"


def _time_advice(run: ObservedRun, estimate: EstimateOut) -> list[str]:
    time = estimate.time
    if time is None or run.gpu_utilization is None or run.gpu_utilization >= LOW_UTILIZATION:
        return []
    parts, step = time.breakdown, time.step_s
    communication = parts.tp_comm_s + parts.cp_comm_s + parts.ep_comm_s + parts.pp_comm_s
    shares = {
        "communication": (communication + parts.dp_comm_exposed_s) / step,
        "pipeline bubble": parts.pp_bubble_s / step,
        "offload traffic and the host optimizer": (parts.offload_s + parts.optimizer_s) / step,
    }
    remedies = {
        "communication": "keep TP inside a node, overlap DP reduction with backward, fewer ZeRO-3 gathers",
        "pipeline bubble": "more micro-batches per step or interleaved stages (virtual_pipeline_stages)",
        "offload traffic and the host optimizer": "offload less, or more GPUs so the states fit on them",
    }
    notable = sorted(((s, name) for name, s in shares.items() if s >= NOTABLE_SHARE), reverse=True)
    head = f"GPU utilisation {run.gpu_utilization:.0%} < {LOW_UTILIZATION:.0%}"
    if not notable:
        return [
            f"{head}, yet the plan's breakdown has no communication, bubble or offload above "
            f"{NOTABLE_SHARE:.0%} of the step: look at the input pipeline (dataloader workers, prefetch) "
            "and host stalls"
        ]
    return [
        f"{head}: {name} is {share:.0%} of the estimated step; {remedies[name]}" for share, name in notable
    ]


def diagnose(
    run: ObservedRun,
    estimate: EstimateOut,
    layout: StoredLayout,
    tokens_per_step: int,
    implausible: Sequence[str] = (),
) -> RunDiagnosis:
    """Estimate errors (measured vs estimated, relative) and advice for one observed run.
    ``implausible``: why the run cannot be what the plan measured (estimator.calibration's
    ``implausibility``); such a run gets that as its advice and moves no calibration factor."""
    # the measured peak against the estimate's figure of the same statistic
    statistic, total = estimated_peak(estimate.memory.per_gpu, run.memory_statistic)
    memory_error = None
    if run.peak_memory_bytes_per_gpu is not None and not run.out_of_memory:
        memory_error = _relative(run.peak_memory_bytes_per_gpu, total)
    step = measured_step_s(run, tokens_per_step)
    time = estimate.time
    step_error = _relative(step, time.step_s) if step is not None and time else None
    if implausible:
        advice = [
            *implausible,
            "implausible for this plan: stored, but it moves no calibration factor; check that the run "
            "used the plan's layout, batch and sequence length, and how its numbers were measured",
        ]
    else:
        advice = _memory_advice(run, estimate, layout) + _time_advice(run, estimate)
    if step_error is not None and step_error > 0.15 and not implausible:
        advice.append(f"steps take {step_error:.0%} longer than estimated; later estimates on this hardware "
                      "and framework are calibrated with the observed ratio")  # fmt: skip
    # a peak compared without its statistic said: the one assumed, and what a PyTorch figure costs
    assumed = memory_error is not None and run.memory_statistic is None
    if assumed:
        advice.append(
            f"the peak was taken as {statistic.value}, as a typed peak that does not say its statistic is: "
            "a torch.cuda.max_memory_allocated() or max_memory_reserved() figure sent so reads low by the "
            "CUDA context and NCCL's buffers (and fragmentation), and lowers the memory factor of later "
            "plans on this hardware; send such figures with memory_statistic allocated or reserved"
        )
    return RunDiagnosis(
        version=RESULT_VERSION,
        implausible=bool(implausible),
        implausible_reasons=list(implausible),
        memory_error=memory_error,
        step_time_error=step_error,
        estimated_peak_memory_bytes_per_gpu=total,
        memory_statistic=statistic,
        memory_statistic_assumed=assumed,
        estimated_step_s=time.step_s if time else None,
        measured_step_s=step,
        advice=advice,
    )
