"""GPUs: the catalog's entries, and a GPU given by catalog name or as a custom spec."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from service.catalog.errors import UnknownCatalogEntry
from service.catalog.gpus import gpu as catalog_gpu
from service.catalog.gpus import known_chips
from service.contracts.common import (
    MAX_BANDWIDTH_BYTES_PER_S,
    MAX_FLOPS_PER_S,
    MAX_MEMORY_BYTES,
    MIN_BANDWIDTH_BYTES_PER_S,
    MIN_FLOPS_PER_S,
    MIN_MEMORY_BYTES,
    Strict,
)
from service.errors import Unprocessable
from service.estimator.types import GPUSpec, PeakFlops


class PeakFlopsIn(Strict):
    fp32: float = Field(ge=MIN_FLOPS_PER_S, le=MAX_FLOPS_PER_S)
    tf32: float | None = Field(default=None, ge=MIN_FLOPS_PER_S, le=MAX_FLOPS_PER_S)
    bf16: float | None = Field(default=None, ge=MIN_FLOPS_PER_S, le=MAX_FLOPS_PER_S)
    fp16: float | None = Field(default=None, ge=MIN_FLOPS_PER_S, le=MAX_FLOPS_PER_S)
    fp8: float | None = Field(default=None, ge=MIN_FLOPS_PER_S, le=MAX_FLOPS_PER_S)


class CustomGPU(Strict):
    """A GPU that is not in the catalog: every field but ``chip`` is required (peaks dense, not sparse)."""

    name: str = Field(min_length=1, max_length=100)
    chip: str | None = Field(
        default=None,
        max_length=32,
        description="the GPU die, one of the catalog's chips: gh100 for an H800, H20 or GH200, ga100 for an "
        "A800 or A30, ad102 for an L20 or L40, gb100 for a B100 or GB200 (gpus.toml lists more); picks the "
        "efficiency fitted on that silicon. Absent: the most conservative fitted efficiency (the lowest "
        "GEMM peak fraction of any die, attention at its kernel's slowest published rate), with a "
        "warning, so the part is never estimated faster than a catalog part with the same peaks.",
    )
    memory_bytes: int = Field(ge=MIN_MEMORY_BYTES, le=MAX_MEMORY_BYTES)
    peak_flops_per_s: PeakFlopsIn
    hbm_bandwidth_bytes_per_s: float = Field(ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S)
    intra_node_bandwidth_bytes_per_s: float = Field(
        ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S
    )
    pcie_bandwidth_bytes_per_s: float = Field(ge=MIN_BANDWIDTH_BYTES_PER_S, le=MAX_BANDWIDTH_BYTES_PER_S)
    flash_attention: bool = Field(
        default=True,
        description="FlashAttention-2 kernels exist for it (NVIDIA Ampere or newer, AMD CDNA 2/3)",
    )

    @field_validator("chip")
    @classmethod
    def _known_chip(cls, chip: str | None) -> str | None:
        known = known_chips()
        if chip is not None and chip not in known:
            raise ValueError(f"unknown chip {chip!r}; known: {', '.join(known)}")
        return chip

    def to_domain(self) -> GPUSpec:
        return GPUSpec(
            name=self.name,
            memory_bytes=self.memory_bytes,
            peak_flops_per_s=PeakFlops(**self.peak_flops_per_s.model_dump()),
            hbm_bandwidth_bytes_per_s=self.hbm_bandwidth_bytes_per_s,
            intra_node_bandwidth_bytes_per_s=self.intra_node_bandwidth_bytes_per_s,
            pcie_bandwidth_bytes_per_s=self.pcie_bandwidth_bytes_per_s,
            vendor="custom",
            chip=self.chip or "",
            flash_attention=self.flash_attention,
            source="supplied by the client",
        )


def resolve_gpu(gpu: str | CustomGPU, field: str = "gpu") -> GPUSpec:
    """A catalog name or a custom spec -> GPUSpec; an unknown name is a 422 naming the field."""
    if isinstance(gpu, CustomGPU):
        return gpu.to_domain()
    try:
        return catalog_gpu(gpu)
    except UnknownCatalogEntry as exc:
        raise Unprocessable(
            str(exc),
            errors=[{"field": field, "message": str(exc), "type": "unknown_gpu", "known": list(exc.known)}],
        ) from exc


class PeakFlopsOut(BaseModel):
    fp32: float
    tf32: float | None
    bf16: float | None
    fp16: float | None
    fp8: float | None


class GPUOut(BaseModel):
    name: str
    display_name: str
    vendor: str
    chip: str
    flash_attention: bool
    memory_bytes: int
    peak_flops_per_s: PeakFlopsOut
    hbm_bandwidth_bytes_per_s: float
    intra_node_bandwidth_bytes_per_s: float
    pcie_bandwidth_bytes_per_s: float
    source: str
    notes: str = ""
