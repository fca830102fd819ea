"""One SolverOptions for every entry point: the object and the keywords give the same solve."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from odecli import SolverOptions
from odecli.ode.adjoint import odeint
from odecli.ode.controllers import make_controller
from odecli.ode.native import NativeRhs, NativeUnavailable, solve_native_arrays
from odecli.ode.solver import solve

SETTINGS = dict(method="tsit5", rtol=1e-7, atol=1e-9, controller=make_controller("pi", safety=0.85), max_steps=5000)


def vdp(t, y, p):
    return torch.stack([y[:, 1], p["mu"] * (1 - y[:, 0] ** 2) * y[:, 1] - y[:, 0]], dim=-1)


def _problem():
    y0 = torch.tensor([[2.0, 0.0], [1.0, 0.5], [0.5, -1.0]], dtype=torch.float64)
    return y0, torch.linspace(0, 3, 7, dtype=torch.float64), {"mu": torch.tensor([0.5, 2.0, 4.0], dtype=torch.float64)}


def _same(a, b) -> None:
    assert torch.equal(a.y, b.y) and torch.equal(a.status, b.status)
    assert all(torch.equal(a.stats[k], b.stats[k]) for k in a.stats)


def test_solve_and_odeint_take_options_or_keywords_alike():
    y0, grid, params = _problem()
    by_keywords = solve(vdp, y0, 0.0, 3.0, grid, params=params, **SETTINGS)
    _same(by_keywords, solve(vdp, y0, 0.0, 3.0, grid, params=params, options=SolverOptions(**SETTINGS)))
    # keywords override the object's fields
    _same(by_keywords, solve(vdp, y0, 0.0, 3.0, grid, params=params,
                             options=SolverOptions(**{**SETTINGS, "rtol": 1e-3}), rtol=1e-7))
    _same(by_keywords, odeint(vdp, y0, 0.0, 3.0, grid, params=params, options=SolverOptions(**SETTINGS)))


def test_the_c_solver_takes_the_same_options():
    rhs = NativeRhs(("y[1]", "p[0] * (1 - odecli_sq(y[0])) * y[1] - y[0]"), ("mu",))
    y0, grid, params = _problem()
    arrays = dict(params={"mu": params["mu"].numpy()})
    try:
        a = solve_native_arrays(rhs, y0.numpy(), 0.0, 3.0, grid.numpy(), **arrays, **SETTINGS)
    except NativeUnavailable as exc:
        pytest.skip(str(exc))
    b = solve_native_arrays(rhs, y0.numpy(), 0.0, 3.0, grid.numpy(), **arrays, options=SolverOptions(**SETTINGS))
    assert np.array_equal(a.y, b.y, equal_nan=True) and np.array_equal(a.stats["n_steps"], b.stats["n_steps"])


def test_an_unknown_setting_is_a_type_error_naming_it():
    y0, grid, params = _problem()
    with pytest.raises(TypeError, match="rtoll"):
        solve(vdp, y0, 0.0, 3.0, grid, params=params, rtoll=1e-6)
