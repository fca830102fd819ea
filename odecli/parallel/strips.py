"""Boxes of fields copied to and from packed message buffers, in C where a compiler works.

A halo exchange moves a few thin strips per neighbour.  In numpy each strip costs a few
microseconds per operation (pack, unpack, add, zero), which at 256^2 points per rank was most
of an exchange; ``strips.c`` does a whole message in one call.  The numpy code below is the
reference it is tested against, and what runs without a compiler, on non-contiguous fields and on
fields on another device (a GPU: only the strips are staged through the host buffer).
"""

from __future__ import annotations

import ctypes
import functools
from math import prod
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from odecli import native

_NUMPY = {torch.float64: np.float64, torch.float32: np.float32}
_SUFFIX = {np.dtype(np.float64): "f64", np.dtype(np.float32): "f32"}
_MODES = {"copy": 0, "add": 1, "subtract": 2}


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL | None:
    if not native.enabled():
        return None
    lib, _ = native.load_source("strips", (Path(__file__).with_name("strips.c")).read_bytes())
    return lib


class Boxes:
    """Boxes ``(field number, (..., rows, cols))`` of fields of one shape and dtype, each box
    spanning all leading (batch) dimensions, and the copies between them and :attr:`buffer`
    (ordered batch by batch, box by box, row by row; an MPI message).  Boxes of one field must
    not overlap.  Per call the fields are checked and passed by address; the rest is fixed here
    (on a 2-core VM a Python attribute lookup is ~0.3 us, so the per-call work is kept small)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype,
                 boxes: list[tuple[int, tuple]]) -> None:
        if dtype not in _NUMPY:
            raise TypeError(f"Boxes: expected float32 or float64, got {dtype}")
        self.shape, self.dtype = torch.Size(shape), np.dtype(_NUMPY[dtype])
        self._torch_dtype = dtype
        ny, nx = shape[-2:]
        self.batch, self.plane = prod(shape[:-2]), ny * nx
        table, self.index = [], []
        for field, index in boxes:
            (r0, r1, rstep), (c0, c1, cstep) = index[-2].indices(ny), index[-1].indices(nx)
            if rstep != 1 or cstep != 1 or r1 <= r0 or c1 <= c0:
                raise ValueError(f"Boxes: {index} is not a non-empty box of a {tuple(shape)} field")
            table.append((field, r0 * nx + c0, r1 - r0, c1 - c0, nx))
            self.index.append((field, (..., slice(r0, r1), slice(c0, c1))))
        self.table = np.array(table, dtype=np.int64).reshape(-1, 5)
        self.buffer = np.empty(self.batch * int(sum(r * c for _, _, r, c, _ in table)), self.dtype)
        lib, suffix = _library(), _SUFFIX[self.dtype]
        self._c = None if lib is None else tuple(
            getattr(lib, f"boxes_{op}_{suffix}") for op in ("pack", "unpack", "move"))
        self._needs = 1 + max((f for f, _ in boxes), default=-1)  # fields a call must pass
        self._pointers = (ctypes.c_void_p * 0)()
        self._args = (ctypes.c_long(len(table)), ctypes.c_void_p(self.table.ctypes.data),
                      ctypes.c_long(self.batch), ctypes.c_long(self.plane))
        self._buffer = ctypes.c_void_p(self.buffer.ctypes.data)

    def pack(self, fields: list[Tensor], clear: bool = False) -> np.ndarray:
        """:attr:`buffer` <- the boxes, returned; then the boxes are zeroed when ``clear``."""
        if self._native(fields):
            self._c[0](*self._args, self._bind(fields), self._buffer, ctypes.c_int(clear))
            return self.buffer
        if not _on_host(fields):
            parts = [fields[field][index].detach().reshape(self.batch, -1) for field, index in self.index]
            self.buffer.reshape(self.batch, -1)[:] = torch.cat(parts, dim=1).cpu().numpy()
            if clear:
                for field, index in self.index:
                    fields[field].detach()[index] = 0
            return self.buffer
        arrays = _arrays(fields)
        parts = [arrays[field][index].reshape(self.batch, -1) for field, index in self.index]
        self.buffer.reshape(self.batch, -1)[:] = np.concatenate(parts, axis=1)
        if clear:
            for field, index in self.index:
                arrays[field][index] = 0
        return self.buffer

    def unpack(self, fields: list[Tensor], mode: str = "copy") -> None:
        """The boxes <- :attr:`buffer` (``mode`` "copy"), += it ("add") or -= it ("subtract")."""
        if mode not in _MODES:
            raise ValueError(f"Boxes.unpack: mode must be one of {list(_MODES)}, got {mode!r}")
        if self._native(fields):
            self._c[1](*self._args, self._bind(fields), self._buffer, ctypes.c_int(_MODES[mode]))
            return
        on_host = _on_host(fields)
        arrays = _arrays(fields) if on_host else [f.detach() for f in fields]
        rows, at = self.buffer.reshape(self.batch, -1), 0
        for field, index in self.index:
            view = arrays[field][index]
            n = prod(view.shape) // self.batch
            part = rows[:, at : at + n].reshape(view.shape)
            if not on_host:
                part = torch.from_numpy(part).to(view.device)
            at += n
            if mode == "copy":
                view[...] = part
            elif mode == "add":
                view += part
            else:
                view -= part

    def move(self, dst: Tensor, src: Tensor, weight: np.ndarray | None = None,
             subtract: bool = False) -> None:
        """In the boxes: ``dst = src * weight`` (or ``dst -= src`` when ``subtract``), then
        ``src = 0``.  ``weight`` is one plane, shared by the batch (None: 1)."""
        if weight is not None and (weight.shape != self.shape[-2:] or weight.dtype != self.dtype
                                   or not weight.flags.c_contiguous):
            raise ValueError(f"Boxes.move: weight must be a contiguous {self.dtype} "
                             f"{tuple(self.shape[-2:])} plane")
        if self._native((dst, src)):
            self._c[2](*self._args, ctypes.c_void_p(dst.data_ptr()), ctypes.c_void_p(src.data_ptr()),
                       ctypes.c_void_p(None if weight is None else weight.ctypes.data),
                       ctypes.c_int(2 if subtract else 0))
            return
        d, s = _arrays((dst, src))
        for _, index in self.index:
            if subtract:
                d[index] -= s[index]
            elif weight is None:
                d[index] = s[index]
            else:
                np.multiply(s[index], weight[index[1:]], out=d[index])
            s[index] = 0

    def _native(self, fields) -> bool:
        """Check the fields; whether the C copies can take them (contiguous, on the CPU)."""
        if len(fields) < self._needs:
            raise ValueError(f"Boxes: the boxes are in {self._needs} fields, got {len(fields)}")
        fast = self._c is not None
        for f in fields:
            if f.shape != self.shape or f.dtype != self._torch_dtype:
                raise ValueError(f"Boxes: planned for {self.dtype} fields of shape "
                                 f"{tuple(self.shape)}, got {f.dtype} {tuple(f.shape)}")
            fast = fast and f.is_cpu and f.is_contiguous()
        return fast

    def _bind(self, fields: list[Tensor]) -> ctypes.Array:
        if len(self._pointers) != len(fields):
            self._pointers = (ctypes.c_void_p * len(fields))()
        for i, f in enumerate(fields):
            self._pointers[i] = f.data_ptr()
        return self._pointers


def _on_host(fields) -> bool:
    """Whether numpy can view the fields; otherwise (a GPU) the boxes are copied with torch."""
    return all(f.is_cpu for f in fields)


def _arrays(fields) -> list[np.ndarray]:
    return [f.detach().numpy() for f in fields]
