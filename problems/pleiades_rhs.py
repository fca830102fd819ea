"""Right-hand side of the Pleiades problem (PLEI) for ``problems/pleiades.yaml``.

Seven bodies with masses m_i = i attract each other with a planar inverse-square law
(gravitational constant 1). y holds x1..x7, y1..y7, u1..u7 (= x'), w1..w7 (= y').
"""

import torch

N_BODIES = 7


def pleiades(t, y, p):
    """dy/dt for y of shape (batch, 28); t (batch,) and p (empty) are unused."""
    n = N_BODIES
    x, yy, u, w = y[:, :n], y[:, n:2 * n], y[:, 2 * n:3 * n], y[:, 3 * n:]
    mass = torch.arange(1, n + 1, dtype=y.dtype, device=y.device)
    dx = x[:, None, :] - x[:, :, None]  # [b, i, j] = x_j - x_i
    dy = yy[:, None, :] - yy[:, :, None]
    r2 = dx * dx + dy * dy
    eye = torch.eye(n, dtype=torch.bool, device=y.device)
    # r_ij^3 with the diagonal set to 1 so that i == j contributes 0 (dx = dy = 0 there).
    r3 = torch.where(eye, torch.ones_like(r2), r2 * torch.sqrt(r2))
    ax = (mass * dx / r3).sum(dim=2)
    ay = (mass * dy / r3).sum(dim=2)
    return torch.cat([u, w, ax, ay], dim=1)
