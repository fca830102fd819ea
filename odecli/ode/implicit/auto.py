"""``method: auto`` – tsit5 until a sample looks stiff, then rodas5 for that sample.

Stiffness detection is Hairer's (DOPRI5, Solving ODEs I §IV.2 / II §IV.2), per sample: after
each accepted explicit step, ``h|λ| ≈ |h| ‖f(y1) − f(y_6)‖ / ‖y1 − y_6‖`` with ``y_6`` the last
stage (``c = 1``) estimates the step's position against the stability boundary (about −3.5 on
the real axis for tsit5). When it exceeds 3.25 on 15 accepted steps (6 non-stiff steps in a row
reset the count), the sample switches to rodas5 for the rest of its solve; there is no switch
back. Both methods have an order-4 error estimate, so the controller's history carries over.

Batched cost: while some rows are explicit and some stiff, both methods run on the whole working
set and every row takes its own method's result (the RHS is bound to all rows); rows never pay
for the other method in their statistics. Statistics: those of rodas5 (zero for rows that never
switched) plus ``n_switched`` (1 for a sample that switched) and ``switched_at_step`` (its attempted-
step count at the switch; 0 if it never switched).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from odecli.ode.implicit.rosenbrock import COUNTERS, RODAS5, RosenbrockStepper
from odecli.ode.interpolation import Interpolant, polynomial
from odecli.ode.methods import TSIT5
from odecli.ode.stages import rk_step, weighted_sum
from odecli.ode.stepper import StepResult

STIFF_HLAMBDA = 3.25  # h|lambda| above this counts as a stiff step (Hairer's value for DOPRI5)
STIFF_STEPS = 15  # that many stiff steps switch the sample
NONSTIFF_RESET = 6  # that many non-stiff steps in a row reset the count


@dataclass(frozen=True)
class AutoStepper:
    name: str = "auto"
    order: int = 5
    error_order: int = 4
    adaptive: bool = True
    description: str = "tsit5, switching each sample to rodas5 when stiffness is detected (Hairer's test)"
    counter_names: tuple[str, ...] = COUNTERS + ("n_switched", "switched_at_step")

    @property
    def stiff_method(self) -> RosenbrockStepper:
        return RosenbrockStepper(RODAS5)

    def init_state(self, rhs, t: Tensor, y: Tensor, f0: Tensor) -> dict[str, Tensor]:
        batch = y.shape[0]
        zeros = torch.zeros(batch, dtype=torch.int64, device=y.device)
        return {
            **self.stiff_method.init_state(rhs, t, y, f0),
            "stiff": torch.zeros(batch, dtype=torch.bool, device=y.device),
            "n_stiff": zeros, "n_nonstiff": zeros.clone(), "n_attempts": zeros.clone(),
        }

    def step(self, rhs, t, y, f0, h, rtol, atol, state) -> StepResult:
        active = h != 0
        stiff = state["stiff"]
        use_stiff = stiff & active
        use_explicit = ~stiff & active
        any_stiff, any_explicit = torch.stack([use_stiff.any(), use_explicit.any()]).tolist()
        n_attempts = state["n_attempts"] + active

        if any_stiff:
            r = self.stiff_method.masked_step(rhs, t, y, f0, h, rtol, atol, state, use_stiff)
        if any_explicit or not any_stiff:
            ye, fe, K, erre = rk_step(TSIT5, rhs, t, y, f0, h, rtol, atol)
            # Hairer's stiffness estimate from the last two stages (both at t + h).
            y6 = y + h[:, None] * weighted_sum(TSIT5.a[5], K[:5])
            num = torch.linalg.vector_norm(fe - K[5], dim=-1)
            den = torch.linalg.vector_norm(ye - y6, dim=-1)
            hlam = h.abs() * num / torch.where(den > 0, den, torch.ones_like(den))
            hlam = torch.where(den > 0, hlam, torch.zeros_like(hlam)).detach()
            # As the solver decides: a non-finite trial is rejected (and retried smaller).
            accepted = (use_explicit & (erre.detach() <= 1.0) & torch.isfinite(erre.detach())
                        & torch.isfinite(ye.detach()).all(-1) & torch.isfinite(fe.detach()).all(-1))
            stiffish = hlam > STIFF_HLAMBDA
            n_stiff = torch.where(accepted & stiffish, state["n_stiff"] + 1, state["n_stiff"])
            n_nonstiff = torch.where(accepted, torch.where(stiffish, 0, state["n_nonstiff"] + 1), state["n_nonstiff"])
            reset = n_nonstiff >= NONSTIFF_RESET
            n_stiff = torch.where(reset, 0, n_stiff)
            n_nonstiff = torch.where(reset, 0, n_nonstiff)
            switch = accepted & (n_stiff >= STIFF_STEPS)
        else:
            n_stiff, n_nonstiff = state["n_stiff"], state["n_nonstiff"]
            switch = torch.zeros_like(stiff)

        if any_stiff and (any_explicit or not any_stiff):
            col = use_stiff[:, None]
            y1 = torch.where(col, r.y1, ye)
            f1 = torch.where(col, r.f1, fe)
            err = torch.where(use_stiff, r.err, erre)
            n_evals = torch.where(use_stiff, torch.as_tensor(r.n_evals), TSIT5.n_stages)
        elif any_stiff:
            y1, f1, err, n_evals = r.y1, r.f1, r.err, r.n_evals
        else:
            y1, f1, err, n_evals = ye, fe, erre, TSIT5.n_stages

        counters = dict(r.counters) if any_stiff else {name: 0 for name in COUNTERS}
        counters["n_switched"] = switch.to(torch.int64)
        counters["switched_at_step"] = switch.to(torch.int64) * n_attempts

        def dense() -> tuple[Interpolant, int]:
            parts = []
            if any_stiff:
                parts.append(r.dense()[0])
            if any_explicit or not any_stiff:
                parts.append(polynomial(TSIT5, y, K, h))
            if len(parts) == 1:
                return parts[0], 0
            stiff_interp, explicit_interp = parts
            return (lambda theta: torch.where(use_stiff[:, None], stiff_interp(theta), explicit_interp(theta))), 0

        rodas_state = r.state if any_stiff else {"jac_ok": torch.zeros_like(stiff)}
        rodas_retry = r.retry_state if any_stiff else {}
        return StepResult(
            y1=y1, f1=f1, err=err, n_evals=n_evals, dense=dense, counters=counters,
            state={**rodas_state, "stiff": stiff | switch, "n_stiff": n_stiff, "n_nonstiff": n_nonstiff,
                   "n_attempts": n_attempts},
            retry_state={**rodas_retry, "n_attempts": n_attempts},
        )


STEPPER = AutoStepper()
