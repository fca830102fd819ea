"""ODE parameter estimation: the inverse: section, the fit, its output file, stats and MPI equality."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from odecli.cli import app
from odecli.errors import SpecError
from odecli.app.fit_ode import block, checkpoint_path, fit_ode, write_fit
from odecli.report.inverse_stats import inverse_summary
from odecli.specs import parse_yaml
from odecli.specs.inverse import parse_ode_inverse_spec
from tests.mpi_helpers import run_mpi

SCRIPTS = Path(__file__).parent / "mpi_scripts"
MU_TRUE = [0.6, 0.9, 1.2, 1.5, 1.8, 2.1, 2.4, 2.7]

VDP = """
kind: ode
name: vdp-small
system:
  states: [x, v]
  params: {mu: 1.5}
  equations: {x: v, v: "mu * (1 - x**2) * v - x"}
initial: {x: [1.0, 1.5, 2.0, 1.2, 1.8, 1.1, 1.6, 1.9], v: 0.0}
batch: 8
time: {start: 0.0, end: 5.0, eval: 21}
solver: {method: dopri5, rtol: 1.0e-6, atol: 1.0e-6, dtype: float64, device: cpu, adjoint: %(adjoint)s}
inverse:
  unknowns:
    params:
      mu: {per_sample: true, init: 1.5, bounds: [0.1, 5.0]}
  data:
    truth: {params: {mu: %(mu)s}}
  observed: [x, v]
  optimizer: {type: lbfgs, iterations: 15, tolerance: 1.0e-8, gtol: 1.0e-9}
"""

DECAY = """
kind: ode
name: decay
system:
  states: [u, w]
  params: {k: 0.5, c: [0.1, 0.2, 0.3, 0.4, 0.5]}
  equations: {u: "-k * u + c * w", w: "-0.3 * w"}
initial: {u: 1.0, w: [1.0, 0.8, 0.6, 0.4, 0.2]}
batch: 5
time: {start: 0.0, end: 2.0, eval: 9}
solver: {rtol: 1.0e-9, atol: 1.0e-9, dtype: float64, device: cpu}
inverse:
  unknowns:
    params:
      k: {per_sample: false, init: 0.5, bounds: [0.0, 3.0]}
    initial:
      u: {per_sample: true, init: 1.0}
  data:
    %(data)s
  observed: [u]
  loss: {weights: {u: 2.0}}
  optimizer: {type: %(optimizer)s, iterations: %(iterations)s, tolerance: 1.0e-14, learning_rate: %(lr)s}
  adjoint: %(adjoint)s
"""
DECAY_TRUTH = "truth: {params: {k: 1.3}, initial: {u: [2.0, 1.5, 1.0, 0.5, 0.25]}}"


def _spec(text: str, tmp_path: Path | None = None, name: str = "spec.yaml"):
    file = str((tmp_path or Path(".")) / name)
    return parse_ode_inverse_spec(parse_yaml(text, file), text, file)


def test_vdp_fit_recovers_every_mu_within_one_percent():
    """Noise-free data, 8 samples (the example has 64); backsolve fits run in the CLI and MPI tests."""
    ode, inv = _spec(VDP % {"adjoint": "direct", "mu": MU_TRUE})
    result = fit_ode(ode, inv)
    fitted = result.fitted["mu"]
    rel = np.abs(fitted - MU_TRUE) / np.array(MU_TRUE)
    assert rel.max() < 0.01, (fitted, result.stop_reason)
    assert result.history["loss"][-1] < 1e-4 * result.history["loss"][0]
    assert (result.status == 0).all()


@pytest.mark.parametrize("optimizer,lr,iterations", [("lbfgs", 1.0, 30), ("adam", 0.1, 60)])
def test_shared_param_and_per_sample_initial_values(optimizer, lr, iterations):
    text = DECAY % {"data": DECAY_TRUTH, "optimizer": optimizer, "lr": lr, "iterations": iterations, "adjoint": "direct"}
    if optimizer == "adam":
        text = text.replace("rtol: 1.0e-9, atol: 1.0e-9", "rtol: 1.0e-6, atol: 1.0e-6")
    ode, inv = _spec(text)
    result = fit_ode(ode, inv)
    assert result.history["loss"][-1] < 1e-2 * result.history["loss"][0]
    rtol, atol = (1e-6, 0.0) if optimizer == "lbfgs" else (5e-2, 5e-2)  # Adam: a rougher, shorter run
    np.testing.assert_allclose(result.fitted["k"], [1.3], rtol=rtol, atol=atol)
    np.testing.assert_allclose(result.fitted["u"], [2.0, 1.5, 1.0, 0.5, 0.25], rtol=rtol, atol=atol)
    assert result.fitted["k"].shape == (1,) and result.fitted["u"].shape == (5,)


def test_bounds_are_respected():
    text = DECAY % {"data": DECAY_TRUTH, "optimizer": "lbfgs", "lr": 1.0, "iterations": 20, "adjoint": "direct"}
    text = text.replace("bounds: [0.0, 3.0]", "bounds: [0.0, 1.0]")
    ode, inv = _spec(text)
    result = fit_ode(ode, inv)
    assert result.fitted["k"][0] == pytest.approx(1.0)  # truth 1.3 is outside: pinned at the bound


def test_cli_fit_from_a_solve_output_with_noise_and_stats(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    truth = (DECAY % {"data": DECAY_TRUTH, "optimizer": "lbfgs", "lr": 1, "iterations": 1, "adjoint": "direct"})
    truth = truth.split("inverse:")[0].replace("k: 0.5", "k: 1.3").replace("u: 1.0,", "u: [2.0, 1.5, 1.0, 0.5, 0.25],")
    (tmp_path / "truth.yaml").write_text(truth)
    assert runner.invoke(app, ["solve", "truth.yaml", "-o", "truth.h5"]).exit_code == 0
    data = "{file: truth.h5, noise: 0.001, seed: 3}"
    (tmp_path / "fit.yaml").write_text(DECAY % {"data": data, "optimizer": "lbfgs", "lr": 1.0, "iterations": 12,
                                                "adjoint": "backsolve"})
    res = runner.invoke(app, ["train-inverse", "fit.yaml", "-o", "fit.h5"])
    assert res.exit_code == 0 and "adjoint: direct would run them in generated C" in res.output, res.output
    with h5py.File(tmp_path / "fit.h5") as h5:
        assert h5.attrs["kind"] == "ode-inverse" and "vdp" not in h5.attrs["spec"]
        assert h5["fit/k"].shape == (1,) and h5["fit/u"].shape == (5,)
        assert h5["y"].shape == (5, 9, 2) and h5["t"].shape == (5, 9) and h5["data"].shape == (5, 9, 1)
        assert "backward_n_steps" in h5["stats"] and (h5["status"][...] == 0).all()
        loss = h5["history/loss"][...]
        assert loss[-1] < loss[0] and len(h5["history/grad_norm"]) == len(loss) == len(h5["history/wall_time_s"])
        assert abs(h5["fit/k"][0] - 1.3) < 0.02
    res = runner.invoke(app, ["stats", "fit.h5", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["kind"] == "ode-inverse" and summary["samples"] == 5
    assert summary["adjoint"] == "backsolve" and summary["engine"] == "torch"  # backsolve: the PyTorch loop
    assert {u["name"] for u in summary["unknowns"]} == {"k", "u"}
    res = runner.invoke(app, ["stats", "fit.h5"])
    assert res.exit_code == 0 and "unknowns" in res.output


@pytest.mark.parametrize("edit,field", [
    (("observed: [u]", "observed: [q]"), "inverse.observed[0]"),
    (("k: {per_sample: false,", "kk: {per_sample: false,"), "inverse.unknowns.params.kk"),
    (("bounds: [0.0, 3.0]", "bounds: [3.0, 0.0]"), "inverse.unknowns.params.k.bounds"),
    (("type: lbfgs", "type: sgd"), "inverse.optimizer.type"),
    (("adjoint: direct", "adjoint: magic"), "inverse.adjoint"),
    (("  observed: [u]", "  observed: [u]\n  extra: 1"), "inverse.extra"),
    (("init: 0.5, bounds", "init: 5.0, bounds"), "inverse.unknowns.params.k.init"),
    (("adjoint: direct", "adjoint: direct\n  checkpoint: {every: -1}"), "inverse.checkpoint.every"),
    (("adjoint: direct", "adjoint: direct\n  checkpoint: {each: 2}"), "inverse.checkpoint.each"),
])
def test_inverse_section_errors_name_the_field(edit, field):
    text = DECAY % {"data": DECAY_TRUTH, "optimizer": "lbfgs", "lr": 1.0, "iterations": 5, "adjoint": "direct"}
    with pytest.raises(SpecError) as info:
        _spec(text.replace(*edit))
    assert info.value.field == field


def test_missing_inverse_section_and_ode_errors_still_reported():
    text = DECAY % {"data": DECAY_TRUTH, "optimizer": "lbfgs", "lr": 1.0, "iterations": 5, "adjoint": "direct"}
    with pytest.raises(SpecError, match="inverse"):
        _spec(text.split("inverse:")[0])
    with pytest.raises(SpecError) as info:
        _spec(text.replace("rtol: 1.0e-9", "rtol: -1"))
    assert info.value.field == "solver.rtol"


def test_the_generated_c_gradient_fits_as_the_pytorch_loop_does(tmp_path):
    """Equations specs with direct gradients fit on the C solver and its generated reverse sweep;
    ``engine: torch`` backpropagates through the PyTorch loop. Same gradients, so same iterates."""
    text = DECAY % {"data": DECAY_TRUTH, "optimizer": "lbfgs", "lr": 1.0, "iterations": 8, "adjoint": "direct"}
    results = {}
    for engine in ("auto", "torch"):
        ode, inv = _spec(text.replace("device: cpu}", f"device: cpu, engine: {engine}}}"))
        results[engine] = fit_ode(ode, inv)
    native, torch_loop = results["auto"], results["torch"]
    assert (native.engine, torch_loop.engine) == ("native", "torch")
    np.testing.assert_allclose(native.history["loss"], torch_loop.history["loss"], rtol=1e-9)
    np.testing.assert_allclose(native.history["grad_norm"], torch_loop.history["grad_norm"], rtol=1e-6)
    for name in ("k", "u"):
        np.testing.assert_allclose(native.fitted[name], torch_loop.fitted[name], rtol=1e-9)
    assert len(native.history["loss"]) > 3
    write_fit(tmp_path / "fit.h5", ode, inv, native)
    with h5py.File(tmp_path / "fit.h5") as h5:
        assert inverse_summary(h5)["engine"] == "native"


def test_a_fit_falls_back_to_the_pytorch_loop_when_the_c_gradient_cannot_be_built(monkeypatch):
    from odecli.ode.native import gradient

    def no_compiler(*args):
        raise gradient.NativeUnavailable("no C compiler found (set CC)")

    monkeypatch.setattr(gradient, "_load", no_compiler)
    text = DECAY % {"data": DECAY_TRUTH, "optimizer": "lbfgs", "lr": 1.0, "iterations": 3, "adjoint": "direct"}
    result = fit_ode(*_spec(text))
    assert result.engine == "torch" and result.history["loss"][-1] < result.history["loss"][0]


def test_blocks_are_contiguous_and_cover_the_batch():
    for batch, size in ((8, 2), (7, 3), (5, 5)):
        spans = [block(batch, size, r) for r in range(size)]
        assert spans[0][0] == 0 and spans[-1][1] == batch
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_two_ranks_equal_one_rank(tmp_path):
    outs = {}
    for n in (1, 2):
        out = tmp_path / f"rank{n}.npz"
        proc = run_mpi(SCRIPTS / "ode_inverse_check.py", n, [str(out)], timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outs[n] = np.load(out)
    for key in outs[1].files:
        np.testing.assert_allclose(outs[2][key], outs[1][key], rtol=1e-12, atol=1e-15, err_msg=key)


# ------------------------------------------------------------------------- checkpoint and resume


def _checkpointed(tmp_path: Path, optimizer: str = "lbfgs", lr: float = 1.0) -> Path:
    """DECAY with a checkpoint every 2 of its 12 iterations (neither optimiser converges sooner)."""
    spec = tmp_path / "fit.yaml"
    spec.write_text(DECAY % {"data": DECAY_TRUTH, "optimizer": optimizer, "lr": lr, "iterations": 12,
                             "adjoint": "direct"} + "  checkpoint: {every: 2}\n")
    return spec


def _killed_after_checkpoint_4(monkeypatch, spec: Path, out: Path, ranks: int) -> None:
    """A fit in a fresh process that dies right after its checkpoint of iteration 4, leaving only that."""
    monkeypatch.setenv("ODECLI_ODE_EXIT_AFTER_CHECKPOINT", "4")
    args = ["train-inverse", str(spec), "-o", str(out)]
    if ranks == 1:
        proc = subprocess.run([sys.executable, "-m", "odecli", *args], capture_output=True, text=True, timeout=120)
    else:
        proc = run_mpi(SCRIPTS / "ode_cli.py", ranks, args)
    monkeypatch.delenv("ODECLI_ODE_EXIT_AFTER_CHECKPOINT")
    assert proc.returncode != 0 and "iter    4" in proc.stdout and "iter    5" not in proc.stdout, proc.stderr
    assert not out.exists()
    with h5py.File(checkpoint_path(out)) as h5:
        assert h5.attrs["kind"] == "ode-inverse-checkpoint" and h5.attrs["iteration"] == 4


def _assert_same_fit(a: Path, b: Path, rtol: float = 0.0) -> None:
    with h5py.File(a) as fa, h5py.File(b) as fb:
        for name in ("fit/k", "fit/u", "history/loss", "history/grad_norm", "history/n_evals", "y"):
            np.testing.assert_allclose(fb[name][...], fa[name][...], rtol=rtol, atol=0.0, err_msg=name)
        assert len(fb["history/wall_time_s"]) == len(fa["history/loss"]) == 13
        assert (fb.attrs["iterations"], fb.attrs["stop_reason"]) == (fa.attrs["iterations"], fa.attrs["stop_reason"])


@pytest.mark.parametrize("optimizer,lr", [("lbfgs", 1.0), ("adam", 0.1)])
def test_a_killed_fit_resumes_to_exactly_the_uninterrupted_one(tmp_path, monkeypatch, optimizer, lr):
    spec = _checkpointed(tmp_path, optimizer, lr)
    full, part = tmp_path / "full.h5", tmp_path / "part.h5"
    runner = CliRunner()
    res = runner.invoke(app, ["train-inverse", str(spec), "-o", str(full), "--quiet"])
    assert res.exit_code == 0 and not checkpoint_path(full).exists(), res.output
    _killed_after_checkpoint_4(monkeypatch, spec, part, ranks=1)
    res = runner.invoke(app, ["train-inverse", str(spec), "-o", str(part), "--resume"])
    assert res.exit_code == 0, res.output
    assert "resuming from" in res.output and "iter    4" not in res.output and "iter    5" in res.output
    assert not checkpoint_path(part).exists()  # the output holds it all now
    _assert_same_fit(full, part)


def test_a_killed_fit_on_two_ranks_resumes_on_two_ranks(tmp_path, monkeypatch):
    """Rank 0 writes the checkpoint, both read it back; 2 ranks equal 1 to round-off (test above)."""
    spec = _checkpointed(tmp_path)
    full, part = tmp_path / "full.h5", tmp_path / "part.h5"
    assert CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(full), "--quiet"]).exit_code == 0
    _killed_after_checkpoint_4(monkeypatch, spec, part, ranks=2)
    proc = run_mpi(SCRIPTS / "ode_cli.py", 2, ["train-inverse", str(spec), "-o", str(part), "--resume"])
    assert proc.returncode == 0 and "resuming from" in proc.stdout, proc.stderr
    assert "iter    5" in proc.stdout and "iter    4" not in proc.stdout
    _assert_same_fit(full, part, rtol=1e-12)
    with h5py.File(part) as h5:
        assert h5.attrs["ranks"] == 2


def test_resume_refuses_a_checkpoint_of_another_spec(tmp_path):
    spec = _checkpointed(tmp_path)
    out = tmp_path / "fit.h5"
    ode, inv = _spec(spec.read_text(), tmp_path, "fit.yaml")
    fit_ode(ode, inv, iterations=6, checkpoint=checkpoint_path(out))  # leaves the checkpoint of iteration 4
    spec.write_text(spec.read_text().replace("weights: {u: 2.0}", "weights: {u: 3.0}"))
    res = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(out), "--resume"])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "fit.ckpt.h5" in errors[0] and "different spec" in errors[0], res.output
    assert "iter" not in res.output and not out.exists() and checkpoint_path(out).exists()


def test_resume_without_a_checkpoint_starts_from_the_beginning(tmp_path):
    spec = _checkpointed(tmp_path)
    out = tmp_path / "fit.h5"
    res = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(out), "--resume"])
    assert res.exit_code == 0, res.output
    assert "no checkpoint at" in res.output and "starting from the beginning" in res.output
    assert "start " in res.output
    with h5py.File(out) as h5:
        assert len(h5["history/loss"]) == 13
    res = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(out), "--resume"])
    assert res.exit_code == 2 and "output file exists" in res.output  # a finished fit is not redone over itself


def _checkpoint_4(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(spec, out, checkpoint): the checkpoint is that of iteration 4 of the 12-iteration L-BFGS fit."""
    spec = _checkpointed(tmp_path)
    out = tmp_path / "fit.h5"
    ode, inv = _spec(spec.read_text(), tmp_path, "fit.yaml")
    fit_ode(ode, inv, iterations=6, checkpoint=checkpoint_path(out))  # leaves the checkpoint of iteration 4
    return spec, out, checkpoint_path(out)


def test_an_earlier_fits_checkpoint_is_neither_lost_nor_resumed_unasked(tmp_path):
    spec, out, cpath = _checkpoint_4(tmp_path)
    before = cpath.read_bytes()
    res = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(out)])
    assert res.exit_code == 2, res.output
    assert res.output.splitlines() == [f"error: {cpath}: a checkpoint of an earlier run exists; pass --resume "
                                       "to continue it or --force to start over"]
    assert cpath.read_bytes() == before and not out.exists()
    res = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(out), "--force"])
    assert res.exit_code == 0 and "resuming" not in res.output and "start " in res.output, res.output
    assert not cpath.exists()


def test_ctrl_c_after_a_checkpoint_says_that_it_keeps_the_fit(tmp_path, monkeypatch):
    from odecli.app import faults

    def ctrl_c(iteration: int) -> None:
        if iteration == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(faults, "maybe_exit_after_checkpoint", ctrl_c)
    spec, out = _checkpointed(tmp_path), tmp_path / "fit.h5"
    res = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(out), "--quiet"])
    assert res.exit_code == 130, res.output
    assert res.output.splitlines() == [f"interrupted; no output was written; {checkpoint_path(out)} keeps the "
                                       "run up to iteration 4: continue it with --resume"]
    assert not out.exists()


def test_resume_with_fewer_iterations_than_the_checkpoint_says_so(tmp_path):
    spec, out, cpath = _checkpoint_4(tmp_path)
    res = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(out), "--resume", "--iterations", "2"])
    assert res.exit_code == 0, res.output
    assert ("note: the checkpoint already has 4 iterations (this run asks for 2); writing the output from it "
            "as it is") in res.output
    with h5py.File(out) as h5:
        assert h5.attrs["iterations"] == 4 and len(h5["history/loss"]) == 5
    assert not cpath.exists()


def _replace(h5, name: str, value) -> None:
    del h5[name]
    h5[name] = value


ODE_DAMAGE = {  # what is done to a good checkpoint -> what the error says about it
    "missing x": (lambda h5: h5.__delitem__("params/0"), "missing 'params/0'"),
    "missing iteration": (lambda h5: h5.attrs.__delitem__("iteration"), "missing 'iteration'"),
    "missing history": (lambda h5: h5.__delitem__("history/loss"), "missing 'history/loss'"),
    "x of another fit": (lambda h5: _replace(h5, "params/0", h5["params/0"][:3]),
                         "'params/0' has shape (3,), expected (6,)"),
    "L-BFGS pairs of another fit": (lambda h5: _replace(h5, "opt/s0/0", h5["opt/s0/0"][:2]),
                                    "'opt/s0/0' has shape (2,), expected (6,)"),
    "short history": (lambda h5: _replace(h5, "history/loss", h5["history/loss"][:2]),
                      "'history/loss' has shape (2,), expected 5 entries"),
    "NaN in x": (lambda h5: _replace(h5, "params/0", h5["params/0"][...] * np.nan),
                 "'params/0' holds non-finite values"),
    "inf in an L-BFGS pair": (lambda h5: _replace(h5, "opt/s0/0", h5["opt/s0/0"][...] + np.inf),
                              "'opt/s0/0' holds non-finite values"),
    # issue 42: damage every named check lets through is caught by the checksum
    "one bit of x flipped": (lambda h5: _replace(h5, "params/0", _flip_lowest_bit(h5["params/0"][...])),
                             "its contents do not match its checksum: the file changed after it was written"),
    "the loss changed": (lambda h5: h5.attrs.__setitem__("f", h5.attrs["f"] * 2),
                         "its contents do not match its checksum: the file changed after it was written"),
    "no checksum": (lambda h5: h5.attrs.__delitem__("checksum"),
                    "missing 'checksum': written by an odecli without checkpoint checksums, or damaged"),
}


def _flip_lowest_bit(values: np.ndarray) -> np.ndarray:
    flipped = values.copy()
    flipped.view(np.int64)[0] ^= 1
    return flipped


@pytest.mark.parametrize("damage", ODE_DAMAGE)
def test_a_damaged_checkpoint_is_one_clear_error(tmp_path, damage):
    spec, out, cpath = _checkpoint_4(tmp_path)
    change, why = ODE_DAMAGE[damage]
    with h5py.File(cpath, "a") as h5:
        change(h5)
    res = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(out), "--resume"])
    assert res.exit_code == 2, res.output
    assert res.output.splitlines() == [f"error: {cpath}: not a usable checkpoint ({why}); delete it, or start "
                                       "over with --force instead of --resume"]
    assert cpath.exists() and not out.exists()
