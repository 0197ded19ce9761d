"""Cluster inventory end to end, on a database built by the migrations."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.api.helpers import assert_problem
from tests.loopback import served

H100_NODE: dict[str, Any] = {
    "name": "h100-pod",
    "gpu": "h100-sxm-80gb",
    "num_nodes": 4,
    "gpus_per_node": 8,
    "inter_node_bandwidth_bytes_per_s": 50e9,
    "cpu_memory_bytes_per_node": 2 * 1024**4,
}

CUSTOM_GPU: dict[str, Any] = {
    "name": "lab-card-48gb",
    "memory_bytes": 48 * 1024**3,
    "peak_flops_per_s": {"fp32": 40e12, "bf16": 180e12},
    "hbm_bandwidth_bytes_per_s": 1.0e12,
    "intra_node_bandwidth_bytes_per_s": 32e9,
    "pcie_bandwidth_bytes_per_s": 32e9,
}


def create(client: TestClient, **overrides: Any) -> dict[str, Any]:
    response = client.post("/v1/clusters", json=H100_NODE | overrides)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def test_create_fetch_and_defaults(client: TestClient) -> None:
    response = client.post("/v1/clusters", json=H100_NODE)
    assert response.status_code == 201
    body = response.json()
    assert response.headers["location"] == f"/v1/clusters/{body['id']}"
    assert body["world_size"] == 32
    # The intra-node bandwidth defaults from the catalog entry of the GPU.
    gpu = client.get("/v1/gpus/h100-sxm-80gb").json()
    assert body["intra_node_bandwidth_bytes_per_s"] == gpu["intra_node_bandwidth_bytes_per_s"]
    assert body["gpu_memory_bytes"] == gpu["memory_bytes"]
    fetched = client.get(f"/v1/clusters/{body['id']}")
    assert fetched.status_code == 200
    assert fetched.json() == body


def test_gbps_inputs_are_converted_to_bytes_per_s(client: TestClient) -> None:
    body = {k: v for k, v in H100_NODE.items() if k != "inter_node_bandwidth_bytes_per_s"}
    response = client.post("/v1/clusters", json=body | {"inter_node_bandwidth_gbps": 25})
    assert response.status_code == 201, response.text
    assert response.json()["inter_node_bandwidth_bytes_per_s"] == 25e9
    both = body | {"inter_node_bandwidth_gbps": 25, "inter_node_bandwidth_bytes_per_s": 25e9, "name": "b"}
    assert_problem(client.post("/v1/clusters", json=both), 422)


def test_custom_gpu_round_trips(client: TestClient) -> None:
    created = create(client, name="lab", gpu=CUSTOM_GPU, num_nodes=1, inter_node_bandwidth_bytes_per_s=None)
    assert created["gpu"] == CUSTOM_GPU | {
        "chip": None,  # not stated: the lowest peak fraction fitted on a die
        "flash_attention": None,  # not stated: its bf16 peak says it has the kernels (CustomGPU)
        "peer_to_peer": True,  # not stated: its GPUs reach each other's memory
        "mesh_links": None,  # not stated: a switch between its GPUs
        "vendor": None,  # not stated: its die's maker, or NVIDIA's
        "peak_flops_per_s": {"fp32": 40e12, "bf16": 180e12, "tf32": None, "fp16": None, "fp8": None},
        # not stated: the part runs as its peaks are quoted (no power limit, no sustained clock)
        "rated_power_w": None,
        "power_limit_w": None,
        "peak_clock_hz": None,
        "sustained_clock_hz": None,
    }
    assert created["gpu_memory_bytes"] == 48 * 1024**3
    # One node: nothing crosses a network, inter-node defaults to intra-node.
    assert created["inter_node_bandwidth_bytes_per_s"] == 32e9


def test_incomplete_custom_gpu_names_the_missing_field(client: TestClient) -> None:
    gpu = {k: v for k, v in CUSTOM_GPU.items() if k != "hbm_bandwidth_bytes_per_s"}
    response = client.post("/v1/clusters", json=H100_NODE | {"gpu": gpu})
    problem = assert_problem(response, 422)
    assert any(e["field"].endswith("hbm_bandwidth_bytes_per_s") for e in problem["errors"])


def test_unknown_gpu_is_422_naming_the_field_and_the_catalog(client: TestClient) -> None:
    response = client.post("/v1/clusters", json=H100_NODE | {"gpu": "h100"})
    problem = assert_problem(response, 422)
    assert problem["errors"][0]["field"] == "gpu"
    assert "h100-sxm-80gb" in problem["errors"][0]["known"]


def test_zero_nodes_and_negative_bandwidth_name_field_and_limit(client: TestClient) -> None:
    problem = assert_problem(client.post("/v1/clusters", json=H100_NODE | {"num_nodes": 0}), 422)
    assert problem["errors"][0]["field"] == "num_nodes"
    assert problem["errors"][0]["limit"] == {"ge": 1}
    response = client.post("/v1/clusters", json=H100_NODE | {"inter_node_bandwidth_bytes_per_s": -1})
    problem = assert_problem(response, 422)
    assert problem["errors"][0]["field"] == "inter_node_bandwidth_bytes_per_s"
    assert problem["errors"][0]["limit"] == {"ge": 1e6}


def test_multi_node_requires_inter_node_bandwidth_where_no_reference_node_has_one(client: TestClient) -> None:
    body = {k: v for k, v in H100_NODE.items() if k != "inter_node_bandwidth_bytes_per_s"}
    pcie = assert_problem(client.post("/v1/clusters", json=body | {"gpu": "h100-pcie-80gb"}), 422)
    assert pcie["errors"][0]["field"] == "inter_node_bandwidth_bytes_per_s"
    # an SXM part ships in a DGX H100 node: 8 x 400 Gb/s for 8 GPUs, 50 GB/s each (gpus.toml)
    sxm = client.post("/v1/clusters", json=body)
    assert sxm.status_code == 201, sxm.text
    assert sxm.json()["inter_node_bandwidth_bytes_per_s"] == 50e9
    assert "inter_node_bandwidth_bytes_per_s" in sxm.json()["defaulted"]


def test_unknown_field_is_rejected_by_name(client: TestClient) -> None:
    problem = assert_problem(client.post("/v1/clusters", json=H100_NODE | {"gpu_count": 8}), 422)
    assert problem["errors"][0]["field"] == "gpu_count"
    assert problem["errors"][0]["type"] == "extra_forbidden"


def test_malformed_json_is_400(client: TestClient) -> None:
    response = client.post(
        "/v1/clusters", content=b'{"name": "x", "num_nodes": ', headers={"content-type": "application/json"}
    )
    problem = assert_problem(response, 400)
    assert problem["errors"][0]["field"] == "body" and "at character 27" in problem["errors"][0]["message"]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"name": "\xff\xfe", "gpu": "h100-sxm-80gb"}', "not UTF-8 (byte 0xff at byte 10)"),
        (b'{"num_nodes": ' + b"9" * 5000 + b"}", "more digits than Python reads"),
        (b"[" * 5000 + b"]" * 5000, "nest too deep"),
    ],
)
def test_a_body_json_cannot_read_is_malformed_json_naming_why(
    client: TestClient, content: bytes, reason: str
) -> None:
    """A review's bodies got a bare 400 "http-error" ("There was an error parsing the body") without
    the errors list any other malformed body carries."""
    response = client.post("/v1/clusters", content=content, headers={"content-type": "application/json"})
    problem = assert_problem(response, 400)
    assert problem["type"].endswith("/malformed-json") and reason in problem["detail"]
    assert problem["errors"][0]["field"] == "body"


def test_huge_body_is_413_and_nothing_is_stored(client: TestClient) -> None:
    big = H100_NODE | {"description": "x" * 300_000}
    problem = assert_problem(client.post("/v1/clusters", json=big), 413)
    assert problem["errors"][0]["limit"]["max_bytes"] == 256 * 1024
    assert problem["instance"] == "/v1/clusters"  # as every other problem (a review: 413 and 415 had none)
    assert client.get("/v1/clusters").json()["items"] == []


def test_a_huge_chunked_body_is_413_too(client: TestClient) -> None:
    """Without a Content-Length (curl -T -, a streamed upload) the limit was found inside FastAPI's
    body reader, which answered 400 "There was an error parsing the body"."""
    body = json.dumps(H100_NODE | {"description": "x" * 300_000}).encode()

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 65536):
            yield body[start : start + 65536]

    response = client.post("/v1/clusters", content=chunks(), headers={"content-type": "application/json"})
    problem = assert_problem(response, 413)
    assert problem["errors"][0]["limit"]["max_bytes"] == 256 * 1024
    assert client.get("/v1/clusters").json()["items"] == []
    small = json.dumps(H100_NODE).encode()
    stored = client.post(
        "/v1/clusters", content=iter([small[:10], small[10:]]), headers={"content-type": "application/json"}
    )
    assert stored.status_code == 201, stored.text


def test_duplicate_name_is_409(client: TestClient) -> None:
    first = create(client)
    problem = assert_problem(client.post("/v1/clusters", json=H100_NODE), 409)
    assert problem["errors"][0]["existing_id"] == first["id"]


def test_put_replaces_and_patch_merges(client: TestClient) -> None:
    created = create(client)
    replaced = client.put(
        f"/v1/clusters/{created['id']}", json=H100_NODE | {"gpu": "a100-sxm-80gb", "num_nodes": 2}
    )
    assert replaced.status_code == 200, replaced.text
    body = replaced.json()
    assert body["gpu"] == "a100-sxm-80gb" and body["num_nodes"] == 2
    assert body["created_at"] == created["created_at"]
    assert body["updated_at"] >= created["updated_at"]
    a100 = client.get("/v1/gpus/a100-sxm-80gb").json()
    assert body["intra_node_bandwidth_bytes_per_s"] == a100["intra_node_bandwidth_bytes_per_s"]

    patched = client.patch(f"/v1/clusters/{created['id']}", json={"num_nodes": 1, "description": "one box"})
    assert patched.status_code == 200, patched.text
    assert patched.json()["num_nodes"] == 1
    assert patched.json()["description"] == "one box"
    assert patched.json()["gpu"] == "a100-sxm-80gb"


def test_patch_with_invalid_merge_changes_nothing(client: TestClient) -> None:
    created = create(client)
    assert_problem(client.patch(f"/v1/clusters/{created['id']}", json={"gpu": "no-such-gpu"}), 422)
    assert_problem(client.patch(f"/v1/clusters/{created['id']}", json={"num_nodes": -3}), 422)
    assert client.get(f"/v1/clusters/{created['id']}").json() == created


def test_rename_onto_existing_name_is_409(client: TestClient) -> None:
    create(client)
    other = create(client, name="other")
    assert_problem(client.patch(f"/v1/clusters/{other['id']}", json={"name": "h100-pod"}), 409)


def test_missing_cluster_is_404_for_every_method(client: TestClient) -> None:
    for method in ("GET", "PUT", "PATCH", "DELETE"):
        kwargs: dict[str, Any] = {"json": H100_NODE} if method == "PUT" else {}
        if method == "PATCH":
            kwargs = {"json": {"num_nodes": 2}}
        response = client.request(method, "/v1/clusters/01JZZZZZZZZZZZZZZZZZZZZZZZ", **kwargs)
        assert_problem(response, 404)


def test_delete_then_gone(client: TestClient) -> None:
    created = create(client)
    assert client.delete(f"/v1/clusters/{created['id']}").status_code == 204
    assert_problem(client.get(f"/v1/clusters/{created['id']}"), 404)


def test_cursor_pagination_visits_every_cluster_once(client: TestClient) -> None:
    ids = [create(client, name=f"c{i}")["id"] for i in range(7)]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = client.get("/v1/clusters", params=params).json()
        seen += [item["id"] for item in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids)
    assert pages == 3


def test_bad_cursor_and_limit_are_422(client: TestClient) -> None:
    problem = assert_problem(client.get("/v1/clusters", params={"cursor": "not-a-cursor"}), 422)
    assert problem["errors"][0]["field"] == "query.cursor"
    problem = assert_problem(client.get("/v1/clusters", params={"limit": 501}), 422)
    assert problem["errors"][0]["field"] == "query.limit"
    assert problem["errors"][0]["limit"] == {"le": 500}


def test_defaults_follow_the_cluster_and_growing_past_one_node_takes_the_reference_network(
    client: TestClient,
) -> None:
    one = create(client, name="one", num_nodes=1, inter_node_bandwidth_bytes_per_s=None)
    assert set(one["defaulted"]) == {"intra_node_bandwidth_bytes_per_s", "inter_node_bandwidth_bytes_per_s"}
    assert one["inter_node_bandwidth_bytes_per_s"] == one["intra_node_bandwidth_bytes_per_s"]
    # One node: the network figure is the NVLink one by default; it must not survive growing. Grown
    # without a network, the cluster has its part's reference node's (DGX H100: 50 GB/s per GPU).
    reference = client.patch(f"/v1/clusters/{one['id']}", json={"num_nodes": 4})
    assert reference.status_code == 200, reference.text
    assert reference.json()["inter_node_bandwidth_bytes_per_s"] == 50e9
    assert "inter_node_bandwidth_bytes_per_s" in reference.json()["defaulted"]
    grown = client.patch(f"/v1/clusters/{one['id']}", json={"num_nodes": 4, "inter_node_bandwidth_gbps": 25})
    assert grown.status_code == 200, grown.text
    assert grown.json()["inter_node_bandwidth_bytes_per_s"] == 25e9
    assert grown.json()["defaulted"] == ["intra_node_bandwidth_bytes_per_s"]
    # A defaulted intra-node figure follows a new GPU; null puts a given one back to its default.
    swapped = client.patch(f"/v1/clusters/{one['id']}", json={"gpu": "a100-sxm-80gb"}).json()
    a100 = client.get("/v1/gpus/a100-sxm-80gb").json()
    assert swapped["intra_node_bandwidth_bytes_per_s"] == a100["intra_node_bandwidth_bytes_per_s"]
    back = client.patch(f"/v1/clusters/{one['id']}", json={"inter_node_bandwidth_bytes_per_s": None})
    assert back.status_code == 200, back.text  # four DGX A100 nodes: 8 x 200 Gb/s for 8 GPUs
    assert back.json()["inter_node_bandwidth_bytes_per_s"] == 25e9
    pcie = client.patch(f"/v1/clusters/{one['id']}", json={"gpu": "a100-pcie-80gb"})
    assert_problem(pcie, 422)  # a PCIe card ships in no reference node: four nodes need a network figure


def test_explicit_null_is_refused_by_field(client: TestClient) -> None:
    created = create(client)
    for field in ("name", "num_nodes", "gpu", "description", "cpu_memory_bytes_per_node"):
        problem = assert_problem(client.patch(f"/v1/clusters/{created['id']}", json={field: None}), 422)
        assert problem["errors"][0]["field"] == field
    assert client.get(f"/v1/clusters/{created['id']}").json() == created


def test_non_ascii_cursor_is_422(client: TestClient) -> None:
    for path in ("/v1/clusters", "/v1/plans"):
        problem = assert_problem(client.get(path, params={"cursor": "é"}), 422)
        assert problem["errors"][0]["field"] == "query.cursor"


# ---------------------------------------------------------------- measured bus bandwidths

INTRA = "measured_intra_node_bus_bandwidth_bytes_per_s"
INTER = "measured_inter_node_bus_bandwidth_bytes_per_s"


def test_measured_bus_bandwidths_round_trip_and_null_removes_them(client: TestClient) -> None:
    created = create(
        client, measured_intra_node_bus_bandwidth_gbps=370, measured_inter_node_bus_bandwidth_gbps=44
    )
    assert (created[INTRA], created[INTER]) == (370e9, 44e9)
    assert INTRA not in created["defaulted"] and INTER not in created["defaulted"]
    assert client.get(f"/v1/clusters/{created['id']}").json() == created
    patched = client.patch(f"/v1/clusters/{created['id']}", json={INTRA: None, INTER: 40e9}).json()
    assert (patched[INTRA], patched[INTER]) == (None, 40e9)
    # the GB/s spelling takes null too (a review's case: it was a 422 "expected a number")
    gbps = client.patch(
        f"/v1/clusters/{created['id']}", json={"measured_inter_node_bus_bandwidth_gbps": None}
    )
    assert gbps.status_code == 200, gbps.text
    assert gbps.json()[INTER] is None
    # PUT sends the whole cluster: a measurement left out is gone
    replaced = client.put(f"/v1/clusters/{created['id']}", json=H100_NODE).json()
    assert (replaced[INTRA], replaced[INTER]) == (None, None)
    assert create(client, name="plain")[INTRA] is None


def test_a_measurement_over_what_its_link_allows_is_422_naming_the_field_and_both_numbers(
    client: TestClient,
) -> None:
    """Up to 2 x the link: in-network reduction (NVLS, SHARP) lifts an all-reduce's busbw above the
    link, never to twice it (every rank sends its S bytes and receives the S-byte result once)."""
    problem = assert_problem(client.post("/v1/clusters", json=H100_NODE | {INTRA: 901e9}), 422)
    assert problem["errors"][0]["field"] == INTRA
    assert "(901 GB/s) is above 2 x intra_node_bandwidth_bytes_per_s (450 GB/s)" in problem["detail"]
    # the usual slip: the all-GPU run across nodes, about gpus_per_node x each GPU's network
    problem = assert_problem(client.post("/v1/clusters", json=H100_NODE | {INTER: 380e9}), 422)
    assert problem["errors"][0]["field"] == INTER
    assert "(380 GB/s) is above 2 x inter_node_bandwidth_bytes_per_s (50 GB/s)" in problem["detail"]
    assert "divided by gpus_per_node" in problem["detail"]  # the field's recipe (network review)
    assert create(client, **{INTRA: 480e9})[INTRA] == 480e9  # NVLS on H100: above the link, allowed
    # lowering the link under a stored measurement is refused as a whole, and changes nothing
    stored = create(client, name="measured", **{INTER: 44e9})
    problem = assert_problem(
        client.patch(f"/v1/clusters/{stored['id']}", json={"inter_node_bandwidth_bytes_per_s": 20e9}), 422
    )
    assert problem["errors"][0]["field"] == INTER
    assert client.get(f"/v1/clusters/{stored['id']}").json() == stored


def test_an_inter_node_measurement_on_one_node_is_refused(client: TestClient) -> None:
    one_node = H100_NODE | {"num_nodes": 1}
    problem = assert_problem(client.post("/v1/clusters", json=one_node | {INTER: 44e9}), 422)
    assert problem["errors"][0]["field"] == INTER and problem["errors"][0]["type"] == "unused"
    # shrinking a measured cluster to one node needs the measurement removed too
    stored = create(client, **{INTER: 44e9})
    assert_problem(client.patch(f"/v1/clusters/{stored['id']}", json={"num_nodes": 1}), 422)
    shrunk = client.patch(f"/v1/clusters/{stored['id']}", json={"num_nodes": 1, INTER: None})
    assert shrunk.status_code == 200 and shrunk.json()[INTER] is None


def test_an_intra_node_measurement_on_one_gpu_nodes_is_refused(client: TestClient) -> None:
    # a node of one GPU has no link between GPUs for the measurement to describe
    one_gpu = H100_NODE | {"num_nodes": 2, "gpus_per_node": 1, "inter_node_bandwidth_bytes_per_s": 50e9}
    problem = assert_problem(client.post("/v1/clusters", json=one_gpu | {INTRA: 370e9}), 422)
    assert problem["errors"][0]["field"] == INTRA and problem["errors"][0]["type"] == "unused"
    assert client.post("/v1/clusters", json=one_gpu | {"name": "one-gpu-nodes"}).status_code == 201


def test_estimates_use_and_state_the_measurement_inline_or_stored(client: TestClient) -> None:
    body: dict[str, Any] = {
        "model": {"preset": "llama-3.1-8b"},
        "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 4096, "global_batch_size": 64},
        "layout": {"framework": "megatron", "tp": 8, "dp": 1},
    }
    plain = client.post("/v1/estimates", json=body).json()
    assert any(
        note.startswith("intra-node bus bandwidth: nominal 450 GB/s x 0.8") for note in plain["assumptions"]
    )
    body["cluster"] |= {"measured_intra_node_bus_bandwidth_gbps": 200}
    slow = client.post("/v1/estimates", json=body)
    assert slow.status_code == 200, slow.text
    assert (
        "intra-node bus bandwidth measured: 200 GB/s per GPU (nominal link 450 GB/s)"
        in slow.json()["assumptions"]
    )
    assert slow.json()["time"]["breakdown"]["tp_comm_s"] > plain["time"]["breakdown"]["tp_comm_s"]
    stored = create(client, name="measured", num_nodes=1, measured_intra_node_bus_bandwidth_gbps=200)
    by_id = client.post("/v1/estimates", json=body | {"cluster": {"id": stored["id"]}}).json()
    assert by_id["time"] == slow.json()["time"]
    # inline, the error names where the field sits in the request
    body["cluster"] |= {INTER: 44e9}
    problem = assert_problem(client.post("/v1/estimates", json=body), 422)
    assert problem["errors"][0]["field"] == f"cluster.{INTER}"
    # a PATCH's GB/s twin past the link is named as sent, as POST and PUT name it (operator review)
    twin = {"measured_intra_node_bus_bandwidth_gbps": 10_000}
    created = client.post(
        "/v1/clusters", json=twin | {"name": "fast", "gpu": "h100-sxm-80gb", "num_nodes": 1}
    )
    for response in (created, client.patch(f"/v1/clusters/{stored['id']}", json=twin)):
        problem = assert_problem(response, 422)
        (error,) = problem["errors"]
        assert error["field"] == "measured_intra_node_bus_bandwidth_gbps", problem
        assert "measured_intra_node_bus_bandwidth_gbps" in error["message"], problem


def test_chunked_bodies_over_a_real_server(tmp_path: Path) -> None:
    """The same over uvicorn, whose receive() a response calls again to hear a disconnect: the
    buffered body is handed on once, then the server's own receive (the page and its assets, a
    chunked cluster, a chunked body over the limit)."""
    with served(f"sqlite:///{tmp_path / 'served.db'}") as base:
        assert httpx.get(f"{base}/").status_code == 200
        small = json.dumps(H100_NODE).encode()
        headers = {"content-type": "application/json"}
        stored = httpx.post(f"{base}/v1/clusters", content=iter([small[:10], small[10:]]), headers=headers)
        assert stored.status_code == 201, stored.text
        big = json.dumps(H100_NODE | {"name": "big", "description": "x" * 3_000_000}).encode()
        chunks = iter([big[i : i + 65536] for i in range(0, len(big), 65536)])
        refused = httpx.post(f"{base}/v1/clusters", content=chunks, headers=headers)
        assert refused.status_code == 413, refused.text


def test_a_write_made_from_an_older_version_changes_nothing(client: TestClient) -> None:
    """api.md: clusters carry a version (409 on a stale write). Two clients read version 1; A's PATCH
    makes it 2; B's PUT of its stale copy put num_nodes back without a word. Sent back, the version
    (in the body: 409; as If-Match: 412) refuses such a write; left out, nothing is checked."""
    created = create(client)
    assert created["version"] == 1
    got = client.get(f"/v1/clusters/{created['id']}")
    assert got.headers["etag"] == '"1"' and got.json()["version"] == 1
    stale = {k: created[k] for k in ("name", "gpu", "num_nodes", "gpus_per_node")}
    a = client.patch(f"/v1/clusters/{created['id']}", json={"description": "A", "version": 1})
    assert a.status_code == 200, a.text
    assert a.json()["version"] == 2 and a.headers["etag"] == '"2"'
    b = client.put(f"/v1/clusters/{created['id']}", json=stale | {"description": "B", "version": 1})
    problem = assert_problem(b, 409)
    assert problem["errors"][0] == {"field": "version", "message": "stale", "current_version": 2}
    header = client.put(
        f"/v1/clusters/{created['id']}", json=stale | {"description": "B"}, headers={"If-Match": '"1"'}
    )
    assert assert_problem(header, 412)["errors"][0]["current_version"] == 2
    assert client.get(f"/v1/clusters/{created['id']}").json()["description"] == "A"  # A's change stands
    assert_problem(client.delete(f"/v1/clusters/{created['id']}", headers={"If-Match": '"1"'}), 412)
    # written from the current version (or "*", or without one), the change goes through
    # a weak tag never matches an If-Match (RFC 9110 13.1.1: strong comparison), the strong one does
    weak = client.put(
        f"/v1/clusters/{created['id']}", json=stale | {"description": "B"}, headers={"If-Match": 'W/"2"'}
    )
    assert_problem(weak, 412)
    fresh = client.put(
        f"/v1/clusters/{created['id']}", json=stale | {"description": "B"}, headers={"If-Match": '"2"'}
    )
    assert fresh.status_code == 200 and fresh.json()["version"] == 3
    assert client.patch(f"/v1/clusters/{created['id']}", json={"description": "C"}).json()["version"] == 4
    assert client.delete(f"/v1/clusters/{created['id']}", headers={"If-Match": "*"}).status_code == 204


def test_a_plan_shows_the_cluster_it_was_made_for_after_the_cluster_is_edited(client: TestClient) -> None:
    """A review's case: a plan made on a stored cluster of 2 x 8 H100 with 2 TiB of host RAM showed,
    after the cluster became 8 A100 nodes without host RAM, only {"id": ...}: a CPU-offload plan on a
    cluster with no host RAM. The snapshot it keeps is returned."""
    created = client.post(
        "/v1/clusters",
        json={"name": "pod-a", "gpu": "h100-sxm-80gb", "num_nodes": 2, "gpus_per_node": 8,
              "cpu_memory_bytes_per_node": 2 * 2**40},
    ).json()  # fmt: skip
    body = {
        "model": {"preset": "llama-3-8b"},
        "cluster": {"id": created["id"]},
        "training": {"seq_len": 4096, "global_batch_size": 64},
    }
    plan = client.post("/v1/plans", json=body)
    assert plan.status_code == 201, plan.text
    made = plan.json()["cluster"]
    assert made["gpu"]["name"] == "h100-sxm-80gb" and made["num_nodes"] == 2
    assert made["cpu_memory_bytes_per_node"] == 2 * 2**40
    edited = client.patch(f"/v1/clusters/{created['id']}", json={"num_nodes": 8, "gpu": "a100-sxm-80gb"})
    assert edited.status_code == 200, edited.text
    again = client.get(f"/v1/plans/{plan.json()['id']}").json()
    assert again["cluster"] == made


def test_a_custom_gpu_row_holds_no_later_field_at_its_default(client: TestClient, db_engine: Any) -> None:
    """An upgrade review rolled back (alembic downgrade, then the earlier release) after a
    description-only PATCH: the new code had written peer_to_peer into the custom GPU's row, which the
    earlier release's strict CustomGPU refused (500 on GET /v1/clusters). Left at its default it is not
    stored; stated false it is, and reads back."""
    from sqlalchemy import text

    default = create(client, name="lab", gpu=CUSTOM_GPU, num_nodes=1)
    client.patch(f"/v1/clusters/{default['id']}", json={"description": "renamed shelf"})
    unbridged = create(client, name="geforce", gpu=CUSTOM_GPU | {"peer_to_peer": False}, num_nodes=1)
    with db_engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT id, gpu_spec FROM clusters")).all())
    stored = {key: json.loads(value) if isinstance(value, str) else value for key, value in rows.items()}
    assert "peer_to_peer" not in stored[default["id"]]
    assert stored[unbridged["id"]]["peer_to_peer"] is False
    assert client.get(f"/v1/clusters/{unbridged['id']}").json()["gpu"]["peer_to_peer"] is False
    assert client.get(f"/v1/clusters/{default['id']}").json()["gpu"]["peer_to_peer"] is True


# CustomGPU's fields in the release before the first of those _LATER_CUSTOM_GPU_DEFAULTS names (9873b3a):
# a row a rolled-back release reads holds none other, or its strict model answers 500 (vendor, added
# after the guard, was written as null into every row: a data-lifecycle review)
EARLIER_CUSTOM_GPU_FIELDS = frozenset({
    "name", "chip", "memory_bytes", "peak_flops_per_s", "hbm_bandwidth_bytes_per_s",
    "intra_node_bandwidth_bytes_per_s", "pcie_bandwidth_bytes_per_s", "flash_attention", "rated_power_w",
    "power_limit_w", "peak_clock_hz", "sustained_clock_hz",
})  # fmt: skip


def test_a_custom_gpu_row_left_at_its_defaults_holds_only_fields_an_earlier_release_reads(
    client: TestClient, db_engine: Any
) -> None:
    from sqlalchemy import text

    created = create(client, name="lab", gpu=CUSTOM_GPU, num_nodes=1)
    with db_engine.connect() as conn:
        (value,) = conn.execute(
            text("SELECT gpu_spec FROM clusters WHERE id = :id"), {"id": created["id"]}
        ).one()
    stored = json.loads(value) if isinstance(value, str) else value
    assert set(stored) <= EARLIER_CUSTOM_GPU_FIELDS, sorted(set(stored) - EARLIER_CUSTOM_GPU_FIELDS)
    # and every field of today's reads back at its default
    assert client.get(f"/v1/clusters/{created['id']}").json()["gpu"]["vendor"] is None


def test_a_cluster_create_retried_with_its_key_replays(client: TestClient) -> None:
    """Two reviews: POST /v1/clusters ignored Idempotency-Key (api.md: writes a scheduler may retry
    accept one), so a retry was a 409 'name taken'. The same key and body replay the cluster, 201 with
    Idempotent-Replayed; another body under the key is a 422; without a key the name is still taken."""
    headers = {"Idempotency-Key": "rack-7"}
    first = client.post("/v1/clusters", json=H100_NODE | {"name": "rack-7"}, headers=headers)
    assert first.status_code == 201
    again = client.post("/v1/clusters", json=H100_NODE | {"name": "rack-7"}, headers=headers)
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] and again.headers["location"] == first.headers["location"]
    other = client.post("/v1/clusters", json=H100_NODE | {"name": "rack-8"}, headers=headers)
    assert assert_problem(other, 422)["errors"][0]["field"] == "header.Idempotency-Key"
    assert_problem(client.post("/v1/clusters", json=H100_NODE | {"name": "rack-7"}), 409)
    assert len(client.get("/v1/clusters").json()["items"]) == 1


def test_a_cluster_without_its_gpu_names_the_gpu_alone(client: TestClient) -> None:
    """gpus_per_node follows the GPU: a body without gpu was also told "gpus_per_node: Field required",
    a field the client may leave out (operator review)."""
    for body in ({"name": "z"}, {"name": "z", "num_gpus": 4}):
        problem = assert_problem(client.post("/v1/clusters", json=body), 422)
        assert [e["field"] for e in problem["errors"]] == ["gpu"], problem
