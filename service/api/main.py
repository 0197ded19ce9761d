"""`api_router`: every resource router, included once; `service.main` mounts it on the app.

The only module that imports routers (tests/api/test_router_imports.py); kept out of
`service/api/__init__.py`, so that importing a schema module (as `service.planning` does)
does not import every router, and FastAPI with them.
"""

from fastapi import APIRouter

from service.api import api_keys, capacity, clusters, estimates, gpus, health, models, plans, web
from service.api.deps import Authenticated, KnownQuery

api_router = APIRouter()
# Open: liveness, readiness, metrics and the page (which asks for a key when the API needs one).
api_router.include_router(health.router)
api_router.include_router(web.router)
# Everything under /v1 acts for an API key's owner, with the scope its method needs, and takes
# only the query parameters it declares.
for module in (gpus, models, clusters, estimates, plans, capacity, api_keys):
    api_router.include_router(module.router, dependencies=[Authenticated, KnownQuery])
# The design's unversioned plan paths, deprecated aliases of /v1/plans with the same authentication.
api_router.include_router(plans.unversioned, dependencies=[Authenticated, KnownQuery])
