"""Elastic traces, final fields and gradients (for vp, vs, rho) on this rank layout.

Usage: elastic_equivalence.py OUT.npz [PYxPX]   (rank 0 writes OUT.npz)
Imported by tests/test_elastic.py for the single-rank reference (``compute``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from elastic_setup import build, elastic_setup

from odecli.parallel.comm import get_comm
from odecli.parallel.ops import gather_global, local_block
from odecli.pde.sources import ricker

SHAPE, SPACING, DT, NT = (37, 43), (10.0, 9.0), 0.001, 70


def true_model() -> torch.Tensor:
    """A layered, laterally varying (vp, vs, rho), with a fluid patch (vs = 0)."""
    y, x = torch.meshgrid(torch.arange(SHAPE[0], dtype=torch.float64),
                          torch.arange(SHAPE[1], dtype=torch.float64), indexing="ij")
    vp = 2000 + 8 * y + 150 * torch.exp(-((y - 20) ** 2 + (x - 25) ** 2) / 30)
    vs = 0.55 * vp - 100 * torch.exp(-((y - 12) ** 2 + (x - 12) ** 2) / 20)
    vs[3:6, 30:34] = 0.0
    rho = 1800 + 3 * x + 2 * y
    return torch.stack([vp, vs, rho])


def variants():
    recs = [(1, 5), (1, 21), (18, 20), (36, 42), (10, 40), (25, 2), (19, 21)]
    comps = ["vy", "vx", "pressure", "vy", "vx", "pressure", "vx"]
    shots = [[(18, 21, 1.0)], [(2, 6, 2.0), (30, 35, -1.0)]]
    return {
        "fy_free_surface": {"source_type": "fy", "free_surface": True},
        "pressure": {"source_type": "pressure", "free_surface": False},
        "fx_free_surface": {"source_type": "fx", "free_surface": True},
    }, shots, recs, comps


def compute(proc_grid=None) -> dict:
    """Every case's results; float64 throughout (the test imports this: the default dtype is
    restored, or every later float32 test in the process would see float64 defaults)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return _compute(proc_grid)
    finally:
        torch.set_default_dtype(before)


def _compute(proc_grid) -> dict:
    comm = get_comm()
    out = {}
    cases, shots, recs, comps = variants()
    w = ricker(25.0, NT, DT)
    for name, kw in cases.items():
        setup = elastic_setup(comm, SHAPE, SPACING, DT, NT, shots, recs, w, components=comps,
                              width=6, proc_grid=proc_grid, segments=3, **kw)
        prop = build(setup)
        model = local_block(true_model(), setup.decomp).clone().requires_grad_(True)
        traces, fields = prop.forward(model, return_field=True)
        full = setup.local.scatter_traces(traces)
        if comm.size > 1:
            full = torch.as_tensor(comm.allreduce_array(full.detach().numpy()))
        out[f"{name}/traces"] = full.detach().numpy()
        out[f"{name}/fields"] = gather_global(fields.detach(), setup.decomp, comm, 0)
        # a loss with a weight per sample, so that every trace sample matters differently
        weight = torch.cos(torch.arange(NT, dtype=torch.float64) * 0.37)[None, None, :]
        loss = (traces * traces * weight).sum()
        loss.backward()
        out[f"{name}/grad"] = gather_global(model.grad, setup.decomp, comm, 0)
    if comm.rank == 0:
        return {k: np.asarray(v) for k, v in out.items()}
    return {}


if __name__ == "__main__":
    pg = tuple(int(x) for x in sys.argv[2].split("x")) if len(sys.argv) > 2 else None
    res = compute(pg)
    if get_comm().rank == 0:
        np.savez(Path(sys.argv[1]), **res)
