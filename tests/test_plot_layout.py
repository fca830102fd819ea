"""``odecli plot`` figures that read right: legends and notes that overlap nothing (checked on
the rendered extents), log axes labelled at decades only, iterations from 1, units on PDE
figures, phase-portrait start points on top, and sparse runs drawn from a dense re-solve that
passes through every stored point (or marked sparse where the spec cannot be re-solved)."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from odecli.cli import app
from odecli.report.plot import PlotRequest, make_figure

from test_plot import VDP_FIT_SPEC, write_ode_inverse, write_pde_inverse

runner = CliRunner()

# 21 stored points over t = 0..10 of Van der Pol: too few for straight lines between them.
SPARSE_VDP = """\
kind: ode
name: sparse
system:
  states: [x, v]
  params:
    mu: [MUS]
  equations:
    x: v
    v: mu * (1 - x**2) * v - x
initial: {x: 2.0, v: 0.0}
time: {start: 0.0, end: 10.0, eval: 21}
solver: {method: dopri5, rtol: 1.0e-8, atol: 1.0e-8}
"""


def solve(tmp_path: Path, mus: list[float], name: str = "run") -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(SPARSE_VDP.replace("MUS", ", ".join(str(m) for m in mus)))
    out = tmp_path / f"{name}.h5"
    result = runner.invoke(app, ["solve", str(spec), "-o", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def sparse_run(tmp_path_factory) -> Path:
    return solve(tmp_path_factory.mktemp("sparse"), [0.5, 2.0, 8.0])


@pytest.fixture(scope="module")
def many_run(tmp_path_factory) -> Path:
    return solve(tmp_path_factory.mktemp("many"), [0.2 + 0.1 * i for i in range(25)], "many")


def figure_of(run: Path, request: PlotRequest):
    with h5py.File(run) as h5:
        return make_figure(h5, request)


def close(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def extents(fig):
    """(renderer, figure box) after drawing, so every artist's extent is final."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return renderer, fig.bbox


def inside(box, outer, slack: float = 1.0) -> bool:
    return (box.x0 >= outer.x0 - slack and box.y0 >= outer.y0 - slack
            and box.x1 <= outer.x1 + slack and box.y1 <= outer.y1 + slack)


def test_the_legend_is_beside_the_axes_and_inside_the_figure(many_run):
    fig = figure_of(many_run, PlotRequest(samples="0-11", states="v"))
    try:
        renderer, page = extents(fig)
        (legend,) = fig.legends
        box = legend.get_window_extent(renderer)
        assert inside(box, page), (box, page)  # not cut off
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer))  # covers no trace
        assert len(legend.get_texts()) == 12
    finally:
        close(fig)


def test_past_twenty_lines_there_is_no_legend_but_a_note(many_run):
    request = PlotRequest(samples="0-24")
    fig = figure_of(many_run, request)
    try:
        assert fig.legends == []
        assert any("no legend for 25 lines" in note for note in request.notes)
    finally:
        close(fig)


def test_the_note_is_below_the_x_label_and_inside_the_figure(many_run):
    request = PlotRequest(states="x")
    fig = figure_of(many_run, request)
    try:
        assert any("showing 20 of 25 samples" in note for note in request.notes)
        renderer, page = extents(fig)
        note = fig._supxlabel
        assert "showing 20 of 25" in note.get_text()
        note_box = note.get_window_extent(renderer)
        assert inside(note_box, page)
        (ax,) = fig.axes
        label_box = ax.xaxis.label.get_window_extent(renderer)
        assert not note_box.overlaps(label_box) and note_box.y1 <= label_box.y0
        assert not note_box.overlaps(ax.xaxis.get_tightbbox(renderer))
    finally:
        close(fig)


def decade_labels(axis, renderer) -> list[float]:
    """The positions of the labelled major ticks inside the axis' view."""
    low, high = sorted(axis.get_view_interval())
    ticks = axis.get_major_ticks()
    locs = axis.get_majorticklocs()
    return [loc for loc, tick in zip(locs, ticks) if low * 0.999 <= loc <= high * 1.001 and tick.label1.get_text()]


@pytest.mark.parametrize("losses", [np.array([0.031, 0.030, 0.0295]), np.logspace(0, -3, 12)])
def test_loss_axes_are_labelled_at_decades_only_and_count_iterations_as_the_log_does(tmp_path, losses):
    run = write_pde_inverse(tmp_path / "fwi.h5")
    with h5py.File(run, "r+") as h5:
        del h5["history/loss"]
        h5["history/loss"] = losses
    fig = figure_of(run, PlotRequest())
    try:
        renderer, _ = extents(fig)
        ax = next(a for a in fig.axes if a.get_title() == "loss")
        assert ax.get_yscale() == "log"
        labelled = decade_labels(ax.yaxis, renderer)
        assert len(labelled) >= 2
        for value in labelled:
            assert math.isclose(10 ** round(math.log10(value)), value, rel_tol=1e-9), labelled
        assert all(not t.label1.get_text() for t in ax.yaxis.get_minor_ticks())  # no 2.5, 7.5 labels
        (line,) = ax.get_lines()
        np.testing.assert_array_equal(line.get_xdata(), np.arange(losses.size))  # row k: after k iterations
        assert ax.get_xlabel() == "iterations done (0: the initial guess)"
    finally:
        close(fig)


def test_ode_fit_loss_counts_as_the_log_does_and_names_the_data_in_the_legend(tmp_path):
    spec = tmp_path / "fit.yaml"
    spec.write_text(VDP_FIT_SPEC)
    run = tmp_path / "fit.h5"
    result = runner.invoke(app, ["train-inverse", str(spec), "-o", str(run), "--iterations", "2", "--quiet"])
    assert result.exit_code == 0, result.output
    fig = figure_of(run, PlotRequest())
    try:
        loss_ax = fig.axes[0]
        # the log prints start, iter 1/2, iter 2/2: three points at 0, 1, 2
        np.testing.assert_array_equal(loss_ax.get_lines()[0].get_xdata(), [0, 1, 2])
        (legend,) = fig.legends
        assert any("observed data" in text.get_text() for text in legend.get_texts())
    finally:
        close(fig)


def test_logx_and_logy_set_log_scales(tmp_path):
    run = write_ode_inverse(tmp_path / "fit.h5")
    with h5py.File(run, "r+") as h5:
        y = h5["y"][...]
        del h5["y"]
        h5["y"] = np.abs(y) + 0.1
    fig = figure_of(run, PlotRequest(logx=True, logy=True))
    try:
        trajectories = fig.axes[1:]
        assert [ax.get_xscale() for ax in trajectories] == ["log", "log"]
        assert [ax.get_yscale() for ax in trajectories] == ["log", "log"]
    finally:
        close(fig)
    out = tmp_path / "log.png"
    result = runner.invoke(app, ["plot", str(run), "--logx", "-o", str(out)])
    assert result.exit_code == 0 and out.is_file(), result.output
    assert "t <= 0" in result.output or "times <= 0" in result.output  # t starts at 0: said, not hidden


def test_logx_is_refused_for_pde_fits(tmp_path):
    run = write_pde_inverse(tmp_path / "fwi.h5")
    result = runner.invoke(app, ["plot", str(run), "--logx"])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: --logx: only applies to ODE runs")


def test_a_sparse_run_is_drawn_from_a_dense_re_solve_through_every_stored_point(sparse_run):
    request = PlotRequest(states="x")
    fig = figure_of(sparse_run, request)
    with h5py.File(sparse_run) as h5:
        t, y = h5["t"][...], h5["y"][...]
    try:
        (ax,) = fig.axes
        lines = [line for line in ax.get_lines() if line.get_label().startswith("sample")]
        assert len(lines) == 3
        for i, line in enumerate(lines):
            xs, ys = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
            assert xs.size > 10 * t.shape[1]
            np.testing.assert_allclose(np.interp(t[i], xs, ys), y[i, :, 0], atol=1e-4)
        assert any("re-solved" in note for note in request.notes)
    finally:
        close(fig)


def test_a_sparse_run_that_cannot_be_re_solved_is_marked_sparse(sparse_run, tmp_path):
    run = tmp_path / "copy.h5"
    run.write_bytes(sparse_run.read_bytes())
    with h5py.File(run, "r+") as h5:
        del h5.attrs["spec"]
        y = h5["y"][...]
    request = PlotRequest(states="v")
    fig = figure_of(run, request)
    try:
        (ax,) = fig.axes
        lines = [line for line in ax.get_lines() if line.get_label().startswith("sample")]
        np.testing.assert_array_equal(lines[0].get_ydata(), y[0, :, 1])  # the stored points themselves
        assert all(line.get_marker() == "o" for line in lines)
        assert any(note.startswith("sparse output: 21 stored times") for note in request.notes)
    finally:
        close(fig)


def test_phase_portrait_start_points_are_on_top_and_in_the_legend(sparse_run):
    fig = figure_of(sparse_run, PlotRequest(phase="x,v"))
    try:
        (ax,) = fig.axes
        starts = [line for line in ax.get_lines() if line.get_label().startswith("initial state")]
        (start,) = starts
        assert start.get_zorder() > max(line.get_zorder() for line in ax.get_lines() if line is not start)
        np.testing.assert_array_equal(start.get_xdata(), [2.0, 2.0, 2.0])
        (legend,) = fig.legends
        assert legend.get_texts()[0].get_text() == "initial states"
    finally:
        close(fig)


def all_text(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]


def test_pde_figures_carry_units_and_say_what_the_traces_are_divided_by(tmp_path):
    run = write_pde_inverse(tmp_path / "fwi.h5")
    with h5py.File(run, "r+") as h5:
        h5.attrs["equation"] = "acoustic2d"
    fig = figure_of(run, PlotRequest())
    try:
        fields = [ax for ax in fig.axes if ax.images]
        assert {(ax.get_xlabel(), ax.get_ylabel()) for ax in fields} == {("x (m)", "y (m)")}
        colourbar = next(ax for ax in fig.axes if "(m/s)" in ax.get_ylabel())
        assert "wave speed" in colourbar.get_ylabel()
        traces = next(ax for ax in fig.axes if ax.get_title().startswith("shot 0"))
        assert traces.get_xlabel() == "time (s)"
        assert "the largest |observed|" in traces.get_ylabel()
        assert not any("scaled by" in text for text in all_text(fig))
        renderer, page = extents(fig)
        (legend,) = fig.legends
        assert inside(legend.get_window_extent(renderer), page)
        assert {t.get_text() for t in legend.get_texts()} == {"receivers", "source of shot 0", "observed",
                                                              "predicted"}
    finally:
        close(fig)


def test_heat_fields_are_conductivity_in_square_metres_per_second(tmp_path):
    run = write_pde_inverse(tmp_path / "heat.h5")
    with h5py.File(run, "r+") as h5:
        h5.attrs["equation"] = "heat2d"
    fig = figure_of(run, PlotRequest())
    try:
        assert any("conductivity" in ax.get_ylabel() and "m²/s" in ax.get_ylabel() for ax in fig.axes)
        assert any(ax.get_title() == "true conductivity" for ax in fig.axes)
    finally:
        close(fig)
