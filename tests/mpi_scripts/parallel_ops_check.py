"""Checks of odecli.parallel.ops on every rank: ``mpiexec -n N python parallel_ops_check.py N [DEVICE]``.

DEVICE (default cpu) is where the tensors live; ``cuda`` checks the host-staged path for GPU tensors.

Prints one line ``OK parallel_ops N ranks`` on rank 0 when every rank passed. Any failure
prints a traceback and aborts all ranks, so the launcher sees a non-zero exit, not a hang.
"""

from __future__ import annotations

import itertools
import sys
import traceback
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from odecli.parallel import (
    Comm,
    Decomposition,
    GhostExchange,
    allreduce_sum,
    broadcast,
    decompose,
    gather_global,
    get_comm,
    halo_exchange,
    halo_fill,
    local_block,
)

GRIDS = {2: [(2, 1), (1, 2)], 4: [(2, 2), (4, 1), (1, 4)]}
SHAPES = [(13, 10), (8, 8), (7, 11)]
BATCHES = [(), (3,), (2, 3)]
RTOL = 1e-12


def known_field(batch: tuple[int, ...], shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """f = 100000*b + 1000*i + j: every cell (and batch entry) is distinguishable and exact in fp32."""
    ny, nx = shape
    nb = 1
    for s in batch:
        nb *= s
    b = torch.arange(nb, dtype=dtype).reshape(*batch, 1, 1)
    i = torch.arange(ny, dtype=dtype).reshape(ny, 1)
    j = torch.arange(nx, dtype=dtype).reshape(1, nx)
    return 100000 * b + 1000 * i + j


def dot_over_ranks(a: torch.Tensor, b: torch.Tensor, comm: Comm) -> float:
    return comm.allreduce_scalar(float(torch.sum(a.detach() * b.detach())), "sum")


def assert_adjoint(lhs: float, rhs: float, what: str) -> None:
    scale = max(abs(lhs), abs(rhs), 1e-300)
    if abs(lhs - rhs) > RTOL * scale:
        rel = abs(lhs - rhs) / scale
        raise AssertionError(f"{what}: <Ax,y>={lhs!r} != <x,A^T y>={rhs!r} (rel {rel:.2e})")


def describe(d: Decomposition, width: int) -> str:
    return f"grid={d.proc_grid} shape={d.global_shape} width={width}"


def rank_generator(comm: Comm, salt: int) -> torch.Generator:
    return torch.Generator(device=torch.get_default_device()).manual_seed(1000 * salt + comm.rank)


def configs(comm: Comm) -> Iterator[tuple[Decomposition, int]]:
    for grid, shape in itertools.product(GRIDS[comm.size], SHAPES):
        for width in (1, 2):
            d = decompose(shape, comm.size, comm.rank, grid)
            if width <= min(d.min_local_shape):
                yield d, width


def check_halo_values(comm: Comm) -> None:
    fill = -7.5
    for (d, w), batch, dtype in itertools.product(configs(comm), BATCHES, (torch.float64, torch.float32)):
        g = known_field(batch, d.global_shape, dtype)
        expected = F.pad(g, (w, w, w, w), value=fill)[..., d.y0 : d.y1 + 2 * w, d.x0 : d.x1 + 2 * w]
        got = halo_exchange(local_block(g, d), d, comm, w, fill)
        if got.dtype != dtype or got.device != g.device or not torch.equal(got, expected):
            raise AssertionError(f"halo values wrong: {describe(d, w)} batch={batch} {dtype}")


def check_halo_too_wide(comm: Comm) -> None:
    d = decompose((7, 11), comm.size, comm.rank, (comm.size, 1))  # smallest block 7 // size rows
    width = 7 // comm.size + 1
    try:
        halo_exchange(torch.zeros(d.local_shape, dtype=torch.float64), d, comm, width)
    except ValueError:
        return
    raise AssertionError("halo wider than the smallest block was not rejected")


def check_halo_adjoint(comm: Comm) -> None:
    for k, ((d, w), batch) in enumerate(itertools.product(configs(comm), BATCHES[:2])):
        gen = rank_generator(comm, k)
        x = torch.randn(*batch, *d.local_shape, dtype=torch.float64, generator=gen, requires_grad=True)
        padded = (d.local_shape[0] + 2 * w, d.local_shape[1] + 2 * w)
        y = torch.randn(*batch, *padded, dtype=torch.float64, generator=gen)
        lhs = dot_over_ranks(halo_exchange(x, d, comm, w, 0.0), y, comm)
        # A nonzero fill only shifts the output, so the gradient must still be A^T y.
        (aty,) = torch.autograd.grad(halo_exchange(x, d, comm, w, 2.5), x, y)
        assert_adjoint(lhs, dot_over_ranks(x, aty, comm), f"halo {describe(d, w)} batch={batch}")
    # Double backward: differentiating A^T y with respect to y gives A back.
    d = decompose((13, 10), comm.size, comm.rank)
    x = torch.randn(d.local_shape, dtype=torch.float64, generator=rank_generator(comm, 999))
    y = torch.randn(d.local_shape[0] + 4, d.local_shape[1] + 4, dtype=torch.float64, requires_grad=True)
    z = torch.randn(d.local_shape, dtype=torch.float64)
    (aty,) = torch.autograd.grad(halo_exchange(x.requires_grad_(), d, comm, 2), x, y, create_graph=True)
    (az,) = torch.autograd.grad(aty, y, z)
    if not torch.allclose(az, halo_exchange(z, d, comm, 2), rtol=0, atol=1e-14):
        raise AssertionError("double backward of halo_exchange is not the halo exchange")


def ringed(x: torch.Tensor, w: int, ring_value: float) -> torch.Tensor:
    """``x`` with a ghost ring of width ``w`` holding ``ring_value`` (a field as the kernels keep it)."""
    return F.pad(x, (w, w, w, w), value=ring_value)


def check_halo_fill(comm: Comm) -> None:
    """In-place fill = halo_exchange with fill = the old ring; its adjoint passes the dot-product test."""
    for k, ((d, w), batch, dtype) in enumerate(
            itertools.product(configs(comm), BATCHES[:2], (torch.float64, torch.float32))):
        g = known_field(batch, d.global_shape, dtype)
        x = local_block(g, d)
        got = halo_fill(ringed(x, w, -3.0), d, comm, w)
        if not torch.equal(got, halo_exchange(x, d, comm, w, -3.0)):
            raise AssertionError(f"halo_fill values wrong: {describe(d, w)} batch={batch} {dtype}")
        if dtype is not torch.float64:
            continue
        gen = rank_generator(comm, 500 + k)
        xr = torch.randn(*batch, d.local_shape[0] + 2 * w, d.local_shape[1] + 2 * w,
                         dtype=dtype, generator=gen, requires_grad=True)
        y = torch.randn(xr.shape, dtype=dtype, generator=gen)
        out = halo_fill(xr.clone(), d, comm, w)
        (aty,) = torch.autograd.grad(out, xr, y)
        assert_adjoint(dot_over_ranks(out, y, comm), dot_over_ranks(xr, aty, comm),
                       f"halo_fill {describe(d, w)} batch={batch}")


def check_ghost_exchange(comm: Comm) -> None:
    """Two fields with deep rings (3 cells where there is a neighbour, 1 elsewhere) exchanged
    3 and 1 cells deep in one go: the extended block holds the global values, corners included,
    the rest is untouched, and the adjoint passes the dot-product test."""
    if torch.get_default_device().type != "cpu":
        return
    depths = (3, 1)
    for grid, shape in itertools.product(GRIDS[comm.size], SHAPES):
        d = decompose(shape, comm.size, comm.rank, grid)
        if max(depths) > min(d.min_local_shape):
            continue
        sides = (d.north, d.south, d.west, d.east)
        ring = tuple(max(depths) if peer is not None else 1 for peer in sides)
        rn, rs, rw, re = ring
        ny, nx = d.local_shape
        fields, expected = [], []
        for i, k in enumerate(depths):
            g = known_field((2,), d.global_shape, torch.float64) + 1e7 * i
            f = torch.full((2, ny + rn + rs, nx + rw + re), -3.0, dtype=torch.float64)
            f[:, rn : rn + ny, rw : rw + nx] = local_block(g, d)
            e = f.clone()
            dn, ds, dw, de = (k if peer is not None else 0 for peer in sides)
            grown = g[:, d.y0 - dn : d.y1 + ds, d.x0 - dw : d.x1 + de]
            e[:, rn - dn : rn + ny + ds, rw - dw : rw + nx + de] = grown
            fields.append(f)
            expected.append(e)
        GhostExchange(tuple(fields[0].shape), torch.float64, d, comm, ring, depths)(fields)
        for i, (f, e) in enumerate(zip(fields, expected)):
            if not torch.equal(f, e):
                raise AssertionError(f"ghost exchange values wrong: grid={grid} shape={shape} field {i}")
        gen = rank_generator(comm, 700)
        xs = [torch.randn(fields[0].shape, dtype=torch.float64, generator=gen) for _ in depths]
        ys = [torch.randn(fields[0].shape, dtype=torch.float64, generator=gen) for _ in depths]
        fx = [x.clone() for x in xs]
        GhostExchange(tuple(fx[0].shape), torch.float64, d, comm, ring, depths)(fx)
        aty = [y.clone() for y in ys]
        GhostExchange(tuple(aty[0].shape), torch.float64, d, comm, ring, depths, adjoint=True)(aty)
        lhs = sum(dot_over_ranks(a, b, comm) for a, b in zip(fx, ys))
        rhs = sum(dot_over_ranks(a, b, comm) for a, b in zip(xs, aty))
        assert_adjoint(lhs, rhs, f"ghost exchange grid={grid} shape={shape}")


def check_allreduce_adjoint(comm: Comm) -> None:
    gen = rank_generator(comm, 1)
    x = torch.randn(3, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    y = torch.randn(3, 4, dtype=torch.float64, generator=gen)
    s = allreduce_sum(x, comm)
    gathered = comm.gather_object(x.detach(), 0)
    if gathered is not None and not torch.allclose(s.detach(), sum(gathered), rtol=1e-14, atol=0):
        raise AssertionError("allreduce_sum value differs from the sum of the gathered blocks")
    (aty,) = torch.autograd.grad(s, x, y)
    assert_adjoint(dot_over_ranks(s, y, comm), dot_over_ranks(x, aty, comm), "allreduce_sum")


def check_broadcast_adjoint(comm: Comm) -> None:
    for root in {0, comm.size - 1}:
        gen = rank_generator(comm, 10 + root)
        x = torch.randn(5, dtype=torch.float64, generator=gen, requires_grad=True)
        y = torch.randn(5, dtype=torch.float64, generator=gen)
        b = broadcast(x, comm, root)
        if not torch.equal(b.detach(), comm.bcast_object(x.detach(), root)):
            raise AssertionError(f"broadcast from {root} did not deliver root's values")
        (aty,) = torch.autograd.grad(b, x, y)
        if comm.rank != root and torch.any(aty != 0):
            raise AssertionError("broadcast gave a non-root rank a nonzero gradient")
        assert_adjoint(dot_over_ranks(b, y, comm), dot_over_ranks(x, aty, comm), f"broadcast root={root}")


def check_gather(comm: Comm) -> None:
    for (d, _), batch in itertools.product(configs(comm), BATCHES):
        g = known_field(batch, d.global_shape, torch.float32)
        root = comm.size - 1
        got = gather_global(local_block(g, d), d, comm, root)
        if comm.rank == root:
            if got is None or not torch.equal(got, g):
                raise AssertionError(f"gather_global wrong: {describe(d, 0)} batch={batch}")
        elif got is not None:
            raise AssertionError("gather_global returned a field on a non-root rank")


def main() -> None:
    comm = get_comm()
    expected_size = int(sys.argv[1])
    torch.set_default_device(sys.argv[2] if len(sys.argv) > 2 else "cpu")
    try:
        if comm.size != expected_size:
            raise AssertionError(f"expected {expected_size} ranks, got {comm.size}")
        check_halo_values(comm)
        check_halo_too_wide(comm)
        check_halo_adjoint(comm)
        check_halo_fill(comm)
        check_ghost_exchange(comm)
        check_allreduce_adjoint(comm)
        check_broadcast_adjoint(comm)
        check_gather(comm)
    except BaseException:
        print(f"rank {comm.rank} FAILED", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        comm.abort(1)
    if comm.gather_object(True) is not None:
        print(f"OK parallel_ops {comm.size} ranks", flush=True)


if __name__ == "__main__":
    main()
