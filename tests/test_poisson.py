"""poisson2d, the steady equation: its propagator against scipy's sparse direct solve with point
sources and sensors, its gradient against finite differences, iteration reporting, and the
inputs it refuses (an all-Neumann boundary, a solve that does not converge)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse.linalg as spl
import torch

from odecli.parallel.comm import Comm
from odecli.parallel.decomposition import decompose
from odecli.pde.grid import Block, Grid
from odecli.pde.linear import NotConverged
from odecli.pde.poisson import equation
from odecli.pde.propagator import EQUATIONS, Setup, SetupError
from odecli.pde.sources import Geometry
from odecli.pde.timing import CommTimer
from test_linear_solver import MIXED, assemble

GRID = Grid(21, 26, 0.5, 0.4)
SHOTS = [[(5, 6, 2.0)], [(15, 20, -1.0), (3, 18, 0.5)]]
SENSORS = [(10, 10), (2, 3), (19, 24), (15, 20)]


def make_setup(boundary=MIXED, solver=None, dtype=torch.float64) -> Setup:
    d = decompose(GRID.shape, 1, 0)
    block = Block.of(d)
    geometry = Geometry(SHOTS, SENSORS, np.ones(1))
    return Setup(grid=GRID, block=block, decomp=d, comm=Comm(), dt=1.0, nt=1, geometry=geometry,
                 local=geometry.local(block, None, dtype), boundary=boundary,
                 initial_condition=None, time_segments=1, threads=1, exchange_every=1,
                 timer=CommTimer(), dtype=dtype, device=torch.device("cpu"),
                 solver=solver or {"rtol": 1e-12, "max_iterations": 200})


def conductivity() -> torch.Tensor:
    rng = np.random.default_rng(5)
    return torch.as_tensor(np.exp(0.4 * rng.normal(size=GRID.shape)))


def test_registry_entry_is_steady_and_torch_free():
    assert EQUATIONS["poisson2d"] is equation
    assert equation.PARAMETERS == ("kappa",) and equation.STEADY is True
    assert equation.stability_limit(1.0, 1.0, 1.0) == math.inf
    assert equation.violates_sign(0.0) and not equation.violates_sign(1e-9)
    code = "import sys, odecli.pde.poisson.equation; sys.exit(3 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_sensor_values_match_scipy_sparse_direct_solve():
    prop = equation.build(make_setup())
    k = conductivity()
    values, field = prop.forward(k, return_field=True)
    assert values.shape == (len(SHOTS), len(SENSORS))
    a, lift = assemble(GRID, k.numpy(), MIXED)
    for e, shot in enumerate(SHOTS):
        f = np.zeros(GRID.shape)
        for iy, ix, amp in shot:
            f[iy, ix] += amp
        ref = spl.spsolve(a.tocsc(), f.ravel() + lift).reshape(GRID.shape)
        assert np.abs(field[e].detach().numpy() - ref).max() <= 1e-9 * np.abs(ref).max()
        want = np.array([ref[iy, ix] for iy, ix in SENSORS])
        assert np.allclose(values[e].detach().numpy(), want, rtol=0, atol=1e-9 * np.abs(ref).max())
    assert len(prop.last_iterations) == 1 and prop.last_iterations[0] > 0


def test_gradient_equals_finite_differences_and_adjoint_iterations_are_recorded():
    prop = equation.build(make_setup())
    k0 = conductivity()
    w = torch.as_tensor(np.random.default_rng(2).normal(size=(len(SHOTS), len(SENSORS))))

    def loss(k):
        return 0.5 * ((prop.forward(k) - w) ** 2).sum()

    k = k0.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(loss(k), k)
    assert len(prop.last_iterations) == 2  # the forward solve and the adjoint solve
    v = torch.as_tensor(np.random.default_rng(3).normal(size=GRID.shape))
    h = 1e-5
    with torch.no_grad():
        fd = (loss(k0 + h * v) - loss(k0 - h * v)) / (2 * h)
    exact = float((g * v).sum())
    assert abs(float(fd) - exact) <= 1e-6 * abs(exact)


def test_all_neumann_boundary_is_refused_naming_boundary():
    neumann = {s: {"type": "neumann"} for s in ("top", "bottom", "left", "right")}
    assert equation.check_boundary(neumann) is not None
    assert equation.check_boundary(MIXED) is None
    with pytest.raises(SetupError) as err:
        equation.build(make_setup(neumann))
    assert err.value.field == "boundary" and "dirichlet" in str(err.value)


def test_a_solve_that_does_not_converge_raises_not_converged():
    prop = equation.build(make_setup(solver={"rtol": 1e-14, "max_iterations": 1}))
    with pytest.raises(NotConverged) as err:
        prop.forward(conductivity())
    assert err.value.iterations == 1


@pytest.mark.parametrize("solver,field", [({"rtol": 0.0}, "solver.rtol"), ({"rtol": -1e-8}, "solver.rtol"),
                                          ({"rtol": float("nan")}, "solver.rtol"),
                                          ({"max_iterations": 0}, "solver.max_iterations")])
def test_unusable_solver_settings_are_refused_naming_the_key(solver, field):
    with pytest.raises(SetupError) as err:
        equation.build(make_setup(solver=solver))
    assert err.value.field == field


def test_a_float32_conductivity_is_solved_in_float64_and_answered_in_float32():
    want = equation.build(make_setup(solver={"rtol": 1e-10})).forward(conductivity())
    prop = equation.build(make_setup(solver={"rtol": 1e-10}, dtype=torch.float32))
    got = prop.forward(conductivity().to(torch.float32).requires_grad_(True))
    got.sum().backward()  # the adjoint solve, in float64 too
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-6, atol=1e-6 * float(want.abs().max()))
