"""The training setup every estimate, plan and capacity request carries."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ModelWrapValidatorHandler, PrivateAttr, field_validator, model_validator

from service.contracts.common import Strict, documented_maximum
from service.estimator.defaults import HARDWARE_DEFAULT_FIELDS, for_gpu
from service.estimator.errors import InvalidTraining
from service.estimator.params import canonical_lora_targets, lora_module_names
from service.estimator.scale import MAX_SEQ_LEN
from service.estimator.types import (
    ALL_LINEAR,
    Attention,
    BaseDtype,
    GPUSpec,
    Method,
    ModelSpec,
    Optimizer,
    OptimizerImplementation,
    Precision,
    TrainingSpec,
)
from service.estimator.validate import (
    checkpoint_hardware_violation,
    checkpoint_violation,
    flash_head_dim_violation,
    position_table_violation,
)

# Hugging Face Trainer's optim names (transformers' OptimizerNames), as the optimizer they run and, where
# the name says it, torch's implementation: adamw_torch is torch.optim.AdamW at its CUDA default
# (foreach), adamw_torch_fused AdamW(fused=True); bitsandbytes' paged optimizers keep the same states
# in memory that pages to the host only under pressure, stepped one tensor at a time (nothing
# parameter-sized allocated, as fused). torch.optim.Adam keeps AdamW's states and steps as it does.
HF_OPTIM_NAMES: dict[str, tuple[Optimizer, OptimizerImplementation | None]] = {
    "adamw_torch": (Optimizer.ADAMW, OptimizerImplementation.FOREACH),
    "adamw_torch_fused": (Optimizer.ADAMW, OptimizerImplementation.FUSED),
    "adam": (Optimizer.ADAMW, None),
    "adamw_bnb_8bit": (Optimizer.ADAMW_8BIT, None),
    "paged_adamw_8bit": (Optimizer.ADAMW_8BIT, None),
    "paged_adamw_32bit": (Optimizer.ADAMW, OptimizerImplementation.FUSED),
    "lion_32bit": (Optimizer.LION, None),
    "paged_lion_32bit": (Optimizer.LION, None),
}


# sequences per optimizer step: a layout's micro-batch and accumulation steps may each be as many
MAX_GLOBAL_BATCH = 100_000_000


class TrainingIn(Strict):
    # the document states the scale bound the service refuses past, with its reasons (scale.py)
    seq_len: int = Field(ge=1, le=MAX_SEQ_LEN.limit, json_schema_extra=documented_maximum(MAX_SEQ_LEN.limit))
    global_batch_size: int = Field(ge=1, le=MAX_GLOBAL_BATCH, description="sequences per optimizer step")
    precision: Precision | None = Field(
        default=None,
        description="default: resolved from the GPU (bf16 where it has bf16 units as fast as its fp16 "
        "ones, else fp16, else fp32; never fp8), a stored 4-bit checkpoint's saved bnb_4bit_compute_dtype "
        "where its config states one (no other precision trains it), and named in the answer's "
        "resolved_defaults",
    )
    optimizer: Optimizer = Field(
        default=Optimizer.ADAMW,
        description="also read: HF Trainer's optim names, as the optimizer they run ("
        + ", ".join(f"{name} as {optimizer.value}" for name, (optimizer, _) in HF_OPTIM_NAMES.items())
        + "; adamw_torch with optimizer_implementation foreach, torch's CUDA default)",
    )
    optimizer_implementation: OptimizerImplementation = Field(
        default=OptimizerImplementation.FUSED,
        description="adamw under fsdp (PyTorch's own optimizer): fused (torch AdamW(fused=True); HF Trainer's"
        " default optim adamw_torch_fused, torchtitan's default) allocates nothing parameter-sized; foreach "
        "(torch.optim's default on CUDA: a plain torch.optim.AdamW, HF Trainer optim adamw_torch) makes a "
        "temporary of the trainable parameters' size in their dtype during the step (4 B per fp32 "
        "parameter, sharded as they are). deepspeed and megatron run their own fused optimizers and refuse "
        "foreach",
    )
    method: Method = Method.FULL
    lora_rank: int | None = Field(default=None, ge=1, le=65_536, description="LoRA/QLoRA only; default 16")
    lora_targets: list[str] | Literal["all-linear"] | None = Field(
        default=None,
        max_length=64,
        description='LoRA/QLoRA only; default "all-linear". Llama\'s names (q_proj, k_proj, v_proj, o_proj, '
        "gate_proj, up_proj, down_proj) or the model's own modules as peft takes them (Phi-3's qkv_proj, "
        "GPT-2's c_attn, BERT's query), also with their parent where the model has it (self_attn.q_proj, "
        "mlp.down_proj, Phi-3's self_attn.qkv_proj; an MoE model's attention), as peft matches a suffix: "
        "a fused module is adapted whole",
    )
    attention: Attention | None = Field(
        default=None,
        description="default: resolved from the GPU (flash where FlashAttention-2 runs, else sdpa's "
        "memory-efficient kernel) and named in the answer's resolved_defaults",
    )
    tokens: int | None = Field(
        default=None,
        gt=0,
        le=10**16,
        description="total tokens, for time to train: the whole optimizer steps (global batch x seq_len "
        "tokens each) that consume them, at least one",
    )
    mtp_num_layers: int = Field(
        default=0,
        ge=0,
        le=16,
        description="multi-token prediction depths trained with the model (megatron --mtp-num-layers; "
        "DeepSeek-V3 trains 1): each adds a layer, its projection and a loss on the last pipeline stage",
    )

    base_dtype: BaseDtype = Field(
        default=BaseDtype.COMPUTE,
        description="lora: the dtype the frozen base is kept in. compute: loaded in the compute dtype "
        "(from_pretrained(torch_dtype=torch.bfloat16) under bf16). fp32: loaded in fp32 (transformers' "
        "from_pretrained without torch_dtype) and trained under 16-bit autocast (HF Trainer bf16=True): 4 B "
        "per base parameter, and without FSDP sharding each layer keeps the 16-bit copies autocast makes "
        "of its weights until its backward (recompute full: one layer's), each forward casting them again. "
        "deepspeed refuses it (its engine casts the model to bf16 / fp16)",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _hf_optim_names(cls, data: Any, handler: ModelWrapValidatorHandler[TrainingIn]) -> TrainingIn:
        """An optimizer named as HF Trainer's optim names it (``HF_OPTIM_NAMES``): the optimizer, and
        the implementation the name says unless the request states one; the name kept for the answer
        (``optimizer_read``)."""
        if not isinstance(data, dict) or not isinstance(data.get("optimizer"), str):
            return handler(data)
        name = data["optimizer"].strip().lower().replace("-", "_")
        named = HF_OPTIM_NAMES.get(name)
        if named is None:
            return handler(data)
        optimizer, implementation = named
        data = {**data, "optimizer": optimizer.value}
        if implementation is not None and data.get("optimizer_implementation") is None:
            data["optimizer_implementation"] = implementation.value
        read = handler(data)
        read._hf_optim_name = name
        return read

    def optimizer_read(self) -> dict[str, str]:
        """How an HF Trainer optim name was read, for the answer's resolved_defaults: a paged
        optimizer as the unpaged one (the same states on the GPU, paged to the host only under
        pressure), which the launch files run (budget fine-tuner review: paged_adamw_8bit became
        adamw_bnb_8bit unsaid)."""
        name = self._hf_optim_name
        if name is None or name == self.optimizer.value:
            return {}
        paged = " (paging, not modelled, moves its states to the host only under memory pressure)"
        ran = f"{self.optimizer.value} as read from {name}"
        return {"training.optimizer": ran + (paged if name.startswith("paged_") else "")}

    @field_validator("lora_targets")
    @classmethod
    def _targets_named_once(cls, targets: list[str] | str | None) -> list[str] | str | None:
        # [] was taken as all-linear, and a module named twice counted its adapters twice
        if isinstance(targets, list):
            if not targets:
                raise ValueError('name at least one module, or "all-linear" (every decoder Linear)')
            twice = sorted({name for name in targets if targets.count(name) > 1})
            if twice:
                raise ValueError(f"{', '.join(twice)} named more than once: each module takes one adapter")
        return targets

    _hf_optim_name: str | None = PrivateAttr(default=None)

    def adapter_defaults(self) -> dict[str, str]:
        """The adapters' settings a LoRA / QLoRA request left out, as resolved (rank 16, every linear
        module of the model's family: ``params.lora_modules``), for the answer's resolved_defaults."""
        if self.method is Method.FULL:
            return {}
        chosen = {}
        if self.lora_rank is None:
            chosen["training.lora_rank"] = "16"
        if self.lora_targets is None:
            chosen["training.lora_targets"] = "all-linear"
        return chosen

    def to_domain(self, gpu: GPUSpec | None, model: ModelSpec) -> TrainingSpec:
        """The domain's training spec for ``gpu`` (the fields left out resolved from it; None: left
        for whoever places the job on a GPU, as capacity does per GPU type), with ``model``'s own
        LoRA module names read as the targets they hold (``params.canonical_lora_targets``); its
        errors name the field as the request body does."""
        try:
            training = self._to_domain(model)
            if (table := position_table_violation(model, training)) is not None:
                raise table
            # a GPU without the checkpoint's compute dtype first: no precision it runs is the checkpoint's
            if gpu is not None and (unrun := checkpoint_hardware_violation(model, gpu)) is not None:
                raise unrun
            if (stored := checkpoint_violation(model, training)) is not None:
                raise stored
            if (wide := flash_head_dim_violation(model, training)) is not None:
                raise wide
            return training if gpu is None else for_gpu(training, gpu, model)
        except InvalidTraining as exc:
            field = None if exc.field is None else f"training.{exc.field}"
            raise exc.at(field) from exc

    def _to_domain(self, model: ModelSpec | None) -> TrainingSpec:
        if self.method is Method.FULL:
            # adapters' settings with no adapters would be accepted and ignored
            for name in ("lora_rank", "lora_targets"):
                if getattr(self, name) is not None:
                    raise InvalidTraining(
                        f"{name} applies to method lora or qlora, not full", rule="unused", field=name
                    )
        wanted = self.lora_targets or "all-linear"
        targets = ALL_LINEAR if wanted == "all-linear" else tuple(wanted)
        if model is not None and wanted != "all-linear":
            targets = canonical_lora_targets(model, targets)
            if unknown := [t for t in targets if t not in ALL_LINEAR]:
                # named with the model's own modules (TrainingSpec knows Llama's names alone)
                raise InvalidTraining(
                    # the model's own modules and Llama's names read as the ones that hold them (Phi-3
                    # has no q_proj, but takes it as its qkv_proj's share: fine-tuner review)
                    f"unknown lora_targets {unknown} for {model.name}: lora_targets takes "
                    f"{list(lora_module_names(model))} (its own modules, and Llama's names for the ones "
                    "holding them), or all-linear",
                    rule="lora_target",
                    field="lora_targets",
                )
        return TrainingSpec(
            seq_len=self.seq_len,
            global_batch_size=self.global_batch_size,
            # a placeholder until for_gpu resolves it: a stored 4-bit checkpoint's own compute dtype,
            # which the rules before for_gpu compare with (checkpoint_violation)
            precision=self.precision
            or (model.bnb_4bit_compute_precision if model is not None else None)
            or Precision.BF16,
            optimizer=self.optimizer,
            optimizer_implementation=self.optimizer_implementation,
            method=self.method,
            lora_rank=16 if self.lora_rank is None else self.lora_rank,
            lora_targets=targets,
            attention=self.attention,  # None: resolved per GPU by for_gpu
            tokens=self.tokens,
            mtp_num_layers=self.mtp_num_layers,
            base_dtype=self.base_dtype,
            hardware_defaults=frozenset(
                name for name in HARDWARE_DEFAULT_FIELDS if getattr(self, name) is None
            ),
        )
