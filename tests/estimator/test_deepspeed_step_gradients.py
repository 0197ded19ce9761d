"""DeepSpeed's optimizer step converts each optimizer group's gradient partition to fp32 beside the
master and moments (stage_1_and_2.py step), which DeepSpeed's own estimator counts: ZeRO-2 GPU =
2P + 18P/G (shared/reference/formulas.md section 4). The estimate's step moment left it out, 1.9 GB
under on a 7B over eight 24 GB cards (hand-derivation review)."""

from __future__ import annotations

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator.estimate import estimate
from service.estimator.params import parameter_counts
from service.estimator.types import Framework, Layout, Offload, Recompute, TrainingSpec
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
