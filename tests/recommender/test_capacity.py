"""Capacity planning across GPU types and stored clusters."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from service.catalog.gpus import gpu
from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator.step_time import time_to_train_s
from service.estimator.types import ClusterSpec, Framework, Method, Precision, TrainingSpec
from service.recommender.capacity import capacity, default_cluster, option_order
from service.recommender.suggest import NVLINK_NODE_BYTES_PER_S, PCIE_NODE_BYTES_PER_S, with_gpu
from service.recommender.types import Constraints, Objective, SearchStats


def test_fewest_gpus_per_type_and_time_to_train() -> None:
    # Llama-3-8B, 4K tokens x 512: on 80 GB GPUs a couple of GPUs hold the states; on 24 GB, more
    training = TrainingSpec(seq_len=4096, global_batch_size=512, tokens=10**11)
    options = capacity(
        model("llama-3-8b").spec,
        training,
        default_tuning(),
        gpus=[gpu("h100-sxm-80gb"), gpu("rtx-4090-24gb")],
    )
    by_gpu = {o.gpu: o for o in options}
    h100, rtx = by_gpu["h100-sxm-80gb"], by_gpu["rtx-4090-24gb"]
    assert h100.fits and rtx.fits and h100.min_gpus and rtx.min_gpus
    assert h100.min_gpus <= rtx.min_gpus
    assert h100.tokens_per_s and h100.time_to_train_s
    # 10^11 tokens in steps of 512 x 4,096: 47,684 whole steps (47,683.7 rounded up)
    assert h100.time_to_train_s == pytest.approx(47_684 * 2_097_152 / h100.tokens_per_s, rel=1e-12)
    assert h100.gpu_hours == h100.time_to_train_s * (h100.num_gpus or 0) / 3600
    assert options[0].time_to_train_s == min(o.time_to_train_s or float("inf") for o in options)


def test_stored_cluster_runs_at_its_size() -> None:
    training = TrainingSpec(seq_len=2048, global_batch_size=256, tokens=10**10)
    stored = ClusterSpec(
        gpu=gpu("a100-sxm-80gb"),
        num_nodes=2,
        gpus_per_node=8,
        intra_node_bandwidth_bytes_per_s=300e9,
        inter_node_bandwidth_bytes_per_s=25e9,
    )
    (option,) = capacity(model("llama-2-7b").spec, training, default_tuning(), clusters=[stored])
    assert option.fits and option.min_gpus is not None and option.min_gpus <= 16
    assert option.num_gpus == 16  # time to train on the whole stored cluster
    assert option.time_to_train_s is not None and option.time_to_train_s > 0


def _stored_a100_cluster() -> ClusterSpec:
    return ClusterSpec(
        gpu=gpu("a100-sxm-80gb"),
        num_nodes=2,
        gpus_per_node=8,
        intra_node_bandwidth_bytes_per_s=300e9,
        inter_node_bandwidth_bytes_per_s=25e9,
    )


def test_stored_cluster_does_not_grow_past_its_size() -> None:
    # at_gpus=64 on a 16-GPU stored cluster: timed on the 16 GPUs it has, and the option says so
    training = TrainingSpec(seq_len=2048, global_batch_size=256, tokens=10**10)
    stored = _stored_a100_cluster()
    (option,) = capacity(model("llama-2-7b").spec, training, default_tuning(), clusters=[stored], at_gpus=64)
    assert option.fits and option.layout is not None and option.num_gpus is not None
    assert option.num_gpus <= stored.world_size
    assert option.layout.world_size == option.num_gpus
    assert "64" in option.note and "16" in option.note
    (whole,) = capacity(model("llama-2-7b").spec, training, default_tuning(), clusters=[stored])
    # a TrainingSpec built without an attention leaves it to the GPU, and the option names it
    assert whole.note == "defaults for this GPU: training.attention flash"
    assert (option.num_gpus, option.tokens_per_s) == (whole.num_gpus, whole.tokens_per_s)


def test_no_layout_at_requested_gpus_keeps_one_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    # when nothing is found on at_gpus, the GPU count, throughput and GPU-hours all come from the
    # min_gpus layout instead of mixing at_gpus with the min_gpus throughput
    import service.recommender

    monkeypatch.setattr(
        service.recommender,
        "recommend",
        lambda *args, **kwargs: SimpleNamespace(
            recommended=None, search=SearchStats(candidates_evaluated=0, duration_s=0.0, truncated=False)
        ),
    )
    training = TrainingSpec(seq_len=4096, global_batch_size=512, tokens=10**11)
    (option,) = capacity(
        model("llama-3-8b").spec,
        training,
        default_tuning(),
        gpus=[gpu("h100-sxm-80gb")],
        at_gpus=1024,
    )
    assert option.fits and option.layout is not None and option.tokens_per_s is not None
    assert option.num_gpus == option.layout.world_size == option.min_gpus
    assert option.time_to_train_s == time_to_train_s(10**11, training.tokens_per_step, option.tokens_per_s)
    assert option.gpu_hours == option.time_to_train_s * option.num_gpus / 3600
    assert "1024" in option.note


def test_the_request_shares_one_evaluation_budget_and_says_where_it_ran_out() -> None:
    """Capacity across GPU types searches within Constraints.max_evaluations in all, as one plan
    does: each type gets an equal share of what is left; a type whose share ran out says so."""
    training = TrainingSpec(seq_len=4096, global_batch_size=512, tokens=10**11)
    types = [gpu("h200-sxm-141gb"), gpu("a100-sxm-40gb"), gpu("l40s-48gb")]
    # (a 70B's H200 option now evaluates more than the others: Megatron's fp32 copy of its bf16 main
    # grads at the step rules its plain data-parallel layouts out on the fewest H200s)
    llama = model("llama-2-13b").spec
    full = capacity(llama, training, default_tuning(), gpus=types)
    assert all(o.fits and not o.truncated and o.evaluations > 0 for o in full)
    by_source = sorted(full, key=lambda o: o.source)
    # the first type's share (a third of the budget) suffices; the others' do not
    budget = 3 * by_source[0].evaluations + 30
    assert by_source[1].evaluations > by_source[0].evaluations + 30
    tight = sorted(
        capacity(
            llama,
            training,
            default_tuning(),
            gpus=types,
            constraints=Constraints(objective=Objective.FEWEST_GPUS, max_evaluations=budget),
        ),
        key=lambda o: o.source,
    )
    # the budget is checked between families: the family that crosses it finishes (its recompute
    # modes' first size, bisection and timed sizes), a few evaluations over, once per type
    assert sum(o.evaluations for o in tight) <= budget + 16 * len(types)
    assert not tight[0].truncated and (tight[0].min_gpus, tight[0].layout) == (
        by_source[0].min_gpus,
        by_source[0].layout,
    )
    assert tight[1].truncated and tight[2].truncated
    assert all("evaluation budget" in o.note for o in tight[1:])
    # cut before a fit: unknown, not "does not fit" (told false, a client took the A100s and L40Ss for
    # parts that cannot run a job they run; hostile review); sorted after the fits
    starved = capacity(
        model("llama-2-70b").spec,
        training,
        default_tuning(),
        gpus=types,
        constraints=Constraints(objective=Objective.FEWEST_GPUS, max_evaluations=5),
    )
    unfinished = [o for o in starved if o.min_gpus is None]
    assert unfinished and all(o.fits is None and o.truncated for o in unfinished)
    assert [o.fits for o in sorted(starved, key=option_order)][-len(unfinished) :] == [None] * len(unfinished)


def test_a_gpu_type_is_searched_up_to_max_nodes() -> None:
    """Found by bench/fuzz_probe.py: the GPU-count ladder stopped at 64 nodes whatever max_nodes
    said, so Llama 3.1 405B on 16 GB V100s, which a 1,024-GPU plan fits, was answered "no layout fits
    up to 512 GPUs" under the API's default of 1,024 nodes. (The FSDP layouts with TP and sequence
    parallelism that fitted then no launcher runs at fp16; DeepSpeed ZeRO-3 with Ulysses over 16 ranks,
    which Accelerate's ALST runs, fits on 2,048 GPUs: past 64 nodes, where the ladder used to stop.)"""
    training = TrainingSpec(seq_len=4096, global_batch_size=2048, precision=Precision.FP16)
    (option,) = capacity(
        model("llama-3.1-405b").spec, training, default_tuning(), gpus=[gpu("v100-sxm2-16gb")], max_nodes=1024
    )
    assert option.fits and option.min_gpus is not None and option.min_gpus > 512, option
    layout = option.layout
    assert layout is not None and layout.cp > 1 and layout.framework is Framework.DEEPSPEED
    # and max_nodes is still the top: the same job on at most 64 nodes does not fit
    (capped,) = capacity(
        model("llama-3.1-405b").spec, training, default_tuning(), gpus=[gpu("v100-sxm2-16gb")], max_nodes=64
    )
    assert not capped.fits and "512 GPUs" in capped.note


def test_a_stored_cluster_is_searched_up_to_its_size() -> None:
    """The same ladder capped a stored cluster at 64 nodes: a 128-node V100 cluster that holds the
    job whole was said not to fit it (it does not now, for the reason above: searched to its 1,024)."""
    stored = ClusterSpec(
        gpu=gpu("v100-sxm2-16gb"),
        num_nodes=128,
        gpus_per_node=8,
        intra_node_bandwidth_bytes_per_s=150e9,
        inter_node_bandwidth_bytes_per_s=25e9,
    )
    training = TrainingSpec(seq_len=4096, global_batch_size=2048, precision=Precision.FP16)
    (option,) = capacity(model("llama-3.1-405b").spec, training, default_tuning(), clusters=[stored])
    assert not option.fits and "1024 GPUs" in option.note, option.note


def test_the_node_ladder_is_the_counts_it_names_up_to_its_caps() -> None:
    """The ladder is generated (each count to 16, then 2^a 3^b) rather than scanned for: a
    100,000-node cluster's more_gpus ladder scanned 6.4M node counts (a second of CPU, before any
    budget could stop it) to keep none of them past MAX_SUGGESTED_GPUS."""
    from service.recommender.suggest import MAX_SUGGESTED_GPUS, node_ladder

    def smooth(k: int) -> bool:
        while k % 2 == 0:
            k //= 2
        while k % 3 == 0:
            k //= 3
        return k == 1

    for nodes, per_node, start in ((1, 8, 1), (3, 4, 4), (5, 1, 6), (40, 8, 41)):
        cluster = _h100s(nodes, per_node)
        top = max(start, nodes) * 64
        wanted = [k * per_node for k in range(start, top + 1) if k <= 16 or smooth(k)]
        assert list(node_ladder(cluster, start)) == wanted
        capped = [n for n in wanted if n <= MAX_SUGGESTED_GPUS // 64]
        assert list(node_ladder(cluster, start, max_gpus=MAX_SUGGESTED_GPUS // 64)) == capped
    huge = _h100s(100_000, 1)
    assert node_ladder(huge, 100_001, max_gpus=MAX_SUGGESTED_GPUS) == ()
    # an explicit top is itself a count (a stored cluster's size, a capacity request's max_nodes)
    assert node_ladder(huge, 1, top_nodes=100)[-2:] == (96, 100)


def _h100s(nodes: int, per_node: int) -> ClusterSpec:
    return ClusterSpec(
        gpu=gpu("h100-sxm-80gb"),
        num_nodes=nodes,
        gpus_per_node=per_node,
        intra_node_bandwidth_bytes_per_s=450e9,
        inter_node_bandwidth_bytes_per_s=50e9,
    )


def test_counts_no_split_of_the_job_uses_are_not_searched(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by bench/fuzz_probe.py: capacity for QLoRA of Llama 3.1 405B at global batch 1 with
    max_nodes 100,000 searched each of ~2,000 GPU counts per GPU type (1.1 s of CPU) to reject every
    split of each: QLoRA splits no weight over tp or pp and batch 1 leaves dp 1, so no split uses more
    than cp's 32 GPUs. fewest_gpus skips the counts past space.largest_world before the search."""
    import service.recommender as recommender

    searched: list[int] = []
    real = recommender.search

    def recording(*args: object, **kwargs: object) -> object:
        searched.extend(args[5])  # type: ignore[arg-type]  # the counts
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(recommender, "search", recording)
    training = TrainingSpec(seq_len=4096, global_batch_size=1, method=Method.QLORA)
    (option,) = capacity(
        model("llama-3.1-405b").spec,
        training,
        default_tuning(),
        gpus=[gpu("h100-sxm-80gb")],
        max_nodes=100_000,
    )
    assert not option.fits
    assert searched and max(searched) <= 32, max(searched)


@pytest.mark.parametrize("method", [Method.FULL, Method.QLORA])
@pytest.mark.parametrize(("seq_len", "batch"), [(8, 2), (1, 3), (64, 1)])
def test_no_split_uses_more_gpus_than_the_largest_world(method: Method, seq_len: int, batch: int) -> None:
    """largest_world is a bound: every split ``structures`` yields fits under it."""
    from service.recommender.space import RejectionLog, largest_world, structures

    spec = model("gpt2").spec
    training = TrainingSpec(seq_len=seq_len, global_batch_size=batch, method=method)
    node = _h100s(1, 2)
    largest = largest_world(spec, node, training)
    used = [
        n
        for n in range(1, 4 * largest + 64)
        if next(structures(spec, node, training, n, RejectionLog()), None)
    ]
    assert used and max(used) <= largest


def test_at_gpus_past_what_the_job_uses_says_so() -> None:
    """Found by bench/fuzz_probe.py: at_gpus 1,000,000 for Llama 3 8B at global batch 64 was
    answered num_gpus 524,288 (the fastest layout on the million uses no more) with nothing to say
    why the count differs from the one asked; the stored cluster's clamp says so, and this does too."""
    training = TrainingSpec(seq_len=4096, global_batch_size=64, tokens=10**11)
    (option,) = capacity(
        model("llama-3-8b").spec, training, default_tuning(), gpus=[gpu("h100-sxm-80gb")], at_gpus=10**6
    )
    assert option.fits and option.num_gpus is not None and option.layout is not None
    assert option.num_gpus == option.layout.world_size < 10**6
    assert "1,000,000" in option.note and f"{option.num_gpus:,}" in option.note
    assert option.gpu_hours == option.time_to_train_s * option.num_gpus / 3600  # type: ignore[operator]


def test_more_nodes_have_the_reference_network_of_the_gpu_they_run() -> None:
    """A job placed on more nodes than asked (capacity's nodes, a suggestion's) runs on its GPU's
    reference node's network (gpus.toml node_network_bytes_per_s: DGX A100 25 GB/s per GPU, DGX-1
    V100 6.25), not an H100 node's for every GPU; a GPU without one has a PCIe server's (a PCIe card)
    or the HGX H100 node's (a custom GPU with NVLink-class links)."""
    assert default_cluster(gpu("a100-sxm-80gb"), 4).inter_node_bandwidth_bytes_per_s == 25e9
    assert default_cluster(gpu("v100-sxm2-32gb"), 4).inter_node_bandwidth_bytes_per_s == 6.25e9
    assert default_cluster(gpu("l40s-48gb"), 4).inter_node_bandwidth_bytes_per_s == PCIE_NODE_BYTES_PER_S
    custom = dataclasses.replace(gpu("a100-sxm-80gb"), name="lab-a100", node_network_bytes_per_s=None)
    assert default_cluster(custom, 4).inter_node_bandwidth_bytes_per_s == NVLINK_NODE_BYTES_PER_S
    one_h100_node = default_cluster(gpu("h100-sxm-80gb"), 1)
    moved = with_gpu(one_h100_node, gpu("a100-sxm-80gb"), num_nodes=4)
    assert moved.inter_node_bandwidth_bytes_per_s == 25e9  # DGX A100 nodes, not the H100's network
    stated = dataclasses.replace(
        default_cluster(gpu("h100-sxm-80gb"), 2), inter_node_bandwidth_bytes_per_s=12.5e9
    )
    assert (
        with_gpu(stated, gpu("a100-sxm-80gb")).inter_node_bandwidth_bytes_per_s == 12.5e9
    )  # the cluster's own
    # an NVLink domain across nodes (a GB200 NVL72 rack stated as nodes of 4 at 900 GB/s) is its own
    # GPU's fabric: another GPU's nodes have their own network (MI300X nodes were offered "900 GB/s
    # per GPU between nodes": a rack-scale review); the same GPU keeps it
    rack = dataclasses.replace(
        default_cluster(gpu("b200-sxm-180gb"), 2, 4), inter_node_bandwidth_bytes_per_s=900e9
    )
    assert with_gpu(rack, gpu("mi300x-192gb"), 4, 8).inter_node_bandwidth_bytes_per_s == 50e9
    assert with_gpu(rack, rack.gpu, 4).inter_node_bandwidth_bytes_per_s == 900e9


T8 = TrainingSpec(seq_len=4096, global_batch_size=256, tokens=10**11)


def test_at_gpus_below_a_node_is_timed_on_those_gpus() -> None:
    """A review's case: at_gpus 4 of 8-GPU H100 nodes was timed on a whole node (79k tokens/s where
    four GPUs give 38k), with nothing said; a part of a node is what was asked."""
    spec, h100 = model("llama-3-8b").spec, gpu("h100-sxm-80gb")
    (four,) = capacity(spec, T8, default_tuning(), gpus=[h100], at_gpus=4)
    (node,) = capacity(spec, T8, default_tuning(), gpus=[h100], at_gpus=8)
    assert four.num_gpus == 4 and four.layout is not None and four.layout.world_size == 4
    assert node.num_gpus == 8 and four.tokens_per_s is not None and node.tokens_per_s is not None
    assert four.tokens_per_s < 0.6 * node.tokens_per_s


def test_at_gpus_between_nodes_and_past_max_nodes_say_what_was_timed() -> None:
    spec, h100 = model("llama-3-8b").spec, gpu("h100-sxm-80gb")
    (odd,) = capacity(spec, T8, default_tuning(), gpus=[h100], gpus_per_node=16, at_gpus=24)
    assert (
        odd.num_gpus == 16
        and "asked for 24 GPUs; past one node this option places whole nodes of 16" in odd.note
    )
    (past,) = capacity(spec, T8, default_tuning(), gpus=[h100], max_nodes=2, at_gpus=64)
    assert past.num_gpus is not None and past.num_gpus <= 16
    assert "asked for 64 GPUs; max_nodes 2 of 8 GPUs holds 16" in past.note


def test_the_capacity_climb_tries_every_divisor_of_a_node() -> None:
    """A review's case: on 12-GPU nodes the climb tried 1, 2, 4 and 12, and reported 12 for a job a
    plan fits on 6."""
    spec, part = model("mistral-small-24b").spec, gpu("h100-sxm-80gb")
    (twelve,) = capacity(spec, T8, default_tuning(), gpus=[part], gpus_per_node=12)
    (six,) = capacity(spec, T8, default_tuning(), gpus=[part], gpus_per_node=6)
    assert twelve.fits and six.fits and six.min_gpus is not None
    assert twelve.min_gpus == six.min_gpus < 12


def test_without_tokens_the_fastest_option_comes_first() -> None:
    training = dataclasses.replace(T8, tokens=None)
    parts = [gpu(n) for n in ("h100-sxm-500w-96gb", "h100-nvl-94gb", "h100-pcie-80gb", "h100-sxm-80gb")]
    options = capacity(model("llama-3-8b").spec, training, default_tuning(), gpus=parts)
    fitting = [o for o in options if o.fits]
    speeds = [(o.min_gpus, -(o.tokens_per_s or 0.0)) for o in fitting]
    assert len(fitting) == 4 and [o.tokens_per_s for o in fitting] == sorted(
        (o.tokens_per_s or 0.0 for o in fitting), reverse=True
    ), speeds


def test_a_part_without_a_reference_node_says_what_it_was_placed_in() -> None:
    """A review's case: a PCIe card's option was placed in 8-GPU nodes on a 100 Gb/s port per node
    (the fields said so; GET /v1/gpus has null for both); the note says it, as an inline cluster's
    defaults are said. A part with a reference node (in GET /v1/gpus) says nothing of it."""
    spec = model("llama-3.1-70b").spec
    training = TrainingSpec(seq_len=4096, global_batch_size=512, tokens=10**11)
    pcie, sxm = capacity(
        spec, training, default_tuning(), gpus=[gpu("h100-pcie-80gb"), gpu("h100-sxm-80gb")]
    )[::-1]
    by_gpu = {o.gpu: o for o in (pcie, sxm)}
    pcie, sxm = by_gpu["h100-pcie-80gb"], by_gpu["h100-sxm-80gb"]
    assert "nodes of 8 h100-pcie-80gb (its catalog entry has no reference node" in pcie.note
    assert "between nodes 1.5625 GB/s per GPU: a PCIe server's 100 Gb/s port per 8 GPUs" in pcie.note
    assert "nodes of" not in sxm.note and "between nodes" not in sxm.note
    (asked,) = capacity(spec, training, default_tuning(), gpus=[gpu("h100-pcie-80gb")], gpus_per_node=4)
    assert "nodes of" not in asked.note and "between nodes 1.5625" in asked.note


def test_a_custom_gpu_without_chip_says_its_efficiency_as_a_plan_does() -> None:
    spec = model("llama-3-8b").spec
    custom = dataclasses.replace(gpu("h100-sxm-80gb"), name="lab-h100", chip=None)
    (option,) = capacity(spec, T8, default_tuning(), gpus=[custom])
    assert option.fits and "custom GPU without chip: the most conservative fitted efficiency" in option.note
    (catalog,) = capacity(spec, T8, default_tuning(), gpus=[gpu("h100-sxm-80gb")])
    assert "without chip" not in catalog.note


# ---- the fewest GPUs between the ladder's steps, and fewer GPUs while they train faster (stop 44)


def test_the_fewest_gpus_are_found_between_the_ladders_node_counts() -> None:
    """Past 16 nodes the climb steps through 3-smooth node counts (16, 18, 24, ...): DeepSeek-V3 at
    batch 2048 answered 24 nodes where 21 fit, faster and cheaper (capacity-planner review). The
    whole-node counts between the last step that fits nothing and the first that fits are bisected.
    (Llama 3.1 405B on 40 GB A100s: DeepSeek-V3 on H100s fits on a step, 18 nodes, since Megatron's
    distributed optimizer runs precision-aware.)"""
    training = TrainingSpec(seq_len=1024, global_batch_size=2048, tokens=10**10)
    constraints = Constraints(objective=Objective.FEWEST_GPUS, allow_offload=False)
    (option,) = capacity(
        model("llama-3.1-405b").spec,
        training,
        default_tuning(),
        gpus=[gpu("a100-sxm-40gb")],
        constraints=constraints,
    )
    assert option.fits and option.min_gpus is not None
    assert option.min_gpus % 8 == 0 and option.min_gpus < 24 * 8
    # between two steps of the ladder (21 nodes)
    assert option.min_gpus // 8 not in (16, 18, 24, 27, 32)


def test_more_gpus_asked_never_time_slower_than_fewer_found_faster() -> None:
    """Qwen3-30B-A3B at batch 512 on 2,048 V100s was timed on dp 512 x tp 4 x ep 2, slower than the
    1,024-GPU answer's dp 512 x tp 2 x ep 4 (capacity-planner review): half the GPUs are searched
    where data parallelism is filled, and fewer again while each step trains faster."""
    training = TrainingSpec(
        seq_len=4096, global_batch_size=512, tokens=10**12, hardware_defaults=frozenset({"precision"})
    )
    spec, v100 = model("qwen3-30b-a3b").spec, gpu("v100-sxm2-32gb")
    at = {n: capacity(spec, training, default_tuning(), gpus=[v100], at_gpus=n)[0] for n in (1024, 2048)}
    assert at[1024].fits and at[2048].fits
    assert (at[2048].tokens_per_s or 0) >= (at[1024].tokens_per_s or 0) * 0.999


@pytest.mark.parametrize(
    ("preset", "gpu_name", "seq", "batch"),
    [
        ("deepseek-v2-lite", "a10-24gb", 4096, 256),
        ("llama-3.1-70b", "a100-sxm-40gb", 8192, 512),
        ("mixtral-8x7b", "h100-sxm-80gb", 4096, 1024),
        ("llama-3-8b", "rtx-4090-24gb", 4096, 64),
        ("llama-3.1-405b", "a100-sxm-40gb", 4096, 1024),  # 208 GPUs: bisected between 192 and 256
    ],
)
def test_the_lean_first_climb_finds_what_a_first_fit_search_and_its_bisection_find(
    preset: str, gpu_name: str, seq: int, batch: int
) -> None:
    """Two methods, one answer: ``fewest_count`` stops its climb at the first count a lean layout
    fits, bisects below it and searches only the count found; a first-fit search of the ladder
    followed by ``first_fit_between`` searched the ladder's count in full first. Same layout, same
    tokens/s."""
    from service.recommender import Budget, fewest_count, first_fit_between, search
    from service.recommender.suggest import node_ladder

    spec, tuning = model(preset).spec, default_tuning()
    training = TrainingSpec(seq_len=seq, global_batch_size=batch)
    constraints = Constraints(objective=Objective.FEWEST_GPUS, allow_offload=False, top_k=1)
    cluster = default_cluster(gpu(gpu_name), 64)
    counts = (1, 2, 4, *node_ladder(with_gpu(cluster, cluster.gpu, 1), 1, top_nodes=64))
    lean = fewest_count(spec, cluster, training, constraints, tuning, counts, Budget(10**6))
    full = search(
        spec, cluster, training, constraints, tuning, counts, stop_at_first_fit=True, budget=Budget(10**6),
        rejections=False,
    )  # fmt: skip
    first_fit_between(spec, cluster, training, constraints, tuning, counts, full, Budget(10**6), False)
    ours, theirs = lean.ranked(Objective.FEWEST_GPUS), full.ranked(Objective.FEWEST_GPUS)
    assert ours and theirs
    assert (ours[0].layout, ours[0].tokens_per_s) == (theirs[0].layout, theirs[0].tokens_per_s)
    # never more work: at most the lean layout that fits, checked again by the search of its count
    assert lean.evaluations <= full.evaluations + 1


@pytest.mark.parametrize("evaluations", [11, 13])  # the bisection's probes spend them (late review)
def test_a_budget_the_bisection_spends_still_answers_the_lean_layout_that_fits(evaluations: int) -> None:
    """The lean-first climb had found a layout that fits when the bisection's probes spent the budget:
    the option answered "the budget ran out before a fit" where the former first-fit search, cut,
    timed that layout (a review of fewest_count). It is answered, marked truncated."""
    training = TrainingSpec(seq_len=4096, global_batch_size=1024, tokens=10**10)
    (option,) = capacity(
        model("llama-3.1-405b").spec,
        training,
        default_tuning(),
        gpus=[gpu("a100-sxm-40gb")],
        max_nodes=64,
        constraints=Constraints(
            objective=Objective.FEWEST_GPUS, allow_offload=False, max_evaluations=evaluations
        ),
    )
    assert option.fits and option.truncated and option.min_gpus is not None
    assert "cut this search" in option.note


@pytest.mark.parametrize(("seq_len", "batch"), [(1280, 320), (1344, 960)])
def test_the_fewest_gpus_of_a_data_parallel_job_are_a_count_its_batch_splits_over(
    seq_len: int, batch: int
) -> None:
    # QLoRA splits only over dp, so only counts dividing the batch hold a layout; past 16 nodes the
    # climb's 3-smooth steps (18, 24, 27, 32, 36 nodes) all missed 320 ('no layout fits'), and the
    # bisection between 18 and 24 probed 21, 22, 23 for 960 (24 answered where 20 fit): capacity review
    spec = model("llama-3.1-405b").spec
    training = TrainingSpec(seq_len=seq_len, global_batch_size=batch, method=Method.QLORA)
    (option,) = capacity(spec, training, default_tuning(), gpus=[gpu("l4-24gb")])
    assert option.fits and option.min_gpus == 160, option


def test_a_cap_inside_one_node_is_a_count_as_in_a_plan() -> None:
    """Qwen3-14B on A100-40GBs capped at 6 GPUs: a fewest-GPU plan fits 6 (tp 2 pp 3); capacity tried
    the node's divisors 1, 2 and 4 alone and said nothing fits (change review)."""
    training = TrainingSpec(seq_len=4096, global_batch_size=48)
    capped = Constraints(max_gpus=6)
    (option,) = capacity(model("qwen3-14b").spec, training, default_tuning(), gpus=[gpu("a100-sxm-40gb")],
                         max_nodes=1, constraints=capped)  # fmt: skip
    assert option.fits and option.min_gpus == 6
