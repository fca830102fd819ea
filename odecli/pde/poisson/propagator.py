"""Steady ``-div(kappa grad u) = f`` on a rank's block: one linear solve per experiment.

The operator is heat2d's conservative 5-point one (:mod:`odecli.pde.linear.diffusion`), with its
Dirichlet and Neumann sides.  Each shot of the Setup's geometry is one experiment (one
right-hand side): its point sources put ``f = amplitude`` at their nodes (a rate per cell, as
heat2d's sources; the wavelet is not used, a steady problem has no time).  Sensors (the
geometry's receivers) observe ``u``.  All experiments share one operator and its multigrid
hierarchy, and are solved together by batched CG.
"""

from __future__ import annotations

import torch

from odecli.pde.linear.diffusion import DiffusionBoundary
from odecli.pde.linear.settings import SolverSettings
from odecli.pde.linear.solve import DiffusionSystem, solve
from odecli.pde.propagator import Setup

HALO = 1


class PoissonPropagator:
    """The steady equation's :class:`~odecli.pde.propagator.Propagator`: ``forward(kappa)``
    returns ``(experiments, local sensors)``; its backward is one adjoint solve.
    ``last_iterations`` holds the CG iterations of the last forward solve and, once its
    backward has run, of the adjoint solve."""

    halo = HALO
    fused = False
    segments: list[tuple[int, int]] = []  # no time loop to segment

    def __init__(self, setup: Setup) -> None:
        self.grid, self.block, self.decomp, self.comm = setup.grid, setup.block, setup.decomp, setup.comm
        self.geom = setup.local
        self.device, self.dtype = setup.device, setup.dtype
        self.settings = SolverSettings.of(getattr(setup, "solver", None))
        self.boundary = DiffusionBoundary(setup.grid, setup.block, setup.boundary, setup.decomp,
                                          setup.comm, setup.timer, setup.dtype, setup.device)
        self.last_iterations: list[int] = []

    def stability_limit(self) -> float:
        """A steady solve has no time step to limit."""
        return float("inf")

    def engine(self) -> str:
        """What solves, for result files and ``odecli stats``."""
        s = self.settings
        return (f"multigrid-preconditioned CG (PyTorch) on {self.device}, rtol {s.rtol:g}, "
                f"at most {s.max_iterations} iterations")

    def sources(self, like: torch.Tensor) -> torch.Tensor:
        """The right-hand sides ``(experiments, ny, nx)``: each shot's amplitudes at its nodes."""
        g = self.geom
        f = like.new_zeros((g.nshots,) + tuple(like.shape))
        return g.add_at_sources(f, g.src_amp.to(like.dtype))

    def forward(self, kappa: torch.Tensor, return_field: bool = False):
        """Sensor values ``(experiments, local sensors)`` (and the fields ``(experiments, ny,
        nx)`` with ``return_field``); differentiable in ``kappa``.  Collective."""
        faces = self.boundary.faces(kappa)
        system = DiffusionSystem(faces, self.grid.dy, self.grid.dx, self.decomp, self.comm,
                                 self.settings)
        self.last_iterations = system.iterations
        b = self.sources(kappa.detach()) + self.boundary.lift(faces)
        u = solve(kappa, b, system, self.boundary.faces)
        values = self.geom.record(u)
        return (values, u) if return_field else values


__all__ = ["PoissonPropagator"]
