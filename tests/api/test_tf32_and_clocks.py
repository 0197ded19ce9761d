"""POST /v1/estimates with precision tf32 and with a power-capped custom GPU, end to end (issue 27)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.helpers import assert_problem

A100_NODE = {"gpu": "a100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
# an H100 SXM5 by its datasheet numbers, on its die
H100_LIKE: dict[str, Any] = {
    "name": "my-h100",
    "chip": "gh100",
    "memory_bytes": 80 * 2**30,
    "peak_flops_per_s": {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "hbm_bandwidth_bytes_per_s": 3.35e12,
    "intra_node_bandwidth_bytes_per_s": 450e9,
    "pcie_bandwidth_bytes_per_s": 64e9,
}


def body(cluster: dict[str, Any], **training: Any) -> dict[str, Any]:
    return {
        "model": {"preset": "llama-2-7b"},
        "cluster": cluster,
        "training": {"seq_len": 2048, "global_batch_size": 16, "attention": "sdpa"} | training,
        "layout": {"framework": "fsdp", "dp": 8, "zero_stage": 3, "recompute": "full"},
    }


def post(client: TestClient, payload: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/estimates", json=payload)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_tf32_is_fp32_memory_at_the_tf32_peak(client: TestClient) -> None:
    tf32 = post(client, body(A100_NODE, precision="tf32"))
    fp32 = post(client, body(A100_NODE, precision="fp32"))
    assert tf32["memory"] == fp32["memory"]
    assert tf32["time"]["step_s"] < fp32["time"]["step_s"] / 3  # A100: 156 vs 19.5 TFLOP/s
    assert any(note.startswith("compute peak: tf32 dense 156 TFLOP/s") for note in tf32["assumptions"])


def test_tf32_on_a_gpu_without_it_is_a_422_naming_the_field_and_what_it_runs(client: TestClient) -> None:
    v100 = {"gpu": "v100-sxm2-32gb", "num_nodes": 1, "gpus_per_node": 8}
    problem = assert_problem(client.post("/v1/estimates", json=body(v100, precision="tf32")), 422)
    (error,) = problem["errors"]
    assert error["field"] == "training.precision"
    assert "no tf32" in error["message"] and "fp32, fp16" in error["message"]


def test_a_power_capped_custom_gpu_is_slower_and_says_so(client: TestClient) -> None:
    node = {"num_nodes": 1, "gpus_per_node": 8}
    capped_gpu = H100_LIKE | {"rated_power_w": 700, "power_limit_w": 500, "peak_clock_hz": 1.83e9}
    full = post(client, body(node | {"gpu": H100_LIKE}))
    capped = post(client, body(node | {"gpu": capped_gpu}))
    assert full["time"]["step_s"] < capped["time"]["step_s"] <= full["time"]["step_s"] / 0.8939
    note = next(n for n in capped["assumptions"] if n.startswith("compute peak"))
    assert "bf16 dense 884.4 TFLOP/s" in note and "500 W" in note and "1.64 GHz of 1.83 GHz" in note
    # the catalog's Grand Teton part is the same numbers at its 96 GB and 2.4 TB/s HBM2e
    assert client.get("/v1/gpus/h100-sxm-500w-96gb").json()["power_limit_w"] == 500


@pytest.mark.parametrize(
    ("limits", "field", "rule"),
    [
        ({"power_limit_w": 500}, "rated_power_w", "requires"),  # the rating it scales from is missing
        ({"rated_power_w": 700, "power_limit_w": 800}, "power_limit_w", "at_most"),
        ({"peak_clock_hz": 1.83e9, "sustained_clock_hz": 1.98e9}, "sustained_clock_hz", "at_most"),
    ],
)
def test_a_limit_without_its_rating_or_above_it_is_the_domains_422_naming_the_field(
    client: TestClient, limits: dict[str, float], field: str, rule: str
) -> None:
    # one rule, GPUSpec's: the API reports the domain's error at the field's place in each body
    gpu = H100_LIKE | limits
    node = {"num_nodes": 1, "gpus_per_node": 8}
    problem = assert_problem(client.post("/v1/estimates", json=body(node | {"gpu": gpu})), 422)
    (error,) = problem["errors"]
    assert (error["field"], error["rule"]) == (f"cluster.gpu.{field}", rule), problem
    stored = assert_problem(client.post("/v1/clusters", json=node | {"name": "capped", "gpu": gpu}), 422)
    assert [(e["field"], e["rule"]) for e in stored["errors"]] == [(f"gpu.{field}", rule)], stored


def test_the_catalog_says_at_what_share_of_its_peaks_a_power_capped_part_computes(client: TestClient) -> None:
    capped = client.get("/v1/gpus/h100-sxm-500w-96gb").json()
    assert capped["clock_fraction"] == pytest.approx((500 / 700) ** (1 / 3))  # the limit's clock
    assert client.get("/v1/gpus/h100-sxm-80gb").json()["clock_fraction"] == 1.0
