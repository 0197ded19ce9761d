"""The web shell: one thin router per resource."""

from fastapi import APIRouter

from service.api import capacity, clusters, estimates, gpus, health, models, plans

api_router = APIRouter()
api_router.include_router(health.router)
api_router.include_router(gpus.router)
api_router.include_router(models.router)
api_router.include_router(clusters.router)
api_router.include_router(estimates.router)
api_router.include_router(plans.router)
api_router.include_router(capacity.router)
