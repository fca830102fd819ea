"""Shared test problems for the batched ODE solver tests.

Every RHS follows the solver's convention ``f(t (A,), y (A, n), p) -> (A, n)`` where ``p`` holds
the per-sample parameters of exactly the rows being evaluated (the solver compacts finished
samples away, so per-sample data must never be captured in a closure). Each problem that has a
closed-form solution provides it; the others have a NumPy RHS for scipy's ``solve_ivp``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.integrate import solve_ivp

# ---------------------------------------------------------------------------- analytic problems


def gauss_rhs(t, y, p):
    """y' = -2 t y  (non-autonomous, so the stage times c_i are exercised)."""
    return -2.0 * t[:, None] * y


def gauss_exact(t, y0, t0):
    """Solution of :func:`gauss_rhs`: y(t) = y0 exp(t0^2 - t^2). Works on tensors or arrays."""
    t = torch.as_tensor(t, dtype=torch.as_tensor(y0).dtype)
    t0 = torch.as_tensor(t0, dtype=t.dtype)
    return torch.as_tensor(y0)[..., None, :] * torch.exp(t0[..., None] ** 2 - t ** 2)[..., None]


def rotation_rhs(t, y, p):
    """y' = omega * [[0, 1], [-1, 0]] y with per-sample ``p['omega']`` (A,)."""
    w = p["omega"][:, None]
    return torch.stack([w[:, 0] * y[:, 1], -w[:, 0] * y[:, 0]], dim=1)


def rotation_exact(t, y0, t0, omega):
    """Solution of :func:`rotation_rhs` at times ``t`` (B, n_eval) -> (B, n_eval, 2)."""
    phase = omega[:, None] * (t - t0[:, None])
    c, s = torch.cos(phase), torch.sin(phase)
    a, b = y0[:, 0:1], y0[:, 1:2]
    return torch.stack([a * c + b * s, -a * s + b * c], dim=-1)


def chirp_rhs(t, y, p):
    """Rotation with a time-dependent rate: y' = omega (1 + t/2) [[0, 1], [-1, 0]] y.

    Linear (so the asymptotic error regime starts at moderate steps, which keeps the fitted
    convergence slopes clean) yet non-autonomous (so a wrong stage time c_i shows up).
    """
    w = p["omega"] * (1 + 0.5 * t)
    return torch.stack([w * y[:, 1], -w * y[:, 0]], dim=1)


def chirp_exact(t, y0, t0, omega):
    """Solution of :func:`chirp_rhs` at times ``t`` (B, n_eval) from (t0 (B,), y0 (B, 2))."""
    phase = omega[:, None] * ((t + 0.25 * t * t) - (t0 + 0.25 * t0 * t0)[:, None])
    c, s = torch.cos(phase), torch.sin(phase)
    a, b = y0[:, 0:1], y0[:, 1:2]
    return torch.stack([a * c + b * s, -a * s + b * c], dim=-1)


def forced_rhs(t, y, p):
    """Non-autonomous, nonlinear scalar problem with solution y = sin(t) + cos(2t) offset.

    y' = cos(t) - 2 sin(2t) + (y - sin(t) - cos(2t))**2: the exact solution
    y(t) = sin(t) + cos(2t) zeroes the last term, but a numerical error does not, so the
    nonlinearity and the time dependence both enter the local error.
    """
    tt = t[:, None]
    exact = torch.sin(tt) + torch.cos(2 * tt)
    return torch.cos(tt) - 2 * torch.sin(2 * tt) + (y - exact) ** 2 - 0.5 * (y - exact)


def forced_exact(t):
    return (torch.sin(t) + torch.cos(2 * t))[..., None]


# ------------------------------------------------------------------- problems without closed form


def vdp_rhs(t, y, p):
    """Van der Pol with per-sample stiffness ``p['mu']`` (A,)."""
    x, v = y[:, 0], y[:, 1]
    return torch.stack([v, p["mu"] * (1 - x * x) * v - x], dim=1)


def vdp_np(mu):
    def f(t, y):
        return np.array([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]])
    return f


def lotka_rhs(t, y, p):
    """Lotka–Volterra with per-sample a, b, c, d."""
    x, z = y[:, 0], y[:, 1]
    return torch.stack([p["a"] * x - p["b"] * x * z, p["d"] * x * z - p["c"] * z], dim=1)


def lotka_np(a, b, c, d):
    def f(t, y):
        return np.array([a * y[0] - b * y[0] * y[1], d * y[0] * y[1] - c * y[1]])
    return f


def lorenz_rhs(t, y, p):
    """Lorenz with per-sample sigma, rho, beta."""
    x, u, z = y[:, 0], y[:, 1], y[:, 2]
    return torch.stack([p["sigma"] * (u - x), x * (p["rho"] - z) - u, x * u - p["beta"] * z], dim=1)


def lorenz_np(sigma, rho, beta):
    def f(t, y):
        return np.array([sigma * (y[1] - y[0]), y[0] * (rho - y[2]) - y[1], y[0] * y[1] - beta * y[2]])
    return f


def scipy_reference(fun, y0, t0, t1, t_eval, rtol=1e-12, atol=1e-12):
    """High-accuracy DOP853 reference at ``t_eval`` -> array (n_eval, n)."""
    t_eval = np.asarray(t_eval, dtype=float)
    if t0 == t1:
        return np.repeat(np.asarray(y0, dtype=float)[None], len(t_eval), axis=0)
    sol = solve_ivp(fun, (float(t0), float(t1)), np.asarray(y0, dtype=float), method="DOP853",
                    t_eval=t_eval, rtol=rtol, atol=atol)
    assert sol.success, sol.message
    return sol.y.T


def params_row(params, i):
    """The parameters of sample ``i`` as a batch of one (for solo solves)."""
    return {k: v[i:i + 1] for k, v in params.items()}


def log_slope(x, y):
    """Least-squares slope of log(y) against log(x)."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


TWO_PI = 2 * math.pi
