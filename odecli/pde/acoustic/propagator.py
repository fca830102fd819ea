"""2-D constant-density acoustic wave equation ``u_tt = c^2 lap(u) + f`` on a rank's block.

Leapfrog in time, 4th order in space (halo width 2; the fused path exchanges a deeper halo every
few steps, see :class:`~odecli.pde.acoustic.loop.Loop`), Cerjan sponge
(``u`` and ``u_prev`` multiplied by ``G = exp(-(alpha*(w-i))^2)`` in the outer ``w`` cells every
step), optional pressure-release free surface on top (no sponge there).  Shots are the batch
dimension; sources are added after the sponge, scaled by it.  Fields are stored with their ghost
ring (:mod:`odecli.pde.acoustic.reference`).  On CPU the time loop runs on fused C kernels with
a hand-written adjoint loop (:mod:`odecli.pde.acoustic.fused`), on each rank's GPU on CUDA kernels
with the same adjoint (:mod:`odecli.pde.acoustic.cuda_loop`); elsewhere autograd differentiates
the PyTorch reference step, with the time loop split into segments recomputed in the backward
pass (``torch.utils.checkpoint``).  Either way memory grows like sqrt(nt), not nt.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch
from torch.utils.checkpoint import checkpoint

from odecli.parallel.ops import GhostExchange, halo_exchange
from odecli.pde.acoustic import cuda_loop
from odecli.pde.acoustic.equation import stability_limit
from odecli.pde.acoustic.fused import propagate
from odecli.pde.acoustic.kernels import native_available, sponge_spans
from odecli.pde.acoustic.loop import Loop
from odecli.pde.acoustic.reference import RING, interior, reference_step
from odecli.pde.acoustic.workspace import Workspace
from odecli.pde.grid import Block, Grid
from odecli.pde.segments import segment_bounds
from odecli.pde.sources import Geometry, LocalGeometry
from odecli.pde.timing import CommTimer, timed_halo

HALO = RING
MIN_POINTS_PER_THREAD = 50_000  # grid points per step below which another kernel thread does not pay


def max_exchange_every(decomp) -> int:
    """The most steps between exchanges the blocks allow: ghosts ``RING * K`` deep come from the
    neighbour's own cells."""
    return max(1, min(decomp.min_local_shape) // RING)


class AcousticPropagator:
    """The acoustic equation's :class:`~odecli.pde.propagator.Propagator`: the fused C loop and
    its hand-written adjoint where they run, else the PyTorch reference under autograd."""

    halo = HALO

    def __init__(self, grid: Grid, block: Block, decomp, comm, dt: float, nt: int,
                 geom: LocalGeometry, sponge: torch.Tensor | None, segments: int,
                 timer: CommTimer | None = None, fused: bool | None = None,
                 threads: int = 1, exchange_every: int = 1,
                 geometry: Geometry | None = None, device: torch.device | None = None) -> None:
        """``fused``: None uses the C kernels where they run; False forces the PyTorch reference.
        ``threads``: at most how many threads the C kernels split each step over.
        ``exchange_every``: steps between halo exchanges on the fused path and the CUDA
        kernels (the reference path exchanges every step); above 1 it needs ``geometry``, the
        global one, for the sources in the extended block (see
        :class:`~odecli.pde.acoustic.loop.Loop`).
        ``device``: where the fields live, as :meth:`engine` names it (None: the sources')."""
        self.grid, self.block, self.decomp, self.comm = grid, block, decomp, comm
        self.dt, self.nt, self.geom, self.sponge = dt, nt, geom, sponge
        self.segments = segment_bounds(nt, segments)
        self.timer = timer
        self.fused = fused
        self.device = geom.src_amp.device if device is None else device
        # Below ~50k points a piece costs less than handing it to another thread.
        points = geom.nshots * block.shape[0] * block.shape[1]
        self.threads = max(1, min(threads, points // MIN_POINTS_PER_THREAD))
        # Sources are injected after the sponge, so they are damped like the field they join.
        self.src_gain = None if sponge is None else sponge[geom.src_iy, geom.src_ix]
        self.rgeom = geom.ringed(HALO)  # the same points, indexed into fields with their ring
        self.workspace = Workspace()
        self.cuda_loop: cuda_loop.CudaLoop | None = None  # the CUDA time loop, made on first use
        self.exchange_plans: dict = {}  # kept across calls: planning an exchange costs more than one
        self._setup_extension(exchange_every if comm.size > 1 else 1, geometry)
        on_cpu = self.ext_sponge is not None and self.ext_sponge.device.type == "cpu"
        self.spans = sponge_spans(self.ext_sponge) if on_cpu else None

    def _setup_extension(self, every: int, geometry: Geometry | None) -> None:
        """The block the fused path steps: the owned one, grown by ``RING * (every - 1)`` cells on
        each side with a neighbour, with its sponge (the neighbours' values, exchanged once),
        sources, and the ghost ring of its fields."""
        if every > max_exchange_every(self.decomp):
            raise ValueError(f"exchanging every {every} steps needs blocks of at least "
                             f"{RING * every} cells; the smallest is {self.decomp.min_local_shape}")
        d, g = self.decomp, self.geom
        self.every = every
        e = RING * (every - 1)
        self.ext = tuple(e if peer is not None else 0 for peer in (d.north, d.south, d.west, d.east))
        self.ring = tuple(RING + x for x in self.ext)
        self.ext_receivers = None
        if not e:
            self.ext_sponge, self.ext_geom, self.ext_src_gain = self.sponge, self.rgeom, self.src_gain
            return
        if geometry is None:
            raise ValueError("exchange_every > 1 needs the global geometry (sources near the edge)")
        b = self.block
        en, es, ew, ee = self.ext
        grown = Block(b.y0 - en, b.y1 + es, b.x0 - ew, b.x1 + ee)
        src = geometry.local(grown, g.src_amp.device, g.src_amp.dtype)
        self.ext_sponge = None if self.sponge is None else self.extend(self.sponge)
        self.ext_src_gain = None if self.ext_sponge is None else self.ext_sponge[src.src_iy, src.src_ix]
        rn, _, rw, _ = self.ring
        self.ext_receivers = (src.rec_ids, src.rec_iy + RING, src.rec_ix + RING)
        self.ext_geom = replace(g, src_shot=src.src_shot, src_amp=src.src_amp,
                                src_iy=src.src_iy + RING, src_ix=src.src_ix + RING,
                                rec_iy=g.rec_iy + rn, rec_ix=g.rec_ix + rw)

    def extend(self, field: torch.Tensor) -> torch.Tensor:
        """A block field ``(ny, nx)`` grown to the stepped block with the neighbours' values
        (the sponge, and ``c2dt2`` without a graph: its gradient stays on the owned block)."""
        e = RING * (self.every - 1)
        if not e:
            return field
        en, es, ew, ee = self.ext
        ny, nx = field.shape[-2:]
        padded = halo_exchange(field, self.decomp, self.comm, e)
        return padded[..., e - en : e + ny + es, e - ew : e + nx + ee].contiguous()

    def _stepped_c2dt2(self, c: torch.Tensor) -> torch.Tensor:
        """``c^2 dt^2`` on the stepped block, without a graph, in a buffer from the workspace that
        the propagation gives back (:func:`propagate`): the owned block computed in place, the
        extension filled by a planned exchange.  Why: :meth:`extend` pads, exchanges and copies
        out through three new arrays, and at 2000^2 on 2 ranks building ``c2dt2`` that way took
        6-15 ms of a 120 ms forward, page faults mostly."""
        en, es, ew, ee = self.ext
        ny, nx = c.shape
        shape = (ny + en + es, nx + ew + ee)
        stepped = self.workspace.take("speed", c, shape)
        with torch.no_grad():  # the same rounding as (c * c) * dt^2
            torch.mul(c, c, out=stepped[en : en + ny, ew : ew + nx]).mul_(self.dt * self.dt)
        if any(self.ext):
            key = ("extension", shape, c.dtype)
            if key not in self.exchange_plans:
                self.exchange_plans[key] = GhostExchange(shape, c.dtype, self.decomp, self.comm,
                                                         self.ext, (max(self.ext),))
            self.exchange_plans[key]([stepped])
        return stepped

    def _use_fused(self, like: torch.Tensor) -> bool:
        if self.fused is False:
            return False
        ok, why = native_available(like)
        if self.fused and not ok:
            raise RuntimeError(f"fused acoustic kernel unavailable: {why}")
        return ok

    def _fused_gradient_defined(self, c2dt2: torch.Tensor) -> bool:
        """Whether the fused adjoint can give the gradient: it divides by ``c2dt2``, so a wave
        speed of exactly 0 anywhere sends the evaluation to the reference path (on every rank,
        which must all take the same path).  Collective."""
        # counted in one pass without a mask: 2.5x faster than (c2dt2 == 0).any()
        zero_speed = float(int(c2dt2.count_nonzero()) < c2dt2.numel())
        if self.comm.size > 1:
            zero_speed = self.comm.allreduce_scalar(zero_speed, "max")
        return zero_speed == 0

    def _cuda_exchange(self):
        """The CUDA loop's exchange after each launch (timed as the other paths'), or None on
        one rank: ``RING * every`` ghosts of u (all the next launch reads) and the growth of
        u_prev (read pointwise), in one message per neighbour and phase, planned once per
        field shape."""
        if self.comm.size == 1:
            return None

        def exchange(u: torch.Tensor, u_prev: torch.Tensor) -> None:
            t0 = time.perf_counter()
            key = ("cuda", tuple(u.shape), u.dtype)
            if key not in self.exchange_plans:
                self.exchange_plans[key] = GhostExchange(
                    tuple(u.shape), u.dtype, self.decomp, self.comm, self.ring,
                    (HALO * self.every, HALO * (self.every - 1)))
            self.exchange_plans[key]([u, u_prev])
            if self.timer is not None:
                self.timer.add(time.perf_counter() - t0)
        return exchange

    def stability_limit(self) -> float:
        """Largest stable wave speed for this dt and grid."""
        return stability_limit(self.dt, self.grid.dy, self.grid.dx)

    def engine(self) -> str:
        """What runs the time loop, for result files and ``odecli stats``."""
        segs = len(self.segments)
        cuda, why = cuda_loop.launcher_for(self.geom.wavelet, self.comm)
        if cuda is not None and self.fused is not False:
            per_launch = cuda_loop.steps_a_launch(self.comm.size, self.every)
            exchange = (f", halo exchange every {per_launch} step(s)" if self.comm.size > 1
                        else "")
            return (f"fused CUDA kernels on {self.device}, {per_launch} step(s) a launch, "
                    f"{segs} time segment(s){exchange}")
        if self.fused:
            exchange = f", halo exchange every {self.every} steps" if self.every > 1 else ""
            return (f"fused C kernels, {self.threads} thread(s) per rank, "
                    f"{segs} time segment(s){exchange}")
        why = f" ({why})" if self.device.type == "cuda" else ""
        return f"PyTorch reference on {self.device}, {segs} time segment(s){why}"

    def _run(self, t0: int, t1: int, u_prev, u, c2dt2):
        """Reference steps ``t0 .. t1-1`` on ringed fields (autograd records them)."""
        g = self.rgeom
        dt2 = self.dt * self.dt
        recs = []
        for it in range(t0, t1):
            u_next = reference_step(u, u_prev, c2dt2, self.sponge, self.grid.dy, self.grid.dx)
            u_next = g.inject(u_next, dt2, it, self.src_gain)
            if self.comm.size > 1:
                # Filled here, while u_next is new: a field that crosses a checkpointed segment
                # boundary is never modified in place afterwards.
                u_next = timed_halo(u_next, self.decomp, self.comm, HALO, 0.0, self.timer,
                                    in_place=True)
            u_prev, u = u, u_next
            recs.append(g.record(u))
        traces = torch.stack(recs, dim=-1) if recs else u.new_zeros((u.shape[0], g.nrec_local, 0))
        return u_prev, u, traces

    def _reference(self, c2dt2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (self.geom.nshots, c2dt2.shape[0] + 2 * HALO, c2dt2.shape[1] + 2 * HALO)
        u_prev = c2dt2.new_zeros(shape).detach()
        u = c2dt2.new_zeros(shape).detach()
        out = []
        use_ckpt = torch.is_grad_enabled() and c2dt2.requires_grad and len(self.segments) > 1
        for t0, t1 in self.segments:
            if use_ckpt:
                u_prev, u, tr = checkpoint(
                    self._run, t0, t1, u_prev, u, c2dt2, use_reentrant=False,
                    preserve_rng_state=False,
                )
            else:
                u_prev, u, tr = self._run(t0, t1, u_prev, u, c2dt2)
            out.append(tr)
        return torch.cat(out, dim=-1), u

    def forward(self, c: torch.Tensor, return_field: bool = False):
        """Receiver traces ``(shots, nrec_local, nt)`` for local wave speed ``c`` (ny_l, nx_l).

        ``return_field`` also gives the final wavefield on the block (values: on the fused
        path no gradient flows through it).
        """
        cuda, _ = cuda_loop.launcher_for(c, self.comm)  # None off CUDA, or with the reason
        if cuda is not None and self.fused is not False and (
                not c.requires_grad or self._fused_gradient_defined(c)):  # it divides by c
            if self.cuda_loop is None or self.cuda_loop.launcher is not cuda:
                # on several ranks the grown block of exchange_every (Loop's scheme)
                self.cuda_loop = cuda_loop.CudaLoop(
                    cuda, self.segments, self.grid.dy, self.grid.dx, self.dt * self.dt,
                    self.ext_sponge, self.ext_geom, self.ext_src_gain,
                    cuda_loop.steps_a_launch(self.comm.size, self.every), self._cuda_exchange(),
                    self.ring, self.comm, self.ext_receivers)
            with torch.no_grad():  # c2dt2 on the grown block, as (c * c) * dt^2
                stepped = self.extend(torch.mul(c, c).mul_(self.dt * self.dt)).contiguous()
            traces, u = cuda_loop.propagate_cuda(self.cuda_loop, c, self.geom.nshots, return_field,
                                                 stepped)
            return (traces, u) if return_field else traces
        if self._use_fused(c):
            # the fused backward gives c's gradient itself (propagate), so c2dt2 needs no graph;
            # the owned block has the whole gradient (Loop.owned_gradient)
            stepped = self._stepped_c2dt2(c)
            if not c.requires_grad or self._fused_gradient_defined(stepped):
                loop = Loop(self.segments, self.grid.dy, self.grid.dx, self.dt * self.dt,
                            self.ext_sponge, self.spans, self.ext_geom, self.ext_src_gain,
                            self.decomp, self.comm, self.timer, self.workspace, self.threads,
                            self.every, self.ring, self.exchange_plans, self.ext_receivers)
                traces, u = propagate(loop, c, stepped, self.geom.nshots, return_field)
                if not return_field:
                    return traces
                rn, _, rw, _ = self.ring
                ny, nx = c.shape
                return traces, u[..., rn : rn + ny, rw : rw + nx]
            self.workspace.give("speed", stepped)
        traces, u = self._reference((c * c) * (self.dt * self.dt))
        u = interior(u)
        return (traces, u) if return_field else traces
