"""2-D constant-density acoustic wave equation ``u_tt = c^2 lap(u) + f`` on a rank's block.

Leapfrog in time, 4th order in space (halo width 2, one halo exchange per step), Cerjan sponge
(``u`` and ``u_prev`` multiplied by ``G = exp(-(alpha*(w-i))^2)`` in the outer ``w`` cells every
step), optional pressure-release free surface on top (no sponge there).  Shots are the batch
dimension.  Gradients flow through autograd; the time loop is split into segments recomputed in
the backward pass (``torch.utils.checkpoint``) so memory grows like sqrt(nt), not nt.
"""

from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

from odecli.pde.grid import Block, Grid
from odecli.pde.sources import LocalGeometry
from odecli.pde.stencils import acoustic_cfl_limit, laplacian4
from odecli.pde.timing import CommTimer, timed_halo

HALO = 2


def sponge_profile(grid: Grid, block: Block, width: int, alpha: float | None, free_surface: bool,
                   dtype, device) -> torch.Tensor | None:
    """Cerjan damping factors for the block's nodes (1 in the interior); None if width == 0."""
    if width <= 0:
        return None
    if alpha is None:
        alpha = math.sqrt(math.log(1.0 / 0.92)) / width  # G = 0.92 at the outermost node
    iy, ix = block.indices(device)
    dist = torch.minimum(ix, grid.nx - 1 - ix)
    dy = grid.ny - 1 - iy if free_surface else torch.minimum(iy, grid.ny - 1 - iy)
    dist = torch.minimum(dist, dy)
    d = (width - dist).clamp(min=0).to(dtype)
    return torch.exp(-((alpha * d) ** 2))


def segment_bounds(nt: int, segments: int) -> list[tuple[int, int]]:
    segments = max(1, min(segments, nt))
    size = math.ceil(nt / segments)
    return [(t0, min(nt, t0 + size)) for t0 in range(0, nt, size)]


class AcousticPropagator:
    halo = HALO

    def __init__(self, grid: Grid, block: Block, decomp, comm, dt: float, nt: int,
                 geom: LocalGeometry, sponge: torch.Tensor | None, segments: int,
                 timer: CommTimer | None = None) -> None:
        self.grid, self.block, self.decomp, self.comm = grid, block, decomp, comm
        self.dt, self.nt, self.geom, self.sponge = dt, nt, geom, sponge
        self.segments = segment_bounds(nt, segments)
        self.timer = timer

    def stability_limit(self) -> float:
        """Largest stable wave speed for this dt and grid."""
        return acoustic_cfl_limit(self.grid.dy, self.grid.dx) / self.dt

    def _run(self, t0: int, t1: int, u_prev, u, c2dt2):
        g = self.geom
        G = self.sponge
        dt2 = self.dt * self.dt
        recs = []
        for it in range(t0, t1):
            up = timed_halo(u, self.decomp, self.comm, HALO, 0.0, self.timer)
            lap = laplacian4(up, self.grid.dy, self.grid.dx)
            u_next = (u + u).sub_(u_prev).add_(lap.mul_(c2dt2))
            u_next = g.inject(u_next, dt2, it)
            if G is not None:
                u_next = u_next * G
                u = u * G
            u_prev, u = u, u_next
            recs.append(g.record(u))
        traces = torch.stack(recs, dim=-1) if recs else u.new_zeros((u.shape[0], g.nrec_local, 0))
        return u_prev, u, traces

    def forward(self, c: torch.Tensor, return_field: bool = False):
        """Receiver traces ``(shots, nrec_local, nt)`` for local wave speed ``c`` (ny_l, nx_l)."""
        g = self.geom
        c2dt2 = (c * c) * (self.dt * self.dt)
        shape = (g.nshots,) + tuple(c.shape)
        u_prev = c.new_zeros(shape).detach()
        u = c.new_zeros(shape).detach()
        out = []
        use_ckpt = torch.is_grad_enabled() and c.requires_grad and len(self.segments) > 1
        for t0, t1 in self.segments:
            if use_ckpt:
                u_prev, u, tr = checkpoint(
                    self._run, t0, t1, u_prev, u, c2dt2, use_reentrant=False,
                    preserve_rng_state=False,
                )
            else:
                u_prev, u, tr = self._run(t0, t1, u_prev, u, c2dt2)
            out.append(tr)
        traces = torch.cat(out, dim=-1)
        return (traces, u) if return_field else traces
