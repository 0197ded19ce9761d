"""Memory against published numbers (shared/reference/cases/visible.json), the seed article's errata
and the activation bytes measured on real Hugging Face models (validation/data/activations.json)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from service.estimator import activations
from service.estimator.params import LayerKind, parameter_counts
from service.estimator.types import (
    Framework,
    Layout,
    Offload,
    Precision,
    Recompute,
    TrainingSpec,
)
from tests.estimator.helpers import fits, memory, states
from validation import cases as reference
from validation import published_formulas
from validation.cases import (
    CASES_PATH,
    DEEPSPEED_ZERO2_CASES,
    DEEPSPEED_ZERO3_CASES,
    ERRATUM_PURE_DP_DEGREES,
    GB,
    GPT_22B,
    KORTHIKANTI_SBH,
    KORTHIKANTI_TABLE2,
    LLAMA_2_7B,
    LLAMA_2_13B,
    T5_3B,
    T5_3B_LARGEST,
    GiB,
    activation_estimates,
    deepspeed_tutorial_zero1_optimizer_gb,
    erratum_7b_pure_data_parallel,
    erratum_7b_zero2_on_8x24gb,
    erratum_13b_zero3_on_4x32gb,
    flat_model,
    gib,
    gpu,
    korthikanti_table2_inputs,
    measured_cases,
    megatron_unit_test1_bytes,
    t5_large_worked_example_mb,
    zero3_options,
    zero_states_gb,
)
from validation.cases import single_node as cluster
from validation.published_formulas import (
    deepspeed_zero2_estimate,
    deepspeed_zero3_estimate,
    megatron_weight_and_optimizer_bytes,
)

DENSE = LayerKind(moe=False)  # a dense decoder layer with full attention


def cases(prefix: str) -> list[dict[str, Any]]:
    if not CASES_PATH.exists():
        pytest.skip(f"{CASES_PATH} not available")
    return reference.published_cases(prefix)


# ---------------------------------------------------------------- ZeRO paper


@pytest.mark.parametrize("case", cases("zero-table1-"), ids=lambda c: c["id"])
def test_zero_table1(case: dict[str, Any]) -> None:
    # Paper: 4Ψ + 12Ψ/Nd, 2Ψ + 14Ψ/Nd, 16Ψ/Nd in GB = 1e9, truncated: within 0.1 GB or 1%.
    psi, dp = int(case["model"]["params"]), case["training"]["dp"]
    for column, stage in reference.ZERO_TABLE1_COLUMNS:
        reported = case["reported"]["per_device_model_state_memory_GB"][column]
        assert zero_states_gb(psi, dp, stage) == pytest.approx(reported, abs=max(0.1, 0.01 * reported)), (
            column
        )


def test_zero_figure1() -> None:
    (case,) = cases("zero-figure1")
    psi, r = int(case["model"]["params"]), case["reported"]
    assert zero_states_gb(psi, 64, 0) == pytest.approx(r["baseline_GB"], rel=0.01)
    for key, stage in reference.ZERO_FIGURE1_KEYS:
        assert zero_states_gb(psi, 64, stage) == pytest.approx(r[key], abs=max(0.1, 0.01 * r[key])), key


def test_deepspeed_tutorial_zero1_optimizer_per_device() -> None:
    (case,) = cases("deepspeed-tutorial-zero1")
    # Adam states 12 x 1.5e9 = 18 GB, over 8 GPUs = 2.25 GB.
    assert (
        deepspeed_tutorial_zero1_optimizer_gb()
        == case["reported"]["per_device_optimizer_memory_with_zero1_GB"]
    )


# ---------------------------------------------------------------- DeepSpeed's estimators


@pytest.mark.parametrize(("case_id", "params"), DEEPSPEED_ZERO2_CASES)
def test_deepspeed_zero2_estimates(case_id: str, params: int) -> None:
    (case,) = cases(case_id)
    offload = case["reported"]["offload_optimizer=cpu"]
    gpu_bytes, cpu_bytes = deepspeed_zero2_estimate(params, 8, 1, cpu_offload=True)
    assert (gib(gpu_bytes), gib(cpu_bytes)) == (offload["per_GPU_GB"], offload["per_CPU_GB"])
    none = case["reported"]["offload_optimizer=none"]
    # The docs' 15.93 predates PR #5099 (4P + 16P/G); today's code gives 2P + 18P/G = 11.28.
    gpu_bytes, cpu_bytes = deepspeed_zero2_estimate(params, 8, 1, cpu_offload=False, legacy=True)
    assert (gib(gpu_bytes), gib(cpu_bytes)) == (none["per_GPU_GB"], none["per_CPU_GB"])
    current = gib(deepspeed_zero2_estimate(params, 8, 1, cpu_offload=False)[0])
    assert current == (11.28 if params == 2_851_000_000 else 11.29)  # visible.json notes 11.28 (cold)


@pytest.mark.parametrize(("case_id", "params", "largest"), DEEPSPEED_ZERO3_CASES)
def test_deepspeed_zero3_estimates(case_id: str, params: int, largest: int) -> None:
    (case,) = cases(case_id)
    for key, reported in case["reported"].items():
        gpu_bytes, cpu_bytes = deepspeed_zero3_estimate(params, largest, 8, 1, **zero3_options(key))
        assert (gib(gpu_bytes), gib(cpu_bytes)) == (reported["per_GPU_GB"], reported["per_CPU_GB"]), key


def test_deepspeed_t5_large_worked_example() -> None:
    (case,) = cases("deepspeed-doc-t5-large")
    r, ours = case["reported"], t5_large_worked_example_mb()
    assert ours["largest_layer_memory_MB"] == r["largest_layer_memory_MB"]
    assert (
        ours["case1_no_offload_gpu_MB"],
        ours["case2_offload_param_and_optimizer_gpu_MB"],
        ours["case3_offload_optimizer_only_gpu_MB"],
    ) == (
        r["case1_no_offload_gpu_MB"],
        r["case2_offload_param_and_optimizer_gpu_MB"],
        r["case3_offload_optimizer_only_gpu_MB"],
    )


def test_deepspeed_estimator_cross_checks_our_offload_host_bytes() -> None:
    # Steady state (zero.Init, one node): DeepSpeed's host = 16P x 1.5 buffer factor; ours is the
    # 16P itself (fp32 master + moments 12P + fp32 gradient copy 4P), summed over the node.
    model, counts = flat_model(T5_3B)
    training = TrainingSpec(seq_len=512, global_batch_size=8, precision=Precision.FP16)
    lay = Layout(dp=8, zero_stage=3, offload_optimizer=Offload.CPU)
    c = cluster(gpu("a100", 80 * GiB), 8)
    host = 8 * reference.flat_model_states(model, counts, c, lay, training).host_bytes
    _, ds_cpu = deepspeed_zero3_estimate(T5_3B, T5_3B_LARGEST, 8, cpu_offload=True, cpu_offload_params=False)
    assert host == pytest.approx(ds_cpu / 1.5, rel=1e-9)


# ---------------------------------------------------------------- Megatron-LM


def test_megatron_unit_test_weight_and_optimizer_memory() -> None:
    cases("megatron-unit-test")  # skip without the reference file
    # test1: ((896/2 + 256)/2 + 72/2) x (6 + 12/16) + (1024/2/(4x2)) x (6 + 12/4) = 2619 + 576.
    got = megatron_unit_test1_bytes()
    assert got == 3195


def test_megatron_formula_agrees_with_our_megatron_model_states() -> None:
    model = LLAMA_2_7B
    counts, training = parameter_counts(model), TrainingSpec(seq_len=4096, global_batch_size=64)
    for dist in (False, True):
        # the formula counts Megatron-LM's own default, fp32 main grads
        lay = Layout(
            framework=Framework.MEGATRON,
            dp=4,
            tp=2,
            zero_stage=int(dist),
            grad_reduce_in_fp32=True,
            precision_aware_optimizer=False,  # the formula counts Megatron's own fp32 master
        )
        s = states(model, cluster(gpu("h100", 80 * GiB), 8), lay, training)
        ref = megatron_weight_and_optimizer_bytes(counts, tp=2, pp=1, dp=4, distributed_optimizer=dist)
        assert s.parameters + s.gradients + s.optimizer_states == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize(
    ("tp", "sp", "recompute", "per_sbh"),
    [row[1:] for row in KORTHIKANTI_TABLE2],
    ids=[row[0] for row in KORTHIKANTI_TABLE2],
)
def test_korthikanti_table2_rows_exact(tp: int, sp: bool, recompute: Recompute, per_sbh: float) -> None:
    sbh = KORTHIKANTI_SBH
    lay, training = korthikanti_table2_inputs(tp, sp, recompute)
    per_layer = activations.layer_bytes(GPT_22B, lay, training, DENSE, lay.recompute)
    assert per_layer == pytest.approx(per_sbh * sbh, rel=1e-12)
    if recompute is not Recompute.FULL:
        published = published_formulas.korthikanti_layer_bytes(
            s=2048, b=4, h=6144, a=64, t=tp, sequence_parallel=sp, selective=recompute is Recompute.SELECTIVE
        )
        assert published == pytest.approx(per_sbh * sbh, rel=1e-12)


def test_selective_recompute_saves_70_percent_for_gpt3() -> None:
    # GPT-3: a 96, s 2048, h 12288 -> 5as/h = 80; selective keeps 34 of 114: saves 70%.
    full = published_formulas.korthikanti_layer_bytes(s=2048, b=1, h=12288, a=96, t=8, sequence_parallel=True)
    selective = published_formulas.korthikanti_layer_bytes(
        s=2048, b=1, h=12288, a=96, t=8, sequence_parallel=True, selective=True
    )
    assert 1 - selective / full == pytest.approx(80 / 114)


def test_megatron_theoretical_activation_formula() -> None:
    # SP + selective, pp 1: L x 34sbh (18 + 4 x 4h/h) + 8sb + sbh + 4sbh(1 + V/h), all / tp.
    s, b, h, layers, v, t = 2048, 1, 4096, 2, 51200, 2
    sbh = s * b * h
    expected = (layers * 34 * sbh + 8 * s * b + sbh + 4 * sbh * (1 + v / h)) / t
    got = published_formulas.megatron_theoretical_activation_bytes(
        seq_length=s, micro_batch_size=b, hidden_size=h, ffn_hidden_size=4 * h, num_layers=layers,
        padded_vocab_size=v, tp=t, pp=1, sequence_parallel=True, selective_recompute=True,
    )  # fmt: skip
    assert got == expected
    # Without SP: L sbh (10 + 24/t) + 8sb + sbh + 2(sbV/t + sbh), x 1.05, not divided by tp.
    expected = (layers * sbh * (10 + 24 / t) + 8 * s * b + sbh + 2 * (s * b * v / t + sbh)) * 1.05
    got = published_formulas.megatron_theoretical_activation_bytes(
        seq_length=s, micro_batch_size=b, hidden_size=h, ffn_hidden_size=4 * h, num_layers=layers,
        padded_vocab_size=v, tp=t, pp=1,
    )  # fmt: skip
    assert got == pytest.approx(expected)
    # pp 4 with 2 micro-batches in flight of 4: x min(1, 2/4); interleaved v 2: x (1 + 3/8).
    common = dict(seq_length=s, micro_batch_size=b, hidden_size=h, ffn_hidden_size=4 * h, num_layers=8,
                  padded_vocab_size=v, tp=1)  # fmt: skip
    base = 8 * sbh * 34 + 8 * s * b * 4 + sbh * 4
    assert published_formulas.megatron_theoretical_activation_bytes(
        **common, pp=4, num_microbatches=2, sequence_parallel=True, selective_recompute=True
    ) == pytest.approx(base / 2)
    assert published_formulas.megatron_theoretical_activation_bytes(
        **common, pp=4, virtual_pp=2, sequence_parallel=True, selective_recompute=True
    ) == pytest.approx(base * 1.375)


# ---------------------------------------------------------------- the seed article's errata


def test_erratum_7b_zero2_on_8x24gb_does_not_fit_without_offload() -> None:
    p = parameter_counts(LLAMA_2_7B).total
    model, c, lay, training = erratum_7b_zero2_on_8x24gb()
    b = memory(model, c, lay, training).per_gpu
    # 2P + 14P/8 = 13.48 + 11.79 = 25.27 GB of model states alone, over a 25.77 GB (24 GiB) card.
    assert (b.parameters + b.gradients + b.optimizer_states) / GB == pytest.approx(
        2 * p / GB + 14 * p / 8 / GB
    )
    assert round((2 * p + 14 * p / 8) / GB, 1) == 25.3
    assert not fits(model, c, lay, training)
    assert fits(model, c, dataclasses.replace(lay, offload_optimizer=Offload.CPU), training)


def test_erratum_13b_on_4x32gb_needs_optimizer_offload() -> None:
    p = parameter_counts(LLAMA_2_13B).total
    model, c, zero3, training = erratum_13b_zero3_on_4x32gb()  # V100: no bf16
    b = memory(model, c, zero3, training).per_gpu
    assert (b.parameters + b.gradients + b.optimizer_states) == pytest.approx(16 * p / 4)  # 52 GB
    assert not fits(model, c, zero3, training)
    offload = dataclasses.replace(zero3, offload_optimizer=Offload.CPU)
    est = memory(model, c, offload, training)
    assert fits(model, c, offload, training)
    # GPU keeps 16-bit params 2P/4 = 6.5 GB (the article's "4P/4" also counts the 16-bit grads,
    # which ZeRO-Offload streams to the host). Host: 12P (master + moments, 156 GB) + 4P fp32
    # gradient copy for CPU Adam = the article's 16P = 208 GB per node, and DeepSpeed's pinned fp16
    # flat buffer the partitions accumulate in (stage3.py grad_partitions_flat_buffer): 18P, 234 GB.
    assert est.per_gpu.parameters == pytest.approx(2 * p / 4, abs=1)
    assert est.cpu_per_node_bytes == pytest.approx(18 * p, abs=4)


@pytest.mark.parametrize("dp", ERRATUM_PURE_DP_DEGREES)
def test_erratum_7b_pure_data_parallel_never_fits_80gb(dp: int) -> None:
    p = parameter_counts(LLAMA_2_7B).total
    model, c, lay, training = erratum_7b_pure_data_parallel(dp)
    b = memory(model, c, lay, training).per_gpu
    # 16P = 107.8 GB per card whatever dp is.
    assert b.parameters + b.gradients + b.optimizer_states == 16 * p
    assert round(16 * p / GB) == 108
    assert not fits(model, c, lay, training)


# ---------------------------------------------------------------- measured HF activations


@pytest.mark.parametrize("case", measured_cases(), ids=lambda c: c["id"])
def test_hf_activation_formula_within_10_percent_of_measured(case: dict[str, Any]) -> None:
    estimates, per_layer = activation_estimates(case)
    for layers, measured in case["total_bytes"].items():
        assert estimates[layers] == pytest.approx(measured, rel=0.10), layers
    assert per_layer == pytest.approx(case["per_layer_bytes"], rel=0.10)


@pytest.mark.parametrize(("ep", "etp"), [(2, None), (4, 2), (8, 1)])
def test_megatron_formula_agrees_with_our_moe_states_under_expert_tensor_parallelism(
    ep: int, etp: int | None
) -> None:
    # Megatron's compute_weight_and_optimizer_memory with its expert grid (etp x ep x expert-dp over
    # tp x dp): the two methods must agree on the experts' share and the expert-dp their optimizer
    # shards over, for the default etp = tp and for MoE parallel folding
    from service.catalog.models import model as preset

    mixtral = preset("mixtral-8x7b").spec
    counts, training = parameter_counts(mixtral), TrainingSpec(seq_len=4096, global_batch_size=64)
    lay = Layout(
        framework=Framework.MEGATRON,
        dp=4,
        tp=2,
        ep=ep,
        etp=etp,
        sequence_parallel=True,
        zero_stage=1,
        grad_reduce_in_fp32=True,  # the formula counts Megatron-LM's own default, fp32 main grads
        precision_aware_optimizer=False,  # ... and its own fp32 master
    )
    s = states(mixtral, cluster(gpu("h100", 80 * GiB), 8), lay, training)
    ref = megatron_weight_and_optimizer_bytes(counts, tp=2, pp=1, dp=4, ep=ep, etp=etp)
    assert s.parameters + s.gradients + s.optimizer_states == pytest.approx(ref, rel=1e-12)
