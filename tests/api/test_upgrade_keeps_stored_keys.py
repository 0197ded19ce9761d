"""What an earlier release stored keeps working after an upgrade: its runs calibrate, its keys replay.

The hardware key hashes every GPUSpec field; GPUSpec has gained fields since runs were stored (the
sustained clocks, the die and its flash kernels), so the same GPUs hashed to another key and their
runs stopped applying (an upgrade review: a database written on Dec 2 lost every calibration).
Calibration looks runs up under the current key and the keys those releases computed."""

from __future__ import annotations

import dataclasses
import hashlib
import json

from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.contracts.clusters import ClusterIn
from service.planning.calibration import hardware_key, hardware_keys
from tests.api.test_plans import create, plan_body


def _key_without(cluster_fields: dict[str, object], names: tuple[str, ...]) -> str:
    """The key a release whose GPUSpec had none of ``names`` computed (its snapshot had none of them)."""
    fields = json.loads(json.dumps(cluster_fields))
    for name in ("cpu_memory_bytes_per_node", "nvme_bytes_per_node"):
        fields[name] = 0
    for name in (
        "measured_intra_node_bus_bandwidth_bytes_per_s",
        "measured_inter_node_bus_bandwidth_bytes_per_s",
    ):
        if fields[name] is None:
            del fields[name]
    gpu = fields["gpu"]
    for name in (
        "defaulted",
        "notes",
        "node_network_bytes_per_s",
        "node_gpus",
        "peer_to_peer",
        "mesh_links",
        *names,
    ):
        del gpu[name]
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def test_runs_stored_under_an_earlier_releases_key_still_calibrate(
    client: TestClient, db_engine: Engine
) -> None:
    plan = create(client, plan_body())
    cluster = ClusterIn.model_validate(plan_body()["cluster"]).to_domain()
    snapshot = dataclasses.asdict(cluster)
    clocks = ("rated_power_w", "power_limit_w", "peak_clock_hz", "sustained_clock_hz")
    before_clocks = _key_without(snapshot, clocks)
    before_chip = _key_without(snapshot, (*clocks, "chip", "flash_attention"))
    assert hardware_keys(cluster) == (hardware_key(cluster), before_clocks, before_chip)
    estimate_request = {
        "model": plan_body()["model"],
        "cluster": plan_body()["cluster"],
        "training": plan_body()["training"],
        "layout": plan["recommended"]["layout"],
    }
    step_s = plan["recommended"]["estimate"]["time"]["step_s"]
    run = client.post(f"/v1/plans/{plan['id']}/runs", json={"step_s": step_s * 1.25})
    assert run.status_code == 201, run.text
    for old_key in (before_clocks, before_chip):  # as a Dec 2 release, then an older one, stored them
        with db_engine.begin() as conn:
            conn.execute(
                text("UPDATE plans SET hardware_key = :k WHERE id = :id"), {"k": old_key, "id": plan["id"]}
            )
            conn.execute(
                text("UPDATE runs SET hardware_key = :k WHERE plan_id = :id"),
                {"k": old_key, "id": plan["id"]},
            )
        after = client.post("/v1/estimates", json=estimate_request).json()
        assert after["calibration"] is not None and after["calibration"]["runs"] == 1, old_key
        assert abs(after["calibration"]["factors"]["step_time"] - 1.25) < 1e-9


def test_a_retry_of_a_key_an_earlier_release_stored_replays(client: TestClient, db_engine: Engine) -> None:
    """An upgrade review: every retry of an Idempotency-Key stored before the upgrade was refused as
    'used with another request body': the digest hashed every field with its default, and fields had
    been added since. A key is now stored with the body as sent; one stored the earlier way (every
    field) still replays."""
    from service.contracts.plans import PlanRequest
    from service.planning.idempotency import request_digests

    body = plan_body()
    first = create(client, body, key="retry-across-upgrade")
    *_, every_field = request_digests(PlanRequest.model_validate(body))
    with db_engine.begin() as conn:  # as the earlier release stored it
        conn.execute(
            text("UPDATE idempotency_keys SET request_sha256 = :d WHERE key = :k"),
            {"d": every_field, "k": "retry-across-upgrade"},
        )
    retry = client.post("/v1/plans", json=body, headers={"Idempotency-Key": "retry-across-upgrade"})
    assert retry.status_code == 201 and retry.headers["idempotent-replayed"] == "true"
    assert retry.json()["id"] == first["id"]
    other = client.post("/v1/plans", json=plan_body(training={"seq_len": 512, "global_batch_size": 64}),
                        headers={"Idempotency-Key": "retry-across-upgrade"})  # fmt: skip
    assert other.status_code == 422


def test_a_memory_miss_stored_before_version_3_reads_back_the_card(
    client: TestClient, db_engine: Engine
) -> None:
    """An upgrade review: a rejected memory miss stored by an earlier release (result version < 3,
    its limit stored as capacity_bytes) read back with capacity_bytes null: the card's capacity is the
    plan's cluster snapshot's, as a plan stored now says it."""
    body = plan_body(model={"preset": "llama-2-13b"})
    plan = create(client, body)
    misses = [r for r in plan["rejected"] if r.get("allowed_bytes") is not None]
    assert misses
    with db_engine.begin() as conn:
        (result,) = conn.execute(text("SELECT result FROM plans WHERE id = :id"), {"id": plan["id"]}).one()
        result = json.loads(result) if isinstance(result, str) else result
        result["version"] = 2
        for rejected in result["rejected"]:  # as versions 0-2 stored a memory miss
            if rejected.get("allowed_bytes") is not None:
                rejected["capacity_bytes"] = rejected.pop("allowed_bytes")
        conn.execute(
            text("UPDATE plans SET result = :r WHERE id = :id"), {"r": json.dumps(result), "id": plan["id"]}
        )
    stored = client.get(f"/v1/plans/{plan['id']}").json()
    read = [r for r in stored["rejected"] if r.get("allowed_bytes") is not None]
    assert [r["allowed_bytes"] for r in read] == [r["allowed_bytes"] for r in misses]
    assert {r["capacity_bytes"] for r in read} == {plan["cluster"]["gpu"]["memory_bytes"]}
