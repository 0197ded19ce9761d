"""A job prepared once: everything that depends on (model, cluster, training, efficiency tuning)
and not on the layout, and the memos of the layout-level parts.

A search asks for thousands of layouts of one job, and ``estimate()`` for one. Both go through
``prepare`` and the estimator's own part functions; the parts that are worth remembering are
decorated with ``layout_memo(*fields)``, which keys the memo on exactly the layout fields named next
to the formula (``tests/estimator/test_job.py`` records which fields every memoised part really
reads, over a grid of layouts, and fails when one is missing from its key). Per-layer quantities
are computed once per layer kind (``layer_kinds``): every per-layer formula of the estimator reads
the layer only through its kind.

The memory parts read of the job only its memory inputs (``memory_inputs``: the model, the training,
the memory assumptions and the cluster's GPUs per node), not the GPU, the network or the
efficiency tuning. Declared ``layout_memo(..., memory=True)``, their memos live in
``Job.memory_memos``: the job's own, or, for jobs made inside ``shared_memory_memos()``, one set
shared by every job of the same memory inputs (a capacity sweep asks the same layouts of every GPU
type; the suggestions ask them of other GPUs).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from service.estimator import pipeline
from service.estimator.defaults import for_gpu
from service.estimator.params import LayerKind, layer_kind, parameter_counts

__all__ = [
    "Job",
    "LayerKind",
    "job_memo",
    "layout_memo",
    "make_job",
    "prepare",
    "rank_kind_counts",
    "shared_memory_memos",
    "sum_by_kind",
]
from service.estimator.tuning import MemoryAssumptions, Tuning
from service.estimator.types import ClusterSpec, Layout, ModelSpec, ParameterCounts, TrainingSpec

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True, slots=True, eq=False, kw_only=True)
class Job:
    """One (model, cluster, training, tuning): its constants, and the memos of its parts."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    tuning: Tuning
    assume: MemoryAssumptions  # tuning.memory
    counts: ParameterCounts
    layer_kinds: tuple[LayerKind, ...]  # the kind of every decoder layer, in order
    kinds: tuple[LayerKind, ...]  # the distinct kinds, in order of first appearance
    base_autocast: bool  # training.base_autocast, asked once or twice per layout
    memos: Memos
    memory_memos: Memos  # the memory parts' (``layout_memo(..., memory=True)``): see the module


Memos = defaultdict[object, dict[Any, Any]]

# memory_inputs -> the memory parts' memos, while a shared_memory_memos() block runs
_MEMORY_SCOPE: ContextVar[dict[tuple[object, ...], Memos] | None] = ContextVar("memory_scope", default=None)


@contextmanager
def shared_memory_memos() -> Iterator[None]:
    """Within this block (of this thread or task), jobs of equal ``memory_inputs`` share the memos
    of the memory parts; they are dropped when the outermost block ends."""
    if _MEMORY_SCOPE.get() is not None:  # nested: the outer block's
        yield
        return
    token = _MEMORY_SCOPE.set({})
    try:
        yield
    finally:
        _MEMORY_SCOPE.reset(token)


def memory_inputs(job: Job) -> tuple[object, ...]:
    """Everything of the job the memory parts read: the model (its counts and layer kinds follow),
    the training, the memory assumptions, and the GPUs per node (FSDP's hybrid shard)."""
    return (job.model, job.training, job.assume, job.cluster.gpus_per_node)


def make_job(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    tuning: Tuning,
) -> Job:
    """A new job with empty memos (``prepare`` returns a shared one); inside
    ``shared_memory_memos()`` its memory parts' memos are those of the jobs of the same memory
    inputs."""
    counts, layer_kinds, kinds = _model_constants(model)
    memos: Memos = defaultdict(dict)
    training = for_gpu(training, cluster.gpu)  # what the request left to the hardware, for this GPU
    job = Job(
        model=model,
        cluster=cluster,
        training=training,
        tuning=tuning,
        assume=tuning.memory,
        counts=counts,
        layer_kinds=layer_kinds,
        kinds=kinds,
        base_autocast=training.base_autocast,
        memos=memos,
        memory_memos=memos,
    )
    scope = _MEMORY_SCOPE.get()
    if scope is None:
        return job
    shared = scope.setdefault(memory_inputs(job), defaultdict(dict))
    return dataclasses.replace(job, memory_memos=shared)


@functools.lru_cache(maxsize=256)
def _model_constants(
    model: ModelSpec,
) -> tuple[ParameterCounts, tuple[LayerKind, ...], tuple[LayerKind, ...]]:
    """What a job needs of the model alone: its parameter counts, each layer's kind, the distinct
    kinds. Shared by every job of the model (the limit searches make one per sequence length)."""
    layer_kinds = tuple(layer_kind(model, i) for i in range(model.num_layers))
    return parameter_counts(model), layer_kinds, tuple(dict.fromkeys(layer_kinds))


@functools.lru_cache(maxsize=128)
def prepare(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    tuning: Tuning,
) -> Job:
    """The job of these inputs, shared by every caller that asks for the same ones (its memos too)."""
    return make_job(model, cluster, training, tuning)


# ---------------------------------------------------------------- memos


@dataclass(frozen=True, slots=True)
class MemoisedPart:
    """A part memoised by ``layout_memo``: its name, the layout fields of its key, the formula."""

    name: str
    fields: tuple[str, ...]
    formula: Callable[..., Any]


_MISSING = object()  # a memo's "not computed yet" (None is a value some parts return)

# every layout_memo part, for the key-completeness test
MEMOISED_PARTS: list[MemoisedPart] = []


def layout_memo(
    *fields: str, memory: bool = False
) -> Callable[[Callable[Concatenate[Job, Layout, P], T]], Callable[Concatenate[Job, Layout, P], T]]:
    """Memoise ``part(job, layout, *args)`` on the job, keyed by the named layout fields (and the
    hashable positional ``args``).

    The key must name every field the part reads, directly or through the parts it calls; the
    part's value may depend on the job freely (a job is one model, cluster and training), except
    with ``memory=True``: then it may read of the job only its ``memory_inputs``, and is memoised in
    ``Job.memory_memos``."""
    key_of = operator.attrgetter(*fields)
    memos_of = operator.attrgetter("memory_memos" if memory else "memos")

    def decorate(part: Callable[Concatenate[Job, Layout, P], T]) -> Callable[Concatenate[Job, Layout, P], T]:
        if part.__code__.co_argcount == 2:  # part(job, layout): the common case, without packing args

            def memoised_layout(job: Job, layout: Layout) -> T:
                memo = memos_of(job)[memoised_layout]
                key = key_of(layout)
                value = memo.get(key, _MISSING)
                if value is _MISSING:
                    value = memo[key] = part(job, layout)  # type: ignore[call-arg]
                return value  # type: ignore[no-any-return]

            memoised: Callable[..., T] = memoised_layout
        else:

            def memoised_args(job: Job, layout: Layout, /, *args: P.args, **kwargs: P.kwargs) -> T:
                memo = memos_of(job)[memoised_args]
                key = (key_of(layout), *args)
                value = memo.get(key, _MISSING)
                if value is _MISSING:
                    value = memo[key] = part(job, layout, *args, **kwargs)
                return value  # type: ignore[no-any-return]

            memoised = memoised_args
        MEMOISED_PARTS.append(MemoisedPart(part.__qualname__, fields, part))
        return functools.wraps(part)(memoised)

    return decorate


def job_memo(part: Callable[Concatenate[Job, P], T]) -> Callable[Concatenate[Job, P], T]:
    """Memoise ``part(job, *args)`` on the job, keyed by its (hashable, positional) arguments."""

    @functools.wraps(part)
    def memoised(job: Job, /, *args: P.args, **kwargs: P.kwargs) -> T:
        assert not kwargs, "job_memo parts take positional arguments only"
        memo = job.memos[memoised]
        value = memo.get(args, _MISSING)
        if value is _MISSING:
            value = memo[args] = part(job, *args)  # type: ignore[call-arg]
        return value  # type: ignore[no-any-return]

    return memoised


# ---------------------------------------------------------------- layers by kind


@job_memo
def kind_counts(job: Job, start: int, stop: int) -> tuple[tuple[LayerKind, int], ...]:
    """How many layers of each kind ``layers[start:stop]`` holds, kinds in ``job.kinds`` order."""
    held = job.layer_kinds[start:stop]
    return tuple((kind, held.count(kind)) for kind in job.kinds if kind in held)


def moe_layers_of(counts: tuple[tuple[LayerKind, int], ...]) -> int:
    """How many of these layers have an MoE block."""
    return sum(count for kind, count in counts if kind.moe)


def sum_by_kind(counts: tuple[tuple[LayerKind, int], ...], value: Callable[[LayerKind], float]) -> float:
    """Sum of ``value(kind)`` over the layers ``counts`` describes."""
    return sum(count * value(kind) for kind, count in counts)


@layout_memo(*pipeline.PIPELINE_FIELDS)
def rank_kind_counts(job: Job, layout: Layout) -> tuple[tuple[tuple[LayerKind, int], ...], ...]:
    """Layers of each kind on each pipeline rank (all of its virtual stages), with the multi-token
    prediction layers on the last: Megatron-Core builds them there (post_process), each with the
    last decoder layer's spec (get_gpt_mtp_block_spec)."""
    out = []
    last = layout.pp - 1
    for rank, chunks in enumerate(pipeline.rank_layer_ranges(job.model.num_layers, layout)):
        totals: dict[LayerKind, int] = {}
        for chunk in chunks:
            for kind, count in kind_counts(job, chunk.start, chunk.stop):
                totals[kind] = totals.get(kind, 0) + count
        if rank == last and job.training.mtp_num_layers:
            mtp = job.layer_kinds[-1]
            totals[mtp] = totals.get(mtp, 0) + job.training.mtp_num_layers
        out.append(tuple((kind, totals[kind]) for kind in job.kinds if kind in totals))
    return tuple(out)
