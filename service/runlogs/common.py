"""What every framework's log shares: its lines (ANSI colour codes and the launcher's rank prefix
removed, the rank kept), numbers with their units, the readings a figure is made of, and PyTorch's
out-of-memory error.

Pure: the standard library only (no web framework, no database), so the CLI, the service and tests
read a log the same way.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# The readings of the first steps are start-up, not the job: the CUDA context and NCCL communicators
# are created, torch.compile and Triton autotuning compile, cuDNN/cuBLAS pick algorithms, and the
# caching allocator grows its pool. A reading at step <= WARMUP_STEPS is warm-up, and so is the first
# reading of each rank (it averages over an interval that starts at start-up: Megatron-LM logs
# iteration 1 on its own for that reason, torchtitan logs step 1, DeepSpeed's timer starts at step 2).
WARMUP_STEPS = 3
EXCERPT_CHARS = 160  # one line's excerpt as stored
MAX_EXCERPTS = 24  # excerpts kept per log
MAX_LINE_NUMBERS = 50  # line numbers kept per figure

MemoryStatistic = Literal["device_used", "max_reserved", "reserved", "max_allocated", "allocated"]
# Closest first to what the estimate's per-GPU total is (the device memory a rank uses: the
# allocator's pool plus the CUDA context, as nvidia-smi shows it).
STATISTIC_PREFERENCE: tuple[MemoryStatistic, ...] = (
    "device_used",
    "max_reserved",
    "reserved",
    "max_allocated",
    "allocated",
)
STATISTIC_MEANING: dict[MemoryStatistic, str] = {
    "device_used": "device memory in use, as nvidia-smi shows it (CUDA context included)",
    "max_reserved": "peak memory reserved by PyTorch's caching allocator (torch.cuda.max_memory_reserved)",
    "reserved": "memory reserved by PyTorch's caching allocator when printed (torch.cuda.memory_reserved)",
    "max_allocated": "peak memory allocated to tensors (torch.cuda.max_memory_allocated)",
    "allocated": "memory allocated to tensors when printed (torch.cuda.memory_allocated)",
}

UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
MIB, GIB = 1024**2, 1024**3

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\^\[\[[0-9;]*m")
# torchrun's --tee / --local-ranks-filter prefix ("[rank3]:", older "[default3]:"), srun --label ("3: ")
_RANK_PREFIX = re.compile(r"^\s*(?:\[(?:rank|default)(\d+)\]:|(\d{1,5}): )\s?")
_RANK_INSIDE = re.compile(r"\[Rank (\d+)\]")
# A number starts where no digit or point is before it: a pattern that begins with one is then tried
# at the first digit of a run only, not at each of them (a line of 8,000 digits took 16 s to scan,
# every start re-reading the run to its end: quadratic, with the GIL held).
NUMBER = r"(?<![\d.])[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
# Lines are read up to this many characters: every figure a framework prints sits in its first few
# hundred; a longer line (a tensor dump, a pasted blob) is cut, keeping a posted log's scan linear.
MAX_LINE_CHARS = 4096


@dataclass(frozen=True, slots=True)
class Line:
    number: int  # 1-based, as an editor counts the posted text's lines
    rank: int | None
    text: str  # colour codes and the launcher's rank prefix removed


def split_lines(log: str) -> list[Line]:
    """The log's lines; a carriage return (tqdm redraws its bar with one) also ends a line, which
    keeps the number of the newline-separated line it is on."""
    lines = []
    for number, raw in enumerate(log.split("\n"), start=1):
        for part in raw.split("\r"):
            text = _ANSI.sub("", part[: 2 * MAX_LINE_CHARS])[:MAX_LINE_CHARS]
            rank = None
            prefix = _RANK_PREFIX.match(text)
            if prefix:
                rank = int(prefix.group(1) or prefix.group(2))
                text = text[prefix.end() :]
            inside = _RANK_INSIDE.search(text)
            if rank is None and inside:
                rank = int(inside.group(1))
            if text.strip():
                lines.append(Line(number, rank, text))
    return lines


def to_float(text: str) -> float | None:
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


# The most bytes a memory figure of a log may state: past it a figure is no GPU's (1e305 GiB overflowed
# to inf and round() raised: a 500 from a pasted log; logs review). 1 PiB, a thousand times any card.
MAX_MEMORY_BYTES = 2.0**50


def to_bytes(value: float, unit: str) -> int | None:
    """``value`` ``unit`` in bytes; None past ``MAX_MEMORY_BYTES`` or below 0 (no GPU's figure)."""
    scaled = value * UNITS[unit.lower()]
    return round(scaled) if 0 <= scaled <= MAX_MEMORY_BYTES else None


@dataclass(frozen=True, slots=True)
class Reading:
    """One figure as one line states it."""

    value: float
    line: Line
    step: int | None = None


@dataclass(slots=True)
class Readings:
    """What a format's parser found, before warm-up is skipped and figures are made."""

    step_s: list[Reading] = field(default_factory=list)
    tokens_per_s_per_gpu: list[Reading] = field(default_factory=list)
    samples_per_s: list[Reading] = field(default_factory=list)
    tflops_per_gpu: list[Reading] = field(default_factory=list)
    mfu: list[Reading] = field(default_factory=list)
    memory: dict[MemoryStatistic, list[Reading]] = field(default_factory=dict)
    global_batch_size: list[Reading] = field(default_factory=list)
    world_size: list[Reading] = field(default_factory=list)  # GPUs the run says it used
    # figures a framework states once for the whole run (HF Trainer's train metrics): used when
    # the log has no per-step reading of the same figure
    summary: dict[str, Reading] = field(default_factory=dict)
    cut_lines: list[Line] = field(default_factory=list)  # lines of the format, cut before a figure
    notes: list[str] = field(default_factory=list)

    def add_memory(self, statistic: MemoryStatistic, reading: Reading) -> None:
        if not 0 <= reading.value <= MAX_MEMORY_BYTES:  # no GPU's figure (and inf would not round)
            self.notes.append(
                f"line {reading.line.number}: a {statistic} figure of {reading.value:.4g} bytes is no GPU's: "
                "left out"
            )
            return
        self.memory.setdefault(statistic, []).append(reading)

    def timed(self) -> bool:
        """Whether a step time or a throughput was read (the summary's included)."""
        series = (self.step_s, self.tokens_per_s_per_gpu, self.samples_per_s)
        return any(series) or any(key in self.summary for key in TIMED_SUMMARY_KEYS)

    def kinds(self) -> int:
        """How many kinds of figure were read (0: none of this format's lines)."""
        series = (self.step_s, self.tokens_per_s_per_gpu, self.samples_per_s, self.tflops_per_gpu, self.mfu)
        return sum(1 for s in series if s) + sum(1 for m in self.memory.values() if m) + len(self.summary)


# summary entries that give a step time or a throughput (HF Trainer's speed_metrics)
TIMED_SUMMARY_KEYS = ("train_steps_per_second", "train_samples_per_second")


@dataclass(frozen=True, slots=True)
class Figure:
    """A figure of the run, how it was made from the log and from which lines."""

    name: str
    value: float
    unit: str
    how: str
    lines: tuple[int, ...]
    statistic: MemoryStatistic | None = None
    steady: bool = True  # False: made of warm-up readings alone (start-up included)

    def stored(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "value": self.value, "unit": self.unit, "how": self.how}
        if self.statistic is not None:
            out["statistic"] = self.statistic
        out["lines"] = list(self.lines[:MAX_LINE_NUMBERS])
        return out


def line_numbers(readings: Iterable[Reading]) -> tuple[int, ...]:
    return tuple(sorted({r.line.number for r in readings}))


def steady(readings: Sequence[Reading]) -> tuple[list[Reading], list[Reading]]:
    """(steady, warm-up): a reading at step <= WARMUP_STEPS, the first of its rank, or one whose
    interval starts in the warm-up (its rank's reading before it was at step <= WARMUP_STEPS) is
    warm-up. Megatron-LM's interval timer is not reset after the iteration-1 line (training.py
    training_log, since c40b6ea: "log stats but don't reset accumulators"), so its iteration-10 line
    averages steps 1-10, start-up included (logs review: a 20-iteration smoke test read 9.5% slow).
    Readings without a step number are all steady."""
    last: dict[int | None, int | None] = {}
    kept, skipped = [], []
    for reading in readings:
        first = reading.line.rank not in last
        before = last.get(reading.line.rank)
        last[reading.line.rank] = reading.step
        after_warm_up = before is not None and before <= WARMUP_STEPS
        if reading.step is not None and (reading.step <= WARMUP_STEPS or first or after_warm_up):
            skipped.append(reading)
        else:
            kept.append(reading)
    return kept, skipped


def median_figure(name: str, unit: str, readings: Sequence[Reading], what: str) -> Figure | None:
    """The median of the steady readings (all of them, said so, when every reading is warm-up)."""
    if not readings:
        return None
    kept, skipped = steady(readings)
    ranks = {r.line.rank for r in readings if r.line.rank is not None}
    spread = f" from {len(ranks)} ranks" if len(ranks) > 1 else ""
    if kept:
        steps = [r.step for r in kept if r.step is not None]
        span = f" (steps {min(steps)}-{max(steps)})" if steps else ""
        how = f"median of {len(kept)} steady {what} readings{span}{spread}"
        if skipped:
            readings_word = "reading" if len(skipped) == 1 else "readings"
            how += (
                f"; {len(skipped)} warm-up {readings_word} skipped (step <= {WARMUP_STEPS}, a rank's first, "
                "or one whose interval starts there)"
            )
        used = kept
    else:
        used = list(readings)
        how = (
            f"median of {len(used)} {what} readings{spread}, every one of them warm-up (step <= "
            f"{WARMUP_STEPS}, a rank's first, or one whose interval starts there): no steady-state reading "
            "in this log, so the figure includes start-up; a longer excerpt gives a better one"
        )
    value = statistics.median(r.value for r in used)
    return Figure(name, value, unit, how, line_numbers(used), steady=bool(kept))


def memory_figure(memory: dict[MemoryStatistic, list[Reading]]) -> Figure | None:
    """The largest figure of every memory reading and rank (the most-loaded rank, as the estimate
    counts it), naming its statistic. At one moment device used >= reserved >= allocated, and a peak
    >= the current figure, so the largest reading is the most inclusive statistic unless that one was
    printed earlier (DeepSpeed's see_memory_usage at start-up, its timer's MaxMemAllocated later);
    ties go to the statistic closest to the estimate's total (STATISTIC_PREFERENCE)."""
    candidates = [
        (reading.value, -STATISTIC_PREFERENCE.index(statistic), statistic, reading)
        for statistic, readings in memory.items()
        for reading in readings
    ]
    if not candidates:
        return None
    _, _, statistic, top = max(candidates, key=lambda c: (c[0], c[1]))
    readings = memory[statistic]
    ranks = {r.line.rank for r in readings if r.line.rank is not None}
    over = f" over {len(readings)} readings" + (f" from {len(ranks)} ranks" if len(ranks) > 1 else "")
    others = [s for s in STATISTIC_PREFERENCE if s != statistic and memory.get(s)]
    also = f"; the log also states {', '.join(others)}, none larger" if others else ""
    how = f"largest {statistic}{over} (line {top.line.number}): {STATISTIC_MEANING[statistic]}{also}"
    return Figure(
        "peak_memory_bytes_per_gpu", float(round(top.value)), "bytes", how, (top.line.number,), statistic
    )


# ---------------------------------------------------------------- PyTorch's out-of-memory error

# the caching allocator's error, and the runtime's own where memory outside it ran out (cuBLAS workspaces,
# NCCL buffers: c10's C10_CUDA_CHECK "CUDA error: out of memory", NCCL's "Cuda failure 'out of memory'";
# a torchtitan run that crashed so was stored as a healthy one: logs review)
_OOM = re.compile(
    r"(?:CUDA|HIP|XPU|MPS) out of memory|OutOfMemoryError|(?:CUDA|HIP) error: out of memory"
    r"|(?:Cuda|Hip) failure '?out of memory"
)
_SIZE = rf"({NUMBER}) ?([KMGT]i?B|B)\b"
_OOM_FIELDS = {
    # PyTorch >= 2.1: "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which
    # 1.23 GiB is free. Including non-PyTorch memory, this process has 77.87 GiB memory in use. Of
    # the allocated memory 75.20 GiB is allocated by PyTorch, and 1.45 GiB is reserved by PyTorch
    # but unallocated."
    "tried_to_allocate_bytes": re.compile(rf"Tried to allocate {_SIZE}"),
    "capacity_bytes": re.compile(rf"total capacity of {_SIZE}|{_SIZE} total capacity"),
    "free_bytes": re.compile(rf"of which {_SIZE} is free|{_SIZE} free"),
    "process_in_use_bytes": re.compile(rf"this process has {_SIZE} memory in use"),
    "allocated_by_pytorch_bytes": re.compile(rf"{_SIZE} is allocated by PyTorch|{_SIZE} already allocated"),
    "reserved_unallocated_bytes": re.compile(rf"{_SIZE} is reserved by PyTorch but unallocated"),
    # PyTorch 1.x: "(GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated; 3.44 MiB free;
    # 14.80 GiB reserved in total by PyTorch)"
    "reserved_by_pytorch_bytes": re.compile(rf"{_SIZE} reserved in total by PyTorch"),
}
_OOM_GPU = re.compile(r"\bGPU (\d+)\b")


@dataclass(frozen=True, slots=True)
class OutOfMemory:
    line: Line
    gpu: int | None
    quoted: dict[str, int]

    def stored(self) -> dict[str, Any]:
        return {"line": self.line.number, "rank": self.line.rank, "gpu": self.gpu, **self.quoted}


def out_of_memory(lines: Sequence[Line]) -> OutOfMemory | None:
    """The first out-of-memory error, with the figures it quotes (every rank prints its own; the
    first is the one that failed first)."""
    for line in lines:
        if _OOM.search(line.text) is None:
            continue
        if "out of memory" not in line.text and "Tried to allocate" not in line.text:
            continue  # "raise OutOfMemoryError" in a traceback's source line: not the error itself
        quoted: dict[str, int] = {}
        for key, pattern in _OOM_FIELDS.items():
            match = pattern.search(line.text)
            if match:
                groups = [g for g in match.groups() if g is not None]
                value = to_float(groups[0])
                size = to_bytes(value, groups[1]) if value is not None and len(groups) >= 2 else None
                if size is not None:
                    quoted[key] = size
        gpu = _OOM_GPU.search(line.text)
        return OutOfMemory(line, int(gpu.group(1)) if gpu else None, quoted)
    return None


def excerpt(line: Line) -> dict[str, Any]:
    text = line.text.strip()
    if len(text) > EXCERPT_CHARS:
        text = text[: EXCERPT_CHARS - 1] + "…"
    return {"line": line.number, "rank": line.rank, "text": text}
