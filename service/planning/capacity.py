"""Capacity: how many GPUs of each type (or of each stored cluster) a job needs, and how long it
trains on them, fitting options first."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from sqlalchemy.orm import Session

from service.catalog.gpus import gpus as catalog_gpus
from service.catalog.tuning import default_tuning
from service.contracts.capacity import CapacityOptionOut, CapacityOut, CapacityRequest, family_prices
from service.contracts.clusters import ClusterRef
from service.contracts.common import FieldError
from service.contracts.gpus import resolve_gpu
from service.errors import ServiceUnavailable, Unprocessable
from service.estimator import estimate
from service.estimator.defaults import for_gpu
from service.estimator.errors import EstimatorError
from service.estimator.params import parameter_counts
from service.estimator.scale import MAX_GPUS
from service.estimator.types import ClusterSpec, Framework, GPUSpec, ModelSpec, TrainingSpec
from service.estimator.validate import attention_precision_violation, hardware_violation
from service.persistence.repository import ClusterRepository, PlanRepository
from service.planning.calibration import calibration_for, hardware_keys, job_traits
from service.planning.clusters import resolve_cluster
from service.planning.estimates import check_priced, check_scale, layout_out, located
from service.planning.runnable import no_framework_runs
from service.recommender.budget import NO_DEADLINE, Deadline, busy_words
from service.recommender.capacity import CapacityOption, capacity, default_cluster, option_order
from service.recommender.space import sub_cluster
from service.recommender.types import Constraints, Objective

_NOT_ON_THE_WIRE = ("layout", "source")  # the layout goes as a dict; the source as the cluster id


def _check_prices(prices: dict[str, float], sources: list[GPUSpec]) -> None:
    """A price per GPU name prices the options of that GPU type; a name no option has would be
    ignored, so it is refused, naming the GPU types the request has (a misspelt "h100" priced
    nothing and the answer said nothing)."""
    names = list(dict.fromkeys(gpu.name for gpu in sources))
    unused = [name for name in prices if name not in names]
    if unused:
        errors = [
            {
                "field": f"gpu_hour_cost.{name}",
                "message": f"no GPU type of the request is named {name!r}; its GPU types: {', '.join(names)}",
                "type": "unused",
            }
            for name in unused
        ]
        raise Unprocessable("; ".join(e["message"] for e in errors), errors=errors)


def _no_framework_runs(
    model: ModelSpec, training: TrainingSpec, constraints: Constraints, sources: list[GPUSpec] | None
) -> Unprocessable | None:
    """The 422 for a job no requested framework runs with any layout on any of the GPU types
    (``planning.runnable``; None: the catalog's), rather than a search of every count on each that
    rejects every layout and reports "no layout fits" or a spent budget. A GPU type that cannot run
    the precision at all is left to its option, which says so."""
    refused = None
    for gpu in sources if sources is not None else list(catalog_gpus().values()):
        try:
            on_gpu = for_gpu(training, gpu, model)
        except EstimatorError:  # what this GPU type cannot run is its option's to say
            continue
        one = default_cluster(gpu, num_nodes=1, gpus_per_node=1)
        if hardware_violation(one, on_gpu) is not None:
            continue
        field = "constraints.frameworks" if constraints.frameworks != tuple(Framework) else "training"
        refused = no_framework_runs(model, one, on_gpu, constraints.frameworks, None, field=field)
        if refused is None:
            return None
    return refused


def _priced(
    option: CapacityOption,
    cluster_id: str | None,
    cluster_price: dict[str, float],
    per_gpu_price: dict[str, float] | None,
    prices: object,
) -> CapacityOption:
    """``option`` at its cluster's own price where the request gave one (its cost is GPU-hours x that
    price), and saying so where a price map left its GPU type (and cluster) out: its cost is null, where
    a price no option used is refused (FinOps review: an unpriced A100 beside a priced H100 said nothing)."""
    if cluster_id is not None and cluster_id in cluster_price:
        price = cluster_price[cluster_id]
        cost = option.gpu_hours * price if option.gpu_hours is not None else None
        return dataclasses.replace(option, cost=cost)
    if isinstance(prices, dict) and option.gpu not in (per_gpu_price or {}) and option.gpu_hours is not None:
        said = (
            f"gpu_hour_cost prices neither cluster {cluster_id} nor {option.gpu}: no cost"
            if cluster_id is not None
            else f"gpu_hour_cost has no price for {option.gpu}: no cost"
        )
        return dataclasses.replace(option, note="; ".join(n for n in (option.note, said) if n))
    return option


def _nodes_for(request: CapacityRequest, gpus: list[GPUSpec]) -> int:
    """``max_nodes`` as asked, or left out, its default grown to hold ``at_gpus`` on every GPU type
    compared: 16,384 GPUs asked were timed on the default 1,024 nodes' 8,192, said in a note alone
    (cost review)."""
    if request.at_gpus is None or "max_nodes" in request.model_fields_set:
        return request.max_nodes
    smallest = min(default_cluster(gpu, 1, request.gpus_per_node).gpus_per_node for gpu in gpus)
    return max(request.max_nodes, -(-request.at_gpus // smallest))


def _check_searched_scale(request: CapacityRequest, gpus: list[GPUSpec]) -> None:
    """The GPU counts a catalog sweep would search and time, bounded as a plan's cluster is
    (``scale.MAX_GPUS``) before any search: ``at_gpus``, and ``max_nodes`` nodes of the largest node
    size compared (a sweep over 800,000 GPUs spent its whole budget where a plan is refused at once:
    bounded-work review, stop 41)."""
    limit = MAX_GPUS.limit
    if request.at_gpus is not None and request.at_gpus > limit:
        message = (
            f"at_gpus: {request.at_gpus:,} is past the {limit:,} GPUs this service plans for (the largest "
            f"published: {MAX_GPUS.reference})"
        )
        raise Unprocessable(
            message, errors=[{"field": "at_gpus", "message": message, "limit": {"le": limit}}]
        )
    largest = max(default_cluster(gpu, request.max_nodes, request.gpus_per_node).world_size for gpu in gpus)
    if largest > limit:
        most = limit // (largest // request.max_nodes)
        message = (
            f"max_nodes: {request.max_nodes:,} nodes of up to {largest // request.max_nodes} GPUs are "
            f"{largest:,} GPUs, past the {limit:,} this service plans for (the largest published: "
            f"{MAX_GPUS.reference}); at most {most:,} nodes"
        )
        raise Unprocessable(
            message, errors=[{"field": "max_nodes", "message": message, "limit": {"le": most}}]
        )


def _calibrated(
    option: CapacityOption,
    cluster: ClusterSpec,
    model: ModelSpec,
    training: TrainingSpec,
    runs: PlanRepository,
) -> CapacityOption:
    """A stored cluster's option under the calibration its runs give the layout's framework and job,
    as a plan or an estimate on that cluster applies it (consistency review: capacity said 145,733
    tokens/s where both said 126,724 after one run 15% slower than estimated). Its memory is said
    where the runs' memory factor takes it past the card; the fewest GPUs stay the search's."""
    layout = option.layout
    if layout is None or option.num_gpus is None or not option.tokens_per_s:
        return option
    on_gpu = for_gpu(training, cluster.gpu, model)
    target = job_traits(parameter_counts(model).total, on_gpu, layout)  # the precision the GPU resolves
    learned = calibration_for(runs, hardware_keys(cluster), layout.framework.value, target)
    calibration = learned.calibration
    if calibration.is_identity:
        return option
    placed = sub_cluster(cluster, option.num_gpus)
    found = estimate(
        model, placed, layout, on_gpu, tuning=default_tuning(), calibration=calibration, with_limits=False
    )
    if found.time is None:
        return option
    slower = option.tokens_per_s / found.time.tokens_per_s
    said = [
        f"calibrated by {calibration.runs} run(s) on this cluster: {found.time.tokens_per_s:,.0f} tokens/s"
    ]
    if not found.fits:
        need, card = found.memory.per_gpu.total / 2**30, found.memory.capacity_bytes / 2**30
        said.append(
            f"under their memory factor the layout needs {need:.1f} GiB of the card's {card:.1f}, so it does "
            "not fit: plan it (POST /v1/plans), which searches with that room"
        )
    return dataclasses.replace(
        option,
        # past the card under the runs' memory factor: not a fit (it said fits beside "needs 81.9 GiB of
        # the card's 80.0" after an out-of-memory run; runs review)
        fits=bool(option.fits) and found.fits,
        tokens_per_s=found.time.tokens_per_s,
        time_to_train_s=option.time_to_train_s * slower if option.time_to_train_s is not None else None,
        gpu_hours=option.gpu_hours * slower if option.gpu_hours is not None else None,
        cost=option.cost * slower if option.cost is not None else None,
        note="; ".join(filter(None, [option.note, *said])),
    )


def capacity_for(session: Session, request: CapacityRequest, deadline: Deadline = NO_DEADLINE) -> CapacityOut:
    started = time.perf_counter()
    clusters = ClusterRepository(session)
    model = request.model.to_domain()
    training = request.training.to_domain(None, model)  # resolved per GPU type by capacity()
    unrunnable = attention_precision_violation(training)  # on no GPU type, so the request is wrong
    if unrunnable is not None:
        raise located(unrunnable)
    check_priced(request.gpu_hour_cost, training)
    # the price in constraints too: a capacity answer ranks by no objective it would scale (it was
    # ignored without tokens, where the same price at the top level was refused: cost review)
    check_priced(request.constraints.gpu_hour_cost, training, "constraints.gpu_hour_cost")
    check_scale(model, None, training)
    constraints = dataclasses.replace(request.constraints.to_domain(), objective=Objective.FEWEST_GPUS)
    stored = [
        resolve_cluster(ClusterRef(id=cid), clusters, field=f"cluster_ids.{i}")
        for i, cid in enumerate(request.cluster_ids or [])
    ]
    gpus = [resolve_gpu(name, field=f"gpus.{i}") for i, name in enumerate(request.gpus or [])]
    if not stored:
        _check_searched_scale(request, gpus or list(catalog_gpus().values()))
    prices = request.gpu_hour_cost
    if isinstance(prices, float | int):
        constraints = dataclasses.replace(constraints, gpu_hour_cost=float(prices))
    # a stored cluster's id prices that cluster alone (two pools of one GPU type at their own rates; the
    # id was refused as "no GPU type": FinOps review); the other keys price GPU types as before
    stored_ids = set(request.cluster_ids or [])
    priced = prices if isinstance(prices, dict) else {}
    cluster_price = {key: float(price) for key, price in priced.items() if key in stored_ids}
    per_gpu_price = {key: price for key, price in priced.items() if key not in stored_ids} or None
    if per_gpu_price is not None and stored:  # a family name prices the clusters' parts of it
        try:
            per_gpu_price = family_prices(per_gpu_price, [c.gpu.name for c in stored])
        except FieldError as exc:
            field = f"gpu_hour_cost.{exc.field}"  # the key of the price map (family_prices)
            raise Unprocessable(str(exc), errors=[{"field": field, "message": str(exc)}]) from exc
    if per_gpu_price is not None:
        _check_prices(per_gpu_price, [c.gpu for c in stored] or gpus or list(catalog_gpus().values()))
    no_framework = _no_framework_runs(model, training, constraints, [c.gpu for c in stored] or gpus or None)
    if no_framework is not None:
        raise no_framework
    tuning = default_tuning()
    budget = deadline.budget(
        constraints.max_evaluations, stated=request.constraints.max_evaluations is not None
    )
    max_nodes = (
        _nodes_for(request, gpus or list(catalog_gpus().values())) if not stored else request.max_nodes
    )

    def options(**source: Any) -> tuple[CapacityOption, ...]:
        return capacity(
            model,
            training,
            tuning,
            constraints=constraints,
            budget=budget,
            gpus_per_node=request.gpus_per_node,
            max_nodes=max_nodes,
            at_gpus=request.at_gpus,
            gpu_hour_cost=per_gpu_price,
            **source,
        )

    # One call for every source, so that they share the request's evaluation budget.
    found: list[tuple[CapacityOption, str | None]]
    if stored:
        ids = request.cluster_ids or []
        runs = PlanRepository(session)
        found = [
            (_calibrated(o, stored[o.source], model, training, runs), ids[o.source])
            for o in options(clusters=stored)
        ]
    else:
        found = [(o, None) for o in options(gpus=gpus)]
    if budget.reason == "busy":  # options cut for want of CPU others took: retried, not answered
        raise ServiceUnavailable(busy_words(deadline))
    found = [(_priced(o, cid, cluster_price, per_gpu_price, prices), cid) for o, cid in found]
    found.sort(key=lambda pair: option_order(pair[0]))
    out = [
        CapacityOptionOut(
            **{
                f.name: getattr(o, f.name)
                for f in dataclasses.fields(o)
                if f.name not in ("layout", "source")
            },
            layout=layout_out(o.layout, training) if o.layout else None,
            cluster_id=cid,
        )
        for o, cid in found
    ]
    return CapacityOut(
        options=out, warnings=list(model.config_notes), duration_s=time.perf_counter() - started
    )
