"""Cluster inventory: the hardware plans are made for."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError

from service.api.deps import ClusterRepoDep
from service.api.problems import PROBLEM_RESPONSES
from service.contracts.clusters import ClusterCreate, ClusterOut, ClusterPatch
from service.contracts.common import Page
from service.contracts.gpus import CustomGPU
from service.errors import Conflict, NotFound, Unprocessable
from service.persistence.models import ClusterRecord
from service.persistence.repository import ClusterRepository, InvalidCursor, decode_cursor
from service.planning.clusters import record_fields

router = APIRouter(prefix="/v1/clusters", tags=["clusters"], responses=PROBLEM_RESPONSES)

LimitQuery = Annotated[int, Query(ge=1, le=500, description="page size")]
CursorQuery = Annotated[str | None, Query(max_length=200, description="next_cursor of the previous page")]


def to_out(record: ClusterRecord) -> ClusterOut:
    gpu: str | CustomGPU = (
        CustomGPU.model_validate(record.gpu_spec) if record.gpu_spec is not None else str(record.gpu_name)
    )
    spec = ClusterCreate.model_validate(record_fields(record)).to_domain()
    return ClusterOut(
        id=record.id,
        name=record.name,
        description=record.description,
        gpu=gpu,
        num_nodes=record.num_nodes,
        gpus_per_node=record.gpus_per_node,
        world_size=record.num_nodes * record.gpus_per_node,
        gpu_memory_bytes=spec.gpu.memory_bytes,
        intra_node_bandwidth_bytes_per_s=spec.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=spec.inter_node_bandwidth_bytes_per_s,
        defaulted=[
            name
            for name in ("intra_node_bandwidth_bytes_per_s", "inter_node_bandwidth_bytes_per_s")
            if getattr(record, name) is None
        ],
        cpu_memory_bytes_per_node=record.cpu_memory_bytes_per_node,
        nvme_bytes_per_node=record.nvme_bytes_per_node,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )


def _apply(record: ClusterRecord, body: ClusterCreate) -> None:
    """Validate the whole cluster (catalog GPU, bandwidth defaults) and write it to the row."""
    spec = body.to_domain()  # validates: catalog GPU, bandwidth defaults, inter-node when needed
    record.name = body.name
    record.description = body.description
    if isinstance(body.gpu, CustomGPU):
        record.gpu_name, record.gpu_spec = None, body.gpu.model_dump()
    else:
        record.gpu_name, record.gpu_spec = body.gpu, None
    record.num_nodes = spec.num_nodes
    record.gpus_per_node = spec.gpus_per_node
    # Stored as given: None keeps following the default (the GPU's link; intra-node on one node).
    record.intra_node_bandwidth_bytes_per_s = body.intra_node_bandwidth_bytes_per_s
    record.inter_node_bandwidth_bytes_per_s = body.inter_node_bandwidth_bytes_per_s
    record.cpu_memory_bytes_per_node = spec.cpu_memory_bytes_per_node
    record.nvme_bytes_per_node = spec.nvme_bytes_per_node


def _check_name_free(repo: ClusterRepository, name: str, own_id: str | None) -> None:
    existing = repo.get_by_name(name)
    if existing is not None and existing.id != own_id:
        raise Conflict(
            f"a cluster named {name!r} already exists (id {existing.id})",
            errors=[{"field": "name", "message": "must be unique", "existing_id": existing.id}],
        )


def _save(repo: ClusterRepository, record: ClusterRecord) -> ClusterRecord:
    try:
        return repo.add(record)
    except IntegrityError as exc:  # a concurrent writer took the name between check and flush
        raise Conflict(f"a cluster named {record.name!r} already exists") from exc


def _get_or_404(repo: ClusterRepository, cluster_id: str) -> ClusterRecord:
    record = repo.get(cluster_id)
    if record is None:
        raise NotFound(f"cluster {cluster_id!r} does not exist")
    return record


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ClusterOut)
def create_cluster(body: ClusterCreate, repo: ClusterRepoDep, response: Response) -> ClusterOut:
    _check_name_free(repo, body.name, None)
    record = ClusterRecord()
    _apply(record, body)
    _save(repo, record)
    response.headers["Location"] = f"/v1/clusters/{record.id}"
    return to_out(record)


@router.get("", response_model=Page[ClusterOut])
def list_clusters(
    repo: ClusterRepoDep, limit: LimitQuery = 50, cursor: CursorQuery = None
) -> Page[ClusterOut]:
    try:
        after = decode_cursor(cursor) if cursor else None
    except InvalidCursor as exc:
        raise Unprocessable(str(exc), errors=[{"field": "query.cursor", "message": str(exc)}]) from exc
    rows, next_cursor = repo.list_page(limit=limit, after_id=after)
    return Page[ClusterOut](items=[to_out(r) for r in rows], next_cursor=next_cursor)


@router.get("/{cluster_id}", response_model=ClusterOut)
def get_cluster(cluster_id: str, repo: ClusterRepoDep) -> ClusterOut:
    return to_out(_get_or_404(repo, cluster_id))


@router.put("/{cluster_id}", response_model=ClusterOut)
def replace_cluster(cluster_id: str, body: ClusterCreate, repo: ClusterRepoDep) -> ClusterOut:
    record = _get_or_404(repo, cluster_id)
    _check_name_free(repo, body.name, record.id)
    _apply(record, body)
    _save(repo, record)
    return to_out(record)


@router.patch("/{cluster_id}", response_model=ClusterOut)
def update_cluster(cluster_id: str, body: ClusterPatch, repo: ClusterRepoDep) -> ClusterOut:
    record = _get_or_404(repo, cluster_id)
    merged = record_fields(record) | body.model_dump(exclude_unset=True)
    try:
        replacement = ClusterCreate.model_validate(merged)
    except ValidationError as exc:  # e.g. a stored custom GPU that no longer validates
        errors = [
            {"field": ".".join(map(str, e["loc"])), "message": e["msg"], "type": e["type"]}
            for e in exc.errors()
        ]
        raise Unprocessable("the patched cluster is not valid", errors=errors) from exc
    _check_name_free(repo, replacement.name, record.id)
    _apply(record, replacement)
    _save(repo, record)
    return to_out(record)


@router.delete("/{cluster_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_cluster(cluster_id: str, repo: ClusterRepoDep) -> Response:
    record = _get_or_404(repo, cluster_id)
    plans = repo.plan_count(cluster_id)
    if plans:
        raise Conflict(
            f"cluster {cluster_id!r} is referenced by {plans} stored plan(s); delete those plans first",
            errors=[{"field": "cluster_id", "message": "referenced by plans", "plans": plans}],
        )
    repo.delete(record)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
