"""What events cost: the same batch solved with and without events, per engine, and scipy's loop.

Issue 44 asks that events cost at most 1.3x the same solve without them on the generated C
solver at B = 1024. The problem: B damped pendulums theta'' = -k sin(theta) - c theta', theta0
~ U[0.1, 2.5], k ~ U[0.5, 2], c = 0.05, t in [0, 20], dopri5, rtol = atol = 1e-8, 41 output times.

Rows (each ``with events`` row against its own ``no events`` row, so the ratio is the events' cost):

- ``native``: the generated C solver (``solve_native_arrays``), threads as configured.
- ``torch``: the batched PyTorch loop (``odecli.solve``); events make every attempt read the host.
- ``scipy RK45 loop``: ``solve_ivp(method="RK45", events=...)`` per sample on ``--scipy-samples``
  samples, scaled to B (per-sample cost x B), the usual way such a batch is done in scipy.
- ``diffrax``: ``jax.vmap`` of ``diffeqsolve`` (Dopri5, PIDController at the same tolerances, the
  same 41 output times) under ``jax.jit``, compiled before timing; its ``Event`` (Newton root
  finder) ends the solve, so only ``first crossing`` has a diffrax row (it records nothing, and
  cannot end at an N-th occurrence). Skipped with a ``# SKIP`` line where jax/diffrax are not
  installed (``pip install jax diffrax``: for this benchmark only, not a dependency of odecli).
  Its event times are checked against the C solver's (the largest difference is printed).

Event sets: ``zero crossings`` (theta = 0, both directions, recorded: every sample's steps are
those it takes without events, so the ratio is pure detection and root finding; about 12
crossings per sample), ``terminal`` (theta' = 0 falling, terminal 3: the sample ends early,
so it costs less than the full solve; shown for completeness) and ``first crossing`` (theta = 0
falling, terminal at the first: what every peer can do, diffrax included).

    python benchmarks/events_bench.py --repeats 5 [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np


def problem(batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    y0 = np.stack([rng.uniform(0.1, 2.5, batch), np.zeros(batch)], 1)
    k = rng.uniform(0.5, 2.0, batch)
    return y0, k, np.linspace(0, 20, 41)


def round_robin(fns: dict, repeats: int) -> dict:
    """name -> (median seconds, last result), the runs alternated so that the machine's drift (other
    jobs on a shared VM) hits every variant alike; one untimed warm-up each (builds, imports)."""
    results = {name: fn() for name, fn in fns.items()}
    times: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            began = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - began)
    return {name: (statistics.median(times[name]), results[name]) for name in fns}


def diffrax_rows(y0, k, grid, reference, repeats: int, threads: int | None, add) -> None:
    """diffrax's vmapped, jitted Dopri5 without events and with an Event at the first crossing."""
    if threads == 1:  # before jax is imported: XLA's CPU client reads it once
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1").strip()
    try:
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        import diffrax
        import optimistix
    except ImportError:
        print("# SKIP diffrax: jax, diffrax or optimistix not installed", file=sys.stderr)
        return

    term = diffrax.ODETerm(lambda t, y, kk: jnp.stack([y[1], -kk * jnp.sin(y[0]) - 0.05 * y[1]]))
    crossing = diffrax.Event(lambda t, y, args, **kwargs: y[0], optimistix.Newton(rtol=1e-12, atol=1e-12),
                             direction=False)  # False: a down-crossing, as falling

    def batched(event):
        def one(y, kk):
            sol = diffrax.diffeqsolve(term, diffrax.Dopri5(), 0.0, 20.0, None, y, args=kk, event=event,
                                      stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8),
                                      saveat=diffrax.SaveAt(ts=jnp.asarray(grid), t1=True), max_steps=100_000)
            # t1=True appends where the solve ended after the output times it reached (inf after it)
            return jnp.max(jnp.where(jnp.isfinite(sol.ts), sol.ts, -jnp.inf)), sol.ys
        solve = jax.jit(jax.vmap(one))
        jy0, jk = jnp.asarray(y0), jnp.asarray(k)
        return lambda: jax.block_until_ready(solve(jy0, jk))

    timed = round_robin({"none": batched(None), "first crossing": batched(crossing)}, repeats)
    t_event = np.asarray(timed["first crossing"][1][0]).ravel()
    gap = float(np.max(np.abs(t_event - reference)))
    for name, (seconds, _) in timed.items():
        add("diffrax (jit, vmap)", name, seconds, timed["none"][0],
            f"event times vs C solver: max |diff| {gap:.1e}" if name != "none" else f"jax {jax.__version__}, "
            f"diffrax {diffrax.__version__}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--scipy-samples", type=int, default=32)
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch loop rows")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from odecli.ode.native import NativeEvent, NativeRhs, solve_native_arrays

    y0, k, grid = problem(args.batch)
    equations = ("y[1]", "-p[0] * sin(y[0]) - 0.05 * y[1]")
    sets = {
        "zero crossings": (NativeEvent("y[0]", 0, 0, "zero"),),
        "terminal": (NativeEvent("y[1]", -1, 3, "turn"),),
        "first crossing": (NativeEvent("y[0]", -1, 1, "first"),),
    }
    options = dict(method="dopri5", rtol=1e-8, atol=1e-8)
    rows = []

    def add(engine, events, seconds, base, extra=""):
        rows.append({"engine": engine, "events": events, "wall_s": seconds, "ratio": seconds / base if base else None,
                     "note": extra})

    def native(events):
        rhs = NativeRhs(equations, ("k",), events)
        return lambda: solve_native_arrays(rhs, y0, 0.0, 20.0, grid, params={"k": k}, threads=args.threads, **options)

    timed = round_robin({"none": native(()), **{name: native(events) for name, events in sets.items()}}, args.repeats)
    base = timed["none"][0]
    for name, (seconds, sol) in timed.items():
        note = "" if name == "none" else f"{next(iter(sol.events.values())).count.mean():.1f} events/sample"
        add("native", name, seconds, base, note)
    assert np.array_equal(timed["zero crossings"][1].stats["n_steps"], timed["none"][1].stats["n_steps"])  # same steps
    first_crossing = timed["first crossing"][1].events["first"].t[:, 0]

    if not args.no_torch:
        import torch

        import odecli
        from odecli.ode.events import Event

        if args.threads:
            torch.set_num_threads(args.threads)

        def f(t, y, p):
            return torch.stack([y[:, 1], -p["k"] * torch.sin(y[:, 0]) - 0.05 * y[:, 1]], dim=1)

        ty0, tk, tgrid = torch.tensor(y0), torch.tensor(k), torch.tensor(grid)
        torch_sets = {"none": None, "zero crossings": [Event(lambda t, y, p: y[:, 0], 0, 0, "zero")],
                      "terminal": [Event(lambda t, y, p: y[:, 1], -1, 3, "turn")],
                      "first crossing": [Event(lambda t, y, p: y[:, 0], -1, 1, "first")]}

        def loop(events):
            return lambda: odecli.solve(f, ty0, 0.0, 20.0, tgrid, params={"k": tk}, events=events, **options)

        timed = round_robin({name: loop(events) for name, events in torch_sets.items()}, args.repeats)
        for name, (seconds, _) in timed.items():
            add("torch", name, seconds, timed["none"][0])

    from scipy.integrate import solve_ivp

    n = min(args.scipy_samples, args.batch)

    def scipy_loop(events):
        for i in range(n):
            kk = k[i]
            solve_ivp(lambda t, y: [y[1], -kk * math.sin(y[0]) - 0.05 * y[1]], (0, 20), y0[i], t_eval=grid,
                      events=events, rtol=1e-8, atol=1e-8)

    def zero(t, y):
        return y[0]

    def turn(t, y):
        return y[1]

    def first(t, y):
        return y[0]

    turn.direction, turn.terminal = -1, 3
    first.direction, first.terminal = -1, 1
    scale = args.batch / n
    timed = round_robin({"none": lambda: scipy_loop(None), "zero crossings": lambda: scipy_loop([zero]),
                         "terminal": lambda: scipy_loop([turn]), "first crossing": lambda: scipy_loop([first])},
                        max(1, args.repeats // 2))
    for name, (seconds, _) in timed.items():
        add("scipy RK45 loop", name, seconds * scale, timed["none"][0] * scale, f"{n} samples timed, scaled to B")
    diffrax_rows(y0, k, grid, first_crossing, args.repeats, args.threads, add)

    print(f"B = {args.batch}, dopri5, rtol = atol = 1e-8, t in [0, 20], 41 output times, "
          f"median of {args.repeats}, variants alternated")
    print(f"{'engine':<21}{'events':<16}{'wall s':>10}{'vs none':>9}  note")
    for r in rows:
        print(f"{r['engine']:<21}{r['events']:<16}{r['wall_s']:>10.4f}{r['ratio']:>9.2f}  {r['note']}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
