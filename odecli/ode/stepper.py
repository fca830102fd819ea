"""The interface between the batched loop and a time-stepping method.

The loop in :mod:`odecli.ode.solver` owns time, step sizes, statuses and dense-output
bookkeeping; a :class:`Stepper` owns the arithmetic of one step. Explicit Runge–Kutta methods
and the implicit (stiff) methods implement the same protocol, so the controller, the
per-sample independence and the output layout are shared by all of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Protocol

from torch import Tensor

from odecli.ode.interpolation import Interpolant, dop853_dense, hermite, polynomial
from odecli.ode.methods import METHODS as EXPLICIT_METHODS
from odecli.ode.methods import ExplicitRK
from odecli.ode.stages import BoundRHS, rk_step


@dataclass
class StepResult:
    """What one attempted step produced for every row of the working set."""

    y1: Tensor
    f1: Tensor  # rhs(t + h, y1): the next step's first stage
    err: Tensor | None  # per-sample error norm; None for fixed-step methods
    n_evals: int | Tensor  # RHS evaluations this step, per row
    dense: Callable[[], tuple[Interpolant, int]]  # build the step's interpolant (and its extra evals) on demand
    counters: dict[str, Tensor | int] = field(default_factory=dict)  # e.g. n_jac_evals increments
    state: dict[str, Tensor] = field(default_factory=dict)  # method memory to keep where the step is accepted
    retry_state: dict[str, Tensor] = field(default_factory=dict)  # memory to keep where it is rejected (same start point)
    nonfinite: Tensor | None = None  # (A,) bool: rows whose trial met non-finite values the other fields hide


class Stepper(Protocol):
    name: str
    order: int
    error_order: int | None  # order of the embedded estimate; None for fixed-step methods
    adaptive: bool
    description: str
    counter_names: tuple[str, ...]  # extra per-sample statistics this method reports

    def init_state(self, rhs: BoundRHS, t: Tensor, y: Tensor, f0: Tensor) -> dict[str, Tensor]:
        """Per-sample memory carried between steps (compacted with the samples)."""

    def step(
        self, rhs: BoundRHS, t: Tensor, y: Tensor, f0: Tensor, h: Tensor,
        rtol: Tensor, atol: Tensor, state: dict[str, Tensor],
    ) -> StepResult:
        """Attempt a step of size ``h`` (per sample; 0 for inactive rows) from (t, y)."""


class TableauProperties:
    """``name``, ``order``, ``error_order`` and ``description`` read from ``self.tableau``."""

    tableau: object

    @property
    def name(self) -> str:
        return self.tableau.name

    @property
    def order(self) -> int:
        return self.tableau.order

    @property
    def error_order(self) -> int | None:
        return self.tableau.error_order

    @property
    def description(self) -> str:
        return self.tableau.description


@dataclass(frozen=True)
class ExplicitStepper:
    """Any explicit RK tableau as a :class:`Stepper`."""

    method: ExplicitRK
    counter_names: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.method.name

    @property
    def order(self) -> int:
        return self.method.order

    @property
    def error_order(self) -> int | None:
        return self.method.error_order

    @property
    def adaptive(self) -> bool:
        return self.method.adaptive

    @property
    def description(self) -> str:
        return self.method.description

    def init_state(self, rhs: BoundRHS, t: Tensor, y: Tensor, f0: Tensor) -> dict[str, Tensor]:
        return {}

    @property
    def n_stages(self) -> int:
        return self.method.n_stages

    def step(self, rhs, t, y, f0, h, rtol, atol, state) -> StepResult:
        y1, f1, K, err = rk_step(self.method, rhs, t, y, f0, h, rtol, atol)
        dense = functools.partial(self.interpolant, rhs, t, y, f0, h, y1, f1, K)
        return StepResult(y1=y1, f1=f1, err=err, n_evals=self.method.n_stages, dense=dense)

    def interpolant(
        self, rhs: BoundRHS, t: Tensor, y: Tensor, f0: Tensor, h: Tensor, y1: Tensor, f1: Tensor, K: list[Tensor]
    ) -> tuple[Interpolant, int]:
        """The step's dense output and the RHS evaluations it costs per row."""
        method = self.method
        if method.interpolant == "polynomial":
            return polynomial(method, y, K, h), 0
        if method.interpolant == "dop853":
            return dop853_dense(rhs, t, y, y1, K, h), 3
        return hermite(y, y1, f0, f1, h), 0


STEPPERS: dict[str, Stepper] = {name: ExplicitStepper(m) for name, m in EXPLICIT_METHODS.items()}


def register(stepper: Stepper) -> Stepper:
    """Make a method available by name to the solver, the spec validator and the CLI."""
    STEPPERS[stepper.name] = stepper
    return stepper


def get_stepper(name: str) -> Stepper:
    _load_builtin_methods()
    try:
        return STEPPERS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; expected one of {', '.join(STEPPERS)}") from None


def available_methods() -> dict[str, Stepper]:
    _load_builtin_methods()
    return dict(STEPPERS)


def _load_builtin_methods() -> None:
    """Import the modules that register further methods (kept lazy to avoid import cycles)."""
    import importlib

    for module in ("odecli.ode.implicit",):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
