"""A job prepared once: everything that depends on (model, cluster, training, efficiency tuning)
and not on the layout, and the memos of the layout-level parts.

A search asks for thousands of layouts of one job, and ``estimate()`` for one. Both go through
``prepare`` and the estimator's own part functions; the parts that are worth remembering are
decorated with ``layout_memo(*fields)``, which keys the memo on exactly the layout fields named next
to the formula and hands the formula a view of those fields only (``LayoutView``): a read of any
other field, in the formula or in a memoised part it calls, is caught at run time, answered on the
whole layout without memoising, and recorded, so no memo returns another layout's number.
``tests/estimator/test_job.py`` checks over a grid of layouts that every key names exactly what its
part reads, and the test suite and the invariant sweep that nothing was recorded. Per-layer quantities
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
import inspect
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
    the training, the memory assumptions, whether torch's ring attention repeats k and v (its
    buffers: ``memory.activation_buffer_bytes``; a second tuning in one shared block read the first's,
    library review) and the GPUs per node (FSDP's hybrid shard)."""
    return (
        job.model,
        job.training,
        job.assume,
        job.tuning.ring_attention_repeats_kv,
        job.cluster.gpus_per_node,
    )


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
    training = for_gpu(training, cluster.gpu, model)  # what the request left to the hardware, for this GPU
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


class UnkeyedRead(Exception):
    """A memoised part read a layout field (or a property over one) that its key does not name. Not
    an AttributeError, so ``getattr(view, name, default)`` cannot swallow it."""

    def __init__(self, field: str) -> None:
        super().__init__(field)
        self.field = field


# Layout's derived attributes (properties and methods), which a view offers over the fields it holds
_LAYOUT_DERIVED = {
    name: attr
    for name, attr in vars(Layout).items()
    if not name.startswith("_") and (isinstance(attr, property) or inspect.isfunction(attr))
}
_LAYOUT_FIELDS = tuple(f.name for f in dataclasses.fields(Layout))


class LayoutView:
    """The layout as a memoised part sees it: the fields of its key, nothing else (a class per key,
    ``view_class``). Reading any other field of the layout raises ``UnkeyedRead``, so a memo key
    cannot miss a field its part reads, directly, through a property, or through a memoised part it
    calls (whose key lookup reads the view): by construction, not by a test's coverage."""

    __slots__ = ()


def _unkeyed(name: str) -> property:
    def read(view: LayoutView) -> Any:
        raise UnkeyedRead(name)

    return property(read)


@functools.cache
def view_class(fields: tuple[str, ...]) -> Callable[[Any], Any]:
    """The constructor of the view of a key naming ``fields`` (from the key's value: the field's own
    value for a one-field key, else the tuple): slots for those fields (a read costs what a Layout's
    does), Layout's properties and methods over them, and a raising property for every other field
    (no ``__getattr__``, which would slow every read)."""
    namespace: dict[str, Any] = {"__slots__": fields, **_LAYOUT_DERIVED}
    namespace.update({name: _unkeyed(name) for name in _LAYOUT_FIELDS if name not in fields})
    view = type(f"LayoutView[{','.join(fields)}]", (LayoutView,), namespace)
    # one generated function per key, as collections.namedtuple makes its __new__: unpacking the key
    # into the slots is ~4x faster than a loop of setattr
    targets = ", ".join(f"view.{name}" for name in fields)
    unpacked = "(key,)" if len(fields) == 1 else "key"
    source = f"def make(key):\n    view = new(View)\n    {targets}, = {unpacked}\n    return view\n"
    scope: dict[str, Any] = {"new": object.__new__, "View": view}
    exec(source, scope)  # the source is built from Layout's own field names
    make: Callable[[Any], Any] = scope["make"]
    return make


# (module.part, field) of every unkeyed read a part made: the part's value was then computed on the whole
# layout and not memoised. Empty unless a key is incomplete (tests/estimator/test_job.py runs the grid
# and asserts it stays empty); bounded by the number of (part, field) pairs.
UNKEYED_READS: set[tuple[str, str]] = set()


def _unmemoised(
    part: Callable[..., T], job: Job, layout: Layout, read: UnkeyedRead, args: tuple[Any, ...]
) -> T:
    """``part`` on the whole layout after it read ``read.field`` outside its key: recorded, and not to
    be memoised (its value depends on more than the key)."""
    UNKEYED_READS.add((f"{part.__module__}.{part.__qualname__}", read.field))
    return part(job, layout, *args)


def layout_memo(
    *fields: str, memory: bool = False
) -> Callable[[Callable[Concatenate[Job, Layout, P], T]], Callable[Concatenate[Job, Layout, P], T]]:
    """Memoise ``part(job, layout, *args)`` on the job, keyed by the named layout fields (and the
    hashable positional ``args``).

    The part is handed a ``LayoutView`` of its key's fields, not the layout: a read of any other
    field is an ``UnkeyedRead``, after which the part runs on the whole layout unmemoised (a correct
    number, and a record in ``UNKEYED_READS``). The part's value may depend on the job freely (a job
    is one model, cluster and training), except with ``memory=True``: then it may read of the job
    only its ``memory_inputs``, and is memoised in ``Job.memory_memos``."""
    fields = tuple(dict.fromkeys(fields))  # a field named twice (by two field groups) is keyed once
    key_of = operator.attrgetter(*fields)
    memos_of = operator.attrgetter("memory_memos" if memory else "memos")
    view_of = view_class(fields)

    def decorate(part: Callable[Concatenate[Job, Layout, P], T]) -> Callable[Concatenate[Job, Layout, P], T]:
        if part.__code__.co_argcount == 2:  # part(job, layout): the common case, without packing args

            def memoised_layout(job: Job, layout: Layout) -> T:
                memo = memos_of(job)[memoised_layout]
                key = key_of(layout)
                value = memo.get(key, _MISSING)
                if value is _MISSING:
                    try:
                        value = memo[key] = part(job, view_of(key))  # type: ignore[call-arg]
                    except UnkeyedRead as read:
                        value = _unmemoised(part, job, layout, read, ())
                return value  # type: ignore[no-any-return]

            memoised: Callable[..., T] = memoised_layout
        else:

            def memoised_args(job: Job, layout: Layout, /, *args: P.args, **kwargs: P.kwargs) -> T:
                assert not kwargs, "layout_memo parts take positional arguments only"
                memo = memos_of(job)[memoised_args]
                fields_key = key_of(layout)
                key = (fields_key, *args)
                value = memo.get(key, _MISSING)
                if value is _MISSING:
                    try:
                        value = memo[key] = part(job, view_of(fields_key), *args)  # type: ignore[call-arg]
                    except UnkeyedRead as read:
                        value = _unmemoised(part, job, layout, read, args)
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
    """Sum of ``value(kind)`` over the layers ``counts`` describes (a loop: the search asks it for
    every rank of every layout it evaluates, and a generator's frame costs more than its one or two
    kinds; added in the same order, so the same float)."""
    total: float = 0
    for kind, count in counts:
        total += count * value(kind)
    return total


@layout_memo(*pipeline.PIPELINE_FIELDS, memory=True)
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
