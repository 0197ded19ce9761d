"""HSDP as each launcher runs it (hybrid-sharding review): Accelerate's ParallelismConfig refuses
context parallelism beside pure replication, so its target refuses that layout rather than render a
file that does not start; the HF Trainer's refusal says why it renders no HSDP (no ParallelismConfig),
not that FSDP2 has none."""

from __future__ import annotations

from service.estimator.types import Framework
from service.launchers import accelerate, hf_trainer
from tests.launchers.factories import llama3_8b, plan, training


def test_accelerate_refuses_cp_beside_pure_replication_and_runs_it_beside_a_shard() -> None:
    train = training(seq_len=8192, global_batch_size=64)
    pure = plan(nodes=1, model=llama3_8b(), train=train, framework=Framework.FSDP, zero_stage=3,
                fsdp_hybrid_shard=True, dp_replicate=4, dp=4, cp=2)  # fmt: skip
    why = accelerate.refusal(pure)
    assert why is not None and "dp_shard_size 1" in why
    sharded = plan(nodes=1, model=llama3_8b(), train=train, framework=Framework.FSDP, zero_stage=3,
                   fsdp_hybrid_shard=True, dp_replicate=2, dp=4, cp=2)  # fmt: skip
    assert accelerate.refusal(sharded) is None


def test_the_hf_trainer_says_it_renders_no_parallelism_config_for_hsdp() -> None:
    hsdp = plan(nodes=4, model=llama3_8b(), train=training(), framework=Framework.FSDP, dp=32, zero_stage=3,
                fsdp_hybrid_shard=True)  # fmt: skip
    why = hf_trainer.refusal(hsdp)
    assert why is not None and "ParallelismConfig" in why and "FSDP1-only" not in why
