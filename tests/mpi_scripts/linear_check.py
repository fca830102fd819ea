"""One diffusion solve and its adjoint-state gradient, and the poisson2d and implicit heat2d
propagators' outputs and gradients, on this rank layout.

Usage: linear_check.py OUT.npz PYxPX   (rank 0 writes OUT.npz: the gathered solution ``u``, the
gradient ``grad`` of ``sum(w * u)`` with respect to the conductivity, and per propagator
``NAME/out`` (all sensors) and ``NAME/grad``).
Imported by tests/test_linear_solver.py for the single-rank reference (``compute``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from odecli.parallel.comm import get_comm
from odecli.parallel.decomposition import decompose
from odecli.parallel.ops import gather_global
from odecli.pde.grid import Block, Grid
from odecli.pde.linear.diffusion import DiffusionBoundary
from odecli.pde.linear.settings import SolverSettings
from odecli.pde.linear.solve import DiffusionSystem, solve
from odecli.pde.propagator import EQUATIONS, Setup
from odecli.pde.sources import Geometry
from odecli.pde.timing import CommTimer

SHAPE = (37, 29)
RTOL = 1e-12
BOUNDARY = {"top": {"type": "dirichlet", "value": 1.0}, "bottom": {"type": "neumann"},
            "left": {"type": "dirichlet", "value": -0.5}, "right": {"type": "neumann"}}


def fields() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Global conductivity, right-hand sides (2 of them) and loss weights, from a fixed seed."""
    rng = np.random.default_rng(7)
    kappa = np.exp(0.5 * rng.normal(size=SHAPE))
    f = rng.normal(size=(2,) + SHAPE)
    w = rng.normal(size=(2,) + SHAPE)
    return kappa, f, w


def compute(proc_grid=None) -> dict:
    comm = get_comm()
    grid = Grid(*SHAPE, 0.1, 0.12)
    d = decompose(grid.shape, comm.size, comm.rank, proc_grid)
    block = Block.of(d)
    kappa, f, w = (torch.as_tensor(a[..., d.y0:d.y1, d.x0:d.x1].copy()) for a in fields())
    bnd = DiffusionBoundary(grid, block, BOUNDARY, d, comm, None, torch.float64)
    kappa.requires_grad_(True)
    faces = bnd.faces(kappa)
    system = DiffusionSystem(faces, grid.dy, grid.dx, d, comm, SolverSettings(RTOL, 200))
    u = solve(kappa, f + bnd.lift(faces), system, bnd.faces)
    (u * w).sum().backward()
    out = {"u": u.detach(), "grad": kappa.grad}
    if comm.size > 1:
        out = {k: gather_global(v, d, comm, root=0) for k, v in out.items()}
    out["iterations"] = torch.tensor(system.iterations)
    for name in ("poisson2d", "heat2d"):
        values, grad = propagate(name, grid, d, comm, kappa.detach())
        out[f"{name}/out"] = values
        out[f"{name}/grad"] = gather_global(grad, d, comm, root=0) if comm.size > 1 else grad
    return {k: v.numpy() for k, v in out.items()} if comm.rank == 0 else {}


def propagate(name: str, grid: Grid, d, comm, kappa: torch.Tensor):
    """All sensors' values of the equation's forward (summed over ranks) and the gradient of
    ``sum(sensor values * weights)`` on this block."""
    block = Block.of(d)
    nt = 3
    geometry = Geometry([[(3, 4, 2.0), (30, 25, -1.0)], [(18, 14, 1.5)]],
                        [(18, 13), (0, 0), (36, 28), (20, 15), (5, 26)], np.ones(nt))
    local = geometry.local(block, None, torch.float64)
    setup = Setup(grid=grid, block=block, decomp=d, comm=comm, dt=0.05, nt=nt, geometry=geometry,
                  local=local, boundary=BOUNDARY, initial_condition=0.3, time_segments=1,
                  threads=1, exchange_every=1, timer=CommTimer(), dtype=torch.float64,
                  device=torch.device("cpu"), solver={"rtol": RTOL, "max_iterations": 200},
                  time_scheme="implicit")
    prop = EQUATIONS[name].build(setup)
    k = kappa.clone().requires_grad_(True)
    values = prop.forward(k)
    shape = (values.shape[0], geometry.nrec) + tuple(values.shape[2:])
    weights = torch.linspace(-1.0, 1.0, int(np.prod(shape)), dtype=torch.float64).reshape(shape)
    (values * weights[:, local.rec_ids]).sum().backward()
    full = values.new_zeros(weights.shape)
    full[:, local.rec_ids] = values.detach()
    if comm.size > 1:
        full = torch.as_tensor(comm.allreduce_array(full.numpy()))
    return full, k.grad


if __name__ == "__main__":
    torch.set_num_threads(1)
    res = compute(tuple(int(x) for x in sys.argv[2].split("x")))
    if get_comm().rank == 0:
        np.savez(Path(sys.argv[1]), **res)
