"""What a user waits for with ``solve(..., compile=...)``: the first call and a run of calls, each
in a fresh process.

Issue 6 asks for a first call of <= 2 s; torch.compile of the fused step takes 7-30 s here.
``compile=True`` steps eagerly until the eager step of a right-hand side has cost
``COMPILE_AFTER_EAGER_S`` (10 s), then compiles (rent or buy); ``compile="wait"`` compiles
before the first step. Van der Pol with a Python RHS, mu = linspace(0.5, 25, B), dopri5,
rtol = atol = 1e-6, float64, 1 thread; each case is ``calls`` solves of t in [0, t1] in one
process (one long solve, or a loop of shorter ones as in a fit):

- ``eager``: ``compile=False``; ``wait``: ``compile="wait"``; ``true``: ``compile=True``;
- ``torchode``: ``torch.compile(AutoDiffAdjoint.solve)`` when torchode is installed (its steps
  differ slightly: its own controller).

Every process gets an empty inductor cache directory (a cold compile, as on a first run).

    python benchmarks/compile_first_call_bench.py --cases 10x1,100x30,3000x1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ODECLI = """
import json, time, torch
torch.set_num_threads(1)
from odecli.ode.solver import solve
B, T, calls = {batch}, {span}, {calls}
compile = {{"eager": False, "wait": "wait", "true": True}}[{mode!r}]
def vdp(t, y, p):
    x, v = y[:, 0], y[:, 1]
    return torch.stack([v, p["mu"] * (1 - x**2) * v - x], dim=-1)
mu = torch.linspace(0.5, 25.0, B, dtype=torch.float64)
y0 = torch.tensor([[2.0, 0.0]], dtype=torch.float64).repeat(B, 1)
times, attempts, compiled = [], 0, 0
for _ in range(calls):
    started = time.perf_counter()
    sol = solve(vdp, y0, 0.0, T, params={{"mu": mu}}, rtol=1e-6, atol=1e-6, compile=compile)
    times.append(time.perf_counter() - started)
    attempts += sol.extra.get("attempts", 0)
    compiled += sol.extra.get("attempts_compiled", 0)
print("RESULT " + json.dumps({{"first": times[0], "total": sum(times), "last": times[-1],
                              "share": compiled / max(attempts, 1), "steps_max": int(sol.stats["n_steps"].max())}}))
"""

TORCHODE = """
import json, time, torch, torchode as to
torch.set_num_threads(1)
B, T, calls = {batch}, {span}, {calls}
mu = torch.linspace(0.5, 25.0, B, dtype=torch.float64)
def f(t, y):
    return torch.stack([y[:, 1], mu * (1 - y[:, 0] ** 2) * y[:, 1] - y[:, 0]], dim=1)
term = to.ODETerm(f)
solver = to.AutoDiffAdjoint(to.Dopri5(term=term), to.IntegralController(atol=1e-6, rtol=1e-6, term=term))
compiled = torch.compile(solver.solve)
y0 = torch.tensor([[2.0, 0.0]], dtype=torch.float64).repeat(B, 1)
problem = to.InitialValueProblem(y0=y0, t_start=torch.zeros(B, dtype=torch.float64),
                                 t_end=torch.full((B,), float(T), dtype=torch.float64))
times = []
for _ in range(calls):
    started = time.perf_counter()
    sol = compiled(problem)
    times.append(time.perf_counter() - started)
print("RESULT " + json.dumps({{"first": times[0], "total": sum(times), "last": times[-1], "share": 1.0,
                              "steps_max": int(sol.stats["n_steps"].max())}}))
"""


def run(source: str, cache_dir: str, timeout: float) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=env, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"no result (exit {proc.returncode}): {proc.stderr[-2000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--cases", default="10x1,100x30,3000x1", help="t1 x calls, comma-separated")
    p.add_argument("--modes", default="eager,wait,true,torchode")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900.0)
    args = p.parse_args()
    modes = args.modes.split(",")
    try:
        import torchode  # noqa: F401
    except ImportError:
        if "torchode" in modes:
            print("# SKIP torchode: not installed", file=sys.stderr)
            modes.remove("torchode")
    results: dict[tuple, list[dict]] = {}
    cases = [(float(span), int(calls)) for span, calls in (c.split("x") for c in args.cases.split(","))]
    for _ in range(args.repeats):
        for span, calls in cases:
            for mode in modes:
                template = TORCHODE if mode == "torchode" else ODECLI
                source = template.format(batch=args.batch, span=span, calls=calls, mode=mode)
                r = run(source, tempfile.mkdtemp(prefix="odecli-inductor-"), args.timeout)
                results.setdefault((span, calls, mode), []).append(r)
                print(f"# t1={span:g} x{calls} {mode}: {r}", file=sys.stderr, flush=True)
    print(f"\nVdP, B = {args.batch}, dopri5, rtol = atol = 1e-6, cold compile caches; "
          f"median of {args.repeats} fresh processes (s)\n")
    print("| t1 x calls | mode | first call | all calls | last call | attempts compiled | all / eager | all / wait |")
    print("|---|---|---|---|---|---|---|---|")
    for (span, calls, mode), rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}

        def ratio(other: str) -> str:
            ref = results.get((span, calls, other))
            return f"{med['total'] / statistics.median(r['total'] for r in ref):.2f}" if ref else "-"

        print(f"| {span:g} x {calls} | {mode} | {med['first']:.2f} | {med['total']:.2f} | {med['last']:.3f} | "
              f"{med['share']:.2f} | {ratio('eager')} | {ratio('wait')} |")


if __name__ == "__main__":
    main()
