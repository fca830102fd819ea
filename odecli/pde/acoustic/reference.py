"""One leapfrog step of the acoustic equation in plain PyTorch: the readable definition that the
fused C kernels (:mod:`odecli.pde.acoustic.kernels`) reproduce bit for bit.

Fields are kept with their ghost ring: ``(B, ny + 4, nx + 4)``, the block at ``[2:-2, 2:-2]``.
One step maps ``(u_prev, u)`` to

    u_next = G * ((2u - G*u_prev) + c2dt2 * lap4(u))     (zeros on the ring),

``G`` the sponge (taken as 1 when ``None``).  Applying ``G`` to ``u_prev`` here, rather than
storing a damped copy of ``u`` each step, is what Cerjan damping of both time levels amounts to,
with one array less to write.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from odecli.pde.stencils import laplacian4

RING = 2  # ghost cells per side: the 4th-order stencil reaches two cells out


def interior(u: Tensor) -> Tensor:
    """The block of a ringed field (a view)."""
    return u[..., RING:-RING, RING:-RING]


def reference_step(u: Tensor, u_prev: Tensor, c2dt2: Tensor, sponge: Tensor | None,
                   dy: float, dx: float) -> Tensor:
    """The step in plain PyTorch (any device); autograd differentiates it."""
    c, p = interior(u), interior(u_prev)
    if sponge is not None:
        p = p * sponge
    lap = laplacian4(u, dy, dx)
    u_next = (c + c).sub_(p).add_(lap.mul_(c2dt2))
    if sponge is not None:
        u_next = u_next * sponge
    return F.pad(u_next, (RING,) * 4)

