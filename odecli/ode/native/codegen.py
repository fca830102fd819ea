"""C source for one explicit RK method fused with one right-hand side, each sample on its own steps.

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
_STATUSES = (Status.SUCCESS, Status.REACHED_DT_MIN, Status.REACHED_MAX_STEPS, Status.INFINITE_NORM)
SOLVER_FLAGS = ("-fno-trapping-math",)
"""Compiler flags of every generated solver: GCC may then compute both sides of a choice, so the
controller's lane loops vectorise. No result changes (odecli never reads floating-point
exception flags)."""
LANES = 8
"""Samples stepped together. Two AVX2 vectors of doubles per operation: at 4 lanes the stages'
latency still shows, beyond 8 the lanes' state outgrows the registers and L1 (measured)."""

_HEADER = """\
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <float.h>

#define N {n_states}
#define S {n_stages}
#define NK {n_k}
#define NP {n_params}
#define W {lanes}
#define NH {n_keep}
#define KEPT_ROWS {kept_rows}

static inline double odecli_sq(double a) {{ return a * a; }}
/* torch.minimum / torch.maximum: a NaN in either argument gives NaN. */
static inline double odecli_fmin(double a, double b) {{ return ((a != a) | (b != b)) ? NAN : (a < b ? a : b); }}
static inline double odecli_fmax(double a, double b) {{ return ((a != a) | (b != b)) ? NAN : (a > b ? a : b); }}
/* torch.clamp(x, min=lo): NaN stays NaN. */
static inline double clamp_min(double x, double lo) {{ return x < lo ? lo : x; }}
static inline double clamp_max(double x, double hi) {{ return x > hi ? hi : x; }}
"""


@functools.lru_cache(maxsize=1)
def _pow_lanes_c() -> str:
    """``pow_lanes``: the controller's powers over all lanes, equal to libm's ``pow`` bit for bit."""
    here = Path(__file__).with_name
    include = '#include "libm_pow_tables.h"'
    source = here("libm_pow.c").read_text()
    assert include in source
    return source.replace(include, here("libm_pow_tables.h").read_text())


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
    lines = ["__attribute__((noinline))  /* inlined into the lane loop, GCC 12 stops vectorising it */",
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


_SOLVER = """\
/* Hairer-Norsett-Wanner initial step (odecli.ode.initial_step), for one sample. */
static double initial_step(double t0, const double *restrict y0, const double *restrict f0, double dir,
                           const double *restrict p, const double *restrict w, double rtol, double atol)
{
    double y1[N], f1[N], unused[NH], s0 = 0.0, s1 = 0.0, s2 = 0.0;
    for (int k = 0; k < N; k++) {
        double scale = atol + rtol * fabs(y0[k]);
        s0 += odecli_sq(y0[k] / scale);
        s1 += odecli_sq(f0[k] / scale);
    }
    double d0 = sqrt(s0 / N), d1 = sqrt(s1 / N);
    int small = d0 < 1e-5 || d1 < 1e-5;
    double h0 = small ? 1e-6 : 0.01 * d0 / d1;
    for (int k = 0; k < N; k++) y1[k] = y0[k] + (dir * h0) * f0[k];
    rhs(t0 + dir * h0, y1, p, w, f1, unused);
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

/* The batch's inputs and outputs (row-major, batch first) and the controller's constants. */
typedef struct {
    const double *y0, *t0, *t1, *grid, *params, *dt0, *shared;
    int64_t n_eval, n_params, auto_dt0, max_steps;
    double *yout, *fstat, *yfinal;
    int64_t *istat;
    double rtol, atol, safety, factor_min, factor_max, dt_min, dt_max, beta1, beta2, beta3, inv_k;
} Job;

/* W samples in flight, one per lane, stored lane-minor so that every per-step operation is one
 * vector loop over lanes (as the batched reference computes with torch.where). A lane whose
 * sample ends takes the next sample of the block, so lanes never wait for each other and every
 * sample takes exactly the steps it takes alone. Lanes without a sample compute unread values. */
typedef struct {
    double y[N][W], y1[N][W], K[NK][N][W], keep[KEPT_ROWS][NH][W], P[NP][W];
    double t[W], h[W], hs[W], err[W], t1[W], dir[W], err_prev[W], err_prev2[W], t_new[W];
    int64_t last[W], accept[W], rejected_last[W], running[W], status[W];
    int64_t n_steps[W], n_accepted[W], n_rejected[W], n_f_evals[W];
    int64_t sample[W], ptr[W], n_interior[W];
} Lanes;

/* Store lane l's statistics and final state into its sample's rows. */
static void finish(Lanes *restrict L, int l, const Job *restrict job)
{
    const int64_t i = L->sample[l];
    double y[N];
    for (int k = 0; k < N; k++) y[k] = L->y[k][l];
    if (L->status[l] == SUCCESS)
        for (int64_t j = 0; j < job->n_eval; j++)
            if (job->grid[i * job->n_eval + j] == L->t1[l]) memcpy(job->yout + (i * job->n_eval + j) * N, y, sizeof y);
    int64_t *istat = job->istat + i * 5;
    istat[0] = L->status[l]; istat[1] = L->n_steps[l]; istat[2] = L->n_accepted[l];
    istat[3] = L->n_rejected[l]; istat[4] = L->n_f_evals[l];
    job->fstat[i * 3 + 1] = fabs(L->h[l]);
    job->fstat[i * 3 + 2] = L->t[l];
    memcpy(job->yfinal + i * N, y, sizeof y);
}

/* Put sample i into lane l; 0 when the sample has nothing to integrate (finished at once). */
static int start(Lanes *restrict L, int l, const Job *restrict job, int64_t i)
{
    const double *y0 = job->y0 + i * N, *p = job->params + i * job->n_params, *grid = job->grid + i * job->n_eval;
    const double t0 = job->t0[i], t1 = job->t1[i], dir = t1 >= t0 ? 1.0 : -1.0;
    double f0[N], k0[NH];
    rhs(t0, y0, p, job->shared, f0, k0);
    double h_abs = job->auto_dt0 ? initial_step(t0, y0, f0, dir, p, job->shared, job->rtol, job->atol)
                                 : fabs(job->dt0[i]);
    h_abs = clamp_max(odecli_fmin(h_abs, fabs(t1 - t0)), job->dt_max);
    job->fstat[i * 3] = h_abs;
    for (int k = 0; k < N; k++) { L->y[k][l] = y0[k]; L->K[0][k][l] = f0[k]; }
    for (int j = 0; j < NH; j++) L->keep[0][j][l] = k0[j];
    for (int j = 0; j < NP; j++) L->P[j][l] = p[j];
    L->sample[l] = i; L->t[l] = t0; L->t1[l] = t1; L->dir[l] = dir; L->h[l] = dir * h_abs;
    L->n_f_evals[l] = job->auto_dt0 ? 2 : 1;
    L->n_steps[l] = L->n_accepted[l] = L->n_rejected[l] = 0;
    L->status[l] = SUCCESS;
    L->err_prev[l] = L->err_prev2[l] = 1.0;
    L->rejected_last[l] = 0;
    int64_t ptr = 0, n_interior = 0;
    while (ptr < job->n_eval && grid[ptr] * dir <= dir * t0) {
        memcpy(job->yout + (i * job->n_eval + ptr) * N, y0, N * sizeof(double));
        ptr++;
    }
    for (int64_t j = 0; j < job->n_eval; j++) n_interior += grid[j] * dir < dir * t1;
    L->ptr[l] = ptr; L->n_interior[l] = n_interior;
    if (t1 == t0) {
        finish(L, l, job);
        return 0;
    }
    return 1;
}

/* Every lane's step size for this attempt: the controller's h, shortened to land on t1. */
static void clip_steps(Lanes *restrict L)
{
    for (int l = 0; l < W; l++) {
        double remaining = fabs(L->t1[l] - L->t[l]);
        L->last[l] = fabs(L->h[l]) * (1 + END_SNAP) >= remaining;
        L->hs[l] = L->dir[l] * odecli_fmin(fabs(L->h[l]), remaining);
    }
}

/* After rk_step: accept or reject, the next step size and the status of every lane. */
__attribute__((noinline))
static void control(Lanes *restrict L, const Job *restrict job)
{
    double factor[W];
    int64_t finite[W];
#if ADAPTIVE
    double inv[W], grow[W], shrink[W];
    for (int l = 0; l < W; l++) inv[l] = 1.0 / clamp_min(L->err[l], DBL_MIN);
    pow_lanes(inv, job->beta1, grow);
    if (job->inv_k == job->beta1)  /* the integral controller: one power serves both branches */
        for (int l = 0; l < W; l++) shrink[l] = job->safety * grow[l];
    else {
        pow_lanes(inv, job->inv_k, shrink);
        for (int l = 0; l < W; l++) shrink[l] = job->safety * shrink[l];
    }
    for (int l = 0; l < W; l++) grow[l] = job->safety * grow[l];
    if (job->beta2 != 0.0) {
        double history[W], power[W];
        for (int l = 0; l < W; l++) history[l] = 1.0 / L->err_prev[l];
        pow_lanes(history, job->beta2, power);
        for (int l = 0; l < W; l++) grow[l] = grow[l] * power[l];
    }
    if (job->beta3 != 0.0) {
        double history[W], power[W];
        for (int l = 0; l < W; l++) history[l] = 1.0 / L->err_prev2[l];
        pow_lanes(history, job->beta3, power);
        for (int l = 0; l < W; l++) grow[l] = grow[l] * power[l];
    }
    for (int l = 0; l < W; l++) {
        const double err = L->err[l];
        const int64_t ok = err <= 1.0;
        const double cap = L->rejected_last[l] ? 1.0 : job->factor_max;
        const double f = ok ? odecli_fmin(clamp_min(grow[l], job->factor_min), cap)
                            : clamp_max(clamp_min(shrink[l], job->factor_min), job->safety);
        factor[l] = f != f ? job->factor_min : f;  /* isnan and isfinite as comparisons: GCC 12 vectorises those */
        L->err_prev2[l] = ok ? L->err_prev[l] : L->err_prev2[l];
        L->err_prev[l] = ok ? clamp_min(err, HISTORY_FLOOR) : L->err_prev[l];
        L->rejected_last[l] = !ok;
        finite[l] = fabs(err) <= DBL_MAX;
        L->accept[l] = ok & finite[l];
    }
#else
    for (int l = 0; l < W; l++) finite[l] = 1;
    for (int k = 0; k < N; k++)
        for (int l = 0; l < W; l++) finite[l] = finite[l] && isfinite(L->y1[k][l]);
    for (int l = 0; l < W; l++) { factor[l] = 1.0; L->accept[l] = finite[l]; }
#endif
    for (int l = 0; l < W; l++) {
        /* Branch-free: both sides of every choice computed, 64-bit truth values, no && or ||
         * (with -fno-trapping-math GCC then vectorises the loop). */
        const int64_t accept = L->accept[l], last = L->last[l], done = accept & last;
        const double t = L->t[l], advanced = t + L->hs[l];
        const double t_new = last ? L->t1[l] : advanced;
        const double proposed = odecli_fmin(fabs(L->hs[l] * factor[l]), job->dt_max) * L->dir[l];
        const double h_next = done ? L->h[l] : proposed;
        const double t_after = accept ? t_new : t;
        int64_t status = finite[l] ? L->status[l] : (int64_t)INFINITE_NORM;
        const int64_t n_steps = L->n_steps[l] + 1, running = (1 - done) & (int64_t)(status == SUCCESS);
        const int64_t too_small = (int64_t)(fabs(h_next) < job->dt_min) | (int64_t)(t_after + h_next == t_after);
        status = running & too_small ? (int64_t)REACHED_DT_MIN : status;
        status = running & (int64_t)(n_steps >= job->max_steps) & (int64_t)(status == SUCCESS)
                     ? (int64_t)REACHED_MAX_STEPS : status;
        L->status[l] = status;
        L->running[l] = (1 - done) & (int64_t)(status == SUCCESS);
        L->t_new[l] = t_new;
        L->h[l] = h_next;
        L->n_steps[l] = n_steps;
        L->n_f_evals[l] += S;
    }
}

/* Lane l's evaluation times inside its accepted step [t, t_new] (before the step is taken). */
static void dense_output(Lanes *restrict L, int l, const Job *restrict job)
{
    const int64_t i = L->sample[l];
    const double *grid = job->grid + i * job->n_eval, t = L->t[l], hs = L->hs[l], dir = L->dir[l];
    int prepared = 0;
    while (L->ptr[l] < L->n_interior[l] && grid[L->ptr[l]] * dir <= dir * L->t_new[l]) {
        double t_at = grid[L->ptr[l]] * dir * dir, *out = job->yout + (i * job->n_eval + L->ptr[l]) * N;
        if (t_at == L->t_new[l]) {
            for (int k = 0; k < N; k++) out[k] = L->y1[k][l];
        } else {
            if (!prepared) {
                L->n_f_evals[l] += dense_prepare(l, t, L->y, L->y1, hs, L->P, job->shared, L->K);
                prepared = 1;
            }
            dense_eval(l, (t_at - t) / (hs == 0 ? 1.0 : hs), L->y, L->y1, hs, L->K, out);
        }
        L->ptr[l]++;
    }
}

/* Accepted lanes move to t_new: y1 becomes y and f(t_new, y1) (with what it keeps) the next
 * step's first stage. */
static void take_steps(Lanes *restrict L)
{
    for (int k = 0; k < N; k++)
        for (int l = 0; l < W; l++) {
            L->y[k][l] = L->accept[l] ? L->y1[k][l] : L->y[k][l];
            L->K[0][k][l] = L->accept[l] ? L->K[S][k][l] : L->K[0][k][l];
        }
#if KEPT_ROWS > 1
    for (int j = 0; j < NH; j++)
        for (int l = 0; l < W; l++) L->keep[0][j][l] = L->accept[l] ? L->keep[S][j][l] : L->keep[0][j][l];
#endif
    for (int l = 0; l < W; l++) {
        L->t[l] = L->accept[l] ? L->t_new[l] : L->t[l];
        L->n_accepted[l] += L->accept[l];
        L->n_rejected[l] += !L->accept[l];
    }
}

/* The Job of solve_samples' arguments; cfg holds CONFIG_FIELDS, turned into the controller's exponents. */
static Job make_job(int64_t n_eval, int64_t n_params, const double *y0, const double *t0, const double *t1,
                    const double *grid, const double *params, const double *dt0, int64_t auto_dt0,
                    const double *cfg, int64_t max_steps, double *yout, int64_t *istat, double *fstat,
                    double *yfinal, const double *shared)
{
    const double k_ctrl = ERROR_ORDER + 1.0;
    const Job job = {
        .y0 = y0, .t0 = t0, .t1 = t1, .grid = grid, .params = params, .dt0 = dt0, .shared = shared,
        .n_eval = n_eval, .n_params = n_params, .auto_dt0 = auto_dt0, .max_steps = max_steps,
        .yout = yout, .fstat = fstat, .yfinal = yfinal, .istat = istat,
        .rtol = cfg[0], .atol = cfg[1], .safety = cfg[2], .factor_min = cfg[3], .factor_max = cfg[4],
        .dt_min = cfg[5], .dt_max = cfg[6],
        .beta1 = (cfg[7] + cfg[8] + cfg[9]) / k_ctrl, .beta2 = -(cfg[7] + 2.0 * cfg[9]) / k_ctrl,
        .beta3 = cfg[9] / k_ctrl, .inv_k = 1.0 / k_ctrl,
    };
    return job;
}

{recorder}

/* Start the next samples of the range in lane l until one has something to integrate; 0 when
 * the range has none left. The range is i0, i0 + 1, ... or order[0..n) when order is given. */
static int take_next(Lanes *restrict L, int l, const Job *restrict job, int64_t i0, int64_t n,
                     const int64_t *restrict order, int64_t *restrict next, Recorder *restrict rec)
{
    while (*next < n) {
        const int64_t i = order ? order[*next] : i0 + *next;
        ++*next;
        const int busy = start(L, l, job, i);
        record_start(rec, L, l, busy);
        if (busy) return 1;
    }
    return 0;
}

/* The range's n samples (see take_next) through the W lanes, with their accepted steps handed
 * to the recorder. 0, or -1 when out of memory. */
static int solve_range(const Job *restrict job, int64_t i0, int64_t n, const int64_t *restrict order,
                       Recorder *restrict rec)
{
    Lanes *L = calloc(1, sizeof *L);  /* K alone is NK*N*W doubles: too much for small thread stacks */
    if (L == NULL) return -1;
    int busy[W], n_busy = 0;
    int64_t next = 0;
    for (int l = 0; l < W; l++) {
        busy[l] = take_next(L, l, job, i0, n, order, &next, rec);
        n_busy += busy[l];
    }
    while (n_busy > 0) {
        clip_steps(L);
        rk_step(L->t, L->y, L->hs, L->P, job->shared, L->K, L->keep, L->y1, L->err, job->rtol, job->atol);
        control(L, job);
        for (int l = 0; l < W; l++) {
            if (!busy[l] || !L->accept[l]) continue;
            const int64_t first_output = L->ptr[l];
            if (L->ptr[l] < L->n_interior[l]) dense_output(L, l, job);
            record_step(rec, L, l, first_output);
        }
        take_steps(L);
        for (int l = 0; l < W; l++) {
            if (!busy[l] || L->running[l]) continue;
            finish(L, l, job);
            record_finish(rec, L, l);
            busy[l] = take_next(L, l, job, i0, n, order, &next, rec);
            n_busy -= !busy[l];
        }
    }
    free(L);
    return 0;
}

/* Samples [i0, i1) of the batch; every array is row-major with the batch first, and shared holds
 * the weights every sample's right-hand side reads. 0, or -1 when out of memory. */
int solve_samples(int64_t i0, int64_t i1, int64_t n_eval, int64_t n_params,
                  const double *y0, const double *t0, const double *t1, const double *grid,
                  const double *params, const double *dt0, int64_t auto_dt0, const double *cfg,
                  int64_t max_steps, double *yout, int64_t *istat, double *fstat, double *yfinal,
                  const double *shared)
{
    const Job job = make_job(n_eval, n_params, y0, t0, t1, grid, params, dt0, auto_dt0, cfg, max_steps, yout,
                             istat, fstat, yfinal, shared);
    return solve_range(&job, i0, i1 - i0, NULL, NULL);
}
"""


_NO_RECORDER = """\
/* What solve_range tells a recorder of accepted steps: nothing, in the solver alone (the
 * gradient's tapes are one, odecli.ode.native.reverse). */
typedef struct Recorder Recorder;
static inline void record_start(Recorder *rec, const Lanes *L, int l, int busy)
{
    (void)rec; (void)L; (void)l; (void)busy;
}
static inline void record_step(Recorder *rec, const Lanes *L, int l, int64_t first_output)
{
    (void)rec; (void)L; (void)l; (void)first_output;
}
static inline void record_finish(Recorder *rec, const Lanes *L, int l) { (void)rec; (void)L; (void)l; }
"""


def generate(method: ExplicitRK, rhs_c: str, n_states: int, n_params: int, lanes: int = LANES,
             recorder: str = _NO_RECORDER, n_keep: int = 0, keep_stages: bool = False) -> str:
    """The complete C file for ``method`` and a right-hand side's C functions ``rhs_c``.

    ``rhs_c`` defines ``rhs`` and ``rhs_lanes`` as :func:`equations_c` does (with ``n_states``
    states, ``n_params`` per-sample parameters and ``n_keep`` values kept per evaluation for the
    pullback; the MLP kind is :func:`odecli.ode.native.mlp.mlp_c`). ``lanes`` samples are
    stepped together; any number gives the same results bit for bit. ``recorder`` defines the
    ``Recorder`` type and the ``record_start``/``record_step``/``record_finish`` calls the
    solver makes for each lane (start of a sample, an accepted step after its dense output, end
    of a sample). ``keep_stages``: the lanes hold every stage's kept values until the step is
    recorded (``keep[0..S]``, the stage-0 row carried over from the last step's K[S]).
    """
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
    return "\n\n".join([
        f"/* odecli: {method.name} fused with a generated right-hand side. */",
        defines,
        _HEADER.format(n_states=n_states, n_stages=method.n_stages, n_k=n_k, n_params=max(1, n_params),
                       lanes=lanes, n_keep=max(1, n_keep), kept_rows=n_k if keep_stages else 1),
        _pow_lanes_c(), rhs_c, _rk_step(method, keep_stages), _dense(method), _SOLVER.replace("{recorder}", recorder),
    ])
