"""validate_layout: each rule raises InvalidLayout with its slug, field and numbers; good layouts pass."""

from __future__ import annotations

import dataclasses

import pytest

from service.estimator.errors import InvalidLayout, InvalidTraining
from service.estimator.types import (
    Attention,
    AttentionKind,
    ClusterSpec,
    Compile,
    Framework,
    GPUSpec,
    Layout,
    Method,
    ModelSpec,
    MoESpec,
    Offload,
    Optimizer,
    PeakFlops,
    PositionEmbedding,
    Precision,
    Recompute,
    RecomputeModule,
    TrainingSpec,
)
from service.estimator.validate import FRAMEWORK_CAPABILITIES, validate_layout

# 32 layers, 32 heads / 8 kv heads; 16 GPUs on 2 nodes.
MODEL = ModelSpec(
    name="m", family="llama", num_layers=32, hidden_size=4096, num_attention_heads=32, num_kv_heads=8,
    ffn_hidden_size=14336, vocab_size=128256,
)  # fmt: skip
MOE = dataclasses.replace(MODEL, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=14336))
H100 = GPUSpec(
    name="h100",
    memory_bytes=80 * 2**30,
    peak_flops_per_s=PeakFlops(fp32=6.7e13, bf16=9.9e14, fp16=9.9e14, fp8=2e15),
    hbm_bandwidth_bytes_per_s=3.35e12,
    intra_node_bandwidth_bytes_per_s=4.5e11,
    pcie_bandwidth_bytes_per_s=6.4e10,
)
V100 = dataclasses.replace(H100, name="v100", peak_flops_per_s=PeakFlops(fp32=1.5e13, fp16=1.25e14))
CLUSTER = ClusterSpec(
    gpu=H100, num_nodes=2, gpus_per_node=8, intra_node_bandwidth_bytes_per_s=4.5e11,
    inter_node_bandwidth_bytes_per_s=5e10,
)  # fmt: skip
TRAIN = TrainingSpec(seq_len=4096, global_batch_size=64)


def check(
    layout: Layout,
    *,
    model: ModelSpec = MODEL,
    cluster: ClusterSpec = CLUSTER,
    training: TrainingSpec = TRAIN,
) -> None:
    validate_layout(model, cluster, layout, training)


@pytest.mark.parametrize(
    "layout",
    [
        Layout(dp=16, zero_stage=3),
        Layout(dp=16, zero_stage=2, offload_optimizer=Offload.CPU),
        Layout(dp=4, zero_stage=3, tp=4, offload_params=Offload.NVME, offload_optimizer=Offload.NVME),
        Layout(dp=8, pp=2, zero_stage=1),
        Layout(framework=Framework.MEGATRON, dp=2, tp=4, pp=2, zero_stage=1, sequence_parallel=True),
        Layout(framework=Framework.MEGATRON, dp=4, tp=2, pp=2, virtual_pipeline_stages=2, zero_stage=1),
        Layout(framework=Framework.MEGATRON, dp=8, cp=2, zero_stage=1),
        Layout(framework=Framework.FSDP, dp=4, tp=2, pp=2, zero_stage=3),
        Layout(
            framework=Framework.FSDP,
            dp=16,
            zero_stage=3,
            offload_params=Offload.CPU,
            offload_optimizer=Offload.CPU,
        ),
        Layout(framework=Framework.FSDP, dp=16, zero_stage=2, fsdp_hybrid_shard=True),
        # torchtitan's Async TP: compiled, TP with sequence parallelism
        Layout(
            framework=Framework.FSDP,
            dp=8,
            tp=2,
            zero_stage=3,
            sequence_parallel=True,
            tp_comm_overlap=True,
            torch_compile=Compile.MODEL,
        ),
    ],
)
def test_valid_layouts_pass(layout: Layout) -> None:
    check(layout)


def test_moe_expert_parallel_passes() -> None:
    check(
        Layout(framework=Framework.MEGATRON, dp=8, tp=2, ep=8, zero_stage=1, sequence_parallel=True),
        model=MOE,
    )


@pytest.mark.parametrize(
    ("layout", "rule", "field"),
    [
        (Layout(dp=8), "world_size", "dp"),  # 8 != 2 x 8
        (Layout(dp=16, zero_stage=1, framework=Framework.FSDP), "zero_stage", "zero_stage"),
        (Layout(dp=16, zero_stage=2, framework=Framework.MEGATRON), "zero_stage", "zero_stage"),
        (Layout(dp=8, pp=2, zero_stage=2), "zero_pp", "zero_stage"),
        (Layout(dp=16, zero_stage=2, offload_params=Offload.CPU), "offload_params", "offload_params"),
        (
            Layout(dp=16, zero_stage=0, offload_optimizer=Offload.CPU),
            "offload_optimizer",
            "offload_optimizer",
        ),
        (
            Layout(framework=Framework.FSDP, dp=16, zero_stage=3, offload_optimizer=Offload.NVME),
            "offload_device",
            "offload_optimizer",
        ),
        (
            Layout(framework=Framework.FSDP, dp=16, zero_stage=3, offload_optimizer=Offload.CPU),
            "fsdp_offload",
            "offload_optimizer",
        ),
        (
            Layout(framework=Framework.MEGATRON, dp=16, zero_stage=1, offload_params=Offload.CPU),
            "offload_params",
            "offload_params",
        ),
        (Layout(dp=16, zero_stage=2, fsdp_hybrid_shard=True), "hybrid_shard", "fsdp_hybrid_shard"),
        (  # FSDP shards over dp_shard x cp: a cp group of 16 cannot fit a node's 8 ranks
            Layout(framework=Framework.FSDP, cp=16, zero_stage=3, fsdp_hybrid_shard=True),
            "hybrid_shard",
            "fsdp_hybrid_shard",
        ),
        (Layout(dp=16, virtual_pipeline_stages=2), "virtual_pp", "virtual_pipeline_stages"),
        (Layout(dp=8, pp=2, virtual_pipeline_stages=2), "virtual_pp", "virtual_pipeline_stages"),  # deepspeed
        (Layout(dp=16, micro_batch_size=3), "global_batch", "micro_batch_size"),  # 64 % 48
        (Layout(dp=16, ep=2), "ep_moe", "ep"),
        (Layout(dp=16, optimizer_in_backward=True), "optimizer_in_backward", "optimizer_in_backward"),
        (Layout(dp=16, activation_offload=True), "activation_offload", "activation_offload"),
        # switches that would change nothing are refused, not accepted as no-ops
        (Layout(dp=16, sequence_parallel=True), "unused", "sequence_parallel"),
        (Layout(dp=8, tp=2, sequence_parallel=True, tp_comm_overlap=True), "unused", "tp_comm_overlap"),
        (Layout(framework=Framework.MEGATRON, dp=8, tp=2, tp_comm_overlap=True), "unused", "tp_comm_overlap"),
        (  # torchtitan's Async TP is an inductor pass: refused eager, naming the field
            Layout(
                framework=Framework.FSDP,
                dp=8,
                tp=2,
                zero_stage=3,
                sequence_parallel=True,
                tp_comm_overlap=True,
            ),
            "tp_comm_overlap",
            "tp_comm_overlap",
        ),
        (
            Layout(
                framework=Framework.FSDP,
                dp=8,
                tp=2,
                zero_stage=3,
                tp_comm_overlap=True,
                torch_compile=Compile.MODEL,
            ),
            "unused",
            "tp_comm_overlap",
        ),
        (
            Layout(framework=Framework.MEGATRON, tp=8, pp=2, overlap_grad_reduce=True),
            "unused",
            "overlap_grad_reduce",
        ),
        (Layout(dp=16, pipeline_account_for_loss=True), "unused", "pipeline_account_for_loss"),
        (  # 4 ranks of tp 2 on 8-GPU nodes: HYBRID_SHARD would shard exactly as FULL_SHARD does
            Layout(framework=Framework.FSDP, dp=4, tp=2, pp=2, zero_stage=3, fsdp_hybrid_shard=True),
            "unused",
            "fsdp_hybrid_shard",
        ),
        # each framework's own recompute policies (HF/DeepSpeed checkpoint whole layers; the core-attention
        # recompute is Megatron's, per-op AC torchtitan's)
        (Layout(dp=16, recompute=Recompute.SELECTIVE), "recompute", "recompute"),
        (Layout(framework=Framework.FSDP, dp=16, recompute=Recompute.SELECTIVE), "recompute", "recompute"),
        (
            Layout(framework=Framework.MEGATRON, dp=16, recompute=Recompute.SELECTIVE_OP),
            "recompute",
            "recompute",
        ),
        (
            Layout(framework=Framework.FSDP, dp=16, recompute=Recompute.FULL, recompute_num_layers=2),
            "recompute_num_layers",
            "recompute_num_layers",
        ),
        (
            Layout(
                framework=Framework.MEGATRON, dp=16, recompute=Recompute.SELECTIVE, recompute_num_layers=2
            ),
            "recompute_num_layers",
            "recompute_num_layers",
        ),
        (  # every N-th layer is torchtitan's (up to 0.2), with full recompute, N in 2..rank's layers
            Layout(framework=Framework.MEGATRON, dp=16, recompute=Recompute.FULL, recompute_every_n_layers=2),
            "recompute_every_n_layers",
            "recompute_every_n_layers",
        ),
        (
            Layout(framework=Framework.FSDP, dp=16, recompute=Recompute.NONE, recompute_every_n_layers=2),
            "recompute_every_n_layers",
            "recompute_every_n_layers",
        ),
        (
            Layout(framework=Framework.FSDP, dp=16, recompute=Recompute.FULL, recompute_every_n_layers=1),
            "unused",
            "recompute_every_n_layers",
        ),
        (  # 32 layers: a 33rd is never reached
            Layout(framework=Framework.FSDP, dp=16, recompute=Recompute.FULL, recompute_every_n_layers=33),
            "unused",
            "recompute_every_n_layers",
        ),
        (  # 32 layers over pp 2 x v 2: 8 per virtual stage
            Layout(
                framework=Framework.MEGATRON,
                dp=4,
                pp=2,
                tp=2,
                virtual_pipeline_stages=2,
                recompute=Recompute.FULL,
                recompute_num_layers=9,
            ),
            "recompute_num_layers",
            "recompute_num_layers",
        ),
    ],
)
def test_rules(layout: Layout, rule: str, field: str) -> None:
    with pytest.raises(InvalidLayout) as err:
        check(layout)
    assert (err.value.rule, err.value.field) == (rule, field)


def test_world_size_message_quotes_numbers() -> None:
    with pytest.raises(InvalidLayout, match=r"= 8 != world size \(2 nodes x 8 GPUs = 16\)"):
        check(Layout(dp=8))


def test_a_layout_on_part_of_the_cluster_says_which_cluster_estimates_it() -> None:
    """A fewest-GPU plan on 8 GPUs recommends a layout on 1 of them; sent to /v1/estimates on the same
    cluster it was a bare world-size 422: the message says which cluster its numbers are of."""
    with pytest.raises(InvalidLayout, match=r"estimated on a cluster of them: num_nodes 1, gpus_per_node 1$"):
        check(Layout(dp=1))
    with pytest.raises(InvalidLayout, match=r"num_nodes 1, gpus_per_node 8$"):
        check(Layout(dp=8))
    with pytest.raises(InvalidLayout, match=r"= 12 != world size \(2 nodes x 8 GPUs = 16\)$"):
        check(Layout(dp=4, tp=3))  # not whole nodes, nor part of one: no cluster to name


def test_heads_and_kv_heads_divide_tp() -> None:
    c32 = dataclasses.replace(CLUSTER, num_nodes=4)
    with pytest.raises(InvalidLayout) as err:
        check(Layout(dp=2, tp=16), cluster=c32)  # 32 heads fine, 8 kv heads % 16 != 0
    assert err.value.rule == "kv_heads_tp"
    with pytest.raises(InvalidLayout) as err:
        check(Layout(dp=16, tp=3), cluster=dataclasses.replace(CLUSTER, num_nodes=6))  # 32 % 3
    assert err.value.rule == "heads_tp"


def test_every_pipeline_stage_holds_layers() -> None:
    # 24 layers on 16 stages split unevenly (26 units: 2, 2, ... 1 after the embedding and loss)
    check(Layout(framework=Framework.FSDP, dp=1, pp=16), model=dataclasses.replace(MODEL, num_layers=24))
    with pytest.raises(InvalidLayout) as err:  # 12 layers (+ 2) cannot cover 16 stages
        check(Layout(framework=Framework.FSDP, dp=1, pp=16), model=dataclasses.replace(MODEL, num_layers=12))
    assert (err.value.rule, err.value.field) == ("pp_layers", "pp")
    # interleaving splits the layers over pp x v virtual stages: 30 over 8 is uneven, and allowed
    check(
        Layout(framework=Framework.MEGATRON, dp=8, pp=2, virtual_pipeline_stages=4),
        model=dataclasses.replace(MODEL, num_layers=30),
    )
    with pytest.raises(InvalidLayout) as err:  # an explicit split must cover every layer
        check(Layout(framework=Framework.FSDP, dp=8, pp=2, pipeline_layers=(20, 11)))
    assert (err.value.rule, err.value.field) == ("pipeline_split", "pipeline_layers")
    with pytest.raises(InvalidLayout) as err:  # and give one count per virtual stage
        check(
            Layout(
                framework=Framework.MEGATRON, dp=8, pp=2, virtual_pipeline_stages=2, pipeline_layers=(16, 16)
            )
        )
    assert (err.value.rule, err.value.field) == ("pipeline_split", "pipeline_layers")
    with pytest.raises(InvalidLayout) as err:  # the flags only shape a derived split
        check(
            Layout(
                framework=Framework.FSDP, dp=8, pp=2, pipeline_layers=(15, 17), pipeline_account_for_loss=True
            )
        )
    assert err.value.rule == "pipeline_split"
    with pytest.raises(InvalidLayout) as err:  # a middle rank with no layer is pointless
        check(Layout(framework=Framework.FSDP, dp=4, pp=4, pipeline_layers=(16, 0, 8, 8)))
    assert err.value.rule == "pp_layers"
    with pytest.raises(InvalidLayout) as err:  # interleaving needs micro-batches % pp == 0
        check(
            Layout(framework=Framework.MEGATRON, dp=4, pp=4, virtual_pipeline_stages=2, micro_batch_size=2),
            training=dataclasses.replace(TRAIN, global_batch_size=48),  # 48 / (2 x 4) = 6 % 4
        )
    assert err.value.rule == "virtual_pp"


def test_sequence_rules() -> None:
    megatron_cp = Layout(framework=Framework.MEGATRON, dp=8, cp=2, zero_stage=1)
    with pytest.raises(InvalidLayout) as err:
        check(megatron_cp, training=dataclasses.replace(TRAIN, seq_len=4098))  # 4098 % 4
    assert err.value.rule == "cp_seq"
    with pytest.raises(InvalidLayout) as err:
        check(megatron_cp, training=dataclasses.replace(TRAIN, attention=Attention.EAGER))
    assert err.value.rule == "cp_attention"
    with pytest.raises(InvalidLayout) as err:  # Ulysses: 24 heads % cp 16
        check(Layout(dp=1, cp=16), model=dataclasses.replace(MODEL, num_attention_heads=24, num_kv_heads=8))
    assert err.value.rule == "cp_heads"
    # ALST's Ulysses: the KV heads split over the group, or are replicated to one per rank; 6 KV heads
    # over 4 ranks is neither (ulysses_sp.py UlyssesSPAttentionHF)
    with pytest.raises(InvalidLayout, match=r"num_kv_heads \(6\) and cp \(4\)"):
        check(Layout(dp=4, cp=4), model=dataclasses.replace(MODEL, num_attention_heads=24, num_kv_heads=6))
    for kv in (2, 8):  # replicated (4 % 2), split (8 % 4)
        check(Layout(dp=4, cp=4), model=dataclasses.replace(MODEL, num_attention_heads=24, num_kv_heads=kv))


def test_each_framework_splits_the_sequence_its_own_way() -> None:
    """A review's cases. DeepSpeed-Ulysses gives each rank seq / cp contiguous tokens (no ring, so no
    2cp chunks); sequence parallelism splits each rank's seq / cp tokens over tp (Megatron-Core's
    _split_along_first_dim on [s/cp, b, h]), whatever the micro-batch; torchtitan asks seq_len %
    (tp x 2cp) (its trainer's evenness check); PyTorch's ring masks causally only, so FSDP's context
    parallelism refuses sliding-window layers."""
    ulysses = dataclasses.replace(TRAIN, seq_len=98_312)  # 98312 = 8 x 12289: % 8 yes, % 16 no
    check(Layout(framework=Framework.DEEPSPEED, dp=2, cp=8, zero_stage=3), training=ulysses)
    with pytest.raises(InvalidLayout) as err:
        check(Layout(framework=Framework.MEGATRON, dp=2, cp=8, zero_stage=1), training=ulysses)
    assert err.value.rule == "cp_seq"
    # Megatron tp 4, cp 2, SP: 16388 % 4 (2cp) == 0 but 16388 / 2 = 8194, % 4 != 0
    megatron = Layout(framework=Framework.MEGATRON, dp=2, tp=4, cp=2, sequence_parallel=True, zero_stage=1)
    with pytest.raises(InvalidLayout) as err:
        check(megatron, training=dataclasses.replace(TRAIN, seq_len=16_388, global_batch_size=2))
    assert err.value.rule == "sp_seq" and "(8)" in str(err.value)
    # a micro-batch of 2 does not make it split (the micro-batch is not the split dimension)
    with pytest.raises(InvalidLayout):
        check(dataclasses.replace(megatron, micro_batch_size=2),
              training=dataclasses.replace(TRAIN, seq_len=16_388, global_batch_size=4))  # fmt: skip
    check(megatron, training=dataclasses.replace(TRAIN, seq_len=16_392, global_batch_size=2))
    # torchtitan: tp 4 x 2cp 4 = 16; 16392 % 16 = 8
    fsdp = dataclasses.replace(megatron, framework=Framework.FSDP, zero_stage=3)
    with pytest.raises(InvalidLayout) as err:
        check(fsdp, training=dataclasses.replace(TRAIN, seq_len=16_392, global_batch_size=2))
    assert err.value.rule == "sp_seq" and "(16)" in str(err.value)
    check(fsdp, training=dataclasses.replace(TRAIN, seq_len=16_384, global_batch_size=2))
    # sliding-window layers: FSDP's ring would drop the window; DeepSpeed-Ulysses keeps it
    windowed = dataclasses.replace(
        MODEL, sliding_window=2048, layer_types=(AttentionKind.SLIDING, AttentionKind.FULL) * 16
    )
    with pytest.raises(InvalidLayout) as err:
        check(Layout(framework=Framework.FSDP, dp=8, cp=2, zero_stage=3), model=windowed)
    assert err.value.rule == "cp_window"
    check(Layout(framework=Framework.FSDP, dp=16, zero_stage=3), model=windowed)
    check(Layout(framework=Framework.DEEPSPEED, dp=8, cp=2, zero_stage=3), model=windowed)
    # a window as long as the sequence masks nothing (Phi-4-mini's 262,144 keys at 131,072 tokens)
    unbinding = dataclasses.replace(windowed, sliding_window=TRAIN.seq_len)
    check(Layout(framework=Framework.FSDP, dp=8, cp=2, zero_stage=3), model=unbinding)


def test_max_seq_len_is_a_length_the_layout_splits() -> None:
    from service.catalog.tuning import default_tuning
    from service.estimator.evaluate import max_seq_len
    from service.estimator.job import make_job
    from service.estimator.validate import sequence_divisor

    megatron = Layout(framework=Framework.MEGATRON, dp=2, tp=4, cp=2, sequence_parallel=True, zero_stage=1)
    fsdp = dataclasses.replace(megatron, framework=Framework.FSDP, zero_stage=3)
    ulysses = Layout(framework=Framework.DEEPSPEED, dp=2, cp=8, zero_stage=3)
    assert [sequence_divisor(lo) for lo in (megatron, fsdp, ulysses)] == [8, 16, 8]
    training = dataclasses.replace(TRAIN, global_batch_size=2)
    for layout in (megatron, fsdp, ulysses):
        found = max_seq_len(make_job(MODEL, CLUSTER, training, default_tuning()), layout)
        assert found > 0 and found % sequence_divisor(layout) == 0
        check(layout, training=dataclasses.replace(training, seq_len=found))


def test_expert_rules() -> None:
    with pytest.raises(InvalidLayout) as err:
        check(Layout(framework=Framework.MEGATRON, dp=16, ep=16, zero_stage=1), model=MOE)  # 8 experts % 16
    assert err.value.rule == "ep_experts"
    with pytest.raises(InvalidLayout) as err:  # dp*cp = 2 not divisible by ep 4
        check(Layout(framework=Framework.MEGATRON, dp=2, tp=8, ep=4, zero_stage=1), model=MOE)
    assert err.value.rule == "ep_dp"


def test_expert_tensor_parallelism_folds_ep_into_tp() -> None:
    # Megatron's expert grid etp x ep x expert-dp over tp x cp x dp: with etp 1, ep 8 fits dp 2 x tp 8
    folded = Layout(
        framework=Framework.MEGATRON, dp=2, tp=8, ep=8, etp=1, sequence_parallel=True, zero_stage=1
    )
    check(folded, model=MOE)
    refusals = [
        (dataclasses.replace(folded, etp=4), MOE, "ep_dp", "ep"),  # 4 x 8 does not divide 16
        (dataclasses.replace(folded, sequence_parallel=False), MOE, "etp_sp", "etp"),
        (dataclasses.replace(folded, ep=1), MODEL, "unused", "etp"),  # a dense model has no experts
        (Layout(framework=Framework.FSDP, dp=16, ep=8, etp=1, zero_stage=3), MOE, "etp_framework", "etp"),
        (dataclasses.replace(folded, etp=3, ep=1), MOE, "etp_width", "etp"),  # 14336 % 3
    ]
    for layout, model, rule, field in refusals:
        with pytest.raises(InvalidLayout) as err:
            check(layout, model=model)
        assert (err.value.rule, err.value.field) == (rule, field), layout


def test_precision_needs_hardware_support() -> None:
    v100 = dataclasses.replace(CLUSTER, gpu=V100)
    with pytest.raises(InvalidLayout) as err:
        check(Layout(dp=16), cluster=v100)  # bf16 on a V100
    assert (err.value.rule, err.value.field) == ("precision", "precision")
    with pytest.raises(InvalidLayout):
        check(Layout(dp=16), cluster=v100, training=dataclasses.replace(TRAIN, precision=Precision.FP8))
    check(Layout(dp=16), cluster=v100, training=dataclasses.replace(TRAIN, precision=Precision.FP16))


def test_adapters_need_a_framework_with_peft() -> None:
    # Megatron-LM has no PEFT at any tp/pp; FSDP and DeepSpeed train adapters through Hugging Face PEFT
    lora = dataclasses.replace(TRAIN, method=Method.LORA)
    for layout in (Layout(framework=Framework.MEGATRON, dp=16, zero_stage=1),
                   Layout(framework=Framework.MEGATRON, dp=8, tp=2, zero_stage=1)):  # fmt: skip
        with pytest.raises(InvalidLayout) as err:
            check(layout, training=lora)
        assert (err.value.rule, err.value.field) == ("peft", "framework")
    check(Layout(framework=Framework.FSDP, dp=8, tp=2, zero_stage=3), training=lora)
    check(Layout(framework=Framework.DEEPSPEED, dp=16, zero_stage=2), training=lora)


def test_optimizer_in_backward_and_activation_offload_where_supported() -> None:
    one_step = dataclasses.replace(TRAIN, global_batch_size=16)
    check(
        Layout(framework=Framework.FSDP, dp=16, zero_stage=3, optimizer_in_backward=True), training=one_step
    )
    with pytest.raises(InvalidLayout):  # 64 / 16 = 4 accumulation steps
        check(Layout(framework=Framework.FSDP, dp=16, zero_stage=3, optimizer_in_backward=True))
    check(Layout(dp=16, zero_stage=3, activation_offload=True, recompute=Recompute.FULL))


def test_capabilities_cover_every_framework() -> None:
    assert set(FRAMEWORK_CAPABILITIES) == set(Framework)
    assert all(caps.source for caps in FRAMEWORK_CAPABILITIES.values())


SELECTIVE = Layout(framework=Framework.MEGATRON, dp=16, recompute=Recompute.SELECTIVE)
MODULE = RecomputeModule


@pytest.mark.parametrize(
    ("layout", "model", "words"),
    [
        (  # Megatron's selective policy only
            dataclasses.replace(SELECTIVE, recompute=Recompute.FULL, recompute_modules=(MODULE.MLP,)),
            MODEL,
            "needs recompute selective",
        ),
        (dataclasses.replace(SELECTIVE, recompute_modules=(MODULE.MOE,)), MODEL, "moe needs an MoE layer"),
        (dataclasses.replace(SELECTIVE, recompute_modules=(MODULE.MLP,)), MOE, "mlp needs a dense"),
        (dataclasses.replace(SELECTIVE, recompute_modules=(MODULE.SHARED_EXPERTS,)), MOE, "shared experts"),
        (dataclasses.replace(SELECTIVE, recompute_modules=(MODULE.MLA_UP_PROJ,)), MODEL, "multi-latent"),
        (dataclasses.replace(SELECTIVE, recompute_modules=(MODULE.LAYERNORM,)), MODEL, "fused"),
        (dataclasses.replace(SELECTIVE, recompute_modules=(MODULE.MOE, MODULE.MOE_ACT)), MOE, "drop moe_act"),
    ],
)
def test_recompute_modules_that_act_on_nothing_are_refused(
    layout: Layout, model: ModelSpec, words: str
) -> None:
    with pytest.raises(InvalidLayout, match=words) as err:
        check(layout, model=model)
    assert err.value.field == "recompute_modules"


def test_recompute_modules_are_named_once() -> None:
    with pytest.raises(InvalidLayout, match="each module once") as err:
        Layout(recompute=Recompute.SELECTIVE, recompute_modules=(MODULE.MLP, MODULE.MLP))
    assert err.value.field == "recompute_modules"
    with pytest.raises(InvalidLayout, match="at least one"):
        Layout(recompute=Recompute.SELECTIVE, recompute_modules=())
    check(dataclasses.replace(SELECTIVE, recompute_modules=(MODULE.MOE_ACT, MODULE.LAYERNORM)), model=MOE)


def test_multi_token_prediction_is_megatrons_and_needs_rope() -> None:
    mtp = dataclasses.replace(TRAIN, mtp_num_layers=1)
    check(Layout(framework=Framework.MEGATRON, dp=16, zero_stage=1), training=mtp)
    with pytest.raises(InvalidLayout, match="trains no multi-token prediction") as err:
        check(Layout(framework=Framework.FSDP, dp=16, zero_stage=3), training=mtp)
    assert err.value.field == "mtp_num_layers"
    learned = dataclasses.replace(
        MODEL, position_embedding=PositionEmbedding.LEARNED, max_position_embeddings=4096
    )
    with pytest.raises(InvalidLayout, match="rope or none"):
        check(Layout(framework=Framework.MEGATRON, dp=16, zero_stage=1), model=learned, training=mtp)


@pytest.mark.parametrize(
    ("layout", "model", "words"),
    [
        (Layout(framework=Framework.FSDP, dp=16, zero_stage=3, moe_a2a_overlap=True), MOE, "Megatron's"),
        (Layout(framework=Framework.MEGATRON, dp=16, moe_a2a_overlap=True), MOE, "ep > 1"),
        (Layout(framework=Framework.MEGATRON, dp=8, pp=2, ep=4, moe_a2a_overlap=True), MOE, "interleaved"),
        (
            Layout(framework=Framework.MEGATRON, dp=16, ep=4, moe_a2a_overlap=True, recompute=Recompute.FULL),
            MOE,
            "recompute",
        ),
    ],
)
def test_moe_a2a_overlap_follows_megatrons_rules(layout: Layout, model: ModelSpec, words: str) -> None:
    with pytest.raises(InvalidLayout, match=words) as err:
        check(layout, model=model)
    assert err.value.field == "moe_a2a_overlap"


def test_moe_a2a_overlap_takes_at_most_one_mtp_layer() -> None:
    """TransformerConfig: "MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm";
    plans proposed it with two MTP layers (Megatron review)."""
    layout = Layout(framework=Framework.MEGATRON, dp=16, ep=4, zero_stage=1, moe_a2a_overlap=True)
    check(layout, model=MOE, training=dataclasses.replace(TRAIN, mtp_num_layers=1))
    with pytest.raises(InvalidLayout, match="at most one MTP layer") as err:
        check(layout, model=MOE, training=dataclasses.replace(TRAIN, mtp_num_layers=2))
    assert err.value.field == "moe_a2a_overlap"


@pytest.mark.parametrize(
    ("field", "text"),
    [("moe_dispatcher", "alltoall"), ("framework", "megatron"), ("recompute", "full")],
)
def test_a_layout_refuses_a_plain_string_where_an_enum_goes(field: str, text: str) -> None:
    """The estimator compares enum fields by identity: the invariant sweep's converter left
    moe_dispatcher the string "alltoall", which every ``is MoeDispatcher.ALLTOALL`` took for flex."""
    with pytest.raises(InvalidLayout) as err:
        Layout(**{field: text})
    assert err.value.field == field and err.value.rule == "type" and repr(text) in err.value.message


def test_megatron_moe_with_tp_needs_sequence_parallelism() -> None:
    """An MoE review: megatron/core/transformer/moe/moe_layer.py raises when training an MoE layer with
    tp > 1 and sequence parallelism off; the estimate accepted it."""
    with pytest.raises(InvalidLayout) as err:
        check(Layout(framework=Framework.MEGATRON, dp=8, tp=2, ep=8, zero_stage=1), model=MOE)
    assert (err.value.rule, err.value.field) == ("moe_sp", "sequence_parallel")
    check(
        Layout(framework=Framework.MEGATRON, dp=8, tp=2, ep=8, zero_stage=1, sequence_parallel=True),
        model=MOE,
    )


# ---- optimizers and optimizer offload the frameworks run (PEFT/precision review, stop 44)


def test_deepspeed_nvme_optimizer_offload_needs_zero_3() -> None:
    # docs config-json "Optimizer offloading": "NVMe offloading is available only with ZeRO stage 3";
    # below it stage_1_and_2.py runs any offload device as cpu_offload: the states fill host RAM
    for stage in (1, 2):
        nvme = Offload.NVME
        layout = Layout(framework=Framework.DEEPSPEED, dp=16, zero_stage=stage, offload_optimizer=nvme)
        with pytest.raises(InvalidLayout) as refused:
            check(layout)
        assert refused.value.field == "offload_optimizer"
        assert f"got {stage}" in refused.value.message
    check(Layout(framework=Framework.DEEPSPEED, dp=16, zero_stage=3, offload_optimizer=Offload.NVME))
    check(Layout(framework=Framework.DEEPSPEED, dp=16, zero_stage=2, offload_optimizer=Offload.CPU))


@pytest.mark.parametrize(
    ("framework", "stage", "optimizer", "runs"),
    [
        # runtime/engine.py _configure_optimizer: a client optimizer under ZeRO-Offload other than
        # DeepSpeedCPUAdam / DeepSpeedCPULion raises ZeRORuntimeException
        (Framework.DEEPSPEED, 2, Optimizer.ADAMW_8BIT, False),
        (Framework.DEEPSPEED, 2, Optimizer.ADAFACTOR, False),
        (Framework.DEEPSPEED, 2, Optimizer.SGD, False),
        (Framework.DEEPSPEED, 2, Optimizer.ADAMW, True),
        (Framework.DEEPSPEED, 2, Optimizer.LION, True),
        # --optimizer-cpu-offload with --use-precision-aware-optimizer, which OptimizerConfig asserts is
        # "only supported with adam" (Megatron review: SGD offloaded was accepted and did not start)
        (Framework.MEGATRON, 1, Optimizer.LION, False),
        (Framework.MEGATRON, 1, Optimizer.SGD, False),
        (Framework.MEGATRON, 1, Optimizer.ADAMW, True),
    ],
)
def test_an_offloaded_optimizer_is_one_the_framework_steps_on_the_host(
    framework: Framework, stage: int, optimizer: Optimizer, runs: bool
) -> None:
    layout = Layout(framework=framework, dp=16, zero_stage=stage, offload_optimizer=Offload.CPU)
    training = dataclasses.replace(TRAIN, optimizer=optimizer)
    if runs:
        check(layout, training=training)
        return
    with pytest.raises(InvalidLayout) as refused:
        check(layout, training=training)
    assert refused.value.field == "offload_optimizer"
    assert optimizer.value in refused.value.message
    check(dataclasses.replace(layout, offload_optimizer=Offload.NONE), training=training)


@pytest.mark.parametrize("optimizer", [Optimizer.ADAMW_8BIT, Optimizer.ADAFACTOR])
def test_megatron_has_no_8bit_adamw_or_adafactor(optimizer: Optimizer) -> None:
    # megatron/training/arguments.py --optimizer choices: adam, sgd, muon, dist_muon, lion, soap, ...
    training = dataclasses.replace(TRAIN, optimizer=optimizer)
    with pytest.raises(InvalidLayout) as refused:
        check(Layout(framework=Framework.MEGATRON, dp=16), training=training)
    assert refused.value.field == "optimizer"
    for framework in (Framework.DEEPSPEED, Framework.FSDP):  # a script's optimizer: any
        check(Layout(framework=framework, dp=16), training=training)


def test_qlora_never_computes_in_fp8() -> None:
    # bitsandbytes' Linear4bit multiplies in bnb_4bit_compute_dtype (fp32, fp16, bf16)
    with pytest.raises(InvalidTraining) as refused:
        TrainingSpec(seq_len=4096, global_batch_size=64, method=Method.QLORA, precision=Precision.FP8)
    assert refused.value.field == "precision"
    TrainingSpec(seq_len=4096, global_batch_size=64, method=Method.LORA, precision=Precision.FP8)
    TrainingSpec(seq_len=4096, global_batch_size=64, method=Method.QLORA, precision=Precision.BF16)


def schedule_check(layout: Layout, training: TrainingSpec, refused: str | None) -> None:
    """``layout`` accepted (``refused`` None), or refused at pp with words ``refused``."""
    if refused is None:
        check(layout, training=training)
        return
    with pytest.raises(InvalidLayout) as err:
        check(layout, training=training)
    assert refused in str(err.value) and err.value.field == "pp"


@pytest.mark.parametrize(
    ("framework", "global_batch", "refused"),
    [
        # Megatron's interleaved schedule: micro-batches a multiple of pp (4 here)
        (Framework.MEGATRON, 24, "% pp (4) != 0"),
        (Framework.MEGATRON, 32, None),
        # PyTorch's ScheduleInterleaved1F1B: a multiple of max(1, m // pp) rounds (torchtitan review: 6 at
        # pp 4 was refused as Megatron's rule); fewer than pp is not modelled
        (Framework.FSDP, 24, None),
        (Framework.FSDP, 20, None),
        (Framework.FSDP, 36, "multiple of PyTorch's Interleaved1F1B rounds (m // pp = 2)"),
        (Framework.FSDP, 12, "< pp (4) with interleaving"),
    ],
)
def test_each_interleaved_schedule_takes_its_own_micro_batches(
    framework: Framework, global_batch: int, refused: str | None
) -> None:
    # dp 4 x pp 4, micro-batch 1: global_batch / 4 micro-batches per step
    layout = Layout(framework=framework, dp=4, pp=4, virtual_pipeline_stages=2, zero_stage=1 if framework
                    is Framework.MEGATRON else 3)  # fmt: skip
    schedule_check(layout, dataclasses.replace(TRAIN, global_batch_size=global_batch), refused)


@pytest.mark.parametrize(
    ("framework", "global_batch", "refused"),
    [
        (Framework.FSDP, 8, "< pp (4): PyTorch's Schedule1F1B"),  # 2 micro-batches per step
        (Framework.FSDP, 16, None),  # 4: one per stage
        (Framework.MEGATRON, 8, None),  # Megatron and DeepSpeed run fewer, with the (p - 1) / m bubble
        (Framework.DEEPSPEED, 8, None),
    ],
)
def test_pytorchs_1f1b_takes_at_least_one_micro_batch_per_stage(
    framework: Framework, global_batch: int, refused: str | None
) -> None:
    """torch.distributed.pipelining Schedule1F1B.__init__ raises ValueError where n_microbatches <
    num_stages: torchtitan's 1F1B with 2 micro-batches at pp 4 was estimated and rendered, and failed at
    start-up (a pipeline review); the interleaved schedule's rule was the only one checked."""
    layout = Layout(framework=framework, dp=4, pp=4, zero_stage=0 if framework is Framework.FSDP else 1)
    schedule_check(layout, dataclasses.replace(TRAIN, global_batch_size=global_batch), refused)


def test_qlora_refuses_deepspeeds_parameter_offload() -> None:
    """peft's DeepSpeed guide: ZeRO-3 with QLoRA and CPU offloading takes more GPU memory than without;
    the estimate had moved the NF4 base to the host (PEFT review). FSDP's cpu offload, peft's FSDP +
    QLoRA recipe, stays."""
    qlora = dataclasses.replace(TRAIN, method=Method.QLORA)
    with pytest.raises(InvalidLayout) as err:
        check(Layout(dp=16, zero_stage=3, offload_params=Offload.CPU, offload_optimizer=Offload.CPU),
              training=qlora)  # fmt: skip
    assert (err.value.rule, err.value.field) == ("qlora_offload", "offload_params")
    check(Layout(dp=16, zero_stage=3, offload_optimizer=Offload.CPU), training=qlora)
    check(Layout(framework=Framework.FSDP, dp=16, zero_stage=3, offload_params=Offload.CPU,
                 offload_optimizer=Offload.CPU), training=qlora)  # fmt: skip


def test_megatron_splits_every_mlp_width_evenly_over_tp() -> None:
    """Megatron's ColumnParallelLinear / RowParallelLinear divide() the width by tp and assert (a tp 3
    plan of a 16,000-wide MLP was rendered; odd-clusters review); other frameworks are not bound."""
    wide = dataclasses.replace(
        MODEL, num_attention_heads=48, num_kv_heads=6, hidden_size=6144, ffn_hidden_size=16000
    )
    three = ClusterSpec(
        gpu=H100, num_nodes=1, gpus_per_node=6, intra_node_bandwidth_bytes_per_s=4.5e11,
        inter_node_bandwidth_bytes_per_s=5e10,
    )  # fmt: skip
    train = TrainingSpec(seq_len=4098, global_batch_size=2)
    with pytest.raises(InvalidLayout) as refused:
        check(
            Layout(framework=Framework.MEGATRON, dp=2, tp=3, zero_stage=1),
            model=wide,
            cluster=three,
            training=train,
        )
    assert refused.value.rule == "mlp_width_tp" and "ffn_hidden_size (16000) % tp (3)" in str(refused.value)
    check(
        Layout(framework=Framework.DEEPSPEED, dp=2, tp=3, zero_stage=1),
        model=wide,
        cluster=three,
        training=train,
    )
    shared = dataclasses.replace(
        MOE,
        moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=2048, num_shared_experts=1,
                    shared_expert_ffn_hidden_size=2049),
    )  # fmt: skip
    with pytest.raises(InvalidLayout, match="shared_expert_ffn_hidden_size"):
        check(Layout(framework=Framework.MEGATRON, dp=8, tp=2, ep=8, zero_stage=1, sequence_parallel=True),
              model=shared)  # fmt: skip


def test_deepspeed_autotp_of_fused_experts_is_refused() -> None:
    """AutoTP splits nn.Linear modules; transformers 5's fused 3-D experts stay whole on every tp rank
    (2025-26 configs review). With ep > 1 DeepSpeed's MoE layer splits them over tp (passes)."""
    with pytest.raises(InvalidLayout) as refused:
        check(Layout(framework=Framework.DEEPSPEED, dp=4, tp=4, zero_stage=3), model=MOE)
    assert refused.value.rule == "autotp_fused_experts" and refused.value.field == "tp"
    check(Layout(framework=Framework.DEEPSPEED, dp=4, tp=4, zero_stage=3), model=MODEL)
    check(Layout(framework=Framework.DEEPSPEED, dp=16, zero_stage=3), model=MOE)
