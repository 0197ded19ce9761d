"""What a library caller may pass that the API's schemas refuse (library review): non-finite numbers
are domain errors naming the field, and the messages quote the number given."""

from __future__ import annotations

import dataclasses
import math

import pytest

from service.catalog.gpus import gpu
from service.catalog.models import model
from service.estimator.errors import InvalidHardware, InvalidLayout, InvalidModel, InvalidTraining
from service.estimator.types import Framework, Layout, PeakFlops
from service.recommender.types import Constraints


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_non_finite_numbers_are_domain_errors(value: float) -> None:
    with pytest.raises(InvalidLayout) as raised:
        Layout(dp=2, ep=2, moe_capacity_factor=value)
    assert raised.value.field == "moe_capacity_factor" and str(value) in str(raised.value)
    with pytest.raises(InvalidHardware):
        PeakFlops(fp32=value, bf16=1e15)
    with pytest.raises((InvalidHardware, InvalidModel)):
        dataclasses.replace(gpu("h100-sxm-80gb"), memory_bytes=value)
    factors = ((Framework.DEEPSPEED, "data-parallel", value),)
    with pytest.raises(InvalidTraining) as raised:
        Constraints(memory_dynamic_factors=factors)
    assert raised.value.field == "memory_dynamic_factors"


@pytest.mark.parametrize("value", [0.0, -5.0])
def test_a_memory_factor_at_or_below_zero_is_refused(value: float) -> None:
    with pytest.raises(InvalidTraining, match=f"got {value}"):
        Constraints(memory_dynamic_factors=((Framework.FSDP, "data-parallel", value),))


def test_the_messages_quote_the_number_given() -> None:
    moe = model("mixtral-8x7b").spec.moe
    assert moe is not None
    with pytest.raises(InvalidModel, match="got -1"):
        dataclasses.replace(moe, num_shared_experts=-1)
    with pytest.raises(InvalidModel, match=r"\(1\), got 0"):
        dataclasses.replace(moe, num_shared_experts=1, shared_expert_ffn_hidden_size=0)
    with pytest.raises(InvalidTraining, match="got -1"):
        Constraints(gpu_hour_cost=-1)


def test_plain_strings_and_lists_are_refused_by_field() -> None:
    from service.estimator.types import Method, Precision, TrainingSpec

    with pytest.raises(InvalidTraining) as raised:
        TrainingSpec(seq_len=16, global_batch_size=1, precision="bf16")  # type: ignore[arg-type]
    assert raised.value.field == "precision"
    with pytest.raises(InvalidTraining) as raised:
        TrainingSpec(seq_len=16, global_batch_size=1, method=Method.LORA, base_dtype="fp32")  # type: ignore[arg-type]
    assert raised.value.field == "base_dtype"
    with pytest.raises(InvalidTraining) as raised:
        TrainingSpec(seq_len=16, global_batch_size=1, method=Method.LORA, lora_targets=["q_proj"])  # type: ignore[arg-type]
    assert raised.value.field == "lora_targets"
    with pytest.raises(InvalidLayout) as raised:
        Layout(pp=2, pipeline_layers=[8, 8])  # type: ignore[arg-type]
    assert raised.value.field == "pipeline_layers"
    with pytest.raises(InvalidModel) as raised:
        dataclasses.replace(model("gemma-3-1b").spec, layer_types=list(model("gemma-3-1b").spec.layer_types))
    assert raised.value.field == "layer_types"
    assert TrainingSpec(seq_len=16, global_batch_size=1, precision=Precision.FP16).attention is None


def test_more_non_finite_numbers_and_lists_are_refused_by_field() -> None:
    """Change review: NaN host RAM made every layout "not fit in host memory", NaN costs and caps
    passed; lists in GPUSpec's and ModelSpec's tuple fields and a set of hardware_defaults raised
    TypeError deep in the estimate."""
    from service.estimator.types import ClusterSpec, TrainingSpec

    h100 = gpu("h100-sxm-80gb")
    for name in ("cpu_memory_bytes_per_node", "nvme_bytes_per_node"):
        with pytest.raises(InvalidHardware) as raised:
            ClusterSpec(gpu=h100, num_nodes=1, gpus_per_node=8, intra_node_bandwidth_bytes_per_s=4.5e11,
                        inter_node_bandwidth_bytes_per_s=5e10, **{name: math.nan})  # fmt: skip
        assert raised.value.field == name
    for field, value in (("gpu_hour_cost", math.nan), ("max_gpus", math.nan), ("top_k", math.nan)):
        with pytest.raises(InvalidTraining) as raised:
            Constraints(**{field: value})
        assert raised.value.field == field
    with pytest.raises(InvalidHardware) as raised:
        dataclasses.replace(h100, notes=["a note"])
    assert raised.value.field == "notes"
    with pytest.raises(InvalidModel) as raised:
        dataclasses.replace(model("llama-3-8b").spec, config_notes=["a note"])
    assert raised.value.field == "config_notes"
    with pytest.raises(InvalidTraining) as raised:
        TrainingSpec(seq_len=16, global_batch_size=1, hardware_defaults={"precision"})  # type: ignore[arg-type]
    assert raised.value.field == "hardware_defaults"


def test_whole_number_constraints_refuse_floats_and_infinity() -> None:
    for field, value in (("top_k", math.inf), ("max_gpus", 6.5), ("top_k", 2.5), ("max_evaluations", 1e9)):
        with pytest.raises(InvalidTraining) as raised:
            Constraints(**{field: value})
        assert raised.value.field == field
