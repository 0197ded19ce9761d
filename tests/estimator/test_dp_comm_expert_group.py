"""Replicated data parallelism reduces an MoE model's routed experts over the expert-data-parallel
group, the dense parameters over the data-parallel one (DeepSpeed's MoE param groups,
stage_1_and_2.py _configure_moe_settings; Megatron-Core's expert buffers): every parameter over the
DP group timed a Mixtral on ep 8 over two nodes at half its exposed reduction (hand-derivation
review)."""

from __future__ import annotations

from service.catalog.gpus import gpu
from service.catalog.models import model as preset
from service.catalog.tuning import default_tuning
from service.estimator import dp_comm
from service.estimator.job import make_job
from service.estimator.model_states import shard_degrees
from service.estimator.step_time import group_links, stage_gpu_parameter_groups
from service.estimator.types import Framework, Layout, Recompute, TrainingSpec
from validation.cases import gpu_cluster


def test_experts_reduce_over_their_own_group_and_not_at_all_alone() -> None:
    mixtral = preset("mixtral-8x7b").spec
    cluster = gpu_cluster(gpu("h100-sxm-80gb"), 16, 50e9)
    job = make_job(mixtral, cluster, TrainingSpec(seq_len=4096, global_batch_size=64), default_tuning())
    for ep in (8, 16):
        layout = Layout(framework=Framework.DEEPSPEED, dp=16, ep=ep, zero_stage=2, recompute=Recompute.FULL)
        dense, experts = max(stage_gpu_parameter_groups(job, layout), key=sum)
        reduce_s, _ = dp_comm.replicated_collectives_s(job, layout)
        dp_link = group_links(job, layout).dp
        dense_s = dp_comm.dp_grad_reduce_s(job, layout, dense, dp_link)
        if ep == 16:  # each expert on one rank: nothing to reduce but the dense parameters
            assert shard_degrees(layout, cluster)[1] == 1 and reduce_s == dense_s
            continue
        expert_link = dp_comm.shard_links(job, layout).experts  # 2 ranks, one per node
        assert shard_degrees(layout, cluster)[1] == 2
        assert reduce_s == dense_s + dp_comm.dp_grad_reduce_s(job, layout, experts, expert_link)
        # the experts' two ranks cross the nodes' network: slower per byte than a reduction over dp 16
        # would have charged them
        assert reduce_s > dp_comm.dp_grad_reduce_s(job, layout, dense + experts, dp_link)
