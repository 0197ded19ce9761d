"""GPUs without peer access (GeForce RTX 4090: GPUSpec.peer_to_peer false) run no TP communication
overlap: Transformer Engine's userbuffers and PyTorch's SymmetricMemory map the peers' memory. A
review found a plan on four 4090s recommending Megatron tp 2 with --tp-comm-overlap hiding 70% of the
TP all-reduces that cannot overlap there; with them exposed the pipeline layout was faster."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.api.helpers import assert_problem

FOUR_4090S = {"gpu": "rtx-4090-24gb", "num_nodes": 1, "gpus_per_node": 4, "cpu_memory_bytes_per_node": 2**38}
TRAINING = {"seq_len": 2048, "global_batch_size": 64}


def estimate_body(**layout: Any) -> dict[str, Any]:
    return {
        "model": {"preset": "llama-2-7b"},
        "cluster": FOUR_4090S,
        "training": TRAINING,
        "layout": {
            "framework": "megatron",
            "dp": 2,
            "tp": 2,
            "zero_stage": 1,
            "recompute": "full",
            "offload_optimizer": "none",
        }
        | layout,
    }


def test_the_catalog_says_which_gpus_have_peer_access(client: TestClient) -> None:
    assert client.get("/v1/gpus/rtx-4090-24gb").json()["peer_to_peer"] is False
    assert client.get("/v1/gpus/rtx-3090-24gb").json()["peer_to_peer"] is False  # over PCIe
    assert client.get("/v1/gpus/h100-sxm-80gb").json()["peer_to_peer"] is True


def test_tp_overlap_defaults_off_and_is_refused_without_peer_access(client: TestClient) -> None:
    response = client.post("/v1/estimates", json=estimate_body())
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["layout"]["tp_comm_overlap"] is False
    assert result["resolved_defaults"]["layout.tp_comm_overlap"] == "false"
    problem = assert_problem(client.post("/v1/estimates", json=estimate_body(tp_comm_overlap=True)), 422)
    assert problem["errors"][0]["field"] == "layout.tp_comm_overlap"
    assert "rtx-4090-24gb" in problem["detail"].lower() or "4090" in problem["detail"]
    # the same GPU stated as a custom part with peer access overlaps by default
    custom = estimate_body()
    gpu = client.get("/v1/gpus/rtx-4090-24gb").json()
    custom["cluster"] = FOUR_4090S | {
        "gpu": {
            "name": "bridged-4090",
            "chip": gpu["chip"],
            "memory_bytes": gpu["memory_bytes"],
            "peak_flops_per_s": {k: v for k, v in gpu["peak_flops_per_s"].items() if v is not None},
            "hbm_bandwidth_bytes_per_s": gpu["hbm_bandwidth_bytes_per_s"],
        }
    }
    overlapped = client.post("/v1/estimates", json=custom)
    assert overlapped.status_code == 200, overlapped.text
    assert overlapped.json()["layout"]["tp_comm_overlap"] is True
    assert overlapped.json()["time"]["step_s"] < result["time"]["step_s"]


def test_a_plan_on_them_times_no_tp_overlap(client: TestClient) -> None:
    body = {"model": {"preset": "llama-2-7b"}, "cluster": FOUR_4090S, "training": TRAINING}
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    layouts = [plan["recommended"]["layout"], *(a["layout"] for a in plan["alternatives"])]
    assert layouts and not any(layout["tp_comm_overlap"] for layout in layouts)


def test_an_mi250x_runs_no_tp_overlap_and_its_plans_credit_none(client: TestClient) -> None:
    """PyTorch's SymmetricMemory runs on ROCm only on gfx942 and gfx950: an MI250X (gfx90a) plan
    rendered torchtitan's Async TP and credited it 16% of the step (AMD review). Refused when asked,
    off by default, never proposed."""
    cluster = {"gpu": "mi250x-gcd-64gb", "num_nodes": 2, "gpus_per_node": 8}
    body = {
        "model": {"preset": "llama-3.1-8b"},
        "cluster": cluster,
        "training": {"seq_len": 4096, "global_batch_size": 64},
        "layout": {"framework": "fsdp", "dp": 8, "tp": 2, "zero_stage": 3, "sequence_parallel": True,
                   "torch_compile": "model", "tp_comm_overlap": True},
    }  # fmt: skip
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    assert [e["field"] for e in problem["errors"]] == ["layout.tp_comm_overlap"]
    assert "gfx942" in problem["detail"]
    del body["layout"]["tp_comm_overlap"]
    assert client.post("/v1/estimates", json=body).json()["layout"]["tp_comm_overlap"] is False
    plan = {k: v for k, v in body.items() if k != "layout"} | {
        "constraints": {"frameworks": ["fsdp", "megatron"], "torch_compile": True, "top_k": 5}
    }
    answer = client.post("/v1/plans", json=plan).json()
    layouts = [answer["recommended"]["layout"], *(a["layout"] for a in answer["alternatives"])]
    assert layouts and not any(layout["tp_comm_overlap"] for layout in layouts)
