"""Sustained clocks: the share of its datasheet compute peaks a GPU reaches at the clock it holds.

A tensor core (and a CUDA core) retires a fixed number of FLOPs per clock, so every compute peak is
SMs x FLOPs per SM per clock x clock: the NVIDIA H100 whitepaper's 989.4e12 dense bf16 FLOP/s is
132 SMs x 4,096 x 1.83 GHz. A part that holds a lower clock computes proportionally less; HBM
bandwidth has its own clock and does not scale with it.

The clock a part holds under load is set by its power limit. Dynamic power is C V^2 f and, across
the DVFS range, the voltage rises with the clock, so power grows as about f^3 and the clock a power
limit allows as its cube root. NVIDIA's datasheets for the same 132-SM GH100 die bear this out: the
H100 SXM5 at 700 W prints 989.4e12 dense bf16 FLOP/s (1.83 GHz), the H100 NVL at 400 W prints
835.5e12 (1,671e12 with sparsity; 1.545 GHz), a ratio of 0.844 where (400 / 700)^(1/3) = 0.830
(1.7% below it: the rule errs slow). A GPU states either the power limit it runs at below the
board power its peaks are quoted at (``GPUSpec.power_limit_w``, ``rated_power_w``), or the clock
it was measured to hold (``sustained_clock_hz``, against ``peak_clock_hz``); a stated clock wins.
"""

from __future__ import annotations

import math

from service.estimator.types import GPUSpec


def power_capped_clock_fraction(power_limit_w: float, rated_power_w: float) -> float:
    """The clock a power limit allows, as a fraction of the clock at the rated board power."""
    # power ~ f^3 in the DVFS range (P = C V^2 f, V ~ f), so f ~ P^(1/3); checked against the H100
    # SXM5 (700 W, 1.83 GHz) and H100 NVL (400 W, 1.545 GHz) datasheet peaks (module docstring)
    return math.cbrt(power_limit_w / rated_power_w)


def clock_fraction(gpu: GPUSpec) -> float:
    """The share of its datasheet peaks the GPU computes at: sustained over peak clock where the clock
    is stated, else what its power limit allows, else 1."""
    if gpu.sustained_clock_hz is not None and gpu.peak_clock_hz is not None:
        return gpu.sustained_clock_hz / gpu.peak_clock_hz
    if gpu.power_limit_w is not None and gpu.rated_power_w is not None:
        return power_capped_clock_fraction(gpu.power_limit_w, gpu.rated_power_w)
    return 1.0


def clock_note(gpu: GPUSpec) -> str | None:
    """The clock the step time assumed, in words, where it is not the datasheet's; else None."""
    fraction = clock_fraction(gpu)
    if fraction == 1.0:
        return None
    if gpu.sustained_clock_hz is not None and gpu.peak_clock_hz is not None:
        why = (
            f"its sustained clock {gpu.sustained_clock_hz / 1e9:.3g} GHz of the "
            f"{gpu.peak_clock_hz / 1e9:.3g} GHz behind the datasheet peaks"
        )
    else:
        assert gpu.power_limit_w is not None and gpu.rated_power_w is not None  # clock_fraction < 1
        clock = ""
        if gpu.peak_clock_hz is not None:
            clock = f", {fraction * gpu.peak_clock_hz / 1e9:.3g} GHz of {gpu.peak_clock_hz / 1e9:.3g} GHz"
        why = (
            f"its {gpu.power_limit_w:g} W power limit of the {gpu.rated_power_w:g} W the peaks are quoted at "
            f"(clock ~ power^(1/3){clock})"
        )
    return f"compute peaks at {fraction:.3f} of the datasheet's: {why}; HBM and links unscaled"
