"""Clusters: the stored inventory (create, replace, patch, delete, and the wire shape of a stored
one), and the cluster a request names, a stored one by id or an inline one, as a ClusterSpec."""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError

from service.contracts.clusters import (
    ClusterCreate,
    ClusterIn,
    ClusterOut,
    ClusterPatch,
    ClusterRef,
    ClusterReplace,
    ClusterShape,
)
from service.contracts.common import FieldError
from service.contracts.gpus import STORED, CustomGPU
from service.contracts.models import ModelRef
from service.errors import Conflict, NotFound, PreconditionFailed, Unprocessable
from service.estimator.types import ClusterSpec
from service.persistence.models import ClusterRecord
from service.persistence.repository import ClusterRepository
from service.planning.idempotency import Outcome, create_once, request_digests

# Stored as given, None following the default (the GPU's link; intra-node on one node).
DEFAULTED_FIELDS = ("intra_node_bandwidth_bytes_per_s", "inter_node_bandwidth_bytes_per_s")


def record_fields(record: ClusterRecord) -> dict[str, Any]:
    """A stored cluster as the fields of a ClusterCreate body (bandwidth defaults left as None)."""
    return {
        "name": record.name,
        "description": record.description,
        "gpu": record.gpu_spec if record.gpu_spec is not None else record.gpu_name,
        "num_nodes": record.num_nodes,
        "gpus_per_node": record.gpus_per_node,
        "intra_node_bandwidth_bytes_per_s": record.intra_node_bandwidth_bytes_per_s,
        "inter_node_bandwidth_bytes_per_s": record.inter_node_bandwidth_bytes_per_s,
        "cpu_memory_bytes_per_node": record.cpu_memory_bytes_per_node,
        "nvme_bytes_per_node": record.nvme_bytes_per_node,
        "measured_intra_node_bus_bandwidth_bytes_per_s": record.measured_intra_node_bus_bandwidth_bytes_per_s,
        "measured_inter_node_bus_bandwidth_bytes_per_s": record.measured_inter_node_bus_bandwidth_bytes_per_s,
    }


def cluster_out(record: ClusterRecord) -> ClusterOut:
    """A stored cluster in its wire shape, with the defaults it follows resolved and named."""
    gpu: str | CustomGPU = (
        CustomGPU.model_validate(record.gpu_spec, context=STORED)
        if record.gpu_spec is not None
        else str(record.gpu_name)
    )
    spec = ClusterCreate.model_validate(record_fields(record), context=STORED).to_domain()
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
        defaulted=[name for name in DEFAULTED_FIELDS if getattr(record, name) is None]
        + [f"gpu.{name}" for name, _ in spec.gpu.defaulted],  # a custom GPU's links it left out
        cpu_memory_bytes_per_node=record.cpu_memory_bytes_per_node,
        nvme_bytes_per_node=record.nvme_bytes_per_node,
        measured_intra_node_bus_bandwidth_bytes_per_s=spec.measured_intra_node_bus_bandwidth_bytes_per_s,
        measured_inter_node_bus_bandwidth_bytes_per_s=spec.measured_inter_node_bus_bandwidth_bytes_per_s,
        created_at=record.created_at,
        updated_at=record.updated_at,
        version=record.version,
    )


class Preconditions(NamedTuple):
    """A write's HTTP preconditions on the stored cluster (RFC 9110 13.1), each None where not sent."""

    if_match: str | None = None
    if_none_match: str | None = None


UNCONDITIONAL = Preconditions()


def check_version(record: ClusterRecord, version: int | None, preconditions: Preconditions) -> None:
    """Refuse a write made from an older version of the cluster: the body's ``version`` (409, as the
    contract says) or the If-Match header (412, as HTTP says); either absent: not checked. Two writers
    who read the same version then each change a field no longer lose one change to the other. An
    If-None-Match that matches (``*``: the cluster exists; or its current ETag) is a 412 too: the
    write was asked only where it would not (RFC 9110 13.1.2; it was ignored, and a PUT guarded by
    ``If-None-Match: *`` overwrote the cluster it meant not to: HTTP-semantics review)."""
    if_match, if_none_match = preconditions
    if if_match is not None and not _matches(if_match, record.version):
        raise PreconditionFailed(
            f"If-Match {if_match} does not match cluster {record.id!r}, now at version {record.version} "
            f'(ETag "{record.version}"): read it again and write from that',
            errors=[{"field": "header.If-Match", "message": "stale", "current_version": record.version}],
        )
    if if_none_match is not None and none_match_fails(if_none_match, record.version):
        raise PreconditionFailed(
            f"If-None-Match {if_none_match} matches cluster {record.id!r} (version {record.version}, "
            f'ETag "{record.version}"): the write was asked only where it does not, so nothing changed',
            errors=[
                {"field": "header.If-None-Match", "message": "matches", "current_version": record.version}
            ],
        )
    if version is not None and version != record.version:
        raise Conflict(
            f"version {version} is not the stored cluster's: {record.id!r} is at version {record.version} "
            "(changed since it was read): read it again and write from that",
            errors=[{"field": "version", "message": "stale", "current_version": record.version}],
        )


def _tags(header: str) -> list[str]:
    return [tag.strip() for tag in header.split(",")]


def _matches(if_match: str, version: int) -> bool:
    """Whether an If-Match header names this version: "*", or a list of entity tags compared strongly
    (RFC 9110 13.1.1: a weak tag, W/"3", never matches for If-Match)."""
    tags = _tags(if_match)
    return "*" in tags or any(not tag.startswith("W/") and tag.strip('"') == str(version) for tag in tags)


def none_match_fails(if_none_match: str, version: int) -> bool:
    """Whether an If-None-Match header's condition is false for this version: "*" (the resource
    exists), or one of its entity tags names the version, compared weakly (RFC 9110 13.1.2: W/"3"
    matches "3"). A GET so conditioned is a 304, a write a 412."""
    tags = _tags(if_none_match)
    return "*" in tags or any(tag.removeprefix("W/").strip('"') == str(version) for tag in tags)


def read_from_catalog(model: ModelRef, cluster: ClusterShape) -> dict[str, str]:
    """What the catalog filled in of a request (for the answer's ``resolved_defaults``): the slugs of
    names given otherwise (``{"model.preset": "llama-3.1-8b", "cluster.gpu": "h100-sxm-80gb"}`` for
    "meta-llama/Llama-3.1-8B" on "H100 SXM5 80GB"), and the cluster's node and network left out, inline
    or stored (``cluster_form``: a stored cluster's defaults were named only in its own answer)."""
    return model.names_read() | cluster.read_from_catalog()


def stored_cluster(repo: ClusterRepository, cluster_id: str, *, for_write: bool = False) -> ClusterRecord:
    record = repo.get_for_write(cluster_id) if for_write else repo.get(cluster_id)
    if record is None:
        raise NotFound(f"cluster {cluster_id!r} does not exist")
    return record


def create_cluster(repo: ClusterRepository, body: ClusterCreate) -> ClusterRecord:
    """Store a new cluster under a name no other cluster of the owner has."""
    _check_name_free(repo, body.name, None)
    record = ClusterRecord()
    _apply(record, body)
    return _save(repo, record)


# Stored with every cluster-create key (the route, as runs' and plans' keys store theirs)
CLUSTER_SCOPE = "POST /v1/clusters"


def create_cluster_once(
    repo: ClusterRepository, body: ClusterCreate, idempotency_key: str | None = None
) -> Outcome[ClusterRecord]:
    """``create_cluster``, retry-safe: the same key and body replays the cluster it created (api.md:
    writes a scheduler may retry accept an Idempotency-Key; a retry was a 409 'name taken')."""

    def create() -> tuple[str, ClusterRecord]:
        record = create_cluster(repo, body)
        return record.id, record

    def replay(cluster_id: str) -> ClusterRecord:
        record = repo.get(cluster_id)
        if record is None:
            raise NotFound(
                f"cluster {cluster_id} created with Idempotency-Key {idempotency_key!r} has since been "
                "deleted"
            )
        return record

    return create_once(
        repo.session,
        scope=CLUSTER_SCOPE,
        key=idempotency_key,
        digests=request_digests(body),
        create=create,
        replay=replay,
    )


def replace_cluster(
    repo: ClusterRepository,
    cluster_id: str,
    body: ClusterReplace,
    preconditions: Preconditions = UNCONDITIONAL,
) -> ClusterRecord:
    record = stored_cluster(repo, cluster_id, for_write=True)
    check_version(record, body.version, preconditions)
    _check_name_free(repo, body.name, record.id)
    _apply(record, body)
    return _save(repo, record)


def update_cluster(
    repo: ClusterRepository,
    cluster_id: str,
    patch: ClusterPatch,
    preconditions: Preconditions = UNCONDITIONAL,
) -> ClusterRecord:
    """The stored cluster with the fields sent changed, validated as a whole."""
    record = stored_cluster(repo, cluster_id, for_write=True)
    check_version(record, patch.version, preconditions)
    sent = patch.model_dump(exclude_unset=True, exclude={"version"})
    merged = record_fields(record) | sent
    # rules added since the row was stored hold for what the patch changes: a description edited on a
    # cluster whose custom GPU states a mesh without its links' sum (stored before the rule) was a 422
    # naming the GPU (change review)
    touched = {"gpu", "intra_node_bandwidth_bytes_per_s", "gpus_per_node"} & set(sent)
    try:
        replacement = ClusterCreate.model_validate(merged, context=None if touched else STORED)
    except ValidationError as exc:  # e.g. a stored custom GPU that no longer validates
        raise Unprocessable("the patched cluster is not valid", errors=_patch_errors(exc)) from exc
    replacement._sent_as |= patch._sent_as  # its errors name the twins the PATCH sent
    _check_name_free(repo, replacement.name, record.id)
    _apply(record, replacement)
    return _save(repo, record)


def _patch_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """The errors of a patched cluster as a POST names them: a model validator's refusal (``FieldError``,
    the GPU count past the service's scale) names its field and limit, which the patch lost (field "",
    no limit: a boundary review)."""
    errors = []
    for e in exc.errors():
        refused = (e.get("ctx") or {}).get("error")
        entry: dict[str, Any] = {
            "field": ".".join(map(str, e["loc"])),
            "message": e["msg"],
            "type": e["type"],
        }
        if isinstance(refused, FieldError):
            entry["field"] = ".".join(filter(None, (entry["field"], refused.field)))
            entry["message"] = str(refused)
            if refused.limit is not None:
                entry["limit"] = {"le": refused.limit}
            elif refused.least is not None:
                entry["limit"] = {"ge": refused.least}
        errors.append(entry)
    return errors


def delete_cluster(
    repo: ClusterRepository, cluster_id: str, preconditions: Preconditions = UNCONDITIONAL
) -> None:
    """Delete a cluster no stored plan refers to (and, with If-Match, that has not changed since)."""
    record = stored_cluster(repo, cluster_id, for_write=True)
    check_version(record, None, preconditions)
    plans = repo.plan_count(cluster_id)
    if plans:
        raise _referenced(cluster_id, plans)
    try:
        repo.delete(record)
    except IntegrityError as exc:
        # a plan on it was stored between the count and the delete (SQLite: the row is not locked):
        # the 409 the count would have given, its field named (change review)
        raise _referenced(cluster_id, None) from exc


def _referenced(cluster_id: str, plans: int | None) -> Conflict:
    count = f"{plans} stored plan(s)" if plans is not None else "a plan stored meanwhile"
    error: dict[str, object] = {"field": "cluster_id", "message": "referenced by plans"}
    if plans is not None:
        error["plans"] = plans
    return Conflict(
        f"cluster {cluster_id!r} is referenced by {count}; delete those plans first", errors=[error]
    )


def _apply(record: ClusterRecord, body: ClusterCreate) -> None:
    """Validate the whole cluster (catalog GPU, bandwidth defaults) and write it to the row."""
    spec = body.to_domain()  # validates: catalog GPU, bandwidth defaults, inter-node when needed
    record.name = body.name
    record.description = body.description
    if isinstance(body.gpu, CustomGPU):
        record.gpu_name, record.gpu_spec = None, stored_custom_gpu(body.gpu)
    else:
        record.gpu_name, record.gpu_spec = body.gpu, None
    record.num_nodes = spec.num_nodes
    record.gpus_per_node = spec.gpus_per_node
    # Stored as given: None keeps following the default (the GPU's link; intra-node on one node).
    record.intra_node_bandwidth_bytes_per_s = body.intra_node_bandwidth_bytes_per_s
    record.inter_node_bandwidth_bytes_per_s = body.inter_node_bandwidth_bytes_per_s
    record.cpu_memory_bytes_per_node = spec.cpu_memory_bytes_per_node
    record.nvme_bytes_per_node = spec.nvme_bytes_per_node
    record.measured_intra_node_bus_bandwidth_bytes_per_s = spec.measured_intra_node_bus_bandwidth_bytes_per_s
    record.measured_inter_node_bus_bandwidth_bytes_per_s = spec.measured_inter_node_bus_bandwidth_bytes_per_s


# Custom-GPU fields added after 2026-12-05, stored only where the client stated other than their
# default: a row a release before them reads back (a rollback, alembic downgrade, is documented) holds
# no key its strict CustomGPU refuses (an upgrade review: a description-only PATCH wrote peer_to_peer
# into every custom GPU, and the rolled-back release answered 500 on GET /v1/clusters).
_LATER_CUSTOM_GPU_DEFAULTS: dict[str, object] = {"peer_to_peer": True, "vendor": None, "mesh_links": None}


def stored_custom_gpu(gpu: CustomGPU) -> dict[str, Any]:
    """A custom GPU as its row stores it: every field, but those of ``_LATER_CUSTOM_GPU_DEFAULTS`` at
    their default."""
    fields = gpu.model_dump()
    for name, default in _LATER_CUSTOM_GPU_DEFAULTS.items():
        if fields.get(name) == default:
            del fields[name]
    return fields


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
        # named as the check names it (the existing id is not readable in the failed transaction)
        raise Conflict(
            f"a cluster named {record.name!r} already exists",
            errors=[{"field": "name", "message": "must be unique"}],
        ) from exc


def cluster_form(
    cluster: ClusterRef | ClusterIn, repo: ClusterRepository, field: str = "cluster.id"
) -> ClusterShape:
    """The cluster as given: inline, or the stored one's fields as they were written (its defaults
    left out). An unknown id (or another owner's) is a 404 naming `field`, as the cluster's own URL
    answers: the request is well formed, the resource it names is not there."""
    if isinstance(cluster, ClusterIn):
        return cluster
    record = repo.get(cluster.id)
    if record is None:
        raise NotFound(
            f"cluster {cluster.id!r} does not exist",
            errors=[{"field": field, "message": "no stored cluster has this id", "type": "unknown_cluster"}],
        )
    return ClusterCreate.model_validate(record_fields(record), context=STORED)


def domain_cluster(form: ClusterShape) -> ClusterSpec:
    """``cluster_form``'s cluster -> ClusterSpec, an inline one's errors named where it sits."""
    return form.to_domain(at="cluster." if isinstance(form, ClusterIn) else "")


def resolve_cluster(
    cluster: ClusterRef | ClusterIn, repo: ClusterRepository, field: str = "cluster.id"
) -> ClusterSpec:
    """A stored cluster id or an inline cluster -> ClusterSpec (``cluster_form``)."""
    return domain_cluster(cluster_form(cluster, repo, field))
