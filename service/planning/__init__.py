"""The service's workflows, one implementation for every face (the HTTP routers today, a CLI and
a web page later): estimates, plans (headroom from calibration, search, launcher files,
storage), runs and calibration, capacity; writes are retry-safe through Idempotency-Keys.

Functions take the caller's SQLAlchemy session and work inside its transaction: they add and
flush, the caller commits (for HTTP, `service.api.deps.get_session`). Requests and answers are
the contract of `service.contracts` (wire schemas and stored results); errors are
`service.errors.ServiceError`s. Nothing here imports FastAPI or service.api
(tests/planning/test_no_web_framework.py checks both).
"""

from service.planning.capacity import capacity_for
from service.planning.estimates import estimate_for
from service.planning.idempotency import Outcome
from service.planning.plans import create_plan, delete_plan, plan_out, stored_artifacts, stored_plan
from service.planning.runs import add_run, run_out

__all__ = [
    "Outcome",
    "add_run",
    "capacity_for",
    "create_plan",
    "delete_plan",
    "estimate_for",
    "plan_out",
    "run_out",
    "stored_artifacts",
    "stored_plan",
]
