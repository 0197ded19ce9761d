"""Warnings for inputs the numbers cannot vouch for (issue 24): a sequence past the model's trained
context, and figures computed outside the ranges their validation covers."""

from __future__ import annotations

import dataclasses

import pytest

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator.caveats import VALIDATED_RANGES, context_warnings, coverage_warnings, network_warnings
from service.estimator.estimate import estimate, warnings_for
from service.estimator.params import parameter_counts
from service.estimator.types import (
    Estimate,
    Framework,
    Layout,
    MemoryBreakdown,
    MemoryEstimate,
    Method,
    ModelSpec,
    TrainingSpec,
)
from validation import cases, published
from validation.cases import gpu_cluster

H100 = gpu("h100-sxm-80gb")
FSDP8 = Layout(framework=Framework.FSDP, dp=8, zero_stage=3)


def _estimate(name: str, seq_len: int, gpus: int = 8, layout: Layout = FSDP8) -> Estimate:
    training = TrainingSpec(seq_len=seq_len, global_batch_size=layout.dp)
    model = preset(name).spec
    return estimate(
        model, gpu_cluster(H100, gpus, 50e9), layout, training, tuning=default_tuning(), with_limits=False
    )


# ---------------------------------------------------------------- trained context


def test_llama_3_8b_at_32k_is_past_its_8192_trained_positions() -> None:
    warnings = _estimate("llama-3-8b", 32768).warnings
    context = [w for w in warnings if w.startswith("seq_len")]
    assert context == [
        "seq_len 32,768 > max_position_embeddings 8,192: llama-3-8b was trained to 8,192 positions and needs "
        "RoPE scaling (rope_scaling in its config) or continued pretraining at this length; the estimate "
        "counts 32,768-token sequences as asked"
    ]


@pytest.mark.parametrize(("name", "seq_len"), [("llama-3-8b", 8192), ("llama-3.1-8b", 32768), ("gpt2", 1024)])
def test_no_warning_within_the_trained_context(name: str, seq_len: int) -> None:
    assert not context_warnings(preset(name).spec, TrainingSpec(seq_len=seq_len, global_batch_size=1))


def test_linear_scaling_states_the_context_it_interpolates_to() -> None:
    """Gemma 3's config states 131,072 positions with linear scaling factor 8 (pre-trained at 32K,
    rescaled to 128K: Gemma 3 report §2); 262,144 and 1M tokens went unwarned as if 8 x 131,072 were
    trained (long-context review). Llama 3.1's llama3 scaling names its original 8,192 and reaches
    131,072 as before."""
    gemma = preset("gemma-3-27b").spec
    assert not context_warnings(gemma, TrainingSpec(seq_len=131_072, global_batch_size=1))
    (warning,) = context_warnings(gemma, TrainingSpec(seq_len=262_144, global_batch_size=1))
    assert "trained to 131,072 positions" in warning and "factor 8" in warning, warning
    assert not context_warnings(
        preset("llama-3.1-8b").spec, TrainingSpec(seq_len=131_072, global_batch_size=1)
    )
    assert context_warnings(preset("llama-3.1-8b").spec, TrainingSpec(seq_len=262_144, global_batch_size=1))


def test_learned_positions_have_no_row_past_the_table() -> None:
    """Past a learned table's rows the embedding lookup fails at the first step, so no layout runs it:
    refused (it was estimated as fitting, and a plan said feasible, with a warning: small-model review,
    stop 41). RoBERTa's ids start at padding_idx + 1 = 2, so 2 of its 514 rows are never a position;
    the largest sequence that fits stops at the table."""
    from service.estimator.errors import EstimatorError
    from service.estimator.validate import learned_positions, position_table_violation

    gpt2, roberta = preset("gpt2").spec, preset("roberta-base").spec
    assert (learned_positions(gpt2), learned_positions(roberta)) == (1024, 512)
    assert position_table_violation(gpt2, TrainingSpec(seq_len=1024, global_batch_size=1)) is None
    refused = position_table_violation(gpt2, TrainingSpec(seq_len=1025, global_batch_size=1))
    assert refused is not None and refused.field == "seq_len" and "1,024 positions" in refused.message
    assert position_table_violation(roberta, TrainingSpec(seq_len=513, global_batch_size=1)) is not None
    assert context_warnings(gpt2, TrainingSpec(seq_len=2048, global_batch_size=1)) == ()  # refused before
    a100 = gpu_cluster(gpu("a100-sxm-80gb"), 1, 50e9)
    with pytest.raises(EstimatorError, match="learned position table"):
        estimate(
            gpt2, a100, Layout(), TrainingSpec(seq_len=2048, global_batch_size=1), tuning=default_tuning()
        )
    fits = estimate(
        gpt2, a100, Layout(), TrainingSpec(seq_len=512, global_batch_size=1), tuning=default_tuning()
    )
    assert fits.max_seq_len == 1024


def test_alibi_runs_past_its_length_but_is_not_trained_there() -> None:
    (warning,) = context_warnings(preset("bloom-176b").spec, TrainingSpec(seq_len=4096, global_batch_size=1))
    assert "trained to 2,048 positions" in warning and "ALiBi" in warning


# ---------------------------------------------------------------- validated ranges


def _bounds(items: list[tuple[int, int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple((min(column), max(column)) for column in zip(*items, strict=True))


def _row_inputs(model: ModelSpec, gpus: int, seq_len: int) -> tuple[int, int, int]:
    return gpus, parameter_counts(model).total, seq_len


def _validated_inputs() -> dict[str, list[tuple[int, int, int]]]:
    """(GPUs, parameters, seq_len) of every row that compares a figure with a published measurement."""
    rows: dict[str, list[tuple[int, int, int]]] = {"step time": [], "per-GPU memory": []}
    for row in published.load_rows():
        try:
            built = published.inputs(row)
        except published.Unexpressible:
            continue  # not compared, so not validated
        figure = "step time" if row["kind"] == "throughput" else "per-GPU memory"
        rows[figure].append(_row_inputs(built.model, built.layout.world_size, built.training.seq_len))
    for case in cases.throughput_cases():
        rows["step time"].append(_row_inputs(case.model, case.layout.world_size, case.training.seq_len))
    return rows


def test_validated_ranges_are_those_of_the_validation_data() -> None:
    validated = _validated_inputs()
    for r in VALIDATED_RANGES:
        assert (r.gpus, r.parameters, r.seq_len) == _bounds(validated[r.figure]), r.figure
        assert "validation" in r.source


def test_every_validated_row_is_inside_its_ranges() -> None:
    for figure, items in _validated_inputs().items():
        ranges = tuple(r for r in VALIDATED_RANGES if r.figure == figure)
        for gpus, parameters, seq_len in items:
            assert not coverage_warnings(
                gpus, parameters, TrainingSpec(seq_len=seq_len, global_batch_size=1), ranges
            )


def test_an_estimate_inside_both_ranges_has_no_coverage_warning() -> None:
    # Llama-3.1-8B (8.03B) on 8 GPUs at 8K: the smallest validated memory row's own inputs
    assert not [w for w in _estimate("llama-3.1-8b", 8192).warnings if "validated on" in w]


def test_a_small_job_names_each_figure_and_what_is_outside() -> None:
    warnings = [w for w in _estimate("gpt2", 256, 1, Layout()).warnings if "validated on" in w]
    assert warnings == [
        "step time validated on 1 to 11,616 GPUs, 334M to 1.01T parameters, seq 384 to 262,144; this "
        "estimate is outside: 124M parameters, seq 256",
        "per-GPU memory validated on 1 to 512 GPUs, 2.51B to 406B parameters, seq 512 to 262,144; this "
        "estimate is outside: 124M parameters, seq 256",
    ]


def test_only_what_is_outside_is_named() -> None:
    # 16 GPUs and 8.03B are inside both; seq 448 only outside the memory rows (step time: from 384)
    warnings = [
        w
        for w in _estimate(
            "llama-3.1-8b", 448, 16, Layout(framework=Framework.FSDP, dp=16, zero_stage=3)
        ).warnings
        if "validated on" in w
    ]
    assert len(warnings) == 1 and warnings[0].startswith("per-GPU memory")
    assert warnings[0].endswith("this estimate is outside: seq 448")


def test_a_network_faster_than_any_nic_is_timed_as_stated_and_said() -> None:
    """400 typed as inter_node_bandwidth_gbps for 400 Gb/s NICs is 400 GB/s per GPU here, eight times
    the network: the estimate times what was stated (an NVL72 domain is that fast) and says the reading
    in bytes; at a NIC's share (50 GB/s) nothing is said."""
    h100 = gpu("h100-sxm-80gb")
    assert network_warnings(gpu_cluster(h100, 16, 50e9)) == ()
    assert network_warnings(gpu_cluster(h100, 8, 400e9)) == ()  # one node: no network between nodes
    (said,) = network_warnings(gpu_cluster(h100, 16, 400e9))
    assert "400 GB/s per GPU is faster than any NIC" in said and "that is 50 GB/s" in said


def test_an_nvlink_domain_stated_past_its_rack_is_said() -> None:
    """A GB200 NVL72 rack stated as nodes of 4 at 900 GB/s is timed as stated; 576 GPUs so stated were
    timed as one domain, though racks are joined by NICs (at most 100 GB/s per GPU): the data-parallel
    time was 2.6x short (a rack-scale review). Past 72 GPUs it is said."""
    b200 = gpu("b200-sxm-180gb")
    rack = dataclasses.replace(gpu_cluster(b200, 72, 900e9), gpus_per_node=4, num_nodes=18)
    (said,) = network_warnings(rack)
    assert "faster than any NIC" in said
    racks = dataclasses.replace(rack, num_nodes=144)
    (said,) = network_warnings(racks)
    assert "rack's holds 72 GPUs" in said and "576 may span several" in said, said


def test_a_network_share_above_the_gpus_host_link_is_said() -> None:
    """100 typed for 100 Gb/s EDR on an A100 (PCIe Gen4, 32 GB/s) is 100 GB/s per GPU here, a rate no NIC
    reaches a GPU at (its traffic crosses the PCIe host link); it passed silently below the fastest NIC's
    100 GB/s (network review). The catalog's DGX A100 share (25 GB/s) says nothing."""
    a100 = gpu("a100-sxm-40gb")
    assert network_warnings(gpu_cluster(a100, 16, 25e9)) == ()
    (said,) = network_warnings(gpu_cluster(a100, 16, 100e9))
    assert "above a100-sxm-40gb's PCIe host link (32 GB/s)" in said and "that is 12.5 GB/s" in said


def test_an_nvlink_figure_above_the_parts_own_is_said() -> None:
    """600 typed for an A100's NVLink (its datasheet's both directions; every figure here is one way)
    halved its TP time silently (network review). A PCIe card's own figure is its host link: an NVLink
    bridge stated above it is what the page asks for, and says nothing."""
    import dataclasses

    a100 = gpu_cluster(gpu("a100-sxm-40gb"), 8, 25e9)
    assert network_warnings(a100) == ()
    (said,) = network_warnings(dataclasses.replace(a100, intra_node_bandwidth_bytes_per_s=600e9))
    assert "above a100-sxm-40gb's own NVLink (300 GB/s)" in said
    bridged = gpu_cluster(gpu("a100-pcie-80gb"), 2, 25e9)
    assert network_warnings(dataclasses.replace(bridged, intra_node_bandwidth_bytes_per_s=300e9)) == ()


def test_a_link_between_a_nodes_gpus_nobody_stated_or_slower_than_the_network_is_a_warning() -> None:
    """A custom GB200 without intra_node_bandwidth_bytes_per_s was timed over PCIe (2.2x its step with
    NVLink) with the assumption in a note alone; a tray of 4 whose NVLink fabric was stated as the
    network put model parallelism across trays, silently (hardware review)."""
    from service.contracts.clusters import ClusterIn
    from tests.custom_gpus import GB200, GB200_NVLINK

    (said,) = network_warnings(ClusterIn(gpu=GB200, num_nodes=1, gpus_per_node=4).to_domain())
    assert "link between the GPUs of a node was not stated" in said and "64 GB/s" in said
    assert network_warnings(ClusterIn(gpu=GB200_NVLINK, num_nodes=1, gpus_per_node=4).to_domain()) == ()
    assert network_warnings(ClusterIn(gpu=GB200, num_nodes=1, gpus_per_node=1).to_domain()) == ()  # no peers
    fabric = ClusterIn(gpu=GB200, num_nodes=2, gpus_per_node=4, inter_node_bandwidth_bytes_per_s=90e9)
    warnings = network_warnings(fabric.to_domain())
    assert any("faster than the link between a node's GPUs (64 GB/s)" in w for w in warnings), warnings
    # a catalog part's own link is stated by the catalog, and an HGX node's NVLink outruns its NICs
    assert network_warnings(gpu_cluster(gpu("h100-sxm-80gb"), 16, 50e9)) == ()


def test_rope_scaling_stretches_the_trained_context() -> None:
    """A review's case: Qwen2.5 with its documented YaRN (factor 4 of 32,768) at 131,072 tokens was
    warned it "needs RoPE scaling (rope_scaling in its config)", which the config has. The limit is
    factor x the original context; past it the warning names both."""
    import dataclasses

    from service.estimator.types import RopeScaling, RopeScalingKind

    base = preset("llama-3-8b").spec  # 8,192 positions, no scaling
    yarn = RopeScaling(kind=RopeScalingKind.YARN, factor=4.0, original_max_position_embeddings=8192)
    scaled = dataclasses.replace(base, rope_scaling=yarn)
    assert not context_warnings(scaled, TrainingSpec(seq_len=32768, global_batch_size=1))
    (warning,) = context_warnings(scaled, TrainingSpec(seq_len=65536, global_batch_size=1))
    assert "rope_scaling (yarn, factor 4 of 8,192) reaches 32,768" in warning
    assert "needs RoPE scaling" not in warning
    # Llama 3.1's llama3 scaling (8 x 8,192 = 65,536) never lowers its 131,072 positions
    assert not context_warnings(
        preset("llama-3.1-8b").spec, TrainingSpec(seq_len=131072, global_batch_size=1)
    )


def test_tensor_parallelism_across_nodes_is_estimated_with_a_warning() -> None:
    """Network review (stop 41): an estimate of tp 8 over nodes of 4 was timed (30 s of TP
    communication) with no word; the search refuses the split (tp_node), the estimate says why."""
    from service.estimator.types import Recompute

    cluster = dataclasses.replace(gpu_cluster(gpu("h100-sxm-80gb"), 16, 6.25e9), num_nodes=4, gpus_per_node=4)
    layout = Layout(framework=Framework.MEGATRON, dp=2, tp=8, zero_stage=1, recompute=Recompute.FULL,
                    sequence_parallel=True)  # fmt: skip
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    result = estimate(preset("llama-3-70b").spec, cluster, layout, training, tuning=default_tuning())
    assert any("tp (8) > GPUs per node (4)" in w for w in result.warnings), result.warnings


def test_a_config_context_longer_than_its_scaling_reach_is_named_as_such() -> None:
    """Llama 3.1: max_position_embeddings 131,072 with llama3 scaling, factor 8 of 8,192 (65,536): the
    warning said it "reaches 65,536" beside the 131,072 it applied (long-context review, stop 41)."""
    (warning,) = context_warnings(
        preset("llama-3.1-8b").spec, TrainingSpec(seq_len=262144, global_batch_size=1)
    )
    assert "trained to 131,072 (its config's context with its rope_scaling (llama3, factor 8))" in warning
    assert "65,536" not in warning


def test_fine_grained_moe_estimates_say_their_step_is_optimistic() -> None:
    """Published Megatron runs of Qwen3-30B-A3B took 1.2-3.3x the estimated step (REPORT, MoE class);
    a plan's estimate said nothing of it (Megatron review). Mixtral's 8 wide experts are not fine-grained."""
    from service.catalog.models import model
    from service.estimator.caveats import moe_warnings

    (warning,) = moe_warnings(model("qwen3-30b-a3b").spec)
    assert "128 experts of width 768" in warning and "optimistic" in warning and "REPORT" in warning
    assert moe_warnings(model("mixtral-8x7b").spec) == ()
    assert moe_warnings(model("llama-3.1-8b").spec) == ()


def test_a_huge_rope_scaling_factor_reaches_past_any_sequence() -> None:
    """factor x original context overflowed int() at a factor of 1e305 (a 500 from a config.json):
    compared as a float, such a context covers every sequence, and a sequence past a finite one is
    still warned about."""
    from service.estimator.types import RopeScaling, RopeScalingKind

    llama = preset("llama-3-8b").spec
    # dynamic NTK scaling stretches max_position_embeddings (linear scaling states its reach instead)
    huge = dataclasses.replace(llama, rope_scaling=RopeScaling(kind=RopeScalingKind.DYNAMIC, factor=1e305))
    assert context_warnings(huge, TrainingSpec(seq_len=1 << 20, global_batch_size=1)) == ()
    twice = dataclasses.replace(llama, rope_scaling=RopeScaling(kind=RopeScalingKind.DYNAMIC, factor=2.0))
    (warning,) = context_warnings(twice, TrainingSpec(seq_len=1 << 20, global_batch_size=1))
    assert "reaches 16,384" in warning


def test_the_answer_says_what_mfu_counts() -> None:
    """MFU's count (6 per parameter and token without the input embedding, attention's causal half;
    LoRA's 4) was said only in flops.py: a user dividing by 6N got 0.60 for the answer's 0.43
    (hand-derivation review)."""
    from service.estimator.types import Method

    llama = preset("llama-3-8b").spec
    cluster_ = gpu("h100-sxm-80gb")
    from validation.cases import gpu_cluster

    c = gpu_cluster(cluster_, 8, 50e9)
    for method, words in (
        (Method.FULL, "6 FLOPs per parameter"),
        (Method.LORA, "4 FLOPs per base parameter"),
    ):
        training = TrainingSpec(seq_len=2048, global_batch_size=8, method=method)
        result = estimate(llama, c, Layout(framework=Framework.FSDP, dp=8, zero_stage=3), training,
                          tuning=default_tuning(), with_limits=False)  # fmt: skip
        (said,) = [a for a in result.assumptions if a.startswith("MFU counts")]
        assert words in said and "causal triangle" in said


def test_the_mfu_note_says_an_encoders_square_and_an_moes_active_parameters() -> None:
    from validation.cases import gpu_cluster

    c = gpu_cluster(gpu("h100-sxm-80gb"), 8, 50e9)
    for name, words in (("bert-large-uncased", "whole s x s square"), ("mixtral-8x7b", "active parameter")):
        spec = preset(name).spec
        training = TrainingSpec(seq_len=512, global_batch_size=8)
        result = estimate(spec, c, Layout(framework=Framework.FSDP, dp=8, zero_stage=3), training,
                          tuning=default_tuning(), with_limits=False)  # fmt: skip
        (said,) = [a for a in result.assumptions if a.startswith("MFU counts")]
        assert words in said, said


def test_tp_across_hosts_of_an_nvlink_domain_is_not_said_to_cross_the_network() -> None:
    """tp 8 on trays of 4 in an NVL72 rack (the network stated at NVLink's 900 GB/s) was said to "cross
    the network"; it stays on NVLink and loses Transformer Engine's TP overlap (a rack-scale review). On
    NICs it crosses the network."""
    from service.catalog.models import model
    from service.catalog.tuning import default_tuning
    from service.estimator.estimate import estimate
    from service.estimator.types import Framework, Layout, Recompute, TrainingSpec

    b200 = gpu("b200-sxm-180gb")
    spec, training = model("llama-3.1-8b").spec, TrainingSpec(seq_len=4096, global_batch_size=16)
    layout = Layout(framework=Framework.MEGATRON, tp=8, dp=1, zero_stage=1, recompute=Recompute.SELECTIVE,
                    sequence_parallel=True)  # fmt: skip
    for network, said in (
        (900e9, "cross hosts over the stated inter-node link"),
        (50e9, "cross the network"),
    ):
        trays = dataclasses.replace(gpu_cluster(b200, 8, network), gpus_per_node=4, num_nodes=2)
        warned = estimate(spec, trays, layout, training, tuning=default_tuning(), with_limits=False).warnings
        assert any(w.startswith("tp (8) > GPUs per node (4)") and said in w for w in warned), warned


def test_a_shortfall_the_figures_round_away_says_by_how_much() -> None:
    # "80.00 GiB needed per GPU, 80.00 GiB available" beside "does not fit" for 2.7 MiB (units review)
    over = int(2.7 * 2**20)
    tight = MemoryBreakdown(
        parameters=80 * 2**30 + over, gradients=0, optimizer_states=0, activations=0, buffers=0,
        fragmentation=0, cuda_context=0, nccl_buffers=0,
    )  # fmt: skip
    memory = MemoryEstimate(
        per_gpu=tight, capacity_bytes=80 * 2**30, cpu_per_node_bytes=0, nvme_per_node_bytes=0
    )
    said = warnings_for(memory, gpu_cluster(gpu("h100-sxm-80gb"), 8, 50e9), Layout())
    assert said[0] == "does not fit: 80.00 GiB needed per GPU, 80.00 GiB available (2.7 MiB over)"
    far = dataclasses.replace(memory, capacity_bytes=64 * 2**30)
    assert warnings_for(far, gpu_cluster(gpu("h100-sxm-80gb"), 8, 50e9), Layout())[0] == (
        "does not fit: 80.00 GiB needed per GPU, 64.00 GiB available"
    )


def test_a_lora_estimate_says_its_adapters_dropout_is_off() -> None:
    # peft's lora_dropout > 0 keeps a dropout output and mask per adapted input (PEFT's examples 0.1):
    # the estimate counts none, as its launch files set 0, and now says so (fine-tuning tables review)
    spec = preset("llama-3.1-8b").spec
    lora = TrainingSpec(seq_len=2048, global_batch_size=2, method=Method.LORA)
    cluster = gpu_cluster(gpu("h100-sxm-80gb"), 1, 50e9)
    fsdp = Layout(framework=Framework.FSDP)
    said = estimate(spec, cluster, fsdp, lora, tuning=default_tuning()).assumptions
    assert any(note.startswith("LoRA dropout 0") for note in said)
    full = dataclasses.replace(lora, method=Method.FULL)
    said = estimate(spec, cluster, fsdp, full, tuning=default_tuning()).assumptions
    assert not any(note.startswith("LoRA dropout") for note in said)
