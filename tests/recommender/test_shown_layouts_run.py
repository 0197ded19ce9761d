"""The closest memory miss a plan shows (its rejection example and ``closest``) is one a requested
launcher runs, where any miss is: the closest a user cannot launch tells them nothing to change."""

from __future__ import annotations

from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator import evaluate
from service.estimator.defaults import for_gpu
from service.estimator.job import make_job
from service.estimator.types import Framework, Layout, Method, Plan, Recompute, TrainingSpec
from service.launchers import runnable_targets
from service.recommender import Constraints, recommend
from service.recommender.space import RejectionLog
from tests.recommender import helpers

MISS = "does not fit in GPU memory"


def _layout(dp: int) -> Layout:
    return Layout(framework=Framework.DEEPSPEED, dp=dp, zero_stage=3)


def test_a_closer_miss_replaces_the_example_only_as_the_launchers_allow() -> None:
    log = RejectionLog()
    log.add_memory(MISS, 1, _layout(1), 30, 20, runs=lambda: True)
    log.add_memory(MISS, 1, _layout(2), 25, 20, runs=lambda: False)  # closer, cannot run: kept out
    assert (log.groups[MISS].example.dp, log.groups[MISS].per_gpu_bytes, log.groups[MISS].count) == (1, 30, 2)
    log.add_memory(MISS, 1, _layout(4), 28, 20, runs=lambda: True)  # closer and runs
    assert (log.groups[MISS].example.dp, log.groups[MISS].per_gpu_bytes) == (4, 28)
    log.add_memory(MISS, 1, _layout(8), 29, 20, runs=lambda: True)  # runs, farther: no
    assert log.groups[MISS].example.dp == 4

    held = RejectionLog()  # the first example cannot run: any that runs replaces it, even farther
    held.add_memory(MISS, 1, _layout(1), 22, 20, runs=lambda: False)
    held.add_memory(MISS, 1, _layout(2), 21, 20, runs=lambda: False)
    assert held.groups[MISS].example.dp == 2  # closer, neither runs
    held.add_memory(MISS, 1, _layout(4), 30, 20, runs=lambda: True)
    assert (held.groups[MISS].example.dp, held.groups[MISS].example_runs) == (4, True)

    bound = RejectionLog()  # without a predicate (a bound, a search that reads no example): closest
    bound.add_memory(MISS, 1, _layout(1), 30, 20)
    bound.add_memory(MISS, 1, _layout(2), 25, 20)
    assert bound.groups[MISS].example.dp == 2
    asked: list[int] = []  # the predicate is asked only where it decides

    def runs(dp: int) -> bool:
        asked.append(dp)
        return True

    bound.add_memory(MISS, 1, _layout(4), 40, 20, runs=lambda: runs(4))
    assert bound.groups[MISS].example.dp == 4 and asked == [4]  # the held bound's example never runs
    bound.add_memory(MISS, 1, _layout(8), 50, 20, runs=lambda: runs(8))
    assert bound.groups[MISS].example.dp == 4 and asked == [4]  # farther than one that runs: not asked


def test_the_plans_closest_miss_is_one_a_launcher_runs() -> None:
    """Llama-3.1-70B QLoRA on 4 x L4 (seq 4096): FSDP with context parallelism 2 misses by the least
    (1.3 GiB), but no launcher runs QLoRA with CP (Accelerate's CP is FSDP2's, which breaks NF4
    weights); the example shown is the closest miss that runs (DeepSpeed ZeRO-3, 3.9 GiB over)."""
    spec = model("llama-3.1-70b").spec
    cluster = helpers.cluster("l4-24gb", nodes=1, per_node=4, inter=12.5e9)
    training = TrainingSpec(seq_len=4096, global_batch_size=64, method=Method.QLORA)
    answer = recommend(spec, cluster, training, Constraints(), default_tuning(), with_suggestions=False)
    assert answer.recommended is None
    (miss,) = [r for r in answer.rejected if r.reason == MISS]
    shown = miss.example
    trained = for_gpu(training, cluster.gpu, spec)  # the training the search ran: the GPU's defaults resolved
    plan = Plan(model=spec, cluster=cluster, training=trained, layout=shown)
    assert runnable_targets(plan, first_only=True)[0], shown
    closer = Layout(framework=Framework.FSDP, dp=2, cp=2, zero_stage=3, recompute=Recompute.FULL)
    job = make_job(spec, cluster, trained, default_tuning())
    need, _, _ = evaluate.memory_numbers(job, closer)
    assert miss.allowed_bytes is not None and miss.per_gpu_bytes is not None
    assert miss.allowed_bytes < need < miss.per_gpu_bytes  # a closer miss exists, and cannot run
    assert not runnable_targets(Plan(model=spec, cluster=cluster, training=job.training, layout=closer))[0]


def test_a_suggestion_on_fewer_gpus_than_given_says_how_many_it_uses() -> None:
    """A suggestion's re-plan may fit on fewer GPUs than the cluster has (the throughput objective
    falls back to fewer when none of all fits): it said "fits on the 4 GPUs given" with a layout of 2."""
    from service.recommender.suggest import _on_the_gpus_given

    spec, training = model("llama-3.2-1b").spec, TrainingSpec(seq_len=2048, global_batch_size=16)
    two = helpers.cluster("h100-sxm-80gb", nodes=1, per_node=2)
    found = recommend(
        spec, two, training, Constraints(), default_tuning(), with_suggestions=False
    ).recommended
    assert found is not None and found.layout.world_size == 2
    four = helpers.cluster("h100-sxm-80gb", nodes=1, per_node=4)
    said = _on_the_gpus_given("lora", "lora (rank 16)", four, found, training)
    assert "fits on 2 of the 4 GPUs given" in said.detail and said.num_gpus == 2, said.detail
    assert "fits on the 2 GPUs given" in _on_the_gpus_given("lora", "lora", two, found, training).detail
