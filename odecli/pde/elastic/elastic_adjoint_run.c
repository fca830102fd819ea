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

/* Compact stores (compact != 0): store_v[j] holds the velocities after the step, ringed (B, 2,
 * ny + 4, nx + 4) with a zero ring, vprev[j] those before it (the step before's, or the
 * segment's start); store_s[j] the stress update's corrected derivatives in the CPML layers
 * only (forward_pass.CompactStores: per shot 3 planes of the y layers' sy rows, row k of them
 * at smap[i] for field row i, then 3 planes (ny, cols) of the x layers' columns of the other
 * rows, columns [0, jlo) and [jhi, nx) side by side).  The derivatives the adjoint reads are
 * made row by row into drow ((n, 5, nx): per pass step the stress row's three, then the
 * velocity row's two): elsewhere than in the layers the stress derivatives by the forward's own
 * expressions from the stored velocities (the same bits, as the layers' stored ones); the
 * velocity update's sums from the velocities' change, (v_new - v_old - force) / (dt b), which
 * the forward computed as v_old + (dt b) sum (+ force): round-off apart, not bit for bit.
 * Into drow only the layers' parts (and whole rows with one of the shot's point forces): the
 * rows' interiors derive theirs in the row functions (elastic_adjoint_compact.c), which sum the
 * buoyancy gradient's terms there as L (v_new - v_old) into gr_y, gr_x ((ny, nx) each) for the
 * caller to divide by b once a backward. */
#define DEFINE_DERIVE(real, sfx)                                                                   \
static void derive_stress_row_##sfx(long ny, long nx, long i, const real *v, const real *cstore,  \
        const int64_t *smap, long sy, real *out, const real *ayi, const real *ayh, real idy,      \
        real idx, long jlo, long jhi, int layers_only)                                             \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX, cols = jlo + nx - jhi;                          \
    const real c1 = (real)C1, c2 = (real)C2;                                                       \
    const real *restrict vy = v + (i + 2) * NX + 2, *restrict vx = vy + plane;                     \
    real *restrict d0 = out, *restrict d1 = out + nx, *restrict d2 = out + 2 * nx;                 \
    const int ypml = ayh[i] != 0 || ayi[i] != 0;                                                   \
    const long a = (ypml || jhi <= jlo) ? nx : jlo, b = (ypml || jhi <= jlo) ? nx : jhi;          \
    for (long j = a; j < (layers_only ? a : b); j++) {                                             \
        real dvy_dy = (c1 * (vy[j] - vy[j - NX]) + c2 * (vy[j + NX] - vy[j - 2 * NX])) * idy;      \
        real dvx_dx = (c1 * (vx[j] - vx[j - 1]) + c2 * (vx[j + 1] - vx[j - 2])) * idx;             \
        real dvx_dy = (c1 * (vx[j + NX] - vx[j]) + c2 * (vx[j + 2 * NX] - vx[j - NX])) * idy;      \
        real dvy_dx = (c1 * (vy[j + 1] - vy[j]) + c2 * (vy[j + 2] - vy[j - 1])) * idx;             \
        d0[j] = dvx_dx; d1[j] = dvy_dy; d2[j] = dvx_dy + dvy_dx;                                   \
    }                                                                                              \
    const real *src = ypml ? cstore + smap[i] * nx : cstore + 3 * sy * nx + i * cols;              \
    const long ck = ypml ? sy * nx : ny * cols, shift = ypml ? 0 : jhi - jlo;                      \
    for (long j = 0; j < a; j++) { d0[j] = src[j]; d1[j] = src[ck + j]; d2[j] = src[2 * ck + j]; } \
    for (long j = b; j < nx; j++) {                                                                \
        const long k = j - shift;                                                                  \
        d0[j] = src[k]; d1[j] = src[ck + k]; d2[j] = src[2 * ck + k];                              \
    }                                                                                              \
}                                                                                                  \
static int row_has_force_##sfx(long ny, long nx, long r, long shot, const int64_t *src_ptr,      \
                               const int64_t *src_at)                                              \
{                                                                                                  \
    const long plane = (ny + 4) * (nx + 4);                                                        \
    for (long k = src_ptr[r]; k < src_ptr[r + 1]; k++)                                             \
        if (src_at[k] / (2 * plane) == shot) return 1;                                             \
    return 0;                                                                                      \
}                                                                                                  \
/* columns [0, a) and [b, nx) (the layers' parts) where layers_only, else all */                  \
static void derive_velocity_row_##sfx(long ny, long nx, long r, long shot, const real *vnow,      \
        const real *vold, const real *buy, const real *bux, real *out, real dt,                   \
        const int64_t *src_ptr, const int64_t *src_at, const int64_t *src_g, const real *src_val, \
        long a, long b, int layers_only)                                                           \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX, at = shot * 2 * plane + (r + 2) * NX + 2;       \
    const real *restrict ny_ = vnow + at, *restrict nx_ = ny_ + plane;                             \
    const real *restrict oy = vold + at, *restrict ox = oy + plane;                                \
    const real *restrict by = buy + r * nx, *restrict bx = bux + r * nx;                           \
    real *restrict e0 = out, *restrict e1 = out + nx;                                              \
    if (!layers_only) a = b = nx;                                                                  \
    for (long j = 0; j < a; j++) { e0[j] = ny_[j] - oy[j]; e1[j] = nx_[j] - ox[j]; }              \
    for (long j = b; j < nx; j++) { e0[j] = ny_[j] - oy[j]; e1[j] = nx_[j] - ox[j]; }             \
    for (long k = src_ptr[r]; !layers_only && k < src_ptr[r + 1]; k++) { /* the step's forces */ \
        const long rest = src_at[k] - shot * 2 * plane;                                            \
        if (rest < 0 || rest >= 2 * plane) continue; /* another shot's */                          \
        const long c = rest / plane, g = src_g[k];                                                 \
        (c ? e1 : e0)[g % nx] -= src_val[k] * (c ? bux : buy)[g];                                  \
    }                                                                                              \
    for (long j = 0; j < a; j++) { e0[j] = e0[j] / (dt * by[j]); e1[j] = e1[j] / (dt * bx[j]); }  \
    for (long j = b; j < nx; j++) { e0[j] = e0[j] / (dt * by[j]); e1[j] = e1[j] / (dt * bx[j]); } \
}

DEFINE_DERIVE(double, f64)
DEFINE_DERIVE(float, f32)

/* the parameters of elastic_adjoint_run_* (and, with two more, elastic_adjoint_scaled_run_*:
 * adjoint_pass.AdjointPass passes the same) */
#define ADJOINT_RUN_PARAMS(real)                                                                   \
        long B, long ny, long nx, long n, long j0, long j1,                                       \
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
        long src_count, real *g_src, const real *const *vprev, int compact, const int64_t *smap,  \
        long sy, real *drow, real *gr_y, real *gr_x

#define DEFINE_ADJOINT_RUN(real, sfx)                                                              \
void elastic_adjoint_run_##sfx(ADJOINT_RUN_PARAMS(real))                                           \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX, pp = ny * nx, WX = nx + 8;                      \
    const long cols = jlo + nx - jhi, cstride = 3 * (sy * nx + ny * cols);                         \
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
                real *ds = drow + j * 5 * nx, *dv = ds + 3 * nx; /* compact: derived rows */       \
                const long sp = compact ? nx : pp;                                                 \
                if (compact) {                                                                     \
                    sv = dv; ss = ds;                                                              \
                }                                                                                  \
                if (i == 0)                                                                        \
                    for (long c = 0; c < 2 * ring; c++) ws[c] = 0;                                 \
                if (i < ny) {                                                                      \
                    for (long k = rv_ptr[i]; k < rv_ptr[i + 1]; k++)                               \
                        lvb[rv_at[k]] += rv_val[(j * B + b) * rv_count + k];                       \
                    for (long k = rs_ptr[i]; k < rs_ptr[i + 1]; k++)                               \
                        lsb[rs_at[k]] += rs_val[(j * B + b) * rs_count + k];                       \
                    if (compact) /* the layers' parts; the rest in the row function */         \
                        derive_stress_row_##sfx(ny, nx, i, store_v[j] + b * 2 * plane,             \
                                                store_s[j] + b * cstride, smap, sy, ds, ayi, ayh,  \
                                                idy, idx, jlo, jhi, 1);                            \
                    stress_adjoint_rows_at_##sfx(ny, nx, i, i + 1, lsb, lpb, lam2mu, lam, muxy,    \
                                              NULL, compact ? ss : ss + i * nx, sp,                \
                                              compact ? store_v[j] + b * 2 * plane : NULL,         \
                                              g_lam2mu,                                            \
                                              g_lam, g_muxy, NULL, ws, wp, mask,                   \
                                              ayi, byi, ayh, byh, axi, bxi, axh, bxh, dt, idy,     \
                                              idx, jlo, jhi);                                      \
                }                                                                                  \
                if (i < ny + 4) {                                                                  \
                    if (i + 4 >= ny + 4) zero_ring_rows_##sfx(ws, nx, i + 4);                      \
                    stress_gather_rows_##sfx(ny, nx, i, i + 1, lvb, ws, wp, mask);                 \
                }                                                                                  \
                if (i >= 2 && i - 2 < ny) {                                                        \
                    /* a row without this shot's point forces: the interior in the row     \
                     * function, from the velocities */                                          \
                    const int inner = compact && !row_has_force_##sfx(ny, nx, i - 2, b, src_ptr,   \
                                                                      src_at);                     \
                    const int yl = ayi[i - 2] != 0 || ayh[i - 2] != 0;                             \
                    const long va = (yl || jhi <= jlo) ? nx : jlo, vb = (yl || jhi <= jlo) ? nx : jhi; \
                    if (compact)                                                                   \
                        derive_velocity_row_##sfx(ny, nx, i - 2, b, store_v[j], vprev[j], buy,     \
                                                  bux, dv, dt, src_ptr, src_at, src_g,             \
                                                  src_val + j * src_count, va, vb, inner);         \
                    velocity_adjoint_rows_at_##sfx(ny, nx, i - 2, i - 1, lvb, lpb, buy, bux,       \
                                                compact ? sv : sv + (i - 2) * nx, sp,              \
                                                inner ? store_v[j] + b * 2 * plane : NULL,         \
                                                inner ? vprev[j] + b * 2 * plane : NULL,           \
                                                gr_y, gr_x,                                        \
                                                g_by, g_bx, wv, wp, mask, ayi, byi, ayh, byh, axi, \
                                                bxi, axh, bxh, dt, idy, idx, jlo, jhi);            \
                }                                                                                  \
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
#include "elastic_adjoint_scaled.c"
