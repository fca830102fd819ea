"""The inverse loop: recovers an anomaly, output layout, kill + resume, failure on one rank."""

from __future__ import annotations

import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpi_helpers import run_mpi

SCRIPTS = Path(__file__).parent / "mpi_scripts"

ANOMALY = """\
kind: pde-inverse
equation: acoustic2d
grid: {shape: [40, 40], spacing: 10.0}
time: {dt: 0.0015, steps: 200}
boundary: {absorbing_width: 8}
sources:
  wavelet: {type: ricker, peak_frequency: 20}
  line: [{from: [80, 80], to: [80, 310], count: 2}, {from: [200, 80], to: [310, 80], count: 2}]
receivers:
  line: [{from: [310, 80], to: [310, 310], count: 24}, {from: [80, 310], to: [310, 310], count: 24}]
true_model: {type: gaussian, background: 2000, amplitude: 300, center: [195, 195], sigma: 45}
unknown: {type: grid, initial: 2000, bounds: [1500, 2600], fixed_border: 8}
optimizer: {type: lbfgs, learning_rate: 100, iterations: 10}
"""

SMALL = """\
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
optimizer: {type: OPT, learning_rate: 20, iterations: 6}
checkpoint: {every: 2}
"""


@pytest.fixture(scope="module")
def anomaly_run(tmp_path_factory):
    from odecli.app.fit_pde import train_inverse

    d = tmp_path_factory.mktemp("anomaly")
    spec = d / "anomaly.yaml"
    spec.write_text(ANOMALY)
    out = d / "anomaly.h5"
    assert train_inverse(spec, out, None, False, False, True) == 0
    return out


def test_anomaly_model_error_halves(anomaly_run):
    with h5py.File(anomaly_run, "r") as f:
        e0 = f["history/model_error"][0]
        e1 = f.attrs["model_error_final"]
        loss = f["history/loss"][...]
    assert e1 <= 0.5 * e0, (e0, e1)
    assert loss[-1] < 0.2 * loss[0]


def test_output_contract(anomaly_run):
    import odecli

    with h5py.File(anomaly_run, "r") as f:
        assert f.attrs["kind"] == "pde-inverse"
        assert "kind: pde-inverse" in f.attrs["spec"]
        assert f.attrs["ranks"] == 1
        assert "proc_grid" in f.attrs["decomposition"]
        assert f.attrs["odecli_version"] == odecli.__version__
        assert f.attrs["engine"].startswith("fused C kernels")  # CI has a C compiler
        n = f.attrs["iterations"]
        for k in ("loss", "grad_norm", "wall_time_s"):
            assert f[f"history/{k}"].shape == (n,)
        for k in ("true", "initial", "final"):
            assert f[f"fields/{k}"].shape == (40, 40)
        assert f["fields/true"][...].max() == pytest.approx(2300, abs=5)
        assert f["data/observed"].shape == f["data/predicted"].shape == (4, 48, 200)
        assert f["timing/comm_s"].shape == (1,)


def test_pde_summary(anomaly_run):
    import json

    from rich.console import Console

    from odecli.report.pde_stats import pde_summary, render_pde_summary

    with h5py.File(anomaly_run, "r") as f:
        s = pde_summary(f)
    json.dumps(s)
    assert s["iterations"] == 10
    assert s["loss"]["last"] < s["loss"]["first"]
    assert s["model_error"]["final"] < s["model_error"]["initial"]
    console = Console(record=True, width=120)
    render_pde_summary(s, console)
    text = console.export_text()
    assert "loss" in text and "comm" in text and "fused C kernels" in text


@pytest.mark.parametrize("opt,ranks", [("adam", 2), ("lbfgs", 1)])
def test_kill_after_checkpoint_then_resume_is_identical(tmp_path, monkeypatch, opt, ranks):
    spec = tmp_path / "small.yaml"
    spec.write_text(SMALL.replace("OPT", opt))
    full, part = tmp_path / "full.h5", tmp_path / "part.h5"
    p = run_mpi(SCRIPTS / "pde_train.py", ranks, [str(spec), str(full)])
    assert p.returncode == 0, p.stderr[-2000:]
    monkeypatch.setenv("ODECLI_PDE_EXIT_AFTER_CHECKPOINT", "4")
    p = run_mpi(SCRIPTS / "pde_train.py", ranks, [str(spec), str(part)])
    assert p.returncode != 0
    assert not part.exists()
    assert part.with_name("part.ckpt.h5").exists()
    monkeypatch.delenv("ODECLI_PDE_EXIT_AFTER_CHECKPOINT")
    p = run_mpi(SCRIPTS / "pde_train.py", ranks, [str(spec), str(part), "--resume"])
    assert p.returncode == 0, p.stderr[-2000:]
    with h5py.File(full, "r") as a, h5py.File(part, "r") as b:
        np.testing.assert_array_equal(a["fields/final"][...], b["fields/final"][...])
        np.testing.assert_array_equal(a["history/loss"][...], b["history/loss"][...])
        np.testing.assert_array_equal(a["data/predicted"][...], b["data/predicted"][...])
        assert b.attrs["ranks"] == ranks


def test_rank_failure_ends_all_ranks(tmp_path, monkeypatch):
    spec = tmp_path / "small.yaml"
    spec.write_text(SMALL.replace("OPT", "adam"))
    monkeypatch.setenv("ODECLI_PDE_FAIL_RANK", "1")
    monkeypatch.setenv("ODECLI_PDE_FAIL_ITER", "1")
    t0 = time.perf_counter()
    p = run_mpi(SCRIPTS / "pde_train.py", 2, [str(spec), str(tmp_path / "x.h5")], timeout=60)
    assert p.returncode != 0
    assert time.perf_counter() - t0 < 45
    assert p.stderr.count("injected failure on rank 1") == 1, p.stderr
    assert not (tmp_path / "x.h5").exists()


def test_exchange_every_beyond_the_blocks_is_a_spec_error(tmp_path):
    spec = tmp_path / "small.yaml"
    spec.write_text(SMALL.replace("OPT", "adam") + "parallel: {exchange_every: 40}\n")
    p = run_mpi(SCRIPTS / "pde_train.py", 2, [str(spec), str(tmp_path / "x.h5")], timeout=60)
    assert p.returncode != 0
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, p.stderr
    assert "small.yaml" in lines[0] and "parallel.exchange_every" in lines[0] and "at most" in lines[0]
    assert not (tmp_path / "x.h5").exists()


# ------------------------------------------------------- an earlier run's checkpoint, Ctrl-C, damage


def _ctrl_c_after_checkpoint_4(monkeypatch, spec: Path, out: Path):
    """Ctrl-C right after the checkpoint of iteration 4 (where the KeyboardInterrupt of a real
    Ctrl-C would surface at the next Python bytecode), run through the command line."""
    from typer.testing import CliRunner

    from odecli.cli import app
    from odecli.app import faults

    def ctrl_c(iteration: int) -> None:
        if iteration == 4:
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(faults, "maybe_exit_after_checkpoint", ctrl_c)
        return CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(out), "-q"])


@pytest.fixture(scope="module")
def checkpoint_4(tmp_path_factory):
    """SMALL (Adam, 6 iterations, a checkpoint every 2) interrupted after iteration 4."""
    d = tmp_path_factory.mktemp("ctrl-c")
    spec, out = d / "small.yaml", d / "out.h5"
    spec.write_text(SMALL.replace("OPT", "adam"))
    with pytest.MonkeyPatch.context() as mp:
        result = _ctrl_c_after_checkpoint_4(mp, spec, out)
    return spec, out, result


def _cli(*args):
    from typer.testing import CliRunner

    from odecli.cli import app

    return CliRunner().invoke(app, ["train-inverse", *map(str, args)])


def _copy(checkpoint_4, tmp_path: Path) -> tuple[Path, Path, Path]:
    """(spec, out, checkpoint) in tmp_path, the checkpoint that of iteration 4."""
    spec, out, _ = checkpoint_4
    import shutil

    shutil.copy(spec, tmp_path / spec.name)
    shutil.copy(out.with_name("out.ckpt.h5"), tmp_path / "out.ckpt.h5")
    return tmp_path / spec.name, tmp_path / "out.h5", tmp_path / "out.ckpt.h5"


def test_ctrl_c_says_that_the_checkpoint_keeps_the_run(checkpoint_4):
    spec, out, result = checkpoint_4
    assert result.exit_code == 130, result.output
    cpath = out.with_name("out.ckpt.h5")
    assert result.output.strip().splitlines()[-1] == (
        f"interrupted; no output was written; {cpath} keeps the run up to iteration 4: "
        "continue it with --resume")
    assert not out.exists()
    with h5py.File(cpath) as f:
        assert f.attrs["iteration"] == 4


def test_ctrl_c_before_any_checkpoint_says_only_that_nothing_was_written(tmp_path, monkeypatch):
    spec = tmp_path / "small.yaml"
    spec.write_text(SMALL.replace("OPT", "adam").replace("every: 2", "every: 0"))
    from odecli.app.pde_problem import Problem

    def ctrl_c(self, iteration=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(Problem, "evaluate", ctrl_c)
    from odecli.interrupts import note_written

    note_written(str(tmp_path / "earlier.h5"))  # an earlier command of this process wrote it
    result = _cli(spec, "-o", tmp_path / "out.h5", "-q")
    assert result.exit_code == 130
    assert result.output.strip().splitlines()[-1] == "interrupted; no output was written"


def test_an_earlier_runs_checkpoint_is_neither_lost_nor_resumed_unasked(checkpoint_4, tmp_path):
    spec, out, cpath = _copy(checkpoint_4, tmp_path)
    before = cpath.read_bytes()
    result = _cli(spec, "-o", out, "-q")
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"error: {cpath}: a checkpoint of an earlier run exists; pass --resume to continue it or "
        "--force to start over"]
    assert cpath.read_bytes() == before and not out.exists()
    result = _cli(spec, "-o", out, "--force")  # starts over: 6 fresh iterations, none resumed
    assert result.exit_code == 0, result.output
    assert "resuming" not in result.output and "iter    1/6" in result.output
    assert not cpath.exists()
    with h5py.File(out) as f:
        assert f.attrs["iterations"] == 6
    result = _cli(spec, "-o", out, "--resume", "-q")  # no checkpoint: a finished run is not redone over
    assert result.exit_code == 2 and "output file exists" in result.output, result.output


def test_resume_with_fewer_iterations_than_the_checkpoint_says_so(checkpoint_4, tmp_path):
    spec, out, cpath = _copy(checkpoint_4, tmp_path)
    result = _cli(spec, "-o", out, "--resume", "--iterations", 2)
    assert result.exit_code == 0, result.output
    assert ("note: the checkpoint already has 4 iterations (this run asks for 2); writing the output "
            "from it as it is") in result.output
    with h5py.File(out) as f:
        assert len(f["history/loss"]) == 4
    assert not cpath.exists()  # the output holds everything it did


def _reshape(f, name: str, rows: int) -> None:
    value = f[name][:rows]
    del f[name]
    f[name] = value


DAMAGE = {  # what is done to a good checkpoint -> what the error says about it
    "missing params": (lambda f: f.__delitem__("params/0"), "missing 'params/0'"),
    "missing iteration": (lambda f: f.attrs.__delitem__("iteration"), "missing 'iteration'"),
    "missing Adam moments": (lambda f: f.__delitem__("opt/m"), "missing 'opt/m'"),
    "missing history": (lambda f: f.__delitem__("history/loss"), "missing 'history/loss'"),
    "missing Adam step": (lambda f: f.attrs.__setitem__("optimizer_scalars", "{}"),
                          "missing 'optimizer_scalars.t'"),
    "params of another grid": (lambda f: _reshape(f, "params/0", 5),
                               "'params/0' has shape (5, 26), expected (30, 26)"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_is_one_clear_error(checkpoint_4, tmp_path, damage):
    spec, out, cpath = _copy(checkpoint_4, tmp_path)
    change, why = DAMAGE[damage]
    with h5py.File(cpath, "a") as f:
        change(f)
    result = _cli(spec, "-o", out, "--resume", "-q")
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"error: {cpath}: not a usable checkpoint ({why}); delete it, or start over with --force "
        "instead of --resume"]
    assert cpath.exists() and not out.exists()
