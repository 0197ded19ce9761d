"""Every claim a recommendation's rationale makes about its layout matches the layout's fields: a
property checked over plans of many shapes (one GPU to hundreds, dense and MoE, offload, idle GPUs)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator.types import ClusterSpec, Framework, Layout, Method, Offload, Precision, TrainingSpec
from service.recommender import Candidate, Constraints, Objective, recommend
from tests.recommender.helpers import cluster

ONE_H100_WITH_HOST_RAM = cluster("h100-sxm-80gb", 1, per_node=1, host_gib=512)
QLORA = TrainingSpec(seq_len=2048, global_batch_size=16, method=Method.QLORA)
JOBS = [
    ("gpt2", cluster("a100-sxm-80gb", 1, per_node=1), TrainingSpec(seq_len=1024, global_batch_size=16)),
    ("llama-3.1-8b", ONE_H100_WITH_HOST_RAM, TrainingSpec(seq_len=2048, global_batch_size=8)),
    ("llama-3.1-8b", cluster("h100-sxm-80gb", 1), TrainingSpec(seq_len=8192, global_batch_size=128)),
    ("llama-3-8b", cluster("rtx-4090-24gb", 1, per_node=1), QLORA),
    ("qwen3-14b", cluster("h100-sxm-80gb", 2), TrainingSpec(seq_len=4096, global_batch_size=64)),
    ("llama-3.1-70b", cluster("h100-sxm-80gb", 4), TrainingSpec(seq_len=8192, global_batch_size=256)),
    ("mixtral-8x7b", cluster("h100-sxm-80gb", 4), TrainingSpec(seq_len=4096, global_batch_size=256)),
    ("qwen3-30b-a3b", cluster("h100-sxm-80gb", 2), TrainingSpec(seq_len=4096, global_batch_size=128)),
    ("llama-2-70b", cluster("a100-sxm-80gb", 16), TrainingSpec(seq_len=4096, global_batch_size=512)),
    # GPT-2 on 384 GPUs with a prime global batch (dp 1) and an odd sequence (no CP): at most tp 4 x pp 12
    # GPUs: fewer GPUs, and the rationale says why
    ("gpt2", cluster("a100-sxm-80gb", 48), TrainingSpec(seq_len=1023, global_batch_size=997)),
]  # fmt: skip


def _spans(size: int, stride: int, per_node: int, world: int) -> bool:
    # ranks fill nodes in order: some group of ranks start + k x stride has members on two nodes
    # (groups start at j + b x size x stride, j < stride, within the world)
    span = size * stride
    starts = (j + b * span for b in range(max(1, world // span)) for j in range(stride))
    return size > 1 and any(s // per_node != (s + (size - 1) * stride) // per_node for s in starts)


def check_claims(candidate: Candidate, c: ClusterSpec) -> None:
    lo: Layout = candidate.layout
    lines = candidate.rationale
    text = "\n".join(lines)
    used = re.search(r"uses (all )?(\d+)( of (\d+))? GPUs", text)
    if "uses its one GPU" in text:
        assert c.world_size == lo.world_size == 1
    else:
        assert used is not None, text
        assert int(used.group(2)) == (c.world_size if used.group(1) else lo.world_size)
        if used.group(1):
            assert lo.world_size == c.world_size
        else:
            assert int(used.group(2)) == lo.world_size < c.world_size and int(used.group(4)) == c.world_size
    # the largest micro-batch it names is one the plan's headroom allows: at least the chosen one
    # ("the largest the global batch allows, N, fits": the batch, not memory, bounds it)
    largest = re.search(
        r"(?:largest that fits(?: within the plan's headroom)?: |the largest the global batch allows, )(\d+)",
        text,
    )
    assert largest is not None and int(largest.group(1)) >= lo.micro_batch_size, text
    tp_line = next(line for line in lines if line.startswith("TP="))
    assert tp_line.startswith(f"TP={lo.tp}")
    if lo.tp > 1:
        assert ("ACROSS nodes" in tp_line) == _spans(lo.tp, 1, c.gpus_per_node, c.world_size)
        assert tp_line.endswith("sequence parallel on" if lo.sequence_parallel else "sequence parallel off")
    pp_line = next(line for line in lines if line.startswith("PP="))
    assert pp_line.startswith(f"PP={lo.pp}")
    if lo.pp > 1:
        stride = lo.tp * lo.cp * lo.dp
        assert ("across nodes" in pp_line) == _spans(lo.pp, stride, c.gpus_per_node, c.world_size)
        assert f"v={lo.virtual_pipeline_stages}" in pp_line
    assert any(line.startswith(f"CP={lo.cp} ") for line in lines) == (lo.cp > 1)
    assert any(line.startswith(f"EP={lo.ep} ") for line in lines) == (lo.ep > 1)
    if lo.ep > 1:
        ep_line = next(line for line in lines if line.startswith("EP="))
        assert ("across nodes" in ep_line) == _spans(lo.ep, lo.expert_tp, c.gpus_per_node, c.world_size)
        assert ("each expert whole (etp=1" in ep_line) == (lo.etp == 1)
        assert ("--overlap-moe-expert-parallel-comm" in ep_line) == lo.moe_a2a_overlap
    for what, device in (("optimizer", lo.offload_optimizer), ("parameters", lo.offload_params)):
        assert (f"{what} offloaded to" in text) == (device is not Offload.NONE)
    if lo.zero_stage:
        assert f"ZeRO-{lo.zero_stage}" in text or "FSDP" in text or "distributed optimizer" in text
    else:
        assert "no ZeRO sharding" in text
    assert f"micro-batch {lo.micro_batch_size} " in text
    assert f"recompute {lo.recompute.value}" in text


@pytest.mark.parametrize(("name", "c", "training"), JOBS, ids=[f"{j[0]}-{j[1].world_size}" for j in JOBS])
def test_every_rationale_claim_matches_the_layout(name: str, c: ClusterSpec, training: TrainingSpec) -> None:
    found = recommend(model(name).spec, c, training, Constraints(top_k=3), default_tuning())
    assert found.recommended is not None, [r.reason for r in found.rejected[:3]]
    check_claims(found.recommended, c)


def test_idle_gpus_are_explained() -> None:
    name, c, training = JOBS[-1]
    found = recommend(model(name).spec, c, training, Constraints(top_k=1), default_tuning())
    assert found.recommended is not None
    used = found.recommended.layout.world_size
    assert used < c.world_size
    line = next(line for line in found.recommended.rationale if line.startswith("uses "))
    assert f"no valid split of {c.world_size} GPUs" in line or f"of {c.world_size} GPUs (" in line
    fewest = recommend(
        model(name).spec, c, training, Constraints(objective=Objective.FEWEST_GPUS), default_tuning()
    )
    assert fewest.recommended is not None
    assert any("prefers fewer" in line for line in fewest.recommended.rationale)
    # cost: the fewest GPU-hours per token, not the fewest GPUs (FinOps review)
    cheapest = recommend(
        model(name).spec,
        c,
        training,
        Constraints(objective=Objective.COST, gpu_hour_cost=2.0),
        default_tuning(),
    )
    assert cheapest.recommended is not None
    lines = [line for line in cheapest.recommended.rationale if line.startswith("uses ")]
    assert all("prefers fewer" not in line for line in lines)
    if cheapest.recommended.layout.world_size < c.world_size:
        assert any("GPU-hours per token" in line for line in lines), lines


def test_a_layout_line_names_megatrons_recompute_modules() -> None:
    from service.estimator.types import Framework, Recompute, RecomputeModule
    from service.recommender.rank import describe

    modules = (RecomputeModule.CORE_ATTN, RecomputeModule.MLP)
    layout = Layout(framework=Framework.MEGATRON, recompute=Recompute.SELECTIVE, recompute_modules=modules)
    assert "recompute=selective (core_attn, mlp)" in describe(layout)
    assert "recompute=selective " in describe(
        Layout(framework=Framework.MEGATRON, recompute=Recompute.SELECTIVE)
    )


def test_the_largest_micro_batch_named_is_within_the_plans_headroom() -> None:
    """A review's case: Llama 3.1 8B QLoRA on one RTX 4090 said "micro-batch 2 (largest that fits: 4)"
    where micro-batch 4 needs 23.0 GiB, over the 22.8 GiB its 5% headroom allows (the estimate's limit
    is against the whole card)."""
    qlora = TrainingSpec(seq_len=2048, global_batch_size=8, method=Method.QLORA)
    one_4090 = cluster("rtx-4090-24gb", 1, per_node=1)
    plan = recommend(model("llama-3.1-8b").spec, one_4090, qlora, Constraints(), default_tuning())
    assert plan.recommended is not None
    best = plan.recommended
    assert best.estimate.max_micro_batch_size == 4 and best.layout.micro_batch_size == 2
    assert any("(largest that fits within the plan's headroom: 2)" in line for line in best.rationale), (
        best.rationale
    )
    assert "uses its one GPU" in best.rationale


def test_a_cost_plan_is_the_cheapest_on_any_size_of_cluster_and_compared_in_gpu_hours() -> None:
    """Objective cost searched four counts sampled at a fixed stride above the fewest that fit: a
    15T-token Llama 3.1 70B run on 7 nodes of H100 answered 48 GPUs where the cluster's own 56 cost
    $45k less, and the answer moved with the cluster's size; its rationale then said it "ties with the
    next within 0.5% of tokens/s" beside a runner-up twice as fast on twice the GPUs (cost review).
    Every larger count is searched, the same cheapest layout comes back from 7, 8 and 16 nodes, and
    the runner-up on another count is compared in GPU-hours per token."""
    spec = model("llama-3.1-70b").spec
    training = TrainingSpec(seq_len=8192, global_batch_size=1024, tokens=15 * 10**12)
    constraints = Constraints(objective=Objective.COST, gpu_hour_cost=2.5, top_k=3)
    answers = []
    for nodes in (7, 8, 16):
        rec = recommend(spec, cluster(nodes=nodes), training, constraints, default_tuning())
        assert rec.recommended is not None and not rec.search.truncated
        answers.append((rec.recommended.layout, rec.recommended.score))
        shown = [rec.recommended, *rec.alternatives]
        assert rec.recommended.score <= min(c.score for c in shown) * (1 + 0.01)  # the near-tie rule's 1%
    assert len(set(answers)) == 1, answers
    # 6 nodes since Megatron's distributed optimizer runs precision-aware (a 2-byte master, no fp32
    # copy of the grads): tp 4 x pp 3 x cp 2 x dp 2 fits, on every size of cluster
    assert answers[0][0].world_size == 48
    # the 8B on 8 nodes: its runner-up is on twice the GPUs, compared on cost, not tokens/s
    small = recommend(
        model("llama-3.1-8b").spec,
        cluster(nodes=8),
        TrainingSpec(seq_len=8192, global_batch_size=512, tokens=10**12),
        constraints,
        default_tuning(),
    )
    assert small.recommended is not None and small.alternatives
    assert small.alternatives[0].layout.world_size != small.recommended.layout.world_size
    compared = small.recommended.rationale[2]
    assert "GPU-hours per million tokens against" in compared and "of tokens/s" not in compared, compared


def test_tp_inside_part_of_one_node_does_not_name_the_parts_size_as_the_nodes() -> None:
    """A 2-GPU layout on nodes of 8 said "TP=2 inside the node (2 GPUs per node)": its sub-cluster is
    as large as itself (cost review)."""
    rec = recommend(
        model("llama-3.1-8b").spec,
        cluster(nodes=8),
        TrainingSpec(seq_len=8192, global_batch_size=512),
        # (Megatron: FSDP's fewest GPUs split the sequence, cp 2 at tp 1)
        Constraints(objective=Objective.FEWEST_GPUS, frameworks=(Framework.MEGATRON,)),
        default_tuning(),
    )
    assert rec.recommended is not None and rec.recommended.layout.world_size < 8
    assert rec.recommended.layout.tp > 1  # the line under test is the TP > 1 one
    (tp_line,) = [line for line in rec.recommended.rationale if line.startswith("TP=")]
    assert "GPUs per node" not in tp_line, tp_line


def test_a_cost_score_is_the_price_times_the_gpu_hours_a_free_price_too() -> None:
    """gpu_hour_cost 0 scored the GPU-hours per million tokens, as if no price were given, where the
    OpenAPI document says price x GPU-hours (cost review)."""
    from service.recommender import rank

    free = Constraints(objective=Objective.COST, gpu_hour_cost=0.0)
    unpriced = Constraints(objective=Objective.COST)
    priced = Constraints(objective=Objective.COST, gpu_hour_cost=2.5)
    gpu_hours_per_million = 8 / 1000.0 * 1e6 / 3600
    assert rank.score(free, 8, 1000.0, TrainingSpec(seq_len=4096, global_batch_size=8)) == 0.0
    assert rank.score(unpriced, 8, 1000.0, TrainingSpec(seq_len=4096, global_batch_size=8)) == pytest.approx(
        gpu_hours_per_million
    )
    assert rank.score(priced, 8, 1000.0, TrainingSpec(seq_len=4096, global_batch_size=8)) == pytest.approx(
        2.5 * gpu_hours_per_million
    )


@pytest.mark.parametrize(
    ("objective", "terms"),
    [
        (Objective.THROUGHPUT, ""),
        (Objective.COST, " (1.0% fewer GPU-hours per token)"),
        (Objective.TIME_TO_TRAIN, " (1.0% less time to train)"),
    ],
)
def test_a_near_tie_is_said_in_the_objectives_terms(objective: Objective, terms: str) -> None:
    """The 1% near-tie rule recommends the simpler layout over one 0.8% faster: under objective cost or
    time to train, that 0.8% is as much cost or time (45 days of a 15T-token run), which the line said
    in tokens/s alone (cost review)."""
    import dataclasses

    from service.estimator.estimate import estimate
    from service.recommender import rank

    spec, c = model("llama-3.1-8b").spec, cluster()
    training = TrainingSpec(seq_len=8192, global_batch_size=128)
    simple = Layout(framework=Framework.MEGATRON, dp=8, zero_stage=1)
    split = Layout(framework=Framework.MEGATRON, dp=4, tp=2, zero_stage=1)
    est = estimate(spec, c, simple, training, tuning=default_tuning())
    assert est.time is not None
    faster = dataclasses.replace(
        # 0.96% faster: 1 - 1 / 1.0096 = 0.951% fewer GPU-hours and less time (a formula that gave
        # 0.942%, "0.9%", for them was caught by a review of this stop)
        est,
        time=dataclasses.replace(est.time, tokens_per_s=est.time.tokens_per_s * 1.0096),
    )
    lines = rank.rationale(simple, est, c, (split, faster), False, "uses all 8 GPUs", objective=objective)
    assert lines[2].startswith(f"the next ({rank.describe(split)}) is 1.0% faster{terms}: a gain under 1%"), (
        lines[2]
    )


def test_a_distributed_optimizer_on_one_rank_says_what_it_shards_and_keeps() -> None:
    """At dp x cp = 1 the distributed optimizer shards no dense state, but the experts' over their own
    data parallelism (tp x dp x cp / (etp x ep) = 4 here): "sharding nothing" contradicted the
    estimate's own optimizer states (Megatron review)."""
    from service.recommender.rank import _sharding_words

    bf16 = TrainingSpec(seq_len=4096, global_batch_size=64)
    moe = Layout(framework=Framework.MEGATRON, dp=1, tp=8, ep=2, etp=1, zero_stage=1)
    words = _sharding_words(moe, cluster(nodes=1), bf16)
    assert words.startswith("distributed optimizer on one data-parallel rank, dense states unsharded")
    assert "the experts' over their data parallelism, 4" in words and "a 2-byte master" in words
    dense = Layout(framework=Framework.MEGATRON, dp=1, tp=8, zero_stage=1)
    assert "sharding nothing" in _sharding_words(dense, cluster(nodes=1), bf16)
    fp16 = dataclasses.replace(bf16, precision=Precision.FP16)
    assert "precision-aware" not in _sharding_words(dense, cluster(nodes=1), fp16)  # Megatron's own


def test_the_rationale_says_which_link_the_data_parallel_group_crosses() -> None:
    """TP's, CP's, EP's and PP's lines said where they run; DP's reductions (a 16-rank reduce-scatter over
    a 3.125 GB/s network) went unnamed (network review)."""
    from service.catalog.gpus import gpu
    from service.estimator.estimate import estimate
    from service.estimator.types import Recompute
    from service.recommender import rank
    from validation.cases import gpu_cluster

    c = gpu_cluster(gpu("a100-sxm-40gb"), 32, 3.125e9)
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    layout = Layout(framework=Framework.DEEPSPEED, dp=16, tp=2, zero_stage=1, recompute=Recompute.FULL)
    answer = estimate(model("llama-2-7b").spec, c, layout, training, tuning=default_tuning())
    lines = rank.rationale(layout, answer, c, None, True, "uses all 32 GPUs", training=training)
    assert any(line.startswith("DP=16 across nodes, over the network (3.125 GB/s per GPU)") for line in lines)
    one = gpu_cluster(gpu("a100-sxm-40gb"), 8, 3.125e9)
    eight = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=1)
    answer = estimate(model("llama-3.2-1b").spec, one, eight, training, tuning=default_tuning())
    lines = rank.rationale(eight, answer, one, None, True, "uses all 8 GPUs", training=training)
    assert any(line.startswith("DP=8 inside the node") for line in lines)


# ---------------------------------------------------------------- what an infeasible plan says


def test_the_best_offload_beside_a_suggestion_is_named_by_the_objective() -> None:
    # cost picks the cheapest offload per token, which "the fastest offload, 2,552 tokens/s" named
    # beside a 4,734 tokens/s suggestion (rationale review)
    from service.recommender.suggest import BEST_OFFLOAD_WORDS

    assert set(BEST_OFFLOAD_WORDS) == set(Objective)
    spec = model("mixtral-8x7b").spec
    training = TrainingSpec(seq_len=4096, global_batch_size=64, tokens=10**9)
    constraints = Constraints(objective=Objective.COST, gpu_hour_cost=1.2, frameworks=(Framework.DEEPSPEED,))
    result = recommend(spec, cluster("a100-sxm-40gb"), training, constraints, default_tuning())
    assert result.recommended is None
    offloads = [s.detail for s in result.suggestions if s.kind == "offload" and "(the " in s.detail]
    assert offloads, [s.detail for s in result.suggestions]
    assert all("the cheapest offload per token" in d and "the fastest offload" not in d for d in offloads)


def test_a_qlora_suggestion_says_it_drops_torch_compile() -> None:
    # bitsandbytes' NF4 matmuls refuse compile (a 422 once applied): the suggestion searched without
    # it, and said nothing (rationale review)
    spec = model("llama-2-7b").spec
    training = TrainingSpec(seq_len=4096, global_batch_size=16)
    constraints = Constraints(objective=Objective.THROUGHPUT, allow_offload=False, torch_compile=True)
    result = recommend(spec, cluster("a100-sxm-40gb", per_node=2), training, constraints, default_tuning())
    (qlora,) = [s for s in result.suggestions if s.kind == "qlora"]
    assert "without torch.compile (constraints.torch_compile false" in qlora.detail
    (lora,) = [s for s in result.suggestions if s.kind == "lora"] or [None]
    assert lora is None or "without torch.compile" not in lora.detail


def test_the_closest_miss_of_a_framework_without_zero_3_shards_its_states() -> None:
    # the bound's layout of Megatron-LM (no ZeRO-3) was its plain data parallelism, every weight
    # replicated: 356.5 GiB "closest" where tp 8 needs 118 (rationale review)
    spec = model("llama-3-70b").spec
    training = TrainingSpec(seq_len=4096, global_batch_size=64, tokens=10**9)
    result = recommend(spec, cluster("a100-sxm-40gb"), training, Constraints(), default_tuning())
    assert result.recommended is None and result.closest is not None
    layout = result.closest.layout
    assert layout.tp * layout.pp == 8 or layout.zero_stage == 3, layout
    assert result.closest.estimate.memory.per_gpu.total < 160 * 2**30
