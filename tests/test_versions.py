"""The estimator version stored on plans is a digest of what decides the numbers: it changes
with any number in the catalog or the estimator's code, and not with comments or formatting."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from service.versions import ESTIMATOR_DATA, ESTIMATOR_SOURCES, SERVICE_DIR, content_digest, estimator_version

NUMBER_LINE = re.compile(r"^(\w+) = ([0-9][0-9_.e+]*)$", re.MULTILINE)
PROBE = '''"""A module of the estimator."""

FACTOR = 2.5  # a constant


def scaled(x: float) -> float:
    """x times FACTOR."""
    return x * FACTOR
'''


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the estimator and the catalog, with one module of our own."""
    for package in ("estimator", "catalog"):
        shutil.copytree(
            SERVICE_DIR / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    (tmp_path / "estimator" / "probe.py").write_text(PROBE)
    return tmp_path


def digest(root: Path) -> str:
    return content_digest(root, ESTIMATOR_SOURCES, ESTIMATOR_DATA)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_the_version_is_the_digest_of_the_installed_tree() -> None:
    assert estimator_version() == digest(SERVICE_DIR)
    assert re.fullmatch(r"[0-9a-f]{16}", estimator_version())


def test_a_number_in_a_catalog_file_changes_it(tree: Path) -> None:
    before = digest(tree)
    gpus = tree / "catalog" / "gpus.toml"
    line = NUMBER_LINE.search(gpus.read_text())
    assert line is not None
    name, value = line.groups()
    changed = str(int(value) + 1) if value.replace("_", "").isdigit() else repr(float(value) * 1.01)
    edit(gpus, line.group(0), f"{name} = {changed}")
    assert digest(tree) != before


def test_comments_and_formatting_of_a_catalog_file_do_not_change_it(tree: Path) -> None:
    before = digest(tree)
    gpus = tree / "catalog" / "gpus.toml"
    line = NUMBER_LINE.search(gpus.read_text())
    assert line is not None
    spaced = f"{line.group(1)}   =   {line.group(2)}   # checked against the datasheet again"
    edit(gpus, line.group(0), f"# a comment-only edit\n{spaced}")
    assert digest(tree) == before


def test_a_number_in_the_estimators_code_changes_it(tree: Path) -> None:
    before = digest(tree)
    edit(tree / "estimator" / "probe.py", "FACTOR = 2.5", "FACTOR = 2.6")
    assert digest(tree) != before


def test_comments_docstrings_and_formatting_of_the_code_do_not_change_it(tree: Path) -> None:
    before = digest(tree)
    probe = tree / "estimator" / "probe.py"
    edit(probe, "FACTOR = 2.5  # a constant", "# why 2.5: see the paper\nFACTOR = (\n    2.5\n)")
    edit(probe, '"""x times FACTOR."""', '"""x, scaled by FACTOR (a better docstring)."""')
    edit(probe, '"""A module of the estimator."""', '"""The probe module."""\n\n# more prose')
    assert digest(tree) == before


def test_a_new_module_in_a_subpackage_changes_it(tree: Path) -> None:
    before = digest(tree)
    (tree / "estimator" / "memory_parts").mkdir()
    (tree / "estimator" / "memory_parts" / "weights.py").write_text("BYTES = 2\n")
    assert digest(tree) != before
