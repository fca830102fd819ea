"""Several elastic adjoint steps in one pass over the rows (``elastic_adjoint_run`` in
``elastic_adjoint_run.c``), for :meth:`~odecli.pde.elastic.fused.FusedLoop.adjoint` on one rank
without a free surface.

What it was for: adjoint steps thought memory-bound (each reads and writes the adjoint fields,
memory variables, parameters and gradient sums once), so ``n`` steps run together, each four
rows behind the one before, would find those arrays in cache.  Measured, they do not gain
(:func:`pass_length`): the step is bound by the traffic of its ~60 row streams between L1 and
L2, not by memory, so its default pass is one step per kernel thread.  What it still gives:
the receivers' residuals (what ``FusedLoop._record_adjoint`` adds before a step) and the point
forces' buoyancy gradient (``FusedLoop._source_gradient`` after it) done inside the sweep, row
by row, from tables built once per segment (no per-step torch indexing or ring clearing), and
on several kernel threads the pass's steps shared out, each thread starting a row once the
thread before it is far enough ahead (pipelined, as acoustic's ``leapfrog_forward_run``).  The
gradient is bit for bit one thread's, and that of one ``elastic_adjoint_step`` per step
(``tests/test_elastic_adjoint_run.py``).  With compact stores (``loop.compact``,
:class:`~odecli.pde.elastic.forward_pass.CompactStores`) the pass derives each step's five
derivative planes from the stored velocities after and before the step (the segment's start
``v0`` before its first) and the layers' stored derivatives (``tests/test_elastic_stores.py``).

With compact stores and a stiffness that can be divided by (:func:`scaled_ok`) the pass runs
the adjoint in scaled variables instead (``elastic_adjoint_scaled.c``: the forward's rows with
-dt, the CPML layers as a correction), two steps a thread (:data:`SCALED_STEPS_PER_THREAD`),
its gradients turned back once a backward (:func:`finish_scaled`); the unscaled gradient to
round-off (``tests/test_elastic_scaled_adjoint.py``).  It took the adjoint passes at 1040^2
from 0.885 to 0.705 s (float32) and 1.77 to 1.44 s (float64), 100 steps, one thread.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from odecli.pde import native
from odecli.pde.elastic.reference import RING, STRESS_IMAGE, VELOCITY_IMAGE
from odecli.pde.elastic.scratch import WRING, _reused
from odecli.threads import available_cpus, run_on_pool, split_rows

# Adjoint steps per pass: None, one per kernel thread (measured below); 0, one
# elastic_adjoint_step per step (the path before the passes); n, n.
STEPS: int | None = None
# The adjoint in scaled variables (elastic_adjoint_scaled.c) where the stiffness allows it
# (scaled_ok); False: the unscaled one always (the tests compare the two).
SCALED = True
# Steps per thread in a pass of the scaled adjoint.  Unlike the unscaled step (bound by its
# row streams between L1 and L2, pass_length), the scaled one moves about as many bytes to
# and from memory as the machine's one-thread bandwidth allows (~29 planes a step, ~10 GB/s
# here), and two steps a pass share the parameters', sums' and adjoints' traffic: measured at
# 1040^2, 100 steps, one thread, process CPU time, best of 3 in one process, the adjoint
# passes took 0.885 s unscaled, 0.780 scaled with 1 step a pass, 0.705 with 2 and 0.704 with 3
# (float32); 1.770, 1.702, 1.440 and 1.465 s (float64).  Two: the rows of two steps (16
# apart) stay in L2 for both dtypes.  On two threads 1, 2, 3 and 4 steps a thread took
# 0.386, 0.394, 0.382 and 0.390 s (float32): both cores share the memory's bandwidth.
SCALED_STEPS_PER_THREAD = 2
# The largest condition number of the normal stresses' stiffness [[lam+2mu, lam], [lam,
# lam+2mu]] (its eigenvalues 2 (lam + mu) and 2 mu, so (vp^2 - vs^2) / vs^2) for which the
# scaled adjoint runs: its gradients divide by that matrix once (finish_scaled), which
# multiplies their round-off by up to the condition number; 100 is vs >= vp / 10.05.
SCALED_MAX_CONDITION = 100.0


def scaled_ok(lam2mu: Tensor, lam: Tensor, mu_xy: Tensor) -> bool:
    """Whether the scaled adjoint may run on these staggered parameters: mu_xy > 0 and the
    normal stresses' stiffness positive definite with a condition number of at most
    :data:`SCALED_MAX_CONDITION` everywhere (a fluid, vs = 0, takes the unscaled adjoint)."""
    if not SCALED or bool((mu_xy <= 0).any()):
        return False
    low, high = lam2mu - lam.abs(), lam2mu + lam.abs()
    return bool((low > 0).all()) and bool((high <= SCALED_MAX_CONDITION * low).all())


def finish_scaled(mats: list[Tensor], gm: list[Tensor], graw: Tensor, dt: float) -> None:
    """The scaled adjoint's sums turned into the staggered parameters' gradients, in place:
    ``gm[2:5]`` hold S1, S2, S3 and ``graw`` the buoyancies' sums, the point forces' terms
    included (elastic_adjoint_scaled.c says what they are); ``gm[0:2]`` are added to."""
    by, bx, lam2mu, lam, mu_xy = mats
    s1, s2, s3 = gm[2], gm[3], gm[4]
    det = lam2mu * lam2mu - lam * lam
    g_lam2mu = (lam2mu * s1 - lam * s2) * (dt / det)
    g_lam = (lam2mu * s2 - lam * s1) * (dt / det)
    s1.copy_(g_lam2mu)
    s2.copy_(g_lam)
    s3.mul_(dt / mu_xy)
    gm[0].add_(graw[0] / (by * by))
    gm[1].add_(graw[1] / (bx * bx))


def pass_length(threads: int, scaled: bool = False) -> int:
    """Steps per pass on ``threads`` kernel threads (0: no passes); ``scaled``: of the scaled
    adjoint (:data:`SCALED_STEPS_PER_THREAD` a thread).

    Measured (1000^2 + 20-cell PML, 100 steps, float64, one thread, process CPU time, best of
    2-3 alternating runs in one process on the shared 2-core VM): the whole gradient took
    3.21 s with one elastic_adjoint_step per step, 2.97 s with passes of 1 step (the receivers'
    and the source's work in C, no per-step ring clearing), and 3.37 / 3.53 / 3.75 s with 2 / 4
    / 8 steps per pass: running several steps in one pass does not pay on one thread.  The
    step is not bound by memory: one elastic_adjoint_step with every array in L2 (32 x 256
    rows) cost 14.6 ns a point, with them in memory (2048 x 256 rows) 11.9; its four row
    functions cost 2.9 ns a point together with their arrays in L1 (rows of 256) and 9.4 with
    them in L2 (rows of 1024): the traffic of its ~60 row streams between L1 and L2 is what
    costs.  Nor do bands of columns pay (each band over all rows, its rings in L1, bit for bit
    the same step; tried and dropped): 14.7-21.7 ns a point for bands of 256-32 columns
    against 12.7 for whole rows (float64, 1040^2), the arrays then read in pieces of a few
    hundred bytes, one per row.  So one step per thread: two threads each run a whole step,
    pipelined, which took 0.94-0.97x the wall time per step of elastic_adjoint_split's two
    halves and cut (1040^2, float32 and float64, best of 25, random data)."""
    if STEPS is not None:
        return STEPS
    per_thread = SCALED_STEPS_PER_THREAD if scaled else 1
    return per_thread * max(1, min(threads, available_cpus()))


def _ptr(t: Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() if t is not None else None)


def _by_row(at: Tensor, rows: Tensor, ny: int) -> tuple[Tensor, Tensor, Tensor]:
    """A stable sort of points by field row (equal points keep their order of addition) and the
    ``ny + 1`` CSR offsets of each row's run: ``(order, at[order], offsets)``."""
    order = torch.argsort(rows, stable=True)
    counts = torch.bincount(rows, minlength=ny)
    ptr = torch.zeros(ny + 1, dtype=torch.int64)
    ptr[1:] = torch.cumsum(counts, 0)
    return order, at[order].to(torch.int64).contiguous(), ptr


class AdjointPass:
    """``elastic_adjoint_run`` bound to one segment's backward: the adjoints ``lv``, ``ls``
    (ringed), ``lp``, the stores, the gradient sums ``gm`` and the rings ``w``
    ``(STEPS, B, 2, 4, 8, nx + 8)``; :meth:`steps` runs a pass."""

    def __init__(self, loop, lv: Tensor, ls: Tensor, lp: Tensor, store_v: Tensor,
                 store_s: Tensor, gm: list[Tensor], w: Tensor, threads: int,
                 v0: Tensor | None = None, graw: Tensor | None = None,
                 scaled: bool = False) -> None:
        self.prop = loop.prop
        sfx = "f64" if lv.dtype == torch.float64 else "f32"
        lib, why = native.load("elastic")
        if lib is None:
            raise RuntimeError(f"fused elastic kernels unavailable: {why}")
        # scaled (compact stores only): the adjoints scaled, u = b lambda_v, tau = C lambda_s
        self.scaled = scaled
        self.mats = loop.mats
        name = "elastic_adjoint_scaled_run" if scaled else "elastic_adjoint_run"
        self.kernel = getattr(lib, f"{name}_{sfx}")
        self.b, self.ny, self.nx = lv.shape[0], loop.ny, loop.nx
        self.lv, self.ls, self.store_v, self.store_s = lv, ls, store_v, store_s
        self.threads = max(1, min(threads, available_cpus()))
        self.fixed = (_ptr(lv), _ptr(ls), _ptr(lp), *[_ptr(t) for t in loop.mats])
        self.fields = (*[_ptr(t) for t in gm], _ptr(w), *[_ptr(t) for t in loop.pml],
                       *loop.scalars)
        self.no_points = torch.zeros(self.ny + 1, dtype=torch.int64)
        # compact stores (loop.compact): the velocities before the segment (v0, ringed) and
        # the rows the kernel derives the stores into, (steps, 5, nx)
        self.layout, self.v0, self.graw = loop.compact, v0, graw  # graw: (2, ny, nx)
        self.drow = lv.new_empty((0, 5, self.nx))
        self._receiver_table(loop.rec_plan)
        self._source_table(gm)

    def _receiver_table(self, plan) -> None:
        """Where each trace's adjoint goes (the order of ``FusedLoop._record_adjoint``): velocity
        receivers into ``lv``, pressure ones, times -0.5, into both normal stresses of ``ls``;
        ``(column of the trace in the groups' order, factor)`` per point."""
        v_idx, p_idx, plane = plan
        nx2 = self.nx + 2 * RING
        into = {"v": ([], [], []), "s": ([], [], [])}  # flat, trace column, factor
        start, k = 0, 0
        for idx in v_idx:
            if idx is None:
                flat = p_idx[k].to(torch.int64)
                k += 1
                cols = torch.arange(start, start + flat.numel())
                for shift in (0, plane):
                    into["s"][0].append(flat + shift)
                    into["s"][1].append(cols)
                    into["s"][2].append(torch.full((flat.numel(),), -0.5, dtype=torch.float64))
            else:
                flat = idx.to(torch.int64)
                cols = torch.arange(start, start + flat.numel())
                into["v"][0].append(flat)
                into["v"][1].append(cols)
                into["v"][2].append(torch.ones(flat.numel(), dtype=torch.float64))
            start += flat.numel()
        self.rec = {}
        for key, (flats, cols, factors) in into.items():
            cat = lambda parts, dtype: (torch.cat(parts) if parts
                                        else torch.zeros(0, dtype=dtype))
            flat = cat(flats, torch.int64)
            rows = (flat % plane) // nx2 - RING
            order, at, ptr = _by_row(flat, rows, self.ny)
            factor = cat(factors, torch.float64)[order].to(self.lv.dtype)
            if self.scaled and at.numel():  # the residuals into u = b lv, tau = C ls
                point = rows[order] * self.nx + (at % nx2 - RING)
                by, bx, lam2mu, lam = (t.reshape(-1) for t in self.mats[:4])
                if key == "v":
                    factor = factor * torch.where(at // plane == 0, by[point], bx[point])
                else:  # a pressure residual goes into both normal stresses alike
                    factor = factor * (lam2mu[point] + lam[point])
            self.rec[key] = (ptr, at, cat(cols, torch.int64)[order], factor)
        self.inverse_order = torch.argsort(self.prop.rec_order)

    def _source_table(self, gm: list[Tensor]) -> None:
        """The point forces' adjoint-velocity points, gradient points and order (by row)."""
        prop, geom = self.prop, self.prop.geom
        self.force = prop.source_type != "pressure" and geom.has_sources
        if not self.force:
            none = torch.zeros(0, dtype=torch.int64)
            self.src = (self.no_points, none, none, None)
            self.g_src = gm[0]
            return
        chan = 0 if prop.source_type == "fy" else 1
        iy, ix, shot = (t.to(torch.int64) for t in (geom.src_iy, geom.src_ix, geom.src_shot))
        nx2, plane = self.nx + 2 * RING, (self.ny + 2 * RING) * (self.nx + 2 * RING)
        at = shot * 2 * plane + chan * plane + (iy + RING) * nx2 + ix + RING
        order, at, ptr = _by_row(at, iy, self.ny)
        self.src = (ptr, at, (iy * self.nx + ix)[order].contiguous(), order)
        self.g_src = gm[chan]
        self.scale = prop.dt / (prop.grid.dy * prop.grid.dx)

    def steps(self, hi: int, n: int, t0: int, gtr: Tensor | None, t1: int) -> None:
        """Adjoint steps ``hi - 1`` down to ``hi - n`` (of the segment ``t0 .. t1-1``), with
        the traces' adjoints ``gtr`` ``(B, receivers, segment steps)`` (None: none).  Scaled:
        the adjoints come in unscaled at the segment's end (``hi == t1``) and leave unscaled at
        its start."""
        its = list(range(hi - 1, hi - n - 1, -1))
        ks = [it - t0 for it in its]
        addresses = lambda store: (ctypes.c_void_p * n)(*(store[k].data_ptr() for k in ks))
        values, keep = [], []  # keep: the tensors the kernel reads, alive until it returns
        for key in ("v", "s"):
            ptr, at, cols, factors = self.rec[key]
            if gtr is None or at.numel() == 0:  # no points: CSR offsets of 0
                values += [_ptr(self.no_points), _ptr(None), _ptr(None), ctypes.c_long(0)]
                continue
            # (steps, B, points): _record_adjoint's g[:, argsort(rec_order)] * factor
            g = gtr[:, self.inverse_order][:, :, ks].to(self.lv.dtype)
            val = (g[:, cols] * factors[None, :, None]).permute(2, 0, 1).contiguous()
            keep.append(val)
            values += [_ptr(ptr), _ptr(at), _ptr(val), ctypes.c_long(at.numel())]
        ptr, at, g_at, order = self.src
        if self.force:
            geom = self.prop.geom
            vals = torch.stack([geom.src_amp * (geom.wavelet[it] * self.scale) for it in its])
            src_val = vals[:, order].to(self.lv.dtype).contiguous()
        else:
            src_val = None
        keep.append(src_val)
        tail = (*values, _ptr(ptr), _ptr(at), _ptr(g_at), _ptr(src_val),
                ctypes.c_long(at.numel()), _ptr(self.g_src))
        head = (ctypes.c_long(self.b), ctypes.c_long(self.ny), ctypes.c_long(self.nx),
                ctypes.c_long(n))
        stores = (addresses(self.store_v), addresses(self.store_s))
        if self.layout is None:
            compact = (_ptr(None), ctypes.c_int(0), _ptr(None), ctypes.c_long(0), _ptr(None),
                       _ptr(None), _ptr(None))
        else:  # each step's velocities before it: the step before's, or the segment's start
            if self.drow.shape[0] < n:
                self.drow = self.lv.new_empty((n, 5, self.nx))
            before = [self.store_v[k - 1] if k > 0 else self.v0 for k in ks]
            compact = ((ctypes.c_void_p * n)(*(t.data_ptr() for t in before)),
                       *self.layout.args(), _ptr(self.drow), _ptr(self.graw[0]),
                       _ptr(self.graw[1]))
        flags = ((ctypes.c_int(int(hi == t1)), ctypes.c_int(int(hi - n == t0)))
                 if self.scaled else ())
        call = lambda j0, j1, done, ahead: self.kernel(
            *head, ctypes.c_long(j0), ctypes.c_long(j1), done, ahead, *self.fixed, *stores,
            *self.fields, *tail, *compact, *flags)
        parts = split_rows(n, self.threads)
        if len(parts) == 1:
            call(0, n, None, None)
        else:
            done = torch.full((len(parts),), -(1 << 40), dtype=torch.int64)
            marks = [ctypes.c_void_p(done.data_ptr() + done.element_size() * t)
                     for t in range(len(parts))]
            run_on_pool([functools.partial(call, j0, j1, marks[t], marks[t - 1] if t else None)
                         for t, (j0, j1) in enumerate(parts)])
        del keep


def run_passes(loop, t0: int, t1: int, lv: Tensor, ls: Tensor, lp: Tensor, store_v: Tensor,
               store_s: Tensor, gm: list[Tensor], gtr: Tensor | None, v0: Tensor | None,
               graw: Tensor | None, scaled: bool = False) -> None:
    """The adjoint steps ``t1 - 1`` down to ``t0`` of :meth:`FusedLoop.adjoint
    <odecli.pde.elastic.fused.FusedLoop.adjoint>` in passes of :func:`pass_length` steps (one
    rank, no free surface), the receivers' residuals and the point forces' gradient inside
    them; the unscaled adjoint's rings cleared after each pass (the steps do not read them;
    the scaled steps write none)."""
    steps = pass_length(len(loop.pieces), scaled)
    rings = _reused(loop.prop, "wrun", (steps, lv.shape[0], 2, 4, 8, loop.nx + 2 * WRING), lv)
    rings.fill_(float("nan"))  # zeroed by the kernel: a part it did not zero would show
    run = AdjointPass(loop, lv, ls, lp, store_v, store_s, gm, rings, len(loop.pieces), v0, graw,
                      scaled)
    hi = t1
    while hi > t0:
        n = min(steps, hi - t0)
        run.steps(hi, n, t0, gtr, t1)
        hi -= n
        if not scaled:
            loop._exchange_adjoint(lv, VELOCITY_IMAGE)
            loop._exchange_adjoint(ls, STRESS_IMAGE)
