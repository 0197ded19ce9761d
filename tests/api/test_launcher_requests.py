"""Asking for one more launch file never turns a feasible plan into a 422 nor changes the layout
where the file's target does not constrain it (consistency review, stop 39): Mistral 7B at 8K on 8
H100 through FSDP was feasible with ["accelerate", "slurm"] and with ["accelerate", "torchtitan"],
and a 422 with all three (Slurm made torchtitan the only runner, and torchtitan cannot run it)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.launchers import Target
from service.planning.plans import runner_targets

JOB = {
    "model": {"preset": "mistral-7b"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
    "training": {"seq_len": 8192, "global_batch_size": 64},
    "constraints": {"frameworks": ["fsdp"]},
}


def tokens_per_s(client: TestClient, launchers: list[str]) -> float:
    response = client.post("/v1/plans", json={**JOB, "launchers": launchers})
    assert response.status_code == 201, (launchers, response.text)
    body: dict[str, Any] = response.json()
    assert body["status"] == "feasible", body
    return float(body["recommended"]["estimate"]["time"]["tokens_per_s"])


def test_slurm_with_accelerate_and_torchtitan_runs_what_either_runs(client: TestClient) -> None:
    alone = tokens_per_s(client, ["accelerate"])
    assert tokens_per_s(client, ["accelerate", "slurm"]) == alone
    assert tokens_per_s(client, ["accelerate", "torchtitan", "slurm"]) == alone
    # a Kubernetes file needs a torchrun entry point: never a 422 for asking for it too
    assert tokens_per_s(client, [t.value for t in Target]) > 0


@pytest.mark.parametrize(
    "asked,runners",
    [
        ([], []),
        (["slurm"], ["deepspeed", "megatron", "torchtitan", "hf_trainer"]),
        (["accelerate", "slurm"], ["accelerate"]),
        (["accelerate", "torchtitan", "slurm"], ["accelerate", "torchtitan"]),
        (["accelerate", "torchtitan", "kubernetes"], ["torchtitan"]),
        (["accelerate", "kubernetes"], ["accelerate"]),
    ],
)
def test_runner_targets(asked: list[str], runners: list[str]) -> None:
    assert sorted(runner_targets([Target(t) for t in asked])) == sorted(Target(t) for t in runners)


def test_accelerate_runs_no_fsdp_with_tp(client: TestClient) -> None:
    """Accelerate's FSDP with TP does not start with transformers 5.24 (it loads a tensor-parallel
    model on its own mesh of the tp ranks, not Accelerate's: a launch review reproduced it). A plan
    asked for Accelerate proposes FSDP layouts without TP, and each estimates as planned."""
    response = client.post(
        "/v1/plans",
        json={
            "model": {"preset": "llama-3-8b"},
            "cluster": {"gpu": "rtx-4090-24gb", "num_nodes": 1, "gpus_per_node": 8},
            "training": {"seq_len": 2048, "global_batch_size": 32},
            "constraints": {"frameworks": ["fsdp"], "top_k": 5},
            "launchers": ["accelerate"],
        },
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["status"] == "feasible"
    shown = [body["recommended"], *body.get("alternatives", [])]
    assert all(c["layout"]["tp"] == 1 for c in shown)
    estimate = client.post(
        "/v1/estimates",
        json={
            "model": {"preset": "llama-3-8b"},
            "cluster": {"gpu": "rtx-4090-24gb", "num_nodes": 1, "gpus_per_node": 8},
            "training": {"seq_len": 2048, "global_batch_size": 32},
            "layout": body["recommended"]["layout"],
        },
    ).json()
    assert (
        estimate["memory"]["per_gpu"]["total"]
        == body["recommended"]["estimate"]["memory"]["per_gpu"]["total"]
    )
