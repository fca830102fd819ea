"""The fused explicit step: captured by torch.compile without graph breaks, equal to eager."""

from __future__ import annotations

import torch

from odecli.ode import solver as solver_module
from odecli.ode.controllers import make_controller
from odecli.ode.methods import DOPRI5
from odecli.ode.solver import solve


def vdp(t, y, p):
    x, v = y[:, 0], y[:, 1]
    return torch.stack([v, p["mu"] * (1 - x**2) * v - x], dim=-1)


def _loop_state(batch: int) -> dict[str, torch.Tensor]:
    dtype = torch.float64
    mu = torch.linspace(0.5, 25.0, batch, dtype=dtype)
    y = torch.tensor([[2.0, 0.0]], dtype=dtype).expand(batch, 2).clone()
    t = torch.zeros(batch, dtype=dtype)
    zeros_i = torch.zeros(batch, dtype=torch.int64)
    return {
        "t": t, "y": y, "f0": vdp(t, y, {"mu": mu}), "h": torch.full((batch,), 1e-2, dtype=dtype),
        "active": torch.ones(batch, dtype=torch.bool), "status": zeros_i, "n_steps": zeros_i,
        "n_accepted": zeros_i, "n_rejected": zeros_i, "n_f_evals": zeros_i + 1,
        "err_prev": torch.ones(batch, dtype=dtype), "err_prev2": torch.ones(batch, dtype=dtype),
        "rejected_last": torch.zeros(batch, dtype=torch.bool),
    }


def _fused_arguments(batch: int = 4) -> tuple:
    """What the solver passes the fused attempt (and the chunk, after its length): VdP, 11 eval times."""
    dtype = torch.float64
    mu = torch.linspace(0.5, 25.0, batch, dtype=dtype)
    grid = torch.linspace(0, 10, 11, dtype=dtype).expand(batch, 11).contiguous()
    return (
        DOPRI5, make_controller("pid"), vdp, {}, {"mu": mu}, _loop_state(batch), torch.ones(batch, dtype=torch.int64),
        torch.full((batch,), 10.0, dtype=dtype), torch.ones(batch, dtype=dtype), grid,
        torch.full((batch,), 10, dtype=torch.int64), torch.tensor([1e-6], dtype=dtype), torch.tensor([1e-6], dtype=dtype),
        torch.tensor([0.0], dtype=dtype), torch.tensor([float("inf")], dtype=dtype), 1000,
    )


def test_the_fused_step_has_no_graph_breaks():
    explanation = torch._dynamo.explain(solver_module._explicit_attempt)(*_fused_arguments())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_the_fused_chunk_has_no_graph_breaks():
    explanation = torch._dynamo.explain(solver_module._explicit_chunk)(3, *_fused_arguments())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_compiled_solve_equals_eager_for_each_tolerance():
    # Tolerances are tensor inputs, so the second solve reuses the graph: it must not reuse the
    # first tolerance (the torch 2.13 cache pitfall) and must still take the eager steps.
    batch = 6
    mu = torch.linspace(0.5, 25.0, batch, dtype=torch.float64)
    y0 = torch.tensor([[2.0, 0.0]], dtype=torch.float64).expand(batch, 2)
    grid = torch.linspace(0, 6, 7, dtype=torch.float64)
    for tol in (1e-5, 1e-8):
        eager = solve(vdp, y0, 0.0, 6.0, grid, params={"mu": mu}, rtol=tol, atol=tol)
        compiled = solve(vdp, y0, 0.0, 6.0, grid, params={"mu": mu}, rtol=tol, atol=tol, compile=True)
        for name in ("n_steps", "n_accepted", "n_rejected", "n_f_evals"):
            assert torch.equal(eager.stats[name], compiled.stats[name]), (tol, name)
        assert torch.equal(eager.status, compiled.status)
        torch.testing.assert_close(compiled.y, eager.y, rtol=1e-9, atol=1e-9)


def test_each_right_hand_side_gets_its_own_compiled_graph():
    # A graph compiled for one RHS must never serve another (dynamo keys graphs on the code
    # object and tells callers apart only by guards).
    def lotka_volterra(t, y, p):
        x, z = y[:, 0], y[:, 1]
        return torch.stack([1.5 * x - x * z, x * z - 3.0 * z], dim=-1)

    y0 = torch.tensor([[2.0, 0.5], [1.0, 1.5]], dtype=torch.float64)
    first = solve(vdp, y0, 0.0, 1.0, params={"mu": torch.tensor([2.0, 3.0], dtype=torch.float64)}, compile=True)
    second = solve(lotka_volterra, y0, 0.0, 1.0, compile=True)
    reference = solve(lotka_volterra, y0, 0.0, 1.0)
    assert not torch.allclose(first.y_final, second.y_final)
    torch.testing.assert_close(second.y_final, reference.y_final, rtol=1e-9, atol=1e-9)
    assert torch.equal(second.stats["n_steps"], reference.stats["n_steps"])
