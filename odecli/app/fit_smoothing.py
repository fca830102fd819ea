"""The smoothing that shapes L-BFGS's first inverse-Hessian guess for a grid unknown.

A grid unknown's gradient is rough where the data see the model best (next to sources and
receivers) and small elsewhere; a quasi-Newton method started from ``gamma * I`` spends its first
dozens of iterations on that roughness. Started from ``gamma * S``, with ``S`` a smoothing over a
few cells, its steps are smooth from the first (a Sobolev-type gradient; the minimiser is the
same). ``S = A^K``, ``A x = x + (1/8) * (sum of the 4 neighbours - 4 x)`` with zeros outside the
grid: symmetric with eigenvalues in (0, 1], so ``S`` is positive definite; ``K = 4 sigma^2``
passes give a Gaussian-like kernel of ``sigma`` cells. Each pass is one halo exchange of width 1,
so N ranks compute exactly what one rank does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from odecli.optim import Vector
from odecli.parallel.ops import halo_exchange

BETA = 0.125  # the largest weight that keeps A positive definite
AUTO_FRACTION = 1.0 / 8  # auto: sigma = this fraction of the grid's smaller side, in cells ...
AUTO_MOST = 16.0  # ... at most this many (4 * 16^2 passes of a cheap stencil per application)


def smoothing_cells(setting: str | float, shape: tuple[int, int]) -> float:
    """The smoothing length in cells that ``optimizer.smoothing`` asks for on a grid of ``shape``."""
    if setting == "auto":
        return min(min(shape) * AUTO_FRACTION, AUTO_MOST)
    return float(setting)


def grid_smoother(sigma_cells: float, decomp, comm, distributed: list[bool]) -> Callable[[Vector], Vector] | None:
    """``S`` on the distributed parts of a vector (the grid blocks), identity on the others;
    None when ``sigma_cells`` asks for no smoothing or nothing is distributed."""
    passes = round(4.0 * sigma_cells * sigma_cells)
    if passes < 1 or not any(distributed):
        return None

    @torch.no_grad()
    def smooth_block(u: torch.Tensor) -> torch.Tensor:
        for _ in range(passes):
            up = halo_exchange(u, decomp, comm, 1, fill=0.0)
            nb = up[:-2, 1:-1] + up[2:, 1:-1] + up[1:-1, :-2] + up[1:-1, 2:]
            u = u + BETA * (nb - 4.0 * u)
        return u

    def apply(v: Vector) -> Vector:
        return [smooth_block(x) if dist else x for x, dist in zip(v, distributed)]

    return apply


__all__ = ["grid_smoother", "smoothing_cells"]
