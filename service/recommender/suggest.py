"""What would make an infeasible job fit, with numbers.

In order: more GPUs of this type (the fewest whole nodes that fit), other catalog GPUs (the fewest
of each, same node shape and network), offload (with the host RAM per node it needs, against the
node's), and parameter-efficient fine-tuning (LoRA, QLoRA: Hu et al. arXiv:2106.09685, Dettmers
et al. arXiv:2305.14314) on the GPUs given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from service.estimator.tuning import Tuning
from service.estimator.types import (
    ClusterSpec,
    Compile,
    Framework,
    GPUSpec,
    Layout,
    Method,
    ModelSpec,
    TrainingSpec,
)
from service.recommender.types import Candidate, Constraints, Objective, Suggestion

GiB = 2**30
MAX_NODE_FACTOR = 64  # look for up to 64x the nodes given before giving up
# Layout evaluations per suggestion search (about a second of work): each suggestion is one more
# search, so together they stay within a few times the main search's budget.
SUGGESTION_EVALUATIONS = 50_000


def node_ladder(cluster: ClusterSpec, start_nodes: int) -> tuple[int, ...]:
    """GPU counts from ``start_nodes`` nodes up: each node count to 16, then 3-smooth counts."""
    gpn = cluster.gpus_per_node
    top = max(start_nodes, cluster.num_nodes) * MAX_NODE_FACTOR
    counts = [k for k in range(start_nodes, top + 1) if k <= 16 or _smooth(k)]
    return tuple(k * gpn for k in counts)


def _smooth(k: int) -> bool:
    while k % 2 == 0:
        k //= 2
    while k % 3 == 0:
        k //= 3
    return k == 1


def with_gpu(cluster: ClusterSpec, gpu: GPUSpec, num_nodes: int | None = None) -> ClusterSpec:
    """The same node shape and network with another GPU (its own NVLink/PCIe bandwidth)."""
    return dataclasses.replace(
        cluster,
        gpu=gpu,
        num_nodes=num_nodes or cluster.num_nodes,
        intra_node_bandwidth_bytes_per_s=gpu.intra_node_bandwidth_bytes_per_s,
    )


def fewest_gpus(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
    counts: Iterable[int],
    max_evaluations: int = SUGGESTION_EVALUATIONS,
) -> FewestGpus:
    """(GPUs, tokens/s, best layout) at the first count in ``counts`` where a layout fits, searched
    within ``max_evaluations`` layout evaluations."""
    from service.recommender import search

    fewest = dataclasses.replace(
        constraints,
        objective=Objective.FEWEST_GPUS,
        max_gpus=None,
        top_k=1,
        max_evaluations=max_evaluations,
    )
    counts = tuple(counts)
    big = dataclasses.replace(cluster, num_nodes=max(cluster.num_nodes, max(counts) // cluster.gpus_per_node))
    result = search(model, big, training, fewest, tuning, counts, stop_at_first_fit=True)
    ranked = result.ranked()
    found = None
    if ranked:
        best = ranked[0]
        found = (best.layout.world_size, best.time.tokens_per_s, best.layout)
    return FewestGpus(found=found, evaluations=result.evaluations, truncated=result.truncated)


@dataclass(frozen=True, slots=True)
class FewestGpus:
    found: tuple[int, float, Layout] | None  # GPUs, tokens/s, the best layout on them
    evaluations: int  # layout evaluations the search spent
    truncated: bool  # its budget ran out before it found a fit or finished the counts


def suggestions(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
    catalog: Iterable[GPUSpec] = (),
) -> tuple[Suggestion, ...]:
    """Every change that makes the job fit, each with the numbers that show it."""
    out: list[Suggestion] = []
    more = fewest_gpus(
        model, cluster, training, constraints, tuning, node_ladder(cluster, cluster.num_nodes + 1)
    ).found
    if more is not None:
        gpus, tps, layout = more
        out.append(
            Suggestion(
                kind="more_gpus",
                detail=f"{gpus} x {cluster.gpu.name} ({gpus // cluster.gpus_per_node} nodes of "
                f"{cluster.gpus_per_node}) fit: {tps:,.0f} tokens/s",
                gpu=cluster.gpu.name,
                num_gpus=gpus,
                num_nodes=gpus // cluster.gpus_per_node,
                tokens_per_s=tps,
                layout=layout,
            )
        )
    for gpu in _catalog(catalog):
        if gpu.name == cluster.gpu.name or gpu.memory_bytes <= cluster.gpu.memory_bytes:
            continue
        other = with_gpu(cluster, gpu, 1)
        found = fewest_gpus(model, other, training, constraints, tuning, node_ladder(other, 1)).found
        if found is not None:
            gpus, tps, layout = found
            out.append(
                Suggestion(
                    kind="other_gpu",
                    detail=f"{gpus} x {gpu.name} ({gpu.memory_bytes / GiB:.0f} GiB) fit: {tps:,.0f} tokens/s",
                    gpu=gpu.name,
                    num_gpus=gpus,
                    num_nodes=max(1, gpus // cluster.gpus_per_node),
                    tokens_per_s=tps,
                    layout=layout,
                )
            )
    out += _offload(model, cluster, training, constraints, tuning)
    out += _compile(model, cluster, training, constraints, tuning)
    out += _peft(model, cluster, training, constraints, tuning)
    return tuple(out)


def _catalog(catalog: Iterable[GPUSpec]) -> list[GPUSpec]:
    given = list(catalog)
    if given:
        return given
    from service.catalog.gpus import gpus

    return list(gpus().values())


UNLIMITED = 2**62  # bytes of host RAM and NVMe "as much as needed", to ask what offload would need


def _offload(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
) -> list[Suggestion]:
    from service.recommender import recommend

    # host RAM as needed: what would offload take, and does the node have it?
    unlimited = dataclasses.replace(
        cluster, cpu_memory_bytes_per_node=UNLIMITED, nvme_bytes_per_node=UNLIMITED
    )
    allowed = dataclasses.replace(
        constraints, allow_offload=True, top_k=1, max_evaluations=SUGGESTION_EVALUATIONS
    )
    found = recommend(model, unlimited, training, allowed, tuning, with_suggestions=False)
    if found.recommended is None:
        return []
    memory = found.recommended.estimate.memory
    have = cluster.cpu_memory_bytes_per_node
    verdict = (
        "unknown host RAM"
        if not have
        else (
            "the node has it"
            if memory.cpu_per_node_bytes <= have
            else (f"the node has only {have / GiB:.0f} GiB")
        )
    )
    return [
        Suggestion(
            kind="offload",
            detail=f"offload with {memory.cpu_per_node_bytes / GiB:.0f} GiB host RAM per node ({verdict}): "
            f"{memory.per_gpu.total / GiB:.1f} GiB per GPU",
            gpu=cluster.gpu.name,
            num_gpus=cluster.world_size,
            per_gpu_bytes=memory.per_gpu.total,
            cpu_per_node_bytes=memory.cpu_per_node_bytes,
            tokens_per_s=found.recommended.estimate.time.tokens_per_s
            if found.recommended.estimate.time
            else None,
            layout=found.recommended.layout,
        )
    ]


def _compile(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
) -> list[Suggestion]:
    """FSDP compiled with torch.compile, model and loss (no fp32 logits, fused norms), on the GPUs
    given, where the request did not ask for it."""
    from service.recommender import recommend

    if constraints.torch_compile or Framework.FSDP not in constraints.frameworks:
        return []
    compiled = dataclasses.replace(
        constraints,
        torch_compile=True,
        frameworks=(Framework.FSDP,),
        top_k=1,
        max_evaluations=SUGGESTION_EVALUATIONS,
    )
    found = recommend(model, cluster, training, compiled, tuning, with_suggestions=False).recommended
    if found is None or found.layout.torch_compile is Compile.NONE:
        return []
    what = "torch.compile of the FSDP model and loss (constraints.torch_compile)"
    return [_on_the_gpus_given("torch_compile", what, cluster, found)]


def _peft(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    tuning: Tuning,
) -> list[Suggestion]:
    from service.recommender import recommend

    if training.method is not Method.FULL:
        return []
    out = []
    for method in (Method.LORA, Method.QLORA):
        peft = dataclasses.replace(training, method=method)
        quick = dataclasses.replace(
            constraints,
            top_k=1,
            max_evaluations=SUGGESTION_EVALUATIONS,
            torch_compile=constraints.torch_compile and method is not Method.QLORA,
        )
        found = recommend(model, cluster, peft, quick, tuning, with_suggestions=False).recommended
        if found is not None:
            what = f"{method.value} (rank {peft.lora_rank})"
            out.append(_on_the_gpus_given(method.value, what, cluster, found))
    return out


def _on_the_gpus_given(kind: str, what: str, cluster: ClusterSpec, found: Candidate) -> Suggestion:
    """A change that fits on the cluster as given, with its plan's memory and tokens/s."""
    est = found.estimate
    return Suggestion(
        kind=kind,
        detail=f"{what} fits on the {cluster.world_size} GPUs given: "
        f"{est.memory.per_gpu.total / GiB:.1f} GiB per GPU",
        gpu=cluster.gpu.name,
        num_gpus=cluster.world_size,
        per_gpu_bytes=est.memory.per_gpu.total,
        tokens_per_s=est.time.tokens_per_s if est.time else None,
        layout=found.layout,
    )
