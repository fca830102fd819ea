"""Scratch memory of the elastic C loop's backward: tensors reused between the segments of one
backward (:func:`_reused`), ringed copies in them (:func:`_padded`; or none, :func:`ringed_for_reading`),
zeroed huge-page memory for the stores a first pass keeps (:func:`zeroed_pages`), and a
segment's starting CPML memory variables kept in the layers only (:class:`PackedPsi`).  Split
from :mod:`odecli.pde.elastic.fused` for length."""

from __future__ import annotations

import mmap

import numpy
import torch
from torch import Tensor

from odecli.pde.elastic.reference import RING, Profiles

WRING = 4  # the ring of the adjoint's scratch w (elastic.c), read two past the fields' ring


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
    # numpy's array keeps the mapping alive, the tensor keeps the array; shaped by numpy, so
    # that the tensor is no view (a view's slices have it as ``_base``: ringed_base)
    array = numpy.frombuffer(buf, dtype=_NUMPY[like.dtype], count=count).reshape(shape)
    return torch.from_numpy(array)


_NUMPY = {torch.float64: numpy.float64, torch.float32: numpy.float32}


def _reused(prop, name: str, shape: tuple, like: Tensor) -> Tensor:
    """A scratch tensor kept on the propagator between the segments of one backward.

    Fresh allocations of this size come from mmap and are faulted in page by page: in a
    600^2, 60-step float64 gradient 440k minor faults took 0.57 s of 1.27 s CPU time, also
    slowing the kernels that first wrote the stores.  :meth:`FusedLoop.adjoint` drops them
    after the first segment's backward."""
    return _reused_fresh(prop, name, shape, like)[0]


def _reused_zeroed(prop, name: str, shape: tuple, like: Tensor) -> Tensor:
    """:func:`_reused` for scratch whose users keep some part 0: zeroed when it is made (every
    scratch tensor is, :func:`_reused_fresh`; this name says that the caller relies on it)."""
    return _reused_fresh(prop, name, shape, like)[0]


def _reused_fresh(prop, name: str, shape: tuple, like: Tensor) -> tuple[Tensor, bool]:
    """:func:`_reused` and whether it was made now, then zeroed (so that a caller who needs it
    all 0 need not zero it again).

    Made by :func:`zeroed_pages`: 0 without a pass of its own, in huge pages.  Measured (one
    thread, float64, process CPU time, best of 5): ``new_zeros`` of the compact velocity
    stores of 10 steps at 1040^2 (174 MB) took 61 ms, of 8 planes of memory variables 26 ms;
    the mapping nearly nothing, and written once afterwards 26 ms against 85 (store) and 10
    against 32 (memory variables) for ``new_zeros`` then writing."""
    cache = prop.__dict__.setdefault("_scratch", {})
    t = cache.get(name)
    if t is None or t.shape != shape or t.dtype != like.dtype or t.device != like.device:
        cache[name] = t = zeroed_pages(shape, like)
        return t, True
    return t, False


def ringed_base(f: Tensor) -> Tensor | None:
    """The contiguous ringed tensor ``(B, C, ny + 4, nx + 4)`` whose inside ``f`` is, or None."""
    base = f._base
    b, c, ny, nx = f.shape
    if (base is None or not base.is_contiguous()
            or tuple(base.shape) != (b, c, ny + 2 * RING, nx + 2 * RING)
            or f.stride() != base.stride() or f.data_ptr() != base[..., RING:, RING:].data_ptr()):
        return None
    return base


def zero_ring_(t: Tensor) -> Tensor:
    """The ring of width :data:`RING` of ``t`` ``(..., ny + 4, nx + 4)`` set to 0, in place.

    Contiguous: the rows' ring columns, each row's last two and the next row's first two
    adjacent in memory, zeroed through one strided view (with the ring's rows, three calls):
    30 us against 50-53 for the four slice assignments (3 planes at 1044^2, one thread), which
    the adjoint makes twice a step."""
    t[..., :RING, :].zero_()
    t[..., -RING:, :].zero_()
    if t.is_contiguous() and t.numel() > 0:
        w = t.shape[-1]
        rows = t.numel() // w
        t.as_strided((rows - 1, 2 * RING), (w, 1), t.storage_offset() + w - RING).zero_()
    else:
        t[..., :, :RING].zero_()
        t[..., :, -RING:].zero_()
    return t


def _ring_is_zero(t: Tensor) -> bool:
    return not any(bool(part.any()) for part in (t[..., :RING, :], t[..., -RING:, :],
                                                 t[..., :, :RING], t[..., :, -RING:]))


def ringed_for_reading(prop, name: str, f: Tensor) -> Tensor:
    """``f`` with a zero ring, for kernels that only read it: ``f``'s own ringed tensor where
    its ring is 0 (no copy: ``v0`` of the compact stores' adjoint, a segment's saved
    velocities, whose copy took 10 x 4.4 ms a gradient at 1040^2 float64), else
    :func:`_padded` into the scratch ``name``."""
    base = ringed_base(f)
    if base is not None and _ring_is_zero(base):
        return base
    return _padded(prop, name, f)


def _padded(prop, name: str, f: Tensor | None, like: Tensor | None = None,
            channels: int | None = None) -> Tensor:
    """``f`` with a zero ring of width :data:`RING`, in a reused scratch tensor (nothing to do
    where ``f`` is that tensor's inside, as the adjoint returns it, with the ring cleared).
    ``f`` None: zeros shaped like ``like`` (nothing to do where the scratch is made now), with
    ``channels`` channels where given."""
    src = like if f is None else f
    b, c, ny, nx = src.shape
    if f is None and channels is not None:
        c = channels
    out, fresh = _reused_fresh(prop, name, (b, c, ny + 2 * RING, nx + 2 * RING), src)
    if f is None:
        if not fresh:
            out.zero_()
        return out
    if f.data_ptr() == out[..., RING:, RING:].data_ptr() and f.stride() == out.stride():
        return out
    base = ringed_base(f)
    if base is not None and base.shape == out.shape:  # one contiguous copy: 8.5 ms, not 12.5
        return zero_ring_(out.copy_(base))
    if not fresh:
        zero_ring_(out)
    out[..., RING:-RING, RING:-RING] = f
    return out


def _runs(index: Tensor) -> list[tuple[int, int, int]]:
    """The runs of consecutive values of a sorted index: ``(start, stop, offset in index)``."""
    out: list[tuple[int, int, int]] = []
    for k, i in enumerate(index.tolist()):
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1, out[-1][2])
        else:
            out.append((i, i + 1, k))
    return out


class PackedPsi:
    """A segment's starting CPML memory variables, kept only where they can be non-zero: the
    rows of the y layers and the columns of the x layers (elsewhere every ``a`` is 0 and
    ``psi`` stays 0 in the kernels).  In a 1040^2 block with 20-cell layers that is 8 % of
    the eight planes a checkpoint held; and the forward's segments update ``psi`` in place
    instead of copying 8 planes each.

    Copied a run of rows or columns (a layer) at a time: ``index_select`` / ``index_copy_``
    of the 41 rows and columns took 1.0 + 3.0 / 0.2 + 0.6 ms a segment at 1040^2 float64
    (one thread), copies of the runs' slices 0.24 + 0.36 / 0.2 + 0.35."""

    def __init__(self, psi: Tensor, p: Profiles) -> None:
        rows = ((p.ay_int != 0) | (p.ay_half != 0)).reshape(-1).nonzero().flatten()
        cols = ((p.ax_int != 0) | (p.ax_half != 0)).reshape(-1).nonzero().flatten()
        self.rows, self.cols, self.shape = _runs(rows), _runs(cols), tuple(psi.shape)
        b, c, ny, nx = psi.shape
        self.row_part = psi.new_empty((b, c, rows.numel(), nx))
        self.col_part = psi.new_empty((b, c, ny, cols.numel()))
        for dim, runs, part in ((2, self.rows, self.row_part), (3, self.cols, self.col_part)):
            for start, stop, at in runs:
                part.narrow(dim, at, stop - start).copy_(psi.narrow(dim, start, stop - start))

    def into(self, out: Tensor) -> Tensor:
        """The full memory variables, written into ``out``, which must be 0 outside the layers'
        rows and columns (as the kernels leave memory variables that started there at 0)."""
        for dim, runs, part in ((2, self.rows, self.row_part), (3, self.cols, self.col_part)):
            for start, stop, at in runs:
                out.narrow(dim, start, stop - start).copy_(part.narrow(dim, at, stop - start))
        return out
