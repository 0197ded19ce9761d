"""Measure the activation bytes autograd saves in one training forward of real transformers models.

The measured truth for issue 3 ("estimates within 10% of measured") lives in
``validation/data/activations.json``. Regenerate it (about 30 s on one CPU thread) with::

    python -m validation.activations --all

CI re-measures the cases marked ``ci`` and fails when any value moved by more than 1%::

    python -m validation.activations --ci --check

What is measured
----------------
Each case builds a small, randomly initialised ``AutoModelForCausalLM`` on the CPU in train mode
(dropout probabilities 0, ``use_cache=False``) and runs one forward with ``labels=input_ids``, so the
loss (which HF computes on logits upcast to fp32) is part of the graph. Inside
``torch.autograd.graph.saved_tensors_hooks`` every tensor autograd saves for backward is recorded by
its untyped storage:

* deduplicated by the storage's ``data_ptr`` (views of one buffer count once);
* counted as the storage's full ``nbytes``, not the viewed region: the whole buffer stays allocated
  as long as any saved view of it does, so this is the memory that backward actually holds;
* storages of parameters are excluded, and so are 0-dim tensors (scalars such as scaling factors);
* only storages a graph node still holds when the forward returns: a node whose outputs were all
  dropped in the forward (DeepSeek-V3's group-limited top-k, whose values are discarded) frees
  what it saved, and a later saved tensor may reuse that address (it is then a new storage).

Two depths with otherwise identical settings give the per-layer cost and the rest::

    per_layer_bytes      = (total(L2) - total(L1)) / (L2 - L1)
    outside_layers_bytes = total(L1) - L1 * per_layer_bytes   # embeddings, rotary tables, masks,
                                                              # final norm, lm head input, loss

Tensors built once and shared by all layers (rotary cos/sin) are saved once and so
land in ``outside_layers_bytes``; each layer's input, saved by the layer's first norm, is per layer.

Models whose layers differ (sliding and full attention, dense and MoE MLPs) are also measured per
layer kind. Each storage belongs to the layer whose forward saved it first (``layer_bytes``, the
L2 run); ``layer_kinds`` names every layer ``attention/mlp`` (``sliding/dense``, ``full/moe``,
see ``layer_kind``) and ``per_kind_bytes`` is the last layer of each kind (layer 0 also first saves
the shared tensors, so every kind must occur after it). For such a model ``per_layer_bytes`` is
the mean of the layers the deeper run adds, and ``outside_layers_bytes`` absorbs the difference
between those and the shallow run's layers.

``saved_tensors_sample`` lists what the last layer of the L1 run saves (pack order, deduplicated),
with the op that allocated each storage (found with a ``TorchDispatchMode``) and where it was
allocated: ``layer`` (inside this layer), ``previous_layer`` (the layer input), ``outside``
(before the layers: embeddings, rotary tables, masks) or ``unknown`` (made where the dispatch mode
cannot see it, e.g. Falcon's 8-byte index tensors for ``qkv[..., [-2], :]``). All but the
``outside`` entries add up to ``per_layer_bytes`` (of that layer's kind where kinds differ);
``sample_per_layer_bytes`` records that sum as a self-check.

Only ``eager`` and ``sdpa`` attention are measured: ``flash_attention_2`` needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

DATA_PATH = Path(__file__).parent / "data" / "activations.json"
REGENERATE_COMMAND = "python -m validation.activations --all"
SHALLOW_LAYERS = 2  # L1
DEEP_LAYERS = 4  # L2
SAMPLE_CAP = 60  # entries kept in saved_tensors_sample
CHECK_REL_TOL = 0.01
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_SEED = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One measurement: a model family and size, a dtype, an attention kernel and an input shape."""

    id: str
    model_type: str
    config: dict[str, Any]
    dtype: str
    attn_implementation: str
    batch: int
    seq_len: int
    ci: bool = False
    note: str = ""

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"{self.id}: dtype {self.dtype!r} not in {sorted(_DTYPES)}")
        if self.attn_implementation not in ("eager", "sdpa"):
            raise ValueError(f"{self.id}: attn_implementation {self.attn_implementation!r}")


# --- model configs (num_hidden_layers is set per run) ------------------------------------------

_NO_DROPOUT = {"attention_dropout": 0.0}

LLAMA_GQA = {  # h=128, 8 heads of 16, 2 KV heads, SwiGLU ffn 352
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    **_NO_DROPOUT,
}
LLAMA_MHA = {**LLAMA_GQA, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4}
LLAMA_MQA = {**LLAMA_GQA, "num_key_value_heads": 1}
LLAMA_WIDE = {**LLAMA_GQA, "hidden_size": 256, "intermediate_size": 688, "vocab_size": 2048}
MISTRAL = {
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    "sliding_window": 4096,  # wider than any sequence here: plain causal attention
    **_NO_DROPOUT,
}
QWEN2 = {  # q/k/v projections carry a bias
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    "use_sliding_window": False,
    **_NO_DROPOUT,
}
GEMMA = {  # GeGLU (tanh gelu), head_dim 32 != 128/8, tied embeddings, embeddings scaled by sqrt(h)
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True,
    **_NO_DROPOUT,
}
PHI3 = {  # fused qkv_proj and gate_up_proj
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    "original_max_position_embeddings": 1024,
    "pad_token_id": 0,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    **_NO_DROPOUT,
}
GPT2 = {  # learned positions, LayerNorm, fused c_attn, 4h tanh-GeLU MLP
    "n_embd": 128,
    "n_head": 4,
    "n_positions": 1024,
    "vocab_size": 1024,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
}
GPT_NEOX = {  # rotary on 25% of head_dim, parallel residual, two LayerNorms, 4h GeLU
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "rotary_pct": 0.25,
    "use_parallel_residual": True,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
}
FALCON_7B_STYLE = {  # multi-query, parallel attention + MLP on one LayerNorm, no bias, rotary
    "hidden_size": 128,
    "num_attention_heads": 4,
    "multi_query": True,
    "parallel_attn": True,
    "new_decoder_architecture": False,
    "bias": False,
    "alibi": False,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
}
FALCON_NEW = {  # 40B/180B style: grouped KV heads, two LayerNorms (ln_attn, ln_mlp)
    **FALCON_7B_STYLE,
    "new_decoder_architecture": True,
    "multi_query": False,
    "num_kv_heads": 2,
}
MIXTRAL = {  # MoE: 4 experts, top-2
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    "sliding_window": None,
    "router_jitter_noise": 0.0,
    **_NO_DROPOUT,
}
BLOOM = {  # ALiBi, fused qkv, LayerNorm after embeddings, 4h GeLU
    "hidden_size": 128,
    "n_head": 4,
    "vocab_size": 1024,
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
}

# --- families of 2025: per-head q/k norms, MLA, sliding windows, sinks, post-norms ----------------
# Mixed layer kinds are placed so that every kind occurs after layer 0 (see per_kind_bytes).

QWEN3 = {  # q_norm/k_norm RMSNorm(head_dim) per head; head_dim 32 != 128/8
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    "use_sliding_window": False,
    **_NO_DROPOUT,
}
QWEN3_MOE = {  # 4 experts of 96, top-2, no shared expert; layer 1 is a dense MLP (mlp_only_layers)
    **QWEN3,
    "moe_intermediate_size": 96,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [1],
}
DEEPSEEK_V3 = {  # MLA with q_lora_rank; layers 0-1 dense, then MoE: 4 routed (top-2, 2 groups) + 1 shared
    "hidden_size": 128,
    "intermediate_size": 352,
    "moe_intermediate_size": 96,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "first_k_dense_replace": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 96,
    "kv_lora_rank": 64,
    # qk head dim 32 + 16 == v_head_dim: the CPU takes SDPA's flash kernel (no s x s tensors), the
    # path CUDA's kernels take; with unequal dims the CPU falls back to the math kernel.
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 48,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    **_NO_DROPOUT,
}
GEMMA3 = {  # sliding (window 32 < s) and full layers alternating; per-head q/k norms; Gemma RMSNorm
    **GEMMA,
    "sliding_window": 32,
    "sliding_window_pattern": 2,
    "query_pre_attn_scalar": 32,
}
GPT_OSS = {  # attention sinks (eager only), sliding/full alternating, 4 biased experts, clamped SwiGLU
    "hidden_size": 128,
    "intermediate_size": 96,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "sliding_window": 32,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    **_NO_DROPOUT,
}
OLMO2 = {  # no input norm: post-attention and post-feedforward norms; q/k norms over all heads
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 1024,
    "max_position_embeddings": 1024,
    **_NO_DROPOUT,
}


def _family_cases(
    name: str,
    model_type: str,
    config: dict[str, Any],
    shapes: Sequence[tuple[str, str, int, int]],
    note: str = "",
) -> list[Case]:
    return [
        Case(
            id=f"{name}-{dtype}-{attn}-b{batch}-s{seq}",
            model_type=model_type,
            config=config,
            dtype=dtype,
            attn_implementation=attn,
            batch=batch,
            seq_len=seq,
            note=note,
        )
        for dtype, attn, batch, seq in shapes
    ]


_NOTES = {
    "qwen3-moe": "layer 1 dense (mlp_only_layers), the others MoE; grouped_mm experts (the default)",
    "deepseek-v3": (
        "MLA with qk head dim 32 + 16 == v_head_dim 48, so the CPU takes SDPA's flash kernel (no s x s "
        "tensors), as CUDA's flash/mem-efficient kernels do and as we model; with unequal dims (the "
        "real 192 vs 128) the CPU falls back to the math kernel and keeps s x s tensors; layers 0-1 "
        "dense, 2-3 MoE (4 routed experts in 2 groups, top-2, and a shared expert)"
    ),
    "gemma3": (
        "sliding (window 32) and full layers alternate; with s >= window SDPA gets a mask: k, v "
        "repeated to every head and the additive mask kept per sliding layer"
    ),
    "gpt-oss": "attention sinks: eager only (transformers refuses SDPA); sliding and full alternate",
    "olmo2": "no input norm: the residual stream feeds q/k/v; fp32 norm products",
}


_FOUR_WAYS = [(d, a, 2, 64) for d in ("float32", "bfloat16") for a in ("eager", "sdpa")]
_BF16_BOTH = [("bfloat16", "eager", 2, 64), ("bfloat16", "sdpa", 2, 64)]
# batch and sequence sweeps pin the b, s and s^2 terms
_SWEEP = [(a, b, s) for a in ("eager", "sdpa") for b, s in ((1, 64), (1, 128), (4, 256))]

_CI_IDS = frozenset(
    {
        "llama-gqa-float32-eager-b2-s64",
        "llama-gqa-bfloat16-sdpa-b2-s64",
        "llama-gqa-bfloat16-eager-b2-s64",
        "gpt2-float32-sdpa-b2-s64",
        "gpt2-bfloat16-eager-b2-s64",
        "mixtral-bfloat16-sdpa-b2-s64",
        "deepseek-v3-bfloat16-sdpa-b2-s64",  # MLA, dense + MoE layers, nodes freed in the forward
        "gemma3-bfloat16-sdpa-b2-s64",  # sliding + full layers, SDPA with a mask
    }
)


def _all_cases() -> tuple[Case, ...]:
    cases = [
        *_family_cases("llama-gqa", "llama", LLAMA_GQA, _FOUR_WAYS),
        *_family_cases("llama-gqa", "llama", LLAMA_GQA, [("bfloat16", a, b, s) for a, b, s in _SWEEP]),
        *_family_cases("llama-gqa", "llama", LLAMA_GQA, [("float32", "sdpa", 4, 256)]),
        *_family_cases("llama-mha", "llama", LLAMA_MHA, _BF16_BOTH),
        *_family_cases("llama-mqa", "llama", LLAMA_MQA, _BF16_BOTH),
        *_family_cases("llama-wide", "llama", LLAMA_WIDE, [*_BF16_BOTH, ("bfloat16", "sdpa", 1, 128)]),
        *_family_cases("mistral", "mistral", MISTRAL, _BF16_BOTH),
        *_family_cases("qwen2", "qwen2", QWEN2, _BF16_BOTH),
        *_family_cases("gemma", "gemma", GEMMA, [*_BF16_BOTH, ("float32", "sdpa", 2, 64)]),
        *_family_cases("phi3", "phi3", PHI3, _BF16_BOTH),
        *_family_cases("gpt2", "gpt2", GPT2, _FOUR_WAYS),
        *_family_cases("gpt2", "gpt2", GPT2, [("bfloat16", a, b, s) for a, b, s in _SWEEP]),
        *_family_cases("gpt-neox", "gpt_neox", GPT_NEOX, _BF16_BOTH),
        *_family_cases("falcon-7b-style", "falcon", FALCON_7B_STYLE, _BF16_BOTH),
        *_family_cases("falcon-new", "falcon", FALCON_NEW, _BF16_BOTH),
        *_family_cases("mixtral", "mixtral", MIXTRAL, [*_BF16_BOTH, ("float32", "sdpa", 2, 64)]),
        *_family_cases("bloom", "bloom", BLOOM, [(d, "eager", 2, 64) for d in ("float32", "bfloat16")]),
        *_family_cases("qwen3", "qwen3", QWEN3, _BF16_BOTH),
        *_family_cases("qwen3-moe", "qwen3_moe", QWEN3_MOE, _BF16_BOTH, _NOTES["qwen3-moe"]),
        *_family_cases("deepseek-v3", "deepseek_v3", DEEPSEEK_V3, _BF16_BOTH, _NOTES["deepseek-v3"]),
        *_family_cases(
            "gemma3", "gemma3_text", GEMMA3, [*_BF16_BOTH, ("bfloat16", "sdpa", 1, 128)], _NOTES["gemma3"]
        ),
        *_family_cases("gpt-oss", "gpt_oss", GPT_OSS, [("bfloat16", "eager", 2, 64)], _NOTES["gpt-oss"]),
        *_family_cases("olmo2", "olmo2", OLMO2, _BF16_BOTH, _NOTES["olmo2"]),
    ]
    return tuple(
        Case(**{**{f: getattr(c, f) for f in Case.__dataclass_fields__}, "ci": c.id in _CI_IDS})
        for c in cases
    )


CASES: tuple[Case, ...] = _all_cases()


# --- building and running a model ----------------------------------------------------------------


def build_model(case: Case, num_layers: int) -> transformers.PreTrainedModel:
    """A randomly initialised causal LM for ``case`` with ``num_layers`` layers, in train mode."""
    config = transformers.AutoConfig.for_model(
        case.model_type, **case.config, num_hidden_layers=num_layers, use_cache=False
    )
    torch.manual_seed(_SEED)
    model: transformers.PreTrainedModel = transformers.AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        config, dtype=_DTYPES[case.dtype], attn_implementation=case.attn_implementation
    )
    model.train()
    return model


def decoder_layers(model: torch.nn.Module, num_layers: int) -> torch.nn.ModuleList:
    """The model's stack of transformer layers: the first ModuleList of length ``num_layers``."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers:
            return module
    raise LookupError(f"no ModuleList of {num_layers} layers in {type(model).__name__}")


def _storage_ptr(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


@dataclass(frozen=True, slots=True)
class _Allocation:
    """Which op allocated a storage, and in which scope."""

    op: str
    scope: str
    # Storages keep their Python object while they live, so this dies exactly when the storage is
    # freed (after which its address may be reused by an allocation this mode never sees).
    storage: weakref.ref[torch.UntypedStorage]


class _AllocationTracker(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Remembers, per live storage, the op that allocated it and the scope it ran in."""

    def __init__(self, scope: Callable[[], str]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._scope = scope
        self._allocations: dict[int, _Allocation] = {}

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Any = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {_storage_ptr(t) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in pytree.tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            # views, in-place ops and _unsafe_view hand back an input's storage: not an allocation
            if storage.data_ptr() not in inputs:
                allocation = _Allocation(func.overloadpacket.__name__, self._scope(), weakref.ref(storage))
                self._allocations[storage.data_ptr()] = allocation
        return out

    def creator(self, ptr: int) -> tuple[str, str]:
        """(op, scope) of the live storage at ``ptr``; ("?", "?") when it was made outside dispatch."""
        known = self._allocations.get(ptr)
        if known is None or known.storage() is None:
            return "?", "?"
        return known.op, known.scope


class _Packed:
    """What the pack hook hands autograd instead of the tensor: it lives exactly as long as the
    graph node that saved it, so a weak reference to it says whether backward still holds it."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


@dataclass(slots=True)
class _Storage:
    """One saved storage: its size, the layer that first saved it, and its saved references."""

    nbytes: int
    owner: int  # layer index, -1 outside the decoder layers
    holders: list[weakref.ref[_Packed]] = field(default_factory=list)

    def held(self) -> bool:
        return any(holder() is not None for holder in self.holders)


@dataclass
class _Recorder:
    """Pack hook state: saved storages by data_ptr, and the sample of one layer.

    A storage counts when a graph node still holds it after the forward: a node whose outputs
    are all dropped in the forward (e.g. a top-k whose values are discarded) frees what it saved,
    and its address may then be reused by a later saved storage, which is a new one."""

    parameter_ptrs: frozenset[int]
    saved: dict[int, _Storage] = field(default_factory=dict)
    sample_layer: int | None = None
    current_layer: int = -1
    tracker: _AllocationTracker | None = None
    sample: dict[int, dict[str, Any]] = field(default_factory=dict)

    def scope(self) -> str:
        return "outside" if self.current_layer == -1 else f"layer{self.current_layer}"

    def pack(self, tensor: torch.Tensor) -> torch.Tensor | _Packed:
        if tensor is None or tensor.dim() == 0:
            return tensor
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.parameter_ptrs:
            return tensor
        entry = self.saved.get(ptr)
        if entry is None or not entry.held():  # new, or the address of a freed one reused
            entry = self.saved[ptr] = _Storage(storage.nbytes(), self.current_layer)
            self.sample.pop(ptr, None)
        if self.current_layer == self.sample_layer and ptr not in self.sample:
            self.sample[ptr] = self._describe(tensor, ptr, storage.nbytes())
        packed = _Packed(tensor)
        entry.holders.append(weakref.ref(packed))
        return packed

    def held(self) -> dict[int, _Storage]:
        """The saved storages the graph still holds (call while the forward's outputs live)."""
        return {ptr: entry for ptr, entry in self.saved.items() if entry.held()}

    def _describe(self, tensor: torch.Tensor, ptr: int, nbytes: int) -> dict[str, Any]:
        op, scope = self.tracker.creator(ptr) if self.tracker is not None else ("?", "?")
        if scope == "?":
            where = "unknown"
        elif scope == f"layer{self.sample_layer}":
            where = "layer"
        elif self.sample_layer and scope == f"layer{self.sample_layer - 1}":
            where = "previous_layer"
        else:
            where = "outside"
        return {
            "shape": list(tensor.shape),
            "dtype": str(tensor.dtype).removeprefix("torch."),
            "bytes": nbytes,
            "op": op,
            "allocated": where,
        }


@contextmanager
def _layer_scopes(layers: torch.nn.ModuleList, recorder: _Recorder) -> Iterator[None]:
    """Keep ``recorder.current_layer`` in step with the layer whose forward is running."""

    def enter(index: int) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            recorder.current_layer = index

        return hook

    def leave(*_: Any) -> None:
        recorder.current_layer = -1

    handles = []
    for index, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(enter(index)))
        handles.append(layer.register_forward_hook(leave))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _unpack(packed: torch.Tensor | _Packed) -> torch.Tensor:
    return packed.tensor if isinstance(packed, _Packed) else packed


def _inputs(case: Case, vocab_size: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_SEED)
    return torch.randint(0, vocab_size, (case.batch, case.seq_len), generator=generator)


def layer_kind(config: transformers.PretrainedConfig, index: int, layer: torch.nn.Module) -> str:
    """``attention/mlp`` of decoder layer ``index``: its ``config.layer_types`` entry without the
    ``_attention`` suffix (``full`` when the config has none) and ``moe`` when the layer holds routed
    experts (a module with an ``experts`` attribute), else ``dense``."""
    types = getattr(config, "layer_types", None)
    attention = str(types[index]).removesuffix("_attention") if types else "full"
    moe = any(hasattr(module, "experts") for module in layer.modules())
    return f"{attention}/{'moe' if moe else 'dense'}"


@dataclass(frozen=True, slots=True)
class Saved:
    """One training forward: everything saved, and who saved it first."""

    total: int
    sample: list[dict[str, Any]]  # the last layer's saved tensors (with ``sample``)
    layer_bytes: list[int]  # per decoder layer, the storages it was the first to save
    layer_kinds: list[str]  # ``layer_kind`` of every decoder layer


def saved_bytes(case: Case, num_layers: int, *, sample: bool = False) -> Saved:
    """Bytes autograd saves in one training forward; with ``sample``, the last layer's saved tensors."""
    model = build_model(case, num_layers)
    layers = decoder_layers(model, num_layers)
    parameter_ptrs = frozenset(_storage_ptr(p) for p in model.parameters())
    recorder = _Recorder(parameter_ptrs=parameter_ptrs, sample_layer=num_layers - 1 if sample else None)
    input_ids = _inputs(case, model.config.vocab_size)
    recorder.tracker = _AllocationTracker(recorder.scope) if sample else None
    with (
        _layer_scopes(layers, recorder),
        torch.autograd.graph.saved_tensors_hooks(recorder.pack, _unpack),
        recorder.tracker if recorder.tracker is not None else nullcontext(),
    ):
        output = model(input_ids=input_ids, labels=input_ids)
    if not torch.isfinite(output.loss):
        raise RuntimeError(f"{case.id}: loss is {output.loss.item()}")
    held = recorder.held()  # while output keeps the graph alive
    layer_bytes = [0] * num_layers
    for entry in held.values():
        if entry.owner >= 0:
            layer_bytes[entry.owner] += entry.nbytes
    return Saved(
        total=sum(entry.nbytes for entry in held.values()),
        sample=[described for ptr, described in recorder.sample.items() if ptr in held],
        layer_bytes=layer_bytes,
        layer_kinds=[layer_kind(model.config, i, layer) for i, layer in enumerate(layers)],
    )


def _whole(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def per_kind_bytes(saved: Saved) -> dict[str, int]:
    """Bytes of one layer of each kind: the last layer of that kind. Layer 0 also first saves what
    all layers share (rotary tables, masks), so every kind must occur after it."""
    last = {kind: index for index, kind in enumerate(saved.layer_kinds)}
    if 0 in last.values():
        kind = saved.layer_kinds[0]
        raise ValueError(f"layer kind {kind!r} occurs only in layer 0; choose a config that repeats it")
    return {kind: saved.layer_bytes[index] for kind, index in sorted(last.items())}


def measure(case: Case) -> dict[str, Any]:
    """Measure ``case`` at two depths; see the module docstring for the definitions."""
    shallow = saved_bytes(case, SHALLOW_LAYERS, sample=True)
    deep = saved_bytes(case, DEEP_LAYERS)
    per_layer = (deep.total - shallow.total) / (DEEP_LAYERS - SHALLOW_LAYERS)
    sample_per_layer = sum(e["bytes"] for e in shallow.sample if e["allocated"] != "outside")
    return {
        "id": case.id,
        "model_type": case.model_type,
        "config": case.config,
        "dtype": case.dtype,
        "attn_implementation": case.attn_implementation,
        "batch": case.batch,
        "seq_len": case.seq_len,
        "ci": case.ci,
        "note": case.note,
        "per_layer_bytes": _whole(per_layer),
        "outside_layers_bytes": _whole(shallow.total - SHALLOW_LAYERS * per_layer),
        "total_bytes": {str(SHALLOW_LAYERS): shallow.total, str(DEEP_LAYERS): deep.total},
        "layer_kinds": deep.layer_kinds,
        "layer_bytes": deep.layer_bytes,
        "per_kind_bytes": per_kind_bytes(deep),
        "sample_per_layer_bytes": sample_per_layer,
        "saved_tensors_sample": shallow.sample[:SAMPLE_CAP],
        "saved_tensors_sample_truncated": len(shallow.sample) > SAMPLE_CAP,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


# --- data file and CLI ---------------------------------------------------------------------------

_COMPARED = ("per_layer_bytes", "outside_layers_bytes")


def render(records: Sequence[dict[str, Any]]) -> str:
    """The data file's text: pretty, key-sorted JSON, so regenerating it gives a readable diff."""
    document = {
        "regenerate": REGENERATE_COMMAND,
        "definition": (
            "bytes of the distinct storages autograd saves for backward in one training forward "
            "(labels given, so the fp32 loss is included), parameters and 0-dim tensors excluded; "
            f"per_layer = (total(L={DEEP_LAYERS}) - total(L={SHALLOW_LAYERS})) / "
            f"{DEEP_LAYERS - SHALLOW_LAYERS}; outside = total(L={SHALLOW_LAYERS}) - "
            f"{SHALLOW_LAYERS} * per_layer"
        ),
        "cases": list(records),
    }
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def load(path: Path = DATA_PATH) -> dict[str, dict[str, Any]]:
    """Committed records by case id."""
    document = json.loads(path.read_text())
    return {record["id"]: record for record in document["cases"]}


def differences(
    measured: dict[str, Any], committed: dict[str, Any], rel_tol: float = CHECK_REL_TOL
) -> list[str]:
    """Human-readable mismatches between a fresh measurement and the committed record."""
    problems = []
    pairs = [(key, measured[key], committed[key]) for key in _COMPARED]
    pairs += [
        (f"total_bytes[{k}]", v, committed["total_bytes"][k]) for k, v in measured["total_bytes"].items()
    ]
    for name, new, old in pairs:
        if abs(new - old) > rel_tol * max(abs(old), 1):
            problems.append(f"{measured['id']}: {name} measured {new}, committed {old}")
    return problems


def _select(ci_only: bool) -> list[Case]:
    return [case for case in CASES if case.ci or not ci_only]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m validation.activations", description=__doc__.split("\n")[0]
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="measure every case and rewrite the data file")
    which.add_argument("--ci", action="store_true", help="measure only the cases marked ci")
    parser.add_argument("--check", action="store_true", help="compare with the data file instead of writing")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]

    committed = load() if args.check else {}
    records, problems = [], []
    for case in _select(args.ci):
        started = time.perf_counter()
        record = measure(case)
        print(
            f"{case.id}: {record['per_layer_bytes']} B/layer, {record['outside_layers_bytes']} B outside "
            f"({time.perf_counter() - started:.1f}s)",
            flush=True,
        )
        records.append(record)
        if args.check:
            if case.id not in committed:
                problems.append(f"{case.id}: not in {DATA_PATH}")
            else:
                problems += differences(record, committed[case.id])
    if args.check:
        for problem in problems:
            print("MISMATCH", problem, file=sys.stderr)
        return 1 if problems else 0
    DATA_PATH.parent.mkdir(parents=True, exist_ok=True)
    DATA_PATH.write_text(render(records))
    print(f"wrote {len(records)} cases to {DATA_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
