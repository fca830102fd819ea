"""Tests for odecli.parallel: decomposition arithmetic and serial ops in-process, MPI ops under mpiexec."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from odecli.parallel import (
    Comm,
    allreduce_sum,
    broadcast,
    choose_proc_grid,
    decompose,
    gather_global,
    get_comm,
    halo_exchange,
    local_block,
)
from mpi_helpers import run_mpi

CHECK_SCRIPT = Path(__file__).parent / "mpi_scripts" / "parallel_ops_check.py"


def factor_pairs(n: int) -> list[tuple[int, int]]:
    return [(py, n // py) for py in range(1, n + 1) if n % py == 0]


# -- decomposition -----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1), (13, 10), (7, 11), (64, 64), (5, 100)])
@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 6, 8, 12])
def test_blocks_tile_the_grid_exactly_once(shape: tuple[int, int], nranks: int) -> None:
    grids = [g for g in factor_pairs(nranks) if shape[0] >= g[0] and shape[1] >= g[1]]
    for grid in grids:
        decomps = [decompose(shape, nranks, r, grid) for r in range(nranks)]
        count = np.zeros(shape, dtype=int)
        for d in decomps:
            count[d.y0 : d.y1, d.x0 : d.x1] += 1
            assert d.coords == divmod(d.rank, grid[1])
            assert d.min_local_shape[0] <= d.local_shape[0] <= d.min_local_shape[0] + 1
            assert d.min_local_shape[1] <= d.local_shape[1] <= d.min_local_shape[1] + 1
        assert (count == 1).all()
        for d in decomps:
            if d.east is not None:
                e = decomps[d.east]
                assert (e.west, e.y0, e.y1, e.x0) == (d.rank, d.y0, d.y1, d.x1)
            if d.south is not None:
                s = decomps[d.south]
                assert (s.north, s.x0, s.x1, s.y0) == (d.rank, d.x0, d.x1, d.y1)
            assert (d.north is None) == (d.y0 == 0) and (d.south is None) == (d.y1 == shape[0])
            assert (d.west is None) == (d.x0 == 0) and (d.east is None) == (d.x1 == shape[1])


@pytest.mark.parametrize(
    "shape, nranks, grid",
    [
        ((100, 100), 1, (1, 1)),
        ((100, 100), 4, (2, 2)),
        ((100, 400), 4, (1, 4)),
        ((400, 100), 4, (4, 1)),
        ((10, 10), 2, (2, 1)),
        ((100, 100), 7, (7, 1)),
        ((60, 90), 6, (2, 3)),
        ((3, 100), 4, (1, 4)),
    ],
)
def test_choose_proc_grid_prefers_near_square_blocks(shape, nranks, grid) -> None:
    assert choose_proc_grid(shape, nranks) == grid
    assert decompose(shape, nranks, 0).proc_grid == grid


def test_decompose_rejects_bad_layouts() -> None:
    with pytest.raises(ValueError, match="proc_grid"):
        decompose((10, 10), 4, 0, proc_grid=(3, 1))
    with pytest.raises(ValueError, match="min_block"):
        decompose((10, 10), 4, 0, proc_grid=(4, 1), min_block=3)
    with pytest.raises(ValueError, match="rank"):
        decompose((10, 10), 4, 4)
    with pytest.raises(ValueError, match="cannot split"):
        choose_proc_grid((2, 2), 5)
    with pytest.raises(ValueError, match="global_shape"):
        decompose((0, 10), 1, 0)


# -- serial communicator and ops -----------------------------------------------------------------


def test_serial_comm_without_mpi4py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    comm = get_comm()
    assert (comm.rank, comm.size) == (0, 1)
    comm.barrier()
    assert comm.allreduce_scalar(2.5, "max") == 2.5
    assert comm.bcast_object({"a": 1}) == {"a": 1}
    assert comm.gather_object(3) == [3]
    with pytest.raises(ValueError, match="op"):
        comm.allreduce_scalar(1.0, "prod")
    with pytest.raises(SystemExit):
        comm.abort(3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
@pytest.mark.parametrize("width", [0, 1, 2])
def test_serial_halo_is_padding_with_fill(dtype, batch, width) -> None:
    comm, d = Comm(), decompose((5, 7), 1, 0)
    u = torch.randn(*batch, 5, 7).to(dtype)
    out = halo_exchange(u, d, comm, width, fill=-3.0)
    assert out.dtype == dtype
    assert torch.equal(out, F.pad(u, (width,) * 4, value=-3.0))


def test_halo_rejects_bad_inputs() -> None:
    comm, d = Comm(), decompose((5, 7), 1, 0)
    with pytest.raises(ValueError, match="smallest block"):
        halo_exchange(torch.zeros(5, 7), d, comm, 6)
    with pytest.raises(ValueError, match="local shape"):
        halo_exchange(torch.zeros(7, 5), d, comm, 1)
    with pytest.raises(ValueError, match="communicator"):
        halo_exchange(torch.zeros(3, 7), decompose((5, 7), 2, 0, (2, 1)), comm, 1)
    with pytest.raises(TypeError, match="float32 or float64"):
        halo_exchange(torch.zeros(5, 7, dtype=torch.int64), d, comm, 1)


def test_serial_ops_gradcheck() -> None:
    comm, d = Comm(), decompose((4, 5), 1, 0)
    u = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: halo_exchange(t, d, comm, 2, fill=1.5), (u,))
    assert torch.autograd.gradcheck(lambda t: allreduce_sum(t, comm), (u,))
    assert torch.autograd.gradcheck(lambda t: broadcast(t, comm), (u,))
    assert torch.autograd.gradcheck(lambda t: local_block(t, d), (u,))


def test_serial_identities_and_gather() -> None:
    comm, d = Comm(), decompose((4, 5), 1, 0)
    u = torch.randn(3, 4, 5, dtype=torch.float64)
    assert torch.equal(allreduce_sum(u, comm), u)
    assert torch.equal(broadcast(u, comm), u)
    assert torch.equal(local_block(u, d), u)
    assert torch.equal(gather_global(u, d, comm), u)
    with pytest.raises(ValueError, match="global shape"):
        local_block(torch.zeros(5, 4), d)


# -- under mpiexec -------------------------------------------------------------------------------


@pytest.mark.parametrize("nranks", [2, 4])
def test_mpi_halo_values_adjoints_and_gather(nranks: int) -> None:
    proc = run_mpi(CHECK_SCRIPT, nranks, [str(nranks)])
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert f"OK parallel_ops {nranks} ranks" in proc.stdout.splitlines()
