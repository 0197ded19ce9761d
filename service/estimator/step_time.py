"""Step time of one layout: compute at an achievable fraction of peak, plus exposed communication,
pipeline bubble, offload traffic and the optimizer step.

We model the slowest rank: the most loaded pipeline stage (the last one holds the output layer;
Megatron keeps the embedding on the first), one micro-batch at a time, ``m`` micro-batches per
step. Ranks are ordered tp, cp, (ep inside) dp, pp from innermost to outermost (``comm``).

What overlaps with what, and by how much (defaults; ``CommOverlap`` overrides them):
* TP all-reduces (or SP reduce-scatter + all-gather) are fully exposed: Megatron-LM runs them on
  the compute stream unless ``--tp-comm-overlap`` (then ``tp_overlap_hidden_fraction`` hides).
* DP gradient reduction (all-reduce for ZeRO-0; reduce-scatter + 16-bit parameter all-gather for
  ZeRO-1/2 and Megatron's distributed optimizer; ZeRO-2 reduce-scatters after every micro-batch,
  the others once per step) is exposed unless the framework overlaps it
  (PyTorch DDP/FSDP do by default, Megatron only with ``--overlap-grad-reduce`` /
  ``--overlap-param-gather``, DeepSpeed ZeRO-0..2 not by default). Overlapped, a reduction hides
  under its micro-batch's backward and the gather under the first forward, at most
  ``dp_overlap_max_hidden_fraction`` (0.9: the last bucket is always exposed).
* ZeRO-3/FSDP parameter all-gathers (forward and backward) and gradient reduce-scatter run every
  micro-batch, 1.5x the DDP volume (ZeRO arXiv:1910.02054 §7), prefetched under compute.
* CP ring attention passes K/V around the ring under the attention compute; only the excess shows.
* EP all-to-all (dispatch + combine, forward and backward: 4 per MoE layer) is fully exposed.
* PP: bubble (p-1)/(v m) of the ideal time (Narayanan arXiv:2104.04473 §2.2, Llama 3 §3.3.2),
  and point-to-point sends of b s h / t per micro-batch and chunk (scatter/gather or SP), exposed.
* Offload: PCIe traffic of 16-bit gradients down and parameters up, CPU-Adam on the host, NVMe
  reads and writes of the optimizer states, all exposed (DeepSpeed ZeRO-Offload arXiv:2101.06840
  overlaps part of it; we stay conservative).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from service.estimator import comm, flops
from service.estimator.efficiency import EfficiencyCurve, dp_overlap_default, matmul_efficiency
from service.estimator.errors import InvalidTraining
from service.estimator.params import is_moe_layer, parameter_counts, stage_parameter_counts
from service.estimator.types import (
    Attention,
    ClusterSpec,
    Framework,
    Layout,
    Method,
    ModelSpec,
    Offload,
    Optimizer,
    ParameterCounts,
    Precision,
    Recompute,
    TimeBreakdown,
    TimeEstimate,
    TrainingSpec,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CommOverlap:
    """Which communication the framework overlaps; None takes the framework default."""

    tp: bool = False  # Megatron --tp-comm-overlap
    dp: bool | None = None  # --overlap-grad-reduce / --overlap-param-gather, DDP buckets


# ---------------------------------------------------------------- per-GPU rates and sizes


def peak_flops_per_s(cluster: ClusterSpec, precision: Precision) -> float:
    """Dense data-sheet peak for the GEMM precision (fp32 training: no TF32, PyTorch's default)."""
    peaks = cluster.gpu.peak_flops_per_s
    by_precision = {
        Precision.FP32: peaks.fp32,
        Precision.BF16: peaks.bf16,
        Precision.BF16_PURE: peaks.bf16,
        Precision.FP16: peaks.fp16,
        Precision.FP8: peaks.fp8,
    }
    peak = by_precision[precision]
    if peak is None:
        raise InvalidTraining(
            f"{cluster.gpu.name} has no {precision.value} peak in its spec",
            rule="precision",
            field="precision",
        )
    return peak


def activation_bytes(precision: Precision) -> int:
    """Bytes per activation element sent over links (fp8 GEMMs still communicate 16-bit)."""
    return 4 if precision is Precision.FP32 else 2


def grad_bytes(precision: Precision, framework: Framework) -> int:
    """Bytes per gradient element in the DP reduction."""
    # Megatron reduces bf16 grads in fp32 (--accumulate-allreduce-grads-in-fp32, forced for bf16);
    # DeepSpeed and FSDP reduce in the training dtype.
    if precision is Precision.FP32 or (precision is Precision.BF16 and framework is Framework.MEGATRON):
        return 4
    return 2


def stage_layers(model: ModelSpec, layout: Layout, stage: int) -> range:
    return layers_of_stage(model.num_layers, layout.pp, stage)


def layers_of_stage(num_layers: int, pp: int, stage: int) -> range:
    # contiguous split of ceil(L / pp) layers per stage; with a remainder the last stages would get
    # fewer, but validation requires pp | L, so the split is even (interleaving keeps the per-rank count)
    per_stage = math.ceil(num_layers / pp)
    start = min(stage * per_stage, num_layers)
    return range(start, min(start + per_stage, num_layers))


def stage_flops_per_token(model: ModelSpec, layout: Layout, training: TrainingSpec, stage: int) -> int:
    """Forward + backward FLOPs per token of one pipeline stage (the last adds the output layer)."""
    return _stage_flops_per_token(model, training, layout.pp, stage)


@lru_cache(maxsize=4096)  # depends on the stage split only, not on the rest of the layout
def _stage_flops_per_token(model: ModelSpec, training: TrainingSpec, pp: int, stage: int) -> int:
    total = sum(
        flops.layer_training_flops(model, i, training) for i in layers_of_stage(model.num_layers, pp, stage)
    )
    return total + (flops.logits_training_flops(model, training) if stage == pp - 1 else 0)


def slowest_stage(model: ModelSpec, layout: Layout, training: TrainingSpec) -> int:
    work = [stage_flops_per_token(model, layout, training, s) for s in range(layout.pp)]
    return work.index(max(work))


def _ffn_width(model: ModelSpec, index: int) -> int:
    # ffn-wide activations per token: top_k routed experts + shared experts in an MoE layer
    moe = model.moe
    if moe is None or not is_moe_layer(model, index):
        return model.ffn_hidden_size
    return moe.top_k * moe.expert_ffn_hidden_size + moe.num_shared_experts * moe.shared_expert_ffn_hidden_size


def layer_stored_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec, index: int) -> float:
    """Activation bytes per token one GPU stores in layer ``index`` (Korthikanti Table 2, generalised)."""
    # replicated unless SP: 2 norm inputs 4h, QKV and MLP inputs 4h, 2 dropout masks 2h -> 10h
    # sharded: Q, K, V 2(q + 2kv), attention output 2q, MLP 2 bytes x (2 GELU | 3 gated) ffn-wide tensors
    # eager attention: softmax out 2 + dropout mask 1 + dropout out 2 -> 5 a s (Korthikanti's 5as/h)
    h, q, kv, t = model.hidden_size, model.q_size, model.kv_size, layout.tp
    replicated = 10 * h / (t if layout.sequence_parallel else 1)
    mlp_tensors = 3 if model.mlp.gated else 2
    sharded = 2 * (q + 2 * kv) + 2 * q + 2 * mlp_tensors * _ffn_width(model, index)
    scores = 5 * model.num_attention_heads * training.seq_len if training.attention is Attention.EAGER else 0
    scale = activation_bytes(training.precision) / 2  # the table assumes 16-bit activations
    return scale * (replicated + (sharded + scores) / t)


def loss_traffic_bytes(model: ModelSpec, layout: Layout, curve: EfficiencyCurve) -> float:
    """HBM bytes per token the cross-entropy moves in one step on the last stage (fp32 logits,
    vocab-parallel over tp, Korthikanti §4.3): ``loss_traffic_bytes_per_logit`` x V / t."""
    return curve.loss_traffic_bytes_per_logit * model.vocab_size / layout.tp


def stage_stored_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec, stage: int) -> float:
    """Activation bytes per token the layers of ``stage`` store on one GPU: what their memory-bound
    ops touch (the loss on the logits is timed apart, ``loss_traffic_bytes``)."""
    return sum(layer_stored_bytes(model, layout, training, i) for i in stage_layers(model, layout, stage))


def micro_batch_tokens_per_rank(layout: Layout, training: TrainingSpec) -> int:
    """Tokens of one micro-batch that one CP rank holds."""
    return layout.micro_batch_size * training.seq_len // layout.cp


def gpu_parameters(model: ModelSpec, layout: Layout, counts: ParameterCounts) -> float:
    """Parameters on one GPU of the most loaded stage before ZeRO sharding (experts split by ep)."""
    # Each stage's routed experts are those of the MoE layers it holds (every layer_frequency-th
    # layer), so with ep > 1 or uneven MoE layers the most loaded GPU is found per stage.
    return max(
        stage_gpu_parameters(stage_params, counts.experts_per_moe_layer * moe_layers, layout)
        for stage_params, moe_layers in zip(
            stage_parameter_counts(model, layout.pp), stage_moe_layer_counts(model, layout.pp), strict=True
        )
    )


def stage_gpu_parameters(stage_params: int, experts: int, layout: Layout) -> float:
    """One GPU's share of a stage's ``stage_params``, of which ``experts`` are routed experts."""
    return ((stage_params - experts) + experts / layout.ep) / layout.tp


@lru_cache(maxsize=4096)
def stage_moe_layer_counts(model: ModelSpec, pp: int) -> tuple[int, ...]:
    """MoE layers held by each of ``pp`` pipeline stages."""
    return tuple(
        sum(1 for i in layers_of_stage(model.num_layers, pp, stage) if is_moe_layer(model, i))
        for stage in range(pp)
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupLinks:
    tp: comm.Link
    cp: comm.Link
    ep: comm.Link
    dp: comm.Link  # the gradient group: dp x cp ranks (Megatron's dp-cp group), stride tp
    pp: comm.Link


def group_links(cluster: ClusterSpec, layout: Layout, curve: EfficiencyCurve) -> GroupLinks:
    """The link each parallel group crosses, derated to NCCL's achievable bus bandwidth."""
    strides = comm.group_strides(layout)

    def link(size: int, stride: int) -> comm.Link:
        return comm.link_for_group(
            cluster,
            size,
            stride,
            intra_latency_s=curve.intra_node_latency_s,
            inter_latency_s=curve.inter_node_latency_s,
            intra_efficiency=curve.intra_node_bus_efficiency,
            inter_efficiency=curve.inter_node_bus_efficiency,
        )

    return GroupLinks(
        tp=link(layout.tp, strides.tp),
        cp=link(layout.cp, strides.cp),
        ep=link(layout.ep, strides.ep),
        dp=link(layout.dp * layout.cp, strides.cp),
        pp=link(layout.pp, strides.pp),
    )


def exposed_s(comm_s: float, window_s: float, max_hidden_fraction: float) -> float:
    """Communication left on the critical path when it runs under ``window_s`` of compute."""
    return max(comm_s * (1.0 - max_hidden_fraction), comm_s - window_s)


# ---------------------------------------------------------------- the parts of a step


@dataclass(frozen=True, slots=True, kw_only=True)
class StepContext:
    """Everything the part functions share, computed once."""

    model: ModelSpec
    cluster: ClusterSpec
    layout: Layout
    training: TrainingSpec
    counts: ParameterCounts
    curve: EfficiencyCurve
    overlap: CommOverlap
    stage: int
    micro_batches: int
    flops_per_s: float  # achieved, per GPU
    links: GroupLinks

    @property
    def tokens(self) -> int:
        return micro_batch_tokens_per_rank(self.layout, self.training)

    @property
    def layers(self) -> range:
        return stage_layers(self.model, self.layout, self.stage)


def memory_bound_s(st: StepContext, passes: float, stored_bytes_per_token: float) -> float:
    """Time of ``passes`` forward-equivalents of memory-bound work over all micro-batches."""
    # backward moves 2x the forward traffic, so a training step is 3 passes
    traffic = st.curve.memory_traffic_per_stored_byte * stored_bytes_per_token * passes
    return st.micro_batches * st.tokens * traffic / st.cluster.gpu.hbm_bandwidth_bytes_per_s


def loss_s(st: StepContext) -> float:
    """Cross-entropy on the logits, forward and backward, all micro-batches (last stage only)."""
    if st.stage != st.layout.pp - 1:
        return 0.0
    traffic = loss_traffic_bytes(st.model, st.layout, st.curve)
    return st.micro_batches * st.tokens * traffic / st.cluster.gpu.hbm_bandwidth_bytes_per_s


def unaligned_core_slowdown(model: ModelSpec, training: TrainingSpec, curve: EfficiencyCurve) -> float:
    """Extra time of eager attention's core (QK^T, AV) as a multiple of its time at the GEMM rate:
    ``1 / unaligned_attention_core_factor - 1`` when a head's row, head_dim x element bytes, is off
    ``attention_alignment_bytes``, else 0. Flash and SDPA pad head_dim to a multiple of 8: 0. fp32
    attention runs on CUDA cores, not tensor cores, and the measurements are 16-bit: 0."""
    # BigScience prequel: head_dim 108 (216 B) ran 1.30-1.40x the step of head_dim 144 (efficiency.toml)
    if training.attention is not Attention.EAGER or training.precision is Precision.FP32:
        return 0.0
    if model.head_dim * activation_bytes(training.precision) % curve.attention_alignment_bytes == 0:
        return 0.0
    return 1.0 / curve.unaligned_attention_core_factor - 1.0


def unaligned_core_s(
    model: ModelSpec,
    training: TrainingSpec,
    curve: EfficiencyCurve,
    *,
    core_passes: int,
    micro_batches: int,
    tokens: int,
    tp: int,
    flops_per_s: float,
) -> float:
    """Time ``core_passes`` layer-forwards of attention's core add, over all micro-batches, beyond
    their FLOPs at the GEMM rate ``flops_per_s`` (``unaligned_core_slowdown``; 0 when aligned)."""
    slowdown = unaligned_core_slowdown(model, training, curve)
    if slowdown == 0.0:
        return 0.0
    per_token = core_passes * flops.attention_core_flops(model, training.seq_len)
    return micro_batches * tokens * per_token / tp / flops_per_s * slowdown


def _unaligned_core_s(st: StepContext, passes_per_layer: int) -> float:
    return unaligned_core_s(
        st.model,
        st.training,
        st.curve,
        core_passes=passes_per_layer * len(st.layers),
        micro_batches=st.micro_batches,
        tokens=st.tokens,
        tp=st.layout.tp,
        flops_per_s=st.flops_per_s,
    )


def unaligned_core_step_s(st: StepContext) -> float:
    """What an unaligned head_dim adds to the step: training passes plus the recomputed core."""
    recomputed = 0 if st.layout.recompute is Recompute.NONE else 1
    return _unaligned_core_s(st, 3) + _unaligned_core_s(st, recomputed)


def compute_s(st: StepContext) -> float:
    """Forward + backward of all micro-batches on the slowest stage's GPU: GEMMs (with eager
    attention's core slowed when its head_dim is unaligned), the memory-bound ops between them and
    the loss."""
    per_token = stage_flops_per_token(st.model, st.layout, st.training, st.stage)
    gemm_s = st.micro_batches * st.tokens * per_token / st.layout.tp / st.flops_per_s
    stored = stage_stored_bytes(st.model, st.layout, st.training, st.stage)
    return gemm_s + _unaligned_core_s(st, 3) + memory_bound_s(st, 3, stored) + loss_s(st)


# Forward-equivalents of memory-bound work a recompute costs. Full recompute re-runs each layer's
# forward once. Selective recompute re-runs attention's core, whose s x s chain (scores written by
# QK^T, read and written by mask/softmax, read by dropout, which writes its mask and output) moves
# about twice the bytes it finally stores (Korthikanti Table 4: selective costs 7% of a layer, more
# than its 2.7% FLOPs; Korthikanti §5 names the softmax/dropout memory traffic as the cost).
RECOMPUTE_PASSES = {Recompute.NONE: 0.0, Recompute.SELECTIVE: 2.0, Recompute.FULL: 1.0}


def recompute_s(st: StepContext) -> float:
    """The recomputed forward: every layer (full) or attention's core (selective)."""
    recompute = st.layout.recompute
    per_token = sum(flops.layer_recompute_flops(st.model, i, st.training, recompute) for i in st.layers)
    gemm_s = st.micro_batches * st.tokens * per_token / st.layout.tp / st.flops_per_s
    if recompute is Recompute.FULL:
        stored = sum(layer_stored_bytes(st.model, st.layout, st.training, i) for i in st.layers)
    elif recompute is Recompute.SELECTIVE and st.training.attention is Attention.EAGER:
        heads = st.model.num_attention_heads / st.layout.tp
        stored = (
            len(st.layers) * 5 * heads * st.training.seq_len * activation_bytes(st.training.precision) / 2
        )
    else:
        stored = 0.0
    core_passes = 0 if recompute is Recompute.NONE else 1  # full and selective both redo the core
    return (
        gemm_s + _unaligned_core_s(st, core_passes) + memory_bound_s(st, RECOMPUTE_PASSES[recompute], stored)
    )


def tp_comm_s(st: StepContext) -> float:
    """Megatron TP: 2 all-reduces forward + 2 backward per layer (+2 with full recompute)."""
    # SP swaps each all-reduce for a reduce-scatter + all-gather of the same total time
    # (Korthikanti §4.2.2); Narayanan §3.3: volume 8 b s h (t-1)/t per layer.
    if st.layout.tp == 1:
        return 0.0
    size_bytes = st.tokens * st.model.hidden_size * activation_bytes(st.training.precision)
    collectives = 4 + (2 if st.layout.recompute is Recompute.FULL else 0)
    one = comm.group_all_reduce_s(size_bytes, st.links.tp)
    total = st.micro_batches * len(st.layers) * collectives * one
    return total * (1.0 - st.curve.tp_overlap_hidden_fraction) if st.overlap.tp else total


def cp_comm_s(st: StepContext) -> float:
    """Ring attention: K and V chunks go round the CP ring, hidden under attention's core compute."""
    # forward: (cp-1) sends of K and V; backward: K, V and dK, dV -> 3x the forward traffic
    if st.layout.cp == 1:
        return 0.0
    kv_width = max(st.model.kv_size / st.layout.tp, st.model.head_dim)
    chunk_bytes = 2 * st.tokens * kv_width * activation_bytes(st.training.precision)
    link = st.links.cp
    ring_s = 3 * (st.layout.cp - 1) * comm.p2p_s(chunk_bytes, link.bandwidth_bytes_per_s, link.latency_s)
    core_flops = 3 * flops.attention_core_flops(st.model, st.training.seq_len) * st.tokens / st.layout.tp
    per_layer = max(0.0, ring_s - core_flops / st.flops_per_s)
    return st.micro_batches * len(st.layers) * per_layer


def ep_comm_s(st: StepContext) -> float:
    """Expert parallelism: dispatch + combine all-to-all, forward and backward, per MoE layer."""
    moe = st.model.moe
    if moe is None or st.layout.ep == 1:
        return 0.0
    moe_layers = sum(1 for i in st.layers if is_moe_layer(st.model, i))
    # each routed copy of a token (top_k of them) carries h values; SP splits tokens over tp
    tokens = st.tokens / (st.layout.tp if st.layout.sequence_parallel else 1)
    size_bytes = tokens * moe.top_k * st.model.hidden_size * activation_bytes(st.training.precision)
    collectives = 4 + (2 if st.layout.recompute is Recompute.FULL else 0)
    one = comm.group_all_to_all_s(size_bytes, st.links.ep)
    return st.micro_batches * moe_layers * collectives * one


def ideal_s(st: StepContext) -> float:
    """Time of all micro-batches without bubble: the work a pipeline bubble scales."""
    return compute_s(st) + recompute_s(st) + tp_comm_s(st) + cp_comm_s(st) + ep_comm_s(st)


def pp_bubble_s(st: StepContext) -> float:
    # (p-1)/(v m) of the ideal time: 1F1B v=1, interleaved v chunks (Narayanan §2.2.2)
    p, v = st.layout.pp, st.layout.virtual_pipeline_stages
    return (p - 1) / (v * st.micro_batches) * ideal_s(st)


def pp_comm_s(st: StepContext) -> float:
    """Point-to-point activations forward and gradients backward, v x per micro-batch."""
    if st.layout.pp == 1:
        return 0.0
    # b s h / t bytes: Megatron's scatter/gather (or SP) splits the boundary tensor over tp
    size_bytes = st.tokens * st.model.hidden_size * activation_bytes(st.training.precision) / st.layout.tp
    link = st.links.pp
    one = comm.p2p_s(size_bytes, link.bandwidth_bytes_per_s, link.latency_s)
    return 2 * st.layout.virtual_pipeline_stages * st.micro_batches * one


def dp_grad_reduce_s(st: StepContext) -> float:
    """Gradient reduction per step: all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1/2, dist-opt)."""
    grad_size = gpu_parameters(st.model, st.layout, st.counts) * grad_bytes(
        st.training.precision, st.layout.framework
    )
    if st.training.method is not Method.FULL:
        return 0.0  # LoRA: only the adapters' gradients are reduced; negligible next to the base
    if st.layout.zero_stage == 0:
        return comm.group_all_reduce_s(grad_size, st.links.dp)
    return comm.group_reduce_scatter_s(grad_size, st.links.dp)


def dp_param_gather_s(st: StepContext) -> float:
    """ZeRO-1/2 (dist-opt) all-gather of the updated 16-bit parameters after the step."""
    if st.training.method is not Method.FULL or st.layout.zero_stage not in (1, 2):
        return 0.0
    param_size = gpu_parameters(st.model, st.layout, st.counts) * activation_bytes(st.training.precision)
    return comm.group_all_gather_s(param_size, st.links.dp)


def zero3_comm_s(st: StepContext) -> float:
    """ZeRO-3/FSDP per micro-batch: parameter all-gather forward and backward + gradient reduce-scatter."""
    # 3 x the parameter volume per micro-batch, 1.5x DDP's 2 (ZeRO arXiv:1910.02054 §7.2.2)
    params = gpu_parameters(st.model, st.layout, st.counts)
    grad_size = params * grad_bytes(st.training.precision, st.layout.framework)
    gathers = 2 * comm.group_all_gather_s(params * activation_bytes(st.training.precision), st.links.dp)
    reduce = comm.group_reduce_scatter_s(grad_size, st.links.dp) if st.training.method is Method.FULL else 0.0
    return st.micro_batches * (gathers + reduce)


def dp_comm_exposed_s(st: StepContext) -> float:
    """DP traffic left on the critical path after the framework's overlap."""
    compute = compute_s(st) + recompute_s(st)
    if st.layout.zero_stage == 3:
        return exposed_s(zero3_comm_s(st), compute, st.curve.zero3_prefetch_hidden_fraction)
    reduce, gather = dp_grad_reduce_s(st), dp_param_gather_s(st)
    reductions = gradient_reductions(st.layout, st.micro_batches)
    overlapped = (
        st.overlap.dp if st.overlap.dp is not None else dp_overlap_default(st.curve, st.layout.framework)
    )
    if not overlapped:
        return reductions * reduce + gather
    # each reduction hides under its micro-batch's backward (2/3 of it, + its recompute); the parameter
    # all-gather under the next step's first forward (Megatron --overlap-param-gather) (1/3)
    per_micro_batch = compute / st.micro_batches
    hidden = st.curve.dp_overlap_max_hidden_fraction
    return reductions * exposed_s(reduce, 2 / 3 * per_micro_batch, hidden) + exposed_s(
        gather, per_micro_batch / 3, hidden
    )


def gradient_reductions(layout: Layout, micro_batches: int) -> int:
    """Gradient reductions per step outside ZeRO-3: one, or one per micro-batch for ZeRO-2."""
    # ZeRO-2 keeps only its shard of the gradients, so it reduce-scatters after every micro-batch's
    # backward: DeepSpeed reduces when partition_gradients (stage 2) or at the accumulation boundary
    # (stage 1) (runtime/zero/stage_1_and_2.py, reduce_ready_partitions_and_remove_grads); FSDP
    # SHARD_GRAD_OP after every backward outside no_sync, which would keep unsharded gradients.
    # ZeRO-0/1 and Megatron's distributed optimizer accumulate locally and reduce once per step.
    return micro_batches if layout.zero_stage == 2 else 1


def sharded_parameters(st: StepContext) -> float:
    """Parameters whose optimizer state this GPU owns (ZeRO >= 1 shards over dp x cp)."""
    params = gpu_parameters(st.model, st.layout, st.counts)
    return params / (st.layout.dp * st.layout.cp) if st.layout.zero_stage >= 1 else params


def offload_s(st: StepContext) -> float:
    """PCIe and NVMe traffic of optimizer and parameter offload, exposed."""
    pcie = st.cluster.gpu.pcie_bandwidth_bytes_per_s
    shard = sharded_parameters(st)
    seconds = 0.0
    if st.layout.offload_optimizer is not Offload.NONE:
        seconds += shard * (2 + 2) / pcie  # 16-bit gradients down, 16-bit parameters up
    if st.layout.offload_optimizer is Offload.NVME:
        node_bytes = shard * st.cluster.gpus_per_node * 2 * 12  # read + write fp32 master, m, v
        seconds += node_bytes / st.curve.nvme_bandwidth_bytes_per_s_per_node
    if st.layout.offload_params is not Offload.NONE:
        # ZeRO-Infinity fetches this GPU's 16-bit shard for forward and backward, prefetched
        fetch_s = st.micro_batches * 2 * 2 * shard / pcie
        seconds += exposed_s(fetch_s, compute_s(st), st.curve.zero3_prefetch_hidden_fraction)
    return seconds


# bytes of HBM (or host memory) traffic per parameter in one optimizer step: AdamW reads and
# writes fp32 master, m and v (24), reads the fp32 grad (4) and writes the 16-bit param (2)
OPTIMIZER_STEP_BYTES = {
    Optimizer.ADAMW: 30,
    Optimizer.ADAMW_8BIT: 18,  # 1-byte m and v (+ fp32 master 8, grad 4, param 2)
    Optimizer.SGD: 22,  # master and momentum (16), grad 4, param 2
    Optimizer.LION: 22,  # master and momentum, as SGD
    Optimizer.ADAFACTOR: 14,  # master 8 (factored second moment ~0), grad 4, param 2
}


def optimizer_s(st: StepContext) -> float:
    """The optimizer step: memory-bound on the GPU, or DeepSpeed CPU-Adam on the host."""
    shard = sharded_parameters(st)
    if st.training.method is not Method.FULL:
        return 0.0  # adapters only: negligible
    if st.layout.offload_optimizer is not Offload.NONE:
        # the host's CPU-Adam rate is shared by all GPUs of the node
        return shard * st.cluster.gpus_per_node / st.curve.cpu_adam_params_per_s_per_node
    step_bytes = shard * OPTIMIZER_STEP_BYTES[st.training.optimizer]
    return step_bytes / st.cluster.gpu.hbm_bandwidth_bytes_per_s


# ---------------------------------------------------------------- the estimate


def step_context(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    training: TrainingSpec,
    counts: ParameterCounts,
    curve: EfficiencyCurve,
    overlap: CommOverlap,
) -> StepContext:
    """The shared inputs of every step-time term: slowest stage, micro-batches, achieved FLOP/s, links."""
    width = model.hidden_size / layout.tp
    tokens = micro_batch_tokens_per_rank(layout, training)
    efficiency = matmul_efficiency(curve, cluster.gpu.name, width, tokens)
    return StepContext(
        model=model,
        cluster=cluster,
        layout=layout,
        training=training,
        counts=counts,
        curve=curve,
        overlap=overlap,
        stage=slowest_stage(model, layout, training),
        micro_batches=layout.accumulation_steps(training.global_batch_size),
        flops_per_s=peak_flops_per_s(cluster, training.precision) * efficiency,
        links=group_links(cluster, layout, curve),
    )


def time_breakdown(st: StepContext) -> TimeBreakdown:
    return TimeBreakdown(
        compute_s=compute_s(st),
        recompute_s=recompute_s(st),
        tp_comm_s=tp_comm_s(st),
        cp_comm_s=cp_comm_s(st),
        ep_comm_s=ep_comm_s(st),
        pp_bubble_s=pp_bubble_s(st),
        pp_comm_s=pp_comm_s(st),
        dp_comm_exposed_s=dp_comm_exposed_s(st),
        offload_s=offload_s(st),
        optimizer_s=optimizer_s(st),
    )


def time_estimate(
    model: ModelSpec,
    cluster: ClusterSpec,
    layout: Layout,
    training: TrainingSpec,
    counts: ParameterCounts | None = None,
    efficiency: EfficiencyCurve | None = None,
    *,
    overlap: CommOverlap | None = None,
) -> TimeEstimate:
    """Step time, throughput and utilisation of ``layout``; ``efficiency`` comes from the catalog."""
    if efficiency is None:
        # the curve is data (service/catalog/efficiency.toml); the pure estimator cannot load it
        raise TypeError("time_estimate needs an EfficiencyCurve: pass catalog.default_efficiency()")
    if counts is None:
        counts = parameter_counts(model)
    overlap = overlap or CommOverlap(tp=layout.tp_comm_overlap, dp=layout.overlap_grad_reduce)
    st = step_context(model, cluster, layout, training, counts, efficiency, overlap)
    breakdown = time_breakdown(st)
    step = breakdown.step_s
    gpus = layout.world_size
    peak = peak_flops_per_s(cluster, training.precision)
    model_flops = flops.model_flops_per_step(model, training)
    hardware_flops = flops.hardware_flops_per_step(model, training, layout.recompute)
    return TimeEstimate(
        breakdown=breakdown,
        tokens_per_s=training.tokens_per_step / step,
        tflops_per_gpu=model_flops / (step * gpus) / 1e12,
        mfu=model_flops / (step * gpus * peak),
        hardware_tflops_per_gpu=hardware_flops / (step * gpus) / 1e12,
        hfu=hardware_flops / (step * gpus * peak),
    )


def time_to_train_s(tokens: float, tokens_per_s: float) -> float:
    """Wall time to consume ``tokens`` at a steady ``tokens_per_s``."""
    return tokens / tokens_per_s


def training_time_s(total_flops: float, num_gpus: int, achieved_flops_per_s_per_gpu: float) -> float:
    """Narayanan Eq. 4 in its general form: total FLOPs / (n x X)."""
    return total_flops / (num_gpus * achieved_flops_per_s_per_gpu)


def cost(time_s: float, num_gpus: int, price_per_gpu_hour: float) -> float:
    """Price of ``num_gpus`` GPUs for ``time_s`` seconds, in the currency of the hourly price."""
    return time_s / 3600.0 * num_gpus * price_per_gpu_hour
