"""ODE figures for ``odecli plot``: trajectories against t, phase portraits, and ODE fits.

Sparse output. A run file holds the solution only at its stored times (``time.eval``); the
solver's steps between them are gone. Where a stored point lies off the straight line through
its two neighbours by more than ``SPARSE_BEND`` of the state's range (101 points over t = 0..40
of a stiff Van der Pol bend by up to 0.36 of it, 301 Lotka-Volterra points by 0.036, 201
points of a pendulum by 0.006), straight lines between the points draw corners and spikes the
ODE does not have. Such runs are drawn from ``plot_dense``'s re-solve of their own spec, which
passes through every stored point, and the figure says so. Where that cannot be done (a
``python:`` right-hand side, failed samples, see ``plot_dense``) we do not interpolate (a spline
through the points is not the ODE's solution either): the stored points are drawn as markers on
thin lines and a note on the figure says the output is sparse and how to get more points.
"""

from __future__ import annotations

import numpy as np

from odecli.errors import InputError
from odecli.io.export import event_arrays
from odecli.io.layout import as_batched, numbers, require, state_names
from odecli.report.plot import PlotRequest, figure_size, parse_samples, parse_states
from odecli.report.plot_axes import DPI, add_notes, decade_log_axis, draw_loss, figure_legend

MAX_DEFAULT_FITS = 8  # a fit's panels also carry its data points: fewer samples by default
SPARSE_BEND = 0.01  # a stored point this far (fraction of the state's range) off its neighbours' chord: sparse


def _state_names(h5, n_states: int) -> list[str]:
    return state_names(h5, n_states)


EVENT_MARKERS = ("X", "v", "^", "D", "s", "P", "*")  # one per event, in the sample's colour


def _failed(code) -> bool:
    """A sample that did not end normally: not at t_end (status 0) and not at a terminal event (5)."""
    return int(code) not in (0, 5)


def _status_label(code: int) -> str:
    from odecli.ode.status import STATUS_NAMES

    return STATUS_NAMES.get(int(code), str(code))


def _sample_labels(h5, n_samples: int, prefix: str = "sample") -> list[str]:
    """'sample i' plus up to two per-sample parameter values, e.g. 'sample 3 (mu=2)'."""
    varying = []
    if "params" in h5:
        for name in h5["params"]:
            values = np.asarray(h5["params"][name][...]).reshape(-1)
            if values.size == n_samples and n_samples > 1 and np.ptp(values) > 0:
                varying.append((name, values))
    labels = []
    for i in range(n_samples):
        extra = ", ".join(f"{name}={values[i]:g}" for name, values in varying[:2])
        labels.append(f"{prefix} {i}" + (f" ({extra})" if extra else ""))
    return labels


def is_sparse(t: np.ndarray, y: np.ndarray, picked: list[int], states: list[int]) -> bool:
    """Whether straight lines between the stored points would misdraw any drawn state: some
    stored point lies off the chord between its neighbours by more than ``SPARSE_BEND`` of the
    state's range (a corner a smooth curve would not have)."""
    if y.shape[1] < 3:
        return True
    times = t[picked]
    with np.errstate(invalid="ignore", divide="ignore"):
        weight = (times[:, 1:-1] - times[:, :-2]) / (times[:, 2:] - times[:, :-2])
        for s in states:
            values = y[picked, :, s]
            finite = values[np.isfinite(values)]
            span = float(finite.max() - finite.min()) if finite.size else 0.0
            if span <= 0:
                continue
            chord = values[:, :-2] + (values[:, 2:] - values[:, :-2]) * weight
            bend = np.abs(values[:, 1:-1] - chord)
            if np.nanmax(bend, initial=0.0) > SPARSE_BEND * span:
                return True
    return False


def _sparse_note(t: np.ndarray) -> str:
    return (f"sparse output: {t.shape[-1]} stored times per sample, drawn as markers joined by straight "
            "lines (the solution between them is not in the file); raise time.eval in the spec for smooth curves")


def _colours(plt, n: int):
    return plt.get_cmap("viridis")(np.linspace(0.0, 0.9, max(n, 1)))


def _draw_line(ax, x, y, colour, failed: bool, sparse: bool, label: str):
    return ax.plot(x, y, color=colour, linestyle="--" if failed else "-", linewidth=0.9 if sparse else 1.2,
                   marker="o" if sparse else None, markersize=2.5, label=label)[0]


def _densify(h5, request: PlotRequest, t, y, status, picked, sparse: bool, fitted=None, points: int = 4000):
    """(t, y, still sparse) to draw: the run re-solved densely when it is sparse and can be.

    Failed samples are drawn as stored: the figure then shows exactly where the file says they
    stopped."""
    if not sparse or (status is not None and (status[picked] != 0).any()):
        return t, y, sparse
    from odecli.report.plot_dense import dense_solution

    dense = dense_solution(h5, t, y, fitted, points)
    if dense is None:
        return t, y, sparse
    t_dense, y_dense, _ = dense
    request.notes.append(f"curves: the run's spec re-solved at {t_dense.shape[1]} times per sample for drawing "
                         f"(the file stores {t.shape[1]}); they pass through every stored point")
    return t_dense, y_dense, False


def _log_scales(axes, request: PlotRequest, t: np.ndarray, y: np.ndarray, picked, states) -> None:
    """--logx / --logy: log axes at decades; points at or below zero cannot be drawn and are noted."""
    if request.logx:
        shown = t[picked]
        for ax in axes:
            decade_log_axis(ax, shown, "x", whole_decades=False)
        if (shown <= 0).any():
            request.notes.append("--logx: times <= 0 are not drawn")
    if request.logy:
        for ax, s in zip(axes, states):
            if not decade_log_axis(ax, y[picked, :, s], "y"):
                request.notes.append("--logy: a state with no positive value is drawn on a linear axis")
        if (y[np.ix_(picked, range(y.shape[1]), states)] <= 0).any():
            request.notes.append("--logy: values <= 0 are not drawn")


def _draw_trajectories(axes, t, y, status, picked, states, names, labels, sparse, plt) -> list:
    """One line per picked sample in each state's panel; returns the first panel's lines (legend)."""
    colours = _colours(plt, len(picked))
    handles = []
    for panel, (ax, s) in enumerate(zip(axes, states)):
        for colour, i in zip(colours, picked):
            failed = status is not None and _failed(status[i])
            label = labels[i] + (f" [failed: {_status_label(status[i])}]" if failed else "")
            line = _draw_line(ax, t[i], y[i, :, s], colour, failed, sparse, label)
            if panel == 0:
                handles.append(line)
        ax.set_ylabel(names[s])
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("t")
    return handles


def _through_terminal_events(h5, t: np.ndarray, y: np.ndarray, status) -> tuple[np.ndarray, np.ndarray]:
    """Samples a terminal event ended (status 5) drawn on to it: their final point (``t_final``,
    ``y_final``) follows their last stored one, so a curve does not stop short of its event."""
    if status is None or not (status == 5).any() or "t_final" not in h5 or "y_final" not in h5:
        return t, y
    t_final, y_final = numbers(h5, "t_final"), numbers(h5, "y_final")
    if t_final.shape != status.shape or y_final.shape != (status.size, y.shape[2]):
        return t, y
    t = np.concatenate([t, np.full((t.shape[0], 1), np.nan)], axis=1)
    y = np.concatenate([y, np.full((y.shape[0], 1, y.shape[2]), np.nan)], axis=1)
    for i in np.flatnonzero(status == 5):
        stored = np.flatnonzero(np.isfinite(y[i]).all(axis=1))
        at = stored[-1] + 1 if stored.size else 0
        t[i, at], y[i, at] = t_final[i], y_final[i]
        t[i, at + 1:], y[i, at + 1:] = np.nan, np.nan
    return t, y


def _draw_events(h5, axes, picked, states, plt) -> list[tuple]:
    """Each event's occurrences (``events/NAME/t`` and ``y``, odecli.io.ode_run) as markers on the
    picked samples' trajectories, one marker shape per event; returns (handle, label) per event drawn."""
    if "events" not in h5:
        return []
    colours = _colours(plt, len(picked))
    marks = []
    for k, (name, group) in enumerate(sorted(h5["events"].items())):
        if not all(key in group for key in ("t", "y")):
            continue
        t_ev, y_ev = event_arrays(h5, name, "y", None)  # numeric, (sample, occurrence) and (..., state)
        if t_ev.shape[0] <= max(picked, default=0):
            raise InputError(f"{h5.filename}: events/{name}: t has shape {t_ev.shape} and y {y_ev.shape}, "
                             f"expected (sample, occurrence) and (sample, occurrence, state)")
        handle = None
        for ax, s in zip(axes, states):
            for colour, i in zip(colours, picked):
                hit = np.isfinite(t_ev[i])
                if hit.any():
                    handle = ax.plot(t_ev[i, hit], y_ev[i, hit, s], EVENT_MARKERS[k % len(EVENT_MARKERS)],
                                     markerfacecolor=colour, markeredgecolor="black", markeredgewidth=0.6,
                                     markersize=6, linestyle="none", zorder=5)[0]
        if handle is not None:
            marks.append((handle, f"event {name}"))
    return marks


def _title(h5, n_samples: int) -> str:
    return f"{h5.attrs.get('name', '')} ({h5.attrs.get('method', '')}, {n_samples} samples)".strip()


def plot_ode(h5, request: PlotRequest, plt):
    require(h5, "t", "y", optional=("status", "params/"))
    t, y = as_batched(h5["t"][...], h5["y"][...])
    status = h5["status"][...].astype(int) if "status" in h5 else None
    names = _state_names(h5, y.shape[2])
    picked = parse_samples(request.samples, y.shape[0], request.notes)
    labels = _sample_labels(h5, y.shape[0])
    failed = [i for i in picked if status is not None and _failed(status[i])]
    if failed:
        request.notes.append(f"{len(failed)} of the shown samples failed (drawn dashed)")
    if request.phase is not None:
        return _plot_phase(h5, request, plt, t, y, status, names, picked, labels)
    states = parse_states(request.states, names)
    t, y, sparse = _densify(h5, request, t, y, status, picked, is_sparse(t, y, picked, states))
    t, y = _through_terminal_events(h5, t, y, status)
    fig, axes = plt.subplots(len(states), 1, figsize=figure_size("ode", len(states)), dpi=DPI,
                             sharex=True, squeeze=False, layout="constrained")
    handles = _draw_trajectories(axes[:, 0], t, y, status, picked, states, names, labels, sparse, plt)
    marks = _draw_events(h5, axes[:, 0], picked, states, plt)
    _log_scales(axes[:, 0], request, t, y, picked, states)
    if sparse:
        request.notes.append(_sparse_note(t))
    figure_legend(fig, handles, [h.get_label() for h in handles], request.notes, always=marks)
    # the title over the axes, not the figure: a figure title would run under the legend beside them
    axes[0, 0].set_title(_title(h5, y.shape[0]), fontsize="medium")
    add_notes(fig, request.notes)
    return fig


def _plot_phase(h5, request: PlotRequest, plt, t, y, status, names, picked, labels):
    pair = parse_states(request.phase, names, "--phase")
    if len(pair) != 2:
        raise InputError(f"--phase: expected two different state names, e.g. --phase {','.join(names[:2])}")
    if request.states is not None:
        raise InputError("--states: cannot be combined with --phase (the phase flag names the two states)")
    a, b = pair
    # a phase portrait crosses fast jumps in a few output times: four times the points
    t, y, sparse = _densify(h5, request, t, y, status, picked, is_sparse(t, y, picked, pair), points=16000)
    t, y = _through_terminal_events(h5, t, y, status)
    fig, ax = plt.subplots(figsize=figure_size("phase"), dpi=DPI, layout="constrained")
    colours = _colours(plt, len(picked))
    handles = []
    for colour, i in zip(colours, picked):
        failed = status is not None and _failed(status[i])
        label = labels[i] + (f" [failed: {_status_label(status[i])}]" if failed else "")
        handles.append(_draw_line(ax, y[i, :, a], y[i, :, b], colour, failed, sparse, label))
    # the initial states last and on top, so no trajectory hides them
    start = ax.plot(y[picked, 0, a], y[picked, 0, b], "o", color="black", markerfacecolor="white",
                    markeredgewidth=1.5, markersize=8, linestyle="none", zorder=5, label="initial state")[0]
    ax.set_xlabel(names[a])
    ax.set_ylabel(names[b])
    ax.grid(True, alpha=0.3)
    if request.logx:
        decade_log_axis(ax, y[picked, :, a], "x")
    if request.logy:
        decade_log_axis(ax, y[picked, :, b], "y")
    if sparse:
        request.notes.append(_sparse_note(t))
    figure_legend(fig, handles, [h.get_label() for h in handles], request.notes,
                  always=[(start, "initial state" + ("s" if len(picked) > 1 else ""))])
    ax.set_title(f"phase portrait {names[a]}-{names[b]}: {_title(h5, y.shape[0])}", fontsize="medium")
    add_notes(fig, request.notes)
    return fig




def plot_ode_inverse(h5, request: PlotRequest, plt):
    require(h5, "history/loss", "t", "y", optional=("status", "data"))
    t, y = as_batched(np.asarray(h5["t"][...], dtype=float), np.asarray(h5["y"][...], dtype=float))
    names = _state_names(h5, y.shape[2])
    picked = parse_samples(request.samples, y.shape[0], request.notes, MAX_DEFAULT_FITS)
    states = parse_states(request.states, names)
    status = h5["status"][...].astype(int).reshape(-1) if "status" in h5 else None
    if status is not None and status.size != y.shape[0]:
        status = None
    fitted = {name: h5["fit"][name][...] for name in h5["fit"]} if "fit" in h5 else None
    fig, axes = plt.subplots(len(states) + 1, 1, figsize=figure_size("ode-inverse", len(states)), dpi=DPI,
                             squeeze=False, layout="constrained")
    draw_loss(axes[0, 0], h5, f"ode-inverse {h5.attrs.get('name', '')}: loss")
    labels = [f"fit, sample {i}" for i in range(y.shape[0])]
    observed = _ode_observations(h5, t, names)
    t_data = t
    t, y, sparse = _densify(h5, request, t, y, status, picked, is_sparse(t, y, picked, states), fitted)
    handles = _draw_trajectories(axes[1:, 0], t, y, status, picked, states, names, labels, sparse, plt)
    for ax in axes[2:, 0]:
        ax.sharex(axes[1, 0])
    _log_scales(axes[1:, 0], request, t, y, picked, states)
    marked = []  # data dots in their sample's colour, black-edged, above the curves
    for ax, s in zip(axes[1:, 0], states):
        if s in observed:
            for colour, i in zip(_colours(plt, len(picked)), picked):
                marked.append(ax.plot(t_data[i], observed[s][i], "o", markerfacecolor=colour, markeredgecolor="black",
                                      markeredgewidth=0.6, markersize=4, linestyle="none", label="observed",
                                      zorder=4)[0])
    if sparse:
        request.notes.append(_sparse_note(t))
    figure_legend(fig, handles, [h.get_label() for h in handles], request.notes,
                  always=[(marked[0], "observed data (dots, in the sample's colour)")] if marked else ())
    add_notes(fig, request.notes)
    return fig


def _ode_observations(h5, t: np.ndarray, names: list[str]) -> dict[int, np.ndarray]:
    """The fitted data, ``data`` (sample, time, observed state) at the fit's times ``t``, by the
    index in ``names`` of each state the ``observed`` attribute names (empty without data)."""
    if "data" not in h5:
        return {}
    observed = [s.decode() if isinstance(s, bytes) else str(s) for s in np.atleast_1d(h5.attrs.get("observed", []))]
    data = np.asarray(h5["data"][...], dtype=float)
    unknown = [name for name in observed if name not in names]
    if len(observed) != data.shape[2] or unknown or data.shape[:2] != t.shape:
        raise InputError(f"{h5.filename}: dataset 'data' has shape {data.shape}, expected (sample, time, observed) "
                         f"with sample, time = {t.shape} (from 't') and the {len(observed)} observed states "
                         f"attribute 'observed' names among the states")
    return {names.index(name): data[:, :, k] for k, name in enumerate(observed)}
