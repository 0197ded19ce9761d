"""DeepSpeed's optimizer step converts each optimizer group's gradient partition to fp32 beside the
master and moments (stage_1_and_2.py step), which DeepSpeed's own estimator counts: ZeRO-2 GPU =
2P + 18P/G (shared/reference/formulas.md section 4). The estimate's step moment left it out, 1.9 GB
under on a 7B over eight 24 GB cards (hand-derivation review)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator.estimate import estimate
from service.estimator.params import parameter_counts
from service.estimator.types import Framework, Layout, Offload, Optimizer, Precision, Recompute, TrainingSpec
from validation.cases import gpu_cluster


def test_zero2_step_holds_deepspeeds_estimator_formula() -> None:
    llama = preset("llama-2-7b").spec
    p = parameter_counts(llama).total
    cluster = gpu_cluster(gpu("h100-sxm-80gb"), 8, 50e9)
    training = TrainingSpec(seq_len=512, global_batch_size=8)
    layout = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=2, recompute=Recompute.FULL)
    result = estimate(llama, cluster, layout, training, tuning=default_tuning(), with_limits=False)
    formula = 2 * p + 18 * p / 8
    peak = result.memory.per_gpu.peak_allocated_bytes
    # the formula, plus what the step moment holds beside it (the gradient buckets), no more
    assert formula <= peak <= formula * 1.03, (peak, formula)
    offloaded = Layout(
        framework=Framework.DEEPSPEED,
        dp=8,
        zero_stage=2,
        recompute=Recompute.FULL,
        offload_optimizer=Offload.CPU,
    )
    result = estimate(llama, cluster, offloaded, training, tuning=default_tuning(), with_limits=False)
    assert result.memory.per_gpu.peak_allocated_bytes < 2 * p + 18 * p / 8 - 4 * p / 8  # stepped on the host


def test_an_moe_models_step_converts_its_largest_group() -> None:
    """Experts are their own optimizer group, sharded over expert data parallelism: the fp32
    conversion of the larger of the two partitions, not their sum (each group is freed after its step)."""
    mixtral = preset("mixtral-8x7b").spec
    cluster = gpu_cluster(gpu("h200-sxm-141gb"), 16, 50e9)
    training = TrainingSpec(seq_len=512, global_batch_size=16)
    base = dict(framework=Framework.DEEPSPEED, dp=16, ep=8, zero_stage=2, recompute=Recompute.FULL)
    result = estimate(mixtral, cluster, Layout(**base), training, tuning=default_tuning(), with_limits=False)  # type: ignore[arg-type]
    counts = parameter_counts(mixtral)
    # Mixtral routes 2 of 8 experts: the 6 idle ones' parameters are total - active, all 8 are 8/6 of
    # that; a rank holds one expert (ep 8) sharded over expert-DP 16 / 8 = 2; the rest over dp 16
    experts = (counts.total - counts.active_per_token) * 8 / 6
    expert, dense = experts / 8 / 2, (counts.total - experts) / 16
    assert expert > dense
    # the step moment: states + the expert partition's fp32 gradient (within the buckets beside it)
    states = (
        result.memory.per_gpu.parameters
        + result.memory.per_gpu.gradients
        + result.memory.per_gpu.optimizer_states
    )
    assert states + 4 * expert * 0.95 <= result.memory.per_gpu.peak_allocated_bytes


def test_the_bucket_note_says_where_the_clamp_chose_the_size() -> None:
    """'reduce_bucket_size 1e+07 elements (h^2 ...)' for a 2048-wide model, whose h^2 is 4.19e6: the
    clamp's floor chose it, and the note says so (hand-derivation review)."""
    from service.estimator.model_states import deepspeed_assumption

    small = deepspeed_assumption(
        preset("llama-3.2-1b").spec, Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=1)
    )
    assert "h^2 = 4.19e+06" in small and "clamped to [1e+07, 5e+08]" in small
    wide = deepspeed_assumption(
        preset("llama-3-8b").spec, Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=1)
    )
    assert "1.68e+07 elements (h^2, as" in wide


# ---------------------------------------------------------------- ZeRO-0: FP16_Optimizer, BF16_Optimizer


def _ds_states(model, cluster, layout, training):  # type: ignore[no-untyped-def]
    from service.estimator.memory import stage_states
    from tests.estimator.helpers import job as make_job

    return stage_states(make_job(model, cluster, training), layout)


def test_zero0_without_a_pipeline_flattens_fp32_copies_of_every_gradient() -> None:
    """FP16_Optimizer (fp16, and bf16 without a pipeline: engine.py DDP_BFLOAT16) flattens each
    group's gradients as fp32 (``_flatten_dense_tensors([p.grad.to(fp32) ...])``): the list of copies and
    the flat tensor, 8 B per parameter, while the 16-bit gradients are still alive. The states stay
    whole: 2 + 2 + 4 + 8 bytes per parameter, nothing sharded at dp 8."""
    llama = preset("llama-3.2-1b").spec
    p = parameter_counts(llama).total
    cluster = gpu_cluster(gpu("h100-sxm-80gb"), 8, 50e9)
    layout = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=0, recompute=Recompute.FULL)
    for precision in (Precision.BF16, Precision.FP16):
        training = TrainingSpec(seq_len=512, global_batch_size=8, precision=precision)
        (rank,) = _ds_states(llama, cluster, layout, training)
        assert rank.optimizer_temporary == 8 * p
        assert rank.gradients == 2 * p and rank.optimizer_states == 12 * p
    # any optimizer but DeepSpeed's FusedAdam steps in FP16_UnfusedOptimizer: an fp32 copy of every gradient
    for optimizer in (Optimizer.SGD, Optimizer.ADAMW_8BIT, Optimizer.LION):
        training = TrainingSpec(seq_len=512, global_batch_size=8, optimizer=optimizer)
        assert _ds_states(llama, cluster, layout, training)[0].optimizer_temporary == 4 * p
    fp32 = TrainingSpec(seq_len=512, global_batch_size=8, precision=Precision.FP32)
    assert (
        _ds_states(llama, cluster, layout, fp32)[0].optimizer_temporary == 0
    )  # no master: the optimizer alone


def test_zero0_moe_groups_flatten_in_turn() -> None:
    """Dense group first: its flat fp32 gradients stay (4 B) and its 16-bit ones go (-2 B) while the
    expert group is flattened (8 B): the larger of 8 D and 2 D + 8 E."""
    mixtral = preset("mixtral-8x7b").spec
    cluster = gpu_cluster(gpu("h200-sxm-141gb"), 8, 50e9)
    training = TrainingSpec(seq_len=512, global_batch_size=8)
    layout = Layout(framework=Framework.DEEPSPEED, dp=8, ep=8, zero_stage=0, recompute=Recompute.FULL)
    counts = parameter_counts(mixtral)
    experts = (counts.total - counts.active_per_token) * 8 / 6
    dense, expert = counts.total - experts, experts / 8
    (rank,) = _ds_states(mixtral, cluster, layout, training)
    assert rank.optimizer_temporary == max(8 * dense, 2 * dense + 8 * expert)


def test_zero0_in_the_pipeline_engine_partitions_its_bf16_optimizer() -> None:
    """The pipeline engine at ZeRO-0 in bf16 steps with BF16_Optimizer: master and moments over dp (as
    ZeRO-1), a flat bf16 gradient buffer beside .grad (2 + 2 B), every group's partition cast to fp32
    for the step (4 B / dp), and the updated weights all-gathered; fp16 keeps FP16_Optimizer."""
    llama = preset("llama-3.2-1b").spec
    cluster = gpu_cluster(gpu("h100-sxm-80gb"), 8, 50e9)
    training = TrainingSpec(seq_len=512, global_batch_size=16)
    pipelined = Layout(framework=Framework.DEEPSPEED, dp=4, pp=2, zero_stage=0, recompute=Recompute.FULL)
    zero1 = Layout(framework=Framework.DEEPSPEED, dp=4, pp=2, zero_stage=1, recompute=Recompute.FULL)
    for bf16, one in zip(
        _ds_states(llama, cluster, pipelined, training),
        _ds_states(llama, cluster, zero1, training),
        strict=True,
    ):
        trainable = bf16.states.parameters / 2  # 2-byte weights, unsharded
        assert bf16.optimizer_states == one.optimizer_states == math.ceil(12 * trainable / 4)
        assert bf16.gradients == math.ceil(4 * trainable)
        assert bf16.optimizer_temporary == 4 * trainable / 4
        # its flat gradient buffer is all-reduced in place: no 5e8-element flatten chunk (DeepSpeed review)
        assert bf16.held_buffers == 0
    fp16 = dataclasses.replace(training, precision=Precision.FP16)
    for rank in _ds_states(llama, cluster, pipelined, fp16):
        trainable = rank.states.parameters / 2
        assert rank.optimizer_states == math.ceil(12 * trainable) and rank.gradients == math.ceil(
            2 * trainable
        )
    # the step: ZeRO-1's quarter of the optimizer's HBM traffic; the reduction: stage 0's all-reduce in
    # MEMORY_OPT_ALLREDUCE_SIZE chunks (pipe/engine.py _bf16_reduce_grads), then the weights' all-gather,
    # which FP16_Optimizer (fp16: every rank steps it all) does not run
    tuning = default_tuning()

    def breakdown(lo: Layout, t: TrainingSpec):  # type: ignore[no-untyped-def]
        return estimate(llama, cluster, lo, t, tuning=tuning, with_limits=False).time.breakdown

    bf16_step, zero1_step, fp16_step = (
        breakdown(pipelined, training),
        breakdown(zero1, training),
        breakdown(pipelined, fp16),
    )
    # (its step reads the 4-byte flat gradient buffer where ZeRO-1 reads 2-byte gradients)
    assert zero1_step.optimizer_s == fp16_step.optimizer_s / 4
    assert zero1_step.optimizer_s < bf16_step.optimizer_s < 1.1 * zero1_step.optimizer_s
    assert bf16_step.dp_comm_exposed_s > fp16_step.dp_comm_exposed_s


def test_zero1_and_2_clone_a_master_without_mixed_precision() -> None:
    """fp32 and bf16_pure at ZeRO-1/2: DeepSpeedZeroOptimizer clones each rank's partition as the tensor
    it steps (4 B / dp in fp32, 2 B in bf16_pure), and flattens the gradient partition in that dtype at
    the step; ZeRO-3 reuses its partition, ZeRO-0 steps the weights (DeepSpeed review: a 7B in fp32 at
    ZeRO-2 on eight 40 GB cards was said to fit with 0.17 GiB spare without its 3.1 GiB)."""
    llama = preset("llama-2-7b").spec
    p = parameter_counts(llama).total
    cluster = gpu_cluster(gpu("a100-sxm-40gb"), 8, 50e9)
    for precision, element in ((Precision.FP32, 4), (Precision.BF16_PURE, 2)):
        training = TrainingSpec(seq_len=512, global_batch_size=8, precision=precision)
        for zero in (1, 2):
            layout = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=zero, recompute=Recompute.FULL)
            (rank,) = _ds_states(llama, cluster, layout, training)
            moments = rank.optimizer_states - element * p / 8
            assert moments == pytest.approx(8 * p / 8 if precision is Precision.FP32 else 4 * p / 8, rel=1e-6)
            assert rank.optimizer_temporary == element * p / 8
        zero3 = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=3, recompute=Recompute.FULL)
        (rank,) = _ds_states(llama, cluster, zero3, training)
        assert rank.optimizer_temporary == 0
    fits = estimate(
        llama,
        cluster,
        Layout(
            framework=Framework.DEEPSPEED, dp=8, zero_stage=2, recompute=Recompute.FULL, micro_batch_size=1
        ),
        TrainingSpec(seq_len=4096, global_batch_size=64, precision=Precision.FP32),
        tuning=default_tuning(),
    )
    assert not fits.fits
