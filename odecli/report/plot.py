"""``odecli plot``: a picture of a run file (PNG or PDF, Matplotlib's Agg backend, no display needed).

* ODE runs: trajectories against t, one panel per state and one line per sample (at most
  ``MAX_DEFAULT_SAMPLES`` unless ``--samples`` picks them), or a phase portrait of two states;
  failed samples are drawn dashed.
* pde-inverse runs: true / initial / final fields side by side on one colour scale, the loss
  curve (log scale) and observed vs predicted traces of a few receivers for one shot.
* ode-inverse runs: the loss curve and the fitted trajectories.

This module reads the flags and picks the figure; ``plot_ode`` and ``plot_pde`` draw them and
``plot_axes`` holds what every figure shares (legends beside the axes, notes the layout makes
room for, decade ticks on log axes, iterations counted from 1).

Figure sizes are fixed (``figure_size``) so a picture's pixel size is predictable:
width = figsize[0] * DPI, height = figsize[1] * DPI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from odecli.errors import InputError
from odecli.io.layout import open_run, run_kind

from odecli.report.plot_axes import DPI

MAX_DEFAULT_SAMPLES = 20
FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}


@dataclass
class PlotRequest:
    """What to draw; strings come straight from the command line and are checked here."""

    samples: Optional[str] = None  # "0,3,5" or "0-4,7"
    states: Optional[str] = None  # "x,v"
    phase: Optional[str] = None  # "x,v"
    shot: int = 0  # pde-inverse: which shot's traces to show
    logx: bool = False  # ODE runs: log time axis (e.g. stiff kinetics over many decades of t)
    logy: bool = False  # ODE runs: log state axes
    notes: list[str] = field(default_factory=list)  # filled in: what the user should know


def figure_size(kind: str, n_panels: int = 1) -> tuple[float, float]:
    """The figure size in inches for a kind of plot (``n_panels``: trajectory panels)."""
    if kind == "ode":
        return (8.0, 2.0 * max(n_panels, 1) + 1.0)
    if kind == "phase":
        return (7.0, 6.0)
    if kind == "pde-inverse":  # n_panels: rows of fields (one per parameter)
        return (13.0, 8.0 + 3.6 * (max(n_panels, 1) - 1))
    if kind == "ode-inverse":
        return (8.0, 2.0 * (max(n_panels, 1) + 1) + 1.0)
    raise ValueError(kind)


def default_output(run: Path) -> Path:
    return Path(run).with_suffix(".png")


def plot_run(run: Path, output: Optional[Path] = None, request: Optional[PlotRequest] = None,
             force: bool = False) -> Path:
    """Draw ``run`` into ``output`` (default ``<run stem>.png`` beside it), atomically; return the path.

    An existing picture is replaced only with ``force``.
    """
    from odecli.io.atomic import atomic_path, check_writable

    request = request or PlotRequest()
    run = Path(run)
    target = Path(output) if output is not None else default_output(run)
    fmt = FORMATS.get(target.suffix.lower())
    if fmt is None:
        raise InputError(f"--output: {target}: unsupported picture format {target.suffix or '(none)'!r}; "
                         f"use one of {', '.join(FORMATS)}")
    plt = _pyplot()
    with open_run(run) as h5:
        fig = make_figure(h5, request)
    try:
        check_writable(target, force=force)  # after the flags were checked against the run
        with atomic_path(target, replace=force) as tmp:
            fig.savefig(tmp, format=fmt, dpi=DPI)
    finally:
        plt.close(fig)
    return target


def make_figure(h5, request: Optional[PlotRequest] = None):
    """The Matplotlib figure for an open run file (dispatched on its ``kind``); flags are checked here."""
    request = request or PlotRequest()
    plt = _pyplot()
    before = set(plt.get_fignums())
    try:
        return _dispatch(h5, request, plt)
    except BaseException:
        for number in set(plt.get_fignums()) - before:  # a flag rejected mid-drawing leaks no figure
            plt.close(number)
        raise


def _dispatch(h5, request: PlotRequest, plt):
    kind = run_kind(h5)
    if kind != "pde-inverse" and request.shot != 0:
        raise InputError(f"--shot: only applies to pde-inverse runs; this run is of kind {kind!r}")
    if kind == "ode":
        from odecli.report.plot_ode import plot_ode

        return plot_ode(h5, request, plt)
    if kind == "pde-inverse":
        from odecli.report.plot_pde import plot_pde_inverse

        _refuse_ode_flags(request, kind)
        return plot_pde_inverse(h5, request, plt)
    if kind == "ode-inverse":
        from odecli.report.plot_ode import plot_ode_inverse

        if request.phase is not None:
            raise InputError("--phase: phase portraits are for ODE runs (kind ode)")
        return plot_ode_inverse(h5, request, plt)
    raise InputError(f"{h5.filename}: cannot plot a run of kind {kind!r}")


def _pyplot():
    """pyplot on the Agg backend (chosen before pyplot is imported; no display is ever needed)."""
    try:
        import matplotlib
    except ImportError:
        raise InputError("odecli plot needs Matplotlib: pip install 'odecli[plot]'") from None

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------- flag parsing


def parse_samples(text: Optional[str], n_samples: int, notes: list[str],
                  most: int = MAX_DEFAULT_SAMPLES) -> list[int]:
    """Sample indices from ``--samples`` ("0,3,5", "2-6"); default: all, or an even spread of ``most``.

    Only an absent flag means the default: ``--samples ''`` (an unset shell variable, say) is an
    error rather than silently drawing everything.
    """
    if text is None:
        if n_samples <= most:
            return list(range(n_samples))
        picked = sorted({int(round(i)) for i in np.linspace(0, n_samples - 1, most)})
        notes.append(f"showing {len(picked)} of {n_samples} samples (evenly spread); choose others with --samples")
        return picked
    _refuse_empty(text, "--samples", "sample indices, e.g. 0,3,5 or 2-6")
    picked: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part.lstrip("-"):
                lo, hi = part.split("-", 1)
                values = list(range(int(lo), int(hi) + 1))
                if not values:
                    raise ValueError
            else:
                values = [int(part)]
        except ValueError:
            raise InputError(f"--samples: {part!r} is not a sample index or range (expected e.g. 0,3,5 or 2-6)") from None
        for index in values:
            if not 0 <= index < n_samples:
                raise InputError(f"--samples: sample {index} is out of range; the run has {n_samples} samples "
                                 f"(0..{n_samples - 1})")
            if index not in picked:
                picked.append(index)
    return picked


def parse_states(text: Optional[str], names: Sequence[str], flag: str = "--states") -> list[int]:
    """State indices from comma-separated names (a plain index also works); default (no flag): all states."""
    if text is None:
        return list(range(len(names)))
    _refuse_empty(text, flag, f"state names, e.g. {','.join(names[:2])}")
    picked: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if part in names:
            index = list(names).index(part)
        elif part.isdigit() and int(part) < len(names):
            index = int(part)
        else:
            raise InputError(f"{flag}: unknown state {part!r}; the run's states are {', '.join(names)}")
        if index not in picked:
            picked.append(index)
    return picked


def _refuse_empty(text: str, flag: str, expected: str) -> None:
    """A flag given with an empty value is a mistake, not a request for the default."""
    if not text.strip():
        raise InputError(f"{flag}: empty value; expected {expected} (leave the flag out for the default)")


def _refuse_ode_flags(request: PlotRequest, kind: str) -> None:
    for flag, value in (("--samples", request.samples), ("--states", request.states), ("--phase", request.phase),
                        ("--logx", request.logx or None), ("--logy", request.logy or None)):
        if value is not None:
            raise InputError(f"{flag}: only applies to ODE runs; this run is of kind {kind!r}")
