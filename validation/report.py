"""Write ``validation/REPORT.md``: every validated case, the reference number, ours and the error.

    python -m validation.report

Reads the committed measurements (``validation/data/*.json``) and the published cases
(``../shared/reference/cases/visible.json``), recomputes our numbers with the estimator
(``validation.cases``) and writes the report. Needs no torch, and the output depends only on those
inputs (no timestamps but the ones stored in the data files), so an unchanged tree rewrites the same
file. Exits 1 when a row expected to pass fails, or a known gap unexpectedly passes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from validation import (
    cases,
    clock_classes,
    device_memory,
    memory_statistics,
    moe_classes,
    network_classes,
    published,
    small_model_classes,
)
from validation.cases import Expect, Row

REPORT_PATH = cases.ROOT / "validation" / "REPORT.md"


@dataclass(frozen=True, slots=True)
class SectionSummary:
    section: str
    cases: int  # distinct case ids that count (not excluded)
    checks: int  # rows that count
    within_tolerance: int
    known_gaps: int
    excluded: int
    worst: Row | None  # largest |error| among the rows expected to pass

    @property
    def unexpected(self) -> int:
        return self.checks - self.within_tolerance - self.known_gaps


def worst_text(s: SectionSummary) -> str:
    if s.worst is None:
        return "—"
    if s.worst.error == 0:
        return "0 (every row exact)"
    return f"{percent(s.worst.error)} ({s.worst.case_id})"


def summarize(section: str, rows: Sequence[Row]) -> SectionSummary:
    counted = [r for r in rows if r.expect is not Expect.EXCLUDED]
    expected_to_pass = [r for r in counted if r.expect is Expect.PASS and r.error is not None]
    worst = max(expected_to_pass, key=lambda r: abs(r.error or 0.0), default=None)
    return SectionSummary(
        section=section,
        cases=len({r.case_id for r in counted}),
        checks=len(counted),
        within_tolerance=sum(r.ok for r in counted),
        known_gaps=sum(r.expect is Expect.KNOWN_GAP for r in counted),
        excluded=len(rows) - len(counted),
        worst=worst,
    )


def failures(rows: Sequence[Row]) -> list[Row]:
    """Rows expected to pass that fail, and known gaps that now pass (remove their mark)."""
    return [r for r in rows if not r.as_expected]


# ---------------------------------------------------------------- formatting


def number(x: float | str) -> str:
    if isinstance(x, str):
        return x
    if math.isfinite(x) and float(x).is_integer():
        return f"{int(x):,}"
    if abs(x) >= 1e4:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:,.2f}"
    return f"{x:.4g}"


def percent(error: float | None) -> str:
    if error is None:
        return "—"
    if not math.isfinite(error):
        return "inf"
    return f"{0.0 if abs(error) < 5e-9 else error:+.2%}"  # float noise of an exact formula: 0


def tolerance(row: Row) -> str:
    if row.unit == "verdict":
        return "same verdict"
    if row.abs_tolerance and row.tolerance:
        return f"±max({row.abs_tolerance:g} {row.unit}, {row.tolerance:.0%})"
    if row.abs_tolerance:
        return f"±{row.abs_tolerance:g} {row.unit}"
    if row.tolerance <= 1e-9:  # 0, or float rounding of an exact formula
        return "exact"
    return f"±{row.tolerance:.0%}"


def result(row: Row) -> str:
    if row.expect is Expect.EXCLUDED:
        return "excluded"
    if row.expect is Expect.KNOWN_GAP:
        return "known gap (fails as expected)" if not row.ok else "**known gap now passes**"
    return "ok" if row.ok else "**FAIL**"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in line) + " |" for line in body]
    return lines


# ---------------------------------------------------------------- the document


def _versions(records: Sequence[dict[str, Any]]) -> str:
    torch = sorted({str(r.get("torch")) for r in records})
    transformers = sorted({str(r.get("transformers")) for r in records})
    return f"torch {', '.join(torch)}, transformers {', '.join(transformers)}"


def _measured_on(document: dict[str, Any]) -> str:
    date = document.get("measured_on")
    return f"measured on {date}" if date else "measurement date not recorded in the file"


def sources() -> list[str]:
    """The header's list of inputs: commands, versions and dates as stored in the data files."""
    params = cases.param_count_document()
    acts = cases.activation_document()
    return [
        f"- `validation/data/param_counts.json` ({len(params['cases'])} models, built on the meta device): "
        f"regenerate with `{params['generated_by']}`; {_versions([params])}; {_measured_on(params)}.",
        f"- `validation/data/activations.json` ({len(acts['cases'])} cases, one training forward on the "
        f"CPU): regenerate with `{acts['regenerate']}`; {_versions(acts['cases'])}; {_measured_on(acts)}.",
        # Named as the checkout sees it, not by where this machine keeps it: the same text everywhere.
        "- `../shared/reference/cases/visible.json`: the published numbers "
        f"({len(cases.published_cases())} cases; "
        "ZeRO, DeepSpeed, Megatron-LM, Korthikanti, Narayanan, Megatron-Core, BigScience).",
    ]


def render(rows: Sequence[Row]) -> str:
    by_section = {s: [r for r in rows if r.section == s] for s in cases.SECTIONS}
    summaries = [summarize(s, by_section[s]) for s in cases.SECTIONS]
    bad = failures(rows)
    lines = [
        "# Validation report",
        "",
        "Written by `python -m validation.report` (the last step of `python -m validation.run --ci` and "
        "`--all`); do not edit by hand. Reference values come from:",
        "",
        *sources(),
        "",
        "Ours: `service.estimator` of this tree, through `validation/cases.py`. Error = (ours − reference) "
        "/ reference. A known gap is a case we miss for a stated reason (a strict xfail in the tests); "
        "an excluded row is not comparable and says why.",
        "",
        "## Summary",
        "",
    ]
    lines += table(
        ["section", "cases", "checks", "within tolerance", "known gaps", "excluded", "worst error (case)"],
        [
            [
                s.section,
                str(s.cases),
                str(s.checks),
                str(s.within_tolerance),
                str(s.known_gaps),
                str(s.excluded),
                worst_text(s),
            ]
            for s in summaries
        ],
    )
    lines.append("")
    if bad:
        lines.append(
            f"**{len(bad)} row(s) not as expected:** " + ", ".join(f"{r.case_id} ({r.quantity})" for r in bad)
        )
    else:
        passing = sum(s.within_tolerance for s in summaries)
        gaps = sum(s.known_gaps for s in summaries)
        lines.append(
            f"Every row expected to pass is within its tolerance ({passing} checks); "
            + (
                f"the {gaps} known gap{'s' if gaps != 1 else ''} fail{'' if gaps != 1 else 's'} as expected."
                if gaps
                else "there is no known gap."
            )
        )
    for section in cases.SECTIONS:
        lines += ["", f"## {section[0].upper()}{section[1:]}", ""]
        lines += table(
            ["case", "quantity", "reference", "ours", "unit", "error", "tolerance", "result", "note"],
            [
                [
                    r.case_id,
                    r.quantity,
                    number(r.reference),
                    number(r.ours),
                    r.unit,
                    percent(r.error),
                    tolerance(r),
                    result(r),
                    r.note,
                ]
                for r in by_section[section]
            ],
        )
    lines += published_section()
    lines += nvidia_recipes_section()
    lines += clock_classes.sections(percent, table)
    lines += network_classes.sections(percent, table)
    lines += moe_classes.sections(percent, table)
    lines += small_model_classes.sections(percent, table)
    lines += memory_statistics.sections(percent, table)
    lines += device_memory.sections(percent, table)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- published runs (reported, not gated)

_HALF = {"fit": "fit", "held_out": "held-out"}


def _fraction(part: int, whole: int) -> str:
    return f"{part}/{whole} ({part / whole:.0%})" if whole else "—"


def _worst(result: published.Result | None) -> str:
    return "—" if result is None else f"{percent(result.error)} ({result.id})"


def _display(result: published.Result, value: float | None) -> str:
    shown = result.display(value)
    return "—" if shown is None else number(round(shown, 4))


TUNING_TOML = Path(__file__).parents[1] / "service" / "catalog" / "tuning.toml"


def fitted_on_the_fit_half() -> list[str]:
    """The catalog's tuning entries whose source says they were fitted on the fit half: a
    ``[[peak_fraction.chip]]`` entry, or a ``name`` whose ``<stem>_source`` says so."""
    tuning = tomllib.loads(TUNING_TOML.read_text())

    def fitted(text: object) -> bool:
        return isinstance(text, str) and text.lower().startswith("fitted on") and "fit half" in text

    found = [
        f"peak_fraction {chip['chip']} = {chip['fraction']}"
        for chip in tuning["peak_fraction"]["chip"]
        if fitted(chip["source"])
    ]
    for section, table in tuning.items():
        for key, text in table.items() if isinstance(table, dict) else ():
            if key.endswith("_source") and fitted(text):
                stem = key.removesuffix("_source")
                name = next(k for k in table if k.startswith(stem) and not k.endswith("source"))
                found.append(f"{section}.{name} = {table[name]}")
    return found


def published_section() -> list[str]:
    """Published runs (``validation/data/published_runs.json``): each half and kind on its own
    row, every row, the rows the service cannot express by reason, and the acceptance targets.
    Reported only: ``main``'s exit status does not depend on them."""
    rows = published.results()
    summary = published.summarize(rows)
    document = published.document()
    tput, mem = summary.half("held_out", "throughput"), summary.half("held_out", "memory")
    lines = [
        "",
        "## Published runs (fit and held-out halves)",
        "",
        f"`validation/data/published_runs.json`: {len(rows)} published training runs (step time, and "
        "peak memory per GPU, max over ranks, each memory row compared with the estimate's figure of the "
        "statistic it reports: PyTorch's peak reserved, peak allocated, or device used as nvidia-smi shows "
        "it), described "
        "with their split rule in `validation/data/published_runs.md`; read by `validation/published.py`. "
        "Each row was assigned to the fit or the held-out half before any number was compared: "
        f"{cell(document['split_rule'])} The halves are reported separately, never pooled. Error = "
        "(ours − published) / published; a row matches within 15% (step time) or 10% (memory). "
        "Ours: `estimate` with the catalog GPU and tuning; a row's caveats name what it sets that the "
        "service has no field for. These rows are reported, not gated: they do not change this "
        "command's exit status.",
        "",
        "Tuning numbers fitted on the fit half (their sources in `service/catalog/tuning.toml` say how): "
        + "; ".join(fitted_on_the_fit_half())
        + ". Nothing is fitted on the held-out half.",
        "",
    ]
    lines += table(
        [
            "half",
            "kind",
            "rows",
            "expressible",
            "within tolerance",
            "median \\|error\\|",  # the header is not escaped by table()
            "median error",
            "worst (row)",
        ],
        [
            [
                _HALF[h.split],
                h.kind,
                str(h.rows),
                str(h.expressible),
                _fraction(h.within, h.expressible),
                percent(h.median_abs_error).lstrip("+"),
                percent(h.median_signed_error),
                _worst(h.worst),
            ]
            for h in summary.halves
        ],
    )
    lines += [
        "",
        "Acceptance targets, on the held-out half's expressible rows "
        f"({tput.expressible} of {tput.rows} throughput rows, {mem.expressible} of {mem.rows} memory rows):",
        "",
    ]
    lines += [
        f"- {t.text}: {t.value}, **{'met' if t.met else 'not met'}**" for t in published.targets(summary)
    ]
    lines += [
        "",
        "### Every row",
        "",
    ]
    ordered = sorted(
        rows, key=lambda r: (published.SPLITS.index(r.split), published.KINDS.index(r.kind), r.id)
    )
    lines += table(
        ["run", "half", "kind", "published", "ours", "unit", "error", "note"],
        [
            [
                r.id,
                _HALF[r.split],
                r.kind,
                _display(r, r.published),
                _display(r, r.ours),
                published.UNIT[r.kind],
                percent(r.error),
                "; ".join(([f"statistic: {r.statistic}"] if r.statistic else []) + list(r.caveats))
                if r.expressible
                else f"not expressible: {r.reason}",
            ]
            for r in ordered
        ],
    )
    lines += ["", "### Rows the service cannot express", ""]
    lines += table(
        ["reason", "rows", "runs"],
        [[reason, str(len(ids)), ", ".join(ids)] for reason, ids in summary.unexpressible],
    )
    marked = {row["id"]: bool(row["expressible_now"]) for row in published.load_rows()}
    newly = sorted(r.id for r in rows if r.expressible and not marked[r.id])
    refused = sorted(r.id for r in rows if not r.expressible and marked[r.id])
    lines.append("")
    lines.append(
        "The file's `expressible_now` is its authors' judgement when it was assembled; "
        f"{len(newly)} row(s) it marks not expressible are expressible now"
        + (f" ({', '.join(newly)})" if newly else "")
        + f", and {len(refused)} row(s) it marks expressible are refused"
        + (f" ({', '.join(refused)})." if refused else ".")
    )
    return lines


def _recipe_layout(row: dict[str, Any]) -> str:
    ly, c = row["layout"], row["cluster"]
    sizes = " ".join(f"{k}{ly[k]}" for k in ("tp", "pp", "cp") if ly.get(k, 1) != 1)
    vp = f" vp{ly['virtual_pipeline_stages']}" if ly.get("virtual_pipeline_stages", 1) != 1 else ""
    words = [str(c["total_gpus"]), c["gpu"].split("-")[0].upper(), f"dp{ly['dp']}", sizes + vp]
    return " ".join(word for word in (*words, f"mbs{ly['micro_batch_size']}") if word)


def _verdict(result: published.RecipeResult) -> str:
    if result.fits is None:
        return "—"
    return "fits" if result.fits else "**does not fit**"


def _gib(result: published.RecipeResult) -> str:
    return "—" if result.memory_bytes is None else f"{result.memory_bytes / published.GiB:.1f}"


def _recipe_half(split: str, results: Sequence[published.RecipeResult]) -> list[str]:
    chosen = [r for r in results if r.split == split and r.fits is not None]
    errors = [r.step_error for r in chosen if r.step_error is not None]
    refused = sum(1 for r in chosen if not r.fits)
    if not errors:
        return [_HALF[split], "0", "—", "—", "—"]
    median_abs = statistics.median(abs(e) for e in errors)
    return [
        _HALF[split],
        str(len(chosen)),
        str(refused),
        percent(median_abs).lstrip("+"),
        percent(statistics.median(errors)),
    ]


def nvidia_recipes_section() -> list[str]:
    """Issue 27's first class: Megatron-Core layouts NVIDIA ships, before and after its changes."""
    after = published.recipe_results()
    before = published.recipes_before()
    rows = {row["id"]: row for row in published.load_rows()}
    lines = [
        "",
        "## Layouts NVIDIA ships (issue 27, first class)",
        "",
        f"The {len(after)} throughput rows of dense models that NVIDIA measured with Megatron-Core and "
        "its own recipes (sources `megatron-bridge-perf`, `nemo-24.07-perf`, `nemo-25.02-perf`, "
        "`mlperf-training`; "
        "`validation.published.is_nvidia_recipe_row`), in their fit and held-out halves. Each ran, so "
        "none should be estimated not to fit (on the card's capacity: no row states its memory). "
        "*Before*: the tree at "
        f"{json.loads(published.NVIDIA_RECIPES_BEFORE_PATH.read_text(encoding='utf-8'))['commit']} "
        "(`validation/data/nvidia_recipes_before.json`); *after*: this tree, which models the recipes' "
        "`grad_reduce_in_fp32` (bf16 gradient buffer and reduce-scatter), `fp8_param_gather` (fp8 "
        "weights, no bf16 copy or fp8 cache, gathered in fp8) and Transformer Engine's fp8 GEMM inputs "
        "saved for backward, each row taking the value its recipe sets (the row's `*_detail` cites it).",
        "",
    ]
    before_list = [before[r.id] for r in after]
    lines += table(
        [
            "half",
            "rows (before)",
            "does not fit (before)",
            "median |step error| (before)",
            "median step error (before)",
        ],
        [_recipe_half(split, before_list) for split in published.SPLITS],
    )
    lines.append("")
    lines += table(
        [
            "half",
            "rows (after)",
            "does not fit (after)",
            "median |step error| (after)",
            "median step error (after)",
        ],
        [_recipe_half(split, after) for split in published.SPLITS],
    )
    lines.append("")
    ordered = sorted(after, key=lambda r: (published.SPLITS.index(r.split), r.id))
    lines += table(
        [
            "run",
            "half",
            "precision",
            "layout",
            "fit before",
            "fit after",
            "GiB before",
            "GiB after",
            "step error before",
            "step error after",
        ],
        [
            [
                r.id,
                _HALF[r.split],
                rows[r.id]["training"]["precision"],
                _recipe_layout(rows[r.id]),
                _verdict(before[r.id]),
                _verdict(r),
                _gib(before[r.id]),
                _gib(r),
                percent(before[r.id].step_error),
                percent(r.step_error) if r.reason is None else f"not expressible: {r.reason}",
            ]
            for r in ordered
        ],
    )
    return lines


def published_summary_lines() -> list[str]:
    """One line per half and kind of the published runs, for the console."""
    out = []
    for h in published.summarize().halves:
        median = percent(h.median_abs_error).lstrip("+")
        out.append(
            f"published {h.kind:10s} {_HALF[h.split]:8s} {h.within}/{h.expressible} within tolerance "
            f"({h.rows} rows), median |error| {median}, median error {percent(h.median_signed_error)}"
        )
    return out


def summary_lines(rows: Sequence[Row]) -> list[str]:
    """One line per section, for the console."""
    out = []
    for section in cases.SECTIONS:
        s = summarize(section, [r for r in rows if r.section == section])
        worst = f"worst error {worst_text(s)}"
        extra = f", {s.known_gaps} known gap{'s' if s.known_gaps != 1 else ''}" if s.known_gaps else ""
        extra += f", {s.excluded} excluded" if s.excluded else ""
        out.append(
            f"{section:22s} {s.within_tolerance}/{s.checks} checks ok over {s.cases} cases{extra}; {worst}"
        )
    return out


def write(path: Path = REPORT_PATH) -> list[Row]:
    """Build every row, write the report and return the rows not as expected."""
    rows = cases.all_rows()
    path.write_text(render(rows), encoding="utf-8")
    for line in summary_lines(rows) + published_summary_lines():
        print(line)
    bad = failures(rows)
    for row in bad:
        values = f"reference {number(row.reference)}, ours {number(row.ours)} ({percent(row.error)})"
        print(f"NOT AS EXPECTED {row.section} / {row.case_id} / {row.quantity}: {values}, {result(row)}")
    written = path.resolve()
    print(f"wrote {written.relative_to(cases.ROOT) if written.is_relative_to(cases.ROOT) else written}")
    return bad


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.report", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--output", type=Path, default=REPORT_PATH, help="where to write (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    return 1 if write(args.output) else 0


if __name__ == "__main__":
    raise SystemExit(main())
