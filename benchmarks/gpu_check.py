"""GPU check, run by hand where a GPU is lent: batched VdP throughput and CUDA-vs-CPU agreement.

    python benchmarks/gpu_check.py [--batches 10000,100000,1000000] [--compile]

Prints sample-steps per second (sum over samples of attempted steps / wall time) for van der
Pol with mu spread over [0.5, 25], dopri5, rtol = atol = 1e-6, t in [0, 10], 11 eval times,
and checks that a small batch solved on CUDA matches the CPU solve to round-off.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from odecli.ode.solver import solve  # noqa: E402


def vdp(t, y, p):
    x, v = y[:, 0], y[:, 1]
    return torch.stack([v, p["mu"] * (1 - x**2) * v - x], dim=-1)


def problem(batch: int, dtype: torch.dtype, device: str):
    mu = torch.linspace(0.5, 25.0, batch, dtype=dtype, device=device)
    y0 = torch.tensor([[2.0, 0.0]], dtype=dtype, device=device).expand(batch, 2).contiguous()
    grid = torch.linspace(0, 10, 11, dtype=dtype, device=device)
    return y0, grid, {"mu": mu}


def timed(batch: int, dtype: torch.dtype, device: str, compiled: bool) -> tuple[float, float, float]:
    y0, grid, params = problem(batch, dtype, device)
    mode = "wait" if compiled else False  # the warm-up compiles, so the timed solve runs compiled throughout
    solve(vdp, y0[:64], 0.0, 10.0, grid, params={"mu": params["mu"][:64]}, compile=mode)  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    sol = solve(vdp, y0, 0.0, 10.0, grid, params=params, compile=mode)
    if device == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    steps = float(sol.stats["n_steps"].double().sum())
    assert bool((sol.status == 0).all())
    return wall, steps, float(sol.stats["n_steps"].max())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="10000,100000,1000000")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    print("torch", torch.__version__, "cuda", torch.cuda.is_available(), flush=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        print(torch.cuda.get_device_name(0), flush=True)
        y0, grid, params = problem(256, torch.float64, "cpu")
        cpu = solve(vdp, y0, 0.0, 10.0, grid, params=params)
        gpu = solve(vdp, y0.cuda(), 0.0, 10.0, grid.cuda(), params={"mu": params["mu"].cuda()})
        same_steps = torch.equal(cpu.stats["n_steps"], gpu.stats["n_steps"].cpu())
        diff = float((cpu.y - gpu.y.cpu()).abs().max())
        print(f"cuda vs cpu (B=256, float64): same steps {same_steps}, max |dy| {diff:.2e}", flush=True)
    modes = [False, True] if args.compile else [False]
    for compiled in modes:
        for dtype in (torch.float32, torch.float64):
            for batch in (int(b) for b in args.batches.split(",")):
                wall, steps, max_steps = timed(batch, dtype, device, compiled)
                print(f"{device} {'compiled' if compiled else 'eager':8s} {str(dtype)[6:]:7s} B={batch:>8d} "
                      f"wall {wall:7.3f} s  loop iterations {max_steps:.0f}  "
                      f"{steps / wall / 1e6:8.2f} M sample-steps/s", flush=True)


if __name__ == "__main__":
    main()
