"""POST /v1/estimates: every number for one layout; nothing is stored."""

from __future__ import annotations

from fastapi import APIRouter

from service import planning
from service.api.deps import EstimateSlot, SessionDep
from service.api.problems import PROBLEM_RESPONSES
from service.contracts.estimates import EstimateOut, EstimateRequest

router = APIRouter(prefix="/v1/estimates", tags=["estimates"], responses=PROBLEM_RESPONSES)


@router.post("", response_model=EstimateOut, dependencies=[EstimateSlot])
def create_estimate(body: EstimateRequest, session: SessionDep) -> EstimateOut:
    return planning.estimate_for(session, body)
