"""Measure the activation bytes autograd saves in one training forward of tiny BERT encoders.

The encoders' counterpart of ``validation/activations.py`` (whose recorder, layer scopes and storage
rules it reuses: saved storages deduplicated by data pointer, counted whole, parameters and scalars
left out, only what the graph still holds after the forward). Each case builds a randomly
initialised ``transformers`` BertFor* model (one per head: masked LM, question answering, sequence
classification) on the CPU in train mode, dropout probabilities 0 (on the CPU, dropout keeps its
mask in the input's dtype, not the 1-byte mask CUDA's fused kernel keeps, so masks are not measured
here), and runs one forward with the head's labels. Two depths give the per-layer bytes and the rest
(embeddings, the head, the loss). ``validation/data/encoder_activations.json`` holds the result;
``tests/estimator/test_encoders.py`` compares ``service.estimator.activations`` with it.

    python -m validation.encoder_activations            # rewrites the data file
    python -m validation.encoder_activations --check    # measures again, compares, writes nothing
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import transformers

from validation.activations import _layer_scopes, _Recorder, _storage_ptr, _unpack, decoder_layers

OUT = Path(__file__).parent / "data" / "encoder_activations.json"
CONFIG: dict[str, Any] = {
    "model_type": "bert",
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 128,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
HEADS = ("BertForMaskedLM", "BertForQuestionAnswering", "BertForSequenceClassification")
BATCH, SEQ_LEN, DEPTHS = 2, 64, (1, 2)
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def saved_bytes(architecture: str, num_layers: int, attention: str, dtype: str) -> int:
    """Bytes the graph holds for backward after one training forward with the head's labels."""
    fields = {k: v for k, v in CONFIG.items() if k != "model_type"}
    config = transformers.BertConfig(**fields, num_hidden_layers=num_layers)
    torch.manual_seed(0)
    model = getattr(transformers, architecture)._from_config(
        config, dtype=_DTYPES[dtype], attn_implementation=attention
    )
    model.train()
    recorder = _Recorder(parameter_ptrs=frozenset(_storage_ptr(p) for p in model.parameters()))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, config.vocab_size, (BATCH, SEQ_LEN), generator=generator)
    if architecture.endswith("MaskedLM"):
        labels: dict[str, torch.Tensor] = {"labels": ids}
    elif architecture.endswith("QuestionAnswering"):
        labels = {
            "start_positions": torch.ones(BATCH, dtype=torch.long),
            "end_positions": 3 * torch.ones(BATCH, dtype=torch.long),
        }
    else:
        labels = {"labels": torch.ones(BATCH, dtype=torch.long)}
    with (
        _layer_scopes(decoder_layers(model, num_layers), recorder),
        torch.autograd.graph.saved_tensors_hooks(recorder.pack, _unpack),
    ):
        output = model(input_ids=ids, token_type_ids=torch.zeros_like(ids), **labels)
    held = recorder.held()  # while output keeps the graph alive
    assert torch.isfinite(output.loss)
    return sum(entry.nbytes for entry in held.values())


def measure() -> list[dict[str, Any]]:
    records = []
    for architecture in HEADS:
        for attention in ("eager", "sdpa"):
            for dtype in ("bfloat16", "float32"):
                shallow, deep = (saved_bytes(architecture, depth, attention, dtype) for depth in DEPTHS)
                per_layer = (deep - shallow) // (DEPTHS[1] - DEPTHS[0])
                head = architecture.removeprefix("BertFor").lower()
                records.append(
                    {
                        "id": f"bert-{head}-{dtype}-{attention}-b{BATCH}-s{SEQ_LEN}",
                        "architecture": architecture,
                        "attention": attention,
                        "dtype": dtype,
                        "batch": BATCH,
                        "seq_len": SEQ_LEN,
                        "per_layer_bytes": per_layer,
                        "outside_layers_bytes": shallow - DEPTHS[0] * per_layer,
                    }
                )
    return records


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.encoder_activations")
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = parser.parse_args(argv)
    document = {
        "generated_by": "python -m validation.encoder_activations",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "config": CONFIG,
        "cases": measure(),
    }
    if args.check:
        committed = json.loads(OUT.read_text(encoding="utf-8"))
        same = committed["cases"] == document["cases"]
        print("no difference" if same else "measurements differ from the committed file")
        return 0 if same else 1
    OUT.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
