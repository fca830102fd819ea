"""What a linear solve is asked for and how it fails, torch-free: the spec layer and the error
paths import these without loading torch."""

from __future__ import annotations

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


__all__ = ["NotConverged", "SolverSettings"]
