"""Batched linear algebra for the implicit methods: per-sample Jacobians and LU factorisations.

Samples are independent, so ``d f(y)_b / d y_c = 0`` for ``b != c`` and the Jacobian of
``sum_b f(t_b, y_b)_i`` with respect to the whole (A, n) batch is row ``i`` of every sample's
Jacobian at once. :func:`jacobian` therefore needs ``n`` reverse-mode passes (done as one
vectorised ``autograd.grad`` with ``is_grads_batched``, or a loop when the right-hand side has
operations vmap cannot batch) whatever the batch size, and works for the compiled expression
right-hand sides and for plain Python ones alike.

Whether J carries a graph is the caller's choice. The Newton matrices of the ESDIRK methods only
steer the iteration, so their J is a constant. A Rosenbrock step uses J in its formula, so a
gradient through the solve (``adjoint: direct`` or ``checkpoint``) needs J's own derivatives
with respect to y and the parameters: without them rodas5's gradients were off by 0.3-70 %
and did not converge as the tolerance was tightened.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

BoundRHS = Callable[[Tensor, Tensor], Tensor]

_VMAP_OK: dict[int, bool] = {}  # id(function's code) -> did is_grads_batched work for it


def jacobian(rhs: BoundRHS, t: Tensor, y: Tensor, time_derivative: bool = True,
             differentiable: bool = False) -> tuple[Tensor, Tensor]:
    """Return ``(J, f_t)``: J (A, n, n) with ``J[b, i, j] = d f_i / d y_j`` of sample b, and
    ``f_t`` (A, n) = ``d f / d t`` (zeros when ``time_derivative`` is False or f ignores t).

    ``differentiable``: J and f_t keep their graph to ``y`` and to whatever the right-hand side
    closes over (its parameters), so that a gradient through the caller sees their derivatives.
    Otherwise they are constants (detached)."""
    batch, n = y.shape
    # The local graph of f keeps its own saved tensors: inside a checkpointed segment
    # (torch.utils.checkpoint) they would be stand-ins, and every autograd.grad below would
    # recompute the whole segment so far, making a segment cost the square of its steps.
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
        yv = y if differentiable and y.requires_grad else y.detach().clone().requires_grad_(True)
        tv = t.detach().clone().requires_grad_(time_derivative)
        f = rhs(tv, yv)
        inputs = (yv, tv) if time_derivative else (yv,)
        if not f.requires_grad:  # f does not depend on y or t at all
            return y.new_zeros(batch, n, n), y.new_zeros(batch, n)
        grads = None
        key = _code_key(rhs)
        if _VMAP_OK.get(key, True):
            basis = torch.eye(n, dtype=y.dtype, device=y.device)[:, None, :].expand(n, batch, n)
            try:
                grads = torch.autograd.grad(f, inputs, grad_outputs=basis, is_grads_batched=True,
                                            allow_unused=True, retain_graph=True,
                                            create_graph=differentiable)
                _VMAP_OK[key] = True
            except (RuntimeError, NotImplementedError):  # an op without a batching rule
                _VMAP_OK[key] = False
        if grads is None:
            rows_y, rows_t = [], []
            for i in range(n):
                g = torch.autograd.grad(f[:, i].sum(), inputs, allow_unused=True,
                                        retain_graph=differentiable or i < n - 1,
                                        create_graph=differentiable)
                rows_y.append(g[0] if g[0] is not None else torch.zeros_like(yv))
                if time_derivative:
                    rows_t.append(g[1] if g[1] is not None else torch.zeros_like(tv))
            J = torch.stack(rows_y, dim=1)
            ft = torch.stack(rows_t, dim=1) if time_derivative else y.new_zeros(batch, n)
        else:
            gy = grads[0] if grads[0] is not None else y.new_zeros(n, batch, n)
            J = gy.permute(1, 0, 2)
            if time_derivative and grads[1] is not None:
                ft = grads[1].permute(1, 0)
            else:
                ft = y.new_zeros(batch, n)
    if differentiable:
        return J.contiguous(), ft.contiguous()
    return J.detach().contiguous(), ft.detach().contiguous()


def _keep(tensor: Tensor) -> Tensor:
    """A saved-tensor hook that keeps the tensor itself (see :func:`jacobian`)."""
    return tensor


def _code_key(rhs: BoundRHS) -> int:
    code = getattr(rhs, "__code__", None)
    return id(code) if code is not None else id(type(rhs))


def lu_factor(M: Tensor) -> tuple[Tensor, Tensor]:
    """Batched LU with partial pivoting; singular matrices do not raise (their solves give inf/nan,
    which the callers turn into a rejected step)."""
    LU, pivots, _ = torch.linalg.lu_factor_ex(M)
    return LU, pivots


def lu_solve(LU: Tensor, pivots: Tensor, b: Tensor) -> Tensor:
    """Solve ``M x = b`` per sample for b (A, n) with M's factors from :func:`lu_factor`."""
    return torch.linalg.lu_solve(LU, pivots, b.unsqueeze(-1)).squeeze(-1)


def refactor_rows(LU: Tensor, pivots: Tensor, M: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """Factor ``M`` only where ``rows`` (A,) is True and keep the old factors elsewhere."""
    idx = rows.nonzero().squeeze(1)
    if idx.numel() == rows.numel():
        return lu_factor(M)
    if idx.numel() == 0:
        return LU, pivots
    new_LU, new_piv = lu_factor(M[idx])
    return LU.index_put((idx,), new_LU), pivots.index_put((idx,), new_piv)
