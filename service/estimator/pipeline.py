"""How the decoder layers split over pipeline stages: the layers of every (virtual) stage.

A layout gives the split explicitly (``Layout.pipeline_layers``: the layers of each of the pp x v
virtual stages, in model order; virtual stage ``k`` runs on pipeline rank ``k % pp``, Megatron's
interleaved assignment), or says how the first and last stages make room for the embedding and the
loss (``pipeline_account_for_embedding`` / ``_loss``: each counts as one layer when the layers are
shared out, Megatron-Core's ``--account-for-embedding-in-pipeline-split`` /
``--account-for-loss-in-pipeline-split`` and torchtitan's first/last-stage-less-layers), or neither:
then the split is even when the stages divide the layers, and otherwise the embedding and the loss
each count as a layer, which balances the stages as Llama 3 (arXiv:2407.21783 §3.3.2: one layer
fewer on the first and the last stage of 405B's 126 layers over 16 stages) and BLOOM (70 layers
over 12 stages, partition_method 'type:transformer|embedding') trained.

Shared out: the L + e + l units go ``units // S`` to each of the S virtual stages, the first
``units % S`` stages one more (torchtitan ``pipeline_module_split``), then the first stage gives
``e`` and the last ``l`` back. With ``units % S == 0`` this is Megatron's rule exactly.
"""

from __future__ import annotations

import functools

from service.estimator.types import Layout


def accounts_for(num_layers: int, layout: Layout) -> tuple[int, int]:
    """(embedding, loss) units the split counts: the layout's flags, or both when no even split exists."""
    stages = layout.pp * layout.virtual_pipeline_stages
    stated = layout.pipeline_account_for_embedding or layout.pipeline_account_for_loss
    if not stated and num_layers % stages == 0:
        return 0, 0
    if not stated:
        return 1, 1
    return int(layout.pipeline_account_for_embedding), int(layout.pipeline_account_for_loss)


def stage_layers(num_layers: int, layout: Layout) -> tuple[int, ...]:
    """Decoder layers of each of the pp x v virtual stages, in model order."""
    if layout.pipeline_layers is not None:
        return layout.pipeline_layers
    embedding, loss = accounts_for(num_layers, layout)
    return _derived_split(num_layers, layout.pp * layout.virtual_pipeline_stages, embedding, loss)


@functools.lru_cache(maxsize=4096)
def _derived_split(num_layers: int, stages: int, embedding: int, loss: int) -> tuple[int, ...]:
    units = num_layers + embedding + loss
    share, extra = divmod(units, stages)
    split = [share + (1 if stage < extra else 0) for stage in range(stages)]
    split[0] -= embedding
    split[-1] -= loss
    return tuple(split)


def covers_every_rank(num_layers: int, layout: Layout) -> bool:
    """Every virtual stage gets >= 0 layers and every pipeline rank between the first and the last
    (which hold the embedding and the loss) at least one."""
    return _covers_every_rank(
        num_layers,
        layout.pp,
        layout.virtual_pipeline_stages,
        layout.pipeline_layers,
        layout.pipeline_account_for_embedding,
        layout.pipeline_account_for_loss,
    )


@functools.lru_cache(maxsize=4096)
def _covers_every_rank(
    num_layers: int, pp: int, virtual: int, explicit: tuple[int, ...] | None, embedding: bool, loss: bool
) -> bool:
    if pp > num_layers + 2:
        return False  # the ranks between the first and the last need a layer each: no split can do it
    layout = Layout(
        pp=pp,
        virtual_pipeline_stages=virtual,
        pipeline_layers=explicit,
        pipeline_account_for_embedding=embedding,
        pipeline_account_for_loss=loss,
    )
    split = stage_layers(num_layers, layout)
    return min(split) >= 0 and all(sum(split[rank::pp]) > 0 for rank in range(1, pp - 1))


def rank_layer_ranges(num_layers: int, layout: Layout) -> tuple[tuple[range, ...], ...]:
    """The layer index ranges each pipeline rank holds: its virtual stages r, r + pp, r + 2 pp, ..."""
    bounds, start = [], 0
    for layers in stage_layers(num_layers, layout):
        bounds.append(range(start, start + layers))
        start += layers
    return tuple(tuple(bounds[stage :: layout.pp]) for stage in range(layout.pp))


def describe(num_layers: int, layout: Layout) -> str:
    """The split in words, runs of equal stages folded: '7, 8 x 14, 7'."""
    runs: list[tuple[int, int]] = []
    for layers in stage_layers(num_layers, layout):
        if runs and runs[-1][0] == layers:
            runs[-1] = (layers, runs[-1][1] + 1)
        else:
            runs.append((layers, 1))
    return ", ".join(f"{layers}" if count == 1 else f"{layers} x {count}" for layers, count in runs)


def rank_layer_counts(num_layers: int, layout: Layout) -> tuple[int, ...]:
    """Decoder layers each pipeline rank holds (all of its virtual stages)."""
    split = stage_layers(num_layers, layout)
    return tuple(sum(split[rank :: layout.pp]) for rank in range(layout.pp))


def rank_recomputed_fractions(num_layers: int, layout: Layout, mtp_layers: int = 0) -> tuple[float, ...]:
    """The fraction of each pipeline rank's layers that recompute: with ``recompute_num_layers`` N
    the first N layers of each of its virtual stages (Megatron's block method, per model chunk); with
    ``recompute_every_n_layers`` N every N-th layer the rank builds (torchtitan's selective layer AC
    counts the blocks it wraps, per process, and checkpoints those whose count % N == 0: floor(L/N)
    of L); else all of them (1.0; whether anything is recomputed is the layout's ``recompute``).
    ``mtp_layers``: the multi-token-prediction layers the last rank builds besides its decoder
    layers, which Megatron-Core does not recompute under the block method (multi_token_prediction.py:
    "recompute_method == 'block' is not supported for MTP yet. Skipping recompute."; counted as
    recomputed, DeepSeek-V2-Lite's MTP layer kept none of its activations: recompute review)."""
    fractions = _decoder_recomputed_fractions(num_layers, layout)
    if not mtp_layers or layout.recompute_num_layers is None:
        return fractions
    layers = rank_layer_counts(num_layers, layout)[-1]
    last = fractions[-1] * layers / (layers + mtp_layers)
    return (*fractions[:-1], last)


def _decoder_recomputed_fractions(num_layers: int, layout: Layout) -> tuple[float, ...]:
    """``rank_recomputed_fractions`` of the decoder layers alone."""
    n, every = layout.recompute_num_layers, layout.recompute_every_n_layers
    if every is not None:
        return tuple(
            (layers // every) / layers if layers else 1.0 for layers in rank_layer_counts(num_layers, layout)
        )
    if n is None:
        return (1.0,) * layout.pp
    split = stage_layers(num_layers, layout)
    fractions = []
    for rank in range(layout.pp):
        stages = split[rank :: layout.pp]
        layers = sum(stages)
        fractions.append(sum(min(n, s) for s in stages) / layers if layers else 1.0)
    return tuple(fractions)


def recomputed_fraction(num_layers: int, layout: Layout) -> float:
    """The fraction of all the model's layers that recompute (``rank_recomputed_fractions``)."""
    n, every = layout.recompute_num_layers, layout.recompute_every_n_layers
    if every is not None:
        return sum(layers // every for layers in rank_layer_counts(num_layers, layout)) / num_layers
    if n is None:
        return 1.0
    return sum(min(n, s) for s in stage_layers(num_layers, layout)) / num_layers


# The layout fields the split reads.
PIPELINE_FIELDS = (
    "pp",
    "virtual_pipeline_stages",
    "pipeline_layers",
    "pipeline_account_for_embedding",
    "pipeline_account_for_loss",
)
