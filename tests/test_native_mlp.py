"""The generated C solver with an MLP right-hand side (a neural ODE) against the PyTorch loop and libm."""

from __future__ import annotations

import ctypes
from typing import Callable

import numpy as np
import pytest
import torch
from torch import nn

from odecli import native
from odecli.ode.native import NativeMLP, NativeUnavailable, engine as native_engine, solve_native
from odecli.ode.native.gradient import gradient_unsupported
from odecli.ode.native.mlp import _ACTIVATION_C
from odecli.ode.solver import solve

F64 = torch.float64


def _net(*layers: Callable[[], nn.Module]) -> nn.Sequential:
    torch.manual_seed(0)  # built after seeding: the same weights whatever ran before
    return nn.Sequential(*(layer() for layer in layers)).double()


ARCHITECTURES = {
    "tanh, 2 layers": lambda: _net(lambda: nn.Linear(3, 16), nn.Tanh, lambda: nn.Linear(16, 3)),
    "sigmoid+tanh, 3 layers": lambda: _net(lambda: nn.Linear(4, 10), nn.Sigmoid, lambda: nn.Linear(10, 7),
                                           nn.Tanh, lambda: nn.Linear(7, 4)),
    "silu, no bias, last activation": lambda: _net(lambda: nn.Linear(5, 9), nn.SiLU, nn.Identity,
                                                   lambda: nn.Linear(9, 5, bias=False), nn.Tanh),
}
RELU = lambda: _net(lambda: nn.Linear(4, 10), nn.ReLU, lambda: nn.Linear(10, 7), nn.Sigmoid,  # noqa: E731
                    lambda: nn.Linear(7, 4))
"""Kept out of the solve comparison: at ReLU's kink the steps are ill-conditioned (a 1e-15 change
of y0 moved torch's own solution by 4e-8), so it is checked per evaluation and across lanes."""


def _problem(n_states: int, batch: int = 19):
    gen = torch.Generator().manual_seed(1)
    y0 = torch.randn(batch, n_states, generator=gen, dtype=F64)
    t_end = torch.linspace(1.0, 3.0, batch, dtype=F64)
    t_eval = torch.linspace(0.0, 1.0, 7, dtype=F64)[None, :] * t_end[:, None]
    return y0, t_end, t_eval


@pytest.mark.parametrize("method", ["dopri5", "dop853"])
@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_mlp_matches_the_pytorch_loop(name: str, method: str):
    # Same per-sample steps as the batched loop calling the module, outputs (dense output
    # included) to round-off: the C layers sum in another order than torch's matmul.
    net = ARCHITECTURES[name]()
    y0, t_end, t_eval = _problem(net[0].in_features)
    c = solve_native(NativeMLP.from_module(net), y0, 0.0, t_end, t_eval, method=method, rtol=1e-8, atol=1e-8)
    with torch.no_grad():
        ref = solve(lambda t, y, p: net(y), y0, 0.0, t_end, t_eval, method=method, rtol=1e-8, atol=1e-8)
    assert (c.status == 0).all()
    assert torch.equal(c.stats["n_steps"], ref.stats["n_steps"])
    assert torch.equal(c.stats["n_f_evals"], ref.stats["n_f_evals"])
    scale = ref.y.abs().max()
    assert (c.y - ref.y).abs().max() <= 1e-11 * scale
    assert (c.y_final - ref.y_final).abs().max() <= 1e-11 * scale


@pytest.mark.parametrize("name", [*sorted(ARCHITECTURES), "relu"])
def test_mlp_rhs_matches_the_module(name: str):
    # One Euler step of size 1 from many states returns y0 + f(y0): the C layers evaluated directly.
    net = RELU() if name == "relu" else ARCHITECTURES[name]()
    y = 3 * torch.randn(2000, net[0].in_features, generator=torch.Generator().manual_seed(2), dtype=F64)
    step = solve_native(NativeMLP.from_module(net), y, 0.0, 1.0, method="euler", dt0=1.0)
    with torch.no_grad():
        f = net(y)
    assert (step.y_final - (y + f)).abs().max() <= 1e-14 * (y.abs().max() + f.abs().max())


def test_mlp_samples_do_not_depend_on_the_lanes(monkeypatch):
    # The lane functions and the one-sample function sum in the same order, so every sample's
    # result is the same bit for bit whether it runs alone or beside others.
    net = RELU()
    y0, t_end, t_eval = _problem(4, batch=13)
    runs = []
    for lanes in (1, 3, 8):
        monkeypatch.setattr(native_engine, "LANES", lanes)
        runs.append(solve_native(NativeMLP.from_module(net), y0, 0.0, t_end, t_eval))
    for run in runs[1:]:
        assert torch.equal(run.y, runs[0].y) and torch.equal(run.stats["n_steps"], runs[0].stats["n_steps"])


def test_activations_match_libm():
    # The vectorisable exp/tanh/sigmoid the MLP uses, against numpy (libm) over the whole range.
    source = "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n#define W 8\n" + _ACTIVATION_C + """
void apply(int64_t which, int64_t n, const double *x, double *out)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = which == 0 ? odecli_exp(x[i]) : which == 1 ? act_tanh(x[i]) : which == 2 ? act_sigmoid(x[i])
               : which == 3 ? act_silu(x[i]) : act_relu(x[i]);
}
"""
    lib, why = native.load_source("test-mlp-activations", source.encode(), NativeMLP.c_flags)
    assert lib is not None, why
    lib.apply.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]

    def run(which: int, x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)
        lib.apply(which, x.size, x.ctypes.data, out.ctypes.data)
        return out

    def rel(a, b):
        return np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300))

    gen = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-30, 30, 200_001), gen.normal(0, 3, 100_000), [0.0, 0.625, -0.625, 1e-300]])
    wide = np.linspace(-708, 708, 100_001)
    sigmoid = 1 / (1 + np.exp(-x))
    assert rel(run(0, wide), np.exp(wide)) < 1e-15
    assert rel(run(1, x), np.tanh(x)) < 1e-15
    assert rel(run(2, x), sigmoid) < 1e-15
    assert rel(run(3, x), x * sigmoid) < 1e-15
    assert np.array_equal(run(4, x), np.maximum(x, 0.0))
    special = np.array([np.inf, -np.inf, 800.0, -800.0, np.nan])
    assert np.array_equal(run(1, special)[:4], [1.0, -1.0, 1.0, -1.0]) and np.isnan(run(1, special)[4])
    assert np.array_equal(run(2, special)[[0, 2]], [1.0, 1.0]) and run(2, special)[3] < 1e-300
    assert np.isnan(run(2, special)[4]) and np.isnan(run(4, special)[4])


@pytest.mark.parametrize("layers, message", [
    ((nn.Linear(3, 3), nn.Softplus()), "Softplus"),
    ((nn.Tanh(), nn.Linear(3, 3)), "before any Linear"),
    ((nn.Linear(3, 3), nn.Tanh(), nn.ReLU()), "after another activation"),
    ((nn.Linear(3, 4),), "as many outputs as inputs"),
    ((nn.Linear(3, 4), nn.Linear(5, 3)), "layer 1 takes 5 inputs"),
])
def test_from_module_names_what_it_cannot_compile(layers, message):
    with pytest.raises(ValueError, match=message):
        NativeMLP.from_module(nn.Sequential(*layers))


def test_mlp_gradients_are_refused_so_callers_fall_back():
    net = ARCHITECTURES["tanh, 2 layers"]()
    mlp = NativeMLP.from_module(net)
    assert "MLP" in gradient_unsupported(mlp, "dopri5")
    y0 = torch.ones(2, 3, dtype=F64, requires_grad=True)
    with pytest.raises(NativeUnavailable, match="MLP"):
        solve_native(mlp, y0, 0.0, 1.0)
