"""L-BFGS on a flat parameter vector: the one L-BFGS of every fit (ODE and PDE).

Hand-written rather than ``torch.optim.LBFGS`` or ``scipy.optimize`` because (1) the PDE fits'
parameters are blocks of a grid spread over MPI ranks, so every inner product of the two-loop
recursion and of the line search must be the distributed one of :class:`odecli.optim.space.Space`
(neither library lets one supply it), (2) a fit resumed from a checkpoint must continue bit for
bit, so the whole state (the correction pairs) is ours to save and load, and (3) an ODE fit
projects every trial point onto the box of its bounds.

The line search is a separate function with a narrow signature: :func:`strong_wolfe` (the
default of the PDE fits: it extrapolates as well as backtracks, so the first step needs no tuning)
or :func:`armijo_backtracking` (halving only; it can project onto a :class:`Box`, which the ODE
fits need). :func:`strong_wolfe` runs torch's own search (``torch.optim.lbfgs._strong_wolfe``,
the one behind ``LBFGS(line_search_fn="strong_wolfe")``) on the one-dimensional function
``phi(t) = f(x + t d)``: the search sees only the loss and the directional derivative, which we
compute with the distributed dot product and which are the same on every rank, so the ranks take
the same decisions and the search needs no state between iterations (a resume stays bit for bit).

Scaling: with ``scales`` (one positive number per parameter: its natural range) the recursion runs
in the variables ``x / scale``, i.e. with the initial inverse Hessian ``diag(scale^2)``, so that a
wave speed of 2000 m/s and a conductivity of 3e-4 are moved alike. Without ``learning_rate`` the
first (steepest-descent) step moves the largest component by :data:`FIRST_STEP` of its scale.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from odecli.optim.bounds import Box
from odecli.optim.space import Space, Vector
from odecli.optim.step import Evaluate, Step

ARMIJO_C1 = 1e-4  # sufficient decrease: f_new <= f + c1 * (directional derivative along the step)
WOLFE_C2 = 0.9  # curvature: |phi'(t)| <= c2 |phi'(0)| (the usual quasi-Newton value)
FIRST_STEP = 0.05  # without learning_rate: a steepest-descent step moves by 5 % of the scale at most

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


def strong_wolfe(params: Vector, space: Space, f: float, g: Vector, d: Vector, gtd: float,
                 t: float, evaluate: Evaluate, bounds: Box | None,
                 max_trials: int) -> tuple[Step, Vector | None]:
    """Strong-Wolfe search from the trial length ``t`` along ``d`` (torch's bracketing and zoom
    with cubic interpolation), at most ``max_trials`` evaluations. Accepts a point of sufficient
    decrease (Armijo); otherwise the parameters are restored and the step fails. ``bounds`` are
    not supported (use :func:`armijo_backtracking`)."""
    from torch.optim.lbfgs import _strong_wolfe

    if bounds is not None:
        raise ValueError("strong_wolfe does not project onto bounds; use armijo_backtracking")
    origin = [p.detach().clone() for p in params]
    d_norm = space.absmax(d)
    if not (d_norm > 0 and math.isfinite(d_norm)) or gtd >= 0:
        return Step(ok=False), None
    tried: dict[float, tuple[float, Vector | None]] = {}
    unit = torch.tensor([d_norm], dtype=torch.float64)  # phi's "direction": |d|max, as torch's

    def phi(_x, t_trial, _d):
        t_trial = float(t_trial)
        _move(params, origin, d, t_trial)
        f_new, g_new = evaluate()
        tried[t_trial] = (f_new, g_new)
        if not math.isfinite(f_new) or g_new is None:  # a point that cannot be evaluated: steeply up
            return f + 1e3 * (abs(f) + abs(t_trial * gtd)) + 1.0, torch.tensor([-gtd / d_norm])
        slope = space.dot(g_new, d)
        return f_new, torch.tensor([slope / d_norm], dtype=torch.float64)

    _, _, t_new, _ = _strong_wolfe(phi, None, float(t), unit, f,
                                       torch.tensor([gtd / d_norm], dtype=torch.float64), gtd,
                                       c1=ARMIJO_C1, c2=WOLFE_C2, max_ls=max_trials)
    t_new = float(t_new)
    found = tried.get(t_new)
    if (t_new > 0 and found is not None and math.isfinite(found[0]) and found[1] is not None
            and found[0] <= f + ARMIJO_C1 * t_new * gtd and found[0] < f):
        _move(params, origin, d, t_new)
        return Step(ok=True, f=found[0], g=found[1]), [di * t_new for di in d]
    with torch.no_grad():
        for p, x in zip(params, origin):
            p.copy_(x)
    return Step(ok=False), None


class LBFGS:
    """Limited-memory BFGS (two-loop recursion); ``step`` evaluates collectively.

    ``lr`` sets the first trial step of a steepest-descent iteration (the first, and any after the
    history is dropped): the largest component moves by ``lr``, capped at the full gradient step
    when ``max_first_step`` is 1. ``lr`` None: it moves by :data:`FIRST_STEP` times its scale.
    ``scales``: one positive number per parameter (None: all 1), see the module's docstring.
    ``precondition``: a symmetric positive definite operator on (scaled) vectors, the initial
    inverse Hessian's shape (``gamma * P``; e.g. a smoothing of a grid unknown's gradient).
    ``last_first_step`` is the relative change (of the scale) the last steepest-descent trial
    asked for, for a stop's message."""

    kind = "lbfgs"

    def __init__(self, params: Vector, space: Space, lr: float | None, history: int = 10,
                 max_line_search: int = 12, bounds: Box | None = None,
                 max_first_step: float = math.inf,
                 line_search: LineSearch = armijo_backtracking,
                 scales: list[float] | None = None,
                 precondition: Callable[[Vector], Vector] | None = None) -> None:
        self.params, self.space, self.lr = params, space, lr
        self.history, self.max_line_search = history, max_line_search
        self.bounds, self.max_first_step, self.line_search = bounds, max_first_step, line_search
        self.scales = [1.0] * len(params) if scales is None else [float(c) for c in scales]
        self.last_first_step = math.nan
        self.precondition = precondition
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
        if self.precondition is not None:
            q = self.precondition(q)
        if self.s:
            s, y = self.s[-1], self.y[-1]
            py = y if self.precondition is None else self.precondition(y)
            gamma = sp.dot(s, y) / sp.dot(y, py)
            q = [qi * gamma for qi in q]
        for (s, y, rho), a in zip(zip(self.s, self.y, rhos), reversed(alphas)):
            b = rho * sp.dot(y, q)
            q = [qi + (a - b) * si for qi, si in zip(q, s)]
        return q

    def _scaled(self, v: Vector, power: int) -> Vector:
        """``v * scale**power`` part by part (power 1: a gradient into the scaled variables or a
        scaled direction back; -1: a step into the scaled variables)."""
        if all(c == 1.0 for c in self.scales):
            return v
        return [x * (c**power) for x, c in zip(v, self.scales)]

    def step(self, f: float, g: Vector, evaluate: Evaluate) -> Step:
        sp = self.space
        gs = self._scaled(g, 1)
        ds = self._direction(gs)
        gtd = sp.dot(gs, ds)
        if not self.s or gtd >= 0:  # no history, or not a descent direction: steepest descent
            self.s, self.y = [], []
            ds = [-x for x in (gs if self.precondition is None else self.precondition(gs))]
            gtd = sp.dot(gs, ds)
            d = self._scaled(ds, 1)
            if self.lr is None:  # the largest component moves by FIRST_STEP of its scale
                t = min(self.max_first_step, FIRST_STEP / max(sp.absmax(ds), 1e-300))
            else:
                t = min(self.max_first_step, self.lr / max(sp.absmax(d), 1e-300))
            self.last_first_step = t * sp.absmax(ds)
        else:
            d = self._scaled(ds, 1)
            t = 1.0
        result, taken = self.line_search(self.params, sp, f, g, d, gtd, t, evaluate, self.bounds,
                                         self.max_line_search)
        if not result.ok:
            return result
        s = self._scaled(taken, -1)
        y = self._scaled([a - b for a, b in zip(result.g, g)], 1)
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
