"""The elastic forward in passes of several steps over the rows (``elastic_run_rows``,
:mod:`odecli.pde.elastic.forward_pass`) against the per-step path (``FusedLoop.steps_per_pass
= 0``): traces, final fields, memory variables and the gradient's stores bit for bit, for point
forces and explosive sources, with and without a free surface, vy/vx/pressure receivers on
rows of the CPML layers, of the interior and on the surface, pass lengths that do and do not
divide a segment's steps, on one and two threads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from elastic_setup import build, elastic_setup

import odecli.pde.elastic.propagator as elastic_propagator
from odecli.parallel.comm import get_comm
from odecli.pde.elastic.fused import FusedLoop
from odecli.pde.elastic.reference import N_PSI

NY, NX, NT = 40, 30, 23  # 6-cell CPML: rows and columns of the layers and of the interior
SHOTS = [[(19, 10, 1.0), (21, 20, -0.5), (19, 10, 0.25)],  # the same point twice
         [(3, 15, 1.0), (36, 8, 0.7)]]  # sources in the top and bottom layers
RECEIVERS = [(14, 4), (19, 17), (21, 29), (25, 8), (2, 27), (39, 0), (0, 12), (20, 10)]
WAVELET = 1.0 + np.sin(0.4 * np.arange(NT))  # non-zero at every step
COMPONENTS = ["vy", "vx", "pressure", "vy", "vx", "pressure", "pressure", "vx"]


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    """Two kernel threads on this small grid (the propagator keeps one below 50k points)."""
    monkeypatch.setattr(elastic_propagator, "MIN_POINTS_PER_THREAD", 1)
    # the five derivative planes, which the per-step path writes too (the compact stores of the
    # passes: tests/test_elastic_stores.py)
    monkeypatch.setattr(FusedLoop, "compact_stores", False)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def model(dtype) -> torch.Tensor:
    y, x = torch.meshgrid(torch.arange(float(NY), dtype=dtype), torch.arange(float(NX), dtype=dtype),
                          indexing="ij")
    return torch.stack([2200 + 10 * y, 1100 + 5 * y + 3 * x, 1900 + 4 * x])


def propagator(dtype, source: str, threads: int, free_surface: bool = False):
    setup = elastic_setup(get_comm(), (NY, NX), (10.0, 10.0), 0.001, NT, SHOTS, RECEIVERS,
                          WAVELET, source_type=source, components=COMPONENTS,
                          width=6, segments=3, dtype=dtype, free_surface=free_surface)
    prop = build(setup)
    if not prop.fused:
        pytest.skip("no C compiler: the fused kernels do not run here")
    prop.threads = threads
    return prop


def segment(prop, coefficient: torch.Tensor, steps_per_pass: int, monkeypatch):
    """Steps 4 .. NT-1 (a segment that does not start at 0) from random fields, storing: the
    outputs of FusedLoop.run, its stores, and how many pass calls ran per shot."""
    monkeypatch.setattr(FusedLoop, "steps_per_pass", steps_per_pass)
    gen = torch.Generator().manual_seed(3)
    b, dtype = len(SHOTS), coefficient.dtype
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    v, s = rand(b, 2, NY, NX) * 1e-9, rand(b, 3, NY, NX) * 1e-6  # the sources' sizes
    psi = rand(b, N_PSI, NY, NX)
    with torch.no_grad():
        prop.profiles(coefficient[0])
        psi = psi * ((prop._profiles.ay_int != 0) | (prop._profiles.ax_int != 0))  # layers only
        m = elastic_propagator.materials(prop.padded_parameters(coefficient),
                                         prop.free_surface_here)
        loop = FusedLoop(prop, m, prop._profiles, prop.threads)
        calls = []
        kernel = loop.run_rows
        loop.run_rows = lambda *a: (calls.append(1), kernel(*a))[1]
        t0, t1 = 4, NT
        stores = (torch.full((t1 - t0, b, 2, NY, NX), float("nan"), dtype=dtype),
                  torch.full((t1 - t0, b, 3, NY, NX), float("nan"), dtype=dtype))
        out = loop.run(t0, t1, v, s, psi, stores=stores, fields=True)
    return [*out, *stores], len(calls)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("source", ["fy", "fx", "pressure"])
@pytest.mark.parametrize("free_surface", [False, True])
def test_passes_equal_the_per_step_path_bit_for_bit(dtype, source, free_surface, monkeypatch):
    """The per-step path: the two half-step kernels per step, with the free surface's images
    between them (what several ranks run)."""
    coefficient = model(dtype)
    expected, calls = segment(propagator(dtype, source, 1, free_surface), coefficient, 0,
                              monkeypatch)
    assert calls == 0
    traces = expected[3]
    assert traces.shape == (len(SHOTS), len(RECEIVERS), NT - 4)
    assert float(traces.abs().max()) > 0 and not any(t.isnan().any() for t in expected)
    for threads in (1, 2):
        for steps in (1, 3, 8, NT):  # 19 steps: passes of 3 and 8 end with a shorter one
            got, calls = segment(propagator(dtype, source, threads, free_surface), coefficient,
                                 steps, monkeypatch)
            passes = [min(steps, NT - 4 - k) for k in range(0, NT - 4, steps)]
            assert calls == len(SHOTS) * sum(min(n, threads) for n in passes)
            for name, a, e in zip(("v", "s", "psi", "traces", "store_v", "store_s"), got,
                                  expected):
                assert torch.equal(a, e), f"{name}: {threads} thread(s), {steps} steps a pass"


@pytest.mark.parametrize("source,free_surface", [("fy", True), ("pressure", False)])
def test_the_forward_and_gradient_equal_the_per_step_path(source, free_surface, monkeypatch):
    """Through the propagator: a forward without a graph (its memory variables kept in the
    layers only, without a free surface) and a gradient (segments, the last one stored by its
    first pass): traces, final fields and gradient bit for bit the per-step path's."""
    results = []
    for steps, threads in ((0, 1), (8, 1), (3, 2)):
        monkeypatch.setattr(FusedLoop, "steps_per_pass", steps)
        prop = propagator(torch.float64, source, threads, free_surface)
        with torch.no_grad():
            forward = prop.forward(model(torch.float64), return_field=True)
        m = model(torch.float64).requires_grad_(True)
        traces = prop.forward(m)
        (traces**2 * torch.cos(torch.arange(NT, dtype=torch.float64))).sum().backward()
        results.append((*forward, traces.detach(), m.grad))
    first, *others = results
    assert float(first[0].abs().max()) > 0 and float(first[-1].abs().max()) > 0
    for got in others:
        assert all(torch.equal(a, e) for a, e in zip(got, first))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_c_materials_equal_the_reference_bit_for_bit(dtype):
    """elastic_materials (a forward without a graph) against reference.materials, on random
    parameters with a free surface."""
    from odecli.pde.elastic.forward_pass import materials_without_graph

    if not propagator(dtype, "fy", 1).fused:
        pytest.skip("no C compiler")
    gen = torch.Generator().manual_seed(5)
    padded = (torch.rand(3, 13, 17, generator=gen, dtype=torch.float64) + 0.5).to(dtype)
    padded[0] *= 3000
    padded[1] *= 1500
    padded[2] *= 2000
    got = materials_without_graph(padded, True)
    want = elastic_propagator.materials(padded, True)
    for name in ("by", "bx", "lam2mu", "lam", "mu_xy", "surface"):
        a, e = getattr(got, name), getattr(want, name)
        assert a.shape == e.shape and torch.equal(a, e), name


def test_the_passes_flush_subnormals_and_restore_the_callers_mode(monkeypatch):
    """The kernels flush subnormals on x86 (subnormals.c) and leave the caller's mode as it was:
    after a forward on this thread PyTorch still keeps a subnormal (set_flush_denormal off)."""
    import platform

    from odecli.pde.elastic.forward_pass import kernels_flush_subnormals

    prop = propagator(torch.float64, "fy", 1)
    x86 = platform.machine().lower() in {"x86_64", "amd64", "i386", "i686"}
    assert kernels_flush_subnormals() == x86
    torch.set_flush_denormal(False)
    with torch.no_grad():
        prop.forward(model(torch.float64))
    tiny = torch.tensor([1e-310], dtype=torch.float64)
    # scaled back to a normal number: a comparison of subnormals would itself be flushed
    assert abs(float((tiny * 0.5 * 1e300)[0]) - 5e-11) < 1e-20
