"""POST /v1/capacity: how many GPUs of each type a job needs, and how long it trains on them."""

from __future__ import annotations

from fastapi import APIRouter

from service import planning
from service.api.deps import CapacityDeadline, SessionDep
from service.api.problems import PROBLEM_RESPONSES
from service.contracts.capacity import CapacityOut, CapacityRequest

router = APIRouter(prefix="/v1/capacity", tags=["capacity"], responses=PROBLEM_RESPONSES)


@router.post("", response_model=CapacityOut)
def plan_capacity(body: CapacityRequest, deadline: CapacityDeadline, session: SessionDep) -> CapacityOut:
    return planning.capacity_for(session, body, deadline)
