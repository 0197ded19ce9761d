"""A posted log is scanned in linear time whatever its lines hold (bounded-work review, stop 39):
an 8 KB line of digits after "CUDA out of memory" took 16 s, 16 KB 65 s, with the GIL held, so
every other request of the process waited."""

from __future__ import annotations

import contextlib
import re
import time

from service.runlogs import parse_log
from service.runlogs.common import MAX_LINE_CHARS, split_lines


def test_a_long_line_of_digits_is_read_in_linear_time() -> None:
    # quadratic, 64 KB of digits is about 17 minutes of regex backtracking; linear, milliseconds
    for line in (
        "CUDA out of memory " + "1" * 65_536,
        "1" * 65_536 + "/" + "2" * 65_536 + " [00:01<00:02, 1.5s/it]",
    ):
        started = time.process_time()
        with contextlib.suppress(ValueError):  # not a log it understands: refused, if quickly
            parse_log(line)
        assert time.process_time() - started < 5.0


def test_a_line_is_read_up_to_its_limit_and_figures_are_still_found() -> None:
    (line,) = split_lines("x" * (3 * MAX_LINE_CHARS))
    assert len(line.text) == MAX_LINE_CHARS
    oom = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.11 GiB of which 1.23 GiB is free."
    )
    parsed = parse_log(oom)
    assert parsed.out_of_memory is not None
    assert parsed.out_of_memory.quoted["capacity_bytes"] == round(79.11 * 2**30)


def test_the_hf_training_bar_is_the_one_of_its_stated_steps() -> None:
    """An evaluation bar with more batches than training steps was read as the training bar (runs
    review, stop 39): 0.08 s/step instead of 4.71, then set aside as faster than the peak."""
    log = "\\n".join(
        [
            "***** Running training *****",
            "  Total optimization steps = 100",
            " 50%|#####     | 50/100 [03:55<03:55,  4.71s/it]",
            " 80%|########  | 200/250 [00:16<00:04, 12.29it/s]",
            " 51%|#####     | 51/100 [04:00<03:50,  4.71s/it]",
        ]
    )
    parsed = parse_log(log, "hf_trainer")
    assert parsed.step_s is not None and parsed.step_s.value == 4.71


def _runlog_patterns() -> list[re.Pattern[str]]:
    from service.runlogs import common, formats

    return [p for module in (common, formats) for p in vars(module).values() if isinstance(p, re.Pattern)]


def test_no_pattern_backtracks_through_a_run_of_digits_after_its_own_keyword() -> None:
    """Each pattern's own keywords ("tflops:", "elapsed time per iteration (ms):", ...) followed by a
    line-long run of digits that no figure ends: torchtitan's tflops pattern split the run every way
    at every digit (0.4 s of CPU a 4 KB line, 98 s for a 960 KB log, the GIL held: bounded-work
    review, stop 41). Every keyword of every pattern, each shape of run, 25 times (quadratic: 0.4 s
    a line of the run, 10 s for each format), read in every format within seconds."""
    literal = [re.sub(r"\\(.)", r"\1", re.sub(r"\\[sdwbSDWB]", " ", p.pattern)) for p in _runlog_patterns()]
    keywords = sorted({k.strip() for text in literal for k in KEYWORD.findall(text)})
    assert {"tflops:", "tps:", "elapsed time per iteration (ms):"} <= set(keywords) and len(keywords) >= 10
    runs = ("1" * 4000 + "x", "1," * 2000 + "x", "1." * 2000 + "x", "." + "1" * 4000 + "x")
    lines = [f"step: 1  loss: 1.0  {keyword} {run}" for keyword in keywords for run in runs] * 25
    started = time.process_time()
    for fmt in ("auto", "torchtitan", "megatron", "deepspeed", "hf_trainer", "accelerate"):
        with contextlib.suppress(ValueError):
            parse_log("\n".join(lines), fmt)
    assert time.process_time() - started < 10.0, len(lines)


# a pattern's literal keyword: letters (and spaces, brackets, slashes) up to a colon
KEYWORD = re.compile(r"[A-Za-z][A-Za-z _()/]*:")
