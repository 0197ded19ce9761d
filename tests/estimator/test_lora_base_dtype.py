"""A LoRA base kept in fp32 under 16-bit autocast (``training.base_dtype: fp32``).

Issue 27: a LoRA run whose frozen base stayed fp32 under bf16 autocast (transformers loads fp32
without torch_dtype; HF Trainer bf16=True autocasts) ran out of memory where the estimate, which
kept the base in bf16, said it fits. The base costs 4 bytes per parameter, and without sharding
each layer keeps the 16-bit copies autocast makes of its weights (uncached for frozen weights,
saved for the input gradient) until its backward; each forward casts them again.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator.errors import EstimatorError
from service.estimator.estimate import estimate
from service.estimator.memory import rank_parameters_of
from service.estimator.params import parameter_counts
from service.estimator.types import (
    BaseDtype,
    Estimate,
    Framework,
    Layout,
    Method,
    Precision,
    Recompute,
    TrainingSpec,
)
from tests.estimator.helpers import job as make_job
from validation.cases import gpu_cluster

A100 = gpu("a100-sxm-80gb")
LLAMA = preset("llama-2-7b").spec  # untied: output layer h x V


def lora(base: BaseDtype, precision: Precision = Precision.BF16, batch: int = 8) -> TrainingSpec:
    return TrainingSpec(
        seq_len=2048, global_batch_size=batch, method=Method.LORA, base_dtype=base, precision=precision
    )


def run(layout: Layout, training: TrainingSpec, gpus: int = 1, host_issue: bool = True) -> Estimate:
    """``host_issue`` False: the GPU's work alone, without the host-issue bound (the fp32 base's casts are
    also ops the host issues: step_time.layer_ops, tested in test_step_time)."""
    tuning = default_tuning()
    if not host_issue:
        tuning = dataclasses.replace(tuning, host_issue=None)
    return estimate(LLAMA, gpu_cluster(A100, gpus, 25e9), layout, training, tuning=tuning)


DDP = Layout(framework=Framework.FSDP, dp=1, micro_batch_size=1)


def test_ddp_by_hand_base_four_bytes_and_every_layers_copies() -> None:
    compute = run(DDP, lora(BaseDtype.COMPUTE), host_issue=False)
    fp32 = run(DDP, lora(BaseDtype.FP32), host_issue=False)
    base = parameter_counts(LLAMA).total  # 6,738,415,616: the whole base is frozen
    adapters_bytes = compute.memory.per_gpu.parameters - 2 * base
    assert fp32.memory.per_gpu.parameters - adapters_bytes == pytest.approx(4 * base, abs=8)
    # no recompute: every decoder Linear's 16-bit copy, and the output layer's, saved for backward
    job = make_job(LLAMA, gpu_cluster(A100, 1, 25e9), lora(BaseDtype.FP32))
    linear = rank_parameters_of(job, DDP, 0).linear
    copies = 2 * (linear + LLAMA.hidden_size * LLAMA.vocab_size)
    assert fp32.memory.per_gpu.buffers - compute.memory.per_gpu.buffers == pytest.approx(copies, abs=2)
    assert copies > 13e9  # 2 B x (6.48B decoder Linear + 0.13B output) weights of Llama-2-7B
    # each micro-batch's forward reads 4 B and writes 2 B of every one of them, at HBM bandwidth
    assert compute.time is not None and fp32.time is not None
    cast_s = 8 * 6 * (linear + LLAMA.hidden_size * LLAMA.vocab_size) / A100.hbm_bandwidth_bytes_per_s
    assert fp32.time.breakdown.compute_s - compute.time.breakdown.compute_s == pytest.approx(cast_s, rel=1e-9)


def test_recompute_keeps_one_layers_copies_and_casts_twice() -> None:
    layout = dataclasses.replace(DDP, recompute=Recompute.FULL)
    compute = run(layout, lora(BaseDtype.COMPUTE), host_issue=False)
    fp32 = run(layout, lora(BaseDtype.FP32), host_issue=False)
    job = make_job(LLAMA, gpu_cluster(A100, 1, 25e9), lora(BaseDtype.FP32))
    rp = rank_parameters_of(job, layout, 0)
    copies = 2 * (rp.layer + LLAMA.hidden_size * LLAMA.vocab_size)
    assert fp32.memory.per_gpu.buffers - compute.memory.per_gpu.buffers == pytest.approx(copies, abs=2)
    assert compute.time is not None and fp32.time is not None
    cast_s = 8 * 2 * 6 * (rp.linear + LLAMA.hidden_size * LLAMA.vocab_size) / A100.hbm_bandwidth_bytes_per_s
    assert fp32.time.breakdown.compute_s - compute.time.breakdown.compute_s == pytest.approx(cast_s, rel=1e-9)


def test_fsdp_sharded_holds_the_fp32_shard_and_its_gathered_units_as_before() -> None:
    layout = Layout(framework=Framework.FSDP, dp=8, zero_stage=3, micro_batch_size=1)
    compute, fp32 = run(layout, lora(BaseDtype.COMPUTE), 8), run(layout, lora(BaseDtype.FP32), 8)
    base = parameter_counts(LLAMA).total
    assert fp32.memory.per_gpu.parameters - compute.memory.per_gpu.parameters == pytest.approx(
        2 * base / 8, abs=8
    )
    assert fp32.memory.per_gpu.buffers == compute.memory.per_gpu.buffers  # MixedPrecision gathers 16-bit
    assert fp32.time == compute.time


def test_fp32_training_already_keeps_an_fp32_base() -> None:
    """A stated fp32 / tf32 precision with base_dtype fp32 asks for nothing new: refused as unused."""
    for precision in (Precision.FP32, Precision.TF32):
        with pytest.raises(EstimatorError, match="already") as raised:
            lora(BaseDtype.FP32, precision)
        assert (raised.value.rule, raised.value.field) == ("unused", "base_dtype")


@pytest.mark.parametrize(
    ("method", "precision", "framework"),
    [
        (Method.FULL, Precision.BF16, Framework.FSDP),
        (Method.QLORA, Precision.BF16, Framework.FSDP),
        (Method.LORA, Precision.FP8, Framework.FSDP),
        (Method.LORA, Precision.BF16_PURE, Framework.FSDP),
        (Method.LORA, Precision.BF16, Framework.DEEPSPEED),
        (Method.LORA, Precision.FP16, Framework.DEEPSPEED),
    ],
)
def test_refused_where_nothing_keeps_an_fp32_base(
    method: Method, precision: Precision, framework: Framework
) -> None:
    with pytest.raises(EstimatorError) as raised:
        training = TrainingSpec(
            seq_len=2048, global_batch_size=8, method=method, precision=precision, base_dtype=BaseDtype.FP32
        )
        run(Layout(framework=framework, dp=1), training)
    assert raised.value.field == "base_dtype"


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    framework_zero=st.sampled_from([(Framework.FSDP, 0), (Framework.FSDP, 2), (Framework.FSDP, 3)]),
    dp=st.sampled_from([1, 2, 8]),
    recompute=st.sampled_from([Recompute.NONE, Recompute.FULL]),
    micro=st.sampled_from([1, 2, 4]),
    precision=st.sampled_from([Precision.BF16, Precision.FP16]),
)
def test_an_fp32_base_never_needs_less_memory_or_time(
    framework_zero: tuple[Framework, int], dp: int, recompute: Recompute, micro: int, precision: Precision
) -> None:
    framework, zero = framework_zero
    layout = Layout(framework=framework, dp=dp, zero_stage=zero, recompute=recompute, micro_batch_size=micro)
    compute = run(layout, lora(BaseDtype.COMPUTE, precision, 64), dp)
    fp32 = run(layout, lora(BaseDtype.FP32, precision, 64), dp)
    assert fp32.memory.per_gpu.total > compute.memory.per_gpu.total
    assert compute.time is not None and fp32.time is not None
    assert fp32.time.step_s >= compute.time.step_s
