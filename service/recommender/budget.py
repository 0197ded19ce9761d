"""One request's work, end to end: the search, every suggestion, capacity across GPU types.

A budget counts layout evaluations (memory or step time: deterministic, so a request that stays
within it gets the same answer on any machine) and, when the caller sets one, time (a request's is
the CPU time of the thread that computes it: several requests sharing the cores and the GIL each
get their own seconds of work, so a burst does not cut every answer short), a wall-clock ceiling
(past it the machine is too busy to answer well: "busy") and a cancellation test (the client went
away). Work checks ``exhausted`` between steps and stops; what
it cut says so (``reason``). A part of the work (one suggestion, one GPU type) takes a ``share``:
its own cap on evaluations and a fair part of the time left, charged to the whole as well.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# The cancellation test may cross threads (the web shell asks its event loop): ask it at most this often.
CANCEL_POLL_S = 0.05
# A request's wall-clock ceiling, in units of its seconds of CPU: past it the answer would be a cut
# one for want of the CPU others took (8 requests at once on 2 cores get a quarter each), so the work
# stops as "busy" and the request is answered 503, to be retried, rather than a degraded plan stored.
BUSY_WALL_FACTOR = 6.0


class Budget:
    """Layout evaluations left, wall time and cancellation; a share has its own cap on both."""

    def __init__(
        self,
        max_evaluations: int,
        *,
        max_seconds: float | None = None,
        cancelled: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_deadline: float | None = None,
        split_by_evaluations: bool = False,
        _parent: Budget | None = None,
    ) -> None:
        if max_evaluations < 1:
            raise ValueError(f"a budget needs at least one evaluation, got {max_evaluations}")
        self.max_evaluations = max_evaluations
        # the request set its evaluation cap: a part that keeps the rest of the time for what follows
        # (``share``'s ``evaluation_fraction``) keeps the rest of the evaluations too, so that where the
        # cap binds before the time it ends the part at the same evaluation on any machine (a time share
        # alone ordered a search's structures by how many ceilings the CPU computed in time: the same
        # capped request answered two layouts)
        self.split_by_evaluations: bool = (
            split_by_evaluations if _parent is None else _parent.split_by_evaluations
        )
        self.spent = 0
        self._parent = _parent
        self._clock = clock
        self._deadline = None if max_seconds is None else clock() + max_seconds
        self._wall_deadline = wall_deadline  # time.monotonic() past which the whole is "busy"
        self._cancelled = cancelled if _parent is None else None
        self._polled_at = float("-inf")
        self._reason: str | None = None  # "time" or "cancelled", once seen

    def share(
        self,
        max_evaluations: int | None = None,
        parts: int = 1,
        time_fraction: float | None = None,
        *,
        evaluation_fraction: float | None = None,
        pending: int = 0,
    ) -> Budget:
        """A part's budget: at most ``max_evaluations`` and an equal share among ``parts`` parts of
        the evaluations left (what a part leaves goes to the parts after it), charged to this budget
        too. The wall time is not split among parts: they run in the order that matters most, and
        the first ones take what they need (a fair split would leave every part of a large job
        cut); ``time_fraction`` keeps the rest of the time left for what comes after this part, and
        ``evaluation_fraction`` the rest of the evaluations left (``pending`` of them made, not yet
        charged) where the request set its cap (``split_by_evaluations``), so that where the cap
        binds first the part ends at the same evaluation on any machine."""
        left = self.left() - pending  # ``pending``: evaluations made and not charged yet
        fair = max(1, left // max(1, parts))
        cap = fair if max_evaluations is None else min(fair, max_evaluations)
        if evaluation_fraction is not None and self.split_by_evaluations:
            cap = min(cap, int(left * evaluation_fraction))
        seconds = None
        if time_fraction is not None and (seconds_left := self._seconds_left()) is not None:
            seconds = seconds_left * time_fraction
        return Budget(max(1, cap), max_seconds=seconds, clock=self._clock, _parent=self)

    def _seconds_left(self) -> float | None:
        """The wall time left before this budget's or a parent's deadline; None: no deadline."""
        lefts = [b._deadline - self._clock() for b in self._lineage() if b._deadline is not None]
        return max(0.0, min(lefts)) if lefts else None

    def charge(self, evaluations: int) -> None:
        self.spent += evaluations
        if self._parent is not None:
            self._parent.charge(evaluations)

    def left(self) -> int:
        own = self.max_evaluations - self.spent
        return own if self._parent is None else min(own, self._parent.left())

    def exhausted(self, pending: int = 0) -> bool:
        """Whether the work must stop: ``pending`` uncharged evaluations reach the cap, the wall
        time of this share or of the whole ran out, or the client is gone."""
        return self.left() - pending <= 0 or self._out_of_time()

    @property
    def reason(self) -> str | None:
        """What stopped the work: "cancelled" (the client went away), "busy" (the wall-clock ceiling:
        other work took the CPU), "time" (this share's or the whole's), "evaluations" (this share's
        cap or the whole's); None while it may go on."""
        for reason in ("cancelled", "busy"):
            if any(budget._reason == reason for budget in self._lineage()):
                return reason
        if any(budget._reason == "time" for budget in self._lineage()):
            return "time"
        return "evaluations" if self.left() <= 0 else None

    def cancelled_now(self) -> bool:
        """Whether the client is gone, asked now rather than at the last poll (up to
        ``CANCEL_POLL_S`` ago): the check before work that finished is committed."""
        root = self._lineage()[-1]
        if root._reason != "cancelled" and root._cancelled is not None and root._cancelled():
            root._reason = "cancelled"
        return self.reason == "cancelled"

    def _lineage(self) -> list[Budget]:
        chain: list[Budget] = []
        budget: Budget | None = self
        while budget is not None:
            chain.append(budget)
            budget = budget._parent
        return chain

    def _out_of_time(self) -> bool:
        if self._reason is not None:
            return True
        if self._parent is not None and self._parent._out_of_time():
            return True
        now = self._clock()
        if self._deadline is not None and now >= self._deadline:
            self._reason = "time"
        elif self._wall_deadline is not None and time.monotonic() >= self._wall_deadline:
            self._reason = "busy"
        elif self._cancelled is not None and now - self._polled_at >= CANCEL_POLL_S:
            self._polled_at = now
            if self._cancelled():
                self._reason = "cancelled"
        return self._reason is not None


@dataclass(frozen=True, slots=True)
class Deadline:
    """A request's seconds of work and cancellation test, from when its work began; ``budget`` adds
    the evaluation cap the request itself sets (``Constraints.max_evaluations``). The seconds are
    the CPU time of the thread that computes (``time.thread_time``, asked in that thread), within a
    wall-clock ceiling of ``BUSY_WALL_FACTOR`` times as many from ``started``."""

    seconds: float | None = None
    cancelled: Callable[[], bool] | None = None
    started: float = field(default_factory=time.monotonic)

    def budget(self, max_evaluations: int, *, stated: bool = False) -> Budget:
        """The request's budget; ``stated``: the request set ``max_evaluations`` itself, so its parts
        share evaluations, not time (``Budget.split_by_evaluations``)."""
        if self.seconds is None:
            return Budget(max_evaluations, cancelled=self.cancelled, split_by_evaluations=stated)
        wall = self.started + BUSY_WALL_FACTOR * self.seconds
        return Budget(
            max_evaluations,
            max_seconds=self.seconds,
            cancelled=self.cancelled,
            clock=time.thread_time,
            wall_deadline=wall,
            split_by_evaluations=stated,
        )


NO_DEADLINE = Deadline()


def busy_words(deadline: Deadline) -> str:
    """Why a request that reached its wall-clock ceiling is answered 503 (``Budget.reason`` "busy")."""
    seconds = deadline.seconds or 0.0
    return (
        f"the service is busy: this request's {seconds:g} s of computing did not get the CPU within "
        f"{BUSY_WALL_FACTOR * seconds:g} s (other requests are computing); retry, and its answer is the "
        "one it gets when the machine is free (nothing was stored)"
    )
