"""The acoustic equation as the registry sees it (:data:`odecli.pde.propagator.EQUATIONS`):
its coefficient (the wave speed ``c``), the leapfrog / 4th-order stability limit and how
messages state it, and the builder.  Torch-free: ``odecli validate`` reads it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from odecli.pde.acoustic.propagator import AcousticPropagator
    from odecli.pde.propagator import Setup

QUANTITY = "wave speed"
LEAST = "> 0"

# Largest eigenvalue of the 4th-order 1-D second derivative (-1/12, 4/3, -5/2, 4/3, -1/12)
# times h^2 (odecli.pde.stencils.laplacian4).
LAMBDA_4TH = 16.0 / 3.0


def violates_sign(low: float) -> bool:
    """A speed of 0 or less anywhere (the equation sees only ``c^2``: a negative one would run)."""
    return low <= 0


def cfl_limit(dy: float, dx: float) -> float:
    """Largest ``c*dt`` for the leapfrog / 4th-order scheme: (c dt)^2 * 16/3 * (1/dx^2+1/dy^2) <= 4.

    The run uses this limit whatever the boundary: the sponge (factors <= 1) and the free surface
    do not enter it.
    """
    return (4.0 / (LAMBDA_4TH * (1.0 / dx**2 + 1.0 / dy**2))) ** 0.5


def stability_limit(dt: float, dy: float, dx: float) -> float:
    """Largest stable wave speed for this ``dt`` and grid spacing."""
    return cfl_limit(dy, dx) / dt


def limit_text(most: float, dt: float) -> str:
    """The limit as a user can check it by hand: the scheme's bound and the speed's."""
    return (f"CFL limit c*dt*sqrt(1/dx^2+1/dy^2) <= {cfl_limit(1, 1) * math.sqrt(2):.4f} "
            f"(leapfrog, 4th-order space), i.e. c <= {most:.6g} at dt={dt:g}")


def build(setup: Setup) -> AcousticPropagator:
    """The acoustic propagator for one rank (imports torch)."""
    from odecli.pde.acoustic.build import build as build_acoustic

    return build_acoustic(setup)
