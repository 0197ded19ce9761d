"""The estimator's tuning numbers: how far from the data sheet real training runs (matmul and link
efficiency, overlap, host rates) and the memory model's allowances (CUDA context, NCCL buffers,
allocator fragmentation, framework defaults).

The numbers live in ``service/catalog/tuning.toml`` with a source per entry and what each was
fitted on; this module only holds their shape (``Tuning``, ``MemoryAssumptions``) and the
interpolation. Achieved GEMM throughput is

    peak(precision) x peak_fraction(gpu) x width_factor(h / tp) x tokens_factor(b s / cp)

``peak_fraction`` is what large GEMMs sustain in a training run on the GPU's die; the two factors
take it down for narrow GEMMs (small hidden sizes, wide tensor parallelism) and short micro-batches.
Factors are piecewise linear in log2 of their argument and flat outside the tabulated range. The memory-bound
work between the GEMMs (norms, activations, dropout, eager softmax) is timed separately from HBM
bandwidth, ``memory_traffic_per_stored_byte`` x the activation bytes the layer stores, and the
cross-entropy from ``loss_traffic_bytes_per_logit`` x the logits of the last stage. Flash-style
attention's core runs at its kernel's published rate on the die (``attention_kernel_fractions``),
not at the GEMM rate. Eager
attention's batched GEMMs run at ``unaligned_attention_core_factor`` of that rate when a head's row
(head_dim x element bytes) is not a multiple of ``attention_alignment_bytes``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

from service.estimator.clocks import clock_fraction
from service.estimator.errors import InvalidHardware
from service.estimator.types import Framework, GPUSpec, Precision


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryAssumptions:
    """The memory model's allowances and the framework defaults it counts with (bytes or elements,
    as named); the values and their sources are in the catalog's ``[memory]`` table."""

    cuda_context_bytes: int  # CUDA context + cuBLAS/cuDNN kernels, per process
    nccl_bytes_per_group: int  # NCCL channel buffers per communicator with more than one rank
    fragmentation_fraction: float  # caching-allocator reserve, a fraction of activations + buffers
    ddp_gradient_as_bucket_view: bool  # PyTorch DDP's buckets alias the gradients (False: a copy)
    ds_stage0_allreduce_elements: int  # DeepSpeed stage 0 flattens gradients in chunks this large
    fsdp_prefetch_layers: int  # FSDP gathers this many units ahead of the one computing
    adam_8bit_block_elements: int  # bitsandbytes 8-bit Adam: one fp32 absmax per block
    qlora_bits_per_param: float  # NF4 weight + double-quantised constants
    cpu_adam_grad_bytes: int  # CPU Adam's pinned copy of each gradient shard, per element

    def __post_init__(self) -> None:
        for name in ("cuda_context_bytes", "nccl_bytes_per_group", "ds_stage0_allreduce_elements"):
            if getattr(self, name) < 0:
                raise InvalidHardware(
                    f"memory.{name} must be >= 0, got {getattr(self, name)}", rule="non_negative"
                )
        for name in ("adam_8bit_block_elements", "qlora_bits_per_param", "cpu_adam_grad_bytes"):
            if not getattr(self, name) > 0:
                raise InvalidHardware(
                    f"memory.{name} must be > 0, got {getattr(self, name)}", rule="positive"
                )
        if not 0.0 <= self.fragmentation_fraction < 1.0 or self.fsdp_prefetch_layers < 0:
            raise InvalidHardware(
                "memory.fragmentation_fraction must be in [0, 1) and fsdp_prefetch_layers >= 0, got "
                f"{self.fragmentation_fraction} and {self.fsdp_prefetch_layers}",
                rule="range",
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class CurvePoint:
    x: float  # hidden size per TP rank, or tokens per micro-batch per CP rank
    factor: float  # multiplies the peak fraction, in (0, 1]


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionKernelRate:
    """A flash-style attention kernel's achieved rate on one die, as fractions of the 16-bit dense peak
    by the sequence length of a kernel call; the backward rate counts ``backward_flops_per_forward``
    FLOPs per forward FLOP (FlashAttention's convention: 2.5, it recomputes QK^T)."""

    kernel: str
    chip: str  # GPUSpec.chip
    forward_points: tuple[CurvePoint, ...]
    backward_points: tuple[CurvePoint, ...]
    backward_flops_per_forward: float  # the FLOPs the backward rate counts, per forward FLOP
    # The same kernel without a mask (a bidirectional encoder's attention: every key block of the
    # square), where published; () falls back to the causal curves above.
    forward_unmasked_points: tuple[CurvePoint, ...] = ()
    backward_unmasked_points: tuple[CurvePoint, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PassOps:
    """Ops a module issues from the host in one forward and in its backward (PyTorch eager: each op
    a trip through Python and the dispatcher, most of them one kernel launch)."""

    forward: int
    backward: int

    def __post_init__(self) -> None:
        if self.forward < 0 or self.backward < 0:
            raise InvalidHardware(
                f"op counts must be >= 0, got {self.forward} and {self.backward}", rule="non_negative"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class HostIssue:
    """PyTorch eager issues a decoder layer's kernels one op at a time from the host: the host time per
    op, and the ops of a layer counted module by module (tuning.toml [host_issue] gives the sources)."""

    s_per_op: float  # host time to issue one op (0: the host never bounds the step)
    rest_of_layer: PassOps  # a Llama decoder layer's ops other than those below (RoPE, SiLU, adds)
    matmul: PassOps  # one Linear's matmuls: forward; input and weight gradients
    attention: PassOps  # the attention kernel (SDPA / flash), forward and backward
    rmsnorm: PassOps  # one RMSNorm module (the layer's two, a q/k norm's)
    layernorm: PassOps  # one nn.LayerNorm (F.layer_norm)
    linear_bias: PassOps  # a Linear's bias, where the model has one
    autocast_casts: PassOps  # a layer's fp32 weights and inputs cast to 16 bits by autocast
    lora_linear: PassOps  # one LoRA-adapted Linear's adapter (PEFT lora.Linear)

    def __post_init__(self) -> None:
        if self.s_per_op < 0:
            raise InvalidHardware(
                f"host_issue.s_per_op must be >= 0, got {self.s_per_op}", rule="non_negative"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuning:
    """Achievable fractions of the data sheet, the host-side rates and the overlap defaults."""

    peak_fraction_by_chip: tuple[tuple[str, float], ...]  # (GPUSpec.chip, fraction)
    default_peak_fraction: float
    width_points: tuple[CurvePoint, ...]
    tokens_points: tuple[CurvePoint, ...]
    intra_node_bus_efficiency: float  # NCCL busbw / nominal NVLink (or PCIe) bandwidth
    inter_node_bus_efficiency: float  # NCCL busbw / nominal per-GPU NIC bandwidth
    intra_node_latency_s: float  # per ring step between GPUs of a node
    inter_node_latency_s: float  # per ring step between nodes
    collective_base_latency_s: float  # once per collective
    dp_overlap_by_framework: tuple[tuple[Framework, bool], ...]  # grad reduction during backward?
    dp_overlap_max_hidden_fraction: float  # the last bucket is always exposed
    tp_overlap_hidden_fraction: float  # with tp_comm_overlap (Megatron's userbuffers, torchtitan's Async TP)
    zero3_prefetch_hidden_fraction: float  # ZeRO-3/FSDP gathers prefetched under compute
    activation_offload_hidden_fraction: float  # activation copies to/from the host on a side stream
    memory_traffic_per_stored_byte: float  # HBM bytes moved forward per activation byte stored (fused)
    eager_traffic_factor: float  # PyTorch eager's op-by-op traffic over the fused kernels' (not Megatron)
    loss_traffic_bytes_per_logit: float  # HBM bytes the cross-entropy moves per logit, fwd + bwd
    compiled_loss_traffic_bytes_per_logit: float  # the same, torch.compile's fused cross-entropy
    fp8_cast_bytes_per_element: float  # a separate cast to fp8 (torchao): amax read, cast read + write
    fp8_transposed_cast_bytes_per_element: float  # the input re-cast, transposed, for the weight grad
    selective_recompute_passes: float  # memory-bound passes of selective recompute over the bytes it stores
    attention_alignment_bytes: int  # a head's row must be a multiple of this for the fast BMM kernels
    unaligned_attention_core_factor: float  # eager QK^T / AV rate off that alignment, x the GEMM rate
    kernel_launch_s: float = 0.0  # the least a kernel costs, launch included (0: no floor)
    moe_host_sync_s: float = 0.0  # GPU idle per device-to-host sync of an MoE dispatcher (0: none)
    # Megatron's flex dispatcher (HybridEP): achieved / nominal NVLink bandwidth of its intra-node leg,
    # and achieved / nominal NIC bandwidth of its inter-node leg by the nodes the EP group spans
    flex_intra_node_efficiency: float = 1.0
    flex_inter_node_points: tuple[CurvePoint, ...] = (CurvePoint(x=2.0, factor=1.0),)
    kernels_per_layer_by_framework: tuple[tuple[Framework, int], ...] = ()  # a decoder layer's forward
    compiled_kernels_per_layer: int = 0  # the same under torch.compile (0: no floor)
    host_issue: HostIssue | None = None  # PyTorch eager's host issue per op (None: not modelled)
    # flash-style attention: the kernel each framework runs, and the published rates per die
    attention_kernel_by_framework: tuple[tuple[Framework, str], ...] = ()
    # a kernel that runs on some dies only (cuDNN's fused attention: Hopper and newer), and the kernel
    # run on the others
    attention_kernel_dies: tuple[tuple[str, tuple[str, ...]], ...] = ()
    attention_kernel_elsewhere: str | None = None
    attention_kernel_rates: tuple[AttentionKernelRate, ...] = ()
    # PyTorch's ring attention moves K and V at every query head's width: what torchtitan did before
    # v0.2.2 (repeat_kv before SDPA), which runs measured then (validation's Dec-2024 benchmarks) set;
    # False: the KV heads' own width, as the torchtitan the launchers render passes them (enable_gqa)
    ring_attention_repeats_kv: bool = False
    cpu_adam_params_per_s_per_node: float  # DeepSpeed CPU-Adam, whole host
    torch_cpu_adam_slowdown: float  # PyTorch's AdamW on CPU tensors (FSDP CPU offload) vs DeepSpeed's
    nvme_bandwidth_bytes_per_s_per_node: float  # every node's (no cluster field states it)
    memory: MemoryAssumptions  # the memory model's allowances
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        fractions = [self.default_peak_fraction, *(f for _, f in self.peak_fraction_by_chip)]
        fractions += [p.factor for p in (*self.width_points, *self.tokens_points)]
        for rate in self.attention_kernel_rates:
            if not rate.forward_points or not rate.backward_points:
                raise InvalidHardware(
                    f"attention kernel {rate.kernel} on {rate.chip} needs forward and backward points",
                    rule="non_empty",
                )
            fractions += [p.factor for p in (*rate.forward_points, *rate.backward_points)]
            if bool(rate.forward_unmasked_points) != bool(rate.backward_unmasked_points):
                raise InvalidHardware(
                    f"attention kernel {rate.kernel} on {rate.chip}: give both unmasked curves or neither",
                    rule="non_empty",
                )
            fractions += [p.factor for p in (*rate.forward_unmasked_points, *rate.backward_unmasked_points)]
        fractions += [self.intra_node_bus_efficiency, self.inter_node_bus_efficiency]
        fractions += [self.flex_intra_node_efficiency, *(p.factor for p in self.flex_inter_node_points)]
        fractions.append(self.unaligned_attention_core_factor)
        for value in fractions:
            if not 0.0 < value <= 1.0:
                raise InvalidHardware(f"efficiency fractions must be in (0, 1], got {value}", rule="fraction")
        for name in (
            "memory_traffic_per_stored_byte",
            "loss_traffic_bytes_per_logit",
            "selective_recompute_passes",
        ):
            if getattr(self, name) < 0.0:
                raise InvalidHardware(f"{name} must be >= 0, got {getattr(self, name)}", rule="non_negative")
        if self.attention_alignment_bytes < 1:
            raise InvalidHardware(
                f"attention_alignment_bytes must be >= 1, got {self.attention_alignment_bytes}",
                rule="positive",
            )
        if not self.width_points or not self.tokens_points or not self.flex_inter_node_points:
            raise InvalidHardware("efficiency curves need at least one point", rule="non_empty")


def _interpolate_log2(points: tuple[CurvePoint, ...], x: float) -> float:
    # piecewise linear in log2(x) between sorted points; flat beyond both ends
    ordered = sorted(points, key=lambda p: p.x)
    if x <= ordered[0].x:
        return ordered[0].factor
    for low, high in itertools.pairwise(ordered):
        if x <= high.x:
            t = (math.log2(x) - math.log2(low.x)) / (math.log2(high.x) - math.log2(low.x))
            return low.factor + t * (high.factor - low.factor)
    return ordered[-1].factor


def flex_inter_node_efficiency(tuning: Tuning, nodes: int) -> float:
    """Achieved / nominal NIC bandwidth of the flex dispatcher's inter-node leg over ``nodes`` nodes:
    HybridEP's published table by node count, piecewise linear in log2(nodes), flat outside it."""
    return _interpolate_log2(tuning.flex_inter_node_points, nodes)


def conservative_peak_fraction(tuning: Tuning) -> float:
    """The smallest peak fraction fitted on any die (the default when none is fitted): what a GPU
    whose die has none gets, so that it is never timed faster than a fitted part of its peaks."""
    return min(
        (fraction for _, fraction in tuning.peak_fraction_by_chip), default=tuning.default_peak_fraction
    )


def fitted_die(tuning: Tuning, gpu: GPUSpec) -> bool:
    """Whether a GEMM peak fraction is fitted on the GPU's die (``GPUSpec.chip``). Where none is (a
    custom part without a chip, or a die no published run measured: AMD's, Volta's, Turing's,
    Ada's), the GPU is timed at the most conservative fitted efficiency, never faster than a measured
    die is for its peaks: the default (0.65) is above every fitted die but GA100, so an H100 described
    without its chip came out 38% faster than the catalog's (issue 24), and an MI300X 1.6x an H100."""
    return any(chip == gpu.chip for chip, _ in tuning.peak_fraction_by_chip)


def peak_fraction(tuning: Tuning, gpu: GPUSpec) -> float:
    """The fraction fitted on the GPU's die, else ``conservative_peak_fraction`` (``fitted_die``)."""
    for chip, fraction in tuning.peak_fraction_by_chip:
        if chip == gpu.chip:
            return fraction
    return conservative_peak_fraction(tuning)


def matmul_efficiency(
    tuning: Tuning,
    gpu: GPUSpec,
    width: float,
    tokens: float,
    shape: tuple[float, float] | None = None,
    precision: Precision = Precision.BF16,
) -> float:
    """Fraction of peak a layer sustains for GEMM width ``h / tp`` and ``b s / cp`` tokens (the
    GEMMs' rows), never above what streaming the weights from HBM allows (``weight_streaming_bound``),
    or, given the GEMM's ``shape`` (N, K), what moving all three of its operands allows
    (``gemm_roofline_bound``: an MoE expert's GEMM, whose rows are few and whose N and K are small),
    each as a fraction of ``precision``'s peak."""
    width_factor = _interpolate_log2(tuning.width_points, width)
    tokens_factor = _interpolate_log2(tuning.tokens_points, tokens)
    if shape is None:
        bound = weight_streaming_bound(gpu, tokens, precision)
    else:
        bound = gemm_roofline_bound(gpu, tokens, *shape, precision=precision)
    return min(peak_fraction(tuning, gpu) * width_factor * tokens_factor, bound)


# The bytes of a GEMM operand in each precision: fp32 and tf32 matmuls read fp32 tensors, fp8's
# Transformer Engine GEMMs fp8 ones.
_OPERAND_BYTES = {
    Precision.FP32: 4,
    Precision.TF32: 4,
    Precision.BF16: 2,
    Precision.BF16_PURE: 2,
    Precision.FP16: 2,
    Precision.FP8: 1,
}


def _roofline_scale(gpu: GPUSpec, precision: Precision) -> float:
    """2 / (operand bytes x the precision's peak at the sustained clock): a roofline's FLOP per byte of
    16-bit operands times the HBM bandwidth, as a fraction of that precision's peak. Where the peak
    scales as the bytes shrink (fp8 on tensor cores: twice bf16's, on half the bytes; tf32: half, on
    twice) it is the 16-bit bound; fp32 on CUDA cores is not: its bound was the 16-bit fraction of the
    fp32 peak, so a part with a lower bf16 peak got a higher fp32 roofline (an L40 timed 25% faster
    than an L40S in fp32: an invariants review)."""
    peaks = gpu.peak_flops_per_s
    peak = peaks.of(precision) or peaks.bf16 or peaks.fp16 or peaks.fp32
    return 2 / (_OPERAND_BYTES[precision] * peak * clock_fraction(gpu))


def gemm_roofline_bound(
    gpu: GPUSpec, rows: float, n: float, k: float, *, precision: Precision = Precision.BF16
) -> float:
    """The roofline of one (rows x K) @ (K x N) GEMM whose three operands cross HBM once: 2 rows N K
    FLOPs over 2 (rows K + K N + rows N) bytes in 16 bits is rows N K / (rows K + K N + rows N) FLOP
    per byte (Williams et al., 'Roofline', CACM 2009), as a fraction of the 16-bit peak at the sustained
    clock; fp8 halves the bytes and doubles the peak (the same bound). With rows much below N and K it is
    ``weight_streaming_bound``; it is symmetric in the three sizes, so the backward's GEMMs (dgrad: rows
    x K over N; wgrad: N x K over rows) share it."""
    intensity = rows * n * k / (rows * k + k * n + rows * n)
    return intensity * gpu.hbm_bandwidth_bytes_per_s * _roofline_scale(gpu, precision)


def weight_streaming_bound(gpu: GPUSpec, rows: float, precision: Precision = Precision.BF16) -> float:
    """The roofline of a GEMM of ``rows`` rows against a weight matrix read from HBM: 2 rows K N FLOPs
    over the 2 K N bytes of 16-bit weights is ``rows`` FLOP per byte, so at most rows x bandwidth /
    peak of the 16-bit peak (fp8 halves the bytes and doubles the peak; tf32 the reverse: the same
    bound). It binds only for short rows (under ~300 on H100, ~150 on A100): tiny micro-batches, wide
    context parallelism, or fine-grained experts that see few tokens each. The peak is the one at the
    GPU's sustained clock (``clocks.clock_fraction``): HBM keeps its own clock, so a slower SM clock
    leaves a larger share of the slower peak within the bandwidth's reach. In ``precision``'s own
    operand bytes and peak (``_roofline_scale``)."""
    return rows * gpu.hbm_bandwidth_bytes_per_s * _roofline_scale(gpu, precision)


def framework_attention_kernel(tuning: Tuning, gpu: GPUSpec, framework: Framework) -> str | None:
    """The flash-style kernel the framework runs attention's core with on this GPU (tuning.toml
    [attention_kernel] framework), a kernel of some dies only (only_on: cuDNN's fused attention on
    Hopper and newer) replaced by ``elsewhere``'s on the others and on an unstated die."""
    kernel = dict(tuning.attention_kernel_by_framework).get(framework)
    dies = dict(tuning.attention_kernel_dies).get(kernel or "")
    if dies is not None and gpu.chip not in dies:
        return tuning.attention_kernel_elsewhere
    return kernel


def attention_kernel_rate(tuning: Tuning, gpu: GPUSpec, framework: Framework) -> AttentionKernelRate | None:
    """The published rates of the framework's flash-style attention kernel on the GPU's die, or None
    (the core then runs at the GEMM rate). A GPU whose die has no fitted GEMM fraction
    (``fitted_die``) gets the kernel's slowest rate over the dies it is published for
    (``conservative_kernel_rate``), as it gets the slowest GEMM fraction."""
    kernel = framework_attention_kernel(tuning, gpu, framework)
    for rate in tuning.attention_kernel_rates:
        if gpu.chip and rate.kernel == kernel and rate.chip == gpu.chip:
            return rate
    if not fitted_die(tuning, gpu):
        return conservative_kernel_rate(tuning, kernel)
    return None


def conservative_kernel_rate(tuning: Tuning, kernel: str | None) -> AttentionKernelRate | None:
    """``kernel``'s published rates, the smallest over the dies at each tabulated sequence length
    (forward and backward apart, the backward in the first die's FLOP convention), chip ''; None if
    no die has one. Step time also caps it at the GEMM rate (``step_time.core_rates_flops_per_s``):
    a fitted die without a published rate runs its core at its GEMM rate."""
    rates = [rate for rate in tuning.attention_kernel_rates if rate.kernel == kernel]
    if len(rates) <= 1:
        return dataclasses.replace(rates[0], chip="") if rates else None
    convention = rates[0].backward_flops_per_forward
    unmasked = all(rate.forward_unmasked_points for rate in rates)

    def lowest(backward: bool, without_mask: bool = False) -> tuple[CurvePoint, ...]:
        if without_mask and not unmasked:
            return ()
        curves = [
            (
                _kernel_curve(rate, backward, without_mask),
                convention / rate.backward_flops_per_forward if backward else 1.0,
            )
            for rate in rates
        ]
        xs = sorted({point.x for points, _ in curves for point in points})
        return tuple(
            CurvePoint(x=x, factor=min(_interpolate_log2(points, x) * scale for points, scale in curves))
            for x in xs
        )

    return AttentionKernelRate(
        kernel=rates[0].kernel,
        chip="",
        forward_points=lowest(False),
        backward_points=lowest(True),
        backward_flops_per_forward=convention,
        forward_unmasked_points=lowest(False, without_mask=True),
        backward_unmasked_points=lowest(True, without_mask=True),
    )


def _kernel_curve(rate: AttentionKernelRate, backward: bool, without_mask: bool) -> tuple[CurvePoint, ...]:
    """One of the rate's curves: forward or backward, causal or (where published) without a mask."""
    if without_mask and rate.forward_unmasked_points:
        return rate.backward_unmasked_points if backward else rate.forward_unmasked_points
    return rate.backward_points if backward else rate.forward_points


def attention_kernel_fractions(
    tuning: Tuning, gpu: GPUSpec, framework: Framework, kernel_seq_len: float, unmasked: bool = False
) -> tuple[float, float] | None:
    """(forward, backward) fractions of the 16-bit peak that the framework's flash-style attention
    kernel reaches on the GPU's die for calls of ``kernel_seq_len`` tokens; None without a published
    figure. Backward counts the rate's ``backward_flops_per_forward`` x the forward FLOPs.
    ``unmasked``: the kernel runs without a causal mask (a bidirectional encoder), at its unmasked
    rates where published (FlashAttention-3 Figures 5-6 print both), else the causal ones."""
    rate = attention_kernel_rate(tuning, gpu, framework)
    if rate is None:
        return None
    return (
        _interpolate_log2(_kernel_curve(rate, False, unmasked), kernel_seq_len),
        _interpolate_log2(_kernel_curve(rate, True, unmasked), kernel_seq_len),
    )


def kernels_per_layer(tuning: Tuning, framework: Framework, compiled: bool = False) -> int:
    """Kernels one decoder layer's forward launches under the framework, or compiled by
    torch.compile (0 when not stated)."""
    if compiled:
        return tuning.compiled_kernels_per_layer
    return dict(tuning.kernels_per_layer_by_framework).get(framework, 0)


def dp_overlap_default(tuning: Tuning, framework: Framework) -> bool:
    """Whether the framework reduces gradients during backward by default."""
    for known, overlapped in tuning.dp_overlap_by_framework:
        if known is framework:
            return overlapped
    return False
