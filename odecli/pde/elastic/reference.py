"""One time step of the 2-D velocity-stress elastic equations in plain PyTorch (any device;
autograd differentiates it): the readable definition of the scheme.

The staggered grid (Virieux 1986).  Every field is stored on a ``(ny, nx)`` array; entry
``[i, j]`` of each lies at

    syy, sxx          (i,       j)         normal stresses; lambda, mu, vp, vs, rho given here
    vy                (i + 1/2, j)         vertical velocity (y grows downwards)
    vx                (i,       j + 1/2)   horizontal velocity
    sxy               (i + 1/2, j + 1/2)   shear stress

in units of the grid spacing.  The parameters are given at the integer nodes and moved to the
others by averaging: the buoyancy ``1/rho`` arithmetically over the two nodes beside a velocity
(``by = (1/rho[i,j] + 1/rho[i+1,j]) / 2``, ``bx`` likewise in x), ``mu`` arithmetically over the
four nodes around a shear-stress point (arithmetic, not harmonic, so that ``vs = 0`` -- a fluid
-- stays differentiable).  Past the grid's last row and column the parameters are those of the
last node.

A step (leapfrog: velocities at half steps, stresses at whole steps) is

    vy  += dt * by * (D+y syy + D-x sxy) (+ a force fy)
    vx  += dt * bx * (D+x sxx + D-y sxy) (+ a force fx)
    sxx += dt * ((lam + 2 mu) D-x vx + lam D-y vy) (- an explosive source)
    syy += dt * (lam D-x vx + (lam + 2 mu) D-y vy) (- an explosive source)
    sxy += dt * mu_xy * (D+y vx + D+x vy)

with the 4th-order staggered differences ``D+ f[i+1/2] = (9/8 (f[i+1] - f[i]) - 1/24 (f[i+2] -
f[i-1])) / h`` and ``D- f[i] = (9/8 (f[i] - f[i-1]) - 1/24 (f[i+1] - f[i-2])) / h``
(computed as a product with ``1/h``) (half-node
values stored at the index below them), each corrected by its CPML memory variable
(:mod:`odecli.pde.elastic.pml`; zero outside the layers).  Ghost cells (two per side) hold the
neighbour ranks' values, zeros outside the grid, and with a free surface on top (row 0, where
``syy`` and ``sxy`` vanish) the image of the fields: stresses odd, velocities even about row 0,
``syy = 0`` on row 0, and ``sxx`` there from ``dvy/dy = -lam/(lam + 2 mu) dvx/dx`` (the
stress-free condition), i.e. ``sxx += dt * (lam + 2 mu - lam^2/(lam + 2 mu)) D-x vx``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

RING = 2  # ghost cells per side: the 4th-order staggered difference reaches two cells out
C1, C2 = 9.0 / 8.0, -1.0 / 24.0

# channel order of the stacked fields
VY, VX = 0, 1
SYY, SXX, SXY = 0, 1, 2
# memory variables: for vy (dsyy/dy, dsxy/dx), vx (dsxx/dx, dsxy/dy), the normal stresses
# (dvy/dy, dvx/dx) and sxy (dvx/dy, dvy/dx)
N_PSI = 8


@dataclass
class Materials:
    """The parameters where the fields need them (each ``(ny, nx)``)."""

    by: Tensor  # buoyancy at vy
    bx: Tensor  # buoyancy at vx
    lam2mu: Tensor  # lambda + 2 mu at the normal stresses
    lam: Tensor
    mu_xy: Tensor  # mu at sxy
    surface: Tensor | None  # lam + 2 mu - lam^2 / (lam + 2 mu) on row 0 with a free surface


@dataclass
class Profiles:
    """CPML coefficients ``a`` and ``b`` per axis at integer and half nodes: y ones ``(ny, 1)``,
    x ones ``(1, nx)``."""

    ay_int: Tensor
    by_int: Tensor
    ay_half: Tensor
    by_half: Tensor
    ax_int: Tensor
    bx_int: Tensor
    ax_half: Tensor
    bx_half: Tensor


def materials(padded: Tensor, free_surface_here: bool) -> Materials:
    """The staggered parameters from ``(vp, vs, rho)`` stacked ``(3, ny + 2, nx + 2)`` with one
    ghost cell per side (neighbours' values, or the edge node's past the grid)."""
    vp, vs, rho = padded[0], padded[1], padded[2]
    ny, nx = padded.shape[-2] - 2, padded.shape[-1] - 2
    mu = rho * (vs * vs)
    lam2mu = rho * (vp * vp)
    buoy = 1.0 / rho

    def at(f: Tensor, oy: int, ox: int) -> Tensor:
        return f[1 + oy : 1 + oy + ny, 1 + ox : 1 + ox + nx]

    # contiguous: the C kernels read it, and each segment would copy a view
    lam2mu_c, mu_c = at(lam2mu, 0, 0).contiguous(), at(mu, 0, 0)
    lam = lam2mu_c - 2.0 * mu_c
    surface = None
    if free_surface_here:
        surface = lam2mu_c[0] - lam[0] * lam[0] / lam2mu_c[0]
    return Materials(
        by=0.5 * (at(buoy, 0, 0) + at(buoy, 1, 0)),
        bx=0.5 * (at(buoy, 0, 0) + at(buoy, 0, 1)),
        lam2mu=lam2mu_c,
        lam=lam,
        mu_xy=0.25 * ((mu_c + at(mu, 1, 0)) + (at(mu, 0, 1) + at(mu, 1, 1))),
        surface=surface,
    )


def _shift(fp: Tensor, oy: int, ox: int) -> Tensor:
    ny, nx = fp.shape[-2] - 2 * RING, fp.shape[-1] - 2 * RING
    return fp[..., RING + oy : RING + oy + ny, RING + ox : RING + ox + nx]


def d_plus_y(fp: Tensor, inv_h: float) -> Tensor:
    return (C1 * (_shift(fp, 1, 0) - _shift(fp, 0, 0)) + C2 * (_shift(fp, 2, 0) - _shift(fp, -1, 0))) * inv_h


def d_minus_y(fp: Tensor, inv_h: float) -> Tensor:
    return (C1 * (_shift(fp, 0, 0) - _shift(fp, -1, 0)) + C2 * (_shift(fp, 1, 0) - _shift(fp, -2, 0))) * inv_h


def d_plus_x(fp: Tensor, inv_h: float) -> Tensor:
    return (C1 * (_shift(fp, 0, 1) - _shift(fp, 0, 0)) + C2 * (_shift(fp, 0, 2) - _shift(fp, 0, -1))) * inv_h


def d_minus_x(fp: Tensor, inv_h: float) -> Tensor:
    return (C1 * (_shift(fp, 0, 0) - _shift(fp, 0, -1)) + C2 * (_shift(fp, 0, 1) - _shift(fp, 0, -2))) * inv_h


def mirror_top(fp: Tensor, rows: tuple[tuple[int, int], ...], signs: tuple[float, ...]) -> Tensor:
    """``fp`` (``(B, C, ny + 4, nx + 4)``) with its two top ghost rows replaced, per channel, by
    ``sign * fp[rows]`` (padded row indices): the image of the field in a free surface."""
    ghosts = torch.stack([sign * fp[:, c, list(r), :] for c, (r, sign) in
                          enumerate(zip(rows, signs))], dim=1)
    return torch.cat([ghosts, fp[:, :, RING:, :]], dim=-2)


# syy odd about row 0 (ghost rows -2, -1 = -syy[2], -syy[1]); sxx unused there; sxy (at
# i + 1/2) odd: -sxy[1], -sxy[0].  Padded row of field row r is r + 2.
STRESS_IMAGE = (((4, 3), (4, 3), (3, 2)), (-1.0, 0.0, -1.0))
# vy (at i + 1/2) even: vy[1], vy[0]; vx even: vx[2], vx[1]
VELOCITY_IMAGE = (((3, 2), (4, 3)), (1.0, 1.0))


def _cpml(d: Tensor, psi: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """The derivative ``d`` corrected by its updated memory variable, and that variable."""
    psi = b * psi + a * d
    return d + psi, psi


def velocity_step(v: Tensor, sp: Tensor, psi: Tensor, m: Materials, p: Profiles, dt: float,
                  dy: float, dx: float) -> tuple[Tensor, Tensor]:
    """New velocities ``(B, 2, ny, nx)`` from the padded stresses ``sp`` and the new memory
    variables of the four stress derivatives (``psi[:, 0:4]``).  (Differences are multiplied by
    ``1/h``, not divided by ``h``: the C kernels do the same operations in the same order.)"""
    dy, dx = 1.0 / dy, 1.0 / dx
    dsyy_dy, p0 = _cpml(d_plus_y(sp[:, SYY], dy), psi[:, 0], p.ay_half, p.by_half)
    dsxy_dx, p1 = _cpml(d_minus_x(sp[:, SXY], dx), psi[:, 1], p.ax_int, p.bx_int)
    dsxx_dx, p2 = _cpml(d_plus_x(sp[:, SXX], dx), psi[:, 2], p.ax_half, p.bx_half)
    dsxy_dy, p3 = _cpml(d_minus_y(sp[:, SXY], dy), psi[:, 3], p.ay_int, p.by_int)
    vy = v[:, VY] + dt * m.by * (dsyy_dy + dsxy_dx)
    vx = v[:, VX] + dt * m.bx * (dsxx_dx + dsxy_dy)
    return torch.stack([vy, vx], dim=1), torch.stack([p0, p1, p2, p3], dim=1)


def stress_step(s: Tensor, vp_: Tensor, psi: Tensor, m: Materials, p: Profiles, dt: float,
                dy: float, dx: float) -> tuple[Tensor, Tensor]:
    """New stresses ``(B, 3, ny, nx)`` from the padded velocities ``vp_`` and the new memory
    variables of the four velocity derivatives (``psi[:, 4:8]``); with a free surface on this
    block (``m.surface``), row 0 stress-free."""
    dy, dx = 1.0 / dy, 1.0 / dx
    dvy_dy, p4 = _cpml(d_minus_y(vp_[:, VY], dy), psi[:, 4], p.ay_int, p.by_int)
    dvx_dx, p5 = _cpml(d_minus_x(vp_[:, VX], dx), psi[:, 5], p.ax_int, p.bx_int)
    dvx_dy, p6 = _cpml(d_plus_y(vp_[:, VX], dy), psi[:, 6], p.ay_half, p.by_half)
    dvy_dx, p7 = _cpml(d_plus_x(vp_[:, VY], dx), psi[:, 7], p.ax_half, p.bx_half)
    syy = s[:, SYY] + dt * (m.lam * dvx_dx + m.lam2mu * dvy_dy)
    sxx = s[:, SXX] + dt * (m.lam2mu * dvx_dx + m.lam * dvy_dy)
    sxy = s[:, SXY] + dt * m.mu_xy * (dvx_dy + dvy_dx)
    if m.surface is not None:
        syy = torch.cat([torch.zeros_like(syy[:, :1]), syy[:, 1:]], dim=1)
        top = s[:, SXX, :1] + dt * (m.surface * dvx_dx[:, :1])
        sxx = torch.cat([top, sxx[:, 1:]], dim=1)
    return torch.stack([syy, sxx, sxy], dim=1), torch.stack([p4, p5, p6, p7], dim=1)
