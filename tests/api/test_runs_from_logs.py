"""Runs from logs: `POST /v1/plans/{id}/runs` with `{"log", "format"}` stores the run the log
states (step time, throughput, peak memory, out of memory) with what was read from which lines, and
it is diagnosed and calibrates like a typed run. The unversioned `/plans` routes are aliases of
`/v1/plans`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from service.contracts.plans import RunIn
from tests.api.helpers import assert_problem
from tests.api.test_plans import create, plan_body

LOGS = Path(__file__).resolve().parents[1] / "runlogs" / "logs"
GIB, MIB = 2**30, 2**20


def log(name: str) -> str:
    return (LOGS / f"{name}.log").read_text()


@pytest.fixture
def plan(client: TestClient) -> dict[str, Any]:
    body = plan_body()
    body["launchers"] = []
    return create(client, body)  # gpt2, seq 1024, global batch 64, DeepSpeed dp=8 on 8 H100


def post_log(client: TestClient, plan_id: str, text: str, **extra: Any) -> dict[str, Any]:
    response = client.post(f"/v1/plans/{plan_id}/runs", json={"log": text, **extra})
    assert response.status_code == 201, response.text
    run: dict[str, Any] = response.json()
    return run


def figure(run: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(f for f in run["source"]["figures"] if f["name"] == name)
    return found


def gpus(plan: dict[str, Any]) -> int:
    layout = plan["recommended"]["layout"]
    return int(layout["dp"] * layout["tp"] * layout["pp"] * layout["cp"])


def test_megatron_log(client: TestClient, plan: dict[str, Any]) -> None:
    run = post_log(client, plan["id"], log("megatron"), format="megatron")
    assert run["step_s"] == pytest.approx(2.59845)
    assert run["tokens_per_s"] is None
    assert run["peak_memory_bytes_per_gpu"] == 42520 * MIB
    assert run["out_of_memory"] is False
    source = run["source"]
    assert source["format"] == "megatron" and source["memory_statistic"] == "max_reserved"
    assert figure(run, "step_s")["lines"] == [14, 15, 16, 17]
    assert figure(run, "tflops_per_gpu")["value"] == pytest.approx(211.3)
    assert source["excerpts"] and all(len(e["text"]) <= 160 for e in source["excerpts"])
    assert run["diagnosis"]["measured_step_s"] == pytest.approx(2.59845)
    # the same answer afterwards
    again = client.get(f"/v1/plans/{plan['id']}/runs/{run['id']}").json()
    assert again["source"] == source and again["step_s"] == run["step_s"]


def test_torchtitan_log(client: TestClient, plan: dict[str, Any]) -> None:
    run = post_log(client, plan["id"], log("torchtitan"))  # format auto
    assert run["source"]["format"] == "torchtitan"
    # tps is per GPU: the job's tokens/s is that times the plan's GPUs
    assert run["tokens_per_s"] == pytest.approx(6639.5 * gpus(plan))
    assert run["step_s"] is None
    assert run["peak_memory_bytes_per_gpu"] == round(63.92 * GIB)
    assert any("x 8 GPUs" in c for c in run["source"]["conversions"])
    tokens_per_step = 1024 * 64
    assert run["diagnosis"]["measured_step_s"] == pytest.approx(tokens_per_step / (6639.5 * gpus(plan)))


def test_deepspeed_log(client: TestClient, plan: dict[str, Any]) -> None:
    run = post_log(client, plan["id"], log("deepspeed"), format="deepspeed")
    assert run["tokens_per_s"] == pytest.approx(13.330 * 1024)  # samples/s x the plan's seq_len
    assert run["peak_memory_bytes_per_gpu"] == round(59.37 * GIB)
    assert run["source"]["memory_statistic"] == "max_allocated"


def test_hf_trainer_log(client: TestClient, plan: dict[str, Any]) -> None:
    run = post_log(client, plan["id"], log("hf_trainer"), format="hf_trainer", notes="sft run 3")
    assert run["step_s"] == pytest.approx(4.12)
    assert run["peak_memory_bytes_per_gpu"] == 16060522496 + 32121044992 + 19470073856
    assert run["source"]["summary"]["train_samples_per_second"] == pytest.approx(15.258)
    assert run["notes"] == "sft run 3"


def test_out_of_memory_log(client: TestClient, plan: dict[str, Any]) -> None:
    run = post_log(client, plan["id"], log("oom"))
    assert run["out_of_memory"] is True
    assert run["peak_memory_bytes_per_gpu"] is None
    oom = run["source"]["out_of_memory"]
    assert oom["line"] == 8 and oom["tried_to_allocate_bytes"] == 2 * GIB
    assert oom["capacity_bytes"] == round(79.11 * GIB)
    # gpt2 fills 12.7 GB of the 80 GB card: an error 4x past the estimate is set aside, with why
    assert run["diagnosis"]["implausible"] is True
    assert "ran out of" in run["diagnosis"]["implausible_reasons"][0]


def test_a_log_run_moves_the_factors_like_a_typed_run(client: TestClient) -> None:
    # a Megatron log, of a Megatron plan (another framework's log is set aside)
    plan = create(client, plan_body() | {"launchers": [], "constraints": {"frameworks": ["megatron"]}})
    assert plan["recommended"]["layout"]["framework"] == "megatron"
    estimate = plan["recommended"]["estimate"]
    step_ms = estimate["time"]["step_s"] * 1.25 * 1000
    total_mib = estimate["memory"]["per_gpu"]["total"] / MIB
    lines = [
        f" [2025-03-14 10:0{i // 10}:00.000000] iteration {i:8d}/     500 | consumed samples: {i * 64:12d} | "
        f"elapsed time per iteration (ms): {step_ms * (3 if i == 1 else 1):.3f} | global batch size:    64 |"
        for i in (1, 10, 20, 30, 40)
    ]
    lines.append(
        f"[Rank 0] (after 10 iterations) memory (MB) | allocated: {total_mib / 2:.2f} | max allocated: "
        f"{total_mib * 0.9:.2f} | reserved: {total_mib:.2f} | max reserved: {total_mib:.2f}"
    )
    request = {k: plan_body()[k] for k in ("model", "cluster", "training")} | {
        "layout": plan["recommended"]["layout"]
    }
    run = post_log(client, plan["id"], "\n".join(lines))
    assert run["diagnosis"]["implausible"] is False
    assert run["diagnosis"]["step_time_error"] == pytest.approx(0.25, abs=1e-3)
    assert run["calibration"]["runs"] == 1
    after = client.post("/v1/estimates", json=request).json()
    assert after["calibration"]["factors"]["step_time"] == pytest.approx(1.25, abs=1e-3)
    # the run behind the factor is named, and the figure without it quoted beside the calibrated one
    assert [e["run_id"] for e in after["calibration"]["evidence"]] == [run["id"]]
    assert after["calibration"]["uncalibrated"]["step_s"] == pytest.approx(estimate["time"]["step_s"])


def test_a_log_far_off_is_set_aside(client: TestClient, plan: dict[str, Any]) -> None:
    run = post_log(client, plan["id"], log("megatron"))  # a 7B job's 2.6 s step: not gpt2's
    assert run["diagnosis"]["implausible"] is True and run["diagnosis"]["implausible_reasons"]
    # later answers on this hardware say which run was set aside, and why
    again = client.post("/v1/plans", json=plan_body()).json()
    aside = again["recommended"]["estimate"]["calibration"]["set_aside"]
    assert [(a["run_id"], a["plan_id"]) for a in aside] == [(run["id"], plan["id"])]
    assert aside[0]["reasons"] == run["diagnosis"]["implausible_reasons"]


def test_log_problems_name_the_log(client: TestClient, plan: dict[str, Any]) -> None:
    url = f"/v1/plans/{plan['id']}/runs"
    problem = assert_problem(client.post(url, json={"log": "hello\nworld\n"}), 422)
    assert problem["errors"][0]["field"] == "log"
    assert "looked for" in problem["detail"] and "Megatron-LM" in problem["detail"]
    problem = assert_problem(client.post(url, json={"log": log("megatron"), "format": "torchtitan"}), 422)
    assert problem["errors"][0]["field"] == "log"
    for bad in (
        {"log": log("megatron"), "step_s": 1.0},
        {"log": log("megatron"), "out_of_memory": True},
        {"log": log("megatron"), "format": "nemo"},
        {"format": "megatron", "step_s": 1.0},
        {"log": ""},
    ):
        assert_problem(client.post(url, json=bad), 422)
    # the body limit (this app's: 256 KiB; the service's default 1 MiB) or the field's own
    assert client.post(url, json={"log": "x" * 1_000_001}).status_code == 413
    with pytest.raises(ValidationError, match="log"):
        RunIn.model_validate({"log": "x" * 1_000_001})
    assert client.get(url).json()["items"] == []


def test_a_retried_log_is_stored_once(client: TestClient, plan: dict[str, Any]) -> None:
    url = f"/v1/plans/{plan['id']}/runs"
    body = {"log": log("deepspeed")}
    first = client.post(url, json=body, headers={"Idempotency-Key": "log-1"})
    # another run between the two: the replay is still the first answer, not today's calibration
    assert client.post(url, json={"step_s": 0.5}, headers={"Idempotency-Key": "typed"}).status_code == 201
    again = client.post(url, json=body, headers={"Idempotency-Key": "log-1"})
    assert (
        first.status_code == 201
        and again.status_code == 201
        and again.headers["idempotent-replayed"] == "true"
    )
    assert again.json()["id"] == first.json()["id"] and again.json()["source"] == first.json()["source"]
    assert len(client.get(url).json()["items"]) == 2
    # the answer the first request got, its calibration included (a replay said null: concurrency review;
    # recomputed, it counted the run stored since: change review)
    assert first.json()["calibration"] is not None and again.json() == first.json()


def test_typed_runs_have_no_source(client: TestClient, plan: dict[str, Any]) -> None:
    response = client.post(f"/v1/plans/{plan['id']}/runs", json={"step_s": 0.5})
    assert response.status_code == 201 and response.json()["source"] is None


# ---------------------------------------------------------------- the unversioned plan routes


def test_post_plans_answers_like_post_v1_plans(client: TestClient) -> None:
    body = plan_body()
    versioned = client.post("/v1/plans", json=body)
    alias = client.post("/plans", json=body)
    assert alias.status_code == versioned.status_code == 201
    made = alias.json()
    assert alias.headers["location"] == f"/v1/plans/{made['id']}"
    strip = {"id", "created_at", "search", "artifacts"}
    assert {k: v for k, v in made.items() if k not in strip} == {
        k: v for k, v in versioned.json().items() if k not in strip
    }
    assert client.get(f"/plans/{made['id']}").json() == client.get(f"/v1/plans/{made['id']}").json()
    assert [p["id"] for p in client.get("/plans").json()["items"]] == [
        p["id"] for p in client.get("/v1/plans").json()["items"]
    ]
    assert (
        client.get(f"/plans/{made['id']}/artifacts").json()
        == client.get(f"/v1/plans/{made['id']}/artifacts").json()
    )
    run = client.post(f"/plans/{made['id']}/runs", json={"log": log("oom")})
    assert run.status_code == 201 and run.json()["out_of_memory"] is True
    assert client.delete(f"/plans/{made['id']}").status_code == 204
    assert_problem(client.get(f"/v1/plans/{made['id']}"), 404)
    assert_problem(client.post("/plans", json={"model": {"preset": "gpt2"}}), 422)


def test_the_aliases_are_deprecated_in_the_openapi_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    versioned = {p.removeprefix("/v1") for p in paths if p.startswith("/v1/plans")}
    aliases = {p for p in paths if p.startswith("/plans")}
    assert aliases == versioned
    for path in aliases:
        for method, operation in paths[path].items():
            assert operation["deprecated"] is True, (method, path)
            assert set(paths["/v1" + path][method]["responses"]) == set(operation["responses"])


def test_a_log_of_another_job_calibrates_nothing(client: TestClient) -> None:
    """What a log states about its job is compared with the plan's (runs review, stop 39): a Megatron
    log at global batch 96 posted to a batch-128 plan moved the hardware's step factor to 0.83; an OOM
    on a 79 GiB card posted to a 40 GiB plan raised its memory factor to 1.3."""
    body = plan_body()
    body["launchers"] = []
    body["training"] = {**body["training"], "global_batch_size": 128}
    plan = create(client, body)
    step = plan["recommended"]["estimate"]["time"]["step_s"] * 1000
    lines = [
        f"[2025-03-14 10:0{i}:00] iteration {i:8d}/     500 | consumed samples: {96 * i:12d} | "
        f"elapsed time per iteration (ms): {step:.1f} | learning rate: 1.5E-04 | global batch size:    96 | "
        "lm loss: 3.2 |"
        for i in range(1, 9)
    ]
    run = post_log(client, plan["id"], "\n".join(lines))
    reasons = run["diagnosis"]["implausible_reasons"]
    assert run["diagnosis"]["implausible"] is True and any("global batch 96" in r for r in reasons), reasons
    assert run["calibration"]["time_runs"] == 0

    small = plan_body()
    small["launchers"] = []
    small["cluster"] = {**small["cluster"], "gpu": "a100-sxm-40gb"}
    on_40 = create(client, small)
    oom = post_log(client, on_40["id"], log("oom"))  # "GPU 1 has a total capacity of 79.11 GiB"
    reasons = oom["diagnosis"]["implausible_reasons"]
    assert any("79.11 GiB, the plan's card 40 GiB" in r for r in reasons), reasons
    assert oom["calibration"]["memory_runs"] == 0 and oom["calibration"]["out_of_memory_runs"] == 0


def test_a_ramp_up_is_skipped_and_a_world_or_batch_of_another_job_is_set_aside(client: TestClient) -> None:
    """Megatron's --rampup-batch-size: steps at batch 32-96 before 128 were read as the run's (11.8 s
    where it ran 15.6); "using world size: 16" on an 8-GPU plan, and the HF Trainer's "Total train
    batch size ... = 128" on a batch-64 plan, calibrated as if they measured the plan (runs review)."""
    body = plan_body()
    body["launchers"] = []
    body["training"] = {**body["training"], "global_batch_size": 128}
    plan = create(client, body)
    gpus_of_plan = gpus(plan)
    step = plan["recommended"]["estimate"]["time"]["step_s"] * 1000

    def iteration(i: int, batch: int, ms: float) -> str:
        return (
            f"[2025-03-14 10:00:{i:02d}] iteration {i:8d}/     500 | consumed samples: {batch * i:12d} | "
            f"elapsed time per iteration (ms): {ms:.1f} | global batch size: {batch:5d} |"
        )

    ramp = [iteration(i, b, step * b / 128) for i, b in enumerate((32, 32, 64, 96, 128, 128, 128, 128), 1)]
    run = post_log(client, plan["id"], "\n".join(ramp))
    assert run["step_s"] == pytest.approx(step / 1000, rel=1e-3)
    assert any("ramp-up" in n for n in run["source"]["notes"]), run["source"]["notes"]
    world = f"using world size: {2 * gpus_of_plan}, data-parallel size: {2 * gpus_of_plan}"
    moved = post_log(client, plan["id"], "\n".join([world, *ramp[4:]] * 1))
    reasons = moved["diagnosis"]["implausible_reasons"]
    assert any(f"ran on {2 * gpus_of_plan} GPUs" in r for r in reasons), reasons

    hf = create(client, plan_body() | {"launchers": []})  # global batch 64
    text = "\n".join(
        [
            "  Total train batch size (w. parallel, distributed & accumulation) = 128",
            "  Total optimization steps = 100",
            *(f" {i}%|##   | {i}/100 [01:00<03:00,  1.50s/it]" for i in range(5, 12)),
        ]
    )
    stored = post_log(client, hf["id"], text, format="hf_trainer")
    assert any("global batch 128" in r for r in stored["diagnosis"]["implausible_reasons"]), stored[
        "diagnosis"
    ]


def test_another_frameworks_log_is_set_aside(client: TestClient, plan: dict[str, Any]) -> None:
    """A torchtitan log posted to a DeepSpeed plan (or a Megatron log) was read and calibrated the plan's
    framework, its memory factor included (runs review): set aside, saying whose log it is."""
    assert plan["recommended"]["layout"]["framework"] == "deepspeed"
    for name, printed in (("torchtitan", "torchtitan's, which runs fsdp"), ("megatron", "megatron's")):
        run = post_log(client, plan["id"], log(name))
        assert run["diagnosis"]["implausible"] is True
        assert any(
            printed in r and "another framework's step" in r for r in run["diagnosis"]["implausible_reasons"]
        )


def test_a_log_whose_own_flops_are_another_jobs_is_set_aside(client: TestClient) -> None:
    """Megatron prints its TFLOP/s per GPU: x GPUs x the step, the FLOPs the run computed. A 16-GPU log
    (0.5x the plan's) and a 13B log on an 8B plan (1.65x) calibrated it (runs review)."""
    plan = create(client, plan_body() | {"launchers": [], "constraints": {"frameworks": ["megatron"]}})
    time = plan["recommended"]["estimate"]["time"]
    step_ms = time["step_s"] * 1000

    def posted(ratio: float) -> dict[str, Any]:
        tflops = time["tflops_per_gpu"] * ratio
        lines = [
            f" [2025-03-14 10:0{i // 10}:00.000000] iteration {i:8d}/     500 | consumed samples: "
            f"{i * 64:12d} | elapsed time per iteration (ms): {step_ms:.3f} | throughput per GPU "
            f"(TFLOP/s/GPU): {tflops:.1f} | global batch size:    64 |"
            for i in (1, 10, 20, 30, 40)
        ]
        return post_log(client, plan["id"], "\n".join(lines))

    for ratio in (0.5, 1.65):
        reasons = posted(ratio)["diagnosis"]["implausible_reasons"]
        assert any("the plan's model FLOPs per step" in r for r in reasons), (ratio, reasons)
    assert posted(1.1)["diagnosis"]["implausible"] is False  # within the formulas' differences


MEGATRON_ITERATION_1 = (
    " [2026-03-02 10:03:58.118274] iteration        1/    5000 | consumed samples:          128 | elapsed "
    "time per iteration (ms): 96210.4 | throughput per GPU (TFLOP/s/GPU): 70.1 | global batch size:    64 |"
)


def test_a_log_of_warm_up_alone_stores_no_step_time(client: TestClient, plan: dict[str, Any]) -> None:
    """The first paste after a launch, iteration 1 alone, set the hardware's step factor to its 3.0 bound
    though its own words said start-up was included (logs review): its memory is stored, its time is not,
    and said; with nothing else a run stores, it is a 422 naming the log."""
    memory = "[Rank 0] (after 1 iterations) memory (MB) | allocated: 4023.41 | max allocated: 6070.17 | reserved: 6498.00 | max reserved: 6498.00"  # noqa: E501
    run = post_log(client, plan["id"], f"{MEGATRON_ITERATION_1}\n{memory}")
    assert run["step_s"] is None and run["tokens_per_s"] is None
    assert run["peak_memory_bytes_per_gpu"] == round(6498.00 * 2**20)
    assert any("every reading of it is warm-up" in c for c in run["source"]["conversions"])
    problem = assert_problem(
        client.post(f"/v1/plans/{plan['id']}/runs", json={"log": MEGATRON_ITERATION_1}), 422
    )
    assert problem["errors"][0]["field"] == "log" and "all warm-up" in problem["detail"]


@pytest.mark.parametrize(
    "line",
    [
        "epoch=0/micro_step=40/global_step=10, RunningAvgSamplesPerSec=1, CurrSamplesPerSec=1, "
        "MemAllocated=1GB, MaxMemAllocated=1e305GB",
        "[Rank 0] (after 10 iterations) memory (MB) | allocated: 1.0e305 | max allocated: 1.0 | reserved: "
        "0.00 | max reserved: 0.00",
        "step: 20  loss: 1.0  memory: 1e305GiB(5.00%)  tps: 1,000  tflops: 1  mfu: 1%",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1e305 TiB. GPU 0 has a total capacity "
        "of 79.11 GiB of which 1 GiB is free.",
    ],
)
def test_a_memory_figure_no_gpu_has_is_left_out_not_a_500(
    client: TestClient, plan: dict[str, Any], line: str
) -> None:
    """1e305 GiB overflowed to inf when turned into bytes, and round() raised: a 500 (logs review)."""
    response = client.post(f"/v1/plans/{plan['id']}/runs", json={"log": line})
    assert response.status_code in (201, 422), response.text
    if response.status_code == 422:  # nothing else a run stores: the log is named
        assert response.json()["errors"][0]["field"] == "log"
        return
    run = response.json()
    assert (run["peak_memory_bytes_per_gpu"] or 0) <= 2**50
    if "Tried to allocate" in line:  # the error's absurd figure is not quoted
        assert "tried_to_allocate_bytes" not in run["source"]["out_of_memory"]
    else:  # the reading is left out, and said
        assert any("is no GPU's: left out" in note for note in run["source"]["notes"]), run["source"]


def test_a_deepspeed_pipeline_line_with_an_moe_loss_and_a_cuda_error_oom_are_read() -> None:
    """DeepSpeed's pipeline engine prints each extra loss between the loss and the iter time (#5338:
    moe_loss), refused as no step time; "CUDA error: out of memory" (memory outside the caching allocator)
    was stored as a healthy run (logs review)."""
    from service.runlogs import parse_log

    steps = "\n".join(
        f"steps: {n} loss: 6.9012 moe_loss: 0.0198 iter time (s): 19.503 samples/sec: 6.563"
        for n in (10, 20, 30)
    )
    parsed = parse_log(steps)
    assert parsed.format == "deepspeed" and parsed.step_s is not None
    assert parsed.step_s.value == pytest.approx(19.503)
    crashed = parse_log("step: 20  loss: 1.0  memory: 60GiB(75.00%)  tps: 1,000  tflops: 1  mfu: 1%\n"
                        "[rank0]: RuntimeError: CUDA error: out of memory")  # fmt: skip
    assert crashed.out_of_memory is not None


def _deepspeed_log(batch: int, world: int, samples_per_s: float) -> str:
    head = [
        f"[2025-02-20 16:40:09,872] [INFO] [config.py:1001:print]   train_batch_size ............. {batch}",
        f"[2025-02-20 16:40:09,872] [INFO] [config.py:1001:print]   world_size ................... {world}",
    ]
    timers = [
        f"[2025-02-20 16:4{i}:02,448] [INFO] [timer.py:264:stop] epoch=0/micro_step={40 * i}/"
        f"global_step={10 * i}, "
        f"RunningAvgSamplesPerSec={samples_per_s:.3f}, CurrSamplesPerSec={samples_per_s:.3f}, "
        "MemAllocated=27.63GB, MaxMemAllocated=41.2GB"
        for i in range(1, 8)
    ]
    return "\n".join(head + timers)


def test_a_deepspeed_autotp_plans_own_log_is_its_job_at_its_own_rate(client: TestClient) -> None:
    """DeepSpeed's batch check counts every rank under AutoTP (no mpu: dist.get_world_size()), so a
    tp-2 run logs train_batch_size and samples/s twice the plan's (launchers.deepspeed.counted_ranks,
    which its launch file says). Its own log was set aside as "global batch 128, the plan 64: another
    job's" and read at twice its throughput (batch review)."""
    # (a tied model, which AutoTP makes vocab-parallel: an untied one keeps its logits whole on every
    # rank, and Llama 3 8B's no longer fit at 32k tokens)
    body = {
        "model": {"preset": "llama-3.2-3b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 65536, "global_batch_size": 64},
        "constraints": {"frameworks": ["deepspeed"]},
        "launchers": ["deepspeed"],  # its own launcher: AutoTP (Accelerate's ALST would take cp 8)
    }
    plan = create(client, body)
    layout, step_s = plan["recommended"]["layout"], plan["recommended"]["estimate"]["time"]["step_s"]
    tp, dp = layout["tp"], layout["dp"]
    assert tp > 1 and layout["pp"] == 1, layout  # the case: AutoTP
    counted = 64 * tp
    run = post_log(client, plan["id"], _deepspeed_log(counted, dp * tp, counted / step_s), format="deepspeed")
    assert run["diagnosis"]["implausible"] is False, run["diagnosis"]
    assert run["tokens_per_s"] == pytest.approx(64 * 65536 / step_s, rel=1e-3)
    assert run["diagnosis"]["step_time_error"] == pytest.approx(0, abs=1e-3)
    assert any(f"/ {tp}" in c for c in run["source"]["conversions"]), run["source"]["conversions"]
    # a log of the plan's batch as the plan states it is another job's under AutoTP: DeepSpeed would count 128
    other = post_log(client, plan["id"], _deepspeed_log(64, dp * tp, 64 / step_s), format="deepspeed")
    assert any("global batch 64, the plan 64" in r for r in other["diagnosis"]["implausible_reasons"])


def test_a_deepspeed_pipeline_log_states_its_data_parallel_ranks(client: TestClient) -> None:
    """Under DeepSpeed's pipeline engine the PipelineModule's topology is the mpu, and the config print's
    world_size is its data-parallel size: a pp-8 run's own log ("world_size ... 1") was set aside as
    having run on 1 GPU of the plan's 8 (batch review)."""
    from service.planning.calibration import logged_batch_factor, logged_ranks

    pipeline = {"framework": "deepspeed", "dp": 1, "tp": 1, "pp": 8, "cp": 1}
    assert logged_ranks(pipeline, "deepspeed") == 1 and logged_batch_factor(pipeline, "deepspeed") == 1
    autotp = {"framework": "deepspeed", "dp": 4, "tp": 2, "pp": 1, "cp": 1}
    assert logged_ranks(autotp, "deepspeed") == 8 and logged_batch_factor(autotp, "deepspeed") == 2
    # every other log counts the job's GPUs and its global batch
    assert logged_ranks(pipeline, "megatron") == 8 and logged_batch_factor(autotp, "megatron") == 1


def test_an_accelerate_bar_under_gradient_accumulation_is_not_a_step_time(client: TestClient) -> None:
    """tqdm's s/it is one loop iteration: a micro-batch or an optimizer step, as the script ticks it.
    A plan of two micro-batches a step stored the bar's 0.50 s/it as its 0.99 s step and calibrated the
    hardware's step factor to 0.5 (batch review): left out, saying why; the peak is still kept."""
    body = {
        "model": {"preset": "llama-3.1-8b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 4096, "global_batch_size": 16},
        "constraints": {"frameworks": ["fsdp"]},
        "launchers": ["accelerate"],
    }
    plan = create(client, body)
    layout = plan["recommended"]["layout"]
    assert 16 // (layout["micro_batch_size"] * layout["dp"]) > 1, layout  # the case: it accumulates
    bar = [f" {i}%|##   | {i}/100 [01:00<03:00,  0.50s/it]" for i in range(5, 12)]
    text = "\n".join([*bar, "GPU Total Peak Memory consumed during the train (max): 40000"])
    run = post_log(client, plan["id"], text, format="accelerate")
    assert run["step_s"] is None and run["peak_memory_bytes_per_gpu"] == 40000 * MIB
    assert any("left out of the run" in c for c in run["source"]["conversions"]), run["source"]
    assert run["calibration"]["time_runs"] == 0
    # without a figure the run could store, the log is refused saying why
    refused = client.post(
        f"/v1/plans/{plan['id']}/runs", json={"log": "\n".join(bar), "format": "accelerate"}
    )
    assert "post step_s as measured" in assert_problem(refused, 422)["detail"]
