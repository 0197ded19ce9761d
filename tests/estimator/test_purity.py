"""The estimator is a pure library: importing it pulls in no web, database or validation code."""

import subprocess
import sys


def test_estimator_imports_no_web_or_database_library() -> None:
    code = (
        "import sys, service.estimator, service.estimator.estimate, service.estimator.memory;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'fastapi', 'sqlalchemy', 'pydantic', 'starlette', 'alembic', 'torch', 'yaml'});"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "", f"service.estimator imported {out.stdout.strip()}"
