"""`trainplan`: the command line for capacity planning, on the same API the service serves.

Every command sends the request the HTTP API takes: to a running service with ``--url``, or, by
default, to the service in-process over the local database (``PLANNER_DATABASE_URL``, migrated first),
so the numbers are the API's either way. Human output is aligned tables with units; ``--json`` prints
the API's JSON (a listing: the API's page, with every item). Exit codes: 0 feasible (or done), 2 does
not fit, 3 unknown (capacity: a GPU type's search cut before a fit, none found), 64 usage error (the
command line itself: an unknown option, a missing or malformed value, a --config file that is not
there, flags missing or contradicting; BSD's EX_USAGE), 1 any other error (the API refused the request:
one line naming the field and its flag; the service cannot be reached).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import click
import httpx
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from service.catalog.errors import UnknownCatalogEntry
from service.contracts.common import enum_spelling
from service.contracts.estimates import layout_label_switches
from service.contracts.gpus import gpu_slug, reference_node
from service.contracts.training import HF_OPTIM_NAMES
from service.estimator.types import (
    Attention,
    BaseDtype,
    Framework,
    MemoryStatistic,
    Method,
    Optimizer,
    OptimizerImplementation,
    Precision,
    Recompute,
)
from service.launchers.common import Target
from service.recommender.types import Objective
from service.settings import SettingsError

FEASIBLE, ERROR, INFEASIBLE, USAGE = 0, 1, 2, 64
UNKNOWN = 3  # capacity: nothing fits of what was searched, and a GPU type's search was cut before a fit
GIB = 2**30
_GPUS = re.compile(r"^(?:(\d+)x)?(\d+)x([a-z0-9][a-z0-9.\-]*)$")
_BAR_CHARS = 40  # the memory bar's width at the card's capacity


class Listing(Table):
    """A table whose cells fold rather than end in an ellipsis: piped (80 columns, no terminal), a
    capacity row read "h100-sxm-..." (which of four parts?) and hid "recompute=full" (CLI review)."""

    def add_column(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("overflow", "fold")
        super().add_column(*args, **kwargs)


console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)


class Failure(click.ClickException):
    """An API problem: printed as one line (field, detail), exit code 1."""

    exit_code = ERROR

    def show(self, file: Any = None) -> None:
        errors.print(f"[bold red]error:[/] {escape(self.message)}")


class Usage(Failure):
    """The command line itself is wrong (flags that contradict, a malformed --gpus): exit code 64."""

    exit_code = USAGE


class TrainplanGroup(click.Group):
    """Click's group, with argument-parsing errors exiting 64 (EX_USAGE) rather than Click's 2,
    which here means "does not fit": a script can tell a wrong call from an infeasible job."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.UsageError as exc:  # unknown option, missing or malformed value, missing file
            exc.show()
            sys.exit(USAGE)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            errors.print("aborted")
            sys.exit(ERROR)
        except SettingsError as exc:  # the PLANNER_ variables of an in-process service or `serve`
            errors.print(f"error: {escape(str(exc))}")
            sys.exit(ERROR)
        sys.exit(code if isinstance(code, int) else FEASIBLE)


# ---------------------------------------------------------------- the API, remote or in-process


class Api:
    """The service's HTTP API, over the network (``url``) or in-process on the local database.

    One client per command: the local service is migrated and started once, then serves every call
    (a plan and each of its files), and is closed when the command ends."""

    def __init__(self, url: str | None, flags: Mapping[str, str] | None = None) -> None:
        self.url = url
        self.flags = flags or {}  # the request's fields by the flag that sets each (``flag_of``)
        self._stack = contextlib.ExitStack()
        self._client: httpx.Client | None = None
        context = click.get_current_context(silent=True)
        if context is not None:
            context.call_on_close(self._stack.close)

    def client(self) -> httpx.Client:
        if self.url and not self.url.startswith(("http://", "https://")):
            # a malformed value is the command line's (exit 64), not an unreachable service's
            raise Usage(f"--url {self.url!r} needs its scheme: http://{self.url} or https://{self.url}")
        if self._client is None:
            self._client = self._stack.enter_context(self._open())
        return self._client

    def _open(self) -> contextlib.AbstractContextManager[httpx.Client]:
        # A service with PLANNER_REQUIRE_AUTH=true needs a key: from the environment, never a flag
        # (a flag would show in `ps` and in shell history).
        key = os.environ.get("TRAINPLAN_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        if self.url:
            return httpx.Client(base_url=self.url, timeout=120, headers=headers)
        import warnings

        # the in-process transport; Starlette's note about httpx is for test suites, not for users
        warnings.filterwarnings("ignore", message=".*starlette.testclient.*")
        from fastapi.testclient import TestClient

        from service.main import create_app
        from service.settings import get_settings

        # In-process, the service's access lines would only interleave with the command's output.
        settings = get_settings().model_copy(update={"log_level": "WARNING"})
        migrate(settings.database_url)
        return TestClient(create_app(settings), raise_server_exceptions=False, headers=headers)

    def call(self, method: str, path: str, *, raw: bool = False, **kwargs: Any) -> Any:
        """The answer's JSON (None for 204), or with ``raw`` its bytes (a plan's files). Anything else,
        a redirect (an ingress sending http to https), a page that is not the API's (a login proxy, the
        service's own page for a URL with a query), JSON not an object or list, is one line and exit 1
        (each was a traceback: CLI review)."""
        try:
            response = self.client().request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise Failure(f"cannot reach {self.url}: {exc}") from exc
        if response.status_code >= 400:
            raise Failure(problem_text(response, self.flags))
        if response.is_redirect:
            where = response.headers.get("location", "?")
            raise Failure(f"{self.url} redirected {method} {path} to {where}: give --url as that address")
        if response.status_code == 204:
            return None
        if raw:
            return response.content
        if response.headers.get("content-type", "").startswith("application/json"):
            try:
                answer = response.json()
            except ValueError:
                answer = None
            if isinstance(answer, dict | list):
                return answer
        kind = response.headers.get("content-type", "no content type")
        raise Failure(
            f"{self.url} answered {method} {path} with {response.status_code} {kind}, not the API's JSON: is "
            "--url the trainplan service's base address (no path or query)?"
        )


def migrate(database_url: str) -> None:
    """``alembic upgrade head`` on the local database, as ``make serve`` does."""
    from alembic import command

    from service.persistence.schema import alembic_config

    with database_reached():
        command.upgrade(alembic_config(database_url), "head")


@contextlib.contextmanager
def database_reached() -> Iterator[None]:
    """A database that does not answer is one line (``Failure``), not a page of traceback (operations
    and change reviews)."""
    from sqlalchemy.exc import OperationalError

    from service.persistence.db import driver_message

    try:
        yield
    except OperationalError as exc:
        raise Failure(f"cannot reach the database of PLANNER_DATABASE_URL: {driver_message(exc)}") from None


def problem_text(response: httpx.Response, flags: Mapping[str, str] | None = None) -> str:
    """An RFC 9457 problem as one line: status, detail, and each field the API named, with the flag
    of the command that set it (``flags``: the command's fields by flag, ``flag_of``)."""
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:200]}"
    detail = str(body.get("detail", response.reason_phrase))
    if response.status_code == 401:  # the API's words are for HTTP clients; this one sends the variable
        detail += " (the CLI sends TRAINPLAN_API_KEY as that header: set it)"
    named = []
    for error in body.get("errors", []):
        if isinstance(error, dict) and error.get("field"):
            field, message = str(error["field"]), str(error.get("message", ""))
            flag = flag_of(field, flags or {})
            field += f" ({flag})" if flag else ""
            bounds = error.get("limit")
            if flag and flag.endswith("-gib") and isinstance(bounds, dict):
                # the API's bound is in bytes, the flag's value in GiB: said in the flag's unit too
                # ("less than or equal to 17592186044416" for --host-gib 20000; a surfaces review)
                said = [f"{k} {_gib_words(v)} GiB" for k, v in bounds.items() if isinstance(v, int | float)]
                message += f" ({', '.join(said)} in {flag}'s unit)" if said else ""
                named.append(f"{field}: {message}")
                continue
            named.append(field if message in detail else f"{field}: {message}")
    return f"HTTP {response.status_code}: {detail}" + (f" [field {'; '.join(named)}]" if named else "")


def _gib_words(value: float) -> str:
    """Bytes as GiB, whole where they are (2**50 is 1,048,576, not 1.04858e+06: a review)."""
    gib = value / 2**30
    return f"{gib:,.0f}" if gib.is_integer() else f"{gib:,.4f}".rstrip("0").rstrip(".")


def flag_of(field: str, flags: Mapping[str, str]) -> str | None:
    """The flag that set the request field ``field`` (``constraints.frameworks.1``: an item of a list
    is its list's flag): that of its longest dotted prefix in ``flags`` (``layout.*``: any field under
    layout, not layout itself, and before layout's own: ``cluster.gpu.*`` is a custom GPU's file,
    ``cluster.gpu`` the --gpus that names it); None where no flag sets it."""
    parts = field.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        flag = (flags.get(f"{prefix}.*") if end < len(parts) else None) or flags.get(prefix)
        if flag is not None:
            return flag
    return None


# ---------------------------------------------------------------- request pieces from flags


def cluster_from_gpus(
    spec: str,
    inter_gbps: float | None,
    *,
    intra_gbps: float | None = None,
    intra_busbw_gbps: float | None = None,
    inter_busbw_gbps: float | None = None,
    host_gib: float | None = None,
    nvme_gib: float | None = None,
    gpu_spec: Path | None = None,
) -> dict[str, Any]:
    """``8xh100-sxm-80gb`` (one node of up to the part's node size, 8 where the catalog gives none, or
    whole nodes of it past that) or ``4x8xh100-sxm-80gb`` (nodes x GPUs per node) as an inline
    cluster, with the NCCL bus bandwidths measured on it and its nodes' host RAM and NVMe, if given.
    ``gpu_spec``: a JSON file of a GPU the catalog does not know (the API's custom GPU), which
    ``spec`` names; nodes of it hold 8 unless ``spec`` says otherwise, as a PCIe card's do."""
    match = _GPUS.match(spec.strip().lower())
    if match is None:
        raise Usage(f"--gpus {spec!r}: expected COUNTxGPU or NODESxPER_NODExGPU, e.g. 8xh100-sxm-80gb")
    nodes_text, count_text, gpu = match.groups()
    custom = None if gpu_spec is None else custom_gpu(gpu_spec, spec, gpu)
    count = int(count_text)
    node = 8 if custom is not None else _node_size(gpu)
    if nodes_text is not None:
        nodes, per_node = int(nodes_text), count
    elif count <= node:
        nodes, per_node = 1, count
    else:
        if custom is None:
            _known(spec, gpu)  # a mistyped name is refused as one, not as "not whole nodes of 8"
        if count % node:
            raise Usage(
                f"--gpus {spec!r}: {count} GPUs is not whole nodes of {node}; write NODESxPER_NODExGPU"
            )
        nodes, per_node = count // node, node
    cluster: dict[str, Any] = {"gpu": custom or gpu, "num_nodes": nodes, "gpus_per_node": per_node}
    if inter_gbps is not None:
        cluster["inter_node_bandwidth_gbps"] = inter_gbps
    elif nodes > 1:
        if custom is not None:
            raise Usage(f"--gpus {spec!r} spans {nodes} nodes: give --inter-gbps (each GPU's network, GB/s)")
        _known(spec, gpu)  # a mistyped name is refused as one, not asked for its network
        if _reference_network(gpu) is None:
            # a part that ships in a reference node has that node's network (the API's default, which
            # the answer's defaults line names); a PCIe card does not
            raise Usage(f"--gpus {spec!r} spans {nodes} nodes: give --inter-gbps (each GPU's network, GB/s)")
    if intra_gbps is not None:
        cluster["intra_node_bandwidth_gbps"] = intra_gbps
    if intra_busbw_gbps is not None:
        cluster["measured_intra_node_bus_bandwidth_gbps"] = intra_busbw_gbps
    if inter_busbw_gbps is not None:
        cluster["measured_inter_node_bus_bandwidth_gbps"] = inter_busbw_gbps
    if host_gib is not None:  # left out: 0, not stated (the API's default: no offload to host RAM)
        cluster["cpu_memory_bytes_per_node"] = gib_bytes(host_gib, "--host-gib")
    if nvme_gib is not None:
        cluster["nvme_bytes_per_node"] = gib_bytes(nvme_gib, "--nvme-gib")
    return cluster


def custom_gpu(path: Path, spec: str, gpu: str) -> dict[str, Any]:
    """The custom GPU in the JSON file ``path`` (the object POST /v1/clusters and the job endpoints take
    as ``cluster.gpu``), which ``--gpus`` must name: its fields are the API's to check."""
    try:
        loaded = read_json(path.read_text())
    except (OSError, ValueError) as exc:
        raise Usage(f"--gpu-spec {path}: {exc}") from exc
    if not isinstance(loaded, dict) or not isinstance(loaded.get("name"), str):
        raise Usage(f"--gpu-spec {path}: expected a JSON object with the GPU's name (POST /v1/clusters' gpu)")
    named = re.sub(r"[^a-z0-9.]+", "-", loaded["name"].lower()).strip("-")  # as --gpus can write it
    if named != gpu:
        raise Usage(f"--gpus {spec!r} names {gpu}, --gpu-spec {path} describes {named}: name it in --gpus")
    return loaded


def _known(spec: str, gpu: str) -> None:
    """Refuse a GPU name the catalog does not know, as the API refuses it (exit 1, its "did you mean"),
    where the CLI would otherwise answer from the catalog's entry (its node size, its network);
    elsewhere the name goes to the API as written, which refuses it the same way."""
    try:
        gpu_slug(gpu)
    except UnknownCatalogEntry as exc:
        raise Failure(f"--gpus {spec!r}: {exc.message}") from None


def _node_size(gpu: str) -> int:
    """GPUs per node of COUNTxGPU: the catalog part's node (``contracts.gpus.reference_node``: 8 on an
    HGX baseboard, 8 MI250X GCDs on a Frontier node), else 8."""
    node = reference_node(gpu)
    return node.spec.node_gpus if node is not None and node.spec.node_gpus else 8


def _reference_network(gpu: str) -> float | None:
    """The network per GPU of the reference node of catalog GPU ``gpu`` (the API's default for a
    cluster across nodes); None for a PCIe card or a name the catalog does not know."""
    node = reference_node(gpu)
    return None if node is None else node.spec.node_network_bytes_per_s


def model_ref(model: str | None, config: Path | None) -> dict[str, Any]:
    if (model is None) == (config is None):
        raise Usage("give exactly one of --model NAME (GET /v1/models) or --config config.json")
    if model is not None:
        return {"preset": model}
    assert config is not None
    try:
        return {"hf_config": read_json(config.read_text())}
    except (OSError, ValueError) as exc:
        raise Usage(f"--config {config}: {exc}") from exc


def read_json(text: str) -> Any:
    """``json.loads`` of what the command line was given, refusing what no figure is and the body
    sent on cannot carry (a traceback, not a usage error; CLI reviews): NaN and Infinity, and a number
    past any float (1e400, read as inf), at any depth."""
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is not a finite number")
    return number


def gib_bytes(gib: float, flag: str) -> int:
    """``gib`` GiB as whole bytes; a figure past any float once in bytes (1e300 GiB) is a usage error,
    not an OverflowError's traceback (CLI review)."""
    amount = gib * GIB
    if not math.isfinite(amount):
        raise Usage(f"{flag} {gib:g}: past any memory")
    return int(amount)


# the flags that describe an inline cluster (--gpus); a stored one states its own (PATCH /v1/clusters/ID)
INLINE_CLUSTER_OPTIONS = (
    "inter_gbps", "intra_gbps", "intra_busbw_gbps", "inter_busbw_gbps", "host_gib", "nvme_gib", "gpu_spec"
)  # fmt: skip


def cluster_choice(api: Api, options: Mapping[str, Any]) -> dict[str, Any]:
    """The request's cluster from a command's cluster options (``cluster_options``: the click context's
    params): inline from --gpus and the flags describing it, or a stored one by --cluster."""
    gpus, cluster = options["gpus"], options["cluster"]
    if (gpus is None) == (cluster is None):  # flags missing or contradicting: the call's fault
        raise Usage("give exactly one of --gpus COUNTxGPU or --cluster NAME (a stored cluster)")
    if gpus is not None:
        return cluster_from_gpus(gpus, **{name: options[name] for name in INLINE_CLUSTER_OPTIONS})
    given = [f"--{name.replace('_', '-')}" for name in INLINE_CLUSTER_OPTIONS if options[name] is not None]
    if given:
        verb = "goes" if len(given) == 1 else "go"
        raise Usage(
            f"--cluster {cluster!r}: a stored cluster states its own GPU, network, measured bus bandwidths, "
            f"host RAM and NVMe (PATCH /v1/clusters/ID); {', '.join(given)} {verb} with --gpus"
        )
    return {"id": stored_cluster_id(api, str(cluster))}


def stored_cluster_id(api: Api, name_or_id: str, option: str = "--cluster") -> str:
    for item in all_pages(api, "/v1/clusters"):
        if name_or_id in (item["id"], item["name"]):
            return str(item["id"])
    raise Failure(f"{option} {name_or_id!r}: no stored cluster has that name or id")


def training(options: Mapping[str, Any]) -> dict[str, Any]:
    """The request's training from a command's job options (``job_options``: the click context's
    params); precision and attention left out resolve from the GPU, a LoRA's rank and targets to 16
    and all-linear (the answer's resolved_defaults names what they became)."""
    body: dict[str, Any] = {
        "seq_len": options["seq"], "global_batch_size": options["batch"], "method": options["method"]
    }  # fmt: skip
    targets: str | list[str] | None = options["lora_targets"]
    if isinstance(targets, str) and targets != "all-linear":
        targets = [name.strip() for name in targets.split(",") if name.strip()]
    for name in ("precision", "attention", "tokens", "base_dtype", "optimizer", "optimizer_implementation",
                 "lora_rank", "mtp_num_layers"):  # fmt: skip
        if options[name] is not None:
            body[name] = options[name]
    if targets is not None:
        body["lora_targets"] = targets
    return body


# ---------------------------------------------------------------- human output


def defaults_text(chosen: Mapping[str, str]) -> str:
    """The answer's resolved_defaults in words; a bandwidth in GB/s under its flag's unit
    (``cluster.inter_node_bandwidth_gbps 50``, not 50000000000 bytes/s: CLI review)."""
    parts = []
    for key, value in chosen.items():
        if key.endswith("_bytes_per_s"):
            with contextlib.suppress(ValueError):
                key, value = key.removesuffix("_bytes_per_s") + "_gbps", f"{float(value) / 1e9:g}"
        parts.append(f"{key} {value}")
    return ", ".join(parts)


def gib(value: float) -> str:
    return f"{value / GIB:,.1f} GiB"


def shortfall(over_bytes: float) -> str:
    """How far a need is past the card: in MiB where GiB would print 0.0 beside "does not fit" (units
    review: "0.0 GiB over 80.0 GiB" for 2.7 MiB)."""
    return gib(over_bytes) if over_bytes >= 0.05 * GIB else f"{over_bytes / 2**20:,.1f} MiB"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 86_400:
        return f"{value / 86_400:,.1f} d"
    if value >= 3_600:
        return f"{value / 3_600:,.1f} h"
    return f"{value:,.3f} s"


# The switches a plan may set beside the degrees, printed as `estimate --set` takes them wherever they
# are set (tri-state ones either way): the fields LayoutIn marks, as the page reads them from the OpenAPI
# document.
LABEL_SWITCHES = layout_label_switches()
LABEL_TRI_STATE = frozenset(name for name, tri_state in LABEL_SWITCHES.items() if tri_state)


def layout_text(layout: dict[str, Any]) -> str:
    parts = [str(layout.get("framework"))]
    parts += [f"{k}={layout[k]}" for k in ("dp", "tp", "pp", "cp", "ep") if layout.get(k, 1) != 1]
    parts.append(f"zero={layout.get('zero_stage', 0)}")
    if layout.get("virtual_pipeline_stages", 1) > 1:
        parts.append(f"vpp={layout['virtual_pipeline_stages']}")
    parts.append(f"micro={layout.get('micro_batch_size')}")
    if layout.get("recompute", "none") != "none":
        modules = layout.get("recompute_modules")
        parts.append(f"recompute={layout['recompute']}" + (f"({','.join(modules)})" if modules else ""))
    for key in ("offload_optimizer", "offload_params"):
        if layout.get(key, "none") != "none":
            parts.append(f"{key}={layout[key]}")
    for key in LABEL_SWITCHES:
        value = layout.get(key)
        if value is None or value == "none" or (value is False and key not in LABEL_TRI_STATE):
            continue
        parts.append(f"{key}={str(value).lower()}")
    if layout.get("moe_dispatcher", "alltoall") != "alltoall":
        parts.append(f"moe_dispatcher={layout['moe_dispatcher']}")
    # TP overlap: Megatron's default is on where the GPUs map peer memory, the others' off; printed where
    # it can differ from what an estimate of the label resolves
    overlap_tp = layout.get("tp_comm_overlap")
    shown = overlap_tp or (overlap_tp is False and layout.get("framework") == "megatron")
    if layout.get("tp", 1) > 1 and shown:
        parts.append(f"tp_comm_overlap={str(overlap_tp).lower()}")
    return " ".join(parts)


# The rows of the memory table: the components, each statistic after the components it adds up
# (bold), from what PyTorch allocates to what nvidia-smi shows; the fit compares the last one with the card.
MEMORY_ROWS = (
    ("parameters", None),
    ("gradients", None),
    ("optimizer_states", None),
    ("activations", None),
    ("buffers", None),
    ("peak_allocated_bytes", "peak allocated"),
    ("fragmentation", None),
    ("peak_reserved_bytes", "peak reserved"),
    ("cuda_context", None),
    ("nccl_buffers", None),
    ("tp_comm_buffers", None),
    ("device_used_bytes", "device used (fit)"),
)
# components most layouts hold none of, shown where one does
ZERO_ROWS_LEFT_OUT = frozenset({"tp_comm_buffers"})
# what a plan stored before the statistics were named holds
OLD_MEMORY_ROWS = (
    *((name, None) for name in ("parameters", "gradients", "optimizer_states", "activations", "buffers")),
    ("overhead", None),
    ("total", "total"),
)


def memory_table(estimate: dict[str, Any]) -> Table:
    """Per-GPU memory by component and the three statistics they add up to (peak allocated, peak
    reserved, device used as nvidia-smi shows it), with a bar each against the card's capacity."""
    memory = estimate["memory"]
    capacity = memory["capacity_bytes"]
    per_gpu = memory["per_gpu"]
    table = Listing(title=f"memory per GPU (most-loaded rank) of {gib(capacity)}", title_justify="left")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    table.add_column("share of the card")
    named = per_gpu.get("peak_allocated_bytes") is not None
    for key, statistic in MEMORY_ROWS if named else OLD_MEMORY_ROWS:
        value = per_gpu.get(key)
        if value is None or (key in ZERO_ROWS_LEFT_OUT and not value):
            continue  # a component the layout does not hold, or a plan stored before it was reported
        width = 0 if capacity <= 0 else min(_BAR_CHARS, math.ceil(_BAR_CHARS * value / capacity))
        bar = "#" * width + "." * (_BAR_CHARS - width)
        table.add_row(statistic or key, f"{value / GIB:,.2f}", bar, style="bold" if statistic else "")
    return table


def time_table(estimate: dict[str, Any]) -> Table | None:
    time = estimate.get("time")
    if time is None:
        return None
    table = Listing(title="step time", title_justify="left")
    table.add_column("part")
    table.add_column("s", justify="right")
    for name, value in time["breakdown"].items():
        if value:
            table.add_row(name.removesuffix("_s"), f"{value:,.4f}")
    table.add_row("step", f"{time['step_s']:,.4f}", style="bold")
    return table


def amount(value: float) -> str:
    """A cost or GPU-hour figure: whole units from a thousand up, else four significant digits (a
    7.75 cost printed as "8", 4.31 GPU-hours as "4", beside a 1.8 price: cost review)."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def memory_lines(estimate: dict[str, Any]) -> list[str]:
    """What the memory table leaves out and the page says: the headroom the fit leaves, the host RAM
    and NVMe per node an offload needs, and the largest micro-batch and sequence this layout still
    holds (``limits``; 0: none fits, null: not computed)."""
    memory = estimate["memory"]
    headroom, capacity = memory["headroom_bytes"], gib(memory["capacity_bytes"])
    lines = [
        f"headroom {gib(headroom)} of {capacity}"
        if headroom >= 0
        else f"{shortfall(-headroom)} over {capacity}"
    ]
    host = [
        f"{what} {gib(memory[key])}"
        for what, key in (("host RAM", "cpu_per_node_bytes"), ("NVMe", "nvme_per_node_bytes"))
        if memory.get(key)
    ]
    if host:
        lines.append(f"offload needs {', '.join(host)} per node")
    limits = estimate.get("limits") or {}
    micro, seq = limits.get("max_micro_batch_size"), limits.get("max_seq_len")
    said = []
    if micro is not None:
        said.append(f"micro-batch up to {micro:,}" if micro else "no micro-batch the global batch allows")
    if seq is not None:
        said.append(f"sequence up to {seq:,} tokens" if seq else "no sequence length")
    if said:
        lines.append(f"fits at this layout: {', '.join(said)}")
    return lines


def summary_lines(estimate: dict[str, Any]) -> list[str]:
    lines = []
    time = estimate.get("time")
    if time is not None:
        lines.append(
            f"throughput {time['tokens_per_s']:,.0f} tokens/s, {time['tflops_per_gpu']:,.1f} TFLOP/s per "
            f"GPU, MFU {time['mfu']:.1%}, step {seconds(time['step_s'])}"
        )
    if estimate.get("time_to_train_s") is not None:
        cost = estimate.get("cost_to_train")
        priced = f", cost {amount(cost)} at the GPU-hour price given" if cost is not None else ""
        lines.append(f"time to train {seconds(estimate['time_to_train_s'])}{priced}")
    return lines


def print_estimate(estimate: dict[str, Any], calibrated: bool = True, assumptions: bool = True) -> None:
    """An estimate as tables and lines; ``calibrated``: whether the service calibrates such an estimate
    (a plan's closest layout is the search's, never calibrated); ``assumptions``: with what its figures
    rest on (a plan prints them after its rationale: ``print_assumptions``)."""
    verdict = "[green]fits[/]" if estimate["fits"] else "[red]does not fit[/]"
    console.print(f"{layout_text(estimate['layout'])}: {verdict}")
    console.print(memory_table(estimate))
    for line in memory_lines(estimate):
        console.print(line)
    table = time_table(estimate)
    if table is not None:
        console.print(table)
    for line in summary_lines(estimate):
        console.print(line)
    if calibrated:
        for line in calibration_lines(estimate.get("calibration")):
            console.print(escape(line))
    for warning in estimate.get("warnings", []):
        console.print(f"[yellow]warning:[/] {escape(warning)}")
    if assumptions:
        print_assumptions(estimate)


def print_assumptions(estimate: dict[str, Any]) -> None:
    """What an estimate's figures rest on (peaks, efficiencies, statistics), as the API and page say."""
    for assumption in estimate.get("assumptions", []):
        console.print(f"[dim]assumed: {escape(assumption)}[/]")


def calibration_lines(calibration: dict[str, Any] | None) -> list[str]:
    """Which runs calibrated an estimate, the factors, its figures without them and the runs set aside."""
    if not calibration:
        return ["not calibrated: no run recorded on this hardware yet"]
    factors = calibration["factors"]
    lines = [
        f"calibrated by {calibration['runs']} run(s): step time x{factors['step_time']:.3f}, "
        f"dynamic memory x{factors['memory_dynamic']:.3f}"
    ]
    plain = calibration.get("uncalibrated")
    if plain:
        step = f"step {seconds(plain['step_s'])}, " if plain.get("step_s") is not None else ""
        fits = "fits" if plain["fits"] else "does not fit"
        lines.append(f"  without calibration: {step}{gib(plain['memory_per_gpu_bytes'])} per GPU, {fits}")
    for run in calibration.get("evidence", []):
        why = f": {'; '.join(run['weighted_because'])}" if run["weighted_because"] else ""
        lines.append(
            f"  run {run['run_id']} ({run['framework']}) weight {run['weight']:.3f}, moves "
            f"{', '.join(run['factors'])}{why}"
        )
    for run in calibration.get("set_aside", []):
        lines.append(f"  run {run['run_id']} set aside: {'; '.join(run['reasons'])}")
    return lines


def print_plan(plan: dict[str, Any], asked: set[str]) -> None:
    console.print(f"plan {plan['id']} for {plan['model']}: [bold]{plan['status']}[/]")
    search = plan.get("search") or {}
    if search.get("truncated"):  # a layout the search did not reach may be better
        evaluations = search.get("memory_evaluations", 0) + search.get("time_evaluations", 0)
        by = search.get("truncated_by") or "its budget"
        console.print(f"[yellow]the search stopped early ({escape(by)}) after {evaluations:,} evaluations[/]")
    chosen = plan.get("resolved_defaults") or {}
    if chosen:
        console.print("defaults for this GPU: " + defaults_text(chosen))
    rec = plan.get("recommended")
    if rec is not None:
        console.print(f"[bold]recommended[/] {layout_text(rec['layout'])}")
        print_estimate(rec["estimate"], assumptions=False)
        for reason in rec["rationale"]:
            console.print(f"  - {escape(reason)}")
    if plan["alternatives"]:
        # the GPUs each uses, and with total tokens its time and cost to train: an alternative twice as
        # fast on twice the GPUs read as strictly better beside a cost objective's choice (cost review)
        timed = any(alt["estimate"].get("time_to_train_s") is not None for alt in plan["alternatives"])
        priced = any(alt["estimate"].get("cost_to_train") is not None for alt in plan["alternatives"])
        table = Listing(title="alternatives", title_justify="left")
        columns = ["layout", "GPUs", "memory", "tokens/s", "MFU"]
        columns += ["time to train"] * timed + ["cost"] * priced
        for column in columns:
            table.add_column(column, justify="left" if column == "layout" else "right")
        for alt in plan["alternatives"]:
            est, split = alt["estimate"], alt["layout"]
            time = est.get("time") or {}
            gpus = split["dp"] * split["tp"] * split["pp"] * split["cp"]
            cost = est.get("cost_to_train")
            table.add_row(
                layout_text(split),
                f"{gpus:,}",
                gib(est["memory"]["per_gpu"]["total"]),
                f"{time.get('tokens_per_s', 0):,.0f}",
                f"{time.get('mfu', 0):.1%}",
                *([seconds(est.get("time_to_train_s"))] if timed else []),
                *([amount(cost) if cost is not None else "-"] if priced else []),
            )
        console.print(table)
    if plan["rejected"]:
        table = Listing(title="rejected", title_justify="left")
        table.add_column("reason")
        table.add_column("layouts", justify="right")
        table.add_column("example")
        table.add_column("detail")
        for group in plan["rejected"]:
            example, detail = group.get("example"), str(group.get("detail") or "")
            table.add_row(
                escape(str(group.get("reason"))),
                str(group.get("count")),
                layout_text(example) if example else "",
                escape(detail if detail != group.get("reason") else ""),
            )
        console.print(table)
    closest = plan.get("closest")
    if closest is not None:
        # over the card less the plan's headroom, as the page says; with the detail that says of which
        # figure (a bound's states alone, or the whole layout) and what else it misses (a surfaces review)
        console.print(
            f"[bold]closest[/] {layout_text(closest['layout'])}: {gib(closest['over_bytes'])} over what the "
            "plan allows (the card less its headroom)"
        )
        if closest.get("detail"):
            console.print(f"  {escape(str(closest['detail']))}")
        print_estimate(closest["estimate"], calibrated=False)
    for suggestion in plan["suggestions"]:
        console.print(f"[cyan]suggestion:[/] {escape(str(suggestion.get('detail') or suggestion))}")
    for skipped in plan.get("suggestions_skipped") or []:
        console.print(f"[dim]not suggested ({escape(skipped['kind'])}): {escape(skipped['reason'])}[/]")
    for target, why in plan["unsupported_targets"].items():
        if target in asked:  # not the ones --out added
            console.print(f"[yellow]{target}:[/] {escape(why)}")
    if rec is not None:  # what the recommended figures rest on, last: the plan's answer reads first
        print_assumptions(rec["estimate"])


def write_artifacts(api: Api, plan: dict[str, Any], out: Path) -> list[Path]:
    """The plan's files (the API's artifacts, byte for byte) under ``out``; a directory that cannot
    be written is one line naming the plan, which is stored (its files stay at its artifacts URL)."""
    written = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for artifact in plan["artifacts"]:
            content = api.call("GET", f"/v1/plans/{plan['id']}/artifacts/{artifact['name']}", raw=True)
            path = out / artifact["name"]
            path.write_bytes(
                content if isinstance(content, bytes) else json.dumps(content, indent=2).encode() + b"\n"
            )
            if path.suffix == ".sh":  # runnable as written, as the API's artifacts.zip stores them (0755)
                path.chmod(0o755)
            written.append(path)
    except OSError as exc:
        raise Failure(
            f"--out {out}: {exc.strerror or exc} ({exc.filename or out}); the plan is stored: "
            f"its files are at /v1/plans/{plan['id']}/artifacts"
        ) from None
    return written


def emit(data: Any, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2))


# ---------------------------------------------------------------- commands


class EnumChoice(click.Choice[str]):
    """The values an option takes, from the enum the API validates it with (one list, in --help), in
    the spellings the API reads (``contracts.common.enum_spelling``: "BF16", "bfloat16", "FSDP2")."""

    def __init__(self, values: type[StrEnum]) -> None:
        super().__init__([value.value for value in values])
        self.enum = values

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        return super().convert(enum_spelling(value, (self.enum,)), param, ctx)


class OptimizerChoice(EnumChoice):
    """The optimizers, and HF Trainer's optim names the training contract reads as them
    (``contracts.training.HF_OPTIM_NAMES``: paged_adamw_8bit, adamw_torch, ...), passed on as given."""

    def __init__(self) -> None:
        super().__init__(Optimizer)
        self.choices = (*self.choices, *HF_OPTIM_NAMES)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        named = str(value).strip().lower().replace("-", "_")
        return named if named in HF_OPTIM_NAMES else super().convert(value, param, ctx)


def choice(values: type[StrEnum]) -> click.Choice[str]:
    """``EnumChoice`` of ``values``."""
    return EnumChoice(values)


class FiniteFloat(click.ParamType[float]):
    """A number, finite: Click's float takes "nan" and "inf", which no figure of a cluster, a price
    or a run is, and which JSON cannot carry (a traceback, not a usage error)."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


NUMBER = FiniteFloat()


class Amount(click.ParamType[int]):
    """A whole number, written as digits or in exponent notation (``15e12`` tokens, as the README
    and the API's JSON write amounts); a fraction or a non-finite value is a usage error."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:  # Decimal, not float: 1e12 + 1 written out stays exact
            number = Decimal(str(value).strip().replace("_", ""))
        except InvalidOperation:
            self.fail(f"{value!r} is not a number", param, ctx)
        if not number.is_finite() or number != number.to_integral_value():
            self.fail(f"{value!r} is not a whole number", param, ctx)
        if number.adjusted() > 100:  # 1e999999999 would be a billion digits before the API refused it
            self.fail(f"{value!r} is too large", param, ctx)
        return int(number)


AMOUNT = Amount()


url_option = click.option(
    "--url",
    envvar="TRAINPLAN_URL",
    help="a running service (default: in-process); its API key, if it needs one: TRAINPLAN_API_KEY",
)
json_option = click.option("--json", "as_json", is_flag=True, help="print the API's JSON")
model_options = [
    click.option("--model", help="a catalog preset (trainplan models)"),
    click.option("--config", type=click.Path(path_type=Path, exists=True), help="a Hugging Face config.json"),
]
job_options = [
    click.option("--seq", type=int, required=True, help="sequence length (tokens)"),
    click.option("--batch", type=int, required=True, help="global batch (sequences per optimizer step)"),
    click.option("--precision", type=choice(Precision), help="default: from the GPU"),
    click.option("--attention", type=choice(Attention), help="default: from the GPU"),
    click.option("--method", type=choice(Method), default="full", show_default=True),
    click.option(
        "--base-dtype",
        type=choice(BaseDtype),
        help="lora: compute (the default: the base in the compute dtype) or fp32 (loaded in fp32, trained "
        "under 16-bit autocast)",
    ),
    click.option(
        "--tokens", type=AMOUNT, help="total training tokens, for time to train (15e12 or 15000000000000)"
    ),
    click.option("--optimizer", type=OptimizerChoice(), help="default: adamw"),
    click.option("--lora-rank", type=int, help="lora / qlora: the adapters' rank (default: 16)"),
    click.option(
        "--mtp-num-layers",
        type=click.IntRange(0),
        help="multi-token prediction depths trained with the model (megatron --mtp-num-layers; default 0)",
    ),
    click.option(
        "--lora-targets",
        help="lora / qlora: all-linear (the default: every linear module of the model's family) or "
        "comma-separated module names, e.g. q_proj,v_proj",
    ),
    click.option(
        "--optimizer-implementation",
        type=choice(OptimizerImplementation),
        help="adamw under fsdp: fused (the default: no parameter-sized temporary) or foreach (torch.optim's "
        "default on CUDA: a temporary of the trainable parameters' size in the step)",
    ),
]
busbw_options = [
    click.option(
        "--intra-gbps",
        type=NUMBER,
        help="each GPU's link to the node's others, one direction, GB/s (default: the GPU's NVLink or "
        "PCIe figure, GET /v1/gpus; a node wired otherwise states its own)",
    ),
    click.option(
        "--intra-busbw-gbps",
        type=NUMBER,
        help="measured: nccl-tests all_reduce_perf busbw at >= 1 GiB on one node's GPUs, best with "
        "NCCL_ALGO=Ring, GB/s (default: the link x the tuning's bus efficiency)",
    ),
    click.option(
        "--inter-busbw-gbps",
        type=NUMBER,
        help="measured: nccl-tests all_reduce_perf busbw at >= 1 GiB, one GPU per node across the nodes, "
        "GB/s (default: --inter-gbps x the tuning's bus efficiency)",
    ),
]
cluster_options = [
    click.option(
        "--gpus",
        help="COUNTxGPU (whole nodes of the part's own size: 8 on HGX, 8 MI250X GCDs) or NODESxPER_NODExGPU, "
        "e.g. 8xh100-sxm-80gb",
    ),
    click.option("--cluster", help="a stored cluster's name or id"),
    click.option(
        "--gpu-spec",
        type=click.Path(dir_okay=False, path_type=Path),
        help="a GPU the catalog does not know: a JSON file of POST /v1/clusters' custom gpu (name, "
        "memory_bytes, peak_flops_per_s, hbm_bandwidth_bytes_per_s; chip and links optional), which "
        "--gpus names (its name in lower case, other characters as -): COUNTxNAME, nodes of 8",
    ),
    click.option(
        "--inter-gbps",
        type=NUMBER,
        help="each GPU's network between nodes, GB/s (default for an SXM/OAM part: its reference node's, "
        "GET /v1/gpus node_network_bytes_per_s; a PCIe card needs it)",
    ),
    *busbw_options,
    # a plan offloads only to memory the cluster states (recommender.space.offload_devices)
    click.option(
        "--host-gib",
        type=NUMBER,
        help="host RAM per node, GiB (default: not stated: plans offload none there)",
    ),
    click.option(
        "--nvme-gib", type=NUMBER, help="NVMe per node, GiB (default: not stated: plans offload none there)"
    ),
]


# The flag that sets each request field, so that a 422 naming the field names the flag too (``flag_of``:
# a field under one of these, an item of a list, is its flag's)
MODEL_FLAGS = {"model.preset": "--model", "model.hf_config": "--config"}
TRAINING_FLAGS = {"training.seq_len": "--seq", "training.global_batch_size": "--batch"} | {
    f"training.{name}": f"--{name.replace('_', '-')}"
    for name in ("method", "precision", "attention", "base_dtype", "tokens", "optimizer",
                 "optimizer_implementation", "lora_rank", "lora_targets", "mtp_num_layers")
}  # fmt: skip
SHAPE_FLAGS = {  # an inline cluster's fields, as --gpus and the flags describing it send them
    "gpu": "--gpus",
    "gpu.*": "--gpu-spec",  # a custom GPU's fields
    "num_nodes": "--gpus",
    "gpus_per_node": "--gpus",
    "inter_node_bandwidth_gbps": "--inter-gbps",
    "inter_node_bandwidth_bytes_per_s": "--inter-gbps",  # the API names the field it converted to
    "intra_node_bandwidth_gbps": "--intra-gbps",
    "intra_node_bandwidth_bytes_per_s": "--intra-gbps",
    "measured_intra_node_bus_bandwidth_gbps": "--intra-busbw-gbps",
    "measured_intra_node_bus_bandwidth_bytes_per_s": "--intra-busbw-gbps",
    "measured_inter_node_bus_bandwidth_gbps": "--inter-busbw-gbps",
    "measured_inter_node_bus_bandwidth_bytes_per_s": "--inter-busbw-gbps",
    "cpu_memory_bytes_per_node": "--host-gib",
    "nvme_bytes_per_node": "--nvme-gib",
}
JOB_FLAGS = MODEL_FLAGS | TRAINING_FLAGS | {f"cluster.{field}": flag for field, flag in SHAPE_FLAGS.items()}
JOB_FLAGS["cluster.id"] = "--cluster"
PLAN_FLAGS = JOB_FLAGS | {
    "constraints.objective": "--objective",
    "constraints.frameworks": "--framework",
    "constraints.top_k": "--top-k",
    "constraints.gpu_hour_cost": "--gpu-hour-cost",
    "constraints.max_gpus": "--max-gpus",
    "constraints.allow_offload": "--allow-offload",
    "constraints.min_headroom_fraction": "--min-headroom-fraction",
    "constraints.torch_compile": "--torch-compile",
    "constraints.max_evaluations": "--max-evaluations",
    "launchers": "--launcher",
}
CAPACITY_FLAGS = (
    MODEL_FLAGS
    | TRAINING_FLAGS
    | {
        "gpus": "--gpu",
        "cluster_ids": "--cluster-id",
        "gpus_per_node": "--gpus-per-node",
        "max_nodes": "--max-nodes",
        "at_gpus": "--at-gpus",
        "gpu_hour_cost": "--gpu-hour-cost",
        "constraints.frameworks": "--framework",
        "constraints.max_gpus": "--max-gpus",
        "constraints.allow_offload": "--allow-offload",
        "constraints.min_headroom_fraction": "--min-headroom-fraction",
        "constraints.torch_compile": "--torch-compile",
        "constraints.max_evaluations": "--max-evaluations",
    }
)
CLUSTER_FLAGS = SHAPE_FLAGS | {"name": "NAME", "description": "--description"}
RUN_FLAGS = {
    "step_s": "--step-s",
    "tokens_per_s": "--tokens-per-s",
    "peak_memory_bytes_per_gpu": "--peak-gib",
    "memory_statistic": "--memory-statistic",
    "gpu_utilization": "--gpu-utilization",
    "out_of_memory": "--oom",
    "framework_version": "--framework-version",
    "notes": "--notes",
}
REPORT_FLAGS = {
    "log": "LOGFILE",
    "format": "--format",
    "notes": "--notes",
    "framework_version": "--framework-version",
}


F = TypeVar("F", bound=Callable[..., Any])


def options(*groups: list[Any]) -> Callable[[F], F]:
    """Apply groups of click options shared by several commands, in order."""

    def decorate(function: F) -> F:
        for group in reversed(groups):
            for option in reversed(group):
                function = option(function)
        return function

    return decorate


@click.group(cls=TrainplanGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Plan LLM training when GPU memory is short: memory, step time and layouts, as the API computes them.

    \b
    Exit codes:
      0   fits (or the command did what it says)
      2   does not fit (plan infeasible, estimate over the card)
      3   unknown (capacity: nothing fits of what was searched, a GPU type's search cut before a fit)
      64  usage error: an unknown option, a missing or malformed value, flags missing or contradicting
      1   any other error: the API refused the request, the service cannot be reached
    """


# the search constraints plan and capacity both take (``search_constraints``)
frameworks_option = click.option(
    "--framework", "frameworks", type=choice(Framework), multiple=True, help="limit the search (repeatable)"
)
headroom_option = click.option(
    "--min-headroom-fraction",
    type=NUMBER,
    help="the share of each card a layout must leave free, 0 to the API's limit (default: the API's)",
)
compile_option = click.option(
    "--torch-compile",
    is_flag=True,
    default=None,
    help="compile fsdp layouts with torch.compile (not qlora; megatron and deepspeed stay eager)",
)
evaluations_option = click.option(
    "--max-evaluations",
    type=int,
    help="cap the layouts evaluated: where the cap cuts before the CPU time does, the answer is the "
    "same on every machine (default: the API's, cut by CPU time first)",
)


@main.command()
@options(model_options, cluster_options, job_options)
@click.option("--objective", type=choice(Objective), default="throughput", show_default=True)
@frameworks_option
@click.option(
    "--launcher",
    "launchers",
    type=choice(Target),
    multiple=True,
    help="render for these targets (repeatable)",
)
@click.option("--top-k", type=int, default=3, show_default=True)
# the rest of the API's constraints: left out, nothing is sent and the API's defaults apply
@click.option(
    "--gpu-hour-cost",
    type=NUMBER,
    help="price of a GPU-hour: each candidate's cost to train (needs --tokens); --objective cost ranks by it",
)
@click.option("--max-gpus", type=int, help="use at most this many of the cluster's GPUs (default: any count)")
@click.option(
    "--allow-offload/--no-allow-offload",
    default=None,
    help="offload to the host RAM or NVMe the cluster states (default: allowed)",
)
@headroom_option
@compile_option
@evaluations_option
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="write the launcher files here (a directory)",
)
@url_option
@json_option
def plan(
    model: str | None,
    config: Path | None,
    gpus: str | None,
    cluster: str | None,
    gpu_spec: Path | None,
    inter_gbps: float | None,
    intra_gbps: float | None,
    intra_busbw_gbps: float | None,
    inter_busbw_gbps: float | None,
    host_gib: float | None,
    nvme_gib: float | None,
    seq: int,
    batch: int,
    precision: str | None,
    attention: str | None,
    base_dtype: str | None,
    method: str,
    tokens: int | None,
    optimizer: str | None,
    optimizer_implementation: str | None,
    lora_rank: int | None,
    lora_targets: str | None,
    mtp_num_layers: int | None,
    objective: str,
    frameworks: tuple[str, ...],
    launchers: tuple[str, ...],
    top_k: int,
    gpu_hour_cost: float | None,
    max_gpus: int | None,
    allow_offload: bool | None,
    min_headroom_fraction: float | None,
    torch_compile: bool | None,
    max_evaluations: int | None,
    out: Path | None,
    url: str | None,
    as_json: bool,
) -> None:
    """Search every layout and recommend one (POST /v1/plans); --out writes its files."""
    api = Api(url, PLAN_FLAGS)
    constraints: dict[str, Any] = {"objective": objective, "top_k": top_k}
    if gpu_hour_cost is not None:
        constraints["gpu_hour_cost"] = gpu_hour_cost
    constraints |= search_constraints(
        frameworks, max_gpus, allow_offload, min_headroom_fraction, torch_compile, max_evaluations
    )
    # --out without --launcher: the files of every target that runs the recommendation, which these
    # do not constrain (each runs it, or Slurm wraps it): a Kubernetes file would (its PyTorchJob
    # wraps torchrun entry points only), so it is written where --launcher kubernetes asks for it
    everything = [target.value for target in Target if target is not Target.KUBERNETES]
    targets = list(launchers) or (everything if out is not None else [])
    params = click.get_current_context().params
    body = {
        "model": model_ref(model, config),
        "cluster": cluster_choice(api, params),
        "training": training(params),
        "constraints": constraints,
        "launchers": targets,
    }
    with console.status("searching layouts...") if not as_json else contextlib.nullcontext():
        result = api.call("POST", "/v1/plans", json=body)
    if as_json:
        emit(result, True)
    else:
        print_plan(result, asked=set(launchers))
    if out is not None:
        for path in write_artifacts(api, result, out):
            if not as_json:
                console.print(f"wrote {path}")
    sys.exit(FEASIBLE if result["status"] == "feasible" else INFEASIBLE)


@main.command()
@options(model_options, cluster_options, job_options)
@click.option("--framework", type=choice(Framework), default="deepspeed", show_default=True)
@click.option(
    "--dp", type=int, default=None, help="data-parallel degree [default: the GPUs over tp x pp x cp]"
)
@click.option("--tp", type=int, default=1, show_default=True)
@click.option("--pp", type=int, default=1, show_default=True)
@click.option("--cp", type=int, default=1, show_default=True)
@click.option(
    "--zero",
    type=click.IntRange(0, 3),
    default=None,
    help="ZeRO stage (FSDP: 3 full shard, 2 grad-op, 0 no shard); default: the framework's (fsdp 3, "
    "deepspeed and megatron 0)",
)
@click.option("--micro", type=int, default=None, help="micro-batch size; default: the service's (1)")
@click.option(
    "--recompute",
    type=choice(Recompute),
    default=None,
    help="activation recomputation; default: the service's (none)",
)
@click.option(
    "--set",
    "more",
    multiple=True,
    metavar="FIELD=VALUE",
    callback=lambda _ctx, _param, items: layout_fields(items),
    help="any other layout field of POST /v1/estimates, repeatable: --set ep=8 --set moe_a2a_overlap=true; "
    "VALUE read as JSON where it parses, else as text; the service validates it",
)
@click.option("--gpu-hour-cost", type=NUMBER, help="price of a GPU-hour: the cost to train (needs --tokens)")
@url_option
@json_option
def estimate(
    model: str | None,
    config: Path | None,
    gpus: str | None,
    cluster: str | None,
    gpu_spec: Path | None,
    inter_gbps: float | None,
    intra_gbps: float | None,
    intra_busbw_gbps: float | None,
    inter_busbw_gbps: float | None,
    host_gib: float | None,
    nvme_gib: float | None,
    seq: int,
    batch: int,
    precision: str | None,
    attention: str | None,
    base_dtype: str | None,
    method: str,
    tokens: int | None,
    optimizer: str | None,
    optimizer_implementation: str | None,
    lora_rank: int | None,
    lora_targets: str | None,
    mtp_num_layers: int | None,
    framework: str,
    dp: int | None,
    tp: int,
    pp: int,
    cp: int,
    zero: int | None,
    micro: int | None,
    recompute: str | None,
    more: dict[str, Any],
    gpu_hour_cost: float | None,
    url: str | None,
    as_json: bool,
) -> None:
    """Memory and step time of one layout (POST /v1/estimates)."""
    api = Api(url, ESTIMATE_FLAGS)
    layout: dict[str, Any] = {"framework": framework, "tp": tp, "pp": pp, "cp": cp, **more}
    # left out, the service's defaults, which its answer's resolved_defaults names as chosen (sent, the
    # answer said the user chose them, where the API's own answer to the same request did not)
    if micro is not None:
        layout["micro_batch_size"] = micro
    if recompute is not None:
        layout["recompute"] = recompute
    if zero is not None:  # left out, the framework's own (resolved_defaults says which)
        layout["zero_stage"] = zero
    if dp is not None:  # left out, the service fills the cluster with it (resolved_defaults says so)
        layout["dp"] = dp
    params = click.get_current_context().params
    body: dict[str, Any] = {
        "model": model_ref(model, config),
        "cluster": cluster_choice(api, params),
        "training": training(params),
        "layout": layout,
    }
    if gpu_hour_cost is not None:
        body["gpu_hour_cost"] = gpu_hour_cost
    result = api.call("POST", "/v1/estimates", json=body)
    emit(result, as_json)
    if not as_json:
        chosen = result.get("resolved_defaults") or {}
        if chosen:  # left out: training fields resolved for the GPU, layout switches as recipes set them
            console.print("defaults: " + defaults_text(chosen))
        print_estimate(result)
    sys.exit(FEASIBLE if result["fits"] else INFEASIBLE)


# the layout fields ``estimate`` has its own options for (--set would silently override them)
OWN_LAYOUT_OPTIONS = {
    "framework": "--framework",
    "dp": "--dp",
    "tp": "--tp",
    "pp": "--pp",
    "cp": "--cp",
    "zero_stage": "--zero",
    "micro_batch_size": "--micro",
    "recompute": "--recompute",
}
# any other layout field is --set's
ESTIMATE_FLAGS = JOB_FLAGS | {"layout.*": "--set", "gpu_hour_cost": "--gpu-hour-cost"}
ESTIMATE_FLAGS |= {f"layout.{field}": flag for field, flag in OWN_LAYOUT_OPTIONS.items()}


def search_constraints(
    frameworks: tuple[str, ...],
    max_gpus: int | None,
    allow_offload: bool | None,
    min_headroom_fraction: float | None,
    torch_compile: bool | None,
    max_evaluations: int | None,
) -> dict[str, Any]:
    """The search constraints plan and capacity both take, as the API's fields: only those given
    (left out, the API's own defaults apply, which differ: capacity does not offload)."""
    given = {
        "frameworks": list(frameworks) or None,
        "max_gpus": max_gpus,
        "allow_offload": allow_offload,
        "min_headroom_fraction": min_headroom_fraction,
        "torch_compile": torch_compile,
        "max_evaluations": max_evaluations,
    }
    return {field: value for field, value in given.items() if value is not None}


def layout_fields(items: tuple[str, ...]) -> dict[str, Any]:
    """``--set FIELD=VALUE`` items as layout fields: VALUE as JSON where it parses (8, true, null,
    [\"attention\"]), else as text (flex); a field named twice, one with its own option, or an item
    without '=' is a usage error."""
    out: dict[str, Any] = {}
    for item in items:
        field, sep, text = item.partition("=")
        if not sep or not field:
            raise click.BadParameter(f"{item!r}: give FIELD=VALUE", param_hint="--set")
        if field in OWN_LAYOUT_OPTIONS:
            raise click.BadParameter(
                f"{field} has its own option: {OWN_LAYOUT_OPTIONS[field]}", param_hint="--set"
            )
        if field in out:
            raise click.BadParameter(f"{field} given twice", param_hint="--set")
        try:
            out[field] = read_json(text)
        except ValueError as exc:
            if "finite number" in str(exc) or text.strip().lower().lstrip("+-") in ("nan", "infinity", "inf"):
                raise click.BadParameter(f"{item!r}: not a finite number", param_hint="--set") from None
            out[field] = text
    return out


@main.command()
@options(model_options, job_options)
@click.option("--gpu", "gpu_names", multiple=True, help="catalog GPUs to compare (default: all)")
@click.option(
    "--cluster-id",
    "cluster_ids",
    multiple=True,
    help="stored clusters to compare instead of GPUs (an id or a name, as --cluster takes)",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(1),
    help="node size of a catalog card (default 8; not with --cluster-id)",
)
@click.option("--max-nodes", type=click.IntRange(1), help="largest node count searched (default 1024)")
@click.option(
    "--at-gpus",
    type=click.IntRange(1),
    help="time to train on this many GPUs (default: the fewest; a stored cluster's: all of it)",
)
@click.option(
    "--gpu-hour-cost",
    "costs",
    multiple=True,
    help="price of a GPU-hour: one number for every card, or GPU=PRICE (repeatable); needs --tokens",
)
@frameworks_option
@click.option("--max-gpus", type=int, help="at most this many GPUs of each type (default: any count)")
@click.option(
    "--allow-offload/--no-allow-offload",
    default=None,
    help="offload to host RAM or NVMe (default: not: the fewest GPUs that hold the job themselves)",
)
@headroom_option
@compile_option
@evaluations_option
@url_option
@json_option
def capacity(
    model: str | None,
    config: Path | None,
    seq: int,
    batch: int,
    precision: str | None,
    attention: str | None,
    base_dtype: str | None,
    method: str,
    tokens: int | None,
    optimizer: str | None,
    optimizer_implementation: str | None,
    lora_rank: int | None,
    lora_targets: str | None,
    mtp_num_layers: int | None,
    gpu_names: tuple[str, ...],
    cluster_ids: tuple[str, ...],
    gpus_per_node: int | None,
    max_nodes: int | None,
    at_gpus: int | None,
    costs: tuple[str, ...],
    frameworks: tuple[str, ...],
    max_gpus: int | None,
    allow_offload: bool | None,
    min_headroom_fraction: float | None,
    torch_compile: bool | None,
    max_evaluations: int | None,
    url: str | None,
    as_json: bool,
) -> None:
    """GPUs each card type needs, and time to train on them (POST /v1/capacity)."""
    if allow_offload and not cluster_ids:
        raise Usage("--allow-offload needs --cluster-id: the catalog's cards state no host RAM or NVMe")
    if cluster_ids and (gpu_names or gpus_per_node is not None or max_nodes is not None):
        # the command's own rule (a stored cluster is searched on its own nodes): a usage error, as
        # estimate's --gpus with --cluster is, not the API's 422 and exit 1 (CLI review)
        flag = "--gpu" if gpu_names else "--gpus-per-node" if gpus_per_node is not None else "--max-nodes"
        raise Usage(f"{flag} sizes catalog cards; --cluster-id searches stored clusters on their own nodes")
    api = Api(url, CAPACITY_FLAGS)
    body: dict[str, Any] = {
        "model": model_ref(model, config),
        "training": training(click.get_current_context().params),
    }
    if gpus_per_node is not None:
        body["gpus_per_node"] = gpus_per_node
    if max_nodes is not None:
        body["max_nodes"] = max_nodes
    if gpu_names:
        body["gpus"] = list(gpu_names)
    if cluster_ids:
        body["cluster_ids"] = [stored_cluster_id(api, name, "--cluster-id") for name in cluster_ids]
    if at_gpus is not None:
        body["at_gpus"] = at_gpus
    if costs:
        body["gpu_hour_cost"] = gpu_hour_costs(costs)
    constraints = search_constraints(
        frameworks, max_gpus, allow_offload, min_headroom_fraction, torch_compile, max_evaluations
    )
    if constraints:
        body["constraints"] = constraints
    with console.status("sizing...") if not as_json else contextlib.nullcontext():
        result = api.call("POST", "/v1/capacity", json=body)
    if as_json:
        emit(result, True)
    else:
        print_capacity(result["options"], timed_on=at_gpus is not None)
        for warning in result.get("warnings", []):
            console.print(f"[yellow]warning:[/] {escape(warning)}")
    sys.exit(capacity_exit(result["options"]))


def capacity_exit(options: list[dict[str, Any]]) -> int:
    """0 where a GPU type fits; else 3 where a type's search was cut before a fit (fits null: unknown,
    not "does not fit", which a scheduler script reads as final), else 2."""
    if any(o["fits"] for o in options):
        return FEASIBLE
    return UNKNOWN if any(o["fits"] is None for o in options) else INFEASIBLE


def print_capacity(options: list[dict[str, Any]], timed_on: bool) -> None:
    """The options as a table, then each one's notes (the defaults chosen for its GPU, the network
    assumed, why it does not fit, a count asked for that it could not be timed on); ``timed_on``: a
    column of the GPUs each row is timed on (--at-gpus: not always its fewest)."""
    table = Listing(title="capacity", title_justify="left")
    priced = any(option.get("cost") is not None for option in options)
    # a stored cluster is timed on all of it: "min GPUs 2" beside its 16 GPUs' tokens/s read as 2's
    # (consistency review), so the column shows wherever a row was timed on more than its fewest
    timed_on = timed_on or any(
        option.get("num_gpus") not in (None, option.get("min_gpus")) for option in options
    )
    columns = ["GPU", "fits", "min GPUs", *(["timed on"] if timed_on else []), "layout", "tokens/s",
               "time to train", "GPU-hours", *(["cost"] if priced else [])]  # fmt: skip
    for column in columns:
        numeric = column in ("min GPUs", "timed on", "tokens/s", "GPU-hours", "cost")
        table.add_column(column, justify="right" if numeric else "left")
    for option in options:
        hours, cost = option.get("gpu_hours"), option.get("cost")
        # a search its share of the budget cut: a fit may exist that it did not reach, or a faster layout
        verdict = {True: "yes", False: "no", None: "unknown"}[option["fits"]]
        fits = verdict + (" (search cut)" if option.get("truncated") else "")
        row = [
            escape(option["gpu"]),
            fits,
            str(option.get("min_gpus") or "-"),
            *([str(option.get("num_gpus") or "-")] if timed_on else []),
            layout_text(option["layout"]) if option.get("layout") else "-",
            f"{option['tokens_per_s']:,.0f}" if option.get("tokens_per_s") else "-",
            seconds(option.get("time_to_train_s")),
            amount(hours) if hours is not None else "-",
            *([amount(cost) if cost is not None else "-"] if priced else []),
        ]
        table.add_row(*row)
    console.print(table)
    for option in options:
        if option.get("note"):
            where = f" (cluster {option['cluster_id']})" if option.get("cluster_id") else ""
            console.print(f"{escape(option['gpu'])}{where}: {escape(option['note'])}")


def gpu_hour_costs(items: tuple[str, ...]) -> float | dict[str, float]:
    """--gpu-hour-cost as the API takes it: one price for every card, or GPU=PRICE for each named."""
    if len(items) == 1 and "=" not in items[0]:
        return _price(items[0])
    prices: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(
                f"{item!r}: give one price, or GPU=PRICE for each", param_hint="--gpu-hour-cost"
            )
        prices[name] = _price(value)
    return prices


def _price(text: str) -> float:
    try:
        return NUMBER.convert(text, None, None)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint="--gpu-hour-cost") from None


@main.command()
@url_option
@json_option
def models(url: str | None, as_json: bool) -> None:
    """The catalog's model presets (GET /v1/models)."""
    items = all_pages(Api(url), "/v1/models")
    if as_json:
        emit(page(items), True)
        return
    table = Listing(title="models", title_justify="left")
    for column in ("name", "family", "parameters"):
        table.add_column(column, justify="right" if column == "parameters" else "left")
    for item in items:
        table.add_row(item["name"], item["family"], f"{item['parameters_total'] / 1e9:,.2f} B")
    console.print(table)


@main.command(name="gpus")
@url_option
@json_option
def gpus_command(url: str | None, as_json: bool) -> None:
    """The catalog's GPUs (GET /v1/gpus)."""
    items = all_pages(Api(url), "/v1/gpus")
    if as_json:
        emit(page(items), True)
        return
    table = Listing(title="GPUs", title_justify="left")
    for column in ("name", "memory", "bf16 TFLOP/s", "HBM TB/s", "intra-node GB/s"):
        table.add_column(column, justify="left" if column == "name" else "right")
    for item in items:
        bf16 = item["peak_flops_per_s"].get("bf16")
        clock = item.get("clock_fraction", 1.0)
        sustained = f" ({bf16 * clock / 1e12:,.0f} at its clock)" if bf16 and clock != 1.0 else ""
        table.add_row(
            item["name"],
            gib(item["memory_bytes"]),
            f"{bf16 / 1e12:,.0f}{sustained}" if bf16 else "-",
            f"{item['hbm_bandwidth_bytes_per_s'] / 1e12:,.2f}",
            f"{item['intra_node_bandwidth_bytes_per_s'] / 1e9:,.0f}",
        )
    console.print(table)


def page(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A listing's --json: the API's page shape, with every item (the CLI reads every page)."""
    return {"items": items, "next_cursor": None}


def all_pages(api: Api, path: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = api.call(
            "GET", path, params={**(params or {}), "limit": 200, **({"cursor": cursor} if cursor else {})}
        )
        if isinstance(page, list):
            return page
        items += page["items"]
        cursor = page.get("next_cursor")
        if not cursor:
            return items


@main.group()
def clusters() -> None:
    """Stored cluster inventories (/v1/clusters)."""


@clusters.command(name="list")
@url_option
@json_option
def clusters_list(url: str | None, as_json: bool) -> None:
    items = all_pages(Api(url), "/v1/clusters")
    if as_json:
        emit(page(items), True)
        return
    table = Listing(title="clusters", title_justify="left")
    for column in ("name", "id", "GPU", "nodes", "GPUs per node"):
        table.add_column(column)
    for item in items:
        gpu = item["gpu"] if isinstance(item["gpu"], str) else item["gpu"].get("name")
        table.add_row(
            escape(item["name"]),
            item["id"],
            escape(str(gpu)),
            str(item["num_nodes"]),
            str(item["gpus_per_node"]),
        )
    console.print(table)


@clusters.command(name="add")
@click.argument("name")
@click.option("--gpus", required=True, help="COUNTxGPU or NODESxPER_NODExGPU")
@click.option(
    "--gpu-spec",
    type=click.Path(dir_okay=False, path_type=Path),
    help="a GPU the catalog does not know: a JSON file of its spec (the body's gpu), which --gpus names",
)
@click.option("--inter-gbps", type=NUMBER, help="each GPU's network between nodes, GB/s")
@options(busbw_options)
@click.option("--host-gib", type=NUMBER, help="host RAM per node, GiB (default: not stated)")
@click.option("--nvme-gib", type=NUMBER, help="NVMe per node, GiB (default: not stated)")
@click.option("--description", default="")
@url_option
@json_option
def clusters_add(
    name: str,
    gpus: str,
    gpu_spec: Path | None,
    inter_gbps: float | None,
    intra_gbps: float | None,
    intra_busbw_gbps: float | None,
    inter_busbw_gbps: float | None,
    host_gib: float | None,
    nvme_gib: float | None,
    description: str,
    url: str | None,
    as_json: bool,
) -> None:
    shape = cluster_from_gpus(
        gpus,
        inter_gbps,
        intra_gbps=intra_gbps,
        intra_busbw_gbps=intra_busbw_gbps,
        inter_busbw_gbps=inter_busbw_gbps,
        host_gib=host_gib,
        nvme_gib=nvme_gib,
        gpu_spec=gpu_spec,
    )
    body = {"name": name, "description": description, **shape}
    stored = Api(url, CLUSTER_FLAGS).call("POST", "/v1/clusters", json=body)
    emit(stored, as_json)
    if not as_json:
        console.print(
            f"stored cluster {escape(stored['name'])} ({stored['id']}): {stored['world_size']} GPUs"
        )


@clusters.command(name="delete")
@click.argument("name_or_id")
@url_option
def clusters_delete(name_or_id: str, url: str | None) -> None:
    api = Api(url)
    cluster_id = stored_cluster_id(api, name_or_id)
    api.call("DELETE", f"/v1/clusters/{cluster_id}")
    console.print(f"deleted cluster {cluster_id}")


# A scheduler that retries a report would store the run twice, and calibration would count it twice:
# the API's Idempotency-Key makes a retry replay the first.
idempotency_option = click.option(
    "--idempotency-key",
    default=None,
    help="the API's Idempotency-Key: a retry with the same key stores the run once",
)


def _keyed(key: str | None) -> dict[str, str]:
    return {"Idempotency-Key": key} if key else {}


@main.group()
def runs() -> None:
    """Observed runs of a plan: they calibrate later estimates on the same hardware."""


@runs.command(name="add")
@click.argument("plan_id")
@click.option("--step-s", type=NUMBER, help="measured seconds per optimizer step")
@click.option("--tokens-per-s", type=NUMBER, help="measured tokens per second, all GPUs")
@click.option(
    "--peak-gib", type=NUMBER, help="peak memory per GPU, GiB (max over ranks); see --memory-statistic"
)
@click.option(
    "--memory-statistic",
    type=choice(MemoryStatistic),
    help="which statistic --peak-gib is: allocated (torch.cuda.max_memory_allocated), reserved "
    "(max_memory_reserved) or device_used (nvidia-smi); left out, the service takes device_used",
)
@click.option("--oom", is_flag=True, help="the run ran out of memory")
@click.option("--gpu-utilization", type=NUMBER, help="measured GPU utilization, a fraction (0.85)")
@click.option("--framework-version", help="the framework's version, e.g. megatron-core 0.9.0")
@click.option("--notes", default="")
@idempotency_option
@url_option
@json_option
def runs_add(
    plan_id: str,
    step_s: float | None,
    tokens_per_s: float | None,
    peak_gib: float | None,
    memory_statistic: str | None,
    oom: bool,
    gpu_utilization: float | None,
    framework_version: str | None,
    notes: str,
    idempotency_key: str | None,
    url: str | None,
    as_json: bool,
) -> None:
    # what the API would refuse as contradicting is a usage error here (exit 64), as for other flags
    if step_s is not None and tokens_per_s is not None:
        raise Usage("give --step-s or --tokens-per-s, not both (one is the other over the step's tokens)")
    if memory_statistic is not None and peak_gib is None:
        raise Usage("--memory-statistic says which statistic --peak-gib is: give --peak-gib")
    if step_s is None and tokens_per_s is None and peak_gib is None and not oom:
        # the API's 422 named its body fields and exited 1 (CLI review)
        raise Usage("a run needs a figure: give --step-s or --tokens-per-s, --peak-gib, or --oom")
    body: dict[str, Any] = {"out_of_memory": oom, "notes": notes}
    if gpu_utilization is not None:
        body["gpu_utilization"] = gpu_utilization
    if framework_version is not None:
        body["framework_version"] = framework_version
    if step_s is not None:
        body["step_s"] = step_s
    if tokens_per_s is not None:
        body["tokens_per_s"] = tokens_per_s
    if peak_gib is not None:
        body["peak_memory_bytes_per_gpu"] = gib_bytes(peak_gib, "--peak-gib")
    if memory_statistic is not None:
        body["memory_statistic"] = memory_statistic
    api = Api(url, RUN_FLAGS)
    run = api.call("POST", f"/v1/plans/{plan_id}/runs", json=body, headers=_keyed(idempotency_key))
    emit(run, as_json)
    if not as_json:
        console.print(f"stored run {run['id']} of plan {plan_id}")
        diagnosis = run.get("diagnosis", {})
        if run.get("peak_memory_bytes_per_gpu") is not None and diagnosis.get("memory_statistic"):
            assumed = " (--memory-statistic not given)" if diagnosis.get("memory_statistic_assumed") else ""
            console.print(f"peak compared as {diagnosis['memory_statistic']}{assumed}")
        print_diagnosis(run.get("diagnosis") or {})  # in words, as `report` prints it (CLI review)
        calibration = run.get("calibration") or {}
        factors = calibration.get("factors") or {}
        if factors:
            step, memory = factors.get("step_time", 1.0), factors.get("memory_dynamic", 1.0)
            console.print(
                f"later estimates on this hardware and framework: step time x{step:.3g}, activation "
                f"memory x{memory:.3g} (from {calibration.get('runs', 0)} run(s))"
            )


LOG_FORMATS = ("auto", "megatron", "torchtitan", "deepspeed", "hf_trainer", "accelerate")
# The service's body limit is 1 MiB (PLANNER_MAX_BODY_BYTES) and JSON escapes grow a log's text: a
# longer log is sent as its head (start-up, the memory report Megatron-LM prints once) and its tail.
LOG_BODY_BYTES = 1_000_000
LOG_HEAD_CHARS = 150_000


def log_excerpt(text: str) -> tuple[str, bool]:
    """The log as sent: whole when it fits the body limit, else its head and tail cut at lines."""
    if len(json.dumps(text).encode()) <= LOG_BODY_BYTES:
        return text, False
    head = text[:LOG_HEAD_CHARS].rsplit("\n", 1)[0]
    tail_chars = LOG_BODY_BYTES // 2
    while True:
        tail = text[-tail_chars:].split("\n", 1)[-1]
        excerpt = head + "\n" + tail
        if len(json.dumps(excerpt).encode()) <= LOG_BODY_BYTES or tail_chars < 10_000:
            return excerpt, True
        tail_chars //= 2


@main.command()
@click.argument("plan_id")
@click.argument("logfile", type=click.File("r", encoding="utf-8", errors="replace"))
@click.option(
    "--format",
    "log_format",
    type=click.Choice(LOG_FORMATS),
    default="auto",
    show_default=True,
    help="the framework that printed the log",
)
@click.option("--notes", default="", help="kept with the run")
@click.option("--framework-version", help="the framework's version, e.g. megatron-core 0.9.0")
@idempotency_option
@url_option
@json_option
def report(
    plan_id: str,
    logfile: Any,
    log_format: str,
    notes: str,
    framework_version: str | None,
    idempotency_key: str | None,
    url: str | None,
    as_json: bool,
) -> None:
    """Post a training log (LOGFILE, or - for stdin) as a run of PLAN_ID: prints what was read
    from which lines, and the diagnosis."""
    text, cut = log_excerpt(logfile.read())
    if not text.strip():
        raise Usage(f"{logfile.name}: the log is empty")
    body: dict[str, Any] = {"log": text, "format": log_format, "notes": notes}
    if framework_version is not None:
        body["framework_version"] = framework_version
    run = Api(url, REPORT_FLAGS).call(
        "POST", f"/v1/plans/{plan_id}/runs", json=body, headers=_keyed(idempotency_key)
    )
    emit(run, as_json)
    if as_json:
        return
    source = run.get("source") or {}
    sent = ", its head and tail: the whole log is over 1 MB" if cut else ""
    console.print(
        f"stored run {run['id']} of plan {plan_id}, read as a {source.get('format', '?')} log "
        f"({source.get('lines', '?')} lines{sent})"
    )
    for figure in source.get("figures", []):
        console.print(f"  {figure['name']} = {_figure_text(figure)}: {escape(figure['how'])}")
    oom = source.get("out_of_memory")
    if oom:
        quoted = ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in oom.items() if k.endswith("_bytes"))
        console.print(f"  out of memory at line {oom['line']} (GPU {oom.get('gpu')}): {quoted}")
    for note in [*source.get("conversions", []), *source.get("notes", [])]:
        console.print(f"  - {escape(note)}")
    print_diagnosis(run.get("diagnosis", {}))


def print_diagnosis(diagnosis: Mapping[str, Any]) -> None:
    """A stored run's diagnosis in words (``report`` and ``runs add``): whether it was set aside and
    why, its step time and memory against the estimate, and the advice."""
    if diagnosis.get("implausible"):
        console.print("set aside (moves no calibration factor):")
        for reason in diagnosis.get("implausible_reasons", []):
            console.print(f"  - {escape(reason)}")
    statistic = f" ({diagnosis['memory_statistic']})" if diagnosis.get("memory_statistic") else ""
    for key, label in (
        ("step_time_error", "step time vs estimate"),
        ("memory_error", f"memory vs estimate{statistic}"),
    ):
        if diagnosis.get(key) is not None:
            console.print(f"{label}: {diagnosis[key]:+.1%}")
    reasons = diagnosis.get("implausible_reasons", [])
    for advice in diagnosis.get("advice", []):
        if not any(advice.startswith(reason) for reason in reasons):  # said once, above
            console.print(f"  - {escape(advice)}")


def _figure_text(figure: dict[str, Any]) -> str:
    value = figure["value"]
    if figure["unit"] == "bytes":
        return f"{value / GIB:.2f} GiB ({figure.get('statistic')})"
    if figure["unit"] == "fraction":
        return f"{value:.1%}"
    return f"{value:,.4g} {figure['unit']}"


@main.group()
def keys() -> None:
    """API keys (PLANNER_REQUIRE_AUTH=true). Without --url: straight on the local database
    (PLANNER_DATABASE_URL), which is how the first admin key is made; with --url: through
    /v1/api-keys, with an admin key in TRAINPLAN_API_KEY. These commands do not read TRAINPLAN_URL."""


# Not TRAINPLAN_URL: with it exported for the other commands, `keys create` went over HTTP, where a
# service without keys yet answers 403 (the first admin key is made on the database): only a --url
# given on the command line means the service.
keys_url_option = click.option(
    "--url",
    help="a running service, through /v1/api-keys with an admin key in TRAINPLAN_API_KEY (default: the "
    "local database; TRAINPLAN_URL is not read)",
)


def _key_row(record: Any) -> dict[str, Any]:
    from service.api.api_keys import to_out

    return to_out(record).model_dump(mode="json")


@contextlib.contextmanager
def _local_session() -> Any:
    from sqlalchemy.orm import Session

    from service.persistence.db import make_engine
    from service.settings import get_settings

    url = get_settings().database_url
    migrate(url)
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            yield session
            session.commit()
    finally:
        engine.dispose()


@keys.command(name="create")
@click.argument("owner")
@click.option("--name", default="", help="what uses the key, for people reading the list")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    type=click.Choice(["read", "write", "admin"]),
    help="repeat for several (default: read and write)",
)
@keys_url_option
@json_option
def keys_create(owner: str, name: str, scopes: tuple[str, ...], url: str | None, as_json: bool) -> None:
    """Create a key for OWNER; its secret is printed once and never stored."""
    from pydantic import ValidationError

    from service.contracts.api_keys import ApiKeyCreate

    fields = {"owner": owner, "name": name} | ({"scopes": list(scopes)} if scopes else {})
    try:
        body = ApiKeyCreate.model_validate(fields).model_dump()
    except ValidationError as exc:
        first = exc.errors()[0]
        raise Failure(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from exc
    if url:
        created = Api(url).call("POST", "/v1/api-keys", json=body)
    else:
        from service.planning import api_keys

        with _local_session() as session:
            record, secret = api_keys.create_key(session, **body)
            created = _key_row(record) | {"secret": secret}
    emit(created, as_json)
    if not as_json:
        console.print(
            f"API key {created['id']} for {escape(created['owner'])}, scopes {', '.join(created['scopes'])}"
        )
        console.print(f"secret (shown once; send as 'Authorization: Bearer ...'): {created['secret']}")


@keys.command(name="list")
@click.option("--owner", help="only this owner's keys")
@keys_url_option
@json_option
def keys_list(owner: str | None, url: str | None, as_json: bool) -> None:
    if url:
        items = all_pages(Api(url), "/v1/api-keys", {"owner": owner} if owner else {})
    else:
        from service.planning import api_keys

        items, cursor = [], None
        with _local_session() as session:
            while True:
                rows, cursor = api_keys.list_keys(session, owner, limit=200, cursor=cursor)
                items += [_key_row(r) for r in rows]
                if cursor is None:
                    break
    if as_json:
        emit(page(items), True)
        return
    table = Listing(title="API keys", title_justify="left")
    for column in ("id", "owner", "name", "scopes", "created", "revoked"):
        table.add_column(column)
    for item in items:
        table.add_row(
            item["id"],
            escape(item["owner"]),
            escape(item["name"]),
            ", ".join(item["scopes"]),
            item["created_at"],
            item["revoked_at"] or "",
        )
    console.print(table)


@keys.command(name="revoke")
@click.argument("key_id")
@keys_url_option
def keys_revoke(key_id: str, url: str | None) -> None:
    """Revoke a key: refused from the next request on."""
    if url:
        Api(url).call("DELETE", f"/v1/api-keys/{key_id}")
    else:
        from service.errors import ServiceError
        from service.planning import api_keys

        with _local_session() as session:
            try:
                api_keys.revoke_key(session, key_id)
            except ServiceError as exc:
                raise Failure(exc.detail) from exc
    console.print(f"revoked API key {key_id}")


@main.command()
def openapi() -> None:
    """Print the service's OpenAPI document."""
    from service.main import create_app

    click.echo(json.dumps(create_app().openapi(), indent=2))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
def serve(host: str, port: int) -> None:
    """Migrate the database (PLANNER_DATABASE_URL) and serve the API."""
    import uvicorn

    from service.persistence.schema import migrate_unless_newer
    from service.settings import get_settings

    with database_reached():  # as the image and `make serve` start: a later release's database stays
        said = migrate_unless_newer(get_settings().database_url)
    errors.print(f"trainplan: {escape(said)}")
    uvicorn.run("service.main:create_app", factory=True, host=host, port=port)


if __name__ == "__main__":  # pragma: no cover
    main()
