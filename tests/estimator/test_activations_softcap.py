"""Gemma 2's tanh soft-caps keep their outputs for backward (transformers modeling_gemma2.py): the
final one on the logits, and, under eager attention, the one on every s x s score. Read from the
config and accepted, neither was counted (architecture review: 4.19 GB of Gemma 2 2B's activations
at 8K, and 7 GB under eager attention at 4K)."""

from __future__ import annotations

import dataclasses

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator.estimate import estimate
from service.estimator.types import Attention, Compile, Framework, Layout, Recompute, TrainingSpec
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
