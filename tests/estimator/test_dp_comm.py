"""Data-parallel communication as the frameworks run it (``service.estimator.dp_comm``): NCCL's ring
latency by hand, the frameworks' buckets and units counted, ZeRO-3/FSDP per layer at scale,
pipelining's once-per-step collectives, hybrid sharding, and the order ZeRO-2 <= ZeRO-3."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator import comm, dp_comm
from service.estimator.params import LayerKind
from service.estimator.step_time import step_base, step_parts
from service.estimator.tuning import Tuning
from service.estimator.types import (
    ClusterSpec,
    Framework,
    Layout,
    Method,
    Plan,
    Precision,
    Recompute,
    TrainingSpec,
)
from service.launchers import accelerate, torchtitan
from tests.estimator.helpers import job, memory, states, time
from tests.estimator.test_step_time import PROPERTY_MODEL
from validation.cases import A100, gpu_cluster

DENSE = LayerKind(moe=False)  # a dense decoder layer with full attention

H100 = gpu("h100-sxm-80gb")
LLAMA_8B = preset("llama-3.1-8b").spec


def h100s(gpus: int) -> ClusterSpec:
    return gpu_cluster(H100, gpus, 50e9)  # 8 x 400 Gb/s per node


def link(size: int, per_node: int) -> comm.Link:
    return comm.Link(
        group_size=size,
        ranks_per_node=per_node,
        nodes=math.ceil(size / per_node),
        intra_bandwidth_bytes_per_s=100e9,
        inter_bandwidth_bytes_per_s=10e9,
        intra_latency_s=2e-6,
        inter_latency_s=5e-6,
        base_latency_s=10e-6,
    )


def test_ring_latency_by_hand() -> None:
    # NCCL tuning.cc: base + (n - N) steps inside nodes + (N - 1) between them; 16 ranks on 2 nodes
    assert comm.ring_latency_s(link(16, 8)) == pytest.approx(10e-6 + 14 * 2e-6 + 1 * 5e-6)
    # 1,024 ranks on 128 nodes: 10 + 896 x 2 + 127 x 5 us = 2.437 ms before a byte moves
    assert comm.ring_latency_s(link(1024, 8)) == pytest.approx(2.437e-3)
    # reduce-scatter of 1 GB over 16 ranks on 2 nodes: 7/8 of it over NVLink, 1/2 of a 1/8 over IB
    expected = 10e-6 + 14 * 2e-6 + 5e-6 + 7 / 8 * 1e9 / 100e9 + 1 / 2 * (1e9 / 8) / 10e9
    assert comm.group_reduce_scatter_s(1e9, link(16, 8)) == pytest.approx(expected)
    # a collective of nothing costs its latency: what the bucket count multiplies
    assert comm.group_all_gather_s(0.0, link(16, 8)) == pytest.approx(comm.ring_latency_s(link(16, 8)))


def test_buckets_multiply_the_latency_not_the_traffic() -> None:
    one = comm.group_reduce_scatter_s(1e9, link(64, 8))
    ten = dp_comm.bucketed_s(comm.group_reduce_scatter_s, 1e9, link(64, 8), 10)
    assert ten - one == pytest.approx(9 * comm.ring_latency_s(link(64, 8)))


def test_each_framework_buckets_its_reduction() -> None:
    cl = gpu_cluster(A100, 64, 25e9)
    training = TrainingSpec(seq_len=2048, global_batch_size=256)
    j = job(PROPERTY_MODEL, cl, training)
    h = PROPERTY_MODEL.hidden_size
    megatron = Layout(framework=Framework.MEGATRON, dp=64, zero_stage=1, overlap_grad_reduce=True)
    # Megatron-Core: max(40M, 1M x dp-cp) parameters; one bucket without --overlap-grad-reduce
    assert dp_comm.replicated_bucket_elements(j, megatron) == 64_000_000
    no_overlap = dataclasses.replace(megatron, overlap_grad_reduce=False)
    assert dp_comm.replicated_bucket_elements(j, no_overlap) == math.inf
    # DeepSpeed through HF: reduce_bucket_size = h^2 (clamped to [1e7, 5e8]); stage 0: 5e8 chunks
    ds = Layout(framework=Framework.DEEPSPEED, dp=64, zero_stage=2)
    assert dp_comm.replicated_bucket_elements(j, ds) == max(10_000_000, h * h)
    ds0 = dataclasses.replace(ds, zero_stage=0)
    assert dp_comm.replicated_bucket_elements(j, ds0) == 500_000_000
    # DDP: bucket_cap_mb 25 MiB of the fp32 gradients of autocast's fp32 parameters
    ddp = Layout(framework=Framework.FSDP, dp=64, zero_stage=0)
    assert dp_comm.replicated_bucket_elements(j, ddp) == 25 * 2**20 / 4
    # ... and the reduction pays one latency per bucket; DeepSpeed all-reduces each bucket and keeps
    # its slice (stage_1_and_2 allreduce_and_scatter), where Megatron reduce-scatters
    base = step_base(j, ds)
    calls = math.ceil(base.parameters / max(10_000_000, h * h))
    one = comm.group_all_reduce_s(base.parameters * 2, base.links.dp)
    latency = comm.group_all_reduce_s(0.0, base.links.dp)
    reduce_s = dp_comm.dp_grad_reduce_s(j, ds, base.parameters, base.links.dp)
    assert reduce_s == pytest.approx(one + (calls - 1) * latency)


def test_deepspeed_gathers_module_by_module_fsdp_layer_by_layer() -> None:
    j = job(LLAMA_8B, h100s(64), TrainingSpec(seq_len=8192, global_batch_size=128))
    fsdp = Layout(framework=Framework.FSDP, dp=64, zero_stage=3)
    ds = dataclasses.replace(fsdp, framework=Framework.DEEPSPEED)
    # Llama: q, k, v, o, gate, up, down; each at least the 0.9 h^2 prefetch bucket but k and v
    assert dp_comm.layer_modules(LLAMA_8B, DENSE) == 7
    assert dp_comm.unit_gather_calls(j, ds, DENSE, 218_112_000) == 7
    assert dp_comm.unit_gather_calls(j, fsdp, DENSE, 218_112_000) == 1
    fsdp_unit = dp_comm.unit_collectives(j, fsdp, DENSE)
    ds_unit = dp_comm.unit_collectives(j, ds, DENSE)
    latency = comm.ring_latency_s(dp_comm.shard_links(j, fsdp).dense)
    assert ds_unit.gather_s - fsdp_unit.gather_s == pytest.approx(6 * latency)


def _fsdp_8b(gpus: int) -> float:
    # torchtitan's Llama-3.1-8B benchmark shape: local batch 2, seq 8192, FSDP over every GPU
    training = TrainingSpec(seq_len=8192, global_batch_size=2 * gpus)
    layout = Layout(framework=Framework.FSDP, dp=gpus, zero_stage=3, micro_batch_size=2)
    return time(LLAMA_8B, h100s(gpus), layout, training).breakdown.dp_comm_exposed_s


def test_fsdp_exposed_communication_grows_with_the_ring() -> None:
    exposed = [_fsdp_8b(n) for n in (8, 64, 512, 4096)]
    assert exposed == sorted(exposed)
    # per layer and pass, 3 collectives of base + 3,584 x 1.9 + 511 x 4.0 us (~8.9 ms) at 4,096
    # ranks: latency alone is ~0.85 s per micro-batch, more than a fifth of it exposed
    assert exposed[-1] > 5 * exposed[0]


@pytest.mark.parametrize(
    ("cluster", "framework"),
    [
        (gpu_cluster(gpu("rtx-4090-24gb"), 8, 3e9), Framework.DEEPSPEED),
        (gpu_cluster(A100, 64, 25e9), Framework.DEEPSPEED),
        (gpu_cluster(A100, 64, 25e9), Framework.FSDP),
        (h100s(1024), Framework.FSDP),
    ],
)
@pytest.mark.parametrize("overlap", [False, True])
def test_zero3_is_never_cheaper_than_zero2_on_the_same_link(
    cluster: ClusterSpec, framework: Framework, overlap: bool
) -> None:
    # ZeRO-3 sends ZeRO-2's reduce-scatters and gathers the parameters besides: with the same overlap
    # its DP time is never the smaller
    training = TrainingSpec(seq_len=2048, global_batch_size=4 * cluster.world_size)
    exposed = {}
    for stage in (2, 3):
        layout = Layout(
            framework=framework,
            dp=cluster.world_size,
            zero_stage=stage,
            recompute=Recompute.FULL,
            overlap_grad_reduce=overlap,
        )
        exposed[stage] = time(PROPERTY_MODEL, cluster, layout, training).breakdown.dp_comm_exposed_s
    if framework is Framework.DEEPSPEED and not overlap:
        # DeepSpeed ZeRO-2 all-reduces each bucket (twice a reduce-scatter's traffic) and, without
        # overlap_comm, hides none of it, while ZeRO-3 still prefetches its gathers: either can be larger
        assert min(exposed.values()) > 0
        return
    assert exposed[3] >= exposed[2] > 0


@settings(max_examples=30, deadline=None)
@given(
    nodes=st.sampled_from([1, 2, 8, 32]),
    inter=st.floats(3e9, 1e11),
    micro_batches=st.sampled_from([1, 2, 8]),
)
def test_sharded_exposure_is_bounded_by_its_traffic(nodes: int, inter: float, micro_batches: int) -> None:
    # never more than every collective back to back, never less than the cap leaves exposed
    cl = gpu_cluster(A100, 8 * nodes, inter)
    n = cl.world_size
    training = TrainingSpec(seq_len=2048, global_batch_size=n * micro_batches)
    layout = Layout(framework=Framework.DEEPSPEED, dp=n, zero_stage=3)
    j = job(PROPERTY_MODEL, cl, training)
    unit = dp_comm.unit_collectives(j, layout, DENSE)
    layers = PROPERTY_MODEL.num_layers
    all_s = micro_batches * (layers * (2 * unit.gather_s + unit.reduce_s) + unit.gather_s + unit.reduce_s)
    exposed = dp_comm.dp_comm_exposed_s(j, layout, step_parts(j, layout))
    hidden = j.tuning.zero3_prefetch_hidden_fraction
    assert (1 - hidden) * micro_batches * layers * (2 * unit.gather_s + unit.reduce_s) <= exposed + 1e-12
    assert exposed <= all_s + 1e-12


def test_fsdp_under_pipelining_reduces_once_per_step_and_holds_the_stage() -> None:
    cl = h100s(64)
    model = LLAMA_8B
    exposed, gathered = {}, {}
    for stage in (2, 3):
        for m in (4, 16):
            training = TrainingSpec(seq_len=4096, global_batch_size=16 * m)
            layout = Layout(framework=Framework.FSDP, dp=16, pp=4, zero_stage=stage)
            j = job(model, cl, training)
            assert step_base(j, layout).micro_batches == m
            exposed[stage, m] = dp_comm.dp_comm_exposed_s(j, layout, step_parts(j, layout))
            gathered[stage, m] = memory(model, cl, layout, training).per_gpu.buffers
    # "never" (ZeRO-2) gathers once and reduces once whatever the micro-batches
    assert exposed[2, 16] == pytest.approx(exposed[2, 4])
    # "always" (ZeRO-3) gathers again in every backward
    assert exposed[3, 16] > exposed[3, 4] > exposed[2, 4]
    # both hold the stage's unsharded parameters and gradients: 8 of 32 layers, 16-bit, twice
    stage_bytes = 2 * 2 * 8 * 218_112_000
    assert gathered[2, 4] >= stage_bytes and gathered[3, 4] >= stage_bytes


def test_hybrid_shard_trades_gathers_across_nodes_for_an_all_reduce() -> None:
    cl = h100s(512)
    training = TrainingSpec(seq_len=8192, global_batch_size=1024)
    full = Layout(framework=Framework.FSDP, dp=512, zero_stage=3, micro_batch_size=2)
    hybrid = dataclasses.replace(full, fsdp_hybrid_shard=True)
    j = job(LLAMA_8B, cl, training)
    links = dp_comm.shard_links(j, hybrid)
    assert links.dense.group_size == 8 and not links.dense.spans_nodes
    assert links.replicas is not None and links.replicas.group_size == 64
    full_unit = dp_comm.unit_collectives(j, full, DENSE)
    hybrid_unit = dp_comm.unit_collectives(j, hybrid, DENSE)
    assert hybrid_unit.gather_s < full_unit.gather_s  # inside the node
    # the reduce-scatter inside the node + the 1/8 shard all-reduced across 64 nodes, both in fp32
    # (MixedPrecisionPolicy reduce_dtype float32)
    shard_bytes = 218_112_000 * 4 / 8
    inside = comm.group_reduce_scatter_s(218_112_000 * 4, links.dense)
    across = comm.group_all_reduce_s(shard_bytes, links.replicas)
    assert hybrid_unit.reduce_s == pytest.approx(inside + across, rel=1e-3)
    assert time(LLAMA_8B, cl, hybrid, training).step_s < time(LLAMA_8B, cl, full, training).step_s


def test_hybrid_shard_all_reduces_the_experts_shard_over_their_own_group() -> None:
    """HSDP with ep 8 on 32 GPUs (4 nodes of 8): the dense shard group is a node's 8 ranks, the routed
    experts' efsdp = 8 x 1 / 8 = 1, so each rank all-reduces its experts' whole gradient across the 4
    replicas, not an eighth of it (hybrid-sharding review: Qwen3-30B-A3B's step was 3.6x too fast)."""
    qwen = preset("qwen3-30b-a3b").spec
    cl = gpu_cluster(H100, 32, 12.5e9)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    hybrid = Layout(framework=Framework.FSDP, dp=32, ep=8, zero_stage=3, fsdp_hybrid_shard=True)
    j = job(qwen, cl, training)
    moe = LayerKind(moe=True)
    unit = dp_comm.unit_parameters(j, moe, 1, 8, 1)
    links = dp_comm.shard_links(j, hybrid)
    assert links.replicas is not None and links.replicas.group_size == 4
    assert dp_comm.shard_degrees(hybrid, cl) == (8, 1)
    g = 4  # fp32 gradients (MixedPrecisionPolicy reduce_dtype float32)
    across = comm.group_all_reduce_s((unit.dense / 8 + unit.experts) * g, links.replicas)
    inside = comm.group_reduce_scatter_s(unit.dense * g, links.dense) + comm.group_reduce_scatter_s(
        unit.experts * g, links.experts
    )
    assert dp_comm.unit_collectives(j, hybrid, moe).reduce_s == pytest.approx(inside + across, rel=1e-3)


def test_an_hsdp_replica_degree_sets_the_shard_group() -> None:
    """dp_replicate (torchtitan's data_parallel_replicate_degree): 32 replicas of 16-rank shard groups
    on 64 nodes of 8 gather across two nodes and hold half the default hybrid's shard (8 ranks, one
    node); 64 replicas said explicitly is the default hybrid shard, to the number."""
    cl = h100s(512)
    training = TrainingSpec(seq_len=8192, global_batch_size=1024)
    hybrid = Layout(
        framework=Framework.FSDP, dp=512, zero_stage=3, micro_batch_size=2, fsdp_hybrid_shard=True
    )
    two_nodes = dataclasses.replace(hybrid, dp_replicate=32)
    j = job(LLAMA_8B, cl, training)
    links = dp_comm.shard_links(j, two_nodes)
    assert links.dense.group_size == 16 and links.dense.spans_nodes
    assert links.replicas is not None and links.replicas.group_size == 32
    assert states(LLAMA_8B, cl, two_nodes, training).parameters == pytest.approx(
        states(LLAMA_8B, cl, hybrid, training).parameters / 2
    )
    explicit = dataclasses.replace(hybrid, dp_replicate=64)
    assert time(LLAMA_8B, cl, explicit, training) == time(LLAMA_8B, cl, hybrid, training)
    assert memory(LLAMA_8B, cl, explicit, training) == memory(LLAMA_8B, cl, hybrid, training)
    # the launchers render the same groups
    plan = Plan(model=LLAMA_8B, cluster=cl, training=training, layout=two_nodes)
    args = torchtitan.train_args(plan)
    assert args[args.index("--parallelism.data_parallel_replicate_degree") + 1] == "32"
    assert args[args.index("--parallelism.data_parallel_shard_degree") + 1] == "16"
    parallelism = accelerate.accelerate_config(plan)["parallelism_config"]
    assert parallelism["parallelism_config_dp_replicate_size"] == 32
    assert parallelism["parallelism_config_dp_shard_size"] == 16


def test_frozen_base_under_zero3_gathers_but_reduces_and_holds_no_gradients() -> None:
    cl = gpu_cluster(A100, 16, 25e9)
    full = TrainingSpec(seq_len=2048, global_batch_size=32)
    lora = dataclasses.replace(full, method=Method.LORA)
    for framework in (Framework.DEEPSPEED, Framework.FSDP):
        layout = Layout(framework=framework, dp=16, zero_stage=3)
        jl = job(PROPERTY_MODEL, cl, lora)
        assert dp_comm.unit_collectives(jl, layout, DENSE).reduce_s == 0.0
        assert dp_comm.unit_collectives(jl, layout, DENSE).gather_s > 0.0
        full_buffers = memory(PROPERTY_MODEL, cl, layout, full).per_gpu.buffers
        lora_buffers = memory(PROPERTY_MODEL, cl, layout, lora).per_gpu.buffers
        assert lora_buffers < full_buffers


# ---------------------------------------------------------------- PyTorch DDP's bucket copies


def _as_bucket_view(view: bool) -> Tuning:
    tuning = default_tuning()
    return dataclasses.replace(
        tuning, memory=dataclasses.replace(tuning.memory, ddp_gradient_as_bucket_view=view)
    )


DDP = Layout(framework=Framework.FSDP, dp=8, zero_stage=0, micro_batch_size=1)


def test_ddp_copies_every_gradient_into_its_bucket_and_back_by_hand() -> None:
    # reducer.cpp: mul_out(bucket_view, grad) as each gradient is ready, grad.copy_(bucket_view) after
    # the last all-reduce: each a read and a write of the gradient, 4 bytes moved per gradient byte,
    # on the compute stream, so the step grows by all of it
    cl = gpu_cluster(A100, 8, 25e9)
    training = TrainingSpec(seq_len=2048, global_batch_size=8, precision=Precision.BF16)
    copied = time(PROPERTY_MODEL, cl, DDP, training, tuning=_as_bucket_view(False))
    aliased = time(PROPERTY_MODEL, cl, DDP, training, tuning=_as_bucket_view(True))
    parameters = step_parts(job(PROPERTY_MODEL, cl, training), DDP).parameters
    # autocast keeps fp32 parameters, so DDP's gradients and buckets are fp32, 4 B
    by_hand = 2 * 2 * parameters * 4 / A100.hbm_bandwidth_bytes_per_s
    assert by_hand > 1e-3  # a 0.7B model on A100: ~7.2 ms
    assert copied.breakdown.step_s - aliased.breakdown.step_s == pytest.approx(by_hand)
    assert copied.breakdown.dp_comm_exposed_s - aliased.breakdown.dp_comm_exposed_s == pytest.approx(by_hand)


def test_ddp_bucket_copies_only_where_ddp_makes_them() -> None:
    cl = gpu_cluster(A100, 8, 25e9)
    training = TrainingSpec(seq_len=2048, global_batch_size=8, precision=Precision.BF16)
    j = job(PROPERTY_MODEL, cl, training)
    assert dp_comm.ddp_bucket_copy_s(j, DDP, 1e9) > 0.0
    # one replica: no DDP reduction; sharded FSDP and Megatron reduce without DDP's buckets
    for layout in (
        dataclasses.replace(DDP, dp=1),
        dataclasses.replace(DDP, zero_stage=3),
        dataclasses.replace(DDP, framework=Framework.MEGATRON, zero_stage=1),
        dataclasses.replace(DDP, framework=Framework.DEEPSPEED),
    ):
        assert dp_comm.ddp_bucket_copy_s(j, layout, 1e9) == 0.0, layout
    # adapters: only their gradients are reduced (dp_grad_reduce_s): no copy counted either
    lora = job(PROPERTY_MODEL, cl, dataclasses.replace(training, method=Method.LORA))
    assert dp_comm.ddp_bucket_copy_s(lora, DDP, 1e9) == 0.0
    # gradient_as_bucket_view: the gradients are the buckets
    aliased = job(PROPERTY_MODEL, cl, training, tuning=_as_bucket_view(True))
    assert dp_comm.ddp_bucket_copy_s(aliased, DDP, 1e9) == 0.0


@given(parameters=st.floats(min_value=1e6, max_value=1e11))
@settings(max_examples=25, deadline=None)
def test_ddp_bucket_copy_is_linear_in_parameters_and_in_gradient_bytes(parameters: float) -> None:
    cl = gpu_cluster(A100, 8, 25e9)

    def copy_s(precision: Precision, n: float) -> float:
        training = TrainingSpec(seq_len=2048, global_batch_size=8, precision=precision)
        return dp_comm.ddp_bucket_copy_s(job(PROPERTY_MODEL, cl, training), DDP, n)

    assert copy_s(Precision.BF16, 2 * parameters) == pytest.approx(2 * copy_s(Precision.BF16, parameters))
    # fp32 training and bf16 autocast (fp32 parameters) reduce (and so copy) 4-byte gradients: twice
    # the 2 of a bf16 model
    assert copy_s(Precision.FP32, parameters) == pytest.approx(copy_s(Precision.BF16, parameters))
    assert copy_s(Precision.FP32, parameters) == pytest.approx(2 * copy_s(Precision.BF16_PURE, parameters))


def test_one_unbounded_bucket_is_one_collective() -> None:
    """Megatron without overlap reduces every gradient in one bucket (its size unbounded): one
    collective, its latency once. ceil(P / inf) made it zero calls, and bucketed_s then took one
    latency off the collective (a network review: 89 us short on two nodes)."""
    cl = h100s(16)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    layout = Layout(framework=Framework.MEGATRON, dp=16, zero_stage=1, overlap_grad_reduce=False)
    j = job(LLAMA_8B, cl, training)
    link = dp_comm.group_links(j, layout).dp
    parameters = 8e9
    size = parameters * 2  # the recipes' bf16 gradient buffer
    assert dp_comm.replicated_bucket_calls(j, layout, parameters) == 1
    assert dp_comm.dp_grad_reduce_s(j, layout, parameters, link) == pytest.approx(
        comm.group_reduce_scatter_s(size, link)
    )


def test_pipeline_sends_cross_the_network_only_at_a_nodes_edge() -> None:
    """tp 4 x pp 4 on 2 nodes of 8: stages 0-1 on one node, 2-3 on the other. The busiest stage sends
    one boundary over the network and the other over NVLink each micro-batch (a network review: every
    send was charged at network speed); one stage per node sends both across."""
    training = TrainingSpec(seq_len=4096, global_batch_size=16)
    packed = Layout(framework=Framework.MEGATRON, tp=4, pp=4, zero_stage=1, sequence_parallel=True)
    j = job(LLAMA_8B, h100s(16), training)
    base = step_base(j, packed)
    link = base.links.pp
    assert link.spans_nodes and link.ranks_per_node == 2
    size = base.tokens * LLAMA_8B.hidden_size * 2 / 4
    across = comm.p2p_s(size, link.bandwidth_bytes_per_s, link.latency_s)
    inside = comm.p2p_s(size, link.intra_bandwidth_bytes_per_s, link.intra_latency_s)
    parts = step_parts(j, packed)
    assert parts.pp_comm_s == pytest.approx(base.micro_batches * (across + inside))
    assert inside < across


def test_deepspeeds_parameter_gather_is_one_collective_per_group() -> None:
    """ZeRO-1/2 gathers the updated 16-bit parameters with one all_gather_into_tensor per optimizer
    group (runtime/utils.py all_gather_dp_groups, wherever torch has it), not one per
    allgather_bucket_size: 479 calls' latency at dp 512 was a third of a Llama 3 8B step (hand-derivation
    review). Megatron's distributed optimizer gathers in its gradient buckets."""
    llama = preset("llama-3-8b").spec
    cluster = gpu_cluster(gpu("h100-sxm-80gb"), 512, 50e9)
    j = job(llama, cluster, TrainingSpec(seq_len=4096, global_batch_size=512))
    layout = Layout(framework=Framework.DEEPSPEED, dp=512, zero_stage=1, recompute=Recompute.FULL)
    link = dp_comm.group_links(j, layout).dp
    parameters = dp_comm.stage_gpu_parameter_groups(j, layout)[0][0]
    size = parameters * dp_comm.gathered_bytes_per_parameter(j, layout)
    assert dp_comm.dp_param_gather_s(j, layout, parameters, link) == comm.group_all_gather_s(size, link)
    megatron = dataclasses.replace(layout, framework=Framework.MEGATRON)
    assert dp_comm.dp_param_gather_s(j, megatron, parameters, link) > comm.group_all_gather_s(size, link)


@pytest.mark.parametrize(
    ("framework", "sp", "split"),
    [
        (Framework.MEGATRON, True, 4),  # the sequence-parallel shard
        (Framework.MEGATRON, False, 1),  # get_tensor_shapes: seq_length // tp only under SP
        (Framework.FSDP, False, 1),  # pipelining sends the stage output as it is (Replicate)
        (Framework.DEEPSPEED, False, 4),  # the pipe engine partitions it over the model-parallel group
    ],
)
def test_pipeline_sends_the_tensor_parallel_shard_only_where_it_is_split(
    framework: Framework, sp: bool, split: int
) -> None:
    """Megatron-Core's schedules send [s, b, h] // tp only where sequence parallelism splits it
    (schedules.py get_tensor_shapes); without SP the whole tensor: pp_comm_s was tp times too small
    (a pipeline review: Llama 2 7B at tp 8 pp 4 sent 1/8 of 33.5 MB). DeepSpeed's pipe engine
    partitions its sends over tp whenever tp > 1 (engine.py is_pipe_partitioned)."""
    training = TrainingSpec(seq_len=4096, global_batch_size=16)
    zero = 2 if framework is Framework.FSDP else 1
    layout = Layout(framework=framework, tp=4, pp=4, zero_stage=zero, sequence_parallel=sp)
    j = job(LLAMA_8B, h100s(16), training)
    base = step_base(j, layout)
    link = base.links.pp
    size = base.tokens * LLAMA_8B.hidden_size * 2 / split
    across = comm.p2p_s(size, link.bandwidth_bytes_per_s, link.latency_s)
    inside = comm.p2p_s(size, link.intra_bandwidth_bytes_per_s, link.intra_latency_s)
    assert step_parts(j, layout).pp_comm_s == pytest.approx(base.micro_batches * (across + inside))


def test_hsdp_holds_one_more_communicator_than_full_shard() -> None:
    """FSDP2's HSDP all-gathers and reduce-scatters on the shard group and all-reduces on the replicate
    group: NCCL's buffers of one more communicator (hybrid-sharding review: the same 0.25 GiB both)."""
    cl = h100s(32)
    training = TrainingSpec(seq_len=4096, global_batch_size=64)
    full = Layout(framework=Framework.FSDP, dp=32, zero_stage=3)
    hybrid = dataclasses.replace(full, fsdp_hybrid_shard=True)
    extra = (
        memory(LLAMA_8B, cl, hybrid, training).per_gpu.nccl_buffers
        - memory(LLAMA_8B, cl, full, training).per_gpu.nccl_buffers
    )
    assert extra == default_tuning().memory.nccl_bytes_per_group
