"""PDE fit figures for ``odecli plot``: the true / initial / final fields on one colour scale
with the receivers and the shown shot's sources, the loss curve, and observed against
predicted traces at a few receivers.

Units follow the PDE spec: grid positions and spacing in metres, time in seconds; the field
is the wave speed (m/s) for acoustic2d and the conductivity kappa for heat2d, whose units are
m^2/s because ``u_t = div(kappa grad u)`` is written in metres and seconds.
"""

from __future__ import annotations

import json
from typing import Optional

import numpy as np

from odecli.errors import InputError
from odecli.io.layout import require
from odecli.report.plot import PlotRequest, figure_size
from odecli.report.plot_axes import DPI, add_notes, draw_loss

MAX_TRACES = 4
TRACE_SPACING = 2.2  # vertical distance between stacked traces, in units of the largest amplitude

FIELD_NAMES = {  # equation -> (what the field is, its label with units)
    "acoustic2d": ("wave speed", "wave speed (m/s)"),
    "heat2d": ("conductivity", "conductivity κ (m²/s)"),
    "poisson2d": ("conductivity", "conductivity κ"),
}
PARAMETER_NAMES = {  # a parameter of an equation with several -> (what it is, its label with units)
    "vp": ("P-wave speed vp", "vp (m/s)"),
    "vs": ("S-wave speed vs", "vs (m/s)"),
    "rho": ("density rho", "ρ (kg/m³)"),
}




def _time_axis(data, n_shape: tuple[int, ...]) -> tuple[int, Optional[np.ndarray]]:
    """Which axis of the (shots, ., .) trace arrays is time: the one matching data/time, else the last."""
    time = data["time"][...] if "time" in data else None
    if time is not None:
        for axis in (2, 1):
            if n_shape[axis] == time.size:
                return axis, time
    return 2, None


def _draw_traces(ax, h5, request: PlotRequest) -> list:
    """Observed against predicted at a few receivers of one shot; returns one handle of each
    kind for the figure's legend (empty when nothing was drawn)."""
    if "data/observed" not in h5 or "data/predicted" not in h5:
        ax.text(0.5, 0.5, "no receiver data in this run", ha="center", va="center", transform=ax.transAxes)
        return []
    observed = np.asarray(h5["data/observed"][...], dtype=float)
    predicted = np.asarray(h5["data/predicted"][...], dtype=float)
    if observed.shape != predicted.shape:  # each in a layout of its own: receivers and steps swapped
        ax.text(0.5, 0.5, f"cannot draw traces: observed {observed.shape}, predicted {predicted.shape}",
                ha="center", va="center", transform=ax.transAxes)
        return []
    n_shots = observed.shape[0]
    if not 0 <= request.shot < n_shots:
        raise InputError(f"--shot: shot {request.shot} is out of range; the run has {n_shots} shots (0..{n_shots - 1})")
    if int(h5.attrs.get("steady", 0)) and observed.ndim == 3 and observed.shape[2] == 1:  # one value per sensor
        return _draw_sensors(ax, observed[request.shot, :, 0], predicted[request.shot, :, 0], request.shot)
    axis, time = _time_axis(h5["data"], observed.shape)
    obs, pred = observed[request.shot], predicted[request.shot]
    if axis == 1:  # (time, receivers) -> (receivers, time)
        obs, pred = obs.T, pred.T
    n_rec, n_t = obs.shape
    time = time if time is not None else np.arange(n_t)
    components = _names_attr(h5, "receiver_components")
    components = components if len(components) == n_rec else []
    receivers = _shown_receivers(n_rec, components)
    scale = np.nanmax(np.abs(obs[receivers])) if obs.size else 1.0
    scale = scale if np.isfinite(scale) and scale > 0 else 1.0
    scales = {r: scale for r in receivers}
    if components:  # velocities and pressure differ by orders: each component on its own scale
        for kind in set(components[r] for r in receivers):
            group = [r for r in receivers if components[r] == kind]
            most = float(np.nanmax(np.abs(obs[group])))
            scales.update({r: most if np.isfinite(most) and most > 0 else 1.0 for r in group})
    for k, r in enumerate(receivers):
        offset = -TRACE_SPACING * k
        ax.plot(time, obs[r] / scales[r] + offset, color="black", linewidth=1.0, label="observed" if k == 0 else None)
        ax.plot(time, pred[r] / scales[r] + offset, color="tab:red", linestyle="--", linewidth=1.0,
                label="predicted" if k == 0 else None)
    ax.set_yticks([-TRACE_SPACING * k for k in range(len(receivers))],
                  [f"rec {r}" + (f" ({components[r]})" if components else "") for r in receivers])
    ax.set_ylabel("receiver (each component ÷ its\nlargest |observed| shown)" if components else
                  f"receiver (each trace ÷ {scale:.3g},\nthe largest |observed| shown)", fontsize="small")
    ax.set_xlabel("time (s)" if "time" in h5["data"] else "time step")
    ax.set_title(f"shot {request.shot}: observed vs predicted at {len(receivers)} of {n_rec} receivers",
                 fontsize="medium")
    ax.grid(True, alpha=0.3)
    return [line for line in ax.get_lines() if line.get_label() in ("observed", "predicted")]


def _rows(h5) -> list[tuple[str, str, str, dict]]:
    """One row of fields per parameter: ``(suffix of the dataset names, what, colour label,
    {kind: array})``; a one-parameter run has one row of ``fields/{true,initial,final}``."""
    equation = str(h5.attrs.get("equation", ""))
    stored = h5["fields"] if "fields" in h5 else {}
    rows = []
    for name in _parameter_names(h5):
        found = {k: np.asarray(stored[f"{k}_{name}"][...], dtype=float) for k in ("true", "initial", "final")
                 if f"{k}_{name}" in stored}
        if found:
            what, label = PARAMETER_NAMES.get(name, (name, name))
            rows.append((f"_{name}", what, label, found))
    if not rows:
        what, label = FIELD_NAMES.get(equation, ("field", "field value"))
        rows.append(("", what, label, {k: np.asarray(stored[k][...], dtype=float)
                                       for k in ("true", "initial", "final") if k in stored}))
    return rows


def _parameter_names(h5) -> list[str]:
    names = _names_attr(h5, "parameters")
    return names if len(names) > 1 else []


def _shown_receivers(n_rec: int, components: list[str]) -> list[int]:
    """A few receivers spread over the line; with components (elastic2d), spread over each
    component's receivers, so every component recorded has a trace shown."""
    if not components:
        return sorted({int(round(i)) for i in np.linspace(0, n_rec - 1, min(MAX_TRACES, n_rec))})
    kinds = list(dict.fromkeys(components))
    each = max(1, MAX_TRACES // len(kinds))
    shown = []
    for kind in kinds:
        ids = [i for i, c in enumerate(components) if c == kind]
        shown += [ids[int(round(k))] for k in np.linspace(0, len(ids) - 1, min(each, len(ids)))]
    return sorted(set(shown))


def _names_attr(h5, attr: str) -> list[str]:
    """A JSON list of names in a root attribute (empty where absent or not such a list)."""
    try:
        names = json.loads(h5.attrs.get(attr, "[]"))
    except (TypeError, ValueError):
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _draw_sensors(ax, observed: np.ndarray, predicted: np.ndarray, experiment: int) -> list:
    """A steady run's data: observed and predicted value at each sensor of one experiment."""
    sensors = np.arange(observed.size)
    ax.plot(sensors, observed, "o", color="black", markersize=4, label="observed")
    ax.plot(sensors, predicted, "x", color="tab:red", markersize=5, label="predicted")
    ax.set_xlabel("sensor")
    ax.set_ylabel("value")
    ax.set_title(f"experiment {experiment}: observed vs predicted at {observed.size} sensors", fontsize="medium")
    ax.grid(True, alpha=0.3)
    return [line for line in ax.get_lines() if line.get_label() in ("observed", "predicted")]


def plot_pde_inverse(h5, request: PlotRequest, plt):
    # the other panels say on the picture what the run lacks
    require(h5, "history/loss", optional=("fields/", "data/time", "data/observed", "data/predicted",
                                          "geometry/receivers", "geometry/sources", "@grid_spacing"))
    rows = _rows(h5)
    fig = plt.figure(figsize=figure_size("pde-inverse", len(rows)), dpi=DPI, layout="constrained")
    grid = fig.add_gridspec(len(rows) + 1, 3, height_ratios=[1.1] * len(rows) + [1.0])
    equation = str(h5.attrs.get("equation", ""))
    dy, dx = np.asarray(h5.attrs.get("grid_spacing", (1.0, 1.0)), dtype=float)
    markers = []
    for row, (suffix, what, colour_label, fields) in enumerate(rows):
        finite = [f[np.isfinite(f)] for f in fields.values()]
        finite = [f for f in finite if f.size]
        vmin = min(float(f.min()) for f in finite) if finite else 0.0
        vmax = max(float(f.max()) for f in finite) if finite else 1.0
        image = None
        field_axes = []
        for column, name in enumerate(("true", "initial", "final")):
            ax = fig.add_subplot(grid[row, column])
            field_axes.append(ax)
            ax.set_title(f"{name} {what}", fontsize="medium")
            if name not in fields:
                ax.text(0.5, 0.5, f"no {name} field in this run" if not suffix else f"{name}: not inverted",
                        ha="center", va="center", transform=ax.transAxes)
                ax.set_axis_off()
                continue
            values = fields[name]
            ny, nx = values.shape
            image = ax.imshow(values, vmin=vmin, vmax=vmax, cmap="viridis", origin="upper", aspect="auto",
                              extent=(0.0, max(nx - 1, 1) * dx, max(ny - 1, 1) * dy, 0.0))
            markers = _draw_geometry(ax, h5, request.shot, dx, dy) or markers
            ax.set_xlabel("x (m)")
            ax.set_ylabel("y (m)")
        if image is not None:
            fig.colorbar(image, ax=field_axes, shrink=0.9, label=f"{colour_label}, one scale for all three")
    draw_loss(fig.add_subplot(grid[len(rows), 0]), h5)
    legend = markers + _draw_traces(fig.add_subplot(grid[len(rows), 1:]), h5, request)
    if legend:  # one legend below everything: it covers no field and no trace
        fig.legend(handles=legend, loc="outside lower center", ncols=len(legend), fontsize="small")
    title = h5.attrs.get("name", "")
    fig.suptitle(f"pde-inverse {title}: {equation}, {h5.attrs.get('optimizer', '')}".strip(), fontsize="medium")
    add_notes(fig, request.notes)
    return fig


def _draw_geometry(ax, h5, shot: int, dx: float, dy: float) -> list:
    """Receivers as small white triangles, the shown shot's sources as red stars; returns the
    marker handles for the legend."""
    if "geometry" not in h5:
        return []
    geometry = h5["geometry"]
    handles = []
    if "receivers" in geometry:
        rec = geometry["receivers"][...]
        handles += ax.plot(rec[:, 1] * dx, rec[:, 0] * dy, "v", color="white", markeredgecolor="black",
                           markersize=4, linestyle="none", label="receivers")
    if "sources" in geometry:
        src = geometry["sources"][...]
        src = src[src[:, 0] == shot]
        handles += ax.plot(src[:, 2] * dx, src[:, 1] * dy, "*", color="tab:red", markeredgecolor="black",
                           markeredgewidth=0.5, markersize=10, linestyle="none", label=f"source of shot {shot}")
    return handles
