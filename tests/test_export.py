"""Files other tools open: xarray reads ODE runs with named dimensions; ``odecli export --csv`` round-trips values."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from odecli.cli import app
from test_plot import VDP, write_ode_inverse, write_pde_inverse

runner = CliRunner()
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ode_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("export")
    spec = folder / "vdp.yaml"
    # a shared parameter besides the per-sample one, and a failed sample (status 3)
    spec.write_text(VDP.replace("    mu: [0.5, 1.0, 25.0]\n", "    mu: [0.5, 1.0, 25.0]\n    k: 1.0\n")
                    .replace("v: mu * (1 - x**2) * v - x", "v: mu * (1 - x**2) * v - k * x"))
    out = folder / "vdp.h5"
    result = runner.invoke(app, ["solve", str(spec), "-o", str(out)])
    assert result.exit_code == 3, result.output
    return out


def read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    return rows[0], rows[1:]


# ---------------------------------------------------------------- xarray


def test_xarray_opens_an_ode_run_with_named_dimensions(ode_run):
    import xarray as xr  # the 'test' extra installs xarray and h5netcdf: a missing one must fail

    with h5py.File(ode_run) as h5:
        t, y, status = h5["t"][...], h5["y"][...], h5["status"][...]
        t_final, y_final = h5["t_final"][...], h5["y_final"][...]
    with xr.open_dataset(ode_run, engine="h5netcdf") as ds:
        assert ds["y"].dims == ("sample", "time", "state")
        assert ds["t"].dims == ("sample", "time")
        assert ds["status"].dims == ("sample",)
        assert ds["y_final"].dims == ("sample", "state")
        assert dict(ds.sizes) == {"sample": 3, "time": 21, "state": 2}
        assert list(ds["state"].values) == ["x", "v"]
        np.testing.assert_array_equal(ds["sample"].values, [0, 1, 2])
        np.testing.assert_array_equal(ds["time"].values, np.arange(21))
        np.testing.assert_array_equal(ds["y"].values, y)
        np.testing.assert_array_equal(ds["t"].values, t)
        np.testing.assert_array_equal(ds["status"].values, status)
        np.testing.assert_array_equal(ds["t_final"].values, t_final)
        np.testing.assert_array_equal(ds["y_final"].values, y_final)
        np.testing.assert_array_equal(ds["y"].sel(state="v", sample=2).values, y[2, :, 1])
        for name in ("t", "y", "status", "t_final", "y_final", "sample", "time", "state"):
            assert ds[name].attrs.get("description"), name
            assert ds[name].attrs.get("long_name"), name
        assert "success" in ds["status"].attrs["flag_meanings"]
        assert ds.attrs["kind"] == "ode" and ds.attrs["method"] == "dopri5"


def test_xarray_reads_the_stats_and_params_groups_by_sample_and_t_as_a_coordinate_of_y(ode_run):
    """Issue 43: the groups came back as ``phony_dim_0`` with a warning; ``t`` stood apart from y."""
    import warnings

    import xarray as xr

    with h5py.File(ode_run) as h5:
        steps, mu = h5["stats/n_steps"][...], h5["params/mu"][...]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no phony-dimension warning
        with xr.open_dataset(ode_run, engine="h5netcdf", group="stats") as stats:
            assert stats["n_steps"].dims == ("sample",)
            np.testing.assert_array_equal(stats["n_steps"].values, steps)
    with xr.open_dataset(ode_run, engine="h5netcdf", group="params", phony_dims="sort") as params:
        assert params["mu"].dims == ("sample",)  # per sample; the shared k keeps a length-1 axis
        np.testing.assert_array_equal(params["mu"].values, mu)
    with xr.open_dataset(ode_run, engine="h5netcdf") as ds:
        assert "t" in ds["y"].coords and ds["y"].coords["t"].dims == ("sample", "time")


def test_every_dataset_in_an_ode_run_has_a_description(ode_run):
    missing = []
    with h5py.File(ode_run) as h5:
        h5.visititems(lambda name, obj: missing.append(name)
                      if isinstance(obj, h5py.Dataset) and not obj.attrs.get("description") else None)
        # the original contract is unchanged
        assert h5["y"].shape == (3, 21, 2) and h5["t"].shape == (3, 21) and h5["status"].shape == (3,)
        assert list(h5.attrs["states"]) == ["x", "v"]
    assert not missing, missing


# ---------------------------------------------------------------- CSV, ODE runs


def test_export_ode_round_trips_trajectories_and_samples(ode_run, tmp_path):
    folder = tmp_path / "nested" / "csv"  # created if missing
    result = runner.invoke(app, ["export", str(ode_run), "--csv", str(folder)])
    assert result.exit_code == 0, result.output
    assert "trajectories.csv" in result.output and "samples.csv" in result.output
    with h5py.File(ode_run) as h5:
        t, y, status = h5["t"][...], h5["y"][...], h5["status"][...]
        stats = {name: h5["stats"][name][...] for name in h5["stats"]}
        mu, k = h5["params/mu"][...], h5["params/k"][...]
        y_final = h5["y_final"][...]

    header, rows = read_csv(folder / "trajectories.csv")
    assert header == ["sample", "t", "x", "v"]
    table = np.array(rows, dtype=float)
    assert table.shape == (3 * 21, 4)
    np.testing.assert_array_equal(table[:, 0], np.repeat([0, 1, 2], 21))
    np.testing.assert_array_equal(table[:, 1], t.reshape(-1))  # exact: shortest round-trip repr
    np.testing.assert_array_equal(table[:, 2:], y.reshape(-1, 2))
    loaded = np.genfromtxt(folder / "trajectories.csv", delimiter=",", names=True)
    np.testing.assert_array_equal(loaded["v"], y[:, :, 1].reshape(-1))

    header, rows = read_csv(folder / "samples.csv")
    columns = {name: [row[i] for row in rows] for i, name in enumerate(header)}
    assert header[:3] == ["sample", "status", "status_name"]
    assert columns["sample"] == ["0", "1", "2"]
    assert [int(v) for v in columns["status"]] == list(status)
    assert columns["status_name"] == ["success", "success", "reached_max_steps"]
    for name, values in stats.items():
        np.testing.assert_array_equal(np.array(columns[name], dtype=float), values)
    np.testing.assert_array_equal(np.array(columns["mu"], dtype=float), mu)
    np.testing.assert_array_equal(np.array(columns["k"], dtype=float), np.full(3, k.reshape(-1)[0]))
    np.testing.assert_array_equal(np.array(columns["final_v"], dtype=float), y_final[:, 1])
    assert not list(folder.glob(".*.tmp"))


def test_export_refuses_to_overwrite_without_force_and_needs_csv(ode_run, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "samples.csv").write_text("mine")
    result = runner.invoke(app, ["export", str(ode_run), "--csv", str(folder)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--force" in lines[0], result.stderr
    assert (folder / "samples.csv").read_text() == "mine" and not (folder / "trajectories.csv").exists()
    assert runner.invoke(app, ["export", str(ode_run), "--csv", str(folder), "--force"]).exit_code == 0
    assert (folder / "samples.csv").read_text().startswith("sample,status,status_name")

    for args, message in ((["export", str(ode_run)], "--csv:"),
                          (["export", str(tmp_path / "missing.h5"), "--csv", str(folder)], "file not found"),
                          (["export", str(ode_run), "--csv", str(folder / "samples.csv")], "not a folder")):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


# ---------------------------------------------------------------- CSV, inverse runs


def test_export_pde_inverse_history_traces_and_fields(tmp_path):
    run = write_pde_inverse(tmp_path / "fwi.h5")
    folder = tmp_path / "csv"
    result = runner.invoke(app, ["export", str(run), "--csv", str(folder)])
    assert result.exit_code == 0, result.output
    with h5py.File(run) as h5:
        history = {name: h5["history"][name][...] for name in h5["history"]}
        observed, predicted, time = h5["data/observed"][...], h5["data/predicted"][...], h5["data/time"][...]
        fields = {name: h5["fields"][name][...] for name in h5["fields"]}

    header, rows = read_csv(folder / "history.csv")
    assert header == ["iteration", "loss", "grad_norm", "wall_time_s", "misfit"]
    table = np.array(rows, dtype=float)
    np.testing.assert_array_equal(table[:, 0], np.arange(12))
    for i, name in enumerate(header[1:], start=1):
        np.testing.assert_array_equal(table[:, i], history[name])

    header, rows = read_csv(folder / "traces.csv")
    assert header == ["shot", "receiver", "time", "observed", "predicted"]
    table = np.array(rows, dtype=float)
    shots, receivers, steps = observed.shape
    assert table.shape == (shots * receivers * steps, 5)
    np.testing.assert_array_equal(table[:, 3], observed.reshape(-1))
    np.testing.assert_array_equal(table[:, 4], predicted.reshape(-1))
    np.testing.assert_array_equal(table[:, 2], np.tile(time, shots * receivers))
    np.testing.assert_array_equal(table[:, 1], np.tile(np.repeat(np.arange(receivers), steps), shots))

    for name, values in fields.items():
        grid = np.loadtxt(folder / f"field_{name}.csv", delimiter=",", skiprows=1)
        np.testing.assert_array_equal(grid, values)


def test_export_ode_inverse_history_and_fit(tmp_path):
    run = write_ode_inverse(tmp_path / "fit.h5")
    folder = tmp_path / "csv"
    result = runner.invoke(app, ["export", str(run), "--csv", str(folder)])
    assert result.exit_code == 0, result.output
    with h5py.File(run) as h5:
        loss, t, y = h5["history/loss"][...], h5["t"][...], h5["y"][...]
    header, rows = read_csv(folder / "history.csv")
    assert header[:4] == ["iteration", "loss", "grad_norm", "wall_time_s"]
    np.testing.assert_array_equal(np.array([r[1] for r in rows], dtype=float), loss)
    header, rows = read_csv(folder / "trajectories.csv")
    assert header == ["sample", "t", "x", "v"]
    table = np.array(rows, dtype=float)
    np.testing.assert_array_equal(table[:, 1], t)
    np.testing.assert_array_equal(table[:, 2:], y)
    header, rows = read_csv(folder / "params.csv")
    assert header == ["name", "index", "value"] and rows == [["k", "0", "1.0"]]


# ---------------------------------------------------------------- all or nothing

# The CLI in a fresh process whose files may not grow past LIMIT bytes (RLIMIT_FSIZE): a real
# write failure ("File too large") part-way through an export, as a full disk would cause.
LIMITED_CLI = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
from odecli.cli import app
sys.argv = ["odecli", *sys.argv[2:]]
app()
"""


def export_with_file_size_limit(limit: int, *args: str) -> subprocess.CompletedProcess:
    pytest.importorskip("resource")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-c", LIMITED_CLI, str(limit), "export", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=REPO_ROOT)


def test_an_export_failing_after_its_first_file_leaves_nothing_behind(tmp_path):
    """history.csv (about 1 kB) fits under the limit, traces.csv (about 25 kB) does not."""
    run = write_pde_inverse(tmp_path / "fwi.h5")
    target = tmp_path / "new" / "nested" / "csv"
    proc = export_with_file_size_limit(4096, str(run), "--csv", str(target))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == (f"error: --csv: cannot write the CSV files into {target}: "
                                            "File too large; nothing was written"), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fwi.h5"]  # no folder, no staging, no parents
    result = runner.invoke(app, ["export", str(run), "--csv", str(target)])  # a rerun needs no --force
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in target.iterdir()) == ["field_final.csv", "field_initial.csv", "field_true.csv",
                                                        "history.csv", "traces.csv"]


def test_a_failed_export_into_an_existing_folder_keeps_what_was_there(tmp_path):
    run = write_pde_inverse(tmp_path / "fwi.h5")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "history.csv").write_text("previous export")
    proc = export_with_file_size_limit(4096, str(run), "--csv", str(folder), "--force")
    assert proc.returncode == 2 and "nothing was written" in proc.stderr, proc.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["history.csv", "notes.txt"]
    assert (folder / "history.csv").read_text() == "previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fwi.h5", "out"]


def test_an_interrupted_export_replaces_none_of_the_old_files(ode_run, tmp_path, monkeypatch):
    """Ctrl-C after trajectories.csv: with --force, the previous export stays whole."""
    import odecli.io.export as export

    folder = tmp_path / "csv"
    folder.mkdir()
    before = {"trajectories.csv": "sample,t,x,v\n0,0.0,1.0,2.0\n", "samples.csv": "sample,status\n0,0\n"}
    for name, text in before.items():  # an earlier export, of another run
        (folder / name).write_text(text)

    def interrupted(h5, folder):
        assert (folder / "trajectories.csv").exists()  # the first file was written
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "_samples", interrupted)
    result = runner.invoke(app, ["export", str(ode_run), "--csv", str(folder), "--force"])
    assert result.exit_code == 130, result.output
    assert {p.name: p.read_text() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["csv"]


BALLS = """
kind: ode
name: balls
system: {states: [h, v], params: {g: 9.81}, equations: {h: v, v: -g}}
initial: {h: [10, 5, 1], v: [0, 3, 8]}
time: {start: 0, end: 10, eval: 11}
events:
  - {name: ground, expression: h, direction: falling, terminal: true}
  - {name: apex, expression: v, direction: falling}
solver: {method: dopri5, rtol: 1.0e-8, atol: 1.0e-10}
"""


def test_export_writes_every_event_occurrence_as_one_row_of_events_csv(tmp_path):
    (tmp_path / "balls.yaml").write_text(BALLS)
    run = tmp_path / "balls.h5"
    assert runner.invoke(app, ["solve", str(tmp_path / "balls.yaml"), "-o", str(run)]).exit_code == 0
    result = runner.invoke(app, ["export", str(run), "--csv", str(tmp_path / "csv")])
    assert result.exit_code == 0, result.output
    header, rows = read_csv(tmp_path / "csv" / "events.csv")
    assert header == ["event", "sample", "occurrence", "t", "h", "v"]
    with h5py.File(run) as h5:
        expected = [[name, str(i), str(k), repr(float(h5[f"events/{name}/t"][i, k])),
                     *(repr(float(v)) for v in h5[f"events/{name}/y"][i, k])]
                    for name in h5["events"] for i in range(3) for k in range(int(h5[f"events/{name}/count"][i]))]
        total = sum(int(h5[f"events/{name}/count"][...].sum()) for name in h5["events"])
    assert rows == expected and len(rows) == total == 5  # three landings, the apex of two upward throws


def test_a_damaged_event_group_is_one_line_and_exports_nothing(tmp_path):
    (tmp_path / "balls.yaml").write_text(BALLS)
    run = tmp_path / "balls.h5"
    assert runner.invoke(app, ["solve", str(tmp_path / "balls.yaml"), "-o", str(run)]).exit_code == 0
    with h5py.File(run, "a") as h5:
        del h5["events/apex/y"]
        h5["events/apex/y"] = np.zeros((2, 1, 2))
    result = runner.invoke(app, ["export", str(run), "--csv", str(tmp_path / "csv")])
    assert result.exit_code == 2
    assert "events/apex/y has shape (2, 1, 2), expected (3, 1) first (from 't')" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "csv").exists()
