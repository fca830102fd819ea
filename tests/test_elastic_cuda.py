"""The elastic CUDA kernels (odecli/pde/elastic/cuda_*), tested without a GPU where possible.

- Their host build (the same ``cuda_point.h`` the kernels include, every thread block run in a
  loop) driven by the same time loop, through the propagator: the forward equals the PyTorch
  reference bit for bit (float32 and float64), and the hand-written adjoint gives autograd's
  gradient through the reference to 1e-12 relative (float64), with CPML, a free surface, a
  fluid patch, force and pressure sources, vy/vx/pressure receivers and 3 time segments.
- NVRTC compiles the real kernels in float32 and float64 (no GPU needed; skipped without NVRTC).
- The fallback: CPU tensors name their reason (several ranks run the kernels:
  tests/test_pde_cuda_ranks.py).
- On a GPU (skipped without one): the kernels against the reference on the same GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from elastic_setup import build, elastic_setup

from odecli.ode.gpu import nvrtc
from odecli.parallel.comm import get_comm
from odecli.pde.elastic import cuda_build, cuda_loop, equation
from odecli.pde.sources import ricker

sys.path.insert(0, str(Path(__file__).parent / "mpi_scripts"))
import elastic_equivalence as eq

sys.path.pop(0)

NO_NVRTC = nvrtc.available()
HAS_CUDA = torch.cuda.is_available()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class CountingHost:
    """The host build behind the launcher interface, counting launches per kernel (so a test
    knows the kernels ran, not the reference or the C loop)."""

    device_type = "cpu"

    def __init__(self, dtype: torch.dtype) -> None:
        self.inner, self.launches = cuda_build.host_launcher(dtype), {}

    def launch(self, call) -> None:
        self.launches[call.entry] = self.launches.get(call.entry, 0) + 1
        self.inner.launch(call)

    def run(self, calls, steps: int, moving) -> None:
        for call in calls:
            self.launches[call.entry] = self.launches.get(call.entry, 0) + steps
        self.inner.run(calls, steps, moving)


@pytest.fixture
def host(monkeypatch):
    """Route the propagator's CUDA path to the host build for CPU tensors."""
    try:
        cuda_build.host_launcher(torch.float64)
    except RuntimeError as exc:  # no C compiler (or ODECLI_NATIVE=0): nothing to run it on
        pytest.skip(str(exc))
    made: dict = {}

    def launcher_for(like, comm):
        if like.dtype not in made:
            made[like.dtype] = CountingHost(like.dtype)
        return made[like.dtype], ""

    monkeypatch.setattr(cuda_loop, "launcher_for", launcher_for)
    return made


def _setup(source: str, free_surface: bool, dtype=torch.float64, nt: int = eq.NT,
           device: str = "cpu", shared_cells: bool = False):
    """``shared_cells``: a third shot whose force sits where the first's does, and receivers
    on cells other receivers record too (the kernels that add into shared cells group them)."""
    _, shots, recs, comps = eq.variants()
    if shared_cells:
        shots = [*shots, [(18, 21, 0.5)]]
        recs, comps = [*recs, (1, 5), (18, 20), (18, 20)], [*comps, "vy", "vy", "pressure"]
    setup = elastic_setup(get_comm(), eq.SHAPE, eq.SPACING, eq.DT, nt, shots, recs,
                          ricker(25.0, nt, eq.DT), components=comps, width=6, segments=3,
                          dtype=dtype, source_type=source, free_surface=free_surface)
    if device != "cpu":
        setup.device = torch.device(device)
        setup.local = setup.geometry.local(setup.block, setup.device, dtype)
    return setup


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("source,free_surface,shared", [("fy", True, False),
                                                        ("pressure", False, True)])
def test_host_build_forward_equals_the_reference_bit_for_bit(host, dtype, source, free_surface,
                                                             shared):
    """Same operations in the same order as the reference, each rounded on its own: equal."""
    results = []
    for fused in (None, False):
        prop = build(_setup(source, free_surface, dtype, shared_cells=shared))
        prop.fused = prop.fused if fused is None else fused
        with torch.no_grad():
            results.append(prop.forward(eq.true_model().to(dtype), return_field=True))
        if fused is None:
            assert "CUDA kernels" in prop.engine()
    expected = {"elastic_velocity": eq.NT, "elastic_stress": eq.NT, "elastic_source": eq.NT,
                "elastic_receiver": eq.NT}
    if free_surface:
        expected["elastic_image"] = 2 * eq.NT
    assert host[dtype].launches == expected
    (traces, fields), (ref_traces, ref_fields) = results
    assert float(ref_traces.abs().max()) > 0
    assert torch.equal(traces, ref_traces) and torch.equal(fields, ref_fields)


@pytest.mark.parametrize("source,free_surface", [("fy", True), ("fx", False), ("pressure", True)])
def test_host_build_adjoint_gives_autograds_gradient(host, source, free_surface):
    """The kernels' adjoint against autograd through the reference steps, for vp, vs and rho
    (a fluid patch, CPML, 3 time segments, vy/vx/pressure receivers)."""
    nt = 40
    grads = []
    for fused in (None, False):
        prop = build(_setup(source, free_surface, nt=nt, shared_cells=True))
        prop.fused = prop.fused if fused is None else fused
        model = eq.true_model().clone().requires_grad_(True)
        weight = torch.cos(torch.arange(nt, dtype=torch.float64) * 0.37)
        (prop.forward(model) ** 2 * weight).sum().backward()
        grads.append(model.grad)
    launches = host[torch.float64].launches
    assert launches["elastic_stress_adjoint"] == launches["elastic_velocity_gather"] == nt
    assert launches["elastic_fold"] == 2 * nt and launches["elastic_receiver_adjoint"] == nt
    assert launches.get("elastic_source_gradient", 0) == (0 if source == "pressure" else nt)
    for k, name in enumerate(equation.PARAMETERS):
        scale = float(grads[1][k].abs().max())
        err = float((grads[0][k] - grads[1][k]).abs().max()) / scale
        assert scale > 0 and err <= 1e-12, f"{name}: {err:.3e}"


def test_the_adjoint_check_can_fail(host, monkeypatch):
    """A transposed stencil coefficient off by one part in 10^6 (in the host build's gather)
    breaks the gradient check: the comparison above sees the gathers."""
    text = cuda_build.host_source(torch.float64)
    broken = text.replace("#define EC2 (-1.0 / 24.0)", "#define EC2 (-1.0 / 24.0)\n#define EC2G (-1.000001 / 24.0)")
    broken = broken.replace("c2 * (W(0, -2, 0) - W(0, 1, 0))", "(REAL)EC2G * (W(0, -2, 0) - W(0, 1, 0))")
    assert broken.count("EC2G") == 2
    monkeypatch.setattr(cuda_build, "host_source", lambda dtype: broken)
    inner = cuda_build.HostLauncher(torch.float64)
    counting = CountingHost(torch.float64)
    counting.inner = inner
    monkeypatch.setattr(cuda_loop, "launcher_for", lambda like, comm: (counting, ""))
    nt = 20
    grads = []
    for fused in (None, False):
        prop = build(_setup("fy", False, nt=nt))
        prop.fused = prop.fused if fused is None else fused
        model = eq.true_model().clone().requires_grad_(True)
        prop.forward(model).pow(2).sum().backward()
        grads.append(model.grad)
    err = float((grads[0] - grads[1]).abs().max() / grads[1].abs().max())
    assert err > 1e-9


def test_the_reference_stays_where_the_kernels_do_not_run():
    """CPU tensors: not the CUDA kernels (the launcher says why not); several ranks are no
    reason of their own (tests/test_pde_cuda_ranks.py runs the kernels on them)."""
    prop = build(_setup("fy", True))
    assert prop.cuda_launcher is None and "CUDA tensors" in prop.cuda_why
    assert "CUDA" not in prop.engine()  # the C kernels, or the reference without them

    class TwoRanks:
        size = 2

    launcher, why = cuda_loop.launcher_for(torch.zeros(1), TwoRanks())
    assert launcher is None and why == prop.cuda_why


@pytest.mark.skipif(bool(NO_NVRTC), reason=f"NVRTC unavailable: {NO_NVRTC}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nvrtc_compiles_the_kernels(dtype):
    cubin = cuda_build.compile_cubin(dtype, "sm_80")
    assert cubin[:4] == b"\x7fELF"
    for name in cuda_build.KERNELS:
        assert name.encode() in cubin


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_on_the_gpu_the_kernels_match_the_reference(dtype):
    """Forward bit for bit (float64) or to float32 round-off, gradient to round-off, on the GPU
    against the reference on the same GPU."""
    nt = 40
    out = []
    for fused in (None, False):
        prop = build(_setup("fy", True, dtype, nt=nt, device="cuda"))
        if fused is None:
            assert prop.cuda_launcher is not None, prop.cuda_why
        prop.fused = prop.fused if fused is None else fused
        model = eq.true_model().to("cuda", dtype).requires_grad_(True)
        traces = prop.forward(model)
        traces.pow(2).sum().backward()
        out.append((traces.detach(), model.grad))
    (t0, g0), (t1, g1) = out
    tol = 1e-12 if dtype == torch.float64 else 1e-4
    assert float((t0 - t1).abs().max() / t1.abs().max()) <= (0 if dtype == torch.float64 else tol)
    for k in range(3):
        assert float((g0[k] - g1[k]).abs().max() / g1[k].abs().max()) <= tol
