"""Every target over a grid of layouts: each either renders artifacts that pass the static checks
(and bash -n / shellcheck for scripts) or says why the layout cannot be expressed there."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

from service.estimator.types import Framework, Offload, Plan
from service.launchers import RENDERERS, Artifact, Target, Unsupported, deepspeed, render
from tests.launchers.checks import check_artifact
from tests.launchers.grid import grid

GRID = grid()


@cache
def rendered() -> list[tuple[str, Plan, Target, list[Artifact] | str]]:
    """(case, plan, target, artifacts or the unsupported reason) for the whole grid."""
    out: list[tuple[str, Plan, Target, list[Artifact] | str]] = []
    for name, plan in GRID:
        for target, renderer in RENDERERS.items():
            try:
                out.append((name, plan, target, renderer(plan)))
            except Unsupported as exc:
                assert exc.target is target
                out.append((name, plan, target, exc.reason))
    return out


def test_grid_is_large_and_covers_every_dimension() -> None:
    assert len(GRID) > 500
    layouts = [p.layout for _, p in GRID]
    assert {lo.zero_stage for lo in layouts} == {0, 1, 2, 3}
    assert {p.cluster.num_nodes for _, p in GRID} == {1, 2, 4}
    assert {lo.offload_params for lo in layouts} == set(Offload)


def test_every_target_renders_or_gives_a_reason() -> None:
    for name, plan, target, result in rendered():
        if isinstance(result, str):
            assert len(result) > 10, (name, target)
            continue
        assert result, (name, target)
        for artifact in result:
            assert artifact.target is target
            check_artifact(artifact, plan)


def test_each_framework_has_a_native_target_for_plain_layouts() -> None:
    """None of the common layouts is rejected by the framework's own target."""
    native = {Framework.DEEPSPEED: Target.DEEPSPEED, Framework.MEGATRON: Target.MEGATRON}
    for name, plan, target, result in rendered():
        lo = plan.layout
        if native.get(lo.framework) is not target:
            continue
        plain_ds = lo.framework is Framework.DEEPSPEED and lo.cp == 1 and lo.pp == 1 and lo.tp == 1
        plain_ds = plain_ds and (lo.offload_params is Offload.NONE or lo.zero_stage == 3)
        plain_ds = plain_ds and (lo.offload_optimizer is not Offload.NVME or lo.zero_stage == 3)
        plain_ds = plain_ds and (lo.offload_optimizer is Offload.NONE or lo.zero_stage > 0)
        plain_ds = plain_ds and (plan.training.precision != "bf16_pure" or lo.zero_stage > 0)
        plain_mg = (
            lo.framework is Framework.MEGATRON and lo.zero_stage <= 1 and lo.offload_params is Offload.NONE
        )
        plain_mg = (
            plain_mg and lo.offload_optimizer is Offload.NONE and plan.training.precision != "bf16_pure"
        )
        if plain_ds or plain_mg:
            assert not isinstance(result, str), (name, target, result)
    for target in (Target.SLURM, Target.KUBERNETES):
        ok = [r for _, _, t, r in rendered() if t is target and not isinstance(r, str)]
        assert len(ok) > len(GRID) // 8, target


def test_render_collects_artifacts_and_reasons() -> None:
    _, plan = GRID[0]
    artifacts, unsupported = render(plan)
    names = [a.name for a in artifacts]
    assert len(names) == len(set(names))
    assert set(unsupported) | {a.target for a in artifacts} <= set(Target)
    assert all(reason for reason in unsupported.values())


def _scripts() -> dict[str, str]:
    """One script per shape: scripts that differ only in numbers check the same way."""
    unique: dict[str, tuple[str, str]] = {}
    for _, _, _, result in rendered():
        if isinstance(result, str):
            continue
        for artifact in result:
            if artifact.media_type == "text/x-shellscript":
                shape = re.sub(r"[0-9]+", "N", artifact.content)
                unique.setdefault(shape, (artifact.content, artifact.name))
    return {f"{i:04d}-{name}": text for i, (text, name) in enumerate(unique.values())}


def _write_scripts(tmp_path: Path) -> list[Path]:
    paths = []
    for name, text in _scripts().items():
        path = tmp_path / name
        path.write_text(text)
        paths.append(path)
    return paths


def test_scripts_pass_bash_n(tmp_path: Path) -> None:
    paths = _write_scripts(tmp_path)
    assert paths
    loop = 'for f in "$@"; do bash -n "$f" || { echo "FAILED $f"; exit 1; }; done'
    result = subprocess.run(["bash", "-c", loop, "_", *map(str, paths)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_scripts_pass_shellcheck(tmp_path: Path) -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    paths = _write_scripts(tmp_path)
    result = subprocess.run(["shellcheck", "--shell=bash", *map(str, paths)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[:4000]


def test_accelerate_deepspeed_ships_the_deepspeed_targets_ds_config() -> None:
    """Wherever Accelerate runs DeepSpeed, it ships ds_config.json byte for byte as the deepspeed
    target does, and its YAML points there (so DeepSpeed runs the estimate's buckets)."""
    results = {(name, target): result for name, _, target, result in rendered()}
    count = 0
    for name, plan in GRID:
        ours = results[name, Target.ACCELERATE]
        if plan.layout.framework is not Framework.DEEPSPEED or isinstance(ours, str):
            continue
        theirs = results[name, Target.DEEPSPEED]
        (mine,) = [a.content for a in ours if a.name == "ds_config.json"]
        if plan.layout.cp > 1:  # Ulysses: the deepspeed launcher cannot ask for it, ds_config the same
            assert isinstance(theirs, str) and "Ulysses" in theirs, name
            assert mine == json.dumps(deepspeed.ds_config(plan), indent=2) + "\n", name
            count += 1
            continue
        assert not isinstance(theirs, str), (name, theirs)
        (shipped,) = [a.content for a in theirs if a.name == "ds_config.json"]
        assert mine == shipped, name
        (config,) = [a.content for a in ours if a.name == "accelerate_config.yaml"]
        assert "deepspeed_config_file: ds_config.json" in config, name
        render(plan)  # raises if two targets' ds_config.json differ
        count += 1
    assert count > 20
