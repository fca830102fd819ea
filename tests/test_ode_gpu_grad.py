"""The direct gradient on CUDA (odecli.ode.gpu.gradient), tested without a GPU where that is possible.

- The gradient kernel's text (the CPU gradient's own: tapes, pullback, sweep, with a GPU thread's
  tape memory and the ``gradient_samples_cuda`` entry) compiles with NVRTC in float64 and float32
  (compiling needs no GPU; skipped where no NVRTC library loads).
- Built for the host (tests/gpu_host.py) and run through ``solve_gpu_with_grad``, the two passes
  (forward kernel counting accepted steps, then per-sample tape slabs and the backward kernel,
  in chunks under the byte budget) give the CPU generated solver's direct gradient bit for bit,
  failing samples included; and that gradient agrees with finite differences.
- On a GPU (skipped without one): ``solve_native`` on CUDA tensors that require grad runs it, and
  agrees with the CPU's gradient on the samples that took the same steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from odecli.ode.gpu import gradient as gpu_grad
from odecli.ode.gpu import nvrtc
from odecli.ode.gpu import solve as gpu_solve
from odecli.ode.gpu.source import cuda_gradient_source
from odecli.ode.native import NativeEvent, NativeMLP, NativeRhs, NativeUnavailable, solve_native
from odecli.ode.status import Status

from gpu_host import HostKernel, host_build

VDP = NativeRhs(("y[1]", "((p[0] * (1.0 - odecli_sq(y[0]))) * y[1]) - y[0]"), ("mu",))
NO_NVRTC = nvrtc.available()
HAS_CUDA = torch.cuda.is_available()


@pytest.mark.skipif(bool(NO_NVRTC), reason=f"NVRTC: {NO_NVRTC}")
@pytest.mark.parametrize("method", ["dopri5", "dop853"])
def test_the_gradient_kernel_compiles_for_the_gpu_in_both_precisions(method):
    options = ["--gpu-architecture=sm_80", *nvrtc.BASE_OPTIONS, *nvrtc.CONTRACT_OFF]
    for single in (False, True):
        source = cuda_gradient_source(VDP, method, single)
        assert nvrtc._compile(source, options, "g.cu")[:4] == b"\x7fELF" and "gradient_samples_cuda" in source
    if method == "dopri5":  # an MLP's pullback (its weights' rank updates in GCC vector types) compiles too
        mlp = NativeMLP((np.ones((4, 2)), np.ones((2, 4))), (np.zeros(4), np.zeros(2)), ("tanh", ""))
        assert nvrtc._compile(cuda_gradient_source(mlp, method), options, "mlp.cu")[:4] == b"\x7fELF"


def test_events_and_other_devices_say_why_they_stay_on_the_pytorch_loop():
    events = NativeRhs(VDP.equations, VDP.params, (NativeEvent("y[0]", 0, 0, "x"),))
    assert "event" in gpu_grad.gpu_gradient_unsupported(events, "dopri5", "float64", "cuda")
    assert "CUDA" in gpu_grad.gpu_gradient_unsupported(VDP, "dopri5", "float64", "cpu")
    assert "explicit" in gpu_grad.gpu_gradient_unsupported(VDP, "rodas5", "float64", "cuda")
    with pytest.raises(NativeUnavailable, match="CUDA devices"):
        gpu_grad.solve_gpu_with_grad(VDP, torch.zeros(2, 2, dtype=torch.float64), 0.0, 1.0, params={"mu": 1.0})


@pytest.fixture
def host_kernels(tmp_path, monkeypatch):
    """solve_gpu and solve_gpu_with_grad on CPU tensors, their kernels the host build of the
    gradient's CUDA text (which holds the plain solve_samples_cuda entry too); returns a builder
    ``(method, single, rhs) -> the gradient's HostKernel``."""
    built = {}

    def use(method: str, single: bool = False, rhs: NativeRhs | NativeMLP = VDP) -> HostKernel:
        folder = tmp_path / f"{method}{int(single)}"
        folder.mkdir()
        lib = host_build(cuda_gradient_source(rhs, method, single), folder)
        built["solve"], built["gradient"] = HostKernel(lib), HostKernel(lib, "gradient_samples_cuda")
        built["lib"] = lib
        return built["gradient"]

    monkeypatch.setattr(gpu_solve, "unsupported_reason", lambda *args: "")
    monkeypatch.setattr(gpu_grad, "unsupported_reason", lambda *args: "")
    monkeypatch.setattr(gpu_solve, "_kernel", lambda *args, **kw: built["solve"])
    monkeypatch.setattr(gpu_grad, "_gradient_kernel", lambda *args, **kw: built["gradient"])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    use.built = built
    return use


def _vdp(batch, dtype=torch.float64):
    mu = torch.linspace(0.5, 25.0, batch, dtype=dtype)
    y0 = torch.tensor([[2.0, 0.0]], dtype=dtype).repeat(batch, 1)
    return y0, mu


def _loss_gradient(solver, y0, mu, t1, grid, scale, **options):
    """d/d(y0, mu) of sum(scale * y) + sum(y_final) through ``solver``."""
    y0, mu = y0.detach().clone().requires_grad_(), mu.detach().clone().requires_grad_()
    solution = solver(VDP, y0, 0.0, t1, grid, params={"mu": mu}, **options)
    loss = (solution.y.nan_to_num(0.0) * scale).sum() + solution.y_final.nan_to_num(0.0).sum()
    return solution, *torch.autograd.grad(loss, (y0, mu))


@pytest.mark.parametrize("method", ["dopri5", "dop853", "rk4"])
def test_the_gpu_gradient_on_the_host_is_the_cpu_generated_gradient_bit_for_bit(method, host_kernels, monkeypatch):
    """31 samples in threads of 8, in chunks of a small tape budget; some end at max_steps, one on
    an infinite norm, one has nothing to integrate."""
    gradient_kernel = host_kernels(method)
    batch = 31
    y0, mu = _vdp(batch)
    y0[4, 1] = float("inf")
    t1 = torch.linspace(0.5, 10.0, batch, dtype=torch.float64)
    t1[9] = 0.0
    grid = torch.linspace(0, 10, 11, dtype=torch.float64)
    scale = torch.randn(batch, 11, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    options = dict(method=method, rtol=1e-6, atol=1e-6, max_steps=60, dt0=None if method != "rk4" else 0.02)
    monkeypatch.setattr(gpu_grad, "TAPE_BUDGET_BYTES", 60 * 264 * 2)  # two of the longest tapes: several launches
    got, got_y0, got_mu = _loss_gradient(
        lambda *a, **kw: gpu_grad.solve_gpu_with_grad(*a, threads_per_block=8, **kw), y0, mu, t1, grid, scale,
        **options)
    want, want_y0, want_mu = _loss_gradient(solve_native, y0, mu, t1, grid, scale, **options)
    assert {Status.SUCCESS, Status.REACHED_MAX_STEPS, Status.INFINITE_NORM} <= set(want.status.tolist())
    assert got.extra["gradient"] == "native-cuda"
    assert len(gradient_kernel.launches) > 2 and gradient_kernel.launches[0][2:] == (0, gradient_kernel.launches[1][2])
    torch.testing.assert_close(got.y, want.y, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got_y0, want_y0, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got_mu, want_mu, rtol=0, atol=0, equal_nan=True)
    assert bool(torch.isfinite(got_mu[torch.as_tensor(want.status) == Status.SUCCESS]).all())


def test_the_gpu_gradient_agrees_with_finite_differences_and_sums_a_scalar_parameter(host_kernels):
    host_kernels("tsit5")
    y0, _ = _vdp(3)
    grid = torch.linspace(0, 3, 4, dtype=torch.float64)
    options = dict(method="tsit5", rtol=1e-10, atol=1e-10)
    mu = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)  # one value shared by the samples

    def loss(mu_value, y0_value):
        solution = gpu_grad.solve_gpu_with_grad(VDP, y0_value, 0.0, 3.0, grid, params={"mu": mu_value}, **options)
        return (solution.y[:, :, 0] ** 2).sum() + solution.y_final[:, 1].sum()

    y0 = y0.clone().requires_grad_()
    g_mu, g_y0 = torch.autograd.grad(loss(mu, y0), (mu, y0))
    assert g_mu.shape == () and g_y0.shape == (3, 2)
    eps = 1e-6
    with torch.no_grad():
        fd_mu = (loss(mu + eps, y0) - loss(mu - eps, y0)) / (2 * eps)
        bump = torch.zeros_like(y0)
        bump[1, 0] = eps
        fd_y0 = (loss(mu, y0 + bump) - loss(mu, y0 - bump)) / (2 * eps)
    torch.testing.assert_close(g_mu, fd_mu, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(g_y0[1, 0], fd_y0, rtol=1e-6, atol=1e-8)


def test_the_float32_gradient_kernel_computes_in_float32_near_the_float64_gradient(host_kernels):
    host_kernels("dopri5", single=True)
    y0, mu = _vdp(12)
    grid = torch.linspace(0, 4, 5)
    scale = torch.ones(12, 5, 2)
    options = dict(method="dopri5", rtol=1e-5, atol=1e-5)
    assert host_kernels.built["lib"].step_bytes() == gpu_grad.step_bytes(4) == 32
    got, got_y0, got_mu = _loss_gradient(gpu_grad.solve_gpu_with_grad, y0.float(), mu.float(), 4.0, grid, scale,
                                         **options)
    _, want_y0, want_mu = _loss_gradient(solve_native, y0, mu, 4.0, grid.double(), scale.double(), **options)
    assert got_mu.dtype == torch.float32 and got.y.dtype == torch.float32
    assert not torch.equal(got_mu.double(), want_mu)  # float32 indeed
    # float32 round-off, and steps of their own: the gradients of two discrete solutions within rtol
    torch.testing.assert_close(got_mu.double(), want_mu, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(got_y0.double(), want_y0, rtol=2e-2, atol=2e-3)


def test_an_mlps_weight_gradient_is_summed_over_the_threads_rows_as_the_cpu_sums_its_blocks(host_kernels,
                                                                                            monkeypatch):
    """Neural ODE 2-16-2 (tanh): y0's cotangent is the CPU's bit for bit (each sample's own
    sweep); the weights' cotangent, the sum over samples in another order, to round-off; the
    same whatever the chunks (rows summed in sample order)."""
    torch.manual_seed(4)
    net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).double()
    mlp = NativeMLP.from_module(net)
    gradient_kernel = host_kernels("tsit5", rhs=mlp)
    y0 = torch.randn(45, 2, dtype=torch.float64)
    grid = torch.linspace(0, 2, 5, dtype=torch.float64)
    scale = torch.randn(45, 5, 2, dtype=torch.float64)
    weights = list(net.parameters())

    def gradients(solver):
        start = y0.clone().requires_grad_()
        solution = solver(mlp, start, 0.0, 2.0, grid, method="tsit5", rtol=1e-7, atol=1e-7)
        loss = (solution.y * scale).sum() + solution.y_final.square().sum()
        return torch.autograd.grad(loss, [start, *weights])

    got = gradients(gpu_grad.solve_gpu_with_grad)
    want = gradients(solve_native)
    assert len(gradient_kernel.launches) == 1
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    for g, w in zip(got[1:], want[1:]):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(gpu_grad, "TAPE_BUDGET_BYTES", 4 * mlp.gradient_size() * 8 + 200 * 600)
    chunked = gradients(gpu_grad.solve_gpu_with_grad)
    assert len(gradient_kernel.launches) > 3
    for g, one in zip(chunked, got):
        torch.testing.assert_close(g, one, rtol=1e-14, atol=1e-14)


def test_tapes_go_in_chunks_within_the_budget_and_a_tape_past_it_is_one_line():
    accepted = torch.tensor([5, 0, 7, 3, 3, 9, 1])
    plan = gpu_grad.TapePlan(accepted, n_states=2, n_stages=7, n_keep=0, real_bytes=8, budget=10 * 184)
    assert plan.per_step == 40 + (9 * 2) * 8 == 184
    assert plan.chunks == [(0, 2), (2, 4), (4, 5), (5, 7)]
    assert all(plan.steps(lo, hi) <= 10 for lo, hi in plan.chunks)
    assert plan.start.tolist() == [0, 5, 5, 12, 15, 18, 27, 28]
    with pytest.raises(NativeUnavailable, match=r"^one sample's tape \(9 accepted steps, 0 MiB\) passes"):
        gpu_grad.TapePlan(accepted, n_states=2, n_stages=7, n_keep=0, real_bytes=8, budget=8 * 184)
    assert gpu_grad.TapePlan(accepted[:0], 2, 7, 0, 8).chunks == []
    rows = gpu_grad.TapePlan(accepted, n_states=2, n_stages=7, n_keep=0, real_bytes=8, budget=10 * 184 + 2 * 1000,
                             row_bytes=1000)  # one cotangent row per sample: at most 2 samples a launch here
    assert rows.chunks == [(0, 2), (2, 4), (4, 5), (5, 7)]  # bytes 1920 1000 | 2288 1552 | 1552 | 2656 1184
    assert rows.bytes() <= 10 * 184 + 2 * 1000


gpu = pytest.mark.skipif(not HAS_CUDA or bool(NO_NVRTC), reason="needs a CUDA GPU and NVRTC")


@gpu
def test_solve_native_on_cuda_records_the_gradient_in_the_kernel():
    batch = 256
    y0, mu = _vdp(batch)
    grid = torch.linspace(0, 10, 11, dtype=torch.float64)
    scale = torch.randn(batch, 11, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    options = dict(method="dopri5", rtol=1e-6, atol=1e-6)
    got, got_y0, got_mu = _loss_gradient(solve_native, y0.cuda(), mu.cuda(), 10.0, grid.cuda(), scale.cuda(),
                                         **options)
    want, want_y0, want_mu = _loss_gradient(solve_native, y0, mu, 10.0, grid, scale, **options)
    assert got.extra["gradient"] == "native-cuda" and got_mu.is_cuda
    same = (got.stats["n_steps"].cpu() == want.stats["n_steps"]).numpy()
    assert same.mean() >= 0.99  # pow may differ in its last bit on the GPU
    np.testing.assert_allclose(got_mu.cpu().numpy()[same], want_mu.numpy()[same], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got_y0.cpu().numpy()[same], want_y0.numpy()[same], rtol=1e-6, atol=1e-8)


@gpu
def test_train_inverse_on_cuda_fits_with_the_kernel_gradient_as_the_pytorch_loop_does():
    """The DECAY fit of tests/test_ode_inverse.py on CUDA: the kernel's gradient (engine native)
    against backpropagation through the PyTorch loop (engine torch), same iterates to round-off."""
    from odecli.app.fit_ode import fit_ode
    from test_ode_inverse import DECAY, DECAY_TRUTH, _spec

    text = DECAY % {"data": DECAY_TRUTH, "optimizer": "lbfgs", "lr": 1.0, "iterations": 8, "adjoint": "direct"}
    results = {}
    for engine in ("auto", "torch"):
        results[engine] = fit_ode(*_spec(text.replace("device: cpu}", f"device: cuda, engine: {engine}}}")))
    kernel, loop = results["auto"], results["torch"]
    assert (kernel.engine, loop.engine) == ("native", "torch")
    np.testing.assert_allclose(kernel.history["loss"], loop.history["loss"], rtol=1e-8)
    for name in ("k", "u"):
        np.testing.assert_allclose(kernel.fitted[name], loop.fitted[name], rtol=1e-8)


def test_a_fit_on_cuda_takes_the_kernel_gradient_or_says_why_not(monkeypatch):
    """Problem's engine choice as it would be on a CUDA device (the problem built on the CPU, then
    asked again with its device set to CUDA): the kernel's gradient where NVRTC loads, else the
    reason the fit logs before running on the PyTorch loop."""
    from odecli.app.fit_ode import Problem
    from odecli.parallel.comm import get_comm
    from test_ode_inverse import DECAY, DECAY_TRUTH, _spec

    text = DECAY % {"data": DECAY_TRUTH, "optimizer": "lbfgs", "lr": 1.0, "iterations": 2, "adjoint": "direct"}
    problem = Problem(*_spec(text), get_comm())
    problem.device = torch.device("cuda", 0)
    monkeypatch.setattr(nvrtc, "available", lambda: "")
    assert problem._native_rhs() is not None and problem.gpu_note == ""
    monkeypatch.setattr(nvrtc, "available", lambda: "no NVRTC library found")
    assert problem._native_rhs() is None and problem.gpu_note == "no NVRTC library found"
    problem.events = object()  # any events: their times are not differentiated by the generated gradient
    monkeypatch.setattr(nvrtc, "available", lambda: "")
    assert problem._native_rhs() is None and "event times" in problem.gpu_note
    problem.device = torch.device("cpu")
    assert problem._native_rhs() is None and problem.gpu_note == ""  # on the CPU: no note, as before
