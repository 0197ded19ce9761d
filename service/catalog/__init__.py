"""Data catalogs (GPUs, model presets, efficiency curves): TOML files with a source per entry,
parsed and validated once into estimator types."""

import hashlib
from functools import cache
from importlib import resources

CATALOG_FILES = ("gpus.toml", "models.toml", "tuning.toml")


@cache
def catalog_version() -> str:
    """A digest of the catalog files: plans record it, so an old plan can be explained later."""
    digest = hashlib.sha256()
    for name in CATALOG_FILES:
        digest.update(resources.files("service.catalog").joinpath(name).read_bytes())
    return digest.hexdigest()[:16]
