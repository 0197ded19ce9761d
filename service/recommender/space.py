"""The layouts a job could use: divisor generators, divisibility rules, framework capabilities.

A layout is built in three layers, each generated lazily and pruned as early as possible:

* a ``Structure``: how ``gpus`` split into dp x tp x pp x cp (and ep inside dp x cp). Rules
  (Megatron-LM ``validate_args``, torchtitan ``ParallelDims``): tp divides the attention and kv heads
  and stays inside a node (Narayanan et al. arXiv:2104.04473 §3.3: "keep TP inside a server"),
  pp divides the layers, cp splits the sequence into 2 cp chunks, ep divides the experts and
  dp x cp (or, with Megatron's etp 1, tp x dp x cp), and dp divides the global batch;
* a ``Sharding``: framework, ZeRO stage / FSDP mode and offload, only as the framework's
  capabilities allow (``service.frameworks.FRAMEWORKS``: its capabilities, the estimator's own
  table, and the flags the search turns on);

every rule is the validator's own (``service.estimator.validate``), called at the level where its
fields are chosen; only keeping TP inside a node and ``max_cp`` are the search's policy;
* memory knobs (recompute, interleaving) and the micro-batch, chosen by the search.

Sequence parallelism is switched on whenever tp > 1 where the framework has it: it shards what plain
TP replicates at the same communication time (Korthikanti et al. arXiv:2205.05198 §4.2.2), so it
never loses. Megatron-LM has ``--sequence-parallel`` and torchtitan's TP plan shards the norms with
``SequenceParallel`` (``parallelism.enable_sequence_parallel``, default on); DeepSpeed AutoTP has
no such mode, so its TP layouts keep the norm and dropout activations replicated.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from service.estimator.errors import InvalidLayout
from service.estimator.job import Job
from service.estimator.memory import (
    fragmentation_bytes,
    min_gradient_bytes_per_gpu,
    min_state_bytes_per_gpu,
    stage_activations,
)
from service.estimator.types import (
    ClusterSpec,
    Compile,
    Framework,
    GPUSpec,
    Layout,
    Method,
    ModelSpec,
    Offload,
    Optimizer,
    Precision,
    Recompute,
    TrainingSpec,
)
from service.estimator.validate import (
    FRAMEWORK_CAPABILITIES,
    batch_split_violation,
    context_violation,
    divisors,
    expert_violation,
    method_parallel_violation,
    pipeline_split_violation,
    sharding_violation,
    tensor_parallel_violation,
    valid_micro_batch_sizes,
    validate_layout,
    zero_with_expert_parallel_violation,
    zero_with_pipeline_violation,
)
from service.frameworks import (
    FRAMEWORKS,
    FrameworkFlags,
    Target,
    sequence_parallel_default,
    tp_comm_overlap_default,
)
from service.launchers import data_parallel_only, framework_job_refusal, framework_structure_refusal

MAX_CP = 32  # context parallelism beyond 32 ranks only pays off past the catalog's context lengths
# ... and past them, as many ranks as keep this many tokens each: at the longest sequence a request may
# give (4,194,304) no layout of cp <= 32 fit 405B where cp 64 on 4,096 H100s does (boundary review)
CP_TOKENS_PER_RANK = 32_768


def max_cp(seq_len: int) -> int:
    """The largest context-parallel degree the search tries at this sequence length: ``MAX_CP``, or
    more where each rank still keeps ``CP_TOKENS_PER_RANK`` tokens."""
    return max(MAX_CP, seq_len // CP_TOKENS_PER_RANK)


# Splits the search leaves out by its own choice, not a rule: an estimate of one answers. (They were
# logged "invalid: tp_node" and "invalid: cp_seq", the latter the name of the validator's sequence
# rule, though the estimate accepted both: a recommendation review.)
TP_ACROSS_NODES = "not searched: tp across nodes"
CP_PAST_MAX = "not searched: cp past the largest tried"
MAX_VIRTUAL_STAGES = 8  # interleaving deeper than 8 chunks costs more p2p than its bubble saves
# fastest first: core attention only, then the matmuls per-op AC does not save, then whole layers
RECOMPUTE_COST_ORDER = (Recompute.NONE, Recompute.SELECTIVE, Recompute.SELECTIVE_OP, Recompute.FULL)


@functools.cache
def recompute_order(framework: Framework) -> tuple[Recompute, ...]:
    """The framework's recompute policies, fastest first."""
    modes = FRAMEWORKS[framework].capabilities.recompute_modes
    return tuple(mode for mode in RECOMPUTE_COST_ORDER if mode in modes)


def _overlap_grad_reduce(flags: FrameworkFlags, structure: Structure, sharding: Sharding) -> bool | None:
    if structure.dp * structure.cp == 1:
        return None  # no gradient reduction
    if flags.overlap_grad_reduce_needs_zero_without_pp and (sharding.zero_stage == 0 or structure.pp > 1):
        # DeepSpeed: stage 0 reduces after backward; the PipelineEngine forces overlap_comm off.
        return None
    return flags.overlap_grad_reduce


def gpu_counts(cluster: ClusterSpec, max_gpus: int | None = None) -> tuple[int, ...]:
    """GPU counts a job may use: divisors of one node, and a ``max_gpus`` inside one node (dp 3 x tp 2
    of 6 GPUs on an 8-GPU node: a plan capped at 6 used 4, saying no larger count had a split; search
    optimality review), then whole nodes (3-smooth counts past 16)."""
    gpn, nodes = cluster.gpus_per_node, cluster.num_nodes
    limit = min(cluster.world_size, max_gpus or cluster.world_size)
    within = sorted({*(d for d in divisors(gpn) if d < gpn), *([limit] if limit < gpn else [])})
    node_counts = sorted({*range(1, min(nodes, 16) + 1), *three_smooth_up_to(nodes), nodes})
    return tuple(n for n in (*within, *(k * gpn for k in node_counts)) if n <= limit)


def three_smooth_up_to(n: int) -> list[int]:
    """Every 2^a 3^b <= n (a few dozen even for a million nodes; generated, not searched for)."""
    found, power3 = [], 1
    while power3 <= n:
        value = power3
        while value <= n:
            found.append(value)
            value *= 2
        power3 *= 3
    return found


# ---------------------------------------------------------------- rejections


@dataclass(slots=True)
class RejectionGroup:
    count: int
    example: Layout
    detail: str
    per_gpu_bytes: int | None = None
    allowed_bytes: int | None = None  # what the example was compared with: the card less the headroom
    # memory: whether a requested launcher runs the example (None: not asked, as for a bound's)
    example_runs: bool | None = None


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

    def add_memory(
        self,
        reason: str,
        count: int,
        example: Layout,
        need: int,
        capacity: int,
        what: str = "needs",
        runs: Callable[[], bool] | None = None,
        also: str = "",
    ) -> None:
        """Count a memory miss; its example is the closest miss, one a requested launcher runs
        where any does (``runs``, asked only when it decides: the closest a user cannot run tells
        them nothing to change). Without ``runs`` (a bound, or a search that reads no example),
        the closest of all. ``also``: what else it misses, said after the GPU's figures (the host RAM
        an offloading layout needs beyond what the nodes state)."""
        group = self.groups.get(reason)
        over = (need - capacity) / 2**30
        detail = (
            f"{what} {need / 2**30:.1f} GiB per GPU, {capacity / 2**30:.1f} GiB allowed ({over:.1f} GiB over)"
            f"{also}"
        )
        if group is None:
            runnable = None if runs is None else runs()
            self.groups[reason] = RejectionGroup(count, example, detail, need, capacity, runnable)
            return
        group.count += count
        if group.per_gpu_bytes is None:
            return
        closer = need < group.per_gpu_bytes
        if runs is None:
            runnable = None
            if not closer:
                return
        elif group.example_runs:  # the held example runs: only a closer one that runs replaces it
            if not closer or not runs():
                return
            runnable = True
        else:  # the held one cannot run (or was a bound): a closer one, or one that runs, replaces it
            runnable = runs()
            if not closer and not runnable:
                return
        group.example, group.detail, group.per_gpu_bytes = example, detail, need
        group.example_runs = runnable


# ---------------------------------------------------------------- structures


@dataclass(frozen=True, slots=True)
class Structure:
    gpus: int
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int | None = None  # Megatron's experts over 1 rank instead of tp (``Layout.etp``)


def largest_world(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> int:
    """At least the GPUs any split ``structures`` yields uses, from its own rules: dp at most the global
    batch (global = micro x accumulation x dp), tp at most a node, pp at most num_layers + 2, cp at
    most ``max_cp`` and half the sequence (load-balanced ring attention: seq_len % 2cp == 0), and QLoRA
    splits no weight over tp or pp (``method_parallel_violation``). Past it a count has no split: a
    search of it only logs rejections."""
    qlora = training.method is Method.QLORA
    tp = 1 if qlora else cluster.gpus_per_node
    pp = 1 if qlora else model.num_layers + 2
    cp = min(max_cp(training.seq_len), max(1, training.seq_len // 2))
    return training.global_batch_size * tp * pp * cp


def requested_runnable(
    framework: Framework,
    model: ModelSpec,
    training: TrainingSpec,
    launchers: Sequence[Target] | None,
    gpu: GPUSpec,
) -> bool:
    """Whether a requested launcher (None: any) runs some layout of ``framework`` for this job on
    ``gpu``: one of them runs the framework, and no target refuses the job whatever the layout
    (``launchers.framework_job_refusal``)."""
    if launchers is not None and not set(FRAMEWORKS[framework].targets) & set(launchers):
        return False
    return framework_job_refusal(framework, model, training, gpu) is None


def largest_runnable_world(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    frameworks: tuple[Framework, ...],
    launchers: Sequence[Target] | None,
) -> int:
    """``largest_world``, or the global batch where every framework a requested launcher runs for
    the job runs data parallel alone (``launchers.data_parallel_only``: tp = pp = cp = ep = 1, so
    the GPUs are dp, which divides the global batch): past it no layout a requested launcher runs
    exists. (None of ``frameworks`` runnable: ``largest_world``, the search says why.)"""
    runnable = [f for f in frameworks if requested_runnable(f, model, training, launchers, cluster.gpu)]
    if runnable and all(data_parallel_only(f, model, launchers) for f in runnable):
        return min(training.global_batch_size, largest_world(model, cluster, training))
    if (
        runnable
        and training.method is Method.QLORA
        and all(framework_structure_refusal(f, model, training, 1, 1, 2, 1) is not None for f in runnable)
    ):
        # QLoRA splits nothing over tp, pp or ep, and no target runs it with context parallelism
        return min(training.global_batch_size, largest_world(model, cluster, training))
    return largest_world(model, cluster, training)


def data_parallel_split(tp: int, pp: int, cp: int, ep: int) -> bool:
    """Whether a split is data parallel alone."""
    return tp == pp == cp == ep == 1


def structures(
    model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, gpus: int, log: RejectionLog
) -> Iterator[Structure]:
    """Every valid split of ``gpus`` GPUs, tp ascending within pp ascending; invalid ones are logged
    (counted per rule: the first a split breaks, in the validator's order).

    The work is bounded whatever the cluster size: pp stops past num_layers + 2 (no split gives every
    rank a layer), and a (pp, tp) that breaks a rule, or cp beyond ``max_cp``, is counted for all its
    cp at once."""
    widest = max_cp(training.seq_len)
    for pp in divisors(gpus):
        if pp > model.num_layers + 2:
            break  # ascending: every larger pp leaves a rank without a layer; not splits at all
        for tp in divisors(gpus // pp):
            rest = gpus // (pp * tp)
            cps = divisors(rest)
            example = Layout(dp=rest, tp=tp, pp=pp)
            gpn = cluster.gpus_per_node
            violation = (
                tensor_parallel_violation(model, tp)
                or pipeline_split_violation(model, example)
                or method_parallel_violation(training, example)
            )
            # a split that breaks a rule is logged by it before whether its TP crosses nodes, which an
            # estimate answers (tp 16 of 8 kv heads was "not searched: tp across nodes ... an estimate
            # of one answers", where the estimate is a 422; search optimality review)
            if violation is None and cluster.tp_straddles_nodes(tp, gpus):
                # ranks fill nodes tp first: a tp that does not divide the node puts some groups on two
                # nodes once the job spans several (tp 4 on 6-GPU nodes: ranks 4-7 are 2 + 2; odd
                # node shapes review, where it was recommended with TE's intra-node overlap)
                why = (
                    f"tp ({tp}) > GPUs per node ({gpn})"
                    if tp > gpn
                    else f"tp ({tp}) does not divide the {gpn} GPUs per node, so some TP groups straddle two"
                )
                detail = (
                    f"{why}: the search proposes no TP whose all-reduces cross nodes (an estimate of one "
                    "answers, with a warning)"
                )
                log.add(TP_ACROSS_NODES, len(cps), example, detail)
                continue
            if violation is not None:
                if violation.rule != "pp_layers" or pp <= model.num_layers:
                    log.add(f"invalid: {violation.rule}", len(cps), example, str(violation))
                continue
            beyond = [cp for cp in cps if cp > widest]
            if beyond:
                wide = Layout(dp=rest // beyond[0], tp=tp, pp=pp, cp=beyond[0])
                detail = (
                    f"cp ({beyond[0]}) > {widest}, the largest context-parallel degree the search tries at "
                    f"{training.seq_len:,} tokens (an estimate of one answers)"
                )
                log.add(CP_PAST_MAX, len(beyond), wide, detail)
            for cp in cps:
                if cp > widest:
                    break
                layout = Layout(dp=rest // cp, tp=tp, pp=pp, cp=cp)
                # the search's context parallelism is a ring (no launcher renders DeepSpeed-Ulysses)
                broken = context_violation(model, layout, training, ulysses=False) or batch_split_violation(
                    training, layout
                )
                if broken is not None:
                    log.add(f"invalid: {broken.rule}", 1, layout, str(broken))
                    continue
                if model.moe is None or method_parallel_violation(training, Layout(ep=2)):
                    pairs: tuple[tuple[int, int | None], ...] = ((1, None),)
                else:
                    pairs = _ep_options(model, layout.dp, tp, cp)
                for ep, etp in pairs:
                    yield Structure(gpus=gpus, dp=layout.dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp)


def _ep_options(model: ModelSpec, dp: int, tp: int, cp: int) -> tuple[tuple[int, int | None], ...]:
    """(ep, etp) pairs the validator accepts for a (dp, tp, cp) split of an MoE model: ep divides
    the experts, and with tp > 1 also whole experts (etp 1, Megatron's MoE parallel folding: ep may
    reach tp x dp x cp). (``structures`` gives ep 1 alone to a method whose weights cannot be sliced,
    QLoRA: ``method_parallel_violation``, which reads the method and the degrees, not the split.)
    The rules are asked once per tp (``_ep_rules``); the split's own, that the expert grid etp x ep
    divides its tp x dp x cp ranks, is arithmetic here: built as a layout per divisor of the experts
    and split, 3,360 experts over 221,760 GPUs took 5.5 s before any evaluation (latency review)."""
    ranks = tp * dp * cp
    return tuple(
        (ep, etp) for ep, etp in _ep_rules(model, tp) if ranks % ((tp if etp is None else etp) * ep) == 0
    )


@functools.lru_cache(maxsize=1024)
def _ep_rules(model: ModelSpec, tp: int) -> tuple[tuple[int, int | None], ...]:
    """The (ep, etp) pairs of tp that ``expert_violation`` accepts on a split whose ranks every expert
    grid divides (dp = the expert count), on a framework-neutral layout: the framework's own rules
    (DeepSpeed's AutoTP leaves fused experts whole at ep 1) are its shardings' (``layout_violation``).
    Asked with DeepSpeed's, the splits dropped tp > 1 at ep 1 for every framework: Megatron's and
    torchtitan's tp 2 of Mixtral were never searched."""
    assert model.moe is not None
    experts = model.moe.num_experts
    etps: tuple[int | None, ...] = (None, 1) if tp > 1 else (None,)
    candidates = (
        Layout(framework=Framework.MEGATRON, dp=experts, tp=tp, ep=e, etp=etp)
        for etp in etps
        for e in divisors(experts)
    )
    return tuple((c.ep, c.etp) for c in candidates if expert_violation(model, c) is None)


# ---------------------------------------------------------------- shardings


@dataclass(frozen=True, slots=True)
class Sharding:
    framework: Framework
    zero_stage: int
    offload_optimizer: Offload = Offload.NONE
    offload_params: Offload = Offload.NONE
    torch_compile: Compile = Compile.NONE
    megatron_lm: MegatronLmSwitches | None = None  # Megatron only: Megatron-LM's own switches
    chunked_loss: bool = False  # torchtitan's ChunkedLossWrapper: the logits a chunk at a time

    @property
    def offloads(self) -> bool:
        return self.offload_optimizer is not Offload.NONE or self.offload_params is not Offload.NONE

    @property
    def frees_memory(self) -> bool:
        """Whether it is its ``plain`` twin with memory freed (offload, at some time; a chunked loss):
        worth a search only where the twin does not fit."""
        return self.chunked_loss or self.offloads

    @property
    def plain(self) -> Sharding:
        """This sharding without offload or a chunked loss."""
        if not self.frees_memory:
            return self
        return dataclasses.replace(
            self, offload_optimizer=Offload.NONE, offload_params=Offload.NONE, chunked_loss=False
        )


# The offload choices, in the order the search tries them: none, then host memory, then NVMe.
_OFFLOADS = (
    (Offload.NONE, Offload.NONE),
    (Offload.CPU, Offload.NONE),
    (Offload.CPU, Offload.CPU),
    (Offload.NVME, Offload.NONE),
    (Offload.NVME, Offload.NVME),
)


@dataclass(frozen=True, slots=True)
class OffloadDevices:
    """Where the search may offload to: host RAM and NVMe, each only where the cluster states it."""

    cpu: bool
    nvme: bool

    def allows(self, optimizer: Offload, params: Offload) -> bool:
        return all(
            device is Offload.NONE or (self.cpu if device is Offload.CPU else self.nvme)
            for device in (optimizer, params)
        )


def offload_devices(allow_offload: bool, cluster: ClusterSpec) -> OffloadDevices:
    """Offload only to memory the cluster says it has: a plan that needs host RAM or NVMe nobody
    stated cannot be run as written (suggest.py says what it would need instead)."""
    return OffloadDevices(
        cpu=allow_offload and cluster.cpu_memory_bytes_per_node > 0,
        nvme=allow_offload and cluster.nvme_bytes_per_node > 0,
    )


def least_state_bytes(
    job: Job, frameworks: tuple[Framework, ...], offload: OffloadDevices, gpus: int
) -> tuple[int, Framework] | None:
    """The cheap bound before any search: model states alone, every state sharded over all
    ``gpus`` GPUs and nothing offloaded; no layout of ``frameworks`` on that many GPUs needs less
    (with the framework that needs least). None where it bounds nothing: offload to the host RAM
    or NVMe the cluster states, or a frozen (or NF4) base, whose states the bound would over-count."""
    if offload.cpu or offload.nvme or job.training.method is not Method.FULL:
        return None
    return min((min_state_bytes_per_gpu(job, framework, gpus), framework) for framework in frameworks)


def sharded_example(job: Job, framework: Framework, gpus: int, recompute: Recompute) -> Layout:
    """A valid layout of ``framework`` on ``gpus`` GPUs that shards every model state over all of
    them, as ``min_state_bytes_per_gpu`` counts them: ZeRO-3 / FULL_SHARD data parallelism where the
    framework has it, else (Megatron-LM) tensor parallelism within a node times pipeline stages, the
    widest split the rules accept. Its plain data-parallel layout replicated the weights: 70B on eight
    A100-40GB showed 356.5 GiB as the "closest" miss where tp 8 needs 118 (rationale review). The data
    parallel layout where no split is valid (its estimate says how far it is)."""
    stages = FRAMEWORK_CAPABILITIES[framework].zero_stages
    if 3 in stages:
        return Layout(framework=framework, dp=gpus, zero_stage=3, recompute=recompute)
    zero = max(stages)
    plain = Layout(framework=framework, dp=gpus, zero_stage=zero, recompute=recompute)
    node = job.cluster.gpus_per_node
    for tp in sorted((d for d in divisors(gpus) if d <= node), reverse=True):
        pp = gpus // tp
        sp = sequence_parallel_default(framework, tp, 1, job.training.seq_len)
        layout = dataclasses.replace(plain, dp=1, tp=tp, pp=pp, sequence_parallel=sp)
        try:
            validate_layout(job.model, job.cluster, layout, job.training)
        except InvalidLayout:
            continue
        return layout
    return plain


def search_compile(torch_compile: bool, framework: Framework) -> Compile:
    """How a search compiles ``framework``'s layouts: model and loss where asked
    (``Constraints.torch_compile``) and modelled (FSDP), else not at all."""
    if torch_compile and FRAMEWORK_CAPABILITIES[framework].torch_compile is None:
        return Compile.MODEL_AND_LOSS
    return Compile.NONE


@dataclass(frozen=True, slots=True)
class LeastBytes:
    """A lower bound on the per-GPU memory of every layout on ``gpus`` GPUs or fewer that a requested
    launcher runs (``least_bytes_per_gpu``), with the framework that needs least."""

    # dynamic_bytes + state_bytes, less overlap_bytes
    need_bytes: int
    framework: Framework
    # the data-parallel layout on ``gpus`` GPUs the bound was taken at: the leanest one where the
    # framework runs data parallel only, else the framework's plain dp layout (states alone)
    example: Layout
    dynamic_bytes: int  # what no data parallelism shrinks (0: the framework may split otherwise)
    state_bytes: int  # model states sharded over all ``gpus`` (0: offload or a frozen base)
    gpus: int
    # where gradients follow activations (memory.gradients_follow_activations: FSDP at micro-batch 1),
    # the two do not meet: the gradients among state_bytes count only above dynamic_bytes
    overlap_bytes: int = 0

    def words(self, limit: int) -> str:
        """The bound and its numbers, for a rejection or a skipped suggestion."""
        recompute = self.example.recompute.value
        parts = []
        if self.dynamic_bytes:
            parts.append(
                f"at micro-batch 1 with {recompute} recompute one GPU needs {self.dynamic_bytes / 2**30:.1f} "
                f"GiB for activations, their buffers and the CUDA context alone, whatever the GPU count "
                f"({self.framework.value}, data parallel only)"
            )
        if self.state_bytes:
            parts.append(
                f"{self.state_bytes / 2**30:.1f} GiB of model states sharded over all {self.gpus:,} GPUs"
            )
        less = ""
        if self.overlap_bytes:
            less = (
                f" - {self.overlap_bytes / 2**30:.1f} GiB of gradients made as the activations are freed "
                "(the two never peak together)"
            )
        return f"{' + '.join(parts)}{less}; {limit / 2**30:.1f} GiB allowed"


def dynamic_floor(
    job: Job, framework: Framework, compiled: Compile, megatron_lm: MegatronLmSwitches | None
) -> tuple[int, Layout]:
    """The least per-GPU bytes besides the model states of any data-parallel layout (tp = pp = cp =
    ep = 1) of ``framework`` the search builds, on any GPU count, and the layout that needs it: its
    activations at micro-batch 1 (they grow with the micro-batch) under the leanest recompute of the
    framework, their buffers (the loss workspace, QLoRA's dequantisation), the CUDA context and the
    allocator's fragmentation on them (``evaluate.rank_total_bytes`` without the model states, their
    buffers, autocast copies or NCCL's: each >= 0). At pp = 1 one micro-batch is in flight whatever
    dp (``activations.micro_batches_in_flight``), and one GPU (dp 1) has no communicator, so dp 1's
    sum is the least of every count."""
    sharding = Sharding(framework, 0, torch_compile=compiled, megatron_lm=megatron_lm)
    one = Structure(gpus=1, dp=1, tp=1, pp=1, cp=1, ep=1)
    least: tuple[int, Layout] | None = None
    for recompute in recompute_order(framework):
        layout = make_layout(
            one,
            sharding,
            recompute,
            1,
            1,
            job.cluster.gpu.tp_overlap_peer_access,
            seq_len=job.training.seq_len,
        )
        acts = stage_activations(job, layout)[0]  # pp 1: one rank
        # rank_peak_parts' start of the backward, with the gradients, the model states' buffers and
        # autocast copies left out (rank_total_bytes is the states + the largest moment's reservation)
        dynamic = acts.on_gpu + acts.buffers
        fragmentation = fragmentation_bytes(dynamic, job.assume.fragmentation_fraction)
        need = math.ceil(dynamic + fragmentation) + acts.outside_allocator
        if least is None or need < least[0]:
            least = (need, layout)
    assert least is not None  # every framework has at least one recompute mode
    return least


def least_bytes_per_gpu(
    job: Job,
    frameworks: tuple[Framework, ...],
    offload: OffloadDevices,
    gpus: int,
    launchers: Sequence[Target] | None,
    torch_compile: bool = False,
) -> LeastBytes | None:
    """A lower bound on the per-GPU memory of every layout on ``gpus`` GPUs or fewer that a requested
    launcher runs: per framework (of ``frameworks`` that a requested launcher runs for the job), the
    model states sharded over all ``gpus`` (``least_state_bytes``' rule, 0 where it bounds nothing),
    plus, where every requested launcher runs the framework data parallel only
    (``launchers.data_parallel_only``: the HF Trainer, an encoder), the ``dynamic_floor`` no GPU
    count shrinks; the least over the frameworks. Cheap: a few activation sums per framework, no
    search. None where it bounds nothing (no such framework, or nothing of either part)."""
    model, training = job.model, job.training
    # least_state_bytes' rule: offloaded states, or a frozen (or NF4) base, are not bounded (0)
    states = not (offload.cpu or offload.nvme) and training.method is Method.FULL
    switches = megatron_lm_switches(launchers, training.precision)
    found: LeastBytes | None = None
    for framework in frameworks:
        if not requested_runnable(framework, model, training, launchers, job.cluster.gpu):
            continue  # the search leaves it out
        state_bytes = min_state_bytes_per_gpu(job, framework, gpus) if states else 0
        dynamic, example = 0, Layout(framework=framework, dp=gpus)
        if data_parallel_only(framework, model, launchers):
            own = switches if framework is Framework.MEGATRON else None
            dynamic, lean = dynamic_floor(job, framework, search_compile(torch_compile, framework), own)
            example = dataclasses.replace(lean, dp=gpus)
        # where FSDP's gradients follow the activations (memory.gradients_follow_activations) a layout
        # holds its states and the larger of its gradients and its activations, never less than the
        # larger of these least ones: the bound counts max(gradients, dynamic), not their sum
        overlap = 0
        if framework is Framework.FSDP and dynamic and state_bytes:
            overlap = min(dynamic, min_gradient_bytes_per_gpu(job, framework, gpus))
        need = dynamic + state_bytes - overlap
        bound = LeastBytes(need, framework, example, dynamic, state_bytes, gpus, overlap)
        if found is None or bound.need_bytes < found.need_bytes:
            found = bound
    return found if found is not None and found.need_bytes > 0 else None


@dataclass(frozen=True, slots=True)
class MegatronLmSwitches:
    """Megatron-LM's own switches, for a plan that must launch through a target that cannot set
    NVIDIA's recipe ones the estimate takes by default (Accelerate's MegatronLMPlugin): fp32 main
    gradients, bf16 weights, Megatron's own optimizer, and no overlapped gradient reduce, TP or EP
    communication."""

    grad_reduce_in_fp32: bool | None  # True under bf16 / fp8 (None: no buffer dtype to choose)
    fp8_param_gather: bool | None  # False under fp8
    precision_aware_optimizer: bool | None  # False under bf16 (offloaded: None, which needs it)


def megatron_lm_switches(
    launchers: Sequence[Target] | None, precision: Precision
) -> MegatronLmSwitches | None:
    """Megatron-LM's own switches where the requested launchers leave out the megatron target (the only
    one that renders the recipes'), else None: the recipes' defaults."""
    if launchers is None or Target.MEGATRON in launchers:
        return None
    mixed = precision in (Precision.BF16, Precision.FP8)
    return MegatronLmSwitches(
        grad_reduce_in_fp32=True if mixed else None,
        fp8_param_gather=False if precision is Precision.FP8 else None,
        precision_aware_optimizer=False if precision is Precision.BF16 else None,
    )


def shardings(
    framework: Framework,
    structure: Structure,
    offload: OffloadDevices,
    compiled: Compile = Compile.NONE,
    megatron_lm: MegatronLmSwitches | None = None,
    job: tuple[ModelSpec, TrainingSpec] | None = None,
    chunked: bool = False,
) -> tuple[list[Sharding], list[str]]:
    """What ``framework`` supports for this structure (the validator's sharding rules), and why it
    does not support the stages it does not (for the rejection log); each compiled as ``compiled``,
    Megatron's with ``megatron_lm``'s switches where given, and with ``chunked`` each followed by its
    chunked-loss twin (so that reversed, the list starts with the leanest). With the ``job`` (model,
    training) a search plans: none where no launcher runs the framework at this split
    (``launchers.framework_structure_refusal``)."""
    if structure.etp is not None and not FRAMEWORKS[framework].capabilities.expert_tensor_parallel:
        return [], []  # a framework without Megatron's etp splits the experts over tp: etp = tp
    if job is not None:
        s = structure
        refused = framework_structure_refusal(framework, *job, s.tp, s.pp, s.cp, s.ep)
        if refused is not None:  # every sharding would be evaluated, then refused by every launcher
            return [], [f"no launcher runs {framework.value} at this split: {refused}"]
    # Megatron's distributed optimizer on one data-parallel rank shards no dense state, but it is
    # what the recipes' switches need: under bf16 with Adam the precision-aware optimizer (a 2-byte
    # master, no fp32 grad copy), under fp8 --fp8-param-gather (no bf16 weight copy), which
    # Megatron's optimizer without it runs neither; and with ep > 1 it shards the experts' states
    # over their own data parallelism, tp x dp x cp / (etp x ep) (Megatron review)
    training = job[1] if job is not None else None
    recipes = megatron_lm is None and training is not None
    alone = framework is Framework.MEGATRON and (
        structure.ep > 1
        or (
            recipes
            and training is not None
            and (
                (training.precision is Precision.BF16 and training.optimizer is Optimizer.ADAMW)
                or training.precision is Precision.FP8
            )
        )
    )
    split = (structure.pp > 1, structure.dp * structure.cp > 1)
    ok, unsupported = _shardings(framework, *split, offload, compiled, structure.ep > 1, alone)
    if megatron_lm is not None and framework is Framework.MEGATRON:
        return [dataclasses.replace(sh, megatron_lm=megatron_lm) for sh in ok], list(unsupported)
    if chunked:
        return [x for sh in ok for x in (sh, dataclasses.replace(sh, chunked_loss=True))], list(unsupported)
    return list(ok), list(unsupported)


@functools.cache
def _shardings(
    framework: Framework,
    pipelined: bool,
    data_parallel: bool,
    offload: OffloadDevices,
    compiled: Compile,
    expert_parallel: bool = False,
    optimizer_alone: bool = False,
) -> tuple[tuple[Sharding, ...], tuple[str, ...]]:
    # the sharding rules read the framework, the stage, the offload devices and whether pp > 1 and ep > 1;
    # ``optimizer_alone``: stage 1 on one data-parallel rank runs another optimizer (``shardings``)
    caps = FRAMEWORKS[framework].capabilities
    ok: list[Sharding] = []
    unsupported: list[str] = []
    for stage in (0, 1, 2, 3):
        for optimizer_device, params_device in _OFFLOADS:
            if not offload.allows(optimizer_device, params_device):
                continue
            sharding = Sharding(framework, stage, optimizer_device, params_device, compiled)
            layout = Layout(
                framework=framework,
                pp=2 if pipelined else 1,
                ep=2 if expert_parallel else 1,
                zero_stage=stage,
                offload_optimizer=optimizer_device,
                offload_params=params_device,
            )
            violation = (
                sharding_violation(layout, caps)
                or zero_with_pipeline_violation(layout, caps)
                or zero_with_expert_parallel_violation(layout, caps)
            )
            if violation is not None and not sharding.offloads:
                unsupported.append(_unsupported_reason(framework, stage, violation))
                break  # the stage itself is unsupported: its offload variants go unsaid
            if violation is None and (
                stage == 0 or data_parallel or sharding.offloads or (stage == 1 and optimizer_alone)
            ):
                # stage > 0 on one data-parallel rank shards over nothing, but is how DeepSpeed and
                # FSDP offload a single GPU's optimizer (ZeRO-Offload) and parameters (ZeRO-Infinity)
                ok.append(sharding)
    return tuple(ok), tuple(unsupported)


class Unsupported(str):
    """Why a framework does not run a ZeRO stage at a split (the rejection log's reason), with the
    stage, which the log's example layout shows (it showed stage 0 beside "does not support
    zero_stage 2")."""

    zero_stage: int

    def __new__(cls, reason: str, zero_stage: int = 0) -> Unsupported:
        made = super().__new__(cls, reason)
        made.zero_stage = zero_stage
        return made


# Stages a framework runs that the service does not model, and what runs them: the search says so rather
# than that the framework lacks them (Megatron review: Megatron-LM @d98e8a6 shards gradients and
# parameters with Megatron-FSDP, --use-megatron-fsdp, and --use-torch-fsdp2)
UNMODELLED_STAGES = {Framework.MEGATRON: "Megatron-FSDP (--use-megatron-fsdp) is not modelled"}


def _unsupported_reason(framework: Framework, stage: int, violation: InvalidLayout) -> Unsupported:
    if violation.rule == "zero_stage" and framework in UNMODELLED_STAGES:
        return Unsupported(f"{framework.value} zero_stage {stage}: {UNMODELLED_STAGES[framework]}", stage)
    if violation.rule == "zero_pp":
        return Unsupported(f"{framework.value} does not support zero_stage {stage} with pp > 1", stage)
    if violation.rule == "zero_ep":
        return Unsupported(f"{framework.value} does not support zero_stage {stage} with ep > 1", stage)
    return Unsupported(f"{framework.value} does not support zero_stage {stage}", stage)


def virtual_stages(model: ModelSpec, framework: Framework, pp: int) -> tuple[int, ...]:
    """Interleaving depths to try: 1, and where the framework interleaves, the depths v whose pp x v
    virtual stages split the layers evenly, or evenly once the embedding and the loss count as a
    layer each (Megatron-Core's account-for split): the splits its flags express."""
    if pp == 1 or not FRAMEWORKS[framework].capabilities.interleaved_pipeline:
        return (1,)
    layers = model.num_layers
    deeper = (
        v
        for v in range(2, MAX_VIRTUAL_STAGES + 1)
        if pp * v <= layers and (layers % (pp * v) == 0 or (layers + 2) % (pp * v) == 0)
    )
    return (1, *deeper)


def micro_batch_sizes(
    training: TrainingSpec, structure: Structure, virtual: int, sequence_parallel: bool, framework: Framework
) -> tuple[int, ...]:
    """The micro-batches the validator accepts for this structure, interleaving and SP under
    ``framework`` (whose interleaved schedule takes its own counts: ``schedule_batches_violation``;
    the search offered FSDP Megatron's, and so never 6 micro-batches at pp 4: change review)."""
    layout = Layout(
        framework=framework,
        dp=structure.dp,
        tp=structure.tp,
        pp=structure.pp,
        virtual_pipeline_stages=virtual,
        sequence_parallel=sequence_parallel,
    )
    return valid_micro_batch_sizes(training, layout)


# Distinct layouts a search may build: DeepSeek-V3's catalog capacity (seq 4096, batch 1024) builds
# 16,446 (at 16,384 the least recently used were evicted before their reuse and every one was rebuilt:
# 13% of that sweep's CPU). A layout and its key take about 0.5 KB: at most ~32 MB.
LAYOUT_CACHE_SIZE = 65536


@functools.lru_cache(maxsize=LAYOUT_CACHE_SIZE)
def make_layout(
    structure: Structure,
    sharding: Sharding,
    recompute: Recompute,
    virtual: int,
    micro_batch: int,
    peer_to_peer: bool,
    tp_overlap_allowed: bool = True,
    *,
    seq_len: int,
) -> Layout:
    """The layout of these choices on GPUs with (or without) ``peer_to_peer`` access (shared: the
    search builds the same one at several steps, and a capacity sweep for every GPU type searching the
    same count; a ``Layout`` is frozen). ``tp_overlap_allowed`` False: TP communication exposed, where
    the framework's default overlaps it (Megatron's userbuffers cost memory; the search tries that
    twin where memory is short)."""
    flags = FRAMEWORKS[sharding.framework].flags
    sp = sequence_parallel_default(sharding.framework, structure.tp, structure.cp, seq_len)
    own = sharding.megatron_lm
    tp_overlap = tp_overlap_allowed and tp_comm_overlap_default(
        sharding.framework, sp, sharding.torch_compile, peer_to_peer
    )
    overlap = _overlap_grad_reduce(flags, structure, sharding)
    if own is not None:  # Megatron-LM's own: no overlapped reduce or TP communication
        tp_overlap, overlap = False, (False if structure.dp * structure.cp > 1 else None)
    return Layout(
        framework=sharding.framework,
        dp=structure.dp,
        tp=structure.tp,
        pp=structure.pp,
        cp=structure.cp,
        ep=structure.ep,
        etp=structure.etp,
        sequence_parallel=sp,
        zero_stage=sharding.zero_stage,
        offload_optimizer=sharding.offload_optimizer,
        offload_params=sharding.offload_params,
        recompute=recompute,
        micro_batch_size=micro_batch,
        virtual_pipeline_stages=virtual,
        tp_comm_overlap=tp_overlap,
        overlap_grad_reduce=overlap,
        grad_reduce_in_fp32=None if own is None else own.grad_reduce_in_fp32,
        fp8_param_gather=None if own is None else own.fp8_param_gather,
        # offloaded, Megatron needs it on (the optimizer's default there)
        precision_aware_optimizer=(
            None
            if own is None or sharding.offload_optimizer is not Offload.NONE
            else own.precision_aware_optimizer
        ),
        torch_compile=sharding.torch_compile,
        chunked_loss=sharding.chunked_loss,
    )


def sub_cluster(cluster: ClusterSpec, gpus: int) -> ClusterSpec:
    """The part of ``cluster`` a job of ``gpus`` GPUs runs on (whole nodes, or part of one), on the
    same links (and their measured bus bandwidths)."""
    gpn = cluster.gpus_per_node
    return dataclasses.replace(cluster, num_nodes=max(1, gpus // gpn), gpus_per_node=min(gpus, gpn))
