"""Where no change alone fits on the GPU type asked (a shorter sequence on the GPUs given, more of
them, offload), the plan suggests two together: a shorter sequence with offload, or with more of
the same GPU, at the longest halving of the sequence that fits. A user with a 1M-token QLoRA job
got an infeasible plan that listed only what does not work."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.invariants.checks import check_suggestions

LONG_QLORA = {
    "model": {"preset": "llama-3.1-70b"},
    "cluster": {"gpu": "rtx-4090-24gb", "num_nodes": 1, "gpus_per_node": 1},
    "training": {"seq_len": 1_048_576, "global_batch_size": 64, "method": "qlora"},
}


def _post(client: TestClient) -> Any:
    def post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        response = client.post(path, json=body)
        return response.status_code, response.json()

    return post


def _with(body: dict[str, Any], **training: Any) -> dict[str, Any]:
    return {**body, "training": {**body["training"], **training}}


def test_a_shorter_sequence_with_offload_and_with_more_gpus_applied_as_stated_fit(client: TestClient) -> None:
    response = client.post("/v1/plans", json=LONG_QLORA)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["status"] == "infeasible"
    skipped = {s["kind"] for s in plan["suggestions_skipped"]}
    assert {"shorter_sequence", "more_gpus", "offload"} <= skipped  # none alone fits
    by_kind = {s["kind"]: s for s in plan["suggestions"]}
    assert set(by_kind) == {"offload", "more_gpus"}
    for suggestion in by_kind.values():
        seq = suggestion["seq_len"]
        assert seq is not None and seq < LONG_QLORA["training"]["seq_len"]
        ratio = LONG_QLORA["training"]["seq_len"] // seq
        assert ratio * seq == LONG_QLORA["training"]["seq_len"] and ratio & (ratio - 1) == 0  # a halving
        assert suggestion["detail"].startswith(f"training.seq_len {seq} (from 1048576), and ")
    assert by_kind["offload"]["cpu_per_node_bytes"] > 0
    assert by_kind["more_gpus"]["num_gpus"] > 1
    # each, applied as it states (its sequence, its GPUs, its host RAM), fits with its numbers
    assert check_suggestions(_post(client), LONG_QLORA, plan) == []


def test_the_sequence_is_the_longest_halving_that_fits_so(client: TestClient) -> None:
    plan = client.post("/v1/plans", json=LONG_QLORA).json()
    more = next(s for s in plan["suggestions"] if s["kind"] == "more_gpus")
    # twice that sequence does not fit on more GPUs: the same search, asked directly
    longer = _with(LONG_QLORA, seq_len=2 * more["seq_len"])
    again = client.post("/v1/plans", json=longer).json()
    assert not any(s["kind"] == "more_gpus" and s["seq_len"] is None for s in again["suggestions"])
    assert any(
        s["kind"] == "more_gpus" and "no layout fits" in s["reason"] for s in again["suggestions_skipped"]
    )


def test_not_offered_where_a_change_alone_fits(client: TestClient) -> None:
    """At 4,096 tokens the same job fits on more of the same card: no sequence is shortened."""
    plan = client.post("/v1/plans", json=_with(LONG_QLORA, seq_len=4096)).json()
    assert plan["status"] == "infeasible"
    assert plan["suggestions"]
    assert all(s["seq_len"] in (None, 4096) for s in plan["suggestions"])


GEMMA_LORA = {
    "model": {"preset": "gemma-2-9b"},
    "cluster": {"gpu": "l4-24gb", "num_nodes": 1, "gpus_per_node": 1},
    "training": {"seq_len": 8192, "global_batch_size": 16, "method": "lora"},
}


def test_a_peft_method_that_fits_only_shorter_says_the_sequence(client: TestClient) -> None:
    """Gemma 2 9B LoRA at 8K on one L4: QLoRA alone does not fit at 8K, a shorter sequence alone fits
    at 1K; QLoRA at 4K fits too and was not said (a reviewer's finding), so a user cut to 1K."""
    plan = client.post("/v1/plans", json=GEMMA_LORA).json()
    assert plan["status"] == "infeasible"
    (qlora,) = [s for s in plan["suggestions"] if s["kind"] == "qlora"]
    seq = qlora["seq_len"]
    assert qlora["method"] == "qlora" and seq is not None and seq < 8192, qlora
    assert f"with training.seq_len {seq} (from 8192)" in qlora["detail"], qlora["detail"]
    (shorter,) = [s for s in plan["suggestions"] if s["kind"] == "shorter_sequence"]
    assert seq > shorter["seq_len"]  # QLoRA keeps a longer sequence than LoRA cut short
    assert check_suggestions(_post(client), GEMMA_LORA, plan) == []
    # the longest halving: QLoRA at twice that sequence does not fit on the GPUs given
    longer = client.post("/v1/plans", json=_with(GEMMA_LORA, method="qlora", seq_len=2 * seq)).json()
    assert longer["status"] == "infeasible"
