"""The staggered parameters of a forward with gradient on the C kernels, as one autograd
operation with a hand-written backward: the one-cell ring's edge values (the rank's sides on
the grid's edge, :meth:`~odecli.pde.elastic.propagator.ElasticPropagator.padded_parameters`)
and :func:`~odecli.pde.elastic.reference.materials`, from the halo-exchanged ``(vp, vs, rho)``.

Why: autograd through ``padded_parameters`` and ``materials`` (a clone, four in-place edge
copies, a dozen shifted slices, each slice's backward a zeroed full plane) took about 0.16 s of
a 3.3 s gradient at 1040^2 float64 on one thread, as much as the rest of the gradient's work
outside the C kernels.  The forward is :func:`~odecli.pde.elastic.forward_pass.materials_without_graph`
(the reference's bits); the backward is ``materials_adjoint.c``, built with the elastic
kernels (20 ms with its output and the edges' fold, against 46-66 ms for the same in torch
operations).  The reference path keeps autograd through
:func:`~odecli.pde.elastic.reference.materials`, so the tests that compare the C kernels'
gradient with it check this backward too (and tests/test_elastic_materials_grad.py each
output's adjoint alone).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from odecli.pde import native
from odecli.pde.elastic.forward_pass import materials_without_graph
from odecli.pde.elastic.reference import Materials


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
        lib, why = native.load("elastic")  # the forward ran on it (materials_without_graph)
        if lib is None:
            raise RuntimeError(f"fused elastic kernels unavailable: {why}")
        out = torch.empty_like(p)
        grads = [None if g is None else g.contiguous() for g in grads]
        ptr = lambda t: ctypes.c_void_p(None if t is None else t.data_ptr())
        kernel = getattr(lib, f"elastic_materials_adjoint_{_SUFFIX[p.dtype]}")
        kernel(ctypes.c_long(lam2mu.shape[0]), ctypes.c_long(lam2mu.shape[1]), ptr(p),
               *[ptr(g) for g in grads], ptr(out))
        return _fold_edges_(out, ctx.sides), None, None


_SUFFIX = {torch.float64: "f64", torch.float32: "f32"}


def materials_with_adjoint(exchanged: Tensor, sides: tuple[bool, bool, bool, bool],
                           free_surface_here: bool) -> Materials:
    """The staggered parameters from the halo-exchanged ``(vp, vs, rho)`` ``(3, ny + 2, nx +
    2)`` (its ring on the grid's ``sides`` still to fill), differentiable by the hand-written
    backward above."""
    return Materials(*_Materials.apply(exchanged, tuple(sides), free_surface_here))
