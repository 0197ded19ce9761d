"""The wire shapes that mirror a domain type name the same fields (issue 26): a field added to
``Layout``, ``ModelSpec``, ``TrainingSpec``, ``ClusterSpec``, ``TimeBreakdown``, ``MemoryBreakdown`` or
``TimeEstimate`` without its wire twin (or the reverse) fails here, instead of being accepted and
ignored or silently dropped."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import BaseModel

from service.contracts.clusters import ClusterPatch, ClusterShape
from service.contracts.estimates import LayoutIn, MemoryPerGPUOut, TimeBreakdownOut, TimeOut
from service.contracts.models import ArchitectureIn
from service.contracts.training import TrainingIn
from service.estimator.types import (
    ClusterSpec,
    Layout,
    MemoryBreakdown,
    ModelSpec,
    TimeBreakdown,
    TimeEstimate,
    TrainingSpec,
)

# domain type, wire type, the fields only the domain has (and why), the fields only the wire has (and why)
MIRRORS: list[tuple[type, type[BaseModel], set[str], set[str]]] = [
    (Layout, LayoutIn, set(), set()),
    # a model's explicit fields: its name is the request's model.name; what a config.json states
    # beside the architecture (its notes, a 4-bit checkpoint) is read off an hf_config only
    (
        ModelSpec,
        ArchitectureIn,
        {
            "name",
            "config_notes",
            "bnb_4bit_checkpoint",
            "bnb_4bit_constant_bits",
            "bnb_4bit_compute_precision",
            "scaled_constants",
            "dequantized_checkpoint",
            "vision_tower",
            "bnb_4bit_float_storage",
        },
        set(),
    ),
    # hardware_defaults: which fields the request left out, derived from the wire's None values;
    # gpu_flash_kernels: read off the GPU the job is placed on (defaults.for_gpu), never sent
    (TrainingSpec, TrainingIn, {"hardware_defaults", "gpu_flash_kernels"}, set()),
    # the cluster a request states (num_gpus: another way to state num_nodes, resolved into it), and
    # the fields a PATCH may change (with the stored one's name; version: the one it was made from)
    (ClusterSpec, ClusterShape, set(), {"num_gpus"}),
    (ClusterSpec, ClusterPatch, set(), {"name", "description", "version"}),
    (TimeBreakdown, TimeBreakdownOut, set(), set()),
    # overhead, the three statistics and total (= device used): sums of the components, properties of
    # the domain type
    (
        MemoryBreakdown,
        MemoryPerGPUOut,
        set(),
        {"overhead", "peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes", "total"},
    ),
    # step_s: the sum of the breakdown, a property of the domain type
    (TimeEstimate, TimeOut, set(), {"step_s"}),
]


@pytest.mark.parametrize(
    ("domain", "wire", "domain_only", "wire_only"), MIRRORS, ids=lambda v: getattr(v, "__name__", "")
)
def test_the_wire_shape_names_every_field_of_its_domain_type(
    domain: type, wire: type[BaseModel], domain_only: set[str], wire_only: set[str]
) -> None:
    fields = {f.name for f in dataclasses.fields(domain)}
    assert fields - set(wire.model_fields) == domain_only
    assert set(wire.model_fields) - fields == wire_only
