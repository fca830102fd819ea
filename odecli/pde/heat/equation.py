"""The heat equation as the registry sees it (:data:`odecli.pde.propagator.EQUATIONS`): its
coefficient (the conductivity ``kappa``), the explicit-Euler stability limit (none for the
implicit scheme) and how messages state it, and the builder.  Torch-free: ``odecli validate``
reads it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from odecli.pde.heat.propagator import HeatPropagator
    from odecli.pde.propagator import Setup

PARAMETERS = ("kappa",)
STEADY = False
SCHEMES = ("explicit", "implicit")  # forward Euler; backward Euler (one linear solve per step)
QUANTITY = "conductivity"
LEAST = ">= 0"


def violates_sign(low: float) -> bool:
    """A negative conductivity anywhere (it makes the equation ill-posed)."""
    return low < 0


def stability_limit(dt: float, dy: float, dx: float, scheme: str = "explicit") -> float:
    """Largest stable conductivity for explicit Euler with the 5-point conservative operator;
    backward Euler (``scheme="implicit"``) is stable for every conductivity."""
    if scheme == "implicit":
        return math.inf
    return 1.0 / (2.0 * dt * (1.0 / dx**2 + 1.0 / dy**2))


def limit_text(most: float, dt: float) -> str:
    """The limit as a user can check it by hand: the scheme's bound and the conductivity's."""
    return (f"stability limit kappa*dt*(1/dx^2+1/dy^2) <= 0.5 (explicit Euler), "
            f"i.e. kappa <= {most:.6g} at dt={dt:g}")


def build(setup: Setup) -> HeatPropagator:
    """The heat propagator for one rank (imports torch); its segments are ``round(sqrt(nt))``
    when ``auto``."""
    from odecli.pde.heat.propagator import HeatPropagator
    from odecli.pde.linear.settings import solver_problem
    from odecli.pde.propagator import SetupError
    from odecli.pde.segments import default_segment_count

    if setup.time_scheme not in SCHEMES:
        raise SetupError("time.scheme", f"must be one of {', '.join(SCHEMES)}, "
                                        f"got {setup.time_scheme!r}")
    bad = solver_problem(setup.solver) if setup.time_scheme == "implicit" else None
    if bad is not None:
        raise SetupError(*bad)

    segments = setup.time_segments
    if segments == "auto":
        segments = default_segment_count(setup.nt)
    return HeatPropagator(setup.grid, setup.block, setup.decomp, setup.comm, setup.dt, setup.nt,
                          setup.local, setup.boundary, setup.initial_condition, segments,
                          setup.timer, setup.dtype, setup.device,
                          scheme=setup.time_scheme, solver=setup.solver)
