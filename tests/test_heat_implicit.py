"""heat2d with backward Euler (``time_scheme="implicit"``): first-order convergence in dt to the
exact solution of the semi-discrete system (scipy's matrix exponential of an independently
assembled operator), agreement with explicit Euler to O(dt), stability and accuracy at 50x the
explicit limit, and its adjoint gradient against finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse.linalg as spl
import torch

from odecli.parallel.comm import Comm
from odecli.parallel.decomposition import decompose
from odecli.pde.grid import Block, Grid
from odecli.pde.heat import equation
from odecli.pde.propagator import Setup
from odecli.pde.sources import Geometry
from odecli.pde.timing import CommTimer
from test_linear_solver import MIXED, assemble

GRID = Grid(15, 12, 0.1, 0.12)
SHOTS = [[(7, 5, 3.0)], [(2, 9, -2.0)]]
SENSORS = [(7, 6), (12, 2)]
U0 = 0.2


def conductivity() -> np.ndarray:
    return np.exp(0.3 * np.random.default_rng(4).normal(size=GRID.shape))


def explicit_limit() -> float:
    return equation.stability_limit(1.0, GRID.dy, GRID.dx) / conductivity().max()  # dt at kappa max


def propagate(scheme: str, dt: float, nt: int, k: torch.Tensor, return_field=True):
    d = decompose(GRID.shape, 1, 0)
    block = Block.of(d)
    geometry = Geometry(SHOTS, SENSORS, np.ones(nt))
    setup = Setup(grid=GRID, block=block, decomp=d, comm=Comm(), dt=dt, nt=nt, geometry=geometry,
                  local=geometry.local(block, None, torch.float64), boundary=MIXED,
                  initial_condition=U0, time_segments=2, threads=1, exchange_every=1,
                  timer=CommTimer(), dtype=torch.float64, device=torch.device("cpu"),
                  solver={"rtol": 1e-13, "max_iterations": 200}, time_scheme=scheme)
    return equation.build(setup).forward(k, return_field=return_field)


def exact_final_fields(t_end: float) -> np.ndarray:
    """``u(t_end)`` of ``u' = -A u + lift + f`` per shot: ``u* + exp(-A t)(u0 - u*)``."""
    a, lift = assemble(GRID, conductivity(), MIXED)
    out = []
    for shot in SHOTS:
        f = np.zeros(GRID.shape)
        for iy, ix, amp in shot:
            f[iy, ix] += amp
        steady = spl.spsolve(a.tocsc(), lift + f.ravel())
        out.append((steady + spl.expm_multiply(-a * t_end, U0 - steady)).reshape(GRID.shape))
    return np.stack(out)


def final_error(scheme: str, dt: float, t_end: float, exact: np.ndarray) -> float:
    _, u = propagate(scheme, dt, round(t_end / dt), torch.as_tensor(conductivity()))
    return float(np.abs(u.detach().numpy() - exact).max() / np.abs(exact).max())


def test_implicit_step_is_unconditionally_stable():
    assert equation.stability_limit(1e3, 0.1, 0.1, scheme="implicit") == math.inf
    assert equation.stability_limit(1e3, 0.1, 0.1) < 1e-5


def test_backward_euler_converges_at_first_order_and_agrees_with_explicit_to_order_dt():
    dt = explicit_limit()
    t_end = 24 * dt
    exact = exact_final_fields(t_end)
    errors = [final_error("implicit", dt / m, t_end, exact) for m in (1, 2, 4)]
    for coarse, fine in zip(errors[:-1], errors[1:]):
        assert 1.8 <= coarse / fine <= 2.2, errors  # first order: the error halves with dt
    gaps = []
    for m in (1, 2):
        k = torch.as_tensor(conductivity())
        _, ui = propagate("implicit", dt / m, 24 * m, k)
        _, ue = propagate("explicit", dt / m, 24 * m, k)
        gaps.append(float((ui - ue).abs().max()))
    assert 1.8 <= gaps[0] / gaps[1] <= 2.2, gaps  # the schemes differ by O(dt)


def test_fifty_times_the_explicit_limit_stays_bounded_and_close_to_the_exact_solution():
    dt = 50 * explicit_limit()
    t_end = 8 * dt
    exact = exact_final_fields(t_end)
    k = torch.as_tensor(conductivity())
    traces, u = propagate("implicit", dt, 8, k)
    bound = max(abs(U0), 1.0, 0.5) + t_end * 3.0 / 1.0  # boundary values, start, sources * time
    assert torch.isfinite(traces).all() and float(traces.abs().max()) <= bound
    assert float(np.abs(u.detach().numpy() - exact).max() / np.abs(exact).max()) <= 0.02
    _, ue = propagate("explicit", dt, 8, k)  # the explicit step at this dt blows up
    assert float(ue.abs().max()) > 1e3 * bound


def test_implicit_gradient_equals_finite_differences():
    dt, nt = 20 * explicit_limit(), 6
    k0 = torch.as_tensor(conductivity())
    target = torch.as_tensor(np.random.default_rng(9).normal(size=(2, 2, nt)))

    def loss(k):
        return 0.5 * ((propagate("implicit", dt, nt, k, return_field=False) - target) ** 2).sum()

    k = k0.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(loss(k), k)
    v = torch.as_tensor(np.random.default_rng(1).normal(size=GRID.shape))
    h = 1e-5
    with torch.no_grad():
        fd = (loss(k0 + h * v) - loss(k0 - h * v)) / (2 * h)
    exact = float((g * v).sum())
    assert abs(float(fd) - exact) <= 1e-6 * abs(exact), (float(fd), exact)


def test_unknown_scheme_and_bad_tolerance_are_refused_naming_the_key():
    from odecli.pde.propagator import SetupError

    d = decompose(GRID.shape, 1, 0)
    block = Block.of(d)
    geometry = Geometry(SHOTS, SENSORS, np.ones(2))
    base = dict(grid=GRID, block=block, decomp=d, comm=Comm(), dt=0.1, nt=2, geometry=geometry,
                local=geometry.local(block, None, torch.float64), boundary=MIXED,
                initial_condition=U0, time_segments=1, threads=1, exchange_every=1,
                timer=CommTimer(), dtype=torch.float64, device=torch.device("cpu"))
    with pytest.raises(SetupError) as err:
        equation.build(Setup(**base, time_scheme="crank"))
    assert err.value.field == "time.scheme"
    with pytest.raises(SetupError) as err:
        equation.build(Setup(**base, time_scheme="implicit", solver={"rtol": 0}))
    assert err.value.field == "solver.rtol"
    equation.build(Setup(**base, solver={"rtol": 0}))  # explicit steps solve nothing


def test_a_recomputed_segment_uses_its_own_forwards_operator():
    """The backward recomputes time segments; a forward with another conductivity in between
    (a line search's trial) must not change the first forward's gradient."""
    dt, nt = 20 * explicit_limit(), 6
    d = decompose(GRID.shape, 1, 0)
    block = Block.of(d)
    geometry = Geometry(SHOTS, SENSORS, np.ones(nt))
    prop = equation.build(Setup(
        grid=GRID, block=block, decomp=d, comm=Comm(), dt=dt, nt=nt, geometry=geometry,
        local=geometry.local(block, None, torch.float64), boundary=MIXED, initial_condition=U0,
        time_segments=3, threads=1, exchange_every=1, timer=CommTimer(), dtype=torch.float64,
        device=torch.device("cpu"), solver={"rtol": 1e-13}, time_scheme="implicit"))
    assert len(prop.segments) == 3
    k = torch.as_tensor(conductivity()).requires_grad_(True)
    (alone,) = torch.autograd.grad((prop.forward(k) ** 2).sum(), k)
    loss = (prop.forward(k) ** 2).sum()
    with torch.no_grad():
        prop.forward(2.0 * k)
    (between,) = torch.autograd.grad(loss, k)
    assert torch.allclose(alone, between, rtol=1e-9, atol=0)
