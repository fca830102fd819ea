"""The elastic forward in passes of several steps over the rows (``elastic_run_rows`` in
``elastic_run.c``), for one rank (with or without a free surface): what :meth:`FusedLoop.run
<odecli.pde.elastic.fused.FusedLoop.run>` calls there.

Why: one step per sweep streams about 15 array passes per step through memory; a pass of
several steps reads and writes each row of the fields, memory variables and parameters once,
each step a few rows behind the one before, from cache (the acoustic engine's temporal blocking,
:meth:`odecli.pde.acoustic.kernels.Kernels.forward_run`).  Measured (one thread, float64, CPU
time): at 1040^2 without a CPML a pass of 4 steps runs at 2.65 ns per point and step, what the
same kernels take on a 128^2 grid that stays in cache (2.5-2.6): the step is then bound by its
arithmetic (70 roundings per point, kept in the reference's order for its bits), and the pass
gained 7-15 % over one step per sweep, not the acoustic engine's 2x.  Measured and not kept:
strips of columns (each strip's n steps in cache, the steps skewed by 4 columns): no faster;
streaming (non-temporal) writes of the gradient's stores through a row buffer, as the acoustic
engine's: the recomputation that stores -7 % (10.3 -> 9.6 ms a step at 1040^2 float64, the
store's 43 MB a step bound by memory), the adjoint that reads them back +3 % (from memory
instead of cache), a gradient unchanged (3.08-3.13 s either way).
The sources (point forces on the velocities, explosive ones on the normal stresses) are added
and the receivers read inside the pass, row by row, where the per-step path adds them after a
half step and reads them after the step; the gradient's stores are written in the pass too.
Several threads share a pass's steps (each waits on the previous one's row counter), bit for
bit the one-thread result, which is bit for bit the per-step path's (tests/test_elastic_run.py).

On several ranks :mod:`odecli.pde.elastic.ranks_pass` runs these passes on blocks grown into
the neighbours' (deep halos exchanged once a pass).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from odecli.pde import native
from odecli.pde.elastic.reference import (
    N_PSI,
    RING,
    STRESS_IMAGE,
    VELOCITY_IMAGE,
    Materials,
)
from odecli.pde.elastic.scratch import ringed_base, zero_ring_, zeroed_pages
from odecli.threads import available_cpus, run_on_pool, split_rows

# Steps per pass and kernel thread: measured at 1040^2 (1000^2 + 20-cell CPML), 100 steps,
# process CPU time (on a loaded machine, best of 3): one thread, float64 2, 3, 4 and 6 steps a
# pass within 4 % of each other (8: 12 % slower: the rows of 8 steps no longer fit the 2 MB L2);
# two threads, 8 steps a pass (4 each) 3-8 % faster than 4 (2 each).
STEPS_PER_THREAD = 4


def _ptr(t: Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() if t is not None else None)


def kernels_flush_subnormals() -> bool:
    """Whether the elastic C kernels flush subnormal numbers to zero (subnormals.c: on x86), so
    that a comparison with PyTorch can flush alike (``torch.set_flush_denormal``)."""
    lib, why = native.load("elastic")
    if lib is None:
        raise RuntimeError(f"fused elastic kernels unavailable: {why}")
    return bool(lib.elastic_flushes_subnormals())


def materials_without_graph(padded: Tensor, free_surface_here: bool) -> Materials:
    """:func:`~odecli.pde.elastic.reference.materials` in one C pass (``elastic_materials``),
    the same bits, for a forward without a graph on the fused kernels: its dozen full-size
    temporaries cost 0.035 s of a 0.5 s forward at 1042^2 float64 (page faults included)."""
    lib, why = native.load("elastic")
    if lib is None:
        raise RuntimeError(f"fused elastic kernels unavailable: {why}")
    kernel = getattr(lib, f"elastic_materials_{'f64' if padded.dtype == torch.float64 else 'f32'}")
    padded = padded.detach().contiguous()
    ny, nx = padded.shape[-2] - 2, padded.shape[-1] - 2
    out = padded.new_empty((5, ny, nx))
    kernel(ctypes.c_long(ny), ctypes.c_long(nx), _ptr(padded), *[_ptr(t) for t in out])
    by, bx, lam2mu, lam, mu_xy = out.unbind(0)
    surface = lam2mu[0] - lam[0] * lam[0] / lam2mu[0] if free_surface_here else None
    return Materials(by=by, bx=bx, lam2mu=lam2mu, lam=lam, mu_xy=mu_xy, surface=surface)


def ringed(f: Tensor, in_place: bool) -> Tensor:
    """``f`` ``(B, C, ny, nx)`` with a zero ring of width :data:`RING`, contiguous, for the
    kernels: where ``f`` is the inside of a contiguous ringed tensor (the propagator's fields
    and the passes' outputs are), that tensor itself (``in_place``: nothing keeps ``f``) or
    its copy (a segment's start, kept for the backward: a contiguous copy took 8.5 ms against
    12.5 for padding the strided view, 3 planes at 1040^2 float64), in huge pages
    (:func:`~odecli.pde.elastic.scratch.zeroed_pages`); else a padded copy.

    Why huge pages: a gradient's checkpoints keep every copy, so ``clone`` mostly faulted in
    fresh 4 kB pages.  Measured with ``benchmarks/elastic_bench.py``'s own timing (a fresh
    process, a warm-up, one gradient at 1040^2 float64, one thread, three alternating runs on
    the loaded 2-core VM): 2.97-3.05 s against 3.00-3.09 s with ``clone``.  In a process that
    has run several gradients the allocator reuses the freed checkpoints' memory and
    ``clone`` was ~0.03 s a gradient faster (steady state, 6 gradients each way)."""
    base = ringed_base(f)
    if base is None:
        return torch.nn.functional.pad(f, (RING,) * 4).contiguous()
    return zero_ring_(base if in_place else zeroed_pages(base.shape, base).copy_(base))


class RowIndex:
    """Points of a shot's ringed fields (flat indices, and each one's block row), sorted by row
    (stable) with ``ny + 1`` CSR offsets, for the pass's per-row loops; ``idx``: each point's
    column (its value's or its trace's)."""

    def __init__(self, flat: Tensor, rows: Tensor, idx: Tensor, ny: int) -> None:
        order = torch.argsort(rows, stable=True)
        self.ptr = torch.zeros(ny + 1, dtype=torch.int64)
        self.ptr[1:] = torch.cumsum(torch.bincount(rows, minlength=ny), 0)
        self.at = flat[order].to(torch.int64).contiguous()
        self.idx = idx[order].to(torch.int64).contiguous()

    def args(self) -> tuple:
        return _ptr(self.ptr), _ptr(self.at), _ptr(self.idx)


def _receivers(loop, ny: int, nx2: int) -> tuple[RowIndex | None, RowIndex | None, int]:
    """The velocity and pressure receivers (None where there are none) and their count: the
    flat index each one reads (a pressure receiver: its syy point), its block row and the
    column of the traces it goes to (:meth:`ElasticPropagator._record`'s order)."""
    v_idx, p_idx, plane = loop.rec_plan
    flats, kinds = [], []
    k = 0
    for idx in v_idx:
        if idx is None:
            flats.append(p_idx[k])
            kinds.append(torch.ones_like(p_idx[k]))
            k += 1
        else:
            flats.append(idx)
            kinds.append(torch.zeros_like(idx))
    if not flats:
        return None, None, 0
    flat, kind = torch.cat(flats).cpu(), torch.cat(kinds).cpu()
    slot = torch.argsort(loop.prop.rec_order.cpu())  # column of each one in the traces
    rows = (flat % plane) // nx2 - RING
    out = []
    for k in (0, 1):
        sel = (kind == k).nonzero().flatten()
        out.append(RowIndex(flat[sel], rows[sel], slot[sel], ny) if sel.numel() else None)
    return out[0], out[1], flat.numel()


def _sources(loop, t0: int, t1: int, shots: int, ny: int, nx2: int):
    """Per shot, its sources' :class:`RowIndex` (None: none) and their values for steps
    ``t0 .. t1-1``, ``(steps, sources)``: the numbers ``ElasticPropagator._inject`` adds."""
    prop, geom = loop.prop, loop.prop.geom
    if not geom.has_sources:
        return [(None, None)] * shots
    scale = prop.dt / (prop.grid.dy * prop.grid.dx)
    vals = geom.src_amp[None, :] * (geom.wavelet[t0:t1, None] * scale)
    flat = (geom.src_iy + RING) * nx2 + geom.src_ix + RING
    if prop.source_type == "pressure":
        vals = -vals
    else:
        chan = 0 if prop.source_type == "fy" else 1
        buoy = loop.materials.by if chan == 0 else loop.materials.bx
        vals = vals * buoy[geom.src_iy, geom.src_ix][None, :]
        flat = flat + chan * (ny + 2 * RING) * nx2
    out = []
    for b in range(shots):
        sel = (geom.src_shot == b).nonzero().flatten()
        if sel.numel() == 0:
            out.append((None, None))
            continue
        own = torch.arange(sel.numel())
        out.append((RowIndex(flat[sel].cpu(), geom.src_iy[sel].cpu(), own, ny),
                    vals[:, sel].contiguous()))
    return out


def _images(like: Tensor) -> tuple:
    """The free surface's images as ``elastic_run_rows`` takes them: the velocities' and the
    stresses' ringed rows (two per plane) and signs (one per plane)."""
    out = []
    for rows, signs in (VELOCITY_IMAGE, STRESS_IMAGE):
        at = torch.tensor([r for pair in rows for r in pair], dtype=torch.int64)
        if int(at.max()) > 2 * RING:  # the pass makes a step's image from its top 3 rows
            raise ValueError(f"elastic passes: free-surface image rows {rows} too deep")
        out += [at, torch.tensor(signs, dtype=like.dtype)]
    return tuple(out)


def _psi_layout(loop, psi: Tensor | None, shots: int, ny: int, nx: int, like: Tensor):
    """Per shot, where ``elastic_run_rows`` finds the memory variables (see velocity_mapped_*
    in elastic_run.c), and the tensors that hold them.  ``psi`` ``(B, 8, ny, nx)``: that
    layout.  None (a forward without a graph, which starts them at 0 and drops them): the
    rows of the y layers ``(B, 8, rows, nx)`` and the x layers' columns of the other rows
    ``(B, 8, ny, columns)`` only, 8 % of the planes at 1040^2 with 20-cell layers (the full
    planes' zeroing and page faults took 0.02 s of a 0.45 s forward); the full layout where
    that does not apply (a free surface, whose row the half-step kernel makes, or no interior
    run of columns)."""
    c_long = ctypes.c_long
    jlo, jhi = loop.scalars[3].value, loop.scalars[4].value
    if psi is None and (loop.surface is not None or jhi <= jlo):
        psi = like.new_zeros((shots, N_PSI, ny, nx))
    if psi is not None:
        ymap = torch.arange(ny, dtype=torch.int64)
        pp = c_long(ny * nx)
        return [(_ptr(psi[b]), _ptr(ymap), pp, _ptr(psi[b]), pp, c_long(nx), c_long(0))
                for b in range(shots)], (psi, ymap)
    ay_int, ay_half = loop.pml[0], loop.pml[2]
    rows = ((ay_int != 0) | (ay_half != 0)).nonzero().flatten()
    ymap = torch.full((ny,), -1, dtype=torch.int64)
    ymap[rows] = torch.arange(rows.numel())
    cols = jlo + nx - jhi
    ys = like.new_zeros((shots, N_PSI, rows.numel(), nx))
    xs = like.new_zeros((shots, N_PSI, ny, cols))
    return [(_ptr(ys[b]), _ptr(ymap), c_long(rows.numel() * nx), _ptr(xs[b]), c_long(ny * cols),
             c_long(cols), c_long(jhi - jlo)) for b in range(shots)], (ys, xs, ymap)


class CompactStores:
    """Where a step's compact stores lie (``elastic_adjoint_run.c`` says how the adjoint reads
    them): the new velocities, ringed ``(B, 2, ny + 4, nx + 4)`` with a zero ring, and the
    stress update's corrected derivatives only in the CPML layers, per shot ``3 * (sy * nx +
    ny * cols)`` numbers: 3 planes of the ``sy`` rows of the y layers (row ``smap[i]`` for field
    row ``i``, -1 elsewhere), then 3 planes ``(ny, cols)`` of the x layers' columns.  Instead of
    the five full derivative planes a step: 2 planes and the layers' 3 (8 % of a plane at
    1040^2 with 20-cell layers), about 2.3 planes a step against 5.

    Why: the recomputation that wrote five planes a step (43 MB at 1040^2 float64) ran at
    10 ms a step, memory-bound, against 3.9 for a plain step; and half the stores let the
    gradient keep its first pass's stores of more segments (or all) instead of recomputing
    them.  For one rank without a free surface (the ring is then 0; the passes of both
    directions run there)."""

    def __init__(self, ay_int: Tensor, ay_half: Tensor, jlo: int, jhi: int, nx: int) -> None:
        ny = ay_int.numel()
        rows = ((ay_int.reshape(-1) != 0) | (ay_half.reshape(-1) != 0)).nonzero().flatten()
        self.smap = torch.full((ny,), -1, dtype=torch.int64)
        self.smap[rows] = torch.arange(rows.numel())
        self.sy = rows.numel()
        self.cols = jlo + nx - jhi
        self.ny, self.nx = ny, nx
        self.per_shot = 3 * (self.sy * nx + ny * self.cols)

    def shapes(self, steps: int, shots: int) -> tuple[tuple, tuple]:
        """The shapes of ``steps`` steps' velocity and derivative stores."""
        return ((steps, shots, 2, self.ny + 2 * RING, self.nx + 2 * RING),
                (steps, shots, self.per_shot))

    def args(self) -> tuple:
        return ctypes.c_int(1), _ptr(self.smap), ctypes.c_long(self.sy)


NO_COMPACT = (ctypes.c_int(0), ctypes.c_void_p(None), ctypes.c_long(0))


def run_passes(loop, t0: int, t1: int, vr: Tensor, sr: Tensor, psi: Tensor | None,
               stores: tuple[Tensor, Tensor] | None, steps_per_pass: int | None) -> Tensor:
    """Steps ``t0 .. t1-1`` of every shot on the ringed fields ``vr``, ``sr`` and ``psi`` (in
    place; None: from zero memory variables, which are then dropped), in passes of
    ``steps_per_pass`` steps (the last one shorter; None: :data:`STEPS_PER_THREAD` per kernel
    thread); ``stores`` as :meth:`FusedLoop.run` takes them.  Returns the traces ``(B,
    receivers, steps)``.  With ``loop.compact`` (a :class:`CompactStores`; None: the five
    planes) the stores are compact ones."""
    b, ny2, nx2 = vr.shape[0], vr.shape[-2], vr.shape[-1]
    ny, nx = ny2 - 2 * RING, nx2 - 2 * RING
    steps = t1 - t0
    vrec, prec, nrec = _receivers(loop, ny, nx2)
    traces = vr.new_zeros((b, steps, nrec))
    sources = _sources(loop, t0, t1, b, ny, nx2)
    kernel = loop.run_rows
    fixed = [_ptr(t) for t in loop.mats]
    pml = [_ptr(t) for t in loop.pml]
    none = (_ptr(None),) * 3
    on_stress = ctypes.c_int(loop.prop.source_type == "pressure")
    threads = min(len(loop.pieces), available_cpus())
    if steps_per_pass is None:
        steps_per_pass = STEPS_PER_THREAD * threads
    done = torch.empty(threads, dtype=torch.int64)
    marks = [ctypes.c_void_p(done.data_ptr() + done.element_size() * t) for t in range(threads)]
    dims = (ctypes.c_long(ny), ctypes.c_long(nx))
    psi_at, _keep = _psi_layout(loop, psi, b, ny, nx, vr)  # _keep: alive through the calls
    images = None if loop.surface is None else _images(vr)  # kept alive through the calls
    surface = (_ptr(None),) * 5 if images is None else (_ptr(loop.surface),
                                                         *[_ptr(t) for t in images])
    layout = getattr(loop, "compact", None)
    if stores is not None and layout is not None and images is not None:
        raise ValueError("elastic passes: compact stores take no free surface")
    compact = layout.args() if stores is not None and layout is not None else NO_COMPACT
    if stores is not None:  # the kernel writes what the layout says: the buffers must fit it
        shapes = layout.shapes(steps, b) if layout is not None else (
            (steps, b, 2, ny, nx), (steps, b, 3, ny, nx))
        if tuple(tuple(t.shape) for t in stores) != shapes:
            raise ValueError(f"elastic passes: stores {[tuple(t.shape) for t in stores]}, "
                             f"expected {shapes}")
    for shot in range(b):
        src, vals = sources[shot]
        for k0 in range(0, steps, steps_per_pass):
            n = min(steps_per_pass, steps - k0)
            if stores is None:
                st = (None, None)
            else:
                st = tuple((ctypes.c_void_p * n)(*(store[k, shot].data_ptr()
                                                   for k in range(k0, k0 + n)))
                           for store in stores)
            args = (_ptr(vr[shot]), _ptr(sr[shot]), *psi_at[shot], *fixed, *st, *pml,
                    *loop.scalars,
                    *(none if src is None else src.args()),
                    _ptr(None if vals is None else vals[k0]),
                    ctypes.c_long(0 if vals is None else vals.shape[1]), on_stress,
                    *(none if vrec is None else vrec.args()),
                    *(none if prec is None else prec.args()),
                    _ptr(traces[shot, k0] if nrec else None), ctypes.c_long(nrec), *surface,
                    *compact)
            parts = split_rows(n, threads)
            if len(parts) == 1:
                kernel(*dims, ctypes.c_long(n), ctypes.c_long(0), ctypes.c_long(n), None, None,
                       *args)
                continue
            done.fill_(-(1 << 40))
            run_on_pool([lambda t=t, j0=j0, j1=j1: kernel(
                *dims, ctypes.c_long(n), ctypes.c_long(j0), ctypes.c_long(j1), marks[t],
                marks[t - 1] if t else None, *args) for t, (j0, j1) in enumerate(parts)])
    return traces.transpose(1, 2).contiguous()
