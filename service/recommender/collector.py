"""Python's cyclic garbage collector while a search runs.

A search allocates millions of short-lived objects (layouts, memo keys, partial sums) and keeps its
memos until it ends; none forms a reference cycle, so reference counting frees them all, and every
pass of the cyclic collector over them is wasted work. With CPython's default first-generation
threshold (700 allocations) the collector ran 935 times in three DeepSeek-V3 capacity sweeps and took
17% of their time, 28% inside the service's process, whose imported modules each full pass walks
again (bench/README.md, "The garbage collector"). During a search the threshold is raised, so the
collector runs about 30 times less often; it still runs, so a cycle made meanwhile is still freed.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# first-generation threshold while any search runs (CPython's default is 700; the second and third
# generations keep theirs, so a full pass runs after 100x as many allocations as a young one)
SEARCH_GEN0_THRESHOLD = 20_000

_lock = threading.Lock()
_running = 0  # searches running now, in every thread of the process
_saved: tuple[int, int, int] | None = None  # the thresholds before the first of them began


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Raise the collector's first-generation threshold for as long as any search of the process
    runs (the thresholds are process-wide: the first search to begin saves them, the last to end
    restores them). A collector switched off (threshold 0) stays off."""
    global _running, _saved
    with _lock:
        if _running == 0:
            _saved = gc.get_threshold()
            if _saved[0]:
                gc.set_threshold(max(_saved[0], SEARCH_GEN0_THRESHOLD), *_saved[1:])
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if _running == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None


_frozen = False


def freeze_startup_objects() -> None:
    """Move every object alive now (the imported modules, the app) to the collector's permanent
    generation, which no pass walks (``gc.freeze``): once per process, when its first app has
    started (a test process starts many; garbage made after the first is collected as usual)."""
    global _frozen
    with _lock:
        if not _frozen:
            gc.freeze()
            _frozen = True
