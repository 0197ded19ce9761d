"""docker-compose.yml follows the Compose Specification (schema in ../shared/reference/schemas)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT.parent / "shared" / "reference" / "schemas" / "compose-spec.json"


def test_compose_file_is_valid_and_waits_for_a_healthy_migrated_database() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    if not SCHEMA.exists():
        pytest.skip(f"compose schema not found at {SCHEMA}")
    jsonschema.Draft7Validator(json.loads(SCHEMA.read_text())).validate(compose)
    api = compose["services"]["api"]
    assert api["depends_on"]["db"]["condition"] == "service_healthy"
    assert "healthcheck" in compose["services"]["db"]
    assert api["environment"]["PLANNER_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "pgdata" in compose["volumes"]
    # Replicas (--scale api=N): migrated once before any starts, each on its own host port.
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    migrate = " ".join(compose["services"]["migrate"]["command"])
    assert "python -m service.settings && python -m service.persistence.schema" in migrate
    assert "schema" not in " ".join(api["command"]) and "python -m service.settings" in " ".join(
        api["command"]
    )
    assert api["ports"] == ["8000-8015:8000"]
