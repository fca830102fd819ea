/* Several adjoint steps in one pass over the rows (included at the end of elastic_adjoint.c,
 * whose row functions it calls; one rank, no free surface, as elastic_adjoint_step).
 *
 * n steps of the backward go over the rows together, step j + 1 working ARUN_LAG rows behind
 * step j (step j the later in time: it runs first), so that the rows step j leaves are still
 * in cache when step j + 1 comes.  Built because an adjoint step was thought memory-bound;
 * measured, several steps per pass on one thread are slower (adjoint_pass.pass_length: the
 * step is bound by its row streams between L1 and L2), so the caller runs one step per
 * thread: the pass then serves the receivers' and sources' work row by row, and threads.
 *
 * Each step is elastic_adjoint_step's sweep, row iteration i = 0 .. ny + 5 (stress adjoint row
 * i, gather of ringed velocity-adjoint row i, velocity adjoint row i - 2, gather of ringed
 * stress-adjoint row i - 2), with its own rings ws, wv per shot.  Step j + 1's iteration i
 * reads adjoint stress row i, which step j finishes in its iteration i + 4 (the gather of
 * ringed row i + 2), and the adjoint velocity row i - 2 (finished in step j's iteration i), so
 * a lag of 4 rows is enough; what step j + 1 writes (rows i - 2, i - 4 of the adjoints, rows i,
 * i - 2 of the sums and memory variables) step j has done with.  Per step, the receivers'
 * residuals of that step are added to the adjoints of field row i before its iteration i (the
 * caller's _record_adjoint before a step: nothing of the step has touched that row yet), and
 * after the shots' iteration i the point forces' buoyancy gradient reads the finished adjoint
 * velocity row i - 2 (FusedLoop._source_gradient after a step).  Every point thus gets the
 * same operations in the same order as from n calls of elastic_adjoint_step with those
 * between them: the same bits.  The adjoints' ghost rings, which the gathers add into and no
 * step reads, are not cleared between the steps (the caller clears them after the pass).
 *
 * Threads: a call does steps j0 .. j1 - 1 of the n; calls for consecutive step ranges run at
 * once, each publishing in *done the last row iteration q it has finished and waiting before
 * iteration q until the call before it (*ahead) has finished q + 4 - ARUN_LAG (its last step
 * then has finished the row iteration 4 past this call's first step's).  Each row of the sums
 * gets its steps' terms in step order: the result does not depend on the split.
 *
 * Arrays: lv (B, 2, ny + 4, nx + 4), ls (B, 3, ...), lp (B, 8, ny, nx); store_v[j] and
 * store_s[j] the stores of pass step j, (B, 2 | 3, ny, nx); w the rings, (n, B, 2, 4, 8, nx + 8),
 * zeroed here.  Points, sorted by field row with CSR offsets ptr[0 .. ny]: rv (into the whole
 * lv) and rs (into ls) with values val[(j * B + b) * count + k] for shot b; sources at (into
 * the whole lv), their gradient's point g (into g_src, a shot's (ny, nx)), values
 * val[j * count + k] (the force's dt amp w / (dy dx)). */
#include <sched.h>
#include <stdint.h>

#define ARUN_LAG 4 /* rows step j + 1 works behind step j (4: see above) */

#define DEFINE_ADJOINT_RUN(real, sfx)                                                              \
void elastic_adjoint_run_##sfx(long B, long ny, long nx, long n, long j0, long j1,                \
        int64_t *done, const int64_t *ahead, real *lv, real *ls, real *lp,                        \
        const real *buy, const real *bux, const real *lam2mu, const real *lam, const real *muxy,  \
        const real *const *store_v, const real *const *store_s, real *g_by, real *g_bx,           \
        real *g_lam2mu, real *g_lam, real *g_muxy, real *w,                                       \
        const real *ayi, const real *byi, const real *ayh, const real *byh, const real *axi,      \
        const real *bxi, const real *axh, const real *bxh, real dt, real idy, real idx,           \
        long jlo, long jhi,                                                                        \
        const int64_t *rv_ptr, const int64_t *rv_at, const real *rv_val, long rv_count,           \
        const int64_t *rs_ptr, const int64_t *rs_at, const real *rs_val, long rs_count,           \
        const int64_t *src_ptr, const int64_t *src_at, const int64_t *src_g, const real *src_val, \
        long src_count, real *g_src)                                                               \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX, pp = ny * nx, WX = nx + 8;                      \
    const long ring = 4 * 8 * WX, wp = 8 * WX, mask = 7;                                           \
    for (long q = 0; q < ny + 6 + (n - 1) * ARUN_LAG; q++) {                                       \
        if (ahead) /* wait for the steps before this call's */                                     \
            for (long spins = 0; __atomic_load_n(ahead, __ATOMIC_ACQUIRE) < q + 4 - ARUN_LAG;      \
                 ++spins)                                                                          \
                if (spins > 256) sched_yield();                                                    \
        for (long j = j0; j < j1; j++) {                                                           \
            const long i = q - j * ARUN_LAG;                                                       \
            if (i < 0 || i >= ny + 6) continue;                                                    \
            for (long b = 0; b < B; b++) {                                                         \
                real *lvb = lv + b * 2 * plane, *lsb = ls + b * 3 * plane, *lpb = lp + b * 8 * pp; \
                real *ws = w + (j * B + b) * 2 * ring, *wv = ws + ring;                            \
                const real *sv = store_v[j] + b * 2 * pp, *ss = store_s[j] + b * 3 * pp;           \
                if (i == 0)                                                                        \
                    for (long c = 0; c < 2 * ring; c++) ws[c] = 0;                                 \
                if (i < ny) {                                                                      \
                    for (long k = rv_ptr[i]; k < rv_ptr[i + 1]; k++)                               \
                        lvb[rv_at[k]] += rv_val[(j * B + b) * rv_count + k];                       \
                    for (long k = rs_ptr[i]; k < rs_ptr[i + 1]; k++)                               \
                        lsb[rs_at[k]] += rs_val[(j * B + b) * rs_count + k];                       \
                    stress_adjoint_rows_##sfx(ny, nx, i, i + 1, lsb, lpb, lam2mu, lam, muxy, NULL, \
                                              ss, g_lam2mu, g_lam, g_muxy, NULL, ws, wp, mask,     \
                                              ayi, byi, ayh, byh, axi, bxi, axh, bxh, dt, idy,     \
                                              idx, jlo, jhi);                                      \
                }                                                                                  \
                if (i < ny + 4) {                                                                  \
                    if (i + 4 >= ny + 4) zero_ring_rows_##sfx(ws, nx, i + 4);                      \
                    stress_gather_rows_##sfx(ny, nx, i, i + 1, lvb, ws, wp, mask);                 \
                }                                                                                  \
                if (i >= 2 && i - 2 < ny)                                                          \
                    velocity_adjoint_rows_##sfx(ny, nx, i - 2, i - 1, lvb, lpb, buy, bux, sv,      \
                                                g_by, g_bx, wv, wp, mask, ayi, byi, ayh, byh, axi, \
                                                bxi, axh, bxh, dt, idy, idx, jlo, jhi);            \
                if (i >= 2) {                                                                      \
                    if (i + 2 >= ny + 4) zero_ring_rows_##sfx(wv, nx, i + 2);                      \
                    velocity_gather_rows_##sfx(ny, nx, i - 2, i - 1, lsb, wv, wp, mask);           \
                }                                                                                  \
            }                                                                                      \
            if (i >= 2 && i - 2 < ny) /* the point forces' part of the buoyancy gradient */        \
                for (long k = src_ptr[i - 2]; k < src_ptr[i - 1]; k++) {                           \
                    const real term = src_val[j * src_count + k] * lv[src_at[k]];                  \
                    g_src[src_g[k]] += term;                                                       \
                }                                                                                  \
        }                                                                                          \
        if (done)                                                                                  \
            __atomic_store_n(done, q, __ATOMIC_RELEASE);                                           \
    }                                                                                              \
}

DEFINE_ADJOINT_RUN(double, f64)
DEFINE_ADJOINT_RUN(float, f32)
