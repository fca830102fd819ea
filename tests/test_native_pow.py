"""The controller's powers over vector lanes (``odecli/ode/native/libm_pow.c``) against libm's ``pow``.

The vector path must return what the system's scalar ``pow`` returns, bit for bit, on every
input it takes (the others go to ``pow`` itself): the solver's steps then stay those of the
scalar solver and of scipy. A dropped or extra fused multiply-add, or a wrong table entry,
changes the last bit on a share of inputs, which millions of inputs show.
"""

from __future__ import annotations

import ctypes
import platform

import numpy as np
import pytest
import torch

from odecli import native
from odecli.ode.controllers import PIDController
from odecli.ode.native import NativeRhs, solve_native
from odecli.ode.native import engine as native_engine
from odecli.ode.native.codegen import _pow_lanes_c

F64 = torch.float64
W = 8

_HARNESS = """
#include <math.h>
#include <stdint.h>
#include <string.h>
#define W 8
{pow_lanes}

static int differ(double a, double b)
{{
    uint64_t ia, ib;
    memcpy(&ia, &a, 8);
    memcpy(&ib, &b, 8);
    return ia != ib && !(isnan(a) && isnan(b));
}}

/* How many of x^y, over lanes of W, pow_lanes or its common path (where it claims the input)
 * get wrong; *common counts the inputs the common path claims. */
int64_t pow_mismatches(const double *x, const double *y, int64_t n, int64_t *common)
{{
    int64_t wrong = 0;
    *common = 0;
    for (int64_t start = 0; start + W <= n; start += W) {{
        double out[W], want[W];
        pow_lanes(x + start, y[start], out);
        for (int l = 0; l < W; l++) want[l] = pow(x[start + l], y[start]);
        for (int l = 0; l < W; l++) wrong += differ(out[l], want[l]);
#ifdef POW_LANES_BUILT
        if (pow_lanes_exponent_ok(y[start])) {{
            int64_t slow[W];
            pow_lanes_common(x + start, y[start], out, slow);
            for (int l = 0; l < W; l++) {{
                *common += !slow[l];
                wrong += !slow[l] && differ(out[l], want[l]);
            }}
        }}
#endif
    }}
    return wrong;
}}
"""


@pytest.fixture(scope="module")
def harness():
    lib, why = native.load_source("test-pow-lanes", _HARNESS.format(pow_lanes=_pow_lanes_c()).encode())
    if lib is None:
        pytest.skip(f"no C compiler: {why}")
    lib.pow_mismatches.restype = ctypes.c_int64
    lib.pow_mismatches.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.odecli_pow_lanes.restype = ctypes.c_int
    lib.odecli_pow_lanes.argtypes = [ctypes.c_int]
    return lib


def _mismatches(lib, x: np.ndarray, y_per_lane_group: np.ndarray) -> tuple[int, int]:
    x = np.ascontiguousarray(x, dtype=np.float64)
    y = np.ascontiguousarray(np.repeat(y_per_lane_group, W)[: len(x)], dtype=np.float64)
    common = ctypes.c_int64()
    wrong = lib.pow_mismatches(x.ctypes.data, y.ctypes.data, len(x), ctypes.byref(common))
    return int(wrong), common.value


def _inputs(n: int, seed: int) -> np.ndarray:
    """Positive doubles of every exponent (random bits), log-uniform ones where the controller
    works (1/err in 1e-30..1e30), and the special values."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**63 - 1, size=n // 2, dtype=np.int64).view(np.float64)
    spread = np.exp(rng.uniform(-69.0, 69.0, size=n - n // 2 - 16))
    special = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 5e-324, 2.2e-308, 1.7e308,
                        -2.0, 0.5, 2.0, 1 + 2**-52, 1 - 2**-53, 1e-300])
    return np.concatenate([special, bits, spread])


def _glibc_with_fma() -> bool:
    flags = native._cpu_signature().split()
    return platform.machine() == "x86_64" and platform.libc_ver()[0] == "glibc" and "fma" in flags


needs_vector_path = pytest.mark.skipif(not _glibc_with_fma(),
                                       reason="the vector path is glibc's pow on x86-64 with FMA only")


@needs_vector_path
def test_the_vector_path_is_taken_on_this_machine(harness):
    """The load check passed: this libm's pow is the algorithm libm_pow.c writes out."""
    assert harness.odecli_pow_lanes(1) == 1, "the load check found libm's pow different"


@needs_vector_path
@pytest.mark.parametrize("exponents", ["controllers", "random"])
def test_pow_lanes_equals_libm_pow_bit_for_bit(harness, exponents):
    n = 1_600_000
    x = _inputs(n, seed=1 if exponents == "controllers" else 2)
    if exponents == "controllers":
        # 1/k for orders 2..8, the PI and PID coefficients over k, and a few others
        ys = np.array([1 / 5, 1 / 4, 1 / 3, 1 / 8, 1 / 6, 0.7 / 5, 0.4 / 5, -0.4 / 5, 0.3 / 5, -0.1 / 5, 0.5, 2.5])
        y = ys[np.arange(n // W) % len(ys)]
    else:
        y = np.random.default_rng(3).uniform(-4.0, 4.0, size=n // W)
    wrong, common = _mismatches(harness, x, y)
    assert wrong == 0
    assert common > 0.7 * n  # the inputs exercise the vector path, not only the fallback


def test_pow_lanes_switch_falls_back_to_libm(harness):
    x = _inputs(80_000, seed=4)
    try:
        assert harness.odecli_pow_lanes(0) == 0
        wrong, _ = _mismatches(harness, x, np.full(len(x) // W, 0.2))
        assert wrong == 0
    finally:
        harness.odecli_pow_lanes(1)


VDP = NativeRhs(("y[1]", "((p[0] * (1.0 - odecli_sq(y[0]))) * y[1]) - y[0]"), ("mu",))


@needs_vector_path
@pytest.mark.parametrize("controller", ["integral", "pi", PIDController(pcoeff=0.2, icoeff=0.4, dcoeff=0.1)],
                         ids=["integral", "pi", "pid"])
def test_solutions_are_the_same_with_either_pow(controller):
    """Every call of pow_lanes in the controller (1/err, the error history) on stiff and mild samples."""
    b = 203  # not a multiple of the lanes
    y0 = torch.tensor([[2.0, 0.0]], dtype=F64).expand(b, 2).contiguous()
    params = {"mu": torch.linspace(0.5, 60.0, b, dtype=F64)}
    grid = torch.linspace(0.0, 10.0, 11, dtype=F64)
    runs = []
    try:
        for on in (True, False):
            assert native_engine.use_pow_lanes(VDP, "tsit5", on) == on
            runs.append(solve_native(VDP, y0, 0.0, 10.0, grid, params=params, method="tsit5", rtol=1e-7,
                                     atol=1e-7, controller=controller, threads=1))
    finally:
        native_engine.use_pow_lanes(VDP, "tsit5", True)
    lanes, libm = runs
    assert torch.equal(lanes.y, libm.y)
    for key in ("n_steps", "n_accepted", "n_rejected", "n_f_evals"):
        assert torch.equal(lanes.stats[key], libm.stats[key])
    assert int(lanes.stats["n_rejected"].sum()) > 0  # the shrink branch ran too
