"""Slurm target: an sbatch script that starts one torchrun per node across the allocation.

sbatch reads ``#SBATCH`` lines literally and only up to the first command, so they come first.
MASTER_ADDR is the allocation's first host (``scontrol show hostnames``); torchrun's c10d
rendezvous assigns node ranks, so every srun task runs the identical command.
"""

from __future__ import annotations

import dataclasses
import shlex

from service.estimator.types import Plan
from service.launchers import accelerate
from service.launchers.common import (
    MASTER_PORT,
    SHELL,
    Artifact,
    Target,
    Word,
    comment_lines,
    dns_label,
    layout_summary,
    shell_command,
    shell_words,
    torchrun_words,
)
from service.launchers.job import entry

SCRIPT_NAME = "trainplan.sbatch"
TARGET = Target.SLURM


def _preamble(plan: Plan, runs: str, env: list[tuple[str, str]]) -> list[str]:
    """The #SBATCH lines (one task per node: torchrun or accelerate launch starts the per-GPU
    workers), the layout, what runs, and the rendezvous address every node reads."""
    cluster = plan.cluster
    return [
        "#!/bin/bash",
        f"#SBATCH --job-name={dns_label('trainplan-' + plan.model.name)}",
        f"#SBATCH --nodes={cluster.num_nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={cluster.gpus_per_node}",
        "#SBATCH --exclusive",
        "#SBATCH --output=%x-%j.out",
        *comment_lines(layout_summary(plan)),
        *comment_lines(runs),
        "set -euo pipefail",
        'MASTER_ADDR="$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 1)"',
        "export MASTER_ADDR",
        f"export MASTER_PORT={MASTER_PORT}",
        'export JOB_ID="${SLURM_JOB_ID}"',
        *(f"export {shell_words([f'{k}={v}'])}" for k, v in env),
    ]


def sbatch_script(plan: Plan, via: Target | None = None) -> tuple[str, list[Artifact]]:
    job = entry(plan, TARGET, via=via)
    lines = _preamble(plan, f"Runs {job.via} under torchrun, one srun task per node.{job.duties}", job.env)
    words: list[Word] = ["srun", "--kill-on-bad-exit=1", *torchrun_words(plan, rendezvous="c10d"), *job.words]
    lines.append(shell_command(words))
    return "\n".join(lines) + "\n", job.files


def render(plan: Plan, via: Target | None = None) -> list[Artifact]:
    text, files = sbatch_script(plan, via)
    return [*files, Artifact(name=SCRIPT_NAME, target=TARGET, media_type=SHELL, content=text)]


def accelerate_render(plan: Plan) -> list[Artifact]:
    """The sbatch script that runs Accelerate's launcher once per node (``accelerate launch``
    with the node's rank, ``$SLURM_NODEID``, and the first host's address), with the files that
    launch reads; raises Unsupported where Accelerate cannot run the plan. ``launchers.render``
    renders it for Slurm asked with Accelerate, where no torchrun entry point Slurm wraps
    (``job.refusal``) runs the layout: FSDP with tensor or context parallelism and PEFT, or a model
    torchtitan does not build, runs through Accelerate alone."""
    files = [a for a in accelerate.render(plan) if a.name != accelerate.LAUNCH_NAME]
    runs = (
        f"Runs accelerate launch ({accelerate.CONFIG_NAME}), one srun task per node: no torchrun "
        "entry point runs this layout, Accelerate does." + accelerate.duties(plan)
    )
    lines = _preamble(plan, runs, accelerate.environment(plan))
    launch = accelerate.launch_words(plan)
    if plan.cluster.num_nodes == 1:
        lines.append(shell_command(["srun", "--kill-on-bad-exit=1", *launch]))
    else:  # each task's rank is its node's: expanded inside the task, not by this script
        per_node = f'export NODE_RANK="${{SLURM_NODEID}}"; exec {shell_words(launch)}'
        lines.append(f"srun --kill-on-bad-exit=1 bash -c {shlex.quote(per_node)}")
    script = Artifact(name=SCRIPT_NAME, target=TARGET, media_type=SHELL, content="\n".join(lines) + "\n")
    return [*(dataclasses.replace(f, target=TARGET) for f in files), script]
