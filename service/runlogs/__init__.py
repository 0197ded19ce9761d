"""Runs from logs: what a training framework prints as it trains, read into the figures of a run.

``parse_log(text, format)`` reads Megatron-LM, torchtitan, DeepSpeed, HF Trainer and accelerate logs
(``service.runlogs.formats`` names each line it reads and where the format comes from) and PyTorch's
out-of-memory error. It skips warm-up steps (``common.WARMUP_STEPS``), takes the median of the steady
steps, the peak memory of the most-loaded rank with the statistic it is, and keeps from which lines
each figure came. A log with none of these raises ``LogNotUnderstood`` saying what was looked for.

Pure (the standard library only): the service turns a ``ParsedLog`` into a run with the plan's job
(service.planning.runs), the CLI and the tests call the same function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from service.runlogs.common import (
    MAX_EXCERPTS,
    WARMUP_STEPS,
    Figure,
    Line,
    MemoryStatistic,
    OutOfMemory,
    Reading,
    Readings,
    excerpt,
    median_figure,
    memory_figure,
    out_of_memory,
    split_lines,
    steady,
)
from service.runlogs.formats import LOOKED_FOR, READERS

LogFormat = Literal["auto", "megatron", "torchtitan", "deepspeed", "hf_trainer", "accelerate"]
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
# auto: a format whose lines time the steps before one that reads memory alone, then the most kinds
# of figure, the more specific first on a tie (accelerate prints HF-style tqdm bars too). An HF
# Trainer run under DeepSpeed prints DeepSpeed's see_memory_usage lines as its engine starts, before
# any step: as many kinds of figure as the Trainer's own, and none of them the training peak (runs
# review, stop 41: its step time was dropped and a start-up reading stored as the peak)
AUTO_ORDER = ("megatron", "torchtitan", "deepspeed", "hf_trainer", "accelerate")


class LogNotUnderstood(ValueError):
    """The log has no line of the format(s) asked for, nor an out-of-memory error."""


@dataclass(slots=True)
class ParsedLog:
    """What a log says about the run, each figure with how it was made and from which lines."""

    format: str  # the format read ("unknown" when only an out-of-memory error was found)
    lines: int  # lines in the log
    step_s: Figure | None = None
    tokens_per_s_per_gpu: Figure | None = None
    samples_per_s: Figure | None = None
    tflops_per_gpu: Figure | None = None
    mfu: Figure | None = None
    peak_memory: Figure | None = None
    global_batch_size: int | None = None
    world_size: int | None = None  # GPUs the log says the run used (Megatron's "using world size")
    out_of_memory: OutOfMemory | None = None
    summary: dict[str, float] = field(default_factory=dict)
    warmup_readings_skipped: int = 0
    cut_lines: int = 0
    excerpts: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def memory_statistic(self) -> MemoryStatistic | None:
        return self.peak_memory.statistic if self.peak_memory else None

    def figures(self) -> list[Figure]:
        found = (self.step_s, self.tokens_per_s_per_gpu, self.samples_per_s, self.tflops_per_gpu, self.mfu)
        return [f for f in (*found, self.peak_memory) if f is not None]

    def stored(self) -> dict[str, Any]:
        """The JSON kept with the run: bounded (figures, at most MAX_EXCERPTS excerpts of a line each)."""
        return {
            "kind": "log",
            "format": self.format,
            "lines": self.lines,
            "warmup": (
                f"readings at step <= {WARMUP_STEPS}, and each rank's first, are warm-up "
                f"({self.warmup_readings_skipped} skipped)"
            ),
            "figures": [f.stored() for f in self.figures()],
            "memory_statistic": self.memory_statistic,
            "global_batch_size": self.global_batch_size,
            "world_size": self.world_size,
            "summary": self.summary,
            "out_of_memory": self.out_of_memory.stored() if self.out_of_memory else None,
            "cut_lines": self.cut_lines,
            "excerpts": self.excerpts[:MAX_EXCERPTS],
            "notes": self.notes,
        }


def parse_log(text: str, log_format: str = "auto") -> ParsedLog:
    """Read a training log; raises LogNotUnderstood when it has nothing this module reads."""
    if log_format not in LOG_FORMATS:
        raise LogNotUnderstood(f"unknown format {log_format!r}; one of {', '.join(LOG_FORMATS)}")
    lines = split_lines(text)
    oom = out_of_memory(lines)
    candidates = AUTO_ORDER if log_format == "auto" else (log_format,)
    chosen, readings, best = None, Readings(), (False, 0)
    read: dict[str, Readings] = {}
    for name in candidates:
        found = read[name] = READERS[name](lines)
        score = (found.timed(), found.kinds())
        if found.kinds() and score > best:  # a tie goes to the more specific format
            chosen, readings, best = name, found, score
    if chosen is None and oom is None:
        looked = "; ".join(LOOKED_FOR[name] for name in candidates)
        cut = sum(len(read[name].cut_lines) for name in candidates)
        also = f" ({cut} lines of the format were cut before their figures)" if cut else ""
        raise LogNotUnderstood(
            f"no line of the log states a step time, a throughput or a memory figure{also}, and it has no "
            f"'CUDA out of memory' error; looked for {looked}"
        )
    total_lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    parsed = ParsedLog(format=chosen or "unknown", lines=total_lines, out_of_memory=oom)
    summarise(parsed, readings)
    if chosen is not None and not readings.memory:
        _untimed_memory_note(parsed, read)
    if oom is not None:
        parsed.excerpts.append(excerpt(oom.line))
    return parsed


def _untimed_memory_note(parsed: ParsedLog, read: dict[str, Readings]) -> None:
    """Says which memory lines of another format were left unread beside the chosen format's steps."""
    for name, found in read.items():
        lines = sorted({r.line.number for series in found.memory.values() for r in series})
        if name != parsed.format and lines and not found.timed():
            where = ", ".join(str(n) for n in lines[:5]) + (", ..." if len(lines) > 5 else "")
            parsed.notes.append(
                f"{name}'s memory lines (lines {where}) are not read as the peak: the log is read as "
                f"{parsed.format}'s, which times the steps, and memory printed beside no step (DeepSpeed's "
                "see_memory_usage as its engine starts) need not be the training peak"
            )


def _at_the_final_batch(readings: Readings) -> None:
    """Only the steps at the run's final global batch: with Megatron's --rampup-batch-size the first
    iterations train smaller batches (32, 64, 96 before 128), whose shorter steps were read as the
    run's (runs review, stop 39: 11.8 s where the steady steps took 15.6)."""
    batches = {r.step: r.value for r in readings.global_batch_size if r.step is not None}
    if not batches:
        return
    final = readings.global_batch_size[-1].value
    for series in (
        readings.step_s,
        readings.tokens_per_s_per_gpu,
        readings.samples_per_s,
        readings.tflops_per_gpu,
    ):
        other = [r for r in series if r.step is not None and batches.get(r.step, final) != final]
        if other:
            dropped = {id(r) for r in other}
            series[:] = [r for r in series if id(r) not in dropped]
            if series is readings.step_s:
                readings.notes.append(
                    f"{len(other)} step readings at another global batch than the final {final:g} "
                    "(a batch ramp-up) skipped"
                )


def _the_last_run(readings: Readings) -> None:
    """Only the last run of a log that holds several (a restart numbers its steps from 1 again): the
    readings before its first line, of every series, are another run's (a 16-GPU batch-256 run and
    the plan's 8-GPU batch-128 one pooled into one median that matched neither; runs review)."""
    start = None
    last: dict[int | None, tuple[float, int]] = {}  # each rank's last step number, and its line
    for reading in readings.step_s:
        if reading.step is None:
            continue
        rank = reading.line.rank
        if rank in last and reading.step < last[rank][0]:
            start = last[rank][1] + 1  # what the next run printed before its steps is its own
        last[rank] = (reading.step, reading.line.number)
    if start is None:
        return
    series = [
        readings.step_s, readings.tokens_per_s_per_gpu, readings.samples_per_s, readings.tflops_per_gpu,
        readings.mfu, readings.global_batch_size, readings.world_size, *readings.memory.values(),
    ]  # fmt: skip
    dropped = 0
    for found in series:
        kept = [r for r in found if r.line.number >= start]
        dropped += len(found) - len(kept)
        found[:] = kept
    readings.notes.append(
        f"the log holds more than one run (its step numbers start again after line {start - 1}): only the "
        f"last one is read ({dropped} readings of the earlier ones skipped)"
    )


def summarise(parsed: ParsedLog, readings: Readings) -> None:
    """Figures from the readings: medians of the steady steps, the peak of the most-loaded rank."""
    _the_last_run(readings)
    _at_the_final_batch(readings)
    parsed.step_s = median_figure("step_s", "s", readings.step_s, "step-time")
    parsed.tokens_per_s_per_gpu = median_figure(
        "tokens_per_s_per_gpu", "tokens/s", readings.tokens_per_s_per_gpu, "tokens/s per GPU"
    )
    parsed.samples_per_s = median_figure("samples_per_s", "samples/s", readings.samples_per_s, "samples/s")
    parsed.tflops_per_gpu = median_figure(
        "tflops_per_gpu", "TFLOP/s", readings.tflops_per_gpu, "TFLOP/s per GPU"
    )
    parsed.mfu = median_figure("mfu", "fraction", readings.mfu, "MFU")
    parsed.peak_memory = memory_figure(readings.memory)
    parsed.summary = {key: reading.value for key, reading in readings.summary.items()}
    runtime, total = readings.summary.get("train_runtime"), readings.summary.get("total_optimization_steps")
    if parsed.step_s is None and runtime is not None and total is not None and total.value > 0:
        # transformers' speed_metrics rounds train_steps_per_second to 3 places: 0.005 for a 190 s step
        # read 200 s (runs review); the runtime over the steps the Trainer states is exact
        parsed.step_s = Figure(
            "step_s",
            runtime.value / total.value,
            "s",
            "train_runtime / Total optimization steps: HF Trainer's average over the whole run, warm-up "
            "included (the log has no progress-bar reading of the steady steps)",
            (runtime.line.number, total.line.number),
        )
    if parsed.step_s is None and "train_steps_per_second" in readings.summary:
        steps = readings.summary["train_steps_per_second"]
        if steps.value > 0:
            parsed.step_s = Figure(
                "step_s",
                1.0 / steps.value,
                "s",
                "1 / train_steps_per_second: HF Trainer's average over the whole run, warm-up included "
                "(the log has no progress-bar reading of the steady steps)",
                (steps.line.number,),
            )
    if "train_samples_per_second" in readings.summary:
        samples = readings.summary["train_samples_per_second"]
        if parsed.samples_per_s is None and samples.value > 0:
            parsed.samples_per_s = Figure(
                "samples_per_s",
                samples.value,
                "samples/s",
                "train_samples_per_second: HF Trainer's average over the whole run, warm-up included",
                (samples.line.number,),
            )
    if readings.global_batch_size:
        parsed.global_batch_size = round(readings.global_batch_size[-1].value)
    if readings.world_size:
        parsed.world_size = round(readings.world_size[-1].value)
    series = (readings.step_s, readings.tokens_per_s_per_gpu, readings.samples_per_s)
    main = next((s for s in series if s), [])
    parsed.warmup_readings_skipped = len(steady(main)[1])
    parsed.cut_lines = len(readings.cut_lines)
    if readings.cut_lines:
        numbers = ", ".join(str(line.number) for line in readings.cut_lines[:10])
        parsed.notes.append(
            f"{len(readings.cut_lines)} {'line' if len(readings.cut_lines) == 1 else 'lines'} cut before "
            f"their figures were skipped (lines {numbers})"
        )
    parsed.notes.extend(readings.notes)
    every = [*series, readings.tflops_per_gpu, readings.mfu, *readings.memory.values()]
    every.append(list(readings.summary.values()))
    parsed.excerpts = _excerpts(parsed, [r for found in every for r in found])


def _excerpts(parsed: ParsedLog, readings: list[Reading]) -> list[dict[str, Any]]:
    """The lines behind the figures: the first and last reading each figure used."""
    by_number: dict[int, Line] = {r.line.number: r.line for r in readings}
    wanted: list[int] = []
    for figure in parsed.figures():
        if figure.lines:
            wanted.extend([figure.lines[0], figure.lines[-1]])
    out, seen = [], set()
    for number in wanted:
        if number in seen:
            continue
        seen.add(number)
        line = by_number.get(number)
        if line is not None:
            out.append(excerpt(line))
    return out


__all__ = ["LOG_FORMATS", "LogFormat", "LogNotUnderstood", "ParsedLog", "parse_log"]
