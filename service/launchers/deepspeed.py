"""DeepSpeed target (pinned: deepspeed 0.19.8): ds_config.json, the `deepspeed` launch line, a hostfile.

Keys and rules follow deepspeed/runtime/config.py (batch assertion: train_batch_size ==
micro * accumulation * the ranks it counts, see ``batch_ranks``) and runtime/zero/config.py
(pydantic, extra=forbid).
The parser accepts some mistakes silently, so this module never emits: unknown top-level keys,
``offload_param`` below stage 3, NVMe offload below stage 3, or ``"auto"`` (HF-only) values.
"""

from __future__ import annotations

import json
from typing import Any

from service.estimator.model_states import (
    DS_SUB_GROUP_ELEMENTS,
    deepspeed_bf16_optimizer,
    deepspeed_buckets,
    deepspeed_param_swap_buffer_elements,
)
from service.estimator.params import stage_parameter_counts
from service.estimator.types import (
    Method,
    ModelSpec,
    Offload,
    Optimizer,
    Plan,
    Precision,
    Recompute,
    RouterScore,
)
from service.frameworks import FRAMEWORKS
from service.launchers.common import (
    HYPERPARAMETERS,
    JSON,
    MASTER_PORT,
    SHELL,
    TEXT,
    TRAIN_SCRIPT,
    Artifact,
    Raw,
    Refusal,
    Target,
    Unsupported,
    Word,
    accumulation,
    activation_offload_refusal,
    full_logits_refusal,
    gradient_checkpointing_duty,
    hyperparameter_note,
    model_duties,
    peft_artifacts,
    pipeline_split,
    refuse,
    script,
    shell_command,
    steps_duty,
    stored_nf4_storage_refusal,
    world_refusal,
    z3_leaf_duty,
)

CONFIG_NAME = "ds_config.json"
HOSTFILE_NAME = "hostfile"
LAUNCH_NAME = "deepspeed_launch.sh"
NVME_PATH = "/local_nvme"  # offload swap directory on each node; must exist and be fast local NVMe


def partition_method(plan: Plan) -> str:
    """PipelineModule's partition_method for the estimated split, '' when none gives it.

    An even split: balance the decoder layers alone ('type:' regex on their class name, which
    DeepSpeed searches case-insensitively); a split derived with the embedding and loss counted as a
    layer each: 'uniform' over the layer specs [embedding, the decoder layers, the head], which since
    DeepSpeed 0.10.1 gives each stage units // stages specs and the first units % stages one more
    (runtime/utils.py partition_uniform), as the estimate shares them (estimator.pipeline), whether
    or not the stages divide the units: Qwen2.5-7B's 28 layers on pp 8 are 30 specs, 4 4 4 4 4 4 3 3
    (it was refused as Megatron's even-units rule; pipeline review)."""
    split = pipeline_split(plan)
    if split.even:
        return "type:DecoderLayer"
    if not split.explicit and split.embedding and split.loss:
        return "uniform"
    return ""


def moe_routing_problem(model: ModelSpec) -> str | None:
    """Why the MoE layers the script builds at ep > 1 (``deepspeed.moe.layer.MoE``: TopKGate and
    MOELayer in deepspeed/moe/sharded_moe.py) cannot compute this model's MoE block, or None. Its gate
    is a bias-free h x E linear, a softmax over every expert, the top k chosen and, for k >= 2, their
    weights divided by their sum (top2gating, topkgating); top-1 weights by the raw probability
    (top1gating). It has no plain shared expert (``use_residual`` is PR-MoE's learned mix of an MLP,
    not DeepSeek's or Qwen2-MoE's sum), no per-expert score bias, group-limited choice or scaling
    factor. Where the model routes otherwise, the layout would train another model than the one
    named. A router the model leaves unstated is the layer's own."""
    moe = model.moe
    if moe is None:
        return None
    differs = []
    if moe.num_shared_experts:
        differs.append(f"{moe.num_shared_experts} shared expert(s)")
    if moe.router_bias:
        differs.append("a router bias")
    router = model.moe_router
    if router is not None:
        if router.score is not RouterScore.SOFTMAX:
            differs.append(f"{router.score.value} scores")
        if router.score_correction_bias:
            differs.append("a per-expert score correction bias")
        if router.num_groups is not None:
            differs.append(f"group-limited routing ({router.group_top_k} of {router.num_groups} groups)")
        if router.top_k_scaling_factor != 1.0:
            differs.append(f"routed weights scaled by {router.top_k_scaling_factor:g}")
        if moe.top_k > 1 and not router.normalize_top_k:
            differs.append(f"its top-{moe.top_k} weights not renormalised")
        if moe.top_k == 1 and router.normalize_top_k:
            differs.append("its top-1 weight renormalised to 1")
    if not differs:
        return None
    return (
        f"ep > 1 builds deepspeed.moe.layer.MoE, whose gate (a softmax over the experts, the top-k "
        f"weights renormalised for k >= 2) cannot route as this model does: {', '.join(differs)}"
    )


def structure_refusal(model: ModelSpec, tp: int, pp: int, cp: int, ep: int) -> str | None:
    """The refusals of ``engine_refusal`` that read the parallel degrees (and, for ep > 1, the
    model's MoE block) alone, and where no target runs DeepSpeed's Ulysses (cp > 1). Every target
    that runs DeepSpeed shares them (Accelerate's plugin and the HF Trainer run data parallelism, and
    Accelerate DeepSpeed's ALST Ulysses, alone; Slurm and Kubernetes wrap this target's entry point),
    so no launcher runs such a split."""
    if ep > 1 and (routing := moe_routing_problem(model)) is not None:
        return routing
    if cp > 1 and (tp > 1 or pp > 1 or ep > 1):
        return (
            "DeepSpeed's Ulysses (cp) runs through Accelerate's ALST integration alone, which splits "
            "nothing else: tp = pp = ep = 1 (the ds_config has no sequence parallelism)"
        )
    # AutoTP training takes every ZeRO stage since 0.19.4, which dropped the stage <= 2 assertion
    # (runtime/engine.py, _configure_tensor_parallel_states: "AutoTP + ZeRO stage 3 is supported for
    # both inference and training"); the pipeline engine it never joins
    if tp > 1 and pp > 1:
        return (
            "DeepSpeed AutoTP training (tensor_parallel.autotp_size) does not combine with the "
            "pipeline engine"
        )
    return None


def refusal(plan: Plan) -> Refusal:
    """Why this target (the deepspeed launcher and its ds_config.json) cannot run the plan as
    estimated, or None: DeepSpeed's rules (``engine_refusal``), and Ulysses, which it cannot ask for:
    its sequence parallelism lives in the model code (ALST's UlyssesSPAttentionHF, registered by
    Accelerate's ParallelismConfig: the accelerate target renders it)."""
    if plan.layout.cp > 1 and Target.DEEPSPEED in FRAMEWORKS[plan.layout.framework].targets:
        return (
            f"cp={plan.layout.cp}: the deepspeed launcher has no Ulysses sequence parallelism (ds_config "
            "cannot ask for it); the accelerate target runs it (ALST, sp_backend deepspeed)"
        )
    return engine_refusal(plan)


def engine_refusal(plan: Plan) -> Refusal:
    """Why DeepSpeed cannot run the plan as estimated, or None: the rules of its config parser and
    engines, checked without building the config, whichever target launches it."""
    lo = plan.layout
    if (world := world_refusal(plan)) is not None:
        return world
    if Target.DEEPSPEED not in FRAMEWORKS[lo.framework].targets:
        return f"the layout is for {lo.framework}, not DeepSpeed"
    if (logits := full_logits_refusal(plan) or activation_offload_refusal(plan)) is not None:
        return logits
    if (structural := structure_refusal(plan.model, lo.tp, lo.pp, lo.cp, lo.ep)) is not None:
        return f"tp={lo.tp} pp={lo.pp} cp={lo.cp} ep={lo.ep}: {structural}"
    if (partition := eight_bit_partition_refusal(plan) or stored_nf4_storage_refusal(plan)) is not None:
        return partition
    if lo.pp > 1 and lo.zero_stage >= 2:
        return (
            f"ZeRO-{lo.zero_stage} with pp={lo.pp}: DeepSpeed's PipelineEngine asserts that ZeRO-2 "
            "and ZeRO-3 are incompatible with pipeline parallelism"
        )
    if lo.sequence_parallel and lo.tp > 1:
        return (
            f"sequence_parallel with tp={lo.tp}: DeepSpeed AutoTP has no Megatron-style sequence "
            "parallelism (norm and dropout activations stay replicated over the TP group)"
        )
    if lo.pp > 1 and not partition_method(plan):
        return (
            f"pipeline split {list(pipeline_split(plan).stages)}: DeepSpeed's PipelineModule partitions "
            "'uniform'ly over all layer specs, by 'parameters' or by a layer 'type:'; it cannot place "
            "these counts (an even split, or the embedding and loss counted as a layer each, it can)"
        )
    if lo.overlap_grad_reduce and (lo.zero_stage == 0 or lo.pp > 1):
        return (
            f"overlap_grad_reduce with ZeRO-{lo.zero_stage}, pp={lo.pp}: DeepSpeed overlaps the "
            "gradient reduce (overlap_comm) only in the ZeRO optimizer, and its PipelineEngine "
            "forces overlap_comm off below stage 3"
        )
    if lo.offload_params is not Offload.NONE and lo.zero_stage < 3:
        return (
            f"offload_params={lo.offload_params} with ZeRO-{lo.zero_stage}: offload_param is only "
            "read by ZeRO stage 3 (silently ignored below)"
        )
    if lo.offload_optimizer is Offload.NVME and lo.zero_stage < 3:
        return "NVMe optimizer offload is available only with ZeRO stage 3"
    if lo.offload_optimizer is not Offload.NONE and lo.zero_stage == 0:
        return "optimizer offload needs ZeRO stage 1, 2 or 3"
    if plan.training.precision is Precision.BF16_PURE and lo.zero_stage == 0:
        return "bf16 master weights and optimizer states need ZeRO stage 1-3"
    offloaded = lo.offload_optimizer is not Offload.NONE
    if (
        plan.training.precision is Precision.BF16_PURE
        and offloaded
        and plan.training.optimizer is not Optimizer.ADAMW
    ):
        # base_optimizer.py _configure_master_weights -> stage_1_and_2.py _enforce_cpu_offload /
        # stage3.py _enforce_optimizer_offload: type(optimizer) is DeepSpeedCPUAdam (DeepSpeed review)
        return (
            f"optimizer {plan.training.optimizer.value} with bf16 master weights and optimizer offload: "
            "DeepSpeed offloads bf16 master weights with DeepSpeedCPUAdam only (adamw)"
        )
    return None


def _offload(device: Offload) -> dict[str, Any]:
    block: dict[str, Any] = {"device": str(device), "pin_memory": True}
    if device is Offload.NVME:
        block["nvme_path"] = NVME_PATH
    return block


def zero_block(plan: Plan) -> dict[str, Any]:
    """zero_optimization, in runtime/zero/config.py's spelling.

    Bucket sizes and overlap_comm come from ``model_states.deepspeed_buckets``, the function the
    memory model counts them with (overlap_comm from ``Layout.overlap_grad_reduce``, which the
    time model reads too; None is DeepSpeed's default: true at stage 3, false below).
    """
    lo = plan.layout
    zero: dict[str, Any] = {"stage": lo.zero_stage}
    if lo.zero_stage == 0:
        return zero
    b = deepspeed_buckets(plan.model, lo)
    zero |= {
        "overlap_comm": b.overlap_comm,
        "contiguous_gradients": True,
        "reduce_scatter": True,
        "reduce_bucket_size": b.reduce_bucket_elements,
    }
    if lo.zero_stage < 3:
        zero |= {"allgather_partitions": True, "allgather_bucket_size": b.allgather_bucket_elements}
    else:
        zero |= {
            "stage3_prefetch_bucket_size": b.prefetch_bucket_elements,
            "stage3_param_persistence_threshold": b.param_persistence_threshold,
            "stage3_max_live_parameters": b.max_live_parameters,
            "stage3_max_reuse_distance": b.max_reuse_distance,
            "sub_group_size": DS_SUB_GROUP_ELEMENTS,
            "stage3_gather_16bit_weights_on_model_save": True,
        }
    if lo.offload_optimizer is not Offload.NONE:
        zero["offload_optimizer"] = _offload(lo.offload_optimizer)
    if lo.offload_params is not Offload.NONE:
        zero["offload_param"] = _offload(lo.offload_params)
        if lo.offload_params is Offload.NVME:
            # a shard past the default buffer trips the swapper's assertion at init
            buffer = deepspeed_param_swap_buffer_elements(plan.model, lo, plan.cluster)
            zero["offload_param"]["buffer_size"] = buffer
    return zero


def _precision(plan: Plan) -> dict[str, Any]:
    precision = plan.training.precision
    if precision.stores_fp32:
        return {}  # fp32; tf32 too: ds_config has no TF32 switch (the script sets it, render's header)
    if precision is Precision.FP16:
        # loss_scale 0 = dynamic loss scaling, starting at 2**16.
        return {
            "fp16": {
                "enabled": True,
                "loss_scale": 0,
                "initial_scale_power": 16,
                "loss_scale_window": 1000,
                "hysteresis": 2,
                "min_loss_scale": 1,
            }
        }
    bf16: dict[str, Any] = {"enabled": True}
    if precision is Precision.BF16_PURE:
        bf16 |= {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
    return {"bf16": bf16}  # fp8 GEMMs come from the model code (Transformer Engine), not ds_config


# The optimizers ds_config does not name, as the training script builds them (the estimate's states:
# model_states.moment_bytes).
SCRIPT_OPTIMIZERS = {
    # fused: the foreach step (torch's default on CUDA) adds the weight decay into a new gradient-sized
    # tensor (_multi_tensor_sgd), which the estimate does not hold (optimizer review)
    Optimizer.SGD: "torch.optim.SGD(momentum=0.9, fused=True)",
    Optimizer.ADAMW_8BIT: "bitsandbytes.optim.AdamW8bit",
    Optimizer.ADAFACTOR: "transformers.optimization.Adafactor",
}


def _optimizer(plan: Plan) -> dict[str, Any]:
    # DeepSpeed builds these itself (DeepSpeedCPUAdam under offload); other optimizers come
    # from the training script.
    kinds = {Optimizer.ADAMW: "AdamW", Optimizer.LION: "Lion"}
    kind = kinds.get(plan.training.optimizer)
    if kind is None:
        return {}
    hp = HYPERPARAMETERS
    params: dict[str, Any] = {"lr": hp.lr, "betas": [hp.beta1, hp.beta2], "weight_decay": hp.weight_decay}
    if kind == "AdamW":
        params["eps"] = hp.eps
    return {"optimizer": {"type": kind, "params": params}}


# bitsandbytes passes a tensor's element count to its optimizer kernels as a C int32 (functional.py,
# backends/cuda/ops.py: ct.c_int32(g.numel())): a larger count wraps negative and the kernel updates
# nothing
BNB_MAX_ELEMENTS = 2**31 - 1


def eight_bit_partition_refusal(plan: Plan) -> Refusal:
    """bitsandbytes' 8-bit AdamW over ZeRO-1/2's flat partition of a dense model's full training (and
    the pipeline's BF16_Optimizer at ZeRO-0, which partitions as ZeRO-1 does): one 1-D fp32 tensor per
    parameter group and rank (stage_1_and_2.py single_partition_of_fp32_groups), the
    largest pipeline stage's parameters over tp and the data-parallel shard; past ``BNB_MAX_ELEMENTS``
    its kernels get a wrapped count (an optimizer review: Llama 3.1 8B over two ranks is 4.0e9). ZeRO-3
    steps sub-groups of at most sub_group_size (1e9) elements; an MoE model's groups split dense from
    expert parameters, each smaller."""
    lo, training = plan.layout, plan.training
    flat = lo.zero_stage in (1, 2) or deepspeed_bf16_optimizer(lo, training.precision)
    if (
        training.optimizer is not Optimizer.ADAMW_8BIT
        or not flat
        or training.method is not Method.FULL
        or plan.model.moe is not None
    ):
        return None
    elements = max(stage_parameter_counts(plan.model, lo)) / lo.tp / (lo.dp * lo.cp)
    if elements <= BNB_MAX_ELEMENTS:
        return None
    return (
        f"adamw_8bit over ZeRO-{lo.zero_stage}'s flat fp32 partition of {elements:,.0f} elements per rank: "
        f"bitsandbytes' kernels count elements in an int32 (at most {BNB_MAX_ELEMENTS:,}); use ZeRO-3 "
        "(sub-groups of 1e9), more data-parallel ranks, or adamw"
    )


def batch_ranks(plan: Plan) -> int:
    """``counted_ranks`` of the plan's layout."""
    lo = plan.layout
    return counted_ranks(dp=lo.dp, tp=lo.tp, pp=lo.pp)


def counted_ranks(*, dp: int, tp: int, pp: int) -> int:
    """The world size in DeepSpeed's batch assertion (runtime/config.py, DeepSpeedConfig.__init__),
    which its config print logs as world_size and its train_batch_size and samples/s count.

    With a pipeline, PipelineModule's topology is the mpu and the count is its data-parallel size.
    Without one, AutoTP (config-driven, or HF Trainer's tp_model_init) passes no mpu, so the count is
    dist.get_world_size(): every rank, tensor-parallel peers included, although those peers read the
    same samples. train_batch_size is then tp times the samples per optimizer step, which stays
    micro * accumulation * dp; HF Trainer's check (world_size * micro * accumulation) agrees. Under
    Ulysses (cp > 1, tp = 1: Accelerate's ALST) the mpu is ALST's, without get_data_parallel_world_size,
    and the count is world / sequence-parallel size: dp again.
    """
    return dp if pp > 1 else dp * tp


def ds_config(plan: Plan) -> dict[str, Any]:
    """The ds_config.json dict; raises Unsupported where DeepSpeed cannot run the layout."""
    refuse(Target.DEEPSPEED, engine_refusal(plan))
    lo = plan.layout
    micro, accum = lo.micro_batch_size, accumulation(plan)
    config: dict[str, Any] = {
        "train_batch_size": micro * accum * batch_ranks(plan),
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": HYPERPARAMETERS.clip_grad_norm,
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }
    config |= _precision(plan)
    config |= _optimizer(plan)
    if plan.training.optimizer in SCRIPT_OPTIMIZERS and lo.zero_stage >= 1:
        # the script's optimizer is none of runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS: without
        # this, engine.py _do_optimizer_sanity_check asserts at deepspeed.initialize (DeepSpeed review)
        config["zero_allow_untested_optimizer"] = True
    config["zero_optimization"] = zero_block(plan)
    if lo.recompute is not Recompute.NONE:
        # Configures deepspeed.checkpointing (Megatron-DeepSpeed style model code); HF models
        # turn on gradient checkpointing in the script instead.
        config["activation_checkpointing"] = {
            "partition_activations": lo.tp > 1,
            "cpu_checkpointing": False,  # activation_offload is refused (common.activation_offload_refusal)
            "contiguous_memory_optimization": False,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    if lo.tp > 1:
        config["tensor_parallel"] = {"autotp_size": lo.tp}
    if lo.pp > 1:
        # The script builds deepspeed.pipe.PipelineModule(num_stages=pp, partition_method=this).
        config["pipeline"] = {"stages": lo.pp, "partition": partition_method(plan)}
        if lo.recompute is Recompute.FULL:
            # the pipeline engine checkpoints its layers only past an interval of 0, the default
            # (runtime/config.py get_pipeline_config; pipe/engine.py sets module.activation_checkpoint_
            # interval from it): without it a pp 2 "recompute full" run kept every activation, 24.5
            # GiB where 2.6 were estimated (recompute review)
            config["pipeline"]["activation_checkpoint_interval"] = 1
            # the embedding is checkpointed too (pipe/module.py _is_checkpointable: every layer with
            # parameters), whose integer inputs the reentrant checkpoint cannot take: train_batch then
            # fails "loss must be a scalar tensor with grad_fn" (change review, DeepSpeed 0.19.8 on the
            # CPU); pipe/engine.py reads use_reentrant from this block
            config["pipeline"]["use_reentrant"] = False
    return config


def config_artifact(plan: Plan, target: Target = Target.DEEPSPEED) -> Artifact:
    """ds_config.json as every target that runs DeepSpeed ships it (byte-identical across targets).

    Raises Unsupported (naming ``target``) where DeepSpeed cannot run the layout.
    """
    try:
        config = ds_config(plan)
    except Unsupported as exc:
        if exc.target is target:
            raise
        raise Unsupported(target, exc.reason) from exc
    return Artifact(
        name=CONFIG_NAME, target=target, media_type=JSON, content=json.dumps(config, indent=2) + "\n"
    )


def hostfile(plan: Plan) -> str:
    """One `host slots=N` line per node; the host names are placeholders to replace."""
    lines = ["# Replace node-<i> with the nodes' host names (passwordless ssh from the first node)."]
    lines += [f"node-{i} slots={plan.cluster.gpus_per_node}" for i in range(plan.cluster.num_nodes)]
    return "\n".join(lines) + "\n"


def launch_words(plan: Plan) -> list[Word]:
    cluster = plan.cluster
    words: list[Word] = ["deepspeed"]
    if cluster.num_nodes > 1:
        words += [
            f"--hostfile={HOSTFILE_NAME}",
            f"--num_nodes={cluster.num_nodes}",
            f"--num_gpus={cluster.gpus_per_node}",
            Raw('--master_addr="${MASTER_ADDR}"'),
            Raw('--master_port="${MASTER_PORT}"'),
        ]
    else:
        words += [f"--num_gpus={cluster.gpus_per_node}", f"--master_port={MASTER_PORT}"]
    words += [TRAIN_SCRIPT, "--deepspeed", "--deepspeed_config", CONFIG_NAME]
    return words


def uses_nvme(plan: Plan) -> bool:
    """Whether ds_config swaps optimizer states or parameters to ``NVME_PATH``."""
    return Offload.NVME in (plan.layout.offload_optimizer, plan.layout.offload_params)


def nvme_duty(plan: Plan) -> str:
    """Where DeepSpeed's NVMe offload swaps: ds_config's nvme_path, which DeepSpeed creates if it can
    (swap_tensor/optimizer_utils.py: os.makedirs(swap_folder, exist_ok=True)) wherever it is: on a
    root disk, not the NVMe the estimate timed, or a PermissionError for a user who may not create it
    (a platform review)."""
    if not uses_nvme(plan):
        return ""
    need = ""
    if plan.estimate is not None and plan.estimate.memory.nvme_per_node_bytes:
        need = f", with {plan.estimate.memory.nvme_per_node_bytes / 2**30:,.0f} GiB free per node (estimated)"
    return (
        f"\nnvme offload: ds_config swaps to nvme_path {NVME_PATH}: every node must have its local NVMe "
        f"mounted there, writable by the job{need}; elsewhere DeepSpeed makes the folder on whatever disk "
        "holds it, not the NVMe the estimate timed."
    )


def model_code_duties(plan: Plan, accelerate: bool = False) -> str:
    """What the training script's model code must build for DeepSpeed to run the layout as estimated
    (a pipeline module, MoE layers, Transformer Engine layers): ds_config.json cannot ask for them,
    whichever launcher starts DeepSpeed (this target's, or Accelerate's DeepSpeed plugin:
    ``accelerate``, where the script hands its optimizer to accelerator.prepare, not to
    deepspeed.initialize)."""
    header = ""
    if plan.layout.pp > 1:
        # recompute full: every layer checkpointed by the pipeline module itself (ds_config's pipeline
        # block says so too), not by transformers' switch, which a PipelineModule of layer specs has not
        checkpoint = ", activation_checkpoint_interval=1" if plan.layout.recompute is Recompute.FULL else ""
        # a tied head is the embedding's weight on the last stage: DeepSpeed keeps the two copies in step
        # (its tied-gradient all-reduce, which the estimate times) only for TiedLayerSpecs of one key
        tied = (
            " The embedding and the head must be deepspeed.pipe.TiedLayerSpec('embed', ...) of one key, so "
            "that the head shares the embedding's weight as estimated (plain LayerSpecs train an untied "
            "head)."
            if plan.model.tied_embeddings
            else ""
        )
        header += (
            f"\n{TRAIN_SCRIPT} must build deepspeed.pipe.PipelineModule(num_stages={plan.layout.pp}, "
            f"partition_method={partition_method(plan)!r}{checkpoint}) over [embedding, decoder layers, "
            f"head] specs.{tied}"
        )
    if plan.layout.ep > 1:
        # the estimate splits the experts over tp as well; DeepSpeed's MoE replicates them by default
        split = ", enable_expert_tensor_parallelism=True" if plan.layout.tp > 1 else ""
        # the capacity the estimate pads each expert to, where it is not DeepSpeed's default (1.0)
        factor = plan.layout.moe_capacity_factor
        capacity = f", capacity_factor={factor:g}" if factor is not None and factor != 1.0 else ""
        # the routing the estimate is of: MoE's own defaults are num_experts=1 and k=1 (top-1)
        experts = plan.model.moe
        routing = "" if experts is None else f"num_experts={experts.num_experts}, k={experts.top_k}, "
        size = f"hidden_size={plan.model.hidden_size}, {routing}ep_size={plan.layout.ep}"
        # top-2's second expert as the model chooses it: by score, not GShard's sampling (Gumbel noise
        # on the logits: the layer's default top2_2nd_expert_sampling=True)
        second = ", top2_2nd_expert_sampling=False" if experts is not None and experts.top_k == 2 else ""
        moe = f"deepspeed.moe.layer.MoE({size}{split}{capacity}{second})"
        header += f"\n{TRAIN_SCRIPT} must build MoE layers as {moe}."
        if plan.layout.zero_stage in (1, 2):
            # stage_1_and_2.py _configure_moe_settings asserts it; only Muon's groups are split for it
            header += (
                f"\n{TRAIN_SCRIPT} must pass deepspeed.initialize(model_parameters=...) through "
                "deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer: ZeRO-"
                f"{plan.layout.zero_stage} needs the expert parameters in their own 'moe' groups."
            )
    header += z3_leaf_duty(plan)
    if plan.training.precision is Precision.FP8:
        header += "\nfp8: the model code must use Transformer Engine layers; ds_config runs bf16 around them."
    if plan.layout.pp == 1:
        header += gradient_checkpointing_duty(plan)
    if (built := SCRIPT_OPTIMIZERS.get(plan.training.optimizer)) is not None:
        # ds_config has an optimizer block for AdamW and Lion only (_optimizer): without one DeepSpeed
        # steps the client optimizer it is given (deepspeed.initialize(optimizer=...))
        call = "deepspeed.initialize(optimizer=...)"
        if accelerate:
            call = "accelerator.prepare(model, optimizer, ...)"
        header += (
            f"\noptimizer {plan.training.optimizer.value}: {TRAIN_SCRIPT} must build {built} and pass it to "
            f"{call}, as estimated (ds_config names no optimizer)."
        )
    elif accelerate and _optimizer(plan):
        # accelerate 1.15 accelerator.py _prepare_deepspeed: a torch optimizer beside ds_config's
        # optimizer block is a ValueError; DummyOptim stands for the one DeepSpeed builds (a review)
        kind = _optimizer(plan)["optimizer"]["type"]
        header += (
            f"\noptimizer {plan.training.optimizer.value}: ds_config.json builds DeepSpeed's {kind}, as "
            f"estimated; {TRAIN_SCRIPT} must pass accelerate.utils.DummyOptim(model.parameters()) to "
            "accelerator.prepare in its place (Accelerate refuses a torch optimizer beside ds_config's)."
        )
    return header


def render(plan: Plan) -> list[Artifact]:
    refuse(Target.DEEPSPEED, refusal(plan))  # Ulysses too, which the shared ds_config leaves to Accelerate
    config = config_artifact(plan)
    header = "DeepSpeed 0.19.8 launcher: starts every rank over ssh (pdsh) from this node."
    header += model_code_duties(plan) + nvme_duty(plan) + hyperparameter_note()
    if plan.layout.tp > 1 and plan.layout.pp == 1:
        header += (
            f"\ntrain_batch_size counts AutoTP's {plan.layout.tp} tensor-parallel peers, which read the same "
            "samples (DeepSpeed's batch check counts every rank: batch_ranks): its sample counts and "
            f"throughput logs read {plan.layout.tp}x the {plan.training.global_batch_size} sequences a step "
            "trains."
        )
    if plan.training.precision is Precision.TF32:
        header += (
            f"\ntf32: {TRAIN_SCRIPT} must set torch.backends.cuda.matmul.allow_tf32 = True (ds_config has no "
            "TF32 switch; without fp16/bf16 blocks it trains fp32)."
        )
    header += model_duties(plan) + steps_duty(plan)
    artifacts = [
        config,
        *peft_artifacts(plan, Target.DEEPSPEED),
        Artifact(
            name=LAUNCH_NAME,
            target=Target.DEEPSPEED,
            media_type=SHELL,
            content=script(plan, [shell_command(launch_words(plan))], header=header, every_node=False),
        ),
    ]
    if plan.cluster.num_nodes > 1:
        artifacts.append(
            Artifact(name=HOSTFILE_NAME, target=Target.DEEPSPEED, media_type=TEXT, content=hostfile(plan))
        )
    return artifacts
