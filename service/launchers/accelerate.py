"""Accelerate target (pinned: accelerate 1.15.0): the YAML `accelerate config` writes, and the launch line.

Schema from accelerate/commands/config/config_args.py (ClusterConfig; unknown top-level keys fail
at load) and commands/launch.py (nested deepspeed_config / megatron_lm_config /
parallelism_config keys are copied verbatim into CLI arguments, so they carry their CLI names;
fsdp_config keys carry the ``fsdp_`` prefix). Nested keys are not checked at load time, so this
module spells each one as launch.py declares it.
"""

from __future__ import annotations

from typing import Any

import yaml

from service.estimator.defaults import for_gpu
from service.estimator.model_states import (
    hsdp_replicas,
    megatron_fp8_params,
    megatron_grads_in_fp32,
    megatron_precision_aware_optimizer,
)
from service.estimator.types import (
    Attention,
    Compile,
    Framework,
    Method,
    MoeDispatcher,
    Offload,
    Optimizer,
    Plan,
    Precision,
    Recompute,
)
from service.launchers import deepspeed, megatron
from service.launchers.common import (
    MASTER_PORT,
    SHELL,
    TRAIN_SCRIPT,
    YAML,
    Artifact,
    Raw,
    Refusal,
    Target,
    Word,
    accumulation,
    activation_offload_refusal,
    comment_lines,
    compiled_fp32_refusal,
    fsdp_reduce_duty,
    full_logits_refusal,
    gradient_checkpointing_duty,
    hf_decoder_layer,
    hyperparameter_note,
    layout_summary,
    load_dtype_duty,
    megatron_overlaps_grad_reduce,
    model_duties,
    peft_artifacts,
    pipeline_split,
    refuse,
    script,
    sharded_8bit_refusal,
    shell_command,
    steps_duty,
    stored_nf4_storage_refusal,
    tf32_environment,
    world_refusal,
)

CONFIG_NAME = "accelerate_config.yaml"
LAUNCH_NAME = "accelerate_launch.sh"
TARGET = Target.ACCELERATE


def _mixed_precision(plan: Plan) -> str:
    precision = plan.training.precision
    if precision.stores_fp32:
        return "no"  # tf32: fp32, with the launch script's TF32 switch (common.tf32_environment)
    if precision is Precision.FP16:
        return "fp16"
    lo = plan.layout
    if precision is Precision.BF16_PURE and lo.framework is Framework.FSDP and lo.zero_stage >= 2:
        # accelerate's FSDP2 upcasts every parameter to fp32 under any mixed precision
        # (utils/fsdp_utils.py: param.data = param.data.to(torch.float32) where mixed_precision != "no"):
        # pure bf16 trains with none, the model loaded in bf16 (common.load_dtype_duty; a launch review)
        return "no"
    return "bf16"  # bf16_pure elsewhere: autocast over a model loaded in bf16; fp8 is refused


def refusal(plan: Plan) -> Refusal:
    """Why Accelerate cannot run the plan as estimated, or None."""
    if (world := world_refusal(plan)) is not None:
        return world
    if (logits := full_logits_refusal(plan) or activation_offload_refusal(plan)) is not None:
        return logits
    if (tf32 := compiled_fp32_refusal(plan)) is not None:
        return tf32
    lo = plan.layout
    if lo.framework is Framework.MEGATRON and (job := megatron.job_refusal(plan.model, plan.training)):
        return job  # before the plugin's own limits: the plugin trains Megatron-LM's GPT model
    if lo.framework is Framework.MEGATRON and (hardware := megatron.hardware_refusal(plan.cluster.gpu)):
        return hardware  # the plugin builds Megatron-LM's model with its default Transformer Engine layers
    if lo.framework is Framework.DEEPSPEED:
        reason = _deepspeed_refusal(plan)
    elif lo.framework is Framework.FSDP:
        reason = _fsdp_refusal(plan)
    else:
        reason = _megatron_refusal(plan)
    if reason is not None:
        return reason
    if lo.framework is not Framework.DEEPSPEED and plan.training.precision is Precision.FP8:
        # DeepSpeed layouts take precision from ds_config.json
        return "fp8 needs an fp8_config backend (Transformer Engine) that is not emitted here"
    if lo.torch_compile is Compile.MODEL:
        return (
            "the dynamo backend compiles the model's forward, the loss of HF models with it: model_and_loss"
        )
    return None


# ParallelismConfig's sp_attn_implementation for the estimate's attention (utils/dataclasses.py
# DeepSpeedSequenceParallelConfig: flash_attention_2/3 or sdpa; eager and flex_attention refused,
# since ALST passes position_ids, not an attention mask)
SP_ATTENTION = {Attention.FLASH: "flash_attention_2", Attention.SDPA: "sdpa"}


def _sp_attention(plan: Plan) -> str | None:
    """The plan's attention as ParallelismConfig names it (the GPU's, where the request left it)."""
    attention = for_gpu(plan.training, plan.cluster.gpu, plan.model).attention
    return None if attention is None else SP_ATTENTION.get(attention)


def _deepspeed_refusal(plan: Plan) -> Refusal:
    lo = plan.layout
    if lo.tp > 1 or lo.pp > 1:
        return (
            f"tp={lo.tp} pp={lo.pp}: Accelerate's DeepSpeed plugin drives data parallelism (ZeRO) and "
            "Ulysses only; use the deepspeed target"
        )
    if lo.cp > 1 and (ulysses := _ulysses_refusal(plan)) is not None:
        return ulysses
    return deepspeed.engine_refusal(plan)  # the deepspeed target's ds_config.json


def _ulysses_refusal(plan: Plan) -> Refusal:
    """Why Accelerate's ALST integration (ParallelismConfig sp_backend deepspeed: DeepSpeed's
    UlyssesSPAttentionHF registered with transformers, accelerator.py prepare) cannot run cp > 1."""
    lo, training = plan.layout, plan.training
    if lo.ep > 1:
        return (
            f"cp={lo.cp} with ep={lo.ep}: Accelerate's ALST splits the sequence over data-parallel ranks only"
        )
    if _sp_attention(plan) is None:
        attention = for_gpu(training, plan.cluster.gpu, plan.model).attention
        return (
            f"cp={lo.cp} with attention {attention}: ALST's Ulysses "
            "runs flash_attention_2/3 or sdpa (eager and flex_attention are refused: it passes "
            "position_ids, not a mask)"
        )
    if training.method is Method.QLORA:
        return f"cp={lo.cp} with qlora: ALST registers with a transformers model, not a bitsandbytes NF4 one"
    return None


def _fsdp_refusal(plan: Plan) -> Refusal:
    lo = plan.layout
    if lo.recompute_every_n_layers is not None:
        return "fsdp_activation_checkpointing wraps every decoder layer, not every N-th"
    if lo.zero_stage == 0:
        if lo.tp > 1 or lo.pp > 1 or lo.cp > 1 or lo.ep > 1:
            return "tp/pp/cp/ep without sharding: Accelerate's MULTI_GPU is plain DDP"
        if lo.recompute is Recompute.SELECTIVE_OP:
            return "per-op selective AC is torchtitan's; Accelerate checkpoints whole decoder layers"
        return None
    if lo.zero_stage == 1:
        return "FSDP has no optimizer-state-only sharding (ZeRO-1)"
    if (eight_bit := sharded_8bit_refusal(plan) or stored_nf4_storage_refusal(plan)) is not None:
        return eight_bit
    if lo.pp > 1 or lo.ep > 1:
        return f"pp={lo.pp} ep={lo.ep}: Accelerate's FSDP v2 has no pipeline or expert parallelism"
    if lo.offload_optimizer is Offload.NVME or lo.offload_params is Offload.NVME:
        return "FSDP offloads to CPU memory only, not NVMe"
    if (lo.offload_optimizer is Offload.NONE) != (lo.offload_params is Offload.NONE):
        return (
            "FSDP2's CPUOffloadPolicy moves parameters, gradients and optimizer states together; "
            f"offload_optimizer={lo.offload_optimizer} with offload_params={lo.offload_params} "
            "is not expressible"
        )
    if lo.recompute is Recompute.SELECTIVE_OP:
        return "per-op selective AC is torchtitan's; Accelerate checkpoints whole decoder layers"
    if lo.tp > 1:
        # Accelerate's parallelism_config TP needs the model split by transformers on its device mesh
        # (accelerate's examples/torch_native_parallelism/nd_parallel.py: from_pretrained(...,
        # tp_size, tp_plan="auto", device_mesh=accelerator.torch_device_mesh)). transformers 5.24 turns
        # tp_size / tp_plan into DistributedConfig(tp_plan, tp_size) and loads on its own (pp, fsdp, tp)
        # mesh, fsdp_size 1, in place of the mesh given (modeling_utils.py from_pretrained:
        # mesh_manager.get_mesh(("pp", "fsdp", "tp"))), refusing a world larger than tp
        # (distributed/utils.py: "The parallel mesh requires ... processes"); and FSDP2 over tp ranks
        # alone has no dimension to shard (parallelism_config.py). A launch review reproduced it.
        return (
            f"tp={lo.tp} with FSDP: transformers 5.24 loads a tensor-parallel model on its own mesh of "
            "the tp ranks, not on Accelerate's parallelism_config mesh, so its FSDP with TP does not start"
        )
    if plan.training.method is Method.QLORA and (lo.cp > 1 or hsdp_replicas(lo, plan.cluster) > 1):
        # QLoRA runs on FSDP1 here (_fsdp_version); the parallelism_config's meshes are FSDP2's
        return (
            f"qlora with cp={lo.cp} or hybrid shard across nodes: Accelerate builds those meshes for "
            "FSDP2 only, which breaks bitsandbytes' NF4 weights (bitsandbytes#1945, accelerate#3874)"
        )
    replicate, shard = _dp_split(plan)
    if lo.cp > 1 and replicate > 1 and shard == 1:
        # accelerate 1.15 parallelism_config.py _validate_accelerator: "Tensor/Context parallelism
        # (tp/cp_size > 1) cannot be used with pure data parallelism (dp_replicate_size > 1 and
        # dp_shard_size == 1)" (hybrid-sharding review: the file rendered and did not start)
        return (
            f"cp={lo.cp} with dp_replicate = dp ({replicate}): Accelerate's ParallelismConfig refuses "
            "context parallelism beside pure replication (dp_shard_size 1)"
        )
    if lo.cp > 1 and for_gpu(plan.training, plan.cluster.gpu, plan.model).attention is Attention.EAGER:
        # torch's context parallelism splits the sequence inside F.scaled_dot_product_attention only:
        # eager attention would attend within each rank's shard (common.attention_duty; change review)
        return f"cp={lo.cp} with eager attention: torch's context parallelism runs inside SDPA only"
    return None


# The model types whose Megatron network MegatronLMPlugin builds as the Hugging Face model is: GPT-2
# (learned positions, GELU, LayerNorm: Megatron's GPT defaults). Its llama parser passes layers, hidden
# size, heads, vocabulary and positions only (accelerate utils/dataclasses.py parse_llama_config: no
# num_query_groups, ffn_hidden_size, swiglu, RMSNorm or rope), so Megatron builds another network;
# qwen2, mistral, gemma, phi3 and mixtral raise "Accelerate Megatron-LM integration not supports"
# (set_network_size_args). Launch review.
PLUGIN_FAITHFUL_FAMILIES = frozenset({"gpt2"})


def _megatron_refusal(plan: Plan) -> Refusal:
    lo = plan.layout
    if plan.model.family not in PLUGIN_FAITHFUL_FAMILIES:
        return (
            f"{plan.model.family}: Accelerate's MegatronLMPlugin builds Megatron's GPT from the config's "
            "layers, hidden size, heads and vocabulary only (no grouped-query attention, FFN width, SwiGLU, "
            "RMSNorm or RoPE), or refuses the model type: it would train another network; use the megatron "
            "target"
        )
    if for_gpu(plan.training, plan.cluster.gpu, plan.model).attention is Attention.EAGER:
        # the plugin builds Megatron's GPT with --attention-backend at its default, auto (Transformer
        # Engine's flash or fused kernel), and has no setting for it: eager's s x s square is not what runs
        # (the megatron target passes --attention-backend unfused; change review)
        return "attention eager: MegatronLMPlugin has no attention-backend setting; use the megatron target"
    if lo.cp > 1:
        # accelerator.py: dp_degree = num_processes // (tp_degree * pp_degree), then global_batch_size =
        # dp_degree x micro x num_micro_batches: cp x the plan's batch (launch review)
        return (
            f"cp={lo.cp}: Accelerate counts data parallelism as processes / (tp x pp), ignoring cp, so "
            "its Megatron run would train cp times the plan's global batch; use the megatron target"
        )
    if lo.recompute is not Recompute.FULL:
        # MegatronLMPlugin.__post_init__: recompute_granularity defaults to "full", method "uniform",
        # num_layers 1 (MEGATRON_LM_RECOMPUTE_*), whatever recompute_activations says (launch review)
        return (
            f"recompute {lo.recompute.value}: MegatronLMPlugin sets recompute_granularity full (method "
            "uniform, one layer per chunk) unless told otherwise, and has no setting for none; use the "
            "megatron target"
        )
    if plan.training.optimizer is not Optimizer.ADAMW:
        # the plugin passes Megatron-LM its own arguments, --optimizer left at its default adam
        asked = plan.training.optimizer.value
        return f"optimizer {asked}: MegatronLMPlugin trains Megatron-LM's default Adam"
    if lo.zero_stage > 1 or lo.offload_params is not Offload.NONE or lo.offload_optimizer is not Offload.NONE:
        return "Megatron-LM through Accelerate: ZeRO-1 (distributed optimizer) and no offload only"
    if lo.virtual_pipeline_stages > 1:
        return "Accelerate's megatron_lm_config has no virtual pipeline (interleaved) setting"
    if lo.pp > 1 and not pipeline_split(plan).even:
        return (
            f"pipeline split {list(pipeline_split(plan).stages)}: Accelerate's megatron_lm_config has "
            "no uneven-stage setting (use the megatron target)"
        )
    if lo.tp_comm_overlap or lo.moe_a2a_overlap:
        # The estimate hides TP / EP communication that this config would leave exposed.
        return (
            "Accelerate's megatron_lm_config has no --tp-comm-overlap / --overlap-moe-expert-parallel-comm "
            "setting; use the megatron target"
        )
    if lo.moe_dispatcher is not MoeDispatcher.ALLTOALL:
        return (
            f"moe_dispatcher {lo.moe_dispatcher.value}: MegatronLMPlugin has no field for "
            "--moe-token-dispatcher-type / --moe-flex-dispatcher-backend; use the megatron target"
        )
    if plan.training.mtp_num_layers:
        return "MegatronLMPlugin has no field for --mtp-num-layers; use the megatron target"
    # NVIDIA's recipes' switches, which the estimate takes unless the layout says otherwise: the
    # plugin runs Megatron-LM's own defaults (fp32 main grads, no fp8 weights, no overlapped reduce)
    recipes = {
        "--grad-reduce-in-bf16": plan.training.precision in (Precision.BF16, Precision.FP8)
        and not megatron_grads_in_fp32(lo),
        "--fp8-param-gather": megatron_fp8_params(lo, plan.training.precision),
        "--use-precision-aware-optimizer": megatron_precision_aware_optimizer(lo, plan.training),
        "--overlap-grad-reduce": megatron_overlaps_grad_reduce(lo),
    }
    if any(recipes.values()):
        flags = " / ".join(flag for flag, on in recipes.items() if on)
        return (
            f"MegatronLMPlugin has no field for {flags} (NVIDIA's recipes, which the estimate takes by "
            "default): use the megatron target, or set grad_reduce_in_fp32 true, fp8_param_gather false, "
            "precision_aware_optimizer false and overlap_grad_reduce false"
        )
    return None


def _deepspeed(plan: Plan) -> dict[str, Any]:
    """distributed_type DEEPSPEED pointing at the deepspeed target's ds_config.json.

    Inline plugin keys would run DeepSpeed with its default buckets (reduce_bucket_size 5e8,
    default overlap_comm), not the ones the memory estimate counts; the config file carries
    ``deepspeed_buckets``' sizes. With ``deepspeed_config_file`` set, DeepSpeedPlugin refuses
    the inline zero_stage / offload / accumulation / clipping / zero3_save_16bit_model keys and
    a top-level mixed_precision (utils/dataclasses.py ``_deepspeed_config_checks``; ds_config's
    bf16 / fp16 blocks decide), so only the launcher keys stay. The path is relative: the launch
    script runs from the directory that holds the files.
    """
    lo = plan.layout
    ds: dict[str, Any] = {"deepspeed_config_file": deepspeed.CONFIG_NAME}
    if lo.zero_stage == 3:
        ds["zero3_init_flag"] = True
    if plan.cluster.num_nodes > 1:
        ds["deepspeed_multinode_launcher"] = "standard"  # torchrun on every node, no ssh
    config: dict[str, Any] = {"distributed_type": "DEEPSPEED", "deepspeed_config": ds}
    if lo.cp > 1:
        # DeepSpeed's Ulysses as Accelerate runs it (ALST, accelerate >= 1.12; DeepSpeed >= 0.18.2):
        # sp ranks overlay the data-parallel ones, dp_replicate x dp_shard x sp = processes
        # (parallelism_config.py); the sequence length varies by batch (each must divide by sp)
        config["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": 1,
            "parallelism_config_dp_shard_size": lo.dp,
            "parallelism_config_sp_size": lo.cp,
            "parallelism_config_sp_backend": "deepspeed",
            "parallelism_config_sp_seq_length_is_variable": True,
            "parallelism_config_sp_attn_implementation": _sp_attention(plan),
        }
    return config


def _ds_config_artifact(plan: Plan) -> Artifact:
    """The deepspeed target's ds_config.json, byte for byte (render() de-duplicates it)."""
    return deepspeed.config_artifact(plan, TARGET)


def _fsdp(plan: Plan) -> dict[str, Any]:
    lo = plan.layout
    if lo.zero_stage == 0:
        return {"distributed_type": "MULTI_GPU"}
    fsdp: dict[str, Any] = _fsdp_version(plan) | {
        "fsdp_offload_params": lo.offload_params is Offload.CPU,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_sync_module_states": True,  # launch requires it with cpu_ram_efficient_loading
        "fsdp_activation_checkpointing": lo.recompute is Recompute.FULL,  # whole decoder layers
    }
    layer = hf_decoder_layer(plan.model.family)
    if layer is not None:  # otherwise the model's _no_split_modules decide
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = layer
    config: dict[str, Any] = {"distributed_type": "FSDP", "fsdp_config": fsdp}
    replicate, shard = _dp_split(plan)
    if lo.tp > 1 or lo.cp > 1 or replicate > 1:
        config["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": replicate,
            "parallelism_config_dp_shard_size": shard,
            "parallelism_config_tp_size": lo.tp,
            "parallelism_config_cp_size": lo.cp,
        }
    return config


def _fsdp_version(plan: Plan) -> dict[str, Any]:
    """FSDP2, but FSDP1 for QLoRA: FSDP2 breaks bitsandbytes' NF4 weights (stored in a float dtype,
    its forward goes wrong: bitsandbytes#1945; stored as uint8, accelerate leaves them unsharded on
    every GPU since accelerate#3987), while FSDP1 with flat parameters (use_orig_params false) is
    the FSDP-QLoRA path of PEFT's docs (docs/source/accelerate/fsdp.md), with the packed weights in
    bnb_config.json's quant_storage. Both reshard as the layout's stage: 3 = FULL_SHARD, 2 =
    SHARD_GRAD_OP (FSDP2: reshard_after_forward false). FSDP1 takes it as fsdp_sharding_strategy:
    launch always exports that one (default FULL_SHARD), and the plugin reads it before
    reshard_after_forward (accelerate 1.15.0 utils/launch.py, utils/dataclasses.py)."""
    full = plan.layout.zero_stage == 3
    if plan.training.method is Method.QLORA:
        return {
            "fsdp_version": 1,
            "fsdp_sharding_strategy": "FULL_SHARD" if full else "SHARD_GRAD_OP",
            "fsdp_use_orig_params": False,
        }
    return {"fsdp_version": 2, "fsdp_reshard_after_forward": full}


def _dp_split(plan: Plan) -> tuple[int, int]:
    """(replicate, shard) data-parallel degrees: HSDP replicates its shard groups
    (``model_states.hsdp_replicas``, whole by the validator)."""
    replicate = hsdp_replicas(plan.layout, plan.cluster)
    return replicate, plan.layout.dp // replicate


def _megatron(plan: Plan) -> dict[str, Any]:
    lo = plan.layout
    mlm: dict[str, Any] = {
        "megatron_lm_tp_degree": lo.tp,
        "megatron_lm_pp_degree": lo.pp,
        "megatron_lm_context_parallel_size": lo.cp,
        "megatron_lm_expert_model_parallel_size": lo.ep,
        "megatron_lm_sequence_parallelism": lo.sequence_parallel and lo.tp > 1,
        "megatron_lm_use_distributed_optimizer": lo.zero_stage == 1,
        "megatron_lm_gradient_clipping": 1.0,
        "megatron_lm_recompute_activations": False,  # full recompute only (_megatron_refusal)
    }
    if plan.model.moe is not None:
        # MegatronLMPlugin defaults expert_tensor_parallel_size to 1 (utils/dataclasses.py), not to tp
        # as Megatron-LM does: always say which the estimate is of
        mlm["megatron_lm_expert_tensor_parallel_size"] = lo.expert_tp
    # the micro-batches of a step, pipelined or not: MegatronLMPlugin sizes each data-parallel rank's
    # batch as micro x num_micro_batches (its default 1) and Megatron's schedule accumulates over
    # them (utils/dataclasses.py set_training_args, utils/megatron_lm.py get_batch_data_iterator)
    mlm["megatron_lm_num_micro_batches"] = accumulation(plan)
    # every layer keeps its input (uniform, chunks of one), or the first N of each stage (block)
    partial = lo.recompute_num_layers is not None
    mlm |= {
        "megatron_lm_recompute_granularity": "full",
        "megatron_lm_recompute_method": "block" if partial else "uniform",
        "megatron_lm_recompute_num_layers": lo.recompute_num_layers if partial else 1,
    }
    return {"distributed_type": "MEGATRON_LM", "megatron_lm_config": mlm}


def accelerate_config(plan: Plan) -> dict[str, Any]:
    """The YAML mapping; raises Unsupported where Accelerate cannot express the layout."""
    refuse(TARGET, refusal(plan))
    lo, cluster = plan.layout, plan.cluster
    if lo.framework is Framework.DEEPSPEED:
        parallel = _deepspeed(plan)
    elif lo.framework is Framework.FSDP:
        parallel = _fsdp(plan)
    else:
        parallel = _megatron(plan)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "machine_rank": 0,  # overridden per node by the launch line
        "main_process_port": MASTER_PORT,
        "main_training_function": "main",
        "num_machines": cluster.num_nodes,
        "num_processes": cluster.world_size,  # total over all machines
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if lo.framework is not Framework.DEEPSPEED:  # DeepSpeed: ds_config.json's bf16 / fp16 blocks
        config["mixed_precision"] = _mixed_precision(plan)
    if lo.torch_compile is Compile.MODEL_AND_LOSS:
        config["dynamo_config"] = {"dynamo_backend": "INDUCTOR"}
    config |= parallel
    if parallel["distributed_type"] == "MULTI_GPU" and cluster.world_size == 1:
        config["distributed_type"] = "NO"
    return dict(sorted(config.items()))


def launch_words(plan: Plan, config_path: str = CONFIG_NAME) -> list[Word]:
    words: list[Word] = ["accelerate", "launch", "--config_file", config_path]
    if plan.cluster.num_nodes > 1:
        words += [
            "--machine_rank",
            Raw('"${NODE_RANK}"'),
            "--main_process_ip",
            Raw('"${MASTER_ADDR}"'),
            "--main_process_port",
            Raw('"${MASTER_PORT}"'),
        ]
    return [*words, TRAIN_SCRIPT]


def _script_duties(plan: Plan) -> str:
    """What train.py must do for the layout's FSDP2 tensor and context parallelism, which the
    config only sets up (the device mesh): accelerate's examples/torch_native_parallelism/
    nd_parallel.py does both."""
    lo, text = plan.layout, ""
    if lo.framework is not Framework.FSDP:
        return text
    if lo.zero_stage == 0:  # plain DDP (MULTI_GPU): no fsdp_activation_checkpointing to set
        text += gradient_checkpointing_duty(plan)
    if plan.training.method is Method.QLORA and lo.zero_stage > 0:
        # FSDP1 with flat parameters (``_fsdp_version``) refuses a unit mixing frozen and trainable
        # tensors (torch/distributed/fsdp/_flat_param.py: "Must flatten tensors with uniform
        # requires_grad when use_orig_params=False"); peft's policy wraps the adapters apart, which
        # the HF Trainer applies itself (_fsdp_qlora_plugin_updates) and Accelerate does not
        text += (
            f"\nqlora on FSDP1: {TRAIN_SCRIPT} must set accelerator.state.fsdp_plugin.auto_wrap_policy = "
            "peft.utils.other.fsdp_auto_wrap_policy(model) before accelerator.prepare(model): with flat "
            "parameters each FSDP unit holds only frozen or only trainable tensors, and "
            "TRANSFORMER_BASED_WRAP alone puts a layer's NF4 base and its adapters in one."
        )
    if plan.training.optimizer is Optimizer.ADAMW:
        # the script builds the optimizer; the estimate's step allocates as this implementation does
        flag = plan.training.optimizer_implementation.value
        text += (
            f"\noptimizer: {TRAIN_SCRIPT} must build torch.optim.AdamW(..., {flag}=True), as estimated "
            "(training.optimizer_implementation); torch.optim's default on CUDA is foreach, which makes a "
            "temporary of the trainable parameters' size during the step."
        )
    elif plan.training.optimizer is Optimizer.ADAMW_8BIT and plan.training.method is Method.FULL:
        # the estimate keeps the embedding tables' states in 32 bits, as the HF Trainer registers them
        # (model_states.fsdp_adam_8bit_moment_bytes)
        text += (
            f"\noptimizer adamw_8bit: {TRAIN_SCRIPT} must build bitsandbytes.optim.AdamW8bit and, as the "
            "HF Trainer does, keep every nn.Embedding's states in 32 bits: bitsandbytes.optim."
            "GlobalOptimManager.get_instance().register_module_override(module, 'weight', "
            "{'optim_bits': 32}) for each, as estimated."
        )
    elif plan.training.optimizer is Optimizer.LION:
        # the estimate's state is bitsandbytes' 32-bit Lion's, as the HF Trainer's lion_32bit builds it
        # (model_states.state_bytes: an fp32 momentum)
        text += (
            f"\noptimizer lion: {TRAIN_SCRIPT} must build bitsandbytes.optim.Lion(..., optim_bits=32), "
            "the HF Trainer's lion_32bit: an fp32 momentum, as estimated."
        )
    elif (built := deepspeed.SCRIPT_OPTIMIZERS.get(plan.training.optimizer)) is not None:
        # the estimate's states are this optimizer's (model_states.moment_bytes): SGD with momentum
        asked = plan.training.optimizer.value
        text += f"\noptimizer {asked}: {TRAIN_SCRIPT} must build {built}, as estimated."
    if lo.cp > 1:
        text += (
            f"\ncp={lo.cp}: {TRAIN_SCRIPT} must run each forward and backward inside "
            "accelerator.maybe_context_parallel(buffers=[input_ids, labels, shift_labels, position_ids], "
            "buffer_seq_dims=[1, 1, 1, 1], no_restore_buffers=set(buffers)) with SDPA attention and "
            "explicit position_ids and shift_labels: the sequence is split there."
        )
    return text


# The Accelerator's gradient accumulation when the script passes none (accelerator.py:
# parse_choice_from_env("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", ...), every distributed type;
# `accelerate launch --gradient_accumulation_steps` sets it for DeepSpeed alone)
ACCUMULATION_ENV = "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"


def environment(plan: Plan) -> list[tuple[str, str]]:
    """What the launch exports: TF32 where asked, and for FSDP / DDP the gradient accumulation the
    Accelerator reads (DeepSpeed's is in ds_config.json, Megatron's in the plugin's config)."""
    env = tf32_environment(plan)
    if plan.layout.framework is Framework.FSDP:
        env.append((ACCUMULATION_ENV, str(accumulation(plan))))
    if plan.layout.framework is Framework.MEGATRON:
        # the plugin calls Megatron's validate_args, which asserts it with tp > 1 (launch review: the
        # megatron target exported it, this launch did not)
        env += megatron.environment(plan)
    return env


def _batch_duty(plan: Plan) -> str:
    """The micro-batch and accumulation an FSDP / DDP script must train with: no Accelerate config
    key carries them (the DeepSpeed and Megatron paths write theirs), so a script's own DataLoader
    and a missing accelerator.accumulate() trained another global batch than the one estimated."""
    lo, training = plan.layout, plan.training
    steps = accumulation(plan)
    text = (
        f"\nbatch: {TRAIN_SCRIPT}'s DataLoader must give each process micro-batches of {lo.micro_batch_size} "
        f"sequences of {training.seq_len} tokens, and each step must run inside "
        f"accelerator.accumulate(model): with {ACCUMULATION_ENV}={steps} (exported below) the Accelerator "
        f"steps the optimizer every {steps} micro-batches, a global batch of {lo.micro_batch_size} x "
        f"dp {lo.dp} x {steps} = {training.global_batch_size} sequences, as estimated."
    )
    if lo.zero_stage >= 2 and steps > 1:
        # accelerate 1.15 accumulate(): no_sync (set_requires_gradient_sync(False)) on every micro-batch
        # but the last unless the plugin's sync_each_batch; FSDP2 then keeps each unit's unsharded
        # gradient (_fsdp_param_group.py: to_accumulated_grad_if_needed) - the whole model's on every
        # rank, which the estimate (one reduce-scatter a micro-batch, sharded gradients) does not hold
        # (a launch review: 70B on 32 H100 would keep 263 GiB of fp32 gradients per GPU)
        text += (
            f" FSDP shards the gradients only if every micro-batch reduces them: build "
            f"Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps={steps}, "
            "sync_each_batch=True)); without sync_each_batch, accumulate() skips the reduce-scatter and "
            "every rank keeps the whole model's unsharded gradients."
        )
    return text


def _ds_batch_duty(plan: Plan) -> str:
    """The micro-batch a DeepSpeed script's DataLoader must give: Accelerate takes
    train_micro_batch_size_per_gpu from ds_config.json where it is a number (accelerate 1.15
    accelerator.py _prepare_deepspeed: the DataLoader's batch_size is read only for "auto") and never
    checks the DataLoader against it, so a larger DataLoader batch trains a larger global batch than
    ds_config and the estimate say, silently (a review)."""
    lo, training = plan.layout, plan.training
    return (
        f"\nbatch: {TRAIN_SCRIPT}'s DataLoader must give each process micro-batches of {lo.micro_batch_size} "
        f"sequences of {training.seq_len} tokens, ds_config's train_micro_batch_size_per_gpu: Accelerate "
        "does not check the DataLoader against it, and DeepSpeed steps the optimizer every "
        f"{accumulation(plan)} micro-batches (gradient_accumulation_steps), a global batch of "
        f"{training.global_batch_size} sequences as estimated only with that micro-batch."
    )


def _ulysses_duty(plan: Plan) -> str:
    """What train.py must do for DeepSpeed's Ulysses as Accelerate runs it (ALST): accelerate's
    examples/alst_ulysses_sequence_parallelism/sp-alst.py."""
    cp = plan.layout.cp
    if cp == 1:
        return ""
    return (
        f"\ncp={cp}: DeepSpeed's Ulysses (ALST): {TRAIN_SCRIPT} must build the model with transformers "
        "(from_pretrained, attn_implementation as the config's sp_attn_implementation), pass its "
        "DataLoader to accelerator.prepare (which shards each batch's sequence over the sp group), give "
        "batches position_ids and labels, and average the loss over the sp group weighted by each "
        "shard's labelled tokens (torch.distributed.nn.functional.all_gather over DeepSpeed's group, "
        "deepspeed.runtime.sequence_parallel.parallel_state_sp.get_sequence_parallel_group(): accelerate "
        "1.15 builds no device mesh for DeepSpeed's sp, so accelerator.torch_device_mesh is None)."
    )


def duties(plan: Plan) -> str:
    """What the training script must do for the layout, and where the launch runs from: the launch
    script's header, and the Slurm script's that runs this launch (``slurm.accelerate_render``)."""
    text = (
        model_duties(plan) + _script_duties(plan) + steps_duty(plan) + fsdp_reduce_duty(plan, "accelerator")
    )
    if plan.layout.framework is Framework.FSDP:
        text += _batch_duty(plan)
        text += load_dtype_duty(plan)
    if plan.layout.framework is Framework.DEEPSPEED:
        where = (
            f"\nRun from the directory holding {CONFIG_NAME} and {deepspeed.CONFIG_NAME} (relative paths)."
        )
        text += _ds_batch_duty(plan) + _ulysses_duty(plan)
        text += deepspeed.model_code_duties(plan, accelerate=True) + deepspeed.nvme_duty(plan)
        text += hyperparameter_note() + where
    return text


def render(plan: Plan) -> list[Artifact]:
    config = accelerate_config(plan)
    text = "\n".join(comment_lines(layout_summary(plan))) + "\n" + yaml.safe_dump(config, sort_keys=False)
    body: list[str] = []
    if plan.cluster.num_nodes > 1:
        body.append(': "${NODE_RANK:?set NODE_RANK to the index of this node, 0 on the first}"')
    body.append(shell_command(launch_words(plan)))
    header = "Accelerate 1.15.0: run on every node." + duties(plan)
    artifacts = [
        Artifact(name=CONFIG_NAME, target=TARGET, media_type=YAML, content=text),
        Artifact(
            name=LAUNCH_NAME,
            target=TARGET,
            media_type=SHELL,
            content=script(plan, body, env=environment(plan), header=header),
        ),
    ]
    if plan.layout.framework is Framework.DEEPSPEED:
        artifacts.append(_ds_config_artifact(plan))
    return [*artifacts, *peft_artifacts(plan, TARGET)]
