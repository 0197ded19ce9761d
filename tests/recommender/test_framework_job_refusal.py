"""A framework no target runs for the model, whatever the layout (Megatron-LM's GPT model is not
Llama 4, Gemma 2/3 or GPT-OSS), is left out of the search before any of its layouts is evaluated:
the refusal holds for every layout and every target that runs the framework, and the answer is the
one a search without the framework gives."""

from __future__ import annotations

import dataclasses

from service.catalog.models import model, models
from service.catalog.tuning import default_tuning
from service.estimator.types import Framework, Method, Precision, TrainingSpec
from service.frameworks import FRAMEWORKS
from service.launchers import REFUSALS, framework_job_refusal
from service.recommender import Constraints, search
from tests.launchers.grid import grid
from tests.recommender import helpers

TRAINING = TrainingSpec(seq_len=4096, global_batch_size=256)
H100 = helpers.cluster("h100-sxm-80gb").gpu
REFUSED = [
    name for name in models() if framework_job_refusal(Framework.MEGATRON, model(name).spec, TRAINING, H100)
]


def test_every_megatron_target_refuses_every_layout_of_a_refused_model() -> None:
    assert {"llama-4-scout-17b-16e", "gemma-2-9b", "gpt-oss-120b"} <= set(REFUSED)
    assert framework_job_refusal(Framework.MEGATRON, model("llama-3.1-8b").spec, TRAINING, H100) is None
    assert all(
        framework_job_refusal(f, model(n).spec, TRAINING, H100) is None
        for n in REFUSED
        for f in Framework
        if f is not Framework.MEGATRON
    )
    megatron = [plan for _, plan in grid() if plan.layout.framework is Framework.MEGATRON]
    # with Megatron-LM's own switches too, which Accelerate's plugin runs where NVIDIA's it cannot
    plans = megatron + [
        dataclasses.replace(
            p,
            layout=dataclasses.replace(
                p.layout, grad_reduce_in_fp32=True, overlap_grad_reduce=False, fp8_param_gather=False
            ),
        )
        for p in megatron
    ]
    assert len(plans) > 20
    tf32 = TrainingSpec(seq_len=4096, global_batch_size=256, precision=Precision.TF32)
    assert framework_job_refusal(Framework.MEGATRON, model("llama-3.1-8b").spec, tf32, H100) is not None
    for name in [*REFUSED, "llama-3.1-8b"]:
        spec = model(name).spec
        for plan in plans:
            if name == "llama-3.1-8b":  # refused for its training alone: TF32
                plan = dataclasses.replace(
                    plan, training=dataclasses.replace(plan.training, precision=Precision.TF32)
                )
            for target in FRAMEWORKS[Framework.MEGATRON].targets:
                assert REFUSALS[target](dataclasses.replace(plan, model=spec)) is not None, (name, target)


def test_the_search_leaves_the_framework_out_and_answers_as_without_it() -> None:
    spec = model("llama-4-scout-17b-16e").spec
    cluster = helpers.cluster("h100-sxm-80gb", nodes=2)
    training = TrainingSpec(seq_len=4096, global_batch_size=128, method=Method.LORA)
    every = search(spec, cluster, training, Constraints(), default_tuning(), (16,))
    without = search(
        spec,
        cluster,
        training,
        Constraints(frameworks=(Framework.DEEPSPEED, Framework.FSDP)),
        default_tuning(),
        (16,),
    )
    reason = "no launcher runs megatron for this model, training and GPU"
    assert every.log.groups[reason].count == 1 and reason not in without.log.groups
    assert "NoPE" in every.log.groups[reason].detail  # its 8,192-token chunks mask nothing at 4,096
    assert [(s.layout, s.key) for s in every.ranked()] == [(s.layout, s.key) for s in without.ranked()]
    assert (every.memory_evaluations, every.time_evaluations) == (
        without.memory_evaluations,
        without.time_evaluations,
    )
    assert all(s.layout.framework is not Framework.MEGATRON for s in every.ranked())


def test_every_deepspeed_target_refuses_the_splits_it_cannot_run_whatever_the_layout() -> None:
    """DeepSpeed's refusals that read the degrees alone (cp > 1; tp > 1 with pp > 1) are every
    DeepSpeed target's: the search offers no sharding there, and a split they allow is not refused."""
    from service.launchers import framework_structure_refusal

    deepspeed = [plan for _, plan in grid() if plan.layout.framework is Framework.DEEPSPEED]
    refused = allowed = 0
    for plan in deepspeed:
        for tp, pp, cp in ((1, 1, 2), (2, 2, 1), (1, 2, 1), (2, 1, 1), (1, 1, 1)):
            world = plan.cluster.world_size
            if world % (tp * pp * cp):
                continue
            dp = world // (tp * pp * cp)  # the plan's GPUs, so no refusal is about the world size
            layout = dataclasses.replace(plan.layout, dp=dp, tp=tp, pp=pp, cp=cp, sequence_parallel=False)
            moved = dataclasses.replace(plan, layout=layout)
            if (
                framework_structure_refusal(Framework.DEEPSPEED, plan.model, plan.training, tp, pp, cp, 1)
                is None
            ):
                allowed += 1
                continue
            refused += 1
            for target in FRAMEWORKS[Framework.DEEPSPEED].targets:
                reason = REFUSALS[target](moved)
                assert reason is not None and "GPUs in the cluster" not in reason, (layout, target, reason)
    assert refused and allowed
    spec, plain = model("llama-3.1-8b").spec, TrainingSpec(seq_len=4096, global_batch_size=256)
    assert framework_structure_refusal(Framework.FSDP, spec, plain, 2, 2, 2, 1) is None  # torchtitan
    assert framework_structure_refusal(Framework.MEGATRON, spec, plain, 2, 2, 2, 1) is None


def test_every_fsdp_target_refuses_pipeline_and_expert_splits_torchtitan_cannot_build() -> None:
    """FSDP with pp or ep > 1 runs on torchtitan alone (Accelerate's MULTI_GPU is plain DDP and its
    FSDP2 has neither, the HF Trainer is data parallel): where torchtitan refuses the job (a model
    outside its registry, LoRA) or experts over tp, every FSDP target refuses every such layout."""
    from service.launchers import framework_structure_refusal

    fsdp = [plan for _, plan in grid() if plan.layout.framework is Framework.FSDP]
    mixtral, qwen = model("mixtral-8x7b").spec, model("qwen3-30b-a3b").spec  # not in / in the registry
    lora = TrainingSpec(seq_len=4096, global_batch_size=256, method=Method.LORA)
    refused = 0
    for plan in fsdp:
        for spec, training in ((mixtral, plan.training), (qwen, lora), (qwen, plan.training)):
            for tp, pp, ep in ((1, 1, 2), (1, 2, 1), (2, 1, 2), (1, 1, 1)):
                world = plan.cluster.world_size
                if world % (tp * pp) or (world // (tp * pp)) % ep:
                    continue
                layout = dataclasses.replace(
                    plan.layout, dp=world // (tp * pp), tp=tp, pp=pp, cp=1, ep=ep, sequence_parallel=False
                )
                if framework_structure_refusal(Framework.FSDP, spec, training, tp, pp, 1, ep) is None:
                    continue
                refused += 1
                moved = dataclasses.replace(plan, model=spec, training=training, layout=layout)
                for target in FRAMEWORKS[Framework.FSDP].targets:
                    reason = REFUSALS[target](moved)
                    assert reason is not None and "GPUs in the cluster" not in reason, (layout, target)
    assert refused > 20
    plain = TrainingSpec(seq_len=4096, global_batch_size=256)
    assert framework_structure_refusal(Framework.FSDP, qwen, plain, 1, 1, 1, 8) is None  # torchtitan's EP
    assert framework_structure_refusal(Framework.FSDP, mixtral, plain, 2, 1, 2, 1) is None  # FSDP2 TP + CP


def test_megatron_is_left_out_on_a_gpu_before_ampere_and_every_target_refuses_it_there() -> None:
    """Transformer Engine needs Ampere (``megatron.hardware_refusal``): on a V100 every Megatron
    target refuses every layout, so the search leaves the framework out before timing any (a
    DeepSeek-V3 capacity request timed thousands of Megatron layouts on V100, each then refused)."""
    v100 = helpers.cluster("v100-sxm2-16gb", nodes=2)
    spec = model("llama-3.1-8b").spec
    assert framework_job_refusal(Framework.MEGATRON, spec, TRAINING, v100.gpu) is not None
    assert all(
        framework_job_refusal(f, spec, TRAINING, v100.gpu) is None
        for f in Framework
        if f is not Framework.MEGATRON
    )
    megatron = [plan for _, plan in grid() if plan.layout.framework is Framework.MEGATRON]
    for plan in megatron:
        on_v100 = dataclasses.replace(
            plan, model=spec, cluster=dataclasses.replace(plan.cluster, gpu=v100.gpu)
        )
        for target in FRAMEWORKS[Framework.MEGATRON].targets:
            assert REFUSALS[target](on_v100) is not None, target
    training = TrainingSpec(seq_len=2048, global_batch_size=64, precision=Precision.FP16)
    every = search(spec, v100, training, Constraints(), default_tuning(), (16,))
    without = search(
        spec,
        v100,
        training,
        Constraints(frameworks=(Framework.DEEPSPEED, Framework.FSDP)),
        default_tuning(),
        (16,),
    )
    reason = "no launcher runs megatron for this model, training and GPU"
    assert every.log.groups[reason].count == 1 and "Ampere" in every.log.groups[reason].detail
    counts = {what: g.count for what, g in every.log.groups.items() if what != reason}
    assert counts == {what: g.count for what, g in without.log.groups.items()}
    assert [(s.layout, s.key) for s in every.ranked()] == [(s.layout, s.key) for s in without.ranked()]
    assert every.memory_evaluations == without.memory_evaluations


def test_fsdp_with_tp_runs_only_where_torchtitan_builds_the_model() -> None:
    """Llama 3.1 405B on 128 A100s, FSDP only: torchtitan refuses the model (its 405B config trains
    fp8) and Accelerate runs no FSDP with TP (transformers 5.24 loads a TP model on its own mesh: a
    launch review), so no layout with TP is proposed; a recommendation review had found the search
    proposing Accelerate TP layouts that then could not start."""
    spec = model("llama-3.1-405b").spec
    cluster = helpers.cluster("a100-sxm-80gb", nodes=16, inter=25e9)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    fsdp = Constraints(frameworks=(Framework.FSDP,))
    found = search(spec, cluster, training, fsdp, default_tuning(), (128,))
    assert all(scored.layout.tp == 1 for scored in found.ranked())
