"""training.base_dtype through the API: an fp32 LoRA base is estimated, planned and refused where
no framework keeps it, and an infeasible plan suggests loading it in the compute dtype."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.api.helpers import assert_problem

ONE_4090 = {"gpu": "rtx-4090-24gb", "num_nodes": 1, "gpus_per_node": 1}
ONE_A100 = {"gpu": "a100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1}


def training(**more: Any) -> dict[str, Any]:
    return {"seq_len": 2048, "global_batch_size": 8, "method": "lora", "precision": "bf16"} | more


def test_an_fp32_base_under_autocast_does_not_fit_where_a_bf16_one_does(client: TestClient) -> None:
    body = {
        "model": {"preset": "llama-2-7b"},
        "cluster": ONE_4090,
        "layout": {"framework": "fsdp", "dp": 1, "recompute": "full"},
    }
    bf16 = client.post("/v1/estimates", json=body | {"training": training()})
    fp32 = client.post("/v1/estimates", json=body | {"training": training(base_dtype="fp32")})
    assert bf16.status_code == fp32.status_code == 200, fp32.text
    assert bf16.json()["fits"] is True and fp32.json()["fits"] is False
    gib = 2**30
    # 6.74B base parameters at 4 B instead of 2 B
    params = fp32.json()["memory"]["per_gpu"]["parameters"] - bf16.json()["memory"]["per_gpu"]["parameters"]
    assert abs(params - 2 * 6_738_415_616) < gib / 100


def test_deepspeed_and_full_training_refuse_it_naming_the_field(client: TestClient) -> None:
    body = {"model": {"preset": "llama-2-7b"}, "cluster": ONE_A100}
    deepspeed = client.post(
        "/v1/estimates",
        json=body | {"training": training(base_dtype="fp32"), "layout": {"framework": "deepspeed", "dp": 1}},
    )
    problem = assert_problem(deepspeed, 422)
    assert "training.base_dtype" in deepspeed.text and "casts the whole model" in problem["detail"]
    full = client.post(
        "/v1/estimates",
        json=body
        | {
            "training": training(method="full", base_dtype="fp32"),
            "layout": {"framework": "fsdp", "dp": 1},
        },
    )
    assert_problem(full, 422)
    assert "training.base_dtype" in full.text


def test_an_infeasible_fp32_base_plan_suggests_the_compute_dtype_first_and_qlora_applies(
    client: TestClient,
) -> None:
    request = {
        "model": {"preset": "llama-3-8b"},
        "cluster": ONE_4090,
        "training": training(base_dtype="fp32"),
    }
    plan = client.post("/v1/plans", json=request)
    assert plan.status_code in (200, 201), plan.text
    answer = plan.json()
    assert answer["status"] == "infeasible"  # 8B x 4 B of base alone: 32 GB on a 24 GB card
    kinds = [s["kind"] for s in answer["suggestions"]]
    assert kinds and kinds[0] == "base_dtype", kinds
    first = answer["suggestions"][0]
    assert first["on_the_gpus_given"] and first["base_dtype"] == "compute"
    for suggestion in answer["suggestions"]:
        if suggestion["kind"] == "qlora":
            assert suggestion["base_dtype"] == "compute"  # QLoRA quantises whatever LoRA loaded
    # applied as stated, the first fits with the numbers it quotes
    applied = request | {"training": training(base_dtype=first["base_dtype"])}
    layout = {k: v for k, v in first["layout"].items() if v is not None}
    estimate = client.post("/v1/estimates", json=applied | {"layout": layout})
    assert estimate.status_code == 200, estimate.text
    assert estimate.json()["fits"] is True
    assert estimate.json()["memory"]["per_gpu"]["total"] == first["per_gpu_bytes"]
