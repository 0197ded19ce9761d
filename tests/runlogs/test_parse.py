"""service.runlogs reads each framework's log as its source prints it: the steady-state figures,
the peak memory of the most-loaded rank with its statistic, the lines behind each, and PyTorch's
out-of-memory error; a log it cannot read says what it looked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from service.runlogs import LogNotUnderstood, parse_log
from service.runlogs.common import GIB, MIB, WARMUP_STEPS

LOGS = Path(__file__).parent / "logs"


def read(name: str) -> str:
    return (LOGS / f"{name}.log").read_text()


def test_megatron_iteration_lines_and_memory_report() -> None:
    parsed = parse_log(read("megatron"))
    assert parsed.format == "megatron"
    # median, ms -> s: iteration 1 (18.7 s of start-up) skipped, and iteration 10, whose interval Megatron's
    # timer starts at iteration 1 (training_log does not reset it after the first line)
    assert parsed.step_s is not None and parsed.step_s.value == pytest.approx(2.59845)
    assert parsed.step_s.lines == (14, 15, 16, 17)
    assert parsed.tflops_per_gpu is not None and parsed.tflops_per_gpu.value == pytest.approx(211.3)
    assert parsed.global_batch_size == 64
    # the largest figure of any rank: rank 0's max reserved after 10 iterations, in MiB
    assert parsed.peak_memory is not None and parsed.peak_memory.value == 42520.00 * MIB
    assert parsed.memory_statistic == "max_reserved" and parsed.peak_memory.lines == (12,)
    assert parsed.cut_lines == 1  # iteration 60 cut inside its elapsed time: not read as 25 ms
    assert parsed.warmup_readings_skipped == 2
    assert parsed.out_of_memory is None


def test_torchtitan_step_lines_with_colours_from_two_ranks() -> None:
    parsed = parse_log(read("torchtitan"))
    assert parsed.format == "torchtitan"
    assert parsed.tokens_per_s_per_gpu is not None
    # steps 20-30 of ranks 0 and 4 (step 10's interval starts in the warm-up)
    assert parsed.tokens_per_s_per_gpu.value == pytest.approx(6639.5)
    assert parsed.mfu is not None and parsed.mfu.value == pytest.approx(0.3888)
    assert parsed.tflops_per_gpu is not None and parsed.tflops_per_gpu.value == pytest.approx(384.545)
    assert parsed.peak_memory is not None and parsed.peak_memory.value == round(63.92 * GIB)  # rank 4
    assert parsed.memory_statistic == "max_reserved"
    assert parsed.warmup_readings_skipped == 4  # steps 1 and 10 of each rank (10: its interval starts at 2)
    assert parsed.cut_lines == 1
    assert all("\x1b" not in e["text"] for e in parsed.stored()["excerpts"])


def test_deepspeed_throughput_timer_and_see_memory_usage() -> None:
    parsed = parse_log(read("deepspeed"))
    assert parsed.format == "deepspeed"
    assert parsed.samples_per_s is not None and parsed.samples_per_s.value == pytest.approx(13.330)
    # see_memory_usage's Max_CA (29 GiB) was printed at start-up; the timer's MaxMemAllocated on
    # rank 3 later is larger, so it is the peak, named as max allocated
    assert parsed.peak_memory is not None and parsed.peak_memory.value == round(59.37 * GIB)
    assert parsed.memory_statistic == "max_allocated"
    assert parsed.cut_lines == 1


def test_deepspeed_pipeline_engine_lines() -> None:
    # PipelineEngine.train_batch: the interval's mean step and train_batch_size / it, both :0.3f
    # (older "steps: G", newer "step: G / N ... eta"); a value cut short of its three decimals is cut
    log = "".join(
        f"[2025-03-01 10:00:{step:02d},000] [INFO] [engine.py:2000:train_batch] "
        f"steps: {step} loss: 2.1345 iter time (s): {19.7 + step / 1000:.3f} samples/sec: 12.972\n"
        for step in (10, 20, 30, 40)
    )
    log += "step:    50 /   100 loss: 2.0000 iter time (s): 19.800 samples/sec: 12.929 eta: 0:16:30\n"
    log += "steps: 60 loss: 2.0000 iter time (s): 19.8\n"
    parsed = parse_log(log)
    assert parsed.format == "deepspeed"
    assert parsed.step_s is not None and parsed.step_s.value == pytest.approx(19.735)  # 20..50, not 10
    assert parsed.step_s.lines == (2, 3, 4, 5)
    assert parsed.samples_per_s is not None and parsed.samples_per_s.value == pytest.approx(12.972)
    assert parsed.cut_lines == 1 and parsed.warmup_readings_skipped == 1


def test_hf_trainer_under_deepspeed_is_read_as_the_trainers() -> None:
    # Trainer(deepspeed=...) prints DeepSpeed's see_memory_usage as the engine starts, then the
    # Trainer's bar and metrics: the step time is the Trainer's, the start-up memory is not the peak
    start = "".join(
        f"[2025-02-20 16:40:1{i},306] [INFO] [utils.py:782:see_memory_usage] MA {ma} GB         "
        f"Max_MA {ma + 0.5} GB         CA {ma + 1} GB         Max_CA {round(ma + 1)} GB\n"
        for i, ma in enumerate((2.1, 5.3, 8.6))
    )
    bars = "".join(f"{step}/100 [00:59<01:00, 14.{step % 10}s/it]\n" for step in range(1, 60))
    log = (
        start
        + "  Total optimization steps = 100\n"
        + bars
        + "{'train_runtime': 1500.1, 'train_samples_per_second': 17.06, 'train_steps_per_second': 0.067}\n"
    )
    parsed = parse_log(log)
    assert parsed.format == "hf_trainer"
    assert parsed.step_s is not None and 14.0 <= parsed.step_s.value <= 14.9
    assert parsed.peak_memory is None
    assert any("deepspeed's memory lines (lines 1, 2, 3)" in note for note in parsed.notes)


def test_torchtitan_before_tflops_printed_wps() -> None:
    # torchtitan's train.py before the tflops field: "wps" (tokens/s per GPU, as tps later), then mfu
    log = "".join(
        f"[rank0]:2024-06-01 10:00:{step:02d},000 - root - INFO - \x1b[36mstep: {step:2}  \x1b[32mloss: "
        f" 8.5000  \x1b[33mmemory: 61.23GiB(77.40%)  \x1b[34mwps: 6,605  \x1b[35mmfu: 38.50%\x1b[39m\n"
        for step in range(1, 31)
    )
    parsed = parse_log(log)
    assert parsed.format == "torchtitan" and parsed.cut_lines == 0
    assert parsed.tokens_per_s_per_gpu is not None and parsed.tokens_per_s_per_gpu.value == 6605
    assert parsed.mfu is not None and parsed.mfu.value == pytest.approx(0.385)


def test_hf_trainer_progress_bar_and_train_metrics() -> None:
    parsed = parse_log(read("hf_trainer"))
    assert parsed.format == "hf_trainer"
    # the training bar's steady rate; the evaluation bar (13 batches at 5 it/s) is not a step
    assert parsed.step_s is not None and parsed.step_s.value == pytest.approx(4.12)
    assert parsed.summary["train_steps_per_second"] == pytest.approx(0.238)
    assert parsed.summary["train_runtime"] == pytest.approx(838.91)
    assert parsed.samples_per_s is not None and parsed.samples_per_s.value == pytest.approx(15.258)
    assert parsed.peak_memory is not None
    assert parsed.peak_memory.value == 16060522496 + 32121044992 + 19470073856
    assert parsed.memory_statistic == "max_allocated"


def test_hf_trainer_summary_alone_gives_the_whole_runs_step() -> None:
    log = (
        "{'train_runtime': 420.5, 'train_samples_per_second': 30.44, "
        "'train_steps_per_second': 0.476, 'epoch': 1.0}\n"
    )
    parsed = parse_log(log, "hf_trainer")
    assert parsed.step_s is not None and parsed.step_s.value == pytest.approx(1 / 0.476)
    assert "warm-up included" in parsed.step_s.how


def test_accelerate_tqdm_and_peak_memory_lines() -> None:
    parsed = parse_log(read("accelerate"))
    assert parsed.format == "accelerate"  # not hf_trainer: its memory lines are accelerate's
    assert parsed.step_s is not None and parsed.step_s.value == pytest.approx(3.025)
    assert parsed.peak_memory is not None and parsed.peak_memory.value == 56273 * MIB
    assert parsed.memory_statistic == "max_allocated"


def test_out_of_memory_error_with_its_quoted_figures() -> None:
    parsed = parse_log(read("oom"))
    oom = parsed.out_of_memory
    assert oom is not None and oom.line.number == 8 and oom.line.rank == 1 and oom.gpu == 1
    assert oom.quoted["tried_to_allocate_bytes"] == 2 * GIB
    assert oom.quoted["capacity_bytes"] == round(79.11 * GIB)
    assert oom.quoted["free_bytes"] == round(1.23 * GIB)
    assert oom.quoted["process_in_use_bytes"] == round(77.87 * GIB)
    assert oom.quoted["allocated_by_pytorch_bytes"] == round(75.20 * GIB)


def test_pytorch_1_out_of_memory_wording() -> None:
    log = (
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
        "14.56 GiB already allocated; 3.44 MiB free; 14.80 GiB reserved in total by PyTorch)\n"
    )
    oom = parse_log(log).out_of_memory
    assert oom is not None and oom.gpu == 0
    assert oom.quoted["capacity_bytes"] == round(15.78 * GIB)
    assert oom.quoted["reserved_by_pytorch_bytes"] == round(14.80 * GIB)


def test_only_warm_up_readings_are_used_and_said_so() -> None:
    log = (
        " [2025-03-14 10:02:31.118274] iteration        1/     500 | consumed samples:           64 | "
        "elapsed time per iteration (ms): 18734.2 | global batch size:    64 |\n"
    )
    parsed = parse_log(log)
    assert parsed.step_s is not None and parsed.step_s.value == pytest.approx(18.7342)
    assert "every one of them warm-up" in parsed.step_s.how and str(WARMUP_STEPS) in parsed.step_s.how


def test_a_log_without_figures_says_what_was_looked_for() -> None:
    with pytest.raises(LogNotUnderstood) as caught:
        parse_log("hello\nworld\n")
    message = str(caught.value)
    for wanted in ("Megatron-LM", "torchtitan", "DeepSpeed", "HF Trainer", "tqdm", "CUDA out of memory"):
        assert wanted in message
    with pytest.raises(LogNotUnderstood, match="torchtitan's"):
        parse_log(read("megatron"), "torchtitan")


def test_stored_source_is_bounded() -> None:
    lines = [
        f" [2025-03-14 10:02:31] iteration {i:8d}/  100000 | consumed samples: {i * 64:12d} | "
        f"elapsed time per iteration (ms): {2600 + i % 7:.1f} | global batch size:    64 |"
        for i in range(1, 5001)
    ]
    stored = parse_log("\n".join(lines)).stored()
    assert len(stored["excerpts"]) <= 24
    assert all(len(f["lines"]) <= 50 for f in stored["figures"])
    assert len(str(stored)) < 20_000


def test_the_reader_imports_no_web_framework_nor_database() -> None:
    code = (
        "import sys, service.runlogs;"
        "heavy = {'fastapi', 'starlette', 'sqlalchemy', 'pydantic'};"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in heavy"
        " or m.startswith('service.api') or m.startswith('service.planning'));"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == ""


def _megatron_run(world: int, batch: int, step_ms: float, steps: int) -> list[str]:
    lines = [f"using world size: {world}, data-parallel size: {world}, context-parallel size: 1, "
             "tensor-model-parallel size: 1, pipeline-model-parallel size: 1"]  # fmt: skip
    for step in range(1, steps + 1):
        lines.append(
            f" [2025-03-14 10:02:31.118274] iteration {step:8d}/     500 | consumed samples: "
            f"{step * batch:12d} | elapsed time per iteration (ms): {step_ms:.1f} | global batch size: "
            f"{batch:5d} | lm loss: 7.0E+00 |"
        )
    return lines


def test_a_log_of_two_runs_is_read_as_its_last() -> None:
    """A restart numbers its steps from 1 again: a 16-GPU batch-256 run at 9.5 s and the plan's 8-GPU
    batch-128 run at 16.5 s pooled into one median (13.0 s) that matched neither, taking the last run's
    batch and GPUs, so nothing was set aside (runs review)."""
    from service.runlogs import parse_log

    text = "\n".join(_megatron_run(16, 256, 9500.0, 30) + _megatron_run(8, 128, 16500.0, 30))
    parsed = parse_log(text, "megatron")
    assert parsed.step_s is not None and parsed.step_s.value == pytest.approx(16.5)
    assert (parsed.global_batch_size, parsed.world_size) == (128, 8)
    assert any("more than one run" in note for note in parsed.notes)
    single = parse_log("\n".join(_megatron_run(8, 128, 16500.0, 30)), "megatron")
    assert not any("more than one run" in note for note in single.notes)


def test_what_torchtitan_deepspeed_and_hf_trainer_logs_state_of_the_job_is_read() -> None:
    """torchtitan's device-mesh line (its GPUs), DeepSpeed's config dump (train_batch_size, world_size)
    and the HF Trainer's runtime over its stated steps (train_steps_per_second is rounded to 3 places:
    0.005 read a 190 s step as 200 s) (runs review)."""
    from service.runlogs import parse_log

    mesh = ("[rank0]:[titan] 2025-05-02 08:14:09,733 - root - INFO - Building device mesh with parallelism: "
            "pp=1, dp_replicate=1, dp_shard=8, cp=1, tp=2, ep=1")  # fmt: skip
    titan = parse_log(mesh + "\n" + read("torchtitan"), "torchtitan")
    assert titan.world_size == 16
    assert parse_log(read("torchtitan"), "torchtitan").world_size is None
    ds = parse_log(read("deepspeed") + "\n[2025-02-20 16:40:09,872] [INFO] [config.py:1001:print]   "
                   "world_size ................... 8", "deepspeed")  # fmt: skip
    assert (ds.global_batch_size, ds.world_size) == (64, 8)
    hf = parse_log(
        "  Total optimization steps = 30\n"
        "{'train_runtime': 5700.0, 'train_samples_per_second': 5.389, 'train_steps_per_second': 0.005, "
        "'train_loss': 1.4, 'epoch': 1.0}",
        "hf_trainer",
    )
    assert hf.step_s is not None and hf.step_s.value == pytest.approx(190.0)
