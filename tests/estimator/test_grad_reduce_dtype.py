"""The dtype each framework reduces gradients in (``model_states.grad_reduce_bytes``), by hand on a
tiny model, and the launchers that make the job run it.

* PyTorch DDP (fsdp at ZeRO-0) all-reduces the gradients of autocast's fp32 parameters: 4 B.
* FSDP reduce-scatters in MixedPrecisionPolicy's reduce_dtype, float32 (torchtitan's only value,
  Composer's DEFAULT; Accelerate and the HF Trainer are told to set it): 4 B.
* DeepSpeed reduces in communication_data_type, the 16-bit training dtype unless Ulysses switches it
  to seq_parallel_communication_data_type (fp32): 2 B, 4 B under cp > 1.
* Megatron reduces its grad buffer: fp32 with grad_reduce_in_fp32, else bf16 (test_megatron_recipes).
"""

from __future__ import annotations

import dataclasses

import pytest

from service.estimator import comm, dp_comm
from service.estimator.memory import stage_states
from service.estimator.model_states import FSDP_REDUCE_DTYPE, deepspeed_buckets, grad_reduce_bytes
from service.estimator.params import LayerKind
from service.estimator.step_time import step_base
from service.estimator.types import Framework, Layout, Method, Plan, Precision, TrainingSpec
from service.launchers import accelerate, hf_trainer, torchtitan
from tests.estimator.helpers import job
from tests.estimator.test_memory import TINY, cluster
from tests.launchers.factories import llama3_8b, plan, training

DENSE = LayerKind(moe=False)
TRAIN = TrainingSpec(seq_len=16, global_batch_size=8)  # bf16 mixed
TINY_LAYER = 656  # attention 256 + SwiGLU 384 + two norms 16
DDP = Layout(framework=Framework.FSDP, dp=8, zero_stage=0)
FSDP3 = Layout(framework=Framework.FSDP, dp=8, zero_stage=3)
ZERO3 = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=3)


def _at(precision: Precision) -> TrainingSpec:
    return dataclasses.replace(TRAIN, precision=precision)


@pytest.mark.parametrize(
    ("layout", "precision", "expected"),
    [
        (DDP, Precision.BF16, 4),  # autocast: fp32 parameters, fp32 grads in DDP's buckets
        (DDP, Precision.FP16, 4),
        (DDP, Precision.BF16_PURE, 2),  # a bf16 model: bf16 grads
        (DDP, Precision.FP32, 4),
        (FSDP3, Precision.BF16, 4),  # reduce_dtype float32
        (FSDP3, Precision.FP8, 4),
        (FSDP3, Precision.BF16_PURE, 4),  # torchtitan keeps reduce_dtype float32 under training.dtype bf16
        (dataclasses.replace(FSDP3, zero_stage=2), Precision.BF16, 4),
        (ZERO3, Precision.BF16, 2),  # communication_data_type: the bf16 training dtype
        (ZERO3, Precision.FP16, 2),
        (dataclasses.replace(ZERO3, zero_stage=1), Precision.BF16, 2),
        (dataclasses.replace(ZERO3, zero_stage=0), Precision.BF16, 2),
        (dataclasses.replace(ZERO3, dp=4, cp=2), Precision.BF16, 4),  # Ulysses: fp32
        (ZERO3, Precision.FP32, 4),
    ],
)
def test_each_path_reduces_in_its_dtype(layout: Layout, precision: Precision, expected: int) -> None:
    assert grad_reduce_bytes(precision, layout) == expected


def test_the_fsdp_reduce_dtype_is_torchtitans() -> None:
    assert FSDP_REDUCE_DTYPE == "float32"


def test_ddp_all_reduces_fp32_gradients_by_hand() -> None:
    # 1000 gradients in one 25 MiB bucket: one all-reduce of 4000 bytes
    j = job(TINY, cluster(8), TRAIN)
    link = step_base(j, DDP).links.dp
    assert dp_comm.dp_grad_reduce_s(j, DDP, 1000, link) == pytest.approx(comm.group_all_reduce_s(4000, link))


def test_fsdp_reduce_scatters_each_layer_in_fp32_by_hand() -> None:
    j = job(TINY, cluster(8), TRAIN)
    links = dp_comm.shard_links(j, FSDP3)
    unit = dp_comm.unit_collectives(j, FSDP3, DENSE)
    assert unit.reduce_s == pytest.approx(comm.group_reduce_scatter_s(TINY_LAYER * 4, links.dense))
    # the parameters are still gathered in bf16
    assert unit.gather_s == pytest.approx(comm.group_all_gather_s(TINY_LAYER * 2, links.dense))


def test_deepspeed_zero3_reduce_scatters_bf16_by_hand() -> None:
    j = job(TINY, cluster(8), TRAIN)
    links = dp_comm.shard_links(j, ZERO3)
    calls = TINY_LAYER / deepspeed_buckets(TINY, ZERO3).reduce_bucket_elements  # a bucket spans layers
    latency = comm.group_reduce_scatter_s(0.0, links.dense)
    by_hand = comm.group_reduce_scatter_s(TINY_LAYER * 2, links.dense) + (calls - 1) * latency
    assert dp_comm.unit_collectives(j, ZERO3, DENSE).reduce_s == pytest.approx(by_hand)


def test_ulysses_reduce_buckets_are_fp32() -> None:
    # ZeRO-2: one reduce_bucket_size buffer (h^2 = 64 clamped up to 1e7 elements) in the communication
    # dtype: bf16 without Ulysses, fp32 with it
    zero2 = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=2)
    ulysses = dataclasses.replace(zero2, dp=4, cp=2)
    assert deepspeed_buckets(TINY, zero2).reduce_buffer_elements == 10_000_000
    for layout, element_bytes in ((zero2, 2), (ulysses, 4)):
        (rank,) = stage_states(job(TINY, cluster(8), TRAIN), layout)
        assert rank.buffers == 10_000_000 * element_bytes


def test_ulysses_stage0_chunk_is_cast_to_fp32_beside_itself() -> None:
    # ZeRO-0: the flattened chunk (min(trainable, MEMORY_OPT_ALLREDUCE_SIZE) elements, 16-bit), and
    # under Ulysses its fp32 cast for the all-reduce as well (engine.py allreduce_bucket)
    zero0 = Layout(framework=Framework.DEEPSPEED, dp=8, zero_stage=0)
    ulysses = dataclasses.replace(zero0, dp=4, cp=2)
    j = job(TINY, cluster(8), TRAIN)
    chunk = min(j.counts.total, j.assume.ds_stage0_allreduce_elements)
    for layout, element_bytes in ((zero0, 2), (ulysses, 2 + 4)):
        (rank,) = stage_states(job(TINY, cluster(8), TRAIN), layout)
        assert rank.buffers == pytest.approx(chunk * element_bytes)


def test_fsdp_holds_a_layers_gradients_for_its_reduce_scatter_in_fp32() -> None:
    # FULL_SHARD on TINY (fsdp_prefetch_layers 1): this layer, the prefetched one and the output unit
    # (final norm 8 + lm_head 256) in bf16, and this layer's gradients copied into the reduce-scatter
    # input in float32 (foreach_reduce): (2 x 656 + 264) x 2 + 656 x 4 = 5776
    (rank,) = stage_states(job(TINY, cluster(8), TRAIN), FSDP3)
    assert rank.buffers == (2 * TINY_LAYER + 264) * 2 + TINY_LAYER * 4 == 5776


def test_fsdp_under_a_pipeline_accumulates_the_stages_gradients_in_fp32() -> None:
    # no reduce-scatter until the last micro-batch: the stage's bf16 parameters and its gradients,
    # upcast to the reduce dtype after each backward (FSDPParam.to_accumulated_grad_if_needed):
    # stage 0 holds the embedding 256 + one layer 656 = 912 parameters, stage 1 656 + 264 = 920
    pipelined = Layout(framework=Framework.FSDP, dp=4, pp=2, zero_stage=2)
    ranks = stage_states(job(TINY, cluster(8), TRAIN), pipelined)
    assert [rank.buffers for rank in ranks] == [912 * (2 + 4), 920 * (2 + 4)]


# ---------------------------------------------------------------- the launchers run it


def _fsdp_plan(zero_stage: int = 3, **train: object) -> Plan:
    return plan(
        model=llama3_8b(),
        train=training(**train),
        framework=Framework.FSDP,
        zero_stage=zero_stage,
    )


def test_torchtitan_says_the_reduce_dtype() -> None:
    args = torchtitan.train_args(_fsdp_plan())
    assert args[args.index("--training.mixed_precision_reduce") + 1] == "float32"


def test_accelerate_and_the_trainer_set_the_fp32_reduce() -> None:
    policy = "reduce_dtype=torch.float32"
    sharded = _fsdp_plan()
    assert policy in accelerate.duties(sharded)
    assert "accelerator.state.fsdp_plugin.mixed_precision_policy" in accelerate.duties(sharded)
    launch = {a.name: a.content for a in hf_trainer.render(sharded)}[hf_trainer.LAUNCH_NAME]
    assert "trainer.accelerator.state.fsdp_plugin.mixed_precision_policy" in launch and policy in launch
    # DDP reduces fp32 gradients anyway; adapters' reductions are not timed; fp32 has no policy
    assert policy not in accelerate.duties(_fsdp_plan(zero_stage=0))
    assert policy not in accelerate.duties(_fsdp_plan(method=Method.LORA))
    assert policy not in accelerate.duties(_fsdp_plan(precision=Precision.FP32))
