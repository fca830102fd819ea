"""Dense output inside one step, evaluated per sample at its own ``theta = (t - t0) / h``.

Each function takes the step's data for the active rows and returns y at ``theta`` (shape (A,)).
They run only for steps that contain evaluation times, so steps are never forced onto the grid.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from odecli.ode import _dop853_coefficients as dop853
from odecli.ode.methods import ExplicitRK
from odecli.ode.stages import weighted_sum

Interpolant = Callable[[Tensor], Tensor]


def hermite(y0: Tensor, y1: Tensor, f0: Tensor, f1: Tensor, h: Tensor) -> Interpolant:
    """Cubic Hermite through (y0, f0) and (y1, f1): 3rd order, needs no extra evaluations."""
    dy = y1 - y0
    hcol = h[:, None]

    def evaluate(theta: Tensor) -> Tensor:
        th = theta[:, None]
        bracket = (1 - 2 * th) * dy + (th - 1) * hcol * f0 + th * hcol * f1
        return (1 - th) * y0 + th * y1 + th * (th - 1) * bracket

    return evaluate


def polynomial(method: ExplicitRK, y0: Tensor, K: Sequence[Tensor], h: Tensor) -> Interpolant:
    """``y0 + h * sum_i K_i * sum_j P[i, j] theta**(j+1)``, evaluated by Horner's rule."""
    assert method.p is not None
    degree = len(method.p[0])
    coeffs = [weighted_sum([row[j] for row in method.p], K) for j in range(degree)]
    hcol = h[:, None]

    def evaluate(theta: Tensor) -> Tensor:
        th = theta[:, None]
        acc = coeffs[-1]
        for q in reversed(coeffs[:-1]):
            acc = q + th * acc
        return y0 + hcol * th * acc

    return evaluate


def dop853_dense(
    rhs: Callable[[Tensor, Tensor], Tensor], t0: Tensor, y0: Tensor, y1: Tensor, K: list[Tensor], h: Tensor
) -> Interpolant:
    """DOP853's 7th-order continuous extension; costs three extra evaluations of the RHS."""
    hcol = h[:, None]
    K = list(K)
    for a_row, c in zip(dop853.A_EXTRA, dop853.C_EXTRA):
        dy = weighted_sum(a_row[: len(K)], K)
        K.append(rhs(t0 + c * h, y0 + hcol * dy))
    f0, f1 = K[0], K[dop853.N_STAGES]
    delta = y1 - y0
    F = [delta, hcol * f0 - delta, 2 * delta - hcol * (f1 + f0)]
    F += [hcol * weighted_sum(row, K) for row in dop853.D]

    def evaluate(theta: Tensor) -> Tensor:
        x = theta[:, None]
        acc = torch.zeros_like(y0)
        for i, term in enumerate(reversed(F)):
            acc = acc + term
            acc = acc * (x if i % 2 == 0 else 1 - x)
        return y0 + acc

    return evaluate
