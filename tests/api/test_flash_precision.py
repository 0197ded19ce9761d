"""FlashAttention takes fp16 / bf16 inputs only: asked for with fp32 or tf32 (fp32 activations) it is a
422 naming ``training.attention`` and the precision on every face that takes a training (estimate,
plan, capacity); left out, it resolves to sdpa and the answer says so."""

from __future__ import annotations

import json
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


def _resolved(
    client: TestClient,
    face: str,
    path: str,
    body: dict[str, Any],
    field: str = "attention",
    value: str = "sdpa",
) -> Any:
    """The answer of ``face``, which says that the training ``field`` left out resolved to ``value``."""
    response = client.post(path, json=body)
    assert response.status_code in (200, 201), response.text
    answer = response.json()
    if face == "capacity":
        (option,) = answer["options"]
        assert f"training.{field} {value}" in option["note"], option
    else:
        assert answer["resolved_defaults"][f"training.{field}"] == value
    return answer


@pytest.mark.parametrize("face", ["estimate", "plan", "capacity"])
def test_left_out_it_resolves_to_sdpa_and_says_so(client: TestClient, face: str) -> None:
    path, body = bodies(training(precision="fp32"))[face]
    answer = _resolved(client, face, path, body)
    if face != "capacity":
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


# A config whose heads are wider than FlashAttention's kernels take (head_dim 512: one head of 512)
WIDE_HEADS = {"model_type": "llama", "hidden_size": 512, "num_attention_heads": 1, "num_key_value_heads": 1,
              "num_hidden_layers": 2, "intermediate_size": 256, "vocab_size": 32000}  # fmt: skip


@pytest.mark.parametrize("face", ["estimate", "plan", "capacity"])
def test_heads_past_flash_kernels_resolve_to_sdpa_and_flash_asked_is_a_422(
    client: TestClient, face: str
) -> None:
    """A small-models review: head_dim 512 left to the hardware resolved to flash, which the estimate
    then warned its kernels refuse, and the launch files loaded the model with flash_attention_2 (the run
    fails at its first forward: flash_api.cpp checks head_size <= 256)."""
    h100 = {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1}
    train = {"seq_len": 128, "global_batch_size": 8}
    model = {"hf_config": WIDE_HEADS}
    faces = {
        "estimate": (
            "/v1/estimates",
            {"model": model, "cluster": h100, "training": train, "layout": {"dp": 1}},
        ),
        "plan": ("/v1/plans", {"model": model, "cluster": h100, "training": train}),
        "capacity": ("/v1/capacity", {"model": model, "training": train, "gpus": ["h100-sxm-80gb"]}),
    }
    path, body = faces[face]
    answer = _resolved(client, face, path, body)
    if face == "plan":
        assert "flash_attention_2" not in json.dumps(answer), "a launch file loads the model with flash"
    body["training"] = train | {"attention": "flash"}
    (error,) = assert_problem(client.post(path, json=body), 422)["errors"]
    assert (error["field"], error["rule"], error["limit"]) == (
        "training.attention",
        "flash_head_dim",
        {"le": 256},
    )


@pytest.mark.parametrize("face", ["estimate", "plan", "capacity"])
def test_gemma_on_an_fp16_only_gpu_defaults_to_fp32_and_fp16_asked_is_warned(
    client: TestClient, face: str
) -> None:
    """An fp16 review: Gemma 3 on a T4 or V100 resolved to fp16, whose range its activations exceed
    (Unsloth's Gemma 3 fixes: inf activations, NaN gradients on fp16-only GPUs), the plan fitting and its
    files setting fp16. Left out, the precision is fp32 there, and says so; fp16 asked for is warned."""
    train = {"seq_len": 1024, "global_batch_size": 8, "method": "lora"}
    v100 = {"gpu": "v100-sxm2-32gb", "num_nodes": 1, "gpus_per_node": 1}
    model = {"preset": "gemma-3-1b"}
    faces = {
        "estimate": ("/v1/estimates", {"model": model, "cluster": v100, "training": train,
                                       "layout": {"dp": 1, "recompute": "full"}}),
        "plan": ("/v1/plans", {"model": model, "cluster": v100, "training": train}),
        "capacity": ("/v1/capacity", {"model": model, "training": train, "gpus": ["v100-sxm2-32gb"]}),
    }  # fmt: skip
    path, body = faces[face]
    _resolved(client, face, path, body, "precision", "fp32")
    if face == "estimate":
        asked = client.post(path, json=body | {"training": train | {"precision": "fp16"}}).json()
        assert any(w.startswith("precision fp16: gemma3's activations exceed") for w in asked["warnings"])
        llama = client.post(path, json=body | {"model": {"preset": "llama-3.2-1b"}}).json()
        assert llama["resolved_defaults"]["training.precision"] == "fp16"  # other families keep fp16
