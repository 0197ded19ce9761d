"""Hugging Face Trainer target (pinned: transformers 5.24.0): TrainingArguments as JSON and as flags.

Field names from transformers/training_args.py. ``deepspeed`` points at the DeepSpeed target's
ds_config.json (concrete numbers that equal TrainingArguments, so the Trainer's "auto" merge has
nothing to fill and nothing to contradict); FSDP goes through ``fsdp`` + ``fsdp_config`` (v2).
The Trainer has no tensor, pipeline, context or expert parallelism of its own.
"""

from __future__ import annotations

import json
from typing import Any

from service.estimator.model_states import hsdp_replicas
from service.estimator.types import (
    Compile,
    Framework,
    Method,
    Offload,
    Optimizer,
    OptimizerImplementation,
    Plan,
    Precision,
    Recompute,
    TrainingSpec,
)
from service.frameworks import FRAMEWORKS
from service.launchers import deepspeed
from service.launchers.common import (
    HYPERPARAMETERS,
    JSON,
    SHELL,
    TRAIN_SCRIPT,
    Artifact,
    Refusal,
    Target,
    Word,
    accumulation,
    activation_offload_refusal,
    compiled_fp32_refusal,
    fsdp_reduce_duty,
    full_logits_refusal,
    hf_decoder_layer,
    hyperparameter_note,
    load_dtype_duty,
    model_duties,
    peft_artifacts,
    refuse,
    script,
    sharded_8bit_refusal,
    shell_command,
    stored_nf4_storage_refusal,
    tf32_environment,
    torchrun_words,
    train_steps,
    world_refusal,
    z3_leaf_duty,
)

ARGS_NAME = "training_args.json"
FSDP_CONFIG_NAME = "fsdp_config.json"
LAUNCH_NAME = "hf_trainer_launch.sh"
TARGET = Target.HF_TRAINER
DATALOADER_WORKERS = 4  # per rank; with 8 ranks per node that is 32 loader processes
PREFETCH_FACTOR = 2  # batches each worker keeps ready (PyTorch's default when workers > 0)

_OPTIM = {
    Optimizer.ADAMW: "adamw_torch_fused",
    Optimizer.ADAMW_8BIT: "adamw_bnb_8bit",
    Optimizer.SGD: "sgd",
    Optimizer.ADAFACTOR: "adafactor",
    Optimizer.LION: "lion_32bit",
}


def optim_name(training: TrainingSpec) -> str:
    """TrainingArguments.optim for the training's optimizer: AdamW's torch implementation as estimated
    (``OptimizerImplementation``: adamw_torch_fused, or adamw_torch, torch.optim's foreach default)."""
    if (
        training.optimizer is Optimizer.ADAMW
        and training.optimizer_implementation is OptimizerImplementation.FOREACH
    ):
        return "adamw_torch"
    return _OPTIM[training.optimizer]


def refusal(plan: Plan) -> Refusal:
    """Why the HF Trainer cannot run the plan as estimated, or None."""
    lo = plan.layout
    if (world := world_refusal(plan)) is not None:
        return world
    if TARGET not in FRAMEWORKS[lo.framework].targets:
        return "the layout is for Megatron-LM; the HF Trainer runs DeepSpeed or FSDP"
    if (logits := full_logits_refusal(plan) or activation_offload_refusal(plan)) is not None:
        return logits
    if (tf32 := compiled_fp32_refusal(plan)) is not None:
        return tf32  # the Trainer's Accelerator, which TrainingArguments' tf32=False does not keep off
    if lo.tp > 1 or lo.pp > 1 or lo.cp > 1 or lo.ep > 1:
        return f"tp={lo.tp} pp={lo.pp} cp={lo.cp} ep={lo.ep}: the HF Trainer runs data parallelism only"
    if plan.training.precision is Precision.FP8:
        return "TrainingArguments has no fp8 switch; use the accelerate target"
    if plan.training.optimizer is Optimizer.SGD:
        # trainer_optimizer.py _get_sgd builds torch.optim.SGD from lr and weight decay alone (no
        # optim_args): no momentum buffer, another optimizer than the estimate's (bytes review)
        return (
            "optim sgd is torch.optim.SGD without momentum (the Trainer passes it no optim_args), not the "
            "momentum SGD estimated; use the accelerate or deepspeed target"
        )
    if lo.recompute_every_n_layers is not None:
        # transformers 5.24 activation_checkpointing_kwargs every_n_layers checkpoints layer indices 0, N,
        # 2N, ... (modeling_utils _set_gradient_checkpointing: layer_index % N == 0), ceil(L / N)
        # layers, where the estimate (torchtitan's count % N == 0) recomputes floor(L / N), other ones
        n = lo.recompute_every_n_layers
        return (
            f"the Trainer's every_n_layers={n} checkpoints layers 0, {n}, {2 * n}, ... (the first of each "
            f"{n}), not every {n}-th counted from the first as estimated (torchtitan's)"
        )
    if lo.torch_compile is Compile.MODEL:
        return "torch_compile compiles the model's forward, the loss of HF models with it: model_and_loss"
    if lo.recompute is Recompute.SELECTIVE_OP:  # whatever shards: plain DDP rendered no checkpointing at all
        return "per-op selective AC is torchtitan's; the Trainer checkpoints whole decoder layers"
    if lo.framework is Framework.DEEPSPEED:
        return deepspeed.refusal(plan)  # the deepspeed target's ds_config.json
    if lo.zero_stage == 0:
        return None  # plain DDP
    return _fsdp_refusal(plan)


def _fsdp_refusal(plan: Plan) -> Refusal:
    lo = plan.layout
    if lo.zero_stage == 1:
        return "FSDP has no optimizer-state-only sharding (ZeRO-1)"
    if (eight_bit := sharded_8bit_refusal(plan) or stored_nf4_storage_refusal(plan)) is not None:
        return eight_bit
    if hsdp_replicas(lo, plan.cluster) > 1:
        # the Trainer builds HSDP's 2-D mesh only from a ParallelismConfig (TrainingArguments'
        # parallelism_config, or accelerate launch's environment), which this target renders none of
        # (hybrid-sharding review: the reason said FSDP2 had no such mesh)
        return (
            "HSDP (dp_replicate > 1): this target renders no ParallelismConfig, the 2-D mesh FSDP2's "
            "hybrid shard needs; the accelerate target renders one"
        )
    if lo.offload_optimizer is Offload.NVME or lo.offload_params is Offload.NVME:
        return "FSDP offloads to CPU memory only, not NVMe"
    if (lo.offload_optimizer is Offload.NONE) != (lo.offload_params is Offload.NONE):
        return "FSDP2's cpu_offload moves parameters, gradients and optimizer states together"
    return None


def _fsdp_config(plan: Plan) -> dict[str, Any]:
    lo = plan.layout
    if plan.training.method is Method.QLORA:
        # FSDP1 with flat parameters: FSDP2 breaks bitsandbytes' NF4 weights (the accelerate
        # target's _fsdp_version says why); the Trainer builds FSDP1 from these keys
        # (TrainingArguments._fsdp_plugin_args, transformers 5.24.0)
        shard = "full_shard" if lo.zero_stage == 3 else "shard_grad_op"
        version: dict[str, Any] = {
            "version": 1,
            "reshard_after_forward": shard,
            "use_orig_params": False,
            "sync_module_states": True,
        }
    else:
        version = {"version": 2, "reshard_after_forward": lo.zero_stage == 3}  # False = SHARD_GRAD_OP
    config: dict[str, Any] = version | {
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "state_dict_type": "SHARDED_STATE_DICT",
        "cpu_ram_efficient_loading": True,
        "cpu_offload": lo.offload_params is Offload.CPU,
        "activation_checkpointing": lo.recompute is Recompute.FULL,  # whole decoder layers
    }
    layer = hf_decoder_layer(plan.model.family)
    if layer is not None:  # otherwise the model's _no_split_modules decide
        config["transformer_layer_cls_to_wrap"] = [layer]
    return config


def _parallel(plan: Plan, config_dir: str) -> tuple[dict[str, Any], list[Artifact]]:
    """The deepspeed= / fsdp= arguments, and the files they point at."""
    lo = plan.layout
    if lo.framework is Framework.DEEPSPEED:
        ds = deepspeed.ds_config(plan)
        artifact = Artifact(
            name=deepspeed.CONFIG_NAME,
            target=TARGET,
            media_type=JSON,
            content=json.dumps(ds, indent=2) + "\n",
        )
        return {"deepspeed": config_dir + deepspeed.CONFIG_NAME}, [artifact]
    if lo.zero_stage == 0:
        return {}, []  # plain DDP
    fsdp = _fsdp_config(plan)
    artifact = Artifact(
        name=FSDP_CONFIG_NAME, target=TARGET, media_type=JSON, content=json.dumps(fsdp, indent=2) + "\n"
    )
    return {"fsdp": True, "fsdp_config": config_dir + FSDP_CONFIG_NAME}, [artifact]


def training_arguments(plan: Plan, config_dir: str = "") -> tuple[dict[str, Any], list[Artifact]]:
    """TrainingArguments fields (for HfArgumentParser.parse_json_file) and the config files they name.

    config_dir: prefix of the config-file paths (empty: the working directory).
    """
    refuse(TARGET, refusal(plan))
    lo = plan.layout
    parallel, files = _parallel(plan, config_dir)
    args: dict[str, Any] = {
        "output_dir": "output",
        "max_steps": train_steps(plan),
        "per_device_train_batch_size": lo.micro_batch_size,
        "gradient_accumulation_steps": accumulation(plan),
        "optim": optim_name(plan.training),
        # The same optimizer settings as ds_config's block, which HF Trainer checks against these.
        "learning_rate": HYPERPARAMETERS.lr,
        "adam_beta1": HYPERPARAMETERS.beta1,
        "adam_beta2": HYPERPARAMETERS.beta2,
        "adam_epsilon": HYPERPARAMETERS.eps,
        "weight_decay": HYPERPARAMETERS.weight_decay,
        "max_grad_norm": HYPERPARAMETERS.clip_grad_norm,
    }
    precision = plan.training.precision
    sharded = lo.framework is Framework.FSDP and lo.zero_stage >= 2
    if precision is Precision.BF16 or (precision is Precision.BF16_PURE and not sharded):
        args["bf16"] = True
    # bf16_pure under FSDP: no mixed precision, the model loaded in bf16 (Accelerate's FSDP2 upcasts
    # every parameter to fp32 under any: utils/fsdp_utils.py; a launch review)
    elif precision is Precision.FP16:
        args["fp16"] = True
    elif precision is Precision.TF32 and plan.cluster.gpu.vendor != "amd":
        # fp32 training (neither bf16 nor fp16) with TrainingArguments.tf32: the Trainer sets
        # torch.backends.cuda.matmul.allow_tf32 (transformers training_args.py). On ROCm it raises
        # ("--tf32 requires Ampere or a newer GPU arch, cuda>=11": is_torch_tf32_available() is False
        # without torch.version.cuda; AMD review): there the launch environment switches TF32 on
        # (``environment``), as the other targets' do
        args["tf32"] = True
    # FSDP checkpoints through fsdp_config; the Trainer refuses both switches at once.
    if lo.recompute is Recompute.FULL and "fsdp" not in parallel:
        args["activation_checkpointing"] = True
    if lo.torch_compile is Compile.MODEL_AND_LOSS:
        args["torch_compile"] = True  # inductor, over the forward that computes the loss
    args |= {
        "dataloader_num_workers": DATALOADER_WORKERS,
        "dataloader_prefetch_factor": PREFETCH_FACTOR,
        "dataloader_pin_memory": True,
        "dataloader_persistent_workers": True,
        "logging_steps": 10,
        "save_steps": 500,
        "report_to": "none",
    }
    args |= parallel
    if "fsdp" in parallel and args["gradient_accumulation_steps"] > 1:
        # the Trainer skips the gradient sync of every accumulated micro-batch but the last unless
        # sync_each_batch (trainer.py _inner_training_loop: accelerator.no_sync), and FSDP2 then keeps each
        # unit's whole unsharded gradient; the estimate reduce-scatters every micro-batch (a launch review)
        args["accelerator_config"] = {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
    return args, files


def cli_flags(args: dict[str, Any]) -> list[str]:
    """The same arguments as HfArgumentParser command-line flags."""
    flags: list[str] = []
    for key, value in args.items():
        if key == "fsdp" and value is True:
            flags.append("--fsdp")  # nargs="?", const=True
        elif isinstance(value, bool):
            flags += [f"--{key}", str(value).lower()]
        elif isinstance(value, dict):  # a dict field as JSON (TrainingArguments._VALID_DICT_FIELDS)
            flags += [f"--{key}", json.dumps(value, separators=(",", ":"))]
        else:
            flags += [f"--{key}", str(value)]
    return flags


def entry_words(plan: Plan, config_dir: str = "") -> tuple[list[Word], list[Artifact]]:
    """What follows torchrun's options: the script and its flags; plus the files it reads."""
    args, files = training_arguments(plan, config_dir)
    return [TRAIN_SCRIPT, *cli_flags(args)], files


def environment(plan: Plan) -> list[tuple[str, str]]:
    """The launch environment: an AMD GPU's TF32 switch (``common.tf32_environment``), which
    TrainingArguments.tf32 cannot set on ROCm; none otherwise (the Trainer's flag sets it)."""
    return tf32_environment(plan) if plan.cluster.gpu.vendor == "amd" else []


def duties(plan: Plan, config_dir: str = "") -> str:
    """What train.py must do under the HF Trainer: for its own launch script, and for the Slurm /
    Kubernetes wrapper that runs it (``job``; config_dir: where that wrapper mounts the files)."""
    return (
        model_duties(plan, config_dir)
        + z3_leaf_duty(plan)
        + fsdp_reduce_duty(plan, "trainer.accelerator")
        + load_dtype_duty(plan)
        + _fsdp1_note(plan)
        + hyperparameter_note()
    )


def _fsdp1_note(plan: Plan) -> str:
    """QLoRA's FSDP runs FSDP1 (``_fsdp_config``), which transformers 5.24 still builds while its
    TrainingArguments logs it as deprecated, announced for removal in v5.20 (training_args.py
    _fsdp_plugin_args): the file says so, so that an upgrade that drops it is no surprise (a review)."""
    if plan.training.method is not Method.QLORA or plan.layout.framework is not Framework.FSDP:
        return ""
    if plan.layout.zero_stage == 0:
        return ""
    return (
        "\nfsdp version 1: QLoRA stays on FSDP1 because FSDP2 breaks bitsandbytes' NF4 weights "
        "(bitsandbytes#1945); transformers 5.24 runs it but logs it as deprecated (announced for removal "
        "in v5.20): a later transformers may refuse this fsdp_config."
    )


def render(plan: Plan) -> list[Artifact]:
    args, files = training_arguments(plan)
    words: list[Word] = [*torchrun_words(plan, rendezvous="c10d"), TRAIN_SCRIPT, *cli_flags(args)]
    header = (
        f"HF Trainer (transformers 5.24.0): {TRAIN_SCRIPT} parses TrainingArguments with HfArgumentParser,\n"
        f"from these flags or from {ARGS_NAME} (parse_json_file)."
    )
    header += duties(plan)
    return [
        Artifact(name=ARGS_NAME, target=TARGET, media_type=JSON, content=json.dumps(args, indent=2) + "\n"),
        *files,
        *peft_artifacts(plan, TARGET),
        Artifact(
            name=LAUNCH_NAME,
            target=TARGET,
            media_type=SHELL,
            content=script(plan, [shell_command(words)], env=environment(plan), header=header),
        ),
    ]
