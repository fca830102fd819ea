"""Stability limits of the explicit time steppers, and the words that report a breach.

Torch-free on purpose: ``odecli validate`` (odecli.specs.pde) and the run (odecli.app.pde_problem)
take their limits and messages from here, so the two cannot disagree on which time step is
unstable or on how they say so.  Each equation's own numbers and words are in its ``equation``
module (:data:`odecli.pde.propagator.EQUATIONS`).
"""

from __future__ import annotations

from odecli.pde.propagator import EQUATIONS


def limit(equation: str, dt: float, dy: float, dx: float) -> float:
    """The largest stable coefficient (wave speed or conductivity) of ``equation``."""
    return EQUATIONS[equation].stability_limit(dt, dy, dx)


def quantity(equation: str) -> str:
    """What the coefficient field of ``equation`` is called in messages."""
    return EQUATIONS[equation].QUANTITY


def limit_text(equation: str, most: float, dt: float) -> str:
    """The limit as a user can check it by hand: the scheme's bound and the coefficient's."""
    return EQUATIONS[equation].limit_text(most, dt)


def unstable(equation: str, field: str, value: float, most: float, dt: float) -> str:
    """The message for a ``field`` whose largest value exceeds the limit ``most`` (on time.dt)."""
    return (f"unstable: {field} reaches {quantity(equation)} {value:.6g}; "
            f"{limit_text(equation, most, dt)}")
