"""A hand-built :class:`~odecli.pde.propagator.Setup` for elastic2d tests and benchmarks (the
spec layer that normally builds it is not needed to test the numerics), and the analytic 2-D
elastodynamic Green's function the scheme is checked against."""

from __future__ import annotations

import numpy as np
import torch
from scipy.special import hankel2

from odecli.parallel.decomposition import decompose
from odecli.pde.grid import Block, Grid
from odecli.pde.propagator import EQUATIONS, Setup
from odecli.pde.sources import Geometry
from odecli.pde.timing import CommTimer


def elastic_setup(comm, shape, spacing, dt, nt, shots, receivers, wavelet, *,
                  source_type="fy", components=None, free_surface=False, width=10,
                  proc_grid=None, segments=1, dtype=torch.float64, pml_speed=None):
    """The Setup one rank of ``comm`` builds for this grid and geometry (node indices)."""
    ny, nx = shape
    grid = Grid(ny, nx, *spacing)
    decomp = decompose((ny, nx), comm.size, comm.rank, proc_grid=proc_grid)
    block = Block.of(decomp)
    geometry = Geometry(shots, receivers, np.asarray(wavelet, dtype=np.float64))
    boundary = {"absorbing_width": width, "free_surface": free_surface}
    if pml_speed is not None:
        boundary["pml_speed"] = pml_speed
    return Setup(grid=grid, block=block, decomp=decomp, comm=comm, dt=dt, nt=nt,
                 geometry=geometry, local=geometry.local(block, torch.device("cpu"), dtype),
                 boundary=boundary, initial_condition=None, time_segments=segments, threads=1,
                 exchange_every=1, timer=CommTimer(), dtype=dtype, device=torch.device("cpu"),
                 source_type=source_type, receiver_components=components)


def build(setup: Setup):
    return EQUATIONS["elastic2d"].build(setup)


def green_velocity(force: np.ndarray, dt: float, offsets: np.ndarray, direction: int,
                   component: int, vp: float, vs: float, rho: float,
                   shift: float = 0.5) -> np.ndarray:
    """Particle velocity (component 0 = y, 1 = x) at ``offsets`` ``(n, 2)`` metres (y, x) from a
    line force ``force(t)`` (N/m, sampled every ``dt``) in direction ``direction``, in a
    homogeneous full space, sampled at ``(k + shift) dt``: ``(n, len(force))``.

    Frequency domain (time dependence ``exp(+i w t)``, numpy's): the displacement Green's tensor
    ``G_ij = (kS^2 delta_ij gS + d_i d_j (gS - gP)) / (rho w^2)`` with the 2-D Helmholtz Green's
    function ``g = -i/4 H0^(2)(k r)`` (``(lap + k^2) g = -delta``), and
    ``d_i d_j g = g_i g_j g'' + (delta_ij - g_i g_j) g'/r`` (``g_i`` the direction cosines).
    """
    n = len(force)
    nfft = 1 << int(np.ceil(np.log2(4 * n)))
    spectrum = np.fft.rfft(force, nfft)
    w = 2 * np.pi * np.fft.rfftfreq(nfft, dt)
    w[0] = 1.0  # its value is set to 0 below
    out = np.zeros((len(offsets), n))
    for k, (oy, ox) in enumerate(offsets):
        r = float(np.hypot(oy, ox))
        gam = (oy / r, ox / r)
        delta = 1.0 if direction == component else 0.0
        gg = gam[component] * gam[direction]

        def parts(c, r=r):
            kr = w / c * r
            h0, h1 = hankel2(0, kr), hankel2(1, kr)
            g = -0.25j * h0
            dg = 0.25j * (w / c) * h1
            d2g = 0.25j * (w / c) ** 2 * (h0 - h1 / kr)
            return g, dg, d2g

        gs, dgs, d2gs = parts(vs)
        _gp, dgp, d2gp = parts(vp)
        dd = gg * (d2gs - d2gp) + (delta - gg) * (dgs - dgp) / r
        G = ((w / vs) ** 2 * delta * gs + dd) / (rho * w**2)
        V = 1j * w * G * spectrum * np.exp(1j * w * shift * dt)
        V[0] = 0.0
        out[k] = np.fft.irfft(V, nfft)[:n]
    return out
