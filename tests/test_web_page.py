"""The page at `/`, in a real browser: Debian's Chromium driven headless by Playwright, against the
service on a loopback port. Submits a plan and checks the memory chart, the rationale and the download
links; an API error appears next to the field it names; the screenshot goes to docs/ for the README.

Skips without Chromium or Playwright (`make test` on a bare machine); `.ci/run` installs both and runs
it with skips turned into failures (`make browser-test`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import loopback

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


def test_a_plan_in_the_browser(served: str, browser: Any, tmp_path: Path) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{served}/")
    page.wait_for_selector("body[data-ready=true]")
    page.select_option("#model\\.preset", "llama-3.1-8b")
    page.select_option("#cluster\\.gpu", "h100-sxm-80gb")
    page.fill("#training\\.seq_len", "8192")
    page.fill("#training\\.global_batch_size", "128")
    page.click("#submit")
    page.wait_for_selector("#result .status", timeout=60_000)
    assert "Feasible" in page.inner_text("#result .status")
    # the memory chart: a stacked bar per layout, components as segments, the card's capacity marked
    segments = page.locator("#result svg.memory-chart rect.segment")
    assert segments.count() >= 4
    assert page.locator("#result svg.memory-chart line.capacity").count() == 1
    assert page.locator("#result svg.time-chart rect.segment").count() >= 1
    assert page.locator("#result ul.rationale li").count() >= 3
    links = page.locator("#result ul.artifacts a")
    assert links.count() >= 2
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    for href in hrefs:
        assert httpx.get(f"{served}{href}").status_code == 200
    assert any(h.endswith("artifacts.zip") for h in hrefs)
    # TRAINPLAN_SCREENSHOT=docs/page.png refreshes the README's picture; otherwise a scratch file
    shot = Path(os.environ.get("TRAINPLAN_SCREENSHOT") or tmp_path / "page.png")
    page.screenshot(path=str(ROOT / shot if not shot.is_absolute() else shot), full_page=True)
    # the plan is in the history and has its own page with a run form
    page.goto(f"{served}/#/plans")
    page.wait_for_selector("#plans-table tbody tr a")
    page.click("#plans-table tbody tr a")
    page.wait_for_selector("#plan-detail .status")
    page.fill("#run\\.step_s", "15.2")
    page.click("#run-form button[type=submit]")
    page.wait_for_selector("#runs table")
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
    assert page.locator("#result ul.suggestions li").count() >= 1
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
        page.close()
