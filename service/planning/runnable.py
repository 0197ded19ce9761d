"""The 422 for a job no requested framework runs with any layout (``recommender.runnable``'s
``framework_refusal`` of each), asked before a search."""

from __future__ import annotations

from collections.abc import Sequence

from service.errors import Unprocessable
from service.estimator.types import ClusterSpec, Framework, ModelSpec, TrainingSpec
from service.launchers import Target
from service.recommender.runnable import Refusal, framework_refusal


def no_framework_runs(
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    frameworks: Sequence[Framework],
    launchers: Sequence[Target] | None,
    *,
    field: str,
) -> Unprocessable | None:
    """The 422 for a job none of ``frameworks`` runs (through ``launchers``), naming ``field`` and
    each framework's reason, and the frameworks that would run it without the request's limits; None
    when one of them runs it."""
    reasons = {fw: framework_refusal(model, cluster, training, fw, launchers) for fw in frameworks}
    refusals = {fw: refusal for fw, refusal in reasons.items() if refusal is not None}
    if len(refusals) < len(reasons):
        return None
    others = [fw.value for fw in Framework if framework_refusal(model, cluster, training, fw) is None]
    would = (
        f"; frameworks that run it with any launcher: {', '.join(others)}"
        if others
        else "; no framework runs it: change the training (precision, method) or the model"
    )

    def named(refusal: Refusal) -> str:
        # where the training is what no framework runs, a reason names the training field it is about
        # (phi-3-mini's fused q/k/v targeted in part said "training" for every framework, where the
        # estimate names training.lora_targets: page review)
        if field == "training" and refusal.training_field:
            return f"training.{refusal.training_field}"
        return field

    errors = [
        {"field": named(refusal), "message": f"{fw.value}: {refusal.message}", "type": "no_launcher"}
        for fw, refusal in refusals.items()
    ]
    detail = (
        "no requested framework can run this model and training with any layout, so no plan can "
        "be made: " + " | ".join(e["message"] for e in errors) + would
    )
    return Unprocessable(detail, errors=errors)
