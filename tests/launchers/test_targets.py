"""Per-target rules, computed by hand for small plans."""

from __future__ import annotations

from dataclasses import replace

import pytest

from service.estimator.types import Framework, Offload, Recompute
from service.launchers import Target, Unsupported, accelerate, deepspeed, megatron, torchtitan
from tests.launchers.factories import llama3_8b, plan, small_llama


def test_deepspeed_batch_uses_data_parallel_size() -> None:
    # 2 nodes x 8 = 16 GPUs, tp=2 -> dp=8; 256 = micro 2 x accumulation 16 x dp 8.
    config = deepspeed.ds_config(
        plan(nodes=2, framework=Framework.DEEPSPEED, tp=2, micro_batch_size=2, zero_stage=1)
    )
    assert (config["train_batch_size"], config["gradient_accumulation_steps"]) == (256, 16)
    assert config["tensor_parallel"] == {"autotp_size": 2}


@pytest.mark.parametrize(
    ("layout", "words"),
    [
        ({"zero_stage": 3, "pp": 2}, "incompatible with pipeline"),
        ({"zero_stage": 2, "offload_params": Offload.CPU, "offload_optimizer": Offload.CPU}, "stage 3"),
        ({"zero_stage": 2, "offload_optimizer": Offload.NVME}, "NVMe"),
        ({"zero_stage": 1, "cp": 2}, "context parallelism"),
    ],
)
def test_deepspeed_refuses_what_it_would_ignore_or_reject(layout: dict[str, object], words: str) -> None:
    with pytest.raises(Unsupported, match=words) as info:
        deepspeed.render(plan(framework=Framework.DEEPSPEED, **layout))
    assert info.value.target is Target.DEEPSPEED


def test_deepspeed_offload_param_only_at_stage_3() -> None:
    zero = deepspeed.zero_block(
        plan(
            framework=Framework.DEEPSPEED,
            zero_stage=3,
            offload_params=Offload.NVME,
            offload_optimizer=Offload.NVME,
        )
    )
    assert zero["offload_param"]["nvme_path"] and zero["offload_optimizer"]["device"] == "nvme"


def test_accelerate_fsdp2_reshard_flag_is_the_zero_stage() -> None:
    z2 = accelerate.accelerate_config(plan(framework=Framework.FSDP, zero_stage=2))
    z3 = accelerate.accelerate_config(plan(framework=Framework.FSDP, zero_stage=3))
    assert z2["fsdp_config"]["fsdp_reshard_after_forward"] is False
    assert z3["fsdp_config"]["fsdp_reshard_after_forward"] is True


def test_megatron_full_recompute_names_method_and_layers() -> None:
    args = megatron.megatron_args(plan(framework=Framework.MEGATRON, tp=2, recompute=Recompute.FULL))
    at = args.index("--recompute-granularity")
    assert args[at : at + 6] == ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                 "--recompute-num-layers", "1"]  # fmt: skip
    assert megatron.environment(plan(framework=Framework.MEGATRON, tp=2)) == [
        ("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    ]


def test_megatron_refuses_uneven_pipeline() -> None:
    with pytest.raises(Unsupported, match="num_layers"):
        megatron.megatron_args(
            plan(model=replace(small_llama(), num_layers=18), framework=Framework.MEGATRON, pp=4)
        )


def test_torchtitan_pipeline_batch_accounting() -> None:
    # 1 node, pp=2 -> dp=4; 256 = micro 1 x 64 microbatches x dp 4; local batch = 64.
    args = torchtitan.train_args(plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3, pp=2))
    assert args[args.index("--training.local_batch_size") + 1] == "64"
    assert "--training.disable_cuda_graphs" in args and args[-1] == "activation_checkpoint:none"
