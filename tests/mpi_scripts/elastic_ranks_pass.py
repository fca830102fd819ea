"""Elastic forwards without gradient (traces and final fields) on this rank layout, through the
passes on grown blocks (odecli.pde.elastic.ranks_pass), for tests/test_elastic_ranks_pass.py.

Usage: elastic_ranks_pass.py OUT.npz PYxPX [short]   (rank 0 writes OUT.npz)
Each case runs float64 and float32, passes of 4 steps (the default on one thread) and of 3;
the key ``passes`` counts the grown-block runs (so a test knows the path ran).  ``short``:
the blocks grown one cell less than the stencil needs (a probe: the results must differ).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from elastic_equivalence import DT, NT, SHAPE, SPACING, true_model, variants
from elastic_setup import build, elastic_setup

from odecli.parallel.comm import get_comm
from odecli.parallel.ops import gather_global, local_block
from odecli.pde.elastic import ranks_pass
from odecli.pde.elastic.fused import FusedLoop
from odecli.pde.sources import ricker

CASES = {"fy_free_surface": {"source_type": "fy", "free_surface": True},
         "pressure": {"source_type": "pressure", "free_surface": False},
         "fx": {"source_type": "fx", "free_surface": False}}
STEPS = (None, 3)  # FusedLoop.steps_per_pass: the default (4 on one thread), and 3


def compute(proc_grid=None) -> dict:
    comm = get_comm()
    _, shots, recs, comps = variants()
    w = ricker(25.0, NT, DT)
    out = {}
    for dtype in (torch.float64, torch.float32):
        for name, kw in CASES.items():
            setup = elastic_setup(comm, SHAPE, SPACING, DT, NT, shots, recs, w,
                                  components=comps, width=6, proc_grid=proc_grid, dtype=dtype,
                                  **kw)
            model = local_block(true_model().to(dtype), setup.decomp)
            for steps in STEPS:
                FusedLoop.steps_per_pass = steps
                try:
                    with torch.no_grad():
                        traces, fields = build(setup).forward(model, return_field=True)
                finally:
                    FusedLoop.steps_per_pass = None
                full = setup.local.scatter_traces(traces)
                if comm.size > 1:
                    full = torch.as_tensor(comm.allreduce_array(full.numpy()))
                key = f"{name}/{str(dtype)[6:]}/{steps}"
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
    if "short" in sys.argv[3:]:
        grown = ranks_pass.extension
        ranks_pass.extension = lambda steps: grown(steps) - 1
    res = compute(tuple(int(x) for x in sys.argv[2].split("x")))
    total = get_comm().allreduce_scalar(float(runs[0]))
    if get_comm().rank == 0:
        np.savez(Path(sys.argv[1]), passes=np.asarray(total), **res)
