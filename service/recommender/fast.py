"""The estimator's memory and step-time numbers for one job, many layouts, fast.

``memory_estimate`` and ``time_estimate`` recompute everything that depends only on the model
(parameter counts, per-layer FLOPs, per-stage sums) on every call: O(layers) work, ~1-5 ms for a
126-layer model. A search asks for thousands of layouts of the *same* job, so ``Evaluator`` holds
those sums once and memoises what depends on fewer inputs than a full layout (model states by
sharding, per-stage sums by pp). It composes the estimator's own part functions in the same order,
so its numbers equal ``estimate()``'s; ``tests/recommender/test_space.py`` checks that equality on
a sample of layouts. The recommender still runs ``estimate()`` on what it returns.
"""

from __future__ import annotations

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

# Layout fields model states depend on (not micro-batch, recompute, interleaving or SP).
_StatesKey = tuple[Framework, int, int, int, int, int, int, Offload, Offload, bool, int]


def _states_key(layout: Layout, rank: int) -> _StatesKey:
    return (
        layout.framework,
        layout.dp,
        layout.tp,
        layout.pp,
        layout.cp,
        layout.ep,
        layout.zero_stage,
        layout.offload_optimizer,
        layout.offload_params,
        layout.fsdp_hybrid_shard,
        rank,
    )


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
    _stage_params: dict[int, int] = field(default_factory=dict)
    _layer_stored: dict[tuple[int, bool], tuple[float, ...]] = field(default_factory=dict)
    _moe_layers: dict[tuple[int, int], int] = field(default_factory=dict)
    _flops_ready: bool = False

    def __post_init__(self) -> None:
        self.counts = parameter_counts(self.model)
        self._flops_ready = False

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

    def _rank_memory(self, layout: Layout, rank: int) -> tuple[MemoryBreakdown, float, float]:
        model, training, assume = self.model, self.training, DEFAULT_ASSUMPTIONS
        states = self.model_states(layout, rank)
        rp = rank_parameters(model, self.counts, layout, rank)
        sb = self._sb(layout.framework)
        trainable = (
            rp.dense + rp.expert
            if training.method is Method.FULL
            else lora_parameters(model, training, layout)
        )
        act_gpu, act_host = mem.activation_split(model, layout, training, rank)
        shards = (shard_degrees(layout, self.cluster)[0], trainable)
        buffers = mem.bucket_bytes(trainable, sb, layout, assume)
        buffers += mem.gathered_parameter_bytes(model, self.counts, rp, layout, sb, shards, assume)
        buffers += mem.pipeline_buffer_bytes(model, layout, training) + mem.dequantize_bytes(
            model, layout, training
        )
        if rank == layout.pp - 1:
            buffers += activations.loss_workspace_bytes(model, layout, training)
        breakdown = MemoryBreakdown(
            parameters=math.ceil(states.parameters),
            gradients=math.ceil(states.gradients),
            optimizer_states=math.ceil(states.optimizer_states),
            activations=math.ceil(act_gpu),
            buffers=math.ceil(buffers),
            overhead=math.ceil(mem.overhead_bytes(layout, act_gpu + buffers, assume)),
        )
        return breakdown, states.host_bytes + act_host, states.nvme_bytes

    def memory(self, layout: Layout) -> MemoryEstimate:
        """Equals ``memory.memory_estimate(model, cluster, layout, training)``."""
        self.memory_calls += 1
        ranks = sorted({0, layout.pp - 1})
        results = [self._rank_memory(layout, r) for r in ranks]
        breakdown = max((r[0] for r in results), key=lambda b: b.total)
        gpn = self.cluster.gpus_per_node
        return MemoryEstimate(
            per_gpu=breakdown,
            capacity_bytes=self.cluster.gpu.memory_bytes,
            cpu_per_node_bytes=math.ceil(max(r[1] for r in results) * gpn),
            nvme_per_node_bytes=math.ceil(max(r[2] for r in results) * gpn),
        )

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

    def gpu_parameters(self, layout: Layout) -> float:
        """Equals ``step_time.gpu_parameters``."""
        stage_params = self._stage_params.get(layout.pp)
        if stage_params is None:
            stage_params = max(stage_parameter_counts(self.model, layout.pp))
            self._stage_params[layout.pp] = stage_params
        experts = self.counts.experts_per_moe_layer * math.ceil(self.counts.moe_layers / layout.pp)
        return ((stage_params - experts) + experts / layout.ep) / layout.tp

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
        if not self._flops_ready:
            self._prepare_flops()
        model, cluster, training, curve = self.model, self.cluster, self.training, self.curve
        overlap = st.CommOverlap(tp=layout.tp_comm_overlap, dp=layout.overlap_grad_reduce)
        tokens = st.micro_batch_tokens_per_rank(layout, training)
        efficiency = matmul_efficiency(curve, cluster.gpu.name, model.hidden_size / layout.tp, tokens)
        work = self._stage_flops_of(model, layout)
        stage = work.index(max(work))
        peak = st.peak_flops_per_s(cluster, training.precision)
        step = st.StepContext(
            model=model,
            cluster=cluster,
            layout=layout,
            training=training,
            counts=self.counts,
            curve=curve,
            overlap=overlap,
            stage=stage,
            micro_batches=layout.accumulation_steps(training.global_batch_size),
            flops_per_s=peak * efficiency,
            links=st.group_links(cluster, layout, curve),
        )
        breakdown = self._breakdown(step, work[stage])
        step_s = breakdown.step_s
        gpus = layout.world_size
        model_flops = self._model_flops_step
        hardware_flops = self._hardware_flops_step[layout.recompute]
        return TimeEstimate(
            breakdown=breakdown,
            tokens_per_s=training.tokens_per_step / step_s,
            tflops_per_gpu=model_flops / (step_s * gpus) / 1e12,
            mfu=model_flops / (step_s * gpus * peak),
            hardware_tflops_per_gpu=hardware_flops / (step_s * gpus) / 1e12,
            hfu=hardware_flops / (step_s * gpus * peak),
        )

    def _memory_bound_s(self, s: st.StepContext, passes: float, stored: float) -> float:
        traffic = s.curve.memory_traffic_per_stored_byte * stored * passes
        return s.micro_batches * s.tokens * traffic / s.cluster.gpu.hbm_bandwidth_bytes_per_s

    def _compute_s(self, s: st.StepContext, per_token: int) -> float:
        gemm_s = s.micro_batches * s.tokens * per_token / s.layout.tp / s.flops_per_s
        layers = st.stage_layers(s.model, s.layout, s.stage)
        stored = sum(self._stored(s.layout)[i] for i in layers)
        if s.stage == s.layout.pp - 1:
            stored += st.logits_stored_bytes(s.model, s.layout)
        return gemm_s + self._memory_bound_s(s, 3, stored)

    def _recompute_s(self, s: st.StepContext) -> float:
        recompute = s.layout.recompute
        layers = st.stage_layers(s.model, s.layout, s.stage)
        per_token = sum(self._recompute_flops[recompute][i] for i in layers)
        gemm_s = s.micro_batches * s.tokens * per_token / s.layout.tp / s.flops_per_s
        stored = 0.0
        if recompute is Recompute.FULL:
            stored = sum(self._stored(s.layout)[i] for i in layers)
        elif recompute is Recompute.SELECTIVE and s.training.attention is Attention.EAGER:
            heads = s.model.num_attention_heads / s.layout.tp
            stored = (
                len(layers) * 5 * heads * s.training.seq_len * st.activation_bytes(s.training.precision) / 2
            )
        return gemm_s + self._memory_bound_s(s, 1, stored)

    def _ep_comm_s(self, s: st.StepContext) -> float:
        moe = s.model.moe
        if moe is None or s.layout.ep == 1:
            return 0.0
        tokens = s.tokens / (s.layout.tp if s.layout.sequence_parallel else 1)
        size_bytes = tokens * moe.top_k * s.model.hidden_size * st.activation_bytes(s.training.precision)
        collectives = 4 + (2 if s.layout.recompute is Recompute.FULL else 0)
        one = comm.group_all_to_all_s(size_bytes, s.links.ep)
        return s.micro_batches * self._moe_layer_count(s.layout, s.stage) * collectives * one

    def _dp_exposed_s(self, s: st.StepContext, compute: float, params: float) -> float:
        training, layout, links = s.training, s.layout, s.links
        full = training.method is Method.FULL
        grad_size = params * st.grad_bytes(training.precision, layout.framework)
        if layout.zero_stage == 3:
            gathers = 2 * comm.group_all_gather_s(params * st.activation_bytes(training.precision), links.dp)
            reduce3 = comm.group_reduce_scatter_s(grad_size, links.dp) if full else 0.0
            return st.exposed_s(
                s.micro_batches * (gathers + reduce3), compute, s.curve.zero3_prefetch_hidden_fraction
            )
        reduce = 0.0
        if full:
            reduce = (
                comm.group_all_reduce_s(grad_size, links.dp)
                if layout.zero_stage == 0
                else comm.group_reduce_scatter_s(grad_size, links.dp)
            )
        gather = 0.0
        if full and layout.zero_stage in (1, 2):
            size = params * st.activation_bytes(training.precision)
            gather = comm.group_all_gather_s(size, links.dp)
        overlapped = (
            s.overlap.dp if s.overlap.dp is not None else dp_overlap_default(s.curve, layout.framework)
        )
        if not overlapped:
            return reduce + gather
        per_micro_batch = compute / s.micro_batches
        hidden = s.curve.dp_overlap_max_hidden_fraction
        return st.exposed_s(reduce, 2 / 3 * per_micro_batch, hidden) + st.exposed_s(
            gather, per_micro_batch / 3, hidden
        )

    def _offload_s(self, s: st.StepContext, shard: float, compute: float) -> float:
        pcie = s.cluster.gpu.pcie_bandwidth_bytes_per_s
        seconds = 0.0
        if s.layout.offload_optimizer is not Offload.NONE:
            seconds += shard * (2 + 2) / pcie
        if s.layout.offload_optimizer is Offload.NVME:
            node_bytes = shard * s.cluster.gpus_per_node * 2 * 12
            seconds += node_bytes / s.curve.nvme_bandwidth_bytes_per_s_per_node
        if s.layout.offload_params is not Offload.NONE:
            fetch_s = s.micro_batches * 2 * 2 * shard / pcie
            seconds += st.exposed_s(fetch_s, compute, s.curve.zero3_prefetch_hidden_fraction)
        return seconds

    def _optimizer_s(self, s: st.StepContext, shard: float) -> float:
        if s.training.method is not Method.FULL:
            return 0.0
        if s.layout.offload_optimizer is not Offload.NONE:
            return shard * s.cluster.gpus_per_node / s.curve.cpu_adam_params_per_s_per_node
        step_bytes = shard * st.OPTIMIZER_STEP_BYTES[s.training.optimizer]
        return step_bytes / s.cluster.gpu.hbm_bandwidth_bytes_per_s

    def _breakdown(self, s: st.StepContext, per_token: int) -> TimeBreakdown:
        compute = self._compute_s(s, per_token)
        recompute = self._recompute_s(s)
        tp, cp, ep = st.tp_comm_s(s), st.cp_comm_s(s), self._ep_comm_s(s)
        ideal = compute + recompute + tp + cp + ep
        p, v = s.layout.pp, s.layout.virtual_pipeline_stages
        params = self.gpu_parameters(s.layout)
        shard = params / (s.layout.dp * s.layout.cp) if s.layout.zero_stage >= 1 else params
        return TimeBreakdown(
            compute_s=compute,
            recompute_s=recompute,
            tp_comm_s=tp,
            cp_comm_s=cp,
            ep_comm_s=ep,
            pp_bubble_s=(p - 1) / (v * s.micro_batches) * ideal,
            pp_comm_s=st.pp_comm_s(s),
            dp_comm_exposed_s=self._dp_exposed_s(s, compute + recompute, params),
            offload_s=self._offload_s(s, shard, compute),
            optimizer_s=self._optimizer_s(s, shard),
        )
