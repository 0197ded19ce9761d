"""Schemathesis against the OpenAPI document, on a freshly migrated database of its own (SQLite, or
with PLANNER_TEST_DATABASE_URL a PostgreSQL database beside that one, as CI's second pass runs it):
every operation, schema-valid and invalid requests alike, answers without a 5xx, with a documented
status code and content type, a body and headers that match the document, under every check
schemathesis has (invalid data refused, valid data accepted, unsupported methods a 405 with Allow,
required headers, deleted resources gone)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from alembic import command
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis import openapi
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig

from service.main import create_app
from service.settings import Settings
from tests.conftest import alembic_config, reset_postgres_schema, sibling_postgres_database


@schemathesis.check
def refusals_name_the_field(_ctx: Any, response: Any, _case: Any) -> None:
    """A 422 is a problem+json whose `errors` name each refused field (and why)."""
    if response.status_code == 422:
        problem = response.json()
        assert problem.get("errors"), f"422 without errors naming a field: {problem}"
        assert all(error.get("field") and error.get("message") for error in problem["errors"]), problem


# Every check schemathesis has (the conformance ones, positive and negative data, missing required
# headers, unsupported methods and Allow, use after free, ...) and the one above, not a chosen few.
load_all_checks()
EVERY_CHECK = CHECKS.get_all()
# A schema cannot state every rule a request must meet: a preset, GPU or chip must be in the catalog,
# dp x tp x pp must divide the GPUs, a cursor must be one the service issued, step_s and tokens_per_s
# exclude each other. A schema-valid request that breaks one is a documented 422 naming the field
# (refusals_name_the_field holds that), so positive-data acceptance takes 422 besides its defaults,
# and 412: a schema-valid If-Match that names another version than the stored cluster's.
# A generated body over the service's limit (PLANNER_MAX_BODY_BYTES: a run's `log` may be megabytes)
# is refused unread with a 413 problem+json, which negative-data rejection takes besides its defaults.
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "positive_data_acceptance": {
                "expected-statuses": ["2XX", "3XX", "401", "403", "404", "409", "412", "422", "429", "5XX"]
            },
            "negative_data_rejection": {
                "expected-statuses": [
                    *("400", "401", "403", "404", "405", "406", "409", "412", "413", "415", "422", "428"),
                    "429",
                    "5XX",
                ]
            },
        }
    }
)
pytestmark = pytest.mark.db  # CI's PostgreSQL pass runs it again there

# Its own database: the rows the fuzzer stores must not meet the other tests' empty-table checks.
if os.environ.get("PLANNER_TEST_DATABASE_URL"):
    DATABASE_URL = sibling_postgres_database(os.environ["PLANNER_TEST_DATABASE_URL"], "fuzz")
    reset_postgres_schema(DATABASE_URL)
else:
    DATABASE_URL = f"sqlite:///{Path(tempfile.mkdtemp(prefix='trainplan-fuzz-')) / 'fuzz.db'}"
command.upgrade(alembic_config(DATABASE_URL), "head")
APP = create_app(Settings(database_url=DATABASE_URL))
schema = openapi.from_asgi("/openapi.json", APP, config=CONFIG)

# Stored rows and catalog names, so that generated requests reach the deep paths (a stored cluster, a
# plan with its artifacts and runs, a search on a real preset) and not only the 404s and 422s that
# random ids and names meet.
with TestClient(APP) as _seed:
    _cluster = _seed.post(
        "/v1/clusters", json={"name": "fuzz", "gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8}
    )
    _plan = _seed.post(
        "/v1/plans",
        json={
            "model": {"preset": "gpt2"},
            "cluster": {"id": _cluster.json()["id"]},
            "training": {"seq_len": 512, "global_batch_size": 16},
            "constraints": {"top_k": 1, "frameworks": ["deepspeed"]},
            "launchers": ["deepspeed"],
        },
    ).json()
    _run = _seed.post(f"/v1/plans/{_plan['id']}/runs", json={"step_s": 1.0}).json()
STORED = {
    "cluster_id": _cluster.json()["id"],
    "plan_id": _plan["id"],
    "run_id": _run["id"],
    "name": _plan["artifacts"][0]["name"],
}
PRESETS = ["gpt2", "llama-3.1-8b", "mixtral-8x7b"]
GPUS = ["h100-sxm-80gb", "a100-sxm-80gb"]


def _pick(generated: object, choices: list[str]) -> str | None:
    """A stored value for about half of the generated ones (chosen by the value, so a case replays)."""
    digest = sum(map(ord, str(generated)))
    return choices[digest % len(choices)] if digest % 2 == 0 else None


@schema.hook
def map_path_parameters(_ctx: Any, path_parameters: dict[str, Any] | None) -> dict[str, Any] | None:
    if path_parameters is None:
        return None
    for name, value in path_parameters.items():
        if name in STORED and _pick(value, [STORED[name]]) is not None:
            path_parameters[name] = STORED[name]
    return path_parameters


@schema.hook
def map_body(_ctx: Any, body: Any) -> Any:
    if not isinstance(body, dict):
        return body
    model = body.get("model")
    if isinstance(model, dict) and "preset" in model and (preset := _pick(model["preset"], PRESETS)):
        model["preset"] = preset
    cluster = body.get("cluster")
    if isinstance(cluster, dict):
        if isinstance(cluster.get("gpu"), str) and (gpu := _pick(cluster["gpu"], GPUS)):
            cluster["gpu"] = gpu
        if "id" in cluster and _pick(cluster["id"], [STORED["cluster_id"]]):
            cluster["id"] = STORED["cluster_id"]
    if isinstance(body.get("gpu"), str) and (gpu := _pick(body["gpu"], GPUS)):
        body["gpu"] = gpu
    return body


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented(case: Any) -> None:
    case.call_and_validate(checks=EVERY_CHECK)
