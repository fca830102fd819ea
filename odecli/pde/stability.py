"""Stability limits of the explicit time steppers, and the words that report a breach.

Torch-free on purpose: ``odecli validate`` (odecli.specs.pde) and the run (odecli.app.pde_problem,
the propagators) take their limits and messages from here, so the two cannot disagree on which
time step is unstable or on how they say so.
"""

from __future__ import annotations

import math

# Largest eigenvalue of the 4th-order 1-D second derivative (-1/12, 4/3, -5/2, 4/3, -1/12)
# times h^2 (odecli.pde.stencils.laplacian4).
LAMBDA_4TH = 16.0 / 3.0


def acoustic_cfl_limit(dy: float, dx: float) -> float:
    """Largest ``c*dt`` for the leapfrog / 4th-order scheme: (c dt)^2 * 16/3 * (1/dx^2+1/dy^2) <= 4.

    The run uses this limit whatever the boundary: the sponge (factors <= 1) and the free surface
    do not enter it.
    """
    return (4.0 / (LAMBDA_4TH * (1.0 / dx**2 + 1.0 / dy**2))) ** 0.5


def acoustic_speed_limit(dt: float, dy: float, dx: float) -> float:
    """Largest stable wave speed for this ``dt`` and grid spacing."""
    return acoustic_cfl_limit(dy, dx) / dt


def heat_conductivity_limit(dt: float, dy: float, dx: float) -> float:
    """Largest stable conductivity for explicit Euler with the 5-point conservative operator."""
    return 1.0 / (2.0 * dt * (1.0 / dx**2 + 1.0 / dy**2))


def limit(equation: str, dt: float, dy: float, dx: float) -> float:
    """The largest stable coefficient (wave speed or conductivity) of ``equation``."""
    if equation == "acoustic2d":
        return acoustic_speed_limit(dt, dy, dx)
    return heat_conductivity_limit(dt, dy, dx)


def quantity(equation: str) -> str:
    """What the coefficient field of ``equation`` is called in messages."""
    return "wave speed" if equation == "acoustic2d" else "conductivity"


def limit_text(equation: str, most: float, dt: float) -> str:
    """The limit as a user can check it by hand: the scheme's bound and the coefficient's."""
    if equation == "acoustic2d":
        return (f"CFL limit c*dt*sqrt(1/dx^2+1/dy^2) <= {acoustic_cfl_limit(1, 1) * math.sqrt(2):.4f} "
                f"(leapfrog, 4th-order space), i.e. c <= {most:.6g} at dt={dt:g}")
    return (f"stability limit kappa*dt*(1/dx^2+1/dy^2) <= 0.5 (explicit Euler), "
            f"i.e. kappa <= {most:.6g} at dt={dt:g}")


def unstable(equation: str, field: str, value: float, most: float, dt: float) -> str:
    """The message for a ``field`` whose largest value exceeds the limit ``most`` (on time.dt)."""
    return (f"unstable: {field} reaches {quantity(equation)} {value:.6g}; "
            f"{limit_text(equation, most, dt)}")
