"""Errors raised while loading or looking up the data catalogs (GPUs, model presets, tuning)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

CatalogKind = Literal["gpu", "model", "tuning"]


SHOWN_NAME_CHARS = 80  # of an unknown name, in the message


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
        # a GPU outside the catalog is plannable from its datasheet: a custom GPU object (the request
        # names only "gb200": the answer said what is known, not that any other part can be described)
        other = (
            {
                "model": "; a model outside the catalog: send its config.json as model.hf_config",
                "gpu": "; a GPU outside the catalog: describe it from its datasheet (plans and estimates: "
                "cluster.gpu as an object; the CLI: --gpu-spec FILE; capacity: a cluster stored with it, by "
                "cluster_ids): name, memory_bytes, peak_flops_per_s (dense, not the sparse figures "
                "datasheets print; fp32 required), hbm_bandwidth_bytes_per_s, "
                "intra_node_bandwidth_bytes_per_s for NVLink (else the PCIe host link is assumed), and "
                "chip, its die (gh100, gb100, cdna3, ...) or a product on one (gb200, h20, mi325x), left "
                'out for a die the catalog lacks (then vendor "amd" for an AMD part)',
            }.get(kind, "")
            if not ambiguous
            else ""
        )
        # a long name is shown by its start: it was echoed whole, twice (a 750 KB name, a 1.5 MB answer)
        shown = (
            name
            if len(name) <= SHOWN_NAME_CHARS
            else f"{name[:SHOWN_NAME_CHARS]}... ({len(name):,} characters)"
        )
        self.message = f"unknown {kind} {shown!r}{hint}{other} (known: {', '.join(self.known)})"
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
