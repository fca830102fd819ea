"""Event times as observations of ``train-inverse`` (issue 44): ``inverse.data.events``.

The references are independent of the fit: the parameter that generated the data (recovered by
the fit), analytic event times (a projectile's landing, an oscillator's zero crossings), and
central finite differences of the loss (its gradient through the located event times).
"""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from odecli.app.fit_ode import Problem, fit_ode, write_fit
from odecli.cli import app
from odecli.errors import SpecError
from odecli.parallel.comm import get_comm
from odecli.specs import parse_yaml
from odecli.specs.inverse import parse_ode_inverse_spec

G_TRUE = [9.0, 9.5, 10.0]

PROJECTILE = """
kind: ode
name: projectile
system:
  states: [h, v]
  params: {g: 9.81}
  equations: {h: v, v: -g}
initial: {h: 10.0, v: [1.0, 2.0, 3.0]}
batch: 3
time: {start: 0.0, end: 5.0, eval: 11}
events:
  - {name: ground, expression: h, direction: falling, terminal: true}
solver: {method: dopri5, rtol: 1.0e-10, atol: 1.0e-10}
inverse:
  unknowns:
    params:
      g: {init: 5.0, bounds: [1, 50]}
  data:
    truth: {params: {g: %(truth)s}}
    events: {ground: {}}
%(extra)s
"""

# x'' = -w2 x from x = 1: zero crossings at (2k - 1) pi / (2 sqrt(w2))
OSCILLATOR = """
kind: ode
name: oscillator
system:
  states: [x, v]
  params: {w2: [1.0, 2.0]}
  equations: {x: v, v: -w2 * x}
initial: {x: 1.0, v: 0.0}
batch: 2
time: {start: 0.0, end: 8.5, eval: 5}
events:
  - {name: zero, expression: x, direction: both}
solver: {method: dopri5, rtol: 1.0e-9, atol: 1.0e-11}
"""


def _parse(text: str):
    return parse_ode_inverse_spec(parse_yaml(text, "spec.yaml"), text, "spec.yaml")


def _landing(g: float, v0: float, h0: float = 10.0) -> float:
    return (v0 + math.sqrt(v0 * v0 + 2 * g * h0)) / g


def test_a_fit_to_landing_times_recovers_each_samples_gravity():
    ode, inv = _parse(PROJECTILE % {"truth": G_TRUE, "extra": ""})
    assert inv.observed == () and [e.name for e in inv.data.events] == ["ground"]
    result = fit_ode(ode, inv)
    assert np.allclose(result.fitted["g"], G_TRUE, rtol=1e-8, atol=0)
    # the observed times are the analytic landing times (to the solver's tolerance)
    exact = [_landing(g, v0) for g, v0 in zip(G_TRUE, (1.0, 2.0, 3.0))]
    assert np.allclose(result.event_data["ground"][:, 0], exact, rtol=1e-9)
    assert np.allclose(result.events["ground"][:, 0], exact, rtol=1e-9)
    assert result.history["loss"][-1] < 1e-16 < result.history["loss"][0]


def test_the_event_time_loss_gradient_equals_finite_differences():
    ode, inv = _parse(PROJECTILE % {"truth": G_TRUE, "extra": ""})
    problem = Problem(ode, inv, get_comm())
    x = np.array([8.0, 11.0, 9.7])
    loss, grad = problem.evaluate(x)
    # the loss against the analytic landing times, and its derivative: independent of the solver
    exact_loss = sum((_landing(g, v0) - _landing(gt, v0)) ** 2
                     for g, gt, v0 in zip(x, G_TRUE, (1.0, 2.0, 3.0))) / 3
    assert loss == pytest.approx(exact_loss, rel=1e-7)
    step = 1e-5
    for i in range(3):
        up, down = x.copy(), x.copy()
        up[i] += step
        down[i] -= step
        fd = (problem.evaluate(up, need_grad=False)[0] - problem.evaluate(down, need_grad=False)[0]) / (2 * step)
        assert grad[i] == pytest.approx(fd, rel=1e-6, abs=1e-12)
        assert grad[i] != 0


def test_trajectories_past_a_terminal_event_are_left_out_and_both_observations_fit_together():
    extra = "  observed: [h]\n  loss: {weights: {h: 0.5}}"
    ode, inv = _parse(PROJECTILE % {"truth": G_TRUE, "extra": extra})
    assert inv.observed == ("h",)
    result = fit_ode(ode, inv)
    assert np.isnan(result.y).any()  # every sample lands before t = 5
    assert np.allclose(result.fitted["g"], G_TRUE, rtol=1e-7, atol=0)


def test_the_first_k_crossings_from_an_odecli_solve_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "truth.yaml").write_text(OSCILLATOR)
    runner = CliRunner()
    solved = runner.invoke(app, ["solve", "truth.yaml", "-o", "truth.h5"])
    assert solved.exit_code == 0, solved.output
    fit = OSCILLATOR.replace("w2: [1.0, 2.0]", "w2: 1.5") + """
inverse:
  unknowns:
    params:
      w2: {init: 1.5, bounds: [0.5, 4]}
  data:
    file: truth.h5
    events: {zero: {occurrences: 3}}
"""
    (tmp_path / "fit.yaml").write_text(fit)
    out = runner.invoke(app, ["train-inverse", "fit.yaml", "-o", "fit.h5", "-q"])
    assert out.exit_code == 0, out.output
    with h5py.File(tmp_path / "fit.h5") as h5:
        assert np.allclose(h5["fit/w2"][...], [1.0, 2.0], rtol=1e-7)
        observed = h5["events/zero/data"][...]
        assert observed.shape == (2, 3)
        exact = np.array([[(2 * k - 1) * math.pi / (2 * math.sqrt(w2)) for k in (1, 2, 3)] for w2 in (1.0, 2.0)])
        assert np.allclose(observed, exact, rtol=1e-8)
        assert np.allclose(h5["events/zero/t"][...], exact, rtol=1e-7)
    stats = runner.invoke(app, ["stats", str(tmp_path / "fit.h5")])
    assert stats.exit_code == 0, stats.output
    assert "event zero" in stats.output and "6 observed times" in stats.output
    exported = runner.invoke(app, ["export", str(tmp_path / "fit.h5"), "--csv", str(tmp_path / "csv")])
    assert exported.exit_code == 0, exported.output
    lines = (tmp_path / "csv" / "events.csv").read_text().splitlines()
    assert lines[0] == "event,sample,occurrence,t,observed" and len(lines) == 1 + 2 * 3


@pytest.mark.parametrize("edit, field, words", [
    ("events: {ground: {}}", "inverse.data.events.landing", "not an event of events: (ground)"),
    ("events: {ground: {occurrences: 0}}", "inverse.data.events.ground.occurrences", ">= 1"),
    ("events: {ground: {}}\n  adjoint: backsolve", "inverse.adjoint", "adjoint: direct"),
])
def test_bad_event_observations_are_one_line_errors(edit, field, words):
    text = PROJECTILE % {"truth": G_TRUE, "extra": ""}
    text = text.replace("events: {ground: {}}", edit)
    if field.endswith("landing"):
        text = text.replace("events: {ground: {}}", "events: {landing: {}}")
    with pytest.raises(SpecError) as info:
        _parse(text)
    assert info.value.field == field and words in info.value.message


def test_an_event_the_true_system_never_reaches_is_refused_before_the_fit(tmp_path):
    text = (PROJECTILE % {"truth": G_TRUE, "extra": ""}).replace("events: {ground: {}}",
                                                                  "events: {ground: {occurrences: 2}}")
    (tmp_path / "spec.yaml").write_text(text)
    out = CliRunner().invoke(app, ["train-inverse", str(tmp_path / "spec.yaml"), "-o", str(tmp_path / "o.h5")])
    assert out.exit_code == 2
    assert "inverse.data.events.ground: the true system has fewer than 2 occurrence(s) in sample 0" in out.output


def test_the_run_file_holds_fitted_and_observed_event_times(tmp_path):
    ode, inv = _parse(PROJECTILE % {"truth": G_TRUE, "extra": ""})
    result = fit_ode(ode, inv, iterations=2)
    write_fit(tmp_path / "fit.h5", ode, inv, result)
    with h5py.File(tmp_path / "fit.h5") as h5:
        assert h5["events/ground/t"].shape == h5["events/ground/data"].shape == (3, 1)
        assert list(h5.attrs["observed"]) == []


def test_two_ranks_fit_event_times_as_one_rank_does(tmp_path):
    from tests.mpi_helpers import run_mpi

    script = Path(__file__).parent / "mpi_scripts" / "ode_cli.py"
    spec = tmp_path / "spec.yaml"
    spec.write_text(PROJECTILE % {"truth": G_TRUE, "extra": "  optimizer: {iterations: 6}"})
    fits = {}
    for ranks in (1, 2):
        out = tmp_path / f"fit{ranks}.h5"
        proc = run_mpi(script, ranks, ["train-inverse", str(spec), "-o", str(out), "-q"], timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with h5py.File(out) as h5:
            fits[ranks] = {name: h5[name][...] for name in ("fit/g", "history/loss", "events/ground/t",
                                                            "events/ground/data")}
    for name, value in fits[1].items():
        np.testing.assert_allclose(fits[2][name], value, rtol=1e-12, atol=0, err_msg=name)


@pytest.mark.parametrize("truth_events, occurrences, message", [
    (True, 50, "inverse.data.file: events/zero/t has fewer than 50 occurrence(s) in sample 0"),
    (False, 1, "has no events/zero/t of (sample, occurrence) times (solve the spec with its events: to write them)"),
])
def test_event_times_missing_from_the_data_file_are_one_line(tmp_path, truth_events, occurrences, message):
    truth = OSCILLATOR if truth_events else OSCILLATOR[:OSCILLATOR.index("events:")] + OSCILLATOR[
        OSCILLATOR.index("solver:"):]
    (tmp_path / "truth.yaml").write_text(truth)
    runner = CliRunner()
    assert runner.invoke(app, ["solve", str(tmp_path / "truth.yaml"), "-o", str(tmp_path / "truth.h5")]).exit_code == 0
    (tmp_path / "fit.yaml").write_text(OSCILLATOR + f"""
inverse:
  unknowns: {{params: {{w2: {{init: 1.5}}}}}}
  data: {{file: truth.h5, events: {{zero: {{occurrences: {occurrences}}}}}}}
""")
    out = runner.invoke(app, ["train-inverse", str(tmp_path / "fit.yaml"), "-o", str(tmp_path / "fit.h5")])
    assert out.exit_code == 2 and message in out.output and len(out.output.strip().splitlines()) == 1, out.output


def test_the_landing_fit_example_recovers_each_gravity(tmp_path, monkeypatch):
    example = Path(__file__).resolve().parent.parent / "examples" / "projectile-landing-fit.yaml"
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["train-inverse", str(example), "-q"])
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "projectile-landing-fit.h5") as h5:
        np.testing.assert_allclose(h5["fit/g"][...], h5["truth/g"][...], rtol=1e-8)
        np.testing.assert_array_equal(h5["truth/g"][...], [9.81, 3.71, 24.79, 1.62])


def test_a_starting_point_that_misses_an_observed_event_says_so(tmp_path):
    text = (PROJECTILE % {"truth": G_TRUE, "extra": ""}).replace("g: {init: 5.0, bounds: [1, 50]}",
                                                                  "g: {init: 1.0, bounds: [1, 50]}")
    (tmp_path / "spec.yaml").write_text(text)  # g = 1: no sample lands before t = 5
    out = CliRunner().invoke(app, ["train-inverse", str(tmp_path / "spec.yaml"), "-o", str(tmp_path / "o.h5")])
    assert out.exit_code == 2 and "Traceback" not in out.output
    assert out.output.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'spec.yaml'}: inverse.unknowns: the initial guess does not solve (non-finite loss) or "
        "misses an observed event (fewer occurrences than inverse.data.events asks); change the init")
