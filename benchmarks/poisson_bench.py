"""Time one Poisson/Darcy solve ``-div(kappa grad u) = f`` with odecli's multigrid-preconditioned
CG against scipy's sparse direct solve and pyamg (smoothed aggregation, CG-accelerated).

    python benchmarks/poisson_bench.py                       # 512^2, 1024^2, 2048^2; 2 ranks at 2048^2
    python benchmarks/poisson_bench.py --sizes 512 --spsolve-max 512 --ranks 0

Every solver gets the same matrix (assembled here, vectorised, from heat2d's face rule: mean
conductivities between cells, a Dirichlet side's face the cell's own), the same right-hand side
and the same stopping rule, a relative residual ``||b - A u|| / ||b|| <= rtol``; each solution's
true relative residual is printed.  The problem: a permeability with a high-conductivity channel
(10x) on a smooth background, Dirichlet left and right (pressures 1 and 0), no flux top and
bottom, a few dozen point wells pumping in and out.  Times are setup + solve, one core (one
thread per process, set before numpy and torch load), the median of ``--repeats`` runs; pyamg's
and odecli's ratio is printed per size.  With ``--ranks N`` the driver relaunches itself under
mpiexec for odecli's solve at the largest size on 1 and on N ranks, alternating ``--rounds``
times, and prints the speed-up of the medians.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

RTOL = 1e-10
BOUNDARY = {"left": {"type": "dirichlet", "value": 1.0}, "right": {"type": "dirichlet", "value": 0.0},
            "top": {"type": "neumann"}, "bottom": {"type": "neumann"}}


def problem(n: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Conductivity ``(n, n)``, point sources ``(n, n)`` and the spacing of an ``n x n`` grid."""
    h = 1.0 / n
    y, x = np.meshgrid((np.arange(n) + 0.5) * h, (np.arange(n) + 0.5) * h, indexing="ij")
    kappa = 1.0 + 0.5 * np.sin(2 * np.pi * x) * np.cos(3 * np.pi * y)
    channel = np.abs(y - (0.5 + 0.2 * np.sin(2 * np.pi * x))) < 0.06
    kappa = np.where(channel, 10.0, kappa)
    f = np.zeros((n, n))
    rng = np.random.default_rng(0)
    wells = rng.integers(n // 10, n - n // 10, size=(36, 2))
    f[wells[:, 0], wells[:, 1]] = rng.choice([-1.0, 1.0], size=36) / h**2
    return kappa, f, h


def assemble(kappa: np.ndarray, h: float):
    """The sparse matrix and the Dirichlet lift, vectorised (independent of odecli's stencil)."""
    import scipy.sparse as sp

    ny, nx = kappa.shape
    ew = 0.5 * (kappa[:, :-1] + kappa[:, 1:]) / h**2  # faces between x-neighbours
    ns = 0.5 * (kappa[:-1, :] + kappa[1:, :]) / h**2
    diag = np.zeros((ny, nx))
    diag[:, :-1] += ew
    diag[:, 1:] += ew
    diag[:-1, :] += ns
    diag[1:, :] += ns
    lift = np.zeros((ny, nx))
    for side, col in (("left", 0), ("right", nx - 1)):
        c = kappa[:, col] / h**2
        diag[:, col] += c
        lift[:, col] += c * BOUNDARY[side]["value"]
    east = np.zeros((ny, nx))
    east[:, :-1] = ew
    south = np.zeros((ny, nx))
    south[:-1, :] = ns
    e, s = east.ravel()[:-1], south.ravel()[:-nx]
    a = sp.diags([diag.ravel(), -e, -e, -s, -s], [0, 1, -1, nx, -nx], format="csr")
    return a, lift.ravel()


def timed(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def odecli_solve(kappa_block, f_block, h, decomp, comm):
    """Setup (faces, multigrid hierarchy) and one solve on this rank's block."""
    import torch

    from odecli.pde.grid import Block, Grid
    from odecli.pde.linear.diffusion import DiffusionBoundary
    from odecli.pde.linear.settings import SolverSettings
    from odecli.pde.linear.solve import DiffusionSystem

    ny, nx = decomp.global_shape
    grid = Grid(ny, nx, h, h)
    bnd = DiffusionBoundary(grid, Block.of(decomp), BOUNDARY, decomp, comm, None, torch.float64)
    with torch.no_grad():
        faces = bnd.faces(kappa_block)
        system = DiffusionSystem(faces, h, h, decomp, comm, SolverSettings(RTOL, 200))
        u = system.solve((f_block + bnd.lift(faces))[None])
    return u[0], system.iterations[0], len(system.preconditioner.levels)


def worker(args) -> None:
    """odecli's solve on the ranks of this mpiexec; rank 0 prints ``ranks seconds iterations``."""
    import torch

    from odecli.parallel.comm import get_comm
    from odecli.parallel.decomposition import decompose

    torch.set_num_threads(1)
    comm = get_comm()
    n = args.sizes[-1]
    kappa, f, h = problem(n)
    d = decompose((n, n), comm.size, comm.rank)
    kb = torch.as_tensor(kappa[d.y0:d.y1, d.x0:d.x1].copy())
    fb = torch.as_tensor(f[d.y0:d.y1, d.x0:d.x1].copy())
    times = []
    for _ in range(args.repeats):
        comm.barrier()
        t0 = time.perf_counter()
        _, its, _ = odecli_solve(kb, fb, h, d, comm)
        comm.barrier()
        times.append(time.perf_counter() - t0)
    if comm.rank == 0:
        print(f"RANKS {comm.size} {statistics.median(times):.4f} {its}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], default=[512, 1024, 2048])
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--spsolve-max", type=int, default=1024, help="largest n for scipy's spsolve")
    p.add_argument("--ranks", type=int, default=2, help="also odecli at the largest size on N ranks (0: no)")
    p.add_argument("--rounds", type=int, default=2, help="alternating 1-rank / N-rank rounds")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return

    import pyamg
    import scipy.sparse.linalg as spl
    import torch

    from odecli.parallel.comm import Comm
    from odecli.parallel.decomposition import decompose

    torch.set_num_threads(1)
    print(f"one core; rtol {RTOL:g} (relative residual); median of {args.repeats}")
    print(f"{'n':>6} {'odecli s':>9} {'its':>4} {'lvls':>4} {'pyamg s':>9} {'its':>4} "
          f"{'spsolve s':>9} {'odecli/pyamg':>12} {'odecli/spsolve':>14}  residuals odecli, pyamg, spsolve")
    for n in args.sizes:
        kappa, f, h = problem(n)
        a, lift = assemble(kappa, h)
        b = f.ravel() + lift
        bnorm = np.linalg.norm(b)

        def res(u):
            return np.linalg.norm(b - a @ u.ravel()) / bnorm

        d = decompose((n, n), 1, 0)
        kt, ft = torch.as_tensor(kappa), torch.as_tensor(f)
        t_ours, (u, its, levels) = timed(lambda: odecli_solve(kt, ft, h, d, Comm()), args.repeats)
        history: list[float] = []

        def amg():
            history.clear()
            ml = pyamg.smoothed_aggregation_solver(a, symmetry="symmetric")
            return ml.solve(b, tol=RTOL, accel="cg", maxiter=500, residuals=history)

        t_amg, u_amg = timed(amg, args.repeats)
        t_sp, r_sp = float("nan"), float("nan")
        if n <= args.spsolve_max:
            t_sp, u_sp = timed(lambda: spl.spsolve(a.tocsc(), b), args.repeats)
            r_sp = res(u_sp)
        print(f"{n:>6} {t_ours:>9.3f} {its:>4} {levels:>4} {t_amg:>9.3f} {len(history) - 1:>4} "
              f"{t_sp:>9.3f} {t_ours / t_amg:>12.2f} {t_ours / t_sp:>14.3f}  "
              f"{res(u.numpy()):.1e}, {res(u_amg):.1e}, {r_sp:.1e}", flush=True)

    if args.ranks > 1:
        # 1 rank and N ranks alternate, each a fresh mpiexec, so that both meet the same load
        mpiexec = Path(sys.executable).parent / "mpiexec"
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        runs: dict[int, list[float]] = {1: [], args.ranks: []}
        for _ in range(args.rounds):
            for ranks in runs:
                cmd = [str(mpiexec), "-n", str(ranks), sys.executable, __file__, "--worker",
                       "--sizes", str(args.sizes[-1]), "--repeats", "1"]
                out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
                line = next(x for x in out.splitlines() if x.startswith("RANKS"))
                runs[ranks].append(float(line.split()[2]))
                its = line.split()[3]
        one, many = statistics.median(runs[1]), statistics.median(runs[args.ranks])
        print(f"{args.sizes[-1]}^2, {its} iterations, medians of {args.rounds} alternating rounds: "
              f"1 rank {one:.3f} s, {args.ranks} ranks {many:.3f} s, speed-up {one / many:.2f}x")


if __name__ == "__main__":
    main()
