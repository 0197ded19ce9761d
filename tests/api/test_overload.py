"""Overload: CPU-heavy requests take one of a bounded set of planning slots; when all are held the
next waits briefly, then gets a 503 with Retry-After, while health checks and reads still answer."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from alembic import command
from fastapi.testclient import TestClient

from service.main import create_app
from service.settings import Settings
from tests.api.helpers import assert_problem
from tests.conftest import alembic_config

ESTIMATE = {
    "model": {"preset": "gpt2"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
    "training": {"seq_len": 128, "global_batch_size": 1},
    "layout": {},
}


def test_full_planning_slots_are_a_503_and_health_still_answers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'overload.db'}"
    command.upgrade(alembic_config(url), "head")
    settings = Settings(
        database_url=url, max_concurrent_planning=2, max_concurrent_capacity=2, planning_queue_wait_s=0.2
    )
    with TestClient(create_app(settings)) as client:
        state = client.app.state  # type: ignore[attr-defined]
        portal = client.portal
        assert portal is not None
        assert client.post("/v1/estimates", json=ESTIMATE).status_code == 200
        for slots in (state.planning_slots, state.estimate_slots, state.capacity_slots):
            for _ in range(2):  # two long searches (estimates) hold both slots of each pool
                portal.call(slots.acquire_nowait)
        try:
            started = time.perf_counter()
            for path, body in (("/v1/estimates", ESTIMATE), ("/v1/capacity", {"model": {"preset": "gpt2"},
                               "training": {"seq_len": 128, "global_batch_size": 1}})):  # fmt: skip
                response = client.post(path, json=body)
                problem = assert_problem(response, 503)
                assert response.headers["retry-after"] == "2"
                assert "slots are busy" in problem["detail"]
            assert time.perf_counter() - started < 2  # waited 0.2 s each, not for the searches
            assert client.get("/healthz").status_code == 200
            assert client.get("/v1/clusters").status_code == 200  # reads take no slot
        finally:
            for slots in (state.planning_slots, state.estimate_slots, state.capacity_slots):
                for _ in range(2):
                    portal.call(slots.release)
        assert client.post("/v1/estimates", json=ESTIMATE).status_code == 200


def test_a_slot_is_free_again_as_soon_as_its_request_answers(tmp_path: Path) -> None:
    """One slot of each kind and almost no wait: back-to-back requests each find it free (the slot is
    released when the answer is sent, not when a generator is collected)."""
    url = f"sqlite:///{tmp_path / 'slots.db'}"
    command.upgrade(alembic_config(url), "head")
    settings = Settings(database_url=url, max_concurrent_planning=1, planning_queue_wait_s=0.05)
    plan = {"model": {"preset": "gpt2"}, "cluster": ESTIMATE["cluster"], "training": ESTIMATE["training"]}
    with TestClient(create_app(settings)) as client:
        for _ in range(10):
            assert client.post("/v1/estimates", json=ESTIMATE).status_code == 200
            assert client.post("/v1/plans", json=plan).status_code == 201


def test_no_queueing_serves_a_free_slot_and_refuses_only_a_busy_one(tmp_path: Path) -> None:
    """PLANNER_PLANNING_QUEUE_WAIT_S=0 (documented as allowed) made every plan and estimate a 503 on an
    idle server: anyio's fail_after(0) cancels at the acquire's checkpoint even with a slot free
    (operations review). 0 means: a free slot at once, else 503 at once."""
    url = f"sqlite:///{tmp_path / 'nowait.db'}"
    command.upgrade(alembic_config(url), "head")
    settings = Settings(database_url=url, max_concurrent_planning=1, planning_queue_wait_s=0)
    plan = {"model": {"preset": "gpt2"}, "cluster": ESTIMATE["cluster"], "training": ESTIMATE["training"]}
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/estimates", json=ESTIMATE).status_code == 200
        assert client.post("/v1/plans", json=plan).status_code == 201
        state, portal = client.app.state, client.portal  # type: ignore[attr-defined]
        assert portal is not None
        portal.call(state.planning_slots.acquire_nowait)  # the one planning slot taken
        try:
            problem = assert_problem(client.post("/v1/plans", json=plan), 503)
            assert "all 1 planning slots are busy (waited 0 s" in problem["detail"]
        finally:
            portal.call(state.planning_slots.release)


def test_capacity_requests_have_fewer_slots_of_their_own(tmp_path: Path) -> None:
    """A review's case: ten whole-catalog capacity requests at once on a 2-core machine took eight
    planning slots, shared one interpreter lock, and all ten were 503s (8 after 48 s of computing
    thrown away). Capacity has its own, fewer slots: the next one is told at once, and a plan still
    finds a planning slot while they are held."""
    url = f"sqlite:///{tmp_path / 'capacity.db'}"
    command.upgrade(alembic_config(url), "head")
    settings = Settings(database_url=url, max_concurrent_capacity=1, planning_queue_wait_s=0.1)
    plan = {"model": {"preset": "gpt2"}, "cluster": ESTIMATE["cluster"], "training": ESTIMATE["training"]}
    capacity = {"model": {"preset": "gpt2"}, "training": {"seq_len": 128, "global_batch_size": 1}}
    with TestClient(create_app(settings)) as client:
        state = client.app.state  # type: ignore[attr-defined]
        portal = client.portal
        assert portal is not None
        portal.call(state.capacity_slots.acquire_nowait)  # one capacity request computing
        try:
            started = time.perf_counter()
            problem = assert_problem(client.post("/v1/capacity", json=capacity), 503)
            assert "all 1 capacity slots are busy" in problem["detail"]
            assert time.perf_counter() - started < 2
            assert client.post("/v1/plans", json=plan).status_code == 201
        finally:
            portal.call(state.capacity_slots.release)
        assert client.post("/v1/capacity", json=capacity).status_code == 200


def test_the_default_planning_slots_all_finish_inside_the_busy_ceiling() -> None:
    """Plans at once share one interpreter lock: n of them take about n x request_budget_s of wall
    time, and each stops as busy (a 503, its work thrown away) past BUSY_WALL_FACTOR x its budget.
    Eight slots at 1.5 s each outran the 9 s ceiling (five of eight 503 on 2 cores, concurrency
    review); the defaults admit only what finishes with a third to spare for the rest."""
    from service.recommender.budget import BUSY_WALL_FACTOR

    defaults = Settings(database_url="sqlite://")
    admitted_wall_s = defaults.max_concurrent_planning * defaults.request_budget_s
    assert admitted_wall_s <= BUSY_WALL_FACTOR * defaults.request_budget_s * 2 / 3


def test_a_retry_of_a_stored_plan_takes_no_planning_slot(tmp_path: Path) -> None:
    """A retry whose plan is stored only reads it back: it waited behind searches for a slot and was
    a 503 while they held them (concurrency review)."""
    url = f"sqlite:///{tmp_path / 'replay.db'}"
    command.upgrade(alembic_config(url), "head")
    settings = Settings(database_url=url, max_concurrent_planning=1, planning_queue_wait_s=0.05)
    plan = {"model": {"preset": "gpt2"}, "cluster": ESTIMATE["cluster"], "training": ESTIMATE["training"]}
    headers = {"Idempotency-Key": "retry-me"}
    with TestClient(create_app(settings)) as client:
        first = client.post("/v1/plans", json=plan, headers=headers)
        assert first.status_code == 201
        state, portal = client.app.state, client.portal  # type: ignore[attr-defined]
        assert portal is not None
        portal.call(state.planning_slots.acquire_nowait)  # a search holds the one slot
        try:
            again = client.post("/v1/plans", json=plan, headers=headers)
            assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
            assert again.json()["id"] == first.json()["id"]
            assert_problem(client.post("/v1/plans", json=plan), 503)  # a new plan still waits for one
        finally:
            portal.call(state.planning_slots.release)


def test_a_plan_whose_twin_is_computing_waits_for_it_and_replays_it(tmp_path: Path) -> None:
    """Four plans at once with one Idempotency-Key each ran the whole search, and three were thrown
    away (concurrency review): the others wait for the first's answer and replay it; past the queue
    wait, a 409 says it is still being computed."""
    import anyio

    url = f"sqlite:///{tmp_path / 'twins.db'}"
    command.upgrade(alembic_config(url), "head")
    settings = Settings(database_url=url, planning_queue_wait_s=0.2)
    plan = {"model": {"preset": "gpt2"}, "cluster": ESTIMATE["cluster"], "training": ESTIMATE["training"]}
    headers = {"Idempotency-Key": "twin"}
    with TestClient(create_app(settings)) as client:
        state, portal = client.app.state, client.portal  # type: ignore[attr-defined]
        assert portal is not None
        running = portal.call(anyio.Event)
        state.plans_in_flight[("local", "twin")] = running  # the first is searching
        started = time.perf_counter()
        problem = assert_problem(client.post("/v1/plans", json=plan, headers=headers), 409)
        assert time.perf_counter() - started < 2
        assert [e["field"] for e in problem["errors"]] == ["header.Idempotency-Key"]
        del state.plans_in_flight[("local", "twin")]
        portal.call(running.set)
        first = client.post("/v1/plans", json=plan, headers=headers)
        assert first.status_code == 201 and not state.plans_in_flight  # registered while it ran
        again = client.post("/v1/plans", json=plan, headers=headers)
        assert again.headers["idempotent-replayed"] == "true" and again.json()["id"] == first.json()["id"]


def test_concurrent_plans_with_one_key_search_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three requests with one Idempotency-Key at once: one search, three answers of the one plan."""
    import threading

    import service.planning.plans as plans_module

    searches = []
    real = plans_module.recommend

    def slow_recommend(*args: object, **kwargs: object) -> object:
        searches.append(1)
        time.sleep(0.5)  # the twins arrive while it searches
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(plans_module, "recommend", slow_recommend)
    url = f"sqlite:///{tmp_path / 'once.db'}"
    command.upgrade(alembic_config(url), "head")
    settings = Settings(database_url=url, planning_queue_wait_s=10)
    plan = {"model": {"preset": "gpt2"}, "cluster": ESTIMATE["cluster"], "training": ESTIMATE["training"]}
    with TestClient(create_app(settings)) as client:
        answers: list[tuple[int, str]] = []

        def post() -> None:
            response = client.post("/v1/plans", json=plan, headers={"Idempotency-Key": "once"})
            answers.append((response.status_code, response.json()["id"]))

        threads = [threading.Thread(target=post) for _ in range(3)]
        for thread in threads:
            thread.start()
            time.sleep(0.05)
        for thread in threads:
            thread.join()
    assert len(searches) == 1
    assert (
        len(answers) == 3 and {status for status, _ in answers} == {201} and len({i for _, i in answers}) == 1
    )


def test_where_keys_are_required_one_owner_holds_at_most_half_the_slots(tmp_path: Path) -> None:
    """Four capacity requests of one team held both capacity slots and another team's 0.7 s request
    was a 503 (a multi-tenant review): where keys make owners, an owner holds at most half of a
    pool (rounded up); its next request waits for its own share, and another owner's finds a slot."""
    import anyio
    from sqlalchemy.orm import Session

    from service.api.deps import owner_share
    from service.persistence.db import make_engine
    from service.planning.api_keys import create_key

    assert [owner_share(n) for n in (1, 2, 3, 4)] == [1, 1, 2, 2]
    url = f"sqlite:///{tmp_path / 'owners.db'}"
    command.upgrade(alembic_config(url), "head")
    engine = make_engine(url)
    keys = {}
    with Session(engine) as session:
        for owner in ("alice", "bob"):
            _, secret = create_key(session, owner=owner, name=owner, scopes=["read", "write"])
            keys[owner] = {"Authorization": f"Bearer {secret}"}
        session.commit()
    engine.dispose()
    settings = Settings(
        database_url=url, require_auth=True, max_concurrent_capacity=2, planning_queue_wait_s=0.1
    )
    capacity = {
        "model": {"preset": "gpt2"},
        "training": {"seq_len": 128, "global_batch_size": 1},
        "gpus": ["h100-sxm-80gb"],
    }
    with TestClient(create_app(settings)) as client:
        state, portal = client.app.state, client.portal  # type: ignore[attr-defined]
        assert portal is not None

        def alice_computes() -> None:  # one of alice's capacity requests holds her share and a slot
            share = state.owner_slots.setdefault(("capacity", "alice"), anyio.Semaphore(owner_share(2)))
            share.acquire_nowait()
            state.capacity_slots.acquire_nowait()

        def alice_answers() -> None:
            state.owner_slots[("capacity", "alice")].release()
            state.capacity_slots.release()

        portal.call(alice_computes)
        try:
            problem = assert_problem(client.post("/v1/capacity", json=capacity, headers=keys["alice"]), 503)
            assert "holds its 1 of the 2 capacity slots" in problem["detail"], problem
            assert client.post("/v1/capacity", json=capacity, headers=keys["bob"]).status_code == 200
        finally:
            portal.call(alice_answers)
        assert client.post("/v1/capacity", json=capacity, headers=keys["alice"]).status_code == 200


def test_a_cancelled_wait_for_a_slot_leaves_the_owners_share_free() -> None:
    """The owner's share is taken before the pool's slot: a wait the server cancels (a client gone)
    between the two kept the share taken for good, and every later request of that owner was a 503
    (a review of this stop's commits)."""
    import types

    import anyio

    from service.api import deps

    settings = Settings(database_url="sqlite://", require_auth=True, max_concurrent_capacity=2,
                        planning_queue_wait_s=5)  # fmt: skip
    state = types.SimpleNamespace(settings=settings, owner_slots={})
    request = types.SimpleNamespace(app=types.SimpleNamespace(state=state))

    async def main() -> int:
        pool = anyio.Semaphore(2)
        pool.acquire_nowait()
        pool.acquire_nowait()  # two of another owner's requests hold the pool
        with anyio.move_on_after(0.1):  # alice's request waits, and is cancelled
            async with deps._slot(request, pool, "capacity", 2, 8.0, "alice"):  # type: ignore[arg-type]
                pass
        pool.release()
        pool.release()
        share: anyio.Semaphore = state.owner_slots[("capacity", "alice")]
        return share.value

    assert anyio.run(main) == deps.owner_share(2)
