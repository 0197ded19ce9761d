"""Training defaults that follow the hardware: what a request leaves out resolves against the GPU.

A request that names only a model, a cluster and a training length must be valid on every GPU it
can run on, so the fields whose best value depends on the part are not fixed constants:

- precision: bf16 mixed precision where the GPU has bf16 matrix units as fast as its fp16 ones
  (NVIDIA Ampere and newer, AMD CDNA 2/3), fp16 mixed precision with loss scaling where it has fp16
  units only (Volta, Turing) or faster ones (AMD CDNA 1, the MI100: 184.6 fp16 against 92.3 bf16
  TFLOP/s, AMD's datasheet), fp32 otherwise, and fp32 where fp16 would be for a family whose
  activations overflow it (``FP16_OVERFLOW_FAMILIES``: Gemma 2 and 3). fp8 is never a default: it
  changes numerics and needs a recipe; nor is tf32, which rounds every matmul's inputs to a 10-bit
  mantissa (a request opts in).
- attention: FlashAttention-2 where its kernels exist (``GPUSpec.flash_attention``: Ampere and
  newer, CDNA 2/3), otherwise PyTorch SDPA: its memory-efficient kernel (xFormers' cutlass kernel,
  which PyTorch ships for sm_50 and newer) never materialises the s x s scores either, except that
  it refuses transformers' grouped-query call, which then runs the math kernel
  (``flops.materialises_scores``; ``TrainingSpec.gpu_flash_kernels``, set here from the GPU, tells
  it where). Eager attention is a default only where the model's transformers implementation has
  neither (BLOOM): every GPU the catalog or a custom entry describes runs SDPA; a family without
  one of them resolves to the best it has (``params.transformers_attention``: Gemma 2 flash, or
  eager where the GPU has no flash kernels; Llama 4 SDPA).

``TrainingSpec.hardware_defaults`` names the fields a request left to the hardware (a
``TrainingSpec`` built without an attention leaves it so too); ``for_gpu`` resolves them, and
re-resolves them when the same job is placed on another GPU (suggestions, capacity across types).
An attention named flash with fp32 activations is refused (``validate.attention_precision_violation``),
never changed.
"""

from __future__ import annotations

import dataclasses

from service.estimator.comm import used_link_defaults
from service.estimator.params import transformers_attention
from service.estimator.types import Attention, ClusterSpec, GPUSpec, ModelSpec, Precision, TrainingSpec

# FlashAttention-2 and -3 (and PyTorch SDPA's flash backend, Transformer Engine's) take head dimensions
# up to 256 (Dao-AILab/flash-attention README, "Head dimension up to 256"; flash_api.cpp's TORCH_CHECK).
FLASH_MAX_HEAD_DIM = 256

# Families whose activations exceed fp16's range (65,504) in training: Gemma 2 and 3 (their embeddings
# are scaled up by sqrt(hidden) and their residual stream grows past it; Unsloth's "Gemma 3 Training
# Fixes", unsloth.ai/blog/gemma3, and unsloth-zoo PR #174: infinite activations and NaN gradients on T4,
# RTX 20-series and V100, whose matrix units are fp16 only). A loss scaler cannot help: it scales
# gradients, not the forward's activations. Where fp16 would be the default, fp32 is.
FP16_OVERFLOW_FAMILIES = frozenset({"gemma2", "gemma3"})

# The fields whose default depends on the GPU, in the order the answer lists them.
HARDWARE_DEFAULT_FIELDS: tuple[str, ...] = ("precision", "attention")


def best_precision(gpu: GPUSpec) -> Precision:
    """bf16 mixed where the GPU has bf16 units at least as fast as its fp16 ones, else fp16 mixed
    where it has fp16 units (a custom MI100 defaulted to bf16 at half its fp16 rate: its step twice
    fp16's; hardware review), else fp32."""
    peaks = gpu.peak_flops_per_s
    if peaks.bf16 is not None and (peaks.fp16 is None or peaks.bf16 >= peaks.fp16):
        return Precision.BF16
    if peaks.fp16 is not None:
        return Precision.FP16
    return Precision.FP32


def flash_refuses_dropout(model: ModelSpec) -> bool:
    """Whether flash-attn's kernels refuse the model's attention: softcapped scores with dropout
    (flash_api.cpp mha_fwd/mha_bwd: TORCH_CHECK(p_dropout == 0.f) where softcap > 0); Gemma 2 with
    attention_dropout 0.1 defaulted to flash (attention review)."""
    return bool(model.attn_logit_softcapping) and model.attention_dropout > 0


def best_attention(gpu: GPUSpec, precision: Precision, model: ModelSpec) -> Attention:
    """FlashAttention-2 where its kernels exist and take the training's activations (fp16 / bf16
    only: flash_attn's interface asserts the dtype) and its heads (``FLASH_MAX_HEAD_DIM``), else
    SDPA, which runs fp32 and any head too; of those the model's transformers implementation has
    (``params.transformers_attention``), else eager."""
    has = transformers_attention(model)
    wide = model.head_dim > FLASH_MAX_HEAD_DIM
    takes = not precision.stores_fp32 and not wide and not flash_refuses_dropout(model)
    if gpu.flash_attention and takes and Attention.FLASH in has:
        return Attention.FLASH
    return Attention.SDPA if Attention.SDPA in has else Attention.EAGER


def for_gpu(training: TrainingSpec, gpu: GPUSpec, model: ModelSpec) -> TrainingSpec:
    """``training`` with each field it left to the hardware (and the model's kernels) resolved for
    ``gpu``."""
    defaults = training.hardware_defaults
    if training.attention is None:  # built without one: left to the hardware, and named so
        defaults = defaults | {"attention"}
    precision = best_precision(gpu) if "precision" in defaults else training.precision
    if "precision" in defaults and precision is Precision.FP16 and model.family in FP16_OVERFLOW_FAMILIES:
        precision = Precision.FP32  # its activations overflow fp16 (FP16_OVERFLOW_FAMILIES)
    stored = model.bnb_4bit_compute_precision
    if "precision" in defaults and stored is not None:
        # a stored 4-bit checkpoint computes in its saved dtype whatever the rest loads in: trained in
        # another, its GEMMs ran bf16 on a T4 timed at fp16 (defaults review); where the GPU lacks it,
        # validate.checkpoint_hardware_violation says so
        precision = stored
    attention = best_attention(gpu, precision, model) if "attention" in defaults else training.attention
    flash = gpu.flash_attention  # what SDPA dispatches to follows it, whatever the request said
    if (
        precision is training.precision
        and attention is training.attention
        and flash is training.gpu_flash_kernels
    ):
        return training
    return dataclasses.replace(
        training,
        precision=precision,
        attention=attention,
        hardware_defaults=defaults,
        gpu_flash_kernels=flash,
    )


def chosen_defaults(training: TrainingSpec) -> dict[str, str]:
    """``{"training.precision": "fp16", ...}``: what each field left to the hardware resolved to."""
    return {
        f"training.{name}": str(getattr(training, name).value)
        for name in HARDWARE_DEFAULT_FIELDS
        if name in training.hardware_defaults
    }


def chosen_link_defaults(cluster: ClusterSpec) -> dict[str, str]:
    """``{"cluster.gpu.pcie_bandwidth_bytes_per_s": "16000000000"}``: each link figure a custom GPU
    left out that the cluster uses (``comm.used_link_defaults``), as resolved, in bytes/s."""
    return {
        f"cluster.gpu.{name}": f"{getattr(cluster.gpu, name):.0f}" for name, _ in used_link_defaults(cluster)
    }
