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
