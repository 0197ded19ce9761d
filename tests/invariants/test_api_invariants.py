"""Issue 24's API-level invariants on a small deterministic grid of plan requests that name only
model, cluster and training (plans take 0.05-2 s each; ``bench/invariant_sweep.py`` runs the same
checks over every preset x every catalog GPU x full/LoRA/QLoRA).

Each failure message lists every broken promise with the request that shows it.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.invariants import checks
from tests.invariants.checks import Post, Violation, minimal_plan_request

# (preset, GPU, nodes, GPUs per node, seq_len, global batch, method): ordinary requests of the kinds
# issue 24 tried, feasible and not, each GPU generation, each method.
GRID: list[tuple[str, str, int, int, int, int, str]] = [
    ("llama-3.1-8b", "h100-sxm-80gb", 1, 8, 4096, 64, "full"),  # the README's job
    ("llama-2-13b", "v100-sxm2-32gb", 1, 4, 4096, 32, "full"),  # the write-up's V100 scenario
    ("llama-3.1-70b", "rtx-4090-24gb", 1, 2, 4096, 16, "qlora"),  # the hobbyist's question
    ("mixtral-8x7b", "h100-sxm-80gb", 1, 8, 4096, 64, "lora"),  # MoE adapters
    ("qwen2.5-0.5b", "rtx-3090-24gb", 1, 1, 2048, 8, "full"),  # one consumer card
    ("llama-3.1-70b", "a100-sxm-80gb", 1, 8, 8192, 64, "full"),  # too big: suggestions
    ("gemma-2-9b", "v100-sxm2-16gb", 1, 8, 2048, 32, "lora"),  # pre-Ampere, LoRA
    ("qwen3-30b-a3b", "l40s-48gb", 2, 4, 4096, 32, "full"),  # two nodes of PCIe cards
    ("llama-3.2-1b", "rtx-4090-24gb", 1, 1, 256, 1, "full+foreach"),  # foreach AdamW: suggests fused
]
IDS = [f"{p}-{n * g}x{gpu}-{m}" for p, gpu, n, g, _, _, m in GRID]

# plans depend only on the request while no runs are stored: computed once per module
_PLANS: dict[tuple[Any, ...], tuple[int, Any]] = {}


def poster(client: TestClient) -> Post:
    def post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        response = client.post(path, json=body)
        return response.status_code, response.json()

    return post


def planned(client: TestClient, case: tuple[Any, ...]) -> tuple[dict[str, Any], int, Any]:
    request = minimal_plan_request(*case)
    if case not in _PLANS:
        _PLANS[case] = poster(client)("/v1/plans", request)
    status, body = _PLANS[case]
    return request, status, body


def assert_none(violations: list[Violation]) -> None:
    assert not violations, "\n".join(str(v) for v in violations)


def feasible_or_infeasible(
    client: TestClient, case: tuple[Any, ...]
) -> tuple[dict[str, Any], dict[str, Any]]:
    request, status, body = planned(client, case)
    assert_none(checks.check_status(request, status, body, minimal=True))
    assert status == 201, body
    return request, body


@pytest.mark.parametrize("case", GRID, ids=IDS)
def test_minimal_request_is_never_5xx_nor_422(client: TestClient, case: tuple[Any, ...]) -> None:
    """A request naming only model, cluster and training plans on every catalog GPU: defaults
    resolve from the hardware, and a suggestion that cannot be computed never fails the plan."""
    request, status, body = planned(client, case)
    assert_none(checks.check_status(request, status, body, minimal=True))
    assert status == 201, body


@pytest.mark.parametrize("case", GRID, ids=IDS)
def test_no_candidate_exceeds_the_gpus_peak(client: TestClient, case: tuple[Any, ...]) -> None:
    request, plan = feasible_or_infeasible(client, case)
    assert_none(checks.check_plan_peaks(request, plan))


@pytest.mark.parametrize("case", GRID, ids=IDS)
def test_recommended_plan_reestimates_the_same(client: TestClient, case: tuple[Any, ...]) -> None:
    request, plan = feasible_or_infeasible(client, case)
    assert_none(checks.check_reestimate(poster(client), request, plan))


@pytest.mark.parametrize("case", GRID, ids=IDS)
def test_recommended_plan_does_not_depend_on_top_k(client: TestClient, case: tuple[Any, ...]) -> None:
    request, plan = feasible_or_infeasible(client, case)
    assert_none(checks.check_top_k(poster(client), request, plan))


@pytest.mark.parametrize("case", GRID, ids=IDS)
def test_rationale_numbers_equal_the_estimate(client: TestClient, case: tuple[Any, ...]) -> None:
    request, plan = feasible_or_infeasible(client, case)
    assert_none(checks.check_rationale(request, plan))


@pytest.mark.parametrize("case", GRID, ids=IDS)
def test_every_suggestion_applied_is_feasible(client: TestClient, case: tuple[Any, ...]) -> None:
    """Each suggestion of an infeasible plan, applied as it states (its GPU, count, node shape,
    method, host RAM), gives an estimate of its layout that fits with the numbers it quotes, and a
    plan whose status is feasible."""
    request, plan = feasible_or_infeasible(client, case)
    if plan["status"] == "infeasible":
        assert plan["suggestions"], "an infeasible plan says what would make it fit"
    assert_none(checks.check_suggestions(poster(client), request, plan))


def test_calibrated_estimates_stay_within_the_gpus_peak(client: TestClient) -> None:
    """Runs that report a step far faster than estimated calibrate later estimates on the same
    hardware (the factor is bounded); the calibrated numbers, and the rationale of a plan made
    under them, must still be physically possible and agree with each other."""
    request = minimal_plan_request(*GRID[0])
    post = poster(client)
    status, plan = post("/v1/plans", request)  # stored now: the runs below attach to it
    assert status == 201 and plan["recommended"], plan
    for _ in range(3):
        step_s = plan["recommended"]["estimate"]["time"]["step_s"] / 10
        response = client.post(f"/v1/plans/{plan['id']}/runs", json={"step_s": max(step_s, 1e-3)})
        assert response.status_code == 201, response.text
    status, calibrated = post("/v1/plans", request)  # the same job, now under the runs' factors
    assert status == 201, calibrated
    violations = checks.check_plan_peaks(request, calibrated) + checks.check_rationale(request, calibrated)
    body = checks.reestimate_request(request, plan["recommended"]["layout"])
    status, estimate = post("/v1/estimates", body)
    assert status == 200, estimate
    violations += checks.check_within_peak(body, estimate, "calibrated estimate")
    assert_none(violations)
