"""Issue 27's ZeRO-3-at-scale and slow-network mechanisms: DeepSpeed's ZeRO-1/2 bucket all-reduce, the
pipeline engine's tied-embedding all-reduce, ZeRO-3's backward prefetch capped by
``stage3_max_live_parameters`` and its re-gather of what ``stage3_max_reuse_distance`` releases;
hand-computed tiny cases, then monotonic properties (more dp at a fixed global batch never raises per-GPU
throughput under ZeRO-3; a slower link is never faster)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from service.catalog.gpus import gpu
from service.estimator import comm, dp_comm, step_time
from service.estimator.model_states import DS_MAX_LIVE_PARAMETERS
from service.estimator.params import LayerKind
from service.estimator.types import Framework, Layout, ModelSpec, Precision, Recompute, TrainingSpec
from tests.estimator.helpers import job, time
from validation.cases import A100, gpt, gpu_cluster

DENSE = LayerKind(moe=False)
V100 = gpu("v100-sxm2-32gb")
TUNING_BASE_S, TUNING_INTER_S, INTER_EFFICIENCY = 1.4e-5, 4.0e-6, 0.9  # tuning.toml [links]


def tiny_gpt(layers: int = 4, hidden: int = 1024, vocab: int = 1000) -> ModelSpec:
    return gpt(layers, hidden, hidden // 64, vocab=vocab)


# ---------------------------------------------------------------- DeepSpeed ZeRO-1/2: all-reduce


def test_deepspeed_all_reduces_its_zero_buckets_megatron_reduce_scatters() -> None:
    for stage in (1, 2):
        ds = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=stage)
        assert dp_comm.grad_reduce_collective(ds) is comm.group_all_reduce_s
    assert dp_comm.grad_reduce_collective(Layout(framework=Framework.MEGATRON, dp=8, zero_stage=1)) is (
        comm.group_reduce_scatter_s
    )
    assert dp_comm.grad_reduce_collective(Layout(framework=Framework.FSDP, dp=8, zero_stage=0)) is (
        comm.group_all_reduce_s
    )


def test_deepspeed_zero1_moves_twice_a_reduce_scatters_traffic() -> None:
    # one node pair, one rank per node (tp 8 fills each node): a flat ring over 2 ranks, 1 GB of grads
    cluster = gpu_cluster(A100, 16, 10e9)
    j = job(tiny_gpt(), cluster, TrainingSpec(seq_len=1024, global_batch_size=16))
    link = step_time.tuned_link(j, 2, 8)
    ds = Layout(framework=Framework.DEEPSPEED, dp=2, tp=8, zero_stage=1)
    reduce_s = dp_comm.dp_grad_reduce_s(j, ds, 0.5e9, link)  # 0.5e9 bf16 gradients: 1e9 bytes
    bw = 10e9 * INTER_EFFICIENCY
    # ring all-reduce over n = 2: 2(n-1) = 2 steps of latency and 2(n-1)/n x S = S of traffic (a
    # reduce-scatter: 1 step, S/2); reduce_bucket_size h^2 = 1M clamped to 1e7 elements: 50 buckets,
    # each paying the base latency and its 2 steps
    calls = 0.5e9 / 1e7
    per_call = TUNING_BASE_S + 2 * TUNING_INTER_S
    assert reduce_s == pytest.approx(calls * per_call + 1e9 / bw)


# ---------------------------------------------------------------- tied embedding, DeepSpeed pipeline


def tied_job(precision: Precision = Precision.FP16) -> tuple[object, Layout]:
    model = tiny_gpt(vocab=50_000)  # tied embeddings (gpt())
    cluster = gpu_cluster(A100, 16, 10e9)
    training = TrainingSpec(seq_len=1024, global_batch_size=16, precision=precision)
    layout = Layout(framework=Framework.DEEPSPEED, dp=1, tp=8, pp=2, zero_stage=1)
    return job(model, cluster, training), layout


def test_tied_embedding_all_reduce_by_hand() -> None:
    j, layout = tied_job()
    # V h / t fp16 gradients between stage 0 and stage 1, one rank per node: ring over 2 ranks
    size = 50_000 * 1024 / 8 * 2
    expected = TUNING_BASE_S + 2 * TUNING_INTER_S + size / (10e9 * INTER_EFFICIENCY)
    assert step_time.tied_embedding_reduce_s(j, layout) == pytest.approx(expected)
    # bf16 reduces the bf16 optimizer's _hp_grad in its grad_acc_dtype, bf16 where ds_config sets none
    # (engine.py get_data_types: the model's dtype since DeepSpeed PR #7515; fp32 before): the same bytes
    jb, _ = tied_job(Precision.BF16)
    bf16 = step_time.tied_embedding_reduce_s(jb, layout)
    assert bf16 == pytest.approx(expected)


def test_megatron_all_reduces_a_tied_embedding_in_its_grad_buffer_dtype() -> None:
    # Megatron's finalize_model_grads (_allreduce_word_embedding_grads) all-reduces the tied word
    # embedding's main_grad between the first and the last stage, after the DP sync: V h / t
    # elements in the grad buffer's dtype (bf16 by default, fp32 with grad_reduce_in_fp32; fp16 keeps
    # fp16). It was charged for DeepSpeed only (pipeline review)
    size = 50_000 * 1024 / 8
    ring = TUNING_BASE_S + 2 * TUNING_INTER_S
    jb, layout = tied_job(Precision.BF16)
    megatron = dataclasses.replace(layout, framework=Framework.MEGATRON)
    assert step_time.tied_embedding_reduce_s(jb, megatron) == pytest.approx(
        ring + 2 * size / (10e9 * INTER_EFFICIENCY)
    )
    fp32 = dataclasses.replace(megatron, grad_reduce_in_fp32=True)
    assert step_time.tied_embedding_reduce_s(jb, fp32) == pytest.approx(
        ring + 4 * size / (10e9 * INTER_EFFICIENCY)
    )
    j16, _ = tied_job()
    assert step_time.tied_embedding_reduce_s(j16, megatron) == pytest.approx(
        ring + 2 * size / (10e9 * INTER_EFFICIENCY)
    )


def test_megatron_all_reduces_the_embedding_an_mtp_block_shares() -> None:
    # finalize_model_grads all-reduces the word embedding between the first and last stage where the
    # model ties it or multi-token prediction runs (the last stage's MTP block embeds with its copy):
    # an untied model with mtp_num_layers 1 on pp 2 was charged nothing (review of stop 48)
    untied = dataclasses.replace(tiny_gpt(vocab=50_000), tied_embeddings=False)
    c = gpu_cluster(A100, 16, 10e9)
    layout = Layout(framework=Framework.MEGATRON, dp=1, tp=8, pp=2, zero_stage=1)
    plain = job(untied, c, TrainingSpec(seq_len=1024, global_batch_size=16, precision=Precision.BF16))
    assert step_time.tied_embedding_reduce_s(plain, layout) == 0.0
    mtp = job(
        untied,
        c,
        TrainingSpec(seq_len=1024, global_batch_size=16, precision=Precision.BF16, mtp_num_layers=1),
    )
    size = 50_000 * 1024 / 8 * 2  # bf16 main grads (grad_reduce_in_fp32 off by default)
    expected = TUNING_BASE_S + 2 * TUNING_INTER_S + size / (10e9 * INTER_EFFICIENCY)
    assert step_time.tied_embedding_reduce_s(mtp, layout) == pytest.approx(expected)


def test_tied_embedding_all_reduce_only_where_a_pipeline_splits_a_tied_model() -> None:
    j, layout = tied_job()
    assert step_time.tied_embedding_reduce_s(j, dataclasses.replace(layout, pp=1, tp=8, dp=2)) == 0.0
    fsdp = dataclasses.replace(layout, framework=Framework.FSDP, zero_stage=3)
    assert step_time.tied_embedding_reduce_s(j, fsdp) == 0.0  # torch.distributed.pipelining ties nothing
    untied = dataclasses.replace(tiny_gpt(vocab=50_000), tied_embeddings=False)
    ju = job(untied, gpu_cluster(A100, 16, 10e9), TrainingSpec(seq_len=1024, global_batch_size=16))
    assert step_time.tied_embedding_reduce_s(ju, layout) == 0.0


# ---------------------------------------------------------------- ZeRO-3 backward prefetch


def zero3(framework: Framework = Framework.DEEPSPEED, recompute: Recompute = Recompute.FULL) -> Layout:
    return Layout(framework=framework, dp=64, zero_stage=3, recompute=recompute)


def test_backward_prefetch_is_blocked_only_past_max_live_parameters() -> None:
    cluster = gpu_cluster(V100, 64, 6.25e9)
    training = TrainingSpec(seq_len=1024, global_batch_size=64, precision=Precision.FP16)
    # 12 h^2 per layer: h = 10240 holds 1.26e9 (> 1e9 live), h = 6144 holds 0.45e9
    wide, narrow = job(gpt(2, 10240, 80), cluster, training), job(gpt(2, 6144, 48), cluster, training)
    assert 12 * 10240**2 > DS_MAX_LIVE_PARAMETERS > 12 * 6144**2
    assert dp_comm.backward_prefetch_blocked(wide, zero3(), DENSE)
    assert not dp_comm.backward_prefetch_blocked(narrow, zero3(), DENSE)
    # without recompute a layer's parameters are released after each module's backward; FSDP has no cap
    assert not dp_comm.backward_prefetch_blocked(wide, zero3(recompute=Recompute.NONE), DENSE)
    assert not dp_comm.backward_prefetch_blocked(wide, zero3(Framework.FSDP), DENSE)


def test_a_blocked_backward_exposes_every_gather() -> None:
    cluster = gpu_cluster(V100, 64, 6.25e9)
    training = TrainingSpec(seq_len=1024, global_batch_size=64, precision=Precision.FP16)
    j = job(gpt(2, 10240, 80), cluster, training)
    layout = zero3()
    unit = dp_comm.unit_collectives(j, layout, DENSE)
    # 2 layers, one micro-batch: both backward gathers wait in full, and so does the first forward one
    assert dp_comm.sharded_exposed_s(j, layout) >= 3 * unit.gather_s


# ---------------------------------------------------------------- ZeRO-3 reuse distance: the third gather


def test_reuse_released_by_hand() -> None:
    # modules q, k, v, o, up, down of sizes 1, 1, 1, 1, 4, 4; after module i's recomputed forward the
    # trace runs the modules after it, then their backward from the last down to i's
    modules = (1.0, 1.0, 1.0, 1.0, 4.0, 4.0)
    # q: k, v, o, up (7) then down: 11 >= 10 before q's backward is reached: released
    assert dp_comm.reuse_released(modules, 0, 10.0)
    # up: down forward, down backward (8 < 10), then up's backward: kept
    assert not dp_comm.reuse_released(modules, 4, 10.0)
    # o: up, down, down backward, up backward = 16 elements before o's backward
    assert dp_comm.reuse_released(modules, 3, 16.0)
    assert not dp_comm.reuse_released(modules, 3, 16.5)
    # the last module's backward follows its forward at once: never released
    assert not dp_comm.reuse_released(modules, 5, 1.0)


def test_a_gpt_layer_past_the_reuse_distance_regathers_its_attention() -> None:
    cluster = gpu_cluster(V100, 64, 6.25e9)
    training = TrainingSpec(seq_len=1024, global_batch_size=64, precision=Precision.FP16)
    wide, narrow = job(gpt(2, 10240, 80), cluster, training), job(gpt(2, 6144, 48), cluster, training)
    # h = 10240 (h^2 = 1.05e8): q, k, v and o each see >= 1e9 elements of trace before their backward
    # (o: up, down, down's backward = 12 h^2 = 1.26e9); up and down are reused. Attention is 4 h^2 (+ 4h
    # biases) of 12 h^2 + 13 h: a third, less the norms' 4h share.
    c = wide.counts
    attention_share = c.attention_per_layer / (c.attention_per_layer + c.dense_mlp_per_layer)
    assert dp_comm.regathered_share(wide, DENSE, 1) == pytest.approx(attention_share)
    assert attention_share == pytest.approx(1 / 3, rel=1e-3)
    # h = 6144: q's backward is 22 h^2 = 0.83e9 away: every module is reused
    assert dp_comm.regathered_share(narrow, DENSE, 1) == 0.0
    assert dp_comm.backward_gather_factor(wide, zero3(), DENSE, 0) == pytest.approx(1 + attention_share)
    assert dp_comm.backward_gather_factor(wide, zero3(recompute=Recompute.NONE), DENSE, 0) == 1.0
    assert dp_comm.backward_gather_factor(wide, zero3(Framework.FSDP), DENSE, 0) == 1.0


def test_the_third_gather_adds_its_share_of_every_blocked_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = gpu_cluster(V100, 64, 6.25e9)
    training = TrainingSpec(seq_len=1024, global_batch_size=64, precision=Precision.FP16)
    model = gpt(2, 10240, 80)
    layout = zero3()
    with_regather = dp_comm.sharded_exposed_s(job(model, cluster, training), layout)
    j = job(model, cluster, training)
    share = dp_comm.regathered_share(j, DENSE, 1)
    gather_s = dp_comm.unit_collectives(j, layout, DENSE).gather_s
    monkeypatch.setattr(dp_comm, "regathered_share", lambda *_: 0.0)
    without = dp_comm.sharded_exposed_s(job(model, cluster, training), layout)
    # a blocked backward waits for each gather in full: 2 layers x 1 micro-batch x the share
    assert with_regather - without == pytest.approx(2 * share * gather_s)


@pytest.mark.parametrize("heads", [1, 4])  # MHA and 4 query heads per kv head
def test_the_regathered_share_never_falls_as_the_layer_widens(heads: int) -> None:
    cluster = gpu_cluster(V100, 64, 6.25e9)
    training = TrainingSpec(seq_len=1024, global_batch_size=64, precision=Precision.FP16)
    # a module released at one width is released at every wider one (its trace only grows)
    released = []
    for hidden in range(4096, 16385, 1024):
        model = dataclasses.replace(gpt(2, hidden, hidden // 128), num_kv_heads=hidden // 128 // heads)
        modules = dp_comm.dense_module_parameters(job(model, cluster, training), 1)
        released.append([dp_comm.reuse_released(modules, i, dp_comm.DS_MAX_REUSE_DISTANCE) for i in range(6)])
    for narrower, wider in itertools.pairwise(released):
        assert all(w or not n for n, w in zip(narrower, wider, strict=True)), released
    assert not any(released[0]) and any(released[-1])


def test_the_v100_gemm_rate_is_not_too_fast_for_megatron_on_one_gpu() -> None:
    # NVIDIA ADLR, "MegatronLM's Supercharged V1.0" (nv-adlr.github.io/MegatronLMV1): the 1.2B GPT
    # (40 layers, h 1536, 16 heads, batch 8, sequence 1024, checkpointed, fp16) on one DGX-2H V100 runs
    # 1288 ms an iteration (62.4 TFLOP/s, 48% of that part's 130 TFLOP/s peak). On the datasheet V100
    # SXM2 (125 TFLOP/s) the estimate must not be faster: the ZeRO-3 rows' miss is not the V100's
    # GEMM fraction.
    model = gpt(40, 1536, 16)
    cluster = gpu_cluster(V100, 1, 6.25e9)
    training = TrainingSpec(seq_len=1024, global_batch_size=8, precision=Precision.FP16)
    layout = Layout(framework=Framework.MEGATRON, micro_batch_size=8, recompute=Recompute.FULL)
    step_s = time(model, cluster, layout, training).step_s
    assert 1.288 <= step_s <= 1.288 * 1.2, step_s


# ---------------------------------------------------------------- monotonic properties


@pytest.mark.parametrize("framework", [Framework.DEEPSPEED, Framework.FSDP])
@pytest.mark.parametrize("bandwidth", [1.5625e9, 6.25e9, 50e9])
def test_more_dp_at_a_fixed_global_batch_never_raises_per_gpu_throughput(
    framework: Framework, bandwidth: float
) -> None:
    # ZeRO-3 gathers and reduces the whole model every micro-batch whatever dp is: doubling the GPUs at
    # a fixed global batch halves each GPU's tokens, never its collectives
    model = gpt(24, 6144, 48)
    training = TrainingSpec(seq_len=2048, global_batch_size=256, precision=Precision.BF16)
    per_gpu = []
    for gpus in (32, 64, 128, 256):
        cluster = gpu_cluster(A100, gpus, bandwidth)
        layout = Layout(
            framework=framework, dp=gpus, zero_stage=3, micro_batch_size=1, recompute=Recompute.FULL
        )
        t = time(model, cluster, layout, training)
        per_gpu.append(t.tokens_per_s / gpus)
    assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(per_gpu)), per_gpu


@pytest.mark.parametrize(
    "layout",
    [
        Layout(framework=Framework.DEEPSPEED, dp=64, zero_stage=3, recompute=Recompute.FULL),
        Layout(framework=Framework.FSDP, dp=64, zero_stage=3, micro_batch_size=1),
        Layout(framework=Framework.DEEPSPEED, dp=4, tp=4, pp=4, zero_stage=1, recompute=Recompute.FULL),
        Layout(framework=Framework.MEGATRON, dp=4, tp=4, pp=4, zero_stage=1, micro_batch_size=1),
    ],
)
def test_a_slower_link_is_never_faster(layout: Layout) -> None:
    model = gpt(24, 6144, 48)
    training = TrainingSpec(seq_len=2048, global_batch_size=256, precision=Precision.BF16)
    steps = [
        time(model, gpu_cluster(A100, 64, bandwidth), layout, training).step_s
        for bandwidth in (50e9, 25e9, 12.5e9, 6.25e9, 3.125e9, 1.5625e9)
    ]
    assert all(b >= a for a, b in itertools.pairwise(steps)), steps
