"""Candidate generation rules: the structures, shardings, interleavings and micro-batches the search
tries."""

from __future__ import annotations

import dataclasses

import pytest

from service.catalog.models import model
from service.estimator import validate
from service.estimator.errors import InvalidLayout
from service.estimator.types import (
    Attention,
    Framework,
    Layout,
    Method,
    Offload,
    Recompute,
    TrainingSpec,
)
from service.estimator.validate import divisors, validate_layout
from service.recommender import space
from service.recommender.space import (
    OffloadDevices,
    RejectionLog,
    Structure,
    gpu_counts,
    make_layout,
    micro_batch_sizes,
    offload_devices,
    shardings,
    structures,
    virtual_stages,
)
from tests.recommender.helpers import cluster


def test_divisors() -> None:
    assert divisors(12) == (1, 2, 3, 4, 6, 12)
    assert divisors(1) == (1,)


def test_gpu_counts_are_node_multiples_past_one_node() -> None:
    counts = gpu_counts(cluster(nodes=4))
    assert counts == (1, 2, 4, 8, 16, 24, 32)
    assert gpu_counts(cluster(nodes=4), max_gpus=20) == (1, 2, 4, 8, 16)
    # a cap inside one node is a count of its own (6 of 8: dp 3 x tp 2), not only the node's divisors
    assert gpu_counts(cluster(nodes=4), max_gpus=6) == (1, 2, 4, 6)


def test_a_split_that_breaks_a_rule_is_logged_by_it_not_as_crossing_nodes() -> None:
    """tp 16 of Llama 3.1 8B's 8 kv heads is invalid (an estimate of it is a 422), so it is not logged
    as a TP that crosses nodes, whose detail says an estimate answers (search optimality review)."""
    log = RejectionLog()
    list(
        structures(
            model("llama-3.1-8b").spec,
            cluster(nodes=2),
            TrainingSpec(seq_len=4096, global_batch_size=32),
            16,
            log,
        )
    )
    assert space.TP_ACROSS_NODES not in log.groups
    assert log.groups["invalid: kv_heads_tp"].example.tp == 16


def test_structures_respect_the_rules() -> None:
    # Llama-3.1-405B: 128 heads, 8 kv heads, 126 layers; 16 nodes of 8
    spec = model("llama-3.1-405b").spec
    training = TrainingSpec(seq_len=8192, global_batch_size=512)
    log = RejectionLog()
    found = list(structures(spec, cluster(nodes=16), training, 128, log))
    assert found
    for s in found:
        assert s.dp * s.tp * s.pp * s.cp == 128
        assert s.tp <= 8 and spec.num_kv_heads % s.tp == 0
        assert training.global_batch_size % s.dp == 0
    # every pp: 126 = 2 x 63 divides by 1 and 2 only, the others split unevenly (Llama 3's 7, 8 x 14,
    # 7 on 16 stages); on 128 stages the first holds only the embedding and the last only the loss
    assert {s.pp for s in found} == {1, 2, 4, 8, 16, 32, 64, 128}
    # tp past the node breaks 405B's 8 kv heads first: logged by that rule, not as crossing nodes
    assert space.TP_ACROSS_NODES not in log.groups and log.groups["invalid: kv_heads_tp"].count > 0
    small = list(structures(dataclasses.replace(spec, num_layers=60), cluster(nodes=16), training, 128, log))
    assert max(s.pp for s in small) == 32  # 62 units do not cover 64 stages (pp > layers: not logged)


def test_structures_of_a_huge_cluster_are_bounded_work_with_exact_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # phi-3-mini (32 layers) on 14 million GPUs (2^19 x 27: 80 divisors): pp stops at 34, and a
    # (pp, tp) that breaks a rule (or cp past max_cp) is counted for all its cp at once, not built
    # layout by layout
    import service.recommender.space as space

    built = 0
    real_layout = space.Layout

    def counting_layout(**fields: object) -> object:
        nonlocal built
        built += 1
        return real_layout(**fields)  # type: ignore[arg-type]

    monkeypatch.setattr(space, "Layout", counting_layout)
    spec = model("phi-3-mini").spec
    training = TrainingSpec(seq_len=2048, global_batch_size=64)
    log = RejectionLog()
    gpus = 2**19 * 27
    found = list(structures(spec, cluster(nodes=gpus // 8), training, gpus, log))
    assert all(s.pp <= spec.num_layers + 2 for s in found)
    assert built < 5_000
    # every (pp <= 34, tp, cp) split of the 10M GPUs is either yielded or counted once under a rule
    splits = sum(
        len(divisors(gpus // (pp * tp)))
        for pp in divisors(gpus)
        if pp <= spec.num_layers + 2
        for tp in divisors(gpus // pp)
    )
    logged = sum(group.count for group in log.groups.values())
    assert logged + len(found) == splits - sum(  # pp of 33 or 34 breaking pp_layers is not logged
        len(divisors(gpus // (pp * tp)))
        for pp in divisors(gpus)
        if spec.num_layers < pp <= spec.num_layers + 2
        for tp in divisors(gpus // pp)
        if tp <= 8
    )


def test_node_counts_past_16_are_three_smooth() -> None:
    from service.recommender.space import three_smooth_up_to

    assert sorted(three_smooth_up_to(20)) == [1, 2, 3, 4, 6, 8, 9, 12, 16, 18]
    counts = gpu_counts(cluster(nodes=1_000_000))
    assert len(counts) < 300 and counts[-1] == 8_000_000


NO_OFFLOAD, ANY_OFFLOAD = OffloadDevices(cpu=False, nvme=False), OffloadDevices(cpu=True, nvme=True)


def test_offload_only_to_memory_the_cluster_states() -> None:
    stated = dataclasses.replace(cluster(), cpu_memory_bytes_per_node=2**40)
    assert offload_devices(True, cluster()) == NO_OFFLOAD  # host RAM and NVMe unstated
    assert offload_devices(True, stated) == OffloadDevices(cpu=True, nvme=False)
    assert offload_devices(False, stated) == NO_OFFLOAD
    one_gpu = Structure(gpus=1, dp=1, tp=1, pp=1, cp=1, ep=1)
    # one GPU: ZeRO shards over nothing, but ZeRO-Offload / FSDP CPU offload still move the optimizer
    deepspeed, _ = shardings(Framework.DEEPSPEED, one_gpu, OffloadDevices(cpu=True, nvme=False))
    assert {(sh.zero_stage, sh.offload_optimizer) for sh in deepspeed if sh.zero_stage} == {
        (1, Offload.CPU),
        (2, Offload.CPU),
        (3, Offload.CPU),
    }
    assert all(sh.offload_optimizer is not Offload.NVME for sh in deepspeed)
    assert {sh.zero_stage for sh in shardings(Framework.DEEPSPEED, one_gpu, NO_OFFLOAD)[0]} == {0}


def test_shardings_follow_the_capability_table() -> None:
    s = Structure(gpus=16, dp=2, tp=4, pp=2, cp=1, ep=1)
    megatron, missing = shardings(Framework.MEGATRON, s, NO_OFFLOAD)
    assert {sh.zero_stage for sh in megatron} == {0, 1}
    assert "megatron zero_stage 3: Megatron-FSDP (--use-megatron-fsdp) is not modelled" in missing
    piped = Structure(gpus=16, dp=8, tp=1, pp=2, cp=1, ep=1)
    deepspeed, missing = shardings(Framework.DEEPSPEED, piped, NO_OFFLOAD)
    assert {sh.zero_stage for sh in deepspeed} == {0, 1}  # ZeRO-2/3 are incompatible with PP
    assert "deepspeed does not support zero_stage 2 with pp > 1" in missing
    # AutoTP does not join the pipeline engine, and DeepSpeed's Ulysses runs (through Accelerate's
    # ALST) with nothing else split
    job = (model("llama-2-7b").spec, TrainingSpec(seq_len=4096, global_batch_size=64))
    for split in (s, Structure(gpus=16, dp=4, tp=2, pp=1, cp=2, ep=1)):
        assert shardings(Framework.DEEPSPEED, split, NO_OFFLOAD)[0]  # the validator's rules alone
        deepspeed, missing = shardings(Framework.DEEPSPEED, split, NO_OFFLOAD, job=job)
        assert deepspeed == [] and len(missing) == 1 and "no launcher runs deepspeed" in missing[0]
    ulysses = Structure(gpus=16, dp=8, tp=1, pp=1, cp=2, ep=1)
    assert shardings(Framework.DEEPSPEED, ulysses, NO_OFFLOAD, job=job)[0]
    fsdp, _ = shardings(Framework.FSDP, Structure(gpus=8, dp=8, tp=1, pp=1, cp=1, ep=1), ANY_OFFLOAD)
    # FSDP offloads parameters and optimizer together, FULL_SHARD only
    assert all(sh.offload_params is sh.offload_optimizer for sh in fsdp)
    assert {sh.zero_stage for sh in fsdp if sh.offloads} == {3}


def test_structures_fold_experts_over_tp_for_megatron_only() -> None:
    # Mixtral (8 experts) on 16 GPUs: with etp 1 the experts spread over tp x dp x cp, so ep 8 is
    # tried where dp x cp = 2 alone would allow ep 2 at most; only Megatron has that option
    spec, c = model("mixtral-8x7b").spec, cluster(nodes=2)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    found = list(structures(spec, c, training, 16, RejectionLog()))
    folded = [s for s in found if s.etp == 1]
    assert folded and all(s.tp > 1 for s in folded)
    assert any(s.ep > s.dp * s.cp for s in folded)
    assert not any(s.ep > s.dp * s.cp for s in found if s.etp is None)
    for framework in (Framework.FSDP, Framework.DEEPSPEED):
        assert shardings(framework, folded[0], ANY_OFFLOAD) == ([], [])
    assert shardings(Framework.MEGATRON, folded[0], ANY_OFFLOAD)[0]


def test_structures_keep_tp_at_ep_1_for_the_frameworks_that_split_experts_over_tp() -> None:
    # the splits were asked with DeepSpeed's rules, whose AutoTP leaves fused experts whole at ep 1:
    # tp > 1 at ep 1 was dropped for every framework, Megatron's and torchtitan's tp 2 of Mixtral
    # never searched (latency review); the framework's own rules are its shardings'
    spec, c = model("mixtral-8x7b").spec, cluster(nodes=2)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    found = list(structures(spec, c, training, 16, RejectionLog()))
    assert any(s.tp == 2 and s.ep == 1 and s.etp is None for s in found)


def test_expert_options_are_the_validators_on_every_split() -> None:
    # the split's own rule (the expert grid etp x ep divides tp x dp x cp) in arithmetic, the others
    # asked once per tp: the same pairs as the validator on each split, without a layout per divisor
    # of the experts (3,360 experts over 221,760 GPUs took 5.5 s before any evaluation: latency review)
    spec = dataclasses.replace(
        model("mixtral-8x7b").spec, moe=dataclasses.replace(model("mixtral-8x7b").spec.moe, num_experts=24)
    )
    for dp, tp, cp in [(1, 1, 1), (3, 2, 1), (4, 4, 2), (6, 8, 1), (5, 2, 3), (24, 1, 1)]:
        expected = tuple(
            (e, etp)
            for etp in ((None, 1) if tp > 1 else (None,))
            for e in divisors(24)
            if validate.expert_violation(
                spec, Layout(framework=Framework.MEGATRON, dp=dp, tp=tp, cp=cp, ep=e, etp=etp)
            )
            is None
        )
        assert space._ep_options(spec, dp, tp, cp) == expected, (dp, tp, cp)


def test_interleaving_and_micro_batches() -> None:
    spec = model("llama-2-7b").spec  # 32 layers
    assert virtual_stages(spec, Framework.DEEPSPEED, 4) == (1,)
    assert virtual_stages(spec, Framework.MEGATRON, 4) == (1, 2, 4, 8)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    s = Structure(gpus=16, dp=4, tp=1, pp=4, cp=1, ep=1)
    assert micro_batch_sizes(training, s, 1, False, Framework.MEGATRON) == (1, 2, 4, 8, 16)
    assert micro_batch_sizes(training, s, 2, False, Framework.MEGATRON) == (
        1,
        2,
        4,
    )  # 16 / b micro-batches % pp == 0


@pytest.mark.parametrize(
    ("name", "nodes", "training"),
    [
        ("llama-2-7b", 1, TrainingSpec(seq_len=4096, global_batch_size=256)),
        ("mixtral-8x7b", 2, TrainingSpec(seq_len=4096, global_batch_size=64)),
        ("llama-3-8b", 2, TrainingSpec(seq_len=8192, global_batch_size=64, method=Method.LORA)),
        ("llama-2-13b", 2, TrainingSpec(seq_len=2048, global_batch_size=64, attention=Attention.EAGER)),
    ],
)
def test_the_sharding_does_not_change_a_familys_validity(
    name: str, nodes: int, training: TrainingSpec
) -> None:
    # recommender._dominated caches whether a family's optimistic layout (no recompute, largest
    # micro-batch) is valid per (structure, framework, interleaving): shardings() must only yield
    # what the framework allows, whatever the structure.
    spec, c = model(name).spec, cluster(nodes=nodes)
    for s in structures(spec, c, training, c.world_size, RejectionLog()):
        for framework in Framework:
            options, _ = shardings(framework, s, ANY_OFFLOAD)
            for virtual in virtual_stages(spec, framework, s.pp):
                sizes = micro_batch_sizes(training, s, virtual, s.tp > 1, framework)
                if not sizes:
                    continue
                verdicts = set()
                for sh in options:
                    try:
                        validate_layout(
                            spec,
                            c,
                            make_layout(
                                s,
                                sh,
                                Recompute.NONE,
                                virtual,
                                sizes[-1],
                                c.gpu.peer_to_peer,
                                seq_len=training.seq_len,
                            ),
                            training,
                        )
                        verdicts.add("valid")
                    except InvalidLayout as error:
                        verdicts.add(f"invalid: {error.rule}")
                assert len(verdicts) <= 1, (s, framework, virtual, verdicts)


def test_the_longest_sequences_search_context_parallelism_past_32() -> None:
    """At 4,194,304 tokens (the longest a request may give) cp stopped at 32, so Llama 3.1 405B needed
    98,304 H100s where cp 64 fits on 4,096 (boundary review): each cp rank keeps 32,768 tokens at least."""
    assert [space.max_cp(s) for s in (4096, 1_048_576, 2_097_152, 4_194_304)] == [32, 32, 64, 128]
    spec = model("llama-3.1-405b").spec
    training = TrainingSpec(seq_len=4_194_304, global_batch_size=256)
    log = RejectionLog()
    found = list(structures(spec, cluster(nodes=512), training, 4096, log))
    assert any(s.cp == 64 and s.tp == 8 and s.pp == 8 for s in found)
    assert space.largest_world(spec, cluster(nodes=512), training) >= 256 * 8 * 128 * 128
