"""Every launch file trains the optimizer the plan was estimated with (consistency review, stop 39).

Megatron-LM's files wrote no --optimizer (its default is Adam) and torchtitan builds Adam/AdamW only,
so a plan (Llama 3 8B, 2 H100) fitted with Adafactor's or 8-bit AdamW's few bytes of states (70 GiB
on an 80 GiB H100) ran Adam's 12 (100 GiB): an OOM from a file the plan said fits."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

TRAINING = {"seq_len": 4096, "global_batch_size": 64, "precision": "bf16"}
CLUSTER = {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 2}


def plan(
    client: TestClient, optimizer: str, framework: str, launcher: str, cluster: dict[str, Any] = CLUSTER
) -> tuple[int, Any]:
    response = client.post(
        "/v1/plans",
        json={
            "model": {"preset": "llama-3.1-8b"},
            "cluster": cluster,
            "training": {**TRAINING, "optimizer": optimizer},
            "constraints": {"frameworks": [framework]},
            "launchers": [launcher],
        },
    )
    return response.status_code, response.json()


def launch_file(client: TestClient, result: dict[str, Any], name: str) -> str:
    response = client.get(f"/v1/plans/{result['id']}/artifacts/{name}")
    assert response.status_code == 200, response.text
    return response.text


@pytest.mark.parametrize("optimizer", ["adafactor", "adamw_8bit"])
def test_megatron_and_torchtitan_refuse_an_optimizer_they_do_not_have(
    client: TestClient, optimizer: str
) -> None:
    for framework, launcher, says in (
        ("megatron", "megatron", "megatron trains with adamw, lion, sgd"),
        ("fsdp", "torchtitan", "torchtitan 0.3.0 builds Adam or AdamW only"),
    ):
        status, body = plan(client, optimizer, framework, launcher)
        assert status == 422, (framework, body)
        assert says in str(body), body


@pytest.mark.parametrize("optimizer,flag", [("adamw", "adam"), ("sgd", "sgd"), ("lion", "lion")])
def test_megatron_writes_the_optimizer_it_was_estimated_with(
    client: TestClient, optimizer: str, flag: str
) -> None:
    # four GPUs: on two, AdamW's 16 B a parameter and the fp32 copy of the bf16 main grads Megatron's
    # step makes (4 B) are 80 GB each
    status, body = plan(client, optimizer, "megatron", "megatron", {**CLUSTER, "gpus_per_node": 4})
    assert status == 201 and body["status"] == "feasible", body
    assert f"--optimizer {flag} " in launch_file(client, body, "megatron_launch.sh")


def test_deepspeed_tells_the_script_which_optimizer_to_build(client: TestClient) -> None:
    status, body = plan(client, "adafactor", "deepspeed", "deepspeed")
    assert status == 201 and body["status"] == "feasible", body
    text = launch_file(client, body, "deepspeed_launch.sh")
    assert "transformers.optimization.Adafactor" in text and "deepspeed.initialize(optimizer=...)" in text
    assert '"optimizer"' not in launch_file(client, body, "ds_config.json")


def test_a_script_optimizer_under_zero_is_allowed_as_untested() -> None:
    """DeepSpeed asserts at deepspeed.initialize that a ZeRO optimizer is one it tested
    (runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS: torch Adam/AdamW/Adagrad, FusedAdam, FusedLion and
    its CPU ones) unless zero_allow_untested_optimizer: SGD, 8-bit Adam and Adafactor from the script
    need it at ZeRO >= 1 (DeepSpeed review: every such plan failed at start-up); its own AdamW not."""
    from service.estimator.types import Framework, Optimizer
    from service.launchers.deepspeed import ds_config
    from tests.launchers.factories import plan as make_plan
    from tests.launchers.factories import training

    for zero in (0, 1, 2, 3):
        for optimizer in Optimizer:
            built = make_plan(
                train=training(optimizer=optimizer), framework=Framework.DEEPSPEED, zero_stage=zero
            )
            config = ds_config(built)
            scripted = optimizer in (Optimizer.SGD, Optimizer.ADAMW_8BIT, Optimizer.ADAFACTOR)
            assert config.get("zero_allow_untested_optimizer", False) is (scripted and zero >= 1), (
                zero,
                optimizer,
            )


def test_bf16_master_weights_offload_with_deepspeeds_cpu_adam_only() -> None:
    """bf16_pure's master weights under optimizer offload: DeepSpeed takes DeepSpeedCPUAdam only
    (stage_1_and_2.py _enforce_cpu_offload, stage3.py _enforce_optimizer_offload); Lion's DeepSpeedCPULion
    is refused there, as the launcher says (DeepSpeed review)."""
    from service.estimator.types import Framework, Offload, Optimizer, Precision
    from service.launchers.deepspeed import engine_refusal
    from tests.launchers.factories import plan as make_plan
    from tests.launchers.factories import training

    for optimizer, refused in ((Optimizer.LION, True), (Optimizer.ADAMW, False)):
        built = make_plan(
            train=training(optimizer=optimizer, precision=Precision.BF16_PURE),
            framework=Framework.DEEPSPEED,
            zero_stage=2,
            offload_optimizer=Offload.CPU,
        )
        reason = engine_refusal(built)
        assert (reason is not None and "DeepSpeedCPUAdam" in reason) is refused, reason


def test_torchtitan_trains_llama_3_only_with_llama_3_1s_rope(client: TestClient) -> None:
    """torchtitan's llama3 flavors apply Llama 3.1's RoPE scaling (ComplexRoPE scaling="llama",
    factor 8): Llama 3 8B, which has none, matched llama3_8b by shape and trained another model."""
    status, body = plan(client, "adamw", "fsdp", "torchtitan")
    assert status == 201 and body["status"] == "feasible", body  # Llama 3.1 8B: its own RoPE
    response = client.post(
        "/v1/plans",
        json={
            "model": {"preset": "llama-3-8b"},
            "cluster": CLUSTER,
            "training": TRAINING,
            "constraints": {"frameworks": ["fsdp"]},
            "launchers": ["torchtitan"],
        },
    )
    assert response.status_code == 422 and "Llama 3.1's RoPE" in response.text, response.text


def test_the_hf_trainer_refuses_sgd_it_would_run_without_momentum() -> None:
    """TrainingArguments' optim "sgd" is torch.optim.SGD from lr and weight decay alone
    (trainer_optimizer.py _get_sgd: no optim_args), no momentum buffer: not the momentum SGD the
    estimate holds 4 B of state for (bytes review). Accelerate's script is told to build it."""
    from service.estimator.types import Framework, Optimizer
    from service.launchers import accelerate, hf_trainer
    from tests.launchers.factories import plan as make_plan
    from tests.launchers.factories import training

    for framework, zero in ((Framework.FSDP, 3), (Framework.DEEPSPEED, 2)):
        sgd = make_plan(train=training(optimizer=Optimizer.SGD), framework=framework, zero_stage=zero)
        reason = hf_trainer.refusal(sgd)
        assert reason is not None and "without momentum" in reason
        assert hf_trainer.refusal(make_plan(train=training(), framework=framework, zero_stage=zero)) is None
    fsdp_sgd = make_plan(train=training(optimizer=Optimizer.SGD), framework=Framework.FSDP, zero_stage=3)
    assert "torch.optim.SGD(momentum=0.9, fused=True)" in accelerate.duties(fsdp_sgd)


def test_8bit_adam_runs_where_bitsandbytes_steps_the_parameters() -> None:
    """bitsandbytes' 8-bit optimizers do not step FSDP's sharded parameters (its issues #1633, #89,
    open): the HF Trainer and Accelerate refuse them at zero_stage >= 2, run them on DDP and DeepSpeed;
    Accelerate's script keeps the embedding tables' states in 32 bits, as the Trainer does and the
    estimate counts (fine-tuner review)."""
    from service.estimator.types import Framework, Optimizer
    from service.launchers import accelerate, hf_trainer
    from tests.launchers.factories import plan as make_plan
    from tests.launchers.factories import training

    eight_bit = training(optimizer=Optimizer.ADAMW_8BIT)
    sharded = make_plan(train=eight_bit, framework=Framework.FSDP, zero_stage=3)
    for refusal in (hf_trainer.refusal, accelerate.refusal):
        reason = refusal(sharded)
        assert reason is not None and "#1633" in reason, reason
        assert refusal(make_plan(train=eight_bit, framework=Framework.FSDP, zero_stage=0)) is None
        assert refusal(make_plan(train=eight_bit, framework=Framework.DEEPSPEED, zero_stage=2)) is None
    ddp = make_plan(train=eight_bit, framework=Framework.FSDP, zero_stage=0)
    assert "register_module_override(module, 'weight', {'optim_bits': 32})" in accelerate.duties(ddp)


def test_accelerate_hands_deepspeeds_optimizer_a_dummy_and_its_micro_batch() -> None:
    """Accelerate 1.15 (accelerator.py _prepare_deepspeed) raises ValueError where the script passes a
    torch optimizer beside ds_config's optimizer block, and takes train_micro_batch_size_per_gpu from
    ds_config without checking the DataLoader's batch: the launch said neither, so an ordinary script
    failed at prepare() or trained another global batch than estimated (an Accelerate review). A
    script-built optimizer goes to accelerator.prepare, not deepspeed.initialize, under Accelerate."""
    from service.estimator.types import Framework, Optimizer
    from service.launchers import accelerate, deepspeed
    from tests.launchers.factories import plan as make_plan
    from tests.launchers.factories import training

    def header(chosen: object, render: object) -> str:
        files = {a.name: a.content for a in render(chosen)}  # type: ignore[operator]
        return " ".join(next(c for n, c in files.items() if n.endswith("_launch.sh")).split())

    adamw = make_plan(train=training(global_batch_size=64), framework=Framework.DEEPSPEED, zero_stage=3,
                      micro_batch_size=4)  # fmt: skip
    text = header(adamw, accelerate.render)
    assert "accelerate.utils.DummyOptim(model.parameters())" in text, text
    assert "micro-batches of 4 sequences" in text and "a global batch of 64 sequences" in text, text
    assert "DummyOptim" not in header(adamw, deepspeed.render)  # deepspeed.initialize builds it there
    sgd = make_plan(train=training(optimizer=Optimizer.SGD), framework=Framework.DEEPSPEED, zero_stage=2)
    text = header(sgd, accelerate.render)
    assert "accelerator.prepare(model, optimizer, ...)" in text and "deepspeed.initialize" not in text, text
    assert "DummyOptim" not in text
    assert "deepspeed.initialize(optimizer=...)" in header(sgd, deepspeed.render)


def test_8bit_adamw_over_a_zero_partition_past_int32_is_refused_and_not_proposed(client: TestClient) -> None:
    """An optimizer review: Llama 3.1 8B over two ranks at ZeRO-1/2 is a 4.0e9-element flat partition,
    which bitsandbytes' kernels count in an int32 (ct.c_int32(g.numel()) wraps negative): the plan
    rendered it runnable. ZeRO-3's sub-groups (1e9) take it."""
    from service.catalog.models import model as preset
    from service.estimator.types import Framework, Layout, Optimizer, Plan, TrainingSpec
    from service.launchers.deepspeed import engine_refusal
    from validation.cases import H100, gpu_cluster

    training = TrainingSpec(seq_len=4096, global_batch_size=64, optimizer=Optimizer.ADAMW_8BIT)
    spec, two = preset("llama-3.1-8b").spec, gpu_cluster(H100, 2, 5e10)
    for stage, refused in ((1, True), (2, True), (3, False)):
        layout = Layout(framework=Framework.DEEPSPEED, dp=2, zero_stage=stage)
        reason = engine_refusal(Plan(model=spec, cluster=two, training=training, layout=layout))
        assert (reason is not None) == refused, (stage, reason)
        assert not refused or "int32" in str(reason)
    # over eight ranks the partition is 1.0e9: it runs
    eight = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=2)
    assert (
        engine_refusal(Plan(model=spec, cluster=gpu_cluster(H100, 8, 5e10), training=training, layout=eight))
        is None
    )
    # the pipeline's BF16_Optimizer at ZeRO-0 partitions as ZeRO-1 does: two stages of 4e9 over dp 1
    piped = Layout(framework=Framework.DEEPSPEED, dp=1, pp=2, zero_stage=0)
    assert "int32" in str(engine_refusal(Plan(model=spec, cluster=two, training=training, layout=piped)))
    # the plan proposes a layout whose 8-bit step runs: none of those flat partitions
    status, body = plan(client, "adamw_8bit", "deepspeed", "deepspeed")
    chosen = body["recommended"]["layout"]
    assert status == 201 and chosen["zero_stage"] not in (1, 2), chosen
    assert not (chosen["zero_stage"] == 0 and chosen["pp"] > 1), chosen
