"""``python: rhs.py:function`` right-hand sides: a wrong result, an argument modified in place or an
exception of the user's code is one line naming the spec, the field and the function, exit 2."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import pytest
from typer.testing import CliRunner

from odecli.cli import app
from odecli.specs import parse_ode_spec
from odecli.specs.rhs import python_errors
from tests.mpi_helpers import run_mpi

SPEC = """\
kind: ode
system: {states: [x, v], params: {k: [1, 2]}, python: rhs.py:F}
initial: {x: 1, v: 0}
time: {start: 0, end: 1, eval: 3}
"""
GOOD = "return -p['k'][:, None] * y"  # x(t) = exp(-k t)
FIT = """\
kind: ode
name: decay-fit
system: {states: [x, v], params: {k: [1, 2]}, python: rhs.py:F}
initial: {x: 1, v: 0}
time: {start: 0, end: 1, eval: 3}
solver: {adjoint: %s, device: cpu}
inverse:
  unknowns: {params: {k: {per_sample: true, init: 1.5, bounds: [0.1, 5.0]}}}
  data: {truth: {params: {k: [1.0, 2.0]}}}
  observed: [x]
  optimizer: {type: lbfgs, iterations: 2}
"""
CLI = Path(__file__).parent / "mpi_scripts" / "ode_cli.py"
runner = CliRunner()


def _write(folder: Path, body: str, spec: str = SPEC, head: str = "import torch\n") -> Path:
    (folder / "rhs.py").write_text(f"{head}\ndef F(t, y, p):\n" + "".join(f"    {line}\n" for line in body.split("\n")))
    path = folder / "spec.yaml"
    path.write_text(spec)
    return path


def _one_error_line(result) -> str:
    """The single line a failed command prints (its exit code checked by the caller)."""
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def _solve(spec: Path, *flags: str):
    return runner.invoke(app, ["solve", str(spec), "-o", str(spec.parent / "out.h5"), "-q", *flags])


@pytest.mark.parametrize("body, message", [
    ("return y[:, :1]", "rhs.py:F returned shape (2, 1), expected (2, 2) (batch, states)"),
    ("return -y[:1]", "rhs.py:F returned shape (1, 2), expected (2, 2)"),
    ("return torch.tensor(-1.0)", "rhs.py:F returned shape (), expected (2, 2)"),
    ("return (-y).numpy()", "rhs.py:F returned ndarray, expected a torch.Tensor of shape (2, 2)"),
    ("return -y.float()", "rhs.py:F returned float32 on cpu, expected y's float64 on cpu"),
    ("y.mul_(-1)\nreturn y", "rhs.py:F modified y in place; it must leave its arguments unchanged"),
    ("p['k'].mul_(2)\nreturn -y", "rhs.py:F modified p['k'] in place"),
    ("raise ValueError('boom')", "rhs.py:F raised ValueError: boom (line 4)"),
    ("return {}['missing']", "rhs.py:F raised KeyError: 'missing' (line 4)"),
    ("return None + y", "rhs.py:F raised TypeError: unsupported operand type(s) for +: 'NoneType' and 'Tensor'"),
])
def test_a_bad_function_is_one_line_naming_spec_field_and_function(tmp_path, body, message):
    spec = _write(tmp_path, body)
    result = _solve(spec)
    assert result.exit_code == 2, result.output
    assert _one_error_line(result).startswith(f"error: {spec}: system.python: {message}")
    assert not (tmp_path / "out.h5").exists()


def test_a_function_with_the_wrong_arguments_is_named(tmp_path):
    (tmp_path / "rhs.py").write_text("def F(t, y):\n    return -y\n")
    (tmp_path / "spec.yaml").write_text(SPEC)
    result = _solve(tmp_path / "spec.yaml")
    assert result.exit_code == 2, result.output
    line = _one_error_line(result)
    assert line.endswith("system.python: rhs.py:F raised TypeError: F() takes 2 positional arguments but 3 were given")


def test_a_module_that_fails_to_import_names_spec_and_field(tmp_path):
    spec = _write(tmp_path, GOOD, head="import torch\nimport no_such_module_here\n")
    result = _solve(spec)
    assert result.exit_code == 2, result.output
    assert _one_error_line(result) == (
        f"error: {spec}: system.python: cannot load rhs.py:F: ModuleNotFoundError: "
        "No module named 'no_such_module_here' (line 2)")


@pytest.mark.parametrize("method", ["dopri5", "rodas5", "kvaerno5"])
def test_an_error_after_the_first_call_is_named_too(tmp_path, method):
    """The probe at t = 0 passes; the solve itself (RK stages, or an implicit method's Jacobian) raises."""
    spec = _write(tmp_path, f"if bool((t > 0.5).any()):\n    raise ValueError('late\\nsecond line')\n{GOOD}")
    result = _solve(spec, "--method", method)
    assert result.exit_code == 2, result.output
    line = _one_error_line(result)
    assert line == f"error: {spec}: system.python: rhs.py:F raised ValueError: late second line (line 5)"


@pytest.mark.parametrize("method", ["dopri5", "rodas5"])
def test_a_correct_function_still_solves(tmp_path, method):
    spec = _write(tmp_path, GOOD)
    result = _solve(spec, "--method", method)
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "out.h5") as h5:
        x_end = h5["y"][:, -1, 0]
    assert x_end == pytest.approx([math.exp(-1), math.exp(-2)], rel=1e-5)


def test_a_function_in_another_folder_is_shown_by_its_path(tmp_path):
    spec = _write(tmp_path, "return y[:, :1]", spec=SPEC.replace("rhs.py:F", "model/rhs.py:F"))
    (tmp_path / "model").mkdir()
    (tmp_path / "rhs.py").rename(tmp_path / "model" / "rhs.py")
    result = _solve(spec)
    assert result.exit_code == 2 and "system.python: model/rhs.py:F returned shape (2, 1)" in result.output


def test_errors_of_odecli_itself_are_not_blamed_on_the_function(tmp_path):
    (tmp_path / "rhs.py").write_text("def F(t, y, p):\n    return -y\n")
    spec = parse_ode_spec({"kind": "ode", "system": {"states": ["x"], "python": "rhs.py:F"},
                           "initial": {"x": 1.0}, "time": {"start": 0, "end": 1}}, "", str(tmp_path / "spec.yaml"))
    with pytest.raises(RuntimeError, match="^not the user's$"):
        with python_errors(spec):
            raise RuntimeError("not the user's")


@pytest.mark.parametrize("adjoint, body, message", [
    ("direct", "return y[:, :1]", "rhs.py:F returned shape (2, 1), expected (2, 2)"),
    ("direct", "y.mul_(-1)\nreturn y", "rhs.py:F modified y in place"),
    # backsolve calls the function again in the gradient's reverse solve, with y requiring grad
    ("backsolve", f"if y.requires_grad:\n    raise ValueError('in the gradient')\n{GOOD}",
     "rhs.py:F raised ValueError: in the gradient (line 5)"),
])
def test_train_inverse_reports_a_bad_function_the_same_way(tmp_path, adjoint, body, message):
    spec = _write(tmp_path, body, spec=FIT % adjoint)
    result = runner.invoke(app, ["train-inverse", str(spec), "-o", str(tmp_path / "fit.h5"), "-q"])
    assert result.exit_code == 2, result.output
    assert _one_error_line(result).startswith(f"error: {spec}: system.python: {message}")


def test_train_inverse_with_a_correct_function_fits(tmp_path):
    spec = _write(tmp_path, GOOD, spec=FIT % "direct")
    result = runner.invoke(app, ["train-inverse", str(spec), "-o", str(tmp_path / "fit.h5"), "-q"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "fit.h5").exists()


def test_every_rank_rejects_a_bad_function_before_solving(tmp_path):
    spec = _write(tmp_path, "return y[:, :1]")
    p = run_mpi(CLI, 2, ["solve", str(spec), "-o", str(tmp_path / "out.h5")], timeout=90)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("system.python: rhs.py:F returned shape (2, 1), expected (2, 2)") == 1, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "out.h5").exists()


LATER = "if bool((t > 0).any()):\n    {bad}\nreturn -p['k'][:, None] * y"  # right on the probe at t = 0


@pytest.mark.parametrize("method", ["dopri5", "rodas5"])
@pytest.mark.parametrize("bad, message", [
    ("return y[:, :1]", "rhs.py:F returned shape ("),
    ("return None", "rhs.py:F returned NoneType, expected a torch.Tensor of shape ("),
    ("return (-y).float()", "rhs.py:F returned float32 on cpu, expected y's float64 on cpu"),
    ("y.mul_(-1)\n    return y.clone()", "rhs.py:F modified y or a parameter in place"),
    ("p['k'].add_(1)\n    return -y", "rhs.py:F modified y or a parameter in place"),
])
def test_a_function_that_goes_wrong_after_the_probe_is_caught_on_that_call(tmp_path, bad, message, method):
    """Issue 42: after the first (probed) call, a wrong shape broadcast or an in-place change ran to
    exit 0 with wrong trajectories, and None was an internal error. Every call is checked now."""
    spec = _write(tmp_path, LATER.format(bad=bad))
    result = _solve(spec, "--method", method)
    assert result.exit_code == 2, result.output
    assert _one_error_line(result).startswith(f"error: {spec}: system.python: {message}")
    assert not (tmp_path / "out.h5").exists()


def test_a_late_wrong_shape_in_a_fit_is_caught_too(tmp_path):
    spec = _write(tmp_path, LATER.format(bad="return y[:, :1]"), spec=FIT % "direct")
    result = runner.invoke(app, ["train-inverse", str(spec), "-o", str(tmp_path / "fit.h5"), "-q"])
    assert result.exit_code == 2, result.output
    assert "system.python: rhs.py:F returned shape (" in _one_error_line(result)


def test_a_late_wrong_shape_on_one_of_two_ranks_ends_both(tmp_path):
    """Only the second sample's rank sees t > 0.5 with k = 2 ... the error is that rank's alone."""
    body = "if bool((p['k'] > 1.5).any()) and bool((t > 0.2).any()):\n    return y[:, :1]\n" + GOOD
    spec = _write(tmp_path, body)
    p = run_mpi(CLI, 2, ["solve", str(spec), "-o", str(tmp_path / "out.h5")], timeout=90)
    assert p.returncode == 2, p.stderr
    assert "system.python: rhs.py:F returned shape (" in p.stderr + p.stdout
