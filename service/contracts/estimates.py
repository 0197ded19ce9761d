"""Estimates: one layout in (POST /v1/estimates), every number for it out."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, GetCoreSchemaHandler, GetJsonSchemaHandler, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from service.contracts.clusters import ClusterChoice
from service.contracts.common import Strict, no_documented_default
from service.contracts.models import ModelRef
from service.contracts.training import MAX_GLOBAL_BATCH, TrainingIn
from service.estimator.calibration import OLDER_ESTIMATOR_WEIGHT, OTHER_FAMILY_WEIGHT, RECENCY_HALF_LIFE_DAYS
from service.estimator.errors import InvalidLayout
from service.estimator.types import (
    Compile,
    Framework,
    Layout,
    MemoryBreakdown,
    MemoryStatistic,
    MoeDispatcher,
    Offload,
    Recompute,
    RecomputeModule,
)
from service.frameworks import FRAMEWORKS, sequence_parallel_default, tp_comm_overlap_default

# The fields a layout's label prints beside its degrees wherever a plan sets them (the CLI's layout_text
# and the page's layoutText read this metadata, the page from the OpenAPI document): an estimate of a label
# without them resolves each to the framework's default (a plan's deepspeed ZeRO-2 with overlap_grad_reduce
# true was 22% faster than the estimate of its label; determinism review). "switch": printed when set (not
# null, "none" or false); "tri-state": null is the framework's default, so true and false are both printed.
LABEL_SWITCH: dict[str, Any] = {"x-label": "switch"}
LABEL_TRI_STATE: dict[str, Any] = {"x-label": "tri-state"}


class LayoutIn(Strict):
    framework: Framework = Framework.DEEPSPEED
    dp: int = Field(
        default=1,
        ge=1,
        le=1_000_000,
        description="data-parallel degree; left out (or null), the cluster's GPUs over tp x pp x cp "
        "(named in resolved_defaults)",
        # no documented default: a generated client sends a field's documented default, and dp = 1 on
        # a cluster of 8 is a world-size 422 where dp left out fills the cluster
        json_schema_extra=no_documented_default,
    )
    tp: int = Field(default=1, ge=1, le=1024)
    pp: int = Field(default=1, ge=1, le=1024)
    cp: int = Field(default=1, ge=1, le=1024)
    ep: int = Field(default=1, ge=1, le=4096)
    etp: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="megatron, MoE models: the routed experts' tensor-parallel degree "
        "(--expert-tensor-parallel-size; etp x ep x expert-dp fold over tp x cp x dp, so ep may exceed "
        "dp x cp when etp < tp); default: tp",
        json_schema_extra=LABEL_SWITCH,
    )
    sequence_parallel: bool | None = Field(
        default=None,
        description="shard the norm and dropout activations over the TP group (Megatron's "
        "--sequence-parallel, torchtitan's TP plan; DeepSpeed AutoTP has none); default: as the "
        "framework's recipes and the search set it: on with tp > 1 for megatron and fsdp, off for "
        "deepspeed (named in resolved_defaults)",
    )
    zero_stage: Literal[0, 1, 2, 3] | None = Field(
        default=None,
        description="what the framework shards (ZeRO stage; fsdp: 3 FULL_SHARD, 2 SHARD_GRAD_OP, 0 "
        "NO_SHARD; megatron: 1 the distributed optimizer); default: the framework's own: fsdp 3, "
        "deepspeed 0, megatron 0 (named in resolved_defaults)",
    )
    offload_optimizer: Offload = Offload.NONE
    offload_params: Offload = Offload.NONE
    recompute: Recompute = Field(
        default=Recompute.NONE,
        description="selective: Megatron's selective recompute (recompute_modules, core attention by "
        "default); selective_op: torchtitan's per-op AC "
        "(matmul and attention outputs saved, every second matmul recomputed); full: each layer keeps its "
        "input (every framework's layer checkpointing)",
    )
    recompute_num_layers: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="with recompute full (Megatron): only the first N layers of each (virtual) pipeline "
        "stage recompute (--recompute-method block); default: every layer",
        json_schema_extra=LABEL_SWITCH,
    )
    recompute_every_n_layers: int | None = Field(
        default=None,
        ge=2,
        le=100_000,
        description="with recompute full (fsdp): only every N-th decoder layer is checkpointed, the others "
        "keep every activation (torchtitan's selective layer AC, selective_ac_option N, up to 0.2; no "
        "launcher renders it); default: every layer",
        json_schema_extra=LABEL_SWITCH,
    )
    recompute_modules: list[RecomputeModule] | None = Field(
        default=None,
        min_length=1,
        max_length=len(RecomputeModule),
        description="with recompute selective (megatron): the modules recomputed (--recompute-modules): "
        "core_attn, mlp (dense layers), moe, moe_act, shared_experts, layernorm (the norms Transformer "
        "Engine leaves unfused: MLA's input norm, MoE's pre-MLP norm), mla_up_proj; each must act on the "
        "model; default: core_attn",
    )
    micro_batch_size: int = Field(
        default=1,
        ge=1,
        le=MAX_GLOBAL_BATCH,  # as large as a global batch: the search answers such layouts (boundary review)
        description="sequences per GPU per forward; left out (or null): 1, or with "
        "gradient_accumulation_steps the global batch over it and dp (named in resolved_defaults)",
        json_schema_extra=no_documented_default,  # sent at 1 beside gradient_accumulation_steps: a 422
    )
    virtual_pipeline_stages: int = Field(default=1, ge=1, le=1024)
    gradient_accumulation_steps: int | None = Field(default=None, ge=1, le=MAX_GLOBAL_BATCH)
    activation_offload: bool = Field(default=False, json_schema_extra=LABEL_SWITCH)
    optimizer_in_backward: bool = Field(default=False, json_schema_extra=LABEL_SWITCH)
    chunked_loss: bool = Field(
        default=False,
        description="torchtitan's chunked cross-entropy (ChunkedLossWrapper, --loss.num_chunks 8): lm_head, "
        "the loss and its backward run per eighth of the sequence inside the loss, into an fp32 "
        "hidden-state gradient; the torchtitan launcher renders it (seq_len a multiple of 8)",
        json_schema_extra=LABEL_SWITCH,
    )
    torch_compile: Compile = Field(
        default=Compile.NONE,
        description="torch.compile (inductor), fsdp only: model compiles each decoder layer (torchtitan "
        "--compile.components model), model_and_loss also the cross-entropy (torchtitan --compile.enable, "
        "HF Trainer torch_compile, accelerate's dynamo backend); megatron has no such switch, deepspeed's "
        "compiled engine is not modelled",
        json_schema_extra=LABEL_SWITCH,
    )
    fsdp_hybrid_shard: bool = False
    dp_replicate: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="fsdp with fsdp_hybrid_shard (HSDP): the replicas of each shard group; dp splits into "
        "dp_replicate groups of dp / dp_replicate ranks, each sharding the model states over those x cp "
        "(torchtitan --parallelism.data_parallel_replicate_degree, Accelerate's dp_replicate_size); "
        "default: one shard group per node",
        json_schema_extra=LABEL_SWITCH,
    )
    tp_comm_overlap: bool | None = Field(
        default=None,
        description="megatron: --tp-comm-overlap (Transformer Engine userbuffers); fsdp: torchtitan's Async "
        "TP (--compile.enable_async_tensor_parallel, needs torch_compile); both need sequence parallelism "
        "at tp > 1 and GPUs with peer access (the GPU's peer_to_peer: not GeForce RTX 4090 or 3090); "
        "default: on where those hold, as Megatron-Bridge / NeMo recipes and the search set it, off for "
        "deepspeed (named in resolved_defaults)",
    )
    moe_a2a_overlap: bool = Field(
        default=False,
        description="megatron, MoE with ep > 1: --overlap-moe-expert-parallel-comm (combined 1F1B: each "
        "micro-batch's EP all-to-alls under another's compute; one more micro-batch in flight; pp > 1 "
        "needs virtual_pipeline_stages > 1, recompute not full)",
        json_schema_extra=LABEL_SWITCH,
    )
    moe_dispatcher: MoeDispatcher = Field(
        default=MoeDispatcher.ALLTOALL,
        description="megatron, MoE with ep > 1: the token dispatcher (--moe-token-dispatcher-type). "
        "alltoall: NCCL's all-to-all of every routed copy; flex: Megatron-Core's flex dispatcher with the "
        "HybridEP backend (--moe-flex-dispatcher-backend hybridep), one fused kernel that sends a token once "
        "per destination node over RDMA and forwards it over NVLink (Hopper or Blackwell GPUs; expert "
        "tensor parallelism 1)",
    )
    moe_capacity_factor: float | None = Field(
        default=None,
        gt=0,
        le=64,
        description="MoE models, token drop: each routed expert takes at most this multiple of its mean "
        "load per micro-batch, padded to it (megatron --moe-expert-capacity-factor with "
        "--moe-pad-expert-input-to-capacity, Megatron-Bridge's token-drop recipes use 1.0; deepspeed "
        "MoE capacity_factor with drop_tokens, ep > 1); default: 1.0 for deepspeed with ep > 1 (DeepSpeed "
        "MoE layers), dropless otherwise (megatron; fsdp and deepspeed at ep = 1 train the model's own "
        "MoE block)",
        json_schema_extra=LABEL_SWITCH,
    )
    overlap_grad_reduce: bool | None = Field(
        default=None, description="default: the framework's", json_schema_extra=LABEL_TRI_STATE
    )
    grad_reduce_in_fp32: bool | None = Field(
        default=None,
        description="megatron, bf16/fp8: the gradient buffer (main grads) and its data-parallel "
        "reduce-scatter in fp32 (true, 4 B per parameter) or bf16 (false, --grad-reduce-in-bf16, 2 B; "
        "NVIDIA's Megatron-Bridge / NeMo recipes); default: the recipes' bf16 (Megatron-LM's own default "
        "is fp32: set true to run that)",
        json_schema_extra=LABEL_TRI_STATE,
    )
    fp8_param_gather: bool | None = Field(
        default=None,
        description="megatron, fp8, zero_stage 1: --fp8-param-gather, the GEMM weights kept as fp8 "
        "(no bf16 copy nor cached fp8 copy) and all-gathered in fp8 after the step; default: on there, "
        "as Megatron-Bridge's fp8 precision configs set it",
        json_schema_extra=LABEL_TRI_STATE,
    )
    precision_aware_optimizer: bool | None = Field(
        default=None,
        description="megatron, zero_stage 1, adamw: --use-precision-aware-optimizer, Transformer Engine's "
        "FusedAdam stepping the main grads without an fp32 copy, its master over bf16 weights the fp32 "
        "weights' low 16 bits (2 B, not 4; bf16, and fp8 with fp8_param_gather false; fp16 keeps 4 B); "
        "required with offload_optimizer; default: on for bf16 there, as NVIDIA's performance recipes set "
        "it (Megatron-LM's own default is off: set false to run that)",
        json_schema_extra=LABEL_TRI_STATE,
    )
    pipeline_layers: list[Annotated[int, Field(ge=0, le=100_000)]] | None = Field(
        default=None,
        max_length=4096,
        description="decoder layers of each of the pp x virtual_pipeline_stages stages, in model order "
        "(virtual stage k runs on pipeline rank k % pp); default: an even split, or, when the stages do "
        "not divide the layers, one where the embedding and the loss count as a layer each",
    )
    pipeline_account_for_embedding: bool = Field(
        default=False,
        description="the embedding counts as a layer in the derived split (Megatron-Core's flag)",
    )
    pipeline_account_for_loss: bool = Field(
        default=False, description="the output layer and loss count as a layer in the derived split"
    )

    def framework_defaults(self, *, peer_to_peer: bool) -> dict[str, bool | int]:
        """The switches the request left out, as the framework's recipes (and the search) set them on
        GPUs with (or without) ``peer_to_peer`` access, and the ZeRO stage, as the framework shards
        when not told (``FrameworkEntry``)."""
        chosen: dict[str, bool | int] = {}
        if self.zero_stage is None:
            chosen["zero_stage"] = FRAMEWORKS[self.framework].default_zero_stage
        sequence_parallel = self.sequence_parallel
        if sequence_parallel is None:
            sequence_parallel = sequence_parallel_default(self.framework, self.tp)
            chosen["sequence_parallel"] = sequence_parallel
        if self.tp_comm_overlap is None:
            chosen["tp_comm_overlap"] = tp_comm_overlap_default(
                self.framework, sequence_parallel, self.torch_compile, peer_to_peer
            )
        return chosen

    def chosen_defaults(self, *, peer_to_peer: bool) -> dict[str, str]:
        """``{"layout.framework": "deepspeed", "layout.zero_stage": "0", ...}``: what each field the
        request left out resolved to, of those that change the answer: the framework, its ZeRO stage,
        the recompute policy, the micro-batch (where not derived: ``with_derived_micro_batch`` names
        it), and the TP switches where the layout has a TP group for them to act on."""
        chosen = {
            f"layout.{name}": str(value).lower()
            for name, value in self.framework_defaults(peer_to_peer=peer_to_peer).items()
            if self.tp > 1 or name == "zero_stage"
        }
        for name in ("framework", "recompute", "micro_batch_size"):
            if name not in self.model_fields_set:
                value = getattr(self, name)
                chosen[f"layout.{name}"] = str(getattr(value, "value", value))
        return chosen

    def to_domain(self, *, peer_to_peer: bool) -> Layout:
        fields = self.model_dump() | self.framework_defaults(peer_to_peer=peer_to_peer)
        if self.pipeline_layers is not None:
            fields["pipeline_layers"] = tuple(self.pipeline_layers)
        if self.recompute_modules is not None:
            fields["recompute_modules"] = tuple(self.recompute_modules)
        try:
            return Layout(**fields)
        except InvalidLayout as exc:  # named as the request body names it
            field = None if exc.field is None else f"layout.{exc.field}"
            raise exc.at(field) from exc


def layout_label_switches() -> dict[str, bool]:
    """The fields of LayoutIn a layout's label prints (``LABEL_SWITCH``), in field order, each with
    whether it is tri-state."""
    marks = {name: field.json_schema_extra for name, field in LayoutIn.model_fields.items()}
    marked = (LABEL_SWITCH, LABEL_TRI_STATE)
    return {name: mark == LABEL_TRI_STATE for name, mark in marks.items() if mark in marked}


class EstimateRequest(Strict):
    model: ModelRef
    cluster: ClusterChoice = Field(description='{"id": ...} of a stored cluster, or an inline one')
    training: TrainingIn
    layout: LayoutIn = Field(
        default_factory=LayoutIn,
        description="left out: {}, each field its default (dp fills the cluster; resolved_defaults names it)",
    )
    gpu_hour_cost: float | None = Field(default=None, ge=0, le=1e6, description="price of one GPU-hour")


# Plans stored before the memory statistics were named read back without them: null, except device
# used, which was the total then as now.
_NOT_STORED = "; null on plans stored before it was reported"


class MemoryPerGPUOut(BaseModel):
    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    buffers: int = Field(description="communication buckets, gathered ZeRO-3 / FSDP parameters, temporaries")
    overhead: int = Field(description="fragmentation + cuda_context + nccl_buffers + tp_comm_buffers")
    fragmentation: int | None = Field(
        default=None,
        description="the caching allocator's cached free blocks at the peak (peak reserved - peak allocated)"
        + _NOT_STORED,
    )
    cuda_context: int | None = Field(
        default=None,
        description="the CUDA context with its kernel images and library handles, outside PyTorch's allocator"
        + _NOT_STORED,
    )
    nccl_buffers: int | None = Field(
        default=None,
        description="NCCL's channel buffers of every process group, outside PyTorch's allocator"
        + _NOT_STORED,
    )
    tp_comm_buffers: int | None = Field(
        default=None,
        description="Transformer Engine's userbuffers under Megatron's --tp-comm-overlap "
        "(layout.tp_comm_overlap): 12 buffers of seq_len x micro_batch_size / cp x hidden_size, 2 bytes "
        "each element (8 of them 1 byte under fp8), outside PyTorch's allocator (their streams' cuBLAS "
        "workspaces are in buffers); 0 otherwise" + _NOT_STORED,
    )
    peak_allocated_bytes: int | None = Field(
        default=None,
        description="peak allocated (torch.cuda.max_memory_allocated): parameters + gradients + "
        "optimizer_states + activations + buffers" + _NOT_STORED,
    )
    peak_reserved_bytes: int | None = Field(
        default=None,
        description="peak reserved by PyTorch's caching allocator (torch.cuda.max_memory_reserved): peak "
        "allocated + fragmentation" + _NOT_STORED,
    )
    device_used_bytes: int = Field(
        description="device memory used as nvidia-smi shows it: peak reserved + cuda_context + nccl_buffers "
        "+ tp_comm_buffers; "
        "the statistic the fit compares with the card's capacity"
    )
    total: int = Field(description="= device_used_bytes")

    @model_validator(mode="before")
    @classmethod
    def _device_used_of_stored_plans(cls, data: Any) -> Any:
        if isinstance(data, dict) and "device_used_bytes" not in data and "total" in data:
            return {**data, "device_used_bytes": data["total"]}
        return data

    def statistic(self, which: MemoryStatistic) -> int | None:
        """The figure named ``which`` (``MemoryBreakdown.statistic``); None where a plan stored before
        the statistics were named has only device used."""
        if which is MemoryStatistic.ALLOCATED:
            return self.peak_allocated_bytes
        if which is MemoryStatistic.RESERVED:
            return self.peak_reserved_bytes
        return self.device_used_bytes

    @classmethod
    def of(cls, memory: MemoryBreakdown) -> MemoryPerGPUOut:
        """The wire form of ``memory``, its three statistics named."""
        return cls(
            **dataclasses.asdict(memory),
            overhead=memory.overhead,
            peak_allocated_bytes=memory.peak_allocated_bytes,
            peak_reserved_bytes=memory.peak_reserved_bytes,
            device_used_bytes=memory.device_used_bytes,
            total=memory.total,
        )


class StageMemoryOut(MemoryPerGPUOut):
    rank: int = Field(description="pipeline rank (0: the first stage)")


class MemoryOut(BaseModel):
    per_gpu: MemoryPerGPUOut = Field(description="bytes on the most-loaded rank")
    per_stage: list[StageMemoryOut] = Field(
        default_factory=list,  # plans stored before it was reported read back without it
        description="bytes per GPU of each evaluated pipeline rank: the first, the last, and each rank "
        "whose layer count differs from those before it (the others never need more); one entry without "
        "a pipeline",
    )
    capacity_bytes: int
    headroom_bytes: int = Field(description="capacity_bytes - the fit statistic of the most-loaded rank")
    fit_statistic: MemoryStatistic = Field(
        default=MemoryStatistic.DEVICE_USED,
        description="the per-GPU statistic the fit compares with capacity_bytes: device_used (an "
        "out-of-memory error comes when the device runs out, whoever holds the memory)",
    )
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
    tflops_per_gpu: float = Field(
        description="model FLOPs only, attention counted on its causal triangle (Megatron-LM's "
        "num_floating_point_operations; PaLM's convention counts the full square)"
    )
    mfu: float
    hardware_tflops_per_gpu: float = Field(description="including recomputation")
    hfu: float
    breakdown: TimeBreakdownOut


class LimitsOut(BaseModel):
    max_micro_batch_size: int | None = Field(
        description="largest micro-batch that still fits this layout among those the global batch allows "
        "(divisors of global_batch_size / dp the layout's rules accept, e.g. a whole multiple of pp "
        "micro-batches when interleaved): a larger one may fit in memory with another global batch; "
        "0: none; null: not computed"
    )
    max_seq_len: int | None = Field(
        description="largest sequence length that still fits this layout in memory, within the model's "
        "learned position table; a launch target's own cap (torchtitan's RoPE cache of its model config) "
        "is said by that target's refusal, not here; 0: none; null: not computed"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationFactors:
    """The factors of a calibration by name; on the wire (and stored) an object of numbers, so its
    schema is ``dict[str, float]``'s. Factors stored by earlier versions lack the later ones:
    ``step_time_learned`` reads as ``step_time`` (nothing was capped then), the hardware and
    framework parts stay out where they were not stored. Names this version does not know are kept
    (``others``)."""

    memory_dynamic: float = 1.0
    step_time: float = 1.0
    step_time_learned: float | None = None
    step_time_hardware: float | None = None
    step_time_framework: float | None = None
    others: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def read(cls, stored: Mapping[str, float]) -> CalibrationFactors:
        named = {f.name for f in dataclasses.fields(cls)} - {"others"}
        known = {k: v for k, v in stored.items() if k in named}
        return cls(**known, others={k: v for k, v in stored.items() if k not in named})

    def __post_init__(self) -> None:
        if self.step_time_learned is None:
            object.__setattr__(self, "step_time_learned", self.step_time)

    def stored(self) -> dict[str, float]:
        named = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "others"}
        return {k: v for k, v in named.items() if v is not None} | dict(self.others)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        as_dict = core_schema.no_info_after_validator_function(cls.read, handler(dict[str, float]))
        return core_schema.union_schema(
            [core_schema.is_instance_schema(cls), as_dict],
            serialization=core_schema.plain_serializer_function_ser_schema(lambda f: f.stored()),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return handler(core_schema.dict_schema(core_schema.str_schema(), core_schema.float_schema()))


class RunEvidenceOut(BaseModel):
    run_id: str = Field(description="the stored run (GET /v1/plans/{plan_id}/runs lists it)")
    plan_id: str = Field(description="the plan the run measured")
    framework: str = Field(description="its plan's framework")
    weight: float = Field(
        description=f"how much the run counts for this job, in (0, 1]: halves every {RECENCY_HALF_LIFE_DAYS} "
        f"days, x{OLDER_ESTIMATOR_WEIGHT:g} when its plan came from an older estimator version, "
        "1 / (1 + |log2 ratio|) of model size and of sequence length, "
        f"x{OTHER_FAMILY_WEIGHT:g} for another layout family (data, model or expert parallel)"
    )
    weighted_because: list[str] = Field(description="each factor of the weight below 1, with its number")
    factors: list[str] = Field(
        description="the factors it moves: memory_dynamic (this framework's runs), step_time_hardware "
        "(every framework's), step_time_framework (this framework's)"
    )


class SetAsideRunOut(BaseModel):
    run_id: str = Field(description="the stored run")
    plan_id: str = Field(description="the plan it was posted to")
    reasons: list[str] = Field(description="why it cannot be what its plan measured, with the numbers")


class UncalibratedOut(BaseModel):
    fits: bool = Field(description="whether the layout fits without the memory factor")
    memory_per_gpu_bytes: int = Field(description="the most loaded GPU's total without the memory factor")
    step_s: float | None = Field(description="the step time without the step-time factor")
    tokens_per_s: float | None = Field(description="tokens per second, all GPUs, without the factor")
    mfu: float | None = Field(description="model FLOPs utilisation without the factor")


class CalibrationOut(BaseModel):
    factors: CalibrationFactors = Field(
        description="memory_dynamic (activations, buffers, overhead), step_time (as applied: capped where "
        "the step would beat the GPU's dense peak), step_time_learned (what the runs say)"
    )
    runs: int
    memory_runs: int
    time_runs: int
    out_of_memory_runs: int
    implausible_runs: int = Field(
        default=0,
        description="runs left out: impossible on this hardware (faster than its peak, a peak below the "
        "model states) or more than 4x off the estimate; each one's diagnosis says why",
    )
    evidence: list[RunEvidenceOut] = Field(
        default_factory=list,  # answers stored before runs were weighed read back without it
        description="the runs behind the factors, each with its weight for this job and the factors it moves",
    )
    set_aside: list[SetAsideRunOut] = Field(
        default_factory=list, description="runs that move no factor, and why"
    )
    uncalibrated: UncalibratedOut | None = Field(
        default=None, description="this estimate's figures without the factors, next to the calibrated ones"
    )


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
    resolved_defaults: dict[str, str] = Field(
        default_factory=dict,  # plans stored before defaults followed the GPU read back without it
        description='training fields the request left out, as resolved for the GPU: {"training.attention": '
        '"sdpa", "training.precision": "fp16"} on a V100; and layout switches left out, as the '
        'framework\'s recipes set them: {"layout.sequence_parallel": "true"} for megatron at tp > 1; and '
        'the link bandwidths a custom GPU left out, in bytes/s: {"cluster.gpu.pcie_bandwidth_bytes_per_s": '
        '"16000000000"}; the catalog slugs of names given otherwise: {"cluster.gpu": '
        '"h100-sxm-80gb"} for "H100 SXM5 80GB"; and an inline cluster\'s node and network left out, as '
        'its part\'s reference node has them: {"cluster.gpus_per_node": "8"}',
    )
    calibration: CalibrationOut | None = Field(
        default=None, description="factors learned from runs on this hardware and framework, when any"
    )
