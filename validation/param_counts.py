"""Measure parameter counts with PyTorch and compare them with ``service.estimator.params``.

For every catalog preset and a set of small synthetic configs (one per architectural feature),
build the ``transformers`` model on the meta device (no memory, even for 405B), count
``sum(p.numel() for p in model.parameters())`` and split the named parameters into embedding,
decoder layers, final norm and output layer. Each count must equal ``parameter_counts`` of
``model_from_hf_config`` of the same fields, to the parameter.

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

_LAYER = re.compile(r"\.(?:layers|h)\.(\d+)\.")
_FINAL_NORM = re.compile(r"^[a-z_]+\.(?:norm|ln_f|final_layer_norm|final_layernorm)\.")
_OUTPUT = ("lm_head.", "embed_out.")

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
}


@dataclass(frozen=True)
class Measured:
    total: int
    embedding: int
    output: int
    final_norm: int
    layers: list[int]
    largest_module: int


def measure(fields: dict[str, Any]) -> Measured:
    """Build the model on the meta device and split its named parameters by component."""
    config = AutoConfig.for_model(**copy.deepcopy(fields))  # transformers edits nested rope dicts
    with torch.device("meta"):
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
            embedding += n  # token embedding, learned positions, embedding norm
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
