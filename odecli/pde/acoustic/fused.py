"""The acoustic time loop on the fused C kernels, with a hand-written adjoint time loop.

The whole propagation is one autograd operation of the owned block's wave speed ``c`` (the
steps read ``c2dt2 = c^2 dt^2``).  Forward, two
ringed field buffers are recycled (each new field overwrites the one two steps back), so no step
allocates; the state at the start of every time segment is kept.  Backward, each segment is
recomputed from its start, storing every step's ``lap4(u)`` (the last segment's store is kept
from the forward: the gradient of ``c2dt2`` needs nothing else of u), then the adjoint runs
through it in reverse as the forward step itself: ``mu = 2 c2dt2 G lambda`` (``lambda`` the
adjoint of u) steps back in time with the receivers' residuals as sources, in passes of up to 8
steps between halo exchanges (shared out over the kernel threads) that also sum ``mu lap4(u)``,
the gradient of ``c`` times ``c`` (acoustic.c has the derivation for ``c2dt2``; the 2 makes it
c's, Loop.owned_gradient).  Being a forward step,
it exchanges ghosts as the forward does; the redundant steps of an extended block get the
neighbours' residuals there too, so each rank's owned block holds the whole adjoint, and its
gradient stays there (nothing goes back to the neighbours).
Against autograd over per-step ops this saves the graph, the zero-filled index gradients, the
gradient accumulations and every per-step allocation.  Memory: ``2 (segments - 1)`` start
fields plus the longest segment's store, about ``3 sqrt(nt)`` fields with ``sqrt(nt)`` segments.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from odecli.pde.acoustic.kernels import (STEPS_PER_PASS, Kernels, RowPoints, lap_row_stride,
                                         new_lap_store)
from odecli.pde.acoustic.loop import Loop
from odecli.pde.acoustic.reference import RING
from odecli.pde.acoustic.workspace import Workspace


def propagate(loop: Loop, speed: Tensor, stepped: Tensor, nshots: int,
              keep_field: bool = False) -> tuple[Tensor, Tensor | None]:
    """Receiver traces ``(shots, nrec_local, nt)`` for the wave speed ``speed`` on the owned
    block (the gradient is its) and ``stepped``, ``c2dt2 = speed^2 dt^2`` on the stepped block
    (contiguous, no gradient); with ``keep_field`` also the final field of the stepped block,
    ring included (no gradient), else None.  Without it both field buffers go back to the
    workspace: new ones page-faulted 8000 pages a call at 2000^2.  ``stepped`` is the propagation's from here
    on: it goes back to the workspace as "speed" once the forward, or the backward that reads
    it, is done."""
    traces, field = _Propagation.apply(speed, stepped, loop, nshots, keep_field)
    return traces, (field if keep_field else None)


class _Points:
    """The sources and receivers as flat indices into the fields, and the sources' values per
    step, for :meth:`Kernels.points` (one C call per step for both), and sorted by row for
    :meth:`Kernels.forward_run`."""

    def __init__(self, loop: Loop, shape: tuple[int, int, int]) -> None:
        g = loop.geom
        shots, rows, cols = shape
        plane = rows * cols
        self.sources = (g.src_shot * plane + g.src_iy * cols + g.src_ix).to(torch.int64).contiguous()
        self.receivers = ((torch.arange(shots)[:, None] * plane + (g.rec_iy * cols + g.rec_ix)[None, :])
                          .reshape(-1).to(torch.int64).contiguous())
        self.values = g.source_values(loop.dt2, loop.src_gain).contiguous()  # (nt, sources)
        self.source_rows = RowPoints(self.sources, shape) if self.sources.numel() else None
        self.receiver_rows = RowPoints(self.receivers, shape) if self.receivers.numel() else None


def _address(t: Tensor, k: int) -> int:
    """The address of ``t[k]`` (``t`` contiguous), without making a view."""
    return t.data_ptr() + k * t.stride(0) * t.element_size()


def _row(t: Tensor, k: int) -> ctypes.c_void_p:
    return ctypes.c_void_p(_address(t, k))


def _steps(loop: Loop, kern: Kernels, pts: _Points, p: Tensor, u: Tensor, t0: int, t1: int,
           traces: Tensor | None, store: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Steps ``t0 .. t1-1`` from ``(p, u)``, each new field overwriting ``p``'s buffer (so both
    are used up), recording the receivers into ``traces[k]`` (``(nt, shots, receivers)``) when
    given, and with ``store`` the ``lap4(u_{t0+i})`` of step ``t0+i`` into ``store[i]``.
    Runs of steps up to the next exchange go in passes of up to STEPS_PER_PASS."""
    record = pts.receivers if traces is not None and pts.receivers.numel() else None
    touch = record is not None or pts.sources.numel() > 0
    k = t0
    while k < t1:
        n = 1  # steps k .. k+n-1, up to the next exchange
        while n < STEPS_PER_PASS and k + n < t1 and not loop.exchanges_after(k + n - 1):
            n += 1
        if n > 1:
            outs = [(p, u)[j % 2] for j in range(n)]
            kern.forward_run([p, u, *outs], pts.source_rows, _address(pts.values, k),
                             None if record is None else pts.receiver_rows,
                             0 if record is None else _address(traces, k),
                             None if store is None else store[k - t0:k - t0 + n],
                             loop.windows(tuple((k + j) % loop.every for j in range(n)),
                                          kern.block_shape))
            p, u = ([p, u, *outs])[-2:]
        else:
            out = p
            kern.forward(u, p, out, None if store is None else store[k - t0])
            if touch:  # the receivers sit in the owned block: the exchange does not change them
                kern.points(out, pts.sources, _row(pts.values, k), record,
                            None if record is None else _row(traces, k))
            p, u = u, out
        k += n
        if loop.exchanges_after(k - 1):
            loop.exchange(u, p)
    return p, u


class _Propagation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, speed: Tensor, c2dt2: Tensor, loop: Loop, nshots: int, keep_field: bool):
        # speed: the operand the gradient is for; the steps read c2dt2 (see propagate)
        ny, nx = c2dt2.shape
        shape = (nshots, ny + 2 * RING, nx + 2 * RING)
        p, u = (loop.workspace.take("field", c2dt2, shape).zero_() for _ in range(2))
        kern = Kernels(p, c2dt2, loop.sponge, loop.dy, loop.dx, loop.spans, loop.threads,
                       loop.owned_block((ny, nx)))
        pts = _Points(loop, shape)
        traces = c2dt2.new_zeros((loop.nt, nshots, loop.geom.nrec_local))  # per step: contiguous
        keep = ctx.needs_input_grad[0]
        starts, store, store_base = [], None, None
        for s, (t0, t1) in enumerate(loop.segments):
            if keep and s == len(loop.segments) - 1:  # the backward starts here: keep its laps
                longest = max(b - a for a, b in loop.segments)
                r0, r1, c0, c1 = loop.owned_block((ny, nx)) or (0, ny, 0, nx)  # all the adjoint reads
                padded = (longest, nshots, r1 - r0, lap_row_stride(c1 - c0, c2dt2.dtype))
                store_base = loop.workspace.take("store", c2dt2, padded, huge_pages=True)
                store = new_lap_store(c2dt2, longest, nshots, store_base, (r1 - r0, c1 - c0))
            elif keep:
                starts.append(tuple(loop.workspace.take("start", c2dt2, shape).copy_(f)
                                    for f in (p, u)))
            p, u = _steps(loop, kern, pts, p, u, t0, t1, traces, store)
        if keep:
            ctx.loop, ctx.starts, ctx.kern, ctx.pts = loop, starts, kern, pts
            ctx.store, ctx.store_base = store, store_base
            ctx.save_for_backward(speed, c2dt2)
        if not keep:
            loop.workspace.give("speed", c2dt2)
        loop.workspace.give("field", p)  # u_prev: read by nothing after the last step
        if not keep_field:
            loop.workspace.give("field", u)
            u = u.new_empty(0)
        ctx.mark_non_differentiable(u)
        return traces.permute(1, 2, 0).contiguous(), u

    @staticmethod
    @once_differentiable
    def backward(ctx, g_traces: Tensor | None, _g_field):
        speed, c2dt2 = ctx.saved_tensors
        loop, store = ctx.loop, ctx.store
        if g_traces is None:
            _give_back(loop.workspace, ctx, c2dt2)
            return None, None, None, None, None
        kern = ctx.kern
        shape = kern.shape  # of the ringed fields (the store holds blocks)
        rows, values = _adjoint_sources(loop, g_traces, c2dt2, shape)
        # mu of the field after u_k and of u_k itself, starting from the last step's residuals
        mu_after, mu = (loop.workspace.take("adjoint", c2dt2, shape).zero_() for _ in range(2))
        if rows is not None:
            kern.points(mu, rows.flat, _row(values, 0))
        grad_sum = torch.zeros_like(c2dt2)
        nt = loop.nt
        since = 0  # adjoint steps since the last exchange
        for s in reversed(range(len(loop.segments))):
            t0, t1 = loop.segments[s]
            if s < len(loop.segments) - 1:  # recompute this segment's laps from its start
                _steps(loop, kern, ctx.pts, *ctx.starts[s], t0, t1, None, store)
            k = t1 - 1
            while k >= t0:
                if loop.comm.size > 1 and (k == nt - 1 or loop.exchanges_after(k)):
                    loop.exchange(mu, mu_after)  # the ghosts the next K adjoint steps read
                    since = 0
                n = 1  # adjoint steps k .. k-n+1: up to the next exchange or segment start
                while n < STEPS_PER_PASS and k - n >= t0 and not loop.exchanges_after(k - n):
                    n += 1
                outs = [(mu_after, mu)[j % 2] for j in range(n)]
                kern.adjoint_pass([mu_after, mu, *outs], store[k - n + 1 - t0:k + 1 - t0], grad_sum,
                                  rows, _address(values, nt - k),
                                  loop.windows(tuple(range(since, since + n)), kern.block_shape))
                mu_after, mu = ([mu_after, mu, *outs])[-2:]
                since += n
                k -= n
        for buffer in (mu_after, mu):
            loop.workspace.give("adjoint", buffer)
        _give_back(loop.workspace, ctx, c2dt2)
        return loop.owned_gradient(grad_sum, speed), None, None, None, None


def _give_back(workspace: Workspace, ctx, c2dt2: Tensor) -> None:
    """Hand the forward's ``c2dt2``, store and segment starts back to the workspace, and drop
    the rest."""
    workspace.give("speed", c2dt2)
    workspace.give("store", ctx.store_base)
    for pair in ctx.starts:
        for buffer in pair:
            workspace.give("start", buffer)
    ctx.starts = ctx.store = ctx.store_base = ctx.kern = ctx.pts = None


def _adjoint_sources(loop: Loop, g_traces: Tensor, c2dt2: Tensor, shape: tuple[int, int, int]
                     ) -> tuple[RowPoints | None, Tensor]:
    """The receivers as sources of the adjoint in the forward's form: ``mu = 2 c2dt2 G lambda``
    gets ``2 c2dt2 G r`` where the adjoint lambda gets the residual ``r`` (the 2 is d(c^2)/dc's,
    see Loop.owned_gradient; the adjoint is linear in its sources).  Returns them as points
    of the fields, shots by receivers (None without receivers), and the values
    ``(nt + 1, shots * receivers)``, row ``m`` for time ``nt - 1 - m`` (the order the backward
    meets them) and a last row of zeros (after the first step, which has no residual before it).
    Receivers in a neighbour's block inside the stepped extension are sources here too, so
    the redundant steps there repeat the neighbour's: their residuals come from an all-reduce."""
    g = loop.geom
    if loop.adjoint_receivers is None:
        residuals, iy, ix = g_traces, g.rec_iy, g.rec_ix
    else:
        ids, iy, ix = loop.adjoint_receivers
        summed = loop.comm.allreduce_array(g.scatter_traces(g_traces.detach()).numpy())
        residuals = torch.from_numpy(summed)[:, ids, :]
    shots, rows, cols = shape
    weight = 2 * c2dt2[iy - RING, ix - RING]
    if loop.sponge is not None:
        weight = weight * loop.sponge[iy - RING, ix - RING]
    values = c2dt2.new_zeros((loop.nt + 1, shots, iy.numel()))
    values[:-1] = (residuals * weight[None, :, None]).permute(2, 0, 1).flip(0)
    flat = ((torch.arange(shots)[:, None] * (rows * cols) + (iy * cols + ix)[None, :])
            .reshape(-1).to(torch.int64).contiguous())
    return RowPoints(flat, shape) if flat.numel() else None, values.reshape(loop.nt + 1, -1)
