"""One reader per framework: the lines it prints as it trains, as its source prints them.

Each reader takes the log's lines and returns the readings it found. A figure counts only when
the text after it is what the framework prints there (Megatron-LM's " |", DeepSpeed's "," or "GB",
torchtitan's next field): a line cut in the middle of a number is counted as cut, never read as a
smaller number.

Sources (the format strings these patterns follow):
- Megatron-LM: megatron/training/training.py ``training_log`` (the iteration line, printed by the
  last rank) and megatron/training/utils ``report_memory`` (``[Rank R] (after N iterations) memory
  (MB) | allocated: .. | max allocated: .. | reserved: .. | max reserved: ..`` and, with
  ``--log-device-memory-used``, ``| total device memory used: ..``; MB are MiB).
- torchtitan: torchtitan/components/metrics.py ``MetricsProcessor.log`` (``step: N  loss: ..
  grad_norm: ..  memory: X GiB(P%)  tps: T  tflops: F  mfu: M%``; memory is the interval's
  max reserved; tps is tokens per second per GPU, printed as wps before the tflops field came) with
  ANSI colours unless disabled.
- DeepSpeed: deepspeed/utils/timer.py ``ThroughputTimer.stop`` (``epoch=E/micro_step=M/
  global_step=G, RunningAvgSamplesPerSec=.., CurrSamplesPerSec=.., MemAllocated=..GB,
  MaxMemAllocated=..GB``; samples of the global batch, GB are GiB), deepspeed/runtime/pipe/engine.py
  ``PipelineEngine.train_batch`` (``steps: G loss: .. iter time (s): T samples/sec: S``) and
  deepspeed/runtime/utils.py
  ``see_memory_usage`` (``MA .. GB  Max_MA .. GB  CA .. GB  Max_CA .. GB``; CA is the allocator's
  reserved memory, Max_CA rounded to a whole GiB).
- HF Trainer: transformers trainer.py ``self.log`` (the printed dicts, ``{'loss': .., ...}`` and at
  the end ``{'train_runtime': .., 'train_samples_per_second': .., 'train_steps_per_second': ..}``
  from trainer_utils ``speed_metrics``, with ``TrainerMemoryTracker``'s ``*_mem_gpu_*_delta`` when
  ``skip_memory_metrics=False``), ``log_metrics``'s ``***** train metrics *****`` block, and the
  tqdm progress bar (``450/1000 [10:23<12:41,  1.38s/it]``).
- accelerate: it prints what the script prints. Read: the tqdm progress bar, accelerate's
  examples/by_feature/peak_memory_usage.py lines (``GPU Total Peak Memory consumed during the train
  (max): N``, MiB of max allocated) and the ``Max CUDA memory allocated was X GB`` / ``Max CUDA
  memory reserved was X GB`` lines of llama-recipes' memory tracker (GiB), and HF-style dicts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from service.runlogs.common import GIB, MIB, NUMBER, Line, Reading, Readings, to_float

# ---------------------------------------------------------------- Megatron-LM

_MEG_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+\s*\|")
_MEG_ELAPSED = re.compile(rf"elapsed time per iteration \(ms\):\s*({NUMBER})\s*\|")
_MEG_TFLOPS = re.compile(rf"throughput per GPU \(TFLOP/s/GPU\):\s*({NUMBER})\s*\|")
_MEG_BATCH = re.compile(r"global batch size:\s*(\d+)\s*\|")
# arguments.py validate_args: "using world size: 16, data-parallel size: 16, ..."
_MEG_WORLD = re.compile(r"using world size: (\d+)")
_MEG_MEMORY = re.compile(r"\(after (\d+) iterations\) memory \(MB\)")
# the last field ends the line: a number cut there keeps its decimals only if it was not cut
_MEG_FIELDS = {
    "allocated": re.compile(rf"\| allocated:\s*({NUMBER})(?=\s*\||\s*$)"),
    "max_allocated": re.compile(rf"\| max allocated:\s*({NUMBER})(?=\s*\||\s*$)"),
    "reserved": re.compile(rf"\| reserved:\s*({NUMBER})(?=\s*\||\s*$)"),
    "max_reserved": re.compile(rf"\| max reserved:\s*({NUMBER})(?=\s*\||\s*$)"),
    "device_used": re.compile(rf"\| total device memory used:\s*({NUMBER})(?=\s*\||\s*$)"),
}
_DECIMALS = re.compile(r"\.\d")


def megatron(lines: Sequence[Line]) -> Readings:
    found = Readings()
    for line in lines:
        text = line.text
        iteration = _MEG_ITERATION.search(text)
        if iteration:
            step = int(iteration.group(1))
            elapsed = _MEG_ELAPSED.search(text)
            value = to_float(elapsed.group(1)) if elapsed else None
            if value is None:
                found.cut_lines.append(line)
            else:
                found.step_s.append(Reading(value / 1000.0, line, step))
            tflops = _MEG_TFLOPS.search(text)
            if tflops and (number := to_float(tflops.group(1))) is not None:
                found.tflops_per_gpu.append(Reading(number, line, step))
            batch = _MEG_BATCH.search(text)
            if batch:
                found.global_batch_size.append(Reading(float(batch.group(1)), line, step))
            continue
        if (world := _MEG_WORLD.search(text)) is not None:
            found.world_size.append(Reading(float(world.group(1)), line))
            continue
        memory = _MEG_MEMORY.search(text)
        if memory:
            step = int(memory.group(1))
            read_any = False
            for statistic, pattern in _MEG_FIELDS.items():
                match = pattern.search(text)
                # report_memory prints two decimals (older versions the raw float): a value at the end
                # of the line without them is a number cut short
                if (
                    match
                    and _DECIMALS.search(match.group(1))
                    and (mib := to_float(match.group(1))) is not None
                ):
                    found.add_memory(statistic, Reading(mib * MIB, line, step))  # type: ignore[arg-type]
                    read_any = True
            if not read_any:
                found.cut_lines.append(line)
    return found


# ---------------------------------------------------------------- torchtitan

_TT_STEP = re.compile(r"(?<!validate )\bstep:\s*(\d+)\s+loss:")
_TT_MEMORY = re.compile(rf"memory:\s*({NUMBER})\s*GiB\(\s*({NUMBER})%\)")
_TT_TPS = re.compile(r"tps:\s*([\d,]+)(?=\s{2}|\s*tflops)")
# torchtitan before its tflops field printed the same tokens/s per GPU as "wps" (train.py:
# ntokens_since_last_log / (time_delta * model_parallel_size)), then "mfu"
_TT_WPS = re.compile(r"wps:\s*([\d,]+)(?=\s{2}|\s*mfu)")
# one way to read each digit (a run of digits and commas, then a fraction), so a failed lookahead
# backtracks through the run once: "[\d,]*\.?\d+" could split a run of n digits n ways, each tried
# again at every digit, 0.4 s of CPU for one 4 KB line (bounded-work review, stop 41)
_TT_TFLOPS = re.compile(r"tflops:\s*(\d[\d,]*(?:\.\d+)?|\.\d+)(?=\s{2}|\s*mfu)")
_TT_MFU = re.compile(rf"mfu:\s*({NUMBER})%")


# torchtitan/distributed/parallel_dims.py: "Building device mesh with parallelism: pp=1, dp_replicate=1,
# dp_shard=8, cp=1, tp=2, ep=1": the run's GPUs are pp x dp_replicate x dp_shard x cp x tp (ep folds into
# dp_shard x cp); a 16-GPU log calibrated an 8-GPU plan without it (runs review)
_TT_MESH = re.compile(r"Building device mesh with parallelism: (.{1,200})")
_TT_DEGREE = re.compile(r"\b(pp|dp_replicate|dp_shard|cp|tp)=(\d{1,7})\b")


def torchtitan(lines: Sequence[Line]) -> Readings:
    found = Readings()
    for line in lines:
        if (mesh := _TT_MESH.search(line.text)) is not None:
            degrees = dict(_TT_DEGREE.findall(mesh.group(1)))
            if len(degrees) == 5:
                world = 1
                for value in degrees.values():
                    world *= int(value)
                found.world_size.append(Reading(float(world), line))
            continue
        step_match = _TT_STEP.search(line.text)
        if step_match is None:
            continue
        step = int(step_match.group(1))
        memory = _TT_MEMORY.search(line.text)
        if memory and (gib := to_float(memory.group(1))) is not None:
            found.add_memory("max_reserved", Reading(gib * GIB, line, step))
        tps = _TT_TPS.search(line.text) or _TT_WPS.search(line.text)
        if tps and (value := to_float(tps.group(1))) is not None:
            found.tokens_per_s_per_gpu.append(Reading(value, line, step))
        else:
            found.cut_lines.append(line)
        tflops = _TT_TFLOPS.search(line.text)
        if tflops and (value := to_float(tflops.group(1))) is not None:
            found.tflops_per_gpu.append(Reading(value, line, step))
        mfu = _TT_MFU.search(line.text)
        if mfu and (value := to_float(mfu.group(1))) is not None:
            found.mfu.append(Reading(value / 100.0, line, step))
    return found


# ---------------------------------------------------------------- DeepSpeed

_DS_THROUGHPUT = re.compile(r"epoch=\d+/micro_step=\d+/global_step=(\d+)")
_DS_CURRENT = re.compile(rf"CurrSamplesPerSec=({NUMBER}),")
_DS_RUNNING = re.compile(rf"RunningAvgSamplesPerSec=({NUMBER}),")
_DS_ALLOCATED = re.compile(rf"\bMemAllocated=({NUMBER})GB")
_DS_MAX_ALLOCATED = re.compile(rf"MaxMemAllocated=({NUMBER})GB")
_DS_SEE_MEMORY = {
    "allocated": re.compile(rf"(?<![_\w])MA ({NUMBER}) GB"),
    "max_allocated": re.compile(rf"Max_MA ({NUMBER}) GB"),
    "reserved": re.compile(rf"(?<![_\w])CA ({NUMBER}) GB"),
    "max_reserved": re.compile(rf"Max_CA ({NUMBER}) GB"),
}


# deepspeed/runtime/pipe/engine.py ``PipelineEngine.train_batch`` on rank 0 every steps_per_print
# steps: "steps: G loss: L iter time (s): T samples/sec: S" (newer: "step: G / N loss: ..." and an
# eta after); T the interval's mean step, S = train_batch_size / T, both with :0.3f (three decimals:
# fewer means the line was cut there)
# deepspeed/runtime/pipe/engine.py train_batch; since #5338 (Apr 2024) each extra loss the model reports
# (an MoE's moe_loss) is printed as "name: value" between the loss and the iter time (logs review: a 422);
# at most 8 of them: unbounded, the lazy repetition is quadratic in a line's tokens (lines are cut at
# MAX_LINE_CHARS, and a search stays linear in them this way)
_DS_PIPE = re.compile(
    r"\bsteps?:\s*(\d+)(?:\s*/\s*\d+)?\s+loss:\s*\S+(?:\s+[A-Za-z_]\w*:\s*\S+){0,8}?"
    r"\s+iter time \(s\):\s*(\S*)(?:\s+samples/sec:\s*(\S*))?"
)
_THREE_DECIMALS = re.compile(r"\d+\.\d{3}")


def _deepspeed_pipe(match: re.Match[str], line: Line, found: Readings) -> None:
    step = int(match.group(1))
    iter_s, samples = match.group(2), (match.group(3) or "").rstrip(",")
    if not _THREE_DECIMALS.fullmatch(iter_s) or float(iter_s) <= 0:
        found.cut_lines.append(line)
        return
    found.step_s.append(Reading(float(iter_s), line, step))
    if _THREE_DECIMALS.fullmatch(samples) and float(samples) > 0:
        found.samples_per_s.append(Reading(float(samples), line, step))


# DeepSpeedConfig.print (runtime/config.py): "  train_batch_size ............. 64" and the world size it
# divides it by; a batch-64 log calibrated a batch-128 plan without them (runs review)
_DS_TRAIN_BATCH = re.compile(r"(?<![\w.])train_batch_size \.{3,} (\d{1,9})\s*$")
_DS_WORLD = re.compile(r"(?<![\w.])world_size \.{3,} (\d{1,9})\s*$")


def deepspeed(lines: Sequence[Line]) -> Readings:
    found = Readings()
    for line in lines:
        text = line.text
        if (batch := _DS_TRAIN_BATCH.search(text)) is not None:
            found.global_batch_size.append(Reading(float(batch.group(1)), line))
            continue
        if (world := _DS_WORLD.search(text)) is not None:
            found.world_size.append(Reading(float(world.group(1)), line))
            continue
        if "iter time (s):" in text and (pipe := _DS_PIPE.search(text)) is not None:
            _deepspeed_pipe(pipe, line, found)
            continue
        timer = _DS_THROUGHPUT.search(text)
        if timer:
            step = int(timer.group(1))
            current = _DS_CURRENT.search(text)
            value = to_float(current.group(1)) if current else None
            if value is not None and value > 0:
                found.samples_per_s.append(Reading(value, line, step))
            else:
                found.cut_lines.append(line)
            for statistic, pattern in (("allocated", _DS_ALLOCATED), ("max_allocated", _DS_MAX_ALLOCATED)):
                match = pattern.search(text)
                if match and (gib := to_float(match.group(1))) is not None:
                    found.add_memory(statistic, Reading(gib * GIB, line, step))  # type: ignore[arg-type]
            continue
        if "Max_MA" in text or ("MA " in text and " GB" in text and "CA " in text):
            for statistic, pattern in _DS_SEE_MEMORY.items():
                match = pattern.search(text)
                if match and (gib := to_float(match.group(1))) is not None:
                    found.add_memory(statistic, Reading(gib * GIB, line))  # type: ignore[arg-type]
    if found.memory.get("max_reserved"):
        found.notes.append("DeepSpeed's see_memory_usage rounds Max_CA to a whole GiB")
    return found


# ---------------------------------------------------------------- HF Trainer and accelerate

_TQDM = re.compile(rf"(?<!\d)(\d+)/(\d+) \[[\d:]+<[\d:?]+,\s+({NUMBER})(s/it|it/s)")
_DICT_ENTRY = re.compile(rf"'(\w+)':\s*(?:np\.float\d+\(|np\.int\d+\()?({NUMBER})\)?(?=\s*[,}}])")
_METRICS_ENTRY = re.compile(r"^\s*(\w+)\s*=\s*(\S+)\s*$")
_RUNTIME = re.compile(r"^(\d+):(\d{2}):(\d{2}(?:\.\d+)?)$")
_HF_MEMORY_KEYS = (
    "before_init_mem_gpu",
    "init_mem_gpu_alloc_delta",
    "train_mem_gpu_alloc_delta",
    "train_mem_gpu_peaked_delta",
)


# transformers' Trainer._inner_training_loop logs "  Total optimization steps = 100" before the bar,
# and "  Total train batch size (w. parallel, distributed & accumulation) = 128": the global batch
_TOTAL_STEPS = re.compile(r"Total optimization steps = ([\d,]+)")
_HF_TOTAL_BATCH = re.compile(
    r"Total train batch size \(w\. parallel, distributed & accumulation\) = ([\d,]+)"
)


def _tqdm(lines: Sequence[Line], found: Readings) -> None:
    """The training bar's rate (tqdm's smoothed recent rate, s/it or it/s): the bar of the Trainer's
    "Total optimization steps" where it says them, else the bar with the most steps, so that an
    evaluation bar's batches are not read as training steps (an eval bar of 250 batches beside a
    100-step training bar once was)."""
    stated = None
    for line in lines:
        if (match := _TOTAL_STEPS.search(line.text)) is not None:
            stated = int(match.group(1).replace(",", ""))
    bars: list[tuple[int, int, float, Line]] = []
    for line in lines:
        for match in _TQDM.finditer(line.text):
            rate = to_float(match.group(3))
            if rate is None or rate <= 0:
                continue
            seconds = rate if match.group(4) == "s/it" else 1.0 / rate
            bars.append((int(match.group(1)), int(match.group(2)), seconds, line))
    if not bars:
        return
    totals = {b[1] for b in bars}
    total = stated if stated in totals else max(totals)
    last_step = -1
    for step, bar_total, seconds, line in bars:
        if bar_total == total and step != last_step:  # a redraw of the same step says nothing new
            found.step_s.append(Reading(seconds, line, step))
            last_step = step


def _hf_value(key: str, text: str) -> float | None:
    """A value as printed in the dict (a number) or by log_metrics (h:mm:ss.ss, 1234MB, 56GF)."""
    runtime = _RUNTIME.match(text)
    if runtime:
        return int(runtime.group(1)) * 3600 + int(runtime.group(2)) * 60 + float(runtime.group(3))
    if "_mem_" in key and text.endswith("MB"):
        value = to_float(text[:-2])
        return value * MIB if value is not None else None
    return to_float(text.rstrip("GF"))


def hf_trainer(lines: Sequence[Line]) -> Readings:
    found = Readings()
    metrics: dict[str, Reading] = {}
    in_metrics_block = False
    for line in lines:
        text = line.text
        if (total := _HF_TOTAL_BATCH.search(text)) is not None:
            found.global_batch_size.append(Reading(float(total.group(1).replace(",", "")), line))
            continue
        if "***** train metrics *****" in text:
            in_metrics_block = True
            continue
        if in_metrics_block:
            entry = _METRICS_ENTRY.match(text)
            if entry:
                value = _hf_value(entry.group(1), entry.group(2))
                if value is not None:
                    metrics[entry.group(1)] = Reading(value, line)
                continue
            in_metrics_block = False
        if "{'" in text:
            entries = {k: v for k, raw in _DICT_ENTRY.findall(text) if (v := to_float(raw)) is not None}
            if "train_runtime" in entries or any(k in entries for k in _HF_MEMORY_KEYS):
                for key, value in entries.items():
                    metrics[key] = Reading(value, line)
            elif "'train_runtime'" in text:
                found.cut_lines.append(line)
    for key in ("train_runtime", "train_samples_per_second", "train_steps_per_second"):
        if key in metrics:
            found.summary[key] = metrics[key]
    for line in lines:  # the steps train_runtime divides into (train_steps_per_second is rounded to 3 places)
        if (steps := _TOTAL_STEPS.search(line.text)) is not None:
            found.summary["total_optimization_steps"] = Reading(float(steps.group(1).replace(",", "")), line)
    if all(key in metrics for key in _HF_MEMORY_KEYS):
        peak = sum(metrics[key].value for key in _HF_MEMORY_KEYS)
        found.add_memory("max_allocated", Reading(peak, metrics["train_mem_gpu_peaked_delta"].line))
        found.notes.append(
            "HF Trainer's peak is derived: before_init_mem_gpu + init_mem_gpu_alloc_delta + "
            "train_mem_gpu_alloc_delta + train_mem_gpu_peaked_delta (TrainerMemoryTracker's max allocated)"
        )
    elif "train_mem_gpu_peaked_delta" in metrics:
        found.notes.append(
            "train_mem_gpu_peaked_delta alone is relative to what train() started with: no peak read "
            "(the log lacks before_init_mem_gpu and the alloc deltas)"
        )
    _tqdm(lines, found)
    return found


_ACC_PEAK_MIB = re.compile(r"(?:GPU )?Total Peak Memory consumed during the train \(max\):\s*(\d+)\s*$")
_RECIPES = {
    "max_allocated": re.compile(rf"Max CUDA memory allocated was ({NUMBER}) GB"),
    "max_reserved": re.compile(rf"Max CUDA memory reserved was ({NUMBER}) GB"),
}


def accelerate(lines: Sequence[Line]) -> Readings:
    found = Readings()
    for line in lines:
        if line.text.lstrip().startswith("CPU "):
            continue  # the same tracker's host-memory lines
        peak = _ACC_PEAK_MIB.search(line.text)
        if peak and (mib := to_float(peak.group(1))) is not None:
            found.add_memory("max_allocated", Reading(mib * MIB, line))
        for statistic, pattern in _RECIPES.items():
            match = pattern.search(line.text)
            if match and (gib := to_float(match.group(1))) is not None:
                found.add_memory(statistic, Reading(gib * GIB, line))  # type: ignore[arg-type]
    _tqdm(lines, found)
    if found.step_s:
        found.notes.append(
            "the step time is tqdm's seconds per loop iteration: where the loop iterates over "
            "micro-batches with gradient accumulation, one optimizer step is several of them"
        )
    return found


READERS: dict[str, Callable[[Sequence[Line]], Readings]] = {
    "megatron": megatron,
    "torchtitan": torchtitan,
    "deepspeed": deepspeed,
    "hf_trainer": hf_trainer,
    "accelerate": accelerate,
}

LOOKED_FOR: dict[str, str] = {
    "megatron": (
        "Megatron-LM's 'iteration N/ M | ... elapsed time per iteration (ms): X |' lines and its "
        "'[Rank R] (after N iterations) memory (MB) | allocated: ... | max reserved: ...' report"
    ),
    "torchtitan": (
        "torchtitan's 'step: N  loss: ...  memory: X GiB(P%)  tps: T  tflops: F  mfu: M%' lines (earlier "
        "releases: 'wps: T  mfu: M%')"
    ),
    "deepspeed": (
        "DeepSpeed's 'epoch=E/micro_step=M/global_step=G, RunningAvgSamplesPerSec=..., "
        "CurrSamplesPerSec=..., MemAllocated=...GB, MaxMemAllocated=...GB', its pipeline engine's "
        "'steps: G loss: ... iter time (s): T samples/sec: S' and 'MA ... GB Max_MA ... GB "
        "CA ... GB Max_CA ... GB' lines"
    ),
    "hf_trainer": (
        "HF Trainer's {'train_runtime': ..., 'train_samples_per_second': ..., 'train_steps_per_second': ...} "
        "metrics (or its '***** train metrics *****' block), its *_mem_gpu_* metrics and its tqdm bar "
        "('N/M [elapsed<remaining, X s/it]')"
    ),
    "accelerate": (
        "a tqdm bar ('N/M [elapsed<remaining, X s/it]'), 'GPU Total Peak Memory consumed during the "
        "train (max): N' (MiB) and 'Max CUDA memory allocated|reserved was X GB' lines"
    ),
}
