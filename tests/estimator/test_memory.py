"""Per-GPU memory: tiny hand-computed cases (arithmetic in comments) and monotonic properties."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator import activations, evaluate, step_time
from service.estimator.job import make_job
from service.estimator.memory import assumptions, layout_state_bytes, stage_states
from service.estimator.model_states import (
    MIXED,
    adafactor_state_fraction,
    deepspeed_assumption,
    deepspeed_bf16_optimizer,
    deepspeed_buckets,
    lora_parameters,
    moment_bytes,
    shard_degrees,
    state_bytes,
)
from service.estimator.params import LayerKind, parameter_counts
from service.estimator.types import (
    Attention,
    ClusterSpec,
    Compile,
    Estimate,
    Framework,
    GPUSpec,
    Layout,
    MemoryStatistic,
    Method,
    MlpKind,
    ModelSpec,
    MoESpec,
    NormKind,
    Offload,
    Optimizer,
    PeakFlops,
    Precision,
    Recompute,
    TrainingSpec,
)
from tests.estimator.helpers import fits, job, memory, rank_parameters, stage_activation_bytes, states
from validation import published_formulas

DENSE = LayerKind(moe=False)  # a dense decoder layer with full attention

GB = 10**9
ASSUME = default_tuning().memory

# 2 layers, h 8, 2 heads, ffn 16, vocab 32, SwiGLU, RMSNorm, untied. Parameters:
# attention 4 x 8 x 8 = 256, MLP 3 x 8 x 16 = 384, two norms 2 x 8 = 16 per layer;
# embedding 32 x 8 = 256, lm_head 256, final norm 8 -> 2 x 656 + 520 = 1832.
TINY = ModelSpec(
    name="tiny",
    num_layers=2,
    hidden_size=8,
    num_attention_heads=2,
    num_kv_heads=2,
    ffn_hidden_size=16,
    vocab_size=32,
)
TINY_P = 1832


def gpu(memory_bytes: int = 80 * 2**30, bf16: bool = True) -> GPUSpec:
    return GPUSpec(
        name="test-gpu",
        memory_bytes=memory_bytes,
        peak_flops_per_s=PeakFlops(fp32=6.7e13, bf16=9.9e14 if bf16 else None, fp16=9.9e14, fp8=1.98e15),
        hbm_bandwidth_bytes_per_s=3.35e12,
        intra_node_bandwidth_bytes_per_s=4.5e11,
        pcie_bandwidth_bytes_per_s=6.4e10,
    )


def cluster(gpus: int = 8, per_node: int = 8, memory_bytes: int = 80 * 2**30) -> ClusterSpec:
    return ClusterSpec(
        gpu=gpu(memory_bytes),
        num_nodes=max(1, gpus // per_node),
        gpus_per_node=min(gpus, per_node),
        intra_node_bandwidth_bytes_per_s=4.5e11,
        inter_node_bandwidth_bytes_per_s=5e10,
    )


def states_total(model: ModelSpec, layout: Layout, training: TrainingSpec, gpus: int = 8) -> float:
    worst = 0.0
    for rank in {0, layout.pp - 1}:
        s = states(model, cluster(gpus), layout, training, rank)
        worst = max(worst, s.parameters + s.gradients + s.optimizer_states)
    return worst


TRAIN = TrainingSpec(seq_len=16, global_batch_size=8)


# ---------------------------------------------------------------- hand-computed model states


def test_tiny_zero0_mixed_adam_is_16_bytes_per_param() -> None:
    s = states(TINY, cluster(1), Layout(dp=1), TRAIN)
    # bf16 weights 2 x 1832 = 3664, bf16 grads 3664, fp32 master + m + v 12 x 1832 = 21984.
    assert (s.parameters, s.gradients, s.optimizer_states) == (3664, 3664, 21984)


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        # ZeRO-1 over 4: 2P, 2P, 12P/4 = 3664, 3664, 5496
        (1, (3664, 3664, 5496)),
        # ZeRO-2: 2P, 2P/4, 12P/4 = 3664, 916, 5496
        (2, (3664, 916, 5496)),
        # ZeRO-3: 2P/4, 2P/4, 12P/4 = 916, 916, 5496 (16P/4 = 7328)
        (3, (916, 916, 5496)),
    ],
)
def test_tiny_zero_stages(stage: int, expected: tuple[int, int, int]) -> None:
    s = states(TINY, cluster(4), Layout(dp=4, zero_stage=stage), TRAIN)
    assert (s.parameters, s.gradients, s.optimizer_states) == expected


def test_megatron_bytes_per_param_match_distributed_optimizer_table() -> None:
    c = cluster(4)
    # the table counts Megatron-LM's own defaults for bf16: fp32 main grads (grad_reduce_in_fp32), its
    # own fp32 master (no precision-aware optimizer)
    plain = states(TINY, c, Layout(framework=Framework.MEGATRON, dp=4, grad_reduce_in_fp32=True), TRAIN)
    # bf16 params 2 + fp32 main grads 4 + fp32 master and Adam 12 = 18 bytes per parameter.
    assert plain.parameters + plain.gradients + plain.optimizer_states == 18 * TINY_P
    own = {"grad_reduce_in_fp32": True, "precision_aware_optimizer": False}
    dist_layout = Layout(framework=Framework.MEGATRON, dp=4, zero_stage=1, **own)
    dist = states(TINY, c, dist_layout, TRAIN)
    # Distributed optimizer: 6 + 12/4 = 9 bytes per parameter.
    assert dist.parameters + dist.gradients + dist.optimizer_states == 9 * TINY_P
    # NVIDIA's recipes' bf16 gradient buffer and precision-aware optimizer (the defaults): 2 bytes less
    # per parameter, and a 2-byte master (its remainders): 2 + 2 + 10/4
    recipe = states(TINY, c, Layout(framework=Framework.MEGATRON, dp=4, zero_stage=1), TRAIN)
    assert recipe.parameters + recipe.gradients + recipe.optimizer_states == 6.5 * TINY_P
    fp16 = dataclasses.replace(TRAIN, precision=Precision.FP16)
    dist16_layout = Layout(framework=Framework.MEGATRON, dp=4, zero_stage=1)
    dist16 = states(TINY, c, dist16_layout, fp16)
    # fp16: 4 + 16/d = 4 + 4 = 8 bytes per parameter at the step: 4 + 12/d held throughout, and the fp32
    # copy of the fp16 main grads the step makes, 4/d, a step temporary (main_param.grad =
    # main_grad.float(), freed by the next step's zero_grad), as with bf16 main grads
    assert dist16.parameters + dist16.gradients + dist16.optimizer_states == 7 * TINY_P
    # as bf16 main grads do under Megatron's own optimizer (the precision-aware one steps them as they are)
    own_bf16 = dataclasses.replace(dist16_layout, precision_aware_optimizer=False)
    for precision, layout in ((Precision.FP16, dist16_layout), (Precision.BF16, own_bf16)):
        (rank,) = stage_states(job(TINY, c, dataclasses.replace(TRAIN, precision=precision)), layout)
        assert rank.optimizer_temporary == 4 * TINY_P / 4
    assert stage_states(job(TINY, c, TRAIN), dist16_layout)[0].optimizer_temporary == 0
    fp32_grads = dataclasses.replace(own_bf16, grad_reduce_in_fp32=True)
    assert stage_states(job(TINY, c, TRAIN), fp32_grads)[0].optimizer_temporary == 0  # .float() is the tensor


def test_fsdp_full_shard_keeps_fp32_master_as_the_parameter() -> None:
    s = states(TINY, cluster(4), Layout(framework=Framework.FSDP, dp=4, zero_stage=3), TRAIN)
    # sharded fp32 parameter 4P/4 = 1832, fp32 gradients 1832, Adam moments 8P/4 = 3664: 16P/4 in all.
    assert (s.parameters, s.gradients, s.optimizer_states) == (1832, 1832, 3664)


def test_fsdp_shard_grad_op_keeps_unsharded_bf16_copy_as_a_buffer() -> None:
    lay = Layout(framework=Framework.FSDP, dp=4, zero_stage=2)
    s = states(TINY, cluster(4), lay, TRAIN)
    assert s.parameters == 1832  # the fp32 shard 4P/4
    full = memory(TINY, cluster(4, per_node=4), dataclasses.replace(lay, zero_stage=3), TRAIN)
    grad_op = memory(TINY, cluster(4, per_node=4), lay, TRAIN)
    # SHARD_GRAD_OP holds all 2P = 3664 bytes of bf16 weights from forward to backward (+ one
    # layer's gradients); FULL_SHARD gathers two layers and the output unit.
    assert grad_op.per_gpu.buffers - full.per_gpu.buffers > 0


def test_bf16_pure_and_fp32() -> None:
    c = cluster(1)
    pure = states(TINY, c, Layout(), dataclasses.replace(TRAIN, precision=Precision.BF16_PURE))
    # 2 + 2 + (2 moments x 2 bytes) = 8 bytes per parameter, no master copy.
    assert pure.parameters + pure.gradients + pure.optimizer_states == 8 * TINY_P
    fp32 = states(TINY, c, Layout(), dataclasses.replace(TRAIN, precision=Precision.FP32))
    # 4 + 4 + 8 = 16 bytes per parameter.
    assert fp32.parameters + fp32.gradients + fp32.optimizer_states == 16 * TINY_P


def test_optimizer_moments() -> None:
    a = ASSUME
    assert moment_bytes(TRAIN, TINY, a) == 8  # Adam m + v in fp32
    assert moment_bytes(dataclasses.replace(TRAIN, optimizer=Optimizer.SGD), TINY, a) == 4
    assert moment_bytes(dataclasses.replace(TRAIN, optimizer=Optimizer.LION), TINY, a) == 4
    # 8-bit Adam: 2 x (1 byte + 4-byte absmax / 256 elements) = 2.03125 (bitsandbytes Optimizer2State:
    # absmax1 and absmax2, one float per 256-element block of each moment)
    assert moment_bytes(dataclasses.replace(TRAIN, optimizer=Optimizer.ADAMW_8BIT), TINY, a) == 2.03125
    # Adafactor: per layer (8+8)x4 + (8+16)x3 = 136 row+col stats, x2 layers = 272, + embedding 32 + 8
    # = 312, + norms 2 x 16 + 8 = 40 vectors -> 352 / 1832 elements per parameter, times 4 bytes.
    assert adafactor_state_fraction(TINY, TRAIN) == pytest.approx(352 / 1832)
    # ... where it steps the model's own tensors; DeepSpeed hands it flat 1-D partitions, which it does
    # not factor (transformers' Adafactor: factored = len(grad_shape) >= 2): a whole fp32 second moment
    adafactor = dataclasses.replace(TRAIN, optimizer=Optimizer.ADAFACTOR)
    assert state_bytes(adafactor, Framework.FSDP, TINY, a, False).moments == pytest.approx(4 * 352 / 1832)
    flat = state_bytes(adafactor, Framework.DEEPSPEED, TINY, a, False, flat_partitions=True)
    assert flat.moments == 4
    # DeepSpeed's ZeRO-0 without a pipeline steps shaped tensors (FP16_UnfusedOptimizer's clones): factored
    assert state_bytes(adafactor, Framework.DEEPSPEED, TINY, a, False).moments == pytest.approx(
        4 * 352 / 1832
    )
    zero0 = layout_state_bytes(job(TINY, cluster(4), adafactor), Layout(framework=Framework.DEEPSPEED, dp=4))
    zero1 = Layout(framework=Framework.DEEPSPEED, dp=4, zero_stage=1)
    assert zero0.moments < 1 and layout_state_bytes(job(TINY, cluster(4), adafactor), zero1).moments == 4


def test_8bit_adam_keeps_the_embedding_tables_states_in_32_bits_where_it_steps_the_models_parameters() -> (
    None
):
    """The HF Trainer registers optim_bits 32 for every nn.Embedding (transformers create_optimizer):
    8 B of states for TINY's 32 x 8 token table, 2.03125 B for the other 1576 parameters, on DDP (the
    FSDP framework's zero_stage 0); DeepSpeed steps flattened partitions no override matches. Llama 3.2
    3B on a 24 GB card was said to fit by 1.36 GiB without its table's 2.2 GiB (fine-tuner review)."""
    eight_bit = dataclasses.replace(TRAIN, optimizer=Optimizer.ADAMW_8BIT)
    table = TINY.vocab_size * TINY.hidden_size
    expected = (table * 8 + (TINY_P - table) * 2.03125) / TINY_P
    ddp = states(TINY, cluster(1), Layout(framework=Framework.FSDP), eight_bit)
    assert ddp.optimizer_states == pytest.approx(expected * TINY_P)  # DDP's fp32 weights are the master
    zero = states(TINY, cluster(1), Layout(framework=Framework.DEEPSPEED), eight_bit)
    assert zero.optimizer_states == pytest.approx((4 + 2.03125) * TINY_P)  # its fp32 master + moments
    # adapters only: the tables are frozen
    lora = dataclasses.replace(eight_bit, method=Method.LORA, lora_rank=4, lora_targets=("q_proj",))
    j = job(TINY, cluster(1), lora)
    assert layout_state_bytes(j, Layout(framework=Framework.FSDP)).moments == 2.03125


def test_lion_on_the_fsdp_frameworks_paths_keeps_bitsandbytes_fp32_momentum() -> None:
    """The HF Trainer's lion_32bit is bitsandbytes' Lion with optim_bits 32: an fp32 momentum whatever
    the weights' dtype, 4 B where pure bf16 counted its element, 2 (bytes review, stop 50); DeepSpeed's
    own Lion keeps the weights' dtype there."""
    lion = dataclasses.replace(TRAIN, optimizer=Optimizer.LION, precision=Precision.BF16_PURE)
    j = job(TINY, cluster(1), lion)
    assert layout_state_bytes(j, Layout(framework=Framework.FSDP)).moments == 4
    assert layout_state_bytes(j, Layout(framework=Framework.DEEPSPEED)).moments == 2
    from service.launchers import accelerate
    from tests.launchers.factories import plan as make_plan
    from tests.launchers.factories import training

    built = make_plan(train=training(optimizer=Optimizer.LION), framework=Framework.FSDP, zero_stage=3)
    assert "bitsandbytes.optim.Lion(..., optim_bits=32)" in accelerate.duties(built)


def test_adafactor_factors_what_trains() -> None:
    # LoRA rank r: A (r x in) keeps r + in, B (out x r) out + r: (2r + in + out) / (r (in + out)) of
    # each adapter's parameters, about 1/r, not the base model's ratio (property review: 170x too
    # small for Llama 3.1 8B's rank-16 adapters, and falling as the vocabulary grew)
    lora = dataclasses.replace(TRAIN, method=Method.LORA, lora_rank=4, lora_targets=("q_proj", "v_proj"))
    h, q, kv = TINY.hidden_size, TINY.q_size, TINY.kv_size
    expected = (2 * 4 + h + q + 2 * 4 + h + kv) / (4 * (h + q) + 4 * (h + kv))
    assert adafactor_state_fraction(TINY, lora) == pytest.approx(expected)
    wider = dataclasses.replace(TINY, vocab_size=4 * TINY.vocab_size)
    assert adafactor_state_fraction(wider, lora) == adafactor_state_fraction(TINY, lora)
    # an MoE layer's experts are matrices too: E x 3 x (h + f_e), and the router h + E
    moe = dataclasses.replace(TINY, moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=8))
    counts = parameter_counts(moe)
    attention = (h + q) + 2 * (h + kv) + (q + h)
    experts = 4 * 3 * (h + 8) + (h + 4)
    vectors = counts.norms_per_layer * moe.num_layers + counts.final_norm
    factored = moe.num_layers * (attention + experts) + moe.vocab_size + h
    assert adafactor_state_fraction(moe, TRAIN) == pytest.approx((factored + vectors) / counts.total)


def test_rank_parameters_split_tp_and_pp() -> None:
    lay = Layout(framework=Framework.MEGATRON, tp=2, pp=2)  # (DeepSpeed's AutoTP splits no untied embedding)
    first, last = rank_parameters(TINY, lay, 0), rank_parameters(TINY, lay, 1)
    # One layer per stage: (256 + 384) / 2 = 320 sharded + 16 replicated norms.
    # First: + embedding 256/2 = 128 -> 464. Last: + final norm 8 + lm_head 256/2 = 128 -> 472.
    assert (first.dense, last.dense) == (464, 472)


def test_lora_parameter_count() -> None:
    lora = dataclasses.replace(TRAIN, method=Method.LORA, lora_rank=2, lora_targets=("q_proj", "v_proj"))
    # r x (d_in + d_out) = 2 x (8 + 8) per target, 2 targets, 2 layers = 128.
    assert lora_parameters(TINY, lora, Layout(), rank_parameters(TINY, Layout(), 0)) == 128


def test_lora_freezes_the_base_without_gradients() -> None:
    lora = dataclasses.replace(TRAIN, method=Method.LORA, lora_rank=2, lora_targets=("q_proj", "v_proj"))
    s = states(TINY, cluster(1), Layout(), lora)
    # frozen bf16 base 2 x 1832 + adapters 2 x 128; grads 2 x 128; optimizer 12 x 128.
    assert (s.parameters, s.gradients, s.optimizer_states) == (2 * 1832 + 256, 256, 1536)


def test_qlora_quantises_layer_linears_only() -> None:
    q = dataclasses.replace(TRAIN, method=Method.QLORA, lora_rank=2, lora_targets=("q_proj",))
    s = states(TINY, cluster(1), Layout(), q)
    # Linears 2 x 640 = 1280 at 4.127/8 bytes; the other 552 (embedding, head, norms) bf16; +2 x 64 adapters.
    assert s.parameters == pytest.approx(1280 * 4.127 / 8 + 552 * 2 + 2 * 64)


def test_cpu_offload_moves_optimizer_and_gradients_to_host() -> None:
    lay = Layout(dp=4, zero_stage=2, offload_optimizer=Offload.CPU)
    s = states(TINY, cluster(4), lay, TRAIN)
    # GPU keeps 2P bf16 weights; host: (12 + 4 fp32 grad copy) x P/4 = 7328 per GPU.
    assert (s.parameters, s.gradients, s.optimizer_states) == (3664, 0, 0)
    assert s.host_bytes == 7328
    # two micro-batches a step (global 8 over dp 4): DeepSpeed accumulates each partition parameter's
    # gradient in a pinned 16-bit host tensor (stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu),
    # 2 x P/4 = 916 per GPU more; one micro-batch a step allocates none
    est = memory(TINY, cluster(4, per_node=4), lay, TRAIN)
    assert est.cpu_per_node_bytes == 4 * (7328 + 916)
    one = memory(TINY, cluster(4, per_node=4), lay, dataclasses.replace(TRAIN, global_batch_size=4))
    assert one.cpu_per_node_bytes == 4 * 7328
    # ZeRO-3 keeps every partition's 16-bit gradient in a pinned host flat buffer beside the fp32 copies
    # (stage3.py grad_partitions_flat_buffer, on the CPU under offload), whatever the accumulation
    zero3 = memory(TINY, cluster(4, per_node=4), dataclasses.replace(lay, zero_stage=3), TRAIN)
    assert zero3.cpu_per_node_bytes == 4 * (7328 + 916)


def test_zero_1_cpu_offload_keeps_the_16_bit_gradients_on_the_gpu() -> None:
    """A review's case: Qwen2.5-7B on 2 x RTX 4090 'fitted' at 19.8 GiB with ZeRO-1 + optimizer
    offload and 16 accumulation steps, its gradients counted 0; DeepSpeed's ZeRO-1 reduces (and hands
    the CPU optimizer) its gradients only at the accumulation boundary and keeps them in param.grad
    until then (stage_1_and_2.py reduce_ready_partitions_and_remove_grads), 15 GB more. The host side
    is ZeRO-2's."""
    zero1 = Layout(dp=4, zero_stage=1, offload_optimizer=Offload.CPU)
    s = states(TINY, cluster(4), zero1, TRAIN)
    # GPU: 2P bf16 weights and 2P bf16 gradients, unsharded (P = 1832); host: (12 + 4) x P/4
    assert (s.parameters, s.gradients, s.optimizer_states) == (3664, 3664, 0)
    assert s.host_bytes == 7328
    zero2 = states(TINY, cluster(4), dataclasses.replace(zero1, zero_stage=2), TRAIN)
    assert zero2.gradients == 0 and zero2.host_bytes == s.host_bytes


def test_fp8_adds_weight_caches() -> None:
    fp8 = dataclasses.replace(TRAIN, precision=Precision.FP8)
    s = states(TINY, cluster(1), Layout(), fp8)
    # bf16 weights 3664 + fp8 weight and transpose (2 bytes) for the 1280 layer-Linear parameters.
    assert s.parameters == 3664 + 2 * 1280
    assert state_bytes(fp8, Framework.DEEPSPEED, TINY, ASSUME, grads_in_fp32=False).master == 4


def test_fsdp_fp8_keeps_no_weight_cache() -> None:
    # torchao Float8Linear (FSDP's fp8) casts the weight in each forward and keeps no fp8 copy across
    # micro-batches: SHARD_GRAD_OP holds its fp32 sharded parameters only, as under bf16.
    fp8 = dataclasses.replace(TRAIN, precision=Precision.FP8)
    lay = Layout(framework=Framework.FSDP, dp=4, zero_stage=2)
    assert states(TINY, cluster(4), lay, fp8).parameters == states(TINY, cluster(4), lay, TRAIN).parameters


# ---------------------------------------------------------------- activations, hand-computed


def test_hf_llama_layer_activation_bytes_by_hand() -> None:
    # h 128, 8 heads / 2 kv heads (head_dim 16), ffn 352, bf16, SDPA, b 2, s 64: T = 128 tokens.
    model = ModelSpec(
        name="llama-tiny", family="llama", num_layers=2, hidden_size=128, num_attention_heads=8,
        num_kv_heads=2, ffn_hidden_size=352, vocab_size=1024,
    )  # fmt: skip
    training = TrainingSpec(seq_len=64, global_batch_size=2, attention=Attention.SDPA)
    lay = Layout(framework=Framework.FSDP, micro_batch_size=2)
    # Two RMSNorms: fp32 input 4Th = 65536, rsqrt 4T = 512, bf16 normalised 2Th = 32768, and the
    # output saved by the next Linear 2Th = 32768 -> 2 x 131584 = 263168.
    # Attention: q 2Tq = 32768, k and v 2T x 32 = 8192 each, logsumexp 4 x T x 8 = 4096, output
    # (o_proj input) 32768 -> 86016. SwiGLU: gate, up, SiLU, product 4 x 2 x T x 352 = 360448.
    assert activations.hf_layer_bytes(model, lay, training, False) == 263168 + 86016 + 360448


def test_megatron_layer_is_korthikanti_for_gpt() -> None:
    gpt = ModelSpec(
        name="gpt-22b", num_layers=48, hidden_size=6144, num_attention_heads=64, num_kv_heads=64,
        ffn_hidden_size=4 * 6144, vocab_size=51200, mlp=MlpKind.GELU, norm=NormKind.LAYERNORM,
        hidden_dropout=0.1, attention_dropout=0.1,
    )  # fmt: skip
    training = TrainingSpec(seq_len=2048, global_batch_size=4, attention=Attention.EAGER)
    lay = Layout(framework=Framework.MEGATRON, tp=8, micro_batch_size=4)
    # sbh(10 + 24/8 + 5as/(8h)) with s 2048, b 4, h 6144, a 64.
    expected = published_formulas.korthikanti_layer_bytes(s=2048, b=4, h=6144, a=64, t=8)
    assert activations.megatron_layer_bytes(gpt, lay, training, False) == pytest.approx(expected, rel=1e-12)
    # without dropout: no 1-byte masks (sbh x 2: after attention and after the MLP) and the eager
    # probabilities are kept once (2as, not softmax + mask + dropout output 5as)
    plain = dataclasses.replace(gpt, hidden_dropout=0.0, attention_dropout=0.0)
    sbh, asb = 2048 * 4 * 6144, 64 * 2048 * 2048 * 4
    without = expected - 2 * sbh - 3 * asb / 8
    assert activations.megatron_layer_bytes(plain, lay, training, False) == pytest.approx(without, rel=1e-12)


def test_pipeline_micro_batches_in_flight() -> None:
    # 1F1B: rank r holds min(p - r, m); interleaved rank 0: p (1 + (p-1)/(pv)) = 4 x 1.375 = 5.5.
    assert activations.micro_batches_in_flight(Layout(pp=4), 0, 8) == 4
    assert activations.micro_batches_in_flight(Layout(pp=4), 0, 2) == 2
    assert activations.micro_batches_in_flight(Layout(pp=4), 3, 8) == 1
    assert activations.micro_batches_in_flight(Layout(pp=4, virtual_pipeline_stages=2), 0, 8) == 5.5


def test_pytorchs_interleaved_schedule_warms_up_over_its_round() -> None:
    # ScheduleInterleaved1F1B (torchtitan): (v-1) x m // max(1, m // p) warm-up chunks where Megatron's
    # takes (v-1)p. pp 4, v 2: 6 micro-batches are one round of 6, rank 0 min(6 + 6 + 1, 12) / 2 = all 6,
    # rank 1 (6 + 4 + 1) / 2 = 5.5 (Megatron's count: 4.5), rank 3 7 / 2 = 3.5; 8 are two rounds of 4,
    # as Megatron's
    fsdp = Layout(framework=Framework.FSDP, pp=4, virtual_pipeline_stages=2, zero_stage=3)
    assert [activations.micro_batches_in_flight(fsdp, r, 6) for r in range(4)] == [6.0, 5.5, 4.5, 3.5]
    megatron = Layout(framework=Framework.MEGATRON, pp=4, virtual_pipeline_stages=2, zero_stage=1)
    assert activations.micro_batches_in_flight(fsdp, 0, 8) == activations.micro_batches_in_flight(
        megatron, 0, 8
    )


def test_interleaved_micro_batches_in_flight_are_capped_by_the_micro_batches() -> None:
    # Megatron's interleaved warm-up, (v-1)p + 2(p-1-r) chunk forwards, is capped at all m x v of
    # them: pp 4, v 2, m 4 -> rank 0 min(4 + 6 + 1, 8) / 2 = 4 (not 5.5), rank 1 min(9, 8) / 2 = 4,
    # rank 2 7 / 2 = 3.5, rank 3 5 / 2 = 2.5.
    lay = Layout(pp=4, virtual_pipeline_stages=2)
    assert [activations.micro_batches_in_flight(lay, r, 4) for r in range(4)] == [4.0, 4.0, 3.5, 2.5]
    for p, v, r in itertools.product((2, 4, 8), (2, 3, 4), range(8)):
        if r >= p:
            continue
        lay = Layout(pp=p, virtual_pipeline_stages=v)
        held = [activations.micro_batches_in_flight(lay, r, m) for m in (p, 2 * p, 3 * p, 4 * p)]
        assert all(h <= m for h, m in zip(held, (p, 2 * p, 3 * p, 4 * p), strict=True)), (p, v, r)
        assert held == sorted(held), (p, v, r)  # more micro-batches never hold fewer
        if r:
            assert held[0] <= activations.micro_batches_in_flight(lay, r - 1, p)  # later ranks hold fewer


def test_torch_pipelining_keeps_a_receive_buffer_per_micro_batch() -> None:
    # torch.distributed.pipelining allocates, per stage, a forward receive buffer for every micro-batch
    # (not on stage 0) and a gradient receive buffer for every micro-batch (not on the last stage);
    # a forward buffer of an in-flight micro-batch is its stage input, counted with the activations.
    # Megatron receives into a new tensor per transfer: one activation and one gradient in flight.
    from service.estimator.memory import pipeline_buffer_bytes, pipelining_buffer_bytes

    training = TrainingSpec(seq_len=16, global_batch_size=8)
    fsdp = Layout(framework=Framework.FSDP, pp=4, zero_stage=2, micro_batch_size=1)
    one = 2 * 16 * TINY.hidden_size  # bf16, one micro-batch of 16 tokens

    def held(rank: int, in_flight: float, layout: Layout = fsdp) -> float:
        return pipelining_buffer_bytes(TINY, layout, training, rank, 8, in_flight) / one

    assert held(0, 4) == 8  # gradients only
    assert held(1, 3) == 8 + (8 - 3)  # + the forward buffers of the 5 micro-batches not in flight
    assert held(3, 1) == 8 - 1 + 0  # no gradient buffers on the last stage; 7 forward ones idle
    interleaved = dataclasses.replace(fsdp, virtual_pipeline_stages=2)  # rank 0 holds stages 0 and 4
    assert held(0, 5.5, interleaved) == 2 * 8 + 1 * (8 - 5.5)
    assert pipeline_buffer_bytes(TINY, fsdp, training) == 0
    megatron = dataclasses.replace(fsdp, framework=Framework.MEGATRON, zero_stage=1)
    assert pipeline_buffer_bytes(TINY, megatron, training) == 2 * one
    assert pipelining_buffer_bytes(TINY, megatron, training, 1, 8, 3) == 0


def test_interleaving_holds_no_more_than_all_micro_batches() -> None:
    # 8 layers, pp 4, v 2, 4 micro-batches: rank 0 holds all 4 micro-batches' activations of its
    # 2 layers (+ the embedding's), as without interleaving, not 5.5 of them.
    model = dataclasses.replace(TINY, num_layers=8)
    training = TrainingSpec(seq_len=16, global_batch_size=4)
    plain = Layout(framework=Framework.MEGATRON, pp=4)
    interleaved = dataclasses.replace(plain, virtual_pipeline_stages=2)
    c = cluster(4)
    assert stage_activation_bytes(model, c, interleaved, training, 0, 4) == (
        stage_activation_bytes(model, c, plain, training, 0, 4)
    )
    assert memory(model, c, interleaved, training).per_gpu.activations == (
        memory(model, c, plain, training).per_gpu.activations
    )


def test_chunked_loss_keeps_one_chunks_logits_and_the_fp32_hidden_gradient() -> None:
    """torchtitan 0.3.0's ChunkedLossWrapper (components/loss.py): lm_head, the loss and its backward
    run per eighth of the sequence inside the loss call, into GradAccumulator's fp32 [b, s, h] buffer,
    cast to the hidden states' dtype before the decoder's backward. It was counted as one 16-bit
    hidden-state gradient and no workspace: Qwen2.5-0.5B at 8K x 32 sequences "fit" with 49 GiB of
    headroom while one chunk's logits alone are 46-65 GiB (an activation-memory review)."""
    from service.estimator.activations import loss_workspace_bytes

    lay = Layout(framework=Framework.FSDP, micro_batch_size=2)
    chunked_lay = dataclasses.replace(lay, chunked_loss=True)
    plain = stage_activation_bytes(TINY, cluster(1), lay, TRAIN, 0, 1)
    chunked = stage_activation_bytes(TINY, cluster(1), chunked_lay, TRAIN, 0, 1)
    # fp32 log-softmax 4 x (16 x 2 tokens) x 32 vocab = 4096 replaced by the fp32 accumulator and its
    # 16-bit cast, (4 + 2) x 32 tokens x 8 hidden = 1536
    assert plain - chunked == 4096 - 1536
    # one chunk of 32 / 8 = 4 tokens: 16-bit logits + 3 fp32 copies, (2 + 12) x 4 x 32 = 1792, against
    # the plain loss's 2 fp32 copies of every logit, 2 x 4 x 32 x 32 = 8192
    assert loss_workspace_bytes(TINY, chunked_lay, TRAIN) == 1792
    assert loss_workspace_bytes(TINY, lay, TRAIN) == 8192
    compiled = dataclasses.replace(chunked_lay, torch_compile=Compile.MODEL_AND_LOSS)
    assert loss_workspace_bytes(TINY, compiled, TRAIN) == 2 * 2 * 4 * 32  # logits + their 16-bit grad


@pytest.mark.parametrize(
    ("framework", "tp", "compiled", "copies"),
    [
        (Framework.FSDP, 1, Compile.NONE, 2.0),  # the nll and log-softmax gradients
        (Framework.FSDP, 2, Compile.NONE, 3.0),  # DTensor loss_parallel: zeros grad_input, exp, sum
        (Framework.MEGATRON, 2, Compile.NONE, 0.5),  # vocab-parallel cross-entropy in place: the 16-bit grad
        (Framework.FSDP, 2, Compile.MODEL_AND_LOSS, 0.5),  # inductor: the 16-bit logits' gradient
    ],
)
def test_loss_workspace_counts_each_frameworks_fp32_logit_copies(
    framework: Framework, tp: int, compiled: Compile, copies: float
) -> None:
    """In fp32 logit shards, 4 x tokens x V / tp: the plain loss peaks at 3 with its saved
    log-softmax, loss_parallel at 4 (validation/data/loss_parallel.json: the CPU over 2 gloo ranks)."""
    lay = Layout(framework=framework, tp=tp, micro_batch_size=2, torch_compile=compiled)
    shard = 4 * 32 * TINY.vocab_size / tp  # 2 x 16 tokens
    assert activations.loss_workspace_bytes(TINY, lay, TRAIN) == copies * shard
    if framework is Framework.FSDP and compiled is Compile.NONE:
        measured = json.loads((Path(__file__).parents[2] / "validation/data/loss_parallel.json").read_text())
        peak = measured["variants"]["loss_parallel" if tp > 1 else "plain"]["backward_peak_L"]
        assert copies + 1 == peak  # + the saved log-softmax (last_stage_extra_bytes)


def test_dtensor_tensor_parallel_saves_each_gathered_linear_input_whole() -> None:
    """torchtitan's DTensor TP with sequence parallelism saves the all-gathered input of the MLP
    (and of attention) and of the output layer whole: measured on 2 gloo ranks
    (validation/data/dtensor_saved.json: two full-sequence hidden tensors among the saved ones).
    Megatron saves the shard and gathers again in backward (Korthikanti §4.2.2)."""
    measured = json.loads((Path(__file__).parents[2] / "validation/data/dtensor_saved.json").read_text())
    assert measured["saved_hidden_full"] == 2  # the MLP's input and the output layer's input
    tp, tokens = 2, 2 * 16  # micro-batch 2 x seq 16
    whole = 2 * tokens * TINY.hidden_size  # bf16
    sp = Layout(framework=Framework.FSDP, tp=tp, sequence_parallel=True, micro_batch_size=2)
    megatron_sharding = dataclasses.replace(sp, framework=Framework.MEGATRON)
    kind = DENSE
    fsdp_layer = activations.layer_bytes(TINY, sp, TRAIN, kind, Recompute.NONE)
    # the same HF layer, its two Linear inputs counted as SP shards
    shards = activations.hf_layer_bytes(TINY, dataclasses.replace(sp, tp=1), TRAIN, False)
    assert fsdp_layer == pytest.approx(shards / tp + 2 * whole * (1 - 1 / tp))
    assert activations.last_stage_extra_bytes(TINY, sp, TRAIN) - activations.last_stage_extra_bytes(
        TINY, dataclasses.replace(sp, tp=1), TRAIN
    ) / tp == pytest.approx(whole * (1 - 1 / tp) + 8 * tokens * (1 - 1 / tp))
    # Megatron's SP keeps shards only: its layer scales as 1/tp
    assert activations.layer_bytes(TINY, megatron_sharding, TRAIN, kind, Recompute.NONE) == pytest.approx(
        activations.layer_bytes(TINY, dataclasses.replace(megatron_sharding, tp=1, sequence_parallel=False),
                                TRAIN, kind, Recompute.NONE) / tp
    )  # fmt: skip


# ---------------------------------------------------------------- entry points


def test_estimate_components_and_headroom() -> None:
    est = memory(TINY, cluster(1), Layout(), TRAIN)
    b = est.per_gpu
    assert b.parameters == 3664 and b.activations > 0 and b.overhead >= ASSUME.cuda_context_bytes
    assert est.headroom_bytes == est.capacity_bytes - b.total


# The memory model's allowances set to round numbers, so the three statistics can be checked by hand.
ROUND_TUNING = dataclasses.replace(
    default_tuning(),
    memory=dataclasses.replace(
        ASSUME, cuda_context_bytes=1000, nccl_bytes_per_group=100, fragmentation_fraction=0.25
    ),
)


@pytest.mark.parametrize(
    ("layout", "states", "tensors", "groups"),
    [
        # DeepSpeed ZeRO-0 over dp 4, every rank all 1832 parameters: bf16 weights 2 x 1832 = 3664,
        # bf16 gradients 3664, fp32 master + m + v 12 x 1832 = 21984; one process group of more
        # than one rank (data)
        (Layout(dp=4), (3664, 3664, 21984), (14144, 7760), 1),
        # Megatron dp 2 x tp 2 x pp 2: the first stage is the heavier (the last's loss keeps the 16-bit
        # gradient beside its fp32 logits alone), its layer's attention 256 / 2 + MLP 384 / 2 + norms 16,
        # embedding 256 / 2 = 464 parameters: 928, 928, 12 x 464 = 5568; data, tensor and pipeline groups
        (Layout(framework=Framework.MEGATRON, dp=2, tp=2, pp=2), (928, 928, 5568), (4992, 512), 3),
    ],
)
def test_three_statistics_differ_by_their_named_components(
    layout: Layout, states: tuple[int, int, int], tensors: tuple[int, int], groups: int
) -> None:
    """The three statistics by hand from their named parts: the model states above, the
    activations and buffers as the estimator gives them (pinned here; their formulas are tested
    on their own), and ROUND_TUNING's allowances: fragmentation 0.25 x (activations + buffers)
    rounded up, the CUDA context 1000 bytes, NCCL 100 bytes per group of more than one rank."""
    b = memory(TINY, cluster(8), layout, TRAIN, ROUND_TUNING).per_gpu
    assert (b.parameters, b.gradients, b.optimizer_states) == states
    assert (b.activations, b.buffers) == tensors
    allocated = sum(states) + sum(tensors)  # DeepSpeed 29312 + 21904 = 51216; Megatron 7424 + 5504 = 12928
    fragmentation = math.ceil(0.25 * sum(tensors))  # DeepSpeed 5476, Megatron 1376
    reserved = allocated + fragmentation  # DeepSpeed 56692, Megatron 14304
    device_used = reserved + 1000 + 100 * groups  # DeepSpeed 57792, Megatron 15604
    assert (b.fragmentation, b.cuda_context, b.nccl_buffers) == (fragmentation, 1000, 100 * groups)
    assert [b.statistic(s) for s in MemoryStatistic] == [allocated, reserved, device_used]
    assert (b.peak_allocated_bytes, b.peak_reserved_bytes, b.device_used_bytes) == (
        allocated,
        reserved,
        device_used,
    )
    assert b.total == device_used  # the fit's figure


@pytest.mark.parametrize(
    ("precision", "cp", "micro", "per_element"),
    [
        # 12 bf16 buffers of [s x b / cp, h]: 16 tokens x 8 wide x 24 bytes
        (Precision.BF16, 1, 1, 24),
        (Precision.BF16, 2, 1, 24),  # the shape is over cp (Megatron's input_shape)
        (Precision.BF16, 1, 2, 24),  # and grows with the micro-batch
        (Precision.FP8, 1, 1, 8 * 1 + 4 * 2),  # the 8 all-gather buffers are 1-byte under fp8
    ],
)
def test_tp_comm_overlap_holds_transformer_engines_userbuffers_outside_the_allocator(
    precision: Precision, cp: int, micro: int, per_element: int
) -> None:
    """Megatron's --tp-comm-overlap: TE's initialize_ub builds 12 communicators, each with a buffer of
    [seq_length x micro_batch_size / cp, hidden_size] (Megatron-LM _initialize_tp_communicators), with
    cuMemCreate: device used holds them, the allocator's statistics do not (the userbuffer streams'
    cuBLAS workspaces are torch tensors: buffers) (long-context review: 6 GiB at 128k tokens on tp 4
    cp 2, with 4.2 GiB headroom)."""
    training = TrainingSpec(seq_len=16, global_batch_size=8, precision=precision)
    # (fp32 main grads: no fp32 copy at the step, whose moment would be this tiny model's peak)
    base = Layout(framework=Framework.MEGATRON, dp=8 // (2 * cp), tp=2, cp=cp, micro_batch_size=micro,
                  sequence_parallel=True, grad_reduce_in_fp32=True)  # fmt: skip
    overlap = dataclasses.replace(base, tp_comm_overlap=True)
    plain = memory(TINY, cluster(8), base, training, ROUND_TUNING).per_gpu
    held = memory(TINY, cluster(8), overlap, training, ROUND_TUNING).per_gpu
    ub = 16 * micro // cp * TINY.hidden_size * per_element
    workspace = 3 * (32 * 2**20 + 2**10)  # the userbuffer streams' cuBLAS workspaces: torch tensors
    assert (plain.tp_comm_buffers, held.tp_comm_buffers) == (0, ub)
    assert held.buffers == plain.buffers + workspace  # inside the allocator
    assert held.peak_allocated_bytes == plain.peak_allocated_bytes + workspace
    assert (
        held.device_used_bytes - held.peak_reserved_bytes
        == plain.device_used_bytes - plain.peak_reserved_bytes + ub
    )
    # FSDP's TP overlap (torchtitan's Async TP) is a torch.compile pass over symmetric memory, not these
    fsdp = dataclasses.replace(overlap, framework=Framework.FSDP, zero_stage=3, torch_compile=Compile.MODEL)
    assert memory(TINY, cluster(8), fsdp, training, ROUND_TUNING).per_gpu.tp_comm_buffers == 0


def test_the_fit_compares_device_used_with_the_capacity() -> None:
    layout = Layout(dp=4)
    b = memory(TINY, cluster(8), layout, TRAIN, ROUND_TUNING).per_gpu
    the_job = job(TINY, cluster(8), TRAIN, ROUND_TUNING)
    # a card holding the reserved peak but not the CUDA context and NCCL's buffers runs out of memory
    assert not evaluate.fits(the_job, layout, limit_bytes=b.device_used_bytes - 1)
    assert evaluate.fits(the_job, layout, limit_bytes=b.device_used_bytes)
    est = memory(TINY, cluster(8, memory_bytes=b.device_used_bytes), layout, TRAIN, ROUND_TUNING)
    assert est.fit_statistic is MemoryStatistic.DEVICE_USED and est.headroom_bytes == 0


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.37, 3.0])
def test_calibration_scales_the_overhead_and_its_parts_add_up(factor: float) -> None:
    the_job = job(TINY, cluster(8), TRAIN, ROUND_TUNING)
    layout = Layout(framework=Framework.MEGATRON, dp=2, tp=2, pp=2)
    b = evaluate.memory_estimate(the_job, layout, factor).per_gpu
    base = evaluate.memory_estimate(the_job, layout).per_gpu
    # the overhead is scaled as one number (as before the split), and its parts sum to it exactly
    assert b.overhead == math.ceil(base.overhead * factor)
    assert b.total == evaluate.memory_numbers(the_job, layout, factor)[0]
    assert b.cuda_context == math.ceil(1000 * factor) and b.nccl_buffers == math.ceil(300 * factor)
    assert b.fragmentation >= 0


def test_max_micro_batch_and_seq_len_are_the_largest_that_fit() -> None:
    model = ModelSpec(
        name="l", family="llama", num_layers=4, hidden_size=1024, num_attention_heads=8, num_kv_heads=8,
        ffn_hidden_size=2816, vocab_size=32000,
    )  # fmt: skip
    c = cluster(1, memory_bytes=6 * 2**30)
    training = TrainingSpec(seq_len=2048, global_batch_size=64)
    lay = Layout(framework=Framework.FSDP)
    b = evaluate.max_micro_batch_size(job(model, c, training), lay)
    assert 1 <= b < 64
    assert fits(model, c, dataclasses.replace(lay, micro_batch_size=b), training)
    assert not fits(model, c, dataclasses.replace(lay, micro_batch_size=b + 1), training)
    s = evaluate.max_seq_len(job(model, c, training), lay)
    assert fits(model, c, lay, dataclasses.replace(training, seq_len=s))
    assert not fits(model, c, lay, dataclasses.replace(training, seq_len=s + 1))
    assert evaluate.max_micro_batch_size(job(model, cluster(1, memory_bytes=2**30), training), lay) == 0


def test_assumptions_name_the_numbers() -> None:
    notes = assumptions(
        job(TINY, cluster(4), TRAIN), Layout(dp=4, zero_stage=3, offload_optimizer=Offload.CPU)
    )
    text = " ".join(notes)
    assert "768 MiB" in text and "reduce_bucket_size" in text and "optimizer offload" in text
    assert "device used (nvidia-smi)" in text and "the fit compares device used" in text


# ---------------------------------------------------------------- properties

SMALL = st.builds(
    lambda layers, heads, kv_div, head_dim, ffn, vocab, tied: ModelSpec(
        name="p",
        family="llama",
        num_layers=layers,
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        num_kv_heads=heads // kv_div,
        ffn_hidden_size=ffn,
        vocab_size=vocab,
        tied_embeddings=tied,
    ),
    layers=st.sampled_from([2, 4, 8]),
    heads=st.sampled_from([4, 8, 16]),
    kv_div=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([16, 64]),
    ffn=st.integers(16, 4096),
    vocab=st.integers(32, 50000),
    tied=st.booleans(),
)
TRAININGS = (
    st.tuples(
        st.sampled_from(list(Precision)), st.sampled_from(list(Optimizer)), st.sampled_from(list(Method))
    )
    .filter(
        lambda pom: (
            not (pom[2] is Method.QLORA and pom[0] is Precision.FP8)
        )  # refused: NF4 computes in 16 bits
    )
    .map(
        lambda pom: TrainingSpec(
            seq_len=512, global_batch_size=64, precision=pom[0], optimizer=pom[1], method=pom[2]
        )
    )
)
STAGES = {Framework.DEEPSPEED: [0, 1, 2, 3], Framework.FSDP: [0, 2, 3], Framework.MEGATRON: [0, 1]}


@settings(max_examples=60, deadline=None)
@given(model=SMALL, training=TRAININGS, fw=st.sampled_from(list(Framework)), dp=st.sampled_from([1, 2, 4, 8]))
def test_higher_zero_stage_never_raises_model_states(
    model: ModelSpec, training: TrainingSpec, fw: Framework, dp: int
) -> None:
    stages = STAGES[fw]
    if fw is Framework.DEEPSPEED and training.precision not in MIXED:
        # DeepSpeed's ZeRO-1/2 clone the partition as the master without mixed precision
        # (model_states.deepspeed_master_clone), which ZeRO-0 does not hold: more than the moments it
        # shards where they are small (SGD, 8-bit Adam, Adafactor) or dp is (one rank: a whole copy)
        stages = [z for z in stages if z != 0]
    if fw is Framework.DEEPSPEED and training.optimizer is Optimizer.ADAFACTOR:
        # ZeRO-0 steps Adafactor on the shaped tensors, factored; ZeRO-1/2's flat partition cannot be
        # (memory.min_state_bytes_per_gpu): at one rank the whole unfactored second moment is more
        stages = [z for z in stages if z != 0]
    totals = [states_total(model, Layout(framework=fw, dp=dp, zero_stage=z), training) for z in stages]
    assert all(a >= b - 1e-6 for a, b in itertools.pairwise(totals))


@settings(max_examples=60, deadline=None)
@given(model=SMALL, training=TRAININGS, fw=st.sampled_from(list(Framework)), z=st.integers(0, 3))
def test_more_tp_pp_dp_never_raises_model_states_per_gpu(
    model: ModelSpec, training: TrainingSpec, fw: Framework, z: int
) -> None:
    z = max(s for s in STAGES[fw] if s <= z)
    base = states_total(model, Layout(framework=fw, zero_stage=z), training)
    for tp in (2, 4):
        if model.num_kv_heads % tp == 0:
            assert states_total(model, Layout(framework=fw, zero_stage=z, tp=tp), training) <= base + 1e-6
    for pp in (2, 4):
        piped = Layout(framework=fw, zero_stage=z, pp=pp)
        if deepspeed_bf16_optimizer(piped, training.precision):
            # DeepSpeed's pipeline engine at ZeRO-0 with bf16 weights steps with BF16_Optimizer, whose flat
            # bf16 gradient buffer sits beside every .grad: a pipeline adds that copy, which a model whose
            # embedding outweighs its layers (the share pp moves off a rank) does not win back
            continue
        if model.num_layers % pp == 0 and z <= 1 + 2 * (fw is Framework.FSDP):
            assert states_total(model, piped, training) <= base + 1e-6
    for dp in (2, 8):
        assert states_total(model, Layout(framework=fw, zero_stage=z, dp=dp), training) <= base + 1e-6


LAYOUTS = st.builds(
    lambda fw, tp, sp, cp, b: Layout(framework=fw, tp=tp, sequence_parallel=sp, cp=cp, micro_batch_size=b),
    fw=st.sampled_from(list(Framework)),
    tp=st.sampled_from([1, 2, 4]),
    sp=st.booleans(),
    cp=st.sampled_from([1, 2]),
    b=st.integers(1, 4),
)


@settings(max_examples=80, deadline=None)
@given(model=SMALL, layout=LAYOUTS, attention=st.sampled_from(list(Attention)), fp32=st.booleans())
def test_recompute_none_ge_selective_ge_full(
    model: ModelSpec, layout: Layout, attention: Attention, fp32: bool
) -> None:
    training = TrainingSpec(
        seq_len=256,
        global_batch_size=8,
        attention=attention,
        precision=Precision.FP32 if fp32 else Precision.BF16,
    )
    # the framework's own selective policy: Megatron's core attention, torchtitan's per-op AC
    selective = Recompute.SELECTIVE if layout.framework is Framework.MEGATRON else Recompute.SELECTIVE_OP
    modes = (Recompute.NONE, selective, Recompute.FULL)
    per_layer = [
        activations.layer_bytes(model, dataclasses.replace(layout, recompute=r), training, DENSE, r)
        for r in modes
    ]
    # under TP per-op AC saves the row-parallel matmuls' full-width partial sums (o_proj, down_proj
    # before their reduce): it can keep more than no recompute, which saves their inputs only
    assert per_layer[1] >= per_layer[2]
    assert per_layer[0] >= per_layer[1] or (selective is Recompute.SELECTIVE_OP and layout.tp > 1)
    c = cluster(layout.tp * layout.cp)
    stage = [
        stage_activation_bytes(model, c, dataclasses.replace(layout, recompute=r), training, 0, 1)
        for r in modes
    ]
    # With the one layer recomputed at a time, full recompute may exceed selective on short stacks,
    # never the no-recompute footprint (two layers or more).
    assert stage[0] >= stage[2]
    assert stage[0] >= stage[1] or (selective is Recompute.SELECTIVE_OP and layout.tp > 1)


@settings(max_examples=60, deadline=None)
@given(model=SMALL, layout=LAYOUTS, pp=st.sampled_from([1, 2]), r=st.sampled_from(list(Recompute)))
def test_larger_micro_batch_never_lowers_activations(
    model: ModelSpec, layout: Layout, pp: int, r: Recompute
) -> None:
    training = TrainingSpec(seq_len=128, global_batch_size=64)
    lay = dataclasses.replace(layout, pp=pp, recompute=r, gradient_accumulation_steps=4)
    sizes = [
        memory(
            model, cluster(pp * lay.tp * lay.cp), dataclasses.replace(lay, micro_batch_size=b), training
        ).per_gpu.activations
        for b in (1, 2, 3, 4)
    ]
    assert sizes == sorted(sizes)


def test_moe_experts_shard_by_ep() -> None:
    moe = ModelSpec(
        name="moe", family="mixtral", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=4,
        ffn_hidden_size=128, vocab_size=256, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=128),
    )  # fmt: skip
    one = rank_parameters(moe, Layout(dp=4), 0)
    four = rank_parameters(moe, Layout(dp=4, ep=4), 0)
    # 8 experts x 3 x 64 x 128 = 196608 per layer, 2 layers; ep 4 keeps a quarter.
    assert (one.expert, four.expert) == (2 * 196608, 2 * 196608 / 4)
    # Megatron splits them over etp (default tp): tp 2 halves them again, etp 1 keeps them whole
    megatron = Layout(framework=Framework.MEGATRON, dp=4, tp=2, ep=4, sequence_parallel=True, zero_stage=1)
    split = rank_parameters(moe, megatron, 0)
    whole = rank_parameters(moe, dataclasses.replace(megatron, ep=8, etp=1), 0)
    assert (split.expert, whole.expert) == (2 * 196608 / 8, 2 * 196608 / 8)
    assert rank_parameters(moe, dataclasses.replace(megatron, etp=1), 0).expert == 2 * 196608 / 4
    # expert-dp = tp x dp x cp / (etp x ep): 8 / 8 = 1 with the folded layout, 8 / (2 x 4) = 1 by default
    assert shard_degrees(dataclasses.replace(megatron, ep=4, etp=1), cluster(1)) == (4, 2)
    assert shard_degrees(megatron, cluster(1)) == (4, 1)


def test_deepspeed_buckets_follow_hidden_size_and_overlap_comm() -> None:
    # ds_config.json and the memory model share model_states.deepspeed_buckets: h^2 reduce buckets
    # (Hugging Face's "auto"), clamped to [1e7, 5e8]; ZeRO-1/2 double them under overlap_comm.
    big = dataclasses.replace(TINY, hidden_size=8192, num_attention_heads=64, num_kv_heads=8)
    z2 = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=2, overlap_grad_reduce=True)
    b = deepspeed_buckets(big, z2)
    assert (b.reduce_bucket_elements, b.overlap_comm, b.reduce_buffer_elements) == (
        8192**2,
        True,
        2 * 8192**2,
    )
    assert deepspeed_buckets(big, dataclasses.replace(z2, overlap_grad_reduce=None)).overlap_comm is False
    assert deepspeed_buckets(big, dataclasses.replace(z2, pp=2, dp=4)).overlap_comm is False  # PipelineEngine
    z3 = dataclasses.replace(z2, zero_stage=3, overlap_grad_reduce=None)
    b3 = deepspeed_buckets(big, z3)
    assert b3.overlap_comm and b3.reduce_buffer_elements == b3.reduce_bucket_elements
    assert b3.prefetch_bucket_elements == 9 * 8192**2 // 10 and b3.param_persistence_threshold == 81920
    assert deepspeed_buckets(TINY, z2).reduce_bucket_elements == 10_000_000
    note = deepspeed_assumption(big, z3)
    assert "reduce_bucket_size 6.71e+07" in note and "overlap_comm true" in note and "prefetch" in note
    assert deepspeed_assumption(big, Layout(framework=Framework.MEGATRON, dp=8, zero_stage=1)) == ""


def test_deepspeed_memory_counts_the_rendered_buckets() -> None:
    # ZeRO-2 with overlap_comm allocates a second reduce_bucket_size buffer (16-bit) per rank.
    big = dataclasses.replace(TINY, hidden_size=8192, num_attention_heads=64, num_kv_heads=8)
    z2 = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=2, overlap_grad_reduce=True)
    on = memory(big, cluster(1), z2, TRAIN).per_gpu.buffers
    off = memory(big, cluster(1), dataclasses.replace(z2, overlap_grad_reduce=None), TRAIN).per_gpu.buffers
    assert on - off == pytest.approx(8192**2 * 2, abs=2)


def test_per_stage_memory_names_each_evaluated_rank_and_the_heaviest_is_per_gpu() -> None:
    from service.catalog.models import model
    from service.catalog.tuning import default_tuning
    from service.estimator.estimate import estimate
    from service.estimator.types import Framework, Layout, Recompute, TrainingSpec
    from tests.recommender.helpers import cluster

    # BLOOM-176B's published split: 70 layers on PP12 (5, 6 x 10, 5): ranks 0, 1 (the first with 6
    # layers) and 11 are evaluated; the others repeat rank 1's layers with fewer micro-batches in flight
    spec = model("bloom-176b").spec
    layout = Layout(framework=Framework.MEGATRON, dp=8, tp=4, pp=12, sequence_parallel=True, zero_stage=1,
                    recompute=Recompute.FULL, micro_batch_size=2)  # fmt: skip
    est = estimate(spec, cluster("a100-sxm-80gb", nodes=48, inter=12.5e9), layout,
                   TrainingSpec(seq_len=2048, global_batch_size=2048), tuning=default_tuning())  # fmt: skip
    assert [s.rank for s in est.memory.per_stage] == [0, 1, 11]
    assert max(s.memory.total for s in est.memory.per_stage) == est.memory.per_gpu.total
    assert len({s.memory.total for s in est.memory.per_stage}) == 3  # the stages differ
    nodes = cluster("a100-sxm-80gb", nodes=48, inter=12.5e9)
    training = TrainingSpec(seq_len=2048, global_batch_size=2304)
    single = estimate(spec, nodes, Layout(dp=384, zero_stage=3), training, tuning=default_tuning())
    assert [s.rank for s in single.memory.per_stage] == [0]
    assert single.memory.per_stage[0].memory == single.memory.per_gpu


def test_a_capacity_factor_pads_every_expert_and_its_rows_are_held() -> None:
    """Megatron with --moe-pad-expert-input-to-capacity: every expert computes exactly its capacity
    (the factor x its mean load), so the rank's routed rows, and the activations they keep, are the
    factor's multiple; memory was the mean's whatever the factor (MoE review, stop 41: a factor of 4
    "fitted" an H100 at 76.5 GiB with about 56 GiB of padded rows uncounted)."""
    from service.catalog.gpus import gpu
    from service.catalog.models import model as preset
    from service.estimator.estimate import estimate
    from service.estimator.types import Framework, Layout, Recompute, TrainingSpec
    from validation.cases import gpu_cluster

    qwen = preset("qwen3-30b-a3b").spec
    cluster = gpu_cluster(gpu("h100-sxm-80gb"), 16, 50e9)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)

    def held(factor: float | None) -> float:
        layout = Layout(framework=Framework.MEGATRON, dp=16, ep=8, zero_stage=1,
                        recompute=Recompute.SELECTIVE, moe_capacity_factor=factor)  # fmt: skip
        return estimate(qwen, cluster, layout, training, tuning=default_tuning()).memory.per_gpu.activations

    dropless, one, four = held(None), held(1.0), held(4.0)
    assert one == pytest.approx(dropless)  # padded to the mean: the balanced rows
    # each extra factor of the mean adds the same routed rows again
    assert four - one == pytest.approx(3 * (held(2.0) - one), rel=1e-9)
    assert (four - one) / 2**30 > 35  # one h-wide copy of each routed row (Megatron-Core), fc1 and fc2


def test_megatron_keeps_mla_down_projections_whole_on_every_tp_rank() -> None:
    """An MoE review: Megatron builds MLA's q and kv down-projections as duplicated linears
    (multi_latent_attention.py: parallel_mode 'duplicated'), so each TP rank holds them whole; the
    count divided them by tp (DeepSeek-V3 at tp 4: 2.6 GiB of bf16 weights and gradients light).
    DeepSeek-V3, per layer: q_a 7168 x 1536 + its norm 1536, kv_a 7168 x 576 + its norm 512."""
    from service.catalog.models import model as preset
    from service.estimator.model_states import rank_parameters
    from service.estimator.params import LayerKind, mla_down_parameters, parameter_counts

    spec = preset("deepseek-v3").spec
    assert mla_down_parameters(spec) == 7168 * 1536 + 1536 + 7168 * 576 + 512
    counts = parameter_counts(spec)
    layers = ((LayerKind(moe=True), 4),)
    megatron = Layout(framework=Framework.MEGATRON, tp=4, ep=8, zero_stage=1, sequence_parallel=True)
    split = dataclasses.replace(megatron, framework=Framework.DEEPSPEED, sequence_parallel=False)
    whole = (
        rank_parameters(spec, counts, megatron, 1, layers).dense
        - rank_parameters(spec, counts, split, 1, layers).dense
    )
    assert whole == pytest.approx(4 * mla_down_parameters(spec) * (1 - 1 / 4))


def kept_and_every_rank(
    preset: str, layout: Layout, training: TrainingSpec, monkeypatch: pytest.MonkeyPatch
) -> tuple[Estimate, Estimate]:
    """The estimate on ``pipeline_ranks``, and on every pipeline rank (each on a fresh job: prepare()'s
    shared one would keep its memos)."""
    import service.estimator.memory as memory_module
    from service.catalog.models import model
    from service.estimator.estimate import estimate_valid
    from service.estimator.job import make_job

    spec, c = model(preset).spec, cluster(8)

    def estimate() -> Estimate:
        return estimate_valid(make_job(spec, c, training, default_tuning()), layout, with_limits=False)

    kept = estimate()

    def every_rank(job: object, layout: Layout) -> tuple[int, ...]:
        return tuple(range(layout.pp))

    monkeypatch.setattr(memory_module, "pipeline_ranks", every_rank)
    monkeypatch.setattr(evaluate, "pipeline_ranks", every_rank)
    every = estimate()
    assert len(every.memory.per_stage) == layout.pp
    assert kept.memory.per_gpu.total == every.memory.per_gpu.total
    assert kept.fits == every.fits
    return kept, every


@pytest.mark.parametrize("framework", [Framework.FSDP, Framework.MEGATRON, Framework.DEEPSPEED])
@pytest.mark.parametrize("global_batch", [8, 64, 2048])
def test_the_ranks_evaluated_hold_the_most_loaded_one(
    framework: Framework, global_batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pipeline_ranks skips ranks it proves need no more than one it keeps; evaluating every rank gives
    # the same most-loaded figure. Under FSDP, torch.distributed.pipelining's forward receive buffers
    # (one per micro-batch not in flight) make a middle rank the most loaded at many micro-batches:
    # Llama 3 8B at pp 4 and 1,024 micro-batches needs ~101 GiB on rank 1, 72 on rank 0; the middle
    # ranks were skipped and the layout said to fit at 77 GiB (pipeline review)
    training = TrainingSpec(seq_len=4096, global_batch_size=global_batch)
    zero = 2 if framework is Framework.FSDP else 1
    layout = Layout(framework=framework, dp=2, pp=4, zero_stage=zero, recompute=Recompute.FULL)
    kept, every = kept_and_every_rank("llama-3-8b", layout, training, monkeypatch)
    if framework is Framework.FSDP and global_batch == 2048:
        assert not kept.fits
        worst = max(every.memory.per_stage, key=lambda stage: stage.memory.total)
        assert worst.rank == 1


def test_with_activations_offloaded_a_later_middle_rank_is_the_most_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # activations offloaded, a micro-batch in flight costs the GPU little while each later middle rank
    # keeps one more receive buffer: Qwen2.5-7B at pp 8 needs 80.24 GiB on rank 5, said to fit at
    # 79.99 on ranks 0, 1, 6, 7 (review of stop 48)
    training = TrainingSpec(seq_len=4096, global_batch_size=968)
    layout = Layout(
        framework=Framework.FSDP, pp=8, zero_stage=2, micro_batch_size=2, recompute=Recompute.FULL,
        activation_offload=True,
    )  # fmt: skip
    kept, every = kept_and_every_rank("qwen2.5-7b", layout, training, monkeypatch)
    assert not kept.fits
    worst = max(every.memory.per_stage, key=lambda stage: stage.memory.total)
    assert worst.rank == 5 and worst.rank in {stage.rank for stage in kept.memory.per_stage}


def test_megatrons_embedding_dropout_mask_is_whole_without_sequence_parallelism() -> None:
    """Megatron-Core's LanguageModelEmbedding runs its dropout on the sequence-parallel shard under SP
    only; without SP on the whole [s, b, h] every tensor-parallel rank holds (formulas.md §5, "without
    SP": s b h p, not over t). It was divided by tp either way (an activation-memory review)."""
    from service.estimator.activations import first_stage_extra_bytes

    model = dataclasses.replace(TINY, hidden_dropout=0.1)  # GPT-2's; Llama's 0 keeps no mask
    tokens = TRAIN.seq_len  # micro-batch 1
    plain = Layout(framework=Framework.MEGATRON, tp=2)
    sp = dataclasses.replace(plain, sequence_parallel=True)
    ids = 8 * tokens  # int64 token ids
    assert first_stage_extra_bytes(model, plain, TRAIN) == ids + 1 * tokens * model.hidden_size
    assert first_stage_extra_bytes(model, sp, TRAIN) == ids + 1 * tokens * model.hidden_size / 2


def test_an_interleaved_rank_with_uneven_chunks_holds_what_the_schedule_holds() -> None:
    """Megatron's interleaved schedule runs a group of pp micro-batches through chunk 0, then chunk 1,
    ..., and the backward through the chunks in reverse: at the peak a rank holds more of chunk 0's.
    80 layers over pp 8 x v 3 split 3, 4 x 9, 3 x 13, 2 (the embedding and the loss count as a layer
    each): rank 1's chunks hold 4, 4 and 3 layers, and with 32 micro-batches its peak holds 116
    layer-micro-batches (the schedule replayed step by step: 12 + 8 + 8 + 4 chunk forwards of the
    warm-up, then 4 more of chunk 0 in the steady state against backwards of chunk 2), where the
    average chunk gave 29 / 3 x 11 = 106.3 (a pipeline review); rank 7 (4, 3, 2) 67 against 51. Even
    chunks are the formula's."""
    from service.estimator.activations import layers_in_flight, micro_batches_in_flight
    from service.estimator.pipeline import stage_layers

    layout = Layout(framework=Framework.MEGATRON, tp=8, pp=8, virtual_pipeline_stages=3)
    split = stage_layers(80, layout)
    assert split == (3, *(4,) * 9, *(3,) * 13, 2)
    for rank, held in ((1, 116), (7, 67)):
        chunks = split[rank::8]
        assert layers_in_flight(layout, rank, 32, chunks) * sum(chunks) == pytest.approx(held)
    even = Layout(framework=Framework.MEGATRON, tp=8, pp=8, virtual_pipeline_stages=2)
    for rank in range(8):
        chunks = stage_layers(80, even)[rank::8]
        assert layers_in_flight(even, rank, 32, chunks) == micro_batches_in_flight(even, rank, 32)


def test_zero_infinity_keeps_its_swap_buffers_on_the_host_and_the_fp32_gradients_on_nvme() -> None:
    """An offload review: a 13B ZeRO-3 plan with its optimizer on NVMe passed a 64 GiB host at 48 GiB,
    where DeepSpeed pins four fp32 buffers of the largest sub-group for its swapper
    (swap_tensor/optimizer_utils.py, buffer_count 4), steps each swapped sub-group from one more fp32
    buffer (stage3.py initialize_optimizer_states), and keeps the 16-bit gradient partitions in a host
    flat buffer; the fp32 gradients swap out to NVMe with the states (16 B per parameter there)."""
    lay = Layout(dp=4, zero_stage=3, offload_optimizer=Offload.NVME)
    part = 1832 / 4  # TINY's P over dp 4: one sub-group, smaller than sub_group_size
    est = memory(TINY, cluster(4, per_node=4), lay, dataclasses.replace(TRAIN, global_batch_size=4))
    assert est.cpu_per_node_bytes == 4 * math.ceil(2 * part + (4 + 1) * 4 * part)
    assert est.nvme_per_node_bytes == 4 * math.ceil((12 + 4) * part)
    # NVMe parameter offload pins five buffers of offload_param.buffer_size 16-bit elements per GPU
    params = dataclasses.replace(lay, offload_params=Offload.NVME)
    more = memory(TINY, cluster(4, per_node=4), params, dataclasses.replace(TRAIN, global_batch_size=4))
    assert more.cpu_per_node_bytes - est.cpu_per_node_bytes == 4 * 5 * 100_000_000 * 2


def test_a_node_holding_several_pipeline_stages_needs_their_sum_of_host_ram() -> None:
    """A cross-check review: Megatron's and DeepSpeed's rank orders put the pipeline outermost, so a
    node of 8 GPUs at tp 1, dp 1, pp 8 holds all eight stages, and its host RAM under optimizer offload
    is their sum (16 B per parameter of the model: fp32 master, moments and the gradient copy), not the
    heaviest stage (the first, with the embedding) times 8: 25 B per parameter, a false 'does not fit'."""
    from service.catalog.models import model as preset

    spec = preset("llama-3-8b").spec
    total = parameter_counts(spec).total
    node = dataclasses.replace(cluster(8), cpu_memory_bytes_per_node=2**40)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    piped = Layout(framework=Framework.MEGATRON, pp=8, zero_stage=1, recompute=Recompute.SELECTIVE,
                   offload_optimizer=Offload.CPU)  # fmt: skip
    assert memory(spec, node, piped, training).cpu_per_node_bytes == pytest.approx(16 * total, rel=1e-6)
    # the whole job on one node holds the model's states once, however split: two stages of four GPUs
    # (each GPU a quarter of its stage's), or one stage over eight (as before: each GPU's share x 8)
    for split in (dataclasses.replace(piped, pp=2, dp=4), dataclasses.replace(piped, pp=1, dp=8)):
        assert memory(spec, node, split, training).cpu_per_node_bytes == pytest.approx(16 * total, rel=1e-6)
    # over two nodes at pp 2, dp 8: a node holds one stage, the first (with the embedding) the most
    two = dataclasses.replace(node, num_nodes=2)
    first = memory(spec, two, dataclasses.replace(piped, pp=2, dp=8), training).cpu_per_node_bytes
    assert 16 * total / 2 < first < 16 * total * 0.6


def test_deepspeed_autotp_keeps_an_untied_models_embedding_and_logits_whole() -> None:
    # embeddings review: AutoTP splits transformers' tp plan, lm_head "colwise_gather_output" (every
    # rank then holds the whole logits and runs the loss on them) and skips the rowwise embedding; only
    # a tied model is made vocab-parallel (DeepSpeed 0.19.8 runtime/engine.py, tp_plan_converter.py)
    from service.estimator.model_states import rank_parameters

    spec = preset("llama-3-8b").spec
    assert not spec.tied_embeddings
    deepspeed = Layout(framework=Framework.DEEPSPEED, dp=2, tp=4, zero_stage=1)
    megatron = dataclasses.replace(deepspeed, framework=Framework.MEGATRON, sequence_parallel=True)
    assert activations.logits_split(spec, deepspeed) == 1 and activations.logits_split(spec, megatron) == 4
    tied = preset("llama-3.2-1b").spec
    assert tied.tied_embeddings and activations.logits_split(tied, deepspeed) == 4
    counts = parameter_counts(spec)
    layers = ((LayerKind(moe=False), spec.num_layers),)
    whole = rank_parameters(spec, counts, deepspeed, 0, layers).dense
    split = rank_parameters(spec, counts, megatron, 0, layers).dense
    assert whole - split == pytest.approx(counts.embedding * (1 - 1 / 4))
    training = TrainingSpec(seq_len=8192, global_batch_size=2)
    t = 8192  # one micro-batch of one sequence
    assert activations.loss_workspace_bytes(spec, deepspeed, training) == 2 * 4 * t * spec.vocab_size
    # the step times the same parameters the memory holds (change review: timed split, held whole)
    job = make_job(spec, cluster(8), training, default_tuning())
    held = rank_parameters(spec, counts, deepspeed, 0, layers).dense
    assert step_time.gpu_parameters(job, deepspeed) == pytest.approx(held, rel=1e-3)  # (norms split there)
    # with a pipeline, DeepSpeed's tp is Megatron-DeepSpeed's (AutoTP joins no pipeline engine): split
    assert activations.logits_split(spec, dataclasses.replace(deepspeed, pp=2, dp=1)) == 4
    # Megatron in fp32: the cross-entropy's in-place copy is the logits themselves, no 16-bit gradient
    fp32 = dataclasses.replace(training, precision=Precision.FP32)
    assert activations.loss_workspace_bytes(spec, megatron, fp32) == 0
