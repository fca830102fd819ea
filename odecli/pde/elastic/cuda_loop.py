"""The elastic time loop on the CUDA kernels (``cuda_point.h``, :mod:`.cuda_build`): the fused
C loop's interface (:class:`~odecli.pde.elastic.fused.FusedLoop`: ``run``, ``adjoint``,
``store_buffers``), so the propagator's time segments, checkpoints and stored last segment
drive it unchanged, with the GPU's kernels in place of the C kernels.

A step is two launches (velocity, then stress, every shot in each), with what lies between
them in torch, as on the CPU's multi-rank path: the free-surface image of the fields' ghost
rows, the point sources (``index_put_``) and the receivers (a gather), whose helpers it
inherits from ``FusedLoop``.  The adjoint step is four launches: each half step's point pass
(parameter gradients, memory variables' adjoints, the weighted derivative adjoints into the
scratch ``w``) and its gather (the transposed stencils, one thread per ringed point: no
atomics), the image folded back and the traces' adjoints added in torch.  Forward steps equal
the PyTorch reference's bit for bit (same operations, same order, no contraction); gradients
equal autograd's through the reference to round-off (the tests' bounds: 1e-12 relative in
float64).

On the host build (:func:`~.cuda_build.host_launcher`) the same loop runs on CPU tensors: the
tests route the propagator's CUDA path there.  One rank: several ranks (halo exchanges of
CUDA tensors between the half steps) keep the PyTorch reference, untested here without a GPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

from odecli.pde.elastic.cuda_build import Call, cuda_launcher
from odecli.pde.elastic.fused import (
    FusedLoop,
    PackedPsi,
    _padded,
    _reused,
    _reused_zeroed,
)
from odecli.pde.elastic.reference import (
    RING,
    STRESS_IMAGE,
    VELOCITY_IMAGE,
    Materials,
    Profiles,
)

WRING = 4  # the ring of the adjoint's scratch w (cuda_point.h), read two past the fields' ring


def launcher_for(like: Tensor, comm) -> tuple[object | None, str]:
    """The kernels' launcher for fields like ``like`` on this rank layout, or ``(None, why
    not)``: the GPU's kernels for CUDA tensors on one rank (tests put the host build here)."""
    if comm.size > 1:
        return None, ("the elastic CUDA kernels run on one rank: several ranks run the "
                      "PyTorch reference")
    if like.device.type != "cuda":
        return None, f"the elastic CUDA kernels need CUDA tensors (got {like.device})"
    return cuda_launcher(like)


class CudaLoop(FusedLoop):
    """The CUDA kernels bound to one forward's parameters and CPML coefficients (the launcher is
    the propagator's ``cuda_launcher``)."""

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

    def _call(self, entry: str, shots: int, **values) -> Call:
        extra = {} if entry.endswith("gather") else {**self.pml, **self.steps}
        return Call(entry, self.dtype, B=shots, ny=self.ny, nx=self.nx, **extra, **values)

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
        self._receivers(vr)
        b = v.shape[0]
        by, bx, lam2mu, lam, muxy = self.mats
        vel = self._call("elastic_velocity", b, v=vr, s=sr, psi=psi, buy=by, bux=bx, store=None)
        st = self._call("elastic_stress", b, v=vr, s=sr, psi=psi, lam2mu=lam2mu, lam=lam,
                        muxy=muxy, store=None, surface=self.surface)
        force = prop.source_type != "pressure"
        inner = (slice(None), slice(None), slice(RING, -RING), slice(RING, -RING))
        recs = []
        for it in range(t0, t1):
            if stores is not None:
                vel.set(store=stores[0][it - t0])
                st.set(store=stores[1][it - t0])
            self._exchange(sr, STRESS_IMAGE)
            self.launcher.launch(vel)
            if force:
                prop._inject(vr[inner], it, self.materials, in_place=True)
            self._exchange(vr, VELOCITY_IMAGE)
            self.launcher.launch(st)
            if not force:
                prop._inject(sr[inner], it, self.materials, in_place=True)
            recs.append(self._record(vr, sr))
        traces = (torch.stack(recs, dim=-1) if recs
                  else v.new_zeros((b, prop.geom.nrec_local, 0)))
        if stores is not None and not fields:
            return None, None, psi, traces
        return vr[inner].contiguous(), sr[inner].contiguous(), psi, traces

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
        self._receivers(lv)
        force = prop.source_type != "pressure"
        geom = prop.geom
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
        for it in range(t1 - 1, t0 - 1, -1):
            k = it - t0
            if gtr is not None:
                self._record_adjoint(lv, ls, gtr[..., k])
            stress_t.set(store=store_s[k])
            self.launcher.launch(stress_t)
            self.launcher.launch(stress_g)
            self._exchange_adjoint(lv, VELOCITY_IMAGE)
            if force and geom.has_sources:
                self._source_gradient(lv, gm, it)
            velocity_t.set(store=store_v[k])
            self.launcher.launch(velocity_t)
            self.launcher.launch(velocity_g)
            self._exchange_adjoint(ls, STRESS_IMAGE)
        inner = (slice(None), slice(None), slice(RING, -RING), slice(RING, -RING))
        out = [lv[inner], ls[inner], lp]
        if t0 == 0:  # the backward's last segment: the sums, and the scratch memory back
            prop.__dict__.pop("_scratch", None)
            return (*out, *gm, g_surface)
        return (*out, *[None] * (len(gm) + 1))
