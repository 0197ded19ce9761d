"""The service on a loopback port in a thread, on a migrated database: for tests that need real
HTTP (the CLI's --url, the browser)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from service.cli import migrate
from service.main import create_app
from service.settings import Settings


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def served(database_url: str, *, require_auth: bool = False, **settings: Any) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of the service while the block runs (``settings``: more of them)."""
    migrate(database_url)
    port = free_port()
    config = uvicorn.Config(
        create_app(Settings(database_url=database_url, require_auth=require_auth, **settings)),
        host="127.0.0.1",
        port=port,
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "the service did not start within 10 s"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
