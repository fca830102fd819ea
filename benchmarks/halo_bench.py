"""Time one planned deep-halo exchange (GhostExchange) with the C strip copies and with numpy.

    python benchmarks/halo_bench.py                  # 2 ranks, 256^2 per rank, 1 x 2, k = 8
    python benchmarks/halo_bench.py --block 512 --every 4 --grid 2x1 --ranks 2

The driver relaunches itself under mpiexec.  Each rank holds fields shaped like the acoustic
loop's with ``exchange_every = k``: a ghost ring of 2k cells on sides with a neighbour, two
fields (u_next 2k deep, u 2(k-1) deep), one shot.  Forward and adjoint exchanges are timed with
the strips packed in C (``odecli.parallel.strips``) and, in the same run, with its numpy
reference path; a bare ``Comm.exchange`` of buffers of the same size is the floor.  Prints the
median over --repeats calls after a barrier, and the ratio C / numpy.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args) -> None:
    import numpy as np
    import torch

    from odecli.parallel.comm import get_comm
    from odecli.parallel.decomposition import decompose
    from odecli.parallel.ops import GhostExchange

    comm = get_comm()
    py, px = (int(v) for v in args.grid.split("x"))
    d = decompose((args.block * py, args.block * px), comm.size, comm.rank, (py, px))
    k, ring = args.every, 2
    sides = (d.north, d.south, d.west, d.east)
    ghosts = tuple(ring * k if peer is not None else ring for peer in sides)
    extension = ring * (k - 1)
    shape = (1, args.block + ghosts[0] + ghosts[1], args.block + ghosts[2] + ghosts[3])
    fields = [torch.randn(shape, dtype=torch.float64) for _ in range(2)]

    def timed(fn) -> float:
        times = []
        for _ in range(args.repeats):
            comm.barrier()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    rows = {}
    for adjoint in (False, True):
        plan = GhostExchange(shape, torch.float64, d, comm, ghosts, (ring * k, extension), adjoint)
        native = timed(lambda: plan(fields))
        for links, _, _ in plan.phases:
            for *_, outgoing, incoming in links:
                outgoing._c = incoming._c = None  # the numpy reference path
        rows["adjoint" if adjoint else "forward"] = (native, timed(lambda: plan(fields)))
        size = sum(out.buffer.size for links, _, _ in plan.phases for *_, out, _ in links)
    peers = [p for p in sides if p is not None]
    send = [(p, np.zeros(size // max(1, len(peers))), 7) for p in peers]
    recv = [(p, np.zeros(size // max(1, len(peers))), 7) for p in peers]
    floor = timed(lambda: comm.exchange(send, recv))
    worst = {name: (comm.allreduce_scalar(a, op="max"), comm.allreduce_scalar(b, op="max"))
             for name, (a, b) in rows.items()}
    floor = comm.allreduce_scalar(floor, op="max")
    if comm.rank == 0:
        print(f"{comm.size} ranks, {args.grid}, {args.block}^2 per rank, exchange_every {k}, "
              f"{size * 8 / 1024:.0f} KiB per rank and exchange; slowest rank's median of "
              f"{args.repeats}")
        for name, (c, npy) in worst.items():
            print(f"  {name:8s} C strips {c:7.1f} us   numpy strips {npy:7.1f} us   "
                  f"RATIO C/numpy {c / npy:.2f}")
        print(f"  bare Comm.exchange of the same bytes: {floor:.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--grid", default="1x2", help="process grid PYxPX")
    ap.add_argument("--block", type=int, default=256, help="points per rank along each axis")
    ap.add_argument("--every", type=int, default=8, help="exchange_every k")
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    mpiexec = Path(sys.executable).with_name("mpiexec")
    cmd = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(args.ranks), sys.executable,
           __file__, "--worker", "--grid", args.grid, "--block", str(args.block),
           "--every", str(args.every), "--repeats", str(args.repeats)]
    subprocess.run(cmd, check=True, cwd=ROOT)


if __name__ == "__main__":
    main()
