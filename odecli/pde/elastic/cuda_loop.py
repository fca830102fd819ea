"""The elastic time loop on the CUDA kernels (``cuda_point.h``, :mod:`.cuda_build`): the fused
C loop's interface (:class:`~odecli.pde.elastic.fused.FusedLoop`: ``run``, ``adjoint``,
``store_buffers``), so the propagator's time segments, checkpoints and stored last segment
drive it unchanged, with the GPU's kernels in place of the C kernels.

A step is two launches over the grid (velocity, then stress, every shot in each) and small
launches for what the CPU's multi-rank path does in torch between them: the free-surface image
of the fields' ghost rows, the point sources, the receivers.  An adjoint step is four launches
over the grid, each half step's point pass (parameter gradients, memory variables' adjoints, the
weighted derivative adjoints into the scratch ``w``) and its gather (the transposed stencils,
one thread per ringed point: no atomics), each followed by the image folded back and the ring
cleared (``elastic_fold``), and small launches for the traces' adjoints and the point forces'
buoyancy gradient (one thread per cell they add into, its entries in order: no atomics either).
A segment's steps run as one C call (``cuda_steps.c``: each step's list of launches, with the
store, source-value and step arguments moved per step).

Why no torch and no Python per step: at 2000^2 a step of the kernels should take an H100 ~0.1-0.2
ms (~320 MB of memory traffic in float32; not yet measured), and with those parts as torch
operations in a Python loop the host spent 47 us a forward step (143 with a free surface) and
148 us a forward + adjoint step (385) before any launch (64^2 CPU tensors, a launcher that does
nothing); now the Python is a fixed cost per forward, ~2 us a step spread over 400 steps (~7
with the gradient), and a launch costs the driver's call.

Forward steps equal the PyTorch reference's bit for bit (same operations, same order, no
contraction); gradients equal autograd's through the reference to round-off (the tests' bound:
1e-12 relative in float64).  On the host build (:func:`~.cuda_build.host_launcher`) the same
loop runs on CPU tensors: the tests route the propagator's CUDA path there.

On several ranks (one GPU each) every half step's input has its ghost ring filled from the
neighbours first (the stresses before the velocity update, the velocities before the stress
update, as :meth:`FusedLoop._exchange`): a host step in the same list of launches
(:class:`~.cuda_build.Between`, :func:`~odecli.parallel.ops.fill_ring_` on the launches' stream),
before the free-surface image, so the traces equal one rank's bit for bit.  The adjoint's half
steps send their ring's adjoints to the owners (:func:`~odecli.parallel.ops.fill_ring_adjoint_`)
before the fold, which then clears the ring (the fold adds the image rows' adjoints into the
inner columns only, which the exchange's sums do not reach in another order but for round-off:
the image's corner cells have no adjoint, the stencils being crosses); the sources and receivers
are the rank's own, and the parameters' gradients are summed on its block (the propagator's
one-cell parameter halo takes them home).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from odecli.parallel.ops import fill_ring_, fill_ring_adjoint_
from odecli.pde.elastic.cuda_build import Between, Call, cuda_launcher
from odecli.pde.elastic.fused import PackedPsi, _padded, _reused, _reused_zeroed
from odecli.pde.elastic.reference import (
    RING,
    STRESS_IMAGE,
    VELOCITY_IMAGE,
    Materials,
    Profiles,
)
from odecli.pde.elastic.scratch import WRING  # cuda_point.h's w has the C kernels' ring


def launcher_for(like: Tensor, comm) -> tuple[object | None, str]:
    """The kernels' launcher for fields like ``like`` on this rank layout, or ``(None, why
    not)``: the GPU's kernels for CUDA tensors, on one rank or several (tests put the host build
    here).  ``comm``: the rank layout (the kernels run on any; kept for the callers' one
    signature)."""
    if like.device.type != "cuda":
        return None, f"the elastic CUDA kernels need CUDA tensors (got {like.device})"
    return cuda_launcher(like)


def _row(t: Tensor, k: int) -> int:
    """The address of ``t[k]`` (``t`` contiguous) without making a view."""
    return t.data_ptr() + k * t.stride(0) * t.element_size()


def _stride(t: Tensor) -> int:
    """Bytes from ``t[k]`` to ``t[k + 1]``."""
    return t.stride(0) * t.element_size()


def _cells(keys: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Entries grouped by the cell they add into: ``(order, cells, ptr)``, ``order`` the entries
    by cell (stable: the given order within a cell), ``cells`` the distinct keys, ``ptr`` the
    CSR offsets of each cell's entries in ``order``."""
    order = torch.sort(keys, stable=True).indices
    cells, counts = torch.unique_consecutive(keys[order], return_counts=True)
    ptr = torch.zeros(cells.numel() + 1, dtype=torch.int64, device=keys.device)
    ptr[1:] = torch.cumsum(counts, 0)
    return order, cells, ptr


class CudaLoop:
    """The CUDA kernels bound to one forward's parameters and CPML coefficients (the launcher is
    the propagator's ``cuda_launcher``).  FusedLoop's interface, not its subclass: nothing of
    the C loop's (whose helpers change with it) runs here."""

    def __init__(self, prop, m: Materials, p: Profiles, threads: int = 1) -> None:
        self.prop, self.launcher = prop, prop.cuda_launcher
        c = lambda t: t.detach().contiguous()
        self.mats = [c(m.by), c(m.bx), c(m.lam2mu), c(m.lam), c(m.mu_xy)]
        self.surface = None if m.surface is None else c(m.surface)
        self.materials = m
        names = ("ayi", "byi", "ayh", "byh", "axi", "bxi", "axh", "bxh")
        self.pml = dict(zip(names, (c(t.reshape(-1)) for t in (
            p.ay_int, p.by_int, p.ay_half, p.by_half, p.ax_int, p.bx_int, p.ax_half, p.bx_half))))
        g = prop.grid
        self.steps = {"dt": prop.dt, "idy": 1.0 / g.dy, "idx": 1.0 / g.dx}
        self.ny, self.nx = m.by.shape
        self.dtype = m.by.dtype

    def store_buffers(self, t0: int, t1: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """The stores of steps ``t0 .. t1-1`` (as :meth:`FusedLoop.store_buffers`: the
        backward's reused buffers of the longest segment's size)."""
        prop, b = self.prop, like.shape[0]
        longest = max(e - a for a, e in prop.segments)
        steps = t1 - t0
        return (_reused(prop, "store_v", (longest, b, 2, self.ny, self.nx), like)[:steps],
                _reused(prop, "store_s", (longest, b, 3, self.ny, self.nx), like)[:steps])

    def _call(self, entry: str, shots: int, **values) -> Call:
        extra = {} if entry.endswith("gather") else {**self.pml, **self.steps}
        return Call(entry, self.dtype, B=shots, ny=self.ny, nx=self.nx, **extra, **values)

    def _image(self, entry: str, f: Tensor, image, **values) -> Call:
        """The launch of ``elastic_image`` or ``elastic_fold`` on ringed ``f`` for ``image``
        (:data:`~odecli.pde.elastic.reference.STRESS_IMAGE` or ``VELOCITY_IMAGE``)."""
        b, c = f.shape[:2]
        rows, signs = image
        rows, signs = [*rows, (0, 0)][:3], [*signs, 0.0][:3]
        args = {f"r{k}{g}": rows[k][g] for k in range(3) for g in range(2)}
        args.update({f"s{k}": float(signs[k]) for k in range(3)})
        per = 2 * (self.nx + 4) if entry == "elastic_image" else self.nx + 4 + self.ny
        return Call(entry, self.dtype, threads=b * c * per, B=b, C=c, ny=self.ny, nx=self.nx,
                    f=f, **args, **values)

    def _sources(self, vr: Tensor, sr: Tensor) -> Call | None:
        """The launch adding a step's point sources (``values`` re-pointed per step to the
        row of :attr:`source_values`), with the values the reference's ``_inject`` adds."""
        prop, g = self.prop, self.prop.geom
        if not g.has_sources:
            return None
        b, rows, cols = vr.shape[0], vr.shape[-2], vr.shape[-1]
        plane = rows * cols
        order = torch.sort(g.src_shot, stable=True).indices
        shot, iy, ix = g.src_shot[order], g.src_iy[order], g.src_ix[order]
        scale = prop.dt / (prop.grid.dy * prop.grid.dx)
        values = g.src_amp[order][None, :] * (g.wavelet[:, None] * scale)  # as _inject's, per step
        at = (iy + RING) * cols + ix + RING
        if prop.source_type == "pressure":
            values, at, f, channels = -values, at + shot * 3 * plane, sr, 2
        else:
            chan = 0 if prop.source_type == "fy" else 1
            buoy = self.materials.by if chan == 0 else self.materials.bx
            values = values * buoy.detach()[iy, ix][None, :]
            at, f, channels = at + (shot * 2 + chan) * plane, vr, 1
        self.source_values = values.contiguous()
        ptr = torch.zeros(b + 1, dtype=torch.int64, device=vr.device)
        ptr[1:] = torch.cumsum(torch.bincount(shot, minlength=b), 0)
        return Call("elastic_source", self.dtype, threads=b, B=b, plane=plane, channels=channels,
                    f=f, ptr=ptr, at=at.to(torch.int64).contiguous(), values=self.source_values)

    def _receiver_call(self, vr: Tensor, sr: Tensor, traces: Tensor) -> Call | None:
        """The launch recording a step's receivers into ``traces`` ``(B, receivers, steps)``
        (``step`` set per step), in the receivers' order (the propagator's ``rec_order``)."""
        prop = self.prop
        b, rows, cols = vr.shape[0], vr.shape[-2], vr.shape[-1]
        plane = rows * cols
        nrec = traces.shape[1]
        if nrec == 0:
            return None
        at, kind = [], []
        for c, iy, ix in prop.rec_groups:
            flat = (iy + RING) * cols + ix + RING
            at.append(flat + (plane if c == "vx" else 0))
            kind.append(torch.full_like(flat, 1 if c == "pressure" else 0))
        at, kind = torch.cat(at), torch.cat(kind)
        column = torch.argsort(prop.rec_order)  # group entry q lands in column column[q]
        shots = torch.arange(b, device=at.device)[:, None]
        stride = torch.where(kind == 1, 3 * plane, 2 * plane)
        at_all = (shots * stride[None, :] + at[None, :]).reshape(-1)
        slot = (shots * nrec + column[None, :]).reshape(-1)
        return Call("elastic_receiver", self.dtype, threads=at_all.numel(), n=at_all.numel(),
                    plane=plane, v=vr, s=sr, at=at_all.to(torch.int64).contiguous(),
                    kind=kind.repeat(b).to(torch.int64).contiguous(),
                    slot=slot.to(torch.int64).contiguous(), traces=traces,
                    steps=traces.shape[-1], step=0)

    def run(self, t0: int, t1: int, v: Tensor, s: Tensor, psi: Tensor, own: bool = False,
            stores: tuple[Tensor, Tensor] | None = None, fields: bool = False):
        """As :meth:`FusedLoop.run`: steps ``t0 .. t1-1`` from unringed ``(v, s, psi)``."""
        prop = self.prop
        if stores is None:
            vr = torch.nn.functional.pad(v, (RING,) * 4).contiguous()
            sr = torch.nn.functional.pad(s, (RING,) * 4).contiguous()
        else:
            vr, sr = _padded(prop, "v", v), _padded(prop, "s", s)
        psi = psi.contiguous() if own else psi.clone().contiguous()
        b = v.shape[0]
        by, bx, lam2mu, lam, muxy = self.mats
        vel = self._call("elastic_velocity", b, v=vr, s=sr, psi=psi, buy=by, bux=bx, store=None)
        st = self._call("elastic_stress", b, v=vr, s=sr, psi=psi, lam2mu=lam2mu, lam=lam,
                        muxy=muxy, store=None, surface=self.surface)
        images = ((self._image("elastic_image", sr, STRESS_IMAGE),
                   self._image("elastic_image", vr, VELOCITY_IMAGE))
                  if prop.free_surface_here else None)
        force = prop.source_type != "pressure"
        sources = self._sources(vr, sr)
        traces = v.new_zeros((b, prop.geom.nrec_local, t1 - t0))
        receivers = self._receiver_call(vr, sr, traces)
        # one step's launches in order, and the arguments that move with the step (cuda_steps.c)
        calls: list[Call] = []
        moving: list[tuple[int, str, int, int]] = []

        def add(call: Call | None, *move: tuple[str, int, int]) -> None:
            if call is not None:
                calls.append(call)
                moving.extend((len(calls) - 1, *m) for m in move)

        store_moves = [[], []]
        if stores is not None:
            store_moves = [[("store", stores[h].data_ptr(), _stride(stores[h]))] for h in (0, 1)]
        source_move = () if sources is None else (
            ("values", _row(self.source_values, t0), _stride(self.source_values)),)
        add(self._exchange(sr, "stresses"))
        add(images[0] if images else None)
        add(vel, *store_moves[0])
        add(sources if force else None, *source_move)
        add(self._exchange(vr, "velocities"))
        add(images[1] if images else None)
        add(st, *store_moves[1])
        add(None if force else sources, *source_move)
        add(receivers, ("step", 0, 1))
        self.launcher.run(calls, t1 - t0, moving)
        inner = (slice(None), slice(None), slice(RING, -RING), slice(RING, -RING))
        if stores is not None and not fields:
            return None, None, psi, traces
        return vr[inner].contiguous(), sr[inner].contiguous(), psi, traces

    def _exchange(self, ringed: Tensor, what: str, adjoint: bool = False) -> Between | None:
        """On several ranks, the host step filling ``ringed``'s ghost ring from the neighbours
        (or, ``adjoint``, adding it into theirs and zeroing it), timed as the C loop's
        exchanges; None on one rank."""
        prop = self.prop
        if prop.comm.size == 1:
            return None
        fill = fill_ring_adjoint_ if adjoint else fill_ring_

        def exchange() -> None:
            start = time.perf_counter()
            fill(ringed, prop.decomp, prop.comm, RING)
            if prop.timer is not None:
                prop.timer.add(time.perf_counter() - start)

        return Between(f"{'adjoint ' if adjoint else ''}exchange of the {what}", exchange)

    def _receiver_adjoint(self, lv: Tensor, ls: Tensor, g: Tensor) -> Call | None:
        """The launch adding a step's traces' adjoints ``g`` ``(B, receivers, steps)`` (``step``
        set per step) where they were recorded (the adjoint of :meth:`_receiver_call`)."""
        prop = self.prop
        b, rows, cols = lv.shape[0], lv.shape[-2], lv.shape[-1]
        plane, nrec = rows * cols, g.shape[1]
        if nrec == 0:
            return None
        column = torch.argsort(prop.rec_order)
        target, which, src, coef, q = [], [], [], [], 0
        for c, iy, ix in prop.rec_groups:  # the groups' order: index_add_'s in _record_adjoint
            flat = (iy + RING) * cols + ix + RING
            cols_q = column[q : q + flat.numel()]
            q += flat.numel()
            parts = [(0, plane if c == "vx" else 0, 1.0)] if c != "pressure" else [
                (1, 0, -0.5), (1, plane, -0.5)]
            for buf, offset, k in parts:
                stride = (3 if buf else 2) * plane
                for shot in range(b):
                    target.append(shot * stride + offset + flat)
                    which.append(torch.full_like(flat, buf))
                    src.append(shot * nrec + cols_q)
                    coef.append(torch.full(flat.shape, k, dtype=g.dtype, device=g.device))
        target, which = torch.cat(target), torch.cat(which)
        # one key per cell of either field (ls's after lv's), so that a cell's entries meet
        order, cells, ptr = _cells(target * 2 + which)
        return Call("elastic_receiver_adjoint", self.dtype, threads=cells.numel(),
                    n=cells.numel(), lv=lv, ls=ls, at=(cells // 2).contiguous(),
                    which=(cells % 2).contiguous(), ptr=ptr,
                    src=torch.cat(src)[order].contiguous(), coef=torch.cat(coef)[order].contiguous(),
                    g=g, steps=g.shape[-1], step=0)

    def _source_gradient(self, lv: Tensor, gm: list) -> list[Call]:
        """The launch adding a step's point forces' part of the buoyancy gradient (``values``
        re-pointed per step to the row of :attr:`force_values`): ``amp * w * dt / (dy dx)``
        times the adjoint velocity at the force, into ``by`` or ``bx``'s gradient."""
        prop, g = self.prop, self.prop.geom
        if not g.has_sources:
            return []
        rows, cols = lv.shape[-2], lv.shape[-1]
        plane = rows * cols
        chan = 0 if prop.source_type == "fy" else 1
        order, cells, ptr = _cells(g.src_iy * self.nx + g.src_ix)
        scale = prop.dt / (prop.grid.dy * prop.grid.dx)
        values = g.src_amp[None, :] * (g.wavelet[:, None] * scale)  # as _inject's, per step
        self.force_values = values[:, order].contiguous()
        lam_at = (g.src_shot * 2 + chan) * plane + (g.src_iy + RING) * cols + g.src_ix + RING
        return [Call("elastic_source_gradient", self.dtype, threads=cells.numel(),
                     n=cells.numel(), grad=gm[chan], at=cells.contiguous(), ptr=ptr,
                     lam_at=lam_at[order].to(torch.int64).contiguous(),
                     values=self.force_values, lv=lv)]

    def adjoint(self, t0: int, t1: int, v: Tensor, s: Tensor, psi: Tensor | PackedPsi,
                grads, stored: tuple[Tensor, Tensor] | None = None) -> tuple:
        """As :meth:`FusedLoop.adjoint`: the segment recomputed storing each step's derivative
        sums (unless ``stored``), then run backward from ``grads``; the staggered parameters'
        gradients, summed over the segments, returned by the first segment's."""
        prop = self.prop
        b = v.shape[0]
        ny, nx = self.ny, self.nx
        store_v, store_s = self.store_buffers(t0, t1, v) if stored is None else stored
        with torch.no_grad():
            work = _reused_zeroed(prop, "psi", tuple(psi.shape), v)
            start = psi.into(work) if isinstance(psi, PackedPsi) else psi.clone()
            if stored is None:
                self.run(t0, t1, v, s, start, own=True, stores=(store_v, store_s))
        gv, gs, gpsi, gtr = grads
        pad = lambda g, like: torch.zeros_like(like) if g is None else g
        lv, ls = _padded(prop, "lv", pad(gv, v)), _padded(prop, "ls", pad(gs, s))
        lp = _reused(prop, "lp", tuple(psi.shape), v)
        if gpsi is None:
            lp.zero_()
        elif gpsi.data_ptr() != lp.data_ptr():
            lp.copy_(gpsi)
        cache = prop.__dict__.setdefault("_scratch", {})
        if "gm" not in cache:
            cache["gm"] = ([torch.zeros_like(t) for t in self.mats],  # by, bx, lam2mu, lam, mu_xy
                           None if self.surface is None else torch.zeros_like(self.surface))
        gm, g_surface = cache["gm"]
        force = prop.source_type != "pressure"
        residuals = None if gtr is None else self._receiver_adjoint(lv, ls, gtr.contiguous())
        forces = self._source_gradient(lv, gm) if force else None
        # the point passes' weighted derivative adjoints; its ring stays 0
        w = _reused_zeroed(prop, "w_cuda", (b, 4, ny + 2 * WRING, nx + 2 * WRING), v)
        by, bx, lam2mu, lam, muxy = self.mats
        stress_t = self._call("elastic_stress_adjoint", b, ls=ls, lp=lp, lam2mu=lam2mu, lam=lam,
                              muxy=muxy, surface=self.surface, store=None, g_lam2mu=gm[2],
                              g_lam=gm[3], g_muxy=gm[4], g_surface=g_surface, w=w)
        stress_g = self._call("elastic_stress_gather", b, lv=lv, w=w)
        velocity_t = self._call("elastic_velocity_adjoint", b, lv=lv, lp=lp, buy=by, bux=bx,
                                store=None, g_by=gm[0], g_bx=gm[1], w=w)
        velocity_g = self._call("elastic_velocity_gather", b, ls=ls, w=w)
        surface = int(prop.free_surface_here)
        fold_v = self._image("elastic_fold", lv, VELOCITY_IMAGE, surface=surface)
        fold_s = self._image("elastic_fold", ls, STRESS_IMAGE, surface=surface)
        # one adjoint step's launches (step t1-1 first, then back in time) and what moves
        last = t1 - 1 - t0
        calls = [c for c in (residuals, stress_t, stress_g, self._exchange(lv, "velocities", True),
                             fold_v, *(forces or ()), velocity_t, velocity_g,
                             self._exchange(ls, "stresses", True), fold_s) if c is not None]
        moving = [(calls.index(stress_t), "store", _row(store_s, last), -_stride(store_s)),
                  (calls.index(velocity_t), "store", _row(store_v, last), -_stride(store_v))]
        if residuals is not None:
            moving.append((0, "step", last, -1))
        for call in forces or ():
            values = self.force_values
            moving.append((calls.index(call), "values", _row(values, t1 - 1), -_stride(values)))
        self.launcher.run(calls, t1 - t0, moving)
        inner = (slice(None), slice(None), slice(RING, -RING), slice(RING, -RING))
        out = [lv[inner], ls[inner], lp]
        if t0 == 0:  # the backward's last segment: the sums, and the scratch memory back
            prop.__dict__.pop("_scratch", None)
            return (*out, *gm, g_surface)
        return (*out, *[None] * (len(gm) + 1))
