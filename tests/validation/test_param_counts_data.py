"""The estimator still reproduces every PyTorch-measured count in validation/data/param_counts.json.

The JSON is written by ``python -m validation.param_counts`` (needs torch and transformers); this
test needs neither, so CI catches a regression in params.py or hf_config.py cheaply.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from service.catalog.models import models
from service.estimator.hf_config import model_from_hf_config
from service.estimator.params import layer_parameters, parameter_counts, stage_parameter_counts
from service.estimator.types import Layout, ModelSpec

DATA = Path(__file__).resolve().parents[2] / "validation" / "data" / "param_counts.json"


@cache
def cases() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(DATA.read_text(encoding="utf-8"))["cases"])


def spec_of(case: dict[str, Any]) -> ModelSpec:
    return model_from_hf_config(case["config"], name=case["case"])


def test_every_recorded_case_was_exact() -> None:
    assert [c["case"] for c in cases() if not c["exact"]] == []


def test_every_preset_was_measured_with_its_current_config() -> None:
    recorded = {c["case"]: c["config"] for c in cases() if c["origin"] == "preset"}
    assert recorded == {slug: preset.config for slug, preset in models().items()}


@pytest.mark.parametrize("case", cases(), ids=lambda c: str(c["case"]))
def test_estimator_reproduces_measured_counts(case: dict[str, Any]) -> None:
    spec = spec_of(case)
    counts = parameter_counts(spec)
    assert counts.total == case["measured_total"]
    assert counts.embedding == case["measured_embedding"]
    assert counts.output == case["measured_output"]
    assert counts.final_norm == case["measured_final_norm"]
    assert counts.largest_module == case["measured_largest_module"]
    assert [layer_parameters(spec, i) for i in range(spec.num_layers)] == case["measured_layers"]


@pytest.mark.parametrize("case", cases(), ids=lambda c: str(c["case"]))
def test_stage_counts_from_measured_pieces(case: dict[str, Any]) -> None:
    # Rebuild each stage from the measured pieces with Megatron's placement and compare.
    spec = spec_of(case)
    layers: list[int] = case["measured_layers"]
    for pp in (p for p in (1, 2, 4) if len(layers) % p == 0):
        per = len(layers) // pp
        expected = [sum(layers[s * per : (s + 1) * per]) for s in range(pp)]
        expected[0] += case["measured_embedding"]
        expected[-1] += case["measured_final_norm"] + case["measured_output"]
        if spec.tied_embeddings and pp > 1:
            expected[-1] += spec.vocab_size * spec.hidden_size  # the output layer's embedding copy
        assert stage_parameter_counts(spec, Layout(pp=pp)) == tuple(expected)
