"""Cluster inventory: the hardware plans are made for.

The workflow (validation, unique names, what refers to a cluster) is `service.planning.clusters`;
this router translates HTTP: 201 with Location, 204, the page cursor."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from service.api.deps import ClusterRepoDep
from service.api.problems import PROBLEM_RESPONSES
from service.contracts.clusters import ClusterCreate, ClusterOut, ClusterPatch
from service.contracts.common import Page
from service.errors import Unprocessable
from service.persistence.repository import InvalidCursor, decode_cursor
from service.planning import clusters

router = APIRouter(prefix="/v1/clusters", tags=["clusters"], responses=PROBLEM_RESPONSES)

LimitQuery = Annotated[int, Query(ge=1, le=500, description="page size")]
CursorQuery = Annotated[str | None, Query(max_length=200, description="next_cursor of the previous page")]


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ClusterOut)
def create_cluster(body: ClusterCreate, repo: ClusterRepoDep, response: Response) -> ClusterOut:
    record = clusters.create_cluster(repo, body)
    response.headers["Location"] = f"/v1/clusters/{record.id}"
    return clusters.cluster_out(record)


@router.get("", response_model=Page[ClusterOut])
def list_clusters(
    repo: ClusterRepoDep, limit: LimitQuery = 50, cursor: CursorQuery = None
) -> Page[ClusterOut]:
    try:
        after = decode_cursor(cursor) if cursor else None
    except InvalidCursor as exc:
        raise Unprocessable(str(exc), errors=[{"field": "query.cursor", "message": str(exc)}]) from exc
    rows, next_cursor = repo.list_page(limit=limit, after_id=after)
    return Page[ClusterOut](items=[clusters.cluster_out(r) for r in rows], next_cursor=next_cursor)


@router.get("/{cluster_id}", response_model=ClusterOut)
def get_cluster(cluster_id: str, repo: ClusterRepoDep) -> ClusterOut:
    return clusters.cluster_out(clusters.stored_cluster(repo, cluster_id))


@router.put("/{cluster_id}", response_model=ClusterOut)
def replace_cluster(cluster_id: str, body: ClusterCreate, repo: ClusterRepoDep) -> ClusterOut:
    return clusters.cluster_out(clusters.replace_cluster(repo, cluster_id, body))


@router.patch("/{cluster_id}", response_model=ClusterOut)
def update_cluster(cluster_id: str, body: ClusterPatch, repo: ClusterRepoDep) -> ClusterOut:
    return clusters.cluster_out(clusters.update_cluster(repo, cluster_id, body))


@router.delete("/{cluster_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_cluster(cluster_id: str, repo: ClusterRepoDep) -> Response:
    clusters.delete_cluster(repo, cluster_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
