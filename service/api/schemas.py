"""Wire schemas: pydantic models at the edge, with Field limits, turned into domain types here."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from service.catalog.errors import UnknownCatalogEntry
from service.catalog.gpus import gpu as catalog_gpu
from service.catalog.models import model as catalog_model
from service.errors import Unprocessable
from service.estimator.errors import EstimatorError
from service.estimator.hf_config import model_from_hf_config
from service.estimator.types import (
    ALL_LINEAR,
    Attention,
    ClusterSpec,
    Framework,
    GPUSpec,
    Layout,
    Method,
    MlpKind,
    ModelSpec,
    MoESpec,
    NormKind,
    Offload,
    Optimizer,
    PeakFlops,
    PositionEmbedding,
    Precision,
    Recompute,
    TrainingSpec,
)
from service.launchers import Target
from service.recommender.types import Constraints, Objective

GB_PER_S = 1e9  # the *_gbps inputs are GB/s (1e9 bytes/s), converted once here
MAX_BANDWIDTH_BYTES_PER_S = 1e14  # 100 TB/s per GPU: far above any link that exists
MAX_MEMORY_BYTES = 2**44  # 16 TiB: any larger "GPU" or host is a typo
MAX_FLOPS_PER_S = 1e18

T = TypeVar("T")


class Strict(BaseModel):
    """Unknown fields are errors; `X_gbps` is accepted wherever `X_bytes_per_s` is a field."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _gbps_to_bytes_per_s(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for key in data:
            if not (isinstance(key, str) and key.endswith("_gbps")):
                continue
            target = key.removesuffix("_gbps") + "_bytes_per_s"
            if target not in cls.model_fields:
                continue  # left in place: `extra="forbid"` names it
            if target in data:
                raise ValueError(f"give either {key} or {target}, not both")
            value = out.pop(key)
            out[target] = value * GB_PER_S if isinstance(value, int | float) else value
        return out


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = None


# ---------------------------------------------------------------- GPUs and clusters


class PeakFlopsIn(Strict):
    fp32: float = Field(gt=0, le=MAX_FLOPS_PER_S)
    tf32: float | None = Field(default=None, gt=0, le=MAX_FLOPS_PER_S)
    bf16: float | None = Field(default=None, gt=0, le=MAX_FLOPS_PER_S)
    fp16: float | None = Field(default=None, gt=0, le=MAX_FLOPS_PER_S)
    fp8: float | None = Field(default=None, gt=0, le=MAX_FLOPS_PER_S)


class CustomGPU(Strict):
    """A GPU that is not in the catalog: every field is required (peaks dense, not sparse)."""

    name: str = Field(min_length=1, max_length=100)
    memory_bytes: int = Field(gt=0, le=MAX_MEMORY_BYTES)
    peak_flops_per_s: PeakFlopsIn
    hbm_bandwidth_bytes_per_s: float = Field(gt=0, le=MAX_BANDWIDTH_BYTES_PER_S)
    intra_node_bandwidth_bytes_per_s: float = Field(gt=0, le=MAX_BANDWIDTH_BYTES_PER_S)
    pcie_bandwidth_bytes_per_s: float = Field(gt=0, le=MAX_BANDWIDTH_BYTES_PER_S)

    def to_domain(self) -> GPUSpec:
        return GPUSpec(
            name=self.name,
            memory_bytes=self.memory_bytes,
            peak_flops_per_s=PeakFlops(**self.peak_flops_per_s.model_dump()),
            hbm_bandwidth_bytes_per_s=self.hbm_bandwidth_bytes_per_s,
            intra_node_bandwidth_bytes_per_s=self.intra_node_bandwidth_bytes_per_s,
            pcie_bandwidth_bytes_per_s=self.pcie_bandwidth_bytes_per_s,
            vendor="custom",
            source="supplied by the client",
        )


def resolve_gpu(gpu: str | CustomGPU, field: str = "gpu") -> GPUSpec:
    """A catalog name or a custom spec -> GPUSpec; an unknown name is a 422 naming the field."""
    if isinstance(gpu, CustomGPU):
        return gpu.to_domain()
    try:
        return catalog_gpu(gpu)
    except UnknownCatalogEntry as exc:
        raise Unprocessable(
            str(exc),
            errors=[{"field": field, "message": str(exc), "type": "unknown_gpu", "known": list(exc.known)}],
        ) from exc


class ClusterShape(Strict):
    """The hardware of a cluster; bandwidths per GPU, one direction, bytes/s."""

    gpu: str | CustomGPU = Field(description="a catalog GPU name (GET /v1/gpus) or a custom spec")
    num_nodes: int = Field(ge=1, le=100_000)
    gpus_per_node: int = Field(ge=1, le=64)
    intra_node_bandwidth_bytes_per_s: float | None = Field(
        default=None, gt=0, le=MAX_BANDWIDTH_BYTES_PER_S, description="default: the GPU's NVLink/PCIe figure"
    )
    inter_node_bandwidth_bytes_per_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BANDWIDTH_BYTES_PER_S,
        description="each GPU's share of the node's network; required when num_nodes > 1",
    )
    cpu_memory_bytes_per_node: int = Field(default=0, ge=0, le=MAX_MEMORY_BYTES)
    nvme_bytes_per_node: int = Field(default=0, ge=0, le=2**50)

    def to_domain(self) -> ClusterSpec:
        gpu = resolve_gpu(self.gpu)
        intra = self.intra_node_bandwidth_bytes_per_s or gpu.intra_node_bandwidth_bytes_per_s
        inter = self.inter_node_bandwidth_bytes_per_s
        if inter is None:
            if self.num_nodes > 1:
                raise Unprocessable(
                    "inter_node_bandwidth_bytes_per_s is required when num_nodes > 1",
                    errors=[
                        {
                            "field": "inter_node_bandwidth_bytes_per_s",
                            "message": f"required when num_nodes ({self.num_nodes}) > 1",
                            "type": "missing",
                        }
                    ],
                )
            inter = intra  # one node: nothing crosses a network
        try:
            return ClusterSpec(
                gpu=gpu,
                num_nodes=self.num_nodes,
                gpus_per_node=self.gpus_per_node,
                intra_node_bandwidth_bytes_per_s=intra,
                inter_node_bandwidth_bytes_per_s=inter,
                cpu_memory_bytes_per_node=self.cpu_memory_bytes_per_node,
                nvme_bytes_per_node=self.nvme_bytes_per_node,
            )
        except EstimatorError as exc:  # pragma: no cover - Field limits catch these first
            raise Unprocessable(
                exc.message, errors=[{"field": exc.field or "cluster", "message": exc.message}]
            ) from exc


class ClusterCreate(ClusterShape):
    name: str = Field(min_length=1, max_length=200, pattern=r"^\S(.*\S)?$")
    description: str = Field(default="", max_length=2000)


class ClusterPatch(Strict):
    """Fields to change; the merged cluster is validated as a whole. Only the two bandwidths may
    be null: null puts them back to their defaults. (None below means "not sent".)"""

    name: str | None = Field(default=None, min_length=1, max_length=200, pattern=r"^\S(.*\S)?$")
    description: str | None = Field(default=None, max_length=2000)
    gpu: str | CustomGPU | None = None
    num_nodes: int | None = Field(default=None, ge=1, le=100_000)
    gpus_per_node: int | None = Field(default=None, ge=1, le=64)
    intra_node_bandwidth_bytes_per_s: float | None = Field(default=None, gt=0, le=MAX_BANDWIDTH_BYTES_PER_S)
    inter_node_bandwidth_bytes_per_s: float | None = Field(default=None, gt=0, le=MAX_BANDWIDTH_BYTES_PER_S)
    cpu_memory_bytes_per_node: int | None = Field(default=None, ge=0, le=MAX_MEMORY_BYTES)
    nvme_bytes_per_node: int | None = Field(default=None, ge=0, le=2**50)

    @field_validator(
        "name", "description", "gpu", "num_nodes", "gpus_per_node", "cpu_memory_bytes_per_node",
        "nvme_bytes_per_node", mode="before",
    )  # fmt: skip
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        # runs only for values the client sent: an explicit null is refused, naming the field
        if value is None:
            raise ValueError("may not be null (leave the field out to keep it)")
        return value


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
        description="fields taken from defaults (they follow the GPU and node count)"
    )
    cpu_memory_bytes_per_node: int
    nvme_bytes_per_node: int
    created_at: datetime
    updated_at: datetime


class ClusterRef(Strict):
    """A stored cluster, by id."""

    id: str = Field(min_length=1, max_length=64)


# ---------------------------------------------------------------- catalog


class PeakFlopsOut(BaseModel):
    fp32: float
    tf32: float | None
    bf16: float | None
    fp16: float | None
    fp8: float | None


class GPUOut(BaseModel):
    name: str
    display_name: str
    vendor: str
    memory_bytes: int
    peak_flops_per_s: PeakFlopsOut
    hbm_bandwidth_bytes_per_s: float
    intra_node_bandwidth_bytes_per_s: float
    pcie_bandwidth_bytes_per_s: float
    source: str
    notes: str = ""


class Problem(BaseModel):
    """RFC 9457 problem details, as every error is rendered."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None


# ---------------------------------------------------------------- models


class MoEIn(Strict):
    num_experts: int = Field(ge=1, le=4096)
    top_k: int = Field(ge=1, le=256)
    expert_ffn_hidden_size: int = Field(ge=1, le=1_000_000)
    num_shared_experts: int = Field(default=0, ge=0, le=64)
    shared_expert_ffn_hidden_size: int = Field(default=0, ge=0, le=1_000_000)
    shared_expert_gate: bool = False
    layer_frequency: int = Field(default=1, ge=1, le=1000)
    router_bias: bool = False


class ArchitectureIn(Strict):
    """Explicit architecture fields; what a config.json would say, in our names."""

    num_layers: int = Field(ge=1, le=10_000)
    hidden_size: int = Field(ge=1, le=1_000_000)
    num_attention_heads: int = Field(ge=1, le=10_000)
    num_kv_heads: int | None = Field(default=None, ge=1, le=10_000, description="default: MHA")
    head_dim: int | None = Field(default=None, ge=1, le=100_000, description="default: hidden/heads")
    ffn_hidden_size: int = Field(ge=1, le=10_000_000)
    vocab_size: int = Field(ge=1, le=10_000_000)
    max_position_embeddings: int = Field(default=4096, ge=1, le=100_000_000)
    mlp: MlpKind = MlpKind.SWIGLU
    norm: NormKind = NormKind.RMSNORM
    position_embedding: PositionEmbedding = PositionEmbedding.ROPE
    tied_embeddings: bool = False
    qkv_bias: bool = False
    attn_out_bias: bool = False
    mlp_bias: bool = False
    norms_per_layer: Literal[1, 2, 4] = 2
    embedding_norm: bool = False
    parallel_attn_mlp: bool = False
    rotary_fraction: float = Field(default=1.0, gt=0, le=1)
    lm_head_bias: bool = False
    moe: MoEIn | None = None

    def to_domain(self, name: str) -> ModelSpec:
        fields = self.model_dump(exclude={"moe", "num_kv_heads", "head_dim"})
        moe = MoESpec(**self.moe.model_dump()) if self.moe else None
        return ModelSpec(
            name=name,
            num_kv_heads=self.num_kv_heads or self.num_attention_heads,
            head_dim=self.head_dim or 0,
            moe=moe,
            **fields,
        )


class ModelRef(Strict):
    """Exactly one of: a catalog preset, a Hugging Face config.json, or explicit fields."""

    preset: str | None = Field(default=None, min_length=1, max_length=200)
    hf_config: dict[str, Any] | None = None
    architecture: ArchitectureIn | None = None
    name: str | None = Field(default=None, max_length=200, description="label for hf_config/architecture")

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelRef:
        given = [k for k in ("preset", "hf_config", "architecture") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of preset, hf_config, architecture (got {given or 'none'})")
        return self

    def to_domain(self, field: str = "model") -> ModelSpec:
        """Resolve to a ModelSpec; problems name the field under `field`."""
        try:
            if self.preset is not None:
                return catalog_model(self.preset).spec
            if self.hf_config is not None:
                return model_from_hf_config(self.hf_config, name=self.name)
            assert self.architecture is not None
            return self.architecture.to_domain(self.name or "custom")
        except UnknownCatalogEntry as exc:
            raise Unprocessable(
                str(exc),
                errors=[
                    {
                        "field": f"{field}.preset",
                        "message": str(exc),
                        "type": "unknown_model",
                        "known": list(exc.known),
                    }
                ],
            ) from exc
        except EstimatorError as exc:
            prefix = "hf_config" if self.hf_config is not None else "architecture"
            where = exc.field or prefix
            if not where.startswith(prefix):
                where = f"{prefix}.{where}"
            raise Unprocessable(
                exc.message, errors=[{"field": f"{field}.{where}", "rule": exc.rule, "message": exc.message}]
            ) from exc


class ResolveRequest(Strict):
    model: ModelRef
    pp: int = Field(
        default=1, ge=1, le=1024, description="also split the count over this many pipeline stages"
    )


class ParametersOut(BaseModel):
    total: int
    embedding: int
    output: int
    final_norm: int
    per_layer: int = Field(description="one layer (the largest, for MoE models a MoE layer)")
    attention_per_layer: int
    norms_per_layer: int
    dense_layers: int
    dense_mlp_per_layer: int
    moe_layers: int
    experts_per_moe_layer: int
    router_per_moe_layer: int
    shared_experts_per_moe_layer: int
    active_per_token: int
    largest_module: int
    per_stage: list[int]


class ResolvedModel(BaseModel):
    name: str
    architecture: dict[str, Any]
    parameters: ParametersOut


class ModelPresetOut(BaseModel):
    name: str
    display_name: str
    source: str
    config: dict[str, Any]
    architecture: dict[str, Any]
    parameters_total: int


# ---------------------------------------------------------------- training and layout


class TrainingIn(Strict):
    seq_len: int = Field(ge=1, le=10_000_000)
    global_batch_size: int = Field(ge=1, le=100_000_000, description="sequences per optimizer step")
    precision: Precision = Precision.BF16
    optimizer: Optimizer = Optimizer.ADAMW
    method: Method = Method.FULL
    lora_rank: int = Field(default=16, ge=1, le=65_536)
    lora_targets: list[str] | Literal["all-linear"] = Field(default="all-linear", max_length=64)
    attention: Attention = Attention.FLASH
    tokens: int | None = Field(default=None, gt=0, le=10**16, description="total tokens, for time to train")

    def to_domain(self) -> TrainingSpec:
        targets = ALL_LINEAR if self.lora_targets == "all-linear" else tuple(self.lora_targets)
        return TrainingSpec(
            seq_len=self.seq_len,
            global_batch_size=self.global_batch_size,
            precision=self.precision,
            optimizer=self.optimizer,
            method=self.method,
            lora_rank=self.lora_rank,
            lora_targets=targets,
            attention=self.attention,
            tokens=self.tokens,
        )


class LayoutIn(Strict):
    framework: Framework = Framework.DEEPSPEED
    dp: int = Field(default=1, ge=1, le=1_000_000)
    tp: int = Field(default=1, ge=1, le=1024)
    pp: int = Field(default=1, ge=1, le=1024)
    cp: int = Field(default=1, ge=1, le=1024)
    ep: int = Field(default=1, ge=1, le=4096)
    sequence_parallel: bool = False
    zero_stage: Literal[0, 1, 2, 3] = 0
    offload_optimizer: Offload = Offload.NONE
    offload_params: Offload = Offload.NONE
    recompute: Recompute = Recompute.NONE
    micro_batch_size: int = Field(default=1, ge=1, le=1_000_000)
    virtual_pipeline_stages: int = Field(default=1, ge=1, le=1024)
    gradient_accumulation_steps: int | None = Field(default=None, ge=1, le=1_000_000)
    activation_offload: bool = False
    optimizer_in_backward: bool = False
    chunked_loss: bool = False
    fsdp_hybrid_shard: bool = False
    tp_comm_overlap: bool = False
    overlap_grad_reduce: bool | None = Field(default=None, description="default: the framework's")

    def to_domain(self) -> Layout:
        return Layout(**self.model_dump())


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


class EstimateRequest(Strict):
    model: ModelRef
    cluster: ClusterChoice = Field(description='{"id": ...} of a stored cluster, or an inline one')
    training: TrainingIn
    layout: LayoutIn
    gpu_hour_cost: float | None = Field(default=None, ge=0, le=1e6, description="price of one GPU-hour")


# ---------------------------------------------------------------- estimates


class MemoryPerGPUOut(BaseModel):
    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    buffers: int
    overhead: int
    total: int


class MemoryOut(BaseModel):
    per_gpu: MemoryPerGPUOut = Field(description="bytes on the most-loaded rank")
    capacity_bytes: int
    headroom_bytes: int
    cpu_per_node_bytes: int
    nvme_per_node_bytes: int


class TimeBreakdownOut(BaseModel):
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    pp_bubble_s: float
    pp_comm_s: float
    dp_comm_exposed_s: float
    offload_s: float
    optimizer_s: float


class TimeOut(BaseModel):
    step_s: float
    tokens_per_s: float
    tflops_per_gpu: float = Field(description="model FLOPs only (PaLM MFU convention)")
    mfu: float
    hardware_tflops_per_gpu: float = Field(description="including recomputation")
    hfu: float
    breakdown: TimeBreakdownOut


class LimitsOut(BaseModel):
    max_micro_batch_size: int | None = Field(
        description="largest micro-batch that still fits this layout; 0: none; null: not computed"
    )
    max_seq_len: int | None = Field(
        description="largest sequence length that still fits this layout; 0: none; null: not computed"
    )


class CalibrationOut(BaseModel):
    factors: dict[str, float] = Field(
        description="memory_dynamic (activations, buffers, overhead), step_time"
    )
    runs: int
    memory_runs: int
    time_runs: int
    out_of_memory_runs: int


class EstimateOut(BaseModel):
    fits: bool
    memory: MemoryOut
    time: TimeOut | None
    limits: LimitsOut
    time_to_train_s: float | None
    cost_to_train: float | None = Field(default=None, description="given gpu_hour_cost, in its currency")
    layout: dict[str, Any] = Field(description="the layout estimated, with derived fields filled in")
    parameters_total: int
    warnings: list[str]
    assumptions: list[str]
    calibration: CalibrationOut | None = Field(
        default=None, description="factors learned from runs on this hardware and framework, when any"
    )


# ---------------------------------------------------------------- plans and runs


class ConstraintsIn(Strict):
    objective: Objective = Objective.THROUGHPUT
    max_gpus: int | None = Field(default=None, ge=1, le=10_000_000)
    frameworks: list[Framework] | None = Field(default=None, min_length=1, description="default: all")
    allow_offload: bool = True
    min_headroom_fraction: float = Field(default=0.05, ge=0, le=0.5)
    top_k: int = Field(default=3, ge=1, le=20)
    gpu_hour_cost: float | None = Field(default=None, ge=0, le=1e6)

    def to_domain(self) -> Constraints:
        return Constraints(
            objective=self.objective,
            max_gpus=self.max_gpus,
            frameworks=tuple(dict.fromkeys(self.frameworks)) if self.frameworks else tuple(Framework),
            allow_offload=self.allow_offload,
            min_headroom_fraction=self.min_headroom_fraction,
            top_k=self.top_k,
            gpu_hour_cost=self.gpu_hour_cost,
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
    score: float
    rationale: list[str]


class ArtifactOut(BaseModel):
    name: str
    target: str
    media_type: str
    size_bytes: int
    url: str


class PlanOut(BaseModel):
    id: str
    created_at: datetime
    status: Literal["feasible", "infeasible"]
    model: str
    cluster_id: str | None
    request: dict[str, Any]
    recommended: CandidateOut | None
    alternatives: list[CandidateOut]
    rejected: list[dict[str, Any]]
    suggestions: list[dict[str, Any]]
    search: dict[str, Any]
    artifacts: list[ArtifactOut]
    unsupported_targets: dict[str, str] = Field(
        description="requested targets that cannot express the layout"
    )
    calibration: dict[str, Any] | None
    versions: dict[str, str] = Field(description="catalog and estimator versions that made the plan")


class RunIn(Strict):
    """What a real run of the plan measured."""

    peak_memory_bytes_per_gpu: int | None = Field(default=None, gt=0, le=MAX_MEMORY_BYTES)
    step_s: float | None = Field(default=None, gt=0, le=1e7)
    tokens_per_s: float | None = Field(default=None, gt=0, le=1e12)
    gpu_utilization: float | None = Field(default=None, ge=0, le=1)
    out_of_memory: bool = False
    framework_version: str = Field(default="", max_length=100)
    notes: str = Field(default="", max_length=4000)

    @model_validator(mode="after")
    def _something_measured(self) -> RunIn:
        if self.step_s is not None and self.tokens_per_s is not None:
            raise ValueError("give step_s or tokens_per_s, not both")
        measured = (self.peak_memory_bytes_per_gpu, self.step_s, self.tokens_per_s)
        if not self.out_of_memory and all(m is None for m in measured):
            raise ValueError("report peak_memory_bytes_per_gpu, step_s or tokens_per_s, or out_of_memory")
        return self


class RunOut(BaseModel):
    id: str
    plan_id: str
    created_at: datetime
    peak_memory_bytes_per_gpu: int | None
    step_s: float | None
    tokens_per_s: float | None
    gpu_utilization: float | None
    out_of_memory: bool
    framework_version: str
    notes: str
    diagnosis: dict[str, Any]
    calibration: dict[str, Any] | None = Field(
        default=None, description="factors later estimates on this hardware and framework will apply"
    )


# ---------------------------------------------------------------- capacity


class CapacityRequest(Strict):
    """GPUs needed and time to train, across GPU types (default: the catalog) or stored clusters."""

    model: ModelRef
    training: TrainingIn
    gpus: list[str] | None = Field(default=None, min_length=1, max_length=64, description="catalog GPU names")
    cluster_ids: list[str] | None = Field(
        default=None, min_length=1, max_length=64, description="stored clusters"
    )
    gpus_per_node: int = Field(default=8, ge=1, le=64, description="node size for catalog GPUs")
    max_nodes: int = Field(default=1024, ge=1, le=100_000, description="largest count searched")
    at_gpus: int | None = Field(
        default=None, ge=1, le=10_000_000, description="time the run on this many GPUs"
    )
    gpu_hour_cost: float | dict[str, float] | None = Field(
        default=None, description="one price per GPU-hour, or one per GPU name"
    )
    # Capacity counts the GPUs that hold the job: offload is opt-in here (with unstated host RAM
    # and NVMe it would make any model "fit" on two cards at offload speed).
    constraints: ConstraintsIn = Field(default_factory=lambda: ConstraintsIn(allow_offload=False))

    @model_validator(mode="after")
    def _one_source(self) -> CapacityRequest:
        if self.gpus is not None and self.cluster_ids is not None:
            raise ValueError("give gpus or cluster_ids, not both")
        prices = self.gpu_hour_cost
        values = prices.values() if isinstance(prices, dict) else [prices] if prices is not None else []
        if any(v < 0 for v in values):
            raise ValueError("gpu_hour_cost must be >= 0")
        return self


class CapacityOptionOut(BaseModel):
    gpu: str
    cluster_id: str | None = None
    fits: bool
    min_gpus: int | None
    min_nodes: int | None
    layout: dict[str, Any] | None
    num_gpus: int | None = Field(description="GPUs the time below was computed on")
    tokens_per_s: float | None
    time_to_train_s: float | None
    gpu_hours: float | None
    cost: float | None
    note: str


class CapacityOut(BaseModel):
    options: list[CapacityOptionOut] = Field(description="fitting options first, fastest to train first")
    duration_s: float
