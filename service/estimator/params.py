"""Exact parameter counts of a decoder-only transformer or a BERT-style encoder, per component and
per pipeline stage.

Counts equal PyTorch's ``sum(p.numel() for p in model.parameters())`` for the same Hugging Face
``transformers`` model (tied tensors counted once); ``validation/param_counts.py`` measures that on
the meta device for every supported family and every catalog preset.

References: Narayanan et al. 2021 (arXiv:2104.04473) Eq. 2, P = 12lh^2 (1 + 13/(12h) + (V+s)/(12lh));
nanoGPT ``transformer_sizing.ipynb``; Megatron-LM ``theoretical_memory_usage.py`` for the
per-stage split (the first stage holds the embedding, the last the final norm and output layer).
"""

from __future__ import annotations

import functools
from functools import lru_cache
from typing import NamedTuple

from service.estimator import pipeline
from service.estimator.types import (
    ALL_LINEAR,
    MLP_LINEAR,
    Attention,
    AttentionKind,
    Framework,
    Head,
    Layout,
    MLASpec,
    ModelSpec,
    MoESpec,
    NormKind,
    ParameterCounts,
    PositionEmbedding,
    QKNorm,
)


class LayerKind(NamedTuple):
    """A decoder layer's kind: whether its MLP is the MoE block and what its attention sees. Every
    per-layer formula (parameters, FLOPs, stored activations) reads the layer index only through it,
    so a model's layers are computed once per kind and summed (Gemma 3: sliding and full layers;
    DeepSeek-V3: dense first layers; Llama 4: chunked dense, chunked MoE and full MoE)."""

    moe: bool
    attention: AttentionKind = AttentionKind.FULL


# The families whose modeling file is RoBERTa's (transformers modeling_xlm_roberta.py and
# modeling_camembert.py: every class "Copied from transformers.models.roberta.modeling_roberta"): its
# classification head (dense and out_proj), its position ids past the padding index, its layers.
ROBERTA_FAMILIES = frozenset({"roberta", "xlm-roberta", "camembert"})


def autotp_keeps_vocab_whole(model: ModelSpec, layout: Layout) -> bool:
    """Whether DeepSpeed's AutoTP (tp > 1) leaves the embedding whole on every rank and gathers the
    whole logits there: an untied model (transformers' tp plan splits lm_head "colwise_gather_output"
    and skips the rowwise embedding; only a tied one is made vocab-parallel, runtime/engine.py).
    Counted split, Llama 3 8B at tp 4 was 13 GB short (embeddings review). (A family without a tp plan,
    BLOOM or GPT-2, takes AutoTP's heuristic path, which keeps even a tied vocabulary whole; its DeepSpeed
    tp layouts here are also the historic Megatron-DeepSpeed ones, vocab-parallel: counted split.)"""
    if layout.framework is not Framework.DEEPSPEED or layout.tp == 1 or layout.pp > 1:
        # (with pp > 1, tp is Megatron-DeepSpeed's, vocab-parallel: AutoTP joins no pipeline engine)
        return False
    return not model.tied_embeddings


# The attention kernels transformers implements for a family, where it lacks some (its modeling file's
# _supports_sdpa / _supports_flash_attn, transformers 5.24; eager always exists): BLOOM declares neither
# (BloomAttention adds its ALiBi bias with baddbmm and materialises the scores); Gemma 2 and GPT-OSS
# have no SDPA ("sdpa does not support softcapping"; the attention sinks); Llama 4 no FlashAttention
# (Llama4PreTrainedModel). Every other family has all three. (Gemma 3's multimodal wrapper, which
# AutoModelForCausalLM builds for model_type gemma3, has no FlashAttention either, unlike the text-only
# Gemma3ForCausalLM of gemma3_text; ModelSpec's family does not tell the two apart: not refused.)
# (config review: a BLOOM plan recommended flash at 71 GiB where eager, what runs, needs 238.)
_FAMILY_ATTENTION: dict[str, frozenset[Attention]] = {
    "bloom": frozenset({Attention.EAGER}),
    "gemma2": frozenset({Attention.FLASH, Attention.EAGER}),
    "gpt_oss": frozenset({Attention.FLASH, Attention.EAGER}),
    "llama4": frozenset({Attention.SDPA, Attention.EAGER}),
}


def transformers_attention(model: ModelSpec) -> frozenset[Attention]:
    """The attention kernels the model's transformers implementation runs (``_FAMILY_ATTENTION``);
    Falcon with ALiBi has no FlashAttention (FalconAttention raises: flash takes no bias)."""
    kernels = _FAMILY_ATTENTION.get(model.family, frozenset(Attention))
    if model.family == "falcon" and model.position_embedding is PositionEmbedding.ALIBI:
        kernels = kernels - {Attention.FLASH}
    return kernels


def layer_kind(model: ModelSpec, index: int) -> LayerKind:
    """The kind of decoder layer ``index`` (0-based)."""
    return LayerKind(moe=is_moe_layer(model, index), attention=model.attention_kind(index))


# Families whose Hugging Face module fuses q, k and v into one Linear (or GPT-2's Conv1D). For the
# parameters this changes only which single module is largest, never a total; for the activations,
# a saved view of v keeps the whole q+k+v buffer alive (``activations._hf_sdpa``).
FUSED_QKV_FAMILIES = frozenset({"gpt2", "gpt_neox", "falcon", "bloom", "phi3"})
# Families whose gated MLP fuses gate and up into one Linear (Phi-3's gate_up_proj).
_FUSED_GATE_UP_FAMILIES = frozenset({"phi3"})

# The Hugging Face modules LoRA adapts, by family: each (lora_targets names, the module that holds
# them). A fused module (Phi-3's qkv_proj, GPT-2's c_attn) is one adapter over all of its targets,
# so it is targeted whole or not at all; its module name is what peft matches (a suffix of the
# module's path: "attn.c_proj" is GPT-2's attention output, "mlp.c_proj" its MLP's down). Families
# not listed name their modules as Llama does, one per target. (modeling_phi3.py Phi3Attention /
# Phi3MLP; modeling_gpt2.py GPT2Attention / GPT2MLP; modeling_gpt_neox.py, modeling_falcon.py,
# modeling_bloom.py: query_key_value, dense, dense_h_to_4h, dense_4h_to_h; modeling_phi.py.)
# (lora_targets names, the module that holds them) of each adaptable module of a layer
LoraGroups = tuple[tuple[tuple[str, ...], str], ...]
_NEOX_STYLE: LoraGroups = (
    (("q_proj", "k_proj", "v_proj"), "query_key_value"),
    (("o_proj",), "dense"),
    (("up_proj",), "dense_h_to_4h"),
    (("down_proj",), "dense_4h_to_h"),
)
LORA_MODULES: dict[str, LoraGroups] = {
    "phi3": (
        (("q_proj", "k_proj", "v_proj"), "qkv_proj"),
        (("o_proj",), "o_proj"),
        (("gate_proj", "up_proj"), "gate_up_proj"),
        (("down_proj",), "down_proj"),
    ),
    "gpt2": (
        (("q_proj", "k_proj", "v_proj"), "attn.c_attn"),
        (("o_proj",), "attn.c_proj"),
        (("up_proj",), "mlp.c_fc"),
        (("down_proj",), "mlp.c_proj"),
    ),
    "gpt_neox": _NEOX_STYLE,
    "falcon": _NEOX_STYLE,
    "bloom": _NEOX_STYLE,
    # Mixtral's experts were w1 (gate), w3 (up) and w2 (down) (transformers 4's MixtralBlockSparseTop2MLP);
    # transformers 5 fuses them into parameters, and peft maps these names, not Llama's, onto them
    # (model_states.peft_adapts_fused_experts): a LoraConfig naming gate_proj adapted nothing
    "mixtral": (
        (("q_proj",), "q_proj"),
        (("k_proj",), "k_proj"),
        (("v_proj",), "v_proj"),
        (("o_proj",), "o_proj"),
        (("gate_proj",), "w1"),
        (("up_proj",), "w3"),
        (("down_proj",), "w2"),
    ),
    # Phi-1/1.5/2 (modeling_phi.py PhiAttention: q_proj, k_proj, v_proj, dense; PhiMLP: fc1, fc2):
    # unfused, but the output and MLP Linears have their own names (a review's Phi-2 plan wrote
    # o_proj/up_proj/down_proj, which peft matched nowhere, and adapted q and v alone)
    "phi": (
        (("q_proj",), "q_proj"),
        (("k_proj",), "k_proj"),
        (("v_proj",), "v_proj"),
        (("o_proj",), "dense"),
        (("up_proj",), "fc1"),
        (("down_proj",), "fc2"),
    ),
}


# A BERT-style encoder's Linear names as peft matches them (a suffix of the module path: "dense" is
# attention.output.dense, intermediate.dense and output.dense), as the decoder-style targets they are
# (launchers.common._ENCODER_LORA_MODULES, the other way round); PEFT's own default for BERT and
# RoBERTa is ["query", "value"]
_ENCODER_MODULE_TARGETS = {
    "query": ("q_proj",),
    "key": ("k_proj",),
    "value": ("v_proj",),
    "dense": ("o_proj", "up_proj", "down_proj"),
}


def _mla_lora_modules(mla: MLASpec) -> LoraGroups:
    """DeepSeek's multi-head latent attention (transformers DeepseekV2/V3Attention) as peft meets it:
    the queries through q_proj, or q_a_proj and q_b_proj with a q_lora_rank; keys and values together
    through kv_a_proj_with_mqa and kv_b_proj (one latent for both: targeted whole or not at all);
    o_proj. No k_proj or v_proj exists: a LoraConfig naming them adapted nothing there, while the
    estimate counted Llama-shaped adapters (config review, stop 41)."""
    queries: LoraGroups = (
        ((("q_proj",), "q_proj"),)
        if mla.q_lora_rank is None
        else ((("q_proj",), "q_a_proj"), (("q_proj",), "q_b_proj"))
    )
    keys_values = (("k_proj", "v_proj"), "kv_a_proj_with_mqa"), (("k_proj", "v_proj"), "kv_b_proj")
    mlp = tuple(((name,), name) for name in ALL_LINEAR if name in MLP_LINEAR)
    return (*queries, *keys_values, (("o_proj",), "o_proj"), *mlp)


def _lora_groups(model: ModelSpec) -> LoraGroups | None:
    """The model's adaptable modules and the targets each holds; None where each target is a module
    of its own name (Llama's)."""
    if model.mla is not None:
        return _mla_lora_modules(model.mla)
    return LORA_MODULES.get(model.family)


def canonical_lora_targets(model: ModelSpec, names: tuple[str, ...]) -> tuple[str, ...]:
    """``lora_targets`` as the estimate names them (Llama's q_proj ... down_proj) from the names a user
    gives peft for this model: its own modules (Phi-3's qkv_proj, GPT-2's c_attn, NeoX's
    query_key_value, BERT's query), each the targets its module holds (``LORA_MODULES``; a name peft
    matches as a suffix of several modules, GPT-2's c_proj, stands for each). A name none of them is
    stays as given, for TrainingSpec to refuse."""
    found: list[str] = []
    for name in names:
        found.extend(_module_targets(model, name) or (name,))
    return tuple(dict.fromkeys(found))


def lora_module_names(model: ModelSpec) -> tuple[str, ...]:
    """The names ``lora_targets`` takes for ``model``: its own modules' (``lora_modules``; an encoder's
    query ... dense) and Llama's, read as the modules that hold them."""
    own = _ENCODER_MODULE_TARGETS if model.bidirectional else [m for _, m in _lora_groups(model) or ()]
    llama = [name for name in ALL_LINEAR if name != "gate_proj" or model.mlp.gated]
    return tuple(dict.fromkeys([*own, *llama]))


# The parents of the adaptable modules in the Hugging Face decoders that name them as Llama's do
# (LlamaDecoderLayer's self_attn and mlp; Phi-3's self_attn.qkv_proj and mlp.gate_up_proj): peft
# matches a target as a suffix of the module's name, so "self_attn.q_proj" adapts every layer's q_proj
# as "q_proj" does (a 422 "unknown lora_targets" met that ordinary config; fine-tuner review), each
# parent with the targets it holds. An MoE layer's experts sit elsewhere (block_sparse_moe.experts.N,
# mlp.experts.N), so "mlp." names no expert: on an MoE model only self_attn is read so, but where peft
# maps the experts' names by suffix (``_expert_target_names``).
# ... the families with modules of their own names under those parents (GPT-2's attn and mlp,
# NeoX's attention and mlp, Falcon's self_attention: not)
SELF_ATTN_MLP_FAMILIES = frozenset({"phi3", "phi", "mixtral"})
TARGET_PARENTS = {
    "self_attn": frozenset({"q_proj", "k_proj", "v_proj", "o_proj"}),
    "mlp": frozenset({"gate_proj", "up_proj", "down_proj"}),
}


def _module_targets(model: ModelSpec, name: str) -> tuple[str, ...]:
    if name in ALL_LINEAR:
        return (name,)
    parent, _, last = name.rpartition(".")
    if parent and peft_moves_mlp_targets(model) and last in _expert_target_names(model):
        # peft moves any target equal to or ending in ".<name>" of the experts' v4 names onto the
        # fused experts (_convert_peft_config_moe: target.endswith(f".{old_name}")), so "mlp.down_proj"
        # trains what "down_proj" does there (a 422 "unknown lora_targets" on Qwen3-30B-A3B)
        return _module_targets(model, last)
    if parent == "self_attn" and model.mla is not None:
        # DeepSeek's latent attention modules sit under self_attn (DeepseekV3DecoderLayer), where peft
        # matches them by suffix as any decoder's ("self_attn.o_proj" was a 422; change review)
        held = _module_targets(model, last)
        return held if held and set(held) <= TARGET_PARENTS["self_attn"] else ()
    named_so = LORA_MODULES.get(model.family) is None or model.family in SELF_ATTN_MLP_FAMILIES
    if parent in TARGET_PARENTS and named_so and model.mla is None and not model.bidirectional:
        held = _module_targets(model, last)
        decoder = parent == "self_attn" or model.moe is None
        return held if held and decoder and set(held) <= TARGET_PARENTS[parent] else ()
    if model.bidirectional:
        return _ENCODER_MODULE_TARGETS.get(name, ())
    groups = _lora_groups(model) or ()
    named = (held for held, module in groups if module == name or module.endswith("." + name))
    return tuple(dict.fromkeys(t for held in named for t in held))


def lora_modules(model: ModelSpec, targets: tuple[str, ...]) -> LoraGroups:
    """The modules ``targets`` adapt in ``model``'s Hugging Face implementation: (the targets each
    holds, its name), a fused module once."""
    groups = _lora_groups(model)
    if groups is None:
        return tuple(((t,), t) for t in targets)
    return tuple((held, name) for held, name in groups if set(held) & set(targets))


@lru_cache(maxsize=1024)
def lora_adapter_shapes(
    model: ModelSpec, targets: tuple[str, ...], ffn: int
) -> tuple[tuple[tuple[str, ...], int, int], ...]:
    """(targets held, fan_in, fan_out) of each LoRA adapter ``targets`` put on one layer whose MLP is
    ``ffn`` wide, an adapter per module (``lora_modules``): a fused module's is one adapter of its
    targets' shared input and summed outputs (Phi-3's qkv_proj: h -> q + 2 kv); MLA's modules have
    their own shapes (``mla_parameters``)."""
    h, q, kv = model.hidden_size, model.q_size, model.kv_size
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    shapes |= {"up_proj": (h, ffn), "down_proj": (ffn, h)}
    if model.mlp.gated:
        shapes["gate_proj"] = (h, ffn)
    if model.mla is not None:
        mla, n = model.mla, model.num_attention_heads
        r_q, r = mla.q_lora_rank or 0, mla.kv_lora_rank
        shapes |= {
            "q_proj": (h, n * mla.qk_head_dim),
            "q_a_proj": (h, r_q),
            "q_b_proj": (r_q, n * mla.qk_head_dim),
            "kv_a_proj_with_mqa": (h, r + mla.qk_rope_head_dim),
            "kv_b_proj": (r, n * (mla.qk_nope_head_dim + mla.v_head_dim)),
            "o_proj": (n * mla.v_head_dim, h),
        }
    out = []
    for held, module in lora_modules(model, targets):
        if module in shapes and model.mla is not None:
            out.append((held, *shapes[module]))
            continue
        present = [name for name in held if name in shapes]
        if present:
            out.append((held, shapes[present[0]][0], sum(shapes[name][1] for name in present)))
    return tuple(out)


def split_fused_targets(model: ModelSpec, targets: tuple[str, ...]) -> tuple[str, ...] | None:
    """The fused module's targets ``targets`` names only some of (LoRA adapts a module whole: q_proj
    alone on Phi-3's qkv_proj cannot be), or None."""
    for held, _ in _lora_groups(model) or ():
        if len(held) > 1 and 0 < len(set(held) & set(targets)) < len(held):
            return held
    return None


def norm_parameters(model: ModelSpec) -> int:
    """Parameters of one norm over the hidden size."""
    # RMSNorm has a weight (h); LayerNorm a weight and a bias (2h).
    return model.hidden_size * (2 if model.norm is NormKind.LAYERNORM else 1)


def token_embedding_parameters(model: ModelSpec) -> int:
    # V x h lookup table.
    return model.vocab_size * model.hidden_size


def embedding_parameters(model: ModelSpec) -> int:
    """Token embedding, learned position table, token-type table (BERT) and embedding norm (BLOOM,
    BERT)."""
    # V*h + (s*h when positions are learned, as in GPT-2/GPT-3/BERT) + (type_vocab_size*h: BERT's
    # token_type_embeddings) + one norm when present (transformers BertEmbeddings).
    positions = (
        model.max_position_embeddings * model.hidden_size
        if model.position_embedding is PositionEmbedding.LEARNED
        else 0
    )
    token_types = model.type_vocab_size * model.hidden_size
    embedding_norm = norm_parameters(model) if model.embedding_norm else 0
    return token_embedding_parameters(model) + positions + token_types + embedding_norm


def final_norm_parameters(model: ModelSpec) -> int:
    """The norm after the last layer: none in a post-norm encoder (BertEncoder ends at the last
    layer's LayerNorm)."""
    return 0 if model.post_norm else norm_parameters(model)


def lm_head_bias(model: ModelSpec) -> bool:
    """Whether the output layer has a bias (Phi-2's lm_head does)."""
    return model.lm_head_bias


def output_parameters(model: ModelSpec) -> int:
    """The head's own parameters: the lm_head, 0 when tied to the embedding (plus its bias, if any);
    an encoder's task head (``Head``)."""
    h, v = model.hidden_size, model.vocab_size
    # h*V weight unless tied; + V when the lm_head has a bias (kept even when the weight is tied).
    decoder = (0 if model.tied_embeddings else h * v) + (v if lm_head_bias(model) else 0)
    match model.head:
        case Head.MASKED_LM:
            # BertPredictionHeadTransform dense h*h + h and LayerNorm, then BertLMPredictionHead's
            # decoder h -> V and its bias V, both tied (to the word embedding and to the head's own
            # ``bias``: BertForMaskedLM._tied_weights_keys); untied (tie_word_embeddings false), the
            # decoder's weight and bias are its own and the head's ``bias`` V stays besides (unused)
            untied = 0 if model.tied_embeddings else h * v + v
            return h * h + h + norm_parameters(model) + untied + v
        case Head.SEQUENCE_CLASSIFICATION:
            # BertPooler dense h*h + h, classifier h*L + L (RobertaClassificationHead: dense and out_proj)
            return h * h + h + h * model.num_labels + model.num_labels
        case Head.QUESTION_ANSWERING | Head.TOKEN_CLASSIFICATION:
            # qa_outputs h*L + L (L = num_labels, 2: start and end); the token classifier h*L + L
            return h * model.num_labels + model.num_labels
        case Head.CAUSAL_LM:
            return decoder


def loss_logits_per_token(model: ModelSpec, seq_len: int) -> float:
    """Logits the loss runs over, per token of sequences of ``seq_len`` tokens: V for a language-model
    head (causal or masked: transformers scores every position), L start/end or label logits per
    token for question answering and token classification, L per sequence for sequence
    classification."""
    if model.head is Head.SEQUENCE_CLASSIFICATION:
        return model.num_labels / seq_len
    if model.head in (Head.QUESTION_ANSWERING, Head.TOKEN_CLASSIFICATION):
        return float(model.num_labels)
    return float(model.vocab_size)


def attention_parameters(model: ModelSpec) -> int:
    """q, k, v and output projections of one layer, with their biases, q/k norms and sinks."""
    if model.mla is not None:
        return mla_parameters(model) + qk_norm_parameters(model) + sink_parameters(model)
    # q: h x (a*d), k and v: h x (g*d) each, o: (a*d) x h, with a heads, g kv heads, d head_dim.
    h, q, kv = model.hidden_size, model.q_size, model.kv_size
    weights = h * q + 2 * h * kv + q * h
    qkv_bias = q + 2 * kv if model.qkv_bias else 0
    out_bias = h if model.attn_out_bias else 0
    return weights + qkv_bias + out_bias + qk_norm_parameters(model) + sink_parameters(model)


def mla_down_parameters(model: ModelSpec) -> int:
    """MLA's down-projections and their norms, per layer: q_a_proj (h -> r_q) with q_a_layernorm and
    kv_a_proj_with_mqa (h -> r + rope) with kv_a_layernorm, biased with attention_bias; 0 without MLA.
    Megatron builds them as plain linears every TP rank holds whole (gpt_layer_specs.py
    linear_q_down_proj / linear_kv_down_proj = backend.linear(); multi_latent_attention.py sets their
    parallel_mode 'duplicated'), the norms likewise."""
    mla = model.mla
    if mla is None:
        return 0
    h, b = model.hidden_size, 1 if model.mla_bias else 0
    r_q, r = mla.q_lora_rank, mla.kv_lora_rank
    q = 0 if r_q is None else (h + b) * r_q + r_q
    return q + (h + b) * (r + mla.qk_rope_head_dim) + r


def mla_parameters(model: ModelSpec) -> int:
    """DeepSeek multi-head latent attention (transformers DeepseekV2/V3Attention), n heads:
    q_a_proj (h -> r_q, bias with attention_bias) + q_a_layernorm (r_q) + q_b_proj (r_q -> n qk), or a
    plain q_proj (h -> n qk) without q_lora_rank; kv_a_proj_with_mqa (h -> r + rope, biased) +
    kv_a_layernorm (r) + kv_b_proj (r -> n (nope + v)); o_proj (n v -> h, biased)."""
    mla = model.mla
    assert mla is not None
    h, n, b = model.hidden_size, model.num_attention_heads, 1 if model.mla_bias else 0
    r_q, r = mla.q_lora_rank, mla.kv_lora_rank
    q = h * n * mla.qk_head_dim if r_q is None else (h + b) * r_q + r_q + r_q * n * mla.qk_head_dim
    kv = (h + b) * (r + mla.qk_rope_head_dim) + r + r * n * (mla.qk_nope_head_dim + mla.v_head_dim)
    o = n * mla.v_head_dim * h + b * h
    return q + kv + o


def qk_norm_parameters(model: ModelSpec) -> int:
    """Norms on the queries and keys: RMSNorm(head_dim) twice (Qwen3, Gemma 3), RMSNorm over all q
    and all k heads (OLMo 2), or a weightless L2 norm (Llama 4)."""
    if model.qk_norm is QKNorm.PER_HEAD:
        return 2 * model.head_dim
    if model.qk_norm is QKNorm.FULL_WIDTH:
        return model.q_size + model.kv_size
    return 0


def sink_parameters(model: ModelSpec) -> int:
    """GPT-OSS attention sinks: one learned logit per head."""
    return model.num_attention_heads if model.attention_sinks else 0


def _mlp_parameters(model: ModelSpec, ffn: int) -> int:
    # Gated (SwiGLU/GeGLU): gate and up h x f, down f x h -> 3hf (+ 2f + h biases);
    # plain GELU: up h x f, down f x h -> 2hf (+ f + h biases).
    h = model.hidden_size
    if model.mlp.gated:
        return 3 * h * ffn + (2 * ffn + h if model.mlp_bias else 0)
    return 2 * h * ffn + (ffn + h if model.mlp_bias else 0)


def mlp_parameters(model: ModelSpec) -> int:
    """One dense feed-forward block of width ffn_hidden_size."""
    return _mlp_parameters(model, model.ffn_hidden_size)


def expert_parameters(model: ModelSpec, moe: MoESpec) -> int:
    """One routed expert: an MLP of width expert_ffn_hidden_size (biased only with expert_bias:
    DeepSeek-V2's mlp_bias reaches its dense and shared MLPs, not the routed experts)."""
    h, f = model.hidden_size, moe.expert_ffn_hidden_size
    weights = (3 if model.mlp.gated else 2) * h * f
    if not moe.expert_bias:
        return weights
    return weights + ((2 if model.mlp.gated else 1) * f + h)


def router_parameters(model: ModelSpec, moe: MoESpec) -> int:
    # Router: h x E logits (+ E bias).
    return model.hidden_size * moe.num_experts + (moe.num_experts if moe.router_bias else 0)


def shared_expert_parameters(model: ModelSpec, moe: MoESpec) -> int:
    """Shared (always active) experts and, for Qwen2-MoE, their sigmoid gate."""
    # n_shared MLPs of width f_shared, + the h -> 1 gate (no bias) when present.
    experts = moe.num_shared_experts * _mlp_parameters(model, moe.shared_expert_ffn_hidden_size)
    gate = model.hidden_size if moe.shared_expert_gate else 0
    return experts + gate


def moe_parameters(model: ModelSpec, moe: MoESpec) -> int:
    """The whole feed-forward block of one MoE layer: routed experts, router, shared experts."""
    # E experts + router + shared experts.
    return (
        moe.num_experts * expert_parameters(model, moe)
        + router_parameters(model, moe)
        + shared_expert_parameters(model, moe)
    )


def layer_norm_parameters(model: ModelSpec) -> int:
    """All norms inside one decoder layer."""
    # norms_per_layer x one norm (1: Falcon-7B, 2: most, 4: Gemma-2's sandwich norms).
    return model.norms_per_layer * norm_parameters(model)


def is_moe_layer(model: ModelSpec, index: int) -> bool:
    """Whether decoder layer ``index`` (0-based) has a mixture-of-experts MLP: one of the model's
    ``moe_layers``, else every layer_frequency-th (Qwen2-MoE's (i + 1) % decoder_sparse_step == 0)."""
    if model.moe is None:
        return False
    if model.moe_layers is not None:
        return index in model.moe_layers
    return (index + 1) % model.moe.layer_frequency == 0


def layer_parameters(model: ModelSpec, index: int) -> int:
    """All parameters of decoder layer ``index`` (0-based)."""
    # attention + norms + (MoE block or dense MLP).
    if model.moe is not None and is_moe_layer(model, index):
        mlp = moe_parameters(model, model.moe)
    else:
        mlp = mlp_parameters(model)
    return attention_parameters(model) + layer_norm_parameters(model) + mlp


@functools.lru_cache(maxsize=256)  # per model: the validator asks it of every Megatron layout
def moe_layer_count(model: ModelSpec) -> int:
    return sum(1 for i in range(model.num_layers) if is_moe_layer(model, i))


def largest_module_parameters(model: ModelSpec) -> int:
    """The largest single nn.Module's own parameters (DeepSpeed's largest_layer_params for ZeRO-3)."""
    # Candidates are the leaf modules of the Hugging Face model: embeddings, lm_head, the attention
    # and MLP projections (fused where the family fuses them) and, in transformers >= 5, the experts
    # module, which holds all experts' gate_up and down tensors as its own parameters.
    h, q, kv, f = model.hidden_size, model.q_size, model.kv_size, model.ffn_hidden_size
    candidates = [token_embedding_parameters(model), head_module_parameters(model)]
    if model.position_embedding is PositionEmbedding.LEARNED:
        candidates.append(model.max_position_embeddings * h)
    bias = 1 if model.qkv_bias else 0
    if model.family in FUSED_QKV_FAMILIES:
        candidates.append((h + bias) * (q + 2 * kv))
    else:
        candidates.append((h + bias) * q)
    candidates.append(q * h + (h if model.attn_out_bias else 0))
    if model.mla is not None:
        mla, n = model.mla, model.num_attention_heads
        if mla.q_lora_rank is not None:
            candidates.append(mla.q_lora_rank * n * mla.qk_head_dim)
        candidates.append(mla.kv_lora_rank * n * (mla.qk_nope_head_dim + mla.v_head_dim))
    mlp_bias = 1 if model.mlp_bias else 0
    fused_up = 2 if model.mlp.gated and model.family in _FUSED_GATE_UP_FAMILIES else 1
    candidates.append((h + mlp_bias) * f * fused_up)
    candidates.append(f * h + h * mlp_bias)
    if model.moe is not None:
        candidates.append(model.moe.num_experts * expert_parameters(model, model.moe))
        candidates.append(router_parameters(model, model.moe))
        if model.moe.num_shared_experts:
            # Each of the shared expert's projections is its own Linear.
            candidates.append((h + mlp_bias) * model.moe.shared_expert_ffn_hidden_size)
    return max(candidates)


def head_matrices(model: ModelSpec) -> tuple[tuple[int, int], ...]:
    """(in, out) of each matmul an encoder's head (``types.Head``) runs, each with a bias
    (transformers modeling_bert.py): masked LM, BertPredictionHeadTransform's dense h -> h and the
    decoder h -> V; sequence classification, the pooler's dense h -> h and the classifier h -> L
    (RobertaClassificationHead: dense and out_proj, the same shapes); question answering, qa_outputs
    h -> L. A decoder's lm_head: h -> V (its bias per ``lm_head_bias``)."""
    h = model.hidden_size
    match model.head:
        case Head.MASKED_LM:
            return ((h, h), (h, model.vocab_size))
        case Head.SEQUENCE_CLASSIFICATION:
            return ((h, h), (h, model.num_labels))
        case Head.QUESTION_ANSWERING | Head.TOKEN_CLASSIFICATION:
            return ((h, model.num_labels),)
        case Head.CAUSAL_LM:
            return ((h, model.vocab_size),)


def peft_saved_head_parameters(model: ModelSpec) -> int:
    """The task head PEFT trains in full beside the adapters, as a copy of it (its modules_to_save;
    the original stays, frozen): PeftModelForSequenceClassification's "classifier" (BERT's h -> L
    Linear; RoBERTa's RobertaClassificationHead, its dense h -> h and out_proj h -> L), and
    PeftModelForQuestionAnswering's "qa_outputs"; none for a masked LM (a plain PeftModel) or a
    decoder. Each Linear with its bias."""
    h = model.hidden_size
    if model.head is Head.SEQUENCE_CLASSIFICATION:
        classifier = (h + 1) * model.num_labels
        return classifier + (h + 1) * h if model.family in ROBERTA_FAMILIES else classifier
    if model.head in (Head.QUESTION_ANSWERING, Head.TOKEN_CLASSIFICATION):
        return (h + 1) * model.num_labels  # qa_outputs; PeftModelForTokenClassification's "classifier"
    return 0


def head_tokens_fraction(model: ModelSpec, seq_len: int) -> float:
    """The share of a sequence's tokens the head's matmuls run on: the first token alone for sequence
    classification (the pooler reads hidden_states[:, 0]), every token otherwise."""
    return 1.0 / seq_len if model.head is Head.SEQUENCE_CLASSIFICATION else 1.0


def head_module_parameters(model: ModelSpec) -> int:
    """The head's largest single module: the lm_head (with its bias), or an encoder head's largest
    Linear, weight and bias (the masked-LM decoder holds its tied weight and bias as its own)."""
    if model.head is Head.CAUSAL_LM:
        return output_parameters(model)
    return max((fan_in + 1) * fan_out for fan_in, fan_out in head_matrices(model))


@lru_cache(maxsize=1024)  # ModelSpec is frozen: searches ask for the same counts thousands of times
def parameter_counts(model: ModelSpec) -> ParameterCounts:
    """Exact parameter counts of ``model``, by component."""
    moe_layers = moe_layer_count(model)
    dense_layers = model.num_layers - moe_layers
    embedding = embedding_parameters(model)
    output = output_parameters(model)
    final_norm = final_norm_parameters(model)
    layers = sum(layer_parameters(model, i) for i in range(model.num_layers))
    total = embedding + output + final_norm + layers
    experts = router = shared = inactive = 0
    if model.moe is not None:
        per_expert = expert_parameters(model, model.moe)
        experts = model.moe.num_experts * per_expert
        router = router_parameters(model, model.moe)
        shared = shared_expert_parameters(model, model.moe)
        # A token visits top_k of the E routed experts in each MoE layer.
        inactive = moe_layers * (model.moe.num_experts - model.moe.top_k) * per_expert
    return ParameterCounts(
        total=total,
        embedding=embedding,
        output=output,
        final_norm=final_norm,
        attention_per_layer=attention_parameters(model),
        norms_per_layer=layer_norm_parameters(model),
        dense_layers=dense_layers,
        dense_mlp_per_layer=mlp_parameters(model),
        moe_layers=moe_layers,
        experts_per_moe_layer=experts,
        router_per_moe_layer=router,
        shared_experts_per_moe_layer=shared,
        active_per_token=total - inactive,
        largest_module=largest_module_parameters(model),
    )


MTP_NORMS = 3  # enorm, hnorm and the depth's final norm (Megatron-Core MultiTokenPredictionLayer)


def mtp_projection_parameters(model: ModelSpec) -> int:
    """eh_proj of one multi-token-prediction depth: [embedding; hidden] 2h -> h, no bias."""
    return 2 * model.hidden_size * model.hidden_size


def mtp_block_parameters(model: ModelSpec) -> int:
    """One multi-token-prediction depth beyond its decoder layer: eh_proj and its norms
    (DeepSeek-V3 §2.2)."""
    return mtp_projection_parameters(model) + MTP_NORMS * norm_parameters(model)


def mtp_stage_parameters(model: ModelSpec, layout: Layout, mtp_layers: int) -> int:
    """What ``mtp_layers`` multi-token-prediction depths add to the last pipeline rank: each a decoder
    layer of the last layer's spec and its block, and with pp > 1 and untied embeddings a copy of
    the word embedding (GPTModel builds it where mtp_process, to embed the shifted tokens)."""
    if mtp_layers == 0:
        return 0
    per_depth = layer_parameters(model, model.num_layers - 1) + mtp_block_parameters(model)
    copy = token_embedding_parameters(model) if layout.pp > 1 and not model.tied_embeddings else 0
    return mtp_layers * per_depth + copy


def stage_parameter_counts(model: ModelSpec, layout: Layout, mtp_layers: int = 0) -> tuple[int, ...]:
    """Parameters held by each pipeline rank under the layout's split (``pipeline.stage_layers``),
    the ``mtp_layers`` multi-token-prediction depths on the last (``mtp_stage_parameters``).

    Megatron convention: the first stage holds the embedding, the last the final norm and the
    output layer. With tied embeddings and pp > 1, Megatron keeps a copy of the word embedding on
    the last stage for the output layer and all-reduces its gradient between the first and last
    stage, so the stages then sum to the total plus V x h.
    """
    ranks = pipeline.rank_layer_ranges(model.num_layers, layout)
    kinds = [is_moe_layer(model, i) for i in range(model.num_layers)]
    # a layer's parameters depend on its kind only through the MoE block: one count per value
    per_kind = {kind: layer_parameters(model, kinds.index(kind)) for kind in set(kinds)}
    stages = [sum(per_kind[kinds[i]] for chunk in chunks for i in chunk) for chunks in ranks]
    stages[0] += embedding_parameters(model)
    stages[-1] += final_norm_parameters(model) + output_parameters(model)
    if model.tied_embeddings and layout.pp > 1:
        stages[-1] += token_embedding_parameters(model)  # the output layer's copy of the word embedding
    stages[-1] += mtp_stage_parameters(model, layout, mtp_layers)
    return tuple(stages)


# peft 0.21 under transformers 5 (peft/utils/transformers_weight_conversion.py, _convert_peft_config_moe,
# called by get_peft_model): for the model types whose checkpoint conversion is transformers' "mixtral"
# or "qwen2_moe" pattern (conversion_mapping._MODEL_TO_CONVERSION_PATTERN: qwen3_moe, deepseek_v2/v3,
# ...; peft adds mixtral itself; qwen2_moe itself is not in it), LoRA's MLP target names are moved
# onto the fused expert parameters (target_parameters): gate_proj and up_proj (Mixtral's w1 and w3)
# onto gate_up_proj as one adapter of rank 2r, down_proj (w2) onto down_proj, each a ParamWrapper of
# r x E rows (peft/tuners/lora/layer.py); a target naming one of gate and up alone is refused
# ("Cannot convert PEFT target(s) ..."). The names leave target_modules, so no dense MLP or shared
# expert keeps an adapter. Measured on the meta device with peft 0.21.2 and transformers 5.25
# (config review, stop 44: Qwen3-30B-A3B's LoRA r16 trains 996.5M parameters, 981.5M on experts).
# OLMoE's too: transformers' conversion_mapping maps "olmoe" onto the "qwen2_moe" pattern.
_PEFT_FUSED_EXPERT_FAMILIES = frozenset({"mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "olmoe"})


def _expert_target_names(model: ModelSpec) -> frozenset[str]:
    """The MLP target names peft maps onto ``peft_moves_mlp_targets``' fused experts
    (_MOE_TARGET_MODULE_MAPPING's keys): Mixtral's w1, w3 and w2, the qwen2_moe pattern's gate_proj,
    up_proj and down_proj (the model's own MLP modules, ``LORA_MODULES``)."""
    groups = _lora_groups(model)
    if groups is None:
        return MLP_LINEAR
    return frozenset(module for held, module in groups if set(held) <= MLP_LINEAR)


def peft_moves_mlp_targets(model: ModelSpec) -> bool:
    """Whether peft moves LoRA's MLP target names off the modules, by the model type alone
    (``_PEFT_FUSED_EXPERT_FAMILIES``): onto the fused experts where they are fused parameters, and
    onto nothing where a framework built other expert modules (DeepSpeed's MoE layers at ep > 1)."""
    return model.family in _PEFT_FUSED_EXPERT_FAMILIES
