"""Races between writers, forced deterministically: a second writer commits between a request's read
and its write. The request answers 409 (read again and retry), never 500, and the stored rows stay
valid; on SQLite and on PostgreSQL. A cluster's writes read the row for write (locked: no other writer
can come between), so there the other writer lands just before that read, and two writes queue."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

import service.planning.clusters as clusters_planning
import service.planning.plans as plans_planning
from service.persistence.repository import ClusterRepository, PlanRepository
from tests.api.helpers import assert_problem

ONE_NODE = {"name": "race", "gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}


def interleave(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, meanwhile: Callable[[], None]
) -> None:
    """Run ``meanwhile`` (another writer, committed) right before ``module.name`` runs, once."""
    original = getattr(module, name)
    done = False

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        nonlocal done
        if not done:
            done = True
            meanwhile()
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)


def other_writer(engine: Engine, sql: str, **params: Any) -> Callable[[], None]:
    def run() -> None:
        with engine.begin() as conn:
            conn.execute(text(sql), params)

    return run


def test_patch_after_a_racing_delete_is_a_404(
    client: TestClient, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = client.post("/v1/clusters", json=ONE_NODE).json()
    delete = other_writer(db_engine, "DELETE FROM clusters WHERE id = :id", id=cluster["id"])
    interleave(monkeypatch, ClusterRepository, "get_for_write", delete)
    assert_problem(client.patch(f"/v1/clusters/{cluster['id']}", json={"num_nodes": 2,
                   "inter_node_bandwidth_bytes_per_s": 5e10}), 404)  # fmt: skip
    assert client.get(f"/v1/clusters/{cluster['id']}").status_code == 404


def test_a_patch_applies_to_the_row_another_patch_left(
    client: TestClient, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2 nodes with a network; another writer drops the network (valid on 1 node) just before this PATCH
    # grows to 4 nodes: the PATCH merges with the row as that writer left it and validates the whole
    body = {**ONE_NODE, "num_nodes": 2, "inter_node_bandwidth_bytes_per_s": 5e10}
    cluster = client.post("/v1/clusters", json=body).json()
    drop_network = other_writer(
        db_engine,
        "UPDATE clusters SET num_nodes = 1, inter_node_bandwidth_bytes_per_s = NULL, version = version + 1 "
        "WHERE id = :id",
        id=cluster["id"],
    )
    interleave(monkeypatch, ClusterRepository, "get_for_write", drop_network)
    patched = client.patch(f"/v1/clusters/{cluster['id']}", json={"num_nodes": 4})
    assert patched.status_code == 200, patched.text
    stored = client.get(f"/v1/clusters/{cluster['id']}").json()
    assert stored["num_nodes"] == 4 and stored["version"] == 3
    # the network it dropped is left out again: the GPU's reference node's, said as defaulted
    assert "inter_node_bandwidth_bytes_per_s" in stored["defaulted"]


def test_writes_without_a_version_queue_instead_of_failing(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's case: 12 PATCHes without If-Match or version at once; 7 of 12 (SQLite) and 10 of 12
    (PostgreSQL) got 409 "the row changed", where a write that names no version checks nothing. The
    first holds the row (its save slowed here) while the second waits to read it: both land."""
    cluster = client.post("/v1/clusters", json=ONE_NODE).json()
    original = clusters_planning._save
    first_holds = threading.Event()

    def slow_save(*args: Any, **kwargs: Any) -> Any:
        if not first_holds.is_set():
            first_holds.set()
            time.sleep(0.3)
        return original(*args, **kwargs)

    monkeypatch.setattr(clusters_planning, "_save", slow_save)
    url = f"/v1/clusters/{cluster['id']}"
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(client.patch, url, json={"description": "first"})
        first_holds.wait(5)
        second = pool.submit(client.patch, url, json={"gpus_per_node": 4})
        answers = [first.result(), second.result()]
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    stored = client.get(url).json()
    assert (stored["description"], stored["gpus_per_node"], stored["version"]) == ("first", 4, 3)


def test_a_write_with_if_match_that_loses_a_race_is_a_412(
    client: TestClient, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's case: ten PATCHes with one If-Match at once; the losers got 409 or 412 by timing.
    One that passed the If-Match check and then lost the row to another writer failed its precondition
    too: 412, as the check answers once the other write has landed."""
    cluster = client.post("/v1/clusters", json=ONE_NODE).json()
    other = other_writer(
        db_engine,
        "UPDATE clusters SET description = 'other', version = version + 1 WHERE id = :id",
        id=cluster["id"],
    )
    interleave(monkeypatch, ClusterRepository, "get_for_write", other)
    response = client.patch(
        f"/v1/clusters/{cluster['id']}", json={"description": "mine"}, headers={"If-Match": '"1"'}
    )
    assert_problem(response, 412)
    assert client.get(f"/v1/clusters/{cluster['id']}").json()["description"] == "other"


def test_a_plan_on_a_cluster_deleted_meanwhile_is_a_404_naming_the_cluster(
    client: TestClient, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = client.post("/v1/clusters", json=ONE_NODE).json()
    delete = other_writer(db_engine, "DELETE FROM clusters WHERE id = :id", id=cluster["id"])
    interleave(monkeypatch, plans_planning, "render_artifacts", delete)  # after the cluster was read
    body = {"model": {"preset": "gpt2"}, "cluster": {"id": cluster["id"]},
            "training": {"seq_len": 128, "global_batch_size": 8}}  # fmt: skip
    # what a retry is told, said at once (a 409 naming no field sent the retry to learn it: concurrency
    # review); nothing stored
    problem = assert_problem(client.post("/v1/plans", json=body), 404)
    assert "deleted while this plan was computed" in problem["detail"]
    assert [(e["field"], e["type"]) for e in problem["errors"]] == [("cluster.id", "unknown_cluster")]
    assert client.get("/v1/plans").json()["items"] == []


SMALL_PLAN = {
    "model": {"preset": "gpt2"},
    "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 1},
    "training": {"seq_len": 128, "global_batch_size": 8},
}


def test_of_two_racing_deletes_of_a_plan_one_is_the_204_the_other_a_404(
    client: TestClient, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other delete commits after this one read the plan: this one deleted nothing, and says so
    (both answered 204: the ORM's delete of a row already gone only warned)."""
    plan = client.post("/v1/plans", json=SMALL_PLAN).json()
    delete = other_writer(db_engine, "DELETE FROM plans WHERE id = :id", id=plan["id"])
    interleave(monkeypatch, PlanRepository, "delete", delete)  # after the plan was read
    assert_problem(client.delete(f"/v1/plans/{plan['id']}"), 404)
    assert client.delete(f"/v1/plans/{plan['id']}").status_code == 404


def test_a_run_posted_while_its_plan_is_deleted_is_a_404(
    client: TestClient, db_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan is deleted after the run's request read it: the run is not stored, and the answer is
    the 404 a retry gets (it was a 409, "a concurrent change", whose retry is then a 404)."""
    plan = client.post("/v1/plans", json=SMALL_PLAN).json()
    delete = other_writer(db_engine, "DELETE FROM plans WHERE id = :id", id=plan["id"])
    interleave(monkeypatch, PlanRepository, "add_run", delete)
    problem = assert_problem(client.post(f"/v1/plans/{plan['id']}/runs", json={"step_s": 1.0}), 404)
    assert "deleted while this run was stored" in problem["detail"]
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 0


def test_a_name_taken_between_the_check_and_the_write_is_a_409_naming_it(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unique index catches what the check missed (a concurrent create took the name after it):
    the 409 names the field, as the check's does (it named none: concurrency review)."""
    assert client.post("/v1/clusters", json=ONE_NODE).status_code == 201
    monkeypatch.setattr(clusters_planning, "_check_name_free", lambda *args: None)  # passed, then taken
    problem = assert_problem(client.post("/v1/clusters", json=ONE_NODE), 409)
    assert "already exists" in problem["detail"]
    assert [e["field"] for e in problem["errors"]] == ["name"]
    assert len(client.get("/v1/clusters").json()["items"]) == 1


def test_a_plan_stored_between_the_count_and_the_delete_is_the_409_naming_cluster_id(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite the cluster row is not locked: a plan stored after the delete counted none made the
    foreign key refuse the delete, a 409 naming nothing (change review)."""
    cluster = client.post("/v1/clusters", json=ONE_NODE).json()
    body = {"model": {"preset": "gpt2"}, "cluster": {"id": cluster["id"]},
            "training": {"seq_len": 128, "global_batch_size": 8}}  # fmt: skip
    assert client.post("/v1/plans", json=body).status_code == 201
    monkeypatch.setattr(ClusterRepository, "plan_count", lambda self, cluster_id: 0)  # counted before it
    problem = assert_problem(client.delete(f"/v1/clusters/{cluster['id']}"), 409)
    assert [e["field"] for e in problem["errors"]] == ["cluster_id"] and "referenced" in problem["detail"]
    assert client.get(f"/v1/clusters/{cluster['id']}").status_code == 200
