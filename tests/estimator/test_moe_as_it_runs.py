"""Issue 27's MoE mechanisms, each by hand on a small case: the grouped GEMM's shape roofline, the
busiest expert-parallel rank's load (random routing, or the capacity it is padded to), the router's
and the dispatcher's memory-bound passes, and the alltoall dispatcher's host sync; then the
monotonic properties (fewer rows per expert never raise the GEMMs' efficiency, more experts at the
same active parameters are never faster) and a dense model, which none of them touches."""

from __future__ import annotations

import dataclasses
import math

import pytest

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator.errors import InvalidLayout
from service.estimator.job import moe_layers_of
from service.estimator.step_time import (
    dispatcher_syncs_host,
    expert_efficiency,
    expert_load_factor,
    max_load_factor,
    moe_dispatch_bytes_per_row,
    moe_dispatch_s,
    moe_host_sync_s,
    routed_rows_per_rank,
    router_bytes_per_token,
    step_base,
    tokens_per_expert,
)
from service.estimator.tuning import gemm_roofline_bound, matmul_efficiency, weight_streaming_bound
from service.estimator.types import Framework, Layout, Precision, Recompute, TrainingSpec
from service.estimator.validate import validate_layout
from tests.estimator.helpers import FINE_MOE, job, time
from validation.cases import gpu_cluster

H100 = gpu("h100-sxm-80gb")
ONE_NODE = gpu_cluster(H100, 8, 50e9)
FINE = FINE_MOE
TRAINING = TrainingSpec(seq_len=4096, global_batch_size=64)
MEGATRON = Layout(framework=Framework.MEGATRON, dp=8, ep=8, zero_stage=1)


def test_gemm_roofline_is_the_shapes_intensity_over_the_ridge() -> None:
    # 256 rows of h 2048 into the gated up projection (2 x 768 = 1536 wide): 2 x 256 x 1536 x 2048
    # FLOPs over 2 x (256 x 2048 + 2048 x 1536 + 256 x 1536) bytes
    rows, n, k = 256.0, 1536.0, 2048.0
    intensity = rows * n * k / (rows * k + k * n + rows * n)
    assert intensity == pytest.approx(805_306_368 / 4_063_232) == pytest.approx(198.19, abs=0.01)
    ridge = H100.peak_flops_per_s.bf16 / H100.hbm_bandwidth_bytes_per_s
    assert gemm_roofline_bound(H100, rows, n, k) == pytest.approx(intensity / ridge)
    # it is never above streaming the weights alone, and tends to it for wide, deep GEMMs
    assert gemm_roofline_bound(H100, rows, n, k) < weight_streaming_bound(H100, rows)
    assert gemm_roofline_bound(H100, rows, 1e9, 1e9) == pytest.approx(weight_streaming_bound(H100, rows))
    # symmetric: the backward's dgrad and wgrad GEMMs share it
    assert gemm_roofline_bound(H100, rows, n, k) == pytest.approx(gemm_roofline_bound(H100, k, rows, n))


@pytest.mark.parametrize("shape", [(1536.0, 2048.0), (2048.0, 768.0), (512.0, 4096.0)])
def test_fewer_rows_per_expert_never_raise_the_efficiency(shape: tuple[float, float]) -> None:
    tuning = default_tuning()
    rows = [2.0**i for i in range(3, 15)]
    with_shape = [matmul_efficiency(tuning, H100, 768, r, shape=shape) for r in rows]
    assert with_shape == sorted(with_shape)
    assert all(e <= matmul_efficiency(tuning, H100, 768, r) for e, r in zip(with_shape, rows, strict=True))


def test_routed_rows_and_tokens_per_expert_by_hand() -> None:
    j = job(FINE, ONE_NODE, TRAINING)
    # 4096 tokens x top 8 per rank; over ep 8 x 128 / 8 = 128 experts: 4096 x 8 x 8 / 128 = 2048 rows
    assert routed_rows_per_rank(j, MEGATRON) == 4096 * 8
    assert tokens_per_expert(j, MEGATRON) == 2048
    padded = dataclasses.replace(MEGATRON, moe_capacity_factor=1.25)
    assert tokens_per_expert(j, padded) == 2048 * 1.25


def test_max_load_is_raab_and_stegers_by_hand() -> None:
    # 8 x 32768 routed copies on 8 ranks: mean 32768, fullest ~ 32768 + sqrt(2 x 32768 x ln 8)
    mean = 32768
    fullest = mean + math.sqrt(2 * mean * math.log(8))
    assert max_load_factor(8 * mean, 8) == pytest.approx(fullest / mean)
    assert max_load_factor(1000, 1) == 1.0
    # fewer copies per rank: relatively more imbalance
    assert max_load_factor(8 * 1024, 8) > max_load_factor(8 * mean, 8)


def test_expert_load_factor_by_framework_and_capacity() -> None:
    j = job(FINE, ONE_NODE, TRAINING)
    dropless = expert_load_factor(j, MEGATRON)
    assert dropless == pytest.approx(max_load_factor(8 * 4096 * 8, 8))
    assert 1.0 < dropless < 1.02  # random routing of 262,144 copies is nearly even
    assert expert_load_factor(j, dataclasses.replace(MEGATRON, moe_capacity_factor=1.5)) == 1.5
    # DeepSpeed's MoE (the layers its script builds with ep > 1) pads to capacity_factor 1.0 by default
    deepspeed = Layout(framework=Framework.DEEPSPEED, dp=8, ep=8, zero_stage=1)
    assert deepspeed.capacity_factor == 1.0 and expert_load_factor(j, deepspeed) == 1.0
    # the busiest rank's experts set the routed GEMMs' pace and the all-to-all's volume
    base = step_base(j, MEGATRON)
    assert base.expert_flops_per_s == pytest.approx(
        j.cluster.gpu.peak_flops_per_s.bf16 * expert_efficiency(j, MEGATRON) / dropless
    )


def test_router_and_dispatch_passes_by_hand() -> None:
    assert router_bytes_per_token(128) == 20 * 128
    j = job(FINE, ONE_NODE, TRAINING)
    h, f = 2048, 768
    # bf16: the second permutation reads and writes each received row forward and backward
    assert moe_dispatch_bytes_per_row(j, MEGATRON) == 2 * 2 * 2 * h
    fp8 = job(FINE, ONE_NODE, dataclasses.replace(TRAINING, precision=Precision.FP8))
    tuning = default_tuning()
    cast = tuning.fp8_cast_bytes_per_element + tuning.fp8_transposed_cast_bytes_per_element
    assert moe_dispatch_bytes_per_row(fp8, MEGATRON) == pytest.approx(8 * h + cast * (h + 2 * f + f + h))
    # one local expert per rank: no second permutation; other frameworks: not counted
    assert moe_dispatch_bytes_per_row(j, dataclasses.replace(MEGATRON, dp=128, ep=128)) == 0.0
    fsdp = Layout(framework=Framework.FSDP, dp=8, zero_stage=3)
    assert moe_dispatch_bytes_per_row(j, fsdp) == 0.0
    base = step_base(j, MEGATRON)
    rows = 4096 * 8 * expert_load_factor(j, MEGATRON)
    per_layer = 4096 * 20 * 128 + rows * 8 * h
    expected = base.micro_batches * 4 * per_layer / H100.hbm_bandwidth_bytes_per_s
    assert moe_dispatch_s(j, MEGATRON, base) == pytest.approx(expected)


def test_host_sync_once_per_moe_layer_and_forward_when_dropless() -> None:
    j = job(FINE, ONE_NODE, TRAINING)
    base = step_base(j, MEGATRON)
    assert moe_layers_of(base.counts) == 4 and base.micro_batches == 8
    assert dispatcher_syncs_host(MEGATRON)
    assert moe_host_sync_s(j, MEGATRON, base, 1.0) == pytest.approx(8 * 4 * default_tuning().moe_host_sync_s)
    padded = dataclasses.replace(MEGATRON, moe_capacity_factor=1.0)
    assert not dispatcher_syncs_host(padded)
    assert moe_host_sync_s(j, padded, step_base(j, padded), 1.0) == 0.0
    assert not dispatcher_syncs_host(Layout(framework=Framework.DEEPSPEED, dp=8, ep=8))
    # a full recompute dispatches again: its syncs are in the recompute part
    full = dataclasses.replace(MEGATRON, recompute=Recompute.FULL)
    plain_t, full_t = time(FINE, ONE_NODE, MEGATRON, TRAINING), time(FINE, ONE_NODE, full, TRAINING)
    assert full_t.breakdown.compute_s == pytest.approx(plain_t.breakdown.compute_s)
    assert full_t.breakdown.recompute_s > 0


def test_more_experts_at_the_same_active_parameters_are_never_faster() -> None:
    steps = []
    for experts in (16, 32, 64, 128, 256):
        spec = dataclasses.replace(FINE, moe=dataclasses.replace(FINE.moe, num_experts=experts))
        steps.append(time(spec, ONE_NODE, MEGATRON, TRAINING).step_s)
    assert steps == sorted(steps)


def test_padding_to_capacity_trades_the_sync_for_the_padded_rows() -> None:
    # the same model dropless and padded to 1.0: the padded run has no host sync and the mean rows
    dropless = time(FINE, ONE_NODE, MEGATRON, TRAINING).breakdown
    padded = time(FINE, ONE_NODE, dataclasses.replace(MEGATRON, moe_capacity_factor=1.0), TRAINING).breakdown
    assert padded.compute_s < dropless.compute_s
    assert padded.ep_comm_s < dropless.ep_comm_s
    wide = time(FINE, ONE_NODE, dataclasses.replace(MEGATRON, moe_capacity_factor=2.0), TRAINING).breakdown
    assert wide.compute_s > padded.compute_s
    assert padded.ep_comm_s < wide.ep_comm_s <= 2 * padded.ep_comm_s  # twice the bytes, the same latency


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gpt-3-175b"])
def test_a_dense_model_is_untouched(name: str) -> None:
    spec = preset(name).spec
    assert spec.moe is None
    training = TrainingSpec(seq_len=2048, global_batch_size=64, precision=Precision.FP8)
    layout = Layout(framework=Framework.MEGATRON, dp=2, tp=4, sequence_parallel=True, zero_stage=1)
    j = job(spec, ONE_NODE, training)
    base = step_base(j, layout)
    assert expert_load_factor(j, layout) == 1.0
    assert moe_dispatch_s(j, layout, base) == 0.0 and moe_host_sync_s(j, layout, base, 1.0) == 0.0
    # no MoE number of the tuning reaches it
    loud = dataclasses.replace(default_tuning(), moe_host_sync_s=1.0)
    plain = time(spec, ONE_NODE, layout, training).step_s
    assert time(spec, ONE_NODE, layout, training, loud).step_s == plain


def test_deepspeed_pads_to_capacity_only_where_its_script_builds_deepspeed_moe_layers() -> None:
    # ep > 1: deepspeed.moe.layer.MoE(ep_size=ep), capacity_factor 1.0 with drop_tokens by default;
    # ep = 1: the script trains the model's own MoE block (Hugging Face's expert loop), dropless
    hf_block = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=1)
    assert hf_block.capacity_factor is None
    assert Layout(framework=Framework.DEEPSPEED, dp=8, ep=2, zero_stage=1).capacity_factor == 1.0
    j = job(FINE, ONE_NODE, TRAINING)
    assert tokens_per_expert(j, hf_block) == routed_rows_per_rank(j, hf_block) / FINE.moe.num_experts
    # a capacity for the HF block would be estimated and never run: refused, naming the field
    with pytest.raises(InvalidLayout) as refused:
        validate_layout(FINE, ONE_NODE, dataclasses.replace(hf_block, moe_capacity_factor=1.25), TRAINING)
    assert (refused.value.field, refused.value.rule) == ("moe_capacity_factor", "capacity_moe")
    assert "ep = 1" in refused.value.message


def test_megatron_keeps_one_copy_of_each_routed_row_gathered_over_etp() -> None:
    """Megatron-Core keeps one h-wide copy per routed row (fc1's input: the routing weights multiply
    inside the activation, unpermute saves indices), all-gathered over the expert-TP group by the
    alltoall dispatcher: a rank holds etp/tp of the rows. Hugging Face's expert loop (DeepSpeed, FSDP)
    keeps two (the gathered input, the weighted output). By hand on Qwen3-30B-A3B (48 MoE layers, h
    2048, top 8) at 4K tokens, tp 4 with SP: etp 4 holds 48 x 2 B x 8 x 4096 x 2048 x 3/4 more than
    etp 1 (MoE review: the same bytes whatever etp, and twice the copies)."""
    from service.estimator.estimate import estimate

    qwen = preset("qwen3-30b-a3b").spec
    h100s = gpu_cluster(gpu("h100-sxm-80gb"), 8, 50e9)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)

    def activations(etp: int) -> int:
        # (fp32 main grads: no fp32 copy at the step, whose moment would otherwise be the peak here)
        layout = Layout(framework=Framework.MEGATRON, dp=2, tp=4, ep=2, etp=etp, zero_stage=1,
                        sequence_parallel=True, grad_reduce_in_fp32=True)  # fmt: skip
        answer = estimate(qwen, h100s, layout, training, tuning=default_tuning(), with_limits=False)
        return answer.memory.per_gpu.activations

    assert activations(4) - activations(1) == 48 * 2 * 8 * 4096 * 2048 * 3 // 4


def test_megatron_mla_keeps_v_and_the_projection_input_at_v_head_dim() -> None:
    """Megatron's MLA splits value at v_head_dim and feeds linear_proj v_head_dim x heads (its
    multi_latent_attention.py), not q/k's qk_head_dim: DeepSeek-V3 (128 heads, 192 against 128) holds
    2 x 2 B x 4096 x 128 x 64 = 134,217,728 bytes per layer less than with V as wide as Q (MoE review)."""
    from service.estimator.activations import megatron_layer_bytes

    dsv3 = preset("deepseek-v3").spec
    assert dsv3.mla is not None
    as_wide = dataclasses.replace(dsv3, mla=dataclasses.replace(dsv3.mla, v_head_dim=dsv3.mla.qk_head_dim))
    training = TrainingSpec(seq_len=4096, global_batch_size=8)
    layout = Layout(framework=Framework.MEGATRON)
    wider = megatron_layer_bytes(as_wide, layout, training, True) - megatron_layer_bytes(
        dsv3, layout, training, True
    )
    assert wider == 2 * 2 * 4096 * 128 * (192 - 128) == 134_217_728


def test_megatron_shared_experts_run_a_dense_mlps_tp_collectives() -> None:
    """Megatron's SharedExpertMLP all-gathers and reduce-scatters its sequence-parallel tokens as a dense
    MLP does, etp 1 or not (the routed experts' own collectives are top_k dense ones where etp > 1, none
    at etp 1): DeepSeek-V3 at etp 1 counted attention's collectives alone (MoE review)."""
    from service.estimator.step_time import moe_mlp_tp_factor

    dsv3, mixtral = preset("deepseek-v3").spec, preset("mixtral-8x7b").spec
    h100s = gpu_cluster(gpu("h100-sxm-80gb"), 8, 50e9)
    training = TrainingSpec(seq_len=4096, global_batch_size=8)
    for etp, routed in ((1, 0.0), (None, 8.0)):
        layout = Layout(framework=Framework.MEGATRON, tp=8, etp=etp, sequence_parallel=True, zero_stage=1)
        assert moe_mlp_tp_factor(job(dsv3, h100s, training), layout) == 1.0 + routed
    mixtral_layout = Layout(framework=Framework.MEGATRON, tp=8, etp=1, sequence_parallel=True, zero_stage=1)
    assert moe_mlp_tp_factor(job(mixtral, h100s, training), mixtral_layout) == 0.0  # no shared expert
