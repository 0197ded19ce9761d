"""Health, readiness, metrics, request ids, CORS and the problem format of FastAPI's own errors."""

from __future__ import annotations

import io
import json
import logging

from fastapi.testclient import TestClient

from service.main import create_app
from service.settings import Settings
from tests.api.helpers import assert_problem


def test_healthz_and_readyz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"


def test_readyz_is_503_when_the_database_does_not_answer(tmp_path: object) -> None:
    settings = Settings(database_url="postgresql+psycopg://nobody@127.0.0.1:1/none")
    with TestClient(create_app(settings)) as client:
        assert_problem(client.get("/readyz"), 503)
        assert client.get("/healthz").status_code == 200


def test_unknown_route_and_method_are_problems(client: TestClient) -> None:
    problem = assert_problem(client.get("/v1/nothing-here"), 404)
    assert "/v1/nothing-here" in problem["detail"]
    assert_problem(client.delete("/v1/gpus"), 405)


def test_request_id_is_echoed_or_made(client: TestClient) -> None:
    assert client.get("/healthz", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == "abc-123"
    made = client.get("/healthz", headers={"X-Request-ID": "bad id with spaces"}).headers["x-request-id"]
    assert made and made != "bad id with spaces"


def test_metrics_count_requests_by_route_template(client: TestClient) -> None:
    client.get("/v1/gpus/h100-sxm-80gb")
    client.get("/v1/gpus/nope")
    text = client.get("/metrics").text
    assert 'trainplan_http_requests_total{method="GET",route="/v1/gpus/{name}",status="200"} 1' in text
    assert 'trainplan_http_requests_total{method="GET",route="/v1/gpus/{name}",status="404"} 1' in text
    assert "trainplan_http_request_duration_seconds_bucket" in text


def test_cors_allows_only_configured_origins(migrated_url: str) -> None:
    settings = Settings(database_url=migrated_url, cors_origins=["https://ui.example"])
    with TestClient(create_app(settings)) as client:
        ok = client.get("/healthz", headers={"Origin": "https://ui.example"})
        assert ok.headers["access-control-allow-origin"] == "https://ui.example"
        other = client.get("/healthz", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        # a refused preflight is a problem like every other error (it was text/plain)
        refused = client.options(
            "/v1/plans", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
        )
        problem = assert_problem(refused, 400)
        assert problem["errors"][0]["field"] == "header.origin" and "origin" in problem["detail"]
        # a page reads the ETag its If-Match sends back, a 503's Retry-After and a replay's marker
        exposed = {h.strip().lower() for h in ok.headers["access-control-expose-headers"].split(",")}
        assert {"etag", "retry-after", "idempotent-replayed", "location", "x-request-id"} <= exposed


def test_an_unexpected_error_is_a_problem_500_with_the_request_id(migrated_url: str) -> None:
    app = create_app(Settings(database_url=migrated_url))

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("bug")

    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/boom", headers={"X-Request-ID": "trace-7"})
    problem = assert_problem(response, 500)
    assert "trace-7" in problem["detail"] and "bug" not in problem["detail"]
    assert response.headers["x-request-id"] == "trace-7"
    assert app.state.metrics.requests_with_status(500) == [("GET", "/boom")]


def test_metrics_count_searches_and_their_evaluations(client: TestClient) -> None:
    two_gpus = {"gpu": "h100-sxm-80gb", "num_nodes": 1, "gpus_per_node": 2}
    body = {
        "model": {"preset": "gpt2"},
        "cluster": two_gpus,
        "training": {"seq_len": 512, "global_batch_size": 8},
    }
    plan = client.post("/v1/plans", json=body, headers={"Idempotency-Key": "metrics-1"}).json()
    client.post("/v1/plans", json=body, headers={"Idempotency-Key": "metrics-1"})  # a replay: no search
    text = client.get("/metrics").text
    assert "trainplan_search_duration_seconds_count 1" in text
    evaluations = plan["search"]["memory_evaluations"] + plan["search"]["time_evaluations"]
    assert f"trainplan_search_evaluations_total {evaluations}" in text and evaluations > 0
    assert "trainplan_search_truncated_total 0" in text


def test_logs_are_json_lines_carrying_the_request_id(migrated_url: str) -> None:
    app = create_app(Settings(database_url=migrated_url, log_format="json"))
    stream = io.StringIO()
    (handler,) = [h for h in logging.getLogger("service").handlers if h.get_name() == "trainplan"]
    handler.setStream(stream)  # type: ignore[attr-defined]

    @app.get("/boom")
    def boom() -> None:  # runs in a worker thread: the id must follow it there
        logging.getLogger("service.test").warning("about to fail", extra={"cause": "test"})
        raise RuntimeError("bug")

    with TestClient(app, raise_server_exceptions=False) as client:
        client.get("/v1/gpus/h100-sxm-80gb", headers={"X-Request-ID": "trace-8"})
        client.get("/boom", headers={"X-Request-ID": "trace-9"})
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    access = [line for line in lines if line["logger"] == "service.access"]
    assert [(a["request_id"], a["route"], a["status"]) for a in access] == [
        ("trace-8", "/v1/gpus/{name}", 200),
        ("trace-9", "/boom", 500),
    ]
    assert all(a["duration_ms"] >= 0 and a["method"] == "GET" for a in access)
    in_thread = next(line for line in lines if line["logger"] == "service.test")
    assert in_thread["request_id"] == "trace-9" and in_thread["cause"] == "test"
    error = next(line for line in lines if line["logger"] == "service.errors")
    assert error["request_id"] == "trace-9" and "RuntimeError: bug" in error["exception"]
    # uvicorn's own server lines too, once the app is made (they were plain text among these)
    logging.getLogger("uvicorn.error").warning("Invalid HTTP request received.")
    server = json.loads(stream.getvalue().splitlines()[-1])
    assert server["logger"] == "uvicorn.error" and server["message"] == "Invalid HTTP request received."


def test_head_answers_as_get_without_a_body(client: TestClient) -> None:
    """A review's case: HEAD was a 405 on every /v1 route, /metrics and the page (RFC 9110 9.1: a
    general-purpose server MUST support GET and HEAD): the same status and headers, no body."""
    for path in ("/v1/gpus", "/v1/models", "/v1/clusters", "/v1/gpus/h100-sxm-80gb", "/metrics", "/"):
        get, head = client.get(path), client.head(path)
        assert head.status_code == get.status_code == 200, (path, head.status_code)
        assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"], path
    assert client.head("/v1/gpus/no-such-gpu").status_code == 404
    assert client.head("/v1/plans/nope").status_code == 404
    # a route without GET is still a 405
    assert client.head("/v1/estimates").status_code == 405


def test_metrics_count_every_answer_with_a_bounded_method_label(migrated_url: str) -> None:
    """An invented method made its own label set (15 series per token, without a key); HEAD was counted
    as GET; a 413, a NUL refusal and a CORS preflight, answered by middlewares outside the metrics, had
    no count and no access line; a deeply nested JSON body sent as a form was a 500 (operations review)."""
    settings = Settings(database_url=migrated_url, max_body_bytes=1000, cors_origins=["https://ui.example"])
    with TestClient(create_app(settings)) as client:
        for token in ("FOO6009", "M12345"):
            assert client.request(token, "/v1/clusters").status_code == 405
        assert client.head("/readyz").status_code == 200
        assert client.post("/v1/estimates", content=b"{" + b" " * 2000 + b"}").status_code == 413
        assert client.get("/v1/clusters?x=%00").status_code == 422
        preflight = {"origin": "https://ui.example", "access-control-request-method": "POST"}
        assert client.options("/v1/plans", headers=preflight).status_code == 200
        text = client.get("/metrics").text
    assert 'method="other",route="/v1/clusters",status="405"} 2' in text
    assert "FOO6009" not in text and "M12345" not in text
    assert 'trainplan_http_requests_total{method="HEAD",route="/readyz",status="200"} 1' in text
    assert 'trainplan_http_requests_total{method="POST",route="unmatched",status="413"} 1' in text
    assert 'trainplan_http_requests_total{method="GET",route="unmatched",status="422"} 1' in text
    assert 'trainplan_http_requests_total{method="OPTIONS",route="unmatched",status="200"} 1' in text
    assert 'status="500"' not in text


def test_a_deeply_nested_json_body_without_its_content_type_is_a_400(client: TestClient) -> None:
    """curl's default form content-type on JSON nested past the parser's depth: the check that reads a
    form as JSON raised RecursionError, a 500; answered as the same body sent as JSON is."""
    nested = b'{"a":' * 40_000 + b"1" + b"}" * 40_000  # 240 KB: within the 256 KiB limit
    form = {"content-type": "application/x-www-form-urlencoded"}
    as_form = client.post("/v1/estimates", content=nested, headers=form)
    as_json = client.post("/v1/estimates", content=nested, headers={"content-type": "application/json"})
    assert as_form.status_code == as_json.status_code == 400, as_form.text
