"""Published and measured cases turned into estimator inputs, and our number for each of them.

This is the one place that reads ``validation/data/*.json`` (measured with PyTorch) and the
published cases of ``../shared/reference/cases/visible.json`` and builds the estimator's inputs for
them. ``tests/estimator/test_reference_memory.py`` and ``tests/estimator/test_step_time.py`` import
the inputs from here and assert on them; ``validation.report`` turns the same inputs into ``Row``s
for ``validation/REPORT.md``. Imports no torch: only the measuring modules
(``validation.param_counts``, ``validation.activations``) need it.

Sections (``Row.section``):

* ``parameter counts``: every case of ``param_counts.json``, recomputed live with
  ``service.estimator.params`` (exact, every component).
* ``activations``: every case of ``activations.json``, total bytes at both depths and per layer,
  from ``service.estimator.activations`` (within 10%).
* ``published memory``: ZeRO Table 1 and Figure 1, DeepSpeed's estimators and worked example,
  Megatron-LM's unit test, Korthikanti Table 2, the seed article's errata (with their verdicts).
* ``published throughput``: step time from the source's own FLOPs formula and its published
  TFLOP/s (within 15%), and the fit verdict on the published layout.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

from service.catalog.tuning import default_tuning
from service.estimator import activations, evaluate, flops
from service.estimator.hf_config import model_from_hf_config
from service.estimator.job import prepare, rank_kind_counts
from service.estimator.model_states import (
    ModelStates,
    megatron_fused_adam_on_gpu,
    megatron_grads_in_fp32,
    megatron_master_remainders,
    rank_model_states,
    rank_parameters,
    shard_degrees,
    state_bytes,
)
from service.estimator.params import LayerKind, layer_kind, layer_parameters, parameter_counts
from service.estimator.types import (
    Attention,
    AttentionKind,
    ClusterSpec,
    Framework,
    GPUSpec,
    Layout,
    MemoryEstimate,
    MlpKind,
    ModelSpec,
    NormKind,
    Offload,
    ParameterCounts,
    PeakFlops,
    PositionEmbedding,
    Precision,
    Recompute,
    TimeEstimate,
    TrainingSpec,
)
from validation.published_formulas import (
    deepspeed_zero2_estimate,
    deepspeed_zero3_estimate,
    megatron_weight_and_optimizer_bytes,
)

DENSE = LayerKind(moe=False)  # a dense decoder layer with full attention

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "validation" / "data"
PARAM_COUNTS_PATH = DATA_DIR / "param_counts.json"
ACTIVATIONS_PATH = DATA_DIR / "activations.json"
# CI keeps a copy of shared/ beside the clone; the fallback is the development checkout's.
CASES_PATH = ROOT.parent / "shared" / "reference" / "cases" / "visible.json"
if not CASES_PATH.exists():
    CASES_PATH = Path("/work/shared/reference/cases/visible.json")

GB, GiB, MB = 10**9, 2**30, 2**20

PARAMETER_COUNTS = "parameter counts"
ACTIVATIONS = "activations"
PUBLISHED_MEMORY = "published memory"
PUBLISHED_THROUGHPUT = "published throughput"
SECTIONS = (PARAMETER_COUNTS, ACTIVATIONS, PUBLISHED_MEMORY, PUBLISHED_THROUGHPUT)

ACTIVATION_TOLERANCE = 0.10  # issue 3: estimates within 10% of measured
STEP_TIME_TOLERANCE = 0.15  # issue 4: step time within 15% of the published one


# ---------------------------------------------------------------- rows


class Expect(StrEnum):
    """What a row is expected to do: pass, fail for a known and explained reason, or not count."""

    PASS = "pass"
    KNOWN_GAP = "known gap"  # like a strict xfail: passing is news too (remove the mark)
    EXCLUDED = "excluded"  # not comparable; shown with the reason, not counted


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One compared quantity: the reference (published or measured) value and ours."""

    section: str
    case_id: str
    quantity: str
    reference: float | str
    ours: float | str
    unit: str
    error: float | None  # (ours - reference) / reference; None for verdicts
    tolerance: float  # relative; 0 with abs_tolerance 0 means exact
    ok: bool
    note: str = ""
    abs_tolerance: float = 0.0  # in ``unit``; the row passes within the larger of the two
    expect: Expect = Expect.PASS

    @property
    def as_expected(self) -> bool:
        """Passes when expected to; fails when it is a known gap; excluded rows always are."""
        if self.expect is Expect.EXCLUDED:
            return True
        return self.ok is (self.expect is Expect.PASS)


def compare(
    section: str,
    case_id: str,
    quantity: str,
    reference: float,
    ours: float,
    unit: str,
    *,
    tolerance: float = 0.0,
    abs_tolerance: float = 0.0,
    expect: Expect = Expect.PASS,
    note: str = "",
) -> Row:
    """A numeric row: ok when |ours - reference| <= max(abs_tolerance, tolerance x |reference|)."""
    error = (ours - reference) / reference if reference else (0.0 if ours == reference else float("inf"))
    ok = abs(ours - reference) <= max(abs_tolerance, tolerance * abs(reference))
    return Row(
        section=section, case_id=case_id, quantity=quantity, reference=reference, ours=ours, unit=unit,
        error=error, tolerance=tolerance, abs_tolerance=abs_tolerance, ok=ok, expect=expect, note=note,
    )  # fmt: skip


def _fit_word(fit: bool) -> str:
    return "fits" if fit else "does not fit"


def verdict(section: str, case_id: str, quantity: str, expected: bool, got: bool, note: str = "") -> Row:
    """A fit verdict row: ok when ours says what the source (or its erratum) says."""
    return Row(
        section=section, case_id=case_id, quantity=quantity, reference=_fit_word(expected),
        ours=_fit_word(got), unit="verdict", error=None, tolerance=0.0, ok=expected == got, note=note,
    )  # fmt: skip


# ---------------------------------------------------------------- data files


@cache
def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def published_cases(prefix: str = "") -> list[dict[str, Any]]:
    """The cases of visible.json whose id starts with ``prefix``."""
    return [c for c in _json(CASES_PATH) if c["id"].startswith(prefix)]


def published_case(prefix: str) -> dict[str, Any]:
    (case,) = published_cases(prefix)
    return case


def param_count_document() -> dict[str, Any]:
    document: dict[str, Any] = _json(PARAM_COUNTS_PATH)
    return document


def activation_document() -> dict[str, Any]:
    document: dict[str, Any] = _json(ACTIVATIONS_PATH)
    return document


# ---------------------------------------------------------------- hardware and model builders


def gpu(name: str, memory_bytes: int, bf16: bool = True) -> GPUSpec:
    """A GPU for memory cases: only ``memory_bytes`` (and whether bf16 exists) matters there."""
    return GPUSpec(
        name=name,
        memory_bytes=memory_bytes,
        peak_flops_per_s=PeakFlops(fp32=1.5e13, bf16=1.6e14 if bf16 else None, fp16=1.2e14),
        hbm_bandwidth_bytes_per_s=1e12,
        intra_node_bandwidth_bytes_per_s=3.2e10,
        pcie_bandwidth_bytes_per_s=3.2e10,
    )


def single_node(g: GPUSpec, gpus: int, cpu_bytes: int = 0) -> ClusterSpec:
    """One node of ``gpus`` cards, with ``cpu_bytes`` of host memory (0: not checked)."""
    return ClusterSpec(
        gpu=g,
        num_nodes=1,
        gpus_per_node=gpus,
        intra_node_bandwidth_bytes_per_s=3.2e10,
        inter_node_bandwidth_bytes_per_s=1.25e10,
        cpu_memory_bytes_per_node=cpu_bytes,
    )


A100 = GPUSpec(
    name="a100-sxm-80gb",
    chip="ga100",
    memory_bytes=80 * 10**9,
    peak_flops_per_s=PeakFlops(fp32=19.5e12, tf32=156e12, bf16=312e12, fp16=312e12),
    hbm_bandwidth_bytes_per_s=2.039e12,
    intra_node_bandwidth_bytes_per_s=300e9,  # NVLink 3, per direction
    pcie_bandwidth_bytes_per_s=32e9,
)
H100 = GPUSpec(
    name="h100-sxm-80gb",
    chip="gh100",
    memory_bytes=80 * 10**9,
    peak_flops_per_s=PeakFlops(fp32=67e12, tf32=494e12, bf16=989e12, fp16=989e12, fp8=1979e12),
    hbm_bandwidth_bytes_per_s=3.35e12,
    intra_node_bandwidth_bytes_per_s=450e9,  # NVLink 4, per direction
    pcie_bandwidth_bytes_per_s=64e9,
)


def gpu_cluster(g: GPUSpec, gpus: int, inter_node_bytes_per_s: float) -> ClusterSpec:
    """8-GPU nodes of ``g`` (fewer when ``gpus`` < 8) with the given network per GPU."""
    # A100 Selene: 8 x 200 Gb/s HDR per 8 GPUs = 25e9 B/s per GPU; H100: 8 x 400 Gb/s = 50e9
    return ClusterSpec(
        gpu=g,
        num_nodes=max(1, gpus // 8),
        gpus_per_node=min(8, gpus),
        intra_node_bandwidth_bytes_per_s=g.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=inter_node_bytes_per_s,
    )


def gpt(layers: int, hidden: int, heads: int, vocab: int = 51200, seq_len: int = 2048) -> ModelSpec:
    """GPT-2/3 style: learned positions, 4h GELU MLP, LayerNorm, biases, tied embeddings, trained with
    dropout 0.1 (Megatron-LM's --hidden-dropout and --attention-dropout defaults, which the papers'
    runs used: Korthikanti Table 2 counts their masks)."""
    # family "custom", not "gpt2": the Megatron-style papers' model, without HF implementation quirks
    return ModelSpec(
        hidden_dropout=0.1,
        attention_dropout=0.1,
        name=f"gpt-{layers}x{hidden}",
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=heads,
        ffn_hidden_size=4 * hidden,
        vocab_size=vocab,
        max_position_embeddings=seq_len,
        mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM,
        position_embedding=PositionEmbedding.LEARNED,
        tied_embeddings=True,
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
    )


# ---------------------------------------------------------------- ZeRO and DeepSpeed


def flat_model(psi: int) -> tuple[ModelSpec, ParameterCounts]:
    """A model of exactly ``psi`` parameters, all in one layer's attention: enough for model states."""
    model = ModelSpec(
        name="flat",
        num_layers=1,
        hidden_size=8,
        num_attention_heads=1,
        num_kv_heads=1,
        ffn_hidden_size=8,
        vocab_size=8,
    )
    counts = ParameterCounts(
        total=psi, embedding=0, output=0, final_norm=0, attention_per_layer=psi, norms_per_layer=0,
        dense_layers=1, dense_mlp_per_layer=0, largest_module=psi,
    )  # fmt: skip
    return model, counts


def flat_model_states(
    model: ModelSpec, counts: ParameterCounts, cluster: ClusterSpec, layout: Layout, training: TrainingSpec
) -> ModelStates:
    """The estimator's model-state formulas on a flat model's own counts (one pipeline rank)."""
    assume = default_tuning().memory
    rp = rank_parameters(model, counts, layout, 0, ((DENSE, model.num_layers),))
    fused = (megatron_fused_adam_on_gpu(layout, training), megatron_master_remainders(layout, training))
    grads = megatron_grads_in_fp32(layout)
    sb = state_bytes(training, layout.framework, model, assume, grads, (False, False), fused)
    degrees = shard_degrees(layout, cluster)
    return ModelStates.of(rank_model_states(model, layout, training, rp, sb, degrees, assume))


def zero_states_gb(psi: int, dp: int, stage: int) -> float:
    """ZeRO paper's per-device model states (fp16 mixed precision, Adam) in GB = 1e9."""
    model, counts = flat_model(psi)
    fp16 = TrainingSpec(seq_len=1024, global_batch_size=dp, precision=Precision.FP16)
    c = single_node(gpu("v100", 32 * GiB), dp) if dp <= 1024 else None
    assert c is not None
    s = flat_model_states(model, counts, c, Layout(dp=dp, zero_stage=stage), fp16)
    return (s.parameters + s.gradients + s.optimizer_states) / GB


ZERO_TABLE1_COLUMNS = (("P_os", 1), ("P_os+g", 2), ("P_os+g+p", 3))
ZERO_FIGURE1_KEYS = (("P_os_GB", 1), ("P_os+g_GB", 2), ("P_os+g+p_GB", 3))


def zero_abs_tolerance_gb(reported: float) -> float:
    # The paper truncates (4187.5 -> 4187): within 0.1 GB or 1%.
    return max(0.1, 0.01 * reported)


def deepspeed_tutorial_zero1_optimizer_gb() -> float:
    """GPT-2 1.5B on 8 V100s, ZeRO-1: Adam states 12 x 1.5e9 = 18 GB, over 8 GPUs = 2.25 GB."""
    model, counts = flat_model(1_500_000_000)
    fp16 = TrainingSpec(seq_len=1024, global_batch_size=8, precision=Precision.FP16)
    c, lay = single_node(gpu("v100", 32 * GiB), 8), Layout(dp=8, zero_stage=1)
    return flat_model_states(model, counts, c, lay, fp16).optimizer_states / GB


T5_3B = 2_851_598_336  # t5-3b, shared parameters once (printed "2851M")
T5_3B_LARGEST = 32_899_072  # its shared embedding, 32128 x 1024 (printed "32M")
T5_LARGE, T5_LARGE_LARGEST = 737_668_096, 32_899_072  # t5-large: "737.67M", "32.90M"
# (case id, total parameters, largest layer) of DeepSpeed's live-model and cold estimators
DEEPSPEED_ZERO2_CASES = (
    ("deepspeed-est-zero2-live-t5-3b-1x8", T5_3B),
    ("deepspeed-est-zero2-cold-2851e6-1x8", 2_851_000_000),
)
DEEPSPEED_ZERO3_CASES = (
    ("deepspeed-est-zero3-live-t5-3b-1x8", T5_3B, T5_3B_LARGEST),
    ("deepspeed-est-zero3-cold-2851e6-32e6-1x8", 2_851_000_000, 32_000_000),
)


def gib(x: float) -> float:
    return round(x / GiB, 2)  # DeepSpeed prints bytes / 2**30 with 2 decimals, labelled "GB"


def zero3_options(key: str) -> dict[str, bool]:
    """``deepspeed_zero3_estimate`` keywords for a reported key like 'offload_param=cpu,...,zero_init=1'."""
    opts = dict(part.split("=") for part in key.split(","))
    return {
        "cpu_offload": opts["offload_optimizer"] == "cpu",
        "cpu_offload_params": opts["offload_param"] == "cpu",
        "zero_init": opts["zero_init"] == "1",
    }


def t5_large_worked_example_mb() -> dict[str, int]:
    """DeepSpeed's t5-large ZeRO-3 example on 4 GPUs, in MB = bytes >> 20, keyed as visible.json."""
    p, largest = T5_LARGE, T5_LARGE_LARGEST
    none = deepspeed_zero3_estimate(p, largest, 4, cpu_offload=False, cpu_offload_params=False)[0]
    both = deepspeed_zero3_estimate(p, largest, 4, cpu_offload=True, cpu_offload_params=True)[0]
    optim = deepspeed_zero3_estimate(p, largest, 4, cpu_offload=True, cpu_offload_params=False)[0]
    return {
        "largest_layer_memory_MB": (4 * largest) >> 20,
        "case1_no_offload_gpu_MB": int(none) >> 20,
        "case2_offload_param_and_optimizer_gpu_MB": int(both) >> 20,
        "case3_offload_optimizer_only_gpu_MB": int(optim) >> 20,
    }


# ---------------------------------------------------------------- Megatron-LM

# Megatron-LM tests/unit_tests/training/test_weight_and_optimizer_memory.py: h 8, ffn 16 (no
# SwiGLU), 2 layers (dense, MoE), 2 heads, kv_channels 4, vocab 32, 4 experts of ffn 16, shared
# expert ffn 8, RMSNorm, tied. Attention 2h^2(1 + 1) = 256, MLP 2 x 8 x 16 = 256, norms 2 x 8 = 16,
# router 8 x 4 = 32, shared 2 x 8 x 8 = 128, experts 4 x 256 = 1024.
MEGATRON_UNIT_TEST_COUNTS = ParameterCounts(
    total=0, embedding=256, output=0, final_norm=8, attention_per_layer=256, norms_per_layer=16,
    dense_layers=1, dense_mlp_per_layer=256, moe_layers=1, experts_per_moe_layer=1024,
    router_per_moe_layer=32, shared_experts_per_moe_layer=128,
)  # fmt: skip


def megatron_unit_test1_bytes() -> float:
    """Our ``megatron_weight_and_optimizer_bytes`` on the unit test's "test1 (pp=2, world=64)"."""
    return megatron_weight_and_optimizer_bytes(MEGATRON_UNIT_TEST_COUNTS, tp=2, pp=2, dp=16, ep=2, etp=4)


_ARITHMETIC: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def arithmetic(expression: str) -> float:
    """Value of a published arithmetic expression such as '(256 + 128)/2 * (6 + 12/16) bytes'."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            return _ARITHMETIC[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"not plain arithmetic: {ast.dump(node)}")

    return value(ast.parse(expression.strip().removesuffix("bytes"), mode="eval").body)


GPT_22B = ModelSpec(
    name="gpt-22b", num_layers=48, hidden_size=6144, num_attention_heads=64, num_kv_heads=64,
    ffn_hidden_size=24576, vocab_size=51200, mlp=MlpKind.GELU, norm=NormKind.LAYERNORM,
    hidden_dropout=0.1, attention_dropout=0.1,  # Table 2 counts the dropout masks
)  # fmt: skip
KORTHIKANTI_SBH = 2048 * 4 * 6144  # s 2048, b 4, h 6144

# Korthikanti Table 2 with s 2048, h 6144, a 64: 5as/h = 5 x 64 x 2048 / 6144 = 106.67.
# (row, tp, sequence parallel, recompute, published bytes per sbh)
KORTHIKANTI_TABLE2: tuple[tuple[str, int, bool, Recompute, float], ...] = (
    ("no-parallelism", 1, False, Recompute.NONE, 34 + 5 * 64 * 2048 / 6144),
    ("tensor-parallel", 8, False, Recompute.NONE, 10 + 24 / 8 + 5 * 64 * 2048 / (6144 * 8)),
    ("tensor+sequence-parallel", 8, True, Recompute.NONE, 34 / 8 + 5 * 64 * 2048 / (6144 * 8)),
    ("tensor-parallel+selective-recompute", 8, False, Recompute.SELECTIVE, 10 + 24 / 8),
    ("tensor+sequence-parallel+selective-recompute", 8, True, Recompute.SELECTIVE, 34 / 8),
    ("full-recompute", 8, False, Recompute.FULL, 2),
)


def korthikanti_table2_inputs(tp: int, sp: bool, recompute: Recompute) -> tuple[Layout, TrainingSpec]:
    """Megatron layout and training of the 22B model (Table 3) for one row of Table 2."""
    training = TrainingSpec(seq_len=2048, global_batch_size=4, attention=Attention.EAGER)
    lay = Layout(
        framework=Framework.MEGATRON, tp=tp, sequence_parallel=sp, recompute=recompute, micro_batch_size=4
    )
    return lay, training


# ---------------------------------------------------------------- the seed article's errata

LLAMA_2_7B = ModelSpec(
    name="llama-2-7b", family="llama", num_layers=32, hidden_size=4096, num_attention_heads=32,
    num_kv_heads=32, ffn_hidden_size=11008, vocab_size=32000,
)  # fmt: skip
LLAMA_2_13B = ModelSpec(
    name="llama-2-13b", family="llama", num_layers=40, hidden_size=5120, num_attention_heads=40,
    num_kv_heads=40, ffn_hidden_size=13824, vocab_size=32000,
)  # fmt: skip
RTX_4090 = gpu("rtx-4090-24gb", 24 * GiB)
V100_32GB = gpu("v100-32gb", 32 * GiB, bf16=False)
H100_80GB = gpu("h100-80gb", 80 * GiB)

# (model, cluster, layout, training)
MemoryCase = tuple[ModelSpec, ClusterSpec, Layout, TrainingSpec]


def erratum_7b_zero2_on_8x24gb() -> MemoryCase:
    """'A 7B model with ZeRO-2 runs on 8 x 24 GB cards' (full recompute, no offload)."""
    c = single_node(RTX_4090, 8, cpu_bytes=512 * GB)
    training = TrainingSpec(seq_len=2048, global_batch_size=8)
    return LLAMA_2_7B, c, Layout(dp=8, zero_stage=2, recompute=Recompute.FULL), training


def erratum_13b_zero3_on_4x32gb() -> MemoryCase:
    """'13B on 4 x 32 GB with ZeRO-3: under 60 GB per card' (V100: fp16, no bf16)."""
    c = single_node(V100_32GB, 4, cpu_bytes=512 * GB)
    training = TrainingSpec(seq_len=2048, global_batch_size=4, precision=Precision.FP16)
    return LLAMA_2_13B, c, Layout(dp=4, zero_stage=3, recompute=Recompute.FULL), training


ERRATUM_PURE_DP_DEGREES = (1, 4, 8, 64)


def erratum_7b_pure_data_parallel(dp: int) -> MemoryCase:
    """'Pure data parallelism of 7B needs at least 4 x 80 GB cards', at ``dp`` cards."""
    c = ClusterSpec(
        gpu=H100_80GB, num_nodes=max(1, dp // 8), gpus_per_node=min(dp, 8),
        intra_node_bandwidth_bytes_per_s=4.5e11, inter_node_bandwidth_bytes_per_s=5e10,
    )  # fmt: skip
    training = TrainingSpec(seq_len=2048, global_batch_size=dp)
    return LLAMA_2_7B, c, Layout(dp=dp, recompute=Recompute.FULL), training


def memory_estimate(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, training: TrainingSpec
) -> MemoryEstimate:
    """The estimator's memory of one layout (``evaluate.memory_estimate`` on the prepared job)."""
    return evaluate.memory_estimate(prepare(model, cluster, training, default_tuning()), layout)


def fits(model: ModelSpec, cluster: ClusterSpec, layout: Layout, training: TrainingSpec) -> bool:
    return evaluate.memory_fits(memory_estimate(model, cluster, layout, training), cluster)


def time_estimate(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, training: TrainingSpec
) -> TimeEstimate:
    """The estimator's step time of one layout."""
    return evaluate.time_estimate(prepare(model, cluster, training, default_tuning()), layout)


def model_state_bytes_per_gpu(case: MemoryCase) -> int:
    b = memory_estimate(*case).per_gpu
    return b.parameters + b.gradients + b.optimizer_states


def with_optimizer_offload(case: MemoryCase) -> MemoryCase:
    model, c, lay, training = case
    return model, c, dataclasses.replace(lay, offload_optimizer=Offload.CPU), training


# ---------------------------------------------------------------- measured HF activations

# Cases whose CPU kernel is not the one CUDA runs, so not comparable with the estimator (which
# models CUDA's): a grouped-query model's unmasked fp32 SDPA (transformers' enable_gqa) runs the CPU's
# flash kernel, while CUDA's flash kernel takes 16 bits only and its memory-efficient one no grouped
# heads, so CUDA runs the math kernel (flops.materialises_scores; measured on an H200,
# validation/data/device_runs.json). (Falcon-7B's multi-query SDPA, one kv head beside every query head
# with a mask, takes PyTorch's math kernel on both, upcast to fp32 on both: compared.)


def cpu_only_reason(case: dict[str, Any]) -> str | None:
    """Why a case of activations.json ran another kernel on the CPU than CUDA runs, or None."""
    config = case["config"]
    heads = config.get("num_attention_heads")
    grouped = heads is not None and config.get("num_key_value_heads", heads) < heads
    if case["dtype"] == "float32" and case["attn_implementation"] == "sdpa" and grouped:
        return (
            "excluded: on the CPU, grouped-query fp32 SDPA (enable_gqa) runs the flash kernel, saving no "
            "s x s probabilities; CUDA has no fp32 flash or grouped memory-efficient kernel and runs the "
            "math one, which the estimate models (validation/data/device_runs.json)"
        )
    return None


def measured_cases() -> list[dict[str, Any]]:
    """Records of activations.json that are comparable with the estimator (CUDA code paths)."""
    if not ACTIVATIONS_PATH.exists():
        return []
    return [c for c in activation_document()["cases"] if cpu_only_reason(c) is None]


def hf_model(case: dict[str, Any], layers: int) -> ModelSpec:
    """The measured model's spec at ``layers`` layers, through the estimator's HF config reader."""
    config = {
        **case["config"],
        "model_type": case["model_type"],
        "num_hidden_layers": layers,
        "n_layer": layers,
    }
    return model_from_hf_config(config, name=case["id"])


def measured_inputs(case: dict[str, Any]) -> tuple[Layout, TrainingSpec]:
    """One GPU (FSDP-style HF training, no parallelism), the measured batch, dtype and attention."""
    training = TrainingSpec(
        seq_len=case["seq_len"],
        global_batch_size=case["batch"],
        precision=Precision.FP32 if case["dtype"] == "float32" else Precision.BF16,
        attention=Attention(case["attn_implementation"]),
    )
    return Layout(framework=Framework.FSDP, micro_batch_size=case["batch"]), training


def _one_gpu_activation_bytes(model: ModelSpec, layout: Layout, training: TrainingSpec) -> int:
    # the single rank's activations (one micro-batch in flight), as the estimator sums them
    job = prepare(model, gpu_cluster(H100, 1, 25e9), training, default_tuning())
    layer = activations.layer_activations(job, layout)
    per_micro = activations.rank_micro_batch_bytes(layer, rank_kind_counts(job, layout)[0], 1.0)
    return activations.stage_activation_bytes(layout, layer, per_micro, 0, 1)


def measured_layer_kind(label: str) -> LayerKind:
    """The estimator's kind of a measured ``layer_kinds`` label (``attention/mlp``, e.g.
    ``sliding/dense``)."""
    attention, mlp = label.split("/")
    return LayerKind(moe=mlp == "moe", attention=AttentionKind(attention))


def activation_kind_estimates(case: dict[str, Any]) -> dict[str, float]:
    """Our bytes for one layer of each kind the case measured (``per_kind_bytes``)."""
    lay, training = measured_inputs(case)
    model = hf_model(case, len(case["layer_kinds"]))
    return {
        label: activations.layer_bytes(model, lay, training, measured_layer_kind(label), Recompute.NONE)
        for label in case["per_kind_bytes"]
    }


def activation_estimates(case: dict[str, Any]) -> tuple[dict[str, int], float]:
    """Our saved bytes for each measured depth (keyed as ``total_bytes``) and per layer: the mean
    of the layers the deeper model adds (``per_layer_bytes`` is their two-depth difference)."""
    lay, training = measured_inputs(case)
    totals = {
        layers: _one_gpu_activation_bytes(hf_model(case, int(layers)), lay, training)
        for layers in case["total_bytes"]
    }
    shallow, deep = sorted(int(layers) for layers in case["total_bytes"])
    model = hf_model(case, deep)
    added = [layer_kind(model, index) for index in range(shallow, deep)]
    per_layer = sum(
        activations.layer_bytes(model, lay, training, kind, Recompute.NONE) for kind in added
    ) / len(added)
    return totals, per_layer


# ---------------------------------------------------------------- published throughput


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputCase:
    """A published training run: its layout on our types and the step time its numbers imply."""

    id: str  # visible.json id
    model: ModelSpec
    cluster: ClusterSpec
    layout: Layout
    training: TrainingSpec
    published_step_s: float
    derivation: str  # how published_step_s follows from the source
    known_gap: str = ""  # why our step time is off by more than the tolerance (a strict xfail)


def eq3_flops(b: int, s: int, layers: int, h: int, v: int) -> float:
    # Narayanan Eq. 3 (counts the full-recompute forward)
    return 96 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h))


def eq7_flops(b: int, s: int, layers: int, h: int, v: int) -> float:
    # Korthikanti Eq. 7 = Megatron-LM num_floating_point_operations for a GPT (no recompute)
    return 72 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))


def _published(case_id: str) -> dict[str, Any]:
    return published_case(case_id) if CASES_PATH.exists() else {}


def narayanan(
    case_id: str, layers: int, h: int, heads: int, gpus: int, tp: int, pp: int, batch: int, micro: int,
    virtual: int, tflops: float,
) -> ThroughputCase:  # fmt: skip
    """Narayanan et al. Table 1 on Selene A100s: fp16, full recompute, eager attention (2021)."""
    layout = Layout(
        framework=Framework.MEGATRON,
        dp=gpus // (tp * pp),
        tp=tp,
        pp=pp,
        micro_batch_size=micro,
        virtual_pipeline_stages=virtual,
        recompute=Recompute.FULL,
        # Megatron-LM in 2021 reduced gradients after the backward (--overlap-grad-reduce came in 2023)
        overlap_grad_reduce=False if gpus // (tp * pp) > 1 else None,
    )
    training = TrainingSpec(
        seq_len=2048, global_batch_size=batch, precision=Precision.FP16, attention=Attention.EAGER
    )
    return ThroughputCase(
        id=case_id,
        model=gpt(layers, h, heads),
        cluster=gpu_cluster(A100, gpus, 25e9),
        layout=layout,
        training=training,
        published_step_s=eq3_flops(batch, 2048, layers, h, 51200) / (tflops * 1e12 * gpus),
        derivation=f"Eq. 3 FLOPs / ({tflops:g} TFLOP/s x {gpus} GPUs)",
    )


def megatron_h100(
    case_id: str, layers: int, h: int, heads: int, gpus: int, tp: int, pp: int, batch: int, micro: int,
    virtual: int, tflops: float, known_gap: str = "",
) -> ThroughputCase:  # fmt: skip
    """Megatron-Core README on H100s: bf16, flash attention (TE), SP with TP, distributed optimizer,
    --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap."""
    layout = Layout(
        framework=Framework.MEGATRON,
        dp=gpus // (tp * pp),
        tp=tp,
        pp=pp,
        micro_batch_size=micro,
        virtual_pipeline_stages=virtual,
        sequence_parallel=tp > 1,
        zero_stage=1,
        tp_comm_overlap=True,
        overlap_grad_reduce=True,
        grad_reduce_in_fp32=True,  # the README's flags name no --grad-reduce-in-bf16: Megatron-LM's fp32
        precision_aware_optimizer=False,  # ... nor --use-precision-aware-optimizer: its own fp32 master
    )
    training = TrainingSpec(seq_len=4096, global_batch_size=batch, precision=Precision.BF16)
    return ThroughputCase(
        id=case_id,
        model=gpt(layers, h, heads, vocab=131072, seq_len=4096),
        cluster=gpu_cluster(H100, gpus, 50e9),
        layout=layout,
        training=training,
        published_step_s=eq7_flops(batch, 4096, layers, h, 131072) / (tflops * 1e12 * gpus),
        derivation=f"Eq. 7 (Megatron num_floating_point_operations) / ({tflops:g} TFLOP/s x {gpus} GPUs)",
        known_gap=known_gap,
    )


def korthikanti_22b() -> ThroughputCase:
    """Korthikanti Table 5, 22B 'present work': SP + selective recompute, 1.10 s per iteration."""
    layout = Layout(
        framework=Framework.MEGATRON,
        tp=8,
        micro_batch_size=4,
        sequence_parallel=True,
        recompute=Recompute.SELECTIVE,
        grad_reduce_in_fp32=True,  # Megatron-LM (2022) accumulated bf16 grads in fp32, its only way then
    )
    training = TrainingSpec(
        seq_len=2048, global_batch_size=4, precision=Precision.BF16, attention=Attention.EAGER
    )
    return ThroughputCase(
        id="korthikanti-table5-22B",
        model=gpt(48, 6144, 64),
        cluster=gpu_cluster(A100, 8, 25e9),
        layout=layout,
        training=training,
        published_step_s=1.10,
        derivation="iteration time published (Table 5); Eq. 7/8 reproduce its MFU/HFU",
    )


def bloom_prequel() -> ThroughputCase:
    """BigScience prequel: Megatron-DeepSpeed, tp=8, ZeRO-1, bf16, activation checkpointing."""
    layout = Layout(
        framework=Framework.DEEPSPEED, tp=8, micro_batch_size=1, zero_stage=1, recompute=Recompute.FULL
    )
    training = TrainingSpec(
        seq_len=2048, global_batch_size=2048, precision=Precision.BF16, attention=Attention.EAGER
    )
    return ThroughputCase(
        id="bloom-prequel-bf16-20B-8gpu",
        model=gpt(8, 14400, 32, vocab=250680),
        cluster=gpu_cluster(A100, 8, 25e9),
        layout=layout,
        training=training,
        published_step_s=777.09,
        derivation="sec_per_iteration published (its 107.48 TFLOP/s come from the old BigScience formula); "
        "head_dim 450 (900-byte rows) is off the 16-byte alignment: eager attention's core runs at "
        "unaligned_core_factor, fitted on the head-count pairs below, not on this row (-31.5% without it)",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadDimPair:
    """Two runs of one layout that differ in the head count (or hidden size) only: one head_dim on the
    16-byte alignment, one off it. The ratio of their step times tests ``unaligned_core_factor``."""

    id: str
    aligned: ThroughputCase
    unaligned: ThroughputCase
    in_fit: bool  # one of the pairs ``unaligned_core_factor`` was fitted to
    note: str

    @property
    def published_ratio(self) -> float:
        return self.unaligned.published_step_s / self.aligned.published_step_s


HEAD_DIM_RATIO_TOLERANCE = 0.05  # the same layout measured on 02-23 and 02-26 differs by 5.6%
PREQUEL = "bigscience-workshop/bigscience train/tr11-176B-ml/chronicles-prequel.md"


def _prequel_run(
    tag: str, layers: int, h: int, heads: int, dp: int, tp: int, pp: int, micro: int, published_s: float
) -> ThroughputCase:  # fmt: skip
    """A 02-20..02-26 prequel run: 8-GPU A100 80GB nodes on Omni-Path (4 x 100 Gb/s per node),
    Megatron-DeepSpeed, fp16 (the bf16 optimizer came on 02-28), ZeRO-1, full recompute, eager attention."""
    layout = Layout(
        framework=Framework.DEEPSPEED, dp=dp, tp=tp, pp=pp, micro_batch_size=micro, zero_stage=1,
        recompute=Recompute.FULL,
    )  # fmt: skip
    training = TrainingSpec(
        seq_len=2048, global_batch_size=2048, precision=Precision.FP16, attention=Attention.EAGER
    )
    return ThroughputCase(
        id=f"{tag}-h{h}-a{heads}",
        model=gpt(layers, h, heads, vocab=250680),
        cluster=gpu_cluster(A100, dp * tp * pp, 6.25e9),
        layout=layout,
        training=training,
        published_step_s=published_s,
        derivation="Sec/it published",
    )


def head_dim_pairs() -> tuple[HeadDimPair, ...]:
    """The prequel's same-layout pairs with an unaligned head_dim (108, 225) against an aligned one."""
    proxy = (
        "78 layers over pp 12 are uneven (the source: 7 per stage, 1 on the last); modelled as 84 = 12 x 7"
    )

    def nheads(tag: str, layers: int, dp: int, tp: int, pp: int, micro: int, s96: float, s128: float,
               note: str) -> HeadDimPair:  # fmt: skip
        return HeadDimPair(
            id=f"bigscience-prequel-nheads-{tag}",
            aligned=_prequel_run(tag, layers, 13824, 96, dp, tp, pp, micro, s96),
            unaligned=_prequel_run(tag, layers, 13824, 128, dp, tp, pp, micro, s128),
            in_fit=True,
            note=f"{PREQUEL}: h 13824, 96 heads (head_dim 144) vs 128 (108, 216-byte rows); {note}",
        )

    return (
        nheads("0223-dp8-tp8-pp6-b4", 78, 8, 8, 6, 4, 124.75, 162.72, "'NHEADs comparison' 02-23"),
        nheads("0226-dp8-tp8-pp6-b4", 78, 8, 8, 6, 4, 118.12, 156.84, "'Another round of NHEADS' 02-26"),
        nheads("0226-dp8-tp4-pp12-b2", 84, 8, 4, 12, 2, 107.12, 147.41, f"'Another round' 02-26; {proxy}"),
        nheads("0226-dp8-tp4-pp12-b4", 84, 8, 4, 12, 4, 110.31, 153.90, f"'Another round' 02-26; {proxy}"),
        HeadDimPair(
            id="bigscience-prequel-hidden-0220-dp4-tp8-pp10-b1",
            aligned=_prequel_run("0220", 80, 13824, 64, 4, 8, 10, 1, 160.29),
            unaligned=_prequel_run("0220", 80, 14400, 64, 4, 8, 10, 1, 221.21),
            in_fit=False,
            note=f"{PREQUEL} 'tile and wave quantization' 02-20: h 13824 (187B, head_dim 216) vs 14400 "
            "(200B, 225, 450-byte rows); 64 heads ('all NHEADS=64 (above too)'; 96 heads, 144 vs 150: 1.403)",
        ),
    )


def throughput_cases() -> tuple[ThroughputCase, ...]:
    """Every published run of visible.json with a step time, on its published layout."""
    return (
        narayanan("narayanan-table1-1.7B", 24, 2304, 24, 32, 1, 1, 512, 16, 1, 137),
        narayanan("narayanan-table1-18B", 40, 6144, 48, 256, 8, 1, 1024, 8, 1, 135),
        narayanan("narayanan-table1-145B", 80, 12288, 96, 1536, 8, 8, 2304, 2, 2, 148),
        # v unknown for 1T (the sc21 script sets no virtual stage): plain 1F1B, v = 1
        narayanan("narayanan-table1-1T", 128, 25600, 160, 3072, 8, 64, 3072, 1, 1, 163),
        korthikanti_22b(),
        # micro-batch and interleaving are not published: b = B/dp (one micro-batch) when pp = 1;
        # b = 1 and v = 4 (4 layers per virtual stage) for the 177B pipeline
        megatron_h100("megatron-h100-weak-scaling-1.7B", 24, 2048, 16, 48, 1, 1, 192, 4, 1, 408.8),
        megatron_h100("megatron-h100-weak-scaling-32B", 48, 7168, 56, 384, 8, 1, 192, 4, 1, 459.6),
        megatron_h100("megatron-h100-weak-scaling-177B", 96, 12288, 96, 2304, 8, 6, 1152, 1, 4, 432.8),
        bloom_prequel(),
    )


# Korthikanti Table 4: one transformer layer of the 22B model, tp 8, micro-batch 4 (case id suffix,
# sequence parallel, recompute).
KORTHIKANTI_TABLE4: tuple[tuple[str, bool, Recompute], ...] = (
    ("baseline_no_recompute", False, Recompute.NONE),
    ("sequence_parallelism", True, Recompute.NONE),
    ("baseline_with_full_recompute", False, Recompute.FULL),
    ("selective_recompute", False, Recompute.SELECTIVE),
    ("selective+sequence", True, Recompute.SELECTIVE),
)


def korthikanti_layer_time_s(sp: bool, recompute: Recompute) -> float:
    """Our forward + backward time of one 22B layer: the layers' FLOP share of compute and TP
    communication, plus a layer's recompute (the optimizer and the logits are not in Table 4)."""
    base = korthikanti_22b()
    lay = dataclasses.replace(base.layout, sequence_parallel=sp, recompute=recompute)
    b = time_estimate(base.model, base.cluster, lay, base.training).breakdown
    layers = base.model.num_layers
    layer = flops.layer_training_flops(base.model, DENSE, base.training, fused_experts=True)
    share = layer / (layers * layer + flops.logits_training_flops(base.model, base.training))
    return (b.compute_s + b.tp_comm_s) * share + b.recompute_s / layers


# ---------------------------------------------------------------- rows per section


def parameter_count_rows() -> Iterator[Row]:
    """Every measured count of param_counts.json against ``parameter_counts`` now (exact)."""
    for case in param_count_document()["cases"]:
        spec = model_from_hf_config(case["config"], name=case["case"])
        counts = parameter_counts(spec)
        ours = {
            "total": counts.total,
            "embedding": counts.embedding,
            "output": counts.output,
            "final_norm": counts.final_norm,
            "largest_module": counts.largest_module,
        }
        wrong = [key for key, value in ours.items() if value != case[f"measured_{key}"]]
        if [layer_parameters(spec, i) for i in range(spec.num_layers)] != case["measured_layers"]:
            wrong.append("layers")
        note = f"{case['origin']}, {case['model_type']}; " + (
            f"MISMATCH in {', '.join(wrong)}" if wrong else "embedding, output, final norm, every layer, "
            "largest module also exact"
        )  # fmt: skip
        row = compare(PARAMETER_COUNTS, case["case"], "total parameters", case["measured_total"],
                      counts.total, "parameters", note=note)  # fmt: skip
        yield dataclasses.replace(row, ok=row.ok and not wrong)


def _activation_case_note(case: dict[str, Any]) -> str:
    shape = f"b {case['batch']}, s {case['seq_len']}"
    notes = [f"{case['model_type']}, {case['dtype']}, {case['attn_implementation']}, {shape}"]
    notes += [case["note"]] if case.get("note") else []
    return "; ".join(notes)


def activation_rows() -> Iterator[Row]:
    """Every case of activations.json: totals at both depths and per layer, within 10%; a case
    with layers of several kinds also one layer of each kind."""
    for case in activation_document()["cases"]:
        reason = cpu_only_reason(case)
        excluded = reason is not None
        note = reason or _activation_case_note(case)
        totals, per_layer = activation_estimates(case)
        pairs: list[tuple[str, float, float]] = [
            (f"total bytes, {layers} layers", measured, totals[layers])
            for layers, measured in case["total_bytes"].items()
        ]
        pairs.append(("bytes per layer", case["per_layer_bytes"], per_layer))
        if len(case["per_kind_bytes"]) > 1:
            kinds = activation_kind_estimates(case)
            pairs += [
                (f"bytes per {label} layer", measured, kinds[label])
                for label, measured in case["per_kind_bytes"].items()
            ]
        for quantity, measured, ours in pairs:
            yield compare(
                ACTIVATIONS, case["id"], quantity, measured, ours, "bytes", tolerance=ACTIVATION_TOLERANCE,
                expect=Expect.EXCLUDED if excluded else Expect.PASS, note=note,
            )  # fmt: skip


def _zero_rows() -> Iterator[Row]:
    for case in published_cases("zero-table1-"):
        psi, dp = int(case["model"]["params"]), case["training"]["dp"]
        reported = case["reported"]["per_device_model_state_memory_GB"]
        for column, stage in ZERO_TABLE1_COLUMNS:
            yield compare(
                PUBLISHED_MEMORY, case["id"], f"model states per GPU, {column} (ZeRO-{stage})",
                reported[column], zero_states_gb(psi, dp, stage), "GB",
                tolerance=0.01, abs_tolerance=0.1, note="paper truncates: within 0.1 GB or 1%",
            )  # fmt: skip
    figure = published_case("zero-figure1")
    psi, r = int(figure["model"]["params"]), figure["reported"]
    yield compare(PUBLISHED_MEMORY, figure["id"], "model states per GPU, baseline", r["baseline_GB"],
                  zero_states_gb(psi, 64, 0), "GB", tolerance=0.01)  # fmt: skip
    for key, stage in ZERO_FIGURE1_KEYS:
        yield compare(
            PUBLISHED_MEMORY, figure["id"], f"model states per GPU, {key.removesuffix('_GB')}", r[key],
            zero_states_gb(psi, 64, stage), "GB", tolerance=0.01, abs_tolerance=0.1,
        )  # fmt: skip
    tutorial = published_case("deepspeed-tutorial-zero1")
    yield compare(
        PUBLISHED_MEMORY, tutorial["id"], "optimizer states per GPU, ZeRO-1",
        tutorial["reported"]["per_device_optimizer_memory_with_zero1_GB"],
        deepspeed_tutorial_zero1_optimizer_gb(), "GB",
        note="its OOM without ZeRO is not checked: the sequence length and recompute are not stated",
    )  # fmt: skip


def _deepspeed_rows() -> Iterator[Row]:
    for case_id, params in DEEPSPEED_ZERO2_CASES:
        reported = published_case(case_id)["reported"]
        gpu_bytes, cpu_bytes = deepspeed_zero2_estimate(params, 8, 1, cpu_offload=True)
        offload = reported["offload_optimizer=cpu"]
        yield compare(PUBLISHED_MEMORY, case_id, "ZeRO-2 offload_optimizer=cpu, per GPU",
                      offload["per_GPU_GB"], gib(gpu_bytes), "GiB")  # fmt: skip
        yield compare(PUBLISHED_MEMORY, case_id, "ZeRO-2 offload_optimizer=cpu, per CPU",
                      offload["per_CPU_GB"], gib(cpu_bytes), "GiB")  # fmt: skip
        none = reported["offload_optimizer=none"]
        gpu_bytes, cpu_bytes = deepspeed_zero2_estimate(params, 8, 1, cpu_offload=False, legacy=True)
        current = gib(deepspeed_zero2_estimate(params, 8, 1, cpu_offload=False)[0])
        yield compare(
            PUBLISHED_MEMORY, case_id, "ZeRO-2 offload_optimizer=none, per GPU", none["per_GPU_GB"],
            gib(gpu_bytes), "GiB",
            note=f"the docs predate PR #5099 (4P + 16P/G); today's 2P + 18P/G gives {current:.2f}",
        )  # fmt: skip
        yield compare(PUBLISHED_MEMORY, case_id, "ZeRO-2 offload_optimizer=none, per CPU",
                      none["per_CPU_GB"], gib(cpu_bytes), "GiB")  # fmt: skip
    for case_id, params, largest in DEEPSPEED_ZERO3_CASES:
        for key, reported in published_case(case_id)["reported"].items():
            gpu_bytes, cpu_bytes = deepspeed_zero3_estimate(params, largest, 8, 1, **zero3_options(key))
            yield compare(PUBLISHED_MEMORY, case_id, f"ZeRO-3 {key}, per GPU", reported["per_GPU_GB"],
                          gib(gpu_bytes), "GiB")  # fmt: skip
            yield compare(PUBLISHED_MEMORY, case_id, f"ZeRO-3 {key}, per CPU", reported["per_CPU_GB"],
                          gib(cpu_bytes), "GiB")  # fmt: skip
    t5 = published_case("deepspeed-doc-t5-large")
    for key, ours in t5_large_worked_example_mb().items():
        yield compare(PUBLISHED_MEMORY, t5["id"], key.removesuffix("_MB"), t5["reported"][key], ours, "MiB")


def _megatron_rows() -> Iterator[Row]:
    case = published_case("megatron-unit-test")
    expression = case["reported"]["test1 (pp=2, world=64)"]
    ours = megatron_unit_test1_bytes()
    yield compare(
        PUBLISHED_MEMORY, case["id"], "weight and optimizer bytes, test1 (tp 2, pp 2, dp 16, ep 2, etp 4)",
        arithmetic(expression), ours, "bytes",
        note="reference: the test's own expression, evaluated; test4 needs moe_latent_size (not modelled)",
    )  # fmt: skip
    for row, tp, sp, recompute, per_sbh in KORTHIKANTI_TABLE2:
        lay, training = korthikanti_table2_inputs(tp, sp, recompute)
        ours = activations.layer_bytes(GPT_22B, lay, training, DENSE, lay.recompute)
        yield compare(
            PUBLISHED_MEMORY, f"korthikanti-table2-{row}", "activation bytes per layer (22B, s 2048, b 4)",
            per_sbh * KORTHIKANTI_SBH, ours, "bytes",
            tolerance=1e-12, note=f"Table 2 formula: {per_sbh:.4g} sbh, tp {tp}",
        )  # fmt: skip


def _errata_rows() -> Iterator[Row]:
    # service "must be right where [the seed article] is wrong": its errata's numbers and verdicts.
    p7, p13 = parameter_counts(LLAMA_2_7B).total, parameter_counts(LLAMA_2_13B).total
    case = erratum_7b_zero2_on_8x24gb()
    name = "seed-erratum-7b-zero2-8x24gb"
    yield compare(PUBLISHED_MEMORY, name, "model states per GPU (2P + 14P/8)", 25.3,
                  model_state_bytes_per_gpu(case) / GB, "GB", abs_tolerance=0.05)  # fmt: skip
    yield verdict(PUBLISHED_MEMORY, name, "verdict, no offload", False, fits(*case),
                  note="the article: 'a 7B model with ZeRO-2 runs on 8 x 24 GB cards'")  # fmt: skip
    offloaded = with_optimizer_offload(case)
    yield verdict(PUBLISHED_MEMORY, name, "verdict, optimizer offloaded", True, fits(*offloaded))
    case = erratum_13b_zero3_on_4x32gb()
    name = "seed-erratum-13b-zero3-4x32gb"
    yield compare(PUBLISHED_MEMORY, name, "model states per GPU (16P/4)", 52,
                  model_state_bytes_per_gpu(case) / GB, "GB", abs_tolerance=0.5)  # fmt: skip
    yield verdict(PUBLISHED_MEMORY, name, "verdict, ZeRO-3 no offload", False, fits(*case),
                  note="the article: 'under 60 GB' per card")  # fmt: skip
    host = memory_estimate(*with_optimizer_offload(case)).cpu_per_node_bytes
    yield verdict(
        PUBLISHED_MEMORY, name, "verdict, optimizer offloaded", True, fits(*with_optimizer_offload(case)),
        note=f"host {host / GB:.0f} GB per node = {host / p13:.0f}P (the erratum's 12P = "
        f"{12 * p13 / GB:.0f} GB plus the fp32 gradient copy CPU Adam needs and DeepSpeed's 16-bit host "
        "gradient buffer)",
    )  # fmt: skip
    for dp in ERRATUM_PURE_DP_DEGREES:
        case = erratum_7b_pure_data_parallel(dp)
        name = f"seed-erratum-7b-pure-dp-{dp}x80gb"
        yield compare(PUBLISHED_MEMORY, name, "model states per GPU (16P)", 108,
                      model_state_bytes_per_gpu(case) / GB, "GB", abs_tolerance=0.5,
                      note=f"16P = {16 * p7 / GB:.1f} GB whatever dp is")  # fmt: skip
        claim = "the article: 'pure data parallelism of 7B needs at least 4 x 80 GB cards'"
        yield verdict(PUBLISHED_MEMORY, name, "verdict", False, fits(*case), note=claim)


def published_memory_rows() -> Iterator[Row]:
    yield from _zero_rows()
    yield from _deepspeed_rows()
    yield from _megatron_rows()
    yield from _errata_rows()


def published_throughput_rows() -> Iterator[Row]:
    """Published step times (within 15%) and fit verdicts on the published layouts."""
    for case in throughput_cases():
        est = time_estimate(case.model, case.cluster, case.layout, case.training)
        yield compare(
            PUBLISHED_THROUGHPUT, case.id, "step time", case.published_step_s, est.step_s, "s",
            tolerance=STEP_TIME_TOLERANCE, expect=Expect.KNOWN_GAP if case.known_gap else Expect.PASS,
            note=case.known_gap or case.derivation,
        )  # fmt: skip
        memory = memory_estimate(case.model, case.cluster, case.layout, case.training)
        note = f"ours {memory.per_gpu.total / GB:.1f} of {memory.capacity_bytes / GB:.0f} GB per GPU"
        if "max_gpu_memory_used" in (reported := _published(case.id).get("reported", {})):
            note += f"; published max used {reported['max_gpu_memory_used']} (allocator peak)"
        fit = fits(case.model, case.cluster, case.layout, case.training)
        yield verdict(PUBLISHED_THROUGHPUT, case.id, "verdict (the run trained)", True, fit, note=note)
    for suffix, sp, recompute in KORTHIKANTI_TABLE4:
        case_id = f"korthikanti-table4-22B-{suffix}"
        reported = published_case(case_id)["reported"]
        yield compare(
            PUBLISHED_THROUGHPUT, case_id, "forward + backward of one layer", reported["combined_ms"],
            korthikanti_layer_time_s(sp, recompute) * 1e3, "ms", tolerance=STEP_TIME_TOLERANCE,
            note="one-layer timing: no fit verdict (the 48-layer model needs recompute or SP to fit 80 GB)",
        )  # fmt: skip
    yield from head_dim_pair_rows()


def head_dim_pair_step_s(case: ThroughputCase) -> float:
    return time_estimate(case.model, case.cluster, case.layout, case.training).step_s


def head_dim_pair_rows() -> Iterator[Row]:
    """Step-time ratio of each same-layout pair, unaligned over aligned head_dim, within 5%."""
    for pair in head_dim_pairs():
        aligned, unaligned = head_dim_pair_step_s(pair.aligned), head_dim_pair_step_s(pair.unaligned)
        published = f"{pair.aligned.published_step_s:g} and {pair.unaligned.published_step_s:g} s"
        times = f"step times published {published}, ours {aligned:.1f} and {unaligned:.1f} s"
        fit = "in the fit of unaligned_core_factor" if pair.in_fit else "out of the fit"
        yield compare(
            PUBLISHED_THROUGHPUT, pair.id, "step-time ratio, unaligned / aligned head_dim",
            pair.published_ratio, unaligned / aligned, "x", tolerance=HEAD_DIM_RATIO_TOLERANCE,
            note=f"{fit}; {pair.note}; {times}",
        )  # fmt: skip


ROW_BUILDERS: dict[str, Callable[[], Iterator[Row]]] = {
    PARAMETER_COUNTS: parameter_count_rows,
    ACTIVATIONS: activation_rows,
    PUBLISHED_MEMORY: published_memory_rows,
    PUBLISHED_THROUGHPUT: published_throughput_rows,
}


def all_rows() -> list[Row]:
    """Every row of every section, in report order."""
    return [row for section in SECTIONS for row in ROW_BUILDERS[section]()]
