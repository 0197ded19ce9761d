"""The tuning file's schema (service/catalog/tuning.py): the committed file loads to exactly the
``Tuning`` the former hand-written loader built, and a file that breaks the schema fails naming the key."""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from service.catalog.errors import InvalidCatalogEntry
from service.catalog.tuning import TUNING_TOML, TuningFile, default_tuning, load_tuning, parse_tuning

# Taken with the hand-written loader (commit 8fa3abc) before it was replaced; regenerate it only
# together with a deliberate change to tuning.toml.
FROZEN = Path(__file__).with_name("data") / "tuning_frozen.json"


def _plain(value: object) -> Any:
    # dataclasses by name, enums by class, tuples as lists; json keeps 768 apart from 768.0 and
    # true apart from 1, so equal text is equal values of equal types
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"__type__": type(value).__name__, **fields}
    if isinstance(value, enum.Enum):
        return {"__enum__": type(value).__name__, "value": value.value}
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    assert isinstance(value, str | int | float | bool), type(value)
    return value


def _dump(value: object) -> str:
    return json.dumps(_plain(value), indent=1, ensure_ascii=False) + "\n"


def _data() -> dict[str, Any]:
    return tomllib.loads(TUNING_TOML.read_text())


def test_the_committed_file_loads_exactly_as_the_former_loader_did() -> None:
    assert _dump(load_tuning()) == FROZEN.read_text()
    assert _dump(default_tuning()) == FROZEN.read_text()


def test_the_schema_covers_every_key_of_the_committed_file() -> None:
    # extra="forbid" at every level: validating the file is proof no key is read by nobody
    TuningFile.model_validate(_data())


def _fails(data: dict[str, Any], key: str) -> InvalidCatalogEntry:
    with pytest.raises(InvalidCatalogEntry) as caught:
        parse_tuning(data)
    assert caught.value.kind == "tuning"
    assert caught.value.key == key, caught.value.message
    assert key in caught.value.message
    return caught.value


def test_an_unknown_key_is_refused_by_name() -> None:
    data = _data()
    data["memory"]["cuda_contxt_mib"] = 768  # a typo would otherwise be silently ignored
    error = _fails(data, "memory.cuda_contxt_mib")
    assert "Extra inputs are not permitted" in error.message
    data = _data()
    data["nonsense"] = {"x": 1}
    _fails(data, "nonsense")
    data = _data()
    data["attention_kernel"]["rate"][1]["chips"] = "gh100"
    _fails(data, "attention_kernel.rate[1].chips")


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("memory", "ds_stage0_allreduce_elements"), 5e8),  # an integer key refuses a float
        (("memory", "fsdp_prefetch_layers"), True),
        (("memory", "ddp_gradient_as_bucket_view"), 0),  # a bool refuses a number
        (("links", "intra_node_bus_efficiency"), "0.8"),
        (("kernel_launch", "compiled_kernels_per_layer"), 14.0),
        (("peak_fraction", "default"), True),
    ],
)
def test_a_wrong_type_is_refused_by_name(path: tuple[str, str], value: object) -> None:
    data = _data()
    data[path[0]][path[1]] = value
    _fails(data, ".".join(path))


def test_a_wrong_type_deep_in_an_entry_and_an_unknown_framework_are_named() -> None:
    data = _data()
    data["width"]["points"][2]["factor"] = "0.88"
    _fails(data, "width.points[2].factor")
    data = _data()
    data["overlap"]["dp_by_framework"]["jax"] = True
    _fails(data, "overlap.dp_by_framework.jax")
    data = _data()
    data["kernel_launch"]["kernels_per_layer"]["megatron"] = 12.5
    _fails(data, "kernel_launch.kernels_per_layer.megatron")


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("peak_fraction", "default"), 1.2),
        (("links", "inter_node_bus_efficiency"), 0.0),
        (("overlap", "tp_hidden_fraction"), -0.1),
        (("memory", "fragmentation_fraction"), 1.0),
        (("memory", "cuda_context_mib"), -1),
        (("attention_alignment", "alignment_bytes"), 0),
        (("host", "nvme_bandwidth_bytes_per_s_per_node"), 0),
    ],
)
def test_a_number_out_of_range_is_refused_by_name(path: tuple[str, str], value: object) -> None:
    data = _data()
    data[path[0]][path[1]] = value
    _fails(data, ".".join(path))


def test_an_empty_curve_is_refused() -> None:
    data = _data()
    data["tokens"]["points"] = []
    _fails(data, "tokens.points")


@pytest.mark.parametrize(
    "path",
    [
        ("peak_fraction", "source"),
        ("peak_fraction", "chip", 0, "source"),
        ("width", "source"),
        ("links", "latency_source"),
        ("overlap", "zero3_source"),
        ("host", "nvme_source"),
        ("memory_bound", "fp8_cast_source"),
        ("attention_kernel", "rate", 1, "source"),
        ("kernel_launch", "kernels_source"),
        ("attention_alignment", "unaligned_core_source"),
        ("memory", "qlora_source"),
    ],
)
def test_a_missing_source_is_refused_by_name(path: tuple[str | int, ...]) -> None:
    data = _data()
    table: Any = data
    for part in path[:-1]:
        table = table[part]
    del table[path[-1]]
    key = ".".join(str(p) for p in path).replace(".0.", "[0].").replace(".1.", "[1].")
    error = _fails(data, key)
    assert "Field required" in error.message


def test_every_source_of_the_file_is_required() -> None:
    # each `source` / `*_source` key of the committed file, removed alone, fails
    def paths(node: Any, prefix: tuple[str | int, ...]) -> list[tuple[str | int, ...]]:
        if isinstance(node, dict):
            found = [(*prefix, k) for k in node if k == "source" or k.endswith("_source")]
            for k, v in node.items():
                found += paths(v, (*prefix, k))
            return found
        if isinstance(node, list):
            return [p for i, item in enumerate(node) for p in paths(item, (*prefix, i))]
        return []

    every = paths(_data(), ())
    # the tables' own (the estimate's assumptions), each chip's, each kernel rate's
    assert len(every) == len(default_tuning().sources) + 4 + 2 == 45
    for path in every:
        data = copy.deepcopy(_data())
        table: Any = data
        for part in path[:-1]:
            table = table[part]
        del table[path[-1]]
        with pytest.raises(InvalidCatalogEntry, match=str(path[-1])):
            parse_tuning(data)


def test_a_blank_source_is_refused() -> None:
    data = _data()
    data["memory"]["nccl_source"] = "  "
    _fails(data, "memory.nccl_source")


def test_a_file_that_is_not_toml_fails_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "tuning.toml"
    path.write_text("[memory\n")
    with pytest.raises(InvalidCatalogEntry, match=r"tuning\.toml is not valid TOML"):
        load_tuning(path)
