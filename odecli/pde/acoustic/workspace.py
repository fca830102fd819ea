"""Buffers the fused acoustic loop keeps between evaluations (:class:`Workspace`), and the huge
pages its largest one, the gradient's store, is asked for (:func:`advise_huge_pages`)."""

from __future__ import annotations

import ctypes
import functools
import sys

from torch import Tensor

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
    0.31-0.35, the adjoint 0.35-0.40 against 0.39-0.43.  A no-op for buffers under 32 MB, off Linux, or if the
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
    faults of 2 us at 1000^2 with 8 segments.
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
