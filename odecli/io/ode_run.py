"""The HDF5 layout of an ODE run (the output contract of ``odecli solve``).

Datasets ``t`` (batch, n_eval), ``y`` (batch, n_eval, n_states), ``status`` (batch,), group
``stats`` of (batch,) counters, group ``params``; root attributes ``kind``, ``states``,
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
    with atomic_h5(path, replace) as h5:
        h5.attrs["kind"] = "ode"
        h5.attrs["name"] = spec.name
        h5.attrs["states"] = np.array(spec.states, dtype=object)
        h5.attrs["method"] = spec.solver.method
        h5.attrs["controller"] = spec.solver.controller
        h5.attrs["rtol"] = spec.solver.rtol
        h5.attrs["atol"] = spec.solver.atol
        h5.attrs["dtype"] = spec.solver.dtype
        h5.attrs["device"] = solution.extra.get("device", "cpu")
        h5.attrs["engine"] = solution.extra.get("engine", "")
        h5.attrs["spec"] = spec.text
        h5.attrs["spec_file"] = spec.file
        h5.attrs["python_rhs"] = spec.python or ""
        h5.attrs["odecli_version"] = __version__
        h5.attrs["wall_time_s"] = solution.wall_time_s
        h5.attrs["status_names"] = np.array([f"{code}={name}" for code, name in STATUS_NAMES.items()], dtype=object)
        h5.create_dataset("t", data=as_numpy(solution.t))
        h5.create_dataset("y", data=as_numpy(solution.y))
        h5.create_dataset("status", data=as_numpy(solution.status).astype(np.int8))
        h5.create_dataset("t_final", data=as_numpy(solution.t_final))
        h5.create_dataset("y_final", data=as_numpy(solution.y_final))
        _add_dimensions(h5, list(spec.states))
        stats = h5.create_group("stats")
        for name, values in solution.stats.items():
            stats.create_dataset(name, data=as_numpy(values))
            stats[name].attrs["description"] = f"per-sample solver counter {name}"
        params = h5.create_group("params")
        for name, values in spec.params.items():
            params.create_dataset(name, data=np.asarray(values, dtype=np.float64))
            params[name].attrs["description"] = f"value of parameter {name} (one per sample, or shared)"


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
    # a distributed solve's accounting: odecli.io.ode_stream.write_ranks
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
    codes = sorted(STATUS_NAMES)
    h5["status"].attrs["flag_values"] = np.array(codes, dtype=np.int8)
    h5["status"].attrs["flag_meanings"] = " ".join(STATUS_NAMES[c] for c in codes)


def as_numpy(values: Any) -> np.ndarray:
    """A tensor (on any device) or an array as a numpy array; no torch import for arrays."""
    if hasattr(values, "detach"):
        return values.detach().cpu().numpy()
    return np.asarray(values)
