"""The writer lock between service processes: a blocking `flock` bounded by a timeout (FileLock),
no polling. Two opens of one file stand for two processes (`flock` locks of separate opens exclude
each other, in one process as across processes)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.persistence.db import FileLock


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[FileLock, FileLock]]:
    path = str(tmp_path / "db-writer.lock")
    one, other = (FileLock(os.open(path, os.O_RDWR | os.O_CREAT, 0o644)) for _ in range(2))
    yield one, other
    one.close()
    other.close()


def test_a_held_lock_times_out_after_its_timeout(pair: tuple[FileLock, FileLock]) -> None:
    one, other = pair
    assert one.acquire(0.0)
    started = time.monotonic()
    assert not other.acquire(0.2)
    assert 0.2 <= time.monotonic() - started < 0.5
    assert not other.acquire(0.0)  # a try without waiting
    one.release()
    # the helper left waiting by the timed-out taker takes the freed lock and hands it back; a taker
    # that comes during that hand-over waits for it (the service always takes with a timeout)
    assert other.acquire(0.5)


def test_a_waiter_gets_the_lock_as_soon_as_it_is_released(pair: tuple[FileLock, FileLock]) -> None:
    one, other = pair
    assert one.acquire(0.0)
    released_at: list[float] = []

    def release_later() -> None:
        time.sleep(0.1)
        released_at.append(time.monotonic())
        one.release()

    threading.Thread(target=release_later).start()
    assert other.acquire(5.0)
    assert time.monotonic() - released_at[0] < 0.05  # handed over, not found by a poll
    assert not one.acquire(0.0)
    other.release()
    assert one.acquire(0.0)


def test_a_lock_taken_after_its_taker_gave_up_goes_to_the_next_or_back(
    pair: tuple[FileLock, FileLock],
) -> None:
    one, other = pair
    assert one.acquire(0.0)
    assert not other.acquire(0.05)  # its helper still waits in flock
    one.release()
    time.sleep(0.05)  # the helper takes it, finds no taker and gives it back
    assert one.acquire(0.0)
    assert not other.acquire(0.05)
    threading.Timer(0.05, one.release).start()
    assert other.acquire(5.0)  # the next taker gets what the helper takes
    other.release()
