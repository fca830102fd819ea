"""Gradients through the implicit methods: a Rosenbrock step uses the Jacobian in its formula, so
the gradient of the discrete solution needs the Jacobian's own derivatives; and inside
checkpointed segments, forming a Jacobian must not recompute the segment."""

from __future__ import annotations

import math

import pytest
import torch

from odecli.ode.adjoint import odeint

DT = torch.float64
T_END = 3.0


def oscillator(t, y, p):
    """y'' = -w^2 y: J = [[0, 1], [-w^2, 0]] depends on the parameter w."""
    return torch.stack([y[:, 1], -p["w"] ** 2 * y[:, 0]], dim=-1)


def van_der_pol(t, y, p):
    """J depends on y and on mu."""
    x, v = y[:, 0], y[:, 1]
    return torch.stack([v, p["mu"] * (1 - x**2) * v - x], dim=-1)


@pytest.mark.parametrize("adjoint", ["direct", "checkpoint"])
@pytest.mark.parametrize("method", ["rodas4", "rodas5", "rodas5p", "kvaerno5"])
def test_gradients_match_the_analytic_derivatives(method, adjoint):
    # y(T) = cos(w T): dy/dw = -T sin(w T), dy/dy0 = cos(w T); rodas5 was 3e-3 off at tol 1e-9
    w = torch.tensor([1.3], dtype=DT, requires_grad=True)
    y0 = torch.tensor([[1.0, 0.0]], dtype=DT, requires_grad=True)
    sol = odeint(oscillator, y0, 0.0, T_END, None, params={"w": w}, method=method,
                 rtol=1e-9, atol=1e-9, adjoint=adjoint)
    sol.y_final[0, 0].backward()
    assert sol.status.item() == 0
    exact_dw, exact_dy0 = -T_END * math.sin(1.3 * T_END), math.cos(1.3 * T_END)
    assert w.grad.item() == pytest.approx(exact_dw, rel=5e-7)
    assert y0.grad[0, 0].item() == pytest.approx(exact_dy0, rel=5e-7)


@pytest.mark.parametrize("method", ["rodas5", "auto"])
def test_gradient_through_a_stiff_solve_matches_finite_differences(method):
    # J depends on the state here too; finite differences of the same solver at a tight tolerance
    def final_x(mu: torch.Tensor) -> torch.Tensor:
        sol = odeint(van_der_pol, torch.tensor([[2.0, 0.0]], dtype=DT), 0.0, 6.0, None,
                     params={"mu": mu}, method=method, rtol=1e-10, atol=1e-10)
        assert sol.status.item() == 0
        return sol.y_final[0, 0]

    mu = torch.tensor([8.0], dtype=DT, requires_grad=True)
    final_x(mu).backward()
    eps = 1e-4
    with torch.no_grad():
        fd = (final_x(mu + eps) - final_x(mu - eps)).item() / (2 * eps)
    assert mu.grad.item() == pytest.approx(fd, rel=1e-4)


def test_a_checkpointed_solve_calls_the_right_hand_side_as_often_as_a_direct_one():
    # autograd.grad inside a checkpointed segment used to recompute the segment for every
    # Jacobian: 15 s instead of 0.1 s for 86 rodas5 steps
    calls = {"n": 0}

    def counted(t, y, p):
        calls["n"] += 1
        return van_der_pol(t, y, p)

    forward_calls = {}
    for adjoint in ("direct", "checkpoint"):
        calls["n"] = 0
        mu = torch.tensor([5.0], dtype=DT, requires_grad=True)
        sol = odeint(counted, torch.tensor([[2.0, 0.0]], dtype=DT), 0.0, 6.0, None,
                     params={"mu": mu}, method="rodas5", rtol=1e-6, atol=1e-6, adjoint=adjoint)
        forward_calls[adjoint] = calls["n"]
        assert sol.stats["n_steps"].item() > 30
    assert forward_calls["checkpoint"] <= forward_calls["direct"] + 5
