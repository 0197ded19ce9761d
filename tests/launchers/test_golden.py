"""Golden files for representative plans, reviewed by hand.

Regenerate after an intended change with ``UPDATE_GOLDEN=1 pytest tests/launchers`` and review
the diff of tests/launchers/golden/ before committing it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.estimator.types import Framework, Offload, Plan, Precision, Recompute
from service.launchers import Target, render
from tests.launchers.checks import check_artifact
from tests.launchers.factories import llama3_8b, plan, training

GOLDEN = Path(__file__).parent / "golden"


def cases() -> dict[str, Plan]:
    return {
        # ZeRO-3 with CPU optimizer and parameter offload, full recompute, 2 nodes of pure DP.
        "deepspeed_zero3_offload_2nodes": plan(
            nodes=2,
            framework=Framework.DEEPSPEED,
            zero_stage=3,
            offload_optimizer=Offload.CPU,
            offload_params=Offload.CPU,
            recompute=Recompute.FULL,
            micro_batch_size=2,
            overlap_grad_reduce=True,
        ),
        # Megatron TP2 x PP2 with interleaving, sequence parallel, distributed optimizer, TP and DP
        # communication overlap (as the recommender sets them), 1 node.
        "megatron_tp2_pp2_vpp2_1node": plan(
            framework=Framework.MEGATRON,
            tp=2,
            pp=2,
            sequence_parallel=True,
            virtual_pipeline_stages=2,
            zero_stage=1,
            recompute=Recompute.SELECTIVE,
            tp_comm_overlap=True,
            overlap_grad_reduce=True,
        ),
        # FSDP2 + TP2 on Llama-3.1-8B over 4 nodes with hybrid sharding (torchtitan, slurm, k8s).
        "fsdp_llama8b_tp2_hsdp_4nodes": plan(
            nodes=4,
            model=llama3_8b(),
            train=training(seq_len=8192, global_batch_size=512, tokens=10**10),
            framework=Framework.FSDP,
            tp=2,
            sequence_parallel=True,
            zero_stage=3,
            fsdp_hybrid_shard=True,
            recompute=Recompute.FULL,
        ),
        # SHARD_GRAD_OP on one node, fp16, small model: Accelerate and HF Trainer FSDP configs.
        "fsdp_zero2_fp16_1node": plan(
            framework=Framework.FSDP,
            zero_stage=2,
            train=training(precision=Precision.FP16),
            micro_batch_size=4,
        ),
    }


@pytest.mark.parametrize("case", sorted(cases()))
def test_golden(case: str) -> None:
    p = cases()[case]
    artifacts, unsupported = render(p)
    directory = GOLDEN / case
    files = {a.name: a.content for a in artifacts}
    files["unsupported.txt"] = "".join(f"{t}: {r}\n" for t, r in sorted(unsupported.items()))
    if os.environ.get("UPDATE_GOLDEN"):
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.iterdir():
            old.unlink()
        for name, content in files.items():
            (directory / name).write_text(content)
    expected = {f.name: f.read_text() for f in directory.iterdir()}
    assert sorted(files) == sorted(expected)
    for name, content in files.items():
        assert content == expected[name], f"{case}/{name} differs; UPDATE_GOLDEN=1 to regenerate"
    for artifact in artifacts:
        check_artifact(artifact, p)


def test_golden_cases_cover_every_target() -> None:
    covered = set()
    for p in cases().values():
        artifacts, _ = render(p)
        covered |= {a.target for a in artifacts}
    assert covered == set(Target)
