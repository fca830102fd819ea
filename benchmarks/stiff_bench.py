"""Stiff benchmark: batched odecli (rodas5, kvaerno5) vs scipy Radau / BDF / LSODA per-sample loops.

Problems (float64, rtol = 1e-6):
  * Robertson to t = 1e5 with rate constants spread log-uniformly (k1 in 0.04 x [0.5, 2],
    k2 in 3e7 x [0.1, 10], k3 in 1e4 x [0.3, 3]); atol = 1e-10.
  * Van der Pol with mu log-uniform in [100, 1000], x(0) = 2, v(0) = 0, to t = 2 mu (about 1.2
    periods per sample, per-sample spans); atol = 1e-6.
Batches 1, 64, 1024. scipy runs one sample at a time; for batches above --scipy-max (default 64)
it solves the first --scipy-max samples and extrapolates time and counts linearly to the batch
(the table says so). Counts are totals over the batch: steps (attempted, odecli; accepted+rejected
is not exposed by scipy, so scipy's are accepted steps), f-evals, Jacobians (scipy: njev) and LUs.

Usage: python benchmarks/stiff_bench.py [--batches 1 64 1024] [--scipy-max 64] [--markdown]
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import numpy as np
import torch
from scipy.integrate import solve_ivp

from odecli.ode.solver import solve

RTOL = 1e-6


def rober(t, y, p):
    y1, y2, y3 = y[:, 0], y[:, 1], y[:, 2]
    r1, r2, r3 = p["k1"] * y1, p["k3"] * y2 * y3, p["k2"] * y2 * y2
    return torch.stack([-r1 + r2, r1 - r2 - r3, r3], dim=-1)


def vdp(t, y, p):
    x, v = y[:, 0], y[:, 1]
    return torch.stack([v, p["mu"] * (1 - x * x) * v - x], dim=-1)


def problem(name: str, batch: int):
    rng = np.random.default_rng(0)
    if name == "robertson":
        params = {
            "k1": 0.04 * np.exp(rng.uniform(math.log(0.5), math.log(2.0), batch)),
            "k2": 3e7 * np.exp(rng.uniform(math.log(0.1), math.log(10.0), batch)),
            "k3": 1e4 * np.exp(rng.uniform(math.log(0.3), math.log(3.0), batch)),
        }
        y0 = np.tile([1.0, 0.0, 0.0], (batch, 1))
        t_end = np.full(batch, 1e5)
        return rober, params, y0, t_end, 1e-10
    params = {"mu": np.exp(rng.uniform(math.log(100.0), math.log(1000.0), batch))}
    y0 = np.tile([2.0, 0.0], (batch, 1))
    return vdp, params, y0, 2.0 * params["mu"], 1e-6


def scipy_rhs(name: str, p: dict[str, float]):
    if name == "robertson":
        k1, k2, k3 = p["k1"], p["k2"], p["k3"]

        def f(t, y):
            return [-k1 * y[0] + k3 * y[1] * y[2], k1 * y[0] - k3 * y[1] * y[2] - k2 * y[1] ** 2, k2 * y[1] ** 2]

        def jac(t, y):
            return [[-k1, k3 * y[2], k3 * y[1]], [k1, -k3 * y[2] - 2 * k2 * y[1], -k3 * y[1]], [0, 2 * k2 * y[1], 0]]
    else:
        mu = p["mu"]

        def f(t, y):
            return [y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]]

        def jac(t, y):
            return [[0.0, 1.0], [-2 * mu * y[0] * y[1] - 1, mu * (1 - y[0] ** 2)]]
    return f, jac


def run_odecli(name, method, batch):
    f, params, y0, t_end, atol = problem(name, batch)
    tp = {k: torch.tensor(v) for k, v in params.items()}
    solve(f, torch.tensor(y0[:1]), 0.0, torch.tensor(t_end[:1]), params={k: v[:1] for k, v in tp.items()},
          method=method, rtol=RTOL, atol=atol, max_steps=50_000)  # warm-up
    started = time.perf_counter()
    sol = solve(f, torch.tensor(y0), 0.0, torch.tensor(t_end), params=tp, method=method, rtol=RTOL, atol=atol,
                max_steps=50_000)
    wall = time.perf_counter() - started
    s = sol.stats
    return {
        "ok": int((sol.status == 0).sum()), "steps": int(s["n_steps"].sum()), "max_steps": int(s["n_steps"].max()),
        "fevals": int(s["n_f_evals"].sum()), "jacs": int(s["n_jac_evals"].sum()), "lus": int(s["n_lu_decomps"].sum()),
        "newton": int(s["n_newton_iters"].sum()), "wall": wall, "note": "",
    }


def run_scipy(name, method, batch, scipy_max):
    _, params, y0, t_end, atol = problem(name, batch)
    m = min(batch, scipy_max)
    tot = {"ok": 0, "steps": 0, "fevals": 0, "jacs": 0, "lus": 0}
    started = time.perf_counter()
    for i in range(m):
        f, jac = scipy_rhs(name, {k: float(v[i]) for k, v in params.items()})
        r = solve_ivp(f, (0.0, float(t_end[i])), y0[i], method=method, rtol=RTOL, atol=atol, jac=jac)
        tot["ok"] += int(r.success)
        tot["steps"] += len(r.t) - 1
        tot["fevals"] += r.nfev
        tot["jacs"] += r.njev
        tot["lus"] += r.nlu
    wall = time.perf_counter() - started
    scale = batch / m
    out = {k: int(round(v * scale)) for k, v in tot.items()}
    out.update(wall=wall * scale, newton=0, max_steps=0, note=f"{m} of {batch} run, x{scale:g}" if m < batch else "")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 1024])
    ap.add_argument("--problems", nargs="+", default=["robertson", "vanderpol"])
    ap.add_argument("--scipy-max", type=int, default=64)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"# torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads, rtol={RTOL}")
    print("| problem | batch | solver | ok | steps | f-evals | Jacobians | LUs | Newton its | wall s | note |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in args.problems:
        for batch in args.batches:
            rows = [(f"odecli {m}", run_odecli(name, m, batch)) for m in ("rodas5", "kvaerno5")]
            rows += [(f"scipy {m}", run_scipy(name, m, batch, args.scipy_max)) for m in ("Radau", "BDF", "LSODA")]
            for label, r in rows:
                print(f"| {name} | {batch} | {label} | {r['ok']}/{batch} | {r['steps']} | {r['fevals']} | {r['jacs']} | "
                      f"{r['lus']} | {r['newton']} | {r['wall']:.2f} | {r['note']} |", flush=True)


if __name__ == "__main__":
    main()
