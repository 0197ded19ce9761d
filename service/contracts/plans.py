"""Plans and their runs: the request, the stored plan with its candidates and artifacts, runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from service.contracts.clusters import ClusterChoice
from service.contracts.common import MAX_MEMORY_BYTES, MIN_MEMORY_BYTES, FieldError, Strict
from service.contracts.estimates import EstimateOut
from service.contracts.models import ModelRef
from service.contracts.training import TrainingIn
from service.estimator.types import Framework, MemoryStatistic
from service.launchers import Target
from service.recommender import headroom
from service.recommender.types import MAX_EVALUATIONS, Constraints, Objective
from service.runlogs.common import MemoryStatistic as LogStatistic

# the most a GPU-hour is priced at (a plan's constraints.gpu_hour_cost, a capacity request's prices)
MAX_GPU_HOUR_COST = 1e6


class ConstraintsIn(Strict):
    objective: Objective = Objective.THROUGHPUT
    max_gpus: int | None = Field(default=None, ge=1, le=10_000_000)
    frameworks: list[Framework] | None = Field(default=None, min_length=1, description="default: all")
    allow_offload: bool = True
    min_headroom_fraction: float = Field(
        default=headroom.DEFAULT_FRACTION, ge=0, le=headroom.MAX_REQUESTED_FRACTION
    )
    top_k: int = Field(default=3, ge=1, le=20)
    gpu_hour_cost: float | None = Field(default=None, ge=0, le=MAX_GPU_HOUR_COST)
    torch_compile: bool = Field(
        default=False,
        description="compile fsdp layouts with torch.compile, model and loss (torchtitan --compile.enable, "
        "HF Trainer torch_compile, accelerate's dynamo backend); not qlora; megatron and deepspeed layouts "
        "stay eager",
    )

    max_evaluations: int | None = Field(
        default=None,
        ge=1,
        le=MAX_EVALUATIONS,
        description="a cap on the layouts the request evaluates (memory or step time); stated, the "
        "request's parts share its evaluations as well as its time, so a search it cuts before the time "
        "does (search.truncated_by 'evaluations') answers the same on any machine, where the request's "
        "CPU time ('time') depends on the machine's load; default: "
        f"{MAX_EVALUATIONS:,}",
    )

    def to_domain(self) -> Constraints:
        return Constraints(
            max_evaluations=MAX_EVALUATIONS if self.max_evaluations is None else self.max_evaluations,
            objective=self.objective,
            max_gpus=self.max_gpus,
            frameworks=tuple(dict.fromkeys(self.frameworks)) if self.frameworks else tuple(Framework),
            allow_offload=self.allow_offload,
            min_headroom_fraction=self.min_headroom_fraction,
            top_k=self.top_k,
            gpu_hour_cost=self.gpu_hour_cost,
            torch_compile=self.torch_compile,
        )


class PlanRequest(Strict):
    model: ModelRef
    cluster: ClusterChoice = Field(description='{"id": ...} of a stored cluster, or an inline one')
    training: TrainingIn
    constraints: ConstraintsIn = Field(default_factory=ConstraintsIn)
    launchers: list[Target] = Field(default_factory=list, max_length=16, description="targets to render")


class CandidateOut(BaseModel):
    layout: dict[str, Any]
    estimate: EstimateOut
    score: float = Field(
        description="the objective's value for this layout (recommender.rank.score): throughput, tokens/s; "
        "fewest_gpus, GPUs; cost, GPU-hours per million tokens times constraints.gpu_hour_cost (without "
        "a price, the GPU-hours alone, which rank the same); time_to_train, seconds to train "
        "training.tokens (without tokens, tokens/s, as throughput)"
    )
    rationale: list[str]


class ArtifactOut(BaseModel):
    name: str
    target: str
    media_type: str
    size_bytes: int
    url: str


class ClosestOut(BaseModel):
    layout: dict[str, Any]
    estimate: EstimateOut
    over_bytes: int = Field(
        description="per-GPU bytes above what the search allows: the card less "
        "constraints.min_headroom_fraction"
    )
    detail: str


class PlanOut(BaseModel):
    id: str
    created_at: datetime
    status: Literal["feasible", "infeasible"]
    model: str
    cluster_id: str | None
    cluster: dict[str, Any] = Field(
        default_factory=dict,
        description="the cluster the plan was made for, as it was then (its GPU's spec, nodes, links, host "
        "RAM and NVMe): a stored cluster edited since does not change it",
    )
    request: dict[str, Any]
    recommended: CandidateOut | None
    alternatives: list[CandidateOut]
    rejected: list[dict[str, Any]]
    suggestions: list[dict[str, Any]] = Field(
        description="infeasible: what would make it fit, in the order a user can act: on the GPUs given "
        "(offload within the stated host RAM, torch.compile, LoRA, QLoRA, a shorter sequence), then more "
        "of the same GPU (or the host RAM offload needs), then other GPUs in whole nodes of their shape; "
        "each with the layout, node shape, method and sequence it assumed; per_gpu_bytes is device used "
        "(nvidia-smi's figure, the statistic the fit compares), null for more_gpus and other_gpu"
    )
    suggestions_skipped: list[dict[str, str]] = Field(
        default_factory=list,
        description="suggestions considered and not made: kind and reason (its share of the budget ran "
        "out, a bound shows no layout of it can fit, its search found none that fits, or the GPU type "
        "cannot run the job as asked)",
    )
    closest: ClosestOut | None = Field(
        default=None,
        description="infeasible: the layout that came closest to fitting, its estimate and how far over",
    )
    resolved_defaults: dict[str, str] = Field(
        default_factory=dict,
        description="training fields the request left out, as resolved for the GPU, the link "
        "bandwidths a custom GPU left out, in bytes/s (cluster.gpu.intra_node_bandwidth_bytes_per_s), "
        'the catalog slugs of names given otherwise ({"model.preset": "llama-3.1-8b"} for '
        '"meta-llama/Llama-3.1-8B", {"cluster.gpu": "h100-sxm-80gb"} for "H100 SXM5 80GB"), and an inline '
        "cluster's node and network left out, as its part's reference node has them "
        '({"cluster.gpus_per_node": "8", "cluster.inter_node_bandwidth_bytes_per_s": "50000000000"}), '
        "and the memory factor stored runs on this hardware set, which the search fitted each layout of "
        "their framework and family with (search.memory_dynamic_factor)",
    )
    search: dict[str, Any]
    artifacts: list[ArtifactOut]
    unsupported_targets: dict[str, str] = Field(
        description="requested targets that cannot express the layout"
    )
    calibration: dict[str, Any] | None
    versions: dict[str, str] = Field(description="catalog and estimator versions that made the plan")


# A log's text: the service's body limit (PLANNER_MAX_BODY_BYTES, 1 MiB by default) bounds it too
MAX_LOG_CHARS = 1_000_000
MEASUREMENTS = ("peak_memory_bytes_per_gpu", "step_s", "tokens_per_s", "gpu_utilization", "out_of_memory")
# What a typed peak that does not say its statistic is taken as: the figure runs were compared as
# before memory_statistic existed, and the one an out-of-memory message or nvidia-smi gives
UNSTATED_PEAK_STATISTIC = MemoryStatistic.DEVICE_USED
STATISTIC_SOURCES = {
    MemoryStatistic.ALLOCATED: "torch.cuda.max_memory_allocated()",
    MemoryStatistic.RESERVED: "torch.cuda.max_memory_reserved()",
    MemoryStatistic.DEVICE_USED: "nvidia-smi's memory used by the process, reserved + CUDA context + NCCL",
}
STATISTIC_HELP = "; ".join(f"{statistic.value}: {source}" for statistic, source in STATISTIC_SOURCES.items())
# The estimate's statistic each reading a log prints is of: the peak and the at-print reading alike
# (a log's peak is the largest reading of the steady steps)
LOG_STATISTIC_IS: dict[LogStatistic, MemoryStatistic] = {
    "max_allocated": MemoryStatistic.ALLOCATED,
    "allocated": MemoryStatistic.ALLOCATED,
    "max_reserved": MemoryStatistic.RESERVED,
    "reserved": MemoryStatistic.RESERVED,
    "device_used": MemoryStatistic.DEVICE_USED,
}


class RunIn(Strict):
    """What a real run of the plan measured: typed figures, or the log the framework printed
    (`log`, read as `format` says; service.runlogs), never both."""

    log: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_LOG_CHARS,
        description="the training log as the framework printed it (instead of the typed figures): "
        "Megatron-LM, torchtitan, DeepSpeed, HF Trainer or accelerate lines, or a CUDA out-of-memory error",
    )
    format: Literal["auto", "megatron", "torchtitan", "deepspeed", "hf_trainer", "accelerate"] = Field(
        default="auto", description="the framework whose lines `log` holds; auto tries each"
    )
    peak_memory_bytes_per_gpu: int | None = Field(default=None, ge=MIN_MEMORY_BYTES, le=MAX_MEMORY_BYTES)
    memory_statistic: MemoryStatistic | None = Field(
        default=None,
        description="which statistic peak_memory_bytes_per_gpu is, so it is compared with the estimate's "
        f"figure of the same one ({STATISTIC_HELP}); only with peak_memory_bytes_per_gpu (a log says "
        f"its own); left out: {UNSTATED_PEAK_STATISTIC.value}, and the diagnosis says it was assumed",
    )
    step_s: float | None = Field(
        default=None, ge=1e-3, le=1e7, description="seconds per optimizer step (a global batch)"
    )  # no training step takes under 1 ms
    tokens_per_s: float | None = Field(
        default=None,
        ge=1.0,
        le=1e12,
        # undocumented, a per-GPU figure typed on a plan of 4 GPUs or fewer stayed within the 4x
        # plausibility bound and calibrated wrongly (logs review)
        description="tokens per second of the whole job, all GPUs together (torchtitan's tps is per GPU: "
        "multiply by the GPUs)",
    )
    gpu_utilization: float | None = Field(default=None, ge=0, le=1)
    out_of_memory: bool = False
    framework_version: str = Field(default="", max_length=100)
    notes: str = Field(default="", max_length=4000)

    @field_validator("memory_statistic")
    @classmethod
    def _statistic_of_a_typed_peak(
        cls, statistic: MemoryStatistic | None, info: ValidationInfo
    ) -> MemoryStatistic | None:
        # a field validator, so the problem names memory_statistic (the fields above it are validated)
        if statistic is None:
            return statistic
        if info.data.get("log") is not None:
            raise ValueError("a log says which statistic its peak is: drop memory_statistic or log")
        # (a peak refused by its own limits is absent here: its own error names it)
        if "peak_memory_bytes_per_gpu" in info.data and info.data["peak_memory_bytes_per_gpu"] is None:
            raise ValueError("says which statistic peak_memory_bytes_per_gpu is: give that peak with it")
        return statistic

    @model_validator(mode="after")
    def _something_measured(self) -> RunIn:
        # a field sent with its default value (a generated client sends every default: out_of_memory
        # false, format auto) says nothing: only what differs from the default counts as given
        given = {
            name for name in self.model_fields_set if getattr(self, name) != RunIn.model_fields[name].default
        }
        if self.log is not None:
            typed = [name for name in MEASUREMENTS if name in given]
            if typed:
                dropped = ", ".join(typed)
                raise FieldError(f"give a log or typed figures, not both: drop {dropped} or log", "log")
            return self
        if "format" in given:
            raise FieldError("format says how to read a log: give log with it", "format")
        if self.step_s is not None and self.tokens_per_s is not None:
            raise FieldError("give step_s or tokens_per_s, not both", "tokens_per_s")
        measured = (self.peak_memory_bytes_per_gpu, self.step_s, self.tokens_per_s)
        if not self.out_of_memory and all(m is None for m in measured):
            raise ValueError("report peak_memory_bytes_per_gpu, step_s or tokens_per_s, or out_of_memory")
        return self


class RunOut(BaseModel):
    id: str
    plan_id: str
    created_at: datetime
    peak_memory_bytes_per_gpu: int | None
    memory_statistic: MemoryStatistic | None = Field(
        default=None,
        description="which statistic peak_memory_bytes_per_gpu is, as posted or as the log printed it "
        "(max_allocated and allocated: allocated; max_reserved and reserved: reserved); null: no peak, "
        f"or a typed one that did not say (compared as {UNSTATED_PEAK_STATISTIC.value}: "
        "diagnosis.memory_statistic names the statistic compared)",
    )
    step_s: float | None
    tokens_per_s: float | None
    gpu_utilization: float | None
    out_of_memory: bool
    framework_version: str
    notes: str
    diagnosis: dict[str, Any]
    source: dict[str, Any] | None = Field(
        default=None,
        description="a run posted as a log: the format read, each figure with how it was made "
        "(warm-up skipped, median of the steady steps) and from which lines, the memory statistic "
        "(device_used, max_reserved, reserved, max_allocated, allocated), an out-of-memory error's "
        "quoted figures, excerpts of the lines; null for typed runs",
    )
    calibration: dict[str, Any] | None = Field(
        default=None, description="factors later estimates on this hardware and framework will apply"
    )
