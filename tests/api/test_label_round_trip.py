"""The layout a plan prints (the CLI's label; the page's layoutText prints the same fields) is the layout
its numbers are for: an estimate of the label's fields alone, every other field left to the service's
defaults, gives the plan's throughput. The label left out switches the search sets (overlap_grad_reduce,
recompute_num_layers, moe_a2a_overlap, torch_compile, etp), so a DeepSpeed ZeRO-2 plan's label estimated
22% slower and a Mixtral's was refused (determinism review)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.cli import layout_text

ALIASES = {"zero": "zero_stage", "micro": "micro_batch_size", "vpp": "virtual_pipeline_stages"}


def label_fields(label: str) -> dict[str, Any]:
    """The layout fields a label names (``framework dp=8 tp=2 zero=2 micro=1 recompute=full(...) ...``)."""
    framework, *pairs = label.split()
    fields: dict[str, Any] = {"framework": framework}
    for pair in pairs:
        key, value = pair.split("=", 1)
        key = ALIASES.get(key, key)
        if key == "recompute" and "(" in value:
            value, modules = value.rstrip(")").split("(")
            fields["recompute_modules"] = modules.split(",")
        if value in ("true", "false"):
            fields[key] = value == "true"
        else:
            try:
                fields[key] = int(value)
            except ValueError:
                try:
                    fields[key] = float(value)
                except ValueError:
                    fields[key] = value
    return fields


JOBS = [
    (
        {"preset": "olmo-2-13b"},
        {"gpu": "h100-sxm-80gb", "num_nodes": 2},
        {"seq_len": 4096, "global_batch_size": 512},
        {},
    ),
    (
        {"preset": "llama-3.1-70b"},
        {"gpu": "h100-sxm-80gb", "num_nodes": 2},
        {"seq_len": 8192, "global_batch_size": 64},
        {},
    ),
    (
        {"preset": "mixtral-8x7b"},
        {"gpu": "h100-sxm-80gb", "num_nodes": 2},
        {"seq_len": 4096, "global_batch_size": 256},
        {},
    ),
    (
        {"preset": "deepseek-v2-lite"},
        {"gpu": "a100-sxm-80gb", "num_nodes": 1},
        {"seq_len": 4096, "global_batch_size": 128},
        {},
    ),
    (
        {"preset": "mistral-nemo-12b"},
        {"gpu": "h100-sxm-80gb", "num_nodes": 1},
        {"seq_len": 4096, "global_batch_size": 128},
        {"torch_compile": True},
    ),
    (
        {"preset": "llama-3.2-1b"},
        {"gpu": "a10g-24gb", "num_nodes": 1, "gpus_per_node": 4},
        {"seq_len": 2048, "global_batch_size": 64},
        {},
    ),
]


@pytest.mark.parametrize(
    ("model", "cluster", "training", "constraints"), JOBS, ids=[j[0]["preset"] for j in JOBS]
)
def test_an_estimate_of_the_printed_label_is_the_plans(
    client: TestClient, model: dict, cluster: dict, training: dict, constraints: dict
) -> None:
    body = {
        "model": model,
        "cluster": cluster,
        "training": training,
        "constraints": {"top_k": 3, **constraints},
    }
    plan = client.post("/v1/plans", json=body)
    assert plan.status_code == 201, plan.text
    shown = [plan.json()["recommended"], *plan.json()["alternatives"]]
    for candidate in shown:
        label = layout_text(candidate["layout"])
        size = (
            len(candidate["layout"])
            and candidate["layout"]["dp"]
            * candidate["layout"]["tp"]
            * candidate["layout"]["pp"]
            * candidate["layout"]["cp"]
        )
        part = dict(cluster)
        if size < (part.get("num_nodes", 1) * part.get("gpus_per_node", 8)):
            part = {**part, "num_nodes": 1, "gpus_per_node": size}
        estimate = client.post(
            "/v1/estimates",
            json={"model": model, "cluster": part, "training": training, "layout": label_fields(label)},
        )
        assert estimate.status_code == 200, (label, estimate.text)
        assert estimate.json()["time"]["tokens_per_s"] == pytest.approx(
            candidate["estimate"]["time"]["tokens_per_s"], rel=1e-9
        ), label


def test_an_estimate_names_the_gradient_overlap_it_resolved(client: TestClient) -> None:
    """Left out, overlap_grad_reduce is the framework's default, and resolved_defaults names it where a
    data-parallel reduction exists (DeepSpeed's overlap_comm is off below ZeRO-3, on at 3)."""
    base = {
        "model": "llama-3.2-1b",
        "cluster": {"gpu": "h100-sxm-80gb"},
        "training": {"seq_len": 2048, "global_batch_size": 64},
    }
    for zero, overlapped in ((2, "false"), (3, "true")):
        layout = {"framework": "deepspeed", "dp": 8, "zero_stage": zero, "micro_batch_size": 1}
        answer = client.post("/v1/estimates", json={**base, "layout": layout}).json()
        assert answer["resolved_defaults"]["layout.overlap_grad_reduce"] == overlapped
        stated = client.post(
            "/v1/estimates", json={**base, "layout": {**layout, "overlap_grad_reduce": overlapped == "true"}}
        ).json()
        assert "layout.overlap_grad_reduce" not in stated["resolved_defaults"]
        assert stated["time"] == answer["time"]
    one = {"framework": "deepspeed", "dp": 1, "tp": 8, "zero_stage": 0, "micro_batch_size": 1}
    assert (
        "layout.overlap_grad_reduce"
        not in client.post("/v1/estimates", json={**base, "layout": one}).json()["resolved_defaults"]
    )


# LayoutIn's fields the label prints in its own words (the degrees, zero=, micro=, vpp=, recompute=(...),
# the offloads, moe_dispatcher, tp_comm_overlap), and those no search sets (left to an estimate's defaults
# in the label as in the plan: sequence parallelism as the framework's recipes set it, the derived pipeline
# split, hybrid shard with its dp_replicate, gradient accumulation from the batch)
LABEL_OWN_WORDS = {
    "framework", "dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "virtual_pipeline_stages",
    "recompute", "recompute_modules", "offload_optimizer", "offload_params", "moe_dispatcher",
    "tp_comm_overlap",
}  # fmt: skip
NOT_SET_BY_THE_SEARCH = {
    "sequence_parallel", "pipeline_layers", "pipeline_account_for_embedding", "pipeline_account_for_loss",
    "fsdp_hybrid_shard", "gradient_accumulation_steps",
}  # fmt: skip


def test_every_layout_field_has_its_place_in_the_label() -> None:
    """A layout option added to LayoutIn is printed by the label (marked ``LABEL_SWITCH`` or
    ``LABEL_TRI_STATE``, which the CLI reads from the model and the page from the OpenAPI document) or
    said here why not: the label cannot leave out, silently, a switch a plan sets."""
    from service.cli import LABEL_SWITCHES
    from service.contracts.estimates import LayoutIn

    marked = set(LABEL_SWITCHES)
    assert not marked & (LABEL_OWN_WORDS | NOT_SET_BY_THE_SEARCH)
    assert set(LayoutIn.model_fields) == marked | LABEL_OWN_WORDS | NOT_SET_BY_THE_SEARCH
    # a tri-state switch is a nullable boolean (null: the framework's default), printed true or false
    for name, tri_state in LABEL_SWITCHES.items():
        annotation = str(LayoutIn.model_fields[name].annotation)
        assert tri_state == (annotation in ("bool | None", "typing.Optional[bool]")), (name, annotation)


def test_the_openapi_document_marks_the_labels_switches(client: TestClient) -> None:
    """The page reads the label's switches from the served document: the same, in the same order."""
    from service.cli import LABEL_SWITCHES

    properties = client.get("/openapi.json").json()["components"]["schemas"]["LayoutIn"]["properties"]
    marks = {name: prop["x-label"] for name, prop in properties.items() if "x-label" in prop}
    assert marks == {name: "tri-state" if tri else "switch" for name, tri in LABEL_SWITCHES.items()}
    assert list(marks) == list(LABEL_SWITCHES)
