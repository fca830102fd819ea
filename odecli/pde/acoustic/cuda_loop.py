"""The acoustic time loop on the CUDA kernels (:mod:`odecli.pde.acoustic.cuda_build`), with the
CPU fused loop's hand-written adjoint (:mod:`odecli.pde.acoustic.fused`) and its time segments.

A launch makes up to 4 steps of every shot in shared memory (``cuda_blocks.h``, the default;
``PER_LAUNCH = 1`` runs the one-step kernel, ``cuda_point.h``), adding the sources and reading
the receivers; a C loop (``cuda_steps.c``) issues the launches.  The whole propagation is one
autograd operation of the wave speed ``c``.  Forward: the field buffers recycled, the fields at
the start of every time segment copied, and, for the gradient, the last segment's ``lap4(u)``
of every step stored.  Backward: each earlier segment recomputed from its start storing its
laps, then the adjoint run through it in reverse as the forward step itself, on
``mu = c2dt2 G lambda`` with the receivers' residuals (times ``2 c2dt2 G``) as its sources,
summing ``mu lap4(u)`` into ``grad_sum``; the gradient of ``c`` is ``grad_sum / c`` (acoustic.c
and Loop.owned_gradient have the derivation).  The same launches run on CPU tensors through the
kernels' host build, which is how the tests check them against the PyTorch reference and its
autograd without a GPU.

On several ranks (one GPU each, :func:`odecli.app.pde_problem`'s ``cuda:rank % count``) each
steps its block, and after every launch the neighbours exchange the ghosts the next launch reads
(``exchange``, a planned halo exchange the C loop calls between the launches).  With K steps a
launch (the blocked kernel, K = the propagator's ``every``) this is the CPU fused loop's scheme
(:class:`~odecli.pde.acoustic.loop.Loop`): each rank steps its block grown by ``RING * (K - 1)``
cells on sides with a neighbour (``c2dt2``, the sponge and the sources cover the growth), each
step spoils ``RING`` more cells from the outside in (a launch keeps its input ring), so the owned
block is exact after K steps, when the exchange refreshes ``RING * K`` ghosts of u and the growth
of u_prev.  The redundant steps repeat the neighbours' arithmetic: the traces equal one rank's
bit for bit.  The adjoint is the forward step on ``mu``, so it exchanges alike, and its sources
are the residuals of every receiver in the grown block (the neighbours' from an all-reduce), so
the owned block holds the whole adjoint and its gradient, summed there (the growth's terms are
the neighbours' to sum).  With one step a launch (K = 1) nothing grows and the exchange fills the
ring of the field just made, as the reference does.

CUDA fields' strips go through the exchange plan's host buffers (:class:`~odecli.parallel.
strips.Boxes`' torch path: per message one device-to-host copy, which waits for the launches
before it on the stream, and one host-to-device copy back, synchronous, so the buffer is free
for the next exchange): MPI here (mpi4py over the venv's MPICH) is not CUDA-aware, and a
message is a few thin strips (``RING * K`` cells of u, less of u_prev).  Pinned buffers would
make the copies faster, but need the plan, which knows no devices, to allocate them: that waits
for a measurement on several GPUs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from odecli.pde.acoustic.cuda_build import (
    BLOCK_TILES,
    BLOCKS_ENTRY,
    STEPS_PER_LAUNCH,
    TILE_X,
    TILE_Y,
    StepCall,
    cuda_launcher,
    tiles_x,
)
from odecli.pde.acoustic.kernels import sponge_spans
from odecli.pde.acoustic.reference import RING
from odecli.pde.sources import LocalGeometry


def launcher_for(like: Tensor, comm) -> tuple[object | None, str]:
    """The kernel's launcher for fields like ``like`` on this rank layout, or ``(None, why
    not)``: the GPU's kernel for CUDA tensors, on one rank or several (tests put the host build
    here).  ``comm``: the rank layout (the kernels run on any; kept for the callers' one
    signature)."""
    if like.device.type != "cuda":
        return None, f"the acoustic CUDA kernels need CUDA tensors (got {like.device})"
    return cuda_launcher(like)


def steps_a_launch(ranks: int, every: int = 1) -> int:
    """Steps a launch: :data:`PER_LAUNCH` on one rank; on several at most ``every``, the steps
    between exchanges the grown blocks allow (an exchange after each launch)."""
    return PER_LAUNCH if ranks == 1 else max(1, min(PER_LAUNCH, every))


@dataclass
class TilePoints:
    """Points of ringed fields ``(B, ny + 4, nx + 4)`` grouped by the kernel's tile (the thread
    block that makes them), for the launch's ``*_ptr``, ``*_at`` and ``*_idx`` (or ``*_slot``):
    ``ptr`` the CSR offsets per tile, ``at`` the flat indices in tile order (stable: the given
    order within a tile), ``index`` each one's position in the given order."""

    ptr: Tensor
    at: Tensor
    index: Tensor

    @classmethod
    def of(cls, flat: Tensor, shape: tuple[int, int, int], tile: tuple[int, int] = (TILE_X, TILE_Y),
           halo: int = 0) -> TilePoints:
        """``tile``: (columns, rows) of a thread block's tile; ``halo``: cells around a tile
        whose points it lists too (the blocked kernel makes them, see cuda_blocks.h), so a
        point may be in several tiles' lists.  Made once per problem, in Python."""
        _, rows, cols = shape
        ny, nx = rows - 2 * RING, cols - 2 * RING
        flat_list = flat.tolist()
        tx_n, ty_n = tiles_x(nx, tile[0]), -(-ny // tile[1])
        entries = []
        for k, f in enumerate(flat_list):
            i, j = (f % (rows * cols)) // cols - RING, f % cols - RING
            if not (0 <= i < ny and 0 <= j < nx):
                raise ValueError("acoustic CUDA kernel: points must lie in the block, not in the ring")
            for ty in range(max(0, (i - tile[1] - halo) // tile[1] + 1), min(ty_n - 1, (i + halo) // tile[1]) + 1):
                for tx in range(max(0, (j - tile[0] - halo) // tile[0] + 1),
                                min(tx_n - 1, (j + halo) // tile[0]) + 1):
                    entries.append((ty * tx_n + tx, k, f))
        entries.sort()  # by tile, then in the given order
        counts = [0] * (tx_n * ty_n + 1)
        for t, _, _ in entries:
            counts[t + 1] += 1
        for t in range(tx_n * ty_n):
            counts[t + 1] += counts[t]
        as_tensor = lambda v: torch.tensor(v, dtype=torch.int64, device=flat.device)
        return cls(as_tensor(counts), as_tensor([f for _, _, f in entries]),
                   as_tensor([k for _, k, _ in entries]))

    def args(self, prefix: str, index_name: str) -> dict:
        return {f"{prefix}_ptr": self.ptr, f"{prefix}_at": self.at,
                f"{prefix}_{index_name}": self.index}


# Steps a launch by default: the blocked kernel's most.  Unmeasured on a GPU so far: its shared
# memory tiles should move ~2.5x fewer bytes a step than the one-step kernel (per_launch = 1),
# which benchmarks/gpu_pde_check.py times beside it on the same card.
PER_LAUNCH = STEPS_PER_LAUNCH

NONE_POINTS = {"src_ptr": None, "src_at": None, "src_idx": None, "src_val": None}
NONE_RECEIVERS = {"rec_ptr": None, "rec_at": None, "rec_slot": None, "traces": None}


class CudaLoop:
    """What the time loop needs besides ``c``: the grid spacing, ``dt^2``, the segments, the
    sponge (and its spans), the ringed geometry and the sources' gain, and the launcher (the
    GPU's kernel, or its host build on CPU tensors)."""

    def __init__(self, launcher, segments: list[tuple[int, int]], dy: float, dx: float,
                 dt2: float, sponge: Tensor | None, geom: LocalGeometry,
                 src_gain: Tensor | None, per_launch: int | None = None,
                 exchange: Callable[[Tensor, Tensor], None] | None = None,
                 ring: tuple[int, int, int, int] = (RING,) * 4, comm=None,
                 adjoint_receivers: tuple[Tensor, Tensor, Tensor] | None = None) -> None:
        """``geom``: indices into the ringed fields (``LocalGeometry.ringed(RING)``).
        ``per_launch``: steps a launch; 1 runs the one-step kernel (cuda_point.h), more the
        blocked one (cuda_blocks.h, at most STEPS_PER_LAUNCH); None: :data:`PER_LAUNCH`.
        ``exchange(u, u_prev)``: on several ranks, the ghosts the next launch reads from the
        neighbours, after every launch; None on one rank.  ``ring``: ghost cells north,
        south, west, east of the owned block in the stepped block's ringed fields (``RING``
        plus the growth); ``geom``, ``sponge``, ``src_gain`` and the ``c2dt2`` given to
        :func:`propagate_cuda` cover the stepped block, the receivers are the owned ones.
        ``adjoint_receivers``: (global ids, ringed rows, ringed columns) of the receivers in
        the grown block, the adjoint's sources (their residuals summed over ``comm``); None:
        the owned ones."""
        per_launch = PER_LAUNCH if per_launch is None else per_launch
        if not 1 <= per_launch <= STEPS_PER_LAUNCH:
            raise ValueError(f"acoustic CUDA kernel: 1 to {STEPS_PER_LAUNCH} steps a launch, not {per_launch}")
        grown = max(ring) - RING
        if per_launch > grown // RING + 1 and exchange is not None:
            raise ValueError(f"acoustic CUDA kernel: {per_launch} steps a launch need blocks grown "
                             f"by {RING * (per_launch - 1)} cells, not {grown}")
        self.per_launch, self.exchange = per_launch, exchange
        self.ring, self.comm, self.adjoint_receivers = ring, comm, adjoint_receivers
        self.launcher, self.segments = launcher, segments
        self.dt2, self.sponge, self.geom, self.src_gain = dt2, sponge, geom, src_gain
        self.iy2, self.ix2 = 1.0 / (dy * dy), 1.0 / (dx * dx)
        spans = sponge_spans(sponge)
        self.spans = None if spans is None else spans.to(sponge.device)
        self._points: dict = {}

    @property
    def nt(self) -> int:
        return self.segments[-1][1]

    def points(self, shape: tuple[int, int, int]) -> dict:
        """The sources (with their values per step, ``(nt, sources)``), the receivers (every
        shot's, slot ``b * receivers + r`` of a step's traces) and the receivers as the
        adjoint's sources, for fields of ``shape``; made once per shape."""
        if shape not in self._points:
            g = self.geom
            shots, rows, cols = shape
            plane = rows * cols
            sources = g.src_shot * plane + g.src_iy * cols + g.src_ix
            receivers = (torch.arange(shots, device=g.rec_iy.device)[:, None] * plane
                         + (g.rec_iy * cols + g.rec_ix)[None, :]).reshape(-1)
            adjoint = receivers
            if self.adjoint_receivers is not None:
                _, iy, ix = self.adjoint_receivers
                adjoint = (torch.arange(shots, device=iy.device)[:, None] * plane
                           + (iy * cols + ix)[None, :]).reshape(-1)
            tile = BLOCK_TILES[self.geom.wavelet.dtype] if self.per_launch > 1 else (TILE_X, TILE_Y)
            halo = 2 * STEPS_PER_LAUNCH if self.per_launch > 1 else 0

            def tables(flat: Tensor, extended: int, by: tuple[int, int] = tile) -> TilePoints | None:
                return TilePoints.of(flat.to(torch.int64), shape, by, extended) if flat.numel() else None

            self._points[shape] = {
                "sources": tables(sources, halo),  # made in the halos too (cuda_blocks.h)
                "values": g.source_values(self.dt2, self.src_gain).contiguous(),
                "receivers": tables(receivers, 0),
                "residuals": tables(adjoint, halo),  # the adjoint's sources
                "adjoint_receivers": tables(adjoint, 0),  # ... for the one-step kernel
                # the last step's residuals, added by the one-step kernel (backward)
                "first_residuals": tables(adjoint, 0, (TILE_X, TILE_Y)),
            }
        return self._points[shape]

    def call(self, c2dt2: Tensor, shape: tuple[int, int, int], blocked: bool | None = None) -> StepCall:
        """The launch arguments of the one-step kernel, or of the blocked one (``blocked``;
        None: as ``per_launch`` says)."""
        ny, nx = c2dt2.shape
        common = dict(B=shape[0], ny=ny, nx=nx, c2dt2=c2dt2, sponge=self.sponge, span=self.spans,
                      iy2=self.iy2, ix2=self.ix2, grad=None, **NONE_POINTS, **NONE_RECEIVERS)
        if not (self.per_launch > 1 if blocked is None else blocked):
            return StepCall(tiles_x=tiles_x(nx), lap_out=None, lap_in=None, **common)
        tile = BLOCK_TILES[c2dt2.dtype]
        return StepCall(BLOCKS_ENTRY, tile, tiles_x=tiles_x(nx, tile[0]), steps=0, lap=None,
                        lap_stride=0, lap_mode=0, src_stride=0, rec_stride=0, **common)


def propagate_cuda(loop: CudaLoop, speed: Tensor, nshots: int, keep_field: bool = False,
                   stepped: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Receiver traces ``(shots, receivers, nt)`` for wave speed ``speed`` ``(ny, nx)`` on the
    owned block (the gradient is its), and with ``keep_field`` the final field on the owned
    block (no gradient).  ``stepped``: ``c2dt2`` on the stepped (grown) block, no graph; None:
    the owned block's, made here."""
    if stepped is None:
        with torch.no_grad():
            stepped = torch.mul(speed, speed).mul_(loop.dt2).contiguous()  # as (c * c) * dt^2
    traces, field = _CudaPropagation.apply(speed, stepped, loop, nshots)
    if not keep_field:
        return traces, None
    rn, _, rw, _ = loop.ring
    return traces, field[..., rn : rn + speed.shape[0], rw : rw + speed.shape[1]]


def _row(t: Tensor, k: int) -> int:
    """The address of ``t[k]`` (``t`` contiguous) without making a view."""
    return t.data_ptr() + k * t.stride(0) * t.element_size()


def _stride(t: Tensor) -> int:
    """Bytes from ``t[k]`` to ``t[k + 1]``."""
    return t.stride(0) * t.element_size()


def _steps(loop: CudaLoop, call: StepCall, fields: list[Tensor], t0: int, t1: int,
           traces: Tensor | None, store: Tensor | None, adjoint: Tensor | None = None,
           residuals: Tensor | None = None) -> list[Tensor]:
    """Steps ``t0 .. t1-1`` from ``fields = [u_prev, u, spare, spare]`` (one C call); returns
    them with the last two time levels first.  Forward: recording the receivers into
    ``traces[k]`` (``(nt, shots * receivers)``) when given, and with ``store`` each step's
    ``lap4(u)`` into ``store[k - t0]``.  With ``adjoint`` (``grad_sum``) the steps are the
    adjoint's, ``t1-1 .. t0``, reading ``store[k - t0]`` and adding ``residuals[nt - k]``."""
    pts = loop.points(tuple(fields[0].shape))
    blocked = call.entry == BLOCKS_ENTRY
    lap = "lap" if blocked else ("lap_in" if adjoint is not None else "lap_out")
    if adjoint is not None:  # the store backward in time, the residuals forward
        moving = [(lap, _row(store, t1 - 1 - t0), -_stride(store))]
        table = pts["residuals" if blocked else "adjoint_receivers"]
        call.set(grad=adjoint)
        if table is not None:  # a rank without receivers: the adjoint comes from its neighbours
            call.set(**table.args("src", "idx"))
            moving.append(("src_val", _row(residuals, loop.nt - t1 + 1), _stride(residuals)))
        if blocked:
            call.set(lap_mode=2, lap_stride=-store.stride(0), src_stride=residuals.stride(0))
    else:
        moving = [(lap, 0 if store is None else store.data_ptr(), 0 if store is None else _stride(store))]
        if blocked:
            call.set(lap_mode=0 if store is None else 1, lap_stride=0 if store is None else store.stride(0))
        if pts["sources"] is not None:
            call.set(**pts["sources"].args("src", "idx"))
            moving.append(("src_val", _row(pts["values"], t0), _stride(pts["values"])))
            if blocked:
                call.set(src_stride=pts["values"].stride(0))
        if traces is not None and pts["receivers"] is not None:
            call.set(**pts["receivers"].args("rec", "slot"))
            moving.append(("traces", _row(traces, t0), _stride(traces)))
            if blocked:
                call.set(rec_stride=traces.stride(0))
    if blocked:
        loop.launcher.run_blocks(call, t1 - t0, loop.per_launch, fields, moving, loop.exchange)
        swapped = -(-(t1 - t0) // loop.per_launch) % 2  # launches write the other pair
    else:
        loop.launcher.run(call, t1 - t0, fields[0], fields[1], moving, loop.exchange)
        swapped = 0
        if (t1 - t0) % 2:
            fields = [fields[1], fields[0], *fields[2:]]
    call.set(**NONE_POINTS, **NONE_RECEIVERS, grad=None, **{lap: None})
    return [*fields[2:], *fields[:2]] if swapped else fields


class _CudaPropagation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, speed: Tensor, c2dt2: Tensor, loop: CudaLoop, nshots: int):
        ny, nx = c2dt2.shape
        shape = (nshots, ny + 2 * RING, nx + 2 * RING)
        # u_prev, u, and the pair the blocked kernel writes into (zero rings: never written)
        fields = [c2dt2.new_zeros(shape) for _ in range(4 if loop.per_launch > 1 else 2)]
        nrec = loop.geom.nrec_local
        traces = c2dt2.new_zeros((loop.nt, nshots * nrec))
        call = loop.call(c2dt2, shape)
        keep = ctx.needs_input_grad[0]
        starts, store = [], None
        last = len(loop.segments) - 1
        for s, (t0, t1) in enumerate(loop.segments):
            if keep and s < last:
                starts.append([f.clone() for f in fields[:2]])
            if keep and s == last:
                longest = max(b - a for a, b in loop.segments)
                store = c2dt2.new_empty((longest, nshots, ny, nx))
            fields = _steps(loop, call, fields, t0, t1, traces, store)
        if keep:
            ctx.loop, ctx.starts, ctx.store, ctx.shape = loop, starts, store, shape
            ctx.spares = fields[2:]
            ctx.save_for_backward(speed, c2dt2)
        u = fields[1]
        ctx.mark_non_differentiable(u)
        return traces.view(loop.nt, nshots, nrec).permute(1, 2, 0).contiguous(), u

    @staticmethod
    @once_differentiable
    def backward(ctx, g_traces: Tensor | None, _g_field):
        speed, c2dt2 = ctx.saved_tensors
        loop, store, shape, spares = ctx.loop, ctx.store, ctx.shape, ctx.spares
        ctx.store = ctx.spares = None
        # on several ranks every rank runs the adjoint (its exchanges), receivers or none
        if loop.exchange is None and (g_traces is None or loop.geom.nrec_local == 0):
            return torch.zeros_like(speed), None, None, None
        if g_traces is None:
            g_traces = c2dt2.new_zeros((shape[0], loop.geom.nrec_local, loop.nt))
        residuals = _adjoint_sources(loop, g_traces, c2dt2)
        mu_after, mu = (c2dt2.new_zeros(shape) for _ in range(2))
        # mu of the last step: its residuals added into zeros, by a step of zero fields
        first = loop.call(c2dt2, shape, blocked=False)
        table = loop.points(shape)["first_residuals"]
        if table is not None:
            first.set(u=mu_after, u_prev=mu_after, out=mu, src_val=residuals[0],
                      **table.args("src", "idx"))
            loop.launcher.launch(first)
        if loop.exchange is not None:  # the ghosts the first adjoint launch reads
            loop.exchange(mu, mu_after)
        # the adjoint's own spare pair: the recomputations write into the forward's
        adjoint = [mu_after, mu, *(torch.zeros_like(f) for f in spares)]
        grad_sum = torch.zeros_like(c2dt2)
        call = loop.call(c2dt2, shape)
        for s in reversed(range(len(loop.segments))):
            t0, t1 = loop.segments[s]
            if s < len(loop.segments) - 1:  # recompute this segment's laps from its start
                _steps(loop, call, [*ctx.starts[s], *spares], t0, t1, None, store)
            adjoint = _steps(loop, call, adjoint, t0, t1, None, store, grad_sum, residuals)
        ctx.starts = None
        rn, rs, rw, re = (r - RING for r in loop.ring)  # the owned block's gradient, in place
        ny, nx = grad_sum.shape
        return grad_sum[rn : ny - rs, rw : nx - re].div_(speed), None, None, None


def _adjoint_sources(loop: CudaLoop, g_traces: Tensor, c2dt2: Tensor) -> Tensor:
    """The receivers' residuals as sources of the adjoint in the forward's form, ``2 c2dt2 G r``
    (``mu = 2 c2dt2 G lambda``: the 2 is d(c^2)/dc's), as ``(nt + 1, shots * receivers)``: row
    ``m`` for time ``nt - 1 - m`` (the order the backward meets them) and a last row of zeros
    (the first step has no residual before it); as fused._adjoint_sources: on a grown block every
    receiver in it, with the residuals of the neighbours' from an all-reduce (collective)."""
    g = loop.geom
    if loop.adjoint_receivers is None:
        residuals, iy, ix = g_traces, g.rec_iy, g.rec_ix
    else:
        ids, iy, ix = loop.adjoint_receivers
        scattered = g.scatter_traces(g_traces.detach())
        summed = loop.comm.allreduce_array(scattered.cpu().numpy())
        residuals = torch.from_numpy(summed).to(g_traces.device)[:, ids, :]
    iy, ix = iy - RING, ix - RING
    weight = 2 * c2dt2[iy, ix]
    if loop.sponge is not None:
        weight = weight * loop.sponge[iy, ix]
    shots = residuals.shape[0]
    values = c2dt2.new_zeros((loop.nt + 1, shots, iy.numel()))
    values[:-1] = (residuals * weight[None, :, None]).permute(2, 0, 1).flip(0)
    return values.reshape(loop.nt + 1, -1)
