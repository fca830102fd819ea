"""The acoustic and elastic CUDA loops on several ranks, tested without a GPU.

The kernels' host build stands in for the GPU (CPU tensors through the same launch code and C
time loops, as tests/test_pde_cuda.py and tests/test_elastic_cuda.py run them), on 1x2, 2x2
and 3x1 ranks of grids that split unevenly (41 x 39 acoustic, 37 x 43 elastic), against the
one-rank run of the same kernels: traces and final fields bit for bit, gradients (of vp, vs,
rho; of the wave speed) to 1e-12 relative in float64, with and without a free surface, point
forces and explosive sources, receivers on some ranks and none on others, 3 time segments.
Acoustic: the blocked kernel, 4 steps a launch, on blocks grown by 6 cells (1x2, 2x2: corners
from the diagonal neighbour), and the one-step kernel on them (3x1).  On 2x2 the exchanges copy
their strips as they do for GPU fields (torch indexing staged through the host buffers, the
path :class:`~odecli.parallel.strips.Boxes` takes off the CPU).  Every rank must have run the
kernels and the exchanges between them (counted), and results with the exchanges (or the
adjoint's grown-block receivers) left out must miss those bounds, so the comparison sees them.
And the rank-to-device rule, ``cuda:rank % count``, with a fake GPU count.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mpi_helpers import SCRIPTS, compute_on_one_thread, mpi_script, run_mpi

from odecli.app import pde_problem, solve, solve_ranks
from odecli.errors import SpecError
from odecli.pde.acoustic import cuda_build as acoustic_build
from odecli.pde.elastic import cuda_build as elastic_build


@pytest.fixture(scope="module")
def one_rank():
    """The one-rank results (in this process: the script's ``compute``)."""
    try:
        acoustic_build.host_launcher(torch.float64)
        elastic_build.host_launcher(torch.float64)
    except RuntimeError as exc:  # no C compiler (or ODECLI_NATIVE=0): nothing to run them on
        pytest.skip(str(exc))
    return compute_on_one_thread(mpi_script("pde_cuda_ranks"))


@pytest.mark.parametrize("n,grid,flags", [(2, "1x2", ["--probes"]), (4, "2x2", ["--staged"]),
                                          (3, "3x1", ["--one-step"])])
def test_n_ranks_run_the_kernels_and_equal_one_rank(one_rank, tmp_path, n, grid, flags):
    """``--staged``: the strips copied as for GPU fields; ``--one-step``: the acoustic one-step
    kernel on the grown blocks (an exchange after every step, the blocked kernel's 4 deep)."""
    out = tmp_path / "ranks.npz"
    probes = "--probes" in flags
    proc = run_mpi(SCRIPTS / "pde_cuda_ranks.py", n, [str(out), grid, *flags], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    assert (one_rank["ranks/counts"][0, :2] > 0).all()  # one rank ran the kernels too
    counts = got["ranks/counts"]  # per rank: acoustic, elastic launches; their exchanges
    assert counts.shape == (n, 4) and (counts > 0).all(), counts
    assert len(set(counts[:, 2])) == 1 and len(set(counts[:, 3])) == 1  # the same exchanges
    for key, ref in one_rank.items():
        if key.startswith("ranks/"):
            continue
        val = got[key]
        if key.endswith("/engine"):
            assert "CUDA kernels" in str(val), f"{key}: {val}"
            continue
        assert val.shape == ref.shape, key
        if key.endswith("/grad"):
            scale = float(np.abs(ref).max())
            err = float(np.abs(val - ref).max()) / scale
            assert scale > 0 and err <= 1e-12, f"{key} on {grid}: relative difference {err:.3e}"
        else:
            assert float(np.abs(ref).max()) > 0, key
            assert np.array_equal(val, ref), f"{key} on {grid}: not bit for bit"
    # the blocked kernel, 4 steps a launch, on blocks grown by 6 cells (8-cell ghosts exchanged)
    k = 1 if "--one-step" in flags else 4
    assert f"{k} step(s) a launch" in str(got["acoustic/engine"])
    assert f"halo exchange every {k} step(s)" in str(got["acoustic/engine"])
    for key in [k for k in got.files if k.startswith("without_exchange/")]:
        # beyond the bounds above: bit for bit for traces, 1e-12 for gradients (on grown blocks
        # with their sources, a missing exchange spoils the traces from 6 cells away only)
        ref = one_rank[key.split("/", 1)[1]]
        err = float(np.abs(got[key] - ref).max()) / float(np.abs(ref).max())
        assert err > (1e-12 if key.endswith("/grad") else 0), f"{key}: within {err:.1e}"
    assert len([k for k in got.files if k.startswith("without_exchange/")]) == (4 if probes else 0)


@pytest.fixture
def gpus(monkeypatch):
    """A machine with ``count`` fake GPUs (set the count on the returned dict)."""
    fake = {"count": 3}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: fake["count"])
    return fake


def test_pde_ranks_take_gpu_rank_mod_count(gpus, monkeypatch):
    """``compute.device: cuda`` (or ``auto`` finding CUDA): rank r on ``cuda:r % count``; a
    named GPU is kept, one that is not there is the spec's error."""
    monkeypatch.setattr(pde_problem, "resolve_device",
                        lambda name: torch.device("cuda" if name == "auto" else name))
    assert [str(pde_problem._device("cuda", r, "s.yaml")) for r in range(7)] == [
        "cuda:0", "cuda:1", "cuda:2", "cuda:0", "cuda:1", "cuda:2", "cuda:0"]
    gpus["count"] = 2
    assert str(pde_problem._device("auto", 5, "s.yaml")) == "cuda:1"
    assert str(pde_problem._device("cuda:1", 0, "s.yaml")) == "cuda:1"
    with pytest.raises(SpecError, match="compute.device.*only 2 CUDA device"):
        pde_problem._device("cuda:2", 0, "s.yaml")
    assert pde_problem._device("cpu", 3, "s.yaml") == torch.device("cpu")


def test_ode_ranks_take_gpu_local_rank_mod_count(gpus, monkeypatch):
    """``mpirun odecli solve`` with ``device: cuda``: a node's rank r on ``cuda:r % count``;
    ``cpu`` stays the CPU."""
    monkeypatch.setattr(solve, "device_name", lambda name: "cpu" if name == "cpu" else "cuda")
    assert [solve_ranks._rank_device("cuda", r) for r in range(5)] == [
        "cuda:0", "cuda:1", "cuda:2", "cuda:0", "cuda:1"]
    gpus["count"] = 1
    assert {solve_ranks._rank_device("auto", r) for r in range(4)} == {"cuda:0"}
    assert solve_ranks._rank_device("cpu", 3) == "cpu"


def test_the_acoustic_c_loop_exchanges_each_written_field_and_stops_at_a_failed_exchange():
    """``between`` runs after every launch on the field it wrote and the other time level (the
    two buffers in turn), in order; an exception in it ends the C loop there and is raised as
    it was."""
    try:
        launcher = acoustic_build.host_launcher(torch.float64)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    from odecli.pde.acoustic import cuda_loop

    ny, nx = 9, 10
    shape = (1, ny + 4, nx + 4)
    first, second = torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64)
    second[0, 6, 7] = 1.0
    loop = cuda_loop.CudaLoop(launcher, [(0, 5)], 1.0, 1.0, 1.0, None, None, None, 1)
    call = loop.call(torch.full((ny, nx), 0.1, dtype=torch.float64), shape)
    seen = []

    def between(written: torch.Tensor, other: torch.Tensor) -> None:
        assert other is (second if written is first else first)
        seen.append((written is first, float(written.abs().sum())))
        if len(seen) == 3 and fail:
            raise OSError("neighbour gone")

    fail = False
    launcher.run(call, 5, first, second, [], between)
    assert [s[0] for s in seen] == [True, False, True, False, True]
    assert all(total > 0 for _, total in seen)  # each written by its launch before the exchange
    seen.clear()
    fail = True
    with pytest.raises(OSError, match="neighbour gone"):
        launcher.run(call, 5, first, second, [], between)
    assert len(seen) == 3


def test_an_elastic_host_step_runs_in_the_launch_list_and_stops_it_when_it_fails():
    try:
        launcher = elastic_build.host_launcher(torch.float64)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    calls = []

    def action() -> None:
        calls.append(len(calls))
        if len(calls) == 2 and fail:
            raise OSError("neighbour gone")

    fail = False
    launcher.run([elastic_build.Between("exchange", action)], 4, [])
    assert calls == [0, 1, 2, 3]
    calls.clear()
    fail = True
    with pytest.raises(OSError, match="neighbour gone"):
        launcher.run([elastic_build.Between("exchange", action)], 4, [])
    assert calls == [0, 1]
