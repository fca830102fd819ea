"""Time the acoustic backward (adjoint) or forward for several time steps per C pass.

    python benchmarks/pde_pass_bench.py --size 1000 --dtype float64 --steps 100
    python benchmarks/pde_pass_bench.py --size 2000 --steps 40 --threads 2 --per-pass 1 2 8
    python benchmarks/pde_pass_bench.py --forward --size 1000 --per-pass 1 8

One rank, the pde_bench problem.  The time loop's ``STEPS_PER_PASS`` (forward and adjoint
passes alike) is set to each value of --per-pass in turn, alternated over --rounds.
Backward: each entry is the faster of two evaluations' backward calls (the forward is not
timed).  Forward: the fastest of three no-gradient forwards.  1 per pass is single steps (the
forward's split by rows when --threads > 1).  Prints ms and the ratio to the first value.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=1000)
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1, help="kernel threads")
    ap.add_argument("--per-pass", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--forward", action="store_true", help="time the forward instead")
    args = ap.parse_args()

    import torch

    import odecli.pde.acoustic.fused as acoustic_native
    from odecli.parallel.comm import Comm
    from odecli.app.pde_problem import Problem
    from odecli.specs.pde import validate
    from pde_bench import spec_dict

    torch.set_num_threads(args.threads)
    raw = spec_dict(args.size, args.steps, args.dtype, "auto")
    raw["compute"]["threads"] = args.threads
    spec = validate(raw, "bench")
    spec["text"] = ""
    spec["observed"]["noise"] = 0.0
    problem = Problem(spec, Comm(None))

    backward = acoustic_native._Propagation.backward
    times: list[float] = []

    def timed_backward(*a):
        t0 = time.perf_counter()
        out = backward(*a)
        times.append(time.perf_counter() - t0)
        return out

    acoustic_native._Propagation.backward = staticmethod(timed_backward)
    model = problem.unknown.field().detach()
    rows: dict[int, list[float]] = {n: [] for n in args.per_pass}
    for _ in range(args.rounds):
        for n in args.per_pass:
            times.clear()
            acoustic_native.STEPS_PER_PASS = n
            if args.forward:
                for _ in range(3):
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        problem.prop.forward(model)
                    times.append(time.perf_counter() - t0)
            else:
                problem.evaluate(None)
                problem.evaluate(None)
            rows[n].append(min(times))
    print(f"{args.size}^2 {args.dtype}, {args.steps} steps, {args.threads} kernel thread(s), "
          f"{len(problem.prop.segments)} time segment(s): "
          f"{'forward' if args.forward else 'backward'} ms per round")
    first = min(rows[args.per_pass[0]])
    for n, ts in rows.items():
        print(f"  {n} per pass: {', '.join(f'{1e3 * t:.0f}' for t in ts)}   "
              f"RATIO best / best of {args.per_pass[0]} per pass: {min(ts) / first:.2f}")


if __name__ == "__main__":
    main()
