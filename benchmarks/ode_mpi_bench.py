#!/usr/bin/env python
"""Strong scaling of ``odecli solve`` over MPI ranks on a heterogeneous van der Pol sweep.

The sweep: ``--batch`` samples (default 10^5), mu log-spaced from 0.5 to 100 in ascending order
(the stiff corner is the end of the batch, as in a real parameter sweep), x(0) = 2, v(0) = 0,
t in [0, 10], 11 output times, dopri5 at rtol = atol = 1e-6, float64, CPU, one torch thread per
rank. Per-sample cost grows about 20x from the first to the last sample.

Every rank count runs the real command line: 1 rank is plain ``python -m odecli solve`` (no MPI),
N ranks is ``mpiexec -n N python -m odecli solve``. Reported per run:

* ``solve s``: the file's ``wall_time_s`` (the solve phase: from the first chunk handed out to the
  last result received, including writing; excludes start-up and spec loading), and ``cmd s``, the
  whole command's wall time (Python/torch import, spec parsing, file rename);
* speed-up and parallel efficiency ``T1 / (N * TN)`` on ``solve s``;
* idle fraction from the file's ``ranks/idle_s`` (sum idle / (N * solve s)), the chunk count, and
  the count-based balance: 1 - mean/max of per-rank total solver steps, for the queue's actual
  assignment and for a static split into N equal blocks (the same per-sample step counts);
* the 1-minute load average before and after the run: other jobs share the machine.

The N-rank files are compared with the 1-rank file (integers equal, floats max relative difference).

Usage::

    python benchmarks/ode_mpi_bench.py                      # 1e5 samples, 1 and 2 ranks, then 4
    python benchmarks/ode_mpi_bench.py --batch 20000 --ranks 1,2
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]


def write_spec(path: Path, batch: int) -> None:
    mu = np.geomspace(0.5, 100.0, batch)
    data = {
        "kind": "ode", "name": f"vdp-sweep-{batch}",
        "system": {"states": ["x", "v"], "params": {"mu": [float(f"{m:.6g}") for m in mu]},
                   "equations": {"x": "v", "v": "mu * (1 - x**2) * v - x"}},
        "initial": {"x": 2.0, "v": 0.0},
        "time": {"start": 0.0, "end": 10.0, "eval": 11},
        "solver": {"method": "dopri5", "rtol": 1e-6, "atol": 1e-6, "device": "cpu"},
    }
    path.write_text(yaml.safe_dump(data, default_flow_style=None))


def run(ranks: int, spec: Path, out: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "odecli", "solve", str(spec), "-o", str(out), "--force"]
    if ranks > 1:
        mpiexec = Path(sys.executable).parent / "mpiexec"
        cmd = [str(mpiexec if mpiexec.exists() else shutil.which("mpiexec")), "-n", str(ranks), *cmd]
    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    elapsed = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    row = {"ranks": ranks, "cmd_s": elapsed, "load_before": load_before, "load_after": os.getloadavg()[0],
           "stdout": proc.stdout.strip()}
    with h5py.File(out, "r") as h5:
        row["solve_s"] = float(h5.attrs["wall_time_s"])
        steps = h5["stats/n_steps"][...].astype(np.float64)
        row["steps_mean"], row["steps_max"] = float(steps.mean()), int(steps.max())
        if "ranks" in h5:
            g = h5["ranks"]
            idle, busy = g["idle_s"][...], g["busy_s"][...]
            row["idle_fraction"] = float(idle.sum() / (ranks * row["solve_s"]))
            row["busy_s"], row["idle_s"] = busy.round(2).tolist(), idle.round(2).tolist()
            row["samples"] = g["samples"][...].tolist()
            row["chunks"] = int(g["chunk_start"].size)
            owner = np.empty(steps.size, dtype=np.int64)
            for a, b, r in zip(g["chunk_start"][...], g["chunk_stop"][...], g["chunk_rank"][...]):
                owner[a:b] = r
            dynamic = np.array([steps[owner == r].sum() for r in range(ranks)])
            static = np.array([block.sum() for block in np.array_split(steps, ranks)])
            row["count_idle_queue"] = float(1 - dynamic.mean() / dynamic.max())
            row["count_idle_static"] = float(1 - static.mean() / static.max())
        else:
            row["idle_fraction"] = 0.0
    return row


def compare(a: Path, b: Path) -> float:
    """Max pointwise relative difference of float datasets but dt_final (integers must be equal)."""
    worst, scaled = 0.0, {}
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        names: list[str] = []
        fb.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for name in names:
            x, y = fa[name][...], fb[name][...]
            if y.dtype.kind != "f":
                assert np.array_equal(x, y), name
                continue
            ok = ~np.isnan(y)
            assert np.array_equal(ok, ~np.isnan(x)), name
            if name != "stats/dt_final" and ok.any():
                worst = max(worst, float((np.abs(x[ok] - y[ok]) / np.maximum(np.abs(y[ok]), 1e-300)).max()))
                scaled[name] = float(np.abs(x[ok] - y[ok]).max() / np.abs(y[ok]).max()) if np.abs(y[ok]).max() > 0 else 0.0
    print(f"# {a.name} vs {b.name}: max |diff| / max |value| per dataset: {json.dumps(scaled)}", flush=True)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts; 1 must come first")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    counts = [int(n) for n in args.ranks.split(",")]
    with tempfile.TemporaryDirectory(prefix="ode_mpi_bench.") as folder:
        folder = Path(folder)
        spec = folder / "sweep.yaml"
        write_spec(spec, args.batch)
        print(f"# {datetime.date.today()} batch {args.batch}, ranks {counts}, cpus {os.cpu_count()}", flush=True)
        rows = []
        for n in counts:
            row = run(n, spec, folder / f"n{n}.h5")
            if n != counts[0]:
                row["max_rel_diff_vs_first"] = compare(folder / f"n{n}.h5", folder / f"n{counts[0]}.h5")
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "stdout"}), flush=True)
        base = rows[0]["solve_s"] * rows[0]["ranks"]
        print("\n| ranks | solve s | cmd s | speed-up | efficiency | idle fraction | chunks | step-count idle: queue / static split | load avg before→after |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            speedup = base / r["solve_s"]
            counts_col = (f"{r['count_idle_queue']:.3f} / {r['count_idle_static']:.3f}" if "count_idle_queue" in r else "—")
            print(f"| {r['ranks']} | {r['solve_s']:.1f} | {r['cmd_s']:.1f} | {speedup:.2f}x | {speedup / r['ranks']:.0%} | "
                  f"{r['idle_fraction']:.3f} | {r.get('chunks', '—')} | {counts_col} | {r['load_before']:.1f}→{r['load_after']:.1f} |")
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
