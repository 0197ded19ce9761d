"""Falcon under flash-attn (FalconFlashAttention2) keeps k and v at its kv heads and builds no mask:
its activations depend on the tokens of a micro-batch alone, as every other family's do under flash;
under SDPA (FalconAttention's call) the repeated k, v and the b x s x s mask stay counted (metamorphic
review: 536,870,912 bytes apart at 4,096 x 1 and 2,048 x 2, one mask per layer)."""

from __future__ import annotations

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator.estimate import estimate
from service.estimator.types import Attention, Framework, Layout, Precision, TrainingSpec
from validation.cases import gpu_cluster

H100 = gpu("h100-sxm-80gb")
FALCON = preset("falcon-7b").spec
TUNING = default_tuning()


def activations(attention: Attention, seq: int, micro: int) -> int:
    training = TrainingSpec(
        seq_len=seq, global_batch_size=8 * micro, precision=Precision.BF16, attention=attention
    )
    layout = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=3, micro_batch_size=micro)
    return estimate(
        FALCON, gpu_cluster(H100, 8, 50e9), layout, training, tuning=TUNING
    ).memory.per_gpu.activations


def test_falcon_under_flash_reads_the_tokens_alone() -> None:
    assert activations(Attention.FLASH, 4096, 1) == activations(Attention.FLASH, 2048, 2)
    assert activations(Attention.FLASH, 2048, 2) == activations(Attention.FLASH, 1024, 4)


def test_falcon_under_sdpa_keeps_its_mask_and_repeated_kv() -> None:
    flash, sdpa = activations(Attention.FLASH, 4096, 1), activations(Attention.SDPA, 4096, 1)
    h, q, layers = FALCON.hidden_size, FALCON.q_size, FALCON.num_layers
    assert h == q == 4544 and FALCON.kv_size == 64
    # SDPA: q, k, v at every head and the mask, where flash keeps the fused qkv and the rotated q and k
    # (no other term differs: the math kernel's scores are counted under sdpa only, so compare bounds)
    assert sdpa - flash >= layers * 2 * 4096 * 4096  # at least the 16-bit mask of every layer


def test_falcon_flash_saves_its_rotated_q_k_and_its_v_by_architecture() -> None:
    """FalconFlashAttention2 on the CPU with a stand-in kernel saving q, k and v as flash-attn does
    (change review): 7B's multi-query heads keep q + 2 kv (k and v copied out of the fused output,
    which nothing then keeps), the new decoder architecture 3 q (k and v broadcast to every head)."""
    from service.estimator import activations
    from service.estimator.hf_config import model_from_hf_config

    tokens = 512
    training = TrainingSpec(
        seq_len=512, global_batch_size=1, precision=Precision.BF16, attention=Attention.FLASH
    )
    assert activations._hf_sdpa(FALCON, training, tokens) == 4_784_128  # 2 x 512 x (4,544 + 2 x 64)
    forty = model_from_hf_config(
        {"model_type": "falcon", "hidden_size": 8192, "num_hidden_layers": 60, "num_attention_heads": 128,
         "num_kv_heads": 8, "vocab_size": 65024, "parallel_attn": True, "new_decoder_architecture": True,
         "bias": False, "alibi": False},
        name="falcon-40b-shape",
    )  # fmt: skip
    assert activations._hf_sdpa(forty, training, tokens) == 25_165_824  # 2 x 512 x 3 x 8,192
