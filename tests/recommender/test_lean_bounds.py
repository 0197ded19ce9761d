"""The bounds a fewest-GPU search prunes structures with are lower bounds (issue 26's speed work):
a structure whose leanest layouts fit nothing is never searched, and after the most sharded and
offloaded sharding's lean layout misses, the framework's other shardings are skipped when the
model states it holds plus the sharding-free parts exceed the limit. Both are exact only if model
states never grow with more sharding or offload, and the activations' parts are the same for every
sharding: checked here over presets, methods, GPU counts and every structure, rank by rank."""

from __future__ import annotations

import pytest

from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator import evaluate
from service.estimator.errors import EstimatorError
from service.estimator.job import make_job
from service.estimator.memory import (
    min_state_bytes_per_gpu,
    most_model_states_bytes,
    stage_activations,
    stage_states,
)
from service.estimator.types import Framework, Layout, Method, Optimizer, Precision, Recompute, TrainingSpec
from service.estimator.validate import FRAMEWORK_CAPABILITIES, training_violation
from service.frameworks import sequence_parallel_default
from service.recommender import _leanest_states_exceed
from service.recommender.space import (
    OffloadDevices,
    RejectionLog,
    make_layout,
    micro_batch_sizes,
    recompute_order,
    shardings,
    structures,
)
from tests.recommender.helpers import cluster

ANY_OFFLOAD = OffloadDevices(cpu=True, nvme=True)
NO_OFFLOAD = OffloadDevices(cpu=False, nvme=False)
CASES = [
    ("llama-3-8b", 1, Method.FULL),
    ("llama-3-70b", 2, Method.FULL),
    ("llama-3-70b", 1, Method.LORA),
    ("mixtral-8x7b", 2, Method.FULL),
    ("mixtral-8x7b", 1, Method.QLORA),
    ("deepseek-v2-lite", 1, Method.FULL),
]


@pytest.mark.parametrize(("name", "nodes", "method"), CASES)
@pytest.mark.parametrize("offload", [NO_OFFLOAD, ANY_OFFLOAD], ids=["no-offload", "offload"])
def test_states_never_grow_with_sharding_and_the_bound_never_exceeds_a_leans_memory(
    name: str, nodes: int, method: Method, offload: OffloadDevices
) -> None:
    spec = model(name).spec
    c = cluster(nodes=nodes, host_gib=2048 if offload.cpu else 0)
    training = TrainingSpec(seq_len=4096, global_batch_size=256, method=method)
    job = make_job(spec, c, training, default_tuning())
    checked = 0
    for s in structures(spec, c, training, c.world_size, RejectionLog()):
        for framework in Framework:
            caps = FRAMEWORK_CAPABILITIES[framework]
            if training_violation(spec, c, Layout(framework=framework), training, caps) is not None:
                continue
            options, _ = shardings(framework, s, offload)
            sizes = micro_batch_sizes(training, s, 1, sequence_parallel_default(framework, s.tp), framework)
            if not options or not sizes:
                continue
            ordered = options[::-1]
            leans = [
                make_layout(
                    s,
                    sh,
                    recompute_order(framework)[-1],
                    1,
                    sizes[0],
                    job.cluster.gpu.peer_to_peer,
                    seq_len=job.training.seq_len,
                )
                for sh in ordered
            ]
            try:
                first_states = stage_states(job, leans[0])
                first_acts = stage_activations(job, leans[0])
            except EstimatorError:  # an invalid lean is no bound: the search never reaches the check
                continue
            memories = []
            for lean in leans:
                try:
                    states, acts = stage_states(job, lean), stage_activations(job, lean)
                    memories.append(evaluate.memory_numbers(job, lean)[0])
                except EstimatorError:
                    continue
                assert acts == first_acts, (s, framework)
                # the lean check's states-only bound is the most-loaded rank's states, computed alone, with
                # what Megatron's step holds beside them (its fp32 copy of the main grads: the whole
                # optimizer temporary of a Megatron rank)
                step = lean.framework is Framework.MEGATRON
                most = max(
                    r.states.parameters + r.states.gradients + r.states.optimizer_states
                    + (r.optimizer_temporary if step else 0.0)
                    for r in states
                )  # fmt: skip
                assert most_model_states_bytes(job, lean) == pytest.approx(most, rel=1e-12), (s, lean)
                for mine, least in zip(states, first_states, strict=True):
                    held = mine.parameters + mine.gradients + mine.optimizer_states
                    assert held >= least.parameters + least.gradients + least.optimizer_states, (s, lean)
            # the bound at the smallest of these memories' limit never says "none fits" wrongly
            if memories:
                smallest = min(memories)
                assert not _leanest_states_exceed(job, leans[0], ordered, smallest), (s, framework)
                assert _leanest_states_exceed(job, leans[0], ordered, 0)  # and it does bound
                checked += 1
    # QLoRA: data-parallel splits only (and no DeepSpeed with cp > 1, which no launcher runs)
    assert checked > (4 if method is Method.QLORA else 20)


@pytest.mark.parametrize(
    ("name", "gpus"),
    # (the 405B's sweep on 40 GB A100s and L4s, since Megatron's distributed optimizer runs
    # precision-aware, reaches no sharding the bound rules out: 90 evaluations either way)
    [("llama-3.1-70b", ("a100-sxm-40gb", "l4-24gb")), ("mixtral-8x7b", ("rtx-4090-24gb", "a10-24gb"))],
)
def test_capacity_with_the_bound_answers_as_without_it_with_fewer_evaluations(
    name: str, gpus: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two methods, one answer: the sweep with the sharding bound, and without it (every sharding's
    lean layout evaluated), give the same options; the bound only saves evaluations."""
    import service.recommender as recommender
    from service.catalog.gpus import gpu
    from service.recommender.capacity import capacity

    training = TrainingSpec(seq_len=4096, global_batch_size=1024, tokens=10**12)
    types = [gpu(g) for g in gpus]

    def run() -> list[tuple[object, ...]]:
        options = capacity(model(name).spec, training, default_tuning(), gpus=types)
        return [(o.gpu, o.fits, o.min_gpus, o.layout, o.tokens_per_s, o.evaluations) for o in options]

    bounded = run()
    monkeypatch.setattr(recommender, "_leanest_states_exceed", lambda *args: False)
    unbounded = run()
    assert [o[:5] for o in bounded] == [o[:5] for o in unbounded]
    assert sum(o[5] for o in bounded) < sum(o[5] for o in unbounded)


@pytest.mark.parametrize("framework", list(Framework))
@pytest.mark.parametrize("precision", [p for p in Precision if p is not Precision.TF32])
@pytest.mark.parametrize("optimizer", list(Optimizer))
def test_the_count_bound_is_the_fully_sharded_states_of_each_framework(
    framework: Framework, precision: Precision, optimizer: Optimizer
) -> None:
    """``min_state_bytes_per_gpu`` (the bound that cuts a GPU count before any search, and names
    what 'the model states alone' need) is never above what the framework's most sharded layout
    holds, and equals ZeRO-3 / FULL_SHARD's. FSDP's bound once counted the 16-bit weights beside its
    fp32 master, which FSDP does not keep: 73.9 GiB for Llama-3-70B on 16 GPUs that hold 65.7."""
    spec = model("llama-3-70b").spec
    c = cluster(nodes=2)
    training = TrainingSpec(seq_len=4096, global_batch_size=64, precision=precision, optimizer=optimizer)
    job = make_job(spec, c, training, default_tuning())
    stage = 1 if framework is Framework.MEGATRON else 3
    layout = Layout(framework=framework, dp=16, zero_stage=stage, recompute=Recompute.FULL)
    held = max(s.parameters + s.gradients + s.optimizer_states for s in stage_states(job, layout))
    bound = min_state_bytes_per_gpu(job, framework, 16)
    assert bound <= held
    flat = framework is Framework.DEEPSPEED and optimizer is Optimizer.ADAFACTOR
    if framework is not Framework.MEGATRON and precision is not Precision.FP8 and not flat:
        assert held - bound <= 16  # whole bytes of rounding: the same states, fully sharded
    if flat:
        # DeepSpeed's ZeRO partitions give Adafactor a whole second moment; its ZeRO-0 split by tp steps
        # shaped tensors, factored, and may hold less (fp32 at tp 8: a change review), so the bound
        # keeps the factored moment
        split = Layout(framework=framework, dp=2, tp=8, zero_stage=0, recompute=Recompute.FULL)
        assert bound <= max(s.parameters + s.gradients + s.optimizer_states for s in stage_states(job, split))


@pytest.mark.parametrize(
    ("name", "method", "gpus"),
    [
        ("mixtral-8x7b", Method.FULL, ("rtx-4090-24gb", "a100-sxm-40gb")),
        ("deepseek-v2-lite", Method.LORA, ("l4-24gb", "h100-sxm-80gb")),
    ],
)
def test_capacity_asking_states_before_rules_answers_as_rules_first(
    name: str, method: Method, gpus: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lean check asks a sharding's model states before its rules (``_states_exceed``: states
    read the sharding alone, so a miss holds for every member, valid or not). Two methods, one
    answer: with that check off, every lean layout is validated and then evaluated in full, and the
    options agree."""
    import service.recommender as recommender
    from service.catalog.gpus import gpu
    from service.recommender.capacity import capacity

    training = TrainingSpec(seq_len=4096, global_batch_size=256, method=method, tokens=10**11)
    types = [gpu(g) for g in gpus]

    def run() -> list[tuple[object, ...]]:
        options = capacity(model(name).spec, training, default_tuning(), gpus=types)
        return [(o.gpu, o.fits, o.min_gpus, o.layout, o.tokens_per_s, o.evaluations) for o in options]

    asked: list[bool] = []
    states_exceed = recommender._states_exceed

    def counted(*args: object) -> bool:
        asked.append(states_exceed(*args))  # type: ignore[arg-type]
        return asked[-1]

    monkeypatch.setattr(recommender, "_states_exceed", counted)
    states_first = run()
    assert any(asked)  # the check cut something
    monkeypatch.setattr(recommender, "_states_exceed", lambda *args: False)
    rules_first = run()
    assert [o[:5] for o in states_first] == [o[:5] for o in rules_first]
