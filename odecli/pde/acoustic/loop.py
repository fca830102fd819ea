"""The plan of the fused acoustic time loop (:class:`Loop`): its time segments, the halo exchange
every K steps with the redundant steps on an extended block, the windows each step makes, and
how the owned block's gradient is read off the adjoint."""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field

from torch import Tensor

from odecli.parallel.ops import GhostExchange
from odecli.pde.acoustic.reference import RING
from odecli.pde.acoustic.workspace import Workspace
from odecli.pde.sources import LocalGeometry
from odecli.pde.timing import CommTimer


@dataclass
class Loop:
    """Everything the time loop needs besides ``c2dt2``.

    With ``every = K > 1`` on several ranks, neighbours exchange every K steps instead of every
    step: fields carry ``RING * K`` ghost cells on sides with a neighbour, and each rank steps
    its block extended by ``RING * (K - 1)`` cells there (``c2dt2``, the sponge and the sources
    cover the extension, and in the adjoint the receivers).  Each step spoils ``RING`` more
    cells from the outside in, so the owned block is exact after K steps, when the next
    exchange refreshes the ghosts of both time levels, packed in one message per neighbour;
    and each step makes only the cells it keeps exact (:meth:`windows`).  The redundant steps
    repeat the neighbour's arithmetic, so results are bit for bit those of exchanging every
    step.
    """

    segments: list[tuple[int, int]]
    dy: float
    dx: float
    dt2: float
    sponge: Tensor | None  # over the extended block
    spans: Tensor | None  # sponge_spans(sponge)
    geom: LocalGeometry  # indices into the ringed extended block: sources in it, receivers owned
    src_gain: Tensor | None
    decomp: object
    comm: object
    timer: CommTimer | None
    workspace: Workspace
    threads: int = 1  # the kernels split each step's rows over this many threads
    every: int = 1  # steps between halo exchanges
    ring: tuple[int, int, int, int] = (RING,) * 4  # ghost cells north, south, west, east of the owned block
    plans: dict = field(default_factory=dict)  # exchanges and strips planned per field shape
    # the receivers in the stepped block, (global ids, ringed rows, ringed columns), where it
    # extends into neighbours' blocks (None: the owned receivers of geom)
    adjoint_receivers: tuple[Tensor, Tensor, Tensor] | None = None

    @property
    def nt(self) -> int:
        return self.segments[-1][1]

    @property
    def extension(self) -> int:
        """Cells the stepped block reaches beyond the owned one, on sides with a neighbour."""
        return RING * (self.every - 1)

    def exchanges_after(self, k: int) -> bool:
        """Whether the neighbours exchange ghosts after step ``k`` (same answer on every rank)."""
        return self.comm.size > 1 and (k + 1) % self.every == 0

    def exchange(self, u_next: Tensor, u: Tensor) -> None:
        """Refresh the ghosts the next K steps read: all of u_next's and the extension of u (read
        as u_prev, pointwise)."""
        t0 = time.perf_counter()
        self._plan(u)([u_next, u])
        self._clock(t0)

    def owned_block(self, shape: tuple[int, int]) -> tuple[int, int, int, int] | None:
        """The owned block's rows ``[r0, r1)`` and columns ``[c0, c1)`` in the stepped block of
        ``shape`` (None: the whole of it, without an extension)."""
        if not self.extension:
            return None
        rn, rs, rw, re = (r - RING for r in self.ring)
        return rn, shape[0] - rs, rw, shape[1] - re

    def windows(self, positions: tuple[int, ...], shape: tuple[int, int]) -> ctypes.Array | None:
        """For steps ``positions[j]`` steps after the last exchange, the block rows and columns
        of the stepped block (``shape``) each makes, ``r0, r1, c0, c1`` per step (None: the
        whole block, without an extension).  Step m after an exchange needs exact values only
        ``RING * (K - 1 - m)`` cells beyond the owned block, as each step spoils ``RING`` more
        from the outside in; so it makes no more, and the redundant band costs half of what
        stepping the whole extension did.  Planned once per pass shape (kept in ``plans``)."""
        if not self.extension:
            return None
        key = ("windows", positions, shape)
        if key not in self.plans:
            ny, nx = shape
            sides = [r > RING for r in self.ring]  # north, south, west, east extended
            spans = []
            for m in positions:
                n_, s_, w_, e_ = (RING * m if extended else 0 for extended in sides)
                spans += [n_, ny - s_, w_, nx - e_]
            self.plans[key] = (ctypes.c_int64 * len(spans))(*spans)
        return self.plans[key]

    def owned_gradient(self, grad_sum: Tensor, speed: Tensor) -> Tensor:
        """The gradient of the owned block's wave speed ``c`` from the adjoint's
        ``sum mu * lap4(u)``, which it sums on the owned block only (``grad_sum`` covers the
        stepped block), in place: that sum divided by ``c``.  With
        ``c2dt2 = c^2 dt^2`` the gradient of ``c2dt2`` is ``sum / c2dt2`` (acoustic.c), so c's
        is ``2 c dt^2 sum / c2dt2 = 2 sum / c``, and the adjoint's sources carry the 2
        (_adjoint_sources): one pass over the block, where autograd through ``c2dt2`` took five,
        1.5-3 % of a float32 gradient at 1000^2.  The owned block has the whole gradient, because the
        adjoint's redundant steps repeat the neighbours' (the extension's terms are the
        neighbours' to sum), so nothing goes back to them.  Sending the extension's gradient
        home, as the exchange's own adjoint would, added zeros for 2.5-5 % of a 2-rank gradient
        at 2000^2.
        In place, because at 2000^2 a new array and a copy cost 3 % of a gradient."""
        rn, rs, rw, re = (r - RING for r in self.ring)
        ny, nx = grad_sum.shape
        return grad_sum[rn : ny - rs, rw : nx - re].div_(speed)

    def _plan(self, like: Tensor) -> GhostExchange:
        """The exchange of (u_next, u) for fields like ``like``, planned once."""
        key = (tuple(like.shape), like.dtype)
        if key not in self.plans:
            self.plans[key] = GhostExchange(tuple(like.shape), like.dtype, self.decomp, self.comm,
                                            self.ring, (RING * self.every, self.extension))
        return self.plans[key]

    def _clock(self, t0: float) -> None:
        if self.timer is not None:
            self.timer.add(time.perf_counter() - t0)
