"""The per-GPU peak as the moment of the step that allocates the most (``evaluate.rank_peak_parts``):
gradients made while activations are freed (``memory.gradients_follow_activations``), the optimizer
step's temporary (``memory.optimizer_temporary_bytes``), and SDPA's math kernel under grouped-query
heads in fp32 (``flops.materialises_scores``). Hand-computed from the parts, checked against each
other, and monotonic; the measured H200 rows are in tests/validation/test_device_memory.py."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator import activations, flops
from service.estimator.errors import EstimatorError
from service.estimator.estimate import estimate
from service.estimator.memory import gradients_follow_activations, stage_activations, stage_states
from service.estimator.params import LayerKind
from service.estimator.types import (
    Attention,
    Framework,
    Layout,
    Method,
    Optimizer,
    OptimizerImplementation,
    Precision,
    Recompute,
    TrainingSpec,
)
from tests.estimator.helpers import job as make_job
from validation.cases import gpu_cluster

H200 = gpu("h200-sxm-141gb")
ONE = gpu_cluster(H200, 1, 50e9)
EIGHT = gpu_cluster(H200, 8, 50e9)
LLAMA_1B = preset("llama-3.2-1b").spec  # tied embeddings
LLAMA_8B = preset("llama-3.1-8b").spec  # untied
FOREACH, FUSED = OptimizerImplementation.FOREACH, OptimizerImplementation.FUSED


def _training(seq: int = 512, batch: int = 1, **changes: object) -> TrainingSpec:
    return dataclasses.replace(
        TrainingSpec(seq_len=seq, global_batch_size=batch, attention=Attention.FLASH), **changes
    )


def _one_gpu(accumulation: int = 1, **changes: object) -> Layout:
    fields: dict[str, object] = {"micro_batch_size": 1, **changes}
    return Layout(framework=Framework.FSDP, dp=1, gradient_accumulation_steps=accumulation, **fields)  # type: ignore[arg-type]


def _parts(model, cluster, layout, training):  # type: ignore[no-untyped-def]
    job = make_job(model, cluster, training)
    return job, stage_states(job, layout)[0], stage_activations(job, layout)[0]


def test_one_micro_batch_peaks_at_the_larger_moment_not_the_sum() -> None:
    """llama-3.2-1b at seq 512, micro-batch 1, fused AdamW: the end of the backward wins, every
    gradient + the first layer's activations + the tied embedding's second gradient + the held
    buffers (none: autocast's 16-bit copies are freed by then); nothing of the activations' total."""
    training = _training()
    layout = _one_gpu()
    job, states, acts = _parts(LLAMA_1B, ONE, layout, training)
    assert gradients_follow_activations(job, layout)
    assert acts.backward_end is not None
    per_gpu = estimate(LLAMA_1B, ONE, layout, training, tuning=default_tuning()).memory.per_gpu
    end = states.gradients + acts.backward_end + states.held_buffers + states.tied_embedding_transient
    start = states.head_gradients + acts.on_gpu + acts.buffers + states.buffers
    assert end > start
    assert states.held_buffers == 0  # one GPU: no DDP bucket; the autocast copies are released
    assert states.tied_embedding_transient == states.head_gradients > 0
    # the tied V x h gradient in the gradients' dtype (fp32: the master's under mixed precision)
    assert states.head_gradients == pytest.approx(LLAMA_1B.vocab_size * LLAMA_1B.hidden_size * 4)
    assert per_gpu.peak_allocated_bytes == states.parameters + states.optimizer_states + (
        states.gradients
        + math.ceil(acts.backward_end)
        + math.ceil(states.held_buffers + states.tied_embedding_transient)
    )
    assert per_gpu.gradients == states.gradients


def test_accumulation_or_a_framework_buffer_keeps_gradients_with_activations() -> None:
    """Gradient accumulation (a second micro-batch meets the first's gradients), DeepSpeed's and
    Megatron's buffers: every gradient is counted with every activation, as before."""
    training = _training(batch=2)
    layout = _one_gpu(accumulation=2)
    job, states, acts = _parts(LLAMA_1B, ONE, layout, training)
    assert not gradients_follow_activations(job, layout)
    per_gpu = estimate(LLAMA_1B, ONE, layout, training, tuning=default_tuning()).memory.per_gpu
    assert per_gpu.gradients == states.gradients
    assert per_gpu.activations == acts.on_gpu_bytes
    for framework in (Framework.DEEPSPEED, Framework.MEGATRON):
        other = dataclasses.replace(_one_gpu(), framework=framework, zero_stage=0)
        assert not gradients_follow_activations(make_job(LLAMA_1B, ONE, _training()), other)


def test_the_optimizer_temporary_is_one_moment_of_the_trainable_parameters() -> None:
    """foreach AdamW allocates sqrt(exp_avg_sq) for every trainable parameter in its dtype: 4 B per
    fp32 parameter under mixed precision, 2 B in pure bf16, sharded with the states; fused: 0."""
    for precision, element in ((Precision.BF16, 4), (Precision.BF16_PURE, 2), (Precision.FP32, 4)):
        training = _training(precision=precision, optimizer_implementation=FOREACH)
        job, states, _ = _parts(LLAMA_1B, ONE, _one_gpu(), training)
        assert states.optimizer_temporary == pytest.approx(element * job.counts.total, rel=1e-12)
        fused = _parts(
            LLAMA_1B, ONE, _one_gpu(), dataclasses.replace(training, optimizer_implementation=FUSED)
        )
        assert fused[1].optimizer_temporary == 0
    sharded = Layout(framework=Framework.FSDP, dp=8, zero_stage=3, micro_batch_size=1)
    training = _training(batch=8, optimizer_implementation=FOREACH)
    job, states, _ = _parts(LLAMA_1B, EIGHT, sharded, training)
    assert states.optimizer_temporary == pytest.approx(4 * job.counts.total / 8, rel=1e-9)


def test_the_step_moment_wins_when_activations_are_small() -> None:
    """At seq 64 the foreach step is the peak: states + gradients + the temporary, no activation."""
    training = _training(seq=64, optimizer_implementation=FOREACH)
    states = _parts(LLAMA_1B, ONE, _one_gpu(), training)[1]
    per_gpu = estimate(LLAMA_1B, ONE, _one_gpu(), training, tuning=default_tuning()).memory.per_gpu
    assert per_gpu.activations == 0
    assert per_gpu.buffers == math.ceil(states.held_buffers + states.optimizer_temporary)
    assert per_gpu.peak_allocated_bytes == (
        states.parameters + states.gradients + states.optimizer_states + per_gpu.buffers
    )


def test_foreach_is_refused_where_the_framework_builds_its_own_optimizer() -> None:
    training = _training(batch=8, optimizer_implementation=FOREACH)
    for framework, stage in ((Framework.DEEPSPEED, 2), (Framework.MEGATRON, 1)):
        layout = Layout(framework=framework, dp=8, zero_stage=stage, micro_batch_size=1)
        with pytest.raises(EstimatorError, match="optimizer_implementation foreach"):
            estimate(LLAMA_1B, EIGHT, layout, training, tuning=default_tuning())
    with pytest.raises(EstimatorError, match=r"only torch\.optim's AdamW"):
        _training(optimizer=Optimizer.SGD, optimizer_implementation=FOREACH)


@settings(max_examples=40, deadline=None)
@given(
    seq=st.sampled_from([64, 256, 1024, 4096]),
    micro=st.sampled_from([1, 2, 4]),
    recompute=st.sampled_from([Recompute.NONE, Recompute.FULL]),
    precision=st.sampled_from([Precision.BF16, Precision.BF16_PURE]),
    implementation=st.sampled_from([FUSED, FOREACH]),
    method=st.sampled_from([Method.FULL, Method.LORA]),
)
def test_moments_bound_and_order(
    seq: int, micro: int, recompute: Recompute, precision: Precision, implementation: OptimizerImplementation,
    method: Method,
) -> None:  # fmt: skip
    """Properties over the inputs: the peak is at least every gradient with the states, at most the
    old sum of everything + the step's temporary; accumulation never lowers it; foreach never lowers
    it; allocated <= reserved <= device used; and it grows with the micro-batch."""
    training = _training(seq=seq, batch=micro, precision=precision, method=method,
                         optimizer_implementation=implementation)  # fmt: skip
    layout = _one_gpu(recompute=recompute, micro_batch_size=micro)
    _, states, acts = _parts(LLAMA_8B, ONE, layout, training)
    tuning = default_tuning()
    per_gpu = estimate(LLAMA_8B, ONE, layout, training, tuning=tuning).memory.per_gpu
    floor = states.parameters + states.gradients + states.optimizer_states
    everything = floor + acts.on_gpu_bytes + acts.buffers + states.buffers + states.optimizer_temporary
    assert floor <= per_gpu.peak_allocated_bytes <= everything + 2
    assert per_gpu.peak_allocated_bytes <= per_gpu.peak_reserved_bytes <= per_gpu.device_used_bytes
    twice = dataclasses.replace(training, global_batch_size=2 * micro)
    accumulated = estimate(
        LLAMA_8B, ONE, dataclasses.replace(layout, gradient_accumulation_steps=2), twice, tuning=tuning
    )
    assert accumulated.memory.per_gpu.peak_allocated_bytes >= per_gpu.peak_allocated_bytes
    fused_training = dataclasses.replace(training, optimizer_implementation=FUSED)
    fused = estimate(LLAMA_8B, ONE, layout, fused_training, tuning=tuning)
    assert fused.memory.per_gpu.peak_allocated_bytes <= per_gpu.peak_allocated_bytes
    larger = estimate(
        LLAMA_8B, ONE, dataclasses.replace(layout, micro_batch_size=2 * micro), twice, tuning=tuning
    )
    assert larger.memory.per_gpu.device_used_bytes >= per_gpu.device_used_bytes


def test_grouped_query_sdpa_in_fp32_saves_what_eager_saves() -> None:
    """transformers' SDPA with enable_gqa in fp32 runs PyTorch's math kernel: its activations are
    eager attention's; in bf16 (flash) and for a model without grouped heads (GPT-2) they are not."""
    qwen, gpt2 = preset("qwen2.5-0.5b").spec, preset("gpt2").spec
    layout = Layout(framework=Framework.FSDP, dp=1, micro_batch_size=2)

    def layer(model, precision, attention):  # type: ignore[no-untyped-def]
        training = TrainingSpec(seq_len=1024, global_batch_size=2, precision=precision, attention=attention)
        return activations.kind_layer_bytes(make_job(model, ONE, training), layout, Recompute.NONE)

    for precision in (Precision.FP32, Precision.TF32):
        assert layer(qwen, precision, Attention.SDPA) == layer(qwen, precision, Attention.EAGER)
        training = TrainingSpec(
            seq_len=1024, global_batch_size=2, precision=precision, attention=Attention.SDPA
        )
        assert flops.materialises_scores(qwen, training)
        assert not flops.runs_causal_kernel(qwen, training)
        assert layer(gpt2, precision, Attention.SDPA) != layer(gpt2, precision, Attention.EAGER)
    bf16 = TrainingSpec(seq_len=1024, global_batch_size=2, attention=Attention.SDPA)
    assert not flops.materialises_scores(qwen, bf16)
    assert layer(qwen, Precision.BF16, Attention.SDPA) != layer(qwen, Precision.BF16, Attention.EAGER)


def test_a_gpu_without_flash_kernels_runs_grouped_query_sdpa_as_math() -> None:
    """On a V100 (no flash kernels) transformers' grouped-query SDPA in fp16 runs the math kernel: its
    layer saves what eager attention saves, upcast to fp32 (and no 16-bit copy of the probabilities),
    and its core computes the whole square; on an A100 the flash kernel runs. The GPU decides through
    defaults.for_gpu (TrainingSpec.gpu_flash_kernels), so jobs on the two never share memory memos."""
    llama = preset("llama-3.1-8b").spec
    layout = Layout(framework=Framework.FSDP, dp=1, micro_batch_size=1)
    sdpa = TrainingSpec(seq_len=2048, global_batch_size=1, precision=Precision.FP16, attention=Attention.SDPA)
    eager = dataclasses.replace(sdpa, attention=Attention.EAGER)
    v100, a100 = gpu_cluster(gpu("v100-sxm2-32gb"), 1, 25e9), gpu_cluster(gpu("a100-sxm-80gb"), 1, 25e9)

    def layer(cluster, training):  # type: ignore[no-untyped-def]
        job = make_job(llama, cluster, training)
        return job, activations.kind_layer_bytes(job, layout, Recompute.NONE)

    on_v100, on_a100 = layer(v100, sdpa), layer(a100, sdpa)
    assert not on_v100[0].training.gpu_flash_kernels and on_a100[0].training.gpu_flash_kernels
    # the attention tensors in fp32: q, k and v (repeated) 2 bytes more, the probabilities 2 fewer
    q, heads = llama.q_size, llama.num_attention_heads
    upcast = 2048 * (2 * 3 * q - 2 * heads * 2048)
    full = LayerKind(moe=False)
    assert on_v100[1][full] == pytest.approx(layer(v100, eager)[1][full] + upcast)
    assert on_a100[1] != layer(a100, eager)[1]
    assert flops.materialises_scores(llama, on_v100[0].training)
    assert not flops.materialises_scores(llama, on_a100[0].training)
    assert not flops.materialises_scores(preset("gpt2").spec, on_v100[0].training)  # no grouped heads
