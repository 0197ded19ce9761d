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


def test_the_report_names_every_number_fitted_on_the_fit_half() -> None:
    from service.catalog.tuning import default_tuning

    fitted = report.fitted_on_the_fit_half()
    tuning = default_tuning()
    assert f"memory.fragmentation_fraction = {tuning.memory.fragmentation_fraction}" in fitted
    assert f"peak_fraction gh100 = {dict(tuning.peak_fraction_by_chip)['gh100']}" in fitted
    assert not any("ga100" in entry for entry in fitted)  # fitted on the visible cases, not this set
