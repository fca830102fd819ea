"""The generated ODE solver on CUDA (odecli.ode.gpu), tested without a GPU where that is possible.

- Its CUDA text compiles with NVRTC for every explicit method and for an MLP right-hand side
  (compiling needs no GPU; skipped where no NVRTC library loads).
- That same CUDA text, built for the host by g++ with a shim for the few CUDA names it uses
  and its ``__global__`` entry called once per (block, thread), reproduces the CPU solver bit
  for bit: the one-thread-per-sample mapping, the lanes in a thread's own memory and the entry's
  index arithmetic are all exercised on the CPU.
- The engine choice: which specs ``solver.engine: auto`` sends to the GPU build on CUDA.
- On a GPU (skipped without one): agreement with the CPU solver, same steps per sample,
  failure isolation, float32 results, progress, an MLP right-hand side.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
import yaml

from odecli.app import solve as runner
from odecli.errors import InputError
from odecli.ode.gpu import nvrtc, solve_gpu, unsupported_reason
from odecli.ode.gpu.source import cuda_source
from odecli.ode.methods import METHODS
from odecli.ode.native import NativeMLP, NativeRhs, NativeUnavailable, solve_native_arrays
from odecli.ode.native.engine import prepare_job
from odecli.ode.options import SolverOptions
from odecli.ode.status import Status
from odecli.specs import parse_ode_spec

from gpu_host import HostKernel, host_build

VDP = NativeRhs(("y[1]", "((p[0] * (1.0 - odecli_sq(y[0]))) * y[1]) - y[0]"), ("mu",))
NO_NVRTC = nvrtc.available()
HAS_CUDA = torch.cuda.is_available()
TOL32 = 1e-4  # float32 at 1e-6 sits at its resolution: round-off then flips accepts in half the samples


def _mlp() -> NativeMLP:
    rng = np.random.default_rng(3)
    return NativeMLP((rng.normal(size=(8, 2)) / 2, rng.normal(size=(2, 8)) / 3), (rng.normal(size=8) / 4,
                                                                                   np.zeros(2)), ("tanh", ""))


@pytest.mark.skipif(bool(NO_NVRTC), reason=f"NVRTC: {NO_NVRTC}")
@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_compiles_for_the_gpu_in_both_precisions(method):
    for single in (False, True):
        cubin = nvrtc._compile(cuda_source(VDP, method, single), ["--gpu-architecture=sm_80", *nvrtc.BASE_OPTIONS,
                                                                  *nvrtc.CONTRACT_OFF], "vdp.cu")
        assert cubin[:4] == b"\x7fELF"


@pytest.mark.skipif(bool(NO_NVRTC), reason=f"NVRTC: {NO_NVRTC}")
def test_an_mlp_compiles_for_the_gpu_and_the_cache_serves_a_second_build(tmp_path, monkeypatch):
    monkeypatch.setenv("ODECLI_CACHE_DIR", str(tmp_path))
    first = nvrtc.compile_cubin(cuda_source(_mlp(), "tsit5"), "sm_90")
    assert len(list((tmp_path / "cuda").glob("*.cubin"))) == 1
    assert nvrtc.compile_cubin(cuda_source(_mlp(), "tsit5"), "sm_90") == first
    with pytest.raises(nvrtc.CompileError, match="identifier"):
        nvrtc.compile_cubin(cuda_source(NativeRhs(("undefined_name",)), "euler"), "sm_90")


@pytest.mark.skipif(bool(NO_NVRTC), reason=f"NVRTC: {NO_NVRTC}")
def test_events_compile_for_the_gpu_in_both_precisions():
    from odecli.ode.native import NativeEvent

    rhs = NativeRhs(VDP.equations, VDP.params, (NativeEvent("y[0]", 0, 0, "x"), NativeEvent("y[1]", -1, 1, "v")))
    for single in (False, True):
        cubin = nvrtc._compile(cuda_source(rhs, "dop853", single), ["--gpu-architecture=sm_90", *nvrtc.BASE_OPTIONS],
                               "events.cu")
        assert cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("method", ["dopri5", "dop853", "rk4"])
def test_the_cuda_text_run_on_the_host_is_the_cpu_solver_bit_for_bit(method, tmp_path):
    """Threads of 3 blocks of 16 over 37 samples (the last block partly idle), some of them failing."""
    batch = 37
    mu = np.linspace(0.5, 25.0, batch)
    y0 = np.tile([2.0, 0.0], (batch, 1))
    y0[7, 0] = np.nan
    options = SolverOptions(method=method, rtol=1e-6, atol=1e-6, max_steps=60,
                            dt0=None if METHODS[method].adaptive else 0.05)
    t1 = np.linspace(0.5, 10.0, batch)
    t1[5] = 0.0  # nothing to integrate
    want = solve_native_arrays(VDP, y0, 0.0, t1, np.linspace(0, 10, 11), params={"mu": mu}, options=options,
                               threads=1)
    assert {Status.SUCCESS, Status.REACHED_MAX_STEPS, Status.INFINITE_NORM} <= set(want.status.tolist())
    job = prepare_job(VDP, y0, 0.0, t1, np.linspace(0, 10, 11), params={"mu": mu}, options=options)
    lib = host_build(cuda_source(VDP, method), tmp_path)
    lib.launch(ctypes.c_int64(3), ctypes.c_int64(16), ctypes.c_int64(0), ctypes.c_int64(batch), *job.args())
    np.testing.assert_array_equal(job.istat[:, 0], want.status)
    np.testing.assert_array_equal(job.istat[:, 1], want.stats["n_steps"])
    np.testing.assert_array_equal(job.istat[:, 4], want.stats["n_f_evals"])
    np.testing.assert_array_equal(job.y_out, want.y)  # NaN where a failed sample never got: equal too
    np.testing.assert_array_equal(job.fstat[:, 2], want.t_final)
    np.testing.assert_array_equal(job.y_final, want.y_final)


def _spec(tmp_path, **sections):
    data = {"kind": "ode", "name": "vdp", "system": {"states": ["x", "v"], "params": {"mu": [1.0, 2.0]},
                                                     "equations": {"x": "v", "v": "mu * (1 - x**2) * v - x"}},
            "initial": {"x": 2.0, "v": 0.0}, "time": {"start": 0.0, "end": 1.0, "eval": 3},
            "solver": {"device": "cpu"}}
    for key, value in sections.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and key in data else value
    path = tmp_path / "vdp.yaml"
    path.write_text(yaml.safe_dump(data))
    return parse_ode_spec(data, path.read_text(), str(path))


def test_auto_on_cuda_takes_explicit_equation_specs_in_both_precisions(tmp_path, monkeypatch):
    monkeypatch.setattr(nvrtc, "available", lambda: "")
    for dtype in ("float32", "float64"):
        assert runner.native_unsupported(_spec(tmp_path, solver={"dtype": dtype}), "cuda:0") == ""
    assert "not an explicit" in runner.native_unsupported(_spec(tmp_path, solver={"method": "rodas5"}), "cuda")
    rhs_file = tmp_path / "rhs.py"
    rhs_file.write_text("def f(t, y, p):\n    return -y\n")
    python = _spec(tmp_path, system={"equations": None, "python": f"{rhs_file}:f"})
    assert runner.native_unsupported(python, "cuda") == "the right-hand side is Python code"
    assert runner.native_unsupported(_spec(tmp_path, solver={"engine": "torch"}), "cuda") == "solver.engine is torch"
    events = _spec(tmp_path, events=[{"name": "cross", "expression": "x"}])
    assert runner.native_unsupported(events, "cuda") == ""
    assert "float16" in unsupported_reason("dopri5", "float16", "cuda")
    monkeypatch.setattr(nvrtc, "available", lambda: "no NVRTC library found")
    assert runner.native_unsupported(_spec(tmp_path), "cuda") == "no NVRTC library found"


def test_engine_native_on_cuda_without_nvrtc_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(nvrtc, "available", lambda: "no NVRTC library found")
    monkeypatch.setattr(runner, "spec_device", lambda spec: "cuda:0")
    monkeypatch.setattr(runner, "check_memory", lambda spec, device: None)
    with pytest.raises(InputError, match="solver.engine: native cannot run this spec: no NVRTC library found$"):
        runner.solve_spec(_spec(tmp_path, solver={"engine": "native", "device": "cuda"}))


def test_without_cuda_the_gpu_solver_says_why():
    with pytest.raises(NativeUnavailable, match="CUDA devices"):
        solve_gpu(VDP, torch.zeros(2, 2, dtype=torch.float64), 0.0, 1.0, params={"mu": 1.0})


gpu = pytest.mark.skipif(not HAS_CUDA or bool(NO_NVRTC), reason="needs a CUDA GPU and NVRTC")


def _vdp_batch(batch, dtype=torch.float64, device="cuda"):
    mu = torch.linspace(0.5, 25.0, batch, dtype=torch.float64, device=device)
    y0 = torch.tensor([[2.0, 0.0]], dtype=dtype, device=device).expand(batch, 2).contiguous()
    return y0, torch.linspace(0, 10, 11, dtype=torch.float64, device=device), {"mu": mu}


@gpu
@pytest.mark.parametrize("method", ["dopri5", "tsit5", "dop853", "bosh3"])
def test_gpu_matches_the_cpu_solver_with_the_same_steps(method):
    y0, grid, params = _vdp_batch(512)
    options = SolverOptions(method=method, rtol=1e-6, atol=1e-6)
    got = solve_gpu(VDP, y0, 0.0, 10.0, grid, params=params, options=options)
    want = solve_native_arrays(VDP, y0.cpu().numpy(), 0.0, 10.0, grid.cpu().numpy(),
                               params={"mu": params["mu"].cpu().numpy()}, options=options)
    assert got.extra["engine"] == "native-cuda" and got.y.is_cuda
    np.testing.assert_array_equal(got.status.cpu().numpy(), want.status)
    same = got.stats["n_steps"].cpu().numpy() == want.stats["n_steps"]
    assert same.mean() >= 0.99  # pow may differ in its last bit on the GPU; a step count rarely follows
    np.testing.assert_allclose(got.y.cpu().numpy()[same], want.y[same], rtol=1e-7, atol=1e-9)


@gpu
def test_a_failing_sample_leaves_the_others_as_they_are_alone():
    y0, grid, params = _vdp_batch(300)
    y0[7, 0] = float("nan")
    options = SolverOptions(rtol=1e-6, atol=1e-6, max_steps=150)
    batch = solve_gpu(VDP, y0, 0.0, 10.0, grid, params=params, options=options)
    assert int(batch.status[7]) == Status.INFINITE_NORM
    assert (batch.status == Status.REACHED_MAX_STEPS).any() and (batch.status == Status.SUCCESS).any()
    for i in (0, 150, 299):
        alone = solve_gpu(VDP, y0[i:i + 1], 0.0, 10.0, grid, params={"mu": params["mu"][i:i + 1]}, options=options)
        assert torch.equal(alone.y[0].nan_to_num(-1.0), batch.y[i].nan_to_num(-1.0))
        assert int(alone.stats["n_steps"][0]) == int(batch.stats["n_steps"][i])


@gpu
def test_float32_results_progress_and_an_mlp():
    y0, grid, params = _vdp_batch(70_000, torch.float32)
    seen = []
    got = solve_gpu(VDP, y0, 0.0, 10.0, grid, params=params, progress=seen.append)
    assert got.y.dtype == torch.float32 and bool((got.status == 0).all())
    assert seen[-1].finished == 70_000 and seen[-1].loop_iterations == int(got.stats["n_steps"].sum())
    mlp, y_mlp = _mlp(), torch.randn(64, 2, dtype=torch.float64, device="cuda")
    on_gpu = solve_gpu(mlp, y_mlp, 0.0, 2.0, grid[:3] / 5)
    on_cpu = solve_native_arrays(mlp, y_mlp.cpu().numpy(), 0.0, 2.0, (grid[:3] / 5).cpu().numpy())
    same = on_gpu.stats["n_steps"].cpu().numpy() == on_cpu.stats["n_steps"]
    assert same.mean() >= 0.9
    np.testing.assert_allclose(on_gpu.y.cpu().numpy()[same], on_cpu.y[same], rtol=1e-7, atol=1e-9)


def test_solve_gpu_lays_out_a_batch_and_reads_it_back_as_the_cpu_solver(tmp_path, monkeypatch):
    """solve_gpu's layout, launches and Solution, with CPU tensors and the host build as its kernel
    (float32 inputs take the float32 build: the next test)."""
    from odecli.ode.gpu import solve as gpu_solve

    kernel = HostKernel(host_build(cuda_source(VDP, "tsit5"), tmp_path))
    monkeypatch.setattr(gpu_solve, "unsupported_reason", lambda *args: "")
    monkeypatch.setattr(gpu_solve, "_kernel", lambda *args: kernel)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(gpu_solve, "LAUNCH_MIN", 16)
    batch = 50
    mu = torch.linspace(0.5, 25.0, batch, dtype=torch.float64)
    grid = torch.linspace(0, 3, 4, dtype=torch.float64).repeat(batch, 1) * torch.linspace(1, 2, batch)[:, None]
    y0 = torch.tensor([[2.0, 0.0]], dtype=torch.float64).expand(batch, 2)  # not contiguous
    seen = []
    got = gpu_solve.solve_gpu(VDP, y0, 0.0, grid[:, -1], grid, params={"mu": mu}, method="tsit5", rtol=1e-7,
                              atol=1e-8, progress=seen.append, threads_per_block=8)
    want = solve_native_arrays(VDP, y0.numpy(), 0.0, grid[:, -1].numpy(), grid.numpy(),
                               params={"mu": mu.numpy()}, method="tsit5", rtol=1e-7, atol=1e-8)
    assert [launch[2:] for launch in kernel.launches] == [(0, 16), (16, 32), (32, 48), (48, 50)]
    assert kernel.launches[0][:2] == (2, 8) and kernel.launches[-1][:2] == (1, 8)
    assert [p.finished for p in seen] == [16, 32, 48, 50] and seen[-1].loop_iterations == want.stats["n_steps"].sum()
    assert got.y.dtype == torch.float64 and got.extra["engine"] == "native-cuda"
    np.testing.assert_array_equal(got.y.numpy(), want.y)
    for name in ("n_steps", "n_accepted", "n_rejected", "n_f_evals"):
        np.testing.assert_array_equal(got.stats[name].numpy(), want.stats[name])
    np.testing.assert_array_equal(got.status.numpy(), want.status)
    with pytest.raises(ValueError, match="parameter 'mu' has no value"):
        gpu_solve.solve_gpu(VDP, y0, 0.0, 1.0)
    empty = gpu_solve.solve_gpu(VDP, y0[:0], 0.0, 1.0, params={"mu": 1.0})
    assert empty.y.shape == (0, 2, 2) and len(kernel.launches) == 4  # nothing launched


def test_the_float32_build_takes_the_steps_of_the_pytorch_loop_in_float32(tmp_path, monkeypatch):
    """The float32 text (every literal a float, no double left), run on the host through solve_gpu."""
    from odecli.ode.gpu import solve as gpu_solve
    from odecli.ode.solver import solve

    source = cuda_source(VDP, "dopri5", single=True)
    assert "ODECLI_FLOAT" in source and "0.2f" in source and "0x7ff8000000000000LL" in source
    kernel = HostKernel(host_build(source, tmp_path))
    monkeypatch.setattr(gpu_solve, "unsupported_reason", lambda *args: "")
    monkeypatch.setattr(gpu_solve, "_kernel", lambda *args: kernel)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    batch = 40
    mu = torch.linspace(0.5, 25.0, batch)
    y0 = torch.tensor([[2.0, 0.0]]).repeat(batch, 1)
    grid = torch.linspace(0, 10, 11)
    got = gpu_solve.solve_gpu(VDP, y0, 0.0, 10.0, grid, params={"mu": mu}, rtol=TOL32, atol=TOL32)

    def vdp(t, y, p):
        return torch.stack([y[:, 1], p["mu"] * (1 - y[:, 0] ** 2) * y[:, 1] - y[:, 0]], dim=-1)

    want = solve(vdp, y0, 0.0, 10.0, grid, params={"mu": mu}, rtol=TOL32, atol=TOL32)
    double = solve_native_arrays(VDP, y0.double().numpy(), 0.0, 10.0, grid.double().numpy(),
                                 params={"mu": mu.double().numpy()}, rtol=TOL32, atol=TOL32)
    assert torch.equal(got.status, want.status)
    same = got.stats["n_steps"] == want.stats["n_steps"]
    assert float(same.float().mean()) >= 0.9
    assert bool(((got.stats["n_steps"] - want.stats["n_steps"]).abs() <= 2).all())
    assert not np.array_equal(got.stats["n_steps"].numpy(), double.stats["n_steps"])  # float32 indeed
    torch.testing.assert_close(got.y[same], want.y[same], rtol=1e-3, atol=1e-3)


def test_events_in_the_cuda_text_are_the_cpu_solvers_also_beyond_the_first_room(tmp_path, monkeypatch):
    """Oscillators crossing x = 0 up to 25 times (beyond FIRST_CAP = 16: those samples are solved
    again), a terminal event ending some samples, through solve_gpu with the host build."""
    from odecli.ode.gpu import solve as gpu_solve
    from odecli.ode.native import NativeEvent

    rhs = NativeRhs(("y[1]", "-(p[0] * p[0]) * y[0]"), ("w",),
                    (NativeEvent("y[0]", 0, 0, "cross"), NativeEvent("y[1] - 7.5", 1, 2, "fast")))
    kernel = HostKernel(host_build(cuda_source(rhs, "tsit5"), tmp_path), nvrtc.ENTRY_EVENTS)
    monkeypatch.setattr(gpu_solve, "unsupported_reason", lambda *args: "")
    monkeypatch.setattr(gpu_solve, "_kernel", lambda *args: kernel)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    w = np.linspace(0.5, 8.0, 24)
    y0 = np.tile([1.0, 0.0], (24, 1))
    got = gpu_solve.solve_gpu(rhs, torch.from_numpy(y0), 0.0, 10.0, torch.linspace(0, 10, 5, dtype=torch.float64),
                              params={"w": torch.from_numpy(w)}, method="tsit5", rtol=1e-8, atol=1e-8)
    want = solve_native_arrays(rhs, y0, 0.0, 10.0, np.linspace(0, 10, 5), params={"w": w}, method="tsit5",
                               rtol=1e-8, atol=1e-8)
    assert want.events["cross"].count.max() > 16 and (want.status == Status.EVENT).any()
    assert len(kernel.launches) == 2 and kernel.launches[1][3] < 24  # the second solve: only those beyond 16
    np.testing.assert_array_equal(got.status.numpy(), want.status)
    np.testing.assert_array_equal(got.y.numpy(), want.y)
    for name in ("cross", "fast"):
        np.testing.assert_array_equal(got.events[name].count.numpy(), want.events[name].count)
        np.testing.assert_array_equal(got.events[name].t.numpy(), want.events[name].t)
        np.testing.assert_array_equal(got.events[name].y.numpy(), want.events[name].y)


@gpu
def test_odecli_solve_and_solve_native_on_cuda_run_the_kernel(tmp_path):
    from odecli.ode.native import solve_native

    spec = _spec(tmp_path, solver={"device": "cuda", "dtype": "float32"},
                 events=[{"name": "cross", "expression": "x"}])
    solution = runner.solve_spec(spec)
    assert solution.extra["engine"] == "native-cuda" and solution.y.dtype == torch.float32 and solution.y.is_cuda
    assert "cross" in solution.events
    y0, grid, params = _vdp_batch(64)
    direct = solve_native(VDP, y0, 0.0, 10.0, grid, params=params)
    assert direct.extra["engine"] == "native-cuda" and bool((direct.status == 0).all())
