"""``odecli plot``: real PNG/PDF files of the promised pixel size, for ODE and inverse runs; one-line flag errors."""

from __future__ import annotations

import struct
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from odecli.cli import app

# Three Van der Pol samples; max_steps 100 makes the stiff mu=25 sample fail (status 3).
VDP = """\
kind: ode
name: vdp
system:
  states: [x, v]
  params:
    mu: [0.5, 1.0, 25.0]
  equations:
    x: v
    v: mu * (1 - x**2) * v - x
initial:
  x: 2.0
  v: 0.0
time:
  start: 0.0
  end: 10.0
  eval: 21
solver:
  method: dopri5
  rtol: 1.0e-6
  atol: 1.0e-6
  max_steps: 100
"""

VDP_FIT_SPEC = """\
kind: ode
name: fit
system:
  states: [x, v]
  params: {mu: 1.0}
  equations: {x: v, v: "mu * (1 - x**2) * v - x"}
initial: {x: [1.0, 1.5, 2.0], v: 0.0}
time: {start: 0.0, end: 4.0, eval: 21}
inverse:
  unknowns: {params: {mu: {per_sample: true, init: 1.0, bounds: [0.1, 5.0]}}}
  data: {truth: {params: {mu: [0.5, 1.5, 2.5]}}, noise: 0.01, seed: 1}
  observed: [x]
"""

runner = CliRunner()
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, after checking the PNG signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def assert_pdf(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(b"%PDF-"), f"{path} is not a PDF"
    assert b"%%EOF" in data[-64:]


def no_temporaries(folder: Path) -> bool:
    return not list(folder.glob(".*.tmp"))


@pytest.fixture(scope="module")
def ode_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ode")
    spec = folder / "vdp.yaml"
    spec.write_text(VDP)
    out = folder / "vdp.h5"
    result = runner.invoke(app, ["solve", str(spec), "-o", str(out)])
    assert result.exit_code == 3, result.output  # one sample fails on purpose
    with h5py.File(out) as h5:
        assert list(h5["status"][...]) == [0, 0, 3]
    return out


def write_pde_inverse(path: Path, shots: int = 2, nrec: int = 5, nt: int = 60) -> Path:
    """A synthetic pde-inverse run file with the writer's layout (traces: shots x receivers x steps)."""
    ny, nx = 20, 30
    yy, xx = np.mgrid[0:ny, 0:nx]
    true = 2.0 + 0.5 * np.exp(-((yy - 10) ** 2 + (xx - 15) ** 2) / 20.0)
    t = np.arange(nt) * 0.01
    observed = np.sin(20 * t[None, None, :] + np.arange(nrec)[None, :, None]) * np.ones((shots, 1, 1))
    with h5py.File(path, "w") as h5:
        h5.attrs["kind"] = "pde-inverse"
        h5.attrs["name"] = "synthetic"
        h5.attrs["equation"] = "acoustic"
        h5.attrs["optimizer"] = "adam"
        h5.attrs["grid_spacing"] = np.array([10.0, 10.0])
        h5["fields/true"] = true
        h5["fields/initial"] = np.full((ny, nx), 2.0)
        h5["fields/final"] = 0.5 * (true + 2.0)
        h5["history/loss"] = np.logspace(0, -3, 12)
        h5["history/grad_norm"] = np.logspace(1, -1, 12)
        h5["history/wall_time_s"] = np.linspace(0.1, 1.2, 12)
        h5["history/misfit"] = np.logspace(0, -3, 12) * 0.9
        h5["data/observed"] = observed
        h5["data/predicted"] = 0.8 * observed
        h5["data/time"] = t
        h5["geometry/receivers"] = np.stack([np.full(nrec, 1), np.linspace(1, nx - 2, nrec).astype(int)], 1)
        h5["geometry/sources"] = np.array([[s, 1, 5 + 10 * s] for s in range(shots)])
    return path


def write_ode_inverse(path: Path) -> Path:
    t = np.linspace(0, 5, 40)
    y = np.stack([np.cos(t), -np.sin(t)], axis=-1)
    with h5py.File(path, "w") as h5:
        h5.attrs["kind"] = "ode-inverse"
        h5.attrs["name"] = "fit"
        h5.attrs["states"] = np.array(["x", "v"], dtype=object)
        h5["history/loss"] = np.logspace(0, -4, 30)
        h5["history/grad_norm"] = np.logspace(0, -2, 30)
        h5["history/wall_time_s"] = np.linspace(0.01, 0.3, 30)
        h5["t"] = t
        h5["y"] = y
        h5["params/k"] = np.array([1.0])
    return path


def test_ode_trajectory_png_has_the_promised_size_and_default_name(ode_run, tmp_path):
    run = tmp_path / "run.h5"
    run.write_bytes(ode_run.read_bytes())
    result = runner.invoke(app, ["plot", str(run)])
    assert result.exit_code == 0, result.output
    picture = tmp_path / "run.png"  # default: <run stem>.png beside the run
    assert picture.is_file() and f"wrote {picture}" in result.output
    assert png_size(picture) == (800, 500)  # two panels: figsize (8, 2*2+1) inches at 100 dpi
    assert "failed" in result.output  # the failed sample is reported (and drawn dashed)
    assert no_temporaries(tmp_path)


def test_ode_states_phase_and_pdf(ode_run, tmp_path):
    one = tmp_path / "v.png"
    result = runner.invoke(app, ["plot", str(ode_run), "--states", "v", "--samples", "0,2", "-o", str(one)])
    assert result.exit_code == 0, result.output
    assert png_size(one) == (800, 300)  # one panel
    phase = tmp_path / "phase.png"
    result = runner.invoke(app, ["plot", str(ode_run), "--phase", "x,v", "-o", str(phase)])
    assert result.exit_code == 0, result.output
    assert png_size(phase) == (700, 600)
    pdf = tmp_path / "traj.pdf"
    result = runner.invoke(app, ["plot", str(ode_run), "-o", str(pdf)])
    assert result.exit_code == 0, result.output
    assert_pdf(pdf)


def test_failed_samples_are_dashed_and_selection_is_respected(ode_run):
    from odecli.report.plot import PlotRequest, make_figure

    with h5py.File(ode_run) as h5:
        fig = make_figure(h5, PlotRequest(samples="0,2", states="x"))
        y = h5["y"][...]
    try:
        (ax,) = fig.axes
        lines = [line for line in ax.get_lines() if line.get_label().startswith("sample")]
        assert len(lines) == 2
        styles = {line.get_label().split(" (")[0]: line.get_linestyle() for line in lines}
        assert styles == {"sample 0": "-", "sample 2": "--"}
        np.testing.assert_array_equal(lines[0].get_ydata(), y[0, :, 0])
        assert "failed" in lines[1].get_label()
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_many_samples_are_capped_with_a_note(tmp_path):
    spec = tmp_path / "many.yaml"
    mus = ", ".join(str(0.1 * i) for i in range(25))
    spec.write_text(VDP.replace("[0.5, 1.0, 25.0]", f"[{mus}]").replace("  max_steps: 100\n", "")
                    .replace("eval: 21", "eval: 5").replace("end: 10.0", "end: 1.0"))
    run = tmp_path / "many.h5"
    assert runner.invoke(app, ["solve", str(spec), "-o", str(run)]).exit_code == 0
    from odecli.report.plot import PlotRequest, make_figure

    request = PlotRequest()
    with h5py.File(run) as h5:
        fig = make_figure(h5, request)
    import matplotlib.pyplot as plt

    n_lines = len(fig.axes[0].get_lines())
    plt.close(fig)
    assert n_lines == 20
    assert request.notes and "20 of 25" in request.notes[0]
    result = runner.invoke(app, ["plot", str(run), "-o", str(tmp_path / "m.png")])
    assert result.exit_code == 0 and "20 of 25" in result.output


def test_pde_inverse_png_and_pdf(tmp_path):
    run = write_pde_inverse(tmp_path / "fwi.h5")
    result = runner.invoke(app, ["plot", str(run)])
    assert result.exit_code == 0, result.output
    assert png_size(tmp_path / "fwi.png") == (1300, 800)
    result = runner.invoke(app, ["plot", str(run), "--shot", "1", "-o", str(tmp_path / "fwi.pdf")])
    assert result.exit_code == 0, result.output
    assert_pdf(tmp_path / "fwi.pdf")


def test_pde_inverse_panels_share_one_colour_scale_and_log_loss(tmp_path):
    from odecli.report.plot import PlotRequest, make_figure

    run = write_pde_inverse(tmp_path / "fwi.h5")
    with h5py.File(run) as h5:
        fig = make_figure(h5, PlotRequest(shot=1))
        true = h5["fields/true"][...]
        observed = h5["data/observed"][1]
    import matplotlib.pyplot as plt

    try:
        images = [ax.images[0] for ax in fig.axes if ax.images]
        assert len(images) == 3
        assert {im.get_clim() for im in images} == {(2.0, float(true.max()))}
        loss_ax = next(ax for ax in fig.axes if ax.get_title() == "loss")
        assert loss_ax.get_yscale() == "log"
        traces_ax = next(ax for ax in fig.axes if ax.get_title().startswith("shot 1"))
        observed_line = next(line for line in traces_ax.get_lines() if line.get_label() == "observed")
        scale = np.abs(observed[[0, 1, 2, 4]]).max()  # 4 of 5 receivers, evenly spread
        np.testing.assert_allclose(observed_line.get_ydata(), observed[0] / scale)
    finally:
        plt.close(fig)


def test_ode_inverse_plot_draws_the_fitted_data(tmp_path):
    """train-inverse writes its data as the root dataset 'data' (sample, time, observed state) with
    the attribute 'observed': the plot draws each observed state's data in its panel."""
    from odecli.report.plot import PlotRequest, make_figure

    spec = tmp_path / "fit.yaml"
    spec.write_text(VDP_FIT_SPEC)
    run = tmp_path / "fit.h5"
    result = runner.invoke(app, ["train-inverse", str(spec), "-o", str(run), "--iterations", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    import matplotlib.pyplot as plt

    with h5py.File(run) as h5:
        t, data = h5["t"][...], h5["data"][...]
        fig = make_figure(h5, PlotRequest(samples="1", states="x,v"))
    try:
        panels = {ax.get_ylabel(): ax for ax in fig.axes}
        points = {name: [line for line in panels[name].get_lines() if line.get_label() == "observed"]
                  for name in ("x", "v")}
        assert len(points["x"]) == 1 and points["v"] == []  # only x is observed
        np.testing.assert_array_equal(points["x"][0].get_xdata(), t[1])
        np.testing.assert_array_equal(points["x"][0].get_ydata(), data[1, :, 0])
    finally:
        plt.close(fig)


def test_ode_inverse_png(tmp_path):
    run = write_ode_inverse(tmp_path / "fit.h5")
    result = runner.invoke(app, ["plot", str(run), "-o", str(tmp_path / "fit.png")])
    assert result.exit_code == 0, result.output
    assert png_size(tmp_path / "fit.png") == (800, 700)  # loss + two state panels


@pytest.mark.parametrize(
    "args, message",
    [
        (["--samples", "7"], "--samples: sample 7 is out of range"),
        (["--samples", "0,x"], "--samples: 'x' is not a sample index"),
        # an empty value (an unset shell variable) is not "all samples"
        (["--samples", ""], "--samples: empty value; expected sample indices"),
        (["--samples", " "], "--samples: empty value"),
        (["--states", ""], "--states: empty value; expected state names, e.g. x,v"),
        (["--phase", ""], "--phase: empty value"),
        (["--states", "q"], "--states: unknown state 'q'"),
        (["--phase", "x"], "--phase: expected two different state names"),
        (["--phase", "x,nope"], "--phase: unknown state 'nope'"),
        (["--shot", "1"], "--shot: only applies to pde-inverse runs"),
        (["-o", "fig.jpg"], "--output:"),
    ],
)
def test_bad_ode_flags_exit_2_with_one_line(ode_run, tmp_path, args, message):
    args = [a if a != "fig.jpg" else str(tmp_path / a) for a in args]
    out = tmp_path / "bad.png"
    full = ["plot", str(ode_run), *args] if "-o" in args else ["plot", str(ode_run), "-o", str(out), *args]
    result = runner.invoke(app, full)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert not out.exists() and no_temporaries(tmp_path)


def test_bad_pde_flags_and_missing_files(tmp_path):
    run = write_pde_inverse(tmp_path / "fwi.h5")
    for args, message in ((["--shot", "2"], "--shot: shot 2 is out of range"),
                          (["--samples", "0"], "--samples: only applies to ODE runs"),
                          (["--samples", ""], "--samples: only applies to ODE runs"),
                          ([str(tmp_path / "missing.h5")], "file not found"),
                          ([str(tmp_path / "fwi.png")], "file not found")):
        target = args if args[0].startswith(str(tmp_path)) else [str(run), *args]
        result = runner.invoke(app, ["plot", *target])
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "fwi.png").exists() and no_temporaries(tmp_path)


def test_an_existing_picture_is_replaced_only_with_force(ode_run, tmp_path):
    picture = tmp_path / "x.png"
    picture.write_bytes(b"precious")
    args = ["plot", str(ode_run), "--states", "x", "-o", str(picture)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "--force" in result.stderr
    assert picture.read_bytes() == b"precious"
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0
    assert png_size(picture) == (800, 300)
