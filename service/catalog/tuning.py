"""Load ``tuning.toml`` (achievable efficiency, link efficiency, overlap, host rates) into the
estimator's ``Tuning``. Parsed once and cached; nothing is read at import."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import Any

from service.estimator.tuning import AttentionKernelRate, CurvePoint, MemoryAssumptions, Tuning
from service.estimator.types import Framework

TUNING_TOML = Path(__file__).with_name("tuning.toml")


def _points(table: dict[str, Any], key: str = "points") -> tuple[CurvePoint, ...]:
    return tuple(CurvePoint(x=float(p["x"]), factor=float(p["factor"])) for p in table[key])


def _attention_kernel_rates(table: dict[str, Any]) -> tuple[AttentionKernelRate, ...]:
    return tuple(
        AttentionKernelRate(
            kernel=str(rate["kernel"]),
            chip=str(rate["chip"]),
            forward_points=_points(rate, "forward"),
            backward_points=_points(rate, "backward"),
            backward_flops_per_forward=float(rate["backward_flops_per_forward"]),
        )
        for rate in table.get("rate", [])
    )


def _sources(data: dict[str, Any]) -> tuple[str, ...]:
    # every `source` / `*_source` string in the file, in order, for the estimate's assumptions
    found: list[str] = []
    for section in data.values():
        if isinstance(section, dict):
            found += [str(v) for k, v in section.items() if k == "source" or k.endswith("_source")]
    return tuple(found)


def _memory(table: dict[str, Any]) -> MemoryAssumptions:
    mib = 2**20
    return MemoryAssumptions(
        cuda_context_bytes=int(table["cuda_context_mib"] * mib),
        nccl_bytes_per_group=int(table["nccl_mib_per_group"] * mib),
        fragmentation_fraction=float(table["fragmentation_fraction"]),
        ddp_gradient_as_bucket_view=bool(table["ddp_gradient_as_bucket_view"]),
        ds_stage0_allreduce_elements=int(table["ds_stage0_allreduce_elements"]),
        fsdp_prefetch_layers=int(table["fsdp_prefetch_layers"]),
        adam_8bit_block_elements=int(table["adam_8bit_block_elements"]),
        qlora_bits_per_param=float(table["qlora_bits_per_param"]),
        cpu_adam_grad_bytes=int(table["cpu_adam_grad_bytes"]),
    )


def parse_tuning(data: dict[str, Any]) -> Tuning:
    """Build the tuning from a parsed TOML document (same layout as ``tuning.toml``)."""
    peak, links, overlap, host = data["peak_fraction"], data["links"], data["overlap"], data["host"]
    return Tuning(
        peak_fraction_by_chip=tuple((g["chip"], float(g["fraction"])) for g in peak.get("chip", [])),
        default_peak_fraction=float(peak["default"]),
        width_points=_points(data["width"]),
        tokens_points=_points(data["tokens"]),
        intra_node_bus_efficiency=float(links["intra_node_bus_efficiency"]),
        inter_node_bus_efficiency=float(links["inter_node_bus_efficiency"]),
        intra_node_latency_s=float(links["intra_node_latency_s"]),
        inter_node_latency_s=float(links["inter_node_latency_s"]),
        collective_base_latency_s=float(links["collective_base_latency_s"]),
        dp_overlap_by_framework=tuple((Framework(k), bool(v)) for k, v in overlap["dp_by_framework"].items()),
        dp_overlap_max_hidden_fraction=float(overlap["dp_max_hidden_fraction"]),
        tp_overlap_hidden_fraction=float(overlap["tp_hidden_fraction"]),
        zero3_prefetch_hidden_fraction=float(overlap["zero3_prefetch_hidden_fraction"]),
        activation_offload_hidden_fraction=float(overlap["activation_offload_hidden_fraction"]),
        memory_traffic_per_stored_byte=float(data["memory_bound"]["traffic_per_stored_byte"]),
        eager_traffic_factor=float(data["memory_bound"]["eager_traffic_factor"]),
        loss_traffic_bytes_per_logit=float(data["memory_bound"]["loss_traffic_bytes_per_logit"]),
        compiled_loss_traffic_bytes_per_logit=float(
            data["memory_bound"]["compiled_loss_traffic_bytes_per_logit"]
        ),
        fp8_cast_bytes_per_element=float(data["memory_bound"]["fp8_cast_bytes_per_element"]),
        fp8_transposed_cast_bytes_per_element=float(
            data["memory_bound"]["fp8_transposed_cast_bytes_per_element"]
        ),
        selective_recompute_passes=float(data["memory_bound"]["selective_recompute_passes"]),
        attention_alignment_bytes=int(data["attention_alignment"]["alignment_bytes"]),
        unaligned_attention_core_factor=float(data["attention_alignment"]["unaligned_core_factor"]),
        attention_kernel_by_framework=tuple(
            (Framework(k), str(v)) for k, v in data["attention_kernel"]["framework"].items()
        ),
        attention_kernel_rates=_attention_kernel_rates(data["attention_kernel"]),
        kernel_launch_s=float(data["kernel_launch"]["launch_s"]),
        kernels_per_layer_by_framework=tuple(
            (Framework(k), int(v)) for k, v in data["kernel_launch"]["kernels_per_layer"].items()
        ),
        compiled_kernels_per_layer=int(data["kernel_launch"]["compiled_kernels_per_layer"]),
        cpu_adam_params_per_s_per_node=float(host["cpu_adam_params_per_s_per_node"]),
        torch_cpu_adam_slowdown=float(host["torch_cpu_adam_slowdown"]),
        nvme_bandwidth_bytes_per_s_per_node=float(host["nvme_bandwidth_bytes_per_s_per_node"]),
        memory=_memory(data["memory"]),
        sources=_sources(data),
    )


def load_tuning(path: Path = TUNING_TOML) -> Tuning:
    with path.open("rb") as f:
        return parse_tuning(tomllib.load(f))


@functools.cache
def default_tuning() -> Tuning:
    """The packaged tuning, parsed once."""
    return load_tuning()
