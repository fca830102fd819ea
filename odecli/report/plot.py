"""``odecli plot``: a picture of a run file (PNG or PDF, Matplotlib's Agg backend, no display needed).

* ODE runs: trajectories against t, one panel per state and one line per sample (at most
  ``MAX_DEFAULT_SAMPLES`` unless ``--samples`` picks them), or a phase portrait of two states;
  failed samples are drawn dashed.
* pde-inverse runs: true / initial / final fields side by side on one colour scale, the loss
  curve (log scale) and observed vs predicted traces of a few receivers for one shot.
* ode-inverse runs: the loss curve and the fitted trajectories.

Figure sizes are fixed (``figure_size``) so a picture's pixel size is predictable:
width = figsize[0] * DPI, height = figsize[1] * DPI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from odecli.errors import InputError
from odecli.io.layout import as_batched, open_run, require, run_kind

DPI = 100
MAX_DEFAULT_SAMPLES = 20
MAX_TRACES = 4
FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}


@dataclass
class PlotRequest:
    """What to draw; strings come straight from the command line and are checked here."""

    samples: Optional[str] = None  # "0,3,5" or "0-4,7"
    states: Optional[str] = None  # "x,v"
    phase: Optional[str] = None  # "x,v"
    shot: int = 0  # pde-inverse: which shot's traces to show
    notes: list[str] = field(default_factory=list)  # filled in: what the user should know


def figure_size(kind: str, n_panels: int = 1) -> tuple[float, float]:
    """The figure size in inches for a kind of plot (``n_panels``: trajectory panels)."""
    if kind == "ode":
        return (8.0, 2.0 * max(n_panels, 1) + 1.0)
    if kind == "phase":
        return (7.0, 6.0)
    if kind == "pde-inverse":
        return (13.0, 8.0)
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
        return _plot_ode(h5, request, plt)
    if kind == "pde-inverse":
        _refuse_ode_flags(request, kind)
        return _plot_pde_inverse(h5, request, plt)
    if kind == "ode-inverse":
        if request.phase is not None:
            raise InputError("--phase: phase portraits are for ODE runs (kind ode)")
        return _plot_ode_inverse(h5, request, plt)
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


def parse_samples(text: Optional[str], n_samples: int, notes: list[str]) -> list[int]:
    """Sample indices from ``--samples`` ("0,3,5", "2-6"); default: all, or an even spread of 20.

    Only an absent flag means the default: ``--samples ''`` (an unset shell variable, say) is an
    error rather than silently drawing everything.
    """
    if text is None:
        if n_samples <= MAX_DEFAULT_SAMPLES:
            return list(range(n_samples))
        picked = sorted({int(round(i)) for i in np.linspace(0, n_samples - 1, MAX_DEFAULT_SAMPLES)})
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
    for flag, value in (("--samples", request.samples), ("--states", request.states), ("--phase", request.phase)):
        if value is not None:
            raise InputError(f"{flag}: only applies to ODE runs; this run is of kind {kind!r}")


# ---------------------------------------------------------------- ODE runs


def _state_names(h5, n_states: int) -> list[str]:
    names = [s.decode() if isinstance(s, bytes) else str(s) for s in np.atleast_1d(h5.attrs.get("states", []))]
    return names if len(names) == n_states else [f"y{i}" for i in range(n_states)]


def _status_label(code: int) -> str:
    from odecli.ode.status import STATUS_NAMES

    return STATUS_NAMES.get(int(code), str(code))


def _sample_labels(h5, n_samples: int) -> list[str]:
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
        labels.append(f"sample {i}" + (f" ({extra})" if extra else ""))
    return labels


def _draw_trajectories(axes, t, y, status, picked, states, names, labels, plt) -> None:
    colours = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, max(len(picked), 1)))
    for ax, s in zip(axes, states):
        for colour, i in zip(colours, picked):
            failed = status is not None and int(status[i]) != 0
            label = labels[i] + (f" [failed: {_status_label(status[i])}]" if failed else "")
            ax.plot(t[i], y[i, :, s], color=colour, linestyle="--" if failed else "-", linewidth=1.2, label=label)
        ax.set_ylabel(names[s])
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("t")
    _legend(axes[0], len(picked))


def _legend(ax, n_entries: int) -> None:
    """A few entries inside the axes; many (up to MAX_DEFAULT_SAMPLES) in a column beside the figure."""
    if n_entries == 0 or n_entries > MAX_DEFAULT_SAMPLES:
        return
    if n_entries <= 6:
        ax.legend(fontsize="x-small", loc="best")
    else:
        ax.figure.legend(*ax.get_legend_handles_labels(), fontsize="x-small", loc="outside right upper")


def _plot_ode(h5, request: PlotRequest, plt):
    require(h5, "t", "y", optional=("status", "params/"))
    t, y = as_batched(h5["t"][...], h5["y"][...])
    status = h5["status"][...].astype(int) if "status" in h5 else None
    names = _state_names(h5, y.shape[2])
    picked = parse_samples(request.samples, y.shape[0], request.notes)
    labels = _sample_labels(h5, y.shape[0])
    title = f"{h5.attrs.get('name', '')} ({h5.attrs.get('method', '')}, {y.shape[0]} samples)".strip()
    if status is not None and (status[picked] != 0).any():
        request.notes.append(f"{int((status[picked] != 0).sum())} of the shown samples failed (drawn dashed)")
    if request.phase is not None:
        pair = parse_states(request.phase, names, "--phase")
        if len(pair) != 2:
            raise InputError(f"--phase: expected two different state names, e.g. --phase {','.join(names[:2])}")
        if request.states is not None:
            raise InputError("--states: cannot be combined with --phase (the phase flag names the two states)")
        fig, ax = plt.subplots(figsize=figure_size("phase"), dpi=DPI, layout="constrained")
        colours = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, max(len(picked), 1)))
        a, b = pair
        for colour, i in zip(colours, picked):
            failed = status is not None and int(status[i]) != 0
            label = labels[i] + (f" [failed: {_status_label(status[i])}]" if failed else "")
            ax.plot(y[i, :, a], y[i, :, b], color=colour, linestyle="--" if failed else "-", linewidth=1.2, label=label)
            ax.plot(y[i, 0, a], y[i, 0, b], "o", color=colour, markersize=4)
        ax.set_xlabel(names[a])
        ax.set_ylabel(names[b])
        ax.grid(True, alpha=0.3)
        _legend(ax, len(picked))
        ax.set_title(f"phase portrait {names[a]}-{names[b]}: {title} (dots: initial states)", fontsize="medium")
    else:
        states = parse_states(request.states, names)
        fig, axes = plt.subplots(len(states), 1, figsize=figure_size("ode", len(states)), dpi=DPI,
                                 sharex=True, squeeze=False, layout="constrained")
        _draw_trajectories(axes[:, 0], t, y, status, picked, states, names, labels, plt)
        fig.suptitle(title, fontsize="medium")
    if request.notes:
        fig.text(0.01, 0.005, "; ".join(request.notes), fontsize="x-small", color="0.35")
    return fig


# ---------------------------------------------------------------- inverse runs


def _draw_loss(ax, h5) -> None:
    loss = np.asarray(h5["history/loss"][...], dtype=float)
    if loss.size == 0:
        ax.text(0.5, 0.5, "no iterations recorded", ha="center", va="center", transform=ax.transAxes)
    else:
        iterations = np.arange(loss.size)
        positive = np.isfinite(loss) & (loss > 0)
        ax.plot(iterations, loss, marker="." if loss.size < 50 else None, linewidth=1.2)
        if positive.any():
            ax.set_yscale("log")
        ax.set_xlabel("iteration")
        ax.set_ylabel("loss")
        ax.grid(True, which="both", alpha=0.3)
    ax.set_title("loss", fontsize="medium")


def _time_axis(data, n_shape: tuple[int, ...]) -> tuple[int, Optional[np.ndarray]]:
    """Which axis of the (shots, ., .) trace arrays is time: the one matching data/time, else the last."""
    time = data["time"][...] if "time" in data else None
    if time is not None:
        for axis in (2, 1):
            if n_shape[axis] == time.size:
                return axis, time
    return 2, None


def _draw_traces(ax, h5, request: PlotRequest) -> None:
    if "data/observed" not in h5 or "data/predicted" not in h5:
        ax.text(0.5, 0.5, "no receiver data in this run", ha="center", va="center", transform=ax.transAxes)
        return
    observed = np.asarray(h5["data/observed"][...], dtype=float)
    predicted = np.asarray(h5["data/predicted"][...], dtype=float)
    if observed.shape != predicted.shape:  # each in a layout of its own: receivers and steps swapped
        ax.text(0.5, 0.5, f"cannot draw traces: observed {observed.shape}, predicted {predicted.shape}",
                ha="center", va="center", transform=ax.transAxes)
        return
    n_shots = observed.shape[0]
    if not 0 <= request.shot < n_shots:
        raise InputError(f"--shot: shot {request.shot} is out of range; the run has {n_shots} shots (0..{n_shots - 1})")
    axis, time = _time_axis(h5["data"], observed.shape)
    obs, pred = observed[request.shot], predicted[request.shot]
    if axis == 1:  # (time, receivers) -> (receivers, time)
        obs, pred = obs.T, pred.T
    n_rec, n_t = obs.shape
    time = time if time is not None else np.arange(n_t)
    receivers = sorted({int(round(i)) for i in np.linspace(0, n_rec - 1, min(MAX_TRACES, n_rec))})
    scale = np.nanmax(np.abs(obs[receivers])) if obs.size else 1.0
    scale = scale if np.isfinite(scale) and scale > 0 else 1.0
    for k, r in enumerate(receivers):
        offset = -2.2 * k
        ax.plot(time, obs[r] / scale + offset, color="black", linewidth=1.0, label="observed" if k == 0 else None)
        ax.plot(time, pred[r] / scale + offset, color="tab:red", linestyle="--", linewidth=1.0,
                label="predicted" if k == 0 else None)
    ax.set_yticks([-2.2 * k for k in range(len(receivers))], [f"rec {r}" for r in receivers])
    ax.set_xlabel("time" if "time" in h5["data"] else "time step")
    ax.set_title(f"shot {request.shot}: observed vs predicted ({len(receivers)} of {n_rec} receivers, "
                 f"scaled by {scale:.3g})", fontsize="medium")
    ax.legend(fontsize="small", loc="upper right")
    ax.grid(True, alpha=0.3)


def _plot_pde_inverse(h5, request: PlotRequest, plt):
    # the other panels say on the picture what the run lacks
    require(h5, "history/loss", optional=("fields/", "data/time", "data/observed", "data/predicted",
                                          "geometry/receivers", "geometry/sources", "@grid_spacing"))
    fig = plt.figure(figsize=figure_size("pde-inverse"), dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(2, 3, height_ratios=[1.1, 1.0])
    names = [n for n in ("true", "initial", "final") if "fields" in h5 and n in h5["fields"]]
    fields = {n: np.asarray(h5["fields"][n][...], dtype=float) for n in names}
    finite = [f[np.isfinite(f)] for f in fields.values()]
    finite = [f for f in finite if f.size]
    vmin = min(float(f.min()) for f in finite) if finite else 0.0
    vmax = max(float(f.max()) for f in finite) if finite else 1.0
    dy, dx = np.asarray(h5.attrs.get("grid_spacing", (1.0, 1.0)), dtype=float)
    image = None
    field_axes = []
    for column, name in enumerate(("true", "initial", "final")):
        ax = fig.add_subplot(grid[0, column])
        field_axes.append(ax)
        ax.set_title(f"{name} field", fontsize="medium")
        if name not in fields:
            ax.text(0.5, 0.5, f"no {name} field in this run", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        values = fields[name]
        ny, nx = values.shape
        image = ax.imshow(values, vmin=vmin, vmax=vmax, cmap="viridis", origin="upper", aspect="auto",
                          extent=(0.0, max(nx - 1, 1) * dx, max(ny - 1, 1) * dy, 0.0))
        _draw_geometry(ax, h5, request.shot, dx, dy)
        ax.set_xlabel("x")
        ax.set_ylabel("y")
    if image is not None:
        fig.colorbar(image, ax=field_axes, shrink=0.9, label="field value (shared scale)")
    _draw_loss(fig.add_subplot(grid[1, 0]), h5)
    _draw_traces(fig.add_subplot(grid[1, 1:]), h5, request)
    title = h5.attrs.get("name", "")
    fig.suptitle(f"pde-inverse {title}: {h5.attrs.get('equation', '')}, {h5.attrs.get('optimizer', '')}".strip(),
                 fontsize="medium")
    return fig


def _draw_geometry(ax, h5, shot: int, dx: float, dy: float) -> None:
    """Receivers as small white triangles, the shown shot's sources as red stars."""
    if "geometry" not in h5:
        return
    geometry = h5["geometry"]
    if "receivers" in geometry:
        rec = geometry["receivers"][...]
        ax.plot(rec[:, 1] * dx, rec[:, 0] * dy, "v", color="white", markeredgecolor="black", markersize=3,
                linestyle="none")
    if "sources" in geometry:
        src = geometry["sources"][...]
        src = src[src[:, 0] == shot]
        ax.plot(src[:, 2] * dx, src[:, 1] * dy, "*", color="tab:red", markersize=8, linestyle="none")


def _plot_ode_inverse(h5, request: PlotRequest, plt):
    require(h5, "history/loss", "t", "y", optional=("status", "data"))
    t, y = as_batched(np.asarray(h5["t"][...], dtype=float), np.asarray(h5["y"][...], dtype=float))
    names = _state_names(h5, y.shape[2])
    picked = parse_samples(request.samples, y.shape[0], request.notes)
    states = parse_states(request.states, names)
    status = h5["status"][...].astype(int).reshape(-1) if "status" in h5 else None
    if status is not None and status.size != y.shape[0]:
        status = None
    fig, axes = plt.subplots(len(states) + 1, 1, figsize=figure_size("ode-inverse", len(states)), dpi=DPI,
                             squeeze=False, layout="constrained")
    _draw_loss(axes[0, 0], h5)
    labels = [f"fit, sample {i}" for i in range(y.shape[0])]
    _draw_trajectories(axes[1:, 0], t, y, status, picked, states, names, labels, plt)
    observed = _ode_observations(h5, t, names)
    marked = []  # the first observed points of each panel, for the legend
    for ax, s in zip(axes[1:, 0], states):
        if s in observed:
            marked += [ax.plot(t[i], observed[s][i], ".", color="black", markersize=3, label="observed")[0]
                       for i in picked][:1]
    if marked and states[0] in observed:  # the first panel holds the samples' legend: add the data to it
        _legend(axes[1, 0], len(picked) + 1)
    elif marked:
        marked[0].axes.legend(handles=marked[:1], fontsize="x-small", loc="best")
    fig.suptitle(f"ode-inverse {h5.attrs.get('name', '')}".strip(), fontsize="medium")
    if request.notes:
        fig.text(0.01, 0.005, "; ".join(request.notes), fontsize="x-small", color="0.35")
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
