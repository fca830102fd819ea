"""Events (issue 44) across engines and files: the generated C solver against the PyTorch loop,
the spec's ``events:`` section (one-line errors, exit 2), the run file's ``events/NAME`` groups
(read back with xarray), ``odecli stats``, and the same file for one and two MPI ranks."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

import odecli
from mpi_helpers import run_mpi
from odecli.cli import app
from odecli.ode.events import Event
from odecli.ode.native import NativeEvent, NativeRhs, solve_native_arrays
from odecli.ode.native import events as native_events

CLI = Path(__file__).parent / "mpi_scripts" / "ode_cli.py"


def _pendulum_torch(t, y, p):
    return torch.stack([y[:, 1], -p["k"] * torch.sin(y[:, 0])], dim=1)


@pytest.mark.parametrize("method", ["dopri5", "tsit5", "dop853", "bosh3"])
def test_c_solver_events_equal_the_pytorch_loop(method, monkeypatch):
    """Same steps, statuses, evaluation counts and outputs; event times to round-off. A cap of 4
    occurrences forces the C side to solve the samples with more again (zero crossings come 2 to 8 times)."""
    monkeypatch.setattr(native_events, "FIRST_CAP", 4)
    rng = np.random.default_rng(1)
    batch = 64
    y0 = np.stack([rng.uniform(0.1, 2.5, batch), rng.uniform(-0.5, 0.5, batch)], 1)
    k = rng.uniform(0.5, 2.0, batch)
    grid = np.linspace(0, 20, 41)
    rhs = NativeRhs(("y[1]", "-p[0] * sin(y[0])"), ("k",),
                    (NativeEvent("y[0]", 0, 0, "zero"), NativeEvent("y[1] - 0.1 * t", -1, 3, "third")))
    c = solve_native_arrays(rhs, y0, 0.0, 20.0, grid, params={"k": k}, rtol=1e-8, atol=1e-8, method=method)
    events = [Event(lambda t, y, p: y[:, 0], 0, 0, "zero"), Event(lambda t, y, p: y[:, 1] - 0.1 * t, -1, 3, "third")]
    s = odecli.solve(_pendulum_torch, torch.tensor(y0), 0.0, 20.0, torch.tensor(grid), params={"k": torch.tensor(k)},
                     events=events, rtol=1e-8, atol=1e-8, method=method)
    assert set(np.unique(c.status)) == {0, 5}
    for name in ("status", "n_steps", "n_f_evals"):
        ours = c.status if name == "status" else c.stats[name]
        theirs = s.status if name == "status" else s.stats[name]
        assert np.array_equal(ours, theirs.numpy()), name
    assert np.array_equal(np.isnan(c.y), np.isnan(s.y.numpy()))
    assert np.nanmax(np.abs(c.y - s.y.numpy())) < 1e-10
    for name in ("zero", "third"):
        a, b = c.events[name], s.events[name]
        assert np.array_equal(a.count, b.count.numpy()) and a.t.shape == tuple(b.t.shape)
        assert np.array_equal(np.isnan(a.t), np.isnan(b.t.numpy()))
        assert np.nanmax(np.abs(a.t - b.t.numpy())) < 1e-11, name
        assert np.nanmax(np.abs(a.y - b.y.numpy())) < 1e-10, name
    zeros = c.events["zero"].count
    assert zeros.max() > 4 >= zeros.min()  # some samples were solved again, some not
    np.testing.assert_allclose(c.t_final, s.t_final.numpy(), rtol=0, atol=1e-11)


BALL = {
    "kind": "ode", "name": "ball",
    "system": {"states": ["h", "v"], "params": {"g": 9.81}, "equations": {"h": "v", "v": "-g"}},
    "initial": {"h": [10.0, 5.0, 1.0, 20.0], "v": [0.0, 2.0, -1.0, 0.0]},
    "time": {"start": 0, "end": 10, "eval": 21},
    "events": [{"name": "ground", "expression": "h", "direction": "falling", "terminal": True},
               {"name": "apex", "expression": "v", "direction": "falling"}],
}


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("events, message", [
    ([{"expression": "q"}], "events[0].expression: unknown name 'q'"),
    ([{"expression": ["h", "v"]}], "events[0].expression: expected an expression string or a number, got a list"),
    ([{"expression": "h", "terminal": -1}], "events[0].terminal: expected true, false or an integer >= 1"),
    ([{"expression": "h", "direction": "down"}], "events[0].direction: expected one of rising, falling, both"),
    ([{"expression": "h", "name": "a"}, {"expression": "v", "name": "a"}], "events[1].name: 'a' is already"),
    ({"expression": "h"}, "events: expected a list of events"),
])
def test_bad_events_are_one_line_errors_with_exit_2(tmp_path, events, message):
    spec = _write(tmp_path / "bad.yaml", {**BALL, "events": events})
    result = CliRunner().invoke(app, ["solve", str(spec), "-o", str(tmp_path / "out.h5")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and str(spec) in lines[0], result.output


@pytest.mark.parametrize("engine", ["native", "torch"])
def test_run_file_holds_padded_events_readable_by_xarray(tmp_path, engine):
    xr = pytest.importorskip("xarray")
    spec = _write(tmp_path / "ball.yaml", {**BALL, "solver": {"engine": engine, "rtol": 1e-9, "atol": 1e-9}})
    out = tmp_path / "ball.h5"
    result = CliRunner().invoke(app, ["solve", str(spec), "-o", str(out), "--quiet"])
    assert result.exit_code == 0, result.output  # a terminal event is an end, not a failure
    h0, v0 = np.array(BALL["initial"]["h"]), np.array(BALL["initial"]["v"])
    landing = (v0 + np.sqrt(v0 ** 2 + 2 * 9.81 * h0)) / 9.81
    with h5py.File(out, "r") as h5:
        assert h5.attrs["engine"] == engine
        assert (h5["status"][...] == 5).all()
        np.testing.assert_allclose(h5["t_final"][...], landing, rtol=1e-12)
        # the apex (v falling through 0) only for the sample thrown upwards; the others start at or below it
        assert h5["events/apex/count"][...].tolist() == [0, 1, 0, 0]
        t_ev = h5["events/ground/t"][...]
        assert t_ev.shape == (4, 1)
        grid = h5["t"][...]
        assert np.array_equal(np.isnan(h5["y"][:, :, 0]), grid > landing[:, None])
    ground = xr.open_dataset(out, engine="h5netcdf", group="events/ground")
    np.testing.assert_allclose(ground.t.values[:, 0], landing, rtol=1e-12)
    np.testing.assert_allclose(ground.y.sel(state="h").values[:, 0], 0.0, atol=1e-9)
    apex = xr.open_dataset(out, engine="h5netcdf", group="events/apex")
    assert apex["count"].values.tolist() == [0, 1, 0, 0] and apex.t.dims == ("sample", "occurrence")
    summary = CliRunner().invoke(app, ["stats", str(out), "--json"])
    assert summary.exit_code == 0, summary.output
    import json

    data = json.loads(summary.output)
    assert data["events"]["ground"]["total"] == 4 and data["events"]["apex"]["samples_with"] == 1
    picture = tmp_path / "ball.png"
    drawn = CliRunner().invoke(app, ["plot", str(out), "-o", str(picture)])
    assert drawn.exit_code == 0 and picture.stat().st_size > 0, drawn.output


def test_one_and_two_ranks_write_the_same_event_file(tmp_path, monkeypatch):
    from test_ode_mpi import _assert_same_content

    rng = np.random.default_rng(3)
    batch = 24
    data = {**BALL, "initial": {"h": [float(x) for x in np.round(rng.uniform(0.5, 30, batch), 3)],
                                "v": [float(x) for x in np.round(rng.uniform(-3, 8, batch), 3)]},
            "events": [{"name": "ground", "expression": "h", "direction": "falling", "terminal": 2},
                       {"name": "half", "expression": "h - 2", "direction": "both"}]}
    spec = _write(tmp_path / "ranks.yaml", data)
    monkeypatch.setenv("ODECLI_TEST_NO_TORCH", "1")
    one = tmp_path / "one.h5"
    result = CliRunner().invoke(app, ["solve", str(spec), "-o", str(one), "--quiet"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "two.h5"
    p = run_mpi(CLI, 2, ["solve", str(spec), "-o", str(out)], timeout=90)
    assert p.returncode == 0, p.stderr[-3000:]
    _assert_same_content(out, one, extra={"ranks", *(f"ranks/{k}" for k in (
        "rank", "chunk", "busy_s", "idle_s", "samples", "chunk_start", "chunk_stop", "chunk_rank"))})
    with h5py.File(one, "r") as h5:
        assert h5["events/half/t"].shape[1] >= 1


def test_c_solver_orders_events_in_one_step_and_stops_at_the_earliest_terminal_one():
    rhs = NativeRhs(("1.0",), (), (NativeEvent("y[0] - 0.3", 1, 1, "late"), NativeEvent("y[0] - 0.2", 1, 1, "early"),
                                   NativeEvent("y[0] - 0.1", 1, 0, "before")))
    grid = np.array([0.0, 0.1, 0.2, 0.25, 1.0])
    sol = solve_native_arrays(rhs, np.zeros((2, 1)), 0.0, 1.0, grid, dt0=1.0)
    assert sol.stats["n_steps"].tolist() == [1, 1]
    assert sol.events["late"].count.tolist() == [0, 0] and sol.events["early"].count.tolist() == [1, 1]
    np.testing.assert_allclose(sol.events["before"].t[:, 0], 0.1, atol=1e-15)
    np.testing.assert_allclose(sol.t_final, 0.2, atol=1e-15)
    np.testing.assert_allclose(sol.y[:, :3, 0], np.tile(grid[:3], (2, 1)), atol=1e-15)
    assert np.isnan(sol.y[:, 3:]).all() and (sol.status == 5).all()
