"""Shared pieces of the launcher renderers: the result types, layout summaries, torchrun lines.

Everything here is pure: plain values in, plain values out. Serialisation happens in the
target modules, last.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from service.catalog.tuning import default_tuning
from service.estimator import caveats, pipeline
from service.estimator.defaults import for_gpu
from service.estimator.hf_config import DEQUANTIZING_CONFIGS
from service.estimator.model_states import FSDP_REDUCE_DTYPE, hsdp_replicas
from service.estimator.params import lora_modules
from service.estimator.step_time import steps_to_train
from service.estimator.tuning import dp_overlap_default
from service.estimator.types import (
    Attention,
    Compile,
    Framework,
    Head,
    Layout,
    Method,
    Optimizer,
    Plan,
    Precision,
    Recompute,
)
from service.frameworks import Target as Target  # the registry's; re-exported for the targets

MASTER_PORT = 29500  # torchrun / DeepSpeed launcher default rendezvous port
TRAIN_SCRIPT = "train.py"  # the user's training script for DeepSpeed and HF Trainer targets
DEFAULT_TRAIN_STEPS = 1000  # when the training spec gives no token budget


@dataclass(frozen=True)
class Hyperparameters:
    """The optimizer settings every target writes, so the files of one plan train the same run.

    Placeholders (the plan carries no learning rate): the Llama 2 paper's AdamW settings (Touvron
    et al. 2023, section 2.2: lr 3e-4 decayed to 10%, betas 0.9/0.95, weight decay 0.1, clipping
    1.0) with PyTorch's default eps. HF Trainer refuses
    a ds_config whose optimizer block differs from its TrainingArguments
    (integrations/deepspeed.py, trainer_config_finalize), so both are written from here.
    """

    lr: float = 3e-4
    min_lr: float = 3e-5
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip_grad_norm: float = 1.0


HYPERPARAMETERS = Hyperparameters()


def hyperparameter_note() -> str:
    """What a file that writes ``HYPERPARAMETERS`` says of them: placeholders, a pretraining recipe's,
    which the estimate does not read (an encoder fine-tune ran at lr 3e-4, beta2 0.95 and weight decay
    0.1 with no word that they were not chosen for it; BERT fine-tunes at 2e-5 to 5e-5: an encoder
    review)."""
    hp = HYPERPARAMETERS
    return (
        f"\noptimizer settings (lr {hp.lr:g}, betas {hp.beta1:g}/{hp.beta2:g}, weight decay "
        f"{hp.weight_decay:g}, gradient clipping {hp.clip_grad_norm:g}) are the Llama 2 pretraining "
        "recipe's, placeholders the estimate does not read: set this run's (a fine-tune takes a smaller "
        "learning rate)."
    )


JSON = "application/json"
YAML = "application/yaml"
SHELL = "text/x-shellscript"
TEXT = "text/plain"
MEDIA_TYPES = (JSON, YAML, SHELL, TEXT)  # every artifact is served as one of these


@dataclass(frozen=True, slots=True, kw_only=True)
class Artifact:
    """One generated file: a stable name, the target that made it, and its media type."""

    name: str
    target: Target
    media_type: str
    content: str


class Unsupported(Exception):
    """The plan's layout cannot be expressed in this target; ``reason`` says why."""

    def __init__(self, target: Target, reason: str) -> None:
        super().__init__(f"{target}: {reason}")
        self.target = target
        self.reason = reason


Refusal = str | None  # why a target cannot express a plan, or None: it renders it


def refuse(target: Target, reason: Refusal) -> None:
    """Raise Unsupported with the target's refusal, if it has one: every renderer starts here, so
    rendering refuses exactly what the target's pure predicate (``refusal(plan)``) says."""
    if reason is not None:
        raise Unsupported(target, reason)


@dataclass(frozen=True, slots=True)
class Raw:
    """A shell word emitted verbatim (a quoted variable expansion), never quoted again."""

    text: str


Word = str | Raw


def shell_words(words: Sequence[Word]) -> str:
    """shlex.join, except that Raw words pass through untouched."""
    return " ".join(w.text if isinstance(w, Raw) else shlex.quote(w) for w in words)


def shell_command(words: Sequence[Word], *, width: int = 100) -> str:
    """One command, wrapped with backslashes before options so long lines stay readable."""
    lines: list[str] = []
    current: list[Word] = []
    for word in words:
        starts_option = isinstance(word, str) and word.startswith("-") and len(current) > 1
        if starts_option and len(shell_words(current)) + len(shell_words([word])) > width:
            lines.append(shell_words(current))
            current = []
        current.append(word)
    lines.append(shell_words(current))
    return " \\\n    ".join(lines)


def accumulation(plan: Plan) -> int:
    """Micro-batches per data-parallel rank per optimizer step."""
    return plan.layout.accumulation_steps(plan.training.global_batch_size)


def train_steps(plan: Plan) -> int:
    """Optimizer steps for the token budget, or a fixed default when the spec gives none."""
    if plan.training.tokens is None:
        return DEFAULT_TRAIN_STEPS
    return steps_to_train(plan.training.tokens, plan.training.tokens_per_step)  # what time to train counts


@dataclass(frozen=True, slots=True)
class PipelineSplit:
    """The pipeline split the plan was estimated with (``estimator.pipeline``), for the launchers
    to render with each tool's own options."""

    stages: tuple[int, ...]  # decoder layers of each of the pp x v virtual stages, in model order
    embedding: int  # 1 when a derived split counts the embedding as a layer
    loss: int  # 1 when a derived split counts the output layer and loss as a layer
    explicit: bool  # the layout gave the layers of each stage

    @property
    def even(self) -> bool:
        """Every virtual stage holds the same layers and nothing is counted for embedding or loss."""
        return not (self.embedding or self.loss) and len(set(self.stages)) == 1

    @property
    def accounted(self) -> bool:
        """Derived with the embedding and/or loss as layers, all units shared out evenly: Megatron's
        account-for split, expressible by its two flags."""
        units = sum(self.stages) + self.embedding + self.loss
        return not self.explicit and (self.embedding or self.loss) > 0 and units % len(self.stages) == 0


def pipeline_split(plan: Plan) -> PipelineSplit:
    layers, layout = plan.model.num_layers, plan.layout
    embedding, loss = (0, 0) if layout.pipeline_layers is not None else pipeline.accounts_for(layers, layout)
    return PipelineSplit(
        stages=pipeline.stage_layers(layers, layout),
        embedding=embedding,
        loss=loss,
        explicit=layout.pipeline_layers is not None,
    )


def megatron_overlaps_grad_reduce(layout: Layout) -> bool:
    """Whether a Megatron layout reduces its gradients under backward, as the estimate takes it
    (dp_comm.dp_overlapped): its ``overlap_grad_reduce``, else the framework's default in tuning.toml
    (NVIDIA's recipes: on), where there is a data-parallel reduction to overlap (dp x cp > 1)."""
    if layout.overlap_grad_reduce is not None:
        return layout.overlap_grad_reduce
    return layout.dp * layout.cp > 1 and dp_overlap_default(default_tuning(), Framework.MEGATRON)


def world_refusal(plan: Plan) -> Refusal:
    """The layout must fill the cluster exactly: every launcher starts one process per GPU."""
    layout, cluster = plan.layout, plan.cluster
    if layout.world_size != cluster.world_size:
        return (
            f"dp*tp*pp*cp ({layout.world_size}) != GPUs in the cluster ({cluster.world_size} = "
            f"{cluster.num_nodes} nodes x {cluster.gpus_per_node})"
        )
    return None


def compiled_fp32_refusal(plan: Plan) -> Refusal:
    """Accelerate (and the HF Trainer, which hands it a TorchDynamoPlugin) switches fp32 matmuls to TF32
    wherever a dynamo backend compiles without mixed precision on a CUDA device (accelerate 1.15
    state.py AcceleratorState: ``torch.backends.cuda.matmul.allow_tf32 = True``): the files would run
    fp32 training with compile at the TF32 rate, about 6x the fp32 rate estimated on an H100
    (launch-consistency review). On a GPU without TF32 tensor cores the switch changes nothing; ROCm
    routes fp32 matmuls to TF32 only under HIPBLASLT_ALLOW_TF32 (``ROCM_TF32_ENV``), not set then."""
    gpu = plan.cluster.gpu
    if (
        plan.training.precision is not Precision.FP32
        or plan.layout.torch_compile is Compile.NONE
        or gpu.peak_flops_per_s.tf32 is None
        or gpu.vendor == "amd"
    ):
        return None
    return (
        "precision fp32 with torch_compile: Accelerate switches the matmuls to TF32 under a dynamo "
        "backend without mixed precision (AcceleratorState), so these files would train at the TF32 rate, "
        "not the fp32 estimated; ask precision tf32 (what they run), or leave torch_compile off"
    )


def full_logits_refusal(plan: Plan) -> Refusal:
    """A target that computes the whole vocabulary's logits (the model's own loss: Hugging Face's,
    Megatron-LM's) cannot run a layout estimated with a chunked loss, which keeps none of them."""
    if plan.layout.chunked_loss:
        return "chunked_loss: the loss computes the full logits here (no chunked loss is emitted)"
    return None


def sharded_8bit_refusal(plan: Plan) -> Refusal:
    """bitsandbytes' 8-bit optimizers on FSDP's sharded parameters (the HF Trainer's and Accelerate's
    FSDP, zero_stage >= 2): they do not step DTensor (FSDP2) or flat (FSDP1) parameters; bitsandbytes
    issues #1633 (illegal memory access with FSDP2, open and reproduced in 2026) and #89 (8-bit
    optimizers do not work with FSDP, open). DDP and DeepSpeed step whole or flattened partitions
    bitsandbytes takes (budget fine-tuner review: the plan rendered it runnable)."""
    lo = plan.layout
    if (
        lo.framework is Framework.FSDP
        and lo.zero_stage >= 2
        and plan.training.optimizer is Optimizer.ADAMW_8BIT
    ):
        return (
            "bitsandbytes' 8-bit AdamW does not step FSDP's sharded parameters (bitsandbytes issues #1633 "
            "and #89); use zero_stage 0 (DDP) or the deepspeed framework"
        )
    return None


def stored_nf4_storage_refusal(plan: Plan) -> Refusal:
    """A stored bitsandbytes 4-bit checkpoint whose packed weights are uint8 (``ModelSpec.
    bnb_4bit_float_storage``): from_pretrained keeps its saved storage, which FSDP1's flat parameters
    cannot flatten (torch fsdp _flat_param.py: "Cannot flatten integer dtype tensors") and ZeRO-3 cannot
    partition (PEFT's FSDP / DeepSpeed ZeRO-3 QLoRA path stores them in the compute dtype); DDP and
    ZeRO-1/2 keep them whole (a change review: such a plan rendered FSDP FULL_SHARD)."""
    lo = plan.layout
    if not plan.model.bnb_4bit_checkpoint or plan.model.bnb_4bit_float_storage:
        return None
    sharded = (lo.framework is Framework.FSDP and lo.zero_stage >= 2) or (
        lo.framework is Framework.DEEPSPEED and lo.zero_stage >= 3
    )
    if not sharded:
        return None
    return (
        f"the checkpoint packs its 4-bit weights as uint8 (bnb_4bit_quant_storage), which "
        f"{lo.framework.value} ZeRO-{lo.zero_stage} cannot shard: train with ZeRO-"
        f"{0 if lo.framework is Framework.FSDP else 2} or re-save the checkpoint with "
        "bnb_4bit_quant_storage bfloat16"
    )


def activation_offload_refusal(plan: Plan) -> Refusal:
    """No target offloads activations, so a layout estimated with ``activation_offload`` runs without
    it: Megatron-LM's --cpu-offloading is not rendered (Megatron-Core refuses it with activation
    recomputation or pipeline parallelism: transformer_config.py), the Hugging Face models the other
    targets train checkpoint through torch.utils.checkpoint, which DeepSpeed's cpu_checkpointing
    (deepspeed.checkpointing alone) does not move, and torchtitan has no such switch (long-context
    review: an estimate of it answered 200 with no warning)."""
    if plan.layout.activation_offload:
        return "activation_offload: no launch file here moves activations to the host"
    return None


def layout_summary(plan: Plan) -> str:
    """One line naming every layout choice, for a comment or annotation in the artifact."""
    lo, cl = plan.layout, plan.cluster
    parts = [
        f"framework={lo.framework}",
        f"dp={lo.dp} tp={lo.tp} pp={lo.pp} cp={lo.cp} ep={lo.ep}",
        f"sequence_parallel={str(lo.sequence_parallel).lower()}",
        f"zero_stage={lo.zero_stage}",
        f"offload_optimizer={lo.offload_optimizer} offload_params={lo.offload_params}",
        f"recompute={lo.recompute}",
        f"micro_batch={lo.micro_batch_size} accumulation={accumulation(plan)}",
        f"global_batch={plan.training.global_batch_size} seq_len={plan.training.seq_len}",
        f"precision={plan.training.precision}",
    ]
    if lo.virtual_pipeline_stages > 1:
        parts.append(f"virtual_pipeline_stages={lo.virtual_pipeline_stages}")
    if lo.fsdp_hybrid_shard:
        parts.append(f"fsdp_hybrid_shard=true ({hsdp_replicas(lo, cl)} replicas)")
    parts.append(f"world={lo.world_size} ({cl.num_nodes} node(s) x {cl.gpus_per_node} {cl.gpu.name})")
    return f"trainplan layout for {plan.model.name}: " + ", ".join(parts)


def comment_lines(text: str) -> list[str]:
    """A summary as shell/YAML comment lines, each character YAML can print: a name's control or
    other unprintable character (ESC, DEL, U+FFFF) written as its escape, since YAML allows none in a
    comment and a parser refused the whole file (YAML 1.2.2 §5.1 c-printable; a platform review)."""
    return [f"# {_printable(line)}".rstrip() for line in text.splitlines()]


def _printable(line: str) -> str:
    if line.isprintable():
        return line
    return "".join(ch if ch.isprintable() or ch == "\t" else ascii(ch)[1:-1] for ch in line)


def half_precision(plan: Plan) -> str | None:
    """'bf16', 'fp16' or None (fp32, tf32) for frameworks with a single mixed-precision switch."""
    precision = plan.training.precision
    if precision is Precision.FP16:
        return "fp16"
    if precision.stores_fp32:
        return None
    return "bf16"  # bf16, bf16_pure and fp8 all keep bf16 activations and weights


# PyTorch's switch for fp32 matmuls on the TF32 tensor cores from outside the script: ATen's
# Context::allowTF32CuBLAS reads it ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 forces TF32 enablement,
# overrides set_float32_matmul_precision", PyTorch CUDA environment variables). NGC containers set it.
TF32_ENV = ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")


# ROCm: PyTorch (2.7+) routes fp32 matmuls to hipBLASLt's TF32 path on MI300 only with this set
# (its test_matmul_cuda opts in the same way; the flag is documented as temporary)
ROCM_TF32_ENV = ("HIPBLASLT_ALLOW_TF32", "1")


def tf32_environment(plan: Plan) -> list[tuple[str, str]]:
    """The environment that runs an fp32 script's matmuls in TF32 (precision tf32); else none."""
    if plan.training.precision is not Precision.TF32:
        return []
    return [TF32_ENV, ROCM_TF32_ENV] if plan.cluster.gpu.vendor == "amd" else [TF32_ENV]


def hf_decoder_layer(family: str) -> str | None:
    """The transformers decoder-layer class name FSDP wraps, for the model families we know."""
    return _HF_DECODER_LAYERS.get(family)


_HF_DECODER_LAYERS = {
    "llama": "LlamaDecoderLayer",
    "mistral": "MistralDecoderLayer",
    "mixtral": "MixtralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "qwen2_moe": "Qwen2MoeDecoderLayer",
    "qwen3": "Qwen3DecoderLayer",
    "qwen3_moe": "Qwen3MoeDecoderLayer",
    "deepseek_v2": "DeepseekV2DecoderLayer",
    "deepseek_v3": "DeepseekV3DecoderLayer",
    "gemma": "GemmaDecoderLayer",
    "gemma2": "Gemma2DecoderLayer",
    "gemma3": "Gemma3DecoderLayer",
    "llama4": "Llama4TextDecoderLayer",
    "gpt_oss": "GptOssDecoderLayer",
    "olmo2": "Olmo2DecoderLayer",
    "olmoe": "OlmoeDecoderLayer",
    "granite": "GraniteDecoderLayer",
    "phi": "PhiDecoderLayer",
    "phi3": "Phi3DecoderLayer",
    "gpt2": "GPT2Block",
    "gpt_neox": "GPTNeoXLayer",
    "falcon": "FalconDecoderLayer",
    "bloom": "BloomBlock",
    # encoders: modeling_bert.py BertLayer, modeling_roberta.py RobertaLayer (the encoder's repeated block)
    "bert": "BertLayer",
    "roberta": "RobertaLayer",
    "xlm-roberta": "XLMRobertaLayer",
    "camembert": "CamembertLayer",
}


def dns_label(name: str, max_length: int = 63) -> str:
    """A DNS-1035 label (Kubernetes object names, Slurm job names): [a-z]([-a-z0-9]*[a-z0-9])?, at
    most ``max_length`` characters (a label's 63, less what another name appends to it)."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = "job-" + label
    return label[:max_length].rstrip("-")


def torchrun_words(plan: Plan, *, rendezvous: str) -> list[Word]:
    """torchrun's topology options.

    rendezvous: "standalone" for one node; "c10d" (one identical command per node, ranks
    assigned at rendezvous, endpoint from $MASTER_ADDR/$MASTER_PORT); "env" to take the
    topology from PET_* variables (Kubeflow PyTorchJob sets them).
    """
    cluster = plan.cluster
    nproc = str(cluster.gpus_per_node)
    if rendezvous == "env":
        return ["torchrun", "--nnodes", str(cluster.num_nodes), "--nproc-per-node", nproc]
    if rendezvous == "standalone" or cluster.num_nodes == 1:
        return ["torchrun", "--standalone", "--nnodes", "1", "--nproc-per-node", nproc]
    return [
        "torchrun",
        "--nnodes",
        str(cluster.num_nodes),
        "--nproc-per-node",
        nproc,
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        Raw('"${MASTER_ADDR}:${MASTER_PORT}"'),
        "--rdzv-id",
        Raw('"${JOB_ID}"'),
    ]


def script(
    plan: Plan,
    body: Sequence[str],
    *,
    env: Sequence[tuple[str, str]] = (),
    header: str = "",
    every_node: bool = True,
) -> str:
    """A bash script: shebang, the layout comment, the header's notes, strict mode, exported env, the
    body (the layout first: a file's notes grow, its second line says what it runs)."""
    lines = ["#!/usr/bin/env bash"]
    lines += comment_lines(layout_summary(plan))
    if header:
        lines += comment_lines(header)
    lines.append("set -euo pipefail")
    if plan.cluster.num_nodes > 1 and not every_node:
        lines += [
            "# Run this script once, on the first node.",
            'export MASTER_ADDR="${MASTER_ADDR:-node-0}"',
            f'export MASTER_PORT="${{MASTER_PORT:-{MASTER_PORT}}}"',
        ]
    elif plan.cluster.num_nodes > 1:
        lines += [
            "# Run this same script on every node; set MASTER_ADDR to the first node's address.",
            ': "${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}"',
            f'export MASTER_PORT="${{MASTER_PORT:-{MASTER_PORT}}}"',
            'export JOB_ID="${JOB_ID:-trainplan}"',
        ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env]
    lines += body
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- adapters (PEFT)

LORA_CONFIG_NAME = "lora_config.json"
BNB_CONFIG_NAME = "bnb_config.json"


def gradient_checkpointing_duty(plan: Plan) -> str:
    """The line that tells the training script to checkpoint every decoder layer where the layout
    recomputes them all and nothing the launcher writes turns it on (ds_config's
    activation_checkpointing configures deepspeed.checkpointing, which Hugging Face models do not
    call; Accelerate's plain DDP has no such key): without it the step keeps every activation, more
    than estimated."""
    if plan.layout.recompute is not Recompute.FULL:
        return ""
    return (
        f"\nrecompute full: {TRAIN_SCRIPT} must call model.activation_checkpointing_enable() (transformers "
        "5.24; gradient_checkpointing_enable() is its deprecated alias, and the name before 5.x) so that "
        "every decoder layer keeps only its input, as estimated, before handing the model to the launcher."
    )


# transformers' class of each encoder task head (AutoModelFor...), whose head the estimate counts
_HEAD_CLASSES = {
    Head.MASKED_LM: "AutoModelForMaskedLM",
    Head.SEQUENCE_CLASSIFICATION: "AutoModelForSequenceClassification",
    Head.QUESTION_ANSWERING: "AutoModelForQuestionAnswering",
    Head.TOKEN_CLASSIFICATION: "AutoModelForTokenClassification",
}


# A multimodal wrapper's modules outside its language model (transformers' Gemma3ForConditionalGeneration
# and Mistral3's vision_tower and multi_modal_projector, Llama 4's vision_model), as a regular expression
# over module names
VISION_MODULES = r".*\b(vision_tower|vision_model|multi_modal_projector)\b.*"


def vision_duty(plan: Plan) -> str:
    """A multimodal wrapper's checkpoint loads its vision tower and projector beside the language model
    the estimate plans (AutoModelForCausalLM builds Gemma3ForConditionalGeneration, with its tower
    trainable: a multimodal review): the script freezes them, as the text-only fine-tune estimated."""
    if not plan.model.vision_tower:
        return ""
    return (
        f"\nmodel: a multimodal checkpoint; the estimate plans its language model alone: {TRAIN_SCRIPT} must "
        "freeze the vision tower and projector (requires_grad_(False) on every parameter whose name matches "
        f"{VISION_MODULES!r}); their frozen weights are not counted."
    )


def model_duties(plan: Plan, config_dir: str = "") -> str:
    """What the training script must build: an encoder's task head as estimated, then the adapters
    (``peft_header``). Every launch that runs the user's train.py says it (a review: a RoBERTa
    classification plan named no class, so the run could load a model other than the one estimated)."""
    model = plan.model
    head = ""
    if model.head in _HEAD_CLASSES:
        labelled = (Head.SEQUENCE_CLASSIFICATION, Head.TOKEN_CLASSIFICATION)
        labels = f", num_labels={model.num_labels}" if model.head in labelled else ""
        head = (
            f"\nmodel: {TRAIN_SCRIPT} must build {_HEAD_CLASSES[model.head]}.from_pretrained(...{labels}): "
            f"the estimate counts the {model.head.value} head."
        )
    return (
        head
        + vision_duty(plan)
        + checkpoint_duty(plan)
        + attention_duty(plan)
        + peft_header(plan, config_dir)
    )


def steps_duty(plan: Plan) -> str:
    """How many optimizer steps the user's training loop must run, where the request gave tokens: the
    steps the time to train counts (``train_steps``). DeepSpeed's config and Accelerate's have no
    step count (the loop is the script's); the HF Trainer's max_steps and Megatron's --train-iters
    carry it (review of stop 48: these files never stated the 3,815 steps the estimate timed)."""
    if plan.training.tokens is None:
        return ""
    return (
        f"\nsteps: {TRAIN_SCRIPT} must run {train_steps(plan):,} optimizer steps of global batch "
        f"{plan.training.global_batch_size} ({plan.training.tokens_per_step:,} tokens each): the "
        f"{plan.training.tokens:,} tokens the time to train counts."
    )


def z3_leaf_duty(plan: Plan) -> str:
    """DeepSpeed ZeRO-3 with peft's adapters on fused experts (``caveats.
    zero3_partitions_fused_expert_adapters``, which the estimate warns of): the MoE block must be a
    ZeRO-3 leaf module, so that its adapters are gathered with it; '' elsewhere."""
    if not caveats.zero3_partitions_fused_expert_adapters(plan.model, plan.layout, plan.training):
        return ""
    return (
        f"\nzero-3 and peft's fused-expert adapters: {TRAIN_SCRIPT} must call "
        "deepspeed.utils.set_z3_leaf_modules(model, [<the model's sparse MoE block class>]) before "
        "deepspeed.initialize: ZeRO-3 gathers a module's own parameters for its forward, and peft's "
        "ParamWrapper reads the experts' lora_A / lora_B outside theirs (a leaf module gathers them all)."
    )


def checkpoint_duty(plan: Plan) -> str:
    """How the script loads a checkpoint stored quantized (fp8, mxfp4, ...) that the estimate plans
    dequantized to the training precision; '' for an unquantized one. Without it from_pretrained keeps
    the stored format (GPT-OSS's MXFP4 experts, DeepSeek-V3's fp8 blocks), whose layers do not train
    (a review of stop 44's config.json plans)."""
    stored = plan.model.dequantized_checkpoint
    if stored is None:
        return ""
    config = DEQUANTIZING_CONFIGS.get(stored)
    if config is None or plan.training.method is Method.QLORA:
        # QLoRA quantizes a 16-bit base to NF4: from_pretrained takes one quantization_config
        why = "its layers do not train" if config is None else "QLoRA's NF4 quantizes a 16-bit base"
        return (
            f"\ncheckpoint: its weights are stored {stored} ({why}): convert it to 16-bit weights first "
            f"and point {TRAIN_SCRIPT} at the converted copy, as the estimate plans it."
        )
    return (
        f"\ncheckpoint: its weights are stored {stored}: {TRAIN_SCRIPT} must load them dequantized, "
        f"from_pretrained(..., quantization_config={config}), as the estimate plans them."
    )


def converted_checkpoint_duty(plan: Plan, loads: str) -> str:
    """For a target that loads its own checkpoint format (Megatron-LM's --load, torchtitan's DCP),
    not a Hugging Face one: a checkpoint stored quantized must be dequantized to 16-bit weights before
    it is converted to ``loads``, as the estimate plans it ('' for an unquantized one). The config's
    warning says the launch files say how; the Megatron file said nothing (a quantized-checkpoints
    review)."""
    stored = plan.model.dequantized_checkpoint
    if stored is None:
        return ""
    loader = DEQUANTIZING_CONFIGS.get(stored)
    how = (
        f"dequantize them to 16-bit weights (transformers' from_pretrained with {loader})"
        if loader
        else "convert them to 16-bit weights outside transformers (it neither trains nor dequantizes them)"
    )
    return f"\ncheckpoint: its weights are stored {stored}: {how} before\nconverting to {loads}, as planned."


# transformers' attn_implementation of each attention the estimate times
ATTN_IMPLEMENTATIONS = {
    Attention.FLASH: "flash_attention_2",
    Attention.SDPA: "sdpa",
    Attention.EAGER: "eager",
}


def attention_duty(plan: Plan) -> str:
    """The attention kernel the script must load the model with: the estimate's. Left out,
    from_pretrained tries SDPA and else eager (transformers 5), so a Gemma 2 or GPT-OSS plan sized for
    FlashAttention ran eager, its s x s scores twice the memory (a review of stop 44's plans)."""
    attention = for_gpu(plan.training, plan.cluster.gpu, plan.model).attention
    if attention is None:
        return ""
    if attention is Attention.FLASH and plan.layout.framework is Framework.FSDP and plan.layout.cp > 1:
        # torch's context parallelism (accelerator.maybe_context_parallel) splits the sequence inside
        # F.scaled_dot_product_attention alone, and transformers' Trainer refuses another implementation
        # (_prepare_context_parallel_inputs); flash_attention_2 would attend within each rank's shard
        return (
            f"\nattention: {TRAIN_SCRIPT} must load the model with from_pretrained(..., attn_implementation="
            '"sdpa"): context parallelism splits the sequence inside SDPA only, whose FlashAttention '
            "backend runs the kernel the estimate times (flash attention); flash_attention_2 would attend "
            "within each rank's shard of the sequence."
        )
    return (
        f"\nattention: {TRAIN_SCRIPT} must load the model with from_pretrained(..., attn_implementation="
        f'"{ATTN_IMPLEMENTATIONS[attention]}"): the estimate times {attention.value} attention.'
    )


def peft_header(plan: Plan, config_dir: str = "") -> str:
    """What the training script does with the adapter files ('' for full training); ``config_dir``:
    where a wrapper mounts them (a Kubernetes ConfigMap's directory)."""
    method = plan.training.method
    if method is Method.FULL:
        return ""
    text = (
        f"\n{method.value}: {TRAIN_SCRIPT} must wrap the model with peft.get_peft_model(model, "
        f"LoraConfig(**json.load(open({config_dir + LORA_CONFIG_NAME!r})))): only the adapters train."
    )
    if method is Method.QLORA:
        # the rest of the base (embeddings, head, norms) in the compute dtype, as estimated: the
        # quantizer's update_dtype sets only a dtype left None, and transformers 5 loads the checkpoint's
        # own otherwise (an fp32 OLMo 2 kept 1.5 GiB of fp32 tables: a quantized-checkpoints review)
        dtype = f"dtype=torch.{plan.training.precision.weight_dtype}"
        if plan.model.bnb_4bit_checkpoint:
            # from_pretrained loads a stored 4-bit checkpoint with its own saved quantization_config
            text += (
                f"\nqlora: the checkpoint is stored in bitsandbytes 4-bit: load it with from_pretrained(..., "
                f"{dtype}); its saved quantization_config applies (as estimated), not {BNB_CONFIG_NAME}."
            )
        else:
            text += (
                f"\nqlora: load the base model with from_pretrained(..., {dtype}, quantization_config="
                f"BitsAndBytesConfig(**json.load(open({config_dir + BNB_CONFIG_NAME!r})))) (NF4, double "
                "quantisation)."
            )
    elif plan.training.base_autocast:
        text += (
            "\nlora: load the base model with from_pretrained(..., dtype=torch.float32) (the "
            "estimate keeps it in fp32 and counts the 16-bit copies autocast makes)."
        )
    elif not plan.training.precision.stores_fp32:
        text += (
            f"\nlora: load the base model with from_pretrained(..., dtype=torch."
            f"{plan.training.precision.weight_dtype}) (the estimate keeps the frozen base in the compute "
            f"dtype; {LOADED_DTYPE})."
        )
    return text


# What from_pretrained loads without a dtype: transformers 5 made dtype="auto" the default (the
# checkpoint's own, its config's torch_dtype; fp32 before 5, as the 4.x docs said)
LOADED_DTYPE = "without dtype transformers 5 loads the checkpoint's own dtype (fp32 for a float32 one)"


def load_dtype_duty(plan: Plan) -> str:
    """The dtype the script must load a full fine-tune's model in under the FSDP framework's
    Accelerate and HF Trainer paths, '' elsewhere: no launch setting loads it (the Trainer's --bf16 and
    Accelerate's mixed precision autocast over whatever the model was loaded in, and transformers 5
    loads the checkpoint's own dtype: ``LOADED_DTYPE``). Pure bf16 keeps bf16 weights and states;
    mixed precision on DDP (zero_stage 0) fp32 weights, the master autocast casts from (a bf16
    checkpoint loaded as it is trains bf16 weights and moments, no master: other numbers than
    estimated; change review). Sharded FSDP2 upcasts every parameter to fp32 under any mixed precision
    (accelerate 1.15.0 utils/fsdp_utils.py fsdp2_prepare_model: param.data.to(torch.float32) where
    mixed_precision != "no"; a launch review), so there pure bf16 is launched with none and mixed
    precision needs no duty. Adapters: ``peft_header`` says the base's dtype."""
    lo, training = plan.layout, plan.training
    if lo.framework is not Framework.FSDP or training.method is not Method.FULL:
        return ""
    if training.precision is Precision.BF16_PURE:
        why = (
            "no mixed precision is set because Accelerate's FSDP2 upcasts every parameter to fp32 under any"
            if lo.zero_stage >= 2
            else f"the bf16 switch autocasts over the dtype the model was loaded in, and {LOADED_DTYPE}"
        )
        return (
            f"\nbf16_pure: {TRAIN_SCRIPT} must load the model with from_pretrained(..., "
            f"dtype=torch.bfloat16): {why}; the estimate keeps bf16 weights and states."
        )
    if lo.zero_stage == 0 and training.precision in (Precision.BF16, Precision.FP16):
        return (
            f"\n{training.precision.value}: {TRAIN_SCRIPT} must load the model with from_pretrained(..., "
            f"dtype=torch.float32): the estimate keeps fp32 weights, the master autocast casts from, and "
            f"{LOADED_DTYPE}: a bf16 one would train bf16 weights and moments without a master."
        )
    return ""


def fsdp_reduce_duty(plan: Plan, accelerator: str) -> str:
    """What the training script must do so that Accelerate's FSDP2 (its own target, or the HF
    Trainer's) reduces the gradients in ``FSDP_REDUCE_DTYPE``, as the estimate times it
    (``model_states.grad_reduce_bytes``), '' where nothing is to do. ``accelerator``: the script's
    expression for its Accelerator.

    Accelerate's plugin takes its policy from the mixed precision alone, reducing in the 16-bit dtype
    (accelerate 1.15.0 FullyShardedDataParallelPlugin.set_mixed_precision: param_dtype = reduce_dtype;
    neither its config file nor the Trainer's fsdp_config has a key for it); fully_shard reads the
    plugin's policy when the model is prepared (utils/fsdp_utils.py fsdp2_prepare_model). Only full
    training reduces gradients the estimate times (the adapters' are not); fp32 and tf32 have no
    mixed precision to set."""
    lo, precision = plan.layout, plan.training.precision
    if lo.framework is not Framework.FSDP or lo.zero_stage == 0 or precision.stores_fp32:
        return ""
    if plan.training.method is not Method.FULL:
        return ""
    dtype = f"torch.{precision.weight_dtype}"
    return (
        f"\nfsdp gradient reduce: before the model is prepared (accelerator.prepare; the Trainer's train() "
        f"prepares it), set {accelerator}.state.fsdp_plugin."
        f"mixed_precision_policy = torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype={dtype}, "
        f"reduce_dtype=torch.{FSDP_REDUCE_DTYPE}, output_dtype={dtype}): the estimate reduce-scatters "
        f"gradients in {FSDP_REDUCE_DTYPE}, the plugin's own policy in {precision.weight_dtype}."
    )


# The encoder Linear each decoder-style LoRA target names (transformers modeling_bert.py /
# modeling_roberta.py, under <model>.encoder.layer.<i>.): q/k/v are attention.self.query/key/value,
# o is attention.output.dense (BertSelfOutput), up is intermediate.dense, down is output.dense
# (BertOutput). A GELU MLP has no gate.
_ENCODER_LORA_MODULES = {
    "q_proj": r"attention\.self\.query",
    "k_proj": r"attention\.self\.key",
    "v_proj": r"attention\.self\.value",
    "o_proj": r"attention\.output\.dense",
    "up_proj": r"intermediate\.dense",
    "down_proj": r"output\.dense",
}
# peft.TaskType of each encoder head (the masked-LM head has none: a plain PeftModel)
_ENCODER_TASK_TYPES = {
    Head.SEQUENCE_CLASSIFICATION: "SEQ_CLS",
    Head.QUESTION_ANSWERING: "QUESTION_ANS",
    Head.TOKEN_CLASSIFICATION: "TOKEN_CLS",
    Head.MASKED_LM: None,
}


def encoder_lora_fields(head: Head, targets: tuple[str, ...]) -> dict[str, object]:
    """LoraConfig's target_modules and task_type for a BERT-style encoder. A list of names matches
    module-name suffixes in peft, and "output.dense" would also match attention.output.dense, so the
    targets are one regular expression, which peft matches against the whole module name."""
    chosen = [_ENCODER_LORA_MODULES[t] for t in targets if t in _ENCODER_LORA_MODULES]
    pattern = r".*\.layer\.\d+\.(" + "|".join(chosen) + ")"
    return {"target_modules": pattern, "task_type": _ENCODER_TASK_TYPES[head]}


def peft_artifacts(plan: Plan, target: Target) -> list[Artifact]:
    """peft.LoraConfig (and, for QLoRA, transformers.BitsAndBytesConfig) fields of the estimated
    adapters: rank and target modules as estimated; lora_alpha 2 x rank and dropout 0 (neither changes
    memory or time: the estimate counts no adapter dropout)."""
    training = plan.training
    if training.method is Method.FULL:
        return []
    lora: dict[str, object] = {
        "r": training.lora_rank,
        "lora_alpha": 2 * training.lora_rank,
        "lora_dropout": 0.0,
        # the model's own module names (params.lora_modules: Phi-3's qkv_proj, GPT-2's c_attn)
        "target_modules": [name for _, name in lora_modules(plan.model, training.lora_targets)],
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    if plan.model.vision_tower:
        # target_modules match by suffix, so a multimodal wrapper's vision tower took adapters too
        # (SigLIP's q/k/v_proj in Gemma 3, Pixtral's in Mistral 3: a multimodal review); peft's
        # exclude_modules, a regular expression here, keeps them to the language model as estimated
        lora["exclude_modules"] = VISION_MODULES
    if plan.model.bidirectional:
        lora |= encoder_lora_fields(plan.model.head, training.lora_targets)
        if lora["task_type"] is None:
            del lora["task_type"]
    files = [
        Artifact(
            name=LORA_CONFIG_NAME, target=target, media_type=JSON, content=json.dumps(lora, indent=2) + "\n"
        )
    ]
    if training.method is Method.QLORA and not plan.model.bnb_4bit_checkpoint:
        # (a stored 4-bit checkpoint loads with its own saved quantization_config, which no file here
        # changes: peft_header says so, and none is written)
        # NF4 with double-quantised constants: the estimate's qlora_bits_per_param (4.127 bits).
        # The packed weights are stored in the compute dtype: FSDP and ZeRO-3 shard only floating
        # storage (bitsandbytes#970's quant_storage; the FSDP / DeepSpeed ZeRO-3 QLoRA path of PEFT's
        # docs), and the bytes per weight are the same as uint8's elsewhere.
        compute = training.precision.weight_dtype  # fp16 training (V100) computes in float16, not bf16
        bnb = {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": compute,
            "bnb_4bit_quant_storage": compute,
        }
        content = json.dumps(bnb, indent=2) + "\n"
        files.append(Artifact(name=BNB_CONFIG_NAME, target=target, media_type=JSON, content=content))
    return files
