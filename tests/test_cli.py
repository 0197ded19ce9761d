"""The `trainplan` command line: the API's numbers (in-process or over HTTP), tables for people, JSON
for scripts, launcher files on disk, and exit codes scripts can use (0 feasible, 2 infeasible, 1 error)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from service.cli import cluster_from_gpus, main, memory_lines, shortfall
from service.main import create_app
from service.settings import Settings
from tests.loopback import served

PLAN_8B = ["--model", "llama-3.1-8b", "--gpus", "8xh100-sxm-80gb", "--seq", "8192", "--batch", "128"]


@pytest.fixture
def database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("PLANNER_DATABASE_URL", url)
    from service.settings import get_settings

    get_settings.cache_clear()
    yield url
    get_settings.cache_clear()


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_plan_prints_tables_and_writes_the_apis_files(database: str, tmp_path: Path) -> None:
    out = tmp_path / "plan"
    result = run("plan", *PLAN_8B, "--out", str(out))
    assert result.exit_code == 0, result.output
    for words in ("feasible", "recommended", "memory per GPU", "GiB", "tokens/s", "MFU", "wrote"):
        assert words in result.output
    files = sorted(p.name for p in out.iterdir())
    assert files  # the recommended framework's launcher and the Slurm / Kubernetes wrappers
    # --json --out: the API's plan on stdout, the same files the API serves for it, byte for byte
    out = tmp_path / "plan-json"
    plan = json.loads(run("plan", *PLAN_8B, "--json", "--out", str(out)).output)
    from fastapi.testclient import TestClient

    with TestClient(create_app(Settings(database_url=database))) as client:
        stored = client.get(f"/v1/plans/{plan['id']}").json()
        assert stored["recommended"] == plan["recommended"]
        assert sorted(a["name"] for a in stored["artifacts"]) == sorted(p.name for p in out.iterdir())
        for artifact in stored["artifacts"]:
            assert (out / artifact["name"]).read_bytes() == client.get(artifact["url"]).content
    for path in out.iterdir():
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            assert list(yaml.safe_load_all(text))
        elif path.suffix == ".json":
            json.loads(text)
        elif path.suffix in (".sh", ".sbatch"):
            assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    # the launcher tests' own checks (flags each tool accepts, world sizes, batch arithmetic), on the
    # files as written, for the recommended layout
    check_files(out, plan)


def check_files(out: Path, plan: dict[str, Any]) -> None:
    from service.catalog.models import model
    from service.catalog.tuning import default_tuning
    from service.contracts.estimates import LayoutIn
    from service.estimator.estimate import estimate
    from service.estimator.types import Plan, TrainingSpec
    from service.launchers import Artifact, Target
    from service.recommender.space import sub_cluster
    from tests.launchers.checks import check_artifact
    from tests.recommender.helpers import cluster

    fields = LayoutIn.model_fields
    layout = LayoutIn(**{k: v for k, v in plan["recommended"]["layout"].items() if k in fields}).to_domain(
        peer_to_peer=True
    )
    spec, training = model("llama-3.1-8b").spec, TrainingSpec(seq_len=8192, global_batch_size=128)
    on = sub_cluster(cluster(), layout.world_size)
    est = estimate(spec, on, layout, training, tuning=default_tuning())
    domain = Plan(model=spec, cluster=on, training=training, layout=layout, estimate=est)
    checked = 0
    for artifact in plan["artifacts"]:
        path = out / artifact["name"]
        written = Artifact(
            name=artifact["name"], target=Target(artifact["target"]), media_type=artifact["media_type"],
            content=path.read_text(),
        )  # fmt: skip
        check_artifact(written, domain)
        checked += 1
    assert checked == len(list(out.iterdir())) >= 2


def test_json_output_is_the_apis_plan_and_exit_codes_say_feasible_or_not(database: str) -> None:
    feasible = run("plan", *PLAN_8B, "--json")
    assert feasible.exit_code == 0
    plan = json.loads(feasible.output)
    assert plan["status"] == "feasible" and plan["recommended"]["estimate"]["fits"]
    too_big = run("plan", "--model", "llama-3.1-405b", "--gpus", "1xrtx-4090-24gb", "--seq", "4096",
                  "--batch", "8", "--json")  # fmt: skip
    assert too_big.exit_code == 2
    assert json.loads(too_big.output)["status"] == "infeasible"


@pytest.mark.parametrize(
    ("args", "words", "code"),
    [
        (["--model", "llama-3.1-8b", "--gpus", "9xh100-sxm-80gb"], "not whole nodes of 8", 64),
        (["--model", "llama-3.1-8b", "--gpus", "2x8xh100-pcie-80gb"], "give --inter-gbps", 64),
        (["--gpus", "8xh100-sxm-80gb"], "--model NAME", 64),
        (["--model", "nope", "--gpus", "8xh100-sxm-80gb"], "model.preset", 1),
        (["--model", "llama-3.1-8b", "--gpus", "8xh100"], "unknown gpu 'h100'", 1),
        (  # FlashAttention takes 16-bit inputs only
            ["--model", "gpt2", "--gpus", "8xh100-sxm-80gb", "--precision", "fp32", "--attention", "flash"],
            "training.attention",
            1,
        ),
    ],
)
def test_bad_input_is_one_error_line_and_its_exit_code(
    database: str, args: list[str], words: str, code: int
) -> None:
    """Flags that contradict are the call's fault (64); what the API refuses is an error (1)."""
    result = CliRunner().invoke(main, ["plan", *args, "--seq", "1024", "--batch", "8"])
    assert result.exit_code == code, result.output
    assert "error:" in result.output and words in result.output, result.output


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "--model", "llama-3.1-8b", "--gpus", "8xh100-sxm-80gb", "--batch", "8"],  # no --seq
        ["plan", "--model", "llama-3.1-8b", "--gpus", "8xh100-sxm-80gb", "--seq", "2048", "--batch", "abc"],
        ["plan", "--bogus"],
        [
            "plan",
            "--config",
            "/nonexistent/config.json",
            "--gpus",
            "8xh100-sxm-80gb",
            "--seq",
            "1",
            "--batch",
            "1",
        ],
        ["estimate", "--model", "llama-3.1-8b", "--gpus", "8xh100-sxm-80gb", "--seq", "x", "--batch", "8"],
        ["no-such-command"],
        # neither --gpus nor --cluster, or both: flags missing or contradicting (it exited 1)
        ["estimate", "--model", "llama-2-7b", "--seq", "4096", "--batch", "64"],
        ["plan", "--model", "llama-2-7b", "--gpus", "8xh100-sxm-80gb", "--cluster", "lab", "--seq", "4096",
         "--batch", "64"],
        # --tokens is a whole number, in exponent notation or not
        ["estimate", "--model", "gpt2", "--gpus", "8xh100-sxm-80gb", "--seq", "1024", "--batch", "8",
         "--tokens", "1.5"],
        ["estimate", "--model", "gpt2", "--gpus", "8xh100-sxm-80gb", "--seq", "1024", "--batch", "8",
         "--tokens", "inf"],
    ],
)  # fmt: skip
def test_usage_errors_exit_64_never_2_which_means_does_not_fit(database: str, args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 64, result.output
    assert "Error" in result.output or "error" in result.output


def test_an_enum_option_lists_what_the_api_takes_and_refuses_the_rest_as_usage(database: str) -> None:
    """--objective once advertised "time", which the API refuses (its name is time_to_train): the
    choices come from the enums the API validates with, and a wrong one is the call's fault (64)."""
    spec = json.loads(run("openapi").output)["components"]["schemas"]
    objectives = spec["Objective"]["enum"]
    plan_help = run("plan", "--help").output
    assert f"[{'|'.join(objectives)}]" in plan_help.replace("\n", "").replace(" ", ""), plan_help
    base = ["plan", "--model", "llama-3.1-8b", "--gpus", "8xh100-sxm-80gb", "--seq", "2048", "--batch", "8"]
    for option, value in (("--objective", "time"), ("--method", "qlora4"), ("--framework", "nemo")):
        result = CliRunner().invoke(main, [*base, option, value])
        assert result.exit_code == 64 and f"Invalid value for '{option}'" in result.output, result.output


@pytest.mark.parametrize(
    "args",
    [
        ["estimate", "--model", "gpt2", "--gpus", "8xh100-sxm-80gb", "--seq", "1024", "--batch", "8",
         "--intra-busbw-gbps", "nan"],
        ["plan", "--model", "gpt2", "--gpus", "2x8xh100-sxm-80gb", "--seq", "1024", "--batch", "8",
         "--inter-gbps", "inf"],
        ["capacity", "--model", "gpt2", "--seq", "1024", "--batch", "8", "--tokens", "1000000",
         "--gpu-hour-cost", "nan"],
        ["clusters", "add", "lab", "--gpus", "8xh100-sxm-80gb", "--host-gib", "inf"],
        ["runs", "add", "some-plan", "--step-s", "nan"],
    ],
)  # fmt: skip
def test_a_number_option_that_is_not_finite_is_a_usage_error(database: str, args: list[str]) -> None:
    """Click's float takes "nan" and "inf", which JSON cannot carry: a traceback (exit 1) where every
    other malformed value is one line and exit 64."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 64, (result.output, result.exception)
    assert "finite number" in words(result.output) and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["estimate", "--model", "gpt2", "--gpus", "1xa100-sxm-80gb", "--seq", "1024", "--batch", "8",
          "--set", "ep=NaN"], "finite number"),
        (["estimate", "--model", "gpt2", "--gpus", "1xa100-sxm-80gb", "--seq", "1024", "--batch", "8",
          "--set", "ep=1e400"], "finite number"),
        (["estimate", "--model", "gpt2", "--gpus", "1xa100-sxm-80gb", "--seq", "1024", "--batch", "8",
          "--set", "recompute_modules=[1e400]"], "finite number"),
        (["estimate", "--model", "gpt2", "--gpus", "1xa100-sxm-80gb", "--seq", "1024", "--batch", "8",
          "--host-gib", "1e300"], "past any memory"),
        (["clusters", "add", "big", "--gpus", "8xh100-sxm-80gb", "--nvme-gib", "1e300"], "past any memory"),
        (["runs", "add", "some-plan", "--step-s", "1", "--peak-gib", "1e300"], "past any memory"),
    ],
)  # fmt: skip
def test_a_value_that_overflows_once_converted_is_a_usage_error(
    database: str, args: list[str], said: str
) -> None:
    """Finite as typed, not once read (NaN in --set's JSON, 1e400) or converted to bytes (1e300 GiB):
    a traceback and exit 1 (CLI review)."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 64, (result.output, result.exception)
    assert said in words(result.output) and "Traceback" not in result.output


def test_a_config_file_holding_nan_is_a_usage_error(database: str, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama", "rope_theta": NaN}')
    result = CliRunner().invoke(
        main,
        ["estimate", "--config", str(config), "--gpus", "1xa100-sxm-80gb", "--seq", "1024", "--batch", "8"],
    )
    assert result.exit_code == 64 and "NaN is not a finite number" in words(result.output), result.output
    config.write_text('{"model_type": "llama", "rope_theta": 1e400}')  # read as inf
    result = CliRunner().invoke(
        main,
        ["estimate", "--config", str(config), "--gpus", "1xa100-sxm-80gb", "--seq", "1024", "--batch", "8"],
    )
    assert result.exit_code == 64 and "1e400 is not a finite number" in words(result.output), result.output


def test_plan_out_that_cannot_be_a_directory_is_refused_before_planning(
    database: str, tmp_path: Path
) -> None:
    """--out naming a file was a traceback after the plan was stored: refused as a usage error, and a
    directory that cannot be made is one line naming where the stored plan's files are."""
    existing = tmp_path / "a-file"
    existing.write_text("x")
    result = CliRunner().invoke(main, ["plan", *PLAN_8B, "--out", str(existing)])
    assert result.exit_code == 64 and "is a file" in words(result.output), result.output
    blocked = existing / "sub"  # under a file: mkdir fails
    failed = CliRunner().invoke(main, ["plan", *PLAN_8B, "--out", str(blocked)])
    assert failed.exit_code == 1, (failed.output, failed.exception)
    assert "the plan is stored" in words(failed.output) and "/artifacts" in failed.output
    assert "Traceback" not in failed.output


def test_help_documents_the_exit_codes(database: str) -> None:
    result = run("--help")
    assert result.exit_code == 0
    for words in ("0   fits", "2   does not fit", "3   unknown", "64  usage error", "1   any other error"):
        assert words in result.output, result.output


def test_a_v100_job_naming_neither_precision_nor_attention_plans(database: str) -> None:
    """The write-up's scenario through the CLI: the defaults resolve to what Volta runs."""
    args = [
        "--model",
        "llama-2-13b",
        "--gpus",
        "4xv100-sxm2-32gb",
        "--seq",
        "2048",
        "--batch",
        "32",
        "--json",
    ]
    result = run("plan", *args)
    assert result.exit_code == 2, result.output  # 208 GB of states over 4 x 32 GB: does not fit
    plan = json.loads(result.output)
    assert plan["resolved_defaults"] == {"training.precision": "fp16", "training.attention": "sdpa"}
    assert plan["suggestions"] and plan["closest"] is not None
    # the tables say how far the closest layout is, of what, with the API's detail (a surfaces review)
    shown = run("plan", *args[:-1])
    said = " ".join(shown.output.split())
    assert "over what the plan allows (the card less its headroom)" in said, shown.output
    assert " ".join(plan["closest"]["detail"].split())[:60] in said


def test_estimate_of_one_layout(database: str) -> None:
    args = ["--model", "llama-3.1-8b", "--gpus", "8xh100-sxm-80gb", "--seq", "4096", "--batch", "64"]
    fits = run("estimate", *args, "--framework", "fsdp", "--dp", "8", "--zero", "3", "--json")
    assert fits.exit_code == 0
    body = json.loads(fits.output)
    assert body["fits"] and body["layout"]["dp"] == 8
    table = run("estimate", *args, "--framework", "fsdp", "--dp", "8", "--zero", "3")
    assert "fits" in table.output and "step time" in table.output
    # what the figures rest on (peaks, efficiencies, statistics), each as the API says it: the CLI printed
    # none of it
    flat = " ".join(table.output.split())
    assert body["assumptions"]
    assert all(f"assumed: {' '.join(a.split())}" in flat for a in body["assumptions"]), flat
    # the memory table names the three statistics, each after the components it adds, and the fit's
    rows = [line.split("│")[1].strip() for line in table.output.splitlines() if line.count("│") == 4]
    assert rows[:11] == [
        "parameters", "gradients", "optimizer_states", "activations", "buffers", "peak allocated",
        "fragmentation", "peak reserved", "cuda_context", "nccl_buffers", "device used (fit)",
    ]  # fmt: skip
    device_used = next(line for line in table.output.splitlines() if "device used (fit)" in line)
    assert f"{body['memory']['per_gpu']['device_used_bytes'] / 2**30:,.2f}" in device_used
    # what the page says beside the table, the CLI too: the headroom and the limits the answer holds
    headroom, limits = body["memory"]["headroom_bytes"] / 2**30, body["limits"]
    assert f"headroom {headroom:,.1f} GiB of 80.0 GiB" in table.output
    micro, seq = limits["max_micro_batch_size"], limits["max_seq_len"]
    assert f"fits at this layout: micro-batch up to {micro:,}, sequence up to {seq:,} tokens" in table.output
    # and an offload's host RAM per node, where the layout needs some
    offload = [*args, "--host-gib", "1024", "--framework", "deepspeed", "--dp", "8", "--zero", "3"]
    offloaded = run("estimate", *offload, "--set", "offload_optimizer=cpu", "--json")
    host = json.loads(offloaded.output)["memory"]["cpu_per_node_bytes"]
    assert host > 0
    said = run("estimate", *offload, "--set", "offload_optimizer=cpu").output
    assert f"offload needs host RAM {host / 2**30:,.1f} GiB per node" in said, said
    # plain DDP of 8B on 80 GB cards: 16 bytes per parameter do not fit, by what it says
    ddp = run("estimate", *args, "--dp", "8", "--micro", "8")
    over = -json.loads(run("estimate", *args, "--dp", "8", "--micro", "8", "--json").output)["memory"][
        "headroom_bytes"
    ]
    assert ddp.exit_code == 2 and f"{over / 2**30:,.1f} GiB over 80.0 GiB" in ddp.output
    # what the request left out is named, as the API resolved it
    megatron = run("estimate", *args, "--framework", "megatron", "--dp", "2", "--tp", "4", "--zero", "1")
    assert "layout.sequence_parallel true" in megatron.output, megatron.output
    assert "layout.tp_comm_overlap true" in megatron.output


def test_any_layout_field_reaches_the_estimate(database: str) -> None:
    """--set FIELD=VALUE passes a layout field the CLI has no option for (the estimate command had no
    way to set ep, so an MoE model's expert parallelism could not be estimated from the CLI)."""
    args = ["--model", "mixtral-8x7b", "--gpus", "8xh100-sxm-80gb", "--seq", "4096", "--batch", "64"]
    layout = ["--framework", "megatron", "--dp", "8", "--zero", "1", "--recompute", "full"]
    ep = ["--set", "ep=8", "--set", "moe_a2a_overlap=false"]
    result = run("estimate", *args, *layout, *ep, "--json")
    assert result.exit_code in (0, 2), result.output
    body = json.loads(result.output)
    assert body["layout"]["ep"] == 8 and body["layout"]["moe_a2a_overlap"] is False
    unknown = CliRunner().invoke(main, ["estimate", *args, *layout, "--set", "experts=8"])
    assert unknown.exit_code != 0 and "layout.experts" in unknown.output, unknown.output
    malformed = CliRunner().invoke(main, ["estimate", *args, *layout, "--set", "ep"])
    assert malformed.exit_code == 64 and "FIELD=VALUE" in malformed.output  # a usage error
    own = CliRunner().invoke(main, ["estimate", *args, *layout, "--set", "tp=4"])
    assert own.exit_code == 64 and "--tp" in own.output  # not silently over --tp


def test_hf_trainer_optim_names_reach_the_estimate(database: str) -> None:
    """A review: the API read paged_adamw_8bit as adamw_8bit, and the CLI refused it as not a choice."""
    args = ["--model", "llama-3.2-1b", "--gpus", "8xh100-sxm-80gb", "--seq", "2048", "--batch", "32"]
    paged = run(
        "estimate", *args, "--framework", "fsdp", "--zero", "3", "--optimizer", "paged_adamw_8bit", "--json"
    )
    assert paged.exit_code == 0, paged.output
    plain = run(
        "estimate", *args, "--framework", "fsdp", "--zero", "3", "--optimizer", "adamw_8bit", "--json"
    )
    paged_states = json.loads(paged.output)["memory"]["per_gpu"]["optimizer_states"]
    assert paged_states == json.loads(plain.output)["memory"]["per_gpu"]["optimizer_states"]


def test_an_estimate_without_dp_fills_the_gpus(database: str) -> None:
    """--dp defaulted to 1, so `trainplan estimate --gpus 8xh100-sxm-80gb --framework fsdp --zero 3`
    was the API's 422 (dp*tp*pp*cp = 1 != world size 8); left out, the service fills the GPUs."""
    args = ["--model", "llama-3.1-8b", "--gpus", "8xh100-sxm-80gb", "--seq", "4096", "--batch", "64"]
    result = run("estimate", *args, "--framework", "fsdp", "--zero", "3", "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["layout"]["dp"] == 8 and body["resolved_defaults"]["layout.dp"] == "8"
    assert "layout.dp 8" in run("estimate", *args, "--framework", "megatron", "--zero", "1").output


def test_an_estimate_leaves_the_micro_batch_and_recompute_to_the_service(database: str) -> None:
    """--micro 1 and --recompute none were always sent, so the CLI's answer said the user chose what
    the API's answer to the same request names as the service's defaults (fuzz probe, stop 41)."""
    args = ["--model", "llama-3.1-8b", "--gpus", "8xh100-sxm-80gb", "--seq", "4096", "--batch", "64"]
    chosen = json.loads(run("estimate", *args, "--framework", "fsdp", "--json").output)["resolved_defaults"]
    assert chosen["layout.micro_batch_size"] == "1" and chosen["layout.recompute"] == "none"
    given = run("estimate", *args, "--framework", "fsdp", "--micro", "2", "--recompute", "full", "--json")
    body = json.loads(given.output)
    assert (body["layout"]["micro_batch_size"], body["layout"]["recompute"]) == (2, "full")
    assert "layout.micro_batch_size" not in body["resolved_defaults"]


def test_a_calibrated_estimate_names_its_runs_and_its_figures_without_them(database: str) -> None:
    args = ["--model", "gpt2", "--gpus", "8xh100-sxm-80gb", "--seq", "1024", "--batch", "64"]
    plan = json.loads(run("plan", *args, "--json").output)
    before = words(run("plan", *args).output)
    assert "not calibrated: no run recorded on this hardware yet" in before
    step_s = plan["recommended"]["estimate"]["time"]["step_s"]
    stored = json.loads(run("runs", "add", plan["id"], "--step-s", str(step_s * 1.5), "--json").output)
    after = words(run("plan", *args).output)
    # the recommendation may change: the run slows the layout it measured most (ranked again on the
    # calibrated figures), so the CLI's words are read against the API's answer for this plan
    again = json.loads(run("plan", *args, "--json").output)["recommended"]["estimate"]["calibration"]
    assert f"calibrated by 1 run(s): step time x{again['factors']['step_time']:.3f}" in after
    assert "without calibration: step" in after
    weight = again["evidence"][0]["weight"]
    assert f"run {stored['id']} (" in after and f"weight {weight:.3f}, moves step_time_hardware" in after


def test_clusters_plans_on_them_and_runs(database: str) -> None:
    added = run("clusters", "add", "lab", "--gpus", "2x8xa100-sxm-80gb", "--inter-gbps", "25")
    assert added.exit_code == 0 and "16 GPUs" in added.output
    assert "lab" in run("clusters", "list").output
    planned = run(
        "plan", "--model", "llama-3.1-8b", "--cluster", "lab", "--seq", "4096", "--batch", "64", "--json"
    )
    assert planned.exit_code == 0
    plan = json.loads(planned.output)
    assert plan["cluster_id"] is not None
    runs = run("runs", "add", plan["id"], "--step-s", "12.5", "--peak-gib", "60", "--json")
    assert runs.exit_code == 0
    assert json.loads(runs.output)["plan_id"] == plan["id"]
    # a cluster with plans cannot go: the API's 409, as one line
    refused = CliRunner().invoke(main, ["clusters", "delete", "lab"])
    assert refused.exit_code == 1 and "409" in refused.output


def test_catalog_listings(database: str) -> None:
    assert "llama-3.1-8b" in run("models").output
    assert "h100-sxm-80gb" in run("gpus").output
    models = json.loads(run("models", "--json").output)
    assert any(m["name"] == "llama-3.1-8b" for m in models["items"])
    assert json.loads(run("openapi").output)["openapi"].startswith("3.")


def test_list_json_is_the_apis_page_with_every_item(database: str) -> None:
    """--json printed a bare [...] where the API (and so "the API's JSON") answers {"items", "next_cursor"};
    the CLI reads every page, so the page it prints holds every item and no cursor."""
    assert run("clusters", "add", "lab", "--gpus", "8xh100-sxm-80gb").exit_code == 0
    assert run("keys", "create", "ops").exit_code == 0
    for command in (["models"], ["gpus"], ["clusters", "list"], ["keys", "list"]):
        listed = json.loads(run(*command, "--json").output)
        assert set(listed) == {"items", "next_cursor"} and listed["next_cursor"] is None, command
        assert listed["items"], command
    from fastapi.testclient import TestClient

    with TestClient(create_app(Settings(database_url=database))) as client:
        total = len(client.get("/v1/models", params={"limit": 500}).json()["items"])
    assert len(json.loads(run("models", "--json").output)["items"]) == total


def test_gpus_shows_memory_in_gib_as_the_rest_of_the_cli(database: str) -> None:
    """`trainplan gpus` showed memory_bytes / 1e9 "GB" (86 GB for an 80 GiB H100), where every other
    table, and the card's own name, is GiB."""
    row = next(line for line in run("gpus").output.splitlines() if "h100-sxm-80gb" in line)
    assert "80.0 GiB" in row and " GB " not in row, row


def test_gpus_shorthand() -> None:
    assert cluster_from_gpus("8xh100-sxm-80gb", None) == {
        "gpu": "h100-sxm-80gb",
        "num_nodes": 1,
        "gpus_per_node": 8,
    }
    assert cluster_from_gpus("4xl40s-48gb", None)["gpus_per_node"] == 4
    assert cluster_from_gpus("32xh100-sxm-80gb", 50)["num_nodes"] == 4
    assert cluster_from_gpus("2x4xh100-sxm-80gb", 50) == {
        "gpu": "h100-sxm-80gb", "num_nodes": 2, "gpus_per_node": 4, "inter_node_bandwidth_gbps": 50
    }  # fmt: skip
    # the part's node: a Frontier node holds 8 MI250X GCDs (4 packages), so 16 of them are 2 nodes
    # (its network is the catalog's: no --inter-gbps needed), as the API's own default node is
    assert cluster_from_gpus("16xmi250x-gcd-64gb", None) == {
        "gpu": "mi250x-gcd-64gb",
        "num_nodes": 2,
        "gpus_per_node": 8,
    }
    assert cluster_from_gpus("16xl40s-48gb", 25)["num_nodes"] == 2  # no node in the catalog: 8


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """The service on a loopback port, for --url."""
    with served(f"sqlite:///{tmp_path / 'served.db'}") as url:
        yield url


def test_the_same_numbers_in_process_and_over_http(database: str, server: str) -> None:
    def numbers(*extra: str) -> dict[str, Any]:
        result = run("plan", *PLAN_8B, "--json", *extra)
        assert result.exit_code == 0, result.output
        plan: dict[str, Any] = json.loads(result.output)
        return plan["recommended"]

    assert numbers() == numbers("--url", server)


def test_keys_made_on_the_database_open_a_service_that_requires_them(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's bootstrap: the first admin key is made on the database, the others through it."""
    admin = json.loads(
        run("keys", "create", "ops", "--scope", "admin", "--name", "bootstrap", "--json").output
    )
    assert admin["scopes"] == ["admin"] and admin["secret"].startswith("tp_")
    assert admin["created_via"] == "operator"
    assert "secret" not in run("keys", "list", "--json").output
    with served(database, require_auth=True) as url:
        assert run("clusters", "list", "--url", url).exit_code == 1  # no key: 401
        monkeypatch.setenv("TRAINPLAN_API_KEY", admin["secret"])
        team = json.loads(run("keys", "create", "team", "--url", url, "--json").output)
        assert team["owner"] == "team" and team["scopes"] == ["read", "write"]
        assert team["created_via"] == "api"
        monkeypatch.setenv("TRAINPLAN_API_KEY", team["secret"])
        assert run("clusters", "add", "box", "--gpus", "8xh100-sxm-80gb", "--url", url).exit_code == 0
        assert "box" in run("clusters", "list", "--url", url).output
        monkeypatch.setenv("TRAINPLAN_API_KEY", admin["secret"])
        assert run("keys", "revoke", team["id"], "--url", url).exit_code == 0
        monkeypatch.setenv("TRAINPLAN_API_KEY", team["secret"])
        assert run("clusters", "list", "--url", url).exit_code == 1  # revoked: 401
    listed = json.loads(run("keys", "list", "--owner", "team", "--json").output)["items"]
    assert [(k["id"], k["revoked_at"] is not None) for k in listed] == [(team["id"], True)]
    assert run("keys", "revoke", "01JAAAAAAAAAAAAAAAAAAAAAAA").exit_code == 1
    assert run("keys", "create", "bad owner!").exit_code == 1


RUN_LOGS = Path(__file__).parent / "runlogs" / "logs"


def words(output: str) -> str:
    return " ".join(output.split())


def test_report_reads_a_log_file_or_stdin_and_prints_what_it_read(database: str) -> None:
    planned = run(
        "plan", "--model", "gpt2", "--gpus", "8xh100-sxm-80gb", "--seq", "1024", "--batch", "64", "--json"
    )
    plan_id = json.loads(planned.output)["id"]
    megatron = run("report", plan_id, str(RUN_LOGS / "megatron.log"), "--format", "megatron")
    assert megatron.exit_code == 0, megatron.output
    printed = words(megatron.output)  # rich wraps at the terminal's width
    assert "read as a megatron log (18 lines)" in printed
    assert "step_s = 2.598 s: median of 4 steady step-time readings" in printed
    assert "41.52 GiB (max_reserved)" in printed
    assert "set aside" in printed  # a 7B job's step is not gpt2's: the diagnosis says so
    # `-` reads stdin; --json prints the API's run
    titan = CliRunner().invoke(
        main, ["report", plan_id, "-", "--json"], input=(RUN_LOGS / "torchtitan.log").read_text()
    )
    assert titan.exit_code == 0, titan.output
    stored = json.loads(titan.output)
    assert stored["source"]["format"] == "torchtitan" and stored["tokens_per_s"] == 6639.5 * 8
    oom = run("report", plan_id, str(RUN_LOGS / "oom.log"))
    assert oom.exit_code == 0 and "out of memory at line 8 (GPU 1)" in words(oom.output)
    for name, check in (("deepspeed", "13.33 samples/s"), ("hf_trainer", "step_s = 4.12 s")):
        result = run("report", plan_id, str(RUN_LOGS / f"{name}.log"))
        assert result.exit_code == 0 and check in words(result.output), result.output


def test_report_exit_codes(database: str, tmp_path: Path) -> None:
    planned = run(
        "plan", "--model", "gpt2", "--gpus", "8xh100-sxm-80gb", "--seq", "1024", "--batch", "64", "--json"
    )
    plan_id = json.loads(planned.output)["id"]
    log = RUN_LOGS / "megatron.log"
    assert CliRunner().invoke(main, ["report", plan_id, str(log), "--format", "nemo"]).exit_code == 64
    assert CliRunner().invoke(main, ["report", plan_id, str(tmp_path / "missing.log")]).exit_code == 64
    assert CliRunner().invoke(main, ["report", plan_id]).exit_code == 64
    (tmp_path / "other.log").write_text("epoch 1 done\n")
    refused = CliRunner().invoke(main, ["report", plan_id, str(tmp_path / "other.log")])
    assert refused.exit_code == 1 and "HTTP 422" in refused.output and "looked for" in words(refused.output)
    unknown = CliRunner().invoke(main, ["report", "01JAAAAAAAAAAAAAAAAAAAAAAA", str(log)])
    assert unknown.exit_code == 1 and "404" in unknown.output


def test_a_log_over_the_body_limit_is_sent_as_its_head_and_tail() -> None:
    from service.cli import LOG_BODY_BYTES, log_excerpt

    text = "\n".join(f"line {i} " + "x" * 80 for i in range(40_000))
    sent, cut = log_excerpt(text)
    assert cut and len(json.dumps(sent).encode()) <= LOG_BODY_BYTES
    assert sent.startswith("line 0 ") and sent.endswith(f"line 39999 {'x' * 80}")
    assert log_excerpt("short\n") == ("short\n", False)


def test_a_lora_base_kept_in_fp32_is_an_input(database: str) -> None:
    """The CLI sends --base-dtype as the API's training.base_dtype: 7B LoRA on one 24 GB card fits
    with the base in bf16 and not with it in fp32 (4 B per base parameter)."""
    args = ["--model", "llama-2-7b", "--gpus", "1xrtx-4090-24gb", "--seq", "2048", "--batch", "8"]
    layout = ["--method", "lora", "--precision", "bf16", "--framework", "fsdp", "--recompute", "full"]
    assert run("estimate", *args, *layout).exit_code == 0
    fp32 = run("estimate", *args, *layout, "--base-dtype", "fp32", "--json")
    assert fp32.exit_code == 2, fp32.output
    assert json.loads(fp32.output)["fits"] is False


def test_runs_add_says_which_statistic_its_peak_is(database: str) -> None:
    planned = run(
        "plan", "--model", "gpt2", "--gpus", "8xh100-sxm-80gb", "--seq", "1024", "--batch", "64", "--json"
    )
    plan = json.loads(planned.output)
    allocated_gib = plan["recommended"]["estimate"]["memory"]["per_gpu"]["peak_allocated_bytes"] / 2**30
    peak = ("--peak-gib", f"{allocated_gib:.3f}")
    said = run("runs", "add", plan["id"], *peak, "--memory-statistic", "allocated", "--json")
    stored = json.loads(said.output)
    assert (
        stored["memory_statistic"] == "allocated" and stored["diagnosis"]["memory_statistic"] == "allocated"
    )
    assert abs(stored["diagnosis"]["memory_error"]) < 1e-3
    assert "peak compared as allocated" in words(
        run("runs", "add", plan["id"], *peak, "--memory-statistic", "allocated").output
    )
    unsaid = words(run("runs", "add", plan["id"], *peak).output)
    assert "peak compared as device_used (--memory-statistic not given)" in unsaid
    # the diagnosis and calibration in words, as `report` prints them, not as raw JSON (CLI review)
    assert "memory vs estimate (device_used):" in unsaid and "later estimates on this hardware" in unsaid
    assert '{"' not in unsaid
    # without a peak the service refuses it, naming the field; an unknown statistic is a usage error
    refused = CliRunner().invoke(
        main, ["runs", "add", plan["id"], "--step-s", "1", "--memory-statistic", "reserved"]
    )
    assert refused.exit_code == 64 and "--memory-statistic" in refused.output  # flags that contradict
    unknown = CliRunner().invoke(main, ["runs", "add", plan["id"], *peak, "--memory-statistic", "peak"])
    assert unknown.exit_code == 64 and "device_used" in unknown.output  # EX_USAGE, as every usage error


def test_measured_bus_bandwidths_are_flags_of_an_inline_cluster(database: str) -> None:
    assert cluster_from_gpus("2x8xh100-sxm-80gb", 50, intra_busbw_gbps=370, inter_busbw_gbps=44) == {
        "gpu": "h100-sxm-80gb", "num_nodes": 2, "gpus_per_node": 8, "inter_node_bandwidth_gbps": 50,
        "measured_intra_node_bus_bandwidth_gbps": 370, "measured_inter_node_bus_bandwidth_gbps": 44,
    }  # fmt: skip
    args = [
        "--model",
        "llama-3.1-8b",
        "--seq",
        "4096",
        "--batch",
        "64",
        "--framework",
        "megatron",
        "--tp",
        "8",
    ]
    measured = json.loads(
        run("estimate", *args, "--gpus", "8xh100-sxm-80gb", "--intra-busbw-gbps", "200", "--json").output
    )
    assert (
        "intra-node bus bandwidth measured: 200 GB/s per GPU (nominal link 450 GB/s)"
        in measured["assumptions"]
    )
    plain = json.loads(run("estimate", *args, "--gpus", "8xh100-sxm-80gb", "--json").output)
    assert measured["time"]["breakdown"]["tp_comm_s"] > plain["time"]["breakdown"]["tp_comm_s"]
    added = run("clusters", "add", "pod", "--gpus", "2x8xh100-sxm-80gb", "--inter-gbps", "50",
                "--inter-busbw-gbps", "44", "--json")  # fmt: skip
    assert json.loads(added.output)["measured_inter_node_bus_bandwidth_bytes_per_s"] == 44e9
    # a stored cluster keeps its own measurements; the API's refusals name the field
    stored = CliRunner().invoke(main, ["estimate", *args, "--cluster", "pod", "--intra-busbw-gbps", "200"])
    assert stored.exit_code == 64 and "goes with --gpus" in words(stored.output)
    one_node = CliRunner().invoke(
        main, ["estimate", *args, "--gpus", "8xh100-sxm-80gb", "--inter-busbw-gbps", "44"]
    )
    # named as the CLI sent it, with the flag that set it
    assert one_node.exit_code == 1
    assert "cluster.measured_inter_node_bus_bandwidth_gbps (--inter-busbw-gbps)" in words(one_node.output)


def test_capacity_takes_every_option_the_api_does(database: str) -> None:
    """The CLI's capacity had no node size, at_gpus or price: the API's answer for them was out of reach."""
    args = ["capacity", "--model", "llama-3.1-8b", "--seq", "4096", "--batch", "64", "--tokens", "1000000000"]
    args += ["--gpu", "h100-sxm-80gb", "--gpu", "a100-sxm-80gb", "--gpus-per-node", "4", "--at-gpus", "16"]
    priced = run(*args, "--gpu-hour-cost", "h100-sxm-80gb=3", "--gpu-hour-cost", "a100-sxm-80gb=2", "--json")
    assert priced.exit_code == 0, priced.output
    options = {o["gpu"]: o for o in json.loads(priced.output)["options"]}
    assert {o["num_gpus"] for o in options.values()} == {16}
    for gpu, price in (("h100-sxm-80gb", 3), ("a100-sxm-80gb", 2)):
        assert options[gpu]["cost"] == pytest.approx(options[gpu]["gpu_hours"] * price)
    # nodes of 4: a 70B full fine-tune needs more than one node of them
    seventy = ["--model", "llama-3.1-70b", "--seq", "4096", "--batch", "64", "--gpu", "h100-sxm-80gb"]
    big = run("capacity", *seventy, "--gpus-per-node", "4", "--json")
    (option,) = json.loads(big.output)["options"]
    assert option["min_gpus"] > 4 and option["min_nodes"] == -(-option["min_gpus"] // 4), option
    table = run(*args, "--gpu-hour-cost", "2.5")
    assert table.exit_code == 0 and "cost" in table.output, table.output
    bad = CliRunner().invoke(main, [*args, "--gpu-hour-cost", "h100=cheap"])
    assert bad.exit_code == 64 and "--gpu-hour-cost" in bad.output


def test_capacity_takes_the_search_constraints_the_api_does(database: str) -> None:
    """Capacity's constraints (frameworks, max_gpus, offload, headroom, compile) had no flags: the
    API's answer for them was out of reach from the terminal (CLI review)."""
    args = ["capacity", "--model", "llama-3.1-8b", "--seq", "4096", "--batch", "64", "--gpu", "h100-sxm-80gb"]
    fsdp = run(*args, "--framework", "fsdp", "--json")
    assert fsdp.exit_code == 0, fsdp.output
    (option,) = json.loads(fsdp.output)["options"]
    assert option["layout"]["framework"] == "fsdp"
    capped = CliRunner().invoke(main, [*args, "--model", "llama-3.1-70b", "--max-gpus", "1", "--json"])
    assert capped.exit_code == 2 and "constraints.max_gpus" in words(capped.output), capped.output
    offload = CliRunner().invoke(main, [*args, "--allow-offload"])  # a catalog card states no host RAM
    assert offload.exit_code == 64 and "--allow-offload needs --cluster-id" in words(offload.output)


def test_the_cli_reads_names_and_values_as_the_api_does(database: str) -> None:
    """Spellings the API reads (a GPU by its published name, "bfloat16", "FSDP2") are the CLI's too: the
    same plan as with the canonical names, not a usage error the API would not have raised."""
    spelled = run("plan", "--model", "Llama 3.1 8B", "--gpus", "8xH100-SXM-80GB", "--seq", "2048",
                  "--batch", "64", "--precision", "bfloat16", "--framework", "FSDP2", "--json")  # fmt: skip
    canonical = run("plan", "--model", "llama-3.1-8b", "--gpus", "8xh100-sxm-80gb", "--seq", "2048",
                    "--batch", "64", "--precision", "bf16", "--framework", "fsdp", "--json")  # fmt: skip
    assert spelled.exit_code == canonical.exit_code == 0, spelled.output
    first, second = json.loads(spelled.output), json.loads(canonical.output)
    assert first["recommended"] == second["recommended"]
    assert first["request"]["training"]["precision"] == "bf16"
    assert first["resolved_defaults"]["model.preset"] == "llama-3.1-8b"


def test_nodes_of_a_part_with_a_reference_node_need_no_network_flag(database: str) -> None:
    """2 x 8 H100 SXM without --inter-gbps: the API's default, a DGX H100's 50 GB/s per GPU, named
    in the answer, as the API answers the same cluster; a PCIe card still needs the flag."""
    result = run("plan", "--model", "llama-3.1-8b", "--gpus", "2x8xh100-sxm-80gb", "--seq", "2048",
                 "--batch", "64", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (
        json.loads(result.output)["resolved_defaults"]["cluster.inter_node_bandwidth_bytes_per_s"]
        == "50000000000"
    )


def test_capacity_of_stored_clusters_by_name(database: str) -> None:
    """--cluster-id takes a name as --cluster does ("lab box" was a 404 naming cluster_ids.0), and
    sends no catalog node size or node bound, which the API refuses beside stored clusters."""
    assert run("clusters", "add", "lab box", "--gpus", "8xa100-sxm-80gb").exit_code == 0
    args = ["capacity", "--model", "gpt2", "--seq", "1024", "--batch", "64", "--cluster-id", "lab box"]
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    (option,) = json.loads(result.output)["options"]
    assert option["gpu"] == "a100-sxm-80gb" and option["fits"]
    unknown = CliRunner().invoke(main, [*args[:-1], "nope", "--json"])
    assert unknown.exit_code == 1 and "--cluster-id 'nope'" in words(unknown.output)
    both = CliRunner().invoke(main, [*args, "--max-nodes", "2", "--json"])  # flags that contradict: 64
    assert both.exit_code == 64 and "--max-nodes" in words(both.output)
    # timed on the whole cluster: the table says so beside the fewest GPUs ("min GPUs 1" read as the
    # throughput of 1; consistency review)
    assert option["num_gpus"] == 8 and option["min_gpus"] < 8
    table = run(*args)
    assert table.exit_code == 0 and "timed" in words(table.output), table.output


def test_a_retried_report_is_stored_once_and_contradicting_run_flags_are_usage_errors(database: str) -> None:
    """A scheduler retrying `trainplan report` stored the run twice and calibration counted it twice;
    --step-s with --tokens-per-s, or --memory-statistic without --peak-gib, exited 1 with the API's
    422 where the README promises 64 for flags that contradict (runs review, stop 39)."""
    planned = run(
        "plan", "--model", "gpt2", "--gpus", "8xh100-sxm-80gb", "--seq", "1024", "--batch", "64", "--json"
    )
    plan_id = json.loads(planned.output)["id"]
    log = str(RUN_LOGS / "megatron.log")
    first = json.loads(run("report", plan_id, log, "--idempotency-key", "job-7", "--json").output)
    again = json.loads(run("report", plan_id, log, "--idempotency-key", "job-7", "--json").output)
    assert again["id"] == first["id"]  # the retry replays the stored run (Idempotency-Key)
    for flags in (["--step-s", "5", "--tokens-per-s", "1000"], ["--memory-statistic", "allocated"]):
        refused = CliRunner().invoke(main, ["runs", "add", plan_id, *flags])
        assert refused.exit_code == 64, refused.output


def test_lora_rank_and_targets_are_options_and_their_defaults_are_said(database: str) -> None:
    """A review's case: the CLI had no --lora-rank or --lora-targets (every CLI LoRA number was rank
    16 on every linear module, and --set lora_rank=64 is a layout field: a 422), and resolved_defaults
    never named the rank or targets a LoRA request left out."""
    base = ["estimate", "--model", "llama-3.1-8b", "--gpus", "1x1xrtx-4090-24gb", "--seq", "2048", "--batch",
            "8", "--method", "lora", "--framework", "fsdp", "--json"]  # fmt: skip
    left_out = json.loads(run(*base).output)
    assert left_out["resolved_defaults"]["training.lora_rank"] == "16"
    assert left_out["resolved_defaults"]["training.lora_targets"] == "all-linear"
    given = json.loads(run(*base, "--lora-rank", "64", "--lora-targets", "q_proj,v_proj").output)
    assert "training.lora_rank" not in given["resolved_defaults"]
    # rank 64 on q and v: 32 layers x 64 x ((4096 + 4096) + (4096 + 1024)) adapters; the frozen base
    # the same: the difference is the adapters', 4 bytes each (FSDP shards trainable parameters in fp32)
    adapters = 32 * 64 * ((4096 + 4096) + (4096 + 1024))
    everything = 32 * 16 * ((4096 + 4096) * 2 + (4096 + 1024) * 2 + (4096 + 14336) * 3)
    difference = left_out["memory"]["per_gpu"]["parameters"] - given["memory"]["per_gpu"]["parameters"]
    assert everything == 41_943_040 and difference == 4 * (everything - adapters)


def test_a_plan_s_rejections_show_their_example_layout_and_a_cut_search_is_said(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rejected table names each group's example layout (not its detail twice), and a search the
    budget cut says so, as the page does."""
    from rich.console import Console

    from service import cli
    from service.cli import print_plan

    monkeypatch.setattr(cli, "console", Console(width=200))  # no cell wrapped

    example = {"framework": "megatron", "dp": 2, "tp": 4, "zero_stage": 1, "micro_batch_size": 1}
    plan = {
        "id": "01PLAN", "model": "m", "status": "feasible", "alternatives": [], "suggestions": [],
        "unsupported_targets": {},
        "rejected": [{"reason": "megatron does not support zero_stage 2", "count": 3, "example": example,
                      "detail": "megatron does not support zero_stage 2"}],
        "search": {"truncated": True, "truncated_by": "request budget", "memory_evaluations": 90,
                   "time_evaluations": 10},
    }  # fmt: skip
    print_plan(plan, set())
    out = capsys.readouterr().out
    assert "stopped early (request budget) after 100 evaluations" in out
    assert "megatron dp=2 tp=4 zero=1 micro=1" in out
    assert out.count("megatron does not support zero_stage 2") == 1


def sent_bodies(monkeypatch: pytest.MonkeyPatch, answer: dict[str, Any]) -> list[Any]:
    """The JSON bodies the CLI sends, each answered with ``answer`` instead of the API's."""
    from service import cli

    sent: list[Any] = []

    def call(self: cli.Api, method: str, path: str, **kwargs: Any) -> Any:
        sent.append(kwargs.get("json"))
        return answer

    monkeypatch.setattr(cli.Api, "call", call)
    return sent


def test_plan_and_estimate_send_the_constraints_and_price_flags_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan` sent only objective, top_k and frameworks of the API's constraints, and neither command had
    a GPU-hour price: each is a flag named as its field, and a flag left out sends nothing (the API's
    default applies)."""
    sent = sent_bodies(monkeypatch, {"status": "feasible", "fits": True})
    constraints = ["--gpu-hour-cost", "2.5", "--max-gpus", "4", "--no-allow-offload",
                   "--min-headroom-fraction", "0.1", "--torch-compile"]  # fmt: skip
    assert run("plan", *PLAN_8B, "--tokens", "1e12", *constraints, "--json").exit_code == 0
    assert sent[-1]["constraints"] == {
        "objective": "throughput", "top_k": 3, "gpu_hour_cost": 2.5, "max_gpus": 4, "allow_offload": False,
        "min_headroom_fraction": 0.1, "torch_compile": True,
    }  # fmt: skip
    assert sent[-1]["training"]["tokens"] == 10**12  # exponent notation, sent as the whole number
    assert run("plan", *PLAN_8B, "--allow-offload", "--json").exit_code == 0
    assert sent[-1]["constraints"] == {"objective": "throughput", "top_k": 3, "allow_offload": True}
    assert run("plan", *PLAN_8B, "--json").exit_code == 0
    assert sent[-1]["constraints"] == {"objective": "throughput", "top_k": 3}
    assert run("estimate", *PLAN_8B, "--tokens", "15e12", "--gpu-hour-cost", "3", "--json").exit_code == 0
    assert sent[-1]["gpu_hour_cost"] == 3 and sent[-1]["training"]["tokens"] == 15 * 10**12
    assert run("estimate", *PLAN_8B, "--json").exit_code == 0
    assert "gpu_hour_cost" not in sent[-1] and "tokens" not in sent[-1]["training"]


def test_a_priced_plan_within_a_gpu_cap_says_its_cost(database: str) -> None:
    """The constraint flags reach the API's search: at most 4 GPUs, priced, the cost to train said."""
    args = [
        "--model",
        "gpt2",
        "--gpus",
        "8xh100-sxm-80gb",
        "--seq",
        "1024",
        "--batch",
        "64",
        "--tokens",
        "1e9",
    ]
    plan = json.loads(run("plan", *args, "--max-gpus", "4", "--gpu-hour-cost", "2", "--json").output)
    estimate = plan["recommended"]["estimate"]
    layout = plan["recommended"]["layout"]
    world = layout["dp"] * layout["tp"] * layout["pp"] * layout["cp"]
    assert world <= 4 and estimate["cost_to_train"] == pytest.approx(
        estimate["time_to_train_s"] / 3600 * world * 2
    )
    assert "cost " in words(run("plan", *args, "--gpu-hour-cost", "2").output)
    said = run("plan", *args, "--max-gpus", "4", "--gpu-hour-cost", "2").output  # the plan above
    # the cost to a hundredth, not whole units (a 7.75 cost printed "8": cost review)
    assert f"cost {estimate['cost_to_train']:.4g} at the GPU-hour price given" in words(said)
    # each alternative's GPUs, time and cost to train beside its tokens/s (cost review)
    alternatives = [line for line in said.splitlines() if "GPUs" in line and "cost" in line]
    assert alternatives, said
    for alt in plan["alternatives"]:
        assert f"{alt['estimate']['cost_to_train']:.4g}" in said


def test_a_refused_field_is_named_with_the_flag_that_set_it(database: str) -> None:
    """A 422 named the request's field (constraints.gpu_hour_cost) where the user wrote a flag: the
    line names both, and an API refusal stays exit 1 (README: 1 the API refused the request)."""
    unpriced = CliRunner().invoke(main, ["plan", *PLAN_8B, "--gpu-hour-cost", "2"])
    assert unpriced.exit_code == 1, unpriced.output
    assert "[field constraints.gpu_hour_cost (--gpu-hour-cost)]" in words(unpriced.output)
    capped = CliRunner().invoke(main, ["plan", *PLAN_8B, "--max-gpus", "0"])
    assert capped.exit_code == 1 and "constraints.max_gpus (--max-gpus)" in words(capped.output)
    layout = ["estimate", *PLAN_8B, "--framework", "megatron", "--dp", "8"]
    unknown = CliRunner().invoke(main, [*layout, "--set", "experts=8"])
    assert unknown.exit_code == 1 and "layout.experts (--set)" in words(unknown.output), unknown.output
    host = CliRunner().invoke(main, [*layout, "--host-gib", "-1"])
    assert host.exit_code == 1 and "cluster.cpu_memory_bytes_per_node (--host-gib)" in words(host.output)
    # the API's bound is in bytes: said in the flag's GiB too (a surfaces review)
    big = CliRunner().invoke(main, [*layout, "--host-gib", "20000"])
    assert big.exit_code == 1 and "le 16,384 GiB in --host-gib's unit" in words(big.output), big.output
    from service.cli import _gib_words

    assert _gib_words(2**50) == "1,048,576" and _gib_words(2**20) == "0.001"  # whole where whole
    from service.cli import ESTIMATE_FLAGS, PLAN_FLAGS, flag_of

    assert flag_of("constraints.frameworks.0", PLAN_FLAGS) == "--framework"  # an item: its list's flag
    assert flag_of("layout.tp", ESTIMATE_FLAGS) == "--tp" and flag_of("layout.ep", ESTIMATE_FLAGS) == "--set"
    assert flag_of("layout", ESTIMATE_FLAGS) is None  # the layout as a whole is no one flag's


def test_an_inline_cluster_states_its_host_ram_and_nvme(database: str) -> None:
    """--gpus clusters always had 0 host RAM and NVMe (offload unplannable from the CLI) and `clusters
    add` had no --nvme-gib: GiB on the command line, bytes to the API, as --host-gib was."""
    assert cluster_from_gpus("8xh100-sxm-80gb", None, host_gib=1024, nvme_gib=3576) == {
        "gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 8,
        "cpu_memory_bytes_per_node": 1024 * 2**30, "nvme_bytes_per_node": 3576 * 2**30,
    }  # fmt: skip
    args = ["--model", "gpt2", "--seq", "1024", "--batch", "64"]
    stated = ["--host-gib", "1024", "--nvme-gib", "3576"]
    plan = json.loads(run("plan", *args, "--gpus", "8xh100-sxm-80gb", *stated, "--json").output)
    assert plan["cluster"]["cpu_memory_bytes_per_node"] == 1024 * 2**30
    assert plan["cluster"]["nvme_bytes_per_node"] == 3576 * 2**30
    added = json.loads(run("clusters", "add", "lab", "--gpus", "8xh100-sxm-80gb", *stated, "--json").output)
    assert (added["cpu_memory_bytes_per_node"], added["nvme_bytes_per_node"]) == (1024 * 2**30, 3576 * 2**30)
    stored = CliRunner().invoke(main, ["plan", *args, "--cluster", "lab", "--nvme-gib", "100"])
    assert stored.exit_code == 64 and "--nvme-gib goes with --gpus" in words(stored.output), stored.output


@pytest.mark.parametrize("spec", ["16xh100-sxm-80b", "12xh100-sxm-80b", "2x8xh100-sxm-80b"])
def test_a_mistyped_gpu_across_nodes_is_named_before_any_network_question(database: str, spec: str) -> None:
    """`--gpus 16xh100-sxm-80b` said "spans 2 nodes: give --inter-gbps" (and 12x "not whole nodes of
    8"): a question about a part that does not exist. The catalog's refusal comes first, as the API's."""
    result = CliRunner().invoke(
        main, ["plan", "--model", "gpt2", "--gpus", spec, "--seq", "1024", "--batch", "8"]
    )
    said = words(result.output)
    assert result.exit_code == 1, result.output
    assert "unknown gpu 'h100-sxm-80b'; did you mean h100-sxm-80gb" in said, said
    assert "--inter-gbps" not in said and "whole nodes" not in said


def test_plan_out_writes_launch_scripts_executable(database: str, tmp_path: Path) -> None:
    """The files --out wrote were all 0644 where the API's artifacts.zip stores *.sh as 0755."""
    out = tmp_path / "plan"
    args = ["--model", "gpt2", "--gpus", "8xh100-sxm-80gb", "--seq", "1024", "--batch", "64"]
    assert run("plan", *args, "--out", str(out)).exit_code == 0
    modes = {path.name: path.stat().st_mode & 0o777 for path in out.iterdir()}
    scripts = [name for name in modes if name.endswith(".sh")]
    assert scripts, modes
    for name, mode in modes.items():
        assert bool(mode & 0o111) == name.endswith(".sh"), (name, oct(mode))
        if name.endswith(".sh"):
            assert mode == 0o755, (name, oct(mode))


def test_capacity_shows_each_options_notes_cut_search_and_gpus_timed_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table showed an option's note only where it had no layout (the defaults chosen for the GPU,
    the network assumed, "timed on 16" were dropped), never its truncated flag, and not the GPUs a row
    is timed on with --at-gpus."""
    from rich.console import Console

    from service import cli

    monkeypatch.setattr(cli, "console", Console(width=250))
    layout = {"framework": "megatron", "tp": 8, "pp": 2, "zero_stage": 0, "micro_batch_size": 1}
    options = [
        {"gpu": "h100-sxm-80gb", "fits": True, "min_gpus": 16, "num_gpus": 24, "layout": layout,
         "tokens_per_s": 12_000.0, "time_to_train_s": 86_400.0, "gpu_hours": 576.0, "cost": None,
         "note": "defaults for this GPU: training.precision bf16", "truncated": True},
        {"gpu": "t4-16gb", "fits": False, "min_gpus": None, "num_gpus": None, "layout": None,
         "tokens_per_s": None, "time_to_train_s": None, "gpu_hours": None, "cost": None,
         "note": "no layout fits up to 8192 GPUs", "truncated": False},
    ]  # fmt: skip
    cli.print_capacity(options, timed_on=True)
    out = capsys.readouterr().out
    assert "timed on" in out and "yes (search cut)" in out
    row = next(line for line in out.splitlines() if line.startswith("│ h100"))
    assert [cell.strip() for cell in row.split("│")[2:5]] == ["yes (search cut)", "16", "24"]
    assert "h100-sxm-80gb: defaults for this GPU: training.precision bf16" in out
    assert "t4-16gb: no layout fits up to 8192 GPUs" in out
    # without --at-gpus the column shows where a row was timed on more than its fewest (a stored
    # cluster's whole), not where every row is timed on its fewest
    cli.print_capacity(options, timed_on=False)
    assert "timed on" in capsys.readouterr().out
    cli.print_capacity([options[0] | {"num_gpus": 16}, options[1]], timed_on=False)
    assert "timed on" not in capsys.readouterr().out


def test_capacity_at_gpus_shows_the_count_each_row_is_timed_on(database: str) -> None:
    args = ["capacity", "--model", "gpt2", "--seq", "1024", "--batch", "64", "--tokens", "1e9"]
    result = run(*args, "--gpu", "h100-sxm-80gb", "--at-gpus", "20")
    said = words(result.output)
    assert result.exit_code == 0 and "timed on" in said, result.output
    assert "asked for 20 GPUs; past one node this option places whole nodes of 8" in said
    assert "as many as the count fills: timed on 16" in said


def test_keys_without_url_act_on_the_database_even_with_trainplan_url_exported(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With TRAINPLAN_URL exported (as the README's CLI section does), `keys create` went over HTTP and
    failed (a service without keys answers 403): only an explicit --url takes the keys commands there."""
    monkeypatch.setenv("TRAINPLAN_URL", "http://127.0.0.1:9")  # nothing listens: HTTP would fail
    created = run("keys", "create", "ops", "--scope", "admin", "--json")
    assert created.exit_code == 0, created.output
    assert json.loads(created.output)["created_via"] == "operator"
    assert [k["owner"] for k in json.loads(run("keys", "list", "--json").output)["items"]] == ["ops"]
    key_id = json.loads(created.output)["id"]
    assert run("keys", "revoke", key_id).exit_code == 0
    assert "TRAINPLAN_URL is not read" in words(run("keys", "create", "--help").output)
    remote = CliRunner().invoke(main, ["keys", "list", "--url", "http://127.0.0.1:9"])
    assert remote.exit_code == 1 and "cannot reach" in remote.output  # an explicit --url still goes there


def test_runs_add_and_report_take_the_runs_other_fields(database: str) -> None:
    """RunIn has gpu_utilization and framework_version; `runs add` took neither, `report` no version."""
    plan_id = json.loads(
        run("plan", "--model", "gpt2", "--gpus", "8xh100-sxm-80gb", "--seq", "1024", "--batch", "64",
            "--json").output
    )["id"]  # fmt: skip
    typed = run("runs", "add", plan_id, "--step-s", "1", "--gpu-utilization", "0.85",
                "--framework-version", "megatron-core 0.9.0", "--json")  # fmt: skip
    stored = json.loads(typed.output)
    assert (stored["gpu_utilization"], stored["framework_version"]) == (0.85, "megatron-core 0.9.0")
    logged = run("report", plan_id, str(RUN_LOGS / "megatron.log"), "--framework-version", "0.9.0", "--json")
    assert json.loads(logged.output)["framework_version"] == "0.9.0"
    refused = CliRunner().invoke(main, ["runs", "add", plan_id, "--step-s", "1", "--gpu-utilization", "85"])
    assert refused.exit_code == 1 and "gpu_utilization (--gpu-utilization)" in words(refused.output)


def test_multi_token_prediction_depths_are_a_flag(database: str) -> None:
    """training.mtp_num_layers had no flag, and --set sent it into the layout (a 422; CLI review)."""
    args = [
        "estimate",
        "--model",
        "deepseek-v2-lite",
        "--gpus",
        "8xh100-sxm-80gb",
        "--seq",
        "4096",
        "--batch",
        "64",
    ]
    args += ["--framework", "megatron", "--set", "ep=8", "--json"]
    plain, mtp = run(*args), run(*args, "--mtp-num-layers", "1")
    assert plain.exit_code == mtp.exit_code == 0, mtp.output
    assert json.loads(mtp.output)["time"]["step_s"] > json.loads(plain.output)["time"]["step_s"]


def test_the_defaults_line_gives_a_bandwidth_in_the_flags_unit(database: str) -> None:
    """`cluster.inter_node_bandwidth_bytes_per_s 50000000000` named neither the flag's field nor its
    unit (--inter-gbps takes GB/s; CLI review)."""
    result = run(
        "estimate", "--model", "gpt2", "--gpus", "2x8xh100-sxm-80gb", "--seq", "1024", "--batch", "16"
    )
    assert result.exit_code == 0, result.output
    assert "cluster.inter_node_bandwidth_gbps 50" in words(result.output)
    assert "50000000000" not in result.output


def test_a_node_s_own_link_is_a_flag_of_an_inline_and_a_stored_cluster(database: str) -> None:
    """intra_node_bandwidth_bytes_per_s had no flag (CLI review): a node wired otherwise than the
    GPU's figure could not be stated from the terminal."""
    args = ["estimate", "--model", "llama-3.1-8b", "--seq", "4096", "--batch", "64", "--tp", "8", "--json"]
    plain = json.loads(run(*args, "--gpus", "8xh100-sxm-80gb").output)
    slow = run(*args, "--gpus", "8xh100-sxm-80gb", "--intra-gbps", "32")
    assert slow.exit_code == 0, slow.output
    assert json.loads(slow.output)["time"]["step_s"] > plain["time"]["step_s"]  # TP over a PCIe-class link
    added = run("clusters", "add", "pcie-wired", "--gpus", "8xh100-sxm-80gb", "--intra-gbps", "32", "--json")
    assert json.loads(added.output)["intra_node_bandwidth_bytes_per_s"] == 32e9
    refused = CliRunner().invoke(main, [*args, "--gpus", "8xh100-sxm-80gb", "--intra-gbps", "1e9"])
    assert refused.exit_code == 1 and "(--intra-gbps)" in words(refused.output), refused.output


LAB_CARD = {
    "name": "Lab Card 48GB",
    "memory_bytes": 48 * 2**30,
    "peak_flops_per_s": {"fp32": 4e13, "bf16": 1.8e14},
    "hbm_bandwidth_bytes_per_s": 1e12,
    "pcie_bandwidth_bytes_per_s": 3.2e10,
}


def test_a_gpu_the_catalog_does_not_know_from_a_spec_file(database: str, tmp_path: Path) -> None:
    """A custom GPU was reachable from the CLI only through a cluster stored over HTTP (--gpus takes
    catalog names): --gpu-spec reads the API's custom GPU object from a file, which --gpus names."""
    spec = tmp_path / "lab.json"
    spec.write_text(json.dumps(LAB_CARD))
    assert cluster_from_gpus("4xlab-card-48gb", None, gpu_spec=spec) == {
        "gpu": LAB_CARD, "num_nodes": 1, "gpus_per_node": 4
    }  # fmt: skip
    # no node of its own: nodes of 8, as a PCIe card's; across nodes its network is the caller's
    assert cluster_from_gpus("16xlab-card-48gb", 12.5, gpu_spec=spec)["num_nodes"] == 2
    job = ["--model", "llama-3.1-8b", "--seq", "4096", "--batch", "64"]
    spans = run("estimate", *job, "--gpus", "16xlab-card-48gb", "--gpu-spec", str(spec))
    assert spans.exit_code == 64 and "--inter-gbps" in spans.output
    other = run("estimate", *job, "--gpus", "4xlab-card", "--gpu-spec", str(spec))
    assert other.exit_code == 64 and "lab-card-48gb" in other.output
    # the same numbers as the API's, given the same GPU inline
    result = run("plan", *job, "--gpus", "4xlab-card-48gb", "--gpu-spec", str(spec), "--json")
    assert result.exit_code == 0, result.output
    from fastapi.testclient import TestClient

    body = {
        "model": {"preset": "llama-3.1-8b"},
        "cluster": {"gpu": LAB_CARD, "num_nodes": 1, "gpus_per_node": 4},
        "training": {"seq_len": 4096, "global_batch_size": 64},
        "launchers": [],
    }
    with TestClient(create_app(Settings(database_url=database))) as client:
        posted = client.post("/v1/plans", json=body).json()
    assert json.loads(result.output)["recommended"] == posted["recommended"]
    # a field the API refuses is the file's, and named so
    spec.write_text(json.dumps({**LAB_CARD, "memory_bytes": 5}))
    bad = run("estimate", *job, "--gpus", "4xlab-card-48gb", "--gpu-spec", str(spec))
    assert bad.exit_code == 1 and "cluster.gpu.memory_bytes (--gpu-spec)" in " ".join(bad.output.split())
    spec.write_text(json.dumps(LAB_CARD))
    stored = run("clusters", "add", "lab", "--gpus", "2x4xlab-card-48gb", "--inter-gbps", "25",
                 "--gpu-spec", str(spec), "--json")  # fmt: skip
    assert stored.exit_code == 0, stored.output
    assert json.loads(stored.output)["gpu"]["name"] == LAB_CARD["name"]
    both = run("estimate", *job, "--cluster", "lab", "--gpu-spec", str(spec))
    assert both.exit_code == 64 and "--gpu-spec goes with --gpus" in " ".join(both.output.split())
    assert run("estimate", *job, "--cluster", "lab", "--zero", "3", "--recompute", "full").exit_code == 0
    spec.write_text("{not json")
    assert run("estimate", *job, "--gpus", "4xlab-card-48gb", "--gpu-spec", str(spec)).exit_code == 64


def test_a_database_or_setting_that_does_not_work_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`trainplan keys list` on a database that does not answer printed 151 lines of traceback; a bad
    PLANNER_ variable, pydantic's traceback (operations review)."""
    import socket

    from service.settings import get_settings

    with socket.socket() as probe:  # a local port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("PLANNER_DATABASE_URL", f"postgresql+psycopg://postgres@127.0.0.1:{port}/none")
    monkeypatch.setenv("PLANNER_DATABASE_CONNECT_TIMEOUT_S", "2")
    get_settings.cache_clear()
    try:
        for command in (["keys", "list"], ["models"]):  # on the database, and the in-process service
            result = CliRunner().invoke(main, command)
            assert result.exit_code == 1 and "cannot reach the database" in result.output, result.output
            assert "Traceback" not in result.output and len(result.output.splitlines()) <= 3
        monkeypatch.setenv("PLANNER_LOG_LEVEL", "verbose")
        get_settings.cache_clear()
        bad = CliRunner().invoke(main, ["models"])
        assert bad.exit_code == 1 and "PLANNER_LOG_LEVEL" in bad.output and "Traceback" not in bad.output
    finally:
        get_settings.cache_clear()


def test_serve_starts_as_the_image_does_on_a_later_releases_database(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`trainplan serve` ran `alembic upgrade head`, which fails on a revision this code does not know
    (a later release migrated the database): it migrates as the image's start command does, leaving such
    a database as it is, and serves (change review)."""
    import uvicorn
    from sqlalchemy import create_engine, text

    served: list[str] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: served.append(app))
    assert run("serve").exit_code == 0 and served == ["service.main:create_app"]
    engine = create_engine(database)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'a_later_release'"))
    engine.dispose()
    result = CliRunner().invoke(main, ["serve"])
    assert result.exit_code == 0, result.output
    assert "a later release's" in result.output and served == ["service.main:create_app"] * 2


def test_capacity_cut_before_any_fit_exits_3_not_2() -> None:
    """A capacity whose GPU types' searches were all cut before a fit said "does not fit" (exit 2) beside
    rows reading "unknown (search cut)" (change review): a scheduler script reads 2 as final."""
    from service.cli import INFEASIBLE, UNKNOWN, capacity_exit

    assert capacity_exit([{"fits": None}, {"fits": False}]) == UNKNOWN == 3
    assert capacity_exit([{"fits": False}, {"fits": False}]) == INFEASIBLE
    assert capacity_exit([{"fits": None}, {"fits": True}]) == 0


@pytest.mark.parametrize(
    ("status", "headers", "body"),
    [
        (301, {"Location": "https://planner.example/v1/models"}, b""),  # an ingress sending http to https
        (200, {"Content-Type": "text/html"}, b"<html>sign in</html>"),  # a login proxy
        (200, {"Content-Type": "application/json"}, b"42"),  # JSON, not the API's
    ],
)
def test_a_url_that_is_not_the_api_is_one_line_not_a_traceback(
    status: int, headers: dict[str, str], body: bytes
) -> None:
    """CLI review: a redirect, an HTML page or JSON of another shape from --url ended in a TypeError
    traceback; each is one line naming what answered, exit 1."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = CliRunner().invoke(main, ["models", "--url", url])
    finally:
        server.shutdown()
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    said = words(result.output)
    assert ("redirected" in said) if status == 301 else ("not the API's JSON" in said)


def test_a_run_without_a_figure_and_a_url_without_its_scheme_are_usage_errors() -> None:
    """CLI review: both exited 1 with the API's or httpx's words, where the command line was what was
    wrong (exit 64, the flags named)."""
    result = CliRunner().invoke(main, ["runs", "add", "01M00000000000000000000000"])
    assert result.exit_code == 64 and "--step-s" in words(result.output), result.output
    result = CliRunner().invoke(main, ["models", "--url", "127.0.0.1:8000"])
    assert result.exit_code == 64 and "http://127.0.0.1:8000" in words(result.output), result.output


def test_a_shortfall_that_rounds_to_nothing_in_gib_is_said_in_mib() -> None:
    # "0.0 GiB over 80.0 GiB" beside "does not fit" for 2.7 MiB (units review)
    assert shortfall(2.7 * 2**20) == "2.7 MiB"
    assert shortfall(2**30) == "1.0 GiB"
    memory = {"headroom_bytes": -int(2.7 * 2**20), "capacity_bytes": 80 * 2**30}
    assert memory_lines({"memory": memory})[0] == "2.7 MiB over 80.0 GiB"
