"""One rank's forward and forward + gradient with two versions of the PDE kernels, alternated in
one process, and whether their gradients agree bit for bit.

    git show HEAD~1:odecli/pde/acoustic/acoustic.c > /tmp/old.c
    python benchmarks/pde_kernel_ab.py /tmp/old.c --size 256 --rounds 30
    python benchmarks/pde_kernel_ab.py /tmp/old.c --size 1000 --rounds 6 --dtype float32

The pde_bench problem (400 steps).  ``OTHER`` is another ``acoustic.c`` with the same kernel
signatures (since the adjoint became the forward pass, 2026-12-04: ``leapfrog_forward_run``
with its ``grad`` argument); it and this checkout's are built as odecli builds them, and every round runs both, in alternating order, so that the two see
the same machine load (this VM's speed drifts by 1.7x within minutes: separate processes
minutes apart are not comparable).  Prints the fastest and median of each, and the whole
gradient's rate against the forward's (fastest / fastest).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("other", type=Path, help="the other version's acoustic.c")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--threads", type=int, default=1, help="kernel threads (compute.threads)")
    args = ap.parse_args()

    import torch

    import pde_bench
    from odecli import native
    from odecli.parallel.comm import Comm
    from odecli.pde.acoustic import kernels as leapfrog
    from odecli.app.pde_problem import Problem
    from odecli.specs.pde import validate

    torch.set_num_threads(1)
    libs = {}
    for name, path in (("other", args.other), ("this", ROOT / "odecli/pde/acoustic/acoustic.c")):
        lib, why = native.load_source("acoustic", path.read_bytes())
        if lib is None:
            sys.exit(f"{path}: {why}")
        libs[name] = lib
    current = ["this"]
    leapfrog._kernel_named = lambda name: getattr(libs[current[0]], name)  # looked up per call

    raw = pde_bench.spec_dict(args.size, args.steps, args.dtype, "auto", args.size)
    raw["compute"]["threads"] = args.threads
    spec = validate(raw, "bench")
    spec["text"] = ""
    spec["observed"]["noise"] = 0.0
    P = Problem(spec, Comm(None))
    c = P.unknown.field().detach()
    times = {(v, what): [] for v in libs for what in ("forward", "forward+gradient")}
    grads = {}
    for r in range(args.rounds + 1):  # round 0 warms both up
        for v in ("other", "this") if r % 2 else ("this", "other"):
            current[0] = v
            t0 = time.perf_counter()
            with torch.no_grad():
                P.prop.forward(c)
            t1 = time.perf_counter()
            P.evaluate(None)
            t2 = time.perf_counter()
            grads[v] = P.unknown.params[0].grad.clone()
            if r:
                times[(v, "forward")].append(t1 - t0)
                times[(v, "forward+gradient")].append(t2 - t1)
    print(f"{args.size}^2 {args.dtype}, {args.steps} steps, {args.threads} kernel thread(s), "
          f"{args.rounds} alternated rounds")
    for (v, what), ts in times.items():
        print(f"  {v:<5} {what:<17} fastest {min(ts) * 1e3:8.1f} ms  median {statistics.median(ts) * 1e3:8.1f} ms")
    for v in libs:
        rate = min(times[(v, "forward")]) / min(times[(v, "forward+gradient")])
        print(f"  {v:<5} whole gradient / forward rate (fastest) {rate:.3f}")
    fb = {v: min(times[(v, "forward+gradient")]) for v in libs}
    print(f"RATIO this / other, forward+gradient (fastest): {fb['this'] / fb['other']:.3f}")
    print(f"gradients identical bit for bit: {torch.equal(grads['this'], grads['other'])}")


if __name__ == "__main__":
    main()
