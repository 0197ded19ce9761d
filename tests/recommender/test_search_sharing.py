"""Work a sweep shares across GPU types and counts (issue 26's speed work) changes no answer.

* A smaller card checks at a count only the structures a larger card of the same memory inputs
  found viable there (``_narrowed``): sound only if a lean check that fails under a limit fails
  under every smaller one. Checked directly (viable under the smaller limit is a subset of viable
  under the larger, per count, over presets and limits), and end to end (a sweep with the narrowing
  answers as one without it, with fewer evaluations).
* The splits of a count (``_structures``) and the micro-batches of a (dp, tp, pp) are memoised with
  the memory parts: a replay adds to the rejection log what the generator adds, and the memo key
  names every field ``micro_batch_sizes`` reads.
"""

from __future__ import annotations

import itertools

import pytest

import service.recommender as recommender
from service.catalog.gpus import gpu
from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator import evaluate
from service.estimator.job import make_job, shared_memory_memos
from service.estimator.memory import stage_states
from service.estimator.types import Framework, Layout, Method, TrainingSpec
from service.recommender import (
    SearchResult,
    _narrowed,
    _record_viable,
    _Search,
    _structures,
    _viable_structures,
    space,
)
from service.recommender.budget import Budget
from service.recommender.capacity import capacity
from service.recommender.space import (
    OffloadDevices,
    RejectionLog,
    make_layout,
    megatron_lm_switches,
    micro_batch_sizes,
    recompute_order,
    shardings,
    structures,
    sub_cluster,
    virtual_stages,
)
from service.recommender.types import Constraints, Objective
from tests.recommender.helpers import cluster

GiB = 2**30
FEWEST = Constraints(objective=Objective.FEWEST_GPUS, allow_offload=False)


def _viable(name: str, method: Method, gpus: int, limit: int) -> set[object]:
    """The structures of ``gpus`` GPUs a complete lean check under ``limit`` leaves (no memo)."""
    spec = model(name).spec
    c = cluster(nodes=max(1, gpus // 8))
    training = TrainingSpec(seq_len=4096, global_batch_size=1024, method=method)
    job = make_job(spec, sub_cluster(c, gpus), training, default_tuning())
    request = _Search(
        spec,
        job.training,
        FEWEST,
        default_tuning(),
        OffloadDevices(cpu=False, nvme=False),
        Budget(10**9),
        megatron_lm_switches(None, job.training.precision),
    )
    found = list(structures(spec, c, job.training, gpus, RejectionLog()))
    result = SearchResult()
    viable = _viable_structures(request, job, result, found, limit, every=True)
    assert not result.truncated
    return set(viable)


@pytest.mark.parametrize(
    ("name", "method", "gpus"),
    [
        ("llama-3.1-70b", Method.FULL, 16),
        ("llama-3.1-70b", Method.LORA, 8),
        ("mixtral-8x7b", Method.FULL, 16),
        ("deepseek-v2-lite", Method.FULL, 8),
        ("llama-3.1-405b", Method.FULL, 64),
    ],
)
def test_a_structure_no_lean_layout_fits_under_a_limit_fits_none_under_a_smaller_one(
    name: str, method: Method, gpus: int
) -> None:
    limits = [int(g * GiB) for g in (192, 141, 96, 80, 64, 48, 40, 32, 24, 16)]
    viable = [_viable(name, method, gpus, limit) for limit in limits]
    for larger, smaller in itertools.pairwise(viable):
        assert smaller <= larger
    assert viable[0] != viable[-1]  # the limits span where structures stop fitting: the check bites


@pytest.mark.parametrize(
    ("name", "seq"),
    [("deepseek-v2-lite", 4096), ("llama-3.1-70b", 8192), ("mixtral-8x7b", 4096)],
)
def test_a_sweep_narrowed_by_larger_cards_answers_as_one_checking_every_structure(
    name: str, seq: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cards of several sizes, largest first, some sharing a size: the same options with and
    without the narrowing; the narrowing only saves evaluations."""
    names = ("h200-sxm-141gb", "h100-sxm-80gb", "a100-sxm-80gb", "a100-sxm-40gb", "l4-24gb", "a10-24gb")
    training = TrainingSpec(seq_len=seq, global_batch_size=1024, tokens=10**12)

    def run() -> list[tuple[object, ...]]:
        options = capacity(
            model(name).spec, training, default_tuning(), gpus=[gpu(n) for n in names], constraints=FEWEST
        )
        return [(o.gpu, o.fits, o.min_gpus, o.layout, o.tokens_per_s, o.note, o.evaluations) for o in options]

    narrowed = run()
    monkeypatch.setattr(recommender, "_narrowed", lambda job, key, limit, splits: splits)
    every = run()
    assert [o[:6] for o in narrowed] == [o[:6] for o in every]
    assert sum(int(o[6]) for o in narrowed) < sum(int(o[6]) for o in every)  # type: ignore[call-overload]


def test_a_plan_reports_the_rejections_of_every_structure() -> None:
    """The narrowing is for searches whose rejection log nobody reads (capacity, suggestions): a
    fewest-GPU plan on a card smaller than one searched before in the same memo scope still counts
    every structure's rejection."""
    spec = model("llama-3.1-70b").spec
    training = TrainingSpec(seq_len=4096, global_batch_size=1024)
    small = cluster("a100-sxm-40gb", nodes=2)
    alone = recommender.recommend(spec, small, training, FEWEST, default_tuning(), with_suggestions=False)
    with shared_memory_memos():
        recommender.search(
            spec, cluster(nodes=2), training, FEWEST, default_tuning(), (8, 16), stop_at_first_fit=True,
            rejections=False,
        )  # fmt: skip
        after = recommender.recommend(spec, small, training, FEWEST, default_tuning(), with_suggestions=False)
    assert after.rejected == alone.rejected
    assert after.search.memory_evaluations == alone.search.memory_evaluations


def test_the_splits_memo_logs_what_the_generator_logs() -> None:
    spec = model("deepseek-v2-lite").spec
    c = cluster(nodes=4)
    training = TrainingSpec(seq_len=4096, global_batch_size=96)
    with shared_memory_memos():
        job = make_job(spec, sub_cluster(c, 32), training, default_tuning())
        direct, memoised = RejectionLog(), RejectionLog()
        for log in (direct, memoised):
            log.add(space.TP_ACROSS_NODES, 3, Layout(dp=1, tp=16), "logged before")
        expected = []
        for gpus in (32, 24, 32):
            expected += list(structures(spec, c, job.training, gpus, direct))
        got = []
        for gpus in (32, 24, 32):  # the second 32 is a replay
            got += _structures(
                make_job(spec, sub_cluster(c, gpus), training, default_tuning()), c, gpus, memoised
            )
    assert got == expected
    assert list(memoised.groups) == list(direct.groups)
    assert memoised.groups == direct.groups


@pytest.mark.parametrize("name", ["deepseek-v2-lite", "llama-3.1-70b"])
def test_the_micro_batch_memo_key_names_what_the_sizes_read(name: str) -> None:
    """``_micro_batches`` keys on (dp, tp, pp, interleaving, SP, FSDP's schedule): every structure of
    the same key has the same sizes (cp and ep are not read)."""
    spec = model(name).spec
    c = cluster(nodes=4)
    training = TrainingSpec(seq_len=4096, global_batch_size=96)
    seen: dict[tuple[object, ...], tuple[int, ...]] = {}
    job = make_job(spec, c, training, default_tuning())
    for s in structures(spec, c, training, 32, RejectionLog()):
        for framework in Framework:
            for virtual in virtual_stages(spec, framework, s.pp):
                for sp in (False, True):
                    sizes = micro_batch_sizes(training, s, virtual, sp, framework)
                    key = (s.dp, s.tp, s.pp, virtual, sp, s.pp > 1 and framework is Framework.FSDP)
                    assert seen.setdefault(key, sizes) == sizes
                    assert recommender._micro_batches(job, s, virtual, sp, framework) == sizes
    assert len(seen) > 10


def test_a_count_is_narrowed_only_by_a_check_under_a_limit_at_least_its_own() -> None:
    """What a smaller card found unfit says nothing of a larger one; of the checks under larger
    limits, the smallest (which left the fewest structures) narrows."""
    spec = model("deepseek-v2-lite").spec
    c = cluster(nodes=4)
    training = TrainingSpec(seq_len=4096, global_batch_size=96)
    with shared_memory_memos():
        job = make_job(spec, sub_cluster(c, 32), training, default_tuning())
        splits = _structures(job, c, 32, RejectionLog())
        a, b = splits[0], splits[1]
        key = ("a key",)
        assert _narrowed(job, key, 80 * GiB, splits) == splits  # nothing known
        _record_viable(job, key, 40 * GiB, [a])
        _record_viable(job, key, 80 * GiB, [a, b])
        assert _narrowed(job, key, 96 * GiB, splits) == splits  # only smaller cards checked it
        assert _narrowed(job, key, 80 * GiB, splits) == [a, b]
        assert _narrowed(job, key, 60 * GiB, splits) == [a, b]
        assert _narrowed(job, key, 40 * GiB, splits) == [a]
        assert _narrowed(job, key, 24 * GiB, splits) == [a]
        assert _narrowed(job, None, 24 * GiB, splits) == splits  # the GPU breaks a rule: no bound


@pytest.mark.parametrize(
    ("name", "card", "seq"),
    [
        ("deepseek-v2-lite", "a10-24gb", 4096),
        ("llama-3.1-70b", "a100-sxm-40gb", 8192),
        ("mixtral-8x7b", "l40s-48gb", 4096),
        ("llama-3.1-405b", "h100-sxm-80gb", 4096),
    ],
)
def test_a_search_whose_rejections_nobody_reads_finds_what_a_logged_one_finds(
    name: str, card: str, seq: int
) -> None:
    """``rejections=False`` (capacity, suggestions) skips each lean layout whose model states alone
    exceed the limit, unevaluated, and narrows by larger cards; the same fewest-GPU answer as a
    search that evaluates and logs every miss, with fewer evaluations."""
    spec = model(name).spec
    training = TrainingSpec(seq_len=seq, global_batch_size=1024)
    counts = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    big = cluster(card, nodes=32)

    def run(rejections: bool) -> tuple[tuple[object, ...], int]:
        with shared_memory_memos():
            for larger in ("h200-sxm-141gb", "h100-sxm-80gb"):  # what a sweep searches first
                recommender.search(
                    spec, cluster(larger, nodes=32), training, FEWEST, default_tuning(), counts,
                    stop_at_first_fit=True, rejections=rejections,
                )  # fmt: skip
            found = recommender.search(
                spec, big, training, FEWEST, default_tuning(), counts, stop_at_first_fit=True,
                rejections=rejections,
            )  # fmt: skip
        best = [(s.layout, s.key, s.time.tokens_per_s) for s in found.ranked()]
        return (tuple(best), found.truncated), found.evaluations

    quiet, quiet_evaluations = run(rejections=False)
    logged, logged_evaluations = run(rejections=True)
    assert quiet == logged
    assert quiet_evaluations < logged_evaluations


@pytest.mark.parametrize(
    ("name", "method"), [("deepseek-v2-lite", Method.FULL), ("llama-3.1-70b", Method.LORA)]
)
def test_the_model_states_alone_never_exceed_a_layouts_memory(name: str, method: Method) -> None:
    """The skip's bound (``_states_fit``: each rank's model states alone) is a lower bound on the
    evaluated need: where it says a layout does not fit under a limit, its evaluation agrees, at
    the limit just below the need and every lean layout of every sharding."""
    spec = model(name).spec
    c = cluster(nodes=2)
    training = TrainingSpec(seq_len=4096, global_batch_size=256, method=method)
    job = make_job(spec, c, training, default_tuning())
    checked = 0
    for s in structures(spec, c, training, c.world_size, RejectionLog()):
        for framework in Framework:
            options, _ = shardings(framework, s, OffloadDevices(cpu=False, nvme=False))
            sizes = micro_batch_sizes(training, s, 1, s.tp > 1, framework)
            for sh in options:
                for recompute in recompute_order(framework):
                    if not sizes:
                        continue
                    layout = make_layout(
                        s, sh, recompute, 1, sizes[0], c.gpu.peer_to_peer, seq_len=training.seq_len
                    )
                    if recommender._violation(job, layout) is not None:
                        continue
                    need = evaluate.memory_numbers(job, layout)[0]
                    assert recommender._states_fit(job, layout, need)  # states never exceed the need
                    states = max(r.states.parameters + r.states.gradients + r.states.optimizer_states
                                 for r in stage_states(job, layout))  # fmt: skip
                    assert not recommender._states_fit(job, layout, int(states) - 1)
                    checked += 1
    assert checked > 50
