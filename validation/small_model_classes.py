"""Issue 27's small-models class of the published runs: the throughput rows of encoder models (BERT,
RoBERTa: ``ModelSpec.bidirectional``), and the report section (``sections``) that
``validation.report`` appends.

*Before* issue 27 these rows could not be expressed at all (``model_type 'bert'`` was refused with
a 422), so there is no earlier estimate to compare with: the section gives each half's errors now,
the fit verdict of every row (each ran on its card), and the class's acceptance target (held-out
median step-time error within 15%).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.estimator.estimate import estimate
from validation import published

HALF = {"fit": "fit", "held_out": "held-out"}
TARGET_MEDIAN = 0.15  # issue 27: each class's held-out rows, median step-time error <= 15%


@dataclass(frozen=True, slots=True)
class EncoderRow:
    id: str
    split: str
    published_s: float
    ours_s: float
    fits: bool
    device_used_gib: float

    @property
    def error(self) -> float:
        return (self.ours_s - self.published_s) / self.published_s


def encoder_rows() -> tuple[EncoderRow, ...]:
    """The expressible throughput rows whose model is a bidirectional encoder, in file order."""
    chosen = []
    for row in published.load_rows():
        if row["kind"] != "throughput":
            continue
        try:
            built = published.inputs(row)
        except published.Unexpressible:
            continue
        if not built.model.bidirectional:
            continue
        est = estimate(
            built.model,
            built.cluster,
            built.layout,
            built.training,
            tuning=published.row_tuning(row),
            with_limits=False,
        )
        assert est.time is not None
        used = est.memory.per_gpu.device_used_bytes
        chosen.append(
            EncoderRow(
                row["id"],
                row["split"],
                row["step_s"],
                est.time.step_s,
                est.memory.headroom_bytes >= 0,
                used / 2**30,
            )
        )
    return tuple(chosen)


def _half(split: str, rows: Sequence[EncoderRow], percent: Callable[[float | None], str]) -> list[str]:
    if not rows:
        return [HALF[split], "0", "—", "—", "—", "—"]
    errors = [r.error for r in rows]
    tol = published.TOLERANCE["throughput"]
    return [
        HALF[split],
        str(len(rows)),
        percent(statistics.median(errors)),
        percent(statistics.median(map(abs, errors))).lstrip("+"),
        f"{sum(abs(e) <= tol for e in errors)}/{len(rows)}",
        f"{sum(r.fits for r in rows)}/{len(rows)}",
    ]


def sections(percent: Callable[[float | None], str], table: Callable[..., list[str]]) -> list[str]:
    rows = encoder_rows()
    by_id = {row["id"]: row for row in published.load_rows()}
    held = [r.error for r in rows if r.split == "held_out"]
    median = statistics.median(map(abs, held)) if held else None
    met = median is not None and median <= TARGET_MEDIAN
    lines = [
        "",
        "## Small models and short steps: encoders (issue 27)",
        "",
        f"The {len(rows)} throughput rows of encoder models: BERT-large SQuAD fine-tuning from NVIDIA "
        "DeepLearningExamples' PyTorch BERT README (two editions; `validation/data/published_runs.md`, "
        "'Issue 27: small models'). Before issue 27 none was expressible (`model_type 'bert'` was refused), "
        "so there is no earlier figure; ours now: bidirectional attention over the whole square, post-LN "
        "layers, token-type embeddings and the question-answering head, eager attention with its dropout.",
        "",
    ]
    lines += table(
        ["half", "rows", "median step error", "median \\|error\\|", "within 15%", "estimated to fit"],
        [_half(split, [r for r in rows if r.split == split], percent) for split in published.SPLITS],
    )
    lines += [
        "",
        f"- held-out median step-time \\|error\\| within {TARGET_MEDIAN:.0%}: "
        f"{percent(median).lstrip('+') if median is not None else '—'}, **{'met' if met else 'not met'}**",
        "",
    ]
    ordered = sorted(rows, key=lambda r: (published.SPLITS.index(r.split), r.id))
    lines += table(
        ["run", "half", "precision, micro-batch", "GPU", "published s/step", "ours", "error", "device used"],
        [
            [
                r.id,
                HALF[r.split],
                f"{by_id[r.id]['training']['precision']}, {by_id[r.id]['layout']['micro_batch_size']}",
                f"{by_id[r.id]['cluster']['total_gpus']} x {by_id[r.id]['cluster']['gpu']}",
                f"{r.published_s:.4g}",
                f"{r.ours_s:.4g}",
                percent(r.error),
                f"{r.device_used_gib:.1f} GiB{'' if r.fits else ' (does not fit)'}",
            ]
            for r in ordered
        ],
    )
    return lines
