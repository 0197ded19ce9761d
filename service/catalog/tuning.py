"""Load ``tuning.toml`` (achievable efficiency, link efficiency, overlap, host rates, memory
allowances) into the estimator's ``Tuning``. Parsed once and cached; nothing is read at import.

``TuningFile`` is the file's schema, a pydantic model that validates and documents every key: unknown
keys are refused, each number has its type (an integer key refuses ``2.0``, no number takes ``true``)
and its range, and every table and entry that carries a ``source`` (or ``*_source``) must state it. A
file that breaks the schema raises ``InvalidCatalogEntry`` naming the key (``memory.cuda_context_mib``,
``attention_kernel.rate[0].source``). The estimator's ``service.estimator.tuning`` dataclasses stay the
plain types the estimator reads: ``to_tuning`` converts, and pydantic never reaches the estimator.
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from service.catalog.errors import InvalidCatalogEntry
from service.estimator.tuning import (
    AttentionKernelRate,
    CurvePoint,
    HostIssue,
    MemoryAssumptions,
    PassOps,
    Tuning,
)
from service.estimator.types import Framework

TUNING_TOML = Path(__file__).with_name("tuning.toml")
MIB = 2**20

# Value types. Strict everywhere: a float key takes a TOML integer (768 -> 768.0), nothing else converts.
Fraction = Annotated[float, Field(gt=0.0, le=1.0, description="a fraction in (0, 1]")]
HiddenFraction = Annotated[float, Field(ge=0.0, le=1.0, description="a share of a transfer hidden, [0, 1]")]
NonNegative = Annotated[float, Field(ge=0.0)]
Positive = Annotated[float, Field(gt=0.0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveInt = Annotated[int, Field(ge=1)]
Source = Annotated[str, Field(pattern=r"\S", description="where the number comes from (required)")]
# TOML table keys name frameworks as strings: the one place a string converts (to the estimator's enum).
FrameworkKey = Annotated[Framework, Strict(False)]


class _Table(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Point(_Table):
    """One point of a piecewise-linear curve in log2(x), flat outside the points."""

    x: Positive = Field(description="hidden size per TP rank, tokens per micro-batch per CP rank, or seq len")
    factor: Fraction = Field(description="multiplies the peak fraction")


Curve = Annotated[list[Point], Field(min_length=1)]  # TOML arrays are lists (strict refuses them as tuples)


class ChipPeakFraction(_Table):
    chip: str = Field(pattern=r"\S", description="a GPU die (gpus.toml `chip`)")
    fraction: Fraction = Field(description="fraction of the dense data-sheet peak large GEMMs sustain")
    source: Source


class PeakFractionTable(_Table):
    """[peak_fraction]: fraction of the dense peak large GEMMs sustain inside a training step."""

    default: Fraction = Field(description="for a die without its own entry")
    source: Source
    chip: list[ChipPeakFraction] = Field(default_factory=list, description="per GPU die")


class CurveTable(_Table):
    """[width] (GEMM width per TP rank, h/tp) and [tokens] (tokens per micro-batch per CP rank)."""

    source: Source
    points: Curve


class LinksTable(_Table):
    """[links]: NCCL bus efficiency and NCCL's latency model (LL128 column of tuning.cc)."""

    intra_node_bus_efficiency: Fraction = Field(description="NCCL busbw / nominal NVLink (or PCIe) bandwidth")
    intra_node_source: Source
    inter_node_bus_efficiency: Fraction = Field(description="NCCL busbw / nominal per-GPU NIC bandwidth")
    inter_node_source: Source
    intra_node_latency_s: NonNegative = Field(description="per ring step between GPUs of a node")
    inter_node_latency_s: NonNegative = Field(description="per ring step between nodes")
    collective_base_latency_s: NonNegative = Field(description="once per collective")
    latency_source: Source


class NodesPoint(_Table):
    """One point of a curve over the nodes a group spans, piecewise linear in log2(nodes)."""

    nodes: PositiveInt = Field(description="nodes the expert-parallel group spans")
    efficiency: Fraction = Field(description="achieved / nominal per-GPU NIC bandwidth")


class MoeDispatchTable(_Table):
    """[moe_dispatch]: Megatron's flex token dispatcher (HybridEP backend), its achieved bandwidths."""

    flex_intra_node_efficiency: Fraction = Field(
        description="achieved / nominal NVLink bandwidth of the received tokens"
    )
    flex_intra_node_source: Source
    flex_inter_node: Annotated[list[NodesPoint], Field(min_length=1)] = Field(
        description="achieved / nominal NIC bandwidth of the tokens sent to other nodes, by node count"
    )
    flex_inter_node_source: Source


class OverlapTable(_Table):
    """[overlap]: what hides under compute, by default and at most."""

    dp_by_framework: dict[FrameworkKey, bool] = Field(
        description="gradient reduction during backward by default, per framework (file order kept)"
    )
    dp_source: Source
    dp_max_hidden_fraction: HiddenFraction = Field(description="the last bucket is always exposed")
    dp_hidden_source: Source
    tp_hidden_fraction: HiddenFraction = Field(description="TP traffic hidden by tp_comm_overlap")
    tp_source: Source
    zero3_prefetch_hidden_fraction: HiddenFraction = Field(description="ZeRO-3/FSDP gathers prefetched")
    zero3_source: Source
    activation_offload_hidden_fraction: HiddenFraction = Field(description="activation copies, side stream")
    activation_offload_source: Source


class HostTable(_Table):
    """[host]: host-side rates of offloaded training."""

    cpu_adam_params_per_s_per_node: Positive = Field(description="DeepSpeed CPU-Adam, whole host")
    cpu_adam_source: Source
    torch_cpu_adam_slowdown: Positive = Field(description="PyTorch AdamW on CPU tensors vs DeepSpeed's")
    torch_cpu_adam_source: Source
    nvme_bandwidth_bytes_per_s_per_node: Positive = Field(
        description="every node's (no cluster field states it)"
    )
    nvme_source: Source


class MemoryBoundTable(_Table):
    """[memory_bound]: the bandwidth-bound work between the GEMMs, timed from HBM traffic."""

    traffic_per_stored_byte: NonNegative = Field(description="HBM bytes forward per stored activation byte")
    source: Source
    eager_traffic_factor: Positive = Field(description="PyTorch eager's traffic over the fused kernels'")
    eager_source: Source
    loss_traffic_bytes_per_logit: NonNegative = Field(description="the cross-entropy, fwd + bwd")
    loss_source: Source
    compiled_loss_traffic_bytes_per_logit: NonNegative = Field(description="torch.compile's fused loss")
    compiled_loss_source: Source
    fp8_cast_bytes_per_element: NonNegative = Field(description="a separate cast to fp8 (torchao)")
    fp8_transposed_cast_bytes_per_element: NonNegative = Field(description="the transposed re-cast")
    fp8_cast_source: Source
    selective_recompute_passes: NonNegative = Field(description="passes over the bytes it stores")
    selective_recompute_source: Source


class AttentionKernelRateEntry(_Table):
    """[[attention_kernel.rate]]: a flash-style kernel's published rate on one die."""

    kernel: str = Field(pattern=r"\S")
    chip: str = Field(pattern=r"\S", description="a GPU die (gpus.toml `chip`)")
    backward_flops_per_forward: Positive = Field(description="FLOPs the backward rate counts per fwd FLOP")
    forward: Curve = Field(description="fractions of the 16-bit dense peak by kernel-call sequence length")
    backward: Curve
    forward_unmasked: Curve | None = Field(default=None, description="the same without a causal mask")
    backward_unmasked: Curve | None = None
    source: Source


class AttentionKernelTable(_Table):
    """[attention_kernel]: the kernel each framework runs, and its published rates per die."""

    source: Source
    framework: dict[FrameworkKey, Annotated[str, Field(pattern=r"\S")]] = Field(
        description="kernel name per framework (file order kept)"
    )
    only_on: dict[str, list[Annotated[str, Field(pattern=r"\S")]]] = Field(
        default_factory=dict, description="kernel name -> the dies it runs on (any die where not named)"
    )
    elsewhere: str | None = Field(default=None, description="the kernel run on other dies than only_on's")
    rate: list[AttentionKernelRateEntry] = Field(default_factory=list)


class KernelLaunchTable(_Table):
    """[kernel_launch]: the floor of a layer's time, its kernel count x the launch cost."""

    launch_s: NonNegative = Field(description="the least a kernel costs, launch included (0: no floor)")
    source: Source
    kernels_per_layer: dict[FrameworkKey, NonNegativeInt] = Field(
        description="kernels of a decoder layer's forward, per framework (file order kept)"
    )
    compiled_kernels_per_layer: NonNegativeInt = Field(description="the same under torch.compile")
    kernels_source: Source
    moe_host_sync_s: NonNegative = Field(
        description="GPU idle per device-to-host synchronisation of an MoE token dispatcher (0: none)"
    )
    moe_host_sync_source: Source


class Ops(_Table):
    """Ops a module issues from the host in one forward and in its backward."""

    forward: NonNegativeInt
    backward: NonNegativeInt


class HostIssueTable(_Table):
    """[host_issue]: PyTorch eager issues each op from the host; a layer's ops, module by module."""

    s_per_op: NonNegative = Field(description="host time to issue one op, seconds (0: never bounds)")
    source: Source
    rest_of_layer: Ops = Field(description="a Llama decoder layer's ops other than those below")
    matmul: Ops = Field(description="one Linear's matmuls (forward; input and weight gradients)")
    attention: Ops = Field(description="the attention kernel")
    rmsnorm: Ops = Field(description="one RMSNorm module")
    layernorm: Ops = Field(description="one nn.LayerNorm")
    linear_bias: Ops = Field(description="one Linear's bias")
    autocast_casts: Ops = Field(description="a decoder layer's autocast casts of fp32 weights and inputs")
    lora_linear: Ops = Field(description="one LoRA-adapted Linear's adapter")
    ops_source: Source


class AttentionAlignmentTable(_Table):
    """[attention_alignment]: eager attention's batched GEMMs off the tensor cores' alignment."""

    alignment_bytes: PositiveInt = Field(description="a head's row must be a multiple of this")
    alignment_source: Source
    unaligned_core_factor: Fraction = Field(description="x the GEMM rate off that alignment")
    unaligned_core_source: Source


class MemoryTable(_Table):
    """[memory]: the memory model's allowances; MiB values are converted to bytes at load."""

    cuda_context_mib: NonNegative = Field(description="CUDA context + cuBLAS/cuDNN kernels, per process")
    cuda_context_source: Source
    nccl_mib_per_group: NonNegative = Field(description="NCCL buffers per communicator of > 1 rank")
    nccl_source: Source
    fragmentation_fraction: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        description="caching-allocator reserve, a fraction of activations + buffers, [0, 1)"
    )
    fragmentation_source: Source
    ddp_gradient_as_bucket_view: bool = Field(description="DDP's buckets alias the gradients")
    ddp_source: Source
    ds_stage0_allreduce_elements: NonNegativeInt = Field(description="DeepSpeed stage-0 all-reduce chunk")
    ds_stage0_source: Source
    fsdp_prefetch_layers: NonNegativeInt = Field(description="FSDP gathers this many units ahead")
    fsdp_prefetch_source: Source
    adam_8bit_block_elements: PositiveInt = Field(description="bitsandbytes 8-bit Adam block")
    adam_8bit_source: Source
    qlora_bits_per_param: Positive = Field(description="NF4 weight + double-quantised constants")
    qlora_source: Source
    cpu_adam_grad_bytes: PositiveInt = Field(description="CPU Adam's pinned gradient copy, per element")
    cpu_adam_grad_source: Source


class TuningFile(_Table):
    """The whole of ``tuning.toml``, its tables in file order (``sources`` follows this order)."""

    peak_fraction: PeakFractionTable
    width: CurveTable
    tokens: CurveTable
    links: LinksTable
    moe_dispatch: MoeDispatchTable
    overlap: OverlapTable
    host: HostTable
    memory_bound: MemoryBoundTable
    attention_kernel: AttentionKernelTable
    kernel_launch: KernelLaunchTable
    host_issue: HostIssueTable
    attention_alignment: AttentionAlignmentTable
    memory: MemoryTable

    def sources(self) -> tuple[str, ...]:
        """Every table-level ``source`` / ``*_source``, table by table in order, for the estimate's
        assumptions (the per-chip and per-rate entries' sources are not among them)."""
        found: list[str] = []
        for section_name in type(self).model_fields:
            section = getattr(self, section_name)
            for key in type(section).model_fields:
                if key == "source" or key.endswith("_source"):
                    found.append(getattr(section, key))
        return tuple(found)


def _points(points: list[Point]) -> tuple[CurvePoint, ...]:
    return tuple(CurvePoint(x=p.x, factor=p.factor) for p in points)


def _ops(ops: Ops) -> PassOps:
    return PassOps(forward=ops.forward, backward=ops.backward)


def host_issue(table: HostIssueTable) -> HostIssue:
    """The estimator's ``HostIssue`` from the [host_issue] table."""
    return HostIssue(
        s_per_op=table.s_per_op,
        rest_of_layer=_ops(table.rest_of_layer),
        matmul=_ops(table.matmul),
        attention=_ops(table.attention),
        rmsnorm=_ops(table.rmsnorm),
        layernorm=_ops(table.layernorm),
        linear_bias=_ops(table.linear_bias),
        autocast_casts=_ops(table.autocast_casts),
        lora_linear=_ops(table.lora_linear),
    )


def to_tuning(file: TuningFile) -> Tuning:
    """The estimator's ``Tuning`` from a validated file."""
    peak, links, overlap, host = file.peak_fraction, file.links, file.overlap, file.host
    dispatch = file.moe_dispatch
    bound, kernel, launch, align, memory = (
        file.memory_bound,
        file.attention_kernel,
        file.kernel_launch,
        file.attention_alignment,
        file.memory,
    )
    return Tuning(
        peak_fraction_by_chip=tuple((g.chip, g.fraction) for g in peak.chip),
        default_peak_fraction=peak.default,
        width_points=_points(file.width.points),
        tokens_points=_points(file.tokens.points),
        intra_node_bus_efficiency=links.intra_node_bus_efficiency,
        inter_node_bus_efficiency=links.inter_node_bus_efficiency,
        intra_node_latency_s=links.intra_node_latency_s,
        inter_node_latency_s=links.inter_node_latency_s,
        collective_base_latency_s=links.collective_base_latency_s,
        flex_intra_node_efficiency=dispatch.flex_intra_node_efficiency,
        flex_inter_node_points=tuple(
            CurvePoint(x=float(p.nodes), factor=p.efficiency) for p in dispatch.flex_inter_node
        ),
        dp_overlap_by_framework=tuple(overlap.dp_by_framework.items()),
        dp_overlap_max_hidden_fraction=overlap.dp_max_hidden_fraction,
        tp_overlap_hidden_fraction=overlap.tp_hidden_fraction,
        zero3_prefetch_hidden_fraction=overlap.zero3_prefetch_hidden_fraction,
        activation_offload_hidden_fraction=overlap.activation_offload_hidden_fraction,
        memory_traffic_per_stored_byte=bound.traffic_per_stored_byte,
        eager_traffic_factor=bound.eager_traffic_factor,
        loss_traffic_bytes_per_logit=bound.loss_traffic_bytes_per_logit,
        compiled_loss_traffic_bytes_per_logit=bound.compiled_loss_traffic_bytes_per_logit,
        fp8_cast_bytes_per_element=bound.fp8_cast_bytes_per_element,
        fp8_transposed_cast_bytes_per_element=bound.fp8_transposed_cast_bytes_per_element,
        selective_recompute_passes=bound.selective_recompute_passes,
        attention_alignment_bytes=align.alignment_bytes,
        unaligned_attention_core_factor=align.unaligned_core_factor,
        attention_kernel_by_framework=tuple(kernel.framework.items()),
        attention_kernel_dies=tuple((name, tuple(dies)) for name, dies in kernel.only_on.items()),
        attention_kernel_elsewhere=kernel.elsewhere,
        attention_kernel_rates=tuple(
            AttentionKernelRate(
                kernel=rate.kernel,
                chip=rate.chip,
                forward_points=_points(rate.forward),
                backward_points=_points(rate.backward),
                backward_flops_per_forward=rate.backward_flops_per_forward,
                forward_unmasked_points=_points(rate.forward_unmasked) if rate.forward_unmasked else (),
                backward_unmasked_points=_points(rate.backward_unmasked) if rate.backward_unmasked else (),
            )
            for rate in kernel.rate
        ),
        kernel_launch_s=launch.launch_s,
        moe_host_sync_s=launch.moe_host_sync_s,
        kernels_per_layer_by_framework=tuple(launch.kernels_per_layer.items()),
        compiled_kernels_per_layer=launch.compiled_kernels_per_layer,
        host_issue=host_issue(file.host_issue),
        cpu_adam_params_per_s_per_node=host.cpu_adam_params_per_s_per_node,
        torch_cpu_adam_slowdown=host.torch_cpu_adam_slowdown,
        nvme_bandwidth_bytes_per_s_per_node=host.nvme_bandwidth_bytes_per_s_per_node,
        memory=MemoryAssumptions(
            cuda_context_bytes=int(memory.cuda_context_mib * MIB),
            nccl_bytes_per_group=int(memory.nccl_mib_per_group * MIB),
            fragmentation_fraction=memory.fragmentation_fraction,
            ddp_gradient_as_bucket_view=memory.ddp_gradient_as_bucket_view,
            ds_stage0_allreduce_elements=memory.ds_stage0_allreduce_elements,
            fsdp_prefetch_layers=memory.fsdp_prefetch_layers,
            adam_8bit_block_elements=memory.adam_8bit_block_elements,
            qlora_bits_per_param=memory.qlora_bits_per_param,
            cpu_adam_grad_bytes=memory.cpu_adam_grad_bytes,
        ),
        sources=file.sources(),
    )


def _key(loc: tuple[int | str, ...]) -> str:
    # ('attention_kernel', 'rate', 0, 'source') -> 'attention_kernel.rate[0].source'
    key = ""
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
        elif part != "[key]":  # a refused table key is named by the part before this marker
            key += f".{part}" if key else part
    return key


def validate_tuning(data: dict[str, Any], *, origin: str = "tuning.toml") -> TuningFile:
    """The parsed TOML document validated against the schema; ``InvalidCatalogEntry`` naming the
    first offending key (every problem in the message) when it breaks it."""
    try:
        return TuningFile.model_validate(data)
    except ValidationError as error:
        problems = [(_key(e["loc"]), e["msg"]) for e in error.errors(include_url=False)]
        first = problems[0][0]
        message = f"{origin}: " + "; ".join(f"{key}: {msg}" for key, msg in problems)
        raise InvalidCatalogEntry(message, kind="tuning", entry=first.split(".")[0], key=first) from None


def parse_tuning(data: dict[str, Any]) -> Tuning:
    """Build the tuning from a parsed TOML document (same layout as ``tuning.toml``)."""
    return to_tuning(validate_tuning(data))


def load_tuning(path: Path = TUNING_TOML) -> Tuning:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as error:
        raise InvalidCatalogEntry(f"{path.name} is not valid TOML: {error}", kind="tuning") from error
    return to_tuning(validate_tuning(data, origin=path.name))


@functools.cache
def default_tuning() -> Tuning:
    """The packaged tuning, parsed once."""
    return load_tuning()
