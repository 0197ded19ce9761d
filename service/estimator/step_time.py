"""Step time of one layout: compute at an achievable fraction of peak, plus exposed communication,
pipeline bubble, offload traffic and the optimizer step.

Attention's core (QK^T, AV) is timed apart from the weight GEMMs: a flash-style kernel (flash,
sdpa) executes the causal triangle only, at its published rate on the die for the framework's
kernel (FlashAttention-2 for PyTorch SDPA and flash-attn, cuDNN for Transformer Engine), its
backward doing 2.5x the forward FLOPs; eager attention computes the whole masked square at the
GEMM rate. MFU still counts the whole square, as Megatron's and the papers' formulas do.

PyTorch eager (FSDP, DeepSpeed: Hugging Face modules run op by op, not compiled) issues each op from
the host, and a kernel cannot start before it is issued: each decoder layer's GEMM-class kernels and
its other kernels take at least their ops x the host's time per op, forward and backward
(``host_wait``; tuning.toml [host_issue]). Small layers and short micro-batches wait on the host;
large layers' kernels outlast their issue. Megatron-Core and torch.compile keep the kernel-launch
floor (``launch_floor_s``).

We model the slowest rank: the most loaded pipeline stage (the last one holds the output layer;
Megatron keeps the embedding on the first), one micro-batch at a time, ``m`` micro-batches per
step. Ranks are ordered tp, cp, (ep inside) dp, pp from innermost to outermost (``comm``).

Every part is a function of a prepared ``Job`` and the ``Layout``; the parts a search shares between
layouts are memoised on the job by the layout fields they read (``job.layout_memo``), and
``evaluate`` is where they are summed.

What overlaps with what, and by how much (the layout's ``tp_comm_overlap`` and
``overlap_grad_reduce`` choose; ``None`` takes the framework's default):
* TP all-reduces (or SP reduce-scatter + all-gather) are fully exposed: Megatron-LM runs them on
  the compute stream unless ``--tp-comm-overlap`` (then ``tp_overlap_hidden_fraction`` hides).
* DP communication (bucketed gradient reductions and parameter gathers; ZeRO-3/FSDP layer by
  layer) and what of it each framework hides: ``dp_comm``.
* CP ring attention passes K/V around the ring under the attention compute; only the excess shows.
* EP all-to-all (dispatch + combine, forward and backward: 4 per MoE layer) is fully exposed.
* PP: bubble (p-1)/(v m) of the ideal time (Narayanan arXiv:2104.04473 §2.2, Llama 3 §3.3.2),
  and point-to-point sends of b s h per micro-batch and chunk (/ t under SP or DeepSpeed's
  partitioned pipe), exposed.
* Offload: PCIe traffic of 16-bit gradients down and parameters up, CPU-Adam on the host, NVMe
  reads and writes of the optimizer states, all exposed (DeepSpeed ZeRO-Offload arXiv:2101.06840
  overlaps part of it; we stay conservative).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.estimator import activations, comm, flops
from service.estimator.activations import FP32_BYTES, MASK_BYTES, element_bytes, ring_kv_width
from service.estimator.clocks import clock_fraction
from service.estimator.errors import InvalidTraining
from service.estimator.job import (
    Job,
    LayerKind,
    job_memo,
    kind_counts,
    layout_memo,
    moe_layers_of,
    rank_kind_counts,
    sum_by_kind,
)
from service.estimator.memory import (
    AUTOCAST_CAST_TRAFFIC_BYTES,
    autocast_casts_weights,
    layout_state_bytes,
    offloaded_activation_bytes,
    output_layer_weights,
    rank_parameters_of,
    state_bytes_of,
)
from service.estimator.model_states import (
    SHARD_GROUP_FIELDS,
    adapted_linears,
    deepspeed_bf16_optimizer,
    frozen_dtype_bytes,
    fused_expert_adapted_weights,
    fused_experts,
    grad_reduce_bytes,
    layer_linears,
    optimizer_step_bytes,
    peft_adapts_fused_experts,
    qlora_bits_per_weight,
    shard_degrees,
)
from service.estimator.params import autotp_keeps_vocab_whole, loss_logits_per_token, stage_parameter_counts
from service.estimator.pipeline import PIPELINE_FIELDS, rank_recomputed_fractions
from service.estimator.tuning import (
    Tuning,
    attention_kernel_fractions,
    attention_kernel_rate,
    fitted_die,
    flex_inter_node_efficiency,
    kernels_per_layer,
    matmul_efficiency,
)
from service.estimator.types import (
    Attention,
    ClusterSpec,
    Compile,
    Framework,
    Layout,
    Method,
    ModelSpec,
    MoeDispatcher,
    NormKind,
    Offload,
    OptimizerImplementation,
    Precision,
    QKNorm,
    Recompute,
    RecomputeModule,
    TrainingSpec,
)
from service.estimator.validate import FRAMEWORK_CAPABILITIES

# ---------------------------------------------------------------- per-GPU rates and sizes


def peak_flops_per_s(cluster: ClusterSpec, precision: Precision) -> float:
    """Dense data-sheet peak for the GEMM precision (fp32: no TF32, PyTorch's default; tf32: the TF32
    tensor-core peak)."""
    peak = cluster.gpu.peak_flops_per_s.of(precision)
    if peak is None:
        raise InvalidTraining(
            f"{cluster.gpu.name} has no {precision.value} peak in its spec",
            rule="precision",
            field="precision",
        )
    return peak


def utilisation_peak_flops_per_s(cluster: ClusterSpec, precision: Precision) -> float:
    """The dense peak MFU and HFU divide by: the fastest the step's kernels may run, the precision's
    GEMM peak and, under fp8, bf16's, which attention's core runs at (``core_rates_flops_per_s``).
    The precision's alone on every catalog part (fp8 outruns bf16 wherever it exists); a custom GPU
    stating fp8 below bf16 (swapped, said by its notes) quoted MFU 1.10 on the precision's alone
    (property review)."""
    peak = peak_flops_per_s(cluster, precision)
    bf16 = cluster.gpu.peak_flops_per_s.bf16
    return max(peak, bf16) if precision is Precision.FP8 and bf16 is not None else peak


def sustained_peak_flops_per_s(cluster: ClusterSpec, precision: Precision) -> float:
    """``peak_flops_per_s`` at the clock the GPU holds (``clocks.clock_fraction``): what the step's
    kernels run against. MFU and HFU stay on the datasheet peak, as published figures quote them."""
    return peak_flops_per_s(cluster, precision) * clock_fraction(cluster.gpu)


def micro_batch_tokens_per_rank(layout: Layout, training: TrainingSpec) -> int:
    """Tokens of one micro-batch that one CP rank holds."""
    return layout.micro_batch_size * training.seq_len // layout.cp


# ---------------------------------------------------------------- the pipeline split


@layout_memo(*PIPELINE_FIELDS, "ep")
def stage_flops_per_token(job: Job, layout: Layout) -> tuple[float, ...]:
    """Forward + backward FLOPs per token of each pipeline rank (the last adds the output layer);
    ep: whether LoRA adapts the routed experts per token (``flops.lora_adapter_flops``)."""
    model, training = job.model, job.training
    fused = fused_experts(model, layout)
    per_kind = {
        kind: flops.layer_training_flops(model, kind, training, fused_experts=fused) for kind in job.kinds
    }
    logits = output_flops_per_token(job)
    last = layout.pp - 1
    return tuple(
        sum(count * per_kind[kind] for kind, count in counts) + (logits if rank == last else 0)
        for rank, counts in enumerate(rank_kind_counts(job, layout))
    )


@job_memo
def output_flops_per_token(job: Job) -> float:
    """Forward + backward FLOPs per token of the output layer, and of each multi-token-prediction
    depth's (its layer is among the stage's layers): what the last pipeline rank adds."""
    model, training = job.model, job.training
    return flops.logits_training_flops(model, training) + training.mtp_num_layers * (
        flops.mtp_block_training_flops(model, training)
    )


@layout_memo(*PIPELINE_FIELDS, "ep")
def slowest_stage_candidates(job: Job, layout: Layout) -> tuple[int, ...]:
    """The pipeline ranks whose time may be the step's (``slowest_stage`` times each and keeps the
    slowest): one of each distinct stage (its layers by kind, and whether it holds the output layer
    and the MTP depths) that no other stage dominates, holding at least as many layers of every kind
    and the output layer where it does; the one with the most FLOPs per token first (ep reads as in
    ``stage_flops_per_token``). A stage's kernel launches, host issue, recompute and model-parallel
    communication follow its layers, not its FLOPs: GPT-2's 12 layers on pp 8 leave the last stage
    the output layer alone, the most FLOPs and the least time (review of stop 48's pipelines); an
    explicit [6, 5, 6, 1] on Gemma 2B puts 1.5 s on the last stage and 1.26 on the first, the
    heaviest in FLOPs; DeepSeek-V3's first stage of dense layers stands in for no MoE stage (the
    newest commits' review). So for an explicit split (``pipeline_layers``); a derived one keeps the
    FLOP-heaviest stage and the one with the most layers (below)."""
    work = stage_flops_per_token(job, layout)
    if layout.pipeline_layers is None:
        # a derived split: the stage with the most FLOPs and the one with the most layers (exact on every
        # preset's derived splits, the review found; timing every undominated stage there cost the 405B
        # search 18% more calls for the same answers)
        most_work = work.index(max(work))
        layers = [sum(count for _, count in counts) for counts in rank_kind_counts(job, layout)]
        most_layers = layers.index(max(layers))
        return (most_work,) if layers[most_layers] <= layers[most_work] else (most_work, most_layers)
    last = layout.pp - 1
    stages: dict[tuple[tuple[tuple[LayerKind, int], ...], bool], int] = {}
    for rank, counts in enumerate(rank_kind_counts(job, layout)):
        stages.setdefault((counts, rank == last), rank)

    def dominates(
        a: tuple[tuple[tuple[LayerKind, int], ...], bool], b: tuple[tuple[tuple[LayerKind, int], ...], bool]
    ) -> bool:
        held = dict(a[0])
        return (a[1] or not b[1]) and all(held.get(kind, 0) >= count for kind, count in b[0])

    kept = [rank for key, rank in stages.items() if not any(o != key and dominates(o, key) for o in stages)]
    most_work = max(kept, key=lambda rank: (work[rank], -rank))
    return (most_work, *(rank for rank in sorted(kept) if rank != most_work))


def _ffn_width(model: ModelSpec, moe_layer: bool) -> int:
    # ffn-wide activations per token: top_k routed experts + shared experts in an MoE layer
    moe = model.moe
    if moe is None or not moe_layer:
        return model.ffn_hidden_size
    return moe.top_k * moe.expert_ffn_hidden_size + moe.num_shared_experts * moe.shared_expert_ffn_hidden_size


def layer_traffic_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec, kind: LayerKind) -> float:
    """Bytes per token, on one GPU, of the tensors a layer's memory-bound kernels (norms, activation
    functions, dropout, eager softmax, MoE permutes) write in forward: what their time scales with
    (``memory_bound_s``). Korthikanti Table 2's tensors, generalised.

    Not the memory model's activations (``activations.layer_bytes``), on purpose: this is a traffic
    proxy, the same Korthikanti tensors for every framework, in the unit in which tuning.toml's
    ``memory_traffic_per_stored_byte`` and ``eager_traffic_factor`` were fitted, whereas the memory
    model counts what each framework saves. In 16 bits with two norms per layer it is
    ``activations.megatron_layer_bytes`` per token less the small tensors kept only for backward
    (flash's fp32 logsumexp, an MoE router's fp32 probabilities and int64 routing indices;
    tests/estimator/test_step_time.py pins the relation). It counts two norms per layer whatever the
    model has, and in fp32 scales everything, its 1-byte dropout masks too, by 4/2."""
    # replicated unless SP: 2 norm inputs 4h, QKV and MLP inputs 4h, 2 dropout masks 2h -> 10h
    # (8h without dropout)
    # sharded: Q, K, V 2(q + 2kv), attention output 2q, MLP 2 bytes x (2 GELU | 3 gated) ffn-wide tensors
    # eager attention: softmax out 2 + dropout mask 1 + dropout out 2 -> 5 a s (Korthikanti's 5as/h;
    # 2 a s without attention dropout)
    h, q, kv, t = model.hidden_size, model.q_size, model.kv_size, layout.tp
    masks = 2 * h if model.hidden_dropout > 0 else 0
    replicated = (8 * h + masks) / (t if layout.sequence_parallel else 1)
    mlp_tensors = 3 if model.mlp.gated else 2
    sharded = 2 * (q + 2 * kv) + 2 * q + 2 * mlp_tensors * _ffn_width(model, kind.moe)
    if kind.moe and model.moe is not None:
        # the routed copies of every token: permuted for dispatch and gathered back for combine (top_k
        # rows of h each; activations._moe_mlp stores the same), which the permute kernels read and write
        sharded += 2 * 2 * model.moe.top_k * h
    # eager attention materialises every s x s score and masks outside a window or chunk
    probabilities = 5 if model.attention_dropout > 0 else 2
    scale = element_bytes(training.precision) / 2  # the table assumes 16-bit activations
    scores = 0.0
    if flops.materialises_scores(model, training):
        scores = scale * probabilities * model.num_attention_heads * training.seq_len
        if training.attention is Attention.SDPA:
            # SDPA's math kernel: fp32 probabilities (and its dropout's fp32 output beside the 1-byte
            # mask), whatever the precision (attention.cpp upcasts; change review)
            fp32 = FP32_BYTES + (MASK_BYTES + FP32_BYTES if model.attention_dropout > 0 else 0)
            scores = fp32 * model.num_attention_heads * training.seq_len
    return scale * (replicated + sharded / t) + scores / t


@layout_memo("tp", "sequence_parallel", *PIPELINE_FIELDS)
def stage_traffic_bytes(job: Job, layout: Layout) -> tuple[float, ...]:
    """``layer_traffic_bytes`` per token summed over the layers of each pipeline rank (the loss on the
    logits is timed apart, ``loss_traffic_bytes``)."""
    model, training = job.model, job.training
    per_kind = {kind: layer_traffic_bytes(model, layout, training, kind) for kind in job.kinds}
    return tuple(sum_by_kind(counts, per_kind.__getitem__) for counts in rank_kind_counts(job, layout))


def loss_traffic_bytes(model: ModelSpec, layout: Layout, tuning: Tuning, seq_len: int) -> float:
    """HBM bytes per token the cross-entropy moves in one step on the last stage (fp32 logits,
    vocab-parallel over tp, Korthikanti §4.3): ``loss_traffic_bytes_per_logit`` x V / t; compiled,
    inductor's fused kernels on the 16-bit logits (``compiled_loss_traffic_bytes_per_logit``)."""
    per_logit = (
        tuning.compiled_loss_traffic_bytes_per_logit
        if layout.torch_compile is Compile.MODEL_AND_LOSS
        else tuning.loss_traffic_bytes_per_logit
    )
    # an encoder's question-answering or classification head: its few logits (params.loss_logits_per_token)
    return per_logit * loss_logits_per_token(model, seq_len) / activations.logits_split(model, layout)


@layout_memo(*PIPELINE_FIELDS, "tp", "ep", "etp", "framework")  # framework: AutoTP's whole embedding
def gpu_parameters(job: Job, layout: Layout) -> float:
    """Parameters on one GPU of the most loaded stage before ZeRO sharding (experts split by ep)."""
    return max(dense + experts for dense, experts in stage_gpu_parameter_groups(job, layout))


@layout_memo(*PIPELINE_FIELDS, "tp", "ep", "etp", "framework")
def stage_gpu_parameter_groups(job: Job, layout: Layout) -> tuple[tuple[float, float], ...]:
    """(dense, routed experts) parameters on one GPU of each stage before ZeRO sharding (memoised:
    ``gpu_parameters`` and every sharding's ``zero_gpu_parameters`` read it)."""
    # Each stage's routed experts are those of the MoE layers it holds (every layer_frequency-th
    # layer), so with ep > 1 or uneven MoE layers the most loaded GPU is found per stage.
    experts_per_layer = job.counts.experts_per_moe_layer
    counts = stage_parameter_counts(job.model, layout, job.training.mtp_num_layers)
    stages = zip(counts, rank_kind_counts(job, layout), strict=True)
    groups = []
    # an embedding AutoTP keeps whole on every rank (params.autotp_keeps_vocab_whole), as
    # model_states.rank_parameters counts it (change review: timed split, held whole)
    whole = job.counts.embedding * (1 - 1 / layout.tp) if autotp_keeps_vocab_whole(job.model, layout) else 0.0
    for stage, (params, kinds) in enumerate(stages):
        experts = experts_per_layer * moe_layers_of(kinds)
        embedding = whole if stage == 0 else 0.0
        groups.append(((params - experts) / layout.tp + embedding, experts / (layout.ep * layout.expert_tp)))
    return tuple(groups)


# ---------------------------------------------------------------- links


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupLinks:
    tp: comm.Link
    cp: comm.Link
    dp: comm.Link  # the gradient group: dp x cp ranks (Megatron's dp-cp group), stride tp
    pp: comm.Link


def tuned_link(job: Job, size: int, stride: int) -> comm.Link:
    """The link of a group of ``size`` ranks ``stride`` apart, derated to what NCCL achieves and with
    its latencies (tuning [links])."""
    tuning = job.tuning
    return comm.link_for_group(
        job.cluster,
        size,
        stride,
        intra_latency_s=tuning.intra_node_latency_s,
        inter_latency_s=tuning.inter_node_latency_s,
        base_latency_s=tuning.collective_base_latency_s,
        intra_efficiency=tuning.intra_node_bus_efficiency,
        inter_efficiency=tuning.inter_node_bus_efficiency,
    )


@layout_memo("dp", "tp", "pp", "cp")
def group_links(job: Job, layout: Layout) -> GroupLinks:
    """The link each parallel group crosses, derated to NCCL's achievable bus bandwidth."""
    strides = comm.group_strides(layout)
    return GroupLinks(
        tp=tuned_link(job, layout.tp, strides.tp),
        cp=tuned_link(job, layout.cp, strides.cp),
        dp=tuned_link(job, layout.dp * layout.cp, strides.cp),
        pp=tuned_link(job, layout.pp, strides.pp),
    )


@layout_memo("tp", "ep", "etp")
def expert_link(job: Job, layout: Layout) -> comm.Link:
    """The link of the expert-parallel group (its all-to-all), ``comm.expert_stride`` apart."""
    return tuned_link(job, layout.ep, comm.expert_stride(layout))


def exposed_s(comm_s: float, window_s: float, max_hidden_fraction: float) -> float:
    """Communication left on the critical path when it runs under ``window_s`` of compute."""
    return max(comm_s * (1.0 - max_hidden_fraction), comm_s - window_s)


# ---------------------------------------------------------------- what every part of a step reads

# The layout fields of the step's base: the parallel split, the micro-batch and its count, SP and
# the framework (stored activation bytes, the kernels between the GEMMs).
SPLIT_FIELDS = ("dp", "tp", "pp", "cp", "ep", "etp")
BASE_FIELDS = (
    *SPLIT_FIELDS,
    *PIPELINE_FIELDS[1:],
    "framework",  # fused (Megatron) or eager kernels between the GEMMs
    "torch_compile",  # or inductor's
    "sequence_parallel",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "moe_capacity_factor",  # the routed experts' rows, and the dispatcher's host sync
    "moe_dispatcher",  # the alltoall dispatcher's second permutation; flex's own dispatch time
)


# The layout fields of the slowest stage's shape: the parallel and the pipeline split, and SP.
SHAPE_FIELDS = (*SPLIT_FIELDS, *PIPELINE_FIELDS[1:], "sequence_parallel")


@dataclass(slots=True, kw_only=True)  # built on every memo miss: not frozen (frozen __init__ is ~4x)
class StageShape:
    """What the step's base reads of the slowest stage that no micro-batch, framework or recompute
    changes: computed once per split (``SHAPE_FIELDS``), shared by the step bases of its micro-batches."""

    stage: int
    layers: int
    counts: tuple[tuple[LayerKind, int], ...]  # the stage's layers by kind
    routed_flops: int  # routed experts' forward FLOPs per token over the stage's layers
    links: GroupLinks
    parameters: float  # gpu_parameters
    traffic_bytes: float  # stage_traffic_bytes of the stage, per token
    core_flops: int  # attention's core, forward, per token, over the stage's layers
    core_work_flops: float  # what its kernels execute of that (flash skips the masked blocks)


@layout_memo(*SHAPE_FIELDS, "framework")  # framework: AutoTP's whole embedding (gpu_parameters)
def stage_shape(job: Job, layout: Layout, stage: int) -> StageShape:
    counts = rank_kind_counts(job, layout)[stage]
    return StageShape(
        stage=stage,
        layers=sum(count for _, count in counts),
        counts=counts,
        routed_flops=moe_layers_of(counts) * routed_expert_flops(job.model),
        links=group_links(job, layout),
        parameters=gpu_parameters(job, layout),
        traffic_bytes=stage_traffic_bytes(job, layout)[stage],
        core_flops=sum_core_flops(job, counts),
        core_work_flops=sum_by_kind(counts, lambda kind: kind_core_work_flops(job, kind)),
    )


@job_memo
def gemm_efficiency(job: Job, width: float, tokens: float) -> float:
    """``tuning.matmul_efficiency`` of GEMMs ``width`` wide on ``tokens`` rows on the job's GPU: the
    same for every layout of one tensor-parallel degree and micro-batch."""
    return matmul_efficiency(job.tuning, job.cluster.gpu, width, tokens, precision=job.training.precision)


@dataclass(slots=True, kw_only=True)  # built on every memo miss: not frozen (frozen __init__ is ~4x)
class StepBase:
    """What every part of a step reads: the slowest stage and its layers, micro-batches, tokens of
    one micro-batch on one CP rank, the achieved GEMM rate, the links and the GPU's parameters."""

    stage: int
    layers: int
    counts: tuple[tuple[LayerKind, int], ...]  # the stage's layers by kind
    micro_batches: int
    tokens: int
    flops_per_s: float  # the weight GEMMs' achieved rate
    core_forward_flops_per_s: float  # attention's core, forward: 16-bit even when the linears run in fp8
    core_backward_flops_per_s: float  # its backward, per FLOP of the 2 x forward we count
    expert_flops_per_s: float  # routed experts' GEMMs on the busiest EP rank, per FLOP of the mean load
    routed_flops: int  # routed experts' forward FLOPs per token over the slowest stage's layers
    links: GroupLinks
    parameters: float  # gpu_parameters
    traffic_bytes: float  # stage_traffic_bytes of the slowest stage, per token
    core_flops: int  # attention's core, forward, per token, over the slowest stage's layers
    core_work_flops: float  # what its kernels execute of that (flash skips the masked blocks)
    tp_all_reduce_s: float  # one all-reduce of a micro-batch's activations over the TP group
    compute_s: float = 0.0  # compute_s, set once the rest is known
    # compute_s's time the GPU does not work, forward and backward, all layers and micro-batches: the
    # host's waits and what the launch floor adds (``compute_idle_s``)
    idle_forward_s: float = 0.0
    idle_backward_s: float = 0.0


# The layout fields of one micro-batch's rates: its tokens on one rank (micro-batch, cp), the GEMM
# widths (tp, etp), the attention kernel (framework, cp) and the routed experts' load (ep, capacity).
RATE_FIELDS = ("tp", "cp", "ep", "etp", "framework", "micro_batch_size", "moe_capacity_factor")


@dataclass(slots=True, kw_only=True)  # built on every memo miss: not frozen (frozen __init__ is ~4x)
class MicroBatchRates:
    """The rates one micro-batch's kernels run at, the same whatever the data-parallel and pipeline
    split (``RATE_FIELDS``): shared by the step bases of every dp, pp and accumulation."""

    tokens: int  # of one micro-batch on one CP rank
    flops_per_s: float  # the weight GEMMs' achieved rate
    core_forward_flops_per_s: float
    core_backward_flops_per_s: float
    expert_flops_per_s: float


@layout_memo(*RATE_FIELDS)
def micro_batch_rates(job: Job, layout: Layout) -> MicroBatchRates:
    tokens = micro_batch_tokens_per_rank(layout, job.training)
    efficiency = gemm_efficiency(job, job.model.hidden_size / layout.tp, tokens)
    core_forward, core_backward = core_rates_flops_per_s(job, layout, efficiency)
    peak = sustained_peak_flops_per_s(job.cluster, job.training.precision)
    return MicroBatchRates(
        tokens=tokens,
        flops_per_s=peak * efficiency,
        core_forward_flops_per_s=core_forward,
        core_backward_flops_per_s=core_backward,
        expert_flops_per_s=peak * expert_efficiency(job, layout) / expert_load_factor(job, layout),
    )


def step_base(job: Job, layout: Layout) -> StepBase:
    """The base of the slowest stage (``slowest_stage``)."""
    return stage_step_base(job, layout, slowest_stage(job, layout))


@layout_memo(*BASE_FIELDS)
def stage_step_base(job: Job, layout: Layout, stage: int) -> StepBase:
    """The step's base as pipeline rank ``stage`` runs it."""
    return stage_base(job, layout, stage_shape(job, layout, stage), micro_batch_rates(job, layout))


def stage_base(job: Job, layout: Layout, shape: StageShape, rates: MicroBatchRates) -> StepBase:
    """The step's base as pipeline rank ``shape.stage`` runs it."""
    base = StepBase(
        stage=shape.stage,
        layers=shape.layers,
        counts=shape.counts,
        micro_batches=layout.accumulation_steps(job.training.global_batch_size),
        tokens=rates.tokens,
        flops_per_s=rates.flops_per_s,
        core_forward_flops_per_s=rates.core_forward_flops_per_s,
        core_backward_flops_per_s=rates.core_backward_flops_per_s,
        expert_flops_per_s=rates.expert_flops_per_s,
        routed_flops=shape.routed_flops,
        links=shape.links,
        parameters=shape.parameters,
        traffic_bytes=shape.traffic_bytes,
        core_flops=shape.core_flops,
        core_work_flops=shape.core_work_flops,
        tp_all_reduce_s=tp_all_reduce_s(job, rates.tokens, shape.links.tp),
    )
    busy_s = compute_busy_s(job, layout, base)
    base.compute_s = compute_s(job, layout, base, busy_s)
    base.idle_forward_s, base.idle_backward_s = compute_idle_s(job, layout, base, busy_s)
    return base


@dataclass(frozen=True, slots=True)
class CoreKernel:
    """The flash-style attention kernel a layout runs and its published rates on the die."""

    name: str  # tuning.toml [attention_kernel] framework -> kernel
    call_tokens: float  # sequence length of one kernel call: seq_len / cp
    forward_fraction: float  # of the 16-bit dense peak
    backward_fraction: float  # the same, counting backward_flops_per_forward FLOPs per forward FLOP
    backward_flops_per_forward: float


@layout_memo("framework", "cp")
def core_kernel(job: Job, layout: Layout) -> CoreKernel | None:
    """The kernel that runs attention's core with a published rate (tuning.toml [attention_kernel]),
    or None: eager attention, fp32 or tf32 (flash kernels take 16-bit inputs only), or no figure for
    the framework's kernel on this die (the core then runs at the GEMM rate)."""
    training = job.training
    if training.attention is Attention.EAGER or training.precision.stores_fp32:
        return None
    if flops.materialises_scores(job.model, training):
        return None  # SDPA's math kernel: batched GEMMs over the square, at the (fp32) GEMM rate
    rate = attention_kernel_rate(job.tuning, job.cluster.gpu, layout.framework)
    fractions = attention_kernel_fractions(
        job.tuning, job.cluster.gpu, layout.framework, training.seq_len / layout.cp, job.model.bidirectional
    )
    if rate is None or fractions is None:
        return None
    return CoreKernel(rate.kernel, training.seq_len / layout.cp, *fractions, rate.backward_flops_per_forward)


def core_rates_flops_per_s(job: Job, layout: Layout, gemm_efficiency: float) -> tuple[float, float]:
    """(forward, backward) rates of attention's core (QK^T, AV): its kernel's (``core_kernel``), else
    the GEMM rate. The backward rate is per FLOP of the 2 x forward the step counts."""
    # fp8 recipes (Transformer Engine, torchao float8) convert the Linear layers only; attention's
    # QK^T and AV stay in bf16 (flash attention's 16-bit kernels)
    precision = job.training.precision
    gemm = Precision.BF16 if precision is Precision.FP8 else precision
    if job.training.attention is Attention.SDPA and flops.materialises_scores(job.model, job.training):
        # SDPA's math kernel upcasts 16-bit q, k and v and multiplies them in fp32 (attention.cpp;
        # matmul's TF32 off by default, as the trainers leave it): at the fp32 peak
        gemm = Precision.TF32 if precision is Precision.TF32 else Precision.FP32
    peak = sustained_peak_flops_per_s(job.cluster, gemm)
    kernel = core_kernel(job, layout)
    if kernel is None:
        return eager_core_rates_flops_per_s(job, layout, peak, peak * gemm_efficiency)
    # the step counts the core's backward as 2x its forward; the kernel's rate counts its own ratio
    forward = peak * kernel.forward_fraction
    backward = peak * kernel.backward_fraction * 2.0 / kernel.backward_flops_per_forward
    if not fitted_die(job.tuning, job.cluster.gpu):
        # no fitted die: the slowest fitted die's core, which for a die without a published kernel
        # rate is its GEMM rate (the conservative fraction's die among them: tuning.peak_fraction)
        return min(forward, peak * gemm_efficiency), min(backward, peak * gemm_efficiency)
    return forward, backward


def eager_core_rates_flops_per_s(job: Job, layout: Layout, peak: float, gemm: float) -> tuple[float, float]:
    """Eager attention's core (batched QK^T and AV over the whole square, 16-bit): the GEMM rate, but
    never faster than the FlashAttention kernel of this die doing the same unmasked product: its
    short batched GEMMs (K = head_dim) run no faster, and it writes and reads the scores besides
    (Dao, FlashAttention-2, arXiv:2307.08691, Figs. 4-5: standard PyTorch attention below FA2 at every
    length from 512 to 16k). Without a published kernel rate for the die, or in fp32/tf32, the GEMM
    rate. (An eager estimate on an H100 at 512 tokens came out faster than flash: a differential
    review's case.)"""
    training = job.training
    if training.attention is not Attention.EAGER or training.precision.stores_fp32:
        return gemm, gemm
    rate = attention_kernel_rate(job.tuning, job.cluster.gpu, layout.framework)
    fractions = attention_kernel_fractions(
        job.tuning, job.cluster.gpu, layout.framework, training.seq_len / layout.cp, unmasked=True
    )
    if rate is None or fractions is None:
        return gemm, gemm
    forward = peak * fractions[0]
    backward = peak * fractions[1] * 2.0 / rate.backward_flops_per_forward
    return min(gemm, forward), min(gemm, backward)


def core_s_per_token(base: StepBase, forward_flops: float, backward_flops: float) -> float:
    """Seconds per token of ``forward_flops`` and ``backward_flops`` (2 x forward counting) of the core."""
    return forward_flops / base.core_forward_flops_per_s + backward_flops / base.core_backward_flops_per_s


def routed_rows_per_rank(job: Job, layout: Layout) -> float:
    """Routed copies of tokens one GPU's experts take per micro-batch at the mean load: its b s / cp
    tokens x top_k, or etp/tp of them with etp < tp (each rank dispatches its sequence-parallel shard;
    Megatron's alltoall dispatcher gathers the tokens over the etp group only)."""
    moe = job.model.moe
    tokens = micro_batch_tokens_per_rank(layout, job.training)
    return 0.0 if moe is None else tokens * layout.expert_tp / layout.tp * moe.top_k


def tokens_per_expert(job: Job, layout: Layout) -> float:
    """Rows of one routed expert's GEMMs per micro-batch: the tokens of the expert-parallel group
    routed top_k times over E experts at the mean load (GShard's), or padded to the capacity factor's
    multiple of it when one is set (``Layout.capacity_factor``)."""
    moe = job.model.moe
    if moe is None:
        return float(micro_batch_tokens_per_rank(layout, job.training))
    rows = routed_rows_per_rank(job, layout) * layout.ep / moe.num_experts
    capacity = layout.capacity_factor
    return rows if capacity is None else rows * capacity


def max_load_factor(balls: float, bins: int) -> float:
    """Expected fullest bin over the mean when ``balls`` fall uniformly at random into ``bins``."""
    # Raab & Steger, 'Balls into Bins - A Simple and Tight Analysis' (RANDOM 1998), Thm 1, m >= n ln n:
    # the fullest of n bins holds m/n + sqrt(2 (m/n) ln n) (1 + o(1)) of m balls
    if bins <= 1 or balls <= 0:
        return 1.0
    return 1.0 + math.sqrt(2.0 * math.log(bins) * bins / balls)


def expert_load_factor(job: Job, layout: Layout) -> float:
    """The busiest expert-parallel rank's routed rows over the mean: padded to capacity, the capacity
    factor (every expert computes exactly its capacity, tokens above it dropped); dropless, the
    expected fullest of ep ranks when the EP group's routed copies fall on them uniformly at random
    (``max_load_factor``; learned routing is no more even than that, so it is a floor)."""
    moe = job.model.moe
    if moe is None:
        return 1.0
    capacity = layout.capacity_factor
    if capacity is not None:
        return capacity
    return max_load_factor(routed_rows_per_rank(job, layout) * layout.ep, layout.ep)


def expert_efficiency(job: Job, layout: Layout) -> float:
    """``matmul_efficiency`` of the routed experts' GEMMs: as narrow as the smaller of h and the
    expert width (split over etp), on ``tokens_per_expert`` rows, each bounded by its shape's roofline
    (``tuning.gemm_roofline_bound``): the up projection (rows x h) @ (h x 2f/etp gated, f/etp plain)
    and the down projection (rows x f/etp) @ (f/etp x h), weighted by their FLOPs."""
    model, tuning, gpu = job.model, job.tuning, job.cluster.gpu
    moe, rows = model.moe, tokens_per_expert(job, layout)
    if moe is None:
        return gemm_efficiency(job, model.hidden_size / layout.expert_tp, rows)
    h, f = model.hidden_size, moe.expert_ffn_hidden_size / layout.expert_tp
    up = (2 if model.mlp.gated else 1) * f
    width = min(h, moe.expert_ffn_hidden_size) / layout.expert_tp
    precision = job.training.precision
    up_efficiency = matmul_efficiency(tuning, gpu, width, rows, shape=(up, h), precision=precision)
    down_efficiency = matmul_efficiency(tuning, gpu, width, rows, shape=(h, f), precision=precision)
    # FLOPs of each GEMM per row: 2 h up and 2 f h; time = FLOPs / efficiency
    return (up + f) / (up / up_efficiency + f / down_efficiency)


def routed_expert_flops(model: ModelSpec) -> int:
    """Forward FLOPs per token of the routed experts a token visits in one MoE layer."""
    moe = model.moe
    return 0 if moe is None else moe.top_k * flops.mlp_flops(model, moe.expert_ffn_hidden_size)


def sum_core_flops(job: Job, counts: tuple[tuple[LayerKind, int], ...]) -> int:
    """Attention's core FLOPs per token, forward, of these layers (each kind's span)."""
    seq_len = job.training.seq_len
    return sum(count * flops.layer_core_flops(job.model, kind, seq_len) for kind, count in counts)


@job_memo
def kind_core_work_flops(job: Job, kind: LayerKind) -> float:
    """``flops.layer_core_work_flops`` of a layer of ``kind`` with the job's attention."""
    return flops.layer_core_work_flops(job.model, kind, job.training)


def tp_all_reduce_s(job: Job, tokens: int, link: comm.Link) -> float:
    """One all-reduce of ``tokens`` tokens' activations (b s h) over the TP group's link."""
    size_bytes = tokens * job.model.hidden_size * element_bytes(job.training.precision)
    return comm.group_all_reduce_s(size_bytes, link)


# ---------------------------------------------------------------- compute


def memory_bound_s(
    job: Job, layout: Layout, base: StepBase, passes: float, traffic_bytes_per_token: float
) -> float:
    """Time of ``passes`` forward-equivalents of memory-bound work over all micro-batches: Megatron's
    fused kernels, inductor's (torch.compile), or PyTorch eager's op-by-op kernels
    (``eager_traffic_factor`` x the traffic)."""
    # backward moves 2x the forward traffic, so a training step is 3 passes
    tuning = job.tuning
    traffic = tuning.memory_traffic_per_stored_byte * traffic_bytes_per_token * passes
    if layout.framework is not Framework.MEGATRON and layout.torch_compile is Compile.NONE:
        traffic *= tuning.eager_traffic_factor
    return base.micro_batches * base.tokens * traffic / job.cluster.gpu.hbm_bandwidth_bytes_per_s


def loss_s(job: Job, layout: Layout, base: StepBase) -> float:
    """Cross-entropy on the logits, forward and backward, all micro-batches (last stage only)."""
    if base.stage != layout.pp - 1:
        return 0.0
    traffic = loss_traffic_bytes(job.model, layout, job.tuning, job.training.seq_len)
    losses = 1 + job.training.mtp_num_layers  # each multi-token-prediction depth has its own loss
    return losses * base.micro_batches * base.tokens * traffic / job.cluster.gpu.hbm_bandwidth_bytes_per_s


def unaligned_core_slowdown(model: ModelSpec, training: TrainingSpec, tuning: Tuning) -> float:
    """Extra time of eager attention's core (QK^T, AV) as a multiple of its time at the GEMM rate:
    ``1 / unaligned_attention_core_factor - 1`` when a head's row, head_dim x element bytes, is off
    ``attention_alignment_bytes``, else 0. Flash kernels pad head_dim to a multiple of 8: 0. fp32
    attention runs on CUDA cores, not tensor cores, and the measurements are 16-bit: 0, and so does
    SDPA's math kernel, which upcasts to fp32; tf32's 4-byte rows were not measured either: 0."""
    # BigScience prequel: head_dim 108 (216 B) ran 1.30-1.40x the step of head_dim 144 (tuning.toml)
    if training.attention is not Attention.EAGER or training.precision.stores_fp32:
        return 0.0
    if model.head_dim * element_bytes(training.precision) % tuning.attention_alignment_bytes == 0:
        return 0.0
    return 1.0 / tuning.unaligned_attention_core_factor - 1.0


def unaligned_core_s(job: Job, layout: Layout, base: StepBase, passes_per_layer: float) -> float:
    """Time ``passes_per_layer`` forwards of attention's core per layer of the slowest stage add, over
    all micro-batches, beyond their FLOPs at the GEMM rate (``unaligned_core_slowdown``; 0 aligned)."""
    slowdown = unaligned_core_slowdown(job.model, job.training, job.tuning)
    if slowdown == 0.0 or passes_per_layer == 0:
        return 0.0
    per_token = passes_per_layer * base.core_flops
    return base.micro_batches * base.tokens * per_token / layout.tp / base.flops_per_s * slowdown


def unaligned_core_step_s(job: Job, layout: Layout) -> float:
    """What an unaligned head_dim adds to the step: training passes plus the recomputed core."""
    base = step_base(job, layout)
    # full and selective core_attn redo the core (per-op AC saves the attention op's output)
    recomputed = recomputed_share(job, layout, base.stage) if layout.recomputes_core else 0.0
    return unaligned_core_s(job, layout, base, 3) + unaligned_core_s(job, layout, base, recomputed)


def compute_s(job: Job, layout: Layout, base: StepBase, busy_s: float) -> float:
    """Forward + backward of all micro-batches on the slowest stage's GPU: its work (``busy_s``,
    ``compute_busy_s``), the host's waits around it and the kernels' launch floor."""
    wait = host_wait(job, layout, base)
    return max(busy_s + wait.forward_s + wait.backward_s, launch_floor_s(job, layout, base, 3))


def compute_idle_s(job: Job, layout: Layout, base: StepBase, busy_s: float) -> tuple[float, float]:
    """(forward, backward) time of ``compute_s`` in which the GPU does no work: the host's waits, and
    what the launch floor adds beyond work and waits (a third forward, two thirds backward, as the
    floor counts its passes). The collectives' stream has it to itself (``dp_comm.kind_windows_s``)."""
    wait = host_wait(job, layout, base)
    extra = max(0.0, base.compute_s - busy_s - wait.forward_s - wait.backward_s)
    return wait.forward_s + extra / 3, wait.backward_s + 2 * extra / 3


def compute_busy_s(job: Job, layout: Layout, base: StepBase) -> float:
    """The GPU's work in ``compute_s``: GEMMs (with eager attention's core slowed when its head_dim is
    unaligned), the memory-bound ops between them and the loss."""
    per_token = stage_flops_per_token(job, layout)[base.stage]
    core, work = base.core_flops, base.core_work_flops  # forward; backward twice that
    frozen_routed = flops.frozen_passes(job.training) * base.routed_flops
    routed = frozen_routed + adapted_experts_weight_gradient_flops(job, layout, base)
    unaligned_s = unaligned_core_s(job, layout, base, 3)
    memory_s = memory_bound_s(job, layout, base, 3, base.traffic_bytes) + dequantize_s(job, layout, base, 2)
    memory_s += adapted_experts_s(job, layout, base, ADAPTED_EXPERT_STEP_PASSES)
    memory_s += fp8_cast_s(job, layout, base) + moe_dispatch_s(job, layout, base)
    memory_s += moe_host_sync_s(job, layout, base, 1.0)
    work_s = gemm_s(layout, base, per_token - 3 * core - frozen_routed, work, 2 * work, routed)
    work_s += fp8_output_layer_s(job, layout, base)
    return work_s + unaligned_s + memory_s + loss_s(job, layout, base)


def fp8_output_layer_s(job: Job, layout: Layout, base: StepBase) -> float:
    """What fp8 training's output layer adds to its GEMMs timed at the fp8 rate (``gemm_s``): it runs in
    bf16, at the 16-bit peak (the same efficiency), on the last pipeline rank. Megatron-Core's
    output_layer is a ColumnParallelLinear, not a Transformer Engine module; torchao's float8 converter
    skips "output" (filter_fqns); Transformer Engine models keep lm_head in bf16. It was timed at twice
    the bf16 rate, fp8 faster than its fp8 GEMMs allow by up to a tenth on small models (an fp8 review)."""
    training = job.training
    if training.precision is not Precision.FP8 or base.stage != layout.pp - 1:
        return 0.0
    bf16_flops_per_s = base.flops_per_s * (
        sustained_peak_flops_per_s(job.cluster, Precision.BF16)
        / sustained_peak_flops_per_s(job.cluster, Precision.FP8)
    )
    # and each multi-token-prediction depth's, which runs the same output_layer (GPTModel._postprocess)
    logits = flops.logits_training_flops(job.model, training) * (1 + training.mtp_num_layers)
    tokens = base.micro_batches * base.tokens / layout.tp
    return tokens * logits * (1.0 / bf16_flops_per_s - 1.0 / base.flops_per_s)


def router_bytes_per_token(num_experts: int) -> float:
    """HBM bytes per token of an MoE router's score function and top-k over its E fp32 logits, forward
    and backward: read the logits and write the probabilities (8E), then read the probabilities'
    gradient and the probabilities and write the logits' gradient (12E)."""
    # Megatron-Core moe_router_fusion (Megatron-Bridge's recipes set it): one fused top-k kernel each way
    return 20.0 * num_experts


def moe_dispatch_bytes_per_row(job: Job, layout: Layout) -> float:
    """HBM bytes per routed row (one token's copy at one expert), forward and backward, that the
    layer-traffic proxy (``layer_traffic_bytes``: the permute and unpermute, 2 x 2 top_k h) does not
    count: Megatron's second permutation, which sorts the received rows by local expert after the
    all-to-all (token_dispatcher.py sort_chunks_by_idxs, ep > 1 with more than one local expert: read
    and write 2h bytes each way; the flex dispatcher has none: HybridEP permutes, sends and permutes
    for the experts in one step, token_dispatcher.py _HybridEPManager), and its fp8 casts of the
    experts' inputs and output gradients, which Transformer Engine's GroupedLinear quantises in a
    pass of their own (no norm to fuse into): the up projection's input h and output gradient 2f or
    f, the down projection's input f and output gradient h, each cast and cast transposed
    (``fp8_cast_bytes_per_element``)."""
    moe, model, tuning = job.model.moe, job.model, job.tuning
    if moe is None or layout.framework is not Framework.MEGATRON:
        return 0.0
    h, f = model.hidden_size, moe.expert_ffn_hidden_size / layout.expert_tp
    moved = 0.0
    if layout.ep > 1 and moe.num_experts > layout.ep and layout.moe_dispatcher is MoeDispatcher.ALLTOALL:
        moved += 2 * 2 * element_bytes(job.training.precision) * h
    if job.training.precision is Precision.FP8:
        cast = tuning.fp8_cast_bytes_per_element + tuning.fp8_transposed_cast_bytes_per_element
        moved += cast * (h + (2 if model.mlp.gated else 1) * f + f + h)
    return moved


def moe_dispatch_s(job: Job, layout: Layout, base: StepBase) -> float:
    """The MoE layers' memory-bound passes the layer-traffic proxy leaves out, forward and backward,
    all micro-batches of the slowest stage: the router's (``router_bytes_per_token``, every token of the
    rank) and the dispatcher's and experts' casts (``moe_dispatch_bytes_per_row``, every routed row of
    the busiest EP rank), over HBM bandwidth."""
    moe = job.model.moe
    moe_layers = moe_layers_of(base.counts)
    if moe is None or moe_layers == 0:
        return 0.0
    tokens = base.tokens / (layout.tp if layout.sequence_parallel else 1)
    rows = routed_rows_per_rank(job, layout) * expert_load_factor(job, layout)
    per_layer = tokens * router_bytes_per_token(moe.num_experts)
    per_layer += rows * moe_dispatch_bytes_per_row(job, layout)
    return base.micro_batches * moe_layers * per_layer / job.cluster.gpu.hbm_bandwidth_bytes_per_s


def dispatcher_syncs_host(layout: Layout) -> bool:
    """Megatron-Core's alltoall token dispatcher copies the routed tokens' counts to the host and
    synchronises once per MoE layer and forward unless it pads to capacity (token_dispatcher.py:
    cuda_sync_point 'before_ep_alltoall', or 'before_finish' at ep = tp = 1; 'no_sync' in drop-and-pad
    mode). The flex dispatcher's HybridEP backend syncs as often: dropless, it sizes its output on the
    host from the received counts (token_dispatcher.py _HybridEPManager: 'HybridEP sizes buffers
    dynamically (CPU sync in dispatch)'). DeepSpeed's MoE (ep > 1) pads to capacity by default and
    reads no count on the host (sharded_moe.py since deepspeed#5578); Hugging Face's expert loop (FSDP,
    DeepSpeed at ep = 1) is not modelled."""
    return layout.framework is Framework.MEGATRON and layout.capacity_factor is None


def moe_host_sync_s(job: Job, layout: Layout, base: StepBase, forwards: float) -> float:
    """The GPU idle at the dispatcher's host syncs: ``moe_host_sync_s`` per MoE layer and forward,
    ``forwards`` forwards of every micro-batch of the slowest stage (the training forward, or the
    recomputed share: a recomputed MoE block dispatches again, ``redispatches``)."""
    moe_layers = moe_layers_of(base.counts)
    if job.model.moe is None or moe_layers == 0 or not dispatcher_syncs_host(layout):
        return 0.0
    return base.micro_batches * moe_layers * forwards * job.tuning.moe_host_sync_s


def redispatches(layout: Layout) -> bool:
    """The recomputed forward dispatches and combines the tokens again: full recompute, or Megatron's
    selective moe module; per-op AC saves all_to_all_single's outputs."""
    return layout.recompute is Recompute.FULL or RecomputeModule.MOE in layout.selective_modules


def launch_floor_s(job: Job, layout: Layout, base: StepBase, passes: float) -> float:
    """The least ``passes`` forward-equivalents of the stage's layers take, all micro-batches: each
    layer's kernels cost at least their launch (tuning.toml [kernel_launch]), however short their rows."""
    kernels = kernels_per_layer(job.tuning, layout.framework, layout.torch_compile is not Compile.NONE)
    return base.micro_batches * base.layers * passes * kernels * job.tuning.kernel_launch_s


# ---------------------------------------------------------------- host issue (PyTorch eager)


def issues_from_host(layout: Layout) -> bool:
    """PyTorch eager issues every op from Python: FSDP (DDP, one GPU) and DeepSpeed running Hugging Face
    modules. Megatron-Core's fused modules (CUDA graphs in NVIDIA's recipes) and torch.compile's
    kernels keep the launch floor (``launch_floor_s``) instead."""
    return layout.framework is not Framework.MEGATRON and layout.torch_compile is Compile.NONE


def casts_under_autocast(job: Job, layout: Layout) -> bool:
    """Whether autocast casts the layers' fp32 weights (and fp32 inputs) to 16 bits at each forward:
    mixed precision on fp32 weights on one data-parallel rank under FSDP (plain PyTorch, nothing to
    shard) - full training, or a LoRA base kept in fp32. DeepSpeed and sharded FSDP hand the layers
    16-bit weights (its bf16 engine, FSDP's MixedPrecision), and a 16-bit LoRA base needs no cast. DDP
    over several ranks (ZeRO 0) casts too but is counted without: the step's base is shared by the
    ZeRO stages (``BASE_FIELDS``), and the casts are 24 of a layer's 135 ops."""
    if (
        job.training.precision not in (Precision.BF16, Precision.FP16)
        or layout.framework is not Framework.FSDP
    ):
        return False
    return layout.dp * layout.cp == 1 and (job.training.method is Method.FULL or job.base_autocast)


@dataclass(frozen=True, slots=True)
class LayerOps:
    """Ops one decoder layer issues from the host, forward and backward, split into its GEMM-class ops
    (the Linears' matmuls and attention's kernel) and the rest (norms, RoPE, casts, adds, adapters)."""

    forward_gemm: int
    forward_other: int
    backward_gemm: int
    backward_other: int


def biased_linears(model: ModelSpec) -> int:
    """How many of a dense decoder layer's Linears (``layer_linears``) carry a bias."""
    mlp = len(layer_linears(model)) - 4  # the MLP's (gate,) up, down after q, k, v, o
    return (3 if model.qkv_bias else 0) + (1 if model.attn_out_bias else 0) + (mlp if model.mlp_bias else 0)


@job_memo
def layer_ops(job: Job, casts: bool) -> LayerOps:
    """A decoder layer's ops as the sum of its modules' (tuning.toml [host_issue]), under the job's
    method (a frozen Linear issues no weight gradient; LoRA adds its adapters) and ``casts`` (autocast
    casting fp32 weights: ``casts_under_autocast``)."""
    issue, model, training = job.tuning.host_issue, job.model, job.training
    assert issue is not None  # host_wait asks only with a host_issue table
    linears, biased = len(layer_linears(model)), biased_linears(model)
    frozen = 0 if training.method is Method.FULL else linears  # weight gradients not issued
    norms = model.norms_per_layer + (2 if model.qk_norm is not QKNorm.NONE else 0)
    norm = issue.rmsnorm if model.norm is NormKind.RMSNORM else issue.layernorm
    adapted = 0 if training.method is Method.FULL else len(adapted_linears(model, training))
    cast_forward = issue.autocast_casts.forward if casts else 0
    cast_backward = issue.autocast_casts.backward - frozen if casts else 0  # a frozen weight's grad: none
    return LayerOps(
        forward_gemm=linears * issue.matmul.forward + issue.attention.forward,
        forward_other=issue.rest_of_layer.forward
        + norms * norm.forward
        + biased * issue.linear_bias.forward
        + cast_forward
        + adapted * issue.lora_linear.forward,
        backward_gemm=linears * issue.matmul.backward - frozen + issue.attention.backward,
        backward_other=issue.rest_of_layer.backward
        + norms * norm.backward
        + biased * issue.linear_bias.backward
        + cast_backward
        + adapted * issue.lora_linear.backward,
    )


def layer_gemm_s(job: Job, layout: Layout, base: StepBase) -> tuple[float, float]:
    """(forward, backward) seconds of the slowest stage's layers' GEMM-class kernels, all micro-batches:
    weight matmuls (routed experts' included) and attention's core; the output layer left out."""
    per_token = stage_flops_per_token(job, layout)[base.stage]
    if base.stage == layout.pp - 1:
        per_token -= output_flops_per_token(job)
    core, work = base.core_flops, base.core_work_flops
    passes = flops.frozen_passes(job.training)  # the forward is 1 of them
    routed = passes * base.routed_flops
    linear = per_token - 3 * core - routed
    forward = gemm_s(layout, base, linear / passes, work, 0.0, routed / passes)
    backward = gemm_s(layout, base, linear - linear / passes, 0.0, 2 * work, routed - routed / passes)
    return forward, backward


@dataclass(frozen=True, slots=True)
class HostWait:
    """GPU idle while the host issues the stage's layers' ops: in their forward and in their backward."""

    forward_s: float
    backward_s: float


NO_HOST_WAIT = HostWait(0.0, 0.0)


def host_wait(job: Job, layout: Layout, base: StepBase) -> HostWait:
    """A kernel cannot start before the host has issued it, so each group of a layer's kernels takes at
    least its ops x ``host_issue.s_per_op``: the GEMM-class kernels and the rest, bounded apart in
    forward and in backward (the backward's memory-bound work is twice the forward's,
    ``memory_bound_s``), all layers and micro-batches of the slowest stage. What the groups take beyond
    their GPU time is the wait. Large GEMMs and long elementwise kernels outlast their issue (none);
    a small layer's, or a short micro-batch's, do not."""
    issue = job.tuning.host_issue
    if issue is None or issue.s_per_op == 0.0 or base.layers == 0 or not issues_from_host(layout):
        return NO_HOST_WAIT
    ops = layer_ops(job, casts_under_autocast(job, layout))
    forward_gemm_s, backward_gemm_s = layer_gemm_s(job, layout, base)
    forward_memory_s = memory_bound_s(job, layout, base, 1.0, base.traffic_bytes)
    per_op_s = base.micro_batches * base.layers * issue.s_per_op
    forward = idle_s(forward_gemm_s, ops.forward_gemm * per_op_s)
    forward += idle_s(forward_memory_s, ops.forward_other * per_op_s)
    backward = idle_s(backward_gemm_s, ops.backward_gemm * per_op_s)
    backward += idle_s(2 * forward_memory_s, ops.backward_other * per_op_s)
    return HostWait(forward, backward)


def idle_s(gpu_s: float, issue_s: float) -> float:
    """What issuing kernels for ``issue_s`` adds to their ``gpu_s`` of work: the GPU waits when the host
    is slower."""
    return max(0.0, issue_s - gpu_s)


def gemm_s(
    layout: Layout,
    base: StepBase,
    linear_per_token: float,
    core_forward_per_token: float,
    core_backward_per_token: float,
    routed_per_token: float = 0.0,
) -> float:
    """All micro-batches of ``linear_per_token`` weight-GEMM FLOPs, the attention-core FLOPs its
    kernels execute forward and backward, and ``routed_per_token`` routed-expert FLOPs per token on
    one GPU of the tp group."""
    tokens = base.micro_batches * base.tokens / layout.tp
    return tokens * (
        linear_per_token / base.flops_per_s
        + core_s_per_token(base, core_forward_per_token, core_backward_per_token)
        + routed_per_token / base.expert_flops_per_s
    )


@job_memo
def fp8_cast_pass_bytes_per_token(job: Job, kind: LayerKind, tp: int) -> tuple[float, float]:
    """(forward, backward) HBM bytes per token one layer of ``kind`` moves casting its Linear layers'
    inputs to fp8 (forward: ``fp8_cast_bytes_per_element``), then its output gradients and, for the
    weight gradients, its inputs again, transposed (backward: ``fp8_transposed_cast_bytes_per_element``),
    on one tensor-parallel rank (column-parallel inputs are whole, row-parallel inputs and
    column-parallel outputs 1/tp)."""
    cast, transposed = job.tuning.fp8_cast_bytes_per_element, job.tuning.fp8_transposed_cast_bytes_per_element
    forward = backward = 0.0
    for matmul in flops.layer_matmuls(job.model, kind.moe):
        in_features = matmul.flops / (2 * matmul.out_features)
        outputs = float(matmul.out_features)
        if matmul.replicated:
            inputs = in_features  # whole on every rank, in and out
        elif matmul.row_parallel:
            inputs = in_features / tp
        else:
            inputs, outputs = in_features, outputs / tp
        forward += cast * inputs
        backward += transposed * inputs + cast * outputs
    return forward, backward


def fp8_layer_cast_s(job: Job, layout: Layout, base: StepBase, kind: LayerKind) -> tuple[float, float]:
    """(forward, backward) time of one layer of ``kind``'s separate fp8 cast passes for one micro-batch
    (a non-Megatron fp8 run, tuning.toml [memory_bound]): its activations per token, and the stage's
    weight casts (forward) and casts transposed (backward), a layer's share of them. They run on the
    compute stream, so the collectives hide under them (``dp_comm.kind_windows_s``); the step's
    ``fp8_cast_s`` is their sum. Megatron-Core's Transformer Engine modules fuse the casts into the
    norm and activation kernels: no separate pass."""
    fused = layout.framework is Framework.MEGATRON
    if job.training.precision is not Precision.FP8 or fused or not base.layers:
        return 0.0, 0.0
    forward, backward = fp8_cast_pass_bytes_per_token(job, kind, layout.tp)
    weights = rank_parameters_of(job, layout, base.stage).linear / base.layers
    tuning, bandwidth = job.tuning, job.cluster.gpu.hbm_bandwidth_bytes_per_s
    forward_s = (base.tokens * forward + tuning.fp8_cast_bytes_per_element * weights) / bandwidth
    backward_s = (base.tokens * backward + tuning.fp8_transposed_cast_bytes_per_element * weights) / bandwidth
    return forward_s, backward_s


def fp8_cast_s(job: Job, layout: Layout, base: StepBase) -> float:
    """The separate fp8 cast passes of the slowest stage, all its layers and micro-batches
    (``fp8_layer_cast_s``)."""
    if job.training.precision is not Precision.FP8 or layout.framework is Framework.MEGATRON:
        return 0.0
    per_micro_batch = sum(
        count * sum(fp8_layer_cast_s(job, layout, base, kind)) for kind, count in base.counts
    )
    return base.micro_batches * per_micro_batch


def dequantize_s(job: Job, layout: Layout, base: StepBase, passes: float) -> float:
    """QLoRA: bitsandbytes dequantises every NF4 weight to 16 bits before each matmul that reads it
    (forward, and the input-gradient half of backward): per pass it reads the packed weights
    (``model_states.qlora_bits_per_weight``) and writes 2 bytes per weight, memory-bound, every
    micro-batch."""
    if job.training.method is not Method.QLORA:
        return 0.0
    linear = rank_parameters_of(job, layout, base.stage).linear
    bytes_per_weight = qlora_bits_per_weight(job.model, job.assume) / 8 + 2
    return base.micro_batches * passes * linear * bytes_per_weight / job.cluster.gpu.hbm_bandwidth_bytes_per_s


# Passes over an adapted fused-expert weight's bytes per micro-batch (``adapted_experts_s``): the
# forward reads W and writes W + s x BA (2); the backward writes the adapted weight's gradient, zeroed
# then accumulated, and baddbmm's backward reads it twice, for lora_A's and lora_B's gradients (4).
ADAPTED_EXPERT_STEP_PASSES = 6.0
ADAPTED_EXPERT_FORWARD_PASSES = 2.0


def adapted_experts_s(job: Job, layout: Layout, base: StepBase, passes: float) -> float:
    """peft's ParamWrapper on fused experts (``model_states.peft_adapts_fused_experts``): each MoE
    layer's forward materialises its adapted expert weights and the backward their whole gradient,
    memory-bound passes over the stage's adapted expert parameters, every micro-batch (0 elsewhere)."""
    model, training = job.model, job.training
    if training.method is Method.FULL or not peft_adapts_fused_experts(model, layout):
        return 0.0
    adapted, _ = fused_expert_adapted_weights(model, training)
    moe_layers = rank_parameters_of(job, layout, base.stage).moe_layers
    weight_bytes = moe_layers * adapted * frozen_dtype_bytes(training) / layout.tp
    return base.micro_batches * passes * weight_bytes / job.cluster.gpu.hbm_bandwidth_bytes_per_s


def adapted_experts_weight_gradient_flops(job: Job, layout: Layout, base: StepBase) -> float:
    """The weight-gradient half of the adapted fused experts' backward, per token of the stage: their
    adapted weight requires grad (through the adapter), so the expert matmuls compute it as full
    training does (``flops.frozen_passes`` counts the frozen base's two passes; 0 elsewhere)."""
    return base.routed_flops * adapted_expert_share(job, layout)


def adapted_expert_share(job: Job, layout: Layout) -> float:
    """The share of the routed experts' FLOPs whose weights peft's fused-expert adapters make require
    grad (gate_up_proj's 2 of 3 matrices, down_proj's 1; ``peft_adapts_fused_experts``); 0 elsewhere."""
    model, training = job.model, job.training
    if training.method is Method.FULL or not peft_adapts_fused_experts(model, layout):
        return 0.0
    assert model.moe is not None
    adapted, _ = fused_expert_adapted_weights(model, training)
    return adapted / (3.0 * model.moe.num_experts * model.hidden_size * model.moe.expert_ffn_hidden_size)


def adapted_experts_hardware_flops_per_token(job: Job, layout: Layout) -> float:
    """``adapted_experts_weight_gradient_flops`` over the whole model, per token: work the step runs
    that the HFU numerator (``flops.hardware_flops_per_step``) must hold as well (review: HFU was
    ~13% short on Qwen3-30B-A3B LoRA, loosening the HFU <= 1 cap on calibration)."""
    moe_layers = moe_layers_of(kind_counts(job, 0, job.model.num_layers))
    return moe_layers * routed_expert_flops(job.model) * adapted_expert_share(job, layout)


def recompute_passes(tuning: Tuning, recompute: Recompute) -> float:
    """Forward-equivalents of memory-bound work a recompute costs over the bytes it writes again."""
    # Full recompute re-runs each layer's forward once, and so does per-op AC for every op but the
    # matmuls and attention it saved (norms, activations, residuals). Selective re-runs attention's
    # core, whose s x s chain moves a multiple of the bytes it finally stores (tuning.toml).
    if recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):
        return 1.0
    return tuning.selective_recompute_passes if recompute is Recompute.SELECTIVE else 0.0


def recompute_traffic_bytes(job: Job, layout: Layout, base: StepBase) -> float:
    """``layer_traffic_bytes`` per token of the slowest stage that the recomputed forward writes again."""
    recompute = layout.recompute
    if recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):
        return base.traffic_bytes
    if RecomputeModule.CORE_ATTN in layout.selective_modules:
        return eager_chain_bytes(job, layout, base)
    return 0.0


def eager_chain_bytes(job: Job, layout: Layout, base: StepBase) -> float:
    """The s x s softmax chain eager attention stores, per token of the slowest stage: 5 a s bytes
    (16-bit; 2 a s without attention dropout), split over tp; 0 under a flash kernel."""
    training = job.training
    if training.attention is not Attention.EAGER:
        return 0.0
    heads = job.model.num_attention_heads / layout.tp
    probabilities = 5 if job.model.attention_dropout > 0 else 2
    return base.layers * probabilities * heads * training.seq_len * element_bytes(training.precision) / 2


def selective_modules_stored_bytes(job: Job, layout: Layout, base: StepBase) -> float:
    """Activation bytes per token of the slowest stage that Megatron's selective modules other than
    core_attn free, and their recomputed forward writes again once."""
    modules = layout.selective_modules - {RecomputeModule.CORE_ATTN}
    if not modules:
        return 0.0
    model, training = job.model, job.training
    freed = 0.0
    for kind, count in base.counts:
        kept = activations.megatron_layer_bytes(model, layout, training, kind.moe, frozenset())
        freed += count * (kept - activations.megatron_layer_bytes(model, layout, training, kind.moe, modules))
    return freed / base.tokens


@job_memo
def kind_recompute_flops(
    job: Job, kind: LayerKind, recompute: Recompute, modules: frozenset[RecomputeModule], fused: bool
) -> int:
    """``flops.layer_recompute_flops`` of a layer of ``kind``; ``fused``: ``model_states.fused_experts``."""
    return flops.layer_recompute_flops(job.model, kind, job.training, recompute, modules, fused_experts=fused)


@layout_memo(*PIPELINE_FIELDS, "recompute_num_layers", "recompute_every_n_layers")
def recomputed_share(job: Job, layout: Layout, stage: int) -> float:
    """The share of pipeline rank ``stage``'s layers that recompute (``recompute_num_layers``,
    ``recompute_every_n_layers``)."""
    return rank_recomputed_fractions(job.model.num_layers, layout, job.training.mtp_num_layers)[stage]


def recompute_s(job: Job, layout: Layout, base: StepBase) -> float:
    """The recomputed forward: every layer (full), its unsaved ops (per-op AC) or attention's core
    (selective), on the share of the layers that recompute."""
    recompute = layout.recompute
    if recompute is Recompute.NONE:
        return 0.0
    modules = layout.selective_modules
    fused = fused_experts(job.model, layout)
    per_token = sum_by_kind(
        base.counts, lambda kind: kind_recompute_flops(job, kind, recompute, modules, fused)
    )
    redone = 1.0 if layout.recomputes_core else 0.0
    core = redone * base.core_flops
    passes = recompute_passes(job.tuning, recompute)
    memory_s = memory_bound_s(job, layout, base, passes, recompute_traffic_bytes(job, layout, base))
    memory_s += memory_bound_s(job, layout, base, 1.0, selective_modules_stored_bytes(job, layout, base))
    if recompute is Recompute.FULL:
        # the whole forward again runs attention's core too: its s x s chain moves the multiple of what
        # it stores that selective recompute costs it, beyond the one pass the layer's bytes count
        # (properties review: selective was timed slower than full under eager attention)
        extra = job.tuning.selective_recompute_passes - 1.0
        memory_s += memory_bound_s(job, layout, base, extra, eager_chain_bytes(job, layout, base))
    if recompute is Recompute.FULL:
        memory_s += dequantize_s(job, layout, base, 1)  # the recomputed forward dequantises again
        # ... and folds the experts' adapters into their weights again
        memory_s += adapted_experts_s(job, layout, base, ADAPTED_EXPERT_FORWARD_PASSES)
    # the recomputed forward's experts (full, per-op AC, which always recomputes torchtitan's grouped
    # matmuls, or Megatron's moe module), at the experts' rate
    redoes_experts = recompute in (Recompute.FULL, Recompute.SELECTIVE_OP) or RecomputeModule.MOE in modules
    routed = base.routed_flops if redoes_experts else 0
    work_s = gemm_s(layout, base, per_token - core - routed, redone * base.core_work_flops, 0.0, routed)
    work_s += unaligned_core_s(job, layout, base, redone)
    share = recomputed_share(job, layout, base.stage)
    relaunched = share if recompute is Recompute.FULL else 0.0  # the others re-run a few of the kernels
    # a fully recomputed forward issues the forward's ops again, and waits on the host as it does
    work_s += host_wait(job, layout, base).forward_s if recompute is Recompute.FULL else 0.0
    synced_s = moe_host_sync_s(job, layout, base, share) if redispatches(layout) else 0.0
    return max(share * (work_s + memory_s), launch_floor_s(job, layout, base, relaunched)) + synced_s


def recomputed_collectives(job: Job, layout: Layout, stage: int) -> tuple[float, float, float]:
    """TP collectives a recompute runs again in (attention, a dense MLP, an MoE block), per layer:
    full recompute re-runs the forward's one each; per-op AC saves the reduce-scatters but not the
    all-gathers before attention and the MLP. Megatron's selective mlp and moe modules re-run their
    MLP's forward collectives; core_attn, mla_up_proj and the elementwise ones none."""
    share = recomputed_share(job, layout, stage)
    if layout.recompute in (Recompute.FULL, Recompute.SELECTIVE_OP):
        return share, share, share
    modules = layout.selective_modules
    dense = share if RecomputeModule.MLP in modules else 0.0
    return 0.0, dense, share if RecomputeModule.MOE in modules else 0.0


# ---------------------------------------------------------------- model-parallel communication


def tp_comm_s(job: Job, layout: Layout, base: StepBase, window_s: float) -> float:
    """Megatron TP: 2 all-reduces forward + 2 backward per layer (+2 when recomputed), half of them
    attention's and half the MLP's; an MoE layer's MLP half as ``moe_mlp_tp_factor`` says. Overlapped
    (``tp_comm_overlap``), at most the tuning's fraction is hidden, and no more than the ``window_s``
    of GEMMs it runs under (a PCIe card's TP traffic can outlast its compute)."""
    # SP swaps each all-reduce for a reduce-scatter + all-gather of the same total time
    # (Korthikanti §4.2.2); Narayanan §3.3: volume 8 b s h (t-1)/t per layer.
    if layout.tp == 1:
        return 0.0
    # each half: forward, backward, recompute
    attention, dense, moe = recomputed_collectives(job, layout, base.stage)
    moe_layers = moe_layers_of(base.counts)
    moe_halves = moe_layers * moe_mlp_tp_factor(job, layout)
    collectives = (2 + attention) * base.layers + (2 + dense) * (base.layers - moe_layers)
    collectives += (2 + moe) * moe_halves
    total = base.micro_batches * collectives * base.tp_all_reduce_s
    if not layout.tp_comm_overlap:
        return total
    return exposed_s(total, window_s, job.tuning.tp_overlap_hidden_fraction)


def moe_mlp_tp_factor(job: Job, layout: Layout) -> float:
    """An MoE layer's MLP-side TP collectives in units of a dense layer's. Megatron's alltoall token
    dispatcher all-gathers the routed tokens over the expert-tensor-parallel group after the
    all-to-all and reduce-scatters them before the combine (core/transformer/moe/token_dispatcher.py:
    "num_global_tokens = num_local_tokens x TP x EP"): top_k copies of each token, top_k times the
    dense volume; none with etp 1, whose experts are whole. Shared experts are a dense MLP's own
    (moe/shared_experts.py SharedExpertMLP: its sequence-parallel all-gather and reduce-scatter), etp
    or not (MoE review: DeepSeek-V3 at etp 1 counted attention's alone). Timed on the tp link (an etp
    between 1 and tp is rare). Other frameworks gather the tokens before routing, as a dense MLP does."""
    moe = job.model.moe
    if moe is None or layout.framework is not Framework.MEGATRON:
        return 1.0
    shared = 1.0 if moe.num_shared_experts else 0.0
    return shared + (0.0 if layout.expert_tp == 1 else float(moe.top_k))


def cp_comm_s(job: Job, layout: Layout, base: StepBase) -> float:
    """Context parallelism's cost beyond attention's kernels, by what the framework runs: DeepSpeed-
    Ulysses' all-to-alls over the heads (its capability ``ulysses_context_parallel``), PyTorch's ring
    (``torch.distributed.tensor.experimental.context_parallel``, what torchtitan and FSDP jobs use;
    with its fp32 merges, memory-bound work booked here) or the peer-to-peer ring of Megatron's
    Transformer Engine."""
    if layout.cp == 1 or base.layers == 0:
        return 0.0
    if FRAMEWORK_CAPABILITIES[layout.framework].ulysses_context_parallel:
        return ulysses_comm_s(job, layout, base)
    if runs_torch_ring(layout):
        return torch_ring_comm_s(job, layout, base) + torch_ring_merge_s(job, layout, base)
    return p2p_ring_comm_s(job, layout, base)


def runs_torch_ring(layout: Layout) -> bool:
    """Whether the layout's context parallelism is PyTorch's ring (FSDP / torchtitan jobs)."""
    return layout.cp > 1 and layout.framework is Framework.FSDP


def ulysses_comm_s(job: Job, layout: Layout, base: StepBase) -> float:
    """DeepSpeed-Ulysses (deepspeed/sequence/layer.py ``DistributedAttention``; ALST's
    UlyssesSPAttentionHF in runtime/sequence_parallel/ulysses_sp.py, which Accelerate runs): q, k
    and v go from sequence-split to head-split by one all-to-all each before attention, and its
    output back by a fourth; the backward reverses the four for their gradients and a recomputed
    forward repeats them. They sit between the projections and the attention kernel, on the critical path."""
    model = job.model
    kv_width = model.kv_size
    if model.mla is None and layout.cp > model.num_kv_heads:
        # fewer KV heads than ranks: each is replicated to one per rank before the all-to-all
        # (ulysses_sp.py kv_replication_factor = world // kv_head_count), so cp heads travel
        kv_width = model.kv_size * layout.cp // model.num_kv_heads
    v_width = model.v_size if model.mla is not None else kv_width
    e = element_bytes(job.training.precision)
    link = base.links.cp
    one_pass = sum(
        comm.group_all_to_all_s(base.tokens * width / layout.tp * e, link)
        for width in (model.q_size, kv_width, v_width, model.v_size)
    )
    # forward and backward, and a whole layer's recomputed forward (a selective recompute redoes the
    # local attention inside DistributedAttention, not its all-to-alls)
    redone = recomputed_share(job, layout, base.stage) if layout.recompute is Recompute.FULL else 0.0
    passes = 2 + redone
    return base.micro_batches * base.layers * passes * one_pass


def p2p_ring_comm_s(job: Job, layout: Layout, base: StepBase) -> float:
    """Ring attention: K and V chunks go round the CP ring, hidden under attention's core compute."""
    # forward: (cp-1) sends of K and V; backward: K, V and dK, dV -> 2x the forward traffic; a
    # recomputed core (full recompute, or selective with core_attn) runs Transformer Engine's
    # AttnFuncWithCPAndKVP2P.forward again, its ring with it, under its own kernels
    model, training = job.model, job.training
    kv_width = max(model.kv_size / layout.tp, model.head_dim)
    chunk_bytes = 2 * base.tokens * kv_width * element_bytes(training.precision)
    link = base.links.cp
    forwards = 1.0 + (recomputed_share(job, layout, base.stage) if layout.recomputes_core else 0.0)
    sends = (forwards + 2) * (layout.cp - 1)
    ring_s = sends * comm.p2p_s(chunk_bytes, link.send_bandwidth_bytes_per_s, link.latency_s)
    core_flops = layer_core_work_flops(layout, base)
    per_layer = max(0.0, ring_s - core_s_per_token(base, forwards * core_flops, 2 * core_flops))
    return base.micro_batches * base.layers * per_layer


def layer_core_work_flops(layout: Layout, base: StepBase) -> float:
    """Attention's core forward work of one layer and micro-batch on one rank, on average."""
    return base.core_work_flops / base.layers * base.tokens / layout.tp


# PyTorch's ring accumulates in fp32 (torch/distributed/tensor/experimental/_attention.py,
# _ContextParallelOptions.convert_to_f32 = True): the running output and the gradients of q, k and v
# (FP32_BYTES each).


def torch_ring_kv_bytes(job: Job, layout: Layout, base: StepBase) -> float:
    """The K and V one rank holds for one layer and micro-batch, as PyTorch's ring moves them: at the
    KV heads' own width (``activations.ring_kv_width``)."""
    width = ring_kv_width(job.model, job.tuning.ring_attention_repeats_kv)
    return base.tokens * width / layout.tp * element_bytes(job.training.precision)


def torch_ring_comm_s(job: Job, layout: Layout, base: StepBase) -> float:
    """PyTorch's ring (torch/distributed/tensor/experimental/_attention.py ``_templated_ring_attention``
    and its backward; read at pytorch/pytorch@0123248a and on the older side of ROCm/pytorch@10b22ea's
    merge, the same loop in both, which the Dec-2024 torch 1963fc8 of torchtitan's benchmarks lies
    between) with the rotate method torchtitan set by default then, 'allgather' (torchtitan
    config_manager.py@9dec370 ``context_parallel_rotate_method``): what of its traffic no kernel
    hides, per layer and micro-batch.

    Each forward (and the recomputed one, when attention's core is recomputed) all-gathers the whole
    sequence's K and V once and waits for it before its second block; only the first block's kernel
    runs meanwhile (pytorch/pytorch#132820: 'overlap the communication with the first sharded kv
    computation'). The backward all-gathers K and V again the same way, and sends each step's running
    dK and dV, fp32, to the next rank (an all-to-all ``permute_tensor``): a send overlaps the next
    step's kernel, and the last one is awaited after the loop with nothing left to overlap. With load
    balancing (``enable_load_balance``, the default) every step's kernel does 1/cp of the layer's core."""
    ring = torch_ring_traffic(job, layout, base)
    forward_s = ring.gather_s - ring.forward_hidden_s
    backward_s = ring.gather_s + layout.cp * ring.dkv_send_s - ring.backward_hidden_s
    return base.micro_batches * base.layers * (ring.forwards * forward_s + backward_s)


@dataclass(frozen=True, slots=True)
class RingTraffic:
    """PyTorch's ring per layer and micro-batch: its K/V all-gather and dK/dV sends, and the attention
    kernels' time under which they run (``torch_ring_comm_s``), which the ZeRO-3 / FSDP collectives
    cannot use again (``dp_comm.kind_windows_s``)."""

    gather_s: float  # the whole sequence's K and V, each forward and the backward
    dkv_send_s: float  # one step's fp32 dK and dV to the next rank
    forward_hidden_s: float  # of one forward's gather, under its first block
    backward_hidden_s: float  # of the backward's gather and its cp - 1 first sends, under its steps
    forwards: float  # forwards per layer: 1, plus the recomputed share where the core is redone


def torch_ring_traffic(job: Job, layout: Layout, base: StepBase) -> RingTraffic:
    """``RingTraffic`` of ``layout`` (cp > 1, PyTorch's ring)."""
    kv_bytes = torch_ring_kv_bytes(job, layout, base)
    link = base.links.cp
    gather_s = comm.group_all_gather_s(layout.cp * kv_bytes, link)
    dkv_bytes = kv_bytes * FP32_BYTES / element_bytes(job.training.precision)
    dkv_s = comm.p2p_s(dkv_bytes, link.send_bandwidth_bytes_per_s, link.latency_s)
    step_flops = layer_core_work_flops(layout, base) / layout.cp
    forward_step_s = core_s_per_token(base, step_flops, 0.0)
    backward_step_s = core_s_per_token(base, 0.0, 2 * step_flops)
    # a send overlaps the next step's kernel; the last one is awaited bare
    backward_hidden_s = min(gather_s, backward_step_s) + (layout.cp - 1) * min(dkv_s, backward_step_s)
    return RingTraffic(
        gather_s=gather_s,
        dkv_send_s=dkv_s,
        forward_hidden_s=min(gather_s, forward_step_s),
        backward_hidden_s=backward_hidden_s,
        forwards=1.0 + (recomputed_share(job, layout, base.stage) if layout.recomputes_core else 0.0),
    )


def torch_ring_merge_s(job: Job, layout: Layout, base: StepBase) -> float:
    """PyTorch's ring merges each of its cp steps into fp32 accumulators, memory-bound passes a single
    attention kernel does not make: the forward folds each block's 16-bit output into the running fp32
    output (``_SDPAMerger``: read it, read the block, write it back), the backward adds each step's
    16-bit dq, dk and dv into fp32 dq, dk, dv the same way (dk and dv as wide as the K and V it
    moves, ``activations.ring_kv_width``). Counted as one read and one write of each
    accumulator and one read of each block per step (what a fused kernel would move; the eager ops
    move more), per layer and micro-batch."""
    model, element = job.model, element_bytes(job.training.precision)
    per_element = 2 * FP32_BYTES + element  # read and write the fp32 accumulator, read the block
    rows = base.tokens / layout.tp
    forward_bytes = layout.cp * per_element * rows * model.v_size  # the output
    # dq at the query width, dk and dv at the width the ring moves K and V (the KV heads' own under
    # enable_gqa: torch's accumulators are zeros_like(key / value); long-context review)
    kv_width = ring_kv_width(model, job.tuning.ring_attention_repeats_kv)
    backward_bytes = layout.cp * per_element * rows * (model.q_size + kv_width)
    forwards = 1.0 + (recomputed_share(job, layout, base.stage) if layout.recomputes_core else 0.0)
    moved = base.micro_batches * base.layers * (forwards * forward_bytes + backward_bytes)
    return moved / job.cluster.gpu.hbm_bandwidth_bytes_per_s


def distinct_groups_reached(num_experts: int, top_k: int, groups: int) -> float:
    """Expected distinct groups (nodes, or ranks) holding one token's top_k experts, when the E experts
    are split evenly over ``groups`` and the token's k distinct experts are drawn uniformly: each
    group, E/g of the experts, is missed by all k draws with probability C(E - E/g, k) / C(E, k)
    (hypergeometric: k of E without replacement), so by linearity the token reaches
    g (1 - C(E - E/g, k) / C(E, k)) groups. Uniform routing is what the force-balanced runs and
    DeepEP's and HybridEP's benchmarks route; learned routing that favours a node reaches fewer."""
    if groups <= 1:
        return float(groups)
    others = num_experts - num_experts / groups  # the experts outside one group
    missed = 1.0  # C(E - E/g, k) / C(E, k) = prod_{i<k} (E - E/g - i) / (E - i)
    for i in range(top_k):
        missed *= max(0.0, others - i) / (num_experts - i)
    return groups * (1.0 - missed)


def flex_dispatch_s(job: Job, layout: Layout, tokens: float) -> float:
    """One dispatch (or combine) of Megatron's flex dispatcher with the HybridEP backend, ``tokens``
    per rank (DeepSeek-V3 report §3.2.2; deepseek-ai/DeepEP hybrid-ep branch): a token crosses the
    network once per destination node other than its own, to the GPU of its local index there, which
    forwards it over NVLink to the GPUs holding its experts, one copy per GPU whatever the number of
    its experts there; the two legs overlap, so the slower one times it. NVLink: a rank receives
    ``distinct_groups_reached`` over the ep ranks of every rank's tokens, h values each; network:
    it sends each token to the distinct nodes its experts are on, (n-1)/n of them remote under
    uniform routing. Each leg at HybridEP's published achieved fraction of the nominal bandwidth
    (tuning.toml [moe_dispatch], counted in the same bytes); the busiest rank takes
    ``expert_load_factor`` x the mean. No per-peer latency: one kernel, pipelined in chunks."""
    moe, cluster, tuning = job.model.moe, job.cluster, job.tuning
    if moe is None:
        return 0.0
    link = expert_link(job, layout)
    token_bytes = (
        job.model.hidden_size * element_bytes(job.training.precision) * expert_load_factor(job, layout)
    )
    ranks = distinct_groups_reached(moe.num_experts, moe.top_k, link.group_size)
    received_bytes = tokens * ranks * token_bytes
    intra_s = received_bytes / (cluster.intra_node_bandwidth_bytes_per_s * tuning.flex_intra_node_efficiency)
    if not link.spans_nodes:
        return intra_s
    nodes = link.nodes
    reached = distinct_groups_reached(moe.num_experts, moe.top_k, nodes)
    sent_bytes = tokens * reached * (nodes - 1) / nodes * token_bytes
    nic_bytes_per_s = cluster.inter_node_bandwidth_bytes_per_s * flex_inter_node_efficiency(tuning, nodes)
    return max(intra_s, sent_bytes / nic_bytes_per_s)


def ep_comm_s(job: Job, layout: Layout, base: StepBase) -> float:
    """Expert parallelism: dispatch + combine all-to-all, forward and backward, per MoE layer."""
    moe = job.model.moe
    if moe is None or layout.ep == 1:
        return 0.0
    moe_layers = moe_layers_of(base.counts)
    # each routed copy of a token (top_k of them) carries h values; SP splits tokens over tp; the
    # busiest rank receives expert_load_factor x the mean (padded: capacity x E rows are sent)
    tokens = base.tokens / (layout.tp if layout.sequence_parallel else 1)
    collectives = 4 + (2.0 * recomputed_share(job, layout, base.stage) if redispatches(layout) else 0.0)
    if layout.moe_dispatcher is MoeDispatcher.FLEX:
        one = flex_dispatch_s(job, layout, tokens)
    else:
        size_bytes = tokens * moe.top_k * job.model.hidden_size * element_bytes(job.training.precision)
        size_bytes *= expert_load_factor(job, layout)
        one = comm.group_all_to_all_s(size_bytes, expert_link(job, layout))
    if not layout.moe_a2a_overlap:
        return base.micro_batches * moe_layers * collectives * one
    # Combined 1F1B (Megatron-Core pipeline_parallel/combined_1f1b.py): a layer's forward dispatch and
    # combine run under the backward compute of the micro-batch scheduled beside it, its backward ones
    # under that one's forward, in every pair of the steady state; the warm-up forwards and cool-down
    # backwards have no partner. The windows are an average layer's share of the stage's compute.
    forward_s = base.compute_s / (3 * base.micro_batches * max(1, base.layers))
    paired = paired_fraction(layout, base.stage, base.micro_batches)
    exposed = max(0.0, 2 * one - 2 * forward_s) + max(0.0, 2 * one - forward_s)
    return base.micro_batches * moe_layers * (paired * exposed + (1 - paired) * collectives * one)


def paired_fraction(layout: Layout, rank: int, micro_batches: int) -> float:
    """The share of a rank's forward (and backward) passes the combined 1F1B schedule pairs with a
    pass of another micro-batch: all but the first forward and last backward without a pipeline; with
    the interleaved one, all but the warm-up chunks (schedules.py: its warm-up plus one)."""
    p, v = layout.pp, layout.virtual_pipeline_stages
    passes = micro_batches * v
    if p == 1:
        return (micro_batches - 1) / micro_batches
    warmup = min((v - 1) * p + 2 * (p - 1 - rank) + 1, passes)
    return (passes - warmup) / passes


def bubble_fraction(layout: Layout, micro_batches: int) -> float:
    """The pipeline bubble as a fraction of the ideal step: (p-1)/(v m) (1F1B v=1, interleaved v
    chunks; Narayanan arXiv:2104.04473 §2.2.2)."""
    return (layout.pp - 1) / (layout.virtual_pipeline_stages * micro_batches)


def pp_comm_s(job: Job, layout: Layout, base: StepBase) -> float:
    """Point-to-point activations forward and gradients backward, v x per micro-batch."""
    if layout.pp == 1:
        return 0.0
    # b s h bytes, over tp where the boundary tensor is split: Megatron-Core sends the sequence-parallel
    # shard under SP only (schedules.py get_tensor_shapes: seq_length // tp if sequence_parallel), as
    # torch.distributed.pipelining sends the stage's output as it is; DeepSpeed's pipe engine
    # partitions it over the model-parallel group whenever there is one (runtime/pipe/engine.py
    # is_pipe_partitioned = is_model_parallel; the receiver all-gathers it inside its node)
    split = layout.tp if layout.sequence_parallel or layout.framework is Framework.DEEPSPEED else 1
    size_bytes = base.tokens * job.model.hidden_size * element_bytes(job.training.precision) / split
    link = base.links.pp
    across = comm.p2p_s(size_bytes, link.send_bandwidth_bytes_per_s, link.latency_s)
    # a stage sends its activations forward and its gradients back each micro-batch (and chunk). With
    # several stages to a node (ranks ordered tp, cp, dp, pp) only the node's edge stages send across
    # it, one of their two sends: the busiest stage pays one send over the network and one inside
    # its node (a network review: 2 nodes of tp 4 x pp 2 were charged every send at network speed)
    inside = across
    if link.spans_nodes and link.ranks_per_node > 1:
        inside = comm.p2p_s(size_bytes, link.send_intra_bytes_per_s, link.intra_latency_s)
    sends_s = layout.virtual_pipeline_stages * base.micro_batches * (across + inside)
    return sends_s + tied_embedding_reduce_s(job, layout)


def tied_embedding_reduce_s(job: Job, layout: Layout) -> float:
    """The tied embedding's gradient all-reduced between the first and the last stage once per step,
    on the critical path, where pp > 1: DeepSpeed's pipeline engine before the DP reduction
    (runtime/pipe/engine.py ``_exec_reduce_tied_grads``: ``dist.all_reduce`` of ``weight.grad``, or of
    the bf16 optimizer's ``_hp_grad`` in its grad_acc_dtype: bf16 since PR #7515, fp32 before); Megatron
    after it (core/distributed/finalize_model_grads.py
    ``_allreduce_word_embedding_grads``, of the main_grad in the grad buffer's dtype: gemma-2b on
    dp 8 pp 2 over two nodes adds ~25 ms that were not charged; pipeline review). FSDP's
    torch.distributed.pipelining has no tied weights across stages. Megatron does it for an untied
    model too where multi-token prediction runs (``mtp_num_layers``: the last stage embeds the shifted
    tokens with its copy of the word embedding; the same function's ``or config.mtp_num_layers``).
    The weight is the vocabulary-parallel embedding, V h / t."""
    model, precision = job.model, job.training.precision
    megatron_mtp = layout.framework is Framework.MEGATRON and job.training.mtp_num_layers > 0
    if layout.pp == 1 or not (model.tied_embeddings or megatron_mtp):
        return 0.0
    if layout.framework is Framework.DEEPSPEED:
        # the 16-bit weight.grad, or BF16_Optimizer's _hp_grad in its grad_acc_dtype: bf16 where
        # ds_config sets none (model_states.BF16_OPTIMIZER_GRAD_BYTES; fp32 before DeepSpeed PR #7515)
        grad_bytes = element_bytes(precision)
    elif layout.framework is Framework.MEGATRON:
        grad_bytes = grad_reduce_bytes(precision, layout)
    else:
        return 0.0
    size_bytes = model.vocab_size * model.hidden_size / layout.tp * grad_bytes
    # the pair holds the same (tp, cp, dp) coordinates on stage 0 and stage pp-1
    link = tuned_link(job, 2, (layout.pp - 1) * layout.tp * layout.cp * layout.dp)
    return comm.group_all_reduce_s(size_bytes, link)


# + recompute and TP overlap: what a stage's compute, recompute and model-parallel communication read
STAGE_TIME_FIELDS = (
    *BASE_FIELDS,
    "recompute",
    "recompute_num_layers",
    "recompute_every_n_layers",
    "recompute_modules",
    "tp_comm_overlap",
    "moe_a2a_overlap",
)
# + interleaving (the bubble and the pipeline sends)
PARTS_FIELDS = (
    *STAGE_TIME_FIELDS,
    "virtual_pipeline_stages",
    "grad_reduce_in_fp32",  # Megatron's tied-embedding all-reduce, in the grad buffer's dtype
)


@dataclass(slots=True, kw_only=True)  # built on every memo miss: not frozen (frozen __init__ is ~4x)
class StepParts:
    """The parts of a step that no sharding changes (``floor_s`` sums all but the bubble), and what
    the sharding-dependent parts read."""

    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    pp_bubble_s: float
    pp_comm_s: float
    micro_batches: int
    parameters: float  # gpu_parameters


def stage_ideal_s(job: Job, layout: Layout, base: StepBase) -> tuple[float, float, float, float, float]:
    """(compute, recompute, tp, cp, ep) seconds of all micro-batches on ``base``'s stage: what the
    bubble scales, and what the slowest stage is chosen by."""
    compute, recompute = base.compute_s, recompute_s(job, layout, base)
    tp = tp_comm_s(job, layout, base, compute + recompute)
    return compute, recompute, tp, cp_comm_s(job, layout, base), ep_comm_s(job, layout, base)


@layout_memo(*STAGE_TIME_FIELDS)
def slowest_stage(job: Job, layout: Layout) -> int:
    """Of ``slowest_stage_candidates``, the pipeline rank whose compute, recompute and model-parallel
    communication take longest (the first of equals): a stage of four layers recomputing them all
    outlasts one of two and the output layer that computes a little longer (Qwen2.5-7B on DeepSpeed
    pp 8 was timed 11% fast on the latter; review of stop 48)."""
    candidates = slowest_stage_candidates(job, layout)
    if len(candidates) == 1:
        return candidates[0]
    times = [sum(stage_ideal_s(job, layout, stage_step_base(job, layout, stage))) for stage in candidates]
    return candidates[times.index(max(times))]


@layout_memo(*PARTS_FIELDS)
def step_parts(job: Job, layout: Layout) -> StepParts:
    base = step_base(job, layout)
    compute, recompute, tp, cp, ep = stage_ideal_s(job, layout, base)
    ideal = compute + recompute + tp + cp + ep  # what the bubble scales
    return StepParts(
        compute_s=compute,
        recompute_s=recompute,
        tp_comm_s=tp,
        cp_comm_s=cp,
        ep_comm_s=ep,
        pp_bubble_s=bubble_fraction(layout, base.micro_batches) * ideal,
        pp_comm_s=pp_comm_s(job, layout, base),
        micro_batches=base.micro_batches,
        parameters=base.parameters,
    )


# ---------------------------------------------------------------- offload and the optimizer step

# Enum members read once per layout below, bound once: reading one off its class costs ~0.1 us.
_NO_OFFLOAD, _FULL_TRAINING = Offload.NONE, Method.FULL


def sharded_parameters(job: Job, layout: Layout, parts: StepParts) -> float:
    """Parameters whose optimizer state this GPU owns: all of them, or under ZeRO >= 1 its shard of
    them as the model states hold it (``model_states.shard_degrees``: the dense ones over dp x cp, or
    one HSDP replica of them; the routed experts over expert-DP), as under DeepSpeed's BF16_Optimizer
    at ZeRO-0 (``model_states.deepspeed_bf16_optimizer``)."""
    if layout.zero_stage == 0 and not deepspeed_bf16_optimizer(layout, job.training.precision):
        return parts.parameters
    if job.model.moe is None:  # no routed experts: every stage shards over the one dense group
        return parts.parameters / shard_degrees(layout, job.cluster)[0]
    return zero_gpu_parameters(job, layout)


@layout_memo(*PIPELINE_FIELDS, *SHARD_GROUP_FIELDS)
def zero_gpu_parameters(job: Job, layout: Layout) -> float:
    """``gpu_parameters`` after ZeRO's sharding: the most any stage's GPU owns."""
    dense_shard, expert_shard = shard_degrees(layout, job.cluster)
    return max(
        dense / dense_shard + experts / expert_shard
        for dense, experts in stage_gpu_parameter_groups(job, layout)
    )


def offload_s(job: Job, layout: Layout, parts: StepParts) -> float:
    """PCIe and NVMe traffic of optimizer, parameter and activation offload."""
    if (
        layout.offload_optimizer is _NO_OFFLOAD
        and layout.offload_params is _NO_OFFLOAD
        and not layout.activation_offload
    ):
        return 0.0
    cluster, tuning = job.cluster, job.tuning
    pcie = cluster.gpu.pcie_bandwidth_bytes_per_s
    shard = sharded_parameters(job, layout, parts)
    element = element_bytes(job.training.precision)  # 16-bit, or fp32 training's 4 bytes
    nvme = tuning.nvme_bandwidth_bytes_per_s_per_node / cluster.gpus_per_node  # each GPU's share
    seconds = 0.0
    if layout.offload_optimizer is not _NO_OFFLOAD:
        # gradients down, updated parameters up: exposed
        seconds += shard * offload_gradient_pcie_bytes(layout, element, parts.micro_batches) / pcie
    if layout.offload_optimizer is Offload.NVME:
        # the step reads and writes the optimizer states it keeps on NVMe (fp32 master and moments), and
        # the fp32 gradients ZeRO-Infinity swaps out at the boundary and in for the step (stage3.py
        # _swap_out_offload_fp32_gradients)
        states = state_bytes_of(job, layout.framework)
        seconds += shard * 2 * (states.master + states.moments + FP32_BYTES) / nvme
    if layout.offload_params is Offload.NVME:
        seconds += shard * element / nvme  # the updated parameters written back after the step
    if layout.offload_params is not _NO_OFFLOAD:
        # ZeRO-Infinity fetches this GPU's shard for forward and backward, prefetched: from the host over
        # PCIe, and from NVMe through the host's pinned buffers first (partitioned_param_swapper.py),
        # the two streamed, so the slower link bounds it (NVMe was timed as the host's: an offload review)
        fetched = parts.micro_batches * 2 * element * shard
        link = min(pcie, nvme) if layout.offload_params is Offload.NVME else pcie
        seconds += exposed_s(fetched / link, parts.compute_s, tuning.zero3_prefetch_hidden_fraction)
    if layout.activation_offload:
        # every micro-batch's offloaded activations go to the host in forward and come back in backward
        copy_s = parts.micro_batches * 2 * offloaded_activation_bytes(job, layout) / pcie
        window = parts.compute_s + parts.recompute_s
        seconds += exposed_s(copy_s, window, tuning.activation_offload_hidden_fraction)
    return seconds


def steps_torch_unfused_on_host(job: Job, layout: Layout) -> bool:
    """Whether the offloaded optimizer is torch.optim's foreach or for-loop step on the host: FSDP's,
    where the training names an implementation other than fused (``OptimizerImplementation``)."""
    return (
        layout.framework is Framework.FSDP
        and job.training.optimizer_implementation is not OptimizerImplementation.FUSED
    )


def offload_gradient_pcie_bytes(layout: Layout, element: int, micro_batches: int) -> float:
    """Bytes per owned parameter a step moves over PCIe between the GPU and the host optimizer: the
    gradients down and the updated 16-bit parameters up. DeepSpeed (edaa7221) accumulates a step's
    micro-batches through the host:

    * ZeRO-3 (stage3.py ``partition_grads``): each micro-batch's reduced partition goes to the host
      flat buffer, which comes back to the GPU (the first micro-batch's copy, ``grad_buffer.to(device)``;
      the later ones', to add to it) and the sum goes down again; at the boundary an fp32 copy goes to
      the host for the CPU optimizer (``_offload_grad_partition_at_boundary``): 2 x element x m + 4.
    * ZeRO-1/2 (stage_1_and_2.py): at the boundary the partition goes down cast to fp32 on the GPU
      first (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``: ``src_tensor.to(master dtype)``);
      with accumulation each partition goes to the host's accumulation buffer
      (``async_accumulate_grad_in_cpu_via_gpu``, wherever ``micro_step_id > 0`` or the step is not at
      its boundary), which comes up to be added to and goes down again from the second micro-batch
      on (``micro_step_id > 0``): every micro-batch under ZeRO-2, which reduces each (e (2m - 1)),
      and at the boundary alone under ZeRO-1, which reduces there (2e).

    It counted one gradient each way per step: 0.2 s where a 16-micro-batch ZeRO-3 step moves 1.8 s
    (an offload review). Megatron and FSDP: one gradient down, one parameter up."""
    if layout.framework is not Framework.DEEPSPEED:
        return 2.0 * element
    if layout.zero_stage >= 3:
        return 2.0 * element * micro_batches + FP32_BYTES + element
    if micro_batches == 1:
        return FP32_BYTES + element
    # ZeRO-2: the first micro-batch's partition down, each later one's buffer up and down; ZeRO-1: the
    # boundary's alone (micro_step_id > 0 there)
    accumulated = (2.0 * micro_batches - 1.0) if layout.zero_stage == 2 else 2.0
    return element * accumulated + FP32_BYTES + element


def weight_cast_s(job: Job, layout: Layout, parts: StepParts) -> float:
    """A frozen fp32 LoRA base under 16-bit autocast without sharding (DDP, or FSDP on one rank;
    ``memory.autocast_weight_bytes``): every forward casts each Linear weight again (read 4 B, write
    2 B; autocast caches no frozen weight's copy), and so does the recomputed forward of each
    checkpointed layer, memory-bound, every micro-batch; the output layer's cast on the last rank
    likewise. The backward uses the saved copies. FSDP's sharded stages cast only their shard before
    each all-gather (1/dp of it): not counted. Part of compute; sharding-dependent, so outside the
    floors the search prunes by."""
    if not autocast_casts_weights(job, layout):
        return 0.0
    stage = step_base(job, layout).stage
    weights = rank_parameters_of(job, layout, stage).linear + output_layer_weights(job, layout, stage)
    passes = 1.0
    if layout.recompute is Recompute.FULL:
        passes += rank_recomputed_fractions(job.model.num_layers, layout, job.training.mtp_num_layers)[stage]
    moved = parts.micro_batches * passes * AUTOCAST_CAST_TRAFFIC_BYTES * weights
    return moved / job.cluster.gpu.hbm_bandwidth_bytes_per_s


def optimizer_s(job: Job, layout: Layout, parts: StepParts) -> float:
    """The optimizer step: memory-bound on the GPU, or DeepSpeed CPU-Adam on the host."""
    if job.training.method is not _FULL_TRAINING:
        return 0.0  # adapters only: negligible
    shard = sharded_parameters(job, layout, parts)
    if layout.offload_optimizer is not _NO_OFFLOAD:
        # the host's CPU-Adam rate is shared by all GPUs of the node: DeepSpeed's CPU-Adam, and
        # torch.optim's AdamW where its fused kernel runs on the host (vectorised and threaded as CPU-Adam:
        # Megatron's HybridDeviceOptimizer builds torch's AdamW with fused=True, FSDP's launch files the
        # fused implementation); torch's unfused paths at the measured slowdown. FSDP's fused step was
        # timed 6.4x Megatron's same kernel (an optimizer review).
        rate = job.tuning.cpu_adam_params_per_s_per_node
        if steps_torch_unfused_on_host(job, layout):
            rate /= job.tuning.torch_cpu_adam_slowdown
        return shard * job.cluster.gpus_per_node / rate
    # the states model_states counts, by precision, optimizer and framework, read and written once
    step_bytes = shard * optimizer_step_bytes(layout_state_bytes(job, layout), layout.framework)
    return step_bytes / job.cluster.gpu.hbm_bandwidth_bytes_per_s


# ---------------------------------------------------------------- training time and price


def steps_to_train(tokens: int, tokens_per_step: int) -> int:
    """Optimizer steps that consume ``tokens``: whole steps (a trainer runs a step's global batch or
    none: Megatron's --train-iters, HF Trainer's max_steps), so a budget below one step is one."""
    return -(-tokens // tokens_per_step)


def time_to_train_s(tokens: int, tokens_per_step: int, tokens_per_s: float) -> float:
    """Wall time of the steps that consume ``tokens`` (``steps_to_train``) at a steady ``tokens_per_s``."""
    return steps_to_train(tokens, tokens_per_step) * tokens_per_step / tokens_per_s


def training_time_s(total_flops: float, num_gpus: int, achieved_flops_per_s_per_gpu: float) -> float:
    """Narayanan Eq. 4 in its general form: total FLOPs / (n x X)."""
    return total_flops / (num_gpus * achieved_flops_per_s_per_gpu)


def gpu_hours(time_s: float, num_gpus: int) -> float:
    """GPU-hours of ``num_gpus`` GPUs held for ``time_s`` seconds."""
    return time_s / 3600.0 * num_gpus


def cost(time_s: float, num_gpus: int, price_per_gpu_hour: float) -> float:
    """Price of ``num_gpus`` GPUs for ``time_s`` seconds, in the currency of the hourly price."""
    return gpu_hours(time_s, num_gpus) * price_per_gpu_hour
