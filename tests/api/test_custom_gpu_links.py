"""A custom GPU may leave out its link bandwidths: they resolve from the hardware, conservatively, and
the answer says what it assumed. The intra-node link was required even on nodes of one GPU, where
nothing uses it, and from users who do not know it.

The rules (contracts/gpus.py, CustomGPU._links): the PCIe host link is the slowest of the catalog's
parts of the die (of any catalog part without a chip: PCIe Gen3 x16, 16e9); the link between GPUs is
that host link, never the NVLink figure of a catalog part of the die (gh100 ships as the H100 SXM at
450e9 and as the H100 PCIe at 64e9)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from service.catalog.gpus import gpu as catalog_gpu
from service.contracts.gpus import CustomGPU
from service.estimator.types import ClusterSpec
from service.planning.calibration import hardware_key

# no link bandwidth at all, and no chip
BARE_GPU: dict[str, Any] = {
    "name": "lab-card-48gb",
    "memory_bytes": 48 * 2**30,
    "peak_flops_per_s": {"fp32": 40e12, "bf16": 180e12},
    "hbm_bandwidth_bytes_per_s": 1.0e12,
}
TRAINING = {"seq_len": 2048, "global_batch_size": 16}
INTRA, PCIE = "cluster.gpu.intra_node_bandwidth_bytes_per_s", "cluster.gpu.pcie_bandwidth_bytes_per_s"


def estimate(client: TestClient, gpu: dict[str, Any], per_node: int, **cluster: Any) -> dict[str, Any]:
    body = {
        "model": {"preset": "llama-3.2-1b"},
        "cluster": {"gpu": gpu, "num_nodes": 1, "gpus_per_node": per_node} | cluster,
        "training": TRAINING,
        "layout": {"framework": "fsdp", "zero_stage": 3},
    }
    response = client.post("/v1/estimates", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def notes_on(result: dict[str, Any], field: str) -> list[str]:
    return [note for note in result["assumptions"] if note.startswith(f"{field} not stated")]


def test_a_one_gpu_node_needs_no_link_between_gpus(client: TestClient) -> None:
    result = estimate(client, BARE_GPU, per_node=1)
    # the host link is assumed and said (offload crosses it); the link between GPUs is not used: not said
    assert result["resolved_defaults"][PCIE] == "16000000000"
    assert INTRA not in result["resolved_defaults"]
    (pcie,) = notes_on(result, "pcie_bandwidth_bytes_per_s")
    assert "16 GB/s assumed" in pcie and "PCIe Gen3 x16" in pcie and "chip not stated" in pcie
    assert not notes_on(result, "intra_node_bandwidth_bytes_per_s")


def test_a_multi_gpu_node_talks_over_the_host_link_and_says_so(client: TestClient) -> None:
    stated = BARE_GPU | {"pcie_bandwidth_bytes_per_s": 32e9, "chip": "ga100"}
    result = estimate(client, stated, per_node=8)
    assert result["resolved_defaults"][INTRA] == "32000000000"
    assert PCIE not in result["resolved_defaults"]  # stated
    (intra,) = notes_on(result, "intra_node_bandwidth_bytes_per_s")
    assert "32 GB/s assumed" in intra and "PCIe host link" in intra
    # the same numbers as the GPU that states its PCIe link as its link between GPUs
    explicit = estimate(client, stated | {"intra_node_bandwidth_bytes_per_s": 32e9}, per_node=8)
    assert explicit["time"] == result["time"] and explicit["memory"] == result["memory"]
    assert not notes_on(explicit, "intra_node_bandwidth_bytes_per_s")
    # never faster than with NVLink stated: the default is the slow link
    nvlink = estimate(client, stated | {"intra_node_bandwidth_bytes_per_s": 300e9}, per_node=8)
    assert nvlink["time"]["step_s"] <= result["time"]["step_s"]


def test_the_host_link_follows_the_die(client: TestClient) -> None:
    result = estimate(client, BARE_GPU | {"chip": "gh100"}, per_node=8)
    h100 = catalog_gpu("h100-pcie-80gb")
    # every catalog gh100 part is PCIe Gen5 x16; the link between GPUs is that, not the SXM's NVLink
    assert result["resolved_defaults"][PCIE] == f"{h100.pcie_bandwidth_bytes_per_s:.0f}" == "64000000000"
    assert result["resolved_defaults"][INTRA] == "64000000000"
    (pcie,) = notes_on(result, "pcie_bandwidth_bytes_per_s")
    assert "the catalog's gh100 parts" in pcie and "PCIe Gen5 x16" in pcie


def test_a_cluster_that_states_its_link_is_not_told_of_the_gpu_default(client: TestClient) -> None:
    result = estimate(client, BARE_GPU, per_node=8, intra_node_bandwidth_bytes_per_s=100e9)
    assert INTRA not in result["resolved_defaults"]
    assert not notes_on(result, "intra_node_bandwidth_bytes_per_s")
    assert result["resolved_defaults"][PCIE] == "16000000000"


def test_a_plan_on_several_nodes_of_a_bare_custom_gpu(client: TestClient) -> None:
    body = {
        "model": {"preset": "llama-3.2-1b"},
        "cluster": {
            "gpu": BARE_GPU | {"chip": "ad102"},
            "num_nodes": 2,
            "gpus_per_node": 4,
            "inter_node_bandwidth_bytes_per_s": 25e9,
        },
        "training": TRAINING,
    }
    response = client.post("/v1/plans", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["status"] == "feasible"
    assert plan["resolved_defaults"][PCIE] == plan["resolved_defaults"][INTRA] == "32000000000"
    notes = plan["recommended"]["estimate"]["assumptions"]
    said = "intra_node_bandwidth_bytes_per_s not stated for lab-card-48gb: 32 GB/s assumed"
    assert any(n.startswith(said) for n in notes)
    assert any("the catalog's ad102 parts: PCIe Gen4 x16" in n for n in notes)


def test_capacity_of_a_stored_cluster_of_bare_custom_gpus(client: TestClient) -> None:
    created = client.post(
        "/v1/clusters", json={"name": "lab", "gpu": BARE_GPU, "num_nodes": 1, "gpus_per_node": 8}
    )
    assert created.status_code == 201, created.text
    cluster = created.json()
    # stored as given (the fields left out stay left out), resolved and named as defaults
    assert cluster["gpu"]["intra_node_bandwidth_bytes_per_s"] is None
    assert cluster["intra_node_bandwidth_bytes_per_s"] == 16e9
    left_out = {"gpu.intra_node_bandwidth_bytes_per_s", "gpu.pcie_bandwidth_bytes_per_s"}
    assert left_out <= set(cluster["defaulted"])
    body = {
        "model": {"preset": "llama-3.2-1b"},
        "training": TRAINING | {"tokens": 10**9},
        "cluster_ids": [cluster["id"]],
    }
    response = client.post("/v1/capacity", json=body)
    assert response.status_code == 200, response.text
    (option,) = response.json()["options"]
    assert option["fits"], option
    assert "pcie_bandwidth_bytes_per_s not stated for lab-card-48gb: 16 GB/s assumed" in option["note"]


def test_a_link_left_out_and_the_same_link_stated_are_one_hardware() -> None:
    """Runs stored on a cluster calibrate later estimates by a fingerprint of its hardware: how a
    figure was chosen is not part of it."""

    def key(gpu: dict[str, Any]) -> str:
        spec = CustomGPU.model_validate(gpu).to_domain()
        return hardware_key(
            ClusterSpec(
                gpu=spec,
                num_nodes=1,
                gpus_per_node=8,
                intra_node_bandwidth_bytes_per_s=spec.intra_node_bandwidth_bytes_per_s,
                inter_node_bandwidth_bytes_per_s=spec.intra_node_bandwidth_bytes_per_s,
            )
        )

    stated = BARE_GPU | {"intra_node_bandwidth_bytes_per_s": 16e9, "pcie_bandwidth_bytes_per_s": 16e9}
    assert key(BARE_GPU) == key(stated)
    assert key(BARE_GPU) != key(stated | {"intra_node_bandwidth_bytes_per_s": 32e9})


# ---------------------------------------------------------------- FlashAttention, as the die has it

# a V100 described by its numbers: fp16 tensor cores, no bf16 peak
VOLTA_LIKE: dict[str, Any] = {
    "name": "old-card",
    "memory_bytes": 32 * 2**30,
    "peak_flops_per_s": {"fp32": 15.7e12, "fp16": 125e12},
    "hbm_bandwidth_bytes_per_s": 0.9e12,
}
VOLTA_TRAINING = {"seq_len": 2048, "global_batch_size": 16, "precision": "fp16"}


def estimate_volta(client: TestClient, gpu: dict[str, Any], **training: Any) -> Any:
    body = {
        "model": {"preset": "llama-3.2-1b"},
        "cluster": {"gpu": gpu, "num_nodes": 1, "gpus_per_node": 8},
        "training": VOLTA_TRAINING | training,
        "layout": {"framework": "deepspeed", "zero_stage": 1},
    }
    return client.post("/v1/estimates", json=body)


def test_a_pre_ampere_custom_gpu_has_no_flash_attention_as_the_catalogs_has_none(client: TestClient) -> None:
    """A custom GPU on gv100 (or with no bf16 peak and no chip) defaulted to flash attention, which
    the catalog's V100 refuses: the kernels need Ampere or newer. Left out, flash_attention follows
    the catalog's parts of the die, else the bf16 peak; the attention default follows it."""
    catalog = client.post(
        "/v1/estimates",
        json={
            "model": {"preset": "llama-3.2-1b"},
            "cluster": {"gpu": "v100-sxm2-32gb", "num_nodes": 1, "gpus_per_node": 8},
            "training": VOLTA_TRAINING,
            "layout": {"framework": "deepspeed", "zero_stage": 1},
        },
    )
    assert catalog.status_code == 200, catalog.text
    for gpu in (VOLTA_LIKE | {"chip": "gv100"}, VOLTA_LIKE | {"chip": "T4"}, VOLTA_LIKE):
        result = estimate_volta(client, gpu)
        assert result.status_code == 200, result.text
        assert result.json()["resolved_defaults"]["training.attention"] == "sdpa"
        asked = estimate_volta(client, gpu, attention="flash")
        assert asked.status_code == 422, asked.text
        assert asked.json()["errors"][0]["field"] == "training.attention"
    assert catalog.json()["resolved_defaults"]["training.attention"] == "sdpa"
    # stated, it holds; an Ampere die, or a bf16 peak without a chip, has the kernels
    stated = estimate_volta(client, VOLTA_LIKE | {"flash_attention": True}, attention="flash")
    assert stated.status_code == 200, stated.text
    for gpu in (BARE_GPU, BARE_GPU | {"chip": "ga100"}):
        assert (
            estimate(client, gpu, per_node=1)["resolved_defaults"].get("training.attention", "flash")
            == "flash"
        )


def test_a_custom_gpu_named_as_a_catalog_part_is_marked_custom(client: TestClient) -> None:
    """A capacity review's case: a custom 24 GiB spec named h100-sxm-80gb was answered as
    "h100-sxm-80gb", with nothing saying it was not the catalog's 80 GiB part."""
    spec = {
        "name": "h100-sxm-80gb",
        "memory_bytes": 24 * 2**30,
        "peak_flops_per_s": {"bf16": 9.894e14, "fp16": 9.894e14, "fp32": 6.69e13},
        "hbm_bandwidth_bytes_per_s": 3.35e12,
        "chip": "gh100",
    }
    body = {
        "model": {"preset": "qwen2.5-0.5b"},
        "cluster": {"gpu": spec, "num_nodes": 1, "gpus_per_node": 1},
        "training": {"seq_len": 1024, "global_batch_size": 8},
    }
    plan = client.post("/v1/plans", json=body)
    assert plan.status_code == 201, plan.text
    made = plan.json()["cluster"]["gpu"]
    assert made["name"] == "h100-sxm-80gb (custom)" and made["memory_bytes"] == 24 * 2**30
    own = client.post(
        "/v1/plans", json=body | {"cluster": body["cluster"] | {"gpu": spec | {"name": "lab-h100"}}}
    )
    assert own.json()["cluster"]["gpu"]["name"] == "lab-h100"


def test_a_custom_gpu_states_its_mesh_and_is_timed_on_it(client: TestClient) -> None:
    """A custom MI325X (the MI300X's xGMI mesh) had no way to say so: every TP group was timed at the
    node's 448 GB/s (review of this stop: tp 2 6.5x faster than on the catalog MI300X). Stated, it is
    timed as the mesh; a stored cluster keeps it."""

    from tests.custom_gpus import MI325X

    def tp_comm_s(gpu: dict[str, Any]) -> float:
        body = {
            "model": {"preset": "llama-3-70b"},
            "cluster": {"gpu": gpu, "num_nodes": 1, "gpus_per_node": 8},
            "training": {"seq_len": 4096, "global_batch_size": 64},
            "layout": {"framework": "megatron", "dp": 1, "tp": 2, "pp": 4, "sequence_parallel": True,
                       "zero_stage": 1, "recompute": "full"},
        }  # fmt: skip
        response = client.post("/v1/estimates", json=body)
        assert response.status_code == 200, response.text
        return float(response.json()["time"]["breakdown"]["tp_comm_s"])

    meshed = {**MI325X, "mesh_links": 7}
    assert tp_comm_s(meshed) > 3 * tp_comm_s(MI325X)
    stored = client.post(
        "/v1/clusters", json={"name": "mi325x", "gpu": meshed, "num_nodes": 1, "gpus_per_node": 8}
    )
    assert stored.status_code == 201, stored.text
    assert stored.json()["gpu"]["mesh_links"] == 7


def test_a_mesh_needs_the_links_it_splits_and_a_row_stored_before_the_rule_reads_back(
    client: TestClient, db_engine: Any
) -> None:
    """mesh_links without intra_node_bandwidth_bytes_per_s split the PCIe host link it defaulted to
    into 7 links: a tp 2 pair 7x slower than stating no topology (custom-hardware review). Refused,
    naming the field; a cluster stored before the rule still reads back and plans, its mesh set aside
    where the link defaulted."""
    from sqlalchemy import text

    from tests.custom_gpus import MI325X

    bare_mesh = {key: value for key, value in MI325X.items() if key != "intra_node_bandwidth_bytes_per_s"}
    bare_mesh["mesh_links"] = 7
    body = {
        "model": {"preset": "llama-3.1-8b"},
        "cluster": {"gpu": bare_mesh, "num_nodes": 1, "gpus_per_node": 8},
        "training": {"seq_len": 4096, "global_batch_size": 32},
        "layout": {"framework": "megatron", "dp": 4, "tp": 2, "zero_stage": 1, "sequence_parallel": True},
    }
    refused = client.post("/v1/estimates", json=body)
    assert refused.status_code == 422, refused.text
    (error,) = refused.json()["errors"]
    assert (
        error["field"] == "cluster.gpu.mesh_links" and "intra_node_bandwidth_bytes_per_s" in error["message"]
    )
    stored = client.post(
        "/v1/clusters", json={"name": "old-mesh", "gpu": bare_mesh, "num_nodes": 1, "gpus_per_node": 8}
    )
    assert stored.status_code == 422 and stored.json()["errors"][0]["field"] == "gpu.mesh_links"
    # as a release before the rule stored it
    made = client.post(
        "/v1/clusters",
        json={"name": "old-mesh", "gpu": MI325X | {"mesh_links": 7}, "num_nodes": 1, "gpus_per_node": 8},
    ).json()
    with db_engine.begin() as conn:
        (value,) = conn.execute(
            text("SELECT gpu_spec FROM clusters WHERE id = :id"), {"id": made["id"]}
        ).one()
        row = json.loads(value) if isinstance(value, str) else dict(value)
        del row["intra_node_bandwidth_bytes_per_s"]
        conn.execute(
            text("UPDATE clusters SET gpu_spec = :spec WHERE id = :id"),
            {"spec": json.dumps(row), "id": made["id"]},
        )
    read = client.get(f"/v1/clusters/{made['id']}")
    assert read.status_code == 200, read.text
    assert read.json()["gpu"]["mesh_links"] == 7
    by_id = client.post("/v1/estimates", json=body | {"cluster": {"id": made["id"]}})
    assert by_id.status_code == 200, by_id.text
    plain = {key: value for key, value in bare_mesh.items() if key != "mesh_links"}
    unmeshed = client.post("/v1/estimates", json=body | {"cluster": body["cluster"] | {"gpu": plain}})
    assert by_id.json()["time"]["breakdown"]["tp_comm_s"] == unmeshed.json()["time"]["breakdown"]["tp_comm_s"]
    # a description edited on it is no change to its GPU: accepted (a 422 naming the GPU: change review)
    edited = client.patch(f"/v1/clusters/{made['id']}", json={"description": "rack 3"})
    assert edited.status_code == 200, edited.text
    # the links' sum stated on the cluster serves the mesh as on the GPU
    on_cluster = body | {"cluster": body["cluster"] | {"intra_node_bandwidth_bytes_per_s": 448e9}}
    on_gpu = body | {
        "cluster": body["cluster"] | {"gpu": bare_mesh | {"intra_node_bandwidth_bytes_per_s": 448e9}}
    }
    times = [
        client.post("/v1/estimates", json=b).json()["time"]["breakdown"]["tp_comm_s"]
        for b in (on_cluster, on_gpu)
    ]
    assert times[0] == times[1]


def test_a_mesh_connects_every_gpu_of_its_node(client: TestClient) -> None:
    """A fully connected node of n GPUs gives each n - 1 links: mesh_links 1 on 8 GPUs was timed as a
    full mesh (custom-hardware review). Fewer links than peers are refused, naming gpus_per_node."""
    from tests.custom_gpus import MI325X

    def estimate_on(links: int, per_node: int) -> Any:
        body = {
            "model": {"preset": "llama-3.1-8b"},
            "cluster": {"gpu": MI325X | {"mesh_links": links}, "num_nodes": 1, "gpus_per_node": per_node},
            "training": {"seq_len": 4096, "global_batch_size": 32},
            "layout": {"framework": "fsdp", "dp": per_node},
        }
        return client.post("/v1/estimates", json=body)

    refused = estimate_on(1, 8)
    assert refused.status_code == 422
    (error,) = refused.json()["errors"]
    assert error["field"] == "cluster.gpus_per_node" and error["limit"] == {"le": 2}
    assert estimate_on(7, 16).status_code == 422
    assert estimate_on(7, 8).status_code == 200 and estimate_on(3, 4).status_code == 200


def test_a_custom_gpu_stating_bidirectional_links_or_fp16_accumulate_peaks_is_told(
    client: TestClient,
) -> None:
    """Datasheets print NVLink as the sum of both directions (H100's 900 GB/s is 450 each way, what
    this service reads) and GeForce peaks of FP16 with FP16 accumulate at twice the bf16 rate training
    runs: a custom H800 at 900e9 and a custom 48 GB RTX 4090 at 330 TFLOP/s fp16 were timed as given,
    with no word (a hardware review). Each is timed as stated and said; a catalog part's figures not."""
    h800 = BARE_GPU | {
        "name": "my-h800",
        "chip": "gh100",
        "peak_flops_per_s": {"fp32": 66.9e12, "bf16": 989.4e12, "fp16": 989.4e12},
        "intra_node_bandwidth_bytes_per_s": 900e9,
    }
    warned = [w for w in estimate(client, h800, per_node=8)["warnings"] if "both directions" in w]
    assert len(warned) == 1 and "intra_node_bandwidth_bytes_per_s 900 GB/s is 2.0x" in warned[0], warned
    one_way = h800 | {"intra_node_bandwidth_bytes_per_s": 450e9}
    assert not [w for w in estimate(client, one_way, per_node=8)["warnings"] if "both directions" in w]
    geforce = BARE_GPU | {
        "name": "rtx-4090-48gb",
        "chip": "ad102",
        "peak_flops_per_s": {"fp32": 82.6e12, "bf16": 165.2e12, "fp16": 330.3e12},
    }
    warned = [w for w in estimate(client, geforce, per_node=1)["warnings"] if "FP16 accumulate" in w]
    assert len(warned) == 1 and "2.0x bf16" in warned[0], warned


def test_a_vendor_assumed_from_nothing_is_said_and_one_from_the_chip_or_given_is_not(
    client: TestClient,
) -> None:
    """vendor decides the launch files' devices (Kubernetes' nvidia.com/gpu or amd.com/gpu): an MI355X
    described without vendor or chip was rendered pods asking for NVIDIA GPUs, silently (defaults review)."""

    def vendor_notes(gpu: dict[str, Any]) -> list[str]:
        result = estimate(client, gpu, 1)
        return [w for w in result["warnings"] + result["assumptions"] if "vendor not stated" in w]

    (said,) = vendor_notes(BARE_GPU)
    assert "nvidia assumed" in said and "state vendor" in said
    assert vendor_notes({**BARE_GPU, "vendor": "amd"}) == []
    assert vendor_notes({**BARE_GPU, "chip": "gh100"}) == []  # the chip's maker
