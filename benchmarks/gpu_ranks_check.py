"""The acoustic and elastic CUDA kernels on several MPI ranks, checked on the card: 1 rank and 2
ranks (``mpiexec``, ``tests/mpi_scripts/pde_cuda_ranks.py --gpu``) on the same problems, the
2 ranks' traces and final fields against 1 rank's bit for bit, their gradients as max
|difference| / max |gradient| (the tests' bound on the host build: 1e-12, float64).

    python benchmarks/gpu_ranks_check.py [--ranks 2] [--host-dry-run]

Rank r takes ``cuda:r % count``: on a card with one GPU both ranks share it, so this checks the
exchanges of CUDA fields between the launches (staged through the host) and the rank layout,
not a multi-GPU speed, which needs several GPUs.  ``benchmarks/gpu_pde_check.py`` runs it
last; ``--host-dry-run`` runs it on the kernels' host build (no GPU).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "mpi_scripts" / "pde_cuda_ranks.py"


def _mpiexec() -> str | None:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def check_ranks(gpu: bool, ranks: int = 2, timeout: float = 240.0) -> bool:
    """Run 1 and ``ranks`` ranks and print how they compare; False if they could not run or
    differ beyond the bounds (forward bit for bit, gradients 1e-12)."""
    import torch

    count = torch.cuda.device_count() if gpu else 0
    where = (f"{count} GPU(s), rank r on cuda:r % {count}" if gpu else "the kernels' host build")
    print(f"\n== {ranks} ranks against 1: the CUDA loops with halo exchanges ({where})", flush=True)
    if gpu and count < ranks:
        print(f"   {count} GPU(s) for {ranks} ranks: ranks share a card; correctness only, no "
              "multi-GPU timing", flush=True)
    mpiexec = _mpiexec()
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        mpiexec = None
    if mpiexec is None:
        print("   skipped: no mpi4py or mpiexec here", flush=True)
        return False
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for n in (1, ranks):
            out = Path(folder) / f"ranks{n}.npz"
            cmd = [mpiexec, "-n", str(n), sys.executable, str(SCRIPT), str(out), "auto",
                   *(["--gpu"] if gpu else [])]
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, check=False, env=env, cwd=ROOT, capture_output=True,
                                      text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                print(f"   {n} rank(s): timed out after {timeout:.0f} s", flush=True)
                return False
            if proc.returncode != 0:
                print(f"   {n} rank(s) failed ({proc.returncode}):\n{proc.stderr[-2000:]}", flush=True)
                return False
            print(f"   {n} rank(s): {time.perf_counter() - t0:.1f} s wall (start-up included)",
                  flush=True)
            results[n] = dict(np.load(out))
    one, many = results[1], results[ranks]
    ok = True
    for key, ref in one.items():
        if key.startswith("ranks/"):
            continue
        if key.endswith("/engine"):
            print(f"   {key}: {many[key]}", flush=True)
            ok = ok and "CUDA kernels" in str(many[key])
            continue
        scale = max(float(np.abs(ref).max()), 1e-300)
        err = float(np.abs(many[key] - ref).max()) / scale
        if key.endswith("/grad"):
            good = err <= 1e-12
            text = f"max |difference| / max |gradient| {err:.2e}"
        else:
            good = bool(np.array_equal(many[key], ref))
            text = "bit for bit" if good else f"NOT bit for bit: {err:.2e}"
        ok = ok and good
        print(f"   {key:34s} {text}", flush=True)
    print(f"   launches per rank (acoustic, elastic; exchanges): {many['ranks/counts'].tolist()}",
          flush=True)
    print(f"   {'PASS' if ok else 'FAIL'}", flush=True)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--host-dry-run", action="store_true", help="the kernels' host build, no GPU")
    args = ap.parse_args()
    if not args.host_dry_run:
        import torch

        if not torch.cuda.is_available():
            sys.exit("no CUDA device (use --host-dry-run to check the script on the CPU)")
    sys.exit(0 if check_ranks(not args.host_dry_run, args.ranks) else 1)


if __name__ == "__main__":
    main()
