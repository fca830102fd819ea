"""The acoustic time loop on the fused C kernels, with a hand-written adjoint time loop.

The whole propagation is one autograd operation of ``c2dt2``.  Forward, two ringed field
buffers are recycled (each new field overwrites the one two steps back), so no step allocates;
the state at the start of every time segment is kept.  Backward, each segment is recomputed from
its start into a store of its fields (the last segment's store is kept from the forward), then
the adjoint steps run through it in reverse: receiver residuals are injected as adjoint sources,
ghost gradients go back to their owners (the halo exchange's adjoint), and one C pass per step
advances both adjoint fields and accumulates the gradient of ``c2dt2``.  Against autograd over
per-step ops this saves the graph, the zero-filled index gradients, the gradient accumulations
and every per-step allocation.  Memory: ``2 (segments - 1)`` start fields plus the longest
segment's store, about ``3 sqrt(nt)`` fields with ``sqrt(nt)`` segments.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from odecli.parallel.ops import fill_ring_, fill_ring_adjoint_
from odecli.pde.leapfrog import (RING, adjoint_scratch, pair_scratch, receiver_rows, step_adjoint,
                                 step_adjoint_pair, step_forward)
from odecli.pde.sources import LocalGeometry
from odecli.pde.timing import CommTimer


class Workspace:
    """Field stores handed back after each backward, so an inversion allocates (and page-faults)
    its store once instead of every iteration; a store whose graph dies unused is simply freed."""

    def __init__(self) -> None:
        self._free: list[Tensor] = []

    def take(self, like: Tensor, shape: tuple[int, ...]) -> Tensor:
        for i, t in enumerate(self._free):
            if t.shape == shape and t.dtype == like.dtype and t.device == like.device:
                return self._free.pop(i)
        self._free.clear()  # another problem size: drop the old stores
        return like.new_empty(shape)

    def give(self, t: Tensor) -> None:
        self._free.append(t)


@dataclass
class Loop:
    """Everything the time loop needs besides ``c2dt2``."""

    segments: list[tuple[int, int]]
    dy: float
    dx: float
    dt2: float
    sponge: Tensor | None
    spans: Tensor | None  # sponge_spans(sponge)
    geom: LocalGeometry  # ringed indices
    src_gain: Tensor | None
    decomp: object
    comm: object
    timer: CommTimer | None
    workspace: Workspace
    threads: int = 1  # the kernels split each step's rows over this many threads

    @property
    def nt(self) -> int:
        return self.segments[-1][1]

    def fill(self, u: Tensor, adjoint: bool = False) -> None:
        if self.comm.size == 1:
            return
        t0 = time.perf_counter()
        (fill_ring_adjoint_ if adjoint else fill_ring_)(u, self.decomp, self.comm, RING)
        if self.timer is not None:
            self.timer.add(time.perf_counter() - t0)


def propagate(loop: Loop, c2dt2: Tensor, nshots: int) -> tuple[Tensor, Tensor]:
    """Receiver traces ``(shots, nrec_local, nt)`` and the final ringed field (no gradient)."""
    return _Propagation.apply(c2dt2, loop, nshots)


def _steps(loop: Loop, c2dt2: Tensor, p: Tensor, u: Tensor, t0: int, t1: int,
           traces: Tensor | None, store: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Steps ``t0 .. t1-1`` from ``(p, u)``.  With ``store`` (``store[0]`` is ``u``), field
    ``u_{t0+i}`` lands in ``store[i]``; without, each new field overwrites ``p``'s buffer."""
    g = loop.geom
    sources = g.source_values(loop.dt2, loop.src_gain)
    for k in range(t0, t1):
        out = p if store is None else store[k - t0 + 1]
        step_forward(u, p, c2dt2, loop.sponge, loop.dy, loop.dx, out, loop.spans, loop.threads)
        g.add_at_sources(out, sources[k])
        loop.fill(out)
        if traces is not None:
            traces[:, :, k] = g.record(out)
        p, u = u, out
    return p, u


class _Propagation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, c2dt2: Tensor, loop: Loop, nshots: int):
        ny, nx = c2dt2.shape
        shape = (nshots, ny + 2 * RING, nx + 2 * RING)
        p, u = c2dt2.new_zeros(shape), c2dt2.new_zeros(shape)
        traces = c2dt2.new_empty((nshots, loop.geom.nrec_local, loop.nt))
        keep = ctx.needs_input_grad[0]
        starts, store = [], None
        for s, (t0, t1) in enumerate(loop.segments):
            if keep and s == len(loop.segments) - 1:  # the backward starts here: keep its fields
                longest = max(b - a for a, b in loop.segments)
                store = loop.workspace.take(c2dt2, (longest + 1, *shape))
                store[0] = u
                p, u = _steps(loop, c2dt2, p, store[0], t0, t1, traces, store)
            else:
                if keep:
                    starts.append((p.clone(), u.clone()))
                p, u = _steps(loop, c2dt2, p, u, t0, t1, traces)
        if keep:
            ctx.loop, ctx.starts, ctx.store = loop, starts, store
            ctx.save_for_backward(c2dt2)
        final = u.clone() if store is not None else u
        ctx.mark_non_differentiable(final)
        return traces, final

    @staticmethod
    @once_differentiable
    def backward(ctx, g_traces: Tensor | None, _g_field):
        (c2dt2,) = ctx.saved_tensors
        loop, store = ctx.loop, ctx.store
        if g_traces is None:
            loop.workspace.give(store)
            return None, None, None
        shape = store.shape[1:]
        # adjoint of u_{k+1} and the one the step after received (that step read u_{k+1} as u_prev)
        a_u, a_later = c2dt2.new_zeros(shape), c2dt2.new_zeros(shape)
        grad_c2 = torch.zeros_like(c2dt2)
        # One thread on one rank: two steps per pass (no halo exchange can sit between them).
        paired = loop.threads == 1 and loop.comm.size == 1
        scratch = pair_scratch(c2dt2, shape[0]) if paired else adjoint_scratch(c2dt2, loop.threads)
        g_traces = g_traces.contiguous()
        g = loop.geom
        shot = torch.arange(shape[0], device=c2dt2.device)[:, None]
        order, row_ptr, columns = receiver_rows(g.rec_iy, g.rec_ix, shape[1])
        for s in reversed(range(len(loop.segments))):
            t0, t1 = loop.segments[s]
            if s < len(loop.segments) - 1:  # recompute this segment's fields from its start
                p0, u0 = ctx.starts[s]
                store[0] = u0
                _steps(loop, c2dt2, p0, store[0], t0, t1, None, store)  # p0 is only read
            k = t1 - 1
            while k >= t0:
                if g.nrec_local:
                    a_u.index_put_((shot, g.rec_iy[None, :], g.rec_ix[None, :]),
                                   g_traces[:, :, k], accumulate=True)
                loop.fill(a_u, adjoint=True)
                if paired and k - 1 >= t0:  # a_u ends as the adjoint of u_{k-1}: no swap
                    step_adjoint_pair(store[k - t0], store[k - 1 - t0], c2dt2, loop.sponge, a_u, a_later,
                                      loop.dy, loop.dx, grad_c2, scratch, (row_ptr, columns),
                                      g_traces[:, order, k - 1], loop.spans)
                    k -= 2
                    continue
                step_adjoint(store[k - t0], c2dt2, loop.sponge, a_u, a_later, loop.dy, loop.dx,
                             grad_c2, scratch, loop.spans)
                a_u, a_later = a_later, a_u  # a_later now holds the adjoint of u_k
                k -= 1
        loop.workspace.give(store)
        ctx.starts = ctx.store = None
        return grad_c2, None, None
