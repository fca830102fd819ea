"""Differentiable communication ops (ADCME-style): each op's backward is its MPI adjoint.

Every op is collective: all ranks must call the same ops in the same order with the same
leading (batch) shapes. Messages are staged through host memory as contiguous numpy
buffers; only halo strips travel, so the bulk of a CUDA tensor stays on the device.
Each backward is itself an autograd Function, so double backward works too (except for the
in-place ``halo_fill``, which is once differentiable). ``fill_ring_`` and ``fill_ring_adjoint_``
are the plain in-place pair for engines that run their own adjoint loop, and ``GhostExchange``
the planned exchange of several fields' deep ghost strips in one message per neighbour.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from .comm import Comm
from .decomposition import Decomposition, decompose
from .strips import Boxes

# Tags name the direction a message travels; forward and adjoint halo traffic never share a tag.
_EASTWARD, _WESTWARD, _NORTHWARD, _SOUTHWARD = range(4)
_TAG_HALO_FWD = 100
_TAG_HALO_ADJ = 200

_NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}

# (neighbour rank or None, view sent to it, view its message lands in, send tag, receive tag)
_Link = tuple[int | None, Tensor, Tensor, int, int]


def _check_float(x: Tensor, op: str) -> None:
    if x.dtype not in _NUMPY_DTYPES:
        raise TypeError(f"{op}: expected a float32 or float64 tensor, got {x.dtype}")


def _host(t: Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy()


def _like(a: np.ndarray, ref: Tensor) -> Tensor:
    return torch.from_numpy(a).to(device=ref.device, dtype=ref.dtype)


def _swap(comm: Comm, links: list[_Link], accumulate: bool) -> None:
    """One phase: one message per existing neighbour, then copy (forward) or add (adjoint) in place."""
    live = [link for link in links if link[0] is not None]
    sends = [(peer, _host(src), tag) for peer, src, _, tag, _ in live]
    recvs = [
        (peer, np.empty(tuple(dst.shape), _NUMPY_DTYPES[dst.dtype]), tag) for peer, _, dst, _, tag in live
    ]
    comm.exchange(sends, recvs)
    for (_, _, dst, _, _), (_, buf, _) in zip(live, recvs):
        if accumulate:
            dst.add_(_like(buf, dst))
        else:
            dst.copy_(_like(buf, dst))


def _halo_forward(u: Tensor, d: Decomposition, comm: Comm, w: int, fill: float) -> Tensor:
    """Pad by ``w``; east/west first, then north/south on x-extended rows, so corners come along."""
    ny, nx = u.shape[-2:]
    out = F.pad(u.detach(), (w, w, w, w), value=fill)
    rows = out[..., w : w + ny, :]
    tag = _TAG_HALO_FWD
    _swap(
        comm,
        [
            (d.west, rows[..., w : 2 * w], rows[..., :w], tag + _WESTWARD, tag + _EASTWARD),
            (d.east, rows[..., nx : nx + w], rows[..., nx + w :], tag + _EASTWARD, tag + _WESTWARD),
        ],
        accumulate=False,
    )
    _swap(
        comm,
        [
            (d.north, out[..., w : 2 * w, :], out[..., :w, :], tag + _NORTHWARD, tag + _SOUTHWARD),
            (d.south, out[..., ny : ny + w, :], out[..., ny + w :, :], tag + _SOUTHWARD, tag + _NORTHWARD),
        ],
        accumulate=False,
    )
    return out


def _halo_adjoint(g: Tensor, d: Decomposition, comm: Comm, w: int) -> Tensor:
    """Phases of the forward in reverse: ghost gradients go back to their owners and are added."""
    ny, nx = g.shape[-2] - 2 * w, g.shape[-1] - 2 * w
    acc = g.detach().clone()
    tag = _TAG_HALO_ADJ
    _swap(
        comm,
        [
            (d.north, acc[..., :w, :], acc[..., w : 2 * w, :], tag + _NORTHWARD, tag + _SOUTHWARD),
            (d.south, acc[..., ny + w :, :], acc[..., ny : ny + w, :], tag + _SOUTHWARD, tag + _NORTHWARD),
        ],
        accumulate=True,
    )
    rows = acc[..., w : w + ny, :]
    _swap(
        comm,
        [
            (d.west, rows[..., :w], rows[..., w : 2 * w], tag + _WESTWARD, tag + _EASTWARD),
            (d.east, rows[..., nx + w :], rows[..., nx : nx + w], tag + _EASTWARD, tag + _WESTWARD),
        ],
        accumulate=True,
    )
    return rows[..., w : w + nx].contiguous()


class _HaloExchange(Function):
    @staticmethod
    def forward(ctx, u: Tensor, d: Decomposition, comm: Comm, w: int, fill: float) -> Tensor:
        ctx.args = (d, comm, w)
        return _halo_forward(u, d, comm, w, fill)

    @staticmethod
    def backward(ctx, g: Tensor):
        return _HaloAdjoint.apply(g, *ctx.args), None, None, None, None


class _HaloAdjoint(Function):
    @staticmethod
    def forward(ctx, g: Tensor, d: Decomposition, comm: Comm, w: int) -> Tensor:
        ctx.args = (d, comm, w)
        return _halo_adjoint(g, d, comm, w)

    @staticmethod
    def backward(ctx, gg: Tensor):
        return _HaloExchange.apply(gg, *ctx.args, 0.0), None, None, None


Ring = tuple[int, int, int, int]  # ghost cells around the owned block: north, south, west, east


def _ghost_slices(shape: tuple[int, ...], d: Decomposition, ring: Ring, depth: int) -> tuple[list, list]:
    """The east/west and north/south strips of a field of ``shape`` whose owned block sits
    inside a ghost ring of widths ``ring``: per side, ``(peer, edge, ghost, toward, from)``
    with ``edge`` and ``ghost`` index tuples ``depth`` cells deep (the owner's strip and the
    ghosts it fills) and the directions the message travels out and in.  North/south strips
    span the whole width, east/west ghosts included, so corners come along in that phase."""
    rn, rs, rw, re = ring
    ny, nx = shape[-2] - rn - rs, shape[-1] - rw - re
    k, rows, every = depth, slice(rn, rn + ny), slice(None)
    ew = [(d.west, (..., rows, slice(rw, rw + k)), (..., rows, slice(rw - k, rw)), _WESTWARD, _EASTWARD),
          (d.east, (..., rows, slice(rw + nx - k, rw + nx)), (..., rows, slice(rw + nx, rw + nx + k)),
           _EASTWARD, _WESTWARD)]
    ns = [(d.north, (..., slice(rn, rn + k), every), (..., slice(rn - k, rn), every), _NORTHWARD, _SOUTHWARD),
          (d.south, (..., slice(rn + ny - k, rn + ny), every), (..., slice(rn + ny, rn + ny + k), every),
           _SOUTHWARD, _NORTHWARD)]
    return ew, ns


class GhostExchange:
    """A halo exchange of CPU fields of one shape, planned once: the strips of each message are
    :class:`~odecli.parallel.strips.Boxes` with their packed buffer, so a call is one pack and
    one unpack per neighbour (C copies) and one exchange per phase.  On small blocks, building
    views and buffers, then numpy per strip, was most of an exchange's cost.

    ``depths[i]`` ghost cells of field ``i`` next to its owned block, inside the ghost ring
    ``ring``, are exchanged on every side with a neighbour; all fields travel in one message
    per neighbour and phase.  Forward, ghosts are overwritten with the neighbours' edge
    strips.  The adjoint (``adjoint=True``) runs the phases in reverse, adds ghost gradients
    into their owners' edge strips and zeroes the ghosts (an overwritten ghost has no
    gradient of its own).
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, d: Decomposition, comm: Comm,
                 ring: Ring, depths: tuple[int, ...], adjoint: bool = False) -> None:
        sides = (d.north, d.south, d.west, d.east)
        if any(peer is not None and k > width for k in depths for peer, width in zip(sides, ring)):
            raise ValueError(f"GhostExchange: depths {depths} exceed the ghost ring {ring}")
        self.adjoint = adjoint
        tag = _TAG_HALO_ADJ if adjoint else _TAG_HALO_FWD
        per_field = [(i, _ghost_slices(shape, d, ring, k)) for i, k in enumerate(depths) if k > 0]
        self.phases = []
        for phase in ((1, 0) if adjoint else (0, 1)):
            links = []
            for side in range(2):
                outgoing, incoming = [], []
                for i, groups in per_field:
                    peer, edge, ghost, toward, back = groups[phase][side]
                    if peer is None:
                        break
                    outgoing.append((i, ghost if adjoint else edge))
                    incoming.append((i, edge if adjoint else ghost))
                if outgoing:
                    links.append((peer, tag + toward, tag + back, Boxes(shape, dtype, outgoing),
                                  Boxes(shape, dtype, incoming)))
            self.phases.append((links, [(p, out.buffer, t) for p, t, _, out, _ in links],
                                [(p, into.buffer, t) for p, _, t, _, into in links]))
        self.comm = comm

    def __call__(self, fields: list[Tensor]) -> None:
        mode = "add" if self.adjoint else "copy"
        for links, sends, recvs in self.phases:
            for *_, outgoing, _ in links:
                outgoing.pack(fields, clear=self.adjoint)
            self.comm.exchange(sends, recvs)
            for *_, incoming in links:
                incoming.unpack(fields, mode)


def fill_ring_(up: Tensor, d: Decomposition, comm: Comm, w: int) -> None:
    """Overwrite the ghost ring of ``up`` (width ``w``) with the neighbours' edge strips (no autograd)."""
    _fill_ring(up, d, comm, w, adjoint=False)


def fill_ring_adjoint_(g: Tensor, d: Decomposition, comm: Comm, w: int) -> None:
    """Adjoint of :func:`fill_ring_` in place: ghost gradients are added into their owners'
    edge strips and then zeroed (an overwritten ghost has no gradient of its own)."""
    _fill_ring(g, d, comm, w, adjoint=True)


@functools.lru_cache(maxsize=32)
def _ring_plan(shape: tuple[int, ...], dtype: torch.dtype, d: Decomposition, comm: Comm, w: int,
               adjoint: bool) -> GhostExchange:
    return GhostExchange(shape, dtype, d, comm, (w,) * 4, (w,), adjoint)


def _fill_ring(up: Tensor, d: Decomposition, comm: Comm, w: int, adjoint: bool) -> None:
    if up.device.type == "cpu":
        _ring_plan(tuple(up.shape), up.dtype, d, comm, w, adjoint)([up])
        return
    ew, ns = _ghost_slices(tuple(up.shape), d, (w,) * 4, w)
    tag = _TAG_HALO_ADJ if adjoint else _TAG_HALO_FWD
    for group in ((ns, ew) if adjoint else (ew, ns)):
        if adjoint:  # send the ghost strip, add into the edge strip, then clear the ghost
            links = [(p, up[g], up[e], tag + s, tag + r) for p, e, g, s, r in group]
        else:
            links = [(p, up[e], up[g], tag + s, tag + r) for p, e, g, s, r in group]
        _swap(comm, links, accumulate=adjoint)
        for peer, ghost, *_ in (links if adjoint else []):
            if peer is not None:
                ghost.zero_()


class _HaloFill(Function):
    @staticmethod
    def forward(ctx, up: Tensor, d: Decomposition, comm: Comm, w: int, clock) -> Tensor:
        ctx.args, ctx.clock = (d, comm, w), clock
        fill_ring_(up, d, comm, w)
        ctx.mark_dirty(up)
        return up

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor):
        t0 = time.perf_counter()
        acc = g.clone()
        fill_ring_adjoint_(acc, *ctx.args)
        if ctx.clock is not None:
            ctx.clock(time.perf_counter() - t0)
        return acc, None, None, None, None


def halo_fill(up: Tensor, decomp: Decomposition, comm: Comm, width: int,
              clock: Callable[[float], None] | None = None) -> Tensor:
    """Overwrite the ghost ring of ``up`` (``(..., ny + 2w, nx + 2w)``) with the neighbours' edges.

    The in-place counterpart of :func:`halo_exchange` for fields stored with their ring: only
    the strips move, no full-size copy is made.  Ghosts outside the global grid keep their
    values. Returns ``up`` (modified in place; differentiable). ``clock``, if given, is told
    the wall time of each backward (an in-place op leaves no room for timing marks around it).
    """
    _check_float(up, "halo_fill")
    _check_layout(decomp, comm, "halo_fill")
    expect = (decomp.local_shape[0] + 2 * width, decomp.local_shape[1] + 2 * width)
    if up.dim() < 2 or tuple(up.shape[-2:]) != expect:
        raise ValueError(f"halo_fill: expected a tensor ending in {expect} (the local shape plus "
                         f"a ring of {width}), got {tuple(up.shape)}")
    if width > min(decomp.min_local_shape):
        raise ValueError(f"halo_fill: halo width {width} exceeds the smallest block "
                         f"{decomp.min_local_shape}; use fewer ranks or a narrower stencil")
    if comm.size == 1 or width == 0:
        return up
    return _HaloFill.apply(up, decomp, comm, width, clock)


def _check_layout(decomp: Decomposition, comm: Comm, op: str) -> None:
    if decomp.nranks != comm.size or decomp.rank != comm.rank:
        raise ValueError(
            f"{op}: decomposition is for rank {decomp.rank} of {decomp.nranks}, "
            f"but the communicator is rank {comm.rank} of {comm.size}"
        )


def halo_exchange(u: Tensor, decomp: Decomposition, comm: Comm, width: int, fill: float = 0.0) -> Tensor:
    """Pad the local block ``(..., ny, nx)`` by ``width`` ghost cells taken from the neighbours.

    Corner ghosts hold the diagonal neighbour's values; ghosts outside the global grid hold
    ``fill``. The backward adds each ghost cell's gradient into the cell that owns it.
    """
    _check_float(u, "halo_exchange")
    _check_layout(decomp, comm, "halo_exchange")
    if u.dim() < 2 or tuple(u.shape[-2:]) != decomp.local_shape:
        raise ValueError(
            f"halo_exchange: expected a tensor ending in the local shape {decomp.local_shape}, "
            f"got {tuple(u.shape)}"
        )
    if width < 0:
        raise ValueError(f"halo_exchange: width must be >= 0, got {width}")
    if width > min(decomp.min_local_shape):
        raise ValueError(
            f"halo_exchange: halo width {width} exceeds the smallest block "
            f"{decomp.min_local_shape} of the {decomp.proc_grid[0]}x{decomp.proc_grid[1]} "
            "process grid; use fewer ranks or a narrower stencil"
        )
    if comm.size == 1 or width == 0:
        return F.pad(u, (width,) * 4, value=fill)
    return _HaloExchange.apply(u, decomp, comm, width, float(fill))


class _AllreduceSum(Function):
    @staticmethod
    def forward(ctx, x: Tensor, comm: Comm) -> Tensor:
        ctx.comm = comm
        return _like(comm.allreduce_array(_host(x)), x)

    @staticmethod
    def backward(ctx, g: Tensor):
        return _AllreduceSum.apply(g, ctx.comm), None


def allreduce_sum(x: Tensor, comm: Comm) -> Tensor:
    """Sum over ranks, on every rank. Self-adjoint: the gradient is the sum of all ranks' gradients."""
    _check_float(x, "allreduce_sum")
    if comm.size == 1:
        return x.clone()
    return _AllreduceSum.apply(x, comm)


class _Broadcast(Function):
    @staticmethod
    def forward(ctx, x: Tensor, comm: Comm, root: int) -> Tensor:
        ctx.args = (comm, root)
        return _like(comm.bcast_array(_host(x), root), x)

    @staticmethod
    def backward(ctx, g: Tensor):
        return _ReduceToRoot.apply(g, *ctx.args), None, None


class _ReduceToRoot(Function):
    @staticmethod
    def forward(ctx, x: Tensor, comm: Comm, root: int) -> Tensor:
        ctx.args = (comm, root)
        return _like(comm.reduce_array(_host(x), root), x)

    @staticmethod
    def backward(ctx, g: Tensor):
        return _Broadcast.apply(g, *ctx.args), None, None


def broadcast(x: Tensor, comm: Comm, root: int = 0) -> Tensor:
    """Root's ``x`` on every rank (all ranks pass the same shape). Gradients sum onto root; others get 0."""
    _check_float(x, "broadcast")
    if not 0 <= root < comm.size:
        raise ValueError(f"broadcast: root rank {root} is outside 0..{comm.size - 1}")
    if comm.size == 1:
        return x.clone()
    return _Broadcast.apply(x, comm, root)


def gather_global(local: Tensor, decomp: Decomposition, comm: Comm, root: int = 0) -> Tensor | None:
    """Assemble the global ``(..., ny, nx)`` field on root (for output; not differentiable)."""
    _check_layout(decomp, comm, "gather_global")
    blocks = comm.gather_object(_host(local), root=root)
    if blocks is None:
        return None
    ny, nx = decomp.global_shape
    out = np.empty(tuple(local.shape[:-2]) + (ny, nx), dtype=blocks[0].dtype)
    for r, block in enumerate(blocks):
        b = decompose(decomp.global_shape, decomp.nranks, r, decomp.proc_grid)
        out[..., b.y0 : b.y1, b.x0 : b.x1] = block
    return _like(out, local)


def local_block(global_field: Tensor, decomp: Decomposition) -> Tensor:
    """This rank's slice of a field that every rank holds globally (differentiable view)."""
    if global_field.dim() < 2 or tuple(global_field.shape[-2:]) != decomp.global_shape:
        raise ValueError(
            f"local_block: expected a tensor ending in the global shape {decomp.global_shape}, "
            f"got {tuple(global_field.shape)}"
        )
    return global_field[..., decomp.y0 : decomp.y1, decomp.x0 : decomp.x1]
