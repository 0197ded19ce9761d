"""GPU catalog: ``gpus.toml`` parsed and validated once into estimator ``GPUSpec`` values.

Each entry is a TOML table keyed by its API slug (``h100-sxm-80gb``: product and memory). Values
are SI with the unit in the key (``memory_bytes``, ``peak_bf16_flops_per_s``,
``hbm_bandwidth_bytes_per_s``), peaks are dense (datasheets' 2:4-sparse figures halved), link
bandwidths are per GPU and one direction, and every entry names its ``source`` datasheet. The
conventions, and why each number is what it is, are spelled out in the comments of the TOML file.
The file is read on first use (``functools.cache``), never at import.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType

from service.catalog.errors import InvalidCatalogEntry
from service.catalog.names import resolve
from service.estimator.errors import EstimatorError
from service.estimator.types import GPUSpec, PeakFlops

_DATA_PACKAGE = "service.catalog"
_DATA_FILE = "gpus.toml"
_SLUG = re.compile(r"[a-z0-9]+(?:[.-][a-z0-9]+)*")

# TOML key -> PeakFlops field. fp32 is required; a chip without a precision omits the key.
_PEAK_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "peak_fp32_flops_per_s": "fp32",
        "peak_tf32_flops_per_s": "tf32",
        "peak_bf16_flops_per_s": "bf16",
        "peak_fp16_flops_per_s": "fp16",
        "peak_fp8_flops_per_s": "fp8",
    }
)
_RATE_KEYS = (
    "hbm_bandwidth_bytes_per_s",
    "intra_node_bandwidth_bytes_per_s",
    "pcie_bandwidth_bytes_per_s",
)
_REQUIRED_KEYS = frozenset(
    {"display_name", "chip", "vendor", "memory_bytes", "peak_fp32_flops_per_s", "source", *_RATE_KEYS}
)
# Sustained clocks (service.estimator.clocks): optional, in pairs (a limit and the rating it scales from).
_CLOCK_KEYS = ("rated_power_w", "power_limit_w", "peak_clock_hz", "sustained_clock_hz")
_ALLOWED_KEYS = (
    _REQUIRED_KEYS
    | frozenset(_PEAK_KEYS)
    | frozenset(_CLOCK_KEYS)
    | {"notes", "flash_attention", "peer_to_peer", "gpus_per_node", "node_network_bytes_per_s", "aliases"}
    | {"mesh_links"}
    | {"ecc_reserved_fraction"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUEntry:
    """A catalog GPU: the estimator's spec plus what a listing shows to people."""

    name: str  # the API slug, also spec.name
    display_name: str
    vendor: str
    spec: GPUSpec
    source: str
    notes: str | None = None
    # the memory the part is sold with (its slug's "24gb"); spec.memory_bytes is what a process sees
    # of it (less ECC's share on GDDR6 parts)
    nominal_memory_bytes: int = 0
    aliases: tuple[str, ...] = ()  # other names it goes by (nvidia-smi's), besides display_name


def gpus() -> dict[str, GPUSpec]:
    """Every catalog GPU by slug, in file order (a fresh dict; the parsed catalog stays cached)."""
    return {name: entry.spec for name, entry in _catalog().items()}


def known_chips() -> tuple[str, ...]:
    """The dies of the catalog's GPUs, sorted: what a custom GPU may name as its ``chip``."""
    return tuple(sorted({entry.spec.chip for entry in _catalog().values()}))


# The host link of a x16 slot, one direction, by the figure the catalog uses (gpus.toml's conventions:
# the vendor's bidirectional "32/64/128 GB/s" halved).
PCIE_X16 = MappingProxyType({16e9: "PCIe Gen3 x16", 32e9: "PCIe Gen4 x16", 64e9: "PCIe Gen5 x16"})


def slowest_host_link(chip: str | None) -> tuple[float, tuple[str, ...]]:
    """The slowest PCIe host link among the catalog's parts of the die ``chip`` (of every part where
    None), and the parts that have it: what a custom GPU that does not state its own is assumed to
    have. The host interface is on the die (every catalog part of a die shares one generation)."""
    specs = [spec for spec in gpus().values() if chip is None or spec.chip == chip]
    slowest = min(spec.pcie_bandwidth_bytes_per_s for spec in specs)
    return slowest, tuple(spec.name for spec in specs if spec.pcie_bandwidth_bytes_per_s == slowest)


def gpu_entries() -> tuple[GPUEntry, ...]:
    """Every catalog entry, in file order."""
    return tuple(_catalog().values())


def gpu_entry(name: str) -> GPUEntry:
    """The entry ``name`` names: its slug, or its published name or words only it carries
    (``names.resolve``: "H100 SXM5 80GB", "4090"); UnknownCatalogEntry otherwise."""
    catalog = _catalog()
    found = catalog.get(name)
    return found if found is not None else catalog[resolve("gpu", name, _aliases())]


@cache
def _aliases() -> dict[str, tuple[str, ...]]:
    return {slug: (entry.display_name, *entry.aliases) for slug, entry in _catalog().items()}


def gpu(name: str) -> GPUSpec:
    return gpu_entry(name).spec


@cache
def _catalog() -> Mapping[str, GPUEntry]:
    text = resources.files(_DATA_PACKAGE).joinpath(_DATA_FILE).read_text(encoding="utf-8")
    return MappingProxyType(_parse_gpus(text))


def _parse_gpus(text: str) -> dict[str, GPUEntry]:
    """Parse and validate the text of a GPU catalog; raises InvalidCatalogEntry naming entry and key."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise InvalidCatalogEntry(f"gpu catalog is not valid TOML: {error}", kind="gpu") from error
    if not document:
        raise InvalidCatalogEntry("gpu catalog has no entries", kind="gpu")
    return {name: _parse_entry(name, table) for name, table in document.items()}


def _parse_entry(name: str, table: object) -> GPUEntry:
    if not _SLUG.fullmatch(name):
        raise _invalid(name, None, "the name must be a lowercase slug such as 'h100-sxm-80gb'")
    if not isinstance(table, dict):
        raise _invalid(name, None, f"expected a table of keys, got {type(table).__name__}")
    _check_keys(name, table)
    vendor = _slug(name, table, "vendor")
    peaks = {field: _number(name, table, key) for key, field in _PEAK_KEYS.items() if key in table}
    clocks = {key: _number(name, table, key) for key in _CLOCK_KEYS if key in table}
    source = _text(name, table, "source")
    try:
        spec = GPUSpec(
            name=name,
            memory_bytes=_usable_memory(name, table),
            peak_flops_per_s=PeakFlops(**peaks),
            hbm_bandwidth_bytes_per_s=_number(name, table, "hbm_bandwidth_bytes_per_s"),
            intra_node_bandwidth_bytes_per_s=_number(name, table, "intra_node_bandwidth_bytes_per_s"),
            pcie_bandwidth_bytes_per_s=_number(name, table, "pcie_bandwidth_bytes_per_s"),
            vendor=vendor,
            chip=_slug(name, table, "chip"),
            flash_attention=_flag(name, table, "flash_attention", True),
            peer_to_peer=_flag(name, table, "peer_to_peer", True),
            source=source,
            rated_power_w=clocks.get("rated_power_w"),
            power_limit_w=clocks.get("power_limit_w"),
            peak_clock_hz=clocks.get("peak_clock_hz"),
            sustained_clock_hz=clocks.get("sustained_clock_hz"),
            node_network_bytes_per_s=_node_network(name, table),
            node_gpus=_integer(name, table, "gpus_per_node") if "gpus_per_node" in table else None,
            mesh_links=_integer(name, table, "mesh_links") if "mesh_links" in table else None,
        )
    except EstimatorError as error:
        key = _toml_key(error.field)
        # Quote the key as the file spells it, not the GPUSpec field path.
        message = error.message.replace(error.field, key) if error.field and key else error.message
        raise _invalid(name, key, message) from error
    return GPUEntry(
        name=name,
        display_name=_text(name, table, "display_name"),
        vendor=vendor,
        spec=spec,
        source=source,
        notes=_text(name, table, "notes") if "notes" in table else None,
        nominal_memory_bytes=_integer(name, table, "memory_bytes"),
        aliases=_names(name, table, "aliases"),
    )


def _names(name: str, table: dict[str, object], key: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise _invalid(name, key, f"{key} must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def _usable_memory(name: str, table: dict[str, object]) -> int:
    """The memory a process sees: ``memory_bytes`` less what ECC reserves where the part keeps its
    check bits in the same GDDR6 (``ecc_reserved_fraction``, on by default on data-center GDDR6
    cards: 1/16, nvidia-smi's total 23034 MiB of an L4's 24 GiB). HBM's ECC is on extra dies."""
    memory = _integer(name, table, "memory_bytes")
    if "ecc_reserved_fraction" not in table:
        return memory
    fraction = _number(name, table, "ecc_reserved_fraction")
    if not 0.0 < fraction < 0.5:
        raise _invalid(name, "ecc_reserved_fraction", f"must be in (0, 0.5), got {fraction}")
    return round(memory * (1.0 - fraction))


def _node_network(name: str, table: dict[str, object]) -> float | None:
    if "node_network_bytes_per_s" not in table:
        return None
    if "gpus_per_node" not in table:
        why = "node_network_bytes_per_s describes the part's node: give gpus_per_node"
        raise _invalid(name, "node_network_bytes_per_s", why)
    return _number(name, table, "node_network_bytes_per_s")


def _slug(name: str, table: dict[str, object], key: str) -> str:
    value = _text(name, table, key)
    if not _SLUG.fullmatch(value):
        raise _invalid(
            name, key, f"{key} must be a lowercase slug such as 'nvidia' or 'gh100', got {value!r}"
        )
    return value


def _check_keys(name: str, table: dict[str, object]) -> None:
    """Unknown keys are typos (``peak_bf16_tflops``) that would silently drop a value: reject them."""
    unknown = sorted(set(table) - _ALLOWED_KEYS)
    if unknown:
        raise _invalid(
            name,
            unknown[0],
            f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
            f"(allowed: {', '.join(sorted(_ALLOWED_KEYS))})",
        )
    missing = sorted(_REQUIRED_KEYS - set(table))
    if missing:
        raise _invalid(
            name,
            missing[0],
            f"missing required key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}",
        )


def _flag(name: str, table: dict[str, object], key: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise _invalid(name, key, f"must be true or false, got {value!r}")
    return value


def _text(name: str, table: dict[str, object], key: str) -> str:
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        raise _invalid(name, key, f"{key} must be a non-empty string, got {value!r}")
    return value


def _number(name: str, table: dict[str, object], key: str) -> float:
    value = table[key]
    # bool is an int subclass; `true` is never a bandwidth.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid(name, key, f"{key} must be a number, got {value!r}")
    return float(value)


def _integer(name: str, table: dict[str, object], key: str) -> int:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid(name, key, f"{key} must be an integer (bytes), got {value!r}")
    return value


def _toml_key(field: str | None) -> str | None:
    """Map a GPUSpec field path from an estimator error back to the TOML key that set it."""
    prefix = "peak_flops_per_s."
    if field is not None and field.startswith(prefix):
        return f"peak_{field.removeprefix(prefix)}_flops_per_s"
    return field


def _invalid(name: str, key: str | None, problem: str) -> InvalidCatalogEntry:
    return InvalidCatalogEntry(f"gpu {name!r}: {problem}", kind="gpu", entry=name, key=key)
