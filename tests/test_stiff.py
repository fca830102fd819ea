"""Stiff methods: orders, stiff test problems against Radau references, step counts vs Radau,
per-sample independence, ``auto`` switching, the CLI on a stiff spec.

References come from problems/stiff/*.reference.yaml (scipy Radau at rtol = 1e-12 or the Bari
IVP test set values, produced by problems/make_references.py, never by odecli). The problems are
solved at rtol = 1e-6 here (1e-8 in the specs) to keep the file fast; the bound is proportional
to that rtol: ``|y - y_ref| <= BOUND * rtol * max(|y_ref|, atol / rtol)``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml
from scipy.integrate import solve_ivp

from odecli.ode.controllers import make_controller
from odecli.ode.implicit.linalg import jacobian
from odecli.ode.solver import solve
from odecli.app.solve import solve_spec
from odecli.specs import load_ode_spec

ROOT = Path(__file__).resolve().parent.parent
STIFF = ROOT / "problems" / "stiff"
RTOL = 1e-6
BOUND = 20.0
IMPLICIT = {"rodas5": 5, "rodas5p": 5, "rodas4": 4, "kvaerno5": 5, "kvaerno3": 3}


# ------------------------------------------------------------------------------------- helpers

def linear_rhs(t, y, p):
    """Non-autonomous linear system (exercises J and the d_i h f_t terms)."""
    a, b = y[:, 0], y[:, 1]
    return torch.stack([-2.0 * a + b + torch.cos(t), a - 3.0 * b + torch.sin(2 * t)], dim=-1)


def vdp_rhs(t, y, p):
    x, v = y[:, 0], y[:, 1]
    return torch.stack([v, p["mu"] * (1 - x * x) * v - x], dim=-1)


def rober_np(t, y, k1=0.04, k2=3e7, k3=1e4):
    return [-k1 * y[0] + k3 * y[1] * y[2], k1 * y[0] - k3 * y[1] * y[2] - k2 * y[1] ** 2, k2 * y[1] ** 2]


def vdp_np(t, y, mu=1000.0):
    return [y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]]


def hires_np(t, y):
    return [
        -1.71 * y[0] + 0.43 * y[1] + 8.32 * y[2] + 0.0007, 1.71 * y[0] - 8.75 * y[1],
        -10.03 * y[2] + 0.43 * y[3] + 0.035 * y[4], 8.32 * y[1] + 1.71 * y[2] - 1.12 * y[3],
        -1.745 * y[4] + 0.43 * y[5] + 0.43 * y[6],
        -280.0 * y[5] * y[7] + 0.69 * y[3] + 1.71 * y[4] - 0.43 * y[5] + 0.69 * y[6],
        280.0 * y[5] * y[7] - 1.81 * y[6], -280.0 * y[5] * y[7] + 1.81 * y[6],
    ]


def orego_np(t, y):
    return [77.27 * (y[1] + y[0] * (1 - 8.375e-6 * y[0] - y[1])), (y[2] - (1 + y[0]) * y[1]) / 77.27,
            0.161 * (y[0] - y[2])]


SCIPY_RHS = {"robertson": rober_np, "vanderpol-stiff": vdp_np, "hires": hires_np, "oregonator": orego_np}


def spec_at(stem: str, method: str, rtol: float = RTOL):
    spec = load_ode_spec(STIFF / f"{stem}.yaml")
    ratio = spec.solver.atol / spec.solver.rtol
    return dataclasses.replace(spec, solver=dataclasses.replace(spec.solver, method=method, rtol=rtol, atol=rtol * ratio))


_SOLVED: dict[tuple[str, str], tuple] = {}


def solved(stem: str, method: str):
    """(spec, solution), cached: the reference and the step-count tests share one solve."""
    if (stem, method) not in _SOLVED:
        spec = spec_at(stem, method)
        _SOLVED[stem, method] = (spec, solve_spec(spec))
    return _SOLVED[stem, method]


# ----------------------------------------------------------------------------------- the tests

def test_jacobian_is_exact_per_sample():
    mu = torch.tensor([1.0, 10.0, 1000.0], dtype=torch.float64)
    y = torch.tensor([[2.0, 0.5], [-1.0, 3.0], [0.3, -0.2]], dtype=torch.float64)
    J, f_t = jacobian(lambda t, yy: vdp_rhs(t, yy, {"mu": mu}), torch.zeros(3, dtype=torch.float64), y)
    x, v = y[:, 0], y[:, 1]
    expected = torch.stack([
        torch.stack([torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)], -1),
        torch.stack([-2 * mu * x * v - 1, mu * (1 - x * x)], -1),
    ], dim=1)
    torch.testing.assert_close(J, expected)
    assert torch.equal(f_t, torch.zeros_like(y))  # autonomous
    _, f_t = jacobian(lambda t, yy: linear_rhs(t, yy, {}), torch.full((3,), 0.7, dtype=torch.float64), y)
    torch.testing.assert_close(f_t, torch.tensor([[-math.sin(0.7), 2 * math.cos(1.4)]] * 3, dtype=torch.float64))


@pytest.mark.parametrize("method", IMPLICIT)
def test_order_of_convergence_on_a_linear_problem(method):
    y0 = torch.tensor([[1.0, -0.5]], dtype=torch.float64)
    ref = solve(linear_rhs, y0, 0.0, 2.0, method="dop853", rtol=1e-13, atol=1e-13).y_final
    errors = []
    for n in (10, 20, 40):
        h = 2.0 / n
        sol = solve(linear_rhs, y0, 0.0, 2.0, method=method, rtol=1e10, atol=1e10, dt0=h,
                    controller=make_controller("integral", dt_max=h))
        assert int(sol.stats["n_steps"]) == n
        errors.append(float((sol.y_final - ref).abs().max()))
    slopes = [math.log2(a / b) for a, b in zip(errors, errors[1:])]
    assert min(slopes) > IMPLICIT[method] - 0.3, (errors, slopes)


@pytest.mark.parametrize("method", ["rodas5", "rodas4"])
def test_rosenbrock_dense_output_matches_the_solution(method):
    mu = torch.tensor([5.0], dtype=torch.float64)
    y0 = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    grid = torch.linspace(0.0, 5.0, 41, dtype=torch.float64)
    sol = solve(vdp_rhs, y0, 0.0, 5.0, grid, params={"mu": mu}, method=method, rtol=1e-8, atol=1e-8)
    ref = solve_ivp(lambda t, y: vdp_np(t, y, 5.0), (0, 5), [2.0, 0.0], method="DOP853", rtol=1e-12, atol=1e-12,
                    t_eval=grid.numpy()).y.T
    assert np.abs(sol.y[0].numpy() - ref).max() < 1e-5


@pytest.mark.parametrize("stem,method", [
    ("robertson", "rodas5"), ("vanderpol-stiff", "rodas5"), ("hires", "rodas5"), ("oregonator", "rodas5"),
    ("robertson", "kvaerno5"), ("hires", "kvaerno5"), ("robertson", "rodas4"),
])
def test_stiff_problem_matches_the_radau_reference(stem, method):
    spec, sol = solved(stem, method)
    ref = yaml.safe_load((STIFF / f"{stem}.reference.yaml").read_text())
    assert sol.status.tolist() == [0]
    y_ref = np.asarray(ref["y_end"], dtype=float)
    floor = spec.solver.atol / spec.solver.rtol
    rel = np.abs(sol.y_final.numpy() - y_ref) / np.maximum(np.abs(y_ref), floor)
    assert rel.max() <= BOUND * RTOL, rel
    stats = {k: int(v) for k, v in sol.stats.items() if k.startswith("n_")}
    assert stats["n_jac_evals"] >= 1 and stats["n_lu_decomps"] >= stats["n_jac_evals"]
    if method.startswith("rodas"):  # one Jacobian per accepted step, one LU per attempted step
        assert stats["n_jac_evals"] == stats["n_accepted"] and stats["n_lu_decomps"] == stats["n_steps"]
        assert stats["n_newton_iters"] == 0
    else:  # Jacobians and LUs are reused across steps
        assert stats["n_jac_evals"] < stats["n_accepted"] / 2 and stats["n_newton_iters"] > stats["n_steps"]


@pytest.mark.parametrize("stem,method", [
    ("robertson", "rodas5"), ("vanderpol-stiff", "rodas5"), ("hires", "rodas5"), ("oregonator", "rodas5"),
    ("robertson", "kvaerno5"), ("hires", "kvaerno5"),
])
def test_step_counts_within_twice_radau(stem, method):
    spec, sol = solved(stem, method)
    y0 = np.asarray(spec.initial[0], dtype=float)
    span = (float(np.ravel(spec.t_start)[0]), float(np.ravel(spec.t_end)[0]))
    radau = solve_ivp(SCIPY_RHS[stem], span, y0, method="Radau",
                      rtol=spec.solver.rtol, atol=spec.solver.atol)
    assert radau.success
    radau_steps = len(radau.t) - 1
    assert int(sol.stats["n_steps"]) <= 2 * radau_steps, (int(sol.stats["n_steps"]), radau_steps)


@pytest.mark.parametrize("method", ["rodas5", "kvaerno5", "auto"])
def test_mixed_stiff_and_easy_samples_are_independent(method):
    mu = torch.tensor([1.0, 1000.0, 3.0, 300.0], dtype=torch.float64)
    y0 = torch.tensor([[2.0, 0.0], [2.0, 0.0], [1.0, 1.0], [2.0, -0.5]], dtype=torch.float64)
    t_end = torch.tensor([6.0, 20.0, 4.0, 10.0], dtype=torch.float64)
    grid = torch.linspace(0, 1, 5, dtype=torch.float64)[None, :] * t_end[:, None]
    batch = solve(vdp_rhs, y0, 0.0, t_end, grid, params={"mu": mu}, method=method, rtol=1e-6, atol=1e-6)
    assert batch.status.tolist() == [0, 0, 0, 0]
    for i in range(4):
        solo = solve(vdp_rhs, y0[i:i + 1], 0.0, t_end[i:i + 1], grid[i:i + 1], params={"mu": mu[i:i + 1]},
                     method=method, rtol=1e-6, atol=1e-6)
        for name, value in solo.stats.items():
            if name.startswith("n_") or name == "switched_at_step":
                assert int(batch.stats[name][i]) == int(value[0]), (i, name)
        torch.testing.assert_close(batch.y[i], solo.y[0], rtol=1e-10, atol=1e-12)


@functools.lru_cache
def _vdp_radau(mu: float, t_eval: tuple[float, ...]) -> np.ndarray:
    """Van der Pol from (2, 0) by scipy's Radau at rtol = atol = 1e-10, at the times ``t_eval``."""
    return solve_ivp(lambda t, y: vdp_np(t, y, mu), (0.0, t_eval[-1]), [2.0, 0.0], method="Radau",
                     rtol=1e-10, atol=1e-10, t_eval=t_eval).y.T


@pytest.mark.parametrize("method", ["rodas5", "rodas5p", "rodas4"])
def test_rosenbrock_retries_steps_that_overflow_at_loose_tolerances(method):
    """At rtol = atol = 1e-2 Rosenbrock trial steps on stiff Van der Pol overflow to inf/NaN;
    they used to end the sample with INFINITE_NORM (rodas5/5p: mu = 25 at t = 19 of 75, rodas4:
    mu = 100 at t = 160 of 300). Rejected and retried smaller, every sample finishes, within a
    loose bound of the Radau solution (measured at most 0.14), and as it does alone."""
    mu = torch.tensor([0.5, 25.0, 100.0], dtype=torch.float64)
    t_end = torch.tensor([75.0, 75.0, 300.0], dtype=torch.float64)
    grid = torch.linspace(0.0, 1.0, 5, dtype=torch.float64)[None] * t_end[:, None]
    y0 = torch.tensor([[2.0, 0.0]] * 3, dtype=torch.float64)
    kwargs = dict(method=method, rtol=1e-2, atol=1e-2)
    sol = solve(vdp_rhs, y0, 0.0, t_end, grid, params={"mu": mu}, **kwargs)
    assert sol.status.tolist() == [0, 0, 0]
    for i in range(3):
        ref = _vdp_radau(float(mu[i]), tuple(grid[i].tolist()))
        assert np.abs(sol.y[i].numpy() - ref).max() < 0.2, i
        solo = solve(vdp_rhs, y0[i:i + 1], 0.0, t_end[i:i + 1], grid[i:i + 1], params={"mu": mu[i:i + 1]}, **kwargs)
        for name, value in solo.stats.items():
            if name.startswith("n_"):
                assert int(sol.stats[name][i]) == int(value[0]), (i, name)
        torch.testing.assert_close(sol.y[i], solo.y[0], rtol=1e-10, atol=1e-12)


def test_auto_retries_overflowing_rosenbrock_steps():
    """auto on Van der Pol mu = 100 at 1e-3 used to fail (INFINITE_NORM at t = 81 of 300) once
    its rodas5 steps overflowed; now it finishes close to Radau (measured 6e-4)."""
    grid = torch.linspace(0.0, 300.0, 5, dtype=torch.float64)
    sol = solve(vdp_rhs, torch.tensor([[2.0, 0.0]], dtype=torch.float64), 0.0, 300.0, grid,
                params={"mu": torch.tensor([100.0], dtype=torch.float64)}, method="auto", rtol=1e-3, atol=1e-3)
    assert sol.status.tolist() == [0] and sol.stats["n_switched"].tolist() == [1]
    assert np.abs(sol.y[0].numpy() - _vdp_radau(100.0, tuple(grid.tolist()))).max() < 1e-2


def test_retried_non_finite_steps_leave_the_gradient_finite():
    """A rejected trial stays in autograd's graph, and backward through its inf/NaN values gave
    a NaN gradient for a solve that succeeded; the solve's values and statistics are those of
    the solve without autograd."""
    from odecli import odeint

    y0 = torch.tensor([[2.0, 0.0]], dtype=torch.float64)
    mu = torch.tensor([25.0], dtype=torch.float64, requires_grad=True)
    kwargs = dict(method="rodas5", rtol=1e-2, atol=1e-2)
    sol = odeint(vdp_rhs, y0, 0.0, 75.0, params={"mu": mu}, **kwargs)
    (grad,) = torch.autograd.grad(sol.y_final[0, 0], mu)
    assert sol.status.tolist() == [0] and torch.isfinite(grad).all()
    with torch.no_grad():
        plain = solve(vdp_rhs, y0, 0.0, 75.0, params={"mu": mu.detach()}, **kwargs)
    assert torch.equal(sol.y_final.detach(), plain.y_final)
    for name, value in plain.stats.items():
        assert torch.equal(sol.stats[name], value), name


def test_auto_switches_the_stiff_samples_only():
    mu = torch.tensor([1.0, 1000.0, 2.0, 500.0], dtype=torch.float64)
    y0 = torch.tensor([[2.0, 0.0]] * 4, dtype=torch.float64)
    sol = solve(vdp_rhs, y0, 0.0, 50.0, params={"mu": mu}, method="auto", rtol=1e-6, atol=1e-6)
    assert sol.status.tolist() == [0, 0, 0, 0]
    assert sol.stats["n_switched"].tolist() == [0, 1, 0, 1]
    assert (sol.stats["switched_at_step"][[1, 3]] > 0).all() and (sol.stats["n_jac_evals"][[0, 2]] == 0).all()
    # The easy samples are exactly tsit5; the stiff ones agree with Radau.
    easy = solve(vdp_rhs, y0[[0, 2]], 0.0, 50.0, params={"mu": mu[[0, 2]]}, method="tsit5", rtol=1e-6, atol=1e-6)
    assert sol.stats["n_steps"][[0, 2]].tolist() == easy.stats["n_steps"].tolist()
    torch.testing.assert_close(sol.y_final[[0, 2]], easy.y_final)
    for i in (1, 3):
        ref = solve_ivp(lambda t, y: vdp_np(t, y, float(mu[i])), (0, 50), [2.0, 0.0], method="Radau",
                        rtol=1e-11, atol=1e-11).y[:, -1]
        assert np.abs(sol.y_final[i].numpy() - ref).max() < 1e-4
    # tsit5 alone needs orders of magnitude more steps on the stiff samples.
    assert int(sol.stats["n_steps"][1]) < 200


def test_cli_solves_the_robertson_spec(tmp_path):
    out = tmp_path / "rob.h5"
    run = subprocess.run([sys.executable, "-m", "odecli", "solve", str(STIFF / "robertson.yaml"), "-o", str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    ref = yaml.safe_load((STIFF / "robertson.reference.yaml").read_text())
    with h5py.File(out) as h5:
        y_end = h5["y"][0, -1]
        assert int(h5["stats/n_jac_evals"][0]) > 0 and int(h5["stats/n_lu_decomps"][0]) > 0
        assert int(h5["stats/n_newton_iters"][0]) == 0
    y_ref = np.asarray(ref["y_end"][0])
    rel = np.abs(y_end - y_ref) / np.maximum(np.abs(y_ref), ref["check_floor"])
    assert rel.max() <= ref["check_rtol"]
