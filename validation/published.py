"""The published training runs of ``validation/data/published_runs.json``, as estimator inputs.

``load_rows`` reads the file (118 rows: 98 step times, 20 measured peak memories, each with a
pre-assigned ``split``, ``fit`` or ``held_out``; ``published_runs.md`` documents every field and
the split rule). ``inputs`` turns one row into ``(ModelSpec, ClusterSpec, TrainingSpec, Layout)``
plus the caveats: what the row sets that the service has no field for (fp8 recipe details,
CUDA graphs, the GPU variant, ...), reported next to the row, never dropped
silently. A row the service cannot express raises ``Unexpressible`` with the reason.
``evaluate`` compares our step time (throughput rows) or per-GPU memory (memory rows) with the
published number, and ``summarize`` reports each half (fit, held-out) and kind separately.

Choices:

* GPU: the catalog part named by ``cluster.gpu``. torchtitan's 96 GB / 500 W Grand Teton H100 (and
  its docs' 94 GB lower-TDP part) is the catalog's ``h100-sxm-500w-96gb``, whose power limit scales
  its compute peaks (``service.estimator.clocks``); a row's ``gpu_variant`` stays a caveat.
* Memory: each memory row names the statistic its figure is (``memory_statistic``, read from its
  ``memory_measure``): ``reserved`` (PyTorch's ``reserved_bytes.all.peak``, torchtitan's
  max_reserved), ``allocated`` (``max_memory_allocated``) or ``device_used`` (nvidia-smi, NVML),
  stored in bytes (GiB x 2**30). It is compared with the estimate's figure of the same name
  (``MemoryBreakdown.statistic``): reserved holds the fragmentation reserve, device used also the
  CUDA context and NCCL's buffers.
* Recompute, as each framework names its policies (``service.estimator.types.Recompute``):
  Megatron selective (core attention) -> SELECTIVE; torchtitan per-op selective -> SELECTIVE_OP;
  torchtitan selective *layer* (every N-th block) and Megatron selective of other modules have
  no service policy; full -> FULL (Megatron's block method -> ``recompute_num_layers``).
* Pipeline split: ``pipeline_layers`` with one entry per virtual stage is passed as is; with one
  entry per pipeline rank under interleaving, the row's Megatron account-for-embedding/loss flags
  give the split, checked against the row's per-rank counts.

Imports no torch; the output depends only on the file and the estimator.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, NamedTuple

from service.catalog.errors import UnknownCatalogEntry
from service.catalog.gpus import gpu as catalog_gpu
from service.catalog.models import model as catalog_model
from service.catalog.tuning import default_tuning
from service.estimator.errors import EstimatorError
from service.estimator.estimate import estimate
from service.estimator.hf_config import model_from_hf_config
from service.estimator.pipeline import stage_layers
from service.estimator.tuning import Tuning
from service.estimator.types import (
    ALL_LINEAR,
    Attention,
    ClusterSpec,
    Compile,
    Framework,
    Layout,
    MemoryStatistic,
    Method,
    MlpKind,
    ModelSpec,
    MoeDispatcher,
    NormKind,
    PositionEmbedding,
    Precision,
    Recompute,
    RecomputeModule,
    TrainingSpec,
)
from service.estimator.validate import validate_layout
from validation.cases import DATA_DIR

PUBLISHED_RUNS_PATH = DATA_DIR / "published_runs.json"

SPLITS: tuple[str, ...] = ("fit", "held_out")
KINDS: tuple[str, ...] = ("throughput", "memory")
# within this |error| a row counts as matching: step time 15%, memory 10% (the acceptance targets)
TOLERANCE: Mapping[str, float] = {"throughput": 0.15, "memory": 0.10}
UNIT: Mapping[str, str] = {"throughput": "s/step", "memory": "GiB"}

GiB = 2**30
# Host RAM is not published for these clusters; generous, so no row is limited by it (no offload).
CPU_MEMORY_BYTES_PER_NODE = 2 * 2**40

Row = dict[str, Any]
Inputs = tuple[ModelSpec, ClusterSpec, TrainingSpec, Layout]


class Unexpressible(Exception):
    """The service cannot express this published run; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------- the file


@cache
def document() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(PUBLISHED_RUNS_PATH.read_text(encoding="utf-8"))
    return data


def load_rows() -> tuple[Row, ...]:
    """Every row of ``published_runs.json``, in file order."""
    return tuple(document()["rows"])


def row_by_id(row_id: str) -> Row:
    for row in load_rows():
        if row["id"] == row_id:
            return row
    raise KeyError(row_id)


def split_by_rule(rows: Sequence[Row]) -> dict[str, str]:
    """The split of every row recomputed from the file's ``split_rule``: a group's rows share it;
    a group belongs to the cell (source_key, gpu) of its alphabetically first row id; within a
    cell the groups, sorted by name, alternate fit, held_out, ... (even 0-based index = fit)."""
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    cells: dict[tuple[str, str], list[str]] = {}
    for name, members in groups.items():
        first = min(members, key=lambda r: str(r["id"]))
        cells.setdefault((first["source_key"], first["cluster"]["gpu"]), []).append(name)
    group_split = {
        name: SPLITS[index % 2] for names in cells.values() for index, name in enumerate(sorted(names))
    }
    return {row["id"]: group_split[row["group"]] for row in rows}


# ---------------------------------------------------------------- model


_MLP = {"swiglu": MlpKind.SWIGLU, "geglu": MlpKind.GEGLU, "gelu": MlpKind.GELU}
_NORM = {"rmsnorm": NormKind.RMSNORM, "layernorm": NormKind.LAYERNORM}
_POSITIONS = {
    "rope": PositionEmbedding.ROPE,
    "learned": PositionEmbedding.LEARNED,
    "alibi": PositionEmbedding.ALIBI,
}
_ARCH_INT_FIELDS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "ffn_hidden_size",
    "vocab_size",
    "head_dim",
    "max_position_embeddings",
)
_ARCH_BOOL_FIELDS = ("tied_embeddings", "qkv_bias", "attn_out_bias", "mlp_bias")


def _enum_field(arch: Mapping[str, Any], key: str, table: Mapping[str, Any]) -> Any:
    value = arch.get(key)
    if not isinstance(value, str) or value not in table:
        known = sorted(table)
        raise Unexpressible(f"architecture {key} {value!r} has no ModelSpec counterpart (known: {known})")
    return table[value]


def _architecture(name: str, arch: Mapping[str, Any], caveats: list[str]) -> ModelSpec:
    known = {*_ARCH_INT_FIELDS, *_ARCH_BOOL_FIELDS, "mlp", "norm", "position_embedding", "bias"}
    for key in sorted(arch):
        if key.startswith("_"):
            continue
        if key.endswith("_detail"):
            caveats.append(f"{key[: -len('_detail')]}: {arch[key]}")
        elif key not in known:
            raise Unexpressible(f"architecture field {key!r} has no ModelSpec counterpart")
    kwargs: dict[str, Any] = {k: arch[k] for k in _ARCH_INT_FIELDS if arch.get(k) is not None}
    bias = bool(arch.get("bias", False))
    kwargs |= {"qkv_bias": bias, "attn_out_bias": bias, "mlp_bias": bias}
    kwargs |= {k: bool(arch[k]) for k in _ARCH_BOOL_FIELDS if arch.get(k) is not None}
    try:
        return ModelSpec(
            name=name,
            mlp=_enum_field(arch, "mlp", _MLP),
            norm=_enum_field(arch, "norm", _NORM),
            position_embedding=_enum_field(arch, "position_embedding", _POSITIONS),
            **kwargs,
        )
    except (EstimatorError, TypeError) as error:
        raise Unexpressible(f"architecture: {error}") from None


def build_model(row: Row, caveats: list[str]) -> ModelSpec:
    spec = row["model"]
    if "preset" in spec:
        try:
            return catalog_model(str(spec["preset"])).spec
        except UnknownCatalogEntry as error:
            raise Unexpressible(error.message) from None
    if "hf_config" in spec:
        config = {k: v for k, v in spec["hf_config"].items() if not k.startswith("_")}
        try:
            return model_from_hf_config(config, name=row["id"])
        except EstimatorError as error:
            raise Unexpressible(error.message) from None
    if "architecture" in spec:
        return _architecture(row["id"], spec["architecture"], caveats)
    raise Unexpressible(f"model given as {sorted(spec)}: needs preset, hf_config or architecture")


# ---------------------------------------------------------------- cluster and training


def build_cluster(row: Row, caveats: list[str]) -> ClusterSpec:
    c = row["cluster"]
    try:
        gpu = catalog_gpu(str(c["gpu"]))
    except UnknownCatalogEntry as error:
        raise Unexpressible(error.message) from None
    variant = c.get("gpu_variant")
    if variant:
        described = variant.get("description", "") if isinstance(variant, Mapping) else str(variant)
        stated = variant.get("hbm_bandwidth_bytes_per_s") if isinstance(variant, Mapping) else None
        if isinstance(stated, int | float):
            # the variant's published HBM bandwidth, as a custom GPU of the same die would state it
            # (its power limit is the catalog part's, named by cluster.gpu)
            gpu = dataclasses.replace(gpu, hbm_bandwidth_bytes_per_s=float(stated))
            caveats.append(
                f"GPU variant: {described.split(';')[0]}; {gpu.name} with its {stated / 1e12:.2g} TB/s HBM"
            )
        else:
            caveats.append(f"GPU variant: {described.split(';')[0]}; catalog {gpu.name} used")
    if c["num_nodes"] * c["gpus_per_node"] != c["total_gpus"]:
        raise Unexpressible(f"num_nodes x gpus_per_node != total_gpus ({c['total_gpus']})")
    return ClusterSpec(
        gpu=gpu,
        num_nodes=int(c["num_nodes"]),
        gpus_per_node=int(c["gpus_per_node"]),
        intra_node_bandwidth_bytes_per_s=gpu.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=float(c["inter_node_bandwidth_bytes_per_s"]),
        cpu_memory_bytes_per_node=CPU_MEMORY_BYTES_PER_NODE,
    )


_PRECISIONS = {
    "bf16": Precision.BF16,
    "fp8": Precision.FP8,
    "fp16": Precision.FP16,
    "fp32": Precision.FP32,  # fp32 everywhere, CUDA-core matmuls (V100)
    "tf32": Precision.TF32,  # fp32 tensors, TF32 tensor-core matmuls (A100, PyTorch's default until 1.12)
}
_ATTENTION = {"flash": Attention.FLASH, "sdpa": Attention.SDPA, "eager": Attention.EAGER}
_METHODS = {"full": Method.FULL, "lora": Method.LORA, "qlora": Method.QLORA}


def build_training(row: Row) -> TrainingSpec:
    t = row["training"]
    if t.get("precision") not in _PRECISIONS:
        raise Unexpressible(f"precision {t.get('precision')!r} has no service counterpart")
    if t.get("attention") not in _ATTENTION:
        raise Unexpressible(f"attention {t.get('attention')!r} has no service counterpart")
    method = t.get("method", "full")
    if method not in _METHODS:
        raise Unexpressible(f"method {method!r} has no service counterpart")
    adapters = {}
    if _METHODS[method] is not Method.FULL:
        if t.get("lora_targets") != "all-linear":
            raise Unexpressible(f"lora_targets {t.get('lora_targets')!r}: only 'all-linear' is read")
        adapters = {"lora_rank": int(t["lora_rank"]), "lora_targets": ALL_LINEAR}
    return TrainingSpec(
        seq_len=int(t["seq_len"]),
        global_batch_size=int(t["global_batch_size"]),
        precision=_PRECISIONS[t["precision"]],
        attention=_ATTENTION[t["attention"]],
        method=_METHODS[method],
        mtp_num_layers=int(row["layout"].get("mtp_num_layers") or 0),  # the rows file it with the layout
        **adapters,
    )


# ---------------------------------------------------------------- layout


_FRAMEWORKS = {"megatron": Framework.MEGATRON, "fsdp": Framework.FSDP, "deepspeed": Framework.DEEPSPEED}
_REQUIRED_LAYOUT = (
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "zero_stage",
    "virtual_pipeline_stages",
    "micro_batch_size",
    "sequence_parallel",
)
_OP_SAC = re.compile(r"selective[ _]op|per[- ]op|selective_ac_option\s*=?\s*'op'")
_LAYER_SAC = re.compile(r"selective[ _]layer|selective_ac_option\s*'?\d+'?")
_LAYER_SAC_EVERY = re.compile(r"selective_ac_option\s*'?(\d+)'?")
_MODULES = re.compile(r"recompute_modules\s*\[([^\]]*)\]")
_NUM_LAYERS = re.compile(r"recompute[-_]num[-_]layers[\s=]+(\d+)")


class RecomputeOf(NamedTuple):
    """A row's recompute as the service's layout fields."""

    policy: Recompute
    num_layers: int | None = None  # Layout.recompute_num_layers
    every_n_layers: int | None = None  # Layout.recompute_every_n_layers
    modules: tuple[RecomputeModule, ...] | None = None  # Layout.recompute_modules


def recompute_of(layout: Mapping[str, Any]) -> RecomputeOf:
    """The service's policy for the row's ``recompute`` + ``recompute_detail`` (see the module
    docstring); ``Unexpressible`` for a policy the service has no name for."""
    mode, detail = layout.get("recompute"), str(layout.get("recompute_detail") or "")
    framework = layout.get("framework")
    if mode == "none":
        return RecomputeOf(Recompute.NONE)
    if mode == "unknown" or mode is None:
        raise Unexpressible("recompute not published")
    if mode == "selective":
        if framework == "megatron":
            modules = _MODULES.search(detail)
            if modules is None:
                return RecomputeOf(Recompute.SELECTIVE)
            names = re.findall(r"\w+", modules.group(1))
            known = {module.value for module in RecomputeModule}
            if not set(names) <= known:
                raise Unexpressible(f"Megatron recompute_modules {names}: the service knows {sorted(known)}")
            return RecomputeOf(Recompute.SELECTIVE, modules=tuple(RecomputeModule(name) for name in names))
        if framework == "fsdp" and _OP_SAC.search(detail):
            return RecomputeOf(Recompute.SELECTIVE_OP)
        if framework == "fsdp" and _LAYER_SAC.search(detail):
            # torchtitan's selective layer AC: every N-th TransformerBlock fully checkpointed
            every = _LAYER_SAC_EVERY.search(detail)
            if every is None:
                raise Unexpressible(
                    f"torchtitan selective layer AC without its selective_ac_option ({detail})"
                )
            return RecomputeOf(Recompute.FULL, every_n_layers=int(every.group(1)))
        raise Unexpressible(f"{framework} selective recompute not identified ({detail or 'no detail'})")
    if mode == "full":
        n = _NUM_LAYERS.search(detail)
        if n is None:
            return RecomputeOf(Recompute.FULL)
        if "block" in detail:
            return RecomputeOf(Recompute.FULL, num_layers=int(n.group(1)))
        if int(n.group(1)) == 1:
            return RecomputeOf(Recompute.FULL)
        raise Unexpressible(f"full recompute of groups of {n.group(1)} layers (uniform method)")
    raise Unexpressible(f"recompute {mode!r} has no service counterpart")


def _pipeline(row: Row, model: ModelSpec, base: Layout, caveats: list[str]) -> dict[str, Any]:
    """The Layout fields of the pipeline split: explicit ``pipeline_layers`` or the account flags."""
    ly = row["layout"]
    p, v = base.pp, base.virtual_pipeline_stages
    explicit = ly.get("pipeline_layers")
    embedding = bool(ly.get("account_for_embedding_in_pipeline_split"))
    loss = bool(ly.get("account_for_loss_in_pipeline_split"))
    first_last = ly.get("first_last_stage_layers")
    if first_last:
        # Llama 3 paper: the first and last stage hold one layer fewer, the embedding and the loss
        # taking a layer's place: Megatron's account-for-embedding/loss rule (service.estimator.pipeline).
        if "one transformer layer fewer" not in str(first_last):
            raise Unexpressible(f"first_last_stage_layers not understood: {first_last}")
        embedding = loss = True
        caveats.append("first/last stage one layer short: split from the account-for-embedding/loss rule")
    if explicit is not None and len(explicit) == p * v:
        return {"pipeline_layers": tuple(int(n) for n in explicit)}
    if explicit is not None and len(explicit) == p and (embedding or loss):
        fields: dict[str, Any] = {
            "pipeline_account_for_embedding": embedding,
            "pipeline_account_for_loss": loss,
        }
        split = stage_layers(
            model.num_layers,
            Layout(
                pp=p,
                virtual_pipeline_stages=v,
                pipeline_account_for_embedding=embedding,
                pipeline_account_for_loss=loss,
            ),
        )
        per_rank = [sum(split[rank::p]) for rank in range(p)]
        if per_rank != list(explicit):
            raise Unexpressible(
                f"pipeline_layers per rank {list(explicit)} disagree with the account-for split {per_rank}"
            )
        return fields
    if explicit is not None:
        raise Unexpressible(
            f"pipeline_layers gives {len(explicit)} stages for pp x v = {p * v} and no rule for the rest"
        )
    return {"pipeline_account_for_embedding": embedding, "pipeline_account_for_loss": loss}


def build_layout(row: Row, model: ModelSpec, caveats: list[str]) -> Layout:
    ly = row["layout"]
    missing = [key for key in _REQUIRED_LAYOUT if ly.get(key) is None]
    if missing:
        raise Unexpressible(f"not published: {', '.join(missing)}")
    if ly.get("framework") not in _FRAMEWORKS:
        raise Unexpressible(f"framework {ly.get('framework')!r} has no service counterpart")
    recompute = recompute_of(ly)
    accumulation = ly.get("gradient_accumulation_steps")
    switches = _switches(ly, caveats)
    try:
        base = Layout(
            framework=_FRAMEWORKS[ly["framework"]],
            dp=int(ly["dp"]),
            tp=int(ly["tp"]),
            pp=int(ly["pp"]),
            cp=int(ly["cp"]),
            ep=int(ly["ep"]),
            etp=None if ly.get("etp") is None else int(ly["etp"]),
            sequence_parallel=switches["sequence_parallel"],
            zero_stage=int(ly["zero_stage"]),
            virtual_pipeline_stages=int(ly["virtual_pipeline_stages"]),
            micro_batch_size=int(ly["micro_batch_size"]),
            gradient_accumulation_steps=None if accumulation is None else int(accumulation),
            recompute=recompute.policy,
            recompute_num_layers=recompute.num_layers,
            recompute_every_n_layers=recompute.every_n_layers,
            recompute_modules=recompute.modules,
            activation_offload=bool(ly.get("activation_cpu_offload", False)),
            tp_comm_overlap=switches["tp_comm_overlap"],
            moe_a2a_overlap=switches["moe_a2a_overlap"],
            overlap_grad_reduce=switches["overlap_grad_reduce"],
            grad_reduce_in_fp32=ly.get("grad_reduce_in_fp32"),
            fp8_param_gather=ly.get("fp8_param_gather"),
            precision_aware_optimizer=ly.get("precision_aware_optimizer"),
            moe_capacity_factor=moe_capacity_factor_of(ly),
            moe_dispatcher=moe_dispatcher_of(ly),
            torch_compile=compile_of(row),
        )
        pipeline_fields = _pipeline(row, model, base, caveats)
        return Layout(**{**_layout_fields(base), **pipeline_fields})
    except EstimatorError as error:
        raise Unexpressible(error.message) from None


# The dispatchers a row's ``moe_dispatcher`` names as Layout.moe_dispatcher takes them (flex: the HybridEP
# backend the service times); any other text (DeepEP, say) stays a caveat and the row the alltoall default.
_DISPATCHERS = {dispatcher.value: dispatcher for dispatcher in MoeDispatcher}


def moe_dispatcher_of(ly: Mapping[str, Any]) -> MoeDispatcher:
    """Layout.moe_dispatcher of a row: the dispatcher it names exactly, else the alltoall default."""
    return _DISPATCHERS.get(str(ly.get("moe_dispatcher")), MoeDispatcher.ALLTOALL)


def moe_capacity_factor_of(ly: Mapping[str, Any]) -> float | None:
    """A row's token-drop MoE as ``Layout.moe_capacity_factor``: Megatron-Bridge's token-drop runs
    (``moe_token_drop`` true or naming ``apply_moe_token_drop``) take that function's defaults,
    ``moe_expert_capacity_factor=1.0`` padded to capacity (``moe_pad_expert_input_to_capacity=True``;
    src/megatron/bridge/training/utils/moe_token_drop.py); an explicit number is the factor; false or
    absent: dropless (None)."""
    drop = ly.get("moe_token_drop")
    if drop is None or drop is False:
        return None
    if isinstance(drop, int | float) and not isinstance(drop, bool):
        return float(drop)
    return 1.0


# What torch.compile compiled in each source's torchtitan: the TransformerBlocks always; the loss
# from 2025 (torchtitan components/loss.py build_cross_entropy_loss: `if job_config.training.compile:
# loss_fn = torch.compile(loss_fn)`); before, train.py left it commented out ("compiling loss function
# causes CUDA errors, turning off for now", 9dec370 train.py l.136).
_COMPILED_LOSS_BY_SOURCE = {
    "torchtitan-perf-doc": False,  # 3faaa1a0 (2024-08): train.py compiles no loss
    "torchtitan-bench-2412": False,  # 9dec370 (2024-12): commented out
    "torchtitan-asynctp-2506": True,  # 820504e (2025-06): components/loss.py l.29
    "torchtitan-trainy-h200": True,  # e7c0cae (2025-06): components/loss.py l.29
}


def compile_of(row: Row) -> Compile:
    """The row's torch.compile as the service names it; a compiled row from a source whose loss
    compilation is not recorded above cannot be expressed."""
    if not row["layout"].get("torch_compile"):
        return Compile.NONE
    loss = _COMPILED_LOSS_BY_SOURCE.get(row["source_key"])
    if loss is None:
        raise Unexpressible(
            f"torch.compile in {row['source_key']}: whether the loss was compiled is not recorded"
        )
    return Compile.MODEL_AND_LOSS if loss else Compile.MODEL


def _switches(ly: Mapping[str, Any], caveats: list[str]) -> dict[str, Any]:
    """sequence_parallel, tp_comm_overlap and overlap_grad_reduce as the service takes them: it
    refuses a switch that changes nothing. tp_comm_overlap is Megatron's --tp-comm-overlap (TE
    userbuffers) on megatron rows and torchtitan's Async TP on fsdp rows (which the validator holds
    to a compiled model)."""
    tp = int(ly["tp"])
    sp = bool(ly["sequence_parallel"])
    if sp and tp == 1:
        caveats.append("sequence_parallel with tp 1 (a no-op) dropped")
        sp = False
    overlap = bool(ly.get("tp_comm_overlap", False))
    if overlap and not (tp > 1 and sp):
        caveats.append("tp_comm_overlap without tp > 1 and sequence parallelism (a no-op) dropped")
        overlap = False
    grad = ly.get("overlap_grad_reduce")
    if grad is not None and int(ly["dp"]) * int(ly["cp"]) == 1:
        grad = None  # no data-parallel reduction to overlap
    # Megatron's EP all-to-all overlap; delay_wgrad_compute (which moves weight gradients later to widen
    # the windows) has no service field
    a2a = str(ly.get("moe_a2a_overlap") or "")
    if "delay_wgrad_compute=True" in a2a:
        caveats.append("delay_wgrad_compute (no service field)")
    moe_a2a = "overlap_moe_expert_parallel_comm=True" in a2a
    return {
        "sequence_parallel": sp,
        "tp_comm_overlap": overlap,
        "overlap_grad_reduce": grad,
        "moe_a2a_overlap": moe_a2a,
    }


def _layout_fields(layout: Layout) -> dict[str, Any]:
    return {name: getattr(layout, name) for name in Layout.__dataclass_fields__}


# ---------------------------------------------------------------- caveats


def _short(text: object, limit: int = 90) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1].rstrip() + "…"


# Layout keys the Layout above takes (or that only document: *_detail), so no caveat.
_MAPPED_LAYOUT_KEYS = frozenset(
    {
        "mtp_num_layers",  # TrainingSpec.mtp_num_layers
        "moe_a2a_overlap",  # Layout.moe_a2a_overlap (_switches)
        "framework",
        "dp",
        "tp",
        "pp",
        "cp",
        "ep",
        "etp",
        "sequence_parallel",
        "zero_stage",
        "virtual_pipeline_stages",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "recompute",
        "pipeline_layers",
        "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split",
        "first_last_stage_layers",
        "activation_cpu_offload",
        "overlap_grad_reduce",
        "grad_reduce_in_fp32",  # Layout.grad_reduce_in_fp32 (Megatron's gradient buffer dtype)
        "fp8_param_gather",  # Layout.fp8_param_gather (Megatron --fp8-param-gather)
        "precision_aware_optimizer",  # Layout.precision_aware_optimizer (--use-precision-aware-optimizer)
        "moe_token_drop",  # Layout.moe_capacity_factor (moe_capacity_factor_of)
        "tp_comm_overlap",
        "torch_compile",
    }
)


def _layout_caveat(key: str, value: Any, layout: Mapping[str, Any]) -> str | None:
    """A note for a layout key the service has no field for; None where it changes nothing."""
    if value is None or value is False:
        return None
    special: dict[str, Callable[[], str | None]] = {
        "fp8_recipe": lambda: f"fp8 recipe: {_short(value)}",
        "cuda_graphs": lambda: "CUDA graphs (not modelled)",
        "fsdp_float8_all_gather": lambda: "fp8 FSDP all-gather (modelled as bf16)" if value is True else None,
        "fsdp_mixed_precision": lambda: (
            "Composer PURE FSDP mixed precision (bf16 gradient reduce), modelled as bf16 mixed (fp32 reduce)"
            if str(value).startswith("PURE")
            else None
        ),
        "fsdp_sharding_strategy": lambda: (
            None
            if {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}.get(str(value)) == layout.get("zero_stage")
            else f"fsdp_sharding_strategy {value} vs zero_stage {layout.get('zero_stage')}"
        ),
        "overlap_param_gather": lambda: "overlap_param_gather (no service field)",
        "overlap_p2p_comm": lambda: "overlap_p2p_comm (no service field)",
        "pipeline_schedule": lambda: (
            None
            if (value == "1F1B") == (layout.get("virtual_pipeline_stages") == 1)
            else f"pipeline schedule {value}"
        ),
        "pipeline_microbatches": lambda: (
            None
            if value == layout.get("gradient_accumulation_steps")
            else f"pipeline_microbatches {value} != gradient_accumulation_steps"
        ),
        "megatron_fsdp": lambda: "Megatron-FSDP",
        "nccl_ub": lambda: "NCCL user buffers (not modelled)",
        "vocab_padding": lambda: f"vocabulary padding ({value}) not modelled",
        # Layout.moe_dispatcher (moe_dispatcher_of) where it names one
        "moe_dispatcher": lambda: (
            None if str(value) in _DISPATCHERS else f"moe_dispatcher: {_short(value, 60)} (no service field)"
        ),
    }
    if key in special:
        return special[key]()
    return f"{key}: {_short(value, 60)} (no service field)"


def layout_caveats(row: Row) -> list[str]:
    ly = row["layout"]
    notes = []
    for key in sorted(ly):
        if key in _MAPPED_LAYOUT_KEYS or key.endswith("_detail"):
            continue
        note = _layout_caveat(key, ly[key], ly)
        if note:
            notes.append(note)
    return notes


# ---------------------------------------------------------------- inputs and results


class RowInputs(NamedTuple):
    """The estimator's inputs for a row, and what the row sets that they cannot carry."""

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec
    layout: Layout
    caveats: tuple[str, ...]

    def as_tuple(self) -> Inputs:
        return self.model, self.cluster, self.training, self.layout


# Runs whose torchtitan repeated K and V to every query head before SDPA (before v0.2.2; the Dec-2024
# benchmarks ran torchtitan 9dec370): their ring attention moved K and V at the query heads' width.
REPEATS_KV_SOURCES = frozenset({"torchtitan-bench-2412"})


def row_tuning(row: Row) -> Tuning:
    """The tuning a row is estimated with: the catalog's, with what the row's framework version did
    where it differs from the version the launchers render (``REPEATS_KV_SOURCES``)."""
    tuning = default_tuning()
    if row.get("source_key") in REPEATS_KV_SOURCES:
        return dataclasses.replace(tuning, ring_attention_repeats_kv=True)
    return tuning


def inputs(row: Row) -> RowInputs:
    """The estimator inputs of ``row`` and its caveats; ``Unexpressible`` when the service cannot
    express it (the model family, a policy it lacks, a field not published, or a layout
    ``validate_layout`` refuses)."""
    caveats: list[str] = []
    model = build_model(row, caveats)
    cluster = build_cluster(row, caveats)
    try:
        training = build_training(row)
    except EstimatorError as error:
        raise Unexpressible(error.message) from None
    layout = build_layout(row, model, caveats)
    caveats += layout_caveats(row)
    try:
        validate_layout(model, cluster, layout, training)
    except EstimatorError as error:
        raise Unexpressible(error.message) from None
    return RowInputs(model, cluster, training, layout, tuple(caveats))


def published_value(row: Row) -> float:
    """Seconds per step (throughput) or peak bytes per GPU of the row's statistic (memory)."""
    if row["kind"] == "throughput":
        return float(row["step_s"])
    return float(row["peak_memory_bytes_per_gpu"])


def memory_statistic(row: Row) -> MemoryStatistic:
    """Which statistic a memory row's figure is (its ``memory_statistic``, read from its
    ``memory_measure``): the estimate's figure of that name is compared with it."""
    return MemoryStatistic(row["memory_statistic"])


@dataclass(frozen=True, slots=True)
class Result:
    id: str
    split: str
    kind: str
    gpu: str
    framework: str
    published: float  # s/step or bytes
    ours: float | None  # None when unexpressible
    caveats: tuple[str, ...] = ()
    reason: str | None = None  # why it is unexpressible
    statistic: str | None = None  # memory rows: the MemoryStatistic compared

    @property
    def expressible(self) -> bool:
        return self.ours is not None

    @property
    def error(self) -> float | None:
        return None if self.ours is None else (self.ours - self.published) / self.published

    @property
    def within(self) -> bool:
        e = self.error
        return e is not None and abs(e) <= TOLERANCE[self.kind]

    def display(self, value: float | None) -> float | None:
        """In the report's unit: seconds, or GiB."""
        if value is None:
            return None
        return value / GiB if self.kind == "memory" else value


def evaluate(row: Row) -> Result:
    base = {
        "id": row["id"],
        "split": row["split"],
        "kind": row["kind"],
        "gpu": row["cluster"]["gpu"],
        "framework": row["layout"]["framework"],
        "published": published_value(row),
        "statistic": memory_statistic(row).value if row["kind"] == "memory" else None,
    }
    try:
        built = inputs(row)
    except Unexpressible as error:
        return Result(**base, ours=None, reason=error.reason)
    est = estimate(
        built.model, built.cluster, built.layout, built.training, tuning=row_tuning(row), with_limits=False
    )
    if row["kind"] == "throughput":
        assert est.time is not None
        ours = est.time.step_s
    else:
        ours = float(est.memory.per_gpu.statistic(memory_statistic(row)))
    return Result(**base, ours=ours, caveats=built.caveats)


@cache
def results() -> tuple[Result, ...]:
    return tuple(evaluate(row) for row in load_rows())


# ---------------------------------------------------------------- summary


@dataclass(frozen=True, slots=True)
class HalfSummary:
    split: str
    kind: str
    rows: int
    expressible: int
    within: int
    median_abs_error: float | None
    median_signed_error: float | None
    worst: Result | None

    @property
    def within_fraction(self) -> float | None:
        return self.within / self.expressible if self.expressible else None


@dataclass(frozen=True, slots=True)
class Summary:
    halves: tuple[HalfSummary, ...]  # (split, kind) in SPLITS x KINDS order
    unexpressible: tuple[tuple[str, tuple[str, ...]], ...] = field(default_factory=tuple)  # reason, ids

    def half(self, split: str, kind: str) -> HalfSummary:
        return next(h for h in self.halves if h.split == split and h.kind == kind)


def summarize_half(split: str, kind: str, rows: Iterable[Result]) -> HalfSummary:
    chosen = [r for r in rows if r.split == split and r.kind == kind]
    errors = [r.error for r in chosen if r.error is not None]
    scored = [r for r in chosen if r.error is not None]
    return HalfSummary(
        split=split,
        kind=kind,
        rows=len(chosen),
        expressible=len(scored),
        within=sum(r.within for r in scored),
        median_abs_error=statistics.median(abs(e) for e in errors) if errors else None,
        median_signed_error=statistics.median(errors) if errors else None,
        worst=max(scored, key=lambda r: (abs(r.error or 0.0), r.id), default=None),
    )


def summarize(rows: Sequence[Result] | None = None) -> Summary:
    rows = results() if rows is None else rows
    by_reason: dict[str, list[str]] = {}
    for r in rows:
        if r.reason is not None:
            by_reason.setdefault(r.reason, []).append(r.id)
    grouped = sorted(((reason, tuple(sorted(ids))) for reason, ids in by_reason.items()), key=_group_order)
    return Summary(
        halves=tuple(summarize_half(s, k, rows) for s in SPLITS for k in KINDS),
        unexpressible=tuple(grouped),
    )


def _group_order(item: tuple[str, tuple[str, ...]]) -> tuple[int, str]:
    return -len(item[1]), item[0]


@dataclass(frozen=True, slots=True)
class Target:
    text: str
    value: str  # the number the target is judged on
    met: bool


def targets(summary: Summary) -> tuple[Target, ...]:
    """The acceptance targets, judged on the held-out half's expressible rows (a row the service
    cannot express has no error to judge); memory: every such row within 10%."""
    tput, mem = summary.half("held_out", "throughput"), summary.half("held_out", "memory")
    fraction, median = tput.within_fraction, tput.median_abs_error
    return (
        Target(
            "step time within 15% on >= 80% of held-out throughput rows",
            f"{tput.within}/{tput.expressible}" + (f" = {fraction:.1%}" if fraction is not None else ""),
            fraction is not None and fraction >= 0.80,
        ),
        Target(
            "median held-out step-time |error| within 10%",
            "—" if median is None else f"{median:.2%}",
            median is not None and median <= 0.10,
        ),
        Target(
            "memory within 10% on every held-out memory row (the stricter earlier target; issue 27's is "
            ">= 85%, judged in its memory section)",
            f"{mem.within}/{mem.expressible}",
            mem.expressible > 0 and mem.within == mem.expressible,
        ),
    )


# ---------------------------------------------------------------- issue 27: layouts NVIDIA ships

# The first class of issue 27: Megatron-Core layouts NVIDIA measured with its own recipes (NeMo,
# Megatron-Bridge, its MLPerf GPT-3 implementation), dense models only (the MoE rows are another class).
NVIDIA_RECIPE_SOURCES = frozenset(
    {"megatron-bridge-perf", "nemo-24.07-perf", "nemo-25.02-perf", "mlperf-training"}
)
NVIDIA_RECIPES_BEFORE_PATH = DATA_DIR / "nvidia_recipes_before.json"


def is_nvidia_recipe_row(row: Row) -> bool:
    """A throughput row of a dense model run by Megatron-Core from one of NVIDIA's sources."""
    if row["kind"] != "throughput" or row["layout"]["framework"] != "megatron":
        return False
    if row["source_key"] not in NVIDIA_RECIPE_SOURCES:
        return False
    try:
        return build_model(row, []).moe is None
    except Unexpressible:
        return False


@dataclass(frozen=True, slots=True)
class RecipeResult:
    """One NVIDIA recipe row: the fit verdict, per-GPU memory and step time of the estimate."""

    id: str
    split: str
    published_step_s: float
    fits: bool | None  # None when unexpressible
    memory_bytes: float | None
    step_s: float | None
    reason: str | None = None

    @property
    def step_error(self) -> float | None:
        return None if self.step_s is None else (self.step_s - self.published_step_s) / self.published_step_s


def recipe_result(row: Row) -> RecipeResult:
    base = {"id": row["id"], "split": row["split"], "published_step_s": float(row["step_s"])}
    try:
        built = inputs(row)
    except Unexpressible as error:
        return RecipeResult(**base, fits=None, memory_bytes=None, step_s=None, reason=error.reason)
    est = estimate(
        built.model, built.cluster, built.layout, built.training, tuning=row_tuning(row), with_limits=False
    )
    assert est.time is not None
    return RecipeResult(
        **base, fits=est.fits, memory_bytes=float(est.memory.per_gpu.total), step_s=est.time.step_s
    )


@cache
def recipe_results() -> tuple[RecipeResult, ...]:
    """``recipe_result`` of every NVIDIA recipe row, in file order."""
    return tuple(recipe_result(row) for row in load_rows() if is_nvidia_recipe_row(row))


@cache
def recipes_before() -> dict[str, RecipeResult]:
    """The same rows as the tree before issue 27's changes estimated them (``NVIDIA_RECIPES_BEFORE_PATH``)."""
    recorded = json.loads(NVIDIA_RECIPES_BEFORE_PATH.read_text(encoding="utf-8"))["rows"]
    out = {}
    for row in load_rows():
        if row["id"] not in recorded:
            continue
        before = recorded[row["id"]]
        gib = before.get("memory_gib")
        out[row["id"]] = RecipeResult(
            id=row["id"],
            split=row["split"],
            published_step_s=float(row["step_s"]),
            fits=before.get("fits"),
            memory_bytes=None if gib is None else gib * GiB,
            step_s=before.get("step_s"),
            reason=before.get("reason"),
        )
    return out
