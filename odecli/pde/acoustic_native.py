"""The acoustic time loop on the fused C kernels, with a hand-written adjoint time loop.

The whole propagation is one autograd operation of ``c2dt2``.  Forward, two ringed field
buffers are recycled (each new field overwrites the one two steps back), so no step allocates;
the state at the start of every time segment is kept.  Backward, each segment is recomputed from
its start, storing every step's ``lap4(u)`` (the last segment's store is kept from the forward:
the gradient of ``c2dt2`` needs nothing else of u), then the adjoint steps run through it in
reverse: receiver residuals are injected as adjoint sources, ghost gradients go back to their
owners (the halo exchange's adjoint), and one C pass per run of 2-8 steps between halo
exchanges (:func:`steps_per_pass`; the steps shared out over the kernel threads) advances both
adjoint fields and accumulates the gradient of ``c2dt2``.
Against autograd over per-step ops this saves the graph, the zero-filled index gradients, the
gradient accumulations and every per-step allocation.  Memory: ``2 (segments - 1)`` start
fields plus the longest segment's store, about ``3 sqrt(nt)`` fields with ``sqrt(nt)`` segments.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from odecli.parallel.ops import GhostExchange
from odecli.parallel.strips import Boxes
from odecli.pde.leapfrog import (FORWARD_STEPS_PER_PASS, RING, Kernels, RowPoints, lap_row_stride,
                                 new_lap_store, receiver_rows, run_scratch, steps_per_pass)
from odecli.pde.sources import LocalGeometry
from odecli.pde.timing import CommTimer


class Workspace:
    """Field stores handed back after each backward, so an inversion allocates (and page-faults)
    its store once instead of every iteration; a store whose graph dies unused is simply freed."""

    def __init__(self) -> None:
        self._free: list[Tensor] = []
        self._pending: Tensor | None = None

    def take(self, like: Tensor, shape: tuple[int, ...]) -> Tensor:
        for i, t in enumerate(self._free):
            if t.shape == shape and t.dtype == like.dtype and t.device == like.device:
                return self._free.pop(i)
        self._free.clear()  # another problem size: drop the old stores
        return like.new_empty(shape)

    def give(self, t: Tensor) -> None:
        self._free.append(t)

    def pending(self, like: Tensor) -> Tensor:
        """A zeroed field like ``like`` for what neighbours send back (kept zero between uses)."""
        p = self._pending
        if p is None or p.shape != like.shape or p.dtype != like.dtype:
            self._pending = p = torch.zeros_like(like)
        return p


@dataclass
class Loop:
    """Everything the time loop needs besides ``c2dt2``.

    With ``every = K > 1`` on several ranks, neighbours exchange every K steps instead of every
    step: fields carry ``RING * K`` ghost cells on sides with a neighbour, and each rank steps
    its block extended by ``RING * (K - 1)`` cells there (``c2dt2``, the sponge and the sources
    cover the extension).  Each step spoils ``RING`` more cells from the outside in, so the
    owned block is exact after K steps, when the next exchange refreshes the ghosts of both
    time levels, packed in one message per neighbour.  The redundant steps repeat the
    neighbour's arithmetic, so results are bit for bit those of exchanging every step.
    """

    segments: list[tuple[int, int]]
    dy: float
    dx: float
    dt2: float
    sponge: Tensor | None  # over the extended block
    spans: Tensor | None  # sponge_spans(sponge)
    geom: LocalGeometry  # indices into the ringed extended block: sources in it, receivers owned
    src_gain: Tensor | None
    decomp: object
    comm: object
    timer: CommTimer | None
    workspace: Workspace
    threads: int = 1  # the kernels split each step's rows over this many threads
    every: int = 1  # steps between halo exchanges
    ring: tuple[int, int, int, int] = (RING,) * 4  # ghost cells north, south, west, east of the owned block
    plans: dict = field(default_factory=dict)  # exchanges and strips planned per field shape

    @property
    def nt(self) -> int:
        return self.segments[-1][1]

    @property
    def extension(self) -> int:
        """Cells the stepped block reaches beyond the owned one, on sides with a neighbour."""
        return RING * (self.every - 1)

    def exchanges_after(self, k: int) -> bool:
        """Whether the neighbours exchange ghosts after step ``k`` (same answer on every rank)."""
        return self.comm.size > 1 and (k + 1) % self.every == 0

    def exchange(self, u_next: Tensor, u: Tensor) -> None:
        """Refresh the ghosts the next K steps read: all of u_next's and the extension of u (read
        as u_prev, pointwise)."""
        t0 = time.perf_counter()
        self._plan(u, adjoint=False)([u_next, u])
        self._clock(t0)

    def exchange_adjoint(self, a_next: Tensor, a_after: Tensor) -> Tensor | None:
        """Adjoint of :meth:`exchange`, before the adjoint of the step that made ``a_next``'s field.

        ``a_next`` is the adjoint of u_next: its ghosts go to their owners and are zeroed.  u's
        extension was read only by the step after, as u_prev: its adjoint there, ``G G a_after``,
        goes to the owners too, and ``a_after``'s extension is zeroed so the kernel adds nothing
        there.  Returns what the neighbours sent for u's edge (for :meth:`settle` to subtract
        once the kernel has made the adjoint of u), or None without an extension.
        """
        t0 = time.perf_counter()
        sent = None
        if self.extension:
            sent = self.workspace.pending(a_after)
            frames, weight = self._ghost_frames(a_after)
            frames.move(sent, a_after, weight)
        self._plan(a_next, adjoint=True)([a_next, a_next if sent is None else sent])
        self._clock(t0)
        return sent

    def settle(self, a: Tensor, sent: Tensor) -> None:
        """Subtract the neighbours' ``G G a_after`` from the owned edge of ``a`` (the adjoint of
        u), and clear ``sent`` for the next exchange."""
        self.edges(a).move(a, sent, subtract=True)

    def take_sent(self, sent: Tensor) -> Tensor:
        """What the neighbours sent for the owned edge, ``(shots, cells)`` in the order of
        :meth:`edge_cells`, cleared from ``sent`` (a view of a buffer reused by the next call)."""
        return torch.from_numpy(self.edges(sent).pack([sent], clear=True)).view(sent.shape[0], -1)

    def _ghost_frames(self, like: Tensor) -> tuple[Boxes, np.ndarray | None]:
        """The extension's strips outside the owned block of fields like ``like``, and the
        sponge squared over the ringed field (None without a sponge): ``G G a`` there is
        u_prev's adjoint."""
        shape = tuple(like.shape)
        key = ("frames", shape, like.dtype)
        if key not in self.plans:
            weight = None
            if self.sponge is not None:
                weight = np.zeros(shape[-2:], dtype=like.numpy().dtype)
                weight[RING:-RING, RING:-RING] = (self.sponge * self.sponge).numpy()
            boxes = [(0, (..., rows, cols)) for rows, cols
                     in _frame(self.ring, shape, self.extension, self._sides(), outside=True)]
            self.plans[key] = (Boxes(shape, like.dtype, boxes), weight)
        return self.plans[key]

    def edges(self, like: Tensor) -> Boxes:
        """The owned edge band of fields like ``like`` that neighbours send u_prev's adjoint
        for, box by box in the order of :meth:`edge_cells`."""
        shape = tuple(like.shape)
        key = ("edges", shape, like.dtype)
        if key not in self.plans:
            boxes = [(0, (..., rows, cols)) for rows, cols
                     in _frame(self.ring, shape, self.extension, self._sides(), outside=False)]
            self.plans[key] = Boxes(shape, like.dtype, boxes)
        return self.plans[key]

    def edge_cells(self, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        """Ringed (row, column) indices of the owned edge band that :meth:`settle` updates."""
        rows, cols = [], []
        for r, c in _frame(self.ring, shape, self.extension, self._sides(), outside=False):
            iy, ix = torch.meshgrid(torch.arange(r.start, r.stop), torch.arange(c.start, c.stop),
                                    indexing="ij")
            rows.append(iy.reshape(-1))
            cols.append(ix.reshape(-1))
        return torch.cat(rows), torch.cat(cols)

    def _plan(self, like: Tensor, adjoint: bool) -> GhostExchange:
        """The exchange of (u_next, u) or its adjoint for fields like ``like``, planned once."""
        key = (tuple(like.shape), like.dtype, adjoint)
        if key not in self.plans:
            self.plans[key] = GhostExchange(tuple(like.shape), like.dtype, self.decomp, self.comm,
                                            self.ring, (RING * self.every, self.extension), adjoint)
        return self.plans[key]

    def _sides(self) -> tuple[bool, bool, bool, bool]:
        d = self.decomp
        return (d.north is not None, d.south is not None, d.west is not None, d.east is not None)

    def _clock(self, t0: float) -> None:
        if self.timer is not None:
            self.timer.add(time.perf_counter() - t0)


def _frame(ring: tuple[int, int, int, int], shape: tuple[int, ...], depth: int,
           sides: tuple[bool, bool, bool, bool], outside: bool) -> list[tuple[slice, slice]]:
    """Non-overlapping (rows, cols) slices of the band ``depth`` cells wide just outside (ghosts)
    or just inside (owned edge) the owned block of a ringed field, on the sides with a neighbour."""
    rn, rs, rw, re = ring
    ny, nx = shape[-2] - rn - rs, shape[-1] - rw - re
    dn, ds, dw, de = (depth if s else 0 for s in sides)
    if outside:
        y0, y1, x0, x1 = rn - dn, rn + ny + ds, rw - dw, rw + nx + de
        bands = [(slice(y0, rn), slice(x0, x1)), (slice(rn + ny, y1), slice(x0, x1)),
                 (slice(rn, rn + ny), slice(x0, rw)), (slice(rn, rn + ny), slice(rw + nx, x1))]
    else:
        top, bottom = rn + min(dn, ny), max(rn + min(dn, ny), rn + ny - ds)
        left, right = rw + min(dw, nx), max(rw + min(dw, nx), rw + nx - de)
        bands = [(slice(rn, top), slice(rw, rw + nx)), (slice(bottom, rn + ny), slice(rw, rw + nx)),
                 (slice(top, bottom), slice(rw, left)), (slice(top, bottom), slice(right, rw + nx))]
    return [(r, c) for r, c in bands if r.stop > r.start and c.stop > c.start]


def propagate(loop: Loop, c2dt2: Tensor, nshots: int) -> tuple[Tensor, Tensor]:
    """Receiver traces ``(shots, nrec_local, nt)`` and the final field of the stepped block,
    ring included (no gradient)."""
    return _Propagation.apply(c2dt2, loop, nshots)


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
    Runs of steps up to the next exchange go in passes of up to FORWARD_STEPS_PER_PASS."""
    record = pts.receivers if traces is not None and pts.receivers.numel() else None
    touch = record is not None or pts.sources.numel() > 0
    k = t0
    while k < t1:
        n = 1  # steps k .. k+n-1, up to the next exchange
        while n < FORWARD_STEPS_PER_PASS and k + n < t1 and not loop.exchanges_after(k + n - 1):
            n += 1
        if n > 1:
            outs = [(p, u)[j % 2] for j in range(n)]
            kern.forward_run([p, u, *outs], pts.source_rows, _address(pts.values, k),
                             None if record is None else pts.receiver_rows,
                             0 if record is None else _address(traces, k),
                             None if store is None else store[k - t0:k - t0 + n])
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
    def forward(ctx, c2dt2: Tensor, loop: Loop, nshots: int):
        ny, nx = c2dt2.shape
        shape = (nshots, ny + 2 * RING, nx + 2 * RING)
        p, u = c2dt2.new_zeros(shape), c2dt2.new_zeros(shape)
        kern = Kernels(p, c2dt2, loop.sponge, loop.dy, loop.dx, loop.spans, loop.threads)
        pts = _Points(loop, shape)
        traces = c2dt2.new_zeros((loop.nt, nshots, loop.geom.nrec_local))  # per step: contiguous
        keep = ctx.needs_input_grad[0]
        starts, store, store_base = [], None, None
        for s, (t0, t1) in enumerate(loop.segments):
            if keep and s == len(loop.segments) - 1:  # the backward starts here: keep its laps
                longest = max(b - a for a, b in loop.segments)
                padded = (longest, nshots, ny, lap_row_stride(nx, c2dt2.dtype))
                store_base = loop.workspace.take(c2dt2, padded)
                store = new_lap_store(c2dt2, longest, nshots, store_base)
            elif keep:
                starts.append((p.clone(), u.clone()))
            p, u = _steps(loop, kern, pts, p, u, t0, t1, traces, store)
        if keep:
            ctx.loop, ctx.starts, ctx.kern, ctx.pts = loop, starts, kern, pts
            ctx.store, ctx.store_base = store, store_base
            ctx.save_for_backward(c2dt2)
        ctx.mark_non_differentiable(u)
        return traces.permute(1, 2, 0).contiguous(), u

    @staticmethod
    @once_differentiable
    def backward(ctx, g_traces: Tensor | None, _g_field):
        (c2dt2,) = ctx.saved_tensors
        loop, store = ctx.loop, ctx.store
        if g_traces is None:
            loop.workspace.give(ctx.store_base)
            return None, None, None
        kern, pts = ctx.kern, ctx.pts
        shape = kern.shape  # of the ringed fields (the store holds blocks)
        # adjoint of u_{k+1} and the one the step after received (that step read u_{k+1} as u_prev)
        a_u, a_later = c2dt2.new_zeros(shape), c2dt2.new_zeros(shape)
        grad_c2 = torch.zeros_like(c2dt2)
        # several steps per pass where no halo exchange sits between them (shared out over the
        # kernel threads), single steps split by rows where one must run alone
        per_pass = steps_per_pass(a_u.numel() * a_u.element_size())
        scratch = run_scratch(c2dt2, shape[0], max(per_pass, loop.threads))
        g = loop.geom
        order, row_ptr, columns = receiver_rows(g.rec_iy, g.rec_ix, shape[1])
        residuals = g_traces.permute(2, 0, 1).contiguous()  # (nt, shots, receivers)
        in_order = residuals[:, :, order].contiguous()  # the same, in the pass's order
        if loop.extension:  # receivers plus the owned edge cells neighbours send to
            edge_iy, edge_ix = loop.edge_cells(shape)
            both = receiver_rows(torch.cat([g.rec_iy, edge_iy]), torch.cat([g.rec_ix, edge_ix]), shape[1])
        for s in reversed(range(len(loop.segments))):
            t0, t1 = loop.segments[s]
            if s < len(loop.segments) - 1:  # recompute this segment's laps from its start
                _steps(loop, kern, pts, *ctx.starts[s], t0, t1, None, store)
            k = t1 - 1
            while k >= t0:
                if g.nrec_local:
                    kern.points(a_u, pts.receivers, _row(residuals, k))
                pending = loop.exchange_adjoint(a_u, a_later) if loop.exchanges_after(k) else None
                n = 1  # steps k .. k-n+1 in this pass: up to the next exchange or segment start
                while n < per_pass and k - n >= t0 and not loop.exchanges_after(k - n):
                    n += 1
                if n > 1:
                    # the residuals of step k-j go in after step k-j+1; what the neighbours sent
                    # for u_k's edge is subtracted between steps k and k-1, with them
                    injections = [((row_ptr, columns), in_order[k - j]) for j in range(1, n)]
                    if pending is not None:
                        sent = loop.take_sent(pending)
                        merged = torch.cat([residuals[k - 1], sent.neg_()], dim=1)[:, both[0]]
                        injections[0] = (both[1:], merged)
                    kern.adjoint_run(store[k - n + 1 - t0:k + 1 - t0], a_u, a_later, grad_c2,
                                     scratch, injections)
                    if n % 2:  # a_later holds the adjoint of u_{k-n+1}, a_u that of u_{k-n+2}
                        a_u, a_later = a_later, a_u
                    k -= n
                    continue
                kern.adjoint(store[k - t0], a_u, a_later, grad_c2, scratch)
                if pending is not None:
                    loop.settle(a_later, pending)
                a_u, a_later = a_later, a_u  # a_later now holds the adjoint of u_k
                k -= 1
        loop.workspace.give(ctx.store_base)
        ctx.starts = ctx.store = ctx.store_base = ctx.kern = ctx.pts = None
        return grad_c2, None, None
