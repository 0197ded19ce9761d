"""Each target's refusal (a pure predicate over the plan, what the search asks) says exactly what
rendering says: None where the target renders the plan, the reason it refuses with where it does
not, for every target over the launcher grid. So the search, which never renders, and the files can
never disagree."""

from __future__ import annotations

import dataclasses

import pytest

from service.estimator.types import Framework, Method, Plan, Precision, Recompute
from service.frameworks import FRAMEWORKS
from service.launchers import REFUSALS, RENDERERS, Target, Unsupported, runnable_targets
from tests.launchers import factories
from tests.launchers.grid import grid


def _plans() -> list[tuple[str, Plan]]:
    """The grid, plus LoRA and every-N-th-layer recompute variants of part of it."""
    cases = grid()
    more = [
        (f"{name}-lora", dataclasses.replace(p, training=dataclasses.replace(p.training, method=Method.LORA)))
        for name, p in cases[::3]
    ]
    more += [  # QLoRA: FSDP1 under Accelerate and the Trainer, which meshes (cp, hybrid) refuse
        (
            f"{name}-qlora",
            dataclasses.replace(p, training=dataclasses.replace(p.training, method=Method.QLORA)),
        )
        for name, p in cases
        # (NF4 layers compute in 16 bits: a qlora training in fp8 is refused whole)
        if p.layout.framework is Framework.FSDP
        and p.layout.tp == 1
        and p.training.precision is not Precision.FP8
    ]
    more += [
        (
            f"{name}-every-2",
            dataclasses.replace(
                p, layout=dataclasses.replace(p.layout, recompute=Recompute.FULL, recompute_every_n_layers=2)
            ),
        )
        for name, p in cases[::5]
    ]
    return cases + more


def _rendered(target: Target, plan: Plan) -> str | None:
    try:
        RENDERERS[target](plan)
    except Unsupported as exc:
        assert exc.target is target
        return exc.reason
    return None


def test_every_target_refuses_exactly_what_it_does_not_render() -> None:
    plans = _plans()
    renders = 0
    for name, plan in plans:
        for target in Target:
            said = REFUSALS[target](plan)
            assert said == _rendered(target, plan), (name, target)
            renders += said is None
    assert set(REFUSALS) == set(RENDERERS) == set(Target)
    assert renders > 500  # the grid reaches both answers for the targets
    qlora = [plan for name, plan in plans if name.endswith("-qlora")]
    assert any(REFUSALS[Target.ACCELERATE](plan) is None for plan in qlora)


def test_accelerate_refuses_qlora_on_the_fsdp2_meshes() -> None:
    """QLoRA runs on FSDP1 under Accelerate (FSDP2 breaks bitsandbytes' NF4 weights); context
    parallelism and hybrid shard across nodes are parallelism_config meshes, FSDP2's only."""
    qlora = factories.training(method=Method.QLORA)
    for plan in (
        factories.plan(train=qlora, framework=Framework.FSDP, zero_stage=3, cp=2),
        factories.plan(train=qlora, framework=Framework.FSDP, zero_stage=3, nodes=2, fsdp_hybrid_shard=True),
    ):
        reason = REFUSALS[Target.ACCELERATE](plan)
        assert reason is not None and "FSDP2 only" in reason, plan.layout
    assert (
        REFUSALS[Target.ACCELERATE](factories.plan(train=qlora, framework=Framework.FSDP, zero_stage=3))
        is None
    )


def test_runnable_targets_are_the_frameworks_targets_that_do_not_refuse() -> None:
    for name, plan in grid()[::7]:
        wanted = FRAMEWORKS[plan.layout.framework].targets
        runs, reasons = runnable_targets(plan)
        assert runs == [t for t in wanted if _rendered(t, plan) is None], name
        assert reasons == {t: r for t in wanted if (r := _rendered(t, plan)) is not None}, name
        first, _ = runnable_targets(plan, first_only=True)
        assert first == runs[:1], name


def test_each_target_runs_the_frameworks_the_registry_gives_it() -> None:
    """A target the registry does not list for a framework refuses every layout of it."""
    for name, plan in grid()[::11]:
        framework: Framework = plan.layout.framework
        for target in (Target.DEEPSPEED, Target.HF_TRAINER, Target.MEGATRON, Target.TORCHTITAN):
            if target not in FRAMEWORKS[framework].targets:
                assert REFUSALS[target](plan) is not None, (name, target)


def test_deepspeed_refuses_its_native_moe_layers_under_zero_3() -> None:
    """A pretraining review's case: Qwen3-235B on DeepSpeed was planned at dp 256 ep 4 ZeRO-3, which
    DeepSpeed's engine refuses at deepspeed.initialize (runtime/engine.py
    _validate_zero3_moe_compatibility: 'Native DeepSpeed MoE is not supported with ZeRO Stage 3');
    ZeRO-1/2 with the same experts, and ZeRO-3 without expert parallelism (the model's own MoE block),
    run. The layout rules refuse it (an estimate of it timed a job that cannot start; MoE review), so
    no search proposes it and no launcher is asked."""
    from service.estimator.errors import InvalidLayout
    from service.estimator.types import MoESpec
    from service.estimator.validate import validate_layout

    base = factories.small_llama()
    moe = dataclasses.replace(
        base, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=base.ffn_hidden_size)
    )
    zero3 = factories.plan(model=moe, framework=Framework.DEEPSPEED, zero_stage=3, ep=4)
    with pytest.raises(InvalidLayout) as refused:
        validate_layout(zero3.model, zero3.cluster, zero3.layout, zero3.training)
    assert "Native DeepSpeed MoE is not supported with ZeRO Stage 3" in refused.value.message
    assert (refused.value.rule, refused.value.field) == ("zero_ep", "zero_stage")
    for allowed in (
        factories.plan(model=moe, framework=Framework.DEEPSPEED, zero_stage=2, ep=4),
        factories.plan(model=moe, framework=Framework.DEEPSPEED, zero_stage=3, ep=1),
    ):
        validate_layout(allowed.model, allowed.cluster, allowed.layout, allowed.training)
        assert REFUSALS[Target.DEEPSPEED](allowed) is None, allowed.layout


def test_the_trainers_every_n_layers_refusal_says_which_layers_it_would_checkpoint() -> None:
    """transformers 5.24 has activation_checkpointing_kwargs every_n_layers (modeling_utils
    _set_gradient_checkpointing: layer_index % N == 0, layers 0, N, 2N, ...), so "wraps every decoder
    layer" was no longer true; the estimate's count is torchtitan's (every N-th from the first), which
    checkpoints other layers (ceil(L / N) against floor(L / N)): the refusal says that (an Accelerate
    review)."""
    from service.estimator.types import Framework, Recompute
    from service.launchers import REFUSALS, Target
    from tests.launchers.factories import plan

    every = {"recompute": Recompute.FULL, "recompute_every_n_layers": 2}
    chosen = plan(framework=Framework.FSDP, zero_stage=3, **every)
    reason = REFUSALS[Target.HF_TRAINER](chosen) or ""
    assert "checkpoints layers 0, 2, 4" in reason and "wraps every decoder layer" not in reason, reason


def test_the_trainers_qlora_fsdp_file_says_it_runs_deprecated_fsdp1() -> None:
    """transformers 5.24 logs FSDP1 as deprecated (training_args.py, announced for removal in v5.20);
    QLoRA's fsdp_config stays on version 1 (FSDP2 breaks NF4): the launch says so (a review)."""
    from service.estimator.types import Framework, Method
    from service.launchers import hf_trainer
    from tests.launchers.factories import plan, training

    qlora = plan(train=training(method=Method.QLORA), framework=Framework.FSDP, zero_stage=3)
    assert "fsdp version 1" in hf_trainer.duties(qlora)
    assert "fsdp version 1" not in hf_trainer.duties(plan(framework=Framework.FSDP, zero_stage=3))
