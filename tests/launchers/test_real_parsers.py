"""Feed the artifacts to the real tools' own parsers (pinned: deepspeed 0.19.8, accelerate 1.15.0,
transformers 5.24.0, torchtitan 0.3.0), over the layout grid. Each tool is optional: a missing one
skips its test (install with the project's ``launchers`` extra)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from service.estimator import pipeline
from service.estimator.types import Compile, Framework, Method, ModelSpec, MoESpec, Plan, QKNorm, Recompute
from service.launchers import Artifact, Target, Unsupported, accelerate, deepspeed, hf_trainer, torchtitan
from tests.launchers import factories
from tests.launchers.grid import grid

GRID = grid()


def rendered(target: Target) -> Iterator[tuple[str, Plan, list[Artifact]]]:
    from service.launchers import RENDERERS

    seen: set[tuple[str, ...]] = set()
    for name, plan in GRID:
        try:
            artifacts = RENDERERS[target](plan)
        except Unsupported:
            continue
        key = tuple(a.content for a in artifacts)
        if key not in seen:  # plans that render identically are parsed once
            seen.add(key)
            yield name, plan, artifacts


def by_name(artifacts: list[Artifact], name: str) -> Artifact:
    (found,) = [a for a in artifacts if a.name == name]
    return found


@contextlib.contextmanager
def fake_world(size: int) -> Iterator[None]:
    """A real torch.distributed world of ``size`` ranks on PyTorch's fake backend (no GPUs, no
    peers: collectives are no-ops), seen by DeepSpeed's comm layer; the groups DeepSpeed caches in
    deepspeed.utils.groups are cleared on exit so the next world builds its own."""
    import torch.distributed as tdist
    from deepspeed import comm
    from deepspeed.utils import groups
    from torch.testing._internal.distributed.fake_pg import FakeStore

    tdist.init_process_group(backend="fake", rank=0, world_size=size, store=FakeStore())
    try:
        comm.init_distributed(dist_backend="fake", dist_init_required=False)
        yield
    finally:
        for cached in ("_TENSOR_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP"):
            setattr(groups, cached, None)
        tdist.destroy_process_group()


def test_deepspeed_config_and_launcher(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    from deepspeed import comm
    from deepspeed.launcher import runner
    from deepspeed.runtime import config as ds_runtime_config
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid
    from deepspeed.utils import groups

    count = autotp = 0
    for name, plan, artifacts in rendered(Target.DEEPSPEED):
        config = json.loads(by_name(artifacts, deepspeed.CONFIG_NAME).content)
        lo = plan.layout
        # The world deepspeed.initialize sees: one rank per GPU of the cluster.
        with fake_world(plan.cluster.world_size):
            if lo.pp > 1:
                # PipelineModule's topology is the mpu: the batch counts its data-parallel ranks.
                mpu = PipelineParallelGrid(topology=PipeDataParallelTopology(num_pp=lo.pp, num_dp=lo.dp))
                parsed = ds_runtime_config.DeepSpeedConfig(config, mpu)
            else:
                # AutoTP (from the config, or HF Trainer's tp_model_init) passes no mpu and builds
                # its tensor-parallel groups over the whole world, as deepspeed.initialize does.
                parsed = ds_runtime_config.DeepSpeedConfig(config)
                if lo.tp > 1:
                    assert parsed.tensor_parallel_config.autotp_size == lo.tp, name
                    groups._init_tp_mesh_device(
                        tensor_model_parallel_size=parsed.tensor_parallel_config.autotp_size
                    )
                    assert comm.get_world_size(groups.get_tensor_model_parallel_group()) == lo.tp, name
                    assert comm.get_world_size(groups.get_data_parallel_group()) == lo.dp, name
                    autotp += 1
        # Samples per optimizer step: DeepSpeed's train batch counts tensor-parallel peers, which
        # read the same samples.
        assert parsed.train_batch_size == plan.training.global_batch_size * (lo.tp if lo.pp == 1 else 1), name
        assert parsed.train_micro_batch_size_per_gpu == lo.micro_batch_size, name
        assert parsed.zero_optimization_stage == lo.zero_stage, name
        assert parsed.bfloat16_config.enabled == ("bf16" in config), name
        launch = by_name(artifacts, deepspeed.LAUNCH_NAME).content
        line = launch.split("\ndeepspeed ", 1)[1].replace("\\\n", " ")
        line = line.replace("${MASTER_ADDR}", "10.0.0.1").replace("${MASTER_PORT}", "29500")
        words = shlex.split(line)
        args = runner.parse_args(words)
        assert args.user_script == "train.py" and args.num_gpus == plan.cluster.gpus_per_node, name
        if plan.cluster.num_nodes > 1:
            hostfile = tmp_path / "hostfile"
            hostfile.write_text(by_name(artifacts, deepspeed.HOSTFILE_NAME).content)
            pool = runner.fetch_hostfile(str(hostfile))
            assert list(pool.values()) == [plan.cluster.gpus_per_node] * plan.cluster.num_nodes
        count += 1
    assert count > 20 and autotp >= 3, (count, autotp)


def test_the_ds_config_accelerate_ships_for_ulysses_passes_deepspeeds_batch_check_under_alsts_mpu() -> None:
    """Accelerate's ALST registers DeepSpeed's Ulysses and hands deepspeed.initialize its mpu
    (runtime/sequence_parallel/parallel_state_sp.py, without get_data_parallel_world_size): DeepSpeed's
    batch world is then world / sp (runtime/config.py), which the shipped train_batch_size counts."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime import config as ds_runtime_config
    from deepspeed.runtime.sequence_parallel import parallel_state_sp

    count = 0
    for name, plan, artifacts in rendered(Target.ACCELERATE):
        lo = plan.layout
        if lo.framework is not Framework.DEEPSPEED or lo.cp == 1:
            continue
        config = json.loads(by_name(artifacts, deepspeed.CONFIG_NAME).content)
        with fake_world(plan.cluster.world_size):
            parallel_state_sp.initialize_sequence_parallel(lo.cp)
            try:
                parsed = ds_runtime_config.DeepSpeedConfig(config, parallel_state_sp)
            finally:
                parallel_state_sp._SEQUENCE_PARALLEL_GROUP = None
                parallel_state_sp._SEQUENCE_DATA_PARALLEL_GROUP = None
        assert parsed.world_size == lo.dp, name
        assert parsed.train_batch_size == plan.training.global_batch_size, name
        count += 1
    assert count >= 2


def _accelerate_args(path: Path, plan: Plan) -> Any:
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    expanded = {'"${NODE_RANK}"': "1", '"${MASTER_ADDR}"': "10.0.0.1", '"${MASTER_PORT}"': "29500"}
    words = [w if isinstance(w, str) else expanded[w.text] for w in accelerate.launch_words(plan, str(path))][
        2:
    ]
    args = launch_command_parser().parse_args(words)
    args, defaults, mp_from_config = _validate_launch_command(args)
    if args.use_deepspeed:  # as launch_command does before deepspeed_launcher
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
    return args


def test_accelerate_config_loader_launch_and_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin, parse_choice_from_env
    from accelerate.utils.dataclasses import DeepSpeedSequenceParallelConfig
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    # As a user runs accelerate_launch.sh: from the directory holding the rendered files, whose
    # relative paths (--config_file, deepspeed_config_file) resolve there.
    monkeypatch.chdir(tmp_path)
    count = ulysses = 0
    for name, plan, artifacts in rendered(Target.ACCELERATE):
        for old in tmp_path.iterdir():
            old.unlink()
        for artifact in artifacts:
            (tmp_path / artifact.name).write_text(artifact.content)
        path = Path(accelerate.CONFIG_NAME)
        loaded = load_config_from_file(str(path))  # unknown top-level keys raise here
        assert loaded.num_processes == plan.cluster.world_size, name
        args = _accelerate_args(path, plan)
        # the compiled run estimated (model and loss: HF models compute the loss in forward)
        compiled = plan.layout.torch_compile is Compile.MODEL_AND_LOSS
        assert loaded.dynamo_config == ({"dynamo_backend": "INDUCTOR"} if compiled else {}), name
        assert plan.layout.torch_compile is not Compile.MODEL, name  # refused: loss compiled too
        framework = plan.layout.framework
        if framework is Framework.DEEPSPEED:
            _, env = prepare_deepspeed_cmd_env(args)
            assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == deepspeed.CONFIG_NAME, name
            # Refuses inline plugin keys (and a config-file mixed_precision) beside the file.
            with mock.patch.dict(os.environ, env):
                plugin = DeepSpeedPlugin()
            shipped = json.loads(by_name(artifacts, deepspeed.CONFIG_NAME).content)
            assert plugin.zero_stage == plan.layout.zero_stage, name
            assert plugin.gradient_accumulation_steps == shipped["gradient_accumulation_steps"], name
            # DeepSpeed runs the buckets the memory estimate counts, not its 5e8 defaults.
            zero = plugin.deepspeed_config["zero_optimization"]
            for key, value in shipped["zero_optimization"].items():
                assert zero[key] == value, (name, key)
            assert plugin.zero3_init_flag == (plan.layout.zero_stage == 3), name
            if plan.layout.cp > 1:
                # DeepSpeed's Ulysses as Accelerate runs it (ALST): the config file's parallelism_config
                # reaches the Accelerator through these variables, which ParallelismConfig reads
                assert env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true", name
                with mock.patch.dict(os.environ, env):
                    parallel = ParallelismConfig()
                    handler = DeepSpeedSequenceParallelConfig()
                assert (parallel.sp_backend, parallel.sp_size) == ("deepspeed", plan.layout.cp), name
                assert parallel.total_size == plan.cluster.world_size, name
                assert handler.sp_seq_length_is_variable, name
                assert handler.sp_attn_implementation in ("flash_attention_2", "sdpa"), name
                ulysses += 1
        elif framework is Framework.FSDP and plan.layout.zero_stage >= 2:
            env = prepare_multi_gpu_env(args)
            with mock.patch.dict(os.environ, env):
                fsdp = FullyShardedDataParallelPlugin()
            assert fsdp.fsdp_version == 2 and fsdp.reshard_after_forward == (plan.layout.zero_stage == 3), (
                name
            )
        else:
            prepare_multi_gpu_env(args)
        if framework is Framework.FSDP:
            # the accumulation the Accelerator reads where the script passes none (a review's case: a
            # default train.py trained 1/16 of the estimated global batch)
            launch = by_name(artifacts, accelerate.LAUNCH_NAME).content
            exported = re.search(rf"^export {accelerate.ACCUMULATION_ENV}=(\d+)$", launch, re.M)
            assert exported is not None, name
            with mock.patch.dict(os.environ, {accelerate.ACCUMULATION_ENV: exported.group(1)}):
                steps = int(parse_choice_from_env("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", 1))
            lo = plan.layout
            assert steps * lo.dp * lo.micro_batch_size == plan.training.global_batch_size, name
        count += 1
    assert count > 20 and ulysses >= 2, (count, ulysses)


def test_hf_training_arguments_json_and_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers")
    parser = transformers.HfArgumentParser(transformers.TrainingArguments)
    monkeypatch.chdir(tmp_path)
    count = with_deepspeed = 0
    for name, plan, artifacts in rendered(Target.HF_TRAINER):
        for artifact in artifacts:
            (tmp_path / artifact.name).write_text(artifact.content)
        data = json.loads(by_name(artifacts, hf_trainer.ARGS_NAME).content)
        # A CPU box: bf16 needs use_cpu; allow_extra_keys=False rejects unknown fields. The world
        # is the plan's: TrainingArguments checks ds_config.json against itself with it.
        world = mock.PropertyMock(return_value=plan.cluster.world_size)
        with mock.patch.object(transformers.TrainingArguments, "world_size", world):
            (from_json,) = parser.parse_dict({**data, "use_cpu": True}, allow_extra_keys=False)
            flags, _ = hf_trainer.entry_words(plan)
            words = [str(w) for w in flags[1:]] + ["--use_cpu", "true"]
            (from_cli,) = parser.parse_args_into_dataclasses(words)
        for args in (from_json, from_cli):
            if "deepspeed" in data:
                # Trainer raises on these at trainer_config_finalize (batch, lr, betas, clipping...).
                assert args.hf_deepspeed_config.mismatches == [], (name, args.hf_deepspeed_config.mismatches)
            assert args.per_device_train_batch_size == plan.layout.micro_batch_size, name
            assert args.torch_compile == (plan.layout.torch_compile is Compile.MODEL_AND_LOSS), name
            assert plan.layout.torch_compile is not Compile.MODEL, name  # refused: loss compiled too
            assert args.gradient_accumulation_steps * plan.layout.dp * plan.layout.micro_batch_size == (
                plan.training.global_batch_size
            )
            if "fsdp_config" in data:
                assert args.fsdp_config["version"] == 2
                known = {
                    "version", "reshard_after_forward", "auto_wrap_policy", "state_dict_type",
                    "cpu_offload", "cpu_ram_efficient_loading", "activation_checkpointing",
                    "transformer_layer_cls_to_wrap", "min_num_params", "xla", "xla_fsdp_v2",
                    "xla_fsdp_grad_ckpt",
                }  # fmt: skip
                assert set(args.fsdp_config) <= known, (
                    set(args.fsdp_config) - known
                )  # unknown keys are ignored
        count += 1
        with_deepspeed += "deepspeed" in data
    assert count > 10 and with_deepspeed > 5, (count, with_deepspeed)


def test_torchtitan_config_manager_and_parallel_dims() -> None:
    pytest.importorskip("torchtitan")
    pytest.importorskip("tyro")
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    count = 0
    for name, plan, _ in rendered(Target.TORCHTITAN):
        config = ConfigManager().parse_args(torchtitan.train_args(plan))
        par, training = config.parallelism, config.training
        # the loss as estimated: ChunkedLossWrapper's chunks, one where the estimate has full logits
        assert config.loss.num_chunks == (torchtitan.CHUNKS if plan.layout.chunked_loss else 1), name
        dims = ParallelDims(
            dp_replicate=par.data_parallel_replicate_degree,
            dp_shard=par.data_parallel_shard_degree,
            cp=par.context_parallel_degree,
            tp=par.tensor_parallel_degree,
            pp=par.pipeline_parallel_degree,
            ep=par.expert_parallel_degree,
            world_size=plan.cluster.world_size,
        )
        dp = dims.dp_replicate * dims.dp_shard
        assert dp == plan.layout.dp, name
        # the activation checkpointing torchtitan builds is the policy estimated
        wanted = {Recompute.NONE: "NoneType", Recompute.SELECTIVE_OP: "SelectiveAC", Recompute.FULL: "FullAC"}
        built = type(config.activation_checkpoint).__qualname__.split(".")[0]
        assert built == wanted[plan.layout.recompute], (name, built)
        # the compiled components estimated: torchtitan compiles the model and the loss by default
        compiled = {Compile.NONE: None, Compile.MODEL: ["model"], Compile.MODEL_AND_LOSS: ["model", "loss"]}
        assert (config.compile.components if config.compile.enable else None) == compiled[
            plan.layout.torch_compile
        ], name
        # Async TP where estimated (0.3.0: a CompileConfig field, which requires the compiled model)
        assert config.compile.enable_async_tensor_parallel is plan.layout.tp_comm_overlap, name
        assert training.global_batch_size % (training.local_batch_size * dp) == 0, name
        assert training.global_batch_size == plan.training.global_batch_size, name
        # CUDA graphs off: the estimate times eager launches and frees the gradients (torchtitan review)
        assert training.disable_cuda_graphs, name
        if par.pipeline_parallel_degree > 1:
            assert training.local_batch_size % par.pipeline_parallel_microbatch_size == 0
            assert torchtitan_split(par, plan.model.num_layers) == pipeline.stage_layers(
                plan.model.num_layers, plan.layout
            ), name
        count += 1
    assert count > 5


def torchtitan_split(par: Any, num_layers: int) -> tuple[int, ...]:
    """The layers of each stage torchtitan builds from these options (its own split function)."""
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    first, last = par.pipeline_parallel_first_stage_less_layers, par.pipeline_parallel_last_stage_less_layers
    per_stage = par.pipeline_parallel_layers_per_stage
    stages = -(-(num_layers + first + last) // per_stage) if per_stage else par.pipeline_parallel_degree
    parts = _generate_llm_fqn_per_model_part(stages, num_layers, first, last)
    return tuple(sum(name.startswith("layers.") for name in part) for part in parts)


def test_torchtitan_builds_the_estimated_uneven_split() -> None:
    pytest.importorskip("torchtitan")
    pytest.importorskip("tyro")
    from torchtitan.config.manager import ConfigManager

    for pp, flags in ((4, (True, True)), (4, (True, False)), (2, (False, True))):
        plan = factories.plan(
            model=factories.llama3_8b(),
            framework=Framework.FSDP,
            zero_stage=3,
            pp=pp,
            pipeline_account_for_embedding=flags[0],
            pipeline_account_for_loss=flags[1],
        )
        par = ConfigManager().parse_args(torchtitan.train_args(plan)).parallelism
        assert torchtitan_split(par, 32) == pipeline.stage_layers(32, plan.layout)


QWEN3_30B_A3B = ModelSpec(
    name="qwen3-30b-a3b",
    family="qwen3_moe",
    num_layers=48,
    hidden_size=2048,
    num_attention_heads=32,
    num_kv_heads=4,
    head_dim=128,
    ffn_hidden_size=6144,
    vocab_size=151936,
    qk_norm=QKNorm.PER_HEAD,
    moe=MoESpec(num_experts=128, top_k=8, expert_ffn_hidden_size=768),
)


def test_torchtitan_builds_a_registered_moe_flavor_with_expert_parallelism() -> None:
    pytest.importorskip("torchtitan")
    pytest.importorskip("tyro")
    from torchtitan.config.manager import ConfigManager

    plan = factories.plan(model=QWEN3_30B_A3B, framework=Framework.FSDP, zero_stage=3, ep=8)
    args = torchtitan.train_args(plan)
    assert args[:4] == ["--module", "qwen3", "--config", "qwen3_30b_a3b"]
    config = ConfigManager().parse_args(args)
    assert config.parallelism.expert_parallel_degree == 8
    assert config.parallelism.data_parallel_shard_degree == 8
    # with tp > 1 its EP would borrow the TP ranks: refused, not rendered differently from the estimate
    with pytest.raises(Unsupported, match="ep=4 with tp=2"):
        torchtitan.train_args(
            factories.plan(model=QWEN3_30B_A3B, framework=Framework.FSDP, zero_stage=3, tp=2, ep=4)
        )


@pytest.mark.parametrize("method", [Method.LORA, Method.QLORA])
def test_adapter_files_load_into_peft_and_bitsandbytes(method: Method) -> None:
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    training = dataclasses.replace(
        factories.training(), method=method, lora_rank=32, lora_targets=("q_proj", "v_proj")
    )
    for target, render in ((Target.HF_TRAINER, hf_trainer.render), (Target.DEEPSPEED, deepspeed.render),
                           (Target.ACCELERATE, accelerate.render)):  # fmt: skip
        framework = Framework.FSDP if target is Target.ACCELERATE else Framework.DEEPSPEED
        plan = factories.plan(
            train=training, framework=framework, zero_stage=2 if target is not Target.ACCELERATE else 3
        )
        files = {a.name: a for a in render(plan)}
        lora = peft.LoraConfig(**json.loads(files["lora_config.json"].content))
        assert (lora.r, sorted(lora.target_modules)) == (32, ["q_proj", "v_proj"]), target
        if method is Method.QLORA:
            bnb = transformers.BitsAndBytesConfig(**json.loads(files["bnb_config.json"].content))
            assert bnb.load_in_4bit and bnb.bnb_4bit_quant_type == "nf4" and bnb.bnb_4bit_use_double_quant
        else:
            assert "bnb_config.json" not in files
    for render in (torchtitan.render,):
        with pytest.raises(Unsupported, match="trains full models only"):
            render(
                factories.plan(
                    model=factories.llama3_8b(), train=training, framework=Framework.FSDP, zero_stage=3
                )
            )


def test_fsdp_wraps_a_decoder_layer_class_transformers_defines_for_every_preset_family() -> None:
    transformers = pytest.importorskip("transformers")
    import importlib

    from service.catalog.models import models
    from service.launchers.common import hf_decoder_layer

    for family in sorted({preset.spec.family for preset in models().values()}):
        layer = hf_decoder_layer(family)
        assert layer is not None, family
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        assert hasattr(module, layer), (family, layer, transformers.__version__)


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_qlora_under_fsdp_runs_fsdp1_with_flat_parameters_and_float_nf4_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zero_stage: int
) -> None:
    """FSDP2 breaks bitsandbytes' NF4 weights (bitsandbytes#1945; uint8 storage left unsharded since
    accelerate#3987): QLoRA under FSDP goes to FSDP1 with use_orig_params false, the path of PEFT's
    FSDP-QLoRA docs, its packed weights stored in the compute dtype. Both targets' files, parsed by
    accelerate's own plugin and the Trainer's own arguments, ask for exactly that."""
    pytest.importorskip("accelerate")
    transformers = pytest.importorskip("transformers")
    import torch
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env
    from torch.distributed.fsdp import ShardingStrategy

    strategy = ShardingStrategy.FULL_SHARD if zero_stage == 3 else ShardingStrategy.SHARD_GRAD_OP
    plan = factories.plan(
        train=factories.training(method=Method.QLORA), framework=Framework.FSDP, zero_stage=zero_stage
    )
    monkeypatch.chdir(tmp_path)
    artifacts = accelerate.render(plan)
    for artifact in artifacts:
        (tmp_path / artifact.name).write_text(artifact.content)
    load_config_from_file(accelerate.CONFIG_NAME)
    env = prepare_multi_gpu_env(_accelerate_args(Path(accelerate.CONFIG_NAME), plan))
    # FSDP1's sync_module_states asks for the current GPU: a CPU box answers GPU 0
    gpu = (
        mock.patch("accelerate.utils.dataclasses.is_cuda_available", return_value=True),
        mock.patch("torch.cuda.current_device", return_value=0),
    )
    with mock.patch.dict(os.environ, env), gpu[0], gpu[1]:
        fsdp = FullyShardedDataParallelPlugin()
    assert (fsdp.fsdp_version, fsdp.sharding_strategy, fsdp.use_orig_params) == (1, strategy, False)
    bnb = transformers.BitsAndBytesConfig(**json.loads(by_name(artifacts, "bnb_config.json").content))
    assert bnb.bnb_4bit_quant_storage == bnb.bnb_4bit_compute_dtype == torch.bfloat16 and bnb.load_in_4bit

    data = json.loads(by_name(hf_trainer.render(plan), hf_trainer.ARGS_NAME).content)
    (tmp_path / hf_trainer.FSDP_CONFIG_NAME).write_text(
        by_name(hf_trainer.render(plan), hf_trainer.FSDP_CONFIG_NAME).content
    )
    parser = transformers.HfArgumentParser(transformers.TrainingArguments)
    world = mock.PropertyMock(return_value=plan.cluster.world_size)
    with mock.patch.object(transformers.TrainingArguments, "world_size", world):
        (args,) = parser.parse_dict({**data, "use_cpu": True}, allow_extra_keys=False)
    plugin = args.fsdp_plugin_args  # what the Trainer hands accelerate's FSDP plugin
    assert (plugin["fsdp_version"], plugin["reshard_after_forward"], plugin["use_orig_params"]) == (
        1,
        strategy.name.lower(),
        False,
    )


def test_torchtitan_compile_is_said_either_way_over_a_config_that_turns_it_on() -> None:
    """A pretraining review's case: torchtitan 0.3.0's deepseek_v3_671b and llama3_405b config
    functions compile (the 405B with async TP and Float8 converters too), and an uncompiled plan's
    file said nothing, so they ran compiled. The flags the launcher writes turn them off, as
    ConfigManager reads them; the 405B's converters no flag undoes, so its config is refused."""
    pytest.importorskip("torchtitan")
    pytest.importorskip("tyro")
    from torchtitan.config.manager import ConfigManager

    from service.catalog.models import model as preset

    words = ["--compile.no-enable", "--compile.no-enable-async-tensor-parallel"]
    # (llama3_405b's config function needs torchao to build its Float8 converter: not installed here)
    for module, config_name in (("deepseek_v3", "deepseek_v3_671b"), ("deepseek_v3", "deepseek_v3_16b")):
        default = ConfigManager().parse_args(["--module", module, "--config", config_name])
        assert default.compile.enable, config_name  # what the file left unsaid ran
        off = ConfigManager().parse_args(["--module", module, "--config", config_name, *words])
        assert not off.compile.enable and not off.compile.enable_async_tensor_parallel, config_name
    both = ConfigManager().parse_args(
        [
            "--module",
            "llama3",
            "--config",
            "llama3_8b",
            "--compile.enable",
            "--compile.components",
            "model,loss",
        ]
    )
    assert both.compile.components == ["model", "loss"]
    plan = factories.plan(model=preset("llama-3.1-405b").spec, framework=Framework.FSDP, zero_stage=3, tp=8)
    reason = torchtitan.refusal(plan)
    assert reason is not None and "Float8LinearConverter" in reason
