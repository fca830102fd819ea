/* Events in the generated solver: a transcription of odecli.ode.events for one lane.
 *
 * Spliced into solver_template.c when the right-hand side brings events (NE > 0, with
 * events_g, EV_DIR and EV_TERM from odecli.ode.native.codegen.events_c). After each accepted
 * step, g at its end is compared with g at its start; a sign change in the event's direction
 * is located on the step's dense output by Illinois regula falsi, with the same arithmetic,
 * order of operations and stopping rule as odecli.ode.events.locate, so event times agree with
 * the PyTorch loop's to round-off.
 */

#define EVENT_MAX_ITERATIONS 200  /* odecli.ode.events.MAX_ITERATIONS */
#define EVENT_RESOLUTION_ULPS 4.0  /* odecli.ode.events.RESOLUTION_ULPS */

static inline double sign_of(double x) { return (double)((x > 0) - (x < 0)); }

/* theta in [0, 1] where event e's g vanishes on lane l's step, given g0 at its start, g1 at its end. */
static double event_root(Lanes *restrict L, int l, int e, const double *restrict p, const double *restrict w,
                         double g0, double g1, double tol)
{
    const double t = L->t[l], h = L->hs[l];
    double a = 0.0, b = 1.0, ga = g0, gb = g1, y[N], g[NE];
    for (int it = 0; it < EVENT_MAX_ITERATIONS; it++) {
        const double denominator = gb - ga;
        double c = b - gb * (b - a) / (denominator == 0 ? 1.0 : denominator);
        const double low = odecli_fmin(a, b), high = odecli_fmax(a, b);
        if (!((c > low) & (c < high) & (denominator != 0))) c = 0.5 * (a + b);
        dense_eval(l, c, L->y, L->y1, h, L->K, y);
        events_g(t + c * h, y, p, w, g);
        const double gc = g[e];
        if (sign_of(gc) == sign_of(gb)) ga = 0.5 * ga;  /* Illinois: the end that stays is halved */
        else { a = b; ga = gb; }
        b = c; gb = gc;
        if (!((gc != 0) & (fabs(b - a) > tol))) break;
    }
    return fabs(gb) <= fabs(ga) ? b : a;
}

/* The events of lane l's accepted step (t, t_new]: records every occurrence up to and including a
 * terminal one. Returns 1 when a terminal event ends the sample, with its time in *t_limit and
 * its state in y_event; *prepared says whether the dense output's extra stages are computed. */
static int event_step(Lanes *restrict L, int l, const Job *restrict job, int *restrict prepared,
                      double *restrict t_limit, double *restrict y_event)
{
    const int64_t i = L->sample[l], cap = job->ev_cap;
    const double t = L->t[l], hs = L->hs[l], t_new = L->t_new[l];
    double y1[N], p[NP], g_old[NE], g_new[NE], theta[NE];
    int hit[NE], any = 0;
    for (int k = 0; k < N; k++) y1[k] = L->y1[k][l];
    for (int j = 0; j < NP; j++) p[j] = L->P[j][l];
    events_g(t_new, y1, p, job->shared, g_new);
    for (int e = 0; e < NE; e++) {
        g_old[e] = L->g_prev[e][l];
        L->g_prev[e][l] = g_new[e];
        const int up = (g_old[e] < 0) & (g_new[e] >= 0), down = (g_old[e] > 0) & (g_new[e] <= 0);
        hit[e] = (up & (EV_DIR[e] >= 0)) | (down & (EV_DIR[e] <= 0));
        any |= hit[e];
    }
    if (!any) return 0;
    if (!*prepared) {
        L->n_f_evals[l] += dense_prepare(l, t, L->y, L->y1, hs, L->P, job->shared, L->K);
        *prepared = 1;
    }
    const double spacing = odecli_fmax(fabs(t), fabs(t_new)) * DBL_EPSILON + DBL_MIN;
    const double tol = EVENT_RESOLUTION_ULPS * spacing / fabs(hs == 0 ? 1.0 : hs);
    double t_stop = INFINITY;
    for (int e = 0; e < NE; e++) {
        theta[e] = hit[e] ? event_root(L, l, e, p, job->shared, g_old[e], g_new[e], tol) : INFINITY;
        if (hit[e] && EV_TERM[e] > 0 && L->ev_n[e][l] + 1 >= EV_TERM[e] && theta[e] < t_stop) t_stop = theta[e];
    }
    for (int e = 0; e < NE; e++) {
        if (!hit[e] || !(theta[e] <= t_stop)) continue;
        const int64_t n = L->ev_n[e][l]++;
        job->ev_count[i * NE + e] = n + 1;
        if (n >= cap) continue;  /* counted; the caller solves again with room for it */
        const double th = theta[e];
        double *out = job->ev_y + ((i * NE + e) * cap + n) * N;
        job->ev_t[(i * NE + e) * cap + n] = th >= 1 ? t_new : t + th * hs;
        if (th >= 1) memcpy(out, y1, sizeof y1);
        else dense_eval(l, th, L->y, L->y1, hs, L->K, out);
    }
    if (t_stop == INFINITY) return 0;
    *t_limit = t_stop >= 1 ? t_new : t + t_stop * hs;
    if (t_stop >= 1) memcpy(y_event, y1, sizeof y1);
    else dense_eval(l, t_stop, L->y, L->y1, hs, L->K, y_event);
    return 1;
}
