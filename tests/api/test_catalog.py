"""GPU and model catalog endpoints."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.helpers import assert_problem


def test_gpu_list_has_sources_and_si_units(client: TestClient) -> None:
    page = client.get("/v1/gpus").json()
    names = [g["name"] for g in page["items"]]
    assert {"h100-sxm-80gb", "a100-sxm-40gb", "rtx-4090-24gb", "mi300x-192gb"} <= set(names)
    assert page["next_cursor"] is None
    for entry in page["items"]:
        assert entry["source"]
        assert entry["memory_bytes"] > 8e9
        assert entry["peak_flops_per_s"]["fp32"] > 1e12


def test_gpu_by_name_and_unknown_gpu(client: TestClient) -> None:
    h100 = client.get("/v1/gpus/h100-sxm-80gb").json()
    assert h100["peak_flops_per_s"]["bf16"] > 9e14  # dense, ~989 TFLOP/s
    problem = assert_problem(client.get("/v1/gpus/h100"), 404)
    assert "h100-sxm-80gb" in problem["detail"]
