"""Shapes every resource shares: the strict input base (with `*_gbps` inputs), pages and problems."""

from __future__ import annotations

import enum
import functools
import math
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Generic, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from service.catalog.errors import UnknownCatalogEntry
from service.estimator.scale import MAX_MEMORY_BYTES, MAX_NVME_BYTES

__all__ = ["MAX_MEMORY_BYTES", "MAX_NVME_BYTES"]  # the bounds every memory field shares (16 TiB; 1 PiB)

GB_PER_S = 1e9  # the *_gbps inputs are GB/s (1e9 bytes/s), converted once here
# Physical bounds: no link, memory or chip outside them exists, and values outside them (a denormal
# 5e-324 B/s) would turn a step time into Infinity.
MIN_BANDWIDTH_BYTES_PER_S = 1e6  # 1 MB/s: slower than any PCIe, NVLink or NIC by orders of magnitude
MAX_BANDWIDTH_BYTES_PER_S = 1e14  # 100 TB/s per GPU: far above any link that exists
MIN_MEMORY_BYTES = 2**20  # 1 MiB
MIN_FLOPS_PER_S = 1e9  # 1 GFLOP/s: below any accelerator's
MAX_FLOPS_PER_S = 1e18

T = TypeVar("T")


def _scalar_kinds(annotation: Any) -> set[type]:
    """The scalar types a field's annotation admits (int, float, bool, str), through Optional,
    unions, Annotated and list[...]."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _scalar_kinds(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType, list, tuple):
        return set().union(*(_scalar_kinds(arg) for arg in typing.get_args(annotation)))
    return {annotation} & {int, float, bool, str}


def _enum_types(annotation: Any) -> tuple[type[enum.Enum], ...]:
    """The enums a field's annotation admits, through Optional, unions, Annotated and list[...]."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _enum_types(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType, list, tuple):
        return tuple(kind for arg in typing.get_args(annotation) for kind in _enum_types(arg))
    return (annotation,) if isinstance(annotation, type) and issubclass(annotation, enum.Enum) else ()


# What the frameworks' own configs call our enum values: torch's dtypes (HF's torch_dtype), HF's
# attn_implementation, the projects' names. Read as the value they mean where the field has it.
ENUM_SPELLINGS: dict[str, str] = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "tensorfloat32": "tf32",
    "float8": "fp8",
    "flash_attention_2": "flash",
    "flash_attention_3": "flash",
    "flash_attn": "flash",
    "flash_attention": "flash",
    "megatron_lm": "megatron",
    "megatron_core": "megatron",
    "mcore": "megatron",
    "fsdp2": "fsdp",
    "k8s": "kubernetes",
    # a run's memory statistic by the name of the call or tool that reports it (MemoryStatistic)
    "max_memory_allocated": "allocated",
    "max_allocated": "allocated",
    "memory_allocated": "allocated",
    "max_memory_reserved": "reserved",
    "max_reserved": "reserved",
    "memory_reserved": "reserved",
    "nvidia_smi": "device_used",
    "nvml": "device_used",
    "rocm_smi": "device_used",  # AMD's: the device's used VRAM, as nvidia-smi's on NVIDIA
    "amd_smi": "device_used",
    "mem_get_info": "device_used",
}


def enum_spelling(value: Any, kinds: tuple[type[enum.Enum], ...]) -> Any:
    """``value`` as the enum value it spells ("BF16", "bfloat16", "Megatron-LM", "hf-trainer"): in
    any case, with hyphens or underscores, or as ``ENUM_SPELLINGS`` has it; else as given (pydantic
    then lists the values)."""
    if isinstance(value, list):
        return [enum_spelling(item, kinds) for item in value]
    if not isinstance(value, str):
        return value
    members = {member.value for kind in kinds for member in kind}
    if value in members:
        return value
    plain = value.strip().lower()
    for spelled in (plain, plain.replace("-", "_"), plain.replace("_", "-")):
        spelled = ENUM_SPELLINGS.get(spelled, spelled)
        if spelled in members:
            return spelled
    return value


def is_amount(field: str) -> bool:
    """Whether an integer field is an amount (a token budget, a size in bytes) that people write in
    scientific notation, which JSON carries as a float (Python's json.dumps(15e12) is
    "15000000000000.0"): an integral one is taken. A dimension (seq_len, a batch, a degree, a count
    of layers) is not: 4096.0 there is refused, as a client's bug to hear about."""
    return field == "tokens" or "_bytes" in field


def _integral_float(value: Any) -> bool:
    """A float that is an integer (finite, no fraction). Past 2^53 a double holds only every other
    integer, a rounding no amount is stated to: taken, so that the field's bound names what is
    too large (1e30 tokens was 'expected an integer')."""
    return isinstance(value, float) and value.is_integer()


def _strict_value(value: Any, kinds: set[type]) -> None:
    """JSON's types as the field declares them: no "64" or true for a number, no 64.0 for an
    integer, no 1 for a boolean."""
    if isinstance(value, list):
        for item in value:
            _strict_value(item, kinds)
        return
    if str in kinds or not kinds:
        return
    numeric = kinds & {int, float}
    wrong = isinstance(value, str) or (isinstance(value, bool) and bool not in kinds)
    # 4096.0 is a float in JSON: an integer field refuses it as it refuses "4096" (pydantic's lax
    # mode would take it, and a client sending it has a bug to hear about)
    wrong = wrong or (numeric == {int} and isinstance(value, float))
    if numeric and wrong:
        expected = "an integer" if numeric == {int} else "a number"
        raise ValueError(f"expected {expected}, got {type(value).__name__} {value!r}")
    if kinds == {bool} and not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")


class FieldError(ValueError):
    """A model validator's refusal of one field (two fields that contradict, a field another needs):
    raised in a model validator it would otherwise locate at the model itself ("body"); the problem's
    ``errors`` name ``field`` under the model (``api.problems``)."""

    def __init__(
        self,
        message: str,
        field: str,
        limit: int | None = None,
        details: dict[str, Any] | None = None,
        least: float | None = None,
    ) -> None:
        super().__init__(message)
        self.field = field
        self.limit = limit  # the most the field's quantity may be, where the rule is an upper bound
        self.least = least  # the least it may be, where the rule is a lower bound
        # more of the error entry, as a route's own error would give it (an unknown catalog name's
        # type, candidates, ambiguous and known: ``gpus.unknown_entry_error``)
        self.details = details or {}


def _refuse_unstorable(value: Any, where: str = "") -> None:
    """Values no database column holds, refused everywhere, free-form objects (a model's hf_config)
    included: a NaN or infinity, NUL (0x00), which PostgreSQL text cannot hold and no name or label
    needs, and a lone UTF-16 surrogate (JSON's ``"\\ud800"`` without its pair), which no UTF-8 text
    encodes (stored in a plan's hf_config it was a 500 at the insert; typed string fields refuse it at
    parsing). Inside an object the refusal names the key's path under the field (``FieldError``)."""
    if isinstance(value, str):
        if "\x00" in value:
            _refuse(where, "must not contain the NUL character (U+0000)")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                _refuse(
                    where, "must not contain a lone UTF-16 surrogate (U+D800-U+DFFF): no UTF-8 text holds one"
                )
    elif isinstance(value, float) and not math.isfinite(value):
        # Python's json reads NaN and Infinity, which JSON has not (RFC 8259 6): typed fields refuse them
        # (allow_inf_nan=False), a free-form object's were stored as null (HTTP-semantics review)
        literal = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        _refuse(where, f"must be a finite number: JSON has no {literal} (RFC 8259)")
    elif isinstance(value, dict):
        for key, item in value.items():
            inner = f"{where}.{key}" if where else str(key)
            _refuse_unstorable(key, inner)
            _refuse_unstorable(item, inner)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_unstorable(item, f"{where}[{index}]")


def _refuse(where: str, why: str) -> None:
    if where:
        raise FieldError(why, where)
    raise ValueError(f"the value {why}")


def _accepts_none(annotation: Any) -> bool:
    """Whether a field's annotation admits None (``X | None``, Optional, Any), through Annotated."""
    if annotation is Any or annotation is None or annotation is type(None):
        return True
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _accepts_none(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return any(_accepts_none(arg) for arg in typing.get_args(annotation))
    return False


@functools.cache
def null_means_default(model: type[BaseModel]) -> frozenset[str]:
    """The fields of ``model`` where a JSON null is read as the field left out: those with a default
    (or filled in from the catalog, ``catalog_filled``) whose type has no null of its own. Clients
    that serialise an unset optional field as null (Go, Java and TypeScript encoders do) then get the
    default the answer names, not a 422; a field whose null means something (a PATCH removing a
    figure, a default resolved from the hardware) keeps its null."""
    filled = set(getattr(model, "catalog_filled", ()))
    return frozenset(
        name
        for name, field in model.model_fields.items()
        if (not field.is_required() or name in filled) and not _accepts_none(field.annotation)
    )


def _document_inputs(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """What the OpenAPI schema of a Strict model must say of the inputs its validators accept: the
    `X_gbps` twin of every `X_bytes_per_s` field (with extra="forbid" a schema-validating client or
    gateway refused the README's own examples), and the fields a model fills in before validation
    (``catalog_filled``: a cluster's gpus_per_node, from its catalog part's node) as not required."""
    properties = schema.get("properties", {})
    for name in list(properties):
        if name.endswith("_bytes_per_s"):
            twin = name.removesuffix("_bytes_per_s") + "_gbps"
            properties[twin] = {
                "anyOf": [{"type": "number"}, {"type": "null"}],
                "title": twin,
                "description": f"{name} in GB/s (1e9 bytes/s), instead of it (not both)",
            }
    filled = set(getattr(model, "catalog_filled", ()))
    if filled and "required" in schema:
        schema["required"] = [name for name in schema["required"] if name not in filled]
    # a field whose None means "not sent" and whose null is refused (ClusterPatch): no null branch
    # (a generated client sent the null the schema allowed and got a 422; client-integration review)
    for name in getattr(model, "null_refused", ()):
        prop = properties.get(name)
        if prop is not None and "anyOf" in prop:
            kept = [branch for branch in prop["anyOf"] if branch.get("type") != "null"]
            if len(kept) == 1:
                prop.pop("anyOf")
                prop.update(kept[0])
            else:
                prop["anyOf"] = kept
            if "default" in prop and prop["default"] is None:
                del prop["default"]  # left out, the field keeps its stored value
    # null is read as left out (StrictFields._strict_types, Strict._null_is_left_out)
    for name in null_means_default(model):
        if name in properties:
            properties[name] = _nullable(properties[name])


def _nullable(prop: dict[str, Any]) -> dict[str, Any]:
    """A property's schema that also admits null: its type or reference joined with null, its
    title, description, default and extensions (``x-``: the layout label's marks) kept beside them."""
    outer = {
        key: value
        for key, value in prop.items()
        if key in ("title", "description", "default") or key.startswith("x-")
    }
    inner = {key: value for key, value in prop.items() if key not in outer}
    variants = inner["anyOf"] if list(inner) == ["anyOf"] else [inner]
    return {"anyOf": [*variants, {"type": "null"}], **outer}


def documented_maximum(limit: int) -> Callable[[dict[str, Any]], None]:
    """``json_schema_extra`` documenting ``limit`` as a field's maximum, on the field and on each
    numeric branch of a nullable one: the server refuses past it with its reason (``scale.py``; the
    fields' ``le`` is the same bound, said with that reason: ``problems._PAST_THE_BOUND``); a maximum
    beside an anyOf whose integer branch said another let generated clients accept what the server
    refuses (integrator review)."""

    def document(schema: dict[str, Any]) -> None:
        schema["maximum"] = limit
        for branch in schema.get("anyOf", ()):
            if branch.get("type") in ("integer", "number"):
                branch["maximum"] = limit

    return document


def no_documented_default(schema: dict[str, Any]) -> None:
    """A field's schema without its ``default`` (``json_schema_extra``), for a field whose value left
    out depends on the rest of the request: a generated client sends every documented default, and
    the server would then read the value as given."""
    schema.pop("default", None)


class StrictFields(BaseModel):
    """Unknown fields are errors; numbers and booleans must be JSON numbers and booleans; no string
    holds NUL; `X_gbps` is accepted wherever `X_bytes_per_s` is a field; null for a field with a
    default is its default (``null_means_default``). Without a model validator of its own, so that
    a model of it in a union (``str | CustomGPU``) keeps its name as the union's tag in error
    locations: ``Strict`` is the base of every other input."""

    # finite numbers only; the schema documents the inputs the validators below accept
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra=_document_inputs)

    @field_validator("*", mode="before")
    @classmethod
    def _strict_types(cls, value: Any, info: ValidationInfo) -> Any:
        _refuse_unstorable(value)
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and value is None and info.field_name in null_means_default(cls):
            return field.get_default(call_default_factory=True)
        if field is not None and value is not None:
            kinds_of_scalar = _scalar_kinds(field.annotation)
            if is_amount(info.field_name or "") and kinds_of_scalar & {int} and _integral_float(value):
                return int(value)  # 1e12 tokens, 2e12 bytes: an amount written as JSON's float
            _strict_value(value, kinds_of_scalar)
            kinds = _enum_types(field.annotation)
            if kinds:
                return enum_spelling(value, kinds)
        return value

    @model_validator(mode="before")
    @classmethod
    def _gbps_to_bytes_per_s(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for key in data:
            if not (isinstance(key, str) and key.endswith("_gbps")):
                continue
            target = key.removesuffix("_gbps") + "_bytes_per_s"
            if target not in cls.model_fields:
                continue  # left in place: `extra="forbid"` names it
            if target in data and data[key] is None:
                out.pop(key)  # a null twin beside the field is the twin left out (a generated client's)
                continue
            if target in data and data[target] is not None:
                raise FieldError(f"give either {key} or {target}, not both", key)
            value = out.pop(key)
            if value is None:  # null, as its bytes_per_s twin takes it (a PATCH removing the figure)
                out[target] = None
                continue
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise FieldError(f"{key}: expected a number, got {type(value).__name__} {value!r}", key)
            try:
                out[target] = float(value) * GB_PER_S
            except OverflowError:  # an integer past any float: the field's own rules refuse it (was a 500)
                raise FieldError(
                    f"{key}: a {len(str(value))}-digit number is past any bandwidth", key
                ) from None
        return out


class Strict(StrictFields):
    """``StrictFields``, and a null read as the field left out before any validator of the model
    runs: the field is then not among those sent (``model_fields_set``: "dp left out fills the
    cluster"), and the model's own validators see it absent."""

    @model_validator(mode="wrap")
    @classmethod
    def _null_is_left_out(cls, data: Any, handler: Callable[[Any], Any]) -> Any:
        # a wrap validator of the base runs before every subclass's own "before" validators; a
        # subclass's own wrap validator runs first and calls ``without_nulls`` itself (a cluster's
        # gpus_per_node, filled in from its catalog part where left out)
        return handler(cls.without_nulls(data))

    @classmethod
    def without_nulls(cls, data: Any) -> Any:
        """``data`` less the nulls ``null_means_default`` reads as left out."""
        if isinstance(data, dict) and None in data.values():
            left_out = null_means_default(cls)
            return {key: value for key, value in data.items() if not (value is None and key in left_out)}
        return data


def catalog_slug(value: Any, lookup: Callable[[str], str]) -> Any:
    """A catalog name as its entry's slug (``service.catalog.names.resolve``: "H100 SXM5 80GB" ->
    "h100-sxm-80gb"), so that what is stored and echoed is the catalog's name; anything else (an
    unknown or ambiguous name, which the lookup later refuses naming the field; a custom spec) as given."""
    if not isinstance(value, str):
        return value
    try:
        return lookup(value)
    except UnknownCatalogEntry:
        return value


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = None


class ProblemError(BaseModel):
    """One refused field of a problem: where (``field``, as the request named it: ``training.seq_len``,
    ``query.limit``, ``header.Idempotency-Key``, ``body``) and why, with the rule's own facts where it
    has them; a rule may add others (a name conflict's ``existing_id``). Typed for generated clients,
    which read an untyped item as a bare map (integrator review)."""

    model_config = ConfigDict(extra="allow")

    field: str
    message: str
    type: str | None = Field(default=None, description="the rule broken (pydantic's error type, or ours)")
    rule: str | None = None
    limit: dict[str, float | str] | None = Field(
        default=None,
        description="the bound broken: ge, gt, le, lt, min_length, max_length (a body's: max_bytes)",
    )
    allowed: list[str | int] | None = Field(
        default=None, description="the values an enum or a literal takes (zero_stage's are integers)"
    )
    candidates: list[str] | None = Field(default=None, description="catalog entries an unknown name may mean")
    ambiguous: bool | None = Field(default=None, description="the name names several entries")
    known: list[str] | None = Field(default=None, description="every name the catalog has")


class Problem(BaseModel):
    """RFC 9457 problem details, as every error is rendered."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[ProblemError] | None = None
