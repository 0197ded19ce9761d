"""Run the validation harness: measure (all or the CI subset), then compare and write REPORT.md.

    python -m validation.run --ci    # CI, a few minutes on 2 cores; rewrites no data file
    python -m validation.run --all   # re-measure everything, rewrite validation/data/*.json

``--ci`` re-measures the CI subset of activations and checks it against the committed file
(``validation.activations --ci --check``, 1% drift), rebuilds every parameter count on the meta
device and checks it against the committed file (``validation.param_counts --check``), then
compares the whole committed data files and the published cases with the estimator and writes
``validation/REPORT.md`` (``validation.report``). ``--all`` measures everything, rewriting the data
files, then writes the report. Exits 1 when any step fails; every step runs regardless.

The measuring steps run as subprocesses (they import torch); this module and the report do not.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from validation.cases import ROOT


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    ok: bool
    seconds: float


def measure(name: str, *args: str) -> Step:
    """Run ``python -m <args>`` from the repository root, streaming its output."""
    print(f"== {name}: python -m {' '.join(args)}", flush=True)
    started = time.perf_counter()
    returncode = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, check=False).returncode
    return Step(name, returncode == 0, time.perf_counter() - started)


def report() -> Step:
    from validation import report as report_module  # after the measurements: it reads the data files

    print("== report: python -m validation.report", flush=True)
    started = time.perf_counter()
    ok = not report_module.write()
    return Step(
        "report (whole data files and published cases vs the estimator)", ok, time.perf_counter() - started
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.run", description=__doc__.split("\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--ci", action="store_true", help="re-measure the CI subset and check; rewrite no data"
    )
    which.add_argument("--all", action="store_true", help="re-measure everything and rewrite the data files")
    args = parser.parse_args(argv)

    if args.ci:
        steps = [
            measure("activations, CI subset vs committed", "validation.activations", "--ci", "--check"),
            measure("parameter counts, all vs committed", "validation.param_counts", "--check"),
        ]
    else:
        steps = [
            measure("activations, all (rewrites the data file)", "validation.activations", "--all"),
            measure("parameter counts, all (rewrites the data file)", "validation.param_counts"),
        ]
    steps.append(report())

    print("== summary")
    for step in steps:
        print(f"{'ok  ' if step.ok else 'FAIL'} {step.seconds:6.1f}s  {step.name}")
    total = sum(step.seconds for step in steps)
    failed = [step for step in steps if not step.ok]
    print(f"{'FAILED' if failed else 'passed'} in {total:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
