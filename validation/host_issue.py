"""The host time per op of PyTorch eager, read off the kernel profile
(``validation/data/device_profile.jsonl``, written by ``validation/device_profile.py``): the number
``tuning.toml [host_issue] s_per_op`` takes.

A kernel cannot start before the host has issued it. If the host issues one kernel every ``h``
seconds and never runs ahead, a step takes the sum over its kernels of max(kernel's GPU time, h).
For each profiled case this finds the ``h`` at which that sum equals the case's unprofiled step
time (each profiler key's kernels at their mean GPU time), by bisection. One ``h`` that fits every
case, GPU-bound or not, is what the per-kernel bound needs; the host-bound case (the smallest
step) is the one that sets it. The profile is separate from the device runs of
``validation/data/device_runs.json``, fit and held-out.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from validation.cases import DATA_DIR

PROFILE_PATH = DATA_DIR / "device_profile.jsonl"
# profiler keys that are not kernels: aten ops and autograd nodes (their device time is their
# kernels'), the optimizer's annotation (its device time is its kernels'), CUDA runtime calls, and
# the profiler's own buffer requests
_NOT_KERNELS = ("aten::", "autograd::", "Optimizer.", "cuda", "Activity Buffer")


@cache
def profile() -> tuple[dict[str, Any], ...]:
    with PROFILE_PATH.open(encoding="utf-8") as handle:
        return tuple(json.loads(line) for line in handle if line.strip())


def kernels(case: dict[str, Any]) -> list[tuple[int, float]]:
    """(count, mean GPU seconds) of each kernel key of a profiled step."""
    return [
        (event["count"], event["self_device_us"] * 1e-6 / event["count"])
        for event in case["events"]
        if event["self_device_us"] > 0 and event["count"] > 0 and not event["key"].startswith(_NOT_KERNELS)
    ]


def bounded_step_s(found: list[tuple[int, float]], host_s: float) -> float:
    """The step when each kernel takes at least ``host_s``: sum of count x max(GPU time, host_s)."""
    return sum(count * max(gpu_s, host_s) for count, gpu_s in found)


def host_s_per_kernel(case: dict[str, Any]) -> float:
    """The ``h`` at which ``bounded_step_s`` equals the case's measured step (0 if its kernels alone
    take longer: the host never bounds it)."""
    found, step_s = kernels(case), float(case["step_s"])
    if bounded_step_s(found, 0.0) >= step_s:
        return 0.0
    low, high = 0.0, step_s
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if bounded_step_s(found, mid) < step_s else (low, mid)
    return (low + high) / 2


def fitted() -> dict[str, float]:
    """Each profiled case's ``host_s_per_kernel``, by case id."""
    return {case["case"]["id"]: host_s_per_kernel(case) for case in profile()}


def kernel_gpu_s(case: dict[str, Any]) -> float:
    """The GPU time of all a case's kernels."""
    return sum(count * gpu_s for count, gpu_s in kernels(case))


def profiled_case_estimate_s(case: dict[str, Any]) -> float:
    """The estimator's step for a profiled case: the preset cut to the profiled layers, one H200, the
    device runs' inputs (``validation.device_memory``: bf16 autocast, FlashAttention, fused AdamW; a
    LoRA case's base in bf16, as the profile built it)."""
    import dataclasses

    from service.catalog.models import model as catalog_model
    from service.catalog.tuning import default_tuning
    from service.estimator.estimate import estimate
    from validation.device_memory import cluster, layout_of, training_of

    profiled = case["case"]
    spec = catalog_model(profiled["preset"]).spec
    layers = int(profiled["layers"])
    spec = dataclasses.replace(spec, num_layers=layers, layer_types=spec.layer_types[:layers])
    inputs = {
        "precision": "bf16",
        "method": "lora" if profiled["lora"] else "full",
        "base_dtype": "bf16",
        "mbs": profiled["mbs"],
        "seq": profiled["seq"],
        "gc": False,
        "optim": "fused",
    }
    est = estimate(
        spec, cluster(), layout_of(inputs), training_of(inputs), tuning=default_tuning(), with_limits=False
    )
    assert est.time is not None
    return est.time.step_s
