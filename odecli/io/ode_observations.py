"""The observations of an ODE fit read from an ``odecli solve`` output (``inverse.data.file``).

``t`` and the observed states of ``y``, and, for each event named in ``inverse.data.events``, the
first occurrences' times per sample from ``events/NAME/t``. Every problem with the file is one
:class:`~odecli.errors.InputError` naming ``inverse.data.file``, before any solve.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from odecli.errors import InputError
from odecli.io.bounded import check_readable
from odecli.specs import OdeSpec
from odecli.specs.inverse import EventObservation, InverseSpec


def read_observations(path: str, ode: OdeSpec,
                       inv: InverseSpec) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """``t`` (B, n_eval), the observed states of ``y`` and the observed events' first times
    (B, occurrences) from an ``odecli solve`` output."""
    where = f"{ode.file}: inverse.data.file"
    if not Path(path).is_file():
        raise InputError(f"{where}: file not found: {path}")
    events: dict[str, np.ndarray] = {}
    check_readable(Path(path), f"{where}: {path}: ")  # damage that loops HDF5 is refused, not waited on
    try:
        with h5py.File(path, "r") as h5:
            if "t" not in h5 or "y" not in h5:
                raise InputError(f"{where}: {path} has no 't' and 'y' datasets (expected an odecli solve output)")
            t, y = _numbers(h5, "t", path, where), _numbers(h5, "y", path, where)
            states = _state_names(h5, ode.states, path, where)
            for observation in inv.data.events:
                events[observation.name] = _read_event_times(h5, path, observation, where)
    except OSError:
        raise InputError(f"{where}: {path} is not an HDF5 file") from None
    if t.ndim != 2 or y.ndim != 3 or y.shape[:2] != t.shape:
        raise InputError(f"{where}: expected t (batch, n_eval) and y (batch, n_eval, n_states), got {t.shape} and {y.shape}")
    if t.shape[0] != ode.batch:
        raise InputError(f"{where}: {path} has {t.shape[0]} samples, the spec has batch={ode.batch}")
    for name, times in events.items():
        if times.shape[0] != ode.batch:
            raise InputError(f"{where}: events/{name}/t has {times.shape[0]} samples, the spec has batch={ode.batch}")
    missing = [name for name in inv.observed if name not in states]
    if missing:
        raise InputError(f"{where}: observed state(s) {', '.join(missing)} not in the file's states ({', '.join(states)})")
    start, end = np.asarray(ode.t_start)[:, None], np.asarray(ode.t_end)[:, None]
    lo, hi = np.minimum(start, end), np.maximum(start, end)
    # a terminal event leaves NaN at the output times past it: those are not compared
    ended = any(event.terminal for event in ode.events)
    if not np.isfinite(t).all() or (t < lo - 1e-12 * np.abs(lo)).any() or (t > hi + 1e-12 * np.abs(hi)).any():
        raise InputError(f"{where}: observation times lie outside the spec's time spans")
    observed = y[..., [states.index(n) for n in inv.observed]]
    if not ended and not np.isfinite(observed).all():
        raise InputError(f"{where}: observations contain NaN or inf (failed samples in {path}?)")
    if np.isinf(observed).any():
        raise InputError(f"{where}: observations contain inf")
    for name, times in events.items():  # before the start or after the end: never met by a solve
        if (times < lo - 1e-12 * np.abs(lo)).any() or (times > hi + 1e-12 * np.abs(hi)).any():
            raise InputError(f"{where}: events/{name}/t has times outside the spec's time spans")
    t = np.clip(t, lo, hi)
    return t, observed, events


def _numbers(h5: h5py.File, name: str, path: str, where: str) -> np.ndarray:
    """Dataset ``name`` as numbers: a group, strings or records in its place is one line (they were
    internal errors, issue 42)."""
    node = h5[name]
    if not isinstance(node, h5py.Dataset) or node.dtype.kind not in "iuf":
        what = "a group" if isinstance(node, h5py.Group) else f"of dtype {node.dtype}"
        raise InputError(f"{where}: {path}: '{name}' is {what}, expected numbers (an odecli solve output)")
    return node[...]


def _state_names(h5: h5py.File, default: list[str], path: str, where: str) -> list[str]:
    """The file's ``states`` attribute as a list of names (the spec's where absent)."""
    if "states" not in h5.attrs:
        return list(default)
    value = np.asarray(h5.attrs["states"])
    if value.ndim != 1 or value.dtype.kind not in "SUO":
        raise InputError(f"{where}: {path}: attribute 'states' must be a list of state names, got {value.dtype} "
                         f"of shape {value.shape}")
    try:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in value.tolist()]
    except UnicodeDecodeError:
        raise InputError(f"{where}: {path}: attribute 'states' is not UTF-8 text") from None


def _read_event_times(h5: h5py.File, path: str, observation: EventObservation, where: str) -> np.ndarray:
    """The first ``observation.occurrences`` times per sample of ``events/NAME/t``, all finite."""
    name, wanted = observation.name, observation.occurrences
    dataset = h5.get(f"events/{name}/t")
    if not isinstance(dataset, h5py.Dataset) or dataset.ndim != 2 or dataset.dtype.kind != "f":
        raise InputError(f"{where}: {path} has no events/{name}/t of (sample, occurrence) times "
                         f"(solve the spec with its events: to write them)")
    times = dataset[:, :wanted]
    complete = np.isfinite(times).all(axis=1) if times.shape[1] == wanted else np.zeros(len(times), dtype=bool)
    if not complete.all():
        raise InputError(f"{where}: events/{name}/t has fewer than {wanted} occurrence(s) in sample "
                         f"{int(np.argmin(complete))}")
    return times
