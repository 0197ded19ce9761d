"""FLOPs of one training step, counted term by term from the architecture.

Conventions (one multiply-add = 2 FLOPs):
* Only matrix multiplications count: a linear layer of shape (in, out) costs 2 x in x out per
  token forward; biases, norms, activations and softmax are left out (Megatron, PaLM, nanoGPT).
* Attention's sequence term QK^T and AV is counted three ways, per token forward:
  - the full square, ``layer_core_flops``: 2 x span x (q_size + v_size), every key of the span for
    every query (Korthikanti Eq. 7, Narayanan Eq. 3, PaLM's 12 L H Q T, torchtitan's
    ``get_dense_model_nparams_and_flops``: "we follow the convention and do not account for sparsity
    in causal attention"). What eager attention executes (it computes the masked scores too), and
    the count the time model starts from (step_time swaps it for what the kernels execute);
  - the causal triangle, ``layer_core_causal_flops``: query i sees keys 0..i, (s + 1) / 2 on average
    (a sliding window or chunk its span of them: ``causal_keys_per_query``). MODEL FLOPs (MFU, the
    estimate's tflops_per_gpu) count this: the masked half of the square is no work of the model,
    and the frameworks now report MFU so: Megatron-LM's ``num_floating_point_operations``
    (megatron/training/training.py) halves core attention, "causal mask (only half of the mask is
    non-zero)", since 8873b55 (2025-03-06), and NeMo / Megatron-Bridge's published model TFLOP/s
    follow it (tests/estimator/test_flops.py checks Llama-3-8B against validation/data's row);
    FlashAttention's benchmarks count causal FLOPs as half the square
    (benchmarks/benchmark_flash_attention.py: ``// (2 if causal else 1)``);
  - a bidirectional encoder (BERT) has no causal mask: its "triangle" is the whole square, for
    the model FLOPs and for what flash kernels execute (``causal_keys_per_query`` = s);
  - what the kernels execute, ``layer_core_work_flops``: the triangle for flash kernels
    (FlashAttention-2 and cuDNN skip the key blocks past the diagonal), the square for eager
    attention. HARDWARE FLOPs (HFU) count this, so the executed FLOP/s is exactly what the time model
    runs at (step_time.compute_s times the same work at each kernel's rate, at most the dense peak):
    HFU <= 1 and MFU <= HFU by construction. The diagonal blocks' masked half is executed but not
    counted, as the kernels' published rates (catalog tuning.toml [attention_kernel]) do not count
    it: their time already includes it.
* Backward = 2 x forward (input gradients + weight gradients, one forward's worth each).
* Model FLOPs (MFU, PaLM arXiv:2204.02311 §4.1 and Korthikanti arXiv:2205.05198 App. A) leave
  recomputation out; hardware FLOPs (HFU) add it: full recompute is one more forward of every
  layer (Narayanan Eq. 3 counts it), selective recompute one more forward of attention's core.
* LoRA / QLoRA: the frozen base runs forward and the input-gradient half of backward only
  (2 of the 3 passes, 4/6 of dense training); attention's core has no weights, so its backward
  stays 2x; the adapters (rank r: in x r then r x out) train fully. QLoRA's dequantisation is
  not a matmul and is not counted.

Cross-checks (tests/estimator/test_flops.py): for a GPT config the full-square count equals
Korthikanti Eq. 7, 72 B L s h^2 (1 + s/(6h) + V/(12 h L)), and with full recompute Narayanan Eq. 3,
96 B L s h^2 (1 + s/(6h) + V/(16 h L)), exactly; the model count is Eq. 7 less the masked half,
6 B L h s (s - 1).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from service.estimator.params import (
    LayerKind,
    head_matrices,
    head_tokens_fraction,
    layer_kind,
    lora_adapter_shapes,
    mtp_projection_parameters,
    peft_moves_mlp_targets,
)
from service.estimator.types import (
    MLP_LINEAR,
    Attention,
    AttentionKind,
    Head,
    Method,
    MLASpec,
    ModelSpec,
    MoESpec,
    Recompute,
    RecomputeModule,
    TrainingSpec,
)

# ---------------------------------------------------------------- forward, per token


def attention_projection_flops(model: ModelSpec) -> int:
    """q, k, v and output projections, forward, per token (GQA: k and v are kv_size wide)."""
    if model.mla is not None:
        return mla_projection_flops(model)
    # 2 x (h*q + 2*h*kv + q*h)
    h, q, kv = model.hidden_size, model.q_size, model.kv_size
    return 2 * (h * q + 2 * h * kv + q * h)


def mla_projection_flops(model: ModelSpec) -> int:
    """DeepSeek MLA projections, forward, per token, as transformers runs them in training (the
    latent is decompressed for every key by kv_b_proj; no weight absorption): q_a + q_b (or q_proj),
    kv_a_proj_with_mqa, kv_b_proj and o_proj."""
    assert model.mla is not None
    return sum(matmul.flops for matmul in _mla_matmuls(model, model.mla))


def attention_core_flops(model: ModelSpec, span: int) -> int:
    """QK^T and AV, forward, per token, for queries that each see ``span`` keys (the sequence, or a
    sliding window or chunk: ``ModelSpec.attention_span``): 2 span q_size + 2 span v_size, over the
    full (not causal-halved) square."""
    # Korthikanti App. A: 4 b s^2 h per layer for b sequences of s tokens -> 4 s h per token; MLA's
    # QK^T runs over nope + rope, its AV over v_head_dim
    return 2 * span * (model.q_size + model.v_size)


def layer_core_flops(model: ModelSpec, kind: LayerKind, seq_len: int) -> int:
    """``attention_core_flops`` of a layer of ``kind`` in sequences of ``seq_len`` tokens."""
    return attention_core_flops(model, model.attention_span(kind.attention, seq_len))


def causal_keys_per_query(model: ModelSpec, kind: AttentionKind, seq_len: int) -> float:
    """Keys a query of a ``kind`` layer sees on average under the causal mask: (s + 1) / 2 for the
    whole sequence, the triangle then the full window for a sliding window, a triangle per chunk. A
    bidirectional encoder has no causal mask: every query sees all s keys, the whole square."""
    if model.bidirectional:
        # BERT's self-attention (is_causal False): the flash kernels then run every key block too
        return float(seq_len)
    if kind is AttentionKind.SLIDING and (w := model.attention_span(kind, seq_len)) < seq_len:
        return (w * (w + 1) / 2 + (seq_len - w) * w) / seq_len
    if kind is AttentionKind.CHUNKED and model.attention_chunk_size is not None:
        c = min(model.attention_chunk_size, seq_len)
        full, rest = divmod(seq_len, c)
        return (full * c * (c + 1) / 2 + rest * (rest + 1) / 2) / seq_len
    return (seq_len + 1) / 2


def layer_core_causal_flops(model: ModelSpec, kind: LayerKind, seq_len: int) -> float:
    """QK^T and AV of a layer of ``kind``, forward, per token, over the causal triangle: each query
    against the ``causal_keys_per_query`` keys the mask lets it see. Model FLOPs count this."""
    # Megatron-LM num_floating_point_operations: "/ 2  # causal mask (only half of the mask is
    # non-zero)"; (s + 1) / 2 keys per query rather than s / 2: the diagonal is computed and kept
    return 2 * causal_keys_per_query(model, kind.attention, seq_len) * (model.q_size + model.v_size)


# Families whose transformers attention repeats k and v to every head itself before SDPA (so SDPA
# never sees grouped heads): Falcon's, which also passes a materialised (b, 1, s, s) mask; measured in
# validation/data/activations.json.
SDPA_EXPANDS_KV_FAMILIES = frozenset({"falcon"})


# transformers passes SDPA enable_gqa=True, rather than repeating k and v, for an unmasked call whose
# k and v head dims are equal and at most this (integrations/sdpa_attention.py use_gqa_in_sdpa)
SDPA_GQA_HEAD_DIM_MAX = 256
# PyTorch SDPA's memory-efficient kernel: 16-bit head dims in multiples of this (minimum_gemm_alignment)
SDPA_MEM_EFFICIENT_ALIGNMENT = 8


def materialises_scores(model: ModelSpec, training: TrainingSpec) -> bool:
    """Whether attention's core materialises the s x s scores: eager attention, or PyTorch SDPA's math
    kernel, which transformers' SDPA call reaches for a grouped-query model where PyTorch's flash
    kernel cannot run: fp32 or tf32 activations (it takes 16 bits only), or a GPU without flash
    kernels (``TrainingSpec.gpu_flash_kernels``, resolved from ``GPUSpec.flash_attention``: NVIDIA
    Ampere and newer; a V100 or T4 has none).
    Unmasked, transformers passes ``enable_gqa=True`` rather than repeating k and v
    (integrations/sdpa_attention.py ``use_gqa_in_sdpa``), and the memory-efficient kernel refuses
    grouped heads (torch 2.11 sdp_utils.cpp: ``check_batch_size_and_num_heads_dense<false>`` in its
    constraints), so dispatch falls back to the math kernel, which computes and saves what eager
    attention does. Measured on an H200 (validation/data/device_runs.json): Qwen2.5-0.5B (14 heads
    over 2 kv heads) in fp32 and tf32 took 19% more than the memory-efficient kernel's estimate,
    within 1.5% of eager attention's."""
    if training.attention is Attention.EAGER:
        return True
    if (
        training.attention is Attention.SDPA
        and model.family in SDPA_EXPANDS_KV_FAMILIES
        and model.num_kv_heads == 1 < model.num_attention_heads
    ):
        # Falcon-7B's multi-query attention hands SDPA k and v of one head beside 71 query heads,
        # without enable_gqa and with a mask (modeling_falcon.py): the fused kernels need equal heads
        # (sdp_utils check_batch_size_and_num_heads_dense), so every GPU runs the math kernel. The
        # new decoder architecture (40B, 180B) broadcasts k and v to every head first. (A new-
        # architecture config of one kv head reads as 7B's here: none is published.) Estimated as the
        # memory-efficient kernel, 7B fit on V100s at 27 GiB where eager's 48 does not (attention review)
        return True
    if (
        training.attention is Attention.SDPA
        and not training.gpu_flash_kernels
        and not training.precision.stores_fp32
        and model.head_dim % SDPA_MEM_EFFICIENT_ALIGNMENT
    ):
        # without flash kernels (V100, T4) SDPA's memory-efficient kernel needs 16-bit head dims in
        # multiples of 8 (sdp_utils check_head_dim_size_mem_efficient, minimum_gemm_alignment); only
        # its flash backend pads them (attention review: head_dim 100 on a V100)
        return True
    return (
        training.attention is Attention.SDPA
        and (training.precision.stores_fp32 or not training.gpu_flash_kernels)
        and model.num_kv_heads < model.num_attention_heads
        and model.mla is None
        and model.head_dim <= SDPA_GQA_HEAD_DIM_MAX
        and model.family not in SDPA_EXPANDS_KV_FAMILIES
    )


def sdpa_refuses_flash(model: ModelSpec) -> bool:
    """Whether PyTorch SDPA's flash and cuDNN backends refuse the model's heads, leaving its memory-
    efficient kernel (no published rate: timed at no more than the die's flash kernel, as eager is held;
    estimate.attention_core_note says so):
    a head dim past 256 (sdp_utils check_head_dim_size_flash, check_cudnn_tensor_shapes), or q and k
    of another width than v (MLA: 192 and 128; 'Flash attention requires q,k,v to have the same last
    dimension'). Transformers then repeats k and v past head_dim 256 (activations._hf_sdpa); the
    attention review found both cases named FlashAttention-2's kernel."""
    return model.head_dim > SDPA_GQA_HEAD_DIM_MAX or model.mla is not None


def sdpa_window_mask(model: ModelSpec, training: TrainingSpec, attention: AttentionKind) -> bool:
    """Whether transformers hands SDPA a sliding or chunked layer's mask instead of is_causal: once the
    sequence reaches the window or chunk (masking_utils._ignore_causal_mask_sdpa: ``local_attention_size``
    is either, create_chunked_causal_mask passing the chunk); FlashAttention-2 takes the window itself.
    With a mask SDPA's kernels run every key block (none skipped, ``layer_core_work_flops``) and the
    mask is kept for backward (``activations``). Llama 4's chunked layers were timed and sized as
    unmasked: a reviewer's CPU trace of a tiny llama4_text showed the (1, 1, s, s) mask and k and v
    repeated to every head on each chunked layer, as on Gemma 3's sliding ones (hybrid-models review)."""
    span = {AttentionKind.SLIDING: model.sliding_window, AttentionKind.CHUNKED: model.attention_chunk_size}
    local = span.get(attention)
    return training.attention is Attention.SDPA and local is not None and training.seq_len >= local


def runs_causal_kernel(model: ModelSpec, training: TrainingSpec) -> bool:
    """Whether attention's core runs a kernel that skips the causally masked blocks: flash and
    PyTorch SDPA (its FlashAttention-2, memory-efficient and cuDNN backends all do); eager
    attention and SDPA's math kernel (``materialises_scores``) compute the whole s x s square."""
    return not materialises_scores(model, training)


def layer_core_work_flops(model: ModelSpec, kind: LayerKind, training: TrainingSpec) -> float:
    """The core FLOPs a layer's attention kernel executes, forward, per token. Flash kernels skip
    the key blocks the causal mask hides (FlashAttention-2 and cuDNN iterate only to the diagonal),
    so they do ``causal_keys_per_query`` keys' work; eager attention, SDPA's math kernel, and SDPA
    handed a sliding layer's mask (``sdpa_window_mask``: its kernels skip no masked block) compute
    the whole square, ``layer_core_flops`` (config review, stop 44: Gemma 3's sliding layers under
    SDPA were timed at their window, faster than full attention)."""
    seq_len = training.seq_len
    # the whole s x s, not the window's band or the chunk: SDPA handed the mask, and eager attention
    # (transformers' eager_attention_forward multiplies q by every key, then masks) or SDPA's math
    # kernel, which timed Gemma 2's sliding layers at their window (hybrid-models review)
    if sdpa_window_mask(model, training, kind.attention) or not runs_causal_kernel(model, training):
        return float(layer_core_flops(model, kind._replace(attention=AttentionKind.FULL), seq_len))
    return layer_core_causal_flops(model, kind, seq_len)


def mlp_flops(model: ModelSpec, ffn_hidden_size: int) -> int:
    """One MLP of width ``ffn_hidden_size``, forward, per token: 3 matrices if gated, else 2."""
    matrices = 3 if model.mlp.gated else 2
    return 2 * matrices * model.hidden_size * ffn_hidden_size


def moe_flops(model: ModelSpec, moe: MoESpec) -> int:
    """One MoE block, forward, per token: top_k routed experts + shared experts + router (+ gate)."""
    # router h -> E logits; Qwen2-MoE's shared-expert gate h -> 1
    routed = moe.top_k * mlp_flops(model, moe.expert_ffn_hidden_size)
    shared = moe.num_shared_experts * mlp_flops(model, moe.shared_expert_ffn_hidden_size)
    router = 2 * model.hidden_size * moe.num_experts
    gate = 2 * model.hidden_size if moe.shared_expert_gate else 0
    return routed + shared + router + gate


def layer_matmul_flops(model: ModelSpec, moe_layer: bool) -> int:
    """Weight matmuls of one decoder layer (an MoE one when ``moe_layer``), forward, per token."""
    if model.moe is not None and moe_layer:
        ffn = moe_flops(model, model.moe)
    else:
        ffn = mlp_flops(model, model.ffn_hidden_size)
    return attention_projection_flops(model) + ffn


@dataclass(frozen=True, slots=True)
class Matmul:
    """One weight matmul of a decoder layer, per token: its output width and FLOPs. ``row_parallel``:
    under tensor parallelism its output is a full-width partial sum (o_proj, down_proj);
    ``replicated``: every tensor-parallel rank runs it whole (MLA's down projections, NoParallel in
    torchtitan's DeepSeek-V3 plan: their latents are shared by every head)."""

    out_features: int
    flops: int
    row_parallel: bool
    replicated: bool = False


def layer_matmuls(model: ModelSpec, moe_layer: bool, fused_qkv: bool = False) -> tuple[Matmul, ...]:
    """The weight matmuls of one decoder layer in forward order: q, k, v (one wqkv where ``fused_qkv``),
    o, then the MLP's gate (w1), up (w3) and down (w2) (gate and down without a gated MLP); an MoE
    layer's routed experts (top_k of them per token, the rows of one grouped matmul) and shared
    experts in the MLP's place. The router is left out. MLA's attention runs wq_a and wq_b (or wq),
    wkv_a, wkv_b and wo (torchtitan models/deepseek_v3 Attention; ``mla_projection_flops``)."""
    h, q, kv = model.hidden_size, model.q_size, model.kv_size
    attention: tuple[Matmul, ...] = (
        Matmul(q, 2 * h * q, False),
        Matmul(kv, 2 * h * kv, False),
        Matmul(kv, 2 * h * kv, False),
        Matmul(h, 2 * q * h, True),
    )
    if fused_qkv:
        attention = (Matmul(q + 2 * kv, 2 * h * (q + 2 * kv), False), attention[-1])
    if model.mla is not None:
        attention = _mla_matmuls(model, model.mla)

    def mlp(ffn: int, copies: int) -> tuple[Matmul, ...]:
        up = (Matmul(copies * ffn, copies * 2 * h * ffn, False),) * (2 if model.mlp.gated else 1)
        return (*up, Matmul(h, copies * 2 * ffn * h, True))

    moe = model.moe
    if moe is None or not moe_layer:
        return attention + mlp(model.ffn_hidden_size, 1)
    routed = mlp(moe.expert_ffn_hidden_size, moe.top_k)
    shared = mlp(moe.shared_expert_ffn_hidden_size, moe.num_shared_experts) if moe.num_shared_experts else ()
    return attention + routed + shared


def _mla_matmuls(model: ModelSpec, mla: MLASpec) -> tuple[Matmul, ...]:
    """MLA's projections as ``Matmul``s: the query through its latent (wq_a h -> r_q, replicated;
    wq_b r_q -> n qk) or a plain wq, the shared key/value latent with the rope key (wkv_a h -> r +
    rope, replicated), its decompression (wkv_b r -> n (nope + v)) and wo (n v -> h)."""
    h, n, r_q, r = model.hidden_size, model.num_attention_heads, mla.q_lora_rank, mla.kv_lora_rank
    qk, kv_b = n * mla.qk_head_dim, n * (mla.qk_nope_head_dim + mla.v_head_dim)
    if r_q is None:
        query: tuple[Matmul, ...] = (Matmul(qk, 2 * h * qk, False),)
    else:
        query = (Matmul(r_q, 2 * h * r_q, False, replicated=True), Matmul(qk, 2 * r_q * qk, False))
    latent = r + mla.qk_rope_head_dim
    return (
        *query,
        Matmul(latent, 2 * h * latent, False, replicated=True),
        Matmul(kv_b, 2 * r * kv_b, False),
        Matmul(h, 2 * model.v_size * h, True),
    )


def op_sac_matmuls(model: ModelSpec, moe_layer: bool) -> tuple[Matmul, ...]:
    """The matmuls torchtitan 0.3.0's per-op AC counts, in forward order: its blocks' fused wqkv
    (models/common/attention.py; every registered llama3, qwen3 and gpt_oss flavor builds
    fuse_qkv=True) and wo, or MLA's projections, then the dense MLP or an MoE layer's shared experts.
    Neither the router (force_recompute_mm_shapes_by_fqns) nor the routed experts, whose
    torch._grouped_mm is in neither the save list (PyTorch's compute_intensive_ops, torchtitan's own)
    nor the mm count, are among them: both always recompute (``op_sac_recompute_flops``). A reviewer
    logged the policy's decisions on torchtitan's own debugmodel_moe: wqkv saved, wo recomputed, the
    router and the three grouped matmuls recomputed; q, k and v apart, with the experts in the count,
    timed Qwen3-30B-A3B's recompute at half its cost (recompute review)."""
    matmuls = layer_matmuls(model, moe_layer, fused_qkv=True)
    if model.moe is None or not moe_layer:
        return matmuls
    attention = len(_mla_matmuls(model, model.mla)) if model.mla is not None else 2
    routed = 3 if model.mlp.gated else 2
    return matmuls[:attention] + matmuls[attention + routed :]


def op_sac_saved(matmuls: tuple[Matmul, ...]) -> tuple[bool, ...]:
    """Which matmul outputs torchtitan's per-op AC saves: every second one (the 2nd, 4th, ...) is
    recomputed (SelectiveAC: ``mm_count % 2 == 0`` -> PREFER_RECOMPUTE, counted per block)."""
    return tuple(index % 2 == 0 for index in range(len(matmuls)))


def op_sac_recompute_flops(model: ModelSpec, moe_layer: bool) -> int:
    """Forward FLOPs per token per-op AC runs again: the unsaved counted matmuls, and an MoE layer's
    router and routed experts (``op_sac_matmuls``)."""
    matmuls = op_sac_matmuls(model, moe_layer)
    recomputed = sum(m.flops for m, saved in zip(matmuls, op_sac_saved(matmuls), strict=True) if not saved)
    moe = model.moe
    if moe is None or not moe_layer:
        return recomputed
    return (
        recomputed
        + 2 * model.hidden_size * moe.num_experts
        + moe.top_k * mlp_flops(model, moe.expert_ffn_hidden_size)
    )


def logits_flops(model: ModelSpec) -> int:
    """Output layer h -> V, forward, per token (the embedding lookup costs no FLOPs)."""
    return 2 * model.hidden_size * model.vocab_size


def head_flops(model: ModelSpec, seq_len: int) -> float:
    """The head's matmuls, forward, per token of sequences of ``seq_len`` tokens (``params.head_matrices``
    on ``params.head_tokens_fraction`` of the tokens). The masked-LM decoder scores every position
    (transformers' BertForMaskedLM; the loss ignores the unmasked ones)."""
    if model.head is Head.CAUSAL_LM:
        return logits_flops(model)
    matmuls = sum(2 * fan_in * fan_out for fan_in, fan_out in head_matrices(model))
    return matmuls * head_tokens_fraction(model, seq_len)


# ---------------------------------------------------------------- LoRA adapters


def _lora_flops_for(model: ModelSpec, targets: tuple[str, ...], rank: int, ffn: int, mlp_copies: int) -> int:
    # adapter x -> A (in x r) -> B (r x out): 2 r (in + out) per token, one per module
    # (params.lora_adapter_shapes: a fused module's one, MLA's own); MLP adapters once per active expert
    total = 0
    for held, fan_in, fan_out in lora_adapter_shapes(model, targets, ffn):
        copies = mlp_copies if MLP_LINEAR.issuperset(held) else 1
        total += copies * 2 * rank * (fan_in + fan_out)
    return total


def lora_adapter_flops(
    model: ModelSpec, moe_layer: bool, training: TrainingSpec, *, fused_experts: bool
) -> int:
    """LoRA adapters of one layer, forward, per token (0 for full fine-tuning). ``fused_experts``: the
    routed experts are the fused parameters Hugging Face's model holds (``model_states.fused_experts``:
    ep 1), which no adapter module reaches per token: peft folds the adapters it moves onto them into
    the weight once per micro-batch (``step_time.adapted_experts_s``), or adapts none."""
    if training.method is Method.FULL:
        return 0
    targets, rank = training.lora_targets, training.lora_rank
    if peft_moves_mlp_targets(model):
        # peft moves the MLP targets off the modules (onto the fused experts, or onto nothing where a
        # framework's MoE layers hold them: refused), so no dense MLP or shared expert keeps one
        targets = tuple(t for t in targets if t not in MLP_LINEAR)
    if model.moe is None or not moe_layer:
        return _lora_flops_for(model, targets, rank, model.ffn_hidden_size, 1)
    moe = model.moe
    # attention adapters once, MLP adapters on each of the top_k routed experts a token visits where
    # the experts are modules (a framework's MoE layers) ...
    total = _lora_flops_for(
        model, targets, rank, moe.expert_ffn_hidden_size, 0 if fused_experts else moe.top_k
    )
    # ... and on the shared experts
    mlp_targets = tuple(t for t in targets if t in MLP_LINEAR)
    shared_ffn = moe.shared_expert_ffn_hidden_size
    total += _lora_flops_for(model, mlp_targets, rank, shared_ffn, moe.num_shared_experts)
    return total


# ---------------------------------------------------------------- training passes


def frozen_passes(training: TrainingSpec) -> int:
    """Passes over a weight matmul per step: 3 (fwd + input grad + weight grad), 2 if frozen (LoRA)."""
    return 3 if training.method is Method.FULL else 2


def layer_training_flops(
    model: ModelSpec, kind: LayerKind, training: TrainingSpec, *, fused_experts: bool
) -> int:
    """Forward + backward of one layer per token, no recompute, attention's core over the full
    square (``layer_core_flops``): the time model's count, which replaces 3 x that core by what its
    kernels execute (step_time.compute_s). Model FLOPs: ``layer_model_flops``; hardware FLOPs:
    ``layer_hardware_flops``."""
    # weight matmuls x (3 or 2) + attention core x 3 (no weights: both backward halves needed)
    # + adapters x 3
    core = layer_core_flops(model, kind, training.seq_len)
    return layer_non_core_flops(model, kind, training, fused_experts=fused_experts) + 3 * core


def layer_non_core_flops(
    model: ModelSpec, kind: LayerKind, training: TrainingSpec, *, fused_experts: bool
) -> int:
    """Forward + backward of one layer's weight matmuls and adapters per token: all but the core."""
    weights = frozen_passes(training) * layer_matmul_flops(model, kind.moe)
    return weights + 3 * lora_adapter_flops(model, kind.moe, training, fused_experts=fused_experts)


def layer_model_flops(
    model: ModelSpec, kind: LayerKind, training: TrainingSpec, *, fused_experts: bool
) -> float:
    """Forward + backward of one layer per token, no recompute, attention's core over the causal
    triangle (``layer_core_causal_flops``): the MFU numerator's share of the layer."""
    core = layer_core_causal_flops(model, kind, training.seq_len)
    return layer_non_core_flops(model, kind, training, fused_experts=fused_experts) + 3 * core


def layer_hardware_flops(
    model: ModelSpec, kind: LayerKind, training: TrainingSpec, *, fused_experts: bool
) -> float:
    """Forward + backward of one layer per token, no recompute, attention's core as its kernel
    executes it (``layer_core_work_flops``): the HFU numerator's share of the layer."""
    core = layer_core_work_flops(model, kind, training)
    return layer_non_core_flops(model, kind, training, fused_experts=fused_experts) + 3 * core


def mtp_block_training_flops(model: ModelSpec, training: TrainingSpec) -> float:
    """One multi-token-prediction depth beyond its decoder layer, forward + backward per token: eh_proj
    (2h -> h) and the output layer on its hidden state (Megatron-Core MultiTokenPredictionLayer)."""
    # 2 FLOPs per weight per token forward, x3 with the backward
    return 3 * 2 * mtp_projection_parameters(model) + logits_training_flops(model, training)


def logits_training_flops(model: ModelSpec, training: TrainingSpec) -> float:
    """Forward + backward of the output layer (an encoder's head) per token (frozen under LoRA)."""
    return frozen_passes(training) * head_flops(model, training.seq_len)


def layer_recompute_flops(
    model: ModelSpec,
    kind: LayerKind,
    training: TrainingSpec,
    recompute: Recompute,
    modules: frozenset[RecomputeModule] = frozenset({RecomputeModule.CORE_ATTN}),
    *,
    fused_experts: bool,
) -> int:
    """Extra forward FLOPs per token of one layer that recomputation adds; ``modules``: what
    Megatron's selective recompute checkpoints (its default, core_attn); ``fused_experts``: as
    ``lora_adapter_flops`` takes it."""
    # full: the whole layer forward again (Narayanan Eq. 3's 4th pass);
    # selective: the modules' forward (Korthikanti §5 "core attention": QK^T and AV);
    # selective_op: the matmuls per-op AC does not save (attention's output is saved)
    core = layer_core_flops(model, kind, training.seq_len)
    if recompute is Recompute.FULL:
        adapters = lora_adapter_flops(model, kind.moe, training, fused_experts=fused_experts)
        return layer_matmul_flops(model, kind.moe) + core + adapters
    if recompute is Recompute.SELECTIVE:
        return sum(_module_forward_flops(model, kind, module, core) for module in modules)
    if recompute is Recompute.SELECTIVE_OP:
        return op_sac_recompute_flops(model, kind.moe)
    return 0


def recomputes_core(recompute: Recompute, modules: frozenset[RecomputeModule]) -> bool:
    """Whether the recompute runs attention's core again: full, or selective with core_attn."""
    return recompute is Recompute.FULL or (
        recompute is Recompute.SELECTIVE and RecomputeModule.CORE_ATTN in modules
    )


def layer_recompute_hardware_flops(
    model: ModelSpec,
    kind: LayerKind,
    training: TrainingSpec,
    recompute: Recompute,
    modules: frozenset[RecomputeModule] = frozenset({RecomputeModule.CORE_ATTN}),
    *,
    fused_experts: bool,
) -> float:
    """``layer_recompute_flops`` with a recomputed core counted as its kernel executes it
    (``layer_core_work_flops``), as step_time.recompute_s times it."""
    extra = layer_recompute_flops(model, kind, training, recompute, modules, fused_experts=fused_experts)
    if not recomputes_core(recompute, modules):
        return float(extra)
    square = layer_core_flops(model, kind, training.seq_len)
    work = layer_core_work_flops(model, kind, training)
    return extra - square + work


def _module_forward_flops(model: ModelSpec, kind: LayerKind, module: RecomputeModule, core: int) -> int:
    # the matmuls a checkpointed Megatron module runs again; norms and activations are elementwise
    moe = model.moe if kind.moe else None
    if module is RecomputeModule.CORE_ATTN:
        return core
    if module is RecomputeModule.MLA_UP_PROJ and model.mla is not None:
        mla, n = model.mla, model.num_attention_heads
        q_up = 2 * mla.q_lora_rank * n * mla.qk_head_dim if mla.q_lora_rank is not None else 0
        return q_up + 2 * mla.kv_lora_rank * n * (mla.qk_nope_head_dim + mla.v_head_dim)
    if module is RecomputeModule.MLP and moe is None:
        return mlp_flops(model, model.ffn_hidden_size)
    if module is RecomputeModule.MOE and moe is not None:
        return moe_flops(model, moe)
    if module is RecomputeModule.SHARED_EXPERTS and moe is not None:
        return moe.num_shared_experts * mlp_flops(model, moe.shared_expert_ffn_hidden_size)
    return 0


# ---------------------------------------------------------------- per step


@lru_cache(maxsize=1024)  # O(layers); a search asks again for every layout of one job
def model_flops_per_token(model: ModelSpec, training: TrainingSpec, fused_experts: bool) -> float:
    """Training FLOPs per token without recomputation, attention's core over the causal triangle:
    the MFU numerator (PaLM / Korthikanti model FLOPs, with Megatron-LM's causal attention term);
    ``fused_experts`` as ``lora_adapter_flops`` takes it."""
    return _flops_per_token(
        model, training, functools.partial(layer_model_flops, fused_experts=fused_experts)
    )


@lru_cache(maxsize=1024)
def executed_flops_per_token(model: ModelSpec, training: TrainingSpec, fused_experts: bool) -> float:
    """Training FLOPs per token without recomputation, attention's core as its kernels execute it
    (``layer_core_work_flops``): ``model_flops_per_token`` for flash kernels, more for eager."""
    return _flops_per_token(
        model, training, functools.partial(layer_hardware_flops, fused_experts=fused_experts)
    )


def _flops_per_token(
    model: ModelSpec, training: TrainingSpec, layer: Callable[[ModelSpec, LayerKind, TrainingSpec], float]
) -> float:
    layers = sum(layer(model, layer_kind(model, i), training) for i in range(model.num_layers))
    # each multi-token-prediction depth: a layer of the last layer's kind, its projection and loss
    last = layer_kind(model, model.num_layers - 1)
    mtp = layer(model, last, training) + mtp_block_training_flops(model, training)
    return layers + logits_training_flops(model, training) + training.mtp_num_layers * mtp


@lru_cache(maxsize=1024)
def recompute_flops_per_token(
    model: ModelSpec,
    training: TrainingSpec,
    recompute: Recompute,
    modules: frozenset[RecomputeModule],
    fused_experts: bool,
) -> float:
    """Forward FLOPs per token that recomputing every layer adds, as the kernels execute them."""
    return sum(
        layer_recompute_hardware_flops(
            model, layer_kind(model, i), training, recompute, modules, fused_experts=fused_experts
        )
        for i in range(model.num_layers)
    )


def model_flops_per_step(model: ModelSpec, training: TrainingSpec, *, fused_experts: bool) -> float:
    """Model FLOPs of one optimizer step (global batch x seq_len tokens)."""
    return training.tokens_per_step * model_flops_per_token(model, training, fused_experts)


def hardware_flops_per_step(
    model: ModelSpec,
    training: TrainingSpec,
    recompute: Recompute,
    recomputed_fraction: float = 1.0,
    modules: frozenset[RecomputeModule] = frozenset({RecomputeModule.CORE_ATTN}),
    *,
    fused_experts: bool,
) -> float:
    """What the GPUs execute of one step (HFU numerator): the training FLOPs with attention's core
    as its kernels run it, plus the recomputed forward work; ``recomputed_fraction`` of the layers
    recompute (``pipeline.recomputed_fraction``); ``modules``: Megatron's selective ones."""
    per_token = recompute_flops_per_token(model, training, recompute, modules, fused_experts)
    executed = executed_flops_per_token(model, training, fused_experts)
    return training.tokens_per_step * (executed + recomputed_fraction * per_token)
