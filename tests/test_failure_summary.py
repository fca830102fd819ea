"""A run with failed samples says why in its summary line: counts per status and the first failure."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from odecli.cli import app
from odecli.report.failures import FailureTally

SPEC = """kind: ode
name: blowup
system:
  states: [x]
  equations: {x: "x**2"}
initial: {x: [0.0, 2.0, 1.0]}
time: {start: 0.0, end: 2.0, eval: 5}
"""


def test_the_summary_names_the_statuses_and_the_first_failure(tmp_path):
    spec = tmp_path / "blowup.yaml"
    spec.write_text(SPEC)
    result = CliRunner().invoke(app, ["solve", str(spec), "-o", str(tmp_path / "run.h5")])
    assert result.exit_code == 3, result.output
    # x' = x^2 from x0 blows up at t = 1/x0: sample 1 (x0 = 2) at 0.5, sample 2 (x0 = 1) at 1.
    line = result.output.strip().splitlines()[-1]
    assert "1 succeeded, 2 failed (2 step size below dt_min; first: sample 1 stopped at t = 0.5)" in line


def test_chunks_in_any_order_give_the_lowest_failing_sample():
    tally = FailureTally()
    tally.add(10, np.array([0, 4]), np.array([1.0, 0.25]))
    tally.add(0, np.array([0, 0, 3]), np.array([1.0, 1.0, 0.75]))
    tally.add(5, np.array([0]), np.array([1.0]))
    assert tally.failed == 2
    assert tally.clause() == " (1 max_steps reached, 1 non-finite values; first: sample 2 stopped at t = 0.75)"
    assert FailureTally().clause() == ""


def test_a_python_right_hand_side_says_it_ran_on_the_pytorch_loop(tmp_path):
    (tmp_path / "rhs.py").write_text("def f(t, y, p):\n    return -y\n")
    spec = tmp_path / "decay.yaml"
    spec.write_text("kind: ode\nname: decay\nsystem:\n  states: [x]\n  python: rhs.py:f\n"
                    "initial: {x: [1.0, 2.0]}\ntime: {start: 0.0, end: 1.0}\n")
    result = CliRunner().invoke(app, ["solve", str(spec), "-o", str(tmp_path / "run.h5")])
    assert result.exit_code == 0, result.output
    assert "on the PyTorch loop (a python: right-hand side" in result.output
    assert "equations:" in result.output
