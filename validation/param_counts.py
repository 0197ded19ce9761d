"""Measure parameter counts with PyTorch and compare them with ``service.estimator.params``.

For every catalog preset and a set of small synthetic configs (one per architectural feature),
build the ``transformers`` model on the meta device (no memory, even for 405B), count
``sum(p.numel() for p in model.parameters())`` and split the named parameters into embedding,
decoder layers, final norm and output layer. Each count must equal ``parameter_counts`` of
``model_from_hf_config`` of the same fields, to the parameter. Multimodal wrappers (``gemma3``,
``llama4``, ``mistral3``) are measured as their language model, built from ``text_config``, as
``model_from_hf_config`` counts them.

Run from the repository root (needs the ``validation`` extra: torch, transformers):

    python -m validation.param_counts          # rewrites validation/data/param_counts.json
    python -m validation.param_counts --check  # CI: measures again, compares, writes nothing

Exits 1 when any case differs from the estimator, or (``--check``) any measurement from the file.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from service.catalog.models import models
from service.estimator.hf_config import model_from_hf_config
from service.estimator.params import layer_parameters, parameter_counts

OUT = Path(__file__).parent / "data" / "param_counts.json"

_LAYER = re.compile(r"\.(?:layers|h|layer)\.(\d+)\.")
_FINAL_NORM = re.compile(r"^[a-z_]+\.(?:norm|ln_f|final_layer_norm|final_layernorm)\.")
# the output layer, or an encoder's task head (BERT's cls / pooler / classifier / qa_outputs,
# RoBERTa's lm_head / classifier)
_OUTPUT = ("lm_head.", "embed_out.", "cls.", "classifier.", "qa_outputs.", "bert.pooler.", "roberta.pooler.")
# Encoders are built as the head class their config's ``architectures`` names (the checkpoints' own
# *ForMaskedLM when it names none), not as a causal LM.
_ENCODER_HEAD_CLASS = {"bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM"}
# Multimodal model_type -> the model_type of its text_config (the model that is counted).
_TEXT_MODEL = {"gemma3": "gemma3_text", "llama4": "llama4_text", "mistral3": "mistral"}

# Small configs, one or two architectural features each; sizes are arbitrary but distinct so a
# swapped term cannot cancel out.
SYNTHETIC: dict[str, dict[str, Any]] = {
    "llama-gqa": {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    },
    "llama-mqa-biases": {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 704,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "vocab_size": 1003,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "llama-head-dim-tied": {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 48,
        "vocab_size": 997,
        "tie_word_embeddings": True,
    },
    "mistral-head-dim": {
        "model_type": "mistral",
        "hidden_size": 320,
        "intermediate_size": 896,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 1000,
    },
    "mistral-default-kv": {
        "model_type": "mistral",
        "hidden_size": 256,
        "intermediate_size": 640,
        "num_hidden_layers": 2,
        "num_attention_heads": 16,
        "vocab_size": 1000,
    },
    "qwen2-qkv-bias": {
        "model_type": "qwen2",
        "hidden_size": 224,
        "intermediate_size": 608,
        "num_hidden_layers": 2,
        "num_attention_heads": 7,
        "num_key_value_heads": 1,
        "vocab_size": 1500,
    },
    "qwen2-tied-default-kv": {
        "model_type": "qwen2",
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 32,
        "vocab_size": 1500,
        "tie_word_embeddings": True,
    },
    "gemma-defaults": {
        "model_type": "gemma",
        "hidden_size": 384,
        "intermediate_size": 1536,
        "num_hidden_layers": 2,
        "num_attention_heads": 16,
        "vocab_size": 2000,
    },
    "gemma-mqa-bias": {
        "model_type": "gemma",
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "vocab_size": 2000,
        "attention_bias": True,
        "tie_word_embeddings": False,
    },
    "gemma2-sandwich-norms": {
        "model_type": "gemma2",
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "vocab_size": 2000,
    },
    "phi3-gqa-partial-rotary": {
        "model_type": "phi3",
        "hidden_size": 384,
        "intermediate_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "vocab_size": 1024,
        "partial_rotary_factor": 0.75,
        "pad_token_id": None,  # Phi3Config's default 32000 lies outside this small vocabulary
    },
    "phi-partial-rotary": {
        "model_type": "phi",
        "hidden_size": 320,
        "intermediate_size": 1280,
        "num_hidden_layers": 2,
        "num_attention_heads": 10,
        "vocab_size": 1200,
        "partial_rotary_factor": 0.4,
    },
    "gpt2-small": {
        "model_type": "gpt2",
        "n_embd": 192,
        "n_layer": 3,
        "n_head": 6,
        "n_positions": 256,
        "vocab_size": 1001,
    },
    "gpt2-n-inner-untied": {
        "model_type": "gpt2",
        "n_embd": 192,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 128,
        "n_inner": 500,
        "vocab_size": 999,
        "tie_word_embeddings": False,
    },
    "gpt-neox-partial-rotary": {
        "model_type": "gpt_neox",
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "vocab_size": 1100,
        "rotary_pct": 0.25,
    },
    "gpt-neox-serial-no-bias-tied": {
        "model_type": "gpt_neox",
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 1100,
        "use_parallel_residual": False,
        "attention_bias": False,
        "tie_word_embeddings": True,
    },
    "falcon-7b-layout": {
        "model_type": "falcon",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "vocab_size": 1300,
    },
    "falcon-serial-mha-bias": {
        "model_type": "falcon",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "vocab_size": 1300,
        "multi_query": False,
        "parallel_attn": False,
        "bias": True,
        "alibi": True,
        "tie_word_embeddings": False,
    },
    "falcon-new-arch": {
        "model_type": "falcon",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 16,
        "num_kv_heads": 4,
        "vocab_size": 1300,
        "new_decoder_architecture": True,
        "ffn_hidden_size": 640,
    },
    "falcon-new-arch-one-ln": {
        "model_type": "falcon",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 16,
        "num_kv_heads": 2,
        "vocab_size": 1300,
        "new_decoder_architecture": True,
        "num_ln_in_parallel_attn": 1,
    },
    "mixtral-moe": {
        "model_type": "mixtral",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    "qwen2-moe-shared-expert": {
        "model_type": "qwen2_moe",
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "vocab_size": 1000,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 192,
        "shared_expert_intermediate_size": 384,
        "decoder_sparse_step": 2,
    },
    "bloom-small": {
        "model_type": "bloom",
        "hidden_size": 256,
        "n_layer": 2,
        "n_head": 8,
        "vocab_size": 1400,
    },
    "qwen2-moe-mlp-only-layers": {
        "model_type": "qwen2_moe",
        "hidden_size": 192,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "num_experts": 5,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 96,
        "shared_expert_intermediate_size": 224,
        "mlp_only_layers": [1, 2],
    },
    "qwen3-untied-head-dim": {
        "model_type": "qwen3",
        "hidden_size": 256,
        "intermediate_size": 704,
        "num_hidden_layers": 3,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 48,
        "vocab_size": 1000,
    },
    "qwen3-default-head-dim-kv-tied-bias": {
        "model_type": "qwen3",
        "hidden_size": 192,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 64,
        "vocab_size": 999,
        "tie_word_embeddings": True,
        "attention_bias": True,
    },
    "qwen3-sliding-window": {
        "model_type": "qwen3",
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 1000,
        "use_sliding_window": True,
        "sliding_window": 64,
        "max_window_layers": 2,
    },
    "qwen3-moe-step-mlp-only": {
        "model_type": "qwen3_moe",
        "hidden_size": 256,
        "intermediate_size": 640,
        "moe_intermediate_size": 96,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 40,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
        "vocab_size": 1003,
    },
    "qwen3-moe-no-head-dim-tied": {
        "model_type": "qwen3_moe",
        "hidden_size": 256,
        "intermediate_size": 640,
        "moe_intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "num_experts": 5,
        "num_experts_per_tok": 1,
        "mlp_only_layers": [0],
        "vocab_size": 1003,
        "tie_word_embeddings": True,
    },
    "deepseek-v2-plain-q-proj": {
        "model_type": "deepseek_v2",
        "hidden_size": 256,
        "intermediate_size": 704,
        "moe_intermediate_size": 88,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 8,
        "n_shared_experts": 2,
        "num_experts_per_tok": 3,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 64,
        "q_lora_rank": None,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 24,
        "vocab_size": 1000,
        "topk_method": "greedy",
    },
    "deepseek-v2-q-lora-biases": {
        "model_type": "deepseek_v2",
        "hidden_size": 256,
        "intermediate_size": 704,
        "moe_intermediate_size": 88,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 8,
        "n_shared_experts": 2,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 0,
        "kv_lora_rank": 64,
        "q_lora_rank": 96,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 24,
        "vocab_size": 1000,
        "attention_bias": True,
        "mlp_bias": True,
        "topk_method": "group_limited_greedy",
        "n_group": 4,
        "topk_group": 2,
    },
    "deepseek-v3-dense-first-mtp": {
        "model_type": "deepseek_v3",
        "hidden_size": 256,
        "intermediate_size": 640,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 16,
        "n_shared_experts": 1,
        "num_experts_per_tok": 4,
        "first_k_dense_replace": 2,
        "n_group": 4,
        "topk_group": 2,
        "kv_lora_rank": 64,
        "q_lora_rank": 96,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "vocab_size": 1000,
        "num_nextn_predict_layers": 1,
    },
    "deepseek-v3-bias-two-shared": {
        "model_type": "deepseek_v3",
        "hidden_size": 192,
        "intermediate_size": 512,
        "moe_intermediate_size": 48,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 6,
        "n_routed_experts": 8,
        "n_shared_experts": 2,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "n_group": 2,
        "topk_group": 1,
        "kv_lora_rank": 32,
        "q_lora_rank": 64,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "vocab_size": 900,
        "attention_bias": True,
    },
    "gemma2-bias-layer-types": {
        "model_type": "gemma2",
        "hidden_size": 192,
        "intermediate_size": 512,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 40,
        "vocab_size": 1500,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "sliding_window": 32,
        "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        "final_logit_softcapping": None,
    },
    "gemma3-text-pattern": {
        "model_type": "gemma3_text",
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 7,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 80,
        "vocab_size": 2000,
        "sliding_window": 32,
        "sliding_window_pattern": 3,
    },
    "gemma3-text-untied-bias": {
        "model_type": "gemma3_text",
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "vocab_size": 1500,
        "tie_word_embeddings": False,
        "attention_bias": True,
    },
    "gemma3-multimodal-wrapper": {
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 192,
            "intermediate_size": 512,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 48,
            "vocab_size": 1200,
            "sliding_window": 16,
        },
    },
    "llama4-interleaved-chunked": {
        "model_type": "llama4_text",
        "hidden_size": 256,
        "intermediate_size": 128,
        "intermediate_size_mlp": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 40,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2,
        "vocab_size": 1000,
        "attention_chunk_size": 64,
    },
    "llama4-all-moe-no-qk-norm-tied": {
        "model_type": "llama4_text",
        "hidden_size": 192,
        "intermediate_size": 96,
        "intermediate_size_mlp": 384,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_local_experts": 3,
        "num_experts_per_tok": 2,
        "use_qk_norm": False,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
    },
    "llama4-wrapper-moe-layers-bias": {
        "model_type": "llama4",
        "text_config": {
            "model_type": "llama4_text",
            "hidden_size": 128,
            "intermediate_size": 64,
            "intermediate_size_mlp": 320,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "num_local_experts": 3,
            "num_experts_per_tok": 1,
            "moe_layers": [0, 3],
            "attention_bias": True,
            "vocab_size": 900,
            "attention_chunk_size": 32,
        },
    },
    "gpt-oss-sinks-expert-biases": {
        "model_type": "gpt_oss",
        "hidden_size": 192,
        "intermediate_size": 160,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "num_local_experts": 6,
        "num_experts_per_tok": 2,
        "vocab_size": 1000,
        "sliding_window": 16,
    },
    "gpt-oss-no-attention-bias": {
        "model_type": "gpt_oss",
        "hidden_size": 128,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "num_local_experts": 3,
        "num_experts_per_tok": 1,
        "vocab_size": 800,
        "attention_bias": False,
    },
    "olmo2-gqa": {
        "model_type": "olmo2",
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    },
    "olmo2-mha-bias-tied": {
        "model_type": "olmo2",
        "hidden_size": 192,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "vocab_size": 1000,
        "attention_bias": True,
        "tie_word_embeddings": True,
    },
    "granite-biases-tied": {
        "model_type": "granite",
        "hidden_size": 256,
        "intermediate_size": 704,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1001,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
        "embedding_multiplier": 12.0,
        "logits_scaling": 8.0,
    },
    "mistral-no-window-head-dim": {
        "model_type": "mistral",
        "hidden_size": 320,
        "intermediate_size": 896,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 1000,
        "sliding_window": None,
    },
    "mistral3-wrapper": {
        "model_type": "mistral3",
        "text_config": {
            "model_type": "mistral",
            "hidden_size": 256,
            "intermediate_size": 640,
            "num_hidden_layers": 2,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 48,
            "vocab_size": 1100,
            "sliding_window": None,
        },
    },
    # BERT / RoBERTa encoders (issue 27's small models): post-LN layers, token types, each head
    "bert-tiny-masked-lm": {
        "model_type": "bert",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 997,
        "max_position_embeddings": 48,
    },
    "bert-tiny-untied-mlm": {
        "model_type": "bert",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 997,
        "max_position_embeddings": 48,
        "type_vocab_size": 3,
        "tie_word_embeddings": False,
    },
    "bert-tiny-sequence-classification": {
        "model_type": "bert",
        "architectures": ["BertForSequenceClassification"],
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 997,
        "max_position_embeddings": 48,
        "num_labels": 5,
    },
    "bert-tiny-question-answering": {
        "model_type": "bert",
        "architectures": ["BertForQuestionAnswering"],
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 997,
        "max_position_embeddings": 48,
    },
    "roberta-tiny-sequence-classification": {
        "model_type": "roberta",
        "architectures": ["RobertaForSequenceClassification"],
        "hidden_size": 96,
        "intermediate_size": 192,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "vocab_size": 1001,
        "max_position_embeddings": 66,
        "type_vocab_size": 1,
        "id2label": {"0": "a", "1": "b", "2": "c"},
    },
    "phi3-gqa-sliding-window": {
        "model_type": "phi3",
        "hidden_size": 320,
        "intermediate_size": 896,
        "num_hidden_layers": 2,
        "num_attention_heads": 10,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "sliding_window": 64,
        "pad_token_id": None,  # Phi3Config's default 32000 lies outside this small vocabulary
    },
}


@dataclass(frozen=True)
class Measured:
    total: int
    embedding: int
    output: int
    final_norm: int
    layers: list[int]
    largest_module: int


def text_model_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields of the model that is counted: a multimodal wrapper's text_config, else all."""
    text_model_type = _TEXT_MODEL.get(fields["model_type"])
    if text_model_type is None:
        return fields
    return {"model_type": text_model_type, **fields["text_config"]}


def measure(fields: dict[str, Any]) -> Measured:
    """Build the model on the meta device and split its named parameters by component."""
    # deep copy: transformers edits nested rope dicts
    config = AutoConfig.for_model(**copy.deepcopy(text_model_fields(fields)))
    with torch.device("meta"):
        if config.model_type in _ENCODER_HEAD_CLASS:
            names = fields.get("architectures") or [_ENCODER_HEAD_CLASS[config.model_type]]
            model = getattr(transformers, names[0])(config)
        else:
            model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    num_layers = config.num_hidden_layers
    layers = [0] * num_layers
    embedding = output = final_norm = 0
    for name, param in model.named_parameters():  # shared (tied) tensors appear once
        n = param.numel()
        if match := _LAYER.search(name):
            layers[int(match.group(1))] += n
        elif name.startswith(_OUTPUT):
            output += n
        elif _FINAL_NORM.match(name):
            final_norm += n
        else:
            embedding += n  # token embedding, learned and token-type positions, embedding norm
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    total = sum(p.numel() for p in model.parameters())
    return Measured(total, embedding, output, final_norm, layers, largest)


def compare(case: str, origin: str, fields: dict[str, Any]) -> dict[str, Any]:
    spec = model_from_hf_config(fields, name=case)
    ours = parameter_counts(spec)
    ours_layers = [layer_parameters(spec, i) for i in range(spec.num_layers)]
    got = measure(fields)
    checks = {
        "total": (got.total, ours.total),
        "embedding": (got.embedding, ours.embedding),
        "output": (got.output, ours.output),
        "final_norm": (got.final_norm, ours.final_norm),
        "per_layer": (got.layers[0], ours_layers[0]),
        "largest_module": (got.largest_module, ours.largest_module),
    }
    mismatches = [key for key, (measured, mine) in checks.items() if measured != mine]
    if got.layers != ours_layers:
        mismatches.append("layers")
    record: dict[str, Any] = {"case": case, "origin": origin, "model_type": fields["model_type"]}
    for key, (measured, mine) in checks.items():
        record[f"measured_{key}"] = measured
        record[f"ours_{key}"] = mine
    record["measured_layers"] = got.layers
    record["all_layers_exact"] = got.layers == ours_layers
    record["exact"] = not mismatches
    record["mismatches"] = mismatches
    record["config"] = fields
    return record


MEASURED_KEYS = (
    "measured_total",
    "measured_embedding",
    "measured_output",
    "measured_final_norm",
    "measured_per_layer",
    "measured_largest_module",
    "measured_layers",
)


def drift(records: list[dict[str, Any]], committed: list[dict[str, Any]]) -> list[str]:
    """Where fresh measurements differ from the committed file (cases, configs or any count)."""
    problems = []
    if [r["case"] for r in records] != [c["case"] for c in committed]:
        problems.append(f"case list differs from {OUT}")
    old = {c["case"]: c for c in committed}
    for record in records:
        previous = old.get(record["case"])
        if previous is None:
            continue
        for key in ("config", *MEASURED_KEYS):
            if record[key] != previous[key]:
                problems.append(f"{record['case']}: {key} measured {record[key]}, committed {previous[key]}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m validation.param_counts", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed data file instead of rewriting it"
    )
    args = parser.parse_args(argv)
    cases = [(slug, "preset", dict(p.config)) for slug, p in models().items()]
    cases += [(case, "synthetic", fields) for case, fields in SYNTHETIC.items()]
    records = []
    for case, origin, fields in cases:
        record = compare(case, origin, fields)
        records.append(record)
        status = "exact" if record["exact"] else f"MISMATCH {record['mismatches']}"
        print(f"{case:32s} {record['model_type']:10s} {record['measured_total']:>18,} {status}")
    bad = [r["case"] for r in records if not r["exact"]]
    print(f"{len(records) - len(bad)}/{len(records)} exact")
    if args.check:
        problems = drift(records, json.loads(OUT.read_text(encoding="utf-8"))["cases"])
        for problem in problems:
            print("DRIFT", problem, file=sys.stderr)
        print(f"{'no' if not problems else len(problems)} difference(s) from {OUT.name}")
        return 1 if bad or problems else 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "generated_by": "python -m validation.param_counts",
        "measured_on": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cases": records,
    }
    OUT.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
