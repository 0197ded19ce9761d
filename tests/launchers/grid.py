"""A grid of layouts over every framework, ZeRO stage, offload, TP/PP/CP split and 1/2/4 nodes."""

from __future__ import annotations

import itertools

from service.estimator.types import Compile, Framework, Offload, Plan, Precision
from service.recommender.space import recompute_order
from tests.launchers.factories import llama3_8b, plan, training

SPLITS = ((1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (1, 1, 2), (4, 2, 1))  # (tp, pp, cp)
OFFLOADS = (
    (Offload.NONE, Offload.NONE),
    (Offload.CPU, Offload.NONE),
    (Offload.CPU, Offload.CPU),
    (Offload.NVME, Offload.NVME),
)
PRECISIONS = (
    Precision.BF16,
    Precision.BF16,
    Precision.FP16,
    Precision.FP32,
    Precision.FP8,
    Precision.BF16_PURE,
)


def _overlap(framework: Framework, zero: int, pp: int) -> bool | None:
    if framework is Framework.MEGATRON:
        return True
    if framework is Framework.DEEPSPEED and zero > 0 and pp == 1:
        return True
    return None


def _overlaps_tp(framework: Framework, compiled: Compile) -> bool:
    # Megatron's --tp-comm-overlap; torchtitan's Async TP, an inductor pass
    return framework is Framework.MEGATRON or (framework is Framework.FSDP and compiled is not Compile.NONE)


def grid() -> list[tuple[str, Plan]]:
    plans: list[tuple[str, Plan]] = []
    combos = itertools.product((1, 2, 4), SPLITS, Framework, range(4), OFFLOADS)
    for i, (nodes, (tp, pp, cp), framework, zero, (off_opt, off_par)) in enumerate(combos):
        model = llama3_8b() if framework is Framework.FSDP and i % 2 == 0 else None
        compiled = tuple(Compile)[i % 5 % 3] if framework is Framework.FSDP else Compile.NONE
        p = plan(
            nodes=nodes,
            model=model,
            train=training(precision=PRECISIONS[i % len(PRECISIONS)]),
            framework=framework,
            tp=tp,
            pp=pp,
            cp=cp,
            # as the recommender sets them (space.make_layout): no SP in DeepSpeed AutoTP; Megatron's
            # overlaps (and torchtitan's Async TP where compiled) on every other plan; DeepSpeed
            # overlap_comm where its ZeRO optimizer overlaps.
            sequence_parallel=tp > 1 and framework is not Framework.DEEPSPEED,
            tp_comm_overlap=_overlaps_tp(framework, compiled) and tp > 1 and i % 2 == 0,
            overlap_grad_reduce=_overlap(framework, zero, pp) if i % 2 == 0 else None,
            zero_stage=zero,
            offload_optimizer=off_opt,
            offload_params=off_par,
            recompute=recompute_order(framework)[i % len(recompute_order(framework))],
            # Megatron's block method on every other full-recompute plan
            recompute_num_layers=1 if framework is Framework.MEGATRON and i % 6 == 5 else None,
            micro_batch_size=1 + (i % 2),
            virtual_pipeline_stages=2 if pp > 1 and i % 3 == 0 else 1,
            fsdp_hybrid_shard=framework is Framework.FSDP and nodes > 1 and i % 4 == 1,
            torch_compile=compiled,
        )
        name = f"n{nodes}-tp{tp}pp{pp}cp{cp}-{framework}-z{zero}-{off_opt}{off_par}-{i}"
        plans.append((name, p))
    return plans
