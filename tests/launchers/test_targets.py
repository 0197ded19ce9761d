"""Per-target rules, computed by hand for small plans."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from service.catalog.models import model
from service.catalog.models import model as model_preset
from service.estimator import pipeline
from service.estimator.model_states import deepspeed_buckets
from service.estimator.types import (
    Attention,
    AttentionKind,
    Compile,
    Framework,
    Method,
    MLASpec,
    ModelSpec,
    MoeDispatcher,
    MoESpec,
    Offload,
    Plan,
    Precision,
    QKNorm,
    Recompute,
    RecomputeModule,
    TrainingSpec,
)
from service.frameworks import FRAMEWORKS
from service.launchers import (
    REFUSALS,
    Target,
    Unsupported,
    accelerate,
    deepspeed,
    framework_structure_refusal,
    hf_trainer,
    kubernetes,
    megatron,
    render,
    torchtitan,
)
from service.launchers.common import accumulation
from tests.launchers import checks
from tests.launchers.factories import llama3_8b, plan, small_llama, training

# the one model MegatronLMPlugin builds as Hugging Face's is (accelerate.PLUGIN_FAITHFUL_FAMILIES)
GPT2 = model("gpt2").spec
GPT2_TRAINING = training(seq_len=1024)

# What Accelerate's MegatronLMPlugin runs (Megatron-LM's own defaults); the estimate's defaults are NVIDIA's
# recipes (bf16 gradient buffer, overlapped gradient reduce), which only the megatron target renders
MEGATRON_LM_OWN: dict[str, Any] = {
    "grad_reduce_in_fp32": True,
    "overlap_grad_reduce": False,
    "precision_aware_optimizer": False,
}


def test_deepspeed_batch_counts_every_autotp_rank() -> None:
    # 2 nodes x 8 = 16 GPUs, tp=2 -> dp=8; 256 = micro 2 x accumulation 16 x dp 8 samples per step.
    # AutoTP passes DeepSpeed no mpu, so its batch assertion counts all 16 ranks: 2 x 16 x 16 = 512.
    config = deepspeed.ds_config(
        plan(nodes=2, framework=Framework.DEEPSPEED, tp=2, micro_batch_size=2, zero_stage=1)
    )
    assert (config["train_batch_size"], config["gradient_accumulation_steps"]) == (512, 16)
    assert config["tensor_parallel"] == {"autotp_size": 2}


def test_deepspeed_autotp_runs_with_zero3_and_not_with_the_pipeline() -> None:
    # DeepSpeed 0.19.4 dropped AutoTP's "zero_stage <= 2" assertion: 0.19.8 trains AutoTP + ZeRO-3
    config = deepspeed.ds_config(
        plan(nodes=2, framework=Framework.DEEPSPEED, tp=2, micro_batch_size=2, zero_stage=3)
    )
    assert config["zero_optimization"]["stage"] == 3 and config["tensor_parallel"] == {"autotp_size": 2}
    assert (config["train_batch_size"], config["gradient_accumulation_steps"]) == (512, 16)
    with pytest.raises(Unsupported, match="pipeline engine"):
        deepspeed.ds_config(plan(nodes=2, framework=Framework.DEEPSPEED, tp=2, pp=2, zero_stage=1))


@pytest.mark.parametrize(
    ("layout", "words"),
    [
        ({"zero_stage": 3, "pp": 2}, "incompatible with pipeline"),
        ({"zero_stage": 2, "offload_params": Offload.CPU, "offload_optimizer": Offload.CPU}, "stage 3"),
        ({"zero_stage": 2, "offload_optimizer": Offload.NVME}, "NVMe"),
        ({"zero_stage": 1, "cp": 2}, "no Ulysses sequence parallelism"),
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
    assert zero["offload_param"]["buffer_size"] == 100_000_000  # DeepSpeed's default holds every shard


def test_deepspeed_nvme_parameter_buffers_hold_the_largest_shard() -> None:
    """A review's case: Llama 3.1 405B with parameters on NVMe over 16 ranks; its embedding's shard
    (128256 x 16384 / 16 = 131,334,144 elements) is past offload_param's default 1e8-element buffer,
    and DeepSpeed's swapper asserts at init (partitioned_param_swapper.py get_buffer: "More elements
    ... than buffer size")."""
    big = model("llama-3.1-405b").spec
    layout = {"framework": Framework.DEEPSPEED, "zero_stage": 3, "offload_params": Offload.NVME,
              "offload_optimizer": Offload.NVME}  # fmt: skip
    zero = deepspeed.zero_block(plan(nodes=2, model=big, **layout))
    assert zero["offload_param"]["buffer_size"] == 128256 * 16384 // 16


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


@pytest.mark.parametrize(("attention", "backend"), [(Attention.EAGER, "unfused"), (Attention.FLASH, None)])
def test_megatron_runs_the_attention_estimated(attention: Attention, backend: str | None) -> None:
    """Eager is estimated with the whole s x s square: Transformer Engine's unfused attention, which
    --attention-backend's default (auto: flash or cuDNN fused) never runs (launch-consistency review)."""
    args = megatron.megatron_args(
        plan(framework=Framework.MEGATRON, tp=2, train=training(attention=attention))
    )
    assert checks.megatron_flags(args).get("--attention-backend") == backend


def test_megatron_block_recompute_renders_the_estimated_layers() -> None:
    lo = {"framework": Framework.MEGATRON, "tp": 2, "recompute": Recompute.FULL, "recompute_num_layers": 3}
    args = megatron.megatron_args(plan(**lo))
    at = args.index("--recompute-granularity")
    assert args[at : at + 6] == ["--recompute-granularity", "full", "--recompute-method", "block",
                                 "--recompute-num-layers", "3"]  # fmt: skip
    # Accelerate's plugin runs Megatron-LM's own defaults: it renders layouts that say so (of GPT-2, the
    # one model its plugin builds as Hugging Face's is)
    gpt2 = plan(model=GPT2, train=GPT2_TRAINING, **lo, **MEGATRON_LM_OWN)
    mlm = accelerate.accelerate_config(gpt2)["megatron_lm_config"]
    assert (mlm["megatron_lm_recompute_method"], mlm["megatron_lm_recompute_num_layers"]) == ("block", 3)


@pytest.mark.parametrize(
    "render", [accelerate.accelerate_config, hf_trainer.training_arguments, torchtitan.train_args]
)
def test_every_nth_layer_checkpointing_is_refused_where_every_layer_checkpoints(render: Any) -> None:
    # torchtitan 0.3 dropped selective_ac_option N; HF and accelerate wrap every decoder layer
    every = plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3, recompute=Recompute.FULL,
                 recompute_every_n_layers=2)  # fmt: skip
    with pytest.raises(Unsupported, match="every"):
        render(every)


@pytest.mark.parametrize("render", [accelerate.accelerate_config, hf_trainer.training_arguments])
def test_per_op_ac_is_refused_where_only_whole_layers_checkpoint(render: Any) -> None:
    with pytest.raises(Unsupported, match="per-op selective AC is torchtitan's"):
        render(plan(framework=Framework.FSDP, zero_stage=3, recompute=Recompute.SELECTIVE_OP))


def test_megatron_renders_the_estimated_uneven_split() -> None:
    # 18 layers on pp 4: 20 units (embedding and loss as a layer each) 5 per rank -> 4, 5, 5, 4, which
    # Megatron-Core's account-for flags build; an explicit split goes into a layout string
    derived = plan(model=replace(small_llama(), num_layers=18), framework=Framework.MEGATRON, pp=4)
    args = megatron.megatron_args(derived)
    assert (
        "--account-for-embedding-in-pipeline-split" in args and "--account-for-loss-in-pipeline-split" in args
    )
    assert checks.megatron_split(checks.megatron_flags(args), 18, 4) == [4, 5, 5, 4]
    explicit = replace(derived, layout=replace(derived.layout, pipeline_layers=(3, 6, 6, 3)))
    args = megatron.megatron_args(explicit)
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*3|t*6|t*6|t*3L"
    assert checks.megatron_split(checks.megatron_flags(args), 18, 4) == [3, 6, 6, 3]


def test_every_target_renders_the_estimated_split_or_says_why() -> None:
    # Llama-3-8B's 32 layers on pp 4 with the embedding and loss counted (8, 9, 8, 7): torchtitan's
    # first/last-stage-less-layers give it, DeepSpeed's 'uniform' partition over [embedding, layers,
    # head] gives 18 layers' 4, 5, 5, 4; an explicit odd split only Megatron renders
    accounted = {"pipeline_account_for_embedding": True, "pipeline_account_for_loss": True}
    derived = plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3, pp=4, **accounted)
    args = torchtitan.train_args(derived)
    assert args[args.index("--parallelism.pipeline_parallel_first_stage_less_layers") + 1] == "1"
    assert args[args.index("--parallelism.pipeline_parallel_last_stage_less_layers") + 1] == "1"
    explicit = replace(derived.layout, pipeline_layers=(6, 10, 10, 6), **dict.fromkeys(accounted, False))
    with pytest.raises(Unsupported, match="module_fqns_per_model_part"):
        torchtitan.train_args(replace(derived, layout=explicit))
    even = plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3, pp=2)
    args = torchtitan.train_args(even)  # an even split: nothing counted for the embedding or loss
    assert args[args.index("--parallelism.pipeline_parallel_first_stage_less_layers") + 1] == "0"
    ds = plan(model=replace(small_llama(), num_layers=18), framework=Framework.DEEPSPEED, zero_stage=1, pp=4)
    assert deepspeed.ds_config(ds)["pipeline"] == {"stages": 4, "partition": "uniform"}
    with pytest.raises(Unsupported, match="PipelineModule"):
        deepspeed.ds_config(replace(ds, layout=replace(ds.layout, pipeline_layers=(3, 6, 6, 3))))


def test_deepspeed_pipeline_checkpoints_its_layers_where_the_layout_recomputes_them() -> None:
    # the pipeline engine checkpoints past an activation_checkpoint_interval of 0, its default
    # (runtime/config.py get_pipeline_config; pipe/engine.py): a pp 2 'recompute full' run kept every
    # activation, and the header asked for transformers' switch, which a PipelineModule has not
    # (recompute review)
    full = plan(framework=Framework.DEEPSPEED, zero_stage=1, pp=2, recompute=Recompute.FULL)
    assert deepspeed.ds_config(full)["pipeline"] == {
        "stages": 2,
        "partition": "type:DecoderLayer",
        "activation_checkpoint_interval": 1,
        # the checkpointed embedding takes integer inputs, which the reentrant checkpoint cannot
        # (train_batch: "loss must be a scalar tensor with grad_fn"; change review)
        "use_reentrant": False,
    }
    duties = deepspeed.model_code_duties(full)
    assert "partition_method='type:DecoderLayer', activation_checkpoint_interval=1)" in duties
    assert "activation_checkpointing_enable" not in duties
    kept = plan(framework=Framework.DEEPSPEED, zero_stage=1, pp=2)
    assert "activation_checkpoint_interval" not in deepspeed.ds_config(kept)["pipeline"]
    flat = plan(framework=Framework.DEEPSPEED, zero_stage=1, recompute=Recompute.FULL)
    assert "activation_checkpointing_enable" in deepspeed.model_code_duties(flat)


def deepspeed_partition_uniform(items: int, parts: int) -> list[int]:
    """Specs per stage of DeepSpeed's partition_uniform (runtime/utils.py, 0.10.1+): items // parts
    each, the first items % parts one more (written from its rule, for the check below)."""
    share, extra = divmod(items, parts)
    return [share + (1 if part < extra else 0) for part in range(parts)]


@pytest.mark.parametrize(("layers", "pp"), [(28, 8), (34, 8), (18, 4), (30, 4), (32, 4), (62, 16), (14, 16)])
def test_deepspeed_renders_every_derived_split_its_uniform_partition_gives(layers: int, pp: int) -> None:
    # the estimate shares L + 2 units (embedding, layers, head) as DeepSpeed's partition_uniform shares
    # its specs, whether or not pp divides them: Qwen2.5-7B's 28 layers on pp 8 ([3,4,4,4,4,4,3,2]
    # layers, 30 specs 4 4 4 4 4 4 3 3) was refused as if only an even share rendered (pipeline review)
    spec = replace(small_llama(), num_layers=layers)
    ds = plan(nodes=pp // 8 or 1, model=spec, framework=Framework.DEEPSPEED, zero_stage=1, pp=pp)
    stages = list(pipeline.stage_layers(layers, ds.layout))
    if layers % pp == 0:
        assert deepspeed.ds_config(ds)["pipeline"] == {"stages": pp, "partition": "type:DecoderLayer"}
        return
    assert deepspeed.ds_config(ds)["pipeline"] == {"stages": pp, "partition": "uniform"}
    specs = deepspeed_partition_uniform(layers + 2, pp)
    assert [specs[0] - 1, *specs[1:-1], specs[-1] - 1] == stages


def test_torchtitan_pipeline_batch_accounting() -> None:
    # 1 node, pp=2 -> dp=4; 256 = micro 1 x 64 microbatches x dp 4; local batch = 64.
    args = torchtitan.train_args(plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3, pp=2))
    assert args[args.index("--training.local_batch_size") + 1] == "64"
    assert "--training.disable_cuda_graphs" in args and args[-1] == "activation_checkpoint:none"


def test_torchtitan_runs_eager_as_estimated() -> None:
    """torchtitan 0.3.0 captures the forward and backward as a CUDA graph unless told not to (trainer.py:
    wrap_with_cuda_graph); the estimate times eager launches and frees the gradients at zero_grad, so every
    file turns graphs off, not only those where 0.3.0 refuses them (pp, ep; torchtitan review)."""
    args = torchtitan.train_args(plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3))
    assert "--training.disable_cuda_graphs" in args
    content = torchtitan.render(plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3))[0].content
    assert "CUDA graphs are off" in content
    assert "flex_cp_allgather" not in content  # said where context parallelism runs it


def test_torchtitan_says_its_context_parallelism_is_flexattentions_all_gather() -> None:
    """torchtitan 0.3.0's CP under FlexAttention all-gathers K and V (flex_cp_allgather), not the SDPA
    ring the estimate times (torchtitan review): the file says so."""
    files = torchtitan.render(plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3, cp=2))
    assert "flex_cp_allgather" in files[0].content


def test_torchtitan_refuses_expert_parallelism_its_mesh_cannot_hold() -> None:
    """torchtitan 0.3.0 builds the experts' mesh (pp, dp_replicate, efsdp, ep) with efsdp = dp_shard
    x cp x tp // ep (ParallelDims.build_mesh): unless ep divides that product the mesh does not
    fill the world and the job fails at start. DDP (zero 0) shards over 1 rank."""
    qwen = model("qwen3-30b-a3b").spec
    replicated = plan(model=qwen, framework=Framework.FSDP, zero_stage=0, ep=8)
    assert "ep=8 must divide dp_shard x cp x tp = 1 x 1 x 1" in (torchtitan.refusal(replicated) or "")
    with_cp = plan(nodes=2, model=qwen, framework=Framework.FSDP, zero_stage=0, cp=2, ep=8)
    assert "ep=8 must divide dp_shard x cp x tp = 1 x 2 x 1" in (torchtitan.refusal(with_cp) or "")
    sharded = plan(model=qwen, framework=Framework.FSDP, zero_stage=3, ep=8)
    assert torchtitan.refusal(sharded) is None
    assert "--parallelism.expert_parallel_degree" in torchtitan.train_args(sharded)


def test_torchtitan_refuses_the_ddp_the_estimate_times_for_plain_data_parallelism() -> None:
    """torchtitan 0.3.0 always applies FSDP2 (models/llama3/parallelize.py), on a replicate mesh where
    nothing is sharded, all-reducing after every micro-batch: not the DDP zero_stage 0 is estimated
    as (one reduction per step, its buckets; torchtitan review). One GPU has nothing to reduce."""
    replicated = plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=0)
    assert "zero_stage 0 with dp=8" in (torchtitan.refusal(replicated) or "")
    one = replace(replicated, layout=replace(replicated.layout, dp=1), cluster=replace(
        replicated.cluster, gpus_per_node=1))  # fmt: skip
    assert "zero_stage 0" not in (torchtitan.refusal(one) or "")
    assert torchtitan.refusal(plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3)) is None


def test_torchtitan_refuses_eager_attention_and_says_what_it_runs() -> None:
    """torchtitan 0.3.0's language models run FlexAttention with block-causal masks
    (models/common/config_utils.py): "eager" was rendered unchanged and estimated as the s x s square
    at the GEMM rate (torchtitan review). The launch file says what attention runs."""
    eager = plan(
        model=llama3_8b(), framework=Framework.FSDP, zero_stage=3, train=training(attention=Attention.EAGER)
    )
    assert "attention eager" in (torchtitan.refusal(eager) or "")
    flash = plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3)
    assert torchtitan.refusal(flash) is None
    (launch,) = torchtitan.render(flash)
    assert "FlexAttention with block-causal masks" in launch.content


def test_torchtitan_states_expert_parallelism_of_one_for_an_moe_model() -> None:
    """deepseek_v3_16b's config function sets expert_parallel_degree 8 (torchtitan@4f9e9a4
    models/deepseek_v3/config_registry.py:165), which a plan with ep = 1 inherited: at dp 3 the mesh
    fails (efsdp = 3 // 8), with tp 2 it ran EP 8 the estimate never timed (torchtitan review)."""
    lite = model("deepseek-v2-lite").spec
    args = torchtitan.train_args(plan(model=lite, framework=Framework.FSDP, zero_stage=3))
    assert _flag_values(args)["--parallelism.expert_parallel_degree"] == "1"
    # a dense model's configs set none: nothing to state
    assert "--parallelism.expert_parallel_degree" not in torchtitan.train_args(
        plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3)
    )


# ---------------------------------------------------------------- the estimate's job is the shipped job


def _flag_values(args: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, word in enumerate(args):
        if word.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            out[word] = nxt if nxt is not None and not nxt.startswith("--") else None
    return out


@pytest.mark.parametrize("on", [True, False])
def test_megatron_renders_every_timing_relevant_layout_field(on: bool) -> None:
    # The time model reads tp_comm_overlap, overlap_grad_reduce, sequence_parallel, recompute,
    # virtual stages, the ZeRO stage and the micro-batch: each must show in pretrain_gpt.py's args.
    lo = {
        "framework": Framework.MEGATRON,
        "tp": 2,
        "pp": 2,
        "sequence_parallel": on,
        "tp_comm_overlap": on,
        "overlap_grad_reduce": on,
        "recompute": Recompute.SELECTIVE if on else Recompute.FULL,
        "virtual_pipeline_stages": 2 if on else 1,
        "zero_stage": 1 if on else 0,
        "micro_batch_size": 2 if on else 1,
    }
    f = _flag_values(megatron.megatron_args(plan(**lo)))
    assert ("--sequence-parallel" in f) is on
    assert ("--tp-comm-overlap" in f) is on
    assert ("--overlap-grad-reduce" in f) is on
    assert ("--overlap-param-gather" in f) is on  # with the distributed optimizer only
    assert ("--use-distributed-optimizer" in f) is on
    assert f["--recompute-granularity"] == ("selective" if on else "full")
    assert ("--num-layers-per-virtual-pipeline-stage" in f) is on  # 16 layers / pp 2 / vpp 2 = 4
    assert f["--micro-batch-size"] == ("2" if on else "1")


def test_megatron_overlap_grad_reduce_without_distributed_optimizer() -> None:
    f = _flag_values(megatron.megatron_args(plan(framework=Framework.MEGATRON, overlap_grad_reduce=True)))
    assert "--overlap-grad-reduce" in f
    assert "--overlap-param-gather" not in f and "--use-distributed-optimizer" not in f


def test_megatron_renders_the_gradient_dtype_and_fp8_parameter_gather() -> None:
    # the estimate's bf16 gradient buffer and fp8 weights are the run's: --grad-reduce-in-bf16 (else
    # validate_args accumulates bf16 grads in fp32) and --fp8-param-gather
    # NVIDIA's recipes' choices are the defaults: a layout that leaves them out runs them
    fp8 = training(precision=Precision.FP8)
    lean = plan(framework=Framework.MEGATRON, zero_stage=1, train=fp8)
    f = _flag_values(megatron.megatron_args(lean))
    assert "--grad-reduce-in-bf16" in f and "--fp8-param-gather" in f and "--use-distributed-optimizer" in f
    megatron_lm = plan(framework=Framework.MEGATRON, zero_stage=1, grad_reduce_in_fp32=True,
                       fp8_param_gather=False, train=fp8)  # fmt: skip
    own = _flag_values(megatron.megatron_args(megatron_lm))
    assert "--grad-reduce-in-bf16" not in own and "--fp8-param-gather" not in own
    with pytest.raises(Unsupported, match="megatron target"):
        accelerate.render(plan(framework=Framework.MEGATRON, zero_stage=1))  # bf16: the bf16 buffer
    # bf16's precision-aware optimizer (NVIDIA's recipes): rendered where the estimate takes it, and
    # Megatron-LM's own optimizer where the layout says so
    aware = _flag_values(megatron.megatron_args(plan(framework=Framework.MEGATRON, zero_stage=1)))
    assert "--use-precision-aware-optimizer" in aware
    own_optimizer = plan(framework=Framework.MEGATRON, zero_stage=1, precision_aware_optimizer=False)
    assert "--use-precision-aware-optimizer" not in _flag_values(megatron.megatron_args(own_optimizer))
    assert "--use-precision-aware-optimizer" not in own  # fp8: Megatron's own fp32 master
    megatron_lm_bf16 = plan(model=GPT2, train=GPT2_TRAINING, framework=Framework.MEGATRON, zero_stage=1,
                            recompute=Recompute.FULL, **MEGATRON_LM_OWN)  # fmt: skip
    assert accelerate.accelerate_config(megatron_lm_bf16)["distributed_type"] == "MEGATRON_LM"


def test_megatron_refuses_tp_comm_overlap_without_sequence_parallel() -> None:
    with pytest.raises(Unsupported, match="sequence parallelism"):
        megatron.megatron_args(plan(framework=Framework.MEGATRON, tp=2, tp_comm_overlap=True))
    with pytest.raises(Unsupported, match="sequence parallelism"):
        megatron.megatron_args(
            plan(framework=Framework.MEGATRON, sequence_parallel=True, tp_comm_overlap=True)
        )


def test_torchtitan_renders_async_tp_and_the_others_refuse_it() -> None:
    # torchtitan 0.3.0 CompileConfig.enable_async_tensor_parallel, beside --compile.enable
    asynctp: dict[str, Any] = {
        "framework": Framework.FSDP,
        "zero_stage": 3,
        "tp": 2,
        "sequence_parallel": True,
        "tp_comm_overlap": True,
        "torch_compile": Compile.MODEL_AND_LOSS,
    }
    args = torchtitan.train_args(plan(model=llama3_8b(), **asynctp))
    assert "--compile.enable_async_tensor_parallel" in args and "--compile.enable" in args
    vanilla = torchtitan.train_args(plan(model=llama3_8b(), **(asynctp | {"tp_comm_overlap": False})))
    assert "--compile.enable_async_tensor_parallel" not in vanilla
    with pytest.raises(Unsupported, match="Async TP"):
        torchtitan.train_args(plan(model=llama3_8b(), **(asynctp | {"torch_compile": Compile.NONE})))
    # Accelerate runs no FSDP with TP (transformers 5.24 loads a TP model on its own mesh, a launch
    # review reproduced it), with or without Async TP or SP; the HF Trainer runs data parallelism only
    plain = asynctp | {"tp_comm_overlap": False, "sequence_parallel": False}
    for layout in (asynctp, plain):
        assert "transformers 5.24 loads a tensor-parallel model" in str(accelerate.refusal(plan(**layout)))
        assert hf_trainer.refusal(plan(**layout)) is not None


@pytest.mark.parametrize("pp", [1, 2])
def test_accelerate_megatron_accumulates_the_estimated_micro_batches(pp: int) -> None:
    """MegatronLMPlugin's global batch is dp x micro x num_micro_batches (default 1) with or
    without a pipeline: a layout accumulating 16 micro-batches on dp 4 without one trained a
    global batch of 4 instead of 64."""
    lo = {
        "framework": Framework.MEGATRON,
        "tp": 2,
        "pp": pp,
        "micro_batch_size": 1,
        "recompute": Recompute.FULL,
    }
    chosen = plan(model=GPT2, train=replace(GPT2_TRAINING, global_batch_size=64), **lo, **MEGATRON_LM_OWN)
    config = accelerate.accelerate_config(chosen)
    assert config["megatron_lm_config"]["megatron_lm_num_micro_batches"] == 64 // chosen.layout.dp
    checks.check_accelerate(config, chosen)


def test_accelerate_megatron_refuses_overlaps_it_cannot_set() -> None:
    with pytest.raises(Unsupported, match="megatron target"):
        accelerate.render(plan(framework=Framework.MEGATRON, zero_stage=1, overlap_grad_reduce=True))


@pytest.mark.parametrize(
    ("stage", "offload", "overlap", "expected_overlap"),
    [
        (1, Offload.NONE, True, True),
        (2, Offload.CPU, None, False),  # DeepSpeed's default below stage 3
        (3, Offload.CPU, None, True),  # ... and at stage 3
        (3, Offload.NONE, False, False),
    ],
)
def test_deepspeed_renders_every_timing_relevant_layout_field(
    stage: int, offload: Offload, overlap: bool | None, expected_overlap: bool
) -> None:
    p = plan(
        framework=Framework.DEEPSPEED,
        zero_stage=stage,
        offload_optimizer=offload,
        micro_batch_size=2,
        overlap_grad_reduce=overlap,
    )
    config = deepspeed.ds_config(p)
    zero = config["zero_optimization"]
    assert zero["stage"] == stage
    assert zero.get("offload_optimizer", {}).get("device", "none") == str(offload)
    assert config["train_micro_batch_size_per_gpu"] == 2
    assert config["gradient_accumulation_steps"] == 256 // (2 * 8)
    assert zero["overlap_comm"] is expected_overlap


def test_deepspeed_buckets_are_the_memory_models() -> None:
    # One function sizes the buckets for ds_config.json and for the memory estimate.
    p = plan(nodes=2, model=llama3_8b(), framework=Framework.DEEPSPEED, zero_stage=3)
    zero = deepspeed.zero_block(p)
    b = deepspeed_buckets(p.model, p.layout)
    h = 4096
    assert zero["reduce_bucket_size"] == b.reduce_bucket_elements == h * h
    assert zero["stage3_prefetch_bucket_size"] == b.prefetch_bucket_elements == 9 * h * h // 10
    assert zero["stage3_param_persistence_threshold"] == b.param_persistence_threshold == 10 * h
    assert zero["stage3_max_live_parameters"] == b.max_live_parameters
    assert zero["overlap_comm"] is b.overlap_comm
    # ZeRO-1/2 with overlap_comm keep two reduce buffers (stage_1_and_2.py double buffering).
    z2 = replace(p.layout, zero_stage=2, overlap_grad_reduce=True)
    assert deepspeed_buckets(p.model, z2).reduce_buffer_elements == 2 * h * h
    assert deepspeed_buckets(p.model, replace(z2, overlap_grad_reduce=None)).reduce_buffer_elements == h * h
    # small models: clamped to 1e7 elements
    assert deepspeed_buckets(small_llama(), z2).reduce_bucket_elements == 10_000_000


@pytest.mark.parametrize(
    ("layout", "words"),
    [
        ({"tp": 2, "sequence_parallel": True, "zero_stage": 1}, "no Megatron-style sequence parallelism"),
        ({"zero_stage": 0, "overlap_grad_reduce": True}, "overlap_comm"),
        ({"pp": 2, "zero_stage": 1, "overlap_grad_reduce": True}, "overlap_comm"),
    ],
)
def test_deepspeed_refuses_what_the_estimate_would_misdescribe(layout: dict[str, object], words: str) -> None:
    with pytest.raises(Unsupported, match=words):
        deepspeed.ds_config(plan(framework=Framework.DEEPSPEED, **layout))


# ---------------------------------------------------------------- accelerate runs the shared ds_config.json


@pytest.mark.parametrize(
    ("nodes", "layout"),
    [
        (1, {"zero_stage": 1, "overlap_grad_reduce": True}),
        (1, {"zero_stage": 2, "offload_optimizer": Offload.CPU}),
        (2, {"zero_stage": 3, "offload_optimizer": Offload.NVME, "offload_params": Offload.NVME}),
    ],
)
def test_accelerate_deepspeed_points_at_the_deepspeed_targets_ds_config(
    nodes: int, layout: dict[str, object]
) -> None:
    # Inline plugin keys would leave DeepSpeed on its own buckets (reduce_bucket_size 5e8),
    # about 1 GB/GPU more than the estimate counts: the config must name the shared file.
    p = plan(nodes=nodes, model=llama3_8b(), framework=Framework.DEEPSPEED, **layout)
    ds = accelerate.accelerate_config(p)["deepspeed_config"]
    assert ds["deepspeed_config_file"] == deepspeed.CONFIG_NAME
    assert set(ds) <= {"deepspeed_config_file", "zero3_init_flag", "deepspeed_multinode_launcher"}
    assert "mixed_precision" not in accelerate.accelerate_config(p)
    ours = {a.name: a for a in accelerate.render(p)}
    theirs = {a.name: a for a in deepspeed.render(p)}
    assert ours[deepspeed.CONFIG_NAME].content == theirs[deepspeed.CONFIG_NAME].content  # byte-identical
    assert ours[deepspeed.CONFIG_NAME].target is Target.ACCELERATE
    zero = json.loads(ours[deepspeed.CONFIG_NAME].content)["zero_optimization"]
    assert zero["reduce_bucket_size"] == deepspeed_buckets(p.model, p.layout).reduce_bucket_elements
    # render() keeps one ds_config.json for both targets (it raises if they differ).
    artifacts, unsupported = render(p, [Target.DEEPSPEED, Target.ACCELERATE])
    assert not unsupported
    assert [a.name for a in artifacts].count(deepspeed.CONFIG_NAME) == 1


def test_accelerate_deepspeed_refuses_what_ds_config_refuses() -> None:
    # The same ds_config.json runs under Accelerate, so DeepSpeed's refusals carry over.
    p = plan(framework=Framework.DEEPSPEED, zero_stage=0, overlap_grad_reduce=True)
    with pytest.raises(Unsupported, match="overlap_comm") as info:
        accelerate.render(p)
    assert info.value.target is Target.ACCELERATE


DEEPSEEK_LIKE = ModelSpec(
    name="deepseek-mini",
    family="deepseek_v3",
    num_layers=6,
    hidden_size=1024,
    num_attention_heads=16,
    num_kv_heads=16,
    ffn_hidden_size=4096,
    vocab_size=32000,
    moe=MoESpec(
        num_experts=16,
        top_k=4,
        expert_ffn_hidden_size=512,
        num_shared_experts=1,
        shared_expert_ffn_hidden_size=1024,
    ),
    moe_layers=(2, 3, 4, 5),
    mla=MLASpec(q_lora_rank=384, kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64),
)


# The same, routing only over its routed experts (no shared expert): DeepSpeed's MoE layer computes it
ROUTED_ONLY = replace(
    DEEPSEEK_LIKE,
    name="routed-mini",
    moe=MoESpec(num_experts=16, top_k=4, expert_ffn_hidden_size=512),
)


def test_megatron_renders_latent_attention_and_the_moe_layer_pattern() -> None:
    args = megatron.megatron_args(plan(model=DEEPSEEK_LIKE, framework=Framework.MEGATRON, zero_stage=1, ep=4))
    f = _flag_values(args)
    assert "--multi-latent-attention" in args and "--qk-layernorm" in args
    assert (f["--q-lora-rank"], f["--kv-lora-rank"]) == ("384", "128")
    assert (f["--qk-head-dim"], f["--qk-pos-emb-head-dim"], f["--v-head-dim"]) == ("64", "32", "64")
    assert f["--moe-layer-freq"] == "[0]*2+[1]*4"  # first_k_dense_replace 2
    assert eval(f["--moe-layer-freq"]) == [0, 0, 1, 1, 1, 1]  # what Megatron's parser evaluates
    assert "--group-query-attention" not in args


def test_megatron_renders_expert_tensor_parallelism_folded_into_the_stage() -> None:
    # TP 2 x DP 4 = 8 ranks per stage hold EP 8 x ETP 1 (MoE parallel folding): ep > dp, valid only
    # because the experts are not split over tp
    folded = plan(model=DEEPSEEK_LIKE, framework=Framework.MEGATRON, zero_stage=1, tp=2,
                  sequence_parallel=True, ep=8, etp=1)  # fmt: skip
    f = _flag_values(megatron.megatron_args(folded))
    assert (f["--expert-model-parallel-size"], f["--expert-tensor-parallel-size"]) == ("8", "1")
    for artifact in megatron.render(folded):
        checks.check_artifact(artifact, folded)
    default = plan(model=DEEPSEEK_LIKE, framework=Framework.MEGATRON, zero_stage=1, tp=2,
                   sequence_parallel=True, ep=4)  # fmt: skip
    assert "--expert-tensor-parallel-size" not in megatron.megatron_args(default)  # Megatron's default: tp
    # Accelerate's MegatronLMPlugin builds no MoE model as Hugging Face's is: refused
    for layout in (folded, default):
        own = replace(layout, layout=replace(layout.layout, **MEGATRON_LM_OWN))
        with pytest.raises(Unsupported, match="Accelerate's MegatronLMPlugin builds"):
            accelerate.accelerate_config(own)
    dense = accelerate.accelerate_config(
        plan(model=GPT2, train=GPT2_TRAINING, framework=Framework.MEGATRON, zero_stage=1, tp=2,
             recompute=Recompute.FULL, **MEGATRON_LM_OWN)
    )  # fmt: skip
    assert "megatron_lm_expert_tensor_parallel_size" not in dense["megatron_lm_config"]


def test_megatron_refuses_what_its_gpt_model_cannot_build() -> None:
    windowed = replace(
        small_llama(),
        layer_types=(AttentionKind.SLIDING, AttentionKind.FULL) * 8,
        sliding_window=1024,
        qk_norm=QKNorm.FULL_WIDTH,
    )
    with pytest.raises(Unsupported, match=r"sliding-window.*q/k norm full_width"):
        megatron.megatron_args(plan(model=windowed, framework=Framework.MEGATRON, zero_stage=1))
    qwen3_like = replace(small_llama(), qk_norm=QKNorm.PER_HEAD)
    assert "--qk-layernorm" in megatron.megatron_args(plan(model=qwen3_like, framework=Framework.MEGATRON))


def test_megatron_trains_with_the_dropout_the_estimate_counted() -> None:
    # Megatron-LM defaults to 0.1 hidden and attention dropout; Llama trains without
    f = _flag_values(megatron.megatron_args(plan(framework=Framework.MEGATRON)))
    assert (f["--hidden-dropout"], f["--attention-dropout"]) == ("0.0", "0.0")
    gpt_like = replace(small_llama(), hidden_dropout=0.1, attention_dropout=0.1)
    f = _flag_values(megatron.megatron_args(plan(model=gpt_like, framework=Framework.MEGATRON)))
    assert (f["--hidden-dropout"], f["--attention-dropout"]) == ("0.1", "0.1")


def test_deepspeed_moe_splits_the_experts_over_tp_as_estimated() -> None:
    # DeepSpeed's MoE layer replicates the experts over the tensor-parallel group unless told to split
    # them (enable_expert_tensor_parallelism=False by default); the estimate splits them over tp. Its
    # routing defaults to num_experts=1, k=1: the line names the model's (top-4 of 16 here)
    def header(**layout: Any) -> str:
        artifacts = deepspeed.render(plan(model=ROUTED_ONLY, framework=Framework.DEEPSPEED, **layout))
        return next(a.content for a in artifacts if a.name.endswith(".sh"))

    assert (
        "MoE(hidden_size=1024, num_experts=16, k=4, ep_size=4, enable_expert_tensor_parallelism=True)"
        in header(tp=2, ep=4, zero_stage=1)
    )
    assert "MoE(hidden_size=1024, num_experts=16, k=4, ep_size=8)." in header(ep=8, zero_stage=1)
    # a capacity the estimate pads to, other than DeepSpeed's default 1.0, is the script's too
    assert "MoE(hidden_size=1024, num_experts=16, k=4, ep_size=8, capacity_factor=1.25)." in header(
        ep=8, zero_stage=1, moe_capacity_factor=1.25
    )
    assert "MoE(hidden_size=1024, num_experts=16, k=4, ep_size=8)." in header(
        ep=8, zero_stage=1, moe_capacity_factor=1.0
    )


@pytest.mark.parametrize(("ep", "factor"), [(1, None), (2, None), (8, None), (8, 1.0), (8, 1.25)])
def test_deepspeed_builds_deepspeed_moe_exactly_where_the_estimate_pads_to_a_capacity(
    ep: int, factor: float | None
) -> None:
    # ep = 1: no MoE line, so the script trains the model's own (dropless) block: nothing padded
    lo = plan(
        model=ROUTED_ONLY, framework=Framework.DEEPSPEED, ep=ep, zero_stage=1, moe_capacity_factor=factor
    )
    script = next(a.content for a in deepspeed.render(lo) if a.name.endswith(".sh"))
    assert ("deepspeed.moe.layer.MoE(" in script) == (lo.layout.capacity_factor is not None)
    if lo.layout.capacity_factor not in (None, 1.0):  # 1.0 is DeepSpeed MoE's own default
        assert f"capacity_factor={lo.layout.capacity_factor:g}" in script


def test_megatron_renders_the_estimated_recompute_modules() -> None:
    # DeepSeek-V3's H100 recipe (Megatron-Bridge run_script.py): selective mla_up_proj + mlp
    modules = (RecomputeModule.MLA_UP_PROJ, RecomputeModule.MLP, RecomputeModule.MOE_ACT)
    chosen = plan(model=DEEPSEEK_LIKE, framework=Framework.MEGATRON, zero_stage=1, ep=4,
                  recompute=Recompute.SELECTIVE, recompute_modules=modules)  # fmt: skip
    args = megatron.megatron_args(chosen)
    at = args.index("--recompute-modules")
    assert args[at - 2 : at + 4] == ["--recompute-granularity", "selective", "--recompute-modules",
                                     "mla_up_proj", "mlp", "moe_act"]  # fmt: skip
    assert "--moe-grouped-gemm" in args  # moe_act needs it (TransformerConfig)
    for artifact in megatron.render(chosen):
        checks.check_artifact(artifact, chosen)
    # Megatron's default (core_attn) is left to Megatron
    default = plan(framework=Framework.MEGATRON, zero_stage=1, recompute=Recompute.SELECTIVE)
    assert "--recompute-modules" not in megatron.megatron_args(default)
    # MegatronLMPlugin builds no MoE model as Hugging Face's is, and recomputes full layers only
    with pytest.raises(Unsupported, match="Accelerate's MegatronLMPlugin builds"):
        accelerate.accelerate_config(chosen)
    selective = plan(model=GPT2, train=GPT2_TRAINING, framework=Framework.MEGATRON, zero_stage=1,
                     recompute=Recompute.SELECTIVE, **MEGATRON_LM_OWN)  # fmt: skip
    with pytest.raises(
        Unsupported, match="recompute selective: MegatronLMPlugin sets recompute_granularity full"
    ):
        accelerate.accelerate_config(selective)


def test_megatron_renders_multi_token_prediction_on_the_last_stage() -> None:
    # DeepSeek-V3's recipes train one MTP depth; in a layout string it sits before the loss ('mL')
    mtp = training(mtp_num_layers=1)
    chosen = plan(model=replace(small_llama(), num_layers=18), train=mtp, framework=Framework.MEGATRON, pp=4,
                  zero_stage=1, pipeline_layers=(3, 6, 6, 3))  # fmt: skip
    args = megatron.megatron_args(chosen)
    assert args[args.index("--mtp-num-layers") + 1] == "1"
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*3|t*6|t*6|t*3mL"
    for artifact in megatron.render(chosen):
        checks.check_artifact(artifact, chosen)
    assert "--mtp-num-layers" not in megatron.megatron_args(replace(chosen, training=training()))
    even = replace(chosen, model=GPT2, layout=replace(chosen.layout, pp=2, dp=4, pipeline_layers=None,
                   recompute=Recompute.FULL, **MEGATRON_LM_OWN))  # fmt: skip
    with pytest.raises(Unsupported, match="mtp-num-layers"):
        accelerate.accelerate_config(replace(even, training=replace(mtp, seq_len=1024)))


def test_megatron_renders_the_ep_all_to_all_overlap() -> None:
    overlapped = plan(
        model=DEEPSEEK_LIKE, framework=Framework.MEGATRON, zero_stage=1, ep=4, moe_a2a_overlap=True
    )
    args = megatron.megatron_args(overlapped)
    assert "--overlap-moe-expert-parallel-comm" in args
    assert args[args.index("--moe-token-dispatcher-type") + 1] == "alltoall"  # what the overlap needs
    for artifact in megatron.render(overlapped):
        checks.check_artifact(artifact, overlapped)
    with pytest.raises(Unsupported, match="Accelerate's MegatronLMPlugin builds"):
        accelerate.accelerate_config(overlapped)  # no MoE model as Hugging Face's is


def test_megatron_renders_the_flex_dispatcher_with_the_hybridep_backend() -> None:
    flex = plan(
        model=DEEPSEEK_LIKE,
        framework=Framework.MEGATRON,
        zero_stage=1,
        ep=4,
        moe_dispatcher=MoeDispatcher.FLEX,
    )
    args = megatron.megatron_args(flex)
    assert args[args.index("--moe-token-dispatcher-type") + 1] == "flex"
    assert args[args.index("--moe-flex-dispatcher-backend") + 1] == "hybridep"  # what the estimate times
    for artifact in megatron.render(flex):
        checks.check_artifact(artifact, flex)
    alltoall = megatron.megatron_args(
        replace(flex, layout=replace(flex.layout, moe_dispatcher=MoeDispatcher.ALLTOALL))
    )
    assert "--moe-flex-dispatcher-backend" not in alltoall
    assert alltoall[alltoall.index("--moe-token-dispatcher-type") + 1] == "alltoall"
    with pytest.raises(Unsupported, match="Accelerate's MegatronLMPlugin builds"):
        accelerate.accelerate_config(flex)


def test_accelerate_names_what_train_py_must_do_for_context_parallelism() -> None:
    """The config only builds Accelerate's device mesh: train.py splits the sequence for CP
    (maybe_context_parallel), as accelerate's nd_parallel example does. The launch script says so,
    and says nothing of it where the layout has none; TP it refuses (transformers 5.24 loads a TP
    model on its own mesh, not Accelerate's)."""

    def header(p: Plan) -> str:
        (script,) = [a for a in accelerate.render(p) if a.name == accelerate.LAUNCH_NAME]
        return script.content

    cp = header(plan(framework=Framework.FSDP, zero_stage=3, cp=2))
    assert "maybe_context_parallel" in cp and "tp_plan" not in cp
    # torch's context parallelism splits the sequence inside SDPA alone: a model loaded with
    # flash_attention_2 attends within each shard (long-context review), so the duty says sdpa
    assert 'attn_implementation="sdpa"' in cp and '"flash_attention_2")' not in cp
    plain = header(plan(framework=Framework.FSDP, zero_stage=3))
    assert "tp_plan" not in plain and "maybe_context_parallel" not in plain
    assert 'attn_implementation="flash_attention_2"' in plain
    eager = plan(framework=Framework.FSDP, zero_stage=3, cp=2, train=training(attention=Attention.EAGER))
    assert "runs inside SDPA only" in str(accelerate.refusal(eager))
    lora = training(method=Method.LORA)
    tp = plan(train=lora, framework=Framework.FSDP, zero_stage=3, tp=2)
    assert "transformers 5.24" in str(accelerate.refusal(tp))


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
def test_deepspeed_expert_parallelism_names_the_model_code_it_needs_under_both_launchers(
    zero_stage: int,
) -> None:
    """ds_config.json cannot build DeepSpeed's MoE layers nor their optimizer groups: the script of
    either launcher that starts DeepSpeed (its own, or Accelerate's plugin) names both; ZeRO-1/2
    assert the experts' 'moe' groups (stage_1_and_2.py _configure_moe_settings), stage 0 does not."""
    moe = plan(model=ROUTED_ONLY, framework=Framework.DEEPSPEED, zero_stage=zero_stage, ep=4)
    for target, launch in ((deepspeed, deepspeed.LAUNCH_NAME), (accelerate, accelerate.LAUNCH_NAME)):
        (script,) = [a.content for a in target.render(moe) if a.name == launch]
        assert "deepspeed.moe.layer.MoE(hidden_size=1024, num_experts=16, k=4, ep_size=4)" in script, target
        assert ("split_params_into_different_moe_groups_for_optimizer" in script) == (zero_stage > 0), target
    dense = plan(framework=Framework.DEEPSPEED, zero_stage=zero_stage)
    (script,) = [a.content for a in accelerate.render(dense) if a.name == accelerate.LAUNCH_NAME]
    assert "deepspeed.moe" not in script


def test_megatron_refuses_a_gpu_transformer_engine_does_not_run_on() -> None:
    """V100 plans recommended Megatron with context parallelism and --tp-comm-overlap, both of which
    exist only in Transformer Engine, whose support starts at Ampere: the Megatron-LM target and
    Accelerate's Megatron plugin refuse such a GPU; an Ampere part is rendered as before."""
    from service.catalog.gpus import gpu

    base = plan(framework=Framework.MEGATRON, zero_stage=1, tp=4, cp=2, sequence_parallel=True)
    for name in ("v100-sxm2-32gb", "t4-16gb"):
        old = replace(base, cluster=replace(base.cluster, gpu=gpu(name)))
        for refuse in (megatron.refusal, accelerate.refusal):
            assert "Transformer Engine layers need NVIDIA Ampere or newer" in (refuse(old) or ""), name
    ampere = replace(base, cluster=replace(base.cluster, gpu=gpu("a100-sxm-80gb")))
    assert megatron.refusal(ampere) is None


def test_whole_layer_recompute_is_turned_on_where_no_file_can() -> None:
    """ds_config's activation_checkpointing configures deepspeed.checkpointing, which Hugging Face
    models do not call, and Accelerate's plain DDP has no key for it: a full-recompute layout's launch
    said nothing, and the run kept every activation (36.6 GB where 21.9 GB was estimated for an 8B
    LoRA on a 4090). The launch header tells the script to checkpoint; where a key does it (FSDP's
    fsdp_activation_checkpointing, the Trainer's argument), nothing more is said."""
    duty = "must call model.activation_checkpointing_enable()"
    full = {"recompute": Recompute.FULL}
    for chosen in (
        plan(framework=Framework.DEEPSPEED, zero_stage=2, **full),
        plan(framework=Framework.FSDP, zero_stage=0, **full),
    ):
        texts = [a.content for a in accelerate.render(chosen)]
        if chosen.layout.framework is Framework.DEEPSPEED:
            texts += [a.content for a in deepspeed.render(chosen)]
        assert all(duty in " ".join(text.split()) for text in texts if text.startswith("#!")), chosen.layout
    sharded = plan(framework=Framework.FSDP, zero_stage=3, **full)
    assert not any(duty in a.content for a in accelerate.render(sharded))
    assert not any(
        duty in a.content for a in deepspeed.render(plan(framework=Framework.DEEPSPEED, zero_stage=2))
    )


def test_the_trainer_refuses_per_op_recompute_whatever_it_shards() -> None:
    """Plain DDP returned before the per-op AC check: a QLoRA plan on one card was recommended with
    selective_op and the Trainer's files ran it without any checkpointing (26 GB on a 25.8 GB card)."""
    for zero in (0, 3):
        chosen = plan(framework=Framework.FSDP, zero_stage=zero, recompute=Recompute.SELECTIVE_OP)
        assert "per-op selective AC" in (hf_trainer.refusal(chosen) or ""), zero


def test_qlora_computes_in_the_trainings_16_bit_dtype() -> None:
    """bnb_4bit_compute_dtype was bfloat16 whatever the precision: fp16 training (a V100's) computes
    its dequantised weights in float16."""
    import json

    for precision, dtype in ((Precision.FP16, "float16"), (Precision.BF16, "bfloat16")):
        chosen = plan(
            framework=Framework.FSDP, zero_stage=0, train=training(method=Method.QLORA, precision=precision)
        )
        (bnb,) = [a for a in hf_trainer.render(chosen) if a.name == "bnb_config.json"]
        config = json.loads(bnb.content)
        assert (config["bnb_4bit_compute_dtype"], config["bnb_4bit_quant_storage"]) == (dtype, dtype)


def test_the_loss_runs_as_estimated_chunked_or_whole() -> None:
    """torchtitan 0.3.0's configs train with ChunkedLossWrapper (8 chunks: no full logits) while plans
    were estimated with the full logits, about 7 GiB more on Llama 3 8B (consistency review, stop 39):
    the file says the chunks the estimate has, one for the full logits; the other targets compute the
    full logits and refuse a chunked estimate."""
    whole = plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3)
    args = torchtitan.train_args(whole)
    assert args[args.index("--loss.num_chunks") + 1] == "1"
    chunked = plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3, chunked_loss=True)
    args = torchtitan.train_args(chunked)
    assert args[args.index("--loss.num_chunks") + 1] == "8"
    for refusal in (accelerate.refusal, hf_trainer.refusal):
        assert "chunked_loss" in str(refusal(chunked))
    assert "chunked_loss" in str(deepspeed.refusal(plan(framework=Framework.DEEPSPEED, chunked_loss=True)))
    assert "chunked_loss" in str(megatron.refusal(plan(framework=Framework.MEGATRON, chunked_loss=True)))


def test_deepspeed_refuses_expert_parallelism_where_its_moe_layer_routes_otherwise() -> None:
    """At ep > 1 the script builds deepspeed.moe.layer.MoE, whose TopKGate is a bias-free softmax gate
    renormalising its top-k (k >= 2) and which has no plain shared expert (deepspeed/moe/
    sharded_moe.py): a model with shared experts, a router bias, sigmoid or group-limited routing or
    un-renormalised weights would be another model; every target running DeepSpeed refuses it, and
    the search leaves the split out (framework_structure_refusal). At ep = 1 the model's own block
    trains: no refusal. Mixtral-like routing (softmax, top-2 renormalised) runs, its second expert
    chosen by score (the layer samples it by default)."""
    from service.estimator.types import MoERouter, RouterScore
    from service.launchers import framework_structure_refusal

    training = plan().training
    cases = {
        "shared expert": DEEPSEEK_LIKE,
        "router bias": replace(ROUTED_ONLY, moe=replace(ROUTED_ONLY.moe, router_bias=True)),
        "sigmoid scores": replace(ROUTED_ONLY, moe_router=MoERouter(score=RouterScore.SIGMOID)),
        "not renormalised": replace(ROUTED_ONLY, moe_router=MoERouter(normalize_top_k=False)),
        "group-limited": replace(
            ROUTED_ONLY, moe_router=MoERouter(num_groups=4, group_top_k=2, group_score_top_n=1)
        ),
        "scaled by 2.5": replace(ROUTED_ONLY, moe_router=MoERouter(top_k_scaling_factor=2.5)),
    }
    for what, spec in cases.items():
        refused = framework_structure_refusal(Framework.DEEPSPEED, spec, training, 1, 1, 1, 4)
        assert refused is not None and "deepspeed.moe.layer.MoE" in refused, what
        with pytest.raises(Unsupported, match="cannot route as this model does"):
            deepspeed.render(plan(model=spec, framework=Framework.DEEPSPEED, zero_stage=1, ep=4))
        assert framework_structure_refusal(Framework.DEEPSPEED, spec, training, 1, 1, 1, 1) is None
    for spec in (ROUTED_ONLY, replace(ROUTED_ONLY, moe_router=MoERouter())):
        assert framework_structure_refusal(Framework.DEEPSPEED, spec, training, 1, 1, 1, 4) is None
    top2 = replace(ROUTED_ONLY, moe=replace(ROUTED_ONLY.moe, top_k=2))
    (script,) = [a.content for a in deepspeed.render(plan(model=top2, framework=Framework.DEEPSPEED,
                 zero_stage=1, ep=4)) if a.name == deepspeed.LAUNCH_NAME]  # fmt: skip
    assert "k=2, ep_size=4, top2_2nd_expert_sampling=False)" in script


def test_deepspeed_ulysses_runs_through_accelerates_alst_and_nowhere_else() -> None:
    """DeepSpeed's Ulysses lives in the model code (ALST's UlyssesSPAttentionHF, which Accelerate's
    ParallelismConfig with sp_backend deepspeed registers; accelerate >= 1.12): the accelerate target
    writes sp_size = cp over the data-parallel ranks (dp_shard x sp = processes), the attention it
    runs (flash_attention_2 or sdpa) and the script's duties, and ships the same ds_config.json
    (train_batch_size counts world / sp, as DeepSpeed's batch check does under ALST's mpu). The
    deepspeed launcher, the HF Trainer and the wrappers of the deepspeed entry point refuse it; so
    does Accelerate with eager attention, experts or QLoRA (it was refused everywhere: DeepSpeed
    long-context plans were infeasible though their estimate fitted)."""
    import yaml

    from service.estimator.types import Attention, Method
    from service.launchers import framework_structure_refusal

    ulysses = plan(framework=Framework.DEEPSPEED, zero_stage=1, cp=4)  # dp 2 x sp 4 on 8 GPUs
    files = {a.name: a.content for a in accelerate.render(ulysses)}
    config = yaml.safe_load(files[accelerate.CONFIG_NAME])
    assert config["distributed_type"] == "DEEPSPEED"
    assert config["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 1,
        "parallelism_config_dp_shard_size": 2,
        "parallelism_config_sp_size": 4,
        "parallelism_config_sp_backend": "deepspeed",
        "parallelism_config_sp_seq_length_is_variable": True,
        "parallelism_config_sp_attn_implementation": "flash_attention_2",
    }
    assert json.loads(files[deepspeed.CONFIG_NAME])["train_batch_size"] == 256  # micro x accumulation x dp
    assert "DeepSpeed's Ulysses (ALST)" in files[accelerate.LAUNCH_NAME]
    for target in (deepspeed, hf_trainer):
        with pytest.raises(Unsupported):
            target.render(ulysses)
    sdpa = plan(framework=Framework.DEEPSPEED, zero_stage=1, cp=4, train=training(attention=Attention.SDPA))
    assert "parallelism_config_sp_attn_implementation: sdpa" in accelerate.render(sdpa)[0].content
    for train, words in (
        (training(attention=Attention.EAGER), "eager and flex_attention are refused"),
        (training(method=Method.QLORA), "qlora"),
    ):
        with pytest.raises(Unsupported, match=words):
            accelerate.render(plan(framework=Framework.DEEPSPEED, zero_stage=1, cp=4, train=train))
    job = (small_llama(), training())
    assert framework_structure_refusal(Framework.DEEPSPEED, *job, 1, 1, 4, 1) is None
    assert "tp = pp = ep = 1" in str(framework_structure_refusal(Framework.DEEPSPEED, *job, 2, 1, 2, 1))


def test_torchtitan_reshards_as_estimated_when_context_parallelism_alone_shards() -> None:
    """torchtitan's FSDP shards over dp_shard x cp: at dp 1 and cp 8 it shards over 8 ranks, and left
    to its "default" policy reshards after the forward (ZeRO-3) where stage 2 was estimated; the flag
    was written only for dp_shard > 1 (launch review, stop 41)."""
    for stage, policy in ((2, "never"), (3, "always")):
        args = torchtitan.train_args(
            plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=stage, cp=8)
        )
        assert args[args.index("--parallelism.fsdp_reshard_after_forward") + 1] == policy
        assert args[args.index("--parallelism.data_parallel_shard_degree") + 1] == "1"


def test_slurm_and_kubernetes_carry_the_scripts_duties_and_the_adapter_files() -> None:
    """The wrappers ran the same entry point but dropped what its own launch script tells train.py to
    do, and Kubernetes mounted no adapter files (launch review, stop 41): a QLoRA job under a
    PyTorchJob had no lora_config.json or bnb_config.json and no word of PEFT, a DeepSpeed MoE job's
    sbatch no word of its MoE layers. Both now say what the wrapped target says, and ship its files."""
    import yaml

    from service.estimator.types import Method
    from service.launchers import kubernetes, slurm

    qlora = plan(framework=Framework.FSDP, zero_stage=3, train=training(method=Method.QLORA))
    documents = list(yaml.safe_load_all(kubernetes.render(qlora)[0].content))
    config_map = next(d for d in documents if d["kind"] == "ConfigMap")
    assert {"lora_config.json", "bnb_config.json"} <= set(config_map["data"])
    manifest = kubernetes.render(qlora)[0].content
    assert "/etc/trainplan/lora_config.json" in manifest and "BitsAndBytesConfig" in manifest
    names = {a.name for a in slurm.render(qlora)}
    assert {"lora_config.json", "bnb_config.json"} <= names
    moe = plan(model=ROUTED_ONLY, framework=Framework.DEEPSPEED, zero_stage=1, ep=4)
    (sbatch,) = [a.content for a in slurm.render(moe) if a.name == slurm.SCRIPT_NAME]
    assert "deepspeed.moe.layer.MoE(" in sbatch and "split_params_into_different_moe_groups" in sbatch


def test_the_deepspeed_launch_says_its_batch_counts_autotp_peers() -> None:
    """train_batch_size is tp x the sequences a step trains under AutoTP (DeepSpeed's batch check
    counts every rank), so its logs read tp x as many samples: the launch script says so (launch
    review, stop 41)."""
    (launch,) = [a.content for a in deepspeed.render(plan(framework=Framework.DEEPSPEED, zero_stage=1, tp=2))
                 if a.name == deepspeed.LAUNCH_NAME]  # fmt: skip
    assert "train_batch_size counts AutoTP's 2 tensor-parallel peers" in launch


def test_megatron_gates_the_shared_expert_where_the_model_does() -> None:
    """Qwen2-MoE's shared expert is scaled by a sigmoid gate (estimated with it): Megatron has it as
    --moe-shared-expert-gate (TransformerConfig.moe_shared_expert_gate); it was left out, so the run
    trained another model than the one named (MoE review, stop 41)."""
    gated = replace(
        DEEPSEEK_LIKE,
        moe=replace(DEEPSEEK_LIKE.moe, shared_expert_gate=True),
        mla=None,
        family="qwen2_moe",
    )
    assert "--moe-shared-expert-gate" in megatron.megatron_args(
        plan(model=gated, framework=Framework.MEGATRON, zero_stage=1, ep=4)
    )
    assert "--moe-shared-expert-gate" not in megatron.megatron_args(
        plan(model=DEEPSEEK_LIKE, framework=Framework.MEGATRON, zero_stage=1, ep=4)
    )


def test_accelerate_megatron_renders_only_what_its_plugin_runs_as_estimated() -> None:
    """MegatronLMPlugin builds Megatron's GPT from a few config fields (Llama without GQA, FFN width,
    SwiGLU, RMSNorm or RoPE; Qwen and the rest refused), counts dp as processes / (tp x pp) (cp x the
    batch) and recomputes every layer unless told otherwise; and Megatron's validate_args needs
    CUDA_DEVICE_MAX_CONNECTIONS=1 with tp > 1, which the launch did not export (launch review)."""
    for other in (small_llama(), llama3_8b()):
        with pytest.raises(Unsupported, match="it would train another network"):
            accelerate.render(plan(model=other, framework=Framework.MEGATRON, tp=2, recompute=Recompute.FULL,
                                   **MEGATRON_LM_OWN))  # fmt: skip
    gpt2 = {"model": GPT2, "train": GPT2_TRAINING, "framework": Framework.MEGATRON, **MEGATRON_LM_OWN}
    with pytest.raises(Unsupported, match="ignoring cp"):
        accelerate.render(plan(cp=2, recompute=Recompute.FULL, **gpt2))
    with pytest.raises(Unsupported, match="recompute none"):
        accelerate.render(plan(tp=2, **gpt2))
    files = accelerate.render(plan(tp=2, recompute=Recompute.FULL, **gpt2))
    (launch,) = [a for a in files if a.name == accelerate.LAUNCH_NAME]
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in launch.content.splitlines()


def test_wrappers_of_a_deepspeed_layout_asked_of_the_hf_trainer_run_its_entry_point() -> None:
    """Kubernetes with the HF Trainer (not DeepSpeed's own script) ran `train.py --deepspeed
    --deepspeed_config ...` beside the HF Trainer's files, whose train.py parses TrainingArguments:
    `argument --deepspeed: expected one argument` (launch review). The wrappers run the asked entry."""
    from service.launchers import render as render_all

    chosen = plan(framework=Framework.DEEPSPEED, zero_stage=2)
    for wrapper, name in ((Target.KUBERNETES, "pytorchjob.yaml"), (Target.SLURM, "trainplan.sbatch")):
        files, unsupported = render_all(chosen, [wrapper, Target.HF_TRAINER])
        assert not unsupported
        text = next(a.content for a in files if a.name == name)
        assert "--deepspeed_config" not in text and "--per_device_train_batch_size" in text, name
        raw, _ = render_all(chosen, [wrapper, Target.DEEPSPEED])
        assert "--deepspeed_config" in next(a.content for a in raw if a.name == name)


def test_torchtitan_refuses_a_sequence_past_its_flavors_rope_cache() -> None:
    """A review's case: --training.seq_len 65536 for qwen3_30b_a3b (RoPE cached for 40,960 positions)
    and 262144 for llama3_8b (131,072) were rendered; torchtitan 0.3.0 raises at model build
    (Decoder.Config.update_from_config). DeepSeek-V3's flavors cache 4096 x 4."""
    qwen = model("qwen3-30b-a3b").spec
    long_qwen = plan(model=qwen, framework=Framework.FSDP, zero_stage=3, ep=8, train=training(seq_len=65536,
                     global_batch_size=16))  # fmt: skip
    assert "caches RoPE for 40,960 positions" in (torchtitan.refusal(long_qwen) or "")
    at_limit = plan(model=qwen, framework=Framework.FSDP, zero_stage=3, ep=8, train=training(seq_len=40960,
                    global_batch_size=16))  # fmt: skip
    assert torchtitan.refusal(at_limit) is None
    long_llama = plan(model=llama3_8b(), framework=Framework.FSDP, zero_stage=3, cp=8,
                      train=training(seq_len=262144, global_batch_size=8))  # fmt: skip
    assert "131,072 positions" in (torchtitan.refusal(long_llama) or "")


def test_accelerate_fsdp_accumulation_reduces_every_micro_batch_and_pure_bf16_is_no_mixed_precision() -> None:
    """A launch review (accelerate 1.15): accumulate() runs every micro-batch but the last under
    no_sync unless the GradientAccumulationPlugin says sync_each_batch, and FSDP2 then keeps each
    unit's whole unsharded gradient; and under any mixed precision Accelerate's FSDP2 upcasts the
    parameters to fp32 (fsdp_utils.py), so bf16_pure rendered as 'bf16' trained fp32 weights."""

    def header(p: Plan) -> str:
        (script,) = [a for a in accelerate.render(p) if a.name == accelerate.LAUNCH_NAME]
        return script.content

    sharded = plan(framework=Framework.FSDP, zero_stage=3)
    steps = accumulation(sharded)
    assert steps > 1
    assert f"GradientAccumulationPlugin(num_steps={steps}, sync_each_batch=True)" in header(sharded)
    ddp = plan(framework=Framework.FSDP, zero_stage=0)
    assert "sync_each_batch" not in header(ddp)  # DDP accumulates whole gradients, as estimated
    # the HF Trainer: TrainingArguments.accelerator_config, as a JSON flag (_VALID_DICT_FIELDS)
    args, _ = hf_trainer.training_arguments(sharded)
    assert args["accelerator_config"] == {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
    flags = hf_trainer.cli_flags(args)
    assert (
        flags[flags.index("--accelerator_config") + 1]
        == '{"gradient_accumulation_kwargs":{"sync_each_batch":true}}'
    )
    assert "accelerator_config" not in hf_trainer.training_arguments(ddp)[0]
    pure = plan(framework=Framework.FSDP, zero_stage=3, train=training(precision=Precision.BF16_PURE))
    assert accelerate.accelerate_config(pure)["mixed_precision"] == "no"
    assert "(..., dtype=torch.bfloat16)" in header(pure)
    assert accelerate.accelerate_config(sharded)["mixed_precision"] == "bf16"
    # the HF Trainer likewise: no bf16 flag under sharded FSDP, the model loaded in bf16
    assert "bf16" not in hf_trainer.training_arguments(pure)[0]
    (launch,) = [a.content for a in hf_trainer.render(pure) if a.name == hf_trainer.LAUNCH_NAME]
    assert "(..., dtype=torch.bfloat16)" in launch
    # unsharded (one GPU, DDP) too: the Trainer's --bf16 autocasts over the dtype the model was loaded
    # in, the checkpoint's own under transformers 5 (fine-tuner review); and mixed precision on DDP
    # keeps fp32 weights, which a bf16 checkpoint is not loaded as unless told (change review)
    for stage in (0, 2):
        one = plan(framework=Framework.FSDP, zero_stage=stage, train=training(precision=Precision.BF16_PURE))
        (launch,) = [a.content for a in hf_trainer.render(one) if a.name == hf_trainer.LAUNCH_NAME]
        assert "bf16_pure:" in launch and "(..., dtype=torch.bfloat16)" in launch, launch
        assert "bf16_pure:" in header(one)
    for stage, duty in ((0, True), (2, False)):  # sharded FSDP2 upcasts to fp32 itself
        mixed = plan(framework=Framework.FSDP, zero_stage=stage, train=training(precision=Precision.BF16))
        (launch,) = [a.content for a in hf_trainer.render(mixed) if a.name == hf_trainer.LAUNCH_NAME]
        assert ("(..., dtype=torch.float32)" in launch) is duty, launch
        assert ("(..., dtype=torch.float32)" in header(mixed)) is duty


def test_every_train_py_launch_names_the_encoder_task_head_it_must_build() -> None:
    """A review: a RoBERTa classification plan's files named no model class, so train.py could load
    the masked-LM model (or another label count) rather than the one estimated. The HF Trainer's own
    launch and the Slurm job that runs it both say which class and how many labels."""
    from dataclasses import replace as with_fields

    from service.estimator.types import Head
    from service.launchers import slurm

    spec = with_fields(model("roberta-base").spec, head=Head.SEQUENCE_CLASSIFICATION, num_labels=3)
    classify = plan(model=spec, train=training(seq_len=512), framework=Framework.FSDP, zero_stage=0)
    wanted = "AutoModelForSequenceClassification.from_pretrained(..., num_labels=3)"
    (launch,) = [a.content for a in hf_trainer.render(classify) if a.name == hf_trainer.LAUNCH_NAME]
    assert wanted in launch
    assert any(wanted in a.content for a in slurm.render(classify))
    causal = plan(framework=Framework.FSDP, zero_stage=0)
    assert "AutoModelFor" not in "".join(a.content for a in hf_trainer.render(causal))


def test_accelerate_qlora_on_fsdp1_says_to_wrap_the_adapters_apart() -> None:
    """QLoRA runs on FSDP1 with flat parameters (use_orig_params false), which refuses a unit mixing
    frozen and trainable tensors ("Must flatten tensors with uniform requires_grad"); the HF Trainer
    applies peft's wrap policy itself, Accelerate leaves it to the script (fine-tuning review)."""
    from service.estimator.types import Method

    qlora = plan(framework=Framework.FSDP, zero_stage=3, train=training(method=Method.QLORA))
    launch = next(a.content for a in accelerate.render(qlora) if a.name.endswith(".sh"))
    assert "fsdp_plugin.auto_wrap_policy = peft.utils.other.fsdp_auto_wrap_policy(model)" in launch
    lora = plan(framework=Framework.FSDP, zero_stage=3, train=training(method=Method.LORA))  # FSDP2
    assert "auto_wrap_policy" not in next(
        a.content for a in accelerate.render(lora) if a.name.endswith(".sh")
    )


def test_zero3_launches_of_fused_expert_adapters_ask_for_a_leaf_moe_block() -> None:
    """ZeRO-3 gathers a module's own parameters for its forward, and peft's ParamWrapper reads the
    experts' lora_A / lora_B outside theirs: every DeepSpeed launch of such a plan asks for the MoE
    block as a ZeRO-3 leaf module (review of stop 45's warning, which told of a failure and no cure)."""
    from service.estimator.types import Method
    from service.launchers import hf_trainer

    qwen = model("qwen3-30b-a3b").spec
    zero3 = plan(model=qwen, framework=Framework.DEEPSPEED, zero_stage=3, train=training(method=Method.LORA))
    texts = [a.content for target in (deepspeed, accelerate, hf_trainer) for a in target.render(zero3)]
    assert sum("set_z3_leaf_modules" in text for text in texts) >= 3
    zero2 = plan(model=qwen, framework=Framework.DEEPSPEED, zero_stage=2, train=training(method=Method.LORA))
    assert not any("set_z3_leaf_modules" in a.content for a in deepspeed.render(zero2))


@pytest.mark.parametrize(
    "layout",
    [
        {"framework": Framework.DEEPSPEED, "zero_stage": 3, "recompute": Recompute.FULL},
        {"framework": Framework.MEGATRON, "zero_stage": 1, "recompute": Recompute.NONE},
        {"framework": Framework.FSDP, "zero_stage": 3, "recompute": Recompute.FULL},
    ],
)
def test_no_target_runs_a_layout_estimated_with_activation_offload(layout: dict[str, Any]) -> None:
    """No launch file moves activations to the host (Megatron-LM's --cpu-offloading is not written;
    DeepSpeed's cpu_checkpointing does not reach Hugging Face models' torch.utils.checkpoint), so every
    target refuses such a layout and its estimate says a plan never proposes it (long-context review:
    a Megatron estimate of it answered 200 with no warning)."""
    runs = {*FRAMEWORKS[layout["framework"]].targets, Target.SLURM, Target.KUBERNETES}
    for target in runs:
        refuse = REFUSALS[target]
        assert "activation_offload" in str(refuse(plan(model=llama3_8b(), activation_offload=True, **layout)))
        assert "activation_offload" not in str(refuse(plan(model=llama3_8b(), **layout))), target


def test_megatron_refuses_fp8_with_moe_act_or_layernorm_recompute() -> None:
    """The fp8 recipe the launch writes is delayed scaling, which TransformerConfig refuses with
    selective recompute of moe_act or layernorm (Megatron review: the estimate said nothing)."""
    fp8 = training(precision=Precision.FP8)
    for modules in ((RecomputeModule.MOE_ACT,), (RecomputeModule.LAYERNORM, RecomputeModule.CORE_ATTN)):
        refused = plan(framework=Framework.MEGATRON, zero_stage=1, train=fp8, recompute=Recompute.SELECTIVE,
                       recompute_modules=modules)  # fmt: skip
        assert "delayed scaling" in str(megatron.refusal(refused))
    kept = plan(framework=Framework.MEGATRON, zero_stage=1, train=fp8, recompute=Recompute.SELECTIVE,
                recompute_modules=(RecomputeModule.CORE_ATTN,))  # fmt: skip
    assert "delayed scaling" not in str(megatron.refusal(kept))


@pytest.mark.parametrize(("vendor", "resource"), [("nvidia", "nvidia.com/gpu"), ("amd", "amd.com/gpu")])
def test_a_pytorchjob_asks_for_the_gpus_its_vendors_device_plugin_advertises(
    vendor: str, resource: str
) -> None:
    """AMD's device plugin advertises amd.com/gpu (ROCm/k8s-device-plugin): an MI300X plan's pods asked
    for nvidia.com/gpu and never scheduled (hardware review)."""
    base = plan(framework=Framework.DEEPSPEED, nodes=2, zero_stage=1)
    on = replace(base, cluster=replace(base.cluster, gpu=replace(base.cluster.gpu, vendor=vendor)))
    files = render(on, [Target.KUBERNETES])[0]
    (job,) = [f for f in files if f.name == "pytorchjob.yaml"]
    asked = [line.strip() for line in job.content.splitlines() if "com/gpu:" in line]
    assert asked and all(line == f"{resource}: 8" for line in asked), asked


def test_the_user_loops_are_told_the_steps_the_time_to_train_counts() -> None:
    # DeepSpeed's and Accelerate's configs carry no step count (the loop is train.py's): their headers
    # say how many optimizer steps the tokens take, as HF's max_steps and Megatron's --train-iters do
    # (review of stop 48). 10^9 tokens in steps of 256 x 4,096: 954 steps (953.7 rounded up).
    train = TrainingSpec(seq_len=4096, global_batch_size=256, tokens=10**9)
    ds = plan(train=train, framework=Framework.DEEPSPEED, zero_stage=2)
    script = next(a.content for a in deepspeed.render(ds) if a.name == deepspeed.LAUNCH_NAME)
    assert "must run 954 optimizer steps of global batch 256 (1,048,576 tokens each)" in script
    fsdp = plan(train=train, framework=Framework.FSDP, zero_stage=3)
    assert "must run 954 optimizer steps" in accelerate.duties(fsdp)
    assert "optimizer steps" not in accelerate.duties(plan(framework=Framework.FSDP, zero_stage=3))


def test_a_pytorchjobs_name_leaves_room_for_its_replicas_services() -> None:
    """The training operator names each replica's Service <job>-<master|worker>-<index> (MASTER_ADDR the
    master's), a DNS-1035 label of at most 63 characters its webhook does not check: a 55-character
    job name from a long Hugging Face id made 64-65 character Services and the job never started
    (kubeflow/trainer#1101; a platform review)."""
    import yaml

    long = replace(small_llama(), name="mistralai/Mistral-Small-3.1-24B-Instruct-2503")
    for nodes in (1, 2, 16, 128):
        batch = training(global_batch_size=8 * nodes)
        chosen = plan(nodes=nodes, model=long, train=batch, framework=Framework.FSDP, zero_stage=3)
        job = next(d for d in kubernetes.manifests(chosen) if d["kind"] == "PyTorchJob")
        name = job["metadata"]["name"]
        assert name.startswith("trainplan-mistralai-mistral"), name
        assert len(f"{name}-master-0") <= 63 and len(f"{name}-worker-{max(0, nodes - 2)}") <= 63, name
        text = next(a.content for a in kubernetes.render(chosen) if a.name.endswith(".yaml"))
        assert list(yaml.safe_load_all(text))


def test_a_names_control_characters_leave_every_yaml_file_parseable() -> None:
    """YAML allows no control character in a comment (1.2.2 §5.1): a model or GPU name with ESC, DEL or
    U+FFFF in the files' header made pytorchjob.yaml and accelerate_config.yaml unparseable (201, then
    kubectl refused them; a platform review). The header writes such characters as escapes."""
    import yaml

    for odd in ("m\x1bx", "m\x7fx", "m\x9bx", "m\x08x", "m\uffffx"):
        chosen = plan(nodes=2, model=replace(small_llama(), name=odd), framework=Framework.FSDP, zero_stage=3)
        for write in (kubernetes.render, accelerate.render):
            for artifact in write(chosen):
                if artifact.name.endswith(".yaml"):
                    assert list(yaml.safe_load_all(artifact.content)), (odd, artifact.name)


def test_deepspeeds_nvme_swap_path_is_mounted_and_said() -> None:
    """ds_config's nvme_path is where DeepSpeed swaps (it makes the folder wherever that is): the
    PyTorchJob mounted nothing there, so the swap went to the container's writable layer (ephemeral
    storage the kubelet evicts for, not the NVMe timed), and no script said the path must be the
    node's NVMe (a platform review)."""
    from service.launchers import slurm

    nvme = plan(nodes=2, framework=Framework.DEEPSPEED, zero_stage=3, offload_optimizer=Offload.NVME)
    job = next(d for d in kubernetes.manifests(nvme) if d["kind"] == "PyTorchJob")
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        pod = spec["template"]["spec"]
        assert {"name": "local-nvme", "hostPath": {"path": "/local_nvme", "type": "Directory"}} in pod[
            "volumes"
        ]
        assert {"name": "local-nvme", "mountPath": "/local_nvme"} in pod["containers"][0]["volumeMounts"]
    duty = "swaps to nvme_path /local_nvme"
    for write in (kubernetes.render, slurm.render, deepspeed.render, accelerate.render):
        assert any(duty in " ".join(a.content.split()) for a in write(nvme)), write
    cpu = plan(nodes=2, framework=Framework.DEEPSPEED, zero_stage=3, offload_optimizer=Offload.CPU)
    assert "local-nvme" not in json.dumps(kubernetes.manifests(cpu))
    assert not any(duty in a.content for a in deepspeed.render(cpu))


def test_the_wrappers_of_torchtitan_and_megatron_say_what_their_launch_scripts_say() -> None:
    """torchtitan's launch script says the run starts from a fresh initialisation on the recipe's
    dataset, with FlexAttention and CUDA graphs off; Megatron's that it trains on mock data: the Slurm
    and Kubernetes wrappers running the same entry point said none of it (a platform review)."""
    from service.launchers import slurm

    for chosen, notes in (
        (plan(nodes=2, model=llama3_8b(), framework=Framework.FSDP, zero_stage=3), torchtitan.notes),
        (plan(nodes=2, framework=Framework.MEGATRON, tp=2, zero_stage=1), megatron.notes),
    ):
        first = notes(chosen).strip().splitlines()[0]
        for write in (slurm.render, kubernetes.render):
            assert any(first in a.content for a in write(chosen)), (write, chosen.layout.framework)


def test_every_file_that_writes_the_optimizer_settings_says_they_are_placeholders() -> None:
    """lr 3e-4, beta2 0.95 and weight decay 0.1 are a pretraining recipe's; an encoder fine-tune's files
    wrote them without a word (BERT fine-tunes at 2e-5 to 5e-5; an encoder review): each launch that
    writes them says they are placeholders, the wrappers too."""
    from service.launchers import slurm

    said = "placeholders the estimate does not read"
    for chosen, writes in (
        (
            plan(framework=Framework.DEEPSPEED, zero_stage=2),
            (deepspeed.render, hf_trainer.render, accelerate.render),
        ),
        (plan(framework=Framework.MEGATRON, tp=2, zero_stage=1), (megatron.render,)),
        (plan(framework=Framework.FSDP, zero_stage=3), (hf_trainer.render,)),
    ):
        for write in (*writes, slurm.render, kubernetes.render):
            assert any(said in " ".join(a.content.split()) for a in write(chosen)), (write, chosen.layout)


def test_a_pytorchjobs_strings_stay_strings_for_kubectl() -> None:
    """kubectl reads YAML with go-yaml v2, whose floats need no dot: PyYAML (YAML 1.1) wrote Megatron's
    --adam-eps 1e-08 bare, kubectl read a number into a container's command ([]string) and refused the
    manifest (injection review). Read here with go-yaml's float pattern added, every argument is text."""
    import re

    import yaml

    class GoYaml(yaml.SafeLoader):
        pass

    go_float = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
    GoYaml.add_implicit_resolver("tag:yaml.org,2002:float", go_float, list("-+0123456789."))
    chosen = plan(nodes=2, framework=Framework.MEGATRON, tp=2, zero_stage=1)
    text = next(a.content for a in kubernetes.render(chosen) if a.name.endswith(".yaml"))
    job = next(d for d in yaml.load_all(text, Loader=GoYaml) if d["kind"] == "PyTorchJob")
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        (container,) = spec["template"]["spec"]["containers"]
        assert all(isinstance(word, str) for word in container["command"]), container["command"]
        assert "1e-08" in container["command"]


def test_two_plans_of_one_model_name_their_kubernetes_objects_apart() -> None:
    """Named after the model alone, a second plan's ConfigMap replaced the first's files under its running
    pods (injection review); the same plan keeps its name."""
    first = plan(nodes=2, framework=Framework.DEEPSPEED, zero_stage=3, train=training(global_batch_size=64))
    second = plan(nodes=2, framework=Framework.DEEPSPEED, zero_stage=3, train=training(global_batch_size=256))
    lora = training(method=Method.LORA, lora_rank=16)
    ranks = [
        plan(nodes=2, framework=Framework.FSDP, zero_stage=3, train=replace(lora, lora_rank=r))
        for r in (16, 64)
    ]

    def names(chosen: Plan) -> set[str]:
        return {d["metadata"]["name"] for d in kubernetes.manifests(chosen)}

    assert names(first) == names(first) and not names(first) & names(second)
    # what only a mounted file says (the adapters' rank) names them apart too (change review)
    assert not names(ranks[0]) & names(ranks[1])


def test_torchtitan_refuses_a_qwen3_shape_with_another_rope_base() -> None:
    """torchtitan 0.3.0's qwen3 flavors apply RoPE base 1,000,000 without scaling: the Qwen3-30B-A3B
    shape with the 2507 / Coder releases' 10,000,000 was launched on it (2025-26 configs review)."""
    from service.catalog.models import model as preset

    qwen = preset("qwen3-30b-a3b").spec
    assert torchtitan.job_refusal(qwen, training()) is None
    reason = torchtitan.job_refusal(replace(qwen, rope_theta=10_000_000.0), training())
    assert reason is not None and "RoPE base 1000000" in reason and "1e+07" in reason


def test_accelerates_megatron_plugin_refuses_eager_attention() -> None:
    """MegatronLMPlugin has no attention-backend setting: Megatron's auto runs Transformer Engine's flash
    or fused kernel, not the eager square estimated (change review); the megatron target runs it."""
    from service.catalog.models import model as preset

    gpt2 = preset("gpt2").spec
    eager = plan(
        model=gpt2, framework=Framework.MEGATRON, train=training(seq_len=1024, attention=Attention.EAGER)
    )
    reason = REFUSALS[Target.ACCELERATE](eager)
    assert reason is not None and "attention eager" in reason
    assert REFUSALS[Target.MEGATRON](eager) is None
    flash = plan(
        model=gpt2, framework=Framework.MEGATRON, train=training(seq_len=1024, attention=Attention.FLASH)
    )
    assert "attention" not in (REFUSALS[Target.ACCELERATE](flash) or "")


def test_a_tied_models_pipeline_ties_or_is_refused() -> None:
    # embeddings review: DeepSpeed keeps a tied head in step only for TiedLayerSpecs of one key (the
    # note asked for plain specs), and torchtitan 0.3.0 raises "Weight tying is not supported with
    # Pipeline Parallel." at its start (models/common/decoder.py), where Qwen3 0.6B's pp 2 was rendered
    tied_model = replace(small_llama(), tied_embeddings=True)
    ds = plan(model=tied_model, framework=Framework.DEEPSPEED, zero_stage=1, pp=2)
    assert "TiedLayerSpec('embed', ...)" in deepspeed.model_code_duties(ds)
    assert "TiedLayerSpec" not in deepspeed.model_code_duties(
        plan(framework=Framework.DEEPSPEED, zero_stage=1, pp=2)
    )
    assert torchtitan.tied_pipeline_problem(tied_model, 2) is not None
    assert torchtitan.tied_pipeline_problem(tied_model, 1) is None
    assert torchtitan.tied_pipeline_problem(small_llama(), 2) is None
    qwen3 = model_preset("qwen3-0.6b").spec  # a torchtitan flavor, built tied
    assert qwen3.tied_embeddings
    refused = framework_structure_refusal(Framework.FSDP, qwen3, training(), 1, 2, 1, 1)
    assert refused is not None and "weight tying" in refused
    assert framework_structure_refusal(Framework.FSDP, qwen3, training(), 2, 1, 1, 1) is None
