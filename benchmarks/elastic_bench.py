"""Benchmark the elastic2d propagator side by side with ``deepwave.elastic`` (same run).

    python benchmarks/elastic_bench.py                      # 1000^2 model, 100 steps
    python benchmarks/elastic_bench.py --n 500 --steps 60 --threads 1 2 --dtypes float64 float32
    python benchmarks/elastic_bench.py --ranks 1 2 --n 2000 --steps 50   # odecli on MPI ranks

Both propagate the same model (vp 2000-2600 m/s increasing with depth, vs = vp/1.8 with a
slower lens, rho 1800-2200) on the same cells: Deepwave pads the n x n model with its 20-cell
PML on every side, odecli is given the padded (n + 40)^2 grid with a 20-cell CPML inside it;
4th order in space, the same dt and steps, one vertical-force shot in the middle, 100 vy
receivers on a line.  Each measurement runs in a fresh subprocess (worker mode; with
``--repeat N`` the engines alternate N times and each row shows each one's fastest) with
``torch.set_num_threads(threads)`` and odecli's ``threads`` kernel threads, times one call
after a small warm-up (the C build is cached), and reports its peak resident memory above the
process's memory before the call (``ru_maxrss``, the model and the imports excluded).
Forward: no gradient.  Forward + gradient: the gradient of sum(traces^2) for the three
parameters (odecli: vp, vs, rho; Deepwave: lambda, mu, buoyancy).  RATIO lines compare numbers
from this run; ``cpu_ratio`` compares process CPU time (all threads), which on a loaded shared
machine says more than wall time for one thread.  The traces' agreement: relative L2 difference of odecli's vy traces and
Deepwave's after the best single scale factor (the two scale point forces differently) and
the factor itself.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PML = 20
H, DT, F = 5.0, 0.0005, 15.0


def model(n: int, dtype):
    import torch

    y = torch.arange(n, dtype=dtype)[:, None].expand(n, n)
    x = torch.arange(n, dtype=dtype)[None, :].expand(n, n)
    vp = 2000 + 600 * y / n
    lens = torch.exp(-((y - 0.6 * n) ** 2 + (x - 0.4 * n) ** 2) / (0.01 * n * n))
    vs = vp / 1.8 - 150 * lens
    rho = 1800 + 400 * y / n
    return vp.contiguous(), vs.contiguous(), rho.contiguous()


def worker(engine: str, mode: str, n: int, steps: int, dtype_name: str, threads: int,
           receiver_row: int | None = None) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    from odecli.pde.sources import ricker

    wavelet = ricker(F, steps, DT)
    vp, vs, rho = model(n, dtype)
    grad = mode == "gradient"
    ny = nx = n + 2 * PML
    src = (PML + n // 2, PML + n // 2)
    row = PML + 10 if receiver_row is None else PML + receiver_row
    recs = [(row, PML + int(k * (n - 1) / 99)) for k in range(100)]
    if engine == "deepwave":
        import deepwave

        warnings.filterwarnings("ignore")
        params = [rho * (vp**2 - 2 * vs**2), rho * vs**2, 1.0 / rho]
        amp = torch.as_tensor(wavelet, dtype=dtype).reshape(1, 1, -1)
        sloc = torch.tensor([[[src[0] - PML, src[1] - PML]]])
        rloc = torch.tensor([[[r[0] - PML, r[1] - PML] for r in recs]])

        def run(p):
            out = deepwave.elastic(*p, H, DT, source_amplitudes_y=amp, source_locations_y=sloc,
                                   receiver_locations_y=rloc, accuracy=4, pml_width=PML,
                                   pml_freq=F, max_vel=2600.0)
            return out.receiver_amplitudes_y

        def small():
            p = [t[:40, :40].contiguous() for t in params]
            deepwave.elastic(*p, H, DT, source_amplitudes_y=amp[..., :5],
                             source_locations_y=torch.tensor([[[20, 20]]]), accuracy=4,
                             pml_width=PML)
        inputs = params
    else:
        sys.path.insert(0, str(ROOT / "tests"))
        from elastic_setup import build, elastic_setup

        from odecli.parallel.comm import get_comm

        pad = lambda t: torch.nn.functional.pad(t[None, None], (PML,) * 4,
                                                mode="replicate")[0, 0]
        coef = torch.stack([pad(vp), pad(vs), pad(rho)])
        setup = elastic_setup(get_comm(), (ny, nx), (H, H), DT, steps, [[(*src, 1.0)]], recs,
                              wavelet, width=PML, segments=round(steps**0.5), dtype=dtype,
                              pml_speed=2600.0)
        setup.threads = threads
        prop = build(setup)

        def run(p):
            return prop.forward(p[0])

        def small():
            s2 = elastic_setup(get_comm(), (40, 40), (H, H), DT, 5, [[(20, 20, 1.0)]],
                               [(5, 5)], wavelet[:5], width=PML // 2, dtype=dtype)
            s2.threads = threads
            with torch.no_grad():
                build(s2).forward(torch.stack([c[:40, :40] for c in coef]))
        inputs = [coef]
    small()
    inputs = [t.clone().requires_grad_(grad) for t in inputs]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open("/proc/self/statm") as f:
        rss_now = int(f.read().split()[1]) * resource.getpagesize() / 1024
    t0, c0 = time.perf_counter(), time.process_time()
    if grad:
        traces = run(inputs)
        (traces * traces).sum().backward()
    else:
        with torch.no_grad():
            traces = run(inputs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"wall": wall, "cpu": cpu, "peak_mb": (peak - max(rss_now, 0)) / 1024, "base_mb": base / 1024}
    if not grad:
        np.save(Path(f"/tmp/elastic_bench_{engine}_{dtype_name}.npy"),
                traces.detach().reshape(len(recs), steps).numpy())
    return out


def rank_worker(mode: str, n: int, steps: int, dtype_name: str) -> dict | None:
    """One rank of ``mpiexec -n R``: the benchmark's odecli problem on this rank's block (one
    kernel thread), timed after a warm-up; rank 0 returns the ranks' slowest wall time, summed
    process CPU time and the halo exchanges' wall time (largest over the ranks)."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "tests"))
    from elastic_setup import build, elastic_setup

    from odecli.parallel.comm import get_comm
    from odecli.parallel.ops import local_block
    from odecli.pde.sources import ricker

    comm = get_comm()
    dtype = getattr(torch, dtype_name)
    vp, vs, rho = model(n, dtype)
    pad = lambda t: torch.nn.functional.pad(t[None, None], (PML,) * 4, mode="replicate")[0, 0]
    ny = nx = n + 2 * PML
    recs = [(PML + 10, PML + int(k * (n - 1) / 99)) for k in range(100)]

    def problem(nt):
        setup = elastic_setup(comm, (ny, nx), (H, H), DT, nt, [[(PML + n // 2, PML + n // 2, 1.0)]],
                              recs, ricker(F, nt, DT), width=PML, segments=round(nt**0.5),
                              dtype=dtype, pml_speed=2600.0)
        coef = local_block(torch.stack([pad(vp), pad(vs), pad(rho)]), setup.decomp).contiguous()
        return build(setup), coef, setup.timer

    def run(prop, coef):
        if mode == "gradient":
            c = coef.clone().requires_grad_(True)
            traces = prop.forward(c)
            (traces * traces).sum().backward()
        else:
            with torch.no_grad():
                prop.forward(coef)

    run(*problem(3)[:2])  # warm-up: the C build, the pool, MPI's first messages
    prop, coef, timer = problem(steps)
    timer.reset()
    comm.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    run(prop, coef)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    comm.barrier()
    out = {"wall": comm.allreduce_scalar(wall, op="max"),
           "cpu": comm.allreduce_scalar(cpu, op="sum"),
           "exchange": comm.allreduce_scalar(timer.comm_s, op="max")}
    # one exchange alone: the stresses' 2-cell ring (the larger of a step's two), each started
    # after a barrier so that a rank waiting for a slower one does not count
    from odecli.parallel.ops import fill_ring_

    ring = torch.zeros((1, 3, coef.shape[1] + 4, coef.shape[2] + 4), dtype=dtype)
    best = float("inf")
    for _ in range(20):
        comm.barrier()
        t0 = time.perf_counter()
        fill_ring_(ring, prop.decomp, comm, 2)
        best = min(best, time.perf_counter() - t0)
    out["one_exchange"] = comm.allreduce_scalar(best, op="max")
    return out if comm.rank == 0 else None


def measure_ranks(ranks: int, mode: str, n: int, steps: int, dtype: str) -> dict:
    mpiexec = Path(sys.executable).with_name("mpiexec")
    cmd = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(ranks), sys.executable,
           __file__, "--rank-worker", mode, str(n), str(steps), dtype]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ranks_table(ranks: list[int], n: int, steps: int, dtypes: list[str], modes: list[str]) -> None:
    """R ranks against 1 rank on the same problem: speed-up of wall time, and the exchanges'
    share of a rank's wall time (waiting for the other ranks included), and the cost of a
    step's two exchanges alone (fastest of 20 after a barrier) against a rank's CPU time per
    step: whether deeper halos, exchanged every k steps, would pay."""
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"grid {n}^2 model + {PML}-cell PML per side, {steps} steps, 1 kernel thread per rank, "
          f"load average {load} before")
    print("dtype    mode      ranks  wall_s   cpu_s  exchange_s  exchange_share  speedup  "
          "one_exchange_ms  2_exchanges/step")
    for dtype in dtypes:
        for mode in modes:
            base = None
            for r in ranks:
                m = measure_ranks(r, mode, n, steps, dtype)
                base = base or m
                print(f"{dtype:8s} {mode:9s} {r:5d} {m['wall']:7.2f} {m['cpu']:7.2f} "
                      f"{m['exchange']:11.3f} {m['exchange'] / m['wall']:15.3f} "
                      f"{base['wall'] / m['wall']:8.2f} {1e3 * m['one_exchange']:16.3f} "
                      f"{2 * m['one_exchange'] * steps / (m['cpu'] / r):17.4f}", flush=True)


def measure(engine, mode, n, steps, dtype, threads, receiver_row=-1) -> dict:
    cmd = [sys.executable, __file__, "--worker", engine, mode, str(n), str(steps), dtype,
           str(threads), str(receiver_row)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    ap.add_argument("--modes", nargs="+", default=["forward", "gradient"])
    ap.add_argument("--compare", type=int, nargs=2, default=[200, 600], metavar=("N", "STEPS"),
                    help="the traces' agreement on this model size and steps (0 0: skip)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="alternating runs of each engine per row; the fastest of each is shown")
    ap.add_argument("--ranks", type=int, nargs="+", metavar="R",
                    help="instead: odecli alone on R MPI ranks each (mpiexec), against the first")
    ap.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    ap.add_argument("--rank-worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_worker:
        mode, n, steps, dtype = args.rank_worker
        out = rank_worker(mode, int(n), int(steps), dtype)
        if out is not None:
            print(json.dumps(out))
        return
    if args.ranks:
        ranks_table(args.ranks, args.n, args.steps, args.dtypes, args.modes)
        return
    if args.worker:
        e, m, n, s, d, t, row = args.worker
        print(json.dumps(worker(e, m, int(n), int(s), d, int(t),
                                None if int(row) < 0 else int(row))))
        return
    import numpy as np

    print(f"grid {args.n}^2 model + {PML}-cell PML per side, {args.steps} steps, 4th order")
    print("dtype    threads mode      odecli_s  deepwave_s  time_ratio  cpu_ratio  odecli_MB  "
          "deepwave_MB  mem_ratio")
    for dtype in args.dtypes:
        for threads in args.threads:
            for mode in args.modes:
                runs = [(measure("odecli", mode, args.n, args.steps, dtype, threads),
                         measure("deepwave", mode, args.n, args.steps, dtype, threads))
                        for _ in range(args.repeat)]
                # the fastest of the alternating runs of each (others' load only slows them)
                a, b = ({k: min(r[e][k] for r in runs) for k in runs[0][e]} for e in (0, 1))
                print(f"{dtype:8s} {threads:7d} {mode:9s} {a['wall']:9.3f} {b['wall']:11.3f} "
                      f"{a['wall'] / b['wall']:11.2f} {a['cpu'] / b['cpu']:10.2f} "
                      f"{a['peak_mb']:10.0f} {b['peak_mb']:12.0f} "
                      f"{a['peak_mb'] / max(b['peak_mb'], 1):10.2f}", flush=True)
                print(f"RATIO {dtype} {threads} thread(s) {mode}: odecli/deepwave time "
                      f"{a['wall'] / b['wall']:.2f}, peak memory {a['peak_mb'] / max(b['peak_mb'], 1):.2f}")
    n, steps = args.compare
    if n:
        # receivers 40 cells above the source: P and S arrive inside the window
        for dtype in args.dtypes:
            for engine in ("odecli", "deepwave"):
                measure(engine, "forward", n, steps, dtype, 1, n // 2 - 40)
            o = np.load(f"/tmp/elastic_bench_odecli_{dtype}.npy")
            d = np.load(f"/tmp/elastic_bench_deepwave_{dtype}.npy")
            scale = float((o * d).sum() / (d * d).sum())
            diff = np.linalg.norm(o - scale * d) / np.linalg.norm(o)
            raw = np.linalg.norm(o - d / (H * H)) / np.linalg.norm(o)
            print(f"TRACES {dtype} ({n}^2, {steps} steps): odecli vs Deepwave relative L2 "
                  f"{raw:.3g} with Deepwave's force / (dy dx); {diff:.3g} after the best scale "
                  f"{scale:.4g} (1/(dy dx) = {1 / (H * H):.4g})")


if __name__ == "__main__":
    main()
