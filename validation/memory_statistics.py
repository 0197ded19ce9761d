"""Issue 27's "memory as users see it" class: every published memory row compared with the estimate's
figure of the statistic the row reports, before and after the statistics were named.

Before, the estimate had one total (the CUDA context, NCCL's buffers and the fragmentation reserve
included) and every row was compared with it, whatever it measured; its figures are in
``validation/data/issue27_memory_statistics_before.json``. After, a row reporting PyTorch's peak
reserved is compared with the estimate's peak reserved, one reporting nvidia-smi with its device used
(``published.memory_statistic``). The report section (``sections``) is appended to ``REPORT.md`` by
``validation.report``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

from service.estimator.estimate import estimate
from validation import published
from validation.cases import DATA_DIR

BEFORE_PATH = DATA_DIR / "issue27_memory_statistics_before.json"
GiB = 2**30
# the acceptance of issue 27: memory within 10% on >= 85% of held-out rows, each with its statistic
WITHIN = published.TOLERANCE["memory"]
TARGET_FRACTION = 0.85


@dataclass(frozen=True, slots=True)
class StatisticRow:
    id: str
    split: str
    statistic: str
    published_bytes: float
    before_bytes: float | None  # the one total, compared whatever the row's statistic
    after_bytes: float | None  # the estimate's figure of the row's statistic
    fits_before: bool | None
    fits_after: bool | None
    note: str

    @property
    def before(self) -> float | None:
        return None if self.before_bytes is None else self.before_bytes / self.published_bytes - 1

    @property
    def after(self) -> float | None:
        return None if self.after_bytes is None else self.after_bytes / self.published_bytes - 1


@cache
def before_document() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(BEFORE_PATH.read_text(encoding="utf-8"))
    return loaded


@cache
def class_rows() -> tuple[StatisticRow, ...]:
    """Every memory row, in file order, with the figure compared before and after."""
    recorded = before_document()["memory"]
    assert isinstance(recorded, dict)
    results = {r.id: r for r in published.results()}
    out = []
    for row in published.load_rows():
        if row["kind"] != "memory":
            continue
        result, before = results[row["id"]], recorded.get(row["id"])
        fits = None
        if result.expressible:
            model, cluster, training, layout, _ = published.inputs(row)
            tuning = published.row_tuning(row)
            fits = estimate(model, cluster, layout, training, tuning=tuning, with_limits=False).fits
        out.append(
            StatisticRow(
                id=row["id"],
                split=row["split"],
                statistic=published.memory_statistic(row).value,
                published_bytes=result.published,
                before_bytes=None if before is None else float(before["bytes"]),
                after_bytes=result.ours,
                fits_before=None if before is None else bool(before["fits"]),
                fits_after=fits,
                note="; ".join(result.caveats) if result.expressible else f"not expressible: {result.reason}",
            )
        )
    return tuple(out)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _within(errors: Sequence[float]) -> str:
    inside = sum(abs(e) <= WITHIN for e in errors)
    return f"{inside}/{len(errors)}" if errors else "—"


def halves(rows: Sequence[StatisticRow], percent: Callable[[float | None], str]) -> list[list[str]]:
    """One line per (statistic, half), then each half over every statistic: within 10% and the median
    signed error, before -> after."""
    body = []
    groups = [(s, h) for s in sorted({r.statistic for r in rows}) for h in published.SPLITS]
    groups += [("every statistic", h) for h in published.SPLITS]
    for statistic, split in groups:
        chosen = [r for r in rows if r.split == split and statistic in (r.statistic, "every statistic")]
        if not chosen:
            continue
        before = [r.before for r in chosen if r.before is not None]
        after = [r.after for r in chosen if r.after is not None]
        body.append(
            [
                statistic,
                "fit" if split == "fit" else "held-out",
                str(len(chosen)),
                f"{_within(before)} → {_within(after)}",
                f"{percent(_median(before))} → {percent(_median(after))}",
                f"{percent(_median([abs(e) for e in after])).lstrip('+')}",
            ]
        )
    return body


def acceptance(rows: Sequence[StatisticRow]) -> tuple[int, int, bool]:
    """Held-out rows within 10% with the statistic each reports: (within, expressible, >= 85%)."""
    errors = [r.after for r in rows if r.split == "held_out" and r.after is not None]
    inside = sum(abs(e) <= WITHIN for e in errors)
    return inside, len(errors), bool(errors) and inside / len(errors) >= TARGET_FRACTION


_FINDINGS = [
    "What moved: nothing in the estimate's device used, which is the former total to the byte (the "
    "overhead is split, not changed; `evaluate.rank_memory_parts`), so no fit verdict moved (the fits "
    "column: every run published as run is estimated to fit, before and after). The torchtitan rows "
    "report PyTorch's peak reserved, which holds neither the CUDA context (768 MiB) nor NCCL's buffers "
    "(256 MiB per process group: 1-4 groups here); compared with the reserved figure they come out "
    "1.0-1.8 GiB lower than before, 1-2.5 points of error each. The fragmentation fraction (0.16) was "
    "fitted on the fit half against the total; it is not refitted against peak reserved here (that "
    "would raise every device used, and so move fit verdicts, by a constant fitted until rows pass): "
    "at 0.16 the fit half's reserved rows are 8 of 10 within 10% and the held-out half's 10 of 10.",
    "",
    "The row that reports nvidia-smi (PEFT's Llama-2-70B LoRA under DeepSpeed ZeRO-3 on 8 x 80 GB, added "
    "for this class, in the fit half by the file's rule) is 23% below its 64 GB, as the issue reports for"
    " such runs (15-26%). Its device used is 0.75 GiB of CUDA context and 0.25 GiB of NCCL buffers over "
    "peak reserved; the published measurements of what the estimate lacks are larger: one NCCL "
    "communicator holds 544-688 MB after an all-reduce on 4 A100s over NVLink (NVIDIA/nccl#964) and "
    "about 1.6 GB in NVIDIA/nccl#864, H100s open more channels (NVIDIA/nccl#986: memory is linear in "
    "channels; #1685: 32 per peer pair for all-to-all, 3.3 GB), and DeepSpeed runs without "
    "expandable segments, where the caching allocator's fragmentation was never measured here (the "
    "0.16 was fitted on torchtitan runs with them). Those are the mechanisms left to model for this "
    "statistic; they are not fitted on this one row.",
    "",
    "Since then the sharded FSDP rows grew (the after column): FSDP holds the gradients it reduces in "
    "the reduce dtype, fp32 (a layer's reduce-scatter input; under torch.distributed.pipelining the "
    "stage's gradients, accumulated in fp32 until the last micro-batch), where they were counted at "
    "2 bytes. Every run is still estimated to fit.",
]


def _gib(value: float | None) -> str:
    return "—" if value is None else f"{value / GiB:.2f}"


def _verdict(fits: bool | None) -> str:
    return "—" if fits is None else ("fits" if fits else "does not fit")


def sections(percent: Callable[[float | None], str], table: Callable[..., list[str]]) -> list[str]:
    """The report section (``percent`` and ``table`` are the report's own formatters)."""
    rows = class_rows()
    commit = str(before_document()["commit"])[:7]
    inside, scored, met = acceptance(rows)
    wrong = [r.id for r in rows if r.fits_after is False]
    lines = [
        "",
        "## Memory as users see it: statistics named (issue 27)",
        "",
        "Every memory row of the published runs, each compared with the estimate's figure of the "
        "statistic it reports (`memory_statistic` in `published_runs.json`, read from its "
        "`memory_measure`): `reserved` is PyTorch's peak reserved (`reserved_bytes.all.peak`, "
        "torchtitan's max_reserved), compared with the estimate's `peak_reserved_bytes` (tensors + the "
        "caching allocator's fragmentation reserve); `device_used` is nvidia-smi's (NVML's) figure, "
        "compared with `device_used_bytes` (peak reserved + the CUDA context + NCCL's buffers, the "
        "statistic the fit compares with the card); `allocated` (`max_memory_allocated`, litgpt's "
        "'Memory used') is compared with `peak_allocated_bytes` (those rows were added after the "
        f"issue's change: no before figure). *Before*: the estimator "
        f"at {commit}, whose one total was compared with every row whatever it measured "
        "(`validation/data/issue27_memory_statistics_before.json`); *after*: this tree. The halves are "
        "the file's, split by its rule before any number was compared.",
        "",
    ]
    lines += table(
        [
            "statistic",
            "half",
            "rows",
            "within 10% (before → after)",
            "median error (before → after)",
            "median \\|error\\| after",
        ],
        halves(rows, percent),
    )
    lines += [
        "",
        f"Acceptance, held-out memory rows within 10% with the statistic each reports on >= 85%: {inside}/"
        f'{scored}, **{"met" if met else "not met"}**. Layouts published as run and estimated "does not '
        f'fit" (device used against the card): {len(wrong)}' + (f" ({', '.join(wrong)})." if wrong else "."),
        "",
        *_FINDINGS,
        "",
    ]
    lines += table(
        [
            "run",
            "half",
            "statistic",
            "published GiB",
            "ours before GiB",
            "ours after GiB",
            "error before",
            "error after",
            "fits (before → after)",
            "note",
        ],
        [
            [
                r.id,
                "fit" if r.split == "fit" else "held-out",
                r.statistic,
                _gib(r.published_bytes),
                _gib(r.before_bytes),
                _gib(r.after_bytes),
                percent(r.before),
                percent(r.after),
                f"{_verdict(r.fits_before)} → {_verdict(r.fits_after)}",
                r.note,
            ]
            for r in rows
        ],
    )
    return lines
