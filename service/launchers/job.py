"""What a scheduler runs for a plan: the framework's torchrun entry point and the files it reads.

Slurm and Kubernetes wrap the same thing: one torchrun per node, then DeepSpeed's
``train.py --deepspeed --deepspeed_config``, Megatron's ``pretrain_gpt.py``, or for FSDP
torchtitan (registered models) and else the HF Trainer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from service.estimator.types import Framework, Plan
from service.launchers import deepspeed, hf_trainer, megatron, torchtitan
from service.launchers.common import JSON, TRAIN_SCRIPT, Artifact, Target, Unsupported, Word


@dataclass(frozen=True, slots=True)
class Entry:
    via: Target  # the target whose command this is
    words: list[Word]  # after torchrun's own options
    files: list[Artifact]  # config files the command reads
    env: list[tuple[str, str]]


def entry(plan: Plan, wrapper: Target, config_dir: str = "") -> Entry:
    """The per-node command after `torchrun <topology>`; raises Unsupported(wrapper, ...)."""
    framework = plan.layout.framework
    try:
        if framework is Framework.DEEPSPEED:
            config = deepspeed.ds_config(plan)
            file = Artifact(
                name=deepspeed.CONFIG_NAME,
                target=wrapper,
                media_type=JSON,
                content=json.dumps(config, indent=2) + "\n",
            )
            words: list[Word] = [
                TRAIN_SCRIPT,
                "--deepspeed",
                "--deepspeed_config",
                config_dir + deepspeed.CONFIG_NAME,
            ]
            return Entry(Target.DEEPSPEED, words, [file], [])
        if framework is Framework.MEGATRON:
            return Entry(Target.MEGATRON, megatron.entry_words(plan), [], megatron.environment(plan))
        try:
            return Entry(Target.TORCHTITAN, torchtitan.entry_words(plan), [], torchtitan.environment())
        except Unsupported as titan:
            try:
                words, files = hf_trainer.entry_words(plan, config_dir)
            except Unsupported as hf:
                raise Unsupported(wrapper, f"torchtitan: {titan.reason}; hf_trainer: {hf.reason}") from hf
            return Entry(Target.HF_TRAINER, words, [replace(f, target=wrapper) for f in files], [])
    except Unsupported as exc:
        if exc.target is wrapper:
            raise
        raise Unsupported(wrapper, f"{exc.target}: {exc.reason}") from exc
