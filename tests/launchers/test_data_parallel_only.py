"""``launchers.DATA_PARALLEL_TARGETS`` holds what each target's refusal refuses: the recommender's
memory bound (``space.least_bytes_per_gpu``) and its climbs trust that no layout with tp, pp, cp or
ep > 1 of a framework these targets run is ever run by them."""

from __future__ import annotations

from typing import Any

import pytest

from service.estimator.types import Framework
from service.frameworks import FRAMEWORKS
from service.launchers import DATA_PARALLEL_TARGETS, REFUSALS, Target, data_parallel_only
from tests.launchers.factories import plan, small_llama

SPLITS = ({"tp": 2}, {"pp": 2}, {"cp": 2}, {"ep": 2}, {"tp": 2, "pp": 2, "cp": 2})


@pytest.mark.parametrize("target", sorted(DATA_PARALLEL_TARGETS, key=lambda t: str(t)))
@pytest.mark.parametrize("split", SPLITS, ids=str)
def test_each_data_parallel_target_refuses_every_other_split(target: Target, split: dict[str, int]) -> None:
    frameworks = [f for f, entry in FRAMEWORKS.items() if target in entry.targets]
    assert frameworks
    for framework in frameworks:
        for stage in (0, 1, 2, 3):
            layout: dict[str, Any] = {"framework": framework, "zero_stage": stage, **split}
            refused = REFUSALS[target](plan(**layout))
            # refused for the split itself, not for something else a layout of it breaks
            assert refused is not None and "data parallelism only" in str(refused), (
                target, framework, stage, split, refused,
            )  # fmt: skip
    # and the data-parallel split itself is one it may run (the bound is not vacuous)
    assert any(REFUSALS[target](plan(framework=f, zero_stage=0)) is None for f in frameworks)


def test_data_parallel_only_reads_every_requested_target_of_the_framework() -> None:
    model = small_llama()
    assert data_parallel_only(Framework.DEEPSPEED, model, (Target.HF_TRAINER,))
    assert data_parallel_only(Framework.FSDP, model, (Target.HF_TRAINER, Target.MEGATRON))
    # another requested target runs the framework with pp / tp: no longer data parallel only
    assert not data_parallel_only(Framework.DEEPSPEED, model, (Target.HF_TRAINER, Target.DEEPSPEED))
    assert not data_parallel_only(Framework.FSDP, model, (Target.HF_TRAINER, Target.TORCHTITAN))
    assert not data_parallel_only(Framework.DEEPSPEED, model, None)
    # no requested target runs it at all: not claimed (the caller leaves the framework out)
    assert not data_parallel_only(Framework.MEGATRON, model, (Target.HF_TRAINER,))
