"""A plan's rejection log is grouped by reason, one group per kind of miss: a reason that names the
split's degrees made one group per split (DeepSeek-V3 on 16,384 H100s answered 132 groups, 117 of
them torchtitan's one refusal of experts over tp at each (pp, ep, tp), 167 KB of a 178 KB answer).
The degrees belong to each group's example layout, which the answer shows beside its reason."""

from __future__ import annotations

import re

import pytest

from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator.types import TrainingSpec
from service.recommender import Constraints, recommend
from tests.recommender.helpers import cluster

JOBS = [
    # an MoE model on a large cluster: FSDP's pipeline and expert splits are torchtitan's alone
    ("deepseek-v3", cluster(nodes=2048), TrainingSpec(seq_len=4096, global_batch_size=4096)),
    # an encoder on several nodes: every split but data parallelism is refused
    (
        "bert-large-uncased",
        cluster("a100-sxm-80gb", nodes=8),
        TrainingSpec(seq_len=512, global_batch_size=256),
    ),
]


@pytest.mark.parametrize(("name", "c", "training"), JOBS, ids=[j[0] for j in JOBS])
def test_rejection_groups_do_not_name_the_splits_degrees(name: str, c, training: TrainingSpec) -> None:
    rec = recommend(model(name).spec, c, training, Constraints(), default_tuning())
    templates: dict[str, list[str]] = {}
    for group in rec.rejected:
        templates.setdefault(re.sub(r"\d[\d,.]*", "#", group.reason), []).append(group.reason)
    # a reason may name one of a few values (a ZeRO stage, 0-3), never a split's degrees
    assert all(len(reasons) <= 4 for reasons in templates.values()), max(templates.values(), key=len)
    assert len(rec.rejected) <= 40, [g.reason for g in rec.rejected]


def test_a_single_layouts_refusal_still_names_its_degrees() -> None:
    """The launcher's refusal of one layout says which degrees it refuses (the search's log groups by a
    reason without them, the example layout beside it)."""
    from service.estimator.types import Framework
    from service.launchers import torchtitan
    from tests.launchers.factories import plan

    refused = plan(model=model("qwen3-30b-a3b").spec, framework=Framework.FSDP, zero_stage=3, tp=2, ep=4)
    reason = torchtitan.refusal(refused)
    assert reason is not None and "ep=4 with tp=2" in reason
