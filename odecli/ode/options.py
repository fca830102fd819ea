"""How a solve steps, in one object: every ODE entry point takes a :class:`SolverOptions`.

``solve``, ``odeint``, ``solve_native``, ``solve_native_arrays`` and ``solve_native_with_grad``
share these settings; each also accepts them as keywords (``solve(..., method="tsit5",
rtol=1e-8)``), which :meth:`SolverOptions.of` lays over an ``options`` object. The controller's
coefficients and step limits (P/I/D, safety, factor_min/max, dt_min/dt_max) live in its
:class:`~odecli.ode.controllers.PIDController`. Imports no torch: the C solver's path reads
these without loading it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from odecli.ode.controllers import PIDController, make_controller

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor

    from odecli.ode.stepper import Stepper


@dataclass(frozen=True)
class SolverOptions:
    """The method, its tolerances, the step-size controller, the first step and the step budget."""

    method: str | Stepper = "dopri5"
    """A method name (``odecli.ode.stepper.STEPPERS``) or a stepper; the C solver takes names only."""
    rtol: float = 1e-6
    atol: float = 1e-6
    controller: str | PIDController = "integral"
    """``integral``, ``pi``, ``pid`` (default coefficients) or a configured :class:`PIDController`."""
    dt0: float | Tensor | np.ndarray | None = None
    """First step per sample (scalar or (B,)); the fixed step of fixed-step methods. None: chosen per sample."""
    max_steps: int = 100_000
    """Attempts per sample before it stops with ``REACHED_MAX_STEPS``."""

    @classmethod
    def of(cls, options: SolverOptions | None, settings: Mapping[str, Any]) -> SolverOptions:
        """``options`` (defaults when None) with the keyword ``settings`` laid over it.

        An unknown keyword is a ``TypeError`` naming it, as a misspelt keyword argument is.
        """
        unknown = sorted(set(settings) - set(OPTION_NAMES))
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r} (solver options: {', '.join(OPTION_NAMES)})")
        return dataclasses.replace(options or cls(), **settings)

    def pid(self) -> PIDController:
        """The controller as a :class:`PIDController` (a name gets that controller's defaults)."""
        return make_controller(self.controller) if isinstance(self.controller, str) else self.controller

    def stepper(self) -> Stepper:
        """The method as a stepper of the PyTorch loop (imports torch)."""
        from odecli.ode.stepper import get_stepper

        return get_stepper(self.method) if isinstance(self.method, str) else self.method

    @property
    def method_name(self) -> str:
        return self.method if isinstance(self.method, str) else self.method.name

    def replace(self, **changes: Any) -> SolverOptions:
        return dataclasses.replace(self, **changes)


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(SolverOptions))
"""The keywords every entry point accepts for :class:`SolverOptions`."""


def split_options(keywords: Mapping[str, Any]) -> tuple[SolverOptions, dict[str, Any]]:
    """``(options, the other keywords)`` from keywords that may hold ``options=`` and its fields."""
    rest = {k: v for k, v in keywords.items() if k not in OPTION_NAMES and k != "options"}
    settings = {k: v for k, v in keywords.items() if k in OPTION_NAMES}
    return SolverOptions.of(keywords.get("options"), settings), rest
