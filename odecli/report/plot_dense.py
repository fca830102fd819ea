"""Dense curves for drawing a sparse ODE run: re-solve the run's own spec at more output times.

A run file holds the solution only at its ``time.eval`` times, and straight lines between 101
points over t = 0..40 of a stiff Van der Pol draw spikes and, in a phase portrait, a star of
chords the ODE does not have. An interpolating spline through those points is not the ODE's
solution either. The file does keep the exact spec it was solved from (attribute ``spec``), so
for an ``equations:`` system we solve it again with ``time.eval`` raised to a multiple of the
stored count, every stored time being one of the new ones, and draw those curves only if they
pass through every stored point (within 1e-3 of each state's range plus the spec's atol): the
picture then shows the same computation as the file, densely.

No re-solve (the caller draws the stored points as markers and says the output is sparse) for:
``python:`` right-hand sides (their module may be gone), explicit lists of eval times, specs
whose relative paths no longer resolve, runs that took over ``MAX_RESOLVE_S`` to solve, or any
mismatch with the stored points.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from odecli.errors import OdecliError
from odecli.io.layout import as_batched

DENSE_POINTS = 4000  # at least this many output times per sample when re-solving, by default
MAX_RESOLVE_S = 5.0  # the run's own wall time above which a picture does not re-solve it
MAX_DENSE_VALUES = 20_000_000  # samples x times x states of the dense solution, at most
MATCH = 1e-3  # dense and stored values may differ by this fraction of the state's range (+ atol)


def dense_solution(h5, t: np.ndarray, y: np.ndarray, fitted: Optional[dict[str, np.ndarray]] = None,
                   points: int = DENSE_POINTS) -> Optional[tuple[np.ndarray, np.ndarray, int]]:
    """(t, y) re-solved at ``(n - 1) * k + 1`` times per sample and ``k``, or None (see module doc).

    ``fitted``: an ODE fit's fitted parameters (its ``fit/`` group), which replace the spec's
    parameters so the curves are the fitted trajectories the file stores.
    """
    text = h5.attrs.get("spec", "")
    text = text.decode() if isinstance(text, bytes) else str(text)
    if not text or str(h5.attrs.get("python_rhs", "")) or y.shape[1] < 2:
        return None
    if float(h5.attrs.get("wall_time_s", 0.0)) > MAX_RESOLVE_S:
        return None
    try:
        return _resolve(text, str(h5.attrs.get("spec_file", "spec.yaml")), t, y, fitted, points)
    except (OdecliError, OSError, RuntimeError, ValueError, KeyError, TypeError, IndexError, ArithmeticError):
        return None  # the picture falls back to the stored points; it never fails for this


def _resolve(text: str, file: str, t: np.ndarray, y: np.ndarray, fitted: Optional[dict[str, np.ndarray]],
             points: int):
    from odecli.app.solve import solve_spec_arrays
    from odecli.specs.loader import parse_yaml
    from odecli.specs.ode import parse_ode_spec

    data = parse_yaml(text, file)
    time = data.get("time")
    n_stored = y.shape[1]
    if not isinstance(time, dict) or time.get("eval", 2) != n_stored or isinstance(time.get("eval"), bool):
        return None
    k = max(1, math.ceil(points / (n_stored - 1)))
    n_dense = (n_stored - 1) * k + 1
    if y.shape[0] * n_dense * y.shape[2] > MAX_DENSE_VALUES:
        return None
    if fitted is not None:
        data.pop("inverse", None)
        params = (data.get("system") or {}).get("params")
        if not isinstance(params, dict) or not set(fitted) <= set(params):
            return None  # a fitted initial state, say: not re-solved
        for name, values in fitted.items():
            values = np.asarray(values, dtype=float).reshape(-1)
            params[name] = float(values[0]) if values.size == 1 else [float(v) for v in values]
    data["time"] = {**time, "eval": n_dense}  # no eval: the start and end times only, n_stored = 2
    spec = parse_ode_spec(data, text, file)
    solution = solve_spec_arrays(spec)
    t_dense, y_dense = as_batched(np.asarray(solution.t, dtype=float), np.asarray(solution.y, dtype=float))
    if y_dense.shape != (y.shape[0], n_dense, y.shape[2]):
        return None
    if not np.allclose(t_dense[:, ::k], t, rtol=1e-12, atol=0.0, equal_nan=True):
        return None
    span = np.nanmax(np.abs(y), axis=(0, 1)) if np.isfinite(y).any() else np.ones(y.shape[2])
    tolerance = MATCH * span + 10.0 * float(spec.solver.atol)
    stored_at = y_dense[:, ::k, :]
    both = np.isfinite(stored_at) & np.isfinite(y)
    if not (np.isfinite(stored_at) == np.isfinite(y)).all():
        return None
    if (np.abs(stored_at - y) > tolerance)[both].any():
        return None
    return t_dense, y_dense, k
