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
from service.launchers.common import (
    JSON,
    TRAIN_SCRIPT,
    Artifact,
    Refusal,
    Target,
    Word,
    hyperparameter_note,
    model_duties,
    peft_artifacts,
    refuse,
    steps_duty,
    tf32_environment,
    world_refusal,
)


@dataclass(frozen=True, slots=True)
class Entry:
    via: Target  # the target whose command this is
    words: list[Word]  # after torchrun's own options
    files: list[Artifact]  # config files the command and the training script read
    env: list[tuple[str, str]]
    # what the training script must do for the layout, as the wrapped target's own launch script says
    # (DeepSpeed's MoE layers and checkpointing, the adapters): a wrapper that dropped it ran another job
    duties: str = ""


# The targets whose entry points Slurm and Kubernetes wrap (``refusal`` below: DeepSpeed's for its
# layouts, Megatron-LM's, torchtitan's then the HF Trainer's for FSDP): a plan for a wrapper must run
# in one of them. Accelerate is not wrapped (its launcher is accelerate launch, not torchrun), except
# by Slurm asked with it, for a layout none of these runs (``launchers.render``,
# ``slurm.accelerate_render``).
WRAPPED_TARGETS = (Target.DEEPSPEED, Target.MEGATRON, Target.TORCHTITAN, Target.HF_TRAINER)
WRAPPERS = (Target.SLURM, Target.KUBERNETES)


def refusal(plan: Plan) -> Refusal:
    """Why no entry point runs the plan, or None: the refusal of the framework's target (for FSDP,
    torchtitan's and then the HF Trainer's), prefixed with that target's name."""
    if (world := world_refusal(plan)) is not None:
        return world
    framework = plan.layout.framework
    if framework is Framework.DEEPSPEED:
        reason = deepspeed.refusal(plan)
        return None if reason is None else f"{Target.DEEPSPEED}: {reason}"
    if framework is Framework.MEGATRON:
        reason = megatron.refusal(plan)
        return None if reason is None else f"{Target.MEGATRON}: {reason}"
    titan = torchtitan.refusal(plan)
    if titan is None:
        return None
    hf = hf_trainer.refusal(plan)
    return None if hf is None else f"torchtitan: {titan}; hf_trainer: {hf}"


def entry(plan: Plan, wrapper: Target, config_dir: str = "", via: Target | None = None) -> Entry:
    """The per-node command after `torchrun <topology>`; raises Unsupported(wrapper, ...). ``via``:
    the target whose entry point a DeepSpeed layout runs through, where the request asked for the HF
    Trainer and not DeepSpeed's own script (its PyTorchJob ran `train.py --deepspeed --deepspeed_config`
    beside the HF Trainer's files, whose train.py parses TrainingArguments: exit 2; launch review)."""
    refuse(wrapper, refusal(plan))
    framework = plan.layout.framework
    if framework is Framework.DEEPSPEED and via is Target.HF_TRAINER:
        refuse(wrapper, None if (hf := hf_trainer.refusal(plan)) is None else f"hf_trainer: {hf}")
        return _hf_trainer_entry(plan, wrapper, config_dir)
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
        duties = deepspeed.model_code_duties(plan) + model_duties(plan, config_dir) + steps_duty(plan)
        duties += deepspeed.nvme_duty(plan) + hyperparameter_note()
        files = [file, *peft_artifacts(plan, wrapper)]
        return Entry(Target.DEEPSPEED, words, files, tf32_environment(plan), duties)
    if framework is Framework.MEGATRON:
        words = megatron.entry_words(plan)
        return Entry(Target.MEGATRON, words, [], megatron.environment(plan), megatron.notes(plan))
    if torchtitan.refusal(plan) is None:
        words = torchtitan.entry_words(plan)
        return Entry(Target.TORCHTITAN, words, [], torchtitan.environment(plan), torchtitan.notes(plan))
    return _hf_trainer_entry(plan, wrapper, config_dir)


def _hf_trainer_entry(plan: Plan, wrapper: Target, config_dir: str) -> Entry:
    words, files = hf_trainer.entry_words(plan, config_dir)
    files = [replace(f, target=wrapper) for f in files] + peft_artifacts(plan, wrapper)
    env = hf_trainer.environment(plan)
    return Entry(Target.HF_TRAINER, words, files, env, hf_trainer.duties(plan, config_dir))
