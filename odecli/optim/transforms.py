"""Bounds on the optimised variables: a box to project onto, and the margin of transformed ones.

A fit either moves an unbounded variable whose transform keeps the unknown inside its bounds (the
PDE unknowns: logit or log, see :data:`TRANSFORM_EDGE`), or moves the unknowns themselves and
projects every new point onto the box of their bounds (the ODE unknowns: :class:`Box`).
"""

from __future__ import annotations

import torch

# How close to a bound a bounded unknown's initial value may come: its inverse transform
# (logit or log) must stay finite.
TRANSFORM_EDGE = 1e-6


class Box:
    """Elementwise ``lower <= x <= upper`` for each part of a vector (see :mod:`odecli.optim.space`)."""

    def __init__(self, lower: list[torch.Tensor], upper: list[torch.Tensor]) -> None:
        self.lower, self.upper = lower, upper

    @torch.no_grad()
    def project_(self, params: list[torch.Tensor]) -> None:
        """Clip ``params`` onto the box in place (the exact values of ``numpy.clip``)."""
        for p, lo, hi in zip(params, self.lower, self.upper):
            p.clamp_(lo, hi)
