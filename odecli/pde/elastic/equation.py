"""The elastic equation as the registry sees it (:data:`odecli.pde.propagator.EQUATIONS`): its
three parameters ``vp``, ``vs``, ``rho``, the stability limit of the staggered 4th-order scheme
(on ``vp``, the fastest wave), the rules the parameters must keep, and the builder.
Torch-free: ``odecli validate`` reads it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from odecli.pde.elastic.propagator import ElasticPropagator
    from odecli.pde.propagator import Setup

QUANTITY = "P-wave speed"
LEAST = "> 0"
PARAMETERS: tuple[str, ...] = ("vp", "vs", "rho")
STEADY = False
SOURCE_TYPES: tuple[str, ...] = ("pressure", "fy", "fx")
RECEIVER_COMPONENTS: tuple[str, ...] = ("vy", "vx", "pressure")

# Staggered 4th-order first derivative (9/8, -1/24): its largest symbol is |9/8| + |1/24| = 7/6
# (at the Nyquist wavenumber), so leapfrog on the velocity-stress system is stable for
# vp * dt * (7/6) * sqrt(1/dx^2 + 1/dy^2) <= 1 (Virieux 1986; Levander 1988).
STENCIL_SUM = 9.0 / 8.0 + 1.0 / 24.0


def violates_sign(low: float) -> bool:
    """A P-wave speed of 0 or less anywhere."""
    return low <= 0


def cfl_limit(dy: float, dx: float) -> float:
    """Largest ``vp*dt`` of the scheme: ``vp dt (7/6) sqrt(1/dx^2 + 1/dy^2) <= 1``."""
    return 1.0 / (STENCIL_SUM * math.sqrt(1.0 / dx**2 + 1.0 / dy**2))


def stability_limit(dt: float, dy: float, dx: float) -> float:
    """Largest stable P-wave speed ``vp`` for this ``dt`` and grid spacing (S waves are slower:
    ``vs <= vp`` is required, so ``vp`` alone bounds the step)."""
    return cfl_limit(dy, dx) / dt


def limit_text(most: float, dt: float) -> str:
    """The limit as a user can check it by hand: the scheme's bound and the speed's."""
    return (f"CFL limit vp*dt*sqrt(1/dx^2+1/dy^2) <= {1.0 / STENCIL_SUM:.4f} "
            f"(staggered leapfrog, 4th-order space), i.e. vp <= {most:.6g} at dt={dt:g}")


def check_parameters(low: dict, high: dict) -> str | None:
    """The first rule the parameters break, in words, or None.

    ``low`` and ``high`` map parameter names to their smallest and largest values (over the
    field; a caller holding fields may pass, per rule, the pointwise extremes it needs, e.g.
    ``high["vs - vp"]``).  Rules: ``vp > 0``, ``vs >= 0``, ``rho > 0`` and ``vs <= vp``
    everywhere; ``vs < vp / sqrt(2)`` (a negative Lame lambda) is allowed.  ``vs <= vp`` is
    checked pointwise when ``high`` holds ``"vs - vp"`` (the largest of ``vs - vp`` over the
    nodes); otherwise from the extremes alone, which can only prove a violation when even the
    smallest ``vs`` exceeds the largest ``vp``, so the caller should pass ``"vs - vp"``.
    """
    if "vp" in low and low["vp"] <= 0:
        return f"vp must be > 0 everywhere (its smallest value is {low['vp']:.6g})"
    if "vs" in low and low["vs"] < 0:
        return f"vs must be >= 0 everywhere (its smallest value is {low['vs']:.6g})"
    if "rho" in low and low["rho"] <= 0:
        return f"rho must be > 0 everywhere (its smallest value is {low['rho']:.6g})"
    if "vs - vp" in high:
        if high["vs - vp"] > 0:
            return (f"vs must be <= vp everywhere (vs exceeds vp by up to "
                    f"{high['vs - vp']:.6g})")
    elif "vs" in low and "vp" in high and low["vs"] > high["vp"]:
        return (f"vs must be <= vp everywhere (vs is at least {low['vs']:.6g}, "
                f"vp at most {high['vp']:.6g})")
    return None


def build(setup: Setup) -> ElasticPropagator:
    """The elastic propagator for one rank (imports torch)."""
    from odecli.pde.elastic.build import build as build_elastic

    return build_elastic(setup)
