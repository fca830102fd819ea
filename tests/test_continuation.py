"""Frequency continuation (``optimizer.frequency_continuation``): stages on low-passed data.

A small acoustic inversion in two stages (data low-passed at 10 Hz, then the full band): the
history holds both, each row's misfit is of its stage's band (checked against an FFT filter
built from SciPy's Butterworth, not odecli's), ``odecli stats`` reports the stages, a run killed
at a checkpoint in either stage resumes bit for bit, and 2 ranks give the 1-rank result.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpi_helpers import run_mpi

SCRIPTS = Path(__file__).parent / "mpi_scripts"

SPEC = """\
kind: pde-inverse
equation: acoustic2d
grid: {shape: [30, 26], spacing: 10.0}
time: {dt: 0.0015, steps: 70}
boundary: {absorbing_width: 5}
sources:
  wavelet: {type: ricker, peak_frequency: 25}
  positions: [[60, 60], [60, 190]]
receivers:
  line: {from: [230, 20], to: [230, 230], count: 10}
true_model: {type: gaussian, background: 2000, amplitude: 200, center: [150, 125], sigma: 40}
unknown: {type: grid, initial: 2000, bounds: [1500, 2600]}
optimizer:
  iterations: 3
  frequency_continuation: [{max_frequency: 10, iterations: STAGE1}]
checkpoint: {every: 2}
"""


def _train(spec: Path, out: Path, resume: bool = False) -> None:
    from odecli.app.fit_pde import train_inverse

    assert train_inverse(spec, out, None, resume, True, True) == 0


def _write(tmp_path: Path, stage1: int) -> Path:
    spec = tmp_path / "stages.yaml"
    spec.write_text(SPEC.replace("STAGE1", str(stage1)))
    return spec


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("stages")
    spec, out = _write(d, 3), d / "full.h5"
    _train(spec, out)
    return spec, out


def test_history_has_both_stages(full_run):
    _, out = full_run
    with h5py.File(out) as f:
        band = f["history/max_frequency"][...]
        loss = f["history/loss"][...]
        assert f.attrs["iterations"] == 6
        assert f.attrs["model_error_final"] < f["history/model_error"][0]
    np.testing.assert_array_equal(band, [10, 10, 10, math.inf, math.inf, math.inf])
    assert loss[2] < loss[0] and loss[5] < loss[3]  # each stage lowers its own misfit


def _butterworth_misfit(residual: np.ndarray, observed: np.ndarray, dt: float, cutoff: float) -> float:
    """The normalised misfit of data low-passed by SciPy's 4th-order Butterworth, forward and
    backward (|H|^2), applied by NumPy's FFT on traces zero-padded to 16384 steps."""
    from scipy import signal

    n = 16384
    freqs = np.fft.rfftfreq(n, dt)
    _, h = signal.sosfreqz(signal.butter(4, cutoff, fs=1 / dt, output="sos"), worN=freqs, fs=1 / dt)

    def low(x):
        return np.fft.irfft(np.fft.rfft(x, n) * np.abs(h) ** 2, n)[..., : x.shape[-1]]

    return 0.5 * float((low(residual) ** 2).sum()) / float((low(observed) ** 2).sum())


def test_a_stage_fits_low_passed_data(full_run):
    """Row 0's misfit is the initial model's on 10 Hz data (normalised by the 10 Hz data's
    energy), not the full band's."""
    from odecli.app.pde_problem import Problem
    from odecli.parallel.comm import get_comm
    from odecli.specs.pde import load_spec

    spec, out = full_run
    problem = Problem(load_spec(spec), get_comm())
    with h5py.File(out) as f:
        misfit = f["history/misfit"][...]
        observed = f["data/observed"][...]
    initial = problem.predict_full().numpy()
    expected = _butterworth_misfit(initial - observed, observed, problem.dt, 10.0)
    assert misfit[0] == pytest.approx(expected, rel=1e-8)
    full_band = 0.5 * float(((initial - observed) ** 2).sum()) / float((observed**2).sum())
    assert abs(expected - full_band) > 0.2 * full_band


def test_stats_shows_the_stages(full_run):
    from typer.testing import CliRunner

    from odecli.cli import app

    _, out = full_run
    result = CliRunner().invoke(app, ["stats", str(out), "--json"])
    assert result.exit_code == 0, result.output
    stages = json.loads(result.output)["stages"]
    assert [(s["max_frequency"], s["iterations"]) for s in stages] == [(10.0, 3), (None, 3)]
    loss = [s["loss_first"] for s in stages] + [s["loss_last"] for s in stages]
    with h5py.File(out) as f:
        history = f["history/loss"][...]
    assert loss == [history[0], history[3], history[2], history[5]]
    table = CliRunner().invoke(app, ["stats", str(out)], env={"COLUMNS": "200"})
    assert f"10 Hz: 3, {history[0]:.6g} -> {history[2]:.6g}; full band: 3" in table.output, table.output


@pytest.mark.parametrize("stage1, kill_at", [(3, 2), (1, 2)])
def test_resume_across_the_stage_boundary_is_identical(full_run, tmp_path, monkeypatch, stage1, kill_at):
    """Killed at the checkpoint of stage 1 (resumed, it crosses into stage 2), or at one in
    stage 2 (after a 1-iteration stage 1): the same run as an uninterrupted one, bit for bit."""
    from odecli.app import faults

    spec = _write(tmp_path, stage1)
    if stage1 == 3:
        reference = full_run[1]
    else:
        reference = tmp_path / "reference.h5"
        _train(spec, reference)
    kills = []

    class Killed(Exception):
        pass

    def kill(iteration: int) -> None:
        if iteration == kill_at and not kills:
            kills.append(iteration)
            raise Killed

    out = tmp_path / "part.h5"
    with monkeypatch.context() as m:
        m.setattr(faults, "maybe_exit_after_checkpoint", kill)
        with pytest.raises(Killed):
            _train(spec, out)
    cpath = out.with_name("part.ckpt.h5")
    with h5py.File(cpath) as f:
        assert (f.attrs["stage"], f.attrs["iteration"]) == ((0, 2) if stage1 == 3 else (1, 3))
    _train(spec, out, resume=True)
    with h5py.File(reference) as a, h5py.File(out) as b:
        for name in ("fields/final", "history/loss", "history/max_frequency", "data/predicted"):
            np.testing.assert_array_equal(a[name][...], b[name][...], err_msg=name)


def test_two_ranks_give_the_one_rank_result(full_run, tmp_path):
    spec, out = full_run
    two = tmp_path / "two.h5"
    p = run_mpi(SCRIPTS / "pde_train.py", 2, [str(spec), str(two)])
    assert p.returncode == 0, p.stderr[-2000:]
    with h5py.File(out) as a, h5py.File(two) as b:
        np.testing.assert_array_equal(a["history/max_frequency"][...], b["history/max_frequency"][...])
        np.testing.assert_allclose(b["history/loss"][...], a["history/loss"][...], rtol=1e-10)
        np.testing.assert_allclose(b["fields/final"][...], a["fields/final"][...], rtol=1e-10)


def test_bad_stages_are_one_line_errors(tmp_path):
    from odecli.errors import SpecError
    from odecli.specs.pde import load_spec

    for stages, field, words in [
        ("[{max_frequency: 400, iterations: 2}]", "frequency_continuation[0].max_frequency", "Nyquist"),
        ("[{max_frequency: 10, iterations: 2}, {max_frequency: 8, iterations: 2}]",
         "frequency_continuation[1].max_frequency", "must rise"),
        ("[{max_frequency: 10}]", "frequency_continuation[0].iterations", "required"),
    ]:
        spec = tmp_path / "bad.yaml"
        spec.write_text(SPEC.replace("[{max_frequency: 10, iterations: STAGE1}]", stages))
        with pytest.raises(SpecError) as err:
            load_spec(spec)
        assert field in str(err.value) and words in str(err.value), str(err.value)
