"""validate refuses specs that are certain to fail, and solve/train-inverse refuse them the same way
before allocating: non-finite equations at the initial state, a GPU that is not there, a PDE grid
larger than the machine's memory. One line naming the field, exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from odecli.cli import app

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ODE = """kind: ode
name: doomed
system:
  states: [x, v]
  params: {{k: [1.0, 2.0, 0.5]}}
  equations: {{x: v, v: "{rhs}"}}
initial: {{x: 1.0, v: 0.0}}
time: {{start: 0.0, end: 1.0}}
"""


def _one_error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("rhs, value, bad", [
    ("9**9**9**9 - x", "inf", 3),        # huge powers overflow to inf, never hang
    ("1/(k - 2) - x", "inf", 1),         # only sample 1 divides by zero
    ("-exp(1000) * k", "-inf", 3),
    ("log(x - 1)", "-inf", 3),
    ("sqrt(-k) + x", "nan", 3),
])
def test_equations_that_are_not_finite_at_the_initial_state(tmp_path, rhs, value, bad):
    spec = tmp_path / "doomed.yaml"
    spec.write_text(ODE.format(rhs=rhs))
    for command in (["validate", str(spec)], ["solve", str(spec), "-o", str(tmp_path / "run.h5")]):
        line = _one_error_line(runner.invoke(app, command))
        assert line.startswith(f"error: {spec}: system.equations.v: ") and f" is {value} at the initial state" in line
        first = 1 if bad == 1 else 0
        assert f"of sample {first} (t = 0)" in line
        assert ("2 other samples" in line) == (bad == 3)
    assert not (tmp_path / "run.h5").exists()


def test_finite_equations_pass(tmp_path):
    spec = tmp_path / "fine.yaml"
    spec.write_text(ODE.format(rhs="-k * x"))
    assert runner.invoke(app, ["validate", str(spec)]).exit_code == 0


def test_cuda_without_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    spec = tmp_path / "gpu.yaml"
    spec.write_text(ODE.format(rhs="-x") + "solver: {device: cuda}\n")
    line = _one_error_line(runner.invoke(app, ["validate", str(spec)]))
    assert "solver.device: device 'cuda' requested but CUDA is not available" in line


def test_a_pde_grid_larger_than_memory(tmp_path):
    text = (EXAMPLES / "acoustic-anomaly.yaml").read_text()
    text, n = re.subn(r"shape: \[\d+, \d+\]", "shape: [100000, 100000]", text)
    assert n == 1
    spec = tmp_path / "huge.yaml"
    spec.write_text(text)
    for command in (["validate", str(spec)], ["train-inverse", str(spec), "-o", str(tmp_path / "fit.h5")]):
        line = _one_error_line(runner.invoke(app, command))
        assert "grid.shape: a 100000 x 100000 grid" in line and "GiB of memory" in line
    assert not (tmp_path / "fit.h5").exists()


def _acoustic_variant(tmp_path, name: str, old: str, new: str) -> Path:
    text = (EXAMPLES / "acoustic-anomaly.yaml").read_text()
    text, n = re.subn(old, new, text)
    assert n == 1
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(text)
    return spec


def test_wave_fields_per_shot_count_against_memory(tmp_path, monkeypatch):
    """Six grid fields fit in 1 GiB at 4000 x 4000 (0.72 GiB), but each of the 6 shots holds its own
    wave fields: the bound counts two per shot (15 fields, 1.8 GiB) and refuses the grid."""
    from odecli.specs import feasibility

    monkeypatch.setattr(feasibility, "_physical_memory", lambda: float(2**30))
    spec = _acoustic_variant(tmp_path, "big", r"shape: \[\d+, \d+\]", "shape: [4000, 4000]")
    line = _one_error_line(runner.invoke(app, ["validate", str(spec)]))
    assert "grid.shape: a 4000 x 4000 grid with 6 shots" in line and "1.79 GiB" in line
    small = _acoustic_variant(tmp_path, "small", r"shape: \[\d+, \d+\]", "shape: [2000, 2000]")
    assert runner.invoke(app, ["validate", str(small)]).exit_code == 0


def test_an_mlp_too_wide_for_memory(tmp_path):
    spec = _acoustic_variant(tmp_path, "wide", r"unknown:\n  type: grid\n  initial: \{type: constant, value: 2000\}",
                             "unknown:\n  type: mlp\n  hidden: [100000, 100000]\n  base: 2000\n  scale: 300")
    line = _one_error_line(runner.invoke(app, ["validate", str(spec)]))
    assert "unknown.hidden: an MLP of 100000 x 100000 hidden units has" in line and "GiB of memory" in line


def test_a_smoothing_wider_than_the_grid(tmp_path):
    spec = _acoustic_variant(tmp_path, "smooth", r"optimizer: \{type: lbfgs, iterations: 15\}",
                             "optimizer: {type: lbfgs, iterations: 15, smoothing: 1.0e+9}")
    line = _one_error_line(runner.invoke(app, ["validate", str(spec)]))
    assert "optimizer.smoothing: at most the grid's larger side (60 cells), got 1e+09" in line
