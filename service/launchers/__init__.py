"""Launcher configs for a plan: one pure renderer per target, reached only through RENDERERS.

Each renderer maps a Plan to the files its tool reads (a target may write several, e.g.
ds_config.json + deepspeed_launch.sh + hostfile), or raises Unsupported with the reason the
layout cannot be expressed there: its module's ``refusal(plan)``, which REFUSALS answers without
rendering. Which targets run which framework is the registry's (``service.frameworks``).
Pinned tool versions are named in each module's docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from service.estimator.types import Framework, GPUSpec, Method, ModelSpec, Plan, TrainingSpec
from service.estimator.validate import encoder_split_problem
from service.frameworks import FRAMEWORKS
from service.launchers import accelerate, deepspeed, hf_trainer, job, kubernetes, megatron, slurm, torchtitan
from service.launchers.common import Artifact, Refusal, Target, Unsupported

__all__ = [
    "DATA_PARALLEL_TARGETS",
    "REFUSALS",
    "RENDERERS",
    "Artifact",
    "Target",
    "Unsupported",
    "data_parallel_only",
    "framework_job_refusal",
    "framework_structure_refusal",
    "render",
    "runnable_targets",
]

RENDERERS: dict[Target, Callable[[Plan], list[Artifact]]] = {
    Target.DEEPSPEED: deepspeed.render,
    Target.ACCELERATE: accelerate.render,
    Target.HF_TRAINER: hf_trainer.render,
    Target.MEGATRON: megatron.render,
    Target.TORCHTITAN: torchtitan.render,
    Target.SLURM: slurm.render,
    Target.KUBERNETES: kubernetes.render,
}


# What each target cannot express: a pure predicate over the plan (the reason, or None), the same
# function its renderer refuses with, so asking it renders nothing. Slurm and Kubernetes refuse what
# the entry point they wrap refuses.
REFUSALS: dict[Target, Callable[[Plan], Refusal]] = {
    Target.DEEPSPEED: deepspeed.refusal,
    Target.ACCELERATE: accelerate.refusal,
    Target.HF_TRAINER: hf_trainer.refusal,
    Target.MEGATRON: megatron.refusal,
    Target.TORCHTITAN: torchtitan.refusal,
    Target.SLURM: job.refusal,
    Target.KUBERNETES: job.refusal,
}


def framework_job_refusal(
    framework: Framework, model: ModelSpec, training: TrainingSpec, gpu: GPUSpec
) -> Refusal:
    """Why no target runs any layout of ``framework`` for this model and training on this GPU, or
    None: every target that runs Megatron-LM (megatron, Accelerate's plugin, and Slurm / Kubernetes
    wrapping the megatron entry point) refuses what ``megatron.job_refusal`` and
    ``megatron.hardware_refusal`` name, whatever the layout. The search leaves such a framework out
    before evaluating any of its layouts (on a V100 it timed thousands of Megatron layouts, each
    then refused by every launcher)."""
    if framework is Framework.MEGATRON:
        return megatron.hardware_refusal(gpu) or megatron.job_refusal(model, training)
    return None


def framework_structure_refusal(
    framework: Framework, model: ModelSpec, training: TrainingSpec, tp: int, pp: int, cp: int, ep: int
) -> Refusal:
    """Why no target runs ``framework`` for this job at these parallel degrees, whatever else the
    layout says, or None. The search offers no sharding of it there.

    * An encoder (bidirectional): data parallelism only, whatever the framework
      (``validate.encoder_split_problem``, which the validator reads too).
    * DeepSpeed: its refusals that read the degrees alone, and the MoE routing its layers at ep > 1
      cannot compute (``deepspeed.structure_refusal``), which
      every target running DeepSpeed shares (Accelerate's plugin and the HF Trainer run data
      parallelism only; Slurm / Kubernetes wrap the deepspeed entry point).
    * FSDP with pp or ep > 1: Accelerate's FSDP2 and the HF Trainer have neither (their refusals say
      so first or refuse earlier), so torchtitan alone runs it, Slurm / Kubernetes through it:
      refused where torchtitan refuses the job (``torchtitan.job_refusal``) or experts over tp.
    * QLoRA with cp > 1, whatever the framework: Accelerate builds context parallelism (FSDP2's mesh,
      DeepSpeed's ALST) on a transformers model, which bitsandbytes' NF4 weights break
      (``accelerate.refusal``); DeepSpeed's own target and the HF Trainer run none, torchtitan no
      QLoRA, Megatron no PEFT. A capacity climb of a QLoRA job counted cp up to 32 and searched to
      8,192 GPUs where data parallelism, at most the global batch, is all that runs (an
      infeasible-jobs review)."""
    encoder = encoder_split_problem(model, tp, pp, cp)
    if encoder is not None:
        return encoder
    if training.method is Method.QLORA and cp > 1:
        return (
            f"qlora with cp={cp}: no target runs it (Accelerate's context parallelism, FSDP2's or "
            "DeepSpeed's ALST, breaks bitsandbytes' NF4 weights; the others run none with QLoRA)"
        )
    if framework is Framework.DEEPSPEED:
        return deepspeed.structure_refusal(model, tp, pp, cp, ep)
    if framework is Framework.FSDP and (pp > 1 or ep > 1):
        titan = (
            torchtitan.job_refusal(model, training)
            or torchtitan.expert_tensor_problem(tp, ep)
            or torchtitan.tied_pipeline_problem(model, pp)
        )
        if titan is not None:
            return f"FSDP with pp or ep > 1 runs on torchtitan alone: {titan}"
    return None


# Targets whose refusal refuses tp, pp, cp and ep > 1 for every framework they run: the HF Trainer
# (``hf_trainer.refusal``: "runs data parallelism only"). tests/launchers/test_data_parallel_only.py
# holds each to its refusal.
DATA_PARALLEL_TARGETS = frozenset({Target.HF_TRAINER})


def data_parallel_only(framework: Framework, model: ModelSpec, targets: Iterable[Target] | None) -> bool:
    """Whether every layout of ``framework`` that a target of ``targets`` (None: any) runs for
    ``model`` is data parallel alone (tp = pp = cp = ep = 1): a dense encoder on any target
    (``encoder_split_problem``, which ``framework_structure_refusal`` reads), or a framework whose
    requested targets (those of ``runnable_targets``) all run data parallelism only. False where no
    requested target runs it (then nothing of it runs: the caller decides)."""
    if model.bidirectional and model.moe is None:
        return True
    if targets is None:
        return False
    wanted = set(FRAMEWORKS[framework].targets) & set(targets)
    return bool(wanted) and wanted <= DATA_PARALLEL_TARGETS


def runnable_targets(
    plan: Plan, targets: Iterable[Target] | None = None, *, first_only: bool = False
) -> tuple[list[Target], dict[Target, str]]:
    """The targets of the plan's framework (``frameworks.FRAMEWORKS``; those of ``targets`` only,
    when given) that run it, and why each of the others cannot, from each target's refusal: nothing
    is rendered. ``first_only``: stop at the first that runs it (the search only asks whether one
    does)."""
    wanted = FRAMEWORKS[plan.layout.framework].targets
    if targets is not None:
        allowed = set(targets)
        wanted = tuple(t for t in wanted if t in allowed)
    runs: list[Target] = []
    reasons: dict[Target, str] = {}
    for target in wanted:
        reason = REFUSALS[target](plan)
        if reason is not None:
            reasons[target] = reason
        else:
            runs.append(target)
            if first_only:
                break
    return runs, reasons


def render(plan: Plan, targets: Iterable[Target] | None = None) -> tuple[list[Artifact], dict[Target, str]]:
    """Artifacts of every requested target (all when None), and the reason for each one left out.

    Files several targets share (ds_config.json for deepspeed, hf_trainer and slurm) appear once.
    """
    artifacts: dict[str, Artifact] = {}
    unsupported: dict[Target, str] = {}
    asked = [Target(t) for t in (RENDERERS if targets is None else targets)]
    # a DeepSpeed layout asked of the HF Trainer and not of DeepSpeed's own script: the wrappers run the
    # HF Trainer's entry point, as its files beside them say (launch review)
    via = (
        Target.HF_TRAINER
        if plan.layout.framework is Framework.DEEPSPEED
        and Target.HF_TRAINER in asked
        and Target.DEEPSPEED not in asked
        else None
    )
    for target in asked:
        try:
            if target in (Target.KUBERNETES, Target.SLURM) and via is not None:
                produced = (kubernetes.render if target is Target.KUBERNETES else slurm.render)(plan, via)
            else:
                produced = RENDERERS[target](plan)
        except Unsupported as exc:
            if (
                target is Target.KUBERNETES
                and Target.ACCELERATE in asked
                and accelerate.refusal(plan) is None
            ):
                unsupported[target] = (
                    f"{exc.reason} (the PyTorchJob runs torchrun entry points, not accelerate launch: "
                    f"run the accelerate target's {accelerate.LAUNCH_NAME} on each node, NODE_RANK set)"
                )
                continue
            if target is not Target.SLURM or Target.ACCELERATE not in asked:
                unsupported[target] = exc.reason
                continue
            # Slurm asked with Accelerate: where no torchrun entry point runs the layout, the
            # sbatch script runs Accelerate's launcher on each node (or says why neither can)
            try:
                produced = slurm.accelerate_render(plan)
            except Unsupported as accelerate_exc:
                unsupported[target] = f"{exc.reason}; accelerate: {accelerate_exc.reason}"
                continue
        for artifact in produced:
            seen = artifacts.get(artifact.name)
            if seen is None:
                artifacts[artifact.name] = artifact
            elif seen.content != artifact.content:
                raise AssertionError(f"{artifact.name}: {seen.target} and {artifact.target} disagree")
    return list(artifacts.values()), unsupported
