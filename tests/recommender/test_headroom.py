"""The headroom policy is defined once (service.recommender.headroom) and every reader uses it: the
request's default and limit, the search's default, and the estimator's thin-headroom flag agree."""

from __future__ import annotations

from service.contracts.plans import ConstraintsIn
from service.estimator.estimate import THIN_HEADROOM_FRACTION
from service.recommender import headroom
from service.recommender.types import Constraints


def test_every_default_is_the_policy() -> None:
    assert headroom.DEFAULT_FRACTION == THIN_HEADROOM_FRACTION == 0.05
    assert Constraints().min_headroom_fraction == headroom.DEFAULT_FRACTION
    assert ConstraintsIn().min_headroom_fraction == headroom.DEFAULT_FRACTION
    assert ConstraintsIn().to_domain().min_headroom_fraction == headroom.DEFAULT_FRACTION
    schema = ConstraintsIn.model_json_schema()["properties"]["min_headroom_fraction"]
    # null is the default (contracts.common.null_means_default): the number's branch holds the bound
    schema = next(branch for branch in schema["anyOf"] if branch.get("type") != "null")
    assert schema["maximum"] == headroom.MAX_REQUESTED_FRACTION == 0.5


def test_allowed_bytes_is_the_card_less_the_headroom_rounded_down() -> None:
    assert headroom.allowed_bytes(80 * 2**30, 0.05) == int(80 * 2**30 * 0.95)
    assert headroom.allowed_bytes(1000, 0.0) == 1000
    assert headroom.allowed_bytes(999, 0.5) == 499  # never rounds up: a byte over is over


def test_a_stored_runs_memory_factor_reaches_the_layouts_of_its_framework_and_family_alone() -> None:
    """The search fits each layout under its own framework and layout family's factor (stored runs:
    planning.calibration.searched_with_runs), 1 elsewhere: an expert-parallel Megatron run's factor is not
    a data-parallel FSDP layout's."""
    from service.estimator.types import Framework, Layout

    runs = Constraints(memory_dynamic_factors=((Framework.MEGATRON, "expert-parallel", 1.5),
                                               (Framework.FSDP, "data-parallel", 1.2)))  # fmt: skip
    assert runs.dynamic_factor(Layout(framework=Framework.MEGATRON, ep=8, zero_stage=1)) == 1.5
    assert runs.dynamic_factor(Layout(framework=Framework.MEGATRON, tp=2)) == 1.0  # model-parallel
    assert runs.dynamic_factor(Layout(framework=Framework.FSDP, dp=8, zero_stage=3)) == 1.2
    assert runs.dynamic_factor(Layout(framework=Framework.DEEPSPEED, dp=8)) == 1.0
    assert Constraints().dynamic_factor(Layout(framework=Framework.FSDP, dp=8, zero_stage=3)) == 1.0
