"""PyTorch's ring attention (``context_parallel``, what FSDP/torchtitan jobs run): the K and V it moves,
its fp32 merge passes and its exposed traffic, by hand; growth with the CP degree; Megatron's ring
untouched."""

from __future__ import annotations

import dataclasses

import pytest

from service.catalog.gpus import gpu
from service.catalog.models import model as preset_model
from service.catalog.tuning import default_tuning
from service.estimator import comm, step_time
from service.estimator.defaults import for_gpu
from service.estimator.estimate import estimate
from service.estimator.evaluate import memory_fits
from service.estimator.job import Job, prepare
from service.estimator.types import Attention, Framework, Layout, Method, Precision, Recompute, TrainingSpec
from validation.cases import H100, gpt, gpu_cluster

# Llama-3-8B-like: 32 layers, h 4096, 32 query heads sharing 8 K/V heads
GQA = dataclasses.replace(gpt(32, 4096, 32, 32000), num_kv_heads=8)


def _setup(
    cp: int,
    tokens_per_rank: int = 8192,
    inter_node_bytes_per_s: float = 50e9,
    gpus_per_node: int = 8,
    repeats_kv: bool = False,
) -> tuple[Job, Layout, step_time.StepBase]:
    training = TrainingSpec(
        seq_len=tokens_per_rank * cp,
        global_batch_size=8 // cp,
        attention=Attention.SDPA,
        precision=Precision.BF16,
    )
    cluster = gpu_cluster(H100, 8, inter_node_bytes_per_s)
    if gpus_per_node != 8:
        cluster = dataclasses.replace(cluster, gpus_per_node=gpus_per_node, num_nodes=8 // gpus_per_node)
    tuning = dataclasses.replace(default_tuning(), ring_attention_repeats_kv=repeats_kv)
    job = prepare(GQA, cluster, training, tuning)
    layout = Layout(
        dp=8 // cp,
        cp=cp,
        framework=Framework.FSDP,
        zero_stage=3,
        micro_batch_size=1,
        recompute=Recompute.FULL,
    )
    return job, layout, step_time.step_base(job, layout)


def test_kv_bytes_are_the_shared_kv_heads() -> None:
    # torchtitan since v0.2.2 passes SDPA the 8 shared K/V heads (enable_gqa): 8 x 128 wide each, bf16;
    # before it, repeat_kv gave every one of the 32 query heads its copy (the Dec-2024 benchmarks' runs)
    job, layout, base = _setup(cp=2)
    assert step_time.torch_ring_kv_bytes(job, layout, base) == 8192 * (1024 + 1024) * 2
    job, layout, base = _setup(cp=2, repeats_kv=True)
    assert step_time.torch_ring_kv_bytes(job, layout, base) == 8192 * (4096 + 4096) * 2


def test_merge_passes_by_hand() -> None:
    job, layout, base = _setup(cp=4)
    # per step and element: read + write the fp32 accumulator (8 B) and read the bf16 block (2 B);
    # forward: the output (4096 wide), twice (full recompute); backward: dq (4096 wide) and dk, dv at the
    # 8 shared K/V heads' width (2 x 1024: torch's accumulators are zeros_like(key / value) under
    # enable_gqa; counted 3 x 4096 wide, twice too much, before the long-context review)
    per_layer = 4 * 10 * 8192 * (2 * 4096 + 4096 + 2 * 1024)
    hbm = job.cluster.gpu.hbm_bandwidth_bytes_per_s
    assert step_time.torch_ring_merge_s(job, layout, base) == pytest.approx(32 * per_layer / hbm)
    # where K and V are repeated to every query head first (torchtitan up to v0.2.0), at that width
    job, layout, base = _setup(cp=4, repeats_kv=True)
    per_layer = 4 * 10 * 8192 * (2 * 4096 + 4096 + 2 * 4096)
    assert step_time.torch_ring_merge_s(job, layout, base) == pytest.approx(32 * per_layer / hbm)


def test_nvlink_hides_the_gather_and_shows_the_last_gradient_send() -> None:
    # one node: the all-gather of 2 ranks' K and V (2 x 8192 x 2048 x 2 B) at NVLink speed is shorter than the
    # first block's kernel, and so is each fp32 dK/dV send (8192 x 2048 x 4 B); only the one awaited after
    # the backward's loop shows
    job, layout, base = _setup(cp=2)
    link = base.links.cp
    assert not link.spans_nodes
    dkv_s = comm.p2p_s(8192 * 2048 * 4, link.bandwidth_bytes_per_s, link.latency_s)
    assert step_time.torch_ring_comm_s(job, layout, base) == pytest.approx(32 * dkv_s)


def test_a_slow_link_exposes_the_gather_beyond_the_first_block() -> None:
    # one GPU per node at 5 GB/s: the gather (each rank receives the other rank's 134 MB of every query
    # head's K and V, as torchtitan before v0.2.2 moved them) outlasts the first block's forward and
    # backward kernels; forward and recomputed forward wait, so does the backward
    job, layout, base = _setup(cp=2, inter_node_bytes_per_s=5e9, gpus_per_node=1, repeats_kv=True)
    link = base.links.cp
    kv = 8192 * (4096 + 4096) * 2  # K and V, bf16
    gather_s = comm.group_all_gather_s(2 * kv, link)
    dkv_s = comm.p2p_s(2 * kv, link.bandwidth_bytes_per_s, link.latency_s)
    step = step_time.layer_core_work_flops(layout, base) / 2
    forward_s = gather_s - step_time.core_s_per_token(base, step, 0.0)
    backward_s = gather_s - step_time.core_s_per_token(base, 0.0, 2 * step)
    assert forward_s > 0 and backward_s > 0 and dkv_s > step_time.core_s_per_token(base, 0.0, 2 * step)
    expected = 32 * (2 * forward_s + backward_s + 2 * dkv_s - step_time.core_s_per_token(base, 0.0, 2 * step))
    assert step_time.torch_ring_comm_s(job, layout, base) == pytest.approx(expected)


def test_cost_grows_with_cp_at_constant_tokens_per_rank() -> None:
    for link in (50e9, 5e9):
        costs = []
        for cp in (1, 2, 4, 8):
            job, layout, base = _setup(cp=cp, inter_node_bytes_per_s=link, gpus_per_node=1)
            costs.append(step_time.cp_comm_s(job, layout, base))
        assert costs[0] == 0.0
        assert costs == sorted(costs) and costs[-1] > costs[1]


def test_megatron_keeps_its_peer_to_peer_ring() -> None:
    # 4 CP ranks one per node on a 1 GB/s network: the ring's sends show past attention; the value is
    # the one the estimator gave before PyTorch's ring was modelled (07d4bb0^1), to the float
    # (without recompute: the old value counted no recomputed forward's ring)
    job, layout, _ = _setup(cp=4, inter_node_bytes_per_s=1e9, gpus_per_node=1)
    megatron = dataclasses.replace(layout, framework=Framework.MEGATRON, recompute=Recompute.NONE)
    megatron_base = step_time.step_base(job, megatron)
    assert step_time.cp_comm_s(job, megatron, megatron_base) == pytest.approx(10.220542691734908, rel=1e-12)


def test_megatron_recomputed_core_runs_its_ring_again() -> None:
    """A review's case: Megatron's cp_comm_s was the same under no, selective and full recompute,
    though a recomputed core runs Transformer Engine's CP forward again, its (cp - 1) sends of K and V
    with it, under its own kernels. By hand from the parts: per layer and micro-batch, forwards x
    (cp - 1) forward sends + 2 (cp - 1) in the backward, less the core compute of those passes."""
    job, layout, _ = _setup(cp=4, inter_node_bytes_per_s=1e9, gpus_per_node=1)
    none = dataclasses.replace(layout, framework=Framework.MEGATRON, recompute=Recompute.NONE)
    full = dataclasses.replace(none, recompute=Recompute.FULL)
    base = step_time.step_base(job, full)
    chunk = 2 * base.tokens * 1024 * 2  # K and V of 8 shared heads x 128, bf16
    link = base.links.cp
    send = comm.p2p_s(chunk, link.bandwidth_bytes_per_s, link.latency_s)
    core = step_time.layer_core_work_flops(full, base)
    per_layer = 4 * 3 * send - step_time.core_s_per_token(base, 2 * core, 2 * core)
    expected = base.micro_batches * base.layers * per_layer
    assert step_time.cp_comm_s(job, full, base) == pytest.approx(expected, rel=1e-12)
    assert step_time.cp_comm_s(job, full, base) > step_time.cp_comm_s(
        job, none, step_time.step_base(job, none)
    )


@pytest.mark.parametrize("preset", ["qwen3-235b-a22b", "llama-3-8b"])
def test_a_slower_gemm_never_shortens_the_step(preset: str) -> None:
    """The invariant sweep's case: Qwen3-235B QLoRA on 8 L40S, FSDP dp 4 x cp 2. A copy of the card
    without its die (the lowest fitted GEMM fraction) estimated 1.3% faster: its longer attention hid
    more of the ring's K/V gather and, counted a second time, more of the FSDP gathers, and its routed
    experts widened the FSDP windows at the dense GEMM rate. Each kernel second now hides one
    transfer, timed as the step times it."""
    model = preset_model(preset).spec
    l40s = gpu("l40s-48gb")
    layout = Layout(
        framework=Framework.FSDP, dp=4, cp=2, zero_stage=3, micro_batch_size=1, recompute=Recompute.FULL
    )
    steps = []
    for card in (l40s, dataclasses.replace(l40s, chip="", name="l40s-without-chip")):
        # attention targets: QLoRA's FSDP1 with adapters on the fused experts is refused (peft#3080)
        qlora = TrainingSpec(
            seq_len=8192,
            global_batch_size=32,
            method=Method.QLORA,
            lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
        )
        training = for_gpu(qlora, card, model)
        found = estimate(model, gpu_cluster(card, 8, 50e9), layout, training, tuning=default_tuning()).time
        assert found is not None
        steps.append(found.step_s)
    assert steps[1] >= steps[0]


def test_the_gathered_kv_and_fp32_gradients_are_in_the_buffers_by_hand() -> None:
    """The 'allgather' rotate method keeps the whole sequence's K and V (the 8 shared heads: torchtitan
    passes them with enable_gqa) for the attention call, and the backward adds fp32 dq, dk, dv and the
    dk, dv in flight: at 1M tokens over cp 32 the gathered K and V alone are 4 GiB on every rank,
    whatever cp is; 16 GiB where every query head had its copy (torchtitan before v0.2.2)."""
    from service.estimator import activations

    training = TrainingSpec(seq_len=1_048_576, global_batch_size=1, precision=Precision.BF16)
    layout = Layout(dp=1, cp=32, framework=Framework.FSDP, zero_stage=3, recompute=Recompute.FULL)
    for width, repeats in ((1024 + 1024, False), (4096 + 4096, True)):
        local = 32_768 * width * 2  # one rank's K and V, bf16
        gathered = 32 * local
        assert gathered == (16 if repeats else 4) * 2**30
        fp32 = 4 * 32_768 * 4096 + 2 * local * 2  # dq, then dk, dv and the pair in flight, fp32
        assert activations.torch_ring_buffer_bytes(GQA, layout, training, repeats) == gathered + fp32
    local = 32_768 * (1024 + 1024) * 2
    fp32 = 4 * 32_768 * 4096 + 2 * local * 2
    # at the same tokens per rank the gather grows with cp; Megatron's and DeepSpeed's rings hold none
    half = dataclasses.replace(training, seq_len=524_288)
    assert (
        activations.torch_ring_buffer_bytes(GQA, dataclasses.replace(layout, cp=16), half)
        == 16 * local + fp32
    )
    for framework in (Framework.MEGATRON, Framework.DEEPSPEED):
        other = dataclasses.replace(layout, framework=framework, zero_stage=1)
        assert activations.torch_ring_buffer_bytes(GQA, other, training) == 0.0
    assert activations.torch_ring_buffer_bytes(GQA, dataclasses.replace(layout, cp=1), training) == 0.0


def test_llama_8b_at_1m_tokens_over_cp_32_no_longer_fits_an_h100() -> None:
    # a review's case: estimated to fit with 7 GiB to spare before the gathered K and V (4 GiB of the 8
    # shared heads) were counted; the buffers now hold them to the byte
    spec = preset_model("llama-3.1-8b").spec
    cluster = dataclasses.replace(gpu_cluster(H100, 32, 50e9), num_nodes=4)
    training = TrainingSpec(seq_len=1_048_576, global_batch_size=1, precision=Precision.BF16)
    layout = Layout(dp=1, cp=32, framework=Framework.FSDP, zero_stage=3, recompute=Recompute.FULL)
    from service.estimator import activations

    ring = activations.torch_ring_buffer_bytes(spec, layout, training)
    with_ring = estimate(spec, cluster, layout, training, tuning=default_tuning())
    assert not memory_fits(with_ring.memory, cluster)
    assert ring > 4 * 2**30
    # without them (the buffers less the ring's) it fitted
    assert (
        with_ring.memory.per_gpu.total - ring * (1 + default_tuning().memory.fragmentation_fraction)
        < H100.memory_bytes
    )
