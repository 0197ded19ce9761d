"""Errors raised while loading or looking up the data catalogs (GPUs, model presets, tuning)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

CatalogKind = Literal["gpu", "model", "tuning"]


class UnknownCatalogEntry(LookupError):
    """A name that no catalog entry carries (``names.resolve``); `known` lists the names that exist,
    sorted; `candidates` the entries it may mean: those carrying its words where `ambiguous` (it names
    several), else the closest names."""

    def __init__(
        self,
        kind: CatalogKind,
        name: str,
        known: Iterable[str],
        *,
        candidates: Iterable[str] = (),
        ambiguous: bool = False,
    ) -> None:
        self.kind: CatalogKind = kind
        self.name = name
        self.known: tuple[str, ...] = tuple(sorted(known))
        self.candidates: tuple[str, ...] = tuple(candidates)
        self.ambiguous = ambiguous
        listed = ", ".join(self.candidates)
        if ambiguous:
            hint = f"; it matches {len(self.candidates)} entries: {listed}; name one"
        elif self.candidates:
            hint = f"; did you mean {listed}?"
        else:
            hint = ""
        # a model outside the catalog is still plannable from its config.json (the service fetches
        # nothing: it runs where Hugging Face may not be reachable)
        other = (
            "; a model outside the catalog: send its config.json as model.hf_config"
            if kind == "model"
            else ""
        )
        self.message = f"unknown {kind} {name!r}{hint}{other} (known: {', '.join(self.known)})"
        super().__init__(self.message)


class InvalidCatalogEntry(ValueError):
    """A catalog file whose data breaks the schema: the bug is in the data file, not the request.

    `entry` is the table name (None for file-level problems such as bad TOML) and `key` the
    offending key, when one is to blame.
    """

    def __init__(
        self, message: str, *, kind: CatalogKind, entry: str | None = None, key: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind: CatalogKind = kind
        self.entry = entry
        self.key = key
