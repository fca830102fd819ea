"""The elastic forward without gradient in passes of several steps on several ranks: each rank
steps its block grown into its neighbours' (deep halos), with one halo exchange per pass
instead of two per step; what :meth:`FusedLoop.run <odecli.pde.elastic.fused.FusedLoop.run>`
calls there for a forward without a graph.

Why: the per-step path on ranks runs each step as two half-step sweeps with an exchange
between them, so it gets none of the one-rank passes' cache reuse
(:mod:`odecli.pde.elastic.forward_pass`) and waits on its neighbours twice a step.  Here a
rank's block is grown by :func:`extension` cells on every side with a neighbour; one exchange
per pass fills the grown cells and the fields' ring there from the neighbours (the fields, and
the CPML memory variables on the grown cells); then the one-rank pass (``elastic_run_rows``,
unchanged) runs ``steps`` steps on the grown block.  The cells next to the grown block's edge
go wrong (the ring beyond it is not the neighbours'), by the stencils' reach (:data:`REACH`) per
step, so after the pass the owned block and a margin are still exact: every number there
is the same operations on the same inputs as on one rank, so the traces and fields are one
rank's bit for bit (tests/test_elastic_ranks_pass.py).  The acoustic engine's fused loop does
the same with shrinking windows (:mod:`odecli.pde.acoustic.loop`); here the grown block is
stepped whole (the redundant cells cost ``extension / block`` more work per side).

What the grown block needs from the neighbours once per run: the staggered parameters (one
deep exchange), the CPML coefficients (functions of the global index,
:meth:`ElasticPropagator.profiles_over`), the sources inside it (gathered once from all
ranks, kept on the propagator) and, on the top ranks, the free surface's coefficient
(computed from the grown parameters by :func:`~odecli.pde.elastic.reference.materials`'s
expression).  The receivers are read on the owned block only.

Not for a gradient's first passes (which start from and return the memory variables): tried
(the memory variables copied into the grown block and back, the fields copied in, the grown
parameters exchanged per time segment) and dropped, as at the default segments of ~sqrt(nt)
steps those copies cost what the passes saved: 2 ranks, 1000^2, 60 steps, float64, gradient
of sum(traces^2), summed CPU time 3.41-3.78 s against 3.05-3.52 s per step (3 alternating
runs, loaded machine).
"""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import torch
from torch import Tensor

from odecli.parallel.ops import HaloPlan
from odecli.pde.elastic.forward_pass import STEPS_PER_THREAD, run_passes
from odecli.pde.elastic.reference import N_PSI, RING, Materials
from odecli.threads import split_rows

REACH = 3  # cells a step (two half steps) reads toward one side: see extension()


def extension(steps: int) -> int:
    """Cells a block grows into a neighbour for passes of ``steps`` steps.  A velocity half
    step reads the stresses 2 rows (columns) toward one side and the stress half step the
    velocities 1 more (vy[i + 1/2] reads syy[i + 2], syy[i] reads vy[i + 1/2]; vx and sxy
    alike): :data:`REACH` cells a step.  At a pass's start the fields are exact on the grown
    cells and their ring (also exchanged), the memory variables (no ring) on the grown cells
    only, and a step at a point reads its memory variables there: so ``REACH * steps - 1``
    cells (measured the least: one fewer changes the traces of every case in
    tests/test_elastic_ranks_pass.py, passes of 3 and 4 steps)."""
    return REACH * steps - 1


def pass_steps(prop, override: int | None) -> int | None:
    """Steps per pass on ranks, or None where the passes do not run (one rank; ``override``
    0, the per-step path; a block too small to lend its neighbours ``extension + RING``
    cells).  The same on every rank (they exchange in step): ``override`` or
    :data:`STEPS_PER_THREAD` per kernel thread of the rank with fewest (a rank's thread count
    follows its block's size)."""
    if prop.comm.size == 1 or override == 0:
        return None
    steps = override
    if not steps:
        steps = prop.__dict__.get("_rank_pass_steps")
    if not steps:
        pieces = len(split_rows(prop.block.shape[0], prop.threads))
        threads = int(prop.comm.allreduce_scalar(float(pieces), op="min"))
        steps = prop.__dict__["_rank_pass_steps"] = STEPS_PER_THREAD * max(1, threads)
    if min(prop.decomp.min_local_shape) < extension(steps) + RING:
        return None
    return int(steps)


class Layout:
    """A rank's block grown by :func:`extension` cells on every side with a neighbour: the
    kernels' block ``(ny, nx)``, the owned block's rows and columns in it, the ringed fields'
    shape ``(B, 5, ny + 2 RING, nx + 2 RING)`` (velocities then stresses, one exchange) and
    the memory variables' ``(B, 8, ny, nx)``."""

    def __init__(self, prop, steps: int) -> None:
        d = prop.decomp
        self.extension = extension(steps)
        self.grow = tuple(self.extension if peer is not None else 0
                          for peer in (d.north, d.south, d.west, d.east))
        gn, gs, gw, ge = self.grow
        ny, nx = prop.block.shape
        self.ny, self.nx = ny + gn + gs, nx + gw + ge
        self.owned = (slice(gn, gn + ny), slice(gw, gw + nx))
        self.ringed_owned = (slice(None), slice(None), slice(gn + RING, gn + ny + RING),
                             slice(gw + RING, gw + nx + RING))
        shots = prop.geom.nshots
        self.fields_shape = (shots, 5, self.ny + 2 * RING, self.nx + 2 * RING)
        self.psi_shape = (shots, N_PSI, self.ny, self.nx)

    def holds(self, v: Tensor, s: Tensor) -> Tensor | None:
        """The grown fields tensor whose owned block ``v`` and ``s`` are the views of (as
        :func:`grown_fields` hands them out), else None."""
        base = v._base
        if (base is None or s._base is not base or tuple(base.shape) != self.fields_shape
                or not base.is_contiguous()):
            return None
        own_v, own_s = base[:, :2][self.ringed_owned], base[:, 2:][self.ringed_owned]
        if (v.data_ptr(), s.data_ptr(), v.stride(), s.stride()) != (
                own_v.data_ptr(), own_s.data_ptr(), own_v.stride(), own_s.stride()):
            return None
        return base


def grown_fields(prop, like: Tensor, override: int | None) -> tuple[Tensor, Tensor] | None:
    """Zero velocities and stresses ``(B, 2 | 3, ny, nx)`` as the owned block's views of one
    grown fields tensor, which :meth:`RankPasses.run` then steps in place (no copies of the
    fields in or out); None where the passes do not run on ranks."""
    steps = pass_steps(prop, override)
    if steps is None:
        return None
    lay = Layout(prop, steps)
    fields = _lazy_zeros(lay.fields_shape, like.dtype)
    return fields[:, :2][lay.ringed_owned], fields[:, 2:][lay.ringed_owned]


def _all_sources(prop) -> list[tuple[int, int, int, float]]:
    """Every rank's sources ``(shot, global iy, global ix, amplitude)``, rank by rank (each
    rank's in its geometry's order, so sources at one node keep one rank's order); gathered
    once and kept on the propagator."""
    cached = prop.__dict__.get("_all_sources")
    if cached is None:
        g, b = prop.geom, prop.block
        mine = [(int(s), int(iy) + b.y0, int(ix) + b.x0, float(a)) for s, iy, ix, a in
                zip(g.src_shot.tolist(), g.src_iy.tolist(), g.src_ix.tolist(),
                    g.src_amp.tolist())]
        cached = [src for part in prop.comm.allgather_object(mine) for src in part]
        prop.__dict__["_all_sources"] = cached
    return cached


def _lazy_zeros(shape: tuple, dtype: torch.dtype) -> Tensor:
    """Zeros whose pages are mapped only when touched (numpy's ``calloc``: fresh pages of the
    OS are zero): the memory variables are non-zero only in the CPML layers, and zeroing their
    eight full planes (128 MB a rank at 2000 x 1000 float64) cost more than the exchange."""
    return torch.from_numpy(np.zeros(shape, dtype=torch.empty(0, dtype=dtype).numpy().dtype))


class RankPasses:
    """One run's grown block: its parameters, CPML coefficients, sources, receivers and the
    two exchange plans (fields with their ring; memory variables)."""

    def __init__(self, loop, steps: int) -> None:
        from odecli.pde.elastic.fused import (
            interior_columns,  # fused imports this module
        )

        prop, d = loop.prop, loop.prop.decomp
        self.loop, self.steps = loop, steps
        self.layout = lay = Layout(prop, steps)
        e, self.grow = lay.extension, lay.grow
        gn, gs, gw, ge = self.grow
        ny, nx = loop.ny, loop.nx
        self.ny, self.nx, self.owned = lay.ny, lay.nx, lay.owned
        like = loop.mats[0]
        # the owned block copied, the grown cells written by the exchange (a stack into a
        # zeroed tensor: 0.08 s CPU a run at 2000 x 1000 float64, this half of it)
        mats = like.new_empty((5, self.ny, self.nx))
        for k, t in enumerate(loop.mats):
            mats[k, gn:gn + ny, gw:gw + nx] = t
        self._timed(HaloPlan(tuple(mats.shape), mats.dtype, d, prop.comm, self.grow, (e,)),
                    [mats])
        by, bx, lam2mu, lam, mu_xy = mats.unbind(0)
        surface = None
        if loop.surface is not None:  # reference.materials' expression, on the grown row
            surface = (lam2mu[0] - lam[0] * lam[0] / lam2mu[0]).contiguous()
        b = prop.block
        p = prop.profiles_over(b.y0 - gn, b.y1 + gs, b.x0 - gw, b.x1 + ge)
        pml = [t.detach().reshape(-1).contiguous() for t in
               (p.ay_int, p.by_int, p.ay_half, p.by_half, p.ax_int, p.bx_int, p.ax_half,
                p.bx_half)]
        scalars = (*loop.scalars[:3], *interior_columns(pml[4], pml[6]))
        y0, x0 = b.y0 - gn, b.x0 - gw
        inside = [(s, iy - y0, ix - x0, a) for s, iy, ix, a in _all_sources(prop)
                  if 0 <= iy - y0 < self.ny and 0 <= ix - x0 < self.nx]
        g = prop.geom
        li = lambda k: torch.tensor([src[k] for src in inside], dtype=torch.long)
        geom = replace(g, src_shot=li(0), src_iy=li(1), src_ix=li(2),
                       src_amp=torch.tensor([src[3] for src in inside], dtype=like.dtype))
        self._mats = mats  # alive as long as the views the kernels get
        self.glue = SimpleNamespace(
            prop=SimpleNamespace(geom=geom, dt=prop.dt, grid=prop.grid,
                                 source_type=prop.source_type, rec_order=prop.rec_order),
            materials=Materials(by, bx, lam2mu, lam, mu_xy, surface),
            mats=[by, bx, lam2mu, lam, mu_xy], surface=surface, pml=pml, scalars=scalars,
            run_rows=loop.run_rows, pieces=split_rows(self.ny, len(loop.pieces)),
            rec_plan=self._receivers(prop))
        self.fields_shape, self.psi_shape = lay.fields_shape, lay.psi_shape
        ring = tuple(w + RING for w in self.grow)
        self.field_plan = HaloPlan(self.fields_shape, like.dtype, d, prop.comm, ring,
                                   (e + RING,))
        self.psi_plan = HaloPlan(self.psi_shape, like.dtype, d, prop.comm, self.grow, (e,))

    def _timed(self, plan: HaloPlan, fields: list[Tensor]) -> None:
        timer = self.loop.prop.timer
        start = time.perf_counter()
        plan(fields)
        if timer is not None:
            timer.add(time.perf_counter() - start)

    def _receivers(self, prop) -> tuple:
        """:meth:`FusedLoop._receivers`'s plan on the grown block's ringed fields (the owned
        receivers only)."""
        gn, _, gw, _ = self.grow
        nx2 = self.nx + 2 * RING
        plane = (self.ny + 2 * RING) * nx2
        v_idx, p_idx = [], []
        for c, iy, ix in prop.rec_groups:
            flat = (iy.cpu() + gn + RING) * nx2 + (ix.cpu() + gw + RING)
            if c == "pressure":
                p_idx.append(flat)
                v_idx.append(None)
            else:
                v_idx.append(flat + (0 if c == "vy" else plane))
        return v_idx, p_idx, plane

    def run(self, t0: int, t1: int, v: Tensor, s: Tensor,
            in_place: bool) -> tuple[Tensor, Tensor, Tensor]:
        """Steps ``t0 .. t1-1`` from the owned fields ``v`` ``(B, 2, ny, nx)``, ``s`` and zero
        memory variables: the new ``v`` and ``s`` (the owned block's views of the grown
        fields) and the owned receivers' traces ``(B, receivers, steps)``.  ``in_place``:
        ``v`` and ``s`` may be overwritten; where they are :func:`grown_fields`' views, their
        tensor is stepped."""
        own = self.layout.ringed_owned
        fields = self.layout.holds(v, s) if in_place else None
        if fields is None:
            # every cell is written below: the owned block here, the grown cells and their
            # ring by the first exchange, the ring on the sides without a neighbour here
            fields = v.new_empty(self.fields_shape)
            fields[:, :2][own] = v
            fields[:, 2:][own] = s
        fields[..., :RING, :] = 0  # as forward_pass.ringed: the images of a last run
        fields[..., -RING:, :] = 0
        fields[..., :, :RING] = 0
        fields[..., :, -RING:] = 0
        psi = _lazy_zeros(self.psi_shape, v.dtype)
        gv, gs = fields[:, :2], fields[:, 2:]
        traces = []
        for k0 in range(t0, t1, self.steps):
            n = min(self.steps, t1 - k0)
            self._timed(self.field_plan, [fields])
            self._timed(self.psi_plan, [psi])
            traces.append(run_passes(self.glue, k0, k0 + n, gv, gs, psi, None, n))
        if not traces:
            traces = [v.new_zeros((v.shape[0], self.loop.prop.geom.nrec_local, 0))]
        return gv[own], gs[own], torch.cat(traces, dim=-1)
