"""Per-sample failures: one bad sample fails alone, with the right status, and costs nothing else.

Status codes (odecli.ode.status): 0 success, 2 dt_min reached, 3 max_steps reached, 4 non-finite.
"""

from __future__ import annotations

import math

import pytest
import torch

from odecli.ode.controllers import PIDController
from odecli.ode.solver import COMPACT_MIN_ROWS, solve
from odecli.ode.status import Status
from ode_problems import params_row, vdp_rhs

F64 = torch.float64
COUNTERS = ("n_steps", "n_accepted", "n_rejected", "n_f_evals")


def decay_rhs(t, y, p):
    """y' = -k y / (q - 1), NaN after t_bad.

    q == 1 makes the very first evaluation infinite (a parameter-triggered failure); a finite
    t_bad poisons the RHS part-way (a failure after some successful steps).
    """
    rate = p["k"] / (p["q"] - 1)
    out = -rate[:, None] * y
    return torch.where((t > p["t_bad"])[:, None], torch.full_like(out, math.nan), out)


def decay_exact(t, y0, k, q):
    return y0[:, None, :] * torch.exp(-(k / (q - 1))[:, None, None] * t[:, :, None])


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("method", ["dopri5", "dop853", "rk4"])
def test_non_finite_rhs_fails_only_that_sample(method, compact):
    k = torch.tensor([1.0, 1.0, 0.5, 2.0], dtype=F64)
    q = torch.tensor([2.0, 1.0, 2.0, 3.0], dtype=F64)  # sample 1: division by zero from the start
    t_bad = torch.tensor([math.inf, math.inf, 1.3, math.inf], dtype=F64)  # sample 2: NaN after t = 1.3
    params = {"k": k, "q": q, "t_bad": t_bad}
    y0 = torch.tensor([[1.0, -2.0]] * 4, dtype=F64)
    grid = torch.linspace(0.0, 3.0, 31, dtype=F64)
    kwargs = dict(method=method, compact=compact, rtol=1e-8, atol=1e-8)
    if method == "rk4":
        kwargs["dt0"] = 0.01
    sol = solve(decay_rhs, y0, 0.0, 3.0, grid, params=params, **kwargs)

    assert sol.status.tolist() == [0, int(Status.INFINITE_NORM), int(Status.INFINITE_NORM), 0]
    exact = decay_exact(sol.t, y0, k, q)
    for i in (0, 3):  # the good samples: right values at every eval point
        assert torch.isfinite(sol.y[i]).all()
        assert (sol.y[i] - exact[i]).abs().max() < 1e-6
        assert float(sol.t_final[i]) == 3.0
    # Sample 2 stopped at the step that crossed t_bad: values before that are right, later ones NaN.
    t_stop = float(sol.t_final[2])
    assert 0.0 < t_stop <= 1.3  # it made progress, then the step that crossed 1.3 failed
    reached = sol.t[2] <= t_stop
    assert torch.isfinite(sol.y[2][reached]).all()
    assert (sol.y[2][reached] - exact[2][reached]).abs().max() < 1e-6
    assert torch.isnan(sol.y[2][~reached]).all()
    # Sample 1 fails on its first step: only t_start (= y0, recorded before stepping) is set.
    assert torch.equal(sol.y[1, 0], y0[1])
    assert torch.isnan(sol.y[1, 1:]).all()
    assert int(sol.stats["n_steps"][1]) == 1
    # The final state of a failed sample is its last good one, never the poisoned trial step.
    assert torch.isfinite(sol.y_final).all()


IMPLICIT = ["kvaerno5", "kvaerno3", "rodas5", "rodas5p", "rodas4", "auto"]


@pytest.mark.parametrize("method", IMPLICIT)
def test_implicit_methods_retry_non_finite_steps_then_report_infinite_norm(method):
    """Implicit methods reject a non-finite trial step and retry it smaller (a stiff step that
    overflows usually succeeds smaller); a sample that cannot get past a NaN region creeps up to
    it and then fails with INFINITE_NORM (not REACHED_DT_MIN, as kvaerno5/3 said before), in a
    bounded number of steps: the step shrinks by factor_min per retry until below the resolution
    of t. A sample whose derivative is infinite at the start fails on its first attempt (kvaerno5
    took 1055 attempts and said dt_min before)."""
    k = torch.tensor([1.0, 1.0, 0.5, 2.0], dtype=F64)
    q = torch.tensor([2.0, 1.0, 2.0, 3.0], dtype=F64)  # sample 1: infinite from the start
    t_bad = torch.tensor([math.inf, math.inf, 1.3, math.inf], dtype=F64)  # sample 2: NaN after t = 1.3
    params = {"k": k, "q": q, "t_bad": t_bad}
    y0 = torch.tensor([[1.0, -2.0]] * 4, dtype=F64)
    grid = torch.linspace(0.0, 3.0, 31, dtype=F64)
    kwargs = dict(method=method, rtol=1e-6, atol=1e-6)
    sol = solve(decay_rhs, y0, 0.0, 3.0, grid, params=params, **kwargs)

    inf = int(Status.INFINITE_NORM)
    assert sol.status.tolist() == [0, inf, inf, 0]
    assert int(sol.stats["n_steps"][1]) == 1
    assert torch.isnan(sol.y[1, 1:]).all()
    # Sample 2 got as close to t = 1.3 as floating point allows (79-120 attempts, 35-55 rejected).
    assert 1.3 - 1e-12 <= float(sol.t_final[2]) <= 1.3
    assert int(sol.stats["n_steps"][2]) <= 150
    exact = decay_exact(sol.t, y0, k, q)
    reached = sol.t[2] <= sol.t_final[2]
    assert (sol.y[2][reached] - exact[2][reached]).abs().max() < 1e-4
    assert torch.isnan(sol.y[2][~reached]).all()
    for i in (0, 3):
        assert (sol.y[i] - exact[i]).abs().max() < 1e-4
    assert torch.isfinite(sol.y_final).all()
    # The failing samples fail as they do alone.
    for i in (1, 2):
        solo = solve(decay_rhs, y0[i:i + 1], 0.0, 3.0, grid, params=params_row(params, i), **kwargs)
        assert int(solo.status[0]) == inf
        for key in COUNTERS:
            assert sol.stats[key][i] == solo.stats[key][0], (i, key)
        assert torch.equal(sol.t_final[i:i + 1], solo.t_final)


@pytest.mark.parametrize("method", ["kvaerno5", "rodas5"])
def test_dt_min_ends_non_finite_retries_early_with_infinite_norm(method):
    """dt_min bounds the retries: the sample stops once the next retry would be below it, and
    still reports the cause, INFINITE_NORM."""
    params = {"k": torch.tensor([0.5], dtype=F64), "q": torch.tensor([2.0], dtype=F64),
              "t_bad": torch.tensor([1.3], dtype=F64)}
    sol = solve(decay_rhs, torch.ones(1, 1, dtype=F64), 0.0, 3.0, params=params, method=method, rtol=1e-6,
                atol=1e-6, controller=PIDController(dt_min=1e-6))
    assert sol.status.tolist() == [int(Status.INFINITE_NORM)]
    assert 1.3 - 1e-4 < float(sol.t_final[0]) <= 1.3
    assert int(sol.stats["n_steps"][0]) <= 60


def test_max_steps_stops_only_the_stiff_sample():
    mu = torch.tensor([1.0, 1000.0, 2.0], dtype=F64)
    y0 = torch.tensor([[2.0, 0.0]] * 3, dtype=F64)
    t_end = 3.0
    kwargs = dict(method="dopri5", rtol=1e-6, atol=1e-6)
    easy = [solve(vdp_rhs, y0[i:i + 1], 0.0, t_end, params={"mu": mu[i:i + 1]}, **kwargs) for i in (0, 2)]
    budget = max(int(s.stats["n_steps"]) for s in easy) + 10
    sol = solve(vdp_rhs, y0, 0.0, t_end, params={"mu": mu}, max_steps=budget, **kwargs)

    assert sol.status.tolist() == [0, int(Status.REACHED_MAX_STEPS), 0]
    assert int(sol.stats["n_steps"][1]) == budget
    assert float(sol.t_final[1]) < t_end
    assert torch.isnan(sol.y[1, -1]).all()  # never reached t_end
    for i, solo in zip((0, 2), easy):
        for key in COUNTERS:
            assert sol.stats[key][i] == solo.stats[key][0], (i, key)
        torch.testing.assert_close(sol.y[i], solo.y[0], rtol=1e-12, atol=0.0)


def blowup_rhs(t, y, p):
    """y' = a y^2 + b y: with a = 1, y0 = 1 the solution 1 / (1 - t) blows up at t = 1."""
    return p["a"][:, None] * y * y + p["b"][:, None] * y


@pytest.mark.parametrize("compact", [True, False])
def test_dt_min_flags_only_the_sample_that_needs_tiny_steps(compact):
    """torchode flags finished samples whose last (truncated) step is below dt_min; we must not.

    Samples end at different times, chosen so their last step is truncated to a sliver far below
    dt_min (t_end a hair past a point the controller lands near); they must stay SUCCESS. The
    blow-up sample's steps shrink towards t = 1 and it must get REACHED_DT_MIN.
    """
    dt_min = 1e-3
    a = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0], dtype=F64)
    b = torch.tensor([-1.0, -0.5, 0.0, -2.0, -1.0], dtype=F64)
    t_end = torch.tensor([0.3, 1.0 + 1e-9, 2.0, 2.5, 4.0 + 1e-7], dtype=F64)
    y0 = torch.ones(5, 1, dtype=F64)
    grid = torch.linspace(0.0, 1.0, 11, dtype=F64)[None] * t_end[:, None]
    params = {"a": a, "b": b}
    ctrl = PIDController(dt_min=dt_min)
    sol = solve(blowup_rhs, y0, 0.0, t_end, grid, params=params, method="dopri5", rtol=1e-8, atol=1e-8,
                controller=ctrl, compact=compact)

    assert sol.status.tolist() == [0, 0, int(Status.REACHED_DT_MIN), 0, 0]
    assert torch.equal(sol.t_final[[0, 1, 3, 4]], t_end[[0, 1, 3, 4]])
    assert 0.9 < float(sol.t_final[2]) < 1.0
    good = [0, 1, 3, 4]
    exact = torch.exp(b[good, None] * sol.t[good])
    assert (sol.y[good, :, 0] - exact).abs().max() < 1e-6
    # Exact values before the blow-up sample stopped, NaN beyond.
    reached = sol.t[2] <= sol.t_final[2]
    assert torch.isnan(sol.y[2, ~reached]).all()
    torch.testing.assert_close(sol.y[2, reached, 0], 1 / (1 - sol.t[2, reached]), rtol=1e-5, atol=0.0)
    # Each finished sample is unaffected by dt_min and by its neighbours: same as solo without dt_min.
    for i in good:
        solo = solve(blowup_rhs, y0[i:i + 1], 0.0, t_end[i], grid[i:i + 1], params=params_row(params, i),
                     method="dopri5", rtol=1e-8, atol=1e-8)
        for key in COUNTERS:
            assert sol.stats[key][i] == solo.stats[key][0], (i, key)


def test_finished_samples_stop_costing_steps():
    """An easy sample batched with a hard one costs exactly its solo steps and RHS evaluations,
    and is finished (status, t_final) long before the hard one is."""
    mu = torch.tensor([0.5, 40.0], dtype=F64)
    y0 = torch.tensor([[2.0, 0.0], [2.0, 0.0]], dtype=F64)
    t_end = torch.tensor([2.0, 60.0], dtype=F64)
    for compact in (True, False):
        sol = solve(vdp_rhs, y0, 0.0, t_end, params={"mu": mu}, method="tsit5", rtol=1e-6, atol=1e-6, compact=compact)
        solo = solve(vdp_rhs, y0[:1], 0.0, t_end[:1], params={"mu": mu[:1]}, method="tsit5", rtol=1e-6, atol=1e-6)
        assert sol.status.tolist() == [0, 0]
        for key in COUNTERS:
            assert sol.stats[key][0] == solo.stats[key][0], key
        assert sol.stats["n_steps"][1] > 10 * sol.stats["n_steps"][0]


def test_rhs_sees_only_active_rows_after_compaction():
    """With compaction the RHS is called on fewer rows once most samples are done (they stop
    costing evaluations), and the per-sample params it sees always match those rows."""
    calls = []

    def rhs(t, y, p):
        calls.append(y.shape[0])
        # The sample id travels in params: y's first component was initialised to it and is constant.
        assert torch.equal(p["id"], y[:, 0])
        return torch.stack([torch.zeros_like(t), -p["id"] * y[:, 1]], dim=1)

    ids = torch.linspace(1.0, 4.0, 64, dtype=F64)
    y0 = torch.stack([ids, torch.ones(64, dtype=F64)], dim=1)
    t_end = torch.tensor([0.1] * 56 + [5.0] * 8, dtype=F64)
    sol = solve(rhs, y0, 0.0, t_end, params={"id": ids}, rtol=1e-8, atol=1e-8, compact=True)
    assert sol.status.eq(0).all()
    # Once the 56 short samples are done the working set shrinks toward the 8 long ones and never
    # grows (sets of COMPACT_MIN_ROWS rows or fewer are not compacted further).
    assert calls == sorted(calls, reverse=True)
    assert calls[0] == 64 and 8 <= calls[-1] <= COMPACT_MIN_ROWS
    torch.testing.assert_close(sol.y_final[:, 1], torch.exp(-ids * t_end), rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------------- degenerate spans


@pytest.mark.parametrize("method", ["euler", "rk4", "bosh3", "dopri5", "tsit5", "dop853"])
def test_zero_length_span(method):
    """t_start == t_end: success, no steps, y == y0 at every eval point; mixed into a batch too."""
    y0 = torch.tensor([[2.0, -1.0], [0.5, 0.5], [1.0, 3.0]], dtype=F64)
    t0 = torch.tensor([1.5, 0.0, -2.0], dtype=F64)
    t1 = torch.tensor([1.5, 1.0, -2.0], dtype=F64)  # samples 0 and 2 have zero length
    mu = torch.tensor([1.0, 1.0, 5.0], dtype=F64)
    grid = t0[:, None] + (t1 - t0)[:, None] * torch.linspace(0.0, 1.0, 4, dtype=F64)[None]
    dt0 = 0.01 if method in ("euler", "rk4") else None
    sol = solve(vdp_rhs, y0, t0, t1, grid, params={"mu": mu}, method=method, dt0=dt0)
    assert sol.status.tolist() == [0, 0, 0]
    for i in (0, 2):
        assert int(sol.stats["n_steps"][i]) == 0
        assert torch.equal(sol.y[i], y0[i].expand(4, 2))
        assert torch.equal(sol.y_final[i], y0[i])
        assert float(sol.t_final[i]) == float(t0[i])
    assert torch.isfinite(sol.y[1]).all()

    # The whole batch zero-length, with the default (start, end) grid.
    only = solve(vdp_rhs, y0[[0, 2]], t0[[0, 2]], t1[[0, 2]], params={"mu": mu[[0, 2]]}, method=method, dt0=dt0)
    assert only.status.tolist() == [0, 0]
    assert torch.equal(only.y, y0[[0, 2], None, :].expand(2, 2, 2))
    assert only.stats["n_steps"].tolist() == [0, 0]
