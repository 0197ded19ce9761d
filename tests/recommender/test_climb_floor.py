"""The climb's memory bound (``space.least_bytes_per_gpu``): never above what a layout a requested
launcher runs needs, and what lets a climb that cannot fit stop before searching any count.

Soundness over presets, GPUs, trainings, offload and frameworks: every data-parallel layout the
search builds (each sharding, recompute and the first micro-batches, on a few counts) needs at
least the bound; and every layout a search of whole counts evaluates that a requested launcher runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

import service.estimator.evaluate as evaluate
from service.catalog.gpus import gpu, gpu_entries
from service.catalog.models import model, models
from service.catalog.tuning import default_tuning
from service.estimator.defaults import for_gpu
from service.estimator.job import Job, make_job, shared_memory_memos
from service.estimator.types import Compile, Framework, Layout, Method, Plan, TrainingSpec
from service.frameworks import Target
from service.launchers import runnable_targets
from service.recommender import recommend, search
from service.recommender.budget import Budget
from service.recommender.space import (
    OffloadDevices,
    Structure,
    least_bytes_per_gpu,
    make_layout,
    micro_batch_sizes,
    recompute_order,
    search_compile,
    shardings,
    sub_cluster,
)
from service.recommender.types import Constraints, Objective
from tests.recommender.helpers import cluster

HF = (Target.HF_TRAINER,)
NO_OFFLOAD, OFFLOAD = OffloadDevices(cpu=False, nvme=False), OffloadDevices(cpu=True, nvme=True)
TRAININGS = (
    TrainingSpec(seq_len=4096, global_batch_size=16),
    TrainingSpec(seq_len=2048, global_batch_size=16, method=Method.LORA),
    TrainingSpec(seq_len=1024, global_batch_size=16, method=Method.QLORA),
)


def _data_parallel_layouts(
    job: Job, framework: Framework, offload: OffloadDevices, gpus: int, compiled: Compile
) -> Iterator[Layout]:
    """The data-parallel layouts a search builds on ``gpus`` GPUs: every sharding, recompute and
    the two smallest micro-batches (memory grows with the micro-batch)."""
    s = Structure(gpus=gpus, dp=gpus, tp=1, pp=1, cp=1, ep=1)
    options, _ = shardings(framework, s, offload, compiled)
    sizes = micro_batch_sizes(job.training, s, 1, False, framework)[:2]
    for sh in options:
        for recompute in recompute_order(framework):
            for size in sizes:
                yield make_layout(
                    s, sh, recompute, 1, size, job.cluster.gpu.peer_to_peer, seq_len=job.training.seq_len
                )


@pytest.mark.parametrize("card", ["h100-sxm-80gb", "v100-sxm2-32gb"])
def test_the_bound_is_below_every_data_parallel_layout(card: str) -> None:
    checked = bounded = 0
    with shared_memory_memos():
        for name, preset in models().items():
            spec = preset.spec
            launchers = None if spec.bidirectional else HF  # an encoder runs data parallel anywhere
            for training in TRAININGS:
                if spec.bidirectional and training.method is Method.QLORA:
                    continue
                for offload, compile_it, gpus in (
                    (NO_OFFLOAD, False, 1),
                    (NO_OFFLOAD, True, 8),
                    (OFFLOAD, False, 2),
                ):
                    c = cluster(card, per_node=8)
                    trained = for_gpu(
                        dataclasses.replace(
                            training, seq_len=min(training.seq_len, spec.max_position_embeddings)
                        ),
                        c.gpu,
                        spec,
                    )
                    job = make_job(spec, sub_cluster(c, gpus), trained, default_tuning())
                    for framework in (Framework.DEEPSPEED, Framework.FSDP):
                        bound = least_bytes_per_gpu(job, (framework,), offload, gpus, launchers, compile_it)
                        assert bound is not None and bound.dynamic_bytes > 0, (name, framework)
                        bounded += 1
                        compiled = search_compile(compile_it, framework)
                        for layout in _data_parallel_layouts(job, framework, offload, gpus, compiled):
                            need = evaluate.memory_numbers(job, layout)[0]
                            assert bound.need_bytes <= need, (
                                name,
                                card,
                                training.method,
                                framework,
                                layout,
                                bound,
                            )
                            checked += 1
    assert bounded > 500 and checked > 10_000


CASES = (
    ("gpt-oss-20b", "h200-sxm-141gb", TrainingSpec(seq_len=32768, global_batch_size=8), (8,)),
    ("llama-3.1-8b", "h100-sxm-80gb", TrainingSpec(seq_len=8192, global_batch_size=32), (1, 2, 4, 8)),
    ("qwen3-30b-a3b", "a100-sxm-80gb", TrainingSpec(seq_len=4096, global_batch_size=16), (4, 8, 16)),
    (
        "gemma-2-9b",
        "l40s-48gb",
        TrainingSpec(seq_len=4096, global_batch_size=16, method=Method.LORA),
        (1, 2, 4),
    ),
)


@pytest.mark.parametrize(("name", "card", "training", "counts"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("allow_offload", [False, True])
def test_the_bound_is_below_every_runnable_layout_a_search_evaluates(
    name: str,
    card: str,
    training: TrainingSpec,
    counts: tuple[int, ...],
    allow_offload: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plan's search (it builds every split, and logs what no launcher runs) of whole counts,
    with the HF Trainer alone: each layout it evaluates that the HF Trainer runs needs at least the
    bound of its count."""
    spec = model(name).spec
    c = cluster(card, nodes=max(1, max(counts) // 8), per_node=min(8, max(counts)), host_gib=2048)
    constraints = Constraints(objective=Objective.FEWEST_GPUS, launchers=HF, allow_offload=allow_offload)
    seen: list[tuple[Job, Layout, int]] = []
    inner = evaluate.uncalibrated_memory_numbers

    def recorded(job: Job, layout: Layout) -> tuple[int, int, int]:
        numbers = inner(job, layout)
        seen.append((job, layout, numbers[0]))
        return numbers

    monkeypatch.setattr(evaluate, "uncalibrated_memory_numbers", recorded)
    search(spec, c, training, constraints, default_tuning(), counts, budget=Budget(400_000))
    offload = OffloadDevices(cpu=allow_offload, nvme=False)
    runnable = 0
    for job, layout, need in seen:
        plan = Plan(model=spec, cluster=job.cluster, training=job.training, layout=layout)
        if not runnable_targets(plan, HF, first_only=True)[0]:
            continue
        runnable += 1
        bound = least_bytes_per_gpu(job, constraints.frameworks, offload, layout.world_size, HF)
        assert bound is not None and bound.need_bytes <= need, (layout, bound, need)
    assert runnable > 0


def test_an_hf_trainer_job_no_other_gpu_fits_stops_before_searching() -> None:
    """The users' case: gpt-oss-20b at 32K tokens through the HF Trainer on two L40S. No count of
    most other cards can fit (data parallel only: activations of one 32K sequence alone exceed
    them, and at most global batch 8 GPUs): each says so with its numbers, unsearched; B200 and
    MI300X still fit on one node (4 MI300X, from one card up). The whole answer costs a few hundred
    evaluations (it spent about 290,000, 17 s of CPU, before the bound)."""
    budget = Budget(10**9)
    found = recommend(
        model("gpt-oss-20b").spec, cluster("l40s-48gb", per_node=2),
        TrainingSpec(seq_len=32768, global_batch_size=8), Constraints(launchers=HF), default_tuning(),
        budget=budget, catalog=[entry.spec for entry in gpu_entries()],
    )  # fmt: skip
    assert found.status == "infeasible"
    assert {(s.gpu, s.num_gpus) for s in found.suggestions if s.kind == "other_gpu"} == {
        ("b200-sxm-180gb", 8),
        ("mi300x-192gb", 4),
    }
    skipped = {s.reason.split(":")[0]: s.reason for s in found.suggestions_skipped if s.kind == "other_gpu"}
    assert "h100-sxm-80gb" in skipped and "a100-sxm-80gb" in skipped
    why = skipped["h100-sxm-80gb"]
    assert "at micro-batch 1 with full recompute one GPU needs" in why
    assert "whatever the GPU count" in why and "GiB allowed" in why
    assert "at most the global batch (8) GPUs" in why
    assert not any("ran out" in s.reason for s in found.suggestions_skipped)
    assert budget.spent < 2_000
    assert gpu("h100-sxm-80gb")  # the catalog names it


def test_a_climb_past_every_split_says_what_bounds_the_job() -> None:
    """QLoRA splits no weight over tp or pp, so at global batch 16 no split uses more than 16 x cp 32
    GPUs: the more-GPU suggestion said "no layout fits on up to 32,768 GPUs" where a larger global batch
    was the change to make (bounded-work review)."""
    from service.catalog.models import model as preset
    from service.catalog.tuning import default_tuning
    from service.estimator.types import Method, TrainingSpec
    from service.recommender import Constraints
    from service.recommender.suggest import climb_bound
    from tests.recommender.helpers import cluster

    qlora = TrainingSpec(seq_len=4096, global_batch_size=16, method=Method.QLORA)
    counts, why = climb_bound(
        preset("deepseek-v3").spec, cluster(nodes=64), qlora, Constraints(), default_tuning(), (520, 528)
    )
    assert counts == ()
    assert why is not None and why.startswith("no split of this job uses more than 512 GPUs")
    assert "qlora: tp = pp = 1" in why and "a larger training.global_batch_size" in why
