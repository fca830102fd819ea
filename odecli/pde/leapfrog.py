"""One leapfrog step of the acoustic equation: the PyTorch reference and the fused C kernels.

Fields are kept with their ghost ring: ``(B, ny + 4, nx + 4)``, the block at ``[2:-2, 2:-2]``.
One step maps ``(u_prev, u)`` to

    u_next = G * ((2u - G*u_prev) + c2dt2 * lap4(u))     (zeros on the ring),

``G`` the sponge (taken as 1 when ``None``).  Applying ``G`` to ``u_prev`` here, rather than
storing a damped copy of ``u`` each step, is what Cerjan damping of both time levels amounts to,
with one array less to write.

:func:`reference_step` is the readable PyTorch version (any device; autograd differentiates it).
:func:`step_forward` and :func:`step_adjoint` call the fused C kernels (:mod:`odecli.pde.native`):
one pass over the grid each, instead of about twenty full-size temporaries, and no padding
copy.  The forward kernel reproduces the reference bit for bit; the adjoint matches autograd of
the reference to round-off (tests).  :class:`Kernels` binds the kernels to one problem's fixed
arrays; it is what the CPU time loop (:mod:`odecli.pde.acoustic_native`) calls.  Its passes
(:meth:`Kernels.forward_run`, :func:`step_adjoint_run`) make several steps in one sweep over
the grid, each step a few rows behind the one before, so a step reads its inputs from cache;
several threads share a pass's steps out.  Results are bit for bit those of single steps.
For the gradient the forward also stores each step's ``lap4(u)`` (``(B, ny, nx)``, no ring),
so the adjoint step needs one stencil, of its own field, instead of two; :func:`new_lap_store`
pads the store's rows to whole cache lines.
"""

from __future__ import annotations

import ctypes
import functools
import os
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
from torch import Tensor

from odecli.pde import native
from odecli.pde.stencils import laplacian4

RING = 2
_SUFFIX = {torch.float64: "f64", torch.float32: "f32"}
_LINE_BYTES = 64  # a cache line


def lap_row_stride(nx: int, dtype: torch.dtype) -> int:
    """Elements from one row of the gradient's store to the next: ``nx`` rounded up to whole
    64-byte lines.  The forward streams the store out a line at a time, and a line written in
    part is first read from memory: with rows that end mid-line (270 float64 columns, a 2-rank
    block with its halo extension) the forward that stores took 20 % longer than with 272."""
    per_line = _LINE_BYTES // torch.empty((), dtype=dtype).element_size()
    return -(-nx // per_line) * per_line


def new_lap_store(c2dt2: Tensor, steps: int, shots: int, base: Tensor | None = None) -> Tensor:
    """A ``(steps, shots, ny, nx)`` store for the forward's ``lap4(u)``, rows
    :func:`lap_row_stride` apart: a view of ``base`` (``(steps, shots, ny, stride)``, new if
    None), which owns the memory."""
    ny, nx = c2dt2.shape
    shape = (steps, shots, ny, lap_row_stride(nx, c2dt2.dtype))
    if base is None:
        base = c2dt2.new_empty(shape)
    elif tuple(base.shape) != shape or base.dtype != c2dt2.dtype or not base.is_contiguous():
        raise ValueError(f"new_lap_store: expected a contiguous {c2dt2.dtype} base of shape {shape}, "
                         f"got {base.dtype} {tuple(base.shape)}")
    return base[..., :nx]


def interior(u: Tensor) -> Tensor:
    """The block of a ringed field (a view)."""
    return u[..., RING:-RING, RING:-RING]


def reference_step(u: Tensor, u_prev: Tensor, c2dt2: Tensor, sponge: Tensor | None,
                   dy: float, dx: float) -> Tensor:
    """The step in plain PyTorch (any device); autograd differentiates it."""
    c, p = interior(u), interior(u_prev)
    if sponge is not None:
        p = p * sponge
    lap = laplacian4(u, dy, dx)
    u_next = (c + c).sub_(p).add_(lap.mul_(c2dt2))
    if sponge is not None:
        u_next = u_next * sponge
    return F.pad(u_next, (RING,) * 4)


def native_available(t: Tensor) -> tuple[bool, str]:
    """Whether the fused kernel can run on tensors like ``t`` (and if not, why)."""
    if t.device.type != "cpu":
        return False, f"the fused kernel is CPU-only (tensors on {t.device})"
    if t.dtype not in _SUFFIX:
        return False, f"no fused kernel for {t.dtype}"
    lib, why = native.load("acoustic")
    return lib is not None, why


def kernels_flush_subnormals() -> bool:
    """Whether the C kernels flush subnormal numbers to zero, as the compiled library reports:
    acoustic.c sets FTZ/DAZ for each call on x86, where each operation on a subnormal costs a
    microcode assist; other CPUs keep them."""
    return bool(_kernel_named("acoustic_flushes_subnormals")())


@functools.lru_cache(maxsize=1)
def _scratch_row_count() -> int:
    """Rows in one adjoint scratch (the h rows of a step's ring and a zero row), as the compiled
    kernels count them."""
    lib_fn = _kernel_named("acoustic_scratch_rows")
    lib_fn.restype = ctypes.c_long
    return int(lib_fn())


def _scratch_width(nx: int) -> int:
    """Elements in one adjoint scratch for blocks ``nx`` wide (rows of nx + 8: 4 zero columns
    each side)."""
    return _scratch_row_count() * (nx + 4 * RING)


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
                 spans: Tensor | None = None, threads: int = 1) -> None:
        check_layout(like, c2dt2, sponge)
        self.shape, self.dtype = tuple(like.shape), like.dtype
        self.spans = _spans(sponge, spans)
        self._keep = (c2dt2, sponge)  # the kernels read them through raw pointers
        self._grad_shape = tuple(c2dt2.shape)
        ny, nx = c2dt2.shape
        self._nx = nx
        self._dims = _dims(like)
        self._c2, self._sponge, self._span = _ptr(c2dt2), _ptr(sponge), _ptr(self.spans)
        self._iy2, self._ix2 = ctypes.c_double(1.0 / (dy * dy)), ctypes.c_double(1.0 / (dx * dx))
        self.threads = threads
        self._fwd_rows = [(ctypes.c_long(a), ctypes.c_long(b)) for a, b in _pieces(ny, threads)]
        self._adj_rows = [(ctypes.c_long(a), ctypes.c_long(b)) for a, b in _pieces(ny + 2 * RING, threads)]
        self._forward = _kernel("forward", self.dtype)
        self._adjoint = _kernel("adjoint", self.dtype)
        self._adjoint_run = _kernel("adjoint_run", self.dtype)
        self._forward_run = _kernel("forward_run", self.dtype)
        self._points = _kernel_named(f"scatter_gather_{_SUFFIX[self.dtype]}")
        self._copies = torch.empty(0, dtype=self.dtype)  # adjoint_run's copies of the lap rows it reads

    def _check(self, *fields: Tensor) -> None:
        for f in fields:
            if tuple(f.shape) != self.shape or f.dtype != self.dtype or not f.is_contiguous() \
                    or f.device.type != "cpu":
                raise ValueError(f"leapfrog: expected contiguous CPU {self.dtype} fields of shape "
                                 f"{self.shape}, got {f.dtype} {tuple(f.shape)} on {f.device}")

    def _check_laps(self, laps: Tensor, steps: int | None = None) -> ctypes.c_long:
        """One ``lap4(u)`` ``(B, ny, nx)``, or with ``steps`` a stack ``(steps, B, ny, nx)``,
        contiguous but for rows that may lie further apart (:func:`new_lap_store`); returns that
        row stride, in elements, for the kernels."""
        one = (self.shape[0], *self._grad_shape)
        want = one if steps is None else (steps, *one)
        rows = laps.stride(-2) if laps.dim() == len(want) else 0
        expected, step = [1], rows  # strides from the last dimension out
        for size in reversed(want[:-1]):
            expected.append(step)
            step *= size
        packed = all(size == 1 or stride == e for size, stride, e
                     in zip(reversed(laps.shape), reversed(laps.stride()), expected))
        if tuple(laps.shape) != want or laps.dtype != self.dtype or not packed \
                or rows < self._nx or laps.device.type != "cpu":
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

    def forward(self, u: Tensor, u_prev: Tensor, out: Tensor, lap: Tensor | None = None) -> Tensor:
        """:func:`step_forward` into ``out`` (which may be ``u_prev``), and ``lap4(u)`` into
        ``lap`` when given."""
        self._check(u, u_prev, out)
        rows = ctypes.c_long(0) if lap is None else self._check_laps(lap)
        fixed = (_ptr(u), _ptr(u_prev), self._c2, self._sponge, self._span, self._iy2, self._ix2,
                 _ptr(out), _ptr(lap), rows)
        if len(self._fwd_rows) == 1:
            self._forward(*self._dims, *self._fwd_rows[0], *fixed)
        else:
            _run_pieces([functools.partial(self._forward, *self._dims, a, b, *fixed)
                         for a, b in self._fwd_rows])
        return out

    def forward_run(self, fields: list[Tensor], sources: RowPoints | None, source_values: int,
                    receivers: RowPoints | None, traces: int, laps: Tensor | None = None) -> None:
        """Steps with ``fields = [u_prev, u, out_1, ..., out_n]`` in one pass: ``out_j`` may be
        the field two before it (two buffers recycled).  After step j the sources get
        ``source_values + j * sources.stride`` (an address: rows of ``stride`` numbers, in
        source order) and the receivers are read into ``traces + j * receivers.stride``; with
        ``laps`` (``(n, B, ny, nx)``), step j writes ``lap4`` of its ``u`` into ``laps[j]``.
        Bit for bit the same as :meth:`forward` then :meth:`points` per step.  Several threads
        share the steps out as :meth:`adjoint_run` does."""
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
                 None if laps is None else self._lap_addresses(laps, range(n)), rows)
        self._pipelined(self._forward_run, n, fixed)

    def _pipelined(self, kernel, n: int, fixed: tuple) -> None:
        """Run a pass kernel over its n steps: one call, or consecutive shares of the steps on
        threads, each starting a row iteration once the thread before it has finished it (a
        waiting thread spins, so no more threads than the CPUs this process may use)."""
        parts = _pieces(n, min(self.threads, _cpus()))
        if len(parts) == 1:
            kernel(*self._dims, ctypes.c_long(n), ctypes.c_long(0), ctypes.c_long(n), None, None, *fixed)
            return
        done = torch.full((len(parts),), -(1 << 40), dtype=torch.int64)  # last row iteration per part
        marks = [ctypes.c_void_p(done.data_ptr() + done.element_size() * t) for t in range(len(parts))]
        _run_pieces([functools.partial(kernel, *self._dims, ctypes.c_long(n), ctypes.c_long(j0),
                                       ctypes.c_long(j1), marks[t], marks[t - 1] if t else None, *fixed)
                     for t, (j0, j1) in enumerate(parts)])

    def adjoint(self, lap: Tensor, g: Tensor, a: Tensor, grad_c2: Tensor, scratch: Tensor) -> None:
        """:func:`step_adjoint`; ``scratch`` has (at least) one zeroed row set per piece of rows."""
        self._check(g, a)
        rows = self._check_laps(lap)
        if scratch.dim() != 2 or scratch.shape[0] < len(self._adj_rows) \
                or scratch.shape[1] != _scratch_width(self._nx) \
                or tuple(grad_c2.shape) != self._grad_shape:
            raise ValueError("step_adjoint: scratch or grad_c2 has the wrong size")
        if g.data_ptr() == a.data_ptr():
            raise ValueError("step_adjoint: g and a must be different buffers")
        fixed = (_ptr(lap), rows, self._c2, self._sponge, self._span, _ptr(g), _ptr(a), self._iy2,
                 self._ix2, _ptr(grad_c2))
        _run_pieces([functools.partial(self._adjoint, *self._dims, r0, r1, *fixed, _ptr(scratch[k]))
                     for k, (r0, r1) in enumerate(self._adj_rows)])

    def adjoint_run(self, laps: Tensor, a: Tensor, b: Tensor, grad_c2: Tensor, scratch: Tensor,
                    injections: list[tuple[tuple[Tensor, Tensor], Tensor]]) -> None:
        """:func:`step_adjoint_run`, but ``laps`` ``(n, B, ny, nx)`` in time order, as the
        forward stored them (the pass starts from ``laps[n - 1]``); each injection's values must
        be contiguous ``(shots, nrec)``."""
        n = laps.shape[0]
        self._check(a, b)
        rows = self._check_laps(laps, n)
        if tuple(grad_c2.shape) != self._grad_shape or scratch.shape[0] < n * self.shape[0] \
                or scratch.shape[1] != _scratch_width(self._nx):
            raise ValueError("step_adjoint_run: scratch or grad_c2 has the wrong size")
        if a.data_ptr() == b.data_ptr():
            raise ValueError("step_adjoint_run: a and b must be different buffers")
        if len(injections) != n - 1:
            raise ValueError(f"step_adjoint_run: {n} steps need {n - 1} injections, got {len(injections)}")
        for (row_ptr, columns), values in injections:
            if row_ptr.shape != (self.shape[1] + 1,) or not values.is_contiguous() \
                    or tuple(values.shape) != (self.shape[0], columns.numel()):
                raise ValueError("step_adjoint_run: receivers or values have the wrong size")
        pointers = ctypes.c_void_p * max(1, n - 1)
        fixed = (self._lap_addresses(laps, range(n - 1, -1, -1)), rows, self._c2, self._sponge,
                 self._span, _ptr(a), _ptr(b), self._iy2, self._ix2, _ptr(grad_c2), _ptr(scratch),
                 pointers(*(r[0].data_ptr() for r, _ in injections)),
                 pointers(*(r[1].data_ptr() for r, _ in injections)),
                 (ctypes.c_long * max(1, n - 1))(*(r[1].numel() for r, _ in injections)),
                 pointers(*(v.data_ptr() for _, v in injections)), _ptr(self._lap_copies(n)))
        self._pipelined(self._adjoint_run, n, fixed)

    def _lap_copies(self, steps: int) -> Tensor:
        """Two rows per step and shot, of whole cache lines: where an adjoint pass whose rows
        are too long to prefetch copies the stored lap rows it is about to read (torch allocates
        on 64-byte lines)."""
        size = 2 * steps * self.shape[0] * lap_row_stride(self._nx, self.dtype)
        if self._copies.numel() < size:
            self._copies = torch.empty(size, dtype=self.dtype)
        return self._copies

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
    what :func:`step_adjoint` reads.
    """
    check_layout(u, c2dt2, sponge, u_prev, out)
    return Kernels(u, c2dt2, sponge, dy, dx, spans, threads).forward(u, u_prev, out, lap)


def step_adjoint(lap: Tensor, c2dt2: Tensor, sponge: Tensor | None, g: Tensor, a: Tensor,
                 dy: float, dx: float, grad_c2: Tensor, scratch: Tensor,
                 spans: Tensor | None = None) -> None:
    """Adjoint of :func:`step_forward` at field ``u``, in place (the C source has the exact map).

    ``lap`` is the ``lap4(u)`` the forward step stored.  On entry ``g`` is the adjoint of
    ``u_next`` (only read) and ``a`` the ``g`` of the step after this one (zeros for the last
    step); on exit ``a`` is the adjoint of ``u``, and ``grad_c2`` has this step's share added.
    ``scratch``: :func:`adjoint_scratch` (zeroed once, reusable across steps); its first
    dimension is the number of threads the rows are split over.
    """
    check_layout(g, c2dt2, sponge, a)
    Kernels(g, c2dt2, sponge, dy, dx, spans, scratch.shape[0]).adjoint(lap, g, a, grad_c2, scratch)


def receiver_rows(rec_iy: Tensor, rec_ix: Tensor, rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """Receivers (ringed coordinates) sorted by row, for :func:`step_adjoint_run`.

    Returns ``(order, row_ptr, columns)``: residuals are passed as ``values[:, order]``, and
    the receivers of ringed row ``q`` are ``row_ptr[q] .. row_ptr[q + 1] - 1`` of that order.
    """
    order, row_ptr = _by_row(rec_iy, rows)
    return order, row_ptr, rec_ix[order].to(torch.int64).contiguous()


def _by_row(row: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """A stable sort of points by ``row`` and the ``rows + 1`` CSR offsets of each row's run."""
    order = torch.argsort(row, stable=True)
    row_ptr = torch.zeros(rows + 1, dtype=torch.int64)
    row_ptr[1:] = torch.cumsum(torch.bincount(row, minlength=rows), 0)
    return order, row_ptr


def step_adjoint_run(laps: list[Tensor], c2dt2: Tensor, sponge: Tensor | None, a: Tensor, b: Tensor,
                     dy: float, dx: float, grad_c2: Tensor, scratch: Tensor,
                     injections: list[tuple[tuple[Tensor, Tensor], Tensor]],
                     spans: Tensor | None = None, threads: int = 1) -> None:
    """Adjoint steps k, k-1, ..., k-n+1 in one pass: n :func:`step_adjoint` calls, bit for bit,
    ``laps`` being the stored ``lap4`` of u_k, u_{k-1}, ..., u_{k-n+1}.  With ``threads`` > 1
    the steps are shared out, each thread's steps following the ones before row by row.

    After the step at ``laps[j]``, ``injections[j] = ((row_ptr, columns), values)`` adds the
    residuals of the next step, ``values`` (shots, nrec) in the order of :func:`receiver_rows`,
    at its receivers.  On entry ``a`` is step k's ``g`` and ``b`` its ``a``.  On exit the
    adjoint of u_{k-n+1} is in ``a`` for even n and in ``b`` for odd n, and the other holds
    that of u_{k-n+2} (for n = 1: ``b`` as after one call, ``a`` unchanged).
    ``scratch``: :func:`run_scratch`.  The pass loads c2dt2, the sponge, grad_c2 and both
    adjoint fields once for all n steps and reads each step's adjoint input from cache, which
    is what makes it faster: only the stored laps then stream from memory.
    """
    check_layout(a, c2dt2, sponge, b)
    if scratch.shape[0] < len(laps) * a.shape[0]:
        raise ValueError("step_adjoint_run: scratch or grad_c2 has the wrong size")
    Kernels(a, c2dt2, sponge, dy, dx, spans, threads).adjoint_run(
        torch.stack(laps[::-1]), a, b, grad_c2, scratch, [(r, v.contiguous()) for r, v in injections])


# Forward steps per Kernels.forward_run pass (one thread).  Measured on the 2-core EPYC VM
# (benchmarks/RESULTS.md, "Then: forward passes of 8 steps"): 8 beat 1, 2 and 4 from 256^2
# (in cache) to 2000^2, because each step reads u and u_prev from cache instead of memory.
FORWARD_STEPS_PER_PASS = 8


def steps_per_pass(field_bytes: int) -> int:
    """Adjoint steps per :func:`step_adjoint_run` pass for fields of ``field_bytes``.

    Each further step of a pass saves a load of both adjoint fields, c2dt2 and grad_c2.  With
    the current kernels (the adjoint reads the stored lap4, one stencil per step) 8 steps beat
    pairs from 256^2 float32 (256 KB) to 768^2 on the Intel AVX-512 VM, on one and two threads:
    the backward took 6-36 % less time (benchmarks/RESULTS.md, "PDE: 8 adjoint steps per pass
    from 256 KB fields").  At 128^2 the two were level; pairs stay there, as the first
    measurement (EPYC VM, older two-stencil adjoint) found them best for fields in cache.
    """
    return 2 if field_bytes < 256 << 10 else 8


def _pieces(rows: int, threads: int) -> list[tuple[int, int]]:
    """``rows`` split into ``threads`` contiguous, nearly equal, non-empty ranges."""
    threads = max(1, min(threads, rows))
    cuts = [rows * k // threads for k in range(threads + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def _run_pieces(calls: list) -> None:
    """Run the kernel calls at once: all but one on the pool, the last on this thread."""
    if len(calls) == 1:
        calls[0]()
        return
    futures = [_pool(len(calls) - 1).submit(c) for c in calls[:-1]]
    calls[-1]()
    for f in futures:
        f.result()


@functools.lru_cache(maxsize=1)
def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="odecli-kernel")


def _spans(sponge: Tensor | None, spans: Tensor | None) -> Tensor | None:
    if sponge is None:
        return None
    spans = sponge_spans(sponge) if spans is None else spans
    if spans.shape != (sponge.shape[0], 2) or spans.dtype != torch.int64 or not spans.is_contiguous():
        raise ValueError("leapfrog: spans must be sponge_spans(sponge)")
    return spans


def adjoint_scratch(c2dt2: Tensor, threads: int = 1) -> Tensor:
    """The zeroed work rows :func:`step_adjoint` needs for a block like ``c2dt2``, per thread."""
    threads = max(1, min(threads, c2dt2.shape[0] + 2 * RING))
    return c2dt2.new_zeros((threads, _scratch_width(c2dt2.shape[1])))


def run_scratch(c2dt2: Tensor, shots: int, steps: int) -> Tensor:
    """The zeroed work rows :func:`step_adjoint_run` needs: one ring of h rows per step and shot."""
    return c2dt2.new_zeros((steps * shots, _scratch_width(c2dt2.shape[1])))


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
