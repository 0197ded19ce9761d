"""Assertions shared by the API tests."""

from __future__ import annotations

from typing import Any

import httpx


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """The response is an RFC 9457 problem with this status, a detail and the request id."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.headers.get("x-request-id")
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["type"].startswith("https://")
    assert body["title"] and body["detail"]
    return body
