"""How tests/readme_examples.py reads the README (the run itself is a CI step: `make readme`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import readme_examples as rx

ADDRESS = "127.0.0.1:8000"


def lines(text: str) -> list[str]:
    return text.strip("\n").split("\n")


class Canned(rx.Runner):
    """Answers each command with a canned output instead of running it."""

    def __init__(self, outputs: dict[str, str], workdir: Path) -> None:
        super().__init__(f"http://{ADDRESS}", workdir)
        self.outputs = outputs
        self.ran: list[str] = []

    def run(self, command: rx.Command) -> str:
        self.ran.append(command.text)
        output = self.outputs.get(command.text, "")
        if command.sets:
            self.variables[command.sets] = self._id(command, output)
        return output


SH = """
```sh
# store a cluster ($ID is its id)
curl -fsS -X POST 127.0.0.1:8000/v1/clusters -d '{
  "name": "a # not a comment",
  "num_nodes": 1}'

curl -fsS 127.0.0.1:8000/v1/clusters/$ID \\
  -H 'accept: application/json'
```
"""


def test_sh_commands_end_where_quotes_close_and_continuations_stop() -> None:
    text = lines(SH)
    (block,) = rx.find_blocks(text)
    commands = rx.sh_commands(text, block)
    assert [command.line for command in commands] == [3, 7]
    assert commands[0].text.endswith('"num_nodes": 1}\'')
    assert commands[0].sets == "ID"
    assert commands[1].text.endswith("-H 'accept: application/json'")
    assert commands[1].sets is None


CONSOLE = """
<!-- readme-examples: first 1 and last 1 lines -->
```console
$ export TRAINPLAN_URL=http://127.0.0.1:8000
$ trainplan plan --model m \\
    --gpus 8xh100-sxm-80gb   # $PLAN is its id
stale output
$ trainplan report $PLAN run.log
old
```
"""


def test_console_outputs_are_rewritten_normalised_and_cut(tmp_path: Path) -> None:
    text = lines(CONSOLE)
    (block,) = rx.find_blocks(text)
    assert block.cut == (1, 1)
    plan = "trainplan plan --model m \\\n    --gpus 8xh100-sxm-80gb   # $PLAN is its id"
    runner = Canned(
        {
            plan: "plan 01M8TMNB2JXW2HS2Q1BDA3HYNN for m: feasible   \nb\nc\nd\n",
            "trainplan report $PLAN run.log": (
                "stored run 01M8TMJ9QFP92FVWCDPQETZN2Y of plan 01M8TMNB2JXW2HS2Q1BDA3HYNN "
                "at 2026-12-02T05:46:55.541+00:00\n"
            ),
        },
        tmp_path,
    )
    updated = rx.execute(text, runner)
    assert updated[updated.index("```console") :] == [
        "```console",
        "$ export TRAINPLAN_URL=http://127.0.0.1:8000",
        "$ trainplan plan --model m \\",
        "    --gpus 8xh100-sxm-80gb   # $PLAN is its id",
        "plan $PLAN for m: feasible",
        "...",
        "d",
        "$ trainplan report $PLAN run.log",
        "stored run <id> of plan $PLAN at <time>",
        "```",
    ]


def test_skipped_blocks_and_other_languages_do_not_run(tmp_path: Path) -> None:
    text = lines(
        """
<!-- readme-examples: skip (a server of its own) -->
```sh
make serve
```
```
service/   not a command
```
```python
print("not run")
```
"""
    )
    runner = Canned({}, tmp_path)
    assert rx.execute(text, runner) == text
    assert runner.ran == []


def test_a_prompt_outside_a_console_block_is_an_error() -> None:
    with pytest.raises(rx.ExampleError, match="write ```console"):
        rx.find_blocks(lines("```text\n$ trainplan gpus\n```"))


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("curl -s 127.0.0.1:8000/healthz", "curl without -f"),
        ("curl -fsS localhost:8000/healthz", "not localhost"),
        ("curl -fsS http://planner:8000/healthz", "not the service on 127.0.0.1"),
        ("curl -fsS 127.0.0.1:9/healthz", "not the service on 127.0.0.1"),
        ("trainplan keys list --url http://10.0.0.1:8000", "not the service on 127.0.0.1"),
    ],
)
def test_commands_that_could_escape_the_check_are_refused(tmp_path: Path, command: str, message: str) -> None:
    runner = rx.Runner(f"http://{ADDRESS}", tmp_path)
    with pytest.raises(rx.ExampleError, match=message):
        runner._check(rx.Command(command, 1, None), command)


def test_every_example_of_the_readme_is_read_and_reaches_only_the_service(tmp_path: Path) -> None:
    """Static: every runnable block parses and passes the checks made before a command runs."""
    text = rx.README.read_text(encoding="utf-8").split("\n")
    runner = rx.Runner(f"http://{ADDRESS}", tmp_path)
    commands: list[rx.Command] = []
    for block in rx.find_blocks(text):
        if block.skip or block.language not in rx.RUN_LANGUAGES:
            continue
        if block.language == "sh":
            commands.extend(rx.sh_commands(text, block))
        else:
            commands.extend(command for command, _, _ in rx.console_commands(text, block))
    assert len(commands) > 30
    for command in commands:
        runner._check(command, command.text)
    assert {command.sets for command in commands} >= {"ID", "PLAN"}
