"""POST /v1/estimates end to end: the breakdown adds up, rules are named, stored clusters work."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.contracts.estimates import MemoryPerGPUOut
from tests.api.helpers import assert_problem

H100_NODE = {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}


# tokens: body() prices the run (gpu_hour_cost), which needs them
QLORA = {"seq_len": 4096, "global_batch_size": 64, "tokens": 10**9, "method": "qlora"}
LORA = {"seq_len": 4096, "global_batch_size": 64, "tokens": 10**9, "method": "lora"}


def body(**layout: Any) -> dict[str, Any]:
    return {
        "model": {"preset": "llama-2-7b"},
        "cluster": H100_NODE,
        "training": {"seq_len": 4096, "global_batch_size": 64, "tokens": 10**9},
        "layout": {"framework": "deepspeed", "dp": 8, "zero_stage": 2, "recompute": "full"} | layout,
        "gpu_hour_cost": 2.0,
    }


def post(client: TestClient, payload: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/estimates", json=payload)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_breakdown_adds_up_and_zero2_states_follow_the_paper(client: TestClient) -> None:
    result = post(client, body())
    per_gpu = result["memory"]["per_gpu"]
    parts = ("parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead")
    assert per_gpu["total"] == sum(per_gpu[k] for k in parts)
    assert result["memory"]["headroom_bytes"] == result["memory"]["capacity_bytes"] - per_gpu["total"]
    # ZeRO-2 (arXiv:1910.02054 §5): 2P fp16 weights, 2P/N grads, 12P/N fp32 states; P = 6,738,415,616.
    p = 6_738_415_616
    assert per_gpu["parameters"] == 2 * p
    assert per_gpu["gradients"] == 2 * p // 8
    assert per_gpu["optimizer_states"] == 12 * p // 8
    assert result["fits"] is True
    assert result["layout"]["gradient_accumulation_steps"] == 8  # 64 = 1 x 8 x 8
    time = result["time"]
    assert abs(time["step_s"] - sum(time["breakdown"].values())) < 1e-9 * time["step_s"]
    assert 0 < time["mfu"] <= time["hfu"] < 1
    # 10^9 tokens in steps of 64 x 4096 = 262,144 tokens: 3,815 whole steps (3,814.7 rounded up)
    assert result["time_to_train_s"] == pytest.approx(3_815 * time["step_s"], rel=1e-12)
    assert "3,815 optimizer steps of 262,144 tokens" in " ".join(result["assumptions"])
    assert abs(result["cost_to_train"] - result["time_to_train_s"] / 3600 * 8 * 2.0) < 1e-6
    assert result["limits"]["max_micro_batch_size"] >= 1
    assert result["assumptions"]


def test_seed_article_7b_zero2_on_8_x_24gb_does_not_fit(client: TestClient) -> None:
    cluster = {"gpu": "rtx-4090-24gb", "num_nodes": 1, "gpus_per_node": 8}
    result = post(client, body(micro_batch_size=1) | {"cluster": cluster})
    assert result["fits"] is False
    states = sum(result["memory"]["per_gpu"][k] for k in ("parameters", "gradients", "optimizer_states"))
    assert states > 24 * 2**30 * 0.97  # 2P + 14P/8 = 25.3 GB before activations
    assert any("does not fit" in w for w in result["warnings"])


def test_invalid_layout_names_rule_and_numbers(client: TestClient) -> None:
    problem = assert_problem(client.post("/v1/estimates", json=body(tp=3)), 422)
    assert problem["errors"][0]["rule"] == "world_size"
    assert "24" in problem["detail"] and "8" in problem["detail"]
    problem = assert_problem(client.post("/v1/estimates", json=body(offload_params="cpu")), 422)
    assert problem["errors"][0]["field"] == "layout.offload_params"


def test_global_batch_must_divide(client: TestClient) -> None:
    payload = body()
    payload["training"]["global_batch_size"] = 60
    problem = assert_problem(client.post("/v1/estimates", json=payload), 422)
    assert "60" in problem["detail"]


def test_stored_cluster_by_id_and_unknown_id(client: TestClient) -> None:
    created = client.post("/v1/clusters", json=H100_NODE | {"name": "box"}).json()
    by_id = post(client, body() | {"cluster": {"id": created["id"]}})
    inline = post(client, body())
    assert by_id["memory"] == inline["memory"]
    # well formed, naming a cluster that is not there: the 404 its own URL answers, naming the field
    for unknown in ("nope", "0"):
        response = client.post("/v1/estimates", json=body() | {"cluster": {"id": unknown}})
        problem = assert_problem(response, 404)
        assert problem["errors"][0]["field"] == "cluster.id"


def test_inline_cluster_errors_name_the_field_without_union_noise(client: TestClient) -> None:
    payload = body() | {"cluster": H100_NODE | {"num_nodes": 0}}
    problem = assert_problem(client.post("/v1/estimates", json=payload), 422)
    assert [e["field"] for e in problem["errors"]] == ["cluster.num_nodes"]


def test_an_inline_cluster_past_one_node_without_a_network_names_the_field_where_it_goes(
    client: TestClient,
) -> None:
    """Found by bench/fuzz_probe.py: the missing inter-node bandwidth of an inline cluster was named
    as a top-level field of the estimate or plan (``inter_node_bandwidth_bytes_per_s``), which the
    request has no such field at; its place is ``cluster.inter_node_bandwidth_bytes_per_s``."""
    two_nodes = H100_NODE | {"gpu": "h100-pcie-80gb", "num_nodes": 2}  # no reference node network
    for path, payload in (
        ("/v1/estimates", body() | {"cluster": two_nodes}),
        ("/v1/plans", {"model": body()["model"], "cluster": two_nodes, "training": body()["training"]}),
    ):
        problem = assert_problem(client.post(path, json=payload), 422)
        assert [e["field"] for e in problem["errors"]] == ["cluster.inter_node_bandwidth_bytes_per_s"], path


def test_a_custom_gpu_that_fails_its_checks_is_not_also_told_to_be_a_string(client: TestClient) -> None:
    """Found by bench/fuzz_probe.py: a custom GPU (a JSON object) missing a field was answered with
    the catalog-name branch's "cluster.gpu: Input should be a valid string" first, which tells the
    client to send something it did not mean; the object's own errors are what it needs."""
    gpu = custom_gpu("a800-like", "a100-sxm-80gb", None)
    del gpu["hbm_bandwidth_bytes_per_s"]  # required (the link bandwidths default: test_custom_gpu_links)
    payload = body() | {"cluster": {"gpu": gpu, "num_nodes": 1, "gpus_per_node": 8}}
    problem = assert_problem(client.post("/v1/estimates", json=payload), 422)
    assert [e["field"] for e in problem["errors"]] == ["cluster.gpu.hbm_bandwidth_bytes_per_s"]
    assert "string" not in problem["detail"]
    # neither a name nor an object: both shapes it may take are still named
    problem = assert_problem(
        client.post("/v1/estimates", json=body() | {"cluster": H100_NODE | {"gpu": 5}}), 422
    )
    assert {e["field"] for e in problem["errors"]} == {"cluster.gpu"}
    assert len(problem["errors"]) == 2


def test_enum_and_limit_errors(client: TestClient) -> None:
    problem = assert_problem(client.post("/v1/estimates", json=body(zero_stage=4)), 422)
    assert problem["errors"][0]["field"] == "layout.zero_stage"
    payload = body()
    payload["training"]["precision"] = "fp12"
    problem = assert_problem(client.post("/v1/estimates", json=payload), 422)
    assert problem["errors"][0]["field"] == "training.precision"


GPT2 = {"seq_len": 1024, "global_batch_size": 64, "tokens": 10**9}  # within its 1,024 learned positions


def test_every_layout_rule_is_a_422_naming_rule_field_and_numbers(client: TestClient) -> None:
    mixtral = {"preset": "mixtral-8x7b"}
    cases: list[tuple[dict[str, Any], dict[str, Any], str, str]] = [
        # (layout change, other body changes, rule, field)
        ({"dp": 4}, {}, "world_size", "layout.dp"),
        # 60 sequences over dp 8: no micro-batch splits them, the degree is what to change (it named
        # micro_batch_size, which the request left out; batch review)
        (
            {"dp": 8},
            {"training": {"seq_len": 4096, "global_batch_size": 60, "tokens": 10**9}},
            "global_batch",
            "layout.dp",
        ),
        (
            {"dp": 8, "micro_batch_size": 2},
            {"training": {"seq_len": 4096, "global_batch_size": 24, "tokens": 10**9}},
            "global_batch",
            "layout.micro_batch_size",
        ),
        (
            {"dp": 1, "tp": 8},
            {"model": {"preset": "gpt2"}, "training": GPT2},
            "heads_tp",
            "layout.tp",
        ),
        (
            {"dp": 1, "pp": 8, "zero_stage": 1, "virtual_pipeline_stages": 2},
            {"model": {"preset": "gpt2"}, "training": GPT2},
            "pp_layers",
            "layout.pp",
        ),
        (
            {"dp": 4, "pp": 2, "zero_stage": 1, "pipeline_layers": [16, 15]},
            {},
            "pipeline_split",
            "layout.pipeline_layers",
        ),
        ({"dp": 4, "pp": 2, "zero_stage": 3}, {}, "zero_pp", "layout.zero_stage"),
        ({"zero_stage": 2, "offload_params": "cpu"}, {}, "offload_params", "layout.offload_params"),
        ({"ep": 2}, {}, "ep_moe", "layout.ep"),
        ({"dp": 8, "zero_stage": 3, "dp_replicate": 2}, {}, "hybrid_shard", "layout.dp_replicate"),
        (
            {"framework": "fsdp", "zero_stage": 3, "fsdp_hybrid_shard": True, "dp_replicate": 3},
            {},
            "hybrid_shard",
            "layout.dp_replicate",
        ),
        ({"dp": 8, "ep": 3}, {"model": mixtral}, "ep_experts", "layout.ep"),
        # DeepSpeed AutoTP leaves transformers' fused 3-D experts whole on every tp rank
        ({"dp": 4, "tp": 2}, {"model": mixtral}, "autotp_fused_experts", "layout.tp"),
        # ... and replaces peft's LoRA wrappers with its own layers: no adapter trains (PEFT review)
        ({"dp": 4, "tp": 2}, {"training": LORA}, "lora_autotp", "layout.tp"),
        # GPT-OSS has no MLP module for these names (fused experts, no dense MLP): peft finds none
        (
            {"dp": 8},
            {
                "model": {"preset": "gpt-oss-20b"},
                "training": LORA | {"lora_targets": ["gate_proj", "up_proj"]},
            },
            "lora_targets",
            "training.lora_targets",
        ),
        # QLoRA's NF4 base trains data-parallel only (tp: of a dense model, whose Linears AutoTP splits)
        ({"dp": 4, "tp": 2}, {"training": QLORA}, "qlora_model_parallel", "layout.tp"),
        *(
            (degrees, {"model": mixtral, "training": QLORA}, "qlora_model_parallel", f"layout.{degree}")
            for degree, degrees in (
                ("pp", {"dp": 4, "pp": 2, "zero_stage": 1}),
                ("ep", {"dp": 8, "ep": 8}),
            )
        ),
    ]
    for layout, extra, rule, field in cases:
        response = client.post("/v1/estimates", json=body(**layout) | extra)
        problem = assert_problem(response, 422)
        assert problem["errors"][0]["rule"] == rule, (layout, problem)
        assert problem["errors"][0]["field"] == field, (layout, problem)
        assert any(ch.isdigit() for ch in problem["detail"]), problem["detail"]


def test_a_rule_with_a_bound_or_a_set_of_values_gives_it_in_its_error_entry(client: TestClient) -> None:
    """The text said "deepspeed allows at most 2" and "precisions it runs: fp32, fp16" while the entry
    had neither ``limit`` nor ``allowed``, which the schema's bounds and enums give (api.md: each
    error names the field and the limit; a review of the ordinary requests)."""
    pp = assert_problem(client.post("/v1/estimates", json=body(dp=4, pp=2, zero_stage=3)), 422)["errors"][0]
    assert (pp["rule"], pp["limit"]) == ("zero_pp", {"le": 1}), pp
    stage = assert_problem(client.post("/v1/estimates", json=body(framework="fsdp", zero_stage=1)), 422)
    assert stage["errors"][0]["allowed"] == [0, 2, 3], stage
    v100 = body() | {"cluster": {"gpu": "v100-sxm2-32gb", "num_nodes": 1, "gpus_per_node": 8}}
    v100["training"] = v100["training"] | {"precision": "bf16"}
    precision = assert_problem(client.post("/v1/estimates", json=v100), 422)["errors"][0]
    assert precision["field"] == "training.precision" and "bf16" not in precision["allowed"], precision
    assert {"fp32", "fp16"} <= set(precision["allowed"]), precision


def test_an_hsdp_replica_degree_shards_inside_each_replica(client: TestClient) -> None:
    # HSDP inside one node: 2 replicas of 4 ranks hold twice FULL_SHARD's 1/8 of the states
    full = post(client, body(framework="fsdp", zero_stage=3))
    hsdp = post(client, body(framework="fsdp", zero_stage=3, fsdp_hybrid_shard=True, dp_replicate=2))
    assert hsdp["layout"]["dp_replicate"] == 2
    # left out on two nodes: the replicas the hybrid shard chose are said (one shard group per node)
    two_nodes = {"gpu": "h100-sxm-80gb", "num_nodes": 2, "gpus_per_node": 8}
    hybrid = {"framework": "fsdp", "dp": 16, "zero_stage": 3, "fsdp_hybrid_shard": True, "recompute": "full"}
    default = post(client, body() | {"cluster": two_nodes, "layout": hybrid})
    assert default["resolved_defaults"]["layout.dp_replicate"] == "2"
    # a replica per rank shards nothing (DDP): refused
    ddp = client.post("/v1/estimates", json=body(framework="fsdp", zero_stage=3, fsdp_hybrid_shard=True,
                                                  dp_replicate=8))  # fmt: skip
    assert assert_problem(ddp, 422)["errors"][0]["field"] == "layout.dp_replicate"
    for part in ("parameters", "gradients", "optimizer_states"):
        assert hsdp["memory"]["per_gpu"][part] == pytest.approx(2 * full["memory"]["per_gpu"][part], rel=1e-9)


def test_the_advertised_micro_batch_is_one_the_service_accepts(client: TestClient) -> None:
    # Llama-3-8B, FSDP FULL_SHARD over 8, global batch 64: the per-replica batch is 8, so the
    # largest micro-batch must divide 8 (an unrestricted search once advertised 7).
    payload = body(framework="fsdp", zero_stage=3, recompute="full") | {"model": {"preset": "llama-3-8b"}}
    result = post(client, payload)
    largest = result["limits"]["max_micro_batch_size"]
    assert largest in (1, 2, 4, 8)
    again = post(client, body(framework="fsdp", zero_stage=3, recompute="full", micro_batch_size=largest)
                 | {"model": {"preset": "llama-3-8b"}})  # fmt: skip
    assert again["fits"]


def custom_gpu(name: str, like: str, chip: str | None) -> dict[str, Any]:
    """A custom GPU with the catalog entry ``like``'s numbers, under another name."""
    spec = {
        "h100-sxm-80gb": {"bf16": 989.4e12, "fp16": 989.4e12, "hbm": 3.35e12, "nvlink": 450e9},
        "a100-sxm-80gb": {"bf16": 312e12, "fp16": 312e12, "hbm": 2.039e12, "nvlink": 300e9},
    }[like]
    gpu: dict[str, Any] = {
        "name": name,
        "memory_bytes": 80 * 2**30,
        "peak_flops_per_s": {"fp32": 19.5e12, "bf16": spec["bf16"], "fp16": spec["fp16"]},
        "hbm_bandwidth_bytes_per_s": spec["hbm"],
        "intra_node_bandwidth_bytes_per_s": spec["nvlink"],
        "pcie_bandwidth_bytes_per_s": 32e9,
    }
    return gpu | ({"chip": chip} if chip is not None else {})


def test_efficiency_follows_the_gpu_die_not_its_name(client: TestClient) -> None:
    # An H800 and an A800 are the GH100 and GA100 dies: they get the peak fraction fitted on those
    # (tuning.toml), not the default; a name alone, even 'a100-like', selects nothing.
    def mfu(gpu: dict[str, Any]) -> float:
        cluster = {"gpu": gpu, "num_nodes": 1, "gpus_per_node": 8}
        result = post(client, body() | {"cluster": cluster})
        return float(result["time"]["mfu"])

    catalog = {
        name: post(client, body() | {"cluster": {"gpu": name, "num_nodes": 1, "gpus_per_node": 8}})
        for name in ("h100-sxm-80gb", "a100-sxm-80gb")
    }
    h800, a800 = custom_gpu("h800", "h100-sxm-80gb", "gh100"), custom_gpu("a800", "a100-sxm-80gb", "ga100")
    # without a chip, the most conservative fitted die's efficiency (issue 24): naming the die is faster
    assert mfu(a800) > mfu(custom_gpu("a800", "a100-sxm-80gb", None))  # ga100's fraction against the least
    assert mfu(h800) > mfu(custom_gpu("h800", "h100-sxm-80gb", None))  # gh100's against the least
    assert mfu(custom_gpu("my-a100-like", "a100-sxm-80gb", None)) == mfu(
        custom_gpu("x", "a100-sxm-80gb", None)
    )
    # the custom A800 with the catalog A100's numbers and die is timed like it (up to its HBM/PCIe)
    assert abs(mfu(a800) / catalog["a100-sxm-80gb"]["time"]["mfu"] - 1) < 0.02
    notes = post(client, body() | {"cluster": {"gpu": a800, "num_nodes": 1, "gpus_per_node": 8}})[
        "assumptions"
    ]
    assert any("fitted on the ga100 die" in note for note in notes)


def test_an_unknown_chip_is_refused_with_the_known_ones(client: TestClient) -> None:
    cluster = {"gpu": custom_gpu("mystery", "h100-sxm-80gb", "zz999"), "num_nodes": 1, "gpus_per_node": 8}
    response = client.post("/v1/estimates", json=body() | {"cluster": cluster})
    problem = assert_problem(response, 422)
    assert any(e["field"].endswith("gpu.chip") and "gh100" in e["message"] for e in problem["errors"])


@pytest.mark.parametrize(("name", "value"), [("lora_rank", 8), ("lora_targets", ["q_proj"])])
def test_adapter_settings_without_adapters_are_refused(client: TestClient, name: str, value: Any) -> None:
    payload = body()
    payload["training"][name] = value
    problem = assert_problem(client.post("/v1/estimates", json=payload), 422)
    assert problem["errors"][0]["field"] == f"training.{name}"
    assert problem["errors"][0]["rule"] == "unused"
    payload["training"]["method"] = "lora"  # with adapters the same value is estimated
    post(client, payload)


def test_a_switch_that_changes_nothing_is_refused(client: TestClient) -> None:
    problem = assert_problem(client.post("/v1/estimates", json=body(sequence_parallel=True)), 422)
    assert (problem["errors"][0]["field"], problem["errors"][0]["rule"]) == (
        "layout.sequence_parallel",
        "unused",
    )


def test_estimate_lists_memory_per_pipeline_rank(client: TestClient) -> None:
    body = {
        "model": {"preset": "llama-3.1-8b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 4096, "global_batch_size": 64},
        "layout": {"framework": "megatron", "dp": 2, "tp": 2, "pp": 2, "zero_stage": 1},
    }
    memory = client.post("/v1/estimates", json=body).json()["memory"]
    assert [stage["rank"] for stage in memory["per_stage"]] == [0, 1]
    assert max(stage["total"] for stage in memory["per_stage"]) == memory["per_gpu"]["total"]
    for stage in memory["per_stage"]:
        parts = ("parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead")
        assert stage["total"] == sum(stage[p] for p in parts)


def test_torch_compile_is_estimated_for_fsdp_and_refused_where_it_is_not_modelled(client: TestClient) -> None:
    fsdp = {"framework": "fsdp", "zero_stage": 3, "recompute": "selective_op"}
    eager = post(client, body(**fsdp))
    model = post(client, body(**fsdp, torch_compile="model"))
    both = post(client, body(**fsdp, torch_compile="model_and_loss"))
    # inductor's fused pointwise kernels: less memory-bound time; the fused loss: no fp32 logits
    assert both["time"]["step_s"] < eager["time"]["step_s"]
    assert model["memory"]["per_gpu"]["total"] <= eager["memory"]["per_gpu"]["total"]
    assert both["memory"]["per_gpu"]["total"] < model["memory"]["per_gpu"]["total"]
    assert any("torch.compile" in note for note in both["assumptions"])
    assert both["layout"]["torch_compile"] == "model_and_loss"
    # DeepSpeed's compiled engine is not modelled; Megatron has no such switch; NF4 breaks the graph
    for layout, extra in (
        ({"torch_compile": "model"}, {}),
        ({"framework": "megatron", "zero_stage": 1, "torch_compile": "model_and_loss"}, {}),
        (fsdp | {"torch_compile": "model"}, {"method": "qlora"}),
    ):
        payload = body(**layout)
        payload["training"] |= extra
        problem = assert_problem(client.post("/v1/estimates", json=payload), 422)
        assert problem["errors"][0]["field"] == "layout.torch_compile", problem
        assert "torch_compile" in problem["detail"], problem["detail"]


def test_expert_tensor_parallelism_is_megatrons_and_folds_ep_over_tp(client: TestClient) -> None:
    # Mixtral on one node, TP 2 x DP 4: EP 8 is a valid expert grid only with the experts whole (etp 1)
    megatron = {"framework": "megatron", "dp": 4, "tp": 2, "sequence_parallel": True, "zero_stage": 1}
    payload = body(**megatron, ep=8, etp=1) | {"model": {"preset": "mixtral-8x7b"}}
    folded = post(client, payload)
    assert (folded["layout"]["ep"], folded["layout"]["etp"]) == (8, 1)
    default = post(client, body(**megatron, ep=4) | {"model": {"preset": "mixtral-8x7b"}})
    assert default["layout"]["etp"] is None
    # one expert whole per GPU against half of two: the experts' parameters per GPU are equal
    assert folded["memory"]["per_gpu"]["parameters"] == pytest.approx(
        default["memory"]["per_gpu"]["parameters"], rel=1e-6
    )
    for layout, rule in (
        (megatron | {"ep": 8}, "ep_dp"),  # etp = tp: 2 x 8 does not divide tp x dp = 8
        ({"framework": "fsdp", "zero_stage": 3, "ep": 8, "etp": 1}, "etp_framework"),
    ):
        problem = assert_problem(
            client.post("/v1/estimates", json=body(**layout) | {"model": {"preset": "mixtral-8x7b"}}), 422
        )
        assert problem["errors"][0]["rule"] == rule, problem
    problem = assert_problem(client.post("/v1/estimates", json=body(etp=1)), 422)  # llama: no experts
    assert problem["errors"][0]["field"] == "layout.etp", problem


def test_every_nth_layer_checkpointing_is_torchtitans(client: TestClient) -> None:
    fsdp = {"framework": "fsdp", "zero_stage": 3, "recompute": "full"}
    every = post(client, body(**fsdp, recompute_every_n_layers=2))
    full = post(client, body(**fsdp))
    assert every["layout"]["recompute_every_n_layers"] == 2
    assert every["memory"]["per_gpu"]["activations"] > full["memory"]["per_gpu"]["activations"]
    assert every["time"]["breakdown"]["recompute_s"] < full["time"]["breakdown"]["recompute_s"]
    for layout in (
        {"framework": "megatron", "zero_stage": 1, "recompute": "full", "recompute_every_n_layers": 2},
        fsdp | {"recompute_every_n_layers": 1},  # every layer: that is recompute full
    ):
        problem = assert_problem(client.post("/v1/estimates", json=body(**layout)), 422)
        assert problem["errors"][0]["field"] == "layout.recompute_every_n_layers", problem


def test_megatron_recompute_modules(client: TestClient) -> None:
    megatron = {"framework": "megatron", "zero_stage": 1, "tp": 2, "dp": 4, "sequence_parallel": True,
                "recompute": "selective"}  # fmt: skip
    default = post(client, body(**megatron))
    mlp = post(client, body(**megatron, recompute_modules=["core_attn", "mlp"]))
    assert mlp["layout"]["recompute_modules"] == ["core_attn", "mlp"]
    assert default["layout"]["recompute_modules"] is None
    assert mlp["memory"]["per_gpu"]["activations"] < default["memory"]["per_gpu"]["activations"]
    assert mlp["time"]["breakdown"]["recompute_s"] > default["time"]["breakdown"]["recompute_s"]
    for layout, reason in (
        (megatron | {"recompute_modules": ["moe"]}, "MoE"),  # llama-2-7b has no MoE block
        (megatron | {"recompute": "full", "recompute_modules": ["mlp"]}, "selective"),
        (megatron | {"recompute_modules": ["mlp", "mlp"]}, "once"),
    ):
        problem = assert_problem(client.post("/v1/estimates", json=body(**layout)), 422)
        assert problem["errors"][0]["field"] == "layout.recompute_modules", problem
        assert reason in problem["errors"][0]["message"] or reason in problem["detail"], problem
    problem = assert_problem(
        client.post("/v1/estimates", json=body(**megatron, recompute_modules=["mlp_fc1"])), 422
    )
    assert problem["errors"][0]["field"].startswith("layout.recompute_modules"), problem


def test_multi_token_prediction(client: TestClient) -> None:
    megatron = {"framework": "megatron", "zero_stage": 1, "pp": 2, "dp": 4}
    plain = post(client, body(**megatron))
    payload = body(**megatron)
    payload["training"] = payload["training"] | {"mtp_num_layers": 1}
    mtp = post(client, payload)
    assert mtp["time"]["step_s"] > plain["time"]["step_s"]
    assert mtp["memory"]["per_gpu"]["parameters"] >= plain["memory"]["per_gpu"]["parameters"]
    payload = body()
    payload["training"] = payload["training"] | {"mtp_num_layers": 1}  # deepspeed builds no MTP
    problem = assert_problem(client.post("/v1/estimates", json=payload), 422)
    assert problem["errors"][0]["field"] == "training.mtp_num_layers", problem


def test_moe_a2a_overlap(client: TestClient) -> None:
    moe = {"framework": "megatron", "zero_stage": 1, "dp": 8, "ep": 8, "recompute": "selective"}
    payload = body(**moe) | {"model": {"preset": "mixtral-8x7b"}}
    payload["cluster"] = {
        "gpu": "h100-sxm-80gb",
        "num_nodes": 2,
        "gpus_per_node": 8,
        "inter_node_bandwidth_gbps": 400,
    }
    payload["layout"]["dp"] = 16
    plain = post(client, payload)
    payload["layout"]["moe_a2a_overlap"] = True
    overlapped = post(client, payload)
    assert overlapped["time"]["breakdown"]["ep_comm_s"] < plain["time"]["breakdown"]["ep_comm_s"]
    assert overlapped["memory"]["per_gpu"]["activations"] > plain["memory"]["per_gpu"]["activations"]
    problem = assert_problem(client.post("/v1/estimates", json=body(framework="megatron", zero_stage=1,
                                                                     moe_a2a_overlap=True)), 422)  # fmt: skip
    assert problem["errors"][0]["field"] == "layout.moe_a2a_overlap", problem


def test_moe_dispatcher(client: TestClient) -> None:
    moe = {"framework": "megatron", "zero_stage": 1, "dp": 8, "ep": 8}
    payload = body(**moe) | {"model": {"preset": "mixtral-8x7b"}}
    alltoall = post(client, payload)
    assert alltoall["layout"]["moe_dispatcher"] == "alltoall"  # the default
    payload["layout"]["moe_dispatcher"] = "flex"
    flex = post(client, payload)
    assert flex["layout"]["moe_dispatcher"] == "flex"
    assert flex["time"]["breakdown"]["ep_comm_s"] != alltoall["time"]["breakdown"]["ep_comm_s"]
    # Megatron's dispatcher only, and only where there are routed tokens to dispatch
    for layout in (
        {"framework": "fsdp", "zero_stage": 3, "dp": 8, "ep": 8},
        {"framework": "deepspeed", "zero_stage": 2, "dp": 8, "ep": 8},
        {"framework": "megatron", "zero_stage": 1, "dp": 8},
    ):
        refused = body(**layout, moe_dispatcher="flex") | {"model": {"preset": "mixtral-8x7b"}}
        problem = assert_problem(client.post("/v1/estimates", json=refused), 422)
        assert problem["errors"][0]["field"] == "layout.moe_dispatcher", problem
    unknown = body(**moe, moe_dispatcher="deepep") | {"model": {"preset": "mixtral-8x7b"}}
    problem = assert_problem(client.post("/v1/estimates", json=unknown), 422)
    assert problem["errors"][0]["field"] == "layout.moe_dispatcher", problem


def test_megatron_gradient_dtype_and_fp8_parameter_gather(client: TestClient) -> None:
    megatron = {"framework": "megatron", "zero_stage": 1, "dp": 8}
    payload = body(**megatron)
    payload["training"] = payload["training"] | {"precision": "fp8"}
    recipes = post(client, payload)  # unset: NVIDIA's recipes, bf16 grads and fp8 weights
    payload["layout"] |= {"grad_reduce_in_fp32": True, "fp8_param_gather": False}
    plain = post(client, payload)  # Megatron-LM's own defaults
    payload["layout"] |= {"grad_reduce_in_fp32": False, "fp8_param_gather": True}
    lean = post(client, payload)
    assert lean["memory"] == recipes["memory"] and lean["time"] == recipes["time"]
    # bf16 main grads: half the fp32 buffer; fp8 weights: no bf16 copy beside the fp8 cache
    assert lean["memory"]["per_gpu"]["gradients"] * 2 == pytest.approx(
        plain["memory"]["per_gpu"]["gradients"], rel=1e-6
    )
    assert lean["memory"]["per_gpu"]["parameters"] < plain["memory"]["per_gpu"]["parameters"]
    assert any("--grad-reduce-in-bf16" in note for note in lean["assumptions"])
    problem = assert_problem(client.post("/v1/estimates", json=body(grad_reduce_in_fp32=False)), 422)
    assert problem["errors"][0]["field"] == "layout.grad_reduce_in_fp32", problem


def test_tp_switches_left_out_follow_the_frameworks_recipes_as_the_search_builds_them(
    client: TestClient,
) -> None:
    """Megatron at tp > 1 without sequence_parallel / tp_comm_overlap runs as NVIDIA's recipes and
    the search set them (both on), and the answer names them; DeepSpeed AutoTP has no sequence
    parallelism; what the request states is kept; at tp = 1 nothing is resolved."""
    megatron = {"framework": "megatron", "dp": 2, "tp": 4, "zero_stage": 1, "recompute": "none"}
    omitted = post(client, body() | {"layout": megatron})
    assert omitted["layout"]["sequence_parallel"] is True and omitted["layout"]["tp_comm_overlap"] is True
    assert omitted["resolved_defaults"]["layout.sequence_parallel"] == "true"
    assert omitted["resolved_defaults"]["layout.tp_comm_overlap"] == "true"
    switches = {"sequence_parallel": True, "tp_comm_overlap": True}
    stated = post(client, body() | {"layout": megatron | switches})
    assert stated["time"] == omitted["time"] and stated["memory"]["per_gpu"] == omitted["memory"]["per_gpu"]
    tp_switches = ("layout.sequence_parallel", "layout.tp_comm_overlap")
    assert not any(k in tp_switches for k in stated["resolved_defaults"])
    own = post(client, body() | {"layout": megatron | {"sequence_parallel": False, "tp_comm_overlap": False}})
    assert own["layout"]["sequence_parallel"] is False
    # without SP every TP rank keeps the norms' and dropout's activations whole: more memory, slower
    assert own["memory"]["per_gpu"]["activations"] > omitted["memory"]["per_gpu"]["activations"]
    assert own["time"]["step_s"] > omitted["time"]["step_s"]
    autotp = post(client, body(dp=4, tp=2))
    assert autotp["layout"]["sequence_parallel"] is False and autotp["layout"]["tp_comm_overlap"] is False
    assert autotp["resolved_defaults"]["layout.sequence_parallel"] == "false"
    plain = post(client, body())
    assert not any(k in tp_switches for k in plain["resolved_defaults"])


def test_async_tp_needs_torch_compile_and_is_the_compiled_fsdp_default(client: TestClient) -> None:
    """fsdp's tp_comm_overlap is torchtitan's Async TP, an inductor pass: stated without torch_compile
    it is refused naming the field; left out, a compiled TP layout runs it (the search's default) and
    an eager one does not."""
    fsdp = {"framework": "fsdp", "dp": 4, "tp": 2, "zero_stage": 3, "recompute": "full"}
    eager = client.post("/v1/estimates", json=body() | {"layout": fsdp | {"tp_comm_overlap": True}})
    problem = assert_problem(eager, 422)
    error = problem["errors"][0]
    assert (error["field"], error["rule"]) == ("layout.tp_comm_overlap", "tp_comm_overlap"), problem
    assert "torch_compile" in error["message"]
    assert post(client, body() | {"layout": fsdp})["layout"]["tp_comm_overlap"] is False
    compiled = fsdp | {"torch_compile": "model_and_loss"}
    omitted = post(client, body() | {"layout": compiled})
    assert omitted["resolved_defaults"]["layout.tp_comm_overlap"] == "true"
    vanilla = post(client, body() | {"layout": compiled | {"tp_comm_overlap": False}})
    assert vanilla["time"]["step_s"] > omitted["time"]["step_s"]


FOUR_NODES = {
    "gpu": "h100-sxm-80gb",
    "num_nodes": 4,
    "gpus_per_node": 8,
    "inter_node_bandwidth_bytes_per_s": 50e9,
}


def test_a_plans_megatron_layout_estimates_the_same_with_its_switches_left_out(client: TestClient) -> None:
    """A plan's Megatron layout, posted to /v1/estimates without the two switches, gives the plan's
    numbers: the estimate's defaults are the search's."""
    plan = client.post(
        "/v1/plans",
        json={
            "model": {"preset": "llama-3-70b"},
            "cluster": FOUR_NODES,
            "training": {"seq_len": 4096, "global_batch_size": 512},
            "constraints": {"frameworks": ["megatron"]},
        },
    )
    assert plan.status_code in (200, 201), plan.text
    recommended = plan.json()["recommended"]
    layout = dict(recommended["layout"])
    assert layout["tp"] > 1 and layout["sequence_parallel"] is True
    for name in ("sequence_parallel", "tp_comm_overlap", "gradient_accumulation_steps"):
        layout.pop(name)
    estimate = post(
        client,
        {
            "model": {"preset": "llama-3-70b"},
            "cluster": FOUR_NODES,
            "training": {"seq_len": 4096, "global_batch_size": 512},
            "layout": {k: v for k, v in layout.items() if v is not None},
        },
    )
    assert estimate["time"]["step_s"] == pytest.approx(recommended["estimate"]["time"]["step_s"], rel=1e-12)
    assert estimate["memory"]["per_gpu"] == recommended["estimate"]["memory"]["per_gpu"]


def test_memory_names_its_three_statistics_and_the_one_the_fit_uses(client: TestClient) -> None:
    memory = post(client, body(framework="megatron", tp=2, dp=4, zero_stage=1))["memory"]
    per_gpu = memory["per_gpu"]
    states = ("parameters", "gradients", "optimizer_states", "activations", "buffers")
    assert per_gpu["peak_allocated_bytes"] == sum(per_gpu[k] for k in states)
    assert per_gpu["peak_reserved_bytes"] == per_gpu["peak_allocated_bytes"] + per_gpu["fragmentation"]
    outside = per_gpu["cuda_context"] + per_gpu["nccl_buffers"] + per_gpu["tp_comm_buffers"]
    assert per_gpu["device_used_bytes"] == per_gpu["peak_reserved_bytes"] + outside
    assert per_gpu["total"] == per_gpu["device_used_bytes"]
    assert per_gpu["overhead"] == per_gpu["fragmentation"] + outside
    # Megatron at tp 2 overlaps TP communication by default: TE's userbuffers, 12 of s x b x h in bf16
    assert per_gpu["tp_comm_buffers"] == 12 * 2 * 4096 * 4096
    # the catalog's allowances: a 768 MiB context, 256 MiB of NCCL buffers for each of the dp and tp groups
    assert (per_gpu["cuda_context"], per_gpu["nccl_buffers"]) == (768 * 2**20, 2 * 256 * 2**20)
    assert memory["fit_statistic"] == "device_used"
    assert memory["headroom_bytes"] == memory["capacity_bytes"] - per_gpu["device_used_bytes"]
    for stage in memory["per_stage"]:
        assert stage["peak_allocated_bytes"] <= stage["peak_reserved_bytes"] <= stage["device_used_bytes"]


def test_plans_name_the_statistics_and_plans_stored_before_them_read_back(client: TestClient) -> None:
    plan = client.post(
        "/v1/plans",
        json={
            "model": {"preset": "gpt2"},
            "cluster": H100_NODE,
            "training": {"seq_len": 1024, "global_batch_size": 64},
            "constraints": {"top_k": 1, "frameworks": ["deepspeed"]},
            "launchers": [],
        },
    )
    assert plan.status_code == 201, plan.text
    memory = plan.json()["recommended"]["estimate"]["memory"]
    assert memory["fit_statistic"] == "device_used"
    assert memory["per_gpu"]["device_used_bytes"] == memory["per_gpu"]["total"]
    # a plan stored before the statistics were named: device used was its total; the rest unknown
    read = MemoryPerGPUOut.model_validate({k: memory["per_gpu"][k] for k in OLD})
    assert read.device_used_bytes == read.total == memory["per_gpu"]["total"]
    assert (
        read.peak_allocated_bytes is None and read.peak_reserved_bytes is None and read.fragmentation is None
    )


# what MemoryPerGPUOut held before the statistics were named
OLD = ("parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead", "total")


def test_a_layout_left_out_is_the_empty_layout(client: TestClient) -> None:
    """An estimate without ``layout`` was a 422 "Field required" while ``"layout": {}`` answered: it
    is that layout, every field its default, dp filling the cluster (named in resolved_defaults)."""
    without = {k: v for k, v in body().items() if k != "layout"}
    left_out = client.post("/v1/estimates", json=without)
    empty = client.post("/v1/estimates", json=without | {"layout": {}})
    assert left_out.status_code == empty.status_code == 200, left_out.text
    assert left_out.json() == empty.json()
    assert left_out.json()["resolved_defaults"]["layout.dp"] == "8"


def test_a_layout_left_out_names_every_default_that_changes_the_answer(client: TestClient) -> None:
    """{"framework": "fsdp"} was estimated as NO_SHARD (zero_stage 0: 1.66 TB per GPU for Llama-3-70B
    on 16 H100, against 224 GB at FULL_SHARD), FSDP's default being FULL_SHARD, and the answer named
    only dp. Left out, zero_stage is the framework's own (fsdp 3, deepspeed and megatron 0), and the
    answer names it with the framework, recompute and micro-batch it assumed."""
    cluster = {"gpu": "h100-sxm-80gb", "num_nodes": 2, "gpus_per_node": 8}
    training = {"seq_len": 4096, "global_batch_size": 64}
    base = {"model": {"preset": "llama-3-70b"}, "cluster": cluster, "training": training}
    fsdp = post(client, base | {"layout": {"framework": "fsdp"}})
    assert fsdp["layout"]["zero_stage"] == 3
    full_shard = post(client, base | {"layout": {"framework": "fsdp", "zero_stage": 3}})
    assert fsdp["memory"] == full_shard["memory"] and fsdp["time"] == full_shard["time"]
    assert {k: fsdp["resolved_defaults"][k] for k in ("layout.zero_stage", "layout.recompute")} == {
        "layout.zero_stage": "3",
        "layout.recompute": "none",
    }
    assert fsdp["resolved_defaults"]["layout.micro_batch_size"] == "1"
    assert "layout.framework" not in fsdp["resolved_defaults"]
    assert "layout.zero_stage" not in full_shard["resolved_defaults"]
    nothing = post(client, base)
    assert nothing["layout"]["framework"] == "deepspeed" and nothing["layout"]["zero_stage"] == 0
    assert nothing["resolved_defaults"]["layout.framework"] == "deepspeed"
    assert nothing["resolved_defaults"]["layout.zero_stage"] == "0"
    assert nothing["resolved_defaults"]["layout.dp"] == "16"
    megatron = post(client, base | {"layout": {"framework": "megatron", "tp": 8, "micro_batch_size": 1}})
    assert megatron["layout"]["zero_stage"] == 0 and megatron["resolved_defaults"]["layout.zero_stage"] == "0"
    assert "layout.micro_batch_size" not in megatron["resolved_defaults"]


def test_lora_targets_in_the_models_own_module_names(client: TestClient) -> None:
    """A review's case: Phi-3's real module names were a 422; they are the same adapters as the
    canonical names, to the byte."""
    body: dict[str, Any] = {
        "model": {"preset": "phi-3-mini"},
        "cluster": {"gpu": "a10-24gb", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"seq_len": 2048, "global_batch_size": 8, "method": "lora"},
        "layout": {},
    }
    own = body | {
        "training": body["training"] | {"lora_targets": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]}
    }
    canonical = body | {"training": body["training"] | {"lora_targets": "all-linear"}}
    first, second = client.post("/v1/estimates", json=own), client.post("/v1/estimates", json=canonical)
    assert first.status_code == 200, first.text
    assert first.json()["memory"] == second.json()["memory"]
    bert = body | {
        "model": {"preset": "bert-base-uncased"},
        "training": {"seq_len": 512, "global_batch_size": 8, "method": "lora", "lora_rank": 8,
                     "lora_targets": ["query", "value"]},
    }  # fmt: skip
    assert client.post("/v1/estimates", json=bert).status_code == 200


def test_a_token_budget_below_one_step_takes_one_step(client: TestClient) -> None:
    # 1,000 tokens of a 262,144-token step: the trainer runs one whole step, not 0.4% of one (review)
    payload = body()
    payload["training"]["tokens"] = 1000
    result = post(client, payload)
    assert result["time_to_train_s"] == pytest.approx(result["time"]["step_s"], rel=1e-12)
    assert result["cost_to_train"] == pytest.approx(result["time"]["step_s"] / 3600 * 8 * 2.0, rel=1e-9)
    assert "1 optimizer step of 262,144 tokens" in " ".join(result["assumptions"])


def test_deepspeed_moes_default_capacity_factor_is_said_and_sent_back_is_the_same(client: TestClient) -> None:
    """deepspeed.moe.layer.MoE drops what overflows a capacity factor of 1.0 unless told: a default that
    changes what trains was echoed as null and said nowhere (defaults review)."""
    payload = {
        "model": {"preset": "mixtral-8x7b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 2},
        "training": {"seq_len": 2048, "global_batch_size": 64},
        "layout": {"framework": "deepspeed", "ep": 8, "zero_stage": 2},
    }
    left_out = post(client, payload)
    assert left_out["resolved_defaults"]["layout.moe_capacity_factor"] == "1"
    # a warning, which the CLI and the page show (as an assumption neither showed it: parity review)
    default = "MoE capacity factor 1 (deepspeed.moe.layer.MoE's default"
    assert any(w.startswith(default) for w in left_out["warnings"])
    sent = post(client, {**payload, "layout": {**payload["layout"], "moe_capacity_factor": 1.0}})
    assert sent["memory"] == left_out["memory"] and sent["time"] == left_out["time"]
    assert "layout.moe_capacity_factor" not in sent["resolved_defaults"]
    assert not any(w.startswith(default) for w in sent["warnings"])
    assert any(a.startswith("MoE capacity factor 1:") for a in sent["assumptions"])
