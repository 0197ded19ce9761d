"""The staged estimator: a job's memos and the one place its parts are summed.

* Memo keys are complete: every ``layout_memo`` part, run on a layout that records which of its
  fields are read, reads no field its key leaves out (over a grid of valid layouts, dense and MoE
  models, LoRA / QLoRA, eager attention, fp32); and the check can fail (mutations below).
* Memo hits equal fresh computation: one shared job, a shuffled list of layouts whose keys overlap,
  against a fresh job per layout.
* The search's plain numbers (``memory_numbers``, ``step_numbers``, ``fits``) equal the reported
  objects, and ``estimate()`` is ``estimate_valid`` on the prepared job, i.e. ``evaluate``'s numbers.
* Per-layer quantities read the layer only through its kind, which the job's per-kind sums rely on.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import pytest

from service.catalog.gpus import gpu
from service.catalog.models import model, models
from service.catalog.tuning import default_tuning
from service.estimator import activations, evaluate, flops, pipeline, step_time
from service.estimator import job as job_module
from service.estimator import memory as memory_parts
from service.estimator.calibration import Calibration, calibrated_time
from service.estimator.estimate import estimate, estimate_valid
from service.estimator.job import (
    MEMOISED_PARTS,
    Job,
    MemoisedPart,
    layout_memo,
    make_job,
    prepare,
    rank_kind_counts,
)
from service.estimator.params import (
    LayerKind,
    is_moe_layer,
    layer_kind,
    layer_parameters,
    stage_parameter_counts,
)
from service.estimator.tuning import Tuning
from service.estimator.types import (
    Attention,
    BaseDtype,
    ClusterSpec,
    Compile,
    Framework,
    Layout,
    Method,
    MlpKind,
    ModelSpec,
    MoeDispatcher,
    MoESpec,
    NormKind,
    Offload,
    Optimizer,
    PositionEmbedding,
    Precision,
    Recompute,
    RecomputeModule,
    TrainingSpec,
)
from service.estimator.validate import FRAMEWORK_CAPABILITIES, layout_violation

LAYOUT_FIELDS = frozenset(f.name for f in dataclasses.fields(Layout))


def cluster(nodes: int, host_limits: bool = False) -> ClusterSpec:
    """``nodes`` nodes of 8 H100s; with ``host_limits``, 300 GiB of host RAM and 1 TiB of NVMe per
    node, which some offloading layouts exceed."""
    g = gpu("h100-sxm-80gb")
    return ClusterSpec(
        gpu=g,
        num_nodes=nodes,
        gpus_per_node=8,
        intra_node_bandwidth_bytes_per_s=g.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=50e9,
        cpu_memory_bytes_per_node=300 * 2**30 if host_limits else 0,
        nvme_bytes_per_node=2**40 if host_limits else 0,
    )


# 12 layers, MoE every 2nd (layers 1, 3, ..., 11): two layer kinds, pp 4 puts 1, 2, 1, 2 MoE layers on
# its stages. Qwen2-MoE-like shared expert with its gate; 65536 learned positions (67M) make the first
# stage, with one MoE layer, the largest at pp 4 (the last has two).
SPARSE_MOE = ModelSpec(
    name="moe-every-2nd", num_layers=12, hidden_size=1024, num_attention_heads=16, num_kv_heads=4,
    ffn_hidden_size=2816, vocab_size=32000, qkv_bias=True, max_position_embeddings=65536,
    position_embedding=PositionEmbedding.LEARNED,
    moe=MoESpec(
        num_experts=8, top_k=2, expert_ffn_hidden_size=1408, num_shared_experts=1,
        shared_expert_ffn_hidden_size=2816, shared_expert_gate=True, layer_frequency=2,
    ),
)  # fmt: skip

# BigScience prequel shape: h 13824 over 128 heads, head_dim 108 (216-byte rows, off the 16-byte
# alignment), so eager attention's core runs slowed; 8 layers keep it quick.
UNALIGNED = ModelSpec(
    name="h13824-a128", family="bloom", num_layers=8, hidden_size=13824, num_attention_heads=128,
    num_kv_heads=128, ffn_hidden_size=4 * 13824, vocab_size=250880, mlp=MlpKind.GELU,
    norm=NormKind.LAYERNORM, position_embedding=PositionEmbedding.ALIBI, qkv_bias=True,
    attn_out_bias=True, mlp_bias=True, embedding_norm=True,
)  # fmt: skip
assert UNALIGNED.head_dim == 108

SPECS = {spec.name: spec for spec in (SPARSE_MOE, UNALIGNED)}


def spec_of(name: str) -> ModelSpec:
    return SPECS[name] if name in SPECS else model(name).spec


BASE = TrainingSpec(seq_len=4096, global_batch_size=64)
LORA = dataclasses.replace(BASE, method=Method.LORA)
LORA_FP32_BASE = dataclasses.replace(LORA, base_dtype=BaseDtype.FP32)  # under bf16 autocast
QLORA = dataclasses.replace(BASE, method=Method.QLORA, lora_rank=8)
EAGER = TrainingSpec(seq_len=2048, global_batch_size=64, attention=Attention.EAGER)
FP32 = TrainingSpec(seq_len=2048, global_batch_size=64, precision=Precision.FP32)
FP16_EAGER = TrainingSpec(
    seq_len=2048, global_batch_size=64, precision=Precision.FP16, attention=Attention.EAGER
)
FP8 = dataclasses.replace(BASE, precision=Precision.FP8)


# ---------------------------------------------------------------- a grid of valid layouts


M = RecomputeModule
RECOMPUTE_MODULE_SETS = (
    (M.MLP,),
    (M.CORE_ATTN, M.MLP),
    (M.MOE,),
    (M.MOE_ACT, M.LAYERNORM),
    (M.CORE_ATTN, M.MOE),
)


def random_layout(rng: random.Random, spec: ModelSpec, world: int, training: TrainingSpec) -> Layout | None:
    """A layout drawn over every field (often invalid: the caller validates it)."""
    tp, pp, cp = rng.choice((1, 2, 4, 8)), rng.choice((1, 2, 4)), rng.choice((1, 1, 2))
    if world % (tp * pp * cp):
        return None
    dp = world // (tp * pp * cp)
    framework = rng.choice(list(Framework))
    zero = rng.choice(sorted(FRAMEWORK_CAPABILITIES[framework].zero_stages))
    kind = rng.choice((Offload.NONE, Offload.NONE, Offload.CPU, Offload.NVME))
    offload_optimizer = kind if zero >= 1 else Offload.NONE
    offload_params = rng.choice((Offload.NONE, kind)) if zero == 3 else Offload.NONE
    if framework is Framework.FSDP:  # FSDP offloads both or neither
        offload_optimizer = offload_params = kind if zero == 3 else Offload.NONE
    micro = rng.choice((1, 2, 4))
    in_backward = framework is Framework.FSDP and rng.random() < 0.3
    if in_backward:  # the fused optimizer step allows one micro-batch per step only
        micro = max(1, training.global_batch_size // dp)
    steps = None
    if rng.random() < 0.25 and training.global_batch_size % (micro * dp) == 0:
        steps = training.global_batch_size // (micro * dp)
    etp = None  # Megatron's experts over fewer ranks than tp (MoE parallel folding)
    if spec.moe is not None and framework is Framework.MEGATRON and tp > 1 and rng.random() < 0.4:
        etp = 1
    ep = 1
    if spec.moe is not None:
        ep = rng.choice([e for e in (1, 2, 4, 8) if (dp * cp * tp // (etp or tp)) % e == 0])
    virtual = rng.choice((1, 2)) if pp > 1 else 1
    split, account = None, (False, False)
    if pp > 1 and rng.random() < 0.3:  # an explicit uneven split: every stage >= 1 layer
        cuts = sorted(rng.sample(range(1, spec.num_layers), pp * virtual - 1))
        split = tuple(b - a for a, b in zip((0, *cuts), (*cuts, spec.num_layers), strict=True))
    elif pp > 1 and rng.random() < 0.4:
        account = (rng.random() < 0.7, rng.random() < 0.7)
    recompute = rng.choice(list(Recompute))
    # some layers of each stage (the validator refuses more than a stage holds)
    recompute_layers = rng.choice((1, 2, 3)) if recompute is Recompute.FULL and rng.random() < 0.4 else None
    every = None  # torchtitan's every-N-th-layer AC, the other partial policy
    if recompute is Recompute.FULL and recompute_layers is None and framework is Framework.FSDP:
        every = rng.choice((None, 2, 3))
    modules = None  # Megatron's selective modules (refused where the model lacks them)
    if recompute is Recompute.SELECTIVE and rng.random() < 0.6:
        modules = rng.choice(RECOMPUTE_MODULE_SETS)
    layout = Layout(
        framework=framework,
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        etp=etp,
        sequence_parallel=rng.random() < 0.5,
        zero_stage=zero,
        offload_optimizer=offload_optimizer,
        offload_params=offload_params,
        recompute=recompute,
        recompute_num_layers=recompute_layers,
        recompute_every_n_layers=every,
        recompute_modules=modules,
        micro_batch_size=micro,
        virtual_pipeline_stages=virtual,
        pipeline_layers=split,
        pipeline_account_for_embedding=account[0],
        pipeline_account_for_loss=account[1],
        gradient_accumulation_steps=steps,
        activation_offload=rng.random() < 0.3,
        optimizer_in_backward=in_backward,
        chunked_loss=rng.random() < 0.3,
        torch_compile=rng.choice(list(Compile)) if framework is Framework.FSDP else Compile.NONE,
        fsdp_hybrid_shard=framework is Framework.FSDP and rng.random() < 0.4,
        tp_comm_overlap=rng.random() < 0.5,
        moe_a2a_overlap=spec.moe is not None and framework is Framework.MEGATRON and rng.random() < 0.4,
        overlap_grad_reduce=rng.choice((None, False, True)),
        # Megatron's gradient-buffer dtype (bf16/fp8) and fp8 parameter gather (fp8, dist-opt)
        grad_reduce_in_fp32=(
            rng.choice((None, False, True))
            if framework is Framework.MEGATRON and training.precision in (Precision.BF16, Precision.FP8)
            else None
        ),
        fp8_param_gather=(
            rng.choice((None, False, True))
            if framework is Framework.MEGATRON and training.precision is Precision.FP8 and zero == 1
            else None
        ),
        # token drop padded to capacity (drawn last: the draws above stay as they were)
        moe_capacity_factor=rng.choice((None, None, 1.0, 1.25)) if spec.moe is not None else None,
        # Megatron's flex dispatcher (refused with etp > 1; drawn last, as above)
        moe_dispatcher=(
            rng.choice(list(MoeDispatcher))
            if spec.moe is not None and framework is Framework.MEGATRON
            else MoeDispatcher.ALLTOALL
        ),
    )
    # HSDP's replica count (drawn last, as above): where the layout shards hybrid over an even dp
    if layout.fsdp_hybrid_shard and layout.dp % 2 == 0 and rng.random() < 0.5:
        layout = dataclasses.replace(layout, dp_replicate=2)
    # Megatron's precision-aware optimizer, stated (drawn last, as above): where Megatron runs it
    aware = framework is Framework.MEGATRON and zero == 1 and offload_optimizer is Offload.NONE
    if aware and training.precision is Precision.BF16 and training.optimizer is Optimizer.ADAMW:
        layout = dataclasses.replace(layout, precision_aware_optimizer=rng.choice((None, False, True)))
    return layout


def valid_layouts(
    spec: ModelSpec, c: ClusterSpec, training: TrainingSpec, count: int, seed: int
) -> list[Layout]:
    """Up to ``count`` distinct layouts ``layout_violation`` accepts, drawn with ``seed``."""
    rng = random.Random(seed)
    found: dict[Layout, None] = {}
    for _ in range(400 * count):
        layout = random_layout(rng, spec, c.world_size, training)
        if layout is not None and layout_violation(spec, c, layout, training) is None:
            found[layout] = None
            if len(found) == count:
                break
    return list(found)


# (model, training) of the key-completeness grid: dense (GQA) and MoE (every layer, every 2nd
# layer), LoRA / QLoRA, eager attention with an aligned and an unaligned head_dim, fp32, GPT-2's
# family branches (learned positions, tanh-GELU, fused QKV)
GRID_JOBS = (
    ("llama-3-8b", BASE),
    ("llama-3-8b", LORA),
    ("llama-3-8b", LORA_FP32_BASE),
    ("llama-3-8b", QLORA),
    ("llama-3-8b", EAGER),
    ("llama-3-8b", FP32),
    ("llama-3-8b", FP8),
    ("gpt2", dataclasses.replace(EAGER, seq_len=1024)),  # within its 1,024 learned positions
    ("mixtral-8x7b", BASE),
    ("mixtral-8x7b", LORA),
    ("moe-every-2nd", BASE),
    ("moe-every-2nd", EAGER),
    (UNALIGNED.name, FP16_EAGER),
)
GRID_LAYOUTS_PER_CLUSTER = 60

Inputs = tuple[ModelSpec, ClusterSpec, TrainingSpec, Tuning]


@cache
def grid() -> tuple[tuple[Inputs, tuple[Layout, ...]], ...]:
    out = []
    for i, (name, training) in enumerate(GRID_JOBS):
        spec = spec_of(name)
        for nodes in (1, 2):
            c = cluster(nodes)
            layouts = valid_layouts(spec, c, training, GRID_LAYOUTS_PER_CLUSTER, seed=100 * i + nodes)
            out.append(((spec, c, training, default_tuning()), tuple(layouts)))
    return tuple(out)


# every value of every field the grid is meant to reach (ep > 1 and cp 2 with the MoE models)
GRID_COVERAGE: dict[str, set[Any]] = {
    "framework": set(Framework),
    "dp": {1, 2, 4, 8, 16},
    "tp": {1, 2, 4, 8},
    "pp": {1, 2, 4},
    "cp": {1, 2},
    "ep": {1, 2, 4, 8},
    "etp": {None, 1},
    "sequence_parallel": {False, True},
    "zero_stage": {0, 1, 2, 3},
    "offload_optimizer": set(Offload),
    "offload_params": set(Offload),
    "recompute": set(Recompute),
    "recompute_num_layers": {None, 1, 2, 3},
    "recompute_every_n_layers": {None, 2, 3},
    "recompute_modules": {None, *RECOMPUTE_MODULE_SETS},
    "micro_batch_size": {1, 2, 4},
    "virtual_pipeline_stages": {1, 2},
    "gradient_accumulation_steps": {None, 1, 2, 4, 8},
    "activation_offload": {False, True},
    "optimizer_in_backward": {False, True},
    "chunked_loss": {False, True},
    "torch_compile": set(Compile),
    "fsdp_hybrid_shard": {False, True},
    "dp_replicate": {None, 2},
    "tp_comm_overlap": {False, True},
    "moe_a2a_overlap": {False, True},
    "overlap_grad_reduce": {None, False, True},
    "grad_reduce_in_fp32": {None, False, True},
    "fp8_param_gather": {None, False, True},
    "precision_aware_optimizer": {None, False, True},
    "moe_capacity_factor": {None, 1.0, 1.25},
    "moe_dispatcher": set(MoeDispatcher),
    "pipeline_account_for_embedding": {False, True},
    "pipeline_account_for_loss": {False, True},
}
# explicit splits are too many to list: the grid reaches None and at least this many distinct ones
EXPLICIT_SPLITS = 20


def test_the_grid_reaches_every_field_value() -> None:
    assert set(GRID_COVERAGE) | {"pipeline_layers"} == LAYOUT_FIELDS
    seen: dict[str, set[Any]] = {name: set() for name in LAYOUT_FIELDS}
    for (spec, c, training, _), layouts in grid():
        assert len(layouts) == GRID_LAYOUTS_PER_CLUSTER, (spec.name, training, c.world_size)
        for layout in layouts:
            for name in LAYOUT_FIELDS:
                seen[name].add(getattr(layout, name))
    for name, wanted in GRID_COVERAGE.items():
        assert wanted <= seen[name], (name, wanted - seen[name])
    assert None in seen["pipeline_layers"] and len(seen["pipeline_layers"]) > EXPLICIT_SPLITS


# ---------------------------------------------------------------- recording what a part reads


class RecordingLayout(Layout):
    """A layout that notes the name of every field read from it. A formula called on it reads its
    own fields from it, and the key fields of every memoised part it calls (whose wrapper looks the
    key up on it, then hands the part a view of that key): what the formula's own key must name."""

    def __getattribute__(self, name: str) -> Any:
        if name in LAYOUT_FIELDS:
            reads = object.__getattribute__(self, "__dict__").get("reads")
            if reads is not None:
                reads.add(name)
        return object.__getattribute__(self, name)


def recording(layout: Layout) -> RecordingLayout:
    copy = RecordingLayout(**{name: getattr(layout, name) for name in LAYOUT_FIELDS})
    object.__setattr__(copy, "reads", set())  # frozen, but a subclass without slots has a __dict__
    return copy


# the values each extra argument of a part takes, by the argument's name
EXTRA_ARGUMENTS: dict[str, Callable[[Layout], tuple[Any, ...]]] = {
    "recompute": lambda layout: tuple(Recompute),
    "rank": lambda layout: tuple(sorted({0, layout.pp - 1})),
    "stage": lambda layout: tuple(sorted({0, layout.pp // 2, layout.pp - 1})),
    "kind": lambda layout: (LayerKind(False), LayerKind(True)),  # a dense and an MoE layer
}


def argument_lists(entry: MemoisedPart, layout: Layout) -> list[tuple[Any, ...]]:
    code = entry.formula.__code__
    names = code.co_varnames[2 : code.co_argcount]  # after (job, layout)
    unknown = [n for n in names if n not in EXTRA_ARGUMENTS]
    assert not unknown, f"{entry.name} takes {unknown}: say which values to try in EXTRA_ARGUMENTS"
    return list(itertools.product(*(EXTRA_ARGUMENTS[n](layout) for n in names)))


def reads_of(entry: MemoisedPart, inputs: Inputs, layout: Layout) -> set[str]:
    """The layout fields ``entry.formula`` reads, for every extra argument, each call on a fresh job
    (so the parts it calls miss their memos and run their own formulas)."""
    reads: set[str] = set()
    for args in argument_lists(entry, layout):
        probe = recording(layout)
        entry.formula(make_job(*inputs), probe, *args)
        reads |= probe.reads  # type: ignore[attr-defined]
    return reads


def unkeyed_reads(entry: MemoisedPart, inputs: Inputs, layout: Layout) -> set[str]:
    """The fields the part reads that its memo key leaves out: a memo hit from another layout that
    differs only in them would return that layout's value."""
    return reads_of(entry, inputs, layout) - set(entry.fields)


@cache
def grid_reads() -> dict[str, dict[str, tuple[Inputs, Layout]]]:
    """For every memoised part, every field it reads on the grid with the first (inputs, layout)
    that read it."""
    out: dict[str, dict[str, tuple[Inputs, Layout]]] = {entry.name: {} for entry in MEMOISED_PARTS}
    for inputs, layouts in grid():
        for layout in layouts:
            for entry in MEMOISED_PARTS:
                for name in reads_of(entry, inputs, layout):
                    out[entry.name].setdefault(name, (inputs, layout))
    return out


def test_every_part_is_registered_once() -> None:
    names = [entry.name for entry in MEMOISED_PARTS]
    assert len(names) == len(set(names))
    assert {"stage_states", "stage_activations", "stage_step_base", "step_parts", "kind_layer_bytes"} <= set(
        names
    )
    for entry in MEMOISED_PARTS:
        assert entry.fields and set(entry.fields) <= LAYOUT_FIELDS, entry


def test_memo_keys_name_every_field_their_part_reads() -> None:
    parts = {entry.name: entry for entry in MEMOISED_PARTS}
    missing = {
        name: {field for field in read if field not in parts[name].fields}
        for name, read in grid_reads().items()
    }
    witnesses = {
        name: {field: grid_reads()[name][field][1] for field in fields} for name, fields in missing.items()
    }
    assert missing == {name: set() for name in parts}, witnesses


def test_every_key_field_is_read_so_dropping_it_is_caught() -> None:
    # Mutation check, for every field of every key: the same part under a key without that field is
    # reported on a layout of the grid, so the grid exercises every field each key names.
    for entry in MEMOISED_PARTS:
        read = grid_reads()[entry.name]
        unread = set(entry.fields) - set(read)
        assert not unread, (entry.name, unread)
        for field in set(entry.fields) - unread:
            mutant = MemoisedPart(entry.name, tuple(f for f in entry.fields if f != field), entry.formula)
            inputs, layout = read[field]
            assert unkeyed_reads(mutant, inputs, layout) == unkeyed_reads(entry, inputs, layout) | {field}, (
                entry.name,
                field,
            )


def test_the_check_reports_a_part_whose_key_misses_a_field(monkeypatch: pytest.MonkeyPatch) -> None:
    # Parts of our own, registered in a copy of the registry: one reads pp under a key of tp only,
    # one reads it (and ep) through a memoised part it calls, one through a Layout property.
    monkeypatch.setattr(job_module, "MEMOISED_PARTS", list(MEMOISED_PARTS))

    @layout_memo("tp")
    def pipeline_depth(job: Job, layout: Layout) -> int:
        return layout.tp * layout.pp

    @layout_memo("tp")
    def parameters_per_gpu(job: Job, layout: Layout) -> float:
        return step_time.gpu_parameters(job, layout)

    @layout_memo("dp", "tp")
    def gpus(job: Job, layout: Layout) -> int:
        return layout.world_size

    mine = {entry.name: entry for entry in job_module.MEMOISED_PARTS[len(MEMOISED_PARTS) :]}
    assert set(mine) == {
        "test_the_check_reports_a_part_whose_key_misses_a_field.<locals>.pipeline_depth",
        "test_the_check_reports_a_part_whose_key_misses_a_field.<locals>.parameters_per_gpu",
        "test_the_check_reports_a_part_whose_key_misses_a_field.<locals>.gpus",
    }
    inputs = (SPARSE_MOE, cluster(1), BASE, default_tuning())
    layout = Layout(dp=4, tp=2, ep=2)
    found = {name.rsplit(".", 1)[1]: unkeyed_reads(entry, inputs, layout) for name, entry in mine.items()}
    split = {"pp", "virtual_pipeline_stages", "pipeline_layers"} | {
        "pipeline_account_for_embedding",
        "pipeline_account_for_loss",
    }
    assert found == {
        "pipeline_depth": {"pp"},
        "parameters_per_gpu": split | {"ep", "etp", "framework"},
        "gpus": {"pp", "cp"},
    }
    # at run time each such part reads a view of its key, so the unkeyed read is caught: the value is
    # computed on the whole layout, not memoised (a memo hit from another pp would return the first
    # one's value), and recorded
    monkeypatch.setattr(job_module, "UNKEYED_READS", set())
    shared = make_job(*inputs)
    assert pipeline_depth(shared, layout) == 2
    assert pipeline_depth(shared, dataclasses.replace(layout, pp=2, dp=2)) == 4
    assert gpus(shared, dataclasses.replace(layout, cp=2, dp=2)) == 8
    assert parameters_per_gpu(shared, layout) == step_time.gpu_parameters(make_job(*inputs), layout)
    assert {(name.rsplit(".", 1)[1], field) for name, field in job_module.UNKEYED_READS} == {
        ("pipeline_depth", "pp"),
        ("gpus", "pp"),  # through the property world_size, which the view has
        ("parameters_per_gpu", "pp"),  # the first field of the inner part's key the view lacks
    }
    assert not shared.memos[pipeline_depth] and not shared.memos[gpus]
    # and a registered part under a key short of one field it reads is reported
    (stored,) = [entry for entry in MEMOISED_PARTS if entry.name == "stage_traffic_bytes"]
    short = MemoisedPart(
        stored.name, tuple(f for f in stored.fields if f != "sequence_parallel"), stored.formula
    )
    assert unkeyed_reads(short, inputs, layout) == {"sequence_parallel"}
    assert unkeyed_reads(stored, inputs, layout) == set()


# ---------------------------------------------------------------- memo hits equal fresh jobs

_ZERO_STAGES = {Framework.MEGATRON: (0, 1), Framework.DEEPSPEED: (0, 1, 2, 3), Framework.FSDP: (0, 2, 3)}

# (framework, dp, tp, pp, cp, v, micro-batch) on 16 GPUs (2 nodes of 8)
_AXIS_STRUCTURES = (
    (Framework.MEGATRON, 4, 2, 2, 1, 2, 1),
    (Framework.MEGATRON, 2, 2, 4, 1, 1, 2),
    (Framework.MEGATRON, 4, 1, 4, 1, 2, 2),
    (Framework.MEGATRON, 4, 2, 1, 2, 1, 2),
    (Framework.DEEPSPEED, 16, 1, 1, 1, 1, 2),
    (Framework.DEEPSPEED, 4, 2, 2, 1, 1, 1),
    (Framework.DEEPSPEED, 8, 2, 1, 1, 1, 2),
    (Framework.DEEPSPEED, 8, 1, 1, 2, 1, 1),
    (Framework.FSDP, 16, 1, 1, 1, 1, 1),
    (Framework.FSDP, 8, 2, 1, 1, 1, 1),
    (Framework.FSDP, 4, 2, 1, 2, 1, 2),
    (Framework.FSDP, 8, 1, 2, 1, 1, 2),
)


def _axis_variants(global_batch: int) -> list[tuple[str, Callable[[Layout], Layout]]]:
    def ga(lay: Layout) -> Layout:
        return dataclasses.replace(
            lay, gradient_accumulation_steps=global_batch // (lay.micro_batch_size * lay.dp)
        )

    def offload(kind: Offload) -> Callable[[Layout], Layout]:
        return lambda lay: dataclasses.replace(
            lay, offload_optimizer=kind, offload_params=kind if lay.zero_stage == 3 else Offload.NONE
        )

    return [
        ("plain", lambda lay: lay),
        ("nvme", offload(Offload.NVME)),
        ("nvme optimizer", lambda lay: dataclasses.replace(lay, offload_optimizer=Offload.NVME)),
        ("cpu", offload(Offload.CPU)),
        ("activation offload", lambda lay: dataclasses.replace(lay, activation_offload=True)),
        (
            "activation offload + full",
            lambda lay: dataclasses.replace(lay, activation_offload=True, recompute=Recompute.FULL),
        ),
        ("chunked loss", lambda lay: dataclasses.replace(lay, chunked_loss=True)),
        ("compiled", lambda lay: dataclasses.replace(lay, torch_compile=Compile.MODEL_AND_LOSS)),
        ("hybrid shard", lambda lay: dataclasses.replace(lay, fsdp_hybrid_shard=True)),
        ("overlap on", lambda lay: dataclasses.replace(lay, overlap_grad_reduce=True)),
        ("overlap off", lambda lay: dataclasses.replace(lay, overlap_grad_reduce=False)),
        ("tp overlap off", lambda lay: dataclasses.replace(lay, tp_comm_overlap=False)),
        ("accumulation", ga),
        ("selective", lambda lay: dataclasses.replace(lay, recompute=Recompute.SELECTIVE)),
        ("full", lambda lay: dataclasses.replace(lay, recompute=Recompute.FULL)),
        (
            "all flags",
            lambda lay: dataclasses.replace(
                ga(offload(Offload.CPU)(lay)),
                activation_offload=True,
                chunked_loss=True,
                fsdp_hybrid_shard=True,
                overlap_grad_reduce=False,
                recompute=Recompute.FULL,
            ),
        ),
    ]


def axis_layouts(spec: ModelSpec, training: TrainingSpec) -> list[Layout]:
    """Every flag on every (structure, zero stage) pair of ``_AXIS_STRUCTURES``, so that each flag
    meets every framework, split and sharding and many layouts share each memo key; the valid ones."""
    moe, c = spec.moe is not None, cluster(2)
    out = []
    for _, variant in _axis_variants(training.global_batch_size):
        for (fw, dp, tp, pp, cp, v, b), zero in [
            (s, z) for s in _AXIS_STRUCTURES for z in _ZERO_STAGES[s[0]]
        ]:
            base = Layout(
                framework=fw, dp=dp, tp=tp, pp=pp, cp=cp, ep=(2 if dp * cp % 2 == 0 else 1) if moe else 1,
                zero_stage=zero, sequence_parallel=tp > 1, virtual_pipeline_stages=v, micro_batch_size=b,
                tp_comm_overlap=fw is Framework.MEGATRON and tp > 1,
            )  # fmt: skip
            layout = variant(base)
            if layout_violation(spec, c, layout, training) is None:
                out.append(layout)
    return out


def few_micro_batch_layouts(spec: ModelSpec, training: TrainingSpec) -> list[Layout]:
    """Interleaved and plain pipelines with m = pp or fewer micro-batches (where Megatron caps the
    warm-up at all m x v chunks), derived and explicit accumulation steps; the valid ones."""
    c, out = cluster(2), []
    for (dp, tp), pp, v, b, recompute in itertools.product(
        ((1, 4), (2, 2), (4, 1), (2, 4), (4, 2), (8, 1)),
        (2, 4),
        (1, 2, 3),
        (1, 2, 4),
        (Recompute.NONE, Recompute.FULL),
    ):
        if dp * tp * pp != 16:
            continue
        lay = Layout(
            framework=Framework.MEGATRON, dp=dp, tp=tp, pp=pp, ep=2 if spec.moe and dp % 2 == 0 else 1,
            zero_stage=1, recompute=recompute, sequence_parallel=tp > 1, virtual_pipeline_stages=v,
            micro_batch_size=b,
        )  # fmt: skip
        steps, left = divmod(training.global_batch_size, b * dp)
        explicit = (
            (dataclasses.replace(lay, gradient_accumulation_steps=steps),) if steps and not left else ()
        )
        for layout in (lay, *explicit):
            if layout_violation(spec, c, layout, training) is None:
                out.append(layout)
    assert any(lay.accumulation_steps(training.global_batch_size) <= lay.pp for lay in out)
    assert any(lay.virtual_pipeline_stages > 1 for lay in out)
    return out


# (model, training, which layouts) of the shared-job checks
SHARED_JOBS = (
    ("llama-3-8b", BASE, "axis"),
    ("llama-3-8b", LORA, "axis"),
    ("llama-3-8b", QLORA, "axis"),
    ("llama-3-8b", LORA_FP32_BASE, "axis"),
    ("llama-2-7b", dataclasses.replace(EAGER, precision=Precision.BF16_PURE), "axis"),
    ("mixtral-8x7b", BASE, "axis"),
    ("moe-every-2nd", BASE, "axis"),
    ("moe-every-2nd", LORA, "axis"),
    (UNALIGNED.name, FP16_EAGER, "axis"),
    ("llama-3-8b", TrainingSpec(seq_len=4096, global_batch_size=16), "few micro-batches"),
    ("moe-every-2nd", TrainingSpec(seq_len=4096, global_batch_size=16), "few micro-batches"),
    ("llama-3-8b", BASE, "random"),
    ("moe-every-2nd", EAGER, "random"),
)


@cache
def shared_layouts(name: str, training: TrainingSpec, which: str) -> tuple[Layout, ...]:
    spec = spec_of(name)
    if which == "axis":
        layouts = axis_layouts(spec, training)
    elif which == "few micro-batches":
        layouts = few_micro_batch_layouts(spec, training)
    else:
        layouts = valid_layouts(spec, cluster(2), training, 300, seed=len(name))
    random.Random(7).shuffle(layouts)
    return tuple(layouts)


def shared_job_ids() -> list[str]:
    return [
        f"{name}-{t.method.value}-{t.precision.value}-{t.attention or 'gpu'}-{t.global_batch_size}-{which}"
        for name, t, which in SHARED_JOBS
    ]


@pytest.mark.parametrize(("name", "training", "which"), SHARED_JOBS, ids=shared_job_ids())
def test_memo_hits_equal_fresh_jobs(name: str, training: TrainingSpec, which: str) -> None:
    # One job for all layouts, in shuffled order: each memo key's first layout is another one than
    # the one asking, so a field wrongly left out of a key shows up as a mismatch.
    spec, c, tuning = spec_of(name), cluster(2, host_limits=True), default_tuning()
    layouts = shared_layouts(name, training, which)
    # QLoRA trains data-parallel only (no tp, pp or ep), an fp32 LoRA base under FSDP only, a LoRA
    # MoE model no fsdp ep (no launcher has both; nor DeepSpeed NVMe optimizer offload below ZeRO-3):
    # fewer layouts on their axes
    lora_moe = training.method is not Method.FULL and spec.moe is not None
    narrow = training.method is Method.QLORA or training.base_autocast or lora_moe
    # ... and LoRA no DeepSpeed tp (AutoTP drops peft's adapters: validate's lora_autotp)
    lora = training.method is Method.LORA
    least = 60 if which == "few micro-batches" else (45 if lora else 90) if narrow else (200 if lora else 250)
    assert len(layouts) >= least
    shared, memory_asked = make_job(spec, c, training, tuning), set(layouts)
    for layout in layouts:
        fresh = make_job(spec, c, training, tuning)
        assert evaluate.memory_estimate(shared, layout) == evaluate.memory_estimate(fresh, layout), layout
        fresh = make_job(spec, c, training, tuning)
        assert evaluate.time_estimate(shared, layout) == evaluate.time_estimate(fresh, layout), layout
        if which == "few micro-batches":
            # memory takes explicit steps as given, even one micro-batch (time rejects it)
            single = dataclasses.replace(layout, gradient_accumulation_steps=1)
            memory_asked.add(single)
            fresh = make_job(spec, c, training, tuning)
            assert evaluate.memory_estimate(shared, single) == evaluate.memory_estimate(fresh, single), single
    # the shared job answered layouts from its memos
    assert 0 < len(shared.memos[step_time.group_links]) < len(layouts) / 10
    stage_memos = [
        len(shared.memos[part]) for part in (memory_parts.stage_states, memory_parts.stage_activations)
    ]
    assert 0 < min(stage_memos) < len(memory_asked) and max(stage_memos) <= len(memory_asked)
    assert 0 < len(shared.memos[step_time.step_parts]) <= len(layouts)


def test_a_short_key_gives_no_stale_number_and_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    # Mutation: stage_traffic_bytes memoised without sequence_parallel (which it reads). The random
    # layouts vary SP at a fixed (tp, pp): a memo keyed so would return another layout's stored bytes,
    # but the part reads a view of its key, so the read is caught: every number equals a fresh job's,
    # nothing is memoised under the short key, and the read is recorded.
    monkeypatch.setattr(job_module, "MEMOISED_PARTS", list(MEMOISED_PARTS))
    monkeypatch.setattr(job_module, "UNKEYED_READS", set())
    (stored,) = [entry for entry in MEMOISED_PARTS if entry.name == "stage_traffic_bytes"]
    short_key = layout_memo("tp", *pipeline.PIPELINE_FIELDS)  # sequence_parallel left out
    mutant = short_key(stored.formula)
    monkeypatch.setattr(step_time, "stage_traffic_bytes", mutant)
    spec, c, tuning = spec_of("llama-3-8b"), cluster(2, host_limits=True), default_tuning()
    shared = make_job(spec, c, BASE, tuning)
    layouts = shared_layouts("llama-3-8b", BASE, "random")
    assert sum(layout.tp > 1 and layout.sequence_parallel for layout in layouts) > 10
    wrong = [
        layout
        for layout in layouts
        if evaluate.time_estimate(shared, layout)
        != evaluate.time_estimate(make_job(spec, c, BASE, tuning), layout)
    ]
    assert wrong == []
    part = f"{stored.formula.__module__}.{stored.formula.__qualname__}"
    assert job_module.UNKEYED_READS == {(part, "sequence_parallel")}
    assert not shared.memos[mutant]


@pytest.mark.parametrize(("name", "training", "which"), SHARED_JOBS, ids=shared_job_ids())
def test_numbers_equal_the_reported_objects(name: str, training: TrainingSpec, which: str) -> None:
    # What the search decides and ranks by (memory_numbers, fits, step_numbers, floor_s) equals the
    # estimate's totals exactly, with and without a calibrated dynamic factor, with a host limit
    # that some offloading layouts break.
    spec, c = spec_of(name), cluster(2, host_limits=True)
    job = make_job(spec, c, training, default_tuning())
    verdicts = set()
    for layout in shared_layouts(name, training, which):
        for factor in (1.0, 1.25):
            memory = evaluate.memory_estimate(job, layout, factor)
            numbers = (memory.per_gpu.total, memory.cpu_per_node_bytes, memory.nvme_per_node_bytes)
            assert evaluate.memory_numbers(job, layout, factor) == numbers, layout
            host_ok = memory.cpu_per_node_bytes <= c.cpu_memory_bytes_per_node and (
                memory.nvme_per_node_bytes <= c.nvme_bytes_per_node
            )
            for limit in (memory.per_gpu.total - 1, memory.per_gpu.total, c.gpu.memory_bytes):
                fits = memory.per_gpu.total <= limit and host_ok
                assert evaluate.fits(job, layout, limit, factor) == fits, (layout, limit)
                assert evaluate.numbers_fit(c, numbers, limit) == fits, (layout, limit)
                verdicts.add(fits)
            assert evaluate.fits(job, layout, dynamic_factor=factor) == evaluate.memory_fits(memory, c), (
                layout
            )
        time = evaluate.time_estimate(job, layout)
        assert evaluate.step_numbers(job, layout) == (time.step_s, time.tokens_per_s), layout
        exact = time.breakdown
        assert evaluate.floor_s(job, layout) <= (exact.step_s - exact.pp_bubble_s) * (1 + 1e-12), layout
    assert verdicts == {True, False}


@pytest.mark.parametrize(
    ("name", "training"), [("llama-3-8b", BASE), ("moe-every-2nd", LORA), (UNALIGNED.name, FP16_EAGER)]
)
def test_estimate_is_evaluate_on_the_prepared_job(name: str, training: TrainingSpec) -> None:
    spec, c, tuning = spec_of(name), cluster(2, host_limits=True), default_tuning()
    layouts = shared_layouts(name, training, "axis")[:12]
    for layout, calibration in itertools.product(
        layouts, (Calibration(), Calibration(memory_dynamic_factor=1.2, step_time_factor=1.1))
    ):
        result = estimate(spec, c, layout, training, tuning=tuning, calibration=calibration)
        assert result == estimate_valid(prepare(spec, c, training, tuning), layout, calibration=calibration)
        fresh = make_job(spec, c, training, tuning)
        assert result == estimate_valid(fresh, layout, calibration=calibration)
        factor = calibration.memory_dynamic_factor
        assert result.memory == evaluate.memory_estimate(make_job(spec, c, training, tuning), layout, factor)
        time = evaluate.time_estimate(make_job(spec, c, training, tuning), layout)
        assert result.time == calibrated_time(time, calibration.step_time_factor)
        assert result.fits == evaluate.memory_fits(result.memory, c)
        limits = make_job(spec, c, training, tuning)
        assert result.max_micro_batch_size == evaluate.max_micro_batch_size(limits, layout, factor)
        assert result.max_seq_len == evaluate.max_seq_len(limits, layout, factor)


# ---------------------------------------------------------------- layers by kind


def _stage_layers(spec: ModelSpec, layout: Layout) -> Iterator[tuple[int, list[int]]]:
    # each pipeline rank's layer indices, its virtual stages together
    for rank, chunks in enumerate(pipeline.rank_layer_ranges(spec.num_layers, layout)):
        yield rank, [i for chunk in chunks for i in chunk]


MODULES = frozenset({RecomputeModule.CORE_ATTN, RecomputeModule.MLP, RecomputeModule.MOE})


@pytest.mark.parametrize("name", [*sorted(models()), SPARSE_MOE.name])
def test_per_layer_quantities_depend_only_on_the_layer_kind(name: str) -> None:
    # The job computes per-layer FLOPs, recompute FLOPs, stored and saved activation bytes once per
    # layer kind (MoE or not, attention span) and sums them by kind: it relies on every per-layer
    # quantity reading the layer only through layer_kind. Layer by layer, by index, the sums come out
    # the same.
    spec = spec_of(name)
    training = TrainingSpec(seq_len=2048, global_batch_size=8, attention=Attention.EAGER)
    layout = Layout(framework=Framework.MEGATRON, tp=2, sequence_parallel=True)  # (AutoTP keeps some whole)
    job = make_job(spec, cluster(1), training, default_tuning())
    kinds = [layer_kind(spec, i) for i in range(spec.num_layers)]
    assert job.layer_kinds == tuple(kinds) and set(job.kinds) == set(kinds)
    assert [kind.moe for kind in kinds] == [is_moe_layer(spec, i) for i in range(spec.num_layers)]
    per_kind: dict[LayerKind, set[int]] = {}
    for i, kind in enumerate(kinds):
        per_kind.setdefault(kind, set()).add(layer_parameters(spec, i))
    assert all(len(values) == 1 for values in per_kind.values())
    experts = job.counts.experts_per_moe_layer
    for pp in (1, 2, 3, 4, 8):  # even splits, and uneven ones (3, or layers not divisible)
        staged = dataclasses.replace(layout, pp=pp)
        logits = flops.logits_training_flops(spec, training)
        by_layer = [
            sum(flops.layer_training_flops(spec, kinds[i], training, fused_experts=True) for i in layers)
            + (logits if s == pp - 1 else 0)
            for s, layers in _stage_layers(spec, staged)
        ]
        assert step_time.stage_flops_per_token(job, staged) == tuple(by_layer)
        counts = rank_kind_counts(job, staged)
        for recompute, (s, layers) in itertools.product(Recompute, _stage_layers(spec, staged)):
            assert sum(
                count * step_time.kind_recompute_flops(job, kind, recompute, MODULES, True)
                for kind, count in counts[s]
            ) == sum(
                flops.layer_recompute_flops(spec, kinds[i], training, recompute, MODULES, fused_experts=True)
                for i in layers
            )
        stored = [
            sum(step_time.layer_traffic_bytes(spec, staged, training, kinds[i]) for i in layers)
            for _, layers in _stage_layers(spec, staged)
        ]
        assert step_time.stage_traffic_bytes(job, staged) == pytest.approx(tuple(stored), rel=1e-12)

        # each stage's dense parameters over tp, its routed experts (of its MoE layers) over ep x etp
        routed = [experts * sum(kinds[i].moe for i in layers) for _, layers in _stage_layers(spec, staged)]
        on_gpu = [
            (params - r) / staged.tp + r / (staged.ep * staged.expert_tp)
            for params, r in zip(stage_parameter_counts(spec, staged), routed, strict=True)
        ]
        assert step_time.gpu_parameters(job, staged) == max(on_gpu)
    for recompute in Recompute:
        saved = sum(activations.layer_bytes(spec, layout, training, kind, recompute) for kind in kinds)
        layer = activations.layer_activations(job, dataclasses.replace(layout, recompute=recompute))
        whole = activations.rank_micro_batch_bytes(layer, rank_kind_counts(job, layout)[0], 1.0)
        assert whole == pytest.approx(saved, rel=1e-12)


def test_jobs_of_two_tunings_share_no_memory_part_that_reads_the_tuning() -> None:
    """Torch's ring attention buffers read ``Tuning.ring_attention_repeats_kv``: a second tuning in one
    ``shared_memory_memos()`` block read the first one's memory (library review: 173,443,605,464 bytes
    where its own job gives 174,844,838,544)."""
    import dataclasses

    from service.catalog.gpus import gpu
    from service.catalog.models import model
    from service.catalog.tuning import default_tuning
    from service.estimator import evaluate
    from service.estimator.job import make_job, shared_memory_memos
    from service.estimator.types import Attention, ClusterSpec, Framework, Layout, Precision

    h100 = gpu("h100-sxm-80gb")
    node = ClusterSpec(gpu=h100, num_nodes=1, gpus_per_node=8,
                       intra_node_bandwidth_bytes_per_s=h100.intra_node_bandwidth_bytes_per_s,
                       inter_node_bandwidth_bytes_per_s=50e9)  # fmt: skip
    spec = model("llama-3-8b").spec
    training = TrainingSpec(
        seq_len=32768, global_batch_size=8, precision=Precision.BF16, attention=Attention.FLASH
    )
    layout = Layout(framework=Framework.FSDP, dp=4, cp=2, zero_stage=3)
    tuning = default_tuning()
    repeats = dataclasses.replace(tuning, ring_attention_repeats_kv=not tuning.ring_attention_repeats_kv)
    alone = evaluate.memory_estimate(make_job(spec, node, training, repeats), layout).per_gpu.total
    with shared_memory_memos():
        evaluate.memory_estimate(make_job(spec, node, training, tuning), layout)
        shared = evaluate.memory_estimate(make_job(spec, node, training, repeats), layout).per_gpu.total
    assert shared == alone
