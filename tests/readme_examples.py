"""The README, executed: its shell examples run in order against a fresh service, and the outputs
it prints are the ones this code gives, so they cannot drift.

    python -m tests.readme_examples          # run every example; exit 1 on a failure or a stale output
    python -m tests.readme_examples --write  # the same, rewriting README.md's printed outputs

What runs (README.md's fenced blocks, top to bottom, one service for the whole file):

- a ```sh block: every command in it (a command ends where its quotes close and its line does not end
  in a backslash; comment lines are not commands). Nothing of its output is printed in the README;
- a ```console block: every ``$ `` line (with its continuation lines) is a command, and the lines up
  to the next ``$ `` are its output, rewritten by --write from what the command printed (stdout), each
  line's trailing blanks removed and the ids normalised (below);
- a block preceded by ``<!-- readme-examples: skip (why) -->`` is not run (it starts a server of its
  own, or needs an operator's database); ``<!-- readme-examples: first N and last M lines -->`` before
  a console block cuts each longer output to those lines around a ``...`` line.

A ```text or ```bash block with ``$ `` prompts is an error (write ```console), so no example escapes.

Each command runs in ``bash`` (``set -euo pipefail``) in a scratch directory (``tests`` there links to
the repository's, for the log excerpts the examples post), with ``.venv/bin`` first on PATH and
``TRAINPLAN_URL`` set to the service. The README writes the service as ``127.0.0.1:8000``
(``make serve``'s address); it is replaced by the service's loopback port, and a command naming any
other host, or ``localhost``, fails before it runs: the examples reach only 127.0.0.1. A command
fails the check when it exits non-zero, and every ``curl`` must say ``-f`` (``--fail``), so an HTTP
error fails it instead of printing, or saving with ``-OJ``, a problem document.

Ids carry from one example to the next through shell variables: a comment ``$NAME is its id`` on
or just above a command sets ``NAME`` for the commands after it, from the ``"id"`` of the JSON it
printed (or the first id in a text output). ``export NAME=VALUE`` sets a variable too. In printed
outputs such a variable's value is written ``$NAME``, any other id ``<id>`` and a timestamp
``<time>``.

The service runs in this process on a new SQLite file with generous time budgets, so a slow machine
gets the same searches (and the same outputs) as a fast one."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
README_ADDRESS = "127.0.0.1:8000"
RUN_LANGUAGES = {"sh", "console"}
SKIP = re.compile(r"<!--\s*readme-examples:\s*skip\b")
CUT = re.compile(r"<!--\s*readme-examples:\s*first (\d+) and last (\d+) lines\s*-->")
SETS = re.compile(r"\$([A-Z][A-Z0-9_]*) is its id\b")
ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Z][A-Z0-9_]*)=(\S+)$")
ULID = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b")
TIMESTAMP = re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?")
HOST_PORT = re.compile(r"(?<![\w.@/-])(?:[a-z][a-z0-9+.-]*://)?([A-Za-z0-9.-]+):(\d{1,5})\b")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
COMMAND_TIMEOUT_S = 120
# Wide enough that the CLI's tables keep one row a line; the same on every machine.
COLUMNS = "160"


class ExampleError(Exception):
    """An example that cannot run, fails, or is written so that it could escape the check."""


@dataclasses.dataclass
class Command:
    text: str  # as the README writes it (prompts removed, continuation lines kept)
    line: int  # 1-based line of README.md where it starts
    sets: str | None  # the variable its id sets


@dataclasses.dataclass
class Block:
    language: str
    start: int  # index of the opening fence line
    end: int  # index of the closing fence line
    skip: bool
    cut: tuple[int, int] | None


def find_blocks(lines: list[str]) -> list[Block]:
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = re.match(r"^```\s*([\w-]*)", lines[index])
        if not opening:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if end == len(lines):
            raise ExampleError(f"README.md:{index + 1}: a fence that never closes")
        before = index - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        directive = lines[before] if before >= 0 else ""
        cut = CUT.search(directive)
        language = opening.group(1)
        body = lines[index + 1 : end]
        if language not in RUN_LANGUAGES and any(line.startswith("$ ") for line in body):
            raise ExampleError(
                f"README.md:{index + 1}: a ```{language or '(none)'} block with $ prompts: "
                "write ```console so that it runs"
            )
        blocks.append(
            Block(
                language=language,
                start=index,
                end=end,
                skip=bool(SKIP.search(directive)),
                cut=(int(cut.group(1)), int(cut.group(2))) if cut else None,
            )
        )
        index = end + 1
    return blocks


def _complete(text: str) -> bool:
    """Whether ``text`` is a whole shell command: no trailing backslash, every quote closed."""
    if text.rstrip().endswith("\\"):
        return False
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return False
    return True


def sh_commands(lines: list[str], block: Block) -> list[Command]:
    commands: list[Command] = []
    comments: list[str] = []
    pending: list[str] = []
    start = 0
    for index in range(block.start + 1, block.end):
        line = lines[index]
        if not pending:
            if not line.strip():
                comments = []
                continue
            if line.lstrip().startswith("#"):
                comments.append(line)
                continue
            start = index
        pending.append(line)
        text = "\n".join(pending)
        if _complete(text):
            found = SETS.search("\n".join([*comments, text]))
            commands.append(Command(text, start + 1, found.group(1) if found else None))
            pending, comments = [], []
    if pending:
        raise ExampleError(f"README.md:{start + 1}: a command that never ends (an open quote?)")
    return commands


def console_commands(lines: list[str], block: Block) -> list[tuple[Command, int, int]]:
    """Each command with the [start, end) line indexes of the output the README shows for it."""
    found: list[tuple[Command, int, int]] = []
    index = block.start + 1
    if index < block.end and not lines[index].startswith("$ "):
        raise ExampleError(f"README.md:{index + 1}: a console block must start with a $ prompt")
    while index < block.end:
        start = index
        pending = [lines[index][2:]]
        while not _complete("\n".join(pending)):
            index += 1
            if index >= block.end:
                raise ExampleError(f"README.md:{start + 1}: a command that never ends")
            pending.append(lines[index])
        index += 1
        output_start = index
        while index < block.end and not lines[index].startswith("$ "):
            index += 1
        text = "\n".join(pending)
        sets = SETS.search(text)
        found.append((Command(text, start + 1, sets.group(1) if sets else None), output_start, index))
    return found


class Runner:
    """Runs commands in order, in one scratch directory, carrying variables between them."""

    def __init__(self, base_url: str, workdir: Path) -> None:
        self.address = base_url.removeprefix("http://")
        self.workdir = workdir
        self.variables: dict[str, str] = {}
        environment = {
            key: value
            for key, value in os.environ.items()
            if not key.lower().endswith("_proxy")
            and not key.startswith(("PLANNER_", "TRAINPLAN_", "TTY_"))
            and key not in {"FORCE_COLOR", "CLICOLOR_FORCE", "LINES", "COLUMNS"}
        }
        venv_bin = REPO / ".venv" / "bin"
        environment["PATH"] = f"{venv_bin}{os.pathsep}{environment.get('PATH', '')}"
        environment["TRAINPLAN_URL"] = base_url
        environment["COLUMNS"] = COLUMNS
        environment["NO_COLOR"] = "1"
        environment["TERM"] = "dumb"
        # A CLI command that would not use the service still stays off any real database.
        environment["PLANNER_DATABASE_URL"] = f"sqlite:///{workdir / 'cli.db'}"
        self.environment = environment

    def _check(self, command: Command, text: str) -> None:
        if "localhost" in text:
            raise ExampleError(f"README.md:{command.line}: write 127.0.0.1:8000, not localhost")
        for match in HOST_PORT.finditer(text):
            if f"{match.group(1)}:{match.group(2)}" != self.address:
                raise ExampleError(
                    f"README.md:{command.line}: {match.group(0)!r} is not the service on 127.0.0.1"
                )
        try:
            words = shlex.split(text, comments=True)
        except ValueError as exc:  # pragma: no cover - _complete parsed it already
            raise ExampleError(f"README.md:{command.line}: {exc}") from exc
        for position, word in enumerate(words):
            if word != "curl":
                continue
            options = []
            for option in words[position + 1 :]:
                if option in {"|", "&&", ";", "||"}:
                    break
                options.append(option)
            fails = any(
                option in {"--fail", "--fail-with-body"}
                or (re.fullmatch(r"-[A-Za-z]+", option) is not None and "f" in option)
                for option in options
            )
            if not fails:
                raise ExampleError(
                    f"README.md:{command.line}: curl without -f: an HTTP error would pass (and "
                    "-OJ would save the problem document); write curl -fsS"
                )

    def run(self, command: Command) -> str:
        text = command.text.replace(README_ADDRESS, self.address)
        self._check(command, text)
        assignment = ASSIGNMENT.match(text.split("#", 1)[0].strip())
        if assignment:
            self.variables[assignment.group(1)] = assignment.group(2)
            return ""
        started = time.monotonic()
        try:
            result = subprocess.run(
                ["bash", "-c", f"set -euo pipefail\n{text}"],
                cwd=self.workdir,
                env={**self.environment, **self.variables},
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ExampleError(
                f"README.md:{command.line}: no answer in {COMMAND_TIMEOUT_S} s:\n{command.text}"
            ) from exc
        elapsed = time.monotonic() - started
        print(f"  README.md:{command.line}: exit {result.returncode} in {elapsed:.1f} s", flush=True)
        if result.returncode != 0:
            raise ExampleError(
                f"README.md:{command.line}: exit {result.returncode}:\n{command.text}\n"
                f"--- stdout\n{result.stdout}--- stderr\n{result.stderr}"
            )
        if command.sets:
            self.variables[command.sets] = self._id(command, result.stdout)
        return result.stdout

    @staticmethod
    def _id(command: Command, output: str) -> str:
        try:
            document = json.loads(output)
        except ValueError:
            found = ULID.search(output)
            if found:
                return found.group(0)
        else:
            if isinstance(document, dict) and isinstance(document.get("id"), str):
                return str(document["id"])
        raise ExampleError(
            f"README.md:{command.line}: ${command.sets} is its id, but it printed none:\n{output}"
        )

    def normalise(self, output: str) -> list[str]:
        names = {value: f"${name}" for name, value in self.variables.items() if ULID.fullmatch(value)}
        text = ULID.sub(lambda match: names.get(match.group(0), "<id>"), output)
        text = TIMESTAMP.sub("<time>", ANSI.sub("", text))
        return [line.rstrip() for line in text.rstrip("\n").split("\n")] if text.strip() else []


def cut(output: list[str], limits: tuple[int, int] | None) -> list[str]:
    if limits is None:
        return output
    first, last = limits
    if len(output) <= first + last + 1:
        return output
    return [*output[:first], "...", *(output[len(output) - last :] if last else [])]


def execute(lines: list[str], runner: Runner) -> list[str]:
    """Runs every example; returns the README with each console output as the commands print it."""
    updated: list[str] = []
    copied = 0
    for block in find_blocks(lines):
        if block.skip or block.language not in RUN_LANGUAGES:
            continue
        if block.language == "sh":
            for command in sh_commands(lines, block):
                runner.run(command)
            continue
        for command, output_start, output_end in console_commands(lines, block):
            output = runner.normalise(runner.run(command))
            updated.extend(lines[copied:output_start])
            updated.extend(cut(output, block.cut))
            copied = output_end
    updated.extend(lines[copied:])
    return updated


@contextlib.contextmanager
def served(database_url: str) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of the service, with budgets no example reaches."""
    import uvicorn

    from service.cli import migrate
    from service.main import create_app
    from service.settings import Settings
    from tests.loopback import free_port

    migrate(database_url)
    port = free_port()
    settings = Settings(
        database_url=database_url,
        require_auth=False,
        request_budget_s=60,
        capacity_budget_s=120,
        log_level="WARNING",
    )
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise ExampleError("the service did not start within 30 s")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite README.md's printed outputs")
    args = parser.parse_args(argv)
    original = README.read_text(encoding="utf-8")
    lines = original.split("\n")
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="readme-examples-") as scratch:
            workdir = Path(scratch) / "work"
            workdir.mkdir()
            (workdir / "tests").symlink_to(REPO / "tests")
            with served(f"sqlite:///{Path(scratch) / 'trainplan.db'}") as base_url:
                updated = "\n".join(execute(lines, Runner(base_url, workdir)))
    except ExampleError as exc:
        print(f"README example failed: {exc}", file=sys.stderr)
        return 1
    elapsed = time.monotonic() - started
    if updated == original:
        print(f"README.md: every example ran, every output is current ({elapsed:.0f} s)")
        return 0
    if args.write:
        README.write_text(updated, encoding="utf-8")
        print(f"README.md: every example ran; outputs rewritten ({elapsed:.0f} s)")
        return 0
    sys.stdout.writelines(
        difflib.unified_diff(
            original.splitlines(keepends=True),
            updated.splitlines(keepends=True),
            "README.md",
            "README.md (as the examples print today)",
        )
    )
    print("README.md's outputs are stale: run `make readme` and commit", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
