"""Adam on a flat parameter vector: the one Adam of every fit (ODE and PDE).

Hand-written rather than ``torch.optim.Adam`` because (1) its arithmetic is part of the saved
state's contract: a fit resumed from a checkpoint must continue bit for bit, and the PDE fits'
results have been produced with exactly these operations in this order (``torch.optim.Adam``
rounds differently: ``lerp_``, ``addcdiv_``, bias corrections folded into the step), and (2) an
ODE fit projects every new point onto the box of its bounds, which ``torch.optim`` cannot.
Elementwise updates need no communication, so distributed parameters need nothing more.

Issue 40's scale-aware Adam belongs here: a different :meth:`Adam.step` on the same state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from odecli.optim.bounds import Box
from odecli.optim.space import Vector
from odecli.optim.step import Evaluate, Step


class Adam:
    """Adam (Kingma & Ba) with bias correction; moves ``params`` in place."""

    kind = "adam"

    def __init__(self, params: Vector, lr: float, betas: Sequence[float] = (0.9, 0.999),
                 eps: float = 1e-8, bounds: Box | None = None) -> None:
        self.params, self.lr, self.betas, self.eps, self.bounds = params, lr, tuple(betas), eps, bounds
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    @torch.no_grad()
    def step(self, f: float, g: Vector, evaluate: Evaluate) -> Step:
        """One update from the gradient ``g`` at the current point; the new point is not evaluated
        here (the loop evaluates it only when it needs its loss)."""
        b1, b2 = self.betas
        self.t += 1
        bc1 = 1.0 - b1**self.t
        bc2 = 1.0 - b2**self.t
        for p, gi, m, v in zip(self.params, g, self.m, self.v):
            m.mul_(b1).add_(gi * (1.0 - b1))
            v.mul_(b2).add_((gi * gi) * (1.0 - b2))
            p.sub_((m / bc1) / (torch.sqrt(v / bc2) + self.eps) * self.lr)
        if self.bounds is not None:
            self.bounds.project_(self.params)
        return Step(ok=True)

    def state_vectors(self) -> dict[str, Vector]:
        return {"m": self.m, "v": self.v}

    def state_scalars(self) -> dict:
        return {"t": self.t}

    def load(self, vectors: dict[str, Vector], scalars: dict) -> None:
        for dst, src in zip(self.m, vectors["m"]):
            dst.copy_(src)
        for dst, src in zip(self.v, vectors["v"]):
            dst.copy_(src)
        self.t = int(scalars["t"])
