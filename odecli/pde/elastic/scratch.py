"""Scratch memory of the elastic C loop's backward: tensors reused between the segments of one
backward (:func:`_reused`), ringed copies in them (:func:`_padded`), zeroed huge-page memory
for the stores a first pass keeps (:func:`zeroed_pages`), and a segment's starting CPML memory
variables kept in the layers only (:class:`PackedPsi`).  Split from :mod:`odecli.pde.elastic.fused`
for length."""

from __future__ import annotations

import mmap

import numpy
import torch
from torch import Tensor

from odecli.pde.elastic.reference import RING, Profiles


def zeroed_pages(shape: tuple, like: Tensor) -> Tensor:
    """A zeroed CPU tensor of ``shape`` in anonymous memory advised to huge pages (on Linux
    with transparent huge pages in ``madvise`` mode: 2 MB pages, faulted 512x less often).

    Why: a gradient at 1040^2 float64 keeping all 100 steps' compact stores (1.9 GB) took
    0.65 s more in its first pass than keeping none (``torch.zeros``: zeroing, then ~475k
    page faults of 4 kB as the kernels first wrote the stores), about what skipping the
    recomputation saved; the kernel's zeroed huge pages need neither pass."""
    count = int(torch.Size(shape).numel())
    nbytes = max(1, count * like.element_size())
    if like.device.type != "cpu" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return like.new_zeros(shape)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_HUGEPAGE)
    # numpy's array keeps the mapping alive, the tensor keeps the array
    array = numpy.frombuffer(buf, dtype=_NUMPY[like.dtype], count=count)
    return torch.from_numpy(array).view(shape)


_NUMPY = {torch.float64: numpy.float64, torch.float32: numpy.float32}


def _reused(prop, name: str, shape: tuple, like: Tensor) -> Tensor:
    """A scratch tensor kept on the propagator between the segments of one backward.

    Fresh allocations of this size come from mmap and are faulted in page by page: in a
    600^2, 60-step float64 gradient 440k minor faults took 0.57 s of 1.27 s CPU time, also
    slowing the kernels that first wrote the stores.  :meth:`FusedLoop.adjoint` drops them
    after the first segment's backward."""
    return _reused_zeroed(prop, name, shape, like, zero=False)


def _reused_zeroed(prop, name: str, shape: tuple, like: Tensor, zero: bool = True) -> Tensor:
    """:func:`_reused`, zeroed when it is made (for scratch whose users keep some part 0)."""
    cache = prop.__dict__.setdefault("_scratch", {})
    t = cache.get(name)
    if t is None or t.shape != shape or t.dtype != like.dtype or t.device != like.device:
        cache[name] = t = like.new_zeros(shape) if zero else like.new_empty(shape)
    return t


def _padded(prop, name: str, f: Tensor) -> Tensor:
    """``f`` with a zero ring of width :data:`RING`, in a reused scratch tensor (nothing to do
    where ``f`` is that tensor's inside, as the adjoint returns it, with the ring cleared)."""
    b, c, ny, nx = f.shape
    out = _reused(prop, name, (b, c, ny + 2 * RING, nx + 2 * RING), f)
    if f.data_ptr() == out[..., RING:, RING:].data_ptr() and f.stride() == out.stride():
        return out
    out[..., :RING, :] = 0
    out[..., -RING:, :] = 0
    out[..., :, :RING] = 0
    out[..., :, -RING:] = 0
    out[..., RING:-RING, RING:-RING] = f
    return out


class PackedPsi:
    """A segment's starting CPML memory variables, kept only where they can be non-zero: the
    rows of the y layers and the columns of the x layers (elsewhere every ``a`` is 0 and
    ``psi`` stays 0 in the kernels).  In a 1040^2 block with 20-cell layers that is 8 % of
    the eight planes a checkpoint held; and the forward's segments update ``psi`` in place
    instead of copying 8 planes each."""

    def __init__(self, psi: Tensor, p: Profiles) -> None:
        rows = ((p.ay_int != 0) | (p.ay_half != 0)).reshape(-1).nonzero().flatten()
        cols = ((p.ax_int != 0) | (p.ax_half != 0)).reshape(-1).nonzero().flatten()
        self.rows, self.cols, self.shape = rows, cols, tuple(psi.shape)
        self.row_part = psi.index_select(2, rows)
        self.col_part = psi.index_select(3, cols)

    def into(self, out: Tensor) -> Tensor:
        """The full memory variables, written into ``out``, which must be 0 outside the layers'
        rows and columns (as the kernels leave memory variables that started there at 0)."""
        out.index_copy_(2, self.rows, self.row_part)
        out.index_copy_(3, self.cols, self.col_part)
        return out
