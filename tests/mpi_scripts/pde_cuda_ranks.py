"""The acoustic and elastic CUDA loops on this rank layout, run through the kernels' host build
(CPU tensors through the same launch code, as tests/test_pde_cuda.py and
tests/test_elastic_cuda.py do): traces, final fields and gradients, and which loop ran.

Usage: pde_cuda_ranks.py OUT.npz [PYxPX|auto] [--probes] [--staged] [--one-step] [--gpu]
(rank 0 writes OUT.npz; ``--probes`` adds results with the exchanges left out, which must differ;
``--one-step``: the acoustic one-step kernel on the grown blocks, an exchange after each step;
``--staged``: the exchanges copy their strips as they do for GPU fields, with torch indexing
staged through the host buffers, not with the C copies CPU fields take; ``--gpu`` runs the real
kernels on ``cuda:rank % count`` instead of the host build: benchmarks/gpu_ranks_check.py)
Imported by tests/test_pde_cuda_ranks.py for the single-rank run (``compute``).
"""

from __future__ import annotations

import contextlib
import copy
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
import elastic_equivalence as eq
from elastic_setup import build, elastic_setup
from pde_equivalence import BASE

from odecli.app.pde_problem import Problem
from odecli.parallel.comm import get_comm
from odecli.parallel.ops import gather_global, local_block
from odecli.pde.acoustic import cuda_build as acoustic_build
from odecli.pde.acoustic import cuda_loop as acoustic_loop
from odecli.pde.elastic import cuda_build as elastic_build
from odecli.pde.elastic import cuda_loop as elastic_loop
from odecli.pde.sources import ricker
from odecli.specs.pde import validate

ACOUSTIC_STEPS, ELASTIC_STEPS = 50, 40


class Counting:
    """A host launcher that counts the launches it runs, and the host steps (exchanges) among
    them, so the caller knows the CUDA loops ran and not the reference or the C loops."""

    device_type = "cpu"

    def __init__(self, inner) -> None:
        self.inner, self.launches, self.exchanges = inner, 0, 0

    def launch(self, call) -> None:
        self.launches += 1
        self.inner.launch(call)

    def run(self, *args) -> None:
        if isinstance(args[0], list):  # elastic: (calls, steps, moving)
            calls, steps = args[0], args[1]
            host = sum(isinstance(c, elastic_build.Between) for c in calls)
            self.launches += (len(calls) - host) * steps
            self.exchanges += host * steps
        else:  # acoustic: (call, steps, first, second, moving[, between])
            self.launches += args[1]
            if len(args) > 5 and args[5] is not None:
                self.exchanges += args[1]
        self.inner.run(*args)

    def run_blocks(self, *args) -> None:  # (call, steps, per_launch, fields, moving[, between])
        self.launches += args[1]
        if len(args) > 5 and args[5] is not None:
            self.exchanges += -(-args[1] // args[2])
        self.inner.run_blocks(*args)


DEVICE = torch.device("cpu")  # where the fields live: the host build's CPU, or the rank's GPU


@contextlib.contextmanager
def counted_kernels():
    """Both propagators' CUDA paths counted, on the host build for CPU tensors (on a GPU, its
    kernels as the propagators choose them); yields the counters."""
    made = {"acoustic": {}, "elastic": {}}
    saved = acoustic_loop.launcher_for, elastic_loop.launcher_for

    def chooser(kind, chosen, host):
        def launcher_for(like, comm):
            if like.device.type == "cuda":
                inner, why = chosen(like, comm)
                if inner is None:
                    return None, why
            else:
                inner = host(like.dtype)
            key = (like.device, like.dtype)
            if key not in made[kind]:
                made[kind][key] = Counting(inner)
            return made[kind][key], ""
        return launcher_for

    acoustic_loop.launcher_for = chooser("acoustic", saved[0], acoustic_build.host_launcher)
    elastic_loop.launcher_for = chooser("elastic", saved[1], elastic_build.host_launcher)
    try:
        yield made
    finally:
        acoustic_loop.launcher_for, elastic_loop.launcher_for = saved


def _global(t: torch.Tensor, decomp, comm):
    if comm.size == 1:
        return t.detach().cpu().numpy()
    return gather_global(t.detach().cpu(), decomp, comm, root=0)


ACOUSTIC = {"acoustic": False, "acoustic_free_surface": True}  # name: free surface
ELASTIC = {"elastic_fy_free_surface": {"source_type": "fy", "free_surface": True},
           "elastic_pressure": {"source_type": "pressure", "free_surface": False}}


def _acoustic(comm, proc_grid, out: dict, names=tuple(ACOUSTIC), gradient: bool = True) -> None:
    for name in names:
        raw = copy.deepcopy(BASE)
        raw["time"]["steps"] = ACOUSTIC_STEPS
        raw["boundary"]["free_surface"] = ACOUSTIC[name]
        raw["compute"].update(dtype="float64", time_segments=3, device=DEVICE.type)
        raw["regularization"] = {}
        if proc_grid is not None:
            raw["parallel"] = {"proc_grid": list(proc_grid)}
        spec = validate(raw, f"{name}.yaml")
        spec["text"] = name
        P = Problem(spec, comm)
        out[f"{name}/engine"] = np.array(P.prop.engine())
        c = P.unknown.field().detach().clone().requires_grad_(gradient)
        traces, field = P.prop.forward(c, return_field=True)
        out[f"{name}/traces"] = P.full_traces(traces.detach()).cpu().numpy()
        out[f"{name}/field"] = _global(field, P.decomp, comm)
        if gradient:
            weight = torch.cos(torch.arange(ACOUSTIC_STEPS, dtype=torch.float64) * 0.37).to(c.device)
            (traces * traces * weight).sum().backward()
            out[f"{name}/grad"] = _global(c.grad, P.decomp, comm)


def _elastic(comm, proc_grid, out: dict, names=tuple(ELASTIC), gradient: bool = True) -> None:
    _, shots, recs, comps = eq.variants()
    w = ricker(25.0, ELASTIC_STEPS, eq.DT)
    for name in names:
        setup = elastic_setup(comm, eq.SHAPE, eq.SPACING, eq.DT, ELASTIC_STEPS, shots, recs, w,
                              components=comps, width=6, proc_grid=proc_grid, segments=3,
                              **ELASTIC[name])
        if DEVICE.type == "cuda":  # one GPU per rank, as compute.device: cuda spreads them
            setup.device = torch.device(f"cuda:{comm.rank % torch.cuda.device_count()}")
            setup.local = setup.geometry.local(setup.block, setup.device, torch.float64)
        prop = build(setup)
        out[f"{name}/engine"] = np.array(prop.engine())
        model = local_block(eq.true_model(), setup.decomp).to(setup.device)
        model = model.clone().requires_grad_(gradient)
        traces, fields = prop.forward(model, return_field=True)
        full = setup.local.scatter_traces(traces.detach()).cpu()
        if comm.size > 1:
            full = torch.as_tensor(comm.allreduce_array(full.numpy()))
        out[f"{name}/traces"] = full.numpy()
        out[f"{name}/field"] = _global(fields, setup.decomp, comm)
        if gradient:
            weight = torch.cos(torch.arange(ELASTIC_STEPS, dtype=torch.float64) * 0.37).to(setup.device)
            (traces * traces * weight).sum().backward()
            out[f"{name}/grad"] = _global(model.grad, setup.decomp, comm)


def _probes(comm, proc_grid, out: dict) -> None:
    """What the comparison must catch: the acoustic and elastic traces with the forward's halo
    exchanges left out (the acoustic exchange after each launch, elastic's fill_ring_, made to
    do nothing), the elastic gradient with the adjoint's left out (fill_ring_adjoint_), and the
    acoustic gradient with the adjoint's sources only the owned receivers, not all those in
    the grown block."""
    from odecli.pde.acoustic import propagator as acoustic_propagator

    skip = lambda *args: None
    saved = (acoustic_propagator.AcousticPropagator._cuda_exchange, elastic_loop.fill_ring_,
             elastic_loop.fill_ring_adjoint_, acoustic_loop.CudaLoop.__init__)

    def owned_receivers_only(loop, *args, **kwargs):
        saved[3](loop, *args, **kwargs)
        loop.adjoint_receivers = None

    cut: dict = {}
    try:
        acoustic_propagator.AcousticPropagator._cuda_exchange = lambda prop: skip
        elastic_loop.fill_ring_ = skip
        _acoustic(comm, proc_grid, cut, ("acoustic",), gradient=False)
        _elastic(comm, proc_grid, cut, ("elastic_pressure",), gradient=False)
        acoustic_propagator.AcousticPropagator._cuda_exchange = saved[0]
        elastic_loop.fill_ring_ = saved[1]
        elastic_loop.fill_ring_adjoint_ = skip
        _elastic(comm, proc_grid, cut, ("elastic_fy_free_surface",))
        elastic_loop.fill_ring_adjoint_ = saved[2]
        acoustic_loop.CudaLoop.__init__ = owned_receivers_only
        _acoustic(comm, proc_grid, cut, ("acoustic_free_surface",))
    finally:
        (acoustic_propagator.AcousticPropagator._cuda_exchange, elastic_loop.fill_ring_,
         elastic_loop.fill_ring_adjoint_, acoustic_loop.CudaLoop.__init__) = saved
    for key in ("acoustic/traces", "elastic_pressure/traces", "elastic_fy_free_surface/grad",
                "acoustic_free_surface/grad"):
        out[f"without_exchange/{key}"] = cut[key]


def compute(proc_grid=None, probes: bool = False) -> dict:
    """Every case's results on rank 0 (``{}`` on the others), with each rank's launch and
    exchange counts (``ranks/...``, gathered); float64, the default dtype restored."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    comm = get_comm()
    out: dict = {}
    try:
        with counted_kernels() as made:
            _acoustic(comm, proc_grid, out)
            _elastic(comm, proc_grid, out)
            if probes:
                _probes(comm, proc_grid, out)
    finally:
        torch.set_default_dtype(before)
    counts = [sum(c.launches for c in made[k].values()) for k in ("acoustic", "elastic")]
    counts += [sum(c.exchanges for c in made[k].values()) for k in ("acoustic", "elastic")]
    gathered = comm.gather_object(counts, 0)
    if comm.rank != 0:
        return {}
    out["ranks/counts"] = np.array(gathered)  # per rank: acoustic, elastic launches; exchanges
    return {k: np.asarray(v) for k, v in out.items()}


if __name__ == "__main__":
    grid = sys.argv[2] if len(sys.argv) > 2 else "auto"
    pg = None if grid == "auto" else tuple(int(x) for x in grid.split("x"))
    if "--gpu" in sys.argv[3:]:
        DEVICE = torch.device("cuda")
    if "--one-step" in sys.argv[3:]:  # the one-step kernel on the grown blocks
        acoustic_loop.PER_LAUNCH = 1
    if "--staged" in sys.argv[3:]:
        from odecli.parallel import strips

        strips._on_host = lambda fields: False
        checked = strips.Boxes._native
        strips.Boxes._native = lambda self, fields: checked(self, fields) and False
    res = compute(pg, probes="--probes" in sys.argv[3:])
    if get_comm().rank == 0:
        np.savez(Path(sys.argv[1]), **res)
