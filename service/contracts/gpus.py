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
from service.estimator.errors import InvalidHardware
from service.estimator.types import GPUSpec, PeakFlops

MIN_POWER_W, MAX_POWER_W = 1.0, 10_000.0  # a board power outside these is a typo (a B200 is 1,000 W)
MIN_CLOCK_HZ, MAX_CLOCK_HZ = 1e8, 1e10  # 100 MHz to 10 GHz


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
    # Sustained clocks (service.estimator.clocks). That a limit comes with its rating and stays at or
    # below it is the domain's rule (GPUSpec), reported by to_domain under the field's path.
    rated_power_w: float | None = Field(
        default=None,
        ge=MIN_POWER_W,
        le=MAX_POWER_W,
        description="the board power the peaks are quoted at (H100 SXM5: 700); needed with power_limit_w",
    )
    power_limit_w: float | None = Field(
        default=None,
        ge=MIN_POWER_W,
        le=MAX_POWER_W,
        description="the power limit the GPU runs at (nvidia-smi -pl), at most rated_power_w: the SM clock "
        "falls as the cube root of power_limit_w / rated_power_w and every compute peak with it "
        "(HBM and links keep theirs); the answer's assumptions state the peak used",
    )
    peak_clock_hz: float | None = Field(
        default=None,
        ge=MIN_CLOCK_HZ,
        le=MAX_CLOCK_HZ,
        description="the SM clock behind the peaks (H100 SXM5: 1.83e9); needed with sustained_clock_hz",
    )
    sustained_clock_hz: float | None = Field(
        default=None,
        ge=MIN_CLOCK_HZ,
        le=MAX_CLOCK_HZ,
        description="the SM clock the GPU holds under training load, at most peak_clock_hz: every compute "
        "peak scales by sustained_clock_hz / peak_clock_hz (wins over power_limit_w)",
    )

    @field_validator("chip")
    @classmethod
    def _known_chip(cls, chip: str | None) -> str | None:
        known = known_chips()
        if chip is not None and chip not in known:
            raise ValueError(f"unknown chip {chip!r}; known: {', '.join(known)}")
        return chip

    def to_domain(self, field: str = "gpu") -> GPUSpec:
        """The domain's GPU; its errors name the field as the request body does (``field``: where
        this GPU sits in it)."""
        try:
            return self._to_domain()
        except InvalidHardware as exc:
            located = field if exc.field is None else f"{field}.{exc.field}"
            raise InvalidHardware(exc.message, rule=exc.rule, field=located) from exc

    def _to_domain(self) -> GPUSpec:
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
            rated_power_w=self.rated_power_w,
            power_limit_w=self.power_limit_w,
            peak_clock_hz=self.peak_clock_hz,
            sustained_clock_hz=self.sustained_clock_hz,
        )


def resolve_gpu(gpu: str | CustomGPU, field: str = "gpu") -> GPUSpec:
    """A catalog name or a custom spec -> GPUSpec; an unknown name is a 422 naming the field."""
    if isinstance(gpu, CustomGPU):
        return gpu.to_domain(field)
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
    # sustained clocks (gpus.toml): the rating the peaks are quoted at and the limit the part runs at
    rated_power_w: float | None = Field(
        default=None, description="board power the datasheet peaks are quoted at"
    )
    power_limit_w: float | None = Field(default=None, description="power limit the part runs at")
    peak_clock_hz: float | None = Field(default=None, description="the clock behind the datasheet peaks")
    sustained_clock_hz: float | None = Field(default=None, description="the clock the part holds under load")
    clock_fraction: float = Field(
        default=1.0,
        description="the share of peak_flops_per_s the estimate computes at: sustained / peak clock, else "
        "(power_limit_w / rated_power_w)^(1/3); 1 without either",
    )
    source: str
    notes: str = ""
