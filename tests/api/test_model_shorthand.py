"""``"model": "<preset>"``: what a curl user writes first, as they write ``"gpu": "<catalog name>"``.
It was a 422 saying only "Input should be a valid dictionary"; a preset's name alone now stands for
``{"preset": name}`` on every endpoint that takes a model, with the same answer, and a name that
is no preset is the unknown-model 422 naming ``model.preset`` and the presets there are."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

CLUSTER = {"gpu": "a100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
TRAINING = {"seq_len": 2048, "global_batch_size": 32}
LAYOUT = {"framework": "fsdp", "dp": 8, "zero_stage": 3, "micro_batch_size": 1}


def _bodies(model: Any) -> dict[str, dict[str, Any]]:
    return {
        "/v1/plans": {"model": model, "cluster": CLUSTER, "training": TRAINING},
        "/v1/estimates": {"model": model, "cluster": CLUSTER, "training": TRAINING, "layout": LAYOUT},
        "/v1/models/resolve": {"model": model},
    }


@pytest.mark.parametrize("path", list(_bodies(None)))
def test_a_preset_name_alone_answers_as_the_preset_object(client: TestClient, path: str) -> None:
    shorthand = client.post(path, json=_bodies("llama-3.2-1b")[path])
    spelled = client.post(path, json=_bodies({"preset": "llama-3.2-1b"})[path])
    assert shorthand.status_code == spelled.status_code, shorthand.text
    assert shorthand.status_code in (200, 201), shorthand.text
    drop = {"id", "created_at", "updated_at", "duration_s", "search"}
    assert {k: v for k, v in shorthand.json().items() if k not in drop} == {
        k: v for k, v in spelled.json().items() if k not in drop
    }


def test_an_unknown_name_is_the_unknown_model_problem(client: TestClient) -> None:
    response = client.post("/v1/plans", json=_bodies("llama-9-1t")["/v1/plans"])
    assert response.status_code == 422
    (error,) = response.json()["errors"]
    assert error["field"] == "model.preset" and error["type"] == "unknown_model"
    assert "llama-3.2-1b" in error["known"]


@pytest.mark.parametrize("model", [5, ["llama-3.2-1b"], None, ""])
def test_other_shapes_stay_refused_naming_the_model(client: TestClient, model: Any) -> None:
    response = client.post("/v1/plans", json=_bodies(model)["/v1/plans"])
    assert response.status_code == 422
    assert all(e["field"].startswith("model") for e in response.json()["errors"])
