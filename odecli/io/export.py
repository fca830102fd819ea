"""``odecli export``: a run file as CSV files for spreadsheets and tools that do not read HDF5.

ODE runs (kind ode):
  ``trajectories.csv``  long format, one row per (sample, output time): sample, t, <one column per state>
  ``samples.csv``       one row per sample: sample, status, status_name, the stats counters, t_final,
                        final_<state>, and the parameters (shared ones repeated on every row)
  ``events.csv``        (a spec with ``events:``) long format, one row per occurrence, every event in one
                        file: event, sample, occurrence (0, 1, ... in time order), t, <one column per
                        state>; samples without an occurrence have no row (their counts are 0 in
                        ``events/NAME/count``)
Inverse runs (kind pde-inverse, ode-inverse):
  ``history.csv``       one row per iteration: iteration, loss, grad_norm, wall_time_s, then any other
                        per-iteration history (misfit, regularization, model_error, ...)
  pde-inverse also:     ``traces.csv`` (shot, receiver, time, observed, predicted) and
                        ``field_<true|initial|final>.csv`` (the grid, one CSV row per grid row)
  ode-inverse also:     ``trajectories.csv`` (as for ODE runs) and ``params.csv`` (name, index, value:
                        the fitted values, group ``fit``); with observed event times (``inverse.data.events``)
                        ``events.csv``: event, sample, occurrence, t (fitted), observed

Numbers are written with Python's shortest round-trip representation, so reading a CSV back gives
exactly the stored float64 values. The files are written as a set: all of them go into a hidden
staging folder first and reach the target folder (created if missing) only when every one was
written, so a failed export (disk full, a damaged input, Ctrl-C) leaves nothing behind and a rerun
needs no ``--force``.
"""

from __future__ import annotations

import contextlib
import csv
import os
import secrets
import shutil
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import h5py
import numpy as np

from odecli.errors import InputError
from odecli.io.layout import as_batched, state_names, open_run, require, run_kind

HISTORY_FIRST = ("loss", "grad_norm", "wall_time_s")


OUTPUTS = {
    "ode": ("trajectories.csv", "samples.csv", "events.csv"),
    "pde-inverse": ("history.csv", "traces.csv", "field_true.csv", "field_initial.csv", "field_final.csv"),
    "ode-inverse": ("history.csv", "trajectories.csv", "params.csv", "events.csv"),
}
# what each kind's export cannot do without, and what else it reads when present
REQUIRED = {"ode": ("t", "y", "status"), "pde-inverse": ("history/loss",), "ode-inverse": ("history/loss",)}
OPTIONAL = {"ode": ("stats/", "t_final", "y_final", "params/"),
            "pde-inverse": ("history/", "data/time", "data/observed", "data/predicted", "fields/"),
            "ode-inverse": ("history/", "t", "y", "fit/", "params/")}


def export_csv(run: Path, folder: Path, force: bool = False) -> list[Path]:
    """Write the CSV files of ``run`` into ``folder``; return their paths in the order written.

    Existing CSV files of the same names are replaced only with ``force`` (checked before any is
    written); other files in ``folder`` are left alone. On any failure nothing is left behind.
    """
    folder = Path(folder)
    with open_run(run) as h5:  # open (and validate) the input before touching the output folder
        kind = run_kind(h5)
        require(h5, *REQUIRED[kind], optional=OPTIONAL[kind])
        if folder.exists() and not folder.is_dir():
            raise InputError(f"--csv: {folder} exists and is not a folder")
        existing = [name for name in OUTPUTS[kind] if (folder / name).exists()]
        if existing and not force:
            raise InputError(f"--csv: {folder / existing[0]} exists; pass --force to overwrite the CSV files")
        with _staging(folder) as staging:
            written = _write_all(h5, kind, staging)
        return [folder / path.name for path in written]


def _write_all(h5, kind: str, folder: Path) -> list[Path]:
    """Every CSV file of a run of ``kind`` into ``folder`` (the staging folder), in the order written."""
    if kind == "ode":
        written = [_trajectories(h5, folder), _samples(h5, folder)]
        if "events" in h5:
            written.append(_events(h5, folder, "y"))
        return written
    written = [_history(h5, folder)]
    if kind == "pde-inverse":
        written += _pde_extras(h5, folder)
    else:
        if "t" in h5 and "y" in h5:
            written.append(_trajectories(h5, folder))
        if "fit" in h5 or "params" in h5:
            written.append(_params(h5, folder))
        if "events" in h5:
            written.append(_events(h5, folder, "data"))
    return written


@contextlib.contextmanager
def _staging(folder: Path) -> Iterator[Path]:
    """A fresh hidden folder for the CSVs; they reach ``folder`` only if the block succeeds.

    A new ``folder`` is the staging folder renamed into place (it appears complete or not at all).
    An existing one gets the finished files moved in, one rename each (the staging folder is inside
    it, so the renames cannot fail for lack of space). On failure the staging folder, and any
    parent folders made for it, are removed again.
    """
    existed = folder.is_dir()
    home = folder if existed else folder.parent
    made = _make_parents(home)
    staging = home / f".{folder.name or 'csv'}.{secrets.token_hex(4)}.tmp"
    try:
        try:
            staging.mkdir()
        except OSError as exc:
            raise InputError(f"--csv: cannot create files in {home}: {exc.strerror or exc}") from None
        yield staging
        if existed:
            for path in staging.iterdir():
                os.replace(path, folder / path.name)
            staging.rmdir()
        else:
            os.rename(staging, folder)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        for parent in reversed(made):
            with contextlib.suppress(OSError):
                parent.rmdir()
        if isinstance(exc, OSError):
            raise InputError(f"--csv: cannot write the CSV files into {folder}: {exc.strerror or exc}; "
                             f"nothing was written") from None
        raise


def _make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return the ones created, outermost first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()][::-1]
    for path in missing:
        try:
            path.mkdir()
        except OSError as exc:
            for made in reversed(missing[: missing.index(path)]):
                with contextlib.suppress(OSError):
                    made.rmdir()
            raise InputError(f"--csv: cannot create folder {path}: {exc.strerror or exc}") from None
    return missing


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence]) -> Path:
    """One CSV file (in the staging folder, which makes the set of files atomic)."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _names(h5, n_states: int) -> list[str]:
    return state_names(h5, n_states)


def _unique(columns: list[str], reserved: Iterable[str], prefix: str) -> list[str]:
    """Prefix any column name that clashes with ``reserved`` (e.g. a state called 't')."""
    taken = set(reserved)
    out = []
    for name in columns:
        while name in taken:
            name = prefix + name
        taken.add(name)
        out.append(name)
    return out


def _trajectories(h5, folder: Path) -> Path:
    t, y = as_batched(np.asarray(h5["t"][...], dtype=float), np.asarray(h5["y"][...], dtype=float))
    states = _unique(_names(h5, y.shape[2]), ("sample", "t"), "state_")
    n_samples, n_eval, _ = y.shape

    def rows():
        for i in range(n_samples):
            ti, yi = t[i].tolist(), y[i].tolist()
            for k in range(n_eval):
                yield [i, ti[k], *yi[k]]

    return write_csv(folder / "trajectories.csv", ["sample", "t", *states], rows())


def _samples(h5, folder: Path) -> Path:
    from odecli.ode.status import STATUS_NAMES

    status = h5["status"][...].astype(int)  # like every per-sample dataset: (sample,) or (sample, state)
    columns: list[tuple[str, np.ndarray]] = [("sample", np.arange(status.size)), ("status", status),
                                             ("status_name", np.array([STATUS_NAMES.get(c, str(c)) for c in status]))]
    if "stats" in h5:
        columns += [(name, h5["stats"][name][...]) for name in h5["stats"]]
    if "t_final" in h5:
        columns.append(("t_final", h5["t_final"][...]))
    if "y_final" in h5:
        y_final = h5["y_final"][...]
        for s, name in enumerate(_names(h5, y_final.shape[1])):
            columns.append((f"final_{name}", y_final[:, s]))
    if "params" in h5:
        columns += [(name, h5["params"][name][...]) for name in h5["params"]]
    header = _unique([c for c, _ in columns], (), "param_")
    values = [c.tolist() for _, c in columns]
    return write_csv(folder / "samples.csv", header, zip(*values))


def _history(h5, folder: Path) -> Path:
    history = h5["history"]  # holds loss (required), and every series has one entry per iteration
    names = [n for n in HISTORY_FIRST if n in history] + sorted(n for n in history if n not in HISTORY_FIRST)
    values = [np.asarray(history[n][...], dtype=float).tolist() for n in names]
    return write_csv(folder / "history.csv", ["iteration", *names], zip(range(len(values[0])), *values))


def _pde_extras(h5, folder: Path) -> list[Path]:
    written = []
    if "data/observed" in h5 and "data/predicted" in h5:
        observed = np.asarray(h5["data/observed"][...], dtype=float)
        predicted = np.asarray(h5["data/predicted"][...], dtype=float)
        if observed.shape == predicted.shape:
            time = h5["data/time"][...] if "data/time" in h5 else None
            # the writer's contract is (shots, receivers, steps); accept (shots, steps, receivers) too
            if time is not None and observed.shape[2] != time.size and observed.shape[1] == time.size:
                observed, predicted = observed.transpose(0, 2, 1), predicted.transpose(0, 2, 1)
            shots, receivers, steps = observed.shape
            time = time.tolist() if time is not None else list(range(steps))

            def rows():
                for s in range(shots):
                    obs, pred = observed[s].tolist(), predicted[s].tolist()
                    for r in range(receivers):
                        for k in range(steps):
                            yield [s, r, time[k], obs[r][k], pred[r][k]]

            written.append(write_csv(folder / "traces.csv", ["shot", "receiver", "time", "observed", "predicted"],
                                     rows()))
    if "fields" in h5:
        for name in ("true", "initial", "final"):
            if name in h5["fields"]:
                grid = np.asarray(h5["fields"][name][...], dtype=float)
                header = [f"x{j}" for j in range(grid.shape[1])]
                written.append(write_csv(folder / f"field_{name}.csv", header, grid.tolist()))
    return written


def _params(h5, folder: Path) -> Path:
    """The fitted values: group ``fit`` (what ``train-inverse`` writes), else ``params``."""
    group = h5["fit"] if "fit" in h5 else h5["params"]
    rows = []
    for name in group:
        rows += [[name, j, v] for j, v in enumerate(group[name][...].tolist())]  # one value per entry: (unknown,)
    return write_csv(folder / "params.csv", ["name", "index", "value"], rows)


def _events(h5, folder: Path, second: str) -> Path:
    """``events.csv``: one row per occurrence of every event under ``events/``, in time order per sample.

    ``second`` is what each row carries besides the time: ``y`` (an ODE run: the state at the
    event, one column per state) or ``data`` (an ode-inverse run: the observed time beside the
    fitted one). Each group is checked before it is read: a damaged one is one line, not a traceback.
    """
    group = h5["events"]
    if not isinstance(group, h5py.Group):
        raise InputError(f"{h5.filename}: 'events' is not a group")
    n_samples = int(h5["status"].shape[0]) if "status" in h5 else None
    tables = []
    for name in group:
        times, other = event_arrays(h5, name, second, n_samples)
        tables.append((name, times, other))
    if second == "y":
        width = next((other.shape[2] for _, _, other in tables if other is not None), 0)
        columns = _unique(_names(h5, width), ("event", "sample", "occurrence", "t"), "state_") if width else []
    else:
        columns = ["observed"]

    def rows():
        for name, times, other in tables:
            for i, k in zip(*np.nonzero(np.isfinite(times))):
                extra = other[i, k].tolist() if second == "y" else [float(other[i, k])]
                yield [name, int(i), int(k), float(times[i, k]), *extra]

    return write_csv(folder / "events.csv", ["event", "sample", "occurrence", "t", *columns], rows())


def event_arrays(h5, name: str, second: str, n_samples: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``events/NAME/t`` (sample, occurrence) and ``events/NAME/<second>``, their shapes checked."""
    where = f"{h5.filename}: events/{name}"
    arrays = {}
    for key, ndim in (("t", 2), (second, 3 if second == "y" else 2)):
        node = h5.get(f"events/{name}/{key}")
        if not isinstance(node, h5py.Dataset) or node.ndim != ndim or node.dtype.kind not in "fiu":
            got = "missing" if node is None else (f"shape {node.shape}, type {node.dtype}"
                                                  if isinstance(node, h5py.Dataset) else "not a dataset")
            raise InputError(f"{where}/{key}: expected a numeric dataset of {ndim} axes "
                             f"(sample, occurrence{', state' if ndim == 3 else ''}), got {got}")
        arrays[key] = np.asarray(node[...], dtype=float)
    times, other = arrays["t"], arrays[second]
    if n_samples is not None and times.shape[0] != n_samples:
        raise InputError(f"{where}/t has {times.shape[0]} samples, expected {n_samples} (from 'status')")
    if other.shape[:2] != times.shape:
        raise InputError(f"{where}/{second} has shape {other.shape}, expected {times.shape} first (from 't')")
    return times, other
