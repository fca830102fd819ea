"""N-rank PDE results equal the 1-rank results: forward bit-for-bit (<= 1e-12), gradients <= 1e-10."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_helpers import SCRIPTS, mpi_script, run_mpi


@pytest.fixture(scope="module")
def reference():
    return mpi_script("pde_equivalence").compute(None)


# exchange_every > 1: ranks step an extended block and exchange both time levels every k steps
# (a source sits on the 2x2 corner, so extended blocks carry a neighbour's source; on 4x1 the
# middle ranks have neighbours on both sides; receivers near a block edge lie in a neighbour's
# extended block, whose redundant adjoint steps must inject their residuals too).
# Two kernel threads: the steps of a pass shared out over two threads, and single steps (at a
# segment's start, before an exchange) split by rows.  Passes of three steps between exchanges
# every 4 steps: odd passes, and single steps next to an exchange, forward and adjoint.
@pytest.mark.parametrize("n,grid,every,threads,per_pass",
                         [(2, "2x1", 1, 0, 0), (2, "1x2", 1, 0, 0), (4, "2x2", 1, 0, 0),
                          (2, "1x2", 4, 0, 0), (4, "2x2", 3, 0, 0), (4, "4x1", 4, 0, 0),
                          (2, "2x1", 3, 2, 0), (2, "1x2", 4, 0, 3)])
def test_n_ranks_equal_one_rank(reference, tmp_path, n, grid, every, threads, per_pass):
    out = tmp_path / "res.npz"
    args = [str(out), grid, str(every), str(threads)] + ([str(per_pass)] if per_pass else [])
    proc = run_mpi(SCRIPTS / "pde_equivalence.py", n, args, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    assert set(got.files) == set(reference)
    for key, ref in reference.items():
        val = got[key]
        scale = max(float(np.abs(ref).max()), 1e-300)
        err = float(np.abs(val - ref).max()) / scale
        tol = 1e-10 if ("/grad/" in key or key.endswith("/loss")) else 1e-12
        assert err <= tol, f"{key} on {grid}, every {every}: relative difference {err:.3e} > {tol}"


def test_reference_path_on_two_ranks_equals_fused_one_rank(reference, tmp_path, monkeypatch):
    """The PyTorch reference (CUDA's path, or no C compiler) with in-place halo fills across ranks."""
    monkeypatch.setenv("ODECLI_NATIVE", "0")
    out = tmp_path / "res.npz"
    proc = run_mpi(SCRIPTS / "pde_equivalence.py", 2, [str(out), "1x2"], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    for key, ref in reference.items():
        scale = max(float(np.abs(ref).max()), 1e-300)
        err = float(np.abs(got[key] - ref).max()) / scale
        tol = 1e-10 if ("/grad/" in key or key.endswith("/loss")) else 1e-12
        assert err <= tol, f"{key}: relative difference {err:.3e} > {tol}"
