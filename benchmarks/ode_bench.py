#!/usr/bin/env python
"""Benchmark odecli's batched ODE solver against torchode, torchdiffeq and scipy, side by side.

Method (see benchmarks/README.md and /work/shared/peers/README.md for the rationale):

* Every configuration (problem, batch B, tolerance, thread count) runs every solver once untimed
  (the "1st call" time, which includes compilation for compiled rows), then ``--repeats`` timed
  runs *round-robin* over the solvers (run 1 of every solver, then run 2, ...), and reports the
  median. Round-robin makes slow drift of the machine hit all solvers alike.
* ``steps`` are attempted steps (accepted + rejected) per sample. ``RHS calls`` are batched RHS
  invocations, counted with a Python wrapper (one scipy invocation evaluates one sample).
* ``floor`` is the time of one bare RHS call at that batch size (no counter), measured in blocks
  of ~6 ms, 5 blocks, median. ``overhead = wall / (rhs_calls * floor)``: 1.0 means all of the
  time is RHS work. scipy uses its one-sample numpy RHS as the floor.
* ``infl max`` = steps_max / scipy RK45 steps_max, ``infl mean`` = steps_mean / scipy steps_mean.
  Above B = 1024 the untimed scipy passes (steps, reference) cover 1024 evenly spread samples.
  The scipy step counts come from the timed scipy row when there is one, otherwise from one
  untimed scipy RK45 pass that is run alongside the reference (``--no-scipy-steps`` skips it).
* ``err`` is per sample ``max_i |y_i(t1) - y_ref,i(t1)|`` against scipy DOP853 at rtol = atol =
  1e-12, solved per sample, untimed and cached in memory; ``err max`` / ``err med`` over samples.
* All float64, dopri5 / RK45 (the same Dormand-Prince 5(4) pair) everywhere.

``TORCHINDUCTOR_AUTOGRAD_CACHE=0`` is set before torch is imported: with torch 2.13 the AOTAutograd
cache can hand compiled torchode a stale tolerance (see the peers README, caveat 3).

Round-robin has one side effect: glibc merges the small blocks a solver frees at the next large
allocation, which can fall in the next solver's timed call. A sub-millisecond solve after an
eager PyTorch one can then take a few ms (one Lotka-Volterra sample: 4.3 ms instead of 0.37 ms,
measured on a 2-core Zen 5 VM on 2026-12-04). With ``GLIBC_TUNABLES=glibc.malloc.mxfast=0`` in the environment glibc merges freed
blocks at once instead, and each solver pays for its own.

Usage::

    python benchmarks/ode_bench.py --problems vdp,lv,mlp --batches 1,64,1024 --tols 1e-6
    python benchmarks/ode_bench.py --quick
    python benchmarks/ode_bench.py --profile          # only the odecli profile (VdP, B=1024)
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")  # must precede `import torch`

import argparse
import datetime
import importlib.util
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

DTYPE = torch.float64
PROBLEMS = ("vdp", "lv", "mlp")
ALL_PEERS = ("torchode", "torchdiffeq", "scipy")
MINE = ("odecli", "odecli compiled", "odecli native")  # rows whose ratios to the peers are reported


# --------------------------------------------------------------------------------------------
# Problems
# --------------------------------------------------------------------------------------------

@dataclass
class Problem:
    name: str
    batch: int
    y0: torch.Tensor  # (B, n)
    t0: float
    t1: float
    params: dict  # per-sample params for odecli (leading dim B)
    f_odecli: Callable  # f(t, y, p)
    f_batch: Callable  # f(t, y) over the full batch, for torchode / torchdiffeq and the floor
    np_rhs: Callable  # np_rhs(i) -> fun(t, y) for sample i (scipy)
    describe: str = ""
    equations: dict | None = None  # spec-style equations (state -> text): the "odecli native" row
    native_rhs: object | None = None  # or the generated solver's right-hand side itself (the MLP)

    @property
    def y0_np(self) -> np.ndarray:
        return self.y0.numpy()


def make_vdp(batch: int) -> Problem:
    mu = torch.tensor([25.0], dtype=DTYPE) if batch == 1 else torch.linspace(0.5, 25.0, batch, dtype=DTYPE)
    y0 = torch.tensor([2.0, 0.0], dtype=DTYPE).expand(batch, 2).clone()

    def f_odecli(t, y, p):
        x, v = y[:, 0], y[:, 1]
        return torch.stack([v, p["mu"] * (1 - x * x) * v - x], dim=-1)

    def f_batch(t, y):
        x, v = y[:, 0], y[:, 1]
        return torch.stack([v, mu * (1 - x * x) * v - x], dim=-1)

    mu_np = mu.numpy()

    def np_rhs(i):
        m = float(mu_np[i])

        def fun(t, y):
            return np.array([y[1], m * (1.0 - y[0] * y[0]) * y[1] - y[0]])
        return fun

    desc = "mu = 25" if batch == 1 else f"mu = linspace(0.5, 25, {batch})"
    return Problem("vdp", batch, y0, 0.0, 10.0, {"mu": mu}, f_odecli, f_batch, np_rhs, f"Van der Pol, y0 = (2, 0), {desc}",
                   equations={"x": "v", "v": "mu * (1 - x * x) * v - x"})


def make_lv(batch: int) -> Problem:
    gen = torch.Generator().manual_seed(0)
    y0 = (1.0 + 2.0 * torch.rand(batch, 2, generator=gen, dtype=DTYPE))

    def f(t, y, p=None):
        x, z = y[:, 0], y[:, 1]
        return torch.stack([1.5 * x - x * z, x * z - 3.0 * z], dim=-1)

    def np_rhs(i):
        def fun(t, y):
            return np.array([1.5 * y[0] - y[0] * y[1], y[0] * y[1] - 3.0 * y[1]])
        return fun

    return Problem("lv", batch, y0, 0.0, 10.0, {}, f, f, np_rhs, "Lotka-Volterra, (x0, y0) ~ U[1,3]^2 (seed 0)",
                   equations={"x": "1.5 * x - x * z", "z": "x * z - 3.0 * z"})


MLP_DIM, MLP_HIDDEN = 32, 64


def make_mlp(batch: int) -> Problem:
    gen = torch.Generator().manual_seed(0)
    w1 = torch.randn(MLP_HIDDEN, MLP_DIM, generator=gen, dtype=DTYPE) / math.sqrt(MLP_DIM)
    b1 = torch.randn(MLP_HIDDEN, generator=gen, dtype=DTYPE) / math.sqrt(MLP_DIM)
    w2 = torch.randn(MLP_DIM, MLP_HIDDEN, generator=gen, dtype=DTYPE) / math.sqrt(MLP_HIDDEN)
    b2 = torch.randn(MLP_DIM, generator=gen, dtype=DTYPE) / math.sqrt(MLP_HIDDEN)
    y0 = torch.randn(batch, MLP_DIM, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    w1t, w2t = w1.T.contiguous(), w2.T.contiguous()

    # Shared weights are closed over (they are not per-sample data, so compaction is harmless).
    def f(t, y, p=None):
        return torch.tanh(y @ w1t + b1) @ w2t + b2

    W1, B1, W2, B2 = w1.numpy(), b1.numpy(), w2.numpy(), b2.numpy()

    def np_rhs(i):
        def fun(t, y):
            return W2 @ np.tanh(W1 @ y + B1) + B2
        return fun

    from odecli.ode.native import NativeMLP

    return Problem("mlp", batch, y0, 0.0, 10.0, {}, f, f, np_rhs,
                   f"MLP neural ODE y' = W2 tanh(W1 y + b1) + b2, dim {MLP_DIM}, hidden {MLP_HIDDEN}, "
                   "weights and biases ~ N(0, 1/fan_in) (seed 0), y0 ~ N(0, 1) (seed 1)",
                   native_rhs=NativeMLP((W1, W2), (B1, B2), ("tanh", "")))


MAKERS = {"vdp": make_vdp, "lv": make_lv, "mlp": make_mlp}


# --------------------------------------------------------------------------------------------
# Counting wrapper, floor, reference
# --------------------------------------------------------------------------------------------

class Counted:
    """Counts invocations; also carries torchdiffeq's accept/reject callbacks."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = self.accepted = self.rejected = 0

    def reset(self):
        self.calls = self.accepted = self.rejected = 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)

    def callback_accept_step(self, t0, y0, dt):
        self.accepted += 1

    def callback_reject_step(self, t0, y0, dt):
        self.rejected += 1


def time_per_call(fn, block_s: float = 6e-3, blocks: int = 5) -> float:
    fn()
    n, t = 1, 0.0
    while True:  # calibrate the block length
        start = time.perf_counter()
        for _ in range(n):
            fn()
        t = time.perf_counter() - start
        if t >= block_s / 4 or n > 1 << 22:
            break
        n *= 2
    n = max(1, int(n * block_s / max(t, 1e-9)))
    per = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        per.append((time.perf_counter() - start) / n)
    return statistics.median(per)


def torch_floor(prob: Problem) -> float:
    t = torch.full((prob.batch,), prob.t0, dtype=DTYPE)
    y = prob.y0.clone()
    return time_per_call(lambda: prob.f_batch(t, y))


def numpy_floor(prob: Problem) -> float:
    fun = prob.np_rhs(0)
    y = prob.y0_np[0].copy()
    return time_per_call(lambda: fun(0.0, y))


_REF_CACHE: dict = {}
_SCIPY_STEPS_CACHE: dict = {}


CHECKED_MAX = 1024  # above this batch, steps and errors are checked on this many evenly spread samples


def checked_rows(batch: int) -> np.ndarray:
    """The samples the untimed scipy passes check: all of them, or CHECKED_MAX spread evenly
    (one scipy pass over 16384 stiff VdP samples at 1e-12 takes over ten minutes)."""
    if batch <= CHECKED_MAX:
        return np.arange(batch)
    return np.unique(np.linspace(0, batch - 1, CHECKED_MAX).round().astype(np.int64))


def reference(prob: Problem, rows: np.ndarray) -> np.ndarray:
    """y(t1) of samples ``rows`` by scipy DOP853 at rtol = atol = 1e-12 (untimed, cached)."""
    from scipy.integrate import solve_ivp

    key = (prob.name, prob.batch, rows.size)
    if key not in _REF_CACHE:
        y0 = prob.y0_np[rows]
        out = np.empty_like(y0)
        for k, i in enumerate(rows):
            sol = solve_ivp(prob.np_rhs(i), (prob.t0, prob.t1), y0[k], method="DOP853", rtol=1e-12, atol=1e-12)
            if sol.status != 0:
                raise RuntimeError(f"reference failed for {key} sample {i}: {sol.message}")
            out[k] = sol.y[:, -1]
        _REF_CACHE[key] = out
    return _REF_CACHE[key]


def scipy_loop(prob: Problem, rtol: float, atol: float, rows: np.ndarray | None = None) -> dict:
    """scipy RK45 sample by sample (all samples, or only ``rows``)."""
    from scipy.integrate import solve_ivp

    rows = np.arange(prob.batch) if rows is None else rows
    y0 = prob.y0_np[rows]
    steps = np.empty(rows.size, dtype=np.int64)
    acc = np.empty(rows.size, dtype=np.int64)
    y_final = np.empty_like(y0)
    calls, ok = 0, True
    for k, i in enumerate(rows):
        sol = solve_ivp(prob.np_rhs(i), (prob.t0, prob.t1), y0[k], method="RK45", rtol=rtol, atol=atol)
        steps[k] = (sol.nfev - 2) // 6  # 2 initial evaluations, then 6 per attempted step (FSAL)
        acc[k] = sol.t.size - 1
        calls += sol.nfev
        y_final[k] = sol.y[:, -1]
        ok &= sol.status == 0
    return {"steps": steps, "accepted": acc, "rhs_calls": calls, "y_final": y_final, "ok": bool(ok),
            "loop_iters": int(steps.sum())}


# --------------------------------------------------------------------------------------------
# Solvers. Each has setup (untimed) and run() -> result dict.
# --------------------------------------------------------------------------------------------

@dataclass
class Solver:
    name: str
    run: Callable[[], dict]
    kind: str = "torch"  # "torch" (batched RHS floor) or "scipy" (one-sample numpy floor)
    timings: list = field(default_factory=list)
    first_call: float = math.nan
    result: dict | None = None
    error: str | None = None


def odecli_solver(prob: Problem, rtol: float, atol: float, compiled: bool = False, chunk: int | None = None) -> Solver:
    """odecli's solve; ``chunk`` overrides its attempts per host read (rows named "... k=<chunk>")."""
    from odecli.ode.solver import CHUNK_STEPS, solve

    # A Python counter inside a compiled region would force recompiles: the compiled row counts
    # batched RHS calls from the solver's own per-sample statistics instead (max over samples).
    fc = Counted(prob.f_odecli)
    f = prob.f_odecli if compiled else fc

    def run():
        fc.reset()
        sol = solve(f, prob.y0, prob.t0, prob.t1, params=prob.params, method="dopri5",
                    rtol=rtol, atol=atol, controller="integral", compile="wait" if compiled else False,
                    chunk=CHUNK_STEPS if chunk is None else chunk)
        st = sol.stats
        calls = int(st["n_f_evals"].max()) if compiled else fc.calls
        return {"steps": st["n_steps"].numpy(), "accepted": st["n_accepted"].numpy(), "rhs_calls": calls,
                "y_final": sol.y_final.numpy(), "ok": bool((sol.status == 0).all()),
                "loop_iters": int(st["n_steps"].max()), "f_evals_max": int(st["n_f_evals"].max())}

    name = "odecli compiled" if compiled else "odecli"
    return Solver(name if chunk is None else f"{name} k={chunk}", run)


def odecli_native_solver(prob: Problem, rtol: float, atol: float) -> Solver:
    """The generated C solver (``solver.engine: native``), from the same equation text a spec holds
    (or, for the MLP, :class:`~odecli.ode.native.NativeMLP` with the same weights).

    Its RHS calls are the per-sample evaluation counts (max over samples), so ``overhead`` compares
    its wall time with that many bare eager torch RHS calls, as for the other rows.
    """
    from odecli.ode.native import NativeRhs, solve_native
    from odecli.specs.expr import expression_to_c

    states = list(prob.equations or {})
    params = list(prob.params)
    symbols = {"t": "t", **{s: f"y[{i}]" for i, s in enumerate(states)}, **{n: f"p[{j}]" for j, n in enumerate(params)}}
    rhs = prob.native_rhs or NativeRhs(tuple(expression_to_c(prob.equations[s], symbols, "bench", s) for s in states),
                                       tuple(params))

    def run():
        sol = solve_native(rhs, prob.y0, prob.t0, prob.t1, params=prob.params, method="dopri5",
                           rtol=rtol, atol=atol, controller="integral")
        st = sol.stats
        return {"steps": st["n_steps"].numpy(), "accepted": st["n_accepted"].numpy(),
                "rhs_calls": int(st["n_f_evals"].max()), "y_final": sol.y_final.numpy(),
                "ok": bool((sol.status == 0).all()), "loop_iters": int(st["n_steps"].max()),
                "f_evals_max": int(st["n_f_evals"].max())}

    return Solver("odecli native", run)


def torchode_solvers(prob: Problem, rtol: float, atol: float, compile_: bool) -> list[Solver]:
    import torchode as to

    def build(fn):
        term = to.ODETerm(fn)
        adj = to.AutoDiffAdjoint(to.Dopri5(term=term), to.IntegralController(atol=atol, rtol=rtol, term=term))
        return adj

    B = prob.batch
    problem = to.InitialValueProblem(y0=prob.y0, t_start=torch.full((B,), prob.t0, dtype=DTYPE),
                                     t_end=torch.full((B,), prob.t1, dtype=DTYPE))
    fc = Counted(prob.f_batch)
    eager = build(fc)

    def unpack(sol, calls):
        return {"steps": sol.stats["n_steps"].numpy(), "accepted": sol.stats["n_accepted"].numpy(),
                "rhs_calls": calls, "y_final": sol.ys[:, -1].numpy(), "ok": bool((sol.status == 0).all()),
                "loop_iters": int(sol.stats["n_steps"].max()), "f_evals_max": int(sol.stats["n_f_evals"].max())}

    def run_eager():
        fc.reset()
        return unpack(eager.solve(problem), fc.calls)

    out = [Solver("torchode I", run_eager)]
    if compile_:
        comp_adj = build(prob.f_batch)  # no Python counter inside the compiled region
        compiled = torch.compile(comp_adj.solve)

        def run_compiled():
            sol = compiled(problem)
            return unpack(sol, int(sol.stats["n_f_evals"].max()))

        out.append(Solver("torchode I compiled", run_compiled))
    return out


def torchdiffeq_solvers(prob: Problem, rtol: float, atol: float) -> list[Solver]:
    from torchdiffeq import odeint

    tspan = torch.tensor([prob.t0, prob.t1], dtype=DTYPE)
    B = prob.batch

    def make(options, name):
        fc = Counted(prob.f_batch)  # torchdiffeq passes a scalar t; the problems are autonomous

        def run():
            fc.reset()
            ys = odeint(fc, prob.y0, tspan, rtol=rtol, atol=atol, method="dopri5", options=options)
            attempted = fc.accepted + fc.rejected
            consistent = fc.calls == 2 + 6 * attempted
            return {"steps": np.full(B, attempted), "accepted": np.full(B, fc.accepted), "rhs_calls": fc.calls,
                    "y_final": ys[-1].numpy(), "ok": bool(torch.isfinite(ys[-1]).all()) and consistent,
                    "loop_iters": attempted}
        return Solver(name, run)

    out = [make(None, "torchdiffeq")]
    if B > 1:  # for B = 1 the max-norm equals the default RMS norm
        out.append(make({"norm": lambda x: x.pow(2).mean(-1).sqrt().max()}, "torchdiffeq maxnorm"))
    return out


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# --------------------------------------------------------------------------------------------
# One configuration
# --------------------------------------------------------------------------------------------

def run_config(prob: Problem, tol: float, threads: int, args, floors: dict) -> dict:
    torch.set_num_threads(threads)
    rtol = atol = tol
    solvers = [odecli_solver(prob, rtol, atol)]
    if prob.equations is not None or prob.native_rhs is not None:
        solvers.append(odecli_native_solver(prob, rtol, atol))
    if args.compile_peers:
        solvers.append(odecli_solver(prob, rtol, atol, compiled=True))
    if args.odecli_chunk1:  # the same solver with one host read per attempt: what chunking buys
        solvers.append(odecli_solver(prob, rtol, atol, chunk=1))
        if args.compile_peers:
            solvers.append(odecli_solver(prob, rtol, atol, compiled=True, chunk=1))
    if "torchode" in args.peers:
        solvers += torchode_solvers(prob, rtol, atol, args.compile_peers)
    if "torchdiffeq" in args.peers:
        solvers += torchdiffeq_solvers(prob, rtol, atol)
    timed_scipy = "scipy" in args.peers and prob.batch <= args.scipy_max_batch
    if timed_scipy:
        solvers.append(Solver("scipy RK45 loop", lambda: scipy_loop(prob, rtol, atol), kind="scipy"))

    fkey = (prob.name, prob.batch, threads)
    if fkey not in floors:
        floors[fkey] = {"torch": torch_floor(prob), "scipy": numpy_floor(prob) if have("scipy") else math.nan}
    floor = floors[fkey]

    for s in solvers:  # warm-up / first call
        try:
            start = time.perf_counter()
            s.result = s.run()
            s.first_call = time.perf_counter() - start
        except Exception as exc:  # a peer failing must not kill the benchmark
            s.error = f"{type(exc).__name__}: {exc}"
    live = [s for s in solvers if s.error is None]
    for _ in range(args.repeats):  # round-robin timed runs
        for s in live:
            start = time.perf_counter()
            s.result = s.run()
            s.timings.append(time.perf_counter() - start)

    checked = np.arange(prob.batch) if timed_scipy else checked_rows(prob.batch)
    ref = reference(prob, checked) if have("scipy") else None
    scipy_steps = None
    if timed_scipy:
        scipy_steps = next(s.result["steps"] for s in solvers if s.kind == "scipy" and s.result is not None)
    elif have("scipy") and args.scipy_steps:
        skey = (prob.name, prob.batch, tol)
        if skey not in _SCIPY_STEPS_CACHE:
            _SCIPY_STEPS_CACHE[skey] = scipy_loop(prob, rtol, atol, checked)["steps"]
        scipy_steps = _SCIPY_STEPS_CACHE[skey]

    rows = []
    eager_steps = {}
    for s in solvers:
        row = {"problem": prob.name, "B": prob.batch, "tol": tol, "threads": threads, "solver": s.name}
        if s.error is not None:
            row["status"] = "ERROR " + s.error
            rows.append(row)
            continue
        r = s.result
        steps = np.asarray(r["steps"], dtype=np.float64)
        wall = statistics.median(s.timings)
        fl = floor[s.kind]
        row.update({
            "steps_mean": float(steps.mean()), "steps_max": int(steps.max()),
            "accepted_mean": float(np.mean(r["accepted"])), "rhs_calls": int(r["rhs_calls"]),
            "wall_s": wall, "timings_s": s.timings, "first_call_s": s.first_call,
            "s_per_step": wall / (steps.sum() if s.kind == "scipy" else max(r["loop_iters"], 1)),
            "floor_s": fl, "overhead": wall / (r["rhs_calls"] * fl),
            "status": "ok" if r["ok"] else "FAILED",
        })
        if "f_evals_max" in r and s.name == "torchode I" and r["f_evals_max"] != r["rhs_calls"]:
            row["status"] += f" (counter {r['rhs_calls']} != n_f_evals {r['f_evals_max']})"
        if s.name.startswith("torchode"):
            eager_steps.setdefault("torchode", r["steps"])
            if s.name.endswith("compiled") and not np.array_equal(eager_steps["torchode"], r["steps"]):
                row["status"] += " MISMATCH vs eager steps"
        if scipy_steps is not None:
            mine = steps[checked]
            row["infl_max"] = float(mine.max() / scipy_steps.max())
            row["infl_mean"] = float(mine.mean() / scipy_steps.mean())
            if s.name in ("odecli", "odecli native"):
                ratio = mine / scipy_steps
                row["vs_scipy_per_sample"] = {
                    "identical": int((mine == scipy_steps).sum()), "n": int(mine.size),
                    "ratio_mean": float(ratio.mean()), "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max()),
                }
        if ref is not None:
            err = np.abs(np.asarray(r["y_final"])[checked] - ref).max(axis=1)
            row["err_max"], row["err_med"] = float(np.nanmax(err)), float(np.nanmedian(err))
        rows.append(row)

    walls = {row["solver"]: row["wall_s"] for row in rows if "wall_s" in row}
    summary = {"problem": prob.name, "B": prob.batch, "tol": tol, "threads": threads,
               "floor_torch_s": floor["torch"], "floor_scipy_s": floor["scipy"]}
    for mine in MINE:
        if mine in walls:
            for other in walls:
                if not other.startswith("odecli") or other == f"{mine} k=1":
                    summary[f"{mine}/{other}"] = walls[mine] / walls[other]
    return {"rows": rows, "summary": summary}


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------

def fmt(x, spec):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return format(x, spec)


def fmt_ratio(x: float) -> str:
    """Two decimals, or three significant digits for ratios far below 1 (the native rows)."""
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.3g}x"


def fmt_time(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x * 1e3:.3f} ms" if x < 1e-2 else f"{x:.4g}"


ROW_HEADER = ("| problem | B | tol | thr | solver | steps mean | steps max | RHS calls | wall s | 1st call s | "
              "s/step | overhead | infl max | infl mean | err max | err med | status |")


def row_md(r: dict) -> str:
    if "wall_s" not in r:
        return f"| {r['problem']} | {r['B']} | {r['tol']:g} | {r['threads']} | {r['solver']} |" + " |" * 11 + f" {r['status']} |"
    return (f"| {r['problem']} | {r['B']} | {r['tol']:g} | {r['threads']} | {r['solver']} | {r['steps_mean']:.1f} | "
            f"{r['steps_max']} | {r['rhs_calls']} | {r['wall_s']:.4g} | {r['first_call_s']:.3g} | "
            f"{r['s_per_step'] * 1e3:.3f} ms | {r['overhead']:.1f} | {fmt(r.get('infl_max'), '.2f')} | "
            f"{fmt(r.get('infl_mean'), '.2f')} | {fmt(r.get('err_max'), '.2e')} | {fmt(r.get('err_med'), '.2e')} | "
            f"{r['status']} |")


def summary_md(configs: list[dict]) -> list[str]:
    order = ["torchode I", "torchode I compiled", "torchdiffeq", "torchdiffeq maxnorm", "scipy RK45 loop"]
    present = {k for c in configs for k in c["summary"] if k.startswith("odecli")}
    names = [f"{mine}/{n}" for mine in MINE for n in order if f"{mine}/{n}" in present]
    names += sorted(present - set(names))
    lines = ["| problem | B | tol | thr | 1 RHS call (torch, B) | odecli steps mean/max | scipy steps mean/max | "
             "odecli = scipy per sample | " + " | ".join(n + " wall" for n in names) + " |",
             "|" + "---|" * (8 + len(names))]
    for c in configs:
        s = c["summary"]
        od = next((r for r in c["rows"] if r["solver"] == "odecli" and "wall_s" in r), None)
        sc = next((r for r in c["rows"] if r["solver"] == "scipy RK45 loop" and "wall_s" in r), None)
        vs = od.get("vs_scipy_per_sample") if od else None
        od_steps = f"{od['steps_mean']:.1f}/{od['steps_max']}" if od else "—"
        if sc:
            sc_steps = f"{sc['steps_mean']:.1f}/{sc['steps_max']}"
        elif od and "infl_max" in od:
            sc_steps = f"{od['steps_mean'] / od['infl_mean']:.1f}/{round(od['steps_max'] / od['infl_max'])} (untimed)"
        else:
            sc_steps = "—"
        same = f"{vs['identical']}/{vs['n']} (ratio {vs['ratio_min']:.2f}–{vs['ratio_max']:.2f})" if vs else "—"
        ratios = " | ".join(fmt_ratio(s[n]) if n in s else "—" for n in names)
        lines.append(f"| {s['problem']} | {s['B']} | {s['tol']:g} | {s['threads']} | {s['floor_torch_s'] * 1e6:.1f} µs | "
                     f"{od_steps} | {sc_steps} | {same} | {ratios} |")
    return lines


def print_config(c: dict) -> None:
    print(ROW_HEADER)
    print("|" + "---|" * 17)
    for r in c["rows"]:
        print(row_md(r))
    s = c["summary"]
    ratios = ", ".join(f"{k} = {fmt_ratio(v)}" for k, v in s.items() if k.startswith("odecli"))
    print(f"\nFLOOR torch f(t[B], y[B,n]) = {s['floor_torch_s'] * 1e6:.2f} µs, numpy 1-sample = "
          f"{s['floor_scipy_s'] * 1e6:.2f} µs")
    print(f"RATIO (wall) {ratios}\n", flush=True)


# --------------------------------------------------------------------------------------------
# Profile
# --------------------------------------------------------------------------------------------

def profile_odecli(tol: float, batch: int, mode: str, top: int = 25) -> None:
    import cProfile
    import io
    import pstats

    from odecli.ode.solver import solve

    prob = make_vdp(batch)

    def once():
        return solve(prob.f_odecli, prob.y0, prob.t0, prob.t1, params=prob.params, method="dopri5",
                     rtol=tol, atol=tol, controller="integral")

    once()  # warm-up
    start = time.perf_counter()
    sol = once()
    wall = time.perf_counter() - start
    print(f"# PROFILE odecli vdp B={batch} tol={tol:g} threads={torch.get_num_threads()}: "
          f"unprofiled wall {wall:.4f} s, steps max {int(sol.stats['n_steps'].max())}, "
          f"loop iterations ~ {int(sol.stats['n_steps'].max())}\n")
    if mode in ("cprofile", "both"):
        prof = cProfile.Profile()
        prof.enable()
        once()
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime").print_stats(top)
        print("## cProfile, sorted by tottime (own time)\n")
        print(buf.getvalue())
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("cumulative").print_stats(top)
        print("## cProfile, sorted by cumulative time\n")
        print(buf.getvalue())
    if mode in ("torch", "both"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            once()
        print("## torch.profiler, sorted by self CPU time\n")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def csv_list(kind):
    return lambda s: [kind(x) for x in s.split(",") if x.strip()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problems", type=csv_list(str), default=list(PROBLEMS), help="vdp,lv,mlp")
    p.add_argument("--batches", type=csv_list(int), default=[1, 64, 1024], help="batch sizes for vdp and lv")
    p.add_argument("--mlp-batches", type=csv_list(int), default=[256], help="batch sizes for mlp")
    p.add_argument("--tols", type=csv_list(float), default=[1e-6], help="rtol = atol values")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per solver (median is reported)")
    p.add_argument("--threads", type=csv_list(int), default=[1], help="torch thread counts")
    p.add_argument("--peers", type=csv_list(str), default=list(ALL_PEERS), help="torchode,torchdiffeq,scipy")
    p.add_argument("--compile-peers", action="store_true",  # also adds an "odecli compiled" row
                   help="also run torch.compile(torchode solve) (~5-20 s compile per configuration)")
    p.add_argument("--odecli-chunk1", action="store_true",
                   help="add odecli rows with chunk=1 (one host read per attempt), compiled too with --compile-peers")
    p.add_argument("--scipy-max-batch", type=int, default=64, help="time the scipy loop only up to this batch")
    p.add_argument("--no-scipy-steps", dest="scipy_steps", action="store_false",
                   help="above --scipy-max-batch, skip the untimed scipy pass that gives step inflation")
    p.add_argument("--quick", action="store_true", help="smoke run: vdp,lv at B=1,64, tol 1e-6, 1 repeat")
    p.add_argument("--json", metavar="FILE", help="write all rows and summaries as JSON")
    p.add_argument("--profile", action="store_true",
                   help="only profile odecli on VdP (B=--profile-batch, first tol) and print the top entries")
    p.add_argument("--profile-batch", type=int, default=1024)
    p.add_argument("--profile-mode", choices=("cprofile", "torch", "both"), default="both")
    args = p.parse_args(argv)
    if args.quick:
        args.problems, args.batches, args.tols, args.repeats = ["vdp", "lv"], [1, 64], [1e-6], 1
    bad = [x for x in args.problems if x not in PROBLEMS]
    if bad:
        p.error(f"unknown problem(s) {bad}; choose from {PROBLEMS}")
    bad = [x for x in args.peers if x not in ALL_PEERS]
    if bad:
        p.error(f"unknown peer(s) {bad}; choose from {ALL_PEERS}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_default_dtype(DTYPE)
    if args.profile:
        torch.set_num_threads(args.threads[0])
        profile_odecli(args.tols[0], args.profile_batch, args.profile_mode)
        return 0

    modules = {"torchode": "torchode", "torchdiffeq": "torchdiffeq", "scipy": "scipy"}
    skipped = [peer for peer in args.peers if not have(modules[peer])]
    for peer in skipped:
        print(f"# SKIP peer {peer}: not installed", file=sys.stderr)
    args.peers = [peer for peer in args.peers if peer not in skipped]
    if args.compile_peers and "torchode" in args.peers:
        import torch._dynamo.config as dcfg
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dcfg, name):
                setattr(dcfg, name, 64)

    versions = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for mod in ("torchode", "torchdiffeq", "scipy"):
        if have(mod):
            versions[mod] = getattr(__import__(mod), "__version__", "?")
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "argv": sys.argv,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "versions": versions,
            "TORCHINDUCTOR_AUTOGRAD_CACHE": os.environ.get("TORCHINDUCTOR_AUTOGRAD_CACHE")}
    print("# odecli ODE benchmark  " + "  ".join(f"{k} {v}" for k, v in versions.items()))
    print(f"# peers: {','.join(args.peers) or 'none'}  compile-peers: {args.compile_peers}  repeats: {args.repeats}\n")

    configs, floors = [], {}
    start = time.perf_counter()
    for name in args.problems:
        for batch in (args.mlp_batches if name == "mlp" else args.batches):
            prob = MAKERS[name](batch)
            for threads in args.threads:
                for tol in args.tols:
                    print(f"## {name} B={batch} tol={tol:g} threads={threads} — {prob.describe} "
                          f"(elapsed {time.perf_counter() - start:.0f} s)\n", flush=True)
                    c = run_config(prob, tol, threads, args, floors)
                    print_config(c)
                    configs.append(c)

    print("## Summary: odecli against the peers (ratio > 1 means odecli is slower)\n")
    print("\n".join(summary_md(configs)))
    print(f"\n# total {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "configs": configs}, fh, indent=1, default=float)
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
