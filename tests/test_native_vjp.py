"""The generated vector-Jacobian product against torch autograd of the same spec expressions.

Each case is a three-state system over states x, y, z, parameters mu, k and time t: the
spec text goes through ``expression_to_c`` (as the native solver gets it), the generated
``rhs_vjp`` is compiled with the solver's own helpers, and ``v^T df/dy``, ``v^T df/dp`` must
match torch autograd of ``compile_expression`` of the same text to round-off.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import pytest
import torch

from odecli.native import load_source
from odecli.ode.native import codegen
from odecli.ode.native.vjp import rhs_vjp_source
from odecli.specs.expr import compile_expression, expression_to_c

STATES = ("x", "y", "z")
PARAMS = ("mu", "k")
SYMBOLS = {"t": "t", **{name: f"y[{i}]" for i, name in enumerate(STATES)},
           **{name: f"p[{j}]" for j, name in enumerate(PARAMS)}}
ROWS = 64
NAN = "(1e999 - 1e999)"  # the spec language has no NaN literal; inf - inf is one

# The solver's own odecli_sq / odecli_fmin / odecli_fmax, taken from its C template.
_HELPERS = [line for line in codegen.SOLVER_TEMPLATE.read_text().splitlines()
            if line.startswith("static inline double odecli_")]
_WRAPPER = """
void vjp_rows(long n, long ns, long np, const double *t, const double *y, const double *p,
              const double *v, double *ybar, double *pbar)
{
    for (long r = 0; r < n; r++)
        rhs_vjp(t[r], y + r * ns, p + r * np, v + r * ns, ybar + r * ns, pbar + r * np);
}
"""

CASES = {
    "add-sub-mul-div": ("x + y * z", "x - mu * z", "(x - y) / (z + t)"),
    "div-by-leaves-and-neg": ("-x / (mu * z)", "k / x", "-(y / k) - -z"),
    "trig": ("sin(x * mu)", "cos(y + t)", "tan(z / 2)"),
    "exp-log": ("exp(-mu * x)", "log(y * k)", "exp(log(z) / 3)"),
    "sqrt-tanh": ("sqrt(z + mu)", "tanh(x - y)", "sqrt(x) * tanh(k * z)"),
    "abs-both-signs": ("abs(x - 1)", "abs(mu - k) * y", "abs(sin(3 * z * t) - 0.5)"),
    "square": ("x**2", "(mu * y)**2 - z**2", "(x - y)**2 * k"),
    "constant-exponents": ("y**3 + z**0.5", "x**-1.5", "(x + z)**2.5 * mu**-2"),
    "variable-exponents": ("x**mu", "2**y + z**(k * t)", "(x + y)**(z - 1)"),
    "zero-exponents": ("x**0", "y**(k - k)", "(mu * z)**(0 * x)"),
    "e-and-pi": ("e**(-x * t)", "pi * y**k", "(pi / mu)**z"),
    "min-max": ("min(x, y)", "max(mu * z, k)", "min(max(x, t), z * k)"),
    "infinite-and-nan-constants": ("min(x, 1e999) + max(y, -1e999)",
                                   f"min(z, {NAN}) + max(mu, {NAN})", "x / 1e999 + k * 1e-300 * 1e300"),
    "time": ("t * x + sin(t) * mu", "exp(-t) * y", "t**2 * z + t"),
    "repeated-leaves": ("x * x * x + x / y", "y * sin(y) - y", "mu * mu / (mu + z * z)"),
    "nested": ("sqrt(exp(sin(x * y)) + log(1 + z**2))",
               "tanh(mu * x * y - k * z) / (1 + abs(x - y))",
               "max(x, 1 / y) ** min(mu, k) - cos(tan(z / 4) * exp(-t))"),
    "independent": ("mu * x", "x - k", "3.5 + sin(t)"),
    "constant-and-time-only": ("2.0", "pi * t", "t**t"),
}


@functools.lru_cache(maxsize=None)
def _library(equations: tuple[str, ...]):
    assert len(_HELPERS) == 3, "odecli_sq, odecli_fmin, odecli_fmax not found in codegen.SOLVER_TEMPLATE"
    source = "#include <math.h>\n" + "\n".join(_HELPERS) + "\n\n" + rhs_vjp_source(equations) + _WRAPPER
    lib, why = load_source("test-vjp", source.encode())
    if lib is None:
        if why.startswith(("no C compiler", "turned off")):
            pytest.skip(why)
        pytest.fail(why)
    lib.vjp_rows.argtypes = [ctypes.c_long] * 3 + [ctypes.c_void_p] * 6
    lib.vjp_rows.restype = None
    return lib


def _points(seed: int = 0) -> dict[str, torch.Tensor]:
    """t in [0, 1], positive states and parameters (logs, roots, real powers), any adjoint."""
    gen = torch.Generator().manual_seed(seed)
    uniform = lambda *shape, lo, hi: lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=torch.float64)
    return {"t": uniform(ROWS, lo=0.0, hi=1.0), "y": uniform(ROWS, 3, lo=0.5, hi=2.0),
            "p": uniform(ROWS, 2, lo=0.5, hi=1.5), "v": torch.randn(ROWS, 3, generator=gen, dtype=torch.float64)}


def native_vjp(texts, t, y, p, v, ybar=None, pbar=None) -> tuple[np.ndarray, np.ndarray]:
    """``(ybar, pbar)`` after the generated rhs_vjp added into them (zeros by default), row by row."""
    lib = _library(tuple(expression_to_c(text, SYMBOLS, "test.yaml", "field") for text in texts))
    arrays = [np.ascontiguousarray(a.numpy(), dtype=np.float64) for a in (t, y, p, v)]
    ybar = np.zeros(y.shape) if ybar is None else np.array(ybar, dtype=np.float64)
    pbar = np.zeros(p.shape) if pbar is None else np.array(pbar, dtype=np.float64)
    lib.vjp_rows(len(t), 3, 2, *(a.ctypes.data for a in (*arrays, ybar, pbar)))
    return ybar, pbar


def torch_vjp(texts, t, y, p, v) -> tuple[np.ndarray, np.ndarray]:
    y, p = y.clone().requires_grad_(), p.clone().requires_grad_()
    env = {"t": t, **{name: y[:, i] for i, name in enumerate(STATES)},
           **{name: p[:, j] for j, name in enumerate(PARAMS)}}
    outs, adjoints = [], []
    for i, text in enumerate(texts):
        out = compile_expression(text, set(SYMBOLS), "test.yaml", "field")(env)
        if out.requires_grad:
            outs.append(out)
            adjoints.append(v[:, i])
    if not outs:
        return np.zeros(y.shape), np.zeros(p.shape)
    grads = torch.autograd.grad(outs, (y, p), adjoints, allow_unused=True)
    return tuple(np.zeros(x.shape) if g is None else g.numpy() for g, x in zip(grads, (y, p)))


def _assert_matches_torch(texts, points) -> None:
    got, want = native_vjp(texts, **points), torch_vjp(texts, **points)
    for name, g, w in zip(("ybar", "pbar"), got, want):
        assert np.isfinite(w).all(), f"bad test point: torch's {name} is not finite"
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14, err_msg=f"{name} of {texts}")


@pytest.mark.parametrize("case", CASES)
def test_matches_torch_autograd(case):
    _assert_matches_torch(CASES[case], _points())


def test_ties_and_zeros_follow_torch():
    """min/max split the gradient in halves at a tie, |a|' is 0 at 0 and pow's guards give 0
    where its formulas would give NaN or inf (a zero exponent, a zero base), as in torch."""
    points = _points(1)
    y = points["y"]
    y[::2, 1] = y[::2, 0]  # x == y on even rows
    y[::3, 2] = 0.0  # z == 0 on every third row
    points["p"][::2, 1] = points["p"][::2, 0]  # mu == k on even rows
    texts = ("min(x, y) + 2 * max(y, x)", "abs(z) + abs(x - y) * mu + min(mu, k) * max(k, mu)**2",
             "max(z, 0) + min(0, z)**2 + abs(z) * x + z**0 + z**(k + 1) + z**(k - k) + 0**x")
    _assert_matches_torch(texts, points)
    ybar, _ = native_vjp(("min(x, y)", "0.0", "0.0"), **{**points, "v": torch.ones(ROWS, 3, dtype=torch.float64)})
    np.testing.assert_array_equal(ybar[::2, :2], 0.5)
    ybar, _ = native_vjp(("abs(z)", "0.0", "0.0"), **{**points, "v": torch.ones(ROWS, 3, dtype=torch.float64)})
    np.testing.assert_array_equal(ybar[::3, 2], 0.0)
    np.testing.assert_array_equal(ybar[1::3, 2], 1.0)


def test_unused_states_and_parameters_get_exactly_zero():
    points = _points(2)
    ybar, pbar = native_vjp(CASES["independent"], **points)
    assert (ybar[:, 0] != 0).all() and (pbar[:, :] != 0).all()
    np.testing.assert_array_equal(ybar[:, 1:], 0.0)
    ybar, pbar = native_vjp(CASES["constant-and-time-only"], **points)
    np.testing.assert_array_equal(ybar, 0.0)
    np.testing.assert_array_equal(pbar, 0.0)


def test_accumulates_into_the_outputs():
    points = _points(3)
    start_y, start_p = np.full((ROWS, 3), 0.25), np.full((ROWS, 2), -4.0)
    texts = CASES["nested"]
    ybar, pbar = native_vjp(texts, **points, ybar=start_y, pbar=start_p)
    want_y, want_p = torch_vjp(texts, **points)
    np.testing.assert_allclose(ybar, start_y + want_y, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(pbar, start_p + want_p, rtol=1e-12, atol=1e-14)


def test_constant_subtrees_get_no_adjoint_code():
    source = rhs_vjp_source(("(sin((t * 2.0)) * y[0])", "exp(p[0])"))
    body = source[source.index("{\n"):]
    assert "cos(" not in body  # sin(t * 2)'s derivative is never needed
    assert "pbar[0] += (v[1] * f" in body and "ybar[1]" not in body


@pytest.mark.parametrize("bad", [
    "foo(y[0])", "q[0]", "y[3]", "y[-1]", "y[0.5]", "y[True]", "y", "x", "y[0] ** 2.0", "y[0] % 2.0",
    "+y[0]", "sin(y[0], y[1])", "pow(y[0])", "fabs(x=y[0])", "math.sin(y[0])", "y[0] < 1.0",
    "y[0] if t else p[0]", "True", "'a'", "(y[0], y[1])", "y[0] +", "", "y[0]\0",
])
def test_unknown_syntax_raises_value_error(bad):
    with pytest.raises(ValueError, match="equation 1"):
        rhs_vjp_source(("y[1]", bad, "p[0]"))
