"""Gradients through the generated C solver against backpropagation through the PyTorch loop.

The C gradient tapes each sample's steps in the forward pass (or solves the sample again when its
tape did not fit) and sweeps them backwards by hand; the reference is autograd through
:func:`odecli.ode.solver.solve` (``adjoint="direct"``), which takes the same steps, so the two
must agree to round-off for ``y0`` and every parameter, per sample. Finite differences check the
reference's sense on a smooth problem.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from odecli.ode.controllers import PIDController
from odecli.ode.native import NativeRhs, NativeUnavailable, solve_native
from odecli.ode.native.gradient import gradient_unsupported, solve_native_with_grad
from odecli.ode.solver import solve
from odecli.specs.expr import compile_expression, expression_to_c

F64 = torch.float64


def system(equations: dict[str, str], params: tuple[str, ...]):
    """The C right-hand side and the PyTorch one from the same spec text."""
    states = tuple(equations)
    symbols = {"t": "t", **{s: f"y[{i}]" for i, s in enumerate(states)}, **{p: f"p[{j}]" for j, p in enumerate(params)}}
    c_rhs = NativeRhs(tuple(expression_to_c(equations[s], symbols, "t.yaml", s) for s in states), params)
    names = {"t", *states, *params}
    compiled = [compile_expression(equations[s], names, "t.yaml", s) for s in states]

    def torch_rhs(t, y, p):
        env = {"t": t, **{s: y[:, i] for i, s in enumerate(states)}, **p}
        return torch.stack([torch.broadcast_to(f(env), t.shape).to(y.dtype) for f in compiled], dim=-1)

    return c_rhs, torch_rhs


VDP = {"x": "v", "v": "mu * (1 - x**2) * v - x"}
# every operator and function of the expression language, with t-dependence and a shared parameter
ZOO = {
    "a": "sin(b) * k - a / (2 + cos(t)) + tanh(a * b) - 0.1 * exp(-a**2) + min(a, b) * 0.01",
    "b": "-k * a + sqrt(1 + b**2) * 0.1 - log(2 + a**2) * 0.2 + abs(a - b) * 0.05 + max(a, 0.5 * b) * 0.01"
         " + (1 + a**2)**(0.5 * k) * 0.01 - tan(0.1 * b)",
}


def _grads(sol, inputs, weights_y, weights_final):
    loss = (sol.y.nan_to_num() * weights_y).sum() + (sol.y_final * weights_final).sum()
    return torch.autograd.grad(loss, inputs, allow_unused=True)


def _compare(equations, params, y0, t0, t1, t_eval, method="dopri5", **kwargs):
    """Gradients of a random linear functional of (y, y_final), C against PyTorch."""
    c_rhs, torch_rhs = system(equations, tuple(params))
    gen = torch.Generator().manual_seed(0)
    results = []
    for engine in ("c", "torch"):
        y = y0.clone().requires_grad_(True)
        p = {name: value.clone().requires_grad_(True) for name, value in params.items()}
        if engine == "c":
            sol = solve_native(c_rhs, y, t0, t1, t_eval, params=p, method=method, **kwargs)
        else:
            sol = solve(torch_rhs, y, t0, t1, t_eval, params=p, method=method, **kwargs)
        if not results:
            wy = torch.randn(sol.y.shape, generator=gen, dtype=F64)
            wf = torch.randn(sol.y_final.shape, generator=gen, dtype=F64)
        results.append((sol, _grads(sol, [y, *p.values()], wy, wf)))
    (c_sol, c_grads), (t_sol, t_grads) = results
    assert torch.equal(c_sol.stats["n_steps"], t_sol.stats["n_steps"])
    torch.testing.assert_close(c_sol.y, t_sol.y, rtol=1e-10, atol=1e-12, equal_nan=True)
    for got, want in zip(c_grads, t_grads):
        assert got is not None and want is not None
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)
    return c_sol, c_grads


def vdp_inputs(batch=6):
    mu = torch.linspace(0.5, 4.0, batch, dtype=F64)
    y0 = torch.stack([torch.linspace(1.0, 2.0, batch, dtype=F64), torch.zeros(batch, dtype=F64)], dim=1)
    return mu, y0


@pytest.mark.parametrize("method", ["dopri5", "tsit5", "bosh3", "dop853"])
def test_adaptive_methods_match_backprop_through_the_pytorch_loop(method):
    mu, y0 = vdp_inputs()
    t_eval = torch.linspace(0.0, 3.0, 7, dtype=F64)
    _compare(VDP, {"mu": mu}, y0, 0.0, 3.0, t_eval, method=method, rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize("method", ["euler", "midpoint", "heun", "rk4"])
def test_fixed_step_methods_match(method):
    mu, y0 = vdp_inputs()
    _compare(VDP, {"mu": mu}, y0, 0.0, 1.0, torch.linspace(0.0, 1.0, 6, dtype=F64), method=method, dt0=0.03)


def test_tapes_longer_than_their_first_allocation():
    """500 accepted steps per sample: the tape grows (it starts at 8) without losing a step."""
    mu, y0 = vdp_inputs(3)
    sol, _ = _compare(VDP, {"mu": mu}, y0, 0.0, 2.0, torch.linspace(0.0, 2.0, 4, dtype=F64), method="rk4",
                      dt0=0.004)
    assert int(sol.stats["n_accepted"].min()) == 500


@pytest.mark.parametrize("budget, kept", [(0, [0]), (60_000, range(1, 20)), (None, [20])])
def test_samples_without_a_tape_are_solved_again_to_the_same_gradient_bit_for_bit(monkeypatch, budget, kept):
    """The forward pass keeps tapes within TAPE_BUDGET_BYTES; the backward pass solves the rest
    again. None taped, some (60 kB: eight lanes' tapes grow together until the budget drops
    the samples that ask for more, midway; 3 of 20 here) or all: the same gradient, bit for
    bit, and a second backward pass (the tapes freed by the first) gives it again."""
    from odecli.ode.native import gradient

    c_rhs, torch_rhs = system(VDP, ("mu",))
    mu = torch.linspace(0.5, 6.0, 20, dtype=F64)  # 47-128 accepted steps
    y0 = torch.stack([torch.linspace(1.0, 2.0, 20, dtype=F64), torch.zeros(20, dtype=F64)], dim=1)
    t_eval = torch.linspace(0.0, 10.0, 9, dtype=F64)
    weights = torch.randn(20, 9, 2, generator=torch.Generator().manual_seed(3), dtype=F64)

    def gradients(tape_budget):
        monkeypatch.setattr(gradient, "TAPE_BUDGET_BYTES", tape_budget)
        y, m = y0.clone().requires_grad_(True), mu.clone().requires_grad_(True)
        sol = solve_native(c_rhs, y, 0.0, 10.0, t_eval, params={"mu": m}, threads=1)
        loss = (sol.y * weights).sum() + sol.y_final.sum()
        first = torch.autograd.grad(loss, [y, m], retain_graph=True)
        second = torch.autograd.grad(loss, [y, m])
        return sol.extra["tapes_kept"], first, second

    default = gradient.TAPE_BUDGET_BYTES
    _, none_taped, _ = gradients(0)
    n_kept, first, second = gradients(default if budget is None else budget)
    assert n_kept in kept
    y, m = y0.clone().requires_grad_(True), mu.clone().requires_grad_(True)
    sol = solve(torch_rhs, y, 0.0, 10.0, t_eval, params={"mu": m})
    backprop = torch.autograd.grad((sol.y * weights).sum() + sol.y_final.sum(), [y, m])
    for want, solved_again, got, again in zip(backprop, none_taped, first, second):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10)
        assert torch.equal(solved_again, got) and torch.equal(solved_again, again)


def test_every_function_per_sample_spans_backwards_time_and_a_shared_parameter():
    batch = 5
    k = torch.tensor(0.7, dtype=F64)  # shared: its gradient is the batch sum
    y0 = torch.stack([torch.linspace(-1.0, 1.0, batch, dtype=F64), torch.linspace(0.5, 1.5, batch, dtype=F64)], dim=1)
    t0 = torch.tensor([0.0, 0.5, 1.0, 2.0, 2.0], dtype=F64)
    t1 = torch.tensor([2.0, 3.0, -1.0, 2.0, 0.0], dtype=F64)  # a backwards span and an empty one
    # per-sample grids: points before the start, inside, at the end; 2.0 is t1 of sample 0
    t_eval = torch.stack([torch.linspace(float(a), float(b), 5, dtype=F64) for a, b in zip(t0, t1)])
    t_eval[0, 0] = -0.5
    _compare(ZOO, {"k": k}, y0, t0, t1, t_eval, rtol=1e-8, atol=1e-9,
             controller=PIDController(pcoeff=0.2, icoeff=0.5, dcoeff=0.1))


def test_a_sample_stopped_by_max_steps_gets_the_gradient_of_what_it_computed():
    mu, y0 = vdp_inputs(4)
    mu = mu * torch.tensor([1.0, 1.0, 30.0, 1.0], dtype=F64)
    sol, _ = _compare(VDP, {"mu": mu}, y0, 0.0, 5.0, torch.linspace(0.0, 5.0, 11, dtype=F64), rtol=1e-8, atol=1e-8,
                      max_steps=120)
    assert (sol.status == 0).any() and (sol.status != 0).any()


def test_the_reference_gradient_is_the_finite_difference_of_the_solution():
    """The C gradient of y(T) in mu equals central differences of the C solve (smooth, fixed steps)."""
    mu, y0 = vdp_inputs(3)
    c_rhs, _ = system(VDP, ("mu",))
    mu_ = mu.clone().requires_grad_(True)
    sol = solve_native(c_rhs, y0, 0.0, 2.0, params={"mu": mu_}, method="rk4", dt0=0.01)
    (grad,) = torch.autograd.grad(sol.y_final[:, 0].sum(), [mu_])
    eps = 1e-6
    plus = solve_native(c_rhs, y0, 0.0, 2.0, params={"mu": mu + eps}, method="rk4", dt0=0.01).y_final[:, 0]
    minus = solve_native(c_rhs, y0, 0.0, 2.0, params={"mu": mu - eps}, method="rk4", dt0=0.01).y_final[:, 0]
    torch.testing.assert_close(grad, (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-8)


def test_outputs_without_gradient_needs_stay_plain_and_unsupported_inputs_say_why():
    mu, y0 = vdp_inputs(2)
    c_rhs, _ = system(VDP, ("mu",))
    plain = solve_native(c_rhs, y0, 0.0, 1.0, params={"mu": mu})
    assert not plain.y.requires_grad
    assert gradient_unsupported(NativeRhs(("y[0] ? 1.0 : 2.0",)), "dopri5") != ""
    assert "rodas5" in gradient_unsupported(c_rhs, "rodas5")
    with pytest.raises(NativeUnavailable):
        solve_native_with_grad(NativeRhs(("y[0] ? 1.0 : 2.0",)), y0[:, :1].requires_grad_(True), 0.0, 1.0)
    assert gradient_unsupported(c_rhs, "dopri5") == ""
    np.testing.assert_equal(plain.y.numpy(), solve_native(c_rhs, y0.detach(), 0.0, 1.0, params={"mu": mu}).y.numpy())
