"""The layers hold: import-linter's contracts (pyproject.toml) pass on the tree, and break when a
numerics module imports h5py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
pytestmark = pytest.mark.skipif(LINT is None, reason="import-linter is not installed")


def _lint(root: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(root), "PATH": str(Path(sys.executable).parent)}
    return subprocess.run([LINT, "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_layer_contracts_hold():
    run = _lint(ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "BROKEN" not in run.stdout


def test_a_numerics_module_that_imports_h5py_breaks_the_contract(tmp_path):
    shutil.copytree(ROOT / "odecli", tmp_path / "odecli", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    stages = tmp_path / "odecli" / "ode" / "stages.py"
    stages.write_text("import h5py  # a numerics module reaching for files\n" + stages.read_text())
    run = _lint(tmp_path)
    assert run.returncode != 0
    assert "odecli.ode is not allowed to import h5py" in run.stdout
