"""Adam on a flat parameter vector: the one Adam of every fit (ODE and PDE).

Hand-written rather than ``torch.optim.Adam`` because (1) its arithmetic is part of the saved
state's contract: a fit resumed from a checkpoint must continue bit for bit, and the PDE fits'
results have been produced with exactly these operations in this order (``torch.optim.Adam``
rounds differently: ``lerp_``, ``addcdiv_``, bias corrections folded into the step), and (2) an
ODE fit projects every new point onto the box of its bounds, which ``torch.optim`` cannot.
Elementwise updates need no communication, so distributed parameters need nothing more.

Scale-aware: with ``scales`` (one positive number per parameter: its natural range, from its
bounds or its initial magnitude) each parameter's step is ``lr * scale``, so that one relative
``lr`` (:data:`DEFAULT_RELATIVE_LR` when the spec gives none) suits a wave speed of 2000 m/s and a
conductivity of 3e-4 alike. A schedule (:func:`schedule_factor`) multiplies the step by a factor
of the iteration only, so a resumed fit continues bit for bit.

Grid fields (the distributed parameters, given ``fields``): Adam's per-element denominator moves
every cell by about the same amount whatever its gradient, so cells the data barely see move as
much as those they see best; on a grid unknown that noise grew the heat2d model error 5x in 100
default steps (benchmarks/inverse_defaults_sweep.py). There the denominator is one number, the
field's largest ``sqrt(v)`` (over all ranks), so the step keeps the gradient's shape (a cell moves
in proportion to what the data say about it) and its largest cell moves by
:data:`DEFAULT_FIELD_LR` of the scale; and the gradient is first smoothed by ``precondition`` (the
grid smoothing L-BFGS's first inverse Hessian uses). Both only without a learning_rate: a given
one keeps the textbook update.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from odecli.optim.bounds import Box
from odecli.optim.space import Space, Vector
from odecli.optim.step import Evaluate, Step

DEFAULT_RELATIVE_LR = 0.02  # without learning_rate: a step is at most ~2 % of the scale
# ... and on a grid field (one denominator, the field's largest): its largest step is 5 % of the scale
DEFAULT_FIELD_LR = 0.05
SCHEDULES = ("none", "cosine", "step")
COSINE_FLOOR = 0.05  # cosine decay ends at 5 % of the step, not at 0
STEP_DROPS = 4  # step decay: the step halves STEP_DROPS - 1 times, in equal stretches


def schedule_factor(schedule: str, t: int, total: int) -> float:
    """The step's factor at iteration ``t`` (from 1) of ``total``: 1 (none), a cosine from 1 down
    to :data:`COSINE_FLOOR`, or halving in :data:`STEP_DROPS` equal stretches (step)."""
    if schedule == "none" or total <= 1:
        return 1.0
    x = min(max((t - 1) / (total - 1), 0.0), 1.0)
    if schedule == "cosine":
        return COSINE_FLOOR + (1.0 - COSINE_FLOOR) * 0.5 * (1.0 + math.cos(math.pi * x))
    if schedule == "step":
        return 0.5 ** min(int(x * STEP_DROPS), STEP_DROPS - 1)
    raise ValueError(f"unknown schedule {schedule!r}")


class Adam:
    """Adam (Kingma & Ba) with bias correction; moves ``params`` in place.

    ``lr`` None: :data:`DEFAULT_RELATIVE_LR` (:data:`DEFAULT_FIELD_LR` for a grid field).
    ``scales`` None: every scale is 1 (``lr`` absolute). ``fields``: the space whose distributed
    parameters are grid fields (one denominator each, see the module's docstring);
    ``precondition``: a smoothing applied to the gradient first."""

    kind = "adam"

    def __init__(self, params: Vector, lr: float | None, betas: Sequence[float] = (0.9, 0.999),
                 eps: float = 1e-8, bounds: Box | None = None, scales: list[float] | None = None,
                 schedule: str = "none", total: int = 1,
                 precondition: Callable[[Vector], Vector] | None = None,
                 fields: Space | None = None) -> None:
        self.params, self.betas, self.eps, self.bounds = params, tuple(betas), eps, bounds
        self.lr = DEFAULT_RELATIVE_LR if lr is None else lr
        self.field_lr = DEFAULT_FIELD_LR if lr is None else lr
        self.scales = [1.0] * len(params) if scales is None else [float(c) for c in scales]
        self.schedule, self.total = schedule, total
        self.precondition = precondition
        # each grid field's own space, for its largest denominator over the ranks
        self.field_spaces = [None] * len(params) if fields is None else [
            Space(fields.comm, [True]) if dist else None for dist in fields.distributed]
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
        factor = schedule_factor(self.schedule, self.t, self.total)
        if self.precondition is not None:
            g = self.precondition(list(g))
        for p, gi, m, v, c, field in zip(self.params, g, self.m, self.v, self.scales, self.field_spaces):
            m.mul_(b1).add_(gi * (1.0 - b1))
            v.mul_(b2).add_((gi * gi) * (1.0 - b2))
            if field is not None:  # a grid field: one denominator, its largest over the field
                denom = math.sqrt(field.absmax([v]) / bc2) + self.eps
                lr = self.field_lr * factor
            else:
                denom = torch.sqrt(v / bc2) + self.eps
                lr = self.lr * factor
            p.sub_((m / bc1) / denom * (lr * c if c != 1.0 else lr))
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
