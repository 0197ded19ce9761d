"""The power-capped-parts class of the published runs (issue 27): the rows it takes and what the
power limit does to each."""

from __future__ import annotations

from validation import clock_classes, published


def test_the_class_is_the_grand_teton_rows_and_the_limit_only_slows_them() -> None:
    rows = clock_classes.clock_rows()
    on_part = [
        r["id"]
        for r in published.load_rows()
        if r["kind"] == "throughput" and r["cluster"]["gpu"] == "h100-sxm-500w-96gb"
    ]
    assert len(on_part) == 29 and {r.id for r in rows} <= set(on_part)
    for r in rows:
        # slower at the 500 W limit, by no more than the clock: (5/7)^(1/3) = 0.894 of every peak
        assert r.datasheet_s < r.capped_s <= r.datasheet_s / 0.8939, r.id


def test_the_section_reports_both_halves() -> None:
    lines = clock_classes.sections(lambda e: "—" if e is None else f"{e:+.2%}", _table)
    text = "\n".join(lines)
    assert "## Power-capped parts and TF32 (issue 27)" in text
    assert "| fit | 15 |" in text and "| held-out | 14 |" in text


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", *("| " + " | ".join(row) + " |" for row in body)]
