"""Every ODE quickstart spec in examples/ runs as written through ``odecli solve``."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from odecli.cli import app

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _solvable(path: Path) -> bool:
    """`kind: ode` specs without an `inverse:` section (those are for `odecli train-inverse`)."""
    data = yaml.safe_load(path.read_text()) or {}
    return data.get("kind") == "ode" and "inverse" not in data


def _ode_examples() -> list[Path]:
    return [p for p in sorted(EXAMPLES.glob("*.yaml")) if _solvable(p)]


ODE_EXAMPLES = _ode_examples()


def test_quickstart_examples_exist():
    names = {p.stem for p in ODE_EXAMPLES}
    assert {"vdp-sweep", "lotka-volterra", "python-rhs", "fixed-step", "per-sample-spans", "pid-controller"} <= names


@pytest.mark.parametrize("spec", ODE_EXAMPLES, ids=lambda p: p.stem)
def test_example_solves(spec: Path, tmp_path: Path, monkeypatch):
    out = tmp_path / "out.h5"
    # Run from an unrelated folder, as a user would: a spec must not depend on the working directory.
    # In process (the CLI's subprocess behaviour is covered in test_cli.py): saves a torch import each.
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["solve", str(spec), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file()
    n_states = len(yaml.safe_load(spec.read_text())["system"]["states"])
    with h5py.File(out, "r") as f:
        t, y, status, t_final = f["t"][...], f["y"][...], f["status"][...], f["t_final"][...]
    assert y.ndim == 3 and y.shape[2] == n_states
    assert np.all((status == 0) | (status == 5))  # 5: ended at a terminal event (examples/bouncing-ball.yaml)
    assert np.all(np.isfinite(y[status == 0]))
    for i in np.flatnonzero(status == 5):  # values up to the event, none after it (either direction)
        before = (t[i] - t_final[i]) * np.sign(t[i, -1] - t[i, 0]) <= 0
        assert np.isfinite(y[i, before]).all() and np.isnan(y[i, ~before]).all()


@pytest.mark.parametrize("engine", ["torch", "native"])
def test_the_neural_ode_example_trains(engine: str, monkeypatch, capsys):
    """examples/neural_ode.py lowers its loss in 25 Adam steps, in the PyTorch loop and in the C solver."""
    import runpy
    import sys

    monkeypatch.setattr(sys, "argv", ["neural_ode.py", "--engine", engine, "--iterations", "25"])
    runpy.run_path(str(EXAMPLES / "neural_ode.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    first = float(next(line for line in lines if line.startswith("iter    0")).split("loss")[1].split()[0])
    final = float(next(line for line in lines if line.startswith("trained")).split("final loss")[1])
    assert final < 0.5 * first
    assert any(line.startswith("extrapolation to t=6") for line in lines)
