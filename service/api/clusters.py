"""Cluster inventory: the hardware plans are made for.

The workflow (validation, unique names, what refers to a cluster) is `service.planning.clusters`;
this router translates HTTP: 201 with Location, 204, the page cursor."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Response, status

from service.api.deps import ClusterRepoDep, CursorQuery, IdempotencyKey, LimitQuery, created
from service.api.problems import PRECONDITION_RESPONSES, PROBLEM_RESPONSES
from service.contracts.clusters import ClusterCreate, ClusterOut, ClusterPatch, ClusterReplace
from service.contracts.common import Page
from service.errors import Unprocessable
from service.persistence.repository import CLUSTERS_LIST, InvalidCursor, decode_cursor
from service.planning import clusters

router = APIRouter(prefix="/v1/clusters", tags=["clusters"], responses=PROBLEM_RESPONSES)


IfMatch = Annotated[
    str | None,
    Header(
        max_length=200,
        description='the ETag a GET answered ("3"): a write to a cluster changed since is a 412 and changes '
        "nothing",
    ),
]
IfNoneMatch = Annotated[
    str | None,
    Header(
        max_length=200,
        description='"*" or ETags ("3"): a write is a 412 and changes nothing where the cluster exists '
        '("*") or is at one of them; a GET is a 304 without a body where it is at one of them',
    ),
]


def _preconditions(if_match: IfMatch = None, if_none_match: IfNoneMatch = None) -> clusters.Preconditions:
    return clusters.Preconditions(if_match, if_none_match)


PreconditionsDep = Annotated[clusters.Preconditions, Depends(_preconditions)]


def _tagged(response: Response, out: ClusterOut) -> ClusterOut:
    response.headers["ETag"] = f'"{out.version}"'
    return out


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ClusterOut)
def create_cluster(
    body: ClusterCreate, repo: ClusterRepoDep, response: Response, idempotency_key: IdempotencyKey = None
) -> ClusterOut:
    outcome = clusters.create_cluster_once(repo, body, idempotency_key)
    created(response, f"/v1/clusters/{outcome.value.id}", outcome.replayed)
    return _tagged(response, clusters.cluster_out(outcome.value))


@router.get("", response_model=Page[ClusterOut])
def list_clusters(
    repo: ClusterRepoDep, limit: LimitQuery = 50, cursor: CursorQuery = None
) -> Page[ClusterOut]:
    try:
        after = decode_cursor(cursor, CLUSTERS_LIST) if cursor else None
    except InvalidCursor as exc:
        raise Unprocessable(str(exc), errors=[{"field": "query.cursor", "message": str(exc)}]) from exc
    rows, next_cursor = repo.list_page(limit=limit, after_id=after)
    return Page[ClusterOut](items=[clusters.cluster_out(r) for r in rows], next_cursor=next_cursor)


@router.get(
    "/{cluster_id}",
    response_model=ClusterOut,
    responses={304: {"description": "If-None-Match names the cluster's current ETag: no body"}},
)
def get_cluster(
    cluster_id: str, repo: ClusterRepoDep, response: Response, if_none_match: IfNoneMatch = None
) -> ClusterOut | Response:
    record = clusters.stored_cluster(repo, cluster_id)
    if if_none_match is not None and clusters.none_match_fails(if_none_match, record.version):
        # the client's copy is current (RFC 9110 13.1.2, 15.4.5): the ETag again, no body
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers={"ETag": f'"{record.version}"'})
    return _tagged(response, clusters.cluster_out(record))


@router.put("/{cluster_id}", response_model=ClusterOut, responses=PRECONDITION_RESPONSES)
def replace_cluster(
    cluster_id: str,
    body: ClusterReplace,
    repo: ClusterRepoDep,
    response: Response,
    preconditions: PreconditionsDep,
) -> ClusterOut:
    record = clusters.replace_cluster(repo, cluster_id, body, preconditions)
    return _tagged(response, clusters.cluster_out(record))


@router.patch("/{cluster_id}", response_model=ClusterOut, responses=PRECONDITION_RESPONSES)
def update_cluster(
    cluster_id: str,
    body: ClusterPatch,
    repo: ClusterRepoDep,
    response: Response,
    preconditions: PreconditionsDep,
) -> ClusterOut:
    record = clusters.update_cluster(repo, cluster_id, body, preconditions)
    return _tagged(response, clusters.cluster_out(record))


@router.delete("/{cluster_id}", status_code=status.HTTP_204_NO_CONTENT, responses=PRECONDITION_RESPONSES)
def delete_cluster(cluster_id: str, repo: ClusterRepoDep, preconditions: PreconditionsDep) -> Response:
    clusters.delete_cluster(repo, cluster_id, preconditions)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
