"""One layout's estimate, calibrated by the runs stored for its hardware and framework, and its
wire shape (also the shape of every candidate a plan stores)."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy.orm import Session

from service.catalog.tuning import default_tuning
from service.contracts.estimates import (
    CalibrationOut,
    EstimateOut,
    EstimateRequest,
    LayoutIn,
    LimitsOut,
    MemoryOut,
    MemoryPerGPUOut,
    StageMemoryOut,
    TimeBreakdownOut,
    TimeOut,
)
from service.errors import Unprocessable
from service.estimator import estimate
from service.estimator.calibration import applied_calibration
from service.estimator.defaults import chosen_defaults, chosen_link_defaults
from service.estimator.dp_comm import grad_reduce_overlapped
from service.estimator.errors import EstimatorError, InvalidLayout, InvalidTraining
from service.estimator.model_states import hsdp_replicas
from service.estimator.params import parameter_counts
from service.estimator.scale import scale_violation
from service.estimator.step_time import cost
from service.estimator.types import ClusterSpec, Estimate, Layout, ModelSpec, Plan, TrainingSpec
from service.estimator.validate import sequence_parallel_divisor_of
from service.frameworks import sequence_parallel_default
from service.launchers import runnable_targets
from service.persistence.repository import ClusterRepository, PlanRepository
from service.planning.calibration import calibration_for, calibration_out, hardware_keys, job_traits
from service.planning.clusters import cluster_form, domain_cluster, read_from_catalog
from service.recommender.runnable import TRAINING_FIELDS

LAYOUT_FIELDS = frozenset(f.name for f in dataclasses.fields(Layout))


def _limit(field: str) -> int:
    """LayoutIn's upper bound on a field: a derived value past it is left to the rule it breaks."""
    return int(next(m.le for m in LayoutIn.model_fields[field].metadata if hasattr(m, "le")))


def estimate_for(session: Session, request: EstimateRequest) -> EstimateOut:
    """Every number for one layout, with the factors learned from runs on this hardware and
    framework applied; nothing is stored."""
    model = request.model.to_domain()
    form = cluster_form(request.cluster, ClusterRepository(session))
    cluster = domain_cluster(form)
    training = request.training.to_domain(cluster.gpu, model)
    check_priced(request.gpu_hour_cost, training)
    check_scale(model, cluster, training)
    layout_in, chosen_dp = with_derived_dp(request.layout, cluster.world_size, training.global_batch_size)
    layout_in, chosen_micro = with_derived_micro_batch(layout_in, training.global_batch_size)
    layout_in, unsplit = with_fitting_sequence_parallel(layout_in, training.seq_len)
    # the TP overlap's default needs the tp peers' memory mapped: peer access, inside one node
    peer_to_peer = cluster.gpu.tp_overlap_peer_access and not cluster.tp_straddles_nodes(
        layout_in.tp, cluster.world_size
    )
    layout = layout_in.to_domain(peer_to_peer=peer_to_peer)
    total = parameter_counts(model).total
    target = job_traits(total, training, layout)
    learned = calibration_for(PlanRepository(session), hardware_keys(cluster), layout.framework.value, target)
    try:
        result = estimate(
            model, cluster, layout, training, tuning=default_tuning(), calibration=learned.calibration
        )
        # the same layout without the factors, quoted next to the calibrated figures
        uncalibrated = (
            None
            if learned.calibration.is_identity
            else estimate(model, cluster, layout, training, tuning=default_tuning(), with_limits=False)
        )
    except EstimatorError as exc:
        raise located(exc) from exc
    # the factors as applied (the step's capped at HFU 1), as a plan's candidates report them
    applied = applied_calibration(learned.calibration, uncalibrated.time if uncalibrated else None)
    calibration = calibration_out(dataclasses.replace(learned, calibration=applied), uncalibrated)
    out = estimate_out(result, layout, training, total, request.gpu_hour_cost, calibration)
    out.resolved_defaults |= layout_in.chosen_defaults(peer_to_peer=peer_to_peer) | chosen_dp | chosen_micro
    if layout.overlap_grad_reduce is None and layout.dp * layout.cp > 1:  # a reduction to overlap or not
        overlapped = grad_reduce_overlapped(default_tuning(), layout)
        out.resolved_defaults["layout.overlap_grad_reduce"] = str(overlapped).lower()
    if layout.moe_capacity_factor is None and model.moe is not None and layout.capacity_factor is not None:
        out.resolved_defaults["layout.moe_capacity_factor"] = f"{layout.capacity_factor:g}"  # DeepSpeed MoE's
    if layout.dp_replicate is None and (replicas := hsdp_replicas(layout, cluster)) > 1:
        out.resolved_defaults["layout.dp_replicate"] = str(replicas)  # HSDP's: one shard group per node
    out.resolved_defaults |= request.training.adapter_defaults() | request.training.optimizer_read()
    if unsplit is not None:
        out.resolved_defaults["layout.sequence_parallel"] = "false"
        out.assumptions.append(unsplit)
    out.resolved_defaults |= chosen_link_defaults(cluster)  # a custom GPU's links it left out
    out.resolved_defaults |= read_from_catalog(request.model, form)
    unrendered = launcher_warning(Plan(model=model, cluster=cluster, training=training, layout=layout))
    if unrendered is not None:
        out.warnings.append(unrendered)
    return out


def launcher_warning(plan: Plan) -> str | None:
    """What an estimate says when no launcher runs its layout as estimated (each target's refusal):
    the numbers stand, but a plan never proposes the layout, so an estimate that fits next to an
    infeasible plan says why (DeepSpeed with cp > 1, Megatron-LM with tf32 or LoRA, FSDP with fp8)."""
    runs, reasons = runnable_targets(plan)
    if runs:
        return None
    why = "; ".join(f"{target.value}: {reason}" for target, reason in reasons.items())
    return f"no launcher runs this layout as estimated, so a plan never proposes it ({why})"


def with_derived_dp(
    layout: LayoutIn, world_size: int, global_batch_size: int
) -> tuple[LayoutIn, dict[str, str]]:
    """The layout with ``dp`` filling the cluster when the request left it out (the GPUs over
    tp x pp x cp, as gradient_accumulation_steps is derived from the batch), and the choice as the
    answer's resolved_defaults names it. dp = 1 on a node of 8 was a 422 (dp*tp*pp*cp = 1 != world
    size 8) for {"framework": "fsdp", "zero_stage": 3}. Where tp x pp x cp does not divide the GPUs,
    no dp fills them: refused naming the model-parallel degree the request states (the world-size
    rule would name dp, which the request left out). Where the dp that fills them does not divide
    the global batch (a batch of 1 on 1,024 GPUs), refused saying so, naming the batch (the batch
    rule would name micro_batch_size, which the request did not set either)."""
    if "dp" in layout.model_fields_set:
        return layout, {}
    others = layout.tp * layout.pp * layout.cp
    dp, rest = divmod(world_size, others)
    if rest:
        stated = [name for name in ("tp", "pp", "cp") if getattr(layout, name) > 1]  # others > 1: one is
        # the degree to change: one that does not divide the GPUs by itself (pp 3 of tp 4 x pp 3 on 8
        # GPUs), else the largest (tp 4 x pp 4 on 8)
        field = max(stated, key=lambda name: (world_size % getattr(layout, name) != 0, getattr(layout, name)))
        raise located(
            InvalidLayout(
                f"tp*pp*cp = {layout.tp}*{layout.pp}*{layout.cp} = {others} does not divide the cluster's "
                f"{world_size} GPUs, so no data-parallel degree fills them: give {field} (or dp) so that "
                f"dp*tp*pp*cp = {world_size}",
                rule="world_size",
                field=field,
            )
        )
    if dp <= 1 or dp > _limit("dp"):
        return layout, {}
    if global_batch_size % dp:
        raise located(
            InvalidTraining(
                f"global_batch_size ({global_batch_size}) does not split over dp {dp}, the data-parallel "
                f"degree the layout left out (the cluster's {world_size} GPUs over tp*pp*cp = {others}): "
                "each data-parallel rank trains whole sequences; give a global_batch_size that dp "
                "divides, fewer GPUs, or tp, pp or cp so that fewer ranks are data parallel",
                rule="global_batch",
                field="global_batch_size",
            )
        )
    return layout.model_copy(update={"dp": dp}), {"layout.dp": str(dp)}


def with_derived_micro_batch(layout: LayoutIn, global_batch_size: int) -> tuple[LayoutIn, dict[str, str]]:
    """The layout with ``micro_batch_size`` derived when the request gave gradient_accumulation_steps
    but not it (global = micro x accumulation x dp, the contract's equation, solved the other way):
    {"dp": 8, "gradient_accumulation_steps": 4} for a batch of 64 was a 422 (1 x 4 x 8 = 32 != 64).
    Where the batch does not divide, the request is left to the batch rule to name."""
    steps = layout.gradient_accumulation_steps
    if steps is None or "micro_batch_size" in layout.model_fields_set:
        return layout, {}
    micro, rest = divmod(global_batch_size, steps * layout.dp)
    if rest or micro <= 1 or micro > _limit("micro_batch_size"):
        return layout, {}
    return layout.model_copy(update={"micro_batch_size": micro}), {"layout.micro_batch_size": str(micro)}


def with_fitting_sequence_parallel(layout: LayoutIn, seq_len: int) -> tuple[LayoutIn, str | None]:
    """The layout with sequence parallelism left off where the request left it out and the sequence
    does not split over the TP ranks (``validate.sequence_parallel_divisor``: Megatron-LM asserts
    seq_len / cp % tp == 0 under --sequence-parallel, torchtitan seq_len % tp x 2cp): the
    framework's default (on with tp > 1) made {"framework": "megatron", "tp": 2} at seq_len 7 a 422
    naming tp, for a switch the request never set. The answer says why it is off; a request that
    sets it on is still refused."""
    if "sequence_parallel" in layout.model_fields_set or layout.tp == 1:
        return layout, None
    recipes = sequence_parallel_default(layout.framework, layout.tp)
    if recipes == sequence_parallel_default(layout.framework, layout.tp, layout.cp, seq_len):
        return layout, None
    divisor = sequence_parallel_divisor_of(layout.framework, layout.tp, layout.cp)
    why = (
        f"sequence_parallel off: seq_len {seq_len} is not a multiple of {divisor}, what "
        f"{layout.framework.value} needs to split each sequence over tp {layout.tp}; its recipes turn it on "
        "with tensor parallelism where it splits"
    )
    return layout.model_copy(update={"sequence_parallel": False}), why


def layout_out(layout: Layout, training: TrainingSpec) -> dict[str, Any]:
    """The layout as answered, its derived fields filled in: gradient_accumulation_steps from the
    global batch (global = micro x accumulation x dp), which a layout the search built leaves out."""
    steps = layout.accumulation_steps(training.global_batch_size)
    return dataclasses.asdict(dataclasses.replace(layout, gradient_accumulation_steps=steps))


def check_priced(gpu_hour_cost: object, training: TrainingSpec, field: str = "gpu_hour_cost") -> None:
    """A gpu_hour_cost prices the time to train, which needs training.tokens: an estimate's
    cost_to_train, a capacity option's cost, a plan's candidates' cost_to_train (a plan ranked by
    cost also scales its score by it, and is not checked here). Without the tokens nothing in the
    answer uses it, so it is refused, naming what would (it was a warning, then a null cost and
    nothing said: an input the model does not use is refused)."""
    if gpu_hour_cost is None or training.tokens is not None:
        return
    message = (
        f"{field} is not used: it prices the time to train, which needs training.tokens (the total "
        "tokens to train on); give training.tokens, or leave the price out"
    )
    raise Unprocessable(message, errors=[{"field": field, "message": message, "type": "unused"}])


def check_scale(model: ModelSpec, cluster: ClusterSpec | None, training: TrainingSpec) -> None:
    """The cheap bound before any work: a job past what training has ever done is a 422."""
    violation = scale_violation(model, cluster, training)
    if violation is not None:
        raise violation


def located(exc: EstimatorError) -> EstimatorError:
    """The same error with its field named as the request body names it (layout.tp, training.seq_len)."""
    field = exc.field or ""
    if field in LAYOUT_FIELDS:
        field = f"layout.{field}"
    elif field in TRAINING_FIELDS:
        field = f"training.{field}"
    return exc.at(field or None)


def estimate_out(
    result: Estimate,
    layout: Layout,
    training: TrainingSpec,
    total_parameters: int,
    gpu_hour_cost: float | None,
    calibration: CalibrationOut | None = None,
) -> EstimateOut:
    memory, time = result.memory, result.time
    per_gpu = memory.per_gpu
    time_out = None
    if time is not None:
        breakdown = TimeBreakdownOut(**dataclasses.asdict(time.breakdown))
        time_out = TimeOut(
            step_s=time.step_s,
            tokens_per_s=time.tokens_per_s,
            tflops_per_gpu=time.tflops_per_gpu,
            mfu=time.mfu,
            hardware_tflops_per_gpu=time.hardware_tflops_per_gpu,
            hfu=time.hfu,
            breakdown=breakdown,
        )
    cost_to_train = None
    if gpu_hour_cost is not None and result.time_to_train_s is not None:
        cost_to_train = cost(result.time_to_train_s, layout.world_size, gpu_hour_cost)
    return EstimateOut(
        fits=result.fits,
        memory=MemoryOut(
            per_gpu=MemoryPerGPUOut.of(per_gpu),
            per_stage=[
                StageMemoryOut(rank=stage.rank, **MemoryPerGPUOut.of(stage.memory).model_dump())
                for stage in memory.per_stage
            ],
            capacity_bytes=memory.capacity_bytes,
            headroom_bytes=memory.headroom_bytes,
            fit_statistic=memory.fit_statistic,
            cpu_per_node_bytes=memory.cpu_per_node_bytes,
            nvme_per_node_bytes=memory.nvme_per_node_bytes,
        ),
        time=time_out,
        limits=LimitsOut(max_micro_batch_size=result.max_micro_batch_size, max_seq_len=result.max_seq_len),
        time_to_train_s=result.time_to_train_s,
        cost_to_train=cost_to_train,
        layout=layout_out(layout, training),
        parameters_total=total_parameters,
        warnings=list(result.warnings),
        assumptions=list(result.assumptions),
        resolved_defaults=chosen_defaults(training),
        calibration=calibration,
    )
