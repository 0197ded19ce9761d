"""DeepSpeed-Ulysses context parallelism (DeepSpeed's ``ulysses_context_parallel`` capability): four
all-to-alls per attention (q, k, v in, the output back), reversed in the backward and repeated by a
recomputed forward, none hidden; by hand on a GQA model."""

from __future__ import annotations

import dataclasses

import pytest

from service.catalog.tuning import default_tuning
from service.estimator import comm, step_time
from service.estimator.job import prepare
from service.estimator.types import Attention, Framework, Layout, Precision, Recompute, TrainingSpec
from validation.cases import H100, gpt, gpu_cluster

# 32 layers, h 4096, 32 query heads of 128 sharing 8 K/V heads: q and the output 4096 wide, k and v 1024
GQA = dataclasses.replace(gpt(32, 4096, 32, 32000), num_kv_heads=8)


def _cp_s(recompute: Recompute, framework: Framework = Framework.DEEPSPEED) -> tuple[float, float]:
    training = TrainingSpec(
        seq_len=16384, global_batch_size=4, attention=Attention.SDPA, precision=Precision.BF16
    )
    job = prepare(GQA, gpu_cluster(H100, 8, 50e9), training, default_tuning())
    layout = Layout(framework=framework, dp=4, cp=2, zero_stage=1, micro_batch_size=1, recompute=recompute)
    base = step_time.step_base(job, layout)
    # 8,192 local tokens; bf16: 2 bytes per element; one all-to-all per tensor over the 2 CP ranks
    one_pass = sum(
        comm.group_all_to_all_s(8192 * width * 2, base.links.cp) for width in (4096, 1024, 1024, 4096)
    )
    return step_time.cp_comm_s(job, layout, base), base.micro_batches * 32 * one_pass


def test_four_all_to_alls_a_pass_forward_and_backward() -> None:
    ours, one_pass_every_layer = _cp_s(Recompute.NONE)
    assert ours == pytest.approx(2 * one_pass_every_layer, rel=1e-12)


def test_a_recomputed_forward_repeats_them() -> None:
    ours, one_pass_every_layer = _cp_s(Recompute.FULL)
    assert ours == pytest.approx(3 * one_pass_every_layer, rel=1e-12)


def test_ring_frameworks_hide_what_ulysses_cannot() -> None:
    # the same split as a ring (Megatron's P2P) hides its K/V sends under attention on NVLink
    ulysses, _ = _cp_s(Recompute.NONE)
    ring, _ = _cp_s(Recompute.NONE, Framework.MEGATRON)
    assert ring < ulysses
