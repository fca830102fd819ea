"""Per-sample independence: a sample solved in a heterogeneous batch behaves as if solved alone.

Same step sequence (every counter identical), same status, same final time and the same values
to round-off, whatever the other samples do: different stiffness, different spans (including a
backwards one and a zero-length one), different evaluation grids; with and without compaction of
finished samples.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from odecli.ode.solver import solve
from ode_problems import params_row, vdp_rhs

F64 = torch.float64
REL = 1e-12
COUNTERS = ("n_steps", "n_accepted", "n_rejected", "n_f_evals")


def _heterogeneous_batch(n_eval=9):
    mu = torch.tensor([0.5, 3.0, 10.0, 25.0, 1.0, 2.0], dtype=F64)
    t0 = torch.tensor([0.0, 1.0, 2.0, 0.0, 0.5, -1.0], dtype=F64)
    t1 = torch.tensor([5.0, 4.0, -3.0, 8.0, 0.5, 3.0], dtype=F64)  # sample 2 runs backwards, 4 has zero length
    y0 = torch.tensor([[2.0, 0.0], [1.0, -1.0], [0.5, 0.5], [2.0, 0.0], [1.0, 1.0], [-1.5, 0.3]], dtype=F64)
    # Per-sample grids, deliberately non-uniform (quadratic spacing) and of different density.
    u = torch.linspace(0.0, 1.0, n_eval, dtype=F64)
    power = torch.tensor([1.0, 2.0, 0.5, 1.0, 1.0, 3.0], dtype=F64)
    grid = t0[:, None] + (t1 - t0)[:, None] * u[None, :] ** power[:, None]
    return y0, t0, t1, grid, {"mu": mu}


def _assert_same_as_solo(batched, solve_one, batch_size):
    for i in range(batch_size):
        solo = solve_one(i)
        assert int(batched.status[i]) == int(solo.status[0]), i
        for key in COUNTERS:
            assert int(batched.stats[key][i]) == int(solo.stats[key][0]), (i, key, int(batched.stats[key][i]), int(solo.stats[key][0]))
        assert float(batched.t_final[i]) == float(solo.t_final[0]), i
        for got, want in ((batched.y[i], solo.y[0]), (batched.y_final[i], solo.y_final[0])):
            assert torch.equal(torch.isnan(got), torch.isnan(want)), i
            ok = ~torch.isnan(want)
            diff = (got[ok] - want[ok]).abs()
            assert (diff <= REL * want[ok].abs() + 1e-300).all(), (i, diff.max().item())


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("method,controller", [
    ("bosh3", "integral"), ("dopri5", "pi"), ("tsit5", "pid"), ("dop853", "integral"),
])
def test_heterogeneous_batch_equals_solo_solves(method, controller, compact):
    y0, t0, t1, grid, params = _heterogeneous_batch()
    tol = 1e-5 if method == "bosh3" else 1e-7
    kwargs = dict(method=method, rtol=tol, atol=tol, controller=controller, compact=compact)
    batched = solve(vdp_rhs, y0, t0, t1, grid, params=params, **kwargs)
    assert batched.status.eq(0).all()
    assert torch.equal(batched.t_final, t1)
    assert batched.stats["n_steps"][4] == 0  # the zero-length sample never steps

    def solve_one(i):
        return solve(vdp_rhs, y0[i:i + 1], t0[i], t1[i], grid[i:i + 1], params=params_row(params, i), **kwargs)

    _assert_same_as_solo(batched, solve_one, y0.shape[0])


@pytest.mark.parametrize("compact", [True, False])
def test_fixed_step_batch_with_per_sample_steps_equals_solo(compact):
    y0, t0, t1, grid, params = _heterogeneous_batch()
    dt0 = torch.tensor([0.05, 0.04, 0.02, 0.015, 0.1, 0.03], dtype=F64)
    batched = solve(vdp_rhs, y0, t0, t1, grid, params=params, method="rk4", dt0=dt0, compact=compact)
    assert batched.status.eq(0).all()
    span = (t1 - t0).abs()
    # ceil(span/dt) steps, give or take one for the round-off sliver at the end.
    expected = torch.ceil(span / dt0)
    assert ((batched.stats["n_steps"].to(F64) - expected).abs() <= 1).all(), batched.stats["n_steps"]

    def solve_one(i):
        return solve(vdp_rhs, y0[i:i + 1], t0[i], t1[i], grid[i:i + 1], params=params_row(params, i),
                     method="rk4", dt0=dt0[i], compact=compact)

    _assert_same_as_solo(batched, solve_one, y0.shape[0])


def test_compaction_does_not_change_results():
    y0, t0, t1, grid, params = _heterogeneous_batch(n_eval=30)
    a = solve(vdp_rhs, y0, t0, t1, grid, params=params, rtol=1e-7, atol=1e-7, compact=True)
    b = solve(vdp_rhs, y0, t0, t1, grid, params=params, rtol=1e-7, atol=1e-7, compact=False)
    for key in COUNTERS:
        assert torch.equal(a.stats[key], b.stats[key]), key
    assert torch.equal(a.status, b.status)
    torch.testing.assert_close(a.y, b.y, rtol=REL, atol=0.0)


def test_duplicated_sample_is_solved_identically_everywhere_in_the_batch():
    """The same problem placed at several rows next to very different neighbours."""
    mu = torch.tensor([1.0, 25.0, 1.0, 0.1, 1.0], dtype=F64)
    y0 = torch.tensor([[2.0, 0.0], [2.0, 0.0], [2.0, 0.0], [0.1, 0.0], [2.0, 0.0]], dtype=F64)
    t1 = torch.tensor([7.0, 20.0, 7.0, 1.0, 7.0], dtype=F64)
    grid = torch.linspace(0.0, 1.0, 11, dtype=F64)[None] * t1[:, None]
    sol = solve(vdp_rhs, y0, 0.0, t1, grid, params={"mu": mu}, method="tsit5", rtol=1e-8, atol=1e-8)
    for i in (2, 4):
        for key in COUNTERS:
            assert sol.stats[key][i] == sol.stats[key][0]
        torch.testing.assert_close(sol.y[i], sol.y[0], rtol=REL, atol=0.0)


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.floats(0.1, 8.0), st.floats(-2.0, 2.0), st.floats(-4.0, 4.0), st.floats(-2.0, 2.0)),
                min_size=2, max_size=5))
def test_random_batches_equal_solo_solves(samples):
    """Property: any batch of (mu, t_start, span, x0) gives each sample its solo result.

    Backwards in time Van der Pol can blow up in finite time (the limit cycle repels), so a
    sample may legitimately fail; it must then fail the same way (status, step) as alone.
    """
    mu = torch.tensor([s[0] for s in samples], dtype=F64)
    t0 = torch.tensor([s[1] for s in samples], dtype=F64)
    t1 = t0 + torch.tensor([s[2] for s in samples], dtype=F64)
    y0 = torch.tensor([[s[3], 0.5] for s in samples], dtype=F64)
    grid = t0[:, None] + (t1 - t0)[:, None] * torch.linspace(0.0, 1.0, 5, dtype=F64)[None]
    kwargs = dict(method="dopri5", rtol=1e-6, atol=1e-6, max_steps=3000)
    batched = solve(vdp_rhs, y0, t0, t1, grid, params={"mu": mu}, **kwargs)

    def solve_one(i):
        return solve(vdp_rhs, y0[i:i + 1], t0[i], t1[i], grid[i:i + 1], params={"mu": mu[i:i + 1]}, **kwargs)

    _assert_same_as_solo(batched, solve_one, len(samples))
