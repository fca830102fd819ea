"""One explicit Runge–Kutta step for a batch: stages, solution, embedded error norm.

A pure function of tensors (no host synchronisation, no data-dependent Python branches), so the
same code runs eagerly as the readable reference and under ``torch.compile``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from odecli.ode import _dop853_coefficients as dop853
from odecli.ode.methods import ExplicitRK

# rhs(t (A,), y (A, n)) -> (A, n); per-sample parameters are already bound by the caller.
BoundRHS = Callable[[Tensor, Tensor], Tensor]


def weighted_sum(weights: Sequence[float], K: Sequence[Tensor], like: Tensor | None = None) -> Tensor:
    """sum_j w_j K_j over the nonzero weights (tableaux are sparse); zeros like ``like`` (or K[0]) if none.

    ``add(acc, k, alpha=w)`` fuses each multiply into the add: per-op dispatch, not arithmetic,
    dominates small batches, so fewer ops are faster (a stack + matvec was measured slower).
    """
    acc = None
    for w, k in zip(weights, K):
        if w == 0.0:
            continue
        acc = w * k if acc is None else torch.add(acc, k, alpha=w)
    return acc if acc is not None else torch.zeros_like(K[0] if like is None else like)


def rms_error_norm(err: Tensor, y0: Tensor, y1: Tensor, rtol: Tensor, atol: Tensor) -> Tensor:
    """Per-sample RMS over the state of err / (atol + rtol * max(|y0|, |y1|))."""
    scale = atol + rtol * torch.maximum(y0.abs(), y1.abs())
    return torch.sqrt(torch.mean((err / scale) ** 2, dim=-1))


def rk_step(
    method: ExplicitRK, rhs: BoundRHS, t: Tensor, y: Tensor, f0: Tensor, h: Tensor,
    rtol: Tensor, atol: Tensor,
) -> tuple[Tensor, Tensor, list[Tensor], Tensor | None]:
    """Take one step of size ``h`` (per sample) from (t, y) with ``f0 = rhs(t, y)``.

    Returns ``(y1, f1, K, err_norm)`` where ``K`` lists the stage derivatives followed by
    ``f1 = rhs(t + h, y1)`` (the next step's first stage), and ``err_norm`` is None for
    fixed-step methods.
    """
    hcol = h[:, None]
    K = [f0]
    for c, a_row in zip(method.c[1:], method.a[1:]):
        K.append(rhs(torch.add(t, h, alpha=c), torch.addcmul(y, hcol, weighted_sum(a_row, K))))
    y1 = torch.addcmul(y, hcol, weighted_sum(method.b, K))
    f1 = rhs(t + h, y1)
    K.append(f1)
    if not method.adaptive:
        return y1, f1, K, None
    if method.name == "dop853":
        return y1, f1, K, _dop853_error_norm(K, y, y1, h, rtol, atol)
    err = hcol * weighted_sum(method.e, K)
    return y1, f1, K, rms_error_norm(err, y, y1, rtol, atol)


def _dop853_error_norm(K: list[Tensor], y0: Tensor, y1: Tensor, h: Tensor, rtol: Tensor, atol: Tensor) -> Tensor:
    """DOP853's blend of its 5th- and 3rd-order estimates (Hairer's DOP853, scipy's DOP853)."""
    scale = atol + rtol * torch.maximum(y0.abs(), y1.abs())
    err5 = (weighted_sum(dop853.E5, K) / scale).pow(2).sum(-1)
    err3 = (weighted_sum(dop853.E3, K) / scale).pow(2).sum(-1)
    denom = torch.sqrt((err5 + 0.01 * err3) * y0.shape[-1])
    norm = h.abs() * err5 / torch.where(denom > 0, denom, torch.ones_like(denom))
    # Only an exactly zero estimate means zero error; a NaN one must stay NaN so the step fails.
    return torch.where(denom == 0, torch.zeros_like(norm), norm)
