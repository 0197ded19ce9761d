"""SearchStats counts each evaluation the search makes once: its memory evaluations are the calls
of ``evaluate.memory_numbers`` during the search, its time evaluations those of ``step_numbers``,
``floor_s`` and ``time_parts`` (a bound's parts; ``step_numbers`` and ``time_estimate`` call it
too, those calls are theirs). The search builds no result objects (``memory_estimate``,
``time_estimate``): a kept layout's step time was counted when it was ranked, and its breakdown is
built only for what is returned. A 70B search on 32 H100s once reported 749 evaluations for 566
made (the block-recompute bisection counted each of its probes twice)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import service.recommender as recommender
from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator import evaluate
from service.estimator.types import Framework, TrainingSpec
from service.recommender import Constraints, Objective, recommend
from tests.recommender.helpers import cluster

COUNTED = ("memory_numbers", "step_numbers", "floor_s", "time_parts", "time_estimate", "memory_estimate")


def counting(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Calls of each COUNTED function of ``evaluate`` made while the search runs (``_run_search``;
    the full estimates of what it returns and the suggestions are counted apart)."""
    calls: Counter[str] = Counter()
    searching = [False]

    def wrapped(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if searching[0]:
                calls[name] += 1
            return original(*args, **kwargs)

        return call

    for name in COUNTED:
        monkeypatch.setattr(evaluate, name, wrapped(name, getattr(evaluate, name)))
    run_search = recommender._run_search

    def in_search(*args: Any, **kwargs: Any) -> Any:
        searching[0] = True
        try:
            return run_search(*args, **kwargs)
        finally:
            searching[0] = False

    monkeypatch.setattr(recommender, "_run_search", in_search)
    return calls


@pytest.mark.parametrize(
    ("preset", "nodes", "frameworks", "objective"),
    [
        ("llama-3-8b", 1, (Framework.MEGATRON,), Objective.THROUGHPUT),  # block recompute's bisection
        ("llama-3-8b", 1, tuple(Framework), Objective.THROUGHPUT),
        ("llama-3-8b", 2, tuple(Framework), Objective.FEWEST_GPUS),
        ("llama-3-8b", 2, tuple(Framework), Objective.COST),  # two searches merged
    ],
)
def test_every_evaluation_is_counted_once(
    monkeypatch: pytest.MonkeyPatch,
    preset: str,
    nodes: int,
    frameworks: tuple[Framework, ...],
    objective: Objective,
) -> None:
    calls = counting(monkeypatch)
    constraints = Constraints(frameworks=frameworks, objective=objective, top_k=3)
    rec = recommend(
        model(preset).spec,
        cluster(nodes=nodes),
        TrainingSpec(seq_len=4096, global_batch_size=256),
        constraints,
        default_tuning(),
        with_suggestions=False,
    )
    assert rec.recommended is not None and calls["memory_numbers"] > 0
    assert rec.search.memory_evaluations == calls["memory_numbers"]
    assert calls["memory_estimate"] == calls["time_estimate"] == 0  # no objects while searching
    assert rec.search.time_evaluations == _time_evaluations(calls)


def _time_evaluations(calls: Counter[str]) -> int:
    """Step times, floors and bounds: ``time_parts`` less the calls ``step_numbers`` and
    ``time_estimate`` make of it."""
    bounds = calls["time_parts"] - calls["step_numbers"] - calls["time_estimate"]
    return calls["step_numbers"] + calls["floor_s"] + bounds


def test_the_work_of_every_gpu_count_searched_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Throughput on GPUs none of whose layouts runs falls back to fewer GPUs: the answer reports
    the work of every count it searched, not only the last one's."""
    calls = counting(monkeypatch)
    rec = recommend(
        model("gpt2").spec,
        cluster(nodes=1, per_node=7),  # FSDP on 7 GPUs: no launcher runs gpt2 on them
        TrainingSpec(seq_len=1024, global_batch_size=12),
        Constraints(frameworks=(Framework.FSDP,), top_k=1),
        default_tuning(),
        with_suggestions=False,
    )
    assert rec.recommended is not None and rec.recommended.layout.world_size < 7
    assert rec.search.memory_evaluations == calls["memory_numbers"]
    assert rec.search.time_evaluations == _time_evaluations(calls)


def test_a_search_into_earlier_work_checks_its_budget_against_its_own_evaluations() -> None:
    """A search into a result that holds earlier work (``_fewer_if_faster``'s fewer GPUs, a first
    fit's bisected count) checked its budget against every evaluation the result held, which the
    earlier searches had charged already: it stopped (truncated) with most of its share unspent, and
    each budget was charged once while checked twice."""
    from service.recommender import Budget, search

    spec, tuning = model("llama-3-8b").spec, default_tuning()
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    constraints = Constraints(objective=Objective.FEWEST_GPUS)
    alone = search(spec, cluster(nodes=1), training, constraints, tuning, (8,), budget=Budget(10**6))
    assert alone.best and not alone.truncated
    earlier = search(spec, cluster(nodes=1), training, constraints, tuning, (4,), budget=Budget(10**6))
    assert earlier.evaluations > alone.evaluations // 2
    budget = Budget(alone.evaluations + alone.evaluations // 4)  # enough for the 8-GPU search alone
    search(spec, cluster(nodes=1), training, constraints, tuning, (8,), budget=budget, into=earlier)
    assert not earlier.truncated
    assert earlier.uncharged == 0  # what it spent is charged, once
    assert 0 < budget.spent <= budget.max_evaluations
