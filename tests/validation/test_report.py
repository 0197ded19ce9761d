"""validation/REPORT.md is what `python -m validation.report` writes from the committed data files
and the published cases. Rendering needs no torch, so `make test` catches a stale report (a
changed formula or catalog number moves its rows) before CI's `make validate` does."""

from __future__ import annotations

import pytest

from validation import cases, report


@pytest.mark.skipif(not cases.CASES_PATH.exists(), reason="the published cases (../shared) are not here")
def test_committed_report_is_current() -> None:
    committed = report.REPORT_PATH.read_text(encoding="utf-8")
    assert committed == report.render(cases.all_rows()), (
        "validation/REPORT.md is stale: run `python -m validation.report` and commit it"
    )
