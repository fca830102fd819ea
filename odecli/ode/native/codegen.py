"""C source for one explicit RK method fused with one right-hand side, solving each sample alone.

The generated solver is a line-by-line transcription of the batched reference in
:mod:`odecli.ode.solver` (step size, :func:`~odecli.ode.stages.rk_step`, the controller's
``adapt``, statuses, dense output, the initial-step heuristic) for a single sample, with the
tableau's nonzero coefficients written into the code as constants. The sums keep the
reference's order of operations, so results agree with it to round-off and samples take the
same steps as in the batched loop (only a stiff sample whose error norm sits at 1 can flip an
accept on a last-bit difference, as the PyTorch loop itself does between batch sizes).
"""

from __future__ import annotations

from typing import Sequence

from odecli.ode import _dop853_coefficients as dop853
from odecli.ode.methods import ExplicitRK
from odecli.ode.solver import END_SNAP, INFINITE_NORM, REACHED_DT_MIN, REACHED_MAX_STEPS, SUCCESS
from odecli.ode.controllers import HISTORY_FLOOR
from odecli.spec.expr import c_double

CONFIG_FIELDS = ("rtol", "atol", "safety", "factor_min", "factor_max", "dt_min", "dt_max",
                 "pcoeff", "icoeff", "dcoeff")
"""Order of the doubles in the ``cfg`` array the solver reads at run time."""
INT_STATS = ("status", "n_steps", "n_accepted", "n_rejected", "n_f_evals")
FLOAT_STATS = ("dt0", "dt_final", "t_final")

_HEADER = """\
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <float.h>

#define N {n_states}
#define S {n_stages}
#define NK {n_k}

static inline double odecli_sq(double a) {{ return a * a; }}
/* torch.minimum / torch.maximum: a NaN in either argument gives NaN. */
static inline double odecli_fmin(double a, double b) {{ return (a != a || b != b) ? NAN : (a < b ? a : b); }}
static inline double odecli_fmax(double a, double b) {{ return (a != a || b != b) ? NAN : (a > b ? a : b); }}
/* torch.clamp(x, min=lo): NaN stays NaN. */
static inline double clamp_min(double x, double lo) {{ return x < lo ? lo : x; }}
static inline double clamp_max(double x, double hi) {{ return x > hi ? hi : x; }}
/* pow(x, 0) is 1 for every x (NaN included), so the integral controller's zero exponents cost nothing. */
static inline double power_or_one(double x, double e) {{ return e == 0.0 ? 1.0 : pow(x, e); }}

static inline void rhs(double t, const double *restrict y, const double *restrict p, double *restrict dy)
{{
    (void)t; (void)y; (void)p;
{equations}
}}
"""


def weighted(weights: Sequence[float], k_rows: Sequence[int], index: str = "k") -> str | None:
    """``w0*K[r0][k] + w1*K[r1][k] + ...`` over the nonzero weights, left to right (as weighted_sum)."""
    terms = [f"{c_double(w)} * K[{r}][{index}]" for w, r in zip(weights, k_rows) if w != 0.0]
    return " + ".join(terms) if terms else None


def _rk_step(method: ExplicitRK) -> str:
    """rk_step: stages, y1, K[S] = f(t + h, y1) and the error norm (0 for fixed-step methods)."""
    lines = ["static double rk_step(double t, const double *restrict y, double h, const double *restrict p,",
             "                      double K[NK][N], double *restrict y1, double rtol, double atol)",
             "{", "    double tmp[N];", "    (void)rtol; (void)atol; (void)tmp;"]
    for i in range(1, method.n_stages):
        total = weighted(method.a[i], range(i))
        combo = f"y[k] + h * ({total})" if total else "y[k]"
        lines.append(f"    for (int k = 0; k < N; k++) tmp[k] = {combo};")
        lines.append(f"    rhs(t + {c_double(method.c[i])} * h, tmp, p, K[{i}]);")
    total = weighted(method.b, range(method.n_stages))
    lines.append(f"    for (int k = 0; k < N; k++) y1[k] = {f'y[k] + h * ({total})' if total else 'y[k]'};")
    lines.append("    rhs(t + h, y1, p, K[S]);")
    k_rows = range(method.n_stages + 1)
    if not method.adaptive:
        lines.append("    return 0.0;")
    elif method.name == "dop853":
        lines += [
            "    double err5 = 0.0, err3 = 0.0;",
            "    for (int k = 0; k < N; k++) {",
            "        double scale = atol + rtol * odecli_fmax(fabs(y[k]), fabs(y1[k]));",
            f"        double e5 = ({weighted(dop853.E5, k_rows)}) / scale;",
            f"        double e3 = ({weighted(dop853.E3, k_rows)}) / scale;",
            "        err5 += e5 * e5;",
            "        err3 += e3 * e3;",
            "    }",
            "    double denom = sqrt((err5 + 0.01 * err3) * N);",
            "    double norm = fabs(h) * err5 / (denom > 0 ? denom : 1.0);",
            "    return denom == 0 ? 0.0 : norm;",
        ]
    else:
        lines += [
            "    double acc = 0.0;",
            "    for (int k = 0; k < N; k++) {",
            f"        double err = h * ({weighted(method.e, k_rows)});",
            "        double scale = atol + rtol * odecli_fmax(fabs(y[k]), fabs(y1[k]));",
            "        double r = err / scale;",
            "        acc += r * r;",
            "    }",
            "    return sqrt(acc / N);",
        ]
    lines.append("}")
    return "\n".join(lines)


def _dense(method: ExplicitRK) -> str:
    """dense_prepare (extra stages; returns their RHS evaluations) and dense_eval at one theta."""
    s = method.n_stages
    prepare = ["static int dense_prepare(double t, const double *restrict y, const double *restrict y1, double h,",
               "                         const double *restrict p, double K[NK][N])",
               "{", "    (void)t; (void)y; (void)y1; (void)h; (void)p; (void)K;"]
    evaluate = ["static void dense_eval(double th, const double *restrict y, const double *restrict y1, double h,",
                "                       double K[NK][N], double *restrict out)",
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
        evaluate.append("        out[k] = y[k] + h * th * acc;")
        evaluate.append("    }")
    elif method.interpolant == "dop853":
        n_k = s + 1
        tmp_rows = []
        for a_row, c in zip(dop853.A_EXTRA, dop853.C_EXTRA):
            total = weighted(a_row[:n_k], range(n_k))
            tmp_rows.append(f"    for (int k = 0; k < N; k++) tmp[k] = y[k] + h * ({total});")
            tmp_rows.append(f"    rhs(t + {c_double(c)} * h, tmp, p, K[{n_k}]);")
            n_k += 1
        prepare = prepare[:3] + ["    double tmp[N];"] + tmp_rows + [f"    return {len(dop853.C_EXTRA)};"]
        f1 = dop853.N_STAGES
        evaluate.append("    for (int k = 0; k < N; k++) {")
        evaluate.append("        double delta = y1[k] - y[k];")
        terms = ["delta", "h * K[0][k] - delta", f"2 * delta - h * (K[{f1}][k] + K[0][k])"]
        terms += [f"h * ({weighted(row, range(n_k)) or '0.0'})" for row in dop853.D]
        evaluate.append("        double acc = 0.0;")
        for i, term in enumerate(reversed(terms)):
            factor = "th" if i % 2 == 0 else "(1 - th)"
            evaluate.append(f"        acc = (acc + ({term})) * {factor};")
        evaluate.append("        out[k] = y[k] + acc;")
        evaluate.append("    }")
    else:  # cubic Hermite through (y0, f0) and (y1, f1)
        prepare.append("    return 0;")
        evaluate += [
            "    for (int k = 0; k < N; k++) {",
            "        double dy = y1[k] - y[k];",
            "        double bracket = (1 - 2 * th) * dy + (th - 1) * h * K[0][k] + th * h * K[S][k];",
            "        out[k] = (1 - th) * y[k] + th * y1[k] + th * (th - 1) * bracket;",
            "    }",
        ]
    return "\n".join(prepare + ["}"] + evaluate + ["}"])


_SOLVER = """\
/* Hairer-Norsett-Wanner initial step (odecli.ode.initial_step), for one sample. */
static double initial_step(double t0, const double *restrict y0, const double *restrict f0, double dir,
                           const double *restrict p, double rtol, double atol)
{
    double y1[N], f1[N], s0 = 0.0, s1 = 0.0, s2 = 0.0;
    for (int k = 0; k < N; k++) {
        double scale = atol + rtol * fabs(y0[k]);
        s0 += odecli_sq(y0[k] / scale);
        s1 += odecli_sq(f0[k] / scale);
    }
    double d0 = sqrt(s0 / N), d1 = sqrt(s1 / N);
    int small = d0 < 1e-5 || d1 < 1e-5;
    double h0 = small ? 1e-6 : 0.01 * d0 / d1;
    for (int k = 0; k < N; k++) y1[k] = y0[k] + (dir * h0) * f0[k];
    rhs(t0 + dir * h0, y1, p, f1);
    for (int k = 0; k < N; k++) {
        double scale = atol + rtol * fabs(y0[k]);
        s2 += odecli_sq((f1[k] - f0[k]) / scale);
    }
    double d2 = sqrt(s2 / N) / h0;
    double dmax = odecli_fmax(d1, d2);
    double h1 = dmax <= 1e-15 ? clamp_min(h0 * 1e-3, 1e-6) : pow(0.01 / dmax, INV_K_INITIAL);
    double h = odecli_fmin(100 * h0, h1);
    return (isnan(h) || h == INFINITY) ? 1e-6 : h;
}

static void solve_one(const double *restrict y0, double t0, double t1, const double *restrict grid,
                      int64_t n_eval, const double *restrict p, double dt0, int auto_dt0,
                      const double *restrict cfg, int64_t max_steps, double *restrict yout,
                      int64_t *restrict istat, double *restrict fstat, double *restrict yfinal)
{
    const double rtol = cfg[0], atol = cfg[1], safety = cfg[2], factor_min = cfg[3], factor_max = cfg[4];
    const double dt_min = cfg[5], dt_max = cfg[6];
    const double k_ctrl = ERROR_ORDER + 1.0;
    const double beta1 = (cfg[7] + cfg[8] + cfg[9]) / k_ctrl, beta2 = -(cfg[7] + 2.0 * cfg[9]) / k_ctrl;
    const double beta3 = cfg[9] / k_ctrl, inv_k = 1.0 / k_ctrl;
    (void)safety; (void)factor_min; (void)factor_max; (void)beta1; (void)beta2; (void)beta3; (void)inv_k;
    const double dir = t1 >= t0 ? 1.0 : -1.0;
    double y[N], f0[N], y1[N], K[NK][N];
    memcpy(y, y0, sizeof y);
    rhs(t0, y, p, f0);
    int64_t n_f_evals = 1, n_steps = 0, n_accepted = 0, n_rejected = 0, status = SUCCESS;
    double h_abs;
    if (auto_dt0) {
        h_abs = initial_step(t0, y, f0, dir, p, rtol, atol);
        n_f_evals += 1;
    } else {
        h_abs = fabs(dt0);
    }
    h_abs = clamp_max(odecli_fmin(h_abs, fabs(t1 - t0)), dt_max);
    fstat[0] = h_abs;
    double h = dir * h_abs, t = t0;
    int64_t ptr = 0, n_interior = 0;
    while (ptr < n_eval && grid[ptr] * dir <= dir * t0) {
        memcpy(yout + ptr * N, y, sizeof y);
        ptr++;
    }
    for (int64_t j = 0; j < n_eval; j++) n_interior += grid[j] * dir < dir * t1;
    double err_prev = 1.0, err_prev2 = 1.0;
    int rejected_last = 0, active = t1 != t0;
    while (active) {
        double remaining = fabs(t1 - t);
        int last = fabs(h) * (1 + END_SNAP) >= remaining;
        double hs = dir * odecli_fmin(fabs(h), remaining);
        memcpy(K[0], f0, sizeof f0);
        double err = rk_step(t, y, hs, p, K, y1, rtol, atol);
        n_steps++;
        int accept, finite;
        double factor;
#if ADAPTIVE
        finite = isfinite(err);
        {
            int ok = err <= 1.0;
            double inv = 1.0 / clamp_min(err, DBL_MIN);
            if (ok) {  /* only the branch the reference's torch.where keeps is computed */
                double grow = safety * pow(inv, beta1) * power_or_one(1.0 / err_prev, beta2)
                              * power_or_one(1.0 / err_prev2, beta3);
                factor = odecli_fmin(clamp_min(grow, factor_min), rejected_last ? 1.0 : factor_max);
            } else {
                factor = clamp_max(clamp_min(safety * pow(inv, inv_k), factor_min), safety);
            }
            if (isnan(factor)) factor = factor_min;
            if (ok) {
                err_prev2 = err_prev;
                err_prev = clamp_min(err, HISTORY_FLOOR);
            }
            rejected_last = !ok;
            accept = ok && finite;
        }
#else
        finite = 1;
        for (int k = 0; k < N; k++) finite = finite && isfinite(y1[k]);
        accept = finite;
        factor = 1.0;
#endif
        double t_new = last ? t1 : t + hs;
        int done = accept && last;
        double h_next = done ? h : odecli_fmin(fabs(hs * factor), dt_max) * dir;
        if (!finite) status = INFINITE_NORM;
        int running = !done && status == SUCCESS;
        double t_after = accept ? t_new : t;
        int too_small = fabs(h_next) < dt_min || t_after + h_next == t_after;
        if (running && too_small) status = REACHED_DT_MIN;
        if (running && n_steps >= max_steps && status == SUCCESS) status = REACHED_MAX_STEPS;
        n_f_evals += S;
        if (accept) {
            int prepared = 0;
            while (ptr < n_interior && grid[ptr] * dir <= dir * t_new) {
                double t_at = grid[ptr] * dir * dir;
                if (t_at == t_new) {
                    memcpy(yout + ptr * N, y1, sizeof y1);
                } else {
                    if (!prepared) {
                        n_f_evals += dense_prepare(t, y, y1, hs, p, K);
                        prepared = 1;
                    }
                    dense_eval((t_at - t) / (hs == 0 ? 1.0 : hs), y, y1, hs, K, yout + ptr * N);
                }
                ptr++;
            }
            t = t_after;
            memcpy(y, y1, sizeof y);
            memcpy(f0, K[S], sizeof f0);
            n_accepted++;
        } else {
            n_rejected++;
        }
        h = h_next;
        active = !done && status == SUCCESS;
    }
    if (status == SUCCESS)
        for (int64_t j = 0; j < n_eval; j++)
            if (grid[j] == t1) memcpy(yout + j * N, y, sizeof y);
    istat[0] = status; istat[1] = n_steps; istat[2] = n_accepted; istat[3] = n_rejected; istat[4] = n_f_evals;
    fstat[1] = fabs(h);
    fstat[2] = t;
    memcpy(yfinal, y, sizeof y);
}

/* Samples [i0, i1) of the batch; every array is row-major with the batch first. */
void solve_samples(int64_t i0, int64_t i1, int64_t n_eval, int64_t n_params,
                   const double *y0, const double *t0, const double *t1, const double *grid,
                   const double *params, const double *dt0, int64_t auto_dt0, const double *cfg,
                   int64_t max_steps, double *yout, int64_t *istat, double *fstat, double *yfinal)
{
    for (int64_t i = i0; i < i1; i++)
        solve_one(y0 + i * N, t0[i], t1[i], grid + i * n_eval, n_eval, params + i * n_params,
                  auto_dt0 ? 0.0 : dt0[i], (int)auto_dt0, cfg, max_steps, yout + i * n_eval * N,
                  istat + i * 5, fstat + i * 3, yfinal + i * N);
}
"""


def generate(method: ExplicitRK, equations: Sequence[str]) -> str:
    """The complete C file for ``method`` and the C right-hand side ``equations`` (one per state).

    Each equation is a C expression over ``t``, ``y[i]`` and ``p[j]``
    (:func:`odecli.spec.expr.expression_to_c` produces them from spec text).
    """
    n_k = method.n_stages + 1 + (len(dop853.C_EXTRA) if method.interpolant == "dop853" else 0)
    body = "\n".join(f"    dy[{i}] = {text};" for i, text in enumerate(equations))
    error_order = method.error_order or method.order
    defines = "\n".join([
        f"#define ADAPTIVE {int(method.adaptive)}",
        f"#define ERROR_ORDER {error_order}",
        f"#define INV_K_INITIAL {c_double(1.0 / (error_order + 1))}",
        f"#define END_SNAP {c_double(END_SNAP)}",
        f"#define HISTORY_FLOOR {c_double(HISTORY_FLOOR)}",
        f"enum {{ SUCCESS = {SUCCESS}, REACHED_DT_MIN = {REACHED_DT_MIN}, "
        f"REACHED_MAX_STEPS = {REACHED_MAX_STEPS}, INFINITE_NORM = {INFINITE_NORM} }};",
    ])
    return "\n\n".join([
        f"/* odecli: {method.name} fused with a generated right-hand side. */",
        _HEADER.format(n_states=len(equations), n_stages=method.n_stages, n_k=n_k, equations=body),
        defines, _rk_step(method), _dense(method), _SOLVER,
    ])
