"""Gemma 2's tanh soft-caps keep their outputs for backward (transformers modeling_gemma2.py): the
final one on the logits, and, under eager attention, the one on every s x s score. Read from the
config and accepted, neither was counted (architecture review: 4.19 GB of Gemma 2 2B's activations
at 8K, and 7 GB under eager attention at 4K)."""

from __future__ import annotations

import dataclasses

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator import activations as activation_parts
from service.estimator.estimate import estimate
from service.estimator.params import LayerKind
from service.estimator.types import (
    Attention,
    AttentionKind,
    Compile,
    Framework,
    Layout,
    QKNorm,
    Recompute,
    TrainingSpec,
)
from validation.cases import gpu_cluster

CLUSTER = gpu_cluster(gpu("h100-sxm-80gb"), 8, 50e9)


def activations(spec: object, layout: Layout, training: TrainingSpec) -> int:
    result = estimate(spec, CLUSTER, layout, training, tuning=default_tuning(), with_limits=False)  # type: ignore[arg-type]
    return result.memory.per_gpu.activations


def test_the_final_cap_keeps_the_logits_once_more_in_the_model_dtype() -> None:
    gemma = preset("gemma-2-9b").spec
    assert gemma.final_logit_softcapping
    plain = dataclasses.replace(gemma, final_logit_softcapping=False)
    training = TrainingSpec(seq_len=8192, global_batch_size=8)
    layout = Layout(framework=Framework.FSDP, dp=8, zero_stage=3, recompute=Recompute.FULL)
    added = activations(gemma, layout, training) - activations(plain, layout, training)
    assert added == 2 * 8192 * gemma.vocab_size  # bf16, one sequence of 8,192 tokens
    # a compiled loss caps inside its kernel: nothing more than the uncapped model
    compiled = dataclasses.replace(layout, torch_compile=Compile.MODEL_AND_LOSS)
    assert activations(gemma, compiled, training) == activations(plain, compiled, training)


def test_the_score_cap_keeps_every_score_once_more_under_eager_attention_only() -> None:
    gemma = preset("gemma-2-9b").spec
    assert gemma.attn_logit_softcapping
    plain = dataclasses.replace(gemma, attn_logit_softcapping=False)
    layout = Layout(framework=Framework.FSDP, dp=8, zero_stage=3, recompute=Recompute.NONE)
    eager = TrainingSpec(seq_len=2048, global_batch_size=8, attention=Attention.EAGER)
    added = activations(gemma, layout, eager) - activations(plain, layout, eager)
    # 2 bytes x heads x s x s per layer, every layer (its 4,096-token window covers 2,048 tokens)
    assert added == 2 * gemma.num_attention_heads * 2048 * 2048 * gemma.num_layers
    flash = dataclasses.replace(eager, attention=Attention.FLASH)
    assert activations(gemma, layout, flash) == activations(plain, layout, flash)


def test_llama4_l2_qk_norm_keeps_its_fp32_copies_on_the_chunked_layers() -> None:
    # Llama4TextL2Norm: x.float() * rsqrt(mean(x^2) + eps), on q and k of the RoPE (chunked) layers:
    # autograd keeps the fp32 q and k and one fp32 rsqrt per head row, 4 (q + kv + heads + kv heads)
    # bytes a token (a reviewer's CPU trace of a tiny llama4_text; Scout's were not counted: hybrid
    # review). Scout: 40 heads and 8 kv heads of 128
    scout = preset("llama-4-scout-17b-16e").spec
    assert scout.qk_norm is QKNorm.L2
    plain = dataclasses.replace(scout, qk_norm=QKNorm.NONE)
    training = TrainingSpec(seq_len=4096, global_batch_size=1)
    layout = Layout(framework=Framework.FSDP)
    chunked, full = (
        LayerKind(moe=True, attention=kind) for kind in (AttentionKind.CHUNKED, AttentionKind.FULL)
    )

    def added(kind: LayerKind) -> float:
        return activation_parts.layer_bytes(
            scout, layout, training, kind, Recompute.NONE
        ) - activation_parts.layer_bytes(plain, layout, training, kind, Recompute.NONE)

    assert added(chunked) == 4096 * 4 * (40 * 128 + 8 * 128 + 40 + 8)
    assert added(full) == 0  # the NoPE layers normalise nothing
