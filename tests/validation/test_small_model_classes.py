"""Issue 27's small-models class: every encoder throughput row is in the section, estimated to fit
the card it ran on, and the section states the class's held-out target."""

from __future__ import annotations

from validation import published, small_model_classes
from validation.report import percent, table


def test_every_encoder_row_is_in_the_class_and_fits_its_card() -> None:
    rows = small_model_classes.encoder_rows()
    ids = {row["id"] for row in published.load_rows() if row["source_key"].startswith("dle-bert")}
    assert {r.id for r in rows} == ids and len(ids) == 34
    assert all(r.fits for r in rows)  # each ran on its card: never "does not fit"
    assert {r.split for r in rows} == set(published.SPLITS)


def test_the_section_names_the_class_target() -> None:
    text = "\n".join(small_model_classes.sections(percent, table))
    assert "## Small models and short steps" in text
    assert "held-out median step-time" in text
