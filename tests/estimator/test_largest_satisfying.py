"""The limit searches' bisection, with and without a guess: the same exact answer as counting up,
for any guess; a close guess costs a few calls (max_seq_len's secant guess lands within tokens).
The one bisection every search uses (``bisect_largest``, mirrored by ``bisect_smallest``) never
asks the bound it is given and halves the range on each call."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from service.estimator.evaluate import (
    MAX_SEQ_LEN_SEARCHED,
    bisect_largest,
    bisect_smallest,
    largest_satisfying,
)


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
