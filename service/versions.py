"""Versions stored with every plan: digests of the content that decides its numbers.

`estimator_version()` digests the estimator's source (`service/estimator/**/*.py`) and the
catalog, its loaders (`service/catalog/*.py`: they convert the units) and its data
(`service/catalog/*.toml`). Any change of a formula or a number changes the version; comments,
formatting and docstrings do not: Python counts as its syntax tree, TOML as its parsed value.
Reads files, so it lives outside the pure estimator. Standard library only.
"""

from __future__ import annotations

import ast
import hashlib
import json
import tomllib
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

SERVICE_DIR = Path(__file__).resolve().parent
ESTIMATOR_SOURCES = ("estimator/**/*.py", "catalog/*.py")
ESTIMATOR_DATA = ("catalog/*.toml",)


@cache
def estimator_version() -> str:
    return content_digest(SERVICE_DIR, ESTIMATOR_SOURCES, ESTIMATOR_DATA)


def content_digest(root: Path, sources: Sequence[str], data: Sequence[str]) -> str:
    """16 hex digits over every file the glob patterns match under `root`, each by its path and
    its canonical content."""
    kinds: list[tuple[Sequence[str], Callable[[str], str]]] = [
        (sources, canonical_python),
        (data, canonical_toml),
    ]
    files: dict[str, tuple[Path, Callable[[str], str]]] = {}
    for patterns, canonical in kinds:
        for pattern in patterns:
            files |= {p.relative_to(root).as_posix(): (p, canonical) for p in root.glob(pattern)}
    digest = hashlib.sha256()
    for name in sorted(files):
        path, canonical = files[name]
        digest.update(f"{name}\0{canonical(path.read_text(encoding='utf-8'))}\0".encode())
    return digest.hexdigest()[:16]


def canonical_python(source: str) -> str:
    """The syntax tree without docstrings; fields left empty are omitted, so a newer Python that
    adds fields (3.12's type_params) gives the same text for the same code."""
    return json.dumps(_tree(_without_docstrings(ast.parse(source))), separators=(",", ":"))


def canonical_toml(text: str) -> str:
    return json.dumps(tomllib.loads(text), sort_keys=True, separators=(",", ":"), default=str)


def _without_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and _is_str(first.value):
                del node.body[0]
    return tree


def _is_str(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _tree(node: Any) -> Any:
    if isinstance(node, ast.AST):
        fields = {
            name: _tree(value) for name, value in ast.iter_fields(node) if value is not None and value != []
        }
        return [type(node).__name__, fields]
    if isinstance(node, list):
        return [_tree(item) for item in node]
    return repr(node)  # a constant (str, int, float, bytes, bool, None, Ellipsis) or an identifier
