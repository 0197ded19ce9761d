"""Models: a preset, a Hugging Face config.json or explicit fields; presets and exact counts out."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator, model_validator

from service.catalog.errors import UnknownCatalogEntry
from service.catalog.models import model as catalog_model
from service.contracts.common import FieldError, Strict, catalog_slug, documented_maximum
from service.contracts.gpus import unknown_entry_error
from service.errors import Unprocessable
from service.estimator.errors import EstimatorError
from service.estimator.hf_config import SUPPORTED_MODEL_TYPES, TEXT_CONFIG_WRAPPERS, model_from_hf_config
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
    QKNorm,
    RopeScaling,
    RopeScalingKind,
    RouterScore,
)


class MoEIn(Strict):
    num_experts: int = Field(ge=1, le=4096)
    top_k: int = Field(ge=1, le=256)
    expert_ffn_hidden_size: int = Field(ge=1, le=1_000_000)
    num_shared_experts: int = Field(default=0, ge=0, le=64)
    shared_expert_ffn_hidden_size: int = Field(default=0, ge=0, le=1_000_000)
    shared_expert_gate: bool = False
    layer_frequency: int = Field(default=1, ge=1, le=1000)
    router_bias: bool = False
    expert_bias: bool = False


class MLAIn(Strict):
    """DeepSeek multi-head latent attention."""

    q_lora_rank: int | None = Field(default=None, ge=1, le=1_000_000, description="null: a plain q_proj")
    kv_lora_rank: int = Field(ge=1, le=1_000_000)
    qk_nope_head_dim: int = Field(ge=1, le=100_000)
    qk_rope_head_dim: int = Field(ge=1, le=100_000)
    v_head_dim: int = Field(ge=1, le=100_000)


class RopeScalingIn(Strict):
    """config.json rope_scaling (transformers' rope_type and the kind's own keys)."""

    kind: RopeScalingKind
    factor: float = Field(gt=0, le=1_000_000, description="context extension ratio")
    original_max_position_embeddings: int | None = Field(default=None, ge=1, le=100_000_000)
    low_freq_factor: float | None = Field(default=None, gt=0, le=1_000_000, description="llama3")
    high_freq_factor: float | None = Field(default=None, gt=0, le=1_000_000, description="llama3")
    beta_fast: float | None = Field(default=None, gt=0, le=1_000_000, description="yarn")
    beta_slow: float | None = Field(default=None, gt=0, le=1_000_000, description="yarn")
    mscale: float | None = Field(default=None, ge=0, le=1_000_000, description="yarn (DeepSeek)")
    mscale_all_dim: float | None = Field(default=None, ge=0, le=1_000_000, description="yarn (DeepSeek)")
    attention_factor: float | None = Field(default=None, gt=0, le=1_000_000, description="yarn, longrope")
    truncate: bool = Field(default=True, description="yarn: correction range rounded to whole dimensions")


class MoERouterIn(Strict):
    """How the MoE layers pick and weight their top-k experts."""

    score: RouterScore = RouterScore.SOFTMAX
    normalize_top_k: bool = Field(default=True, description="the k weights renormalised (norm_topk_prob)")
    score_correction_bias: bool = Field(
        default=False, description="DeepSeek-V3's aux-loss-free bias on the scores that choose the experts"
    )
    num_groups: int | None = Field(default=None, ge=1, le=4096, description="group-limited routing: groups")
    group_top_k: int | None = Field(default=None, ge=1, le=4096, description="groups kept per token")
    group_score_top_n: int | None = Field(
        default=None, ge=1, le=4096, description="a group's score: the sum of its n best expert scores"
    )
    top_k_scaling_factor: float = Field(
        default=1.0, gt=0, le=1_000_000, description="routed weights times this (routed_scaling_factor)"
    )


class ArchitectureIn(Strict):
    """Explicit architecture fields; what a config.json would say, in our names."""

    family: str = Field(
        default="custom",
        max_length=64,
        description="the Hugging Face model_type whose modules the architecture follows (one that "
        "hf_config reads, or custom): where families differ, the estimator and the launchers read it "
        "(fused QKV or gate-up projections, fp32 norms, the decoder layer FSDP wraps)",
    )
    # scale.py's bound, refused past with its reason
    num_layers: int = Field(ge=1, le=MAX_LAYERS.limit, json_schema_extra=documented_maximum(MAX_LAYERS.limit))
    hidden_size: int = Field(ge=1, le=1_000_000)
    num_attention_heads: int = Field(ge=1, le=10_000)
    num_kv_heads: int | None = Field(default=None, ge=1, le=10_000, description="default: MHA")
    head_dim: int | None = Field(default=None, ge=1, le=100_000, description="default: hidden/heads")
    ffn_hidden_size: int = Field(ge=1, le=10_000_000)
    vocab_size: int = Field(ge=1, le=10_000_000)
    max_position_embeddings: int = Field(default=4096, ge=1, le=100_000_000)
    mlp: MlpKind = MlpKind.SWIGLU
    norm: NormKind = NormKind.RMSNORM
    position_embedding: PositionEmbedding = PositionEmbedding.ROPE
    tied_embeddings: bool = False
    qkv_bias: bool = False
    attn_out_bias: bool = False
    mlp_bias: bool = False
    norms_per_layer: Literal[1, 2, 4] = 2
    embedding_norm: bool = False
    parallel_attn_mlp: bool = False
    rotary_fraction: float = Field(default=1.0, gt=0, le=1)
    lm_head_bias: bool = False
    moe: MoEIn | None = None
    moe_layers: list[int] | None = Field(
        default=None,
        max_length=10_000,
        description="0-based layers with the MoE block; default: every layer_frequency-th",
    )
    layer_types: list[AttentionKind] | None = Field(
        default=None, max_length=10_000, description="per layer: full, sliding or chunked; default: all full"
    )
    sliding_window: int | None = Field(default=None, ge=1, le=100_000_000)
    attention_chunk_size: int | None = Field(default=None, ge=1, le=100_000_000)
    qk_norm: QKNorm = QKNorm.NONE
    attention_sinks: bool = False
    mla: MLAIn | None = None
    mla_bias: bool = False
    final_logit_softcapping: bool = False
    attn_logit_softcapping: bool = Field(
        default=False,
        description="Gemma 2's tanh cap on the attention scores (eager attention keeps its output)",
    )
    hidden_dropout: float = Field(default=0.0, ge=0, lt=1, description="embedding and residual dropout")
    attention_dropout: float = Field(
        default=0.0, ge=0, lt=1, description="dropout on the attention probabilities"
    )
    bidirectional: bool = Field(
        default=False,
        description="an encoder (BERT, RoBERTa): every query attends to every key, no causal mask; "
        "with head masked_lm, sequence_classification, question_answering or token_classification",
    )
    type_vocab_size: int = Field(
        default=0, ge=0, le=1_000_000, description="token-type (segment) embedding rows: BERT 2, RoBERTa 1"
    )
    post_norm: bool = Field(
        default=False,
        description="LayerNorm after each residual add (BERT), so no final norm after the last layer",
    )
    head: Head = Field(
        default=Head.CAUSAL_LM,
        description="what the last hidden states feed: causal_lm (a decoder's lm_head), or an encoder's "
        "masked_lm, sequence_classification, question_answering or token_classification head",
    )
    num_labels: int = Field(
        default=2,
        ge=1,
        le=1_000_000,
        description="the task head's outputs: sequence_classification's and token_classification's "
        "labels, question_answering's start and end (2)",
    )
    # no parameters, no memory or time: the launchers emit them so the run trains this model
    rope_theta: float | None = Field(
        default=None, gt=0, le=1e15, description="RoPE base (config rope_theta); default: the tool's own"
    )
    rope_local_theta: float | None = Field(
        default=None, gt=0, le=1e15, description="Gemma 3: the sliding-window layers' RoPE base"
    )
    rope_scaling: RopeScalingIn | None = None
    norm_eps: float | None = Field(
        default=None, gt=0, le=1, description="every norm's epsilon; default: the tool's own"
    )
    moe_router: MoERouterIn | None = Field(default=None, description="needs moe; default: the tool's own")

    @model_validator(mode="after")
    def _labels_read(self) -> ArchitectureIn:
        # an input the model does not use is refused: only the classifier and QA heads have outputs
        labelled = (Head.SEQUENCE_CLASSIFICATION, Head.QUESTION_ANSWERING, Head.TOKEN_CLASSIFICATION)
        if "num_labels" in self.model_fields_set and self.head not in labelled:
            raise FieldError(
                "num_labels sizes a sequence_classification, question_answering or token_classification "
                f"head; head {self.head.value} has none of its own: leave it out",
                "num_labels",
            )
        return self

    @field_validator("family")
    @classmethod
    def _known_family(cls, family: str) -> str:
        if family != "custom" and family not in SUPPORTED_MODEL_TYPES:
            known = ", ".join(("custom", *SUPPORTED_MODEL_TYPES))
            raise ValueError(f"family {family!r} is not a model_type we know; known: {known}")
        return family

    def to_domain(self, name: str) -> ModelSpec:
        fields = self.model_dump(
            exclude={
                "moe",
                "num_kv_heads",
                "head_dim",
                "mla",
                "moe_layers",
                "layer_types",
                "rope_scaling",
                "moe_router",
            }
        )
        moe = MoESpec(**self.moe.model_dump()) if self.moe else None
        return ModelSpec(
            name=name,
            num_kv_heads=self.num_kv_heads or self.num_attention_heads,
            head_dim=self.head_dim or 0,
            moe=moe,
            mla=MLASpec(**self.mla.model_dump()) if self.mla else None,
            moe_layers=None if self.moe_layers is None else tuple(self.moe_layers),
            layer_types=tuple(self.layer_types or ()),
            rope_scaling=RopeScaling(**self.rope_scaling.model_dump()) if self.rope_scaling else None,
            moe_router=MoERouter(**self.moe_router.model_dump()) if self.moe_router else None,
            **fields,
        )


# ModelSpec's fields a config.json states beside the architecture (its notes, a 4-bit checkpoint),
# which the explicit form has no field for: the answer gives the notes beside the architecture
CONFIG_ONLY_FIELDS = (
    "name",
    "config_notes",
    "bnb_4bit_checkpoint",
    "bnb_4bit_constant_bits",
    "bnb_4bit_compute_precision",
    "scaled_constants",
    "vision_tower",
    "bnb_4bit_float_storage",
    "dequantized_checkpoint",
)


def architecture_dict(spec: ModelSpec) -> dict[str, Any]:
    """The model as the explicit form takes it (``ArchitectureIn``: every field but the name, which
    the answer gives beside it, and what only a config.json states), so an architecture shown can be
    sent back as ``model.architecture``."""
    fields = dataclasses.asdict(spec)
    for name in CONFIG_ONLY_FIELDS:
        del fields[name]
    if spec.head not in (Head.SEQUENCE_CLASSIFICATION, Head.QUESTION_ANSWERING, Head.TOKEN_CLASSIFICATION):
        del fields["num_labels"]  # no head of its own to size: refused as input (``_labels_read``)
    return fields


def _within_architecture_limits(spec: ModelSpec, config: dict[str, Any], field: str) -> ModelSpec:
    """A config.json's model held to the explicit form's limits (``ArchitectureIn``), so that what
    the service resolves it to is an architecture it takes back: a rope_scaling factor of 1e305 in a
    config was a 500 (an infinite context), and 1e7 resolved to an architecture the service refused.
    The error names the config's key where it has the explicit form's name (at the top or in a
    wrapper's text_config), else the config itself, with the explicit form's name in the message
    (``norm_eps`` is rms_norm_eps or layer_norm_epsilon by family)."""
    try:
        ArchitectureIn.model_validate(json.loads(json.dumps(architecture_dict(spec))))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        key = _config_key(config, [str(part) for part in error["loc"]])
        said = f"the config's {key}" if key else f"the model it describes has {where}"
        message = f"{said} ({error['input']!r}), past what the service models: {error['msg']}"
        located = f"{field}.hf_config" + (f".{key}" if key else "")
        raise Unprocessable(
            message, errors=[{"field": located, "rule": error["type"], "message": message}]
        ) from exc
    return spec


# The config.json keys each family states a ModelSpec field under, the commonest first
# (transformers' attribute_map aliases: GPT-2's n_head, Falcon's num_kv_heads, ChatGLM's
# multi_query_group_num).
_SPEC_KEYS = {
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_layers": ("num_hidden_layers", "n_layer"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "ffn_hidden_size": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "head_dim": ("head_dim",),
    "vocab_size": ("vocab_size",),
    "num_labels": ("num_labels", "id2label"),
    # the MoE and rotary rules too, under the keys hf_config reads them from (a Qwen3-MoE config stating
    # num_experts_per_tok 130 over 128 experts was answered "the config states no moe.top_k": hybrid
    # review); a dotted key is a nested one
    "moe.top_k": ("num_experts_per_tok",),
    "moe.num_experts": ("n_routed_experts", "num_local_experts", "num_experts"),
    "moe.expert_ffn_hidden_size": ("moe_intermediate_size",),
    "moe.num_shared_experts": ("n_shared_experts",),
    "moe.shared_expert_ffn_hidden_size": ("shared_expert_intermediate_size",),
    "moe_router.num_groups": ("n_group",),
    "moe_router.group_top_k": ("topk_group",),
    "moe_router.score": ("scoring_func",),
    "rotary_fraction": (
        "partial_rotary_factor",
        "rotary_pct",
        "rope_parameters.partial_rotary_factor",
        "rope_scaling.partial_rotary_factor",
    ),
    "rope_scaling": ("rope_scaling", "rope_parameters"),
}


def _config_field(config: dict[str, Any], spec_field: str, message: str) -> tuple[str, str]:
    """Where in a config.json a rule of the model it describes (``ModelSpec``'s, named by its own
    field) points, and the message: the key the config states it under; where it states none, the
    config itself, the message saying the value is the model type's default (a Mixtral config without
    num_key_value_heads was refused at "model.hf_config.num_kv_heads", a key no config has, for
    MixtralConfig's default 8: a review of the ordinary requests)."""
    keys = _SPEC_KEYS.get(spec_field, (spec_field,))
    for key in keys:
        found = _config_key(config, key.split("."))
        if found is not None:
            return f"hf_config.{found}", message
    default = f"{message} ({spec_field}: the config states no {keys[0]}, so the model type's default is used)"
    return "hf_config", default


def _config_key(config: dict[str, Any], path: list[str]) -> str | None:
    """``path`` as a key of the section of ``config`` the reader took the model from (a multimodal
    wrapper's text_config, else its top), or None where it has no key of that name."""
    # where the reader took it: a wrapper's text_config, else the top
    wrapper = config.get("model_type") in TEXT_CONFIG_WRAPPERS
    sections = (("text_config.", config.get("text_config")),) if wrapper else (("", config),)
    for prefix, section in sections:
        node: Any = section
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return prefix + ".".join(path)
    return None


MAX_CONFIG_DEPTH = 32  # levels of objects and arrays in a pasted config.json


def _depth(value: Any) -> int:
    """Levels of objects and arrays in a JSON value, counted without recursion (a deep one is what
    this guards against)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_CONFIG_DEPTH:  # past the limit: refused already, no need to walk further
            stack.extend((child, level + 1) for child in children)
    return deepest


class ModelRef(Strict):
    """Exactly one of: a catalog preset, a Hugging Face config.json, or explicit fields. A preset's
    name alone, as a string, stands for ``{"preset": name}`` (as a catalog GPU's name does for the
    cluster's ``gpu``)."""

    preset: str | None = Field(default=None, min_length=1, max_length=200)
    hf_config: dict[str, Any] | None = None
    architecture: ArchitectureIn | None = None
    name: str | None = Field(default=None, max_length=200, description="label for hf_config/architecture")
    head: Head | None = Field(
        default=None,
        description="preset only: the task head to train instead of the preset's own; an encoder preset "
        "(bert-*, roberta-*) takes masked_lm, sequence_classification, question_answering or "
        "token_classification (fine-tuning it for classification: transformers' "
        "*ForSequenceClassification); default: the preset's",
    )
    num_labels: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="preset with head sequence_classification or token_classification: the classifier's "
        "labels (default 2)",
    )

    @field_validator("hf_config")
    @classmethod
    def _shallow(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # a config.json nests a few levels (text_config.rope_scaling); 260 levels of a key the reader
        # ignores made a plan's idempotency digest a 500 (pydantic's serializer stops at 255)
        if value is not None and _depth(value) > MAX_CONFIG_DEPTH:
            raise ValueError(f"nests more than {MAX_CONFIG_DEPTH} levels of objects or arrays")
        return value

    # the preset's name as the request gave it, where the catalog read it as another slug
    _given_preset: str | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _preset_name(cls, value: Any, handler: Callable[[Any], ModelRef]) -> ModelRef:
        # "model": "llama-3.1-8b", what a curl user writes first; the preset as the catalog's slug
        # ("meta-llama/Llama-3.1-8B" -> "llama-3.1-8b": stored and echoed so), the name given kept
        if isinstance(value, str):
            value = {"preset": value}
        given = value.get("preset") if isinstance(value, dict) else None
        if isinstance(given, str):
            value = {**value, "preset": catalog_slug(given, lambda name: catalog_model(name).name)}
        ref = handler(value)
        if isinstance(given, str) and ref.preset != given:
            ref._given_preset = given
        return ref

    def names_read(self, field: str = "model") -> dict[str, str]:
        """``{"model.preset": slug}`` where the request named the preset otherwise."""
        return {} if self._given_preset is None else {f"{field}.preset": str(self.preset)}

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelRef:
        given = [k for k in ("preset", "hf_config", "architecture") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of preset, hf_config, architecture (got {given or 'none'})")
        if self.preset is None and (self.head is not None or self.num_labels is not None):
            raise FieldError(
                "head and num_labels change a preset; hf_config and architecture state their own",
                "head" if self.head is not None else "num_labels",
            )
        if self.num_labels is not None and self.head not in (
            Head.SEQUENCE_CLASSIFICATION,
            Head.TOKEN_CLASSIFICATION,
        ):
            raise FieldError(
                "num_labels is a classifier's: it needs head sequence_classification or token_classification",
                "num_labels",
            )
        return self

    def to_domain(self, field: str = "model") -> ModelSpec:
        """Resolve to a ModelSpec; problems name the field under `field`."""
        try:
            if self.preset is not None:
                return self._with_head(catalog_model(self.preset).spec)
            if self.hf_config is not None:
                spec = model_from_hf_config(self.hf_config, name=self.name)
                return _within_architecture_limits(spec, self.hf_config, field)
            assert self.architecture is not None
            return self.architecture.to_domain(self.name or "custom")
        except UnknownCatalogEntry as exc:
            raise Unprocessable(str(exc), errors=[unknown_entry_error(exc, f"{field}.preset")]) from exc
        except EstimatorError as exc:
            prefix = "hf_config" if self.hf_config is not None else "architecture"
            if self.preset is not None:  # the head asked of a preset (_with_head)
                prefix = "head"
            where, message = exc.field or prefix, exc.message
            if self.hf_config is not None and not where.startswith(prefix):
                where, message = _config_field(self.hf_config, where, message)
            elif not where.startswith(prefix):
                where = f"{prefix}.{where}"
            error: dict[str, Any] = {"field": f"{field}.{where}", "rule": exc.rule, "message": message}
            if exc.limit is not None:
                error["limit"] = {"le": exc.limit}
            raise Unprocessable(message, errors=[error]) from exc

    def _with_head(self, spec: ModelSpec) -> ModelSpec:
        """The preset with the head the request asks for (ModelSpec refuses an encoder's head on a
        decoder, and a decoder's on an encoder)."""
        if self.head is None:
            return spec
        labels = self.num_labels if self.num_labels is not None else 2
        return dataclasses.replace(spec, head=self.head, num_labels=labels)


class ResolveRequest(Strict):
    model: ModelRef
    pp: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="also split the count over this many pipeline stages (evenly, or with the embedding "
        "and the loss counting as a layer each when the stages do not divide the layers)",
    )


class ParametersOut(BaseModel):
    total: int
    embedding: int
    output: int
    final_norm: int
    per_layer: int = Field(description="one layer (the largest, for MoE models a MoE layer)")
    attention_per_layer: int
    norms_per_layer: int
    dense_layers: int
    dense_mlp_per_layer: int
    moe_layers: int
    experts_per_moe_layer: int
    router_per_moe_layer: int
    shared_experts_per_moe_layer: int
    active_per_token: int
    largest_module: int
    per_stage: list[int]
    stage_layers: list[int] = Field(description="decoder layers of each pipeline stage")


NOTES_DESCRIPTION = (
    "what the config states that no figure reads: a multimodal wrapper's vision tower (not counted), a "
    "checkpoint stored quantized (planned dequantized); every estimate of the model says them too"
)


class ResolvedModel(BaseModel):
    name: str
    architecture: dict[str, Any]
    parameters: ParametersOut
    notes: list[str] = Field(default_factory=list, description=NOTES_DESCRIPTION)


class ModelPresetOut(BaseModel):
    name: str
    display_name: str
    family: str = Field(description="the Hugging Face model_type the architecture follows")
    source: str
    config: dict[str, Any]
    architecture: dict[str, Any]
    parameters_total: int
    notes: list[str] = Field(default_factory=list, description=NOTES_DESCRIPTION)
