"""A symmetric 5-point operator on one rank's block, stored as its couplings (matrix-free).

``A u = diag*u - west*u[x-1] - east*u[x+1] - north*u[y-1] - south*u[y+1]`` with zero ghosts
outside the global grid, so a Dirichlet side enters as a coupling to a zero ghost (its value
goes into the right-hand side) and a Neumann side as a zero coupling.  Every grid level of the
multigrid preconditioner is one of these, with its own :class:`Decomposition` of the level's
grid over the same ranks; ghosts come from the neighbours through a :class:`HaloPlan` made
once per field shape.

Why couplings and not face conductivities: the coarse levels are built by summing couplings
(:mod:`odecli.pde.linear.multigrid`), and the shifted operators of implicit time steps
(``I + dt A``) are the same arrays with a different diagonal.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

from odecli.parallel.decomposition import Decomposition, decompose
from odecli.parallel.halo import HaloPlan


def rank_splits(decomp: Decomposition) -> tuple[list[int], list[int]]:
    """The block heights of every process row and widths of every process column."""
    py, px = decomp.proc_grid
    rows, cols = [], []
    for i in range(py):
        b = decompose(decomp.global_shape, decomp.nranks, i * px, decomp.proc_grid)
        rows.append(b.y1 - b.y0)
    for j in range(px):
        b = decompose(decomp.global_shape, decomp.nranks, j, decomp.proc_grid)
        cols.append(b.x1 - b.x0)
    return rows, cols


def decomposition_of(decomp: Decomposition, rows: list[int], cols: list[int]) -> Decomposition:
    """The same ranks and neighbours as ``decomp`` over a grid whose process rows are ``rows``
    high and process columns ``cols`` wide (a coarse level, or a half-coarsened one)."""
    iy, ix = decomp.coords
    y0, x0 = sum(rows[:iy]), sum(cols[:ix])
    return replace(decomp, global_shape=(sum(rows), sum(cols)), y0=y0, y1=y0 + rows[iy],
                   x0=x0, x1=x0 + cols[ix])


@dataclass
class Exchanger:
    """Ghost-ring fills (width 1) of one level's fields, each plan made once per shape."""

    decomp: Decomposition
    comm: object
    plans: dict = field(default_factory=dict)

    @property
    def parallel(self) -> bool:
        return self.comm is not None and getattr(self.comm, "size", 1) > 1

    def padded(self, u: torch.Tensor) -> torch.Tensor:
        """``u`` with a ring of one ghost: the neighbours' edges, zero outside the grid."""
        up = F.pad(u, (1, 1, 1, 1))
        if self.parallel:
            self._plan(up, False)([up])
        return up

    def adjoint_(self, gp: torch.Tensor) -> None:
        """Adjoint of the fill, in place: ghost values added into their owners' edges."""
        if self.parallel:
            self._plan(gp, True)([gp])

    def _plan(self, up: torch.Tensor, adjoint: bool) -> HaloPlan:
        key = (tuple(up.shape), up.dtype, adjoint)
        plan = self.plans.get(key)
        if plan is None:
            plan = HaloPlan(key[0], up.dtype, self.decomp, self.comm, (1, 1, 1, 1), (1,), adjoint)
            self.plans[key] = plan
        return plan


@dataclass
class Stencil:
    """The couplings of a symmetric 5-point operator on a block (each ``(ny, nx)``): a cell's
    ``east`` equals its east neighbour's ``west`` (on whichever rank that lies)."""

    west: torch.Tensor
    east: torch.Tensor
    north: torch.Tensor
    south: torch.Tensor
    diag: torch.Tensor
    halo: Exchanger

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.diag.shape)

    def apply(self, u: torch.Tensor) -> torch.Tensor:
        """``A u`` for ``u`` of shape ``(..., ny, nx)`` (no autograd)."""
        up = self.halo.padded(u)
        ny, nx = self.shape
        out = self.diag * u
        # fused multiply-subtracts: no temporaries (the operator is most of a solve's time)
        out.addcmul_(self.west, up[..., 1 : 1 + ny, 0:nx], value=-1.0)
        out.addcmul_(self.east, up[..., 1 : 1 + ny, 2 : 2 + nx], value=-1.0)
        out.addcmul_(self.north, up[..., 0:ny, 1 : 1 + nx], value=-1.0)
        out.addcmul_(self.south, up[..., 2 : 2 + ny, 1 : 1 + nx], value=-1.0)
        return out


def diffusion_stencil(faces: tuple[torch.Tensor, ...], dy: float, dx: float, scale: float,
                      shift: float, decomp: Decomposition, comm) -> Stencil:
    """``shift * I + scale * (-div(k grad .))`` from the face conductivities ``(k_west, k_east,
    k_north, k_south)`` of every cell (zero on a Neumann side, the cell's own on a Dirichlet
    side), as heat2d's conservative operator defines them."""
    kw, ke, kn, ks = (f.detach() for f in faces)
    cx, cy = scale / (dx * dx), scale / (dy * dy)
    west, east, north, south = kw * cx, ke * cx, kn * cy, ks * cy
    diag = west + east + north + south + shift
    return Stencil(west, east, north, south, diag, Exchanger(decomp, comm))


__all__ = ["Exchanger", "Stencil", "decomposition_of", "diffusion_stencil", "rank_splits"]
