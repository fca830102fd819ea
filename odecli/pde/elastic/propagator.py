"""The elastic propagator on one rank's block: ``(vp, vs, rho)`` in, receiver traces out.

The scheme is :mod:`odecli.pde.elastic.reference`'s (velocity-stress, staggered, 4th order in
space, leapfrog in time, CPML on the absorbing sides, optional free surface on top).  Every step
exchanges a two-cell halo of the stresses before the velocity update and of the velocities before
the stress update (out of place and differentiable, :func:`odecli.parallel.ops.halo_exchange`);
the parameters' one-cell halo is exchanged once per forward (a forward without gradient on
the C kernels exchanges deep halos once per pass of several steps instead,
:mod:`odecli.pde.elastic.ranks_pass`).  Since every per-node number is a
function of the global node index and of the same neighbours, N ranks give the 1-rank traces
bit for bit.  On CPU the steps run on fused C kernels (:mod:`odecli.pde.elastic.fused`, bit for
bit the reference's) and the gradient on their hand-written adjoint; on CUDA devices (one per
rank) on the same loop's CUDA kernels (:mod:`odecli.pde.elastic.cuda_loop`); elsewhere (no
compiler, no NVRTC) autograd differentiates the PyTorch reference steps.
Either way the time loop is split into segments that the backward recomputes (:class:`_Segment`), so memory grows like one
state (13 fields) per segment plus one segment's store (5 fields a step on the fused path;
on one rank without a free surface the compact stores, the 2 velocities and the CPML layers'
derivatives, :class:`~odecli.pde.elastic.forward_pass.CompactStores`), not like ``nt``; on the
fused path the last segment's first pass writes its stores into that buffer and its
recomputation is skipped, and with compact stores the segments before it whose stores fit
the store budget (:func:`keep_from`: all that fit in a quarter of the memory available) keep
theirs too, and save no start of their own (nothing recomputes them).

Sources (one kind per run, ``source_type``): ``pressure`` (explosive: ``-dt * amp * w(t) /
(dy dx)`` added to both normal stresses, so a positive amplitude raises the pressure),
``fy``/``fx`` (a point force: ``dt * b * amp * w(t) / (dy dx)`` added to the velocity, ``b`` the
buoyancy there); receivers record ``vy``, ``vx`` or ``pressure = -(sxx + syy) / 2`` each, after
the step's stress update.  A source or receiver at node ``(i, j)`` uses ``vy[i, j]`` (at
``i + 1/2``), ``vx[i, j]`` (at ``j + 1/2``) or the stresses at ``(i, j)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from odecli.pde.elastic import cuda_loop, ranks_pass
from odecli.pde.elastic.equation import RECEIVER_COMPONENTS, stability_limit
from odecli.pde.elastic.forward_pass import materials_without_graph, ringed
from odecli.pde.elastic.fused import (
    FusedLoop,
    PackedPsi,
    native_available,
    zeroed_pages,
)
from odecli.pde.elastic.materials_grad import fill_edges_, materials_with_adjoint
from odecli.pde.elastic.pml import axis_coefficients
from odecli.pde.elastic.reference import (
    N_PSI,
    RING,
    STRESS_IMAGE,
    VELOCITY_IMAGE,
    Materials,
    Profiles,
    materials,
    mirror_top,
    stress_step,
    velocity_step,
)
from odecli.pde.grid import Block, Grid
from odecli.pde.segments import segment_bounds
from odecli.pde.sources import LocalGeometry
from odecli.pde.timing import CommTimer, timed_halo

HALO = RING
FIELDS = ("vy", "vx", "syy", "sxx", "sxy")
MIN_POINTS_PER_THREAD = 50_000  # the channels of ``forward(..., return_field=True)``


def _store_buffers(loop, prop, t0: int, t1: int, v: Tensor) -> tuple[Tensor, Tensor]:
    """A kept segment's stores: the last segment's in the backward's reused buffers (the CUDA
    loop keeps only those), the others' in their own."""
    if t1 == prop.nt:
        return loop.store_buffers(t0, t1, v)
    return loop.store_buffers(t0, t1, v, fresh=True)


class _Segment(torch.autograd.Function):
    """Steps ``t0 .. t1-1`` run without a graph; the backward recomputes them and runs the
    hand-written adjoint on the C kernels (:meth:`FusedLoop.adjoint`), or, off the fused path,
    recomputes them under autograd and backpropagates through that graph alone.

    Why not ``torch.utils.checkpoint`` (as heat2d uses): its recomputation starts when the
    backward first unpacks a tensor the segment saved, and autograd's order of ready nodes
    depends on each rank's graph (its sources and receivers), so one rank recomputed a segment
    (forward halo exchanges) while its neighbour was still in the previous segment's adjoint
    exchanges: mismatched messages on 1x2 ranks.  Here every rank runs segment by segment, and
    inside one segment the exchanges form a single chain."""

    @staticmethod
    def forward(ctx, prop, t0, t1, v, s, psi, *materials):
        ctx.prop, ctx.span = prop, (t0, t1)
        # an output nothing used (the last segment's fields and memory variables) gets None,
        # not zeros (13 planes made, then copied by the adjoint: 60 ms of a 3.5 s gradient
        # at 1040^2 float64); the reference path's backward makes them
        ctx.set_materialize_grads(False)
        ctx.has_surface = materials[-1] is not None
        mats = [m for m in materials if m is not None]
        if not prop.fused:
            ctx.save_for_backward(v, s, psi, *mats)
            with torch.no_grad():
                return prop._run_without_graph(t0, t1, v, s, psi, *materials)
        ctx.stored, ctx.before, ctx.startless = None, None, False
        kept = prop.store_last_segment and (t1 == prop.nt or t0 >= prop._keep_from)
        loop = (prop.loop_class(prop, Materials(*materials), prop._profiles, prop.threads)
                if kept else None)
        if kept and getattr(loop, "compact", None) is not None:
            # compact stores kept: the backward recomputes nothing, and of the segment's start
            # needs only the velocities before its first step (the adjoint's v0) -- the
            # previous segment's last store where that one kept its stores too, else a copy
            # -- so v, s and psi are stepped in place (no checkpoint: 5 planes and psi's layers)
            ctx.save_for_backward(*mats)
            ctx.startless = True
            before = prop._last_store
            with torch.no_grad():
                if before is None:
                    before = ringed(v.detach(), in_place=False)
                ctx.before = before
                ctx.stored = _store_buffers(loop, prop, t0, t1, v)
                out = loop.run(t0, t1, v, s, psi.contiguous(), own=True, stores=ctx.stored,
                               fields=True, own_fields=True)
            # v and s (the previous segment's outputs, the insides of ringed tensors) were
            # stepped in place through raw pointers, and the outputs are new views of them:
            # not marked dirty, which autograd refuses for views with several outputs, and
            # not needed, since nothing else reads them (the previous segment's backward
            # saves none of its outputs)
            prop._last_store = ctx.stored[0][-1]
        else:
            prop._last_store = None
            # the C kernels' backward: psi kept where it can be non-zero, updated in place
            ctx.packed = PackedPsi(psi.detach(), prop._profiles)
            ctx.save_for_backward(v, s, *mats)
            with torch.no_grad():
                if kept:
                    # the backward's first segment: its first pass writes the stores into the
                    # buffers that its recomputation would have filled (no more memory at the
                    # backward's peak), which it then skips; the segments before it that the
                    # store budget keeps (keep_from): into their own
                    ctx.stored = _store_buffers(loop, prop, t0, t1, v)
                    out = loop.run(t0, t1, v, s, psi.contiguous(), own=True,
                                   stores=ctx.stored, fields=True)
                else:
                    out = prop._run_without_graph(t0, t1, v, s, psi.contiguous(), *materials,
                                                  own=True)
        if out[2].data_ptr() == psi.data_ptr():
            ctx.mark_dirty(psi)
        return out

    @staticmethod
    def backward(ctx, *grads):
        prop = ctx.prop
        if prop.fused:
            if ctx.startless and ctx.stored is None:  # its stores freed by a first backward
                raise RuntimeError("elastic gradient: a second backward through the same "
                                   "forward (retain_graph) is not supported; run the forward "
                                   "again")
            if ctx.startless:  # compact stores kept: the velocities before, alone
                mats = list(ctx.saved_tensors)
                v, s, psi = ctx.before[..., RING:-RING, RING:-RING], None, None
            else:
                v, s, *mats = ctx.saved_tensors
                psi = ctx.packed
            if not ctx.has_surface:
                mats.append(None)
            loop = prop.loop_class(prop, Materials(*mats), prop._profiles, prop.threads)
            out = loop.adjoint(*ctx.span, v, s, psi, grads, stored=ctx.stored)
            ctx.stored = ctx.before = None
            return (None, None, None, *out)
        saved = [t.detach().requires_grad_(True) for t in ctx.saved_tensors]
        inputs = saved + ([] if ctx.has_surface else [None])
        with torch.enable_grad():
            outputs = ctx.prop._run(*ctx.span, *inputs)
        # zeros where autograd gave None: on several ranks every rank must backpropagate
        # through the same outputs (their halo exchanges pair up), whatever its receivers
        pairs = [(o, torch.zeros_like(o) if g is None else g) for o, g in zip(outputs, grads)
                 if o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        got = [t.grad for t in saved]
        if not ctx.has_surface:
            got.append(None)
        return (None, None, None, *got)


# The default store budget (keep_from), compact stores only (five planes a step would take
# twice the memory for the same steps): every step's stores that fit in a quarter of the
# memory available when the forward starts (MemAvailable).  A kept segment saves no start
# (_Segment), so keeping all costs less memory than the checkpoints it replaces plus half the
# steps' stores did before.  Measured at 1040^2 (1000^2 + 20-cell CPML), 100 steps in 10
# segments, two threads, elastic_bench's worker, same run, quiet 2-core VM: half the steps kept
# 1.20-1.28 s and 1.54 GB (float64), 0.68-0.69 s and 0.77 GB (float32); all kept 1.11-1.16 s
# and 2.13 GB, 0.62 s and 1.07 GB -- 0.46x Deepwave's peak (0.5x allowed).  The five planes
# kept within the same budget (shared by the ranks) were tried and not taken: writing them
# into fresh memory costs most of the recomputation they save, for 2.4x a compact step's
# memory -- 2 ranks at 2000^2, 50 steps: 3.52 -> 3.35-3.41 s (float64, 28 steps kept), 1.70 ->
# 1.45 s (float32, all); one rank with a free surface at 1040^2, 100 steps, one thread: 2.64
# -> 2.45 s, for ~4x the memory.  Compact stores there are the way.
STORE_MEMORY_FRACTION = 0.25


def available_memory() -> int:
    """Bytes of memory available now (``MemAvailable`` of /proc/meminfo; 0 where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def keep_from(segments: list[tuple[int, int]], step_bytes: int, budget: int | None,
              compact: bool) -> int:
    """The first step of the trailing segments whose first pass keeps its stores for the
    backward (their recomputation skipped), the last segment always (its stores lie in the
    buffers the recomputation would fill): the segments before it, last first, while their
    stores together take at most ``budget`` bytes (None: :data:`STORE_MEMORY_FRACTION` of the
    memory available, with compact stores; none with the five planes)."""
    if budget is None:
        budget = int(STORE_MEMORY_FRACTION * available_memory()) if compact else 0
    start = segments[-1][0]
    used = 0
    for t0, t1 in reversed(segments[:-1]):
        used += (t1 - t0) * step_bytes
        if used > budget:
            break
        start = t0
    return start


class ElasticPropagator:
    """The elastic equation's :class:`~odecli.pde.propagator.Propagator` (PyTorch reference
    steps under autograd, checkpointed by time segment)."""

    halo = HALO
    # the last time segment's first pass keeps its stores for the backward (False: recompute it
    # as the others; the tests compare the two)
    store_last_segment = True
    # bytes the first pass may keep of the segments before the last one's stores (their
    # recomputation skipped); None: keep_from's default rule
    store_budget: int | None = None
    _keep_from = 1 << 62  # the first step of the segments kept (set by forward)
    # the last velocity store of the segment just run forward, where it kept its compact stores
    # (the next segment's velocities before its first step; _Segment)
    _last_store: Tensor | None = None

    def __init__(self, grid: Grid, block: Block, decomp, comm, dt: float, nt: int,
                 geom: LocalGeometry, source_type: str, receiver_components: list[str],
                 free_surface: bool, pml_width: int, pml_frequency: float,
                 segments: int, pml_speed: float | None = None, timer: CommTimer | None = None,
                 dtype=torch.float64, device=None, fused: bool | None = None,
                 threads: int = 1) -> None:
        """``receiver_components``: one of :data:`RECEIVER_COMPONENTS` per *global* receiver.
        ``pml_speed``: the speed the CPML's damping is scaled to; None takes the largest ``vp``
        of the first forward (agreed over the ranks) and keeps it, so later models (an
        optimiser's iterates) see the same boundary and the gradient stays that of one
        function.  ``fused``: None runs the C kernels where they run (CPU, float32/64, a
        compiler), False never, True or raise.  ``threads``: kernel threads per rank."""
        self.grid, self.block, self.decomp, self.comm = grid, block, decomp, comm
        self.dt, self.nt, self.geom = dt, nt, geom
        self.segments = segment_bounds(nt, segments)
        # below ~50k points a piece costs less than handing it to another thread (acoustic's
        # measurement; the elastic step does more per point, so this is on the safe side)
        points = geom.nshots * block.shape[0] * block.shape[1]
        self.threads = max(1, min(threads, points // MIN_POINTS_PER_THREAD))
        like = torch.zeros(0, dtype=dtype, device=device)
        ok = native_available(like)[0] if fused is not False else False
        # on GPUs the CUDA kernels take the C kernels' place (cuda_loop.py), on any ranks
        self.cuda_launcher, self.cuda_why = cuda_loop.launcher_for(like, comm)
        self.loop_class = FusedLoop if self.cuda_launcher is None else cuda_loop.CudaLoop
        ok = ok or (self.cuda_launcher is not None and fused is not False)
        if fused and not ok:
            raise RuntimeError(f"fused elastic kernels unavailable: {native_available(like)[1]}")
        # every rank takes the same path (they exchange halos in the same pattern)
        if comm.size > 1:
            ok = comm.allreduce_scalar(1.0 if ok else 0.0, op="min") > 0
        self.fused = ok
        self.timer = timer
        self.dtype, self.device = dtype, device
        self.source_type = source_type
        self.free_surface_here = bool(free_surface) and block.y0 == 0
        self.free_surface = bool(free_surface)
        self.pml_width, self.pml_frequency = pml_width, pml_frequency
        self.pml_speed = pml_speed
        self._profiles: Profiles | None = None
        comps = [receiver_components[int(r)] for r in geom.rec_ids.tolist()]
        self.rec_groups = []
        order = []
        for c in RECEIVER_COMPONENTS:
            idx = [k for k, name in enumerate(comps) if name == c]
            if idx:
                sel = torch.tensor(idx, dtype=torch.long, device=device)
                self.rec_groups.append((c, geom.rec_iy[sel], geom.rec_ix[sel]))
                order += idx
        # traces come out grouped by component; this puts them back in the receivers' order
        self.rec_order = torch.argsort(torch.tensor(order, dtype=torch.long, device=device))

    def stability_limit(self) -> float:
        """Largest stable P-wave speed for this dt and grid."""
        return stability_limit(self.dt, self.grid.dy, self.grid.dx)

    def engine(self) -> str:
        """What runs the time loop, for result files and ``odecli stats``."""
        segs = len(self.segments)
        if self.fused and self.cuda_launcher is not None:
            return f"CUDA kernels and hand-written adjoint on {self.device}, {segs} time segment(s)"
        if self.fused:
            return (f"fused C kernels and hand-written adjoint, {self.threads} thread(s) per "
                    f"rank, {segs} time segment(s)")
        why = f" ({self.cuda_why})" if torch.device(self.device or "cpu").type == "cuda" else ""
        return f"PyTorch reference on {self.device}, {segs} time segment(s){why}"

    # -------------------------------------------------------------------------- set-up

    def profiles(self, vp: Tensor) -> Profiles:
        """The CPML coefficients (built on the first call: see ``pml_speed``)."""
        if self._profiles is None:
            speed = self.pml_speed
            if speed is None:
                speed = float(vp.detach().max())
                if self.comm.size > 1:
                    speed = self.comm.allreduce_scalar(speed, op="max")
            self.pml_speed = speed
            b = self.block
            self._profiles = self.profiles_over(b.y0, b.y1, b.x0, b.x1)
        return self._profiles

    def profiles_over(self, y0: int, y1: int, x0: int, x1: int) -> Profiles:
        """The CPML coefficients of the global rows ``y0 .. y1-1`` and columns ``x0 .. x1-1``
        (each node's a function of its global index alone: a rank's block grown into its
        neighbours' gets their numbers); ``pml_speed`` must be set (:meth:`profiles`)."""
        g, w = self.grid, self.pml_width
        common = {"width": w, "speed": self.pml_speed, "frequency": self.pml_frequency,
                  "dt": self.dt, "dtype": self.dtype, "device": self.device}
        ya = {"n": g.ny, "h": g.dy, "low": not self.free_surface, "high": True, "start": y0,
              "stop": y1}
        xa = {"n": g.nx, "h": g.dx, "low": True, "high": True, "start": x0, "stop": x1}
        ay_i, by_i = axis_coefficients(half=False, **ya, **common)
        ay_h, by_h = axis_coefficients(half=True, **ya, **common)
        ax_i, bx_i = axis_coefficients(half=False, **xa, **common)
        ax_h, bx_h = axis_coefficients(half=True, **xa, **common)
        col, row = (lambda t: t[:, None]), (lambda t: t[None, :])
        return Profiles(col(ay_i), col(by_i), col(ay_h), col(by_h),
                        row(ax_i), row(bx_i), row(ax_h), row(bx_h))

    def padded_parameters(self, coefficient: Tensor) -> Tensor:
        """``(3, ny + 2, nx + 2)``: the neighbours' values in the one-cell ring, the edge node's
        past the grid (y first, then x: the corner is the clamped global node)."""
        p = timed_halo(coefficient, self.decomp, self.comm, 1, 0.0, self.timer)
        # in place, a row or column each (a concatenation per side copied the planes); not
        # into the halo exchange's own output under autograd, which forbids that
        if p.requires_grad:
            p = p.clone()
        return fill_edges_(p, self._grid_sides())

    def _grid_sides(self) -> tuple[bool, bool, bool, bool]:
        """Whether the block's north, south, west, east sides are the grid's edges."""
        d = self.decomp
        return d.north is None, d.south is None, d.west is None, d.east is None

    # -------------------------------------------------------------------------- steps

    def _pad(self, f: Tensor, image) -> Tensor:
        fp = timed_halo(f, self.decomp, self.comm, RING, 0.0, self.timer)
        return mirror_top(fp, *image) if self.free_surface_here else fp

    def _record(self, v: Tensor, s: Tensor) -> Tensor:
        cols = []
        for c, iy, ix in self.rec_groups:
            if c == "vy":
                cols.append(v[:, 0, iy, ix])
            elif c == "vx":
                cols.append(v[:, 1, iy, ix])
            else:
                cols.append(-0.5 * (s[:, 0, iy, ix] + s[:, 1, iy, ix]))
        if not cols:
            return v.new_zeros((v.shape[0], 0))
        return torch.cat(cols, dim=1)[:, self.rec_order]

    def _inject(self, f: Tensor, it: int, m: Materials, in_place: bool = False) -> Tensor:
        g = self.geom
        put = f.index_put_ if in_place else f.index_put
        if not g.has_sources:
            return f
        scale = self.dt / (self.grid.dy * self.grid.dx)
        vals = g.src_amp * (g.wavelet[it] * scale)
        if self.source_type == "pressure":
            vals = -vals
            idx = (g.src_shot, g.src_iy, g.src_ix)
            f = put((g.src_shot, torch.zeros_like(g.src_iy)) + idx[1:], vals, accumulate=True)
            put = f.index_put_ if in_place else f.index_put
            return put((g.src_shot, torch.ones_like(g.src_iy)) + idx[1:], vals, accumulate=True)
        buoy = m.by if self.source_type == "fy" else m.bx
        chan = 0 if self.source_type == "fy" else 1
        vals = vals * buoy[g.src_iy, g.src_ix]
        return put((g.src_shot, torch.full_like(g.src_iy, chan), g.src_iy, g.src_ix), vals,
                   accumulate=True)

    def _run(self, t0: int, t1: int, v: Tensor, s: Tensor, psi: Tensor, by: Tensor,
             bx: Tensor, lam2mu: Tensor, lam: Tensor, mu_xy: Tensor, surface: Tensor | None):
        """Steps ``t0 .. t1-1`` (autograd records them)."""
        m = Materials(by, bx, lam2mu, lam, mu_xy, surface)
        p = self._profiles
        dt, dy, dx = self.dt, self.grid.dy, self.grid.dx
        force = self.source_type != "pressure"
        recs = []
        for it in range(t0, t1):
            v, psi_v = velocity_step(v, self._pad(s, STRESS_IMAGE), psi, m, p, dt, dy, dx)
            if force:
                v = self._inject(v, it, m)
            s, psi_s = stress_step(s, self._pad(v, VELOCITY_IMAGE), psi, m, p, dt, dy, dx)
            if not force:
                s = self._inject(s, it, m)
            psi = torch.cat([psi_v, psi_s], dim=1)
            recs.append(self._record(v, s))
        traces = (torch.stack(recs, dim=-1) if recs
                  else v.new_zeros((v.shape[0], self.geom.nrec_local, 0)))
        return v, s, psi, traces

    def _run_without_graph(self, t0: int, t1: int, v: Tensor, s: Tensor, psi: Tensor,
                           *materials, own: bool = False, own_fields: bool = False):
        """:meth:`_run` without a graph: on the fused C kernels where they run (``own``: the
        memory variables ``psi`` may be updated in place; ``own_fields``: ``v`` and ``s`` too,
        and ``psi`` may be None, :meth:`FusedLoop.run`)."""
        if not self.fused:
            return self._run(t0, t1, v, s, psi, *materials)
        loop = self.loop_class(self, Materials(*materials), self._profiles, self.threads)
        kwargs = {"own_fields": True} if own_fields else {}  # only the C loop takes it
        return loop.run(t0, t1, v, s, psi, own=own, **kwargs)

    def forward(self, coefficient: Tensor, return_field: bool = False):
        """Receiver traces ``(shots, local receivers, nt)`` for the block's ``(vp, vs, rho)``
        stacked ``(3, ny, nx)``; with ``return_field`` also the final fields
        ``(shots, 5, ny, nx)`` in the order of :data:`FIELDS`."""
        if coefficient.dim() != 3 or coefficient.shape[0] != 3:
            raise ValueError(f"elastic forward takes (vp, vs, rho) stacked (3, ny, nx), "
                             f"got {tuple(coefficient.shape)}")
        self.profiles(coefficient[0])
        graph = torch.is_grad_enabled() and coefficient.requires_grad
        # the C kernels without a graph: the parameters in one C pass, the memory variables in
        # the layers only and the fields stepped in place (forward_pass.py)
        c_loop = (self.fused and not graph and coefficient.device.type == "cpu"
                  and self.loop_class is FusedLoop)
        if graph and self.fused and self.loop_class is FusedLoop:  # materials_grad says why
            exchanged = timed_halo(coefficient, self.decomp, self.comm, 1, 0.0, self.timer)
            m = materials_with_adjoint(exchanged, self._grid_sides(), self.free_surface_here)
        else:
            pick = materials_without_graph if c_loop else materials
            m = pick(self.padded_parameters(coefficient), self.free_surface_here)
        b = self.geom.nshots
        ny, nx = coefficient.shape[-2:]
        # the insides of ringed tensors, which the C kernels without a graph step in place
        ring = (slice(None), slice(None), slice(RING, -RING), slice(RING, -RING))
        # on ranks, the passes' grown fields (ranks_pass.py), stepped in place
        grown = ranks_pass.grown_fields(self, coefficient, FusedLoop.steps_per_pass) \
            if c_loop else None
        # on the C kernels in zeroed huge pages (scratch.zeroed_pages: 13 planes of new_zeros
        # took 40 ms at 1040^2 float64, and the kernels' first writes their page faults)
        zeros = zeroed_pages if self.fused and self.loop_class is FusedLoop else (
            lambda shape, like: like.new_zeros(shape))
        if grown is not None:
            v, s = grown
        else:
            v = zeros((b, 2, ny + 2 * RING, nx + 2 * RING), coefficient.detach())[ring]
            s = zeros((b, 3, ny + 2 * RING, nx + 2 * RING), coefficient.detach())[ring]
        psi = None if c_loop else zeros((b, N_PSI, ny, nx), coefficient.detach())
        args = (m.by, m.bx, m.lam2mu, m.lam, m.mu_xy, m.surface)
        self.__dict__.pop("_scratch", None)  # an interrupted backward's sums (fused.FusedLoop)
        out = []
        # Segments bound the backward's memory; without a graph one run over all steps saves
        # each segment's padded copies of the fields (600^2, 60 steps: 8 runs -> 1).
        spans = self.segments if graph else [(0, self.nt)]
        if graph and self.fused and self.loop_class is FusedLoop and self.store_last_segment:
            loop = FusedLoop(self, m, self._profiles, self.threads)
            self._keep_from = keep_from(self.segments, loop.store_step_bytes(b, coefficient),
                                        self.store_budget, loop.compact is not None)
        self._last_store = None
        try:
            for t0, t1 in spans:
                if graph and (len(self.segments) > 1 or self.fused):
                    v, s, psi, tr = _Segment.apply(self, t0, t1, v, s, psi, *args)
                elif graph:
                    v, s, psi, tr = self._run(t0, t1, v, s, psi, *args)
                else:
                    with torch.no_grad():
                        v, s, psi, tr = self._run_without_graph(t0, t1, v, s, psi, *args,
                                                                own=True, own_fields=c_loop)
                out.append(tr)
        finally:
            self._last_store = None  # the backward holds what it needs
        traces = torch.cat(out, dim=-1)
        return (traces, torch.cat([v, s], dim=1)) if return_field else traces
