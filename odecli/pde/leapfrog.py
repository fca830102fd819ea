"""One leapfrog step of the acoustic equation, as one autograd operation.

Fields are kept with their ghost ring: ``(B, ny + 4, nx + 4)``, the block at ``[2:-2, 2:-2]``.
``leapfrog_step(u, u_prev, c2dt2, sponge)`` returns

    u_next = G * ((2u - G*u_prev) + c2dt2 * lap4(u))     (zeros on the ring),

``G`` the sponge (taken as 1 when ``None``).  Applying ``G`` to ``u_prev`` here, rather than
storing a damped copy of ``u`` each step, is what Cerjan damping of both time levels amounts to,
with one array less to write.  On CPU the step runs as a fused C kernel with a hand-written
adjoint (:mod:`odecli.pde.native`): one pass over the grid forward and two backward, instead of
about twenty full-size temporaries, and no padding copy (a one-rank run never touches the ring;
with neighbours, :func:`odecli.parallel.ops.halo_fill` overwrites it in place).  Elsewhere, or
without a C compiler, :func:`reference_step` runs: the readable PyTorch version, which the kernel
reproduces bit for bit in the forward pass and to round-off in the gradient.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import Tensor

from odecli.pde import native
from odecli.pde.stencils import laplacian4

RING = 2
_SUFFIX = {torch.float64: "f64", torch.float32: "f32"}


def interior(u: Tensor) -> Tensor:
    """The block of a ringed field (a view)."""
    return u[..., RING:-RING, RING:-RING]


def reference_step(u: Tensor, u_prev: Tensor, c2dt2: Tensor, sponge: Tensor | None,
                   dy: float, dx: float) -> Tensor:
    """The step in plain PyTorch (any device); autograd differentiates it."""
    c, p = interior(u), interior(u_prev)
    if sponge is not None:
        p = p * sponge
    lap = laplacian4(u, dy, dx)
    u_next = (c + c).sub_(p).add_(lap.mul_(c2dt2))
    if sponge is not None:
        u_next = u_next * sponge
    return F.pad(u_next, (RING,) * 4)


def native_available(t: Tensor) -> tuple[bool, str]:
    """Whether the fused kernel can run on tensors like ``t`` (and if not, why)."""
    if t.device.type != "cpu":
        return False, f"the fused kernel is CPU-only (tensors on {t.device})"
    if t.dtype not in _SUFFIX:
        return False, f"no fused kernel for {t.dtype}"
    lib, why = native.load("acoustic")
    return lib is not None, why


def leapfrog_step(u: Tensor, u_prev: Tensor, c2dt2: Tensor, sponge: Tensor | None,
                  dy: float, dx: float, fused: bool, recycle: bool = False) -> Tensor:
    """The step: fused (the caller checked :func:`native_available`) or the reference.

    ``recycle=True`` (fused, no autograd) writes ``u_next`` over ``u_prev``'s buffer, which a
    caller that keeps no reference to ``u_prev`` does not need any more.
    """
    if not fused:
        return reference_step(u, u_prev, c2dt2, sponge, dy, dx)
    _check(u, u_prev, c2dt2, sponge)
    inv = (1.0 / (dy * dy), 1.0 / (dx * dx))
    if recycle and not torch.is_grad_enabled():
        return _forward(u, u_prev, c2dt2, sponge, *inv, out=u_prev)
    return _FusedStep.apply(u, u_prev, c2dt2, sponge, *inv)


def _ptr(t: Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() if t is not None else None)


def _kernel(kind: str, dtype: torch.dtype):
    lib, why = native.load("acoustic")
    if lib is None:
        raise RuntimeError(f"fused acoustic kernel unavailable: {why}")
    return getattr(lib, f"leapfrog_{kind}_{_SUFFIX[dtype]}")


def _forward(u, u_prev, c2dt2, sponge, iy2, ix2, out: Tensor) -> Tensor:
    b, ny, nx = u.shape[0], u.shape[1] - 2 * RING, u.shape[2] - 2 * RING
    _kernel("forward", u.dtype)(
        ctypes.c_long(b), ctypes.c_long(ny), ctypes.c_long(nx), _ptr(u), _ptr(u_prev),
        _ptr(c2dt2), _ptr(sponge), ctypes.c_double(iy2), ctypes.c_double(ix2), _ptr(out))
    return out


class _FusedStep(torch.autograd.Function):
    """The C forward and its C adjoint."""

    @staticmethod
    def forward(ctx, u, u_prev, c2dt2, sponge, iy2, ix2):
        u_next = _forward(u, u_prev, c2dt2, sponge, iy2, ix2, out=torch.empty_like(u))
        ctx.save_for_backward(u, c2dt2, sponge)
        ctx.inv = (iy2, ix2)
        return u_next

    @staticmethod
    def backward(ctx, g_next):
        u, c2dt2, sponge = ctx.saved_tensors
        b, ny, nx = u.shape[0], u.shape[1] - 2 * RING, u.shape[2] - 2 * RING
        g_next = g_next.contiguous()
        grad_u, grad_prev = torch.empty_like(u), torch.empty_like(u)
        grad_c2 = torch.zeros_like(c2dt2)
        scratch = u.new_empty(((ny + 4 * RING) * (nx + 4 * RING),))
        _kernel("backward", u.dtype)(
            ctypes.c_long(b), ctypes.c_long(ny), ctypes.c_long(nx), _ptr(u), _ptr(c2dt2),
            _ptr(sponge), _ptr(g_next), ctypes.c_double(ctx.inv[0]), ctypes.c_double(ctx.inv[1]),
            _ptr(grad_u), _ptr(grad_prev), _ptr(grad_c2), _ptr(scratch))
        return grad_u, grad_prev, grad_c2, None, None, None


def _check(u: Tensor, u_prev: Tensor, c2dt2: Tensor, sponge: Tensor | None) -> None:
    """The kernel reads raw memory: shapes, dtypes and layouts must be exactly as it assumes."""
    block = tuple(c2dt2.shape)
    ok = (u.dim() == 3 and u.shape == u_prev.shape and len(block) == 2
          and tuple(u.shape[1:]) == (block[0] + 2 * RING, block[1] + 2 * RING)
          and (sponge is None or tuple(sponge.shape) == block))
    if not ok:
        raise ValueError(f"leapfrog_step: expected u, u_prev (B, ny+4, nx+4) and c2dt2, sponge "
                         f"(ny, nx); got {tuple(u.shape)}, {tuple(u_prev.shape)}, {block}, "
                         f"{None if sponge is None else tuple(sponge.shape)}")
    for t in (u, u_prev, c2dt2, sponge):
        if t is not None and (t.dtype != u.dtype or not t.is_contiguous() or t.device != u.device):
            raise ValueError("leapfrog_step: all tensors must be contiguous and share dtype and device")
