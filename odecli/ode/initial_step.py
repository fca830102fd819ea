"""Automatic initial step per sample (Hairer, Nørsett & Wanner, *Solving ODEs I*, §II.4)."""

from __future__ import annotations

import torch
from torch import Tensor

from odecli.ode.stages import BoundRHS


def select_initial_step(
    rhs: BoundRHS, t0: Tensor, y0: Tensor, f0: Tensor, direction: Tensor, error_order: int,
    rtol: Tensor, atol: Tensor,
) -> Tensor:
    """Return a positive step magnitude per sample; costs one RHS evaluation.

    Guess h0 from |y0| / |f0|, probe one Euler step to estimate the second derivative, and
    choose h so that the leading error term is about 1% of the tolerance.
    """
    scale = atol + rtol * y0.abs()
    d0 = torch.sqrt(torch.mean((y0 / scale) ** 2, dim=-1))
    d1 = torch.sqrt(torch.mean((f0 / scale) ** 2, dim=-1))
    small = (d0 < 1e-5) | (d1 < 1e-5)
    h0 = torch.where(small, torch.full_like(d0, 1e-6), 0.01 * d0 / torch.where(small, torch.ones_like(d1), d1))
    y1 = y0 + (direction * h0)[:, None] * f0
    f1 = rhs(t0 + direction * h0, y1)
    d2 = torch.sqrt(torch.mean(((f1 - f0) / scale) ** 2, dim=-1)) / h0
    dmax = torch.maximum(d1, d2)
    h1 = torch.where(
        dmax <= 1e-15,
        torch.clamp(h0 * 1e-3, min=1e-6),
        (0.01 / torch.where(dmax <= 1e-15, torch.ones_like(dmax), dmax)) ** (1.0 / (error_order + 1)),
    )
    h = torch.minimum(100 * h0, h1)
    return torch.nan_to_num(h, nan=1e-6, posinf=1e-6)
