"""The acoustic time loop on the CUDA kernel (:mod:`odecli.pde.acoustic.cuda_build`), with the
CPU fused loop's hand-written adjoint (:mod:`odecli.pde.acoustic.fused`) and its time segments.

One launch per step makes every shot's step, adds the sources and reads the receivers.  The
whole propagation is one autograd operation of the wave speed ``c``.  Forward: two field buffers
recycled (each new field overwrites the one two steps back), the fields at the start of every
time segment copied, and, for the gradient, the last segment's ``lap4(u)`` of every step stored.
Backward: each earlier segment recomputed from its start storing its laps, then the adjoint run
through it in reverse as the forward step itself, on ``mu = c2dt2 G lambda`` with the receivers'
residuals (times ``2 c2dt2 G``) as its sources, summing ``mu lap4(u)`` into ``grad_sum``; the
gradient of ``c`` is ``grad_sum / c`` (acoustic.c and Loop.owned_gradient have the derivation).
The same launches run on CPU tensors through the kernel's host build, which is how the tests
check it against the PyTorch reference and its autograd without a GPU.

One rank only: the kernels step a whole grid; several ranks (halo exchanges between steps) stay
on the reference path, which the propagator says in its engine line.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from odecli.pde.acoustic.cuda_build import (
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
    not)``: the GPU's kernel for CUDA tensors on one rank (tests put the host build here)."""
    if like.device.type != "cuda":
        return None, f"the acoustic CUDA kernels need CUDA tensors (got {like.device})"
    if comm.size > 1:
        return None, ("the acoustic CUDA kernels step one whole grid: several ranks (halo "
                      "exchanges between steps) run the reference")
    return cuda_launcher(like)


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
    def of(cls, flat: Tensor, shape: tuple[int, int, int]) -> TilePoints:
        _, rows, cols = shape
        ny, nx = rows - 2 * RING, cols - 2 * RING
        i = (flat % (rows * cols)) // cols - RING
        j = flat % cols - RING
        if flat.numel() and (int(i.min()) < 0 or int(i.max()) >= ny or int(j.min()) < 0
                             or int(j.max()) >= nx):
            raise ValueError("acoustic CUDA kernel: points must lie in the block, not in the ring")
        tx = tiles_x(nx)
        tiles = -(-ny // TILE_Y) * tx
        tile = (i // TILE_Y) * tx + j // TILE_X
        order = torch.argsort(tile, stable=True)
        ptr = torch.zeros(tiles + 1, dtype=torch.int64, device=flat.device)
        ptr[1:] = torch.cumsum(torch.bincount(tile, minlength=tiles), 0)
        return cls(ptr, flat[order].contiguous(), order.contiguous())

    def args(self, prefix: str, index_name: str) -> dict:
        return {f"{prefix}_ptr": self.ptr, f"{prefix}_at": self.at,
                f"{prefix}_{index_name}": self.index}


NONE_POINTS = {"src_ptr": None, "src_at": None, "src_idx": None, "src_val": None}
NONE_RECEIVERS = {"rec_ptr": None, "rec_at": None, "rec_slot": None, "traces": None}


class CudaLoop:
    """What the time loop needs besides ``c``: the grid spacing, ``dt^2``, the segments, the
    sponge (and its spans), the ringed geometry and the sources' gain, and the launcher (the
    GPU's kernel, or its host build on CPU tensors)."""

    def __init__(self, launcher, segments: list[tuple[int, int]], dy: float, dx: float,
                 dt2: float, sponge: Tensor | None, geom: LocalGeometry,
                 src_gain: Tensor | None) -> None:
        """``geom``: indices into the ringed fields (``LocalGeometry.ringed(RING)``)."""
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
            self._points[shape] = {
                "sources": TilePoints.of(sources.to(torch.int64), shape) if sources.numel() else None,
                "values": g.source_values(self.dt2, self.src_gain).contiguous(),
                "receivers": (TilePoints.of(receivers.to(torch.int64), shape)
                              if receivers.numel() else None),
            }
        return self._points[shape]

    def call(self, c2dt2: Tensor, shape: tuple[int, int, int]) -> StepCall:
        ny, nx = c2dt2.shape
        return StepCall(B=shape[0], ny=ny, nx=nx, tiles_x=tiles_x(nx), c2dt2=c2dt2,
                        sponge=self.sponge, span=self.spans, iy2=self.iy2, ix2=self.ix2,
                        lap_out=None, lap_in=None, grad=None, **NONE_POINTS, **NONE_RECEIVERS)


def propagate_cuda(loop: CudaLoop, speed: Tensor, nshots: int,
                   keep_field: bool = False) -> tuple[Tensor, Tensor | None]:
    """Receiver traces ``(shots, receivers, nt)`` for wave speed ``speed`` ``(ny, nx)`` (the
    gradient is its), and with ``keep_field`` the final field on the block (no gradient)."""
    with torch.no_grad():
        c2dt2 = torch.mul(speed, speed).mul_(loop.dt2).contiguous()  # as (c * c) * dt^2
    traces, field = _CudaPropagation.apply(speed, c2dt2, loop, nshots)
    return traces, (field[..., RING:-RING, RING:-RING] if keep_field else None)


def _row(t: Tensor, k: int) -> int:
    """The address of ``t[k]`` (``t`` contiguous) without making a view."""
    return t.data_ptr() + k * t.stride(0) * t.element_size()


def _stride(t: Tensor) -> int:
    """Bytes from ``t[k]`` to ``t[k + 1]``."""
    return t.stride(0) * t.element_size()


def _steps(loop: CudaLoop, call: StepCall, p: Tensor, u: Tensor, t0: int, t1: int,
           traces: Tensor | None, store: Tensor | None) -> tuple[Tensor, Tensor]:
    """Steps ``t0 .. t1-1`` from ``(p, u)``, each new field written over ``p``'s buffer,
    recording the receivers into ``traces[k]`` (``(nt, shots * receivers)``) when given and with
    ``store`` each step's ``lap4(u)`` into ``store[k - t0]``; one call of the C time loop."""
    pts = loop.points(tuple(p.shape))
    values, record = pts["values"], traces is not None and pts["receivers"] is not None
    moving = [("lap_out", 0 if store is None else store.data_ptr(), 0 if store is None else _stride(store))]
    if pts["sources"] is not None:
        call.set(**pts["sources"].args("src", "idx"))
        moving.append(("src_val", _row(values, t0), _stride(values)))
    if record:
        call.set(**pts["receivers"].args("rec", "slot"))
        moving.append(("traces", _row(traces, t0), _stride(traces)))
    loop.launcher.run(call, t1 - t0, p, u, moving)
    call.set(**NONE_POINTS, **NONE_RECEIVERS, lap_out=None)
    return (u, p) if (t1 - t0) % 2 else (p, u)


class _CudaPropagation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, speed: Tensor, c2dt2: Tensor, loop: CudaLoop, nshots: int):
        ny, nx = c2dt2.shape
        shape = (nshots, ny + 2 * RING, nx + 2 * RING)
        p, u = (c2dt2.new_zeros(shape) for _ in range(2))
        nrec = loop.geom.nrec_local
        traces = c2dt2.new_zeros((loop.nt, nshots * nrec))
        call = loop.call(c2dt2, shape)
        keep = ctx.needs_input_grad[0]
        starts, store = [], None
        last = len(loop.segments) - 1
        for s, (t0, t1) in enumerate(loop.segments):
            if keep and s < last:
                starts.append((p.clone(), u.clone()))
            if keep and s == last:
                longest = max(b - a for a, b in loop.segments)
                store = c2dt2.new_empty((longest, nshots, ny, nx))
            p, u = _steps(loop, call, p, u, t0, t1, traces, store)
        if keep:
            ctx.loop, ctx.starts, ctx.store, ctx.shape = loop, starts, store, shape
            ctx.save_for_backward(speed, c2dt2)
        ctx.mark_non_differentiable(u)
        return traces.view(loop.nt, nshots, nrec).permute(1, 2, 0).contiguous(), u

    @staticmethod
    @once_differentiable
    def backward(ctx, g_traces: Tensor | None, _g_field):
        speed, c2dt2 = ctx.saved_tensors
        loop, store, shape = ctx.loop, ctx.store, ctx.shape
        if g_traces is None or loop.geom.nrec_local == 0:
            return torch.zeros_like(speed), None, None, None
        residuals = _adjoint_sources(loop, g_traces, c2dt2)
        receivers = loop.points(shape)["receivers"]
        mu_after, mu = (c2dt2.new_zeros(shape) for _ in range(2))
        call = loop.call(c2dt2, shape)
        # mu of the last step: its residuals added into zeros, by a step of zero fields
        call.set(u=mu_after, u_prev=mu_after, out=mu, src_val=residuals[0],
                 **receivers.args("src", "idx"))
        loop.launcher.launch(call)
        grad_sum = torch.zeros_like(c2dt2)
        nt = loop.nt
        for s in reversed(range(len(loop.segments))):
            t0, t1 = loop.segments[s]
            if s < len(loop.segments) - 1:  # recompute this segment's laps from its start
                _steps(loop, call, *ctx.starts[s], t0, t1, None, store)
                call.set(**receivers.args("src", "idx"))
            call.set(grad=grad_sum)
            # adjoint steps k = t1-1 .. t0: lap(u_k) from store[k - t0], residuals[nt - k]
            loop.launcher.run(call, t1 - t0, mu_after, mu,
                              [("lap_in", _row(store, t1 - 1 - t0), -_stride(store)),
                               ("src_val", _row(residuals, nt - t1 + 1), _stride(residuals))])
            if (t1 - t0) % 2:
                mu_after, mu = mu, mu_after
            call.set(grad=None, lap_in=None)
        ctx.starts = ctx.store = None
        return grad_sum.div_(speed), None, None, None


def _adjoint_sources(loop: CudaLoop, g_traces: Tensor, c2dt2: Tensor) -> Tensor:
    """The receivers' residuals as sources of the adjoint in the forward's form, ``2 c2dt2 G r``
    (``mu = 2 c2dt2 G lambda``: the 2 is d(c^2)/dc's), as ``(nt + 1, shots * receivers)``: row
    ``m`` for time ``nt - 1 - m`` (the order the backward meets them) and a last row of zeros
    (the first step has no residual before it); as fused._adjoint_sources, on one rank."""
    g = loop.geom
    iy, ix = g.rec_iy - RING, g.rec_ix - RING
    weight = 2 * c2dt2[iy, ix]
    if loop.sponge is not None:
        weight = weight * loop.sponge[iy, ix]
    shots = g_traces.shape[0]
    values = c2dt2.new_zeros((loop.nt + 1, shots, iy.numel()))
    values[:-1] = (g_traces * weight[None, :, None]).permute(2, 0, 1).flip(0)
    return values.reshape(loop.nt + 1, -1)
