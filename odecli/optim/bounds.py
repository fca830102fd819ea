"""The box of bounds an optimiser projects its points onto, for unknowns moved without a transform.

A fit either moves an unbounded variable whose transform keeps the unknown inside its bounds (the
PDE unknowns: logit or log, :mod:`odecli.optim.transforms`), or moves the unknowns themselves and
projects every new point onto the box of their bounds (the ODE unknowns: :class:`Box`).
"""

from __future__ import annotations

import torch


class Box:
    """Elementwise ``lower <= x <= upper`` for each part of a vector (see :mod:`odecli.optim.space`)."""

    def __init__(self, lower: list[torch.Tensor], upper: list[torch.Tensor]) -> None:
        self.lower, self.upper = lower, upper

    @torch.no_grad()
    def project_(self, params: list[torch.Tensor]) -> None:
        """Clip ``params`` onto the box in place (the exact values of ``numpy.clip``)."""
        for p, lo, hi in zip(params, self.lower, self.upper):
            p.clamp_(lo, hi)
