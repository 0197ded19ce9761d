"""validation/published.py: every published run builds estimator inputs or says why it cannot, the
file's split follows its written rule, and the summary of each half adds up. Needs no torch."""

from __future__ import annotations

import math

import pytest

from service.catalog.tuning import default_tuning
from service.estimator.estimate import estimate
from service.estimator.types import (
    ALL_LINEAR,
    Compile,
    Framework,
    MemoryStatistic,
    Method,
    Precision,
    Recompute,
    RecomputeModule,
)
from validation import published

ROWS = published.load_rows()
IDS = [row["id"] for row in ROWS]


def test_file_shape() -> None:
    assert len(ROWS) == 204  # 170 + issue 27's 34 BERT-large SQuAD rows (NVIDIA DeepLearningExamples)
    assert len(set(IDS)) == len(IDS)
    assert sum(row["kind"] == "throughput" for row in ROWS) == 178
    assert sum(row["kind"] == "memory" for row in ROWS) == 26
    assert {row["split"] for row in ROWS} == set(published.SPLITS)


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_row_builds_or_says_why(row: published.Row) -> None:
    try:
        built = published.inputs(row)
    except published.Unexpressible as error:
        assert error.reason.strip()
        return
    _model, cluster, training, layout, caveats = built
    assert cluster.world_size == row["cluster"]["total_gpus"] == layout.world_size
    assert training.seq_len == row["training"]["seq_len"]
    assert all(isinstance(c, str) and c for c in caveats)


def test_split_follows_the_written_rule() -> None:
    by_rule = published.split_by_rule(ROWS)
    assert {row["id"]: row["split"] for row in ROWS} == by_rule
    # a group never straddles the halves
    groups: dict[str, set[str]] = {}
    for row in ROWS:
        groups.setdefault(row["group"], set()).add(row["split"])
    assert all(len(splits) == 1 for splits in groups.values())
    assert len(groups) == 173


# what a row's memory_measure says, for each statistic its memory_statistic may name
MEASURE_WORDS = {
    MemoryStatistic.RESERVED: ("reserved_bytes.all.peak", "max_reserved", "max_memory_reserved"),
    MemoryStatistic.ALLOCATED: ("allocated_bytes.all.peak", "max_allocated", "max_memory_allocated"),
    MemoryStatistic.DEVICE_USED: ("nvidia-smi", "NVML", "mem_get_info"),
}


def test_memory_rows_are_gib_in_bytes_and_name_the_statistic_their_measure_states() -> None:
    for row in ROWS:
        if row["kind"] == "memory":
            gib = row["published"]["memory_gib"]
            assert row["peak_memory_bytes_per_gpu"] == round(gib * 2**30), row["id"]
            statistic = published.memory_statistic(row)
            assert any(word in row["memory_measure"] for word in MEASURE_WORDS[statistic]), row["id"]
            others = [w for s, words in MEASURE_WORDS.items() if s is not statistic for w in words]
            assert not any(word in row["memory_measure"] for word in others), row["id"]


def test_a_memory_row_is_compared_with_the_figure_of_its_statistic() -> None:
    for row_id in ("tt2412-l31-8b-h100x8-fsdp-eager-mem", "peftdoc-l2-70b-h100x8-ds-zero3-lora-mem"):
        row = published.row_by_id(row_id)
        result = published.evaluate(row)
        model, cluster, training, layout, _ = published.inputs(row)
        est = estimate(model, cluster, layout, training, tuning=default_tuning(), with_limits=False)
        statistic = published.memory_statistic(row)
        assert result.statistic == statistic.value
        assert result.ours == est.memory.per_gpu.statistic(statistic)
    # torchtitan's max_reserved: without the CUDA context and NCCL's buffers
    assert published.memory_statistic(published.row_by_id("tt2412-l31-8b-h100x8-fsdp-eager-mem")) is (
        MemoryStatistic.RESERVED
    )


def test_a_lora_row_builds_its_adapters() -> None:
    training = published.inputs(published.row_by_id("peftdoc-l2-70b-h100x8-ds-zero3-lora-mem")).training
    assert (training.method, training.lora_rank, training.lora_targets) == (Method.LORA, 8, ALL_LINEAR)


def test_megatron_row_by_hand() -> None:
    row = published.row_by_id("nemo2407-l2-70b-h100x64-tp4pp4vp20")
    model, cluster, training, layout, _ = published.inputs(row)
    assert (layout.framework, layout.dp, layout.tp, layout.pp, layout.cp) == (Framework.MEGATRON, 4, 4, 4, 1)
    assert (layout.virtual_pipeline_stages, layout.micro_batch_size, layout.zero_stage) == (20, 1, 1)
    assert layout.gradient_accumulation_steps == 32
    assert layout.recompute is Recompute.NONE and layout.recompute_num_layers is None
    assert layout.sequence_parallel and layout.tp_comm_overlap
    assert training.precision is Precision.FP8 and training.global_batch_size == 128
    assert model.num_layers == 80 and cluster.gpu.name == "h100-sxm-80gb" and cluster.num_nodes == 8
    assert cluster.inter_node_bandwidth_bytes_per_s == row["cluster"]["inter_node_bandwidth_bytes_per_s"]


def test_torchtitan_recompute_mapping() -> None:
    op = published.inputs(published.row_by_id("tt2412-l31-8b-h100x8-fsdp-eager-tput")).layout
    assert (op.framework, op.dp, op.zero_stage) == (Framework.FSDP, 8, 3)
    assert op.recompute is Recompute.SELECTIVE_OP
    full = published.inputs(published.row_by_id("ttdoc-l3-70b-a100x64-fsdp-full")).layout
    assert full.recompute is Recompute.FULL and full.recompute_num_layers is None
    # torchtitan's selective layer AC (selective_ac_option '2'): every 2nd block checkpointed
    layer = published.inputs(published.row_by_id("ttdoc-l3-8b-a100x64-fsdp-sel-layer")).layout
    assert (layer.recompute, layer.recompute_every_n_layers) == (Recompute.FULL, 2)


def test_recompute_policies() -> None:
    megatron = {"framework": "megatron"}
    assert published.recompute_of({**megatron, "recompute": "selective"}) == (
        Recompute.SELECTIVE,
        None,
        None,
        None,
    )
    block = "--recompute-granularity full --recompute-method block --recompute-num-layers 3"
    assert published.recompute_of({**megatron, "recompute": "full", "recompute_detail": block}) == (
        Recompute.FULL,
        3,
        None,
        None,
    )
    uniform = "--recompute-method uniform --recompute-num-layers 1"
    assert published.recompute_of({**megatron, "recompute": "full", "recompute_detail": uniform}) == (
        Recompute.FULL,
        None,
        None,
        None,
    )
    with pytest.raises(published.Unexpressible, match="recompute not published"):
        published.recompute_of({**megatron, "recompute": "unknown"})
    modules = "megatron selective, recompute_modules ['mla_up_proj', 'mlp'] (run_script.py)"
    assert published.recompute_of({**megatron, "recompute": "selective", "recompute_detail": modules}) == (
        Recompute.SELECTIVE,
        None,
        None,
        (RecomputeModule.MLA_UP_PROJ, RecomputeModule.MLP),
    )
    with pytest.raises(published.Unexpressible, match="recompute_modules"):
        published.recompute_of(
            {**megatron, "recompute": "selective", "recompute_detail": "recompute_modules ['mlp_fc1']"}
        )


def test_pipeline_split_from_the_row() -> None:
    bloom = published.inputs(published.row_by_id("bloom-tr11-176b-a100x384-tp4pp12dp8")).layout
    assert bloom.pipeline_layers == (5, *[6] * 10, 5)
    # per-rank counts under interleaving: the account-for flags give the split, checked against them
    megatron = published.inputs(published.row_by_id("mb2509-l31-405b-h100x1024-tp8pp8cp2vp8")).layout
    assert megatron.pipeline_layers is None
    assert megatron.pipeline_account_for_embedding and megatron.pipeline_account_for_loss


def test_caveats_are_kept() -> None:
    caveats = published.inputs(published.row_by_id("tt2412-l31-8b-h100x8-fsdp-compile-fp8-tput")).caveats
    text = " ".join(caveats)
    assert "fp8 recipe" in text and "GPU variant" in text


def test_torch_compile_is_mapped_as_each_torchtitan_version_compiled() -> None:
    """torchtitan compiled the TransformerBlocks only until 2025 (the loss left out: 9dec370 train.py),
    the blocks and the loss since (components/loss.py); an eager row stays eager."""
    layout = published.inputs(published.row_by_id("tt2412-l31-8b-h100x8-fsdp-compile-tput")).layout
    assert layout.torch_compile is Compile.MODEL
    layout = published.inputs(published.row_by_id("tttrainy-l31-8b-h200x64-fsdp-fp8-mem")).layout
    assert layout.torch_compile is Compile.MODEL_AND_LOSS
    layout = published.inputs(published.row_by_id("tt2412-l31-8b-h100x8-fsdp-eager-tput")).layout
    assert layout.torch_compile is Compile.NONE
    row = published.row_by_id("tt2412-l31-8b-h100x8-fsdp-compile-tput") | {"source_key": "elsewhere"}
    with pytest.raises(published.Unexpressible, match="whether the loss was compiled"):
        published.inputs(row)


def test_summary_adds_up() -> None:
    results = published.results()
    summary = published.summarize(results)
    assert len(summary.halves) == len(published.SPLITS) * len(published.KINDS)
    assert sum(h.rows for h in summary.halves) == len(ROWS)
    unexpressible = sum(len(ids) for _, ids in summary.unexpressible)
    assert sum(h.expressible for h in summary.halves) + unexpressible == len(ROWS)
    assert all(reason.strip() for reason, _ in summary.unexpressible)
    for h in summary.halves:
        assert 0 <= h.within <= h.expressible <= h.rows
        if h.expressible:
            fraction = h.within_fraction
            assert fraction is not None and 0.0 <= fraction <= 1.0
            assert h.median_abs_error is not None and h.median_signed_error is not None
            assert abs(h.median_signed_error) <= h.median_abs_error + 1e-12
            assert h.worst is not None and h.worst.error is not None
            assert abs(h.worst.error) >= h.median_abs_error
        counted = [r for r in results if r.split == h.split and r.kind == h.kind]
        assert h.rows == len(counted)
    for r in results:
        assert (r.reason is None) == r.expressible
        if r.error is not None:
            assert math.isfinite(r.error) and r.ours is not None and r.ours > 0
    assert len(published.targets(summary)) == 3


# Issue 27, first class: the dense Megatron-Core layouts NVIDIA measured with its recipes ran, so
# the estimate never says they do not fit (on the card's capacity: no row states its memory).
RECIPE_ROWS = [row for row in ROWS if published.is_nvidia_recipe_row(row)]


def test_the_nvidia_recipe_rows_are_the_classs() -> None:
    assert len(RECIPE_ROWS) == 31
    assert {row["source_key"] for row in RECIPE_ROWS} == published.NVIDIA_RECIPE_SOURCES
    assert set(published.recipes_before()) == {row["id"] for row in RECIPE_ROWS}


@pytest.mark.parametrize("row", RECIPE_ROWS, ids=[row["id"] for row in RECIPE_ROWS])
def test_every_nvidia_recipe_row_fits_on_its_published_layout(row: published.Row) -> None:
    result = published.recipe_result(row)
    if result.reason is not None:  # Megatron-FSDP (zero_stage 3 under Megatron) is not expressible
        assert row["id"] == "mb2509-l3-8b-h100x8-mfsdp", result.reason
        return
    assert result.fits, f"{row['id']}: {result.memory_bytes / 2**30:.1f} GiB estimated"


def test_recipe_fields_reach_the_layout() -> None:
    layout = published.inputs(published.row_by_id("mb2509-l3-70b-h100x64-tp4pp8vp5")).layout
    assert layout.grad_reduce_in_fp32 is False and layout.fp8_param_gather
    nemo = published.inputs(published.row_by_id("nemo2407-l3-8b-h100x8-cp2")).layout
    assert nemo.grad_reduce_in_fp32 is False and not nemo.fp8_param_gather
