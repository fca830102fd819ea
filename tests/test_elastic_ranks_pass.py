"""The elastic forward on several ranks in passes over blocks grown into the neighbours'
(odecli.pde.elastic.ranks_pass): 2x1, 1x3 (a middle block grown on both sides) and 2x2 ranks
(uneven blocks of a 37x43 grid) give the one-rank traces and final fields bit for bit, float64
and float32, point forces and explosive sources, with and without a free surface, in passes of
4 and of 3 steps (one and two kernel threads); blocks grown one cell short of the stencils'
reach differ (the exchange's depth is what makes them equal)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_helpers import SCRIPTS, compute_on_one_thread, mpi_script, run_mpi


@pytest.fixture(scope="module")
def one_rank():
    return compute_on_one_thread(mpi_script("elastic_ranks_pass"))


def _ranks(tmp_path, n: int, grid: str, *extra: str) -> dict:
    out = tmp_path / "res.npz"
    proc = run_mpi(SCRIPTS / "elastic_ranks_pass.py", n, [str(out), grid, *extra], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(np.load(out))


@pytest.mark.parametrize("n,grid", [(2, "2x1"), (3, "1x3"), (4, "2x2")])
def test_passes_on_ranks_equal_one_rank_bit_for_bit(one_rank, tmp_path, n, grid):
    """On 2x1 also the probe: blocks grown one cell short give other numbers in every case."""
    got = _ranks(tmp_path, n, grid, *(["short"] if grid == "2x1" else []))
    assert int(got.pop("passes")) == n * len(one_rank) // 2  # every forward, on every rank
    short = {k[len("short/"):]: got.pop(k) for k in list(got) if k.startswith("short/")}
    assert set(got) == set(one_rank)
    for key, ref in one_rank.items():
        assert np.abs(ref).max() > 0, key
        assert np.array_equal(got[key], ref), f"{key} differs on {grid}"
    if grid == "2x1":
        assert len(short) == 2 * 3 * 3 and all("float64" in k for k in short)
        same = [k for k, v in short.items() if np.array_equal(v, one_rank[k])]
        assert not same, same
