"""Build a ModelSpec from the fields of a Hugging Face ``config.json``.

One small builder per ``model_type``, each mirroring the module layout of the matching
``transformers`` modeling file (``models/<family>/modeling_<family>.py``, transformers 5.x) and the
defaults of its configuration class, so that ``parameter_counts`` of the result equals PyTorch's
count of ``AutoModelForCausalLM.from_config(config)`` (encoders, ``bert`` and ``roberta``: of the
BertFor* / RobertaFor* class their ``architectures`` names, *ForMaskedLM when it names none).
``validation/param_counts.py`` measures that.

Only the core sizes (hidden size, layers, heads, vocabulary and, where the family has one, the MLP
width) are required; every other missing key takes the transformers configuration-class default.
A key that the family's configuration class declares (or its modeling file reads) and that changes
the architecture in a way ModelSpec cannot express is refused with InvalidModel naming that key
(rule ``hf_config``); keys transformers ignores, and harmless ones (token ids, dropout, router loss
coefficients, scalar multipliers, ...), are accepted.

The hyperparameters without parameters that make the launchers train this very model (RoPE base and
rope_scaling, the norm epsilon, the MoE router's scoring, grouping and scaling) are read into
ModelSpec too, each a missing key at its configuration class's default and an invalid value refused;
no memory or time figure reads them.

Multimodal wrappers (``gemma3``, ``llama4``, ``mistral3``) resolve their ``text_config``: the
language model is counted, the vision tower and projector are not.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import NamedTuple

from service.estimator.errors import InvalidModel
from service.estimator.model_states import NF4_SINGLE_CONSTANT_BITS
from service.estimator.params import ROBERTA_FAMILIES
from service.estimator.scale import MAX_LAYERS
from service.estimator.types import (
    AttentionKind,
    Head,
    MLASpec,
    MlpKind,
    ModelSpec,
    MoERouter,
    MoESpec,
    NormKind,
    PositionEmbedding,
    Precision,
    QKNorm,
    RopeScaling,
    RopeScalingKind,
    RouterScore,
    moe_layer_total,
)

_MISSING = object()

# The largest sizes a config may state (the explicit-architecture form's limits): the per-layer work
# of an estimate grows with the layer count, so an absurd one would pin a core.
_DEFAULT_INT_LIMIT = 10_000_000
_INT_LIMITS = {
    # the layers the service plans for (scale.MAX_LAYERS): a config between it and a parse guard of
    # 10,000 was refused again later as model.num_layers, a field the request never sent, at another
    # limit (a review of the ordinary requests)
    "num_hidden_layers": MAX_LAYERS.limit,
    "n_layer": MAX_LAYERS.limit,
    "num_attention_heads": 10_000,
    "n_head": 10_000,
    "num_key_value_heads": 10_000,
    "hidden_size": 1_000_000,
    "n_embd": 1_000_000,
    "n_embed": 1_000_000,
    "head_dim": 100_000,
    "num_experts": 4096,
    "num_local_experts": 4096,
    "n_routed_experts": 4096,
    "num_experts_per_tok": 256,
    "max_position_embeddings": 100_000_000,
    "n_positions": 100_000_000,
}

FULL, SLIDING, CHUNKED = AttentionKind.FULL, AttentionKind.SLIDING, AttentionKind.CHUNKED
# transformers' layer_types values
_LAYER_TYPES = {
    "full_attention": FULL,
    "sliding_attention": SLIDING,
    "chunked_attention": CHUNKED,
}


class _Fields:
    """Typed, defaulting access to a config.json mapping; errors name the offending key."""

    def __init__(self, raw: Mapping[str, object], model_type: str, prefix: str = "") -> None:
        self.raw = raw
        self.model_type = model_type
        self.prefix = prefix  # "text_config." inside a multimodal wrapper

    def _lookup(self, keys: tuple[str, ...]) -> tuple[str, object]:
        for key in keys:
            if key in self.raw:
                return key, self.raw[key]
        return keys[0], _MISSING

    def _error(self, key: str, problem: str, limit: int | None = None) -> InvalidModel:
        path = self.prefix + key
        return InvalidModel(
            f"hf_config (model_type {self.model_type!r}): {path!r} {problem}",
            rule="hf_config",
            field=f"hf_config.{path}",
            limit=limit,
        )

    def required_int(self, *keys: str) -> int:
        """The first present key of ``keys`` (aliases), which must be a positive integer."""
        key, value = self._lookup(keys)
        if value is _MISSING or value is None:
            raise self._error(key, "is required")
        number = self._as_int(key, value)
        if number < 1:  # named as the config names it (ModelSpec's own check names its field: num_layers)
            raise self._error(key, f"must be >= 1, got {number}")
        return number

    def int_or(self, key: str, default: int) -> int:
        value = self.raw.get(key)
        return default if value is None else self._as_int(key, value)

    def optional_int(self, key: str) -> int | None:
        value = self.raw.get(key)
        return None if value is None else self._as_int(key, value)

    def int_or_null(self, key: str, default: int | None) -> int | None:
        """A missing key takes the class default; an explicit null stays null (DeepSeek-V2-Lite's
        q_lora_rank, Mistral NeMo's sliding_window), unlike ``int_or``."""
        if key not in self.raw:
            return default
        value = self.raw[key]
        return None if value is None else self._as_int(key, value)

    def positive_int_or(self, key: str, default: int) -> int:
        value = self.int_or(key, default)
        if value < 1:
            raise self._error(key, f"must be >= 1, got {value}")
        return value

    def kv_heads(self, key: str, default: int | None, num_heads: int) -> int:
        """kv heads: a missing key takes the class default; null (or a None default) means MHA."""
        value = self.raw.get(key, default)
        return num_heads if value is None else self._as_int(key, value)

    def bool_or(self, key: str, default: bool) -> bool:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._error(key, f"must be true or false, got {value!r}")
        return value

    def float_or(self, key: str, default: float) -> float:
        value = self.raw.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self._error(key, f"must be a finite number, got {value!r}")
        return float(value)

    def positive_float(self, *keys: str, default: float) -> float:
        """The first present key of ``keys`` (aliases), a finite number > 0; absent or null: default."""
        key, value = self._lookup(keys)
        if value is _MISSING or value is None:
            return default
        number = self.float_or(key, default)
        if not number > 0:
            raise self._error(key, f"must be > 0, got {value!r}")
        return number

    def optional_positive_float(self, key: str) -> float | None:
        return None if self.raw.get(key) is None else self.positive_float(key, default=0.0)

    def int_list(self, key: str) -> list[int]:
        value = self.raw.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._error(key, f"must be a list of integers, got {value!r}")
        return [self._as_int(key, item) for item in value]

    def layer_indices(self, key: str, num_layers: int) -> list[int]:
        """A list of decoder-layer indices, each in [0, num_layers)."""
        indices = self.int_list(key)
        bad = [i for i in indices if not 0 <= i < num_layers]
        if bad:
            raise self._error(key, f"lists layers {bad} outside [0, {num_layers})")
        return indices

    def layer_types(
        self, default: Sequence[AttentionKind], allowed: Collection[AttentionKind]
    ) -> list[AttentionKind]:
        """``layer_types`` (one attention kind per layer) when given, else the class's default list."""
        value = self.raw.get("layer_types")
        if value is None:
            return list(default)
        names = sorted(name for name, kind in _LAYER_TYPES.items() if kind in allowed)
        if not isinstance(value, list) or len(value) != len(default):
            raise self._error(
                "layer_types", f"must list one of {names} for each of the {len(default)} layers"
            )
        kinds = []
        for item in value:
            kind = _LAYER_TYPES.get(item) if isinstance(item, str) else None
            if kind is None or kind not in allowed:
                raise self._error("layer_types", f"has {item!r}; this family's layers are one of {names}")
            kinds.append(kind)
        return kinds

    def with_defaults(self, defaults: Mapping[str, object]) -> _Fields:
        """These fields with a config class's defaults for the keys they leave out (as transformers'
        AutoConfig reads a config.json)."""
        return _Fields({**defaults, **self.raw}, self.model_type, prefix=self.prefix)

    def nested(self, key: str, model_type: str) -> _Fields:
        """The sub-config a multimodal wrapper keeps its language model in (``text_config``)."""
        value = self.raw.get(key)
        if not isinstance(value, Mapping):
            raise self._error(key, "must be an object: the language model's configuration")
        inner = value.get("model_type", model_type)
        if inner != model_type:
            raise self._error(f"{key}.model_type", f"must be {model_type!r}, got {inner!r}")
        return _Fields(value, model_type, prefix=f"{self.prefix}{key}.")

    def rotary_fraction(self, *keys: str, default: float) -> float:
        """Partial rotary factor, top level or inside rope_parameters / rope_scaling."""
        for key in keys:
            if self.raw.get(key) is not None:
                return self.float_or(key, default)
        for nested in ("rope_parameters", "rope_scaling"):
            rope = self.raw.get(nested)
            if isinstance(rope, Mapping) and rope.get("partial_rotary_factor") is not None:
                return _Fields(rope, self.model_type).float_or("partial_rotary_factor", default)
        return default

    def reject(self, key: str, unsupported: object, reason: str) -> None:
        """Raise when ``key`` holds a value whose parameters ModelSpec cannot express."""
        if self.raw.get(key) == unsupported:
            raise self._error(key, f"= {unsupported!r} is not supported: {reason}")

    def require(self, key: str, expected: object, reason: str) -> None:
        """Raise when ``key`` is given (not null) with any value but ``expected``."""
        value = self.raw.get(key)
        if value is not None and value != expected:
            raise self._error(key, f"= {value!r} is not supported (only {expected!r}): {reason}")

    def _as_int(self, key: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._error(key, f"must be an integer, got {value!r}")
        limit = _INT_LIMITS.get(key, _DEFAULT_INT_LIMIT)
        if value > limit:
            said = "(the most this planner takes)"
            if limit == MAX_LAYERS.limit and key in ("num_hidden_layers", "n_layer"):
                said = f"(this service plans for that many; the largest published: {MAX_LAYERS.reference})"
            raise self._error(key, f"= {value:,} exceeds {limit:,} {said}", limit)
        return value


def _gated_kind(f: _Fields, key: str = "hidden_act", default: str = "silu") -> MlpKind:
    # Same three matrices either way; GeGLU when the gate's activation is a GELU.
    act = f.raw.get(key, default)
    return MlpKind.GEGLU if isinstance(act, str) and act.startswith("gelu") else MlpKind.SWIGLU


class _Attention(NamedTuple):
    """What each decoder layer attends to, as ModelSpec stores it."""

    layer_types: tuple[AttentionKind, ...] = ()
    sliding_window: int | None = None
    attention_chunk_size: int | None = None


def _attention(
    f: _Fields, kinds: Sequence[AttentionKind], *, window: int | None = None, chunk: int | None = None
) -> _Attention:
    # A sliding layer without a window attends to every earlier token (transformers then passes
    # sliding_window=None to the kernel); a model whose layers are all full stores ().
    resolved = tuple(FULL if kind is SLIDING and window is None else kind for kind in kinds)
    if window is not None and SLIDING in resolved and window < 1:
        raise f._error("sliding_window", f"must be >= 1, got {window}")
    if CHUNKED in resolved and (chunk is None or chunk < 1):
        raise f._error("attention_chunk_size", f"must be >= 1 for chunked_attention layers, got {chunk}")
    if all(kind is FULL for kind in resolved):
        return _Attention()
    return _Attention(
        resolved, window if SLIDING in resolved else None, chunk if CHUNKED in resolved else None
    )


def _every_layer_sliding(f: _Fields, num_layers: int, window: int | None) -> _Attention:
    # Mistral, Mixtral, Phi-3, Qwen3-MoE: one sliding_window for every layer, or none when null.
    return _attention(f, [SLIDING] * num_layers, window=window)


def _qwen_window(f: _Fields, num_layers: int) -> _Attention:
    # Qwen2Config/Qwen3Config: sliding_window only with use_sliding_window; then layers from
    # max_window_layers on are sliding (unless layer_types lists them).
    window = f.int_or_null("sliding_window", 4096) if f.bool_or("use_sliding_window", False) else None
    first = f.int_or("max_window_layers", 28)
    default = [SLIDING if window is not None and i >= first else FULL for i in range(num_layers)]
    return _attention(f, f.layer_types(default, (FULL, SLIDING)), window=window)


def _moe_if_used(
    moe: MoESpec | None, moe_layers: tuple[int, ...] | None, num_layers: int
) -> tuple[MoESpec | None, tuple[int, ...] | None]:
    """The MoE block and its layers, or (None, None) where the config puts it on no layer
    (first_k_dense_replace or mlp_only_layers covering every layer, decoder_sparse_step past the
    last): transformers builds every layer dense, and ModelSpec refuses an MoE block on none."""
    return (moe, moe_layers) if moe_layer_total(moe, moe_layers, num_layers) else (None, None)


def _moe_layers(indices: Iterable[int], num_layers: int) -> tuple[int, ...] | None:
    # None (every layer) when the MoE block is on all layers, else the sorted indices.
    chosen = tuple(sorted(set(indices)))
    return None if chosen == tuple(range(num_layers)) else chosen


def _dense_width(f: _Fields, key: str, default: int, *, needed: bool) -> int:
    # The dense MLP's width is required only when some layer has a dense MLP.
    return f.required_int(key) if needed else f.int_or(key, default)


def _final_softcap(f: _Fields, default: float | None, key: str = "final_logit_softcapping") -> bool:
    # Gemma 2 defaults to 30.0 (null turns it off), Gemma 3 to None; attn_logit_softcapping: 50.0, None
    if key in f.raw:
        f.float_or(key, 0.0)  # type check
        return f.raw[key] is not None
    return default is not None


def _llama_like(
    f: _Fields,
    name: str,
    *,
    kv_default: int | None,
    max_positions: int,
    tied: bool = False,
    qkv_bias: bool = False,
    out_bias: bool = False,
    mlp_bias: bool = False,
    head_dim_default: int | None = None,
    mlp: MlpKind | None = None,
    norms_per_layer: int = 2,
    rotary_fraction: float = 1.0,
    moe: MoESpec | None = None,
    moe_layers: tuple[int, ...] | None = None,
    ffn_hidden_size: int | None = None,
    attention: _Attention | None = None,
    qk_norm: QKNorm = QKNorm.NONE,
    attention_sinks: bool = False,
    final_logit_softcapping: bool = False,
    attn_logit_softcapping: bool = False,
    family: str | None = None,
) -> ModelSpec:
    """Pre-norm RMSNorm decoders with separate (or Phi-3-fused) q/k/v and a gated MLP."""
    heads = f.required_int("num_attention_heads")
    hidden = f.required_int("hidden_size")
    head_dim = f.optional_int("head_dim") or head_dim_default or 0
    attention = attention or _Attention()
    layers = f.required_int("num_hidden_layers")
    moe, moe_layers = _moe_if_used(moe, moe_layers, layers)
    return ModelSpec(
        name=name,
        family=family or f.model_type,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=f.kv_heads("num_key_value_heads", kv_default, heads),
        head_dim=head_dim,
        ffn_hidden_size=f.required_int("intermediate_size") if ffn_hidden_size is None else ffn_hidden_size,
        vocab_size=f.required_int("vocab_size"),
        max_position_embeddings=f.int_or("max_position_embeddings", max_positions),
        mlp=mlp or _gated_kind(f),
        norm=NormKind.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        tied_embeddings=f.bool_or("tie_word_embeddings", tied),
        qkv_bias=qkv_bias,
        attn_out_bias=out_bias,
        mlp_bias=mlp_bias,
        norms_per_layer=norms_per_layer,
        rotary_fraction=rotary_fraction,
        moe=moe,
        moe_layers=moe_layers,
        layer_types=attention.layer_types,
        sliding_window=attention.sliding_window,
        attention_chunk_size=attention.attention_chunk_size,
        qk_norm=qk_norm,
        attention_sinks=attention_sinks,
        final_logit_softcapping=final_logit_softcapping,
        attn_logit_softcapping=attn_logit_softcapping,
    )


def _llama(f: _Fields, name: str) -> ModelSpec:
    # LlamaConfig: attention_bias on q, k, v and o; mlp_bias on gate, up and down.
    bias = f.bool_or("attention_bias", False)
    return _llama_like(
        f,
        name,
        kv_default=None,
        max_positions=2048,
        qkv_bias=bias,
        out_bias=bias,
        mlp_bias=f.bool_or("mlp_bias", False),
    )


def _granite(f: _Fields, name: str) -> ModelSpec:
    # GraniteConfig: Llama's modules and defaults; embedding_multiplier, attention_multiplier,
    # residual_multiplier and logits_scaling are scalars without parameters (no count or FLOP changes),
    # which a framework building its own model must apply (``ModelSpec.scaled_constants``).
    spec = _llama(f, name)
    plain = {
        "embedding_multiplier": 1.0,
        "attention_multiplier": 1.0 / math.sqrt(spec.head_dim),  # GraniteAttention's scaling itself
        "residual_multiplier": 1.0,
        "logits_scaling": 1.0,
    }
    # GraniteConfig's defaults are 1.0 each, attention_multiplier too (not 1 / sqrt(head_dim))
    scaled = tuple(key for key, value in plain.items() if not math.isclose(f.float_or(key, 1.0), value))
    return dataclasses.replace(spec, scaled_constants=scaled)


def _mistral(f: _Fields, name: str) -> ModelSpec:
    # MistralAttention/MistralMLP: no biases at all; MistralConfig defaults to 8 kv heads and a
    # sliding_window of 4096 on every layer (NeMo and Small 3 set it to null: no window).
    window = f.int_or_null("sliding_window", 4096)
    attention = _every_layer_sliding(f, f.required_int("num_hidden_layers"), window)
    return _llama_like(f, name, kv_default=8, max_positions=4096 * 32, attention=attention)


def _mistral3(f: _Fields, name: str) -> ModelSpec:
    # Mistral3ForConditionalGeneration (Mistral Small 3.1/3.2): a Pixtral vision tower and a Mistral
    # text model in text_config; the text model is counted.
    return _mistral(f.nested("text_config", "mistral"), name)


def _qwen2(f: _Fields, name: str) -> ModelSpec:
    # Qwen2Attention: q, k, v with bias=True, o_proj without; Qwen2Config defaults to 32 kv heads.
    attention = _qwen_window(f, f.required_int("num_hidden_layers"))
    return _llama_like(f, name, kv_default=32, max_positions=32768, qkv_bias=True, attention=attention)


def _qwen3(f: _Fields, name: str) -> ModelSpec:
    # Qwen3Attention: attention_bias on q, k, v and o; q_norm and k_norm RMSNorm(head_dim) shared by
    # the heads; Qwen3Config: head_dim 128 (not hidden / heads), 32 kv heads.
    bias = f.bool_or("attention_bias", False)
    return _llama_like(
        f,
        name,
        kv_default=32,
        max_positions=32768,
        qkv_bias=bias,
        out_bias=bias,
        head_dim_default=128,
        qk_norm=QKNorm.PER_HEAD,
        attention=_qwen_window(f, f.required_int("num_hidden_layers")),
    )


def _qwen3_moe(f: _Fields, name: str) -> ModelSpec:
    # Qwen3MoeDecoderLayer: the MoE block (router h x E, E experts of moe_intermediate_size, no
    # shared expert) on layer i unless i is in mlp_only_layers, when num_experts > 0 and
    # (i + 1) % decoder_sparse_step == 0; a dense MLP of intermediate_size elsewhere. The attention
    # is Qwen3's, but head_dim is not a Qwen3MoeConfig field: the JSON key, else hidden / heads.
    # use_sliding_window puts the window on every layer (there is no max_window_layers).
    layers = f.required_int("num_hidden_layers")
    num_experts = f.int_or("num_experts", f.int_or("num_local_experts", 128))
    step = f.positive_int_or("decoder_sparse_step", 1)
    mlp_only = set(f.int_list("mlp_only_layers"))
    indices = [i for i in range(layers) if i not in mlp_only and (i + 1) % step == 0]
    moe = moe_layers = None
    if num_experts > 0:
        moe = MoESpec(
            num_experts=num_experts,
            top_k=f.int_or("num_experts_per_tok", 8),
            expert_ffn_hidden_size=f.int_or("moe_intermediate_size", 768),
        )
        moe_layers = _moe_layers(indices, layers)
    window = f.int_or_null("sliding_window", 4096) if f.bool_or("use_sliding_window", False) else None
    bias = f.bool_or("attention_bias", False)
    dense = moe is None or len(indices) < layers
    return _llama_like(
        f,
        name,
        kv_default=4,
        max_positions=32768,
        qkv_bias=bias,
        out_bias=bias,
        moe=moe,
        moe_layers=moe_layers,
        ffn_hidden_size=_dense_width(f, "intermediate_size", 6144, needed=dense),
        qk_norm=QKNorm.PER_HEAD,
        attention=_every_layer_sliding(f, layers, window),
    )


def _gemma(f: _Fields, name: str) -> ModelSpec:
    # GemmaConfig: head_dim 256, tied, 16 kv heads, GeGLU (gelu_pytorch_tanh), optional attention_bias.
    bias = f.bool_or("attention_bias", False)
    return _llama_like(
        f,
        name,
        kv_default=16,
        max_positions=8192,
        tied=True,
        qkv_bias=bias,
        out_bias=bias,
        head_dim_default=256,
        mlp=MlpKind.GEGLU,
    )


def _gemma2(f: _Fields, name: str) -> ModelSpec:
    # Gemma2DecoderLayer: input, post_attention, pre_feedforward and post_feedforward RMSNorms;
    # layer_types default: sliding (sliding_window 4096) and full alternating, layer 0 sliding;
    # final_logit_softcapping 30.0 and attn_logit_softcapping 50.0 (null: off); query_pre_attn_scalar
    # only rescales attention scores.
    f.reject("use_bidirectional_attention", True, "the estimator models causal decoders")
    layers = f.required_int("num_hidden_layers")
    kinds = f.layer_types([SLIDING if (i + 1) % 2 else FULL for i in range(layers)], (FULL, SLIDING))
    bias = f.bool_or("attention_bias", False)
    return _llama_like(
        f,
        name,
        kv_default=4,
        max_positions=8192,
        tied=True,
        qkv_bias=bias,
        out_bias=bias,
        head_dim_default=256,
        mlp=_gated_kind(f, "hidden_activation", "gelu_pytorch_tanh"),
        norms_per_layer=4,
        attention=_attention(f, kinds, window=f.int_or_null("sliding_window", 4096)),
        final_logit_softcapping=_final_softcap(f, 30.0),
        attn_logit_softcapping=_final_softcap(f, 50.0, "attn_logit_softcapping"),
    )


# Gemma3TextConfig's class defaults (transformers 5.24): google/gemma-3-4b-it's config.json leaves
# the heads, kv heads and vocabulary to them ("'text_config.num_attention_heads' is required" was the
# answer to the published config). The sliding window and head_dim defaults are read below.
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
}


def _gemma3_text(f: _Fields, name: str) -> ModelSpec:
    # Gemma3TextConfig: Gemma 2's layer plus q_norm and k_norm RMSNorm(head_dim); layer i sliding
    # unless (i + 1) % sliding_window_pattern == 0 (5 local : 1 global); no soft-capping by default.
    f = f.with_defaults(GEMMA3_TEXT_DEFAULTS)
    f.reject("use_bidirectional_attention", True, "the estimator models causal decoders")
    layers = f.required_int("num_hidden_layers")
    pattern = f.positive_int_or("sliding_window_pattern", 6)
    kinds = f.layer_types([SLIDING if (i + 1) % pattern else FULL for i in range(layers)], (FULL, SLIDING))
    bias = f.bool_or("attention_bias", False)
    return _llama_like(
        f,
        name,
        kv_default=4,
        max_positions=131072,
        tied=True,
        qkv_bias=bias,
        out_bias=bias,
        head_dim_default=256,
        mlp=_gated_kind(f, "hidden_activation", "gelu_pytorch_tanh"),
        norms_per_layer=4,
        attention=_attention(f, kinds, window=f.int_or_null("sliding_window", 4096)),
        qk_norm=QKNorm.PER_HEAD,
        final_logit_softcapping=_final_softcap(f, None),
        attn_logit_softcapping=_final_softcap(f, None, "attn_logit_softcapping"),
        family="gemma3",
    )


def _gemma3(f: _Fields, name: str) -> ModelSpec:
    # Gemma3ForConditionalGeneration: SigLIP tower + projector + Gemma3TextModel (text_config).
    return _gemma3_text(f.nested("text_config", "gemma3_text"), name)


def _llama4_text(f: _Fields, name: str) -> ModelSpec:
    # Llama4TextDecoderLayer: on the moe_layers (default every interleave_moe_layer_step-th) the MoE
    # block: router h x E (no bias), E experts and one shared expert, all of intermediate_size;
    # elsewhere a dense MLP of intermediate_size_mlp. RoPE layers (no_rope_layers[i] == 1, default
    # all but every no_rope_layer_interval-th) attend within attention_chunk_size chunks, NoPE layers
    # to everything; use_qk_norm: a weightless L2 norm on q and k (RoPE layers).
    layers = f.required_int("num_hidden_layers")
    step = f.positive_int_or("interleave_moe_layer_step", 1)
    if f.raw.get("moe_layers") is not None:
        indices = f.layer_indices("moe_layers", layers)
    else:
        indices = list(range(step - 1, layers, step))
    interval = f.positive_int_or("no_rope_layer_interval", 4)
    rope = f.int_list("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    if len(rope) != layers:
        raise f._error("no_rope_layers", f"must give all {layers} layers, got {len(rope)}")
    chunk = f.int_or_null("attention_chunk_size", 8192)
    default = [CHUNKED if uses_rope and chunk is not None else FULL for uses_rope in rope]
    kinds = f.layer_types(default, (FULL, CHUNKED))
    width = f.required_int("intermediate_size")
    moe = MoESpec(
        num_experts=f.int_or("num_local_experts", 16),
        top_k=f.int_or("num_experts_per_tok", 1),
        expert_ffn_hidden_size=width,
        num_shared_experts=1,
        shared_expert_ffn_hidden_size=width,
    )
    bias = f.bool_or("attention_bias", False)
    return _llama_like(
        f,
        name,
        kv_default=8,
        max_positions=4096 * 32,
        qkv_bias=bias,
        out_bias=bias,
        head_dim_default=128,
        moe=moe,
        moe_layers=_moe_layers(indices, layers),
        ffn_hidden_size=_dense_width(f, "intermediate_size_mlp", 16384, needed=len(set(indices)) < layers),
        attention=_attention(f, kinds, chunk=chunk),
        qk_norm=QKNorm.L2 if f.bool_or("use_qk_norm", True) else QKNorm.NONE,
        family="llama4",
    )


def _llama4(f: _Fields, name: str) -> ModelSpec:
    # Llama4ForConditionalGeneration: vision model + projector + Llama4ForCausalLM (text_config).
    return _llama4_text(f.nested("text_config", "llama4_text"), name)


def _gpt_oss(f: _Fields, name: str) -> ModelSpec:
    # GptOssDecoderLayer: attention with attention_bias (default true) on q, k, v, o and one learned
    # sink logit per head; every layer's MLP is the MoE block: router h x E with bias, E experts of
    # intermediate_size with biases on gate_up (2f) and down (h); layers alternate sliding
    # (sliding_window 128) and full. The clamped SwiGLU (swiglu_alpha, swiglu_limit) has SwiGLU's
    # matrices.
    layers = f.required_int("num_hidden_layers")
    kinds = f.layer_types([SLIDING if (i + 1) % 2 else FULL for i in range(layers)], (FULL, SLIDING))
    width = f.required_int("intermediate_size")
    moe = MoESpec(
        num_experts=f.int_or("num_local_experts", f.int_or("num_experts", 128)),
        top_k=f.int_or("num_experts_per_tok", 4),
        expert_ffn_hidden_size=width,
        router_bias=True,
        expert_bias=True,
    )
    bias = f.bool_or("attention_bias", True)
    return _llama_like(
        f,
        name,
        kv_default=8,
        max_positions=131072,
        qkv_bias=bias,
        out_bias=bias,
        head_dim_default=64,
        mlp=MlpKind.SWIGLU,
        moe=moe,
        ffn_hidden_size=width,
        attention=_attention(f, kinds, window=f.int_or_null("sliding_window", 128)),
        attention_sinks=True,
    )


def _olmo2(f: _Fields, name: str) -> ModelSpec:
    # Olmo2DecoderLayer: no input norm; post_attention and post_feedforward RMSNorms; q_norm over all
    # q heads (heads x head_dim) and k_norm over all k heads; attention_bias on q, k, v and o;
    # head_dim is not an Olmo2Config field: the JSON key, else hidden / heads.
    bias = f.bool_or("attention_bias", False)
    return _llama_like(
        f,
        name,
        kv_default=None,
        max_positions=2048,
        qkv_bias=bias,
        out_bias=bias,
        qk_norm=QKNorm.FULL_WIDTH,
    )


def _olmoe(f: _Fields, name: str) -> ModelSpec:
    # OlmoeDecoderLayer (transformers models/olmoe): pre-norm RMSNorms, input and post-attention (Llama's:
    # the weight multiplies the cast output, unlike OLMo 2's); q_norm over all q heads (hidden_size) and
    # k_norm over the kv heads' width, as OLMo 2's; attention_bias on q, k, v and o. OlmoeSparseMoeBlock on
    # every layer: router h x E (no bias) and E SwiGLU experts of intermediate_size (OlmoeMLP, no bias), no
    # shared expert; top-k of the fp32 softmax, cast to the model dtype, renormalised only with
    # norm_topk_prob (OlmoeConfig's default false), as Qwen's. clip_qkv clamps q, k and v in place of
    # nothing this estimate counts: refused where set (OLMoE-1B-7B leaves it null).
    if f.raw.get("clip_qkv") is not None:
        raise f._error("clip_qkv", f"= {f.raw['clip_qkv']!r}: clamping q, k and v is not modelled")
    moe = MoESpec(
        num_experts=f.int_or("num_experts", 64),
        top_k=f.int_or("num_experts_per_tok", 8),
        expert_ffn_hidden_size=f.int_or("intermediate_size", 2048),
    )
    bias = f.bool_or("attention_bias", False)
    return _llama_like(
        f,
        name,
        kv_default=None,
        max_positions=4096,
        qkv_bias=bias,
        out_bias=bias,
        moe=moe,
        ffn_hidden_size=f.int_or("intermediate_size", 2048),
        qk_norm=QKNorm.FULL_WIDTH,
    )


def _phi3(f: _Fields, name: str) -> ModelSpec:
    # Phi3: fused qkv_proj and gate_up_proj, no biases; same counts as separate projections.
    # sliding_window (default null) applies to every layer.
    window = f.int_or_null("sliding_window", None)
    return _llama_like(
        f,
        name,
        kv_default=None,
        max_positions=4096,
        rotary_fraction=f.rotary_fraction("partial_rotary_factor", default=1.0),
        attention=_every_layer_sliding(f, f.required_int("num_hidden_layers"), window),
    )


def _mixtral(f: _Fields, name: str) -> ModelSpec:
    # MixtralSparseMoeBlock: router h x E (no bias) and E SwiGLU experts of intermediate_size;
    # sliding_window (default null) on every layer.
    moe = MoESpec(
        num_experts=f.int_or("num_local_experts", f.int_or("num_experts", 8)),
        top_k=f.int_or("num_experts_per_tok", 2),
        expert_ffn_hidden_size=f.required_int("intermediate_size"),
    )
    window = f.int_or_null("sliding_window", None)
    attention = _every_layer_sliding(f, f.required_int("num_hidden_layers"), window)
    return _llama_like(f, name, kv_default=8, max_positions=4096 * 32, moe=moe, attention=attention)


def _qwen2_moe(f: _Fields, name: str) -> ModelSpec:
    # Qwen2MoeSparseMoeBlock: router, E experts of moe_intermediate_size, one shared expert of
    # shared_expert_intermediate_size and its h -> 1 sigmoid gate; MoE on layer i unless i is in
    # mlp_only_layers, when (i + 1) % decoder_sparse_step == 0; dense MLP of intermediate_size
    # elsewhere. With use_sliding_window, even layers below max_window_layers are sliding.
    layers = f.required_int("num_hidden_layers")
    num_experts = f.int_or("num_experts", 60)
    step = f.positive_int_or("decoder_sparse_step", 1)
    mlp_only = set(f.int_list("mlp_only_layers"))
    moe = moe_layers = None
    if num_experts > 0:
        moe = MoESpec(
            num_experts=num_experts,
            top_k=f.int_or("num_experts_per_tok", 4),
            expert_ffn_hidden_size=f.int_or("moe_intermediate_size", 1408),
            num_shared_experts=1,
            shared_expert_ffn_hidden_size=f.int_or("shared_expert_intermediate_size", 5632),
            shared_expert_gate=True,
            # mlp_only_layers lists the MoE layers below, which the frequency then does not choose
            layer_frequency=1 if mlp_only else step,
        )
        if mlp_only:
            indices = [i for i in range(layers) if i not in mlp_only and (i + 1) % step == 0]
            moe_layers = _moe_layers(indices, layers)
    use_window = f.bool_or("use_sliding_window", False)
    window = f.int_or_null("sliding_window", 4096) if use_window else None
    first = f.int_or("max_window_layers", 28)
    default = [SLIDING if (i + 1) % 2 and i < first and use_window else FULL for i in range(layers)]
    attention = _attention(f, f.layer_types(default, (FULL, SLIDING)), window=window)
    return _llama_like(
        f,
        name,
        kv_default=16,
        max_positions=32768,
        qkv_bias=f.bool_or("qkv_bias", True),
        moe=moe,
        moe_layers=moe_layers,
        attention=attention,
    )


def _deepseek(f: _Fields, name: str, *, v3: bool) -> ModelSpec:
    # DeepseekV2/V3Attention (MLA): q_a_proj, q_a_layernorm, q_b_proj (or a plain q_proj when
    # q_lora_rank is null), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; attention_bias on
    # q_a_proj, kv_a_proj_with_mqa and o_proj. Layers from first_k_dense_replace on carry the MoE
    # block: router h x E (no bias), E experts of moe_intermediate_size and ONE shared MLP of
    # n_shared_experts x moe_intermediate_size; earlier layers a dense MLP of intermediate_size.
    # V2's mlp_bias biases the dense and shared MLPs, not the routed experts. The multi-token
    # prediction layers (V3 num_nextn_predict_layers) are not part of DeepseekV3ForCausalLM.
    f.require(
        "moe_layer_freq", 1, "transformers puts the MoE block on every layer from first_k_dense_replace on"
    )
    layers = f.required_int("num_hidden_layers")
    heads = f.required_int("num_attention_heads")
    kv_heads = f.kv_heads("num_key_value_heads", 128 if v3 else None, heads)
    if kv_heads != heads:
        raise f._error(
            "num_key_value_heads",
            f"= {kv_heads} must equal num_attention_heads ({heads}): multi-head latent attention "
            "decompresses a key and a value for every head",
        )
    mla = MLASpec(
        q_lora_rank=f.int_or_null("q_lora_rank", 1536),
        kv_lora_rank=f.int_or("kv_lora_rank", 512),
        qk_nope_head_dim=f.int_or("qk_nope_head_dim", 128),
        qk_rope_head_dim=f.int_or("qk_rope_head_dim", 64),
        v_head_dim=f.int_or("v_head_dim", 128),
    )
    alias = "num_local_experts" if v3 else "num_experts"
    num_experts = f.int_or("n_routed_experts", f.int_or(alias, 256 if v3 else 64))
    top_k = f.int_or("num_experts_per_tok", 8) if v3 else f.required_int("num_experts_per_tok")
    expert_width = f.int_or("moe_intermediate_size", 2048 if v3 else 1407)
    # an explicit null builds none: DeepSeek's modeling_deepseek.py (V2 and V3) and vLLM's deepseek_v2.py
    # build shared_experts only `if config.n_shared_experts is not None` (MoE review: null was counted as 2)
    stated = f.int_or_null("n_shared_experts", 1 if v3 else 2)
    shared = 0 if stated is None else stated
    mlp_bias = False if v3 else f.bool_or("mlp_bias", False)
    if shared < 0 or (stated == 0 and mlp_bias):
        # with mlp_bias, a zero-width shared MLP still has a down_proj bias of hidden_size
        raise f._error("n_shared_experts", f"= {shared} is not supported (mlp_bias {mlp_bias})")
    moe = MoESpec(
        num_experts=num_experts,
        top_k=top_k,
        expert_ffn_hidden_size=expert_width,
        num_shared_experts=1 if shared else 0,
        shared_expert_ffn_hidden_size=shared * expert_width,
    )
    first_dense = f.int_or("first_k_dense_replace", 3 if v3 else 0)
    used, moe_layers = _moe_if_used(moe, _moe_layers(range(max(first_dense, 0), layers), layers), layers)
    return ModelSpec(
        name=name,
        family=f.model_type,
        num_layers=layers,
        hidden_size=f.required_int("hidden_size"),
        num_attention_heads=heads,
        num_kv_heads=heads,
        head_dim=mla.qk_head_dim,
        ffn_hidden_size=_dense_width(f, "intermediate_size", 18432 if v3 else 11008, needed=first_dense > 0),
        vocab_size=f.required_int("vocab_size"),
        max_position_embeddings=f.int_or("max_position_embeddings", 4096 if v3 else 2048),
        mlp=_gated_kind(f),
        norm=NormKind.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        tied_embeddings=f.bool_or("tie_word_embeddings", False),
        mlp_bias=mlp_bias,
        moe=used,
        moe_layers=moe_layers,
        mla=mla,
        mla_bias=f.bool_or("attention_bias", False),
    )


def _deepseek_v2(f: _Fields, name: str) -> ModelSpec:
    return _deepseek(f, name, v3=False)


def _deepseek_v3(f: _Fields, name: str) -> ModelSpec:
    return _deepseek(f, name, v3=True)


def _phi(f: _Fields, name: str) -> ModelSpec:
    # PhiDecoderLayer: one LayerNorm feeding attention and MLP in parallel; q, k, v, dense, fc1,
    # fc2 all with bias; lm_head with bias; partial rotary 0.5 default.
    f.reject("qk_layernorm", True, "ModelSpec has no per-head q/k LayerNorm")
    heads = f.required_int("num_attention_heads")
    return ModelSpec(
        name=name,
        family=f.model_type,
        num_layers=f.required_int("num_hidden_layers"),
        hidden_size=f.required_int("hidden_size"),
        num_attention_heads=heads,
        num_kv_heads=f.kv_heads("num_key_value_heads", None, heads),
        head_dim=f.optional_int("head_dim") or 0,
        ffn_hidden_size=f.required_int("intermediate_size"),
        vocab_size=f.required_int("vocab_size"),
        max_position_embeddings=f.int_or("max_position_embeddings", 2048),
        mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM,
        tied_embeddings=f.bool_or("tie_word_embeddings", False),
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
        norms_per_layer=1,
        parallel_attn_mlp=True,
        rotary_fraction=f.rotary_fraction("partial_rotary_factor", default=0.5),
        lm_head_bias=True,
    )


def _gpt2(f: _Fields, name: str) -> ModelSpec:
    # GPT2Block: ln_1, fused c_attn (3h) and c_proj with biases, ln_2, c_fc/c_proj MLP of n_inner
    # (default 4h) with biases; learned wpe of n_positions; lm_head tied to wte.
    f.reject("add_cross_attention", True, "cross-attention is not part of a decoder-only model")
    hidden = f.required_int("n_embd", "hidden_size")
    heads = f.required_int("n_head", "num_attention_heads")
    return ModelSpec(
        name=name,
        family=f.model_type,
        num_layers=f.required_int("n_layer", "num_hidden_layers"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=f.optional_int("n_inner") or 4 * hidden,
        vocab_size=f.required_int("vocab_size"),
        max_position_embeddings=f.int_or("n_positions", f.int_or("max_position_embeddings", 1024)),
        mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM,
        position_embedding=PositionEmbedding.LEARNED,
        tied_embeddings=f.bool_or("tie_word_embeddings", True),
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
    )


def _gpt_neox(f: _Fields, name: str) -> ModelSpec:
    # GPTNeoXLayer: two LayerNorms (used in parallel when use_parallel_residual), fused
    # query_key_value and dense with attention_bias (default True), MLP with biases, untied embed_out.
    heads = f.required_int("num_attention_heads")
    bias = f.bool_or("attention_bias", True)
    return ModelSpec(
        name=name,
        family=f.model_type,
        num_layers=f.required_int("num_hidden_layers"),
        hidden_size=f.required_int("hidden_size"),
        num_attention_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=f.required_int("intermediate_size"),
        vocab_size=f.required_int("vocab_size"),
        max_position_embeddings=f.int_or("max_position_embeddings", 2048),
        mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM,
        tied_embeddings=f.bool_or("tie_word_embeddings", False),
        qkv_bias=bias,
        attn_out_bias=bias,
        mlp_bias=True,
        parallel_attn_mlp=f.bool_or("use_parallel_residual", True),
        rotary_fraction=f.rotary_fraction("rotary_pct", "partial_rotary_factor", default=0.25),
    )


def _falcon(f: _Fields, name: str) -> ModelSpec:
    # FalconAttention: fused query_key_value of (2 kv + heads) x head_dim for the new decoder
    # architecture (40B/180B), h + 2 head_dim for multi-query (7B), else 3h; `bias` on every Linear.
    # FalconDecoderLayer: two LayerNorms unless parallel_attn with one (7B's shared input norm).
    heads = f.required_int("num_attention_heads")
    hidden = f.required_int("n_embed", "hidden_size")
    new_arch = f.bool_or("new_decoder_architecture", False)
    multi_query = f.bool_or("multi_query", True)
    parallel = f.bool_or("parallel_attn", True)
    kv_heads = 1 if multi_query else heads
    if new_arch:
        kv_heads = f.kv_heads("num_kv_heads", None, heads)
    num_ln = f.optional_int("num_ln_in_parallel_attn") or (2 if new_arch else None)
    norms = 2 if not parallel or num_ln == 2 else 1
    bias = f.bool_or("bias", False)
    alibi = f.bool_or("alibi", False)
    return ModelSpec(
        name=name,
        family=f.model_type,
        num_layers=f.required_int("num_hidden_layers"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        ffn_hidden_size=f.optional_int("ffn_hidden_size") or 4 * hidden,
        vocab_size=f.required_int("vocab_size"),
        max_position_embeddings=f.int_or("max_position_embeddings", 2048),
        mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM,
        position_embedding=PositionEmbedding.ALIBI if alibi else PositionEmbedding.ROPE,
        tied_embeddings=f.bool_or("tie_word_embeddings", True),
        qkv_bias=bias,
        attn_out_bias=bias,
        mlp_bias=bias,
        norms_per_layer=norms,
        parallel_attn_mlp=parallel,
    )


def _bloom(f: _Fields, name: str) -> ModelSpec:
    # BloomModel: word_embeddings + word_embeddings_layernorm; BloomBlock: two LayerNorms, fused
    # query_key_value and dense with biases, 4h MLP with biases; ALiBi; lm_head tied.
    heads = f.required_int("n_head", "num_attention_heads")
    hidden = f.required_int("n_embed", "hidden_size")
    return ModelSpec(
        name=name,
        family=f.model_type,
        num_layers=f.required_int("n_layer", "num_hidden_layers"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=4 * hidden,
        vocab_size=f.required_int("vocab_size"),
        max_position_embeddings=f.int_or("seq_length", 2048),
        mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM,
        position_embedding=PositionEmbedding.ALIBI,
        tied_embeddings=f.bool_or("tie_word_embeddings", True),
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
        embedding_norm=True,
    )


# The task heads transformers' BERT and RoBERTa classes put on the encoder, by class name suffix
# (``architectures`` in config.json); a config without it is counted as its checkpoint's own
# (bert-base-uncased, roberta-large: *ForMaskedLM).
_ENCODER_HEADS = {
    "ForMaskedLM": Head.MASKED_LM,
    "ForSequenceClassification": Head.SEQUENCE_CLASSIFICATION,
    "ForQuestionAnswering": Head.QUESTION_ANSWERING,
    "ForTokenClassification": Head.TOKEN_CLASSIFICATION,
}


def _encoder_head(f: _Fields, prefix: str) -> Head:
    architectures = f.raw.get("architectures")
    if architectures is None:
        return Head.MASKED_LM
    known = [prefix + suffix for suffix in _ENCODER_HEADS]
    if (
        not isinstance(architectures, list)
        or len(architectures) != 1
        or not isinstance(architectures[0], str)
        or architectures[0] not in known
    ):
        raise f._error(
            "architectures",
            f"= {architectures!r} is not supported: give one of {known} (the head that is trained)",
        )
    return _ENCODER_HEADS[architectures[0].removeprefix(prefix)]


def _num_labels(f: _Fields, head: Head) -> int:
    # PretrainedConfig: num_labels, else len(id2label), else 2; the MLM head has no labels
    labels = f.raw.get("num_labels")
    id2label = f.raw.get("id2label")
    if labels is None and isinstance(id2label, Mapping) and id2label:
        labels = len(id2label)
    if labels is None or head is Head.MASKED_LM:
        return 2
    value = f._as_int("num_labels", labels)
    if value < 1:
        raise f._error("num_labels", f"must be >= 1, got {value}")
    return value


def _encoder(f: _Fields, name: str, *, prefix: str) -> ModelSpec:
    # BertModel / RobertaModel (transformers modeling_bert.py, modeling_roberta.py): word, learned
    # absolute position and token-type embeddings, their LayerNorm; BertLayer: q/k/v and output
    # dense with biases, post-residual LayerNorm, intermediate (GELU) and output dense with biases,
    # post-residual LayerNorm; no final norm. The head per ``architectures`` (types.Head).
    f.reject("is_decoder", True, "a causal BERT (BertLMHeadModel) is not an encoder this planner models")
    f.reject("add_cross_attention", True, "cross-attention is not part of an encoder-only model")
    f.require("position_embedding_type", "absolute", "relative position types add distance embeddings")
    heads = f.required_int("num_attention_heads")
    head = _encoder_head(f, prefix)
    return ModelSpec(
        name=name,
        family=f.model_type,
        num_layers=f.required_int("num_hidden_layers"),
        hidden_size=f.required_int("hidden_size"),
        num_attention_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=f.required_int("intermediate_size"),
        vocab_size=f.required_int("vocab_size"),
        max_position_embeddings=f.positive_int_or("max_position_embeddings", 512),
        mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM,
        position_embedding=PositionEmbedding.LEARNED,
        tied_embeddings=f.bool_or("tie_word_embeddings", True),
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
        embedding_norm=True,
        bidirectional=True,
        type_vocab_size=f.int_or("type_vocab_size", 2),
        post_norm=True,
        head=head,
        num_labels=_num_labels(f, head),
    )


def _bert(f: _Fields, name: str) -> ModelSpec:
    return _encoder(f, name, prefix="Bert")


def _roberta(f: _Fields, name: str) -> ModelSpec:
    # RobertaConfig has BertConfig's defaults; RoBERTa's checkpoints set max_position_embeddings 514
    # (positions start after the padding index) and type_vocab_size 1
    return _encoder(f, name, prefix="Roberta")


def _xlm_roberta(f: _Fields, name: str) -> ModelSpec:
    # modeling_xlm_roberta.py: RoBERTa's classes renamed (XLMRobertaConfig has its defaults), with a
    # 250,002-token vocabulary in xlm-roberta-base/large (a review: the model type was refused)
    return _encoder(f, name, prefix="XLMRoberta")


def _camembert(f: _Fields, name: str) -> ModelSpec:
    # modeling_camembert.py: RoBERTa's classes renamed, as XLM-RoBERTa's
    return _encoder(f, name, prefix="Camembert")


_BUILDERS: dict[str, Callable[[_Fields, str], ModelSpec]] = {
    "llama": _llama,
    "granite": _granite,
    "mistral": _mistral,
    "mistral3": _mistral3,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "gemma": _gemma,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3_text,
    "gemma3": _gemma3,
    "llama4_text": _llama4_text,
    "llama4": _llama4,
    "olmo2": _olmo2,
    "olmoe": _olmoe,
    "phi3": _phi3,
    "phi": _phi,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "falcon": _falcon,
    "bloom": _bloom,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v2": _deepseek_v2,
    "deepseek_v3": _deepseek_v3,
    "gpt_oss": _gpt_oss,
    "bert": _bert,
    "roberta": _roberta,
    "xlm-roberta": _xlm_roberta,
    "camembert": _camembert,
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_BUILDERS))


MAX_NAME_CHARS = 200  # a model's name, as plans store it


def _architecture_hint(config: Mapping[str, object]) -> str:
    """Where an unsupported model_type's ``architectures`` names a supported family's class (Kimi K2's
    model_type kimi_k2 is a DeepseekV3ForCausalLM, loaded with trust_remote_code), what it would be read
    as: the refusal says so (2025-26 configs review), without reading it so unasked."""
    classes = config.get("architectures")
    if not isinstance(classes, list) or not classes or not isinstance(classes[0], str):
        return ""
    stem = classes[0].lower().removesuffix("forcausallm")
    found = next((t for t in SUPPORTED_MODEL_TYPES if t.replace("_", "").replace("-", "") == stem), None)
    if found is None:
        return ""
    # a wrapper's text-only class (Gemma3ForCausalLM, Llama4ForCausalLM) is its text model's config, not
    # the wrapper's with a text_config (the hint named gemma3, which then asked for one; change review)
    found = _TEXT_CONFIGS.get(found, found)
    return (
        f"; its architectures names {classes[0]}, a {found!r} model: sent with model_type {found!r} it is "
        "read as one (the launch files then load it as that family, not with its remote code)"
    )


def model_from_hf_config(config: Mapping[str, object], *, name: str | None = None) -> ModelSpec:
    """The ModelSpec of a Hugging Face ``config.json`` (already parsed into a mapping)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise InvalidModel(
            "hf_config needs a 'model_type' string", rule="hf_config", field="hf_config.model_type"
        )
    builder = _BUILDERS.get(model_type)
    if builder is None:
        raise InvalidModel(
            f"hf_config model_type {model_type!r} is not supported; supported: {list(SUPPORTED_MODEL_TYPES)}"
            + _architecture_hint(config),
            rule="hf_config_model_type",
            field="hf_config.model_type",
        )
    default_name = config.get("_name_or_path")
    if name is None and isinstance(default_name, str) and len(default_name) > MAX_NAME_CHARS:
        raise InvalidModel(
            f"hf_config _name_or_path is {len(default_name)} characters, over the {MAX_NAME_CHARS} a model "
            "name may have; give a shorter one (or the request's model.name)",
            rule="max_length",
            field="hf_config._name_or_path",
        )
    resolved = name or (default_name if isinstance(default_name, str) and default_name else model_type)
    if model_type not in _ENCODER_FAMILIES:
        _check_decoder_head(config)
    spec = builder(_Fields(config, model_type), resolved)
    hidden, attention = _dropout(config, model_type)
    bnb_4bit, stored = _checkpoint_quantization(config, model_type)
    constant_bits = _nf4_constant_bits(config, model_type) if bnb_4bit else None
    compute = _nf4_compute_precision(config) if bnb_4bit else None
    quantized = (_dequantized_note(stored),) if stored is not None else ()
    notes = (*quantized, *((_MULTIMODAL_NOTE,) if model_type in _TEXT_CONFIGS else ()), *_mtp_note(config))
    return dataclasses.replace(
        spec,
        hidden_dropout=hidden,
        attention_dropout=attention,
        config_notes=notes,
        bnb_4bit_checkpoint=bnb_4bit,
        bnb_4bit_constant_bits=constant_bits,
        bnb_4bit_compute_precision=compute,
        # a wrapper's tower is built whatever its config states (Gemma3Config fills in a default
        # SiglipVisionConfig where vision_config is None; the presets keep the text_config alone)
        vision_tower=model_type in _TEXT_CONFIGS,
        bnb_4bit_float_storage=not bnb_4bit or _nf4_float_storage(config),
        dequantized_checkpoint=stored,
        **_hyperparameters(_text_fields(config, model_type), spec)._asdict(),
    )


def _mtp_note(config: Mapping[str, object]) -> tuple[str, ...]:
    """What a config's multi-token prediction depth (DeepSeek-V3's num_nextn_predict_layers) leaves to
    the training: transformers builds no such layer (the count leaves them out), so they train only where
    training.mtp_num_layers asks Megatron for them (the config stating 1 was read without a word;
    2025-26 configs review)."""
    depth = config.get("num_nextn_predict_layers")
    if not isinstance(depth, int) or isinstance(depth, bool) or depth <= 0:
        return ()
    return (
        f"num_nextn_predict_layers {depth}: the checkpoint's multi-token prediction depth, which "
        "transformers does not build (not counted); trained only where training.mtp_num_layers asks for "
        f"it (megatron: mtp_num_layers {depth}, DeepSeek-V3's pretraining)",
    )


_MULTIMODAL_NOTE = (
    "multimodal config: the language model (text_config) is counted and planned; the vision tower and "
    "projector (vision_config) are not (a text-only fine-tune: the launch files freeze them and keep the "
    "adapters off them; their frozen weights are not counted, and one that trains the tower adds its "
    "parameters and activations)"
)
# How transformers loads a checkpoint stored quantized with its weights dequantized for training
# (``ModelSpec.dequantized_checkpoint``): Mxfp4Config and FineGrainedFP8Config take dequantize=True
# (transformers 5 utils/quantization_config.py; the documented fine-tuning path for GPT-OSS's and
# DeepSeek-V3's official checkpoints), compressed-tensors decompresses with run_compressed=False
# (whatever its scheme, int4 or fp8); FBGEMM's fp8 layers neither train nor dequantize
# (quantizer_fbgemm_fp8.py: is_trainable False), so such a checkpoint is converted to 16-bit weights
# first (None). Megatron's and torchtitan's conversions read the 16-bit weights.
DEQUANTIZING_CONFIGS: dict[str, str | None] = {
    "mxfp4": "Mxfp4Config(dequantize=True)",
    "fp8": "FineGrainedFP8Config(dequantize=True)",
    "compressed-tensors": "CompressedTensorsConfig(run_compressed=False)",
    "fbgemm_fp8": None,
}


def _dequantized_note(method: str) -> str:
    loader = DEQUANTIZING_CONFIGS[method]
    how = f"from_pretrained with {loader}" if loader else "a conversion to 16-bit weights before training"
    return (
        f"quantization_config {method}: the checkpoint's weights are planned dequantized to the training "
        f"precision, as training loads them ({how}), not in their stored format; the launch files say how"
    )


# What a stored 4-bit checkpoint's quantization_config may keep in 16 bits beside what the estimate keeps
# there anyway (the output layer; a multimodal wrapper's vision tower and projector, not planned)
_SKIPPED_AS_ESTIMATED = frozenset(
    {"lm_head", "output", "embed_out", "vision_tower", "vision_model", "visual", "multi_modal_projector"}
)


def _nf4_constant_bits(config: Mapping[str, object], model_type: str) -> float | None:
    """A stored bitsandbytes 4-bit checkpoint's quantization constants per weight, from the saved
    quantization_config that from_pretrained loads it with (transformers' quantizers/auto.py
    merge_quantization_configs: "The `quantization_config` from the model will be used"; the launch
    files' bnb_config.json is not applied to it): double-quantized or not (BitsAndBytesConfig's
    default: not). What the estimate does not model is refused naming the key: modules kept in 16 bits
    (llm_int8_skip_modules) past the output layer, and fp32 compute (bnb_4bit_compute_dtype), which
    every estimate left unread (a quantized-checkpoints review: the MLPs skipped were 26 GiB per GPU
    counted as NF4)."""
    raw = config.get("quantization_config")
    assert isinstance(raw, Mapping)  # _checkpoint_quantization checked it
    f = _Fields(config, model_type)
    skipped = raw.get("llm_int8_skip_modules") or []
    if not isinstance(skipped, list) or not all(isinstance(name, str) for name in skipped):
        raise f._error("quantization_config.llm_int8_skip_modules", "must be a list of module names")
    unread = sorted(name for name in skipped if name.rsplit(".", 1)[-1] not in _SKIPPED_AS_ESTIMATED)
    if unread:
        raise f._error(
            "quantization_config.llm_int8_skip_modules",
            f"keeps {unread} in 16 bits: a 4-bit base with other modules unquantized than the output layer "
            "is not modelled",
        )
    compute = raw.get("bnb_4bit_compute_dtype")
    if isinstance(compute, str) and compute.removeprefix("torch.") in ("float32", "float"):
        raise f._error(
            "quantization_config.bnb_4bit_compute_dtype",
            f"= {compute!r}: dequantizing to fp32 and fp32 matmuls are not modelled (the estimate computes "
            "in the training's 16-bit precision)",
        )
    # double-quantized: as QLoRA's launch files quantize at load (the tuning's qlora_bits_per_param)
    return None if raw.get("bnb_4bit_use_double_quant", False) is True else NF4_SINGLE_CONSTANT_BITS


# bnb_4bit_compute_dtype as saved (a torch dtype's name, "torch." or not) -> the precision it computes in
_NF4_COMPUTE = {"bfloat16": Precision.BF16, "float16": Precision.FP16, "half": Precision.FP16}


def _nf4_compute_precision(config: Mapping[str, object]) -> Precision | None:
    """The precision a stored 4-bit checkpoint's Linear4bit layers compute in (its saved
    bnb_4bit_compute_dtype: Linear4bit.forward casts its input to it), None where not stated (fp32 is
    refused by ``_nf4_constant_bits``)."""
    raw = config.get("quantization_config")
    compute = raw.get("bnb_4bit_compute_dtype") if isinstance(raw, Mapping) else None
    return _NF4_COMPUTE.get(compute.removeprefix("torch.")) if isinstance(compute, str) else None


def _nf4_float_storage(config: Mapping[str, object]) -> bool:
    """Whether a stored 4-bit checkpoint packs its weights in a float dtype (bnb_4bit_quant_storage; absent:
    BitsAndBytesConfig's default uint8), as from_pretrained keeps them (Params4bit.from_prequantized)."""
    raw = config.get("quantization_config")
    storage = raw.get("bnb_4bit_quant_storage", "uint8") if isinstance(raw, Mapping) else "uint8"
    return isinstance(storage, str) and storage.removeprefix("torch.") in ("bfloat16", "float16", "float32")


def _checkpoint_quantization(config: Mapping[str, object], model_type: str) -> tuple[bool, str | None]:
    """(whether the checkpoint's Linears are bitsandbytes 4-bit, the format of a checkpoint training
    loads dequantized) from ``quantization_config``: a 4-bit bitsandbytes base loads as QLoRA's NF4
    (only QLoRA trains it: TrainingSpec's check in the contract), an 8-bit one or another format
    (GPTQ, AWQ, ...), whose base the estimate does not model, is refused naming the key (config
    review: a NF4 Llama 3 checkpoint was planned as a 16-bit LoRA base, and as full training, which
    the Trainer refuses)."""
    raw = config.get("quantization_config")
    if raw is None:
        return False, None
    f = _Fields(config, model_type)
    if not isinstance(raw, Mapping):
        raise f._error("quantization_config", "must be an object")
    method = raw.get("quant_method")
    if method == "bitsandbytes" or (method is None and ("load_in_4bit" in raw or "load_in_8bit" in raw)):
        if raw.get("load_in_4bit") is True and raw.get("load_in_8bit") is not True:
            return True, None
        if raw.get("load_in_8bit") is not True:
            # neither set: no bitsandbytes format to read it in (it was refused as an 8-bit base it does
            # not state: a quantized-checkpoints review)
            raise f._error(
                "quantization_config.load_in_4bit",
                "is not true, nor is load_in_8bit: the config states no bitsandbytes format; give it "
                "without quantization_config to plan the 16-bit model, or with load_in_4bit true for QLoRA",
            )
        raise f._error(
            "quantization_config.load_in_8bit",
            "(a bitsandbytes 8-bit checkpoint): its LLM.int8 base is not modelled; give the config "
            "without quantization_config to plan the 16-bit model",
        )
    if isinstance(method, str) and method in DEQUANTIZING_CONFIGS:
        return False, method
    raise f._error(
        "quantization_config.quant_method",
        f"= {method!r}: a base stored so (GPTQ, AWQ, ...) is not modelled; give the config without "
        "quantization_config to plan the 16-bit model, or a bitsandbytes 4-bit one for QLoRA",
    )


# A decoder's ``architectures`` the estimate models: the language-model head on every token (the
# *ForCausalLM classes, GPT-2's LMHeadModel; a multimodal checkpoint's *ForConditionalGeneration,
# whose language model is what is trained here). Another head (*ForSequenceClassification: a
# hidden -> num_labels score on the last token; *ForTokenClassification, *ForQuestionAnswering) has
# no vocabulary logits, which the estimate would count: refused, naming it (small-model review, stop
# 41: Qwen2ForSequenceClassification on an L4 "did not fit" by 11 GB of logits it never makes).
_DECODER_HEADS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def _check_decoder_head(config: Mapping[str, object]) -> None:
    architectures = config.get("architectures")
    if architectures is None:
        return  # the checkpoint's own: a causal LM
    if isinstance(architectures, list) and all(
        isinstance(a, str) and a.endswith(_DECODER_HEADS) for a in architectures
    ):
        return
    raise InvalidModel(
        f"hf_config architectures = {architectures!r}: only a decoder's language-model head is modelled "
        f"(a class ending in {', '.join(_DECODER_HEADS)}); another head's outputs (a classifier's "
        "num_labels scores) are not its vocabulary logits",
        rule="hf_config",
        field="hf_config.architectures",
    )


# GPT-2's config class defaults its dropouts to 0.1 (resid_pdrop, embd_pdrop, attn_pdrop), as do
# BertConfig and RobertaConfig (hidden_dropout_prob, attention_probs_dropout_prob); every other
# family's to 0.
_DROPOUT_DEFAULTS = {"gpt2": 0.1, "bert": 0.1, **dict.fromkeys(ROBERTA_FAMILIES, 0.1)}
# BERT-style configs name them hidden_dropout_prob (embeddings and both residual branches) and
# attention_probs_dropout_prob (the attention probabilities)
_ENCODER_FAMILIES = frozenset({"bert", *ROBERTA_FAMILIES})


def _dropout(config: Mapping[str, object], model_type: str) -> tuple[float, float]:
    """(hidden, attention) dropout the model trains with: the embedding and residual dropouts
    (resid_pdrop, embd_pdrop, hidden_dropout) and the attention probabilities' (attn_pdrop,
    attention_dropout), from the text model's config for the multimodal wrappers."""
    text = config.get("text_config")
    f = _Fields(text if isinstance(text, Mapping) else config, model_type)
    default = _DROPOUT_DEFAULTS.get(model_type, 0.0)
    # an absent key takes the config class's default; GPT-2's class has only the *_pdrop keys
    if model_type in _ENCODER_FAMILIES:
        hidden_keys: tuple[str, ...] = ("hidden_dropout_prob",)
        attention_keys: tuple[str, ...] = ("attention_probs_dropout_prob",)
    elif model_type == "gpt2":
        hidden_keys, attention_keys = ("resid_pdrop", "embd_pdrop"), ("attn_pdrop",)
    else:
        hidden_keys = ("resid_pdrop", "embd_pdrop", "hidden_dropout")
        attention_keys = ("attn_pdrop", "attention_dropout")
    hidden = max(f.float_or(key, default) for key in hidden_keys)
    attention = max(f.float_or(key, default) for key in attention_keys)
    for key, value in (("hidden_dropout", hidden), ("attention_dropout", attention)):
        if not 0.0 <= value < 1.0:
            raise f._error(key, f"= {value} is not a dropout probability in [0, 1)")
    return hidden, attention


# ---------------------------------------------------------------- hyperparameters without parameters
# RoPE base and scaling, norm epsilon and MoE routing: no parameter, memory or time figure reads them;
# the launchers do, so that a launch file trains the checkpoint's model (ModelSpec.rope_theta, ...).


class _Hparams(NamedTuple):
    """A family's spelling of its norm epsilon and RoPE base, and its configuration class's defaults
    (transformers v4.56.2 models/<family>/configuration_<family>.py, the __init__ defaults)."""

    eps_key: str
    eps: float
    theta_keys: tuple[str, ...] = ("rope_theta",)  # aliases, first present wins; () without RoPE
    theta: float = 10000.0
    local_theta: float | None = None  # Gemma 3: rope_local_base_freq's default
    rope_scaling: Mapping[str, object] | None = None  # the class's default rope_scaling


_RMS, _LN_EPS, _LN_EPSILON = "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"
_HPARAMS: dict[str, _Hparams] = {
    "llama": _Hparams(_RMS, 1e-6),  # LlamaConfig rms_norm_eps=1e-6, rope_theta=10000.0
    "granite": _Hparams(_RMS, 1e-6),
    "mistral": _Hparams(_RMS, 1e-6),  # also mistral3's text_config (a MistralConfig)
    "qwen2": _Hparams(_RMS, 1e-6),
    "qwen3": _Hparams(_RMS, 1e-6),
    "qwen2_moe": _Hparams(_RMS, 1e-6),
    "qwen3_moe": _Hparams(_RMS, 1e-6),
    "gemma": _Hparams(_RMS, 1e-6),
    "gemma2": _Hparams(_RMS, 1e-6),
    # Gemma3TextConfig: rope_theta=1_000_000.0 (global layers), rope_local_base_freq=10_000.0
    "gemma3_text": _Hparams(_RMS, 1e-6, theta=1e6, local_theta=1e4),
    "llama4_text": _Hparams(_RMS, 1e-5, theta=500000.0),  # Llama4TextConfig
    "olmo2": _Hparams(_RMS, 1e-5),
    "olmoe": _Hparams(_RMS, 1e-5),  # OlmoeConfig rms_norm_eps=1e-05, rope_theta=10000.0
    "phi3": _Hparams(_RMS, 1e-5),
    "phi": _Hparams(_LN_EPS, 1e-5),
    "mixtral": _Hparams(_RMS, 1e-5, theta=1e6),
    "deepseek_v2": _Hparams(_RMS, 1e-6),
    "deepseek_v3": _Hparams(_RMS, 1e-6),
    # GptOssConfig: rope_theta=150000.0 and a YaRN rope_scaling by default
    "gpt_oss": _Hparams(
        _RMS,
        1e-5,
        theta=150000.0,
        rope_scaling={
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
    ),
    # GPTNeoXConfig takes rotary_emb_base (rope_theta = rotary_emb_base); FalconConfig rope_theta (ALiBi
    # models have no RoPE); GPT-2, BLOOM, BERT and RoBERTa have none
    "gpt_neox": _Hparams(_LN_EPS, 1e-5, theta_keys=("rotary_emb_base", "rope_theta")),
    "falcon": _Hparams(_LN_EPSILON, 1e-5),
    "gpt2": _Hparams(_LN_EPSILON, 1e-5, theta_keys=()),
    "bloom": _Hparams(_LN_EPSILON, 1e-5, theta_keys=()),
    "bert": _Hparams(_LN_EPS, 1e-12, theta_keys=()),  # BertConfig layer_norm_eps=1e-12
    # RobertaConfig: BertConfig's defaults; XLMRobertaConfig and CamembertConfig RobertaConfig's
    **dict.fromkeys(ROBERTA_FAMILIES, _Hparams(_LN_EPS, 1e-12, theta_keys=())),
}

# the multimodal wrappers keep their language model's keys in text_config
_TEXT_CONFIGS = {"gemma3": "gemma3_text", "llama4": "llama4_text", "mistral3": "mistral"}
# the multimodal wrappers whose text model is read from their text_config
TEXT_CONFIG_WRAPPERS = frozenset(_TEXT_CONFIGS)


def _text_fields(config: Mapping[str, object], model_type: str) -> _Fields:
    inner = _TEXT_CONFIGS.get(model_type)
    f = _Fields(config, model_type)
    return f if inner is None else f.nested("text_config", inner)


class _Rope(NamedTuple):
    rope_theta: float | None = None
    rope_local_theta: float | None = None
    rope_scaling: RopeScaling | None = None


class _ModelHparams(NamedTuple):
    """ModelSpec's fields of that name."""

    norm_eps: float
    rope_theta: float | None
    rope_local_theta: float | None
    rope_scaling: RopeScaling | None
    moe_router: MoERouter | None


def _hyperparameters(f: _Fields, spec: ModelSpec) -> _ModelHparams:
    """The model's norm epsilon, RoPE and routing per its config: its keys, else the configuration
    class's defaults."""
    family = _HPARAMS[f.model_type]
    rope = _Rope()
    if spec.position_embedding is PositionEmbedding.ROPE and family.theta_keys:
        rope = _rope(f, family, spec.max_position_embeddings)
        if AttentionKind.SLIDING not in spec.layer_types:  # no layer reads a local base
            rope = rope._replace(rope_local_theta=None)
    router = _ROUTERS.get(f.model_type)
    return _ModelHparams(
        norm_eps=f.positive_float(family.eps_key, default=family.eps),
        moe_router=None if router is None or spec.moe is None else router(f, spec.moe),
        **rope._asdict(),
    )


def _rope(f: _Fields, family: _Hparams, max_positions: int) -> _Rope:
    # transformers 5 moves rope_theta and the scaling into rope_parameters (Gemma 3: one per layer
    # type, full_attention and sliding_attention); earlier releases keep rope_theta and rope_scaling
    # at the top level, which win where both are given.
    params = f.raw.get("rope_parameters")
    full = local = None
    if isinstance(params, Mapping):
        nested = isinstance(params.get("full_attention"), Mapping)
        full = _Fields(
            params["full_attention"] if nested else params, f.model_type, f"{f.prefix}rope_parameters."
        )
        if nested and isinstance(params.get("sliding_attention"), Mapping):
            local = _Fields(params["sliding_attention"], f.model_type, f"{f.prefix}rope_parameters.")
    if any(f.raw.get(key) is not None for key in family.theta_keys) or full is None:
        theta = f.positive_float(*family.theta_keys, default=family.theta)
    else:
        theta = full.positive_float("rope_theta", default=family.theta)
    local_theta = None
    if family.local_theta is not None:
        default = (
            family.local_theta
            if local is None
            else local.positive_float("rope_theta", default=family.local_theta)
        )
        local_theta = f.positive_float("rope_local_base_freq", default=default)
    if "rope_scaling" in f.raw:
        scaling, at = f.raw["rope_scaling"], "rope_scaling"
    elif full is not None:
        scaling, at = full.raw, "rope_parameters"
    else:
        scaling, at = family.rope_scaling, "rope_scaling"
    return _Rope(theta, local_theta, _rope_scaling(f, scaling, at, max_positions))


_ROPE_KINDS = {kind.value: kind for kind in RopeScalingKind}


def _rope_scaling(f: _Fields, raw: object, key: str, max_positions: int) -> RopeScaling | None:
    """config.json rope_scaling as transformers modeling_rope_utils reads it (rope_type, or the legacy
    ``type`` of DeepSeek's configs); None or rope_type default: unscaled. RopeScaling's own checks name
    the key where the config has it (a multimodal wrapper's text_config.rope_scaling)."""
    try:
        return _read_rope_scaling(f, raw, key, max_positions)
    except InvalidModel as exc:
        if exc.field is None or not exc.field.startswith("rope_scaling."):
            raise
        path = f"{f.prefix}{key}.{exc.field.removeprefix('rope_scaling.')}"
        raise InvalidModel(exc.message, rule="hf_config", field=f"hf_config.{path}") from exc


def _read_rope_scaling(f: _Fields, raw: object, key: str, max_positions: int) -> RopeScaling | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise f._error(key, f"must be an object with a rope_type, got {raw!r}")
    g = _Fields(raw, f.model_type, prefix=f"{f.prefix}{key}.")
    name = raw.get("rope_type", raw.get("type", "default"))
    if f.model_type == "phi3" and "rope_type" not in raw and name in ("su", "yarn"):
        name = "longrope"  # Phi3Config._rope_scaling_adjustment: the names of earlier releases
    if name == "default":
        return None
    kind = _ROPE_KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise g._error("rope_type", f"= {name!r} is not one of transformers' {['default', *_ROPE_KINDS]}")
    original = g.optional_int("original_max_position_embeddings")
    if kind is RopeScalingKind.LONGROPE:
        # _compute_longrope_parameters: the factor is the context ratio where the config gives none
        base = f.optional_int("original_max_position_embeddings") or original
        factor = g.positive_float("factor", default=max_positions / base if base else 1.0)
        return RopeScaling(kind=kind, factor=factor, original_max_position_embeddings=base)
    if raw.get("factor") is None:
        raise g._error("factor", f"is required for rope_type {name!r}")
    factor = g.positive_float("factor", default=1.0)
    if kind is RopeScalingKind.LLAMA3:
        for needed in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if raw.get(needed) is None:
                raise g._error(needed, "is required for rope_type 'llama3'")
        return RopeScaling(
            kind=kind,
            factor=factor,
            original_max_position_embeddings=original,
            low_freq_factor=g.positive_float("low_freq_factor", default=1.0),
            high_freq_factor=g.positive_float("high_freq_factor", default=4.0),
        )
    if kind is RopeScalingKind.YARN:
        # _compute_yarn_parameters: original_max_position_embeddings or the config's; beta_fast or 32,
        # beta_slow or 1; mscale / mscale_all_dim / attention_factor optional; truncate default true
        mscales = {name: _non_negative(g, name) for name in ("mscale", "mscale_all_dim")}
        return RopeScaling(
            kind=kind,
            factor=factor,
            original_max_position_embeddings=original or max_positions,
            beta_fast=g.positive_float("beta_fast", default=32.0),
            beta_slow=g.positive_float("beta_slow", default=1.0),
            mscale=mscales["mscale"],
            mscale_all_dim=mscales["mscale_all_dim"],
            attention_factor=g.optional_positive_float("attention_factor"),
            truncate=g.bool_or("truncate", True),
        )
    return RopeScaling(kind=kind, factor=factor, original_max_position_embeddings=original)


def _non_negative(f: _Fields, key: str) -> float | None:
    if f.raw.get(key) is None:
        return None
    value = f.float_or(key, 0.0)
    if value < 0:
        raise f._error(key, f"must be >= 0, got {value}")
    return value


def _grouped(
    router: MoERouter, f: _Fields, moe: MoESpec, groups: int | None, kept: int | None, score_top_n: int
) -> MoERouter:
    # DeepSeek group-limited routing: n_group groups of experts, topk_group kept per token; every
    # group kept routes as plain top-k
    if groups is None or kept is None:
        raise f._error("n_group" if groups is None else "topk_group", "is required for group-limited routing")
    if groups < 1 or moe.num_experts % groups:
        raise f._error("n_group", f"= {groups} must divide the {moe.num_experts} routed experts")
    if not 1 <= kept <= groups:
        raise f._error("topk_group", f"= {kept} must be in [1, n_group {groups}]")
    if kept == groups:
        return router
    return dataclasses.replace(router, num_groups=groups, group_top_k=kept, group_score_top_n=score_top_n)


def _deepseek_v2_router(f: _Fields, moe: MoESpec) -> MoERouter:
    # DeepseekV2MoEGate (transformers modeling_deepseek_v2.py; DeepSeek's modeling_deepseek.py): softmax
    # over the experts; topk_method greedy (plain top-k) or group_limited_greedy (groups scored by their
    # best expert); norm_topk_prob renormalises the k weights (DeepSeek's code, with k > 1); then
    # times routed_scaling_factor. DeepseekV2Config: greedy, n_group/topk_group None, 1.0, False.
    f.require("scoring_func", "softmax", "DeepSeek-V2's gate scores by softmax")
    method = f.raw.get("topk_method", "greedy")
    if method not in ("greedy", "group_limited_greedy"):
        raise f._error("topk_method", f"= {method!r} is not DeepSeek-V2's greedy or group_limited_greedy")
    router = MoERouter(
        score=RouterScore.SOFTMAX,
        normalize_top_k=f.bool_or("norm_topk_prob", False) and moe.top_k > 1,
        top_k_scaling_factor=f.positive_float("routed_scaling_factor", default=1.0),
    )
    if method == "greedy":
        return router
    return _grouped(router, f, moe, f.optional_int("n_group"), f.optional_int("topk_group"), 1)


def _deepseek_v3_router(f: _Fields, moe: MoESpec) -> MoERouter:
    # DeepseekV3TopkRouter: sigmoid scores plus the e_score_correction_bias buffer choose the experts
    # (noaux_tc) among the topk_group groups best by the sum of their two best scores; the weights are
    # the plain sigmoid scores, renormalised when norm_topk_prob, times routed_scaling_factor.
    # DeepseekV3Config: n_group 8, topk_group 4, norm_topk_prob True, routed_scaling_factor 2.5.
    f.require("scoring_func", "sigmoid", "DeepseekV3TopkRouter scores by sigmoid")
    f.require("topk_method", "noaux_tc", "DeepseekV3TopkRouter routes by noaux_tc")
    router = MoERouter(
        score=RouterScore.SIGMOID,
        normalize_top_k=f.bool_or("norm_topk_prob", True),
        score_correction_bias=True,
        top_k_scaling_factor=f.positive_float("routed_scaling_factor", default=2.5),
    )
    return _grouped(router, f, moe, f.int_or("n_group", 8), f.int_or("topk_group", 4), 2)


def _softmax_router(normalize: bool | None) -> Callable[[_Fields, MoESpec], MoERouter]:
    # Softmax over the experts, top-k, the k weights renormalised: always (MixtralSparseMoeBlock;
    # GptOssTopKRouter's softmax over the k selected logits is the same), or when norm_topk_prob
    # (Qwen2MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock; their configs default it to False).
    def router(f: _Fields, moe: MoESpec) -> MoERouter:
        norm = f.bool_or("norm_topk_prob", False) if normalize is None else normalize
        return MoERouter(score=RouterScore.SOFTMAX, normalize_top_k=norm)

    return router


def _llama4_router(f: _Fields, moe: MoESpec) -> MoERouter:
    # Llama4Router: top-k of the logits, the sigmoid of each chosen one, no renormalisation
    return MoERouter(score=RouterScore.SIGMOID, normalize_top_k=False)


_ROUTERS: dict[str, Callable[[_Fields, MoESpec], MoERouter]] = {
    "mixtral": _softmax_router(True),
    "gpt_oss": _softmax_router(True),
    "qwen2_moe": _softmax_router(None),
    "qwen3_moe": _softmax_router(None),
    "deepseek_v2": _deepseek_v2_router,
    "deepseek_v3": _deepseek_v3_router,
    "llama4_text": _llama4_router,
}
