"""Shapes every resource shares: the strict input base (with `*_gbps` inputs), pages and problems."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator

GB_PER_S = 1e9  # the *_gbps inputs are GB/s (1e9 bytes/s), converted once here
MAX_BANDWIDTH_BYTES_PER_S = 1e14  # 100 TB/s per GPU: far above any link that exists
MAX_MEMORY_BYTES = 2**44  # 16 TiB: any larger "GPU" or host is a typo
MAX_FLOPS_PER_S = 1e18

T = TypeVar("T")


class Strict(BaseModel):
    """Unknown fields are errors; `X_gbps` is accepted wherever `X_bytes_per_s` is a field."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # finite numbers only

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
            if target in data:
                raise ValueError(f"give either {key} or {target}, not both")
            value = out.pop(key)
            out[target] = value * GB_PER_S if isinstance(value, int | float) else value
        return out


class Page(BaseModel, Generic[T]):
    items: list[T]
    next_cursor: str | None = None


class Problem(BaseModel):
    """RFC 9457 problem details, as every error is rendered."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None
