"""Model presets and model resolution with exact parameter counts."""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter, Query
from starlette.convertors import Convertor, register_url_convertor

from service.api.deps import CatalogPage, paged
from service.api.problems import PROBLEM_RESPONSES
from service.catalog.models import ModelPreset, models
from service.catalog.models import model as catalog_model
from service.contracts.common import Page
from service.contracts.models import (
    ModelPresetOut,
    ParametersOut,
    ResolvedModel,
    ResolveRequest,
    architecture_dict,
)
from service.estimator.errors import InvalidModel
from service.estimator.params import layer_parameters, parameter_counts, stage_parameter_counts
from service.estimator.pipeline import stage_layers
from service.estimator.types import Layout, ModelSpec
from service.estimator.validate import pipeline_split_violation


class PresetName(Convertor[str]):
    """A preset's name in a path: any segment but "resolve", which is POST /v1/models/resolve's, so a
    GET or OPTIONS there is a 405 naming POST, not the lookup of a preset called "resolve"; or two,
    a Hugging Face repo id (GET /v1/models/meta-llama/Llama-3.1-8B, as a request may name it)."""

    regex = "(?!resolve$)[^/]+(?:/[^/]+)?"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("preset_name", PresetName())
router = APIRouter(prefix="/v1/models", tags=["models"], responses=PROBLEM_RESPONSES)


def parameters_out(spec: ModelSpec, pp: int = 1) -> ParametersOut:
    counts = parameter_counts(spec)
    layout = Layout(pp=pp)
    violation = pipeline_split_violation(spec, layout)
    if violation is not None:
        raise violation
    return ParametersOut(
        **dataclasses.asdict(counts),
        per_layer=max(layer_parameters(spec, i) for i in range(spec.num_layers)),
        per_stage=list(stage_parameter_counts(spec, layout)),
        stage_layers=list(stage_layers(spec.num_layers, layout)),
    )


def preset_out(preset: ModelPreset) -> ModelPresetOut:
    return ModelPresetOut(
        name=preset.name,
        display_name=preset.display_name,
        family=preset.spec.family,
        source=preset.source,
        config=preset.config,
        architecture=architecture_dict(preset.spec),
        parameters_total=parameter_counts(preset.spec).total,
        notes=list(preset.spec.config_notes),
    )


@router.get("", response_model=Page[ModelPresetOut])
def list_models(
    page: CatalogPage,
    family: str | None = Query(
        default=None, max_length=64, description="only this model_type, e.g. qwen3_moe"
    ),
) -> Page[ModelPresetOut]:
    """Every preset (of one family), in one page unless `limit` asks for less (the catalog is small)."""
    presets = list(models().values())
    if family is not None:
        known = sorted({p.spec.family for p in presets})
        presets = [p for p in presets if p.spec.family == family]
        if not presets:
            raise InvalidModel(
                f"no preset of family {family!r}; families: {known}", rule="family", field="family"
            )
    shown, next_cursor = paged(presets, page)
    return Page[ModelPresetOut](items=[preset_out(p) for p in shown], next_cursor=next_cursor)


@router.get("/{name:preset_name}", response_model=ModelPresetOut)
def get_model(name: str) -> ModelPresetOut:
    return preset_out(catalog_model(name))


@router.post("/resolve", response_model=ResolvedModel)
def resolve_model(body: ResolveRequest) -> ResolvedModel:
    """A preset, a Hugging Face config.json or explicit fields -> architecture and exact counts."""
    spec = body.model.to_domain()
    return ResolvedModel(
        name=spec.name,
        architecture=architecture_dict(spec),
        parameters=parameters_out(spec, body.pp),
        notes=list(spec.config_notes),
    )
