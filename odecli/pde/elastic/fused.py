"""The elastic time loop on the fused C kernels (``elastic.c``): the reference's steps, bit for
bit, without a graph, and their hand-written adjoint.  The propagator runs the steps for a
forward without gradient and for each time segment's first pass of a forward with gradient;
a segment's backward (:meth:`FusedLoop.adjoint`) recomputes it storing five derivative fields
per step (on one rank without a free surface the compact stores instead, the new velocities
and the CPML layers' derivatives, from which the adjoint pass derives the five:
:class:`~odecli.pde.elastic.forward_pass.CompactStores`), then runs the adjoint steps back to
the segment's start.  On one rank without a free surface they run in passes over the rows
(:mod:`odecli.pde.elastic.adjoint_pass`), in scaled variables where the stiffness allows
(``elastic_adjoint_scaled.c``: the forward's rows with -dt, the CPML as a correction);
elsewhere each half step in two vectorised passes, the weighted derivative adjoints per point
into a ring of rows, then their gathers, with the halo exchange and the image between them
(``elastic_adjoint.c``; with the passes switched off, ``steps_per_pass = 0`` or
``adjoint_pass.STEPS = 0``, one rank's steps take ``elastic_adjoint_step`` or, on two threads,
``elastic_adjoint_split``).  The adjoint's
gradient equals autograd's through the reference to round-off (tests: 1e-12) and passes the
dot-product test.  On one rank the forward runs several steps per pass over the rows
(:mod:`odecli.pde.elastic.forward_pass`); on several ranks a forward without a graph takes
the same passes on blocks grown into the neighbours', one deep halo exchange a pass
(:mod:`odecli.pde.elastic.ranks_pass`); a gradient's runs there (and every run with
``steps_per_pass = 0``, or blocks too small to lend the deep halo) two half-step kernels per
step with the halo exchange and the free-surface image between them.  A backward's large
scratch tensors (stores, padded adjoints, memory variables) are reused across its segments; a segment's checkpoint keeps the
memory variables only in the layers (:class:`PackedPsi`).

Fields are kept here with their ghost ring (``(B, C, ny + 4, nx + 4)``) so that the halo
exchange (:func:`odecli.parallel.ops.fill_ring_`, in place) and the free-surface image write the
ring and the kernels read it; rows are shared out over the kernel threads
(:mod:`odecli.threads`).
"""

from __future__ import annotations

import ctypes
import time

import torch
from torch import Tensor

from odecli.parallel.ops import fill_ring_, fill_ring_adjoint_
from odecli.pde import native
from odecli.pde.elastic import adjoint_pass, ranks_pass
from odecli.pde.elastic.forward_pass import CompactStores, ringed, run_passes
from odecli.pde.elastic.reference import (
    N_PSI,
    RING,
    STRESS_IMAGE,
    VELOCITY_IMAGE,
    Materials,
    Profiles,
)

# cuda_loop takes the scratch helpers from here
from odecli.pde.elastic.scratch import (
    WRING,
    PackedPsi,
    _padded,
    _reused,
    _reused_fresh,
    _reused_zeroed,
    ringed_for_reading,
    zero_ring_,
    zeroed_pages,
)
from odecli.threads import run_on_pool, split_rows

_SUFFIX = {torch.float64: ("f64", ctypes.c_double), torch.float32: ("f32", ctypes.c_float)}


def native_available(t: Tensor) -> tuple[bool, str]:
    """Whether the fused kernels can run on tensors like ``t`` (and if not, why)."""
    return native.available("elastic", t)


def _ptr(t: Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() if t is not None else None)


def _mirror_top_(fp: Tensor, image) -> None:
    """The free-surface image (:func:`~odecli.pde.elastic.reference.mirror_top`) in place."""
    rows, signs = image
    for c, ((a, b), sign) in enumerate(zip(rows, signs)):
        fp[:, c, 0] = fp[:, c, a] * sign
        fp[:, c, 1] = fp[:, c, b] * sign


MIN_SPLIT_ROWS = 16  # rows each of the adjoint's two pieces needs (elastic_adjoint_split)
MIN_SWEEP_ROWS = 8  # rows the one-sweep adjoint step needs (elastic_adjoint_step)


def interior_columns(ax_int: Tensor, ax_half: Tensor) -> tuple[ctypes.c_long, ctypes.c_long]:
    """``[jlo, jhi)``: the one run of columns outside the x layers (both coefficients 0),
    where the kernels take their branch-free loop; ``(nx, nx)`` if there is none."""
    nx = ax_int.numel()
    free = ((ax_int == 0) & (ax_half == 0)).nonzero().flatten().tolist()
    if not free or free[-1] - free[0] + 1 != len(free):
        return ctypes.c_long(nx), ctypes.c_long(nx)
    return ctypes.c_long(free[0]), ctypes.c_long(free[-1] + 1)


class FusedLoop:
    """The C kernels bound to one forward's parameters and CPML coefficients."""

    # steps per pass of :func:`~odecli.pde.elastic.forward_pass.run_passes` on one rank (None:
    # its default); 0: the per-step path that the tests and benchmarks compare it with
    steps_per_pass: int | None = None
    # the gradient's stores as velocities and the layers' derivatives where the passes run
    # (forward_pass.CompactStores); False: the five derivative planes a step everywhere
    compact_stores: bool = True

    def __init__(self, prop, m: Materials, p: Profiles, threads: int) -> None:
        self.prop = prop
        like = m.by
        name, self.real = _SUFFIX[like.dtype]
        lib, why = native.load("elastic")
        if lib is None:
            raise RuntimeError(f"fused elastic kernels unavailable: {why}")
        self.velocity = getattr(lib, f"elastic_velocity_{name}")
        self.stress = getattr(lib, f"elastic_stress_{name}")
        self.velocity_adjoint = getattr(lib, f"elastic_velocity_adjoint_{name}")
        self.stress_adjoint = getattr(lib, f"elastic_stress_adjoint_{name}")
        self.velocity_gather = getattr(lib, f"elastic_velocity_gather_{name}")
        self.run_rows = getattr(lib, f"elastic_run_rows_{name}")
        self.stress_adjoint_sweep = getattr(lib, f"elastic_stress_adjoint_sweep_{name}")
        self.velocity_adjoint_sweep = getattr(lib, f"elastic_velocity_adjoint_sweep_{name}")
        self.stress_gather = getattr(lib, f"elastic_stress_gather_{name}")
        self.adjoint_step = getattr(lib, f"elastic_adjoint_step_{name}")
        self.adjoint_split = getattr(lib, f"elastic_adjoint_split_{name}")
        c = lambda t: t.detach().contiguous()
        self.mats = [c(m.by), c(m.bx), c(m.lam2mu), c(m.lam), c(m.mu_xy)]
        self.surface = None if m.surface is None else c(m.surface)
        self.pml = [c(t.reshape(-1)) for t in (p.ay_int, p.by_int, p.ay_half, p.by_half,
                                                p.ax_int, p.bx_int, p.ax_half, p.bx_half)]
        self.materials = m
        g = prop.grid
        self.scalars = (self.real(prop.dt), self.real(1.0 / g.dy), self.real(1.0 / g.dx),
                        *interior_columns(p.ax_int.reshape(-1), p.ax_half.reshape(-1)))
        self.ny, self.nx = like.shape
        self.pieces = split_rows(self.ny, threads)
        # the adjoint's gathers write the ringed rows
        self.ringed_pieces = split_rows(self.ny + 2 * RING, threads)
        # where the passes run both ways: the gradient's stores compact (CompactStores)
        compact = (self.compact_stores and prop.comm.size == 1 and not prop.free_surface_here
                   and self.steps_per_pass != 0 and self.ny >= MIN_SWEEP_ROWS
                   and adjoint_pass.pass_length(len(self.pieces)) > 0)
        self.compact = (CompactStores(p.ay_int, p.ay_half, self.scalars[3].value,
                                      self.scalars[4].value, self.nx) if compact else None)

    def _calls(self, kernel, first: Tensor, second: Tensor, psi: Tensor, fixed: list,
               store: Tensor | None = None, at: int = 0) -> list:
        """Kernel calls over shots and row pieces; ``fixed`` holds the string ``"store"``
        where the kernel takes the store of shot ``b`` (``store[b]``, or NULL)."""
        calls = []
        for b in range(first.shape[0]):
            row = [_ptr(None if store is None else store[b]) if t == "store" else _ptr(t)
                   for t in fixed]
            for r0, r1 in self.pieces:
                args = (ctypes.c_long(self.ny), ctypes.c_long(self.nx), ctypes.c_long(r0),
                        ctypes.c_long(r1), _ptr(first[b]), _ptr(second[b]), _ptr(psi[b]),
                        *row, *[_ptr(t) for t in self.pml], *self.scalars)
                calls.append(lambda args=args: kernel(*args))
        return calls

    def _receivers(self, vr: Tensor) -> None:
        """Flat indices into a shot's ringed fields of each local receiver's component(s), in
        the groups' order (:meth:`ElasticPropagator._record`'s): one gather per step instead
        of advanced indexing of strided views (1.3 ms per step for 100 receivers at 540^2)."""
        ny2, nx2 = vr.shape[-2:]
        plane = ny2 * nx2
        v_idx, p_idx = [], []
        for c, iy, ix in self.prop.rec_groups:
            flat = (iy + RING) * nx2 + (ix + RING)
            if c == "pressure":
                p_idx.append(flat)
                v_idx.append(None)
            else:
                v_idx.append(flat + (0 if c == "vy" else plane))
        self.rec_plan = (v_idx, p_idx, plane)

    def _record(self, vr: Tensor, sr: Tensor) -> Tensor:
        v_idx, p_idx, plane = self.rec_plan
        b = vr.shape[0]
        vf, sf = vr.view(b, -1), sr.view(b, -1)
        cols, k = [], 0
        for idx in v_idx:
            if idx is None:
                flat = p_idx[k]
                k += 1
                cols.append(-0.5 * (sf[:, flat] + sf[:, flat + plane]))
            else:
                cols.append(vf[:, idx])
        if not cols:
            return vr.new_zeros((b, 0))
        return torch.cat(cols, dim=1)[:, self.prop.rec_order]

    def store_shapes(self, steps: int, shots: int) -> tuple[tuple, tuple]:
        """The shapes of ``steps`` steps' stores: compact, or the five planes."""
        if self.compact is not None:
            return self.compact.shapes(steps, shots)
        return (steps, shots, 2, self.ny, self.nx), (steps, shots, 3, self.ny, self.nx)

    def store_step_bytes(self, shots: int, like: Tensor) -> int:
        """Bytes of one step's stores (:meth:`store_buffers`) for ``shots`` shots."""
        shapes = self.store_shapes(1, shots)
        return sum(int(torch.Size(t).numel()) for t in shapes) * like.element_size()

    def store_buffers(self, t0: int, t1: int, like: Tensor,
                      fresh: bool = False) -> tuple[Tensor, Tensor]:
        """The stores of steps ``t0 .. t1-1`` (for :meth:`run`), in the backward's reused
        buffers of the longest segment's size (so a segment stored by its first pass costs no
        memory the backward would not take anyway); ``fresh``: in new tensors of their own (a
        segment whose first pass keeps its stores, freed after its backward)."""
        prop, b, steps = self.prop, like.shape[0], t1 - t0
        if fresh:
            vshape, sshape = self.store_shapes(steps, b)
            return zeroed_pages(vshape, like), zeroed_pages(sshape, like)
        vshape, sshape = self.store_shapes(max(e - a for a, e in prop.segments), b)
        # compact: the velocities' ring stays 0 (the passes write inside)
        make = _reused_zeroed if self.compact is not None else _reused
        return (make(prop, "store_v", vshape, like)[:steps],
                _reused(prop, "store_s", sshape, like)[:steps])

    def run(self, t0: int, t1: int, v: Tensor, s: Tensor, psi: Tensor, own: bool = False,
            stores: tuple[Tensor, Tensor] | None = None, fields: bool = False,
            own_fields: bool = False):
        """Steps ``t0 .. t1-1`` from unringed ``(v, s, psi)``: the new ones and the traces.
        ``own``: ``psi`` may be overwritten (no graph keeps it).  ``stores``: ``(steps, B, 2,
        ny, nx)`` and ``(steps, B, 3, ny, nx)`` buffers for each step's corrected derivative
        sums that the adjoint reads (the velocity update's two, the stress update's three);
        then the new ``v`` and ``s`` are not returned (None) unless ``fields``.
        ``psi`` None: from zero memory variables, not returned (a forward without a graph).
        ``own_fields``: ``v`` and ``s`` may be overwritten too; where they are the inside of
        ringed tensors (:func:`~odecli.pde.elastic.forward_pass.ringed`), those are
        stepped in place instead of padded copies (a forward at 1040^2: 5 planes allocated
        and copied less)."""
        prop = self.prop
        # several ranks, a forward without a graph: passes on blocks grown into the
        # neighbours' (a gradient's first passes stay per step: ranks_pass.py says why)
        steps = (ranks_pass.pass_steps(prop, self.steps_per_pass)
                 if stores is None and psi is None else None)
        if steps is not None:
            v, s, traces = ranks_pass.RankPasses(self, steps).run(t0, t1, v, s, own_fields)
            return v, s, None, traces
        # a forward (or a first pass keeping its stores): the fields outlive it, in tensors of
        # their own, returned as views (one copy; _padded's scratch and a contiguous copy out
        # were two: 10 of 3 planes at 1040^2 took 60 ms of a 3.5 s gradient); the backward's
        # recomputation (stores alone): in the reused scratch
        recompute = stores is not None and not fields
        if not recompute:
            vr, sr = ringed(v, own_fields), ringed(s, own_fields)
        else:
            vr, sr = _padded(prop, "v", v), _padded(prop, "s", s)
        if psi is not None:
            psi = psi.contiguous() if own else psi.clone().contiguous()
        self._receivers(vr)
        inner = (slice(None), slice(None), slice(RING, -RING), slice(RING, -RING))
        # one rank: several steps per pass over the rows (a free surface needs 3 rows there)
        if prop.comm.size == 1 and self.steps_per_pass != 0 and self.ny >= 3:
            traces = run_passes(self, t0, t1, vr, sr, psi, stores, self.steps_per_pass)
            if recompute:
                return None, None, psi, traces
            return vr[inner], sr[inner], psi, traces  # views of their own tensors: no copies
        # otherwise each step's two half steps, with the halo exchange and the image between
        if psi is None:
            psi = v.new_zeros((v.shape[0], N_PSI, self.ny, self.nx))
        vel = self._calls(self.velocity, vr, sr, psi, [*self.mats[:2], "store"])
        st = self._calls(self.stress, vr, sr, psi, [*self.mats[2:], "store", self.surface])
        force = prop.source_type != "pressure"
        recs = []
        for it in range(t0, t1):
            if stores is not None:
                k = it - t0
                vel = self._calls(self.velocity, vr, sr, psi, [*self.mats[:2], "store"],
                                  stores[0][k])
                st = self._calls(self.stress, vr, sr, psi, [*self.mats[2:], "store",
                                                             self.surface], stores[1][k])
            self._exchange(sr, STRESS_IMAGE)
            run_on_pool(vel)
            if force:
                prop._inject(vr[inner], it, self.materials, in_place=True)
            self._exchange(vr, VELOCITY_IMAGE)
            run_on_pool(st)
            if not force:
                prop._inject(sr[inner], it, self.materials, in_place=True)
            recs.append(self._record(vr, sr))
        traces = (torch.stack(recs, dim=-1) if recs
                  else v.new_zeros((v.shape[0], prop.geom.nrec_local, 0)))
        if recompute:  # the adjoint's recomputation: the stores alone
            return None, None, psi, traces
        return vr[inner], sr[inner], psi, traces

    def adjoint(self, t0: int, t1: int, v: Tensor, s: Tensor | None,
                psi: Tensor | PackedPsi | None,
                grads, stored: tuple[Tensor, Tensor] | None = None) -> tuple:
        """The segment's hand-written adjoint: the steps ``t0 .. t1-1`` recomputed from their
        start ``(v, s, psi)`` storing each step's derivative sums, then run backward from the
        adjoints ``grads`` of the segment's outputs ``(v, s, psi, traces)``.  Returns the
        adjoints of ``(v, s, psi)`` at the start and the gradients of the staggered parameters
        ``(by, bx, lam2mu, lam, mu_xy, surface)`` (surface None without a free surface): summed
        over all segments, returned by the first segment's (``t0 == 0``), None by the others
        (the backward runs the segments last to first).  ``stored``: the segment's stores,
        written by its first pass (:meth:`store_buffers`): nothing to recompute, and of the
        start only ``v`` is read (with compact stores; ``s`` and ``psi`` may be None)."""
        prop = self.prop
        b = v.shape[0]
        ny, nx = self.ny, self.nx
        store_v, store_s = self.store_buffers(t0, t1, v) if stored is None else stored
        with torch.no_grad():
            # the recomputation's memory variables, then the adjoint's (below) in another
            # scratch tensor, which the next segment's backward gets back as gpsi and reuses
            # (none where the first pass kept the stores: nothing is recomputed)
            if stored is None:
                work = _reused_zeroed(prop, "psi", tuple(psi.shape), v)
                start = psi.into(work) if isinstance(psi, PackedPsi) else psi.clone()
                self.run(t0, t1, v, s, start, own=True, stores=(store_v, store_s))
        # None: an output that nothing used (the last segment's fields and memory variables:
        # _Segment does not have autograd make zeros of 13 planes, then copied here); the
        # first segment's backward finds its scratch made now, zeroed (_reused_fresh)
        gv, gs, gpsi, gtr = grads
        lv, ls = _padded(prop, "lv", gv, like=v), _padded(prop, "ls", gs, like=v, channels=3)
        lp, fresh = _reused_fresh(prop, "lp", (b, N_PSI, ny, nx), v)
        if gpsi is None:
            if not fresh:
                lp.zero_()
        elif gpsi.data_ptr() != lp.data_ptr():
            lp.copy_(gpsi)
        # The parameter gradients are summed over the segments here and returned once, by the
        # first segment's backward (the last to run): a fresh set per segment cost an
        # allocation and an autograd sum of five planes each.
        cache = prop.__dict__.setdefault("_scratch", {})
        if "gm" not in cache:
            # by, bx, lam2mu, lam, mu_xy in zeroed huge pages (as scratch._reused_fresh's)
            cache["gm"] = ([zeroed_pages(t.shape, t) for t in self.mats],
                           None if self.surface is None else torch.zeros_like(self.surface))
        gm, g_surface = cache["gm"]
        # compact stores: the buoyancy gradient's interior terms before their division by b
        graw = None
        if self.compact is not None:
            if "graw" not in cache:
                cache["graw"] = v.new_zeros((2, ny, nx))
            graw = cache["graw"]
        self._receivers(lv)
        force = prop.source_type != "pressure"
        geom = prop.geom
        pml = [_ptr(t) for t in self.pml]
        sc = self.scalars[:3]

        # one rank without a free surface: the steps in passes over the rows (adjoint_pass)
        passes = (adjoint_pass.pass_length(len(self.pieces)) > 0 and prop.comm.size == 1
                  and not prop.free_surface_here and ny >= MIN_SWEEP_ROWS)
        if not passes:
            w = _reused_zeroed(prop, "w", (4, ny + 2 * WRING, nx + 2 * WRING), v)  # ring stays 0
            ring = _reused(prop, "wring", (4, 8, nx + 2 * WRING), v)  # elastic.c zeroes it
            ring.fill_(float("nan"))  # so that a kernel reading what it did not zero shows
        jlo_jhi = self.scalars[3:]

        def two_passes(kernel, gather, both, out: Tensor, per_shot) -> None:
            """Per shot: ``kernel(ny, nx, r0, r1, *per_shot(shot), w, ...)`` over the row pieces,
            then ``gather(ny, nx, q0, q1, out[shot], w)`` over the ringed rows' pieces (on one
            thread ``both``: the two in one sweep)."""
            dims = (ctypes.c_long(ny), ctypes.c_long(nx))
            for shot in range(b):
                args = (*per_shot(shot), _ptr(w), *pml, *sc, *jlo_jhi)
                if len(self.pieces) == 1:  # one thread: both passes in one sweep, w in a ring
                    both(*dims, _ptr(out[shot]), *per_shot(shot), _ptr(ring), *pml, *sc,
                         *jlo_jhi)
                    continue
                run_on_pool([lambda r=r, a=args: kernel(*dims, ctypes.c_long(r[0]),
                                                        ctypes.c_long(r[1]), *a)
                             for r in self.pieces])
                o = _ptr(out[shot])
                run_on_pool([lambda r=r, o=o: gather(*dims, ctypes.c_long(r[0]),
                                                     ctypes.c_long(r[1]), o, _ptr(w))
                             for r in self.ringed_pieces])

        one_sweep = (not passes and len(self.pieces) == 1 and prop.comm.size == 1
                     and not prop.free_surface_here and ny >= MIN_SWEEP_ROWS)
        # two threads: elastic_adjoint_split (a piece each, then the rows around the cut)
        split = (not passes and len(self.pieces) == 2 and prop.comm.size == 1
                 and not prop.free_surface_here
                 and min(e - a for a, e in self.pieces) >= MIN_SPLIT_ROWS)
        if one_sweep or split:
            # rings of w's rows, zeroed by the kernels; NaN here (a few MB a segment) so that a
            # kernel reading a part it did not zero shows in the tests (a fresh allocation,
            # mostly zeros, hid one such bug in elastic_adjoint_split)
            ws = _reused(prop, "ws", (10 if split else 2, 4, 8, nx + 2 * WRING), v)
            ws.fill_(float("nan"))
            mats = [_ptr(t) for t in self.mats]
            grads_at = [_ptr(t) for t in gm]
            cut = ctypes.c_long(self.pieces[0][1])
        # compact stores: the adjoint in scaled variables where the stiffness allows
        # (adjoint_pass.scaled_ok; decided once a backward)
        if passes and self.compact is not None and "scaled" not in cache:
            cache["scaled"] = adjoint_pass.scaled_ok(*self.mats[2:])
        scaled = passes and self.compact is not None and cache["scaled"]
        if passes:
            # compact stores: the velocities before the segment's first step, ringed
            v0 = None if self.compact is None else ringed_for_reading(prop, "v0", v)
            adjoint_pass.run_passes(self, t0, t1, lv, ls, lp, store_v, store_s, gm, gtr, v0,
                                    graw, scaled)
        for it in range(t1 - 1, t0 - 1, -1) if not passes else ():
            k = it - t0
            if gtr is not None:
                self._record_adjoint(lv, ls, gtr[..., k])
            if one_sweep or split:  # both halves in one sweep over the rows
                for shot in range(b):
                    args = (_ptr(lv[shot]), _ptr(ls[shot]), _ptr(lp[shot]), *mats,
                            _ptr(store_v[k, shot]), _ptr(store_s[k, shot]), *grads_at)
                    tail = (*pml, *sc, *jlo_jhi)
                    dims = (ctypes.c_long(ny), ctypes.c_long(nx))
                    if one_sweep:
                        self.adjoint_step(*dims, *args, _ptr(ws[0]), _ptr(ws[1]), *tail)
                        continue
                    calls = [lambda n=n, a=args, t=tail, d=dims: self.adjoint_split(
                        *d, cut, ctypes.c_int(n), *a, _ptr(ws), *t) for n in range(3)]
                    run_on_pool(calls[:2])  # the two pieces at once, then the cut
                    calls[2]()
                self._exchange_adjoint(lv, VELOCITY_IMAGE)
                self._exchange_adjoint(ls, STRESS_IMAGE)
                if force and geom.has_sources:
                    self._source_gradient(lv, gm, it)
                continue
            two_passes(self.stress_adjoint, self.stress_gather, self.stress_adjoint_sweep,
                       lv, lambda shot, k=k: (
                _ptr(ls[shot]), _ptr(lp[shot]), *[_ptr(t) for t in self.mats[2:]],
                _ptr(self.surface), _ptr(store_s[k, shot]), _ptr(gm[2]), _ptr(gm[3]),
                _ptr(gm[4]), _ptr(g_surface)))
            self._exchange_adjoint(lv, VELOCITY_IMAGE)
            if force and geom.has_sources:
                self._source_gradient(lv, gm, it)
            two_passes(self.velocity_adjoint, self.velocity_gather, self.velocity_adjoint_sweep,
                       ls, lambda shot, k=k: (
                _ptr(lv[shot]), _ptr(lp[shot]), *[_ptr(t) for t in self.mats[:2]],
                _ptr(store_v[k, shot]), _ptr(gm[0]), _ptr(gm[1])))
            self._exchange_adjoint(ls, STRESS_IMAGE)
        inner = (slice(None), slice(None), slice(RING, -RING), slice(RING, -RING))
        out = [lv[inner], ls[inner], lp]  # the previous segment's gv, gs: padded in place
        if t0 == 0:  # the backward's last segment: the sums, and the scratch memory back
            if scaled:
                adjoint_pass.finish_scaled(self.mats, gm, graw, prop.dt)
            elif graw is not None:
                gm[0].add_(graw[0] / self.mats[0])
                gm[1].add_(graw[1] / self.mats[1])
            prop.__dict__.pop("_scratch", None)
            return (*out, *gm, g_surface)
        return (*out, *[None] * (len(gm) + 1))

    def _source_gradient(self, lv: Tensor, gm: list, it: int) -> None:
        """Add step ``it``'s point forces' part of the buoyancy gradient (the force is
        ``dt * b * amp * w / (dy dx)``), from the adjoint velocities ``lv`` after the step."""
        prop, geom = self.prop, self.prop.geom
        chan = 0 if prop.source_type == "fy" else 1
        scale = prop.dt / (prop.grid.dy * prop.grid.dx)
        vals = geom.src_amp * (geom.wavelet[it] * scale)
        lam_src = lv[geom.src_shot, chan, geom.src_iy + RING, geom.src_ix + RING]
        gm[chan].index_put_((geom.src_iy, geom.src_ix), vals * lam_src, accumulate=True)

    def _record_adjoint(self, lv: Tensor, ls: Tensor, g: Tensor) -> None:
        """Add the traces' adjoints ``g`` ``(B, local receivers)`` where they were recorded."""
        v_idx, p_idx, plane = self.rec_plan
        b = lv.shape[0]
        g = g[:, torch.argsort(self.prop.rec_order)]  # back into the groups' order
        vf, sf = lv.view(b, -1), ls.view(b, -1)
        start, k = 0, 0
        for idx in v_idx:
            if idx is None:
                flat = p_idx[k]
                k += 1
                part = g[:, start : start + flat.numel()] * -0.5
                sf.index_add_(1, flat, part)
                sf.index_add_(1, flat + plane, part)
                start += flat.numel()
            else:
                vf.index_add_(1, idx, g[:, start : start + idx.numel()])
                start += idx.numel()

    def _exchange_adjoint(self, lr: Tensor, image) -> None:
        """The adjoint of :meth:`_exchange`: the image folded back onto its rows, the ring's
        values sent to their owners, the ring cleared."""
        prop = self.prop
        if prop.free_surface_here:
            rows, signs = image
            for c, ((a, b), sign) in enumerate(zip(rows, signs)):
                lr[:, c, a] += lr[:, c, 0] * sign
                lr[:, c, b] += lr[:, c, 1] * sign
                lr[:, c, :RING] = 0
        if prop.comm.size > 1:
            start = time.perf_counter()
            fill_ring_adjoint_(lr, prop.decomp, prop.comm, RING)
            if prop.timer is not None:
                prop.timer.add(time.perf_counter() - start)
        zero_ring_(lr)

    def _exchange(self, fr: Tensor, image) -> None:
        prop = self.prop
        if prop.comm.size > 1:
            start = time.perf_counter()
            fill_ring_(fr, prop.decomp, prop.comm, RING)
            if prop.timer is not None:
                prop.timer.add(time.perf_counter() - start)
        if prop.free_surface_here:
            _mirror_top_(fr, image)
