"""The collector's threshold while searches run (service/recommender/collector.py)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator.types import TrainingSpec
from service.recommender import capacity as capacity_module
from service.recommender.collector import SEARCH_GEN0_THRESHOLD, fewer_collections


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield gc.get_threshold()
    gc.set_threshold(*saved)


def test_raised_while_any_search_runs_and_restored_after_the_last(thresholds: tuple[int, int, int]) -> None:
    with fewer_collections():
        assert gc.get_threshold() == (SEARCH_GEN0_THRESHOLD, 10, 10)
        with fewer_collections():  # a second search (another thread, or a nested one)
            assert gc.get_threshold()[0] == SEARCH_GEN0_THRESHOLD
        assert gc.get_threshold()[0] == SEARCH_GEN0_THRESHOLD  # the first still runs
    assert gc.get_threshold() == thresholds


def test_overlapping_searches_in_threads_restore_the_thresholds(thresholds: tuple[int, int, int]) -> None:
    # searches that begin and end in any interleaving: the last one out restores what the first saw
    inside = threading.Barrier(4)

    def search() -> None:
        with fewer_collections():
            inside.wait(timeout=10)

    threads = [threading.Thread(target=search) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert gc.get_threshold() == thresholds


def test_a_collector_switched_off_stays_off(thresholds: tuple[int, int, int]) -> None:
    gc.set_threshold(0, 10, 10)
    with fewer_collections():
        assert gc.get_threshold()[0] == 0
    assert gc.get_threshold() == (0, 10, 10)


def test_a_search_leaves_no_reference_cycle_for_the_collector(thresholds: tuple[int, int, int]) -> None:
    # the premise of a rarer collector: what a search allocates, reference counting frees
    spec, training = model("mixtral-8x7b").spec, TrainingSpec(seq_len=4096, global_batch_size=256)
    capacity_module.capacity(spec, training, default_tuning())
    gc.collect()
    gc.disable()
    try:
        capacity_module.capacity(spec, training, default_tuning())
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_an_other_gpu_skipped_for_want_of_budget_names_its_gpu() -> None:
    """Two "other_gpu: the request's time budget ran out first" named no GPU, so the largest cards'
    absence read as unexplained (bounded-work review)."""
    from service.recommender.budget import Budget
    from service.recommender.suggest import _Collector

    spent = Budget(10, max_seconds=0.0)
    collect = _Collector(spent)
    collect.run("other_gpu", 1, lambda budget: [], "b200-sxm-180gb")
    collect.run("more_gpus", 1, lambda budget: [])
    assert [s.reason for s in collect.skipped] == [
        "b200-sxm-180gb: the request's time budget ran out first",
        "the request's time budget ran out first",
    ]
