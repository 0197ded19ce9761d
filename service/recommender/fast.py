"""The estimator's memory and step-time numbers for one job, many layouts, fast.

``memory_estimate`` and ``time_estimate`` recompute everything that depends only on the model
(parameter counts, per-layer FLOPs, per-stage sums) on every call: O(layers) work, ~1-5 ms for a
126-layer model. A search asks for thousands of layouts of the *same* job, so ``Evaluator`` holds
those sums once and memoises each part under only the layout fields it depends on: model states
and gradient buckets by sharding (``_StatesKey``), activations without the sharding
(``_ActivationKey``), the sharding-independent parts of a step (``_PartsKey``; compute, CP ring and
PP sends also without recompute, ``_BaseKey``), the group links by split. Only data parallelism,
offload and the optimizer step are computed per layout. It composes the estimator's own part
functions and sums in the same order, so its numbers equal ``estimate()``'s;
``tests/recommender/test_space.py`` checks that equality on a sample of layouts, and on layouts
shuffled so that memo hits come from other layouts. The recommender still runs ``estimate()`` on
what it returns.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from service.estimator import activations, comm, flops
from service.estimator import memory as mem
from service.estimator import step_time as st
from service.estimator.efficiency import EfficiencyCurve, dp_overlap_default, matmul_efficiency
from service.estimator.model_states import (
    DEFAULT_ASSUMPTIONS,
    ModelStates,
    StateBytes,
    lora_parameters,
    model_state_bytes,
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

# Layout fields model states and gradient buckets depend on (not micro-batch, recompute,
# interleaving or SP), and the pipeline rank. dp and cp enter only as the ZeRO / FSDP shard group
# dp x cp (model_states.shard_degrees, memory.bucket_bytes): (dp 4, cp 2) shares (dp 8, cp 1)'s.
_StatesKey = tuple[Framework, int, int, int, int, int, Offload, Offload, bool, bool | None, int]


def _states_key(layout: Layout, rank: int) -> _StatesKey:
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
        rank,
    )


# Layout fields activations depend on (not the sharding), and the pipeline rank.
_ActivationKey = tuple[
    Framework, int, int, int, int, int, bool, int, int | None, int, Recompute, bool, bool, int
]
# activations on GPU, on host, pipeline + dequantize buffers, loss workspace (last stage only),
# activations on GPU rounded up, overhead_bytes' fixed part (CUDA context + NCCL buffers). The key
# holds every field communicator_count reads (dp, cp, tp, pp, ep).
_ActivationPart = tuple[float, float, float, int | None, int, int]
# model states, gradient buckets + gathered parameters, (parameters, gradients, optimizer states)
# rounded up as in the breakdown, and their sum
_ShardedPart = tuple[ModelStates, float, tuple[int, int, int], int]

# Layout fields a step's time depends on before data parallelism, offload and the optimizer (those
# depend on the sharding and the framework): dp, tp, pp, cp, ep, sequence_parallel, micro_batch_size,
# gradient_accumulation_steps, virtual_pipeline_stages, recompute, tp_comm_overlap.
_PartsKey = tuple[int, int, int, int, int, bool, int, int | None, int, Recompute, bool]


# _PartsKey less recompute and tp_comm_overlap.
_BaseKey = tuple[int, int, int, int, int, bool, int, int | None, int]


_FRAGMENTATION = DEFAULT_ASSUMPTIONS.fragmentation_fraction


def host_numbers_fit(cluster: ClusterSpec, cpu_per_node_bytes: int, nvme_per_node_bytes: int) -> bool:
    """``memory.host_fits`` on the two numbers it reads (0 in the cluster = not stated)."""
    cpu_ok = not cluster.cpu_memory_bytes_per_node or cpu_per_node_bytes <= cluster.cpu_memory_bytes_per_node
    nvme_ok = not cluster.nvme_bytes_per_node or nvme_per_node_bytes <= cluster.nvme_bytes_per_node
    return cpu_ok and nvme_ok


@dataclass(frozen=True, slots=True)
class _Base:
    """The parts of a step neither recompute nor TP overlap change."""

    stage: int  # the slowest pipeline stage
    micro_batches: int
    flops_per_s: float  # achieved GEMM rate per GPU
    links: st.GroupLinks
    compute_s: float
    cp_comm_s: float
    pp_comm_s: float


@dataclass(frozen=True, slots=True)
class _Parts:
    """The sharding-independent parts of one step (``step_time`` functions of the same name)."""

    micro_batches: int
    links: st.GroupLinks
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    pp_bubble_s: float
    pp_comm_s: float
    # compute_s + ... + pp_comm_s, added left to right as TimeBreakdown.step_s adds its first seven
    # terms: step_s = before_dp_s + dp_comm_exposed_s + offload_s + optimizer_s, the same float
    before_dp_s: float


@dataclass(slots=True)
class Evaluator:
    """Memory and step time of many layouts of one (model, cluster, training) job."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    curve: EfficiencyCurve
    counts: ParameterCounts = field(init=False)
    memory_calls: int = 0
    time_calls: int = 0
    _layer_flops: tuple[int, ...] = field(init=False)
    _logits_flops: int = field(init=False)
    _model_flops_step: int = field(init=False)
    _recompute_flops: dict[Recompute, tuple[int, ...]] = field(init=False)
    _hardware_flops_step: dict[Recompute, int] = field(init=False)
    _states: dict[_StatesKey, ModelStates] = field(default_factory=dict)
    _state_bytes: dict[Framework, StateBytes] = field(default_factory=dict)
    _stage_flops: dict[int, tuple[int, ...]] = field(default_factory=dict)
    _sharded: dict[_StatesKey, _ShardedPart] = field(default_factory=dict)
    _activations: dict[_ActivationKey, _ActivationPart] = field(default_factory=dict)
    _layer_bytes_memo: dict[tuple[Framework, int, bool, int, int, Recompute, bool], float] = field(
        default_factory=dict
    )
    layer_kinds: tuple[bool, ...] = field(init=False)
    _recompute_working: dict[tuple[Framework, int, bool, int, int], float] = field(default_factory=dict)
    _dp_collectives: dict[tuple[int, int, int, int, int, int, Framework], tuple[float, float]] = field(
        default_factory=dict
    )
    _gpu_params: dict[tuple[int, int, int], float] = field(default_factory=dict)
    _stage_stored_sums: dict[tuple[int, bool, int, int], float] = field(default_factory=dict)
    _stage_recompute: dict[tuple[int, int, Recompute], int] = field(default_factory=dict)
    _group_links: dict[tuple[int, int, int, int, int], st.GroupLinks] = field(default_factory=dict)
    _parts_cache: dict[_PartsKey, _Parts] = field(default_factory=dict)
    _bases: dict[_BaseKey, _Base] = field(default_factory=dict)
    _peak_flops_per_s: float = field(init=False)
    _layer_stored: dict[tuple[int, bool], tuple[float, ...]] = field(default_factory=dict)
    _moe_layers: dict[tuple[int, int], int] = field(default_factory=dict)
    _flops_ready: bool = False

    def __post_init__(self) -> None:
        self.counts = parameter_counts(self.model)
        self._flops_ready = False
        self.layer_kinds = activations.layer_kinds(self.model)

    def _prepare_flops(self) -> None:
        # per-layer FLOPs, once per job (only the time model needs them)
        model, training = self.model, self.training
        layers = range(model.num_layers)
        self._layer_flops = tuple(flops.layer_training_flops(model, i, training) for i in layers)
        self._logits_flops = flops.logits_training_flops(model, training)
        self._model_flops_step = training.tokens_per_step * (sum(self._layer_flops) + self._logits_flops)
        self._recompute_flops = {
            r: tuple(flops.layer_recompute_flops(model, i, training, r) for i in layers) for r in Recompute
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

    def model_states(self, layout: Layout, rank: int) -> ModelStates:
        key = _states_key(layout, rank)
        found = self._states.get(key)
        if found is None:
            found = model_state_bytes(
                self.model, self.counts, self.cluster, layout, self.training, rank, DEFAULT_ASSUMPTIONS
            )
            self._states[key] = found
        return found

    def _sb(self, framework: Framework) -> StateBytes:
        found = self._state_bytes.get(framework)
        if found is None:
            found = state_bytes(self.training, framework, self.model, DEFAULT_ASSUMPTIONS)
            self._state_bytes[framework] = found
        return found

    def _sharded_part(self, layout: Layout, rank: int) -> _ShardedPart:
        # model states and gradient buckets + gathered parameters: they depend on the sharding only
        key = _states_key(layout, rank)
        found = self._sharded.get(key)
        if found is None:
            model, training, assume = self.model, self.training, DEFAULT_ASSUMPTIONS
            rp = rank_parameters(model, self.counts, layout, rank)
            sb = self._sb(layout.framework)
            trainable = (
                rp.dense + rp.expert
                if training.method is Method.FULL
                else lora_parameters(model, training, layout)
            )
            shards = (shard_degrees(layout, self.cluster)[0], trainable)
            buffers = mem.bucket_bytes(model, trainable, sb, layout, assume)
            buffers += mem.gathered_parameter_bytes(model, self.counts, rp, layout, sb, shards, assume)
            states = self.model_states(layout, rank)
            # the breakdown's first three (rounded) fields and their sum: an int, so exact in any order
            rounded = (
                math.ceil(states.parameters),
                math.ceil(states.gradients),
                math.ceil(states.optimizer_states),
            )
            found = (states, buffers, rounded, sum(rounded))
            self._sharded[key] = found
        return found

    def _activation_part(self, layout: Layout, rank: int) -> _ActivationPart:
        # activations (GPU, host) and the activation-sized buffers: they do not depend on the sharding
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
            rank,
        )
        found = self._activations.get(key)
        if found is None:
            model, training = self.model, self.training
            if layout.activation_offload:
                act_gpu, act_host = mem.activation_split(model, layout, training, rank)
            else:  # memory.activation_split without offload
                micro_batches = mem.micro_batches_per_step(layout, training)
                act_gpu, act_host = float(self._stage_activation_bytes(layout, rank, micro_batches)), 0.0
            pipeline = mem.pipeline_buffer_bytes(model, layout, training) + mem.dequantize_bytes(
                model, layout, training
            )
            loss = (
                activations.loss_workspace_bytes(model, layout, training) if rank == layout.pp - 1 else None
            )
            # memory.overhead_bytes less its fragmentation term: (context + NCCL) is summed first there
            # too, so adding fragmentation x dynamic later gives the same float
            assume = DEFAULT_ASSUMPTIONS
            fixed = assume.cuda_context_bytes + assume.nccl_bytes_per_group * mem.communicator_count(layout)
            found = (act_gpu, act_host, pipeline, loss, math.ceil(act_gpu), fixed)
            self._activations[key] = found
        return found

    def _layer_bytes(self, layout: Layout, moe_layer: bool) -> float:
        # activations.layer_bytes; the fields it (and local_tokens) reads
        key = (
            layout.framework,
            layout.tp,
            layout.sequence_parallel,
            layout.cp,
            layout.micro_batch_size,
            layout.recompute,
            moe_layer,
        )
        found = self._layer_bytes_memo.get(key)
        if found is None:
            found = activations.layer_bytes(self.model, layout, self.training, moe_layer)
            self._layer_bytes_memo[key] = found
        return found

    def _recompute_working_bytes(self, layout: Layout) -> float:
        # activations.recompute_working_bytes: the largest layer kind's bytes without recompute
        if layout.recompute is not Recompute.FULL:
            return 0.0
        key = (layout.framework, layout.tp, layout.sequence_parallel, layout.cp, layout.micro_batch_size)
        found = self._recompute_working.get(key)
        if found is None:
            no_recompute = dataclasses.replace(layout, recompute=Recompute.NONE)
            found = max(self._layer_bytes(no_recompute, moe) for moe in self.layer_kinds)
            self._recompute_working[key] = found
        return found

    def _stage_activation_bytes(self, layout: Layout, rank: int, micro_batches: int) -> int:
        # activations.stage_activation_bytes, the same terms in the same order, on memoised layers
        model, training = self.model, self.training
        layers_per_rank = model.num_layers / layout.pp
        dense = self._layer_bytes(layout, False)
        per_micro = layers_per_rank * dense
        if model.moe is not None:
            moe_share = (model.num_layers // model.moe.layer_frequency) / model.num_layers
            moe_delta = self._layer_bytes(layout, True) - dense
            per_micro += layers_per_rank * moe_share * moe_delta
        in_flight = activations.micro_batches_in_flight(layout, rank, micro_batches)
        total = per_micro * in_flight + self._recompute_working_bytes(layout)
        if rank == 0:
            total += activations.first_stage_extra_bytes(model, layout, training) * in_flight
        if rank == layout.pp - 1:
            total += activations.last_stage_extra_bytes(model, layout, training)
        return math.ceil(total)

    def _rank_memory(self, layout: Layout, rank: int) -> tuple[MemoryBreakdown, float, float]:
        # memory.rank_memory, its sums in the same order
        states, buffers, (parameters, gradients, optimizer_states), _ = self._sharded_part(layout, rank)
        act_gpu, act_host, pipeline, loss, act_rounded, fixed = self._activation_part(layout, rank)
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

    def _rank_numbers(self, layout: Layout, rank: int) -> tuple[int, float, float]:
        # _rank_memory's (breakdown.total, host, NVMe) without building the breakdown
        (
            states,
            buffers,
            _,
            states_total,
        ) = self._sharded_part(layout, rank)
        act_gpu, act_host, pipeline, loss, act_rounded, fixed = self._activation_part(layout, rank)
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

    def memory(self, layout: Layout) -> MemoryEstimate:
        """Equals ``memory.memory_estimate(model, cluster, layout, training)``."""
        self.memory_calls += 1
        breakdown, host, nvme = self._rank_memory(layout, 0)
        if layout.pp > 1:  # the larger of the first and the last stage, the first on a tie
            last, last_host, last_nvme = self._rank_memory(layout, layout.pp - 1)
            breakdown = last if last.total > breakdown.total else breakdown
            host, nvme = max(host, last_host), max(nvme, last_nvme)
        gpn = self.cluster.gpus_per_node
        return MemoryEstimate(
            per_gpu=breakdown,
            capacity_bytes=self.cluster.gpu.memory_bytes,
            cpu_per_node_bytes=math.ceil(host * gpn),
            nvme_per_node_bytes=math.ceil(nvme * gpn),
        )

    def memory_numbers(self, layout: Layout) -> tuple[int, int, int]:
        """``(per_gpu.total, cpu_per_node_bytes, nvme_per_node_bytes)`` of ``memory(layout)``: what a
        search needs to decide a fit, without the result objects. Counted in ``memory_calls``."""
        self.memory_calls += 1
        total, host, nvme = self._rank_numbers(layout, 0)
        if layout.pp > 1:
            last, last_host, last_nvme = self._rank_numbers(layout, layout.pp - 1)
            total = last if last > total else total
            host, nvme = max(host, last_host), max(nvme, last_nvme)
        gpn = self.cluster.gpus_per_node
        return total, math.ceil(host * gpn), math.ceil(nvme * gpn)

    def fits(self, layout: Layout, limit: int) -> bool:
        """``memory(layout).per_gpu.total <= limit`` and ``memory.host_fits`` (host RAM and NVMe per
        node within the cluster's, where stated), from ``memory_numbers``."""
        total, cpu, nvme = self.memory_numbers(layout)
        return total <= limit and host_numbers_fit(self.cluster, cpu, nvme)

    # ------------------------------------------------------------ time (step_time.time_estimate)

    def _stage_flops_of(self, model: ModelSpec, layout: Layout) -> tuple[int, ...]:
        found = self._stage_flops.get(layout.pp)
        if found is None:
            last = layout.pp - 1
            found = tuple(
                sum(self._layer_flops[i] for i in st.stage_layers(model, layout, s))
                + (self._logits_flops if s == last else 0)
                for s in range(layout.pp)
            )
            self._stage_flops[layout.pp] = found
        return found

    def _stored(self, layout: Layout) -> tuple[float, ...]:
        key = (layout.tp, layout.sequence_parallel)
        found = self._layer_stored.get(key)
        if found is None:
            found = tuple(
                st.layer_stored_bytes(self.model, layout, self.training, i)
                for i in range(self.model.num_layers)
            )
            self._layer_stored[key] = found
        return found

    def _stage_stored(self, layout: Layout, stage: int) -> float:
        # sum of layer_stored_bytes over the stage's layers, in layer order (as the estimator sums)
        key = (layout.tp, layout.sequence_parallel, layout.pp, stage)
        found = self._stage_stored_sums.get(key)
        if found is None:
            stored = self._stored(layout)
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

    def _links(self, layout: Layout) -> st.GroupLinks:
        key = (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep)
        found = self._group_links.get(key)
        if found is None:
            found = st.group_links(self.cluster, layout, self.curve)
            self._group_links[key] = found
        return found

    def _moe_layer_count(self, layout: Layout, stage: int) -> int:
        key = (layout.pp, stage)
        found = self._moe_layers.get(key)
        if found is None:
            layers = st.stage_layers(self.model, layout, stage)
            found = sum(1 for i in layers if is_moe_layer(self.model, i))
            self._moe_layers[key] = found
        return found

    def time(self, layout: Layout) -> TimeEstimate:
        """Equals ``step_time.time_estimate(model, cluster, layout, training, counts, curve)``."""
        self.time_calls += 1
        parts = self._parts(layout)
        params = self.gpu_parameters(layout)
        shard = params / (layout.dp * layout.cp) if layout.zero_stage >= 1 else params
        breakdown = TimeBreakdown(
            compute_s=parts.compute_s,
            recompute_s=parts.recompute_s,
            tp_comm_s=parts.tp_comm_s,
            cp_comm_s=parts.cp_comm_s,
            ep_comm_s=parts.ep_comm_s,
            pp_bubble_s=parts.pp_bubble_s,
            pp_comm_s=parts.pp_comm_s,
            dp_comm_exposed_s=self._dp_exposed_s(layout, parts, params),
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
            tokens_per_s=self.training.tokens_per_step / step_s,
            tflops_per_gpu=model_flops / (step_s * gpus) / 1e12,
            mfu=model_flops / (step_s * gpus * peak),
            hardware_tflops_per_gpu=hardware_flops / (step_s * gpus) / 1e12,
            hfu=hardware_flops / (step_s * gpus * peak),
        )

    def step_numbers(self, layout: Layout) -> tuple[float, float]:
        """``(step_s, tokens_per_s)`` of ``time(layout)``: what a search ranks by, without the result
        objects. Counted in ``time_calls``."""
        self.time_calls += 1
        parts = self._parts(layout)
        params = self.gpu_parameters(layout)
        shard = params / (layout.dp * layout.cp) if layout.zero_stage >= 1 else params
        step_s = (
            parts.before_dp_s
            + self._dp_exposed_s(layout, parts, params)
            + self._offload_s(layout, parts, shard)
            + self._optimizer_s(layout, shard)
        )
        return step_s, self.training.tokens_per_step / step_s

    def floor_s(self, layout: Layout) -> float:
        """``time(layout).step_s`` less its bubble, DP, offload and optimizer time (all >= 0): a lower
        bound on the bubble-free step of every sharding and framework with the same parts key."""
        p = self._parts(layout)
        return p.compute_s + p.recompute_s + p.tp_comm_s + p.cp_comm_s + p.ep_comm_s + p.pp_comm_s

    def _parts(self, layout: Layout) -> _Parts:
        key: _PartsKey = (*_base_key(layout), layout.recompute, layout.tp_comm_overlap)
        found = self._parts_cache.get(key)
        if found is None:
            found = self._make_parts(layout)
            self._parts_cache[key] = found
        return found

    def _make_parts(self, layout: Layout) -> _Parts:
        base = self._base(layout)
        s = self._context(layout, base.stage, base.micro_batches, base.flops_per_s, base.links)
        recompute = self._recompute_s(s)
        tp, ep = st.tp_comm_s(s), self._ep_comm_s(s)
        ideal = base.compute_s + recompute + tp + base.cp_comm_s + ep
        p, v = layout.pp, layout.virtual_pipeline_stages
        bubble = (p - 1) / (v * base.micro_batches) * ideal
        return _Parts(
            micro_batches=base.micro_batches,
            links=base.links,
            compute_s=base.compute_s,
            recompute_s=recompute,
            tp_comm_s=tp,
            cp_comm_s=base.cp_comm_s,
            ep_comm_s=ep,
            pp_bubble_s=bubble,
            pp_comm_s=base.pp_comm_s,
            before_dp_s=base.compute_s + recompute + tp + base.cp_comm_s + ep + bubble + base.pp_comm_s,
        )

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

    def _base(self, layout: Layout) -> _Base:
        # what neither recompute nor TP overlap changes: GEMM rate, compute, CP ring, PP sends
        key = _base_key(layout)
        found = self._bases.get(key)
        if found is not None:
            return found
        if not self._flops_ready:
            self._prepare_flops()
        model, cluster, training = self.model, self.cluster, self.training
        tokens = st.micro_batch_tokens_per_rank(layout, training)
        efficiency = matmul_efficiency(self.curve, cluster.gpu.name, model.hidden_size / layout.tp, tokens)
        work = self._stage_flops_of(model, layout)
        stage = work.index(max(work))
        micro_batches = layout.accumulation_steps(training.global_batch_size)
        flops_per_s, links = self._peak_flops_per_s * efficiency, self._links(layout)
        s = self._context(layout, stage, micro_batches, flops_per_s, links)
        found = _Base(
            stage=stage,
            micro_batches=micro_batches,
            flops_per_s=flops_per_s,
            links=links,
            compute_s=self._compute_s(s, work[stage]),
            cp_comm_s=st.cp_comm_s(s),
            pp_comm_s=st.pp_comm_s(s),
        )
        self._bases[key] = found
        return found

    def _memory_bound_s(self, s: st.StepContext, passes: float, stored: float) -> float:
        traffic = s.curve.memory_traffic_per_stored_byte * stored * passes
        return s.micro_batches * s.tokens * traffic / s.cluster.gpu.hbm_bandwidth_bytes_per_s

    def _compute_s(self, s: st.StepContext, per_token: int) -> float:
        gemm_s = s.micro_batches * s.tokens * per_token / s.layout.tp / s.flops_per_s
        stored = self._stage_stored(s.layout, s.stage)
        return gemm_s + self._memory_bound_s(s, 3, stored) + st.loss_s(s)

    def _recompute_s(self, s: st.StepContext) -> float:
        recompute = s.layout.recompute
        per_token = self._stage_recompute_flops(s.layout, s.stage)
        gemm_s = s.micro_batches * s.tokens * per_token / s.layout.tp / s.flops_per_s
        stored = 0.0
        if recompute is Recompute.FULL:
            stored = self._stage_stored(s.layout, s.stage)
        elif recompute is Recompute.SELECTIVE and s.training.attention is Attention.EAGER:
            heads = s.model.num_attention_heads / s.layout.tp
            layers = len(st.stage_layers(s.model, s.layout, s.stage))
            stored = layers * 5 * heads * s.training.seq_len * st.activation_bytes(s.training.precision) / 2
        return gemm_s + self._memory_bound_s(s, st.RECOMPUTE_PASSES[recompute], stored)

    def _ep_comm_s(self, s: st.StepContext) -> float:
        moe = s.model.moe
        if moe is None or s.layout.ep == 1:
            return 0.0
        tokens = s.tokens / (s.layout.tp if s.layout.sequence_parallel else 1)
        size_bytes = tokens * moe.top_k * s.model.hidden_size * st.activation_bytes(s.training.precision)
        collectives = 4 + (2 if s.layout.recompute is Recompute.FULL else 0)
        one = comm.group_all_to_all_s(size_bytes, s.links.ep)
        return s.micro_batches * self._moe_layer_count(s.layout, s.stage) * collectives * one

    def _dp_collective_s(self, layout: Layout, links: st.GroupLinks, params: float) -> tuple[float, float]:
        # _dp_exposed_s' collective times, before overlap: they depend on the sharding and the
        # framework (gradient bytes) only. ZeRO-3: (gathers + reduce-scatter per micro-batch, 0);
        # else (gradient reduction, parameter all-gather).
        key = (layout.dp, layout.tp, layout.pp, layout.cp, layout.ep, layout.zero_stage, layout.framework)
        found = self._dp_collectives.get(key)
        if found is not None:
            return found
        training, dp_link = self.training, links.dp
        full = training.method is Method.FULL
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
        self._dp_collectives[key] = found
        return found

    def _dp_exposed_s(self, layout: Layout, parts: _Parts, params: float) -> float:
        curve = self.curve
        compute = parts.compute_s + parts.recompute_s
        if layout.zero_stage == 3:
            per_micro_batch_s = self._dp_collective_s(layout, parts.links, params)[0]
            return st.exposed_s(
                parts.micro_batches * per_micro_batch_s, compute, curve.zero3_prefetch_hidden_fraction
            )
        reduce, gather = self._dp_collective_s(layout, parts.links, params)
        overlapped = (
            layout.overlap_grad_reduce
            if layout.overlap_grad_reduce is not None
            else dp_overlap_default(curve, layout.framework)
        )
        reductions = st.gradient_reductions(layout, parts.micro_batches)
        if not overlapped:
            return reductions * reduce + gather
        per_micro_batch = compute / parts.micro_batches
        hidden = curve.dp_overlap_max_hidden_fraction
        return reductions * st.exposed_s(reduce, 2 / 3 * per_micro_batch, hidden) + st.exposed_s(
            gather, per_micro_batch / 3, hidden
        )

    def _offload_s(self, layout: Layout, parts: _Parts, shard: float) -> float:
        cluster, curve = self.cluster, self.curve
        pcie = cluster.gpu.pcie_bandwidth_bytes_per_s
        seconds = 0.0
        if layout.offload_optimizer is not Offload.NONE:
            seconds += shard * (2 + 2) / pcie
        if layout.offload_optimizer is Offload.NVME:
            node_bytes = shard * cluster.gpus_per_node * 2 * 12
            seconds += node_bytes / curve.nvme_bandwidth_bytes_per_s_per_node
        if layout.offload_params is not Offload.NONE:
            fetch_s = parts.micro_batches * 2 * 2 * shard / pcie
            seconds += st.exposed_s(fetch_s, parts.compute_s, curve.zero3_prefetch_hidden_fraction)
        return seconds

    def _optimizer_s(self, layout: Layout, shard: float) -> float:
        if self.training.method is not Method.FULL:
            return 0.0
        if layout.offload_optimizer is not Offload.NONE:
            return shard * self.cluster.gpus_per_node / self.curve.cpu_adam_params_per_s_per_node
        step_bytes = shard * st.OPTIMIZER_STEP_BYTES[self.training.optimizer]
        return step_bytes / self.cluster.gpu.hbm_bandwidth_bytes_per_s


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
