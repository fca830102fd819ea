"""Step-size controllers: accuracy, efficiency, custom coefficients, dt_max, initial step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.integrate._ivp.common import select_initial_step as scipy_select_initial_step

from odecli.ode.controllers import PIDController, make_controller
from odecli.ode.methods import METHODS
from odecli.ode.solver import solve
from ode_problems import scipy_reference, vdp_np, vdp_rhs

F64 = torch.float64


def _vdp_batch(mu):
    mu = torch.as_tensor(mu, dtype=F64)
    return torch.tensor([[2.0, 0.0]] * len(mu), dtype=F64), {"mu": mu}


@pytest.mark.parametrize("controller", ["integral", "pi", "pid"])
def test_every_controller_reaches_the_tolerance_on_vdp(controller):
    mu = [1.0, 5.0]
    y0, params = _vdp_batch(mu)
    t_end, tol = 8.0, 1e-7
    grid = torch.linspace(0.0, t_end, 33, dtype=F64)
    ref = torch.from_numpy(np.stack([scipy_reference(vdp_np(m), [2.0, 0.0], 0.0, t_end, grid.numpy()) for m in mu]))
    for method in ("dopri5", "tsit5"):
        sol = solve(vdp_rhs, y0, 0.0, t_end, grid, params=params, method=method, rtol=tol, atol=tol, controller=controller)
        assert sol.status.eq(0).all()
        err = ((sol.y - ref).abs() / (tol * (1 + ref.abs()))).max().item()
        assert err < 100, (method, err)


def test_pi_is_not_costlier_than_integral_on_mildly_stiff_vdp():
    """Over a full Van der Pol cycle at mu = 25 (steps limited by stability on the slow branch),
    PI takes at most ~1.2x the steps of the integral controller (measured 0.86-0.93x) and far
    fewer rejections (measured ~20 vs ~90-150), which is what PI control is for."""
    y0, params = _vdp_batch([25.0])
    for method in ("dopri5", "tsit5"):
        stats = {c: solve(vdp_rhs, y0, 0.0, 50.0, params=params, method=method, rtol=1e-4, atol=1e-4,
                          controller=c).stats for c in ("integral", "pi")}
        n_i, n_pi = int(stats["integral"]["n_steps"]), int(stats["pi"]["n_steps"])
        assert n_pi <= 1.2 * n_i, (method, n_pi, n_i)
        assert int(stats["pi"]["n_rejected"]) < 0.5 * int(stats["integral"]["n_rejected"]), (method, stats)


def _step_log(controller, method="dopri5", **kwargs):
    """Solve one VdP sample, recording the time of every RHS call (the step sequence)."""
    times = []

    def rhs(t, y, p):
        times.append(float(t[0]))
        return vdp_rhs(t, y, p)

    y0, params = _vdp_batch([3.0])
    # chunk=1: a chunk's masked attempts after the sample ends would log calls that are no steps.
    sol = solve(rhs, y0, 0.0, 6.0, params=params, method=method, controller=controller, chunk=1, **kwargs)
    assert sol.status.eq(0).all()
    return sol, times


def test_named_controllers_are_their_coefficients():
    assert make_controller("integral") == PIDController(pcoeff=0.0, icoeff=1.0, dcoeff=0.0)
    assert make_controller("pi") == PIDController(pcoeff=0.4, icoeff=0.3, dcoeff=0.0)
    assert make_controller("pid", dcoeff=0.05).dcoeff == 0.05
    # Passing the named coefficients explicitly gives the identical step sequence.
    _, by_name = _step_log("pi", rtol=1e-6, atol=1e-6)
    _, explicit = _step_log(PIDController(pcoeff=0.4, icoeff=0.3, dcoeff=0.0), rtol=1e-6, atol=1e-6)
    assert by_name == explicit


@pytest.mark.parametrize("coeffs", [(0.1, 0.6, 0.0), (0.3, 0.5, 0.1), (0.0, 0.5, 0.0)])
def test_custom_coefficients_change_the_step_sequence(coeffs):
    p, i, d = coeffs
    base_sol, base = _step_log("integral", rtol=1e-6, atol=1e-6)
    sol, custom = _step_log(PIDController(pcoeff=p, icoeff=i, dcoeff=d), rtol=1e-6, atol=1e-6)
    assert custom != base
    # ... while still solving the problem to tolerance (the end states agree at the tolerance level).
    torch.testing.assert_close(sol.y_final, base_sol.y_final, rtol=0.0, atol=1e-3)


@pytest.mark.parametrize("method", ["bosh3", "dopri5", "dop853"])
def test_dt_max_caps_every_step(method):
    dt_max = 0.05
    ctrl = PIDController(dt_max=dt_max)
    n_stages = METHODS[method].n_stages
    sol, times = _step_log(ctrl, method=method, rtol=1e-3, atol=1e-3, dt0=0.2)  # dt0 above the cap too
    n_steps = int(sol.stats["n_steps"])
    # Calls: f(t0), then per step the stages 2..s and f(t + h); the last of each group is t + h.
    # dop853 builds its dense output (3 more calls) for the last step, which holds t_end.
    # t_end is the only eval time inside a step; it needs no dense output (DOP853's extension
    # would cost 3 more calls), so every call is a stage.
    assert len(times) == 1 + n_stages * n_steps == int(sol.stats["n_f_evals"])
    step_ends = np.array(times[1:]).reshape(n_steps, n_stages)[:, -1]
    step_starts = np.concatenate([[0.0], step_ends[:-1]])
    assert (step_ends - step_starts).max() <= dt_max * (1 + 1e-12)
    assert float(sol.stats["dt_final"]) <= dt_max
    assert float(sol.stats["dt0"]) <= dt_max
    assert n_steps >= 6.0 / dt_max
    # Without the cap these loose tolerances take far bigger steps.
    free, _ = _step_log("integral", method=method, rtol=1e-3, atol=1e-3)
    assert int(free.stats["n_steps"]) < n_steps / 2


def test_dt_max_caps_reversed_direction():
    y0, params = _vdp_batch([1.0])
    sol = solve(vdp_rhs, y0, 2.0, -1.0, params=params, rtol=1e-3, atol=1e-3, controller=PIDController(dt_max=0.1))
    assert sol.status.eq(0).all()
    assert int(sol.stats["n_steps"]) >= 30
    assert float(sol.t_final) == -1.0


@pytest.mark.parametrize("method", ["bosh3", "dopri5", "tsit5", "dop853"])
def test_initial_step_matches_scipy_rule(method):
    """The automatic dt0 is within a factor 10 of scipy's select_initial_step, per sample.

    (Both implement Hairer–Nørsett–Wanner's rule; they should agree closely, 10x is the brief.)
    """
    mu = [0.1, 1.0, 5.0, 25.0, 2.0]
    y0 = torch.tensor([[2.0, 0.0], [0.5, 1.0], [1.0, -3.0], [2.0, 0.0], [1e-3, 1e-3]], dtype=F64)
    params = {"mu": torch.tensor(mu, dtype=F64)}
    t_end = torch.tensor([100.0, 100.0, -100.0, 100.0, 100.0], dtype=F64)  # long spans: no clipping
    rtol, atol = 1e-6, 1e-9
    sol = solve(vdp_rhs, y0, 0.0, t_end, params=params, method=method, rtol=rtol, atol=atol, max_steps=1)
    order = METHODS[method].error_order
    for i, m in enumerate(mu):
        fun = vdp_np(m)
        y = y0[i].numpy()
        direction = 1.0 if float(t_end[i]) > 0 else -1.0
        expected = scipy_select_initial_step(fun, 0.0, y, float(t_end[i]), np.inf, fun(0.0, y), direction, order, rtol, atol)
        got = float(sol.stats["dt0"][i])
        assert expected / 10 <= got <= expected * 10, (i, got, expected)
