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
    assert parsed.step_s is not None and parsed.step_s.value == pytest.approx(2.6009)  # median, ms -> s
    assert parsed.step_s.lines == (11, 14, 15, 16, 17)  # iteration 1 (18.7 s of start-up) skipped
    assert parsed.tflops_per_gpu is not None and parsed.tflops_per_gpu.value == pytest.approx(211.1)
    assert parsed.global_batch_size == 64
    # the largest figure of any rank: rank 0's max reserved after 10 iterations, in MiB
    assert parsed.peak_memory is not None and parsed.peak_memory.value == 42520.00 * MIB
    assert parsed.memory_statistic == "max_reserved" and parsed.peak_memory.lines == (12,)
    assert parsed.cut_lines == 1  # iteration 60 cut inside its elapsed time: not read as 25 ms
    assert parsed.warmup_readings_skipped == 1
    assert parsed.out_of_memory is None


def test_torchtitan_step_lines_with_colours_from_two_ranks() -> None:
    parsed = parse_log(read("torchtitan"))
    assert parsed.format == "torchtitan"
    assert parsed.tokens_per_s_per_gpu is not None
    assert parsed.tokens_per_s_per_gpu.value == pytest.approx(6641)  # steps 10-30 of ranks 0 and 4
    assert parsed.mfu is not None and parsed.mfu.value == pytest.approx(0.3889)
    assert parsed.tflops_per_gpu is not None and parsed.tflops_per_gpu.value == pytest.approx(384.63)
    assert parsed.peak_memory is not None and parsed.peak_memory.value == round(63.92 * GIB)  # rank 4
    assert parsed.memory_statistic == "max_reserved"
    assert parsed.warmup_readings_skipped == 2  # step 1 of each rank
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
