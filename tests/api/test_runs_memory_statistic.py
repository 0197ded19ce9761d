"""A typed run says which statistic its peak is (issue 27), end to end: `memory_statistic`
(allocated: torch.cuda.max_memory_allocated, reserved: max_memory_reserved, device_used: nvidia-smi)
is stored, answered in RunOut, compared with the estimate's figure of the same statistic, and
calibrates as the device memory it implies; left out, a typed peak is device used and the diagnosis
says it assumed so. A log says its own: memory_statistic with a log, or without a peak, is a 422
naming it. Runs on SQLite and, in CI, again on PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.helpers import assert_problem
from tests.api.test_runs_from_logs import log
from tests.api.test_runs_physics import BODY, create, post_run


def runs_url(plan: dict[str, Any]) -> str:
    return f"/v1/plans/{plan['id']}/runs"


def per_gpu(plan: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = plan["recommended"]["estimate"]["memory"]["per_gpu"]
    return found


def memory_factor_of(client: TestClient, run: dict[str, Any]) -> float:
    """The memory factor a single run on a fresh hardware gives: posted on its own plan, the plan
    then deleted (its runs with it) so the next run starts afresh."""
    plan = create(client, BODY)
    stored = post_run(client, plan["id"], run)
    assert stored["diagnosis"]["implausible"] is False, stored["diagnosis"]
    factor: float = stored["calibration"]["factors"]["memory_dynamic"]
    assert client.delete(f"/v1/plans/{plan['id']}").status_code == 204
    return factor


def test_a_typed_allocated_peak_is_diagnosed_against_the_estimates_peak_allocated(client: TestClient) -> None:
    plan = create(client, BODY)
    memory = per_gpu(plan)
    peak = memory["peak_allocated_bytes"]
    run = post_run(client, plan["id"], {"peak_memory_bytes_per_gpu": peak, "memory_statistic": "allocated"})
    assert run["memory_statistic"] == "allocated" and run["source"] is None
    diagnosis = run["diagnosis"]
    assert diagnosis["memory_statistic"] == "allocated" and diagnosis["memory_statistic_assumed"] is False
    assert diagnosis["estimated_peak_memory_bytes_per_gpu"] == peak < memory["device_used_bytes"]
    assert diagnosis["memory_error"] == 0
    assert not any("memory_statistic" in advice for advice in diagnosis["advice"])
    # read back the same
    fetched = client.get(f"{runs_url(plan)}/{run['id']}").json()
    assert fetched["memory_statistic"] == "allocated" and fetched["diagnosis"] == diagnosis
    assert client.get(runs_url(plan)).json()["items"][0]["memory_statistic"] == "allocated"


def test_a_typed_peak_that_does_not_say_is_device_used_and_the_answer_says_so(client: TestClient) -> None:
    plan = create(client, BODY)
    memory = per_gpu(plan)
    run = post_run(client, plan["id"], {"peak_memory_bytes_per_gpu": memory["peak_allocated_bytes"]})
    assert run["memory_statistic"] is None
    diagnosis = run["diagnosis"]
    assert diagnosis["memory_statistic"] == "device_used" and diagnosis["memory_statistic_assumed"] is True
    assert diagnosis["estimated_peak_memory_bytes_per_gpu"] == memory["device_used_bytes"]
    assert diagnosis["memory_error"] < 0
    assert any("taken as device_used" in advice for advice in diagnosis["advice"])
    # a run without a peak compared none: nothing assumed, nothing advised about it
    step_only = post_run(client, plan["id"], {"step_s": 1.0})["diagnosis"]
    assert step_only["memory_statistic_assumed"] is False
    assert not any("memory_statistic" in advice for advice in step_only["advice"])


def test_the_same_bytes_as_allocated_and_as_device_used_give_different_memory_factors(
    client: TestClient,
) -> None:
    """The estimate's peak allocated, posted as what it is, matches the estimate (factor 1); the same
    bytes as nvidia-smi's figure read low by the CUDA context, NCCL's buffers and fragmentation, and
    shrink the dynamic part of every later estimate on this hardware. Unset is device used."""
    peak = per_gpu(create(client, BODY))["peak_allocated_bytes"]
    allocated = memory_factor_of(client, {"peak_memory_bytes_per_gpu": peak, "memory_statistic": "allocated"})
    device_used = memory_factor_of(
        client, {"peak_memory_bytes_per_gpu": peak, "memory_statistic": "device_used"}
    )
    unstated = memory_factor_of(client, {"peak_memory_bytes_per_gpu": peak})
    assert allocated == pytest.approx(1.0)
    assert device_used < allocated
    assert unstated == device_used


def test_a_log_runs_statistic_is_the_estimates_word_for_its_reading(client: TestClient) -> None:
    plan = create(client, BODY)
    run = post_run(client, plan["id"], {"log": log("deepspeed")})  # DeepSpeed's MaxMemAllocated
    assert run["source"]["memory_statistic"] == "max_allocated"
    assert run["memory_statistic"] == "allocated" and run["diagnosis"]["memory_statistic"] == "allocated"
    assert run["diagnosis"]["estimated_peak_memory_bytes_per_gpu"] == per_gpu(plan)["peak_allocated_bytes"]
    oom = post_run(client, plan["id"], {"log": log("oom")})
    assert oom["peak_memory_bytes_per_gpu"] is None and oom["memory_statistic"] is None


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"memory_statistic": "allocated", "step_s": 1.0}, "give that peak"),
        ({"memory_statistic": "reserved", "out_of_memory": True}, "give that peak"),
        ({"memory_statistic": "reserved", "log": "x"}, "a log says"),
        ({"memory_statistic": "peak", "peak_memory_bytes_per_gpu": 2**34}, "allocated"),
        ({"memory_statistic": 1, "peak_memory_bytes_per_gpu": 2**34}, ""),
    ],
)
def test_a_misplaced_or_unknown_statistic_is_a_422_naming_it(
    client: TestClient, body: dict[str, Any], says: str
) -> None:
    plan = create(client, BODY)
    problem = assert_problem(client.post(runs_url(plan), json=body), 422)
    fields = {error["field"]: error["message"] for error in problem["errors"]}
    assert "memory_statistic" in fields, problem
    assert says in fields["memory_statistic"]
    assert client.get(runs_url(plan)).json()["items"] == []


def test_an_allocated_peak_below_the_model_states_is_implausible(client: TestClient) -> None:
    """An allocated peak below the model states the GPU holds all step cannot be the plan's run: it
    passed as the device-used figure it converts to (states plus the estimate's context, NCCL and
    fragmentation) and lowered every later estimate (memory review)."""
    plan = create(client, BODY)
    memory = per_gpu(plan)
    states = memory["parameters"] + memory["gradients"] + memory["optimizer_states"]
    run = {"peak_memory_bytes_per_gpu": int(states * 0.95), "memory_statistic": "allocated"}
    stored = post_run(client, plan["id"], run)
    assert stored["diagnosis"]["implausible"] is True, stored["diagnosis"]
    assert any("below the" in reason for reason in stored["diagnosis"]["implausible_reasons"])


def test_a_layout_that_ran_still_fits_after_its_allocated_peak_calibrates(client: TestClient) -> None:
    """A run that did not run out of memory used at most the card: its allocated peak plus what the
    estimate adds for device used (its own fragmentation) may not put it past the card. Llama 2 7B's
    FSDP layout on 8 A100-40GB ran at 34.5 GiB allocated and was then said not to fit at 40.5 GiB
    (memory review)."""
    body = {
        "model": {"preset": "llama-2-7b"},
        "cluster": {"gpu": "a100-pcie-40gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 2048, "global_batch_size": 64},
        "constraints": {"frameworks": ["fsdp"], "top_k": 2},
    }
    plan = create(client, body)
    capacity = plan["recommended"]["estimate"]["memory"]["capacity_bytes"]
    allocated = per_gpu(plan)["peak_allocated_bytes"]
    # most of the card allocated: with the estimate's fragmentation on top it would pass the card
    run = {"peak_memory_bytes_per_gpu": int(0.86 * capacity), "memory_statistic": "allocated"}
    assert run["peak_memory_bytes_per_gpu"] > allocated
    stored = post_run(client, plan["id"], run)
    assert stored["diagnosis"]["implausible"] is False, stored["diagnosis"]
    layout = plan["recommended"]["layout"]
    request = {k: body[k] for k in ("model", "cluster", "training")} | {"layout": layout}
    again = client.post("/v1/estimates", json=request).json()
    assert again["calibration"]["runs"] == 1
    assert again["fits"] is True, again["memory"]
