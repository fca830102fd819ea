"""The spec's equation-specific settings as the propagator's :class:`~odecli.pde.propagator.Setup`
fields, and the linear solver's non-convergence error where this build has the solver.

Kept apart from odecli.app.pde_problem (which assembles the problem) so that what an equation
takes beyond the common Setup is read in one place.
"""

from __future__ import annotations

from odecli.errors import SpecError
from odecli.pde.propagator import Setup


def not_converged() -> tuple[type[BaseException], ...]:
    """The linear solver's non-convergence error, where this build has the solver."""
    try:
        from odecli.pde.linear import NotConverged
    except ImportError:
        return ()
    return (NotConverged,)


def equation_settings(spec: dict) -> dict:
    """The spec's equation-specific settings, as :class:`odecli.pde.propagator.Setup` fields:
    elastic2d's source type and receiver components, the linear solver and the time scheme.
    A setting this build's ``Setup`` lacks is left out where it is the default, and refused
    where the spec asks for it (a silent explicit run for ``scheme: implicit`` would be wrong)."""
    wanted = {"source_type": spec["sources"].get("type", "pressure"),
              "receiver_components": spec["receivers"].get("components"),
              "solver": spec.get("solver"),
              "time_scheme": "explicit" if spec["steady"] else spec["time"]["scheme"]}
    defaults = {"source_type": "pressure", "receiver_components": None, "solver": None, "time_scheme": "explicit"}
    known = Setup.__dataclass_fields__
    out = {}
    for key, value in wanted.items():
        if key in known:
            out[key] = value
        elif value != defaults[key]:
            field = {"time_scheme": "time.scheme", "solver": "solver", "source_type": "sources.type",
                     "receiver_components": "receivers"}[key]
            raise SpecError(spec["file"], field, f"this build's {spec['equation']} propagator does not take it")
    return out
