"""Benchmark the acoustic2d propagator: forward and forward+gradient per iteration on 1/2/4 ranks.

    python benchmarks/pde_bench.py                       # 1000x1000, 100 steps, ranks 1 2 4
    python benchmarks/pde_bench.py --sizes 1000 2000 --steps 100 --ranks 1 2 --dtype float32
    python benchmarks/pde_bench.py --kernels fused reference   # also the PyTorch reference path
    python benchmarks/pde_bench.py --weak 512 --ranks 1 2       # weak scaling, 512^2 per rank
    python benchmarks/pde_bench.py --weak 256 --ranks 1 2 --rounds 5  # ... 5 rounds, medians
    python benchmarks/pde_bench.py --weak 256 --ranks 1 2 --split rows  # grid grows along y

The driver launches itself under mpiexec for each rank count (worker mode), prints grid-point
updates per second (GPts/s = ny*nx*steps / wall), speedup, parallel efficiency and the
communication fraction (time inside halo exchanges, forward and backward), plus single-rank
baselines measured in the same run: the STREAM-convention triad bound (torch.add(b, c, alpha,
out=a) on 400 MB arrays, 16 / 32 bytes per point for float32 / float64), a plain in-place torch
leapfrog loop (no autograd, no sponge: the floor of what eager PyTorch can do) and Deepwave's
scalar propagator when ``import deepwave`` works.  ``--kernels reference`` runs odecli with
ODECLI_NATIVE=0 (the PyTorch reference step that CUDA uses).  Timings are the median of
--repeats calls after one warm-up call, forward and forward+gradient timed in turn; the one-rank
gradient step rate / forward rate is the median over those pairs, and also the ratio of the two
fastest repeats.  Every RATIO line compares numbers from this run.
Weak scaling also times each rank count's ranks on independent one-rank problems at once (no
messages): on a shared VM that, not 100 %, is the ceiling for the efficiency.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def spec_dict(n: int, steps: int, dtype: str, segments, nx: int | None = None) -> dict:
    h = 10.0
    nx = nx or n
    ext = (n - 1) * h
    return {
        "kind": "pde-inverse", "equation": "acoustic2d",
        "grid": {"shape": [n, nx], "spacing": h},
        "time": {"dt": 0.001, "steps": steps},
        "boundary": {"absorbing_width": 20},
        "sources": {"wavelet": {"type": "ricker", "peak_frequency": 15, "delay": 0.1},
                    "positions": [[100.0, min(ext, (nx - 1) * h) / 2]]},
        "receivers": {"line": {"from": [100.0, 0.0], "to": [100.0, (nx - 1) * h], "count": nx // 4}},
        "true_model": {"type": "gaussian", "background": 2000, "amplitude": 200,
                       "center": [ext / 2, (nx - 1) * h / 2], "sigma": ext / 20},
        "unknown": {"type": "grid", "initial": 2000.0},
        "optimizer": {"iterations": 1},
        "compute": {"dtype": dtype, "time_segments": segments},
    }


def worker(args) -> None:
    import torch

    from odecli.parallel.comm import Comm, get_comm
    from odecli.app.pde_problem import Problem
    from odecli.specs.pde import validate

    torch.set_num_threads(args.threads)
    comm = get_comm()
    # --independent: every rank solves its own one-rank problem at the same time (no messages),
    # which is what the machine allows a perfectly parallel run
    solo = args.independent
    raw = spec_dict(args.n, args.steps, args.dtype, args.segments, args.nx)
    raw["compute"]["threads"] = args.threads  # torch's and the fused kernels' threads per rank
    raw["parallel"] = {"exchange_every": args.exchange_every}
    spec = validate(raw, "bench")
    spec["text"] = ""
    spec["observed"]["noise"] = 0.0
    P = Problem(spec, Comm(None) if solo else comm)
    c = P.unknown.field().detach()

    def fwd():
        with torch.no_grad():
            P.prop.forward(c)

    def fb():
        P.evaluate(None)

    import resource

    fns = {"forward": fwd, "forward+gradient": fb}
    fwd()  # warm-ups; the forward's peak memory is read before any gradient has run
    comm.barrier()
    rss_fwd = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    fb()
    # The two are timed in turn, repeat by repeat, so that both see the same phases of a shared
    # machine (whose speed drifts by 10 % over minutes): their ratio is then steadier.
    times: dict[str, list[float]] = {name: [] for name in fns}
    comms: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.repeats):
        for name, fn in fns.items():
            comm.barrier()
            P.timer.reset()
            t0 = time.perf_counter()
            fn()
            comm.barrier()
            times[name].append(comm.allreduce_scalar(time.perf_counter() - t0, op="max"))
            comms[name].append(P.timer.comm_s)
    rows = {}
    for name in fns:
        t = statistics.median(times[name])
        cfrac = comm.allreduce_scalar(statistics.median(comms[name]) / t, op="sum") / comm.size
        rows[name] = {"time_s": t, "min_s": min(times[name]),  # min: the least disturbed repeat
                      "times_s": times[name], "comm_fraction": cfrac}
    rss = comm.allreduce_scalar(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, op="max")
    if comm.rank == 0:
        print("RESULT " + json.dumps({"n": args.n, "steps": args.steps, "ranks": comm.size,
                                      "proc_grid": list(P.decomp.proc_grid), "rows": rows,
                                      "peak_rss_gb_max_rank": rss,
                                      "time_segments": len(P.prop.segments),
                                      "peak_rss_gb_forward": rss_fwd}), flush=True)


def plain_loop(n: int, steps: int, dtype: str, threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    dt_ = getattr(torch, dtype)
    u = torch.zeros((n + 4, n + 4), dtype=dt_)
    up = torch.zeros_like(u)
    v2 = torch.full((n, n), (2000 * 0.001 / 10.0) ** 2, dtype=dt_)
    tmp = torch.empty((n, n), dtype=dt_)

    def run(k):
        nonlocal u, up
        for _ in range(k):
            c = u[2:-2, 2:-2]
            torch.mul(c, -5.0, out=tmp)
            tmp.add_(u[2:-2, 1:-3], alpha=4 / 3).add_(u[2:-2, 3:-1], alpha=4 / 3)
            tmp.add_(u[1:-3, 2:-2], alpha=4 / 3).add_(u[3:-1, 2:-2], alpha=4 / 3)
            tmp.add_(u[2:-2, :-4], alpha=-1 / 12).add_(u[2:-2, 4:], alpha=-1 / 12)
            tmp.add_(u[:-4, 2:-2], alpha=-1 / 12).add_(u[4:, 2:-2], alpha=-1 / 12)
            tmp.mul_(v2).add_(c, alpha=2.0)
            up[2:-2, 2:-2].mul_(-1.0).add_(tmp)
            u, up = up, u
            u[n // 2 + 2, n // 2 + 2] += 1.0

    run(2)
    t0 = time.perf_counter()
    run(steps)
    return time.perf_counter() - t0


def deepwave_times(n: int, steps: int, dtype: str, threads: int):
    try:
        import deepwave  # noqa: F401
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    dt_ = getattr(torch, dtype)
    v = torch.full((n, n), 2000.0, dtype=dt_)
    w = deepwave.wavelets.ricker(15, steps, 0.001, 0.1).to(dt_).reshape(1, 1, -1)
    src = torch.tensor([[[10, n // 2]]])
    rec = torch.stack([torch.full((n // 4,), 10), torch.arange(0, n, 4)], -1).reshape(1, -1, 2)
    out = {}
    for name, grad in (("forward", False), ("forward+gradient", True)):
        ts = []
        for i in range(3):
            vv = v.clone().requires_grad_(grad)
            t0 = time.perf_counter()
            r = deepwave.scalar(vv, 10.0, 0.001, source_amplitudes=w, source_locations=src,
                                receiver_locations=rec, accuracy=4, pml_width=20, pml_freq=15)
            if grad:
                (r[-1] ** 2).sum().backward()
            if i:
                ts.append(time.perf_counter() - t0)
        out[name] = statistics.median(ts)
    return out


def triad_gpts(dtype: str, threads: int) -> float:
    """The STREAM-convention triad bound in GPts/s: best of 5 ``a = b + s*c`` on 400 MB arrays."""
    import torch

    torch.set_num_threads(threads)
    dt_ = getattr(torch, dtype)
    size = torch.tensor([], dtype=dt_).element_size()
    n = 400_000_000 // size
    a, b, c = (torch.ones(n, dtype=dt_) for _ in range(3))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.add(b, c, alpha=0.5, out=a)
        best = min(best, time.perf_counter() - t0)
    gbs = 3 * n * size / best / 1e9
    return gbs / (4 * size)  # a leapfrog update moves 4 arrays: 16 B (fp32) / 32 B (fp64)


def run_ranks(args, n: int, nx: int, r: int, kernel: str, env: dict,
              independent: bool = False) -> dict | None:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [str(mpiexec), "-n", str(r), sys.executable, __file__, "--worker", "--n", str(n),
           *(["--independent"] if independent else []),
           "--nx", str(nx), "--steps", str(args.steps), "--dtype", args.dtype, "--repeats",
           str(args.repeats), "--threads", str(args.threads), "--segments", str(args.segments),
           "--exchange-every", str(args.exchange_every)]
    env = dict(env, ODECLI_NATIVE="0" if kernel == "reference" else "1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not line:
        print(f"ranks={r} {kernel}: failed\n{p.stderr[-2000:]}")
        return None
    return json.loads(line[0][7:])


def report(res: dict, kernel: str, pts: int, base: dict, r0: int, r: int) -> None:
    for name, row in res["rows"].items():
        t = row["time_s"]
        b = base.setdefault(name, t)
        sp = b / t
        print(f"odecli {kernel:<9} ranks={r} ({'x'.join(map(str, res['proc_grid']))})  {name:<17} "
              f"{t:8.3f} s  {pts / t / 1e9:7.4f} GPts/s  speedup {sp:5.2f}  "
              f"efficiency {100 * sp / (r / r0):5.1f}%  comm {100 * row['comm_fraction']:5.1f}%  "
              f"peak RSS/rank {res['peak_rss_gb_max_rank']:.2f} GB "
              f"(forward only {res['peak_rss_gb_forward']:.2f} GB)  "
              f"time segments {res['time_segments']}")


def report_weak(res: dict, kernel: str, what: str, base: dict) -> None:
    for name, row in res["rows"].items():
        t, fastest = row["time_s"], row["min_s"]
        b, bmin = base.setdefault(name, (t, fastest))
        print(f"odecli {kernel:<9} {what:<26} {name:<17} {t:8.3f} s  "
              f"weak-scaling efficiency {100 * b / t:5.1f}%  "
              f"(fastest repeats: {fastest:.3f} s, {100 * bmin / fastest:5.1f}%)  "
              f"comm {100 * row['comm_fraction']:5.1f}%")


def weak_scaling(args, env: dict) -> None:
    """Each rank count on N x N points per rank, then the same ranks on independent one-rank
    problems; with --rounds R the whole sequence R times, each round's efficiencies against that
    round's one-rank run (a shared VM's speed drifts over minutes), and their medians."""
    n = args.weak
    print(f"\n== weak scaling: {n}x{n} points per rank, {args.steps} steps, {args.dtype} ==")
    for kernel in args.kernels:
        rounds: dict[str, dict[str, list[float]]] = {}
        for k in range(args.rounds):
            if args.rounds > 1:
                print(f"-- round {k + 1} of {args.rounds}")
            base: dict = {}
            for r in args.ranks:
                ny, nx = (n * r, n) if args.split == "rows" else (n, n * r)
                runs = [(f"ranks={r} grid {ny}x{nx}", run_ranks(args, ny, nx, r, kernel, env))]
                if r > 1:  # the same ranks, each on its own block with no messages: the ceiling
                    runs.append((f"{r} independent {n}x{n} runs",
                                 run_ranks(args, n, n, r, kernel, env, independent=True)))
                for what, res in runs:
                    if res is None:
                        continue
                    report_weak(res, kernel, what, base)
                    for name, row in res["rows"].items():
                        rounds.setdefault(what, {}).setdefault(name, []).append(
                            (base[name][0] / row["time_s"], base[name][1] / row["min_s"]))
        if args.rounds > 1:
            print(f"-- median over {args.rounds} rounds of each round's efficiency (range)")
            for what, rows in rounds.items():
                for name, effs in rows.items():
                    med, fast = ([100 * e[i] for e in effs] for i in (0, 1))
                    print(f"odecli {kernel:<9} {what:<26} {name:<17} weak-scaling efficiency "
                          f"{statistics.median(med):5.1f}% ({min(med):.1f}-{max(med):.1f}%), "
                          f"by fastest repeats {statistics.median(fast):5.1f}% "
                          f"({min(fast):.1f}-{max(fast):.1f}%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--segments", default="auto")
    ap.add_argument("--exchange-every", default="auto",
                    help="steps between halo exchanges on several ranks (parallel.exchange_every)")
    ap.add_argument("--kernels", nargs="+", default=["fused"], choices=["fused", "reference"])
    ap.add_argument("--weak", type=int, metavar="N",
                    help="weak scaling: N x N points per rank (grid N x N*ranks split 1 x ranks, "
                         "or with --split rows N*ranks x N split ranks x 1)")
    ap.add_argument("--split", default="columns", choices=["columns", "rows"],
                    help="with --weak: which way the grid grows with the ranks (and is split)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --weak: repeat the whole sequence, each round against its own 1-rank run")
    ap.add_argument("--no-peers", action="store_true", help="skip the plain loop and Deepwave")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--independent", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--nx", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.segments != "auto":
        args.segments = int(args.segments)
    if args.exchange_every != "auto":
        args.exchange_every = int(args.exchange_every)
    if args.worker:
        worker(args)
        return
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(ROOT))
    bound = triad_gpts(args.dtype, args.threads)
    print(f"triad bound ({args.threads} thread(s), {args.dtype}): {bound:.3f} GPts/s")
    if args.weak:
        weak_scaling(args, env)
        return
    for n in args.sizes:
        pts = n * n * args.steps
        print(f"\n== acoustic2d {n}x{n}, {args.steps} steps, {args.dtype}, "
              f"{args.threads} thread(s)/rank, segments {args.segments} ==")
        one_rank = {}
        for kernel in args.kernels:
            base = {}
            for r in args.ranks:
                res = run_ranks(args, n, n, r, kernel, env)
                if res is None:
                    continue
                report(res, kernel, pts, base, args.ranks[0], r)
                if r == 1:
                    rows = res["rows"]
                    one_rank[kernel] = {k: v["time_s"] for k, v in rows.items()}
                    pairs = zip(rows["forward"]["times_s"], rows["forward+gradient"]["times_s"])
                    rates = sorted(f / fb for f, fb in pairs)
                    # the fastest repeats are the least disturbed ones (the kernel harness's
                    # measure): on a busy VM the pairs' medians drift by +-0.02 from run to run
                    fastest = rows["forward"]["min_s"] / rows["forward+gradient"]["min_s"]
                    print(f"RATIO odecli {kernel} 1 rank: gradient step rate / forward rate "
                          f"{statistics.median(rates):.3f}, median of {len(rates)} interleaved pairs "
                          f"({rates[0]:.3f}-{rates[-1]:.3f}); {fastest:.3f} of the fastest repeats")
        if args.no_peers:
            continue
        t = plain_loop(n, args.steps, args.dtype, args.threads)
        print(f"plain in-place torch leapfrog (1 rank, no autograd/sponge)  {t:8.3f} s  "
              f"{pts / t / 1e9:7.4f} GPts/s")
        dw = deepwave_times(n, args.steps, args.dtype, args.threads)
        if dw is None:
            print("deepwave: not installed (pip install deepwave) - skipped")
        else:
            for name, t in dw.items():
                print(f"deepwave.scalar {name:<17} {t:8.3f} s  {pts / t / 1e9:7.4f} GPts/s (model grid)")
        fused = one_rank.get("fused")
        if fused:
            fwd, fb = fused["forward"], fused["forward+gradient"]
            print(f"RATIO odecli fused 1 rank: forward {pts / fwd / 1e9 / bound:.2f} of the triad bound")
            if dw:
                print(f"RATIO odecli fused / deepwave throughput: forward {dw['forward'] / fwd:.2f}x, "
                      f"forward+gradient {dw['forward+gradient'] / fb:.2f}x")
            if "reference" in one_rank:
                ref = one_rank["reference"]
                print(f"RATIO odecli fused / odecli reference throughput: forward "
                      f"{ref['forward'] / fwd:.1f}x, forward+gradient "
                      f"{ref['forward+gradient'] / fb:.1f}x")


if __name__ == "__main__":
    main()
