"""Rodas-family Rosenbrock (linearly implicit) methods, batched with per-sample Jacobians.

Methods registered (names usable wherever ``method`` is):

* ``rodas5``  – Di Marzo (1993) Rodas5: 8 stages, order 5, embedded order 4, L-stable and
  stiffly accurate, 4th-order continuous extension (coefficients as published with
  OrdinaryDiffEq.jl's Rodas5, i.e. Hairer & Wanner's Rodas formulation).
* ``rodas5p`` – Steinebach (2023) Rodas5P: same structure, more robust order conditions for
  the dense output and for inexact/stiff limits (index-1 DAEs, Prothero–Robinson).
* ``rodas4``  – Hairer & Wanner's RODAS (Solving ODEs II, §VI.4): 6 stages, order 4(3),
  L-stable, 3rd-order continuous extension.

Every stage solves ``(I/(γh) − J) k_i = f(t + c_i h, y + Σ a_ij k_j) + Σ (C_ij/h) k_j + h d_i f_t``
with one LU of ``W = I/(γh) − J`` per step; ``y1 = y + Σ b_j k_j`` and the error estimate is the
last increment ``k_s`` (stiffly accurate: the embedded solution is ``y1 − k_s``).

Jacobian and LU policy. Rosenbrock methods need the exact Jacobian at the step's start for their
order, so J (and ``f_t`` for non-autonomous problems) is evaluated once per *accepted* step, per
sample. A rejected step restarts from the same (t, y), so its J is kept (``retry_state``) and only
W is refactored for the smaller h. The RHS is bound to the whole working set, so the autograd
Jacobian is computed for all rows when any row needs it, but only the rows that need it take
it and count it: each sample's arithmetic and statistics are those of a solo solve.
Statistics: ``n_jac_evals``, ``n_lu_decomps`` per sample; ``n_newton_iters`` is always 0 here
(no Newton iteration in a linearly implicit method). ``n_f_evals`` counts 8 (rodas5/5p) or 6
(rodas4) evaluations per step, plus one per Jacobian (the forward pass autograd differentiates).

Dense output: the methods' own continuous extension
``y(θ) = (1−θ) y0 + θ (y1 + (1−θ)(K1 + θ (K2 + θ K3)))`` with ``K_r = Σ h_rj k_j`` (no extra
evaluations).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from odecli.ode.implicit.linalg import jacobian, lu_factor, lu_solve
from odecli.ode.interpolation import Interpolant
from odecli.ode.stages import rms_error_norm, weighted_sum
from odecli.ode.stepper import StepResult, TableauProperties

COUNTERS = ("n_jac_evals", "n_lu_decomps", "n_newton_iters")


@dataclass(frozen=True)
class RodasTableau:
    """Coefficients in Hairer & Wanner's Rodas (increment) formulation, s stages, all 0-based.

    ``a[i]`` / ``C[i]``: coefficients of stage i on increments 0..i-1; ``c``: stage times;
    ``d``: multipliers of ``h f_t``; ``b``: solution weights; ``H[r]``: dense-output weights.
    """

    name: str
    order: int
    error_order: int
    gamma: float
    a: tuple[tuple[float, ...], ...]
    C: tuple[tuple[float, ...], ...]
    c: tuple[float, ...]
    d: tuple[float, ...]
    b: tuple[float, ...]
    H: tuple[tuple[float, ...], ...]
    description: str = ""

    @property
    def stages(self) -> int:
        return len(self.c)


def _complete(a_rows: list[list[float]], n_stages: int) -> tuple[tuple[tuple[float, ...], ...], tuple[float, ...]]:
    """Extend the explicitly given ``a`` rows: every later stage starts where the previous one ended
    (``u_i = u_{i-1} + k_{i-1}``), and so does the solution (``y1 = u_s + k_s``)."""
    rows = [tuple(r) for r in a_rows]
    while len(rows) < n_stages:
        prev = list(rows[-1]) + [0.0] * (len(rows) - len(rows[-1]))
        prev[len(rows) - 1] += 1.0
        rows.append(tuple(prev))
    last = list(rows[-1]) + [0.0]
    last[n_stages - 1] += 1.0
    return tuple(rows), tuple(last)


def _tableau(name, order, error_order, gamma, a_rows, C_rows, c, d, H, description) -> RodasTableau:
    s = len(C_rows)
    a, b = _complete(a_rows, s)
    c = tuple(c) + (1.0,) * (s - len(c))
    d = tuple(d) + (0.0,) * (s - len(d))
    H = tuple(tuple(r) + (0.0,) * (s - len(r)) for r in H)
    return RodasTableau(name, order, error_order, gamma, a, tuple(tuple(r) for r in C_rows), c, d, b, H, description)


# Rodas5, Di Marzo (1993); Hairer & Wanner formulation with 4th-order dense output.
RODAS5 = _tableau(
    "rodas5", 5, 4, 0.19,
    a_rows=[
        [],
        [2.0],
        [3.040894194418781, 1.041747909077569],
        [2.576417536461461, 1.622083060776640, -0.9089668560264532],
        [2.760842080225597, 1.446624659844071, -0.3036980084553738, 0.2877498600325443],
        [-14.09640773051259, 6.925207756232704, -41.47510893210728, 2.343771018586405, 24.13215229196062],
    ],
    C_rows=[
        [],
        [-10.31323885133993],
        [-21.04823117650003, -7.234992135176716],
        [32.22751541853323, -4.943732386540191, 19.44922031041879],
        [-20.69865579590063, -8.816374604402768, 1.260436877740897, -0.7495647613787146],
        [-46.22004352711257, -17.49534862857472, -289.6389582892057, 93.60855400400906, 318.3822534212147],
        [34.20013733472935, -14.15535402717690, 57.82335640988400, 25.83362985412365, 1.408950972071624,
         -6.551835421242162],
        [42.57076742291101, -13.80770672017997, 93.98938432427124, 18.77919633714503, -31.58359187223370,
         -6.685968952921985, -5.810979938412932],
    ],
    c=[0.0, 0.38, 0.3878509998321533, 0.4839718937873840, 0.4570477008819580],
    d=[0.19, -0.1823079225333714636, -0.319231832186874912, 0.3449828624725343, -0.377417564392089818],
    H=[
        [27.354592673333357, -6.925207756232857, 26.40037733258859, 0.5635230501052979, -4.699151156849391,
         -1.6008677469422725, -1.5306074446748028, -1.3929872940716344],
        [44.19024239501722, 1.3677947663381929e-13, 202.93261852171622, -35.5669339789154, -181.91095152160645,
         3.4116351403665033, 2.5793540257308067, 2.2435122582734066],
        [-44.0988150021747, -5.755396159656812e-13, -181.26175034586677, 56.99302194811676, 183.21182741427398,
         -7.480257918273637, -5.792426076169686, -5.32503859794143],
    ],
    description="Rodas5 (Di Marzo): Rosenbrock 5(4), L-stable, stiffly accurate, 4th-order dense output",
)

# Rodas5P, Steinebach (2023), same structure.
RODAS5P = _tableau(
    "rodas5p", 5, 4, 0.21193756319429014,
    a_rows=[
        [],
        [3.0],
        [2.849394379747939, 0.45842242204463923],
        [-6.954028509809101, 2.489845061869568, -10.358996098473584],
        [2.8029986275628964, 0.5072464736228206, -0.3988312541770524, -0.04721187230404641],
        [-7.502846399306121, 2.561846144803919, -11.627539656261098, -0.18268767659942256, 0.030198172008377946],
    ],
    C_rows=[
        [],
        [-14.155112264123755],
        [-17.97296035885952, -2.859693295451294],
        [147.12150275711716, -1.41221402718213, 71.68940251302358],
        [165.43517024871676, -0.4592823456491126, 42.90938336958603, -5.961986721573306],
        [24.854864614690072, -3.0009227002832186, 47.4931110020768, 5.5814197821558125, -0.6610691825249471],
        [30.91273214028599, -3.1208243349937974, 77.79954646070892, 34.28646028294783, -19.097331116725623,
         -28.087943162872662],
        [37.80277123390563, -3.2571969029072276, 112.26918849496327, 66.9347231244047, -40.06618937091002,
         -54.66780262877968, -9.48861652309627],
    ],
    c=[0.0, 0.6358126895828704, 0.4095798393397535, 0.9769306725060716, 0.4288403609558664],
    d=[0.21193756319429014, -0.42387512638858027, -0.3384627126235924, 1.8046452872882734, 2.325825639765069],
    H=[
        [25.948786856663858, -2.5579724845846235, 10.433815404888879, -2.3679251022685204, 0.524948541321073,
         1.1241088310450404, 0.4272876194431874, -0.17202221070155493],
        [-9.91568850695171, -0.9689944594115154, 3.0438037242978453, -24.495224566215796, 20.176138334709044,
         15.98066361424651, -6.789040303419874, -6.710236069923372],
        [11.419903575922262, 2.8879645146136994, 72.92137995996029, 80.12511834622643, -52.072871366152654,
         -59.78993625266729, -0.15582684282751913, 4.883087185713722],
    ],
    description="Rodas5P (Steinebach 2023): Rosenbrock 5(4), L-stable, stiffly accurate, 4th-order dense output",
)

# RODAS, Hairer & Wanner (Solving ODEs II, 1996), the "Rodas4" of the Fortran code.
RODAS4 = _tableau(
    "rodas4", 4, 3, 0.25,
    a_rows=[
        [],
        [1.544000000000000],
        [0.9466785280815826, 0.2557011698983284],
        [3.314825187068521, 2.896124015972201, 0.9986419139977817],
        [1.221224509226641, 6.019134481288629, 12.53708332932087, -0.6878860361058950],
    ],
    C_rows=[
        [],
        [-5.668800000000000],
        [-2.430093356833875, -0.2063599157091915],
        [-0.1073529058151375, -9.594562251023355, -20.47028614809616],
        [7.496443313967647, -10.24680431464352, -33.99990352819905, 11.70890893206160],
        [8.083246795921522, -7.981132988064893, -31.52159432874371, 16.31930543123136, -6.058818238834054],
    ],
    c=[0.0, 0.386, 0.21, 0.63],
    d=[0.25, -0.1043, 0.1035, -0.03620000000000023],
    H=[
        [10.12623508344586, -7.487995877610167, -34.80091861555747, -7.992771707568823, 1.025137723295662],
        [-0.6762803392801253, 6.087714651680015, 16.43084320892478, 24.76722511418386, -6.594389125716872],
    ],
    description="Rodas4 (Hairer & Wanner RODAS): Rosenbrock 4(3), L-stable, stiffly accurate, 3rd-order dense output",
)

TABLEAUS = {t.name: t for t in (RODAS5, RODAS5P, RODAS4)}


@dataclass(frozen=True)
class RosenbrockStepper(TableauProperties):
    """A :class:`~odecli.ode.stepper.Stepper` for a :class:`RodasTableau`."""

    tableau: RodasTableau
    adaptive: bool = True
    counter_names: tuple[str, ...] = field(default=COUNTERS)

    def init_state(self, rhs, t: Tensor, y: Tensor, f0: Tensor) -> dict[str, Tensor]:
        batch, n = y.shape
        return {
            "jac": y.new_zeros(batch, n, n).detach(),
            "f_t": y.new_zeros(batch, n).detach(),
            "jac_ok": torch.zeros(batch, dtype=torch.bool, device=y.device),  # J is at the current (t, y)
        }

    def step(self, rhs, t, y, f0, h, rtol, atol, state) -> StepResult:
        return self.masked_step(rhs, t, y, f0, h, rtol, atol, state, h != 0)

    def masked_step(self, rhs, t, y, f0, h, rtol, atol, state, use: Tensor) -> StepResult:
        """One step for the rows in ``use``; other rows get harmless values and zero counters."""
        tab = self.tableau
        need = use & ~state["jac_ok"]
        J, f_t = state["jac"], state["f_t"]
        n_evals: Tensor | int = tab.stages
        if bool(need.any()):
            # f0 = f(t, y) has a graph exactly when a gradient flows through this step
            J_new, ft_new = jacobian(rhs, t, y, differentiable=f0.requires_grad)
            J = torch.where(need[:, None, None], J_new, J)
            f_t = torch.where(need[:, None], ft_new, f_t)
            n_evals = tab.stages + need.to(torch.int64)
        n = y.shape[-1]
        hs = torch.where(use & (h != 0), h, torch.ones_like(h)).detach()
        eye = torch.eye(n, dtype=y.dtype, device=y.device)
        W = eye / (tab.gamma * hs)[:, None, None] - J
        LU, piv = lu_factor(W)
        hcol = h[:, None]
        hinv = (1.0 / hs)[:, None]
        ks: list[Tensor] = []
        for i in range(tab.stages):
            if i == 0:
                fi = f0
            else:
                u = y + weighted_sum(tab.a[i], ks, like=y)
                fi = rhs(t + tab.c[i] * h, u)
            rhs_i = fi
            if i > 0:
                rhs_i = rhs_i + hinv * weighted_sum(tab.C[i], ks, like=y)
            if tab.d[i] != 0.0:
                rhs_i = rhs_i + (tab.d[i] * hcol) * f_t
            ks.append(lu_solve(LU, piv, rhs_i))
        y1 = y + weighted_sum(tab.b, ks, like=y)
        f1 = rhs(t + h, y1)
        err = rms_error_norm(ks[-1], y, y1, rtol, atol)
        ones = use.to(torch.int64)

        def dense() -> tuple[Interpolant, int]:
            Ks = [weighted_sum(row, ks, like=y) for row in tab.H]

            def evaluate(theta: Tensor) -> Tensor:
                th = theta[:, None]
                inner = Ks[-1]
                for K in reversed(Ks[:-1]):
                    inner = K + th * inner
                return (1 - th) * y + th * (y1 + (1 - th) * inner)

            return evaluate, 0

        return StepResult(
            y1=y1, f1=f1, err=err, n_evals=n_evals, dense=dense,
            counters={"n_jac_evals": need.to(torch.int64), "n_lu_decomps": ones, "n_newton_iters": 0},
            state={"jac_ok": torch.zeros_like(use)},  # the next step starts elsewhere: new J there
            retry_state={"jac": J, "f_t": f_t, "jac_ok": state["jac_ok"] | need},
        )


STEPPERS = {name: RosenbrockStepper(tab) for name, tab in TABLEAUS.items()}
