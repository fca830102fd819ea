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
import functools
import sys
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from odecli.parallel.ops import GhostExchange
from odecli.pde.leapfrog import (RING, STEPS_PER_PASS, Kernels, RowPoints, lap_row_stride,
                                 new_lap_store)
from odecli.pde.sources import LocalGeometry
from odecli.pde.timing import CommTimer


_HUGE_PAGE = 2 << 20  # bytes in a transparent huge page on x86-64 and most aarch64 Linux
_MADV_HUGEPAGE = 14  # from <sys/mman.h> on Linux
# glibc's largest mmap threshold: a buffer this big has a mapping of its own, where a smaller one
# may sit in the heap, whose pages later serve other arrays (the advice would outlive it)
_OWN_MAPPING = 32 << 20


def advise_huge_pages(t: Tensor) -> None:
    """Ask Linux to back the whole 2 MB pages inside a new, untouched CPU tensor with
    transparent huge pages (where THP is set to ``madvise``, as on our VMs, nothing else does).
    Why: the gradient's store is written and read as eight streams of 4 KB rows, so on 4 KB
    pages every row is a new page, whose TLB miss the prefetches do not hide.  In the kernel
    harness, float32 at 1000^2, the storing forward took 0.27-0.30 ns a point and step against
    0.31-0.35, the adjoint 0.35-0.40 against 0.39-0.43 (benchmarks/RESULTS.md, "PDE: the
    gradient's store on huge pages").  A no-op for buffers under 32 MB, off Linux, or if the
    kernel refuses."""
    size = t.numel() * t.element_size()
    if t.device.type != "cpu" or not sys.platform.startswith("linux") or size < _OWN_MAPPING:
        return
    start = -(-t.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
    end = (t.data_ptr() + size) // _HUGE_PAGE * _HUGE_PAGE
    if end > start:
        _libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_HUGEPAGE)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class Workspace:
    """Buffers handed back after each forward or backward (``c2dt2`` on the stepped block, the
    time loop's fields, the segments' starts, the gradient's store, the adjoint's fields), so an
    inversion allocates and page-faults them once instead of every iteration: at 2000^2 on 2
    ranks, new zeroed adjoint fields cost 3 % of an evaluation, and new segment starts 30,000
    faults of 2 us at 1000^2 with 8 segments (benchmarks/RESULTS.md, "PDE: the time loop's
    fields from the workspace").
    A buffer whose graph dies unused is simply freed."""

    def __init__(self) -> None:
        self._free: dict[str, list[Tensor]] = {}

    def take(self, kind: str, like: Tensor, shape: tuple[int, ...],
             huge_pages: bool = False) -> Tensor:
        """A buffer of ``kind`` (uninitialised) of ``shape``, with ``like``'s dtype and device;
        a new one on huge pages if asked (:func:`advise_huge_pages`)."""
        free = self._free.setdefault(kind, [])
        for i, t in enumerate(free):
            if t.shape == shape and t.dtype == like.dtype and t.device == like.device:
                return free.pop(i)
        free.clear()  # another problem size: drop this kind's old buffers
        buffer = like.new_empty(shape)
        if huge_pages:
            advise_huge_pages(buffer)
        return buffer

    def give(self, kind: str, t: Tensor) -> None:
        self._free.setdefault(kind, []).append(t)


@dataclass
class Loop:
    """Everything the time loop needs besides ``c2dt2``.

    With ``every = K > 1`` on several ranks, neighbours exchange every K steps instead of every
    step: fields carry ``RING * K`` ghost cells on sides with a neighbour, and each rank steps
    its block extended by ``RING * (K - 1)`` cells there (``c2dt2``, the sponge and the sources
    cover the extension, and in the adjoint the receivers).  Each step spoils ``RING`` more
    cells from the outside in, so the owned block is exact after K steps, when the next
    exchange refreshes the ghosts of both time levels, packed in one message per neighbour;
    and each step makes only the cells it keeps exact (:meth:`windows`).  The redundant steps
    repeat the neighbour's arithmetic, so results are bit for bit those of exchanging every
    step.
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
    # the receivers in the stepped block, (global ids, ringed rows, ringed columns), where it
    # extends into neighbours' blocks (None: the owned receivers of geom)
    adjoint_receivers: tuple[Tensor, Tensor, Tensor] | None = None

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
        self._plan(u)([u_next, u])
        self._clock(t0)

    def owned_block(self, shape: tuple[int, int]) -> tuple[int, int, int, int] | None:
        """The owned block's rows ``[r0, r1)`` and columns ``[c0, c1)`` in the stepped block of
        ``shape`` (None: the whole of it, without an extension)."""
        if not self.extension:
            return None
        rn, rs, rw, re = (r - RING for r in self.ring)
        return rn, shape[0] - rs, rw, shape[1] - re

    def windows(self, positions: tuple[int, ...], shape: tuple[int, int]) -> ctypes.Array | None:
        """For steps ``positions[j]`` steps after the last exchange, the block rows and columns
        of the stepped block (``shape``) each makes, ``r0, r1, c0, c1`` per step (None: the
        whole block, without an extension).  Step m after an exchange needs exact values only
        ``RING * (K - 1 - m)`` cells beyond the owned block, as each step spoils ``RING`` more
        from the outside in; so it makes no more, and the redundant band costs half of what
        stepping the whole extension did (benchmarks/RESULTS.md, "PDE over MPI: each step makes
        only the cells it keeps exact").  Planned once per pass shape (kept in ``plans``)."""
        if not self.extension:
            return None
        key = ("windows", positions, shape)
        if key not in self.plans:
            ny, nx = shape
            sides = [r > RING for r in self.ring]  # north, south, west, east extended
            spans = []
            for m in positions:
                n_, s_, w_, e_ = (RING * m if extended else 0 for extended in sides)
                spans += [n_, ny - s_, w_, nx - e_]
            self.plans[key] = (ctypes.c_int64 * len(spans))(*spans)
        return self.plans[key]

    def owned_gradient(self, grad_sum: Tensor, speed: Tensor) -> Tensor:
        """The gradient of the owned block's wave speed ``c`` from the adjoint's
        ``sum mu * lap4(u)``, which it sums on the owned block only (``grad_sum`` covers the
        stepped block), in place: that sum divided by ``c``.  With
        ``c2dt2 = c^2 dt^2`` the gradient of ``c2dt2`` is ``sum / c2dt2`` (acoustic.c), so c's
        is ``2 c dt^2 sum / c2dt2 = 2 sum / c``, and the adjoint's sources carry the 2
        (_adjoint_sources): one pass over the block, where autograd through ``c2dt2`` took five,
        1.5-3 % of a float32 gradient at 1000^2 (benchmarks/RESULTS.md, "PDE: the gradient of the
        wave speed in one pass").  The owned block has the whole gradient, because the
        adjoint's redundant steps repeat the neighbours' (the extension's terms are the
        neighbours' to sum), so nothing goes back to them.  Sending the extension's gradient
        home, as the exchange's own adjoint would, added zeros for 2.5-5 % of a 2-rank gradient
        at 2000^2 (benchmarks/RESULTS.md, "PDE over MPI: the gradient stays on the owned block").
        In place, because at 2000^2 a new array and a copy cost 3 % of a gradient."""
        rn, rs, rw, re = (r - RING for r in self.ring)
        ny, nx = grad_sum.shape
        return grad_sum[rn : ny - rs, rw : nx - re].div_(speed)

    def _plan(self, like: Tensor) -> GhostExchange:
        """The exchange of (u_next, u) for fields like ``like``, planned once."""
        key = (tuple(like.shape), like.dtype)
        if key not in self.plans:
            self.plans[key] = GhostExchange(tuple(like.shape), like.dtype, self.decomp, self.comm,
                                            self.ring, (RING * self.every, self.extension))
        return self.plans[key]

    def _clock(self, t0: float) -> None:
        if self.timer is not None:
            self.timer.add(time.perf_counter() - t0)


def propagate(loop: Loop, speed: Tensor, stepped: Tensor, nshots: int,
              keep_field: bool = False) -> tuple[Tensor, Tensor | None]:
    """Receiver traces ``(shots, nrec_local, nt)`` for the wave speed ``speed`` on the owned
    block (the gradient is its) and ``stepped``, ``c2dt2 = speed^2 dt^2`` on the stepped block
    (contiguous, no gradient); with ``keep_field`` also the final field of the stepped block,
    ring included (no gradient), else None.  Without it both field buffers go back to the
    workspace: new ones page-faulted 8000 pages a call at 2000^2 (benchmarks/RESULTS.md, "PDE:
    the time loop's fields from the workspace").  ``stepped`` is the propagation's from here
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
