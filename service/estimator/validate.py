"""Cross-checks of a layout against the model, the cluster, the training setup and the framework.

``validate_layout`` raises ``InvalidLayout`` (with the numbers, a ``rule`` slug and the ``field``)
for the first rule broken. What each framework supports is data, in ``FRAMEWORK_CAPABILITIES``.

Choices made here:
* A switch that changes nothing in the layout is refused, not accepted as a no-op
  (``unused_switch_violation``): ``sequence_parallel`` with tp = 1 (Megatron-LM's ``validate_args``
  would turn it off), ``tp_comm_overlap`` without tp > 1 and SP or on DeepSpeed, ``overlap_grad_reduce``
  with no data-parallel reduction, the pipeline-split flags without a pipeline,
  ``fsdp_hybrid_shard`` when the sharding group already fits in a node, ``grad_reduce_in_fp32``
  outside Megatron's bf16/fp8 training, ``fp8_param_gather`` outside Megatron's fp8 training and
  ``precision_aware_optimizer`` outside Megatron.
* ``tp_comm_overlap`` on FSDP is torchtitan's Async TP, an inductor pass: it needs ``torch_compile``
  (``tp_comm_overlap_compile_violation``).
* The vocabulary needs no rule: Megatron pads it to a multiple of 128 x tp
  (``--make-vocab-size-divisible-by``), DTensor (torchtitan, DeepSpeed AutoTP) shards unevenly.
* With context parallelism the sequence must split into 2 x cp chunks where it is a ring (Megatron's
  and PyTorch's load-balanced causal ring give each rank one early and one late chunk), into cp
  where it is DeepSpeed-Ulysses; under sequence parallelism each rank's seq_len / cp tokens split
  over tp (``sequence_divisor``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from types import MappingProxyType

from service.estimator import model_states, params, pipeline
from service.estimator.defaults import FLASH_MAX_HEAD_DIM, flash_refuses_dropout
from service.estimator.errors import InvalidLayout, InvalidTraining
from service.estimator.types import (
    MLP_LINEAR,
    Attention,
    AttentionKind,
    ClusterSpec,
    Compile,
    Framework,
    GPUSpec,
    Head,
    Layout,
    Method,
    ModelSpec,
    MoeDispatcher,
    Offload,
    Optimizer,
    OptimizerImplementation,
    PositionEmbedding,
    Precision,
    Recompute,
    RecomputeModule,
    TrainingSpec,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    zero_stages: frozenset[int]
    max_zero_stage_with_pp: int  # highest zero_stage allowed together with pp > 1
    max_zero_stage_with_ep: int  # highest zero_stage allowed together with ep > 1
    offload_devices: frozenset[Offload]  # where optimizer/params may be offloaded (NONE always ok)
    param_offload: bool
    interleaved_pipeline: bool
    peft: bool  # LoRA / QLoRA adapters at all
    # LoRA / QLoRA with ep > 1: a launcher runs the framework's PEFT with expert parallelism (DeepSpeed's
    # EP plan builds expert modules, whose Linears take adapters); fsdp's PEFT runs under Accelerate /
    # the HF Trainer, which have no EP, and its EP is torchtitan's, which has no PEFT
    peft_expert_parallel: bool
    optimizer_in_backward: bool
    activation_offload_needs_full_recompute: bool
    recompute_modes: frozenset[Recompute]  # the recompute policies the framework has
    partial_recompute: bool  # recompute_num_layers (only some layers of each stage)
    layer_interval_recompute: bool  # recompute_every_n_layers (every N-th layer)
    torch_compile: str | None  # why the framework's compiled run is not modelled; None: it is
    hybrid_shard: bool  # fsdp_hybrid_shard: shard inside a node, replicate across nodes (HSDP)
    offload_together: bool  # offload moves params, grads and the optimizer step together
    tp_comm_overlap: bool  # TP communication overlapped with the GEMMs (needs SP)
    tp_comm_overlap_needs_compile: bool  # the overlap is a torch.compile (inductor) graph pass
    expert_tensor_parallel: bool  # etp: routed experts split over other ranks than tp
    moe_a2a_overlap: bool  # EP all-to-alls under another micro-batch's compute
    flex_dispatcher: bool  # moe_dispatcher flex: Megatron-Core's flex token dispatcher (HybridEP)
    multi_token_prediction: bool  # trains the MTP modules (mtp_num_layers)
    ulysses_context_parallel: bool  # cp splits the heads (DeepSpeed-Ulysses), not ring attention
    fp32_base_under_autocast: bool  # a LoRA base left in fp32 while 16-bit autocast computes
    torch_optimizer: bool  # the step is torch.optim's (optimizer_implementation picks its path)
    optimizers: frozenset[Optimizer]  # the optimizers it trains with
    offloaded_optimizers: frozenset[Optimizer]  # those whose step it runs on the host (offload_optimizer)
    nvme_optimizer_needs_stage_3: bool  # optimizer states swap to NVMe under ZeRO-3 only
    source: str


FRAMEWORK_CAPABILITIES: MappingProxyType[Framework, Capabilities] = MappingProxyType(
    {
        Framework.DEEPSPEED: Capabilities(
            zero_stages=frozenset({0, 1, 2, 3}),
            # deepspeed/runtime/pipe/engine.py: assert zero_optimization_stage() < ZeroStageEnum.gradients,
            # "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism".
            max_zero_stage_with_pp=1,
            # expert parallelism builds DeepSpeed's native MoE layers (deepspeed.moe.layer.MoE), which its
            # engine refuses under stage 3 (runtime/engine.py _validate_zero3_moe_compatibility: "Native
            # DeepSpeed MoE is not supported with ZeRO Stage 3"); an estimate of it timed a job that
            # cannot start (MoE review)
            max_zero_stage_with_ep=2,
            # ZeRO-Offload (CPU) and ZeRO-Infinity (NVMe); zero/config.py: offload_param "Valid only
            # with stage 3", offload_optimizer "Valid for ZeRO stage 1, 2, 3".
            offload_devices=frozenset({Offload.CPU, Offload.NVME}),
            param_offload=True,
            interleaved_pipeline=False,  # PipelineEngine runs plain 1F1B (TrainSchedule)
            peft=True,  # Hugging Face PEFT under DeepSpeed (Trainer, accelerate)
            peft_expert_parallel=True,  # its EP plan's deepspeed.moe.layer.MoE over expert modules
            optimizer_in_backward=False,
            # activation_checkpointing.cpu_checkpointing offloads the checkpoints of deepspeed.checkpointing
            # (model code that calls it; no launch target here does: launchers.common
            # .activation_offload_refusal).
            activation_offload_needs_full_recompute=True,
            # deepspeed.checkpointing / HF gradient checkpointing wrap whole decoder layers
            recompute_modes=frozenset({Recompute.NONE, Recompute.FULL}),
            partial_recompute=False,
            layer_interval_recompute=False,
            torch_compile="DeepSpeed's compiled engine (engine.compile, DeepCompile) rewrites ZeRO's "
            "collectives into the graph: not modelled",
            hybrid_shard=False,  # ZeRO++ hpZ is a secondary partition, not modelled
            offload_together=False,
            tp_comm_overlap=False,
            tp_comm_overlap_needs_compile=False,
            expert_tensor_parallel=False,  # deepspeed.moe splits experts over tp (or not at all)
            moe_a2a_overlap=False,
            flex_dispatcher=False,  # deepspeed.moe's dispatch is its own all-to-all
            multi_token_prediction=False,  # transformers' DeepseekV3ForCausalLM drops the MTP modules
            ulysses_context_parallel=True,  # DeepSpeed-Ulysses' all-to-all over the heads
            # runtime/engine.py _configure_distributed_model: module.bfloat16() / .half() under its
            # bf16 / fp16 config, whatever dtype the model was loaded in
            fp32_base_under_autocast=False,
            # the rendered ds_config's optimizer block: DeepSpeed builds FusedAdam (DeepSpeedCPUAdam
            # under offload) itself (runtime/engine.py _configure_basic_optimizer)
            torch_optimizer=False,
            # any optimizer the script hands deepspeed.initialize (at ZeRO >= 1 ds_config allows it as
            # untested: launchers.deepspeed.ds_config); under ZeRO-Offload only those with
            # a host kernel (runtime/engine.py _configure_optimizer: a client optimizer other than
            # DeepSpeedCPUAdam / DeepSpeedCPULion raises ZeRORuntimeException while
            # zero_force_ds_cpu_optimizer, default true, holds)
            optimizers=frozenset(Optimizer),
            offloaded_optimizers=frozenset({Optimizer.ADAMW, Optimizer.LION}),
            # docs config-json "Optimizer offloading": "NVMe offloading is available only with ZeRO
            # stage 3"; stage_1_and_2.py treats any offload device as cpu_offload
            nvme_optimizer_needs_stage_3=True,
            source="deepspeedai/DeepSpeed runtime/zero/config.py, runtime/pipe/engine.py",
        ),
        Framework.MEGATRON: Capabilities(
            # Megatron-LM: DDP (0) or --use-distributed-optimizer (1); no gradient/param sharding.
            zero_stages=frozenset({0, 1}),
            max_zero_stage_with_pp=1,
            max_zero_stage_with_ep=1,
            # --optimizer-cpu-offload (with the distributed optimizer); no parameter offload.
            offload_devices=frozenset({Offload.CPU}),
            param_offload=False,
            interleaved_pipeline=True,  # --num-layers-per-virtual-pipeline-stage
            peft=False,  # no PEFT in Megatron-LM itself (NeMo / Megatron-Bridge add it)
            peft_expert_parallel=False,
            optimizer_in_backward=False,
            activation_offload_needs_full_recompute=False,
            # --recompute-granularity selective|full, --recompute-method block --recompute-num-layers
            recompute_modes=frozenset({Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL}),
            partial_recompute=True,
            layer_interval_recompute=False,  # --recompute-method uniform groups layers, skips none
            torch_compile="Megatron-LM has no torch.compile switch: its fused kernels are Transformer "
            "Engine's, already modelled",
            hybrid_shard=False,
            offload_together=False,
            tp_comm_overlap=True,  # --tp-comm-overlap
            tp_comm_overlap_needs_compile=False,  # Transformer Engine's userbuffers, eager
            expert_tensor_parallel=True,  # --expert-tensor-parallel-size
            moe_a2a_overlap=True,  # --overlap-moe-expert-parallel-comm
            flex_dispatcher=True,  # --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend
            multi_token_prediction=True,  # Megatron-Core --mtp-num-layers
            ulysses_context_parallel=False,  # ring attention (--context-parallel-size)
            fp32_base_under_autocast=False,  # no PEFT
            # megatron/core/optimizer: Transformer Engine's FusedAdam (apex's without TE)
            torch_optimizer=False,
            # --optimizer choices adam, sgd, muon, lion, soap, ...: no 8-bit AdamW or Adafactor;
            # --optimizer-cpu-offload goes with --use-precision-aware-optimizer, which OptimizerConfig
            # asserts is "only supported with adam" (optimizer_config.py): SGD or Lion offloaded does not
            # start (Megatron review: the launch file was rendered and the estimate said nothing)
            optimizers=frozenset({Optimizer.ADAMW, Optimizer.SGD, Optimizer.LION}),
            offloaded_optimizers=frozenset({Optimizer.ADAMW}),
            nvme_optimizer_needs_stage_3=False,  # no NVMe offload at all (offload_devices)
            source="NVIDIA/Megatron-LM megatron/training/arguments.py validate_args",
        ),
        Framework.FSDP: Capabilities(
            # NO_SHARD (0), SHARD_GRAD_OP (2), FULL_SHARD (3); no optimizer-only stage.
            zero_stages=frozenset({0, 2, 3}),
            max_zero_stage_with_pp=3,  # torchtitan composes FSDP with PP and TP (2D/3D)
            max_zero_stage_with_ep=3,  # torchtitan shards the experts with FSDP over expert-DP
            # CPUOffload(offload_params=True) moves params, grads and the optimizer step together.
            offload_devices=frozenset({Offload.CPU}),
            param_offload=True,
            interleaved_pipeline=True,  # torchtitan Interleaved1F1B
            peft=True,  # Hugging Face PEFT under FSDP (Trainer, accelerate); torchtitan has none
            peft_expert_parallel=False,  # Accelerate's and the Trainer's FSDP have no EP
            optimizer_in_backward=True,  # torchtune optimizer_in_bwd
            activation_offload_needs_full_recompute=False,
            # torchtitan activation_checkpoint full | selective (per op); accelerate/HF: whole layers
            recompute_modes=frozenset({Recompute.NONE, Recompute.SELECTIVE_OP, Recompute.FULL}),
            partial_recompute=False,
            # torchtitan up to 0.2: activation_checkpoint.mode selective, selective_ac_option N
            layer_interval_recompute=True,
            torch_compile=None,  # torchtitan --compile.enable; HF Trainer / accelerate over FSDP
            hybrid_shard=True,  # HYBRID_SHARD; torchtitan data_parallel_replicate_degree
            offload_together=True,  # CPUOffload / CPUOffloadPolicy
            # torchtitan Async TP (0.3.0 --compile.enable_async_tensor_parallel; up to 0.2
            # parallelism.enable_async_tensor_parallel): inductor's micro-pipelined
            # fused_all_gather_matmul / fused_matmul_reduce_scatter over SymmetricMemory, the same
            # tp-chunked GEMM/communication pipeline as Transformer Engine's userbuffers
            tp_comm_overlap=True,
            # CompileConfig.__post_init__: "Async TP requires 'model' in --compile.components and
            # --compile.enable" (torch._inductor.config._micro_pipeline_tp rewrites the compiled graph)
            tp_comm_overlap_needs_compile=True,
            expert_tensor_parallel=False,  # torchtitan 0.3's experts are tensor-parallel over tp
            moe_a2a_overlap=False,
            flex_dispatcher=False,  # torchtitan's MoE and Hugging Face's expert loop have no such dispatcher
            multi_token_prediction=False,  # torchtitan builds no MTP modules
            ulysses_context_parallel=False,  # ring attention (context_parallel_degree)
            # HF Trainer bf16=True / fp16=True: torch.autocast over the model as loaded (DDP), or
            # FSDP's MixedPrecision casting its fp32 shards to param_dtype before each all-gather
            fp32_base_under_autocast=True,
            torch_optimizer=True,  # torch.optim over the (sharded) parameters
            # whatever optimizer the script builds over the (sharded) parameters; CPUOffload steps it on
            # the host copies
            optimizers=frozenset(Optimizer),
            offloaded_optimizers=frozenset(Optimizer),
            nvme_optimizer_needs_stage_3=False,  # no NVMe offload at all (offload_devices)
            source="pytorch FSDP docs (ShardingStrategy, CPUOffload), torchtitan parallel_dims, torchtune",
        ),
    }
)


Violation = InvalidLayout | None


def _having(capability: str) -> str:
    """The frameworks that have a capability, for a message ("megatron")."""
    return " or ".join(f.value for f, caps in FRAMEWORK_CAPABILITIES.items() if getattr(caps, capability))


def _bad(
    message: str,
    rule: str,
    field: str,
    *,
    limit: int | None = None,
    allowed: tuple[str | int, ...] | None = None,
) -> InvalidLayout:
    """The refusal of ``field`` by ``rule``, with the bound (``limit``) or the values it admits
    (``allowed``) where the rule has one: the answer's error entry carries them as the schema's
    bounds do (a review of the ordinary requests: the text said "allows at most 2", the entry not)."""
    return InvalidLayout(message, rule=rule, field=field, limit=limit, allowed=allowed)


def world_violation(cluster: ClusterSpec, layout: Layout) -> Violation:
    if layout.world_size != cluster.world_size:
        part, used, per_node = "", layout.world_size, cluster.gpus_per_node
        if used < cluster.world_size and (used <= per_node or used % per_node == 0):
            # a plan that fits on fewer GPUs (fewest_gpus, cost) recommends a layout on part of the
            # cluster, whole nodes or part of one: its numbers are those of a cluster of that many
            nodes, per_node = (1, used) if used <= per_node else (used // per_node, per_node)
            part = (
                f"; a layout for {used} of its GPUs (as a plan on part of the cluster recommends) is "
                f"estimated on a cluster of them: num_nodes {nodes}, gpus_per_node {per_node}"
            )
        return _bad(
            f"dp*tp*pp*cp = {layout.dp}*{layout.tp}*{layout.pp}*{layout.cp} = {layout.world_size} "
            f"!= world size ({cluster.num_nodes} nodes x {cluster.gpus_per_node} GPUs "
            f"= {cluster.world_size}){part}",
            "world_size",
            "dp",
        )
    return None


def encoder_split_problem(model: ModelSpec, tp: int, pp: int, cp: int) -> str | None:
    """Why an encoder (``ModelSpec.bidirectional``) cannot be split this way, or None: data
    parallelism only. Every target that trains one loads it with transformers: BertConfig /
    RobertaConfig declare no base_model_tp_plan (from_pretrained(tp_plan='auto') has nothing to shard
    by), Accelerate's context parallelism (torch context_parallel over SDPA) takes no attention mask,
    and none builds a pipeline of an HF model; nor does the estimate split an encoder's head over tp."""
    if not model.bidirectional or (tp == 1 and pp == 1 and cp == 1):
        return None
    # no degree named: the search logs it once for every split it refuses (the example shows one)
    return (
        f"{model.name} is a bidirectional encoder, trained data-parallel only: tp, pp and cp of 1 "
        "(transformers has no tensor-parallel plan, pipeline or masked context parallelism for it)"
    )


def encoder_violation(model: ModelSpec, layout: Layout) -> Violation:
    problem = encoder_split_problem(model, layout.tp, layout.pp, layout.cp)
    if problem is None:
        return None
    field = next(name for name in ("tp", "pp", "cp") if getattr(layout, name) > 1)
    return _bad(f"tp={layout.tp} pp={layout.pp} cp={layout.cp}: {problem}", "encoder_split", field)


def tensor_parallel_violation(model: ModelSpec, tp: int) -> Violation:
    # Megatron: attention heads and query groups (kv heads) are split over tensor-parallel ranks.
    if model.num_attention_heads % tp:
        return _bad(f"num_attention_heads ({model.num_attention_heads}) % tp ({tp}) != 0", "heads_tp", "tp")
    if model.num_kv_heads % tp:
        # Megatron would replicate the query groups where tp is a multiple of them (attention.py: one
        # group per partition), which the per-rank weights and FLOPs here do not model (odd-clusters review)
        replicated = (
            " (KV heads replicated over tp, as Megatron runs tp a multiple of them, are not modelled)"
        )
        multiple = tp % model.num_kv_heads == 0
        return _bad(
            f"num_kv_heads ({model.num_kv_heads}) % tp ({tp}) != 0{replicated if multiple else ''}",
            "kv_heads_tp",
            "tp",
        )
    return None


def megatron_width_violation(model: ModelSpec, layout: Layout) -> Violation:
    """Megatron splits each MLP's width over its tensor-parallel ranks with ``divide`` (core/utils.py
    asserts numerator % denominator == 0): fc1 (2f under SwiGLU) and fc2 of every dense MLP and shared
    expert over tp (tensor_parallel/layers.py ColumnParallelLinear / RowParallelLinear), and the routed
    experts' over the expert tensor-parallel degree; a width they do not divide fails at model build
    (a tp = 3 plan was rendered for a 16,000-wide MLP; odd-clusters review)."""
    if layout.framework is not Framework.MEGATRON:
        return None
    tp, moe = layout.tp, model.moe
    dense = moe is None or params.moe_layer_count(model) < model.num_layers
    widths = [("ffn_hidden_size", model.ffn_hidden_size, tp, "tp")] if dense else []
    if moe is not None and moe.num_shared_experts:
        widths.append(("moe.shared_expert_ffn_hidden_size", moe.shared_expert_ffn_hidden_size, tp, "tp"))
    if moe is not None and layout.etp is None:  # an etp given is expert_tensor_violation's
        widths.append(("moe.expert_ffn_hidden_size", moe.expert_ffn_hidden_size, layout.expert_tp, "tp"))
    for name, width, degree, field in widths:
        if width % degree:
            return _bad(
                f"{name} ({width}) % {field} ({degree}) != 0: Megatron splits the MLP's width over the "
                "tensor-parallel ranks evenly (its divide() asserts at model build)",
                "mlp_width_tp",
                field,
            )
    return None


def pipeline_split_violation(model: ModelSpec, layout: Layout) -> Violation:
    """The layers split over pp x v virtual stages (``pipeline.stage_layers``): every stage gets a
    count >= 0, the counts add up to the layers, and every pipeline rank holds a layer or the
    embedding or the loss."""
    p, v = layout.pp, layout.virtual_pipeline_stages
    if v > 1 and p == 1:
        return _bad(
            f"virtual_pipeline_stages ({v}) > 1 needs pp > 1", "virtual_pp", "virtual_pipeline_stages"
        )
    explicit = layout.pipeline_layers
    if explicit is not None and (layout.pipeline_account_for_embedding or layout.pipeline_account_for_loss):
        return _bad(
            "pipeline_layers already places every layer: drop pipeline_account_for_embedding/_loss",
            "pipeline_split",
            "pipeline_layers",
        )
    if explicit is not None and (len(explicit) != p * v or sum(explicit) != model.num_layers):
        return _bad(
            f"pipeline_layers must give the layers of each of pp x v = {p * v} stages adding up to "
            f"num_layers ({model.num_layers}); got {len(explicit)} stages of {sum(explicit)} layers",
            "pipeline_split",
            "pipeline_layers",
        )
    if not pipeline.covers_every_rank(model.num_layers, layout):
        # the split itself only when it is short enough to read (a search tries pp in the thousands)
        shown = f" (split {list(pipeline.stage_layers(model.num_layers, layout))})" if p * v <= 256 else ""
        return _bad(
            f"num_layers ({model.num_layers}) cannot give each of pp x v = {p * v} stages a layer{shown}",
            "pp_layers",
            "pp",
        )
    return None


def interleaving_violation(layout: Layout, caps: Capabilities) -> Violation:
    if layout.virtual_pipeline_stages > 1 and not caps.interleaved_pipeline:
        return _bad(
            f"{layout.framework.value} has no interleaved pipeline schedule",
            "virtual_pp",
            "virtual_pipeline_stages",
        )
    return None


def batch_split_violation(training: TrainingSpec, layout: Layout) -> Violation:
    """global = micro x accumulation x dp."""
    try:
        layout.accumulation_steps(training.global_batch_size)
    except InvalidLayout as error:
        return error
    return None


def schedule_batches_violation(layout: Layout, micro_batches: int) -> Violation:
    """The micro-batches a pipeline schedule takes. Megatron's interleaved: a multiple of pp.
    PyTorch's (torchtitan, FSDP): Schedule1F1B raises ValueError below one micro-batch per stage
    (torch/distributed/pipelining/schedules.py Schedule1F1B.__init__: "Number of microbatches ... must
    be greater than or equal to the number of stages"; Megatron and DeepSpeed run fewer, with the
    bubble (p-1)/m); ScheduleInterleaved1F1B a multiple of its rounds, max(1, m // pp), so 6
    micro-batches at pp 4 run (a 422 before: torchtitan review); fewer than pp run too, with a bubble
    the estimate's (p-1)/(v m) does not bound (each chunk waits for the micro-batch to come round):
    refused as not modelled."""
    p, m = layout.pp, micro_batches
    if layout.virtual_pipeline_stages == 1:
        if layout.framework is Framework.FSDP and 1 < p and m < p:
            return _bad(
                f"micro-batches per step ({m}) < pp ({p}): PyTorch's Schedule1F1B (torchtitan) refuses fewer "
                "micro-batches than pipeline stages; give at least pp micro-batches (a larger "
                "global_batch_size or a smaller micro_batch_size)",
                "pipeline_batches",
                "pp",
            )
        return None
    if layout.framework is not Framework.FSDP:
        if m % p:
            return _bad(f"micro-batches per step ({m}) % pp ({p}) != 0 with interleaving", "virtual_pp", "pp")
        return None
    if m < p:
        return _bad(
            f"micro-batches per step ({m}) < pp ({p}) with interleaving: PyTorch's Interleaved1F1B runs it "
            "with a bubble the estimate does not model; give at least pp micro-batches",
            "virtual_pp",
            "pp",
        )
    rounds = m // p
    if m % rounds:
        return _bad(
            f"micro-batches per step ({m}) must be a multiple of PyTorch's Interleaved1F1B rounds "
            f"(m // pp = {rounds})",
            "virtual_pp",
            "pp",
        )
    return None


def sequence_parallel_violation(training: TrainingSpec, layout: Layout) -> Violation:
    """Sequence parallelism splits each rank's sequence (seq_len / cp tokens) over the tensor-parallel
    ranks along the sequence dimension, whatever the micro-batch: Megatron-Core asserts dim_size %
    tp == 0 on [s/cp, b, h] (tensor_parallel/mappings.py ``_split_along_first_dim``); torchtitan
    0.3.0 refuses a seq_len not divisible by tp x (2 cp when cp > 1) (trainer.py, 'validate dense
    activation sequence length evenness')."""
    if not (layout.sequence_parallel and layout.tp > 1):
        return None
    divisor = sequence_parallel_divisor(layout)
    if training.seq_len % divisor:
        how = (
            "tp x 2cp (torchtitan's trainer)"
            if layout.framework is Framework.FSDP and layout.cp > 1
            else "tp (torchtitan's trainer)"
            if layout.framework is Framework.FSDP
            else "cp x tp: each rank's seq_len / cp tokens split over tp"
        )
        return _bad(f"seq_len ({training.seq_len}) % {how} ({divisor}) != 0 under sequence parallelism",
                    "sp_seq", "tp")  # fmt: skip
    return None


def sequence_parallel_divisor(layout: Layout) -> int:
    """What seq_len must be a multiple of under sequence parallelism (``sequence_parallel_violation``)."""
    return sequence_parallel_divisor_of(layout.framework, layout.tp, layout.cp)


def sequence_parallel_divisor_of(framework: Framework, tp: int, cp: int) -> int:
    """``sequence_parallel_divisor`` of a layout of ``framework`` at these degrees."""
    if framework is Framework.FSDP:
        return tp * (2 * cp if cp > 1 else 1)
    return cp * tp


def sequence_divisor(layout: Layout) -> int:
    """What seq_len must be a multiple of for the layout to split it (``context_violation``'s ring or
    Ulysses split, ``sequence_parallel_violation``'s)."""
    ulysses = FRAMEWORK_CAPABILITIES[layout.framework].ulysses_context_parallel
    split = (layout.cp if ulysses else 2 * layout.cp) if layout.cp > 1 else 1
    sp = sequence_parallel_divisor(layout) if layout.sequence_parallel and layout.tp > 1 else 1
    return math.lcm(split, sp)


def unused_switch_violation(cluster: ClusterSpec, layout: Layout) -> Violation:
    """A switch the layout cannot use: the estimate would not change, so the request is refused."""
    if layout.sequence_parallel and layout.tp == 1:
        return _bad("sequence_parallel needs tp > 1 (it splits the tensor-parallel group's tokens)", "unused",
                    "sequence_parallel")  # fmt: skip
    overlaps_tp = FRAMEWORK_CAPABILITIES[layout.framework].tp_comm_overlap
    if layout.tp_comm_overlap and not (overlaps_tp and layout.tp > 1 and layout.sequence_parallel):
        return _bad(f"tp_comm_overlap (Megatron's --tp-comm-overlap, torchtitan's Async TP) overlaps the "
                    f"sequence-parallel all-gathers and reduce-scatters: it needs framework "
                    f"{_having('tp_comm_overlap')}, tp > 1 and sequence_parallel", "unused",
                    "tp_comm_overlap")  # fmt: skip
    if layout.overlap_grad_reduce is not None and layout.dp * layout.cp == 1:
        return _bad("overlap_grad_reduce: dp x cp = 1 has no gradient reduction to overlap", "unused",
                    "overlap_grad_reduce")  # fmt: skip
    in_node = max(1, cluster.gpus_per_node // layout.tp)
    if layout.fsdp_hybrid_shard and layout.dp_replicate is None and layout.dp * layout.cp <= in_node:
        return _bad(f"fsdp_hybrid_shard: the dp x cp = {layout.dp * layout.cp} ranks already shard inside "
                    f"one node ({in_node} per node after tp)", "unused", "fsdp_hybrid_shard")  # fmt: skip
    return None


def peer_access_violation(cluster: ClusterSpec, layout: Layout) -> Violation:
    """TP communication overlap maps the TP peers' memory (Transformer Engine's userbuffers through
    CUDA IPC or multicast handles, NVIDIA/TransformerEngine #966 and #1071; torchtitan's Async TP
    through PyTorch's SymmetricMemory): GPUs without peer access (``GPUSpec.peer_to_peer``) cannot
    run it."""
    if layout.tp_comm_overlap and not cluster.gpu.tp_overlap_peer_access:
        why = (
            "has no peer access between its GPUs"
            if not cluster.gpu.peer_to_peer
            else f"is on {cluster.gpu.chip}, whose ROCm stack maps no peer memory for it (PyTorch's "
            "SymmetricMemory runs on gfx942 and gfx950 only)"
        )
        return _bad(
            f"tp_comm_overlap maps the tp {layout.tp} peers' memory (Transformer Engine's userbuffers, "
            f"PyTorch's SymmetricMemory): {cluster.gpu.name} {why}",
            "peer_access",
            "tp_comm_overlap",
        )
    if layout.tp_comm_overlap and cluster.tp_straddles_nodes(layout.tp, layout.world_size):
        # userbuffers build each TP group from the ranks of one host (a layout of tp 4 on nodes of 6
        # was timed 17% faster for an overlap that cannot form; review of stop 48)
        return _bad(
            f"tp_comm_overlap maps the tp {layout.tp} peers' memory inside one node: with "
            f"{cluster.gpus_per_node} GPUs per node some tp {layout.tp} groups straddle two nodes",
            "peer_access",
            "tp_comm_overlap",
        )
    return None


def hybrid_shard_violation(cluster: ClusterSpec, layout: Layout) -> Violation:
    """HSDP's groups whole (``model_states.hsdp_replicas``): each replica shards over dp_shard x cp
    ranks (torchtitan's "dp_shard_cp" mesh, Accelerate's dp_shard_size x cp_size), so a node's ranks
    after tp must hold whole cp groups, and the dp x cp ranks whole nodes of them; or ``dp_replicate``
    split dp into at least two groups."""
    if layout.dp_replicate is not None:
        if not layout.fsdp_hybrid_shard:
            return _bad(f"dp_replicate ({layout.dp_replicate}) is HSDP's replica count: it needs "
                        "fsdp_hybrid_shard", "hybrid_shard", "dp_replicate")  # fmt: skip
        if layout.dp_replicate == 1 or layout.dp % layout.dp_replicate:
            return _bad(f"dp_replicate ({layout.dp_replicate}) must split dp ({layout.dp}) into 2 or more "
                        "equal groups (1 shards over every rank: fsdp_hybrid_shard false)", "hybrid_shard",
                        "dp_replicate")  # fmt: skip
        if layout.dp_replicate == layout.dp and layout.cp == 1:
            return _bad(f"dp_replicate = dp ({layout.dp}) leaves shard groups of one rank: nothing is "
                        "sharded, which is DDP (zero_stage 0)", "unused", "dp_replicate")  # fmt: skip
        return None
    if not layout.fsdp_hybrid_shard:
        return None
    in_node = max(1, cluster.gpus_per_node // layout.tp)
    ranks = layout.dp * layout.cp
    if in_node % layout.cp or ranks % in_node:
        return _bad(
            f"fsdp_hybrid_shard shards inside a node: its {in_node} ranks after tp must hold whole cp "
            f"groups (cp = {layout.cp}) and the dp x cp = {ranks} ranks whole nodes of them",
            "hybrid_shard",
            "fsdp_hybrid_shard",
        )
    return None


def megatron_precision_violation(training: TrainingSpec, layout: Layout) -> Violation:
    """Megatron's gradient-buffer dtype and fp8 parameter gather: only where they change something."""
    megatron = layout.framework is Framework.MEGATRON
    mixed_bf16 = training.precision in (Precision.BF16, Precision.FP8)
    if layout.grad_reduce_in_fp32 is not None and not (megatron and mixed_bf16):
        # fp16 keeps 16-bit grads and copies them to fp32 in the optimizer; fp32 has nothing to choose
        return _bad(f"grad_reduce_in_fp32 is Megatron's gradient-buffer dtype under bf16 or fp8 (framework "
                    f"{layout.framework.value}, precision {training.precision.value})", "unused",
                    "grad_reduce_in_fp32")  # fmt: skip
    if layout.fp8_param_gather is not None and not (megatron and training.precision is Precision.FP8):
        return _bad(f"fp8_param_gather is Megatron's --fp8-param-gather: it needs framework megatron and "
                    f"precision fp8 (framework {layout.framework.value}, precision "
                    f"{training.precision.value})", "unused", "fp8_param_gather")  # fmt: skip
    if layout.fp8_param_gather and layout.zero_stage != 1:
        # megatron/training/arguments.py: "--fp8-param-gather only supported with distributed optimizer"
        return _bad(f"fp8_param_gather needs the distributed optimizer (zero_stage 1), got zero_stage "
                    f"{layout.zero_stage}", "fp8_param_gather", "fp8_param_gather")  # fmt: skip
    return precision_aware_violation(training, layout)


def precision_aware_violation(training: TrainingSpec, layout: Layout) -> Violation:
    """Megatron's --use-precision-aware-optimizer, stated: where Megatron runs it and the estimate
    models it (megatron/core/optimizer/__init__.py, optimizer_config.py, training/arguments.py)."""
    stated = layout.precision_aware_optimizer
    if stated is None:
        return None
    if layout.framework is not Framework.MEGATRON:
        return _bad(f"precision_aware_optimizer is Megatron's --use-precision-aware-optimizer (framework "
                    f"{layout.framework.value})", "unused", "precision_aware_optimizer")  # fmt: skip
    offloaded = layout.offload_optimizer is not Offload.NONE
    if not stated and offloaded:
        # validate_args: "The optimizer cpu offload must be used in conjunction with
        # --use-precision-aware-optimizer"
        return _bad(f"precision_aware_optimizer false with offload_optimizer "
                    f"{layout.offload_optimizer.value}: Megatron's optimizer offload runs only with "
                    "--use-precision-aware-optimizer", "precision_aware_optimizer",
                    "precision_aware_optimizer")  # fmt: skip
    if not stated:
        return None
    if layout.zero_stage != 1:
        # megatron/core/optimizer/__init__.py: "--use-precision-aware-optimizer only supported with
        # distributed optimizer"
        return _bad(f"precision_aware_optimizer needs the distributed optimizer (zero_stage 1), got "
                    f"zero_stage {layout.zero_stage}", "precision_aware_optimizer",
                    "precision_aware_optimizer")  # fmt: skip
    if training.optimizer is not Optimizer.ADAMW:
        # optimizer_config.py: "--use-precision-aware-optimizer only supported with adam"
        return _bad(f"precision_aware_optimizer is Transformer Engine's FusedAdam: it needs optimizer "
                    f"adamw, got {training.optimizer.value}", "precision_aware_optimizer",
                    "precision_aware_optimizer")  # fmt: skip
    if not offloaded and training.precision not in (Precision.BF16, Precision.FP16, Precision.FP8):
        return _bad(f"precision_aware_optimizer steps a master beside 16-bit weights: precision "
                    f"{training.precision.value} keeps none", "unused",
                    "precision_aware_optimizer")  # fmt: skip
    fp8_weights = model_states.megatron_fp8_params(layout, Precision.FP8)
    if not offloaded and training.precision is Precision.FP8 and fp8_weights:
        # Transformer Engine's FusedAdam over fp8 weights (--fp8-param-gather) is not modelled; over
        # bf16 ones, under the delayed scaling the launch file sets (use_precision_aware_optimizer_no_
        # fp8_or_ds_fp8, optimizer_config.py), it keeps bf16's remainders (Megatron review)
        return _bad("precision_aware_optimizer with fp8 weights (fp8_param_gather, on by default with the "
                    "distributed optimizer) is not modelled: set fp8_param_gather false",
                    "precision_aware_optimizer", "precision_aware_optimizer")  # fmt: skip
    return None


def unused_split_flag_violation(layout: Layout) -> Violation:
    """A pipeline-split flag needs a pipeline to shape. (Where the flags leave the derived split as
    it would be without them they still say what the user runs: Megatron-Core needs both flags for
    126 layers over 64 virtual stages, where our shared-out split happens to coincide.)"""
    for field in ("pipeline_account_for_embedding", "pipeline_account_for_loss"):
        if getattr(layout, field) and layout.pp == 1:
            return _bad(f"{field} needs pp > 1 (it shapes the pipeline split)", "unused", field)
    return None


def fused_optimizer_batches_violation(layout: Layout, micro_batches: int) -> Violation:
    # the optimizer step fused into backward updates after every backward: no accumulation
    if layout.optimizer_in_backward and micro_batches > 1:
        return _bad(
            "optimizer_in_backward needs gradient_accumulation_steps = 1",
            "optimizer_in_backward",
            "optimizer_in_backward",
        )
    return None


def micro_batch_violation(training: TrainingSpec, layout: Layout, micro_batch_size: int) -> Violation:
    """The first rule a micro-batch of ``micro_batch_size`` (accumulation derived from the global
    batch) breaks in this layout, or None."""
    per_step = micro_batch_size * layout.dp
    if training.global_batch_size % per_step:
        return _bad(
            f"global_batch_size ({training.global_batch_size}) is not divisible by micro_batch_size "
            f"({micro_batch_size}) x dp ({layout.dp}) = {per_step}",
            "global_batch",
            "micro_batch_size",
        )
    micro_batches = training.global_batch_size // per_step
    return (
        schedule_batches_violation(layout, micro_batches)
        or sequence_parallel_violation(training, layout)
        or fused_optimizer_batches_violation(layout, micro_batches)
    )


def valid_micro_batch_sizes(training: TrainingSpec, layout: Layout) -> tuple[int, ...]:
    """The micro-batches ``micro_batch_violation`` accepts for this layout, ascending: divisors of
    the per-replica batch."""
    if training.global_batch_size % layout.dp:
        return ()
    per_replica = training.global_batch_size // layout.dp
    return tuple(b for b in divisors(per_replica) if micro_batch_violation(training, layout, b) is None)


def zero_with_pipeline_violation(layout: Layout, caps: Capabilities) -> Violation:
    p = layout.pp
    if p > 1 and layout.zero_stage > caps.max_zero_stage_with_pp:
        return _bad(
            f"zero_stage {layout.zero_stage} with pp = {p}: {layout.framework.value} allows at most "
            f"{caps.max_zero_stage_with_pp}",
            "zero_pp",
            "zero_stage",
            limit=caps.max_zero_stage_with_pp,
        )
    return None


def zero_with_expert_parallel_violation(layout: Layout, caps: Capabilities) -> Violation:
    if layout.ep > 1 and layout.zero_stage > caps.max_zero_stage_with_ep:
        native = (
            " (DeepSpeed's engine refuses its native MoE layers under stage 3: 'Native DeepSpeed MoE is not "
            "supported with ZeRO Stage 3')"
            if layout.framework is Framework.DEEPSPEED
            else ""
        )
        return _bad(
            f"zero_stage {layout.zero_stage} with ep = {layout.ep}: {layout.framework.value} allows at most "
            f"{caps.max_zero_stage_with_ep}{native}",
            "zero_ep",
            "zero_stage",
            limit=caps.max_zero_stage_with_ep,
        )
    return None


def context_violation(
    model: ModelSpec, layout: Layout, training: TrainingSpec, *, ulysses: bool | None = None
) -> Violation:
    """The sequence splits context parallelism needs, by how the framework splits it (``ulysses``,
    default: the layout's framework's): a load-balanced ring (Megatron's, PyTorch's) cuts the sequence
    into 2 cp chunks; DeepSpeed-Ulysses gives each rank seq / cp contiguous tokens
    (deepspeed/sequence/layer.py ``DistributedAttention``: an all-to-all over the heads)."""
    cp = layout.cp
    if cp == 1:
        return None
    if ulysses is None:
        ulysses = FRAMEWORK_CAPABILITIES[layout.framework].ulysses_context_parallel
    if ulysses and training.seq_len % cp:
        return _bad(
            f"seq_len ({training.seq_len}) % cp ({cp}) != 0 (Ulysses gives each rank seq_len / cp tokens)",
            "cp_seq",
            "cp",
        )
    if not ulysses and training.seq_len % (2 * cp):
        return _bad(
            f"seq_len ({training.seq_len}) % (2*cp = {2 * cp}) != 0 (load-balanced ring attention)",
            "cp_seq",
            "cp",
        )
    if training.attention is Attention.EAGER:
        return _bad("context parallelism needs flash or sdpa attention, not eager", "cp_attention", "cp")
    windowed = sorted(kind.value for kind in binding_windows(model, training.seq_len))
    if layout.framework is Framework.FSDP and windowed:
        # torch's ring attention takes is_causal alone (_attention.py ``_is_causal_behavior``), and
        # Accelerate's context-parallel hook drops the attention mask and sets is_causal=True
        # (transformers: "Context parallelism only supports causal attention masks"): every layer
        # would attend the whole causal prefix, another model at another cost
        return _bad(
            f"context parallelism under fsdp with {'/'.join(windowed)} attention layers: PyTorch's ring "
            "attention (torchtitan, Accelerate) masks causally only, so the layers' windows would be "
            "dropped; use cp = 1, or megatron / deepspeed",
            "cp_window",
            "cp",
        )
    return None


def binding_windows(model: ModelSpec, seq_len: int) -> frozenset[AttentionKind]:
    """The layers' windowed attention kinds that mask a key at this sequence length: a sliding window
    of fewer than ``seq_len`` keys, chunks of fewer than ``seq_len`` tokens. A window as long as the
    sequence masks nothing (Phi-4-mini's 262,144-key window at 131,072 tokens was refused context
    parallelism under FSDP as if its windows would be dropped; 2025-26 configs review)."""
    return frozenset(
        kind
        for kind in set(model.layer_types)
        if kind is not AttentionKind.FULL and model.attention_span(kind, seq_len) < seq_len
    )


def ulysses_violation(model: ModelSpec, layout: Layout) -> Violation:
    cp = layout.cp
    ulysses = FRAMEWORK_CAPABILITIES[layout.framework].ulysses_context_parallel
    if cp > 1 and ulysses and model.num_attention_heads % cp:
        # DeepSpeed-Ulysses all-to-all splits heads over the sequence-parallel group.
        return _bad(
            f"num_attention_heads ({model.num_attention_heads}) % cp ({cp}) != 0 (Ulysses)", "cp_heads", "cp"
        )
    kv = model.num_kv_heads
    if cp > 1 and ulysses and model.mla is None and kv % cp and cp % kv:
        # the KV heads split over the group, or are replicated to one per rank (deepspeed/runtime/
        # sequence_parallel/ulysses_sp.py UlyssesSPAttentionHF: "KV attention head count ... is not
        # divisible by SP size ... or vice versa")
        return _bad(
            f"num_kv_heads ({kv}) and cp ({cp}): neither divides the other (Ulysses)", "cp_heads", "cp"
        )
    return None


def expert_violation(model: ModelSpec, layout: Layout) -> Violation:
    if layout.moe_capacity_factor is not None and model.moe is None:
        return _bad(
            "moe_capacity_factor needs a mixture-of-experts model", "capacity_moe", "moe_capacity_factor"
        )
    if layout.moe_capacity_factor is not None and layout.moe_capacity_factor < 1.0:
        # below 1 every expert drops tokens even at a perfectly even load: the step trains a part of the
        # routed copies, so its model FLOPs (top_k per token) exceed what runs, and MFU and HFU would
        # pass 1 (Mixtral at 0.25: 1.08; properties review). Recipes that drop tokens use 1.0 or more
        # (Megatron-Bridge's token-drop recipes 1.0; GShard and Switch Transformer train at 1.0-2.0).
        return _bad(
            f"moe_capacity_factor {layout.moe_capacity_factor:g} < 1 drops routed tokens even at an even "
            "load: the model then trains on part of its routed tokens, not modelled (token-drop recipes "
            "use 1.0 or more)",
            "capacity_below_one",
            "moe_capacity_factor",
        )
    if layout.moe_capacity_factor is not None and layout.framework is Framework.FSDP:
        # Hugging Face's expert loop and torchtitan's token-choice MoE have no capacity: no launcher
        # of fsdp could run the padded experts the estimate would time
        return _bad(
            "moe_capacity_factor: fsdp's MoE (Hugging Face's expert loop, torchtitan's token choice) drops "
            "no tokens; capacity factors are megatron's and deepspeed's",
            "capacity_moe",
            "moe_capacity_factor",
        )
    if layout.moe_capacity_factor is not None and layout.framework is Framework.DEEPSPEED and layout.ep == 1:
        # the DeepSpeed script builds deepspeed.moe.layer.MoE (which has a capacity) for ep > 1 only;
        # at ep = 1 it trains the model's own MoE block, which drops no tokens
        return _bad(
            "moe_capacity_factor: deepspeed at ep = 1 trains the model's own MoE block (Hugging Face's "
            "expert loop), which drops no tokens; DeepSpeed MoE layers and their capacity come with ep > 1",
            "capacity_moe",
            "moe_capacity_factor",
        )
    ep = layout.ep
    if ep == 1 and model.moe is not None and layout.tp > 1 and layout.framework is Framework.DEEPSPEED:
        # AutoTP replaces nn.Linear and nn.Embedding modules only (auto_tp.py: 2-D weights); the routed
        # experts at ep = 1 are the fused 3-D parameters transformers 5 builds (model_states.fused_experts),
        # which then stay whole on every tp rank and run every token of the tp group: not what the
        # estimate splits over tp (a Llama 4 Scout plan at tp 4 fit at 69 GiB where its experts alone
        # need about 59 GiB more; 2025-26 configs review)
        return _bad(
            f"deepspeed tp = {layout.tp} with ep = 1: AutoTP splits nn.Linear modules only, and the routed "
            "experts are fused 3-D parameters (transformers 5), left whole on every tp rank (not modelled); "
            "use ep > 1 (deepspeed.moe.layer.MoE, which splits its experts over tp) or tp = 1",
            "autotp_fused_experts",
            "tp",
        )
    if ep == 1:
        return None
    if model.moe is None:
        return _bad(f"ep = {ep} > 1 needs a mixture-of-experts model", "ep_moe", "ep")
    if (
        zero_ep := zero_with_expert_parallel_violation(layout, FRAMEWORK_CAPABILITIES[layout.framework])
    ) is not None:
        return zero_ep
    if model.moe.num_experts % ep:
        return _bad(f"num_experts ({model.moe.num_experts}) % ep ({ep}) != 0", "ep_experts", "ep")
    etp = layout.expert_tp
    if (layout.tp * layout.dp * layout.cp) % (etp * ep):
        # Megatron parallel_state: a stage's tp x cp x dp ranks form the expert grid etp x ep x
        # expert-dp (world % (etp * ep * pp) == 0); with etp = tp that is ep | dp * cp.
        return _bad(f"tp*dp*cp ({layout.tp * layout.dp * layout.cp}) % (etp*ep) ({etp * ep}) != 0 "
                    f"(etp = {etp})", "ep_dp", "ep")  # fmt: skip
    return None


def expert_tensor_violation(model: ModelSpec, layout: Layout) -> Violation:
    """``etp`` is Megatron's --expert-tensor-parallel-size: routed experts of an MoE model split over
    etp ranks, folded with ep into the stage's tp x cp x dp ranks."""
    etp = layout.etp
    if etp is None:
        return None
    if model.moe is None:
        return _bad(f"etp = {etp} needs a mixture-of-experts model (it splits the routed experts)", "unused",
                    "etp")  # fmt: skip
    if not FRAMEWORK_CAPABILITIES[layout.framework].expert_tensor_parallel:
        return _bad(f"etp is Megatron's --expert-tensor-parallel-size; {layout.framework.value} splits the "
                    "experts over tp", "etp_framework", "etp")  # fmt: skip
    if model.moe.expert_ffn_hidden_size % etp:
        return _bad(f"expert_ffn_hidden_size ({model.moe.expert_ffn_hidden_size}) % etp ({etp}) != 0",
                    "etp_width", "etp")  # fmt: skip
    if etp < layout.tp and not layout.sequence_parallel:
        # each rank then dispatches its own sequence-parallel shard of the tokens (Megatron asserts
        # sequence parallelism for MoE with tensor parallelism)
        return _bad(f"etp ({etp}) < tp ({layout.tp}) needs sequence_parallel", "etp_sp", "etp")
    return None


def megatron_moe_sequence_parallel_violation(model: ModelSpec, layout: Layout) -> Violation:
    """Megatron trains an MoE layer with tensor parallelism only under sequence parallelism
    (megatron/core/transformer/moe/moe_layer.py forward: "During training, performance may degrade if
    MoE and tensor parallelism are enabled without also enabling sequence parallelism" is a
    ValueError when training; an MoE review found an estimate that accepted it)."""
    megatron = layout.framework is Framework.MEGATRON
    if megatron and model.moe is not None and layout.tp > 1 and not layout.sequence_parallel:
        return _bad(f"megatron trains MoE layers with tp ({layout.tp}) > 1 only with sequence_parallel "
                    "(moe_layer.py raises otherwise)", "moe_sp", "sequence_parallel")  # fmt: skip
    return None


def sharding_violation(layout: Layout, caps: Capabilities) -> Violation:
    """The framework's ZeRO / FSDP stage and offload choices (not their interplay with pp)."""
    name = layout.framework.value
    if layout.zero_stage not in caps.zero_stages:
        return _bad(
            f"{name} has no zero_stage {layout.zero_stage} (allowed {sorted(caps.zero_stages)})",
            "zero_stage",
            "zero_stage",
            allowed=tuple(sorted(caps.zero_stages)),
        )
    if layout.fsdp_hybrid_shard and (not caps.hybrid_shard or layout.zero_stage not in (2, 3)):
        return _bad(
            f"fsdp_hybrid_shard needs framework {_having('hybrid_shard')} with zero_stage 2 or 3",
            "hybrid_shard",
            "fsdp_hybrid_shard",
        )
    for field, device in (
        ("offload_optimizer", layout.offload_optimizer),
        ("offload_params", layout.offload_params),
    ):
        if device is not Offload.NONE and device not in caps.offload_devices:
            return _bad(f"{name} cannot offload to {device.value}", "offload_device", field)
    if layout.offload_params is not Offload.NONE and (not caps.param_offload or layout.zero_stage != 3):
        return _bad(
            f"offload_params needs zero_stage 3 (got {layout.zero_stage}) in {name}",
            "offload_params",
            "offload_params",
        )
    if layout.offload_optimizer is not Offload.NONE and layout.zero_stage < 1:
        return _bad("offload_optimizer needs zero_stage >= 1", "offload_optimizer", "offload_optimizer")
    nvme = layout.offload_optimizer is Offload.NVME
    if nvme and caps.nvme_optimizer_needs_stage_3 and layout.zero_stage != 3:
        # below stage 3 the "nvme" device runs as cpu: the states would fill the host RAM instead
        return _bad(
            f"offload_optimizer nvme needs zero_stage 3 in {name} (got {layout.zero_stage}; below it the "
            "states stay in host memory): use offload_optimizer cpu, or zero_stage 3",
            "offload_optimizer",
            "offload_optimizer",
        )
    if caps.offload_together and layout.offload_optimizer is not layout.offload_params:
        # FSDP CPUOffload offloads parameters, gradients and the optimizer step together.
        return _bad(
            f"{name} offloads params and optimizer together: set both or neither",
            "fsdp_offload",
            "offload_optimizer",
        )
    return None


def attention_precision_violation(training: TrainingSpec) -> Violation:
    """FlashAttention named with fp32 activations (fp32, tf32): its kernels take fp16 / bf16 inputs
    only (flash_attn's interface asserts q.dtype in (torch.float16, torch.bfloat16)). A training that
    leaves the attention to the GPU gets SDPA there (``defaults.best_attention``)."""
    if training.attention is Attention.FLASH and training.precision.stores_fp32:
        return _bad(
            f"attention flash takes fp16 or bf16 inputs only, and precision {training.precision.value} "
            "keeps the activations in fp32: use attention sdpa or eager, a 16-bit precision, or leave "
            "attention out (sdpa is chosen)",
            "flash_precision",
            "attention",
        )
    return None


def flash_head_dim_violation(model: ModelSpec, training: TrainingSpec) -> InvalidTraining | None:
    """FlashAttention named for heads wider than its kernels take (``defaults.FLASH_MAX_HEAD_DIM``:
    flash_api.cpp checks head_size <= 256, and Transformer Engine's flash backend stops there too): the
    run fails at its first forward. Left to the hardware, such a model gets SDPA
    (``defaults.best_attention``); the estimate assumed flash with a warning, and the launch files
    loaded the model with flash_attention_2 (a small-models review)."""
    if training.attention is Attention.FLASH and model.head_dim > FLASH_MAX_HEAD_DIM:
        return InvalidTraining(
            f"attention flash: its kernels take head_dim up to {FLASH_MAX_HEAD_DIM}, and {model.name}'s is "
            f"{model.head_dim} (the run fails at its first forward): use attention sdpa or eager, or leave "
            "attention out (sdpa is chosen)",
            rule="flash_head_dim",
            field="attention",
            limit=FLASH_MAX_HEAD_DIM,
        )
    if training.attention is Attention.FLASH and flash_refuses_dropout(model):
        return InvalidTraining(
            f"attention flash: flash-attn refuses softcapping with dropout ('Softcapping does not support "
            f"dropout for now', flash_api.cpp), and {model.name} has both (attn_logit_softcapping, "
            f"attention_dropout {model.attention_dropout:g}): use attention eager, or leave attention out "
            "(eager is chosen)",
            rule="flash_softcap_dropout",
            field="attention",
        )
    return None


def hardware_violation(cluster: ClusterSpec, training: TrainingSpec) -> Violation:
    """What the GPU cannot run, whatever the layout: a precision without matrix units for it (tf32 and
    bf16 before Ampere, fp8 before Hopper / Ada), FlashAttention where its kernels do not exist, and
    FlashAttention with fp32 activations, which no GPU runs."""
    unrunnable = attention_precision_violation(training)
    if unrunnable is not None:
        return unrunnable
    peaks = cluster.gpu.peak_flops_per_s
    if peaks.of(training.precision) is None:
        runs = tuple(precision.value for precision in Precision if peaks.of(precision) is not None)
        return _bad(
            f"{cluster.gpu.name} has no {training.precision.value} support (no {training.precision.value} "
            f"peak in its spec); precisions it runs: {', '.join(runs)}",
            "precision",
            "precision",
            allowed=runs,
        )
    if training.attention is Attention.FLASH and not cluster.gpu.flash_attention:
        return _bad(
            f"{cluster.gpu.name} has no FlashAttention kernels (they need NVIDIA Ampere or newer, or AMD "
            "CDNA 2/3): use attention sdpa or eager",
            "flash_attention",
            "attention",
        )
    return None


def method_parallel_violation(training: TrainingSpec, layout: Layout) -> Violation:
    """The degrees a training method cannot run with, whatever the framework: QLoRA loads the base
    through transformers' BitsAndBytesConfig, each weight a packed NF4 uint8 storage (bitsandbytes
    Params4bit) with its quant state. Tensor parallelism (DeepSpeed AutoTP, DTensor TP plans) slices
    nn.Linear weights by rows or columns, which the packed storage does not have (transformers#38122);
    expert parallelism needs DeepSpeed MoE or Megatron layers, and a pipeline a PipelineModule, neither
    of which from_pretrained builds. The published QLoRA recipes shard the quantized base over
    data-parallel ranks instead (PEFT docs: DeepSpeed ZeRO-3 + QLoRA, FSDP + QLoRA with
    bnb_4bit_quant_storage); context parallelism slices no weight and stays allowed."""
    if training.method is not Method.QLORA:
        return None
    for degree in ("tp", "pp", "ep"):
        if getattr(layout, degree) > 1:
            return _bad(
                f"qlora with {degree}={getattr(layout, degree)}: a bitsandbytes NF4 base is packed per "
                "tensor, so no weight is sliced over tp, pp or ep (ZeRO-3 / FSDP shard it over data-parallel "
                f"ranks); use {degree}=1 or method lora",
                "qlora_model_parallel",
                degree,
            )
    if layout.framework is Framework.DEEPSPEED and layout.offload_params is not Offload.NONE:
        # peft docs/source/accelerate/deepspeed.md, Caveats: "DeepSpeed Stage 3 and qlora when used with
        # CPU offloading leads to more GPU memory usage when compared to disabling CPU offloading"; the
        # estimate moved the NF4 base off the GPU (PEFT review: 70B QLoRA on one 24 GB card, 1 GiB on it)
        return _bad(
            f"qlora with deepspeed offload_params {layout.offload_params.value}: ZeRO-3's parameter offload "
            "of a bitsandbytes NF4 base uses more GPU memory than without it (peft's DeepSpeed guide), which "
            "is not modelled; keep the parameters on the GPU, or use fsdp's cpu offload (peft's FSDP + "
            "QLoRA recipe)",
            "qlora_offload",
            "offload_params",
        )
    return None


# Families whose learned position ids start past padding_idx (modeling_roberta.py
# create_position_ids_from_input_ids: padding_idx + 1 = 2 onward), so two table rows are never a position
_POSITION_OFFSETS = dict.fromkeys(params.ROBERTA_FAMILIES, 2)


def learned_positions(model: ModelSpec) -> int | None:
    """The longest sequence a learned position table has rows for (``max_position_embeddings``, less
    the rows RoBERTa's ids skip); None where positions are computed (RoPE, ALiBi) and any length runs."""
    if model.position_embedding is not PositionEmbedding.LEARNED:
        return None
    return model.max_position_embeddings - _POSITION_OFFSETS.get(model.family, 0)


def position_table_violation(model: ModelSpec, training: TrainingSpec) -> InvalidTraining | None:
    """A sequence longer than a learned position table: the embedding lookup of position n past its
    rows raises (index out of range) on the first step, so no layout runs it (it was estimated, the
    plan said feasible with a warning: small-model review, stop 41)."""
    rows = learned_positions(model)
    if rows is None or training.seq_len <= rows:
        return None
    return InvalidTraining(
        f"seq_len ({training.seq_len:,}) > the {rows:,} positions {model.name}'s learned position table "
        "has rows for: the run fails at its first step; shorten the sequence or extend the table (new "
        "rows, not modelled)",
        rule="position_table",
        field="seq_len",
        limit=rows,
    )


def checkpoint_violation(model: ModelSpec, training: TrainingSpec) -> InvalidTraining | None:
    """A checkpoint stored in bitsandbytes 4-bit (``ModelSpec.bnb_4bit_checkpoint``) loads as QLoRA's
    NF4 base whatever the method: full training of it is refused by the Trainer ("You cannot perform
    fine-tuning on purely quantized models"), and LoRA on it is QLoRA (config review, stop 44: LoRA was
    planned on a 16-bit base of 52 GiB where the NF4 one, what loads, is 43)."""
    stored = model.bnb_4bit_compute_precision
    if stored is not None and training.precision is not stored:
        return InvalidTraining(
            f"precision {training.precision.value}: {model.name}'s 4-bit checkpoint computes in "
            f"{stored.value} (its saved quantization_config's bnb_4bit_compute_dtype, which from_pretrained "
            f"builds its Linear4bit layers with): train in {stored.value}, or quantize the 16-bit weights "
            "at load (the config without quantization_config)",
            rule="checkpoint_compute_dtype",
            field="precision",
        )
    if not model.bnb_4bit_checkpoint or training.method is Method.QLORA:
        return None
    return InvalidTraining(
        f"method {training.method.value}: {model.name}'s checkpoint is stored in bitsandbytes 4-bit "
        "(hf_config quantization_config load_in_4bit), which loads as QLoRA's NF4 base: use method qlora, "
        "or the config of its 16-bit weights",
        rule="checkpoint_quantization",
        field="method",
    )


def checkpoint_hardware_violation(model: ModelSpec, gpu: GPUSpec) -> InvalidTraining | None:
    """A stored 4-bit checkpoint whose saved compute dtype (``ModelSpec.bnb_4bit_compute_precision``)
    the GPU has no units for: every precision the GPU runs is another than the checkpoint computes in
    (``checkpoint_violation``), so it is said once, with the way out (the change review found a V100
    answering "runs fp16" for a bf16 checkpoint, then refusing fp16)."""
    stored = model.bnb_4bit_compute_precision
    if stored is None or gpu.peak_flops_per_s.of(stored) is not None:
        return None
    return InvalidTraining(
        f"{model.name}'s 4-bit checkpoint computes in {stored.value} (its saved quantization_config's "
        f"bnb_4bit_compute_dtype), which {gpu.name} has no {stored.value} units for: plan its 16-bit weights "
        "(the config without quantization_config; QLoRA quantizes them at load in a precision the GPU runs)",
        rule="checkpoint_compute_dtype",
        field="precision",
    )


def training_violation(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, training: TrainingSpec, caps: Capabilities
) -> Violation:
    hardware = hardware_violation(cluster, training)
    if hardware is not None:
        return hardware
    if (table := position_table_violation(model, training)) is not None:
        return _bad(table.message, table.rule, "seq_len")
    if (stored := checkpoint_violation(model, training)) is not None:
        return _bad(stored.message, stored.rule, "method")
    if (wide := flash_head_dim_violation(model, training)) is not None:
        return _bad(wide.message, wide.rule, "attention", limit=FLASH_MAX_HEAD_DIM)
    kernels = params.transformers_attention(model)
    if (
        training.attention is not None
        and layout.framework is not Framework.MEGATRON
        and training.attention not in kernels
    ):
        # DeepSpeed and FSDP (Accelerate, the HF Trainer; torchtitan's models run SDPA) build the model
        # with transformers, whose implementation of the family lacks the kernel: it refuses or, for
        # BLOOM, runs eager whatever was asked
        has = ", ".join(sorted(kernel.value for kernel in kernels))
        return _bad(
            f"attention {training.attention.value}: transformers' {model.family} implementation runs {has} "
            f"only (its _supports_sdpa / _supports_flash_attn), which {layout.framework.value} trains; leave "
            "attention out to get the best of those",
            "family_attention",
            "attention",
        )
    if layout.chunked_loss and model.head not in (Head.CAUSAL_LM, Head.MASKED_LM):
        # the estimate would not change: a classifier's few logits are no vocabulary to chunk
        return _bad(f"chunked_loss splits the loss over a vocabulary's logits; {model.name}'s "
                    f"{model.head.value} head has none", "unused", "chunked_loss")  # fmt: skip
    if training.method is not Method.FULL and not caps.peft:
        return _bad(
            f"{training.method.value} needs PEFT adapters, which {layout.framework.value} does not have",
            "peft",
            "framework",
        )
    if training.method is Method.LORA and layout.framework is Framework.DEEPSPEED and layout.tp > 1:
        # AutoTP replaces each module its tp plan names (q_proj, ...), peft's lora.Linear wrapper
        # included, with its own LinearLayer: the adapters are gone before the first step (deepspeed
        # 0.19.8 + peft 0.21.2, two ranks: 180,224 trainable parameters before deepspeed.initialize, 0
        # after; PEFT review). QLoRA's tp is method_parallel_violation's.
        return _bad(
            f"lora with deepspeed tp = {layout.tp}: AutoTP replaces the targeted modules, peft's LoRA "
            "wrappers included, so no adapter trains; use tp = 1 (ZeRO shards the frozen base)",
            "lora_autotp",
            "tp",
        )
    if training.method is not Method.FULL and layout.ep > 1 and not caps.peft_expert_parallel:
        # no launcher runs it (properties review: fsdp's estimate counted adapters on expert modules
        # only DeepSpeed's expert-parallel plan builds)
        return _bad(
            f"{training.method.value} with {layout.framework.value} and ep = {layout.ep}: no launcher runs "
            f"its PEFT with expert parallelism (Accelerate's and the HF Trainer's FSDP have no ep, "
            f"torchtitan no PEFT); use ep = 1, or {_having('peft_expert_parallel')}'s expert parallelism",
            "peft_ep",
            "ep",
        )
    if (
        training.method is not Method.FULL
        and set(training.lora_targets) <= {"gate_proj"}
        and not model.mlp.gated
    ):
        # peft refuses a LoraConfig whose target_modules match no module ("Target modules ... not
        # found"); a two-matrix MLP (GPT-2, BERT) has no gate projection
        return _bad(
            f"lora_targets {list(training.lora_targets)}: {model.name}'s MLP ({model.mlp.value}) has no "
            "gate projection, so no adapter would train; add q_proj, k_proj, v_proj, o_proj, up_proj "
            "or down_proj",
            "lora_targets",
            "lora_targets",
        )
    if training.method is not Method.FULL and not model_states.trains_adapters(model, training, layout):
        return _bad(
            f"lora_targets {list(training.lora_targets)} adapt no module of {model.name} (peft raises "
            "'Target modules ... not found'): name attention projections, or MLP ones the model has as "
            "modules",
            "lora_targets",
            "lora_targets",
        )
    if training.method is not Method.FULL and (
        held := params.split_fused_targets(model, training.lora_targets)
    ):
        return _bad(
            f"lora_targets {list(training.lora_targets)}: {model.name} fuses {', '.join(held)} into one "
            "module, which LoRA adapts whole: target all of them or none",
            "lora_targets",
            "lora_targets",
        )
    if training.method is not Method.FULL and model_states.peft_adapts_fused_experts(model, layout):
        gated = {"gate_proj", "up_proj"} & set(training.lora_targets)
        if len(gated) == 1:
            # _convert_peft_config_moe: "Cannot convert PEFT target(s) gate_proj without also targeting
            # up_proj because they are fused into gate_up_proj"
            return _bad(
                f"lora_targets {list(training.lora_targets)}: peft moves {model.name}'s MLP targets onto its "
                "fused experts, whose gate and up projections are one parameter (gate_up_proj); target "
                "both or neither",
                "lora_targets",
                "lora_targets",
            )
    model_parallel = method_parallel_violation(training, layout)
    if model_parallel is not None:
        return model_parallel
    mlp_targets = set(training.lora_targets) & set(MLP_LINEAR)
    if (
        training.method is not Method.FULL
        and layout.ep > 1
        and mlp_targets
        and params.peft_moves_mlp_targets(model)
    ):
        # _convert_peft_config_moe rewrites the targets by model type: under DeepSpeed's MoE layers the
        # MLP names adapt nothing (measured with per-expert Linears in a qwen3_moe model: attention
        # adapters only), while the estimate counted an adapter per expert (stop 44 review)
        return _bad(
            f"lora_targets {sorted(mlp_targets)} with ep = {layout.ep}: peft moves {model.name}'s MLP "
            "targets onto its fused experts by model type, and under an expert-parallel MoE layer they adapt "
            "nothing; use ep = 1 (the fused experts take the adapters), or attention targets only",
            "peft_ep",
            "ep",
        )
    if (
        training.method is Method.QLORA
        and layout.framework is Framework.FSDP
        and layout.zero_stage >= 2
        and model_states.peft_adapts_fused_experts(model, layout)
        and model_states.fused_expert_adapted_weights(model, training)[0]
    ):
        # QLoRA shards on FSDP1 with peft's wrap policy, each adapter a unit of its own, and peft's
        # ParamWrapper builds the adapted expert weight from lora_A / lora_B outside their forward:
        # sharded there, the step fails (huggingface/peft#3080, open; fine-tuning review, stop 45)
        return _bad(
            f"qlora with lora_targets {sorted(mlp_targets)} on fsdp: peft adapts {model.name}'s fused "
            "experts through lora_A / lora_B weights it reads outside their own forward, which QLoRA's "
            "FSDP1 units leave sharded there, and the step fails (huggingface/peft#3080); use deepspeed, "
            "LoRA (FSDP2 gathers the whole decoder layer), or attention targets only",
            "peft_fused_experts_fsdp1",
            "framework",
        )
    if training.mtp_num_layers and not caps.multi_token_prediction:
        # transformers' DeepseekV3ForCausalLM drops the MTP modules; torchtitan and DeepSpeed build none
        return _bad(
            f"mtp_num_layers {training.mtp_num_layers}: {layout.framework.value} trains no multi-token "
            "prediction (Megatron-Core --mtp-num-layers does)",
            "mtp",
            "mtp_num_layers",
        )
    if training.mtp_num_layers and model.position_embedding is PositionEmbedding.LEARNED:
        # megatron/training/arguments.py: MTP supports rope or no position embedding only
        return _bad("mtp_num_layers with learned position embeddings: Megatron's MTP takes rope or none",
                    "mtp", "mtp_num_layers")  # fmt: skip
    if training.base_autocast and not caps.fp32_base_under_autocast:
        return _bad(
            f"base_dtype fp32 with precision {training.precision.value}: {layout.framework.value} casts the "
            f"whole model to {training.precision.value} (DeepSpeed's engine: module.bfloat16() / .half() "
            "with its bf16 / fp16 config), so the base cannot stay fp32",
            "base_dtype",
            "base_dtype",
        )
    if training.optimizer_implementation is OptimizerImplementation.FOREACH and not caps.torch_optimizer:
        return _bad(
            f"optimizer_implementation foreach with {layout.framework.value}: its optimizer is its own fused "
            "one (DeepSpeed FusedAdam, Megatron's Transformer Engine FusedAdam), not torch.optim's; leave "
            "optimizer_implementation out or use framework fsdp",
            "optimizer_implementation",
            "optimizer_implementation",
        )
    if training.optimizer not in caps.optimizers:
        runs = ", ".join(sorted(o.value for o in caps.optimizers))
        return _bad(f"optimizer {training.optimizer.value}: {layout.framework.value} trains with {runs}",
                    "optimizer", "optimizer")  # fmt: skip
    if layout.offload_optimizer is not Offload.NONE and training.optimizer not in caps.offloaded_optimizers:
        runs = ", ".join(sorted(o.value for o in caps.offloaded_optimizers))
        return _bad(
            f"offload_optimizer {layout.offload_optimizer.value} with optimizer {training.optimizer.value}: "
            f"{layout.framework.value} steps only {runs} on the host; keep the optimizer on the GPU "
            "(offload_optimizer none) or use one of those",
            "offload_optimizer",
            "offload_optimizer",
        )
    if layout.optimizer_in_backward and not caps.optimizer_in_backward:
        return _bad(
            f"{layout.framework.value} cannot fuse the optimizer into backward",
            "optimizer_in_backward",
            "optimizer_in_backward",
        )
    return None


def recompute_violation(model: ModelSpec, layout: Layout, caps: Capabilities) -> Violation:
    """The recompute policy must be one the framework has; recompute_num_layers goes with full
    recompute in a framework that can recompute some layers only, at most a stage's layers."""
    name = layout.framework.value
    if layout.recompute not in caps.recompute_modes:
        allowed = sorted(mode.value for mode in caps.recompute_modes)
        return _bad(
            f"{name} has no recompute {layout.recompute.value} (allowed {allowed})", "recompute", "recompute"
        )
    every, field = layout.recompute_every_n_layers, "recompute_every_n_layers"
    if every is not None:
        if not caps.layer_interval_recompute:
            return _bad(f"{name} cannot checkpoint every N-th layer only: {field} {every}", field, field)
        if layout.recompute is not Recompute.FULL:
            return _bad(f"{field} needs recompute full, got {layout.recompute.value}", field, field)
        if every == 1:
            return _bad(f"{field} 1 checkpoints every layer: that is recompute full", "unused", field)
        most = max(pipeline.rank_layer_counts(model.num_layers, layout))
        if every > most:
            return _bad(f"{field} {every} > the {most} layers a pipeline rank holds at most: nothing would "
                        "be checkpointed, that is recompute none", "unused", field)  # fmt: skip
    modules_bad = recompute_modules_violation(model, layout)
    if modules_bad is not None:
        return modules_bad
    n, field = layout.recompute_num_layers, "recompute_num_layers"
    if n is None:
        return None
    if not caps.partial_recompute:
        return _bad(f"{name} cannot recompute only some layers: recompute_num_layers {n}", field, field)
    if layout.recompute is not Recompute.FULL:
        return _bad(f"recompute_num_layers needs recompute full, got {layout.recompute.value}", field, field)
    largest = max(pipeline.stage_layers(model.num_layers, layout))
    if n > largest:
        return _bad(
            f"recompute_num_layers {n} > {largest}, the most layers of a (virtual) pipeline stage",
            field,
            field,
        )
    return None


def recompute_modules_violation(model: ModelSpec, layout: Layout) -> Violation:
    """Megatron's --recompute-modules go with selective recompute, and each must checkpoint
    something in this model (Megatron skips a module it cannot apply, e.g. mlp on MoE layers)."""
    field = "recompute_modules"
    modules = layout.recompute_modules
    if modules is None:
        return None
    if layout.recompute is not Recompute.SELECTIVE:
        got = layout.recompute.value
        return _bad(f"{field} needs recompute selective (Megatron), got {got}", field, field)
    kinds = {params.is_moe_layer(model, index) for index in range(model.num_layers)}
    moe, shared = model.moe is not None, model.moe is not None and model.moe.num_shared_experts > 0
    # what each module needs in the model to act on (Megatron-Core transformer_layer.py, moe_layer.py)
    needs = {
        RecomputeModule.MLP: (False in kinds, "a dense (non-MoE) layer: Megatron ignores mlp on MoE layers"),
        RecomputeModule.MOE: (moe, "an MoE layer"),
        RecomputeModule.MOE_ACT: (moe, "an MoE layer"),
        RecomputeModule.SHARED_EXPERTS: (shared, "shared experts"),
        RecomputeModule.MLA_UP_PROJ: (model.mla is not None, "multi-latent attention"),
        RecomputeModule.LAYERNORM: (
            moe or model.mla is not None,
            "a norm Transformer Engine leaves unfused (MLA's input norm, an MoE layer's pre-MLP norm); "
            "the dense layer's norms are fused into the next Linear",
        ),
    }
    for module in modules:
        present, what = needs.get(module, (True, ""))
        if not present:
            return _bad(f"{field} {module.value} needs {what}; {model.name} has none", "unused", field)
    if RecomputeModule.MOE in modules and RecomputeModule.MOE_ACT in modules:
        return _bad(f"{field} moe already recomputes the experts' activation: drop moe_act", "unused", field)
    return None


def moe_a2a_overlap_violation(model: ModelSpec, layout: Layout, training: TrainingSpec) -> Violation:
    """Megatron's EP all-to-all overlap: the rules TransformerConfig.__post_init__ enforces."""
    field = "moe_a2a_overlap"
    if not layout.moe_a2a_overlap:
        return None
    if not FRAMEWORK_CAPABILITIES[layout.framework].moe_a2a_overlap:
        return _bad(f"{field} is Megatron's --overlap-moe-expert-parallel-comm", field, field)
    if model.moe is None or layout.ep == 1:
        return _bad(
            f"{field} overlaps expert-parallel all-to-alls: needs an MoE model and ep > 1", "unused", field
        )
    if layout.pp > 1 and layout.virtual_pipeline_stages == 1:
        why = f"{field} with pp > 1 needs the interleaved schedule (virtual_pipeline_stages > 1)"
        return _bad(why, field, field)
    if layout.recompute is Recompute.FULL or RecomputeModule.MOE in layout.selective_modules:
        return _bad(f"{field} needs recompute none or selective without the moe module", field, field)
    if training.mtp_num_layers > 1:
        # transformer_config.py (Megatron-LM @d98e8a6): "MTP supports at most one layer when enabling
        # overlap_moe_expert_parallel_comm"; plans proposed it with 2 MTP layers (Megatron review)
        why = (
            f"{field} with mtp_num_layers {training.mtp_num_layers}: Megatron overlaps at most one MTP layer"
        )
        return _bad(why, field, field)
    return None


# The dies HybridEP is built and published for: Hopper (sm_90) and Blackwell (sm_100); it moves tokens with
# TMA over NVLink and RDMA (deepseek-ai/DeepEP hybrid-ep docs/README_Hybrid-EP.md: H100, B200, GB200;
# TORCH_CUDA_ARCH_LIST "9.0 10.0"; Megatron-Core MoE README: HybridEP on "GB200, B200, H100").
FLEX_DISPATCHER_CHIPS = frozenset({"gh100", "gb100"})


def moe_dispatcher_violation(model: ModelSpec, cluster: ClusterSpec, layout: Layout) -> Violation:
    """Megatron's flex token dispatcher: Megatron only, an MoE model with ep > 1 (TransformerConfig:
    'DeepEP dispatcher requires TPxEP > 1'), whole experts on each rank (with etp > 1 it dispatches
    over the etp x ep group, each token to top_k x etp shards: not modelled), on Hopper or Blackwell."""
    field = "moe_dispatcher"
    if layout.moe_dispatcher is MoeDispatcher.ALLTOALL:
        return None
    if not FRAMEWORK_CAPABILITIES[layout.framework].flex_dispatcher:
        why = f"{field} flex is Megatron-Core's flex token dispatcher; {layout.framework.value} has none"
        return _bad(why, field, field)
    if model.moe is None or layout.ep == 1:
        return _bad(f"{field} flex dispatches routed tokens: needs an MoE model and ep > 1", "unused", field)
    if layout.expert_tp > 1:
        why = f"{field} flex with expert tensor parallelism {layout.expert_tp} is not modelled: set etp 1"
        return _bad(why, field, field)
    chip, nvlink = flex_dispatcher_hardware(cluster)
    if chip not in FLEX_DISPATCHER_CHIPS:
        die = chip or "a GPU of unnamed die"
        dies = ", ".join(sorted(FLEX_DISPATCHER_CHIPS))
        why = f"{field} flex (HybridEP) runs on Hopper or Blackwell GPUs ({dies}), not {die}"
        return _bad(why, field, field)
    if not nvlink:
        # no figure of this cluster's link: the search shares this answer across clusters of one die
        # and NVLink presence (flex_dispatcher_hardware), whatever their PCIe bandwidth
        why = (
            f"{field} flex (HybridEP) moves tokens inside a node over NVLink; this cluster's GPUs are "
            "joined no faster than their PCIe host link"
        )
        return _bad(why, field, field)
    return None


def flex_dispatcher_hardware(cluster: ClusterSpec) -> tuple[str, bool]:
    """What ``moe_dispatcher_violation`` reads of the hardware: the GPU's die, and whether the GPUs
    of a node share NVLink (their link beats the PCIe host link; one GPU per node needs none)."""
    nvlink = (
        cluster.gpus_per_node == 1
        or cluster.intra_node_bandwidth_bytes_per_s > cluster.gpu.pcie_bandwidth_bytes_per_s
    )
    return cluster.gpu.chip, nvlink


def compile_violation(layout: Layout, training: TrainingSpec, caps: Capabilities) -> Violation:
    if layout.torch_compile is Compile.NONE:
        return None
    if caps.torch_compile is not None:
        return _bad(f"torch_compile with {layout.framework.value}: {caps.torch_compile}", "torch_compile",
                    "torch_compile")  # fmt: skip
    if training.method is Method.QLORA:
        return _bad("torch_compile with qlora: bitsandbytes' NF4 matmuls break the compiled graph (not "
                    "modelled)", "torch_compile", "torch_compile")  # fmt: skip
    return None


def tp_comm_overlap_compile_violation(layout: Layout, caps: Capabilities) -> Violation:
    """torchtitan's Async TP is inductor's micro-pipeline TP pass (torch/_inductor/fx_passes/
    micro_pipeline_tp.py): without a compiled model there is no graph to rewrite, and torchtitan
    refuses the config."""
    if layout.tp_comm_overlap and caps.tp_comm_overlap_needs_compile and layout.torch_compile is Compile.NONE:
        return _bad(f"tp_comm_overlap with {layout.framework.value} is torchtitan's Async TP "
                    "(--compile.enable_async_tensor_parallel), an inductor graph pass: it needs "
                    "torch_compile model or model_and_loss", "tp_comm_overlap",
                    "tp_comm_overlap")  # fmt: skip
    return None


def activation_offload_violation(layout: Layout, caps: Capabilities) -> Violation:
    if (
        layout.activation_offload
        and caps.activation_offload_needs_full_recompute
        and layout.recompute is not Recompute.FULL
    ):
        return _bad(
            "deepspeed offloads activation checkpoints only: set recompute full",
            "activation_offload",
            "activation_offload",
        )
    return None


def layout_violation(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, training: TrainingSpec
) -> Violation:
    """The first rule the layout breaks, or None: the rules above, in this order."""
    caps = FRAMEWORK_CAPABILITIES[layout.framework]
    # One expression, evaluated left to right up to the first violation (an exception is truthy):
    # the search asks this of every family it builds, so no per-call closures.
    return (
        batch_split_violation(training, layout)
        or world_violation(cluster, layout)
        or encoder_violation(model, layout)
        or tensor_parallel_violation(model, layout.tp)
        or megatron_width_violation(model, layout)
        or sharding_violation(layout, caps)
        or pipeline_split_violation(model, layout)
        or interleaving_violation(layout, caps)
        # accumulation_steps is valid once batch_split_violation passed
        or schedule_batches_violation(layout, layout.accumulation_steps(training.global_batch_size))
        or zero_with_pipeline_violation(layout, caps)
        or context_violation(model, layout, training)
        or ulysses_violation(model, layout)
        or sequence_parallel_violation(training, layout)
        or expert_tensor_violation(model, layout)
        or expert_violation(model, layout)
        or megatron_moe_sequence_parallel_violation(model, layout)
        or training_violation(model, cluster, layout, training, caps)
        or fused_optimizer_batches_violation(layout, layout.accumulation_steps(training.global_batch_size))
        or recompute_violation(model, layout, caps)
        or moe_a2a_overlap_violation(model, layout, training)
        or moe_dispatcher_violation(model, cluster, layout)
        or unused_switch_violation(cluster, layout)
        or hybrid_shard_violation(cluster, layout)
        or peer_access_violation(cluster, layout)
        or tp_comm_overlap_compile_violation(layout, caps)
        or megatron_precision_violation(training, layout)
        or unused_split_flag_violation(layout)
        or activation_offload_violation(layout, caps)
        or compile_violation(layout, training, caps)
    )


def validate_layout(model: ModelSpec, cluster: ClusterSpec, layout: Layout, training: TrainingSpec) -> None:
    """Raise ``InvalidLayout`` for the first rule the layout breaks; return None if it can run."""
    violation = layout_violation(model, cluster, layout, training)
    if violation is not None:
        raise violation


@functools.lru_cache(maxsize=4096)  # bounded: n comes from requests (batch sizes, GPU counts)
def divisors(n: int) -> tuple[int, ...]:
    """Positive divisors of ``n``, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}))
