"""Elastic forwards without gradient (traces and final fields) on this rank layout, through the
passes on grown blocks (odecli.pde.elastic.ranks_pass), for tests/test_elastic_ranks_pass.py.

Usage: elastic_ranks_pass.py OUT.npz PYxPX [short]   (rank 0 writes OUT.npz)
Each case runs float64 and float32, passes of 4 steps (the default on one thread) and of 3,
and float64 on two kernel threads per rank sharing passes of 3 steps;
the key ``passes`` counts the grown-block runs (so a test knows the path ran).  ``short``:
also the float64 runs on blocks grown one cell less than the stencil needs, under ``short/``
(a probe: they must differ).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from elastic_equivalence import DT, NT, SHAPE, SPACING, true_model, variants
from elastic_setup import build, elastic_setup

from odecli.parallel.comm import get_comm
from odecli.parallel.ops import gather_global, local_block
from odecli.pde.elastic import propagator, ranks_pass
from odecli.pde.elastic.fused import FusedLoop
from odecli.pde.sources import ricker

CASES = {"fy_free_surface": {"source_type": "fy", "free_surface": True},
         "pressure": {"source_type": "pressure", "free_surface": False},
         "fx": {"source_type": "fx", "free_surface": False}}
STEPS = (None, 3)  # FusedLoop.steps_per_pass: the default (4 on one thread), and 3
MIN_POINTS = propagator.MIN_POINTS_PER_THREAD


def compute(proc_grid=None, dtypes=(torch.float64, torch.float32)) -> dict:
    comm = get_comm()
    _, shots, recs, comps = variants()
    w = ricker(25.0, NT, DT)
    out = {}
    for dtype in dtypes:
        for name, kw in CASES.items():
            setup = elastic_setup(comm, SHAPE, SPACING, DT, NT, shots, recs, w,
                                  components=comps, width=6, proc_grid=proc_grid, dtype=dtype,
                                  **kw)
            model = local_block(true_model().to(dtype), setup.decomp)
            runs = [(steps, 1) for steps in STEPS]
            if dtype == torch.float64:
                runs.append((3, 2))  # two kernel threads sharing each pass's 3 steps
            for steps, threads in runs:
                FusedLoop.steps_per_pass = steps
                propagator.MIN_POINTS_PER_THREAD = 1  # two threads on these small blocks
                try:
                    with torch.no_grad():
                        prop = build(replace(setup, threads=threads))
                        assert prop.threads == threads
                        traces, fields = prop.forward(model, return_field=True)
                finally:
                    FusedLoop.steps_per_pass = None
                    propagator.MIN_POINTS_PER_THREAD = MIN_POINTS
                full = setup.local.scatter_traces(traces)
                if comm.size > 1:
                    full = torch.as_tensor(comm.allreduce_array(full.numpy()))
                key = f"{name}/{str(dtype)[6:]}/{steps}/{threads}"
                out[f"{key}/traces"] = full.numpy()
                out[f"{key}/fields"] = gather_global(fields, setup.decomp, comm, 0)
    return {k: np.asarray(v) for k, v in out.items()} if comm.rank == 0 else {}


if __name__ == "__main__":
    runs = [0]
    original = ranks_pass.RankPasses.run

    def counted(self, *args):
        runs[0] += 1
        return original(self, *args)

    ranks_pass.RankPasses.run = counted
    pg = tuple(int(x) for x in sys.argv[2].split("x"))
    res = compute(pg)
    total = get_comm().allreduce_scalar(float(runs[0]))
    if "short" in sys.argv[3:]:  # the probe, float64 alone
        grown = ranks_pass.extension
        ranks_pass.extension = lambda steps: grown(steps) - 1
        res.update({f"short/{k}": v for k, v in compute(pg, (torch.float64,)).items()})
    if get_comm().rank == 0:
        np.savez(Path(sys.argv[1]), passes=np.asarray(total), **res)
