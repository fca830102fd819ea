"""Step-size controllers: decide accept/reject and the next step from the error norm.

One formulation (Söderlind's digital filter, as in diffrax and torchode) covers I, PI and PID::

    factor = safety * r_n**beta1 * r_{n-1}**beta2 * r_{n-2}**beta3,   r = 1 / error_norm
    beta1 = (P + I + D) / k,  beta2 = -(P + 2 D) / k,  beta3 = D / k,  k = error_order + 1

so ``I=1, P=D=0`` is the classic integral controller ``safety * r**(1/k)`` and ``P=0.4, I=0.3``
is Gustafsson's PI controller (exponents 0.7/k and -0.4/k). A rejected step uses the integral
part alone and never grows; a step right after a rejection does not grow either (as in scipy),
which avoids reject/accept oscillation. Everything works on per-sample tensors, so each sample
has its own history and decision; nothing here synchronises with the host.

The settings import without torch (the generated C solver reads them on a path that never
loads torch); only the per-sample tensor code imports it, when it first runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor

HISTORY_FLOOR = 1e-4
END_SNAP = 1e-7  # relative stretch of a final step allowed to land exactly on t_end

CONTROLLER_DEFAULTS: dict[str, tuple[float, float, float]] = {
    "integral": (0.0, 1.0, 0.0),
    "pi": (0.4, 0.3, 0.0),
    "pid": (0.2, 0.4, 0.1),
}


@dataclass(frozen=True)
class ControllerState:
    """Per-sample memory of the controller: the last two accepted error norms."""

    err_prev: Tensor
    err_prev2: Tensor
    rejected_last: Tensor

    @staticmethod
    def initial(batch: int, dtype: torch.dtype, device: torch.device) -> "ControllerState":
        import torch

        # Two tensors, not one: aliased inputs make torch.compile guard on (and recompile for) the alias.
        ones = torch.ones(batch, dtype=dtype, device=device)
        return ControllerState(ones, ones.clone(), torch.zeros(batch, dtype=torch.bool, device=device))

    def where(self, mask: Tensor, other: "ControllerState") -> "ControllerState":
        """Per sample: this state where ``mask`` holds, ``other`` elsewhere."""
        return ControllerState(
            self.err_prev.where(mask, other.err_prev),
            self.err_prev2.where(mask, other.err_prev2),
            self.rejected_last.where(mask, other.rejected_last),
        )

    def index(self, rows: Tensor) -> "ControllerState":
        return ControllerState(self.err_prev[rows], self.err_prev2[rows], self.rejected_last[rows])


@dataclass(frozen=True)
class PIDController:
    """Adaptive controller with configurable P/I/D coefficients and step limits."""

    pcoeff: float = 0.0
    icoeff: float = 1.0
    dcoeff: float = 0.0
    safety: float = 0.9
    factor_min: float = 0.2
    factor_max: float = 10.0
    dt_min: float = 0.0
    dt_max: float = math.inf

    @classmethod
    def named(cls, name: str, **overrides) -> "PIDController":
        """``integral``, ``pi`` or ``pid`` with default coefficients; ``None`` overrides are ignored."""
        try:
            p, i, d = CONTROLLER_DEFAULTS[name]
        except KeyError:
            raise ValueError(f"unknown controller {name!r}; expected one of {', '.join(CONTROLLER_DEFAULTS)}") from None
        settings = {"pcoeff": p, "icoeff": i, "dcoeff": d}
        settings.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**settings)

    def adapt(
        self, err: Tensor, state: ControllerState, error_order: int
    ) -> tuple[Tensor, Tensor, ControllerState]:
        """Return (accept, step factor, new state) for per-sample error norms ``err``.

        Non-finite norms count as rejected here; the solver turns them into a failure status
        (explicit methods) or retries them with the step times ``factor_min`` (implicit ones).
        """
        import torch

        k = error_order + 1.0
        beta1 = (self.pcoeff + self.icoeff + self.dcoeff) / k
        beta2 = -(self.pcoeff + 2.0 * self.dcoeff) / k
        beta3 = self.dcoeff / k
        accept = err <= 1.0
        tiny = torch.finfo(err.dtype).tiny
        inv = 1.0 / torch.clamp(err, min=tiny)
        inv_prev = 1.0 / state.err_prev
        inv_prev2 = 1.0 / state.err_prev2
        grow = self.safety * inv**beta1 * inv_prev**beta2 * inv_prev2**beta3
        grow_cap = torch.where(state.rejected_last, 1.0, self.factor_max)
        grow = torch.minimum(torch.clamp(grow, min=self.factor_min), grow_cap)
        shrink = torch.clamp(self.safety * inv ** (1.0 / k), min=self.factor_min, max=self.safety)
        factor = torch.where(accept, grow, shrink)
        factor = torch.nan_to_num(factor, nan=self.factor_min)
        # History is floored so one (near-)exact step cannot make the next factor collapse.
        clamped = torch.clamp(err, min=HISTORY_FLOOR)
        new_state = ControllerState(
            err_prev=torch.where(accept, clamped, state.err_prev),
            err_prev2=torch.where(accept, state.err_prev, state.err_prev2),
            rejected_last=~accept,
        )
        return accept, factor, new_state


def make_controller(
    name: str = "integral",
    *,
    pcoeff: float | None = None,
    icoeff: float | None = None,
    dcoeff: float | None = None,
    **limits,
) -> PIDController:
    """Build a controller by name; coefficients left as None take that controller's defaults."""
    return PIDController.named(name, pcoeff=pcoeff, icoeff=icoeff, dcoeff=dcoeff, **limits)
