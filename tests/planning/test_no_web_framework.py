"""service.planning is the workflow every face calls (HTTP today, a CLI later): it must not pull
in the web framework, nor reach back into the routers (only the wire schemas of service.api)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PLANNING_DIR = Path(__file__).resolve().parents[2] / "service" / "planning"


def test_importing_planning_imports_no_web_framework() -> None:
    code = (
        "import sys, service.planning;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'fastapi', 'starlette', 'uvicorn'});"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "", f"service.planning imported {out.stdout.strip()}"


def test_planning_imports_only_the_schemas_of_the_web_shell() -> None:
    reached: dict[str, list[str]] = {}
    for path in sorted(PLANNING_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            bad = [
                n for n in names if n.startswith("service.api") and not n.startswith("service.api.schemas")
            ]
            bad += [n for n in names if n.split(".")[0] in {"fastapi", "starlette"}]
            if bad:
                reached.setdefault(path.name, []).extend(bad)
    assert reached == {}, "planning may use service.api.schemas only"
