"""Every GPU check and benchmark, in one run that fits a lent GPU's few minutes (under 8).

    python benchmarks/gpu_check.py [--batches 10000,100000,1000000] [--budget 300] [--pde-budget 150] [--skip-tests]
    python benchmarks/gpu_check.py --host-dry-run --batches 300 --budget 150  # no GPU: does it all run?

The ODE solvers first, each section skipped once the time budget (seconds, default 300) is spent,
then the acoustic and elastic CUDA kernels (``benchmarks/gpu_pde_check.py``, its own budget,
default 150):

1. ``tests/test_ode_gpu.py`` and ``tests/test_ode_gpu_grad.py`` (the GPU tests, which skip everywhere else);
2. correctness: the generated solver's CUDA kernel (:mod:`odecli.ode.gpu`) against the CPU
   generated solver, VdP B = 4096 for dopri5, tsit5 and dop853, Lorenz, an MLP: equal statuses,
   the share of samples with the same steps, max |dy| where they are the same, and the same with
   fused multiply-adds allowed (``contract=True``);
3. VdP, mu spread over [0.5, 25], dopri5, rtol = atol = 1e-6, t in [0, 10], 11 output times,
   float32 and float64, at each B: the kernel against the batched PyTorch loop on the same card,
   as sample-steps/s (attempted steps summed over samples / wall time) and the ratio kernel /
   peer of wall times;
4. the direct gradient (:mod:`odecli.ode.gpu.gradient`): a VdP fit's loss gradient in mu (data
   from mu, the estimate mu * 1.1; the problem of 3.) against the CPU generated solver's gradient
   at B = 4096 float64 (the share of samples with the same steps, the largest relative difference
   of their gradients), then forward + backward at each B, float32 and float64, the kernel against
   the PyTorch loop's ``adjoint="direct"`` on the same card (only up to ``--grad-loop-max``
   samples, default 10^4: the loop's autograd graph holds every step's tensors, so its memory
   grows with B times the steps; out of memory is reported, not fatal), with the tape memory
   and the number of backward launches; then a neural ODE's gradient (MLP 2-32-32-2, y0 and the
   weights) against the CPU's and the PyTorch loop's at min(largest B, ``--grad-loop-max``);
5. torchode on the VdP problem of 3. (B up to 10^5), where it imports;
6. Lorenz (rho spread over [20, 30]) and an MLP right-hand side (2-32-32-2, tanh: the
   neural-ODE case) at B = 10^5 (or the largest B asked for, if smaller), kernel against the
   PyTorch loop;
7. threads per block (64-512) and contraction on/off at the largest B, float64.

The kernel's time is the median of 3 solves after a warm-up (which compiles, or loads the
cubin from the cache); each peer runs once after a small warm-up (the PyTorch loop's wall time
barely moves with B on a GPU: it is bound by kernel launches).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from odecli.ode.adjoint import odeint  # noqa: E402
from odecli.ode.gpu import gradient as gpu_grad  # noqa: E402
from odecli.ode.gpu import nvrtc, solve_gpu, solve_gpu_with_grad  # noqa: E402
from odecli.ode.native import NativeMLP, NativeRhs, solve_native, solve_native_arrays  # noqa: E402
from odecli.ode.solver import solve  # noqa: E402

VDP_C = NativeRhs(("y[1]", "((p[0] * (1.0 - odecli_sq(y[0]))) * y[1]) - y[0]"), ("mu",))
LORENZ_C = NativeRhs(("p[0] * (y[1] - y[0])", "y[0] * (p[1] - y[2]) - y[1]", "y[0] * y[1] - p[2] * y[2]"),
                     ("sigma", "rho", "beta"))
TOL = {"rtol": 1e-6, "atol": 1e-6}
DEVICE = "cuda"  # a dry run of this script's own code sets "cpu" (tests/test_ode_gpu.py)
START = time.perf_counter()


def vdp(t, y, p):
    x, v = y[:, 0], y[:, 1]
    return torch.stack([v, p["mu"] * (1 - x**2) * v - x], dim=-1)


def lorenz(t, y, p):
    x, v, z = y[:, 0], y[:, 1], y[:, 2]
    return torch.stack([p["sigma"] * (v - x), x * (p["rho"] - z) - v, x * v - p["beta"] * z], dim=-1)


def vdp_problem(batch: int, dtype: torch.dtype):
    device = DEVICE
    mu = torch.linspace(0.5, 25.0, batch, dtype=dtype, device=device)
    y0 = torch.tensor([[2.0, 0.0]], dtype=dtype, device=device).expand(batch, 2).contiguous()
    return y0, torch.linspace(0, 10, 11, dtype=dtype, device=device), {"mu": mu}


def lorenz_problem(batch: int, dtype: torch.dtype):
    device = DEVICE
    rho = torch.linspace(20.0, 30.0, batch, dtype=dtype, device=device)
    params = {"sigma": torch.full_like(rho, 10.0), "rho": rho, "beta": torch.full_like(rho, 8.0 / 3.0)}
    y0 = torch.ones(batch, 3, dtype=dtype, device=device)
    return y0, torch.linspace(0, 10, 11, dtype=dtype, device=device), params


def mlp_module() -> torch.nn.Sequential:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                              torch.nn.Linear(32, 2))
    with torch.no_grad():
        for layer in net[::2]:
            layer.weight.mul_(0.5)
    return net


def left() -> float:
    return BUDGET - (time.perf_counter() - START)


def section(title: str, need: float) -> bool:
    """Print the title; False (and say so) when less than ``need`` seconds of the budget are left."""
    if left() < need:
        print(f"\n## {title}: skipped by the time guard ({left():.0f} s left, needs ~{need:.0f} s)", flush=True)
        return False
    print(f"\n## {title}  [{time.perf_counter() - START:.0f} s elapsed]", flush=True)
    return True


def timed(run: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Median wall time of ``repeats`` runs (synchronised) and the last result."""
    times, result = [], None
    for _ in range(repeats):
        torch.cuda.synchronize()
        began = time.perf_counter()
        result = run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    return statistics.median(times), result


def steps_of(solution) -> float:
    return float(solution.stats["n_steps"].double().sum())


def compare(name: str, rhs, y0, grid, params, method: str = "dopri5", contract: bool = False) -> None:
    """The kernel against the CPU generated solver on the same float64 inputs."""
    got = solve_gpu(rhs, y0, 0.0, 10.0, grid, params=params, method=method, contract=contract, **TOL)
    want = solve_native_arrays(rhs, y0.cpu().numpy(), 0.0, 10.0, grid.cpu().numpy(),
                               params={k: v.cpu().numpy() for k, v in params.items()}, method=method, **TOL)
    status_equal = bool((got.status.cpu().numpy() == want.status).all())
    same = got.stats["n_steps"].cpu().numpy() == want.stats["n_steps"]
    dy = abs(got.y.cpu().numpy()[same] - want.y[same])
    print(f"{name:28s} {method:7s} contract={str(contract):5s} statuses equal {status_equal}  "
          f"same steps {same.mean() * 100:6.2f} %  max |dy| (same steps) {dy.max() if dy.size else float('nan'):.2e}",
          flush=True)


def correctness() -> None:
    y0, grid, params = vdp_problem(4096, torch.float64)
    for method in ("dopri5", "tsit5", "dop853"):
        compare("VdP B=4096", VDP_C, y0, grid, params, method)
    compare("VdP B=4096", VDP_C, y0, grid, params, "dopri5", contract=True)
    y32, grid32, params32 = vdp_problem(4096, torch.float32)
    got = solve_gpu(VDP_C, y32, 0.0, 10.0, grid32, params=params32, rtol=1e-4, atol=1e-4)
    want = solve(vdp, y32, 0.0, 10.0, grid32, params=params32, rtol=1e-4, atol=1e-4)
    same = got.stats["n_steps"] == want.stats["n_steps"]
    print(f"{'VdP B=4096 float32 build':28s} vs the PyTorch loop in float32 (rtol=atol=1e-4): statuses equal "
          f"{bool(torch.equal(got.status, want.status))}  same steps {float(same.double().mean()) * 100:6.2f} %  "
          f"max |dy| (same steps) {float((got.y[same] - want.y[same]).abs().max()):.2e}", flush=True)
    events()
    ly0, lgrid, lparams = lorenz_problem(4096, torch.float64)
    compare("Lorenz B=4096 (chaotic)", LORENZ_C, ly0, lgrid, lparams)
    net = mlp_module().double()
    my0 = torch.randn(4096, 2, dtype=torch.float64, device=DEVICE)
    compare("MLP 2-32-32-2 B=4096", NativeMLP.from_module(net), my0, grid, {})


def events() -> None:
    """Oscillators crossing x = 0 up to 25 times (the kernel solves again those beyond its first
    room), one terminal event: the kernel's event times against the CPU generated solver's."""
    from odecli.ode.native import NativeEvent

    rhs = NativeRhs(("y[1]", "-(p[0] * p[0]) * y[0]"), ("w",),
                    (NativeEvent("y[0]", 0, 0, "cross"), NativeEvent("y[1] - 7.5", 1, 2, "fast")))
    w = torch.linspace(0.5, 8.0, 4096, dtype=torch.float64, device=DEVICE)
    y0 = torch.tensor([[1.0, 0.0]], dtype=torch.float64, device=DEVICE).repeat(4096, 1)
    grid = torch.linspace(0, 10, 5, dtype=torch.float64, device=DEVICE)
    got = solve_gpu(rhs, y0, 0.0, 10.0, grid, params={"w": w}, method="tsit5", rtol=1e-8, atol=1e-8)
    want = solve_native_arrays(rhs, y0.cpu().numpy(), 0.0, 10.0, grid.cpu().numpy(), params={"w": w.cpu().numpy()},
                               method="tsit5", rtol=1e-8, atol=1e-8)
    for name in ("cross", "fast"):
        counts = bool((got.events[name].count.cpu().numpy() == want.events[name].count).all())
        dt = abs(got.events[name].t.cpu().numpy() - want.events[name].t)
        print(f"{'events ' + name + ' B=4096':28s} tsit5   counts equal {counts}  max |t - t_cpu| {float(dt[dt == dt].max()):.2e}  "
              f"statuses equal {bool((got.status.cpu().numpy() == want.status).all())}", flush=True)


def kernel_vs_loop(label: str, rhs_c, rhs_torch, problem, batch: int, dtype: torch.dtype,
                   peers: bool = True) -> None:
    y0, grid, params = problem(batch, dtype)
    solve_gpu(rhs_c, y0[:256], 0.0, 10.0, grid, params={k: v[:256] for k, v in params.items()}, **TOL)
    wall, sol = timed(lambda: solve_gpu(rhs_c, y0, 0.0, 10.0, grid, params=params, **TOL), 3)
    ok = float((sol.status == 0).double().mean())
    kernel_rate = steps_of(sol) / wall
    line = (f"{label:8s} {str(dtype)[6:]:7s} B={batch:>8d}  kernel {wall:8.4f} s {kernel_rate / 1e9:8.4g} G sample-steps/s"
            f" (ok {ok * 100:.1f} %)")
    if peers:
        with torch.no_grad():
            solve(rhs_torch, y0[:64], 0.0, 10.0, grid, params={k: v[:64] for k, v in params.items()}, **TOL)
            loop_wall, loop = timed(lambda: solve(rhs_torch, y0, 0.0, 10.0, grid, params=params, **TOL), 1)
        line += (f" | PyTorch loop {loop_wall:7.3f} s {steps_of(loop) / loop_wall / 1e9:8.4g} G/s"
                 f" | loop / kernel wall {loop_wall / wall:7.1f}x")
    print(line, flush=True)


def fit_problem(batch: int, dtype: torch.dtype):
    """The VdP problem with data from mu and the fit's estimate mu * 1.1."""
    y0, grid, params = vdp_problem(batch, dtype)
    data = solve_gpu(VDP_C, y0, 0.0, 10.0, grid, params=params, **TOL).y
    return y0, grid, data, params["mu"] * 1.1


def fit_gradient(solver, y0, grid, data, estimate):
    """The loss sum((y - data)^2) and its gradient in mu through ``solver``; (solution, gradient)."""
    with torch.enable_grad():
        mu = estimate.detach().clone().requires_grad_()
        solution = solver(y0, grid, mu)
        loss = (solution.y - data).nan_to_num(0.0).square().sum()
        (gradient,) = torch.autograd.grad(loss, (mu,))
    return solution, gradient


def by_kernel(y0, grid, mu):
    return solve_gpu_with_grad(VDP_C, y0, 0.0, 10.0, grid, params={"mu": mu}, **TOL)


def by_loop(y0, grid, mu):
    return odeint(vdp, y0, 0.0, 10.0, grid, params={"mu": mu}, adjoint="direct", **TOL)


def gradient_agreement() -> None:
    """The kernel's gradient against the CPU generated solver's, same inputs, float64."""
    y0, grid, data, estimate = fit_problem(4096, torch.float64)
    got, g_gpu = fit_gradient(by_kernel, y0, grid, data, estimate)
    cpu = lambda y0, grid, mu: solve_native(VDP_C, y0, 0.0, 10.0, grid, params={"mu": mu}, **TOL)  # noqa: E731
    want, g_cpu = fit_gradient(cpu, y0.cpu(), grid.cpu(), data.cpu(), estimate.cpu())
    same = (got.stats["n_steps"].cpu() == want.stats["n_steps"]).numpy()
    rel = ((g_gpu.cpu() - g_cpu).abs() / g_cpu.abs().clamp_min(1e-300)).numpy()[same]
    registers = next(iter(gpu_grad._KERNELS.values())).registers()
    print(f"{'VdP fit gradient B=4096':28s} dopri5  engine {got.extra.get('gradient')}  same steps {same.mean() * 100:6.2f} %"
          f"  max rel |dgrad| (same steps) {rel.max() if rel.size else float('nan'):.2e}"
          f"  gradient kernel registers/thread {registers}", flush=True)


def mlp_gradient(batch: int, loop_max: int) -> None:
    """A neural ODE's loss gradient in y0 and the weights (MLP 2-32-32-2 tanh, float64, t in [0, 2]):
    the kernel against the CPU generated solver (at most 4096 samples) and, timed, against the
    PyTorch loop's direct gradient."""
    net = mlp_module().double().to(DEVICE)
    native, weights = NativeMLP.from_module(net), list(net.parameters())
    torch.manual_seed(2)
    y0 = torch.randn(batch, 2, dtype=torch.float64, device=DEVICE)
    grid = torch.linspace(0, 2, 5, dtype=torch.float64, device=DEVICE)

    def gradients(solve_with, start):
        with torch.enable_grad():
            start = start.clone().requires_grad_()
            solution = solve_with(start)
            loss = solution.y.square().sum()
            return solution, torch.autograd.grad(loss, [start, *weights])

    kernel = lambda start: solve_gpu_with_grad(native, start, 0.0, 2.0, grid, **TOL)  # noqa: E731
    gradients(kernel, y0[:64])
    wall, (sol, got) = timed(lambda: gradients(kernel, y0), 3)
    n = min(batch, 4096)
    cpu_net = mlp_module().double()
    cpu_native, cpu_weights = NativeMLP.from_module(cpu_net), list(cpu_net.parameters())
    with torch.enable_grad():
        start = y0[:n].cpu().clone().requires_grad_()
        loss = solve_native(cpu_native, start, 0.0, 2.0, grid.cpu(), **TOL).y.square().sum()
        want = torch.autograd.grad(loss, [start, *cpu_weights])
    _, part = gradients(kernel, y0[:n])
    rel = max(float(((g.cpu() - w).abs().max() / w.abs().max())) for g, w in zip(part, want))
    line = (f"MLP grad float64 B={batch:>8d}  kernel fwd+bwd {wall:8.4f} s ({sol.extra['tape_launches']} launch(es))"
            f" {steps_of(sol) / wall / 1e9:8.4g} G sample-steps/s  max rel |dgrad| vs CPU (B={n}) {rel:.2e}")
    if batch <= loop_max:
        loop = lambda start: odeint(lambda t, y, p: net(y), start, 0.0, 2.0, grid, adjoint="direct", **TOL)  # noqa: E731
        try:
            gradients(loop, y0[:64])
            loop_wall, _ = timed(lambda: gradients(loop, y0), 1)
            line += f" | PyTorch loop direct {loop_wall:8.3f} s | loop / kernel wall {loop_wall / wall:7.1f}x"
        except torch.cuda.OutOfMemoryError:
            line += " | PyTorch loop direct: out of memory"
    print(line, flush=True)


def gradient_timing(batch: int, dtype: torch.dtype, loop_max: int) -> None:
    y0, grid, data, estimate = fit_problem(batch, dtype)
    fit_gradient(by_kernel, y0[:256], grid, data[:256], estimate[:256])  # compiles, or loads the cubins
    wall, (sol, _) = timed(lambda: fit_gradient(by_kernel, y0, grid, data, estimate), 3)
    forward, _ = timed(lambda: solve_gpu(VDP_C, y0, 0.0, 10.0, grid, params={"mu": estimate}, **TOL), 1)
    line = (f"VdP grad {str(dtype)[6:]:7s} B={batch:>8d}  kernel fwd+bwd {wall:8.4f} s (forward alone {forward:7.4f} s,"
            f" tapes {sol.extra['tape_bytes'] / 2**30:6.2f} GiB a launch, {sol.extra['tape_launches']} launch(es))"
            f" {steps_of(sol) / wall / 1e9:8.4g} G sample-steps/s")
    if batch <= loop_max:
        try:
            fit_gradient(by_loop, y0[:64], grid, data[:64], estimate[:64])
            loop_wall, _ = timed(lambda: fit_gradient(by_loop, y0, grid, data, estimate), 1)
            line += f" | PyTorch loop direct {loop_wall:8.3f} s | loop / kernel wall {loop_wall / wall:7.1f}x"
        except torch.cuda.OutOfMemoryError:
            line += " | PyTorch loop direct: out of memory"
        torch.cuda.empty_cache()
    else:
        line += f" | PyTorch loop direct: not run above --grad-loop-max {loop_max}"
    print(line, flush=True)


def torchode_peer(batch: int, dtype: torch.dtype) -> None:
    try:
        import torchode as to
    except ImportError as exc:
        print(f"torchode not importable: {exc}")
        return
    def solver_of(mu: torch.Tensor):
        def f(t, y):
            return torch.stack([y[:, 1], mu * (1 - y[:, 0] ** 2) * y[:, 1] - y[:, 0]], dim=-1)

        term = to.ODETerm(f)
        return to.AutoDiffAdjoint(to.Dopri5(term=term), to.IntegralController(term=term, **TOL))

    y0, grid, params = vdp_problem(batch, dtype)
    warm_y0, warm_grid, warm_params = vdp_problem(64, dtype)
    solver_of(warm_params["mu"]).solve(to.InitialValueProblem(y0=warm_y0, t_eval=warm_grid.expand(64, -1)))
    solver, problem = solver_of(params["mu"]), to.InitialValueProblem(y0=y0, t_eval=grid.expand(batch, -1))
    wall, sol = timed(lambda: solver.solve(problem), 1)
    steps = float(sol.stats["n_steps"].double().sum())
    print(f"torchode {str(dtype)[6:]:7s} B={batch:>8d}  {wall:8.4f} s {steps / wall / 1e9:8.4g} G sample-steps/s", flush=True)


def tuning(batch: int) -> None:
    from odecli.ode.gpu import solve as gpu_solve

    y0, grid, params = vdp_problem(batch, torch.float64)
    for threads in (64, 128, 256, 512):
        wall, sol = timed(lambda: solve_gpu(VDP_C, y0, 0.0, 10.0, grid, params=params, threads_per_block=threads,
                                            **TOL), 3)
        print(f"threads/block {threads:4d}: {wall:8.4f} s {steps_of(sol) / wall / 1e9:8.4g} G sample-steps/s", flush=True)
    solve_gpu(VDP_C, y0[:256], 0.0, 10.0, grid, params={"mu": params["mu"][:256]}, contract=True, **TOL)
    wall, sol = timed(lambda: solve_gpu(VDP_C, y0, 0.0, 10.0, grid, params=params, contract=True, **TOL), 3)
    print(f"contract=True (FMA): {wall:8.4f} s {steps_of(sol) / wall / 1e9:8.4g} G sample-steps/s", flush=True)
    kernel = next(iter(gpu_solve._KERNELS.values()))
    print(f"registers per thread: {kernel.registers()}", flush=True)


def host_dry_run() -> None:
    """``--host-dry-run``: this script's own code run without a GPU, on the CPU, with the CUDA text
    built for the host by g++ as its kernel (``tests/gpu_host.py``). Its times mean nothing; it
    checks that every section runs before a lent GPU's minutes are spent on it."""
    global DEVICE
    import hashlib
    import tempfile

    sys.path.insert(0, str(ROOT / "tests"))
    from gpu_host import HostKernel, host_build
    from odecli.ode.gpu import solve as gpu_solve
    from odecli.ode.gpu.source import cuda_gradient_source, cuda_source

    folder = Path(tempfile.mkdtemp(prefix="odecli-gpu-dry-run-"))

    def kernel(rhs, method: str, device, contract: bool, single: bool = False, entry: str = nvrtc.ENTRY):
        key = (method, rhs.c_source(), contract, single, entry)
        if key not in gpu_solve._KERNELS:
            where = folder / hashlib.sha1(repr(key).encode()).hexdigest()[:12]
            where.mkdir()
            gpu_solve._KERNELS[key] = HostKernel(host_build(cuda_source(rhs, method, single), where), entry)
        return gpu_solve._KERNELS[key]

    def gradient_kernel(rhs, method: str, device, contract: bool, single: bool = False):
        key = ("gradient", method, rhs.c_source(), contract, single)
        if key not in gpu_grad._KERNELS:
            where = folder / hashlib.sha1(repr(key).encode()).hexdigest()[:12]
            where.mkdir()
            gpu_grad._KERNELS[key] = HostKernel(host_build(cuda_gradient_source(rhs, method, single), where),
                                                "gradient_samples_cuda")
        return gpu_grad._KERNELS[key]

    gpu_solve.unsupported_reason = gpu_grad.unsupported_reason = lambda *args: ""
    gpu_solve._kernel = kernel
    gpu_grad._gradient_kernel = gradient_kernel
    torch.cuda.synchronize = lambda *args: None
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_name = lambda *args: "host dry run (the CUDA text built by g++: times mean nothing)"
    DEVICE = "cpu"


def main() -> None:
    global BUDGET
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="10000,100000,1000000")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds; ODE sections beyond it are skipped")
    parser.add_argument("--pde-budget", type=float, default=150.0,
                        help="seconds for benchmarks/gpu_pde_check.py, run last (0: skip it)")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--grad-loop-max", type=int, default=10_000,
                        help="largest B at which the PyTorch loop's direct gradient runs (its graph grows with B)")
    parser.add_argument("--host-dry-run", action="store_true",
                        help="no GPU: run every section on the CPU with the CUDA text built for the host")
    args = parser.parse_args()
    if args.host_dry_run:
        host_dry_run()
        args.skip_tests = True
    BUDGET = args.budget
    torch.set_grad_enabled(False)  # the GPU solver records no gradient; the MLP's weights require grad
    batches = [int(b) for b in args.batches.split(",")]
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), flush=True)
    why = nvrtc.available()
    print("NVRTC", why or ".".join(map(str, nvrtc.version())), flush=True)
    if not torch.cuda.is_available() or why:
        print("no CUDA GPU or no NVRTC here: nothing to check")
        return
    print(torch.cuda.get_device_name(0), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), flush=True)
    if not args.skip_tests and section("tests/test_ode_gpu.py, tests/test_ode_gpu_grad.py", 60):
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               str(ROOT / "tests" / "test_ode_gpu.py"), str(ROOT / "tests" / "test_ode_gpu_grad.py")],
                              capture_output=True, text=True, timeout=240)
        print(done.stdout[-3000:], done.stderr[-2000:], flush=True)
    if section("correctness: kernel against the CPU generated solver (float64)", 40):
        correctness()
    for dtype in (torch.float32, torch.float64):
        for batch in batches:
            if section(f"VdP dopri5 {str(dtype)[6:]} B={batch}", 20 + batch / 1e5):
                kernel_vs_loop("VdP", VDP_C, vdp, vdp_problem, batch, dtype)
    if section("gradient: kernel against the CPU generated solver's (float64)", 30):
        gradient_agreement()
    for dtype in (torch.float32, torch.float64):
        for batch in batches:
            if section(f"VdP fit gradient {str(dtype)[6:]} B={batch}", 20 + batch / 1e5):
                gradient_timing(batch, dtype, args.grad_loop_max)
    mlp_batch = min(max(batches), args.grad_loop_max)
    if section(f"MLP 2-32-32-2 fit gradient float64 B={mlp_batch}", 40):
        mlp_gradient(mlp_batch, args.grad_loop_max)
    for batch in batches:
        if batch <= 100_000 and section(f"torchode VdP float32 B={batch}", 30):
            try:
                torchode_peer(batch, torch.float32)
            except Exception as exc:  # a peer's failure must not stop the checks
                print(f"torchode failed: {type(exc).__name__}: {exc}")
    side = min(100_000, max(batches))  # Lorenz and the MLP: 1e5 samples, fewer in a dry run
    if section(f"Lorenz dopri5 float32 B={side}", 30):
        kernel_vs_loop("Lorenz", LORENZ_C, lorenz, lorenz_problem, side, torch.float32)
    if section(f"MLP 2-32-32-2 tanh float32 B={side}", 40):
        net = mlp_module().to(DEVICE)

        def mlp_problem(batch: int, dtype: torch.dtype):
            torch.manual_seed(1)
            return (torch.randn(batch, 2, dtype=dtype, device=DEVICE),
                    torch.linspace(0, 10, 11, dtype=dtype, device=DEVICE), {})

        native = NativeMLP.from_module(net)
        kernel_vs_loop("MLP", native, lambda t, y, p: net.to(y.dtype)(y), mlp_problem, side, torch.float32)
    if section(f"tuning at B={max(batches)} float64", 30):
        tuning(max(batches))
    if args.pde_budget > 0:
        print("\n== benchmarks/gpu_pde_check.py (the acoustic and elastic CUDA kernels)", flush=True)
        pde = [sys.executable, str(ROOT / "benchmarks" / "gpu_pde_check.py"), "--budget", str(args.pde_budget)]
        pde += ["--host-dry-run"] if args.host_dry_run else ["--skip-tests"] if args.skip_tests else []
        try:
            subprocess.run(pde, cwd=ROOT, check=False, timeout=args.pde_budget + 120)
        except subprocess.TimeoutExpired:
            print("gpu_pde_check.py ran past its budget + 120 s: stopped")
    print(f"\ntotal {time.perf_counter() - START:.0f} s", flush=True)


BUDGET = 300.0

if __name__ == "__main__":
    main()
