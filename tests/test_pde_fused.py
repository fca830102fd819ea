"""The fused C acoustic step against the PyTorch reference step, and the kernel build cache."""

from __future__ import annotations

import contextlib
import copy
import ctypes
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from odecli.parallel.comm import get_comm
import odecli.native
from odecli.pde import native
from odecli.pde.acoustic.kernels import (Kernels, RowPoints, kernels_flush_subnormals, lap_row_stride,
                                         native_available, new_lap_store, step_forward)
from odecli.pde.acoustic.reference import RING, reference_step
from odecli.app.pde_problem import Problem
from odecli.specs.pde import validate
from odecli.pde.stencils import laplacian4

sys.path.insert(0, str(Path(__file__).parent / "mpi_scripts"))
from pde_equivalence import BASE, variants  # noqa: E402

sys.path.pop(0)

HAVE_NATIVE, WHY = native_available(torch.zeros(1, dtype=torch.float64))


def test_kernel_builds_here():
    """CI has a C compiler, so a missing kernel is a failure here, not a skip."""
    assert HAVE_NATIVE, WHY


def _problem(raw: dict, fused: bool, dtype: str = "float64") -> Problem:
    raw = copy.deepcopy(raw)
    raw.setdefault("compute", {})["dtype"] = dtype
    spec = validate(raw, "t.yaml")
    spec["text"] = ""
    P = Problem(spec, get_comm())
    P.prop.fused = fused
    return P


@contextlib.contextmanager
def flushed_subnormals():
    """PyTorch with subnormals flushed to zero where the C kernels run so (acoustic.c), so that
    the two agree bit for bit also where values ahead of a wave front decay below the normal range."""
    torch.set_flush_denormal(kernels_flush_subnormals())
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.parametrize("name", ["grid", "grid_free_surface", "mlp"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_fused_forward_equals_reference_bit_for_bit(name, dtype):
    raw = variants()[name]
    traces = []
    for fused in (False, True):
        P = _problem(raw, fused, dtype)
        c = P.unknown.field().detach()
        with torch.no_grad(), flushed_subnormals():
            tr, field = P.prop.forward(c, return_field=True)
        traces.append((tr, field))
    (t0, f0), (t1, f1) = traces
    assert t0.abs().max() > 0
    assert torch.equal(t0, t1) and torch.equal(f0, f1)


@pytest.mark.parametrize("name", ["grid", "grid_free_surface", "scalars"])
def test_fused_gradient_matches_reference(name):
    raw = variants()[name]
    (l0, g0), (l1, g1) = (_problem(raw, fused).evaluate(0) for fused in (False, True))
    assert l0 == l1
    for a, b in zip(g0, g1):
        assert float(a.abs().max()) > 0
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14 * float(a.abs().max()))


def test_a_zero_wave_speed_takes_its_gradient_from_the_reference_path():
    """The fused adjoint divides by c2dt2: where c is 0 it could not give the gradient, so that
    evaluation runs the reference instead, and the gradient there is still finite and right."""
    grads = []
    for fused in (None, False):
        P = _problem(BASE, True)
        P.prop.fused = fused
        c = P.unknown.field().detach().clone()
        c[5, 7] = 0.0
        c.requires_grad_()
        traces = P.prop.forward(c)
        (grad,) = torch.autograd.grad((traces * traces).sum(), c)
        grads.append(grad)
    assert torch.isfinite(grads[0]).all() and float(grads[0].abs().max()) > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=0.0)


def test_forward_without_autograd_recycles_buffers_but_not_results():
    """The no-grad forward writes each new field over the one two steps back; traces must not change."""
    P = _problem(BASE, True)
    c = P.unknown.field().detach()
    with torch.no_grad():
        recycled = P.prop.forward(c)
    tracked = P.prop.forward(c.clone().requires_grad_())
    assert torch.equal(recycled, tracked.detach())


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping that holds ``address`` in this process (Linux)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="smaps and huge pages are Linux's")
def test_the_gradients_store_asks_for_huge_pages():
    """The store is read as eight streams of 4 KB rows; on 4 KB pages each row is a new page,
    so the gradient asks Linux for transparent huge pages (madvise, flag "hg") on its store.
    (Not on smaller buffers, which glibc may place in its heap: the flag would outlive them.)"""
    raw = copy.deepcopy(BASE)
    raw["grid"]["shape"] = [181, 180]  # a store of 48 MB, in a mapping of its own
    raw["compute"]["time_segments"] = 1
    P = _problem(raw, True)
    P.evaluate(None)
    (store,) = P.prop.workspace._free["store"]
    huge = 2 << 20
    assert "hg" in _vm_flags(-(-store.data_ptr() // huge) * huge + huge)


def test_repeated_forwards_reuse_their_field_buffers():
    """The time loop's two fields come back to the workspace after a forward and serve the
    next one: at 2000^2 float64 (32.1 MB each, over glibc's largest mmap threshold) new ones
    were page-faulted again on every call, 7800 faults at 2 us each on our VMs."""
    P = _problem(BASE, True)
    c = P.unknown.field().detach()
    with torch.no_grad():
        P.prop.forward(c)
        first = sorted(t.data_ptr() for t in P.prop.workspace._free["field"])
        P.prop.forward(c)
        again = sorted(t.data_ptr() for t in P.prop.workspace._free["field"])
    assert len(first) == 2 and again == first


def test_repeated_calls_reuse_the_wave_speeds_square():
    """``c^2 dt^2`` goes into one workspace buffer that the forward gives back, or the backward
    that read it: a new array each call (and the padded copies before it) cost 6-15 ms of a
    120 ms forward at 2000^2 on 2 ranks, mostly page faults."""
    P = _problem(BASE, True)
    c = P.unknown.field().detach()
    with torch.no_grad():
        P.prop.forward(c)
    first = [t.data_ptr() for t in P.prop.workspace._free["speed"]]
    P.evaluate(None)
    again = [t.data_ptr() for t in P.prop.workspace._free["speed"]]
    assert len(first) == 1 and again == first


def test_repeated_gradients_reuse_their_segment_starts():
    """Each of the 4 segments but the last keeps its two starting fields for the backward, in
    workspace buffers: new clones cost 30,000 page faults an evaluation at 1000^2 with 8."""
    P = _problem(BASE, True)
    P.evaluate(None)
    first = sorted(t.data_ptr() for t in P.prop.workspace._free["start"])
    P.evaluate(None)
    again = sorted(t.data_ptr() for t in P.prop.workspace._free["start"])
    assert len(first) == 2 * (len(P.prop.segments) - 1) == 6 and again == first


def _edge_sponge(ny: int, nx: int, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """G < 1 on i + 1 columns at the left of row i and 2i + 3 at its right, exactly 1 between:
    damped and plain runs of every length up to 19, ending anywhere in a vector of lanes."""
    sponge = torch.ones(ny, nx, dtype=dtype)
    for i in range(ny):
        sponge[i, : i + 1] = torch.rand(i + 1, generator=gen, dtype=dtype)
        sponge[i, max(nx - 2 * i - 3, 0):] = torch.rand(min(2 * i + 3, nx), generator=gen, dtype=dtype)
    return sponge


# 53: the stored laps' rows stream whole cache lines; 16, 33, 53 with the sponge at the edges:
# the vector runs of 8 (float64) or 16 (float32) columns start and end at every offset.
@pytest.mark.parametrize("nx", [13, 16, 33, 53])
@pytest.mark.parametrize("sponge_kind", ["none", "everywhere", "edges"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_step_kernels_against_the_reference_and_its_autograd(sponge_kind, dtype, nx):
    """Forward bit for bit; the adjoint step, in the forward's form, equals autograd's
    vector-Jacobian product."""
    gen = torch.Generator().manual_seed(3)
    b, ny, dy, dx = 2, 9, 10.0, 12.0
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    u = rnd(b, ny + 4, nx + 4).requires_grad_()  # a full ring: as a neighbour-filled field
    u_prev = rnd(b, ny + 4, nx + 4).requires_grad_()
    c2dt2 = (0.1 + rnd(ny, nx).abs() * 0.1).requires_grad_()
    sponge = {"none": None, "everywhere": torch.rand(ny, nx, generator=gen, dtype=dtype),
              "edges": _edge_sponge(ny, nx, gen, dtype)}[sponge_kind]
    expected = reference_step(u, u_prev, c2dt2, sponge, dy, dx)
    out = step_forward(u.detach(), u_prev.detach(), c2dt2.detach(), sponge, dy, dx,
                       torch.empty_like(u))
    assert torch.equal(out, expected)
    recycled, lap = u_prev.detach().clone(), torch.empty(b, ny, nx, dtype=dtype)
    step_forward(u.detach(), recycled, c2dt2.detach(), sponge, dy, dx, recycled, lap=lap)
    assert torch.equal(recycled, expected)  # writing over u_prev while reading it is safe
    assert torch.equal(lap, laplacian4(u.detach(), dy, dx))  # what the adjoint reads

    # Adjoint: u gets w's pullback through this step, plus that of the next step's cotangent
    # `later` through its u_prev slot (where the next step reads u).  The kernel steps
    # mu = c2dt2 G lambda of each field as the forward steps u, and sums mu * lap4(u), the
    # gradient of c2dt2 times c2dt2.  Compared on the block: the ring's share of u's adjoint
    # belongs to the neighbour, which makes it from its own mu.
    w, later = rnd(b, ny + 4, nx + 4), rnd(b, ny + 4, nx + 4)
    ref_u, ref_c2 = torch.autograd.grad(expected, (u, c2dt2), w, retain_graph=True)
    (ref_later,) = torch.autograd.grad(expected, u_prev, later)
    weight = c2dt2.detach() * (1.0 if sponge is None else sponge)

    def mu_of(adjoint: torch.Tensor) -> torch.Tensor:
        mu = torch.zeros_like(adjoint)
        mu[:, 2:-2, 2:-2] = adjoint[:, 2:-2, 2:-2] * weight
        return mu

    mu_after, mu, out, grad_sum = mu_of(later), mu_of(w), torch.empty_like(w), torch.zeros(ny, nx, dtype=dtype)
    Kernels(w, c2dt2.detach(), sponge, dy, dx).adjoint_pass([mu_after, mu, out], lap[None], grad_sum, None, 0)
    tol = 1e-12 if dtype is torch.float64 else 2e-5
    for name, got, want in (("u", out, mu_of(ref_u + ref_later)), ("c2dt2", grad_sum / c2dt2.detach(), ref_c2)):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * float(want.abs().max()),
                                   msg=lambda m: f"grad {name}: {m}")


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="-mno-avx2 is x86's")
@pytest.mark.parametrize("without", ["-mno-avx512f", "-mno-avx2"])
def test_kernels_built_without_avx512_or_avx2_still_match(tmp_path, without):
    """Where the CPU lacks AVX-512 the kernels run 256-bit vector runs, and without AVX2 their
    scalar loops do every column (acoustic.c): built each way here, through a compiler that adds
    the flag, the step-kernel and adjoint-pass tests above pass as they do on AVX-512."""
    calls = tmp_path / "calls"
    cc = tmp_path / "cc"
    cc.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec "${{REAL_CC:-gcc}}" "$@" {without}\n')
    cc.chmod(0o755)
    env = dict(os.environ, CC=str(cc), ODECLI_CACHE_DIR=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                          "-k", "step_kernels_against or adjoint_pass_equals"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "acoustic" in calls.read_text()  # the kernels were built by the wrapper, not taken from a cache
    assert " passed" in run.stdout and "failed" not in run.stdout


@pytest.mark.parametrize("nx", [13, 53, 270])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_store_with_rows_padded_to_cache_lines_holds_the_same_laps_and_gradient(dtype, nx):
    """The gradient's store pads its rows to whole 64-byte lines (so the forward never writes a
    line in part); the passes read and write it exactly as a contiguous stack."""
    gen = torch.Generator().manual_seed(5)
    b, ny, steps, dy, dx = 2, 11, 5, 10.0, 12.0
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    c2dt2 = 0.1 + rnd(ny, nx).abs() * 0.1
    sponge = 0.5 + 0.5 * torch.rand(ny, nx, generator=gen, dtype=dtype)
    stride = lap_row_stride(nx, dtype)
    assert (stride * c2dt2.element_size()) % 64 == 0 and nx <= stride < nx + 64 // c2dt2.element_size()
    padded = new_lap_store(c2dt2, steps, b)
    assert padded.shape == (steps, b, ny, nx) and padded.stride() == (b * ny * stride, ny * stride, stride, 1)
    packed = torch.empty(steps, b, ny, nx, dtype=dtype)
    kern = Kernels(rnd(b, ny + 4, nx + 4), c2dt2, sponge, dy, dx)
    start = rnd(b, ny + 4, nx + 4), rnd(b, ny + 4, nx + 4)
    fields = {}
    for name, laps in (("padded", padded), ("packed", packed)):
        p, u = start[0].clone(), start[1].clone()
        kern.forward_run([p, u, *[(p, u)[j % 2] for j in range(steps)]], None, 0, None, 0, laps)
        fields[name] = (p, u)
    assert torch.equal(padded, packed) and all(map(torch.equal, fields["padded"], fields["packed"]))
    adjoints = {}
    for name, laps in (("padded", padded), ("packed", packed)):
        a, a_later, grad = start[0].clone(), start[1].clone(), torch.zeros(ny, nx, dtype=dtype)
        kern.adjoint_pass([a_later, a, *[(a_later, a)[j % 2] for j in range(steps)]], laps, grad, None, 0)
        adjoints[name] = (a, a_later, grad)
    assert float(adjoints["packed"][2].abs().max()) > 0
    assert all(map(torch.equal, adjoints["padded"], adjoints["packed"]))
    with pytest.raises(ValueError, match="rows contiguous"):  # rows must be equally spaced
        kern.adjoint_pass([a_later, a, *[(a_later, a)[j % 2] for j in range(steps)]],
                          packed.transpose(2, 3).contiguous().transpose(2, 3), grad, None, 0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kernels_flush_subnormals_and_restore_the_callers_mode(dtype):
    """On x86, subnormal inputs count as zero inside the kernels (each operation on one costs
    Intel cores a ~100-cycle assist); PyTorch after the call still keeps them."""
    assert kernels_flush_subnormals() == (platform.machine().lower() in {"x86_64", "amd64", "i386", "i686"})
    tiny = torch.finfo(dtype).tiny / 4  # subnormal
    u = torch.zeros(1, 9, 9, dtype=dtype)
    u[0, 4, 4] = tiny
    c2dt2 = torch.full((5, 5), 0.1, dtype=dtype)
    expected = reference_step(u, torch.zeros_like(u), c2dt2, None, 1.0, 1.0)
    out = step_forward(u, torch.zeros_like(u), c2dt2, None, 1.0, 1.0, torch.empty_like(u))
    assert expected[0, 4, 4] != 0
    a, grad_sum = torch.zeros_like(u), torch.zeros_like(c2dt2)
    Kernels(u, c2dt2, None, 1.0, 1.0).adjoint_pass([torch.zeros_like(u), u, a],
                                                   torch.ones(1, 1, 5, 5, dtype=dtype), grad_sum, None, 0)
    if kernels_flush_subnormals():
        assert torch.count_nonzero(out) == 0 and torch.count_nonzero(a) == 0
        assert torch.count_nonzero(grad_sum) == 0
    else:
        assert torch.equal(out, expected) and a[0, 4, 4] != 0 and grad_sum[2, 2] == tiny
    assert float(torch.tensor([tiny], dtype=dtype) * 1.0) == tiny


def test_kernels_reject_mismatched_layout():
    u = torch.zeros(1, 10, 10, dtype=torch.float64)
    with pytest.raises(ValueError, match="expected fields"):
        step_forward(u, u, torch.zeros(5, 5, dtype=torch.float64), None, 1.0, 1.0, u)
    c2 = torch.zeros(6, 6, dtype=torch.float64)
    laps = torch.zeros(1, 1, 6, 6, dtype=torch.float64)
    kern = Kernels(u, c2, None, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"lap4\(u\) of shape \(1, 1, 6, 6\)"):
        kern.adjoint_pass([u, u.clone(), u], u[None], torch.zeros_like(c2), None, 0)
    with pytest.raises(ValueError, match=r"lap4\(u\) of shape"):
        step_forward(u, u, c2, None, 1.0, 1.0, u, lap=torch.zeros(1, 6, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match="on meta"):  # raw pointers must be CPU memory
        kern.adjoint_pass([u, u.clone(), u], laps.to("meta"), torch.zeros_like(c2), None, 0)
    with pytest.raises(ValueError, match="grad_sum"):
        kern.adjoint_pass([u, u.clone(), u], laps, torch.zeros(6, 7, dtype=torch.float64), None, 0)
    with pytest.raises(ValueError, match="2 outputs"):
        kern.adjoint_pass([u, u.clone(), u], torch.cat([laps, laps]), torch.zeros_like(c2), None, 0)


def _forget_builds() -> None:
    """Drop the per-process library caches, so the next load looks at the environment again."""
    native.load.cache_clear()
    odecli.native.load_source.cache_clear()


def test_turned_off_kernel_falls_back_with_a_reason(monkeypatch):
    monkeypatch.setenv("ODECLI_NATIVE", "0")
    _forget_builds()
    try:
        ok, why = native_available(torch.zeros(1, dtype=torch.float64))
        assert not ok and "ODECLI_NATIVE" in why
        P = _problem(BASE, None)
        with torch.no_grad():
            P.prop.forward(P.unknown.field().detach())  # the reference path runs
        P.prop.fused = True
        with pytest.raises(RuntimeError, match="ODECLI_NATIVE"):
            P.prop.forward(P.unknown.field().detach())
    finally:
        _forget_builds()


def test_build_is_cached_by_content_and_a_broken_compiler_is_reported(monkeypatch, tmp_path):
    monkeypatch.setenv("ODECLI_CACHE_DIR", str(tmp_path))
    _forget_builds()
    try:
        lib, why = native.load("acoustic")
        assert lib is not None, why
        built = list(tmp_path.glob("acoustic-*.so"))
        assert len(built) == 1 and not list(tmp_path.glob("*.tmp.so"))
        stamp = built[0].stat().st_mtime_ns
        _forget_builds()
        assert native.load("acoustic")[0] is not None
        assert built[0].stat().st_mtime_ns == stamp  # reused, not rebuilt

        blocker = tmp_path / "a-file"
        blocker.write_text("")
        monkeypatch.setenv("ODECLI_CACHE_DIR", str(blocker / "cache"))  # cannot be created
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
        (tmp_path / "tmp").mkdir()
        _forget_builds()
        assert native.load("acoustic")[0] is not None
        assert len(list((tmp_path / "tmp").glob("odecli-*/acoustic-*.so"))) == 1

        fake = tmp_path / "broken-cc"
        fake.write_text("#!/bin/sh\necho 'fake 1.0'; [ \"$1\" = --version ] && exit 0; "
                        "echo 'no such flag' >&2; exit 1\n")
        fake.chmod(0o755)
        monkeypatch.setenv("CC", str(fake))
        _forget_builds()
        lib, why = native.load("acoustic")
        assert lib is None and "failed" in why and "no such flag" in why
    finally:
        _forget_builds()


def test_sponge_spans_cover_exactly_the_undamped_run_of_each_row():
    from odecli.pde.acoustic.build import sponge_profile
    from odecli.pde.grid import Block, Grid
    from odecli.pde.acoustic.kernels import sponge_spans

    grid = Grid(30, 40, 10.0, 10.0)
    for free_surface in (False, True):
        G = sponge_profile(grid, Block(3, 27, 0, 25), 6, None, free_surface, torch.float64, "cpu")
        spans = sponge_spans(G)
        for i, (lo, hi) in enumerate(spans.tolist()):
            inside = torch.zeros(G.shape[1], dtype=torch.bool)
            inside[lo:hi] = True
            assert torch.equal(inside, G[i] == 1) or (lo == hi == 0 and not (G[i] == 1).any())
    broken = torch.tensor([[1.0, 0.5, 1.0], [0.5, 1.0, 1.0]])  # two runs of ones: use none
    assert sponge_spans(broken).tolist() == [[0, 0], [1, 3]]


def test_auto_segments_keep_every_field_when_the_budget_allows():
    from odecli.pde.acoustic.build import fused_auto_segments

    assert fused_auto_segments(100, 1, 100) == 1  # all 100 steps' laps
    assert fused_auto_segments(100, 1, 99) == 2  # 50 laps + 2 starts = 52
    assert fused_auto_segments(100, 1, 52) == 2
    assert fused_auto_segments(100, 1, 51) == 3  # 34 + 4 = 38
    assert fused_auto_segments(100, 1, 10) == 10  # nothing fits: sqrt(nt), the least memory
    assert fused_auto_segments(1, 10**9, 0) == 1


@pytest.mark.parametrize("threads", [2, 5, 13])
@pytest.mark.parametrize("with_sponge", [False, True])
def test_row_split_over_threads_changes_nothing(threads, with_sponge):
    """Each point's arithmetic is the same whichever thread does it: results are bit-identical,
    down to pieces of a single row (9 rows over 13 threads)."""
    gen = torch.Generator().manual_seed(5)
    b, ny, nx = 2, 9, 11
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    u, u_prev = (rnd(b, ny + 4, nx + 4) for _ in range(2))
    c2dt2 = 0.1 + rnd(ny, nx).abs() * 0.1
    sponge = torch.rand(ny, nx, generator=gen, dtype=torch.float64) if with_sponge else None
    if sponge is not None:
        sponge[2:-2, 3:-3] = 1.0  # an undamped inside, as a real sponge has
    results = []
    for k in (1, threads):
        lap = torch.empty(b, ny, nx, dtype=torch.float64)
        out = step_forward(u, u_prev, c2dt2, sponge, 10.0, 12.0, torch.empty_like(u), threads=k, lap=lap)
        results.append((out, lap))
    for one, many in zip(*results):
        assert torch.equal(one, many)


@pytest.mark.parametrize("steps,threads", [(1, 1), (1, 3), (2, 1), (3, 1), (8, 1), (2, 2), (5, 2), (8, 3)])
@pytest.mark.parametrize("with_sponge", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("nx", [17, 700])
def test_adjoint_pass_equals_single_steps_bit_for_bit(steps, threads, with_sponge, dtype, nx, monkeypatch):
    """n adjoint steps in one pass, each next step's residuals injected between them as the
    forward injects sources; on several threads, each running its share of the steps behind the
    one before (a single step: its rows split over them).  The pass reads the stored lap rows in
    place, vectors of columns at a time, each prefetching a line 3 KB further on (700 columns:
    long vector runs, damped bands of several vectors and scalar tails)."""
    from odecli.pde.acoustic import kernels as leapfrog

    monkeypatch.setattr(leapfrog, "available_cpus", lambda: 8)  # as many threads as asked, even on 2 CPUs
    gen = torch.Generator().manual_seed(11 + steps)
    b, ny = 3, 14
    shape = (b, ny + 4, nx + 4)
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    laps = torch.stack([rnd(b, ny, nx) for _ in range(steps)])  # in time order: read last first
    mu_after, mu = rnd(*shape), rnd(*shape)
    c2dt2 = 0.1 + rnd(ny, nx).abs() * 0.1
    sponge = torch.rand(ny, nx, generator=gen, dtype=dtype) if with_sponge else None
    if sponge is not None:  # wide blocks: damped bands wider than the pass's prefetch pieces
        edge = 4 if nx < 300 else 130
        sponge[3:-3, edge:-edge] = 1.0
    # ringed coordinates: two receivers in one row, the block's first and last rows and columns
    rec_iy = torch.tensor([9, 2, 9, ny + 1, 5])
    rec_ix = torch.tensor([3, 2, 12, nx + 1, 7])
    flat = (torch.arange(b)[:, None] * (shape[1] * shape[2]) + (rec_iy * shape[2] + rec_ix)[None, :]).reshape(-1)
    values = rnd(steps, flat.numel())  # the residuals injected after each step

    one = Kernels(mu, c2dt2, sponge, 10.0, 12.0)
    p1, u1, grad1 = mu_after.clone(), mu.clone(), torch.zeros_like(c2dt2)
    for j in range(steps):
        one.adjoint_pass([p1, u1, p1], laps[steps - 1 - j:steps - j], grad1, None, 0)
        p1, u1 = u1, p1
        one.points(u1, flat, ctypes.c_void_p(values[j].data_ptr()))

    p2, u2, grad2 = mu_after.clone(), mu.clone(), torch.zeros_like(c2dt2)
    fields = [p2, u2, *[(p2, u2)[j % 2] for j in range(steps)]]
    Kernels(mu, c2dt2, sponge, 10.0, 12.0, threads=threads).adjoint_pass(
        fields, laps, grad2, RowPoints(flat, shape), values.data_ptr())
    assert float(grad1.abs().max()) > 0
    assert torch.equal(grad1, grad2) and torch.equal(fields[-1], u1) and torch.equal(fields[-2], p1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("nx", [30, 700])
def test_passes_make_only_their_windows_and_store_only_the_gradients_block(dtype, nx):
    """Between halo exchanges step m needs exact cells only 2 (K - 1 - m) beyond the owned
    block, so it makes only those (Loop.windows): here windows shrinking by 2 rows from the
    north and 2 columns from the east per step.  Inside the last window the result is the
    whole pass's, bit for bit; rows no step made keep what they held.  With ``gradient_block``
    the store holds that block only: the forward stores its laps there, the adjoint reads them
    and sums its gradient only there, and both are the whole pass's where the steps made the
    cells (the sponge's bands cut anywhere in the windows' and the block's columns)."""
    gen = torch.Generator().manual_seed(5)
    b, ny, n = 2, 20, 5
    shape = (b, ny + 4, nx + 4)
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    c2dt2 = 0.1 + rnd(ny, nx).abs() * 0.1
    sponge = _edge_sponge(ny, nx, gen, dtype)
    windows = (ctypes.c_int64 * (4 * n))(*[x for m in range(1, n + 1) for x in (2 * m, ny, 0, nx - 2 * m)])
    last = (slice(None), slice(RING + 2 * n, RING + ny), slice(RING, RING + nx - 2 * n))
    laps = rnd(n, b, ny, nx)
    p0, u0 = rnd(*shape), rnd(*shape)
    for block in (None, (4, ny - 3, 3, nx - 2 * n - 1)):
        r0, r1, c0, c1 = block or (0, ny, 0, nx)
        runs, stores, held = [], [], laps[:, :, r0:r1, c0:c1].contiguous()  # the block's laps
        for own in (None, block):  # the whole pass, then the windowed one
            win = None if len(runs) == 0 else windows
            kern = Kernels(p0, c2dt2, sponge, 10.0, 12.0, gradient_block=own)
            read = laps if own is None else held
            p, u, store = p0.clone(), u0.clone(), read.clone()
            kern.forward_run([p, u, *[(p, u)[j % 2] for j in range(n)]], None, 0, None, 0, store, win)
            stores.append(store)
            a, a_next, grad = p0.clone(), u0.clone(), torch.zeros_like(c2dt2)
            kern.adjoint_pass([a, a_next, *[(a, a_next)[j % 2] for j in range(n)]], read, grad, None, 0, win)
            runs.append((p, a, grad))
        (p1, a1, g1), (p2, a2, g2) = runs
        for whole, windowed in ((p1, p2), (a1, a2)):  # the last outputs
            assert torch.equal(whole[last], windowed[last])
            assert not torch.equal(whole, windowed)
        assert torch.equal(p2[:, RING : RING + 2], p0[:, RING : RING + 2])  # no step made rows 0, 1
        inside = (slice(max(r0, 2 * n), r1), slice(c0, min(c1, nx - 2 * n)))
        assert float(g1[inside].abs().min()) > 0 and torch.equal(g1[inside], g2[inside])
        assert (g2[:r0] == 0).all() and (g2[r1:] == 0).all()
        assert (g2[:, :c0] == 0).all() and (g2[:, c1:] == 0).all()
        # the store holds the block: the whole pass's laps where each step made them, else untouched
        for j in range(n):
            top = max(r0, 2 * (j + 1))
            cols = slice(c0, min(c1, nx - 2 * (j + 1)))
            made = stores[1][j][:, top - r0 :, cols.start - c0 : cols.stop - c0]
            assert torch.equal(made, stores[0][j][:, top:r1, cols])
            assert torch.equal(stores[1][j][:, : top - r0], read[j][:, : top - r0])
    # a single adjoint step split by rows over threads reads and sums the same block
    sums = []
    for threads in (1, 3):
        kern = Kernels(p0, c2dt2, sponge, 10.0, 12.0, threads=threads, gradient_block=block)
        a, grad = p0.clone(), torch.zeros_like(c2dt2)
        kern.adjoint_pass([a, u0.clone(), a], held[:1], grad, None, 0)
        sums.append(grad)
    assert torch.equal(sums[0], sums[1]) and float(sums[0].abs().max()) > 0
    assert (sums[1][:r0] == 0).all() and (sums[1][:, c1:] == 0).all()


@pytest.mark.parametrize("per_pass", [1, 3, 5])
def test_forward_passes_of_any_length_give_the_same_traces_and_gradient(monkeypatch, per_pass):
    """Forward and adjoint passes of n steps (cut by the time segments and, on several ranks,
    the halo exchanges; the default is 8): the traces, the stored fields the adjoint reads and
    the gradient are those of single steps."""
    from odecli.pde.acoustic import fused as acoustic_native

    P = _problem(copy.deepcopy(BASE), True)
    c = P.unknown.field().detach()
    with torch.no_grad():
        traces8 = P.prop.forward(c)[0]
    loss8, grad8 = P.evaluate(0)
    monkeypatch.setattr(acoustic_native, "STEPS_PER_PASS", per_pass)
    with torch.no_grad():
        traces = P.prop.forward(c)[0]
    loss, grad = P.evaluate(0)
    assert float(traces8.abs().max()) > 0
    assert torch.equal(traces, traces8) and loss == loss8 and torch.equal(grad[0], grad8[0])


def test_problem_gradient_with_threads_equals_one_thread(monkeypatch):
    from odecli.pde.acoustic import propagator as acoustic

    monkeypatch.setattr(acoustic, "MIN_POINTS_PER_THREAD", 1)  # split even this small grid
    raw = copy.deepcopy(BASE)
    raw["compute"]["threads"] = 1
    P1 = _problem(raw, True)
    raw["compute"]["threads"] = 3
    P3 = _problem(raw, True)
    assert (P1.prop.threads, P3.prop.threads) == (1, 3)
    (l1, g1), (l3, g3) = P1.evaluate(0), P3.evaluate(0)
    assert l1 == l3 and torch.equal(g1[0], g3[0])


def test_small_grids_stay_on_one_thread():
    raw = copy.deepcopy(BASE)
    raw["compute"]["threads"] = 8
    assert _problem(raw, True).prop.threads == 1  # 2 shots x 41 x 39 points
