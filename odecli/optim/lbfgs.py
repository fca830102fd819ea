"""L-BFGS on a flat parameter vector: the one L-BFGS of every fit (ODE and PDE).

Hand-written rather than ``torch.optim.LBFGS`` or ``scipy.optimize`` because (1) the PDE fits'
parameters are blocks of a grid spread over MPI ranks, so every inner product of the two-loop
recursion and of the line search must be the distributed one of :class:`odecli.optim.space.Space`
(neither library lets one supply it), (2) a fit resumed from a checkpoint must continue bit for
bit, so the whole state (the correction pairs) is ours to save and load, and (3) an ODE fit
projects every trial point onto the box of its bounds.

The line search is a separate function (:func:`armijo_backtracking`) with a narrow signature:
issue 40's strong-Wolfe search is another function of that signature, passed as ``line_search``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from odecli.optim.bounds import Box
from odecli.optim.space import Space, Vector
from odecli.optim.step import Evaluate, Step

ARMIJO_C1 = 1e-4  # sufficient decrease: f_new <= f + c1 * (directional derivative along the step)

# (params, space, f, g, direction, g.direction, first trial length, evaluate, bounds, max trials)
#   -> (Step at the accepted point, the step taken) or (failed Step, None); params end at that point
LineSearch = Callable[[Vector, Space, float, Vector, Vector, float, float, Evaluate, "Box | None", int],
                      "tuple[Step, Vector | None]"]


@torch.no_grad()
def _move(params: Vector, origin: Vector, direction: Vector, t: float) -> None:
    for p, x, di in zip(params, origin, direction):
        p.copy_(x + di * t)


def armijo_backtracking(params: Vector, space: Space, f: float, g: Vector, d: Vector, gtd: float,
                        t: float, evaluate: Evaluate, bounds: Box | None,
                        max_trials: int) -> tuple[Step, Vector | None]:
    """Halve the step from ``t`` until the loss decreases sufficiently (Armijo), at most
    ``max_trials`` evaluations. With ``bounds``, every trial point is projected onto them and the
    decrease is measured along the projected step; a projected step that no longer moves ends the
    search. On failure the parameters are restored."""
    origin = [p.detach().clone() for p in params]
    for _ in range(max_trials):
        _move(params, origin, d, t)
        if bounds is None:
            decrease = t * gtd
        else:
            bounds.project_(params)
            if all(torch.equal(p, x) for p, x in zip(params, origin)):
                break
            decrease = space.dot(g, [p - x for p, x in zip(params, origin)])
        f_new, g_new = evaluate()
        if math.isfinite(f_new) and g_new is not None and f_new <= f + ARMIJO_C1 * decrease:
            taken = [di * t for di in d] if bounds is None else \
                [p.detach() - x for p, x in zip(params, origin)]
            return Step(ok=True, f=f_new, g=g_new), taken
        t *= 0.5
    with torch.no_grad():
        for p, x in zip(params, origin):
            p.copy_(x)
    return Step(ok=False), None


class LBFGS:
    """Limited-memory BFGS (two-loop recursion); ``step`` evaluates collectively.

    ``lr`` sets the first trial step of a steepest-descent iteration (the first, and any after the
    history is dropped): the largest component moves by ``lr``, capped at the full gradient step
    when ``max_first_step`` is 1."""

    kind = "lbfgs"

    def __init__(self, params: Vector, space: Space, lr: float, history: int = 10,
                 max_line_search: int = 12, bounds: Box | None = None,
                 max_first_step: float = math.inf,
                 line_search: LineSearch = armijo_backtracking) -> None:
        self.params, self.space, self.lr = params, space, lr
        self.history, self.max_line_search = history, max_line_search
        self.bounds, self.max_first_step, self.line_search = bounds, max_first_step, line_search
        self.s: list[Vector] = []
        self.y: list[Vector] = []

    def _direction(self, g: Vector) -> Vector:
        """-H g by the two-loop recursion over the kept pairs."""
        sp = self.space
        q = [-x for x in g]
        alphas = []
        rhos = [1.0 / sp.dot(y, s) for s, y in zip(self.s, self.y)]
        for s, y, rho in reversed(list(zip(self.s, self.y, rhos))):
            a = rho * sp.dot(s, q)
            alphas.append(a)
            q = [qi - a * yi for qi, yi in zip(q, y)]
        if self.s:
            s, y = self.s[-1], self.y[-1]
            gamma = sp.dot(s, y) / sp.dot(y, y)
            q = [qi * gamma for qi in q]
        for (s, y, rho), a in zip(zip(self.s, self.y, rhos), reversed(alphas)):
            b = rho * sp.dot(y, q)
            q = [qi + (a - b) * si for qi, si in zip(q, s)]
        return q

    def step(self, f: float, g: Vector, evaluate: Evaluate) -> Step:
        sp = self.space
        d = self._direction(g)
        gtd = sp.dot(g, d)
        if not self.s or gtd >= 0:  # no history, or not a descent direction: steepest descent
            self.s, self.y = [], []
            d = [-x for x in g]
            gtd = sp.dot(g, d)
            t = min(self.max_first_step, self.lr / max(sp.absmax(g), 1e-300))
        else:
            t = 1.0
        result, s = self.line_search(self.params, sp, f, g, d, gtd, t, evaluate, self.bounds,
                                     self.max_line_search)
        if not result.ok:
            return result
        y = [a - b for a, b in zip(result.g, g)]
        if sp.dot(y, s) > 1e-12 * max(sp.dot(y, y), 1e-300):  # keep only pairs of positive curvature
            self.s.append(s)
            self.y.append(y)
            if len(self.s) > self.history:
                self.s.pop(0)
                self.y.pop(0)
        return result

    def state_vectors(self) -> dict[str, Vector]:
        out = {}
        for i, (s, y) in enumerate(zip(self.s, self.y)):
            out[f"s{i}"] = s
            out[f"y{i}"] = y
        return out

    def state_scalars(self) -> dict:
        return {"n": len(self.s)}

    def load(self, vectors: dict[str, Vector], scalars: dict) -> None:
        n = int(scalars["n"])
        self.s = [vectors[f"s{i}"] for i in range(n)]
        self.y = [vectors[f"y{i}"] for i in range(n)]
