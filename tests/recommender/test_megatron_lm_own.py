"""The estimate's Megatron defaults are NVIDIA's recipe switches (bf16 gradient buffer, fp8 weights,
overlapped gradient reduce), which only the megatron target renders. A plan that must launch through
Accelerate's MegatronLMPlugin gets a Megatron layout with Megatron-LM's own switches instead, estimated
as such (more gradient memory, exposed reduce), rather than no Megatron layout at all."""

from __future__ import annotations

from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator.estimate import estimate
from service.estimator.types import Framework, TrainingSpec
from service.launchers import Target
from service.recommender import Constraints, recommend
from tests.recommender.helpers import cluster

TRAINING = TrainingSpec(seq_len=1024, global_batch_size=64)


def test_accelerate_only_gets_megatron_lms_own_switches() -> None:
    # GPT-2: the one model MegatronLMPlugin builds as Hugging Face's is; full recompute, its only mode
    spec, c = model("gpt2").spec, cluster("h100-sxm-80gb", 1, per_node=2)
    megatron_only = Constraints(frameworks=(Framework.MEGATRON,), launchers=(Target.ACCELERATE,))
    plan = recommend(spec, c, TRAINING, megatron_only, default_tuning())
    assert plan.recommended is not None, [r.reason for r in plan.rejected]
    layout = plan.recommended.layout
    assert layout.recompute.value == "full"
    assert layout.grad_reduce_in_fp32 is True and layout.overlap_grad_reduce in (False, None)
    # the numbers are those of that layout, not of the recipes' one
    again = estimate(spec, c, layout, TRAINING, tuning=default_tuning())
    assert again.memory == plan.recommended.estimate.memory
    # with the megatron target the plan keeps NVIDIA's recipes (the defaults)
    recipes = recommend(
        spec, c, TRAINING, Constraints(frameworks=(Framework.MEGATRON,), launchers=(Target.MEGATRON,)),
        default_tuning(),
    )  # fmt: skip
    assert recipes.recommended is not None and recipes.recommended.layout.grad_reduce_in_fp32 is None
