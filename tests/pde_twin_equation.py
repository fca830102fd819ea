"""A test-only equation with two named parameters, to test the application's several-parameter
plumbing (spec -> stacked coefficient -> per-parameter gradients, model errors, result file) on
a propagator whose physics is known: heat2d with ``kappa = a * b``.

``PARAMETERS = ("a", "b")``: the propagator receives ``(2, ny, nx)`` and runs heat2d's on the
product, so its gradient in ``a`` is ``b`` times heat2d's in kappa (autograd through the
product). ``check_parameters`` words the rule a real equation would (``0 < b <= 1``).
"""

from __future__ import annotations

from odecli.pde.heat import equation as heat

PARAMETERS = ("a", "b")
STEADY = False
QUANTITY = "twin a"
LEAST = "> 0"


def violates_sign(low: float) -> bool:
    return low <= 0


def check_parameters(low: dict, high: dict) -> str | None:
    if "b" in low and low["b"] <= 0:
        return f"b must be > 0, got {low['b']:g}"
    if "b" in high and high["b"] > 1:
        return f"b must be <= 1 everywhere (b reaches {high['b']:g})"
    if "b - a" in high and high["b - a"] > 1:  # a pointwise rule between the two
        return f"b must be <= a + 1 everywhere (b - a reaches {high['b - a']:g})"
    return None


def stability_limit(dt: float, dy: float, dx: float, scheme: str = "explicit") -> float:
    """The largest stable ``a`` with ``b <= 1`` (kappa = a*b <= a)."""
    return heat.stability_limit(dt, dy, dx)


def limit_text(most: float, dt: float) -> str:
    return f"a <= {most:.6g} at dt={dt:g}"


class TwinPropagator:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.halo, self.segments, self.fused = inner.halo, inner.segments, inner.fused

    def stability_limit(self) -> float:
        return self.inner.stability_limit()

    def engine(self) -> str:
        return "twin: " + self.inner.engine()

    def forward(self, coefficient, return_field: bool = False):
        assert coefficient.shape[0] == 2, coefficient.shape
        return self.inner.forward(coefficient[0] * coefficient[1], return_field)


def build(setup):
    return TwinPropagator(heat.build(setup))


def register(monkeypatch) -> None:
    """Make ``heat2d_twin`` an equation the registry and the spec accept, for one test."""
    import sys
    import typing

    from odecli.pde import propagator
    from odecli.specs import pde

    monkeypatch.setitem(propagator.EQUATIONS, "heat2d_twin", sys.modules[__name__])
    names = (*pde.EQUATIONS, "heat2d_twin")
    monkeypatch.setattr(pde, "EQUATIONS", names)
    fields = dict(pde.DOCUMENT_FIELDS)
    fields["equation"] = (typing.Literal[names], True)
    monkeypatch.setattr(pde, "DOCUMENT_FIELDS", fields)
