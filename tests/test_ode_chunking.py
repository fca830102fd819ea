"""k attempts per host read (``solve(..., chunk=k)``) change only how attempts are grouped.

Every sample must take exactly the attempts it takes with ``chunk=1`` (one host read per
attempt), with the same status, the same dense output and the same final state, also when
samples finish or fail part-way through a chunk, when evaluation times fall inside a chunk, and
when finished samples are compacted out between chunks. Values agree to round-off, not bit for
bit: compaction at other times puts a sample in other rows, and PyTorch's vectorised and scalar
kernels (e.g. ``pow`` in the controller) can differ in the last bit.
"""

from __future__ import annotations

import math

import pytest
import torch

from odecli.ode.controllers import PIDController
from odecli.ode.solver import solve
from ode_problems import vdp_rhs

F64 = torch.float64
COUNTERS = ("n_steps", "n_accepted", "n_rejected", "n_f_evals")
REL = 1e-11


def _assert_identical(a, b) -> None:
    assert torch.equal(a.status, b.status)
    for key in COUNTERS:
        assert torch.equal(a.stats[key], b.stats[key]), key
    assert torch.equal(a.t_final, b.t_final)
    for got, want in ((a.y_final, b.y_final), (a.y, b.y)):
        torch.testing.assert_close(got, want, rtol=REL, atol=1e-300, equal_nan=True)
    # The proposed next step amplifies round-off in the error estimate (a difference of stages).
    torch.testing.assert_close(a.stats["dt_final"], b.stats["dt_final"], rtol=1e-8, atol=0.0)


def _vdp_batch(batch: int = 48):
    mu = torch.linspace(0.5, 25.0, batch, dtype=F64)
    y0 = torch.tensor([[2.0, 0.0]], dtype=F64).expand(batch, 2).clone()
    t_end = torch.linspace(1.0, 8.0, batch, dtype=F64)  # samples finish at different loop iterations
    return y0, t_end, {"mu": mu}


@pytest.mark.parametrize("method", ["dopri5", "tsit5", "dop853", "bosh3"])
@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("grid", ["none", "shared", "per_sample"])
def test_chunks_take_the_same_attempts_as_one_attempt_per_read(method, compact, grid):
    y0, t_end, params = _vdp_batch()
    if grid == "none":
        t_eval = None
    elif grid == "shared":
        # Interior times for the short spans, beyond t_end for some (never reached: NaN), and t_end itself.
        t_eval = torch.linspace(0.0, 1.0, 9, dtype=F64)
    else:
        u = torch.linspace(0.0, 1.0, 13, dtype=F64)
        t_eval = t_end[:, None] * u[None, :] ** torch.linspace(0.5, 3.0, y0.shape[0], dtype=F64)[:, None]
    kwargs = dict(params=params, method=method, rtol=1e-7, atol=1e-7, compact=compact)
    one = solve(vdp_rhs, y0, 0.0, t_end, t_eval, chunk=1, **kwargs)
    assert one.status.eq(0).all()
    for k in (2, 5, 16):
        _assert_identical(solve(vdp_rhs, y0, 0.0, t_end, t_eval, chunk=k, **kwargs), one)


def test_chunks_waste_no_right_hand_side_calls_when_every_step_passes_an_evaluation_time():
    # A few smooth steps, each passing an evaluation time: a fixed chunk of 4 ran 3 masked,
    # full-batch attempts after the first (86 RHS calls against 50). Chunks now start at one
    # attempt and grow only while no row waits for dense output.
    y0 = torch.linspace(-2.0, 2.0, 32, dtype=F64)[:, None].repeat(1, 2)
    t_eval = torch.linspace(0.0, 3.0, 8, dtype=F64)
    calls, runs = {}, {}
    for chunk in (1, 4):
        calls[chunk] = 0

        def rhs(t, y, p):
            calls[chunk] += 1
            return torch.tanh(-y)

        runs[chunk] = solve(rhs, y0, 0.0, 3.0, t_eval, rtol=1e-4, atol=1e-5, chunk=chunk)
    _assert_identical(runs[4], runs[1])
    assert calls[4] == calls[1]


def test_eval_times_exactly_at_the_ends_are_filled_without_dense_output():
    # t_start and t_end are on the grid; the values there are y0 and the final state exactly.
    y0, t_end, params = _vdp_batch(6)
    t_eval = torch.stack([torch.zeros_like(t_end), t_end / 2, t_end], dim=1)
    for k in (1, 4):
        sol = solve(vdp_rhs, y0, 0.0, t_end, t_eval, params=params, chunk=k)
        assert torch.equal(sol.y[:, 0], y0)
        assert torch.equal(sol.y[:, 2], sol.y_final)
        assert not torch.isnan(sol.y).any()


def test_backward_spans_in_chunks():
    y0, t_end, params = _vdp_batch(40)
    t_eval = torch.linspace(0.0, -1.0, 6, dtype=F64)
    kwargs = dict(params=params, rtol=1e-6, atol=1e-6)
    one = solve(vdp_rhs, y0, 0.0, -t_end, t_eval, chunk=1, **kwargs)
    _assert_identical(solve(vdp_rhs, y0, 0.0, -t_end, t_eval, chunk=6, **kwargs), one)


def poisoned_vdp(t, y, p):
    """Van der Pol that turns NaN after each sample's own t_bad (a failure part-way through)."""
    out = vdp_rhs(t, y, p)
    return torch.where((t > p["t_bad"])[:, None], torch.full_like(out, math.nan), out)


@pytest.mark.parametrize("compact", [True, False])
def test_samples_failing_mid_chunk_fail_at_the_same_attempt(compact):
    batch = 40
    y0, _, params = _vdp_batch(batch)
    params["t_bad"] = torch.where(torch.arange(batch) % 5 == 0, torch.linspace(0.3, 3.0, batch, dtype=F64),
                                  torch.full((batch,), math.inf, dtype=F64))
    t_eval = torch.linspace(0.0, 6.0, 7, dtype=F64)
    # max_steps stops the stiff samples, dt_min the ones needing tiny steps, NaN the poisoned ones.
    ctrl = PIDController(dt_min=2e-3)
    kwargs = dict(params=params, rtol=1e-7, atol=1e-7, max_steps=150, controller=ctrl, compact=compact)
    one = solve(poisoned_vdp, y0, 0.0, 6.0, t_eval, chunk=1, **kwargs)
    assert len(set(one.status.tolist())) >= 3, one.status.tolist()
    for k in (3, 7):
        _assert_identical(solve(poisoned_vdp, y0, 0.0, 6.0, t_eval, chunk=k, **kwargs), one)


def test_compiled_chunks_equal_eager_chunks():
    """Samples that end at different times, with output times past some ends. (Compiled chunks
    without output times are test_ode_compile's graph-per-right-hand-side case: each compile
    costs 30-50 s on a 2-core VM, so the suite compiles each case once.)"""
    y0, t_end, params = _vdp_batch(40)
    t_eval = torch.linspace(0.0, 4.0, 5, dtype=F64)
    eager = solve(vdp_rhs, y0, 0.0, t_end, t_eval, params=params, chunk=4)
    compiled = solve(vdp_rhs, y0, 0.0, t_end, t_eval, params=params, chunk=4, compile="wait")
    for key in COUNTERS:
        assert torch.equal(eager.stats[key], compiled.stats[key]), key
    assert torch.equal(eager.status, compiled.status)
    torch.testing.assert_close(compiled.y, eager.y, rtol=1e-10, atol=1e-10, equal_nan=True)


def test_chunk_must_be_positive():
    y0, t_end, params = _vdp_batch(2)
    with pytest.raises(ValueError, match="chunk"):
        solve(vdp_rhs, y0, 0.0, t_end, params=params, chunk=0)
