"""Megatron-LM target (pinned: Megatron-LM main @d98e8a6): pretrain_gpt.py arguments, torchrun script.

Flag names from megatron/training/arguments.py at that commit; the layout is checked against
the rules its validate_args and TransformerConfig enforce (divisibility of world, batch,
layers, heads; recompute granularity; distributed-optimizer prerequisites), so a layout that
Megatron would reject is reported as unsupported instead of emitted.
"""

from __future__ import annotations

import math

from service.estimator.model_states import (
    megatron_fp8_params,
    megatron_grads_in_fp32,
    megatron_master_remainders,
    megatron_precision_aware_optimizer,
)
from service.estimator.params import is_moe_layer
from service.estimator.types import (
    Attention,
    GPUSpec,
    Method,
    MlpKind,
    ModelSpec,
    MoeDispatcher,
    NormKind,
    Offload,
    Optimizer,
    Plan,
    PositionEmbedding,
    Precision,
    QKNorm,
    Recompute,
    RecomputeModule,
    RopeScalingKind,
    RouterScore,
    TrainingSpec,
)
from service.estimator.validate import binding_windows
from service.frameworks import FRAMEWORKS
from service.launchers.common import (
    HYPERPARAMETERS,
    SHELL,
    Artifact,
    Refusal,
    Target,
    Word,
    accumulation,
    activation_offload_refusal,
    converted_checkpoint_duty,
    full_logits_refusal,
    hyperparameter_note,
    megatron_overlaps_grad_reduce,
    pipeline_split,
    refuse,
    script,
    shell_command,
    torchrun_words,
    train_steps,
    world_refusal,
)

LAUNCH_NAME = "megatron_launch.sh"
ENTRY = "pretrain_gpt.py"
TARGET = Target.MEGATRON


def needs_max_connections_env(plan: Plan) -> bool:
    """validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP>1 or CP>1 (pre-Blackwell)."""
    return plan.layout.tp > 1 or plan.layout.cp > 1


def environment(plan: Plan) -> list[tuple[str, str]]:
    return [("CUDA_DEVICE_MAX_CONNECTIONS", "1")] if needs_max_connections_env(plan) else []


# megatron/training/arguments.py (NVIDIA/Megatron-LM@d98e8a6) has no TF32 argument: without --fp16 or
# --bf16 it trains fp32 at PyTorch's default matmul precision ("highest", IEEE fp32), and its default
# Transformer Engine layers issue their own cuBLASLt GEMMs, so an environment override is not known
# to reach them.
TF32_REFUSAL = (
    "tf32: Megatron-LM has no TF32 switch; without --fp16/--bf16 it trains IEEE fp32, not the TF32 "
    "matmuls this plan is timed at (estimate precision fp32 or bf16)"
)


# --optimizer (megatron/training/arguments.py, NVIDIA/Megatron-LM@d98e8a6: choices adam, sgd, muon,
# dist_muon, lion, soap, adaptive_muon; default adam, TE's FusedAdam in AdamW mode). The estimate's
# optimizers it has; 8-bit AdamW and Adafactor it has not: the file would train Adam's 12 bytes of
# states per parameter where the plan fitted the estimate's few.
OPTIMIZER_ARGS = {Optimizer.ADAMW: "adam", Optimizer.SGD: "sgd", Optimizer.LION: "lion"}


def optimizer_problems(training: TrainingSpec) -> list[str]:
    """Why Megatron-LM's --optimizer cannot be the training's optimizer (an empty list where it can)."""
    if training.optimizer in OPTIMIZER_ARGS:
        return []
    return [
        f"optimizer {training.optimizer.value}: Megatron-LM's --optimizer has adam, sgd and lion (and "
        "muon, soap), not this one; its default Adam keeps 12 bytes of states per parameter"
    ]


def refusal(plan: Plan) -> Refusal:
    """Why Megatron-LM cannot run the plan as estimated (every problem, joined), or None."""
    if (world := world_refusal(plan)) is not None:
        return world
    lo, model, seq = plan.layout, plan.model, plan.training.seq_len
    if TARGET not in FRAMEWORKS[lo.framework].targets:
        return f"the layout is for {lo.framework}, not Megatron-LM"
    if (logits := full_logits_refusal(plan) or activation_offload_refusal(plan)) is not None:
        return logits
    if (hardware := hardware_refusal(plan.cluster.gpu)) is not None:
        return hardware
    problems: list[str] = []
    if plan.training.method is not Method.FULL:
        problems.append(
            f"{plan.training.method.value}: Megatron-LM has no PEFT (NeMo / Megatron-Bridge add it)"
        )
    if lo.zero_stage > 1:
        problems.append(
            f"zero_stage={lo.zero_stage}: Megatron shards optimizer states only (distributed optimizer)"
        )
    if lo.offload_params is not Offload.NONE:
        problems.append("parameter offload is not available in Megatron-LM")
    if lo.offload_optimizer is Offload.NVME:
        problems.append("optimizer offload goes to CPU memory only, not NVMe")
    if lo.offload_optimizer is Offload.CPU and lo.zero_stage != 1:
        problems.append("--optimizer-cpu-offload needs the distributed optimizer (zero_stage 1)")
    if lo.tp_comm_overlap and not (lo.sequence_parallel and lo.tp > 1):
        problems.append(
            "tp_comm_overlap needs sequence parallelism at tp > 1 (validate_args: 'Tensor parallel "
            "communication/GEMM overlap can happen only when sequence parallelism is enabled')"
        )
    vpp = lo.virtual_pipeline_stages
    if vpp > 1 and lo.pp == 1:
        problems.append("virtual pipeline stages need pp > 1")
    if model.num_attention_heads % lo.tp:
        problems.append(f"num_attention_heads ({model.num_attention_heads}) % tp ({lo.tp}) != 0")
    groups = model.num_kv_heads
    if groups % lo.tp and lo.tp % groups:
        problems.append(f"num_query_groups ({groups}) is neither a multiple nor a divisor of tp ({lo.tp})")
    if lo.cp > 1 and seq % (2 * lo.cp):
        problems.append(f"seq_len ({seq}) % (2 * cp) ({2 * lo.cp}) != 0")
    if model.moe is not None and model.moe.num_experts % lo.ep:
        problems.append(f"num_experts ({model.moe.num_experts}) % ep ({lo.ep}) != 0")
    if model.moe is None and lo.ep > 1:
        problems.append(f"ep={lo.ep} on a dense model")
    delayed = {RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM} & set(lo.selective_modules)
    if plan.training.precision is Precision.FP8 and delayed:
        # the fp8 recipe written here is delayed scaling (_precision_args: amax history), which
        # TransformerConfig refuses with these: "Delayed scaling does not support moe_act and layernorm
        # recompute for fp8" (Megatron review)
        modules = ", ".join(sorted(delayed))
        problems.append(f"recompute_modules {modules} with fp8: Megatron's delayed scaling refuses them")
    problems += _job_problems(model, plan.training)
    problems += optimizer_problems(plan.training)
    return "; ".join(problems) if problems else None


def hardware_refusal(gpu: GPUSpec) -> str | None:
    """Why Megatron-LM as rendered here (Transformer Engine layers, --transformer-impl's default, which
    the estimate's kernels, fusions and attention rates are of) cannot run on the GPU, or None.
    Transformer Engine's support matrix starts at compute capability 8.0 (Ampere), the generations
    FlashAttention-2 needs too (its ROCm port: CDNA 2/3): a GPU without FlashAttention kernels (V100,
    T4) has none, and Megatron's context parallelism and TP overlap exist only in it."""
    if gpu.flash_attention:
        return None
    return (
        f"{gpu.name}: Megatron-LM's Transformer Engine layers need NVIDIA Ampere or newer (or AMD CDNA 2/3); "
        "its local implementation (--transformer-impl local), with other kernels, is not what is estimated"
    )


def job_refusal(model: ModelSpec, training: TrainingSpec) -> str | None:
    """Why Megatron-LM cannot train this model and training whatever the layout (``refusal`` lists
    it for every plan), or None."""
    return "; ".join(_job_problems(model, training) + optimizer_problems(training)) or None


def _job_problems(model: ModelSpec, training: TrainingSpec) -> list[str]:
    """What pretrain_gpt.py's GPT model has no flag for (the run would train another model), and
    the precisions it is not emitted with: none depends on the layout."""
    problems = []
    if model.bidirectional:
        # pretrain_gpt.py builds a causal GPTModel; Megatron-LM's BERT (pretrain_bert.py, BertModel
        # with its own heads) is not emitted here
        problems.append(
            f"{model.name} is a bidirectional encoder ({model.head.value} head): pretrain_gpt.py trains "
            "causal GPT models only (Megatron-LM's pretrain_bert.py is not emitted)"
        )
    if model.position_embedding is PositionEmbedding.ALIBI:
        problems.append("ALiBi position embeddings are not in Megatron-LM's GPT model")
    if model.mlp is MlpKind.GEGLU:
        problems.append("GeGLU MLPs are not a pretrain_gpt.py flag (only --swiglu)")
    if binding_windows(model, training.seq_len):  # a window as long as the sequence masks nothing
        problems.append("sliding-window / chunked attention layers are not emitted for Megatron-LM")
    if model.family == "llama4":
        # its chunked layers are its RoPE layers: the full ones use no position embedding (no_rope_layers),
        # and Llama4TextMoe multiplies the router scores into the experts' input; neither is emitted
        # (a Maverick plan at 8,192 tokens, its chunks then masking nothing, rendered RoPE on every layer;
        # change review)
        problems.append(
            "Llama 4's NoPE layers and router scores applied to the experts' input are not emitted for "
            "Megatron-LM here"
        )
    if model.qk_norm in (QKNorm.FULL_WIDTH, QKNorm.L2):
        problems.append(f"q/k norm {model.qk_norm.value}: --qk-layernorm normalises per head only")
    if model.attention_sinks:
        # Megatron-Core has them (softmax_type learnable, TE >= 2.8) and NVIDIA trains GPT-OSS with
        # Megatron-Bridge: not written or modelled here, which is what the refusal says (Megatron review)
        problems.append("attention sinks (GPT-OSS) are not emitted for Megatron-LM here")
    if model.moe is not None and model.moe.expert_bias:
        problems.append("biased experts (GPT-OSS) are not emitted for Megatron-LM here")
    if model.final_logit_softcapping:
        problems.append("final-logit soft-capping is not a Megatron-LM GPT option")
    if model.scaled_constants:
        # Granite's forward multiplies by them (GraniteModel); Megatron-Core has no residual multiplier,
        # and its files would train a plain Llama (2025-26 configs review)
        problems.append(
            f"{', '.join(model.scaled_constants)} (Granite's constant scalings): not Megatron-LM GPT options"
        )
    if model.parallel_attn_mlp:
        # TransformerLayer runs attention, then the MLP on its output: no flag reads both off one input
        problems.append(
            "parallel attention and MLP blocks (GPT-J/NeoX/Falcon) are not a Megatron-LM GPT option: "
            "pretrain_gpt.py's layers run the MLP after attention"
        )
    problems += _rope_problems(model) + _router_problems(model)
    if training.mtp_num_layers and position_embedding_type(model) == "yarn":
        # validate_args: "Multi-Token Prediction (MTP) is not supported with yarn position embedding"
        problems.append("multi-token prediction with YaRN: validate_args allows MTP with rope or none only")
    if training.precision is Precision.BF16_PURE:
        problems.append("pure bf16 (bf16 master weights and states) is not emitted for Megatron")
    if training.precision is Precision.TF32:
        problems.append(TF32_REFUSAL)
    return problems


def moe_layer_pattern(model: ModelSpec) -> str:
    """--moe-layer-freq as a Python list expression of 0 (dense) / 1 (MoE) per layer, run-length
    encoded ("[0]*3+[1]*58" for DeepSeek-V3), or "1" when every layer is MoE."""
    flags = [1 if is_moe_layer(model, i) else 0 for i in range(model.num_layers)]
    if all(flags):
        return "1"
    runs: list[list[int]] = []
    for flag in flags:
        if runs and runs[-1][0] == flag:
            runs[-1][1] += 1
        else:
            runs.append([flag, 1])
    return "+".join(f"[{flag}]*{count}" if count > 1 else f"[{flag}]" for flag, count in runs)


def _attention_args(model: ModelSpec) -> list[str]:
    mla = model.mla
    if mla is None:
        args = []
        if model.num_kv_heads != model.num_attention_heads:
            args += ["--group-query-attention", "--num-query-groups", str(model.num_kv_heads)]
        if model.head_dim * model.num_attention_heads != model.hidden_size:
            args += ["--kv-channels", str(model.head_dim)]
        if model.qk_norm is QKNorm.PER_HEAD:
            args.append("--qk-layernorm")  # RMSNorm(head_dim) on q and k (Qwen3, Gemma 3)
        return args
    # DeepSeek MLA: --qk-layernorm normalises the q and kv latents (q_a_layernorm, kv_a_layernorm)
    args = ["--multi-latent-attention", "--kv-lora-rank", str(mla.kv_lora_rank)]
    if mla.q_lora_rank is not None:
        args += ["--q-lora-rank", str(mla.q_lora_rank)]
    args += [
        "--qk-head-dim", str(mla.qk_nope_head_dim),
        "--qk-pos-emb-head-dim", str(mla.qk_rope_head_dim),
        "--v-head-dim", str(mla.v_head_dim),
        "--qk-layernorm",
    ]  # fmt: skip
    return args


# ---------------------------------------------------------------- hyperparameters without parameters
# The model's RoPE base and scaling, norm epsilon and router, so that the run trains the checkpoint's
# model. Each is emitted whenever the ModelSpec states it, even where it equals Megatron's default
# (--rotary-base 10000, --norm-epsilon 1e-5, softmax routing): the file then says which model it
# trains, and a change of Megatron's defaults cannot change the model. Not stated (None, an explicit
# architecture): Megatron's default. Names and types from megatron/training/arguments.py @d98e8a6
# (_add_network_size_args: --position-embedding-type, --rotary-base type=int, --use-rope-scaling,
# --rope-scaling-factor, --rotary-seq-len-interpolation-factor type=int, --yarn-*; _add_mla_args:
# --rotary-scaling-factor, --mscale, --mscale-all-dim; --rope-type) and from the TransformerConfig
# fields ArgumentGroupFactory turns into flags (megatron/core/transformer/transformer_config.py:
# layernorm_epsilon as --norm-epsilon, moe_router_* as --moe-router-*).

# RotaryEmbedding._apply_scaling (megatron/core/models/common/embeddings/rotary_pos_embedding.py)
# fixes low_freq_factor 1, high_freq_factor 4 and original_max_position_embeddings 8192; and the
# GPT model pretrain_gpt.py builds takes GPTModelConfig.rope_scaling_factor's default, 8.0:
# gpt_config_from_args (megatron/training/argument_utils.py) passes --use-rope-scaling but not
# --rope-scaling-factor, which only pretrain_vlm.py reads.
LLAMA3_FIXED = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}  # fmt: skip
# MLATransformerConfig's YaRN fields no argument sets (transformer_config.py); the MLA's
# YarnRotaryEmbedding is built without correction_range_round_to_int, whose default is True
MLA_YARN_FIXED = {"original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
                  "truncate": True}  # fmt: skip


def _yarn_mscale(factor: float, mscale: float) -> float:
    # transformers' and Megatron's get_mscale (yarn_rotary_pos_embedding._yarn_get_mscale)
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_mscales(model: ModelSpec) -> tuple[float, float]:
    """(--mscale, --mscale-all-dim) for the model's YaRN: transformers scales cos/sin by
    get_mscale(f, mscale) / get_mscale(f, mscale_all_dim) when both are given, else by get_mscale(f)
    (_compute_yarn_parameters), Megatron always by the ratio of its two flags
    (_yarn_get_concentration_factor); MLA also scales the softmax by get_mscale(f, mscale_all_dim)^2,
    in both (DeepseekV3Attention, MLASelfAttention)."""
    scaling = model.rope_scaling
    assert scaling is not None
    if scaling.mscale and scaling.mscale_all_dim:
        return scaling.mscale, scaling.mscale_all_dim
    return 1.0, ((scaling.mscale_all_dim or 0.0) if model.mla is not None else 0.0)


def _rope_problems(model: ModelSpec) -> list[str]:
    """What Megatron's RoPE cannot express of the model's (the run would train another model)."""
    if model.position_embedding is not PositionEmbedding.ROPE:
        return []
    problems = []
    theta, local, scaling = model.rope_theta, model.rope_local_theta, model.rope_scaling
    if theta is not None and theta != int(theta):
        problems.append(f"rope_theta {theta}: --rotary-base takes an integer")
    if local is not None and (local != theta or scaling is not None):
        problems.append(
            f"RoPE base {local} unscaled on the sliding-window layers and {theta} on the others: "
            "Megatron's GPT model has one --rotary-base for every layer"
        )
    if scaling is None:
        return problems
    kind, mla = scaling.kind, model.mla is not None
    if kind in (RopeScalingKind.DYNAMIC, RopeScalingKind.LONGROPE):
        problems.append(f"{kind.value} RoPE scaling is not a Megatron-LM option")
    elif mla and kind is not RopeScalingKind.YARN:
        problems.append(f"{kind.value} RoPE scaling: Megatron's MLA takes --rope-type rope or yarn only")
    elif kind is RopeScalingKind.LLAMA3:
        differ = [f"{k} {getattr(scaling, k)}" for k, v in LLAMA3_FIXED.items() if getattr(scaling, k) != v]
        if differ:
            problems.append(
                f"llama3 RoPE scaling with {', '.join(differ)}: pretrain_gpt.py @d98e8a6 applies factor 8, "
                "low_freq_factor 1, high_freq_factor 4, original 8192 whatever --rope-scaling-factor says "
                "(gpt_config_from_args does not pass it to the model)"
            )
    elif kind is RopeScalingKind.LINEAR and scaling.factor != int(scaling.factor):
        problems.append(
            f"linear RoPE scaling factor {scaling.factor}: --rotary-seq-len-interpolation-factor takes "
            "an integer"
        )
    elif kind is RopeScalingKind.YARN:
        problems += _yarn_problems(model)
    return problems


def _yarn_problems(model: ModelSpec) -> list[str]:
    scaling = model.rope_scaling
    assert scaling is not None
    problems = []
    if model.mla is not None:
        differ = [f"{k} {getattr(scaling, k)}" for k, v in MLA_YARN_FIXED.items() if getattr(scaling, k) != v]
        if differ:
            problems.append(
                f"YaRN with {', '.join(differ)}: Megatron's MLA fixes original_max_position_embeddings 4096, "
                "beta_fast 32, beta_slow 1 and truncates the correction range"
            )
    elif model.rotary_fraction < 1.0:  # YarnRotaryEmbedding's frequencies span all of kv_channels
        problems.append(f"YaRN on a partial rotary ({model.rotary_fraction}) is not a Megatron-LM option")
    factor = scaling.factor
    mscale, mscale_all_dim = yarn_mscales(model)
    megatron = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    wanted = scaling.attention_factor
    if wanted is None:
        both = scaling.mscale and scaling.mscale_all_dim
        wanted = megatron if both else _yarn_mscale(factor, 1.0)
    if not math.isclose(megatron, wanted, rel_tol=1e-9):
        problems.append(
            f"YaRN attention factor {wanted:.6g}: Megatron's --mscale / --mscale-all-dim give {megatron:.6g}"
        )
    return problems


def position_embedding_type(model: ModelSpec) -> str:
    """--position-embedding-type: YaRN is a type of its own (GPTModel's YarnRotaryEmbedding), except
    under MLA, which applies its own RoPE (--rope-type) where the GPT model applies none."""
    if model.position_embedding is not PositionEmbedding.ROPE:
        return "learned_absolute"
    scaling = model.rope_scaling
    yarn = scaling is not None and scaling.kind is RopeScalingKind.YARN
    return "yarn" if yarn and model.mla is None else "rope"


def _position_args(model: ModelSpec) -> list[str]:
    args = ["--position-embedding-type", position_embedding_type(model)]
    if model.position_embedding is not PositionEmbedding.ROPE:
        return args
    scaling = model.rope_scaling
    kind = None if scaling is None else scaling.kind
    mla = model.mla is not None
    yarn = kind is RopeScalingKind.YARN
    if model.rotary_fraction < 1.0:
        args += ["--rotary-percent", str(model.rotary_fraction)]
    if model.rope_theta is not None:
        args += ["--rotary-base", str(int(model.rope_theta))]
    if mla:
        args += ["--rope-type", "yarn" if yarn else "rope"]
    if scaling is None:
        return args
    if kind is RopeScalingKind.LLAMA3:  # the factor is not read (LLAMA3_FIXED), stated for the reader
        return [*args, "--use-rope-scaling", "--rope-scaling-factor", str(scaling.factor)]
    if kind is RopeScalingKind.LINEAR:  # positions / factor, as transformers' inv_freq / factor
        return [*args, "--rotary-seq-len-interpolation-factor", str(int(scaling.factor))]
    if yarn:
        mscale, mscale_all_dim = yarn_mscales(model)
        args += ["--rotary-scaling-factor", str(scaling.factor)]
        args += ["--mscale", str(mscale), "--mscale-all-dim", str(mscale_all_dim)]
        if not mla:  # the MLA's are fixed (MLA_YARN_FIXED)
            args += [
                "--yarn-original-max-position-embeddings", str(scaling.original_max_position_embeddings),
                "--yarn-beta-fast", str(scaling.beta_fast),
                "--yarn-beta-slow", str(scaling.beta_slow),
            ]  # fmt: skip
            if not scaling.truncate:
                args.append("--no-yarn-correction-range-round-to-int")
    return args


def _router_problems(model: ModelSpec) -> list[str]:
    """What Megatron's router (topk_routing_with_score_function and group_limited_topk,
    megatron/core/transformer/moe/moe_utils.py) cannot express of the model's."""
    router, moe = model.moe_router, model.moe
    if router is None or moe is None:
        return []
    problems = []
    softmax, k = router.score is RouterScore.SOFTMAX, moe.top_k
    if softmax and router.normalize_top_k and k == 1:
        # TransformerConfig: "Please use --moe-router-pre-softmax when topk is 1"
        problems.append(
            "a softmax router that renormalises its one expert's weight to 1: Megatron needs "
            "--moe-router-pre-softmax at top-1, which keeps the softmax probability"
        )
    if not softmax and router.normalize_top_k != (k > 1):  # Megatron renormalises exactly when k > 1
        problems.append(
            f"a sigmoid router {'with' if router.normalize_top_k else 'without'} renormalised weights at "
            f"top-{k}: Megatron renormalises sigmoid weights exactly when top-k > 1"
        )
    if router.score_correction_bias and softmax:  # TransformerConfig: sigmoid or sqrtsoftplus only
        problems.append("an expert score-correction bias on a softmax router is not a Megatron-LM option")
    if router.num_groups is not None and router.group_top_k is not None:
        # groups scored by the sum of their top (topk // group_topk) scores: the softmax
        # probabilities with --moe-router-pre-softmax, else the logits
        n = k // router.group_top_k
        if router.group_score_top_n != n:
            problems.append(
                f"groups scored by their best {router.group_score_top_n} expert score(s): Megatron's "
                f"group-limited routing sums the best top-k // group-topk = {n}"
            )
        elif softmax and router.normalize_top_k and n > 1:
            problems.append(
                "group-limited routing with renormalised softmax weights: Megatron then scores the groups "
                "on the logits, not on the probabilities"
            )
    return problems


def _router_args(model: ModelSpec) -> list[str]:
    router, moe = model.moe_router, model.moe
    if router is None or moe is None:
        return []
    args = ["--moe-router-score-function", router.score.value]
    # softmax: by default over the k selected logits (= renormalised probabilities: Mixtral, Qwen3-MoE
    # norm_topk_prob); --moe-router-pre-softmax: over every expert, the k probabilities kept as they
    # are (DeepSeek-V2, Qwen MoE without norm_topk_prob)
    if router.score is RouterScore.SOFTMAX and not router.normalize_top_k:
        args.append("--moe-router-pre-softmax")
    if router.score_correction_bias:  # DeepSeek-V3's aux-loss-free balancing bias
        args.append("--moe-router-enable-expert-bias")
    if router.num_groups is not None and router.group_top_k is not None:
        args += ["--moe-router-num-groups", str(router.num_groups)]
        args += ["--moe-router-group-topk", str(router.group_top_k)]
    if router.top_k_scaling_factor != 1.0:
        args += ["--moe-router-topk-scaling-factor", str(router.top_k_scaling_factor)]
    # Not emitted: the load-balancing loss (--moe-router-load-balancing-type, --moe-aux-loss-coeff) is
    # a training objective the ModelSpec does not carry; Megatron's default (aux_loss, coefficient 0)
    # trains without one. DeepSeek-V3's bias balances the load itself (--moe-router-bias-update-rate's
    # default 1e-3 is DeepSeek-V3's, TransformerConfig).
    return args


def _model_args(plan: Plan) -> list[str]:
    model, seq = plan.model, plan.training.seq_len
    args = [
        "--num-layers", str(model.num_layers),
        "--hidden-size", str(model.hidden_size),
        "--ffn-hidden-size", str(model.ffn_hidden_size),
        "--num-attention-heads", str(model.num_attention_heads),
    ]  # fmt: skip
    args += _attention_args(model)
    if plan.training.attention is Attention.EAGER:
        # the whole s x s square, as estimated: Transformer Engine's unfused DotProductAttention
        # (language_module.py sets NVTE_UNFUSED_ATTN alone); --attention-backend's default, auto, runs
        # its flash or cuDNN fused kernel, which the eager estimate's memory and time are not of
        args += ["--attention-backend", "unfused"]
    args += [
        "--seq-length",
        str(seq),
        "--max-position-embeddings",
        str(max(seq, model.max_position_embeddings)),
    ]
    args += _position_args(model)
    if model.mlp is MlpKind.SWIGLU:
        args.append("--swiglu")
    args += ["--normalization", "RMSNorm" if model.norm is NormKind.RMSNORM else "LayerNorm"]
    if model.norm_eps is not None:  # every norm's epsilon (TransformerConfig.layernorm_epsilon)
        args += ["--norm-epsilon", str(model.norm_eps)]
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not (model.mlp_bias or model.attn_out_bias):
        args.append("--disable-bias-linear")
        if model.qkv_bias:
            args.append("--add-qkv-bias")
    if model.moe is not None:
        moe = model.moe
        args += [
            "--num-experts", str(moe.num_experts),
            "--moe-router-topk", str(moe.top_k),
            *_router_args(model),
            "--moe-ffn-hidden-size", str(moe.expert_ffn_hidden_size),
            # the estimate's dispatch is the layout's dispatcher (step_time.ep_comm_s: alltoall or flex;
            # Megatron's default is allgather) over one grouped GEMM per rank's experts, as NVIDIA's
            # recipes run them (moe_act recompute needs it too: TransformerConfig)
            "--moe-token-dispatcher-type", plan.layout.moe_dispatcher.value,
            "--moe-grouped-gemm",
        ]  # fmt: skip
        if plan.layout.moe_dispatcher is MoeDispatcher.FLEX:
            # the backend the estimate is timed with (tuning.toml [moe_dispatch]); Megatron's default
            # is deepep (TransformerConfig.moe_flex_dispatcher_backend)
            args += ["--moe-flex-dispatcher-backend", "hybridep"]
        if moe.num_shared_experts:
            shared = moe.num_shared_experts * moe.shared_expert_ffn_hidden_size
            args += ["--moe-shared-expert-intermediate-size", str(shared)]
            if moe.shared_expert_gate:
                # Qwen2-MoE's sigmoid gate (h -> 1) on the shared expert, estimated with it:
                # SharedExpertMLP's gate_weight (TransformerConfig.moe_shared_expert_gate); without it
                # Megatron trains another model (MoE review, stop 41)
                args.append("--moe-shared-expert-gate")
        args += ["--moe-layer-freq", moe_layer_pattern(model)]
        capacity = plan.layout.moe_capacity_factor
        if capacity is not None:  # token drop, padded to capacity as estimated
            args += ["--moe-expert-capacity-factor", str(capacity)]
            args.append("--moe-pad-expert-input-to-capacity")
    if plan.training.mtp_num_layers:  # on the last pipeline stage, as the estimate places them
        args += ["--mtp-num-layers", str(plan.training.mtp_num_layers)]
    # Megatron-LM's defaults are 0.1 each: the run keeps the dropout the estimate counted
    args += [
        "--hidden-dropout",
        str(model.hidden_dropout),
        "--attention-dropout",
        str(model.attention_dropout),
    ]
    # Mock data and a null tokenizer of the model's vocabulary size: replace with
    # --data-path/--tokenizer-type/--tokenizer-model for real data.
    args += ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(model.vocab_size)]
    # The dataloader's dense causal mask, which Transformer Engine's causal attention never reads (it
    # reads a mask only for padding or arbitrary types): by default (create_attention_mask_in_dataloader)
    # GPTDataset builds a (s, s) mask on the host and get_batch_on_this_tp_rank puts a (micro-batch, 1,
    # s, s) bool tensor on every GPU, 16 GiB at 128k tokens, which the estimate does not count
    # (long-context review; NVIDIA's llama3 example scripts pass this flag, NeMo create_attention_mask=False)
    args.append("--no-create-attention-mask-in-dataloader")
    return args


def _parallel_args(plan: Plan) -> list[str]:
    lo = plan.layout
    args = [
        "--tensor-model-parallel-size", str(lo.tp),
        "--pipeline-model-parallel-size", str(lo.pp),
        "--context-parallel-size", str(lo.cp),
    ]  # fmt: skip
    if lo.ep > 1:
        args += ["--expert-model-parallel-size", str(lo.ep)]
    if lo.etp is not None:  # default (None): the tensor-parallel size
        args += ["--expert-tensor-parallel-size", str(lo.etp)]
    if lo.sequence_parallel and lo.tp > 1:  # Megatron drops it silently at tp=1
        args.append("--sequence-parallel")
    if lo.moe_a2a_overlap:  # combined 1F1B: EP all-to-alls under another micro-batch's compute
        args.append("--overlap-moe-expert-parallel-comm")
    if lo.tp_comm_overlap:  # _check: only with --sequence-parallel at tp > 1
        # Transformer Engine userbuffers (the default --transformer-impl transformer_engine).
        args.append("--tp-comm-overlap")
    args += pipeline_args(plan)
    if lo.zero_stage == 1:
        args.append("--use-distributed-optimizer")
    if megatron_overlaps_grad_reduce(lo):
        # The time model hides the reduce under backward and, with the distributed optimizer,
        # the parameter all-gather under the next forward: --overlap-param-gather, which
        # validate_args allows only with --use-distributed-optimizer and --overlap-grad-reduce.
        args.append("--overlap-grad-reduce")
        if lo.zero_stage == 1:
            args.append("--overlap-param-gather")
    precision = plan.training.precision
    if precision in (Precision.BF16, Precision.FP8) and not megatron_grads_in_fp32(lo):
        # bf16 main grads and reduce-scatter (validate_args otherwise accumulates in fp32 for --bf16)
        args.append("--grad-reduce-in-bf16")
    if megatron_fp8_params(lo, precision):  # fp8 with the distributed optimizer only (validator)
        args.append("--fp8-param-gather")
    if megatron_precision_aware_optimizer(lo, plan.training):
        # Transformer Engine's FusedAdam: the master as remainders of the bf16 weights, the main grads
        # stepped as they are (OptimizerConfig's store_param_remainders default); offload needs it
        args.append("--use-precision-aware-optimizer")
    if lo.offload_optimizer is Offload.CPU:
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0"]
    return args


def pipeline_args(plan: Plan) -> list[str]:
    """The split the plan was estimated with, in Megatron-Core's terms: even (with
    --num-layers-per-virtual-pipeline-stage when interleaved), the embedding and loss counted as layers
    (--account-for-embedding/loss-in-pipeline-split, core 0.11+), or any other split as a
    --pipeline-model-parallel-layout string (core 0.13+: E embedding, t*n decoder layers, m a
    multi-token-prediction layer, L loss, | between the pp x v virtual stages in model order)."""
    lo = plan.layout
    if lo.pp == 1:
        return []
    split = pipeline_split(plan)
    if split.even:
        per_stage = split.stages[0]
        return (
            ["--num-layers-per-virtual-pipeline-stage", str(per_stage)]
            if lo.virtual_pipeline_stages > 1
            else []
        )
    if split.accounted:
        args = ["--account-for-embedding-in-pipeline-split"] if split.embedding else []
        args += ["--account-for-loss-in-pipeline-split"] if split.loss else []
        if lo.virtual_pipeline_stages > 1:  # uneven stages take the stage count, not layers per stage
            args += ["--num-virtual-stages-per-pipeline-rank", str(lo.virtual_pipeline_stages)]
        return args
    last = len(split.stages) - 1
    tail = "m" * plan.training.mtp_num_layers + "L"  # the MTP layers sit before the loss, last stage
    cells = [
        ("E" if k == 0 else "") + (f"t*{n}" if n > 1 else "t" * n) + (tail if k == last else "")
        for k, n in enumerate(split.stages)
    ]
    return ["--pipeline-model-parallel-layout", "|".join(cells)]


def _recompute_args(plan: Plan) -> list[str]:
    recompute = plan.layout.recompute
    if recompute is Recompute.SELECTIVE and plan.layout.recompute_modules is not None:
        modules = [module.value for module in plan.layout.recompute_modules]
        return ["--recompute-granularity", "selective", "--recompute-modules", *modules]
    if recompute is Recompute.SELECTIVE:
        return ["--recompute-granularity", "selective"]  # --recompute-modules' default: core_attn
    if recompute is Recompute.FULL and plan.layout.recompute_num_layers is not None:
        # The first N layers of each (virtual) stage keep only their input, the rest everything.
        n = str(plan.layout.recompute_num_layers)
        return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", n]
    if recompute is Recompute.FULL:
        # Every layer keeps only its input: uniform over chunks of one layer.
        return [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "uniform",
            "--recompute-num-layers",
            "1",
        ]
    return []


def _precision_args(plan: Plan) -> list[str]:
    precision = plan.training.precision
    if precision is Precision.FP16:
        return ["--fp16"]
    if precision is Precision.FP8:
        return [
            "--bf16",
            "--fp8-format",
            "hybrid",
            "--fp8-amax-history-len",
            "1024",
            "--fp8-amax-compute-algo",
            "max",
        ]
    if precision is Precision.BF16:
        return ["--bf16"]
    return []


def megatron_args(plan: Plan) -> list[str]:
    """pretrain_gpt.py's arguments; raises Unsupported where validate_args would fail."""
    refuse(TARGET, refusal(plan))
    lo = plan.layout
    accumulation(plan)  # global = micro x accumulation x dp, or InvalidLayout
    hp = HYPERPARAMETERS
    return [
        *_parallel_args(plan),
        "--micro-batch-size", str(lo.micro_batch_size),
        "--global-batch-size", str(plan.training.global_batch_size),
        "--train-iters", str(train_steps(plan)),
        *_recompute_args(plan),
        *_precision_args(plan),
        *_model_args(plan),
        "--optimizer", OPTIMIZER_ARGS[plan.training.optimizer],
        "--lr", str(hp.lr), "--min-lr", str(hp.min_lr), "--lr-decay-style", "cosine",
        "--clip-grad", str(hp.clip_grad_norm), "--weight-decay", str(hp.weight_decay),
        "--adam-beta1", str(hp.beta1), "--adam-beta2", str(hp.beta2), "--adam-eps", str(hp.eps),
        "--log-interval", "10", "--eval-interval", "1000", "--eval-iters", "10",
    ]  # fmt: skip


def entry_words(plan: Plan) -> list[Word]:
    return [ENTRY, *megatron_args(plan)]


def notes(plan: Plan) -> str:
    """What the run does that the user would not assume: said in this target's launch script and in
    the Slurm / Kubernetes wrappers that run its entry point (``job.entry``: a wrapper dropped them)."""
    # what the file cannot know: said in the file, not only in our code (a fine-tune of Llama ran
    # from random weights on mock data; launch review)
    text = (
        "\nIt trains from random weights on mock data (--mock-data, a NullTokenizer of the model's\n"
        "vocabulary): to fine-tune, add --load/--pretrained-checkpoint with a Megatron checkpoint of the\n"
        "model and --finetune, and --data-path with --tokenizer-type/--tokenizer-model for real data."
    )
    text += converted_checkpoint_duty(plan, "a Megatron checkpoint (--load)") + hyperparameter_note()
    if megatron_master_remainders(plan.layout, plan.training):
        # OptimizerConfig turns store_param_remainders off below Transformer Engine 2.1, and FusedAdam
        # then keeps a 4-byte master: 2 B per parameter of the optimizer shard more (Megatron review)
        text += (
            "\nThe estimate's 2-byte master (--use-precision-aware-optimizer, store_param_remainders) needs\n"
            "Transformer Engine >= 2.1: an older one keeps a 4-byte fp32 master."
        )
    return text


def render(plan: Plan) -> list[Artifact]:
    words: list[Word] = [*torchrun_words(plan, rendezvous="c10d"), *entry_words(plan)]
    header = f"Megatron-LM (main @d98e8a6): run from the Megatron-LM checkout, where {ENTRY} lives."
    header += notes(plan)
    content = script(plan, [shell_command(words)], env=environment(plan), header=header)
    return [Artifact(name=LAUNCH_NAME, target=TARGET, media_type=SHELL, content=content)]
