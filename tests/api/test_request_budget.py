"""Every planning request's work is bounded end to end (issue 25): a job past published practice is
refused before any search, a large job within it answers within the request's time budget (201 with
what was cut, or 422 when nothing was computed), a burst of them leaves an ordinary estimate
answering, and a plan whose client went away stops and stores nothing.

The budget tests run the service as it ships (PLANNER_REQUEST_BUDGET_S's default, 1.5 s of work),
on a loopback port where a real client can hang up."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.estimator.scale import SCALE_LIMITS
from service.recommender.budget import Budget
from service.settings import Settings
from tests.api.helpers import assert_problem
from tests.loopback import served

# Answers within this on the 2-core CI machine (the acceptance); the work stops at 1.5 s.
ANSWER_S = 2.0
SHIPPED_BUDGET_S = Settings.model_fields["request_budget_s"].default

BIG_MOE = {
    "num_layers": 1024,
    "hidden_size": 8192,
    "num_attention_heads": 64,
    "num_kv_heads": 8,
    "ffn_hidden_size": 2048,
    "vocab_size": 128_000,
    "moe": {"num_experts": 4096, "top_k": 8, "expert_ffn_hidden_size": 2048},
}
H100 = {"gpu": "h100-sxm-80gb", "inter_node_bandwidth_bytes_per_s": 5e10}
LLAMA_7B_CONFIG = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                   "num_attention_heads": 32, "vocab_size": 32000}  # fmt: skip
# The probes, as sent: each past a published limit, refused before any search.
PAST_THE_LIMITS = {
    "seq 10M x batch 100M": (
        {"model": {"preset": "llama-2-7b"}, "cluster": H100 | {"num_nodes": 1, "gpus_per_node": 8},
         "training": {"seq_len": 10_000_000, "global_batch_size": 100_000_000}},
        "training.seq_len",
    ),
    # (4,096 x 64 GPUs: the most a cluster may have; 100,000 x 64 is refused as the cluster's own)
    "10,000 layers x 4,096 experts on 4,096 x 64": (
        {"model": {"architecture": BIG_MOE | {"num_layers": 10_000}, "name": "moe"},
         "cluster": H100 | {"num_nodes": 4_096, "gpus_per_node": 64},
         "training": {"seq_len": 4096, "global_batch_size": 1024}},
        "model.architecture.num_layers",  # as sent, at the schema's maximum (a surfaces review)
    ),
    "hf_config llama with 10,000 layers on 1,024 x 8": (
        {"model": {"hf_config": LLAMA_7B_CONFIG | {"num_hidden_layers": 10_000}},
         "cluster": H100 | {"num_nodes": 1024, "gpus_per_node": 8},
         "training": {"seq_len": 4096, "global_batch_size": 4096}},
        "model.hf_config.num_hidden_layers",  # where the config states it (a review of ordinary requests)
    ),
}  # fmt: skip
# Within every limit and still large: what the time budget has to hold.
WITHIN_THE_LIMITS = {
    "1,024 layers x 4,096 experts on 262,144 GPUs": {
        "model": {"architecture": BIG_MOE, "name": "big-moe"},
        "cluster": H100 | {"num_nodes": 4096, "gpus_per_node": 64},
        "training": {"seq_len": 8192, "global_batch_size": 8192},
    },
    "hf_config llama with 1,024 layers on 1,024 x 8": {
        "model": {"hf_config": LLAMA_7B_CONFIG | {"num_hidden_layers": 1024}},
        "cluster": H100 | {"num_nodes": 1024, "gpus_per_node": 8},
        "training": {"seq_len": 4096, "global_batch_size": 4096},
    },
    "7B at 4M tokens per sequence on 8 H100": {
        "model": {"preset": "llama-2-7b"},
        "cluster": H100 | {"num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 4_194_304, "global_batch_size": 256},
    },
}  # fmt: skip
ESTIMATE = {
    "model": {"preset": "llama-3.1-8b"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
    "training": {"seq_len": 4096, "global_batch_size": 64},
    "layout": {"framework": "fsdp", "dp": 8, "zero_stage": 3},
}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[str]:
    with served(f"sqlite:///{tmp_path / 'budget.db'}") as url:
        yield url


def test_the_service_ships_with_a_budget_inside_the_answer_time() -> None:
    assert SHIPPED_BUDGET_S < ANSWER_S


@pytest.mark.parametrize("name", PAST_THE_LIMITS)
def test_a_job_past_published_practice_is_a_422_naming_the_field(client: TestClient, name: str) -> None:
    body, field = PAST_THE_LIMITS[name]
    started = time.perf_counter()
    problem = assert_problem(client.post("/v1/plans", json=body), 422)
    assert time.perf_counter() - started < ANSWER_S
    assert problem["errors"][0]["field"] == field and "largest published" in problem["detail"]
    assert client.get("/v1/plans").json()["items"] == []
    # estimates and capacity check the same bounds first
    estimate = body | {"layout": {}}
    assert assert_problem(client.post("/v1/estimates", json=estimate), 422)["errors"][0]["field"] == field


def test_every_limit_names_its_published_reference() -> None:
    for bound in SCALE_LIMITS:
        assert bound.reference and bound.limit > 0 and "." in bound.field


def _post(url: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int, dict[str, Any], float]:
    started = time.perf_counter()
    response = httpx.post(f"{url}/v1/plans", json=body, timeout=timeout)
    return response.status_code, response.json(), time.perf_counter() - started


@pytest.mark.parametrize("name", WITHIN_THE_LIMITS)
def test_a_large_job_answers_within_the_budget_and_says_what_was_cut(service: str, name: str) -> None:
    status, plan, took = _post(service, WITHIN_THE_LIMITS[name])
    if took >= ANSWER_S:
        # one more try: on a 2-core machine shared with the rest of the suite, the answer's work after
        # the budget (full estimates, launch files, storing) can stall behind other processes once;
        # a plan that overruns its budget overruns it every time
        status, plan, took = _post(service, WITHIN_THE_LIMITS[name])
    assert took < ANSWER_S, f"{name}: {took:.2f} s"
    if status == 422:  # nothing computed in time: the inputs that make it big are named
        assert plan["errors"] and "too large to plan" in plan["detail"]
        return
    assert status == 201, plan
    # whatever the budget cut says so: the search (truncated_by) or a suggestion (its reason)
    search = plan["search"]
    assert search["truncated"] == (search["truncated_by"] is not None), search
    for skipped in plan["suggestions_skipped"]:
        assert skipped["reason"], skipped


def test_eight_large_plans_at_once_leave_an_estimate_answering(service: str) -> None:
    """Eight slots held by the largest jobs: the ninth request (an ordinary estimate) waits for a
    slot, which each holds for its 1.5 s of work at most, and answers within 3 s."""
    bodies = list(WITHIN_THE_LIMITS.values())
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        burst = [pool.submit(_post, service, bodies[i % len(bodies)]) for i in range(8)]
        time.sleep(0.2)  # the burst holds the slots
        started = time.perf_counter()
        estimate = httpx.post(f"{service}/v1/estimates", json=ESTIMATE, timeout=30)
        took = time.perf_counter() - started
        outcomes = [future.result() for future in burst]
    assert estimate.status_code == 200, estimate.text
    assert took < 3.0, f"the estimate took {took:.2f} s behind eight large plans"
    # the four slots' plans answer; the four behind them wait planning_queue_wait_s (5 s) while four
    # budgets of 1.5 s CPU share one interpreter lock (up to 6 s of wall time), so a late one may be the
    # designed 503 that says the slots were busy (CI's 2-core machine once answered one so, at 5.04 s)
    slots = Settings.model_fields["max_concurrent_planning"].default
    answered = [status for status, _, _ in outcomes if status in (201, 422)]
    assert len(answered) >= slots, outcomes
    for status, problem, _ in outcomes:
        assert status in (201, 422, 503), problem
        if status == 503:
            assert "slots are busy" in problem["detail"], problem


def test_a_plan_whose_client_hung_up_stops_and_stores_nothing(service: str) -> None:
    """The client gives up after 0.3 s; without cancellation the plan would run on and be stored.
    It stops at the next budget check (every 50 ms at most), or, where it finished first, is refused
    before it is committed: nothing is stored. The plan is one that searches until its budget ends
    (1.5 s): a plan that answers near 0.3 s races the client's timeout (the 1,024-layer llama now
    takes 0.31-0.36 s, and CI once stored it as the client left)."""
    body = WITHIN_THE_LIMITS["1,024 layers x 4,096 experts on 262,144 GPUs"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{service}/v1/plans", json=body, timeout=httpx.Timeout(5.0, read=0.3))
    time.sleep(SHIPPED_BUDGET_S + 1.0)  # past when the uncancelled plan would have been stored
    assert httpx.get(f"{service}/v1/plans", timeout=10).json()["items"] == []
    # the service is free again: an ordinary estimate answers at once
    assert httpx.post(f"{service}/v1/estimates", json=ESTIMATE, timeout=10).status_code == 200
    # counted as the client's hang-up (nginx's 499), not a 500: HTTPStatus has no 499, and the
    # problem's title lookup raised, an unhandled error to the logs and the 5xx rate (operations review)
    metrics = httpx.get(f"{service}/metrics", timeout=10).text
    plans = [
        line
        for line in metrics.splitlines()
        if line.startswith("trainplan_http_requests_total") and '"/v1/plans"' in line
    ]
    assert any('status="499"' in line for line in plans) and not any(
        'status="500"' in line for line in plans
    ), plans


def test_a_budget_stops_on_evaluations_time_or_cancellation() -> None:
    budget = Budget(10)
    share = budget.share(max_evaluations=4, parts=2)
    assert share.left() == 4
    share.charge(4)
    assert share.exhausted() and share.reason == "evaluations"
    assert budget.left() == 6 and not budget.exhausted() and budget.reason is None
    clock = [0.0]
    timed = Budget(100, max_seconds=1.0, clock=lambda: clock[0])
    assert not timed.exhausted()
    clock[0] = 1.0
    assert timed.exhausted() and timed.reason == "time" and timed.share().exhausted()
    gone = threading.Event()
    cancelled = Budget(100, cancelled=gone.is_set, clock=lambda: clock[0])
    assert not cancelled.exhausted()
    gone.set()
    clock[0] += 1.0  # the next poll
    assert cancelled.exhausted() and cancelled.reason == "cancelled"


def test_a_client_gone_since_the_last_poll_is_seen_before_committing() -> None:
    """Between polls (every CANCEL_POLL_S) a finished plan's budget has not seen the hang-up;
    ``cancelled_now`` asks at once, through a share too, so a plan that finished after its client
    left is not stored."""
    clock = [0.0]
    gone = threading.Event()
    budget = Budget(100, cancelled=gone.is_set, clock=lambda: clock[0])
    share = budget.share(max_evaluations=10, parts=2)
    assert not budget.exhausted() and not budget.cancelled_now()
    gone.set()  # no time passes: the next poll is not due
    assert not budget.exhausted() and budget.reason is None
    assert share.cancelled_now() and budget.reason == "cancelled" and budget.exhausted()


def test_a_requests_seconds_are_its_own_cpu_time_within_a_wall_ceiling() -> None:
    """Eight plans at once on two cores each got an eighth of the CPU in their 1.5 s of wall time:
    a DeepSeek-V3 plan answered 15.4M tokens/s alone and 0.13M beside two others (one evaluation
    in), stored as feasible (bounded-work review, stop 39). A request's seconds are now the CPU time
    of its thread: waiting (here sleeping, as for the GIL) spends none of them. Past BUSY_WALL_FACTOR
    times its seconds of wall time it stops as "busy", which the API answers 503."""
    from service.recommender.budget import BUSY_WALL_FACTOR, Deadline

    budget = Deadline(seconds=0.05).budget(100)
    time.sleep(0.1)  # twice its seconds of wall time, no CPU
    assert not budget.exhausted() and budget.reason is None
    time.sleep(BUSY_WALL_FACTOR * 0.05)
    assert budget.exhausted() and budget.reason == "busy"
    assert budget.share(10).reason == "busy"  # the whole's reason, in every share
    spun = Deadline(seconds=0.05).budget(100)
    started = time.thread_time()
    while time.thread_time() - started < 0.06:
        pass  # its own CPU: that is what runs out
    assert spun.exhausted() and spun.reason == "time"


def test_a_plan_cut_for_want_of_cpu_is_a_503_and_stores_nothing(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.recommender import budget

    monkeypatch.setattr(budget, "BUSY_WALL_FACTOR", 0.0)  # the ceiling is reached at once
    response = client.post(
        "/v1/plans",
        json={
            "model": {"preset": "llama-3-8b"},
            "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 4, "gpus_per_node": 8},
            "training": {"seq_len": 4096, "global_batch_size": 256},
        },
    )
    problem = assert_problem(response, 503)
    assert response.headers["retry-after"] == "2"
    assert "the service is busy" in problem["detail"], problem
    assert client.get("/v1/plans").json()["items"] == []
