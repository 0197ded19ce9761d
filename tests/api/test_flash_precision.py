"""FlashAttention takes fp16 / bf16 inputs only: asked for with fp32 or tf32 (fp32 activations) it is a
422 naming ``training.attention`` and the precision on every face that takes a training (estimate,
plan, capacity); left out, it resolves to sdpa and the answer says so."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.helpers import assert_problem

NODE = {"gpu": "a100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
LAYOUT = {"framework": "fsdp", "dp": 8, "zero_stage": 3}


def training(**fields: Any) -> dict[str, Any]:
    return {"seq_len": 1024, "global_batch_size": 64, "tokens": 10**9} | fields


def bodies(train: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    model = {"preset": "gpt2"}
    return {
        "estimate": ("/v1/estimates", {"model": model, "cluster": NODE, "training": train, "layout": LAYOUT}),
        "plan": ("/v1/plans", {"model": model, "cluster": NODE, "training": train}),
        "capacity": ("/v1/capacity", {"model": model, "training": train, "gpus": ["a100-sxm-80gb"]}),
    }


@pytest.mark.parametrize("face", ["estimate", "plan", "capacity"])
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_flash_with_fp32_activations_is_a_422_naming_the_field(
    client: TestClient, face: str, precision: str
) -> None:
    path, body = bodies(training(precision=precision, attention="flash"))[face]
    problem = assert_problem(client.post(path, json=body), 422)
    (error,) = problem["errors"]
    assert (error["field"], error["rule"]) == ("training.attention", "flash_precision")
    assert f"precision {precision}" in error["message"] and "fp16 or bf16" in error["message"]


@pytest.mark.parametrize("face", ["estimate", "plan", "capacity"])
def test_left_out_it_resolves_to_sdpa_and_says_so(client: TestClient, face: str) -> None:
    path, body = bodies(training(precision="fp32"))[face]
    response = client.post(path, json=body)
    assert response.status_code in (200, 201), response.text
    answer = response.json()
    if face == "capacity":
        (option,) = answer["options"]
        assert "training.attention sdpa" in option["note"], option
    else:
        training_defaults = {
            k: v for k, v in answer["resolved_defaults"].items() if k.startswith("training.")
        }
        assert training_defaults == {"training.attention": "sdpa"}


@pytest.mark.parametrize(("gpu", "timed"), [("t4-16gb", "slowest fitted die's fa2 rates"), ("v100-sxm2-32gb",
                         "at the GEMM rate")])  # fmt: skip
def test_the_attention_note_names_the_kernel_sdpa_runs_without_flash(client: TestClient, gpu: str,
                                                                      timed: str) -> None:  # fmt: skip
    """A review's case: on a T4 the note said "sdpa, fa2 kernel" (FlashAttention-2 does not run on
    sm_75; SDPA dispatches to its memory-efficient kernel) and on a V100 "no published rate of
    deepspeed's kernel". Both now name PyTorch's memory-efficient kernel and how it was timed."""
    body = {"model": {"preset": "llama-2-7b"}, "cluster": {"gpu": gpu, "num_gpus": 1},
            "training": {"seq_len": 2048, "global_batch_size": 16, "method": "qlora"},
            "layout": {"dp": 1, "micro_batch_size": 1, "recompute": "full"}}  # fmt: skip
    response = client.post("/v1/estimates", json=body)
    assert response.status_code == 200, response.text
    (note,) = [line for line in response.json()["assumptions"] if line.startswith("attention's core")]
    assert "PyTorch's memory-efficient kernel, no FlashAttention-2" in note and timed in note
    assert "fa2 kernel" not in note and "deepspeed's kernel" not in note
