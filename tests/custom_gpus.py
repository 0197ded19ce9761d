"""Parts outside the catalog, described as a request's custom GPU (cluster.gpu as an object) from their
datasheets' dense peaks, for the tests that plan on them."""

from __future__ import annotations

from typing import Any

# GB200's GPU (NVIDIA GB200 NVL72 datasheet: 2.5 PFLOPS dense bf16, 5 fp8 per GPU; 186 GB HBM3E at
# 8 TB/s), its links left out: the PCIe host link is assumed between a tray's GPUs
GB200: dict[str, Any] = {
    "name": "gb200",
    "chip": "gb200",
    "memory_bytes": 186 * 10**9,
    "peak_flops_per_s": {"fp32": 80e12, "bf16": 2.5e15, "fp16": 2.5e15, "fp8": 5e15},
    "hbm_bandwidth_bytes_per_s": 8e12,
}
# ... with its NVLink 5 (1.8 TB/s bidirectional: 900e9 per direction)
GB200_NVLINK: dict[str, Any] = GB200 | {"intra_node_bandwidth_bytes_per_s": 900e9}

# AMD Instinct MI325X (datasheet: the MI300X's CDNA 3 peaks; 256 GB HBM3E at 6 TB/s), Infinity Fabric as
# the MI300X's (7 x 64e9 per direction)
MI325X: dict[str, Any] = {
    "name": "lab-mi325x",
    "chip": "cdna3",
    "memory_bytes": 256 * 2**30,
    "peak_flops_per_s": {"fp32": 163.4e12, "bf16": 1307.4e12, "fp16": 1307.4e12, "fp8": 2614.9e12},
    "hbm_bandwidth_bytes_per_s": 6e12,
    "intra_node_bandwidth_bytes_per_s": 448e9,
}

# NVIDIA H20 (a GH100 with 148 TFLOPS dense bf16, 296 fp8; 96 GB HBM3 at 4.0 TB/s; NVLink 900 GB/s)
H20: dict[str, Any] = {
    "name": "lab-h20-96gb",
    "chip": "h20",
    "memory_bytes": 96 * 2**30,
    "peak_flops_per_s": {"fp32": 44e12, "bf16": 148e12, "fp16": 148e12, "fp8": 296e12},
    "hbm_bandwidth_bytes_per_s": 4.0e12,
    "intra_node_bandwidth_bytes_per_s": 450e9,
}
