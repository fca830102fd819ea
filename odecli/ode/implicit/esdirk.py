"""ESDIRK methods with a per-sample simplified Newton iteration.

Methods registered:

* ``kvaerno5`` – Kværnø (2004) 5(4): 7 stages (explicit first stage), L-stable, stiffly accurate.
* ``kvaerno3`` – Kværnø (2004) 3(2): 4 stages, L-stable, stiffly accurate.

Each implicit stage ``z = ψ + hγ f(t + c_i h, z)``, ``ψ = y + h Σ_j a_ij K_j``, is solved by the
simplified Newton iteration ``(I − h'γ J) Δ = −(z − ψ − hγ f(z))`` with a per-sample J and LU
kept across steps. Each sample iterates on its own: it stops when ``η ‖Δ‖ ≤ κ`` (Hairer &
Wanner II §IV.8: ``η = θ / (1 − θ)``, ``θ`` the observed contraction, the norm the solver's
``atol + rtol |y|`` weighted RMS, κ = 0.03), and fails when θ ≥ 1, when the rate predicts no
convergence within the iteration limit (8), or on non-finite values. A failed sample's step is
rejected with the step halved (its error norm is set to the value the controller halves on), or
shrunk by the controller's ``factor_min`` when the failure was non-finite values (flagged in
``StepResult.nonfinite``; see :func:`odecli.ode.solver._advance`), and its next attempt gets a
fresh Jacobian unless the failing one was fresh already. The stage
guesses use Kværnø's / OrdinaryDiffEq.jl's extrapolation predictors.

Jacobian and LU reuse, per sample: J is recomputed only after a Newton failure or when the last
step's Newton contraction was slow (max θ > 0.3); ``I − h'γ J`` is refactored when J changed or
``|hγ / h'γ − 1| > 0.2`` (the Newton matrix tolerates a slightly wrong h). The embedded error
``y1 − z_{s−1}`` is filtered through the same LU (Shampine's ``(I − hγJ)^{-1}`` filter) so
stiff components do not inflate it.

Dense output: cubic Hermite through (y0, k0), (y1, k1), 3rd order, a documented fallback (these
ESDIRKs have no continuous extension of their own). Both methods are stiffly accurate with
``c_s = 1`` (``y1 = z_s``; checked when a tableau is built), so the slopes are the last stage's
``K_s = (z_s − ψ_s) / (hγ)`` of this step (k1) and of the last accepted one (k0), not f at the
step's ends: ``y1`` carries the Newton error δ (about κ times the tolerance), ``f(t + h, y1)`` is
off by ``J δ``, and on stiff problems (``|hJ| ≫ 1``) that put ``h J δ`` into the interpolant (Van
der Pol μ = 1000 and Robertson at rtol 1e-6: 1.3e3-4.6e4 times ``atol + rtol |y|`` between steps,
now 0.4-200), while ``h K_s`` is off by ``δ / γ`` whatever J. The next step's explicit first stage
stays ``f(t + h, y1)``: taking K_s there as well (as OrdinaryDiffEq.jl does) saved steps but let
the Newton errors add up step after step, up to 1e3 times the tolerance at t_end (kvaerno3,
Robertson, rtol 1e-8). Between the long steps these methods take on smooth solutions the cubic's
own error can far exceed the tolerance: on Prothero–Robinson (y' = λ(y − sin t) + cos t,
λ = −1e6, tol 1e-6) kvaerno5 steps h = 1, where even exact slopes leave a cubic 1.5e-3 off.
Statistics: ``n_jac_evals``, ``n_lu_decomps``, ``n_newton_iters`` per sample; ``n_f_evals``
counts Newton evaluations, one forward pass per Jacobian and the final ``f(t + h, y1)`` per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from odecli.ode.implicit.linalg import jacobian, lu_factor, lu_solve
from odecli.ode.interpolation import Interpolant, hermite
from odecli.ode.stages import weighted_sum
from odecli.ode.stepper import StepResult, TableauProperties

COUNTERS = ("n_jac_evals", "n_lu_decomps", "n_newton_iters")
KAPPA = 0.03  # Newton stopping tolerance, in units of the error tolerance
MAX_ITERS = 8
SLOW_THETA = 0.3  # contraction above which the next step gets a fresh Jacobian
REFACTOR_RATIO = 0.2  # refactor when h*gamma moved by more than this fraction


@dataclass(frozen=True)
class EsdirkTableau:
    name: str
    order: int
    error_order: int
    gamma: float
    a: tuple[tuple[float, ...], ...]  # a[i][j], j <= i (diagonal gamma for i >= 1); row 0 empty
    c: tuple[float, ...]
    predictor: tuple[tuple[float, ...], ...]  # stage-derivative guesses: K_i ~ sum_j alpha[i][j] K_j
    description: str = ""

    def __post_init__(self) -> None:
        # The stepper relies on this structure: an explicit first stage (K_1 = f0), stiff accuracy
        # (y1 = z_s) with c_s = 1 (so K_s is the slope at (t + h, y1) for the dense output), and
        # c_{s-1} = 1 (the embedded solution z_{s-1} is compared with y1 at the same time).
        s = len(self.c)
        if len(self.a) != s or self.a[0] or any(len(row) != i + 1 for i, row in enumerate(self.a) if i):
            raise ValueError(f"{self.name}: a must be lower triangular with an empty first row")
        if self.c[0] != 0.0 or self.c[-1] != 1.0 or self.c[-2] != 1.0:
            raise ValueError(f"{self.name}: needs c_1 = 0 and c_(s-1) = c_s = 1 (stiffly accurate)")
        for i, (row, c) in enumerate(zip(self.a, self.c)):
            if i and (row[-1] != self.gamma or abs(sum(row) - c) > 1e-12):
                raise ValueError(f"{self.name}: stage {i} needs diagonal gamma and row sum c_{i}")

    @property
    def stages(self) -> int:
        return len(self.c)


def _kvaerno3() -> EsdirkTableau:
    # gamma: the root of 6 g^3 - 18 g^2 + 9 g - 1 = 0 in (0.4, 0.5), making the method L-stable.
    g = float(next(r.real for r in np.roots([6, -18, 9, -1]) if abs(r.imag) < 1e-12 and 0.4 < r.real < 0.5))
    a31 = (-4 * g**2 + 6 * g - 1) / (4 * g)
    a32 = (-2 * g + 1) / (4 * g)
    a41 = (6 * g - 1) / (12 * g)
    a42 = -1 / ((24 * g - 12) * g)
    a43 = (-6 * g**2 + 6 * g - 1) / (6 * g - 3)
    th = 1 / (2 * g)
    return EsdirkTableau(
        "kvaerno3", 3, 2, g,
        a=((), (g, g), (a31, a32, g), (a41, a42, a43, g)),
        c=(0.0, 2 * g, 1.0, 1.0),
        predictor=((), (1.0,), (1.0 - th, th), (a31, a32, g)),
        description="Kvaerno 3(2) ESDIRK, L-stable, stiffly accurate, simplified Newton, Hermite dense output",
    )


def _kvaerno5() -> EsdirkTableau:
    g = 0.26
    rows = (
        (),
        (g, g),
        (0.13, 0.84033320996790809, g),
        (0.22371961478320505, 0.47675532319799699, -0.06470895363112615, g),
        (0.16648564323248321, 0.10450018841591720, 0.03631482272098715, -0.13090704451073998, g),
        (0.13855640231268224, 0.0, -0.04245337201752043, 0.02446657898003141, 0.61943039072480676, g),
        (0.13659751177640291, 0.0, -0.05496908796538376, -0.04118626728321046, 0.62993304899016403,
         0.06962479448202728, g),
    )
    return EsdirkTableau(
        "kvaerno5", 5, 4, g,
        a=rows,
        c=(0.0, 0.52, 1.230333209967908, 0.8957659843500759, 0.43639360985864756, 1.0, 1.0),
        predictor=(
            (),
            (1.0,),
            (-1.366025403784441, 2.3660254037844357),
            (-0.19650552613122207, 0.8113579546496623, 0.38514757148155954),
            (0.10375304369958693, 0.937994698066431, -0.04174774176601781, 0.0),
            (-0.17281112873898072, 0.6235784481025847, 0.5492326806363959, 0.0, 0.0),
            rows[5][:5] + (g,),
        ),
        description="Kvaerno 5(4) ESDIRK, L-stable, stiffly accurate, simplified Newton, Hermite dense output",
    )


TABLEAUS = {t.name: t for t in (_kvaerno5(), _kvaerno3())}


@dataclass(frozen=True)
class EsdirkStepper(TableauProperties):
    tableau: EsdirkTableau
    adaptive: bool = True
    counter_names: tuple[str, ...] = field(default=COUNTERS)

    def init_state(self, rhs, t: Tensor, y: Tensor, f0: Tensor) -> dict[str, Tensor]:
        batch, n = y.shape
        return {
            "jac": y.new_zeros(batch, n, n).detach(),
            "lu": y.new_zeros(batch, n, n).detach(),
            "piv": torch.ones(batch, n, dtype=torch.int32, device=y.device),
            "hg_lu": y.new_zeros(batch).detach(),  # h*gamma the LU was formed with; 0: none yet
            "need_jac": torch.ones(batch, dtype=torch.bool, device=y.device),
            "eta": y.new_ones(batch).detach(),  # Newton's last eta, to judge a first iterate
            "k_start": f0,  # the dense output's slope at the step's start: the last step's K_s
        }

    def step(self, rhs, t, y, f0, h, rtol, atol, state) -> StepResult:
        tab = self.tableau
        batch, n = y.shape
        active = h != 0
        zeros_i = torch.zeros(batch, dtype=torch.int64, device=y.device)

        need_jac = active & state["need_jac"]
        J = state["jac"]
        n_f = zeros_i.clone()
        if bool(need_jac.any()):
            J_new, _ = jacobian(rhs, t, y, time_derivative=False)
            J = torch.where(need_jac[:, None, None], J_new, J)
            n_f = n_f + need_jac.to(torch.int64)

        hg = (h * tab.gamma).detach()
        hg_lu = state["hg_lu"]
        ratio = torch.where(hg_lu != 0, hg / torch.where(hg_lu != 0, hg_lu, torch.ones_like(hg_lu)), torch.zeros_like(hg))
        need_lu = active & (need_jac | (hg_lu == 0) | ((ratio - 1).abs() > REFACTOR_RATIO))
        LU, piv = state["lu"], state["piv"]
        if bool(need_lu.any()):
            eye = torch.eye(n, dtype=y.dtype, device=y.device)
            new_LU, new_piv = lu_factor(eye - hg[:, None, None] * J)
            LU = torch.where(need_lu[:, None, None], new_LU, LU)
            piv = torch.where(need_lu[:, None], new_piv, piv)
            hg_lu = torch.where(need_lu, hg, hg_lu)

        scale = atol + rtol * y.detach().abs()
        hcol = h[:, None]
        hg_safe = torch.where(active, hg, torch.ones_like(hg))[:, None]
        eps = torch.finfo(y.dtype).eps
        eta = torch.clamp(state["eta"], min=eps)
        failed = ~active  # inactive rows take no part
        nonfinite = torch.zeros_like(active)  # rows whose Newton iteration met non-finite values
        theta_max = torch.zeros_like(hg)
        iters = zeros_i.clone()
        K = [f0]
        z = y
        stage_values = [y]
        for i in range(1, tab.stages):
            psi = y + hcol * weighted_sum(tab.a[i][:i], K)
            guess = weighted_sum(tab.predictor[i], K) if any(tab.predictor[i]) else f0
            z = psi + hg[:, None] * guess
            ti = t + tab.c[i] * h
            iterating = active & ~failed
            eta = torch.pow(eta, 0.8)
            dn_prev = torch.ones_like(hg)
            for k in range(MAX_ITERS):
                if not bool(iterating.any()):
                    break
                fz = rhs(ti, z)
                G = z - psi - hg[:, None] * fz
                delta = -lu_solve(LU, piv, G)
                dn = torch.sqrt(torch.mean((delta / scale) ** 2, dim=-1)).detach()
                iters = iters + iterating
                if k == 0:
                    diverged = ~torch.isfinite(dn)
                    conv = eta * dn <= KAPPA
                else:
                    theta = dn / torch.where(dn_prev > 0, dn_prev, torch.ones_like(dn_prev))
                    theta_max = torch.where(iterating, torch.maximum(theta_max, theta), theta_max)
                    eta_k = theta / torch.clamp(1 - theta, min=eps)
                    eta = torch.where(iterating & (theta < 1), eta_k, eta)
                    conv = eta_k * dn <= KAPPA
                    doomed = theta ** (MAX_ITERS - 1 - k) / torch.clamp(1 - theta, min=eps) * dn > KAPPA
                    diverged = (theta >= 1) | ~torch.isfinite(dn) | (doomed & ~conv)
                nonfinite = nonfinite | (iterating & ~torch.isfinite(dn))
                z = torch.where((iterating & ~diverged)[:, None], z + delta, z)
                failed = failed | (iterating & diverged)
                iterating = iterating & ~conv & ~diverged
                dn_prev = dn
            failed = failed | iterating  # out of iterations
            K.append((z - psi) / hg_safe)
            stage_values.append(z)

        failed_real = failed & active
        y1 = torch.where(failed_real[:, None], y, z)
        # A failed row's f1 is never used; f0 keeps it finite, so the solver sees the trial's own values.
        f1 = torch.where(failed_real[:, None], f0, rhs(t + h, y1))
        # The dense output's slopes are the stages' K_s = (z_s - psi_s) / (h gamma), this step's and
        # the last one's (see the module docstring), not f at the step's ends.
        k_end = torch.where(failed[:, None], f0, K[-1])
        err_raw = z - stage_values[-2]
        err_f = lu_solve(LU, piv, err_raw)
        err = torch.sqrt(torch.mean((err_f / (atol + rtol * torch.maximum(y.abs(), y1.abs()))) ** 2, dim=-1))
        halve = (0.9 / 0.5) ** (tab.error_order + 1)  # the integral controller's error for a factor 1/2
        # Non-finite values (in Newton or the error estimate) are flagged: the solver rejects such
        # a trial and shrinks the step by the controller's factor_min, and reports INFINITE_NORM if
        # that goes on until no smaller step is left. The norm stays finite for the controller.
        # (A row that failed for another reason has no estimate: its stages are unfinished.)
        nonfinite = active & (nonfinite | (~failed_real & ~torch.isfinite(err)))
        err = torch.where(failed_real | nonfinite, torch.full_like(err, halve), err)
        n_evals = n_f + iters + 1

        fresh = need_jac
        keep = {"jac": J, "lu": LU, "piv": piv, "hg_lu": hg_lu}
        eta_keep = torch.where(failed_real, torch.ones_like(eta), eta)

        k_start = state["k_start"]

        def dense() -> tuple[Interpolant, int]:
            return hermite(y, y1, k_start, k_end, h), 0

        return StepResult(
            y1=y1, f1=f1, err=err, n_evals=n_evals, dense=dense,
            counters={"n_jac_evals": need_jac.to(torch.int64), "n_lu_decomps": need_lu.to(torch.int64),
                      "n_newton_iters": iters},
            state={**keep, "need_jac": theta_max > SLOW_THETA, "eta": eta_keep, "k_start": k_end},
            retry_state={**keep, "need_jac": failed_real & ~fresh, "eta": eta_keep},
            nonfinite=nonfinite,
        )


STEPPERS = {name: EsdirkStepper(tab) for name, tab in TABLEAUS.items()}
