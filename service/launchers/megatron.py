"""Megatron-LM target (pinned: Megatron-LM main @d98e8a6): pretrain_gpt.py arguments, torchrun script.

Flag names from megatron/training/arguments.py at that commit; the layout is checked against
the rules its validate_args and TransformerConfig enforce (divisibility of world, batch,
layers, heads; recompute granularity; distributed-optimizer prerequisites), so a layout that
Megatron would reject is reported as unsupported instead of emitted.
"""

from __future__ import annotations

from service.estimator.model_states import megatron_fp8_params, megatron_grads_in_fp32
from service.estimator.params import is_moe_layer
from service.estimator.types import (
    AttentionKind,
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
    TrainingSpec,
)
from service.frameworks import FRAMEWORKS
from service.launchers.common import (
    HYPERPARAMETERS,
    SHELL,
    Artifact,
    Refusal,
    Target,
    Word,
    accumulation,
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
    if any(kind is not AttentionKind.FULL for kind in model.layer_types):
        problems.append("sliding-window / chunked attention layers are not emitted for Megatron-LM")
    if model.qk_norm in (QKNorm.FULL_WIDTH, QKNorm.L2):
        problems.append(f"q/k norm {model.qk_norm.value}: --qk-layernorm normalises per head only")
    if model.attention_sinks:
        problems.append("attention sinks (GPT-OSS) are not a Megatron-LM GPT option")
    if model.moe is not None and model.moe.expert_bias:
        problems.append("biased experts (GPT-OSS) are not a Megatron-LM GPT option")
    if model.final_logit_softcapping:
        problems.append("final-logit soft-capping is not a Megatron-LM GPT option")
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


def _model_args(plan: Plan) -> list[str]:
    model, seq = plan.model, plan.training.seq_len
    args = [
        "--num-layers", str(model.num_layers),
        "--hidden-size", str(model.hidden_size),
        "--ffn-hidden-size", str(model.ffn_hidden_size),
        "--num-attention-heads", str(model.num_attention_heads),
    ]  # fmt: skip
    args += _attention_args(model)
    args += [
        "--seq-length",
        str(seq),
        "--max-position-embeddings",
        str(max(seq, model.max_position_embeddings)),
    ]
    if model.position_embedding is PositionEmbedding.ROPE:
        args += ["--position-embedding-type", "rope"]
        if model.rotary_fraction < 1.0:
            args += ["--rotary-percent", str(model.rotary_fraction)]
    else:
        args += ["--position-embedding-type", "learned_absolute"]
    if model.mlp is MlpKind.SWIGLU:
        args.append("--swiglu")
    args += ["--normalization", "RMSNorm" if model.norm is NormKind.RMSNORM else "LayerNorm"]
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
    if lo.offload_optimizer is Offload.CPU:
        args += [
            "--optimizer-cpu-offload",
            "--use-precision-aware-optimizer",
            "--optimizer-offload-fraction",
            "1.0",
        ]
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


def render(plan: Plan) -> list[Artifact]:
    words: list[Word] = [*torchrun_words(plan, rendezvous="c10d"), *entry_words(plan)]
    header = f"Megatron-LM (main @d98e8a6): run from the Megatron-LM checkout, where {ENTRY} lives."
    content = script(plan, [shell_command(words)], env=environment(plan), header=header)
    return [Artifact(name=LAUNCH_NAME, target=TARGET, media_type=SHELL, content=content)]
