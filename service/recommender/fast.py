"""The estimator's memory and step-time numbers for one job, many layouts, fast.

``memory_estimate`` and ``time_estimate`` recompute everything that depends only on the model
(parameter counts, per-layer FLOPs, per-stage sums) on every call: O(layers) work, ~1-5 ms for a
126-layer model. A search asks for thousands of layouts of the *same* job, so ``Evaluator`` holds
those sums once and memoises each part under only the layout fields it depends on: model states
and gradient buckets by sharding (``_StatesKey``), activations without the sharding
(``_ActivationKey``), both for the first and the last pipeline stage at once; the
sharding-independent parts of a step (``_PartsKey``; the GEMM rate, compute, CP ring, PP sends, the
GPU's parameters and its DP collectives also without recompute, ``_BaseKey``), the group links by
split. Per-layer quantities (FLOPs, stored activation bytes) are computed once per layer kind
(dense or MoE), since the estimator's per-layer functions read the index only through
``is_moe_layer``. Only data parallelism's overlap, offload and the optimizer step are computed per
layout. It composes the estimator's own part functions and sums in the same order, so its numbers
equal ``estimate()``'s; ``tests/recommender/test_space.py`` checks that equality on a sample of
layouts, and on layouts shuffled so that memo hits come from other layouts. The recommender still
runs ``estimate()`` on what it returns.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from service.estimator import activations, comm, flops
from service.estimator import memory as mem
from service.estimator import step_time as st
from service.estimator.efficiency import EfficiencyCurve, dp_overlap_default, matmul_efficiency
from service.estimator.model_states import (
    DEFAULT_ASSUMPTIONS,
    ModelStates,
    RankParameters,
    StateBytes,
    lora_parameters,
    model_state_bytes,
    rank_model_states,
    rank_parameters,
    shard_degrees,
    state_bytes,
)
from service.estimator.params import is_moe_layer, parameter_counts, stage_parameter_counts
from service.estimator.types import (
    Attention,
    ClusterSpec,
    Framework,
    Layout,
    MemoryBreakdown,
    MemoryEstimate,
    Method,
    ModelSpec,
    Offload,
    ParameterCounts,
    Recompute,
    TimeBreakdown,
    TimeEstimate,
    TrainingSpec,
)

# Enum members bound once: reading one off its Enum class costs ~0.1 us, and the per-layout code
# below compares several of them per layout.
_NO_OFFLOAD, _NVME = Offload.NONE, Offload.NVME
_NO_RECOMPUTE, _SELECTIVE, _FULL_RECOMPUTE = Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL
_FULL_TRAINING = Method.FULL
_EAGER = Attention.EAGER

_FRAGMENTATION = DEFAULT_ASSUMPTIONS.fragmentation_fraction

# Layout fields model states and gradient buckets depend on (not micro-batch, recompute,
# interleaving or SP). dp and cp enter only as the ZeRO / FSDP shard group dp x cp
# (model_states.shard_degrees, memory.bucket_bytes): (dp 4, cp 2) shares (dp 8, cp 1)'s.
_StatesKey = tuple[Framework, int, int, int, int, int, Offload, Offload, bool, bool | None]


def _states_key(layout: Layout) -> _StatesKey:
    return (
        layout.framework,
        layout.dp * layout.cp,
        layout.tp,
        layout.pp,
        layout.ep,
        layout.zero_stage,
        layout.offload_optimizer,
        layout.offload_params,
        layout.fsdp_hybrid_shard,
        layout.overlap_grad_reduce,  # DeepSpeed overlap_comm doubles the ZeRO-1/2 reduce buckets
    )


# One pipeline rank's model states, gradient buckets + gathered parameters, (parameters, gradients,
# optimizer states) rounded up as in the breakdown, and their sum
_ShardedRank = tuple[ModelStates, float, tuple[int, int, int], int]

# Layout fields activations depend on (not the sharding); they hold every field communicator_count
# reads (dp, cp, tp, pp, ep).
_ActivationKey = tuple[Framework, int, int, int, int, int, bool, int, int | None, int, Recompute, bool, bool]
# One pipeline rank's activations on GPU, on host, pipeline + dequantize buffers, loss workspace
# (last stage only), activations on GPU rounded up, overhead_bytes' fixed part (CUDA context + NCCL)
_ActivationRank = tuple[float, float, float, int | None, int, int]

# Layout fields the first and the last stage's extra activations and the loss workspace read
# (framework, tp, sequence_parallel, cp, micro_batch_size, chunked_loss)
_EdgeKey = tuple[Framework, int, bool, int, int, bool]

# Layout fields a step's time depends on before data parallelism, offload and the optimizer (those
# depend on the sharding and the framework): dp, tp, pp, cp, ep, sequence_parallel, micro_batch_size,
# gradient_accumulation_steps, virtual_pipeline_stages, recompute, tp_comm_overlap.
_PartsKey = tuple[int, int, int, int, int, bool, int, int | None, int, Recompute, bool]

# _PartsKey less recompute and tp_comm_overlap.
_BaseKey = tuple[int, int, int, int, int, bool, int, int | None, int]

_Number = TypeVar("_Number", int, float)


def host_numbers_fit(cluster: ClusterSpec, cpu_per_node_bytes: int, nvme_per_node_bytes: int) -> bool:
    """``memory.host_fits`` on the two numbers it reads (0 in the cluster = not stated)."""
    cpu_ok = not cluster.cpu_memory_bytes_per_node or cpu_per_node_bytes <= cluster.cpu_memory_bytes_per_node
    nvme_ok = not cluster.nvme_bytes_per_node or nvme_per_node_bytes <= cluster.nvme_bytes_per_node
    return cpu_ok and nvme_ok


# The records below are built once per memo key and never changed (but for the DP collectives'
# memo); not frozen, because a frozen dataclass' __init__ costs ~5x a plain one's and a search
# builds thousands.


@dataclass(slots=True)
class _Split:
    """What depends on the parallel split (dp, tp, pp, cp, ep) alone."""

    links: st.GroupLinks
    parameters: float  # step_time.gpu_parameters
    # DP collective times before overlap by (ZeRO stage, framework): see Evaluator._dp_collective_s
    dp_collectives: dict[tuple[int, Framework], tuple[float, float]] = field(default_factory=dict)


@dataclass(slots=True)
class _Base:
    """The parts of a step neither recompute nor TP overlap change."""

    stage: int  # the slowest pipeline stage
    layers: int  # decoder layers on that stage
    micro_batches: int
    tokens: int  # of one micro-batch on one CP rank
    flops_per_s: float  # achieved GEMM rate per GPU
    links: st.GroupLinks
    compute_s: float
    cp_comm_s: float
    pp_comm_s: float
    tp_all_reduce_s: float  # one TP all-reduce of a micro-batch's activations (tp_comm_s' unit)
    # the split's, referenced here for the per-layout terms
    parameters: float
    dp_collectives: dict[tuple[int, Framework], tuple[float, float]]


@dataclass(slots=True)
class _Parts:
    """The sharding-independent parts of one step (``step_time`` functions of the same name)."""

    base: _Base  # compute_s, cp_comm_s, pp_comm_s and what the per-layout terms read
    recompute_s: float
    tp_comm_s: float
    ep_comm_s: float
    pp_bubble_s: float
    # compute_s + ... + pp_comm_s, added left to right as TimeBreakdown.step_s adds its first seven
    # terms: step_s = before_dp_s + dp_comm_exposed_s + offload_s + optimizer_s, the same float
    before_dp_s: float
    # dp_comm_exposed_s' windows: compute + recompute, and 2/3 and 1/3 of it per micro-batch
    dp_window_s: float
    reduce_window_s: float
    gather_window_s: float


@dataclass(slots=True)
class Evaluator:
    """Memory and step time of many layouts of one (model, cluster, training) job."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    curve: EfficiencyCurve
    counts: ParameterCounts = field(init=False)
    layer_kinds: tuple[bool, ...] = field(init=False)
    memory_calls: int = 0
    time_calls: int = 0
    # per-job constants the per-layout code reads
    _tokens_per_step: int = field(init=False)
    _dp_overlap: dict[Framework, bool] = field(init=False)
    _dp_hidden: float = field(init=False)
    _zero3_hidden: float = field(init=False)
    _full_training: bool = field(init=False)
    _optimizer_step_bytes: int = field(init=False)  # HBM bytes per parameter of one optimizer step
    _hbm_bytes_per_s: float = field(init=False)
    _core_slowdown: bool = field(init=False)  # eager attention with an unaligned head_dim
    # the time model's per-layer FLOPs, filled on its first use (memory alone never needs them)
    _flops_ready: bool = False
    _peak_flops_per_s: float = field(init=False)
    _layer_is_moe: tuple[bool, ...] = field(init=False)
    _layer_flops: tuple[int, ...] = field(init=False)
    _logits_flops: int = field(init=False)
    _model_flops_step: int = field(init=False)
    _recompute_flops: dict[Recompute, tuple[int, ...]] = field(init=False)
    _hardware_flops_step: dict[Recompute, int] = field(init=False)
    # memory memos
    _sharded: dict[_StatesKey, tuple[_ShardedRank, ...]] = field(default_factory=dict)
    _activations: dict[_ActivationKey, tuple[_ActivationRank, ...]] = field(default_factory=dict)
    _rank_params: dict[tuple[int, int, int, int], RankParameters] = field(default_factory=dict)
    _state_bytes: dict[Framework, StateBytes] = field(default_factory=dict)
    _layer_bytes_memo: dict[tuple[Framework, int, bool, int, int, Recompute, bool], float] = field(
        default_factory=dict
    )
    _edges: dict[_EdgeKey, tuple[float, float, int]] = field(default_factory=dict)
    _fixed_overhead: dict[tuple[int, int, int, int, int], int] = field(default_factory=dict)
    # time memos
    _parts_cache: dict[_PartsKey, _Parts] = field(default_factory=dict)
    _bases: dict[_BaseKey, _Base] = field(default_factory=dict)
    _efficiency: dict[tuple[int, int], float] = field(default_factory=dict)
    _stage_flops: dict[int, tuple[int, ...]] = field(default_factory=dict)
    _gpu_params: dict[tuple[int, int, int], float] = field(default_factory=dict)
    _layer_stored: dict[tuple[int, bool], tuple[float, ...]] = field(default_factory=dict)
    _stage_stored_sums: dict[tuple[int, bool, int, int], float] = field(default_factory=dict)
    _stage_recompute: dict[tuple[int, int, Recompute], int] = field(default_factory=dict)
    _splits: dict[tuple[int, int, int, int, int], _Split] = field(default_factory=dict)
    _moe_layers: dict[tuple[int, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        curve = self.curve
        self.counts = parameter_counts(self.model)
        self.layer_kinds = activations.layer_kinds(self.model)
        self._tokens_per_step = self.training.tokens_per_step
        self._dp_overlap = {fw: dp_overlap_default(curve, fw) for fw in Framework}
        self._dp_hidden = curve.dp_overlap_max_hidden_fraction
        self._zero3_hidden = curve.zero3_prefetch_hidden_fraction
        self._full_training = self.training.method is _FULL_TRAINING
        self._optimizer_step_bytes = st.OPTIMIZER_STEP_BYTES[self.training.optimizer]
        self._hbm_bytes_per_s = self.cluster.gpu.hbm_bandwidth_bytes_per_s
        self._core_slowdown = st.unaligned_core_slowdown(self.model, self.training, curve) > 0.0

    def _per_layer(self, value: Callable[[int], _Number]) -> tuple[_Number, ...]:
        # value(i) of every layer i, computed once per layer kind: the estimator's per-layer functions
        # (flops.layer_*_flops, step_time.layer_stored_bytes) read the index only through is_moe_layer
        by_kind: dict[bool, _Number] = {}
        for i, moe in enumerate(self._layer_is_moe):
            if moe not in by_kind:
                by_kind[moe] = value(i)
        return tuple(by_kind[moe] for moe in self._layer_is_moe)

    def _prepare_flops(self) -> None:
        # per-layer FLOPs, once per job (only the time model needs them)
        model, training = self.model, self.training
        self._layer_is_moe = tuple(is_moe_layer(model, i) for i in range(model.num_layers))
        self._layer_flops = self._per_layer(lambda i: flops.layer_training_flops(model, i, training))
        self._logits_flops = flops.logits_training_flops(model, training)
        self._model_flops_step = training.tokens_per_step * (sum(self._layer_flops) + self._logits_flops)
        self._recompute_flops = {
            r: self._per_layer(
                functools.partial(flops.layer_recompute_flops, model, training=training, recompute=r)
            )
            for r in Recompute
        }
        self._hardware_flops_step = {
            r: training.tokens_per_step
            * (sum(self._layer_flops) + self._logits_flops + sum(self._recompute_flops[r]))
            for r in Recompute
        }
        # raises for a precision the GPU lacks, as time_estimate does (validate_layout rejects it first)
        self._peak_flops_per_s = st.peak_flops_per_s(self.cluster, training.precision)
        self._flops_ready = True

    # ------------------------------------------------------------ memory (memory.rank_memory)

    def memory_numbers(self, layout: Layout) -> tuple[int, int, int]:
        """``(per_gpu.total, cpu_per_node_bytes, nvme_per_node_bytes)`` of ``memory(layout)``: what a
        search needs to decide a fit, without the result objects. Counted in ``memory_calls``."""
        self.memory_calls += 1
        sharded, acts = self._sharded_ranks(layout), self._activation_ranks(layout)
        total, host, nvme = _rank_numbers(sharded[0], acts[0])
        if layout.pp > 1:  # the larger of the first and the last stage, the first on a tie
            last, last_host, last_nvme = _rank_numbers(sharded[1], acts[1])
            if last > total:
                total = last
            host, nvme = max(host, last_host), max(nvme, last_nvme)
        gpn = self.cluster.gpus_per_node
        return total, math.ceil(host * gpn), math.ceil(nvme * gpn)

    def fits(self, layout: Layout, limit: int) -> bool:
        """``memory(layout).per_gpu.total <= limit`` and ``memory.host_fits`` (host RAM and NVMe per
        node within the cluster's, where stated), from ``memory_numbers``."""
        total, cpu, nvme = self.memory_numbers(layout)
        return total <= limit and host_numbers_fit(self.cluster, cpu, nvme)

    def memory(self, layout: Layout) -> MemoryEstimate:
        """Equals ``memory.memory_estimate(model, cluster, layout, training)``."""
        self.memory_calls += 1
        sharded, acts = self._sharded_ranks(layout), self._activation_ranks(layout)
        breakdown, host, nvme = _rank_memory(sharded[0], acts[0])
        if layout.pp > 1:  # the larger of the first and the last stage, the first on a tie
            last, last_host, last_nvme = _rank_memory(sharded[1], acts[1])
            breakdown = last if last.total > breakdown.total else breakdown
            host, nvme = max(host, last_host), max(nvme, last_nvme)
        gpn = self.cluster.gpus_per_node
        return MemoryEstimate(
            per_gpu=breakdown,
            capacity_bytes=self.cluster.gpu.memory_bytes,
            cpu_per_node_bytes=math.ceil(host * gpn),
            nvme_per_node_bytes=math.ceil(nvme * gpn),
        )

    def model_states(self, layout: Layout, rank: int) -> ModelStates:
        """Equals ``model_state_bytes(model, counts, cluster, layout, training, rank)``."""
        if rank == 0 or rank == layout.pp - 1:
            return self._sharded_ranks(layout)[0 if rank == 0 else -1][0]
        return model_state_bytes(
            self.model, self.counts, self.cluster, layout, self.training, rank, DEFAULT_ASSUMPTIONS
        )

    def _sharded_ranks(self, layout: Layout) -> tuple[_ShardedRank, ...]:
        # model states and gradient buckets + gathered parameters of the first and the last stage:
        # they depend on the sharding only
        key = _states_key(layout)
        found = self._sharded.get(key)
        if found is None:
            first = self._sharded_rank(layout, 0)
            found = (first,) if layout.pp == 1 else (first, self._sharded_rank(layout, layout.pp - 1))
            self._sharded[key] = found
        return found

    def _sharded_rank(self, layout: Layout, rank: int) -> _ShardedRank:
        # memory.rank_memory's model states and first two buffer terms
        model, training, assume = self.model, self.training, DEFAULT_ASSUMPTIONS
        rp = self._rank_parameters(layout, rank)
        sb = self._sb(layout.framework)
        degrees = shard_degrees(layout, self.cluster)
        states = rank_model_states(model, layout, training, rp, sb, degrees, assume)
        trainable = (
            rp.dense + rp.expert
            if training.method is _FULL_TRAINING
            else lora_parameters(model, training, layout)
        )
        buffers = mem.bucket_bytes(model, trainable, sb, layout, assume)
        buffers += mem.gathered_parameter_bytes(
            model, self.counts, rp, layout, sb, (degrees[0], trainable), assume
        )
        # the breakdown's first three (rounded) fields and their sum: an int, so exact in any order
        rounded = (
            math.ceil(states.parameters),
            math.ceil(states.gradients),
            math.ceil(states.optimizer_states),
        )
        return states, buffers, rounded, sum(rounded)

    def _rank_parameters(self, layout: Layout, rank: int) -> RankParameters:
        key = (layout.pp, layout.tp, layout.ep, rank)  # the layout fields rank_parameters reads
        found = self._rank_params.get(key)
        if found is None:
            found = rank_parameters(self.model, self.counts, layout, rank)
            self._rank_params[key] = found
        return found

    def _sb(self, framework: Framework) -> StateBytes:
        found = self._state_bytes.get(framework)
        if found is None:
            found = state_bytes(self.training, framework, self.model, DEFAULT_ASSUMPTIONS)
            self._state_bytes[framework] = found
        return found

    def _activation_ranks(self, layout: Layout) -> tuple[_ActivationRank, ...]:
        # activations (GPU, host) and the activation-sized buffers of the first and the last stage:
        # they do not depend on the sharding
        key = (
            layout.framework,
            layout.dp,
            layout.tp,
            layout.pp,
            layout.cp,
            layout.ep,
            layout.sequence_parallel,
            layout.micro_batch_size,
            layout.gradient_accumulation_steps,
            layout.virtual_pipeline_stages,
            layout.recompute,
            layout.activation_offload,
            layout.chunked_loss,
        )
        found = self._activations.get(key)
        if found is None:
            found = self._make_activation_ranks(layout)
            self._activations[key] = found
        return found

    def _make_activation_ranks(self, layout: Layout) -> tuple[_ActivationRank, ...]:
        # memory.rank_memory's activation terms of the first and the last stage
        model, training, last = self.model, self.training, layout.pp - 1
        if layout.activation_offload:
            first_gpu, first_host = mem.activation_split(model, layout, training, 0)
            last_gpu, last_host = (
                mem.activation_split(model, layout, training, last) if last else (first_gpu, first_host)
            )
        else:  # memory.activation_split without offload
            first_total, last_total = self._stage_activation_bytes(layout)
            first_gpu, first_host, last_gpu, last_host = float(first_total), 0.0, float(last_total), 0.0
        pipeline = mem.pipeline_buffer_bytes(model, layout, training) + mem.dequantize_bytes(
            model, layout, training
        )
        loss, fixed = self._stage_edges(layout)[2], self._overhead_fixed(layout)
        if last == 0:
            return ((first_gpu, first_host, pipeline, loss, math.ceil(first_gpu), fixed),)
        return (
            (first_gpu, first_host, pipeline, None, math.ceil(first_gpu), fixed),
            (last_gpu, last_host, pipeline, loss, math.ceil(last_gpu), fixed),
        )

    def _stage_activation_bytes(self, layout: Layout) -> tuple[int, int]:
        # activations.stage_activation_bytes of the first and the last rank (one rank when pp = 1),
        # the same terms in the same order, on memoised layers
        model, recompute = self.model, layout.recompute
        layers_per_rank = model.num_layers / layout.pp
        dense = self._layer_bytes(layout, recompute, False)
        per_micro = layers_per_rank * dense
        if model.moe is not None:
            moe_share = (model.num_layers // model.moe.layer_frequency) / model.num_layers
            moe_delta = self._layer_bytes(layout, recompute, True) - dense
            per_micro += layers_per_rank * moe_share * moe_delta
        working = 0.0  # activations.recompute_working_bytes: the largest layer kind without recompute
        if recompute is _FULL_RECOMPUTE:
            working = max([self._layer_bytes(layout, _NO_RECOMPUTE, moe) for moe in self.layer_kinds])
        micro_batches = mem.micro_batches_per_step(layout, self.training)
        first_extra, last_extra, _ = self._stage_edges(layout)
        in_flight = activations.micro_batches_in_flight(layout, 0, micro_batches)
        first = per_micro * in_flight + working
        first += first_extra * in_flight
        if layout.pp == 1:
            first += last_extra
            return math.ceil(first), math.ceil(first)
        in_flight = activations.micro_batches_in_flight(layout, layout.pp - 1, micro_batches)
        last = per_micro * in_flight + working
        last += last_extra
        return math.ceil(first), math.ceil(last)

    def _stage_edges(self, layout: Layout) -> tuple[float, float, int]:
        # activations.first_stage_extra_bytes, last_stage_extra_bytes and loss_workspace_bytes
        key = (
            layout.framework,
            layout.tp,
            layout.sequence_parallel,
            layout.cp,
            layout.micro_batch_size,
            layout.chunked_loss,
        )
        found = self._edges.get(key)
        if found is None:
            model, training = self.model, self.training
            found = (
                activations.first_stage_extra_bytes(model, layout, training),
                activations.last_stage_extra_bytes(model, layout, training),
                activations.loss_workspace_bytes(model, layout, training),
            )
            self._edges[key] = found
        return found

    def _overhead_fixed(self, layout: Layout) -> int:
        # memory.overhead_bytes less its fragmentation term: (context + NCCL) is summed first there
        # too, so adding fragmentation x dynamic later gives the same float
        key = (layout.dp, layout.cp, layout.tp, layout.pp, layout.ep)  # what communicator_count reads
        found = self._fixed_overhead.get(key)
        if found is None:
            assume = DEFAULT_ASSUMPTIONS
            found = assume.cuda_context_bytes + assume.nccl_bytes_per_group * mem.communicator_count(layout)
            self._fixed_overhead[key] = found
        return found

    def _layer_bytes(self, layout: Layout, recompute: Recompute, moe_layer: bool) -> float:
        # activations.layer_bytes of the layout with ``recompute``; the fields it (and local_tokens) reads
        key = (
            layout.framework,
            layout.tp,
            layout.sequence_parallel,
            layout.cp,
            layout.micro_batch_size,
            recompute,
            moe_layer,
        )
        found = self._layer_bytes_memo.get(key)
        if found is None:
            if layout.recompute is not recompute:
                layout = dataclasses.replace(layout, recompute=recompute)
            found = activations.layer_bytes(self.model, layout, self.training, moe_layer)
            self._layer_bytes_memo[key] = found
        return found

    # ------------------------------------------------------------ time (step_time.time_estimate)

    def step_numbers(self, layout: Layout) -> tuple[float, float]:
        """``(step_s, tokens_per_s)`` of ``time(layout)``: what a search ranks by, without the result
        objects. Counted in ``time_calls``."""
        self.time_calls += 1
        parts = self._parts(layout)
        params = parts.base.parameters
        shard = params / (layout.dp * layout.cp) if layout.zero_stage >= 1 else params
        offloads = layout.offload_optimizer is not _NO_OFFLOAD or layout.offload_params is not _NO_OFFLOAD
        step_s = (
            parts.before_dp_s
            + self._dp_exposed_s(layout, parts)
            + (self._offload_s(layout, parts, shard) if offloads else 0.0)
            + self._optimizer_s(layout, shard)
        )
        return step_s, self._tokens_per_step / step_s

    def time(self, layout: Layout) -> TimeEstimate:
        """Equals ``step_time.time_estimate(model, cluster, layout, training, counts, curve)``."""
        self.time_calls += 1
        parts = self._parts(layout)
        base = parts.base
        shard = base.parameters / (layout.dp * layout.cp) if layout.zero_stage >= 1 else base.parameters
        breakdown = TimeBreakdown(
            compute_s=base.compute_s,
            recompute_s=parts.recompute_s,
            tp_comm_s=parts.tp_comm_s,
            cp_comm_s=base.cp_comm_s,
            ep_comm_s=parts.ep_comm_s,
            pp_bubble_s=parts.pp_bubble_s,
            pp_comm_s=base.pp_comm_s,
            dp_comm_exposed_s=self._dp_exposed_s(layout, parts),
            offload_s=self._offload_s(layout, parts, shard),
            optimizer_s=self._optimizer_s(layout, shard),
        )
        step_s = breakdown.step_s
        gpus = layout.world_size
        peak = self._peak_flops_per_s
        model_flops = self._model_flops_step
        hardware_flops = self._hardware_flops_step[layout.recompute]
        return TimeEstimate(
            breakdown=breakdown,
            tokens_per_s=self._tokens_per_step / step_s,
            tflops_per_gpu=model_flops / (step_s * gpus) / 1e12,
            mfu=model_flops / (step_s * gpus * peak),
            hardware_tflops_per_gpu=hardware_flops / (step_s * gpus) / 1e12,
            hfu=hardware_flops / (step_s * gpus * peak),
        )

    def floor_s(self, layout: Layout) -> float:
        """``time(layout).step_s`` less its bubble, DP, offload and optimizer time (all >= 0): a lower
        bound on the bubble-free step of every sharding and framework with the same parts key."""
        p = self._parts(layout)
        b = p.base
        return b.compute_s + p.recompute_s + p.tp_comm_s + b.cp_comm_s + p.ep_comm_s + b.pp_comm_s

    def gpu_parameters(self, layout: Layout) -> float:
        """Equals ``step_time.gpu_parameters``."""
        key = (layout.pp, layout.tp, layout.ep)
        found = self._gpu_params.get(key)
        if found is None:
            # the estimator's per-stage maximum: routed experts of the MoE layers each stage holds
            per_moe_layer = self.counts.experts_per_moe_layer
            found = max(
                st.stage_gpu_parameters(stage_params, per_moe_layer * moe_layers, layout)
                for stage_params, moe_layers in zip(
                    stage_parameter_counts(self.model, layout.pp),
                    st.stage_moe_layer_counts(self.model, layout.pp),
                    strict=True,
                )
            )
            self._gpu_params[key] = found
        return found

    def _parts(self, layout: Layout) -> _Parts:
        key: _PartsKey = (*_base_key(layout), layout.recompute, layout.tp_comm_overlap)
        found = self._parts_cache.get(key)
        if found is None:
            found = self._make_parts(layout)
            self._parts_cache[key] = found
        return found

    def _make_parts(self, layout: Layout) -> _Parts:
        base = self._base(layout)
        micro_batches, recompute = base.micro_batches, layout.recompute
        compute = base.compute_s
        recompute_s = self._recompute_s(layout, base)
        tp = 0.0  # step_time.tp_comm_s on the base's all-reduce time
        if layout.tp > 1:
            collectives = 4 + (2 if recompute is _FULL_RECOMPUTE else 0)
            tp = micro_batches * base.layers * collectives * base.tp_all_reduce_s
            if layout.tp_comm_overlap:
                tp = tp * (1.0 - self.curve.tp_overlap_hidden_fraction)
        ep = self._ep_comm_s(layout, base)
        ideal = compute + recompute_s + tp + base.cp_comm_s + ep
        p, v = layout.pp, layout.virtual_pipeline_stages
        bubble = (p - 1) / (v * micro_batches) * ideal
        window = compute + recompute_s
        per_micro_batch = window / micro_batches
        return _Parts(
            base=base,
            recompute_s=recompute_s,
            tp_comm_s=tp,
            ep_comm_s=ep,
            pp_bubble_s=bubble,
            before_dp_s=compute + recompute_s + tp + base.cp_comm_s + ep + bubble + base.pp_comm_s,
            dp_window_s=window,
            reduce_window_s=2 / 3 * per_micro_batch,
            gather_window_s=per_micro_batch / 3,
        )

    def _base(self, layout: Layout) -> _Base:
        # what neither recompute nor TP overlap changes: GEMM rate, compute, CP ring, PP sends
        key = _base_key(layout)
        found = self._bases.get(key)
        if found is not None:
            return found
        if not self._flops_ready:
            self._prepare_flops()
        model, training = self.model, self.training
        tokens = st.micro_batch_tokens_per_rank(layout, training)
        work = self._stage_flops_of(layout)
        stage = work.index(max(work))
        micro_batches = layout.accumulation_steps(training.global_batch_size)
        flops_per_s = self._peak_flops_per_s * self._matmul_efficiency(layout.tp, tokens)
        split = self._split(layout)
        links = split.links
        cp_comm = pp_comm = 0.0  # step_time's cp_comm_s and pp_comm_s are 0 for a group of one
        if layout.cp > 1 or layout.pp > 1:
            s = self._context(layout, stage, micro_batches, flops_per_s, links)
            cp_comm, pp_comm = st.cp_comm_s(s), st.pp_comm_s(s)
        tp_all_reduce = 0.0
        if layout.tp > 1:
            size_bytes = tokens * model.hidden_size * st.activation_bytes(training.precision)
            tp_all_reduce = comm.group_all_reduce_s(size_bytes, links.tp)
        # step_time.compute_s
        gemm_s = micro_batches * tokens * work[stage] / layout.tp / flops_per_s
        stored = self._stage_stored(layout, stage)
        loss_s = 0.0  # step_time.loss_s
        if stage == layout.pp - 1:
            traffic = st.loss_traffic_bytes(model, layout, self.curve)
            loss_s = micro_batches * tokens * traffic / self._hbm_bytes_per_s
        layers = len(st.stage_layers(model, layout, stage))
        found = _Base(
            stage=stage,
            layers=layers,
            micro_batches=micro_batches,
            tokens=tokens,
            flops_per_s=flops_per_s,
            links=links,
            compute_s=gemm_s
            + self._unaligned_core_s(3 * layers, micro_batches, tokens, layout.tp, flops_per_s)
            + self._memory_bound_s(micro_batches, tokens, 3, stored)
            + loss_s,
            cp_comm_s=cp_comm,
            pp_comm_s=pp_comm,
            tp_all_reduce_s=tp_all_reduce,
            parameters=split.parameters,
            dp_collectives=split.dp_collectives,
        )
        self._bases[key] = found
        return found

    def _context(
        self, layout: Layout, stage: int, micro_batches: int, flops_per_s: float, links: st.GroupLinks
    ) -> st.StepContext:
        return st.StepContext(
            model=self.model,
            cluster=self.cluster,
            layout=layout,
            training=self.training,
            counts=self.counts,
            curve=self.curve,
            overlap=st.CommOverlap(tp=layout.tp_comm_overlap, dp=layout.overlap_grad_reduce),
            stage=stage,
            micro_batches=micro_batches,
            flops_per_s=flops_per_s,
            links=links,
        )

    def _matmul_efficiency(self, tp: int, tokens: int) -> float:
        key = (tp, tokens)
        found = self._efficiency.get(key)
        if found is None:
            gpu_name, width = self.cluster.gpu.name, self.model.hidden_size / tp
            found = matmul_efficiency(self.curve, gpu_name, width, tokens)
            self._efficiency[key] = found
        return found

    def _stage_flops_of(self, layout: Layout) -> tuple[int, ...]:
        found = self._stage_flops.get(layout.pp)
        if found is None:
            last = layout.pp - 1
            found = tuple(
                sum(self._layer_flops[i] for i in st.stage_layers(self.model, layout, s))
                + (self._logits_flops if s == last else 0)
                for s in range(layout.pp)
            )
            self._stage_flops[layout.pp] = found
        return found

    def _stage_stored(self, layout: Layout, stage: int) -> float:
        # sum of layer_stored_bytes over the stage's layers, in layer order (as the estimator sums)
        key = (layout.tp, layout.sequence_parallel, layout.pp, stage)
        found = self._stage_stored_sums.get(key)
        if found is None:
            stored_key = (layout.tp, layout.sequence_parallel)
            stored = self._layer_stored.get(stored_key)
            if stored is None:
                model, training = self.model, self.training
                stored = self._per_layer(lambda i: st.layer_stored_bytes(model, layout, training, i))
                self._layer_stored[stored_key] = stored
            found = sum(stored[i] for i in st.stage_layers(self.model, layout, stage))
            self._stage_stored_sums[key] = found
        return found

    def _stage_recompute_flops(self, layout: Layout, stage: int) -> int:
        key = (layout.pp, stage, layout.recompute)
        found = self._stage_recompute.get(key)
        if found is None:
            per_layer = self._recompute_flops[layout.recompute]
            found = sum(per_layer[i] for i in st.stage_layers(self.model, layout, stage))
            self._stage_recompute[key] = found
        return found

    def _split(self, layout: Layout) -> _Split:
        key = (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep)
        found = self._splits.get(key)
        if found is None:
            links = st.group_links(self.cluster, layout, self.curve)
            found = _Split(links=links, parameters=self.gpu_parameters(layout))
            self._splits[key] = found
        return found

    def _moe_layer_count(self, layout: Layout, stage: int) -> int:
        key = (layout.pp, stage)
        found = self._moe_layers.get(key)
        if found is None:
            layers = st.stage_layers(self.model, layout, stage)
            found = sum(1 for i in layers if is_moe_layer(self.model, i))
            self._moe_layers[key] = found
        return found

    def _memory_bound_s(self, micro_batches: int, tokens: int, passes: float, stored: float) -> float:
        # step_time.memory_bound_s
        traffic = self.curve.memory_traffic_per_stored_byte * stored * passes
        return micro_batches * tokens * traffic / self._hbm_bytes_per_s

    def _unaligned_core_s(
        self, core_passes: int, micro_batches: int, tokens: int, tp: int, flops_per_s: float
    ) -> float:
        # step_time.unaligned_core_s (0 unless eager attention's head_dim is off the alignment)
        if not self._core_slowdown or not core_passes:
            return 0.0
        return st.unaligned_core_s(
            self.model,
            self.training,
            self.curve,
            core_passes=core_passes,
            micro_batches=micro_batches,
            tokens=tokens,
            tp=tp,
            flops_per_s=flops_per_s,
        )

    def _recompute_s(self, layout: Layout, base: _Base) -> float:
        # step_time.recompute_s
        recompute, training = layout.recompute, self.training
        per_token = self._stage_recompute_flops(layout, base.stage)
        gemm_s = base.micro_batches * base.tokens * per_token / layout.tp / base.flops_per_s
        stored = 0.0
        if recompute is _FULL_RECOMPUTE:
            stored = self._stage_stored(layout, base.stage)
        elif recompute is _SELECTIVE and training.attention is _EAGER:
            heads = self.model.num_attention_heads / layout.tp
            stored = base.layers * 5 * heads * training.seq_len * st.activation_bytes(training.precision) / 2
        passes = st.RECOMPUTE_PASSES[recompute]
        core_passes = 0 if recompute is _NO_RECOMPUTE else base.layers
        unaligned_s = self._unaligned_core_s(
            core_passes, base.micro_batches, base.tokens, layout.tp, base.flops_per_s
        )
        return gemm_s + unaligned_s + self._memory_bound_s(base.micro_batches, base.tokens, passes, stored)

    def _ep_comm_s(self, layout: Layout, base: _Base) -> float:
        # step_time.ep_comm_s
        model = self.model
        moe = model.moe
        if moe is None or layout.ep == 1:
            return 0.0
        tokens = base.tokens / (layout.tp if layout.sequence_parallel else 1)
        size_bytes = tokens * moe.top_k * model.hidden_size * st.activation_bytes(self.training.precision)
        collectives = 4 + (2 if layout.recompute is _FULL_RECOMPUTE else 0)
        one = comm.group_all_to_all_s(size_bytes, base.links.ep)
        return base.micro_batches * self._moe_layer_count(layout, base.stage) * collectives * one

    def _dp_collective_s(self, layout: Layout, base: _Base) -> tuple[float, float]:
        # _dp_exposed_s' collective times, before overlap, memoised in the split's dp_collectives:
        # they depend on the split, the sharding and the framework (gradient bytes) only. ZeRO-3:
        # (gathers + reduce-scatter per micro-batch, 0); else (gradient reduction, parameter all-gather).
        training, dp_link, params = self.training, base.links.dp, base.parameters
        full = training.method is _FULL_TRAINING
        grad_size = params * st.grad_bytes(training.precision, layout.framework)
        if layout.zero_stage == 3:
            gathers = 2 * comm.group_all_gather_s(params * st.activation_bytes(training.precision), dp_link)
            reduce3 = comm.group_reduce_scatter_s(grad_size, dp_link) if full else 0.0
            found = (gathers + reduce3, 0.0)
        else:
            reduce = 0.0
            if full:
                reduce = (
                    comm.group_all_reduce_s(grad_size, dp_link)
                    if layout.zero_stage == 0
                    else comm.group_reduce_scatter_s(grad_size, dp_link)
                )
            gather = 0.0
            if full and layout.zero_stage in (1, 2):
                size = params * st.activation_bytes(training.precision)
                gather = comm.group_all_gather_s(size, dp_link)
            found = (reduce, gather)
        base.dp_collectives[layout.zero_stage, layout.framework] = found
        return found

    def _dp_exposed_s(self, layout: Layout, parts: _Parts) -> float:
        # step_time.dp_comm_exposed_s
        collectives = parts.base.dp_collectives.get((layout.zero_stage, layout.framework))
        if collectives is None:
            collectives = self._dp_collective_s(layout, parts.base)
        reduce, gather = collectives
        if layout.zero_stage == 3:
            zero3_s = parts.base.micro_batches * reduce
            return st.exposed_s(zero3_s, parts.dp_window_s, self._zero3_hidden)
        overlapped = layout.overlap_grad_reduce
        if overlapped is None:
            overlapped = self._dp_overlap[layout.framework]
        reductions = st.gradient_reductions(layout, parts.base.micro_batches)
        if not overlapped:
            return reductions * reduce + gather
        hidden = self._dp_hidden
        return reductions * st.exposed_s(reduce, parts.reduce_window_s, hidden) + st.exposed_s(
            gather, parts.gather_window_s, hidden
        )

    def _offload_s(self, layout: Layout, parts: _Parts, shard: float) -> float:
        # step_time.offload_s
        cluster, curve = self.cluster, self.curve
        pcie = cluster.gpu.pcie_bandwidth_bytes_per_s
        seconds = 0.0
        if layout.offload_optimizer is not _NO_OFFLOAD:
            seconds += shard * (2 + 2) / pcie
        if layout.offload_optimizer is _NVME:
            node_bytes = shard * cluster.gpus_per_node * 2 * 12
            seconds += node_bytes / curve.nvme_bandwidth_bytes_per_s_per_node
        if layout.offload_params is not _NO_OFFLOAD:
            fetch_s = parts.base.micro_batches * 2 * 2 * shard / pcie
            seconds += st.exposed_s(fetch_s, parts.base.compute_s, curve.zero3_prefetch_hidden_fraction)
        return seconds

    def _optimizer_s(self, layout: Layout, shard: float) -> float:
        # step_time.optimizer_s
        if not self._full_training:
            return 0.0
        if layout.offload_optimizer is not _NO_OFFLOAD:
            return shard * self.cluster.gpus_per_node / self.curve.cpu_adam_params_per_s_per_node
        step_bytes = shard * self._optimizer_step_bytes
        return step_bytes / self._hbm_bytes_per_s


def _rank_numbers(sharded: _ShardedRank, acts: _ActivationRank) -> tuple[int, float, float]:
    # _rank_memory's (breakdown.total, host, NVMe) without building the breakdown
    states, buffers, _, states_total = sharded
    act_gpu, act_host, pipeline, loss, act_rounded, fixed = acts
    buffers += pipeline
    if loss is not None:
        buffers += loss
    total = (
        states_total
        + act_rounded
        + math.ceil(buffers)
        + math.ceil(fixed + _FRAGMENTATION * (act_gpu + buffers))
    )
    return total, states.host_bytes + act_host, states.nvme_bytes


def _rank_memory(sharded: _ShardedRank, acts: _ActivationRank) -> tuple[MemoryBreakdown, float, float]:
    # memory.rank_memory, its sums in the same order
    states, buffers, (parameters, gradients, optimizer_states), _ = sharded
    act_gpu, act_host, pipeline, loss, act_rounded, fixed = acts
    buffers += pipeline
    if loss is not None:
        buffers += loss
    breakdown = MemoryBreakdown(
        parameters=parameters,
        gradients=gradients,
        optimizer_states=optimizer_states,
        activations=act_rounded,
        buffers=math.ceil(buffers),
        overhead=math.ceil(fixed + _FRAGMENTATION * (act_gpu + buffers)),
    )
    return breakdown, states.host_bytes + act_host, states.nvme_bytes


def _base_key(layout: Layout) -> _BaseKey:
    """The layout fields the GEMM rate, compute, CP ring and PP sends depend on (the parts key
    extends it with recompute and TP overlap, so the two memos cannot drift apart)."""
    return (
        layout.dp,
        layout.tp,
        layout.pp,
        layout.cp,
        layout.ep,
        layout.sequence_parallel,
        layout.micro_batch_size,
        layout.gradient_accumulation_steps,
        layout.virtual_pipeline_stages,
    )
