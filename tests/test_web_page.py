"""The page at `/`, in a real browser: Debian's Chromium driven headless by Playwright, against the
service on a loopback port. Submits a plan and checks the memory chart and its table, the rationale,
the launcher targets and the download links with their previews, and that focus moves to the result;
a log pasted as a run is read and calibrates the next plan; host RAM makes an offload plan; LoRA's
fields; an API error appears next to the field it names; the forms' options and limits come from the
OpenAPI document, and without it the page still plans; the screenshot goes to docs/ for the README.

Skips without Chromium or Playwright (`make test` on a bare machine); `.ci/run` installs both and runs
it with skips turned into failures (`make browser-test`)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import loopback
from tests.custom_gpus import H20

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with loopback.served(f"sqlite:///{tmp_path_factory.mktemp('web') / 'web.db'}") as url:
        yield url


def test_the_page_and_its_assets_are_served_without_a_cdn(served: str) -> None:
    page = httpx.get(f"{served}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "http" not in page.text.replace("http://www.w3.org", "")  # nothing fetched from elsewhere
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        asset = httpx.get(f"{served}/ui/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
    assert httpx.get(f"{served}/ui/..%2Fservice%2Fmain.py").status_code == 404
    assert httpx.get(f"{served}/ui/index.html").status_code == 404


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def new_plan(page: Any, served: str, **fields: str) -> None:
    """The new-plan form with ``fields`` (input id: value; selects by their value), submitted; waits
    for the answer."""
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    for name, value in fields.items():
        selector = "#" + name.replace(".", "\\.")
        if page.evaluate("(s) => document.querySelector(s).tagName", selector) == "SELECT":
            page.select_option(selector, value)
        else:
            page.fill(selector, value)
    page.click("#submit")
    page.wait_for_selector("#result .status", timeout=60_000)


def page_number(x: float) -> str:
    """A number as the page's fmt.num shows it: an integer whole, with thousands separators; else
    four significant digits."""
    return f"{int(x):,}" if float(x).is_integer() else f"{float(f'{x:.4g}'):,g}"


def cells(page: Any, table: str) -> list[list[str]]:
    """The body cells of the first ``table``, row by row, as the page shows them."""
    rows = page.locator(table).first.locator("tbody tr")
    return [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]


def test_a_plan_in_the_browser(served: str, browser: Any, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    new_plan(
        page,
        served,
        **{
            "model.preset": "llama-3.1-8b",
            "cluster.gpu": "h100-sxm-80gb",
            "training.seq_len": "8192",
            "training.global_batch_size": "128",
        },
    )
    assert "Feasible" in page.inner_text("#result .status")
    # focus moved to the answer, a region with a name (keyboard and screen-reader users land on it)
    assert page.evaluate("document.activeElement.id") == "result"
    assert page.get_attribute("#result", "aria-label") == "Plan result"
    assert "Not calibrated" in page.inner_text("#result .calibration h4")
    # the memory chart: a stacked bar per layout, components as segments, the card's capacity marked
    segments = page.locator("#result svg.memory-chart rect.segment")
    assert segments.count() >= 4
    assert page.locator("#result svg.memory-chart line.capacity").count() == 1
    # the chart's numbers as a table: a row per bar, the totals the bars are labelled with
    bars = page.locator("#result svg.memory-chart").first.locator("text.value")
    totals = [bars.nth(i).text_content() for i in range(bars.count() - 1)]  # the last: the card
    rows = cells(page, "#result table.memory-table")
    assert len(rows) == len(totals) >= 1
    headers = page.locator("#result table.memory-table").first.locator("th").all_inner_texts()
    assert headers[:2] == ["layout", "parameters"]
    # the three statistics after the components, the fit's last: the figure each bar is labelled with
    statistics = ["peak allocated", "peak reserved", "device used (fit)"]
    assert headers[-4:-1] == statistics and headers.index("nccl buffers") < headers.index("peak allocated")
    assert [row[headers.index("device used (fit)")] for row in rows] == totals
    assert "device used (as nvidia-smi shows it" in page.inner_text("#result p.memory-statistics")
    assert rows[0][0].startswith("★ ")
    assert page.locator("#result svg.time-chart rect.segment").count() >= 1
    assert page.locator("#result ul.rationale li").count() >= 3
    links = page.locator("#result ul.artifacts a")
    assert links.count() >= 2
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    for href in hrefs:
        assert httpx.get(f"{served}{href}").status_code == 200
    assert any(h.endswith("artifacts.zip") for h in hrefs)
    # every requested target says whether it renders the layout, and why not where it cannot
    plan = httpx.get(f"{served}/v1/plans/{page.inner_text('#result .status a')}").json()
    targets = {row[0]: row for row in cells(page, "#result table.targets-table")}
    assert set(targets) == set(plan["request"]["launchers"])
    for target, why in plan["unsupported_targets"].items():
        assert targets[target][1:] == ["no", why]
    assert {a["target"] for a in plan["artifacts"]} <= {t for t, row in targets.items() if row[1] == "yes"}
    assert "render it" in page.inner_text("#launchers-note")
    # a file opens in a preview: its text, as the download gives it
    page.locator("#result ul.artifacts button").first.click()
    page.wait_for_function("document.querySelector('#result .preview pre')?.textContent.length > 20")
    first = plan["artifacts"][0]
    assert page.text_content("#result .preview pre") == httpx.get(f"{served}{first['url']}").text
    assert first["name"] in page.inner_text("#result .preview h5")
    # TRAINPLAN_SCREENSHOT=docs/page.png refreshes the README's picture; otherwise a scratch file
    shot = Path(os.environ.get("TRAINPLAN_SCREENSHOT") or tmp_path / "page.png")
    page.screenshot(path=str(ROOT / shot if not shot.is_absolute() else shot), full_page=True)
    # the plan is in the history and has its own page with a run form
    page.goto(f"{served}/#/plans")
    page.wait_for_selector("#plans-table tbody tr a")
    # each stored plan says which cluster it is for (the history had no GPU: page review)
    header = page.locator("#plans-table th").all_inner_texts()
    shown = {row[0]: row for row in cells(page, "#plans-table")}
    assert any(row[header.index("Cluster")] == "8 × h100-sxm-80gb" for row in shown.values())
    page.click("#plans-table tbody tr a")
    page.wait_for_selector("#plan-detail .status")
    page.check("input[name=run-source][value=typed]")
    # a statistic without a peak: the service's error next to the select
    page.select_option("#run\\.memory_statistic", "allocated")
    page.click("#run-form button[type=submit]")
    page.wait_for_selector("#run\\.memory_statistic + .field-error")
    assert "give that peak" in page.inner_text("#run\\.memory_statistic + .field-error")
    # the select offers the document's statistics after the page's own empty option
    offered = page.eval_on_selector_all("#run\\.memory_statistic option", "os => os.map((o) => o.value)")
    assert offered == ["", "allocated", "reserved", "device_used"]
    page.fill("#run\\.step_s", "15.2")
    page.fill("#run\\.peak_memory_gib", "60")
    page.click("#run-form button[type=submit]")
    page.wait_for_selector("#run-result table.diagnosis")
    assert "peak memory per GPU (allocated)" in page.inner_text("#run-result table.diagnosis")
    assert "(allocated)" in page.inner_text("#runs table")
    # a run typed as tokens/s alone shows them (the step column alone showed "-": page review)
    page.check("input[name=run-source][value=typed]")
    page.fill("#run\\.step_s", "")
    page.fill("#run\\.peak_memory_gib", "")
    page.select_option("#run\\.memory_statistic", "")
    page.fill("#run\\.tokens_per_s", "75000")
    page.click("#run-form button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#runs table tbody tr').length === 2")
    header = page.locator("#runs table").first.locator("th").all_inner_texts()
    assert "75,000" in [row[header.index("tokens/s")] for row in cells(page, "#runs table")]
    page.close()


def megatron_log(step_s: float, peak_bytes: int, global_batch: int) -> str:
    """Megatron-LM's iteration and memory-report lines for a run whose steady steps take about
    ``step_s`` and whose largest max-reserved reading is ``peak_bytes`` (a warm-up step first)."""
    lines = [
        "[rank0]:training ...",
        "[rank0]:[before the start of training step] datetime: 2025-03-14 10:02:12",
    ]
    # iteration 10 averages from iteration 1 (Megatron's timer): warm-up too; the steady median is step_s
    for iteration, scale in ((1, 2.0), (10, 1.3), (20, 1.001), (30, 1.0), (40, 1.0), (50, 0.999)):
        lines.append(
            f"[rank7]: [2025-03-14 10:{iteration:02d}:31.118274] iteration {iteration:>8}/     500 | "
            f"consumed samples: {iteration * global_batch:>12} | elapsed time per iteration (ms): "
            f"{step_s * scale * 1000:.1f} | throughput per GPU (TFLOP/s/GPU): 400.0 | learning rate: "
            f"1.500000E-06 | global batch size: {global_batch:>5} | lm loss: 1.012381E+01 | "
            "loss scale: 1.0 | "
            "grad norm: 5.112 | number of skipped iterations:   0 | number of nan iterations:   0 |"
        )
        if iteration == 10:
            mb = peak_bytes / 2**20
            lines.append(
                f"[rank0]:[Rank 0] (after 10 iterations) memory (MB) | allocated: {mb * 0.6:.2f} | "
                f"max allocated: {mb * 0.95:.2f} | reserved: {mb:.2f} | max reserved: {mb:.2f}"
            )
    return "\n".join(lines)


def test_a_log_pasted_as_a_run_calibrates_the_next_plan(browser: Any, tmp_path: Path) -> None:
    """A fresh service (no run on the H100 yet): the plan says it is not calibrated; a Megatron-LM
    log 10% slower than its estimate, pasted on the plan's page, is read (format, figures, lines)
    and diagnosed; planned again, the plan is calibrated by that run, the factor applied and the
    figure without it shown next to the calibrated one."""
    with loopback.served(f"sqlite:///{tmp_path / 'runs.db'}") as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        new_plan(
            page,
            base,
            **{
                "model.preset": "llama-3.1-8b",
                "cluster.gpu": "h100-sxm-80gb",
                "training.seq_len": "8192",
                "training.global_batch_size": "128",
            },
        )
        assert "not calibrated" in page.inner_text("#result .status")
        assert "Not calibrated" in page.inner_text("#result .calibration h4")
        plan_id = page.inner_text("#result .status a")
        estimate = httpx.get(f"{base}/v1/plans/{plan_id}").json()["recommended"]["estimate"]
        step = estimate["time"]["step_s"] * 1.1
        log = megatron_log(step, int(estimate["memory"]["per_gpu"]["total"] * 1.02), 128)
        page.click("#result .status a")
        page.wait_for_selector("#plan-detail .status")
        assert page.is_visible("#run\\.log") and not page.is_visible("#run\\.step_s")  # a log by default
        page.fill("#run\\.log", log)
        page.select_option("#run\\.format", "auto")
        page.click("#run-form button[type=submit]")
        page.wait_for_selector("#run-result h4")
        assert page.evaluate("document.activeElement.id") == "run-result"
        assert "Read as a megatron log" in page.inner_text("#run-result .run-read")
        assert "max_reserved" in page.inner_text("#run-result .run-read")
        read = {row[0]: row for row in cells(page, "#run-result table.source-figures")}
        assert read["step_s"][1] == f"{step:.3f} s" and "median" in read["step_s"][2]
        # other figures as the CLI prints them: four figures with separators, a fraction as a percentage
        # ("6639.500 tokens/s" and "0.389 fraction": a surfaces review)
        assert page.evaluate("figureText({value: 6639.5, unit: 'tokens/s'})") == "6,640 tokens/s"
        assert page.evaluate("figureText({value: 0.3891, unit: 'fraction'})") == "38.9%"
        assert "Counted" in page.inner_text("#run-result .diagnosis-verdict")
        assert "+10.0%" in page.inner_text("#run-result table.diagnosis")
        assert "megatron log" in page.inner_text("#runs table")
        # planned again: calibrated by the run, with the factor and the figure without it
        page.click("text=Plan it again with the runs recorded")
        page.wait_for_function(
            f"location.hash.startsWith('#/plans/') && !location.hash.endsWith('{plan_id}')"
        )
        # the new plan's own block: the page clears the old plan's ("Not calibrated") when it routes
        page.wait_for_function(
            "document.getElementById('plan-title').textContent === `Plan ${location.hash.split('/').pop()}`"
            " && document.querySelector('#plan-detail .calibration h4') !== null"
        )
        assert "Calibrated by 1 observed run" in page.inner_text("#plan-detail .calibration h4")
        assert "1 gave a step time" in page.inner_text("#plan-detail .calibration-runs")
        factors = {row[0]: row[1] for row in cells(page, "#plan-detail table.factors")}
        assert factors["step_time"] == "×1.100"
        figures = {row[0]: row[1:] for row in cells(page, "#plan-detail table.uncalibrated")}
        calibrated, uncalibrated = (float(x.removesuffix(" s")) for x in figures["step time"])
        assert calibrated == pytest.approx(uncalibrated * 1.1, rel=1e-3)
        # the figures without calibration are the API's, and the run behind the factor is named
        again = httpx.get(f"{base}/v1/plans/{page.evaluate('location.hash').split('/')[-1]}").json()
        quoted = again["recommended"]["estimate"]["calibration"]
        assert figures["step time"][1] == f"{quoted['uncalibrated']['step_s']:.3f} s"
        runs = httpx.get(f"{base}/v1/plans/{plan_id}/runs").json()["items"]
        evidence = cells(page, "#plan-detail table.evidence-runs")
        assert [row[0] for row in evidence] == [runs[0]["id"]] and evidence[0][2] == "1.000"
        assert "step_time_hardware" in evidence[0][3]
        assert page.get_attribute("#plan-detail table.evidence-runs a", "href") == f"#/plans/{plan_id}"
        assert "step ×1.100" in page.inner_text("#plan-detail .status")
        page.close()


def test_host_ram_per_node_makes_an_offload_plan(served: str, browser: Any) -> None:
    """Llama-3.1-8B full fine-tuning on one H100: infeasible on the card alone with no host RAM
    stated; with 512 GiB of host RAM per node (sent in bytes) the plan offloads the optimizer."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    job = {
        "model.preset": "llama-3.1-8b",
        "cluster.gpu": "h100-sxm-80gb",
        "cluster.gpus_per_node": "1",
        "training.seq_len": "4096",
        "training.global_batch_size": "64",
        "training.method": "full",
    }
    new_plan(page, served, **job)
    assert "Infeasible" in page.inner_text("#result .status")
    assert "host RAM" in page.inner_text("#result ul.suggestions")
    new_plan(
        page, served, **job, **{"cluster.cpu_memory_gib_per_node": "512", "cluster.nvme_gib_per_node": "0"}
    )
    assert "Feasible" in page.inner_text("#result .status")
    assert "offload_optimizer=cpu" in page.inner_text("#result h3")
    plan = httpx.get(f"{served}/v1/plans/{page.inner_text('#result .status a')}").json()
    assert plan["request"]["cluster"]["cpu_memory_bytes_per_node"] == 512 * 2**30
    # the memory table reads as the API's numbers
    header = page.locator("#result table.memory-table").first.locator("th").all_inner_texts()
    first = cells(page, "#result table.memory-table")[0]
    per_gpu = plan["recommended"]["estimate"]["memory"]["per_gpu"]
    assert first[header.index("device used (fit)")] == f"{per_gpu['total'] / 2**30:.1f} GiB"
    assert first[header.index("peak reserved")] == f"{per_gpu['peak_reserved_bytes'] / 2**30:.1f} GiB"
    assert first[header.index("optimizer states")] == f"{per_gpu['optimizer_states'] / 2**30:.1f} GiB"
    # the host RAM the offload needs, per node, as the API states it (the page showed none: review)
    host = plan["recommended"]["estimate"]["memory"]["cpu_per_node_bytes"]
    assert f"host RAM {host / 2**30:.1f} GiB per node" in page.inner_text("#result .host-needs")
    # the headroom and the limits, as the CLI says them (a change review: the page had neither)
    estimate = plan["recommended"]["estimate"]
    said = page.inner_text("#result .headroom")
    assert f"Headroom {estimate['memory']['headroom_bytes'] / 2**30:.1f} GiB of" in said, said
    micro = estimate["limits"]["max_micro_batch_size"]
    assert micro is None or f"micro-batch up to {micro:,}" in said or "no micro-batch" in said, said
    page.close()


def test_lora_rank_and_targets_appear_for_lora(served: str, browser: Any) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    assert not page.is_visible("#training\\.lora_rank")
    page.select_option("#training\\.method", "lora")
    assert page.is_visible("#training\\.lora_rank") and page.is_visible("#training\\.lora_targets")
    page.fill("#training\\.lora_rank", "64")
    for module in ("gate_proj", "up_proj", "down_proj"):
        page.uncheck(f"input[name=lora-target][value={module}]")
    page.click("#submit")
    page.wait_for_selector("#result .status", timeout=60_000)
    plan = httpx.get(f"{served}/v1/plans/{page.inner_text('#result .status a')}").json()
    training = plan["request"]["training"]
    assert (training["method"], training["lora_rank"]) == ("lora", 64)
    assert training["lora_targets"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    page.select_option("#training\\.method", "full")
    assert not page.is_visible("#training\\.lora_rank")
    page.close()


def test_a_v100_job_on_the_page_names_its_defaults_and_draws_the_closest_layout(
    served: str, browser: Any
) -> None:
    """Llama-2-13B on 4 x V100 32GB, precision and attention left to the GPU: the page plans it
    (fp16 and SDPA, named), and, infeasible on the cards alone, draws how far the closest layout is
    from fitting and lists what would make it fit, none of it failing the plan."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    page.select_option("#model\\.preset", "llama-2-13b")
    page.select_option("#cluster\\.gpu", "v100-sxm2-32gb")
    page.fill("#cluster\\.gpus_per_node", "4")
    page.fill("#training\\.seq_len", "2048")
    page.fill("#training\\.global_batch_size", "32")
    assert page.input_value("#training\\.precision") == "" and page.input_value("#training\\.attention") == ""
    page.click("#submit")
    page.wait_for_selector("#result .status", timeout=60_000)
    assert "Infeasible" in page.inner_text("#result .status")
    assert "training.precision fp16" in page.inner_text("#result .defaults")
    assert "training.attention sdpa" in page.inner_text("#result .defaults")
    assert page.locator("#result svg.memory-chart rect.segment").count() >= 3  # the closest layout's bar
    assert "Closest layout" in page.inner_text("#result")
    # the API's detail, which says of which figure the miss is (a surfaces review: not shown)
    plan = httpx.get(f"{served}/v1/plans/{page.inner_text('#result .status a')}").json()
    assert page.inner_text("#result .closest-detail") == plan["closest"]["detail"]
    assert page.locator("#result ul.suggestions li").count() >= 1
    page.close()


def options(page: Any, select: str) -> list[tuple[str, str, bool]]:
    """Each option of ``select``: its value, its text and whether it is selected."""
    return [
        tuple(o)
        for o in page.eval_on_selector_all(
            f"{select} option", "(os) => os.map((o) => [o.value, o.textContent, o.selected])"
        )
    ]


def test_the_forms_read_their_fields_from_the_openapi_document(served: str, browser: Any) -> None:
    schemas = httpx.get(f"{served}/openapi.json").json()["components"]["schemas"]
    page = browser.new_page()
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    # precision may be left to the GPU: the page's empty option, then exactly the API's values
    precision = options(page, "#training\\.precision")
    assert [value for value, _, _ in precision] == ["", *schemas["Precision"]["enum"]]
    assert precision[0][1:] == ("from the GPU", True)
    assert [o[0] for o in options(page, "#training\\.method")] == schemas["Method"]["enum"]
    assert page.input_value("#training\\.method") == schemas["TrainingIn"]["properties"]["method"]["default"]
    objective = options(page, "#constraints\\.objective")
    assert [o[0] for o in objective] == schemas["Objective"]["enum"]
    assert ("time_to_train", "time to train", False) in objective  # the page's words for a value
    assert page.input_value("#constraints\\.objective") == "throughput"  # the API's default
    launchers = options(page, "#launchers")
    assert [o[0] for o in launchers] == schemas["Target"]["enum"]
    # every target chosen but Kubernetes, which narrows the search to its PyTorchJob's entry points: the
    # page's default plan is the API's (a surfaces review)
    assert [o[0] for o in launchers if not o[2]] == ["kubernetes"]
    assert options(page, "#run\\.format")[0] == ("auto", "detect", True)
    top_k = schemas["ConstraintsIn"]["properties"]["top_k"]
    # its null is the default (contracts.common.null_means_default): the number's branch holds the bound
    top_k = next(branch for branch in top_k.get("anyOf", [top_k]) if branch.get("type") != "null")
    assert page.get_attribute("#constraints\\.top_k", "max") == str(int(top_k["maximum"]))
    assert page.get_attribute("#constraints\\.top_k", "min") == str(int(top_k["minimum"]))
    # typed in GiB: the API's byte limit in the page's unit
    cpu_memory = schemas["ClusterIn"]["properties"]["cpu_memory_bytes_per_node"]
    cpu_memory = next(b for b in cpu_memory.get("anyOf", [cpu_memory]) if b.get("type") != "null")
    assert (
        float(page.get_attribute("#cluster\\.cpu_memory_gib_per_node", "max"))
        == cpu_memory["maximum"] / 2**30
    )
    batch = schemas["TrainingIn"]["properties"]["global_batch_size"]
    assert page.get_attribute("#training\\.global_batch_size", "title") == batch["description"]
    assert page.evaluate("document.getElementById('training.seq_len').required")
    page.close()


# What the page's own walk (app.js fieldSchema, as applyApiFields runs it over FORMS) finds in the
# document the service serves, for every control whose id names an API field: its body path, whether
# the field is there, the enum it offers (the field's or its items') and the options the select shows.
PAGE_FIELDS = """async (named) => {
  const doc = await api("GET", OPENAPI_URL);
  const out = [];
  for (const [formId, path, prefix] of FORMS) {
    const body = doc.paths[path].post.requestBody.content["application/json"].schema;
    for (const control of document.getElementById(formId).querySelectorAll("[id]")) {
      if (!new RegExp(named).test(control.id)) continue;
      const at = control.dataset.field || control.id.slice(prefix.length);
      const field = fieldSchema(doc, body, at.split("."));
      const unit = control.dataset.unit || null;
      out.push({ id: control.id, form: formId, prefix, at, found: field !== null,
        unit, known_unit: !unit || unit in UNITS,
        enum: field && (field.enum || field.items?.enum || null),
        nullable: Boolean(field?.nullable) && field.type !== "array" && field.default == null,
        options: control.tagName === "SELECT" ? [...control.options].map((o) => o.value) : null });
    }
  }
  return out;
}"""
# The ids that name an API field: the request body's top-level fields, the run form's "run." ones
API_ID = r"^(model\.|cluster\.|training\.|constraints\.|run\.|launchers$)"


def test_every_control_that_names_an_api_field_is_one_the_page_finds_in_the_document(
    served: str, browser: Any
) -> None:
    """A field renamed in the API leaves a control the page cannot fill (applyApiFields skips it
    silently): the page's own walk must find each one, and each enum's select shows exactly the
    document's values (index.html writes none: tests/test_web_metadata.py)."""
    page = browser.new_page()
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    controls = page.evaluate(PAGE_FIELDS, API_ID)
    page.close()
    assert len(controls) >= 20  # the walk saw the forms
    for c in controls:
        assert c["id"].startswith(c["prefix"]), (
            f"#{c['id']} is in #{c['form']}, whose ids start {c['prefix']!r}"
        )
    missing = [c["at"] for c in controls if not c["found"]]
    assert not missing, f"index.html sends fields its request schema does not have: {missing}"
    assert all(c["known_unit"] for c in controls), [c["unit"] for c in controls if not c["known_unit"]]
    with_enum = {c["id"]: c for c in controls if c["enum"]}
    assert {
        "training.precision",
        "training.attention",
        "training.method",
        "constraints.objective",
        "launchers",
        "run.format",
    } <= set(with_enum)
    for c in with_enum.values():
        assert c["options"] == [""] * c["nullable"] + c["enum"], c


def test_without_the_openapi_document_the_page_still_plans(served: str, browser: Any) -> None:
    """The document unreadable: the enums' selects offer only the service's defaults, which send
    nothing, and a plan goes through with no error shown."""
    page = browser.new_page()
    page.route("**/openapi.json", lambda route: route.fulfill(status=503, body=""))
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    assert options(page, "#training\\.method") == [("", "the service's default", True)]
    assert [o[0] for o in options(page, "#training\\.precision")] == [""]
    assert options(page, "#launchers") == []
    assert not page.is_visible("#training\\.lora_rank")  # the default method: full
    page.click("#submit")
    page.wait_for_selector("#result .status", timeout=60_000)
    assert "Feasible" in page.inner_text("#result .status")
    assert not page.is_visible("#form-errors")
    plan = httpx.get(f"{served}/v1/plans/{page.inner_text('#result .status a')}").json()
    assert plan["request"]["training"]["method"] == "full" and plan["request"]["launchers"] == []
    page.close()


def test_an_api_error_appears_next_to_its_field(served: str, browser: Any) -> None:
    page = browser.new_page()
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    page.fill("#training\\.seq_len", "0")  # below the API's minimum
    page.click("#submit")
    page.wait_for_selector(".field-error")
    message = page.locator("#training\\.seq_len + .field-error")
    assert message.count() == 1 and "greater than or equal to 1" in message.inner_text()
    assert page.get_attribute("#training\\.seq_len", "aria-invalid") == "true"
    assert page.locator("#form-errors").is_visible()
    # a field typed in the page's unit (GiB) and sent in bytes: its error next to it all the same
    page.fill("#training\\.seq_len", "4096")
    page.fill("#cluster\\.cpu_memory_gib_per_node", "-1")
    page.click("#submit")
    page.wait_for_selector("#cluster\\.cpu_memory_gib_per_node + .field-error")
    assert page.get_attribute("#cluster\\.cpu_memory_gib_per_node", "aria-invalid") == "true"
    # a limit the API states in bytes, quoted in the control's GiB (it read 17592186044416: review)
    page.fill("#cluster\\.cpu_memory_gib_per_node", "20000")
    page.click("#submit")
    said_in_gib = "document.querySelector('#cluster\\\\.cpu_memory_gib_per_node + .field-error')"
    page.wait_for_function(f"{said_in_gib}?.textContent.includes('GiB')")
    said = page.inner_text("#cluster\\.cpu_memory_gib_per_node + .field-error")
    assert "16,384 GiB" in said and "17592186044416" not in said
    # and the summary's own line above the list, where the problem's detail quoted the bytes (UI review)
    assert "17592186044416" not in page.inner_text("#form-errors")
    page.close()


def test_a_new_answer_resets_the_launcher_note_and_defaults_read_in_the_pages_units(
    served: str, browser: Any
) -> None:
    """The launcher note and each target's reason describe the plan shown: an error, or a capacity
    comparison, after a plan put them back to the form's own text (they kept the old plan's: page
    review). A network left out resolves to the part's, shown in GB/s (it read 50000000000 beside a
    field in GB/s), and the fit's note says what headroom the search keeps."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    default_note = page.inner_text("#launchers-note")
    job = {"model.preset": "gpt2", "cluster.gpu": "h100-sxm-80gb", "cluster.num_nodes": "2"}
    new_plan(page, served, **job, **{"training.seq_len": "1024", "training.global_batch_size": "64"})
    assert "render it" in page.inner_text("#launchers-note")
    assert "cluster.inter_node_bandwidth_bytes_per_s 50 GB/s" in page.inner_text("#result .defaults")
    assert "keeps 5.0% of it free (min_headroom_fraction, or more where" in page.inner_text(
        "#result p.memory-statistics"
    )
    page.fill("#training\\.seq_len", "0")
    page.click("#submit")
    page.wait_for_selector("#training\\.seq_len + .field-error")
    assert page.inner_text("#launchers-note") == default_note
    titles = page.eval_on_selector_all("#launchers option", "os => os.map((o) => o.title)")
    assert not any(titles)
    # the GB/s fields' help is the API's *_gbps field's, in GB/s (it was the bytes/s field's)
    help_text = page.get_attribute("#cluster\\.inter_node_bandwidth_gbps", "title") or ""
    assert "GB/s" in help_text and "25e9" not in help_text
    page.close()


def test_measured_bus_bandwidths_typed_in_gbps_reach_the_plan_and_an_unused_one_is_named(
    served: str, browser: Any
) -> None:
    """The two measured busbw fields, typed in GB/s, are sent as the API's *_gbps twins and stored in
    bytes/s; an inter-node measurement on one node is refused next to its field."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    job = {
        "model.preset": "gpt2",
        "cluster.gpu": "h100-sxm-80gb",
        "training.seq_len": "1024",
        "training.global_batch_size": "64",
    }
    new_plan(page, served, **job, **{"cluster.measured_intra_node_bus_bandwidth_gbps": "370"})
    assert "Feasible" in page.inner_text("#result .status")
    plan = httpx.get(f"{served}/v1/plans/{page.inner_text('#result .status a')}").json()
    assert plan["request"]["cluster"]["measured_intra_node_bus_bandwidth_bytes_per_s"] == 370e9
    assert any(
        "bus bandwidth measured: 370 GB/s" in n for n in plan["recommended"]["estimate"]["assumptions"]
    )
    page.fill("#cluster\\.measured_inter_node_bus_bandwidth_gbps", "44")
    page.click("#submit")
    page.wait_for_selector("#cluster\\.measured_inter_node_bus_bandwidth_gbps + .field-error")
    assert page.get_attribute("#cluster\\.measured_inter_node_bus_bandwidth_gbps", "aria-invalid") == "true"
    page.close()


def test_a_service_that_requires_keys_asks_for_one_once(tmp_path: Path, browser: Any) -> None:
    from sqlalchemy.orm import Session

    from service.persistence.db import make_engine
    from service.planning.api_keys import create_key

    url = f"sqlite:///{tmp_path / 'keys.db'}"
    with loopback.served(url, require_auth=True) as base:
        engine = make_engine(url)
        with Session(engine) as session:
            _, secret = create_key(session, owner="ui", name="browser", scopes=["read", "write"])
            session.commit()
        engine.dispose()
        page = browser.new_page()
        asked: list[str] = []

        def answer(dialog: Any) -> None:
            asked.append(dialog.message)
            dialog.accept(secret)

        page.on("dialog", answer)
        page.goto(f"{base}/")
        page.wait_for_selector("body[data-ready=true]")
        assert len(asked) == 1 and "API key" in asked[0]
        assert page.locator("#model\\.preset option").count() > 10  # the catalog came with the key
        # a file's download carries the key (a link the browser follows sends no header: a 401 where
        # keys are required; a multi-tenant review), the single files and the zip alike
        page.select_option("#model\\.preset", "llama-3.1-8b")
        page.fill("#cluster\\.num_nodes", "1")
        page.fill("#cluster\\.gpus_per_node", "8")
        page.click("#submit")
        page.wait_for_selector("#result ul.artifacts a", timeout=60_000)
        links = page.locator("#result ul.artifacts a")
        for index in (0, links.count() - 1):
            with page.expect_download() as download:
                links.nth(index).click()
            saved = Path(download.value.path())
            assert saved.stat().st_size > 0 and download.value.suggested_filename == links.nth(
                index
            ).get_attribute("download")
            if index:
                assert saved.read_bytes()[:2] == b"PK"  # the zip, not a problem document
        assert len(asked) == 1
        page.close()


def test_a_list_that_fails_at_load_is_said_and_the_form_still_plans(served: str, browser: Any) -> None:
    """The stored clusters' list answering 503 (a busy SQLite): the page says which list failed,
    still offers the presets and GPUs, and plans an inline cluster (not a reload with the form in
    the address)."""
    page = browser.new_page()
    page.route(
        "**/v1/clusters*",
        lambda route: route.fulfill(
            status=503, content_type="application/problem+json", body='{"detail": "database busy"}'
        ),
    )
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    assert "stored clusters: database busy" in page.inner_text("#load-errors")
    assert page.input_value("#model\\.preset") == "llama-3.1-8b"
    page.click("#submit")
    page.wait_for_selector("#result .status", timeout=60_000)
    assert "Feasible" in page.inner_text("#result .status") and "?" not in page.url
    page.close()


def test_an_answer_that_is_not_json_keeps_its_status(served: str, browser: Any) -> None:
    """A proxy's HTML 502 in place of the plan: the page shows the HTTP status and the body's start,
    not a JSON parser's message."""
    page = browser.new_page()
    page.route(
        "**/v1/plans",
        lambda route: route.fulfill(status=502, content_type="text/html", body="<html>Bad Gateway</html>"),
    )
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    page.click("#submit")
    page.wait_for_selector("#form-errors:not([hidden])")
    shown = page.inner_text("#form-errors")
    assert "HTTP 502" in shown and "Bad Gateway" in shown and "JSON" not in shown
    page.close()


def test_plan_history_says_when_it_cannot_list_and_when_nothing_matches(served: str, browser: Any) -> None:
    page = browser.new_page()
    page.goto(f"{served}/#/plans")
    page.wait_for_selector("body[data-ready=true]")
    page.fill("#filter-model", "no-such-model")
    page.click("#filters button[type=submit]")
    page.wait_for_function(
        "document.querySelector('#plans-table tbody').innerText.includes('No plan matches')"
    )
    page.route("**/v1/plans?*", lambda route: route.fulfill(status=500, body=""))
    page.click("#filters button[type=submit]")
    page.wait_for_selector("#plans-errors:not([hidden])")
    assert "could not be listed" in page.inner_text("#plans-errors") and "HTTP 500" in page.inner_text(
        "#plans-errors"
    )
    page.close()


def test_a_plan_shows_its_warnings_and_its_rejections_examples(served: str, browser: Any) -> None:
    """GPT-2 (124M parameters, outside the memory model's validated range): the page shows the
    warning the API and the CLI give; each rejected group shows its example layout."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    new_plan(page, served, **{"model.preset": "gpt2", "training.seq_len": "1024"})
    plan = httpx.get(f"{served}/v1/plans/{page.inner_text('#result .status a')}").json()
    warnings = plan["recommended"]["estimate"]["warnings"]
    assert warnings and page.locator("#result ul.warnings li").all_inner_texts() == warnings
    # and what its figures rest on, folded (the page showed none of the API's assumptions)
    assumptions = plan["recommended"]["estimate"]["assumptions"]
    assert assumptions and page.locator("#result ul.assumptions li").all_text_contents() == assumptions
    # each alternative's warnings too (the page left them out: review)
    alternatives = cells(page, "#result table:has(caption:text('Alternatives'))")
    assert [row[-1] for row in alternatives] == [
        "; ".join(a["estimate"]["warnings"]) or "-" for a in plan["alternatives"]
    ]
    assert any(row[-1] != "-" for row in alternatives)
    rejected = [row[2] for row in cells(page, "#result table:has(caption:text('Rejected layouts'))")]
    assert len(rejected) == len(plan["rejected"]) and all(text.split(" ")[0] in (
        "deepspeed", "fsdp", "megatron") for text in rejected)  # fmt: skip
    page.close()


def test_the_base_dtype_control_is_lora_s_and_a_missing_plan_has_no_run_form(
    served: str, browser: Any
) -> None:
    page = browser.new_page()
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    page.select_option("#training\\.method", "lora")
    assert page.is_visible("#training\\.base_dtype")
    page.select_option("#training\\.method", "qlora")
    assert page.is_visible("#training\\.lora_rank") and not page.is_visible("#training\\.base_dtype")
    page.goto(f"{served}/#/plans/01M94J6N152GYSQ24RWTSSB1RX")
    page.wait_for_selector("#plan-detail .field-error")
    assert not page.is_visible("#run-form")
    page.close()


def test_gpu_types_are_compared_from_the_plan_form(served: str, browser: Any) -> None:
    """The page had no capacity view (page review, stop 41): "Compare GPU types" sends the form's model
    and training to POST /v1/capacity and shows each GPU type's fewest GPUs, speed and time to train,
    as the API answers them."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    page.select_option("#model\\.preset", "llama-3.2-1b")
    page.fill("#training\\.seq_len", "2048")
    page.fill("#training\\.global_batch_size", "64")
    page.fill("#training\\.tokens", "1000000000")
    page.click("#compare")
    page.wait_for_selector("#result table.capacity", timeout=60_000)
    rows = cells(page, "#result table.capacity")
    answer = httpx.post(
        f"{served}/v1/capacity",
        json={"model": {"preset": "llama-3.2-1b"},
              "training": {"seq_len": 2048, "global_batch_size": 64, "tokens": 1_000_000_000}},
        timeout=60,
    ).json()  # fmt: skip
    assert [row[0] for row in rows] == [o["gpu"] for o in answer["options"]]
    first = answer["options"][0]
    header = page.locator("#result table.capacity").first.locator("th").all_inner_texts()
    assert rows[0][1] == "yes" and rows[0][header.index("tokens/s")] == f"{round(first['tokens_per_s']):,}"
    # the network each option assumes (its reference node's), as the API states it
    networks = [row[header.index("network per GPU")] for row in rows]
    for option, shown in zip(answer["options"], networks, strict=True):
        bandwidth = option["inter_node_bandwidth_bytes_per_s"]
        assert shown == ("-" if not bandwidth else f"{page_number(bandwidth / 1e9)} GB/s"), option["gpu"]
    assert "GPU types fit" in page.inner_text("#busy")
    # GPU-hours to four figures, the GPUs of part of a node as such, and a typed price priced (a
    # surfaces review: 0.66 GPU-hours showed "1", 2 GPUs "2 (1 x 8)", and the price was dropped)
    page.fill("#constraints\\.gpu_hour_cost", "2")
    page.click("#compare")
    page.wait_for_function("document.querySelectorAll('#result table.capacity th').length > 10")
    rows = cells(page, "#result table.capacity")
    header = page.locator("#result table.capacity").first.locator("th").all_inner_texts()
    priced = httpx.post(
        f"{served}/v1/capacity",
        json={"model": {"preset": "llama-3.2-1b"}, "gpu_hour_cost": 2,
              "training": {"seq_len": 2048, "global_batch_size": 64, "tokens": 1_000_000_000}},
        timeout=60,
    ).json()  # fmt: skip
    for option, row in zip(priced["options"], rows, strict=True):
        if option["gpu_hours"]:
            assert row[header.index("GPU-hours")] == page_number(float(f"{option['gpu_hours']:.4g}")), option
            assert row[header.index("cost")] == page_number(float(f"{option['cost']:.4g}")), option
        if option["min_gpus"] and option["min_gpus"] < option["min_nodes"] * option["gpus_per_node"]:
            assert (
                row[header.index("fewest GPUs")]
                == f"{option['min_gpus']} (of 1 node of {option['gpus_per_node']})"
            )
    page.close()


def test_a_price_per_gpu_hour_prices_the_plan_and_the_headline_says_what_ranked_it(
    served: str, browser: Any
) -> None:
    """'Rank by: cost' had no price to type and the page showed neither the score nor what it meant
    (page review): a price is sent as constraints.gpu_hour_cost, the headline shows the cost to train
    and the objective's score, as the API states them."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    job = {"model.preset": "gpt2", "cluster.gpu": "h100-sxm-80gb", "training.seq_len": "1024"}
    new_plan(
        page, served, **job, **{"training.tokens": "1000000000", "constraints.objective": "cost",
                                "constraints.gpu_hour_cost": "2.5"},
    )  # fmt: skip
    plan = httpx.get(f"{served}/v1/plans/{page.inner_text('#result .status a')}").json()
    assert plan["request"]["constraints"]["gpu_hour_cost"] == 2.5
    rec = plan["recommended"]
    headline = page.inner_text("#result p.headline")
    assert f"cost to train {page_number(rec['estimate']['cost_to_train'])}" in headline
    assert (
        f"ranked by cost: score {page_number(rec['score'])} per million tokens (price × GPU-hours)"
        in headline
    )
    # each alternative's GPUs beside its figures (the page compared tokens/s across GPU counts alone)
    header = page.locator("#result table:has(caption:text('Alternatives')) th").all_inner_texts()
    shown = cells(page, "#result table:has(caption:text('Alternatives'))")
    for alt, row in zip(plan["alternatives"], shown, strict=True):
        split = alt["layout"]
        assert row[header.index("GPUs")] == f"{split['dp'] * split['tp'] * split['pp'] * split['cp']:,}"
        # and each one's cost to train, as the CLI shows it (a surfaces review: a faster alternative on
        # more GPUs read as strictly better beside the cost objective's pick)
        assert row[header.index("cost")] == page_number(float(f"{alt['estimate']['cost_to_train']:.4g}"))
        assert row[header.index("time to train")] != "-"
    page.close()


def test_a_gpu_outside_the_catalog_is_planned_from_its_datasheet(served: str, browser: Any) -> None:
    """The page planned on catalog parts only (a custom GPU only through a stored cluster made with
    the API: page review): a datasheet pasted as JSON is sent as cluster.gpu, the plan is made on it,
    and an error inside it (cluster.gpu.memory_bytes) appears next to the pasted JSON."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    assert not page.is_visible("#custom-gpu")
    page.check("#custom-gpu-toggle")
    assert page.is_visible("#custom-gpu") and not page.is_visible("#cluster\\.gpu")
    spec = H20
    page.fill("#custom-gpu", json.dumps(spec))
    page.select_option("#model\\.preset", "llama-3.1-8b")
    page.fill("#training\\.seq_len", "4096")
    page.fill("#training\\.global_batch_size", "64")
    page.click("#submit")
    page.wait_for_selector("#result .status", timeout=60_000)
    plan = httpx.get(f"{served}/v1/plans/{page.inner_text('#result .status a')}").json()
    assert plan["request"]["cluster"]["gpu"]["name"] == "lab-h20-96gb"
    assert plan["cluster"]["gpu"]["name"] == "lab-h20-96gb"
    assert "Feasible" in page.inner_text("#result .status")
    # a value past its limit, inside the pasted JSON: named next to it
    page.fill("#custom-gpu", json.dumps(spec | {"memory_bytes": 1}))
    page.click("#submit")
    page.wait_for_selector("#custom-gpu + .field-error")
    assert "cluster.gpu.memory_bytes" in page.inner_text("#form-errors")
    assert page.get_attribute("#custom-gpu", "aria-invalid") == "true"
    # not JSON: said before anything is sent
    page.fill("#custom-gpu", "{not json")
    page.click("#submit")
    page.wait_for_function(
        "document.querySelector('#custom-gpu + .field-error')?.textContent.includes('JSON')"
    )
    page.close()


def test_the_pages_layout_label_is_the_clis(served: str, browser: Any) -> None:
    """The page's layoutText prints what the CLI's layout_text prints (the switches a plan sets beside
    the degrees, which an estimate of the label needs to give the plan's numbers:
    tests/api/test_label_round_trip.py)."""
    from service.cli import layout_text

    plans = [
        {"model": "olmo-2-13b", "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 2}},
        {"model": "mixtral-8x7b", "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 2}},
        {"model": "llama-3.1-70b", "cluster": {"gpu": "h100-sxm-80gb", "num_nodes": 2}},
    ]
    layouts = []
    for body in plans:
        answer = httpx.post(
            f"{served}/v1/plans",
            json={
                **body,
                "training": {"seq_len": 4096, "global_batch_size": 256},
                "constraints": {"top_k": 3},
            },
            timeout=60,
        ).json()
        layouts += [c["layout"] for c in (answer["recommended"], *answer["alternatives"])]
    page = browser.new_page()
    page.goto(served)
    page.wait_for_selector("body[data-ready=true]")  # the label's switches come from the OpenAPI document
    labels = page.evaluate("(layouts) => layouts.map(layoutText)", layouts)
    assert labels == [layout_text(layout) for layout in layouts]


def test_the_run_form_belongs_to_the_plan_shown(served: str, browser: Any) -> None:
    """UI review: a link in the run form's error list followed its fragment and left the plan for the
    new-plan form; the form kept one plan's errors and values on the next; an infeasible plan offered a
    form every submission of which the API refuses (409); a field's own help was cut off after an
    error. Each fixed, checked here."""

    def plan(model: str, gpu: str, gpus: int, seq_len: int) -> dict[str, Any]:
        body = {"model": model, "cluster": {"gpu": gpu, "num_gpus": gpus},
                "training": {"seq_len": seq_len, "global_batch_size": 8}}  # fmt: skip
        answer: dict[str, Any] = httpx.post(f"{served}/v1/plans", json=body, timeout=60).json()
        return answer

    feasible, other = plan("gpt2", "h100-sxm-80gb", 1, 1024), plan("gpt2", "a100-sxm-80gb", 1, 1024)
    infeasible = plan("llama-3.1-70b", "a100-sxm-40gb", 2, 4096)
    assert infeasible["status"] == "infeasible"
    page = browser.new_page()
    page.goto(f"{served}/#/plans/{feasible['id']}")
    page.wait_for_selector("#plan-detail .status")
    assert page.evaluate("document.activeElement.id") == "plan-title"
    page.check("input[name=run-source][value=typed]")
    page.fill("#run\\.step_s", "-1")
    page.click("#run-form button[type=submit]")
    page.wait_for_selector("#run-errors a")
    page.click("#run-errors a")
    assert page.evaluate("location.hash") == f"#/plans/{feasible['id']}"  # still the plan
    assert page.evaluate("document.activeElement.id") == "run.step_s"
    assert "err-" in (page.get_attribute("#run\\.step_s", "aria-describedby") or "")
    # another plan: no error and no value of the first
    page.goto(f"{served}/#/plans/{other['id']}")
    page.wait_for_function(f"document.getElementById('plan-title').textContent.includes('{other['id']}')")
    page.wait_for_selector("#plan-detail .status")
    assert page.is_hidden("#run-errors") and page.input_value("#run\\.step_s") == ""
    assert page.get_attribute("#run\\.step_s", "aria-invalid") is None
    # an infeasible plan has no run form, and says why
    page.goto(f"{served}/#/plans/{infeasible['id']}")
    page.wait_for_selector("#plan-detail .status")
    assert page.is_hidden("#run-form")
    assert "no run is recorded on it" in page.inner_text("#plan-detail")
    page.close()
