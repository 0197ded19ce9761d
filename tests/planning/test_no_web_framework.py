"""service.planning is the workflow every face calls (HTTP, the CLI, the page): it must not pull
in the web framework, nor import anything of service.api (the schemas both use are
service.contracts): the direction is api -> planning -> {recommender, launchers, persistence,
catalog} -> estimator."""

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


def planning_imports_of_the_web_shell(planning_dir: Path) -> dict[str, list[str]]:
    """Module file -> what it imports of service.api, fastapi or starlette (any import statement,
    at the top or inside a function)."""
    reached: dict[str, list[str]] = {}
    for path in sorted(planning_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            bad = [n for n in names if n == "service.api" or n.startswith("service.api.")]
            bad += [n for n in names if n.split(".")[0] in {"fastapi", "starlette"}]
            if isinstance(node, ast.ImportFrom) and node.module == "service":
                bad += [f"service.{a.name}" for a in node.names if a.name == "api"]
            if bad:
                reached.setdefault(path.name, []).extend(bad)
    return reached


def test_planning_imports_nothing_of_the_web_shell() -> None:
    assert planning_imports_of_the_web_shell(PLANNING_DIR) == {}, "move what both need to service.contracts"


def test_importing_planning_loads_no_module_of_the_web_shell() -> None:
    code = (
        "import sys, service.planning;"
        "shell = sorted(m for m in sys.modules if m == 'service.api' or m.startswith('service.api.'));"
        "print(','.join(shell))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "", f"service.planning loaded {out.stdout.strip()}"


def test_an_import_of_the_web_shell_is_caught(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from service.api.schemas.plans import PlanOut\n")
    (tmp_path / "b.py").write_text("def f() -> None:\n    import service.api.deps\n")
    (tmp_path / "c.py").write_text("from service import api\n")
    (tmp_path / "d.py").write_text("from service.contracts.plans import PlanOut\nimport service.apiary\n")
    assert planning_imports_of_the_web_shell(tmp_path) == {
        "a.py": ["service.api.schemas.plans"],
        "b.py": ["service.api.deps"],
        "c.py": ["service.api"],
    }
