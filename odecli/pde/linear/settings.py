"""What a linear solve is asked for and how it fails, torch-free: the spec layer and the error
paths import these without loading torch."""

from __future__ import annotations

import math
from dataclasses import dataclass


class NotConverged(ValueError):
    """A linear solve that did not reach its tolerance; raised identically on every rank."""

    def __init__(self, iterations: int, residual: float, rtol: float | None = None) -> None:
        tail = f" (rtol {rtol:g})" if rtol is not None else ""
        super().__init__(f"the linear solve did not converge: relative residual {residual:.3e} "
                         f"after {iterations} iterations{tail}")
        self.iterations = iterations
        self.residual = residual


@dataclass(frozen=True)
class SolverSettings:
    """The spec's ``solver`` section: relative-residual tolerance and the iteration cap."""

    rtol: float = 1e-10
    max_iterations: int = 500

    @classmethod
    def of(cls, solver: dict | None) -> "SolverSettings":
        """From the ``Setup.solver`` dictionary (missing keys take the defaults)."""
        solver = solver or {}
        return cls(float(solver.get("rtol", cls.rtol)),
                   int(solver.get("max_iterations", cls.max_iterations)))


def solver_problem(solver: dict | None) -> tuple[str, str] | None:
    """The first unusable value of a ``solver`` section as ``(dotted field, message)``, or None:
    ``rtol`` must be a number in (0, 1), ``max_iterations`` a whole number >= 1."""
    solver = solver or {}
    rtol = solver.get("rtol", SolverSettings.rtol)
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not math.isfinite(rtol) \
            or not 0 < rtol < 1:
        return "solver.rtol", f"must be a number between 0 and 1 (exclusive), got {rtol!r}"
    most = solver.get("max_iterations", SolverSettings.max_iterations)
    if isinstance(most, bool) or not isinstance(most, int) or most < 1:
        return "solver.max_iterations", f"must be a whole number >= 1, got {most!r}"
    return None


__all__ = ["NotConverged", "SolverSettings", "solver_problem"]
