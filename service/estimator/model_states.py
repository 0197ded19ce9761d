"""Model states on one GPU: weights, gradients and optimizer states, sharded and offloaded.

Bytes per parameter follow ZeRO (Rajbhandari et al., arXiv:1910.02054 §3.1, §5): 2 bytes of 16-bit
weights, 2 of gradients and K = 12 of fp32 master weights and Adam moments, the master copy counted
with the optimizer states; stage 1 shards the optimizer over the data-parallel group, stage 2 also
the gradients, stage 3 also the weights. Megatron keeps bf16 main gradients by default, as NVIDIA's
recipes run it (16 bytes, 4 + 12/d with the distributed optimizer), or fp32 ones with
``Layout.grad_reduce_in_fp32`` True, Megatron-LM's own default (18 bytes, 6 + 12/d; Megatron-LM
docs/user-guide/features/dist_optimizer.md). Its distributed optimizer steps bf16 with Transformer
Engine's precision-aware FusedAdam as NVIDIA's recipes run it (a 2-byte master beside the bf16
weights: 4 + 10/d; ``megatron_precision_aware_optimizer``); otherwise its step casts 16-bit main
grads to an fp32 copy, 4 or 4/d (``StateBytes.casts_gradients``). FSDP's sharded fp32 parameter is
the master. The published estimators of DeepSpeed
(``estimate_zero{2,3}_model_states_mem_needs``) and Megatron-LM
(``compute_weight_and_optimizer_memory``), which validation compares these with, are reproduced
exactly in ``validation/published_formulas.py``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from service.estimator.params import (
    MTP_NORMS,
    LayerKind,
    autotp_keeps_vocab_whole,
    embedding_parameters,
    is_moe_layer,
    largest_module_parameters,
    lora_adapter_shapes,
    mla_down_parameters,
    moe_layer_count,
    mtp_projection_parameters,
    norm_parameters,
    parameter_counts,
    peft_moves_mlp_targets,
    peft_saved_head_parameters,
)
from service.estimator.tuning import MemoryAssumptions
from service.estimator.types import (
    ALL_LINEAR,
    MLP_LINEAR,
    ClusterSpec,
    Framework,
    Layout,
    Method,
    ModelSpec,
    MoESpec,
    Offload,
    Optimizer,
    ParameterCounts,
    Precision,
    TrainingSpec,
)

MiB = 2**20
# Mixed precision keeps an fp32 master copy; fp32 and tf32 train the fp32 weights themselves.
MIXED = frozenset({Precision.BF16, Precision.FP16, Precision.FP8})


@dataclass(frozen=True, slots=True, kw_only=True)
class StateBytes:
    """Bytes per parameter of each model-state tensor."""

    weights: float  # the 16-bit (or fp32) copy the GEMMs read
    gradients: float
    master: float  # fp32 master weights; for FSDP the sharded fp32 parameter itself
    moments: float  # optimizer state proper
    # DeepSpeed's BF16_Optimizer (deepspeed_bf16_optimizer): master and moments sharded at ZeRO-0
    sharded_optimizer_at_zero0: bool = False
    # Megatron's step casts 16-bit main grads to an fp32 copy (mixed precision with a 16-bit grad
    # buffer, no precision-aware FusedAdam)
    casts_gradients: bool = False
    # Transformer Engine's FusedAdam holds the master and writes the 16-bit weights in its kernel
    # (Megatron's precision-aware optimizer: no separate copy back)
    fused_master: bool = False
    # the master is the fp32 weights' low 16 bits beside the 16-bit weights (Transformer Engine's
    # store_param_remainders): the step reads and writes both
    master_remainders: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RankParameters:
    """Parameters on one GPU after tp, pp and ep, before ZeRO/FSDP sharding."""

    layers: int  # decoder layers on the rank
    moe_layers: int  # of which MoE
    dense: float  # sharded by ZeRO over dp x cp
    expert: float  # routed experts, sharded over the expert-data-parallel group
    linear: float  # the decoder layers' Linear weights among them (QLoRA quantises these)
    layer: float  # the largest decoder layer (FSDP's gathering unit)
    layer_linear: float  # its Linear weights (QLoRA's NF4 ones, routed experts included)
    layer_experts: float  # its routed experts
    last_unit: float  # final norm + output layer, gathered at the loss (FSDP)


# ---------------------------------------------------------------- DeepSpeed buckets

# Bucket sizes in elements, as the rendered ds_config.json sets them. Hugging Face's DeepSpeed
# integration fills "auto" with reduce_bucket_size = h^2, stage3_prefetch_bucket_size = 0.9 h^2
# and stage3_param_persistence_threshold = 10 h (transformers integrations/deepspeed.py
# HfTrainerDeepSpeedConfig.trainer_config_finalize): a bucket holds about one h x h matrix, so it
# fills (and its reduce starts) once per layer or so, instead of DeepSpeed's own code defaults
# (reduce/allgather 5e8, prefetch 5e7, persistence 1e5; runtime/zero/config.py), which at 2 bytes
# are 1 GB buckets that a 7B model fills only a few times per backward (little to overlap).
# Clamped to [1e7, 5e8]: below 1e7 NCCL launch overhead dominates, above 5e8 is DeepSpeed's default.
DS_MAX_BUCKET_ELEMENTS = 500_000_000
# ZeRO-3's sub_group_size (elements), DeepSpeed's default, which the launcher renders: its optimizer
# steps one sub-group of the rank's partition at a time (docs.deepspeed.ai config-json)
DS_SUB_GROUP_ELEMENTS = 1_000_000_000
DS_MIN_BUCKET_ELEMENTS = 10_000_000
DS_MAX_LIVE_PARAMETERS = 1_000_000_000  # DeepSpeed's default stage3_max_live_parameters
DS_MAX_REUSE_DISTANCE = 1_000_000_000  # DeepSpeed's default stage3_max_reuse_distance (zero/config.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepSpeedBuckets:
    """The ZeRO bucket settings the DeepSpeed launcher renders, and what they allocate."""

    reduce_bucket_elements: int  # zero_optimization.reduce_bucket_size
    allgather_bucket_elements: int  # zero_optimization.allgather_bucket_size (stage 1/2)
    prefetch_bucket_elements: int  # stage3_prefetch_bucket_size
    param_persistence_threshold: int  # stage3_param_persistence_threshold
    max_live_parameters: int  # stage3_max_live_parameters
    max_reuse_distance: int  # stage3_max_reuse_distance
    overlap_comm: bool  # zero_optimization.overlap_comm, as DeepSpeed will run it
    # 16-bit gradient staging the ZeRO optimizer allocates: stage 1/2 (contiguous_gradients)
    # one reduce_bucket_size buffer, a second one with overlap_comm ("Use double buffers to avoid
    # data access conflict when overlap_comm is enabled", stage_1_and_2.py backward_prologue);
    # stage 3 one per dtype (stage3.py, bucket.buffer) whatever overlap_comm; 0 at stage 0.
    reduce_buffer_elements: int


def _ds_bucket(elements: float) -> int:
    return int(max(DS_MIN_BUCKET_ELEMENTS, min(DS_MAX_BUCKET_ELEMENTS, elements)))


def deepspeed_overlap_comm(layout: Layout) -> bool:
    """overlap_comm as DeepSpeed runs it for ``layout``.

    ``Layout.overlap_grad_reduce`` None takes DeepSpeed's default (True at stage 3, False below:
    zero/config.py ``overlap_comm_valid``); the pipeline engine forces it off at stage <= 2, and
    stage 0 has no ZeRO reduce to overlap.
    """
    stage = layout.zero_stage
    if stage == 0 or (layout.pp > 1 and stage <= 2):
        return False
    return stage == 3 if layout.overlap_grad_reduce is None else layout.overlap_grad_reduce


def deepspeed_buckets(model: ModelSpec, layout: Layout) -> DeepSpeedBuckets:
    """ZeRO bucket sizes the DeepSpeed launcher writes to ds_config.json and the memory model counts."""
    return _deepspeed_buckets(model.hidden_size, layout.zero_stage, deepspeed_overlap_comm(layout))


@functools.lru_cache(maxsize=256)
def _deepspeed_buckets(h: int, zero_stage: int, overlap: bool) -> DeepSpeedBuckets:
    # a function of three small numbers, asked several times per layout (buffers, DP buckets,
    # ZeRO-3 gathers): built once per (hidden size, stage, overlap)
    reduce = _ds_bucket(h * h)
    if zero_stage == 0:
        buffers = 0
    elif zero_stage < 3:
        buffers = 2 if overlap else 1
    else:
        buffers = 1
    return DeepSpeedBuckets(
        reduce_bucket_elements=reduce,
        allgather_bucket_elements=_ds_bucket(h * h),
        prefetch_bucket_elements=_ds_bucket(9 * h * h // 10),
        param_persistence_threshold=10 * h,
        max_live_parameters=DS_MAX_LIVE_PARAMETERS,
        max_reuse_distance=DS_MAX_REUSE_DISTANCE,
        overlap_comm=overlap,
        reduce_buffer_elements=buffers * reduce,
    )


def deepspeed_assumption(model: ModelSpec, layout: Layout) -> str:
    """The memory notes' line on DeepSpeed's buckets ('' below ZeRO-1 or for other frameworks)."""
    if layout.framework is not Framework.DEEPSPEED or layout.zero_stage == 0:
        return ""
    b = deepspeed_buckets(model, layout)
    squared = model.hidden_size**2
    rule = (
        'h^2, as Hugging Face\'s "auto"'
        if b.reduce_bucket_elements == squared
        else f'h^2 = {squared:.3g}, as Hugging Face\'s "auto", clamped to [{DS_MIN_BUCKET_ELEMENTS:.0e}, '
        f"{DS_MAX_BUCKET_ELEMENTS:.0e}]"
    )
    text = (
        f"DeepSpeed reduce_bucket_size {b.reduce_bucket_elements:.3g} elements ({rule}), overlap_comm "
        f"{str(b.overlap_comm).lower()}: "
        f"{b.reduce_buffer_elements // b.reduce_bucket_elements} gradient bucket(s) allocated"
    )
    if layout.zero_stage == 3:
        text += (
            f"; ZeRO-3 live parameters: largest module + prefetch {b.prefetch_bucket_elements:.3g} elements "
            f"(0.9 h^2), max live {b.max_live_parameters:.0e}, params under "
            f"{b.param_persistence_threshold} elements (10 h) persistent"
        )
    return text


# ---------------------------------------------------------------- bytes per parameter


def moment_bytes(training: TrainingSpec, model: ModelSpec, assume: MemoryAssumptions) -> float:
    """Optimizer moments per trainable parameter (no master copy)."""
    # AdamW: m and v; Lion and SGD-momentum: one moment; Adafactor: factored second moment only
    # (rows + columns per matrix, Shazeer & Stern arXiv:1804.04235), beta1 = None as in HF.
    element = 2 if training.precision is Precision.BF16_PURE else 4
    if training.optimizer is Optimizer.ADAMW:
        return 2 * element
    if training.optimizer is Optimizer.ADAMW_8BIT:
        return 2 * (1 + 4 / assume.adam_8bit_block_elements)
    if training.optimizer in (Optimizer.SGD, Optimizer.LION):
        return element
    return element * adafactor_state_fraction(model, training)


# bitsandbytes' 32-bit states (optim_bits 32: fp32 state1 and state2)
BNB_32BIT_STATE_BYTES = 8


def embedding_table_fraction(model: ModelSpec) -> float:
    """The share of the model's parameters in nn.Embedding tables (tokens, learned positions, token
    types; an embedding norm is a LayerNorm), which a tied output layer shares."""
    norm = norm_parameters(model) if model.embedding_norm else 0
    return (embedding_parameters(model) - norm) / parameter_counts(model).total


def fsdp_adam_8bit_moment_bytes(model: ModelSpec, eight_bit: float) -> float:
    """8-bit AdamW's moments per parameter where its optimizer steps the model's own parameters (the
    FSDP framework's DDP: the HF Trainer, Accelerate): the Trainer keeps every nn.Embedding's states in
    32 bits (transformers 5 trainer.py create_optimizer: register_module_override(module, "weight",
    {"optim_bits": 32}) for each nn.Embedding where '"bitsandbytes" in str(optimizer_cls)' and
    optim_bits is 8, which trainer_optimizer.py _get_bitsandbytes_optimizer passes for adamw_8bit,
    adamw_bnb_8bit and paged_adamw_8bit; releases before it tested the class name Adam8bit, which
    those names no longer build; Accelerate's script is told to do the same), ``eight_bit`` bytes the
    others; averaged over the parameters, as ZeRO-less DDP holds
    them all (Llama 3.2 3B's tied 394M-parameter table: +2.2 GiB, past a 24 GB card's headroom;
    budget fine-tuner review). DeepSpeed's flattened partitions match no override."""
    share = embedding_table_fraction(model)
    return (1 - share) * eight_bit + share * BNB_32BIT_STATE_BYTES


def adafactor_state_fraction(model: ModelSpec, training: TrainingSpec) -> float:
    """Adafactor's state elements per trainable parameter: rows + cols per matrix it trains (a vector
    keeps its own size), over the parameters. Full training: every layer's attention and MLP, an MoE
    layer's routed experts, shared experts and router instead of the dense MLP, the embedding and
    the norms. LoRA / QLoRA: the adapters alone, A (r x fan_in) and B (fan_out x r), about 1/r of
    them, over one dense layer's adapters (an expert's differ by 2 / (fan_in + fan_out)): the whole
    model's ratio was 170x too small for Llama 3.1 8B's rank-16 adapters, and fell as the vocabulary
    grew (property review)."""
    if training.method is not Method.FULL:
        r = training.lora_rank
        shapes = lora_adapter_shapes(model, adapted_linears(model, training), model.ffn_hidden_size)
        if not shapes:  # no target on the model: nothing trains (validate refuses the request)
            return 0.0
        factored = sum(2 * r + fan_in + fan_out for _, fan_in, fan_out in shapes)
        return factored / sum(r * (fan_in + fan_out) for _, fan_in, fan_out in shapes)
    h, q, kv, f = model.hidden_size, model.q_size, model.kv_size, model.ffn_hidden_size
    counts = parameter_counts(model)
    per_mlp = 3 if model.mlp.gated else 2
    attention = (h + q) + 2 * (h + kv) + (q + h)
    dense = per_mlp * (h + f)
    moe_layers = sum(1 for i in range(model.num_layers) if is_moe_layer(model, i))
    moe = model.moe
    routed = 0
    if moe is not None:
        routed = moe.num_experts * per_mlp * (h + moe.expert_ffn_hidden_size) + (h + moe.num_experts)
        routed += moe.num_shared_experts * per_mlp * (h + moe.shared_expert_ffn_hidden_size)
    factored = model.num_layers * attention + (model.num_layers - moe_layers) * dense + moe_layers * routed
    factored += model.vocab_size + h
    vectors = counts.norms_per_layer * model.num_layers + counts.final_norm
    return (factored + vectors) / counts.total


def megatron_grads_in_fp32(layout: Layout) -> bool:
    """Whether Megatron keeps and reduces its bf16/fp8 main grads in fp32: the layout's
    ``grad_reduce_in_fp32``, else what NVIDIA's current recipes run, bf16 (False): Megatron-Bridge's
    performance configs and set_llama3(1)_common_configs, NeMo's H100 launch scripts
    (optim.grad_sync_dtype=bf16) and NVIDIA's MLPerf GPT-3 configs reduce in bf16. Megatron-LM's own
    default for --bf16 is fp32 (validate_args, unless --grad-reduce-in-bf16): ``True`` runs that."""
    return False if layout.grad_reduce_in_fp32 is None else layout.grad_reduce_in_fp32


# The torch dtype PyTorch FSDP reduces gradients in, whatever the training precision: torchtitan's
# MixedPrecisionPolicy(param_dtype, reduce_dtype=float32) (--training.mixed_precision_reduce, whose
# only accepted value from 0.2.0 through 0.3.0 is "float32": config TrainingConfig, models/*/
# parallelize.py apply_fsdp), as Composer's DEFAULT policy (mosaic_parallelism.get_mixed_precision:
# reduce_dtype torch.float32). Accelerate and the HF Trainer would reduce in the mixed dtype
# (accelerate 1.15.0 utils/dataclasses.py FullyShardedDataParallelPlugin.set_mixed_precision:
# param_dtype = reduce_dtype), so their launchers set this policy (launchers.common.fsdp_reduce_duty).
FSDP_REDUCE_DTYPE = "float32"
FSDP_REDUCE_BYTES = 4  # an element of FSDP_REDUCE_DTYPE


def grad_reduce_bytes(precision: Precision, layout: Layout) -> int:
    """Bytes per gradient element in the data-parallel reduction (all-reduce or reduce-scatter) and
    in the buffers it reduces from, as each framework runs ``precision``."""
    if precision.stores_fp32:
        return 4
    framework = layout.framework
    if framework is Framework.MEGATRON:
        # the grad buffer's dtype: fp32 unless grad_reduce_in_fp32 is False (bf16 / fp8); fp16 keeps
        # fp16 grads (core/distributed/param_and_grad_buffer.py)
        mixed_bf16 = precision in (Precision.BF16, Precision.FP8)
        return 4 if mixed_bf16 and megatron_grads_in_fp32(layout) else 2
    if framework is Framework.FSDP:
        if layout.zero_stage == 0:
            # PyTorch DDP all-reduces param.grad (reducer.cpp buckets take the gradient's dtype):
            # fp32 under autocast, which keeps fp32 parameters (torchtitan 0.3.0 apply_ddp +
            # maybe_enable_amp; accelerate / HF Trainer MULTI_GPU); bf16 where the model is bf16
            return 2 if precision is Precision.BF16_PURE else 4
        # FSDP/HSDP reduce-scatter (and HSDP all-reduce) in the policy's reduce_dtype
        # (_fsdp_collectives.foreach_reduce copies the grads into a reduce_dtype buffer)
        return FSDP_REDUCE_BYTES
    # DeepSpeed: communication_data_type, unset in the rendered ds_config, defaults to the fp16/bf16
    # training dtype (0.19.8 runtime/engine.py communication_data_type), which ZeRO 1-3 reduce in
    # (stage_1_and_2.py average_tensor / allreduce_bucket, stage3.py __avg_scatter_grads) and stage
    # 0 all-reduces in (engine.allreduce_bucket); ds_config sets no grad_accum_dtype, so the grads
    # themselves are 16-bit. Under Ulysses (cp > 1) the engine switches to
    # seq_parallel_communication_data_type, fp32 by default (runtime/constants.py).
    return 4 if layout.cp > 1 else 2


def megatron_fp8_params(layout: Layout, precision: Precision) -> bool:
    """Whether Megatron keeps its GEMM weights as fp8 and gathers them in fp8 (--fp8-param-gather):
    the layout's ``fp8_param_gather``, else what NVIDIA's fp8 recipes run: on for fp8 with the
    distributed optimizer (Megatron-Bridge's fp8 precision configs, mixed_precision.py; NeMo 2.0's
    fp8_params), which is the only optimizer it runs with."""
    if layout.fp8_param_gather is not None:
        return layout.fp8_param_gather
    return layout.framework is Framework.MEGATRON and precision is Precision.FP8 and layout.zero_stage == 1


def megatron_precision_aware_optimizer(layout: Layout, training: TrainingSpec) -> bool:
    """Whether Megatron runs --use-precision-aware-optimizer: the layout's ``precision_aware_optimizer``,
    else on with optimizer offload (which validate_args requires it with) and, on the GPU, what NVIDIA's
    performance recipes run: on for bf16 with the distributed optimizer and Adam (Megatron-Bridge's
    scripts/performance setup and NeMo 2.0's performance helpers set it when the compute dtype is bf16;
    megatron/core/optimizer/__init__.py refuses it without the distributed optimizer and
    optimizer_config.py with any optimizer but adam). Megatron-LM's own default is off."""
    if layout.framework is not Framework.MEGATRON:
        return False
    if layout.offload_optimizer is not Offload.NONE:
        return True
    if layout.precision_aware_optimizer is not None:
        return layout.precision_aware_optimizer
    return (
        layout.zero_stage == 1
        and training.precision is Precision.BF16
        and training.optimizer is Optimizer.ADAMW
    )


def megatron_fused_adam_on_gpu(layout: Layout, training: TrainingSpec) -> bool:
    """Whether the precision-aware FusedAdam steps on the GPU: Transformer Engine's FusedAdam holds
    the master (``use_precision_aware_optimizer_no_fp8_or_ds_fp8``, optimizer_config.py: bf16 and
    fp16, and fp8 with delayed scaling, the launch file's recipe) and reads the 16-bit main grads as
    they are (distrib_optimizer.py ``_copy_model_grads_to_main_grads``: ``decoupled_grad`` is the grad
    buffer's view, no .float()); nothing offloaded. Over bf16 weights its master is the fp32 weights'
    low 16 bits (``megatron_master_remainders``)."""
    return (
        training.precision in MIXED
        and layout.offload_optimizer is Offload.NONE
        and megatron_precision_aware_optimizer(layout, training)
    )


def megatron_master_remainders(layout: Layout, training: TrainingSpec) -> bool:
    """Whether the precision-aware FusedAdam keeps its master as remainders (2 B): over bf16 weights
    (bf16, and fp8 without --fp8-param-gather), store_param_remainders (OptimizerConfig's default
    True; Megatron turns it off below Transformer Engine 2.1: optimizer_config.py, and Transformer
    Engine applies it to bfloat16 parameters only: fused_adam.py)."""
    bf16_weights = training.precision is Precision.BF16 or (
        training.precision is Precision.FP8 and not megatron_fp8_params(layout, training.precision)
    )
    return bf16_weights and megatron_fused_adam_on_gpu(layout, training)


def deepspeed_bf16_optimizer(layout: Layout, precision: Precision) -> bool:
    """Whether DeepSpeed steps with its ``BF16_Optimizer``: the pipeline engine at ZeRO-0 with bf16
    weights (bf16 training, and fp8, whose ds_config is bf16's). 0.19's engine.py
    ``_do_optimizer_sanity_check`` returns BFLOAT16 where the model and the gradient accumulation
    dtype are bf16 (``grad_accum_dtype`` unset: the model's, since PR #7515) under pipeline
    parallelism, and DDP_BFLOAT16 (``FP16_Optimizer`` over bf16) without a pipeline. ``BF16_Optimizer``
    (runtime/bf16_optimizer.py) partitions the fp32 master and its optimizer states over the
    data-parallel group (the expert-data-parallel one for MoE groups) as ZeRO-1 does, accumulates
    into a flat bf16 gradient buffer beside the parameters' ``.grad`` (which the pipeline engine
    zeroes, never frees: ``clear_lp_grads``), casts every group's gradient partition to fp32 for the
    step, and all-gathers the updated bf16 weights (``update_lp_params``)."""
    return (
        layout.framework is Framework.DEEPSPEED
        and layout.zero_stage == 0
        and layout.pp > 1
        and precision in (Precision.BF16, Precision.FP8)
    )


# BF16_Optimizer's flat gradient accumulation buffer: grad_acc_dtype, bf16 where ds_config sets none
BF16_OPTIMIZER_GRAD_BYTES = 2


def deepspeed_master_clone(layout: Layout, precision: Precision) -> bool:
    """Whether DeepSpeed's ZeRO-1/2 keeps a master copy of its partition without mixed precision (fp32,
    tf32, bf16_pure): stage_1_and_2.py ``DeepSpeedZeroOptimizer.__init__`` clones every rank's
    partition of the weights (``.detach().clone().to(master_weights_and_grads_dtype)``: fp32, or bf16
    with ``bf16_master_weights_and_grads``) as the tensor the optimizer steps, a separate tensor even
    in the weights' dtype; ZeRO-3 reuses its flat partition where the dtypes match
    (stage3.py ``_create_fp32_partitions``), and ZeRO-0 steps the weights themselves. A 7B in fp32 at
    ZeRO-2 on eight 40 GB cards was said to fit with 0.17 GiB spare without its 3.1 GiB (DeepSpeed
    review)."""
    return layout.framework is Framework.DEEPSPEED and layout.zero_stage in (1, 2) and precision not in MIXED


def state_bytes(
    training: TrainingSpec,
    framework: Framework,
    model: ModelSpec,
    assume: MemoryAssumptions,
    grads_in_fp32: bool,
    deepspeed_optimizer: tuple[bool, bool] = (False, False),
    megatron_fused_adam: tuple[bool, bool] = (False, False),
    flat_partitions: bool = False,
) -> StateBytes:
    """Bytes per trainable parameter by precision and framework (ZeRO §3.1; Megatron dist_optimizer.md);
    ``grads_in_fp32``: Megatron's bf16/fp8 gradient buffer dtype (``megatron_grads_in_fp32``);
    ``deepspeed_optimizer``: (its ZeRO-1/2 master clone without mixed precision,
    ``deepspeed_master_clone``; its BF16_Optimizer's flat gradient buffer, ``deepspeed_bf16_optimizer``);
    ``megatron_fused_adam``: Megatron's precision-aware FusedAdam on the GPU (``megatron_fused_adam_on_gpu``,
    no fp32 copy of the grads) and whether it keeps remainders (``megatron_master_remainders``)."""
    p = training.precision
    weights = 4 if p.stores_fp32 else 2  # fp32 and tf32: fp32 weights and gradients, no master
    master = 4.0 if p in MIXED else 0.0
    gradients: float = weights
    master_clone, bf16_optimizer = deepspeed_optimizer
    if master_clone:
        master = weights  # the partition cloned in the weights' dtype
    if bf16_optimizer:
        gradients += BF16_OPTIMIZER_GRAD_BYTES
    if framework is Framework.MEGATRON and p in (Precision.BF16, Precision.FP8):
        # the DDP grad buffer: fp32 main grads (2 + 4 + 12 = 18 bytes) or, with grad_reduce_in_fp32
        # False, bf16 ones (16 bytes; core/distributed/param_and_grad_buffer.py: grad_dtype is
        # fp32 only with grad_reduce_in_fp32)
        gradients = 4 if grads_in_fp32 else 2
    elif framework is Framework.FSDP and p in MIXED:
        gradients = 4  # gradients take the sharded fp32 parameter's dtype
    fused, remainders = megatron_fused_adam if framework is Framework.MEGATRON else (False, False)
    remainders = remainders and p in (Precision.BF16, Precision.FP8)  # over bf16 weights only
    if remainders:
        master = FP32_BYTES - weights  # the fp32 weights' low 16 bits
    moments = moment_bytes(training, model, assume)
    if (
        framework is Framework.FSDP
        and training.optimizer is Optimizer.ADAMW_8BIT
        and training.method is Method.FULL
    ):
        moments = fsdp_adam_8bit_moment_bytes(model, moments)
    if framework is Framework.DEEPSPEED and flat_partitions and training.optimizer is Optimizer.ADAFACTOR:
        # DeepSpeed's ZeRO optimizers hand their optimizer flat 1-D fp32 partitions (stage_1_and_2.py:
        # param_group["params"] = [single_partition_of_fp32_groups[i]]; stage3.py its flat sub-groups; the
        # pipeline's BF16_Optimizer its flat groups), and transformers' Adafactor factors a tensor of 2 or
        # more dimensions only (factored = len(grad_shape) >= 2; else exp_avg_sq = zeros_like(grad)): a
        # whole fp32 second moment, 4 B per parameter where the factored rows and columns were counted
        # (an optimizer review: +4 GB per GPU of Llama 3.1 8B over eight). ZeRO-0 without the pipeline
        # steps shaped tensors (FP16_UnfusedOptimizer's per-parameter fp32 clones, or the parameters
        # themselves in fp32): factored (a change review)
        moments = FP32_BYTES
    if framework is Framework.FSDP and training.optimizer is Optimizer.LION:
        # the HF Trainer's lion_32bit, bitsandbytes' Lion with optim_bits 32 (Accelerate's script is
        # told to build the same): an fp32 momentum whatever the weights' dtype (Optimizer1State
        # init_state: state1 float32), 4 B where pure bf16's element is 2 (bytes review, stop 50)
        moments = FP32_BYTES
    return StateBytes(
        weights=weights,
        gradients=gradients,
        master=master,
        moments=moments,
        sharded_optimizer_at_zero0=bf16_optimizer,
        # Float16OptimizerWithFloat16Params ``_copy_model_grads_to_main_grads``: ``main_param.grad =
        # model_param.main_grad.float()``, DistributedOptimizer's the same on its shard: a new fp32
        # tensor per parameter (an fp32 buffer's .float() is the tensor itself), alive until the next
        # step's zero_grad (megatron/core/optimizer/optimizer.py, distrib_optimizer.py)
        casts_gradients=framework is Framework.MEGATRON
        and bool(master)
        and gradients < FP32_BYTES
        and not fused,
        fused_master=fused and bool(master),
        master_remainders=remainders,
    )


def optimizer_step_bytes(sb: StateBytes, framework: Framework) -> float:
    """HBM bytes per trainable parameter that one optimizer step moves: the step is memory-bound, and
    reads and writes the states ``state_bytes`` counts."""
    # A fused step reads p, g, m, v and writes p, m, v (apex and DeepSpeed FusedAdam, csrc
    # multi_tensor_adam.cu; torch's fused AdamW; SGD, Lion, Adafactor and 8-bit Adam touch their own
    # moments the same way): the parameter it updates (the fp32 master, or the weights themselves
    # without one) and the moments read and written, the gradient read as stored. With a master,
    # DeepSpeed and Megatron then write the 16-bit weights from it (DeepSpeed's bit16 groups,
    # Megatron's _copy_main_params_to_model_params: model_param.data.copy_(main_param), a pass that
    # reads the master and writes the weights); FSDP casts its sharded fp32 parameter to 16 bits at
    # the all-gather, not in the step. Megatron casts 16-bit main grads to fp32 first
    # (StateBytes.casts_gradients), and the step reads that copy. Transformer Engine's FusedAdam
    # writes the 16-bit weights in its kernel, no copy back (multi_tensor_adam.cu AdamFunctorMaster;
    # Megatron's _copy_main_params_to_model_params returns early under it), and with remainders reads
    # them too, as the fp32 value's high half.
    if sb.fused_master:
        weights = 2 * sb.weights if sb.master_remainders else sb.weights
        return 2 * (sb.master + sb.moments) + sb.gradients + weights
    parameter = sb.master or sb.weights
    copy = sb.master + sb.weights if sb.master and framework is not Framework.FSDP else 0.0
    if sb.casts_gradients:
        # the 16-bit main grads cast to fp32 (read, write) and the step reading the fp32 copy
        return 2 * (parameter + sb.moments) + sb.gradients + 2 * FP32_BYTES + copy
    return 2 * (parameter + sb.moments) + sb.gradients + copy


FP32_BYTES = 4  # an fp32 element (activations.FP32_BYTES reads it)


def fsdp_parameter_bytes(sb: StateBytes) -> float:
    """FSDP's one sharded parameter per trainable parameter: the fp32 master under mixed precision
    (MixedPrecision casts it to 16 bits at each all-gather), else the weights themselves; no 16-bit
    copy beside it, as ZeRO and Megatron keep."""
    return sb.master or sb.weights


def state_bytes_per_parameter(sb: StateBytes, framework: Framework) -> float:
    """Model-state bytes of one trainable parameter, each state once: what ZeRO-3 / FULL_SHARD
    divides over its group (``_group_states`` at its largest divisors)."""
    if framework is Framework.FSDP:
        return fsdp_parameter_bytes(sb) + sb.gradients + sb.moments
    return sb.weights + sb.gradients + sb.master + sb.moments


# NF4 is a 4-bit data type: bitsandbytes packs two weights a byte into the parameter's storage
# (Params4bit; its quant_storage dtype, bf16 for FSDP and ZeRO-3, only views the same bytes).
NF4_BITS = 4
# bitsandbytes' 4-bit blocks (blocksize 64): one fp32 absmax per block, 0.5 bits per weight, where the
# checkpoint was saved without double quantization (which stores it in 8 bits with an fp32 constant per
# 256 of them: the tuning's qlora_bits_per_param, Dettmers et al. arXiv:2305.14314 §3)
NF4_BLOCK = 64
NF4_SINGLE_CONSTANT_BITS = 32 / NF4_BLOCK


def frozen_dtype_bytes(training: TrainingSpec) -> float:
    """Bytes per frozen base parameter kept unquantized: the compute dtype's (2), or fp32's (4) under
    fp32 and tf32 or where LoRA's base was loaded in fp32 (``frozen_bytes``)."""
    return 4.0 if training.precision.stores_fp32 or training.base_autocast else 2.0


def qlora_bits_per_weight(model: ModelSpec, assume: MemoryAssumptions) -> float:
    """Bits per NF4 Linear weight with its quantization constants: as a stored 4-bit checkpoint states
    them (``ModelSpec.bnb_4bit_constant_bits``: its saved quantization_config is what from_pretrained
    loads), else as QLoRA quantizes at load (the tuning's, double-quantized)."""
    if model.bnb_4bit_constant_bits is not None:
        return NF4_BITS + model.bnb_4bit_constant_bits
    return assume.qlora_bits_per_param


def frozen_bytes(
    model: ModelSpec, training: TrainingSpec, assume: MemoryAssumptions
) -> tuple[float, float, float]:
    """Bytes per frozen base parameter (LoRA/QLoRA): (a layer Linear weight's storage, every other
    parameter, a layer Linear weight's quantization constants)."""
    # LoRA: the base in the compute dtype (bf16, or fp32 under fp32 and tf32), or in fp32 where it
    # was loaded so (base_dtype fp32: the 16-bit copies autocast makes are activations and buffers,
    # memory.autocast_weight_bytes). QLoRA: NF4 Linears, embeddings, lm_head and norms in bf16. The
    # NF4 weights' double-quantized absmax constants (the rest of qlora_bits_per_param) are not in
    # the parameter's storage but in its quant_state (bitsandbytes Params4bit.quant_state, a Python
    # object): FSDP and ZeRO-3 shard and gather the packed storage, and every rank keeps every
    # constant (``_group_states``).
    other = frozen_dtype_bytes(training)
    if training.method is Method.QLORA:
        return NF4_BITS / 8, other, (qlora_bits_per_weight(model, assume) - NF4_BITS) / 8
    return other, other, 0.0


def experts_stay_16_bit(model: ModelSpec, layout: Layout) -> bool:
    """Whether QLoRA leaves the routed experts in the compute dtype: fused expert parameters, which
    bitsandbytes does not quantize (it quantizes nn.Linear modules; only Llama 4's fused experts are
    patched to be, and only from a checkpoint already in bitsandbytes 4-bit: ``fused_experts``,
    _QUANTIZED_FUSED_EXPERTS)."""
    patched = model.family in _QUANTIZED_FUSED_EXPERTS and model.bnb_4bit_checkpoint
    return fused_experts(model, layout) and not patched


def quantized_weights(model: ModelSpec, layout: Layout, training: TrainingSpec, rp: RankParameters) -> float:
    """The rank's Linear weights QLoRA keeps in NF4: every decoder-layer Linear but routed experts
    that stay 16-bit (``experts_stay_16_bit``); 0 but under QLoRA."""
    if training.method is not Method.QLORA:
        return 0.0
    return rp.linear - rp.expert if experts_stay_16_bit(model, layout) else rp.linear


def layer_quantized_weights(
    model: ModelSpec, layout: Layout, training: TrainingSpec, rp: RankParameters
) -> float:
    """``quantized_weights`` of the largest decoder layer (``RankParameters.layer``)."""
    if training.method is not Method.QLORA:
        return 0.0
    return rp.layer_linear - rp.layer_experts if experts_stay_16_bit(model, layout) else rp.layer_linear


def gathered_weight_bytes(sb: StateBytes, params: float, quantized: float) -> float:
    """Bytes of ``params`` parameters as FSDP or ZeRO-3 gathers them for compute: 16-bit copies
    (``sb.weights``), but the ``quantized`` NF4 weights among them (QLoRA), whose packed storage is
    what is sharded and gathered, their constants staying where they are (``frozen_bytes``)."""
    return (params - quantized) * sb.weights + quantized * NF4_BITS / 8


# ---------------------------------------------------------------- parameters on a rank


def tp_duplicated_per_layer(model: ModelSpec, layout: Layout) -> float:
    """Attention parameters per layer a TP rank holds beyond its 1/tp share: Megatron keeps MLA's
    down-projections whole on every TP rank (``params.mla_down_parameters``; an MoE review: DeepSeek-V3
    at tp 4 was 2.6 GiB light); elsewhere attention splits whole."""
    if layout.tp == 1 or layout.framework is not Framework.MEGATRON:
        return 0.0
    return mla_down_parameters(model) * (1 - 1 / layout.tp)


def rank_parameters(
    model: ModelSpec,
    counts: ParameterCounts,
    layout: Layout,
    rank: int,
    layers: tuple[tuple[LayerKind, int], ...],
    mtp_layers: int = 0,
) -> RankParameters:
    """Parameters held by pipeline rank ``rank``, whose decoder layers are ``layers`` (how many of
    each kind: MoE or not; the last rank's include its ``mtp_layers`` multi-token-prediction layers),
    after tp and ep (Megatron split: embedding first, head last)."""
    p, t, e, et = layout.pp, layout.tp, layout.ep, layout.expert_tp
    moe_layers = sum(count for kind, count in layers if kind.moe)
    held = sum(count for _, count in layers)
    attention = counts.attention_per_layer * held
    mlp = counts.dense_mlp_per_layer * (held - moe_layers) + counts.shared_experts_per_moe_layer * moe_layers
    replicated = counts.norms_per_layer * held + counts.router_per_moe_layer * moe_layers
    expert = counts.experts_per_moe_layer * moe_layers / (et * e)
    # what each TP rank holds whole of the attention it would otherwise split (Megatron's MLA)
    duplicated = tp_duplicated_per_layer(model, layout)
    dense = (attention + mlp) / t + replicated + held * duplicated
    # With pp > 1 and tied embeddings the last stage keeps its own copy of the word embedding.
    head = counts.output or (model.vocab_size * model.hidden_size if p > 1 else 0)
    if rank == 0:
        # DeepSpeed's AutoTP may leave the embedding whole on every rank (params.autotp_keeps_vocab_whole)
        dense += counts.embedding / (1 if autotp_keeps_vocab_whole(model, layout) else t)
    if rank == p - 1:
        dense += counts.final_norm + head / t
    if rank == p - 1 and mtp_layers:
        # each depth's eh_proj (column-parallel) and norms; the shifted tokens' embedding copy
        dense += mtp_layers * (mtp_projection_parameters(model) / t + MTP_NORMS * counts.final_norm)
        if p > 1 and counts.output:
            dense += counts.embedding / t
    # the largest layer: its Linear weights (attention, MLP or shared and routed experts), then the
    # norms and the router (kept in the compute dtype under QLoRA, as in ``linear``)
    moe_linear = counts.shared_experts_per_moe_layer / t + counts.experts_per_moe_layer / (et * e)
    moe_layer = moe_linear + counts.router_per_moe_layer
    dense_mlp = counts.dense_mlp_per_layer / t if counts.dense_layers else 0
    largest_moe = counts.moe_layers and moe_layer > dense_mlp
    mlp_linear, mlp_all = (moe_linear, moe_layer) if largest_moe else (dense_mlp, dense_mlp)
    layer_linear = counts.attention_per_layer / t + duplicated + mlp_linear
    layer = counts.attention_per_layer / t + duplicated + counts.norms_per_layer + mlp_all
    last_unit = counts.final_norm + (counts.output or model.vocab_size * model.hidden_size) / t
    return RankParameters(
        layers=held,
        moe_layers=moe_layers,
        dense=dense,
        expert=expert,
        linear=(attention + mlp) / t + held * duplicated + expert,
        layer=layer,
        layer_linear=layer_linear,
        layer_experts=counts.experts_per_moe_layer / (et * e) if largest_moe else 0.0,
        last_unit=last_unit,
    )


def lora_parameters(model: ModelSpec, training: TrainingSpec, layout: Layout, rp: RankParameters) -> float:
    """Trainable LoRA parameters on one GPU of a rank: r x (d_in + d_out) per targeted Linear of each
    of its layers (``rp.layers``, ``rp.moe_layers`` of them MoE), and an encoder task head's copy PEFT
    trains (``params.peft_saved_head_parameters``), split over tp."""
    return _adapter_parameters(model, training, layout, rp.layers, rp.moe_layers) / layout.tp


def _adapter_parameters(
    model: ModelSpec, training: TrainingSpec, layout: Layout, layers: int, moe_layers: int
) -> float:
    """LoRA parameters over ``layers`` decoder layers, ``moe_layers`` of them MoE, and an encoder's
    task head, before any tp split (``lora_parameters``)."""
    # (in, out) of each adapter (params.lora_adapter_shapes: a fused module's one, MLA's own modules)
    converted = peft_adapts_fused_experts(model, layout)
    shapes = lora_adapter_shapes(model, module_lora_targets(model, training, layout), model.ffn_hidden_size)
    per_layer: float = sum(fan_in + fan_out for _, fan_in, fan_out in shapes)
    per_layer *= training.lora_rank
    total = layers * per_layer
    if converted:
        total += moe_layers * fused_expert_adapter_parameters(model, training)
    elif model.moe is not None:
        total += moe_layers * _lora_expert_parameters(model, model.moe, training, layout)
    # and an encoder's task head, which PEFT trains in full (encoders run data parallel only: one rank)
    return total + peft_saved_head_parameters(model)


def trains_adapters(model: ModelSpec, training: TrainingSpec, layout: Layout) -> bool:
    """Whether ``training.lora_targets`` give peft any module of the whole model to adapt: peft raises
    NoMatchingPeftModuleError where none matches (GPT-OSS's MLP names: its experts are fused parameters
    peft does not convert, and it has no dense MLP, so the estimate trained nothing; PEFT review)."""
    return _adapter_parameters(model, training, layout, model.num_layers, moe_layer_count(model)) > 0


# Families whose routed experts bitsandbytes quantizes though they are fused parameters (transformers
# quantizers/base.py MODULES_TO_PATCH_FOR_QUANTIZATION: Llama 4's experts only), and only where the
# checkpoint is pre-quantized: HfQuantizer.preprocess_model swaps the modules in `if self.pre_quantized`,
# so a bf16 checkpoint loaded with a BitsAndBytesConfig (what the launch files do) keeps
# Llama4TextExperts' 3-D bf16 parameters (PEFT review: Scout QLoRA on 2 H100s counted ~90 GiB of experts
# per GPU as NF4).
_QUANTIZED_FUSED_EXPERTS = frozenset({"llama4"})


def fused_experts(model: ModelSpec, layout: Layout) -> bool:
    """Whether the routed experts are the fused parameters Hugging Face's model holds: transformers 5
    (the pinned 5.24) keeps each MoE layer's experts as 3-D nn.Parameters (MixtralExperts.gate_up_proj,
    down_proj; the Qwen MoE, DeepSeek and GPT-OSS experts likewise), where from_pretrained builds the
    model, as every PEFT plan at ep 1 does (PEFT with ep > 1 runs only where the framework's expert-
    parallel plan builds expert modules, DeepSpeed's deepspeed.moe.layer.MoE: validate's
    Capabilities.peft_expert_parallel refuses the rest). peft's target_modules match modules, so no
    adapter reaches them; bitsandbytes replaces nn.Linear only, so they stay in the
    compute dtype under QLoRA (fine-tuning review, stop 39: a DeepSeek-V2-Lite QLoRA plan counted
    14.4B NF4 expert parameters that load at 26.8 GiB of bf16)."""
    return model.moe is not None and layout.ep == 1


def peft_adapts_fused_experts(model: ModelSpec, layout: Layout) -> bool:
    """Whether peft moves LoRA's MLP targets onto the fused routed experts (``_PEFT_FUSED_EXPERT_FAMILIES``),
    as it does where the experts are fused parameters (``fused_experts``)."""
    return fused_experts(model, layout) and peft_moves_mlp_targets(model)


def module_lora_targets(model: ModelSpec, training: TrainingSpec, layout: Layout) -> tuple[str, ...]:
    """The targets peft adapts as modules (nn.Linear): ``training.lora_targets`` less the MLP's where
    it moves them onto the fused experts (``peft_adapts_fused_experts``)."""
    if not peft_adapts_fused_experts(model, layout):
        return training.lora_targets
    return tuple(t for t in training.lora_targets if t not in MLP_LINEAR)


def fused_expert_adapted_weights(model: ModelSpec, training: TrainingSpec) -> tuple[float, float]:
    """(weights of one MoE layer's fused experts that carry an adapter, the largest such parameter's):
    gate_up_proj (E x h x 2f_e) where gate and up are targeted, down_proj (E x f_e x h) where down is."""
    assert model.moe is not None
    e, h, f = model.moe.num_experts, model.hidden_size, model.moe.expert_ffn_hidden_size
    targets = set(training.lora_targets)
    gate_up = e * h * 2 * f if {"gate_proj", "up_proj"} <= targets else 0
    down = e * f * h if "down_proj" in targets else 0
    return float(gate_up + down), float(max(gate_up, down))


def fused_expert_adapter_parameters(model: ModelSpec, training: TrainingSpec) -> float:
    """LoRA parameters on one MoE layer's fused experts (``peft_adapts_fused_experts``): lora_A
    (in x rE) and lora_B (rE x out) per adapted parameter, the rank doubled on gate_up_proj."""
    assert model.moe is not None
    moe, h, r = model.moe, model.hidden_size, training.lora_rank
    f, e = moe.expert_ffn_hidden_size, moe.num_experts
    targets = set(training.lora_targets)
    gate_up = 2 * r * e * (h + 2 * f) if {"gate_proj", "up_proj"} <= targets else 0
    down = r * e * (f + h) if "down_proj" in targets else 0
    return float(gate_up + down)


def lora_expert_parameters(
    model: ModelSpec, training: TrainingSpec, layout: Layout, rp: RankParameters
) -> float:
    """Of ``lora_parameters``, the adapters of the local routed experts (E/ep per MoE layer): they
    live in the expert modules, so ZeRO/FSDP shard them with the experts, over expert-DP. Fused
    experts carry peft's ParamWrapper adapters where it moves the MLP targets onto them
    (``peft_adapts_fused_experts``), else none."""
    if peft_adapts_fused_experts(model, layout):
        return rp.moe_layers * fused_expert_adapter_parameters(model, training) / layout.tp
    if model.moe is None or fused_experts(model, layout):
        return 0.0
    targets = _lora_mlp_targets(model, training)
    per_layer = (
        model.moe.num_experts
        / layout.ep
        * len(targets)
        * (model.hidden_size + model.moe.expert_ffn_hidden_size)
    )
    return rp.moe_layers * per_layer * training.lora_rank / layout.tp


def layer_linears(model: ModelSpec) -> tuple[str, ...]:
    """The decoder layer's Linear modules by their Hugging Face names: q, k, v, o and the MLP's
    (gate,) up and down (a plain MLP has no gate_proj)."""
    return tuple(name for name in ALL_LINEAR if name != "gate_proj" or model.mlp.gated)


def adapted_linears(model: ModelSpec, training: TrainingSpec) -> tuple[str, ...]:
    """Of ``training.lora_targets``, the Linears the model's layers have (``layer_linears``)."""
    present = layer_linears(model)
    return tuple(name for name in training.lora_targets if name in present)


def _lora_mlp_targets(model: ModelSpec, training: TrainingSpec) -> list[str]:
    return [n for n in adapted_linears(model, training) if n in MLP_LINEAR]


def _lora_expert_parameters(model: ModelSpec, moe: MoESpec, training: TrainingSpec, layout: Layout) -> float:
    # MLP targets on an MoE layer adapt every local routed expert (E/ep of them, width f_e) instead
    # of the dense MLP (width f): the difference per MoE layer. Fused experts (``fused_experts``) take
    # none: the layer's MLP adapters are its shared experts' (nn.Linear modules) alone.
    mlp_targets = _lora_mlp_targets(model, training)
    h = model.hidden_size
    dense = len(mlp_targets) * (h + model.ffn_hidden_size) * training.lora_rank
    if fused_experts(model, layout):
        shared = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size
        return (len(mlp_targets) * (h + shared) * training.lora_rank if shared else 0.0) - dense
    experts = (
        moe.num_experts / layout.ep * len(mlp_targets) * (h + moe.expert_ffn_hidden_size) * training.lora_rank
    )
    return experts - dense


# The layout fields the sharding groups are of (``hsdp_replicas``, ``shard_degrees``): every memoised
# part that reads those groups is keyed on all of them, here, once.
SHARD_GROUP_FIELDS = ("framework", "dp", "cp", "tp", "ep", "etp", "fsdp_hybrid_shard", "dp_replicate")


def hsdp_replicas(layout: Layout, cluster: ClusterSpec) -> int:
    """HSDP's replicas of each shard group: FSDP HYBRID_SHARD shards the dp x cp ranks of a pipeline
    stage inside a node (the GPUs left after tp there), or in ``dp_replicate`` groups where the layout
    says, and replicates the shards across them (torchtitan
    --parallelism.data_parallel_replicate_degree, Accelerate's dp_replicate_size; FSDP shards over
    dp_shard x cp: parallel_dims.py's "dp_shard_cp" mesh); 1 without it. Whole by
    ``validate.hybrid_shard_violation``."""
    if not (layout.fsdp_hybrid_shard and layout.framework is Framework.FSDP):
        return 1
    if layout.dp_replicate is not None:
        return layout.dp_replicate
    return max(1, layout.dp * layout.cp // max(1, cluster.gpus_per_node // layout.tp))


# DeepSpeed ZeRO-Infinity's parameter swap buffers (runtime/zero/offload_config.py
# DeepSpeedZeroOffloadParamConfig: buffer_size 1e8 elements, buffer_count 5): a parameter's shard
# swaps in through one, and AsyncPartitionedParameterSwapper.get_buffer asserts it fits ("More
# elements ... than buffer size").
DS_PARAM_SWAP_BUFFER_ELEMENTS = 100_000_000
# ... pinned in the weights' dtype, this many of them (swap_tensor/partitioned_param_swapper.py
# AsyncPartitionedParameterSwapper); the launcher writes neither count
DS_PARAM_SWAP_BUFFERS = 5
# ZeRO-Infinity's optimizer swapper: buffer_count pinned buffers of the largest sub-group's partition in
# the master's fp32 (swap_tensor/optimizer_utils.py OptimizerSwapper: SwapBufferManager(num_elems=
# largest_numel, count=swap_config.buffer_count); zero/offload_config.py buffer_count default 4)
DS_OPTIMIZER_SWAP_BUFFERS = 4


def deepspeed_param_swap_buffer_elements(model: ModelSpec, layout: Layout, cluster: ClusterSpec) -> int:
    """offload_param.buffer_size for NVMe parameter offload: DeepSpeed's default, or the largest
    module's ZeRO-3 shard (``largest_module_parameters`` over the dense shard group, rounded up) where
    that is larger: Llama 3.1 405B's embedding over 16 ranks is 131,334,144 elements."""
    shard = shard_degrees(layout, cluster)[0]
    return max(DS_PARAM_SWAP_BUFFER_ELEMENTS, -(-largest_module_parameters(model) // shard))


def shard_degrees(layout: Layout, cluster: ClusterSpec) -> tuple[int, int]:
    """ZeRO/FSDP sharding group sizes: (dense parameters, routed experts)."""
    # ZeRO and Megatron's distributed optimizer shard over dp x cp, HSDP over one replica of them.
    # Experts shard over expert-DP = tp x dp x cp / (etp x ep) (Megatron's expert grid; dp x cp / ep
    # with etp = tp).
    dense = layout.dp * layout.cp // hsdp_replicas(layout, cluster)
    return dense, max(1, dense * layout.tp // (layout.expert_tp * layout.ep))


# ---------------------------------------------------------------- model states


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelStates:
    """Persistent per-GPU bytes of the model states, and what went to host memory or NVMe."""

    parameters: float
    gradients: float
    optimizer_states: float
    host_bytes: float = 0.0
    nvme_bytes: float = 0.0

    @classmethod
    def of(cls, totals: tuple[float, float, float, float, float]) -> ModelStates:
        """From ``rank_model_states``' (parameters, gradients, optimizer states, host, NVMe) bytes."""
        parameters, gradients, optimizer_states, host, nvme = totals
        return cls(
            parameters=parameters,
            gradients=gradients,
            optimizer_states=optimizer_states,
            host_bytes=host,
            nvme_bytes=nvme,
        )


def _divisors(layout: Layout, shard: int, bf16_optimizer: bool) -> tuple[int, int, int]:
    # (weights, gradients, optimizer) divisors. ZeRO-1 shards the optimizer, ZeRO-2 also the
    # gradients, ZeRO-3 also the weights. FSDP has no optimizer-only stage: SHARD_GRAD_OP (2)
    # already shards the fp32 parameters, gradients and optimizer. DeepSpeed's BF16_Optimizer
    # (``deepspeed_bf16_optimizer``) shards the optimizer at ZeRO-0.
    stage = layout.zero_stage
    if layout.framework is Framework.FSDP:
        sharded = shard if stage >= 2 else 1
        return sharded, sharded, sharded
    optimizer = shard if stage >= 1 or bf16_optimizer else 1
    return (shard if stage >= 3 else 1), (shard if stage >= 2 else 1), optimizer


# (parameters, gradients, optimizer states) and those + (host, NVMe) bytes: plain tuples, since
# rank_model_states runs for every sharding a search considers and ModelStates is a frozen dataclass
_States = tuple[float, float, float]
_OffloadedStates = tuple[float, float, float, float, float]


def _group_states(
    count: float,
    frozen: float,
    frozen_bytes_per: float,
    sb: StateBytes,
    layout: Layout,
    shard: int,
    whole_bytes: float = 0.0,
) -> _States:
    """Model states of ``count`` trainable and ``frozen`` frozen parameters sharded over ``shard``
    ranks, and ``whole_bytes`` no sharding splits (QLoRA's constants: ``frozen_bytes``)."""
    w_div, g_div, o_div = _divisors(layout, shard, sb.sharded_optimizer_at_zero0)
    if layout.framework is Framework.FSDP:
        # The sharded parameter is the fp32 master (mixed) or the weights themselves. The 16-bit
        # copies gathered for compute are buffers (memory.gathered_parameter_bytes), not states.
        params = (count * fsdp_parameter_bytes(sb) + frozen * frozen_bytes_per) / w_div + whole_bytes
        return params, count * sb.gradients / g_div, count * sb.moments / o_div
    return (
        (count * sb.weights + frozen * frozen_bytes_per) / w_div + whole_bytes,
        count * sb.gradients / g_div,
        count * (sb.master + sb.moments) / o_div,
    )


def _offloaded(
    states: _States, count: float, layout: Layout, shard: int, assume: MemoryAssumptions, whole_bytes: float
) -> _OffloadedStates:
    # ZeRO-Offload/Infinity and FSDP CPUOffload: the optimizer (fp32 master + moments; FSDP's
    # master is its offloaded parameter) steps on the host from an fp32 gradient copy; DeepSpeed
    # and FSDP stream gradients out as they are reduced, while Megatron's CPU optimizer keeps its
    # main-grad buffer on the GPU. Offloaded parameters (ZeRO-3 / FULL_SHARD only) leave whole, but
    # for ``whole_bytes``: QLoRA's quantization constants are a bitsandbytes quant_state beside each
    # NF4 parameter, not a parameter ZeRO-3 or FSDP partitions or moves, so they stay on the GPU.
    host = nvme = 0.0
    params, grads, optim = states
    if layout.offload_optimizer is not Offload.NONE:
        fp32_gradients = count * assume.cpu_adam_grad_bytes / shard
        if layout.offload_optimizer is Offload.NVME:
            # ZeRO-Infinity swaps the fp32 gradients out with the states they update (stage3.py
            # _swap_out_offload_fp32_gradients), a sub-group at a time in through host buffers
            # (memory.deepspeed_offload_host_bytes)
            nvme += optim + fp32_gradients
        else:
            host += optim + fp32_gradients
        optim = 0.0
        if not _gradients_stay_on_gpu(layout):
            grads = 0.0
    if layout.offload_params is Offload.CPU:
        host, params = host + params - whole_bytes, whole_bytes
    elif layout.offload_params is Offload.NVME:
        nvme, params = nvme + params - whole_bytes, whole_bytes
    return params, grads, optim, host, nvme


def _gradients_stay_on_gpu(layout: Layout) -> bool:
    """Whether the 16-bit gradients stay on the GPU under optimizer offload: Megatron's CPU optimizer
    keeps its main-grad buffer there; DeepSpeed's ZeRO-1 reduces (and hands the CPU optimizer) its
    gradients only at the accumulation boundary, keeping them in param.grad until then
    (stage_1_and_2.py ``reduce_ready_partitions_and_remove_grads``: ``partition_gradients or
    is_gradient_accumulation_boundary()``), as its time is modelled (one reduction a step). ZeRO-2/3
    and FSDP stream each gradient out as it is reduced."""
    if layout.framework is Framework.MEGATRON:
        return True
    return layout.framework is Framework.DEEPSPEED and layout.zero_stage == 1


# (trainable parameters, frozen parameters, bytes per frozen parameter, shard degree, frozen bytes every
# rank keeps whole) of one group
_Group = tuple[float, float, float, int, float]


def _state_groups(
    model: ModelSpec,
    layout: Layout,
    training: TrainingSpec,
    rp: RankParameters,
    shards: tuple[int, int],
    assume: MemoryAssumptions,
) -> list[_Group]:
    # Full training: dense parameters sharded over dp x cp, routed experts over expert-DP. LoRA/QLoRA:
    # the adapters train, the whole base is frozen (NF4 Linear weights under QLoRA), each part
    # sharded over the same group as in full training: a frozen expert is still an expert
    # parameter (DeepSpeed's MoE groups, FSDP's expert mesh), so the frozen base's bytes per GPU
    # depend on the method only through its dtype (issue 24: the experts, already split over ep,
    # were divided by the dense group again).
    dense_shard, expert_shard = shards
    if training.method is Method.FULL:
        return [(rp.dense, 0.0, 0.0, dense_shard, 0.0), (rp.expert, 0.0, 0.0, expert_shard, 0.0)]
    linear_bytes, other_bytes, constant_bytes = frozen_bytes(model, training, assume)
    dense_linear = rp.linear - rp.expert  # routed experts are Linear weights only
    dense_frozen = dense_linear * linear_bytes + (rp.dense - dense_linear) * other_bytes
    adapters = lora_parameters(model, training, layout, rp)
    expert_adapters = lora_expert_parameters(model, training, layout, rp)
    per_dense = dense_frozen / rp.dense if rp.dense else 0.0
    groups = [(adapters - expert_adapters, rp.dense, per_dense, dense_shard, dense_linear * constant_bytes)]
    if rp.expert:
        # fused experts stay in the compute dtype under QLoRA (``fused_experts``): bitsandbytes
        # quantizes nn.Linear modules, and only Llama 4's fused experts are patched to be
        quantized = 0.0 if experts_stay_16_bit(model, layout) else rp.expert
        expert_bytes = linear_bytes if quantized else other_bytes
        groups.append((expert_adapters, rp.expert, expert_bytes, expert_shard, quantized * constant_bytes))
    return groups


def rank_model_states(
    model: ModelSpec,
    layout: Layout,
    training: TrainingSpec,
    rp: RankParameters,
    sb: StateBytes,
    shards: tuple[int, int],
    assume: MemoryAssumptions,
) -> _OffloadedStates:
    """Weights, gradients and optimizer states of one pipeline rank after sharding and offload, and
    what went to host memory or NVMe, from its parameters, the bytes per parameter and the shard
    degrees (``rank_parameters``, ``state_bytes``, ``shard_degrees``); ``ModelStates.of`` makes the
    record (the search's lean check sums them for every sharding it bounds, without one)."""
    parameters = gradients = optimizer_states = host = nvme = 0.0
    for count, frozen_count, per_frozen, shard, whole in _state_groups(
        model, layout, training, rp, shards, assume
    ):
        group = _group_states(count, frozen_count, per_frozen, sb, layout, shard, whole)
        group_params, group_grads, group_optim, group_host, group_nvme = _offloaded(
            group, count, layout, shard, assume, whole
        )
        parameters += group_params
        gradients += group_grads
        optimizer_states += group_optim
        host += group_host
        nvme += group_nvme
    if layout.optimizer_in_backward:
        # Each parameter steps as soon as its gradient is ready and the gradient is freed (torchtune
        # optimizer_in_bwd: a post-accumulate-grad hook per parameter; under FSDP2 on the sharded
        # gradient after the unit's reduce-scatter): no gradient outlives its unit, and the unit in
        # flight is counted with the gathered buffers (memory.gathered_parameter_bytes).
        gradients = 0.0
    if (
        training.precision is Precision.FP8
        and layout.zero_stage < 3
        and layout.framework is not Framework.FSDP
        and not megatron_fp8_params(layout, training.precision)
    ):
        # Transformer Engine caches an fp8 copy of each GEMM weight and of its transpose (1 + 1
        # bytes) across micro-batches; under ZeRO-3/FULL_SHARD they are per-layer temporaries. With
        # Megatron's --fp8-param-gather the GEMM weights are fp8 tensors themselves (TE
        # fp8_model_init: 1 B of data + 1 B of transpose on Hopper), counted as the 2-byte weights
        # above: no bf16 copy, no cache. FSDP's fp8 is torchao's Float8Linear (torchtitan's float8
        # converter), which keeps no cache: it casts the weight in every forward
        # (torchao/float8/float8_linear.py Float8Linear.forward, dynamic scaling) and saves the cast
        # for that micro-batch's backward only, a per-layer temporary under activation checkpointing.
        parameters += 2 * rp.linear
    return parameters, gradients, optimizer_states, host, nvme
