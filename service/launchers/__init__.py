"""Launcher configs for a plan: one pure renderer per target, reached only through RENDERERS.

Each renderer maps a Plan to the files its tool reads (a target may write several, e.g.
ds_config.json + deepspeed_launch.sh + hostfile), or raises Unsupported with the reason the
layout cannot be expressed there. Pinned tool versions are named in each module's docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from service.estimator.types import Framework, Plan
from service.launchers import accelerate, deepspeed, hf_trainer, kubernetes, megatron, slurm, torchtitan
from service.launchers.common import Artifact, Target, Unsupported

__all__ = [
    "FRAMEWORK_TARGETS",
    "RENDERERS",
    "Artifact",
    "Target",
    "Unsupported",
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


# The targets that run a framework's layout (Slurm and Kubernetes wrap one of these).
FRAMEWORK_TARGETS: dict[Framework, tuple[Target, ...]] = {
    Framework.DEEPSPEED: (Target.DEEPSPEED, Target.HF_TRAINER, Target.ACCELERATE),
    Framework.MEGATRON: (Target.MEGATRON, Target.ACCELERATE),
    Framework.FSDP: (Target.TORCHTITAN, Target.ACCELERATE, Target.HF_TRAINER),
}


def runnable_targets(
    plan: Plan, targets: Iterable[Target] | None = None, *, first_only: bool = False
) -> tuple[list[Target], dict[Target, str]]:
    """The targets of the plan's framework (those of ``targets`` only, when given) that render it,
    and why each of the others cannot. ``first_only``: stop at the first that renders (the search
    only asks whether one does; each render builds every file)."""
    wanted = FRAMEWORK_TARGETS[plan.layout.framework]
    if targets is not None:
        allowed = set(targets)
        wanted = tuple(t for t in wanted if t in allowed)
    runs: list[Target] = []
    reasons: dict[Target, str] = {}
    for target in wanted:
        try:
            RENDERERS[target](plan)
        except Unsupported as exc:
            reasons[target] = exc.reason
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
    for target in RENDERERS if targets is None else targets:
        try:
            produced = RENDERERS[Target(target)](plan)
        except Unsupported as exc:
            unsupported[Target(target)] = exc.reason
            continue
        for artifact in produced:
            seen = artifacts.get(artifact.name)
            if seen is None:
                artifacts[artifact.name] = artifact
            elif seen.content != artifact.content:
                raise AssertionError(f"{artifact.name}: {seen.target} and {artifact.target} disagree")
    return list(artifacts.values()), unsupported
