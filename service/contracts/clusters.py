"""Clusters: stored ones (create, patch, out) and the cluster of a request, by id or inline."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from service.catalog.errors import UnknownCatalogEntry
from service.contracts.common import (
    MAX_BANDWIDTH_BYTES_PER_S,
    MAX_MEMORY_BYTES,
    MAX_NVME_BYTES,
    MIN_BANDWIDTH_BYTES_PER_S,
    FieldError,
    Strict,
    catalog_slug,
    documented_maximum,
    no_documented_default,
)
from service.contracts.gpus import CustomGPU, gpu_slug, reference_node, resolve_gpu, unknown_entry_error
from service.errors import Unprocessable
from service.estimator.errors import EstimatorError
from service.estimator.scale import MAX_GPUS
from service.estimator.types import ClusterSpec
from service.recommender.suggest import REFERENCE_NODE_GPUS

# What to measure, and which link each figure stands for (nccl-tests doc/PERFORMANCE.md: busbw =
# algbw x 2(n-1)/n for all-reduce, comparable to the per-direction link whatever n is).
_MEASURED = (
    "Optional: NCCL's achieved bus bandwidth per GPU, bytes/s (the *_gbps twin takes GB/s): nccl-tests "
    "all_reduce_perf's busbw column at large messages (>= 1 GiB, e.g. -b 1G -e 8G -f 2; the plateau), "
    "best with NCCL_ALGO=Ring, the rings and trees the estimate times. "
)
_USED = (
    " Collectives on this link are then timed at it instead of the nominal bandwidth x the tuning's bus "
    "efficiency; latencies stay the tuning's. In-network reduction (NVLS on NVSwitch, SHARP), NCCL's "
    "default where present, lifts an all-reduce's busbw above the link: accepted up to 2x the link, "
    "and used at the link, since the sends, rings and all-to-alls timed here do not reduce in the switch."
)
MEASURED_INTRA_DESCRIPTION = (
    _MEASURED + "Measured on one node, across all its GPUs (e.g. all_reduce_perf -g <gpus_per_node>)." + _USED
)
MEASURED_INTER_DESCRIPTION = (
    _MEASURED
    + "Each GPU's share of the network, like inter_node_bandwidth_bytes_per_s: run across >= 2 nodes with "
    "every GPU of each node and give its busbw / gpus_per_node (NCCL's rings cross the nodes on every "
    "NIC at once, so that busbw is about the node's network). A run with one GPU per node measures the "
    "NIC that one GPU reaches: each GPU's share only where every GPU has its own NIC (rail-optimised "
    "nodes); where several share one (a 25 GbE port for 8 GPUs), divide it by the GPUs per NIC. "
    "Refused on one node (nothing crosses a network)." + _USED
)


# Typos' bounds: the largest published run had 2,048 nodes of 8 (Llama 3, arXiv:2407.21783); the
# catalog's nodes hold 4 or 8.
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 64
# Up to this many PCIe cards or custom GPUs given as num_gpus alone are one node of them: the server of
# PCIe cards capacity sweeps and suggestions assume (suggest.REFERENCE_NODE_GPUS, with its sources)
ONE_NODE_OF_CARDS = REFERENCE_NODE_GPUS


def _num_gpus_plannable(count: int, per_node: int) -> None:
    """num_gpus given instead of num_nodes, past what the planner or a cluster's node count allows:
    refused naming num_gpus, where the bounds of the nodes it derives would name num_nodes, a field
    the request did not send, with a limit in nodes."""
    most = min(MAX_GPUS.limit, MAX_NODES * per_node)
    if count > most:
        why = (
            f"the {MAX_GPUS.limit:,} GPUs the planner handles (16x the largest published run: "
            f"{MAX_GPUS.reference})"
            if most == MAX_GPUS.limit
            else f"{MAX_NODES:,} nodes of {per_node} GPUs"
        )
        raise FieldError(f"num_gpus ({count:,}) is past {why}", "num_gpus", most)


def gbps_twins_sent(value: Any) -> dict[str, str]:
    """The `X_gbps` twins a request body sent, by the `X_bytes_per_s` field each stands for: what its
    errors name (a request that sent inter_node_bandwidth_gbps was told of ..._bytes_per_s)."""
    if not isinstance(value, dict):
        return {}
    return {
        key.removesuffix("_gbps") + "_bytes_per_s": key
        for key in value
        if isinstance(key, str) and key.endswith("_gbps")
    }


class ClusterShape(Strict):
    """The hardware of a cluster; bandwidths per GPU, one direction, bytes/s."""

    # left out, filled from the catalog part's node before validation (``_from_catalog``)
    catalog_filled: ClassVar[tuple[str, ...]] = ("gpus_per_node",)

    gpu: str | CustomGPU = Field(
        description="a catalog GPU name (GET /v1/gpus; its published name or words only it carries are "
        "read as it, and the answer names it) or a custom spec"
    )
    num_nodes: int = Field(
        default=1,
        ge=1,
        le=MAX_NODES,
        description="nodes of gpus_per_node GPUs; left out (or null): num_gpus over gpus_per_node, else 1",
        json_schema_extra=no_documented_default,  # sent at 1 beside num_gpus 16: one node of 16, or a 422
    )
    num_gpus: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS.limit,
        json_schema_extra=documented_maximum(MAX_GPUS.limit),  # refused past it naming the planner's bound
        description="all the GPUs, instead of num_nodes: whole nodes of gpus_per_node (the part's node when "
        "left out; fewer GPUs than a node are one node of them; up to "
        f"{ONE_NODE_OF_CARDS} PCIe cards or custom GPUs one node of them); num_nodes x gpus_per_node "
        "when both are given",
    )
    gpus_per_node: int = Field(
        ge=1,
        le=MAX_GPUS_PER_NODE,
        description="may be left out for a catalog part that ships in a node: that node's (8 on an HGX "
        f"baseboard; GET /v1/gpus gpus_per_node), and with num_gpus up to {ONE_NODE_OF_CARDS} (one node "
        "of them); else a PCIe card or custom GPU states it",
    )
    intra_node_bandwidth_bytes_per_s: float | None = Field(
        default=None,
        ge=MIN_BANDWIDTH_BYTES_PER_S,
        le=MAX_BANDWIDTH_BYTES_PER_S,
        description="default: the GPU's NVLink/PCIe figure",
    )
    inter_node_bandwidth_bytes_per_s: float | None = Field(
        default=None,
        ge=MIN_BANDWIDTH_BYTES_PER_S,
        le=MAX_BANDWIDTH_BYTES_PER_S,
        description="each GPU's share of the node's network, one direction (4 x 400 Gb/s NICs for 8 GPUs: "
        "25e9). Left out on more than one node: the network of the node the GPU ships in (the catalog's "
        "reference system: H100 SXM's DGX H100, 50e9), said in the answer's defaulted list; required for a "
        "GPU without one (a PCIe card, a custom GPU)",
    )
    cpu_memory_bytes_per_node: int = Field(default=0, ge=0, le=MAX_MEMORY_BYTES)
    nvme_bytes_per_node: int = Field(default=0, ge=0, le=MAX_NVME_BYTES)
    measured_intra_node_bus_bandwidth_bytes_per_s: float | None = Field(
        default=None,
        ge=MIN_BANDWIDTH_BYTES_PER_S,
        le=MAX_BANDWIDTH_BYTES_PER_S,
        description=MEASURED_INTRA_DESCRIPTION,
    )
    measured_inter_node_bus_bandwidth_bytes_per_s: float | None = Field(
        default=None,
        ge=MIN_BANDWIDTH_BYTES_PER_S,
        le=MAX_BANDWIDTH_BYTES_PER_S,
        description=MEASURED_INTER_DESCRIPTION,
    )

    # what the catalog filled in: the GPU's slug where the request named it otherwise, and the
    # node fields the request left out
    _read: dict[str, str] = PrivateAttr(default_factory=dict)
    # the `X_gbps` twins the request sent for `X_bytes_per_s` fields: what the errors of ``to_domain``
    # name (a request that sent inter_node_bandwidth_gbps was told of inter_node_bandwidth_bytes_per_s)
    _sent_as: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _from_catalog(cls, value: Any, handler: Callable[[Any], ClusterShape]) -> ClusterShape:
        # a catalog GPU as its slug ("H100 SXM5 80GB" -> "h100-sxm-80gb": stored and echoed so), and
        # a cluster that leaves out its node as one node of the part's own (one HGX baseboard of 8)
        read: dict[str, str] = {}
        value = cls.without_nulls(value)  # null node fields are left out, then filled in below
        if isinstance(value, dict):
            given = value.get("gpu")
            value = dict(value)
            if isinstance(given, str):
                value["gpu"] = catalog_slug(given, gpu_slug)
                if value["gpu"] != given:
                    read["gpu"] = value["gpu"]
            node = reference_node(value["gpu"]) if isinstance(value.get("gpu"), str) else None
            if isinstance(given, str) and node is None and "gpus_per_node" not in value:
                _known_gpu(given)  # an unknown name is the error, not the node size it left out
            count = value.get("num_gpus")
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                count = None  # absent, or refused by the field's own rules
            if "gpus_per_node" not in value:
                nodes_given = value.get("num_nodes")
                per_node = node.spec.node_gpus if node is not None else None
                if count is not None and isinstance(nodes_given, int) and nodes_given >= 1:
                    per_node = count // nodes_given or per_node  # the GPUs over the nodes given (checked)
                elif count is not None and per_node is not None:
                    per_node = min(count, per_node)  # fewer GPUs than a node: one node of them
                elif count is not None and count <= ONE_NODE_OF_CARDS:
                    # a PCIe card or custom GPU has no node of its own: a few of them are one machine's
                    # (a 422 "gpus_per_node: Field required" met {"gpu": "rtx-4090-24gb", "num_gpus": 1})
                    per_node = count
                if per_node is not None:
                    value["gpus_per_node"] = per_node
                    read["gpus_per_node"] = str(per_node)
                elif "gpu" not in value:
                    # the node size follows the GPU, which is what is missing: "gpus_per_node: Field
                    # required" beside "gpu: Field required" named a field the client may leave out
                    # (operator review); this stand-in never validates without the gpu it waits for
                    value["gpus_per_node"] = 1
                elif isinstance(value.get("gpu"), str | dict):
                    # a bare "Field required" left the client to guess why (scheduler review)
                    what = value["gpu"] if isinstance(value["gpu"], str) else "a custom GPU"
                    raise FieldError(
                        f"{what} ships in no node of its own (a PCIe card, a custom GPU), so the node size "
                        "is the cluster's to state: give gpus_per_node (the GPUs one node holds), or "
                        f"num_gpus up to {ONE_NODE_OF_CARDS} for one machine of them",
                        "gpus_per_node",
                    )
            if "num_nodes" not in value:
                per_node = value.get("gpus_per_node")
                if count is not None and isinstance(per_node, int) and per_node >= 1:
                    _num_gpus_plannable(count, per_node)  # named as sent, not as the nodes it makes
                nodes = (
                    count // per_node if count is not None and isinstance(per_node, int) and per_node else 1
                )
                value["num_nodes"] = max(1, nodes)
                read["num_nodes"] = str(value["num_nodes"])
        shape = handler(value)
        shape._read = read
        shape._sent_as = gbps_twins_sent(value)
        return shape

    def _as_sent(self, text: str) -> str:
        """``text`` with each `X_bytes_per_s` field the request sent as `X_gbps` named so."""
        for name, twin in self._sent_as.items():
            text = text.replace(name, twin)
        return text

    @model_validator(mode="after")
    def _plannable(self) -> ClusterShape:
        # what no estimate, plan or capacity can use (service.estimator.scale) is not stored either:
        # a 100,000 x 64 cluster was stored, then every request on it was a 422
        if self.num_nodes * self.gpus_per_node > MAX_GPUS.limit:
            raise FieldError(
                f"num_nodes x gpus_per_node = {self.num_nodes * self.gpus_per_node:,} GPUs is past the "
                f"{MAX_GPUS.limit:,} the planner handles (16x the largest published run: "
                f"{MAX_GPUS.reference})",
                "num_nodes",
                MAX_GPUS.limit // self.gpus_per_node,  # the nodes of this size the bound allows
            )
        return self

    @model_validator(mode="after")
    def _mesh_of_stated_links(self, info: ValidationInfo) -> ClusterShape:
        # a mesh splits the links' sum (the GPU's intra_node_bandwidth_bytes_per_s or the cluster's)
        # into its links; with neither the link defaults to the PCIe host link, which no mesh splits (a
        # tp 2 pair was timed at 1/7 of it: custom-hardware review). A row stored before the rule reads
        # back (``STORED``), its mesh set aside (``to_domain``).
        if self._unsplit_mesh() and not (info.context or {}).get("stored"):
            assert isinstance(self.gpu, CustomGPU)
            raise FieldError(
                f"mesh_links {self.gpu.mesh_links} splits the node's GPU-to-GPU bandwidth into its links, "
                "but neither the GPU's nor the cluster's intra_node_bandwidth_bytes_per_s, their sum, is "
                "stated: it would default to the PCIe host link, which no mesh splits; state it (an MI300X "
                "platform: 448e9, 7 xGMI links of 64 GB/s) or leave mesh_links out",
                "gpu.mesh_links",
            )
        return self

    @model_validator(mode="after")
    def _mesh_connects_the_node(self, info: ValidationInfo) -> ClusterShape:
        # a fully connected node of n GPUs gives each n - 1 links: fewer cannot reach every peer, and a
        # group timed at (k - 1) / mesh_links of the links' sum is then no mesh the node has (a custom
        # MI325X with mesh_links 1 on 8 GPUs was timed as fully connected: custom-hardware review)
        links = self.gpu.mesh_links if isinstance(self.gpu, CustomGPU) else None
        stored = (info.context or {}).get("stored")  # a row stored before the rule reads back
        if links is not None and self.gpus_per_node > links + 1 and not stored:
            raise FieldError(
                f"mesh_links {links} cannot connect {self.gpus_per_node} GPUs a node in a full mesh (each "
                f"needs {self.gpus_per_node - 1} links, one per peer): give gpus_per_node at most "
                f"{links + 1}, or leave mesh_links out for a switch",
                "gpus_per_node",
                links + 1,
            )
        return self

    def _unsplit_mesh(self) -> bool:
        """A custom GPU's mesh with no links' sum stated, on the GPU or the cluster."""
        return (
            isinstance(self.gpu, CustomGPU)
            and self.gpu.mesh_links is not None
            and self.gpu.intra_node_bandwidth_bytes_per_s is None
            and self.intra_node_bandwidth_bytes_per_s is None
        )

    @model_validator(mode="after")
    def _num_gpus_agrees(self) -> ClusterShape:
        if self.num_gpus is not None and self.num_gpus != self.num_nodes * self.gpus_per_node:
            raise FieldError(
                f"num_gpus ({self.num_gpus}) is not num_nodes x gpus_per_node ({self.num_nodes} x "
                f"{self.gpus_per_node} = {self.num_nodes * self.gpus_per_node}): give whole nodes, or "
                "gpus_per_node",
                "num_gpus",
            )
        return self

    def network_default(self) -> float | None:
        """Each GPU's share of the network between nodes where the cluster spans nodes and leaves
        it out: its catalog part's reference node's (``node_network_bytes_per_s``); None otherwise."""
        if self.inter_node_bandwidth_bytes_per_s is not None or self.num_nodes == 1:
            return None
        node = reference_node(self.gpu) if isinstance(self.gpu, str) else None
        return None if node is None else node.spec.node_network_bytes_per_s

    def read_from_catalog(self, at: str = "cluster.") -> dict[str, str]:
        """What the catalog filled in, by field: ``{"cluster.gpu": "h100-sxm-80gb",
        "cluster.gpus_per_node": "8", "cluster.inter_node_bandwidth_bytes_per_s": "50000000000"}``."""
        read = {f"{at}{name}": value for name, value in self._read.items()}
        network = self.network_default()
        if network is not None:
            read[f"{at}inter_node_bandwidth_bytes_per_s"] = f"{network:.0f}"
        return read

    def to_domain(self, at: str = "") -> ClusterSpec:
        """The domain's cluster; ``at``: where it sits in the request body ("cluster." inline in an
        estimate or plan), which the GPU's errors name."""
        gpu = resolve_gpu(self.gpu, field=f"{at}gpu")
        if self._unsplit_mesh():  # a row stored before _mesh_of_stated_links: no mesh splits the PCIe link
            gpu = dataclasses.replace(gpu, mesh_links=None)
        intra = self.intra_node_bandwidth_bytes_per_s or gpu.intra_node_bandwidth_bytes_per_s
        inter = self.inter_node_bandwidth_bytes_per_s or self.network_default()
        if inter is None:
            if self.num_nodes > 1:
                why = (
                    f"required when num_nodes ({self.num_nodes}) > 1 and the GPU has no reference node "
                    "in the catalog to take it from"
                )
                raise Unprocessable(
                    f"inter_node_bandwidth_bytes_per_s is {why}",
                    errors=[
                        {"field": f"{at}inter_node_bandwidth_bytes_per_s", "message": why, "type": "missing"}
                    ],
                )
            inter = intra  # one node: nothing crosses a network
        measured_intra = self.measured_intra_node_bus_bandwidth_bytes_per_s
        measured_inter = self.measured_inter_node_bus_bandwidth_bytes_per_s
        # an input the model does not use is refused: a one-GPU node has no link inside it, a one-node
        # cluster no network between nodes, for a measurement to describe
        for name, measured, unused, what in (
            ("measured_intra_node_bus_bandwidth_bytes_per_s", measured_intra, self.gpus_per_node == 1,
             "a node of one GPU has no link between GPUs"),
            ("measured_inter_node_bus_bandwidth_bytes_per_s", measured_inter, self.num_nodes == 1,
             "a one-node cluster has no network between nodes"),
        ):  # fmt: skip
            if measured is not None and unused:
                message = (
                    f"{what} for a measured bus bandwidth to describe (leave it out, or send null to "
                    "remove a stored one)"
                )
                field = at + self._as_sent(name)
                raise Unprocessable(message, errors=[{"field": field, "message": message, "type": "unused"}])
        try:
            return ClusterSpec(
                gpu=gpu,
                num_nodes=self.num_nodes,
                gpus_per_node=self.gpus_per_node,
                intra_node_bandwidth_bytes_per_s=intra,
                inter_node_bandwidth_bytes_per_s=inter,
                cpu_memory_bytes_per_node=self.cpu_memory_bytes_per_node,
                nvme_bytes_per_node=self.nvme_bytes_per_node,
                measured_intra_node_bus_bandwidth_bytes_per_s=measured_intra,
                measured_inter_node_bus_bandwidth_bytes_per_s=measured_inter,
            )
        except EstimatorError as exc:  # a measured busbw above what its link allows (the rest: Field limits)
            field = at + self._as_sent(exc.field) if exc.field else f"{at}cluster"
            message = self._as_sent(exc.message)
            raise Unprocessable(
                message, errors=[{"field": field, "message": message, "type": exc.rule}]
            ) from exc


class ClusterCreate(ClusterShape):
    name: str = Field(min_length=1, max_length=200, pattern=r"^\S(.*\S)?$")
    description: str = Field(default="", max_length=2000)


VERSION_DESCRIPTION = (
    "the cluster's version this write was made from (a GET's `version`): a write made from an older one "
    "is a 409 and changes nothing (If-Match with the ETag does the same, answered 412); absent: not checked"
)


class ClusterReplace(ClusterCreate):
    """A PUT's body: the whole cluster, and the version it replaces."""

    version: int | None = Field(default=None, ge=1, description=VERSION_DESCRIPTION)


class ClusterPatch(Strict):
    """Fields to change; the merged cluster is validated as a whole. Only the bandwidths may be
    null: null puts a nominal one back to its default and removes a measured one. (None below means
    "not sent".)"""

    version: int | None = Field(default=None, ge=1, description=VERSION_DESCRIPTION)
    name: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^\S(.*\S)?$")
    description: str | None = Field(default=None, max_length=2000)
    gpu: str | CustomGPU | None = None
    num_nodes: int | None = Field(default=None, ge=1, le=MAX_NODES)
    gpus_per_node: int | None = Field(default=None, ge=1, le=MAX_GPUS_PER_NODE)
    intra_node_bandwidth_bytes_per_s: float | None = Field(
        default=None, ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S
    )
    inter_node_bandwidth_bytes_per_s: float | None = Field(
        default=None, ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S
    )
    cpu_memory_bytes_per_node: int | None = Field(default=None, ge=0, le=MAX_MEMORY_BYTES)
    nvme_bytes_per_node: int | None = Field(default=None, ge=0, le=MAX_NVME_BYTES)
    measured_intra_node_bus_bandwidth_bytes_per_s: float | None = Field(
        default=None, ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S
    )
    measured_inter_node_bus_bandwidth_bytes_per_s: float | None = Field(
        default=None, ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S
    )

    # the `X_gbps` twins the PATCH sent (``ClusterShape._sent_as``): the merged cluster's errors name
    # them as sent (a refused measured_intra_node_bus_bandwidth_gbps was named ..._bytes_per_s and its
    # GB/s value called bytes; operator review)
    _sent_as: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _twins_sent(cls, value: Any, handler: Callable[[Any], ClusterPatch]) -> ClusterPatch:
        patch = handler(value)
        patch._sent_as = gbps_twins_sent(value)
        return patch

    # the fields a PATCH may leave out but not null (their None is "not sent"): the schema says so
    null_refused: ClassVar[tuple[str, ...]] = (
        "name", "description", "gpu", "num_nodes", "gpus_per_node", "cpu_memory_bytes_per_node",
        "nvme_bytes_per_node",
    )  # fmt: skip

    @field_validator(*null_refused, mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        # runs only for values the client sent: an explicit null is refused, naming the field
        if value is None:
            raise ValueError("may not be null (leave the field out to keep it)")
        return value

    @field_validator("gpu", mode="before")
    @classmethod
    def _catalog_gpu(cls, value: Any) -> Any:
        return catalog_slug(value, gpu_slug)  # stored as the catalog's slug, as a created cluster's


class ClusterOut(BaseModel):
    id: str
    name: str
    description: str
    gpu: str | CustomGPU
    num_nodes: int
    gpus_per_node: int
    world_size: int
    gpu_memory_bytes: int
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    defaulted: list[str] = Field(
        description="fields taken from defaults (they follow the GPU and node count); gpu.<field> for a "
        "custom GPU's link bandwidths it left out (they follow its chip and PCIe link)"
    )
    cpu_memory_bytes_per_node: int
    nvme_bytes_per_node: int
    measured_intra_node_bus_bandwidth_bytes_per_s: float | None = Field(
        description="as stored; null: not measured (the tuning's bus efficiency applies)"
    )
    measured_inter_node_bus_bandwidth_bytes_per_s: float | None = Field(
        description="as stored; null: not measured (the tuning's bus efficiency applies)"
    )
    created_at: datetime
    updated_at: datetime
    version: int = Field(
        description="counts the cluster's changes (1 when created; also its ETag): send it back with a PUT "
        "or PATCH (or as If-Match) and a change made since is not overwritten"
    )


class ClusterRef(Strict):
    """A stored cluster, by id."""

    id: str = Field(min_length=1, max_length=64)


class ClusterIn(ClusterShape):
    """An inline cluster (the shape of a stored one, without name)."""


def _cluster_kind(value: Any) -> str:
    """Tag of a raw body (validation) or of a built model (serialisation)."""
    if isinstance(value, ClusterRef) or (isinstance(value, dict) and "id" in value):
        return "by_id"
    return "inline"


# A stored cluster by id, or an inline one; the tags are dropped from error locations.
ClusterChoice = Annotated[
    Annotated[ClusterRef, Tag("by_id")] | Annotated[ClusterIn, Tag("inline")],
    Discriminator(_cluster_kind),
]


def _known_gpu(name: str) -> None:
    """Refuse a GPU name the catalog does not know (or that names several parts), naming the field and
    the candidates: left to the lookup that follows validation, a cluster without gpus_per_node was
    refused for that field alone ("cluster.gpus_per_node: Field required" for {"gpu": "H100"})."""
    try:
        gpu_slug(name)
    except UnknownCatalogEntry as exc:
        entry = unknown_entry_error(exc, "gpu")  # with the names it may mean, as README promises
        details = {key: value for key, value in entry.items() if key not in ("field", "message")}
        raise FieldError(str(exc), "gpu", details=details) from None
