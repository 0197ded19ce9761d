"""The PLANNER_ settings: every bad or unknown variable named before the service starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from service.settings import SettingsError, load_settings


def test_every_bad_or_misspelt_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A misspelt PLANNER_REQUIRE_AUTHENTICATION=true was ignored (extra="ignore") and the service
    served without keys; an unknown log level with --workers 2 made uvicorn start failing workers again
    and again; PLANNER_DATABASE_POOL_TIMEOUT_S=inf overflowed a deadline (500s under load); an origin
    with a trailing slash never matched a browser's (operations review)."""
    monkeypatch.setenv("PLANNER_REQUIRE_AUTHENTICATION", "true")
    monkeypatch.setenv("PLANNER_LOG_LEVEL", "verbose")
    monkeypatch.setenv("PLANNER_DATABASE_POOL_TIMEOUT_S", "inf")
    monkeypatch.setenv("PLANNER_CORS_ORIGINS", '["https://ui.example/", "tauri://localhost", "null"]')
    monkeypatch.setenv("PLANNER_TEST_DATABASE_URL", "sqlite://")  # the test suite's, not a setting
    # Kubernetes' links to a Service named "planner", in every pod (change review): not ours, not typos
    for link in (
        "PLANNER_SERVICE_HOST",
        "PLANNER_SERVICE_PORT",
        "PLANNER_PORT",
        "PLANNER_PORT_8000_TCP_ADDR",
    ):
        monkeypatch.setenv(link, "10.96.0.12")
    monkeypatch.setenv("PLANNER_SOMETHING_ELSE", "x")  # no setting's misspelling: someone else's
    with pytest.raises(SettingsError) as raised:
        load_settings()
    text = str(raised.value)
    assert "SERVICE_HOST" not in text and "PLANNER_PORT" not in text and "SOMETHING_ELSE" not in text
    assert (
        "PLANNER_REQUIRE_AUTHENTICATION: not a setting of this service (did you mean PLANNER_REQUIRE_AUTH?)"
        in text
    )
    for name in ("PLANNER_LOG_LEVEL", "PLANNER_DATABASE_POOL_TIMEOUT_S", "PLANNER_CORS_ORIGINS"):
        assert f"\n  {name}: " in text, text
    assert "PLANNER_TEST_DATABASE_URL" not in text
    assert "https://ui.example/" in text and "tauri://" not in text  # an app's own scheme is an origin


def test_the_check_exits_2_before_any_worker_starts() -> None:
    """`python -m service.settings`, which `make serve` and the image run before uvicorn."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PLANNER_")}
    bad = subprocess.run(
        [sys.executable, "-m", "service.settings"],
        env=environment | {"PLANNER_LOG_LEVEL": "verbose"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "PLANNER_LOG_LEVEL" in bad.stderr and "Traceback" not in bad.stderr
    good = subprocess.run([sys.executable, "-m", "service.settings"], env=environment, check=False)
    assert good.returncode == 0


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("notaurl", "not a database URL"),
        ("postgres://postgres@127.0.0.1/db", "write postgresql+psycopg://"),
        ("mysql://x:secret@localhost/db", "runs on SQLite or PostgreSQL"),
        ("sqlite:////nonexistent/dir/x.db", "folder /nonexistent/dir does not exist"),
    ],
)
def test_a_database_url_that_cannot_connect_is_named_before_any_worker_starts(
    monkeypatch: pytest.MonkeyPatch, url: str, said: str
) -> None:
    """The URL was never checked: `python -m service.settings` passed and every worker then failed at
    startup with SQLAlchemy's traceback (postgres://, the scheme libpq and many platforms hand out, has
    no SQLAlchemy dialect since 1.4; operator review). A password is never echoed."""
    monkeypatch.setenv("PLANNER_DATABASE_URL", url)
    with pytest.raises(SettingsError) as raised:
        load_settings()
    text = str(raised.value)
    assert "PLANNER_DATABASE_URL" in text and said in text and "secret" not in text, text


def test_the_urls_the_service_runs_on_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    for url in ("sqlite://", "sqlite:///./trainplan.db", "postgresql+psycopg://u:p@127.0.0.1:5432/db"):
        monkeypatch.setenv("PLANNER_DATABASE_URL", url)
        assert load_settings().database_url == url


def test_an_origin_no_browser_sends_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Browsers send the Origin with the host in lower case and no default port: https://UI.example.com
    and https://ui.example.com:443 passed the check and then refused the page (operator review); an
    international host in punycode, a port as a number, the scheme in lower case (change review)."""
    cases = {
        "https://UI.example.com": "https://ui.example.com",
        "https://ui2.example.com:443": "https://ui2.example.com",
        "http://x:80": "http://x",
        "https://bücher.example": "https://xn--bcher-kva.example",
        "http://127.0.0.1:080": "http://127.0.0.1",
        "HTTPS://ui.example": "https://ui.example",
    }
    monkeypatch.setenv("PLANNER_CORS_ORIGINS", ",".join(cases))
    with pytest.raises(SettingsError) as raised:
        load_settings()
    text = str(raised.value)
    for given, sent in cases.items():
        assert f"{given} (a browser sends {sent})" in text, text
    monkeypatch.setenv(
        "PLANNER_CORS_ORIGINS", "https://ui.example.com:8443,http://[::1]:8080,tauri://localhost"
    )
    assert len(load_settings().cors_origins) == 3
