"""Model presets: ``models.toml`` parsed once into ModelSpecs built from each preset's config.json fields."""

from __future__ import annotations

import copy
import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from service.catalog.errors import InvalidCatalogEntry
from service.catalog.names import resolve
from service.estimator.errors import EstimatorError
from service.estimator.hf_config import model_from_hf_config
from service.estimator.types import ModelSpec

_FILE = "models.toml"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelPreset:
    name: str  # the API slug, e.g. "llama-3-8b"
    display_name: str
    source: str  # URL of the config.json (or the paper table) the fields come from
    config: dict[str, Any]  # the published config.json fields, verbatim (null_keys restored as None)
    spec: ModelSpec


def _text(entry: str, table: dict[str, Any], key: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidCatalogEntry(
            f"{_FILE} [{entry}]: {key!r} must be a non-empty string", kind="model", entry=entry, key=key
        )
    return value


def _with_nulls(slug: str, config: dict[str, Any], null_keys: object) -> dict[str, Any]:
    """``config`` with each dotted path of ``null_keys`` set to None (TOML has no null)."""
    if null_keys is None:
        return config
    if not isinstance(null_keys, list) or not all(isinstance(k, str) and k for k in null_keys):
        raise InvalidCatalogEntry(
            f"{_FILE} [{slug}]: 'null_keys' must be a list of config key paths",
            kind="model",
            entry=slug,
            key="null_keys",
        )
    restored = copy.deepcopy(config)
    for path in null_keys:
        *parents, leaf = path.split(".")
        table = restored
        for part in parents:
            inner = table.get(part)
            if not isinstance(inner, dict):
                raise InvalidCatalogEntry(
                    f"{_FILE} [{slug}]: null_keys entry {path!r}: [{slug}.config.{part}] is not a table",
                    kind="model",
                    entry=slug,
                    key="null_keys",
                )
            table = inner
        if leaf in table:
            raise InvalidCatalogEntry(
                f"{_FILE} [{slug}]: {path!r} is both in null_keys and set in [{slug}.config]",
                kind="model",
                entry=slug,
                key="null_keys",
            )
        table[leaf] = None
    return restored


def _preset(slug: str, table: object) -> ModelPreset:
    if not isinstance(table, dict):
        raise InvalidCatalogEntry(f"{_FILE}: [{slug}] must be a table", kind="model", entry=slug)
    unknown = sorted(set(table) - {"display_name", "source", "config", "null_keys"})
    if unknown:
        raise InvalidCatalogEntry(
            f"{_FILE} [{slug}]: unknown keys {unknown}", kind="model", entry=slug, key=unknown[0]
        )
    config = table.get("config")
    if not isinstance(config, dict):
        raise InvalidCatalogEntry(
            f"{_FILE} [{slug}]: missing [{slug}.config] table", kind="model", entry=slug, key="config"
        )
    config = _with_nulls(slug, config, table.get("null_keys"))
    try:
        spec = model_from_hf_config(config, name=slug)
    except EstimatorError as exc:
        raise InvalidCatalogEntry(
            f"{_FILE} [{slug}]: {exc.message}", kind="model", entry=slug, key=exc.field
        ) from exc
    return ModelPreset(
        name=slug,
        display_name=_text(slug, table, "display_name"),
        source=_text(slug, table, "source"),
        config=config,
        spec=spec,
    )


@cache
def models() -> dict[str, ModelPreset]:
    """Every preset, keyed by slug (parsed and validated on first use, then cached)."""
    text = resources.files("service.catalog").joinpath(_FILE).read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidCatalogEntry(f"{_FILE}: {exc}", kind="model") from exc
    return {slug: _preset(slug, table) for slug, table in data.items()}


def model(name: str) -> ModelPreset:
    """The preset ``name`` names: its slug, its published name, its Hugging Face repo id or words only
    it carries (``names.resolve``: "Llama 3.1 8B", "meta-llama/Llama-3.1-8B"); UnknownCatalogEntry,
    listing the known names, otherwise."""
    presets = models()
    found = presets.get(name)
    return found if found is not None else presets[resolve("model", name, _aliases(), SIZE_WORD)]


# A word of a preset's slug that states its size (7b, 8x7b, 124m, a3b: active parameters, 128e:
# experts), which a name must state too before words alone select the preset.
SIZE_WORD = re.compile(r"^[a-z]*\d+(\.\d+)?(x\d+)?[bme]$")
_HF_REPO = re.compile(r"https://huggingface\.co/([^/]+/[^/]+)/")


@cache
def _aliases() -> dict[str, tuple[str, ...]]:
    """A preset's other names: its display name, and the repo id (and the repo's name) of the
    Hugging Face config.json it comes from."""
    out = {}
    for slug, preset in models().items():
        repo = _HF_REPO.match(preset.source)
        names = (repo.group(1), repo.group(1).split("/")[1]) if repo else ()
        out[slug] = (preset.display_name, *names)
    return out
