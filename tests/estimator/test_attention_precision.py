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
from service.estimator.types import Attention, Layout, Precision, TrainingSpec
from validation.cases import gpu_cluster

A100 = gpu("a100-sxm-80gb")
V100 = gpu("v100-sxm2-32gb")


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
    assert for_gpu(left, A100).attention is attention


def test_a_training_built_without_attention_leaves_it_to_the_gpu() -> None:
    # the domain's default is the request's: unset, resolved for the GPU and the precision
    fp32 = TrainingSpec(seq_len=512, global_batch_size=8, precision=Precision.FP32)
    assert fp32.attention is None
    resolved = for_gpu(fp32, A100)
    assert resolved.attention is Attention.SDPA
    assert chosen_defaults(resolved) == {"training.attention": "sdpa"}
    assert for_gpu(TrainingSpec(seq_len=512, global_batch_size=8), A100).attention is Attention.FLASH
    assert for_gpu(TrainingSpec(seq_len=512, global_batch_size=8), V100).attention is Attention.SDPA
    # an attention set later is the caller's, not re-resolved
    eager = dataclasses.replace(fp32, attention=Attention.EAGER)
    assert for_gpu(eager, A100).attention is Attention.EAGER and chosen_defaults(for_gpu(eager, A100)) == {}


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
