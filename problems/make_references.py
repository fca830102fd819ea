"""Regenerate every problem's reference sidecar (``<stem>.reference.yaml``) in problems/.

The references are independent of odecli: this script reads the specs with plain PyYAML,
evaluates each problem through its own hand-written NumPy right-hand side (below) and
integrates with SciPy. It imports nothing from odecli. Before solving, it checks the
hand-written right-hand side against the spec's own equations (or Python file) at random
points, so a typo in a spec cannot slip into its reference.

A reference is one of
  * analytic:  the closed-form solution;
  * published: the Hairer & Wanner / Bari IVP test-set value (ode-anchors.md, section 6),
               cross-checked here against SciPy (the script stops if they disagree);
  * scipy:     ``solve_ivp(method="DOP853", rtol=atol=1e-13)`` (Radau for stiff problems).

Every sidecar also gets the test bound ``check_rtol``. The test passes when, for every
sample and state, ``|y - y_ref| <= check_rtol * max(|y_ref|, check_floor)``, where
``check_floor = atol / rtol`` of the spec: the same weighting the solver's error norm uses
(atol + rtol |y| = rtol (|y| + atol/rtol)). The bound is proportional to the spec's rtol:
SciPy's solver with the same Runge-Kutta pair (RK45 for dopri5, DOP853 for dop853, RK23 for
bosh3; RK45 stands in for tsit5 and Radau for the stiff methods) is run at the spec's own
tolerances, and ``check_rtol`` is the larger of 10 x rtol and 10 x the error that run
actually makes (global error exceeds the local tolerance by a problem-dependent factor),
rounded up to 1, 2 or 5 times a power of ten.

Usage: python problems/make_references.py [stem ...]
"""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import scipy
import yaml
from scipy.integrate import solve_ivp

HERE = Path(__file__).resolve().parent
REF_RTOL = 1e-13
SCIPY_SOURCE = f"scipy {scipy.__version__} solve_ivp DOP853 rtol=atol=1e-13 (make_references.py)"
ANALOGUE = {"dopri5": "RK45", "dop853": "DOP853", "bosh3": "RK23", "tsit5": "RK45", "rodas5": "Radau"}
MARGIN = 10.0


# ---------------------------------------------------------------------------------------
# Hand-written right-hand sides: f(t, y, p) with y a 1-D array of one sample, p a dict.
# ---------------------------------------------------------------------------------------

def f_exponential(t, y, p):
    return [p["lam"] * y[0]]


def f_harmonic(t, y, p):
    return [y[1], -p["omega"] ** 2 * y[0]]


def f_sine(t, y, p):
    return [2 * y[0] / t + t**4 * np.sin(2 * t) - t**2 + 4 * t**3]


def f_vanderpol(t, y, p):
    x, v = y
    return [v, p["mu"] * (1 - x * x) * v - x]


def f_lotka(t, y, p):
    x, q = y
    return [p["a"] * x - p["b"] * x * q, -p["c"] * q + p["d"] * x * q]


def f_lorenz(t, y, p):
    x, q, z = y
    return [p["sigma"] * (q - x), x * (p["rho"] - z) - q, x * q - p["beta"] * z]


def f_brusselator(t, y, p):
    x, q = y
    return [p["A"] + x * x * q - (p["B"] + 1) * x, p["B"] * x - x * x * q]


def f_pleiades(t, y, p):
    n = 7
    x, q, u, w = y[:n], y[n:2 * n], y[2 * n:3 * n], y[3 * n:]
    ax, ay = np.zeros(n), np.zeros(n)
    for i in range(n):
        for j in range(n):
            if i != j:
                r3 = ((x[i] - x[j]) ** 2 + (q[i] - q[j]) ** 2) ** 1.5
                ax[i] += (j + 1) * (x[j] - x[i]) / r3
                ay[i] += (j + 1) * (q[j] - q[i]) / r3
    return np.concatenate([u, w, ax, ay])


def f_arenstorf(t, y, p):
    x, q, u, v = y
    mu = p["mu"]
    mup = 1 - mu
    d1 = ((x + mu) ** 2 + q**2) ** 1.5
    d2 = ((x - mup) ** 2 + q**2) ** 1.5
    return [u, v, x + 2 * v - mup * (x + mu) / d1 - mu * (x - mup) / d2, q - 2 * u - mup * q / d1 - mu * q / d2]


def f_rigid(t, y, p):
    return [y[1] * y[2], -y[0] * y[2], -p["k"] * y[0] * y[1]]


def f_rossler(t, y, p):
    x, q, z = y
    return [-q - z, x + p["a"] * q, p["b"] + z * (x - p["c"])]


def f_robertson(t, y, p):
    y1, y2, y3 = y
    return [-p["k1"] * y1 + p["k3"] * y2 * y3, p["k1"] * y1 - p["k3"] * y2 * y3 - p["k2"] * y2**2, p["k2"] * y2**2]


def f_hires(t, y, p):
    y1, y2, y3, y4, y5, y6, y7, y8 = y
    r = 280.0 * y6 * y8
    return [
        -1.71 * y1 + 0.43 * y2 + 8.32 * y3 + 0.0007,
        1.71 * y1 - 8.75 * y2,
        -10.03 * y3 + 0.43 * y4 + 0.035 * y5,
        8.32 * y2 + 1.71 * y3 - 1.12 * y4,
        -1.745 * y5 + 0.43 * y6 + 0.43 * y7,
        -r + 0.69 * y4 + 1.71 * y5 - 0.43 * y6 + 0.69 * y7,
        r - 1.81 * y7,
        -r + 1.81 * y7,
    ]


def f_orego(t, y, p):
    y1, y2, y3 = y
    return [77.27 * (y2 + y1 * (1 - 8.375e-6 * y1 - y2)), (y3 - (1 + y1) * y2) / 77.27, 0.161 * (y1 - y3)]


# ---------------------------------------------------------------------------------------
# Closed-form solutions: exact(t0, y0, t1, p) -> y(t1)
# ---------------------------------------------------------------------------------------

def exact_exponential(t0, y0, t1, p):
    return [y0[0] * math.exp(p["lam"] * (t1 - t0))]


def exact_harmonic(t0, y0, t1, p):
    w, dt = p["omega"], t1 - t0
    x0, v0 = y0
    return [x0 * math.cos(w * dt) + v0 / w * math.sin(w * dt), -x0 * w * math.sin(w * dt) + v0 * math.cos(w * dt)]


def _sine_core(t):
    c, s = math.cos(2 * t), math.sin(2 * t)
    return -t * t * c / 2 + t * s / 2 + c / 4 - t + 2 * t * t


def exact_sine(t0, y0, t1, p):
    const = y0[0] / t0**2 - _sine_core(t0)
    return [t1**2 * (_sine_core(t1) + const)]


# ---------------------------------------------------------------------------------------
# Published references (ode-anchors.md section 6, copied from the Bari / Hairer test sets)
# ---------------------------------------------------------------------------------------

PLEI_END = [
    0.3706139143970502, 3.237284092057233, -3.222559032418324, 0.6597091455775310,
    0.3425581707156584, 1.562172101400631, -0.7003092922212495,
    -3.943437585517392, -3.271380973972550, 5.225081843456543, -2.590612434977470,
    1.198213693392275, -0.2429682344935824, 1.091449240428980,
    3.417003806314313, 1.354584501625501, -2.590065597810775, 2.025053734714242,
    -1.155815100160448, -0.8072988170223021, 0.5952396354208710,
    -3.741244961234010, 0.3773459685750630, 0.9386858869551073, 0.3667922227200571,
    -0.3474046353808490, 2.344915448180937, -1.947020434263292,
]
ARENSTORF_Y0 = [0.994, 0.0, 0.0, -2.00158510637908252240537862224]
HIRES_END = [
    7.371312573325668e-4, 1.442485726316185e-4, 5.888729740967575e-5, 1.175651343283149e-3,
    2.386356198831331e-3, 6.238968252742796e-3, 2.849998395185769e-3, 2.850001604814231e-3,
]
OREGO_END = [1.000814870318523, 1228.178521549917, 132.0554942846706]
VDPOL1000_END = [1.706167732170469, -8.928097010248125e-4]


@dataclass
class Problem:
    rhs: Callable
    exact: Callable | None = None  # closed form
    published: list[float] | None = None  # one row, shared by every sample
    source: str = SCIPY_SOURCE
    stiff: bool = False
    floor: float | None = None  # overrides atol/rtol where a state is far below it
    agree: float = 1e-9  # published vs SciPy: largest relative difference accepted


PROBLEMS: dict[str, Problem] = {
    "exponential": Problem(f_exponential, exact=exact_exponential, source="analytic: y0 exp(lam (t - t0))"),
    "harmonic": Problem(
        f_harmonic, exact=exact_harmonic, source="analytic: x = cos(omega t), v = -omega sin(omega t)"
    ),
    "sine": Problem(
        f_sine, exact=exact_sine,
        source="analytic: y = t^2 (-t^2 cos 2t / 2 + t sin 2t / 2 + cos 2t / 4 - t + 2 t^2 + C), C from y(t0)",
    ),
    "vanderpol": Problem(f_vanderpol),
    "lotka-volterra": Problem(f_lotka),
    "lorenz": Problem(f_lorenz),
    "brusselator": Problem(f_brusselator),
    "pleiades": Problem(
        f_pleiades, published=PLEI_END,
        source="Bari IVP test set (Mazzia & Magherini), PLEI report plei.pdf, y(3); positions as in "
               "ode-anchors.md section 6, velocities from IVPTestSuite.jl plei.jl; agrees with "
               "scipy DOP853 rtol=atol=1e-13",
    ),
    "arenstorf": Problem(
        f_arenstorf, published=ARENSTORF_Y0,
        source="Hairer, Norsett & Wanner I, p. 129 (ode-anchors.md section 6): the orbit is periodic, "
               "y(T) = y(0); agrees with scipy DOP853 rtol=atol=1e-13",
        agree=1e-7,  # scipy at 1e-13 itself reaches only ~1e-9 on this orbit; y(T) = y0 is exact
    ),
    "rigid-body": Problem(f_rigid),
    "rossler": Problem(f_rossler),
    # Stiff: references for the stiff-solver work (not run by tests/test_problems.py yet).
    "robertson": Problem(
        f_robertson, stiff=True, floor=1e-14,
        source=f"scipy {scipy.__version__} solve_ivp Radau rtol=1e-12 atol=1e-20 (make_references.py), "
               "agrees with BDF",
    ),
    "hires": Problem(
        f_hires, published=HIRES_END, stiff=True, floor=1e-8,
        source="Bari IVP test set (Mazzia & Magherini), HIRES report, y(321.8122) (ode-anchors.md section 6); "
               "agrees with scipy Radau rtol=1e-12",
        agree=1e-6,
    ),
    "oregonator": Problem(
        f_orego, published=OREGO_END, stiff=True,
        source="Bari IVP test set (Mazzia & Magherini), OREGO report, y(360) (ode-anchors.md section 6); "
               "agrees with scipy Radau rtol=1e-12",
        agree=1e-6,
    ),
    "vanderpol-stiff": Problem(
        f_vanderpol, published=VDPOL1000_END, stiff=True, floor=1e-8,
        source="Bari IVP test set (Mazzia & Magherini), VDPOL, unscaled mu = 1000 on [0, 2000] "
               "(ode-anchors.md section 6); agrees with scipy Radau rtol=1e-12",
        agree=1e-6,
    ),
}


# ---------------------------------------------------------------------------------------
# Reading a spec (plain PyYAML; per-sample expansion as in the spec contract)
# ---------------------------------------------------------------------------------------

@dataclass
class Spec:
    path: Path
    states: list[str]
    params: list[dict[str, float]]  # one dict per sample
    y0: np.ndarray  # (batch, n)
    t0: list[float]
    t1: list[float]
    method: str
    rtol: float
    atol: float
    equations: dict[str, str] | None
    python: str | None


def _number(value, where):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SystemExit(f"{where}: expected a number, got {value!r} (write exponents as 1.0e+5)")
    return float(value)


def _expand(value, batch, where):
    if isinstance(value, list):
        values = [_number(v, where) for v in value]
        return values * batch if len(values) == 1 else values
    return [_number(value, where)] * batch


def read_spec(path: Path) -> Spec:
    data = yaml.safe_load(path.read_text())
    system = data["system"]
    states = list(system["states"])
    raw_params = system.get("params") or {}
    time = data["time"]
    lists = [v for v in [*raw_params.values(), *data["initial"].values(), time["start"], time["end"]]
             if isinstance(v, list)]
    batch = int(data.get("batch") or max([len(v) for v in lists], default=1))
    params = {k: _expand(v, batch, f"{path}: system.params.{k}") for k, v in raw_params.items()}
    y0 = np.array([_expand(data["initial"][s], batch, f"{path}: initial.{s}") for s in states]).T
    solver = data.get("solver") or {}
    return Spec(
        path=path, states=states,
        params=[{k: v[b] for k, v in params.items()} for b in range(batch)],
        y0=y0,
        t0=_expand(time["start"], batch, f"{path}: time.start"),
        t1=_expand(time["end"], batch, f"{path}: time.end"),
        method=solver.get("method", "dopri5"),
        rtol=_number(solver.get("rtol", 1e-6), f"{path}: solver.rtol"),
        atol=_number(solver.get("atol", 1e-6), f"{path}: solver.atol"),
        equations=system.get("equations"), python=system.get("python"),
    )


# ---------------------------------------------------------------------------------------
# Consistency of the hand-written RHS with the spec's own equations / Python file
# ---------------------------------------------------------------------------------------

_NP_FUNCS = {
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "tanh": np.tanh, "abs": np.abs, "min": np.minimum, "max": np.maximum, "pi": math.pi, "e": math.e,
}


def _spec_rhs(spec: Spec) -> Callable:
    if spec.python is not None:
        file, _, name = spec.python.rpartition(":")
        module_spec = importlib.util.spec_from_file_location("_reference_rhs", spec.path.parent / file)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        function = getattr(module, name)
        import torch

        def rhs(t, y, p):
            tt = torch.tensor([t], dtype=torch.float64)
            yy = torch.tensor(np.asarray(y)[None, :], dtype=torch.float64)
            pp = {k: torch.tensor([v], dtype=torch.float64) for k, v in p.items()}
            return function(tt, yy, pp)[0].numpy()

        return rhs
    # The spec texts are this repository's own files; compiled once with builtins removed.
    codes = [compile(spec.equations[s], f"{spec.path}:{s}", "eval") for s in spec.states]

    def rhs(t, y, p):
        env = {**_NP_FUNCS, **p, "t": t, **dict(zip(spec.states, y))}
        return [eval(code, {"__builtins__": {}}, env) for code in codes]  # noqa: S307

    return rhs


def check_rhs(spec: Spec, problem: Problem, rng: np.random.Generator) -> None:
    spec_rhs = _spec_rhs(spec)
    for b, p in enumerate(spec.params):
        for _ in range(5):
            y = spec.y0[b] * (1 + 0.3 * rng.standard_normal(spec.y0.shape[1])) + 0.1 * rng.standard_normal(spec.y0.shape[1])
            t = spec.t0[b] + rng.uniform(0.1, 0.9) * (spec.t1[b] - spec.t0[b])
            mine, theirs = np.asarray(problem.rhs(t, y, p), float), np.asarray(spec_rhs(t, y, p), float)
            if not np.allclose(mine, theirs, rtol=1e-12, atol=1e-12 * (1 + np.abs(mine).max())):
                raise SystemExit(f"{spec.path}: spec RHS differs from make_references.py's at y={y}: {theirs} vs {mine}")


# ---------------------------------------------------------------------------------------
# Solving
# ---------------------------------------------------------------------------------------

def integrate(problem: Problem, spec: Spec, b: int, method: str, rtol: float, atol: float) -> np.ndarray:
    p = spec.params[b]
    sol = solve_ivp(lambda t, y: problem.rhs(t, y, p), (spec.t0[b], spec.t1[b]), spec.y0[b],
                    method=method, rtol=rtol, atol=atol)
    if sol.status != 0:
        raise SystemExit(f"{spec.path}: sample {b}: solve_ivp {method} failed: {sol.message}")
    return sol.y[:, -1]


def reference(problem: Problem, spec: Spec, floor: float) -> np.ndarray:
    rows = []
    for b in range(len(spec.t0)):
        if problem.exact is not None:
            rows.append(np.asarray(problem.exact(spec.t0[b], spec.y0[b], spec.t1[b], spec.params[b]), float))
            continue
        if problem.stiff:
            computed = integrate(problem, spec, b, "Radau", 1e-12, 1e-20)
            if problem.published is None:  # cross-check Radau with a second method
                other = integrate(problem, spec, b, "BDF", 1e-12, 1e-20)
                _agree(spec, computed, other, 1e-6, floor, "Radau vs BDF")
        else:
            computed = integrate(problem, spec, b, "DOP853", REF_RTOL, REF_RTOL)
        if problem.published is not None:
            published = np.asarray(problem.published, float)
            _agree(spec, published, computed, problem.agree, floor, "published vs scipy")
            computed = published
        rows.append(computed)
    return np.array(rows)


def _agree(spec: Spec, a: np.ndarray, b: np.ndarray, tol: float, floor: float, what: str) -> None:
    rel = np.abs(a - b) / np.maximum(np.maximum(np.abs(a), floor), 1e-300)
    print(f"  {what}: max relative difference {rel.max():.2e}")
    if rel.max() > tol:
        raise SystemExit(f"{spec.path}: {what} disagree by {rel.max():.2e} (> {tol:g})")


def nice_ceil(x: float) -> float:
    """Round x up to 1, 2 or 5 times a power of ten."""
    exponent = math.floor(math.log10(x))
    for mantissa in (1, 2, 5, 10):
        if mantissa * 10.0**exponent >= x * (1 - 1e-12):
            return float(f"{mantissa}e{exponent}")
    raise AssertionError


def make(path: Path, rng: np.random.Generator) -> None:
    stem = path.name[: -len(".yaml")]
    if stem not in PROBLEMS:
        raise SystemExit(f"{path}: no entry in make_references.PROBLEMS")
    problem = PROBLEMS[stem]
    spec = read_spec(path)
    print(f"{path.relative_to(HERE.parent)}")
    check_rhs(spec, problem, rng)
    floor = problem.floor if problem.floor is not None else spec.atol / spec.rtol
    ref = reference(problem, spec, floor)
    analogue = ANALOGUE[spec.method]
    got = np.array([integrate(problem, spec, b, analogue, spec.rtol, spec.atol) for b in range(len(spec.t0))])
    observed = float((np.abs(got - ref) / np.maximum(np.abs(ref), floor)).max())
    check_rtol = nice_ceil(max(MARGIN * spec.rtol, MARGIN * observed))
    print(f"  {analogue} at rtol={spec.rtol:g}: error {observed:.2e} -> check_rtol {check_rtol:g}")
    t_end = spec.t1[0] if len(set(spec.t1)) == 1 else spec.t1
    body = {
        "source": problem.source,
        "t_end": t_end,
        "y_end": [[float(v) for v in row] for row in ref],
        "check_rtol": check_rtol,
        "check_floor": float(floor),
        "check_basis": {
            "method": f"scipy {analogue}",
            "rtol": spec.rtol,
            "atol": spec.atol,
            "observed_error": float(f"{observed:.3g}"),
            "rule": f"check_rtol = max({MARGIN:g} rtol, {MARGIN:g} observed_error) rounded up to 1/2/5e-k",
        },
    }
    text = ("# Generated by problems/make_references.py from " + path.name + "; do not edit by hand.\n"
            "# Pass: |y - y_end| <= check_rtol * max(|y_end|, check_floor) for every sample and state.\n"
            + yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=120))
    out = path.with_name(stem + ".reference.yaml")
    out.write_text(text)


def spec_files() -> list[Path]:
    files = []
    for folder in (HERE, HERE / "stiff"):
        for path in sorted(folder.glob("*.yaml")):
            if path.name.endswith(".reference.yaml") or "marmousi" in path.name.lower():
                continue
            if (yaml.safe_load(path.read_text()) or {}).get("kind") == "ode":
                files.append(path)
    return files


def main(argv: list[str]) -> None:
    rng = np.random.default_rng(0)
    for path in spec_files():
        if argv and path.name[: -len(".yaml")] not in argv:
            continue
        make(path, rng)


if __name__ == "__main__":
    main(sys.argv[1:])
