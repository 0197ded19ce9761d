"""Issue 27, first class, as a client meets it: a layout sent as NVIDIA publishes it (framework,
degrees, precision, micro-batch; none of the recipe switches, which the tables do not print) is
estimated as NVIDIA ran it, because the Megatron switches default to NVIDIA's recipes. Each NVIDIA
recipe row whose recipe set the recipes' values gives the same estimate with them left out, and
every one of the class fits so."""

from __future__ import annotations

import copy

import pytest

from service.catalog.tuning import default_tuning
from service.estimator.estimate import estimate
from service.estimator.types import Estimate
from validation import published

RECIPE_FIELDS = ("grad_reduce_in_fp32", "fp8_param_gather")
ROWS = [row for row in published.load_rows() if published.is_nvidia_recipe_row(row)]


def without_recipe_fields(row: published.Row) -> published.Row:
    bare = copy.deepcopy(row)
    for name in RECIPE_FIELDS:
        bare["layout"].pop(name, None)
    return bare


def estimate_of(row: published.Row) -> Estimate:
    inputs = published.inputs(row)
    return estimate(inputs.model, inputs.cluster, inputs.layout, inputs.training, tuning=default_tuning())


@pytest.mark.parametrize("row", ROWS, ids=[row["id"] for row in ROWS])
def test_a_layout_as_nvidia_publishes_it_is_estimated_as_nvidia_ran_it(row: published.Row) -> None:
    try:
        as_run = estimate_of(row)
    except published.Unexpressible as why:
        # Megatron-FSDP (zero_stage 3 under Megatron) is the class's one unexpressible row
        assert row["id"] == "mb2509-l3-8b-h100x8-mfsdp", str(why)
        return
    bare = estimate_of(without_recipe_fields(row))
    assert bare.fits, f"{row['id']}: does not fit with the recipe switches left to their defaults"
    layout = row["layout"]
    if layout.get("grad_reduce_in_fp32") is False and layout.get("fp8_param_gather") is True:
        # the row's recipe set exactly the defaults: the same numbers (the assumptions say "as set")
        assert (bare.memory, bare.time) == (as_run.memory, as_run.time)


def test_the_defaults_are_what_most_of_the_class_ran() -> None:
    recipes = [row["layout"] for row in ROWS]
    assert sum(layout.get("grad_reduce_in_fp32") is False for layout in recipes) >= 0.9 * len(recipes)
