"""The acoustic CUDA kernels (odecli/pde/acoustic/cuda_*), tested without a GPU where possible.

- Their host build (the same ``cuda_point.h`` and ``cuda_blocks.h`` the kernels include, every
  thread block run in a loop) driven by the same time loop, through the propagator, with one
  step a launch and with the blocked kernel's 4: the forward equals the PyTorch reference
  bit for bit, and the hand-written adjoint gives autograd's gradient to round-off.
- Single launches against reference steps, with duplicated sources and receivers on tile
  borders and in the blocked kernel's halos (the tables the launches read them from).
- The blocked kernel's thread blocks as POSIX threads meeting at barriers: lane striding and
  barriers (a test that fails with either broken).
- NVRTC compiles the real kernels in float32 and float64 (no GPU needed; skipped without NVRTC).
- The fallback: CPU tensors and a failed build name their reason (several ranks run the
  kernels: tests/test_pde_cuda_ranks.py).
- On a GPU (skipped without one): the kernels against the reference on the same GPU.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from odecli.app.pde_problem import Problem
from odecli.ode.gpu import nvrtc
from odecli.parallel.comm import get_comm
from odecli.pde.acoustic import cuda_build, cuda_loop
from odecli.pde.acoustic.cuda_build import StepCall, host_launcher, tiles_x
from odecli.pde.acoustic.reference import RING, reference_step
from odecli.specs.pde import validate

sys.path.insert(0, str(Path(__file__).parent / "mpi_scripts"))
from pde_equivalence import BASE, variants

sys.path.pop(0)

NO_NVRTC = nvrtc.available()
HAS_CUDA = torch.cuda.is_available()


class CountingHost:
    """The host build behind the launcher interface, counting launches (so a test knows the
    kernel ran, not the reference)."""

    device_type = "cpu"

    def __init__(self, dtype: torch.dtype) -> None:
        self.inner, self.launches = host_launcher(dtype), 0

    def launch(self, call: StepCall) -> None:
        self.launches += 1
        self.inner.launch(call)

    def run(self, call: StepCall, steps: int, *args) -> None:
        self.launches += steps
        self.inner.run(call, steps, *args)

    def run_blocks(self, call: StepCall, steps: int, *args) -> None:
        self.launches += steps
        self.inner.run_blocks(call, steps, *args)


@pytest.fixture(params=[1, 4], ids=lambda k: f"{k}-steps-a-launch")
def host(monkeypatch, request):
    """Route the propagator's CUDA path to the host build for CPU tensors: the one-step kernel,
    and the blocked one with 4 steps a launch (segments of 23 steps end on a partial launch)."""
    monkeypatch.setattr(cuda_loop, "PER_LAUNCH", request.param)
    made: dict = {}

    def launcher_for(like, comm):
        if like.dtype not in made:
            made[like.dtype] = CountingHost(like.dtype)
        return made[like.dtype], ""

    monkeypatch.setattr(cuda_loop, "launcher_for", launcher_for)
    return made


def _problem(raw: dict, fused: bool | None, dtype: str = "float64", device: str = "cpu") -> Problem:
    raw = copy.deepcopy(raw)
    raw.setdefault("compute", {}).update(dtype=dtype, device=device)
    spec = validate(raw, "t.yaml")
    spec["text"] = ""
    P = Problem(spec, get_comm())
    P.prop.fused = fused
    return P


@pytest.mark.parametrize("name", ["grid", "grid_free_surface"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_host_build_forward_equals_the_reference_bit_for_bit(host, name, dtype):
    raw = variants()[name]
    P = _problem(raw, False, dtype)
    c = P.unknown.field().detach()
    before = host[getattr(torch, dtype)].launches  # the problem made its data with the kernel
    with torch.no_grad():
        t0, f0 = P.prop.forward(c, return_field=True)
        P.prop.fused = None
        t1, f1 = P.prop.forward(c, return_field=True)
    assert host[getattr(torch, dtype)].launches - before == P.prop.nt
    assert "CUDA" in P.prop.engine()
    assert t0.abs().max() > 0
    assert torch.equal(t0, t1) and torch.equal(f0, f1)


@pytest.mark.parametrize("name", ["grid", "grid_free_surface", "scalars"])
def test_host_build_adjoint_equals_autograd_through_the_reference(host, name):
    raw = variants()[name]
    (l0, g0), (l1, g1) = (_problem(raw, fused).evaluate(0) for fused in (False, None))
    assert host[torch.float64].launches > 0
    assert l0 == l1
    for a, b in zip(g0, g1):
        assert float(a.abs().max()) > 0
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14 * float(a.abs().max()))


def test_the_builder_picks_the_kernel_where_it_runs(host):
    """build() leaves the choice to the propagator (fused=None), whose forward takes the kernel,
    and sizes 'auto' segments by the memory the kernel's store lives in."""
    raw = copy.deepcopy(BASE)
    raw["compute"]["time_segments"] = "auto"
    spec = validate(raw, "t.yaml")
    spec["text"] = ""
    P = Problem(spec, get_comm())
    assert P.prop.fused is None and "CUDA" in P.prop.engine()
    assert len(P.prop.segments) < round(90 ** 0.5)  # the store fits: fewer than sqrt(nt)
    before = host[torch.float64].launches
    P.evaluate(0)
    assert host[torch.float64].launches > before


def test_recomputed_segments_give_the_gradient_of_one_segment(host):
    """Bit for bit with one step a launch; the blocked kernel sums the shots of each launch in
    turn (cuda_blocks.h), so where the launches start moves the order of the sum: round-off."""
    grads = []
    for segments in (1, 4, 90):
        raw = copy.deepcopy(BASE)
        raw["compute"]["time_segments"] = segments
        P = _problem(raw, None)
        assert len(P.prop.segments) == segments
        grads.append(P.evaluate(0)[1][0])
    for g in grads[1:]:
        if cuda_loop.PER_LAUNCH == 1:
            assert torch.equal(g, grads[0])
        else:
            torch.testing.assert_close(g, grads[0], rtol=1e-13, atol=1e-15 * float(g.abs().max()))


def test_a_zero_wave_speed_takes_the_reference_path(host):
    P = _problem(BASE, None)
    c = P.unknown.field().detach().clone()
    c[5, 7] = 0.0
    c.requires_grad_()
    before = host[torch.float64].launches
    traces = P.prop.forward(c)
    (grad,) = torch.autograd.grad((traces * traces).sum(), c)
    assert host[torch.float64].launches == before and torch.isfinite(grad).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_one_launch_with_duplicated_points_on_tile_borders_is_the_reference_step(dtype):
    """Two shots, a sponge, sources twice at one point and on the corners of tiles, receivers
    there too: out is reference_step + index_put_(accumulate) bit for bit, traces are out's."""
    gen = torch.Generator().manual_seed(4)
    B, ny, nx = 2, 19, 70  # tiles of 32 x 8: three columns of tiles, the last one partly idle
    shape = (B, ny + 2 * RING, nx + 2 * RING)
    u, u_prev = (torch.randn(shape, generator=gen, dtype=dtype) for _ in range(2))
    for f in (u, u_prev):
        f[..., :RING, :] = f[..., -RING:, :] = f[..., :, :RING] = f[..., :, -RING:] = 0
    c2dt2 = (0.1 + 0.2 * torch.rand((ny, nx), generator=gen, dtype=dtype))
    sponge = torch.ones((ny, nx), dtype=dtype)
    sponge[:, :5] = torch.linspace(0.9, 0.99, 5, dtype=dtype)
    sponge[-3:, :] = 0.95
    cols, rows = shape[2], shape[1]
    at = lambda b, i, j: b * rows * cols + (i + RING) * cols + j + RING
    src = torch.tensor([at(0, 8, 31), at(1, 8, 31), at(0, 8, 31), at(1, 7, 32), at(0, 18, 69)])
    vals = torch.randn(src.numel(), generator=gen, dtype=dtype)
    rec = torch.tensor([at(b, i, j) for b in range(B) for i, j in ((8, 31), (0, 0), (7, 32), (8, 31))])
    dy, dx = 10.0, 12.0
    expected = reference_step(u, u_prev, c2dt2, sponge, dy, dx)
    expected.view(-1).index_put_((src,), vals, accumulate=True)
    loop = cuda_loop.CudaLoop(host_launcher(dtype), [(0, 1)], dy, dx, 1.0, sponge, None, None, 1)
    out = u_prev.clone()
    traces = torch.zeros(rec.numel(), dtype=dtype)
    call = loop.call(c2dt2, shape)
    call.set(u=u, u_prev=out, out=out, src_val=vals, traces=traces,
             **cuda_loop.TilePoints.of(src, shape).args("src", "idx"))
    recs = cuda_loop.TilePoints.of(rec, shape)
    call.set(rec_ptr=recs.ptr, rec_at=recs.at, rec_slot=recs.index)
    assert call.blocks == 3 * tiles_x(nx)
    host_launcher(dtype).launch(call)
    assert torch.equal(out, expected)
    assert torch.equal(traces, expected.view(-1)[rec])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_blocked_launch_of_three_steps_with_points_in_halos_is_three_reference_steps(dtype):
    """The blocked kernel (cuda_blocks.h): tiles of 64 x 32 (32 x 16 in float64) with a halo of
    8 cells, sources in the halos of neighbouring tiles, twice at one point, and receivers:
    out equals three reference steps with index_put_(accumulate) bit for bit."""
    gen = torch.Generator().manual_seed(5)
    B, ny, nx, steps = 2, 45, 100, 3
    shape = (B, ny + 2 * RING, nx + 2 * RING)
    fields = [torch.randn(shape, generator=gen, dtype=dtype) for _ in range(2)]
    for f in fields:
        f[..., :RING, :] = f[..., -RING:, :] = f[..., :, :RING] = f[..., :, -RING:] = 0
    c2dt2 = 0.1 + 0.2 * torch.rand((ny, nx), generator=gen, dtype=dtype)
    sponge = torch.ones((ny, nx), dtype=dtype)
    sponge[:, -6:] = torch.linspace(0.99, 0.9, 6, dtype=dtype)
    cols, rows = shape[2], shape[1]
    at = lambda b, i, j: b * rows * cols + (i + RING) * cols + j + RING
    src = torch.tensor([at(0, 15, 31), at(1, 16, 32), at(0, 15, 31), at(1, 31, 63), at(0, 44, 99),
                        at(1, 0, 64)])
    vals = torch.randn((steps, src.numel()), generator=gen, dtype=dtype)
    rec = torch.tensor([at(b, i, j) for b in range(B) for i, j in ((15, 31), (0, 0), (32, 64), (44, 99))])
    dy, dx = 10.0, 12.0
    p, u = (f.clone() for f in fields)
    expected_traces = []
    for k in range(steps):
        nxt = reference_step(u, p, c2dt2, sponge, dy, dx)
        nxt.view(-1).index_put_((src,), vals[k], accumulate=True)
        expected_traces.append(nxt.view(-1)[rec])
        p, u = u, nxt
    loop = cuda_loop.CudaLoop(host_launcher(dtype), [(0, steps)], dy, dx, 1.0, sponge, None, None,
                              steps)
    call = loop.call(c2dt2, shape)
    srcs = cuda_loop.TilePoints.of(src, shape, call.tile, 2 * cuda_build.STEPS_PER_LAUNCH)
    recs = cuda_loop.TilePoints.of(rec, shape, call.tile)
    traces = torch.zeros((steps, rec.numel()), dtype=dtype)
    call.set(src_stride=src.numel(), rec_stride=rec.numel(), rec_ptr=recs.ptr, rec_at=recs.at,
             rec_slot=recs.index, **srcs.args("src", "idx"))
    outs = [torch.zeros(shape, dtype=dtype) for _ in range(2)]
    host_launcher(dtype).run_blocks(call, steps, steps, [*fields, *outs],
                                    [("src_val", vals.data_ptr(), vals.stride(0) * vals.element_size()),
                                     ("traces", traces.data_ptr(), traces.stride(0) * traces.element_size())])
    assert torch.equal(outs[0], p) and torch.equal(outs[1], u)
    assert torch.equal(traces, torch.stack(expected_traces))


def test_the_blocked_kernel_with_lanes_meeting_at_barriers_gives_the_same_bits(monkeypatch):
    """The blocked kernel's thread blocks run as 3 x 2 POSIX threads meeting at a barrier where
    the GPU's threads meet at __syncthreads() (3 does not divide the tile: uneven lanes): the
    forward equals the reference and the gradient the one-lane build's, bit for bit."""
    monkeypatch.setattr(cuda_loop, "PER_LAUNCH", cuda_build.STEPS_PER_LAUNCH)
    results = []
    for lanes in (None, (3, 2)):
        launcher = host_launcher(torch.float64, lanes)
        monkeypatch.setattr(cuda_loop, "launcher_for", lambda like, comm, h=launcher: (h, ""))
        P = _problem(variants()["grid_free_surface"], None)
        c = P.unknown.field().detach()
        with torch.no_grad():
            traces = P.prop.forward(c)
        results.append((traces, P.evaluate(0)[1][0]))
    P.prop.fused = False
    with torch.no_grad():
        assert torch.equal(results[1][0], P.prop.forward(c))
    assert torch.equal(results[1][1], results[0][1])


def test_points_in_the_ring_are_refused():
    with pytest.raises(ValueError, match="ring"):
        cuda_loop.TilePoints.of(torch.tensor([1]), (1, 10, 10))


@pytest.mark.skipif(bool(NO_NVRTC), reason=f"NVRTC: {NO_NVRTC}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nvrtc_compiles_the_real_kernel(dtype):
    """The text NVRTC gets is the kernel's (the __global__ entry around cuda_point.h)."""
    source = cuda_build.cuda_source(dtype)
    assert "__global__" in source and "acoustic_thread" in source
    cubin = nvrtc._compile(source, ["--gpu-architecture=sm_80", *nvrtc.BASE_OPTIONS,
                                    *cuda_build.NVRTC_OPTIONS], "acoustic.cu")
    assert cubin[:4] == b"\x7fELF"


def test_the_reference_runs_where_the_kernel_cannot_and_says_why(monkeypatch):
    assert cuda_loop.launcher_for(torch.zeros(1), get_comm())[1].startswith(
        "the acoustic CUDA kernels need CUDA tensors")

    class TwoRanks:
        size = 2

    class CudaLike:  # what the choice reads of a CUDA tensor
        device = torch.device("cuda", 0)
        dtype = torch.float32

    def no_driver(dtype, device):
        raise RuntimeError("no driver here")

    monkeypatch.setattr(cuda_build, "CudaLauncher", no_driver)
    monkeypatch.setattr(cuda_build, "_CUDA", {})
    launcher, why = cuda_build.cuda_launcher(CudaLike())
    assert launcher is None and "could not be built or loaded: no driver here" in why
    # several ranks are no reason of their own (tests/test_pde_cuda_ranks.py runs them)
    assert cuda_loop.launcher_for(CudaLike(), TwoRanks()) == (None, why)
    assert "CUDA" not in _problem(BASE, None).prop.engine()


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("per_launch", [1, cuda_build.STEPS_PER_LAUNCH])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_on_the_gpu_the_kernel_matches_the_reference(dtype, per_launch, monkeypatch):
    monkeypatch.setattr(cuda_loop, "PER_LAUNCH", per_launch)
    raw = variants()["grid_free_surface"]
    P = _problem(raw, None, dtype, "cuda")
    assert "CUDA kernels" in P.prop.engine(), P.prop.engine()
    ref = _problem(raw, False, dtype, "cuda")
    c = P.unknown.field().detach()
    with torch.no_grad():
        t0, t1 = ref.prop.forward(c), P.prop.forward(c)
    scale = float(t0.abs().max())
    tol = 1e-12 if dtype == "float64" else 1e-5
    torch.testing.assert_close(t1, t0, rtol=0, atol=tol * scale)
    (_, g0), (_, g1) = ref.evaluate(0), P.evaluate(0)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, rtol=0, atol=(1e-10 if dtype == "float64" else 1e-3)
                                   * float(a.abs().max()))
