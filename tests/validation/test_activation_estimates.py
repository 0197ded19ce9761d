"""The Hugging Face activation formula, per layer kind, against the committed measurements.

The report allows 10%; for the families below every tensor autograd keeps is modelled, so the
estimate of one decoder layer of each kind must match the measurement to the byte. A change to
``service.estimator.activations`` that breaks this must say which saved tensor it now counts
differently (and the measurement must show it).
"""

from __future__ import annotations

from typing import Any

import pytest

from validation.cases import activation_document, activation_kind_estimates, activation_rows, cpu_only_reason

# families whose every saved tensor per layer the HF path models (cases whose id starts so)
EXACT_FAMILIES = (
    "llama-",
    "mistral-",
    "qwen2-",
    "gemma-",
    "qwen3-",
    "qwen3-moe-",
    "deepseek-v3-",
    "gemma3-",
    "gpt-oss-",
    "olmo2-",
    "mixtral-",
)


def _cases(*prefixes: str) -> list[dict[str, Any]]:
    """The cases of these families whose CPU kernel is CUDA's (``cpu_only_reason``: a grouped-query
    fp32 SDPA ran the CPU's flash kernel, where CUDA runs the math one, which saves what eager
    attention does: tests/estimator/test_peak_moments.py checks that against the eager cases here)."""
    return [
        c
        for c in activation_document()["cases"]
        if c["id"].startswith(prefixes) and cpu_only_reason(c) is None
    ]


@pytest.mark.parametrize("case", _cases(*EXACT_FAMILIES), ids=lambda c: c["id"])
def test_one_layer_of_each_kind_is_exact(case: dict[str, Any]) -> None:
    assert activation_kind_estimates(case) == case["per_kind_bytes"]


def test_new_families_are_measured_with_their_layer_kinds() -> None:
    kinds = {c["model_type"]: set(c["per_kind_bytes"]) for c in activation_document()["cases"]}
    assert kinds["qwen3"] == {"full/dense"}
    assert kinds["qwen3_moe"] == {"full/dense", "full/moe"}  # mlp_only_layers
    assert kinds["deepseek_v3"] == {"full/dense", "full/moe"}  # first_k_dense_replace
    assert kinds["gemma3_text"] == {"sliding/dense", "full/dense"}
    assert kinds["gpt_oss"] == {"sliding/moe", "full/moe"}
    assert kinds["olmo2"] == {"full/dense"}


def test_mixed_kind_cases_get_a_row_per_kind() -> None:
    rows = [r for r in activation_rows() if r.case_id == "deepseek-v3-bfloat16-sdpa-b2-s64"]
    quantities = [r.quantity for r in rows]
    assert "bytes per full/dense layer" in quantities
    assert "bytes per full/moe layer" in quantities
    assert all(r.ok for r in rows)
    # MLA's miniature keeps qk head dim == v head dim, so the CPU took the flash kernel CUDA takes
    assert "v_head_dim" in rows[0].note
