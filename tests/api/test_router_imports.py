"""Routers do not import each other: what two routers share lives in service.planning (or in a
module that defines no router). Only the aggregator, service/api/main.py, imports routers."""

from __future__ import annotations

import ast
from pathlib import Path

API_DIR = Path(__file__).resolve().parents[2] / "service" / "api"
AGGREGATOR = "service.api.main"


def _module_name(path: Path) -> str:
    return "service.api" if path.stem == "__init__" else f"service.api.{path.stem}"


def _defines_router(tree: ast.Module) -> bool:
    """The module builds an APIRouter (`APIRouter(...)` or `fastapi.APIRouter(...)`)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name == "APIRouter":
                return True
    return False


def _imported_modules(tree: ast.Module) -> set[str]:
    """Every module an import statement may name: `from a.b import c` names a.b and a.b.c."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative to service.api (or above it)
                package = "service.api".rsplit(".", node.level - 1)[0]
                base = f"{package}.{base}" if base else package
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def router_modules(api_dir: Path) -> dict[str, ast.Module]:
    trees = {_module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(api_dir.glob("*.py"))}
    return {name: tree for name, tree in trees.items() if _defines_router(tree)}


def cross_imports(api_dir: Path) -> dict[str, set[str]]:
    """Router module -> the other router modules it imports (the aggregator excepted)."""
    routers = router_modules(api_dir)
    found = {
        name: (_imported_modules(tree) & set(routers)) - {name}
        for name, tree in routers.items()
        if name != AGGREGATOR
    }
    return {name: imported for name, imported in found.items() if imported}


def test_the_check_sees_the_routers() -> None:
    routers = set(router_modules(API_DIR))
    assert {"service.api.plans", "service.api.estimates", "service.api.clusters", AGGREGATOR} <= routers
    assert "service.api.deps" not in routers and "service.api.problems" not in routers


def test_no_router_imports_another_router() -> None:
    assert cross_imports(API_DIR) == {}, "move what routers share to service.planning"


def test_a_router_importing_a_router_is_caught(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from fastapi import APIRouter\nrouter = APIRouter()\n")
    (tmp_path / "b.py").write_text(
        "import fastapi\nfrom service.api.a import router as other\nrouter = fastapi.APIRouter()\n"
    )
    (tmp_path / "c.py").write_text("from fastapi import APIRouter\nfrom . import b\nrouter = APIRouter()\n")
    (tmp_path / "helpers.py").write_text("from service.api import a\n")  # not a router: allowed
    assert cross_imports(tmp_path) == {"service.api.b": {"service.api.a"}, "service.api.c": {"service.api.b"}}
