"""One layout, every number: validate, then memory (most-loaded rank), step time and limits,
all under the calibration learned from observed runs when there is one."""

from __future__ import annotations

from service.estimator import evaluate, flops
from service.estimator.activations import element_bytes
from service.estimator.calibration import (
    Calibration,
    calibrated_time,
    calibration_note,
    capped_step_time_factor,
)
from service.estimator.caveats import (
    capacity_warnings,
    chip_warnings,
    context_warnings,
    coverage_warnings,
    fitted_fractions,
    moe_warnings,
    network_warnings,
    peft_sharding_warnings,
)
from service.estimator.clocks import clock_note
from service.estimator.comm import bus_bandwidth_notes, link_default_notes
from service.estimator.defaults import FP16_OVERFLOW_FAMILIES, for_gpu
from service.estimator.job import Job, prepare
from service.estimator.memory import assumptions as memory_assumptions
from service.estimator.step_time import (
    core_kernel,
    peak_flops_per_s,
    steps_to_train,
    steps_torch_unfused_on_host,
    sustained_peak_flops_per_s,
    time_to_train_s,
    unaligned_core_slowdown,
    unaligned_core_step_s,
    utilisation_peak_flops_per_s,
)
from service.estimator.tuning import Tuning, fitted_die, peak_fraction
from service.estimator.types import (
    Attention,
    ClusterSpec,
    Estimate,
    Layout,
    MemoryEstimate,
    Method,
    ModelSpec,
    Offload,
    Precision,
    TrainingSpec,
)
from service.estimator.validate import validate_layout

# Below this fraction of GPU memory left free, a layout that "fits" is flagged: allocator
# behaviour and framework versions move real peaks by a few percent.
THIN_HEADROOM_FRACTION = 0.05
NO_CALIBRATION = Calibration()


def warnings_for(memory: MemoryEstimate, cluster: ClusterSpec, layout: Layout) -> tuple[str, ...]:
    out = []
    if memory.headroom_bytes < 0:
        needed, available = f"{memory.per_gpu.total / 2**30:.2f}", f"{memory.capacity_bytes / 2**30:.2f}"
        # figures that print alike beside "does not fit" say by how much (units review: "80.00 GiB
        # needed per GPU, 80.00 GiB available", 2.7 MiB over)
        by = f" ({-memory.headroom_bytes / 2**20:.1f} MiB over)" if needed == available else ""
        out.append(f"does not fit: {needed} GiB needed per GPU, {available} GiB available{by}")
    elif memory.headroom_bytes < THIN_HEADROOM_FRACTION * memory.capacity_bytes:
        out.append(f"thin headroom: {memory.headroom_bytes / 2**30:.2f} GiB free per GPU (< 5%)")
    offloading = layout.offload_optimizer is not Offload.NONE or layout.offload_params is not Offload.NONE
    if memory.cpu_per_node_bytes and not cluster.cpu_memory_bytes_per_node and offloading:
        out.append(
            f"host RAM per node is not stated for this cluster; offload needs "
            f"{memory.cpu_per_node_bytes / 2**30:.1f} GiB per node"
        )
    elif cluster.cpu_memory_bytes_per_node and memory.cpu_per_node_bytes > cluster.cpu_memory_bytes_per_node:
        out.append(
            f"host RAM: {memory.cpu_per_node_bytes / 2**30:.1f} GiB needed per node, "
            f"{cluster.cpu_memory_bytes_per_node / 2**30:.1f} GiB available"
        )
    elif memory.cpu_per_node_bytes > (1 - THIN_HEADROOM_FRACTION) * cluster.cpu_memory_bytes_per_node > 0:
        # what the figure counts is the offload's own; the OS and each training process (Python, the
        # libraries, the CUDA driver's host side) need host RAM too: an offload plan on 134.6 of 136 GiB
        # was answered without a word (workstation review)
        free = (cluster.cpu_memory_bytes_per_node - memory.cpu_per_node_bytes) / 2**30
        out.append(
            f"thin host RAM headroom: {free:.1f} GiB free per node (< 5%) of "
            f"{cluster.cpu_memory_bytes_per_node / 2**30:.1f} GiB beside what the offload holds; the OS "
            "and each training process need host RAM of their own"
        )
    if cluster.nvme_bytes_per_node and memory.nvme_per_node_bytes > cluster.nvme_bytes_per_node:
        out.append(
            f"NVMe: {memory.nvme_per_node_bytes / 2**30:.1f} GiB needed per node, "
            f"{cluster.nvme_bytes_per_node / 2**30:.1f} GiB available"
        )
    node = cluster.gpu.node_gpus
    if node is not None and cluster.gpus_per_node > node:
        # timed as stated, one NVLink domain of them all (hardware review: 16 H100 SXM per node were
        # planned as one 450 GB/s domain without a word)
        out.append(
            f"{cluster.gpus_per_node} GPUs per node: {cluster.gpu.name} ships {node} per node (its "
            "baseboard's NVLink domain); the estimate links all of them at its NVLink bandwidth: state "
            f"nodes of {node} and the network between them where that is how they are built"
        )
    if layout.tp > cluster.gpus_per_node:
        # timed as it would run (its all-reduces over the network), but no plan recommends it
        if cluster.inter_node_bandwidth_bytes_per_s >= cluster.intra_node_bandwidth_bytes_per_s:
            # an NVLink domain across hosts (GB200 NVL72 trays of 4): the traffic stays on NVLink, what
            # costs is Transformer Engine's TP overlap, which needs the group on one node (a rack-scale
            # review: "crosses the network" read as a NIC's rate)
            where = (
                "collectives cross hosts over the stated inter-node link, without Transformer Engine's "
                "communication overlap, which needs the group on one node"
            )
        else:
            where = "collectives cross the network"
        out.append(
            f"tp ({layout.tp}) > GPUs per node ({cluster.gpus_per_node}): every layer's tensor-parallel "
            f"{where} (the search never splits tp across nodes)"
        )
    elif cluster.tp_straddles_nodes(layout.tp, layout.world_size):
        # ranks fill nodes tp first: some groups straddle two nodes, the slowest timed (comm.link_for_group)
        out.append(
            f"tp ({layout.tp}) does not divide the {cluster.gpus_per_node} GPUs per node: some "
            "tensor-parallel groups straddle two nodes, their collectives over the network (the search "
            "never proposes such a tp)"
        )
    return tuple(out)


def fp16_overflow_warnings(model: ModelSpec, training: TrainingSpec) -> tuple[str, ...]:
    """fp16 asked for a family whose activations overflow it (``defaults.FP16_OVERFLOW_FAMILIES``): the
    run fits and is timed, and trains to inf / NaN (an fp16 review: Gemma 3 on a T4 planned so, its
    files setting fp16, with no word of it). Left to the hardware, such a model gets fp32 there."""
    if training.precision is not Precision.FP16 or model.family not in FP16_OVERFLOW_FAMILIES:
        return ()
    overflow = (
        f"precision fp16: {model.family}'s activations exceed fp16's range (65,504) in training, so its "
        "gradients become inf / NaN whatever the loss scale (it scales gradients, not activations): "
    )
    if model.bnb_4bit_compute_precision is Precision.FP16:
        # the checkpoint fixes fp16 (its saved compute dtype): no other precision trains it
        fixed = "this 4-bit checkpoint computes in fp16 (its bnb_4bit_compute_dtype); plan its 16-bit "
        return (
            overflow + fixed + "weights in bf16 or fp32 instead (the config without quantization_config)",
        )
    left = "train it in bf16 where the GPU has it, else fp32 (what a request leaving precision out gets here)"
    return (overflow + left,)


def attention_warnings(job: Job, layout: Layout, step_time_factor: float) -> tuple[str, ...]:
    """The head_dim's cost under eager attention, and flash kernels asked for a head_dim they lack."""
    out = []
    model, training, tuning = job.model, job.training, job.tuning
    head_dim = model.head_dim
    if unaligned_core_slowdown(model, training, tuning) > 0.0:
        added_s = unaligned_core_step_s(job, layout) * step_time_factor
        out.append(
            f"head_dim {head_dim} ({head_dim * element_bytes(training.precision)}-byte rows) is not a "
            f"multiple of {tuning.attention_alignment_bytes} bytes: eager "
            f"attention's QK^T and AV run at {tuning.unaligned_attention_core_factor:g} of the GEMM rate, "
            f"{added_s:.3g} s of each step; flash kernels (flash, or sdpa where the GPU has them) pad "
            "head_dim to a multiple of 8, and sdpa's math kernel multiplies in fp32"
        )
    return tuple(out)


def time_assumptions(job: Job, layout: Layout) -> tuple[str, ...]:
    """What the step time assumed for this GPU and its links, in words and numbers."""
    gpu, tuning = job.cluster.gpu, job.tuning
    fraction = peak_fraction(tuning, gpu)
    if fitted_die(tuning, gpu):
        gemm = f"GEMMs at up to {fraction:g} of the dense peak, the fraction fitted on the {gpu.chip} die"
    elif tuning.peak_fraction_by_chip:
        die = f"the {gpu.chip} die has no fitted fraction" if gpu.chip else "the GPU's die is not stated"
        gemm = (
            f"GEMMs at up to {fraction:g} of the dense peak: {die}, so the lowest fraction fitted on a "
            f"die ({fitted_fractions(tuning)})"
        )
    else:
        gemm = f"GEMMs at up to {fraction:g} of the dense peak: the default (no die has a fitted fraction)"
    links = bus_bandwidth_notes(
        job.cluster, tuning.intra_node_bus_efficiency, tuning.inter_node_bus_efficiency
    )
    return (
        peak_note(job),
        gemm,
        attention_core_note(job, layout),
        utilisation_note(job),
        *links,
        *link_default_notes(job.cluster),
        *offload_rate_notes(job, layout),
    )


def offload_rate_notes(job: Job, layout: Layout) -> tuple[str, ...]:
    """The host-side rates an offloading step was timed at (``step_time.optimizer_s`` and
    ``offload_s``), which no cluster field states: the answer named the PCIe link alone, while the
    host's Adam and its NVMe were most of a workstation's step (workstation review)."""
    out = []
    tuning, node = job.tuning, job.cluster.gpus_per_node
    if layout.offload_optimizer is not Offload.NONE and job.training.method is Method.FULL:
        rate = tuning.cpu_adam_params_per_s_per_node
        slower = steps_torch_unfused_on_host(job, layout)
        kind = (
            f"PyTorch's unfused AdamW on CPU tensors, {tuning.torch_cpu_adam_slowdown:g}x slower than"
            if slower
            else "the host's vectorised Adam (DeepSpeed's CPU-Adam, or torch's fused AdamW), as"
        )
        out.append(
            f"optimizer step on the host: {kind} {rate:.3g} parameters/s per node shared by its {node} "
            "GPU(s) (tuning: a two-socket server host, not measured on this cluster's)"
        )
    if Offload.NVME in (layout.offload_optimizer, layout.offload_params):
        out.append(
            f"NVMe offload at {tuning.nvme_bandwidth_bytes_per_s_per_node / 1e9:g} GB/s per node shared by "
            f"its {node} GPU(s) (tuning: a DGX-2's NVMe array, ZeRO-Infinity; one drive is slower)"
        )
    return tuple(out)


def utilisation_note(job: Job) -> str:
    """What MFU counts, so that it can be compared with a framework's or a paper's figure."""
    model = job.model
    kind = "active parameter (an MoE layer's top_k routed experts)" if model.moe is not None else "parameter"
    if flops.frozen_passes(job.training) == 2:
        weights = f"4 FLOPs per base {kind} and token (forward and input gradients: a frozen base has no "
        weights += "weight gradients)"
    else:
        weights = f"6 FLOPs per {kind} and token (forward, input and weight gradients)"
    core = (
        "the whole s x s square (a bidirectional encoder)"
        if model.bidirectional
        else "the causal triangle (Megatron-LM's num_floating_point_operations; PaLM's 12 L h s counts the "
        "whole square)"
    )
    peak = utilisation_peak_flops_per_s(job.cluster, job.training.precision)
    # the datasheet's peak, as published MFU figures quote it: below it a clock the GPU holds (a
    # power limit) scales the step's kernels alone, and "MFU of the 884 TFLOP/s stated" read 38.9%
    # where 34.7% was answered (units review)
    sustained = sustained_peak_flops_per_s(job.cluster, job.training.precision)
    held = (
        f" (the datasheet's, not the {sustained / 1e12:.4g} the clock holds)"
        if clock_note(job.cluster.gpu) is not None
        else ""
    )
    return (
        f"MFU counts {weights}, the input embedding left out, plus attention's core over {core}; HFU adds "
        f"what recompute and the kernels execute; both divide by the dense peak {peak / 1e12:.4g} "
        f"TFLOP/s{held}"
    )


def train_steps_notes(training: TrainingSpec) -> tuple[str, ...]:
    """How many whole steps the time to train counts, where tokens are asked."""
    if not training.tokens:
        return ()
    steps = steps_to_train(training.tokens, training.tokens_per_step)
    return (
        f"time to train: {steps:,} optimizer step{'s' if steps > 1 else ''} of {training.tokens_per_step:,} "
        f"tokens (global batch x sequence) for the {training.tokens:,} tokens asked, the last step whole",
    )


def peak_note(job: Job) -> str:
    """The dense peak the step's matmuls run against, and the clock it assumes where not the datasheet's."""
    precision = job.training.precision
    gemm = Precision.BF16 if precision is Precision.BF16_PURE else precision
    sustained = sustained_peak_flops_per_s(job.cluster, gemm)
    text = f"compute peak: {gemm} dense {sustained / 1e12:.4g} TFLOP/s"
    if precision is Precision.TF32:
        text += " (TF32 tensor cores; weights, gradients and activations stay fp32)"
    clocked = clock_note(job.cluster.gpu)
    if clocked is not None:
        datasheet = peak_flops_per_s(job.cluster, gemm)
        text += f", the datasheet's {datasheet / 1e12:.4g} scaled: {clocked}"
    return text


def attention_core_note(job: Job, layout: Layout) -> str:
    """How attention's core was timed: which kernel, at what share of the 16-bit peak."""
    attention = job.training.attention
    if flops.materialises_scores(job.model, job.training):
        masked = "unmasked" if job.model.bidirectional else "masked"
        math = "sdpa: PyTorch's math kernel, transformers' grouped-query call where no flash kernel runs"
        if job.model.family in flops.SDPA_EXPANDS_KV_FAMILIES:
            math = "sdpa: PyTorch's math kernel, Falcon's one kv head beside every query head (no enable_gqa)"
        named = "eager" if attention is Attention.EAGER else math
        return f"attention's core ({named}): the whole {masked} s x s square at the GEMM rate"
    # a bidirectional encoder's kernel runs every key block (flops.causal_keys_per_query)
    region = "whole s x s square (bidirectional)" if job.model.bidirectional else "causal triangle"
    kernel = core_kernel(job, layout)
    die = job.cluster.gpu.chip or "unstated"
    if (
        attention is Attention.SDPA
        and flops.sdpa_refuses_flash(job.model)
        and not job.training.precision.stores_fp32
        and kernel is not None
    ):
        # no published rate of it: no faster than the die's flash kernel (FlashAttention-2's paper has
        # the memory-efficient kernel below it), as eager attention is held (change review)
        return (
            f"attention's core (sdpa: PyTorch's memory-efficient kernel, its flash and cuDNN backends taking "
            f"head dims up to 256 and q, k, v of one width): the {region} at no more than the die's "
            f"{kernel.name} rates ({kernel.forward_fraction:.3f} forward, {kernel.backward_fraction:.3f} "
            "backward of the 16-bit peak): no rate of it is published"
        )
    if not job.training.gpu_flash_kernels:
        # SDPA dispatches to its memory-efficient kernel where no flash kernel runs (pre-Ampere NVIDIA)
        named = f"{attention}: PyTorch's memory-efficient kernel, no FlashAttention-2 on the {die} die"
        if kernel is None:
            return f"attention's core ({named}): the {region} at the GEMM rate (no published rate of it)"
        return (
            f"attention's core ({named}): the {region} at no more than the slowest fitted die's "
            f"{kernel.name} rates ({kernel.forward_fraction:.3f} forward, {kernel.backward_fraction:.3f} "
            "backward of the 16-bit peak) nor the GEMM rate: no rate of it is published"
        )
    if kernel is None:
        return (
            f"attention's core ({attention}): the {region} at the GEMM rate (no published rate of "
            f"{layout.framework}'s kernel in {job.training.precision} on the {die} die)"
        )
    rate = "the kernel's published rate"
    if not job.cluster.gpu.chip:
        rate = "the kernel's slowest published rate (the die is not stated), at most the GEMM rate"
    elif not fitted_die(job.tuning, job.cluster.gpu):  # step_time.core_rates_flops_per_s
        rate = (
            f"the slowest fitted die's rates, at most the GEMM rate: no {kernel.name} rate is published "
            f"for the {job.cluster.gpu.chip} die (nor is its GEMM efficiency fitted)"
        )
    return (
        f"attention's core ({attention}, {kernel.name} kernel, calls of {kernel.call_tokens:g} tokens): the "
        f"{region} at {kernel.forward_fraction:.3f} (forward) and {kernel.backward_fraction:.3f} "
        f"(backward, 2.5x the forward FLOPs) of the 16-bit peak, {rate}"
    )


def estimate(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    training: TrainingSpec,
    *,
    tuning: Tuning,
    with_limits: bool = True,
    calibration: Calibration = NO_CALIBRATION,
) -> Estimate:
    """Every number for one layout; raises InvalidLayout (with the rule and numbers) if it cannot run.

    With a calibration, memory, fit, warnings and limits all use the calibrated dynamic memory,
    and the step time its factor, so the numbers never contradict each other."""
    training = for_gpu(training, cluster.gpu, model)  # what the request left to the hardware, for this GPU
    validate_layout(model, cluster, layout, training)
    job = prepare(model, cluster, training, tuning)
    return estimate_valid(job, layout, with_limits=with_limits, calibration=calibration)


def estimate_valid(
    job: Job, layout: Layout, *, with_limits: bool = True, calibration: Calibration = NO_CALIBRATION
) -> Estimate:
    """``estimate`` of a layout already validated against the job."""
    factor = calibration.memory_dynamic_factor
    memory = evaluate.memory_estimate(job, layout, factor)
    time = evaluate.time_estimate(job, layout)
    step_time_factor = calibration.step_time_factor
    if not calibration.is_identity:
        # no faster than the step's hardware FLOPs at the dense peak (HFU <= 1), whatever the runs say
        step_time_factor = capped_step_time_factor(time, step_time_factor)
    if step_time_factor != 1.0:
        time = calibrated_time(time, step_time_factor)
    training = job.training
    notes = (*memory_assumptions(job, layout), *time_assumptions(job, layout), *train_steps_notes(training))
    return Estimate(
        fits=evaluate.memory_fits(memory, job.cluster),
        memory=memory,
        time=time,
        max_micro_batch_size=evaluate.max_micro_batch_size(job, layout, factor) if with_limits else None,
        max_seq_len=evaluate.max_seq_len(job, layout, factor) if with_limits else None,
        time_to_train_s=(
            time_to_train_s(training.tokens, training.tokens_per_step, time.tokens_per_s)
            if training.tokens
            else None
        ),
        warnings=(
            *warnings_for(memory, job.cluster, layout),
            *attention_warnings(job, layout, step_time_factor),
            *chip_warnings(job),
            *job.cluster.gpu.notes,  # what the GPU's figures look like (a custom GPU's sparse peaks)
            *network_warnings(job.cluster),
            *context_warnings(job.model, training),
            *fp16_overflow_warnings(job.model, training),
            *peft_sharding_warnings(job.model, layout, training),
            *moe_warnings(job.model),
            *capacity_warnings(job.model, layout),
            *job.model.config_notes,  # what the config states that no figure reads (hf_config)
            *coverage_warnings(layout.world_size, job.counts.total, training),
        ),
        assumptions=(
            notes if calibration.is_identity else (*notes, calibration_note(calibration, step_time_factor))
        ),
    )
