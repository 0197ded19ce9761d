"""Warnings about how far an estimate can be trusted for this input: a GPU whose die is not stated
(timed at the most conservative fitted efficiency), a network faster than any NIC (likely Gb/s typed
as GB/s), a sequence past the positions the model was trained to, and figures computed outside the
ranges their validation covers."""

from __future__ import annotations

from dataclasses import dataclass

from service.estimator.comm import FASTEST_NIC_BYTES_PER_S, NVLINK_DOMAIN_GPUS, used_link_defaults
from service.estimator.job import Job
from service.estimator.model_states import fused_expert_adapted_weights, peft_adapts_fused_experts
from service.estimator.tuning import Tuning, conservative_peak_fraction, fitted_die
from service.estimator.types import (
    ClusterSpec,
    Framework,
    GPUSpec,
    Layout,
    Method,
    ModelSpec,
    PositionEmbedding,
    RopeScalingKind,
    TrainingSpec,
)

# Parts users describe as a custom GPU and the catalog die each is built on (the vendors' architecture
# whitepapers and datasheets: H800, H20 and GH200's GPU are GH100 dies; A800 and A30 GA100; L20 and
# RTX 6000 Ada AD102; GB200's GPUs GB100), quoted by the warning.
CHIP_EXAMPLES = (
    "gh100 for H800, H20 or GH200, ga100 for A800 or A30, ad102 for L20 or RTX 6000 Ada, gb100 for GB200, "
    "cdna3 for MI325X; a die the catalog lacks (B300, MI355X, RTX 5090) has none to set: state vendor "
    '"amd" for an AMD part then'
)


def fitted_fractions(tuning: Tuning) -> str:
    """The GEMM peak fractions fitted per die, as 'chip fraction' pairs."""
    return ", ".join(f"{chip} {fraction:g}" for chip, fraction in sorted(tuning.peak_fraction_by_chip))


def chip_warnings(job: Job) -> tuple[str, ...]:
    """A GPU whose die has no fitted efficiency (a custom part without ``chip``, or a die no published run
    measured) is timed at the most conservative fitted one (``tuning.peak_fraction``,
    ``tuning.attention_kernel_rate``): say so, and what to set or record."""
    return gpu_chip_warnings(job.cluster.gpu, job.tuning)


def gpu_chip_warnings(gpu: GPUSpec, tuning: Tuning) -> tuple[str, ...]:
    """``chip_warnings`` of a GPU under ``tuning`` (a capacity option's, which has no job); a catalog
    die no published run measured (AMD's, Ada's, Turing's, GA102) is timed the same way, which the
    answer says too: an MI300X at the lowest fitted fraction came out faster than an H100 with
    nothing saying its efficiency is an assumption (stop 49's AMD review)."""
    if not tuning.peak_fraction_by_chip or fitted_die(tuning, gpu):
        return ()
    fraction = conservative_peak_fraction(tuning)
    used = (
        f"the most conservative fitted efficiency (GEMMs at {fraction:g} of the dense peak, the lowest of "
        f"{fitted_fractions(tuning)}; attention's core at its kernel's slowest published rate, at most the "
        "GEMM rate) is used"
    )
    if gpu.chip:
        return (
            f"{gpu.name}'s die ({gpu.chip}) has no efficiency fitted on a measured run: {used}, so its "
            "step time is an assumption; a run recorded on it (POST /v1/plans/{id}/runs) calibrates it",
        )
    what = f"set chip to the GPU's die for the efficiency fitted on it ({CHIP_EXAMPLES})"
    return (f"custom GPU without chip: {used}; {what}",)


# ---------------------------------------------------------------- peft on fused experts


def zero3_partitions_fused_expert_adapters(model: ModelSpec, layout: Layout, training: TrainingSpec) -> bool:
    """Whether peft's adapters on fused experts (an MLP target on ``peft_adapts_fused_experts``' models)
    run under DeepSpeed ZeRO-3, which partitions them outside their own forward
    (``peft_sharding_warnings``; the launch files' ``z3_leaf_duty``)."""
    return (
        training.method is not Method.FULL
        and layout.framework is Framework.DEEPSPEED
        and layout.zero_stage == 3
        and peft_adapts_fused_experts(model, layout)
        and bool(fused_expert_adapted_weights(model, training)[0])  # no MLP target: no expert adapter
    )


def peft_sharding_warnings(model: ModelSpec, layout: Layout, training: TrainingSpec) -> tuple[str, ...]:
    """peft's adapters on fused experts (``model_states.peft_adapts_fused_experts``: a ParamWrapper per
    expert parameter) build the adapted weight from their lora_A / lora_B weights outside those
    modules' own forward (peft/tuners/lora/layer.py ParamWrapper.get_delta_weight). DeepSpeed ZeRO-3
    gathers a module's own parameters for its forward, so they are partitioned there unless the MoE
    block is a ZeRO-3 leaf module (deepspeed.utils.set_z3_leaf_modules: its whole parameters gathered
    before its forward), which the launch files ask for (``launchers.common.z3_leaf_duty``); said, as
    no run of it was measured here. QLoRA's FSDP1, where the same fails (huggingface/peft#3080), is
    refused (validate, ``peft_fused_experts_fsdp1``); FSDP2 gathers the whole decoder layer."""
    if not zero3_partitions_fused_expert_adapters(model, layout, training):
        return ()
    return (
        "peft's adapters on the fused experts read their lora_A / lora_B weights outside those modules' "
        "forward (ParamWrapper.get_delta_weight), where ZeRO-3 leaves them partitioned: the MoE block must "
        "be a ZeRO-3 leaf module (deepspeed.utils.set_z3_leaf_modules, as the launch files say), or the "
        "step fails; ZeRO-2 or attention targets only avoid it",
    )


# ---------------------------------------------------------------- the network between nodes


def network_warnings(cluster: ClusterSpec) -> tuple[str, ...]:
    """A network between nodes faster per GPU than any NIC: timed as stated (an NVLink domain across
    nodes is that fast), with the likelier reading said, since ``*_gbps`` inputs are GB/s and a NIC's
    rate is quoted in Gb/s (400 typed for 400 Gb/s NICs is 400 GB/s here, eight times the network)."""
    return (*_nic_warnings(cluster), *_peer_link_warnings(cluster))


def _nic_warnings(cluster: ClusterSpec) -> tuple[str, ...]:
    rate = cluster.inter_node_bandwidth_bytes_per_s
    if cluster.num_nodes == 1:
        return ()
    host = cluster.gpu.pcie_bandwidth_bytes_per_s
    if host < rate <= FASTEST_NIC_BYTES_PER_S:
        # a NIC reaches its GPU over PCIe (GPUDirect RDMA through the PCIe switch): a per-GPU share above
        # the GPU's host link is no NIC's (100 typed for 100 Gb/s EDR on an A100, 32 GB/s Gen4, passed
        # silently and moved the plan: network review)
        return (
            f"inter-node bandwidth {rate / 1e9:,.4g} GB/s per GPU is above {cluster.gpu.name}'s PCIe host "
            f"link ({host / 1e9:,.4g} GB/s), which a NIC's traffic to the GPU crosses: timed as stated; if "
            f"it was NICs of {rate / 1e9:,.4g} Gb/s, that is {rate / 8e9:,.4g} GB/s "
            "(inter_node_bandwidth_gbps is in GB/s, bytes; per GPU: a node's NICs divided by its GPUs)",
        )
    if rate <= FASTEST_NIC_BYTES_PER_S:
        return ()
    if cluster.world_size > NVLINK_DOMAIN_GPUS:
        # an NVLink domain stops at its rack (GB200 NVL72: 72 GPUs); between racks each GPU has its NIC
        # (one 800 Gb/s ConnectX-8): 576 GPUs stated at 900 GB/s were timed as one domain, the data-
        # parallel time 2.6x short of the NICs' (a rack-scale review)
        return (
            f"inter-node bandwidth {rate / 1e9:,.0f} GB/s per GPU is an NVLink domain's, and a GB200 NVL72 "
            f"rack's holds {NVLINK_DOMAIN_GPUS} GPUs (a DGX GH200's NVLink Switch System 256): this "
            f"cluster's {cluster.world_size:,} may span several, joined by NICs (at most "
            f"{FASTEST_NIC_BYTES_PER_S / 1e9:.0f} GB/s per GPU); timed as stated, which overstates every "
            "group crossing a rack: state the NICs' rate to time those as they run",
        )
    return (
        f"inter-node bandwidth {rate / 1e9:,.0f} GB/s per GPU is faster than any NIC (one 800 Gb/s port "
        f"per GPU is {FASTEST_NIC_BYTES_PER_S / 1e9:.0f} GB/s): timed as stated, as an NVLink domain across "
        f"nodes (GB200 NVL72) is; if it was NICs of {rate / 1e9:,.0f} Gb/s, that is {rate / 8e9:,.4g} GB/s "
        "(inter_node_bandwidth_gbps is in GB/s, bytes)",
    )


def _peer_link_warnings(cluster: ClusterSpec) -> tuple[str, ...]:
    """The link between a node's GPUs where the step rests on a figure nobody stated, or on one slower
    than the network: a custom GB200 without intra_node_bandwidth_bytes_per_s was timed over PCIe (64
    GB/s, 2.2x its step with NVLink's 900) with the assumption in a note alone, and a tray of 4 on an
    NVLink fabric stated as the network put pipeline stages across trays (hardware review)."""
    if cluster.gpus_per_node == 1:
        return ()
    intra, inter = cluster.intra_node_bandwidth_bytes_per_s, cluster.inter_node_bandwidth_bytes_per_s
    out = []
    if any(name == "intra_node_bandwidth_bytes_per_s" for name, _ in used_link_defaults(cluster)):
        out.append(
            f"{cluster.gpu.name}'s link between the GPUs of a node was not stated: its PCIe host link, "
            f"{intra / 1e9:,.4g} GB/s per direction, is assumed; if they are joined by NVLink (or Infinity "
            "Fabric), state intra_node_bandwidth_bytes_per_s: model parallelism and the gradient "
            "reductions are timed on it"
        )
    part = cluster.gpu.intra_node_bandwidth_bytes_per_s
    if part > cluster.gpu.pcie_bandwidth_bytes_per_s and intra > part * (1 + 1e-9):
        # NVLink's datasheet figure is both directions (A100: 600 GB/s for the 300 each way every figure
        # here is): 600 typed for an A100 halved its TP time, silently (network review). A PCIe card's
        # own figure is its host link, which an NVLink bridge stated here rightly exceeds.
        out.append(
            f"the link between a node's GPUs ({intra / 1e9:,.4g} GB/s per GPU, one direction) is above "
            f"{cluster.gpu.name}'s own NVLink ({part / 1e9:,.4g} GB/s): timed as stated; a datasheet's "
            "bidirectional figure is twice the one-way one (intra_node_bandwidth_bytes_per_s is one "
            "direction)"
        )
    if cluster.num_nodes > 1 and inter > intra:
        out.append(
            f"the network between nodes ({inter / 1e9:,.4g} GB/s per GPU) is faster than the link between "
            f"a node's GPUs ({intra / 1e9:,.4g} GB/s): the search then places model parallelism across "
            "nodes; state the node's own link (intra_node_bandwidth_bytes_per_s) if it is faster"
        )
    return tuple(out)


# ---------------------------------------------------------------- the trained context


def context_warnings(model: ModelSpec, training: TrainingSpec) -> tuple[str, ...]:
    """A sequence longer than the positions the model was trained to (``max_position_embeddings``):
    the estimate counts the memory and time of that sequence; whether the model is any good there is
    another matter (learned positions have no row past the table at all: refused before). A config's
    ``rope_scaling`` stretches the positions to factor x its original context (transformers
    modeling_rope_utils: original_max_position_embeddings, else max_position_embeddings; Qwen2.5's
    YaRN factor 4 from 32,768 is its documented 131,072-token setup). Linear scaling (position
    interpolation) without an original_max_position_embeddings is the exception: its configs state the
    interpolated context (Gemma 3: 131,072 with factor 8, pre-trained at 32K and rescaled to 128K, Gemma 3
    report §2; LLaMA-2-7B-32K: 32,768 with factor 8), and transformers' linear scaling never reads it, so
    that is the limit (Gemma 3 at 1M tokens went unwarned: long-context review)."""
    limit, seq = model.max_position_embeddings, training.seq_len
    scaling = model.rope_scaling
    interpolated = (
        scaling is not None
        and scaling.kind is RopeScalingKind.LINEAR
        and not scaling.original_max_position_embeddings
    )
    if scaling is not None and model.position_embedding is PositionEmbedding.ROPE and not interpolated:
        original = scaling.original_max_position_embeddings or model.max_position_embeddings
        if seq <= max(limit, scaling.factor * original):  # a float: a huge factor overflowed int()
            return ()
        scaled = int(scaling.factor * original)  # below seq_len here
        # the config's own context where it is the longer (Llama 3.1: 131,072 with its llama3 scaling
        # factor 8 of 8,192), else what the scaling stretches its original context to
        kind = f"{scaling.kind.value}, factor {scaling.factor:g}"
        reach = (
            f"its rope_scaling ({kind} of {original:,}) reaches {scaled:,}"
            if scaled > limit
            else f"its config's context with its rope_scaling ({kind})"
        )
        return (
            f"seq_len {seq:,} > {max(limit, scaled):,} positions: {model.name} was trained to "
            f"{max(limit, scaled):,} ({reach}); past that it needs continued pretraining; the estimate "
            f"counts {seq:,}-token sequences as asked",
        )
    if seq <= limit or model.position_embedding is PositionEmbedding.LEARNED:
        return ()  # past a learned table's rows the request is refused (validate.position_table_violation)
    if interpolated and scaling is not None and model.position_embedding is PositionEmbedding.ROPE:
        return (
            f"seq_len {seq:,} > max_position_embeddings {limit:,}: {model.name} was trained to {limit:,} "
            f"positions (the context its linear rope_scaling, factor {scaling.factor:g}, interpolates to); "
            f"past that it needs continued pretraining; the estimate counts {seq:,}-token sequences as asked",
        )
    how = (
        "RoPE scaling (rope_scaling in its config) or continued pretraining at this length"
        if model.position_embedding is PositionEmbedding.ROPE
        else "continued pretraining at this length (ALiBi runs past it, but quality there is not what it was "
        "trained for)"
    )
    return (
        f"seq_len {seq:,} > max_position_embeddings {limit:,}: {model.name} was trained to {limit:,} "
        f"positions and needs {how}; the estimate counts {seq:,}-token sequences as asked",
    )


# ---------------------------------------------------------------- what the validation covers


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidatedRange:
    """The inputs a figure of the estimate was compared with published measurements on: GPUs of the
    layout, total parameters of the model, sequence length, each (least, most)."""

    figure: str
    gpus: tuple[int, int]
    parameters: tuple[int, int]
    seq_len: tuple[int, int]
    source: str


# The rows of validation/REPORT.md that compare each figure itself with a published measurement;
# tests/estimator/test_caveats.py recomputes these bounds from the validation data, so they cannot
# go stale. Per-component checks (model states on the ZeRO tables: 1 to 1,024 GPUs, 7.5B to 1T
# parameters; activations measured on small transformers models on the CPU) are not ranges of the
# whole per-GPU figure and are left out.
VALIDATED_RANGES: tuple[ValidatedRange, ...] = (
    ValidatedRange(
        figure="step time",
        # 1 GPU, 334M parameters, seq 384: NVIDIA DeepLearningExamples' BERT-large SQuAD fine-tuning rows
        gpus=(1, 11_616),
        parameters=(334_100_482, 1_008_038_758_400),
        seq_len=(384, 262_144),
        source="validation/REPORT.md 'Published throughput' (visible.json step-time cases: Narayanan "
        "Table 1, Korthikanti Tables 4-5, Megatron-Core H100 weak scaling, BigScience) and the expressible "
        "throughput rows of validation/data/published_runs.json, fit and held-out halves",
    ),
    ValidatedRange(
        figure="per-GPU memory",
        gpus=(1, 512),  # 1: litgpt's config-hub LoRA / QLoRA rows on one A10G (peak allocated)
        parameters=(2_506_172_416, 405_853_388_800),  # 2.51B: litgpt's Gemma-2B rows
        seq_len=(512, 262_144),  # 512: litgpt's rows
        source="validation/REPORT.md 'Published runs': the peak-memory rows of "
        "validation/data/published_runs.json (each compared with the statistic it reports: allocator peak "
        "allocated or reserved per GPU, device used), fit and held-out halves",
    ),
)


# Fine-grained MoE as issue 27 names it: many routed experts, each narrower than half the hidden size
# (Qwen3-30B-A3B: 128 of 768 at h 2,048; Qwen3-235B-A22B; DeepSeek-V3: 256 of 2,048 at 7,168)
FINE_GRAINED_EXPERTS = 64
FINE_GRAINED_WIDTH = 0.5


def moe_warnings(model: ModelSpec) -> tuple[str, ...]:
    """Where the step time is known to be optimistic: fine-grained MoE, whose published Megatron runs
    (NVIDIA's Megatron-Bridge tables, Qwen3-30B-A3B and Qwen3-235B-A22B on H100 and B200) took 1.2-3.3x
    the estimated step (validation/REPORT.md, its rows and the MoE class), from mechanisms not all
    modelled (Megatron review: a plan's estimate said nothing of it)."""
    moe = model.moe
    if moe is None or moe.num_experts < FINE_GRAINED_EXPERTS:
        return ()
    if moe.expert_ffn_hidden_size > FINE_GRAINED_WIDTH * model.hidden_size:
        return ()
    return (
        f"fine-grained MoE ({moe.num_experts} experts of width {moe.expert_ffn_hidden_size:,}, top-"
        f"{moe.top_k}): published Megatron runs of such models took 1.2-3.3x the step this estimate gives "
        "(validation/REPORT.md); grouped GEMMs of few rows per expert, router and permutation kernels, the "
        "token dispatcher's synchronisation and expert load imbalance are not all modelled: read the step "
        "time as optimistic",
    )


def capacity_warnings(model: ModelSpec, layout: Layout) -> tuple[str, ...]:
    """A capacity the request did not ask for: deepspeed.moe.layer.MoE's default factor 1.0 with
    drop_tokens=True (moe/layer.py), which the launch files leave as it is, drops the routed copies past
    each expert's mean load, where the model's own MoE block (ep 1, Megatron's dropless) drops none: what
    trains changes, so it is a warning every surface shows (as an assumption the CLI and the page never
    showed it; defaults and parity reviews)."""
    factor = layout.capacity_factor
    if model.moe is None or factor is None or layout.moe_capacity_factor is not None:
        return ()
    return (
        f"MoE capacity factor {factor:g} (deepspeed.moe.layer.MoE's default, drop_tokens=True): each "
        f"expert takes at most {factor:g} x its mean load of routed tokens and drops the rest, where the "
        "model's own MoE block drops none; set moe_capacity_factor for more room (memory and time grow)",
    )


def _count(n: float) -> str:
    """1.49B, 406B, 1.01T, 125M: three significant digits with the SI suffix parameter counts use."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:g}"


def coverage_warnings(
    gpus: int, parameters: int, training: TrainingSpec, ranges: tuple[ValidatedRange, ...] = VALIDATED_RANGES
) -> tuple[str, ...]:
    """For each figure, a warning when the estimate's GPUs, parameters or sequence length lie outside
    the ranges its validation covers (``VALIDATED_RANGES``), naming the ranges and what is outside."""
    out = []
    for r in ranges:
        outside = []
        if not r.gpus[0] <= gpus <= r.gpus[1]:
            outside.append(f"{gpus:,} GPU{'s' if gpus != 1 else ''}")
        if not r.parameters[0] <= parameters <= r.parameters[1]:
            outside.append(f"{_count(parameters)} parameters")
        if not r.seq_len[0] <= training.seq_len <= r.seq_len[1]:
            outside.append(f"seq {training.seq_len:,}")
        if outside:
            out.append(
                f"{r.figure} validated on {r.gpus[0]:,} to {r.gpus[1]:,} GPUs, {_count(r.parameters[0])} "
                f"to {_count(r.parameters[1])} parameters, seq {r.seq_len[0]:,} to {r.seq_len[1]:,}; this "
                f"estimate is outside: {', '.join(outside)}"
            )
    return tuple(out)
