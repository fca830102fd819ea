"""C source for one explicit RK method fused with one right-hand side, each sample on its own steps.

The solver itself is a C file, ``solver_template.c``; this module writes the header it includes
(:func:`generated_header`: sizes, the method's and controller's constants, the right-hand side,
and ``rk_step`` and the dense output unrolled over the tableau) and splices it in (:func:`generate`).

The generated solver is a line-by-line transcription of the batched reference in
:mod:`odecli.ode.solver` (step size, :func:`~odecli.ode.stages.rk_step`, the controller's
``adapt``, statuses, dense output, the initial-step heuristic), with the tableau's nonzero
coefficients written into the code as constants. The sums keep the reference's order of
operations, so results agree with it to round-off and samples take the same steps as in the
batched loop (only a stiff sample whose error norm sits at 1 can flip an accept on a last-bit
difference, as the PyTorch loop itself does between batch sizes).

Why lanes: one sample's stages form a chain of dependent operations, so a solver stepping one
sample at a time waits on latency. ``LANES`` samples are stepped together, stored lane-minor,
and every per-step operation (stages, error norm, controller, statuses) is a loop over lanes
that the compiler turns into vector instructions; a lane whose sample ends takes the next one.
Lanes never mix: each lane's arithmetic is exactly the one-sample arithmetic, so results do not
depend on the number of lanes, bit for bit (tested). The controller's powers, one per lane and
attempt, come from ``libm_pow.c``: the system's ``pow`` over vector lanes, bit for bit.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Sequence

from odecli.ode import _dop853_coefficients as dop853
from odecli.ode.methods import ExplicitRK
from odecli.ode.controllers import END_SNAP, HISTORY_FLOOR
from odecli.ode.status import Status
from odecli.ode.native.c_literal import c_double

CONFIG_FIELDS = ("rtol", "atol", "safety", "factor_min", "factor_max", "dt_min", "dt_max",
                 "pcoeff", "icoeff", "dcoeff")
"""Order of the doubles in the ``cfg`` array the solver reads at run time."""
INT_STATS = ("status", "n_steps", "n_accepted", "n_rejected", "n_f_evals")
FLOAT_STATS = ("dt0", "dt_final", "t_final")
_STATUSES = (Status.SUCCESS, Status.REACHED_DT_MIN, Status.REACHED_MAX_STEPS, Status.INFINITE_NORM, Status.EVENT)
SOLVER_FLAGS = ("-fno-trapping-math",)
"""Compiler flags of every generated solver: GCC may then compute both sides of a choice, so the
controller's lane loops vectorise. No result changes (odecli never reads floating-point
exception flags)."""
_HERE = Path(__file__).parent
LANES = 8
"""Samples stepped together. Two AVX2 vectors of doubles per operation: at 4 lanes the stages'
latency still shows, beyond 8 the lanes' state outgrows the registers and L1. Measured by
``benchmarks/native_lanes_bench.py`` (2026-12-01, AVX2 VM, B = 4096, one thread), ns per attempted
step and sample at 1/4/8/12/16 lanes: VdP 144/64/54/50/50, Lotka-Volterra 168/63/54/58/59."""


@functools.lru_cache(maxsize=1)
def _pow_lanes_c() -> str:
    """``pow_lanes``: the controller's powers over all lanes, equal to libm's ``pow`` bit for bit."""
    return _spliced(_HERE.joinpath("libm_pow.c").read_text(), {})


def equations_c(equations: Sequence[str]) -> str:
    """``rhs`` (one sample) and ``rhs_lanes`` (W lanes) for one C expression per state.

    Every right-hand side kind provides these two functions, with ``w`` the weights all samples
    share and ``keep`` (NH values per evaluation) what its pullback reads back instead of
    computing it again (both unused here: expressions read per-sample parameters ``p[j]`` only,
    and their pullback needs nothing kept).
    """
    body = "\n".join(f"    dy[{i}] = {text};" for i, text in enumerate(equations))
    lane_body = "\n".join(f"        DY[{i}][l] = {text};" for i, text in enumerate(equations))
    return f"""\
/* One sample's right-hand side (start of a sample, initial step, dense-output stages). */
static inline void rhs(double t, const double *restrict y, const double *restrict p, const double *restrict w,
                       double *restrict dy, double *restrict keep)
{{
    (void)t; (void)y; (void)p; (void)w; (void)keep;
{body}
}}

/* The right-hand side of all W lanes at once: the loop over lanes is what the compiler vectorises. */
static inline void rhs_lanes(const double *restrict tl, double Y[restrict N][W], double P[restrict NP][W],
                             const double *restrict w, double DY[restrict N][W], double KEEP[restrict NH][W])
{{
    (void)w; (void)KEEP;
    for (int l = 0; l < W; l++) {{
        double y[N], p[NP];
        const double t = tl[l];
        for (int k = 0; k < N; k++) y[k] = Y[k][l];
        for (int j = 0; j < NP; j++) p[j] = P[j][l];
        (void)t; (void)y; (void)p;
{lane_body}
    }}
}}
"""


def events_c(expressions: Sequence[str], directions: Sequence[int], terminal: Sequence[int]) -> str:
    """``NE``, ``EV_DIR``, ``EV_TERM`` and ``events_g`` (every event function of one sample) for
    ``solver_events.c``; empty without events. Expressions are C text over ``t``, ``y[i]``, ``p[j]``
    as the equations are."""
    if not expressions:
        return ""
    body = "\n".join(f"    g[{e}] = {text};" for e, text in enumerate(expressions))
    return f"""\
#define NE {len(expressions)}
static const int EV_DIR[NE] = {{{", ".join(str(int(d)) for d in directions)}}};
static const int64_t EV_TERM[NE] = {{{", ".join(str(int(n)) for n in terminal)}}};

/* Every event function of one sample at (t, y). */
static inline void events_g(double t, const double *restrict y, const double *restrict p, const double *restrict w,
                            double *restrict g)
{{
    (void)t; (void)y; (void)p; (void)w;
{body}
}}
"""


def weighted(weights: Sequence[float], k_rows: Sequence[int], ref: str = "K[{r}][k][l]") -> str | None:
    """``w0*K[r0][k][l] + w1*K[r1][k][l] + ...`` over the nonzero weights, left to right (as weighted_sum)."""
    terms = [f"{c_double(w)} * {ref.format(r=r)}" for w, r in zip(weights, k_rows) if w != 0.0]
    return " + ".join(terms) if terms else None


def _lanes(body: str) -> str:
    """``body`` once per lane: the loop shape GCC vectorises."""
    return f"for (int l = 0; l < W; l++) {body}"


def _rk_step(method: ExplicitRK, keep_stages: bool) -> str:
    """rk_step on every lane: stages, y1, K[S] = f(t + h, y1) and the error norm (0 for fixed steps).

    With ``keep_stages`` each evaluation's kept values go to the row of its stage, else all
    share row 0 (nothing reads them after the stage)."""
    lines = ["ODECLI_NOINLINE  /* inlined into the lane loop, GCC 12 stops vectorising it */",
             "static void rk_step(const double *restrict t, double y[restrict N][W], const double *restrict h,",
             "                    double P[restrict NP][W], const double *restrict w, double K[restrict NK][N][W],",
             "                    double keep[restrict KEPT_ROWS][NH][W], double y1[restrict N][W],",
             "                    double *restrict err, double rtol, double atol)",
             "{", "    double tmp[N][W], ts[W];", "    (void)rtol; (void)atol; (void)tmp;"]
    for i in range(1, method.n_stages):
        total = weighted(method.a[i], range(i))
        combo = f"y[k][l] + h[l] * ({total})" if total else "y[k][l]"
        lines.append("    " + _lanes(f"ts[l] = t[l] + {c_double(method.c[i])} * h[l];"))
        lines.append("    for (int k = 0; k < N; k++) " + _lanes(f"tmp[k][l] = {combo};"))
        lines.append(f"    rhs_lanes(ts, tmp, P, w, K[{i}], keep[{i if keep_stages else 0}]);")
    total = weighted(method.b, range(method.n_stages))
    combo = f"y[k][l] + h[l] * ({total})" if total else "y[k][l]"
    lines.append("    for (int k = 0; k < N; k++) " + _lanes(f"y1[k][l] = {combo};"))
    lines.append("    " + _lanes("ts[l] = t[l] + h[l];"))
    lines.append(f"    rhs_lanes(ts, y1, P, w, K[S], keep[{'S' if keep_stages else 0}]);")
    k_rows = range(method.n_stages + 1)
    if not method.adaptive:
        lines.append("    " + _lanes("err[l] = 0.0;"))
    elif method.name == "dop853":
        lines += [
            "    double err5[W] = {0}, err3[W] = {0};",
            "    for (int k = 0; k < N; k++) {",
            "        " + _lanes("{"),
            "            double scale = atol + rtol * odecli_fmax(fabs(y[k][l]), fabs(y1[k][l]));",
            f"            double e5 = ({weighted(dop853.E5, k_rows)}) / scale;",
            f"            double e3 = ({weighted(dop853.E3, k_rows)}) / scale;",
            "            err5[l] += e5 * e5;",
            "            err3[l] += e3 * e3;",
            "        }",
            "    }",
            "    " + _lanes("{"),
            "        double denom = sqrt((err5[l] + 0.01 * err3[l]) * N);",
            "        double norm = fabs(h[l]) * err5[l] / (denom > 0 ? denom : 1.0);",
            "        err[l] = denom == 0 ? 0.0 : norm;",
            "    }",
        ]
    else:
        lines += [
            "    double acc[W] = {0};",
            "    for (int k = 0; k < N; k++) {",
            "        " + _lanes("{"),
            f"            double e = h[l] * ({weighted(method.e, k_rows)});",
            "            double scale = atol + rtol * odecli_fmax(fabs(y[k][l]), fabs(y1[k][l]));",
            "            double r = e / scale;",
            "            acc[l] += r * r;",
            "        }",
            "    }",
            "    " + _lanes("err[l] = sqrt(acc[l] / N);"),
        ]
    lines.append("}")
    return "\n".join(lines)


def _dense(method: ExplicitRK) -> str:
    """dense_prepare (extra stages of lane l; returns their RHS evaluations) and dense_eval at one theta."""
    s = method.n_stages
    prepare = ["static int dense_prepare(int l, double t, double y[restrict N][W], double y1[restrict N][W], double h,",
               "                         double P[restrict NP][W], const double *restrict w,",
               "                         double K[restrict NK][N][W])",
               "{", "    (void)l; (void)t; (void)y; (void)y1; (void)h; (void)P; (void)w; (void)K;"]
    evaluate = ["static void dense_eval(int l, double th, double y[restrict N][W], double y1[restrict N][W], double h,",
                "                       double K[restrict NK][N][W], double *restrict out)",
                "{", "    (void)y1;"]
    if method.interpolant == "polynomial":
        assert method.p is not None
        degree = len(method.p[0])
        prepare.append("    return 0;")
        evaluate.append("    for (int k = 0; k < N; k++) {")
        for j in range(degree):
            total = weighted([row[j] for row in method.p], range(len(method.p)))
            evaluate.append(f"        double q{j} = {total or '0.0'};")
        horner = f"q{degree - 1}"
        for j in reversed(range(degree - 1)):
            horner = f"q{j} + th * ({horner})"
        evaluate.append(f"        double acc = {horner};")
        evaluate.append("        out[k] = y[k][l] + h * th * acc;")
        evaluate.append("    }")
    elif method.interpolant == "dop853":
        n_k = s + 1
        rows = ["    double tmp[N], dy[N], p[NP], unused[NH];", "    for (int j = 0; j < NP; j++) p[j] = P[j][l];"]
        for a_row, c in zip(dop853.A_EXTRA, dop853.C_EXTRA):
            total = weighted(a_row[:n_k], range(n_k))
            rows.append(f"    for (int k = 0; k < N; k++) tmp[k] = y[k][l] + h * ({total});")
            rows.append(f"    rhs(t + {c_double(c)} * h, tmp, p, w, dy, unused);")
            rows.append(f"    for (int k = 0; k < N; k++) K[{n_k}][k][l] = dy[k];")
            n_k += 1
        prepare = prepare + rows + [f"    return {len(dop853.C_EXTRA)};"]
        f1 = dop853.N_STAGES
        evaluate.append("    for (int k = 0; k < N; k++) {")
        evaluate.append("        double delta = y1[k][l] - y[k][l];")
        terms = ["delta", "h * K[0][k][l] - delta", f"2 * delta - h * (K[{f1}][k][l] + K[0][k][l])"]
        terms += [f"h * ({weighted(row, range(n_k)) or '0.0'})" for row in dop853.D]
        evaluate.append("        double acc = 0.0;")
        for i, term in enumerate(reversed(terms)):
            factor = "th" if i % 2 == 0 else "(1 - th)"
            evaluate.append(f"        acc = (acc + ({term})) * {factor};")
        evaluate.append("        out[k] = y[k][l] + acc;")
        evaluate.append("    }")
    else:  # cubic Hermite through (y0, f0) and (y1, f1)
        prepare.append("    return 0;")
        evaluate += [
            "    for (int k = 0; k < N; k++) {",
            "        double dy = y1[k][l] - y[k][l];",
            "        double bracket = (1 - 2 * th) * dy + (th - 1) * h * K[0][k][l] + th * h * K[S][k][l];",
            "        out[k] = (1 - th) * y[k][l] + th * y1[k][l] + th * (th - 1) * bracket;",
            "    }",
        ]
    return "\n".join(prepare + ["}"] + evaluate + ["}"])


SOLVER_TEMPLATE = _HERE / "solver_template.c"
"""The fixed part of every generated solver; it includes :data:`GENERATED_HEADER` and :data:`RECORDER_HEADER`."""
GENERATED_HEADER = "solver_generated.h"
"""What :func:`generated_header` writes: sizes, constants, statuses and the generated functions."""
RECORDER_HEADER = "solver_recorder.h"
"""The recorder of accepted steps :func:`generate` splices in (default: ``solver_recorder_none.h``)."""
_INCLUDE = re.compile(r'^#include "([^"]+)".*$', re.MULTILINE)


def generated_header(method: ExplicitRK, rhs_c: str, n_states: int, n_params: int, lanes: int = LANES,
                     n_keep: int = 0, keep_stages: bool = False) -> str:
    """``solver_generated.h`` for ``method`` and a right-hand side's C functions ``rhs_c`` (see :func:`generate`)."""
    n_k = method.n_stages + 1 + (len(dop853.C_EXTRA) if method.interpolant == "dop853" else 0)
    error_order = method.error_order or method.order
    defines = "\n".join([
        f"#define ADAPTIVE {int(method.adaptive)}",
        f"#define ERROR_ORDER {error_order}",
        f"#define INV_K_INITIAL {c_double(1.0 / (error_order + 1))}",
        f"#define END_SNAP {c_double(END_SNAP)}",
        f"#define HISTORY_FLOOR {c_double(HISTORY_FLOOR)}",
        "enum { " + ", ".join(f"{s.name} = {int(s)}" for s in _STATUSES) + " };",
    ])
    sizes = "\n".join([
        f"#define N {n_states}", f"#define S {method.n_stages}", f"#define NK {n_k}",
        f"#define NP {max(1, n_params)}", f"#define W {lanes}", f"#define NH {max(1, n_keep)}",
        f"#define KEPT_ROWS {n_k if keep_stages else 1}",
    ])
    return "\n\n".join([
        f"/* odecli: {method.name} fused with a generated right-hand side (odecli.ode.native.codegen). */",
        defines, sizes, rhs_c, _rk_step(method, keep_stages), _dense(method),
    ])


def generate(method: ExplicitRK, rhs_c: str, n_states: int, n_params: int, lanes: int = LANES,
             recorder: str | None = None, n_keep: int = 0, keep_stages: bool = False) -> str:
    """The complete C source for ``method`` and a right-hand side's C functions ``rhs_c``:
    :data:`SOLVER_TEMPLATE` with its quoted includes spliced in as text.

    ``rhs_c`` defines ``rhs`` and ``rhs_lanes`` as :func:`equations_c` does (with ``n_states``
    states, ``n_params`` per-sample parameters and ``n_keep`` values kept per evaluation for the
    pullback; the MLP kind is :func:`odecli.ode.native.mlp.mlp_c`). ``lanes`` samples are
    stepped together; any number gives the same results bit for bit. ``recorder`` defines the
    ``Recorder`` type and the ``record_start``/``record_step``/``record_finish`` calls the
    solver makes for each lane (start of a sample, an accepted step after its dense output, end
    of a sample); None records nothing. ``keep_stages``: the lanes hold every stage's kept
    values until the step is recorded (``keep[0..S]``, the stage-0 row carried over from the
    last step's K[S]).
    """
    header = generated_header(method, rhs_c, n_states, n_params, lanes, n_keep, keep_stages)
    recorder = _HERE.joinpath("solver_recorder_none.h").read_text() if recorder is None else recorder
    return _spliced(_template_text(), {GENERATED_HEADER: header, RECORDER_HEADER: recorder})


@functools.lru_cache(maxsize=1)
def _template_text() -> str:
    return SOLVER_TEMPLATE.read_text()


def _spliced(text: str, generated: dict[str, str]) -> str:
    """``text`` with every ``#include "name"`` line replaced by ``generated[name]`` or that file of this folder."""
    def body(match: re.Match) -> str:
        name = match.group(1)
        return generated[name] if name in generated else _spliced(_HERE.joinpath(name).read_text(), generated)

    return _INCLUDE.sub(body, text)
