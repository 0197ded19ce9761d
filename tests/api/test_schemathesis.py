"""Schemathesis against the OpenAPI document, on a freshly migrated database of its own (SQLite, or
with PLANNER_TEST_DATABASE_URL a PostgreSQL database beside that one, as CI's second pass runs it):
every operation, schema-valid and invalid requests alike, answers without a 5xx, with a documented
status code and content type, and a body and headers that match the document."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from hypothesis import HealthCheck, settings
from schemathesis import openapi
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.main import create_app
from service.settings import Settings
from tests.conftest import alembic_config, reset_postgres_schema, sibling_postgres_database

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
pytestmark = pytest.mark.db  # CI's PostgreSQL pass runs it again there

# Its own database: the rows the fuzzer stores must not meet the other tests' empty-table checks.
if os.environ.get("PLANNER_TEST_DATABASE_URL"):
    DATABASE_URL = sibling_postgres_database(os.environ["PLANNER_TEST_DATABASE_URL"], "fuzz")
    reset_postgres_schema(DATABASE_URL)
else:
    DATABASE_URL = f"sqlite:///{Path(tempfile.mkdtemp(prefix='trainplan-fuzz-')) / 'fuzz.db'}"
command.upgrade(alembic_config(DATABASE_URL), "head")
schema = openapi.from_asgi("/openapi.json", create_app(Settings(database_url=DATABASE_URL)))


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented(case: Any) -> None:
    case.call_and_validate(checks=CHECKS)
