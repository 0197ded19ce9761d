"""An infeasible plan's suggestions say everything a request needs to change, within what the API
accepts, and its closest miss is shown or said why not (bounded-work review: an offload suggestion of
50.7 TiB per node, a 422 once sent; offload suggested where the request did not allow it, and GPUs
past its max_gpus, without a word; 4 GPUs as one node of 8; closest silently null)."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient

from service.contracts.common import MAX_MEMORY_BYTES

GiB = 2**30
A100_40 = {"gpu": "a100-sxm-40gb", "num_nodes": 1, "gpus_per_node": 8}


def _plan(client: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["status"] == "infeasible"
    return plan


def test_offload_the_request_did_not_allow_says_so(client: TestClient) -> None:
    body = {
        "model": {"preset": "llama-3.1-70b"},
        "cluster": A100_40,
        "training": {"seq_len": 4096, "global_batch_size": 32},
        "constraints": {"frameworks": ["deepspeed"], "allow_offload": False, "min_headroom_fraction": 0.5},
    }
    offload = [s for s in _plan(client, body)["suggestions"] if s["kind"] == "offload"]
    assert offload and offload[0]["detail"].startswith(
        "allow offload (constraints.allow_offload) and offload"
    )


def test_every_suggestion_is_whole_nodes_of_its_gpus(client: TestClient) -> None:
    body = {
        "model": {"preset": "llama-3.1-70b"},
        "cluster": A100_40,
        "training": {"seq_len": 8192, "global_batch_size": 64},
        "constraints": {
            "frameworks": ["deepspeed", "fsdp"],
            "allow_offload": False,
            "min_headroom_fraction": 0.5,
        },
    }
    for suggestion in _plan(client, body)["suggestions"]:
        if suggestion.get("num_gpus") is not None and suggestion.get("gpus_per_node") is not None:
            assert suggestion["num_nodes"] * suggestion["gpus_per_node"] == suggestion["num_gpus"], suggestion


def test_more_gpus_past_max_gpus_say_so(client: TestClient) -> None:
    body = {
        "model": {"preset": "llama-3.1-405b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 8192, "global_batch_size": 64},
        "constraints": {"frameworks": ["megatron"], "max_gpus": 16},
    }
    grown = [s for s in _plan(client, body)["suggestions"] if s["kind"] in ("more_gpus", "other_gpu")]
    assert grown
    for suggestion in grown:
        if suggestion["num_gpus"] > 16:
            assert "past constraints.max_gpus 16: raise it" in suggestion["detail"], suggestion


def test_more_gpus_under_a_cap_below_the_cluster_climb_from_the_cap(client: TestClient) -> None:
    """A recommendation review: 70B on 64 H100s with max_gpus 4 was told "72 x h100-sxm-80gb ... past
    constraints.max_gpus 4" (more than the cluster has): the climb began past the cluster, not past
    the cap the search stopped at. 16 of its 64 fit (a plan with max_gpus 16 is feasible)."""
    body = {
        "model": {"preset": "llama-3.1-70b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_gpus": 64},
        "training": {"seq_len": 4096, "global_batch_size": 256},
        "constraints": {"max_gpus": 4},
    }
    (more,) = [s for s in _plan(client, body)["suggestions"] if s["kind"] == "more_gpus"]
    assert more["num_gpus"] == 16 and "past constraints.max_gpus 4: raise it" in more["detail"], more
    raised = client.post("/v1/plans", json=body | {"constraints": {"max_gpus": 16}})
    assert raised.status_code == 201 and raised.json()["status"] == "feasible"


def test_offload_suggested_within_what_a_node_may_state(client: TestClient) -> None:
    huge = {
        "model_type": "llama", "num_hidden_layers": 200, "hidden_size": 32768, "num_attention_heads": 256,
        "num_key_value_heads": 16, "intermediate_size": 131072, "vocab_size": 1000000,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "hidden_act": "silu",
    }  # fmt: skip
    body = {
        "model": {"hf_config": huge},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 8192, "global_batch_size": 1024},
    }
    plan = _plan(client, body)
    for suggestion in plan["suggestions"]:
        assert (suggestion.get("cpu_per_node_bytes") or 0) <= MAX_MEMORY_BYTES, suggestion
    said = {s["kind"] for s in plan["suggestions"]} | {s["kind"] for s in plan["suggestions_skipped"]}
    assert "offload" in said


def test_a_closest_miss_not_shown_says_why(client: TestClient) -> None:
    # 1,001 sequences split over no dp of the bound's example (ZeRO-3 over all 8 GPUs): no layout to
    # estimate (Megatron's example is tp 8, dp 1, which splits them: its closest is shown)
    body = {
        "model": {"preset": "llama-3.1-405b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 8192, "global_batch_size": 1001},
        "constraints": {"frameworks": ["deepspeed", "fsdp"]},
    }
    plan = _plan(client, body)
    assert plan["closest"] is None
    (why,) = [s["reason"] for s in plan["suggestions_skipped"] if s["kind"] == "closest"]
    assert "is a bound, not a layout to estimate" in why and "global" in why


def test_an_offload_suggestions_host_ram_is_rounded_up_and_fits_once_applied(client: TestClient) -> None:
    # PEFT review: "offload with 40 GiB host RAM per node" where the layout needs 40.3 GiB; a cluster
    # given 40 GiB was infeasible again ("40.3 GiB needed")
    body = {
        "model": {"preset": "llama-3.1-70b"},
        "cluster": {"gpu": "t4-16gb", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"seq_len": 2048, "global_batch_size": 16, "method": "qlora"},
    }
    offload = [s for s in _plan(client, body)["suggestions"] if s["kind"] == "offload"]
    assert offload, "a 70B QLoRA job on one T4 fits only offloading"
    said = re.search(r"offload with (\d+) GiB host RAM per node", offload[0]["detail"])
    assert said is not None, offload[0]["detail"]
    host_gib = int(said.group(1))
    assert (host_gib - 1) * GiB < offload[0]["cpu_per_node_bytes"] <= host_gib * GiB
    applied = dict(body, cluster=dict(body["cluster"], cpu_memory_bytes_per_node=host_gib * GiB))
    applied["constraints"] = {"allow_offload": True}
    response = client.post("/v1/plans", json=applied)
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "feasible"


def test_an_offload_suggestion_asks_for_the_least_host_ram_with_the_nvme_the_nodes_state(
    client: TestClient,
) -> None:
    """An offload review: 70B on 8 A100s with 128 GiB of host RAM and 8 TiB of NVMe was told to offload
    with 1157 GiB of host RAM per node (the fastest offload, to the host), where ZeRO-Infinity on the
    nodes' NVMe needs about 280 on the same eight GPUs: the least host RAM is bisected and suggested, the
    fastest's need said beside it, and applied as its fields say (the host RAM; the NVMe the nodes
    state) the plan is feasible."""
    nvme = 8 * 2**40
    body = {
        "model": {"preset": "llama-2-70b"},
        "cluster": {"gpu": "a100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8,
                    "cpu_memory_bytes_per_node": 128 * GiB, "nvme_bytes_per_node": nvme},
        "training": {"seq_len": 2048, "global_batch_size": 64},
        "constraints": {"allow_offload": True},
        "launchers": ["deepspeed"],
    }  # fmt: skip
    plan = _plan(client, body)  # infeasible
    (offload,) = [s for s in plan["suggestions"] if s["kind"] == "offload"]
    fastest = re.search(r"the fastest offload, .* with (\d+) GiB host RAM per node", offload["detail"])
    assert fastest is not None and offload["cpu_per_node_bytes"] < int(fastest.group(1)) * GiB / 2, offload
    # on the GPUs the fastest uses (fewer GPUs need less host RAM, down to one at a tenth of the speed)
    assert "on the 8 GPUs given" in offload["detail"] and offload["num_gpus"] == 8, offload
    assert 0 < offload["nvme_per_node_bytes"] <= nvme and "GiB of NVMe per node" in offload["detail"]
    host_gib = int(re.search(r"offload with (\d+) GiB host RAM", offload["detail"]).group(1))  # type: ignore[union-attr]
    applied = dict(body, cluster=dict(body["cluster"], cpu_memory_bytes_per_node=host_gib * GiB))
    response = client.post("/v1/plans", json=applied)
    assert response.status_code == 201 and response.json()["status"] == "feasible", response.text
