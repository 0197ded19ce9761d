"""A plan's candidates under the calibration of their framework: each estimate recomputed whole
(memory, fit, limits, and the step time, its factor capped where the step would beat the GPU's
dense peak), then the score and the rationale computed from those calibrated numbers, so a plan
never explains itself with the search's uncalibrated ones."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from service.catalog.tuning import default_tuning
from service.estimator.calibration import Calibration, applied_calibration
from service.estimator.estimate import estimate as estimate_layout
from service.estimator.types import ClusterSpec, Estimate, Layout, ModelSpec, TrainingSpec
from service.estimator.validate import valid_micro_batch_sizes
from service.recommender import rank
from service.recommender.space import sub_cluster
from service.recommender.types import Candidate, Constraints, Objective, Recommendation

# What rank.rationale appends to the PP line when a layout without PP also fits (its
# ``fits_without_pp``), and the index of its ``gpu_use`` line: the two things the search knew
# that the plan does not keep; tests/planning/test_calibrated.py checks both against rank.rationale.
FITS_WITHOUT_PP = "a layout without PP also fits"
GPU_USE_LINE = 1


@dataclass(frozen=True, slots=True)
class Calibrated:
    """A plan's candidate with its calibration applied, and the search's candidate it was made from."""

    candidate: Candidate
    calibration: Calibration
    searched: Candidate


def calibrated_candidates(
    rec: Recommendation,
    model: ModelSpec,
    cluster: ClusterSpec,
    training: TrainingSpec,
    constraints: Constraints,
    calibration_of: Callable[[Layout], Calibration],
) -> list[Calibrated]:
    """The recommended candidate (with both limits) and the alternatives, each with the calibration its
    estimate applied (``calibration_of`` its layout, the step-time factor capped at HFU 1:
    ``applied_calibration``). Uncalibrated, in the search's order; calibrated, ranked again by the
    search's own rule on the calibrated numbers (``ranked_again``)."""
    if rec.recommended is None:
        return []

    def estimated(layout: Layout, calibration: Calibration, with_limits: bool) -> Estimate:
        # recomputed whole, so that fit, warnings and limits agree with the calibrated memory
        return estimate_layout(
            model,
            sub_cluster(cluster, layout.world_size),
            layout,
            training,
            tuning=default_tuning(),
            with_limits=with_limits,
            calibration=calibration,
        )

    out = []
    for searched in (rec.recommended, *rec.alternatives):
        learned = calibration_of(searched.layout)
        calibration = applied_calibration(learned, searched.estimate.time)  # the search's: uncalibrated
        candidate = searched
        if not calibration.is_identity:
            candidate = _with_estimate(
                searched, estimated(searched.layout, calibration, False), constraints, training
            )
        out.append(Calibrated(candidate, calibration, searched))
    calibrated = not all(c.calibration.is_identity for c in out)
    if calibrated:
        out = ranked_again(out, constraints)
    best = out[0]  # the recommended layout gets both limits
    limited = estimated(best.candidate.layout, best.calibration, True)
    out[0] = dataclasses.replace(
        best, candidate=_with_estimate(best.candidate, limited, constraints, training)
    )
    if not calibrated:
        return out  # the search's rationale already reads these numbers
    return calibrated_rationale(rec.recommended, out, cluster, training, constraints.objective)


def _with_estimate(
    candidate: Candidate, estimate: Estimate, constraints: Constraints, training: TrainingSpec
) -> Candidate:
    """``candidate`` with ``estimate`` and the score it gives."""
    score = candidate.score
    if estimate.time is not None:
        score = rank.score(constraints, candidate.layout.world_size, estimate.time.tokens_per_s, training)
    return dataclasses.replace(candidate, estimate=estimate, score=score)


def ranked_again(chosen: list[Calibrated], constraints: Constraints) -> list[Calibrated]:
    """``chosen`` ordered by ``rank.sort_key`` on each one's (calibrated) tokens/s, the recommended one
    first by ``rank.near_tie_winner``, as the search ranks what it keeps. A run measured on one layout
    calibrates it more than its alternatives (which share its evidence at a lower weight), so the
    search's order can turn over: the recommended layout was shown slower than an alternative, and its
    rationale said a 1.9% gain was "under 1%" (page review). Only candidates on as many GPUs as the
    search's recommended one, and that fit after calibration, may take its place: its rationale's
    GPU-use line is the search's."""
    gpus = chosen[0].candidate.layout.world_size
    objective = constraints.objective

    def tokens_per_s(c: Calibrated) -> float:
        time = c.candidate.estimate.time
        return time.tokens_per_s if time is not None else 0.0

    order = sorted(chosen, key=lambda c: rank.sort_key(objective, c.candidate.layout, tokens_per_s(c)))
    # one that fits after calibration (a layout's own runs may raise its memory past the card: it
    # was recommended with "-37.9 GiB headroom", launch files and all: review of this stop)
    same = [
        c
        for c in order
        if c.candidate.layout.world_size == gpus and (c.candidate.estimate.fits or c is chosen[0])
    ]
    best = same[rank.near_tie_winner(objective, [(c.candidate.layout, tokens_per_s(c)) for c in same])]
    return [best, *(c for c in order if c is not best)]


def calibrated_rationale(
    searched: Candidate,
    chosen: list[Calibrated],
    cluster: ClusterSpec,
    training: TrainingSpec,
    objective: Objective = Objective.THROUGHPUT,
) -> list[Calibrated]:
    """``chosen`` (recommended first) with every rationale written again from its estimate, as the
    recommender writes it (rank.rationale, rank.alternative_rationale); ``searched``: the search's
    recommended candidate, for what only the search knew; ``training``: what bounds the micro-batch
    besides memory (the global batch), and what Megatron's optimizer runs under."""
    first, *alternatives = chosen
    best = first.candidate
    runner_up = (
        (alternatives[0].candidate.layout, alternatives[0].candidate.estimate) if alternatives else None
    )
    lines = rank.rationale(
        best.layout,
        best.estimate,
        sub_cluster(cluster, best.layout.world_size),
        runner_up,
        any(FITS_WITHOUT_PP in line for line in searched.rationale),
        searched.rationale[GPU_USE_LINE],
        batch_cap=max(valid_micro_batch_sizes(training, best.layout), default=None),
        objective=objective,
        training=training,
    )
    out = [dataclasses.replace(first, candidate=dataclasses.replace(best, rationale=lines))]
    for c in alternatives:
        alt = c.candidate
        why = rank.alternative_rationale(alt.layout, alt.estimate, best.layout, best.estimate, objective)
        out.append(dataclasses.replace(c, candidate=dataclasses.replace(alt, rationale=why)))
    return out
