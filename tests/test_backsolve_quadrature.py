"""Backsolve's parameter quadrature: the solver's ``on_attempt`` hook and gradients against independent references.

References: analytic gradients of a linear ODE (autograd through ``torch.linalg.matrix_exp``),
``direct`` mode at tight tolerance, and exact quadratures of known integrals.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from odecli.ode.adjoint import odeint
from odecli.ode.solver import Attempt, solve

DT = torch.float64


# ----------------------------------------------------------------------------------- the hook


def _stiffish(t, y, p):
    """dy/dt = -k (y - cos t): a step-size probe with rejections at moderate tolerance."""
    return -p["k"][:, None] * (y - torch.cos(t)[:, None])


def test_on_attempt_sums_the_method_weights_over_accepted_steps_only():
    """Sum over accepted attempts of h * sum(b) is each sample's span exactly; rejected attempts would add to it."""
    k = torch.tensor([1.0, 30.0, 300.0], dtype=DT)
    t1 = torch.tensor([2.0, 1.5, 3.0], dtype=DT)
    span = torch.zeros(3, dtype=DT)
    rejected_h = torch.zeros(3, dtype=DT)

    def hook(s: Attempt) -> None:
        nonlocal span, rejected_h
        span = span.index_add(0, s.rows, s.h * s.accept * sum(s.method.b))
        rejected_h = rejected_h.index_add(0, s.rows, s.h.abs() * ~s.accept)

    sol = solve(_stiffish, torch.ones(3, 1, dtype=DT), 0.0, t1, params={"k": k}, rtol=1e-4, atol=1e-6, on_attempt=hook)
    assert (sol.stats["n_rejected"] > 0).any() and (rejected_h > 0).any()
    torch.testing.assert_close(span, t1, rtol=1e-12, atol=1e-12)


def test_on_attempt_stages_integrate_a_known_integral():
    """int_0^T y dt for dy/dt = -y is 1 - exp(-T); the stage quadrature gets it to the solver's accuracy."""
    total = torch.zeros(2, dtype=DT)

    def hook(s: Attempt) -> None:
        nonlocal total
        m = s.method
        for j, b in enumerate(m.b):
            if b:
                y_j = s.y if j == 0 else s.y + s.h[:, None] * sum(a * k for a, k in zip(m.a[j], s.K))
                total = total.index_add(0, s.rows, (s.h * s.accept * b) * y_j[:, 0])

    t1 = torch.tensor([1.0, 4.0], dtype=DT)
    solve(lambda t, y, p: -y, torch.ones(2, 1, dtype=DT), 0.0, t1, rtol=1e-10, atol=1e-12, on_attempt=hook)
    torch.testing.assert_close(total, 1 - torch.exp(-t1), rtol=1e-8, atol=1e-10)


def test_on_attempt_rejects_implicit_methods():
    with pytest.raises(ValueError, match="explicit"):
        solve(lambda t, y, p: -y, torch.ones(1, 1, dtype=DT), 0.0, 1.0, method="rodas5", on_attempt=lambda s: None)


def test_backsolve_rejects_implicit_methods():
    with pytest.raises(ValueError, match="explicit"):
        odeint(lambda t, y, p: -y, torch.ones(1, 1, dtype=DT), 0.0, 1.0, method="rodas5", adjoint="backsolve")


# ------------------------------------------------------------------------------- gradients


A_TRUE = torch.tensor([[-0.5, 1.0], [-1.2, -0.3]], dtype=DT)


def _linear(t, y, p):
    """dy/dt = s_b A y: shared matrix A, per-sample scale s."""
    return p["s"][:, None] * (y @ p["A"].T)


def _linear_setup():
    y0 = torch.tensor([[1.0, 0.0], [0.3, -0.7], [-1.0, 2.0]], dtype=DT)
    s = torch.tensor([1.0, 0.6, 1.7], dtype=DT)
    t0 = torch.tensor([0.0, 0.5, -0.2], dtype=DT)
    t1 = torch.tensor([2.0, 1.5, 3.0], dtype=DT)
    frac = torch.tensor([0.0, 0.2, 0.45, 0.8, 1.0], dtype=DT)
    t_eval = t0[:, None] + (t1 - t0)[:, None] * frac  # per-sample grids, several columns
    return y0, s, t0, t1, t_eval


def _linear_loss(y, y_final):
    weights = torch.linspace(0.1, 1.0, y[0].numel(), dtype=DT).reshape(y.shape[1:])
    return (y * weights).sum() + (y_final**2).sum()


def _analytic_loss(A, y0, s, t0, t_eval, t1):
    """The exact solution y(t) = expm(s A (t - t0)) y0, no ODE solver involved."""
    def at(t):
        M = torch.linalg.matrix_exp((s * (t - t0))[:, None, None] * A)
        return (M @ y0[:, :, None]).squeeze(-1)

    ys = torch.stack([at(t_eval[:, j]) for j in range(t_eval.shape[1])], dim=1)
    return _linear_loss(ys, at(t1))


def test_backsolve_matches_analytic_gradients_of_a_linear_ode():
    y0, s, t0, t1, t_eval = _linear_setup()
    ref_leaves = [x.clone().requires_grad_(True) for x in (A_TRUE, y0, s)]
    ref = torch.autograd.grad(_analytic_loss(ref_leaves[0], ref_leaves[1], ref_leaves[2], t0, t_eval, t1), ref_leaves)
    leaves = [x.clone().requires_grad_(True) for x in (A_TRUE, y0, s)]
    sol = odeint(_linear, leaves[1], t0, t1, t_eval, params={"A": leaves[0], "s": leaves[2]}, adjoint="backsolve",
                 rtol=1e-11, atol=1e-12)
    got = torch.autograd.grad(_linear_loss(sol.y, sol.y_final), leaves)
    for name, g, r in zip(("A (shared)", "y0", "s (per-sample)"), got, ref):
        torch.testing.assert_close(g, r, rtol=1e-7, atol=1e-9, msg=name)


def test_backsolve_error_shrinks_with_the_tolerance():
    """Against the analytic gradient: a tolerance-proportional error that really depends on the tolerance."""
    y0, s, t0, t1, t_eval = _linear_setup()
    ref_leaves = [x.clone().requires_grad_(True) for x in (A_TRUE, y0, s)]
    ref = torch.cat([g.reshape(-1) for g in torch.autograd.grad(
        _analytic_loss(ref_leaves[0], ref_leaves[1], ref_leaves[2], t0, t_eval, t1), ref_leaves)])
    errors = []
    for tol in (1e-4, 1e-8):
        leaves = [x.clone().requires_grad_(True) for x in (A_TRUE, y0, s)]
        sol = odeint(_linear, leaves[1], t0, t1, t_eval, params={"A": leaves[0], "s": leaves[2]},
                     adjoint="backsolve", rtol=tol, atol=tol)
        got = torch.cat([g.reshape(-1) for g in torch.autograd.grad(_linear_loss(sol.y, sol.y_final), leaves)])
        errors.append(float((got - ref).abs().max() / ref.abs().max()))
        assert errors[-1] < 100 * tol
    assert errors[1] < 1e-2 * errors[0]


def _vdp(t, y, p):
    x, v = y[:, 0], y[:, 1]
    return torch.stack([v, p["mu"] * (1 - x**2) * v - x + p["k"] * torch.sin(t)], dim=-1)


def test_backsolve_with_rejected_steps_matches_direct():
    """Van der Pol rows make the adjoint solve reject steps; the gradients still match direct.

    (Much stiffer rows, mu = 12, lose digits in any backsolve: y reconstructed backwards in time
    is unstable there; the earlier vmap implementation gave the same numbers.)
    """
    y0 = torch.tensor([[2.0, 0.0], [1.0, 0.5], [0.5, -1.0]], dtype=DT)
    mu = torch.tensor([0.5, 2.0, 4.0], dtype=DT)
    k = torch.tensor(0.3, dtype=DT)
    t_eval = torch.linspace(0.0, 3.0, 6, dtype=DT)
    grads = {}
    for mode, tol in (("direct", 1e-12), ("backsolve", 1e-9)):
        leaves = [x.clone().requires_grad_(True) for x in (y0, mu, k)]
        sol = odeint(_vdp, leaves[0], 0.0, 3.0, t_eval, params={"mu": leaves[1], "k": leaves[2]}, adjoint=mode,
                     rtol=tol, atol=tol)
        grads[mode] = torch.autograd.grad((sol.y**2).sum(), leaves)
        if mode == "backsolve":
            assert (sol.extra["backward_stats"]["n_rejected"] > 0).any()
    for name, g, r in zip(("y0", "mu", "k"), grads["backsolve"], grads["direct"]):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-7, msg=name)


class _Field(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.net = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)).to(DT)

    def forward(self, t, y, p):
        return self.net(y) * p["scale"][:, None] + p["bias"] * torch.cos(t)[:, None]


def test_module_shared_and_per_sample_gradients_match_direct():
    field = _Field()
    y0 = torch.tensor([[1.0, 0.0], [0.3, -0.8], [-1.5, 0.4], [0.0, 2.0]], dtype=DT)
    scale = torch.tensor([1.0, 0.5, 1.5, 2.0], dtype=DT)
    bias = torch.tensor([0.2, -0.1], dtype=DT)
    t1 = torch.tensor([1.0, 2.0, 1.5, 0.7], dtype=DT)
    t_eval = torch.stack([torch.linspace(0, float(t), 4, dtype=DT) for t in t1])
    grads = {}
    for mode, tol in (("direct", 1e-12), ("backsolve", 1e-10)):
        leaves = [y0.clone().requires_grad_(True), scale.clone().requires_grad_(True), bias.clone().requires_grad_(True)]
        sol = odeint(field, leaves[0], 0.0, t1, t_eval, params={"scale": leaves[1], "bias": leaves[2]}, adjoint=mode,
                     rtol=tol, atol=tol)
        loss = (torch.sin(sol.y) * torch.arange(1, 9, dtype=DT).reshape(4, 2)).sum() + sol.y_final.pow(2).sum()
        grads[mode] = torch.autograd.grad(loss, leaves + list(field.parameters()))
    names = ["y0", "scale (per-sample)", "bias (shared)"] + [n for n, _ in field.named_parameters()]
    for name, g, r in zip(names, grads["backsolve"], grads["direct"]):
        torch.testing.assert_close(g, r, rtol=1e-7, atol=1e-9, msg=name)


def test_backsolve_reverse_time_spans():
    """Integration backwards in time (t_end < t_start) against the analytic gradient."""
    y0, s, _, _, _ = _linear_setup()
    t0 = torch.tensor([2.0, 1.0, 0.5], dtype=DT)
    t1 = torch.tensor([0.0, -0.5, -1.0], dtype=DT)
    t_eval = t0[:, None] + (t1 - t0)[:, None] * torch.tensor([0.0, 0.5, 1.0], dtype=DT)
    ref_leaves = [x.clone().requires_grad_(True) for x in (A_TRUE, y0, s)]
    ref = torch.autograd.grad(_analytic_loss(ref_leaves[0], ref_leaves[1], ref_leaves[2], t0, t_eval, t1), ref_leaves)
    leaves = [x.clone().requires_grad_(True) for x in (A_TRUE, y0, s)]
    sol = odeint(_linear, leaves[1], t0, t1, t_eval, params={"A": leaves[0], "s": leaves[2]}, adjoint="backsolve",
                 rtol=1e-11, atol=1e-12)
    for g, r in zip(torch.autograd.grad(_linear_loss(sol.y, sol.y_final), leaves), ref):
        torch.testing.assert_close(g, r, rtol=1e-7, atol=1e-9)
    assert math.isfinite(float(sol.extra["backward_stats"]["wall_time_s"]))


@pytest.mark.parametrize("field", ["vdp", "module"])
def test_recorded_stage_graphs_give_the_gradients_of_evaluating_the_stages_again(field, monkeypatch):
    """The quadrature backpropagates through the attempt's own RHS calls; evaluating f again must agree."""
    from odecli.ode import adjoint

    if field == "vdp":  # rejected steps, per-sample mu and shared k
        f, y0 = _vdp, torch.tensor([[2.0, 0.0], [1.0, 0.5], [0.5, -1.0]], dtype=DT)
        values = {"mu": torch.tensor([0.5, 2.0, 4.0], dtype=DT), "k": torch.tensor(0.3, dtype=DT)}
    else:
        f, y0 = _Field(), torch.tensor([[1.0, 0.0], [0.3, -0.8], [-1.5, 0.4]], dtype=DT)
        values = {"scale": torch.tensor([1.0, 0.5, 1.5], dtype=DT), "bias": torch.tensor([0.2, -0.1], dtype=DT)}
    t_eval = torch.linspace(0.0, 3.0, 6, dtype=DT)
    recorded = adjoint._ParameterQuadrature._recorded
    uses = []

    def counting(self, attempt, nodes):
        out = recorded(self, attempt, nodes)
        uses.append(sorted(out) == [j for j, b in enumerate(attempt.method.b) if b])
        return out

    monkeypatch.setattr(adjoint._ParameterQuadrature, "_recorded", counting)
    grads = []
    for record in (True, False):
        if not record:
            monkeypatch.setattr(adjoint._AdjointRHS, "record_into", lambda self, quadrature, n_stages: None)
        leaves = [y0.clone().requires_grad_(True)] + [v.clone().requires_grad_(True) for v in values.values()]
        sol = odeint(f, leaves[0], 0.0, 3.0, t_eval, params=dict(zip(values, leaves[1:])), adjoint="backsolve",
                     rtol=1e-7, atol=1e-7)
        modules = list(f.parameters()) if isinstance(f, nn.Module) else []
        grads.append(torch.autograd.grad((sol.y**2).sum(), leaves + modules))
        if record:
            assert uses and sum(uses) >= len(uses) // 2  # most attempts evaluate f at no stage again
            if field == "vdp":
                assert (sol.extra["backward_stats"]["n_rejected"] > 0).any()
    for g, r in zip(*grads):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-14)
