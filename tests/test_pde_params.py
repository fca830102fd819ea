"""Several named parameters, steady equations and the linear solver's settings, from spec to
result file: the several-parameter plumbing on a test equation with known physics
(tests/pde_twin_equation.py: heat2d with kappa = a*b), poisson2d through the command line
(train-inverse -> stats -> plot, 1 rank against 2), and the one-line errors of bad input."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import h5py
import jsonschema
import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from odecli.cli import app
from odecli.errors import SpecError
from odecli.parallel.comm import get_comm
from odecli.specs import pde as pde_spec

sys.path.insert(0, str(Path(__file__).parent))
import pde_twin_equation as twin  # noqa: E402
from mpi_helpers import run_mpi  # noqa: E402

sys.path.pop(0)

DARCY = {
    "kind": "pde-inverse",
    "equation": "poisson2d",
    "grid": {"shape": [25, 25], "spacing": 1.0},
    "boundary": {"type": "dirichlet", "value": 0.0, "left": "neumann"},
    "sources": {"amplitude": 1.0, "positions": [[6, 6], [6, 18], [18, 12]]},
    "receivers": {"line": [{"from": [3, 3], "to": [3, 21], "count": 5},
                           {"from": [12, 3], "to": [12, 21], "count": 5},
                           {"from": [21, 3], "to": [21, 21], "count": 5}]},
    "true_model": {"type": "gaussian", "background": 1.0, "amplitude": 1.5, "center": [12, 12], "sigma": 4},
    "unknown": {"type": "grid", "initial": 1.0, "bounds": [0.2, 4.0]},
    "solver": {"rtol": 1e-11},
    "optimizer": {"type": "lbfgs", "iterations": 4},
}
TWIN = {
    "kind": "pde-inverse",
    "equation": "heat2d_twin",
    "grid": {"shape": [20, 20], "spacing": 0.01},
    "time": {"dt": 0.01, "steps": 20},
    "boundary": {"type": "dirichlet"},
    "sources": {"wavelet": {"type": "constant"}, "amplitude": 50.0, "positions": [[0.1, 0.1], [0.05, 0.15]]},
    "receivers": {"positions": [[0.05, 0.05], [0.15, 0.15], [0.1, 0.05]]},
    "true_model": {"a": {"type": "gaussian", "background": 0.0003, "amplitude": 0.0002,
                         "center": [0.1, 0.1], "sigma": 0.03}, "b": 0.8},
    "unknown": {"type": "grid", "parameters": {"a": {"initial": 0.0003, "bounds": [0.0001, 0.001]}}},
    "optimizer": {"type": "lbfgs", "iterations": 3},
}


def _write(tmp_path: Path, raw: dict, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def _set(raw: dict, dotted: str, value) -> dict:
    raw = copy.deepcopy(raw)
    *path, last = dotted.split(".")
    node = raw
    for key in path:
        node = node.setdefault(key, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return raw


# ------------------------------------------------------------------ one-line errors
BAD = [
    (DARCY, "time", {"dt": 1.0, "steps": 3}, "time: poisson2d is steady"),
    (DARCY, "boundary", {"type": "neumann"}, "boundary: poisson2d needs at least one dirichlet side"),
    (DARCY, "solver.rtol", 0, "solver.rtol: must be > 0"),
    (DARCY, "solver.max_iterations", 0, "solver.max_iterations: must be >= 1"),
    (DARCY, "unknown.initial", 0.0, "unknown.initial: conductivity must be > 0, got 0"),
    (DARCY, "true_model.background", -1.0, "true_model.background: conductivity must be > 0"),
    (DARCY, "unknown.parameters", ["vp"], "unknown.parameters.vp: poisson2d has no parameter 'vp'"),
    (DARCY, "sources.wavelet", {"type": "ricker", "peak_frequency": 5}, "sources.wavelet: poisson2d is steady"),
    (DARCY, "sources.type", "fy", "sources.type: only elastic2d has source types"),
    (DARCY, "receivers.component", "vx", "receivers.component: only elastic2d receivers record a component"),
    (DARCY, "receivers.component", "vz", "receivers.component: expected one of"),
]


@pytest.mark.parametrize("base, key, value, message", BAD, ids=[b[1] + "=" + str(b[2]) for b in BAD])
def test_bad_input_is_one_line_from_validate_exit_2(tmp_path, base, key, value, message):
    spec = _write(tmp_path, _set(base, key, value))
    result = CliRunner().invoke(app, ["validate", str(spec)])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert "Traceback" not in result.output


def test_time_scheme_and_solver_belong_to_their_equations():
    acoustic = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "acoustic-anomaly.yaml").read_text())
    with pytest.raises(SpecError, match="time.scheme: only heat2d has an implicit scheme"):
        pde_spec.validate(_set(acoustic, "time.scheme", "implicit"), "a.yaml")
    with pytest.raises(SpecError, match="solver: only used by steady equations"):
        pde_spec.validate(_set(acoustic, "solver", {"rtol": 1e-8}), "a.yaml")


def test_a_solve_that_does_not_converge_is_one_line_naming_iterations_and_residual(tmp_path):
    spec = _write(tmp_path, _set(DARCY, "solver.max_iterations", 2))
    result = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(tmp_path / "o.h5"), "-q"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "solver: the linear solve did not converge" in errors[0], result.output
    assert "after 2 iterations" in errors[0] and "relative residual" in errors[0]


def test_the_schema_follows_the_validator_on_steady_specs():
    from odecli.specs.pde_schema import pde_inverse_schema

    validator = jsonschema.Draft202012Validator(pde_inverse_schema())
    assert validator.is_valid(DARCY)
    assert not validator.is_valid(_set(DARCY, "time", {"dt": 1.0, "steps": 3}))
    assert validator.is_valid(_set(DARCY, "unknown.parameters", ["kappa"]))
    assert validator.is_valid(_set(DARCY, "true_model", {"kappa": 2.0}))
    pde_spec.validate(_set(DARCY, "true_model", {"kappa": 2.0}), "d.yaml")  # both forms read
    acoustic = yaml.safe_load((Path(__file__).resolve().parents[1] / "examples" / "acoustic-anomaly.yaml").read_text())
    assert not validator.is_valid(_set(acoustic, "sources.wavelet", None))


# ------------------------------------------------------------------ poisson2d end to end
@pytest.fixture(scope="module")
def darcy_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("darcy")
    spec = _write(tmp, DARCY, "darcy.yaml")
    out = tmp / "darcy.h5"
    result = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    return spec, out


def test_poisson_fit_writes_steady_data_and_solver_iterations(darcy_run):
    _, out = darcy_run
    with h5py.File(out) as f:
        assert f["data/observed"].shape == (3, 15, 1) and f.attrs["steady"] == 1  # one 'step': the steady state
        assert f["data/predicted"].shape == (3, 15, 1) and list(f["data/time"][...]) == [0.0]
        its = f["history/solver_iterations_max"][...]
        assert its.shape == (4,) and np.all(its >= 1) and np.all(its <= 500)
        err = f["history/model_error"][...]
        assert err[-1] < 0.7 * err[0]
        assert json.loads(f.attrs["parameters"]) == ["kappa"]


def test_poisson_stats_and_plot(darcy_run, tmp_path):
    _, out = darcy_run
    result = CliRunner().invoke(app, ["stats", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["equation"] == "poisson2d" and summary["solver_iterations"]["max"] >= 1
    assert summary["data_shape"] == [3, 15, 1]
    table = CliRunner().invoke(app, ["stats", str(out)])
    assert "solver iterations / solve" in table.output
    png = tmp_path / "d.png"
    result = CliRunner().invoke(app, ["plot", str(out), "-o", str(png)])
    assert result.exit_code == 0 and png.stat().st_size > 10_000, result.output


def test_poisson_fit_on_two_ranks_equals_one_rank_to_the_solver_tolerance(darcy_run, tmp_path):
    spec, one = darcy_run
    two = tmp_path / "two.h5"
    main = Path(__file__).resolve().parents[1] / "odecli" / "__main__.py"
    proc = run_mpi(main, 2, ["train-inverse", str(spec), "-o", str(two), "-q"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(one) as a, h5py.File(two) as b:
        assert b.attrs["ranks"] == 2
        np.testing.assert_allclose(b["data/observed"][...], a["data/observed"][...], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(b["history/loss"][...], a["history/loss"][...], rtol=1e-6)
        np.testing.assert_allclose(b["fields/final"][...], a["fields/final"][...], rtol=1e-6)


# ------------------------------------------------------------------ several parameters
def test_several_parameters_read_naturally(monkeypatch):
    twin.register(monkeypatch)
    spec = pde_spec.validate(copy.deepcopy(TWIN), "t.yaml")
    assert spec["parameters"] == ["a", "b"] and list(spec["unknown"]["parameters"]) == ["a"]
    assert spec["unknown"]["fixed"] == {"b": {"type": "constant", "value": 0.8}}  # its true model
    listed = pde_spec.validate(_set(TWIN, "unknown", {"type": "grid", "parameters": ["b", "a"], "initial": 0.0003,
                                                      "bounds": [0.0001, 0.001]}), "t.yaml")
    assert list(listed["unknown"]["parameters"]) == ["a", "b"]  # the equation's order


TWIN_BAD = [
    ("unknown.parameters", {"c": {}}, "unknown.parameters.c: heat2d_twin has no parameter 'c'"),
    ("true_model", 0.5, "true_model: heat2d_twin has parameters a, b"),
    ("true_model.b", 1.5, "true_model: b must be <= 1 everywhere"),
    ("unknown.parameters.b", {"initial": -0.5}, "unknown: b must be > 0"),
    ("true_model.c", 1.0, "true_model.c: heat2d_twin has no parameter 'c'"),
    ("unknown.fixed", {"a": 0.0003}, "unknown.fixed.a: a is inverted"),
    ("unknown.parameters.a.bounds", [0.001, 0.0001], "unknown.parameters.a.bounds: lower bound must be below"),
    ("time.dt", 1.0, "time.dt: unstable: true_model.a reaches"),
]


@pytest.mark.parametrize("key, value, message", TWIN_BAD, ids=[b[0] for b in TWIN_BAD])
def test_several_parameters_bad_input(monkeypatch, key, value, message):
    twin.register(monkeypatch)
    with pytest.raises(SpecError) as info:
        pde_spec.validate(_set(TWIN, key, value), "t.yaml")
    assert message in str(info.value)


def test_a_parameter_neither_inverted_nor_known_must_be_given(monkeypatch):
    twin.register(monkeypatch)
    raw = _set(_set(TWIN, "true_model.b", None), "observed", {"file": "obs.h5"})
    with pytest.raises(SpecError, match="unknown.fixed.b: b is not inverted and has no true_model.b"):
        pde_spec.validate(raw, "t.yaml")


def _problem(raw):
    from odecli.app.pde_problem import Problem

    spec = pde_spec.validate(copy.deepcopy(raw), "t.yaml")
    spec["text"] = ""
    return Problem(spec, get_comm())


@pytest.mark.parametrize("kind", ["grid", "mlp", "scalars"])
def test_stacked_gradient_matches_finite_differences(monkeypatch, kind):
    twin.register(monkeypatch)
    raw = copy.deepcopy(TWIN)
    raw["unknown"] = {"type": "grid", "parameters": {"a": {"initial": 0.00035, "bounds": [0.0001, 0.001]},
                                                     "b": {"initial": 0.7, "bounds": [0.1, 0.95]}}}
    if kind == "mlp":
        raw["unknown"] = {"type": "mlp", "hidden": [6], "seed": 3, "features": "plain",
                          "parameters": {"a": {"base": 0.00035, "scale": 0.0001, "bounds": [0.0001, 0.001]},
                                         "b": {"base": 0.7, "scale": 0.1, "bounds": [0.1, 0.95]}}}
    if kind == "scalars":
        raw["unknown"] = {"type": "scalars", "parameters": {
            "a": {"model": {"type": "gaussian", "background": 0.00035, "amplitude": 0.0002, "center": [0.1, 0.1],
                            "sigma": 0.04}, "bounds": [0.0001, 0.001]},
            "b": {"model": 0.7, "bounds": [0.1, 0.95]}}}
    P = _problem(raw)
    with torch.no_grad():
        field = P.unknown.field()
    assert field.shape == (2, 20, 20)
    if kind == "scalars":
        assert P.unknown.names == ["a_background", "a_amplitude", "b_value"]
    _, grads = P.evaluate()
    gen = torch.Generator().manual_seed(0)
    # each parameter moved relative to its own size (a is ~1e-4, b ~1, a network's weights ~1)
    directions = [torch.randn(p.shape, generator=gen, dtype=p.dtype) * (p.detach().abs().max() + 1e-3 * (kind == "mlp"))
                  for p in P.unknown.params]
    directional = sum(float((g * d).sum()) for g, d in zip(grads, directions))
    h = 1e-6
    values = []
    for sign in (1, -1):
        with torch.no_grad():
            for p, d in zip(P.unknown.params, directions):
                p.add_(sign * h * d)
        values.append(P.evaluate()[0])
        with torch.no_grad():
            for p, d in zip(P.unknown.params, directions):
                p.sub_(sign * h * d)
    fd = (values[0] - values[1]) / (2 * h)
    assert abs(fd - directional) <= 1e-5 * abs(directional), (fd, directional)


def test_several_parameters_fit_writes_each_parameter(monkeypatch, tmp_path):
    twin.register(monkeypatch)
    spec = _write(tmp_path, TWIN, "twin.yaml")
    out = tmp_path / "twin.h5"
    result = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    with h5py.File(out) as f:
        assert {"true_a", "true_b", "initial_a", "final_a"} <= set(f["fields"])
        assert "final_b" not in f["fields"]  # b is fixed
        a = f["history/model_error_a"][...]
        np.testing.assert_allclose(f["history/model_error"][...], a)  # the only inverted parameter
        assert a[-1] < a[0]
        assert json.loads(f.attrs["inverted"]) == ["a"]
    summary = json.loads(CliRunner().invoke(app, ["stats", str(out), "--json"]).output)
    assert summary["model_errors"]["a"]["ratio"] < 1
    png = tmp_path / "t.png"
    assert CliRunner().invoke(app, ["plot", str(out), "-o", str(png)]).exit_code == 0


# ------------------------------------------------------------------ implicit heat2d
HEAT_IMPLICIT = {
    "kind": "pde-inverse",
    "equation": "heat2d",
    "grid": {"shape": [18, 18], "spacing": 0.01},
    "time": {"dt": 0.5, "steps": 8, "scheme": "implicit"},  # 10x forward Euler's limit at the true peak
    "solver": {"rtol": 1e-11, "max_iterations": 200},
    "boundary": {"type": "dirichlet", "left": "neumann"},
    "sources": {"wavelet": {"type": "constant"}, "amplitude": 5.0, "positions": [[0.05, 0.05], [0.12, 0.12]]},
    "receivers": {"line": {"from": [0.03, 0.03], "to": [0.14, 0.14], "count": 6}},
    "true_model": {"type": "gaussian", "background": 0.0002, "amplitude": 0.0003, "center": [0.08, 0.08],
                   "sigma": 0.03},
    "unknown": {"type": "grid", "initial": 0.0002, "bounds": [0.00005, 0.002]},
    "optimizer": {"type": "lbfgs", "iterations": 3},
}


def test_implicit_heat_takes_a_step_the_explicit_scheme_refuses():
    pde_spec.validate(copy.deepcopy(HEAT_IMPLICIT), "h.yaml")
    with pytest.raises(SpecError, match="time.dt: unstable: true_model reaches conductivity 0.0005"):
        pde_spec.validate(_set(_set(HEAT_IMPLICIT, "time.scheme", "explicit"), "solver", None), "h.yaml")


def test_implicit_heat_fit_on_two_ranks_equals_one_rank(tmp_path):
    spec = _write(tmp_path, HEAT_IMPLICIT, "heat.yaml")
    one, two = tmp_path / "one.h5", tmp_path / "two.h5"
    result = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(one), "-q"])
    assert result.exit_code == 0, result.output
    main = Path(__file__).resolve().parents[1] / "odecli" / "__main__.py"
    proc = run_mpi(main, 2, ["train-inverse", str(spec), "-o", str(two), "-q"], timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(one) as a, h5py.File(two) as b:
        assert a["history/solver_iterations_max"][0] >= 1
        err = a["history/model_error"][...]
        assert err[-1] < err[0]
        np.testing.assert_allclose(b["data/observed"][...], a["data/observed"][...], rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(b["history/loss"][...], a["history/loss"][...], rtol=1e-6)
        np.testing.assert_allclose(b["fields/final"][...], a["fields/final"][...], rtol=1e-6)
    summary = json.loads(CliRunner().invoke(app, ["stats", str(one), "--json"]).output)
    assert summary["solver_iterations"]["max"] >= 1
