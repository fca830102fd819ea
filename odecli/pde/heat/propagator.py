"""2-D heat equation ``u_t = div(kappa grad u) + f`` on a rank's block: explicit Euler, or
backward Euler (``scheme="implicit"``).

Conservative 5-point operator with face conductivities ``(kappa_i + kappa_j)/2``; halo width 1.
Boundaries per side: ``dirichlet`` (value held just outside the grid) or ``neumann`` (zero flux).
Sensors record ``u`` every step; sources add ``dt * amp * w(t)``.  Shots are the batch dimension.

Backward Euler solves ``(I + dt A) u_{n+1} = u_n + dt f_n`` each step (``A = -div(kappa grad .)``
with the Dirichlet values lifted to the right-hand side) with the multigrid-preconditioned CG of
:mod:`odecli.pde.linear`, one operator and hierarchy for every step; it is stable for any ``dt``
and first-order accurate in ``dt``, as explicit Euler is (the two differ by ``O(dt)``).  Its
backward runs one adjoint solve per step (no solver iteration is differentiated).
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint

from odecli.pde.grid import Block, Grid
from odecli.pde.heat.equation import stability_limit
from odecli.pde.linear.diffusion import DiffusionBoundary
from odecli.pde.linear.settings import SolverSettings
from odecli.pde.linear.solve import DiffusionSystem, solve
from odecli.pde.segments import segment_bounds
from odecli.pde.sources import LocalGeometry
from odecli.pde.stencils import divergence_flux
from odecli.pde.timing import CommTimer, timed_halo

HALO = 1


class HeatPropagator:
    """The heat equation's :class:`~odecli.pde.propagator.Propagator`: autograd differentiates
    the steps, each time segment recomputed in the backward (``torch.utils.checkpoint``)."""

    halo = HALO
    fused = False  # PyTorch only: no compiled kernels

    def __init__(self, grid: Grid, block: Block, decomp, comm, dt: float, nt: int,
                 geom: LocalGeometry, boundary: dict, initial_value: float, segments: int,
                 timer: CommTimer | None = None, dtype=torch.float64, device=None,
                 scheme: str = "explicit", solver: dict | None = None) -> None:
        if scheme not in ("explicit", "implicit"):
            raise ValueError(f"heat2d: unknown time scheme {scheme!r} (explicit or implicit)")
        self.scheme = scheme
        self.settings = SolverSettings.of(solver)
        self.last_iterations: list[int] = []  # CG iterations of each implicit step's solve
        self.grid, self.block, self.decomp, self.comm = grid, block, decomp, comm
        self.dt, self.nt, self.geom = dt, nt, geom
        self.segments = segment_bounds(nt, segments)
        self.timer = timer
        self.initial_value = float(initial_value)
        self.device = device
        # the boundary rules (faces, Dirichlet ghosts) the implicit and steady solves share
        self.rules = DiffusionBoundary(grid, block, boundary, decomp, comm, timer, dtype, device)
        self.ghost = self.rules.ghost  # held values, added after the zero-filled halo exchange

    def stability_limit(self) -> float:
        """Largest stable conductivity for this dt and grid (infinite for backward Euler)."""
        return stability_limit(self.dt, self.grid.dy, self.grid.dx, self.scheme)

    def engine(self) -> str:
        """What runs the time loop, for result files and ``odecli stats``."""
        if self.scheme == "implicit":
            s = self.settings
            return (f"PyTorch backward Euler on {self.device}, multigrid-preconditioned CG "
                    f"(rtol {s.rtol:g}), {len(self.segments)} time segment(s)")
        return f"PyTorch reference on {self.device}, {len(self.segments)} time segment(s)"

    def face_conductivities(self, k: torch.Tensor):
        """Face conductivities ``(west, east, north, south)`` (collective: exchanges ``k``'s halo)."""
        return self.rules.faces(k)

    def _run(self, t0, t1, u, kxm, kxp, kym, kyp):
        g = self.geom
        recs = []
        for it in range(t0, t1):
            up = timed_halo(u, self.decomp, self.comm, HALO, 0.0, self.timer) + self.ghost
            div = divergence_flux(up, kxm, kxp, kym, kyp, self.grid.dy, self.grid.dx)
            u = u + div * self.dt
            u = g.inject(u, self.dt, it)
            recs.append(g.record(u))
        traces = torch.stack(recs, dim=-1) if recs else u.new_zeros((u.shape[0], g.nrec_local, 0))
        return u, traces

    def _run_implicit(self, system: DiffusionSystem, t0, t1, u, k, kxm, kxp, kym, kyp):
        """Backward Euler steps ``[t0, t1)``: one solve with ``system`` each."""
        g = self.geom
        lift = self.rules.lift((kxm, kxp, kym, kyp)) * self.dt
        recs = []
        for it in range(t0, t1):
            rhs = g.inject(u + lift, self.dt, it)
            u = solve(k, rhs, system, self.face_conductivities, x0=u.detach())
            recs.append(g.record(u))
        traces = torch.stack(recs, dim=-1) if recs else u.new_zeros((u.shape[0], g.nrec_local, 0))
        return u, traces

    def forward(self, k: torch.Tensor, return_field: bool = False):
        g = self.geom
        faces = self.face_conductivities(k)
        u = k.new_full((g.nshots,) + tuple(k.shape), self.initial_value).detach()
        use_ckpt = torch.is_grad_enabled() and k.requires_grad and len(self.segments) > 1
        run, args = self._run, faces
        if self.scheme == "implicit":
            system = DiffusionSystem(faces, self.grid.dy, self.grid.dx, self.decomp, self.comm,
                                     self.settings, scale=self.dt, shift=1.0)
            self.last_iterations = system.iterations
            # bound here, not kept on self: a segment recomputed in a later backward must use
            # this forward's operator even if other forwards ran in between
            run, args = functools.partial(self._run_implicit, system), (k,) + tuple(faces)
        out = []
        for t0, t1 in self.segments:
            if use_ckpt:
                u, tr = checkpoint(run, t0, t1, u, *args, use_reentrant=False,
                                   preserve_rng_state=False)
            else:
                u, tr = run(t0, t1, u, *args)
            out.append(tr)
        traces = torch.cat(out, dim=-1)
        return (traces, u) if return_field else traces


__all__ = ["HeatPropagator"]
