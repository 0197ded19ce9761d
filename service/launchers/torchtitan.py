"""torchtitan target (pinned: torchtitan 0.3.0, the first release without TOML).

0.3.0 takes the model and its defaults from a config-registry function (``--module llama3
--config llama3_8b``) and overrides fields with ``--section.field`` flags (tyro), ending with
the ``activation_checkpoint:<mode>`` subcommand. Field names from torchtitan/config/configs.py
at 0.3.0 (TrainingConfig, ParallelismConfig). The model cannot be described on the command
line, so only models that match a registered flavor are rendered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.estimator.activations import CHUNKED_LOSS_CHUNKS
from service.estimator.model_states import FSDP_REDUCE_DTYPE, hsdp_replicas
from service.estimator.types import (
    Attention,
    Compile,
    Method,
    ModelSpec,
    Offload,
    Optimizer,
    Plan,
    Precision,
    Recompute,
    RopeScalingKind,
    TrainingSpec,
)
from service.estimator.validate import schedule_batches_violation, tp_comm_overlap_compile_violation
from service.frameworks import FRAMEWORKS
from service.launchers.common import (
    SHELL,
    Artifact,
    Refusal,
    Target,
    Word,
    accumulation,
    activation_offload_refusal,
    converted_checkpoint_duty,
    pipeline_split,
    refuse,
    script,
    shell_command,
    tf32_environment,
    torchrun_words,
    train_steps,
    world_refusal,
)

LAUNCH_NAME = "torchtitan_launch.sh"
TARGET = Target.TORCHTITAN
VERSION = "0.3.0"


@dataclass(frozen=True, slots=True)
class Flavor:
    """A model torchtitan builds from its registry (``--module``, ``--config``), and its shape."""

    module: str
    config: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int | None  # None: DeepSeek's MLA (no kv heads)
    vocab_size: int
    # the RoPE cache's length: Decoder.Config.update_from_config (models/common/decoder.py) raises
    # "Training sequence length ... exceeds attention RoPE maximum supported sequence length" past it
    max_seq_len: int
    ffn_hidden_size: int | None = None  # dense models: the MLP width
    num_experts: int = 0
    # the model converters the config function applies when it builds the model spec (no flag
    # undoes them: model_registry converts the config tree before any override is read)
    converters: str | None = None


# torchtitan 0.3.0's RoPE caches (models/<module>/__init__.py, each flavor's rope max_seq_len): llama3
# 131072; qwen3 40960; deepseek_v3 4096 * 4; gpt_oss 131072
LLAMA3_POSITIONS, QWEN3_POSITIONS, DEEPSEEK_V3_POSITIONS, GPT_OSS_POSITIONS = 131072, 40960, 16384, 131072

# torchtitan 0.3.0: torchtitan/models/<module>/__init__.py (the flavors' shapes) and
# config_registry.py (the --config functions; a flavor without one, e.g. qwen3 8B or 235B-A22B,
# cannot be named on the command line).
FLAVORS = (
    Flavor("llama3", "llama3_8b", 32, 4096, 32, 8, 128256, LLAMA3_POSITIONS, ffn_hidden_size=14336),
    Flavor("llama3", "llama3_70b", 80, 8192, 64, 8, 128256, LLAMA3_POSITIONS, ffn_hidden_size=28672),
    Flavor(
        "llama3",
        "llama3_405b",
        126,
        16384,
        128,
        8,
        128256,
        LLAMA3_POSITIONS,
        ffn_hidden_size=53248,
        converters="Float8LinearConverter (torchao Float8 Linears but lm_head)",
    ),
    Flavor("qwen3", "qwen3_0_6b", 28, 1024, 16, 8, 151936, QWEN3_POSITIONS, ffn_hidden_size=3072),
    Flavor("qwen3", "qwen3_1_7b", 28, 2048, 16, 8, 151936, QWEN3_POSITIONS, ffn_hidden_size=6144),
    Flavor("qwen3", "qwen3_14b", 40, 5120, 40, 8, 151936, QWEN3_POSITIONS, ffn_hidden_size=17408),
    Flavor("qwen3", "qwen3_32b", 64, 5120, 64, 8, 151936, QWEN3_POSITIONS, ffn_hidden_size=25600),
    Flavor("qwen3", "qwen3_30b_a3b", 48, 2048, 32, 4, 151936, QWEN3_POSITIONS, num_experts=128),
    Flavor(
        "deepseek_v3", "deepseek_v3_16b", 27, 2048, 16, None, 102400, DEEPSEEK_V3_POSITIONS, num_experts=64
    ),
    Flavor(
        "deepseek_v3", "deepseek_v3_671b", 61, 7168, 128, None, 129280, DEEPSEEK_V3_POSITIONS, num_experts=256
    ),
    Flavor("gpt_oss", "gpt_oss_20b", 24, 2880, 64, 8, 201088, GPT_OSS_POSITIONS, num_experts=32),
    Flavor("gpt_oss", "gpt_oss_120b", 36, 2880, 64, 8, 201088, GPT_OSS_POSITIONS, num_experts=128),
)


def flavor(model: ModelSpec) -> Flavor | None:
    """The registered flavor with the model's shape, if any."""
    experts = model.moe.num_experts if model.moe is not None else 0
    kv_heads = None if model.mla is not None else model.num_kv_heads
    for f in FLAVORS:
        shape = (
            f.num_layers,
            f.hidden_size,
            f.num_attention_heads,
            f.num_kv_heads,
            f.vocab_size,
            f.num_experts,
        )
        if shape != (model.num_layers, model.hidden_size, model.num_attention_heads, kv_heads,
                     model.vocab_size, experts):  # fmt: skip
            continue
        if f.ffn_hidden_size is None or f.ffn_hidden_size == model.ffn_hidden_size:
            return f
    return None


def job_refusal(model: ModelSpec, training: TrainingSpec) -> str | None:
    """Why torchtitan cannot train this model and training whatever the layout (``refusal`` says it
    for every plan), or None."""
    unbuilt = _model_problem(model)
    return unbuilt if unbuilt is not None else ("; ".join(_job_problems(model, training)) or None)


def _job_problems(model: ModelSpec, training: TrainingSpec) -> list[str]:
    """The training's problems (``_training_problems``), and a sequence past the flavor's RoPE cache
    (a model ``_model_problem`` passed has a flavor)."""
    problems = _training_problems(training)
    found = flavor(model)
    if found is not None and training.seq_len > found.max_seq_len:
        problems.append(
            f"seq_len {training.seq_len:,}: torchtitan {VERSION}'s {found.config} caches RoPE for "
            f"{found.max_seq_len:,} positions and refuses a longer training sequence "
            "(Decoder.Config.update_from_config)"
        )
    return problems


EXPERTS_OVER_TP = "torchtitan's EP would take the TP ranks from the experts"


def tied_pipeline_problem(model: ModelSpec, pp: int) -> str | None:
    """A pipeline of a model whose output layer is its embedding: 0.3.0's
    Decoder.Config.update_from_config raises NotImplementedError("Weight tying is not supported with
    Pipeline Parallel.") (models/common/decoder.py), before training (Qwen3 0.6B and 1.7B are built
    tied; an embeddings review saw their pp 2 plans rendered)."""
    if model.tied_embeddings and pp > 1:
        return (
            f"pp={pp} with tied embeddings: torchtitan {VERSION} supports no weight tying under pipeline "
            "parallelism"
        )
    return None


def expert_tensor_problem(tp: int, ep: int) -> str | None:
    """0.3.0's expert_parallel_degree borrows ranks from dp_shard x cp x tp: with tp > 1 the experts
    would not be tensor-parallel as estimated (expert tensor parallelism = tp). Names no degree (the
    search logs it once for every split it refuses; a layout's refusal names its own, ``refusal``)."""
    return f"ep > 1 with tp > 1: {EXPERTS_OVER_TP}" if ep > 1 and tp > 1 else None


# Every config rendered here trains with ChunkedLossWrapper (config_registry.py; components/loss.py:
# lm_head and the loss per num_chunks-th of the sequence, default 8). A chunked loss as estimated is
# its 8 chunks; the estimate's full logits are one chunk (--loss.num_chunks 1: lm_head and the loss
# over the whole sequence at once), not the 8 the config would otherwise train with.
CHUNKS = CHUNKED_LOSS_CHUNKS


# models/llama3/__init__.py: every llama3 flavor is ComplexRoPE(theta=500000, scaling="llama"),
# models/common/rope.py's scaling_factor 8 with Llama 3.1's low/high frequency factors 1 and 4 over
# the original 8192 positions: Llama 3.1's RoPE, which Llama 3 (no rope_scaling) does not have.
LLAMA3_ROPE = (500000.0, 8.0, 1.0, 4.0, 8192)


# models/qwen3/__init__.py: every qwen3 flavor is CosSinRoPE(theta=1000000.0), no scaling
QWEN3_ROPE_THETA = 1_000_000.0


def _rope_problem(found: Flavor, model: ModelSpec) -> str | None:
    """Why the flavor's RoPE is not the model's (the run would train another model), or None."""
    if found.module == "qwen3":
        # a Qwen3 shape with another base (Qwen3-Coder-30B-A3B and the 2507 releases: 10,000,000) was
        # launched on the flavor's 1,000,000 (2025-26 configs review)
        theta = model.rope_theta if model.rope_theta is not None else QWEN3_ROPE_THETA
        if math.isclose(theta, QWEN3_ROPE_THETA) and model.rope_scaling is None:
            return None
        scaled = "" if model.rope_scaling is None else f" and {model.rope_scaling.kind.value} scaling"
        return (
            f"torchtitan {VERSION}'s {found.config} applies RoPE base 1000000 without scaling; {model.name} "
            f"has base {theta:g}{scaled}"
        )
    if found.module != "llama3":
        return None
    scaling = model.rope_scaling
    ours = (
        model.rope_theta if model.rope_theta is not None else LLAMA3_ROPE[0],
        *(
            (scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
             scaling.original_max_position_embeddings)
            if scaling is not None and scaling.kind is RopeScalingKind.LLAMA3
            else (None, None, None, None)
        ),
    )  # fmt: skip
    if ours == LLAMA3_ROPE:
        return None
    has = "no RoPE scaling" if scaling is None else f"{scaling.kind.value} scaling factor {scaling.factor:g}"
    return (
        f"torchtitan {VERSION}'s {found.config} applies Llama 3.1's RoPE (base 500000, llama3 scaling "
        f"factor 8); {model.name} has base {ours[0]:g} and {has}"
    )


def _model_problem(model: ModelSpec) -> str | None:
    if model.bidirectional:
        # torchtitan's models are causal decoders (its Llama/DeepSeek attention runs is_causal=True)
        return f"torchtitan {VERSION} trains causal decoders only; {model.name} is a bidirectional encoder"
    if (found := flavor(model)) is not None and found.converters is not None:
        # config_registry.py llama3_405b: model_registry("405B", converters=[Float8LinearConverter...])
        return (
            f"torchtitan {VERSION}'s {found.config} builds the model with {found.converters}, which no flag "
            "undoes: it trains fp8 Linears (compiled, with async TP), and model converters are not "
            "emitted here, so no plan's estimate is what it runs"
        )
    if found is not None:
        return _rope_problem(found, model)
    names = ", ".join(f"{f.module}/{f.config}" for f in FLAVORS)
    return (
        f"torchtitan {VERSION} builds the model from its config registry; {model.name} matches "
        f"none of {names} (register a config function for it)"
    )


def _training_problems(training: TrainingSpec) -> list[str]:
    problems = []
    if training.method is not Method.FULL:
        # 0.3.0 has a LoRAConverter (components/lora.py); only the debug model's
        # llama3_debugmodel_float8_emulate_lora config function builds it, no flag does
        problems.append(
            f"{training.method.value}: torchtitan {VERSION}'s command line trains full models only (its "
            "LoRAConverter is built by a debug model's config function alone, by no flag)"
        )
    if training.precision in (Precision.FP16, Precision.FP8):
        problems.append(f"precision {training.precision} needs model converters not emitted here")
    if training.attention is Attention.EAGER:
        # models/common/config_utils.py: language models "always use block_causal masking" and sdpa
        # "is no longer supported for language models"; the configs build flex attention
        problems.append(
            f"attention eager: torchtitan {VERSION}'s language models run FlexAttention (attn_backend "
            "flex), nothing eager; leave attention out (or flash) for what it runs"
        )
    if training.optimizer is not Optimizer.ADAMW:
        # components/optimizer/optimizer.py _resolve_optimizer_factory: "Adam" and "AdamW" only
        problems.append(
            f"optimizer {training.optimizer.value}: torchtitan {VERSION} builds Adam or AdamW only "
            "(OptimizersContainer)"
        )
    return problems


def refusal(plan: Plan) -> Refusal:
    """Why torchtitan cannot run the plan as estimated (every problem, joined), or None."""
    if (world := world_refusal(plan)) is not None:
        return world
    lo = plan.layout
    if TARGET not in FRAMEWORKS[lo.framework].targets:
        return f"the layout is for {lo.framework}; torchtitan runs FSDP2 with TP/PP/CP"
    if (unbuilt := _model_problem(plan.model)) is not None:
        return unbuilt
    problems = _job_problems(plan.model, plan.training)
    if (offload := activation_offload_refusal(plan)) is not None:
        problems.append(offload)
    if lo.chunked_loss and plan.training.seq_len % CHUNKS:
        problems.append(
            f"seq_len {plan.training.seq_len}: ChunkedLossWrapper splits it into {CHUNKS} equal chunks"
        )
    if lo.zero_stage == 1:
        problems.append("FSDP has no optimizer-state-only sharding (ZeRO-1)")
    if lo.zero_stage == 0 and lo.dp > 1:
        # models/llama3/parallelize.py "Always run apply_fsdp_to_decoder": replicas are FSDP2 on a
        # (dp_replicate, fsdp) mesh, whose gradients are all-reduced after every backward (trainer.py
        # accumulates without set_requires_gradient_sync(False)); no DDP buckets (torchtitan review)
        problems.append(
            f"zero_stage 0 with dp={lo.dp}: torchtitan {VERSION} runs data-parallel replicas as FSDP2 on a "
            "replicate mesh, all-reducing the gradients after every micro-batch, not the DDP the estimate "
            "times (one reduction per step, its gradient buckets); use zero_stage 2 or 3"
        )
    if expert_tensor_problem(lo.tp, lo.ep) is not None:
        problems.append(f"ep={lo.ep} with tp={lo.tp}: {EXPERTS_OVER_TP}")
    if (tied := tied_pipeline_problem(plan.model, lo.pp)) is not None:
        problems.append(tied)
    _, shard = _data_parallel(plan)
    if lo.ep > 1 and (shard * lo.cp * lo.tp) % lo.ep:
        # ParallelDims.build_mesh: the experts' mesh is (pp, dp_replicate, efsdp, ep) with efsdp =
        # dp_shard x cp x tp // ep, which does not fill the world unless ep divides that product
        problems.append(
            f"ep={lo.ep} must divide dp_shard x cp x tp = {shard} x {lo.cp} x {lo.tp}: torchtitan's experts "
            "take their ranks from the sharded data-parallel, context and tensor groups"
        )
    if lo.recompute_every_n_layers is not None:
        problems.append(
            f"recompute_every_n_layers {lo.recompute_every_n_layers}: torchtitan {VERSION} checkpoints every "
            "block or none (its every-N-th-block selective AC, selective_ac_option, ended with 0.2)"
        )
    if lo.offload_optimizer is Offload.NVME or lo.offload_params is Offload.NVME:
        problems.append("torchtitan offloads to CPU memory only")
    if (lo.offload_optimizer is Offload.NONE) != (lo.offload_params is Offload.NONE):
        problems.append(
            "training.enable_cpu_offload moves parameters, gradients and optimizer states together"
        )
    if lo.offload_params is not Offload.NONE and lo.zero_stage == 0:
        problems.append("CPU offload needs FSDP sharding")
    # the validator's rule, asked again: the search validates every layout, a plan built by hand
    # (the render tests') may break it
    if (async_tp := tp_comm_overlap_compile_violation(lo, FRAMEWORKS[lo.framework].capabilities)) is not None:
        problems.append(str(async_tp))
    if lo.pp > 1 and (reason := _split_problem(plan)):
        problems.append(reason)
    if (interleaved := schedule_batches_violation(lo, accumulation(plan))) is not None:
        problems.append(str(interleaved))
    return "; ".join(problems) if problems else None


def _split_args(plan: Plan) -> list[str]:
    """The estimated split in torchtitan's terms (torchtitan/distributed/pipeline_parallel.py
    _generate_llm_fqn_per_model_part): L + f + l units shared out over the stages, the first
    (units % stages) one more, f layers fewer on the first stage and l on the last; with layers
    per stage k the stage count is ceil(units / k), else pp (1F1B)."""
    split = pipeline_split(plan)
    stages = len(split.stages)
    args = [
        "--parallelism.pipeline_parallel_first_stage_less_layers", str(split.embedding),
        "--parallelism.pipeline_parallel_last_stage_less_layers", str(split.loss),
    ]  # fmt: skip
    if stages > plan.layout.pp:
        units = sum(split.stages) + split.embedding + split.loss
        args += ["--parallelism.pipeline_parallel_layers_per_stage", str(-(-units // stages))]
    return args


def _split_problem(plan: Plan) -> str:
    """Why torchtitan's split options cannot give the estimated split ('' when they can)."""
    split = pipeline_split(plan)
    if split.explicit and not split.even:
        return (
            "an explicit uneven split (pipeline_layers) needs module_fqns_per_model_part, which "
            "torchtitan's command line does not take: give pipeline_account_for_embedding/_loss instead"
        )
    stages = len(split.stages)
    units = sum(split.stages) + split.embedding + split.loss
    if stages > plan.layout.pp and -(-units // -(-units // stages)) != stages:
        return f"no layers per stage gives {stages} stages of {units} layer units"
    return ""


def _data_parallel(plan: Plan) -> tuple[int, int]:
    """(replicate, shard): DDP replicates, FSDP shards, HSDP replicates its shard groups
    (``model_states.hsdp_replicas``, whole by the validator)."""
    lo = plan.layout
    if lo.zero_stage == 0:
        return lo.dp, 1
    replicate = hsdp_replicas(lo, plan.cluster)
    return replicate, lo.dp // replicate


def train_args(plan: Plan) -> list[str]:
    """Arguments to `python -m torchtitan.train` (ConfigManager.parse_args takes exactly these)."""
    refuse(TARGET, refusal(plan))
    found = flavor(plan.model)
    assert found is not None  # refusal() names a model without a flavor
    lo, training = plan.layout, plan.training
    replicate, shard = _data_parallel(plan)
    accum = accumulation(plan)
    args = ["--module", found.module, "--config", found.config]
    args += [
        "--parallelism.data_parallel_replicate_degree", str(replicate),
        "--parallelism.data_parallel_shard_degree", str(shard),
        "--parallelism.tensor_parallel_degree", str(lo.tp),
        "--parallelism.pipeline_parallel_degree", str(lo.pp),
        "--parallelism.context_parallel_degree", str(lo.cp),
    ]  # fmt: skip
    if lo.tp > 1 and not lo.sequence_parallel:
        args.append("--parallelism.no-enable-sequence-parallel")
    if lo.ep > 1 or plan.model.moe is not None:
        # stated for every MoE model, 1 too: deepseek_v3_16b's config function sets 8 and _671b's 2
        # (torchtitan@4f9e9a4 models/deepseek_v3/config_registry.py), which a plan with ep = 1 inherited:
        # a mesh that fails to build at dp 3, or EP 8 over borrowed TP ranks (torchtitan review)
        args += ["--parallelism.expert_parallel_degree", str(lo.ep)]
    if shard * lo.cp > 1:
        # FSDP shards over dp_shard x cp (parallel_dims.py: the "dp_shard_cp" mesh), so with dp_shard 1
        # and cp > 1 it still shards, and its "default" policy (reshard after forward without a
        # pipeline: distributed/fsdp.py get_fsdp_reshard_after_forward_policy) would run ZeRO-3 where
        # stage 2 was estimated (launch review, stop 41)
        args += ["--parallelism.fsdp_reshard_after_forward", "always" if lo.zero_stage == 3 else "never"]
    if lo.pp > 1:
        # Megatron-style accounting: the accumulation micro-batches are the pipeline microbatches.
        local = lo.micro_batch_size * accum
        schedule = "Interleaved1F1B" if lo.virtual_pipeline_stages > 1 else "1F1B"
        args += [
            "--parallelism.pipeline_parallel_schedule", schedule,
            "--parallelism.pipeline_parallel_microbatch_size", str(lo.micro_batch_size),
        ]  # fmt: skip
        args += _split_args(plan)
    else:
        local = lo.micro_batch_size
    args += [
        "--training.local_batch_size", str(local),
        "--training.global_batch_size", str(training.global_batch_size),
        "--training.seq_len", str(training.seq_len),
        "--training.steps", str(train_steps(plan)),
        "--training.max_norm", "1.0",
        # the loss as estimated: CHUNKS chunks where it is chunked, else one (the full logits)
        "--loss.num_chunks", str(CHUNKS if lo.chunked_loss else 1),
    ]  # fmt: skip
    if training.optimizer is Optimizer.ADAMW:
        # the step the estimate assumes (OptimizerImplementation; "fused" is torchtitan's default)
        args += ["--optimizer.implementation", training.optimizer_implementation.value]
    if training.precision is Precision.BF16_PURE:
        args += ["--training.dtype", "bfloat16"]
    else:
        param = "float32" if training.precision.stores_fp32 else "bfloat16"  # tf32: the env's switch
        args += ["--training.mixed_precision_param", param]
    # the gradient reduce dtype the estimate times (model_states.grad_reduce_bytes); "float32" is the
    # only value 0.3.0's TrainingConfig.mixed_precision_reduce accepts (its default), so said
    # explicitly it fails at parse if the estimate's ever differs
    args += ["--training.mixed_precision_reduce", FSDP_REDUCE_DTYPE]
    if lo.offload_params is Offload.CPU:
        args.append("--training.enable_cpu_offload")
    # said either way: a config function may turn them on (deepseek_v3_671b compiles, llama3_405b
    # also runs async TP), and its defaults are not what is estimated
    if lo.torch_compile is not Compile.NONE:
        args.append("--compile.enable")
        # tyro reads a list as one comma-separated value ("model,loss"); a second flag replaces the first
        args += ["--compile.components", "model" if lo.torch_compile is Compile.MODEL else "model,loss"]
    else:
        args.append("--compile.no-enable")
    if lo.tp_comm_overlap:
        # Async TP: CompileConfig's field since 0.3.0 (ParallelismConfig's up to 0.2); needs the
        # compiled model, which the validator and the refusal above require
        args.append("--compile.enable_async_tensor_parallel")
    else:
        args.append("--compile.no-enable-async-tensor-parallel")
    # 0.3.0 captures the forward and backward as a CUDA graph by default on NVIDIA GPUs (trainer.py:
    # wrap_with_cuda_graph unless training.disable_cuda_graphs), raising for PP and EP's all-to-all. The
    # estimate times eager launches (tuning.toml [host_issue]) and gradients freed at zero_grad, where
    # the graph zeroes them in place and keeps a pool of its own beside the eager step's (not modelled):
    # off, so that the run is the job estimated (torchtitan review), as the header says
    args.append("--training.disable_cuda_graphs")
    # torchtitan's "selective" is per-op AC (SelectiveAC), what selective_op estimates
    mode = {Recompute.NONE: "none", Recompute.SELECTIVE_OP: "selective", Recompute.FULL: "full"}[lo.recompute]
    args.append(f"activation_checkpoint:{mode}")  # a tyro subcommand: must come last
    return args


def entry_words(plan: Plan) -> list[Word]:
    return ["-m", "torchtitan.train", *train_args(plan)]


def environment(plan: Plan) -> list[tuple[str, str]]:
    """What torchtitan's own run_train.sh exports (0.3.0): the caching allocator's expandable
    segments, which grow in place instead of leaving cached blocks of one size behind. The memory
    estimate's fragmentation reserve was fitted on runs launched this way (tuning.toml [memory]).
    tf32: torchtitan has no TF32 switch (its config only turns TF32 off, for batch-invariant runs),
    so PyTorch's environment override turns it on for its nn.Linear matmuls."""
    return [("PYTORCH_ALLOC_CONF", "expandable_segments:True"), *tf32_environment(plan)]


def notes(plan: Plan) -> str:
    """What the run does that the estimate or the user would not assume: said in this target's launch
    script and in the Slurm / Kubernetes wrappers that run its entry point (``job.entry``: a wrapper
    dropped them; a platform review)."""
    text = (
        # said in the file (a fine-tune ran from a fresh init on the recipe's dataset; launch review)
        "\nIt trains from a fresh initialisation on the config module's dataset and learning-rate\n"
        "schedule: to fine-tune, set --checkpoint.initial_load_path to the model's DCP checkpoint, and\n"
        "the dataset, --lr_scheduler.warmup_steps and --optimizer.lr for this run's steps.\n"
        # models/common/config_utils.py: flex attention with block_causal masks for language models
        "Attention is FlexAttention with block-causal masks (each packed document attends within\n"
        "itself); the estimate times a causal triangle over the whole sequence at FlashAttention-2's\n"
        "rate: more FLOPs than those masks run where documents are shorter than seq_len, at a kernel\n"
        "rate FlexAttention's need not reach.\n"
        "CUDA graphs are off (--training.disable_cuda_graphs; torchtitan's default captures the forward\n"
        "and backward): the estimate times eager kernel launches and frees the gradients at zero_grad;\n"
        "a captured step keeps them and a graph memory pool beside the eager one, which it does not model."
    )
    text += converted_checkpoint_duty(plan, "a DCP checkpoint (--checkpoint.initial_load_path)")
    if plan.layout.cp > 1:
        # distributed/context_parallel/api.py apply_cp_to_forward: FlexAttention's CP is
        # torch's flex_cp_allgather (a blocking all-gather of K and V, reduce-scattered in the backward),
        # not the SDPA ring (torchtitan review); the full-sequence K and V it hands the kernel are what
        # FlexAttention saves for its backward
        text += (
            "\nContext parallelism runs FlexAttention's all-gather of K and V (flex_cp_allgather), which\n"
            "waits for the whole sequence's K and V before the kernel and keeps them for the backward; the\n"
            "estimate times and sizes PyTorch's SDPA ring (Accelerate's and earlier torchtitan's CP), which\n"
            "overlaps its first block and keeps this rank's K and V alone."
        )
    return text


def render(plan: Plan) -> list[Artifact]:
    words: list[Word] = [*torchrun_words(plan, rendezvous="c10d"), *entry_words(plan)]
    header = f"torchtitan {VERSION}: config module plus --section.field overrides (no TOML since 0.3.0)."
    header += notes(plan)
    content = script(plan, [shell_command(words)], env=environment(plan), header=header)
    return [Artifact(name=LAUNCH_NAME, target=TARGET, media_type=SHELL, content=content)]
