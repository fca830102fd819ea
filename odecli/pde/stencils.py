"""Finite-difference stencils on halo-padded arrays (vectorised slicing, no per-point loops).

Each function takes a padded array ``up`` of shape ``(..., ny + 2w, nx + 2w)`` and returns the
operator on the ``(..., ny, nx)`` interior.  The operations are done in a fixed order per point, so
the result at a node does not depend on the size or position of the block it lies in.
"""

from __future__ import annotations

import torch

# 4th-order central second derivative: (-1/12, 4/3, -5/2, 4/3, -1/12) / h^2
C0, C1, C2 = -5.0 / 2.0, 4.0 / 3.0, -1.0 / 12.0


def laplacian4(up: torch.Tensor, dy: float, dx: float) -> torch.Tensor:
    """4th-order Laplacian of the interior of ``up`` (halo width 2)."""
    ny = up.shape[-2] - 4
    nx = up.shape[-1] - 4
    iy2 = 1.0 / (dy * dy)
    ix2 = 1.0 / (dx * dx)
    c = up[..., 2 : 2 + ny, 2 : 2 + nx]
    # Fresh temporaries are updated in place (autograd-safe: no op here saves its output), which
    # saves allocations; the order of operations per point is fixed.
    lap = c * (C0 * (ix2 + iy2))
    t = up[..., 2 : 2 + ny, 1 : 1 + nx] + up[..., 2 : 2 + ny, 3 : 3 + nx]
    lap.add_(t.mul_(C1 * ix2))
    t = up[..., 2 : 2 + ny, 0:nx] + up[..., 2 : 2 + ny, 4 : 4 + nx]
    lap.add_(t.mul_(C2 * ix2))
    t = up[..., 1 : 1 + ny, 2 : 2 + nx] + up[..., 3 : 3 + ny, 2 : 2 + nx]
    lap.add_(t.mul_(C1 * iy2))
    t = up[..., 0:ny, 2 : 2 + nx] + up[..., 4 : 4 + ny, 2 : 2 + nx]
    lap.add_(t.mul_(C2 * iy2))
    return lap


def divergence_flux(up: torch.Tensor, kxm, kxp, kym, kyp, dy: float, dx: float) -> torch.Tensor:
    """div(k grad u) with face conductivities (each ``(ny, nx)``) on ``up`` with halo width 1."""
    ny = up.shape[-2] - 2
    nx = up.shape[-1] - 2
    c = up[..., 1 : 1 + ny, 1 : 1 + nx]
    fe = kxp * (up[..., 1 : 1 + ny, 2 : 2 + nx] - c)
    fw = kxm * (c - up[..., 1 : 1 + ny, 0:nx])
    fs = kyp * (up[..., 2 : 2 + ny, 1 : 1 + nx] - c)
    fn = kym * (c - up[..., 0:ny, 1 : 1 + nx])
    return (fe - fw) * (1.0 / (dx * dx)) + (fs - fn) * (1.0 / (dy * dy))
