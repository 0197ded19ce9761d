"""POST /v1/capacity: how many GPUs of each type a job needs, and how long it trains on them."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from fastapi import APIRouter

from service.api.deps import ClusterRepoDep
from service.api.estimates import resolve_cluster
from service.api.problems import PROBLEM_RESPONSES
from service.api.schemas.capacity import CapacityOptionOut, CapacityOut, CapacityRequest
from service.api.schemas.clusters import ClusterRef
from service.api.schemas.gpus import resolve_gpu
from service.catalog.efficiency import default_efficiency
from service.recommender.capacity import CapacityOption, capacity
from service.recommender.types import Objective

router = APIRouter(prefix="/v1/capacity", tags=["capacity"], responses=PROBLEM_RESPONSES)


@router.post("", response_model=CapacityOut)
def plan_capacity(body: CapacityRequest, clusters: ClusterRepoDep) -> CapacityOut:
    started = time.perf_counter()
    model = body.model.to_domain()
    training = body.training.to_domain()
    constraints = dataclasses.replace(body.constraints.to_domain(), objective=Objective.FEWEST_GPUS)
    stored = [resolve_cluster(ClusterRef(id=cid), clusters) for cid in body.cluster_ids or []]
    gpus = [resolve_gpu(name, field=f"gpus.{i}") for i, name in enumerate(body.gpus or [])]
    prices = body.gpu_hour_cost
    per_gpu_price = prices if isinstance(prices, dict) else None
    if isinstance(prices, float | int):
        constraints = dataclasses.replace(constraints, gpu_hour_cost=float(prices))
    curve = default_efficiency()

    def options(**source: Any) -> tuple[CapacityOption, ...]:
        return capacity(
            model,
            training,
            curve,
            constraints=constraints,
            gpus_per_node=body.gpus_per_node,
            max_nodes=body.max_nodes,
            at_gpus=body.at_gpus,
            gpu_hour_cost=per_gpu_price,
            **source,
        )

    found: list[tuple[CapacityOption, str | None]] = []
    if stored:  # one call per cluster, so each option keeps the id it answers for
        for cid, spec in zip(body.cluster_ids or [], stored, strict=True):
            found += [(o, cid) for o in options(clusters=[spec])]
    else:
        found = [(o, None) for o in options(gpus=gpus)]
    found.sort(
        key=lambda pair: (not pair[0].fits, pair[0].time_to_train_s or float("inf"), pair[0].min_gpus or 0)
    )
    out = [
        CapacityOptionOut(
            **{f.name: getattr(o, f.name) for f in dataclasses.fields(o) if f.name != "layout"},
            layout=dataclasses.asdict(o.layout) if o.layout else None,
            cluster_id=cid,
        )
        for o, cid in found
    ]
    return CapacityOut(options=out, duration_s=time.perf_counter() - started)
