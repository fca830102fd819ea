"""The HDF5 layout of an ODE run (the output contract of ``odecli solve``), and its one writer.

One process writes a whole solution (:func:`write_ode_run`); a distributed solve
(:mod:`odecli.app.solve_ranks`) receives the batch as chunks of consecutive samples, in whatever
order the ranks finish them, and must not hold the whole batch on rank 0. Both go through
:class:`OdeRunStream`, which writes each chunk into its rows of datasets created (full size,
contiguous) when the first chunk arrives, then adds the root attributes, ``params`` and the
dimension scales at :meth:`OdeRunStream.finish`; a whole solution is one chunk. A distributed run
adds the root attribute ``ranks`` and the group ``ranks/`` (:func:`write_ranks`).

Datasets ``t`` (batch, n_eval), ``y`` (batch, n_eval, n_states), ``status`` (batch,), group
``stats`` of (batch,) counters, group ``params``; for a spec with ``events:``, one group
``events/NAME`` per event with ``t`` (sample, occurrence) and ``y`` (sample, occurrence, state)
NaN-padded to the most occurrences any sample had, and ``count`` (sample,) (an ``occurrence``
dimension of its own, so ``xarray.open_dataset(path, engine="h5netcdf", group="events/NAME")``
reads it); root attributes ``kind``, ``states``,
``method``, ``rtol``, ``atol``, ``device``, ``engine`` (``native``: the generated C solver,
``torch``, ``torch-compiled``), ``spec``, ``odecli_version``, ``wall_time_s``.

The root group is also a netCDF-4 style dataset: HDF5 dimension scales ``sample`` (0..batch-1),
``time`` (output index 0..n_eval-1; the times themselves are ``t``, one row per sample) and
``state`` (the state names, UTF-8 strings) are attached to every root dataset, and every dataset
has ``long_name`` and ``description`` attributes, so ``xarray.open_dataset(path,
engine="h5netcdf")`` gives named dimensions (sample, time, state) and ``ds.y.sel(state="x")``.

:data:`ODE_LAYOUT` states these shapes for the readers (``odecli.io.layout.require``), in the same
dimension names; the dimension scales are attached from it, so the dimensions written and those
checked are one table. :data:`ODE_INVERSE_LAYOUT` does the same for ``train-inverse``'s
ode-inverse files (written by :func:`odecli.app.fit_ode.write_fit`, which imports torch, hence
kept here).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from odecli import __version__
from odecli.io.atomic import atomic_h5
from odecli.io.layout import SCALAR, Layout
from odecli.ode.status import STATUS_NAMES
from odecli.specs import OdeSpec

if TYPE_CHECKING:
    from odecli.ode.native import ArraySolution
    from odecli.ode.solver import Solution


def write_ode_run(path: Path, spec: OdeSpec, solution: Solution | ArraySolution, replace: bool = True) -> None:
    """Write ``solution`` (tensors or numpy arrays) atomically: the file appears complete or not at all.
    ``replace=False`` keeps a file that appeared at ``path`` since the caller checked it (atomic_path)."""
    part = solution_part(solution)
    in_memory = _nbytes(part) <= IN_MEMORY_MOST  # see atomic_h5: a full disk is then one clean error
    with atomic_h5(path, replace, in_memory=in_memory) as h5:
        stream = OdeRunStream(h5, spec)
        stream.write(0, part)
        stream.finish(device=solution.extra.get("device", "cpu"), wall_time_s=solution.wall_time_s)


IN_MEMORY_MOST = 2**30
"""A whole solution up to this many bytes is written as a file image built in memory (one more
copy of arrays already held); larger ones are streamed to disk, after :func:`estimated_size`
was checked against the free space before solving."""


def _nbytes(tree: Any) -> int:
    if isinstance(tree, np.ndarray):
        return tree.nbytes
    if isinstance(tree, Mapping):
        return sum(_nbytes(v) for v in tree.values())
    return 0


def estimated_size(spec: OdeSpec) -> float:
    """A lower bound of the bytes the run file of ``spec`` takes: ``t`` and ``y`` at every output
    time (the file adds the final states, counters, events and metadata), so that a run refused
    for want of space would certainly have failed."""
    n_eval = max((len(row) for row in spec.t_eval), default=1)
    return 8.0 * spec.batch * n_eval * (1 + len(spec.states))


#: The per-sample root datasets, in the order they are created.
ROOT_DATASETS = ("t", "y", "status", "t_final", "y_final")

Part = dict[str, Any]
"""One chunk's results as numpy arrays: ROOT_DATASETS plus ``stats`` (name -> array)."""


def solution_part(solution: Solution | ArraySolution) -> Part:
    """A solution's per-sample arrays as plain numpy (picklable, no torch needed to write them)."""
    part: Part = {name: as_numpy(getattr(solution, name)) for name in ROOT_DATASETS}
    part["status"] = part["status"].astype(np.int8)
    part["stats"] = {name: as_numpy(values) for name, values in solution.stats.items()}
    part["engine"] = solution.extra.get("engine", "")
    part["events"] = {name: {"t": as_numpy(r.t), "y": as_numpy(r.y), "count": as_numpy(r.count).astype(np.int64)}
                      for name, r in getattr(solution, "events", {}).items()}
    return part


def root_attributes(spec: OdeSpec, device: str, wall_time_s: float, engine: str = "") -> dict[str, Any]:
    """The root attributes of an ODE run file, as every writer sets them."""
    return {
        "kind": "ode",
        "name": spec.name,
        "states": np.array(spec.states, dtype=object),
        "method": spec.solver.method,
        "controller": spec.solver.controller,
        "rtol": spec.solver.rtol,
        "atol": spec.solver.atol,
        "dtype": spec.solver.dtype,
        "device": device,
        "engine": engine,
        "spec": spec.text,
        "spec_file": spec.file,
        "python_rhs": spec.python or "",
        "odecli_version": __version__,
        "wall_time_s": wall_time_s,
        "status_names": np.array([f"{code}={name}" for code, name in STATUS_NAMES.items()], dtype=object),
    }


class OdeRunStream:
    """Write an ODE run into an open, empty HDF5 file one chunk of samples at a time.

    Call :meth:`write` once per chunk (any order; together the chunks must cover every sample
    exactly once), then :meth:`finish`. Memory use is one chunk, whatever the batch size.
    """

    def __init__(self, h5: h5py.File, spec: OdeSpec) -> None:
        self.h5 = h5
        self.spec = spec
        self.batch = spec.batch
        self.written = 0
        self.engines: set[str] = set()  # the engine of every chunk (one, unless ranks differ)
        self._created = False

    def write(self, start: int, part: Part) -> None:
        """Store samples ``start .. start + len(part['status']) - 1``."""
        count = len(part["status"])
        if not (0 <= start and start + count <= self.batch):
            raise ValueError(f"chunk {start}..{start + count} lies outside the batch of {self.batch}")
        if not self._created:
            self._create(part)
        rows = slice(start, start + count)
        for name in ROOT_DATASETS:
            self.h5[name][rows] = part[name]
        for name, values in part["stats"].items():
            self.h5["stats"][name][rows] = values
        for name, record in part.get("events", {}).items():
            self._write_events(name, rows, record)
        self.engines.add(part.get("engine", ""))
        self.written += count

    def _write_events(self, name: str, rows: slice, record: Part) -> None:
        """One chunk's occurrences of event ``name``; the padded width grows to the most any sample had."""
        group = self.h5[f"events/{name}"]
        width = record["t"].shape[1]
        if width > group["t"].shape[1]:
            group["t"].resize(width, axis=1)
            group["y"].resize(width, axis=1)
        group["t"][rows, :width] = record["t"]
        group["y"][rows, :width] = record["y"]
        group["count"][rows] = record["count"]

    def finish(self, *, device: str, wall_time_s: float) -> None:
        """Root attributes, ``params`` and dimension scales; every sample must have been written."""
        if self.written != self.batch:
            raise RuntimeError(f"only {self.written} of {self.batch} samples were written")
        engine = "+".join(sorted(self.engines))
        for key, value in root_attributes(self.spec, device, wall_time_s, engine).items():
            self.h5.attrs[key] = value
        _add_dimensions(self.h5, list(self.spec.states))
        params = self.h5.create_group("params")
        for name, values in self.spec.params.items():
            params.create_dataset(name, data=np.asarray(values, dtype=np.float64))
            params[name].attrs["description"] = f"value of parameter {name} (one per sample, or shared)"
        _attach_sample_scale(self.h5)
        _describe_events(self.h5, self.spec)

    def _create(self, part: Part) -> None:
        for name in ROOT_DATASETS:
            first = np.asarray(part[name])
            self.h5.create_dataset(name, shape=(self.batch,) + first.shape[1:], dtype=first.dtype)
        stats = self.h5.create_group("stats")
        for name, values in part["stats"].items():
            values = np.asarray(values)
            stats.create_dataset(name, shape=(self.batch,) + values.shape[1:], dtype=values.dtype)
            stats[name].attrs["description"] = f"per-sample solver counter {name}"
        n_states = len(self.spec.states)
        rows = max(1, min(self.batch, 4096))
        for event in self.spec.events:
            # NaN-padded (sample, occurrence): resizable, since chunks arrive with their own widths.
            group = self.h5.create_group(f"events/{event.name}")
            group.create_dataset("t", shape=(self.batch, 0), maxshape=(self.batch, None), dtype=np.float64,
                                 chunks=(rows, 8), fillvalue=np.nan)
            group.create_dataset("y", shape=(self.batch, 0, n_states), maxshape=(self.batch, None, n_states),
                                 dtype=np.float64, chunks=(rows, 8, max(1, n_states)), fillvalue=np.nan)
            group.create_dataset("count", shape=(self.batch,), dtype=np.int64)
        self._created = True


def write_ranks(
    h5: h5py.File, *, busy_s: np.ndarray, idle_s: np.ndarray, samples: np.ndarray,
    chunks: np.ndarray, info: Mapping[str, Any] | None = None,
) -> None:
    """Per-rank accounting of a distributed solve: root attr ``ranks`` and group ``ranks/``.

    ``ranks/busy_s``, ``idle_s``, ``samples`` have one entry per rank (dimension scale ``rank``);
    ``ranks/chunk_start``, ``chunk_stop``, ``chunk_rank`` list the chunks in the order their
    results arrived (dimension scale ``chunk``): which rank solved which samples.
    """
    size = len(busy_s)
    h5.attrs["ranks"] = size
    group = h5.create_group("ranks")
    for key, value in (info or {}).items():
        group.attrs[key] = value
    group.create_dataset("rank", data=np.arange(size, dtype=np.int64))
    group.create_dataset("chunk", data=np.arange(len(chunks), dtype=np.int64))
    for name in ("rank", "chunk"):
        group[name].make_scale(name)
    described = {
        "busy_s": (busy_s, np.float64, "rank", "seconds the rank spent solving chunks"),
        "idle_s": (idle_s, np.float64, "rank", "seconds of the solve phase the rank was not solving (waiting, messages, tail)"),
        "samples": (samples, np.int64, "rank", "number of samples the rank solved"),
        "chunk_start": (chunks[:, 0] if len(chunks) else chunks, np.int64, "chunk", "first sample of the chunk"),
        "chunk_stop": (chunks[:, 1] if len(chunks) else chunks, np.int64, "chunk", "one past the last sample of the chunk"),
        "chunk_rank": (chunks[:, 2] if len(chunks) else chunks, np.int64, "chunk", "rank that solved the chunk"),
    }
    for name, (values, dtype, dim, description) in described.items():
        dataset = group.create_dataset(name, data=np.asarray(values, dtype=dtype).reshape(-1))
        dataset.dims[0].attach_scale(group[dim])
        dataset.attrs["description"] = description


PER_SAMPLE = (("sample",),)
# t and y as written, or (files of other programs) of one sample without the sample axis: as_batched
TRAJECTORIES = {"t": (("sample", "time"), ("time",)), "y": (("sample", "time", "state"), ("time", "state"), ("time",))}
#: The datasets and numeric attributes of an ODE run as readers may find them; the writer's layouts come first.
ODE_LAYOUT = Layout({
    "status": PER_SAMPLE,
    **TRAJECTORIES,
    "t_final": PER_SAMPLE,
    "y_final": (("sample", "state"),),
    "stats/*": PER_SAMPLE,
    "params/*": PER_SAMPLE,
    # a distributed solve's accounting: write_ranks
    "ranks/busy_s": (("rank",),), "ranks/idle_s": (("rank",),), "ranks/samples": (("rank",),),
    "ranks/chunk_start": (("chunk",),), "ranks/chunk_stop": (("chunk",),), "ranks/chunk_rank": (("chunk",),),
    "@rtol": SCALAR, "@atol": SCALAR, "@wall_time_s": SCALAR,
})
#: The same for an ode-inverse run: trajectories and counters as above, one history entry per iteration
#: (the first is the initial guess's), fit/init/truth of each unknown alike (params/: other programs' name for fit/).
ODE_INVERSE_LAYOUT = Layout({
    "status": PER_SAMPLE,
    "stats/*": PER_SAMPLE,
    **TRAJECTORIES,
    "data": (("sample", "time", "observed"),),  # the fitted data at the times t, attribute 'observed' names its states
    "history/*": (("iteration",),),
    **{f"{group}/*": (("unknown *",),) for group in ("fit", "init", "truth", "params")},
    "@iterations": SCALAR, "@ranks": SCALAR, "@noise": SCALAR, "@wall_time_s": SCALAR,
}, nonempty=frozenset({"sample", "iteration", "unknown *"}))

# name -> (long_name, description) of every root dataset; its dimensions are ODE_LAYOUT's
_ROOT_VARIABLES = {
    "t": ("time", "output times of each sample (row = sample, column = output index)"),
    "y": ("state values", "solution y[sample, time index, state] at the times t[sample, time index]"),
    "status": ("status", "per-sample outcome code: 0 success, nonzero failure (see flag_meanings)"),
    "t_final": ("final time", "time each sample's integration reached (the end time unless it failed)"),
    "y_final": ("final state", "state of each sample at t_final"),
}


def _add_dimensions(h5, states: list[str]) -> None:
    """Dimension scales and descriptive attributes that make the root group netCDF-readable."""
    batch, n_eval = h5["t"].shape
    h5.create_dataset("sample", data=np.arange(batch, dtype=np.int64))
    h5.create_dataset("time", data=np.arange(n_eval, dtype=np.int64))
    # Variable-length UTF-8 strings round-trip through h5netcdf/xarray as a string coordinate.
    h5.create_dataset("state", data=np.array(states, dtype=object), dtype=h5py.string_dtype("utf-8"))
    scales = {
        "sample": ("sample index", "index of the sample in the batch"),
        "time": ("output time index", "index of the output time; the times are the variable t (sample, time)"),
        "state": ("state name", "name of each state variable, in spec order"),
    }
    for name, (long_name, description) in scales.items():
        h5[name].make_scale(name)
        h5[name].attrs["long_name"] = long_name
        h5[name].attrs["description"] = description
    for name, (long_name, description) in _ROOT_VARIABLES.items():
        dataset = h5[name]
        for axis, dim in enumerate(ODE_LAYOUT.arrays[name][0]):
            dataset.dims[axis].attach_scale(h5[dim])
        dataset.attrs["long_name"] = long_name
        dataset.attrs["description"] = description
    # t is the time of each (sample, output) pair: a coordinate of y, so that xarray shows it with
    # y and nobody takes the output index `time` for seconds.
    h5["y"].attrs["coordinates"] = "t"
    codes = sorted(STATUS_NAMES)
    h5["status"].attrs["flag_values"] = np.array(codes, dtype=np.int8)
    h5["status"].attrs["flag_meanings"] = " ".join(STATUS_NAMES[c] for c in codes)


def _describe_events(h5, spec: OdeSpec) -> None:
    """Each ``events/NAME`` group as a netCDF group: its own ``occurrence`` dimension, the root's
    ``sample`` and ``state``, and the event's definition as attributes."""
    for event in spec.events:
        group = h5[f"events/{event.name}"]
        width = group["t"].shape[1]
        group.create_dataset("occurrence", data=np.arange(width, dtype=np.int64))
        group["occurrence"].make_scale("occurrence")
        group["occurrence"].attrs["description"] = "index of the occurrence, in time order"
        # The state names again, so that xarray, opening only this group, can select by them.
        group.create_dataset("state", data=np.array(spec.states, dtype=object), dtype=h5py.string_dtype("utf-8"))
        group["state"].make_scale("state")
        for dataset, dims in (("t", ("sample", "occurrence")), ("y", ("sample", "occurrence", "state")),
                              ("count", ("sample",))):
            for axis, dim in enumerate(dims):
                group[dataset].dims[axis].attach_scale(group[dim] if dim in ("occurrence", "state") else h5[dim])
        group["t"].attrs["description"] = f"times of event {event.name} per sample, NaN past the sample's count"
        group["y"].attrs["description"] = f"states at event {event.name} per sample, NaN past the sample's count"
        group["y"].attrs["coordinates"] = "t"
        group["count"].attrs["description"] = f"occurrences of event {event.name} per sample"
        group.attrs["expression"] = event.expression
        group.attrs["direction"] = {1: "rising", -1: "falling", 0: "both"}[event.direction]
        group.attrs["terminal"] = event.terminal


def _attach_sample_scale(h5) -> None:
    """The per-sample datasets of ``stats/`` and ``params/`` get the root's ``sample`` dimension, so
    xarray reads those groups with it instead of ``phony_dim_0`` (shared parameters keep theirs)."""
    batch = h5["sample"].shape[0]
    for group in ("stats", "params"):
        for dataset in h5[group].values():
            if isinstance(dataset, h5py.Dataset) and dataset.ndim >= 1 and dataset.shape[0] == batch:
                dataset.dims[0].attach_scale(h5["sample"])


def as_numpy(values: Any) -> np.ndarray:
    """A tensor (on any device) or an array as a numpy array; no torch import for arrays."""
    if hasattr(values, "detach"):
        return values.detach().cpu().numpy()
    return np.asarray(values)
