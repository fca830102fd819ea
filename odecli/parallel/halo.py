"""The halo exchange: one plan per field layout, and the in-place, out-of-place and autograd
operations that run it.

In the spirit of Devito's halo scheme, *what* moves is decided once, apart from the operators
that move it: a :class:`HaloPlan` knows the neighbours, the strips of every message (as
:class:`~odecli.parallel.strips.Boxes`) and their packed buffers, so a call is one pack, one
exchange and one unpack per neighbour and phase.  Everything else here is a thin wrapper:

* :func:`fill_ring_` / :func:`fill_ring_adjoint_`: a field stored with its ghost ring, in place,
  no autograd (engines that run their own adjoint loop);
* :func:`halo_fill`: the same, differentiable (once);
* :func:`halo_exchange`: out of place, the local block padded by the ring; differentiable to any
  order (its backward is itself the adjoint exchange, whose backward is the exchange).

Order of a forward exchange: east/west on the owned rows first, then north/south on rows that
span the whole width, so corner ghosts come from the diagonal neighbour without a message of their
own.  The adjoint runs the phases in reverse and adds ghost values into their owners' edge strips,
in the same order every time, so results are bit-for-bit reproducible.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from .comm import Comm
from .decomposition import Decomposition
from .strips import Boxes

# Tags name the direction a message travels; forward and adjoint halo traffic never share a tag.
_EASTWARD, _WESTWARD, _NORTHWARD, _SOUTHWARD = range(4)
_TAG_HALO_FWD = 100
_TAG_HALO_ADJ = 200

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


class HaloPlan:
    """A halo exchange of fields of one shape and dtype, planned once: the strips of each message
    are :class:`~odecli.parallel.strips.Boxes` with their packed buffer, so a call is one pack and
    one unpack per neighbour (C copies for contiguous CPU fields; torch indexing staged through
    the host buffer otherwise, e.g. on a GPU) and one exchange per phase.  On small blocks,
    building views and buffers per call was most of an exchange's cost.

    ``depths[i]`` ghost cells of field ``i`` next to its owned block, inside the ghost ring
    ``ring``, are exchanged on every side with a neighbour; all fields travel in one message
    per neighbour and phase.  Forward, ghosts are overwritten with the neighbours' edge
    strips; ghosts with no neighbour keep their values.  The adjoint (``adjoint=True``) runs
    the phases in reverse, adds ghost gradients into their owners' edge strips and zeroes the
    ghosts (an overwritten ghost has no gradient of its own).
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


#: The name the PDE engines know the plan by.
GhostExchange = HaloPlan


@functools.lru_cache(maxsize=32)
def ring_plan(shape: tuple[int, ...], dtype: torch.dtype, d: Decomposition, comm: Comm, w: int,
              adjoint: bool) -> HaloPlan:
    """The plan for one field of ``shape`` whose owned block sits in a ring of ``w`` ghosts on
    every side, all ``w`` deep exchanged; cached, as the same layouts come back every step."""
    return HaloPlan(shape, dtype, d, comm, (w,) * 4, (w,), adjoint)


# ------------------------------------------------------------------------------ in place


def fill_ring_(up: Tensor, d: Decomposition, comm: Comm, w: int) -> None:
    """Overwrite the ghost ring of ``up`` (width ``w``) with the neighbours' edge strips (no autograd)."""
    ring_plan(tuple(up.shape), up.dtype, d, comm, w, False)([up])


def fill_ring_adjoint_(g: Tensor, d: Decomposition, comm: Comm, w: int) -> None:
    """Adjoint of :func:`fill_ring_` in place: ghost gradients are added into their owners'
    edge strips and then zeroed (an overwritten ghost has no gradient of its own)."""
    ring_plan(tuple(g.shape), g.dtype, d, comm, w, True)([g])


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
    check_float(up, "halo_fill")
    check_layout(decomp, comm, "halo_fill")
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


# ------------------------------------------------------------------------------ out of place


def _padded_exchange(u: Tensor, d: Decomposition, comm: Comm, w: int, fill: float) -> Tensor:
    """``u`` padded by ``w`` ghosts holding ``fill``, then the ring filled from the neighbours."""
    out = F.pad(u.detach(), (w, w, w, w), value=fill)
    fill_ring_(out, d, comm, w)
    return out


def _padded_adjoint(g: Tensor, d: Decomposition, comm: Comm, w: int) -> Tensor:
    """The adjoint of :func:`_padded_exchange`: ring gradients added to their owners, ring cut off."""
    acc = g.detach().clone(memory_format=torch.contiguous_format)
    fill_ring_adjoint_(acc, d, comm, w)
    return acc[..., w : acc.shape[-2] - w, w : acc.shape[-1] - w].contiguous()


class _HaloExchange(Function):
    @staticmethod
    def forward(ctx, u: Tensor, d: Decomposition, comm: Comm, w: int, fill: float) -> Tensor:
        ctx.args = (d, comm, w)
        return _padded_exchange(u, d, comm, w, fill)

    @staticmethod
    def backward(ctx, g: Tensor):
        return _HaloAdjoint.apply(g, *ctx.args), None, None, None, None


class _HaloAdjoint(Function):
    @staticmethod
    def forward(ctx, g: Tensor, d: Decomposition, comm: Comm, w: int) -> Tensor:
        ctx.args = (d, comm, w)
        return _padded_adjoint(g, d, comm, w)

    @staticmethod
    def backward(ctx, gg: Tensor):
        return _HaloExchange.apply(gg, *ctx.args, 0.0), None, None, None


def halo_exchange(u: Tensor, decomp: Decomposition, comm: Comm, width: int, fill: float = 0.0) -> Tensor:
    """Pad the local block ``(..., ny, nx)`` by ``width`` ghost cells taken from the neighbours.

    Corner ghosts hold the diagonal neighbour's values; ghosts outside the global grid hold
    ``fill``. The backward adds each ghost cell's gradient into the cell that owns it.
    """
    check_float(u, "halo_exchange")
    check_layout(decomp, comm, "halo_exchange")
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


# ------------------------------------------------------------------------------ checks


def check_float(x: Tensor, op: str) -> None:
    """Messages are staged as float32/float64 numpy buffers; refuse anything else up front."""
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{op}: expected a float32 or float64 tensor, got {x.dtype}")


def check_layout(decomp: Decomposition, comm: Comm, op: str) -> None:
    """A decomposition made for another rank or rank count would exchange with the wrong peers."""
    if decomp.nranks != comm.size or decomp.rank != comm.rank:
        raise ValueError(
            f"{op}: decomposition is for rank {decomp.rank} of {decomp.nranks}, "
            f"but the communicator is rank {comm.rank} of {comm.size}"
        )
