"""validate, schema and init: every problem listed, schemas that accept the examples, starters that run."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from odecli.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted(
    p for p in list((ROOT / "examples").glob("*.yaml")) + list((ROOT / "problems").rglob("*.yaml"))
    if not p.name.endswith(".reference.yaml")
)
ODE_EXAMPLES = [p for p in SPECS if yaml.safe_load(p.read_text()).get("kind") == "ode"]
PDE_EXAMPLES = [p for p in SPECS if yaml.safe_load(p.read_text()).get("kind") == "pde-inverse"]

BAD = """\
kind: ode
system:
  states: [x]
  equations: {x: foo}
initial: {x: [1, 2]}
time: {start: 0, end: 1}
solver: {rtol: -1, method: rk9}
"""


def test_validate_lists_every_problem_with_its_field(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text(BAD)
    result = runner.invoke(app, ["validate", str(spec)])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    fields = {line.split(": ")[2] for line in errors}
    assert {"system.equations.x", "solver.rtol", "solver.method"} <= fields, result.output


def test_validate_accepts_a_good_spec_and_flags_python_code(tmp_path):
    (tmp_path / "rhs.py").write_text("def f(t, y, p):\n    return -y\n")
    spec = tmp_path / "py.yaml"
    spec.write_text("kind: ode\nsystem: {states: [x], python: rhs.py:f}\ninitial: {x: 1.0}\ntime: {start: 0, end: 1}\n")
    result = runner.invoke(app, ["validate", str(spec)])
    assert result.exit_code == 0, result.output
    assert "runs Python code" in result.output and "valid ode spec" in result.output


def test_init_writes_a_starter_that_validates_and_solves(tmp_path):
    target = tmp_path / "starter.yaml"
    assert runner.invoke(app, ["init", "ode", "-o", str(target)]).exit_code == 0
    assert "#" in target.read_text()  # commented
    assert runner.invoke(app, ["init", "ode", "-o", str(target)]).exit_code == 2  # no silent overwrite
    assert runner.invoke(app, ["validate", str(target)]).exit_code == 0
    result = runner.invoke(app, ["solve", str(target), "-o", str(tmp_path / "run.h5"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["init", "nonsense"]).exit_code == 2


def _ode_schema() -> dict:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    document = json.loads(result.output)
    jsonschema.Draft202012Validator.check_schema(document)
    return document


def test_schema_accepts_every_bundled_spec_of_both_kinds():
    document = _ode_schema()
    assert set(document["$defs"]) == {"ode", "pde-inverse"}
    assert ODE_EXAMPLES and PDE_EXAMPLES, "expected bundled specs of both kinds"
    for path in ODE_EXAMPLES + PDE_EXAMPLES:
        jsonschema.validate(yaml.safe_load(path.read_text()), document)


@pytest.mark.parametrize("kind", ["ode", "pde-inverse"])
def test_every_starter_spec_validates(tmp_path, kind):
    target = tmp_path / f"{kind}.yaml"
    assert runner.invoke(app, ["init", kind, "-o", str(target)]).exit_code == 0
    result = runner.invoke(app, ["validate", str(target)])
    assert result.exit_code == 0, result.output
    jsonschema.validate(yaml.safe_load(target.read_text()), _ode_schema())


@pytest.mark.parametrize(
    "change",
    [
        {"kind": "odd"},
        {"solver": {"rtol": -1}},
        {"solver": {"method": "rk9"}},
        {"time": {"start": 0}},
        {"system": {"states": ["x"]}},
        {"unknown_key": 1},
    ],
)
def test_schema_rejects_bad_ode_specs(change):
    document = _ode_schema()
    spec = {"kind": "ode", "system": {"states": ["x"], "equations": {"x": "-x"}}, "initial": {"x": 1.0},
            "time": {"start": 0, "end": 1}}
    spec.update(change)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(spec, document)


@pytest.mark.parametrize("change", [{"equation": "maxwell"}, {"grid": {"shape": [2, 2], "spacing": 1}}, {"bogus": 1},
                                    {"unknown": {"type": "spline"}}, {"compute": {"device": "banana"}},
                                    {"compute": {"device": 5}}])
def test_schema_rejects_bad_pde_specs(change):
    document = _ode_schema()
    spec = yaml.safe_load(PDE_EXAMPLES[0].read_text())
    spec.update(change)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(spec, document)


def test_train_inverse_logs_and_never_overwrites_without_force(tmp_path):
    spec, out, log = tmp_path / "fit.yaml", tmp_path / "fit.h5", tmp_path / "run.log"
    assert runner.invoke(app, ["init", "pde-inverse", "-o", str(spec)]).exit_code == 0
    args = ["train-inverse", str(spec), "-o", str(out), "--iterations", "1", "--quiet"]
    result = runner.invoke(app, [*args, "--log", str(log)])
    assert result.exit_code == 0, result.output
    assert out.is_file()
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and "finished with exit code 0" in lines[1]
    before = out.stat().st_mtime_ns
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "--force" in result.output
    assert out.stat().st_mtime_ns == before
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0
