"""One estimator input (preset x catalog GPU x training x layout) as hypothesis draws it.

A ``Case`` prints as the ``POST /v1/estimates`` body that reproduces it, so a shrunk failure is a
request the lead can send with curl. Strategies draw layouts that are valid by construction where
that is cheap (tp divides the heads, ep the experts and dp x cp, ZeRO stages the framework has) and
let ``validate.layout_violation`` reject the rest (``hypothesis.assume``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from functools import cache
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from service.catalog.gpus import gpus
from service.catalog.models import models
from service.catalog.tuning import default_tuning
from service.estimator.calibration import Calibration
from service.estimator.errors import InvalidTraining
from service.estimator.estimate import estimate
from service.estimator.types import (
    LAYOUT_ENUM_FIELDS,
    Attention,
    ClusterSpec,
    Estimate,
    Framework,
    GPUSpec,
    Layout,
    MemoryBreakdown,
    Method,
    ModelSpec,
    Offload,
    Precision,
    RecomputeModule,
    TrainingSpec,
)
from service.estimator.validate import FRAMEWORK_CAPABILITIES, layout_violation

GPUS_PER_NODE = 8
INTER_NODE_BYTES_PER_S = 50e9  # 400 Gb/s per GPU between nodes
SEQ_LENS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
PEFT_FRAMEWORKS = tuple(f for f in Framework if FRAMEWORK_CAPABILITIES[f].peft)


@cache
def preset_names() -> tuple[str, ...]:
    """Every preset of service/catalog/models.toml, smallest model first (shrinking goes there)."""
    from service.estimator.params import parameter_counts

    return tuple(sorted(models(), key=lambda name: (parameter_counts(models()[name].spec).total, name)))


@cache
def gpu_names() -> tuple[str, ...]:
    """Every catalog GPU of service/catalog/gpus.toml, in file order (H100 SXM first)."""
    return tuple(gpus())


def preset(name: str) -> ModelSpec:
    return models()[name].spec


def gpu(name: str) -> GPUSpec:
    return gpus()[name]


def default_precision(spec: GPUSpec) -> Precision:
    """What issue 24 says a request without ``precision`` runs: bf16 where the GPU has it, else fp16."""
    peaks = spec.peak_flops_per_s
    return Precision.BF16 if peaks.bf16 is not None else Precision.FP16 if peaks.fp16 else Precision.FP32


def default_attention(spec: GPUSpec, precision: Precision) -> Attention:
    """What issue 24 says a request without ``attention`` runs: flash where it exists and takes the
    activations (fp16 / bf16; fp32 and tf32 keep them fp32), else sdpa."""
    return Attention.FLASH if spec.flash_attention and not precision.stores_fp32 else Attention.SDPA


def supported_precisions(spec: GPUSpec) -> tuple[Precision, ...]:
    peaks = spec.peak_flops_per_s
    has = {
        Precision.BF16: peaks.bf16,
        Precision.FP16: peaks.fp16,
        Precision.FP32: peaks.fp32,
        Precision.TF32: peaks.tf32,
        Precision.BF16_PURE: peaks.bf16,
        Precision.FP8: peaks.fp8,
    }
    return tuple(p for p, peak in has.items() if peak is not None)


def peak_of(spec: GPUSpec, precision: Precision) -> float:
    """The dense data-sheet peak of the precision's GEMMs (fp32: the non-tensor fp32 peak, PyTorch's
    default without TF32; tf32: the TF32 tensor-core peak), from the catalog, not from the estimator."""
    peaks = spec.peak_flops_per_s
    value = {
        Precision.FP32: peaks.fp32,
        Precision.TF32: peaks.tf32,
        Precision.BF16: peaks.bf16,
        Precision.BF16_PURE: peaks.bf16,
        Precision.FP16: peaks.fp16,
        Precision.FP8: peaks.fp8,
    }[precision]
    assert value is not None, f"{spec.name} has no {precision} peak"
    return value


@dataclass(frozen=True, slots=True)
class Case:
    """A job and one layout of it on ``layout.world_size`` GPUs of one catalog type."""

    preset: str
    gpu: str
    seq_len: int
    global_batch_size: int
    precision: Precision
    attention: Attention
    method: Method
    layout: Layout
    lora_rank: int = 16

    @property
    def model(self) -> ModelSpec:
        return preset(self.preset)

    @property
    def cluster(self) -> ClusterSpec:
        return cluster_of(self.gpu, self.layout.world_size)

    @property
    def training(self) -> TrainingSpec:
        return TrainingSpec(
            seq_len=self.seq_len,
            global_batch_size=self.global_batch_size,
            precision=self.precision,
            attention=self.attention,
            method=self.method,
            lora_rank=self.lora_rank,
        )

    def replace(self, **changes: Any) -> Case:
        layout_changes = {k: changes.pop(k) for k in list(changes) if k in LAYOUT_FIELDS}
        layout = dataclasses.replace(self.layout, **layout_changes) if layout_changes else self.layout
        return dataclasses.replace(self, layout=layout, **changes)

    def violation(self) -> str | None:
        try:
            training = self.training  # a training no tool runs (qlora in fp8) is refused whole
        except InvalidTraining as refused:
            return refused.message
        found = layout_violation(self.model, self.cluster, self.layout, training)
        return None if found is None else found.message

    def estimate(self, calibration: Calibration | None = None) -> Estimate:
        """``service.estimator.estimate`` of the case (no limits: they are searches of their own)."""
        return estimate(
            self.model,
            self.cluster,
            self.layout,
            self.training,
            tuning=default_tuning(),
            with_limits=False,
            calibration=calibration or Calibration(),
        )

    def request(self) -> dict[str, Any]:
        """The ``POST /v1/estimates`` body of this case."""
        return estimate_request(self)

    def __repr__(self) -> str:
        return f"Case(POST /v1/estimates {json.dumps(self.request(), separators=(',', ':'))})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # hypothesis's falsifying-example printer
        printer.text(repr(self))


LAYOUT_FIELDS = frozenset(f.name for f in dataclasses.fields(Layout))


def cluster_of(gpu_name: str, world: int, host_bytes_per_node: int = 0) -> ClusterSpec:
    """``world`` GPUs of a catalog type: one node up to 8, else nodes of 8 (world is 2^k here)."""
    spec = gpu(gpu_name)
    per_node = min(world, GPUS_PER_NODE)
    return ClusterSpec(
        gpu=spec,
        num_nodes=max(1, world // per_node),
        gpus_per_node=per_node,
        intra_node_bandwidth_bytes_per_s=spec.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=INTER_NODE_BYTES_PER_S,
        cpu_memory_bytes_per_node=host_bytes_per_node,
    )


def cluster_body(gpu_name: str, world: int, host_bytes_per_node: int = 0) -> dict[str, Any]:
    per_node = min(world, GPUS_PER_NODE)
    body: dict[str, Any] = {
        "gpu": gpu_name,
        "num_nodes": max(1, world // per_node),
        "gpus_per_node": per_node,
    }
    if body["num_nodes"] > 1:
        body["inter_node_bandwidth_bytes_per_s"] = INTER_NODE_BYTES_PER_S
    if host_bytes_per_node:
        body["cpu_memory_bytes_per_node"] = host_bytes_per_node
    return body


def layout_body(layout: Layout) -> dict[str, Any]:
    """A layout as the API takes it: only the fields that differ from the defaults."""
    default = Layout()
    out: dict[str, Any] = {}
    for f in dataclasses.fields(Layout):
        value = getattr(layout, f.name)
        if value != getattr(default, f.name):
            out[f.name] = list(value) if isinstance(value, tuple) else getattr(value, "value", value)
    out.setdefault("framework", layout.framework.value)
    return out


# Layout's enum fields and their enums (moe_dispatcher was missing from a list written here: its
# value stayed the string "alltoall", which the estimator's ``is`` comparisons took for flex)
_ENUMS: dict[str, Any] = dict(LAYOUT_ENUM_FIELDS)


def layout_from_api(layout: dict[str, Any]) -> Layout:
    """A layout as the API returns it (estimate.layout, a suggestion's layout) as the domain's."""
    fields: dict[str, Any] = {}
    for name, value in layout.items():
        if name not in LAYOUT_FIELDS or value is None:
            continue
        if name in _ENUMS:
            value = _ENUMS[name](value)
        elif name == "recompute_modules":
            value = tuple(RecomputeModule(v) for v in value)
        elif isinstance(value, list):
            value = tuple(value)
        fields[name] = value
    return Layout(**fields)


def estimate_request(case: Case) -> dict[str, Any]:
    training: dict[str, Any] = {
        "seq_len": case.seq_len,
        "global_batch_size": case.global_batch_size,
        "precision": case.precision.value,
        "attention": case.attention.value,
        "method": case.method.value,
    }
    if case.method is not Method.FULL and case.lora_rank != 16:
        training["lora_rank"] = case.lora_rank
    return {
        "model": {"preset": case.preset},
        "cluster": cluster_body(case.gpu, case.layout.world_size),
        "training": training,
        "layout": layout_body(case.layout),
    }


def model_states(memory: MemoryBreakdown) -> int:
    """Parameters + gradients + optimizer states of one GPU: what issue 24 calls model-state bytes."""
    return memory.parameters + memory.gradients + memory.optimizer_states


# ---------------------------------------------------------------- strategies


def _powers_of_two_dividing(n: int, up_to: int) -> list[int]:
    return [d for d in (1, 2, 4, 8, 16, 32, 64) if d <= up_to and n % d == 0]


@st.composite
def cases(
    draw: st.DrawFn,
    *,
    frameworks: tuple[Framework, ...] = tuple(Framework),
    methods: tuple[Method, ...] = tuple(Method),
    precisions: tuple[Precision, ...] | None = None,
    zero_stages: tuple[int, ...] | None = None,
    min_accumulation: int = 1,
    min_dp: int = 1,
    offload: bool = True,
    presets: tuple[str, ...] | None = None,
    catalog_gpus: tuple[str, ...] | None = None,
    seq_lens: tuple[int, ...] = SEQ_LENS,
) -> Case:
    """A valid case. ``precisions`` None: the GPU's default precision (bf16, else fp16) or, now and
    then, another one it supports; attention is the GPU's default or sdpa/eager."""
    name = draw(st.sampled_from(presets or preset_names()))
    gpu_name = draw(st.sampled_from(catalog_gpus or gpu_names()))
    model, spec = preset(name), gpu(gpu_name)
    method = draw(st.sampled_from(methods))
    allowed = [f for f in frameworks if method is Method.FULL or f in PEFT_FRAMEWORKS]
    assume(allowed)
    framework = draw(st.sampled_from(allowed))
    caps = FRAMEWORK_CAPABILITIES[framework]

    supported = supported_precisions(spec)
    if precisions is None:
        precision = draw(st.sampled_from((default_precision(spec), *supported)))
    else:
        choices = [p for p in precisions if p in supported]
        assume(choices)
        precision = draw(st.sampled_from(choices))
    attention = draw(
        st.sampled_from(
            (default_attention(spec, precision), Attention.SDPA, Attention.EAGER)
            if spec.flash_attention
            else (Attention.SDPA, Attention.EAGER)
        )
    )
    seq_len = draw(st.sampled_from(seq_lens))

    heads = math.gcd(model.num_attention_heads, model.num_kv_heads)
    tp = draw(st.sampled_from(_powers_of_two_dividing(heads, 8)))
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if p <= model.num_layers]))
    dp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d >= min_dp]))
    cp = draw(st.sampled_from((1, 1, 1, 2)))
    ep = 1
    if model.moe is not None:
        ep = draw(st.sampled_from(_powers_of_two_dividing(math.gcd(model.moe.num_experts, dp * cp), 64)))
    stages = sorted(caps.zero_stages if zero_stages is None else set(zero_stages) & caps.zero_stages)
    if pp > 1:
        stages = [s for s in stages if s <= caps.max_zero_stage_with_pp]
    assume(stages)
    zero = draw(st.sampled_from(stages))
    recompute = draw(st.sampled_from(sorted(caps.recompute_modes)))
    micro = draw(st.sampled_from((1, 2, 4)))
    accumulation = draw(st.sampled_from([a for a in (1, 2, 4, 8) if a >= min_accumulation]))
    offload_optimizer = Offload.NONE
    if offload and zero >= 1 and draw(st.sampled_from((False, False, False, True))):
        offload_optimizer = Offload.CPU
    offload_params = Offload.NONE
    if framework is Framework.FSDP:
        offload_params = offload_optimizer if zero == 3 else Offload.NONE
        offload_optimizer = offload_params
    layout = Layout(
        framework=framework,
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        sequence_parallel=tp > 1 and framework is Framework.MEGATRON,
        zero_stage=zero,
        recompute=recompute,
        micro_batch_size=micro,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
    )
    case = Case(
        preset=name,
        gpu=gpu_name,
        seq_len=seq_len,
        global_batch_size=micro * dp * accumulation,
        precision=precision,
        attention=attention,
        method=method,
        layout=layout,
    )
    assume(case.violation() is None)
    return case
