"""Megatron settings the NVIDIA recipes choose (issue 27), each by hand on a tiny model.

* ``grad_reduce_in_fp32``: the gradient buffer and its reduce-scatter in fp32 (Megatron-LM's default
  for bf16) or bf16 (NVIDIA's recipes: the default here).
* ``fp8_param_gather``: fp8 GEMM weights (data + transpose, 2 B) instead of bf16 weights + the
  cached fp8 copy and transpose (2 + 2 B), all-gathered in fp8 (NVIDIA's fp8 recipes: the default here
  with the distributed optimizer).
* ``precision_aware_optimizer``: the distributed optimizer's Transformer Engine FusedAdam under bf16,
  its master the fp32 weights' low 16 bits (2 B) and no fp32 copy of the main grads (NVIDIA's
  performance recipes: the default here), or Megatron's own (a 4 B master, the grads cast at the step).
* Transformer Engine under fp8 saves each GEMM's input in fp8 (1 B) for backward.
"""

from __future__ import annotations

import dataclasses

import pytest

from service.estimator import activations, dp_comm
from service.estimator.errors import InvalidLayout
from service.estimator.memory import assumptions, layout_state_bytes, rank_states
from service.estimator.model_states import (
    grad_reduce_bytes,
    megatron_precision_aware_optimizer,
    optimizer_step_bytes,
)
from service.estimator.types import (
    Framework,
    Layout,
    Offload,
    Optimizer,
    Precision,
    RecomputeModule,
    TrainingSpec,
)
from service.estimator.validate import validate_layout
from tests.estimator.helpers import job, states
from tests.estimator.test_memory import TINY, TINY_P, cluster

TRAIN = TrainingSpec(seq_len=16, global_batch_size=8)
FP8 = dataclasses.replace(TRAIN, precision=Precision.FP8)
DIST = Layout(framework=Framework.MEGATRON, dp=4, zero_stage=1)
# TINY: h 8, 2 heads of 8 (q = kv = 8), SwiGLU f 16, 2 layers, vocab 32 untied: per layer
# q, k, v, o 4 x 64 = 256 and the MLP 3 x 8 x 16 = 384 GEMM weights, 2 norms of 8
TINY_LINEAR = 2 * (256 + 384)  # 1280 of TINY_P = 1832


def total(s: object) -> float:
    return s.parameters + s.gradients + s.optimizer_states  # type: ignore[attr-defined]


def test_bf16_gradient_buffer_is_two_bytes_per_parameter() -> None:
    c = cluster(4)
    own = dataclasses.replace(DIST, precision_aware_optimizer=False)  # Megatron's 4-byte fp32 master
    default = states(TINY, c, own, TRAIN)
    fp32 = states(TINY, c, dataclasses.replace(own, grad_reduce_in_fp32=True), TRAIN)
    # fp32 main grads (Megatron-LM's default): 2 + 4 + 12/4 = 9 B per parameter; bf16 grads: 2 + 2 + 3 = 7 B
    assert fp32.gradients == 4 * TINY_P and total(fp32) == 9 * TINY_P
    assert default.gradients == 2 * TINY_P and total(default) == 7 * TINY_P
    lean = states(TINY, c, dataclasses.replace(own, grad_reduce_in_fp32=False), TRAIN)
    assert total(lean) == total(default)  # None is NVIDIA's recipes' choice, bf16


def test_precision_aware_optimizer_keeps_a_two_byte_master_and_no_gradient_copy() -> None:
    c = cluster(4)
    j = job(TINY, c, TRAIN)
    own = dataclasses.replace(DIST, precision_aware_optimizer=False)
    aware = states(TINY, c, DIST, TRAIN)  # None: on for bf16 with the distributed optimizer and AdamW
    assert aware == states(TINY, c, dataclasses.replace(DIST, precision_aware_optimizer=True), TRAIN)
    # 2 B weights + 2 B bf16 grads + (2 B remainders + 8 B moments) / 4 = 6.5 B; Megatron's own 2 + 2 + 12/4
    assert total(aware) == 6.5 * TINY_P and total(states(TINY, c, own, TRAIN)) == 7 * TINY_P
    # the step: Megatron's own casts its 1/4 shard of the bf16 grads to fp32 (4 B each); FusedAdam reads them
    sb_own, sb_aware = layout_state_bytes(j, own), layout_state_bytes(j, DIST)
    assert (sb_own.casts_gradients, sb_aware.casts_gradients) == (True, False)
    assert rank_states(j, own, 0).optimizer_temporary - rank_states(j, DIST, 0).optimizer_temporary == TINY_P
    # HBM bytes per parameter of the step: own reads the fp32 master, moments and the bf16 grad, casts
    # the grad (read 2 + write 4 + read the copy 4, as counted: 2 x 4 + 2), writes master and moments,
    # then copies the master to the bf16 weights (read 4, write 2): 2 (4 + 8) + 2 + 8 + 4 + 2 = 40;
    # FusedAdam reads and writes weights, remainders and moments and reads the grad: 2 (2 + 2 + 8) + 2
    # = 26
    assert optimizer_step_bytes(sb_own, Framework.MEGATRON) == 40
    assert optimizer_step_bytes(sb_aware, Framework.MEGATRON) == 26
    # fp32 main grads: the same 2-byte master, no copy to make either way
    fp32 = dataclasses.replace(DIST, grad_reduce_in_fp32=True)
    assert total(states(TINY, c, fp32, TRAIN)) == (2 + 4 + 2.5) * TINY_P


def test_precision_aware_optimizer_is_the_bf16_recipes_default_and_runs_where_megatron_runs_it() -> None:
    c = cluster(4)
    fp16 = dataclasses.replace(TRAIN, precision=Precision.FP16)
    # by default only bf16 with the distributed optimizer and Adam: fp8 and fp16 keep Megatron's own
    # optimizer (NVIDIA's scripts set it for bf16), and so do ZeRO-0 and SGD
    for training, layout in (
        (FP8, DIST),
        (fp16, DIST),
        (TRAIN, Layout(framework=Framework.MEGATRON, dp=4)),
        (dataclasses.replace(TRAIN, optimizer=Optimizer.SGD), DIST),
    ):
        assert not megatron_precision_aware_optimizer(layout, training)
        assert layout_state_bytes(job(TINY, c, training), layout).casts_gradients
    # stated, Megatron refuses it without the distributed optimizer and with any optimizer but Adam;
    # over fp8 weights (--fp8-param-gather) it is not modelled
    for training, layout in (
        (TRAIN, Layout(framework=Framework.MEGATRON, dp=4)),
        (dataclasses.replace(TRAIN, optimizer=Optimizer.SGD), DIST),
        (FP8, DIST),
    ):
        stated = dataclasses.replace(layout, precision_aware_optimizer=True)
        with pytest.raises(InvalidLayout, match="precision_aware_optimizer"):
            validate_layout(TINY, c, stated, training)
    # fp16 (a 4-byte master, no fp32 copy of the grads) and fp8 over bf16 weights under the delayed
    # scaling the launch file sets (bf16's remainders) run it (Megatron review)
    aware = dataclasses.replace(DIST, precision_aware_optimizer=True)
    validate_layout(TINY, c, aware, fp16)
    sb16 = layout_state_bytes(job(TINY, c, fp16), aware)
    assert (sb16.master, sb16.casts_gradients, sb16.master_remainders) == (4, False, False)
    # its step: master and moments read and written, the fp16 grad read, the weights written in the
    # kernel (no copy back reading the master again): 2 (4 + 8) + 2 + 2 = 28 (change review)
    assert optimizer_step_bytes(sb16, Framework.MEGATRON) == 28
    bf16_weights = dataclasses.replace(aware, fp8_param_gather=False)
    validate_layout(TINY, c, bf16_weights, FP8)
    sb8 = layout_state_bytes(job(TINY, c, FP8), bf16_weights)
    assert (sb8.master, sb8.casts_gradients, sb8.master_remainders) == (2, False, True)
    # offloaded, Megatron needs it (validate_args): on by default, refused off; the host keeps the master
    offloaded = dataclasses.replace(DIST, offload_optimizer=Offload.CPU)
    assert megatron_precision_aware_optimizer(offloaded, TRAIN)
    assert not layout_state_bytes(job(TINY, c, TRAIN), offloaded).master_remainders
    with pytest.raises(InvalidLayout, match="offload_optimizer cpu"):
        validate_layout(TINY, c, dataclasses.replace(offloaded, precision_aware_optimizer=False), TRAIN)
    with pytest.raises(InvalidLayout, match="precision_aware_optimizer"):  # Megatron's switch
        validate_layout(
            TINY,
            c,
            Layout(framework=Framework.FSDP, dp=4, zero_stage=3, precision_aware_optimizer=False),
            TRAIN,
        )


def test_fp8_param_gather_drops_the_bf16_copy_and_the_fp8_cache() -> None:
    c = cluster(4)
    cached = states(TINY, c, dataclasses.replace(DIST, fp8_param_gather=False), FP8)
    fp8_weights = states(TINY, c, DIST, FP8)  # None: on with fp8 and the distributed optimizer
    assert fp8_weights == states(TINY, c, dataclasses.replace(DIST, fp8_param_gather=True), FP8)
    # cached: 2 B bf16 weights for all 1832 + 2 B (fp8 copy + transpose) for the 1280 GEMM weights
    assert cached.parameters == 2 * TINY_P + 2 * TINY_LINEAR == 6224
    # fp8 parameters: 1 B data + 1 B transpose for the GEMM weights, 2 B bf16 for the other 552
    assert fp8_weights.parameters == 2 * TINY_LINEAR + 2 * (TINY_P - TINY_LINEAR) == 2 * TINY_P


def test_the_reduce_scatter_moves_the_buffers_dtype() -> None:
    fp32 = grad_reduce_bytes(Precision.BF16, dataclasses.replace(DIST, grad_reduce_in_fp32=True))
    bf16 = grad_reduce_bytes(Precision.BF16, DIST)
    assert (fp32, bf16) == (4, 2)
    assert grad_reduce_bytes(Precision.FP8, dataclasses.replace(DIST, grad_reduce_in_fp32=True)) == 4
    assert grad_reduce_bytes(Precision.FP16, dataclasses.replace(DIST, grad_reduce_in_fp32=True)) == 2


def test_fp8_parameter_gather_bytes_by_the_share_of_gemm_weights() -> None:
    j = job(TINY, cluster(4), FP8)
    assert dp_comm.gathered_bytes_per_parameter(j, dataclasses.replace(DIST, fp8_param_gather=False)) == 2
    # 1 B for the 1280 GEMM weights, 2 B for the 552 others: (1280 + 1104) / 1832
    fp8 = dp_comm.gathered_bytes_per_parameter(j, DIST)
    assert fp8 == pytest.approx((TINY_LINEAR + 2 * (TINY_P - TINY_LINEAR)) / TINY_P)


def test_transformer_engine_saves_gemm_inputs_in_fp8() -> None:
    layout = Layout(framework=Framework.MEGATRON, dp=1)
    bf16 = activations.megatron_layer_bytes(TINY, layout, TRAIN, moe_layer=False)
    fp8 = activations.megatron_layer_bytes(TINY, layout, FP8, moe_layer=False)
    t, h, q, f = 16, 8, 8, 16
    # bf16, Korthikanti generalised: 2 norm inputs 2th each, QKV input 2th, q k v 2t(q + 2kv) (kv = q
    # here), projection input 2tq, fc1 input 2th, fc1 output 2 x 2tf, product 2tf; flash's fp32
    # logsumexp 4 B per head and token
    assert bf16 == 2 * t * (2 * h + h + (q + 2 * q) + q + h + 3 * f) + 4 * 2 * t == 3712
    # fp8: the QKV and fc1 inputs (th each) and fc2's input (tf) in 1 B; the projection keeps its own
    # fp8 copy (tq) beside the attention output
    assert fp8 == bf16 - t * h - t * h - t * f + t * q == 3328
    # with the core recomputed the 16-bit attention output is not kept: only the fp8 copy
    core = activations.megatron_layer_bytes(
        TINY, layout, FP8, moe_layer=False, modules=frozenset({RecomputeModule.CORE_ATTN})
    )
    assert core == fp8 - 2 * t * q - 4 * 2 * t  # minus the 16-bit output and the fp32 logsumexp (2 heads)


def test_the_switches_are_refused_where_they_change_nothing() -> None:
    c = cluster(4)
    fsdp = Layout(framework=Framework.FSDP, dp=4, zero_stage=3, grad_reduce_in_fp32=False)
    with pytest.raises(InvalidLayout, match="grad_reduce_in_fp32"):
        validate_layout(TINY, c, fsdp, TRAIN)
    with pytest.raises(InvalidLayout, match="fp8_param_gather"):  # bf16 training
        validate_layout(TINY, c, dataclasses.replace(DIST, fp8_param_gather=True), TRAIN)
    with pytest.raises(InvalidLayout, match="distributed optimizer"):
        validate_layout(TINY, c, Layout(framework=Framework.MEGATRON, dp=4, fp8_param_gather=True), FP8)


def test_the_estimate_says_what_it_assumed() -> None:
    j = job(TINY, cluster(4), FP8)
    notes = " ".join(
        assumptions(j, dataclasses.replace(DIST, grad_reduce_in_fp32=False, fp8_param_gather=True))
    )
    assert "gradient buffer and its reduce-scatter in bf16 (--grad-reduce-in-bf16) (as set)" in notes
    assert "--fp8-param-gather" in notes and "input for backward in fp8" in notes
    default = " ".join(assumptions(j, DIST))
    assert "in bf16 (--grad-reduce-in-bf16) (NVIDIA's recipes' default" in default
    assert "--fp8-param-gather, NVIDIA's fp8 recipes' default" in default
    bf16 = job(TINY, cluster(4), TRAIN)
    aware = " ".join(assumptions(bf16, DIST))
    assert "--use-precision-aware-optimizer" in aware and "NVIDIA's bf16 recipes' default" in aware
    assert "casts the 16-bit main grads" not in aware
    own = " ".join(assumptions(bf16, dataclasses.replace(DIST, precision_aware_optimizer=False)))
    assert "--use-precision-aware-optimizer" not in own and "casts the 16-bit main grads" in own
