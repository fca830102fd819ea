"""The fused C kernels of the acoustic step (``acoustic.c`` beside this file), bound to one problem.

The step is :func:`~odecli.pde.acoustic.reference.reference_step`'s, on fields kept with their
ghost ring ``(B, ny + 4, nx + 4)``.  :func:`step_forward` calls the fused C kernel: one pass over
the grid, instead of about twenty full-size temporaries, and no padding copy; it reproduces the
reference bit for bit.  :class:`Kernels` binds the kernels to one problem's fixed arrays; it is
what the CPU time loop (:mod:`odecli.pde.acoustic.fused`) calls.  Its passes
(:meth:`Kernels.forward_run`) make several steps in one sweep over the grid, each step a few
rows behind the one before, so a step reads its inputs from cache; several threads share a
pass's steps out.  Results are bit for bit those of single steps.

For the gradient the forward also stores each step's ``lap4(u)`` (``(B, ny, nx)``, no ring;
:func:`new_lap_store` pads its rows to whole cache lines).  The adjoint is then the same pass
(:meth:`Kernels.adjoint_pass`): ``mu = c2dt2 G lambda``, ``lambda`` the adjoint of ``u``, obeys
the forward step backward in time with the receivers' residuals as sources, and the gradient
of ``c2dt2`` is ``sum mu lap4(u) / c2dt2`` (acoustic.c has the derivation).  It matches
autograd of the reference to round-off (tests).
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from odecli.pde import native
from odecli.pde.acoustic.reference import RING
from odecli.threads import available_cpus, run_on_pool, split_rows

_SUFFIX = {torch.float64: "f64", torch.float32: "f32"}
_LINE_BYTES = 64  # a cache line


def lap_row_stride(nx: int, dtype: torch.dtype) -> int:
    """Elements from one row of the gradient's store to the next: ``nx`` rounded up to whole
    64-byte lines.  The forward streams the store out a line at a time, and a line written in
    part is first read from memory: with rows that end mid-line (270 float64 columns, a 2-rank
    block with its halo extension) the forward that stores took 20 % longer than with 272."""
    per_line = _LINE_BYTES // torch.empty((), dtype=dtype).element_size()
    return -(-nx // per_line) * per_line


def new_lap_store(c2dt2: Tensor, steps: int, shots: int, base: Tensor | None = None,
                  block: tuple[int, int] | None = None) -> Tensor:
    """A ``(steps, shots, ny, nx)`` store for the forward's ``lap4(u)`` on a block of ``block``
    cells (None: ``c2dt2``'s, the whole one; see ``Kernels``' ``gradient_block``), rows
    :func:`lap_row_stride` apart: a view of ``base`` (``(steps, shots, ny, stride)``, new if
    None), which owns the memory."""
    ny, nx = block or c2dt2.shape
    shape = (steps, shots, ny, lap_row_stride(nx, c2dt2.dtype))
    if base is None:
        base = c2dt2.new_empty(shape)
    elif tuple(base.shape) != shape or base.dtype != c2dt2.dtype or not base.is_contiguous():
        raise ValueError(f"new_lap_store: expected a contiguous {c2dt2.dtype} base of shape {shape}, "
                         f"got {base.dtype} {tuple(base.shape)}")
    return base[..., :nx]


def native_available(t: Tensor) -> tuple[bool, str]:
    """Whether the fused kernels can run on tensors like ``t`` (and if not, why)."""
    return native.available("acoustic", t)


def kernels_flush_subnormals() -> bool:
    """Whether the C kernels flush subnormal numbers to zero, as the compiled library reports:
    acoustic.c sets FTZ/DAZ for each call on x86, where each operation on a subnormal costs a
    microcode assist; other CPUs keep them."""
    return bool(_kernel_named("acoustic_flushes_subnormals")())


def _ptr(t: Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() if t is not None else None)


def _kernel(kind: str, dtype: torch.dtype):
    return _kernel_named(f"leapfrog_{kind}_{_SUFFIX[dtype]}")


def _kernel_named(name: str):
    lib, why = native.load("acoustic")
    if lib is None:
        raise RuntimeError(f"fused acoustic kernel unavailable: {why}")
    return getattr(lib, name)


def _dims(u: Tensor) -> tuple[ctypes.c_long, ctypes.c_long, ctypes.c_long]:
    """(B, ny, nx) of a ringed field, as the kernels take them."""
    return (ctypes.c_long(u.shape[0]), ctypes.c_long(u.shape[1] - 2 * RING),
            ctypes.c_long(u.shape[2] - 2 * RING))


def sponge_spans(sponge: Tensor | None) -> Tensor | None:
    """Per block row, the column range ``[lo, hi)`` where the sponge is exactly 1, as ``(ny, 2)``
    int64: the kernels neither read nor apply it there (a row without one gets ``[0, 0)``)."""
    if sponge is None:
        return None
    ones = sponge == 1
    nx = ones.shape[1]
    lo = ones.int().argmax(dim=1)
    hi = nx - ones.flip(1).int().argmax(dim=1)
    usable = ones.any(dim=1) & (ones.sum(dim=1) == hi - lo)  # one unbroken run of ones
    spans = torch.stack([lo, hi], dim=1).where(usable[:, None], 0)
    return spans.to(device="cpu", dtype=torch.int64).contiguous()


class Kernels:
    """The fused kernels bound to one problem: ``c2dt2``, the sponge and its spans, the grid
    spacing and the field layout are checked and converted once, so a step costs the kernel
    and one ctypes call (at 256^2, checking and building the arguments of every call cost about
    as much as the stencil pass).  Fields passed per step must be contiguous, of ``like``'s
    shape and dtype (checked cheaply)."""

    def __init__(self, like: Tensor, c2dt2: Tensor, sponge: Tensor | None, dy: float, dx: float,
                 spans: Tensor | None = None, threads: int = 1,
                 gradient_block: tuple[int, int, int, int] | None = None) -> None:
        """``gradient_block``: the block rows ``[r0, r1)`` and columns ``[c0, c1)`` where
        :meth:`adjoint_pass` sums the gradient (None: all); the store of ``lap4(u)`` then holds
        that block only (:func:`new_lap_store` with ``block``), which is all the adjoint reads."""
        check_layout(like, c2dt2, sponge)
        self.shape, self.dtype = tuple(like.shape), like.dtype
        self.spans = _spans(sponge, spans)
        self._keep = (c2dt2, sponge)  # the kernels read them through raw pointers
        self._grad_shape = self.block_shape = tuple(c2dt2.shape)
        ny, nx = c2dt2.shape
        self._dims = _dims(like)
        r0, r1, c0, c1 = gradient_block or (0, ny, 0, nx)
        if not (0 <= r0 < r1 <= ny and 0 <= c0 < c1 <= nx):
            raise ValueError(f"leapfrog: gradient_block {gradient_block} is not a block of {ny}x{nx}")
        self._store_shape = (r1 - r0, c1 - c0)
        self._gradient_block = None if gradient_block is None else (ctypes.c_int64 * 4)(r0, r1, c0, c1)
        self._c2, self._sponge, self._span = _ptr(c2dt2), _ptr(sponge), _ptr(self.spans)
        self._iy2, self._ix2 = ctypes.c_double(1.0 / (dy * dy)), ctypes.c_double(1.0 / (dx * dx))
        self.threads = threads
        self._fwd_rows = [(ctypes.c_long(a), ctypes.c_long(b)) for a, b in split_rows(ny, threads)]
        self._forward = _kernel("forward", self.dtype)
        self._forward_run = _kernel("forward_run", self.dtype)
        self._points = _kernel_named(f"scatter_gather_{_SUFFIX[self.dtype]}")

    def _check(self, *fields: Tensor) -> None:
        for f in fields:
            if tuple(f.shape) != self.shape or f.dtype != self.dtype or not f.is_contiguous() \
                    or f.device.type != "cpu":
                raise ValueError(f"leapfrog: expected contiguous CPU {self.dtype} fields of shape "
                                 f"{self.shape}, got {f.dtype} {tuple(f.shape)} on {f.device}")

    def _check_laps(self, laps: Tensor, steps: int | None = None) -> ctypes.c_long:
        """One ``lap4(u)`` ``(B, ny, nx)`` (the store's block), or with ``steps`` a stack
        ``(steps, B, ny, nx)``,
        contiguous but for rows that may lie further apart (:func:`new_lap_store`); returns that
        row stride, in elements, for the kernels."""
        one = (self.shape[0], *self._store_shape)
        want = one if steps is None else (steps, *one)
        rows = laps.stride(-2) if laps.dim() == len(want) else 0
        expected, step = [1], rows  # strides from the last dimension out
        for size in reversed(want[:-1]):
            expected.append(step)
            step *= size
        packed = all(size == 1 or stride == e for size, stride, e
                     in zip(reversed(laps.shape), reversed(laps.stride()), expected))
        if tuple(laps.shape) != want or laps.dtype != self.dtype or not packed \
                or rows < self._store_shape[1] or laps.device.type != "cpu":
            raise ValueError(f"leapfrog: expected CPU {self.dtype} lap4(u) of shape {want} (rows "
                             f"contiguous, equally spaced, planes packed), got {laps.dtype} "
                             f"{tuple(laps.shape)} with strides {laps.stride()} on {laps.device}")
        return ctypes.c_long(rows)

    def _lap_addresses(self, laps: Tensor, steps: range) -> ctypes.Array:
        """Pointers to ``laps[j]`` for j in ``steps``: arithmetic on one checked stack, no views
        (a view per step cost more than the pass's own Python)."""
        size = laps.stride(0) * laps.element_size()
        base = laps.data_ptr()
        return (ctypes.c_void_p * len(steps))(*(base + j * size for j in steps))

    def forward(self, u: Tensor, u_prev: Tensor, out: Tensor, lap: Tensor | None = None,
                grad_sum: Tensor | None = None) -> Tensor:
        """:func:`step_forward` into ``out`` (which may be ``u_prev``), and ``lap4(u)`` into
        ``lap`` when given; with ``grad_sum`` too, an adjoint step instead, that reads ``lap``
        (see :meth:`adjoint_pass`).  The rows are split over the threads."""
        self._check(u, u_prev, out)
        rows = ctypes.c_long(0) if lap is None else self._check_laps(lap)
        fixed = (_ptr(u), _ptr(u_prev), self._c2, self._sponge, self._span, self._iy2, self._ix2,
                 _ptr(out), _ptr(lap), rows, _ptr(grad_sum), self._gradient_block)
        if len(self._fwd_rows) == 1:
            self._forward(*self._dims, *self._fwd_rows[0], *fixed)
        else:
            run_on_pool([functools.partial(self._forward, *self._dims, a, b, *fixed)
                         for a, b in self._fwd_rows])
        return out

    def forward_run(self, fields: list[Tensor], sources: RowPoints | None, source_values: int,
                    receivers: RowPoints | None, traces: int, laps: Tensor | None = None,
                    windows: ctypes.Array | None = None) -> None:
        """Steps with ``fields = [u_prev, u, out_1, ..., out_n]`` in one pass: ``out_j`` may be
        the field two before it (two buffers recycled).  After step j the sources get
        ``source_values + j * sources.stride`` (an address: rows of ``stride`` numbers, in
        source order) and the receivers are read into ``traces + j * receivers.stride``; with
        ``laps`` (``(n, B, ny, nx)``), step j writes ``lap4`` of its ``u`` into ``laps[j]``.
        With ``windows`` (``4 n`` int64: block rows ``[r0, r1)`` and columns ``[c0, c1)`` per
        step, :meth:`~odecli.pde.acoustic.loop.Loop.windows`), step j makes only its window;
        the other cells keep what they held.  ``laps`` holds the block ``gradient_block``.  Bit
        for bit the same as :meth:`forward` then :meth:`points` per step, in the windows.
        Several threads share the steps out (:meth:`_pipelined`)."""
        n = len(fields) - 2
        self._check(*set(fields))  # the outputs recycle two buffers: check each once
        if n < 1:
            raise ValueError("leapfrog: forward_run needs u_prev, u and at least one output")
        rows = ctypes.c_long(0) if laps is None else self._check_laps(laps, n)
        none = (None, None, None, None, ctypes.c_long(0))
        fixed = ((ctypes.c_void_p * len(fields))(*(f.data_ptr() for f in fields)),
                 self._c2, self._sponge, self._span, self._iy2, self._ix2,
                 *(none if sources is None else sources.args(source_values)),
                 *(none if receivers is None else receivers.args(traces)),
                 None if laps is None else self._lap_addresses(laps, range(n)), rows, None,
                 windows, self._gradient_block)
        self._pipelined(self._forward_run, n, fixed)

    def adjoint_pass(self, fields: list[Tensor], laps: Tensor, grad_sum: Tensor,
                     residuals: RowPoints | None, values: int,
                     windows: ctypes.Array | None = None) -> None:
        """Adjoint steps in the forward's form, ``fields = [mu_after, mu, out_1, ..., out_n]``
        as in :meth:`forward_run` (``mu = c2dt2 G lambda``, ``lambda`` the adjoint of the
        field): step j reads ``laps[n - 1 - j]`` (``laps`` ``(n, B, ny, nx)`` in time order, as
        the forward stored them) and adds ``mu * lap4`` of its ``mu`` into ``grad_sum``; after
        it the residuals get ``values + j * residuals.stride`` (an address: rows of ``stride``
        numbers, ``c2dt2 G r`` for residuals ``r``), as sources do in :meth:`forward_run`.
        The gradient of ``c2dt2`` is then ``grad_sum / c2dt2``, on ``gradient_block`` (the
        other cells get the step alone).  ``windows`` as in :meth:`forward_run`.  A single step
        is split by rows over the threads instead, as :meth:`forward` splits one (on the whole
        block), with the same results."""
        n = len(fields) - 2
        self._check(*set(fields))
        if n < 1 or laps.shape[0] != n:
            raise ValueError(f"leapfrog: adjoint_pass with {laps.shape[0]} laps needs mu_after, mu and "
                             f"{laps.shape[0]} outputs, got {n}")
        if tuple(grad_sum.shape) != self._grad_shape or grad_sum.dtype != self.dtype \
                or not grad_sum.is_contiguous():
            raise ValueError("leapfrog: grad_sum must be a contiguous array like c2dt2")
        rows = self._check_laps(laps, n)
        if n == 1 and len(self._fwd_rows) > 1:
            self.forward(fields[1], fields[0], fields[2], laps[0], grad_sum)
            if residuals is not None:
                self.points(fields[2], residuals.flat, ctypes.c_void_p(values))
            return
        none = (None, None, None, None, ctypes.c_long(0))
        fixed = ((ctypes.c_void_p * len(fields))(*(f.data_ptr() for f in fields)),
                 self._c2, self._sponge, self._span, self._iy2, self._ix2,
                 *(none if residuals is None else residuals.args(values)), *none,
                 self._lap_addresses(laps, range(n - 1, -1, -1)), rows, _ptr(grad_sum),
                 windows, self._gradient_block)
        self._pipelined(self._forward_run, n, fixed)

    def _pipelined(self, kernel, n: int, fixed: tuple) -> None:
        """Run a pass kernel over its n steps: one call, or consecutive shares of the steps on
        threads, each starting a row iteration once the thread before it has finished it (a
        waiting thread spins, so no more threads than the CPUs this process may use)."""
        parts = split_rows(n, min(self.threads, available_cpus()))
        if len(parts) == 1:
            kernel(*self._dims, ctypes.c_long(n), ctypes.c_long(0), ctypes.c_long(n), None, None, *fixed)
            return
        done = torch.full((len(parts),), -(1 << 40), dtype=torch.int64)  # last row iteration per part
        marks = [ctypes.c_void_p(done.data_ptr() + done.element_size() * t) for t in range(len(parts))]
        run_on_pool([functools.partial(kernel, *self._dims, ctypes.c_long(n), ctypes.c_long(j0),
                                       ctypes.c_long(j1), marks[t], marks[t - 1] if t else None, *fixed)
                     for t, (j0, j1) in enumerate(parts)])

    def points(self, field: Tensor, add: Tensor, values: ctypes.c_void_p, get: Tensor | None = None,
               out: ctypes.c_void_p | None = None) -> None:
        """``field.view(-1)[add] += values`` in order, then ``out = field.view(-1)[get]``: the
        step's sources and receivers (int64 flat indices; ``values``/``out`` the addresses of
        ``add.numel()`` / ``get.numel()`` contiguous numbers of the fields' dtype)."""
        self._check(field)
        self._points(_ptr(field), _ptr(add), values, ctypes.c_long(add.numel()),
                     _ptr(get), ctypes.c_long(0 if get is None else get.numel()), out)


class RowPoints:
    """Points of ringed fields (flat indices into ``(B, ny + 4, nx + 4)``) sorted by ringed row,
    for the passes that add or read them row by row: ``stride`` numbers per step, point ``k``
    being number ``k`` of a step's row of values."""

    def __init__(self, flat: Tensor, shape: tuple[int, int, int]) -> None:
        rows = (flat % (shape[1] * shape[2])) // shape[2]
        if flat.numel() and (int(rows.min()) < RING or int(rows.max()) >= shape[1] - RING):
            raise ValueError("leapfrog: points must lie in block rows, not in the ring")
        self.flat = flat.to(torch.int64).contiguous()  # in the order of the values
        order, self.row_ptr = _by_row(rows, shape[1])
        self.at = flat[order].to(torch.int64).contiguous()
        self.index = order.to(torch.int64).contiguous()
        self.stride = flat.numel()

    def args(self, values: int) -> tuple:
        return (_ptr(self.row_ptr), _ptr(self.at), _ptr(self.index), ctypes.c_void_p(values),
                ctypes.c_long(self.stride))


def step_forward(u: Tensor, u_prev: Tensor, c2dt2: Tensor, sponge: Tensor | None,
                 dy: float, dx: float, out: Tensor, spans: Tensor | None = None,
                 threads: int = 1, lap: Tensor | None = None) -> Tensor:
    """The fused step into ``out`` (which may be ``u_prev``): no autograd, plain tensors.

    ``spans``: :func:`sponge_spans` of ``sponge`` (computed here when not given).  ``threads``
    split the rows (the kernel releases the GIL; results do not depend on the split).  With
    ``lap`` (``(B, ny, nx)``), the step also writes there the ``lap4(u)`` it used, which is
    what :meth:`Kernels.adjoint_pass` reads.
    """
    check_layout(u, c2dt2, sponge, u_prev, out)
    return Kernels(u, c2dt2, sponge, dy, dx, spans, threads).forward(u, u_prev, out, lap)


def _by_row(row: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """A stable sort of points by ``row`` and the ``rows + 1`` CSR offsets of each row's run."""
    order = torch.argsort(row, stable=True)
    row_ptr = torch.zeros(rows + 1, dtype=torch.int64)
    row_ptr[1:] = torch.cumsum(torch.bincount(row, minlength=rows), 0)
    return order, row_ptr


# Steps per Kernels.forward_run and Kernels.adjoint_pass pass (one thread).  Measured for the
# forward on the 2-core EPYC VM: 8 beat 1, 2 and 4 from 256^2 (in cache) to 2000^2, because
# each step reads u and u_prev from cache instead of memory (float64 at 1000^2, 100 steps on one
# thread: 145-173 ms against 293-350 in single steps); the adjoint pass is the same loop.
STEPS_PER_PASS = 8


def _spans(sponge: Tensor | None, spans: Tensor | None) -> Tensor | None:
    if sponge is None:
        return None
    spans = sponge_spans(sponge) if spans is None else spans
    if spans.shape != (sponge.shape[0], 2) or spans.dtype != torch.int64 or not spans.is_contiguous():
        raise ValueError("leapfrog: spans must be sponge_spans(sponge)")
    return spans


def check_layout(u: Tensor, c2dt2: Tensor, sponge: Tensor | None, *fields: Tensor | None) -> None:
    """The kernels read raw memory: shapes, dtypes and layouts must be exactly as they assume."""
    block = tuple(c2dt2.shape)
    ok = (u.dim() == 3 and len(block) == 2
          and tuple(u.shape[1:]) == (block[0] + 2 * RING, block[1] + 2 * RING)
          and (sponge is None or tuple(sponge.shape) == block)
          and all(f is None or f.shape == u.shape for f in fields))
    if not ok:
        raise ValueError(f"leapfrog: expected fields (B, ny+4, nx+4) and c2dt2, sponge (ny, nx); "
                         f"got {tuple(u.shape)}, {[None if f is None else tuple(f.shape) for f in fields]}, "
                         f"{block}, {None if sponge is None else tuple(sponge.shape)}")
    for t in (u, c2dt2, sponge, *fields):
        if t is not None and (t.dtype != u.dtype or not t.is_contiguous() or t.device.type != "cpu"):
            raise ValueError("leapfrog: the kernels need contiguous CPU tensors of one dtype")
