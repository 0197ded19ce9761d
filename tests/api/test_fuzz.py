"""Random, mostly wrong bodies: every answer is a 2xx or a problem+json 4xx, never a 500."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, 2, 3, 7, 8, 64, 4096, 10**7, 2**31]),
)
VALUES = st.one_of(
    NUMBERS, st.booleans(), st.none(), st.text(max_size=12), st.lists(st.integers(), max_size=3)
)
LAYOUT_KEYS = ["framework", "dp", "tp", "pp", "cp", "ep", "etp", "zero_stage", "micro_batch_size",
               "recompute", "offload_optimizer", "offload_params", "virtual_pipeline_stages",
               "sequence_parallel", "gradient_accumulation_steps", "chunked_loss",
               "torch_compile", "recompute_every_n_layers", "recompute_modules"]  # fmt: skip
TRAINING_KEYS = ["seq_len", "global_batch_size", "precision", "optimizer", "method", "lora_rank", "attention",
                 "mtp_num_layers"]  # fmt: skip
ENUMS = {
    "framework": ["deepspeed", "megatron", "fsdp"],
    "recompute": ["none", "selective", "full"],
    "offload_optimizer": ["none", "cpu", "nvme"],
    "offload_params": ["none", "cpu", "nvme"],
    "precision": ["bf16", "fp16", "fp32", "fp8", "bf16_pure"],
    "optimizer": ["adamw", "adamw_8bit", "sgd", "adafactor", "lion"],
    "method": ["full", "lora", "qlora"],
    "attention": ["flash", "sdpa", "eager"],
    "torch_compile": ["none", "model", "model_and_loss"],
    "recompute_modules": [["core_attn"], ["mlp"], ["moe", "moe_act"], ["moe"], [], ["mlp", "mlp"]],
}


def _field(key: str) -> st.SearchStrategy[Any]:
    if key in ENUMS:
        return st.one_of(st.sampled_from(ENUMS[key]), VALUES)
    return st.one_of(st.sampled_from([1, 2, 4, 8, 16, 32]), VALUES)


def _section(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={k: _field(k) for k in keys})


BODIES = st.fixed_dictionaries(
    {
        "model": st.sampled_from([{"preset": "gpt2"}, {"preset": "mixtral-8x7b"}, {"preset": "nope"}, {}]),
        "cluster": st.fixed_dictionaries(
            {"gpu": st.sampled_from(["h100-sxm-80gb", "rtx-4090-24gb", "x"])},
            optional={"num_nodes": _field("n"), "gpus_per_node": _field("n")},
        ),
        "training": _section(TRAINING_KEYS),
        "layout": _section(LAYOUT_KEYS),
    }
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES)
def test_estimates_never_fail_with_500(client: TestClient, body: dict[str, Any]) -> None:
    response = client.post("/v1/estimates", json=body)
    assert response.status_code in (200, 400, 413, 422), response.text
    if response.status_code != 200:
        assert response.headers["content-type"].startswith("application/problem+json")


LIST_QUERIES = st.fixed_dictionaries(
    {},
    optional={
        "limit": st.one_of(st.integers(min_value=-5, max_value=600), st.text(max_size=5)),
        "cursor": st.text(max_size=30),
        "status": st.text(max_size=12),
        "model": st.text(max_size=20),
        "created_after": st.one_of(st.text(max_size=25), st.datetimes().map(lambda d: d.isoformat())),
        "created_before": st.datetimes().map(lambda d: d.isoformat()),
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=LIST_QUERIES, path=st.sampled_from(["/v1/plans", "/v1/clusters"]))
def test_list_queries_never_fail_with_500(client: TestClient, params: dict[str, Any], path: str) -> None:
    response = client.get(path, params=params)
    assert response.status_code in (200, 422), response.text


PATCHES = st.fixed_dictionaries(
    {},
    optional={
        k: st.one_of(st.none(), VALUES, st.sampled_from([1, 2, 8, "a100-sxm-80gb", "x"]))
        for k in (
            "name",
            "description",
            "gpu",
            "num_nodes",
            "gpus_per_node",
            "intra_node_bandwidth_bytes_per_s",
            "inter_node_bandwidth_bytes_per_s",
            "inter_node_bandwidth_gbps",
            "cpu_memory_bytes_per_node",
        )
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(patch=PATCHES)
def test_cluster_patches_never_fail_with_500(client: TestClient, patch: dict[str, Any]) -> None:
    listed = client.get("/v1/clusters").json()["items"]
    if listed:
        cluster_id = listed[0]["id"]
    else:
        body = {"name": "fuzz", "gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
        cluster_id = client.post("/v1/clusters", json=body).json()["id"]
    before = client.get(f"/v1/clusters/{cluster_id}").json()
    response = client.patch(f"/v1/clusters/{cluster_id}", json=patch)
    assert response.status_code in (200, 409, 422), response.text
    if response.status_code != 200:
        assert client.get(f"/v1/clusters/{cluster_id}").json() == before


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.fixed_dictionaries(
        {},
        optional={
            "name": st.one_of(st.text(max_size=30), VALUES),
            "gpu": st.one_of(st.sampled_from(["a100-sxm-80gb", "none"]), VALUES),
            "num_nodes": _field("n"),
            "gpus_per_node": _field("n"),
            "inter_node_bandwidth_bytes_per_s": NUMBERS,
            "inter_node_bandwidth_gbps": NUMBERS,
            "cpu_memory_bytes_per_node": NUMBERS,
        },
    )
)
def test_clusters_never_fail_with_500(client: TestClient, body: dict[str, Any]) -> None:
    response = client.post("/v1/clusters", json=body)
    assert response.status_code in (201, 400, 409, 422), response.text


PLAUSIBLE = st.fixed_dictionaries(
    {
        "model": st.sampled_from([{"preset": p} for p in ("gpt2", "mixtral-8x7b", "falcon-7b", "gemma-2b")]),
        "cluster": st.fixed_dictionaries(
            {
                "gpu": st.sampled_from(["h100-sxm-80gb", "v100-sxm2-32gb", "mi300x-192gb"]),
                "num_nodes": st.sampled_from([1, 2]),
                "gpus_per_node": st.sampled_from([1, 2, 8]),
                "inter_node_bandwidth_gbps": st.sampled_from([12.5, 50]),
            }
        ),
        "training": st.fixed_dictionaries(
            {
                "seq_len": st.sampled_from([1, 512, 2048, 32768]),
                "global_batch_size": st.sampled_from([1, 16, 64]),
            },
            optional={k: st.sampled_from(v) for k, v in ENUMS.items() if k in TRAINING_KEYS},
        ),
        "layout": st.fixed_dictionaries(
            {},
            optional={
                **{k: st.sampled_from(v) for k, v in ENUMS.items() if k in LAYOUT_KEYS},
                **{
                    k: st.sampled_from([1, 2, 4, 8])
                    for k in ("dp", "tp", "pp", "cp", "ep", "micro_batch_size")
                },
                "zero_stage": st.sampled_from([0, 1, 2, 3]),
                "sequence_parallel": st.booleans(),
                "chunked_loss": st.booleans(),
                "virtual_pipeline_stages": st.sampled_from([1, 2]),
            },
        ),
    }
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=PLAUSIBLE)
def test_plausible_layouts_are_estimated_or_refused_by_a_named_rule(
    client: TestClient, body: dict[str, Any]
) -> None:
    response = client.post("/v1/estimates", json=body)
    assert response.status_code in (200, 422), response.text
    result = response.json()
    if response.status_code == 422:
        assert result["errors"][0]["field"]
        return
    per_gpu = result["memory"]["per_gpu"]
    assert all(v >= 0 for v in per_gpu.values())
    assert result["time"]["step_s"] > 0
    # The verdict, the warnings and the limits agree with each other.
    assert result["fits"] == (result["memory"]["headroom_bytes"] >= 0)
    assert result["fits"] != any(w.startswith("does not fit") for w in result["warnings"])
    largest = result["limits"]["max_micro_batch_size"]
    if largest:
        layout = result["layout"] | {"micro_batch_size": largest, "gradient_accumulation_steps": None}
        again = client.post("/v1/estimates", json=body | {"layout": layout})
        assert again.status_code == 200, again.text
        assert again.json()["fits"], f"the advertised micro-batch {largest} does not fit"
