"""The activation-measurement harness: the committed data file is well formed and reproducible.

The data-file checks need only the JSON; the measuring tests skip cleanly without torch
(install the ``validation`` extra to run them).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

DATA_PATH = Path(__file__).resolve().parents[2] / "validation" / "data" / "activations.json"
CI_CASE = "llama-gqa-bfloat16-sdpa-b2-s64"
MIXED_CASE = "gemma3-bfloat16-sdpa-b2-s64"  # sliding and full layers alternate


@pytest.fixture(scope="module")
def committed() -> dict[str, dict[str, Any]]:
    document = json.loads(DATA_PATH.read_text())
    return {record["id"]: record for record in document["cases"]}


@pytest.fixture(scope="module")
def activations() -> ModuleType:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from validation import activations

    activations.transformers.logging.set_verbosity_error()
    return activations


def test_data_file_is_self_consistent(committed: dict[str, dict[str, Any]]) -> None:
    for case_id, record in committed.items():
        totals = record["total_bytes"]
        assert int(totals["4"]) - int(totals["2"]) == 2 * record["per_layer_bytes"], case_id
        assert totals["2"] == record["outside_layers_bytes"] + 2 * record["per_layer_bytes"], case_id
        kinds, per_kind = record["layer_kinds"], record["per_kind_bytes"]
        assert len(kinds) == len(record["layer_bytes"]) == 4, case_id
        last = {kind: index for index, kind in enumerate(kinds)}
        assert per_kind == {kind: record["layer_bytes"][index] for kind, index in last.items()}, case_id
        # the two-depth difference is the mean of the layers the deeper run adds, by their kinds
        assert 2 * record["per_layer_bytes"] == per_kind[kinds[2]] + per_kind[kinds[3]], case_id
        # the sampled layer's own tensors (plus its input) add up to one layer of its kind
        assert record["sample_per_layer_bytes"] == per_kind[kinds[1]], case_id
    ci = [record for record in committed.values() if record["ci"]]
    assert {r["attn_implementation"] for r in ci} == {"eager", "sdpa"}
    assert {r["dtype"] for r in ci} == {"float32", "bfloat16"}
    assert {"llama", "gpt2", "mixtral"} <= {r["model_type"] for r in ci}


def test_data_file_matches_case_list(activations: ModuleType, committed: dict[str, dict[str, Any]]) -> None:
    assert [case.id for case in activations.CASES] == list(committed)
    for case in activations.CASES:
        assert committed[case.id]["config"] == case.config
        assert committed[case.id]["ci"] == case.ci
        assert committed[case.id]["note"] == case.note


def test_measurement_reproduces_committed_record(
    activations: ModuleType, committed: dict[str, dict[str, Any]]
) -> None:
    case = next(case for case in activations.CASES if case.id == CI_CASE)
    assert case.ci
    assert activations.differences(activations.measure(case), committed[CI_CASE]) == []


def test_layer_kinds_are_measured_per_kind(
    activations: ModuleType, committed: dict[str, dict[str, Any]]
) -> None:
    case = next(case for case in activations.CASES if case.id == MIXED_CASE)
    record = activations.measure(case)
    assert activations.differences(record, committed[MIXED_CASE]) == []
    assert record["layer_kinds"] == ["sliding/dense", "full/dense"] * 2
    assert record["per_kind_bytes"] == committed[MIXED_CASE]["per_kind_bytes"]
    # under SDPA a sliding layer (window 32 < s = 64) keeps more than a full one: k and v repeated
    # to all 8 heads (2 x 2 bytes x (256 - 64) per token) and its b x 1 x s x s bf16 mask
    sliding, full = record["per_kind_bytes"]["sliding/dense"], record["per_kind_bytes"]["full/dense"]
    tokens = case.batch * case.seq_len
    assert sliding - full == tokens * 4 * (256 - 64) + 2 * case.batch * case.seq_len**2


def test_storages_freed_during_the_forward_do_not_count(activations: ModuleType) -> None:
    torch = activations.torch
    recorder = activations._Recorder(parameter_ptrs=frozenset())
    x = torch.randn(4, 8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(recorder.pack, activations._unpack):
        kept = x.exp()  # ExpBackward keeps its fp32 output: 128 bytes
        indices = (x * 2).topk(2).indices  # TopkBackward's int64 indices die with its dropped values
    assert not indices.requires_grad
    assert [entry.nbytes for entry in recorder.held().values()] == [4 * 8 * 4]
    kept.sum().backward()  # the kept graph still unpacks what it saved
    assert x.grad is not None


def test_check_flags_a_drift_over_one_percent(
    activations: ModuleType, committed: dict[str, dict[str, Any]]
) -> None:
    record = committed[CI_CASE]
    drifted = {**record, "per_layer_bytes": record["per_layer_bytes"] * 1.02}
    assert activations.differences(record, record) == []
    assert len(activations.differences(drifted, record)) == 1


def _tiny(activations: ModuleType, attn: str, batch: int, seq_len: int) -> Any:
    config = {**activations.LLAMA_GQA, "hidden_size": 64, "intermediate_size": 128, "vocab_size": 256}
    return activations.Case(
        id=f"tiny-{attn}-b{batch}-s{seq_len}",
        model_type="llama",
        config=config,
        dtype="bfloat16",
        attn_implementation=attn,
        batch=batch,
        seq_len=seq_len,
    )


def test_per_layer_bytes_grow_with_batch_and_sequence(activations: ModuleType) -> None:
    base = activations.measure(_tiny(activations, "eager", 1, 32))["per_layer_bytes"]
    double_batch = activations.measure(_tiny(activations, "eager", 2, 32))["per_layer_bytes"]
    double_seq = activations.measure(_tiny(activations, "eager", 1, 64))["per_layer_bytes"]
    assert double_batch == 2 * base  # everything in a layer is per sample
    assert double_seq > 2 * base  # eager keeps the s^2 attention probabilities


def test_eager_saves_more_than_sdpa(activations: ModuleType) -> None:
    eager = activations.measure(_tiny(activations, "eager", 1, 64))
    sdpa = activations.measure(_tiny(activations, "sdpa", 1, 64))
    assert eager["per_layer_bytes"] > sdpa["per_layer_bytes"]
    assert eager["outside_layers_bytes"] == sdpa["outside_layers_bytes"]
