"""Activation bytes one GPU keeps for backward, for two implementations of the same model.

* Megatron-LM (``Framework.MEGATRON``): Korthikanti et al., "Reducing Activation Recomputation in
  Large Transformer Models" (arXiv:2205.05198) §4-5, Table 2, generalised to GQA, gated MLPs and
  FlashAttention (no s^2 tensors; a fp32 logsumexp instead). 16-bit activations, 1-byte dropout masks.
* PyTorch / Hugging Face transformers (DeepSpeed and FSDP): what autograd saves in HF's modelling
  code, tensor by tensor (RMSNorm's fp32 upcast, SDPA's q/k/v/out/logsumexp, SwiGLU's gate/up/SiLU,
  the fp32 log-softmax of the loss). Checked against ``validation/data/activations.json``, which
  records the saved storages of real models on the CPU.

The published formulas (Korthikanti Table 2, Megatron's ``theoretical_memory_usage.py``), which
validation compares these with, are reproduced exactly in ``validation/published_formulas.py``.
All quantities are bytes of one rank; ``tokens`` is the rank's s/cp x b.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from service.estimator import flops, model_states
from service.estimator.job import Job, LayerKind, layout_memo, sum_by_kind
from service.estimator.params import (
    FUSED_QKV_FAMILIES,
    ROBERTA_FAMILIES,
    autotp_keeps_vocab_whole,
    lora_adapter_shapes,
    loss_logits_per_token,
)
from service.estimator.types import (
    Attention,
    AttentionKind,
    Compile,
    Framework,
    Head,
    Layout,
    Method,
    ModelSpec,
    NormKind,
    PositionEmbedding,
    Precision,
    QKNorm,
    Recompute,
    RecomputeModule,
    TrainingSpec,
)

# HF families whose MLP activation is the python tanh-GELU ("gelu_new"): it saves its input,
# tanh output, 0.5x, 1+tanh and its output (5 tensors of width f) instead of 2.
PYTHON_GELU_FAMILIES = frozenset({"gpt2", "phi"})
# Eager softmax in the model dtype (no fp32 upcast and 16-bit copy): GPT-2, Falcon, and BERT / RoBERTa
# (modeling_bert.py eager_attention_forward: nn.functional.softmax(attn_weights, dim=-1)).
MODEL_DTYPE_SOFTMAX_FAMILIES = frozenset({"gpt2", "falcon", "bert", *ROBERTA_FAMILIES})
# RMSNorms whose weight multiplies the fp32 normalised input (Gemma's (1 + weight) in fp32; OLMo 2's
# weight * x before the cast; GPT-OSS keeps its norm weights in fp32), so that saved product is fp32.
FP32_NORM_FAMILIES = frozenset({"gemma", "gemma2", "gemma3", "olmo2", "gpt_oss"})
# Gemma's RMSNorm also saves the fp32 (1 + weight) it multiplies by: 4 bytes per weight, per norm.
ONE_PLUS_WEIGHT_NORM_FAMILIES = frozenset({"gemma", "gemma2", "gemma3"})
# MoE routers that run in fp32 on an fp32 copy of their input (DeepSeek-V2/V3).
FP32_ROUTER_FAMILIES = frozenset({"deepseek_v2", "deepseek_v3"})
# MoE blocks whose top-k routing weights stay fp32 (not cast to the model dtype) when each routed
# row is scaled by its weight.
FP32_ROUTING_WEIGHT_FAMILIES = frozenset({"mixtral", "deepseek_v2", "deepseek_v3"})
# Routers that renormalise the top-k weights in place (w /= w.sum()): autograd keeps a copy of the
# fp32 weights and their sum. (Qwen2/3-MoE do so only with norm_topk_prob, which the spec lacks.)
NORMALISED_TOPK_FAMILIES = frozenset({"mixtral", "deepseek_v3"})
# GPT-OSS experts' clamped GLU, (clamp(up) + 1) * g * sigmoid(alpha * g) with g = clamp(gate), keeps
# five f-wide tensors (sigmoid, clamped gate, the gate product, up + 1, the output) instead of two.
CLAMPED_GLU_FAMILIES = frozenset({"gpt_oss"})
FP32_BYTES = model_states.FP32_BYTES  # an fp32 element
INDEX_BYTES = 8  # int64 token ids, labels and routing indices
MASK_BYTES = 1  # dropout masks (Korthikanti counts 1 byte per element)


@dataclass(frozen=True, slots=True)
class Split:
    """Bytes replicated over tensor parallelism unless sequence-parallel, and bytes sharded by it."""

    replicated: float
    sharded: float

    def __add__(self, other: Split) -> Split:
        return Split(self.replicated + other.replicated, self.sharded + other.sharded)

    def scaled(self, factor: float) -> Split:
        return Split(self.replicated * factor, self.sharded * factor)

    def per_rank(self, tp: int, sequence_parallel: bool) -> float:
        return self.replicated / (tp if sequence_parallel else 1) + self.sharded / tp


def element_bytes(precision: Precision) -> int:
    """Bytes of one activation element, kept for backward or sent over a link: fp32 and tf32 training
    keep fp32 (TF32 rounds a matmul's inputs inside the tensor core; its tensors stay fp32), every
    other mode 16-bit."""
    # fp8 (Transformer Engine, torchao) computes GEMMs in fp8 but hands bf16 tensors between ops and
    # communicates them in bf16; we count 2.
    return 4 if precision.stores_fp32 else 2


def local_tokens(layout: Layout, training: TrainingSpec) -> float:
    """Tokens one rank processes per micro-batch: the sequence is split over context parallelism."""
    return training.seq_len / layout.cp * layout.micro_batch_size


# ---------------------------------------------------------------- Megatron (Korthikanti)


def _megatron_attention(model: ModelSpec, layout: Layout, training: TrainingSpec, core: bool) -> Split:
    # Korthikanti §4.1: QKV input 2sbh, Q and K 4sbh, V 2sbh, projection input 2sbh, dropout mask sbh
    # (11sbh) + softmax 2as^2b, its dropout mask as^2b and output 2as^2b (5as^2b); GQA shrinks K, V.
    # MLA: V and the projection's input are v_head_dim wide per head, not q/k's qk_head_dim
    # (megatron/core/transformer/multi_latent_attention.py: value split at v_head_dim, linear_proj's
    # input v_head_dim x heads; MoE review: DeepSeek-V3 counted 134 MB per layer more)
    d, t = element_bytes(training.precision), local_tokens(layout, training)
    h, q, k = model.hidden_size, model.q_size, model.kv_size
    v = model.v_size if model.mla is not None else model.kv_size
    replicated = d * t * h + _hidden_mask(model) * t * h
    sharded = d * t * (q + k + v + model.v_size)
    if core and training.attention is Attention.EAGER:
        sharded += _probability_bytes(model, d) * model.num_attention_heads * t * training.seq_len
    elif core:
        sharded += FP32_BYTES * model.num_attention_heads * t  # FlashAttention's logsumexp
    return Split(replicated, sharded)


def _megatron_mlp(model: ModelSpec, layout: Layout, training: TrainingSpec, ffn: int, tokens: float) -> Split:
    # Korthikanti §4.1: fc1 input 2sbh, GeLU input 8sbh, fc2 input 8sbh, dropout mask sbh (19sbh at
    # f = 4h); a gated MLP keeps fc1's 2f-wide output and the product: 3 x 2sbf instead of 2 x 2sbf.
    d, h = element_bytes(training.precision), model.hidden_size
    width = 3 * ffn if model.mlp.gated else 2 * ffn
    return Split(d * tokens * h + _hidden_mask(model) * tokens * h, d * tokens * width)


# Transformer Engine under fp8 quantises each GEMM's input and saves that fp8 copy for the weight
# gradient instead of the 16-bit tensor (te.pytorch Linear / LayerNormLinear / LayerNormMLP save
# the quantised input, Float8Tensor, in forward; the fused activation hands fc2 its input in fp8).
# The tensors other ops need in backward stay 16-bit: a norm's input, attention's q, k, v and
# output (the fused-attention kernel's), fc1's output (the activation's backward).
FP8_BYTES = 1


def _te_fp8_attention_change(model: ModelSpec, layout: Layout, training: TrainingSpec, core: bool) -> Split:
    """What fp8 GEMM inputs change in ``_megatron_attention``: the QKV input (the input norm's
    output) saved in fp8; the projection's input saved in fp8 beside the attention output, which
    the core keeps in 16 bits unless it is recomputed."""
    d, t = element_bytes(training.precision), local_tokens(layout, training)
    qkv_input = (FP8_BYTES - d) * t * model.hidden_size
    projection_input = FP8_BYTES * t * model.q_size - (0.0 if core else d * t * model.q_size)
    return Split(qkv_input, projection_input)


def _te_fp8_mlp_change(
    model: ModelSpec, layout: Layout, training: TrainingSpec, ffn: int, tokens: float
) -> Split:
    """What fp8 GEMM inputs change in ``_megatron_mlp``: fc1's input (the pre-MLP norm's output)
    and fc2's input (the activation's output) saved in fp8; fc1's output stays 16-bit."""
    d = element_bytes(training.precision)
    return Split((FP8_BYTES - d) * tokens * model.hidden_size, (FP8_BYTES - d) * tokens * ffn)


def _hidden_mask(model: ModelSpec) -> int:
    # a residual branch's dropout keeps a 1-byte mask per element, when the model trains with dropout
    return MASK_BYTES if model.hidden_dropout > 0 else 0


def _probability_bytes(model: ModelSpec, d: int) -> int:
    # eager attention keeps the softmax output (d), and with attention dropout its mask and output too
    return d + (MASK_BYTES + d if model.attention_dropout > 0 else 0)


MlpFn = Callable[[ModelSpec, Layout, TrainingSpec, int, float], Split]


def _moe_mlp(
    model: ModelSpec,
    layout: Layout,
    training: TrainingSpec,
    mlp: MlpFn,
    tokens: float,
    modules: frozenset[RecomputeModule] = frozenset(),
    megatron: bool = False,
) -> Split:
    # Balanced routing: each rank's experts see top_k x tokens (EP moves tokens, not their number);
    # padded to a capacity (Megatron --moe-pad-expert-input-to-capacity, DeepSpeed MoE's dispatch:
    # ``Layout.capacity_factor``) every expert holds exactly capacity = factor x its mean load, so the
    # rank's routed rows are the factor's multiple (they were the mean's whatever the factor: a
    # factor of 4 "fitted" with 56 GiB of padded rows uncounted, MoE review, stop 41).
    # Kept: the router's input and fp32 probabilities (T x E), routing indices, dispatched and
    # combined tokens (2 x top_k x T x h: Hugging Face's expert loop keeps each expert's gathered input
    # and its output times the routing weight), each expert's MLP on its tokens, shared experts on all.
    # Megatron-Core keeps one h-wide copy per routed row, fc1's input: the routing weights multiply
    # inside the activation (experts.py, moe_apply_probs_on_input / the weighted bias-swiglu) and
    # unpermute saves indices only (moe_utils.unpermute); the alltoall dispatcher all-gathers the rows
    # over the expert-TP group (token_dispatcher.py), so a rank holds etp/tp of them before the split
    # over tp below (MoE review: Qwen3-30B-A3B ep 8 counted 6.4 GB of routed copies twice, and the
    # same bytes whatever etp).
    # Megatron's selective modules: moe keeps the block's input only, moe_act drops the experts'
    # activation output (f of each routed token), shared_experts the shared MLP's.
    assert model.moe is not None
    moe, d, h = model.moe, element_bytes(training.precision), model.hidden_size
    routed = moe.top_k * tokens * (layout.capacity_factor or 1.0)
    block_input = mlp(model, layout, training, 0, tokens).replicated
    if RecomputeModule.MOE in modules:
        return Split(block_input, 0.0)
    router = block_input + FP32_BYTES * tokens * moe.num_experts
    sharded = mlp(model, layout, training, moe.expert_ffn_hidden_size, routed).sharded
    if RecomputeModule.MOE_ACT in modules:
        sharded -= d * routed * moe.expert_ffn_hidden_size
    dispatched = d * routed * h * layout.expert_tp if megatron else 2 * d * routed * h
    sharded += dispatched + 4 * INDEX_BYTES * routed
    if moe.num_shared_experts and RecomputeModule.SHARED_EXPERTS not in modules:
        shared_ffn = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size
        sharded += mlp(model, layout, training, shared_ffn, tokens).sharded
    return Split(router, sharded)


def _norms(model: ModelSpec, layout: Layout, training: TrainingSpec) -> Split:
    # Korthikanti: each LayerNorm keeps its 2sbh input; replicated unless sequence parallel.
    d, t = element_bytes(training.precision), local_tokens(layout, training)
    return Split(model.norms_per_layer * d * t * model.hidden_size, 0.0)


def megatron_layer_bytes(
    model: ModelSpec,
    layout: Layout,
    training: TrainingSpec,
    moe_layer: bool,
    modules: frozenset[RecomputeModule] = frozenset(),
) -> float:
    """One transformer layer, one micro-batch, with Megatron's selective ``modules`` recomputed
    (none: every activation kept)."""
    t, d, h = local_tokens(layout, training), element_bytes(training.precision), model.hidden_size
    core = RecomputeModule.CORE_ATTN not in modules
    fp8 = training.precision is Precision.FP8
    attention = _megatron_attention(model, layout, training, core)
    if fp8 and model.mla is None:
        attention += _te_fp8_attention_change(model, layout, training, core)
    if RecomputeModule.MLA_UP_PROJ in modules:
        # the decompressed q, k and v are discarded after the core and rebuilt from the latents
        attention += Split(0.0, -d * t * (model.q_size + model.kv_size + model.v_size))
    norm_output = d * t * h  # what an unfused norm hands the next Linear (counted as its input)
    if RecomputeModule.LAYERNORM in modules and model.mla is not None:
        attention += Split(-norm_output, 0.0)
    if moe_layer:
        mlp = _moe_mlp(model, layout, training, _megatron_mlp, t, modules, megatron=True)
        if RecomputeModule.LAYERNORM in modules:
            mlp += Split(-norm_output, 0.0)  # the pre-MLP norm's output (the block's input)
    elif RecomputeModule.MLP in modules:
        mlp = Split(_hidden_mask(model) * t * h, 0.0)  # the MLP keeps nothing; its dropout mask stays
    else:
        mlp = _megatron_mlp(model, layout, training, model.ffn_hidden_size, t)
        if fp8:
            mlp += _te_fp8_mlp_change(model, layout, training, model.ffn_hidden_size, t)
    split = attention + mlp + _norms(model, layout, training)
    return split.per_rank(layout.tp, layout.sequence_parallel)


# ---------------------------------------------------------------- Hugging Face transformers


def _hf_norm(model: ModelSpec, training: TrainingSpec, tokens: float) -> float:
    # LlamaRMSNorm: x.to(fp32) (4 bytes, saved by pow), rsqrt (4 per token), x*rsqrt cast back to the
    # input dtype (saved by weight * x). LayerNorm: its input and fp32 mean + rstd per token.
    d, h = element_bytes(training.precision), model.hidden_size
    if model.norm is NormKind.LAYERNORM:
        return d * tokens * h + 2 * FP32_BYTES * tokens
    normed = FP32_BYTES if model.family in FP32_NORM_FAMILIES else d
    one_plus_weight = FP32_BYTES * h if model.family in ONE_PLUS_WEIGHT_NORM_FAMILIES else 0
    return FP32_BYTES * tokens * h + FP32_BYTES * tokens + normed * tokens * h + one_plus_weight


def _hf_sdpa(model: ModelSpec, training: TrainingSpec, tokens: float, masked: bool = False) -> float:
    # SDPA/flash save q, k, v. Rotary makes new q and k; a fused qkv Linear's output stays alive
    # whole through the saved view of v (measured: gpt_neox, phi3, gpt2). Falcon repeats k and v
    # to all heads (new tensors) and materialises its mask in the model dtype. So does any SDPA
    # call given a mask (``masked``, Gemma 3's sliding layers): with a mask transformers does not
    # use SDPA's GQA, so k and v are repeated to every head, and SDPA turns the boolean b x 1 x s x s
    # mask into a new additive one in the model dtype, which the kernel keeps (measured; CUDA's
    # mem-efficient kernel keeps it the same way; Llama 4's chunked layers alike, measured on the CPU
    # by a reviewer). Not measured, so counted as unmasked: a fused-qkv family with a window (Phi-3).
    d, q, kv = element_bytes(training.precision), model.q_size, model.kv_size
    rotary = model.position_embedding is PositionEmbedding.ROPE
    if model.family in flops.SDPA_EXPANDS_KV_FAMILIES:
        if training.attention is Attention.SDPA:
            return d * tokens * 3 * q + d * tokens * training.seq_len  # mask: b x s_local x s
        # FalconFlashAttention2 (transformers 5.24 modeling_falcon.py) builds no mask (create_causal_mask
        # returns None for flash_attention_2 without padding: metamorphic review, a b x s x s mask per
        # layer counted) and saves its rotated q and k and its v. _split_heads copies k and v out of
        # the fused output (fused_qkv[..., [-2], :]), which then nothing keeps: 7B's multi-query heads
        # save q + 2 kv; the new decoder architecture (40B, 180B) broadcasts k and v to every head
        # and flattens them (copies), 3 q (change review, measured on the CPU with a stand-in kernel
        # saving q, k, v as flash-attn does: 4,784,128 and 25,165,824 B where 9.5 and 18.4 MB counted)
        if model.num_kv_heads == 1 < model.num_attention_heads:
            return d * tokens * (q + 2 * kv)
        return d * tokens * 3 * q
    if model.family in FUSED_QKV_FAMILIES:
        return d * tokens * ((q + 2 * kv) + ((q + kv) if rotary else 0))
    if masked:
        return d * tokens * 3 * q + d * tokens * training.seq_len
    if model.head_dim > flops.SDPA_GQA_HEAD_DIM_MAX:
        # transformers passes enable_gqa only up to head_dim 256 (use_gqa_in_sdpa): past it k and v are
        # repeated to every head (a head_dim 512 Llama under-counted by 6 GiB: attention review)
        return d * tokens * 3 * q
    return d * tokens * (q + 2 * kv)


def _hf_attention(
    model: ModelSpec,
    layout: Layout,
    training: TrainingSpec,
    core: bool,
    attention: AttentionKind = AttentionKind.FULL,
) -> Split:
    # Linear input (the norm output) + o_proj input, and the attention kernel's own tensors. Eager:
    # q, k and v (repeated to all heads under GQA), the softmax output (fp32, plus its 16-bit copy,
    # except where the family keeps the model dtype); attention dropout 0, so no mask.
    # SDPA/flash: q, k, v and the fp32 logsumexp; the output is o_proj's input (the GPU kernels
    # write it in (b, s, a, d) layout, so no copy).
    d, t = element_bytes(training.precision), local_tokens(layout, training)
    h, q, kv, a = model.hidden_size, model.q_size, model.kv_size, model.num_attention_heads
    sharded = d * t * model.v_size  # the attention output, o_proj's input
    masked = flops.sdpa_window_mask(model, training, attention)
    if flops.materialises_scores(model, training) and not masked and training.attention is Attention.SDPA:
        # SDPA's math kernel upcasts 16-bit q, k and v to fp32 (attention.cpp, unless
        # allow_fp16_bf16_reduction_math_sdp, off by default) and saves them and its fp32 probabilities:
        # measured, Falcon-7B's exactly eager's tensors in fp32 (validation/data/activations.json)
        kv_saved = q if model.num_kv_heads < a else kv
        sharded += FP32_BYTES * t * (q + 2 * kv_saved)
        if core:
            sharded += FP32_BYTES * a * t * training.seq_len
        if core and model.attention_dropout > 0:  # at::dropout on the fp32 probabilities: mask and output
            sharded += (MASK_BYTES + FP32_BYTES) * a * t * training.seq_len
    elif flops.materialises_scores(model, training) and not masked:  # eager
        kv_saved = q if model.num_kv_heads < a else kv
        sharded += d * t * (q + 2 * kv_saved)
        if core and model.attention_sinks:
            # GPT-OSS: the softmax, in the model dtype, over the scores and the sink column, and the
            # int64 argmax of the max subtracted before it (measured)
            sharded += (d * (training.seq_len + 1) + INDEX_BYTES) * a * t
        elif core and model.family in MODEL_DTYPE_SOFTMAX_FAMILIES:
            sharded += d * a * t * training.seq_len
        elif core:
            sharded += (FP32_BYTES + (d if d < FP32_BYTES else 0)) * a * t * training.seq_len
        if core and model.attention_dropout > 0:  # the probabilities' dropout: its mask and output
            sharded += (MASK_BYTES + d) * a * t * training.seq_len
        if core and model.attn_logit_softcapping:
            # Gemma 2's eager_attention_forward: scores / c, tanh, * c before the mask and softmax;
            # tanh keeps its output, one more s x s tensor in the model dtype (the division and the
            # product by a constant keep nothing)
            sharded += d * a * t * training.seq_len
    elif model.mla is not None:
        sharded += _hf_mla(model, training, t) + (FP32_BYTES * a * t if core else 0.0)
    else:
        sharded += _hf_sdpa(model, training, t, masked) + (FP32_BYTES * a * t if core else 0.0)
    # the residual dropout after o_proj keeps its mask
    replicated = d * t * h + _hf_mla_latents(model, training, t) + _hidden_mask(model) * t * h
    return Split(replicated, sharded + _hf_qk_norm(model, training, t, attention))


def _hf_qk_norm(
    model: ModelSpec, training: TrainingSpec, tokens: float, attention: AttentionKind = AttentionKind.FULL
) -> float:
    # Llama 4's weightless L2 norm (Llama4TextL2Norm: x.float() * rsqrt(mean(x^2) + eps), cast back) on
    # q and k of its RoPE layers, which are its chunked ones (hf_config._llama4_text): autograd keeps
    # the fp32 copy 4(q + kv) and one fp32 rsqrt per head row, measured on the CPU by a reviewer (1,320 B
    # per layer and token on a tiny llama4_text); Scout's was not counted (hybrid-models review)
    if model.qk_norm is QKNorm.L2:
        if attention is not AttentionKind.CHUNKED:
            return 0.0
        heads = model.num_attention_heads + model.num_kv_heads
        return tokens * FP32_BYTES * (model.q_size + model.kv_size + heads)
    # RMSNorm on q and k (Qwen3, Gemma 3 per head; OLMo 2 over all heads), measured: the fp32 upcast
    # 4(q + kv), one fp32 rsqrt per row, the normalised output 2(q + kv) (the weight's grad reads it;
    # fp32 4(q + kv) for the FP32_NORM_FAMILIES, and Gemma's fp32 (1 + weight) once per norm); the
    # projections' own outputs are then not kept.
    if model.qk_norm not in (QKNorm.PER_HEAD, QKNorm.FULL_WIDTH):
        return 0.0
    d, width = element_bytes(training.precision), model.q_size + model.kv_size
    per_head = model.qk_norm is QKNorm.PER_HEAD
    rows = model.num_attention_heads + model.num_kv_heads if per_head else 2
    normed = FP32_BYTES if model.family in FP32_NORM_FAMILIES else d
    weights = 2 * model.head_dim if per_head else width
    one_plus_weight = FP32_BYTES * weights if model.family in ONE_PLUS_WEIGHT_NORM_FAMILIES else 0
    return tokens * ((FP32_BYTES + normed) * width + FP32_BYTES * rows) + one_plus_weight


def _hf_mla(model: ModelSpec, training: TrainingSpec, tokens: float) -> float:
    # DeepSeek MLA as transformers runs it (measured on a miniature): the query cat(q_pass, q_rot) and
    # the key (both heads x (nope + rope)), the whole kv_b output (heads x (nope + v), alive through
    # the value view), and the kernel's output (heads x v) for o_proj.
    mla = model.mla
    assert mla is not None
    n, d = model.num_attention_heads, element_bytes(training.precision)
    return d * tokens * n * (2 * mla.qk_head_dim + mla.qk_nope_head_dim + 2 * mla.v_head_dim)


def _hf_mla_latents(model: ModelSpec, training: TrainingSpec, tokens: float) -> float:
    # the q and kv latents' RMSNorms (fp32 input 4r, rsqrt 4, 16-bit output 2r) and their outputs as the
    # q_b / kv_b inputs (2r): replicated over tensor parallelism, as the layer input is
    mla = model.mla
    if mla is None:
        return 0.0
    d, ranks = element_bytes(training.precision), [mla.kv_lora_rank]
    if mla.q_lora_rank is not None:
        ranks.append(mla.q_lora_rank)
    return tokens * sum((FP32_BYTES + 2 * d) * r + FP32_BYTES for r in ranks)


def _hf_mlp(model: ModelSpec, layout: Layout, training: TrainingSpec, ffn: int, tokens: float) -> Split:
    # SwiGLU: gate and up outputs, SiLU output, their product (down_proj input): 4 x f.
    # Native GELU: fc1 output and GELU output: 2 x f; python tanh-GELU: 5 x f.
    d, h = element_bytes(training.precision), model.hidden_size
    width = 4 if model.mlp.gated else 5 if model.family in PYTHON_GELU_FAMILIES else 2
    if model.family in CLAMPED_GLU_FAMILIES:
        width = 7  # the fused gate_up output (2f) and the clamped GLU's five f-wide tensors
    # the residual dropout after the down projection keeps its mask
    return Split(d * tokens * h + _hidden_mask(model) * tokens * h, d * tokens * width * ffn)


def _hf_moe_router(model: ModelSpec, training: TrainingSpec, tokens: float) -> Split:
    # What transformers' MoE blocks keep beyond ``_moe_mlp`` (measured, grouped_mm experts): each
    # routed row's routing weight (model dtype, or fp32) and the int32 expert offsets (4 per
    # expert); with expert biases the sorted expert ids (int64 per row) that gather them; the fp32
    # copy and sum of renormalised top-k weights (4k + 4). GPT-OSS softmaxes only the top-k logits,
    # in the model dtype (2k, no fp32 T x E probabilities). An fp32 router (DeepSeek) keeps an fp32
    # copy of its input (4h). DeepSeek-V3's group-limited selection keeps nothing: its top-k
    # values are dropped, so the nodes (and the group indices and mask they saved) die in forward.
    assert model.moe is not None
    moe, d, h, family = model.moe, element_bytes(training.precision), model.hidden_size, model.family
    k, experts = moe.top_k, moe.num_experts
    weight = FP32_BYTES if family in FP32_ROUTING_WEIGHT_FAMILIES else d
    per_token = k * (weight + (INDEX_BYTES if moe.expert_bias else 0))
    if family in NORMALISED_TOPK_FAMILIES:
        per_token += FP32_BYTES * (k + 1)
    if family == "gpt_oss":
        per_token += d * k - FP32_BYTES * experts
    if family in FP32_ROUTER_FAMILIES:
        per_token += FP32_BYTES * h
    return Split(per_token * tokens + 4 * experts, 0.0)


def _lora_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    # Each adapter keeps lora_A's r-wide output for lora_B's weight gradient; its input is the base
    # Linear's input, already counted (lora_dropout 0, peft's default). One adapter per module
    # (params.lora_adapter_shapes: Phi-3's fused qkv_proj one, DeepSeek-V3's q_a/q_b and kv_a/kv_b two);
    # the MLP targets peft moves onto fused experts are no modules (``_fused_expert_lora_bytes``).
    if training.method is Method.FULL:
        return 0.0
    d, t = element_bytes(training.precision), local_tokens(layout, training)
    targets = model_states.module_lora_targets(model, training, layout)
    adapters = len(lora_adapter_shapes(model, targets, model.ffn_hidden_size))
    return d * t * training.lora_rank * adapters


def _fused_expert_lora_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    """An MoE layer's fused experts under peft's ParamWrapper adapters (``model_states.
    peft_adapts_fused_experts``): its forward folds each adapter into its parameter, W + s x BA by one
    baddbmm in the parameter's dtype (peft/tuners/lora/layer.py _LoraFactorsProxy, under
    nn.utils.parametrize.cached()), and the expert matmuls keep that whole adapted weight for the
    input gradient: every adapted expert parameter of the layer, once per micro-batch, whatever its
    tokens (0 elsewhere)."""
    if training.method is Method.FULL or not model_states.peft_adapts_fused_experts(model, layout):
        return 0.0
    adapted, _ = model_states.fused_expert_adapted_weights(model, training)
    return adapted * model_states.frozen_dtype_bytes(training)


def hf_layer_bytes(
    model: ModelSpec,
    layout: Layout,
    training: TrainingSpec,
    moe_layer: bool,
    core: bool = True,
    attention: AttentionKind = AttentionKind.FULL,
) -> float:
    """One decoder layer of an HF model, one micro-batch, as autograd saves it (``core`` False:
    attention's core is recomputed); ``attention`` is the layer's kind."""
    t = local_tokens(layout, training)
    norms = Split(model.norms_per_layer * _hf_norm(model, training, t), 0.0)
    mlp = (
        _moe_mlp(model, layout, training, _hf_mlp, t) + _hf_moe_router(model, training, t)
        if moe_layer
        else _hf_mlp(model, layout, training, model.ffn_hidden_size, t)
    )
    if model.parallel_attn_mlp and model.norms_per_layer == 1:
        mlp = Split(0.0, mlp.sharded)  # attention and MLP read the same normalised input
    elif model.parallel_attn_mlp and model.norm is NormKind.LAYERNORM:
        # Both LayerNorms read the layer input: one saved tensor, not two.
        norms = Split(norms.replicated - element_bytes(training.precision) * t * model.hidden_size, 0.0)
    split = (
        norms
        + _hf_attention(model, layout, training, core, attention)
        + mlp
        + Split(0.0, _lora_bytes(model, layout, training))
        + Split(0.0, _fused_expert_lora_bytes(model, layout, training) if moe_layer else 0.0)
    )
    if layout.torch_compile is not Compile.NONE:
        split = split + _compiled_difference(model, layout, training, moe_layer)
    inputs = 1 if model.parallel_attn_mlp and model.norms_per_layer == 1 else 2  # attention's, MLP's
    return split.per_rank(layout.tp, layout.sequence_parallel) + inputs * _gathered_input_excess(
        model, layout, training
    )


def _gathered_input_excess(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    """What one column-parallel Linear's saved input holds beyond its sequence-parallel shard.

    DTensor tensor parallelism (torchtitan's PrepareModuleInput / ColwiseParallel with
    ``input_layouts=Shard(1)``, FSDP's TP) all-gathers the norm's output to ``Replicate()`` before
    the Linear, and autograd saves that whole tensor for the weight gradient (torch's
    distributed/tensor/parallel/style.py; all-gather is not among the ops inductor's partitioner or
    torchtitan's per-op AC recompute, so compiled runs save it too). Megatron saves the shard and
    all-gathers it again in backward (Korthikanti et al. 2022 §4.2.2): nothing beyond it."""
    if layout.framework is not Framework.FSDP or layout.tp == 1 or not layout.sequence_parallel:
        return 0.0
    whole = element_bytes(training.precision) * local_tokens(layout, training) * model.hidden_size
    return whole * (1 - 1 / layout.tp)


def _compiled_difference(model: ModelSpec, layout: Layout, training: TrainingSpec, moe_layer: bool) -> Split:
    """What inductor's compiled layer saves minus what eager autograd saves, for the ops measured
    (a Llama-3 block, torch 2.13; ``validation/data/compile_activations.json``): each RMSNorm keeps
    its 16-bit input and fp32 rsqrt instead of the fp32 upcast and the 16-bit normalised copy (the
    backward recomputes them), and a gated MLP keeps gate, up and their product but not the SiLU
    output: -4h per norm and -f per token, -15 of h=512's 52 bytes/h measured. LayerNorm, GELU MLPs
    and MoE experts are counted as eager (not measured)."""
    d, t, h = element_bytes(training.precision), local_tokens(layout, training), model.hidden_size
    replicated = 0.0
    if model.norm is NormKind.RMSNORM and model.family not in FP32_NORM_FAMILIES:
        replicated -= model.norms_per_layer * FP32_BYTES * t * h
    sharded = -d * t * model.ffn_hidden_size if model.mlp.gated and not moe_layer else 0.0
    return Split(replicated, sharded)


# ---------------------------------------------------------------- torchtitan per-op AC


def op_sac_layer_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec, moe_layer: bool) -> float:
    """One decoder layer under torchtitan's per-op selective AC, one micro-batch: the block's input
    (the checkpoint's), the outputs of the matmuls it saves (``flops.op_sac_saved``: every second one
    is recomputed), the attention op's output and fp32 logsumexp, and under TP with SP the two
    reduce-scatter outputs; norms, activations and the other ops are recomputed (SelectiveAC,
    torchtitan distributed/activation_checkpoint.py). A row-parallel matmul's output under TP is
    a full-width partial sum, saved before its reduce-scatter."""
    d, t = element_bytes(training.precision), local_tokens(layout, training)
    h, tp = model.hidden_size, layout.tp
    replicated, sharded, whole = d * t * h, 0.0, 0.0
    # Compiled, the partitioner saves only what backward reads, MUST_SAVE or not: a dense layer's
    # output projections (o_proj, down_proj and their reduce-scatters) feed only the residual add
    # (measured: the down projection's output, saved eager, is not compiled). An MoE layer's expert
    # outputs are scaled by the routing weights, whose gradient reads them: counted as eager.
    compiled = layout.torch_compile is not Compile.NONE and not moe_layer
    matmuls = flops.op_sac_matmuls(model, moe_layer)
    for matmul, saved in zip(matmuls, flops.op_sac_saved(matmuls), strict=True):
        if not saved or (compiled and matmul.row_parallel):
            continue
        if (matmul.row_parallel or matmul.replicated) and tp > 1:
            whole += d * t * matmul.out_features
        else:
            sharded += d * t * matmul.out_features
    # the attention op's output (heads x v: MLA's v_head_dim) and its logsumexp
    sharded += d * t * model.v_size + FP32_BYTES * model.num_attention_heads * t
    if tp > 1 and layout.sequence_parallel and not compiled:
        replicated += 2 * d * t * h
    if moe_layer and model.moe is not None:  # topk's values and indices are saved
        replicated += (FP32_BYTES + INDEX_BYTES) * t * model.moe.top_k
        if layout.ep > 1:
            # the token dispatcher's all_to_all_single (functional collectives) is among the comm ops
            # SelectiveAC saves: the dispatched rows and the combined ones, top_k per token each
            sharded += 2 * d * t * model.moe.top_k * h
    return Split(replicated, sharded).per_rank(tp, layout.sequence_parallel) + whole


# ---------------------------------------------------------------- per stage


def layer_bytes(
    model: ModelSpec, layout: Layout, training: TrainingSpec, kind: LayerKind, recompute: Recompute
) -> float:
    """One layer of ``kind``, one micro-batch, under ``recompute``, for the layout's framework."""
    moe_layer = kind.moe
    if recompute is Recompute.FULL:
        # Only the layer input survives the forward (2sbh in Korthikanti; sharded under SP).
        d, t = element_bytes(training.precision), local_tokens(layout, training)
        return d * t * model.hidden_size / (layout.tp if layout.sequence_parallel else 1)
    if recompute is Recompute.SELECTIVE_OP:
        return op_sac_layer_bytes(model, layout, training, moe_layer)
    if layout.framework is Framework.MEGATRON:
        chosen = layout.recompute_modules or (RecomputeModule.CORE_ATTN,)  # Megatron's default
        modules = frozenset(chosen) if recompute is Recompute.SELECTIVE else frozenset()
        return megatron_layer_bytes(model, layout, training, moe_layer, modules)
    core = recompute is Recompute.NONE
    return hf_layer_bytes(model, layout, training, moe_layer, core, kind.attention)


LAYER_FIELDS = ("framework", "torch_compile", "tp", "sequence_parallel", "cp", "micro_batch_size")
# ... and what an MoE layer's routed rows read: their padded capacity (Layout.capacity_factor)
MOE_FIELDS = ("ep", "etp", "moe_capacity_factor")


@layout_memo(*LAYER_FIELDS, *MOE_FIELDS, "recompute_modules")
def kind_layer_bytes(job: Job, layout: Layout, recompute: Recompute) -> dict[LayerKind, float]:
    """``layer_bytes`` of each layer kind of the job under ``recompute``."""
    model, training = job.model, job.training
    return {kind: layer_bytes(model, layout, training, kind, recompute) for kind in job.kinds}


def recompute_working_bytes(job: Job, layout: Layout, recompute: Recompute) -> float:
    """Full and per-op recompute rebuild one layer's activations at a time during backward: the
    largest kind's. Megatron's selective recompute rebuilds the recomputed modules of one layer (its
    core attention: under eager attention the s x s scores and probabilities): the largest kind's
    bytes without recompute less those it keeps (properties review: a Llama 3.2 1B layer's 64 GiB of
    eager scores at 32K were counted under full recompute and not under selective, which then fit
    ~40 GiB lower)."""
    if recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):
        return max(kind_layer_bytes(job, layout, Recompute.NONE).values())
    if recompute is Recompute.SELECTIVE:
        whole, kept = kind_layer_bytes(job, layout, Recompute.NONE), kind_layer_bytes(job, layout, recompute)
        return max(whole[kind] - kept[kind] for kind in whole)
    return 0.0


@layout_memo(*LAYER_FIELDS, "chunked_loss", "pp")  # pp: AutoTP's whole logits (logits_split)
def stage_extra_bytes(job: Job, layout: Layout) -> tuple[float, float]:
    """``first_stage_extra_bytes`` and ``last_stage_extra_bytes`` of the job."""
    model, training = job.model, job.training
    return first_stage_extra_bytes(model, layout, training), last_stage_extra_bytes(model, layout, training)


@dataclass(slots=True, kw_only=True)  # built on every memo miss: not frozen (frozen __init__ is ~4x)
class LayerActivations:
    """Activation bytes of one micro-batch that every pipeline rank's total is made of."""

    per_kind: dict[LayerKind, float]  # kind_layer_bytes under the layout's recompute
    kept_per_kind: dict[LayerKind, float]  # kind_layer_bytes of the layers that do not recompute
    largest_layer: float  # the largest layer kind's, under the layout's recompute
    working: float  # recompute_working_bytes
    first_extra: float  # first_stage_extra_bytes
    last_extra: float  # last_stage_extra_bytes
    loss_workspace: float  # loss_workspace_bytes (counted with the buffers)


@layout_memo(*LAYER_FIELDS, *MOE_FIELDS, "recompute", "recompute_num_layers", "recompute_every_n_layers",
             "recompute_modules", "chunked_loss", "pp")  # fmt: skip
def layer_activations(job: Job, layout: Layout) -> LayerActivations:
    per_kind = kind_layer_bytes(job, layout, layout.recompute)
    partial = layout.recomputes_some_layers
    kept = kind_layer_bytes(job, layout, Recompute.NONE) if partial else per_kind
    first_extra, last_extra = stage_extra_bytes(job, layout)
    return LayerActivations(
        per_kind=per_kind,
        kept_per_kind=kept,
        largest_layer=max(max(per_kind.values()), max(kept.values())),
        working=recompute_working_bytes(job, layout, layout.recompute),
        first_extra=first_extra,
        last_extra=last_extra,
        loss_workspace=loss_workspace_bytes(job.model, layout, job.training),
    )


def ring_kv_width(model: ModelSpec, repeats_kv: bool = False) -> int:
    """The width of the K and V PyTorch's ring moves per token: the KV heads' own. torchtitan passes
    SDPA its shared K/V heads with ``enable_gqa`` since v0.2.2 (models/llama3/model/model.py; up to
    v0.2.0 it called ``repeat_kv`` first: ``repeats_kv``, Tuning.ring_attention_repeats_kv), and
    transformers' sdpa path does too (``use_gqa_in_sdpa``, torch >= 2.5, no mask: context
    parallelism passes none). MLA's decompressed K and V are per head already (MoE review: Llama 3.1
    8B at 1M tokens counted 4x the K/V, 13.7 GB, and 4x the gather)."""
    if model.mla is not None or repeats_kv:
        return model.q_size + model.v_size
    return 2 * model.kv_size


def torch_ring_buffer_bytes(
    model: ModelSpec, layout: Layout, training: TrainingSpec, repeats_kv: bool = False
) -> float:
    """The transient bytes PyTorch's ring attention holds during one layer's backward, beyond the
    layer's activations: FSDP with cp > 1 runs torch's context_parallel (torchtitan; Accelerate's
    parallelism_config), whose 'allgather' rotate method (both tools' default) all-gathers the whole
    sequence's K and V into one buffer kept for the attention call (torch/distributed/tensor/
    experimental/_attention.py ``_AllGatherRotater``: ``all_gather_tensor`` of the concatenated K, V),
    again in the backward, at their own (KV-head) width: ``ring_kv_width``; the backward adds fp32
    accumulators of dq, dk and dv and the fp32 dk, dv in flight to the next rank
    (``_templated_ring_attention_backward``, ``convert_to_f32``). The gathered K and V do not shrink
    with cp: cp x the local ones. 0 for every other layout."""
    if layout.framework is not Framework.FSDP or layout.cp == 1:
        return 0.0
    tokens = local_tokens(layout, training) / layout.tp
    element = element_bytes(training.precision)
    kv_local = tokens * ring_kv_width(model, repeats_kv) * element
    gathered = layout.cp * kv_local
    accumulators = FP32_BYTES * tokens * model.q_size + 2 * kv_local * FP32_BYTES / element
    return gathered + accumulators


def micro_batches_in_flight(layout: Layout, rank: int, micro_batches: int) -> float:
    """Micro-batches whose activations pipeline rank ``rank`` holds at its peak.

    1F1B (Narayanan et al. 2021 §2.2): rank r warms up with p - r forwards, capped by m.
    Interleaved with v chunks (Megatron's schedule): (v-1)p + 2(p-1-r) warm-up chunk forwards
    + 1 in steady state, each of L/(pv) layers; on rank 0 that is Korthikanti's factor
    1 + (p-1)/(pv) times p micro-batches. Megatron caps the warm-up at all m x v chunk forwards
    of the step (forward_backward_pipelining_with_interleaving), so with few micro-batches a rank
    holds at most all m of them. PyTorch's ScheduleInterleaved1F1B (torchtitan) warms up with
    (v-1) x its round's micro-batches, m // max(1, m // p), in place of p (schedules.py
    ``_get_warmup_ops``): the same where p divides m, more where it does not (6 at pp 4).
    """
    p, v = layout.pp, layout.virtual_pipeline_stages
    # Megatron's combined 1F1B (moe_a2a_overlap) runs a forward beside a backward: one more micro-batch
    # in flight, without a pipeline two (schedules.py: the interleaved warm-up plus one)
    overlap = 1 if layout.moe_a2a_overlap else 0
    if p == 1:
        return float(min(1 + overlap, micro_batches))
    if v == 1:
        return float(min(p - rank, micro_batches))
    per_round = micro_batches // max(1, micro_batches // p) if layout.framework is Framework.FSDP else p
    chunks = min((v - 1) * per_round + 2 * (p - 1 - rank) + 1 + overlap, micro_batches * v)
    return chunks / v


def layers_in_flight(layout: Layout, rank: int, micro_batches: int, chunk_layers: tuple[int, ...]) -> float:
    """``micro_batches_in_flight`` as the share of the rank's layers held: where an interleaved rank's
    chunks (its virtual stages, ``chunk_layers`` decoder layers each) differ, the micro-batches in
    flight at the peak are not spread evenly over them. The schedule runs a group of micro-batches
    through chunk 0, then chunk 1, ..., and the backward the chunks in reverse (Megatron's schedule
    table and get_model_chunk_id, groups of pp; PyTorch's Interleaved1F1B, rounds of m // (m // pp)):
    the warm-up and the steady state hold more of chunk 0's, so a heavier chunk 0 holds more than the
    average. Simulated over the warm-up and one period of the steady state (it repeats): Llama 3 70B at
    pp 8 v 3 (split 3, 4 x 9, 3 x 13, 2) holds 116 layer-micro-batches on rank 1, where the average
    chunk gave 106 (a pipeline review). Even chunks: ``micro_batches_in_flight`` exactly."""
    v = layout.virtual_pipeline_stages
    if v == 1 or min(chunk_layers) == max(chunk_layers):
        return micro_batches_in_flight(layout, rank, micro_batches)
    p = layout.pp
    group = micro_batches // max(1, micro_batches // p) if layout.framework is Framework.FSDP else p
    overlap = 1 if layout.moe_a2a_overlap else 0
    return _interleaved_peak(p, v, rank, micro_batches, group, overlap, chunk_layers)


@functools.lru_cache(maxsize=4096)
def _interleaved_peak(
    p: int, v: int, rank: int, micro_batches: int, group: int, overlap: int, chunk_layers: tuple[int, ...]
) -> float:
    total = sum(chunk_layers)
    shares = tuple(layers / total for layers in chunk_layers)
    steps = micro_batches * v
    warmup = min((v - 1) * group + 2 * (p - 1 - rank) + overlap, steps)
    held = sum(shares[(k // group) % v] for k in range(warmup))
    peak = held
    for i in range(min(steps - warmup, group * v)):  # the steady state repeats every group x v steps
        held += shares[((warmup + i) // group) % v]  # a forward, then the backward it pairs with
        peak = max(peak, held)
        held -= shares[v - 1 - (i // group) % v]
    return peak


def first_stage_extra_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    # Token ids (int64) saved by the embedding; Megatron adds the embedding dropout mask (sbh), on
    # the sequence-parallel shard (/t) under SP only: without it the dropout runs on the whole
    # [s, b, h] (Megatron-Core language_model_embedding.py forward; formulas.md §5 "without SP").
    # An embedding LayerNorm (BLOOM's word_embeddings_layernorm, BERT's embeddings.LayerNorm) saves
    # its input and fp32 mean and rstd (measured: bloom and bert, validation/data/activations.json).
    t = local_tokens(layout, training)
    extra = INDEX_BYTES * t
    if model.embedding_norm:
        extra += _hf_norm(model, training, t)
    if layout.framework is Framework.MEGATRON or model.hidden_dropout > 0:
        sp = layout.tp if layout.sequence_parallel else 1
        extra += _hidden_mask(model) * t * model.hidden_size / sp
    return extra


def logits_split(model: ModelSpec, layout: Layout) -> int:
    """The ranks the output layer's logits are split over: tp, vocab-parallel; 1 where DeepSpeed's
    AutoTP gathers them whole on every rank, which then runs the loss on all of them
    (``params.autotp_keeps_vocab_whole``)."""
    return 1 if autotp_keeps_vocab_whole(model, layout) else layout.tp


def last_stage_extra_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    # Final norm input, lm_head input and the fp32 log-softmax (HF upcasts logits; Megatron's
    # vocab-parallel cross-entropy keeps fp32 logits): 4sbh(1 + v/h)/t in Korthikanti §4.3.
    # A chunked loss (``CHUNKED_LOSS_CHUNKS``) keeps the fp32 hidden-state gradient it accumulates
    # chunk by chunk in forward, and its 16-bit cast before the decoder's backward. Compiled
    # (inductor fuses log_softmax + nll_loss), the loss saves its 16-bit input logits and a fp32
    # logsumexp per token, and recomputes the softmax in its backward kernel.
    d, t, h = element_bytes(training.precision), local_tokens(layout, training), model.hidden_size
    sp = layout.tp if layout.sequence_parallel else 1
    logits = loss_logits_per_token(model, training.seq_len)
    if model.head is not Head.CAUSAL_LM:
        # the encoders' losses take the logits as they are (BertForMaskedLM, *ForQuestionAnswering:
        # CrossEntropyLoss on the model-dtype scores, no .float()): log_softmax saves its output in
        # the model dtype
        return (
            encoder_head_bytes(model, layout, training)
            + d * t * logits
            + encoder_label_bytes(model, t, training)
        )
    if layout.framework is Framework.MEGATRON:
        norm_and_input = 2 * d * t * h / sp
    else:
        norm_and_input = (_hf_norm(model, training, t) + d * t * h) / sp
        norm_and_input += _gathered_input_excess(model, layout, training)  # the output layer's input
    if layout.chunked_loss:
        # torchtitan 0.3.0 components/loss.py ChunkedLossWrapper: GradAccumulator's fp32 buffer of the
        # whole [b, s, h] (replicated on the TP axis), then .to(hidden_states.dtype) beside it
        loss = (FP32_BYTES + d) * t * h
    elif layout.torch_compile is Compile.MODEL_AND_LOSS:
        loss = d * t * logits / logits_split(model, layout) + FP32_BYTES * t
    else:
        loss = FP32_BYTES * t * logits / logits_split(model, layout)
        if model.final_logit_softcapping:
            # Gemma2ForCausalLM: logits / c, tanh, * c before the loss; tanh keeps its output, the
            # logits in the model dtype (a fused or compiled loss caps inside its kernel: nothing more)
            loss += d * t * logits / logits_split(model, layout)
    # each multi-token-prediction depth (Megatron only) keeps its enorm input (the shifted tokens'
    # embedding), eh_proj's 2h input, its final norm's and output layer's inputs, its own fp32
    # logits and shifted labels; its decoder layer counts with the stage's layers
    mtp = training.mtp_num_layers * (5 * d * t * h / sp + loss + INDEX_BYTES * t)
    return norm_and_input + loss + INDEX_BYTES * t + mtp


def encoder_head_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> float:
    """What an encoder's head (``types.Head``) saves for backward, one micro-batch, without its fp32
    logits and labels (HF modeling_bert.py, one rank: encoders run data-parallel only).
    Masked LM: BertPredictionHeadTransform's dense input, its output (the exact GELU's input), the
    LayerNorm's input and mean/rstd, the decoder's input: 4 h-wide tensors. Question answering:
    qa_outputs' input. Sequence classification: the pooler's input is the first token's view of the
    last hidden state, which keeps that whole storage alive (measured); per sequence, the tanh output,
    the classifier dropout's mask (classifier_dropout defaults to hidden_dropout_prob) and output."""
    d, t, h = element_bytes(training.precision), local_tokens(layout, training), model.hidden_size
    if model.head is Head.MASKED_LM:
        return 3 * d * t * h + _hf_norm(model, training, t)
    if model.head is Head.QUESTION_ANSWERING:
        return d * t * h
    if model.head is Head.TOKEN_CLASSIFICATION:
        # BertForTokenClassification: dropout (classifier_dropout, default hidden_dropout_prob) on the
        # last hidden state, its mask and output (the classifier's input), every token
        return (_hidden_mask(model) + d) * t * h if model.hidden_dropout > 0 else d * t * h
    sequences = t / training.seq_len
    dropout = (_hidden_mask(model) + d) * sequences * h if model.hidden_dropout > 0 else 0.0
    return d * t * h + d * sequences * h + dropout


def encoder_label_bytes(model: ModelSpec, tokens: float, training: TrainingSpec) -> float:
    """The int64 labels an encoder head's loss keeps: one per token (masked LM), a start and an end
    position per sequence (question answering), one label per sequence (classification)."""
    sequences = tokens / training.seq_len
    if model.head in (Head.MASKED_LM, Head.TOKEN_CLASSIFICATION):
        return INDEX_BYTES * tokens
    if model.head is Head.QUESTION_ANSWERING:
        return 2 * INDEX_BYTES * sequences
    return INDEX_BYTES * sequences


def micro_batches_per_step(layout: Layout, training: TrainingSpec) -> int:
    """Gradient-accumulation steps (tolerant: rounds down instead of raising on a bad split)."""
    if layout.gradient_accumulation_steps is not None:
        return layout.gradient_accumulation_steps
    return max(1, training.global_batch_size // (layout.micro_batch_size * layout.dp))


def rank_micro_batch_bytes(
    layer: LayerActivations, layers: tuple[tuple[LayerKind, int], ...], recomputed_fraction: float
) -> float:
    """Activation bytes of one micro-batch in the decoder layers a pipeline rank holds (how many of
    each kind), recompute applied to ``recomputed_fraction`` of them
    (``pipeline.rank_recomputed_fractions``), the rest keeping everything."""
    stored = sum_by_kind(layers, layer.per_kind.__getitem__)
    if recomputed_fraction >= 1.0:
        return stored
    kept = sum_by_kind(layers, layer.kept_per_kind.__getitem__)
    return recomputed_fraction * stored + (1.0 - recomputed_fraction) * kept


def stage_activation_bytes(
    layout: Layout,
    layer: LayerActivations,
    per_micro: float,
    rank: int,
    in_flight: float,
    layers_held: float | None = None,
) -> int:
    """Activations held at its peak by pipeline rank ``rank`` (0 = first stage), whose layers hold
    ``per_micro`` bytes per micro-batch and which holds ``in_flight`` micro-batches
    (``micro_batches_in_flight``), ``layers_held`` of them as a share of its layers where its chunks
    differ (``layers_in_flight``; default: ``in_flight``)."""
    total = per_micro * (in_flight if layers_held is None else layers_held)
    if rank == 0:
        total += layer.first_extra * in_flight
    if rank == layout.pp - 1:
        # The loss's peak (its saved logits, with its workspace among the buffers) and a layer's
        # recompute in backward come one after the other, not together: the working set adds only
        # what exceeds the loss's. Measured on the CPU (validation/data/compile_activations.json):
        # every variant peaks in the loss's backward at layers + logits + workspace, no working set.
        loss_peak = layer.last_extra + layer.loss_workspace
        total += layer.last_extra + max(0.0, layer.working - loss_peak)
    else:
        total += layer.working
    return math.ceil(total)


# torchtitan's ChunkedLossWrapper.Config.num_chunks default (0.3.0 components/loss.py), the
# launcher's --loss.num_chunks: the sequence splits into this many equal chunks, one at a time in
# the loss.
CHUNKED_LOSS_CHUNKS = 8


def loss_workspace_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> int:
    """Transient fp32 logits-sized tensors around the loss (not saved, but alive at the peak)."""
    # HF: the fp32 upcast of the logits in forward, then the fp32 gradients of nll and log-softmax
    # in backward (2 x 4sbV). Megatron's vocab-parallel cross-entropy: the 16-bit gradient, d sbV/t.
    # FSDP with TP (torchtitan's loss_parallel, DTensor's log-softmax and nll_loss handlers): the
    # backward makes a zeros grad_input, exp(x) and their sum beside the saved log-softmax, 3 x
    # 4sbV/t (validation/data/loss_parallel.json: 4 fp32 logit shards at the peak against the plain
    # loss's 3, the same loss and gradients). torch.compile's fused backward kernel writes the
    # logits' 16-bit gradient only (2sbV/t).
    t = local_tokens(layout, training)
    logits = loss_logits_per_token(model, training.seq_len)
    if layout.chunked_loss:
        # one chunk's loss at a time (ChunkedLossWrapper: lm_head, loss and backward per chunk inside
        # the loss call): its 16-bit logits, and the fp32 upcast, saved log-softmax and the two fp32
        # gradients of nll and log-softmax, three of them alive at once (the plain loss's 3 x 4 bytes
        # below, with the logits beside them); compiled, the fused kernel's 16-bit gradient instead
        d = element_bytes(training.precision)
        per_logit = 2 * d if layout.torch_compile is Compile.MODEL_AND_LOSS else d + 3 * FP32_BYTES
        return math.ceil(per_logit * t * logits / (CHUNKED_LOSS_CHUNKS * logits_split(model, layout)))
    if layout.torch_compile is Compile.MODEL_AND_LOSS:
        return math.ceil(element_bytes(training.precision) * t * logits / logits_split(model, layout))
    if model.head is not Head.CAUSAL_LM:
        # an encoder's loss runs in the model dtype (``last_stage_extra_bytes``): the gradients of nll
        # and of log_softmax in backward, 2 x d bytes per logit
        return math.ceil(2 * element_bytes(training.precision) * t * logits)
    if layout.framework is Framework.MEGATRON:
        # its vocab-parallel cross-entropy runs in place on the one fp32 copy the activations count
        # (max subtraction, exp, division, and the backward's softmax - one_hot, mul_): beside it only
        # the logits' gradient cast back to the model dtype, 6 bytes a logit at the peak with the
        # saved 4 (an embeddings reviewer's live-byte trace of cross_entropy.py: 6.25; counted 8)
        if element_bytes(training.precision) == FP32_BYTES:
            return 0  # fp32 logits: .float() is the tensor itself, the gradient already its dtype
        return math.ceil(element_bytes(training.precision) * t * logits / layout.tp)
    copies = 3 if layout.framework is Framework.FSDP and layout.tp > 1 else 2
    return math.ceil(copies * FP32_BYTES * t * logits / logits_split(model, layout))
