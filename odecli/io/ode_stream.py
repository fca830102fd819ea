"""Streaming writer for ODE runs: the layout of :func:`odecli.io.ode_run.write_ode_run`, chunk by chunk.

``write_ode_run`` needs the whole :class:`~odecli.ode.solver.Solution` in memory. A distributed solve
(:mod:`odecli.app.solve_ranks`) receives the batch as chunks of consecutive samples, in whatever
order the ranks finish them, and must not hold the whole batch on rank 0. :class:`OdeRunStream`
writes each chunk into its rows of datasets created (full size, contiguous like ``write_ode_run``'s)
when the first chunk arrives, then adds the root attributes, ``params`` and the dimension scales
(``write_ode_run``'s own helper) at :meth:`OdeRunStream.finish`. The result is the same file, object
for object and attribute for attribute; ``tests/test_ode_mpi.py`` checks that against
``write_ode_run`` so that a change to one without the other fails a test.

A distributed run adds what ``write_ode_run`` has no notion of: the root attribute ``ranks`` and
the group ``ranks/`` (see :func:`write_ranks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import h5py
import numpy as np

from odecli import __version__
from odecli.io.ode_run import _add_dimensions, as_numpy
from odecli.ode.status import STATUS_NAMES
from odecli.specs import OdeSpec

if TYPE_CHECKING:
    from odecli.ode.native import ArraySolution
    from odecli.ode.solver import Solution

#: The per-sample root datasets, in the order write_ode_run creates them.
ROOT_DATASETS = ("t", "y", "status", "t_final", "y_final")

Part = dict[str, Any]
"""One chunk's results as numpy arrays: ROOT_DATASETS plus ``stats`` (name -> array)."""


def solution_part(solution: Solution | ArraySolution) -> Part:
    """A solution's per-sample arrays as plain numpy (picklable, no torch needed to write them)."""
    part: Part = {name: as_numpy(getattr(solution, name)) for name in ROOT_DATASETS}
    part["status"] = part["status"].astype(np.int8)
    part["stats"] = {name: as_numpy(values) for name, values in solution.stats.items()}
    part["engine"] = solution.extra.get("engine", "")
    return part


def root_attributes(spec: OdeSpec, device: str, wall_time_s: float, engine: str = "") -> dict[str, Any]:
    """The root attributes of an ODE run file, exactly as write_ode_run sets them."""
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
        self.engines.add(part.get("engine", ""))
        self.written += count

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

    def _create(self, part: Part) -> None:
        for name in ROOT_DATASETS:
            first = np.asarray(part[name])
            self.h5.create_dataset(name, shape=(self.batch,) + first.shape[1:], dtype=first.dtype)
        stats = self.h5.create_group("stats")
        for name, values in part["stats"].items():
            values = np.asarray(values)
            stats.create_dataset(name, shape=(self.batch,) + values.shape[1:], dtype=values.dtype)
            stats[name].attrs["description"] = f"per-sample solver counter {name}"
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
