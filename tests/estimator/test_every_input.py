"""No input is accepted and ignored: every field of ``Layout`` and ``TrainingSpec`` either changes
the estimate (memory, step time or time to train) in a layout where it applies, or is refused.

Each case is (a base job, the same job with one field changed). A new field without a case fails
``test_every_field_has_a_case``, so it cannot slip in unmodelled."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator.errors import EstimatorError
from service.estimator.estimate import estimate
from service.estimator.types import (
    Attention,
    BaseDtype,
    ClusterSpec,
    Compile,
    Estimate,
    Framework,
    Layout,
    Method,
    ModelSpec,
    MoeDispatcher,
    MoESpec,
    Offload,
    Optimizer,
    OptimizerImplementation,
    Precision,
    Recompute,
    RecomputeModule,
    TrainingSpec,
)
from validation.cases import gpu_cluster

H100 = gpu("h100-sxm-80gb")
LLAMA = preset("llama-3.1-8b").spec
MOE = dataclasses.replace(
    LLAMA, name="llama-moe", moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=4096)
)
TRAINING = TrainingSpec(seq_len=4096, global_batch_size=64)
SHORT = TrainingSpec(seq_len=256, global_batch_size=8)
ONE_NODE, TWO_NODES = gpu_cluster(H100, 8, 50e9), gpu_cluster(H100, 16, 50e9)


@dataclasses.dataclass(frozen=True)
class Case:
    """``field`` changed from ``base`` to ``changed``: the estimate responds, or the change is refused."""

    field: str
    base: Layout
    changed: Layout
    model: ModelSpec = LLAMA
    cluster: ClusterSpec = ONE_NODE
    training: TrainingSpec = TRAINING
    changed_training: TrainingSpec | None = None
    refused: bool = False  # the changed value is refused rather than estimated


MEGATRON = Layout(framework=Framework.MEGATRON, dp=4, tp=2, sequence_parallel=True, zero_stage=1)
MEGATRON_PP = Layout(framework=Framework.MEGATRON, dp=2, tp=2, pp=2, sequence_parallel=True, zero_stage=1)
FSDP = Layout(framework=Framework.FSDP, dp=8, zero_stage=3)
DEEPSPEED = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=2)


def replace(layout: Layout, **changes: Any) -> Layout:
    return dataclasses.replace(layout, **changes)


LAYOUT_CASES = [
    Case("framework", DEEPSPEED, replace(DEEPSPEED, framework=Framework.FSDP)),
    Case("dp", replace(MEGATRON, dp=2, tp=4), MEGATRON),
    Case("tp", replace(MEGATRON, dp=8, tp=1, sequence_parallel=False), MEGATRON),
    Case("pp", replace(MEGATRON, dp=2, tp=2, pp=2), replace(MEGATRON, dp=1, tp=2, pp=4)),
    Case("cp", replace(MEGATRON, dp=4), replace(MEGATRON, dp=2, cp=2)),
    Case("ep", replace(MEGATRON, dp=4), replace(MEGATRON, dp=4, ep=2), model=MOE),
    Case("etp", replace(MEGATRON, dp=4, ep=4), replace(MEGATRON, dp=4, ep=4, etp=1), model=MOE),
    Case("etp", FSDP, replace(FSDP, etp=1), model=MOE, refused=True),  # Megatron's option only
    Case("sequence_parallel", replace(MEGATRON, sequence_parallel=False), MEGATRON),
    Case("zero_stage", replace(DEEPSPEED, zero_stage=1), DEEPSPEED),
    Case("offload_optimizer", DEEPSPEED, replace(DEEPSPEED, offload_optimizer=Offload.CPU)),
    Case(
        "offload_params",
        replace(DEEPSPEED, zero_stage=3),
        replace(DEEPSPEED, zero_stage=3, offload_params=Offload.CPU),
    ),
    Case("recompute", MEGATRON, replace(MEGATRON, recompute=Recompute.FULL)),
    Case(
        "recompute_num_layers",
        replace(MEGATRON, recompute=Recompute.FULL),
        replace(MEGATRON, recompute=Recompute.FULL, recompute_num_layers=8),
    ),
    Case(
        "recompute_every_n_layers",
        replace(FSDP, recompute=Recompute.FULL),
        replace(FSDP, recompute=Recompute.FULL, recompute_every_n_layers=2),
    ),
    Case(  # torchtitan's option only
        "recompute_every_n_layers",
        replace(MEGATRON, recompute=Recompute.FULL),
        replace(MEGATRON, recompute=Recompute.FULL, recompute_every_n_layers=2),
        refused=True,
    ),
    Case(
        "recompute_modules",
        replace(MEGATRON, recompute=Recompute.SELECTIVE),
        replace(MEGATRON, recompute=Recompute.SELECTIVE, recompute_modules=(RecomputeModule.MLP,)),
    ),
    *(
        Case(
            "recompute_modules",
            replace(MEGATRON, dp=4, ep=4, recompute=Recompute.SELECTIVE),
            replace(MEGATRON, dp=4, ep=4, recompute=Recompute.SELECTIVE, recompute_modules=(module,)),
            model=MOE,
        )
        for module in (RecomputeModule.MOE, RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM)
    ),
    Case(  # a dense model has no MoE block (nor shared experts, nor MLA, nor an unfused norm)
        "recompute_modules",
        replace(MEGATRON, recompute=Recompute.SELECTIVE),
        replace(MEGATRON, recompute=Recompute.SELECTIVE, recompute_modules=(RecomputeModule.MOE,)),
        refused=True,
    ),
    Case(  # Megatron's selective policy only
        "recompute_modules",
        replace(MEGATRON, recompute=Recompute.FULL),
        replace(MEGATRON, recompute=Recompute.FULL, recompute_modules=(RecomputeModule.CORE_ATTN,)),
        refused=True,
    ),
    Case(
        "moe_a2a_overlap",
        replace(MEGATRON, dp=4, ep=4),
        replace(MEGATRON, dp=4, ep=4, moe_a2a_overlap=True),
        model=MOE,
    ),
    Case("moe_a2a_overlap", MEGATRON, replace(MEGATRON, moe_a2a_overlap=True), refused=True),  # no experts
    Case(  # dropless -> padded to 1.25 x the mean load: more rows, no host sync
        "moe_capacity_factor",
        replace(MEGATRON, dp=4, ep=4),
        replace(MEGATRON, dp=4, ep=4, moe_capacity_factor=1.25),
        model=MOE,
    ),
    Case("moe_capacity_factor", MEGATRON, replace(MEGATRON, moe_capacity_factor=1.0), refused=True),  # dense
    Case(  # below 1 every expert drops routed tokens at an even load: MFU and HFU would pass 1
        "moe_capacity_factor",
        replace(MEGATRON, dp=4, ep=4),
        replace(MEGATRON, dp=4, ep=4, moe_capacity_factor=0.5),
        model=MOE,
        refused=True,
    ),
    Case(  # fsdp's MoE (Hugging Face, torchtitan) is dropless: no launcher would pad
        "moe_capacity_factor", FSDP, replace(FSDP, moe_capacity_factor=1.25), model=MOE, refused=True
    ),
    Case(  # deepspeed at ep = 1 trains the model's own (dropless) block, not DeepSpeed MoE layers
        "moe_capacity_factor",
        DEEPSPEED,
        replace(DEEPSPEED, moe_capacity_factor=1.25),
        model=MOE,
        refused=True,
    ),
    Case(  # HybridEP's deduplicating dispatch at its own NVLink efficiency, no second permutation
        "moe_dispatcher",
        replace(MEGATRON, dp=4, ep=4, etp=1),
        replace(MEGATRON, dp=4, ep=4, etp=1, moe_dispatcher=MoeDispatcher.FLEX),
        model=MOE,
    ),
    Case(  # Megatron's dispatcher only
        "moe_dispatcher", FSDP, replace(FSDP, moe_dispatcher=MoeDispatcher.FLEX), model=MOE, refused=True
    ),
    Case("moe_dispatcher", MEGATRON, replace(MEGATRON, moe_dispatcher=MoeDispatcher.FLEX), refused=True),
    Case(  # expert tensor parallelism (etp defaults to tp = 2) with flex: not modelled
        "moe_dispatcher",
        replace(MEGATRON, dp=4, ep=4),
        replace(MEGATRON, dp=4, ep=4, moe_dispatcher=MoeDispatcher.FLEX),
        model=MOE,
        refused=True,
    ),
    Case(  # HybridEP runs on Hopper and Blackwell only
        "moe_dispatcher",
        replace(MEGATRON, dp=4, ep=4, etp=1),
        replace(MEGATRON, dp=4, ep=4, etp=1, moe_dispatcher=MoeDispatcher.FLEX),
        model=MOE,
        cluster=gpu_cluster(gpu("a100-sxm-80gb"), 8, 25e9),
        refused=True,
    ),
    Case("micro_batch_size", MEGATRON, replace(MEGATRON, micro_batch_size=2)),
    Case(
        "virtual_pipeline_stages",
        replace(MEGATRON_PP, micro_batch_size=2),
        replace(MEGATRON_PP, micro_batch_size=2, virtual_pipeline_stages=2),
    ),
    # derived from the batch: stating it is a check, a different value is refused
    Case(
        "gradient_accumulation_steps",
        MEGATRON,
        replace(MEGATRON, gradient_accumulation_steps=8),
        refused=True,
    ),
    Case("activation_offload", FSDP, replace(FSDP, activation_offload=True)),
    Case(
        "optimizer_in_backward",
        FSDP,
        replace(FSDP, optimizer_in_backward=True),
        training=dataclasses.replace(TRAINING, global_batch_size=8),
    ),
    Case("chunked_loss", FSDP, replace(FSDP, chunked_loss=True)),
    Case("torch_compile", FSDP, replace(FSDP, torch_compile=Compile.MODEL)),
    Case("torch_compile", FSDP, replace(FSDP, torch_compile=Compile.MODEL_AND_LOSS)),
    Case(
        "torch_compile",
        replace(FSDP, torch_compile=Compile.MODEL),
        replace(FSDP, torch_compile=Compile.MODEL_AND_LOSS),
    ),
    Case("torch_compile", MEGATRON, replace(MEGATRON, torch_compile=Compile.MODEL), refused=True),
    Case(
        "fsdp_hybrid_shard",
        replace(FSDP, dp=16),
        replace(FSDP, dp=16, fsdp_hybrid_shard=True),
        cluster=TWO_NODES,
    ),
    Case(  # two replicas by default (one per node); four replicas of 4-rank shard groups
        "dp_replicate",
        replace(FSDP, dp=16, fsdp_hybrid_shard=True),
        replace(FSDP, dp=16, fsdp_hybrid_shard=True, dp_replicate=4),
        cluster=TWO_NODES,
    ),
    Case("dp_replicate", FSDP, replace(FSDP, dp_replicate=2), refused=True),  # HSDP's: needs hybrid shard
    Case("tp_comm_overlap", MEGATRON, replace(MEGATRON, tp_comm_overlap=True)),
    Case("overlap_grad_reduce", MEGATRON, replace(MEGATRON, overlap_grad_reduce=False)),  # recipes: on
    Case("grad_reduce_in_fp32", MEGATRON, replace(MEGATRON, grad_reduce_in_fp32=True)),
    Case("grad_reduce_in_fp32", FSDP, replace(FSDP, grad_reduce_in_fp32=False), refused=True),  # Megatron's
    Case(
        "fp8_param_gather",
        MEGATRON,
        replace(MEGATRON, fp8_param_gather=False),
        training=dataclasses.replace(TRAINING, precision=Precision.FP8),
    ),
    Case("fp8_param_gather", MEGATRON, replace(MEGATRON, fp8_param_gather=True), refused=True),  # bf16
    # Megatron-LM's own optimizer (the recipes' bf16 default is on): a 4-byte master, an fp32 grad copy
    Case("precision_aware_optimizer", MEGATRON, replace(MEGATRON, precision_aware_optimizer=False)),
    Case("precision_aware_optimizer", FSDP, replace(FSDP, precision_aware_optimizer=True), refused=True),
    Case(  # Float16OptimizerWithFloat16Params: Megatron refuses it without the distributed optimizer
        "precision_aware_optimizer",
        MEGATRON,
        replace(MEGATRON, zero_stage=0, precision_aware_optimizer=True),
        refused=True,
    ),
    Case("pipeline_layers", MEGATRON_PP, replace(MEGATRON_PP, pipeline_layers=(12, 20))),
    # 31 layers over 2 stages: [16, 15] with the embedding and the loss counted, [15, 16] with the embedding
    Case(
        "pipeline_account_for_embedding",
        MEGATRON_PP,
        replace(MEGATRON_PP, pipeline_account_for_embedding=True),
        model=dataclasses.replace(LLAMA, num_layers=31),
    ),
    Case("pipeline_account_for_loss", MEGATRON_PP, replace(MEGATRON_PP, pipeline_account_for_loss=True)),
]

LORA = dataclasses.replace(TRAINING, method=Method.LORA)
TRAINING_CASES = [
    Case("seq_len", FSDP, FSDP, changed_training=dataclasses.replace(TRAINING, seq_len=2048)),
    Case(
        "global_batch_size", FSDP, FSDP, changed_training=dataclasses.replace(TRAINING, global_batch_size=128)
    ),
    Case("precision", FSDP, FSDP, changed_training=dataclasses.replace(TRAINING, precision=Precision.FP8)),
    Case(
        "optimizer",
        FSDP,
        FSDP,
        changed_training=dataclasses.replace(TRAINING, optimizer=Optimizer.ADAMW_8BIT),
    ),
    Case("method", FSDP, FSDP, changed_training=LORA),
    Case("lora_rank", FSDP, FSDP, training=LORA, changed_training=dataclasses.replace(LORA, lora_rank=256)),
    Case(
        "lora_targets",
        FSDP,
        FSDP,
        training=LORA,
        changed_training=dataclasses.replace(LORA, lora_targets=("q_proj", "v_proj")),
    ),
    Case(
        "attention",
        FSDP,
        FSDP,
        changed_training=dataclasses.replace(TRAINING, attention=Attention.EAGER),
    ),
    Case("tokens", FSDP, FSDP, changed_training=dataclasses.replace(TRAINING, tokens=10**12)),
    # fp32 and eager as written; left to the hardware, the H100 resolves them to bf16 and flash
    Case(
        "hardware_defaults",
        FSDP,
        FSDP,
        training=dataclasses.replace(TRAINING, precision=Precision.FP32, attention=Attention.EAGER),
        changed_training=dataclasses.replace(
            TRAINING,
            precision=Precision.FP32,
            attention=Attention.EAGER,
            hardware_defaults=frozenset({"precision", "attention"}),
        ),
    ),
    Case(
        "mtp_num_layers",
        MEGATRON_PP,
        MEGATRON_PP,
        changed_training=dataclasses.replace(TRAINING, mtp_num_layers=1),
    ),
    Case(  # Megatron-Core's option only
        "mtp_num_layers",
        FSDP,
        FSDP,
        changed_training=dataclasses.replace(TRAINING, mtp_num_layers=1),
        refused=True,
    ),
    Case(
        "base_dtype",
        FSDP,
        FSDP,
        training=LORA,
        changed_training=dataclasses.replace(LORA, base_dtype=BaseDtype.FP32),
    ),
    Case(  # torch.optim's foreach AdamW: a parameter-sized temporary in the step, the peak at seq 256
        "optimizer_implementation",
        FSDP,
        FSDP,
        training=SHORT,
        changed_training=dataclasses.replace(SHORT, optimizer_implementation=OptimizerImplementation.FOREACH),
    ),
    Case(  # DeepSpeed builds its own FusedAdam
        "optimizer_implementation",
        DEEPSPEED,
        DEEPSPEED,
        changed_training=dataclasses.replace(
            TRAINING, optimizer_implementation=OptimizerImplementation.FOREACH
        ),
        refused=True,
    ),
    Case(  # DeepSpeed's engine casts the whole model to the 16-bit dtype
        "base_dtype",
        DEEPSPEED,
        DEEPSPEED,
        training=LORA,
        changed_training=dataclasses.replace(LORA, base_dtype=BaseDtype.FP32),
        refused=True,
    ),
]


def _numbers(e: Estimate) -> tuple[object, ...]:
    time = e.time
    return (
        e.memory.per_gpu,
        e.memory.cpu_per_node_bytes,
        None if time is None else time.breakdown,
        e.time_to_train_s,
    )


def _estimate(case: Case, layout: Layout, training: TrainingSpec) -> Estimate:
    return estimate(case.model, case.cluster, layout, training, tuning=default_tuning())


@pytest.mark.parametrize("case", LAYOUT_CASES + TRAINING_CASES, ids=lambda c: c.field)
def test_the_field_changes_the_estimate_or_is_refused(case: Case) -> None:
    base = _estimate(case, case.base, case.training)
    changed_training = case.changed_training or case.training
    if case.refused:
        with pytest.raises(EstimatorError):
            _estimate(case, case.changed, changed_training)
        return
    changed = _estimate(case, case.changed, changed_training)
    assert _numbers(changed) != _numbers(base), case.field
    # the case changes only its own field
    layout_diff = {
        f.name
        for f in dataclasses.fields(Layout)
        if getattr(case.base, f.name) != getattr(case.changed, f.name)
    }
    training_diff = {
        f.name
        for f in dataclasses.fields(TrainingSpec)
        if getattr(case.training, f.name) != getattr(changed_training, f.name)
    }
    assert layout_diff | training_diff <= {case.field, "dp", "tp", "pp", "cp", "sequence_parallel"}, (
        case.field
    )
    assert case.field in layout_diff | training_diff


# Read off the GPU wherever the job is placed (defaults.for_gpu), never from a request: no case can
# change it on one cluster. tests/estimator/test_peak_moments.py places one job on a V100 and an A100.
DERIVED_TRAINING_FIELDS = frozenset({"gpu_flash_kernels"})


def test_every_field_has_a_case() -> None:
    assert {c.field for c in LAYOUT_CASES} == {f.name for f in dataclasses.fields(Layout)}
    assert {c.field for c in TRAINING_CASES} | DERIVED_TRAINING_FIELDS == {
        f.name for f in dataclasses.fields(TrainingSpec)
    }
