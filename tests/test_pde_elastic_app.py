"""elastic2d from spec to result file: the bad-spec one-liners of `odecli validate` (unknown
parameter, vs > vp, vs < 0, unstable dt, a component that does not exist), a small fit of vp and
vs through the command line (train-inverse -> stats -> plot), and 2 ranks against 1."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from odecli.cli import app

sys.path.insert(0, str(Path(__file__).parent))
from mpi_helpers import run_mpi  # noqa: E402

sys.path.pop(0)

SMALL = {
    "kind": "pde-inverse",
    "equation": "elastic2d",
    "grid": {"shape": [25, 31], "spacing": 10.0},  # uneven splits over 2 ranks, either way
    "time": {"dt": 0.002, "steps": 90},
    "boundary": {"absorbing_width": 5, "free_surface": True},
    "sources": {"type": "fy", "wavelet": {"type": "ricker", "peak_frequency": 15}, "amplitude": 1.0e6,
                "positions": [[10, 80], [10, 210]]},
    "receivers": {"line": [{"from": [10, 50], "to": [10, 240], "count": 8, "component": "vy"},
                           {"from": [10, 50], "to": [10, 240], "count": 8, "component": "vx"}],
                  "positions": [[120, 60]], "component": "pressure"},
    "true_model": {"vp": {"type": "gaussian", "background": 2000, "amplitude": 200, "center": [110, 100],
                          "sigma": 40},
                   "vs": {"type": "gaussian", "background": 1000, "amplitude": 120, "center": [110, 200],
                          "sigma": 40},
                   "rho": 2000},
    # a starting vp that differs from block to block (a constant one would hide a block sent to the wrong rank)
    "unknown": {"type": "grid", "parameters": {"vp": {"initial": {"type": "gaussian", "background": 2000,
                                                                  "amplitude": 60, "center": [100, 60],
                                                                  "sigma": 50},
                                                      "bounds": [1500, 2600]},
                                               "vs": {"initial": 1000, "bounds": [600, 1400]}},
                "fixed_border": 5},
    "optimizer": {"type": "lbfgs", "iterations": 3},
    "compute": {"threads": 1},
}


def _set(raw: dict, dotted: str, value) -> dict:
    raw = copy.deepcopy(raw)
    *path, last = dotted.split(".")
    node = raw
    for key in path:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    node[last] = value
    return raw


BAD = [
    ("unknown.parameters", {"vq": {"initial": 1}}, "unknown.parameters.vq: elastic2d has no parameter 'vq'"),
    ("true_model.lambda", 3.0, "true_model.lambda: elastic2d has no parameter 'lambda'"),
    ("true_model.vs", 2500, "true_model: vs must be <= vp everywhere"),
    ("true_model.vs", {"type": "gaussian", "background": 1000, "amplitude": 1100, "center": [110, 200],
                       "sigma": 40}, "true_model: vs must be <= vp everywhere"),
    ("true_model.vs", -5, "true_model: vs must be >= 0 everywhere"),
    ("true_model.rho", 0, "true_model: rho must be > 0 everywhere"),
    ("unknown.parameters.vs.initial", 2150, "unknown: vs must be <= vp everywhere"),
    ("time.dt", 0.004, "time.dt: unstable: true_model.vp reaches P-wave speed 2200"),
    ("receivers.line", [{"from": [10, 50], "to": [10, 240], "count": 8, "component": "vz"}],
     "receivers.line[0].component: expected one of"),
    ("sources.type", "fz", "sources.type: expected one of"),
    ("true_model", 2000, "true_model: elastic2d has parameters vp, vs, rho"),
    ("unknown.parameters.vs.bounds", [-100, 1400], "unknown.parameters.vs.bounds: vs must be >= 0"),
]


@pytest.mark.parametrize("key, value, message", BAD, ids=[f"{k}={v}"[:40] for k, v, _ in BAD])
def test_validate_names_every_fault_in_one_line(tmp_path, key, value, message):
    spec = tmp_path / "e.yaml"
    spec.write_text(yaml.safe_dump(_set(SMALL, key, value)))
    result = CliRunner().invoke(app, ["validate", str(spec)])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert "Traceback" not in result.output


def test_unstable_bound_is_refused_before_running(tmp_path):
    spec = tmp_path / "e.yaml"
    spec.write_text(yaml.safe_dump(_set(SMALL, "unknown.parameters.vp.bounds", [1500, 5000])))
    result = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(tmp_path / "o.h5"), "-q"])
    assert result.exit_code == 2 and "unknown.parameters.vp.bounds reaches P-wave speed 5000" in result.output


@pytest.fixture(scope="module")
def elastic_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("elastic")
    spec = tmp / "e.yaml"
    spec.write_text(yaml.safe_dump(SMALL))
    out = tmp / "e.h5"
    result = CliRunner().invoke(app, ["train-inverse", str(spec), "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    return spec, out


def test_fit_writes_each_parameter_and_stats_and_plot_show_them(elastic_run, tmp_path):
    _, out = elastic_run
    with h5py.File(out) as f:
        assert {"true_vp", "true_vs", "true_rho", "initial_vp", "final_vp", "initial_vs", "final_vs"} <= set(f["fields"])
        assert "final_rho" not in f["fields"]
        assert f["data/observed"].shape == (2, 17, 90)
        assert f["fields/initial_vp"][10, 6] > f["fields/initial_vp"][10, 25] + 30  # the Gaussian start
        for name in ("vp", "vs"):
            err = f[f"history/model_error_{name}"][...]
            assert err[-1] < err[0], (name, err)
        assert json.loads(f.attrs["inverted"]) == ["vp", "vs"]
        assert json.loads(f.attrs["receiver_components"]) == ["pressure"] + ["vy"] * 8 + ["vx"] * 8
    summary = json.loads(CliRunner().invoke(app, ["stats", str(out), "--json"]).output)
    assert set(summary["model_errors"]) == {"vp", "vs"} and summary["equation"] == "elastic2d"
    png = tmp_path / "e.png"
    result = CliRunner().invoke(app, ["plot", str(out), "-o", str(png)])
    assert result.exit_code == 0 and png.stat().st_size > 10_000, result.output


def test_two_ranks_equal_one_rank(elastic_run, tmp_path):
    spec, one = elastic_run
    two = tmp_path / "two.h5"
    main = Path(__file__).resolve().parents[1] / "odecli" / "__main__.py"
    proc = run_mpi(main, 2, ["train-inverse", str(spec), "-o", str(two), "-q"], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(one) as a, h5py.File(two) as b:
        assert b.attrs["ranks"] == 2
        np.testing.assert_array_equal(b["data/observed"][...], a["data/observed"][...])  # the forward: bit for bit
        np.testing.assert_allclose(b["history/loss"][...], a["history/loss"][...], rtol=1e-10)
        for name in ("final_vp", "final_vs"):
            np.testing.assert_allclose(b[f"fields/{name}"][...], a[f"fields/{name}"][...], rtol=1e-10)


def test_kill_after_checkpoint_then_resume_is_identical(tmp_path, monkeypatch):
    """A several-parameter fit's checkpoint holds both grid parameters and their history columns."""
    raw = {**copy.deepcopy(SMALL), "checkpoint": {"every": 2}, "optimizer": {"type": "lbfgs", "iterations": 4}}
    spec = tmp_path / "e.yaml"
    spec.write_text(yaml.safe_dump(raw))
    script = Path(__file__).parent / "mpi_scripts" / "pde_train.py"
    full, part = tmp_path / "full.h5", tmp_path / "part.h5"
    assert run_mpi(script, 2, [str(spec), str(full)], timeout=300).returncode == 0
    monkeypatch.setenv("ODECLI_PDE_EXIT_AFTER_CHECKPOINT", "2")
    assert run_mpi(script, 2, [str(spec), str(part)], timeout=300).returncode != 0
    assert part.with_name("part.ckpt.h5").exists() and not part.exists()
    monkeypatch.delenv("ODECLI_PDE_EXIT_AFTER_CHECKPOINT")
    proc = run_mpi(script, 2, [str(spec), str(part), "--resume"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with h5py.File(full) as a, h5py.File(part) as b:
        for name in ("fields/final_vp", "fields/final_vs", "history/loss", "history/model_error_vs"):
            np.testing.assert_array_equal(a[name][...], b[name][...])
