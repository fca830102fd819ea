"""``odecli stats`` for ``kind: ode-inverse`` files: the fit summary."""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np
from rich.console import Console
from rich.table import Table

from odecli.errors import InputError
from odecli.io.layout import require, scalar_attr
from odecli.ode.status import STATUS_NAMES


def _describe(values: np.ndarray) -> dict[str, float]:
    values = np.asarray(values, dtype=np.float64)
    return {"mean": float(values.mean()), "min": float(values.min()), "max": float(values.max())}


def _flag(h5: h5py.File, ds: h5py.Dataset, name: str, default: bool) -> bool:
    """A dataset's yes/no attribute (``default`` where absent); anything but one value is one line."""
    return bool(scalar_attr(h5, ds, name, default, kinds="biuf", expected="true or false"))


def inverse_summary(h5: h5py.File) -> dict[str, Any]:
    require(h5, "history/loss", "history/grad_norm", "status", "fit/", "stats/",
            optional=("history/n_evals", "init/", "truth/", "@iterations", "@ranks", "@noise", "@wall_time_s"))
    a = h5.attrs
    loss = h5["history/loss"][...]
    grad = h5["history/grad_norm"][...]
    status = h5["status"][...].astype(int)
    unknowns = []
    for name in h5["fit"]:
        ds = h5["fit"][name]
        fitted = ds[...]
        entry: dict[str, Any] = {
            "name": name, "unknown": str(ds.attrs.get("unknown", "param")),
            "per_sample": _flag(h5, ds, "per_sample", fitted.size > 1), "fitted": _describe(fitted),
            "initial_guess": _describe(h5["init"][name][...]) if "init" in h5 and name in h5["init"] else None,
        }
        if "truth" in h5 and name in h5["truth"]:
            truth = h5["truth"][name][...]
            rel = np.abs(fitted - truth) / np.maximum(np.abs(truth), 1e-300)
            entry["relative_error"] = {"mean": float(rel.mean()), "max": float(rel.max())}
        unknowns.append(entry)
    stats = {name: h5["stats"][name][...] for name in h5["stats"]}
    return {
        "observed_events": _observed_events(h5),
        "kind": "ode-inverse",
        "name": str(a.get("name", "")),
        "samples": int(status.size),
        "ranks": int(a.get("ranks", 1)),
        "status_counts": {STATUS_NAMES.get(int(c), str(c)): int((status == c).sum()) for c in np.unique(status)},
        "method": str(a.get("method", "")),
        "adjoint": str(a.get("adjoint", "")),
        "engine": str(a.get("engine", "torch")),
        "optimizer": str(a.get("optimizer", "")),
        "iterations": int(a.get("iterations", len(loss) - 1)),
        "stop_reason": str(a.get("stop_reason", "")),
        "data_source": str(a.get("data_source", "")),
        "noise": float(a.get("noise", 0.0)),
        "loss_initial": float(loss[0]),
        "loss_final": float(loss[-1]),
        "grad_norm_final": float(grad[-1]),
        "loss_evaluations": int(h5["history/n_evals"][-1]) if "history/n_evals" in h5 else len(loss),
        "wall_time_s": float(a.get("wall_time_s", 0.0)),
        "unknowns": unknowns,
        "forward_steps": _describe(stats["n_steps"]) if "n_steps" in stats else None,
        "backward_steps": _describe(stats["backward_n_steps"]) if "backward_n_steps" in stats else None,
        "backward_f_evals": _describe(stats["backward_n_f_evals"]) if "backward_n_f_evals" in stats else None,
    }


def _observed_events(h5: h5py.File) -> dict[str, dict[str, float]]:
    """Per observed event (``events/NAME/t`` fitted, ``events/NAME/data`` observed): how many
    times, and the largest and root-mean-square gap between them."""
    out: dict[str, dict[str, float]] = {}
    group = h5.get("events")
    if not isinstance(group, h5py.Group):
        return out
    for name in group:
        fitted, observed = group.get(f"{name}/t"), group.get(f"{name}/data")
        if not all(isinstance(d, h5py.Dataset) and d.dtype.kind == "f" for d in (fitted, observed)) or \
                fitted.shape != observed.shape:
            raise InputError(f"{h5.filename}: events/{name} needs float datasets 't' and 'data' of one shape "
                             "(sample, occurrence)")
        gap = np.abs(fitted[...] - observed[...])
        out[name] = {"times": int(gap.size), "max_gap": float(gap.max(initial=0.0)),
                     "rms_gap": float(np.sqrt(np.mean(gap**2))) if gap.size else 0.0}
    return out


def render_inverse_summary(summary: dict[str, Any], console: Console) -> None:
    head = Table(title=f"ODE fit {summary['name']}", show_header=False)
    head.add_row("samples", f"{summary['samples']} on {summary['ranks']} rank(s)")
    head.add_row("status", ", ".join(f"{k}: {v}" for k, v in summary["status_counts"].items()))
    engine = " (generated C)" if summary.get("engine") == "native" else ""
    head.add_row("solver", f"{summary['method']}, gradients by {summary['adjoint']}{engine}")
    head.add_row("optimizer", f"{summary['optimizer']}: {summary['iterations']} iterations, "
                              f"{summary['loss_evaluations']} loss evaluations ({summary['stop_reason']})")
    head.add_row("data", f"{summary['data_source']} (noise {summary['noise']:g})")
    head.add_row("loss", f"{summary['loss_initial']:.4e} -> {summary['loss_final']:.4e}")
    for name, e in summary.get("observed_events", {}).items():
        head.add_row(f"event {name}", f"{e['times']} observed times; fitted - observed: max {e['max_gap']:.2e}, "
                                      f"rms {e['rms_gap']:.2e}")
    head.add_row("final |grad|", f"{summary['grad_norm_final']:.3e}")
    head.add_row("wall time", f"{summary['wall_time_s']:.2f} s")
    for label, key in (("forward steps (mean/max)", "forward_steps"), ("backward steps (mean/max)", "backward_steps"),
                       ("backward f-evals (mean/max)", "backward_f_evals")):
        if summary.get(key):
            head.add_row(label, f"{summary[key]['mean']:.1f} / {summary[key]['max']:.0f}")
    console.print(head)
    table = Table(title="unknowns")
    for column in ("name", "kind", "per-sample", "fitted mean", "min", "max", "max rel. error"):
        table.add_column(column, justify="right")
    for u in summary["unknowns"]:
        f = u["fitted"]
        err = f"{u['relative_error']['max']:.2e}" if "relative_error" in u else "-"
        table.add_row(u["name"], u["unknown"], "yes" if u["per_sample"] else "no",
                      f"{f['mean']:.6g}", f"{f['min']:.6g}", f"{f['max']:.6g}", err)
    console.print(table)
