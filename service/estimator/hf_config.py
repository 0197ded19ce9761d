"""Build a ModelSpec from the fields of a Hugging Face ``config.json``.

One small builder per ``model_type``, each mirroring the module layout of the matching
``transformers`` modeling file (``models/<family>/modeling_<family>.py``, transformers 5.x) and the
defaults of its configuration class, so that ``parameter_counts`` of the result equals PyTorch's
count of ``AutoModelForCausalLM.from_config(config)``. ``validation/param_counts.py`` measures that.

Only the core sizes (hidden size, layers, heads, vocabulary and, where the family has one, the MLP
width) are required; every other missing key takes the transformers configuration-class default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from service.estimator.errors import InvalidModel
from service.estimator.types import (
    MlpKind,
    ModelSpec,
    MoESpec,
    NormKind,
    PositionEmbedding,
)

_MISSING = object()


class _Fields:
    """Typed, defaulting access to a config.json mapping; errors name the offending key."""

    def __init__(self, raw: Mapping[str, object], model_type: str) -> None:
        self.raw = raw
        self.model_type = model_type

    def _lookup(self, keys: tuple[str, ...]) -> tuple[str, object]:
        for key in keys:
            if key in self.raw:
                return key, self.raw[key]
        return keys[0], _MISSING

    def _error(self, key: str, problem: str) -> InvalidModel:
        return InvalidModel(
            f"hf_config (model_type {self.model_type!r}): {key!r} {problem}",
            rule="hf_config",
            field=f"hf_config.{key}",
        )

    def required_int(self, *keys: str) -> int:
        """The first present key of ``keys`` (aliases), which must be a positive integer."""
        key, value = self._lookup(keys)
        if value is _MISSING or value is None:
            raise self._error(key, "is required")
        return self._as_int(key, value)

    def int_or(self, key: str, default: int) -> int:
        value = self.raw.get(key)
        return default if value is None else self._as_int(key, value)

    def optional_int(self, key: str) -> int | None:
        value = self.raw.get(key)
        return None if value is None else self._as_int(key, value)

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
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._error(key, f"must be a number, got {value!r}")
        return float(value)

    def int_list(self, key: str) -> list[int]:
        value = self.raw.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._error(key, f"must be a list of integers, got {value!r}")
        return [self._as_int(key, item) for item in value]

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

    def _as_int(self, key: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._error(key, f"must be an integer, got {value!r}")
        return value


def _gated_kind(f: _Fields, key: str = "hidden_act", default: str = "silu") -> MlpKind:
    # Same three matrices either way; GeGLU when the gate's activation is a GELU.
    act = f.raw.get(key, default)
    return MlpKind.GEGLU if isinstance(act, str) and act.startswith("gelu") else MlpKind.SWIGLU


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
) -> ModelSpec:
    """Pre-norm RMSNorm decoders with separate (or Phi-3-fused) q/k/v and a gated MLP."""
    heads = f.required_int("num_attention_heads")
    hidden = f.required_int("hidden_size")
    head_dim = f.optional_int("head_dim") or head_dim_default or 0
    return ModelSpec(
        name=name,
        family=f.model_type,
        num_layers=f.required_int("num_hidden_layers"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=f.kv_heads("num_key_value_heads", kv_default, heads),
        head_dim=head_dim,
        ffn_hidden_size=f.required_int("intermediate_size"),
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


def _mistral(f: _Fields, name: str) -> ModelSpec:
    # MistralAttention/MistralMLP: no biases at all; MistralConfig defaults to 8 kv heads.
    return _llama_like(f, name, kv_default=8, max_positions=4096 * 32)


def _qwen2(f: _Fields, name: str) -> ModelSpec:
    # Qwen2Attention: q, k, v with bias=True, o_proj without; Qwen2Config defaults to 32 kv heads.
    return _llama_like(f, name, kv_default=32, max_positions=32768, qkv_bias=True)


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
    # Gemma2DecoderLayer: input, post_attention, pre_feedforward and post_feedforward RMSNorms.
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
        mlp=MlpKind.GEGLU,
        norms_per_layer=4,
    )


def _phi3(f: _Fields, name: str) -> ModelSpec:
    # Phi3: fused qkv_proj and gate_up_proj, no biases; same counts as separate projections.
    return _llama_like(
        f,
        name,
        kv_default=None,
        max_positions=4096,
        rotary_fraction=f.rotary_fraction("partial_rotary_factor", default=1.0),
    )


def _mixtral(f: _Fields, name: str) -> ModelSpec:
    # MixtralSparseMoeBlock: router h x E (no bias) and E SwiGLU experts of intermediate_size.
    moe = MoESpec(
        num_experts=f.int_or("num_local_experts", f.int_or("num_experts", 8)),
        top_k=f.int_or("num_experts_per_tok", 2),
        expert_ffn_hidden_size=f.required_int("intermediate_size"),
    )
    return _llama_like(f, name, kv_default=8, max_positions=4096 * 32, moe=moe)


def _qwen2_moe(f: _Fields, name: str) -> ModelSpec:
    # Qwen2MoeSparseMoeBlock: router, E experts of moe_intermediate_size, one shared expert of
    # shared_expert_intermediate_size and its h -> 1 sigmoid gate; MoE on every
    # decoder_sparse_step-th layer, dense MLP of intermediate_size elsewhere.
    if f.int_list("mlp_only_layers"):
        raise InvalidModel(
            "hf_config (model_type 'qwen2_moe'): a non-empty 'mlp_only_layers' is not supported yet",
            rule="hf_config",
            field="hf_config.mlp_only_layers",
        )
    num_experts = f.int_or("num_experts", 60)
    moe = None
    if num_experts > 0:
        moe = MoESpec(
            num_experts=num_experts,
            top_k=f.int_or("num_experts_per_tok", 4),
            expert_ffn_hidden_size=f.int_or("moe_intermediate_size", 1408),
            num_shared_experts=1,
            shared_expert_ffn_hidden_size=f.int_or("shared_expert_intermediate_size", 5632),
            shared_expert_gate=True,
            layer_frequency=f.int_or("decoder_sparse_step", 1),
        )
    return _llama_like(
        f, name, kv_default=16, max_positions=32768, qkv_bias=f.bool_or("qkv_bias", True), moe=moe
    )


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


_BUILDERS: dict[str, Callable[[_Fields, str], ModelSpec]] = {
    "llama": _llama,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "gemma": _gemma,
    "gemma2": _gemma2,
    "phi3": _phi3,
    "phi": _phi,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "falcon": _falcon,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "bloom": _bloom,
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_BUILDERS))


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
            f"hf_config model_type {model_type!r} is not supported; supported: {list(SUPPORTED_MODEL_TYPES)}",
            rule="hf_config_model_type",
            field="hf_config.model_type",
        )
    default_name = config.get("_name_or_path")
    resolved = name or (default_name if isinstance(default_name, str) and default_name else model_type)
    return builder(_Fields(config, model_type), resolved)
