"""The command line end to end: spec → HDF5 file → stats, exit codes, one-line errors, atomicity."""

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

VDP = """\
kind: ode
name: vdp
system:
  states: [x, v]
  params:
    mu: [0.5, 5.0, 25.0]
  equations:
    x: v
    v: mu * (1 - x**2) * v - x
initial:
  x: 2.0
  v: 0.0
time:
  start: 0.0
  end: 10.0
  eval: 11
solver:
  method: dopri5
  rtol: 1.0e-6
  atol: 1.0e-6
"""

runner = CliRunner()


def write(folder: Path, text: str, name: str = "spec.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_solve_writes_the_output_contract_and_stats_reads_it(tmp_path):
    spec = write(tmp_path, VDP)
    out = tmp_path / "run.h5"
    result = runner.invoke(app, ["solve", str(spec), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "3 samples, 3 succeeded" in result.output
    with h5py.File(out) as h5:
        assert h5["t"].shape == (3, 11)
        assert h5["y"].shape == (3, 11, 2)
        assert list(h5["status"][...]) == [0, 0, 0]
        for name in ("n_steps", "n_accepted", "n_rejected", "n_f_evals"):
            assert h5["stats"][name].shape == (3,)
        assert np.all(h5["stats/n_steps"][...] == h5["stats/n_accepted"][...] + h5["stats/n_rejected"][...])
        assert h5.attrs["kind"] == "ode"
        assert list(h5.attrs["states"]) == ["x", "v"]
        assert h5.attrs["method"] == "dopri5"
        assert h5.attrs["rtol"] == 1e-6 and h5.attrs["atol"] == 1e-6
        assert h5.attrs["spec"] == VDP
        assert h5.attrs["wall_time_s"] > 0
        assert "odecli_version" in h5.attrs
        np.testing.assert_allclose(h5["params/mu"][...], [0.5, 5.0, 25.0])
        np.testing.assert_allclose(h5["y"][:, 0, :], [[2.0, 0.0]] * 3)
        steps = h5["stats/n_steps"][...]
    assert steps[2] > steps[0], "the stiffer sample (mu=25) must take more steps"

    result = runner.invoke(app, ["stats", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["samples"] == 3
    assert summary["status_counts"] == {"success": 3}
    assert summary["steps"]["max"] == steps.max()
    result = runner.invoke(app, ["stats", str(out), "--per-sample"])
    assert result.exit_code == 0
    assert "success" in result.output and "n_f_evals" in result.output


def test_long_per_sample_lists_print_as_plain_columns(tmp_path, monkeypatch):
    from odecli.report import stats

    spec = write(tmp_path, VDP)
    out = tmp_path / "run.h5"
    assert runner.invoke(app, ["solve", str(spec), "-o", str(out), "--quiet"]).exit_code == 0
    monkeypatch.setattr(stats, "RICH_ROWS_MAX", 2)  # 3 samples: past the rich table's limit
    output = runner.invoke(app, ["stats", str(out), "--per-sample"]).output
    lines = output[output.index("samples\nsample"):].splitlines()[1:]
    assert lines[0].split() == ["sample", "status", "n_steps", "n_accepted", "n_rejected", "n_f_evals"]
    assert len({len(line) for line in lines}) == 1  # right-aligned columns
    with h5py.File(out) as h5:
        want = [[str(i), "success", *(str(int(h5[f"stats/{n}"][i])) for n in
                                      ("n_steps", "n_accepted", "n_rejected", "n_f_evals"))] for i in range(3)]
    assert [line.split() for line in lines[1:]] == want


def test_stats_shows_the_implicit_counters_and_which_samples_switched(tmp_path):
    # examples/stiff-*.yaml point users at n_jac_evals / n_lu_decomps and n_switched /
    # switched_at_step "in the stats": odecli stats must show them, not only the HDF5 file hold them
    spec = write(tmp_path, VDP.replace("[0.5, 5.0, 25.0]", "[1.0, 1000.0]").replace("end: 10.0", "end: 3.0")
                 .replace("method: dopri5", "method: auto"))
    out = tmp_path / "run.h5"
    assert runner.invoke(app, ["solve", str(spec), "-o", str(out), "--quiet"]).exit_code == 0
    with h5py.File(out) as h5:
        jac = h5["stats/n_jac_evals"][...]
        switched = h5["stats/n_switched"][...]
        at = h5["stats/switched_at_step"][...]
    assert list(switched) == [0, 1]
    summary = json.loads(runner.invoke(app, ["stats", str(out), "--json", "--per-sample"]).output)
    assert summary["switched"] == 1
    assert summary["jac_evals"]["total"] == jac.sum() and "lu_decomps" in summary and "newton_iters" in summary
    assert [row["switched_at_step"] for row in summary["per_sample"]] == [None, int(at[1])]
    assert [row["n_jac_evals"] for row in summary["per_sample"]] == [int(j) for j in jac]
    output = runner.invoke(app, ["stats", str(out), "--per-sample"]).output
    assert "switched to rodas5" in output and "jac_evals" in output and "lu_decomps" in output
    header = next(line for line in output.splitlines() if line.split()[:2] == ["sample", "status"])
    assert header.split() == ["sample", "status", "n_steps", "n_accepted", "n_rejected", "n_f_evals",
                              "n_jac_evals", "n_lu_decomps", "n_newton_iters", "switched_at_step"]


def test_flags_override_the_spec(tmp_path):
    spec = write(tmp_path, VDP)
    out = tmp_path / "run.h5"
    result = runner.invoke(app, ["solve", str(spec), "-o", str(out), "--method", "tsit5", "--rtol", "1e-8", "--atol", "1e-9", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    with h5py.File(out) as h5:
        assert h5.attrs["method"] == "tsit5"
        assert h5.attrs["rtol"] == 1e-8 and h5.attrs["atol"] == 1e-9


def test_failed_samples_exit_3_and_still_write_the_file(tmp_path):
    spec = write(tmp_path, VDP.replace("  atol: 1.0e-6\n", "  atol: 1.0e-6\n  max_steps: 100\n"))
    out = tmp_path / "run.h5"
    result = runner.invoke(app, ["solve", str(spec), "-o", str(out)])
    assert result.exit_code == 3, result.output
    with h5py.File(out) as h5:
        status = h5["status"][...]
    assert status[0] == 0 and status[2] == 3  # mu=25 needs > 100 steps, mu=0.5 does not


@pytest.mark.parametrize(
    "change, message",
    [
        (("rtol: 1.0e-6", "rtol: -1"), "spec.yaml: solver.rtol: must be > 0, got -1"),
        (("method: dopri5", "method: nope"), "spec.yaml: solver.method:"),
        (("v: mu * (1 - x**2) * v - x", "v: __import__('os')"), "spec.yaml: system.equations.v:"),
        (("kind: ode", "kind: odd"), "spec.yaml: kind:"),
    ],
)
def test_bad_specs_give_one_line_errors_and_exit_2(tmp_path, change, message):
    spec = write(tmp_path, VDP.replace(*change))
    out = tmp_path / "run.h5"
    result = subprocess.run(
        [sys.executable, "-m", "odecli", "solve", str(spec), "-o", str(out)],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_bad_flags_and_missing_files_exit_2(tmp_path):
    spec = write(tmp_path, VDP)
    for args in (["solve", str(spec), "--rtol", "0"], ["solve", str(spec), "--method", "nope"],
                 ["solve", str(tmp_path / "missing.yaml")], ["stats", str(tmp_path / "missing.h5")],
                 ["solve", str(spec), "-o", str(tmp_path / "no" / "such" / "dir.h5")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "error:" in result.output


INVERSE = """\
inverse:
  unknowns: {params: {mu: {init: 1.0, bounds: [0.1, 30.0]}}}
  data: {truth: {params: {mu: 2.0}}}
  observed: [x]
"""


def test_a_gpu_that_is_not_there_is_named_as_the_field_or_flag_that_asked(tmp_path, monkeypatch):
    """solver.device: cuda on a machine without CUDA said neither the file nor the field."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    unavailable = "device 'cuda' requested but CUDA is not available; use cpu or auto"
    spec = write(tmp_path, VDP.replace("  atol: 1.0e-6", "  atol: 1.0e-6\n  device: cuda"))
    fit = write(tmp_path, VDP.replace("  atol: 1.0e-6", "  atol: 1.0e-6\n  device: cuda") + INVERSE, "fit.yaml")
    out = tmp_path / "run.h5"
    for args, message in (
        (["solve", str(spec), "-o", str(out)], f"error: {spec}: solver.device: {unavailable}"),
        (["solve", str(write(tmp_path, VDP, "plain.yaml")), "-o", str(out), "--device", "cuda"],
         f"error: --device: {unavailable}"),
        (["train-inverse", str(fit), "-o", str(out), "--iterations", "1"], f"error: {fit}: solver.device: {unavailable}"),
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.strip().splitlines() == [message], result.output
        assert not out.exists()


def test_stats_rejects_a_file_that_is_not_a_run(tmp_path):
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5")
    result = runner.invoke(app, ["stats", str(junk)])
    assert result.exit_code == 2 and "not an HDF5 file" in result.output
    with h5py.File(tmp_path / "foreign.h5", "w") as h5:
        h5["x"] = [1]
    result = runner.invoke(app, ["stats", str(tmp_path / "foreign.h5")])
    assert result.exit_code == 2 and "not an odecli run file" in result.output


def test_an_interrupted_write_leaves_no_partial_file(tmp_path, monkeypatch):
    import odecli.io.ode_run as ode_run

    spec = write(tmp_path, VDP)
    out = tmp_path / "run.h5"

    def broken(*args, **kwargs):
        raise RuntimeError("disk fell off")

    monkeypatch.setattr(ode_run, "as_numpy", broken)
    result = runner.invoke(app, ["solve", str(spec), "-o", str(out)])
    assert result.exit_code == 1
    assert "internal error" in result.output
    assert not out.exists()
    assert list(tmp_path.glob("*.tmp")) == [] and list(tmp_path.glob(".run.h5*")) == []


def test_version_and_help():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("odecli ")
    for command in ("solve", "stats", "train-inverse"):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0 and "Example:" in result.output


def test_the_package_exposes_the_solver_lazily():
    code = ("import sys, odecli; assert 'torch' not in sys.modules; import torch; "
            "s = odecli.solve(lambda t, y, p: -y, torch.ones(3, 1, dtype=torch.float64), 0.0, 1.0); "
            "assert abs(float(s.y_final[0, 0]) - 0.36787944117144233) < 1e-5; "
            "assert odecli.odeint is not None and odecli.Solution is not None")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_bad_input_is_reported_before_torch_is_imported(tmp_path):
    # `import torch` takes seconds: a bad field or an existing output must fail without it.
    good = Path(__file__).resolve().parents[1] / "examples" / "vdp-sweep.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("rtol: 1.0e-6", "rtol: -1").replace("rtol: 1e-6", "rtol: -1"))
    existing = tmp_path / "run.h5"
    existing.write_bytes(b"not ours to overwrite")
    pde = good.parent / "acoustic-anomaly.yaml"
    bad_pde = tmp_path / "bad-pde.yaml"
    bad_pde.write_text(pde.read_text().replace("iterations: 15", "iterations: -3"))
    cases = {"solver.rtol: must be > 0": ["solve", str(bad), "-o", str(tmp_path / "x.h5")],
             "output file exists": ["solve", str(good), "-o", str(existing)],
             "optimizer.iterations": ["train-inverse", str(bad_pde), "-o", str(tmp_path / "y.h5")]}
    for message, args in cases.items():
        code = ("import sys; from odecli.cli import app; sys.argv = ['odecli', *sys.argv[1:]]\n"
                "try:\n    app()\nexcept SystemExit as exc:\n    code = exc.code\n"
                "sys.exit(3 if 'torch' in sys.modules else code)")
        result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
        assert result.returncode == 2, (result.returncode, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr
    assert existing.read_bytes() == b"not ours to overwrite"


@pytest.mark.parametrize("example", ["vdp-sweep.yaml", "vdp-fit.yaml", "acoustic-anomaly.yaml",
                                     "heat-conductivity.yaml"])
def test_validate_never_imports_torch(example):
    spec = Path(__file__).resolve().parents[1] / "examples" / example
    code = ("import sys; from odecli.cli import app; sys.argv = ['odecli', 'validate', sys.argv[1]]\n"
            "try:\n    app()\nexcept SystemExit as exc:\n    code = exc.code\n"
            "sys.exit(3 if 'torch' in sys.modules else code)")
    result = subprocess.run([sys.executable, "-c", code, str(spec)], capture_output=True, text=True)
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert "valid" in result.stdout
