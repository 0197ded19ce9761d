"""Slurm target: an sbatch script that starts one torchrun per node across the allocation.

sbatch reads ``#SBATCH`` lines literally and only up to the first command, so they come first.
MASTER_ADDR is the allocation's first host (``scontrol show hostnames``); torchrun's c10d
rendezvous assigns node ranks, so every srun task runs the identical command.
"""

from __future__ import annotations

from service.estimator.types import Plan
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


def sbatch_script(plan: Plan) -> tuple[str, list[Artifact]]:
    job = entry(plan, TARGET)
    cluster = plan.cluster
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={dns_label('trainplan-' + plan.model.name)}",
        f"#SBATCH --nodes={cluster.num_nodes}",
        "#SBATCH --ntasks-per-node=1",  # torchrun starts the per-GPU workers itself
        f"#SBATCH --gpus-per-node={cluster.gpus_per_node}",
        "#SBATCH --exclusive",
        "#SBATCH --output=%x-%j.out",
        *comment_lines(layout_summary(plan)),
        f"# Runs {job.via} under torchrun, one srun task per node.",
        "set -euo pipefail",
        'MASTER_ADDR="$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 1)"',
        "export MASTER_ADDR",
        f"export MASTER_PORT={MASTER_PORT}",
        'export JOB_ID="${SLURM_JOB_ID}"',
        *(f"export {shell_words([f'{k}={v}'])}" for k, v in job.env),
    ]
    words: list[Word] = ["srun", "--kill-on-bad-exit=1", *torchrun_words(plan, rendezvous="c10d"), *job.words]
    lines.append(shell_command(words))
    return "\n".join(lines) + "\n", job.files


def render(plan: Plan) -> list[Artifact]:
    text, files = sbatch_script(plan)
    return [*files, Artifact(name=SCRIPT_NAME, target=TARGET, media_type=SHELL, content=text)]
