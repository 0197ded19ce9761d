"""What the service stores and reads back, typed: a plan's result (`PlanResult`), its launcher
files (`StoredArtifact`), the request it was made for (the part read back: `StoredRequest`) and a
run's diagnosis (`RunDiagnosis`).

The stored JSON is read through these models only, so every reader sees the same fields with the
same defaults. Versioned: ``version`` is written with each result; results stored before it (and
before the keys that came later: ``suggestions_skipped``, ``closest``, ``resolved_defaults``,
``step_time_learned``, ``implausible_runs``, ...) read back as version 0, each missing key at its
default. Keys a model does not name are kept (``extra="allow"``), so reading and writing a result
back loses nothing another version stored. A change of meaning bumps ``RESULT_VERSION`` and reads
the older versions in a validator here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.contracts.estimates import CalibrationOut
from service.contracts.plans import (
    LOG_STATISTIC_IS,
    UNSTATED_PEAK_STATISTIC,
    ArtifactOut,
    CandidateOut,
    ClosestOut,
)
from service.estimator.types import MemoryStatistic

# 1: the first typed result (the keys of every earlier one, all of them present).
# 2: a run's diagnosis names the statistic its peak was compared as in the estimate's words
# (allocated, reserved, device_used) and whether that was assumed; 1 named a log's reading
# (max_reserved, ...) and None for a typed peak, compared as device used (RunDiagnosis reads both).
# 3: a rejected memory miss's capacity_bytes is the card's, allowed_bytes the limit it was compared with
# (the card less the plan's headroom), which 2 stored as capacity_bytes (PlanResult reads both).
RESULT_VERSION = 3


class Stored(BaseModel):
    """A stored record: keys this version does not name are kept, not dropped."""

    model_config = ConfigDict(extra="allow")


class SearchStatsOut(Stored):
    """`recommender.types.SearchStats` as stored."""

    candidates_evaluated: int = 0
    duration_s: float = 0.0
    truncated: bool = False
    truncated_by: str | None = None
    families_considered: int = 0
    memory_evaluations: int = 0
    time_evaluations: int = 0
    full_estimates: int = 0

    @property
    def evaluations(self) -> int:
        """Layout evaluations of the search, memory and step time together."""
        return self.memory_evaluations + self.time_evaluations


class RejectionOut(Stored):
    """`recommender.types.Rejection` as stored; the example layout as the estimator's fields."""

    reason: str
    count: int
    example: dict[str, Any]
    detail: str
    per_gpu_bytes: int | None = Field(default=None, description="a memory miss: the example's need per GPU")
    allowed_bytes: int | None = Field(
        default=None,
        description="a memory miss: what the need was compared with, the card less the plan's headroom "
        "(constraints.min_headroom_fraction); the need is under the memory factor of runs on this hardware, "
        "where resolved_defaults' search.memory_dynamic_factor names one",
    )
    capacity_bytes: int | None = Field(
        default=None, description="a memory miss: the card's memory (estimate.memory.capacity_bytes)"
    )


class SuggestionOut(Stored):
    """`recommender.types.Suggestion` as stored."""

    kind: str
    detail: str
    gpu: str | None = None
    num_gpus: int | None = None
    num_nodes: int | None = None
    gpus_per_node: int | None = None
    inter_node_bandwidth_bytes_per_s: float | None = None
    per_gpu_bytes: int | None = Field(
        default=None,
        description="the layout's memory per GPU as device used (nvidia-smi's figure, the statistic the "
        "fit compares with the card); null where the suggestion states GPUs and speed alone (more_gpus, "
        "other_gpu: estimate its layout for the figures)",
    )
    cpu_per_node_bytes: int | None = None
    nvme_per_node_bytes: int | None = Field(
        default=None,
        description="the NVMe per node the suggestion's layout offloads to (ZeRO-Infinity); null where none",
    )
    tokens_per_s: float | None = None
    layout: dict[str, Any] | None = None
    method: str | None = None
    seq_len: int | None = None
    base_dtype: str | None = None
    optimizer_implementation: str | None = Field(
        default=None, description="the training.optimizer_implementation it assumed, where it changes it"
    )
    optimizer: str | None = Field(
        default=None, description="the training.optimizer it assumed, where it changes it"
    )
    on_the_gpus_given: bool = False
    truncated: bool = False


class SkippedOut(Stored):
    """`recommender.types.Skipped` as stored: a suggestion not computed, and why."""

    kind: str
    reason: str


class PlanResult(Stored):
    """A stored plan's result (PlanRecord.result): candidates in their wire shape (estimate, score
    and rationale under their framework's calibration), what was rejected and suggested, the
    search's statistics and the calibration applied."""

    version: int = Field(default=0, description="RESULT_VERSION when written; 0: stored before versions")
    status: Literal["feasible", "infeasible"]
    recommended: CandidateOut | None = None
    alternatives: list[CandidateOut] = Field(default_factory=list)
    rejected: list[RejectionOut] = Field(default_factory=list)
    suggestions: list[SuggestionOut] = Field(default_factory=list)
    suggestions_skipped: list[SkippedOut] = Field(default_factory=list)
    closest: ClosestOut | None = None
    resolved_defaults: dict[str, str] = Field(default_factory=dict)
    search: SearchStatsOut = Field(default_factory=SearchStatsOut)
    unsupported_targets: dict[str, str] = Field(default_factory=dict)
    calibration: CalibrationOut | None = None

    @classmethod
    def read(cls, stored: Mapping[str, Any]) -> PlanResult:
        return cls.model_validate(stored)

    @model_validator(mode="before")
    @classmethod
    def _allowed_before_version_3(cls, data: Any) -> Any:
        """Versions 0-2 stored a memory miss's limit (the card less the headroom) as capacity_bytes,
        beside estimates whose capacity_bytes is the card: read as allowed_bytes, the card unknown."""
        if not isinstance(data, dict) or data.get("version", 0) >= 3 or not data.get("rejected"):
            return data
        rejected = [
            {**r, "allowed_bytes": r.get("capacity_bytes"), "capacity_bytes": None}
            if isinstance(r, dict) and "allowed_bytes" not in r and r.get("capacity_bytes") is not None
            else r
            for r in data["rejected"]
        ]
        return {**data, "rejected": rejected}

    def stored(self) -> dict[str, Any]:
        """The JSON to store."""
        return self.model_dump(mode="json")


class StoredArtifact(Stored):
    """One launcher file of a plan (PlanRecord.artifacts)."""

    name: str
    target: str
    media_type: str
    content: str

    def out(self, plan_id: str) -> ArtifactOut:
        return ArtifactOut(
            name=self.name,
            target=self.target,
            media_type=self.media_type,
            size_bytes=len(self.content.encode()),
            url=f"/v1/plans/{plan_id}/artifacts/{self.name}",
        )

    @classmethod
    def read_all(cls, stored: list[dict[str, Any]]) -> list[StoredArtifact]:
        return [cls.model_validate(a) for a in stored]


class StoredTraining(Stored):
    """What is read back of a stored request's training (the rest is kept as stored)."""

    seq_len: int
    global_batch_size: int

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch_size


class StoredRequest(Stored):
    """A stored plan's request (PlanRecord.request), as far as it is read back: the body was
    validated when the plan was made, and a later version's rules must not refuse it now."""

    training: StoredTraining

    @classmethod
    def read(cls, stored: Mapping[str, Any]) -> StoredRequest:
        return cls.model_validate(stored)


class StoredLayout(Stored):
    """A candidate's layout as stored (the estimator's Layout fields, derived ones filled in), as
    far as a run's diagnosis reads it."""

    framework: str
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero_stage: int = 0
    micro_batch_size: int = 1
    recompute: str = "none"


class RunDiagnosis(Stored):
    """A run's diagnosis against its plan's estimate (RunRecord.diagnosis; service.feedback)."""

    version: int = Field(default=0, description="RESULT_VERSION when written; 0: stored before versions")
    # None: stored before runs were checked (planning.runs gives such a run the check's verdict)
    implausible: bool | None = None
    implausible_reasons: list[str] = Field(default_factory=list)
    memory_error: float | None = None
    step_time_error: float | None = None
    estimated_peak_memory_bytes_per_gpu: int | None = None
    # the statistic both peaks are compared as (the run's memory_statistic; UNSTATED_PEAK_STATISTIC
    # where it did not say); assumed: a peak was compared without its statistic said
    memory_statistic: MemoryStatistic | None = None
    memory_statistic_assumed: bool = False
    estimated_step_s: float | None = None
    measured_step_s: float | None = None
    advice: list[str] = Field(default_factory=list)

    @classmethod
    def read(cls, stored: Mapping[str, Any]) -> RunDiagnosis:
        return cls.model_validate(stored)

    @model_validator(mode="before")
    @classmethod
    def _statistic_before_version_2(cls, data: Any) -> Any:
        """Versions 0 and 1 named a log's reading, or nothing for a typed peak (compared as device
        used): in the estimate's words, as version 2 names them. (A log's allocated or reserved peak
        on a plan stored before the statistics were named was compared as device used: such a
        diagnosis reads as allocated or reserved, its estimated peak as stored.)"""
        if not isinstance(data, dict) or data.get("version", 0) >= 2 or "memory_statistic_assumed" in data:
            return data
        logged = data.get("memory_statistic")
        statistic = next((v for k, v in LOG_STATISTIC_IS.items() if k == logged), UNSTATED_PEAK_STATISTIC)
        assumed = logged is None and data.get("memory_error") is not None  # a typed peak was compared
        return {**data, "memory_statistic": statistic, "memory_statistic_assumed": assumed}

    def stored(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def out(self) -> dict[str, Any]:
        """The wire shape (RunOut.diagnosis): the stored keys, without the version."""
        return self.model_dump(mode="json", exclude={"version"})
