"""Rows: clusters, plans, observed runs and idempotency keys. Wire schemas live in api/schemas/."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.persistence.db import Base, UTCDateTime, new_id, utcnow

# Who owns what: clusters, plans (and through them their runs) and idempotency keys belong to the
# owner of the API key that created them; without authentication every request acts as this owner.
LOCAL_OWNER = "local"
OWNER_MAX_LENGTH = 100


class ClusterRecord(Base):
    __tablename__ = "clusters"
    __table_args__ = (UniqueConstraint("owner", "name", name="uq_clusters_owner_name"),)

    id: Mapped[str] = mapped_column(String(26), primary_key=True, default=new_id)
    owner: Mapped[str] = mapped_column(String(OWNER_MAX_LENGTH), server_default=LOCAL_OWNER)
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    # Either a catalog GPU name, or null with `gpu_spec` holding a complete custom spec.
    gpu_name: Mapped[str | None] = mapped_column(String(100))
    gpu_spec: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    num_nodes: Mapped[int] = mapped_column(Integer)
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    # As given; None: the default (the GPU's intra-node link; on one node, inter = intra).
    intra_node_bandwidth_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    inter_node_bandwidth_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    # nccl-tests all_reduce busbw as the owner measured it; None: not measured
    measured_intra_node_bus_bandwidth_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    measured_inter_node_bus_bandwidth_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    cpu_memory_bytes_per_node: Mapped[int] = mapped_column(BigInteger)
    nvme_bytes_per_node: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    # Optimistic concurrency: every UPDATE and DELETE names the version it read (StaleDataError
    # when another writer got there first), so concurrent changes cannot combine.
    version: Mapped[int] = mapped_column(Integer, server_default="1")

    __mapper_args__ = {"version_id_col": version}  # noqa: RUF012  (SQLAlchemy reads it at class creation)


class PlanRecord(Base):
    __tablename__ = "plans"
    __table_args__ = (
        Index("ix_plans_cluster_id_id", "cluster_id", "id"),
        Index("ix_plans_model_name_id", "model_name", "id"),
        Index("ix_plans_hardware_key_framework", "hardware_key", "framework"),
        Index("ix_plans_owner_id", "owner", "id"),
    )

    id: Mapped[str] = mapped_column(String(26), primary_key=True, default=new_id)
    owner: Mapped[str] = mapped_column(String(OWNER_MAX_LENGTH), server_default=LOCAL_OWNER)
    # RESTRICT: a stored cluster that plans refer to cannot be deleted (409); every plan also
    # keeps the cluster it was made for in `cluster_snapshot`, so later edits don't rewrite history.
    cluster_id: Mapped[str | None] = mapped_column(String(26), ForeignKey("clusters.id", ondelete="RESTRICT"))
    cluster_snapshot: Mapped[dict[str, Any]] = mapped_column(JSON)
    # Fingerprint of the resolved hardware (GPU spec, node shape, links): calibration learned from
    # runs applies to later estimates on the same hardware and framework.
    hardware_key: Mapped[str] = mapped_column(String(64))
    framework: Mapped[str | None] = mapped_column(String(20))  # of the recommended layout
    model_name: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(20))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    result: Mapped[dict[str, Any]] = mapped_column(JSON)
    artifacts: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    catalog_version: Mapped[str] = mapped_column(String(64))
    estimator_version: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    runs: Mapped[list[RunRecord]] = relationship(
        back_populates="plan", cascade="all, delete-orphan", passive_deletes=True
    )


class RunRecord(Base):
    """What a real run of a plan measured, and how it compared with the estimate."""

    __tablename__ = "runs"

    __table_args__ = (Index("ix_runs_owner_hardware_key", "owner", "hardware_key"),)

    id: Mapped[str] = mapped_column(String(26), primary_key=True, default=new_id)
    plan_id: Mapped[str] = mapped_column(String(26), ForeignKey("plans.id", ondelete="CASCADE"), index=True)
    # The plan's owner and hardware, copied (neither changes): calibration finds an owner's runs on
    # some hardware through this index, without reading every plan made for that hardware.
    owner: Mapped[str] = mapped_column(String(OWNER_MAX_LENGTH), server_default=LOCAL_OWNER)
    hardware_key: Mapped[str] = mapped_column(String(64), server_default="")
    peak_memory_bytes_per_gpu: Mapped[int | None] = mapped_column(BigInteger)
    # which statistic that peak is (an estimator.types.MemoryStatistic: allocated, reserved,
    # device_used), as posted or read from the log; null: no peak, or a typed one that did not say
    memory_statistic: Mapped[str | None] = mapped_column(String(20))
    step_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    gpu_utilization: Mapped[float | None] = mapped_column(Float)
    out_of_memory: Mapped[bool] = mapped_column(default=False)
    framework_version: Mapped[str] = mapped_column(String(100), default="")
    notes: Mapped[str] = mapped_column(Text, default="")
    diagnosis: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # a run posted as a log: what was read, from which lines (service.runlogs.ParsedLog.stored)
    source: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True, default=None)
    # the calibration the answer that stored it gave, which a retry with its Idempotency-Key replays
    calibration: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True, default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    plan: Mapped[PlanRecord] = relationship(back_populates="runs")


class IdempotencyKeyRecord(Base):
    """A retried write with the same key and body returns the first result and creates nothing."""

    __tablename__ = "idempotency_keys"

    # Each owner has its own keys: another owner's identical key neither replays nor reveals anything.
    owner: Mapped[str] = mapped_column(String(OWNER_MAX_LENGTH), primary_key=True, server_default=LOCAL_OWNER)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    scope: Mapped[str] = mapped_column(String(100), primary_key=True)  # e.g. "POST /v1/plans"
    request_sha256: Mapped[str] = mapped_column(String(64))
    resource_id: Mapped[str] = mapped_column(String(26))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


# How a key was made: "operator" on the database (`trainplan keys create` without --url), "api"
# by an authenticated admin (POST /v1/api-keys, which exists only under authentication), "unknown"
# before this was recorded (an unauthenticated POST may have made it; the migration revoked those).
ApiKeyOrigin = Literal["operator", "api", "unknown"]


class ApiKeyRecord(Base):
    """An API key: its owner and scopes, and the SHA-256 of its secret (the secret itself is shown
    once, at creation, and never stored). Revoked keys stay, so a list shows when they were revoked."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(26), primary_key=True, default=new_id)
    owner: Mapped[str] = mapped_column(String(OWNER_MAX_LENGTH), index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    scopes: Mapped[list[str]] = mapped_column(JSON)
    secret_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_via: Mapped[str] = mapped_column(String(20))  # an ApiKeyOrigin
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
