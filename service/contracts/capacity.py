"""Capacity: GPUs needed and time to train, across GPU types or stored clusters."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from service.catalog.errors import UnknownCatalogEntry
from service.contracts.common import FieldError, Strict, documented_maximum, no_documented_default
from service.contracts.gpus import gpu_slug
from service.contracts.models import ModelRef
from service.contracts.plans import MAX_GPU_HOUR_COST, ConstraintsIn
from service.contracts.training import TrainingIn
from service.estimator.scale import MAX_GPUS
from service.recommender.types import Objective

MAX_COMPARED = 64  # GPU names, cluster ids or prices in one capacity request
MAX_NAME_CHARS = 128  # of a GPU name


class CapacityConstraintsIn(ConstraintsIn):
    """A plan's constraints as capacity reads them: the fewest GPUs of each type (its one objective),
    and offload opt-in (with unstated host RAM and NVMe it would make any model "fit" on two cards at
    offload speed). The defaults say so, so that a generated client sending every default is read as
    the request it is (it sent throughput, top_k 3 and allow_offload true, a plan's defaults: 422s,
    or offload on; client-integration and stop-44 reviews)."""

    objective: Objective = Objective.FEWEST_GPUS
    allow_offload: bool = False


class CapacityRequest(Strict):
    """GPUs needed and time to train, across GPU types (default: the catalog) or stored clusters."""

    model: ModelRef
    training: TrainingIn
    gpus: list[Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_COMPARED,
        description='catalog GPU names; one that names several parts ("h100") stands for each of them',
    )
    cluster_ids: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_COMPARED,
        description="stored clusters (ids as ClusterRef takes them)",
    )
    gpus_per_node: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="node size for catalog GPUs (default: each part's reference node, GET /v1/gpus "
        "gpus_per_node, else 8)",
    )
    max_nodes: int = Field(
        default=1024,
        ge=1,
        le=100_000,
        description="largest count of nodes searched for catalog GPUs; left out: 1,024, or as many as "
        "at_gpus needs (cluster_ids: each cluster's own nodes, and max_nodes is refused)",
        json_schema_extra=no_documented_default,  # sent at 1,024 by a generated client beside cluster_ids
    )
    at_gpus: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS.limit,
        description="time the run on this many GPUs",
        json_schema_extra=documented_maximum(MAX_GPUS.limit),  # scale.py's bound, refused with its reason
    )
    gpu_hour_cost: float | dict[str, float] | None = Field(
        default=None,
        description="one price per GPU-hour, or one per GPU name (or family); with cluster_ids, a stored "
        "cluster's id prices that cluster alone (an on-demand and a reserved pool of one GPU type)",
    )
    constraints: CapacityConstraintsIn = Field(default_factory=CapacityConstraintsIn)

    @field_validator("gpus", mode="before")
    @classmethod
    def _catalog_gpus(cls, value: Any) -> Any:
        # each as the catalog's slugs ("H100 SXM5 80GB" -> "h100-sxm-80gb"), a family every part of it
        # ("h100": the four H100s, compared side by side, as capacity compares the whole catalog)
        if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
            return value  # pydantic names what is not a string
        if len(value) > MAX_COMPARED:
            return value  # refused by the field's max_length before any name is resolved
        return list(dict.fromkeys(slug for name in value for slug in _family(name)))

    @field_validator("gpu_hour_cost", mode="before")
    @classmethod
    def _catalog_prices(cls, value: Any, info: ValidationInfo) -> Any:
        # a price per GPU by the same names; a family's price is each of its parts the request compares
        # (a key that names none of them is kept, and refused naming it: it would price nothing)
        if not isinstance(value, dict):
            return value
        if len(value) > MAX_COMPARED:  # before any name is resolved: 40,000 keys took a minute
            raise ValueError(
                f"gpu_hour_cost prices {len(value):,} names; at most {MAX_COMPARED} (one per GPU type, "
                "family or cluster the request compares)"
            )
        longest = max((len(name) for name in value if isinstance(name, str)), default=0)
        if longest > MAX_NAME_CHARS:  # as a name in gpus; echoed in the refusal of a name it does not know
            raise ValueError(f"gpu_hour_cost names a GPU in {longest:,} characters; at most {MAX_NAME_CHARS}")
        return family_prices(value, info.data.get("gpus"), clustered=info.data.get("cluster_ids") is not None)

    @model_validator(mode="after")
    def _one_source(self) -> CapacityRequest:
        if self.gpus is not None and self.cluster_ids is not None:
            raise FieldError("give gpus or cluster_ids, not both", "cluster_ids")
        if self.cluster_ids is not None:
            for field in ("gpus_per_node", "max_nodes"):
                if field in self.model_fields_set:  # an input the answer would not use is refused
                    raise FieldError(
                        f"{field} sizes the catalog's GPUs; a stored cluster is searched on its own nodes, "
                        "up to its own GPUs: leave it out with cluster_ids",
                        field,
                    )
            self.cluster_ids = list(dict.fromkeys(self.cluster_ids))  # one option each, as gpus
        # inputs a capacity answer would not use are refused, not dropped (capacity-planner review:
        # objective cost and max_gpus 1 answered 16 GPUs, "fits", without a word)
        if self.constraints.objective is not Objective.FEWEST_GPUS:
            raise FieldError(
                f"constraints.objective {self.constraints.objective.value}: capacity finds the fewest GPUs "
                "of each type that hold the job (and times it on at_gpus where given); ranking by "
                "objective is a plan's (POST /v1/plans): leave it out",
                "constraints.objective",
            )
        if self.constraints.top_k != CapacityConstraintsIn.model_fields["top_k"].default:
            raise FieldError(
                "constraints.top_k: capacity answers one option per GPU type or cluster; leave it out",
                "constraints.top_k",
            )
        if self.gpu_hour_cost is not None and self.constraints.gpu_hour_cost is not None:
            raise FieldError(
                "give the price once: gpu_hour_cost (one, or one per GPU) or constraints.gpu_hour_cost",
                "constraints.gpu_hour_cost",
            )
        if self.constraints.allow_offload and self.cluster_ids is None:
            # an input the answer would not use: a catalog card's nodes state no host RAM or NVMe, so
            # nothing is offloaded and "allowed" answered as if refused (CLI review)
            raise FieldError(
                "the catalog's cards come with no host RAM or NVMe stated, so nothing can be offloaded "
                "there; store a cluster that states cpu_memory_bytes_per_node "
                "(or nvme_bytes_per_node) and give its id in cluster_ids, or leave it out",
                "constraints.allow_offload",
            )
        cap = self.constraints.max_gpus
        if cap is not None and self.at_gpus is not None and self.at_gpus > cap:
            raise FieldError(
                f"at_gpus {self.at_gpus:,} is past constraints.max_gpus {cap:,}", "at_gpus", limit=cap
            )
        prices = self.gpu_hour_cost
        values = prices.values() if isinstance(prices, dict) else [prices] if prices is not None else []
        if any(v < 0 for v in values):
            raise FieldError("gpu_hour_cost must be >= 0", "gpu_hour_cost", least=0.0)
        if any(v > MAX_GPU_HOUR_COST for v in values):  # as a plan's constraints.gpu_hour_cost
            raise FieldError(
                f"gpu_hour_cost must be <= {MAX_GPU_HOUR_COST:,.0f} per GPU-hour",
                "gpu_hour_cost",
                limit=int(MAX_GPU_HOUR_COST),
            )
        return self


def family_prices(
    value: dict[Any, Any], compared: list[str] | None, *, clustered: bool = False
) -> dict[Any, Any]:
    """A price per GPU by the request's names: a family's price is each of its parts the request
    compares (``compared``: the GPU types; None: the catalog), a key that names none of them kept,
    and refused naming it (it would price nothing). ``clustered``: the parts are the stored clusters',
    read later: a family name is kept for ``family_prices`` again with their GPU names (a family
    priced against clusters was refused naming parts the request never wrote)."""
    prices: dict[Any, Any] = {}
    named_by: dict[Any, Any] = {}  # the key that priced each part first
    for name, price in value.items():
        parts = _family(name)
        if len(parts) > 1 and clustered:
            parts = [name]
        elif len(parts) > 1 and compared is not None:
            parts = [part for part in parts if part in compared] or [name]
        for slug in parts:
            if slug in prices and _as_number(prices[slug]) != _as_number(price):
                # named by the key that priced it again, the other key in the words (the field read
                # "gpu_hour_cost.gpu_hour_cost", the words named the key itself: cost review)
                raise FieldError(
                    f"gpu_hour_cost prices {slug} twice, differently: {named_by[slug]!r} at "
                    f"{prices[slug]}, {name!r} at {price}",
                    str(name),
                )
            prices[slug] = price
            named_by.setdefault(slug, name)
    return prices


def _as_number(price: Any) -> Any:
    """A price as the number pydantic makes of it after this validator ("2.5" and 2.5 are one price: the
    two were refused as differing, "at 2.5, at 2.5": review of this stop); as given where it is none."""
    try:
        return float(price)
    except (TypeError, ValueError):
        return price


def _family(name: str) -> list[str]:
    """The catalog slugs a capacity request's GPU name stands for: its one part (``gpu_slug``), every
    part it names where it names several ("h100", "a100 80gb"), or the name as given (unknown: refused
    later, naming the field)."""
    try:
        return [gpu_slug(name)]
    except UnknownCatalogEntry as exc:
        return list(exc.candidates) if exc.ambiguous else [name]


class CapacityOptionOut(BaseModel):
    gpu: str
    cluster_id: str | None = None
    fits: bool | None = Field(
        description="whether a layout fits on min_gpus; null: unknown, its share of the request's budget "
        "ran out before it found one (truncated, note)"
    )
    min_gpus: int | None
    min_nodes: int | None
    gpus_per_node: int | None = Field(default=None, description="GPUs per node it was placed in")
    inter_node_bandwidth_bytes_per_s: float | None = Field(
        default=None,
        description="network per GPU between its nodes where it spans several: the stored cluster's, or "
        "the part's reference node's (GET /v1/gpus node_network_bytes_per_s; PCIe cards: a 100 Gb/s "
        "port per 8 GPUs)",
    )
    layout: dict[str, Any] | None
    num_gpus: int | None = Field(description="GPUs the time below was computed on")
    tokens_per_s: float | None
    time_to_train_s: float | None
    gpu_hours: float | None
    cost: float | None
    note: str
    evaluations: int = Field(description="layout evaluations spent on this option, of the request's budget")
    truncated: bool = Field(description="its share of the request's evaluation budget ran out (see note)")


class CapacityOut(BaseModel):
    options: list[CapacityOptionOut] = Field(
        description="fitting options first, fastest to train first; then the unknown (fits null), then those "
        "that do not fit"
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="what the model's config states that no figure reads (a checkpoint planned dequantized "
        "from its stored format, a multimodal config's vision tower), as every estimate's warnings say it",
    )
    duration_s: float
