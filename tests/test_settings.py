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
