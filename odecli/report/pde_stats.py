"""Summary of a ``kind: pde-inverse`` result file for ``odecli stats``."""

from __future__ import annotations

import json
import math

import h5py
import numpy as np

from odecli.errors import InputError
from odecli.io.layout import require, scalar_attr


def _f(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def pde_summary(h5: h5py.File) -> dict:
    """JSON-serialisable summary: loss history, gradient norm, timing split, model error."""
    # of fields/final and data/observed only the shapes are reported, but those must be datasets'
    require(h5, "history/loss", "history/grad_norm", "history/wall_time_s",
            optional=("history/", "@ranks", "@model_error_final", "fields/final", "data/observed"))
    hist = h5["history"]
    loss = np.asarray(hist["loss"][...], dtype=float)
    gn = np.asarray(hist["grad_norm"][...], dtype=float)
    wall = np.asarray(hist["wall_time_s"][...], dtype=float)
    out: dict = {
        "kind": "pde-inverse",
        "name": str(h5.attrs.get("name", "")),
        "equation": str(h5.attrs.get("equation", "")),
        "optimizer": str(h5.attrs.get("optimizer", "")),
        "unknown": str(h5.attrs.get("unknown_type", "")),
        "stop_reason": str(h5.attrs.get("stop_reason", "")),
        "odecli_version": str(h5.attrs.get("odecli_version", "")),
        "engine": str(h5.attrs.get("engine", "")),
        "iterations": int(loss.size),
        "loss": {
            "first": _f(loss[0]) if loss.size else None,
            "last": _f(loss[-1]) if loss.size else None,
            "min": _f(loss.min()) if loss.size else None,
            "argmin": int(loss.argmin()) if loss.size else None,
        },
        "grad_norm": {"first": _f(gn[0]) if gn.size else None, "last": _f(gn[-1]) if gn.size else None},
        "wall_time_s": {"total": _f(wall.sum()), "per_iteration_mean": _f(wall.mean()) if wall.size else None},
        "ranks": int(h5.attrs.get("ranks", 1)),
        "decomposition": _decomposition(h5),
    }
    fields = h5.get("fields")
    if isinstance(fields, h5py.Group) and "final" in fields:
        out["grid_shape"] = list(fields["final"].shape)
    if "timing" in h5:
        require(h5, "timing/total_s", "timing/comm_s", "timing/compute_s")
        t = h5["timing"]
        total = np.asarray(t["total_s"][...], dtype=float)
        comm = np.asarray(t["comm_s"][...], dtype=float)
        compute = np.asarray(t["compute_s"][...], dtype=float)
        out["timing"] = {
            "per_rank": [
                {"rank": r, "total_s": _f(total[r]), "compute_s": _f(compute[r]),
                 "comm_s": _f(comm[r]),
                 "comm_fraction": _f(comm[r] / total[r]) if total[r] > 0 else None}
                for r in range(total.size)
            ],
            "comm_fraction_mean": _f(np.mean(comm / np.where(total > 0, total, np.nan)))
            if total.size else None,
        }
    me = hist.get("model_error")
    if me is not None and me.size and math.isfinite(float(me[0])):
        out["model_error"] = {"initial": _f(me[0]),
                              "final": _f(h5.attrs.get("model_error_final", me[-1]))}
        if out["model_error"]["initial"] and out["model_error"]["final"] is not None:
            out["model_error"]["ratio"] = _f(out["model_error"]["final"] / out["model_error"]["initial"])
    for name in _names(h5, "inverted"):  # several parameters: each one's model error
        each = hist.get(f"model_error_{name}")
        if each is None or not each.size or not math.isfinite(float(each[0])):
            continue
        first, last = _f(each[0]), _f(_number_attr(h5, f"model_error_final_{name}", each[-1]))
        out.setdefault("model_errors", {})[name] = {
            "initial": first, "final": last, "ratio": _f(last / first) if first and last is not None else None}
    if "solver_iterations_max" in hist:  # linear solves: iterations per solve over the fit
        means = np.asarray(hist["solver_iterations_mean"][...], dtype=float)
        most = np.asarray(hist["solver_iterations_max"][...], dtype=float)
        out["solver_iterations"] = {"mean": _f(means.mean()) if means.size else None,
                                    "max": _f(most.max()) if most.size else None,
                                    "last_max": _f(most[-1]) if most.size else None}
    if "max_frequency" in hist:  # frequency continuation: each stage's cutoff (None: full band)
        band = np.asarray(hist["max_frequency"][...], dtype=float)
        starts = [i for i in range(band.size) if i == 0 or band[i] != band[i - 1]]
        out["stages"] = [{"max_frequency": _f(band[i]), "iterations": int(j - i), "loss_first": _f(loss[i]),
                          "loss_last": _f(loss[j - 1])} for i, j in zip(starts, [*starts[1:], band.size])]
    if isinstance(h5.get("data"), h5py.Group) and "observed" in h5["data"]:
        out["data_shape"] = list(h5["data/observed"].shape)
    return out


def _number_attr(h5: h5py.File, name: str, default: float) -> float:
    """A root attribute that must be one real number (``default`` where absent), else one line."""
    return float(scalar_attr(h5, h5, name, default, kinds="iuf", expected="one number"))


def _names(h5: h5py.File, attr: str) -> list[str]:
    """A JSON list of names in a root attribute (empty where absent or not such a list)."""
    try:
        value = json.loads(h5.attrs.get(attr, "[]"))
    except (TypeError, ValueError):
        return []
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _decomposition(h5: h5py.File) -> dict:
    """The ``decomposition`` attribute: JSON text of an object whose ``proc_grid`` (if any) is a list of
    rank counts, which another program may not have written."""
    try:
        value = json.loads(h5.attrs.get("decomposition", "{}"))
    except (TypeError, ValueError):  # not text, or not JSON
        value = None
    grid = value.get("proc_grid", []) if isinstance(value, dict) else None
    if not isinstance(grid, list) or not all(isinstance(n, int) and n > 0 for n in grid):
        raise InputError(f"{h5.filename}: attribute 'decomposition' is not a JSON object as text with a list "
                         f"of rank counts as 'proc_grid', expected e.g. '{{\"proc_grid\": [1, 1]}}'")
    return value


def _band(max_frequency: float | None) -> str:
    return "full band" if max_frequency is None else f"{max_frequency:g} Hz"


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def render_pde_summary(summary: dict, console) -> None:
    from rich.table import Table

    t = Table(title=f"pde-inverse: {summary.get('name', '')}", show_header=False)
    t.add_column("key", style="bold")
    t.add_column("value")
    dec = summary.get("decomposition", {})
    rows = [
        ("equation", summary.get("equation")),
        ("unknown", summary.get("unknown")),
        ("optimizer", summary.get("optimizer")),
        ("grid", "x".join(map(str, summary.get("grid_shape", []))) or None),
        ("ranks", f"{summary.get('ranks')} (proc grid {'x'.join(map(str, dec.get('proc_grid', [])))})"),
        ("engine", summary.get("engine") or None),
        ("iterations", summary.get("iterations")),
        ("stop reason", summary.get("stop_reason")),
        ("loss first", summary["loss"]["first"]),
        ("loss last", summary["loss"]["last"]),
        ("loss min", f"{_fmt(summary['loss']['min'])} (iteration {summary['loss']['argmin']})"),
        ("grad norm last", summary["grad_norm"]["last"]),
        ("wall time total (s)", summary["wall_time_s"]["total"]),
        ("wall time / iteration (s)", summary["wall_time_s"]["per_iteration_mean"]),
    ]
    me = summary.get("model_error")
    if me:
        rows.append(("model error initial -> final",
                     f"{_fmt(me['initial'])} -> {_fmt(me['final'])} (x{_fmt(me.get('ratio'))})"))
    for name, each in (summary.get("model_errors") or {}).items():
        rows.append((f"  {name} model error",
                     f"{_fmt(each['initial'])} -> {_fmt(each['final'])} (x{_fmt(each.get('ratio'))})"))
    if summary.get("stages"):
        rows.append(("stages: iterations, loss", "; ".join(
            f"{_band(st['max_frequency'])}: {st['iterations']}, {_fmt(st['loss_first'])} -> {_fmt(st['loss_last'])}"
            for st in summary["stages"])))
    solver = summary.get("solver_iterations")
    if solver:
        rows.append(("solver iterations / solve", f"mean {_fmt(solver['mean'])}, max {_fmt(solver['max'])}"))
    for k, v in rows:
        t.add_row(k, _fmt(v))
    console.print(t)
    timing = summary.get("timing")
    if timing:
        tt = Table(title="per-rank time: compute vs communication")
        for col in ("rank", "total s", "compute s", "comm s", "comm %"):
            tt.add_column(col, justify="right")
        for r in timing["per_rank"]:
            frac = r["comm_fraction"]
            tt.add_row(str(r["rank"]), _fmt(r["total_s"]), _fmt(r["compute_s"]), _fmt(r["comm_s"]),
                       "-" if frac is None else f"{100 * frac:.1f}")
        console.print(tt)
