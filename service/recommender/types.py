"""What the recommender takes beyond the estimator's inputs, and what it returns.

Frozen dataclasses, SI units with the unit in the name, like ``service.estimator.types``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from service.estimator.calibration import layout_family
from service.estimator.errors import InvalidTraining
from service.estimator.types import Estimate, Framework, Layout
from service.estimator.validate import FRAMEWORK_CAPABILITIES
from service.launchers.common import Target
from service.recommender.headroom import DEFAULT_FRACTION as DEFAULT_HEADROOM_FRACTION


class Objective(StrEnum):
    THROUGHPUT = "throughput"  # most tokens/s on the GPUs given
    FEWEST_GPUS = "fewest_gpus"  # fewest GPUs (whole nodes) that fit, then tokens/s
    COST = "cost"  # lowest price per token (GPU-hours per token without a price)
    TIME_TO_TRAIN = "time_to_train"  # shortest wall time for training.tokens


# The most layout evaluations one request may make: Constraints.max_evaluations, its default and the API limit
MAX_EVALUATIONS = 500_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraints:
    objective: Objective = Objective.THROUGHPUT
    max_gpus: int | None = None  # use at most this many of the cluster's GPUs
    frameworks: tuple[Framework, ...] = tuple(Framework)
    allow_offload: bool = True  # optimizer / parameter / activation offload to host or NVMe
    # Keep this fraction of GPU memory free (allocator behaviour, framework versions): headroom.py.
    min_headroom_fraction: float = DEFAULT_HEADROOM_FRACTION
    top_k: int = 3  # the recommended layout + top_k - 1 alternatives
    gpu_hour_cost: float | None = None  # price of one GPU for one hour, any currency
    # The search stops (truncated) after this many layout evaluations (memory or step time): a
    # budget in work, not seconds, so that the answer depends on the request alone. It is checked
    # between families of layouts, so the family that crosses it finishes (a few evaluations over).
    max_evaluations: int = MAX_EVALUATIONS
    # The launchers a plan must render in (one of them, of the layout's framework); None: any.
    launchers: tuple[Target, ...] | None = None
    # Compile the layouts of frameworks whose compiled run is modelled (FSDP: torchtitan
    # --compile.enable, HF Trainer torch_compile, accelerate's dynamo backend), model and loss.
    torch_compile: bool = False
    # What stored runs on this hardware say of the activations, buffers and overhead the estimate
    # leaves out ((framework, layout family, factor): planning.calibration, the calibration a plan
    # then applies to the layouts it keeps): every layout of the family is fitted with its own dynamic
    # bytes so scaled, where a flat headroom for the largest surplus refused layouts that need less
    # (scheduler review: one out-of-memory run at 25.6 GiB of activations took 17 GiB off every layout)
    memory_dynamic_factors: tuple[tuple[Framework, str, float], ...] = ()

    def dynamic_factor(self, layout: Layout) -> float:
        """The memory factor of ``layout``'s framework and family (``calibration.layout_family``)."""
        if not self.memory_dynamic_factors:
            return 1.0
        family = layout_family(tp=layout.tp, pp=layout.pp, cp=layout.cp, ep=layout.ep)
        for framework, of, factor in self.memory_dynamic_factors:
            if framework is layout.framework and of == family:
                return factor
        return 1.0

    def __post_init__(self) -> None:
        for name in ("max_gpus", "top_k", "max_evaluations"):
            # whole numbers: a float or inf cap reached slices and GPU counts as a TypeError (change review)
            value = getattr(self, name)
            if value is not None and (type(value) is not int):
                raise InvalidTraining(f"{name} must be a whole number, got {value!r}", field=name)
        if self.max_gpus is not None and self.max_gpus < 1:
            raise InvalidTraining(f"max_gpus must be >= 1, got {self.max_gpus}", field="max_gpus")
        if not self.frameworks:
            raise InvalidTraining("frameworks must name at least one framework", field="frameworks")
        if not 0.0 <= self.min_headroom_fraction < 1.0:
            raise InvalidTraining(
                f"min_headroom_fraction must be in [0, 1), got {self.min_headroom_fraction}",
                field="min_headroom_fraction",
            )
        if self.top_k < 1:
            raise InvalidTraining(f"top_k must be >= 1, got {self.top_k}", field="top_k")
        if self.max_evaluations < 1:
            raise InvalidTraining(
                f"max_evaluations must be >= 1, got {self.max_evaluations}", field="max_evaluations"
            )
        if self.gpu_hour_cost is not None and not 0 <= self.gpu_hour_cost < math.inf:
            raise InvalidTraining(
                f"gpu_hour_cost must be >= 0, got {self.gpu_hour_cost}", field="gpu_hour_cost"
            )
        for framework, family, factor in self.memory_dynamic_factors:
            # a stored run's factor: the API's calibration bounds it, a library caller may not (0 made
            # a 5,980 GiB layout "fit" an 80 GiB card, nan and inf raised ValueError: library review)
            if not 0 < factor < math.inf:
                raise InvalidTraining(
                    f"memory_dynamic_factors: {framework} {family}'s factor must be finite and > 0, "
                    f"got {factor}",
                    field="memory_dynamic_factors",
                )
        compilable = [f for f in self.frameworks if FRAMEWORK_CAPABILITIES[f].torch_compile is None]
        if self.torch_compile and not compilable:
            named = ", ".join(f.value for f in self.frameworks)
            raise InvalidTraining(
                f"torch_compile compiles fsdp layouts only, and frameworks ({named}) has none",
                field="constraints.torch_compile",
                rule="torch_compile",
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A layout that fits, its full estimate, and why it ranks where it does."""

    layout: Layout
    estimate: Estimate
    score: float  # the objective's value: tokens/s, GPUs, price per token or seconds
    rationale: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A group of layouts turned down for one reason, with one worked example."""

    reason: str  # "does not fit in GPU memory", "invalid: pp_layers", "fsdp does not support zero_stage 1"
    count: int
    example: Layout
    detail: str  # the example's numbers or the rule's message
    per_gpu_bytes: int | None = None  # the example's need, for "does not fit"
    allowed_bytes: int | None = None  # what the need was compared with: the card less the plan's headroom
    # the card's memory beside it (estimates' capacity_bytes: a miss "needs 38.3 GiB, 38.0 allowed" showed
    # 38.0 as its capacity beside an estimate of the same layout fitting the 40 GiB card; consistency review)
    capacity_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Suggestion:
    """One change that would make an infeasible job fit, with its numbers."""

    # offload | torch_compile | base_dtype | optimizer_implementation | optimizer | lora | qlora |
    # shorter_sequence | more_gpus | other_gpu
    kind: str
    detail: str
    gpu: str | None = None
    num_gpus: int | None = None
    num_nodes: int | None = None
    gpus_per_node: int | None = None  # the node shape it assumed
    inter_node_bandwidth_bytes_per_s: float | None = None  # the network it assumed, across nodes
    per_gpu_bytes: int | None = None
    cpu_per_node_bytes: int | None = None
    nvme_per_node_bytes: int | None = None  # the NVMe per node its layout offloads to, where any
    tokens_per_s: float | None = None
    layout: Layout | None = None  # the layout it found, to plan or estimate as it states
    method: str | None = None  # the training.method it assumed, where it changes it
    seq_len: int | None = None  # the training.seq_len it assumed, where it changes it
    base_dtype: str | None = None  # the training.base_dtype it assumed (None for full training)
    # the training.optimizer_implementation it assumed, where it changes it (None: as requested)
    optimizer_implementation: str | None = None
    optimizer: str | None = None  # the training.optimizer it assumed, where it changes it
    on_the_gpus_given: bool = False  # needs no hardware the request does not state
    truncated: bool = False  # the request's budget cut its search: the best layout found, not sure best


@dataclass(frozen=True, slots=True, kw_only=True)
class Skipped:
    """A suggestion considered and not made, and why: it could not be computed, a cheap bound or its
    search showed it cannot fit, or its GPU type cannot run the job (it never fails the plan)."""

    kind: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchStats:
    candidates_evaluated: int  # layouts ranked by their step time
    duration_s: float
    truncated: bool  # the request's budget stopped the search early
    # what stopped it: "evaluations" (Constraints.max_evaluations), "time" (the request's wall-time
    # budget) or "cancelled" (the client went away); None when it ran to the end
    truncated_by: str | None = None
    families_considered: int = 0  # (gpus, framework, tp, pp, cp, ep, sharding) combinations
    memory_evaluations: int = 0
    time_evaluations: int = 0  # step times, ranked candidates and bounds
    full_estimates: int = 0  # estimate() calls on what is returned


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    status: str  # "feasible" | "infeasible"
    recommended: Candidate | None
    alternatives: tuple[Candidate, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    suggestions: tuple[Suggestion, ...] = ()
    suggestions_skipped: tuple[Skipped, ...] = ()
    # infeasible: the layout that came closest to fitting, fully estimated (its memory breakdown)
    closest: Candidate | None = None
    search: SearchStats = field(
        default_factory=lambda: SearchStats(candidates_evaluated=0, duration_s=0.0, truncated=False)
    )
