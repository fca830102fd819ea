#!/usr/bin/env python
"""Time the generated C ODE solver per lane count: ns per attempted step and sample.

The solver steps ``LANES`` samples together (``odecli/ode/native/codegen.py``); this measures
what each lane count costs on this machine, and with ``--pow lanes,libm`` what the controller's
powers cost over vector lanes (``libm_pow.c``) against libm's scalar ``pow`` (the solutions are
the same bit for bit, checked here). The variants alternate so drift hits all alike; the minimum
of ``--repeats`` runs is reported. VdP (mu in [0.5, 25], y0 = (2, 0)) and
Lotka-Volterra (random y0), dopri5, rtol = atol = 1e-6, t in [0, 10], one thread.

Usage::

    python benchmarks/native_lanes_bench.py --lanes 1,4,8,12,16 --batch 4096
    python benchmarks/native_lanes_bench.py --lanes 8 --pow lanes,libm
"""

from __future__ import annotations

import argparse
import time

import torch

from odecli.ode.native import NativeRhs, engine, solve_native

VDP = NativeRhs(("y[1]", "((p[0] * (1.0 - odecli_sq(y[0]))) * y[1]) - y[0]"), ("mu",))
LV = NativeRhs(("p[0] * y[0] - p[1] * y[0] * y[1]", "p[2] * y[0] * y[1] - p[3] * y[1]"), ("a", "b", "c", "d"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", default="1,4,8,12,16", help="lane counts to compare")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--pow", default="lanes", help="the controller's powers: lanes, libm or both")
    args = parser.parse_args()
    torch.set_num_threads(1)
    variants = [(int(w), how) for w in args.lanes.split(",") for how in args.pow.split(",")]
    b = args.batch
    warned = False
    problems = {
        "vdp": (VDP, torch.tensor([[2.0, 0.0]], dtype=torch.float64).expand(b, 2).contiguous(),
                {"mu": torch.linspace(0.5, 25.0, b, dtype=torch.float64)}),
        "lv": (LV, 1 + 2 * torch.rand(b, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64),
               {"a": 1.5, "b": 1.0, "c": 1.0, "d": 3.0}),
    }
    for name, (rhs, y0, params) in problems.items():
        best = {v: float("inf") for v in variants}
        solutions = {}
        for _ in range(args.repeats):
            for w, how in variants:
                engine.LANES = w  # read when the solver source is generated (cached per source)
                if engine.use_pow_lanes(rhs, "dopri5", how == "lanes") != (how == "lanes") and not warned:
                    print("note: pow over lanes is unavailable here (its load check failed): "
                          "the 'lanes' rows use libm's pow too")
                    warned = True
                start = time.perf_counter()
                sol = solve_native(rhs, y0, 0.0, 10.0, params=params, rtol=1e-6, atol=1e-6, threads=1)
                best[w, how] = min(best[w, how], time.perf_counter() - start)
                solutions[w, how] = sol
        first = next(iter(solutions.values()))
        same = all(torch.equal(s.y, first.y) and torch.equal(s.stats["n_steps"], first.stats["n_steps"])
                   for s in solutions.values())
        attempts = float(first.stats["n_steps"].sum())
        row = " | ".join(f"{w} lanes, {how} pow: {best[w, how] * 1e3:7.2f} ms, "
                         f"{best[w, how] / attempts * 1e9:5.1f} ns" for w, how in variants)
        print(f"{name} B={b}: {row} | solutions {'identical' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
