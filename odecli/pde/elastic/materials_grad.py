"""The staggered parameters of a forward with gradient on the C kernels, as one autograd
operation with a hand-written backward: the one-cell ring's edge values (the rank's sides on
the grid's edge, :meth:`~odecli.pde.elastic.propagator.ElasticPropagator.padded_parameters`)
and :func:`~odecli.pde.elastic.reference.materials`, from the halo-exchanged ``(vp, vs, rho)``.

Why: autograd through ``padded_parameters`` and ``materials`` (a clone, four in-place edge
copies, a dozen shifted slices, each slice's backward a zeroed full plane) took about 0.16 s of
a 3.3 s gradient at 1040^2 float64 on one thread, as much as the rest of the gradient's work
outside the C kernels.  The forward is :func:`~odecli.pde.elastic.forward_pass.materials_without_graph`
(the reference's bits); the backward is ``materials_adjoint.c`` (20 ms with its output and the
edges' fold; :func:`_torch_backward`, the same in torch operations, took 46-66 ms).  The
reference path keeps autograd through :func:`~odecli.pde.elastic.reference.materials`, so the
tests that compare the C kernels' gradient with it check this backward too.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from odecli import native
from odecli.pde.elastic.forward_pass import materials_without_graph
from odecli.pde.elastic.reference import Materials

SOURCE = Path(__file__).resolve().parent / "materials_adjoint.c"


@functools.cache
def _library() -> ctypes.CDLL | None:
    """``materials_adjoint.c`` built (None where it cannot be: :func:`_torch_backward` then)."""
    return native.load_source("elastic_materials_adjoint", SOURCE.read_bytes())[0]


def fill_edges_(p: Tensor, sides: tuple[bool, bool, bool, bool]) -> Tensor:
    """The ring of ``p`` ``(3, ny + 2, nx + 2)`` on the grid's edges (``sides``: north, south,
    west, east) set to the edge node's values, rows first (the corners: the clamped node)."""
    north, south, west, east = sides
    if north:
        p[:, 0] = p[:, 1]
    if south:
        p[:, -1] = p[:, -2]
    if west:
        p[:, :, 0] = p[:, :, 1]
    if east:
        p[:, :, -1] = p[:, :, -2]
    return p


def _fold_edges_(g: Tensor, sides: tuple[bool, bool, bool, bool]) -> Tensor:
    """The adjoint of :func:`fill_edges_` in place: each edge ring's gradient added to the node
    it copied, in the reverse order, the ring's set to 0."""
    north, south, west, east = sides
    if east:
        g[:, :, -2] += g[:, :, -1]
        g[:, :, -1] = 0
    if west:
        g[:, :, 1] += g[:, :, 0]
        g[:, :, 0] = 0
    if south:
        g[:, -2] += g[:, -1]
        g[:, -1] = 0
    if north:
        g[:, 1] += g[:, 0]
        g[:, 0] = 0
    return g


class _Materials(torch.autograd.Function):
    @staticmethod
    def forward(ctx, exchanged: Tensor, sides: tuple, free_surface_here: bool):
        p = fill_edges_(exchanged.detach().clone(), sides)
        m = materials_without_graph(p, free_surface_here)
        ctx.save_for_backward(p, m.lam2mu, m.lam)
        ctx.sides = sides
        ctx.set_materialize_grads(False)
        return m.by, m.bx, m.lam2mu, m.lam, m.mu_xy, m.surface

    @staticmethod
    def backward(ctx, *grads):
        p, lam2mu, lam = ctx.saved_tensors
        lib = _library() if p.device.type == "cpu" and p.dtype in _SUFFIX else None
        if lib is None or not USE_C:
            out = _torch_backward(p, lam2mu, lam, *grads)
        else:
            out = torch.empty_like(p)
            grads = [None if g is None else g.contiguous() for g in grads]
            ptr = lambda t: ctypes.c_void_p(None if t is None else t.data_ptr())
            kernel = getattr(lib, f"elastic_materials_adjoint_{_SUFFIX[p.dtype]}")
            kernel(ctypes.c_long(lam2mu.shape[0]), ctypes.c_long(lam2mu.shape[1]), ptr(p),
                   *[ptr(g) for g in grads], ptr(out))
        return _fold_edges_(out, ctx.sides), None, None


_SUFFIX = {torch.float64: "f64", torch.float32: "f32"}
USE_C = True  # False: the torch backward (the tests compare the two)


def _torch_backward(p: Tensor, lam2mu: Tensor, lam: Tensor, g_by, g_bx, g_lam2mu, g_lam,
                    g_mu_xy, g_surface) -> Tensor:
    """:class:`_Materials`' backward in torch operations (before the edges' fold): where
    ``materials_adjoint.c`` does not build, and for the tests to compare it with."""
    vp, vs, rho = p[0], p[1], p[2]
    inner = (slice(1, -1), slice(1, -1))
    below, right, below_right = (slice(2, None), slice(1, -1)), (slice(1, -1), slice(2, None)), \
        (slice(2, None), slice(2, None))
    # adjoints of lam2mu and mu at the nodes (lam = lam2mu - 2 mu), then the surface's
    g_l2m = (torch.zeros_like(lam2mu) if g_lam2mu is None else g_lam2mu.clone())
    g_muc = torch.zeros_like(lam2mu)
    if g_lam is not None:
        g_l2m += g_lam
        g_muc.add_(g_lam, alpha=-2.0)
    if g_surface is not None:  # surface = l2m - lam^2 / l2m on row 0
        r = lam[0] / lam2mu[0]
        g_lam0 = g_surface * (-2.0 * r)
        g_l2m[0] += g_surface * (1.0 + r * r) + g_lam0
        g_muc[0] += -2.0 * g_lam0
    g_mu = p.new_zeros(p.shape[1:])
    g_mu[inner] = g_muc
    g_b = p.new_zeros(p.shape[1:])
    if g_mu_xy is not None:
        q = 0.25 * g_mu_xy
        for at in (inner, below, right, below_right):
            g_mu[at] += q
    if g_by is not None:
        h = 0.5 * g_by
        g_b[inner] += h
        g_b[below] += h
    if g_bx is not None:
        h = 0.5 * g_bx
        g_b[inner] += h
        g_b[right] += h
    # mu = rho vs^2, lam2mu = rho vp^2 (used inside only), b = 1 / rho
    out = torch.empty_like(p)
    out[0] = 0
    out[0][inner] = g_l2m * (2.0 * rho[inner] * vp[inner])
    torch.mul(g_mu, 2.0 * rho * vs, out=out[1])
    torch.mul(g_mu, vs * vs, out=out[2])
    out[2] -= g_b / (rho * rho)
    out[2][inner] += g_l2m * (vp[inner] * vp[inner])
    return out


def materials_with_adjoint(exchanged: Tensor, sides: tuple[bool, bool, bool, bool],
                           free_surface_here: bool) -> Materials:
    """The staggered parameters from the halo-exchanged ``(vp, vs, rho)`` ``(3, ny + 2, nx +
    2)`` (its ring on the grid's ``sides`` still to fill), differentiable by the hand-written
    backward above."""
    return Materials(*_Materials.apply(exchanged, tuple(sides), free_surface_here))
