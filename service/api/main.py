"""`api_router`: every resource router, included once; `service.main` mounts it on the app.

The only module that imports routers (tests/api/test_router_imports.py); kept out of
`service/api/__init__.py`, so that importing a schema module (as `service.planning` does)
does not import every router, and FastAPI with them.
"""

from fastapi import APIRouter

from service.api import capacity, clusters, estimates, gpus, health, models, plans, web

api_router = APIRouter()
api_router.include_router(health.router)
api_router.include_router(gpus.router)
api_router.include_router(models.router)
api_router.include_router(clusters.router)
api_router.include_router(estimates.router)
api_router.include_router(plans.router)
api_router.include_router(capacity.router)
api_router.include_router(web.router)
