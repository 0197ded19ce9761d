"""GPU catalog: read-only, every entry with its source."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.api.deps import CatalogPage, paged
from service.api.problems import PROBLEM_RESPONSES
from service.catalog.gpus import GPUEntry, gpu_entry, gpus
from service.contracts.common import Page
from service.contracts.gpus import GPUOut, PeakFlopsOut
from service.errors import Unprocessable
from service.estimator.clocks import clock_fraction

router = APIRouter(prefix="/v1/gpus", tags=["catalog"], responses=PROBLEM_RESPONSES)


def to_out(entry: GPUEntry) -> GPUOut:
    spec = entry.spec
    peak = spec.peak_flops_per_s
    return GPUOut(
        name=entry.name,
        display_name=entry.display_name,
        vendor=entry.vendor,
        chip=spec.chip,
        flash_attention=spec.flash_attention,
        peer_to_peer=spec.peer_to_peer,
        mesh_links=spec.mesh_links,
        memory_bytes=spec.memory_bytes,
        nominal_memory_bytes=entry.nominal_memory_bytes,
        peak_flops_per_s=PeakFlopsOut(
            fp32=peak.fp32, tf32=peak.tf32, bf16=peak.bf16, fp16=peak.fp16, fp8=peak.fp8
        ),
        hbm_bandwidth_bytes_per_s=spec.hbm_bandwidth_bytes_per_s,
        intra_node_bandwidth_bytes_per_s=spec.intra_node_bandwidth_bytes_per_s,
        pcie_bandwidth_bytes_per_s=spec.pcie_bandwidth_bytes_per_s,
        rated_power_w=spec.rated_power_w,
        power_limit_w=spec.power_limit_w,
        peak_clock_hz=spec.peak_clock_hz,
        sustained_clock_hz=spec.sustained_clock_hz,
        clock_fraction=clock_fraction(spec),
        gpus_per_node=entry.spec.node_gpus,
        node_network_bytes_per_s=spec.node_network_bytes_per_s,
        source=entry.source,
        notes=entry.notes or "",
    )


@router.get("", response_model=Page[GPUOut])
def list_gpus(
    page: CatalogPage,
    vendor: Annotated[str | None, Query(max_length=32, description="nvidia or amd")] = None,
) -> Page[GPUOut]:
    """The catalog (of one vendor), in one page unless `limit` asks for less (it is small)."""
    entries = [gpu_entry(name) for name in gpus()]
    if vendor is not None:
        known = sorted({entry.vendor for entry in entries})
        entries = [entry for entry in entries if entry.vendor == vendor.strip().lower()]
        if not entries:
            message = f"no GPU of vendor {vendor!r}; vendors: {known}"
            raise Unprocessable(
                message, errors=[{"field": "query.vendor", "message": message, "type": "vendor"}]
            )
    shown, next_cursor = paged(entries, page)
    return Page[GPUOut](items=[to_out(entry) for entry in shown], next_cursor=next_cursor)


@router.get("/{name}", response_model=GPUOut)
def get_gpu(name: str) -> GPUOut:
    return to_out(gpu_entry(name))
