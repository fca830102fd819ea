"""The linear solve as one differentiable operation (the adjoint-state method).

``u = solve(kappa, b, system, faces)`` solves ``(shift I + scale A(kappa)) u = b`` with
``A(kappa) = -div(kappa grad .)``; its backward solves the adjoint system (the operator is
symmetric, so the same one, with the same preconditioner) for ``lambda = A^-T dL/du`` and
returns ``dL/db = lambda`` and ``dL/dkappa = -lambda^T (d(A u)/dkappa)``, the second formed by
autograd through the operator's face conductivities at the solved ``u``.  No solver iteration
is ever differentiated.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from odecli.parallel.halo import halo_exchange
from odecli.pde.linear.cg import conjugate_gradients
from odecli.pde.linear.settings import SolverSettings
from odecli.pde.linear.multigrid import Multigrid
from odecli.pde.linear.stencil import diffusion_stencil
from odecli.pde.stencils import divergence_flux

Faces = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class DiffusionSystem:
    """``shift I + scale A`` for fixed face conductivities, with its multigrid preconditioner,
    built once and reused by every solve with it (forward, adjoint, every implicit step).
    ``iterations`` collects the CG iterations of each solve in the order they ran."""

    def __init__(self, faces: Faces, dy: float, dx: float, decomp, comm,
                 settings: SolverSettings, scale: float = 1.0, shift: float = 0.0) -> None:
        self.dy, self.dx, self.decomp, self.comm = dy, dx, decomp, comm
        self.settings, self.scale, self.shift = settings, scale, shift
        # float64 whatever the fields' dtype: a float32 residual stalls near 1e-7, above the
        # tolerances a solve is asked for
        faces64 = tuple(f.detach().to(torch.float64) for f in faces)
        self.stencil = diffusion_stencil(faces64, dy, dx, scale, shift, decomp, comm)
        self.preconditioner = Multigrid(self.stencil)
        self.iterations: list[int] = []

    def solve(self, b: torch.Tensor, x0: torch.Tensor | None = None) -> torch.Tensor:
        """``u`` with ``||b - (shift I + scale A) u|| <= rtol ||b||`` (no autograd), solved in
        float64 and returned in ``b``'s dtype."""
        with torch.no_grad():
            u, its = conjugate_gradients(self.stencil.apply, self.preconditioner,
                                         b.to(torch.float64), self.settings, self.comm,
                                         None if x0 is None else x0.to(torch.float64))
        self.iterations.append(its)
        return u.to(b.dtype)

    def apply(self, faces: Faces, u: torch.Tensor) -> torch.Tensor:
        """``(shift I + scale A) u`` with the given (differentiable) faces and zero ghosts."""
        up = halo_exchange(u, self.decomp, self.comm, 1, 0.0)
        return self.shift * u - self.scale * divergence_flux(up, *faces, self.dy, self.dx)


class _Solve(Function):
    @staticmethod
    def forward(ctx, kappa, b, system: DiffusionSystem, faces: Callable, x0):
        u = system.solve(b, x0)
        ctx.system, ctx.faces = system, faces
        ctx.save_for_backward(kappa, u)
        return u

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_u):
        kappa, u = ctx.saved_tensors
        system = ctx.system
        lam = system.solve(grad_u)
        grad_kappa = None
        if ctx.needs_input_grad[0]:
            with torch.enable_grad():
                k = kappa.detach().requires_grad_(True)
                au = system.apply(ctx.faces(k), u)
                (grad_kappa,) = torch.autograd.grad(au, k, -lam)
        return grad_kappa, lam, None, None, None


def solve(kappa: torch.Tensor, b: torch.Tensor, system: DiffusionSystem,
          faces: Callable[[torch.Tensor], Faces], x0: torch.Tensor | None = None) -> torch.Tensor:
    """``u = (shift I + scale A(kappa))^-1 b`` on the block, differentiable in ``kappa`` (through
    ``faces(kappa)``, the conductivities ``system`` was built from) and in ``b``.  Collective."""
    return _Solve.apply(kappa, b, system, faces, x0)


__all__ = ["DiffusionSystem", "solve"]
