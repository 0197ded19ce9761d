"""The CLI's ``trainplan plan --json`` and the API's ``POST /v1/plans`` give the same plan for the
same job (issue 24: one code path), and the CLI's exit code says what the API's status says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from service.cli import main
from tests.invariants import checks
from tests.invariants.checks import minimal_plan_request
from tests.invariants.test_api_invariants import assert_none

# a feasible job, the V100 job that must plan without naming precision or attention, an infeasible
# one whose suggestions both faces must list alike, and a foreach one (the CLI's own flag)
JOBS: list[tuple[str, str, int, int, int, int, str]] = [
    ("llama-3.1-8b", "h100-sxm-80gb", 1, 8, 4096, 64, "full"),
    ("llama-2-13b", "v100-sxm2-32gb", 1, 4, 4096, 32, "full"),
    ("llama-3.1-70b", "rtx-4090-24gb", 1, 2, 4096, 16, "qlora"),
    ("llama-3.2-1b", "rtx-4090-24gb", 1, 1, 256, 1, "full+foreach"),  # --optimizer-implementation
]


@pytest.fixture
def cli_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The CLI's own in-process service, on a database of its own."""
    from service.settings import get_settings

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("PLANNER_DATABASE_URL", url)
    # the same wall-time budget as the API fixture's (tests/conftest.py): a budget cut by the
    # machine's load, not by the request, would make the two faces differ
    monkeypatch.setenv("PLANNER_REQUEST_BUDGET_S", "60")
    get_settings.cache_clear()
    yield url
    get_settings.cache_clear()


@pytest.mark.parametrize("job", JOBS, ids=[f"{j[0]}-{j[2] * j[3]}x{j[1]}-{j[6]}" for j in JOBS])
def test_cli_json_equals_the_api(client: TestClient, cli_database: str, job: tuple[Any, ...]) -> None:
    request = minimal_plan_request(*job)
    response = client.post("/v1/plans", json=request)
    api_status, api_plan = response.status_code, response.json()
    result = CliRunner().invoke(main, checks.cli_args(request), catch_exceptions=False)
    violations = checks.check_status(request, api_status, api_plan, minimal=True)
    if api_status == 201:
        try:
            cli_plan = json.loads(result.stdout)
        except ValueError:
            pytest.fail(f"CLI exit {result.exit_code}, no JSON plan: {result.output[-500:]}")
        violations += checks.check_cli_agrees(request, api_plan, cli_plan, result.exit_code)
    assert_none(violations)
