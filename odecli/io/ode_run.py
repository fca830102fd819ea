"""The HDF5 layout of an ODE run (the output contract of ``odecli solve``).

Datasets ``t`` (batch, n_eval), ``y`` (batch, n_eval, n_states), ``status`` (batch,), group
``stats`` of (batch,) counters, group ``params``; root attributes ``kind``, ``states``,
``method``, ``rtol``, ``atol``, ``spec``, ``odecli_version``, ``wall_time_s``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from odecli import __version__
from odecli.io.atomic import atomic_h5
from odecli.ode.solver import Solution
from odecli.ode.status import STATUS_NAMES
from odecli.spec import OdeSpec


def write_ode_run(path: Path, spec: OdeSpec, solution: Solution) -> None:
    """Write ``solution`` atomically: the file appears complete or not at all."""
    with atomic_h5(path) as h5:
        h5.attrs["kind"] = "ode"
        h5.attrs["name"] = spec.name
        h5.attrs["states"] = np.array(spec.states, dtype=object)
        h5.attrs["method"] = spec.solver.method
        h5.attrs["controller"] = spec.solver.controller
        h5.attrs["rtol"] = spec.solver.rtol
        h5.attrs["atol"] = spec.solver.atol
        h5.attrs["dtype"] = spec.solver.dtype
        h5.attrs["device"] = solution.extra.get("device", "cpu")
        h5.attrs["spec"] = spec.text
        h5.attrs["spec_file"] = spec.file
        h5.attrs["python_rhs"] = spec.python or ""
        h5.attrs["odecli_version"] = __version__
        h5.attrs["wall_time_s"] = solution.wall_time_s
        h5.attrs["status_names"] = np.array([f"{code}={name}" for code, name in STATUS_NAMES.items()], dtype=object)
        h5.create_dataset("t", data=_np(solution.t))
        h5.create_dataset("y", data=_np(solution.y))
        h5.create_dataset("status", data=_np(solution.status).astype(np.int8))
        h5.create_dataset("t_final", data=_np(solution.t_final))
        h5.create_dataset("y_final", data=_np(solution.y_final))
        stats = h5.create_group("stats")
        for name, values in solution.stats.items():
            stats.create_dataset(name, data=_np(values))
        params = h5.create_group("params")
        for name, values in spec.params.items():
            params.create_dataset(name, data=np.asarray(values, dtype=np.float64))


def _np(tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()
