"""Differentiable collectives (ADCME-style): each op's backward is its MPI adjoint.

Every op is collective: all ranks must call the same ops in the same order with the same
shapes.  Messages are staged through host memory as contiguous numpy buffers.  Each backward
is itself an autograd Function, so double backward works too.  The halo exchange, the one
neighbour-to-neighbour op, is :mod:`odecli.parallel.halo`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch.autograd import Function

from .comm import Comm
from .decomposition import Decomposition, decompose
from .halo import check_float, check_layout


def _host(t: Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy()


def _like(a: np.ndarray, ref: Tensor) -> Tensor:
    return torch.from_numpy(a).to(device=ref.device, dtype=ref.dtype)


class _AllreduceSum(Function):
    @staticmethod
    def forward(ctx, x: Tensor, comm: Comm) -> Tensor:
        ctx.comm = comm
        return _like(comm.allreduce_array(_host(x)), x)

    @staticmethod
    def backward(ctx, g: Tensor):
        return _AllreduceSum.apply(g, ctx.comm), None


def allreduce_sum(x: Tensor, comm: Comm) -> Tensor:
    """Sum over ranks, on every rank. Self-adjoint: the gradient is the sum of all ranks' gradients."""
    check_float(x, "allreduce_sum")
    if comm.size == 1:
        return x.clone()
    return _AllreduceSum.apply(x, comm)


class _Broadcast(Function):
    @staticmethod
    def forward(ctx, x: Tensor, comm: Comm, root: int) -> Tensor:
        ctx.args = (comm, root)
        return _like(comm.bcast_array(_host(x), root), x)

    @staticmethod
    def backward(ctx, g: Tensor):
        return _ReduceToRoot.apply(g, *ctx.args), None, None


class _ReduceToRoot(Function):
    @staticmethod
    def forward(ctx, x: Tensor, comm: Comm, root: int) -> Tensor:
        ctx.args = (comm, root)
        return _like(comm.reduce_array(_host(x), root), x)

    @staticmethod
    def backward(ctx, g: Tensor):
        return _Broadcast.apply(g, *ctx.args), None, None


def broadcast(x: Tensor, comm: Comm, root: int = 0) -> Tensor:
    """Root's ``x`` on every rank (all ranks pass the same shape). Gradients sum onto root; others get 0."""
    check_float(x, "broadcast")
    if not 0 <= root < comm.size:
        raise ValueError(f"broadcast: root rank {root} is outside 0..{comm.size - 1}")
    if comm.size == 1:
        return x.clone()
    return _Broadcast.apply(x, comm, root)


def gather_global(local: Tensor, decomp: Decomposition, comm: Comm, root: int = 0) -> Tensor | None:
    """Assemble the global ``(..., ny, nx)`` field on root (for output; not differentiable)."""
    check_layout(decomp, comm, "gather_global")
    blocks = comm.gather_object(_host(local), root=root)
    if blocks is None:
        return None
    ny, nx = decomp.global_shape
    out = np.empty(tuple(local.shape[:-2]) + (ny, nx), dtype=blocks[0].dtype)
    for r, block in enumerate(blocks):
        b = decompose(decomp.global_shape, decomp.nranks, r, decomp.proc_grid)
        out[..., b.y0 : b.y1, b.x0 : b.x1] = block
    return _like(out, local)


def local_block(global_field: Tensor, decomp: Decomposition) -> Tensor:
    """This rank's slice of a field that every rank holds globally (differentiable view)."""
    if global_field.dim() < 2 or tuple(global_field.shape[-2:]) != decomp.global_shape:
        raise ValueError(
            f"local_block: expected a tensor ending in the global shape {decomp.global_shape}, "
            f"got {tuple(global_field.shape)}"
        )
    return global_field[..., decomp.y0 : decomp.y1, decomp.x0 : decomp.x1]
