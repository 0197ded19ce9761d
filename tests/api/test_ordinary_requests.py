"""Ordinary requests a user sends, found wrong by probing the API (catalog GPU x method x framework
pinned x precision x odd shapes, custom GPUs and HF configs, constraints, capacity): each answers
with a sensible 2xx or a 422 that names the field and why, quickly.

A job that no requested framework runs through any launcher, whatever the layout (Megatron-LM with
LoRA or with TF32, FSDP with fp8, Megatron-LM with a sliding-window model), used to search every
layout, reject each, and spend the rest of the request's budget on suggestions that kept the
framework: an infeasible plan with an empty ``rejected`` and no suggestion, or, within the shipped
1.5 s budget, a 422 "too large to plan" naming a 16-layer model's num_layers."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.main import create_app
from service.settings import Settings
from tests.api.helpers import assert_problem

H100_X8 = {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
SLIDING_MISTRAL = {
    "model_type": "mistral",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "sliding_window": 1024,
}


def plan_body(
    model: dict[str, Any], training: dict[str, Any], constraints: dict[str, Any], **more: Any
) -> dict[str, Any]:
    return {
        "model": model,
        "cluster": H100_X8,
        "training": {"seq_len": 2048, "global_batch_size": 16, **training},
        "constraints": constraints,
        **more,
    }


UNRUNNABLE = {
    "megatron with lora": (
        plan_body({"preset": "llama-3.2-1b"}, {"method": "lora"}, {"frameworks": ["megatron"]}),
        "constraints.frameworks",
        "PEFT",
    ),
    "megatron with qlora": (
        plan_body({"preset": "mixtral-8x7b"}, {"method": "qlora"}, {"frameworks": ["megatron"]}),
        "constraints.frameworks",
        "PEFT",
    ),
    "megatron with tf32": (
        plan_body({"preset": "llama-3.2-1b"}, {"precision": "tf32"}, {"frameworks": ["megatron"]}),
        "constraints.frameworks",
        "no TF32 switch",
    ),
    "fsdp with fp8": (
        plan_body({"preset": "llama-3-8b"}, {"precision": "fp8"}, {"frameworks": ["fsdp"]}),
        "constraints.frameworks",
        "fp8",
    ),
    "megatron with a sliding-window model": (
        plan_body({"hf_config": SLIDING_MISTRAL}, {}, {"frameworks": ["megatron"]}),
        "constraints.frameworks",
        "sliding-window",
    ),
    "lora through torchtitan only": (
        plan_body({"preset": "llama-3-8b"}, {"method": "lora"}, {}, launchers=["torchtitan"]),
        "launchers",
        "torchtitan",
    ),
}


@pytest.mark.parametrize("case", list(UNRUNNABLE))
def test_a_job_no_requested_framework_runs_is_a_422_naming_why(client: TestClient, case: str) -> None:
    body, field, words = UNRUNNABLE[case]
    problem = assert_problem(client.post("/v1/plans", json=body), 422)
    assert {e["field"] for e in problem["errors"]} == {field}, problem
    assert all(e["type"] == "no_launcher" for e in problem["errors"]), problem
    assert words in problem["detail"], problem["detail"]
    assert "too large to plan" not in problem["detail"]
    # and what would run it instead, where something does
    if field == "constraints.frameworks":
        assert "frameworks that run it" in problem["detail"] or "no framework runs it" in problem["detail"]
    assert client.get("/v1/plans").json()["items"] == []  # nothing stored


def test_a_training_field_no_framework_runs_is_named_as_the_estimate_names_it(client: TestClient) -> None:
    """LoRA on part of phi-3-mini's fused q/k/v: every framework's reason named "training", so the
    page marked no control, where an estimate names training.lora_targets (page review). Megatron's
    reason (no PEFT) is about the framework, not a training field: "training" as before."""
    body = plan_body({"preset": "phi-3-mini"}, {"method": "lora", "lora_targets": ["q_proj", "v_proj"]}, {})
    problem = assert_problem(client.post("/v1/plans", json=body), 422)
    fields = {e["message"].split(":")[0]: e["field"] for e in problem["errors"]}
    assert fields == {
        "deepspeed": "training.lora_targets",
        "fsdp": "training.lora_targets",
        "megatron": "training",
    }


@pytest.mark.parametrize(
    "body",
    [
        # (Llama 3.2's RoPE scaling factor 32 is not one pretrain_gpt.py applies: Qwen2.5 for Megatron)
        plan_body({"preset": "qwen2.5-0.5b"}, {"precision": "bf16"}, {"frameworks": ["megatron"]}),
        plan_body(
            {"preset": "llama-3.2-1b"}, {"method": "lora", "precision": "tf32"}, {"frameworks": ["fsdp"]}
        ),
        plan_body({"preset": "llama-3.2-1b"}, {"precision": "fp8"}, {"frameworks": ["deepspeed"]}),
        # one framework of two runs it: the search proceeds with that one
        plan_body({"preset": "llama-3.2-1b"}, {"method": "lora"}, {"frameworks": ["megatron", "fsdp"]}),
        plan_body({"hf_config": SLIDING_MISTRAL}, {}, {"frameworks": ["megatron", "deepspeed"]}),
        # Accelerate runs Megatron-LM only with its own switches (fp32 main grads), not the recipes', and
        # only GPT-2 (the one model its plugin builds as Hugging Face's is) with full recompute
        plan_body(
            {"preset": "gpt2"},
            {"precision": "bf16", "seq_len": 1024},
            {"frameworks": ["megatron"]},
            launchers=["accelerate"],
        ),
    ],
    ids=[
        "megatron bf16",
        "fsdp lora tf32",
        "deepspeed fp8",
        "megatron or fsdp, lora",
        "megatron or ds, swa",
        "megatron through accelerate",
    ],
)
def test_a_job_one_requested_framework_runs_is_planned(client: TestClient, body: dict[str, Any]) -> None:
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "feasible"


@pytest.mark.parametrize(
    ("training", "constraints", "words"),
    [
        ({"method": "lora"}, {"frameworks": ["megatron"]}, "PEFT"),
        ({"precision": "tf32"}, {"frameworks": ["megatron"]}, "no TF32 switch"),
        ({"precision": "fp8"}, {"frameworks": ["fsdp"]}, "fp8"),
    ],
)
def test_capacity_for_a_job_no_requested_framework_runs_is_a_422_naming_why(
    client: TestClient, training: dict[str, Any], constraints: dict[str, Any], words: str
) -> None:
    """It used to search every count of each GPU type, rejecting every layout, and answer "no layout
    fits up to 512 GPUs" (not memory) or, for mixtral-8x7b, spend the 8 s budget."""
    body = {
        "model": {"preset": "llama-3.2-1b"},
        "training": {"seq_len": 2048, "global_batch_size": 16, **training},
        "gpus": ["h100-sxm-80gb", "a100-sxm-80gb"],
        "constraints": constraints,
    }
    problem = assert_problem(client.post("/v1/capacity", json=body), 422)
    assert {e["field"] for e in problem["errors"]} == {"constraints.frameworks"}, problem
    assert words in problem["detail"], problem["detail"]


def test_capacity_leaves_a_gpu_type_without_the_precision_to_its_option(client: TestClient) -> None:
    """fp8 with deepspeed runs on an H100: the A100 (no fp8) is its own option, not a 422."""
    body = {
        "model": {"preset": "llama-3.2-1b"},
        "training": {"seq_len": 2048, "global_batch_size": 16, "precision": "fp8"},
        "gpus": ["a100-sxm-80gb", "h100-sxm-80gb"],
        "constraints": {"frameworks": ["deepspeed"]},
    }
    response = client.post("/v1/capacity", json=body)
    assert response.status_code == 200, response.text
    fits = {o["gpu"]: o["fits"] for o in response.json()["options"]}
    assert fits["h100-sxm-80gb"] is True


LLAMA_70B_128K_ON_4 = {
    "model": {"preset": "llama-3-70b"},
    "cluster": {"gpu": "h100-sxm-500w-96gb", "num_nodes": 1, "gpus_per_node": 4},
    "training": {"seq_len": 131072, "global_batch_size": 1, "precision": "bf16"},
    "constraints": {"frameworks": ["deepspeed"]},
}


def test_a_search_that_ran_to_its_end_answers_even_when_the_suggestions_ran_out_of_time(
    app: FastAPI, migrated_url: str
) -> None:
    """The search ends at once (the model states alone need 263 GiB per GPU of 91 allowed); the
    suggestions after it (none fits with DeepSpeed at 128k tokens and a batch of 1) spend the rest of
    the budget. That was a 422 "too large to plan" naming the 80 layers; it is the infeasible plan,
    its rejection, and the suggestions skipped: for time, or, where a suggestion's search ended
    within its share or a bound ruled it out, because nothing fits (each says which)."""
    del app  # its teardown empties the tables this app writes to
    short = create_app(Settings(database_url=migrated_url, max_body_bytes=256 * 1024, request_budget_s=0.2))
    with TestClient(short, raise_server_exceptions=False) as client:
        response = client.post("/v1/plans", json=LLAMA_70B_128K_ON_4)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["status"] == "infeasible" and plan["search"]["truncated"] is False
    assert any("model states alone" in r["detail"] for r in plan["rejected"]), plan["rejected"]
    skipped = plan["suggestions_skipped"]
    said = ("time budget", "fits", "GiB allowed")  # cut for time, nothing found, a bound's numbers
    assert skipped and all(any(words in s["reason"] for words in said) for s in skipped), skipped


@pytest.mark.parametrize(
    ("preset", "gpu", "method", "launcher"),
    [
        ("llama-3-70b", "h100-sxm-80gb", "lora", "slurm"),
        ("qwen3-8b", "a100-sxm-40gb", "qlora", "kubernetes"),
        ("mixtral-8x7b", "a100-sxm-40gb", "lora", "slurm"),
        ("gemma-2-9b", "h100-sxm-80gb", "full", "kubernetes"),
    ],
)
def test_a_plan_for_slurm_or_kubernetes_alone_is_one_they_render(
    client: TestClient, preset: str, gpu: str, method: str, launcher: str
) -> None:
    """Slurm and Kubernetes were left out of the search's launcher constraint (they wrap another
    target), so asked for alone the plan could pick a layout only Accelerate runs (FSDP with TP and
    LoRA, a model torchtitan does not build): feasible, and the one launcher asked for refused it."""
    body = {
        "model": {"preset": preset},
        "cluster": {"gpu": gpu, "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 4096, "global_batch_size": 64, "method": method},
        "launchers": [launcher],
    }
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["status"] == "feasible"
    assert plan["unsupported_targets"] == {}, plan["unsupported_targets"]
    assert {a["target"] for a in plan["artifacts"]} == {launcher}


@pytest.mark.parametrize(
    ("training", "layout", "target"),
    [
        # Ulysses with tensor parallelism: ALST (Accelerate) splits nothing else, ds_config no sequence
        ({}, {"framework": "deepspeed", "dp": 2, "tp": 2, "cp": 2, "zero_stage": 1}, "deepspeed"),
        ({"precision": "tf32"}, {"framework": "megatron", "dp": 8}, "megatron"),
        ({"precision": "fp8"}, {"framework": "fsdp", "dp": 8, "zero_stage": 3}, "torchtitan"),
    ],
)
def test_an_estimate_of_a_layout_no_launcher_runs_says_so(
    client: TestClient, training: dict[str, Any], layout: dict[str, Any], target: str
) -> None:
    """The estimate answers (its numbers stand), but one that fits beside an infeasible plan, which
    never proposes such a layout, used to give no hint why."""
    body = {
        "model": {"preset": "llama-3-8b"},
        "cluster": H100_X8,
        "training": {"seq_len": 4096, "global_batch_size": 64, **training},
        "layout": layout,
    }
    response = client.post("/v1/estimates", json=body)
    assert response.status_code == 200, response.text
    said = [w for w in response.json()["warnings"] if w.startswith("no launcher runs this layout")]
    assert len(said) == 1 and f"{target}: " in said[0], response.json()["warnings"]


def test_an_estimate_of_a_layout_a_launcher_runs_says_nothing_of_launchers(client: TestClient) -> None:
    body = {
        "model": {"preset": "llama-3-8b"},
        "cluster": H100_X8,
        "training": {"seq_len": 4096, "global_batch_size": 64},
        "layout": {"framework": "deepspeed", "dp": 8, "zero_stage": 3},
    }
    warnings = client.post("/v1/estimates", json=body).json()["warnings"]
    assert not any(w.startswith("no launcher") for w in warnings), warnings


@pytest.mark.parametrize(
    ("layout", "dp"),
    [
        ({"framework": "fsdp", "zero_stage": 3}, 8),
        ({"framework": "megatron", "tp": 2, "zero_stage": 1}, 4),
        ({"framework": "megatron", "tp": 2, "pp": 2, "cp": 2}, 1),
    ],
)
def test_an_estimate_without_dp_fills_the_cluster_and_says_so(
    client: TestClient, layout: dict[str, Any], dp: int
) -> None:
    """dp defaulted to 1 whatever the cluster, so the natural {"framework": "fsdp", "zero_stage": 3}
    on a node of 8 was a 422 (dp*tp*pp*cp = 1 != world size 8)."""
    body = {
        "model": {"preset": "llama-3-8b"},
        "cluster": H100_X8,
        "training": {"seq_len": 4096, "global_batch_size": 64},
        "layout": layout,
    }
    response = client.post("/v1/estimates", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["layout"]["dp"] == dp
    assert result["resolved_defaults"].get("layout.dp") == (str(dp) if dp > 1 else None)


def test_an_estimate_whose_degrees_do_not_divide_the_cluster_names_the_degree_it_states(
    client: TestClient,
) -> None:
    body = {
        "model": {"preset": "llama-3-8b"},
        "cluster": H100_X8,
        "training": {"seq_len": 4096, "global_batch_size": 64},
        "layout": {"framework": "megatron", "pp": 3},
    }
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    assert problem["errors"][0]["rule"] == "world_size"
    # the degree the request states, not the dp it left out (which was named before)
    assert problem["errors"][0]["field"] == "layout.pp"
    assert "tp*pp*cp = 1*3*1 = 3 does not divide the cluster's 8 GPUs" in problem["detail"]
    body["layout"] = {"framework": "megatron", "tp": 2, "cp": 3}
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    assert problem["errors"][0]["field"] == "layout.cp"
    body["layout"] = {"framework": "megatron", "tp": 2, "cp": 3, "dp": 1}  # dp stated: the world rule
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    assert problem["errors"][0]["field"] == "layout.dp"


def test_an_estimate_whose_derived_dp_does_not_split_the_batch_says_dp_was_derived(
    client: TestClient,
) -> None:
    """A batch of 2 on 8 GPUs with dp left out: dp fills them (8), and the batch rule named
    layout.micro_batch_size (1 x 8 does not divide 2), neither of which the request set. It names the
    batch now and says where dp came from; a batch dp divides is answered."""
    body = {
        "model": {"preset": "llama-3-8b"},
        "cluster": H100_X8,
        "training": {"seq_len": 4096, "global_batch_size": 2},
        "layout": {"framework": "fsdp", "zero_stage": 3},
    }
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    (error,) = problem["errors"]
    assert error["field"] == "training.global_batch_size" and error["rule"] == "global_batch"
    assert "does not split over dp 8, the data-parallel degree the layout left out" in error["message"]
    assert "the cluster's 8 GPUs over tp*pp*cp = 1" in error["message"]
    body["layout"] = {"framework": "fsdp", "zero_stage": 3, "tp": 4}  # dp 2 divides the batch
    response = client.post("/v1/estimates", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["resolved_defaults"]["layout.dp"] == "2"


def test_capacity_for_an_moe_preset_on_one_gpu_type_finishes_within_two_seconds(
    app: FastAPI, migrated_url: str
) -> None:
    """Llama 4 Maverick (128 experts) on H100 spent the request's 50,000 layout evaluations (3.3 s on
    the 2-core machine) and was cut; main's early framework refusal (launchers.framework_model_refusal)
    brought it under a second. Held here with a 1.5 s capacity budget: a fit, not cut."""
    del app  # its teardown empties the tables
    settings = Settings(database_url=migrated_url, max_body_bytes=256 * 1024, capacity_budget_s=1.5)
    body = {
        "model": {"preset": "llama-4-maverick-17b-128e"},
        "training": {"seq_len": 8192, "global_batch_size": 1024, "tokens": 10**12},
        "gpus": ["h100-sxm-80gb"],
    }
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        response = client.post("/v1/capacity", json=body)
    assert response.status_code == 200, response.text
    option = response.json()["options"][0]
    assert option["fits"] and not option["truncated"], option["note"]


def test_capacity_refuses_a_price_for_a_gpu_type_it_does_not_have(client: TestClient) -> None:
    """A per-GPU price under a name no option has was ignored: the answer priced nothing and said
    nothing (an input the model does not use is refused, not ignored)."""
    body = {
        "model": {"preset": "llama-3-8b"},
        "training": {"seq_len": 4096, "global_batch_size": 64, "tokens": 10**10},
        "gpus": ["h100-sxm-80gb", "a100-sxm-80gb"],
        "gpu_hour_cost": {"h100-sxm-80gb": 2.0, "l4-24gb": 2.0},
    }
    problem = assert_problem(client.post("/v1/capacity", json=body), 422)
    assert [e["field"] for e in problem["errors"]] == ["gpu_hour_cost.l4-24gb"], problem
    assert "h100-sxm-80gb, a100-sxm-80gb" in problem["detail"]
    body["gpu_hour_cost"] = {"h100-sxm-80gb": 2.0}  # a price for some of them: the others unpriced
    options = {o["gpu"]: o for o in client.post("/v1/capacity", json=body).json()["options"]}
    assert options["h100-sxm-80gb"]["cost"] is not None and options["a100-sxm-80gb"]["cost"] is None


def test_an_estimate_with_accumulation_but_no_micro_batch_derives_the_micro_batch(client: TestClient) -> None:
    """global = micro x accumulation x dp: with the accumulation given and the micro-batch left out,
    the micro-batch defaulted to 1 and {"dp": 8, "gradient_accumulation_steps": 4} for a batch of 64
    was a 422 (1 x 4 x 8 = 32 != 64)."""
    body = {
        "model": {"preset": "llama-3.2-1b"},
        "cluster": H100_X8,
        "training": {"seq_len": 2048, "global_batch_size": 64},
        "layout": {"framework": "fsdp", "dp": 8, "zero_stage": 3, "gradient_accumulation_steps": 4},
    }
    response = client.post("/v1/estimates", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["layout"]["micro_batch_size"] == 2
    assert result["resolved_defaults"]["layout.micro_batch_size"] == "2"
    body["layout"]["gradient_accumulation_steps"] = 3  # 64 is no multiple of 3 x 8: the batch rule
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    assert problem["errors"][0]["field"] == "layout.gradient_accumulation_steps", problem


@pytest.mark.parametrize("path", ["/v1/estimates", "/v1/capacity", "/v1/plans"])
def test_a_price_without_tokens_to_price_is_refused_naming_what_would_use_it(
    client: TestClient, path: str
) -> None:
    """gpu_hour_cost prices the time to train, which needs training.tokens; without them nothing in
    the answer uses it (no cost per hour or per step either): it answered with a warning (and,
    for a plan, said nothing). An input the model does not use is refused, naming the field and
    what would use it; with the tokens it prices the answer. A plan ranked by cost scales its score
    by the price, tokens or not, so there it stands."""
    training = {"seq_len": 4096, "global_batch_size": 64}
    body: dict[str, Any] = {"model": {"preset": "llama-3.2-1b"}, "training": training}
    field = "constraints.gpu_hour_cost" if path == "/v1/plans" else "gpu_hour_cost"
    if path == "/v1/estimates":
        body |= {"cluster": H100_X8, "layout": {"framework": "fsdp", "zero_stage": 3}, "gpu_hour_cost": 2.5}
    elif path == "/v1/capacity":
        body |= {"gpus": ["h100-sxm-80gb"], "gpu_hour_cost": 2.5}
    else:
        body |= {"cluster": H100_X8, "constraints": {"gpu_hour_cost": 2.5}}
    problem = assert_problem(client.post(path, json=body), 422)
    assert [(e["field"], e["type"]) for e in problem["errors"]] == [(field, "unused")], problem
    assert "training.tokens" in problem["detail"], problem["detail"]
    body["training"] = training | {"tokens": 10**10}
    response = client.post(path, json=body)
    assert response.status_code in (200, 201), response.text
    result = response.json()
    priced = {
        "/v1/estimates": lambda: result["cost_to_train"],
        "/v1/capacity": lambda: result["options"][0]["cost"],
        "/v1/plans": lambda: result["recommended"]["estimate"]["cost_to_train"],
    }[path]()
    assert priced is not None and priced > 0
    if path == "/v1/plans":  # ranked by cost: the price scales the score, tokens or not
        body["training"] = training
        body["constraints"] |= {"objective": "cost"}
        assert client.post(path, json=body).status_code == 201


def test_a_qlora_plan_lists_no_torch_compile_suggestion(client: TestClient) -> None:
    """torch.compile with QLoRA is refused (bitsandbytes' NF4 matmuls break the compiled graph:
    a 422 naming constraints.torch_compile when asked), so it can never be what makes a QLoRA job
    fit. Every infeasible QLoRA plan still listed it under suggestions_skipped, as if it had been
    tried and could not be computed."""
    body = {
        "model": {"preset": "llama-3-70b"},
        "cluster": {"gpu": "a100-sxm-40gb", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"seq_len": 4096, "global_batch_size": 64, "method": "qlora"},
    }
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["status"] == "infeasible" and plan["suggestions"], plan
    kinds = {s["kind"] for s in plan["suggestions"]} | {s["kind"] for s in plan["suggestions_skipped"]}
    assert "torch_compile" not in kinds, plan["suggestions_skipped"]
    asked = body | {"constraints": {"torch_compile": True}}
    problem = assert_problem(client.post("/v1/plans", json=asked), 422)
    assert problem["errors"][0]["field"] == "constraints.torch_compile", problem


def test_a_near_tie_goes_to_the_layout_without_the_pipeline(client: TestClient) -> None:
    """GPT-2 (124M) at a sequence of 1 token on a node of 8: megatron dp4 pp2 was recommended over
    plain dp8 for 0.5% more tokens/s ("tokens/s 0.5% higher than the next"). A gain under
    rank.NEAR_TIE_FRACTION (1%) does not buy a model-parallel degree: the simpler layout is recommended,
    the rationale says why, the faster layout is the first alternative and says it is faster. top_k 1
    answers the same (the search must not prune the simpler layout before ranking). Qwen2.5-0.5B's dp 2
    pp 4 is 0.7% faster than dp 8; since a sequence of 1 token no longer rules out tensor parallelism
    (sequence parallelism is off where the sequence does not split), dp 4 tp 2 is faster than both, by
    more than the tie: the tie is now between it and dp 2 pp 4 (0.7% slower), whose pipeline it beats."""
    body: dict[str, Any] = {
        "model": {"preset": "qwen2.5-0.5b"},
        "cluster": H100_X8,
        "training": {"seq_len": 1, "global_batch_size": 256},
        "constraints": {"objective": "throughput", "frameworks": ["megatron"]},
    }
    plan = client.post("/v1/plans", json=body).json()
    best = plan["recommended"]
    rate = best["estimate"]["time"]["tokens_per_s"]
    by_degrees = {
        tuple(a["layout"][d] for d in ("dp", "tp", "pp", "cp")): a["estimate"]["time"]["tokens_per_s"]
        for a in plan["alternatives"]
    }
    assert [best["layout"][d] for d in ("dp", "tp", "pp", "cp")] == [4, 2, 1, 1], best["layout"]
    assert not best["layout"]["sequence_parallel"]
    assert rate / by_degrees[(8, 1, 1, 1)] - 1 > 0.01  # more than the tie: tp 2 is bought
    pipeline = by_degrees[(2, 1, 4, 1)]
    assert 0 < rate / pipeline - 1 < 0.01  # within the tie, and with the larger model-parallel degree
    alone = client.post("/v1/plans", json=body | {"constraints": body["constraints"] | {"top_k": 1}}).json()
    assert alone["recommended"]["layout"] == best["layout"]


def test_a_material_gain_still_buys_the_pipeline(client: TestClient) -> None:
    """The near-tie rule is no preference for simple layouts at any price: at 64 sequences of one
    token Llama 2 7B's pp 8 (4 of its 32 layers per stage) is the fastest by far, and it stays. (GPT-2
    served here until its pp 8 was timed on the stage of two launch-bound layers, not on the output
    layer alone: the pipeline is no longer faster there.)"""
    body = {
        "model": {"preset": "llama-2-7b"},
        "cluster": H100_X8,
        "training": {"seq_len": 1, "global_batch_size": 64},
        "constraints": {"objective": "throughput", "frameworks": ["megatron"]},
    }
    plan = client.post("/v1/plans", json=body).json()
    assert plan["recommended"]["layout"]["pp"] > 1, plan["recommended"]["layout"]


@pytest.mark.parametrize("nodes", [1, 2])
def test_slurm_asked_with_accelerate_wraps_the_accelerate_launch(client: TestClient, nodes: int) -> None:
    """launchers ["slurm", "accelerate"] searches layouts Accelerate runs; Slurm wraps torchrun entry
    points only (DeepSpeed, Megatron-LM, torchtitan, HF Trainer), so a layout only Accelerate runs
    (Gemma 2 with LoRA and FSDP tensor parallelism: torchtitan does not build Gemma, the HF Trainer
    is data-parallel only; now DeepSpeed's Ulysses over 8 ranks, which Accelerate's ALST runs)
    rendered the Accelerate files alone and unsupported_targets["slurm"].
    The sbatch script now runs accelerate launch on each node, with that node's rank. 16384 tokens: at
    4096 on one node the data-parallel layout wins since the host-issue bound (each TP or CP rank issues
    all of a layer's ops for a fraction of its GEMMs)."""
    cluster = {"gpu": "a100-sxm-40gb", "num_nodes": nodes, "gpus_per_node": 8}
    if nodes > 1:
        cluster["inter_node_bandwidth_bytes_per_s"] = 50e9
    body = {
        "model": {"preset": "gemma-2-9b"},
        "cluster": cluster,
        "training": {"seq_len": 16384, "global_batch_size": 64, "method": "lora"},
        "launchers": ["slurm", "accelerate"],
    }
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    layout = plan["recommended"]["layout"]
    # only Accelerate runs it: FSDP's tensor or context parallelism, or DeepSpeed's Ulysses (ALST)
    split = layout["tp"] * layout["cp"] > 1 if layout["framework"] == "fsdp" else layout["cp"] > 1
    assert layout["framework"] in ("fsdp", "deepspeed") and split, layout
    assert plan["unsupported_targets"] == {}, plan["unsupported_targets"]
    names = {a["name"] for a in plan["artifacts"]}
    assert {"trainplan.sbatch", "accelerate_config.yaml", "accelerate_launch.sh"} <= names, names
    script = client.get(f"/v1/plans/{plan['id']}/artifacts/trainplan.sbatch").text
    assert "accelerate launch --config_file accelerate_config.yaml" in script, script
    assert "srun --kill-on-bad-exit=1 torchrun" not in script
    if nodes > 1:
        assert 'NODE_RANK="${SLURM_NODEID}"' in script and "--machine_rank" in script, script
    # Kubernetes has no such wrapper: it says so, and what to run instead
    wrapped = client.post("/v1/plans", json=body | {"launchers": ["kubernetes", "accelerate"]}).json()
    assert "not accelerate launch" in wrapped["unsupported_targets"]["kubernetes"], wrapped
    # Slurm alone planned DeepSpeed AutoTP under LoRA, which trains no adapter (AutoTP replaces peft's
    # wrappers: PEFT review); without it no layout its torchrun entry points run fits, and it says why
    alone = client.post("/v1/plans", json=body | {"launchers": ["slurm"]}).json()
    assert alone["status"] == "infeasible", alone.get("recommended")
    assert any(r["reason"] == "invalid: lora_autotp" for r in alone["rejected"]), alone["rejected"]


def test_a_t4_job_resolves_what_turing_runs_and_plans(client: TestClient) -> None:
    """The T4 (AWS g4dn, Colab) was not in the catalog: a 422 unknown GPU. Turing has fp16 tensor
    cores and no bf16 or FlashAttention-2, so a request naming neither precision nor attention resolves
    fp16 and SDPA, and says so; a 1B LoRA fine-tune fits its 16 GB where the full one does not."""
    cluster = {"gpu": "t4-16gb", "num_nodes": 1, "gpus_per_node": 1}
    answers = {}
    for method in ("full", "lora"):
        body = {
            "model": {"preset": "llama-3.2-1b"},
            "cluster": cluster,
            "training": {"seq_len": 2048, "global_batch_size": 16, "method": method},
        }
        response = client.post("/v1/plans", json=body)
        assert response.status_code == 201, response.text
        answers[method] = response.json()
        adapters = (
            {"training.lora_rank": "16", "training.lora_targets": "all-linear"} if method == "lora" else {}
        )
        assert answers[method]["resolved_defaults"] == {
            "training.precision": "fp16",
            "training.attention": "sdpa",
            **adapters,
        }
    assert answers["full"]["status"] == "infeasible" and answers["full"]["suggestions"]
    assert answers["lora"]["status"] == "feasible"


def test_a_degree_that_divides_the_cluster_is_not_named_for_one_that_does_not(client: TestClient) -> None:
    """tp 4 x pp 3 on 8 GPUs: tp 4 divides them, pp 3 does not; the request is told to change pp (it
    named tp, the larger degree, which could stay as it is)."""
    body = {
        "model": {"preset": "llama-3-8b"},
        "cluster": H100_X8,
        "training": {"seq_len": 4096, "global_batch_size": 64},
        "layout": {"framework": "megatron", "tp": 4, "pp": 3},
    }
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    assert problem["errors"][0]["field"] == "layout.pp"
    assert "give pp (or dp)" in problem["detail"]
    # every stated degree divides the GPUs, their product does not: the largest is named
    body["layout"] = {"framework": "megatron", "tp": 4, "pp": 4}
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    assert problem["errors"][0]["field"] == "layout.tp"


def test_megatron_tp_at_a_sequence_the_tp_ranks_cannot_split_leaves_sequence_parallel_off(
    client: TestClient,
) -> None:
    """Found by bench/ordinary_probe.py (seed 41): Megatron-LM at tp 2 with seq_len 7 was a 422
    "seq_len x micro_batch (7) % tp != 0" naming tp, for sequence parallelism the request never set
    (the framework's default turns it on with tp > 1). Left out, it resolves off where the micro-batch's
    tokens do not split over the TP ranks, and the answer says so; asked for, it is still refused."""
    payload: dict[str, Any] = {
        "model": {"preset": "gemma-2-9b"},
        "cluster": {"gpu": "h100-pcie-80gb", "num_nodes": 1, "gpus_per_node": 4},
        "training": {"seq_len": 7, "global_batch_size": 1000, "precision": "fp16"},
        "layout": {"framework": "megatron", "zero_stage": 1, "tp": 2},
    }
    response = client.post("/v1/estimates", json=payload)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["layout"]["sequence_parallel"] is False
    assert result["resolved_defaults"]["layout.sequence_parallel"] == "false"
    why = "sequence_parallel off: seq_len 7 is not a multiple of 2"
    assert any(note.startswith(why) for note in result["assumptions"])
    # where they split, the recipes' default stands
    even = payload | {"training": payload["training"] | {"seq_len": 8}}
    result = client.post("/v1/estimates", json=even).json()
    assert result["layout"]["sequence_parallel"] is True
    assert result["resolved_defaults"]["layout.sequence_parallel"] == "true"
    # asked for at seq_len 7: refused, naming the rule
    asked = payload | {"layout": payload["layout"] | {"sequence_parallel": True}}
    problem = assert_problem(client.post("/v1/estimates", json=asked), 422)
    assert problem["errors"][0]["rule"] == "sp_seq"


def test_launchers_refusing_for_one_reason_are_named_together(client: TestClient) -> None:
    """Found by bench/ordinary_probe.py (seed 41): the 422 read "megatron: megatron: GeGLU MLPs ...;
    accelerate: GeGLU MLPs ..." (the framework, then each launcher, the same reason twice)."""
    body = plan_body({"preset": "gemma-2-9b"}, {}, {"frameworks": ["megatron"]})
    problem = assert_problem(client.post("/v1/plans", json=body), 422)
    detail = problem["detail"]
    assert "megatron: the megatron and accelerate launchers refuse it: GeGLU MLPs" in detail, detail
    assert "megatron: megatron:" not in detail and detail.count("GeGLU") == 1


def test_asking_kubernetes_too_never_makes_a_feasible_job_infeasible(client: TestClient) -> None:
    """A PyTorchJob wraps torchrun entry points, so with Kubernetes asked the search first wants a
    layout one of those runs; DeepSpeed's Ulysses runs through Accelerate alone, and Llama 3.1 8B at
    128K on 8 H100s with DeepSpeed was feasible with ["accelerate", "deepspeed"] and infeasible with
    Kubernetes added (new-code review, stop 41). Now the same plan, Kubernetes saying why it cannot."""
    body = {
        "model": {"preset": "llama-3.1-8b"},
        "cluster": H100_X8,
        "training": {"seq_len": 131072, "global_batch_size": 8},
        "constraints": {"frameworks": ["deepspeed"]},
        "launchers": ["accelerate", "deepspeed"],
    }
    plain = client.post("/v1/plans", json=body).json()
    more = client.post(
        "/v1/plans", json=body | {"launchers": ["accelerate", "deepspeed", "kubernetes"]}
    ).json()
    assert plain["status"] == more["status"] == "feasible"
    assert more["recommended"]["layout"] == plain["recommended"]["layout"]
    assert "kubernetes" in more["unsupported_targets"]


def test_a_change_the_requested_frameworks_do_not_train_is_said_so_with_those_that_fit(
    client: TestClient,
) -> None:
    """Llama 3.1 70B on 8 A100-40GB asked of megatron: LoRA, QLoRA and 8-bit AdamW were each skipped
    as "no layout fits", though megatron trains none of them at all (a 422 when asked), and LoRA with
    fsdp fits at 36.7 GiB (suggestions review). They are suggested with the framework that trains
    them, past constraints.frameworks, saying why; applied, the suggestion fits as it states."""
    body: dict[str, Any] = {
        "model": {"preset": "llama-3.1-70b"},
        "cluster": {"gpu": "a100-sxm-40gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 4096, "global_batch_size": 32},
        "constraints": {"frameworks": ["megatron"]},
    }
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["status"] == "infeasible"
    lora = next(s for s in plan["suggestions"] if s["kind"] == "lora")
    assert "past constraints.frameworks (megatron)" in lora["detail"], lora
    assert "lora needs PEFT adapters, which megatron does not have" in lora["detail"], lora
    assert lora["layout"]["framework"] != "megatron" and lora["method"] == "lora"
    for skipped in plan["suggestions_skipped"]:
        if skipped["kind"] in ("lora", "qlora", "optimizer"):
            assert "do not train" in skipped["reason"], skipped
    applied = body | {
        "training": body["training"] | {"method": "lora"},
        "constraints": {"frameworks": [lora["layout"]["framework"]]},
    }
    replanned = client.post("/v1/plans", json=applied).json()
    assert replanned["status"] == "feasible"
    assert replanned["recommended"]["estimate"]["time"]["tokens_per_s"] == pytest.approx(lora["tokens_per_s"])


def test_an_infeasible_plan_reports_the_memory_miss_of_the_most_gpus_it_could_use(client: TestClient) -> None:
    """Llama 3.1 70B at batch 16 on 32 H100s through the HF Trainer (data parallel only: 16 GPUs at
    most): the answer gave only the 32 GPUs' invalid splits, no "does not fit" group and no closest
    layout, where the same job on 16 GPUs names its 8.2 GiB miss (suggestions review). The count
    reported is the most GPUs where a split runs; the reasons of the counts above it stay."""
    body: dict[str, Any] = {
        "model": {"preset": "llama-3.1-70b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 4, "gpus_per_node": 8},
        "training": {"seq_len": 4096, "global_batch_size": 16},
        "launchers": ["hf_trainer"],
    }
    plan = client.post("/v1/plans", json=body).json()
    assert plan["status"] == "infeasible"
    reasons = {group["reason"]: group for group in plan["rejected"]}
    assert "does not fit in GPU memory" in reasons, plan["rejected"]
    assert "invalid: global_batch" in reasons  # dp 32 over a batch of 16, from the 32 GPUs
    closest = plan["closest"]
    assert closest is not None and closest["layout"]["dp"] == 16, closest
    estimated = client.post(
        "/v1/estimates",
        json={
            "model": body["model"],
            "cluster": body["cluster"] | {"num_nodes": 2},
            "training": body["training"],
            "layout": closest["layout"],
        },
    ).json()
    assert estimated["fits"] is False
    assert estimated["memory"]["per_gpu"]["total"] == closest["estimate"]["memory"]["per_gpu"]["total"]


def test_another_gpu_skipped_where_the_launchers_use_no_more_gpus_says_the_batch_bounds_it(
    client: TestClient,
) -> None:
    """Llama 3.1 70B at batch 16 through the HF Trainer (data parallel only) on 8 RTX 4090s: H100s
    were skipped as "no layout fits on up to 512 GPUs", though no more than 16 can train the batch:
    32 H100s fit once the batch is 32 (suggestions review). The reason names the bound."""
    body: dict[str, Any] = {
        "model": {"preset": "llama-3.1-70b"},
        "cluster": {"gpu": "rtx-4090-24gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 4096, "global_batch_size": 16},
        "launchers": ["hf_trainer"],
    }
    plan = client.post("/v1/plans", json=body).json()
    h100 = next(s for s in plan["suggestions_skipped"] if s["reason"].startswith("h100-sxm-80gb:"))
    assert (
        "on up to 16 GPUs, the most this job uses: the requested launchers run data parallelism"
        in h100["reason"]
    )
    assert "global batch (16)" in h100["reason"]


def test_on_six_gpu_nodes_no_tensor_parallel_group_straddles_two_nodes(client: TestClient) -> None:
    """Llama 3 70B on 4 nodes of 6 H100s was recommended tp 4 (ranks 4-7 on two nodes), its launch
    files asking TE's intra-node userbuffers overlap, at 16.9 s a step, where that overlap cannot
    form: 20.4 s without it, slower than the tp 2 it listed (odd node shapes review). The search
    proposes only a tp that divides the node once the job spans nodes; an estimate of tp 4 warns."""
    body: dict[str, Any] = {
        "model": {"preset": "llama-3-70b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 4, "gpus_per_node": 6},
        "training": {"seq_len": 4096, "global_batch_size": 96},
        "launchers": ["megatron"],
    }
    plan = client.post("/v1/plans", json=body).json()
    assert plan["status"] == "feasible"
    for candidate in (plan["recommended"], *plan["alternatives"]):
        assert 6 % candidate["layout"]["tp"] == 0, candidate["layout"]
    layout = {"framework": "megatron", "dp": 1, "tp": 4, "pp": 3, "cp": 2, "zero_stage": 1}
    estimated = client.post(
        "/v1/estimates", json={k: body[k] for k in ("model", "cluster", "training")} | {"layout": layout}
    ).json()
    assert any("does not divide the 6 GPUs per node" in w for w in estimated["warnings"]), estimated[
        "warnings"
    ]
    # TE's userbuffers build each TP group inside one node: left out, the overlap defaults off there
    # (it was credited, 17% of the step); asked for, it is refused (review of stop 48)
    assert estimated["layout"]["tp_comm_overlap"] is False
    assert estimated["resolved_defaults"]["layout.tp_comm_overlap"] == "false"
    job = {k: body[k] for k in ("model", "cluster", "training")}
    problem = assert_problem(
        client.post("/v1/estimates", json=job | {"layout": layout | {"tp_comm_overlap": True}}), 422
    )
    assert problem["errors"][0]["field"] == "layout.tp_comm_overlap", problem


def test_a_change_only_the_requested_launchers_do_not_train_names_the_launchers(client: TestClient) -> None:
    """LoRA asked of fsdp through torchtitan alone (which trains full models only) is suggested with
    fsdp through another launcher: it said "past constraints.frameworks (fsdp)", which it kept
    (review of stop 48)."""
    body: dict[str, Any] = {
        "model": {"preset": "llama-3.1-70b"},
        "cluster": {"gpu": "a100-sxm-40gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 4096, "global_batch_size": 32},
        "constraints": {"frameworks": ["fsdp"]},
        "launchers": ["torchtitan"],
    }
    plan = client.post("/v1/plans", json=body).json()
    lora = next(s for s in plan["suggestions"] if s["kind"] == "lora")
    assert lora["layout"]["framework"] == "fsdp", lora
    assert "past launchers (torchtitan)" in lora["detail"], lora["detail"]
    assert "constraints.frameworks" not in lora["detail"]


MISTRAL_SHAPE = {
    "num_layers": 4,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_kv_heads": 2,
    "ffn_hidden_size": 1024,
    "vocab_size": 1000,
}
MLA = {
    "q_lora_rank": 64,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
}
MOE = {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 256}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"sliding_window": 4096}, "sliding_window"),  # no sliding layer: the step was a full model's
        ({"attention_chunk_size": 1024}, "attention_chunk_size"),
        ({"rope_local_theta": 10000.0}, "rope_local_theta"),
        ({"mla_bias": True}, "mla_bias"),
        ({"mla": MLA, "num_kv_heads": 4}, "num_kv_heads"),
        ({"mla": MLA, "num_kv_heads": 8, "head_dim": 96}, "head_dim"),
        ({"mla": MLA, "num_kv_heads": 8, "qkv_bias": True}, "qkv_bias"),
        ({"position_embedding": "learned", "rotary_fraction": 0.25}, "rotary_fraction"),
        ({"moe": {**MOE, "shared_expert_ffn_hidden_size": 512}}, "moe.shared_expert_ffn_hidden_size"),
        ({"moe": {**MOE, "shared_expert_gate": True}}, "moe.shared_expert_gate"),
        ({"moe": {**MOE, "layer_frequency": 8}}, "moe.layer_frequency"),  # 4 layers: none is MoE
        ({"moe": MOE, "moe_layers": []}, "moe_layers"),
        ({"moe": {**MOE, "layer_frequency": 2}, "moe_layers": [1, 3]}, "moe.layer_frequency"),
        ({"num_labels": 5}, "num_labels"),  # a causal LM's head has no labels to size
    ],
)
def test_an_architecture_field_the_model_does_not_read_is_refused(
    client: TestClient, extra: dict[str, Any], field: str
) -> None:
    """Accepted, echoed and ignored: a window without sliding layers, MLA's bias without MLA and
    q/k/v's fields with it, partial rotary without RoPE, a shared expert's size or gate without one,
    an MoE block on no layer (architecture review). The answer said they were modelled."""
    architecture = {**MISTRAL_SHAPE, **extra}
    body = {
        "model": {"architecture": architecture},
        "cluster": H100_X8,
        "training": {"seq_len": 2048, "global_batch_size": 8},
    }
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    assert [e["field"] for e in problem["errors"]] == [f"model.architecture.{field}"], problem


def test_an_architecture_with_the_fields_its_layers_read_is_estimated(client: TestClient) -> None:
    """The same fields where the model reads them: sliding layers with their window, MLA with its
    own head width (head_dim defaults to nope + rope, as hf_config sets it), an MoE block on a layer."""
    architecture = {
        **MISTRAL_SHAPE,
        "layer_types": ["sliding", "full", "sliding", "full"],
        "sliding_window": 256,
        "rope_local_theta": 10000.0,
        "moe": {**MOE, "layer_frequency": 2},
    }
    body = {
        "model": {"architecture": architecture},
        "cluster": H100_X8,
        "training": {"seq_len": 2048, "global_batch_size": 8},
    }
    assert client.post("/v1/estimates", json=body).status_code == 200
    mla = {**MISTRAL_SHAPE, "num_kv_heads": 8, "mla": MLA, "mla_bias": True}
    body["model"] = {"architecture": mla}
    response = client.post("/v1/estimates", json=body)
    assert response.status_code == 200, response.text
