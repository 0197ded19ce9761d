"""The recommender's own memos in ``Job.memory_memos`` (``_micro_batches``, ``_structures``, the lean
check's ``_narrowed`` / ``_record_viable`` under ``_lean_key``) list by hand what each memoised
call reads. They are shared by every job of equal memory inputs in a ``shared_memory_memos()``
block (the GPU types of a sweep), so a key that misses an input hands one search another's answer.

The checks, as ``tests/estimator/test_job.py`` does for ``layout_memo``:

* each memo directly: the memoised call, asked over a grid that varies every input it reads,
  equals the call without the memo; and every part of its key separates two inputs of different
  answers in that grid (so the grid could tell a key without it), except the GPUs per node, which
  the memory inputs hold already;
* searches that vary every input (the training, the cluster's GPUs per node, nodes, host RAM and
  NVMe, the constraints' frameworks, offload, compile, launchers and headroom) on cards largest
  first, all in ONE memo scope, each answering as the same search alone;
* the end to end: a capacity sweep answers for each GPU type what that type answers alone.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping

import pytest

import service.recommender as recommender
from service.catalog.gpus import gpu
from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator.job import make_job, memory_inputs, shared_memory_memos
from service.estimator.types import ClusterSpec, Framework, Method, TrainingSpec
from service.frameworks import Target
from service.recommender import (
    LeanKey,
    SearchResult,
    _lean_key,
    _Search,
    _structures,
    _viable_structures,
)
from service.recommender.budget import Budget
from service.recommender.capacity import capacity
from service.recommender.space import (
    RejectionLog,
    Structure,
    megatron_lm_switches,
    micro_batch_sizes,
    offload_devices,
    structures,
    sub_cluster,
    virtual_stages,
)
from service.recommender.types import Constraints, Objective
from tests.recommender.helpers import cluster

GiB = 2**30
SPEC = model("llama-3-8b").spec
COUNTS = (1, 2, 4, 8)
# largest first: each card's lean checks narrow the smaller ones' (_narrowed)
CARDS = ("h200-sxm-141gb", "a100-sxm-40gb", "l4-24gb")
BASE = TrainingSpec(seq_len=4096, global_batch_size=64)
FEWEST = Constraints(objective=Objective.FEWEST_GPUS)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One search's inputs besides the card: what the memoised calls may read."""

    name: str
    training: TrainingSpec = BASE
    constraints: Constraints = FEWEST
    nodes: int = 1
    per_node: int = 8
    host_gib: int = 0
    nvme_gib: int = 0

    def cluster(self, card: str) -> ClusterSpec:
        c = cluster(card, nodes=self.nodes, per_node=self.per_node, host_gib=self.host_gib)
        return dataclasses.replace(c, nvme_bytes_per_node=self.nvme_gib * GiB)


VARIANTS = (
    Variant("base"),
    Variant("global batch", training=dataclasses.replace(BASE, global_batch_size=24)),
    Variant("sequence", training=dataclasses.replace(BASE, seq_len=16384)),
    Variant("lora", training=dataclasses.replace(BASE, method=Method.LORA)),
    Variant("4 per node", per_node=4, nodes=2),
    Variant("2 nodes", nodes=2),
    Variant("host RAM", host_gib=64),
    Variant("more host RAM", host_gib=1024),
    Variant("NVMe", host_gib=64, nvme_gib=4096),
    Variant("no offload", host_gib=1024, constraints=dataclasses.replace(FEWEST, allow_offload=False)),
    Variant("fsdp", constraints=dataclasses.replace(FEWEST, frameworks=(Framework.FSDP,))),
    Variant("megatron", constraints=dataclasses.replace(FEWEST, frameworks=(Framework.MEGATRON,))),
    Variant("deepspeed", constraints=dataclasses.replace(FEWEST, frameworks=(Framework.DEEPSPEED,))),
    Variant("compile", constraints=dataclasses.replace(FEWEST, torch_compile=True)),
    # Megatron-LM's own switches (no megatron target): another set of Megatron shardings
    Variant("accelerate", constraints=dataclasses.replace(FEWEST, launchers=(Target.ACCELERATE,))),
    Variant("headroom", constraints=dataclasses.replace(FEWEST, min_headroom_fraction=0.3)),
)


def _answer(card: str, variant: Variant, rejections: bool) -> tuple[tuple[object, ...], int]:
    found = recommender.search(
        SPEC, variant.cluster(card), variant.training, variant.constraints, default_tuning(), COUNTS,
        stop_at_first_fit=True, rejections=rejections,
    )  # fmt: skip
    best = tuple((s.layout, s.key) for s in found.ranked())
    log = tuple(found.log.groups.items()) if rejections else ()  # unread (and narrowed) otherwise
    return (best, found.truncated, log), found.evaluations


@pytest.mark.parametrize("rejections", [False, True], ids=["narrowed", "logged"])
def test_searches_sharing_the_memos_answer_as_each_alone(rejections: bool) -> None:
    alone = {(card, v.name): _answer(card, v, rejections) for card in CARDS for v in VARIANTS}
    with shared_memory_memos():  # every search below shares the memos of equal memory inputs
        shared = {(card, v.name): _answer(card, v, rejections) for card in CARDS for v in VARIANTS}
    for where, (answer, _) in alone.items():
        assert shared[where][0] == answer, where
    # the variants answer differently (each input is read), and the memos answered some calls
    # (narrowing: fewer lean checks on the smaller cards)
    assert len({answer[0] for answer, _ in alone.values()}) > len(VARIANTS)
    if not rejections:
        assert sum(n for _, n in shared.values()) < sum(n for _, n in alone.values())


# the variants whose memory inputs (training, GPUs per node) are the base's: they share its memos
SHARING = tuple(v for v in VARIANTS if (v.training, v.per_node) == (BASE, 8))


def _separates(answers: Mapping[tuple[object, ...], object], width: int) -> list[int]:
    """The parts of a memo key (of ``width``) without which two keys of different answers meet."""
    separating = []
    for part in range(width):
        short: dict[tuple[object, ...], object] = {}
        if any(
            short.setdefault(key[:part] + key[part + 1 :], answer) != answer
            for key, answer in answers.items()
        ):
            separating.append(part)
    return separating


def test_the_micro_batch_key_names_what_the_sizes_read() -> None:
    """``_micro_batches`` of one job (its memo) for every structure, interleaving and SP, in
    shuffled order, equals ``micro_batch_sizes`` asked directly; and every part of its key (dp,
    tp, pp, interleaving, SP, and whether PyTorch's interleaved schedule rules: FSDP) separates two calls
    of different sizes. A sequence length 4 (mod 8)
    makes SP's rule (tokens of a micro-batch split over tp) and so tp and SP matter."""
    spec, c = model("llama-3.1-70b").spec, cluster(nodes=4)
    for training in (
        TrainingSpec(seq_len=4100, global_batch_size=96),
        TrainingSpec(seq_len=4096, global_batch_size=24),
    ):
        calls = [
            (s, virtual, sp, framework)
            for s in structures(spec, c, training, 32, RejectionLog())
            for framework in Framework
            for virtual in virtual_stages(spec, framework, s.pp)
            for sp in (False, True)
        ]
        random.Random(3).shuffle(calls)
        job = make_job(spec, c, training, default_tuning())
        answers: dict[tuple[object, ...], object] = {}
        for s, virtual, sp, framework in calls:
            sizes = micro_batch_sizes(training, s, virtual, sp, framework)
            assert recommender._micro_batches(job, s, virtual, sp, framework) == sizes, (s, virtual, sp)
            answers[s.dp, s.tp, s.pp, virtual, sp, virtual > 1 and framework is Framework.FSDP] = sizes
        if training.seq_len == 4100:
            assert _separates(answers, 6) == [0, 1, 2, 3, 4, 5]
        else:  # PyTorch's interleaved schedule (FSDP) takes counts Megatron's does not
            assert 5 in _separates(answers, 6)


def test_the_splits_key_names_what_the_splits_read() -> None:
    """``_structures`` keyed (count, GPUs per node) within the memory inputs: over clusters of 4, 8
    and 16 GPUs per node and several trainings, in one memo scope, each count's splits and
    rejections are what ``structures`` gives that cluster directly."""
    spec = model("mixtral-8x7b").spec
    trainings = (
        BASE,
        dataclasses.replace(BASE, global_batch_size=24),
        dataclasses.replace(BASE, seq_len=4100),
    )
    with shared_memory_memos():
        for training in trainings:
            for per_node, nodes in ((16, 2), (8, 4), (4, 8), (8, 8)):
                c = cluster(nodes=nodes, per_node=per_node)
                for gpus in (8, 16, 32, 24):
                    job = make_job(spec, sub_cluster(c, gpus), training, default_tuning())
                    direct, memoised = RejectionLog(), RejectionLog()
                    expected = list(structures(spec, c, job.training, gpus, direct))
                    assert _structures(job, c, gpus, memoised) == expected, (training, per_node, gpus)
                    assert memoised.groups == direct.groups


def _lean_checks(
    variant: Variant, gpus: int
) -> list[tuple[tuple[object, ...], LeanKey, int, frozenset[Structure]]]:
    """For each limit, what may share a record (memory inputs, ``_lean_key``, limit) and the
    structures a complete lean check leaves, of a fresh job (no memo shared with anything)."""
    c = variant.cluster("h100-sxm-80gb")
    job = make_job(SPEC, sub_cluster(c, gpus), variant.training, default_tuning())
    request = _Search(
        SPEC,
        job.training,
        variant.constraints,
        default_tuning(),
        offload_devices(variant.constraints.allow_offload, c),
        Budget(10**9),
        megatron_lm_switches(variant.constraints.launchers, job.training.precision),
        rejections=False,
    )  # fmt: skip  (a climb's: _narrowed shares its records)
    key = _lean_key(request, job, c)
    assert key is not None  # the GPU breaks no rule of the training
    splits = _structures(job, c, gpus, RejectionLog())
    checks = []
    for limit in LIMITS:
        if not recommender._count_can_fit(request, job, gpus, limit, SearchResult()):
            continue  # the search records nothing for such a count
        viable = _viable_structures(request, job, SearchResult(), splits, limit, every=True)
        checks.append((memory_inputs(job), key, limit, frozenset(viable)))
    return checks


LIMITS = tuple(g * GiB for g in (16, 24, 32, 48, 64))
LEAN_VARIANTS = (
    *SHARING,
    Variant("little NVMe", host_gib=64, nvme_gib=100),
    Variant("NVMe, no host RAM", nvme_gib=4096),
    Variant(
        "two frameworks",
        constraints=dataclasses.replace(FEWEST, frameworks=(Framework.FSDP, Framework.DEEPSPEED)),
    ),
    Variant(
        "fsdp compiled",
        constraints=Constraints(
            objective=Objective.FEWEST_GPUS, frameworks=(Framework.FSDP,), torch_compile=True
        ),
    ),
    Variant(  # data parallel only: a climb builds no other split
        "hf trainer", constraints=dataclasses.replace(FEWEST, launchers=(Target.HF_TRAINER,))
    ),
    Variant(
        "hf trainer and deepspeed",
        constraints=dataclasses.replace(FEWEST, launchers=(Target.HF_TRAINER, Target.DEEPSPEED)),
    ),
    Variant(
        "megatron via accelerate",
        constraints=Constraints(
            objective=Objective.FEWEST_GPUS, frameworks=(Framework.MEGATRON,), launchers=(Target.ACCELERATE,)
        ),
    ),
)


def test_the_lean_key_names_what_the_lean_check_reads() -> None:
    """A smaller card takes the viable structures a larger one recorded under the same memory
    inputs and ``_lean_key`` (``_narrowed``): sound only if those and the limit determine what a
    complete lean check leaves. Over variants of every input the check reads, equal keys give equal
    answers; and each part of the key separates some two variants that answer differently (a key
    without it would hand one the other's)."""
    answers: dict[tuple[object, ...], frozenset[Structure]] = {}
    for variant in LEAN_VARIANTS:
        for gpus in (*COUNTS, 16, 32):  # past a node: counts that differ in no memory input
            for inputs, key, limit, viable in _lean_checks(variant, gpus):
                where = (*key, inputs, limit)  # the key's 9 parts first
                assert answers.setdefault(where, viable) == viable, (variant.name, gpus)
    # the GPUs per node (key[1]) is in the memory inputs too: no two keys of one memo differ in it
    assert _separates(answers, 9) == [0, 2, 3, 4, 5, 6, 7, 8]


def test_a_sweep_answers_for_each_gpu_type_what_it_answers_alone() -> None:
    """Capacity over several GPU types (in one memo scope; some of the same memory inputs, in no
    order of size) against each type by its own request."""
    names = ("a100-sxm-40gb", "h200-sxm-141gb", "l4-24gb", "h100-sxm-80gb", "a100-sxm-80gb", "a10-24gb")
    training = dataclasses.replace(BASE, tokens=10**11)
    constraints = Constraints(objective=Objective.FEWEST_GPUS, allow_offload=False)

    def options(gpus: list[str]) -> list[tuple[object, ...]]:
        found = capacity(
            SPEC, training, default_tuning(), gpus=[gpu(n) for n in gpus], constraints=constraints
        )
        return sorted(
            (o.gpu, o.fits, o.min_gpus, o.layout, o.tokens_per_s, o.note, o.truncated) for o in found
        )

    swept = options(list(names))
    alone = sorted(option for name in names for option in options([name]))
    assert swept == alone
    assert len({o[2] for o in swept}) > 1  # the types need different counts
