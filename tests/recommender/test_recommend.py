"""Hand-checked recommendations, and properties every recommendation keeps."""

from __future__ import annotations

import dataclasses

import pytest

from service.catalog.gpus import gpu
from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator.estimate import estimate
from service.estimator.tuning import Tuning
from service.estimator.types import (
    ClusterSpec,
    Compile,
    Framework,
    Method,
    Plan,
    Precision,
    Recompute,
    TrainingSpec,
)
from service.estimator.validate import validate_layout
from service.launchers import Target, runnable_targets
from service.recommender import NO_LAUNCHER, Constraints, Objective, rank, recommend, suggest
from service.recommender.budget import Budget
from service.recommender.space import sub_cluster
from service.recommender.suggest import states_unfit, suggestions
from service.recommender.types import Recommendation
from tests.recommender.helpers import cluster


@pytest.fixture(scope="module")
def tuning() -> Tuning:
    return default_tuning()


def test_small_model_on_one_gpu_needs_no_parallelism(tuning: Tuning) -> None:
    # GPT-2 (124M): 16 bytes/param of states ~ 2 GB; one 80 GB GPU holds it with micro-batch 32
    result = recommend(
        model("gpt2").spec,
        cluster("h100-sxm-80gb", per_node=1),
        TrainingSpec(seq_len=1024, global_batch_size=32),
        Constraints(),
        tuning,
    )
    assert result.status == "feasible" and result.recommended is not None
    layout = result.recommended.layout
    assert (layout.dp, layout.tp, layout.pp, layout.cp) == (1, 1, 1, 1)
    # no sharding; Megatron's distributed optimizer on its one rank is the precision-aware one (its
    # step moves 26 B per parameter, not 36), which the rationale says rather than a sharding
    assert layout.zero_stage == 0 or layout.framework is Framework.MEGATRON
    if layout.zero_stage:
        assert "on one data-parallel rank, sharding nothing (precision-aware" in " ".join(
            result.recommended.rationale
        )
    assert layout.micro_batch_size == 32  # the whole batch in one micro-batch: no accumulation
    assert result.search.candidates_evaluated >= 1


def test_7b_on_eight_80gb_gpus_is_sensible(tuning: Tuning) -> None:
    c = cluster("h100-sxm-80gb")
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    result = recommend(model("llama-2-7b").spec, c, training, Constraints(), tuning)
    assert result.recommended is not None
    best = result.recommended
    assert best.layout.world_size == 8 and best.layout.pp == 1  # fits without a pipeline
    assert best.estimate.fits and best.estimate.memory.headroom_bytes >= 0.05 * c.gpu.memory_bytes
    assert best.estimate.time is not None and best.estimate.time.mfu > 0.3
    assert any("tokens/s" in line for line in best.rationale)
    assert any("headroom" in line for line in best.rationale)
    assert len(result.alternatives) == 2


def test_a_rejected_zero_stage_is_shown_with_that_stage(tuning: Tuning) -> None:
    """The rejection log's example of "megatron zero_stage 2: ..." had zero_stage 0: the
    example is the rejected sharding's own."""
    result = recommend(
        model("llama-2-7b").spec,
        cluster("h100-sxm-80gb"),
        TrainingSpec(seq_len=4096, global_batch_size=256),
        Constraints(),
        tuning,
    )
    stages = {
        r.reason: r.example.zero_stage
        for r in result.rejected
        if "does not support zero_stage" in r.reason or "is not modelled" in r.reason
    }
    megatron = "megatron zero_stage 2: Megatron-FSDP (--use-megatron-fsdp) is not modelled"
    assert {megatron, "fsdp does not support zero_stage 1"} <= set(stages)
    for reason, stage in stages.items():
        assert f"zero_stage {stage}" in reason, (reason, stage)


def test_70b_on_eight_24gb_gpus_is_infeasible_and_says_how_many(tuning: Tuning) -> None:
    spec, c = model("llama-2-70b").spec, cluster("rtx-4090-24gb", host_gib=256)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    constraints = Constraints(allow_offload=False)
    result = recommend(spec, c, training, constraints, tuning, with_suggestions=False)
    assert result.status == "infeasible" and result.recommended is None
    memory = next(r for r in result.rejected if r.reason == "does not fit in GPU memory")
    assert memory.count > 0 and memory.per_gpu_bytes is not None and memory.capacity_bytes is not None
    assert memory.per_gpu_bytes > memory.capacity_bytes
    tips = suggestions(spec, c, training, constraints, tuning, catalog=[gpu("h100-sxm-80gb")]).made
    more = next(t for t in tips if t.kind == "more_gpus")
    # 70B x 16 bytes = 1.1 TB of states over 22.8 GiB usable per GPU: at least 48 GPUs
    assert more.num_gpus is not None and more.num_gpus >= 48 and more.num_gpus % 8 == 0
    assert any(t.kind == "other_gpu" and t.gpu == "h100-sxm-80gb" and t.num_gpus for t in tips)
    offload = next(t for t in tips if t.kind == "offload")
    # more than the nodes state: host RAM past their 256 GiB, or NVMe they do not state (the least host
    # RAM, ZeRO-Infinity's, offloads the states to NVMe)
    assert offload.cpu_per_node_bytes is not None and "256 GiB" in offload.detail
    assert offload.cpu_per_node_bytes > 256 * 2**30 or offload.nvme_per_node_bytes
    assert not offload.nvme_per_node_bytes or "GiB of NVMe per node (NVMe not stated)" in offload.detail
    assert not offload.on_the_gpus_given
    # its GPUs and nodes are its layout's, as every suggestion on the GPUs given says them
    assert offload.layout is not None and offload.num_gpus == offload.layout.world_size
    assert offload.num_nodes == max(1, offload.layout.world_size // c.gpus_per_node)
    assert any(t.kind == "qlora" for t in tips)


def test_the_suggestions_states_bound_is_the_searchs_and_lets_stated_host_ram_offload(tuning: Tuning) -> None:
    """13B full training on one 24 GB card: 13B x 16 bytes of states can never fit without offload,
    so a suggestion on that card is not searched; with host RAM the node states and offload allowed
    the bound bounds nothing (ZeRO-Offload holds the states on the host), as in the search itself."""
    spec, training = model("llama-2-13b").spec, TrainingSpec(seq_len=1024, global_batch_size=8)
    alone, with_ram = cluster("rtx-4090-24gb", per_node=1), cluster("rtx-4090-24gb", per_node=1, host_gib=512)
    unfit = states_unfit(spec, alone, training, tuning, Constraints(), 1)
    assert unfit is not None and "GiB allowed" in unfit  # why, with the numbers
    assert states_unfit(spec, with_ram, training, tuning, Constraints(allow_offload=False), 1) is not None
    assert states_unfit(spec, with_ram, training, tuning, Constraints(), 1) is None
    assert recommend(spec, with_ram, training, Constraints(), tuning, with_suggestions=False).recommended


def test_an_fsdp_job_that_fits_only_compiled_is_told_so(tuning: Tuning) -> None:
    """Llama-3.1-8B at 16K on two H100s: eager FSDP keeps fp32 logits (3 copies at the loss's peak)
    and does not fit on Accelerate; compiled (model and loss) it does, and the suggestion is the
    compiled plan. torchtitan's chunked loss fits it too, where torchtitan may run it."""
    from service.launchers import Target

    spec, c = model("llama-3.1-8b").spec, cluster(per_node=2)
    training = TrainingSpec(seq_len=16384, global_batch_size=8)
    anywhere = Constraints(frameworks=(Framework.FSDP,), allow_offload=False)
    chunked = recommend(spec, c, training, anywhere, tuning, with_suggestions=False).recommended
    assert chunked is not None and chunked.layout.chunked_loss and chunked.layout.world_size == 2
    constraints = dataclasses.replace(anywhere, launchers=(Target.ACCELERATE,))
    assert recommend(spec, c, training, constraints, tuning, with_suggestions=False).recommended is None
    tips = suggestions(spec, c, training, constraints, tuning, catalog=[gpu("h100-sxm-80gb")]).made
    compiled = next(t for t in tips if t.kind == "torch_compile")
    assert compiled.layout is not None and compiled.layout.torch_compile is Compile.MODEL_AND_LOSS
    assert compiled.per_gpu_bytes is not None and compiled.per_gpu_bytes < 0.95 * c.gpu.memory_bytes
    asked = dataclasses.replace(constraints, torch_compile=True)
    plan = recommend(spec, c, training, asked, tuning, with_suggestions=False).recommended
    assert plan is not None and plan.layout == compiled.layout
    # asked already: nothing more to suggest
    again = suggestions(spec, c, training, asked, tuning, catalog=[gpu("h100-sxm-80gb")]).made
    assert not any(t.kind == "torch_compile" for t in again)


def test_a_compiled_fsdp_search_runs_async_tp_where_torchtitan_runs_the_layout(tuning: Tuning) -> None:
    """torchtitan's Async TP only hides TP communication, so a compiled FSDP search turns it on; a
    model torchtitan cannot build (Llama 2) runs on Accelerate, which runs no FSDP with TP
    (transformers 5.24 loads a TP model on its own mesh): none of its recommended layouts has TP."""
    asked = Constraints(frameworks=(Framework.FSDP,), torch_compile=True, allow_offload=False)
    c = cluster(nodes=8)
    spec = model("llama-3.1-70b").spec
    training = TrainingSpec(seq_len=8192, global_batch_size=256)
    result = recommend(spec, c, training, asked, tuning, with_suggestions=False)
    ranked = [found for found in (result.recommended, *result.alternatives) if found is not None]
    best = next((found for found in ranked if found.layout.tp > 1), None)
    assert best is not None and best.layout.tp_comm_overlap
    plan = Plan(
        model=spec, cluster=sub_cluster(c, best.layout.world_size), training=training, layout=best.layout
    )
    assert Target.TORCHTITAN in runnable_targets(plan)[0]
    llama2 = recommend(
        model("llama-2-70b").spec, c, TrainingSpec(seq_len=4096, global_batch_size=512), asked, tuning,
        with_suggestions=False,
    )  # fmt: skip
    kept = [found for found in (llama2.recommended, *llama2.alternatives) if found is not None]
    assert kept and all(found.layout.tp == 1 for found in kept)


JOBS = [
    ("llama-2-7b", "h100-sxm-80gb", 1, 4096, 128),
    ("llama-2-13b", "a100-sxm-40gb", 2, 2048, 64),
    ("mixtral-8x7b", "h100-sxm-80gb", 2, 4096, 64),
]


@pytest.mark.parametrize(("name", "gpu_name", "nodes", "seq", "batch"), JOBS)
def test_every_candidate_is_valid_and_fits_with_headroom(
    tuning: Tuning, name: str, gpu_name: str, nodes: int, seq: int, batch: int
) -> None:
    spec, c = model(name).spec, cluster(gpu_name, nodes)
    training = TrainingSpec(seq_len=seq, global_batch_size=batch)
    constraints = Constraints(min_headroom_fraction=0.1)
    result = recommend(spec, c, training, constraints, tuning)
    assert result.recommended is not None
    candidates = [result.recommended, *result.alternatives]
    for cand in candidates:
        sub = sub_cluster(c, cand.layout.world_size)
        validate_layout(spec, sub, cand.layout, training)
        again = estimate(spec, sub, cand.layout, training, tuning=tuning, with_limits=False)
        assert again.memory == cand.estimate.memory and again.time == cand.estimate.time
        assert cand.estimate.memory.per_gpu.total <= 0.9 * c.gpu.memory_bytes
    speeds = [cand.estimate.time.tokens_per_s for cand in candidates if cand.estimate.time]
    # top-1 first (equal to 4 digits: the simpler wins), or within rank.NEAR_TIE_FRACTION of a
    # faster one that has more model-parallel degrees (a near tie: the fewer degrees win)
    assert speeds[0] >= max(speeds) * (1 - rank.NEAR_TIE_FRACTION)
    best = rank.parallel_degrees(candidates[0].layout)
    for cand, speed in zip(candidates, speeds, strict=True):
        assert speed <= speeds[0] * (1 + 1e-3) or rank.parallel_degrees(cand.layout) > best, cand.layout


def test_more_frameworks_never_worse(tuning: Tuning) -> None:
    spec, c = model("llama-2-7b").spec, cluster("a100-sxm-80gb")
    training = TrainingSpec(seq_len=2048, global_batch_size=64)
    scores = {}
    for frameworks in ((Framework.DEEPSPEED,), (Framework.DEEPSPEED, Framework.MEGATRON), tuple(Framework)):
        result = recommend(spec, c, training, Constraints(frameworks=frameworks, top_k=1), tuning)
        assert result.recommended is not None and result.recommended.layout.framework in frameworks
        scores[frameworks] = result.recommended.score
    values = list(scores.values())
    assert values[0] <= values[1] * (1 + 1e-3) and values[1] <= values[2] * (1 + 1e-3)


def test_fewest_gpus_objective_uses_fewer_gpus(tuning: Tuning) -> None:
    spec, c = model("llama-2-7b").spec, cluster("h100-sxm-80gb", nodes=2)
    training = TrainingSpec(seq_len=2048, global_batch_size=64)
    result = recommend(spec, c, training, Constraints(objective=Objective.FEWEST_GPUS, top_k=1), tuning)
    assert result.recommended is not None
    assert result.recommended.layout.world_size < 16
    assert result.recommended.score == result.recommended.layout.world_size


def test_rejections_carry_a_worked_example(tuning: Tuning) -> None:
    spec, c = model("llama-3-70b").spec, cluster("h100-sxm-80gb", nodes=2)
    result = recommend(spec, c, TrainingSpec(seq_len=8192, global_batch_size=64), Constraints(), tuning)
    reasons = {r.reason: r for r in result.rejected}
    assert "megatron zero_stage 3: Megatron-FSDP (--use-megatron-fsdp) is not modelled" in reasons
    assert reasons["does not fit in GPU memory"].detail.endswith("over)")
    assert all(r.count >= 1 for r in result.rejected)


def test_the_search_budget_counts_evaluations_so_the_answer_depends_on_the_request_only(
    tuning: Tuning,
) -> None:
    # A budget in layout evaluations, not seconds: the same request gives the same answer (layouts,
    # counters, rejections) however busy the machine; a small budget truncates at that count.
    spec, c = model("llama-3.1-70b").spec, cluster("h100-sxm-80gb", nodes=4)
    training = TrainingSpec(seq_len=8192, global_batch_size=256)
    full = recommend(spec, c, training, Constraints(), tuning)
    assert not full.search.truncated
    used = full.search.memory_evaluations + full.search.time_evaluations
    small = Constraints(max_evaluations=used // 4)
    first, second = (recommend(spec, c, training, small, tuning, with_suggestions=False) for _ in range(2))
    assert first.search.truncated and second.search.truncated
    evaluations = first.search.memory_evaluations + first.search.time_evaluations
    assert used // 4 <= evaluations < used  # stops at the first family past the budget
    assert first.recommended == second.recommended and first.alternatives == second.alternatives
    assert first.rejected == second.rejected
    counters = ("memory_evaluations", "time_evaluations", "candidates_evaluated", "families_considered")
    assert [getattr(first.search, k) for k in counters] == [getattr(second.search, k) for k in counters]


def test_megatron_recomputes_only_the_layers_it_must(tuning: Tuning) -> None:
    # 70B at 16K on 32 A100: some layouts fit only with recompute; Megatron's block method recomputes
    # the fewest layers of each stage that fit (one fewer does not), and is faster than all of them
    c = cluster("a100-sxm-80gb", nodes=4)
    training = TrainingSpec(seq_len=16384, global_batch_size=64)
    spec = model("llama-3.1-70b").spec
    found = recommend(spec, c, training, Constraints(frameworks=(Framework.MEGATRON,)), tuning)
    partial = [
        cand for cand in (found.recommended, *found.alternatives) if cand and cand.layout.recompute_num_layers
    ]
    assert partial
    for cand in partial:
        n = cand.layout.recompute_num_layers
        assert n is not None and cand.estimate.fits
        on = sub_cluster(c, cand.layout.world_size)
        if n > 1:  # one layer fewer needs more than the search allows (capacity less the 5% headroom)
            fewer = dataclasses.replace(cand.layout, recompute_num_layers=n - 1)
            need = estimate(spec, on, fewer, training, tuning=tuning).memory.per_gpu.total
            assert need > on.gpu.memory_bytes * (1 - Constraints().min_headroom_fraction)
        every = dataclasses.replace(cand.layout, recompute_num_layers=None)
        assert every.recompute is Recompute.FULL
        slower = estimate(spec, on, every, training, tuning=tuning)
        assert cand.estimate.time is not None and slower.time is not None
        assert cand.estimate.time.tokens_per_s > slower.time.tokens_per_s


def test_megatron_moe_plans_overlap_the_all_to_alls_when_it_pays(tuning: Tuning) -> None:
    # Mixtral-8x7B on 4 nodes of H100, 8K sequences: expert parallelism over 8; the search times each
    # Megatron MoE candidate with and without --overlap-moe-expert-parallel-comm and keeps the faster
    # that fits (at 4K the fastest layout, pp 1, has no room for the overlap's extra micro-batch)
    spec, c = model("mixtral-8x7b").spec, cluster("h100-sxm-80gb", 4)
    training = TrainingSpec(seq_len=8192, global_batch_size=256)
    plan = recommend(spec, c, training, Constraints(frameworks=(Framework.MEGATRON,)), tuning)
    chosen = plan.recommended
    assert chosen is not None and chosen.layout.ep > 1 and chosen.layout.moe_a2a_overlap
    assert chosen.estimate.time is not None and chosen.estimate.fits
    plain = estimate(
        spec, c, dataclasses.replace(chosen.layout, moe_a2a_overlap=False), training, tuning=tuning
    )
    assert plain.time is not None and plain.time.tokens_per_s < chosen.estimate.time.tokens_per_s


def test_a_cut_other_gpu_suggestion_states_what_its_layout_estimates_on_the_cluster_it_states(
    tuning: Tuning,
) -> None:
    """The invariant sweep's case: BLOOM-176B QLoRA, infeasible on 8 x 24 GB; its suggestion of
    L40S, searched within 300 evaluations and cut, states the tokens/s its layout estimates on the
    one node it states. It once kept DeepSpeed pp 4 x dp 2, whose tied-embedding all-reduce pair
    (ranks 6 apart) was counted across two nodes of the one there is (tests/estimator/test_comm.py
    pins that mechanism); QLoRA now trains data-parallel only, and the statement must hold for
    whatever the cut keeps."""
    spec = model("bloom-176b").spec
    training = TrainingSpec(seq_len=2048, global_batch_size=32, method=Method.QLORA)
    constraints = Constraints(frameworks=(Framework.DEEPSPEED,))
    ask = suggest._Ask(spec, cluster("l4-24gb"), training, constraints, tuning)
    (tip,) = ask.other_gpu(gpu("l40s-48gb"), Budget(300))
    assert tip.layout is not None and tip.tokens_per_s is not None
    # 4 of a node's 8 hold it (the cards a node holds, from one up)
    assert (tip.num_gpus, tip.num_nodes, tip.inter_node_bandwidth_bytes_per_s) == (4, 1, None)
    assert (tip.layout.tp, tip.layout.pp, tip.layout.ep) == (1, 1, 1)  # QLoRA: data-parallel only
    l40s = gpu("l40s-48gb")
    stated = ClusterSpec(  # as the API builds a one-node cluster: nothing crosses a network
        gpu=l40s,
        num_nodes=1,
        gpus_per_node=tip.gpus_per_node,
        intra_node_bandwidth_bytes_per_s=l40s.intra_node_bandwidth_bytes_per_s,
        inter_node_bandwidth_bytes_per_s=l40s.intra_node_bandwidth_bytes_per_s,
    )
    again = estimate(spec, stated, tip.layout, training, tuning=tuning).time
    assert again is not None and again.tokens_per_s == pytest.approx(tip.tokens_per_s, rel=1e-9)


def test_counts_past_every_split_are_logged_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by bench/fuzz_probe.py: QLoRA of Llama 3.1 405B at global batch 8 on 12,500 nodes of 8
    H100 built every split of each of the search's ~80 GPU counts only to reject them (0.39 s a
    search); the shorter-sequence suggestion searches again per halving, so the request's 1.5 s ran
    out and the infeasible plan came back with no suggestion. No split uses more than global batch 8
    x cp 32 = 256 GPUs (QLoRA: tp = pp = 1): a count past that is one rejection, and the search of
    the whole cluster builds splits of those counts only."""
    import service.recommender as recommender
    from service.recommender.space import largest_world

    built: list[int] = []
    real = recommender.structures

    def recording(*args: object, **kwargs: object) -> object:
        built.append(args[3])  # type: ignore[arg-type]  # gpus
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(recommender, "structures", recording)
    spec, big = model("llama-3.1-405b").spec, cluster(nodes=12_500, per_node=8)
    training = TrainingSpec(seq_len=524_288, global_batch_size=8, method=Method.QLORA)
    found = recommend(spec, big, training, Constraints(top_k=1), default_tuning(), with_suggestions=False)
    assert found.recommended is None
    largest = largest_world(spec, big, training)
    assert largest == 8 * 32
    assert built and max(built) <= largest
    past = [r for r in found.rejected if r.reason == "invalid: past_every_split"]
    assert past and past[0].count > 0 and "256" in past[0].detail


def test_a_plan_through_a_data_parallel_launcher_builds_no_split_it_refuses() -> None:
    """Through the HF Trainer (data parallelism only, DeepSpeed or FSDP) a plan's search evaluated
    every tp/pp/cp/ep layout and every Megatron one, then refused each by asking the launchers (70B on
    32 H100: 2,317 memory evaluations, now 17); each split and the framework are logged once, with
    why, and the answer is the same."""
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    hf_trainer = Constraints(launchers=(Target.HF_TRAINER,))
    rec = recommend(model("llama-3-70b").spec, cluster(nodes=4), training, hf_trainer, default_tuning())
    assert rec.recommended is not None
    layout = rec.recommended.layout
    assert (layout.tp, layout.pp, layout.cp, layout.ep) == (1, 1, 1, 1)
    reasons = {r.reason: r for r in rec.rejected}
    split = "no requested launcher runs deepspeed at this split: hf_trainer runs data parallelism only"
    example = reasons[split].example
    assert (example.tp, example.pp, example.cp, example.ep) != (1, 1, 1, 1)
    assert NO_LAUNCHER not in reasons  # no layout was built, evaluated, then refused by the launcher
    assert "no requested launcher runs megatron" in reasons
    assert rec.search.memory_evaluations < 200


def test_an_infeasible_plan_says_which_launcher_kept_a_split_from_the_search() -> None:
    """Llama 3.1 8B at 128k tokens on one node fits only with context parallelism, which the HF
    Trainer does not run: the infeasible plan said only "does not fit in GPU memory" (the splits were
    left out before any was logged; long-context review). It names the launcher's limit too."""
    training = TrainingSpec(seq_len=131_072, global_batch_size=8)
    hf_trainer = Constraints(frameworks=(Framework.FSDP, Framework.DEEPSPEED), launchers=(Target.HF_TRAINER,))
    rec = recommend(
        model("llama-3.1-8b").spec, cluster(), training, hf_trainer, default_tuning(), with_suggestions=False
    )
    assert rec.recommended is None
    reasons = {r.reason: r for r in rec.rejected}
    for framework in ("fsdp", "deepspeed"):
        split = f"no requested launcher runs {framework} at this split: hf_trainer runs data parallelism only"
        assert split in reasons and reasons[split].example.cp > 1


def test_a_data_parallel_split_names_only_the_launchers_that_run_the_framework() -> None:
    """DeepSpeed through the HF Trainer or Megatron-LM: the HF Trainer alone of them runs DeepSpeed, so
    the split's reason names it, not Megatron-LM (which runs model parallelism, and not DeepSpeed)."""
    node = cluster()
    both = Constraints(frameworks=(Framework.DEEPSPEED,), launchers=(Target.HF_TRAINER, Target.MEGATRON))
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    rec = recommend(model("llama-3-8b").spec, node, training, both, default_tuning())
    reasons = {r.reason for r in rec.rejected if "data parallelism only" in r.reason}
    assert reasons == {
        "no requested launcher runs deepspeed at this split: hf_trainer runs data parallelism only"
    }


def test_fewer_gpus_are_chosen_where_the_nodes_do_not_divide_the_batch() -> None:
    """A review's case: 136 H100s (17 nodes) put Llama 3 8B at batch 256 on dp 2 tp 2 pp 17 cp 2 at
    610k tokens/s where 128 of them train at 1.24M; the plan said "uses all 136 GPUs". More GPUs never
    train slower than fewer of them: the plan uses 128 and says why."""
    from service.catalog.gpus import gpu as catalog_gpu
    from service.catalog.models import model as preset_model
    from service.catalog.tuning import default_tuning
    from service.recommender import Constraints, recommend
    from service.recommender.capacity import default_cluster

    spec = preset_model("llama-3-8b").spec
    training = TrainingSpec(seq_len=4096, global_batch_size=256)
    cluster = default_cluster(catalog_gpu("h100-sxm-80gb"), num_nodes=17)
    fewer = default_cluster(catalog_gpu("h100-sxm-80gb"), num_nodes=16)
    plan = recommend(spec, cluster, training, Constraints(), default_tuning())
    alone = recommend(spec, fewer, training, Constraints(), default_tuning())
    assert plan.recommended is not None and alone.recommended is not None
    assert plan.recommended.layout.world_size == 128
    assert plan.recommended.layout == alone.recommended.layout
    assert any(
        r.startswith("uses 128 of 136 GPUs: 128 GPUs train faster") for r in plan.recommended.rationale
    )
    # where the nodes divide the batch, all of them, as before
    assert alone.recommended.layout.world_size == 128


@pytest.mark.parametrize(
    ("preset", "gpu_name", "nodes", "network", "training", "words"),
    [
        # the batch fills 64 GPUs: on 128 the other 64 went to tp 2, 0.3% slower
        ("gpt2", "a100-pcie-80gb", 8, 25e9,
         TrainingSpec(seq_len=1024, global_batch_size=64, method=Method.LORA), "one sequence"),
        # the data-parallel all-reduce over 6.25 GB/s is most of the step (half the GPUs are searched
        # too). GPT-OSS-120B, whose 64 nodes were 2% slower than 32 here, fit V100s only through DeepSpeed
        # AutoTP splitting its fused experts, which AutoTP does not (validate's autotp_fused_experts)
        ("llama-2-13b", "v100-sxm2-16gb", 32, 6.25e9,
         TrainingSpec(seq_len=1024, global_batch_size=128, precision=Precision.FP16),
         "over the network (6.25 GB/s per GPU)"),
    ],
)  # fmt: skip
def test_twice_the_gpus_never_train_slower(
    preset: str, gpu_name: str, nodes: int, network: float, training: TrainingSpec, words: str
) -> None:
    """Consistency review (stop 41): the same throughput plan on twice the nodes answered slower
    (the search of fewer GPUs ran only where the nodes did not divide the batch). Where the batch gives
    every data-parallel rank one sequence and the leader splits the model besides, or its exposed
    data-parallel communication is half its step, half the GPUs are searched too."""
    spec = model(preset).spec
    base = gpu(gpu_name)

    def plan(count: int) -> Recommendation:
        intra = base.intra_node_bandwidth_bytes_per_s
        c = ClusterSpec(gpu=base, num_nodes=count, gpus_per_node=8, intra_node_bandwidth_bytes_per_s=intra,
                        inter_node_bandwidth_bytes_per_s=network)  # fmt: skip
        return recommend(spec, c, training, Constraints(), default_tuning(), with_suggestions=False)

    fewer, more = plan(nodes), plan(2 * nodes)
    assert fewer.recommended is not None and more.recommended is not None
    assert fewer.recommended.estimate.time is not None and more.recommended.estimate.time is not None
    assert more.recommended.estimate.time.tokens_per_s >= fewer.recommended.estimate.time.tokens_per_s
    assert any(words in r for r in more.recommended.rationale), more.recommended.rationale


def test_a_recompute_no_launcher_runs_does_not_hide_a_heavier_one_that_does() -> None:
    """Found comparing the regression corpus: a family's lighter recompute that fits at micro-batch
    m bounded its heavier recompute at m (never faster), even where no requested launcher ran the
    lighter one (per-op checkpointing is torchtitan's alone, and torchtitan does not build Gemma).
    Gemma 2B fp32 on one MI250X GCD: full recompute fits and runs, but the search stopped at the
    refused selective_op and answered that one GPU holds nothing (capacity: 2 GPUs)."""
    from service.catalog.gpus import gpu as catalog_gpu
    from service.catalog.models import model as preset_model
    from service.catalog.tuning import default_tuning
    from service.estimator.types import Attention, Layout, Precision
    from service.launchers import runnable_targets
    from service.recommender import Constraints, search
    from service.recommender.capacity import default_cluster
    from service.recommender.types import Objective

    spec = preset_model("gemma-2b").spec
    training = TrainingSpec(
        seq_len=2048, global_batch_size=128, precision=Precision.FP32, attention=Attention.SDPA
    )
    cluster = default_cluster(catalog_gpu("mi250x-gcd-64gb"), 1)
    constraints = Constraints(frameworks=(Framework.FSDP,), top_k=1, objective=Objective.FEWEST_GPUS)
    found = search(spec, cluster, training, constraints, default_tuning(), (1,))
    (best,) = found.ranked()
    assert best.layout.world_size == 1 and best.layout.recompute is Recompute.FULL
    one_gpu = dataclasses.replace(cluster, gpus_per_node=1)
    plan = Plan(model=spec, cluster=one_gpu, training=training, layout=best.layout)
    assert runnable_targets(plan, None)[0]
    lighter = Layout(
        framework=Framework.FSDP, zero_stage=best.layout.zero_stage, recompute=Recompute.SELECTIVE_OP,
        micro_batch_size=best.layout.micro_batch_size,
    )  # fmt: skip
    assert not runnable_targets(dataclasses.replace(plan, layout=lighter), None)[0]


def test_gpus_the_batch_cannot_fill_are_left_idle_however_many() -> None:
    """GPT-2 LoRA at batch 16: 16 A100s train it data-parallel; on 64 the first fix searched half of
    them (32, themselves padded with tp 2) and answered dp 16 tp 4, slower (new-code review, stop 41):
    the count searched is the largest the batch's sequences fill."""
    spec, a100 = model("gpt2").spec, gpu("a100-sxm-80gb")
    training = TrainingSpec(seq_len=1024, global_batch_size=16, method=Method.LORA)

    def best(nodes: int) -> tuple[int, float]:
        intra = a100.intra_node_bandwidth_bytes_per_s
        c = ClusterSpec(gpu=a100, num_nodes=nodes, gpus_per_node=8, intra_node_bandwidth_bytes_per_s=intra,
                        inter_node_bandwidth_bytes_per_s=25e9)  # fmt: skip
        rec = recommend(spec, c, training, Constraints(), default_tuning(), with_suggestions=False)
        assert rec.recommended is not None and rec.recommended.estimate.time is not None
        return rec.recommended.layout.world_size, rec.recommended.estimate.time.tokens_per_s

    two, eight = best(2), best(8)
    assert eight[0] == two[0] == 16 and eight[1] == pytest.approx(two[1])


def test_recomputing_some_layers_a_smaller_micro_batch_is_timed_at_its_fewest() -> None:
    """Llama 3.1 8B at 1M tokens on 64 H100s with Megatron: micro-batch 1 recomputing 14 of 32 layers
    (distributed optimizer) ran 6% faster than the recommended micro-batch 1 recomputing 23 without
    it; the search timed the zero-1 family only at its largest fitting micro-batch (2, recomputing 28)
    (MoE review)."""
    from service.catalog.models import model as preset
    from service.catalog.tuning import default_tuning
    from service.estimator.types import Framework, TrainingSpec
    from service.recommender import Constraints, recommend
    from tests.recommender.helpers import cluster

    training = TrainingSpec(seq_len=1_048_576, global_batch_size=8)
    found = recommend(preset("llama-3.1-8b").spec, cluster(nodes=8), training,
                      Constraints(frameworks=(Framework.MEGATRON,), top_k=5), default_tuning(),
                      with_suggestions=False)  # fmt: skip
    assert found.recommended is not None and found.recommended.estimate.time is not None
    assert found.recommended.estimate.time.step_s < 310
    shown = [found.recommended, *found.alternatives]
    assert any(c.layout.zero_stage == 1 and (c.layout.recompute_num_layers or 32) <= 14 for c in shown)


def test_megatron_searches_its_distributed_optimizer_on_one_data_parallel_rank() -> None:
    """The distributed optimizer at dp x cp = 1 shards no dense state, but is what the recipes'
    switches need: under fp8 --fp8-param-gather (no bf16 weight copy), under bf16 the precision-aware
    optimizer. Llama 3.1 70B in fp8 on 16 96 GB H100s was infeasible for Megatron (every dp-1 split
    at ZeRO-0) where tp 8 pp 2 at ZeRO-1 fits with 7% headroom (Megatron review)."""
    from service.catalog.models import model as preset
    from service.catalog.tuning import default_tuning
    from service.estimator.types import Precision, TrainingSpec
    from service.recommender import Constraints, recommend
    from tests.recommender.helpers import cluster

    fp8 = TrainingSpec(seq_len=8192, global_batch_size=128, tokens=10**10, precision=Precision.FP8)
    found = recommend(
        preset("llama-3.1-70b").spec,
        cluster("h100-sxm-500w-96gb", nodes=2),
        fp8,
        Constraints(frameworks=(Framework.MEGATRON,)),
        default_tuning(),
        with_suggestions=False,
    )
    assert found.recommended is not None, found.closest
    layout = found.recommended.layout
    assert (layout.dp, layout.cp, layout.zero_stage) == (1, 1, 1), layout


def test_where_tp_overlaps_buffers_do_not_fit_the_overlap_off_twin_is_searched() -> None:
    """Megatron's TP overlap holds Transformer Engine's userbuffers (12 x seq x micro-batch / cp x
    hidden: 6 GiB per GPU for Llama 3.1 70B at 32k tokens). Counting them made this job infeasible (a
    review: tp 8 pp 2 needs 80.8 GiB with them), though the same layout with the overlap off fits at 74.7
    GiB; and at 1M tokens they made the 8B recompute 17 layers where 14 do with the overlap off."""
    from service.catalog.models import model as preset
    from service.catalog.tuning import default_tuning
    from service.estimator.types import TrainingSpec
    from service.recommender import Constraints, recommend
    from tests.recommender.helpers import cluster

    # (at 43k tokens: since the distributed optimizer runs precision-aware at dp 1 too, the 32k
    # tokens' 6 GiB of buffers fit beside its smaller states, and since Megatron's loss keeps the
    # 16-bit gradient alone beside its fp32 logits, 40k tokens' too)
    training = TrainingSpec(seq_len=43_008, global_batch_size=8)
    spec = preset("llama-3.1-70b").spec
    found = recommend(
        spec, cluster(nodes=2), training, Constraints(), default_tuning(), with_suggestions=False
    )
    assert found.recommended is not None
    layout, memory = found.recommended.layout, found.recommended.estimate.memory.per_gpu
    assert not layout.tp_comm_overlap and memory.tp_comm_buffers == 0
    overlapped = dataclasses.replace(layout, tp_comm_overlap=True)
    from service.estimator.estimate import estimate

    with_buffers = estimate(
        spec, cluster(nodes=2), overlapped, training, tuning=default_tuning(), with_limits=False
    )
    # 12 buffers of 43k tokens x 8,192 wide in bf16, past the plan's headroom
    from service.recommender import headroom

    allowed = headroom.allowed_bytes(80 * 2**30, Constraints().min_headroom_fraction)
    assert with_buffers.memory.per_gpu.device_used_bytes > allowed
    assert with_buffers.memory.per_gpu.tp_comm_buffers == 12 * 43_008 * 8_192 * 2


def test_the_states_bound_of_a_suggestion_is_of_the_frameworks_a_requested_launcher_runs(
    tuning: Tuning,
) -> None:
    """70B on 8 A100s asked for the HF Trainer: the search bounds DeepSpeed and FSDP (131 GiB of
    states per GPU), the suggestions' bound took Megatron's 115 GiB as well, which the same answer
    said no requested launcher runs (an infeasible-jobs review): one floor, of the frameworks run."""
    from service.launchers import Target

    spec, c = model("llama-3.1-70b").spec, cluster("a100-sxm-80gb")
    training = TrainingSpec(seq_len=8192, global_batch_size=64)
    trainer = Constraints(launchers=(Target.HF_TRAINER,))
    unfit = states_unfit(spec, c, training, tuning, trainer, 8)
    assert unfit is not None and "megatron" not in unfit, unfit
    every = states_unfit(spec, c, training, tuning, Constraints(), 8)
    assert every is not None and "megatron" in every  # Megatron's precision-aware optimizer: least
    only_megatron = Constraints(frameworks=(Framework.MEGATRON,), launchers=(Target.HF_TRAINER,))
    assert states_unfit(spec, c, training, tuning, only_megatron, 8) is None  # nothing runs: no bound


def test_the_offload_suggestion_says_on_how_many_gpus_and_how(tuning: Tuning) -> None:
    """ "offload ...: 56.9 GiB per GPU, 343 tokens/s" was a layout on 1 of the 8 GPUs given, read as the
    8-GPU figure (an infeasible-jobs review): it says where and with which layout, as the others do."""
    spec, c = model("llama-2-70b").spec, cluster("rtx-4090-24gb", host_gib=256)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    constraints = Constraints(allow_offload=False)
    tips = suggestions(spec, c, training, constraints, tuning, catalog=[]).made
    offload = next(t for t in tips if t.kind == "offload")
    assert offload.layout is not None
    used = offload.layout.world_size
    where = "the 8 GPUs given" if used == 8 else f"{used} of the 8 GPUs given"
    assert f"on {where}:" in offload.detail and f"with {offload.layout.framework.value} " in offload.detail


def test_an_odd_sequence_searches_tensor_parallelism_without_sequence_parallelism(tuning: Tuning) -> None:
    """Megatron asserts seq_len % tp only under --sequence-parallel: at 4,097 tokens the search built
    only sequence-parallel TP layouts, refused every one, and answered infeasible where tp 4 pp 4 fits
    (odd-clusters review). Such layouts now run with sequence parallelism off."""
    spec = model("llama-3.1-70b").spec
    training = TrainingSpec(seq_len=4097, global_batch_size=16)
    constraints = Constraints(frameworks=(Framework.MEGATRON,))
    found = recommend(spec, cluster(nodes=2), training, constraints, tuning, with_suggestions=False)
    assert found.recommended is not None
    layout = found.recommended.layout
    assert layout.tp > 1 and not layout.sequence_parallel
    validate_layout(spec, sub_cluster(cluster(nodes=2), layout.world_size), layout, training)
    even = recommend(
        spec, cluster(nodes=2), dataclasses.replace(training, seq_len=4096), constraints, tuning,
        with_suggestions=False,
    )  # fmt: skip
    assert even.recommended is not None and even.recommended.layout.sequence_parallel


def test_fewer_gpus_say_why_the_cluster_ran_nothing_and_why_fewer_still_are_faster(tuning: Tuning) -> None:
    """70 GPUs (7 nodes of 10) have no split of an 8B model at 8,192 tokens; 60 do, and 40 train faster:
    the answer said "than all 60" and dropped why 70 ran nothing (odd-clusters review)."""
    spec = model("llama-3-8b").spec
    seventy = cluster(nodes=7, per_node=10)
    found = recommend(spec, seventy, TrainingSpec(seq_len=8192, global_batch_size=2), Constraints(), tuning)
    assert found.recommended is not None and found.recommended.layout.world_size < 60
    (uses,) = [line for line in found.recommended.rationale if line.startswith("uses ")]
    assert "no valid split of 70 GPUs" in uses and "than 60" in uses and "than all" not in uses
