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


def dot_product_sides(free_surface: bool, before_adjoint=None) -> tuple[float, float] | None:
    """``(<F x, y>, <x, F^T y>)`` for the map F from a segment's starting velocities and
    stresses to its traces and final fields (26x31, 40 steps, no sources: linear, CPML, every
    receiver component), F^T the hand-written adjoint (:meth:`FusedLoop.adjoint`); None where
    the fused kernels do not run.  ``before_adjoint()`` is called just before the adjoint."""
    from odecli.parallel.comm import get_comm
    from odecli.pde.elastic.fused import FusedLoop
    from odecli.pde.elastic.reference import materials
    from odecli.pde.sources import ricker

    n, nt = (26, 31), 40
    recs = [(0, 3), (0, 15), (12, 12), (25, 30), (7, 29), (20, 2)]
    comps = ["vy", "vx", "pressure", "vy", "vx", "pressure"]
    setup = elastic_setup(get_comm(), n, (10.0, 10.0), 0.001, nt, [[(12, 12, 0.0)]], recs,
                          ricker(25.0, nt, 0.001), components=comps, width=5,
                          free_surface=free_surface)
    prop = build(setup)
    if not prop.fused:
        return None
    y, x = torch.meshgrid(torch.arange(26.0, dtype=torch.float64),
                          torch.arange(31.0, dtype=torch.float64), indexing="ij")
    model = torch.stack([2400 + 10 * y, 1200 + 6 * x, 2000 + 5 * y])
    prop.profiles(model[0])
    loop = FusedLoop(prop, materials(prop.padded_parameters(model), free_surface),
                     prop._profiles, 1)
    gen = torch.Generator().manual_seed(3)
    rand = lambda *shape: torch.rand(shape, generator=gen, dtype=torch.float64) - 0.5
    v0, s0, psi0 = rand(1, 2, *n), rand(1, 3, *n), torch.zeros(1, 8, *n, dtype=torch.float64)
    v1, s1, _, traces = loop.run(0, nt, v0, s0, psi0)
    yv, ys, ytr = rand(1, 2, *n), rand(1, 3, *n), rand(1, len(recs), nt)
    if before_adjoint is not None:
        before_adjoint()
    lv, ls, *_ = loop.adjoint(0, nt, v0, s0, psi0, (yv, ys, None, ytr))
    return (float((v1 * yv).sum() + (s1 * ys).sum() + (traces * ytr).sum()),
            float((v0 * lv).sum() + (s0 * ls).sum()))


def record_inits(monkeypatch, cls, what) -> list:
    """Record ``what(instance)`` for each instance of ``cls`` made (its ``__init__`` wrapped)."""
    seen = []
    init = cls.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.append(what(self))

    monkeypatch.setattr(cls, "__init__", spy)
    return seen


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
