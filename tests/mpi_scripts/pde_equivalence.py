"""Forward traces/fields, losses and gradients of small PDE problems on this rank layout.

Usage: pde_equivalence.py OUT.npz [PYxPX [EXCHANGE_EVERY [KERNEL_THREADS [STEPS_PER_PASS]]]]
(rank 0 writes OUT.npz)

KERNEL_THREADS > 1 splits the kernels over threads even on these small grids: a forward step's
rows, an adjoint pass's steps (pipelined row by row), and the rows of an adjoint step that runs
alone.  STEPS_PER_PASS sets the adjoint steps per pass (these small fields would get 2).
Imported by tests/test_pde_mpi.py for the single-rank reference (``compute``).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import torch

from odecli.parallel.comm import get_comm
from odecli.parallel.ops import gather_global
from odecli.app.pde_problem import Problem
from odecli.specs.pde import validate

BASE = {
    "kind": "pde-inverse",
    "equation": "acoustic2d",
    "grid": {"shape": [41, 39], "spacing": [10.0, 12.0]},
    "time": {"dt": 0.0012, "steps": 90},
    "boundary": {"absorbing_width": 6},
    "sources": {"wavelet": {"type": "ricker", "peak_frequency": 30},
                "shots": [[[60, 100]], [[200, 230], [120, 300]]]},
    "receivers": {"line": {"from": [300, 0], "to": [300, 456], "count": 15},
                  "positions": [[200, 228], [10, 10]]},
    "true_model": {"type": "gaussian", "background": 2000, "amplitude": 250,
                   "center": [200, 230], "sigma": 60},
    "unknown": {"type": "grid", "initial": {"type": "checkerboard", "background": 1950,
                                            "amplitude": 40, "size": 70},
                "bounds": [1500, 2600]},
    "regularization": {"tikhonov": 1e-4, "tv": 1e-4},
    "optimizer": {"iterations": 1},
    "compute": {"time_segments": 4},
}


def variants() -> dict:
    v = {"grid": copy.deepcopy(BASE)}
    fs = copy.deepcopy(BASE)
    fs["boundary"]["free_surface"] = True
    fs["unknown"]["transform"] = "sigmoid"
    v["grid_free_surface"] = fs
    mlp = copy.deepcopy(BASE)
    mlp["unknown"] = {"type": "mlp", "hidden": [8, 8], "base": 2000, "scale": 100,
                      "bounds": [1500, 2600]}
    mlp["regularization"] = {}
    v["mlp"] = mlp
    sc = copy.deepcopy(BASE)
    sc["unknown"] = {"type": "scalars", "model": {"type": "layered", "interfaces": [150, 260],
                                                  "values": [1900, 2100, 2300]},
                     "bounds": [1500, 2600], "transform": "softplus"}
    v["scalars"] = sc
    heat = copy.deepcopy(BASE)
    heat["equation"] = "heat2d"
    heat["boundary"] = {"type": "dirichlet", "value": 1.0, "left": "neumann",
                        "bottom": {"type": "dirichlet", "value": 0.5}}
    heat["time"] = {"dt": 0.4, "steps": 60}
    heat["sources"]["wavelet"] = {"type": "constant", "value": 5.0}
    heat["true_model"] = {"type": "gaussian", "background": 20, "amplitude": 10,
                          "center": [200, 230], "sigma": 60}
    heat["unknown"] = {"type": "grid", "initial": 22.0, "bounds": [1, 40]}
    v["heat"] = heat
    return v


def _global(t, problem, comm):
    if comm.size == 1:
        return t.detach().numpy()
    g = gather_global(t.detach(), problem.decomp, comm, root=0)
    return None if g is None else g.numpy()


def compute(proc_grid=None, exchange_every="auto", threads: int = 0) -> dict:
    torch.set_default_dtype(torch.float64)
    comm = get_comm()
    out = {}
    for name, raw in variants().items():
        raw = copy.deepcopy(raw)
        raw["parallel"] = {"exchange_every": exchange_every}
        raw["compute"]["threads"] = threads
        if proc_grid is not None:
            raw["parallel"]["proc_grid"] = list(proc_grid)
        spec = validate(raw, f"{name}.yaml")
        spec["text"] = name
        P = Problem(spec, comm)
        with torch.no_grad():
            tr, u = P.prop.forward(P.unknown.field(), return_field=True)
        out[f"{name}/traces"] = P.full_traces(tr).numpy()
        out[f"{name}/observed"] = P.observed.numpy()
        out[f"{name}/wavefield"] = _global(u, P, comm)
        loss, grads = P.evaluate(0)
        out[f"{name}/loss"] = np.array(loss)
        for pname, g, dist in zip(P.unknown.names, grads, P.unknown.distributed):
            out[f"{name}/grad/{pname}"] = _global(g, P, comm) if dist else g.numpy()
    return out


if __name__ == "__main__":
    pg = tuple(int(x) for x in sys.argv[2].split("x")) if len(sys.argv) > 2 else None
    every = int(sys.argv[3]) if len(sys.argv) > 3 else "auto"
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    if threads > 1:
        import odecli.pde.acoustic.propagator as acoustic

        acoustic.MIN_POINTS_PER_THREAD = 1
    if len(sys.argv) > 5:
        import odecli.pde.acoustic.fused as acoustic_native

        acoustic_native.STEPS_PER_PASS = int(sys.argv[5])
    res = compute(pg, every, threads)
    if get_comm().rank == 0:
        np.savez(Path(sys.argv[1]), **res)
