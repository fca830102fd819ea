"""elastic2d numerics: the scheme against the analytic 2-D elastodynamic Green's function, the
stability limit, the CPML against a larger domain, the free surface, N ranks against 1 rank,
and Taylor tests of the gradient for each of vp, vs and rho.  The propagator is driven directly
(a hand-built Setup, :mod:`elastic_setup`): the spec layer is tested elsewhere."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from elastic_setup import build, dot_product_sides, elastic_setup, green_velocity
from mpi_helpers import SCRIPTS, compute_on_one_thread, mpi_script, run_mpi

from odecli.parallel.comm import get_comm
from odecli.pde.elastic import equation
from odecli.pde.sources import ricker

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def homogeneous(shape, vp, vs, rho):
    return torch.stack([torch.full(shape, float(v), dtype=torch.float64) for v in (vp, vs, rho)])


# ------------------------------------------------------------------ torch-free rules


def test_parameter_rules_name_the_broken_one():
    ok = equation.check_parameters({"vp": 1500, "vs": 0, "rho": 1000},
                                   {"vp": 3000, "vs": 1500, "rho": 2000, "vs - vp": -100})
    assert ok is None
    assert "vs must be >= 0" in equation.check_parameters({"vs": -1.0}, {})
    assert "rho must be > 0" in equation.check_parameters({"rho": 0.0}, {})
    assert "vp must be > 0" in equation.check_parameters({"vp": 0.0}, {})
    assert "vs must be <= vp" in equation.check_parameters({}, {"vs - vp": 5.0})
    assert "vs must be <= vp" in equation.check_parameters({"vs": 2000.0}, {"vp": 1900.0})
    # vs > vp / sqrt(2) (negative lambda) is allowed
    assert equation.check_parameters({"vs": 0.8}, {"vs - vp": -0.2}) is None
    assert equation.PARAMETERS == ("vp", "vs", "rho") and equation.STEADY is False


def test_the_registry_has_elastic2d():
    from odecli.pde.propagator import EQUATIONS

    assert EQUATIONS["elastic2d"] is equation


@pytest.mark.parametrize("factor,grows", [(0.97, False), (1.03, True)])
def test_the_stability_limit_is_where_the_scheme_starts_to_grow(factor, grows):
    """vp just under the limit stays bounded for 400 steps; just over it blows up."""
    n, h, dt = 24, 10.0, 0.001
    vp = factor * equation.stability_limit(dt, h, h)
    w = np.zeros(400)
    w[0] = 1.0
    setup = elastic_setup(get_comm(), (n, n), (h, h), dt, 400, [[(12, 12, 1.0)]], [(12, 12)],
                          w, width=0)  # a closed box: the energy stays, nothing leaves
    with torch.no_grad():
        traces = build(setup).forward(homogeneous((n, n), vp, 0.5 * vp, 2000.0))[0, 0]
    early, late = float(traces[:50].abs().max()), float(traces[300:].abs().max())
    assert grows == (not math.isfinite(late) or late > 1e3 * early), (early, late)


# ------------------------------------------------------------------ physics


def run_green(direction: str, component: str, shift: tuple[float, float]):
    """A point force in a homogeneous full space: 15 points per S wavelength at the Ricker's peak
    frequency (10 at 1.5x the peak, where its amplitude spectrum is 65 % of the peak's),
    receivers ~2 S wavelengths away in several directions, P and S arrivals in the window, the
    CPML keeping reflections out."""
    vp, vs, rho, f = 2000.0, 1000.0, 1800.0, 15.0
    h = vs / f / 15
    dt, nt, radius = 0.001, 420, 130.0
    n = int(2 * radius / h) + 40
    c = n // 2
    angles = np.radians([0.0, 90.0, 45.0, 150.0, 250.0])
    recs = [(c + round(radius * math.cos(a) / h), c + round(radius * math.sin(a) / h))
            for a in angles]
    w = ricker(f, nt, dt)
    setup = elastic_setup(get_comm(), (n, n), (h, h), dt, nt, [[(c, c, 1.0)]], recs, w,
                          source_type=direction, components=[component] * len(recs), width=12)
    with torch.no_grad():
        traces = build(setup).forward(homogeneous((n, n), vp, vs, rho))[0].numpy()
    # the staggered positions: vy at (i + 1/2, j), vx at (i, j + 1/2)
    offsets = np.array([((ry - c + shift[0]) * h, (rx - c + shift[1]) * h) for ry, rx in recs])
    d, k = ("fy", "fx").index(direction), ("vy", "vx").index(component)
    exact = green_velocity(w, dt, offsets, d, k, vp, vs, rho)
    return traces, exact


@pytest.mark.parametrize("direction,component,shift",
                         [("fy", "vy", (0.0, 0.0)), ("fx", "vx", (0.0, 0.0)),
                          ("fy", "vx", (-0.5, 0.5))])
def test_point_force_matches_the_analytic_greens_function(direction, component, shift):
    traces, exact = run_green(direction, component, shift)
    assert np.all(np.linalg.norm(exact, axis=1) > 0)
    scale = np.linalg.norm(exact, axis=1).max()
    err = np.linalg.norm(traces - exact, axis=1) / np.maximum(np.linalg.norm(exact, axis=1),
                                                              1e-2 * scale)
    assert err.max() <= 0.02, f"relative L2 trace errors {np.round(err, 4)}"


def test_the_greens_function_check_can_fail():
    """Half a cell of stagger ignored, or the wrong component, is seen by the comparison."""
    traces, exact = run_green("fy", "vx", (0.0, 0.0))
    err = np.linalg.norm(traces - exact, axis=1) / np.linalg.norm(exact, axis=1).max()
    assert err.max() > 0.05


def edge_traces(margin: int, width: int) -> np.ndarray:
    """vy and vx from a vertical force, at receivers 15 cells from the source, with ``margin``
    cells between them and the CPML (``width`` cells) on every side."""
    h, dt, nt = 10.0, 0.001, 500
    ny = 2 * (width + margin) + 1
    sx = width + margin
    rx = sx + 15
    nx = rx + margin + width
    cy = ny // 2
    setup = elastic_setup(get_comm(), (ny, nx), (h, h), dt, nt, [[(cy, sx, 1.0)]],
                          [(cy, rx), (cy - 8, rx)], ricker(12.0, nt, dt), width=width,
                          components=["vy", "vx"])
    with torch.no_grad():
        return build(setup).forward(homogeneous((ny, nx), 2000.0, 1100.0, 2000.0))[0].numpy()


def test_the_cpml_absorbs():
    """Receivers 6 cells from a 12-cell CPML record what they record in a model so large that no
    reflection returns in the window (measured: 1.4e-4 and 1.2e-2 relative L2, the second a
    weak vx trace; a 6-cell CPML 1.5e-3 and 9e-2), while rigid edges change the traces
    entirely (> 100 %)."""
    big = edge_traces(45, 12)

    def misfit(t):
        return np.linalg.norm(t - big, axis=1) / np.linalg.norm(big, axis=1)

    assert misfit(edge_traces(6, 12)).max() < 0.02, misfit(edge_traces(6, 12))
    assert misfit(edge_traces(6, 0)).min() > 0.5


@pytest.mark.parametrize("force,component", [("fy", "vy"), ("fx", "vx")])
def test_a_plane_wave_doubles_at_the_free_surface(force, component):
    """A vertical plane P (S) wave -- a line of vertical (horizontal) forces across the grid --
    reaching the free surface: there the incident and reflected waves add to twice the
    incident amplitude (measured 1.985 for vy, half a cell below the surface, 1.996 for vx),
    where a rigid top would give 0.  The incident amplitude is read 35 (20) cells down before
    the reflection returns.  8 Hz: ~14 points per S wavelength (at 7, dispersion over the 40
    cells took the S ratio to 1.85)."""
    ny, nx, h, dt, nt = 100, 80, 10.0, 0.001, 700
    depth = 35 if force == "fy" else 20
    shots = [[(70 if force == "fy" else 40, j, 1.0) for j in range(nx)]]
    setup = elastic_setup(get_comm(), (ny, nx), (h, h), dt, nt, shots, [(0, 40), (depth, 40)],
                          ricker(8.0, nt, dt), source_type=force,
                          components=[component] * 2, width=10, free_surface=True)
    with torch.no_grad():
        traces = build(setup).forward(homogeneous((ny, nx), 2000.0, 1100.0, 2000.0))[0]
    incident = float(traces[1, :420].abs().max())
    ratio = float(traces[0].abs().max()) / incident
    assert 1.95 <= ratio <= 2.02, ratio


def test_free_surface_zeroes_the_normal_stress_on_top():
    n, h, dt = 40, 10.0, 0.001
    w = ricker(15.0, 150, dt)
    setup = elastic_setup(get_comm(), (n, n), (h, h), dt, 150, [[(3, 20, 1.0)]], [(0, 20)], w,
                          source_type="pressure", components=["vy"], width=8, free_surface=True)
    with torch.no_grad():
        traces, fields = build(setup).forward(homogeneous((n, n), 2000, 1000, 2000),
                                              return_field=True)
    syy, sxx = fields[0, 2], fields[0, 3]
    assert float(syy[0].abs().max()) == 0.0
    assert float(sxx[0].abs().max()) > 0 and float(traces.abs().max()) > 0


# ------------------------------------------------------------------ ranks and gradients


@pytest.fixture(scope="module")
def one_rank():
    return compute_on_one_thread(mpi_script("elastic_equivalence"))


@pytest.mark.parametrize("n,grid", [(2, "2x1"), (2, "1x2"), (4, "2x2")])
def test_n_ranks_equal_one_rank(one_rank, tmp_path, n, grid):
    """Uneven splits of a 37x43 grid: forward traces and fields bit for bit, gradients of vp,
    vs and rho each to 1e-12 relative."""
    out = tmp_path / "res.npz"
    proc = run_mpi(SCRIPTS / "elastic_equivalence.py", n, [str(out), grid], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    assert set(got.files) == set(one_rank)
    for key, ref in one_rank.items():
        val = got[key]
        if key.endswith("/grad"):
            for p, name in enumerate(equation.PARAMETERS):
                scale = float(np.abs(ref[p]).max())
                err = float(np.abs(val[p] - ref[p]).max()) / scale
                assert scale > 0 and err <= 1e-12, f"{key} {name} on {grid}: {err:.3e}"
        else:
            assert np.array_equal(val, ref), f"{key} differs on {grid}"


def test_reference_path_on_two_ranks_equals_fused_one_rank(one_rank, tmp_path, monkeypatch):
    """The PyTorch reference steps (CUDA's path, or no C compiler) over ranks give the fused C
    kernels' 1-rank results: forward bit for bit."""
    monkeypatch.setenv("ODECLI_NATIVE", "0")
    out = tmp_path / "res.npz"
    proc = run_mpi(SCRIPTS / "elastic_equivalence.py", 2, [str(out), "1x2"], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    for key, ref in one_rank.items():
        if key.endswith("/grad"):
            err = np.abs(got[key] - ref).max(axis=(1, 2)) / np.abs(ref).max(axis=(1, 2))
            assert err.max() <= 1e-12, (key, err)
        else:
            assert np.array_equal(got[key], ref), key


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("source,free_surface", [("fy", True), ("fx", False),
                                                 ("pressure", False)])
def test_fused_kernels_equal_the_reference_bit_for_bit(dtype, source, free_surface):
    """On one rank the forward's passes (elastic_run.c: several steps per pass over the rows,
    the sources and the free surface's images inside them)."""
    eq = mpi_script("elastic_equivalence")
    _, shots, recs, comps = eq.variants()
    setup = elastic_setup(get_comm(), eq.SHAPE, eq.SPACING, eq.DT, eq.NT, shots, recs,
                          ricker(25.0, eq.NT, eq.DT), components=comps, width=6, segments=3,
                          dtype=dtype, source_type=source, free_surface=free_surface)
    from odecli.pde.elastic.forward_pass import kernels_flush_subnormals

    results = []
    for fused in (True, False):
        prop = build(setup)
        if fused and not prop.fused:
            pytest.skip("no C compiler: the fused kernels do not run here")
        prop.fused = fused
        # the kernels flush subnormals (subnormals.c): PyTorch alike
        torch.set_flush_denormal(not fused and kernels_flush_subnormals())
        try:
            with torch.no_grad():
                results.append(prop.forward(eq.true_model().to(dtype), return_field=True))
        finally:
            torch.set_flush_denormal(False)
    (traces, fields), (ref_traces, ref_fields) = results
    assert float(ref_traces.abs().max()) > 0
    assert torch.equal(traces, ref_traces) and torch.equal(fields, ref_fields)


@pytest.mark.parametrize("source,free_surface", [("fy", True), ("pressure", False)])
def test_hand_written_adjoint_gives_autograds_gradient(source, free_surface):
    """The C adjoint (fused path) against autograd through the PyTorch reference steps, for
    vp, vs and rho (a fluid patch, CPML, 3 time segments, mixed receivers)."""
    eq = mpi_script("elastic_equivalence")
    _, shots, recs, comps = eq.variants()
    setup = elastic_setup(get_comm(), eq.SHAPE, eq.SPACING, eq.DT, eq.NT, shots, recs,
                          ricker(25.0, eq.NT, eq.DT), components=comps, width=6, segments=3,
                          source_type=source, free_surface=free_surface)
    grads = []
    for fused in (True, False):
        prop = build(setup)
        if fused and not prop.fused:
            pytest.skip("no C compiler: the fused kernels do not run here")
        prop.fused = fused
        model = eq.true_model().clone().requires_grad_(True)
        weight = torch.cos(torch.arange(eq.NT, dtype=torch.float64) * 0.37)
        (prop.forward(model) ** 2 * weight).sum().backward()
        grads.append(model.grad)
    for k, name in enumerate(equation.PARAMETERS):
        scale = float(grads[1][k].abs().max())
        err = float((grads[0][k] - grads[1][k]).abs().max()) / scale
        assert scale > 0 and err <= 1e-12, f"{name}: {err:.3e}"


def test_two_kernel_threads_give_one_threads_results(monkeypatch):
    """Rows shared over two threads: the forward bit for bit, the gradient (whose boundary rows
    sum the pieces' contributions in another order) to 1e-12."""
    import odecli.pde.elastic.propagator as elastic_propagator

    monkeypatch.setattr(elastic_propagator, "MIN_POINTS_PER_THREAD", 1)
    prop, model, observed = taylor_problem()
    results = []
    for threads in (1, 2):
        prop.threads = threads
        m = model.clone().requires_grad_(True)
        traces = prop.forward(m)
        ((traces - observed) ** 2).sum().backward()
        results.append((traces.detach(), m.grad))
    (t1, g1), (t2, g2) = results
    assert torch.equal(t1, t2)
    assert float((g1 - g2).abs().max()) <= 1e-12 * float(g1.abs().max())


@pytest.mark.parametrize("threads", [2, 3])
def test_the_one_sweep_step_on_several_threads_gives_one_threads_results(monkeypatch, threads):
    """The forward's passes on several threads (a pass's steps shared out, each thread a row
    iteration behind the one before: forward_pass.run_passes): the traces and final fields
    bit for bit one thread's; point forces on the rows beside the cuts (rows 13, 20, 26 of
    40), where a wrong phase order would read a half-updated row.  The adjoint step likewise
    on two threads (elastic_adjoint_split): the gradient bit for bit; on three the two-pass
    adjoint, whose point-force terms add in another order: to 1e-12."""
    import odecli.pde.elastic.propagator as elastic_propagator

    monkeypatch.setattr(elastic_propagator, "MIN_POINTS_PER_THREAD", 1)
    ny, nx, nt = 40, 30, 50
    y, x = torch.meshgrid(torch.arange(float(ny), dtype=torch.float64),
                          torch.arange(float(nx), dtype=torch.float64), indexing="ij")
    model = torch.stack([2200 + 10 * y, 1100 + 5 * y + 3 * x, 1900 + 4 * x])
    shots = [[(19, 10, 1.0), (21, 20, -0.5)], [(12, 15, 1.0), (26, 8, 0.7)],
             [(13, 5, 1.0), (20, 25, 0.3)]]
    recs = [(14, 4), (19, 17), (21, 29), (25, 8), (2, 27)]
    setup = elastic_setup(get_comm(), (ny, nx), (10.0, 10.0), 0.001, nt, shots, recs,
                          ricker(25.0, nt, 0.001), source_type="fy",
                          components=["vy", "vx", "pressure", "vy", "vx"], width=6, segments=3)
    prop = build(setup)
    if not prop.fused:
        pytest.skip("no C compiler: the fused kernels do not run here")
    results = []
    for n in (1, threads):
        prop.threads = n
        with torch.no_grad():
            fields = prop.forward(model, return_field=True)
        m = model.clone().requires_grad_(True)
        (prop.forward(m) ** 2).sum().backward()
        results.append((*fields, m.grad))
    (tr1, f1, g1), (tr2, f2, g2) = results
    assert float(tr1.abs().max()) > 0
    assert torch.equal(tr1, tr2) and torch.equal(f1, f2)
    if threads == 2:
        assert torch.equal(g1, g2)
    assert float((g1 - g2).abs().max()) <= 1e-12 * float(g1.abs().max())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_one_sweep_adjoint_steps_equal_the_two_passes_bit_for_bit(dtype):
    """elastic_adjoint_step (both halves in one sweep, w in rings of 8 rows) and the per-half
    sweeps (w in a ring) against the two passes per half on full w planes, on random adjoints,
    stores and parameters with CPML rows and columns on every side: every output bit for bit,
    the adjoints' ghost rings included."""
    import ctypes

    from odecli.pde import native

    lib, _ = native.load("elastic")
    if lib is None:
        pytest.skip("no C compiler: the fused kernels do not run here")
    sfx, real = ("f64", ctypes.c_double) if dtype == torch.float64 else ("f32", ctypes.c_float)
    ny, nx = 21, 17
    gen = torch.Generator().manual_seed(5)
    rand = lambda *shape: torch.rand(shape, generator=gen, dtype=torch.float64).to(dtype)
    lv, ls, lp = rand(2, ny + 4, nx + 4), rand(3, ny + 4, nx + 4), rand(8, ny, nx)
    mats, store_v, store_s = [rand(ny, nx) for _ in range(5)], rand(2, ny, nx), rand(3, ny, nx)
    pml = []
    for n in (ny, ny, nx, nx):  # a and b at integer and half nodes, y then x
        a, b = torch.zeros(n, dtype=dtype), torch.ones(n, dtype=dtype)
        a[:3], a[-4:], b[:3], b[-4:] = rand(3) - 1, rand(4) - 1, rand(3), rand(4)
        pml += [a, b]
    ptr = lambda t: ctypes.c_void_p(None if t is None else t.data_ptr())
    scalars = (real(1e-3), real(0.1), real(0.2), ctypes.c_long(4), ctypes.c_long(nx - 4))
    dims = (ctypes.c_long(ny), ctypes.c_long(nx))

    def run(how: str):
        out = [t.clone() for t in (lv, ls, lp)]
        grads = [torch.zeros(ny, nx, dtype=dtype) for _ in range(5)]
        fixed = (*[ptr(t) for t in pml], *scalars)
        kernel = lambda name: getattr(lib, f"elastic_{name}_{sfx}")
        stress = (ptr(out[2]), *[ptr(t) for t in mats[2:]], ptr(None), ptr(store_s),
                  *[ptr(t) for t in grads[2:]], ptr(None))
        velocity = (ptr(out[2]), *[ptr(t) for t in mats[:2]], ptr(store_v),
                    *[ptr(t) for t in grads[:2]])
        rows, ringed = (ctypes.c_long(0), ctypes.c_long(ny)), (ctypes.c_long(0),
                                                               ctypes.c_long(ny + 4))
        if how == "step":  # both halves in one sweep, w in rings of 8 rows (zeroed in C)
            w = torch.full((2, 4, 8, nx + 8), float("nan"), dtype=dtype)
            kernel("adjoint_step")(*dims, *[ptr(t) for t in out], *[ptr(t) for t in mats],
                                   ptr(store_v), ptr(store_s), *[ptr(t) for t in grads],
                                   ptr(w[0]), ptr(w[1]), *fixed)
        elif how == "sweeps":  # each half in one sweep, w in a ring of 8 rows
            w = torch.full((4, 8, nx + 8), float("nan"), dtype=dtype)
            kernel("stress_adjoint_sweep")(*dims, ptr(out[0]), ptr(out[1]), *stress, ptr(w),
                                           *fixed)
            kernel("velocity_adjoint_sweep")(*dims, ptr(out[1]), ptr(out[0]), *velocity, ptr(w),
                                             *fixed)
        else:  # the two passes per half on full w planes (the several-thread path)
            w = torch.zeros(4, ny + 8, nx + 8, dtype=dtype)
            kernel("stress_adjoint")(*dims, *rows, ptr(out[1]), *stress, ptr(w), *fixed)
            kernel("stress_gather")(*dims, *ringed, ptr(out[0]), ptr(w))
            kernel("velocity_adjoint")(*dims, *rows, ptr(out[0]), *velocity, ptr(w), *fixed)
            kernel("velocity_gather")(*dims, *ringed, ptr(out[1]), ptr(w))
        return out + grads

    reference = run("passes")
    for how in ("step", "sweeps"):
        for a, b in zip(run(how), reference):
            assert torch.equal(a, b), how


@pytest.mark.parametrize("segments", [1, 3])
def test_a_segment_stored_by_its_first_pass_gives_the_recomputed_gradient(segments):
    """The last time segment keeps its first pass's stores (store_last_segment) instead of
    recomputing them: the same gradient bit for bit (one segment: no recomputation at all)."""
    prop, model, observed = taylor_problem()
    if not prop.fused:
        pytest.skip("no C compiler: the fused kernels do not run here")
    prop.segments = [(0, prop.nt)] if segments == 1 else prop.segments
    grads = []
    for store in (True, False):
        prop.store_last_segment = store
        m = model.clone().requires_grad_(True)
        ((prop.forward(m) - observed) ** 2).sum().backward()
        grads.append(m.grad)
    assert float(grads[0].abs().max()) > 0 and torch.equal(grads[0], grads[1])


def test_the_discrete_adjoint_passes_the_dot_product_test():
    """<F x, y> = <x, F^T y> for the map F from a segment's starting velocities and stresses to
    its traces and final fields (no sources: linear), F^T the hand-written adjoint, with a free
    surface, the CPML and every receiver component."""
    sides = dot_product_sides(free_surface=True)
    if sides is None:
        pytest.skip("no C compiler: the fused kernels do not run here")
    forward, backward = sides
    assert abs(forward - backward) <= 1e-12 * abs(forward), (forward, backward)


def taylor_problem():
    """A 30x34 model with a free surface, mixed sources and receivers, 3 time segments."""
    shape, h, dt, nt = (30, 34), (10.0, 10.0), 0.001, 90
    y, x = torch.meshgrid(torch.arange(30.0, dtype=torch.float64),
                          torch.arange(34.0, dtype=torch.float64), indexing="ij")
    model = torch.stack([2200 + 10 * y, 1100 + 5 * y + 3 * x, 1900 + 4 * x])
    w = ricker(25.0, nt, dt)
    recs = [(1, 4), (1, 17), (1, 29), (20, 8), (22, 27)]
    comps = ["vy", "vx", "pressure", "vy", "vx"]
    setup = elastic_setup(get_comm(), shape, h, dt, nt, [[(12, 17, 1.0)], [(4, 6, 1.0)]], recs,
                          w, source_type="fy", components=comps, width=6, free_surface=True,
                          segments=3, pml_speed=2600.0)
    prop = build(setup)
    with torch.no_grad():
        bump = torch.exp(-((y - 15) ** 2 + (x - 16) ** 2) / 20)
        observed = prop.forward(model + torch.stack([80 * bump, 60 * bump, 50 * bump]))
    return prop, model, observed


@pytest.mark.parametrize("index", [0, 1, 2], ids=equation.PARAMETERS)
def test_taylor_rate_is_two(index):
    """|L(m + e dm) - L(m) - e <g, dm>| halves twice per halving of e (rate 2.0 +- 0.1)."""
    prop, model, observed = taylor_problem()

    def loss(m):
        return 0.5 * ((prop.forward(m) - observed) ** 2).sum()

    m = model.clone().requires_grad_(True)
    base = loss(m)
    (grad,) = torch.autograd.grad(base, m)
    gen = torch.Generator().manual_seed(index)
    dm = torch.zeros_like(model)
    dm[index] = torch.rand(model.shape[1:], generator=gen, dtype=torch.float64) - 0.5
    dm[index] *= 0.05 * model[index]
    slope = float((grad * dm).sum())
    assert slope != 0.0
    rems = []
    with torch.no_grad():
        for k in range(4):
            eps = 0.5 ** k
            rems.append(abs(float(loss(model + eps * dm) - base) - eps * slope))
    rates = [math.log2(rems[k] / rems[k + 1]) for k in range(3)]
    assert all(abs(r - 2.0) <= 0.1 for r in rates), rates
