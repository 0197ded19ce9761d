"""One request's work, end to end: the search, every suggestion, capacity across GPU types.

A budget counts layout evaluations (memory or step time: deterministic, so a request that stays
within it gets the same answer on any machine) and, when the caller sets one, wall time and a
cancellation test (the client went away). Work checks ``exhausted`` between steps and stops; what
it cut says so (``reason``). A part of the work (one suggestion, one GPU type) takes a ``share``:
its own cap on evaluations, charged to the whole as well, under the same clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# The cancellation test may cross threads (the web shell asks its event loop): ask it at most this often.
CANCEL_POLL_S = 0.05


class Budget:
    """Layout evaluations left, and the deadline and cancellation shared by every share."""

    def __init__(
        self,
        max_evaluations: int,
        *,
        max_seconds: float | None = None,
        cancelled: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        _parent: Budget | None = None,
    ) -> None:
        if max_evaluations < 1:
            raise ValueError(f"a budget needs at least one evaluation, got {max_evaluations}")
        self.max_evaluations = max_evaluations
        self.spent = 0
        self._parent = _parent
        self._clock = clock
        root = _parent._root if _parent is not None else self
        self._root: Budget = root
        if _parent is None:
            self._deadline = None if max_seconds is None else clock() + max_seconds
            self._cancelled = cancelled
            self._polled_at = float("-inf")
            self._reason: str | None = None

    def share(self, max_evaluations: int | None = None, parts: int = 1) -> Budget:
        """A part's budget: at most ``max_evaluations`` and an equal share of what is left among
        ``parts`` parts, charged to this budget too."""
        fair = max(1, self.left() // max(1, parts))
        cap = fair if max_evaluations is None else min(fair, max_evaluations)
        return Budget(max(1, cap), clock=self._clock, _parent=self)

    def charge(self, evaluations: int) -> None:
        self.spent += evaluations
        if self._parent is not None:
            self._parent.charge(evaluations)

    def left(self) -> int:
        own = self.max_evaluations - self.spent
        return own if self._parent is None else min(own, self._parent.left())

    def exhausted(self, pending: int = 0) -> bool:
        """Whether the work must stop: ``pending`` uncharged evaluations reach the cap, the wall
        time ran out, or the client is gone (the last two for every share at once)."""
        return self.left() - pending <= 0 or self._root._out_of_time()

    @property
    def reason(self) -> str | None:
        """What stopped the work: "time" or "cancelled" (every share), "evaluations" (this one's
        cap or the whole's); None while it may go on."""
        if self._root._reason is not None:
            return self._root._reason
        return "evaluations" if self.left() <= 0 else None

    def _out_of_time(self) -> bool:
        if self._reason is not None:
            return True
        now = self._clock()
        if self._deadline is not None and now >= self._deadline:
            self._reason = "time"
        elif self._cancelled is not None and now - self._polled_at >= CANCEL_POLL_S:
            self._polled_at = now
            if self._cancelled():
                self._reason = "cancelled"
        return self._reason is not None


@dataclass(frozen=True, slots=True)
class Deadline:
    """A request's wall time and cancellation test, from when its work began; ``budget`` adds the
    evaluation cap the request itself sets (``Constraints.max_evaluations``)."""

    seconds: float | None = None
    cancelled: Callable[[], bool] | None = None
    started: float = field(default_factory=time.monotonic)

    def budget(self, max_evaluations: int) -> Budget:
        left = None if self.seconds is None else max(0.0, self.started + self.seconds - time.monotonic())
        return Budget(max_evaluations, max_seconds=left, cancelled=self.cancelled)


NO_DEADLINE = Deadline()
