"""What an inverse spec says about its optimiser, in one vocabulary for every kind of fit."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OptimizerSettings:
    """``optimizer:`` of an inverse spec (ODE or PDE): the same keys and meanings for both."""

    type: str  # "adam" | "lbfgs"
    learning_rate: float | None  # Adam's step; L-BFGS's first step length; None: scale-aware default
    iterations: int
    tolerance: float  # stop when the loss changes by <= tolerance (relative); 0: never
    gtol: float = 0.0  # stop when the gradient's norm is <= gtol; 0: never
    history_size: int = 10  # L-BFGS: correction pairs kept
    betas: tuple[float, float] = (0.9, 0.999)  # Adam
    max_line_search: int = 12  # L-BFGS: trial steps per iteration
    line_search: str = "armijo"  # L-BFGS: "strong_wolfe" or "armijo" (halving; the only one with bounds)
    schedule: str = "none"  # Adam: "none", "cosine" or "step" (odecli.optim.adam.schedule_factor)
    smoothing: str | float = "auto"  # L-BFGS on a grid unknown: smoothing length (cells) of H0; 0: none
