"""The frozen base of LoRA/QLoRA is sharded exactly as full training shards the same weights.

Issue 24: under ZeRO-3 with ep > 1 the routed experts, already split over ep, were divided by the
dense data-parallel group again for LoRA/QLoRA (Mixtral-8x7B on 8 H100, ep 8: 10.87 GiB of
parameters per GPU for full training, 1.70 GiB for LoRA). The frozen base's bytes per GPU may
depend on the method only through its dtype (NF4 Linears under QLoRA).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.models import models
from service.catalog.tuning import default_tuning
from service.estimator.errors import EstimatorError, InvalidLayout
from service.estimator.estimate import estimate
from service.estimator.memory import rank_parameters_of, rank_states, state_bytes_of
from service.estimator.model_states import ModelStates, lora_parameters
from service.estimator.params import peft_moves_mlp_targets
from service.estimator.types import (
    ClusterSpec,
    Framework,
    Layout,
    Method,
    ModelSpec,
    Offload,
    Precision,
    Recompute,
    TrainingSpec,
)
from service.estimator.validate import FRAMEWORK_CAPABILITIES, validate_layout
from tests.estimator.helpers import job as make_job
from validation.cases import gpu_cluster

H100 = gpu("h100-sxm-80gb")
GiB = 2**30

# ---------------------------------------------------------------- Mixtral-8x7B by hand

# Mixtral-8x7B (config.json: h 4096, 32 layers, 32 heads, 8 KV heads of 128, ffn 14336, 8 experts,
# vocabulary 32000, untied): per layer q 4096^2 + k 4096 x 1024 + v 4096 x 1024 + o 4096^2,
# 2 RMSNorms of 4096, a 4096 x 8 router; 8 experts of 3 x 4096 x 14336.
ATTENTION = 2 * 4096 * 4096 + 2 * 4096 * 1024  # 41,943,040
DENSE = 32 * (ATTENTION + 2 * 4096 + 4096 * 8) + 2 * 32000 * 4096 + 4096  # 1,605,636,096
EXPERTS_PER_RANK = 32 * 8 * 3 * 4096 * 14336 // 8  # ep 8: one expert per layer, 5,637,144,576
# LoRA r = 16 on every Linear: r x (d_in + d_out) each; the local expert's three MLP adapters.
DENSE_ADAPTERS = 32 * 16 * ((4096 + 4096) * 2 + (4096 + 1024) * 2)  # 13,631,488
EXPERT_ADAPTERS = 32 * 16 * 3 * (4096 + 14336)  # 28,311,552
# ZeRO-3 over dp 8 (torchtitan's FSDP with ep, fp32 shards: 4 B each): dense parameters / 8; the
# experts' expert-DP group is dp x tp / ep = 1.
FULL_PARAMETER_BYTES = 4 * DENSE // 8 + 4 * EXPERTS_PER_RANK  # 23,351,396,352 = 21.75 GiB
# ZeRO-2 (DeepSpeed's expert parallelism: its native MoE layers refuse ZeRO-3): parameters whole, the
# local expert's and the dense adapters beside them
LORA_PARAMETER_BYTES = 2 * DENSE + 2 * EXPERTS_PER_RANK + 2 * DENSE_ADAPTERS + 2 * EXPERT_ADAPTERS
MIXTRAL_EP8 = Layout(framework=Framework.DEEPSPEED, dp=8, ep=8, zero_stage=2)
MIXTRAL_EP8_FSDP = Layout(framework=Framework.FSDP, dp=8, ep=8, zero_stage=3)


def _mixtral_parameters(method: Method, layout: Layout) -> int:
    training = TrainingSpec(seq_len=4096, global_batch_size=8, method=method)
    mixtral = preset("mixtral-8x7b").spec
    return estimate(
        mixtral, gpu_cluster(H100, 8, 50e9), layout, training, tuning=default_tuning()
    ).memory.per_gpu.parameters


def test_mixtral_ep8_zero3_full_counts_dense_over_dp_and_experts_over_expert_dp() -> None:
    assert _mixtral_parameters(Method.FULL, MIXTRAL_EP8_FSDP) == pytest.approx(FULL_PARAMETER_BYTES, abs=1)
    assert FULL_PARAMETER_BYTES / GiB == pytest.approx(21.748, abs=1e-3)


def test_mixtral_ep8_lora_counts_the_whole_frozen_base_plus_adapters() -> None:
    """DeepSpeed's expert parallelism at ZeRO-2: the dense base whole, the local expert, attention's
    adapters. MLP targets there are refused: peft 0.21 moves them off the modules by model type, and
    under DeepSpeed's MoE layers they adapt nothing (stop 44 review, per-expert Linears in a
    qwen3_moe model: attention adapters only)."""
    attention = TrainingSpec(
        seq_len=4096,
        global_batch_size=8,
        method=Method.LORA,
        lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
    )
    mixtral = preset("mixtral-8x7b").spec
    found = estimate(mixtral, gpu_cluster(H100, 8, 50e9), MIXTRAL_EP8, attention, tuning=default_tuning())
    assert found.memory.per_gpu.parameters == pytest.approx(
        2 * DENSE + 2 * EXPERTS_PER_RANK + 2 * DENSE_ADAPTERS
    )
    with pytest.raises(InvalidLayout) as refused:
        _mixtral_parameters(Method.LORA, MIXTRAL_EP8)
    assert refused.value.field == "ep"
    assert _mixtral_parameters(Method.FULL, MIXTRAL_EP8) == 2 * DENSE + 2 * EXPERTS_PER_RANK


def test_qlora_with_expert_parallelism_is_refused_naming_the_degree() -> None:
    """An NF4 base loads through transformers' from_pretrained, which builds no expert-parallel
    layers (DeepSpeed MoE / Megatron): QLoRA trains data-parallel only."""
    training = TrainingSpec(seq_len=4096, global_batch_size=8, method=Method.QLORA)
    with pytest.raises(EstimatorError, match="qlora with ep=8") as refused:
        validate_layout(preset("mixtral-8x7b").spec, gpu_cluster(H100, 8, 50e9), MIXTRAL_EP8, training)
    assert refused.value.field == "ep"


def test_mixtral_zero3_qlora_shards_the_nf4_base_over_every_rank() -> None:
    """QLoRA as it runs (ep 1, ZeRO-3 over dp 8): the NF4 attention Linears' packed storage (4 bits)
    and the bf16 rest, each / 8; the NF4 constants (the other 0.127 bits: bitsandbytes' quant_state,
    a Python object beside the parameter, which ZeRO-3 and FSDP neither shard nor gather) whole on
    every rank (PEFT review, stop 41: they were / 8 too). The experts are transformers 5's fused
    MixtralExperts parameters (model_states.fused_experts): bitsandbytes leaves them bf16 (fine-tuning
    review, stop 39), and peft 0.21 moves the MLP targets (w1, w3, w2) onto them: gate_up_proj's
    adapter of rank 2r and down_proj's of r, each r x E rows (config review, stop 44)."""
    constants = (default_tuning().memory.qlora_bits_per_param - 4) / 8
    all_experts = 8 * EXPERTS_PER_RANK
    other = DENSE - 32 * ATTENTION  # bf16: embeddings, head, norms, routers
    frozen = (32 * ATTENTION * 0.5 + all_experts * 2 + other * 2) / 8 + 32 * ATTENTION * constants
    r, e, h, f = 16, 8, 4096, 14336
    fused_expert_adapters = 32 * (2 * r * e * (h + 2 * f) + r * e * (f + h))  # 109,051,904
    adapters = 2 * (DENSE_ADAPTERS + fused_expert_adapters) / 8
    training = TrainingSpec(seq_len=4096, global_batch_size=8, method=Method.QLORA)
    layout = dataclasses.replace(MIXTRAL_EP8, ep=1, zero_stage=3)
    per_gpu = estimate(
        preset("mixtral-8x7b").spec, gpu_cluster(H100, 8, 50e9), layout, training, tuning=default_tuning()
    ).memory.per_gpu
    assert per_gpu.parameters == pytest.approx(frozen + adapters, abs=1)


def test_fsdp_gathers_qlora_s_packed_nf4_storage_not_16_bit_weights() -> None:
    """FULL_SHARD gathers each unit's flat parameter as it is stored: under QLoRA (quant_storage
    bf16, as the launcher writes it) the NF4 Linears' packed 4 bits, not 16-bit weights (PEFT
    review, stop 41: Llama 3.1 70B over 4 A100s counted 2.4 GiB too much). Against LoRA, the same
    two gathered layers (this and the prefetched one) differ by their Linear weights x (2 - 0.5) B;
    the output unit and the NF4 dequantization buffer are the same."""
    model = preset("llama-3.1-70b").spec
    layout = Layout(framework=Framework.FSDP, dp=4, zero_stage=3, recompute=Recompute.FULL)
    cluster = gpu_cluster(gpu("a100-sxm-80gb"), 4, 50e9)

    def buffers(method: Method) -> float:
        j = make_job(
            model, cluster, TrainingSpec(seq_len=2048, global_batch_size=16, method=method, lora_rank=16)
        )
        return rank_states(j, layout, 0).buffers

    h, layers = 8192, 80
    attention = 2 * h * h + 2 * h * 1024  # q, o and k, v of 8 KV heads of 128
    mlp = 3 * h * 28672
    assert (attention + mlp) * 80 == pytest.approx(68.45e9, rel=1e-3)  # the Linears of 70.6B
    gathered_layers = 1 + default_tuning().memory.fsdp_prefetch_layers
    assert buffers(Method.LORA) - buffers(Method.QLORA) == pytest.approx(
        gathered_layers * (attention + mlp) * 1.5, rel=1e-9
    )
    assert layers == model.num_layers


def test_qlora_constants_are_whole_on_every_rank_whatever_the_sharding() -> None:
    """Parameters per GPU under FULL_SHARD at dp 2 and dp 8: the sharded part falls 4x, the NF4
    constants (quantized Linears x 0.127 bits / 8) stay: 8 p(8) - 2 p(2) = 6 x the constants."""
    model = preset("llama-3.1-70b").spec
    training = TrainingSpec(seq_len=2048, global_batch_size=16, method=Method.QLORA, lora_rank=16)

    def parameters(dp: int) -> float:
        j = make_job(model, gpu_cluster(gpu("a100-sxm-80gb"), dp, 50e9), training)
        layout = Layout(framework=Framework.FSDP, dp=dp, zero_stage=3, recompute=Recompute.FULL)
        return rank_states(j, layout, 0).states.parameters

    linears = 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672)
    constants = linears * (default_tuning().memory.qlora_bits_per_param - 4) / 8
    assert (8 * parameters(8) - 2 * parameters(2)) / 6 == pytest.approx(constants, rel=1e-9)
    assert constants / GiB == pytest.approx(1.01, abs=0.01)


@pytest.mark.parametrize("offload", [Offload.CPU, Offload.NVME])
def test_qlora_constants_stay_on_the_gpu_when_the_parameters_are_offloaded(offload: Offload) -> None:
    """The NF4 constants are a bitsandbytes quant_state, not a parameter ZeRO-3 or FSDP offloads: under
    parameter offload they stay on every GPU (about 1 GiB on Llama 3.1 70B) and the packed storage
    moves; the estimate had moved them too. The total is the same, only its place changes."""
    model = preset("llama-3.1-70b").spec
    training = TrainingSpec(seq_len=2048, global_batch_size=16, method=Method.QLORA, lora_rank=16)
    j = make_job(model, gpu_cluster(gpu("a100-sxm-80gb"), 8, 50e9), training)
    on_gpu = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=3, recompute=Recompute.FULL)
    moved = dataclasses.replace(on_gpu, offload_params=offload)
    kept, offloaded = rank_states(j, on_gpu, 0).states, rank_states(j, moved, 0).states
    linears = 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672)
    constants = linears * (default_tuning().memory.qlora_bits_per_param - 4) / 8
    assert offloaded.parameters == pytest.approx(constants, rel=1e-9)
    assert offloaded.host_bytes + offloaded.nvme_bytes == pytest.approx(kept.parameters - constants, rel=1e-9)
    assert _total(offloaded) == pytest.approx(_total(kept), rel=1e-12)  # moved, never dropped


# ---------------------------------------------------------------- every preset x layout

PRESETS = sorted(models())
MOE_PRESETS = sorted(name for name, p in models().items() if p.spec.moe is not None)
PRECISIONS = (Precision.BF16, Precision.FP16, Precision.FP32, Precision.BF16_PURE)


def _states(
    model: ModelSpec, cluster: ClusterSpec, layout: Layout, training: TrainingSpec
) -> list[ModelStates]:
    j = make_job(model, cluster, training)
    return [rank_states(j, layout, rank).states for rank in range(layout.pp)]


def _total(s: ModelStates) -> float:
    """Model-state bytes wherever they live: GPU, host and NVMe (offload moves, never drops)."""
    return s.parameters + s.gradients + s.optimizer_states + s.host_bytes + s.nvme_bytes


def _valid(model: ModelSpec, cluster: ClusterSpec, layout: Layout, training: TrainingSpec) -> bool:
    try:
        validate_layout(model, cluster, layout, training)
    except EstimatorError:
        return False
    return True


def check_frozen_base(model: ModelSpec, layout: Layout, precision: Precision) -> bool:
    """The invariants for one preset and layout; False when the layout cannot run LoRA."""
    gpus = layout.dp * layout.tp * layout.pp * layout.cp
    cluster = gpu_cluster(H100, gpus, 50e9)
    full_t = TrainingSpec(seq_len=2048, global_batch_size=layout.dp, precision=precision)
    lora_t = dataclasses.replace(full_t, method=Method.LORA)
    if layout.ep > 1 and peft_moves_mlp_targets(model):  # its MLP targets adapt nothing there: refused
        lora_t = dataclasses.replace(lora_t, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    qlora_t = dataclasses.replace(full_t, method=Method.QLORA)
    if not (_valid(model, cluster, layout, full_t) and _valid(model, cluster, layout, lora_t)):
        return False
    full, lora = _states(model, cluster, layout, full_t), _states(model, cluster, layout, lora_t)
    qlora = _states(model, cluster, layout, qlora_t) if _valid(model, cluster, layout, qlora_t) else None
    sb = state_bytes_of(make_job(model, cluster, full_t), layout.framework)
    # full training stores the parameters as FSDP's sharded fp32 master (mixed) or the weights; the
    # frozen base is in the compute dtype (fp32 under fp32, else 16-bit)
    stored = sb.master or sb.weights if layout.framework is Framework.FSDP else sb.weights
    frozen = 4.0 if precision is Precision.FP32 else 2.0
    j = make_job(model, cluster, lora_t)
    for rank in range(layout.pp):
        # the adapters train: stored as full training stores its parameters
        adapters = lora_parameters(model, lora_t, layout, rank_parameters_of(j, layout, rank)) * stored
        base = full[rank].parameters * frozen / stored
        if layout.offload_params is not Offload.NONE:
            assert lora[rank].parameters == full[rank].parameters == 0.0  # all on the host
        else:  # the adapters are sharded (at most over every GPU) or not
            assert base + adapters / gpus - 1 <= lora[rank].parameters <= base + adapters + 1, (
                rank,
                full,
                lora,
            )
        assert _total(lora[rank]) <= _total(full[rank]), (rank, lora, full)
        if qlora is not None:
            assert _total(qlora[rank]) <= _total(lora[rank]), (rank, qlora, lora)
            assert qlora[rank].gradients == lora[rank].gradients
        if layout.offload_optimizer is Offload.NONE and layout.offload_params is Offload.NONE:
            gpu_states = [s.parameters + s.gradients + s.optimizer_states for s in (full[rank], lora[rank])]
            assert gpu_states[1] <= gpu_states[0]
    return True


PEFT_FRAMEWORKS = [f for f, caps in FRAMEWORK_CAPABILITIES.items() if caps.peft]


@st.composite
def peft_layouts(draw: st.DrawFn) -> Layout:
    """Layouts of a framework with PEFT, its ZeRO stages (those it allows with pp > 1)."""
    framework = draw(st.sampled_from(PEFT_FRAMEWORKS))
    caps = FRAMEWORK_CAPABILITIES[framework]
    pp = draw(st.sampled_from([1, 2, 4]))
    stages = sorted(s for s in caps.zero_stages if pp == 1 or s <= caps.max_zero_stage_with_pp)
    dp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    params = [Offload.NONE, Offload.CPU] if caps.param_offload else [Offload.NONE]
    return Layout(
        framework=framework,
        dp=dp,
        tp=draw(st.sampled_from([1, 2, 4])),
        pp=pp,
        ep=draw(st.sampled_from([e for e in (1, 2, 4, 8) if dp % e == 0])),
        zero_stage=draw(st.sampled_from(stages)),
        offload_optimizer=draw(st.sampled_from([Offload.NONE, Offload.CPU])),
        offload_params=draw(st.sampled_from(params)),
        fsdp_hybrid_shard=framework is Framework.FSDP and draw(st.booleans()),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    name=st.sampled_from(PRESETS),
    layout=peft_layouts(),
    precision=st.sampled_from(PRECISIONS),
)
def test_frozen_base_bytes_do_not_depend_on_the_method(
    name: str, layout: Layout, precision: Precision
) -> None:
    assume(check_frozen_base(models()[name].spec, layout, precision))


GRID = [
    Layout(framework=Framework.DEEPSPEED, dp=8, ep=8, zero_stage=3),
    Layout(framework=Framework.DEEPSPEED, dp=8, ep=4, zero_stage=3),
    Layout(framework=Framework.DEEPSPEED, dp=8, ep=2, zero_stage=2),
    Layout(framework=Framework.DEEPSPEED, dp=8, ep=8, zero_stage=1),
    Layout(framework=Framework.DEEPSPEED, dp=4, tp=2, ep=4, zero_stage=3),
    Layout(framework=Framework.DEEPSPEED, dp=4, pp=2, ep=4, zero_stage=1),
    Layout(
        framework=Framework.DEEPSPEED,
        dp=8,
        ep=8,
        zero_stage=3,
        offload_params=Offload.CPU,
        offload_optimizer=Offload.CPU,
    ),
    Layout(framework=Framework.FSDP, dp=8, ep=8, zero_stage=3),
    Layout(framework=Framework.FSDP, dp=8, ep=4, zero_stage=2),
    Layout(framework=Framework.FSDP, dp=4, tp=2, ep=4, zero_stage=3),
    Layout(framework=Framework.FSDP, dp=4, pp=2, ep=2, zero_stage=3),
    Layout(framework=Framework.FSDP, dp=16, ep=8, zero_stage=3, fsdp_hybrid_shard=True),
    Layout(framework=Framework.MEGATRON, dp=8, ep=8, zero_stage=1),
    Layout(framework=Framework.MEGATRON, dp=4, tp=2, ep=8, etp=1, zero_stage=1),
]


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_frozen_experts_are_sharded_as_full_training_shards_them(name: str) -> None:
    spec = models()[name].spec
    checked = [layout for layout in GRID if check_frozen_base(spec, layout, Precision.BF16)]
    # Megatron has no PEFT and fsdp's PEFT no ep (both refused); every MoE preset runs some DeepSpeed
    # ep layout
    assert {layout.framework for layout in checked} == {Framework.DEEPSPEED}, name


@pytest.mark.parametrize("layout", [layout for layout in GRID if layout.framework is not Framework.DEEPSPEED])
def test_megatron_and_fsdp_ep_refuse_peft_so_no_frozen_base_to_compare(layout: Layout) -> None:
    """Megatron has no PEFT; fsdp's PEFT runs under Accelerate / HF Trainer, which have no expert
    parallelism, and fsdp's ep is torchtitan's, which has no PEFT (properties review: adapters were
    counted on expert modules only DeepSpeed's expert-parallel plan builds)."""
    mixtral = preset("mixtral-8x7b").spec
    lora = TrainingSpec(seq_len=2048, global_batch_size=layout.dp, method=Method.LORA)
    assert not _valid(mixtral, gpu_cluster(H100, 8, 50e9), layout, lora)


def test_moe_lora_adapts_the_fused_routed_experts_as_peft_moves_the_mlp_targets() -> None:
    """transformers 5 keeps a MoE layer's routed experts as fused parameters; peft 0.21 moves LoRA's
    MLP targets onto them (model_states.peft_adapts_fused_experts: DeepSeek-V2's model type converts
    as qwen2_moe): gate_up_proj's adapter at rank 2r and down_proj's at r, r x E rows each, and the
    names leave target_modules, so the first, dense layer and the shared experts keep none (measured
    with peft 0.21.2 on the meta device: config review, stop 44)."""
    spec = preset("deepseek-v2-lite").spec
    assert spec.moe is not None
    h, f, e = spec.hidden_size, spec.moe.expert_ffn_hidden_size, spec.moe.num_experts
    training = TrainingSpec(
        seq_len=4096, global_batch_size=8, method=Method.LORA, lora_rank=8,
        lora_targets=("gate_proj", "up_proj", "down_proj"),
    )  # fmt: skip
    layout = Layout(framework=Framework.DEEPSPEED, zero_stage=0)
    rp = rank_parameters_of(make_job(spec, gpu_cluster(H100, 1, 50e9), training), layout, 0)
    r = 8
    expected = 26 * (2 * r * e * (h + 2 * f) + r * e * (f + h))  # 26 MoE layers; the dense one has none
    assert lora_parameters(spec, training, layout, rp) == pytest.approx(expected)
    down_only = dataclasses.replace(training, lora_targets=("down_proj",))
    assert lora_parameters(spec, down_only, layout, rp) == pytest.approx(26 * r * e * (f + h))


def test_moe_lora_without_peft_s_conversion_leaves_the_fused_experts_unadapted() -> None:
    """GPT-OSS's model type is not among peft's converted ones: its fused experts take no adapter, and
    it has no dense MLP or shared expert, so MLP targets adapt nothing."""
    spec = preset("gpt-oss-20b").spec
    training = TrainingSpec(
        seq_len=4096, global_batch_size=8, method=Method.LORA, lora_rank=8,
        lora_targets=("q_proj", "gate_proj", "up_proj", "down_proj"),
    )  # fmt: skip
    attention_only = dataclasses.replace(training, lora_targets=("q_proj",))
    layout = Layout(framework=Framework.DEEPSPEED, zero_stage=0)
    rp = rank_parameters_of(make_job(spec, gpu_cluster(H100, 1, 50e9), training), layout, 0)
    assert lora_parameters(spec, training, layout, rp) == lora_parameters(spec, attention_only, layout, rp)


def test_the_notes_say_the_bytes_the_estimate_counts() -> None:
    """QLoRA on a V100 keeps the rest of the base in fp16 (no bf16 there), and FSDP keeps one sharded
    fp32 parameter per trainable one, no 16-bit copy: the notes said bf16 and a 2 B weight + 4 B
    master (PEFT review, stop 41)."""
    training = TrainingSpec(seq_len=1024, global_batch_size=1, method=Method.QLORA, precision=Precision.FP16)
    layout = Layout(framework=Framework.FSDP, dp=1, recompute=Recompute.FULL)
    notes = estimate(
        preset("llama-3.2-1b").spec, gpu_cluster(gpu("v100-sxm2-32gb"), 1, 50e9), layout, training,
        tuning=default_tuning(),
    ).assumptions  # fmt: skip
    text = " ".join(notes)
    assert "norms fp16" in text and "bf16" not in text
    assert "parameter 4 B (DDP's unsharded master)" in text and "master 4 B" not in text  # zero_stage 0


@pytest.mark.parametrize(("method", "kept"), [(Method.QLORA, True), (Method.LORA, False)])
def test_the_answer_says_the_fused_routed_experts_stay_16_bit_and_how_they_are_adapted(
    method: Method, kept: bool
) -> None:
    """Mixtral QLoRA on one H100: 85 GiB of parameters, the experts in bf16, while the only QLoRA
    assumption read "NF4 Linear weights" (hardware review): the answer says why, and that peft adapts
    them (Mixtral converts); GPT-OSS's experts take no adapter (it does not)."""
    training = TrainingSpec(seq_len=2048, global_batch_size=16, method=method)
    one_h100 = gpu_cluster(H100, 1, 50e9)
    for name, adapted in (("mixtral-8x7b", True), ("gpt-oss-20b", False)):
        answer = estimate(preset(name).spec, one_h100, Layout(framework=Framework.FSDP), training,
                          tuning=default_tuning(), with_limits=False)  # fmt: skip
        said = [a for a in answer.assumptions if a.startswith("routed experts:")]
        assert len(said) == 1
        assert ("onto which peft 0.21 moves LoRA's MLP targets" in said[0]) is adapted
        assert ("no adapters on them" in said[0]) is not adapted
        assert ("bitsandbytes leaves them bf16" in said[0]) is kept
    dense = estimate(preset("llama-3.1-8b").spec, one_h100, Layout(framework=Framework.FSDP), training,
                     tuning=default_tuning(), with_limits=False)  # fmt: skip
    assert not any(a.startswith("routed experts:") for a in dense.assumptions)


def test_llama_4s_experts_are_nf4_only_from_a_pre_quantized_checkpoint() -> None:
    """transformers swaps Llama4TextExperts for per-expert Linear modules bitsandbytes quantizes only in
    HfQuantizer.preprocess_model's `if self.pre_quantized` (quantizers/base.py): a bf16 checkpoint loaded
    with a BitsAndBytesConfig, as the launch files do, keeps the fused experts in bf16 (PEFT review:
    Scout QLoRA on 2 H100s said fit with ~90 GiB of experts per GPU counted as NF4)."""
    from service.estimator.model_states import experts_stay_16_bit

    scout = preset("llama-4-scout-17b-16e").spec
    fsdp = Layout(framework=Framework.FSDP)
    assert experts_stay_16_bit(scout, fsdp)
    assert not experts_stay_16_bit(dataclasses.replace(scout, bnb_4bit_checkpoint=True), fsdp)
    training = TrainingSpec(seq_len=4096, global_batch_size=8, method=Method.QLORA)
    two = gpu_cluster(H100, 2, 50e9)
    layout = Layout(framework=Framework.FSDP, dp=2, zero_stage=3)
    answer = estimate(scout, two, layout, training, tuning=default_tuning(), with_limits=False)
    assert not answer.fits  # 96.6B bf16 expert parameters: ~90 GiB per GPU at dp 2
    assert answer.memory.per_gpu.parameters > 80 * 2**30


def test_peft_s_adapted_fused_experts_keep_their_whole_weight_for_backward() -> None:
    """peft's ParamWrapper folds each adapter into its fused expert parameter for the forward (W + s x
    BA, one baddbmm in the parameter's dtype: _LoraFactorsProxy) and the expert matmuls keep that
    weight for the input gradient: every MoE layer holds its adapted experts' bytes until its
    backward; the backward makes the adapted weight's whole gradient (a buffer of the largest one)
    and computes the experts' weight-gradient GEMMs (config review, stop 44: Qwen3-30B-A3B's LoRA)."""
    spec = preset("qwen3-30b-a3b").spec
    assert spec.moe is not None
    e, h, f = spec.moe.num_experts, spec.hidden_size, spec.moe.expert_ffn_hidden_size
    layout = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=3, micro_batch_size=1)
    cluster = gpu_cluster(H100, 8, 50e9)
    experts = TrainingSpec(seq_len=2048, global_batch_size=8, method=Method.LORA)
    attention = dataclasses.replace(experts, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    with_experts = estimate(spec, cluster, layout, experts, tuning=default_tuning(), with_limits=False)
    without = estimate(spec, cluster, layout, attention, tuning=default_tuning(), with_limits=False)
    adapted = e * (h * 2 * f + f * h) * 2  # bf16: gate_up_proj and down_proj of every expert
    assert with_experts.memory.per_gpu.activations - without.memory.per_gpu.activations == pytest.approx(
        48 * adapted, rel=1e-6
    )
    assert with_experts.memory.per_gpu.buffers - without.memory.per_gpu.buffers == pytest.approx(
        e * h * 2 * f * 2, rel=1e-6
    )
    assert with_experts.time is not None and without.time is not None
    assert with_experts.time.step_s > without.time.step_s
    # under full recompute only the layer being recomputed holds its adapted weights
    full = dataclasses.replace(layout, recompute=Recompute.FULL)
    recomputed = estimate(spec, cluster, full, experts, tuning=default_tuning(), with_limits=False)
    assert recomputed.memory.per_gpu.activations < with_experts.memory.per_gpu.activations - 40 * adapted


@pytest.mark.parametrize(
    ("method", "framework", "stage", "said"),
    [
        (Method.LORA, Framework.DEEPSPEED, 3, True),  # gathers a module's parameters for its own forward
        (Method.QLORA, Framework.DEEPSPEED, 3, True),
        (Method.LORA, Framework.FSDP, 3, False),  # FSDP2 gathers the whole decoder layer first
        (Method.LORA, Framework.DEEPSPEED, 2, False),  # the adapters whole on every GPU
    ],
)
def test_fused_expert_adapters_under_sharding_that_breaks_them_are_said(
    method: Method, framework: Framework, stage: int, said: bool
) -> None:
    """peft's ParamWrapper reads lora_A / lora_B outside their forward; sharded there, the step fails
    (fine-tuning review): the estimate says so for the layouts where that happens."""
    training = TrainingSpec(seq_len=4096, global_batch_size=64, method=method, lora_rank=16)
    layout = Layout(framework=framework, dp=8, zero_stage=stage, recompute=Recompute.FULL)
    answer = estimate(
        preset("qwen3-30b-a3b").spec, gpu_cluster(H100, 8, 50e9), layout, training, tuning=default_tuning()
    )
    assert any("ParamWrapper" in w for w in answer.warnings) == said
    attention_only = dataclasses.replace(training, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    plain = estimate(
        preset("qwen3-30b-a3b").spec,
        gpu_cluster(H100, 8, 50e9),
        layout,
        attention_only,
        tuning=default_tuning(),
    )
    assert not any("ParamWrapper" in w for w in plain.warnings)  # no adapter on the experts


@pytest.mark.parametrize("stage", [2, 3])
def test_qlora_on_fsdp_with_adapters_on_fused_experts_is_refused(stage: int) -> None:
    """QLoRA's FSDP1 gives each adapter a unit of its own, and peft's ParamWrapper reads lora_A /
    lora_B outside their forward, sharded: the step fails (huggingface/peft#3080, open)."""
    training = TrainingSpec(seq_len=4096, global_batch_size=64, method=Method.QLORA, lora_rank=16)
    layout = Layout(framework=Framework.FSDP, dp=8, zero_stage=stage, recompute=Recompute.FULL)
    cluster = gpu_cluster(H100, 8, 50e9)
    with pytest.raises(InvalidLayout, match="huggingface/peft#3080"):
        validate_layout(preset("qwen3-30b-a3b").spec, cluster, layout, training)
    attention_only = dataclasses.replace(training, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    validate_layout(preset("qwen3-30b-a3b").spec, cluster, layout, attention_only)  # no expert adapter
    validate_layout(preset("gpt-oss-20b").spec, cluster, layout, training)  # peft moves nothing there


def test_hfu_holds_the_adapted_experts_weight_gradient_work_the_step_runs() -> None:
    """peft's adapted fused experts need their weight gradient (through the adapter): the step times
    those GEMMs, and HFU, what the kernels execute, holds them too (review: ~13% short). Qwen3-30B-A3B,
    all-linear: every expert matrix adapted, so per token 48 MoE layers x top_k 8 x 2 x 3 x 2048 x 768."""
    from service.estimator import flops
    from service.estimator.pipeline import recomputed_fraction

    model = preset("qwen3-30b-a3b").spec
    training = TrainingSpec(seq_len=4096, global_batch_size=64, method=Method.LORA, lora_rank=16)
    layout = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=2, recompute=Recompute.FULL)
    answer = estimate(model, gpu_cluster(H100, 8, 50e9), layout, training, tuning=default_tuning()).time
    peak = H100.peak_flops_per_s.of(Precision.BF16)
    executed = answer.hfu * answer.breakdown.step_s * 8 * peak / training.tokens_per_step
    base = flops.hardware_flops_per_step(
        model, training, layout.recompute, recomputed_fraction(model.num_layers, layout),
        layout.selective_modules, fused_experts=True,
    ) / training.tokens_per_step  # fmt: skip
    assert executed - base == pytest.approx(48 * 8 * 2 * 3 * 2048 * 768, rel=1e-9)
