"""Plans end to end: create (idempotently), fetch, list, download artifacts, post runs, and see
the next estimate calibrated. Runs on SQLite and, in CI, again on PostgreSQL."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.catalog import catalog_version
from service.launchers.common import MEDIA_TYPES
from service.versions import estimator_version
from tests.api.helpers import assert_problem

CLUSTER = {"name": "box", "gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}


def plan_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"preset": "gpt2"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 1024, "global_batch_size": 64, "tokens": 10**9},
        "constraints": {"top_k": 2, "frameworks": ["deepspeed"]},
        "launchers": ["deepspeed", "slurm"],
    }
    return body | overrides


def create(client: TestClient, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    headers = {"Idempotency-Key": key} if key else {}
    response = client.post("/v1/plans", json=body, headers=headers)
    assert response.status_code == 201, response.text
    plan: dict[str, Any] = response.json()
    assert response.headers["location"] == f"/v1/plans/{plan['id']}"
    return plan


def test_full_cycle_on_a_stored_cluster(client: TestClient) -> None:
    cluster = client.post("/v1/clusters", json=CLUSTER).json()
    plan = create(client, plan_body(cluster={"id": cluster["id"]}))
    assert plan["status"] == "feasible"
    assert plan["cluster_id"] == cluster["id"]
    recommended = plan["recommended"]
    assert recommended["estimate"]["fits"] and recommended["rationale"]
    assert recommended["layout"]["framework"] == "deepspeed"
    assert plan["versions"] == {"catalog": catalog_version(), "estimator": estimator_version()}
    assert plan["search"]["candidates_evaluated"] > 0

    assert client.get(f"/v1/plans/{plan['id']}").json() == plan
    listed = client.get("/v1/plans", params={"cluster_id": cluster["id"]}).json()
    assert [p["id"] for p in listed["items"]] == [plan["id"]]

    names = {a["name"] for a in plan["artifacts"]}
    assert {"ds_config.json", "deepspeed_launch.sh", "trainplan.sbatch"} <= names
    route = client.get("/openapi.json").json()["paths"]["/v1/plans/{plan_id}/artifacts/{name}"]["get"]
    documented = route["responses"]["200"]["content"]  # what the OpenAPI says the file is served as
    for artifact in plan["artifacts"]:
        response = client.get(artifact["url"])
        assert response.status_code == 200
        assert response.headers["content-type"].startswith(artifact["media_type"])
        assert artifact["media_type"] in documented, (artifact["media_type"], sorted(documented))
        # the documented schema is the parsed body's (OpenAPI 3.1): a JSON file is an object, not a string
        kind = documented[artifact["media_type"]]["schema"]["type"]
        parsed = response.json() if artifact["media_type"] == "application/json" else response.text
        assert isinstance(parsed, {"object": dict, "string": str}[kind]), (artifact["name"], kind)
        assert response.headers["content-disposition"] == f'attachment; filename="{artifact["name"]}"'
        assert len(response.content) == artifact["size_bytes"]
    ds_config = client.get(f"/v1/plans/{plan['id']}/artifacts/ds_config.json").json()
    assert ds_config["train_batch_size"] == 64
    bundle = client.get(f"/v1/plans/{plan['id']}/artifacts.zip")
    assert bundle.headers["content-type"] == "application/zip"
    assert set(zipfile.ZipFile(io.BytesIO(bundle.content)).namelist()) == names

    # The stored cluster cannot be deleted while the plan refers to it.
    assert_problem(client.delete(f"/v1/clusters/{cluster['id']}"), 409)
    assert client.delete(f"/v1/plans/{plan['id']}").status_code == 204
    assert_problem(client.get(f"/v1/plans/{plan['id']}"), 404)
    assert client.delete(f"/v1/clusters/{cluster['id']}").status_code == 204


def test_runs_are_diagnosed_and_calibrate_the_next_estimate(client: TestClient) -> None:
    plan = create(client, plan_body())
    estimate = plan["recommended"]["estimate"]
    layout = plan["recommended"]["layout"]
    estimate_request = {
        "model": plan_body()["model"],
        "cluster": plan_body()["cluster"],
        "training": plan_body()["training"],
        "layout": layout,
    }
    before = client.post("/v1/estimates", json=estimate_request).json()
    assert before["calibration"] is None

    run = {
        "peak_memory_bytes_per_gpu": estimate["memory"]["per_gpu"]["total"] + 2 * 2**30,
        "step_s": estimate["time"]["step_s"] * 1.25,
        "gpu_utilization": 0.5,
        "framework_version": "deepspeed 0.19.8",
    }
    response = client.post(f"/v1/plans/{plan['id']}/runs", json=run)
    assert response.status_code == 201, response.text
    diagnosis = response.json()["diagnosis"]
    assert abs(diagnosis["step_time_error"] - 0.25) < 1e-9
    assert diagnosis["memory_error"] > 0
    assert diagnosis["advice"]
    assert [r["id"] for r in client.get(f"/v1/plans/{plan['id']}/runs").json()["items"]] == [
        response.json()["id"]
    ]

    after = client.post("/v1/estimates", json=estimate_request).json()
    assert after["calibration"]["runs"] == 1
    assert abs(after["calibration"]["factors"]["step_time"] - 1.25) < 1e-9
    assert abs(after["time"]["step_s"] - 1.25 * before["time"]["step_s"]) < 1e-9 * before["time"]["step_s"]
    # Model states are exact arithmetic and are not calibrated; the dynamic part is.
    for part in ("parameters", "gradients", "optimizer_states"):
        assert after["memory"]["per_gpu"][part] == before["memory"]["per_gpu"][part]
    assert after["memory"]["per_gpu"]["activations"] > before["memory"]["per_gpu"]["activations"]


def test_an_out_of_memory_run_makes_the_next_plan_more_conservative(client: TestClient) -> None:
    body = plan_body(model={"preset": "llama-2-7b"}, training={"seq_len": 4096, "global_batch_size": 64})
    body["launchers"] = []
    first = create(client, body)
    first_total = first["recommended"]["estimate"]["memory"]["per_gpu"]["total"]
    response = client.post(f"/v1/plans/{first['id']}/runs", json={"out_of_memory": True})
    assert response.status_code == 201
    assert "ran out of memory" in response.json()["diagnosis"]["advice"][0]
    assert "search.memory_dynamic_factor" not in first["resolved_defaults"]
    second = create(client, body)
    estimate = second["recommended"]["estimate"]
    assert estimate["calibration"]["out_of_memory_runs"] == 1
    # the factor the search fitted each layout with, and why, named for feasible and infeasible plans
    # alike (an infeasible one has no calibration to say it: scheduler review)
    said = second["resolved_defaults"]["search.memory_dynamic_factor"]
    assert "x" in said and "(1 out of memory run(s))" in said, said
    assert estimate["calibration"]["factors"]["memory_dynamic"] > 1
    # The new recommendation fits even with the dynamic memory scaled up past what ran out.
    assert estimate["fits"]
    # The old layout, estimated again, no longer fits; verdict, warning and limits agree.
    again = client.post(
        "/v1/estimates",
        json={k: body[k] for k in ("model", "cluster", "training")}
        | {"layout": first["recommended"]["layout"]},
    ).json()
    assert again["calibration"]["out_of_memory_runs"] == 1
    assert again["fits"] is False
    assert any(w.startswith("does not fit") for w in again["warnings"])
    assert again["limits"]["max_micro_batch_size"] < first["recommended"]["layout"]["micro_batch_size"] or (
        again["limits"]["max_micro_batch_size"] == 0
    )
    assert estimate["memory"]["per_gpu"]["total"] <= estimate["memory"]["capacity_bytes"]
    assert second["recommended"]["layout"] != first["recommended"]["layout"] or (
        estimate["memory"]["per_gpu"]["total"] > first_total
    )


def test_an_out_of_memory_run_costs_each_layout_its_own_dynamic_memory(client: TestClient) -> None:
    """After one out-of-memory run of a layout with 25.6 GiB of activations, the search kept 17 GiB free
    on every layout, and Llama 3.1 8B on 2 H100s was infeasible where its calibrated tp 2, full-recompute
    layout (8 GiB of activations, scaled alike) fits; capacity said 2 GPUs (scheduler review). Each layout
    is now fitted under the factor its calibrated estimate applies: the plan is feasible and its
    recommendation fits as calibrated."""
    body = plan_body(model={"preset": "llama-3.1-8b"}, training={"seq_len": 8192, "global_batch_size": 128})
    body["cluster"] = {"gpu": "h100-sxm-80gb", "num_nodes": 1}
    body["launchers"], body["constraints"] = [], {"top_k": 2}
    first = create(client, body)
    assert client.post(f"/v1/plans/{first['id']}/runs", json={"out_of_memory": True}).status_code == 201
    two = create(client, body | {"constraints": body["constraints"] | {"max_gpus": 2}})
    assert two["status"] == "feasible", two["rejected"][:2]
    estimate = two["recommended"]["estimate"]
    assert estimate["fits"] and estimate["calibration"]["factors"]["memory_dynamic"] > 1.5
    # the layout that ran out does not come back
    assert two["recommended"]["layout"] != first["recommended"]["layout"]


def test_idempotency_key_replays_and_refuses_another_body(client: TestClient) -> None:
    first = create(client, plan_body(), key="job-42")
    replay = client.post("/v1/plans", json=plan_body(), headers={"Idempotency-Key": "job-42"})
    assert replay.status_code == 201 and replay.headers["location"] == f"/v1/plans/{first['id']}"
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.json() == first
    other = plan_body(training={"seq_len": 512, "global_batch_size": 64})
    problem = assert_problem(client.post("/v1/plans", json=other, headers={"Idempotency-Key": "job-42"}), 422)
    assert problem["errors"][0]["field"] == "header.Idempotency-Key"
    assert len(client.get("/v1/plans").json()["items"]) == 1


def test_a_retry_whose_encoder_writes_null_for_a_default_replays(client: TestClient) -> None:
    """A null is the field left out (README): a retry adding "max_gpus": null, as a generated client
    does once its OpenAPI document gains the nullable field, was refused as another body (operator
    review); a key stored with the nulls in its body still replays both ways."""
    body = plan_body(constraints={"top_k": 2})
    first = create(client, body, key="fmt-1")
    nulls = body | {"constraints": {"top_k": 2, "max_gpus": None}}
    replay = client.post("/v1/plans", json=nulls, headers={"Idempotency-Key": "fmt-1"})
    assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true", replay.text
    stored = create(client, nulls, key="fmt-2")
    for sent in (nulls, body):
        again = client.post("/v1/plans", json=sent, headers={"Idempotency-Key": "fmt-2"})
        assert again.status_code == 201 and again.json()["id"] == stored["id"], again.text
    assert first["id"] != stored["id"]


def test_infeasible_job_is_stored_with_suggestions(client: TestClient) -> None:
    body = plan_body(
        model={"preset": "llama-2-70b"},
        cluster={"gpu": "rtx-4090-24gb", "num_nodes": 1, "gpus_per_node": 8},
        training={"seq_len": 4096, "global_batch_size": 8},
        constraints={"allow_offload": False},
    )
    plan = create(client, body)
    assert plan["status"] == "infeasible"
    assert plan["recommended"] is None
    assert plan["suggestions"]
    assert plan["artifacts"] == []
    assert client.get("/v1/plans", params={"status": "infeasible"}).json()["items"][0]["id"] == plan["id"]
    assert_problem(client.post(f"/v1/plans/{plan['id']}/runs", json={"out_of_memory": True}), 409)


def test_runs_and_artifacts_lists_page_as_every_list_does(client: TestClient) -> None:
    """api.md: lists take `limit` and `cursor` and answer `next_cursor`; a plan's runs and artifacts
    refused both (422 unknown query parameter) and returned every run in one page."""
    plan = create(client, plan_body(launchers=["deepspeed", "slurm", "kubernetes"]))
    url = f"/v1/plans/{plan['id']}"
    posted = [client.post(f"{url}/runs", json={"step_s": 1.0 + i}).json()["id"] for i in range(5)]
    seen, cursor = [], None
    while True:
        page = client.get(f"{url}/runs", params={"limit": 2} | ({"cursor": cursor} if cursor else {})).json()
        assert len(page["items"]) <= 2
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == posted  # oldest first, each once
    assert client.get(f"{url}/runs").json()["next_cursor"] is None  # 5 of a default 50
    assert_problem(client.get(f"{url}/runs", params={"cursor": "nope"}), 422)
    artifacts = [a["name"] for a in client.get(f"{url}/artifacts").json()["items"]]
    assert len(artifacts) >= 3
    first = client.get(f"{url}/artifacts", params={"limit": 1}).json()
    rest = client.get(f"{url}/artifacts", params={"cursor": first["next_cursor"]}).json()
    assert [a["name"] for a in first["items"] + rest["items"]] == artifacts and rest["next_cursor"] is None


def test_listing_filters_and_pages_newest_first(client: TestClient) -> None:
    ids = [create(client, plan_body(launchers=[]))["id"] for _ in range(3)]
    ids.append(create(client, plan_body(model={"preset": "qwen2.5-0.5b"}, launchers=[]))["id"])
    page = client.get("/v1/plans", params={"limit": 2}).json()
    assert [p["id"] for p in page["items"]] == ids[::-1][:2]
    rest = client.get("/v1/plans", params={"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [p["id"] for p in rest["items"]] == ids[::-1][2:]
    assert rest["next_cursor"] is None
    only = client.get("/v1/plans", params={"model": "qwen2.5-0.5b"}).json()["items"]
    assert [p["id"] for p in only] == [ids[-1]]
    created = page["items"][0]["created_at"]
    assert client.get("/v1/plans", params={"created_after": "2100-01-01T00:00:00Z"}).json()["items"] == []
    assert len(client.get("/v1/plans", params={"created_before": created}).json()["items"]) >= 1


def test_error_paths_are_problems_and_store_nothing(client: TestClient) -> None:
    assert_problem(client.get("/v1/plans/01JZZZZZZZZZZZZZZZZZZZZZZZ"), 404)
    assert_problem(client.post("/v1/plans", json=plan_body(cluster={"id": "missing"})), 404)
    assert_problem(client.post("/v1/plans", json=plan_body(launchers=["ansible"])), 422)
    assert_problem(client.get("/v1/plans", params={"status": "done"}), 422)
    plan = create(client, plan_body())
    problem = assert_problem(client.get(f"/v1/plans/{plan['id']}/artifacts/passwd"), 404)
    assert "ds_config.json" in problem["detail"]
    bad_runs = [
        {},
        {"gpu_utilization": 1.5, "step_s": 1},
        {"step_s": -1},
        {"step_s": 1, "tokens_per_s": 5},
        {"peak_memory_bytes_per_gpu": 1, "surprise": True},
    ]
    for bad in bad_runs:
        assert_problem(client.post(f"/v1/plans/{plan['id']}/runs", json=bad), 422)
    assert_problem(client.post("/v1/plans/nope/runs", json={"step_s": 1}), 404)
    assert client.get(f"/v1/plans/{plan['id']}/runs").json()["items"] == []
    assert len(client.get("/v1/plans").json()["items"]) == 1


def test_created_filters_accept_timestamps_without_an_offset_as_utc(client: TestClient) -> None:
    plan = create(client, plan_body(launchers=[]))
    for params in ({"created_after": "2000-01-01T00:00:00"}, {"created_before": "2100-01-01T00:00:00"}):
        items = client.get("/v1/plans", params=params).json()["items"]
        assert [p["id"] for p in items] == [plan["id"]]
    assert client.get("/v1/plans", params={"created_after": "2100-01-01T00:00:00"}).json()["items"] == []


@pytest.mark.parametrize("moment", ["0.5", "1764547200", "2026-12-01", "yesterday"])
def test_created_filters_take_only_date_times(client: TestClient, moment: str) -> None:
    """What the OpenAPI's date-time says: not seconds since 1970 (which pydantic would read), nor a
    bare date."""
    problem = assert_problem(client.get("/v1/plans", params={"created_before": moment}), 422)
    assert problem["errors"][0]["field"] == "query.created_before"


def test_run_retries_with_one_key_are_stored_once(client: TestClient) -> None:
    plan = create(client, plan_body(launchers=[]))
    run = {"step_s": plan["recommended"]["estimate"]["time"]["step_s"] * 1.1}
    headers = {"Idempotency-Key": "run-1"}
    first = client.post(f"/v1/plans/{plan['id']}/runs", json=run, headers=headers)
    assert first.status_code == 201
    again = client.post(f"/v1/plans/{plan['id']}/runs", json=run, headers=headers)
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == first.headers["location"]
    assert client.get(first.headers["location"]).json()["id"] == first.json()["id"]
    assert len(client.get(f"/v1/plans/{plan['id']}/runs").json()["items"]) == 1
    other = client.post(f"/v1/plans/{plan['id']}/runs", json={"step_s": 1.0}, headers=headers)
    assert_problem(other, 422)
    assert_problem(client.get(f"/v1/plans/{plan['id']}/runs/01JZZZZZZZZZZZZZZZZZZZZZZZ"), 404)


def test_a_retry_after_delete_says_so_instead_of_recreating(client: TestClient) -> None:
    plan = create(client, plan_body(launchers=[]), key="job-9")
    assert client.delete(f"/v1/plans/{plan['id']}").status_code == 204
    problem = assert_problem(
        client.post("/v1/plans", json=plan_body(launchers=[]), headers={"Idempotency-Key": "job-9"}), 404
    )
    assert "deleted" in problem["detail"]
    assert client.get("/v1/plans").json()["items"] == []


ALL_RUNNERS = ["deepspeed", "accelerate", "hf_trainer", "megatron", "torchtitan"]


@pytest.mark.parametrize(
    ("model", "gpus", "training"),
    [
        # the example: 8B at 8K on one H100 node rendered nothing before
        ("llama-3.1-8b", 8, {"seq_len": 8192, "global_batch_size": 128}),
        ("qwen3-8b", 8, {"seq_len": 4096, "global_batch_size": 64}),
        ("llama-3.1-70b", 32, {"seq_len": 8192, "global_batch_size": 256}),
    ],
)
def test_the_recommendation_runs_in_its_own_framework_launcher(
    client: TestClient, model: str, gpus: int, training: dict[str, Any]
) -> None:
    body = plan_body(
        model={"preset": model},
        cluster={
            "gpu": "h100-sxm-80gb",
            "num_nodes": gpus // 8,
            "gpus_per_node": 8,
            "inter_node_bandwidth_bytes_per_s": 5e10,
        },
        training=training,
        constraints={"top_k": 3},
        launchers=ALL_RUNNERS,
    )
    plan = create(client, body)
    framework = plan["recommended"]["layout"]["framework"]
    rendered = {a["target"] for a in plan["artifacts"]}
    assert {a["media_type"] for a in plan["artifacts"]} <= set(MEDIA_TYPES)  # as the OpenAPI documents
    own = {"deepspeed": {"deepspeed", "hf_trainer", "accelerate"}, "megatron": {"megatron", "accelerate"},
           "fsdp": {"torchtitan", "accelerate", "hf_trainer"}}[framework]  # fmt: skip
    assert rendered & own, (framework, plan["unsupported_targets"])
    # asked for one launcher only, the recommendation is one it renders
    only = create(client, body | {"launchers": ["megatron"]})
    assert only["recommended"]["layout"]["framework"] == "megatron"
    assert {a["target"] for a in only["artifacts"]} == {"megatron"}


def test_a_qlora_plan_trains_adapters_on_one_consumer_card(client: TestClient) -> None:
    # the example: QLoRA of an 8B model on one RTX 4090 got Megatron's full pre-training script
    body = plan_body(
        model={"preset": "llama-3-8b"},
        cluster={"gpu": "rtx-4090-24gb", "num_nodes": 1, "gpus_per_node": 1},
        training={"seq_len": 2048, "global_batch_size": 16, "method": "qlora", "lora_rank": 16},
        constraints={"top_k": 3},
        launchers=ALL_RUNNERS,
    )
    plan = create(client, body)
    assert plan["status"] == "feasible"
    assert plan["recommended"]["layout"]["framework"] != "megatron"  # Megatron-LM has no PEFT
    names = {a["name"] for a in plan["artifacts"]}
    assert {"lora_config.json", "bnb_config.json"} <= names
    assert "torchtitan" in plan["unsupported_targets"]  # no PEFT (and not DeepSpeed's layouts)
    # the layout the files run: per-op AC (torchtitan's) was recommended and rendered by the Trainer
    # without any checkpointing, 26 GB on the 25.8 GB card
    assert plan["recommended"]["layout"]["recompute"] != "selective_op"


def test_a_qlora_moe_plan_shards_its_nf4_base_over_data_parallel_ranks(client: TestClient) -> None:
    """Mixtral-8x7B QLoRA on 8 A100-40GB was planned as DeepSpeed tp 2 x ep 4, files telling the
    user to load the base with BitsAndBytesConfig and to build DeepSpeed MoE layers at once: no
    stock tool runs that. QLoRA trains data-parallel (ZeRO-3 / FSDP shard the NF4 base)."""
    body = plan_body(
        model={"preset": "mixtral-8x7b"},
        cluster={"gpu": "a100-sxm-40gb", "num_nodes": 1, "gpus_per_node": 8},
        training={"seq_len": 4096, "global_batch_size": 32, "method": "qlora"},
        constraints={"top_k": 3},
    )
    plan = create(client, body)
    assert plan["status"] == "feasible"
    for candidate in (plan["recommended"], *plan["alternatives"]):
        layout = candidate["layout"]
        assert (layout["tp"], layout["pp"], layout["ep"]) == (1, 1, 1), layout


@pytest.mark.parametrize(
    ("preset", "nodes", "training"),
    [
        ("qwen3-235b-a22b", 32, {"seq_len": 4096, "global_batch_size": 1024}),
        ("deepseek-v3", 128, {"seq_len": 4096, "global_batch_size": 2048}),
        ("llama-4-scout-17b-16e", 8, {"seq_len": 8192, "global_batch_size": 512}),
    ],
)
def test_todays_moe_models_get_a_runnable_plan(
    client: TestClient, preset: str, nodes: int, training: dict[str, Any]
) -> None:
    cluster = {
        "gpu": "h100-sxm-80gb",
        "num_nodes": nodes,
        "gpus_per_node": 8,
        "inter_node_bandwidth_bytes_per_s": 5e10,
    }
    body = plan_body(
        model={"preset": preset},
        cluster=cluster,
        training=training,
        constraints={"top_k": 2},
        launchers=ALL_RUNNERS,
    )
    plan = create(client, body)
    assert plan["status"] == "feasible", plan.get("suggestions")
    framework = plan["recommended"]["layout"]["framework"]
    own = {"deepspeed": {"deepspeed", "hf_trainer", "accelerate"}, "megatron": {"megatron", "accelerate"},
           "fsdp": {"torchtitan", "accelerate", "hf_trainer"}}[framework]  # fmt: skip
    assert {a["target"] for a in plan["artifacts"]} & own


def test_one_gpu_offloads_only_to_host_ram_the_cluster_states(client: TestClient) -> None:
    # full fine-tuning of 8B on one H100: infeasible on the card alone, feasible with ZeRO-Offload
    # once the node states its host RAM (512 GiB)
    body = plan_body(
        model={"preset": "llama-3.1-8b"},
        training={"seq_len": 2048, "global_batch_size": 8},
        constraints={"top_k": 2},
        launchers=ALL_RUNNERS,
    )
    unstated = create(
        client, body | {"cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1}}
    )
    assert unstated["status"] == "infeasible"
    # what offload would need is a suggestion, not a plan
    assert any(s["kind"] == "offload" for s in unstated["suggestions"])
    stated = {
        "gpu": "h100-sxm-80gb",
        "num_nodes": 1,
        "gpus_per_node": 1,
        "cpu_memory_bytes_per_node": 512 * 2**30,
    }
    plan = create(client, body | {"cluster": stated})
    assert plan["status"] == "feasible"
    layout = plan["recommended"]["layout"]
    assert layout["dp"] == 1 and layout["offload_optimizer"] == "cpu"
    assert plan["recommended"]["estimate"]["memory"]["cpu_per_node_bytes"] <= 512 * 2**30
    assert plan["artifacts"]


def test_what_the_gpu_cannot_run_is_a_422_naming_the_field(client: TestClient) -> None:
    v100 = {"gpu": "v100-sxm2-32gb", "num_nodes": 1, "gpus_per_node": 8}
    flash = {"seq_len": 1024, "global_batch_size": 64, "precision": "fp16", "attention": "flash"}
    body = plan_body(cluster=v100, training=flash)
    problem = assert_problem(client.post("/v1/plans", json=body), 422)  # flash attention on Volta, asked
    assert (problem["errors"][0]["field"], problem["errors"][0]["rule"]) == (
        "training.attention",
        "flash_attention",
    )
    bf16 = body | {"training": {"seq_len": 1024, "global_batch_size": 64, "precision": "bf16"}}
    problem = assert_problem(client.post("/v1/plans", json=bf16), 422)  # bf16 before Ampere, asked
    assert problem["errors"][0]["field"] == "training.precision"
    ok = body | {
        "training": {"seq_len": 1024, "global_batch_size": 64, "precision": "fp16", "attention": "sdpa"}
    }
    assert create(client, ok)["status"] == "feasible"
    assert client.get("/v1/gpus/v100-sxm2-32gb").json()["flash_attention"] is False
    # neither asked: each resolves to what Volta runs, and the answer says so
    unasked = create(client, body | {"training": {"seq_len": 1024, "global_batch_size": 64}})
    chosen = {"training.precision": "fp16", "training.attention": "sdpa"}
    assert unasked["status"] == "feasible" and unasked["resolved_defaults"] == chosen
    assert unasked["recommended"]["estimate"]["resolved_defaults"] == chosen


def test_llama_2_13b_on_four_v100s_plans_with_the_defaults_volta_runs(client: TestClient) -> None:
    """The write-up's scenario: 13B full fine-tuning on 4 x V100 32GB, no precision or attention
    named. 13B x 16 bytes of states (208 GB) exceed 4 x 32 GB: infeasible on the cards alone, with
    offload suggested; feasible with ZeRO offload once the node states its host RAM."""
    training = {"seq_len": 2048, "global_batch_size": 32}
    v100 = {"gpu": "v100-sxm2-32gb", "num_nodes": 1, "gpus_per_node": 4}
    alone = create(client, plan_body(model={"preset": "llama-2-13b"}, cluster=v100, training=training))
    assert alone["status"] == "infeasible"
    assert alone["resolved_defaults"] == {"training.precision": "fp16", "training.attention": "sdpa"}
    kinds = [s["kind"] for s in alone["suggestions"]]
    assert "offload" in kinds and kinds.index("offload") < kinds.index("more_gpus")
    stated = v100 | {"cpu_memory_bytes_per_node": 512 * 2**30}
    plan = create(client, plan_body(model={"preset": "llama-2-13b"}, cluster=stated, training=training))
    assert plan["status"] == "feasible"
    layout = plan["recommended"]["layout"]
    assert layout["offload_optimizer"] != "none" or layout["offload_params"] != "none"


def test_what_a_run_says_about_the_hardware_calibrates_every_framework(client: TestClient) -> None:
    # one slow DeepSpeed run on this cluster: an FSDP estimate on the same hardware is slowed by the
    # hardware's share of it, and its memory (allocator, buffers: the framework's own) is not touched
    plan = create(client, plan_body())
    step_s = plan["recommended"]["estimate"]["time"]["step_s"]
    run = {"step_s": step_s * 1.5, "framework_version": "deepspeed 0.19.8"}
    assert client.post(f"/v1/plans/{plan['id']}/runs", json=run).status_code == 201
    fsdp = {
        "model": plan_body()["model"],
        "cluster": plan_body()["cluster"],
        "training": plan_body()["training"],
        "layout": {"framework": "fsdp", "dp": 8, "zero_stage": 3},
    }
    calibrated = client.post("/v1/estimates", json=fsdp).json()["calibration"]
    assert calibrated["factors"]["step_time_hardware"] == pytest.approx(1.5)
    assert calibrated["factors"]["step_time_framework"] == 1.0  # no FSDP run yet
    assert calibrated["factors"]["step_time"] == pytest.approx(1.5)
    assert calibrated["factors"]["memory_dynamic"] == 1.0


def test_asked_to_compile_the_fsdp_plan_is_estimated_rendered_and_explained_compiled(
    client: TestClient,
) -> None:
    body = plan_body(
        model={"preset": "llama-3.1-8b"},
        training={"seq_len": 8192, "global_batch_size": 16},
        constraints={"top_k": 2, "frameworks": ["fsdp"], "torch_compile": True},
        launchers=["torchtitan", "hf_trainer", "accelerate"],
    )
    compiled, eager = (
        create(client, body),
        create(client, body | {"constraints": {"top_k": 2, "frameworks": ["fsdp"]}}),
    )
    for candidate in [compiled["recommended"], *compiled["alternatives"]]:
        assert candidate["layout"]["torch_compile"] == "model_and_loss"
    assert eager["recommended"]["layout"]["torch_compile"] == "none"
    assert any("torch.compile" in line for line in compiled["recommended"]["rationale"])
    # the fused loss keeps no fp32 logits: more tokens per GPU or fewer recomputed
    assert (
        compiled["recommended"]["estimate"]["time"]["tokens_per_s"]
        > eager["recommended"]["estimate"]["time"]["tokens_per_s"]
    )
    text = {a["target"]: "" for a in compiled["artifacts"]}
    for artifact in compiled["artifacts"]:
        text[artifact["target"]] += client.get(artifact["url"]).text
    assert "--compile.enable" in text["torchtitan"]
    if compiled["recommended"]["layout"]["chunked_loss"]:  # torchtitan's alone: Accelerate says so
        assert "chunked_loss" in compiled["unsupported_targets"]["accelerate"]
    else:
        assert "dynamo_backend: INDUCTOR" in text["accelerate"]
    if "hf_trainer" in text:  # data parallelism only
        assert '"torch_compile": true' in text["hf_trainer"]
    else:
        why = compiled["unsupported_targets"]["hf_trainer"]
        assert "data parallelism only" in why or "chunked_loss" in why


def test_asking_to_compile_what_cannot_be_compiled_is_refused(client: TestClient) -> None:
    """constraints.torch_compile changes only FSDP layouts, and not QLoRA's: asked where it would
    change nothing, it is a 422 naming the field, and nothing is stored."""
    before = client.get("/v1/plans").json()["items"]
    for constraints, training in (
        ({"frameworks": ["megatron", "deepspeed"], "torch_compile": True}, {}),
        ({"torch_compile": True}, {"method": "qlora"}),
    ):
        body = plan_body(constraints=constraints)
        body["training"] |= training
        for path in ("/v1/plans", "/v1/capacity"):
            payload = (
                body if path == "/v1/plans" else {k: body[k] for k in ("model", "training", "constraints")}
            )
            problem = assert_problem(client.post(path, json=payload), 422)
            assert problem["errors"][0]["field"] == "constraints.torch_compile", problem
            assert "torch_compile" in problem["detail"]
    assert client.get("/v1/plans").json()["items"] == before


def test_a_megatron_moe_plan_with_multi_token_prediction_launches_what_was_estimated(
    client: TestClient,
) -> None:
    # Qwen3-30B-A3B on two H100 nodes, one MTP depth: only Megatron trains it, and its launch script
    # carries the MTP depth and the all-to-all overlap exactly when the estimate has them
    body = plan_body(
        model={"preset": "qwen3-30b-a3b"},
        cluster={
            "gpu": "h100-sxm-80gb",
            "num_nodes": 2,
            "gpus_per_node": 8,
            "inter_node_bandwidth_gbps": 400,
        },
        training={"seq_len": 4096, "global_batch_size": 128, "mtp_num_layers": 1},
        constraints={"top_k": 2},
        launchers=["megatron"],
    )
    plan = create(client, body)
    assert plan["status"] == "feasible", plan
    layout = plan["recommended"]["layout"]
    assert layout["framework"] == "megatron" and layout["ep"] > 1
    script = client.get(f"/v1/plans/{plan['id']}/artifacts/{plan['artifacts'][0]['name']}").text
    assert "--mtp-num-layers 1" in script
    assert ("--overlap-moe-expert-parallel-comm" in script) == layout["moe_a2a_overlap"]
    ep_line = next(line for line in plan["recommended"]["rationale"] if line.startswith("EP="))
    assert ("--overlap-moe-expert-parallel-comm" in ep_line) == layout["moe_a2a_overlap"]


def test_out_of_memory_advice_shards_only_over_data_parallel_ranks(client: TestClient) -> None:
    # LoRA 7B on one L4 (DeepSpeed dp 1, ZeRO-0) ran out of memory: "zero_stage 0 -> 1" shards over
    # one rank and frees nothing; it is advised only where dp > 1 (memory review)
    body = {
        "model": {"preset": "llama-2-7b"},
        "cluster": {"gpu": "l4-24gb", "num_nodes": 1, "gpus_per_node": 1},
        "training": {"seq_len": 2048, "global_batch_size": 16, "method": "lora"},
        "constraints": {"frameworks": ["deepspeed"]},
        "launchers": [],
    }
    plan = create(client, body)
    assert plan["recommended"]["layout"]["dp"] == 1
    advice = client.post(f"/v1/plans/{plan['id']}/runs", json={"out_of_memory": True}).json()["diagnosis"]
    assert not any("zero_stage" in line for line in advice["advice"]), advice["advice"]
