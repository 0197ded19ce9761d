"""Every plan runs as written, on a grid of 40 realistic jobs (one consumer card to 64 H100; full,
LoRA and QLoRA; NVIDIA and AMD): a feasible plan renders in a launcher of its own framework, an
adapter plan's files train adapters, no plan offloads to host RAM the cluster did not state, and
every claim of the rationale matches the layout (``test_rationale.check_claims``)."""

from __future__ import annotations

import dataclasses

import pytest

from service.catalog.models import model
from service.catalog.tuning import default_tuning
from service.estimator.types import ClusterSpec, Method, Offload, Plan, TrainingSpec
from service.frameworks import FRAMEWORKS
from service.launchers import RENDERERS, runnable_targets
from service.recommender import Constraints, recommend
from service.recommender.space import sub_cluster
from tests.recommender.helpers import cluster
from tests.recommender.test_rationale import check_claims


def training(seq: int, batch: int, method: Method = Method.FULL, **more: object) -> TrainingSpec:
    return TrainingSpec(seq_len=seq, global_batch_size=batch, method=method, **more)  # type: ignore[arg-type]


RTX4090 = cluster("rtx-4090-24gb", 1, per_node=1)
RTX4090_X8 = cluster("rtx-4090-24gb", 1)
A100_40 = cluster("a100-sxm-40gb", 1, per_node=1)
A100_NODE = cluster("a100-sxm-80gb", 1)
H100_ONE_HOST = cluster("h100-sxm-80gb", 1, per_node=1, host_gib=512)
H100_NODE = cluster("h100-sxm-80gb", 1)
H100_2 = cluster("h100-sxm-80gb", 2)
H100_4 = cluster("h100-sxm-80gb", 4)
H100_8 = cluster("h100-sxm-80gb", 8)
L40S_NODE = cluster("l40s-48gb", 1)
MI300X_NODE = cluster("mi300x-192gb", 1)

LORA, QLORA = Method.LORA, Method.QLORA
JOBS = [
    ("gpt2", A100_40, training(1024, 32)),
    ("gpt2", RTX4090, training(1024, 16)),
    ("llama-3-8b", RTX4090, training(2048, 16, QLORA)),
    ("llama-3-8b", RTX4090, training(2048, 16, LORA)),
    ("llama-3.1-8b", RTX4090_X8, training(2048, 64, LORA)),
    ("llama-3.1-8b", H100_ONE_HOST, training(2048, 8)),
    ("llama-3.1-8b", H100_NODE, training(8192, 128)),
    ("llama-3.1-8b", H100_NODE, training(8192, 64, LORA)),
    ("llama-3.1-8b", H100_2, training(8192, 256)),
    ("llama-3.1-8b", A100_NODE, training(4096, 256)),
    ("llama-2-7b", A100_NODE, training(4096, 64)),
    ("llama-2-7b", A100_40, training(2048, 16, QLORA)),
    ("llama-2-13b", A100_NODE, training(4096, 128)),
    ("llama-2-70b", H100_4, training(4096, 256)),
    ("llama-2-70b", A100_NODE, training(2048, 32, QLORA)),
    ("llama-3.1-70b", H100_4, training(8192, 256)),
    ("llama-3.1-70b", H100_8, training(8192, 512)),
    ("llama-3.1-70b", H100_NODE, training(4096, 64, LORA)),
    ("mistral-7b", L40S_NODE, training(4096, 64)),
    ("mistral-7b", L40S_NODE, training(4096, 64, LORA)),
    ("mixtral-8x7b", H100_2, training(4096, 128)),
    ("mixtral-8x7b", H100_NODE, training(4096, 64, QLORA)),
    ("qwen2.5-7b", H100_NODE, training(4096, 64)),
    ("qwen2.5-72b", H100_4, training(4096, 256)),
    ("qwen3-8b", H100_NODE, training(4096, 128)),
    ("qwen3-8b", A100_NODE, training(4096, 32, LORA)),
    ("qwen3-14b", H100_2, training(8192, 128)),
    ("qwen3-32b", H100_4, training(4096, 256)),
    ("qwen3-30b-a3b", H100_2, training(4096, 256)),
    ("gemma-2-9b", H100_NODE, training(8192, 64)),
    ("gemma-3-12b", H100_NODE, training(4096, 64)),
    ("phi-3-mini", A100_NODE, training(4096, 128)),
    ("phi-4", H100_2, training(4096, 128)),
    ("olmo-2-7b", H100_NODE, training(4096, 128)),
    ("granite-3.3-8b", H100_NODE, training(4096, 64, LORA)),
    ("deepseek-v2-lite", H100_NODE, training(4096, 64)),
    ("gpt-oss-20b", H100_NODE, training(4096, 64)),
    ("llama-3.1-8b", MI300X_NODE, training(8192, 128)),
    ("llama-3.1-70b", MI300X_NODE, training(4096, 64)),
    ("mistral-nemo-12b", H100_NODE, training(8192, 64)),
]
assert len(JOBS) >= 40


@pytest.mark.parametrize(
    ("name", "c", "job"), JOBS, ids=[f"{n}-{c.gpu.name}x{c.world_size}-{t.method.value}" for n, c, t in JOBS]
)
def test_every_feasible_plan_runs_as_written(name: str, c: ClusterSpec, job: TrainingSpec) -> None:
    spec = model(name).spec
    found = recommend(spec, c, job, Constraints(top_k=2), default_tuning())
    if found.recommended is None:
        return  # infeasible plans carry suggestions (tests/recommender/test_recommend.py)
    layout = found.recommended.layout
    plan = Plan(model=spec, cluster=sub_cluster(c, layout.world_size), training=job, layout=layout)
    runs, reasons = runnable_targets(plan)
    assert runs and set(runs) <= set(FRAMEWORKS[layout.framework].targets), reasons
    if job.method is not Method.FULL:  # every target that runs it trains adapters
        for target in runs:
            names = {artifact.name for artifact in RENDERERS[target](plan)}
            assert "lora_config.json" in names, target
            assert ("bnb_config.json" in names) == (job.method is Method.QLORA), target
    if not c.cpu_memory_bytes_per_node:  # no offload to host RAM nobody stated
        assert layout.offload_optimizer is Offload.NONE and layout.offload_params is Offload.NONE
        assert found.recommended.estimate.memory.cpu_per_node_bytes == 0
    check_claims(found.recommended, c)
    for alternative in found.alternatives:
        other = dataclasses.replace(
            plan, cluster=sub_cluster(c, alternative.layout.world_size), layout=alternative.layout
        )
        assert runnable_targets(other)[0], alternative.layout
