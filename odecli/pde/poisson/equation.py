"""The steady diffusion equation as the registry sees it (:data:`odecli.pde.propagator.EQUATIONS`):
its coefficient (the conductivity or permeability ``kappa``, > 0 everywhere), no time step and so
no stability limit, the boundary rule, and the builder.  Torch-free: ``odecli validate`` reads it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from odecli.pde.poisson.propagator import PoissonPropagator
    from odecli.pde.propagator import Setup

PARAMETERS = ("kappa",)
STEADY = True  # no time axis: observations are (experiments, sensors)
QUANTITY = "conductivity"
LEAST = "> 0"
SIDES = ("top", "bottom", "left", "right")


def violates_sign(low: float) -> bool:
    """A zero or negative conductivity anywhere (the operator is then not positive definite)."""
    return low <= 0


def stability_limit(dt: float, dy: float, dx: float, scheme: str = "implicit") -> float:
    """No limit: a steady solve has no time step."""
    return math.inf


def limit_text(most: float, dt: float) -> str:
    """There is no limit to state: poisson2d is steady."""
    return "poisson2d is steady: no time step, no stability limit on kappa"


def check_boundary(boundary: dict) -> str | None:
    """Why ``boundary`` cannot be solved, or None.  With no Dirichlet side, ``-div(kappa grad u)
    = f`` has a solution only when the sources sum to zero, and then only up to a constant: we
    refuse it rather than pick one (a Dirichlet side, even one, fixes the level)."""
    if not any(boundary[s]["type"] == "dirichlet" for s in SIDES):
        return ("poisson2d needs at least one dirichlet side: with neumann (zero flux) on every "
                "side the solution is not unique and exists only if the sources sum to zero")
    return None


def build(setup: Setup) -> PoissonPropagator:
    """The Poisson propagator for one rank (imports torch); raises ``SetupError`` naming
    ``boundary`` for an all-Neumann boundary, or the ``solver`` key that cannot be used."""
    from odecli.pde.linear.settings import solver_problem
    from odecli.pde.poisson.propagator import PoissonPropagator
    from odecli.pde.propagator import SetupError

    problem = check_boundary(setup.boundary)
    if problem is not None:
        raise SetupError("boundary", problem)
    bad = solver_problem(setup.solver)
    if bad is not None:
        raise SetupError(*bad)
    return PoissonPropagator(setup)
