"""Upper bounds from physics and published practice, checked before any search.

Types bound an input to what fits in a field; these bound a job to what training has done, with
room to spare. Each limit is a multiple of the largest published figure, named beside it, so a
request past it is not a plan anyone can run but a typo or a probe, and is refused with a 422
that names the field, the limit and the reference, before it can buy minutes of search.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.estimator.errors import EstimatorError, InvalidHardware, InvalidModel, InvalidTraining
from service.estimator.types import ClusterSpec, ModelSpec, TrainingSpec


@dataclass(frozen=True, slots=True)
class ScaleLimit:
    field: str  # as the request body names it
    limit: int
    reference: str  # the largest published figure the limit is a multiple of
    quantity: str = ""  # what is bounded where the field is one factor of it


# 8 x the deepest published dense LLMs: Megatron-Turing NLG 530B has 105 layers (arXiv:2201.11990),
# Llama 3.1 405B 126 (arXiv:2407.21783 Table 3), PaLM 540B 118 (arXiv:2204.02311 Table 1).
MAX_LAYERS = ScaleLimit("model.num_layers", 1_024, "Llama 3.1 405B: 126 layers")
# 2 x the most experts per layer published: Switch-C, 2,048 experts (arXiv:2101.03961 Table 9).
MAX_EXPERTS = ScaleLimit("model.moe.num_experts", 4_096, "Switch-C: 2,048 experts")
# 4 x the longest sequences published as trained: 1M tokens (Large World Model, arXiv:2402.08268 §3;
# Llama 4 Scout's 10M context is reached at inference, not in training).
MAX_SEQ_LEN = ScaleLimit("training.seq_len", 4_194_304, "Large World Model: 1,048,576-token sequences")
# 16 x the largest published tokens per step: DeepSeek-V3, 15,360 sequences of 4,096 tokens = 63M
# (arXiv:2412.19437 §4.2); Llama 3 405B, 16M (arXiv:2407.21783 §3.4.1).
MAX_TOKENS_PER_STEP = ScaleLimit(
    "training.global_batch_size",
    1_073_741_824,
    "DeepSeek-V3: 63M tokens per step",
    "tokens per step (seq_len x global_batch_size)",
)
# 16 x the largest published training run: Llama 3 405B on 16,384 H100 (arXiv:2407.21783 Table 4).
MAX_GPUS = ScaleLimit(
    "cluster.num_nodes", 262_144, "Llama 3 405B: 16,384 GPUs", "GPUs (num_nodes x gpus_per_node)"
)

SCALE_LIMITS = (MAX_LAYERS, MAX_EXPERTS, MAX_SEQ_LEN, MAX_TOKENS_PER_STEP, MAX_GPUS)

# The most memory a request may state: a GPU's or a node's host RAM (16 TiB; more is a typo: the largest
# servers hold 12-16 TiB), a node's NVMe (1 PiB). What offload is suggested with stays within them,
# so the suggestion can be sent back (a 50.7 TiB one was a 422; bounded-work review).
MAX_MEMORY_BYTES = 2**44
MAX_NVME_BYTES = 2**50


def scale_violation(
    model: ModelSpec, cluster: ClusterSpec | None, training: TrainingSpec
) -> EstimatorError | None:
    """The first input past its limit, as a domain error naming the field, the value and the
    reference; None when the job is within every limit. ``cluster`` None: not placed yet."""
    # (bound, the bounded quantity, the factor the named field multiplies, the error): the field's own
    # limit is the bound over the other factors (a batch's at this seq_len, nodes at these per node)
    checks: list[tuple[ScaleLimit, int, int, type[EstimatorError]]] = [
        (MAX_LAYERS, model.num_layers, 1, InvalidModel),
        (MAX_EXPERTS, model.moe.num_experts if model.moe else 0, 1, InvalidModel),
        (MAX_SEQ_LEN, training.seq_len, 1, InvalidTraining),
        (MAX_TOKENS_PER_STEP, training.tokens_per_step, training.seq_len, InvalidTraining),
    ]
    if cluster is not None:
        checks.append((MAX_GPUS, cluster.world_size, cluster.gpus_per_node, InvalidHardware))
    for bound, value, other, error in checks:
        if value > bound.limit:
            what = f" {bound.quantity}" if bound.quantity else ""
            field_limit = bound.limit // other
            most = f"; {bound.field} at most {field_limit:,} here" if other > 1 else ""
            return error(
                f"{bound.field}: {value:,}{what} is past the {bound.limit:,} this service plans for "
                f"(the largest published: {bound.reference}){most}",
                rule="scale",
                field=bound.field,
                limit=field_limit,
            )
    return None
