"""Enum values as the frameworks' own configs spell them: torch's dtypes ("bfloat16", HF's
torch_dtype), HF's attn_implementation ("flash_attention_2"), the projects' names ("Megatron-LM",
"FSDP2", "k8s"), any case, hyphens or underscores. They are read as the value they mean, which the
stored request echoes; anything else is still the enum 422 listing the values."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.contracts.common import ENUM_SPELLINGS
from service.contracts.plans import ConstraintsIn
from service.contracts.training import TrainingIn
from service.estimator.types import Attention, Framework, MemoryStatistic, Precision
from service.launchers import Target

CLUSTER = {"gpu": "a100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
TRAINING = {"seq_len": 2048, "global_batch_size": 32}


@pytest.mark.parametrize(
    ("given", "field", "value"),
    [
        ({"precision": "bfloat16"}, "precision", Precision.BF16),
        ({"precision": "BF16"}, "precision", Precision.BF16),
        ({"precision": "float16"}, "precision", Precision.FP16),
        ({"precision": "float32"}, "precision", Precision.FP32),
        ({"precision": "BF16-Pure"}, "precision", Precision.BF16_PURE),
        ({"attention": "flash_attention_2"}, "attention", Attention.FLASH),
        ({"method": "LoRA"}, "method", "lora"),
    ],
)
def test_training_spellings(given: dict[str, Any], field: str, value: object) -> None:
    assert getattr(TrainingIn(**TRAINING, **given), field) == value


@pytest.mark.parametrize(
    ("optim", "optimizer", "implementation"),
    [
        # a review's 422s: HF Trainer's optim names, as a QLoRA script sets them
        ("paged_adamw_8bit", "adamw_8bit", "fused"),
        ("adamw_bnb_8bit", "adamw_8bit", "fused"),
        ("adamw_torch", "adamw", "foreach"),  # torch.optim.AdamW at its CUDA default
        ("adamw_torch_fused", "adamw", "fused"),
        ("adam", "adamw", "fused"),  # Adam keeps AdamW's states
    ],
)
def test_hf_trainer_optim_names(client: TestClient, optim: str, optimizer: str, implementation: str) -> None:
    training = TrainingIn(**TRAINING, optimizer=optim)
    assert (training.optimizer.value, training.optimizer_implementation.value) == (optimizer, implementation)
    body = {"model": {"preset": "llama-3.2-1b"}, "cluster": CLUSTER,
            "training": TRAINING | {"optimizer": optim},
            "layout": {"framework": "fsdp", "dp": 8, "zero_stage": 3}}  # fmt: skip
    response = client.post("/v1/estimates", json=body)
    assert response.status_code == 200, response.text
    # the answer says how the name was read (a paged optimizer became the unpaged one unsaid: the
    # launch files run it; fine-tuner review)
    read = response.json()["resolved_defaults"]["training.optimizer"]
    assert read.startswith(f"{optimizer} as read from {optim}") and ("paging" in read) == optim.startswith(
        "paged"
    )
    stated = TrainingIn(**TRAINING, optimizer=optim, optimizer_implementation="fused")
    assert stated.optimizer_implementation.value == "fused"  # a stated implementation wins


def test_lists_of_enums_are_read_item_by_item() -> None:
    constraints = ConstraintsIn(frameworks=["FSDP2", "Megatron-LM", "DeepSpeed"])
    assert constraints.frameworks == [Framework.FSDP, Framework.MEGATRON, Framework.DEEPSPEED]


def test_every_spelling_names_a_value_of_some_enum() -> None:
    values = {m.value for kind in (Precision, Attention, Framework, Target, MemoryStatistic) for m in kind}
    assert set(ENUM_SPELLINGS.values()) <= values


def test_a_plan_stores_the_value_read(client: TestClient) -> None:
    body = {
        "model": "llama-3.2-1b",
        "cluster": CLUSTER,
        "training": {**TRAINING, "precision": "bfloat16"},
        "constraints": {"frameworks": ["FSDP2"]},
        "launchers": ["Slurm", "k8s"],
    }
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    request = response.json()["request"]
    assert request["training"]["precision"] == "bf16"
    assert request["constraints"]["frameworks"] == ["fsdp"]
    assert request["launchers"] == ["slurm", "kubernetes"]


@pytest.mark.parametrize(
    ("field", "value"), [("precision", "bfloat8"), ("method", "sft"), ("attention", "xformers")]
)
def test_other_words_are_the_enum_problem(client: TestClient, field: str, value: str) -> None:
    body = {"model": "llama-3.2-1b", "cluster": CLUSTER, "training": {**TRAINING, field: value}}
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 422
    (error,) = response.json()["errors"]
    assert error["field"] == f"training.{field}" and error["type"] == "enum"


@pytest.mark.parametrize(
    ("given", "statistic"),
    [("nvidia-smi", "device_used"), ("max_memory_reserved", "reserved"), ("max_allocated", "allocated")],
)
def test_a_runs_memory_statistic_by_the_tool_that_reports_it(
    client: TestClient, given: str, statistic: str
) -> None:
    plan = client.post("/v1/plans", json={"model": "llama-3.2-1b", "cluster": CLUSTER, "training": TRAINING})
    assert plan.status_code == 201, plan.text
    run = {"step_s": 2.0, "peak_memory_bytes_per_gpu": 30 * 2**30, "memory_statistic": given}
    response = client.post(f"/v1/plans/{plan.json()['id']}/runs", json=run)
    assert response.status_code == 201, response.text
    assert response.json()["memory_statistic"] == statistic


def test_a_value_no_enum_member_spells_is_refused_with_the_values_it_takes(client: TestClient) -> None:
    """The values were in the message's words alone, where a bound gives its limit as data."""
    body = {
        "model": {"preset": "llama-3.2-1b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 2048, "global_batch_size": 32, "precision": "bf17"},
    }
    refused = client.post("/v1/estimates", json=body)
    assert refused.status_code == 422
    (error,) = refused.json()["errors"]
    assert error["field"] == "training.precision" and error["type"] == "enum"
    assert error["allowed"] == [p.value for p in Precision]


def test_a_literal_outside_its_values_is_refused_with_the_values_it_takes(client: TestClient) -> None:
    """zero_stage (0-3) and the plans' status filter are literals, not enums: their 422 gave the values in
    words alone (scheduler review); `allowed` holds them as JSON values."""
    body = {
        "model": {"preset": "llama-3.2-1b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 2048, "global_batch_size": 32},
        "layout": {"zero_stage": 4},
    }
    (error,) = client.post("/v1/estimates", json=body).json()["errors"]
    assert (error["field"], error["allowed"]) == ("layout.zero_stage", [0, 1, 2, 3])
    refused = client.get("/v1/plans", params={"status": "bogus"})
    assert refused.status_code == 422
    (error,) = refused.json()["errors"]
    assert (error["field"], error["allowed"]) == ("query.status", ["feasible", "infeasible"])
