"""The fused explicit step: captured by torch.compile without graph breaks, equal to eager.

Each compile costs 10-50 s on a 2-core VM, so the tests share compiled steps where they can (a
step is cached per right-hand side and function) and build as few as possible.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from odecli.ode import attempt as attempt_module
from odecli.ode import compiled as compiled_module
from odecli.ode.attempt import Limits, LoopState, Span
from odecli.ode.controllers import make_controller
from odecli.ode.methods import DOPRI5
from odecli.ode.solver import solve


def vdp(t, y, p):
    x, v = y[:, 0], y[:, 1]
    return torch.stack([v, p["mu"] * (1 - x**2) * v - x], dim=-1)


def lotka_volterra(t, y, p):
    x, z = y[:, 0], y[:, 1]
    return torch.stack([1.5 * x - x * z, x * z - 3.0 * z], dim=-1)


def _vdp_problem(batch: int = 6, dtype: torch.dtype = torch.float64) -> tuple:
    """y0, t_end, output times and params of the compiled-equals-eager solves (their graphs)."""
    mu = torch.linspace(0.5, 25.0, batch, dtype=dtype)
    y0 = torch.tensor([[2.0, 0.0]], dtype=dtype).expand(batch, 2)
    return y0, 6.0, torch.linspace(0, 6, 7, dtype=dtype), {"mu": mu}


def _loop_state(batch: int) -> LoopState:
    dtype = torch.float64
    mu = torch.linspace(0.5, 25.0, batch, dtype=dtype)
    y = torch.tensor([[2.0, 0.0]], dtype=dtype).expand(batch, 2).clone()
    t = torch.zeros(batch, dtype=dtype)
    zeros_i = torch.zeros(batch, dtype=torch.int64)
    return LoopState(
        t=t, y=y, f0=vdp(t, y, {"mu": mu}), h=torch.full((batch,), 1e-2, dtype=dtype),
        active=torch.ones(batch, dtype=torch.bool), status=zeros_i, n_steps=zeros_i,
        n_accepted=zeros_i, n_rejected=zeros_i, n_f_evals=zeros_i + 1,
        err_prev=torch.ones(batch, dtype=dtype), err_prev2=torch.ones(batch, dtype=dtype),
        rejected_last=torch.zeros(batch, dtype=torch.bool),
    )


def _fused_arguments(batch: int = 4) -> tuple:
    """What the solver passes the fused attempt (and the chunk, after its length): VdP, 11 eval times."""
    dtype = torch.float64
    mu = torch.linspace(0.5, 25.0, batch, dtype=dtype)
    grid = torch.linspace(0, 10, 11, dtype=dtype).expand(batch, 11).contiguous()
    limits = Limits(make_controller("pid"), torch.tensor([1e-6], dtype=dtype), torch.tensor([1e-6], dtype=dtype),
                    torch.tensor([0.0], dtype=dtype), torch.tensor([float("inf")], dtype=dtype), 1000)
    span = Span(torch.full((batch,), 10.0, dtype=dtype), torch.ones(batch, dtype=dtype), grid,
                torch.full((batch,), 10, dtype=torch.int64))
    return (DOPRI5, limits, vdp, {}, {"mu": mu}, _loop_state(batch), torch.ones(batch, dtype=torch.int64), span)


def test_the_fused_step_has_no_graph_breaks():
    explanation = torch._dynamo.explain(attempt_module.explicit_attempt)(*_fused_arguments())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_the_fused_chunk_has_no_graph_breaks():
    explanation = torch._dynamo.explain(attempt_module.explicit_chunk)(3, *_fused_arguments())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_compiled_solve_equals_eager_for_each_tolerance():
    # Tolerances are tensor inputs, so the second solve reuses the graph: it must not reuse the
    # first tolerance (the torch 2.13 cache pitfall) and must still take the eager steps.
    y0, t_end, grid, params = _vdp_problem()
    for tol in (1e-5, 1e-8):
        eager = solve(vdp, y0, 0.0, t_end, grid, params=params, rtol=tol, atol=tol)
        compiled = solve(vdp, y0, 0.0, t_end, grid, params=params, rtol=tol, atol=tol, compile="wait")
        assert compiled.extra["attempts_compiled"] == compiled.extra["attempts"] > 0
        for name in ("n_steps", "n_accepted", "n_rejected", "n_f_evals"):
            assert torch.equal(eager.stats[name], compiled.stats[name]), (tol, name)
        assert torch.equal(eager.status, compiled.status)
        torch.testing.assert_close(compiled.y, eager.y, rtol=1e-9, atol=1e-9)


def test_each_right_hand_side_gets_its_own_compiled_graph():
    # A graph compiled for one RHS must never serve another (dynamo keys graphs on the code
    # object and tells callers apart only by guards).
    y0 = torch.tensor([[2.0, 0.5], [1.0, 1.5]], dtype=torch.float64)
    first = solve(vdp, y0, 0.0, 1.0, params={"mu": torch.tensor([2.0, 3.0], dtype=torch.float64)}, compile="wait")
    second = solve(lotka_volterra, y0, 0.0, 1.0, compile="wait")
    reference = solve(lotka_volterra, y0, 0.0, 1.0)
    assert not torch.allclose(first.y_final, second.y_final)
    torch.testing.assert_close(second.y_final, reference.y_final, rtol=1e-9, atol=1e-9)
    assert torch.equal(second.stats["n_steps"], reference.stats["n_steps"])


def test_compile_true_steps_eagerly_until_the_eager_time_would_pay_for_compiling(monkeypatch):
    """Below the threshold a solve is the eager one, bit for bit, and compiles nothing; once a
    right-hand side's eager steps have cost it, the next call compiles and runs compiled."""

    def rhs(t, y, p):  # a right-hand side of this test's own: nothing is compiled for it yet
        return lotka_volterra(t, y, p)

    y0 = torch.tensor([[2.0, 0.5], [1.0, 1.5], [0.3, 2.0]], dtype=torch.float64)
    eager = solve(rhs, y0, 0.0, 3.0)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for _ in range(2):
        below = solve(rhs, y0, 0.0, 3.0, compile=True)
        assert below.extra["attempts_compiled"] == 0 < below.extra["attempts"]
        assert torch.equal(below.y, eager.y) and torch.equal(below.stats["n_steps"], eager.stats["n_steps"])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    step = compiled_module.fused_step(rhs, attempt_module.explicit_chunk)
    assert step.eager_seconds > 0  # both solves' eager chunks count towards the threshold
    monkeypatch.setattr(compiled_module, "COMPILE_AFTER_EAGER_S", step.eager_seconds)
    paid = solve(rhs, y0, 0.0, 3.0, compile=True)
    assert paid.extra["attempts_compiled"] == paid.extra["attempts"]
    assert torch.equal(paid.stats["n_steps"], eager.stats["n_steps"])
    torch.testing.assert_close(paid.y, eager.y, rtol=1e-10, atol=1e-10)
    assert solve(rhs, y0, 0.0, 3.0, compile=True).extra["attempts_compiled"] == paid.extra["attempts"]


def test_a_solve_that_switches_to_the_compiled_step_midway_takes_the_eager_steps(monkeypatch):
    """The eager chunks ramp their length; the compiled ones have a fixed length. A switch in
    the middle of a solve changes neither a sample's steps nor (beyond round-off) its values."""
    y0, t_end, grid, params = _vdp_problem()
    kwargs = dict(params=params, rtol=1e-5, atol=1e-5)
    solve(vdp, y0, 0.0, t_end, grid, compile="wait", **kwargs)  # the compiled-equals-eager test's graphs
    step = compiled_module.fused_step(vdp, attempt_module.explicit_chunk)
    assert step.ready
    monkeypatch.setattr(step, "state", "idle")
    eager_calls = []
    eager = step.eager

    def counted(*args):
        eager_calls.append(args[0])
        return eager(*args)

    monkeypatch.setattr(step, "eager", counted)
    monkeypatch.setattr(step, "due", lambda: step.state == "idle" and len(eager_calls) >= 4)
    reference = solve(vdp, y0, 0.0, t_end, grid, **kwargs)
    switched = solve(vdp, y0, 0.0, t_end, grid, compile=True, **kwargs)
    assert len(eager_calls) == 4 and step.ready
    assert 0 < switched.extra["attempts_compiled"] < switched.extra["attempts"]
    for name in ("n_steps", "n_accepted", "n_rejected", "n_f_evals"):
        assert torch.equal(reference.stats[name], switched.stats[name]), name
    torch.testing.assert_close(switched.y, reference.y, rtol=1e-9, atol=1e-9)


def test_inputs_the_compiled_step_was_not_traced_for_run_eagerly_instead_of_recompiling():
    """compile=True never stalls a solve for a recompile: float32 runs the eager code."""
    y0, t_end, grid, params = _vdp_problem()
    solve(vdp, y0, 0.0, t_end, grid, params=params, rtol=1e-5, atol=1e-5, compile="wait")
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    y0, t_end, grid, params = _vdp_problem(dtype=torch.float32)
    reference = solve(vdp, y0, 0.0, t_end, grid, params=params, rtol=1e-4, atol=1e-4)
    routed = solve(vdp, y0, 0.0, t_end, grid, params=params, rtol=1e-4, atol=1e-4, compile=True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(routed.y, reference.y)


def test_a_failed_compile_warns_once_and_the_solve_stays_eager(monkeypatch):
    def rhs(t, y, p):
        return lotka_volterra(t, y, p)

    def broken(fn):
        def fail(*args):
            raise RuntimeError("inductor could not build this")
        return fail

    monkeypatch.setattr(compiled_module, "COMPILE_AFTER_EAGER_S", 0.0)
    monkeypatch.setattr(compiled_module, "_compile", broken)
    y0 = torch.tensor([[2.0, 0.5], [1.0, 1.5]], dtype=torch.float64)
    eager = solve(rhs, y0, 0.0, 2.0)
    with pytest.warns(RuntimeWarning, match="could not build this"):
        first = solve(rhs, y0, 0.0, 2.0, compile=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = solve(rhs, y0, 0.0, 2.0, compile=True)
    for sol in (first, second):
        assert sol.extra["attempts_compiled"] == 0
        assert torch.equal(sol.y, eager.y)


def test_compile_takes_false_true_or_wait():
    y0 = torch.tensor([[2.0, 0.5]], dtype=torch.float64)
    with pytest.raises(ValueError, match="compile"):
        solve(lotka_volterra, y0, 0.0, 1.0, compile="later")
