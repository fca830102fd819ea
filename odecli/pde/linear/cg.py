"""Preconditioned conjugate gradients over the decomposed grid, batched over right-hand sides.

Every right-hand side (an experiment, a shot) runs its own CG recurrence on the same operator;
the dot products of all of them travel in one all-reduce per reduction, so a batch costs the
messages of one solve.  Every stopping decision is taken on all-reduced numbers, so every rank
stops — or raises :class:`NotConverged` — at the same iteration.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from odecli.pde.linear.settings import NotConverged, SolverSettings


def _dots(a: torch.Tensor, b: torch.Tensor, comm) -> torch.Tensor:
    """Per right-hand side ``sum(a * b)`` over the whole grid (leading dims kept)."""
    local = (a * b).sum(dim=(-2, -1))
    if comm is None or getattr(comm, "size", 1) == 1:
        return local
    total = comm.allreduce_array(local.detach().cpu().numpy().astype(np.float64))
    return torch.as_tensor(total, dtype=a.dtype, device=a.device)


def conjugate_gradients(apply: Callable[[torch.Tensor], torch.Tensor],
                        precondition: Callable[[torch.Tensor], torch.Tensor],
                        b: torch.Tensor, settings: SolverSettings, comm,
                        x0: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """Solve ``A x = b`` for every right-hand side of ``b`` (``(..., ny, nx)`` on the block) to
    ``||b - A x|| <= rtol ||b||``; returns ``(x, iterations)`` (the most any right-hand side
    took).  Raises :class:`NotConverged` after ``max_iterations``."""
    b = b.detach()
    bnorm = _dots(b, b, comm).sqrt()
    target = settings.rtol * bnorm
    if x0 is None:
        x = torch.zeros_like(b)
        r = b.clone()
    else:
        x = x0.detach().clone()
        r = b - apply(x)
    rr = _dots(r, r, comm)
    if bool((rr.sqrt() <= target).all()):
        return x, 0
    z = precondition(r)
    p = z
    rz = _dots(r, z, comm)
    for it in range(1, settings.max_iterations + 1):
        q = apply(p)
        pq = _dots(p, q, comm)
        alpha = torch.where(pq > 0, rz / torch.where(pq > 0, pq, 1.0), 0.0)
        x = x + alpha[..., None, None] * p
        r = r - alpha[..., None, None] * q
        rr = _dots(r, r, comm)
        if bool((rr.sqrt() <= target).all()):
            return x, it
        z = precondition(r)
        rz_new = _dots(r, z, comm)
        beta = torch.where(rz != 0, rz_new / torch.where(rz != 0, rz, 1.0), 0.0)
        p = z + beta[..., None, None] * p
        rz = rz_new
    worst = float((rr.sqrt() / torch.where(bnorm > 0, bnorm, 1.0)).max())
    raise NotConverged(settings.max_iterations, worst, settings.rtol)


__all__ = ["NotConverged", "SolverSettings", "conjugate_gradients"]
