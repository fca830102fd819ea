/* The generated ODE solver: one explicit Runge-Kutta method fused with one right-hand side, each
 * sample on its own steps, W samples at a time in vector lanes (see odecli/ode/native/codegen.py).
 *
 * This file is the fixed part. odecli.ode.native.codegen writes "solver_generated.h" for one
 * method and one right-hand side: the sizes (N states, S stages, NK stage rows, NP parameters,
 * W lanes, NH kept values), the method's and controller's constants (ADAPTIVE, ERROR_ORDER,
 * INV_K_INITIAL, END_SNAP, HISTORY_FLOOR), the status codes, and the generated functions rhs,
 * rhs_lanes, rk_step, dense_prepare and dense_eval with the tableau's coefficients written in.
 * "solver_recorder.h" is what solve_range tells about accepted steps (nothing here; the
 * gradient's forward pass substitutes its tapes). odecli compiles one translation unit: the
 * quoted includes are spliced in as text before compiling (odecli.ode.native.codegen.generate),
 * so the cached library's hash covers all of it and no include path is needed.
 */

#ifdef __CUDACC_RTC__
/* The same text as CUDA C++ for NVRTC (odecli.ode.gpu): compiled with -default-device, so every
 * function below is a device function; one thread runs one sample (W = 1) from start to end, and
 * the __global__ entry at the end maps threads to samples. NVRTC has no C headers: what the
 * solver takes from them is defined here. C99's restrict (also inside array parameters) has no
 * C++ spelling there, so it is dropped. */
typedef long int64_t;  /* as glibc on LP64 (CUDA device code follows the host's data model) */
typedef unsigned long uint64_t;
#define restrict
#define NULL 0
#ifdef ODECLI_FLOAT
/* float32 solves: the same text in single precision (odecli.ode.gpu.source has suffixed every
 * floating literal with f, so no operation is promoted to double). */
#define double float
#define NAN __int_as_float(0x7fc00000)
#define INFINITY __int_as_float(0x7f800000)
#define DBL_MIN 1.17549435e-38f
#define DBL_MAX 3.40282347e+38f
#define DBL_EPSILON 1.19209290e-07f
#else
#define NAN __longlong_as_double(0x7ff8000000000000LL)
#define INFINITY __longlong_as_double(0x7ff0000000000000LL)
#define DBL_MIN 2.2250738585072014e-308
#define DBL_MAX 1.7976931348623157e+308
#define DBL_EPSILON 2.220446049250313e-16
#endif
#define ODECLI_NOINLINE  /* GCC's vectoriser needs these calls kept; a GPU thread has no lanes to vectorise */
#else
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <float.h>
#define ODECLI_NOINLINE __attribute__((noinline))
#endif

static inline double odecli_sq(double a) { return a * a; }
/* torch.minimum / torch.maximum: a NaN in either argument gives NaN. */
static inline double odecli_fmin(double a, double b) { return ((a != a) | (b != b)) ? NAN : (a < b ? a : b); }
static inline double odecli_fmax(double a, double b) { return ((a != a) | (b != b)) ? NAN : (a > b ? a : b); }
/* torch.clamp(x, min=lo): NaN stays NaN. */
static inline double clamp_min(double x, double lo) { return x < lo ? lo : x; }
static inline double clamp_max(double x, double hi) { return x > hi ? hi : x; }

#include "solver_generated.h"

#ifndef NE
#define NE 0  /* events (odecli.ode.native.events): their functions and constants come with the right-hand side */
#endif

#include "libm_pow.c"  /* pow_lanes: the controller's powers over all lanes, bit for bit libm's pow */

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
    int64_t ev_cap;            /* occurrences kept per sample and event (0: no events recorded) */
    double *ev_t, *ev_y;       /* (B, NE, ev_cap) times and (B, NE, ev_cap, N) states */
    int64_t *ev_count;         /* (B, NE) occurrences, also those beyond ev_cap */
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
#if NE > 0
    double g_prev[NE][W];      /* the events' g at the last accepted point */
    int64_t ev_n[NE][W];       /* their occurrences so far */
#endif
} Lanes;

/* Store lane l's statistics and final state into its sample's rows. */
static void finish(Lanes *restrict L, int l, const Job *restrict job)
{
    const int64_t i = L->sample[l];
    double y[N];
    for (int k = 0; k < N; k++) y[k] = L->y[k][l];
    if (L->status[l] == SUCCESS || (L->status[l] == EVENT && L->t[l] == L->t1[l]))
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
#if NE > 0
    double g[NE];
    events_g(t0, y0, p, job->shared, g);
    for (int e = 0; e < NE; e++) { L->g_prev[e][l] = g[e]; L->ev_n[e][l] = 0; }
#endif
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
ODECLI_NOINLINE
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

/* Lane l's evaluation times inside its accepted step [t, t_limit] (before the step is taken);
 * t_limit is t_new, or an earlier terminal event's time. *prepared: the dense output's extra
 * stages are computed (by the events or here). */
static void dense_output(Lanes *restrict L, int l, const Job *restrict job, int *restrict prepared_flag,
                         double t_limit)
{
    const int64_t i = L->sample[l];
    const double *grid = job->grid + i * job->n_eval, t = L->t[l], hs = L->hs[l], dir = L->dir[l];
    int prepared = *prepared_flag;
    while (L->ptr[l] < L->n_interior[l] && grid[L->ptr[l]] * dir <= dir * t_limit) {
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
    *prepared_flag = prepared;
}

#if NE > 0
#include "solver_events.c"  /* event_step: sign changes of g located on the dense output */
#endif

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

#include "solver_recorder.h"  /* the recorder of accepted steps: none, or the gradient's tapes */

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
#ifdef __CUDACC_RTC__
    Lanes lanes = {};  /* W = 1 on a GPU thread: a few hundred bytes of its own memory */
    Lanes *L = &lanes;
#else
    Lanes *L = calloc(1, sizeof *L);  /* K alone is NK*N*W doubles: too much for small thread stacks */
    if (L == NULL) return -1;
#endif
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
            int prepared = 0;
            double t_limit = L->t_new[l];
#if NE > 0
            double y_event[N];
            const int ended = job->ev_count ? event_step(L, l, job, &prepared, &t_limit, y_event) : 0;
#endif
            if (L->ptr[l] < L->n_interior[l]) dense_output(L, l, job, &prepared, t_limit);
            record_step(rec, L, l, first_output);
#if NE > 0
            if (ended) {  /* the sample ends at the event: take_steps moves it there */
                for (int k = 0; k < N; k++) L->y1[k][l] = y_event[k];
                L->t_new[l] = t_limit;
                L->status[l] = EVENT;
                L->running[l] = 0;
            }
#endif
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
#ifndef __CUDACC_RTC__
    free(L);
#endif
    return 0;
}

#if NE > 0
/* solve_samples with the events recorded: ev_cap occurrences per sample and event into ev_t
 * (B, NE, ev_cap) and ev_y (B, NE, ev_cap, N), their number (beyond ev_cap too) into ev_count (B, NE). */
int solve_samples_events(int64_t i0, int64_t i1, int64_t n_eval, int64_t n_params,
                         const double *y0, const double *t0, const double *t1, const double *grid,
                         const double *params, const double *dt0, int64_t auto_dt0, const double *cfg,
                         int64_t max_steps, double *yout, int64_t *istat, double *fstat, double *yfinal,
                         const double *shared, int64_t ev_cap, double *ev_t, double *ev_y, int64_t *ev_count)
{
    Job job = make_job(n_eval, n_params, y0, t0, t1, grid, params, dt0, auto_dt0, cfg, max_steps, yout,
                       istat, fstat, yfinal, shared);
    job.ev_cap = ev_cap; job.ev_t = ev_t; job.ev_y = ev_y; job.ev_count = ev_count;
    return solve_range(&job, i0, i1 - i0, NULL, NULL);
}
#endif

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

#ifdef __CUDACC_RTC__
/* The GPU's entry (odecli.ode.gpu): solve_samples' arguments, one thread per sample of [i0, i1),
 * each running its sample's whole integration, as solve_range runs it in one CPU lane. */
extern "C" __global__ void solve_samples_cuda(int64_t i0, int64_t i1, int64_t n_eval, int64_t n_params,
                                              const double *y0, const double *t0, const double *t1,
                                              const double *grid, const double *params, const double *dt0,
                                              int64_t auto_dt0, const double *cfg, int64_t max_steps,
                                              double *yout, int64_t *istat, double *fstat, double *yfinal,
                                              const double *shared)
{
    const int64_t i = i0 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= i1) return;
    const Job job = make_job(n_eval, n_params, y0, t0, t1, grid, params, dt0, auto_dt0, cfg, max_steps, yout,
                             istat, fstat, yfinal, shared);
    solve_range(&job, i, 1, NULL, NULL);
}

#if NE > 0
/* solve_samples_cuda with the events recorded, as solve_samples_events records them. */
extern "C" __global__ void solve_samples_events_cuda(int64_t i0, int64_t i1, int64_t n_eval, int64_t n_params,
                                                     const double *y0, const double *t0, const double *t1,
                                                     const double *grid, const double *params, const double *dt0,
                                                     int64_t auto_dt0, const double *cfg, int64_t max_steps,
                                                     double *yout, int64_t *istat, double *fstat, double *yfinal,
                                                     const double *shared, int64_t ev_cap, double *ev_t,
                                                     double *ev_y, int64_t *ev_count)
{
    const int64_t i = i0 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= i1) return;
    Job job = make_job(n_eval, n_params, y0, t0, t1, grid, params, dt0, auto_dt0, cfg, max_steps, yout, istat,
                       fstat, yfinal, shared);
    job.ev_cap = ev_cap; job.ev_t = ev_t; job.ev_y = ev_y; job.ev_count = ev_count;
    solve_range(&job, i, 1, NULL, NULL);
}
#endif
#endif
