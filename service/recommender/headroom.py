"""The headroom policy, once: how much of a card's memory, and of a node's host RAM, a layout may use.

A fitting layout keeps a fraction of GPU memory free (allocator behaviour and framework versions
move real peaks by a few percent). By default that is the estimator's thin-headroom fraction, below
which it flags a layout that fits: the search never proposes what the estimate would call thin. A
request may ask for more (up to ``MAX_REQUESTED_FRACTION``). Runs that ran out of memory do not widen
it: they scale each layout's own dynamic memory (``Constraints.memory_dynamic_factors``). Read by the
request schema, the search, its bounds and suggestions, calibration and a plan's closest layout.
"""

from __future__ import annotations

from service.estimator.estimate import THIN_HEADROOM_FRACTION

DEFAULT_FRACTION = THIN_HEADROOM_FRACTION  # 0.05
MAX_REQUESTED_FRACTION = 0.5  # the most a request may ask to keep free


def allowed_bytes(capacity_bytes: int, headroom_fraction: float) -> int:
    """Bytes a layout may use on a card of ``capacity_bytes`` that keeps ``headroom_fraction`` free."""
    return int(capacity_bytes * (1.0 - headroom_fraction))


# Host RAM a plan's layout may use of what a node states: the same fraction the estimate warns under
# (``estimate.THIN_HEADROOM_FRACTION``): the OS and each training process need host RAM beside the
# offload's (an offload plan used 134.6 of 136 GiB; workstation review)
HOST_FRACTION = DEFAULT_FRACTION
GiB = 2**30


def allowed_host_bytes(host_bytes: int) -> int:
    """Host RAM per node a plan's layout may use of ``host_bytes`` stated (0: not stated)."""
    return allowed_bytes(host_bytes, HOST_FRACTION)


def host_to_state(need_bytes: int) -> int:
    """The least host RAM per node, in whole GiB, whose allowance (``allowed_host_bytes``) holds
    ``need_bytes``: what a suggestion tells a node to state."""
    gib = int(need_bytes / (1.0 - HOST_FRACTION)) // GiB
    while allowed_host_bytes(gib * GiB) < need_bytes:
        gib += 1
    return gib * GiB
