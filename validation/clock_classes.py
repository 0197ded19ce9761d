"""Issue 27's power-capped-parts class of the published runs: each row at its part's power limit and
at the datasheet clocks, and the report section (``sections``) that ``validation.report`` appends.

The rows are the throughput rows on a catalog part whose clock fraction is below 1
(``service.estimator.clocks``: today the 500 W Grand Teton H100, ``h100-sxm-500w-96gb``). *Before*
is the same row on the same part without its power limit: the datasheet clocks it was timed at until
issue 27 (as the 80 GB part with the variant's HBM bandwidth; its 96 GiB only moves the fit, not the
step; the docs' rows that state no HBM bandwidth also took this part's 2.4 TB/s). It is computed
here, not stored, so it moves with the rest of the estimator and the difference is the clock alone.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.catalog.gpus import gpu as catalog_gpu
from service.estimator.clocks import clock_fraction
from service.estimator.estimate import estimate
from validation import published

HALF = {"fit": "fit", "held_out": "held-out"}


def power_capped(row: published.Row) -> bool:
    """A throughput row on a catalog part that runs below its datasheet clocks."""
    return row["kind"] == "throughput" and clock_fraction(catalog_gpu(str(row["cluster"]["gpu"]))) < 1.0


@dataclass(frozen=True, slots=True)
class ClockRow:
    id: str
    split: str
    published_s: float
    datasheet_s: float  # the part without its power limit
    capped_s: float  # the part as the catalog states it

    @property
    def before(self) -> float:
        return (self.datasheet_s - self.published_s) / self.published_s

    @property
    def after(self) -> float:
        return (self.capped_s - self.published_s) / self.published_s


def clock_rows() -> tuple[ClockRow, ...]:
    """The expressible rows of the class, in file order, at the datasheet clocks and at the limit."""
    chosen = []
    for row in published.load_rows():
        if not power_capped(row):
            continue
        result = published.evaluate(row)
        if result.ours is None:
            continue
        built = published.inputs(row)
        uncapped = dataclasses.replace(built.cluster.gpu, power_limit_w=None, sustained_clock_hz=None)
        cluster = dataclasses.replace(built.cluster, gpu=uncapped)
        time = estimate(
            built.model,
            cluster,
            built.layout,
            built.training,
            tuning=published.row_tuning(row),
            with_limits=False,
        ).time
        assert time is not None
        chosen.append(ClockRow(row["id"], row["split"], result.published, time.step_s, result.ours))
    return tuple(chosen)


def _half(split: str, rows: Sequence[ClockRow], percent: Callable[[float | None], str]) -> list[str]:
    tol = published.TOLERANCE["throughput"]
    before, after = [r.before for r in rows], [r.after for r in rows]
    if not rows:
        return [HALF[split], "0", "—", "—", "—"]
    return [
        HALF[split],
        str(len(rows)),
        f"{percent(statistics.median(before))} → {percent(statistics.median(after))}",
        f"{percent(statistics.median(map(abs, before))).lstrip('+')} → "
        f"{percent(statistics.median(map(abs, after))).lstrip('+')}",
        f"{sum(abs(e) <= tol for e in before)} → {sum(abs(e) <= tol for e in after)}",
    ]


def _layout(row: published.Row) -> str:
    ly = row["layout"]
    sizes = " ".join(f"{k}{ly[k]}" for k in ("dp", "tp", "pp", "cp") if (ly.get(k) or 1) != 1 or k == "dp")
    return f"{row['cluster']['total_gpus']} GPUs; {ly['framework']} {sizes}, s{row['training']['seq_len']}"


def sections(percent: Callable[[float | None], str], table: Callable[..., list[str]]) -> list[str]:
    rows = clock_rows()
    by_id = {row["id"]: row for row in published.load_rows()}
    parts = sorted({str(by_id[r.id]["cluster"]["gpu"]) for r in rows})
    fractions = ", ".join(f"`{p}` {clock_fraction(catalog_gpu(p)):.3f}" for p in parts)
    lines = [
        "",
        "## Power-capped parts and TF32 (issue 27)",
        "",
        f"The {len(rows)} throughput rows on parts run below their datasheet clocks ({fractions} of every "
        "compute peak: `service/estimator/clocks.py`, clock ~ power^(1/3), HBM and links unscaled). "
        "*Before*: the same part without its power limit, the datasheet clocks these rows were timed at "
        "until issue 27 (the clock alone: the `ttdoc` rows, whose variant states no HBM bandwidth, were "
        "then also timed at the 80 GB part's 3.35 TB/s, not this part's 2.4); *after*: at its power "
        "limit. Memory rows do not change.",
        "",
    ]
    lines += table(
        ["half", "rows", "median step error (before → after)", "median \\|error\\|", "within 15%"],
        [_half(split, [r for r in rows if r.split == split], percent) for split in published.SPLITS],
    )
    lines.append("")
    ordered = sorted(rows, key=lambda r: (published.SPLITS.index(r.split), r.id))
    lines += table(
        ["run", "half", "precision", "layout", "published s/step", "error before", "error after"],
        [
            [
                r.id,
                HALF[r.split],
                by_id[r.id]["training"]["precision"],
                _layout(by_id[r.id]),
                f"{r.published_s:.4g}",
                percent(r.before),
                percent(r.after),
            ]
            for r in ordered
        ],
    )
    lines += [
        "",
        "TF32 (`precision: tf32`, fp32 tensors with TF32 matmuls): no published run in this set states "
        "it; `tests/estimator/test_tf32_and_clocks.py` checks it by hand (the TF32 peak in the step, "
        "fp32's memory to the byte).",
    ]
    return lines
