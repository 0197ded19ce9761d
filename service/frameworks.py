"""One registry of what each training framework is to this service: one frozen entry per framework.

An entry names, for its framework:

* ``capabilities``: the degrees, ZeRO stages, offloads, recompute policies, torch.compile and PEFT
  it has. That part is estimator knowledge (the validator reads it and the estimator imports
  nothing from ``service``), so it lives in ``estimator.validate.FRAMEWORK_CAPABILITIES`` and the
  entry holds that same object;
* ``flags``: the switches the search turns on because they only save time;
* ``targets``: the launch targets that render its layouts, in the order the search asks them. What
  each target cannot express is that target's pure predicate (``launchers.REFUSALS``: a plan in,
  the reason or None out), the very function its renderer refuses with, so asking never renders;
* ``tuning_keys``: the tables of ``catalog/tuning.toml`` keyed by framework that must name it.

Read by the validator (capabilities), the search (``recommender.space``: capabilities and flags;
``launchers.runnable_targets``: targets), the launchers (which frameworks a target runs) and the
rationale. Adding a framework option is one field here (or in ``Capabilities``), the rule that
reads it, and the launchers that render it.

This module imports only the estimator, so the launchers and the recommender can both read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from service.estimator.types import Compile, Framework
from service.estimator.validate import FRAMEWORK_CAPABILITIES, Capabilities, sequence_parallel_divisor_of


class Target(StrEnum):
    """A launcher the service renders files for (``service.launchers``, one module each)."""

    DEEPSPEED = "deepspeed"
    ACCELERATE = "accelerate"
    HF_TRAINER = "hf_trainer"
    MEGATRON = "megatron"
    TORCHTITAN = "torchtitan"
    SLURM = "slurm"
    KUBERNETES = "kubernetes"


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkFlags:
    """Switches the search turns on for a framework because they only save time. The launchers
    render exactly these flags, so the estimate is of the job the files run."""

    overlap_grad_reduce: bool | None  # None: the framework default
    # DeepSpeed overlaps the gradient reduce (overlap_comm) only inside its ZeRO optimizer (stage
    # >= 1), and its PipelineEngine forces overlap_comm off: no switch to turn on there
    overlap_grad_reduce_needs_zero_without_pp: bool
    # needs tp > 1 and sequence parallelism, and a compiled model where the framework's capability
    # says so (torchtitan's Async TP)
    tp_comm_overlap: bool
    sequence_parallel: bool  # the framework shards norm/dropout activations over TP


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkEntry:
    framework: Framework
    capabilities: Capabilities
    flags: FrameworkFlags
    # the targets that run its layouts, in the order the search asks them (Slurm and Kubernetes
    # wrap one of these, so they are not listed)
    targets: tuple[Target, ...]
    tuning_keys: tuple[str, ...]  # the dotted keys of tuning.toml that hold its numbers
    source: str
    # what the framework shards when a layout does not say (an estimate's zero_stage left out)
    default_zero_stage: int


# tuning.toml's tables with one value per framework (catalog/tuning.py reads them into the Tuning)
PER_FRAMEWORK_TUNING_TABLES = (
    "overlap.dp_by_framework",  # gradient reduction overlapped with backward by default
    "attention_kernel.framework",  # the attention kernel it runs
    "kernel_launch.kernels_per_layer",  # kernels of a decoder layer's forward
)


def _tuning(framework: Framework, *own: str) -> tuple[str, ...]:
    return (*(f"{table}.{framework.value}" for table in PER_FRAMEWORK_TUNING_TABLES), *own)


FRAMEWORKS: Mapping[Framework, FrameworkEntry] = MappingProxyType(
    {
        Framework.DEEPSPEED: FrameworkEntry(
            framework=Framework.DEEPSPEED,
            capabilities=FRAMEWORK_CAPABILITIES[Framework.DEEPSPEED],
            # overlap_comm in the ZeRO optimizer (stages 1-3, not under the pipeline engine); AutoTP
            # has no sequence parallelism, so its TP layouts keep norm/dropout activations replicated
            flags=FrameworkFlags(
                overlap_grad_reduce=True,
                overlap_grad_reduce_needs_zero_without_pp=True,
                tp_comm_overlap=False,
                sequence_parallel=False,
            ),
            targets=(Target.DEEPSPEED, Target.HF_TRAINER, Target.ACCELERATE),
            tuning_keys=_tuning(Framework.DEEPSPEED),
            source="deepspeed 0.19.8 runtime/zero/config.py (overlap_comm), runtime/pipe/engine.py",
            default_zero_stage=0,  # zero_optimization.stage defaults to 0 (runtime/zero/config.py)
        ),
        Framework.MEGATRON: FrameworkEntry(
            framework=Framework.MEGATRON,
            capabilities=FRAMEWORK_CAPABILITIES[Framework.MEGATRON],
            # --overlap-grad-reduce --overlap-param-gather, and --tp-comm-overlap (Transformer Engine
            # userbuffers; needs --sequence-parallel)
            flags=FrameworkFlags(
                overlap_grad_reduce=True,
                overlap_grad_reduce_needs_zero_without_pp=False,
                tp_comm_overlap=True,
                sequence_parallel=True,
            ),
            targets=(Target.MEGATRON, Target.ACCELERATE),
            tuning_keys=_tuning(Framework.MEGATRON),
            source="Megatron-LM megatron/training/arguments.py",
            default_zero_stage=0,  # --use-distributed-optimizer is off by default (arguments.py)
        ),
        Framework.FSDP: FrameworkEntry(
            framework=Framework.FSDP,
            capabilities=FRAMEWORK_CAPABILITIES[Framework.FSDP],
            # PyTorch DDP / FSDP already overlap (None: the default); torchtitan's TP plan shards the
            # norms with SequenceParallel (parallelism.enable_sequence_parallel, default on); a
            # compiled layout with TP runs Async TP (--compile.enable_async_tensor_parallel), which
            # only hides TP communication (torchtitan's own llama3_405b config turns it on)
            flags=FrameworkFlags(
                overlap_grad_reduce=None,
                overlap_grad_reduce_needs_zero_without_pp=False,
                tp_comm_overlap=True,
                sequence_parallel=True,
            ),
            targets=(Target.TORCHTITAN, Target.ACCELERATE, Target.HF_TRAINER),
            tuning_keys=_tuning(Framework.FSDP, "memory.fsdp_prefetch_layers"),
            source="torchtitan 0.3.0 config/configs.py (ParallelismConfig), PyTorch FSDP2",
            # FULL_SHARD: FSDP's default ShardingStrategy, FSDP2 fully_shard's reshard_after_forward
            # default True, torchtitan's data_parallel_shard_degree -1 (every leftover rank)
            default_zero_stage=3,
        ),
    }
)


def sequence_parallel_default(framework: Framework, tp: int, cp: int = 1, seq_len: int | None = None) -> bool:
    """Whether ``framework``'s recipes shard the norm and dropout activations over the TP group at
    this tp (Megatron-Bridge / NeMo recipes set sequence_parallel with TP; torchtitan's TP plan
    always does; DeepSpeed AutoTP has none): what the search builds and an estimate assumes unless
    told. Off where ``seq_len`` (when given) does not split over the TP ranks
    (``validate.sequence_parallel_divisor_of``: Megatron-LM asserts seq_len / cp % tp == 0 only under
    --sequence-parallel): the search built only sequence-parallel TP layouts, so an odd sequence lost
    every TP split (Llama 3.1 70B at 4,097 tokens on 16 H100s under Megatron: infeasible, where tp 4
    pp 4 fits; odd-clusters review)."""
    if not (tp > 1 and FRAMEWORKS[framework].flags.sequence_parallel):
        return False
    return seq_len is None or seq_len % sequence_parallel_divisor_of(framework, tp, cp) == 0


def tp_comm_overlap_default(
    framework: Framework, sequence_parallel: bool, torch_compile: Compile, peer_to_peer: bool
) -> bool:
    """Whether ``framework``'s layouts overlap the TP collectives with the GEMMs (Megatron-Bridge /
    NeMo's tp_comm_overlap, torchtitan's Async TP; both need sequence parallelism, Async TP also a
    compiled model, and both map the peers' memory: GPUs with peer access, ``GPUSpec.peer_to_peer``):
    the search's and an estimate's default."""
    entry = FRAMEWORKS[framework]
    compiled = torch_compile is not Compile.NONE or not entry.capabilities.tp_comm_overlap_needs_compile
    return sequence_parallel and entry.flags.tp_comm_overlap and compiled and peer_to_peer


def frameworks_of(target: Target) -> tuple[Framework, ...]:
    """The frameworks whose layouts ``target`` runs (none for Slurm and Kubernetes: they wrap the
    framework's own targets)."""
    return tuple(framework for framework, entry in FRAMEWORKS.items() if target in entry.targets)
