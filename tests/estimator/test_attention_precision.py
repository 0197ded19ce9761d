"""FlashAttention's kernels take fp16 or bf16 inputs only (flash_attn's interface asserts the dtype):
a request that leaves the attention to the hardware and keeps fp32 activations (fp32, tf32) gets SDPA."""

from __future__ import annotations

import pytest

from service.catalog.gpus import gpu
from service.estimator.defaults import for_gpu
from service.estimator.types import Attention, Precision, TrainingSpec

A100 = gpu("a100-sxm-80gb")


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
