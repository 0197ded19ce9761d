"""A custom GPU without ``chip`` is never estimated faster than the catalog part with the same peaks.

Issue 24: an H100 described by its peaks and bandwidths but no chip got the default GEMM fraction
(0.65, above every fitted die but GA100) and attention's core at the GEMM rate: a step 38% shorter
than ``h100-sxm-80gb``'s. Without a chip the step is timed at the most conservative fitted
efficiency, and the estimate says so.
"""

from __future__ import annotations

import dataclasses

import pytest

from service.catalog.gpus import gpu, gpu_entries
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator.errors import EstimatorError
from service.estimator.estimate import estimate
from service.estimator.tuning import (
    AttentionKernelRate,
    CurvePoint,
    attention_kernel_fractions,
    attention_kernel_rate,
    conservative_kernel_rate,
    conservative_peak_fraction,
    fitted_die,
    peak_fraction,
)
from service.estimator.types import (
    Attention,
    Estimate,
    Framework,
    GPUSpec,
    Layout,
    ModelSpec,
    Precision,
    Recompute,
    TrainingSpec,
)
from validation.cases import gpu_cluster

TUNING = default_tuning()
GPUS = {entry.name: entry.spec for entry in gpu_entries()}
H100 = GPUS["h100-sxm-80gb"]


def without_chip(g: GPUSpec) -> GPUSpec:
    """``g`` as a user describes it in a request: every number, no die."""
    return dataclasses.replace(g, name=f"custom-{g.name}", chip="", vendor="custom")


def _training(g: GPUSpec, seq_len: int, attention: Attention | None = None, batch: int = 16) -> TrainingSpec:
    # bf16 where the part has it, else fp16; flash where its kernels exist, else SDPA
    precision = Precision.BF16 if g.peak_flops_per_s.bf16 else Precision.FP16
    chosen = attention or (Attention.FLASH if g.flash_attention else Attention.SDPA)
    return TrainingSpec(seq_len=seq_len, global_batch_size=batch, precision=precision, attention=chosen)


def _estimate(model: ModelSpec, g: GPUSpec, gpus: int, layout: Layout, training: TrainingSpec) -> Estimate:
    return estimate(model, gpu_cluster(g, gpus, 50e9), layout, training, tuning=TUNING, with_limits=False)


def _step_s(e: Estimate) -> float:
    assert e.time is not None
    return e.time.step_s


# (model preset, GPUs, layout, sequence length, attention (None: the part's best))
JOBS = [
    ("llama-3.1-8b", 8, Layout(framework=Framework.FSDP, dp=8, zero_stage=3), 32768, None),
    ("llama-3.1-8b", 8, Layout(framework=Framework.FSDP, dp=8, zero_stage=3), 2048, Attention.EAGER),
    ("qwen2.5-0.5b", 1, Layout(framework=Framework.DEEPSPEED, zero_stage=0), 1024, None),
    (
        "llama-3.1-70b",
        16,
        Layout(
            framework=Framework.MEGATRON,
            dp=2,
            tp=8,
            sequence_parallel=True,
            zero_stage=1,
            recompute=Recompute.SELECTIVE,
        ),
        8192,
        None,
    ),
    ("mixtral-8x7b", 8, Layout(framework=Framework.MEGATRON, dp=8, ep=8, zero_stage=1), 4096, None),
]


@pytest.mark.parametrize("name", sorted(GPUS))
@pytest.mark.parametrize("job", JOBS, ids=[f"{j[0]}-{j[1]}-{j[2].framework}-{j[3]}" for j in JOBS])
def test_custom_gpu_without_chip_is_never_faster_than_the_catalog_part(
    name: str, job: tuple[str, int, Layout, int, Attention | None]
) -> None:
    model_name, gpus, layout, seq_len, attention = job
    catalog, custom = GPUS[name], without_chip(GPUS[name])
    model, training = preset(model_name).spec, _training(catalog, seq_len, attention)
    try:
        known = _estimate(model, catalog, gpus, layout, training)
    except EstimatorError:
        pytest.skip(f"{name} cannot run this job")  # e.g. bf16 GEMMs on V100, flash before Ampere
    unknown = _estimate(model, custom, gpus, layout, training)
    assert _step_s(unknown) >= _step_s(known) * (1 - 1e-12), (name, known.time, unknown.time)
    if not fitted_die(TUNING, catalog):
        # a die no run measured is timed as an unstated one (fitted_die): the same step
        assert _step_s(unknown) == _step_s(known), (name, known.time, unknown.time)
    assert unknown.memory == known.memory  # the die times the step, it holds no bytes
    assert any(w.startswith("custom GPU without chip") for w in unknown.warnings)
    assert not any(w.startswith("custom GPU without chip") for w in known.warnings)
    # a catalog die no run measured says its step time is an assumption, as an unstated one does
    unmeasured = f"{catalog.name}'s die ({catalog.chip}) has no efficiency fitted on a measured run"
    assert any(w.startswith(unmeasured) for w in known.warnings) is not fitted_die(TUNING, catalog)


def test_the_issue_case_h100_without_chip() -> None:
    # Llama-3.1-8B, 32K, FSDP 8 on H100 SXM: was 4.23 s without chip vs 6.58 s for the catalog part
    model, layout = preset("llama-3.1-8b").spec, Layout(framework=Framework.FSDP, dp=8, zero_stage=3)
    training = _training(H100, 32768, batch=8)
    known = _estimate(model, H100, 8, layout, training)
    unknown = _estimate(model, without_chip(H100), 8, layout, training)
    assert _step_s(known) == pytest.approx(6.58, abs=0.01)
    assert _step_s(unknown) == pytest.approx(6.98, abs=0.01)
    warning = next(w for w in unknown.warnings if w.startswith("custom GPU without chip"))
    assert "the most conservative fitted efficiency (GEMMs at 0.48 of the dense peak" in warning
    assert "ga100 0.74, gb100 0.48, gh100 0.55" in warning
    assert "set chip to the GPU's die" in warning and "gh100 for H800" in warning
    notes = " ".join(unknown.assumptions)
    assert "the GPU's die is not stated, so the lowest fraction fitted on a die" in notes
    assert "slowest published rate" in notes


def test_conservative_fraction_is_the_lowest_fitted_die() -> None:
    fitted = dict(TUNING.peak_fraction_by_chip)
    assert conservative_peak_fraction(TUNING) == min(fitted.values()) == fitted["gb100"] == 0.48
    assert peak_fraction(TUNING, without_chip(H100)) == 0.48
    assert peak_fraction(TUNING, H100) == fitted["gh100"]
    # a catalog die with no fitted fraction is timed as conservatively as an unstated one: the
    # default (0.65) put an MI300X at 1.6x an H100's step rate, ahead of every measured die
    for name in ("l40s-48gb", "mi300x-192gb", "t4-16gb", "rtx-4090-24gb"):
        assert not fitted_die(TUNING, GPUS[name])
        assert peak_fraction(TUNING, GPUS[name]) == 0.48
    assert fitted_die(TUNING, H100) and not fitted_die(TUNING, without_chip(H100))
    # nothing fitted: the default, as before
    bare = dataclasses.replace(TUNING, peak_fraction_by_chip=())
    assert conservative_peak_fraction(bare) == TUNING.default_peak_fraction


def test_without_chip_the_kernel_rate_is_the_slowest_die_at_each_length() -> None:
    # today only gh100 has published rates: its curves; FlashAttention-2's for Megatron too, since an
    # unstated die is not known to have cuDNN's fused attention (the slower kernel)
    for framework in (Framework.FSDP, Framework.MEGATRON):
        assert attention_kernel_fractions(TUNING, without_chip(H100), framework, 8192) == (
            attention_kernel_fractions(TUNING, H100, Framework.FSDP, 8192)
        )
    # two dies: the lower one at every length, backward in the first die's FLOP convention
    fa2 = attention_kernel_rate(TUNING, H100, Framework.FSDP)
    assert fa2 is not None
    other = AttentionKernelRate(
        kernel="fa2",
        chip="other",
        forward_points=(CurvePoint(x=512, factor=0.5), CurvePoint(x=16384, factor=0.1)),
        backward_points=(CurvePoint(x=1024, factor=0.1),),
        backward_flops_per_forward=2.0,
    )
    tuning = dataclasses.replace(TUNING, attention_kernel_rates=(fa2, other))
    rate = conservative_kernel_rate(tuning, "fa2")
    assert rate is not None and rate.chip == "" and rate.backward_flops_per_forward == 2.5
    forward = dict((p.x, p.factor) for p in rate.forward_points)
    assert forward[512] == pytest.approx(0.193) and forward[16384] == pytest.approx(0.1)
    assert all(p.factor == pytest.approx(0.1 * 2.5 / 2.0) for p in rate.backward_points)
    assert conservative_kernel_rate(tuning, "no-such-kernel") is None


@pytest.mark.parametrize(
    ("gpu_name", "kernel"),
    [("h100-sxm-80gb", "cudnn"), ("b200-sxm-180gb", "cudnn"), ("a100-sxm-80gb", "fa2"),
     ("l40s-48gb", "fa2"), ("mi300x-192gb", "fa2")],
)  # fmt: skip
def test_megatron_runs_cudnn_attention_only_where_the_die_has_it(gpu_name: str, kernel: str) -> None:
    """Transformer Engine picks cuDNN FusedAttention on Hopper and newer, its FlashAttention-2 backend
    before them, and there is no cuDNN on AMD: MI300X and L40S were timed at cuDNN's H100 rates,
    Megatron 24% faster than DeepSpeed from attention alone (hardware review)."""
    from service.estimator.tuning import framework_attention_kernel

    assert framework_attention_kernel(default_tuning(), gpu(gpu_name), Framework.MEGATRON) == kernel
    assert framework_attention_kernel(default_tuning(), gpu(gpu_name), Framework.FSDP) == "fa2"
