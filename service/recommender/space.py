"""The layouts a job could use: divisor generators, divisibility rules, framework capabilities.

A layout is built in three layers, each generated lazily and pruned as early as possible:

* a ``Structure``: how ``gpus`` split into dp x tp x pp x cp (and ep inside dp x cp). Rules
  (Megatron-LM ``validate_args``, torchtitan ``ParallelDims``): tp divides the attention and kv heads
  and stays inside a node (Narayanan et al. arXiv:2104.04473 §3.3: "keep TP inside a server"),
  pp divides the layers, cp splits the sequence into 2 cp chunks, ep divides the experts and
  dp x cp, and dp divides the global batch;
* a ``Sharding``: framework, ZeRO stage / FSDP mode and offload, only as
  ``validate.FRAMEWORK_CAPABILITIES`` allows (the capability table stays data, in the estimator);
* memory knobs (recompute, interleaving) and the micro-batch, chosen by the search.

Sequence parallelism is switched on whenever tp > 1 where the framework has it: it shards what plain
TP replicates at the same communication time (Korthikanti et al. arXiv:2205.05198 §4.2.2), so it
never loses. Megatron-LM has ``--sequence-parallel`` and torchtitan's TP plan shards the norms with
``SequenceParallel`` (``parallelism.enable_sequence_parallel``, default on); DeepSpeed AutoTP has
no such mode, so its TP layouts keep the norm and dropout activations replicated.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from service.estimator.errors import InvalidLayout
from service.estimator.types import (
    Attention,
    ClusterSpec,
    Framework,
    Layout,
    ModelSpec,
    Offload,
    Recompute,
    TrainingSpec,
)
from service.estimator.validate import FRAMEWORK_CAPABILITIES, validate_layout

MAX_CP = 32  # context parallelism beyond 32 ranks only pays off past the catalog's context lengths
MAX_VIRTUAL_STAGES = 8  # interleaving deeper than 8 chunks costs more p2p than its bubble saves
RECOMPUTE_ORDER = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)  # fastest first


@dataclass(frozen=True, slots=True)
class FrameworkFlags:
    """Switches the search turns on for a framework because they only save time."""

    overlap_grad_reduce: bool | None  # None: the framework default
    tp_comm_overlap: bool  # needs tp > 1 and sequence parallelism
    sequence_parallel: bool  # the framework shards norm/dropout activations over TP


# Megatron-Core: --overlap-grad-reduce --overlap-param-gather, and --tp-comm-overlap
# (Transformer Engine userbuffers; needs --sequence-parallel). DeepSpeed: overlap_comm in the ZeRO
# optimizer (stages 1-3, not under the pipeline engine; see make_layout). PyTorch DDP/FSDP
# already overlap. The launchers render exactly these flags, so the estimate is of the same job.
FRAMEWORK_FLAGS: dict[Framework, FrameworkFlags] = {
    Framework.MEGATRON: FrameworkFlags(
        overlap_grad_reduce=True, tp_comm_overlap=True, sequence_parallel=True
    ),
    Framework.DEEPSPEED: FrameworkFlags(
        overlap_grad_reduce=True, tp_comm_overlap=False, sequence_parallel=False
    ),
    Framework.FSDP: FrameworkFlags(overlap_grad_reduce=None, tp_comm_overlap=False, sequence_parallel=True),
}


def _overlap_grad_reduce(flags: FrameworkFlags, structure: Structure, sharding: Sharding) -> bool | None:
    if sharding.framework is Framework.DEEPSPEED and (sharding.zero_stage == 0 or structure.pp > 1):
        # Stage 0 reduces after backward; the PipelineEngine forces overlap_comm off (stage <= 2).
        return None
    return flags.overlap_grad_reduce


@functools.cache
def divisors(n: int) -> tuple[int, ...]:
    """Positive divisors of ``n``, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}))


def gpu_counts(cluster: ClusterSpec, max_gpus: int | None = None) -> tuple[int, ...]:
    """GPU counts a job may use: divisors of one node, then whole nodes (3-smooth counts past 16)."""
    gpn, nodes = cluster.gpus_per_node, cluster.num_nodes
    limit = min(cluster.world_size, max_gpus or cluster.world_size)
    within = [d for d in divisors(gpn) if d < gpn]
    node_counts = [k for k in range(1, nodes + 1) if k <= 16 or _three_smooth(k) or k == nodes]
    return tuple(n for n in (*within, *(k * gpn for k in node_counts)) if n <= limit)


def _three_smooth(k: int) -> bool:
    while k % 2 == 0:
        k //= 2
    while k % 3 == 0:
        k //= 3
    return k == 1


# ---------------------------------------------------------------- rejections


@dataclass(slots=True)
class RejectionGroup:
    count: int
    example: Layout
    detail: str
    per_gpu_bytes: int | None = None
    capacity_bytes: int | None = None


@dataclass(slots=True)
class RejectionLog:
    """Counts per reason, keeping one worked example each (the closest miss for memory)."""

    groups: dict[str, RejectionGroup] = field(default_factory=dict)

    def add(self, reason: str, count: int, example: Layout, detail: str) -> None:
        group = self.groups.get(reason)
        if group is None:
            self.groups[reason] = RejectionGroup(count, example, detail)
        else:
            group.count += count

    def add_memory(self, reason: str, count: int, example: Layout, need: int, capacity: int) -> None:
        group = self.groups.get(reason)
        over = (need - capacity) / 2**30
        detail = (
            f"needs {need / 2**30:.1f} GiB per GPU, {capacity / 2**30:.1f} GiB allowed ({over:.1f} GiB over)"
        )
        if group is None:
            self.groups[reason] = RejectionGroup(count, example, detail, need, capacity)
            return
        group.count += count
        if group.per_gpu_bytes is not None and need < group.per_gpu_bytes:
            group.example, group.detail, group.per_gpu_bytes = example, detail, need


def _rule_example(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, layout: Layout
) -> tuple[str, str]:
    """The validator's rule slug and message for an invalid layout."""
    try:
        validate_layout(model, cluster, layout, training)
    except InvalidLayout as error:
        return f"invalid: {error.rule}", str(error)
    return "invalid: tp_node", "tensor parallelism across nodes"


# ---------------------------------------------------------------- structures


@dataclass(frozen=True, slots=True)
class Structure:
    gpus: int
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int


def _structure_rule(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, tp: int, pp: int, cp: int, dp: int
) -> str | None:
    # the first rule a (tp, pp, cp, dp) split breaks, or None
    if tp > cluster.gpus_per_node:
        return "tp_node"
    if model.num_attention_heads % tp or model.num_kv_heads % tp:
        return "heads_tp"
    if model.num_layers % pp:
        return "pp_layers"
    if cp > 1 and (training.seq_len % (2 * cp) or cp > MAX_CP or training.attention is Attention.EAGER):
        return "cp_seq"
    if training.global_batch_size % dp:
        return "global_batch"
    return None


def structures(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, gpus: int, log: RejectionLog
) -> Iterator[Structure]:
    """Every valid split of ``gpus`` GPUs, tp ascending within pp ascending; invalid ones are logged."""
    used = sub_cluster(cluster, gpus)
    for pp in divisors(gpus):
        for tp in divisors(gpus // pp):
            for cp in divisors(gpus // (pp * tp)):
                dp = gpus // (pp * tp * cp)
                rule = _structure_rule(model, cluster, training, tp, pp, cp, dp)
                if rule is not None:
                    if rule != "pp_layers" or pp <= model.num_layers:
                        _log_rule(model, used, training, log, rule, Layout(dp=dp, tp=tp, pp=pp, cp=cp))
                    continue
                for ep in _ep_options(model, dp * cp):
                    yield Structure(gpus=gpus, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)


def _log_rule(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    log: RejectionLog,
    rule: str,
    layout: Layout,
) -> None:
    reason = f"invalid: {rule}"
    if reason in log.groups:
        log.groups[reason].count += 1
        return
    if rule == "tp_node":
        detail = (
            f"tp ({layout.tp}) > GPUs per node ({cluster.gpus_per_node}): TP all-reduces would cross nodes"
        )
    elif rule == "cp_seq" and layout.cp > MAX_CP:
        detail = f"cp ({layout.cp}) > {MAX_CP}"
    else:
        reason, detail = _rule_example(model, cluster, training, layout)
        reason = f"invalid: {rule}" if reason == "invalid: tp_node" else reason
    log.add(reason, 1, layout, detail)


def _ep_options(model: ModelSpec, dp_cp: int) -> tuple[int, ...]:
    if model.moe is None:
        return (1,)
    return tuple(e for e in divisors(model.moe.num_experts) if dp_cp % e == 0)


# ---------------------------------------------------------------- shardings


@dataclass(frozen=True, slots=True)
class Sharding:
    framework: Framework
    zero_stage: int
    offload_optimizer: Offload = Offload.NONE
    offload_params: Offload = Offload.NONE

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer is not Offload.NONE or self.offload_params is not Offload.NONE


def shardings(framework: Framework, structure: Structure, offload: bool) -> tuple[list[Sharding], list[str]]:
    """What ``framework`` supports for this structure, and what it does not (for the rejection log)."""
    caps = FRAMEWORK_CAPABILITIES[framework]
    ok: list[Sharding] = []
    unsupported: list[str] = []
    for stage in (0, 1, 2, 3):
        if stage not in caps.zero_stages:
            unsupported.append(f"{framework.value} does not support zero_stage {stage}")
            continue
        if structure.pp > 1 and stage > caps.max_zero_stage_with_pp:
            unsupported.append(f"{framework.value} does not support zero_stage {stage} with pp > 1")
            continue
        if stage > 0 and structure.dp * structure.cp == 1:
            continue  # nothing to shard over: same as stage 0
        ok.append(Sharding(framework, stage))
        if offload:
            ok.extend(_offloads(framework, stage))
    return ok, unsupported


def _offloads(framework: Framework, stage: int) -> list[Sharding]:
    caps = FRAMEWORK_CAPABILITIES[framework]
    out: list[Sharding] = []
    if stage == 0:
        return out
    for device in sorted(caps.offload_devices, key=lambda d: d is Offload.NVME):
        if framework is Framework.FSDP:
            if stage == 3 and caps.param_offload:
                out.append(Sharding(framework, stage, device, device))
            continue
        out.append(Sharding(framework, stage, device))
        if stage == 3 and caps.param_offload:
            out.append(Sharding(framework, stage, device, device))
    return out


def virtual_stages(model: ModelSpec, framework: Framework, pp: int) -> tuple[int, ...]:
    """Interleaving depths to try: 1, and chunkings of each stage's layers where supported."""
    if pp == 1 or not FRAMEWORK_CAPABILITIES[framework].interleaved_pipeline:
        return (1,)
    per_stage = model.num_layers // pp
    return tuple(v for v in divisors(per_stage) if v <= MAX_VIRTUAL_STAGES)


def micro_batch_sizes(
    training: TrainingSpec, structure: Structure, virtual: int, sequence_parallel: bool
) -> tuple[int, ...]:
    """Valid micro-batches: divide the per-replica batch; interleaving needs m % pp == 0."""
    per_replica = training.global_batch_size // structure.dp
    out = []
    for b in divisors(per_replica):
        m = per_replica // b
        if virtual > 1 and m % structure.pp:
            continue
        if sequence_parallel and (training.seq_len * b) % structure.tp:
            continue
        out.append(b)
    return tuple(out)


def make_layout(
    structure: Structure, sharding: Sharding, recompute: Recompute, virtual: int, micro_batch: int
) -> Layout:
    flags = FRAMEWORK_FLAGS[sharding.framework]
    sp = structure.tp > 1 and flags.sequence_parallel
    return Layout(
        framework=sharding.framework,
        dp=structure.dp,
        tp=structure.tp,
        pp=structure.pp,
        cp=structure.cp,
        ep=structure.ep,
        sequence_parallel=sp,
        zero_stage=sharding.zero_stage,
        offload_optimizer=sharding.offload_optimizer,
        offload_params=sharding.offload_params,
        recompute=recompute,
        micro_batch_size=micro_batch,
        virtual_pipeline_stages=virtual,
        tp_comm_overlap=flags.tp_comm_overlap and sp,
        overlap_grad_reduce=_overlap_grad_reduce(flags, structure, sharding),
    )


def sub_cluster(cluster: ClusterSpec, gpus: int) -> ClusterSpec:
    """The part of ``cluster`` a job of ``gpus`` GPUs runs on (whole nodes, or part of one)."""
    gpn = cluster.gpus_per_node
    return ClusterSpec(
        gpu=cluster.gpu,
        num_nodes=max(1, gpus // gpn),
        gpus_per_node=min(gpus, gpn),
        intra_node_bandwidth_bytes_per_s=cluster.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=cluster.inter_node_bandwidth_bytes_per_s,
        cpu_memory_bytes_per_node=cluster.cpu_memory_bytes_per_node,
        nvme_bytes_per_node=cluster.nvme_bytes_per_node,
    )
