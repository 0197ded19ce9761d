"""A cluster that leaves out its node or network takes them from its catalog part, and the answer says
so (``resolved_defaults``): ``{"gpu": "h100-sxm-80gb"}`` is one HGX node of 8, and four DGX A100 nodes
that state no network have the DGX A100's (8 x 200 Gb/s ConnectX-6 for 8 GPUs: 25 GB/s per GPU). A PCIe
card or a custom GPU ships in no reference node: it states them, and a 422 names the field."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.catalog.gpus import GPUEntry, gpu_entries
from tests.api.helpers import assert_problem

TRAINING = {"seq_len": 2048, "global_batch_size": 64}
LAYOUT = {"framework": "fsdp", "zero_stage": 3, "micro_batch_size": 1}
MODEL = "llama-3.2-1b"


def _estimate(client: TestClient, cluster: dict[str, Any]) -> Any:
    body = {"model": MODEL, "cluster": cluster, "training": TRAINING, "layout": LAYOUT}
    response = client.post("/v1/estimates", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_gpu_alone_is_one_node_of_its_baseboard(client: TestClient) -> None:
    response = client.post(
        "/v1/plans", json={"model": MODEL, "cluster": {"gpu": "h100-sxm-80gb"}, "training": TRAINING}
    )
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["resolved_defaults"]["cluster.num_nodes"] == "1"
    assert plan["resolved_defaults"]["cluster.gpus_per_node"] == "8"
    stated = client.post(
        "/v1/plans",
        json={
            "model": MODEL,
            "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8},
            "training": TRAINING,
        },
    ).json()
    assert stated["recommended"] == plan["recommended"]
    assert "cluster.gpus_per_node" not in stated["resolved_defaults"]


def test_nodes_without_a_network_have_the_reference_nodes(client: TestClient) -> None:
    defaulted = _estimate(client, {"gpu": "a100-sxm-80gb", "num_nodes": 4})
    assert defaulted["resolved_defaults"]["cluster.inter_node_bandwidth_bytes_per_s"] == "25000000000"
    stated = _estimate(
        client, {"gpu": "a100-sxm-80gb", "num_nodes": 4, "inter_node_bandwidth_bytes_per_s": 25e9}
    )
    assert stated["time"] == defaulted["time"] and stated["memory"] == defaulted["memory"]
    assert "cluster.inter_node_bandwidth_bytes_per_s" not in stated["resolved_defaults"]
    slower = _estimate(client, {"gpu": "v100-sxm2-32gb", "num_nodes": 4})  # DGX-1: 4 x 100 Gb/s for 8
    assert slower["resolved_defaults"]["cluster.inter_node_bandwidth_bytes_per_s"] == "6250000000"


def test_a_pcie_card_states_its_node_and_network(client: TestClient) -> None:
    response = client.post(
        "/v1/plans", json={"model": MODEL, "cluster": {"gpu": "l40s-48gb"}, "training": TRAINING}
    )
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["cluster.gpus_per_node"]
    cluster = {"gpu": "l40s-48gb", "gpus_per_node": 4, "num_nodes": 2}
    response = client.post("/v1/plans", json={"model": MODEL, "cluster": cluster, "training": TRAINING})
    assert response.status_code == 422
    (error,) = response.json()["errors"]
    assert error["field"] == "cluster.inter_node_bandwidth_bytes_per_s"
    assert "no reference node" in error["message"]


def test_a_stored_cluster_keeps_what_the_catalog_filled_in(client: TestClient) -> None:
    created = client.post("/v1/clusters", json={"name": "b200s", "gpu": "B200", "num_nodes": 4})
    assert created.status_code == 201, created.text
    cluster = created.json()
    assert (cluster["gpu"], cluster["gpus_per_node"], cluster["world_size"]) == ("b200-sxm-180gb", 8, 32)
    assert cluster["inter_node_bandwidth_bytes_per_s"] == 50e9
    assert "inter_node_bandwidth_bytes_per_s" in cluster["defaulted"]


def test_the_catalog_shows_each_parts_node(client: TestClient) -> None:
    gpus = {g["name"]: g for g in client.get("/v1/gpus").json()["items"]}
    assert (gpus["a100-sxm-80gb"]["gpus_per_node"], gpus["a100-sxm-80gb"]["node_network_bytes_per_s"]) == (
        8,
        25e9,
    )
    assert (gpus["l40s-48gb"]["gpus_per_node"], gpus["l40s-48gb"]["node_network_bytes_per_s"]) == (None, None)


@pytest.mark.parametrize("entry", gpu_entries(), ids=lambda entry: entry.name)
def test_every_catalog_gpu_left_to_the_catalog_answers_as_stated(client: TestClient, entry: GPUEntry) -> None:
    """Over the whole catalog: two nodes of a part named by its display name, node and network left out,
    answer exactly as the slug with the node and network stated (the values resolved_defaults names);
    a part without a reference node is the 422 naming gpus_per_node."""
    training = {"seq_len": 1024, "global_batch_size": 64, "precision": "fp16"}
    body = {"model": MODEL, "training": training, "layout": {"framework": "deepspeed", "zero_stage": 1}}
    response = client.post(
        "/v1/estimates", json=body | {"cluster": {"gpu": entry.display_name, "num_nodes": 2}}
    )
    if entry.spec.node_gpus is None or entry.spec.node_network_bytes_per_s is None:
        assert response.status_code == 422
        fields = {e["field"] for e in response.json()["errors"]}
        assert fields & {"cluster.gpus_per_node", "cluster.inter_node_bandwidth_bytes_per_s"}, fields
        return
    assert response.status_code == 200, response.text
    chosen = response.json()["resolved_defaults"]
    assert chosen["cluster.gpu"] == entry.name
    assert chosen["cluster.gpus_per_node"] == str(entry.spec.node_gpus)
    network = entry.spec.node_network_bytes_per_s
    assert chosen["cluster.inter_node_bandwidth_bytes_per_s"] == f"{network:.0f}"
    stated = {"gpu": entry.name, "num_nodes": 2, "gpus_per_node": entry.spec.node_gpus}
    same = client.post(
        "/v1/estimates", json=body | {"cluster": stated | {"inter_node_bandwidth_bytes_per_s": network}}
    )
    assert same.status_code == 200, same.text
    assert {k: v for k, v in same.json().items() if k != "resolved_defaults"} == {
        k: v for k, v in response.json().items() if k != "resolved_defaults"
    }


@pytest.mark.parametrize(
    ("cluster", "nodes", "per_node"),
    [
        ({"gpu": "h100-sxm-80gb", "num_gpus": 16}, 2, 8),  # whole HGX nodes
        ({"gpu": "h100-sxm-80gb", "num_gpus": 4}, 1, 4),  # fewer than a node: one node of them
        ({"gpu": "mi250x-gcd-64gb", "num_gpus": 16}, 2, 8),  # a Frontier node holds 8 GCDs
        ({"gpu": "mi250x-128gb", "num_gpus": 16}, 2, 8),  # the package's name: read as its GCDs
        ({"gpu": "h100-sxm-80gb", "num_gpus": 16, "num_nodes": 4}, 4, 4),  # the GPUs over the nodes given
        ({"gpu": "l40s-48gb", "num_gpus": 8, "gpus_per_node": 4, "inter_node_bandwidth_gbps": 25}, 2, 4),
        # up to 8 PCIe cards: one server of them (a 422 "gpus_per_node: Field required" met num_gpus 1)
        ({"gpu": "l40s-48gb", "num_gpus": 8}, 1, 8),
        ({"gpu": "rtx-4090-24gb", "num_gpus": 1}, 1, 1),
    ],
)
def test_a_cluster_by_its_gpu_count(
    client: TestClient, cluster: dict[str, Any], nodes: int, per_node: int
) -> None:
    """ "16 H100s" as a scheduler says it (the CLI's 16xh100-sxm-80gb): the nodes follow, and the answer
    says what it made of them."""
    response = client.post("/v1/plans", json={"model": MODEL, "cluster": cluster, "training": TRAINING})
    assert response.status_code == 201, response.text
    stored = response.json()["request"]["cluster"]
    assert (stored["num_nodes"], stored["gpus_per_node"], stored["num_gpus"]) == (
        nodes,
        per_node,
        nodes * per_node,
    )


@pytest.mark.parametrize(
    ("cluster", "field"),
    [
        ({"gpu": "h100-sxm-80gb", "num_gpus": 12}, "cluster.num_gpus"),  # not whole nodes of 8
        ({"gpu": "h100-sxm-80gb", "num_gpus": 16, "num_nodes": 2, "gpus_per_node": 4}, "cluster.num_gpus"),
        # past one server of PCIe cards, its node size is not known
        ({"gpu": "l40s-48gb", "num_gpus": 16}, "cluster.gpus_per_node"),
    ],
)
def test_a_gpu_count_that_does_not_fill_its_nodes_is_a_422(
    client: TestClient, cluster: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/plans", json={"model": MODEL, "cluster": cluster, "training": TRAINING})
    assert response.status_code == 422
    assert field in [e["field"] for e in response.json()["errors"]]


def test_a_run_on_a_defaulted_cluster_calibrates_the_same_cluster_stated(client: TestClient) -> None:
    """After a run is posted: a plan on two DGX A100 nodes left to the catalog and an estimate on them
    stated (25 GB/s) are one hardware, so the run's factors reach the estimate."""
    plan = client.post(
        "/v1/plans",
        json={"model": MODEL, "cluster": {"gpu": "a100-sxm-80gb", "num_nodes": 2}, "training": TRAINING},
    )
    assert plan.status_code == 201, plan.text
    estimated = plan.json()["recommended"]["estimate"]["time"]["step_s"]
    run = client.post(f"/v1/plans/{plan.json()['id']}/runs", json={"step_s": estimated * 1.2})
    assert run.status_code == 201, run.text
    stated = {
        "gpu": "a100-sxm-80gb",
        "num_nodes": 2,
        "gpus_per_node": 8,
        "inter_node_bandwidth_bytes_per_s": 25e9,
    }
    layout = plan.json()["recommended"]["layout"]
    body = {"model": MODEL, "cluster": stated, "training": TRAINING, "layout": layout}
    response = client.post("/v1/estimates", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["calibration"] is not None


def test_an_mi300x_cluster_of_several_nodes_takes_its_reference_nodes_network(client: TestClient) -> None:
    """MI300X ships 8 to a baseboard, like the HGX parts, but had no reference network: two nodes
    of it were a 422 asking for inter_node_bandwidth_bytes_per_s."""
    body = {"model": {"preset": "qwen2.5-0.5b"}, "cluster": {"gpu": "mi300x-192gb", "num_nodes": 2},
            "training": {"seq_len": 2048, "global_batch_size": 32}}  # fmt: skip
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    assert response.json()["resolved_defaults"]["cluster.inter_node_bandwidth_bytes_per_s"] == "50000000000"


@pytest.mark.parametrize(
    ("name", "words"), [("H100", "it matches 4 entries"), ("nope", "unknown gpu 'nope'")]
)
def test_an_unknown_gpu_name_is_the_error_not_the_node_it_left_out(
    client: TestClient, name: str, words: str
) -> None:
    """A review's case: {"gpu": "H100"} (four parts) or an unknown name without gpus_per_node was a 422
    "cluster.gpus_per_node: Field required", never naming the GPU or its candidates."""
    body = {
        "model": {"preset": "llama-3-8b"},
        "cluster": {"gpu": name, "num_nodes": 1},
        "training": {"seq_len": 4096, "global_batch_size": 64},
    }
    for path in ("/v1/plans", "/v1/estimates"):
        problem = assert_problem(
            client.post(path, json=body | ({"layout": {}} if "estimates" in path else {})), 422
        )
        assert [e["field"] for e in problem["errors"]] == ["cluster.gpu"], problem
        assert words in problem["errors"][0]["message"] and not problem["errors"][0]["message"].startswith(
            "Value"
        )
    stored = assert_problem(client.post("/v1/clusters", json={"name": "x", "gpu": name, "num_nodes": 1}), 422)
    assert [e["field"] for e in stored["errors"]] == ["gpu"]
    # a PCIe card the catalog knows still needs its node size: that field is the one named
    body["cluster"] = {"gpu": "h100-pcie-80gb", "num_nodes": 1}
    problem = assert_problem(client.post("/v1/plans", json=body), 422)
    assert [e["field"] for e in problem["errors"]] == ["cluster.gpus_per_node"]


@pytest.mark.parametrize(
    "gpu",
    [
        "h100-pcie-80gb",
        {
            "name": "mine",
            "memory_bytes": 2**34,
            "peak_flops_per_s": {"bf16": 1e14},
            "hbm_bandwidth_bytes_per_s": 1e12,
        },
    ],
)
def test_a_card_without_a_node_of_its_own_says_why_the_node_size_is_needed(
    client: TestClient, gpu: Any
) -> None:
    """A PCIe card or custom GPU on two nodes without gpus_per_node was a bare "Field required"
    (scheduler review: 36 of 48 sweep requests); the error says why and what to send."""
    body = {
        "model": {"preset": "qwen2.5-0.5b"},
        "cluster": {"gpu": gpu, "num_nodes": 2, "inter_node_bandwidth_bytes_per_s": 25e9},
        "training": {"seq_len": 4096, "global_batch_size": 256},
    }
    refused = client.post("/v1/plans", json=body)
    assert refused.status_code == 422, refused.text
    (error,) = refused.json()["errors"]
    assert error["field"] == "cluster.gpus_per_node"
    assert "no node of its own" in error["message"] and "num_gpus up to 8" in error["message"]


def test_a_stored_clusters_defaults_are_named_as_an_inline_ones(client: TestClient) -> None:
    """A plan or estimate on a stored cluster that left its network out names the default it took, as
    the same cluster inline does (determinism review: only the stored cluster's own answer said it)."""
    fields = {"gpu": "h100-sxm-80gb", "num_nodes": 2}
    stored = client.post("/v1/clusters", json={"name": "defaults-named", **fields})
    assert stored.status_code == 201, stored.text
    ref = {"id": stored.json()["id"]}
    for cluster in (fields, ref):
        chosen = _estimate(client, cluster)["resolved_defaults"]
        assert chosen["cluster.inter_node_bandwidth_bytes_per_s"] == "50000000000", cluster
        plan = client.post("/v1/plans", json={"model": MODEL, "cluster": cluster, "training": TRAINING})
        assert plan.status_code == 201, plan.text
        assert plan.json()["resolved_defaults"]["cluster.inter_node_bandwidth_bytes_per_s"] == "50000000000"
