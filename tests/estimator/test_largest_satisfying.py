"""The limit searches' bisection, with and without a guess: the same exact answer as counting up,
for any guess; a close guess costs a few calls (max_seq_len's secant guess lands within tokens).
The one bisection every search uses (``bisect_largest``, mirrored by ``bisect_smallest``) never
asks the bound it is given and halves the range on each call."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from service.catalog.gpus import gpu
from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator.estimate import estimate
from service.estimator.evaluate import (
    MAX_SEQ_LEN_SEARCHED,
    bisect_largest,
    bisect_smallest,
    largest_satisfying,
)
from service.estimator.types import Framework, Layout, Recompute, TrainingSpec
from service.estimator.validate import validate_layout
from validation.cases import gpu_cluster


@given(
    answer=st.integers(0, 3000),
    step=st.sampled_from([1, 2, 4, 6, 8]),
    high=st.integers(1, 3000),
    guess=st.none() | st.integers(-10, 4000),
)
def test_any_guess_gives_the_counted_answer(answer: int, step: int, high: int, guess: int | None) -> None:
    counted = max((m for m in range(step, high + 1, step) if m <= answer), default=0)
    assert largest_satisfying(step, high, step, lambda x: x <= answer, guess) == counted


def test_a_close_guess_costs_a_few_calls_where_bisection_costs_log2_of_the_range() -> None:
    calls: list[int] = []

    def ok(x: int) -> bool:
        calls.append(x)
        return x <= 29_562

    assert largest_satisfying(1, MAX_SEQ_LEN_SEARCHED, 1, ok) == 29_562
    assert len(calls) == 23  # ok(low), then log2(4M)
    calls.clear()
    assert largest_satisfying(1, MAX_SEQ_LEN_SEARCHED, 1, ok, guess=29_560) == 29_562
    assert len(calls) <= 6


@given(low=st.integers(-1, 40), width=st.integers(0, 70), cut=st.integers(0, 70))
def test_bisections_give_the_counted_answer_in_log2_calls(low: int, width: int, cut: int) -> None:
    high = low + width
    asked: list[int] = []

    def at_most(x: int) -> bool:  # holds up to low + cut
        asked.append(x)
        return x <= low + cut

    assert bisect_largest(low, high, at_most) == min(high, low + cut)
    assert low not in asked and len(asked) <= width.bit_length()
    asked.clear()

    def at_least(x: int) -> bool:  # holds from high - cut on
        asked.append(x)
        return x >= high - cut

    assert bisect_smallest(low, high, at_least) == max(low, high - cut)
    assert high not in asked and len(asked) <= width.bit_length()


def test_the_longest_sequence_answered_is_one_the_layout_accepts() -> None:
    # the limit searched memory alone: Mistral's FSDP dp 4 cp 2 answered 162,248 tokens where context
    # parallelism under FSDP refuses any sequence past the 4,096 window, and a 64-GPU Llama 3.2 1B
    # answered 1,630,208, past the 2^30 tokens per step at its batch of 1,024 (limits review)
    h100 = gpu("h100-sxm-80gb")
    cases = [
        (
            model("mistral-7b").spec,
            gpu_cluster(h100, 8, 50e9),
            TrainingSpec(seq_len=4096, global_batch_size=32),
            Layout(framework=Framework.FSDP, dp=4, cp=2, zero_stage=3, recompute=Recompute.FULL),
            4096,
        ),
        (
            model("llama-3.2-1b").spec,
            gpu_cluster(h100, 64, 50e9),
            TrainingSpec(seq_len=8192, global_batch_size=1024),
            Layout(
                framework=Framework.FSDP,
                dp=8,
                cp=8,
                zero_stage=3,
                recompute=Recompute.FULL,
                chunked_loss=True,
            ),
            2**30 // 1024,
        ),
    ]
    for spec, cluster, training, layout, most in cases:
        answer = estimate(spec, cluster, layout, training, tuning=default_tuning())
        assert answer.max_seq_len == most
        validate_layout(spec, cluster, layout, dataclasses.replace(training, seq_len=most))  # accepted
