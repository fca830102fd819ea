"""``odecli stats``: what happened in a run file, as a dict (for --json) and as rich tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
from rich.console import Console
from rich.table import Table

from odecli.errors import InputError
from odecli.io.layout import numbers, open_run, require, run_kind
from odecli.ode.status import STATUS_NAMES

# Beyond this many rows a rich Table takes seconds (about 1 ms a row): --per-sample prints
# plain aligned columns instead, so listing 10^4-10^6 samples stays fast (and greppable).
RICH_ROWS_MAX = 500
# the per-sample counters every ODE run file holds in its ``stats`` group
COUNTERS = ("n_steps", "n_accepted", "n_rejected", "n_f_evals")
# the counters only some methods write: implicit methods' linear algebra, method: auto's switch
IMPLICIT_COUNTERS = ("n_jac_evals", "n_lu_decomps", "n_newton_iters")
SWITCH_COUNTERS = ("n_switched", "switched_at_step")


def summarize(path: Path, per_sample: bool = False) -> dict[str, Any]:
    """Summary of any run file, dispatched on its ``kind`` attribute (checked by ``open_run``)."""
    with open_run(path) as h5:
        kind = run_kind(h5)
        if kind == "ode":
            return ode_summary(h5, per_sample)
        if kind == "ode-inverse":
            from odecli.report.inverse_stats import inverse_summary

            return inverse_summary(h5)
        from odecli.report.pde_stats import pde_summary

        return pde_summary(h5)


def render(summary: dict[str, Any], console: Console) -> None:
    if summary["kind"] == "ode":
        render_ode_summary(summary, console)
    elif summary["kind"] == "ode-inverse":
        from odecli.report.inverse_stats import render_inverse_summary

        render_inverse_summary(summary, console)
    else:
        from odecli.report.pde_stats import render_pde_summary

        render_pde_summary(summary, console)


def _describe(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"mean": 0.0, "min": 0.0, "max": 0.0, "total": 0.0}
    return {"mean": float(values.mean()), "min": float(values.min()), "max": float(values.max()), "total": float(values.sum())}


def ode_summary(h5: h5py.File, per_sample: bool = False) -> dict[str, Any]:
    optional = [f"stats/{name}" for name in (*IMPLICIT_COUNTERS, *SWITCH_COUNTERS)]
    require(h5, "status", *(f"stats/{name}" for name in COUNTERS), optional=optional,
            attrs=("method", "rtol", "atol", "wall_time_s"))
    status = h5["status"][...].astype(int)
    stats = {name: h5["stats"][name][...] for name in COUNTERS}
    extra = [name for name in IMPLICIT_COUNTERS if name in h5["stats"]]
    switch = all(name in h5["stats"] for name in SWITCH_COUNTERS)
    stats.update({name: h5["stats"][name][...] for name in extra})
    if switch:
        stats.update({name: h5["stats"][name][...] for name in SWITCH_COUNTERS})
    counts = {STATUS_NAMES.get(code, str(code)): int((status == code).sum()) for code in np.unique(status)}
    attempted = stats["n_steps"].sum()
    summary: dict[str, Any] = {
        "kind": "ode",
        "name": str(h5.attrs.get("name", "")),
        "samples": int(status.size),
        "status_counts": counts,
        "method": str(h5.attrs["method"]),
        "controller": str(h5.attrs.get("controller", "")),
        "rtol": float(h5.attrs["rtol"]),
        "atol": float(h5.attrs["atol"]),
        "device": str(h5.attrs.get("device", "")),
        "engine": str(h5.attrs.get("engine", "")),
        "wall_time_s": float(h5.attrs["wall_time_s"]),
        "python_rhs": str(h5.attrs.get("python_rhs", "")),
        "steps": _describe(stats["n_steps"]),
        "accepted": _describe(stats["n_accepted"]),
        "rejected": _describe(stats["n_rejected"]),
        "f_evals": _describe(stats["n_f_evals"]),
        "rejected_fraction": float(stats["n_rejected"].sum() / attempted) if attempted else 0.0,
        **{name.removeprefix("n_"): _describe(stats[name]) for name in extra},
    }
    if switch:
        summary["switched"] = int((stats["n_switched"] != 0).sum())
    if "ranks" in h5:  # written by a distributed solve (odecli.app.solve_ranks)
        require(h5, "ranks/busy_s", "ranks/idle_s", "ranks/samples", "ranks/chunk_start")
        ranks = h5["ranks"]
        busy, idle = ranks["busy_s"][...], ranks["idle_s"][...]
        summary["ranks"] = {
            "ranks": int(busy.size), "busy_s": busy.tolist(), "idle_s": idle.tolist(),
            "samples": ranks["samples"][...].tolist(), "chunks": int(ranks["chunk_start"].size),
            "idle_fraction": float(idle.sum() / (busy + idle).sum()) if (busy + idle).sum() > 0 else 0.0,
        }
    if "events" in h5:
        summary["events"] = _events_summary(h5)
    if per_sample:
        summary["per_sample"] = [
            {"sample": i, "status": STATUS_NAMES.get(int(status[i]), str(status[i])),
             **{n: int(stats[n][i]) for n in (*COUNTERS, *extra)},
             **({"switched_at_step": int(stats["switched_at_step"][i]) if stats["n_switched"][i] else None}
                if switch else {})}
            for i in range(status.size)
        ]
    return summary


def render_ode_summary(summary: dict[str, Any], console: Console) -> None:
    head = Table(title=f"ODE run {summary['name']}", show_header=False)
    head.add_row("samples", str(summary["samples"]))
    head.add_row("status", ", ".join(f"{name}: {n}" for name, n in summary["status_counts"].items()))
    head.add_row("method", f"{summary['method']} ({summary['controller']} controller)")
    head.add_row("tolerances", f"rtol={summary['rtol']:g} atol={summary['atol']:g}")
    engine = f" ({summary['engine']} engine)" if summary.get("engine") else ""
    head.add_row("wall time", f"{summary['wall_time_s']:.3f} s on {summary['device']}{engine}")
    head.add_row("rejected fraction", f"{summary['rejected_fraction']:.3f}")
    if "switched" in summary:
        head.add_row("switched to rodas5", f"{summary['switched']} of {summary['samples']}")
    if summary["python_rhs"]:
        head.add_row("python RHS", summary["python_rhs"])
    console.print(head)
    counters = Table(title="per-sample counters")
    for column in ("", "mean", "min", "max", "total"):
        counters.add_column(column, justify="right")
    labels = ("steps", "accepted", "rejected", "f_evals", *(name.removeprefix("n_") for name in IMPLICIT_COUNTERS))
    for label in (label for label in labels if label in summary):
        d = summary[label]
        counters.add_row(label, f"{d['mean']:.1f}", f"{d['min']:.0f}", f"{d['max']:.0f}", f"{d['total']:.0f}")
    console.print(counters)
    if summary.get("events"):
        table = Table(title="events")
        for column in ("event", "definition", "samples with", "total", "max per sample"):
            table.add_column(column, justify="right")
        for name, e in summary["events"].items():
            terminal = "" if not e["terminal"] else f", terminal {e['terminal']}"
            table.add_row(name, f"{e['expression']} ({e['direction']}{terminal})", str(e["samples_with"]),
                          str(e["total"]), str(e["max"]))
        console.print(table)
    if "ranks" in summary:
        r = summary["ranks"]
        table = Table(title=f"{r['ranks']} ranks, idle {r['idle_fraction']:.1%}")
        for column in ("rank", "samples", "busy s", "idle s"):
            table.add_column(column, justify="right")
        for rank, (n, busy, idle) in enumerate(zip(r["samples"], r["busy_s"], r["idle_s"])):
            table.add_row(str(rank), str(n), f"{busy:.3f}", f"{idle:.3f}")
        console.print(table)
    if "per_sample" in summary:
        first = summary["per_sample"][0] if summary["per_sample"] else {}
        columns = ("sample", "status", *(c for c in (*COUNTERS, *IMPLICIT_COUNTERS, "switched_at_step") if c in first))
        cells = [["-" if row[c] is None else str(row[c]) for c in columns] for row in summary["per_sample"]]
        # a rich Table narrower than its columns cuts the names and numbers short: plain columns then
        widths = [max(len(column), *(len(row[i]) for row in cells)) for i, column in enumerate(columns)]
        if len(cells) > RICH_ROWS_MAX or sum(width + 3 for width in widths) + 1 > console.width:
            console.file.write(_plain_table(columns, cells))
            return
        rows = Table(title="samples")
        for column in columns:
            rows.add_column(column, justify="right")
        for row_cells in cells:
            rows.add_row(*row_cells)
        console.print(rows)


def _events_summary(h5: h5py.File) -> dict[str, dict[str, Any]]:
    """Per event of ``events/NAME`` (odecli.io.ode_run): occurrences in all, per sample at most,
    samples with any, and its definition."""
    out: dict[str, dict[str, Any]] = {}
    for name, group in h5["events"].items():
        if not isinstance(group, h5py.Group) or "count" not in group:
            continue
        count = numbers(h5, f"events/{name}/count")
        if not np.isfinite(count).all():
            raise InputError(f"{h5.filename}: events/{name}/count holds NaN or infinite counts")
        if count.shape != h5["status"].shape:
            raise InputError(f"{h5.filename}: events/{name}/count has shape {count.shape}, "
                             f"expected {h5['status'].shape} (one per sample)")
        out[name] = {
            "total": int(count.sum()), "max": int(count.max(initial=0)), "samples_with": int((count > 0).sum()),
            "expression": str(group.attrs.get("expression", "")), "direction": str(group.attrs.get("direction", "")),
            "terminal": int(group.attrs.get("terminal", 0)),
        }
    return out


def _plain_table(columns: tuple[str, ...], cells: list[list[str]]) -> str:
    """Right-aligned text columns: what a rich Table shows, at a hundredth of its cost per row."""
    widths = [max(len(column), *(len(row[i]) for row in cells)) for i, column in enumerate(columns)]
    lines = ["  ".join(text.rjust(width) for text, width in zip(row, widths)) for row in [list(columns), *cells]]
    return "samples\n" + "\n".join(lines) + "\n"
