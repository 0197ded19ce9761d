"""The framework registry (service/frameworks.py): one entry per framework, whose parts agree with
the estimator's capabilities, the launchers and the tuning file."""

from __future__ import annotations

import tomllib
from typing import Any

from service.catalog.tuning import TUNING_TOML
from service.estimator.types import Framework
from service.estimator.validate import FRAMEWORK_CAPABILITIES
from service.frameworks import FRAMEWORKS, PER_FRAMEWORK_TUNING_TABLES, Target, frameworks_of
from service.launchers import REFUSALS, RENDERERS


def _lookup(document: dict[str, Any], dotted: str) -> object:
    value: object = document
    for part in dotted.split("."):
        assert isinstance(value, dict) and part in value, dotted
        value = value[part]
    return value


def test_one_entry_per_framework_holding_the_estimators_capabilities() -> None:
    assert set(FRAMEWORKS) == set(Framework)
    for framework, entry in FRAMEWORKS.items():
        assert entry.framework is framework
        assert entry.capabilities is FRAMEWORK_CAPABILITIES[framework]
        assert entry.source


def test_every_framework_has_targets_that_render_and_refuse() -> None:
    for entry in FRAMEWORKS.values():
        assert entry.targets and len(set(entry.targets)) == len(entry.targets)
        assert all(t in RENDERERS and t in REFUSALS for t in entry.targets)
    # the schedulers wrap a framework's own entry point: no framework lists them
    assert frameworks_of(Target.SLURM) == frameworks_of(Target.KUBERNETES) == ()
    assert frameworks_of(Target.ACCELERATE) == tuple(FRAMEWORKS)


def test_tuning_keys_name_numbers_of_the_tuning_file() -> None:
    with TUNING_TOML.open("rb") as f:
        document = tomllib.load(f)
    for entry in FRAMEWORKS.values():
        for key in entry.tuning_keys:
            assert _lookup(document, key) is not None, (entry.framework, key)
    for table in PER_FRAMEWORK_TUNING_TABLES:
        named = _lookup(document, table)
        assert isinstance(named, dict) and set(named) == {f.value for f in FRAMEWORKS}, table
