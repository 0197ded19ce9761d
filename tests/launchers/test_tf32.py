"""precision tf32 as each target takes it: fp32 training with the matmuls on TF32 tensor cores."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from service.catalog.gpus import gpu
from service.estimator.types import Compile, Framework, Plan, Precision, TrainingSpec
from service.launchers import REFUSALS, RENDERERS, Artifact, Target, Unsupported
from service.launchers import render as render_targets
from service.launchers.common import TF32_ENV
from tests.launchers import factories
from tests.launchers.checks import check_artifact

TF32 = factories.training(precision=Precision.TF32)
FP32 = factories.training(precision=Precision.FP32)
EXPORT = f"export {TF32_ENV[0]}={TF32_ENV[1]}"


def by_name(artifacts: list[Artifact], name: str) -> Artifact:
    (found,) = [a for a in artifacts if a.name == name]
    return found


def deepspeed_plan(train: TrainingSpec = TF32) -> Plan:
    return factories.plan(train=train, framework=Framework.DEEPSPEED, zero_stage=2)


def test_hf_trainer_sets_tf32_over_fp32_training() -> None:
    args = json.loads(by_name(RENDERERS[Target.HF_TRAINER](deepspeed_plan()), "training_args.json").content)
    assert args["tf32"] is True and "bf16" not in args and "fp16" not in args
    fp32 = json.loads(
        by_name(RENDERERS[Target.HF_TRAINER](deepspeed_plan(FP32)), "training_args.json").content
    )
    assert "tf32" not in fp32  # fp32 keeps PyTorch's default, IEEE fp32 matmuls


def test_deepspeed_has_no_half_precision_block_and_the_script_sets_tf32() -> None:
    artifacts = RENDERERS[Target.DEEPSPEED](deepspeed_plan())
    config = json.loads(by_name(artifacts, "ds_config.json").content)
    assert "bf16" not in config and "fp16" not in config
    launch = by_name(artifacts, "deepspeed_launch.sh").content
    assert "torch.backends.cuda.matmul.allow_tf32 = True" in launch


def test_accelerate_runs_fp32_with_the_tf32_override() -> None:
    plan = factories.plan(train=TF32, framework=Framework.FSDP, zero_stage=3)
    artifacts = RENDERERS[Target.ACCELERATE](plan)
    config = yaml.safe_load(by_name(artifacts, "accelerate_config.yaml").content)
    assert config["mixed_precision"] == "no"
    assert EXPORT in by_name(artifacts, "accelerate_launch.sh").content.splitlines()
    fp32 = RENDERERS[Target.ACCELERATE](factories.plan(train=FP32, framework=Framework.FSDP, zero_stage=3))
    assert EXPORT not in by_name(fp32, "accelerate_launch.sh").content


def test_torchtitan_keeps_fp32_parameters_and_exports_the_override() -> None:
    plan = factories.plan(model=factories.llama3_8b(), train=TF32, framework=Framework.FSDP, zero_stage=3)
    launch = by_name(RENDERERS[Target.TORCHTITAN](plan), "torchtitan_launch.sh").content
    assert "--training.mixed_precision_param float32" in launch
    assert EXPORT in launch.splitlines()


def test_megatron_refuses_tf32_with_the_reason() -> None:
    plan = factories.plan(train=TF32, framework=Framework.MEGATRON, tp=2)
    reason = REFUSALS[Target.MEGATRON](plan)
    assert reason is not None and "no TF32 switch" in reason
    with pytest.raises(Unsupported):
        RENDERERS[Target.MEGATRON](plan)
    assert REFUSALS[Target.ACCELERATE](plan) == reason  # MegatronLMPlugin runs the same Megatron-LM


@pytest.mark.parametrize("framework", [Framework.DEEPSPEED, Framework.FSDP, Framework.MEGATRON])
def test_every_target_renders_tf32_exactly_when_it_does_not_refuse(framework: Framework) -> None:
    zero = {Framework.DEEPSPEED: 2, Framework.FSDP: 3, Framework.MEGATRON: 1}[framework]
    plan = factories.plan(model=factories.llama3_8b(), train=TF32, framework=framework, zero_stage=zero)
    for target, render in RENDERERS.items():
        refused = REFUSALS[target](plan)
        try:
            artifacts = render(plan)
        except Unsupported:
            assert refused is not None, target
            continue
        assert refused is None, target
        for artifact in artifacts:
            check_artifact(artifact, plan)


def test_on_amd_the_launch_also_opens_hipblaslts_tf32_path() -> None:
    # PyTorch on ROCm runs fp32 matmuls in TF32 (MI300) only with HIPBLASLT_ALLOW_TF32=1
    nvidia = factories.plan(model=factories.llama3_8b(), train=TF32, framework=Framework.FSDP, zero_stage=3)
    amd = dataclasses.replace(nvidia, cluster=dataclasses.replace(nvidia.cluster, gpu=gpu("mi300x-192gb")))
    for plan, rocm in ((nvidia, False), (amd, True)):
        launch = by_name(RENDERERS[Target.TORCHTITAN](plan), "torchtitan_launch.sh").content
        assert EXPORT in launch.splitlines()
        assert ("export HIPBLASLT_ALLOW_TF32=1" in launch.splitlines()) is rocm


def test_the_hf_trainer_on_amd_switches_tf32_by_the_environment_not_its_flag() -> None:
    """TrainingArguments(tf32=True) raises on ROCm ("--tf32 requires Ampere or a newer GPU arch":
    is_torch_tf32_available() is False without torch.version.cuda), so the run died at its start
    (AMD review): the HF Trainer's launch exports hipBLASLt's switch instead, as the other targets'
    do; on NVIDIA the Trainer's flag stays."""
    nvidia = factories.plan(model=factories.llama3_8b(), train=TF32, framework=Framework.FSDP, zero_stage=3)
    amd = dataclasses.replace(nvidia, cluster=dataclasses.replace(nvidia.cluster, gpu=gpu("mi300x-192gb")))
    for plan, rocm in ((nvidia, False), (amd, True)):
        artifacts = RENDERERS[Target.HF_TRAINER](plan)
        args = json.loads(by_name(artifacts, "training_args.json").content)
        assert ("tf32" in args) is not rocm
        launch = by_name(artifacts, "hf_trainer_launch.sh").content.splitlines()
        assert ("export HIPBLASLT_ALLOW_TF32=1" in launch) is rocm


@pytest.mark.parametrize("target", [Target.ACCELERATE, Target.HF_TRAINER])
def test_fp32_compiled_by_accelerate_is_refused_since_it_switches_tf32_on(target: Target) -> None:
    """Accelerate sets torch.backends.cuda.matmul.allow_tf32 under a dynamo backend with mixed precision
    "no" (AcceleratorState), the HF Trainer through its TorchDynamoPlugin: fp32 with compile would run at
    the TF32 rate (launch-consistency review). Uncompiled fp32 and compiled tf32 render."""
    factory = factories.plan(train=FP32, framework=Framework.FSDP, zero_stage=3)
    h100 = dataclasses.replace(factory.cluster, gpu=gpu("h100-sxm-80gb"))  # the catalog's: its TF32 peak
    plain = dataclasses.replace(factory, cluster=h100)
    compiled = dataclasses.replace(
        plain, layout=dataclasses.replace(plain.layout, torch_compile=Compile.MODEL_AND_LOSS)
    )
    _, refused = render_targets(compiled, [target])
    assert "TF32" in refused[target]
    for runs in (plain, dataclasses.replace(compiled, training=TF32)):
        artifacts, refused = render_targets(runs, [target])
        assert target not in refused and artifacts
    v100 = dataclasses.replace(
        compiled, cluster=dataclasses.replace(compiled.cluster, gpu=gpu("v100-sxm2-32gb"))
    )
    assert "TF32" not in (REFUSALS[target](v100) or "")
