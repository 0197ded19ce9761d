"""No estimate beats the hardware (issue 24): the hardware FLOP/s per GPU is at most the dense peak
of the precision and MFU <= HFU <= 1, at every sequence length up to a million tokens on every
catalog GPU. Holds by construction (flops.py): HFU counts the FLOPs the time model runs, at rates
each at most the peak; MFU counts the causal triangle, at most what any kernel executes.

Before flops.py counted what the kernels execute, model and hardware FLOPs counted attention's full
s x s square while the step timed flash kernels on the causal triangle: Llama-3.1-8B at 1M tokens on
8 A100 (Megatron, cp 8, full recompute) quoted HFU 1.44 and MFU 1.08."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import HealthCheck, assume, given, settings, target
from hypothesis import strategies as st

from service.catalog.gpus import gpus
from service.catalog.models import models
from service.catalog.tuning import default_tuning
from service.estimator.estimate import estimate
from service.estimator.types import (
    Attention,
    ClusterSpec,
    Framework,
    GPUSpec,
    Layout,
    ModelSpec,
    Precision,
    Recompute,
    TimeEstimate,
    TrainingSpec,
)
from service.estimator.validate import FRAMEWORK_CAPABILITIES, layout_violation

RELATIVE = 1e-9  # float noise
SEQ_LENS = tuple(2**k for k in range(10, 21))  # 1K to 1M tokens
# every kind of attention the catalog has: full (GPT-2, Llama), sliding windows (Mistral, Gemma 3,
# GPT-OSS), chunks (Llama 4), MLA (DeepSeek), MoE; smallest first, where hypothesis shrinks to
PRESETS = (
    "gpt2",
    "qwen3-0.6b",
    "gemma-3-1b",
    "llama-3.1-8b",
    "mistral-7b",
    "gpt-oss-20b",
    "deepseek-v2-lite",
    "llama-4-scout-17b-16e",
)


def peak_flops_per_s(spec: GPUSpec, precision: Precision) -> float | None:
    """The data sheet's dense peak of the precision (the catalog's, not the estimator's)."""
    peaks = spec.peak_flops_per_s
    return {
        Precision.FP32: peaks.fp32,
        Precision.TF32: peaks.tf32,
        Precision.BF16: peaks.bf16,
        Precision.BF16_PURE: peaks.bf16,
        Precision.FP16: peaks.fp16,
        Precision.FP8: peaks.fp8,
    }[precision]


def cluster_of(spec: GPUSpec, world: int) -> ClusterSpec:
    per_node = min(world, 8)
    return ClusterSpec(
        gpu=spec,
        num_nodes=max(1, world // per_node),
        gpus_per_node=per_node,
        intra_node_bandwidth_bytes_per_s=spec.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=50e9,
    )


def time_of(model: ModelSpec, spec: GPUSpec, layout: Layout, training: TrainingSpec) -> TimeEstimate | None:
    """The estimate's time, or None where the layout is not valid for the job."""
    cluster = cluster_of(spec, layout.world_size)
    if layout_violation(model, cluster, layout, training) is not None:
        return None
    time = estimate(model, cluster, layout, training, tuning=default_tuning(), with_limits=False).time
    assert time is not None
    return time


def beats_the_hardware(time: TimeEstimate, spec: GPUSpec, precision: Precision) -> list[str]:
    peak = peak_flops_per_s(spec, precision)
    assert peak is not None
    problems = []
    if time.hardware_tflops_per_gpu * 1e12 > peak * (1 + RELATIVE):
        problems.append(f"{time.hardware_tflops_per_gpu:.1f} TFLOP/s executed > {peak / 1e12:.1f} peak")
    if time.hfu > 1 + RELATIVE:
        problems.append(f"HFU {time.hfu:.3f}")
    if time.mfu > time.hfu * (1 + RELATIVE):
        problems.append(f"MFU {time.mfu:.3f} > HFU {time.hfu:.3f}")
    return problems


def attentions(spec: GPUSpec) -> tuple[Attention, ...]:
    return (
        (Attention.FLASH, Attention.SDPA, Attention.EAGER)
        if spec.flash_attention
        else (
            Attention.SDPA,
            Attention.EAGER,
        )
    )


def precisions(spec: GPUSpec) -> tuple[Precision, ...]:
    return tuple(p for p in Precision if peak_flops_per_s(spec, p) is not None)


@pytest.mark.parametrize("gpu_name", list(gpus()))
def test_llama_8b_up_to_1m_tokens_within_the_peak_on_every_catalog_gpu(gpu_name: str) -> None:
    """Every catalog GPU, 1K to 1M tokens, each precision and attention it runs, with and without
    full recompute, on 8 GPUs: context-parallel Megatron (cuDNN's rate on Hopper) and FSDP (FA2)."""
    spec, model = gpus()[gpu_name], models()["llama-3.1-8b"].spec
    layouts = (
        Layout(framework=Framework.MEGATRON, cp=8, zero_stage=1),
        Layout(framework=Framework.FSDP, dp=8, zero_stage=3),
    )
    checked, failures = 0, []
    grid = itertools.product(SEQ_LENS, precisions(spec), attentions(spec), layouts, Recompute)
    for seq_len, precision, attention, base, recompute in grid:
        if recompute not in (Recompute.NONE, Recompute.FULL):
            continue
        training = TrainingSpec(
            seq_len=seq_len, global_batch_size=8, precision=precision, attention=attention
        )
        layout = dataclasses.replace(base, recompute=recompute)
        time = time_of(model, spec, layout, training)
        if time is None:
            continue
        checked += 1
        if problems := beats_the_hardware(time, spec, precision):
            failures.append(f"{training} {layout}: {problems}")
    assert checked > 0
    assert not failures, failures


@st.composite
def jobs(draw: st.DrawFn) -> tuple[ModelSpec, GPUSpec, Layout, TrainingSpec]:
    model = models()[draw(st.sampled_from(PRESETS))].spec
    spec = gpus()[draw(st.sampled_from(list(gpus())))]
    precision = draw(st.sampled_from(precisions(spec)))
    attention = draw(st.sampled_from(attentions(spec)))
    seq_len = draw(st.one_of(st.sampled_from(SEQ_LENS), st.integers(1, 2**20)))
    framework = draw(st.sampled_from(tuple(Framework)))
    caps = FRAMEWORK_CAPABILITIES[framework]
    layout = Layout(
        framework=framework,
        dp=draw(st.sampled_from((1, 2, 8))),
        tp=draw(st.sampled_from((1, 2))),
        cp=draw(st.sampled_from((1, 1, 2, 8))),
        zero_stage=draw(st.sampled_from(sorted(caps.zero_stages))),
        recompute=draw(st.sampled_from(sorted(caps.recompute_modes))),
        sequence_parallel=False,
    )
    training = TrainingSpec(
        seq_len=seq_len,
        global_batch_size=layout.dp * draw(st.sampled_from((1, 4))),
        precision=precision,
        attention=attention,
    )
    return model, spec, layout, training


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
@given(jobs())
def test_no_estimate_up_to_1m_tokens_beats_the_peak(
    job: tuple[ModelSpec, GPUSpec, Layout, TrainingSpec],
) -> None:
    model, spec, layout, training = job
    time = time_of(model, spec, layout, training)
    assume(time is not None)
    assert time is not None
    target(time.hfu, label="HFU")  # towards the corner a breach would be in
    target(time.mfu, label="MFU")
    assert not beats_the_hardware(time, spec, training.precision)
