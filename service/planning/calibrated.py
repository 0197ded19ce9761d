"""A plan's candidates under the calibration of their framework: each estimate recomputed whole
(memory, fit, limits, and the step time, its factor capped where the step would beat the GPU's
dense peak), then the score and the rationale computed from those calibrated numbers, so a plan
never explains itself with the search's uncalibrated ones."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from service.catalog.tuning import default_tuning
from service.estimator.calibration import Calibration, applied_calibration
from service.estimator.estimate import estimate as estimate_layout
from service.estimator.types import ClusterSpec, Layout, ModelSpec, TrainingSpec
from service.estimator.validate import valid_micro_batch_sizes
from service.recommender import rank
from service.recommender.space import sub_cluster
from service.recommender.types import Candidate, Constraints, Recommendation

# What rank.rationale appends to the PP line when a layout without PP also fits (its
# ``fits_without_pp``), and the index of its ``gpu_use`` line: the two things the search knew
# that the plan does not keep; tests/planning/test_calibrated.py checks both against rank.rationale.
FITS_WITHOUT_PP = "a layout without PP also fits"
GPU_USE_LINE = 1


def calibrated_candidates(
    rec: Recommendation,
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    calibration_of: Callable[[Layout], Calibration],
) -> list[tuple[Candidate, Calibration]]:
    """The recommended candidate (with both limits) and the alternatives, in the search's order, each
    with the calibration its estimate applied (``calibration_of`` its layout, the step-time factor
    capped at HFU 1: ``applied_calibration``)."""
    if rec.recommended is None:
        return []
    out = []
    for index, candidate in enumerate((rec.recommended, *rec.alternatives)):
        layout = candidate.layout
        learned = calibration_of(layout)
        calibration = applied_calibration(learned, candidate.estimate.time)  # the search's: uncalibrated
        estimate = candidate.estimate
        if index == 0 or not calibration.is_identity:
            # the recommended layout gets both limits; calibrated numbers are recomputed whole so
            # that fit, warnings and limits agree with the calibrated memory
            estimate = estimate_layout(
                model,
                sub_cluster(cluster, layout.world_size),
                layout,
                training,
                tuning=default_tuning(),
                with_limits=index == 0,
                calibration=calibration,
            )
        score = candidate.score
        if estimate.time is not None:
            score = rank.score(constraints, layout.world_size, estimate.time.tokens_per_s, training.tokens)
        out.append((dataclasses.replace(candidate, estimate=estimate, score=score), calibration))
    if all(calibration.is_identity for _, calibration in out):
        return out  # the search's rationale already reads these numbers
    return calibrated_rationale(rec.recommended, out, cluster, training)


def calibrated_rationale(
    searched: Candidate,
    chosen: list[tuple[Candidate, Calibration]],
    cluster: ClusterSpec,
    training: TrainingSpec,
) -> list[tuple[Candidate, Calibration]]:
    """``chosen`` (recommended first) with every rationale written again from its estimate, as the
    recommender writes it (rank.rationale, rank.alternative_rationale); ``searched``: the search's
    recommended candidate, for what only the search knew; ``training``: what bounds the micro-batch
    besides memory (the global batch)."""
    (best, best_calibration), *alternatives = chosen
    runner_up = (alternatives[0][0].layout, alternatives[0][0].estimate) if alternatives else None
    lines = rank.rationale(
        best.layout,
        best.estimate,
        sub_cluster(cluster, best.layout.world_size),
        runner_up,
        any(FITS_WITHOUT_PP in line for line in searched.rationale),
        searched.rationale[GPU_USE_LINE],
        batch_cap=max(valid_micro_batch_sizes(training, best.layout), default=None),
    )
    out = [(dataclasses.replace(best, rationale=lines), best_calibration)]
    for candidate, calibration in alternatives:
        why = rank.alternative_rationale(candidate.layout, candidate.estimate, best.layout, best.estimate)
        out.append((dataclasses.replace(candidate, rationale=why), calibration))
    return out
