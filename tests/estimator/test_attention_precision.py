"""FlashAttention's kernels take fp16 or bf16 inputs only (flash_attn's interface asserts the dtype):
a request that leaves the attention to the hardware and keeps fp32 activations (fp32, tf32) gets SDPA,
and one that names flash with them is refused."""

from __future__ import annotations

import dataclasses

import pytest

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator.defaults import chosen_defaults, for_gpu
from service.estimator.errors import InvalidLayout
from service.estimator.estimate import estimate
from service.estimator.types import Attention, Layout, ModelSpec, Precision, TrainingSpec
from validation.cases import gpu_cluster

A100 = gpu("a100-sxm-80gb")
V100 = gpu("v100-sxm2-32gb")
LLAMA = preset("llama-3.2-1b").spec


@pytest.mark.parametrize(
    ("precision", "attention"),
    [(Precision.BF16, Attention.FLASH), (Precision.FP16, Attention.FLASH),
     (Precision.FP32, Attention.SDPA), (Precision.TF32, Attention.SDPA)],
)  # fmt: skip
def test_the_default_attention_takes_the_precisions_activations(
    precision: Precision, attention: Attention
) -> None:
    left = TrainingSpec(
        seq_len=512, global_batch_size=8, precision=precision, hardware_defaults=frozenset({"attention"})
    )
    assert for_gpu(left, A100, LLAMA).attention is attention


def test_a_training_built_without_attention_leaves_it_to_the_gpu() -> None:
    # the domain's default is the request's: unset, resolved for the GPU and the precision
    fp32 = TrainingSpec(seq_len=512, global_batch_size=8, precision=Precision.FP32)
    assert fp32.attention is None
    resolved = for_gpu(fp32, A100, LLAMA)
    assert resolved.attention is Attention.SDPA
    assert chosen_defaults(resolved) == {"training.attention": "sdpa"}
    assert for_gpu(TrainingSpec(seq_len=512, global_batch_size=8), A100, LLAMA).attention is Attention.FLASH
    assert for_gpu(TrainingSpec(seq_len=512, global_batch_size=8), V100, LLAMA).attention is Attention.SDPA
    # an attention set later is the caller's, not re-resolved
    eager = dataclasses.replace(fp32, attention=Attention.EAGER)
    assert (
        for_gpu(eager, A100, LLAMA).attention is Attention.EAGER
        and chosen_defaults(for_gpu(eager, A100, LLAMA)) == {}
    )


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.TF32])
def test_flash_named_with_fp32_activations_is_refused(precision: Precision) -> None:
    model = preset("gpt2").spec
    cluster = gpu_cluster(A100, 1, 25e9)
    asked = TrainingSpec(seq_len=512, global_batch_size=8, precision=precision, attention=Attention.FLASH)
    with pytest.raises(InvalidLayout) as refused:
        estimate(model, cluster, Layout(), asked, tuning=default_tuning())
    assert (refused.value.field, refused.value.rule) == ("attention", "flash_precision")
    assert f"precision {precision.value}" in refused.value.message
    # left out, it is estimated as sdpa
    left, sdpa = (dataclasses.replace(asked, attention=a) for a in (None, Attention.SDPA))
    tuning = default_tuning()
    assert estimate(model, cluster, Layout(), left, tuning=tuning) == estimate(
        model, cluster, Layout(), sdpa, tuning=tuning
    )


# ---- the kernels a family's transformers implementation has (hf_config review, stop 44)


@pytest.mark.parametrize(
    ("name", "gpu_name", "default"),
    [
        ("bloom-176b", "h100-sxm-80gb", Attention.EAGER),  # BloomAttention: no SDPA, no flash
        ("gemma-2-9b", "h100-sxm-80gb", Attention.FLASH),  # no SDPA (softcapping): flash where it runs
        ("gemma-2-9b", "v100-sxm2-32gb", Attention.EAGER),  # ... else eager
        ("gpt-oss-20b", "a100-sxm-80gb", Attention.FLASH),
        ("llama-4-scout-17b-16e", "h100-sxm-80gb", Attention.SDPA),  # no FlashAttention
        ("llama-3.2-1b", "h100-sxm-80gb", Attention.FLASH),
    ],
)
def test_the_default_attention_is_one_the_family_runs(name: str, gpu_name: str, default: Attention) -> None:
    model = preset(name).spec
    resolved = for_gpu(TrainingSpec(seq_len=512, global_batch_size=8), gpu(gpu_name), model)
    assert resolved.attention is default
    assert chosen_defaults(resolved)["training.attention"] == default.value


def test_an_attention_the_family_lacks_is_refused_where_transformers_builds_the_model() -> None:
    model = preset("bloom-176b").spec
    training = TrainingSpec(seq_len=2048, global_batch_size=8, attention=Attention.FLASH)
    with pytest.raises(InvalidLayout) as refused:
        estimate(
            model, gpu_cluster(gpu("h100-sxm-80gb"), 8, 50e9), Layout(dp=8), training, tuning=default_tuning()
        )
    assert refused.value.field == "attention"
    assert "eager" in refused.value.message
    eager = dataclasses.replace(training, attention=Attention.EAGER)
    flash_like = dataclasses.replace(training, attention=None)  # left out: eager resolved
    a = estimate(
        model, gpu_cluster(gpu("h100-sxm-80gb"), 8, 50e9), Layout(dp=8), eager, tuning=default_tuning()
    )
    b = estimate(
        model, gpu_cluster(gpu("h100-sxm-80gb"), 8, 50e9), Layout(dp=8), flash_like, tuning=default_tuning()
    )
    assert a.memory.per_gpu.total == b.memory.per_gpu.total


def test_sdpa_runs_every_key_block_of_a_masked_sliding_layer() -> None:
    """transformers hands SDPA a sliding layer's mask once the sequence reaches the window: its kernels
    then skip no block, where FlashAttention-2 takes the window (config review, stop 44: Gemma 3 1B's
    sliding layers under SDPA were timed at their window, 1.69 s, against 1.94 s all full)."""
    gemma = preset("gemma-3-1b").spec
    all_full = dataclasses.replace(gemma, layer_types=(), sliding_window=None, rope_local_theta=None)
    cluster, layout = gpu_cluster(gpu("h100-sxm-80gb"), 8, 50e9), Layout(dp=8)

    def step_s(model: ModelSpec, attention: Attention) -> float:
        training = TrainingSpec(seq_len=8192, global_batch_size=8, attention=attention)
        found = estimate(model, cluster, layout, training, tuning=default_tuning(), with_limits=False).time
        assert found is not None
        return found.step_s

    assert step_s(gemma, Attention.SDPA) > step_s(all_full, Attention.SDPA)
    assert step_s(gemma, Attention.FLASH) < step_s(all_full, Attention.FLASH)
