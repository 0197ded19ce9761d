"""Whether any requested framework can run the job at all, asked before a search.

Some refusals do not depend on the layout: Megatron-LM has no PEFT and no TF32 switch, torchtitan
builds only the models of its registry and emits no fp8 / fp16 converters, the HF Trainer has no fp8
switch. A plan whose frameworks (and launchers) all refuse the job for such a reason would search
every layout, reject each for the same reason, then spend the request's budget on suggestions that
keep the frameworks and so cannot succeed either; it ended as an infeasible plan with nothing in
``rejected`` or as a "too large to plan" 422 naming a 16-layer model. It is a 422 naming the field
instead (``planning.runnable``), with each framework's reason and those that would run it; the
suggestions ask it of each change they try (a LoRA the requested frameworks do not train).

A framework runs the job when its plainest layout (one GPU, no parallelism, no offload; no recompute
or full recompute: Accelerate's MegatronLMPlugin runs full recompute only) passes the
layout-independent rules of ``validate.training_violation`` and a launcher
(``launchers.runnable_targets``) runs it at one of the framework's ZeRO stages (DeepSpeed refuses
pure bf16 at stage 0 only), its switches set as the search sets them for those launchers (the
recipes', or for Megatron without its own target Megatron-LM's, which Accelerate runs). The other
refusals a larger layout lifts are about parallel degrees or offload, all off in that
layout, so a framework refused here is refused for every layout of every cluster (checked against
the search over 1-8 GPUs for 8 models x 3 GPUs x 3 frameworks x 6 precisions x 3 methods x 5
launcher sets: no refusal where it finds a layout).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from service.estimator.errors import EstimatorError
from service.estimator.types import ClusterSpec, Framework, Layout, ModelSpec, Plan, Recompute, TrainingSpec
from service.estimator.validate import FRAMEWORK_CAPABILITIES, training_violation
from service.launchers import Target, runnable_targets
from service.recommender.space import megatron_lm_switches

TRAINING_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainingSpec))


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """Why a framework runs the job with no layout, and the training field the reason is about (a
    rule of ``training_violation`` that names one; None: a launcher's refusal, or no single field)."""

    message: str
    training_field: str | None = None


def framework_refusal(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    framework: Framework,
    launchers: Sequence[Target] | None = None,
) -> Refusal | None:
    """Why ``framework`` cannot run this model and training with any layout (through one of
    ``launchers``, None: any), or None when a launcher runs its plainest layout."""
    caps = FRAMEWORK_CAPABILITIES[framework]
    one_gpu = dataclasses.replace(cluster, num_nodes=1, gpus_per_node=1)
    refusals: list[str] = []
    recomputes = [r for r in (Recompute.NONE, Recompute.FULL) if r in caps.recompute_modes]
    for zero_stage, switches, recompute in itertools.product(
        sorted(caps.zero_stages), _switches(framework, training, launchers), recomputes
    ):
        try:
            layout = Layout(framework=framework, zero_stage=zero_stage, recompute=recompute, **switches)
        except EstimatorError:  # not a layout of this framework: nothing learned from it
            continue
        violation = training_violation(model, one_gpu, layout, training, caps)
        if violation is not None:  # the rules it checks do not depend on the layout
            field = violation.field if violation.field in TRAINING_FIELDS else None
            return Refusal(violation.message, field)
        plan = Plan(model=model, cluster=one_gpu, training=training, layout=layout)
        runs, reasons = runnable_targets(plan, launchers)
        if runs:
            return None
        refusals.append(
            _launcher_reasons(reasons) or f"none of the requested launchers runs {framework.value}"
        )
    return Refusal(refusals[0]) if refusals else None


def _launcher_reasons(reasons: dict[Target, str]) -> str:
    """Each launcher's refusal, those refusing for the same reason named together ("megatron: the
    megatron and accelerate launchers refuse it: ..." where it read "megatron: megatron: ...")."""
    by_reason: dict[str, list[str]] = {}
    for target, reason in reasons.items():
        by_reason.setdefault(reason, []).append(target.value)
    said = []
    for reason, names in by_reason.items():
        who = (
            f"the {names[0]} launcher refuses"
            if len(names) == 1
            else f"the {' and '.join(names)} launchers refuse"
        )
        said.append(f"{who} it: {reason}")
    return "; ".join(said)


def _switches(
    framework: Framework, training: TrainingSpec, launchers: Sequence[Target] | None
) -> list[dict[str, Any]]:
    """The framework switches the search sets: the recipes' (the Layout's defaults), or, for Megatron
    when the launchers leave its own target out, Megatron-LM's own (fp32 main gradients, no fp8
    weight gather, its own optimizer, no overlapped reduce: ``space.megatron_lm_switches``), which
    Accelerate's MegatronLMPlugin runs and the recipes' it does not."""
    own = megatron_lm_switches(launchers, training.precision)
    if framework is not Framework.MEGATRON or own is None:
        return [{}]
    return [
        {
            "grad_reduce_in_fp32": own.grad_reduce_in_fp32,
            "fp8_param_gather": own.fp8_param_gather,
            "precision_aware_optimizer": own.precision_aware_optimizer,
            "overlap_grad_reduce": None,  # one GPU: no reduce to overlap (the search's choice there)
        }
    ]
