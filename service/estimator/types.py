"""Typed inputs and outputs of the estimator: ModelSpec x ClusterSpec x Layout x TrainingSpec.

All quantities are SI with the unit in the name (bytes, seconds, FLOP/s, bytes/s). Inputs
validate themselves in ``__post_init__`` and raise domain errors that quote the numbers.
"""

from __future__ import annotations

import math
import operator
import typing
from dataclasses import dataclass, field
from enum import StrEnum

from service.estimator.errors import (
    EstimatorError,
    InvalidHardware,
    InvalidLayout,
    InvalidModel,
    InvalidTraining,
)


def _require_tuple(cls: type[EstimatorError], name: str, value: object) -> None:
    """A tuple field given as a list (peft's own spelling of target_modules) is refused by name: the
    memos hash it, and a list raised TypeError (library review)."""
    if value is not None and type(value) is not tuple:
        raise cls(f"{name} must be a tuple, got {type(value).__name__} {value!r}", rule="type", field=name)


def _require_positive(cls: type[EstimatorError], name: str, value: float) -> None:
    # finite too: an infinite peak timed every step as NaN, an infinite capacity factor overflowed
    # (library review; the API's schemas refuse inf and nan, the library's callers need not)
    if not 0 < value < math.inf:  # one comparison chain: NaN and inf fail it too (a Layout per layout)
        why = "must be > 0" if not value > 0 else "must be finite"
        raise cls(f"{name} {why}, got {value}", rule="positive", field=name)


# ---------------------------------------------------------------- model


class MlpKind(StrEnum):
    SWIGLU = "swiglu"  # gated: gate, up, down projections (Llama, Mistral, Qwen2, Phi-3)
    GEGLU = "geglu"  # gated with GELU (Gemma): same three matrices as SwiGLU
    GELU = "gelu"  # two matrices, up and down (GPT-2, GPT-NeoX, Falcon, BLOOM)

    @property
    def gated(self) -> bool:
        return self is not MlpKind.GELU


class NormKind(StrEnum):
    RMSNORM = "rmsnorm"  # weight only: h parameters
    LAYERNORM = "layernorm"  # weight and bias: 2h parameters


class PositionEmbedding(StrEnum):
    ROPE = "rope"  # no parameters
    LEARNED = "learned"  # max_position_embeddings x h table (GPT-2, GPT-3)
    ALIBI = "alibi"  # no parameters (BLOOM)


class AttentionKind(StrEnum):
    """What keys a layer's queries attend to (HF ``layer_types``)."""

    FULL = "full"  # every earlier token (causal), or every token of a bidirectional encoder
    SLIDING = "sliding"  # the last ``sliding_window`` tokens, itself included (Mistral, Gemma 2/3, GPT-OSS)
    CHUNKED = "chunked"  # earlier tokens of the same ``attention_chunk_size`` chunk (Llama 4)


class Head(StrEnum):
    """What the model's last hidden states feed, and so what is trained on top of the layers."""

    CAUSAL_LM = "causal_lm"  # lm_head h -> V on every token (decoders)
    # BERT / RoBERTa masked LM (transformers BertOnlyMLMHead, RobertaLMHead): dense h -> h + bias,
    # GELU, LayerNorm, then a decoder h -> V tied to the word embedding (tie_word_embeddings) with
    # its own V bias, run on every token (transformers' *ForMaskedLM computes every token's logits)
    MASKED_LM = "masked_lm"
    # BertForSequenceClassification: pooler dense h -> h + bias and tanh on the first token, then the
    # classifier h -> num_labels + bias; RobertaClassificationHead: dense h -> h + bias and out_proj
    # h -> num_labels + bias on the first token (the same parameters)
    SEQUENCE_CLASSIFICATION = "sequence_classification"
    # *ForQuestionAnswering (SQuAD): qa_outputs h -> 2 + bias on every token (start and end logits)
    QUESTION_ANSWERING = "question_answering"
    # *ForTokenClassification (NER, POS tagging): dropout, then the classifier h -> num_labels + bias on
    # every token, a label per token
    TOKEN_CLASSIFICATION = "token_classification"


class QKNorm(StrEnum):
    """Normalisation of the queries and keys before RoPE."""

    NONE = "none"
    PER_HEAD = "per_head"  # Qwen3, Gemma 3: one RMSNorm(head_dim) for q, one for k, shared by heads
    FULL_WIDTH = "full_width"  # OLMo 2: RMSNorm over all q heads (q_size), one over all k heads (kv_size)
    L2 = "l2"  # Llama 4: weightless L2 norm


@dataclass(frozen=True, slots=True, kw_only=True)
class MLASpec:
    """DeepSeek multi-head latent attention: queries and keys/values through low-rank latents."""

    q_lora_rank: int | None  # None (DeepSeek-V2-Lite): a plain h -> heads x (nope + rope) q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            _require_positive(InvalidModel, f"mla.{name}", getattr(self, name))
        if self.q_lora_rank is not None:
            _require_positive(InvalidModel, "mla.q_lora_rank", self.q_lora_rank)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts feed-forward (Mixtral, Qwen2/3-MoE, DeepSeek, Llama 4, GPT-OSS)."""

    num_experts: int
    top_k: int
    expert_ffn_hidden_size: int
    num_shared_experts: int = 0
    shared_expert_ffn_hidden_size: int = 0
    shared_expert_gate: bool = False  # Qwen2-MoE: a sigmoid gate h -> 1 on the shared expert
    layer_frequency: int = 1  # every k-th layer is MoE, the others dense (unless ModelSpec.moe_layers)
    router_bias: bool = False
    expert_bias: bool = False  # GPT-OSS: biases on every routed expert's gate_up (2f) and down (h)

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "expert_ffn_hidden_size", "layer_frequency"):
            _require_positive(InvalidModel, f"moe.{name}", getattr(self, name))
        if self.top_k > self.num_experts:
            raise InvalidModel(
                f"moe.top_k ({self.top_k}) exceeds moe.num_experts ({self.num_experts})",
                rule="moe_top_k",
                field="moe.top_k",
            )
        if self.num_shared_experts < 0:
            raise InvalidModel(
                f"moe.num_shared_experts must be >= 0, got {self.num_shared_experts}",
                field="moe.num_shared_experts",
            )
        if self.num_shared_experts and self.shared_expert_ffn_hidden_size <= 0:
            raise InvalidModel(
                f"moe.shared_expert_ffn_hidden_size must be > 0 when shared experts exist "
                f"({self.num_shared_experts}), got {self.shared_expert_ffn_hidden_size}",
                rule="positive",
                field="moe.shared_expert_ffn_hidden_size",
            )
        # an input the model does not use is refused: these size or gate a shared expert
        if not self.num_shared_experts:
            for name, given in (
                ("shared_expert_ffn_hidden_size", self.shared_expert_ffn_hidden_size != 0),
                ("shared_expert_gate", self.shared_expert_gate),
            ):
                if given:
                    raise InvalidModel(
                        f"moe.{name} is of a shared expert, and moe.num_shared_experts is 0: give "
                        "num_shared_experts, or leave it out",
                        rule="unused",
                        field=f"moe.{name}",
                    )


class RopeScalingKind(StrEnum):
    """A RoPE context extension: transformers' ``rope_type`` (modeling_rope_utils.ROPE_INIT_FUNCTIONS)."""

    LINEAR = "linear"  # position interpolation: every frequency / factor
    DYNAMIC = "dynamic"  # NTK-aware: the base grows with the sequence length past the original context
    YARN = "yarn"  # NTK-by-parts ramp plus an attention temperature (DeepSeek-V2/V3, gpt-oss)
    LONGROPE = "longrope"  # per-dimension short/long factors (Phi-3 128k)
    LLAMA3 = "llama3"  # Llama 3.1+: low frequencies / factor, high ones kept, a smooth ramp between


@dataclass(frozen=True, slots=True, kw_only=True)
class RopeScaling:
    """config.json ``rope_scaling``: how the rotary frequencies are stretched past the pre-training
    context. No parameters: it changes no memory or time figure, only which model is trained. Each
    kind reads its own fields (transformers modeling_rope_utils); the others stay None."""

    kind: RopeScalingKind
    factor: float  # context extension ratio
    original_max_position_embeddings: int | None = None  # the pre-training context (llama3, yarn)
    low_freq_factor: float | None = None  # llama3: wavelengths over original / low are divided by factor
    high_freq_factor: float | None = None  # llama3: wavelengths under original / high are kept
    beta_fast: float | None = None  # yarn: rotations where the interpolation ramp starts (transformers: 32)
    beta_slow: float | None = None  # yarn: rotations where it ends (transformers: 1)
    # yarn (DeepSeek): cos/sin scaled by get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim);
    # MLA also multiplies the softmax scale by get_mscale(factor, mscale_all_dim)^2. None: not given
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None  # yarn / longrope: an explicit cos/sin scale
    truncate: bool = True  # yarn: correction range rounded to whole dimensions (gpt-oss: false)

    def __post_init__(self) -> None:
        if type(self.kind) is not RopeScalingKind:
            raise InvalidModel(
                f"rope_scaling.kind must be a RopeScalingKind, got {self.kind!r}", field="rope_scaling.kind"
            )
        _require_positive(InvalidModel, "rope_scaling.factor", self.factor)
        for name in (
            "original_max_position_embeddings",
            "low_freq_factor",
            "high_freq_factor",
            "beta_fast",
            "beta_slow",
            "attention_factor",
        ):
            value = getattr(self, name)
            if value is not None:
                _require_positive(InvalidModel, f"rope_scaling.{name}", value)
        for name in ("mscale", "mscale_all_dim"):  # 0 turns the term off (get_mscale(s, 0) = 1)
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise InvalidModel(
                    f"rope_scaling.{name} must be >= 0, got {value}",
                    rule="non_negative",
                    field=f"rope_scaling.{name}",
                )
        if self.kind is RopeScalingKind.LLAMA3:
            low, high = self.low_freq_factor, self.high_freq_factor
            if low is None or high is None or self.original_max_position_embeddings is None:
                raise InvalidModel(
                    "rope_scaling llama3 needs low_freq_factor, high_freq_factor and "
                    "original_max_position_embeddings",
                    field="rope_scaling",
                )
            # transformers' _validate_llama3_parameters warns unless high > low, and the model runs
            # with them equal (no band between the kept and the divided wavelengths): Llama 4 Scout's
            # config.json has low_freq_factor = high_freq_factor = 1 (it was refused: config review,
            # stop 41). High below low inverts the bands: no published config has it.
            if high < low:
                raise InvalidModel(
                    f"rope_scaling.high_freq_factor ({high}) must be at least low_freq_factor ({low})",
                    field="rope_scaling.high_freq_factor",
                )


class RouterScore(StrEnum):
    """What a MoE router turns each expert's logit into."""

    SOFTMAX = "softmax"  # over all experts (Mixtral, Qwen MoE, DeepSeek-V2, gpt-oss)
    SIGMOID = "sigmoid"  # per expert (DeepSeek-V3, Llama 4)


@dataclass(frozen=True, slots=True, kw_only=True)
class MoERouter:
    """How a MoE layer's router picks its top_k experts and weights their outputs. No parameters
    beyond the h x E router MoESpec counts (DeepSeek-V3's correction bias is a buffer), so no memory
    or time figure reads it; it decides which model is trained."""

    score: RouterScore = RouterScore.SOFTMAX
    # The k selected weights divided by their sum (config norm_topk_prob; for softmax the same as a
    # softmax over the k selected logits: Mixtral, Qwen3-MoE, gpt-oss); False: the raw scores.
    normalize_top_k: bool = True
    # DeepSeek-V3 noaux_tc: a per-expert bias, updated from the experts' load rather than by gradients,
    # added to the scores to choose the experts but not to weight them (aux-loss-free balancing).
    score_correction_bias: bool = False
    # Group-limited routing (DeepSeek topk_method group_limited_greedy / noaux_tc): the experts split
    # into num_groups equal groups, each scored by the sum of its group_score_top_n best scores (V2:
    # 1, the maximum; V3: 2); the experts are chosen among the group_top_k best groups. None: off.
    num_groups: int | None = None
    group_top_k: int | None = None
    group_score_top_n: int | None = None
    top_k_scaling_factor: float = 1.0  # the routed weights times this (DeepSeek routed_scaling_factor)

    def __post_init__(self) -> None:
        if type(self.score) is not RouterScore:
            raise InvalidModel(
                f"moe_router.score must be a RouterScore, got {self.score!r}", field="moe_router.score"
            )
        _require_positive(InvalidModel, "moe_router.top_k_scaling_factor", self.top_k_scaling_factor)
        groups = (self.num_groups, self.group_top_k, self.group_score_top_n)
        if any(value is None for value in groups) and any(value is not None for value in groups):
            raise InvalidModel(
                "moe_router: num_groups, group_top_k and group_score_top_n go together, got "
                f"{self.num_groups}, {self.group_top_k}, {self.group_score_top_n}",
                field="moe_router.num_groups",
            )
        for name in ("num_groups", "group_top_k", "group_score_top_n"):
            value = getattr(self, name)
            if value is not None:
                _require_positive(InvalidModel, f"moe_router.{name}", value)
        if (
            self.num_groups is not None
            and self.group_top_k is not None
            and self.group_top_k > self.num_groups
        ):
            raise InvalidModel(
                f"moe_router.group_top_k ({self.group_top_k}) exceeds num_groups ({self.num_groups})",
                field="moe_router.group_top_k",
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer, or a BERT-style encoder (``bidirectional``), as exact as a parameter
    count needs."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    family: str = "custom"  # HF model_type where known: llama, gpt2, gpt_neox, falcon, ...
    max_position_embeddings: int = 4096
    mlp: MlpKind = MlpKind.SWIGLU
    norm: NormKind = NormKind.RMSNORM
    position_embedding: PositionEmbedding = PositionEmbedding.ROPE
    tied_embeddings: bool = False
    qkv_bias: bool = False
    attn_out_bias: bool = False
    mlp_bias: bool = False
    norms_per_layer: int = 2  # 1 for Falcon-7B's shared pre-norm of its parallel block
    embedding_norm: bool = False  # BLOOM's word_embeddings_layernorm
    parallel_attn_mlp: bool = False  # GPT-J/NeoX/Falcon: attention and MLP read the same input
    rotary_fraction: float = 1.0  # partial rotary (GPT-NeoX 0.25, Phi-2 0.4); no parameters
    lm_head_bias: bool = False  # Phi-1/1.5/2's output layer has a bias
    moe: MoESpec | None = None
    # The decoder layers whose MLP is the MoE block, 0-based; None: every moe.layer_frequency-th.
    # (Qwen3-MoE mlp_only_layers, DeepSeek first_k_dense_replace, Llama 4 interleave.)
    moe_layers: tuple[int, ...] | None = None
    # Per decoder layer, what its attention sees; () = every layer full (causal).
    layer_types: tuple[AttentionKind, ...] = ()
    sliding_window: int | None = None  # keys a sliding layer's query sees, itself included
    attention_chunk_size: int | None = None  # tokens per chunk of a chunked layer
    qk_norm: QKNorm = QKNorm.NONE
    attention_sinks: bool = False  # GPT-OSS: one learned sink logit per head and layer
    mla: MLASpec | None = None  # DeepSeek-V2/V3 attention instead of q/k/v/o of head_dim
    mla_bias: bool = False  # DeepSeek attention_bias: q_a_proj, kv_a_proj_with_mqa and o_proj
    final_logit_softcapping: bool = False  # Gemma 2: tanh(logits / c) * c, whose output autograd keeps
    # Granite's constant scalings that differ from a plain decoder's (embedding_multiplier,
    # attention_multiplier other than 1 / sqrt(head_dim), residual_multiplier, logits_scaling): no
    # parameters or FLOPs, but a framework building its own model must apply them (Megatron-LM cannot)
    scaled_constants: tuple[str, ...] = ()
    # Gemma 2: tanh(scores / c) * c before the softmax; eager attention keeps the tanh output of every
    # s x s score (FlashAttention >= 2.6 caps inside its kernel, keeping nothing more)
    attn_logit_softcapping: bool = False
    # Dropout the model trains with (its masks, and the attention probabilities' copies, are saved):
    # on the embedding and each residual branch (GPT-2 resid_pdrop/embd_pdrop, Megatron --hidden-dropout),
    # and on the attention probabilities (attn_pdrop, --attention-dropout). Modern LLMs train with 0.
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    # Encoders (BERT, RoBERTa: transformers modeling_bert.py / modeling_roberta.py). bidirectional:
    # every query attends to every key of the sequence (no causal mask; BertSelfAttention's is_causal
    # is False), so attention's core works over the whole s x s square.
    bidirectional: bool = False
    type_vocab_size: int = 0  # token-type (segment) embedding rows: BERT 2, RoBERTa 1; 0 none
    # LayerNorm after each residual add (BertSelfOutput, BertOutput: LayerNorm(x + sublayer(x))), so
    # no final norm after the last layer; the same norms per layer as pre-LN
    post_norm: bool = False
    head: Head = Head.CAUSAL_LM
    num_labels: int = 2  # the task head's outputs: classifier labels, or question answering's start and end
    # Hyperparameters without parameters, which no memory or time figure reads: they make a launch file
    # train the checkpoint's model rather than another one. None: not stated (the launcher's tool
    # keeps its own default). hf_config fills them from config.json or the config class's default.
    rope_theta: float | None = None  # RoPE base: pair i of a head rotates at rope_theta^(-2i/d) rad/token
    rope_local_theta: float | None = (
        None  # Gemma 3: the base of its sliding-window layers (rope_local_base_freq)
    )
    rope_scaling: RopeScaling | None = None  # config rope_scaling; None: the frequencies unscaled
    norm_eps: float | None = None  # epsilon added to the variance in every LayerNorm / RMSNorm
    moe_router: MoERouter | None = None  # how the MoE layers route (needs moe)
    # What a config.json states that no figure reads, said in every answer's warnings (hf_config
    # fills it): a multimodal wrapper's vision tower, a checkpoint stored quantized and planned as its
    # weights dequantized to the training precision.
    config_notes: tuple[str, ...] = ()
    # The checkpoint's Linear weights are stored in bitsandbytes 4-bit (quantization_config
    # load_in_4bit): from_pretrained loads them so, and only QLoRA trains such a base.
    bnb_4bit_checkpoint: bool = False
    # A multimodal wrapper's config (its vision_config beside the text_config): the language model is
    # planned, the vision tower and projector are not, so the launch files freeze them and keep the
    # adapters off them (hf_config's multimodal note says it)
    vision_tower: bool = False
    # Such a 4-bit checkpoint's packed weights are stored in a float dtype (bnb_4bit_quant_storage
    # bfloat16 / float16 / float32), which FSDP and ZeRO-3 can shard; uint8, BitsAndBytesConfig's
    # default, they cannot (launchers.common.stored_nf4_storage_refusal)
    bnb_4bit_float_storage: bool = True
    # Such a checkpoint's quantization constants per weight where its saved quantization_config is not
    # double-quantized (model_states.NF4_SINGLE_CONSTANT_BITS); None: double-quantized, as QLoRA's launch
    # files quantize at load (the tuning's qlora_bits_per_param)
    bnb_4bit_constant_bits: float | None = None
    # Such a checkpoint's saved bnb_4bit_compute_dtype, bf16 or fp16, which from_pretrained builds its
    # Linear4bit layers with whatever dtype the rest loads in: the training's precision (its default
    # resolves to it, ``defaults.for_gpu``; another is refused, ``validate.checkpoint_violation``); None:
    # not stated, or not such a checkpoint
    bnb_4bit_compute_precision: Precision | None = None
    # The format a checkpoint's weights are stored in where training loads them dequantized to the
    # training precision (quantization_config quant_method: "fp8", "mxfp4", "fbgemm_fp8",
    # "compressed-tensors"): the launch files say how the script loads it. None: stored unquantized.
    dequantized_checkpoint: str | None = None

    def __post_init__(self) -> None:
        for name in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "num_kv_heads",
            "ffn_hidden_size",
            "vocab_size",
            "max_position_embeddings",
        ):
            _require_positive(InvalidModel, name, getattr(self, name))
        if self.head_dim == 0 and self.mla is not None:
            # MLA's query and key heads are nope + rope wide (hf_config sets the same)
            object.__setattr__(self, "head_dim", self.mla.qk_head_dim)
        if self.head_dim == 0:
            if self.hidden_size % self.num_attention_heads:
                raise InvalidModel(
                    f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                    f"({self.num_attention_heads}); give head_dim explicitly",
                    rule="head_dim",
                    field="head_dim",
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        _require_positive(InvalidModel, "head_dim", self.head_dim)
        if self.num_attention_heads % self.num_kv_heads:
            raise InvalidModel(
                f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_kv_heads ({self.num_kv_heads})",
                rule="gqa_groups",
                field="num_kv_heads",
            )
        if self.norms_per_layer not in (1, 2, 4):
            raise InvalidModel(
                f"norms_per_layer must be 1, 2 or 4, got {self.norms_per_layer}",
                field="norms_per_layer",
            )
        if not 0.0 < self.rotary_fraction <= 1.0:
            raise InvalidModel(
                f"rotary_fraction must be in (0, 1], got {self.rotary_fraction}",
                field="rotary_fraction",
            )
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise InvalidModel(f"{name} must be in [0, 1), got {getattr(self, name)}", field=name)
        self._check_layer_structure()
        self._check_encoder()
        self._check_unused()
        for name, kind in _MODEL_ENUM_FIELDS:  # compared by identity, as Layout's (its check below)
            if type(getattr(self, name)) is not kind:
                raise InvalidModel(
                    f"{name} must be a {kind.__name__}, got {getattr(self, name)!r}", field=name
                )
        self._check_hyperparameters()

    def _check_encoder(self) -> None:
        _require_positive(InvalidModel, "num_labels", self.num_labels)
        if self.head is Head.QUESTION_ANSWERING and self.num_labels != 2:
            # BertForQuestionAnswering.forward: start_logits, end_logits = logits.split(1, dim=-1),
            # a ValueError for any other count (an encoder review: 3 was estimated and rendered)
            raise InvalidModel(
                f"a question_answering head has 2 labels (the span's start and end: transformers' "
                f"*ForQuestionAnswering splits its logits in two), got num_labels {self.num_labels}",
                rule="qa_labels",
                field="num_labels",
            )
        if self.type_vocab_size < 0:
            raise InvalidModel(
                f"type_vocab_size must be >= 0, got {self.type_vocab_size}",
                rule="non_negative",
                field="type_vocab_size",
            )
        # The encoder heads are BERT's and RoBERTa's; a decoder's next-token head needs the causal mask
        # (a bidirectional model would see the token it predicts).
        if self.bidirectional == (self.head is Head.CAUSAL_LM):
            raise InvalidModel(
                f"head {self.head.value!r} "
                + (
                    "needs a causal model"
                    if self.head is Head.CAUSAL_LM
                    else "is an encoder's: it needs bidirectional"
                )
                + "; an encoder takes "
                + ", ".join(head.value for head in Head if head is not Head.CAUSAL_LM),
                rule="head",
                field="head",
            )
        if self.bidirectional and self.layer_types:
            raise InvalidModel(
                "layer_types (sliding or chunked causal attention) are a decoder's; a bidirectional "
                "encoder's layers attend to the whole sequence",
                rule="layer_types",
                field="layer_types",
            )
        # BERT and RoBERTa are the encoders modelled: dense MLPs and multi-head attention
        for name in ("moe", "mla", "moe_layers"):
            if self.bidirectional and getattr(self, name) is not None:
                raise InvalidModel(
                    f"{name} with bidirectional: the encoders modelled (BERT, RoBERTa) have dense MLPs "
                    "and multi-head attention",
                    rule="encoder",
                    field=name,
                )

    def _check_hyperparameters(self) -> None:
        for name in ("rope_theta", "rope_local_theta", "norm_eps"):
            value = getattr(self, name)
            if value is not None:
                _require_positive(InvalidModel, name, value)
        rope = self.position_embedding is PositionEmbedding.ROPE
        for name in ("rope_theta", "rope_local_theta", "rope_scaling"):
            if not rope and getattr(self, name) is not None:
                raise InvalidModel(
                    f"{name} needs rotary position embeddings, got position_embedding "
                    f"{self.position_embedding.value!r}",
                    rule="rope",
                    field=name,
                )
        router = self.moe_router
        if router is None:
            return
        if self.moe is None:
            raise InvalidModel("moe_router needs moe", rule="moe_router", field="moe_router")
        if router.num_groups is not None and self.moe.num_experts % router.num_groups:
            raise InvalidModel(
                f"moe.num_experts ({self.moe.num_experts}) is not a multiple of moe_router.num_groups "
                f"({router.num_groups})",
                rule="moe_router",
                field="moe_router.num_groups",
            )

    def _check_layer_structure(self) -> None:
        for name in ("layer_types", "scaled_constants", "config_notes", "moe_layers"):
            _require_tuple(InvalidModel, name, getattr(self, name))
        if self.moe_layers is not None:
            bad = [i for i in self.moe_layers if not 0 <= i < self.num_layers]
            if bad or len(set(self.moe_layers)) != len(self.moe_layers):
                raise InvalidModel(
                    f"moe_layers must be distinct layer indices in [0, {self.num_layers}), got "
                    f"{list(self.moe_layers)}",
                    rule="moe_layers",
                    field="moe_layers",
                )
            if self.moe is None and self.moe_layers:
                raise InvalidModel("moe_layers needs moe", rule="moe_layers", field="moe_layers")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise InvalidModel(
                f"layer_types must give all {self.num_layers} layers, got {len(self.layer_types)}",
                rule="layer_types",
                field="layer_types",
            )
        needs = {AttentionKind.SLIDING: ("sliding_window", self.sliding_window),
                 AttentionKind.CHUNKED: ("attention_chunk_size", self.attention_chunk_size)}  # fmt: skip
        for kind, (name, value) in needs.items():
            if kind in self.layer_types and (value is None or value <= 0):
                raise InvalidModel(
                    f"{kind.value} layers need {name} > 0, got {value}", rule="layer_types", field=name
                )

    def _check_unused(self) -> None:
        """An input the model does not use is refused (its figures would say it was modelled): a
        window, chunk or local RoPE base without layers of that kind, MLA's fields without MLA and
        q/k/v's with it, partial rotary without RoPE, and an MoE block on no layer."""
        kinds = set(self.layer_types)
        read_by = (
            ("sliding_window", self.sliding_window is not None, AttentionKind.SLIDING),
            ("attention_chunk_size", self.attention_chunk_size is not None, AttentionKind.CHUNKED),
            ("rope_local_theta", self.rope_local_theta is not None, AttentionKind.SLIDING),
        )
        for name, given, kind in read_by:
            if given and kind not in kinds:
                raise InvalidModel(
                    f"{name} is read only by {kind.value} layers, and layer_types names none: give "
                    f"layer_types (every layer {kind.value!r} where all of them are), or leave {name} out",
                    rule="unused",
                    field=name,
                )
        if self.mla_bias and self.mla is None:
            raise InvalidModel(
                "mla_bias is of MLA's projections: it needs mla", rule="unused", field="mla_bias"
            )
        if self.mla is not None:
            # DeepSeek's attention: q_a/q_b, kv_a/kv_b and o projections, a KV head per query head
            # (hf_config: num_kv_heads = heads, head_dim = nope + rope), its biases mla_bias
            wrong = (
                ("num_kv_heads", self.num_kv_heads != self.num_attention_heads,
                 f"MLA has a key and value head per query head ({self.num_attention_heads})"),
                ("head_dim", self.head_dim != self.mla.qk_head_dim,
                 f"MLA's heads are qk_nope_head_dim + qk_rope_head_dim = {self.mla.qk_head_dim} wide"),
                ("qkv_bias", self.qkv_bias, "MLA's projections take mla_bias"),
            )  # fmt: skip
            for name, bad, why in wrong:
                if bad:
                    raise InvalidModel(f"{name} with mla: {why}", rule="unused", field=name)
        if self.rotary_fraction != 1.0 and self.position_embedding is not PositionEmbedding.ROPE:
            raise InvalidModel(
                f"rotary_fraction {self.rotary_fraction} needs rotary position embeddings, got "
                f"position_embedding {self.position_embedding.value!r}",
                rule="unused",
                field="rotary_fraction",
            )
        if self.moe is not None and self.moe_layers is not None and self.moe.layer_frequency != 1:
            raise InvalidModel(
                f"moe.layer_frequency {self.moe.layer_frequency} chooses the MoE layers where moe_layers "
                "does not: give one of them",
                rule="unused",
                field="moe.layer_frequency",
            )
        if self.moe is not None and not self._moe_layer_count():
            explicit = self.moe_layers is not None
            field = "moe_layers" if explicit else "moe.layer_frequency"
            value = list(self.moe_layers or ()) if explicit else self.moe.layer_frequency
            raise InvalidModel(
                f"moe is on no layer ({field} {value} of {self.num_layers} layers): a dense model leaves "
                "moe out",
                rule="unused",
                field=field,
            )

    def _moe_layer_count(self) -> int:
        return moe_layer_total(self.moe, self.moe_layers, self.num_layers)

    def attention_kind(self, index: int) -> AttentionKind:
        """What decoder layer ``index`` attends to."""
        return self.layer_types[index] if self.layer_types else AttentionKind.FULL

    def attention_span(self, kind: AttentionKind, seq_len: int) -> int:
        """Keys one query of a ``kind`` layer attends to, at most: the whole sequence, the window, or
        the chunk: the width of the full square (``flops.layer_core_flops``); under the causal mask a
        query sees ``flops.causal_keys_per_query`` of them on average."""
        if kind is AttentionKind.SLIDING and self.sliding_window is not None:
            return min(seq_len, self.sliding_window)
        if kind is AttentionKind.CHUNKED and self.attention_chunk_size is not None:
            return min(seq_len, self.attention_chunk_size)
        return seq_len

    @property
    def q_size(self) -> int:
        """Width of the query projection output: heads x head_dim (MLA: heads x (nope + rope))."""
        if self.mla is not None:
            return self.num_attention_heads * self.mla.qk_head_dim
        return self.num_attention_heads * self.head_dim

    @property
    def v_size(self) -> int:
        """Width of the attention output before o_proj: heads x head_dim (MLA: heads x v_head_dim)."""
        if self.mla is not None:
            return self.num_attention_heads * self.mla.v_head_dim
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of one of the key/value projection outputs: kv heads x head_dim (MLA: every head has
        its own decompressed key, heads x (nope + rope))."""
        if self.mla is not None:
            return self.num_attention_heads * self.mla.qk_head_dim
        return self.num_kv_heads * self.head_dim


# ---------------------------------------------------------------- hardware


@dataclass(frozen=True, slots=True, kw_only=True)
class PeakFlops:
    """Dense (not 2:4 sparse) peak FLOP/s per precision; None where the GPU has no such unit."""

    fp32: float
    tf32: float | None = None
    bf16: float | None = None
    fp16: float | None = None
    fp8: float | None = None

    def __post_init__(self) -> None:
        _require_positive(InvalidHardware, "peak_flops_per_s.fp32", self.fp32)
        for name in ("tf32", "bf16", "fp16", "fp8"):
            value = getattr(self, name)
            if value is not None:
                _require_positive(InvalidHardware, f"peak_flops_per_s.{name}", value)

    def of(self, precision: Precision) -> float | None:
        """The dense peak the precision's matmuls run on; None where the GPU has no units for it.
        fp32 runs anywhere (CUDA cores, PyTorch's default without TF32); tf32 needs TF32 tensor
        cores (NVIDIA Ampere and newer, AMD CDNA 3); bf16_pure runs bf16's."""
        match precision:
            case Precision.FP32:
                return self.fp32
            case Precision.TF32:
                return self.tf32
            case Precision.BF16 | Precision.BF16_PURE:
                return self.bf16
            case Precision.FP16:
                return self.fp16
            case Precision.FP8:
                return self.fp8


# The source of a GPU a request describes (a custom GPU), not the catalog's
CUSTOM_GPU_SOURCE = "supplied by the client"


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUSpec:
    name: str
    memory_bytes: int
    peak_flops_per_s: PeakFlops
    hbm_bandwidth_bytes_per_s: float
    intra_node_bandwidth_bytes_per_s: float  # per GPU, one direction (NVLink, or PCIe)
    pcie_bandwidth_bytes_per_s: float  # host link, one direction
    vendor: str = "nvidia"
    chip: str = ""  # the die (gh100, ga100, ad102, ...): what the tuning's peak fractions are fitted per
    # FlashAttention-2 kernels exist for it (NVIDIA Ampere sm_80 and newer, AMD CDNA 2/3 via ROCm)
    flash_attention: bool = True
    # CUDA peer access between the GPUs of a node (NVLink, or PCIe peer-to-peer): GeForce drivers turn
    # it off, so GPU-to-GPU traffic is staged through host memory and what maps a peer's memory
    # (Transformer Engine's userbuffers, PyTorch's SymmetricMemory) cannot run
    peer_to_peer: bool = True
    source: str = ""
    # Sustained clocks (service.estimator.clocks): the compute peaks above are quoted at the board
    # power ``rated_power_w`` and the SM clock ``peak_clock_hz``; a part run at a lower
    # ``power_limit_w``, or measured at a lower ``sustained_clock_hz``, computes at a lower clock and
    # every compute peak scales with it. None: the part runs as its datasheet quotes it.
    rated_power_w: float | None = None
    power_limit_w: float | None = None
    peak_clock_hz: float | None = None
    sustained_clock_hz: float | None = None
    # Each GPU's share of the network of the node the part ships in (its reference system's NICs,
    # one direction): what a cluster of it that spans nodes without stating its network, or a job
    # placed on more nodes than asked, is assumed to have. None: not known (a PCIe card, a custom
    # GPU). Not this cluster's hardware (``ClusterSpec.inter_node_bandwidth_bytes_per_s`` is).
    node_network_bytes_per_s: float | None = None
    # GPUs in that node (8 on an HGX baseboard or an OAM platform, 8 MI250X GCDs on a Frontier
    # node); None: a PCIe card, whose server holds what its buyer chose. Not this cluster's node.
    node_gpus: int | None = None
    # A node whose GPUs are a fully connected mesh of point-to-point links rather than a switch: the
    # links each GPU has to its peers, ``intra_node_bandwidth_bytes_per_s`` their sum (MI300X: 7 xGMI
    # of 64 GB/s). A group of k of a node's GPUs then uses k - 1 of them (``comm.link_for_group``).
    # None: a switch (NVSwitch), every group at the whole bandwidth.
    mesh_links: int | None = None
    # Link figures the GPU's source left out and the rule that chose each, (field, why): a custom GPU
    # without its intra-node or PCIe bandwidth. The answer's assumptions repeat them (comm.
    # link_default_notes). How a figure was chosen, not hardware: calibration keys leave it out.
    defaulted: tuple[tuple[str, str], ...] = ()
    # What the GPU's source states that looks mistaken, said with every estimate on it (a custom GPU's
    # peaks far above its die's catalog parts: a datasheet's 2:4-sparse figure). Not hardware:
    # calibration keys leave it out.
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("defaulted", "notes"):
            _require_tuple(InvalidHardware, name, getattr(self, name))
        for name in (
            "memory_bytes",
            "hbm_bandwidth_bytes_per_s",
            "intra_node_bandwidth_bytes_per_s",
            "pcie_bandwidth_bytes_per_s",
        ):
            _require_positive(InvalidHardware, name, getattr(self, name))
        for name in (
            "rated_power_w",
            "power_limit_w",
            "peak_clock_hz",
            "sustained_clock_hz",
            "node_network_bytes_per_s",
            "node_gpus",
            "mesh_links",
        ):
            if getattr(self, name) is not None:
                _require_positive(InvalidHardware, name, getattr(self, name))
        _require_below(self.power_limit_w, "power_limit_w", self.rated_power_w, "rated_power_w")
        _require_below(self.sustained_clock_hz, "sustained_clock_hz", self.peak_clock_hz, "peak_clock_hz")

    @property
    def tp_overlap_peer_access(self) -> bool:
        """Whether TP communication overlap can map the TP peers' memory here: peer access
        (``peer_to_peer``), on a die whose software has the mapping: PyTorch's SymmetricMemory (torchtitan's
        Async TP) runs on ROCm only on gfx942 and gfx950 (torch ``evaluate_platform_supports_symm_mem``),
        so not on an MI250X's gfx90a, where an overlap was credited 16% of the step (AMD review)."""
        return self.peer_to_peer and self.chip not in NO_PEER_MEMORY_OVERLAP_CHIPS


def _require_below(value: float | None, name: str, reference: float | None, reference_name: str) -> None:
    """A power limit or sustained clock needs the rated figure it scales from, and stays at or below it:
    the datasheet peaks are the most the part computes (a clock above them would time it faster)."""
    if value is None:
        return
    if reference is None:
        raise InvalidHardware(
            f"{name} ({value:g}) scales the peaks from {reference_name}, which is not given",
            rule="requires",
            field=reference_name,
        )
    if value > reference:
        raise InvalidHardware(
            f"{name} ({value:g}) is above {reference_name} ({reference:g}), the figure the peaks are "
            "quoted at",
            rule="at_most",
            field=name,
        )


# A measured all-reduce bus bandwidth is at most this many times its link's per-direction bandwidth.
# nccl-tests (doc/PERFORMANCE.md) reports busbw = algbw x 2(n-1)/n, which a ring or tree (point-to-point
# sends) keeps at or below the link. In-network reduction (NVLink SHARP on NVSwitch, InfiniBand SHARP)
# does better, but every rank must still send its S bytes once and receive the S-byte result once, so
# algbw <= the link and busbw <= 2(n-1)/n x the link < 2 x the link. On 8 H100 (450 GB/s NVLink) NCCL's
# maintainer quotes ~370 GB/s busbw with NCCL_ALGO=RING (the wire after ~20% protocol overhead) and ~480
# with NVLS, NCCL's default there, whose busbw "does not correspond to the bandwidth on the wire"
# (NVIDIA/nccl-tests#212).
MAX_BUS_BANDWIDTH_PER_LINK = 2.0


def moe_layer_total(moe: MoESpec | None, moe_layers: tuple[int, ...] | None, num_layers: int) -> int:
    """Decoder layers with the MoE block: ``moe_layers``, else every layer_frequency-th of
    ``num_layers`` ((i + 1) % k == 0, ``params.is_moe_layer``); 0 without ``moe``."""
    if moe is None:
        return 0
    if moe_layers is not None:
        return len(moe_layers)
    return num_layers // moe.layer_frequency


# Dies whose software stack cannot map TP peers' memory for communication overlap (GPUSpec
# .tp_overlap_peer_access): CDNA 2 (MI250X, gfx90a) has no PyTorch SymmetricMemory.
NO_PEER_MEMORY_OVERLAP_CHIPS = frozenset({"cdna2"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """Homogeneous nodes of identical GPUs; bandwidths per GPU, one direction.

    The measured bus bandwidths, where the cluster states them, are nccl-tests all_reduce_perf busbw
    at large messages: intra, all the GPUs of one node; inter, one GPU per node across the nodes.
    They replace nominal x the tuning's bus efficiency (comm.achieved_bandwidth_bytes_per_s)."""

    gpu: GPUSpec
    num_nodes: int
    gpus_per_node: int
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    cpu_memory_bytes_per_node: int = 0
    nvme_bytes_per_node: int = 0
    measured_intra_node_bus_bandwidth_bytes_per_s: float | None = None
    measured_inter_node_bus_bandwidth_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        for name in (
            "num_nodes",
            "gpus_per_node",
            "intra_node_bandwidth_bytes_per_s",
            "inter_node_bandwidth_bytes_per_s",
        ):
            _require_positive(InvalidHardware, name, getattr(self, name))
        for name in ("cpu_memory_bytes_per_node", "nvme_bytes_per_node"):
            # finite too: NaN host RAM made every layout "not fit in host memory", offloaded or not
            # (change review)
            if not 0 <= getattr(self, name) < math.inf:
                raise InvalidHardware(
                    f"{name} must be a finite number >= 0, got {getattr(self, name)}",
                    rule="non_negative",
                    field=name,
                )
        for measured, nominal, hint in (
            ("measured_intra_node_bus_bandwidth_bytes_per_s", "intra_node_bandwidth_bytes_per_s", ""),
            (
                "measured_inter_node_bus_bandwidth_bytes_per_s",
                "inter_node_bandwidth_bytes_per_s",
                # the field's own recipe (contracts.clusters MEASURED_INTER_DESCRIPTION): the hint read
                # "measure one GPU per node", which on nodes sharing a NIC is refused again (network review)
                " (give each GPU's share: the busbw of a run over every GPU of >= 2 nodes, divided by "
                "gpus_per_node, about the node's network over its GPUs; a run with one GPU per node measures "
                "the NIC it reaches, divided by the GPUs that share it)",
            ),
        ):
            _require_bus_bandwidth_within_link(
                measured, getattr(self, measured), nominal, getattr(self, nominal), hint
            )

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def tp_straddles_nodes(self, tp: int, world_size: int) -> bool:
        """Whether tensor-parallel groups of ``tp`` ranks, of a job of ``world_size`` GPUs, cross a node
        boundary: ranks fill nodes tp first, so a tp above the node, or one the node's GPUs do not
        divide once the job spans several nodes (tp 4 on nodes of 6: ranks 4-7 are 2 + 2)."""
        gpn = self.gpus_per_node
        return tp > gpn or (world_size > gpn and gpn % tp != 0)


def _require_bus_bandwidth_within_link(
    name: str, value: float | None, link_name: str, link: float, hint: str
) -> None:
    """A measured busbw is positive and at most MAX_BUS_BANDWIDTH_PER_LINK x the link it ran on:
    more is a typo, another unit, or a measurement of something else."""
    if value is None:
        return
    _require_positive(InvalidHardware, name, value)
    bound = MAX_BUS_BANDWIDTH_PER_LINK * link
    if value > bound:
        raise InvalidHardware(
            f"{name} ({value / 1e9:g} GB/s) is above {MAX_BUS_BANDWIDTH_PER_LINK:g} x {link_name} "
            f"({link / 1e9:g} GB/s): no all-reduce reaches a busbw over {bound / 1e9:g} GB/s on that link, "
            f"even with in-network reduction (NVLS, SHARP){hint}",
            rule="at_most",
            field=name,
        )


# ---------------------------------------------------------------- training


class Precision(StrEnum):
    FP32 = "fp32"
    # fp32 weights, gradients, optimizer states and activations (fp32's memory), with the matmuls on
    # the tensor cores' TF32 path: PyTorch torch.backends.cuda.matmul.allow_tf32 = True /
    # torch.set_float32_matmul_precision("high"), HF Trainer --tf32. NVIDIA Ampere and newer.
    TF32 = "tf32"
    BF16 = "bf16"  # mixed: bf16 compute and weights, fp32 master weights and optimizer states
    FP16 = "fp16"  # mixed, with loss scaling
    FP8 = "fp8"  # Transformer Engine style: fp8 GEMMs, bf16 weights, fp32 master + states
    BF16_PURE = "bf16_pure"  # parameters, gradients and optimizer states all bf16

    @property
    def stores_fp32(self) -> bool:
        """Every tensor kept in fp32 (fp32; tf32 changes how matmuls compute, not what is stored)."""
        return self in (Precision.FP32, Precision.TF32)

    @property
    def weight_dtype(self) -> str:
        """The torch dtype the model's 16-bit (or fp32) weights are held in, as from_pretrained's
        torch_dtype names it: float32 where every tensor is fp32, float16 under fp16, else bfloat16
        (fp8 runs its GEMMs in fp8 on bf16 weights)."""
        if self.stores_fp32:
            return "float32"
        return "float16" if self is Precision.FP16 else "bfloat16"


class Optimizer(StrEnum):
    ADAMW = "adamw"
    ADAMW_8BIT = "adamw_8bit"
    SGD = "sgd"  # with momentum
    ADAFACTOR = "adafactor"
    LION = "lion"


class OptimizerImplementation(StrEnum):
    """How torch.optim runs the step under PyTorch's own frameworks (FSDP / DDP / one GPU). DeepSpeed
    and Megatron-LM build their own fused optimizers (DeepSpeed FusedAdam / DeepSpeedCPUAdam,
    Transformer Engine / apex FusedAdam) whatever this says."""

    # one kernel over chunks of the parameters, nothing the size of the parameters allocated: torch
    # AdamW(fused=True), HF Trainer's default optim adamw_torch_fused, torchtitan's
    # optimizer.implementation default "fused", bitsandbytes' 8-bit AdamW
    FUSED = "fused"
    # torch.optim's multi-tensor path, its default on CUDA (foreach=None): AdamW's
    # _multi_tensor_adam makes exp_avg_sq.sqrt() as new tensors over every parameter of a (device,
    # dtype) group at once, a temporary of the trainable parameters' size in their dtype (HF Trainer
    # optim adamw_torch, torchtitan implementation foreach, a plain torch.optim.AdamW)
    FOREACH = "foreach"


class Method(StrEnum):
    FULL = "full"
    LORA = "lora"
    QLORA = "qlora"


class BaseDtype(StrEnum):
    """The dtype LoRA's frozen base is kept in."""

    # the compute dtype: from_pretrained(torch_dtype=bfloat16) under bf16, fp32 under fp32 and tf32
    COMPUTE = "compute"
    # loaded in fp32 (transformers' from_pretrained without torch_dtype) and trained under 16-bit
    # autocast (HF Trainer bf16=True / fp16=True): every matmul casts its weight to 16 bits
    FP32 = "fp32"


class Attention(StrEnum):
    FLASH = "flash"
    SDPA = "sdpa"
    EAGER = "eager"  # materialises the s x s scores and probabilities


ALL_LINEAR: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
# of ALL_LINEAR, the MLP's (each routed expert has its own under expert parallelism)
MLP_LINEAR: frozenset[str] = frozenset({"gate_proj", "up_proj", "down_proj"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    seq_len: int
    global_batch_size: int  # sequences per optimizer step
    precision: Precision = Precision.BF16
    optimizer: Optimizer = Optimizer.ADAMW
    optimizer_implementation: OptimizerImplementation = OptimizerImplementation.FUSED
    method: Method = Method.FULL
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ALL_LINEAR
    # None: left to the GPU, as a request that leaves it out: FlashAttention-2 where its kernels run
    # and take the precision's activations, else SDPA (``defaults.for_gpu`` resolves it)
    attention: Attention | None = None
    tokens: int | None = None  # total training tokens, for time to train
    # Multi-token prediction depths trained with the model (DeepSeek-V3 §2.2; Megatron-Core
    # --mtp-num-layers): each adds a decoder layer, its input projection and norms, and another
    # output-layer loss on the last pipeline stage.
    mtp_num_layers: int = 0
    base_dtype: BaseDtype = BaseDtype.COMPUTE  # LoRA: the frozen base's dtype
    # Whether the GPU the job is placed on runs flash attention kernels (GPUSpec.flash_attention):
    # not a request's field, but what ``defaults.for_gpu`` reads off the GPU wherever the job is
    # placed; SDPA's kernel for grouped-query heads follows it (flops.materialises_scores)
    gpu_flash_kernels: bool = True
    # The fields the request left to the hardware ("precision", "attention"): resolved for the GPU
    # (``defaults.for_gpu``) wherever the job is placed, and named in the answer. An attention left
    # None is one too (``for_gpu`` adds it here when it resolves it).
    hardware_defaults: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        # compared by identity and hashed by the memos, as Layout's: a plain string raised
        # AttributeError deep in the estimate, a list TypeError (library review)
        for name, kind in _TRAINING_ENUM_FIELDS:
            value = getattr(self, name)
            if type(value) is not kind and not (value is None and name == "attention"):
                raise InvalidTraining(f"{name} must be a {kind.__name__}, got {value!r}", field=name)
        _require_tuple(InvalidTraining, "lora_targets", self.lora_targets)
        if type(self.hardware_defaults) is not frozenset:
            raise InvalidTraining(
                f"hardware_defaults must be a frozenset, got {self.hardware_defaults!r}",
                rule="type",
                field="hardware_defaults",
            )
        _require_positive(InvalidTraining, "seq_len", self.seq_len)
        stray = self.hardware_defaults - {"precision", "attention"}
        if stray:
            raise InvalidTraining(
                f"hardware_defaults names {sorted(stray)}; only precision and attention follow the GPU",
                field="hardware_defaults",
            )
        if self.mtp_num_layers < 0:
            raise InvalidTraining(
                f"mtp_num_layers must be >= 0, got {self.mtp_num_layers}",
                rule="non_negative",
                field="mtp_num_layers",
            )
        _require_positive(InvalidTraining, "global_batch_size", self.global_batch_size)
        if self.method is not Method.FULL:
            _require_positive(InvalidTraining, "lora_rank", self.lora_rank)
            if not self.lora_targets:
                raise InvalidTraining(
                    "lora_targets must name at least one module", rule="non_empty", field="lora_targets"
                )
            unknown = sorted(set(self.lora_targets) - set(ALL_LINEAR))
            if unknown:
                raise InvalidTraining(
                    f"unknown lora_targets {unknown}; known: {list(ALL_LINEAR)}",
                    rule="lora_target",
                    field="lora_targets",
                )
        if self.tokens is not None:
            _require_positive(InvalidTraining, "tokens", self.tokens)
        if (
            self.optimizer_implementation is OptimizerImplementation.FOREACH
            and self.optimizer is not Optimizer.ADAMW
        ):
            # torch.optim has no Lion or Adafactor of its own (HF's Adafactor loops per parameter),
            # bitsandbytes' 8-bit AdamW is its own kernel, and SGD is modelled as torch's fused step,
            # which the launch files ask for (its foreach step with weight decay makes a gradient-sized
            # temporary: _multi_tensor_sgd's torch._foreach_add(grads, params, alpha=weight_decay))
            raise InvalidTraining(
                f"optimizer_implementation foreach with optimizer {self.optimizer.value}: only torch.optim's "
                "AdamW (optimizer adamw) has a multi-tensor step that allocates a parameter-sized temporary; "
                "leave optimizer_implementation out",
                rule="unused",
                field="optimizer_implementation",
            )
        if self.base_dtype is not BaseDtype.COMPUTE and self.method is not Method.LORA:
            qlora = self.method is Method.QLORA
            kept = "NF4 Linear weights (qlora)" if qlora else "the weights precision sets"
            raise InvalidTraining(
                f"base_dtype {self.base_dtype.value} applies to method lora (a frozen base in its own "
                f"dtype); {self.method.value} keeps {kept}",
                rule="unused",
                field="base_dtype",
            )
        if (
            self.base_dtype is BaseDtype.FP32
            and self.precision.stores_fp32
            and "precision" not in self.hardware_defaults
        ):
            # a precision the request states: its compute dtype is fp32 already (a GPU that resolves
            # the precision to fp32 makes the same base fp32, which changes nothing either way)
            raise InvalidTraining(
                f"base_dtype fp32 with precision {self.precision.value}: the base is in fp32, the compute "
                "dtype, already; leave base_dtype out",
                rule="unused",
                field="base_dtype",
            )
        if self.method is Method.QLORA and self.precision is Precision.FP8:
            # bitsandbytes' Linear4bit dequantizes its NF4 weight and multiplies in its compute dtype
            # (bnb_4bit_compute_dtype: fp32, fp16 or bf16); Transformer Engine's and torchao's fp8
            # replace nn.Linear with their own modules, and no tool stacks both on one layer (PEFT-review:
            # the estimate priced fp8 weight caches of the 4-bit base and the plan timed it at fp8 rates)
            raise InvalidTraining(
                "method qlora with precision fp8: bitsandbytes' NF4 layers compute in bf16, fp16 or fp32 "
                "(bnb_4bit_compute_dtype), never fp8; use precision bf16, or method lora with fp8",
                rule="qlora_precision",
                field="precision",
            )
        if self.base_dtype is BaseDtype.FP32 and self.precision in (Precision.FP8, Precision.BF16_PURE):
            raise InvalidTraining(
                f"base_dtype fp32 with precision {self.precision.value}: an fp32 base runs under 16-bit "
                "autocast (bf16 or fp16), not Transformer Engine fp8 or pure bf16",
                rule="base_dtype",
                field="base_dtype",
            )

    @property
    def base_autocast(self) -> bool:
        """LoRA's frozen base kept in fp32 while the step computes in 16 bits under autocast."""
        return self.base_dtype is BaseDtype.FP32 and not self.precision.stores_fp32

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch_size


# ---------------------------------------------------------------- layout


class Framework(StrEnum):
    DEEPSPEED = "deepspeed"
    MEGATRON = "megatron"
    FSDP = "fsdp"


class Offload(StrEnum):
    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


class Recompute(StrEnum):
    """Activation recomputation, as each framework names its policies."""

    NONE = "none"
    # Megatron --recompute-granularity selective (--recompute-modules core_attn, the default):
    # attention's core is recomputed (Korthikanti §5)
    SELECTIVE = "selective"
    # torchtitan per-op selective AC: the outputs of matmuls, attention and reduce-scatters are saved,
    # every second matmul and every other op recomputed (torchtitan distributed/activation_checkpoint.py)
    SELECTIVE_OP = "selective_op"
    # each layer keeps its input only (Megatron full, torchtitan full, DeepSpeed and HF checkpointing);
    # with Layout.recompute_num_layers only that many layers of each (virtual) stage
    FULL = "full"


class RecomputeModule(StrEnum):
    """What Megatron-Core's selective recompute checkpoints (--recompute-modules; core 0.13+,
    megatron/core/transformer/transformer_layer.py, multi_latent_attention.py, moe/moe_layer.py,
    moe/experts.py)."""

    CORE_ATTN = "core_attn"  # attention's core (the default): QK^T, softmax, AV
    MLP = "mlp"  # a dense layer's whole MLP (MoE layers ignore it)
    MOE = "moe"  # an MoE layer's whole MoE block: router, dispatch, experts, combine
    MOE_ACT = "moe_act"  # the routed experts' activation function (its output is not kept)
    SHARED_EXPERTS = "shared_experts"  # the shared experts' MLP
    # the norms Transformer Engine does not fuse into the next Linear (IdentityOp otherwise): the
    # MLA input norm and the MoE pre-MLP norm; their outputs are discarded and recomputed
    LAYERNORM = "layernorm"
    MLA_UP_PROJ = "mla_up_proj"  # MLA's q/kv up-projections and RoPE: the decompressed q, k, v


class Compile(StrEnum):
    """What torch.compile (inductor) compiles: fused pointwise kernels (memory traffic, launches) and
    a compiled backward that recomputes inside one graph in the layers; a fused cross-entropy (no
    fp32 logits) in the loss."""

    NONE = "none"
    # each decoder layer (torchtitan --compile.components model; torchtitan before 2025 compiled
    # the TransformerBlocks only)
    MODEL = "model"
    # the layers and the loss: torchtitan --compile.enable (components model and loss, its default),
    # HF Trainer torch_compile and accelerate's dynamo backend (HF models compute the loss in forward)
    MODEL_AND_LOSS = "model_and_loss"


class MoeDispatcher(StrEnum):
    """How Megatron-Core moves an MoE layer's routed tokens to the expert-parallel ranks and back
    (--moe-token-dispatcher-type, megatron/core/transformer/transformer_config.py @d98e8a6)."""

    # NCCL all-to-all of every routed copy (top_k per token), permuted before and sorted by local
    # expert after (token_dispatcher.py MoEAlltoAllTokenDispatcher)
    ALLTOALL = "alltoall"
    # flex with the HybridEP backend (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend
    # hybridep, as NVIDIA's Megatron-Bridge recipes run it): one fused permute + dispatch kernel that
    # sends a token once per destination node over RDMA and forwards it over NVLink to the GPUs there
    # (deepseek-ai/DeepEP hybrid-ep branch; DeepSeek-V3 report §3.2.2)
    FLEX = "flex"


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """How one job is split over the cluster. FSDP FULL_SHARD is zero_stage 3, SHARD_GRAD_OP 2;
    Megatron's distributed optimizer is zero_stage 1. Cross-checks against the model and cluster
    live in ``service.estimator.validate``."""

    framework: Framework = Framework.DEEPSPEED
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    # Expert tensor parallelism: the routed experts' Linear layers split over etp ranks instead of
    # tp (Megatron --expert-tensor-parallel-size, "MoE parallel folding": the expert grid is
    # etp x ep x expert-dp over the tp x cp x dp ranks of a pipeline stage); None: tp, Megatron's default.
    etp: int | None = None
    sequence_parallel: bool = False
    zero_stage: int = 0
    offload_optimizer: Offload = Offload.NONE
    offload_params: Offload = Offload.NONE
    recompute: Recompute = Recompute.NONE
    # With recompute full: only the first N layers of each (virtual) pipeline stage are recomputed,
    # the others keep every activation (Megatron --recompute-method block --recompute-num-layers N);
    # None: every layer.
    recompute_num_layers: int | None = None
    # With recompute full: only every N-th decoder layer is checkpointed, the others keep every
    # activation (torchtitan's selective layer AC, activation_checkpoint.selective_ac_option N, up to
    # 0.2); None: every layer.
    recompute_every_n_layers: int | None = None
    # With recompute selective (Megatron): the modules recomputed (--recompute-modules); None:
    # Megatron's default, core_attn.
    recompute_modules: tuple[RecomputeModule, ...] | None = None
    micro_batch_size: int = 1
    virtual_pipeline_stages: int = 1
    gradient_accumulation_steps: int | None = None  # derived: global = micro x accum x dp
    activation_offload: bool = False
    optimizer_in_backward: bool = False
    chunked_loss: bool = False
    torch_compile: Compile = Compile.NONE
    fsdp_hybrid_shard: bool = False  # HYBRID_SHARD: shard inside a node, replicate across nodes
    # HSDP's replicas (with fsdp_hybrid_shard): dp splits into dp_replicate groups of dp / dp_replicate
    # ranks, each sharding the states over those x cp (torchtitan's
    # --parallelism.data_parallel_replicate_degree, Accelerate's dp_replicate_size); None: one shard
    # group per node (the GPUs left after tp there)
    dp_replicate: int | None = None
    # TP all-gathers / reduce-scatters pipelined with the GEMMs: Megatron --tp-comm-overlap (Transformer
    # Engine userbuffers); FSDP: torchtitan's Async TP (inductor's micro-pipelined TP, compiled only)
    tp_comm_overlap: bool = False
    # Megatron --overlap-moe-expert-parallel-comm: the combined 1F1B schedule runs one micro-batch's
    # forward beside another's backward, each one's EP all-to-alls under the other's compute
    moe_a2a_overlap: bool = False
    # Megatron's MoE token dispatcher (``MoeDispatcher``): alltoall, or flex (HybridEP's deduplicating
    # dispatch, Hopper / Blackwell only)
    moe_dispatcher: MoeDispatcher = MoeDispatcher.ALLTOALL
    # Token-drop MoE: every routed expert takes at most capacity = factor x its mean load of each
    # micro-batch, padded to exactly that (Megatron --moe-expert-capacity-factor with
    # --moe-pad-expert-input-to-capacity, Megatron-Bridge's token-drop recipes: 1.0; DeepSpeed MoE's
    # capacity_factor with drop_tokens, which its dense [experts, capacity, h] dispatch pads). None:
    # the framework's default: dropless for Megatron-Core; 1.0 for DeepSpeed with ep > 1, whose script
    # builds deepspeed.moe.layer.MoE layers (capacity_factor=1.0, drop_tokens=True); dropless for
    # DeepSpeed at ep = 1, whose script trains the model's own MoE block (Hugging Face's expert loop,
    # as FSDP does).
    moe_capacity_factor: float | None = None
    overlap_grad_reduce: bool | None = None  # DP reduce under backward; None: the framework default
    # Megatron, bf16/fp8: the gradient buffer (main grads) and its DP reduce-scatter in fp32 (4 B) or
    # in bf16 (2 B, --grad-reduce-in-bf16). None: NVIDIA's recipes' bf16 (model_states.megatron_grads_in_fp32;
    # Megatron-LM's own default for bf16 is fp32: True)
    # (megatron/training/arguments.py validate_args, "bfloat16 requires gradient accumulation and
    # all-reduce to be done in fp32"); Megatron-Bridge's performance recipes set False.
    grad_reduce_in_fp32: bool | None = None
    # Megatron, fp8 with the distributed optimizer: --fp8-param-gather, the GEMM weights kept as fp8
    # (no bf16 copy; Transformer Engine's fp8 data + its transpose, 2 B) and all-gathered in fp8
    # after the step. Megatron-Bridge's fp8 precision configs set it (mixed_precision.py).
    fp8_param_gather: bool | None = None  # None: on for Megatron fp8 with the distributed optimizer
    # Megatron, distributed optimizer, AdamW: --use-precision-aware-optimizer, Transformer Engine's
    # FusedAdam holding the master as the fp32 weights' low 16 bits beside the bf16 ones
    # (store_param_remainders: 2 B, not 4) and stepping the main grads as they are (no fp32 copy).
    # None: on for bf16, as NVIDIA's performance recipes set it (model_states.
    # megatron_precision_aware_optimizer); Megatron-LM's own default is off: False runs that.
    precision_aware_optimizer: bool | None = None
    # Decoder layers of each of the pp x v virtual pipeline stages, in model order; None: the
    # split ``service.estimator.pipeline.stage_layers`` derives (even, or embedding and loss
    # counted as a layer each).
    pipeline_layers: tuple[int, ...] | None = None
    pipeline_account_for_embedding: bool = False  # the embedding counts as a layer in the split
    pipeline_account_for_loss: bool = False  # the output layer and loss count as a layer

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "ep", "micro_batch_size", "virtual_pipeline_stages"):
            _require_positive(InvalidLayout, name, getattr(self, name))
        if self.zero_stage not in (0, 1, 2, 3):
            raise InvalidLayout(
                f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}",
                rule="zero_stage",
                field="zero_stage",
            )
        if self.gradient_accumulation_steps is not None:
            _require_positive(InvalidLayout, "gradient_accumulation_steps", self.gradient_accumulation_steps)
        if self.recompute_num_layers is not None:
            _require_positive(InvalidLayout, "recompute_num_layers", self.recompute_num_layers)
        if self.recompute_every_n_layers is not None:
            _require_positive(InvalidLayout, "recompute_every_n_layers", self.recompute_every_n_layers)
        if self.etp is not None:
            _require_positive(InvalidLayout, "etp", self.etp)
        if self.dp_replicate is not None:
            _require_positive(InvalidLayout, "dp_replicate", self.dp_replicate)
        if self.moe_capacity_factor is not None and not 0 < self.moe_capacity_factor < math.inf:
            raise InvalidLayout(
                f"moe_capacity_factor must be finite and > 0, got {self.moe_capacity_factor}",
                rule="moe_capacity_factor",
                field="moe_capacity_factor",
            )
        # the estimator compares enum fields by identity (``is Framework.MEGATRON``): a plain string
        # would pass as "not that member" everywhere, e.g. "alltoall" as the flex dispatcher. One
        # C-level pass (a Layout is built for every layout a search considers).
        if tuple(map(type, _LAYOUT_ENUM_VALUES(self))) != _LAYOUT_ENUM_TYPES:
            for name, kind in LAYOUT_ENUM_FIELDS:
                if type(getattr(self, name)) is not kind:
                    why = f"{name} must be a {kind.__name__}, got {getattr(self, name)!r}"
                    raise InvalidLayout(why, rule="type", field=name)
        modules = self.recompute_modules
        if modules is not None and type(modules) is not tuple:  # inline: a Layout per layout searched
            _require_tuple(InvalidLayout, "recompute_modules", modules)
        if self.pipeline_layers is not None and type(self.pipeline_layers) is not tuple:
            _require_tuple(InvalidLayout, "pipeline_layers", self.pipeline_layers)
        if modules is not None and (not modules or len(set(modules)) != len(modules)):
            raise InvalidLayout(
                "recompute_modules must name each module once, at least one; got "
                f"{[module.value for module in modules]}",
                rule="recompute_modules",
                field="recompute_modules",
            )
        if self.pipeline_layers is not None and any(layers < 0 for layers in self.pipeline_layers):
            raise InvalidLayout(
                f"pipeline_layers must be >= 0 each, got {list(self.pipeline_layers)}",
                rule="non_negative",
                field="pipeline_layers",
            )

    def accumulation_steps(self, global_batch_size: int) -> int:
        """Micro-batches per data-parallel rank per step: global = micro x accumulation x dp."""
        per_step = self.micro_batch_size * self.dp
        if self.gradient_accumulation_steps is not None:
            product = per_step * self.gradient_accumulation_steps
            if product != global_batch_size:
                raise InvalidLayout(
                    f"micro_batch_size ({self.micro_batch_size}) x gradient_accumulation_steps "
                    f"({self.gradient_accumulation_steps}) x dp ({self.dp}) = {product} "
                    f"!= global_batch_size ({global_batch_size})",
                    rule="global_batch",
                    field="gradient_accumulation_steps",
                )
            return self.gradient_accumulation_steps
        if global_batch_size % self.dp:  # no micro-batch can split it: the degree is what to change
            raise InvalidLayout(
                f"global_batch_size ({global_batch_size}) is not divisible by dp ({self.dp}): each "
                "data-parallel rank trains whole sequences, so no micro_batch_size splits it; give a dp "
                "that divides the global batch, or a global_batch_size that dp divides",
                rule="global_batch",
                field="dp",
            )
        if global_batch_size % per_step:
            raise InvalidLayout(
                f"global_batch_size ({global_batch_size}) is not divisible by micro_batch_size "
                f"({self.micro_batch_size}) x dp ({self.dp}) = {per_step}",
                rule="global_batch",
                field="micro_batch_size",
            )
        return global_batch_size // per_step

    @property
    def recomputes_some_layers(self) -> bool:
        """Only some layers recompute (``recompute_num_layers`` or ``recompute_every_n_layers``)."""
        return self.recompute_num_layers is not None or self.recompute_every_n_layers is not None

    @property
    def selective_modules(self) -> frozenset[RecomputeModule]:
        """The modules Megatron's selective recompute checkpoints; empty under any other policy."""
        if self.recompute is not Recompute.SELECTIVE:
            return frozenset()
        return frozenset(self.recompute_modules or (RecomputeModule.CORE_ATTN,))

    @property
    def recomputes_core(self) -> bool:
        """Attention's core is computed again in backward: full recompute, or selective with core_attn."""
        return self.recompute is Recompute.FULL or RecomputeModule.CORE_ATTN in self.selective_modules

    @property
    def expert_tp(self) -> int:
        """The routed experts' tensor-parallel degree: ``etp``, else ``tp``."""
        return self.tp if self.etp is None else self.etp

    @property
    def capacity_factor(self) -> float | None:
        """The routed experts' padded capacity over their mean load: ``moe_capacity_factor``, else the
        default of the MoE layer the launcher runs (DeepSpeed MoE's 1.0 with ep > 1; dropless, None:
        Megatron-Core, and the model's own block under FSDP and under DeepSpeed at ep = 1)."""
        if self.moe_capacity_factor is not None:
            return self.moe_capacity_factor
        return 1.0 if self.framework is Framework.DEEPSPEED and self.ep > 1 else None

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


def enum_fields(cls: type) -> tuple[tuple[str, type[StrEnum]], ...]:
    """(field, enum) of every field of the dataclass ``cls`` typed by an enum."""
    return tuple(
        (name, kind)
        for name, kind in typing.get_type_hints(cls).items()
        if isinstance(kind, type) and issubclass(kind, StrEnum)
    )


# Layout.__post_init__ and ModelSpec.__post_init__ check these fields' types
LAYOUT_ENUM_FIELDS = enum_fields(Layout)
_LAYOUT_ENUM_VALUES = operator.attrgetter(*(name for name, _ in LAYOUT_ENUM_FIELDS))
_LAYOUT_ENUM_TYPES = tuple(kind for _, kind in LAYOUT_ENUM_FIELDS)
_MODEL_ENUM_FIELDS = enum_fields(ModelSpec)
# TrainingSpec's, its optional attention among them
_TRAINING_ENUM_FIELDS: tuple[tuple[str, type[StrEnum]], ...] = (
    *enum_fields(TrainingSpec),
    ("attention", Attention),
)


# ---------------------------------------------------------------- outputs


@dataclass(frozen=True, slots=True, kw_only=True)
class ParameterCounts:
    """Exact parameter counts, as PyTorch's ``sum(p.numel() for p in model.parameters())``
    counts them (tied tensors once)."""

    total: int
    embedding: int  # token embedding (+ learned positions, + embedding norm)
    output: int  # untied lm_head (0 when tied), or an encoder's task head with its biases
    final_norm: int  # 0 for a post-norm encoder
    attention_per_layer: int  # q, k, v, o projections and their biases
    norms_per_layer: int  # the layer's norms (replicated under tensor parallelism)
    dense_layers: int  # layers with a dense MLP
    dense_mlp_per_layer: int
    moe_layers: int = 0  # layers whose MLP is a mixture of experts
    experts_per_moe_layer: int = 0  # all routed experts of one MoE layer
    router_per_moe_layer: int = 0
    shared_experts_per_moe_layer: int = 0  # shared experts and their gate
    active_per_token: int = 0  # total minus the routed experts a token does not visit
    largest_module: int = 0  # the largest single nn.Module's own parameters (DeepSpeed's L)

    @property
    def layers_total(self) -> int:
        """All parameters inside the decoder layers."""
        return self.total - self.embedding - self.output - self.final_norm


class MemoryStatistic(StrEnum):
    """Which per-GPU memory figure a number is: what PyTorch and the driver report, from the least
    inclusive to the most (at one moment allocated <= reserved <= device used)."""

    # torch.cuda.max_memory_allocated / memory_stats()["allocated_bytes.all.peak"]: live tensors
    ALLOCATED = "allocated"
    # torch.cuda.max_memory_reserved / memory_stats()["reserved_bytes.all.peak"]: the caching
    # allocator's segments (cudaMalloc'd), tensors + the free blocks it keeps cached
    RESERVED = "reserved"
    # nvidia-smi's "Memory-Usage" of the process, torch.cuda.mem_get_info's total - free: the reserved
    # segments + the CUDA context + what NCCL and Transformer Engine's userbuffers allocate outside
    # PyTorch's allocator
    DEVICE_USED = "device_used"


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Bytes on one GPU (the most-loaded rank), by component; ``peak_allocated_bytes``,
    ``peak_reserved_bytes`` and ``device_used_bytes`` sum them as PyTorch and nvidia-smi count."""

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    buffers: int  # communication buckets, gathered ZeRO-3 params, temporaries
    fragmentation: int  # the caching allocator's cached free blocks at the peak: reserved - allocated
    cuda_context: int  # CUDA context with its kernel images and library handles, outside the allocator
    nccl_buffers: int  # NCCL's channel buffers of every communicator, outside the allocator
    # Transformer Engine's userbuffers under Megatron's --tp-comm-overlap, outside the allocator
    tp_comm_buffers: int = 0

    @property
    def outside_allocator(self) -> int:
        """What the process holds outside PyTorch's allocator: CUDA context, NCCL and TE userbuffers."""
        return self.cuda_context + self.nccl_buffers + self.tp_comm_buffers

    @property
    def overhead(self) -> int:
        """Everything but tensors: fragmentation + what is outside the allocator."""
        return self.fragmentation + self.outside_allocator

    @property
    def peak_allocated_bytes(self) -> int:
        """Tensors alive at the peak: model states, activations, buffers."""
        return self.parameters + self.gradients + self.optimizer_states + self.activations + self.buffers

    @property
    def peak_reserved_bytes(self) -> int:
        """The caching allocator's segments at the peak: tensors + fragmentation."""
        return self.peak_allocated_bytes + self.fragmentation

    @property
    def device_used_bytes(self) -> int:
        """What nvidia-smi shows for the process: reserved + CUDA context + NCCL buffers + userbuffers."""
        return self.peak_reserved_bytes + self.outside_allocator

    @property
    def total(self) -> int:
        """``device_used_bytes``: the figure the fit compares with the card's capacity."""
        return self.device_used_bytes

    def statistic(self, which: MemoryStatistic) -> int:
        """The figure named ``which``."""
        if which is MemoryStatistic.ALLOCATED:
            return self.peak_allocated_bytes
        if which is MemoryStatistic.RESERVED:
            return self.peak_reserved_bytes
        return self.device_used_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class StageMemory:
    """One evaluated pipeline rank's per-GPU memory (the first, the last, and each rank whose layer
    count differs from those before it: the others never need more)."""

    rank: int
    memory: MemoryBreakdown


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    per_gpu: MemoryBreakdown  # the most-loaded of ``per_stage``
    capacity_bytes: int
    cpu_per_node_bytes: int
    nvme_per_node_bytes: int
    per_stage: tuple[StageMemory, ...] = ()
    # the statistic the fit compares with ``capacity_bytes``: an out-of-memory error comes when the
    # device runs out, whoever holds the memory (the allocator, the context or NCCL)
    fit_statistic: MemoryStatistic = MemoryStatistic.DEVICE_USED

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.per_gpu.statistic(self.fit_statistic)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeBreakdown:
    """Seconds of one optimizer step on the slowest rank."""

    compute_s: float
    recompute_s: float = 0.0
    tp_comm_s: float = 0.0
    cp_comm_s: float = 0.0
    ep_comm_s: float = 0.0
    pp_bubble_s: float = 0.0
    pp_comm_s: float = 0.0
    dp_comm_exposed_s: float = 0.0
    offload_s: float = 0.0
    optimizer_s: float = 0.0

    @property
    def step_s(self) -> float:
        return step_total_s(
            self.compute_s,
            self.recompute_s,
            self.tp_comm_s,
            self.cp_comm_s,
            self.ep_comm_s,
            self.pp_bubble_s,
            self.pp_comm_s,
            self.dp_comm_exposed_s,
            self.offload_s,
            self.optimizer_s,
        )


def step_total_s(
    compute_s: float,
    recompute_s: float,
    tp_comm_s: float,
    cp_comm_s: float,
    ep_comm_s: float,
    pp_bubble_s: float,
    pp_comm_s: float,
    dp_comm_exposed_s: float,
    offload_s: float,
    optimizer_s: float,
) -> float:
    """A step's seconds: its parts, in ``TimeBreakdown`` order, added left to right."""
    return (
        compute_s
        + recompute_s
        + tp_comm_s
        + cp_comm_s
        + ep_comm_s
        + pp_bubble_s
        + pp_comm_s
        + dp_comm_exposed_s
        + offload_s
        + optimizer_s
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeEstimate:
    breakdown: TimeBreakdown
    tokens_per_s: float
    # model FLOPs (no recompute; attention's core over the causal triangle, Megatron-LM's count:
    # flops.model_flops_per_token), 1e12 FLOP/s per GPU
    tflops_per_gpu: float
    mfu: float  # model FLOPs / (step x GPUs x dense peak of the precision)
    # what the kernels execute, recompute included (flops.hardware_flops_per_step), 1e12 FLOP/s per GPU
    hardware_tflops_per_gpu: float
    hfu: float  # <= 1: the time model runs those FLOPs at rates <= the dense peak

    @property
    def step_s(self) -> float:
        return self.breakdown.step_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    fits: bool
    memory: MemoryEstimate
    time: TimeEstimate | None = None
    max_micro_batch_size: int | None = None  # largest that fits; 0: none does; None: not computed
    max_seq_len: int | None = None
    time_to_train_s: float | None = None
    warnings: tuple[str, ...] = field(default_factory=tuple)
    assumptions: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """One chosen layout for a job: what the launchers render."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: Layout
    estimate: Estimate | None = None
    rationale: tuple[str, ...] = field(default_factory=tuple)
