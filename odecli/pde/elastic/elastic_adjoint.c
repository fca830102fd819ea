/* The hand-written adjoint of elastic.c's steps (included at its end: it uses its row
 * functions' conventions and the C1, C2 coefficients).  Kept in its own file for length. */

/* The adjoint steps, in two passes so that both vectorise.  The first (elastic_*_adjoint) runs
 * over rows [r0, r1) of one shot: it reads the adjoints la_* of the fields after the step, adds
 * the parameter gradients g_* (summed into), runs the CPML memory variables' adjoints lp, and
 * writes the four weighted derivative adjoints of each point to w, (4, ny + 8, nx + 8) with a
 * ring of width 4 that stays 0.  The second (elastic_*_gather) adds each difference's adjoint
 * at every point of the ringed adjoint fields, ringed rows [q0, q1), by reading w at the four
 * points whose differences read it (the transpose of the forward's stencils).  The ring thus
 * collects what belongs to the neighbours (sent by fill_ring_adjoint_) and to the free-surface
 * image (folded back by the caller).  The old scatter form (each point adding into its four
 * neighbours) could not vectorise: 5.2 ms per step of 1.9 for the forward's kernels (640^2,
 * float64); the sums now round in another order, 1e-15 apart.  store: the forward's corrected
 * derivatives of this step (see the forward kernels). */
#define CPML_ADJOINT(k, a, b, e) do { if ((a) != 0) { __typeof__(lp[0]) pb = lp[(k) * pp + P] + (e);          \
                                      lp[(k) * pp + P] = (b) * pb; (e) = (e) + (a) * pb; } } while (0)
/* the transposes of the forward's differences, read at Q of w (row stride S) */
#define T_PLUS(w, Q, S)  (c1 * ((w)[(Q) - (S)] - (w)[Q]) + c2 * ((w)[(Q) - 2 * (S)] - (w)[(Q) + (S)]))
#define T_MINUS(w, Q, S) (c1 * ((w)[Q] - (w)[(Q) + (S)]) + c2 * ((w)[(Q) - (S)] - (w)[(Q) + 2 * (S)]))
/* the same along y, from the rows -2 .. 2 around the point's (rows need not be equally spaced:
 * the adjoint step keeps w in a ring of 8 rows) */
#define TY_PLUS(m2, m1, z, p1, c)  (c1 * ((m1)[c] - (z)[c]) + c2 * ((m2)[c] - (p1)[c]))
#define TY_MINUS(m1, z, p1, p2, c) (c1 * ((z)[c] - (p1)[c]) + c2 * ((m1)[c] - (p2)[c]))
/* row k (ring-4 coordinates) of plane p of w: planes wp apart, rows k & mask (mask -1: all of
 * them, one after another; 7: a ring of 8) */
#define WROW(w, p, k) ((w) + (p) * wp + ((k) & mask) * WX)

/* Interior rows of the first pass (no memory variable) and rows of the second, one restrict
 * pointer per array so that GCC vectorises them (as the forward's rows). */
#define DEFINE_ADJOINT_ROWS(real, sfx)                                                             \
static __attribute__((noinline)) void stress_adjoint_row_##sfx(long n, const real *restrict lyy, const real *restrict lxx,  \
        const real *restrict lxy, const real *restrict st0, const real *restrict st1,             \
        const real *restrict st2, const real *restrict lam2mu, const real *restrict lam,          \
        const real *restrict muxy, real *restrict g_lam2mu, real *restrict g_lam,                 \
        real *restrict g_muxy, real *restrict w0, real *restrict w1, real *restrict w2,           \
        real *restrict w3, real dt, real idy, real idx)                                            \
{                                                                                                  \
    for (long j = 0; j < n; j++) {                                                                 \
        const real Lyy = lyy[j], Lxx = lxx[j], Lxy = lxy[j];                                       \
        const real e_xy = (dt * muxy[j]) * Lxy;                                                    \
        const real e_xx = dt * (lam[j] * Lyy + lam2mu[j] * Lxx);                                   \
        const real e_yy = dt * (lam2mu[j] * Lyy + lam[j] * Lxx);                                   \
        g_muxy[j] += dt * Lxy * st2[j];                                                            \
        g_lam[j] += dt * (Lyy * st0[j] + Lxx * st1[j]);                                            \
        g_lam2mu[j] += dt * (Lyy * st1[j] + Lxx * st0[j]);                                         \
        w0[j] = e_yy * idy; w1[j] = e_xx * idx; w2[j] = e_xy * idy; w3[j] = e_xy * idx;            \
    }                                                                                              \
}                                                                                                  \
static __attribute__((noinline)) void velocity_adjoint_row_##sfx(long n, const real *restrict lvy,                          \
        const real *restrict lvx, const real *restrict st0, const real *restrict st1,             \
        const real *restrict buy, const real *restrict bux, real *restrict g_by,                  \
        real *restrict g_bx, real *restrict w0, real *restrict w1, real *restrict w2,             \
        real *restrict w3, real dt, real idy, real idx)                                            \
{                                                                                                  \
    for (long j = 0; j < n; j++) {                                                                 \
        const real Ly = lvy[j], Lx = lvx[j];                                                       \
        g_by[j] += dt * Ly * st0[j];                                                               \
        g_bx[j] += dt * Lx * st1[j];                                                               \
        const real e0 = (dt * buy[j]) * Ly, e2 = (dt * bux[j]) * Lx;                               \
        w0[j] = e0 * idy; w1[j] = e0 * idx; w2[j] = e2 * idx; w3[j] = e2 * idy;                    \
    }                                                                                              \
}                                                                                                  \
static __attribute__((noinline)) void stress_gather_row_##sfx(long n, real *restrict lvy,           \
        real *restrict lvx, const real *restrict a_m1, const real *restrict a_0,                  \
        const real *restrict a_p1, const real *restrict a_p2, const real *restrict w1,            \
        const real *restrict d_m2, const real *restrict d_m1, const real *restrict d_0,           \
        const real *restrict d_p1, const real *restrict w3)                                        \
{                                                                                                  \
    const real c1 = (real)C1, c2 = (real)C2;                                                       \
    for (long c = 0; c < n; c++) {                                                                 \
        lvy[c] = lvy[c] + (TY_MINUS(a_m1, a_0, a_p1, a_p2, c) + T_PLUS(w3, c, 1));                 \
        lvx[c] = lvx[c] + (T_MINUS(w1, c, 1) + TY_PLUS(d_m2, d_m1, d_0, d_p1, c));                 \
    }                                                                                              \
}                                                                                                  \
static __attribute__((noinline)) void velocity_gather_row_##sfx(long n, real *restrict lyy,         \
        real *restrict lxx, real *restrict lxy, const real *restrict a_m2,                        \
        const real *restrict a_m1, const real *restrict a_0, const real *restrict a_p1,           \
        const real *restrict w1, const real *restrict w2, const real *restrict d_m1,              \
        const real *restrict d_0, const real *restrict d_p1, const real *restrict d_p2)           \
{                                                                                                  \
    const real c1 = (real)C1, c2 = (real)C2;                                                       \
    for (long c = 0; c < n; c++) {                                                                 \
        lyy[c] = lyy[c] + TY_PLUS(a_m2, a_m1, a_0, a_p1, c);                                       \
        lxx[c] = lxx[c] + T_PLUS(w2, c, 1);                                                        \
        lxy[c] = lxy[c] + (T_MINUS(w1, c, 1) + TY_MINUS(d_m1, d_0, d_p1, d_p2, c));                \
    }                                                                                              \
}

DEFINE_ADJOINT_ROWS(double, f64)
DEFINE_ADJOINT_ROWS(float, f32)

/* the same rows for compact stores */
#include "elastic_adjoint_compact.c"

#define DEFINE_ADJOINT(real, sfx)                                                                  \
static void stress_adjoint_rows_at_##sfx(long ny, long nx, long r0, long r1, real *ls,            \
                                  real *lp, const real *lam2mu, const real *lam,                  \
                                  const real *muxy, const real *surface, const real *store,       \
                                  long sp, const real *vn,                                        \
                                  real *g_lam2mu, real *g_lam, real *g_muxy, real *g_surface,     \
                                  real *w, long wp, long mask,                                    \
                                  const real *ayi, const real *byi, const real *ayh,              \
                                  const real *byh, const real *axi, const real *bxi,              \
                                  const real *axh, const real *bxh, real dt, real idy, real idx,  \
                                  long jlo, long jhi)                                             \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX, pp = ny * nx, WX = nx + 8;                      \
    real *lyy = ls, *lxx = ls + plane, *lxy = ls + 2 * plane;                                      \
    for (long i = r0; i < r1; i++) {                                                               \
        const int top = surface != NULL && i == 0;                                                 \
        const int ypml = ayi[i] != 0 || ayh[i] != 0;                                               \
        real *w0 = WROW(w, 0, i + 4) + 4, *w1 = w0 + wp, *w2 = w0 + 2 * wp, *w3 = w0 + 3 * wp;     \
        const long ja = (top || ypml || jhi <= jlo) ? nx : jlo;                                   \
        const long jb = (top || ypml || jhi <= jlo) ? nx : jhi;                                   \
        if (jb > ja && vn) {                                                                       \
            const long R0 = (i + 2) * NX + 2 + ja, P0 = i * nx + ja;                               \
            stress_adjoint_row_v_##sfx(jb - ja, NX, lyy + R0, lxx + R0, lxy + R0, vn + R0,         \
                                       vn + plane + R0, lam2mu + P0, lam + P0, muxy + P0,          \
                                       g_lam2mu + P0, g_lam + P0, g_muxy + P0, w0 + ja, w1 + ja,   \
                                       w2 + ja, w3 + ja, dt, idy, idx);                            \
        } else if (jb > ja) {                                                                      \
            const long R0 = (i + 2) * NX + 2 + ja, P0 = i * nx + ja;                               \
            const long S0 = (i - r0) * nx + ja;                                                    \
            stress_adjoint_row_##sfx(jb - ja, lyy + R0, lxx + R0, lxy + R0, store + S0,            \
                                     store + sp + S0, store + 2 * sp + S0, lam2mu + P0, lam + P0,  \
                                     muxy + P0, g_lam2mu + P0, g_lam + P0, g_muxy + P0, w0 + ja,   \
                                     w1 + ja, w2 + ja, w3 + ja, dt, idy, idx);                      \
        }                                                                                          \
        for (long j = 0; j < nx; j++) {                                                            \
            if (j == ja && jb > ja) { j = jb - 1; continue; }                                      \
            const long R = (i + 2) * NX + 2 + j, P = i * nx + j;                                   \
            const real Lyy = lyy[R], Lxx = lxx[R], Lxy = lxy[R];                                   \
            const long S = (i - r0) * nx + j;                                                      \
            const real dvx_dx = store[S], dvy_dy = store[sp + S], shear = store[2 * sp + S];       \
            real e_xx, e_yy, e_xy = (dt * muxy[P]) * Lxy, e_yx;                                    \
            g_muxy[P] += dt * Lxy * shear;                                                         \
            if (top) {                                                                             \
                e_xx = dt * surface[j] * Lxx; e_yy = 0;                                            \
                g_surface[j] += dt * Lxx * dvx_dx;                                                 \
                lyy[R] = 0;                                                                        \
            } else {                                                                               \
                e_xx = dt * (lam[P] * Lyy + lam2mu[P] * Lxx);                                      \
                e_yy = dt * (lam2mu[P] * Lyy + lam[P] * Lxx);                                      \
                g_lam[P] += dt * (Lyy * dvx_dx + Lxx * dvy_dy);                                    \
                g_lam2mu[P] += dt * (Lyy * dvy_dy + Lxx * dvx_dx);                                 \
            }                                                                                      \
            e_yx = e_xy;                                                                           \
            CPML_ADJOINT(4, ayi[i], byi[i], e_yy);                                                 \
            CPML_ADJOINT(5, axi[j], bxi[j], e_xx);                                                 \
            CPML_ADJOINT(6, ayh[i], byh[i], e_xy);                                                 \
            CPML_ADJOINT(7, axh[j], bxh[j], e_yx);                                                 \
            w0[j] = e_yy * idy; w1[j] = e_xx * idx; w2[j] = e_xy * idy; w3[j] = e_yx * idx;        \
        }                                                                                          \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
/* the above with the stores as full (C, ny, nx) planes */                                         \
static void stress_adjoint_rows_##sfx(long ny, long nx, long r0, long r1, real *ls, real *lp,     \
        const real *lam2mu, const real *lam, const real *muxy, const real *surface,               \
        const real *store, real *g_lam2mu, real *g_lam, real *g_muxy, real *g_surface, real *w,   \
        long wp, long mask, const real *ayi, const real *byi, const real *ayh, const real *byh,   \
        const real *axi, const real *bxi, const real *axh, const real *bxh, real dt, real idy,    \
        real idx, long jlo, long jhi)                                                              \
{                                                                                                  \
    stress_adjoint_rows_at_##sfx(ny, nx, r0, r1, ls, lp, lam2mu, lam, muxy, surface,              \
                                 store + r0 * nx, ny * nx, NULL, g_lam2mu, g_lam, g_muxy,         \
                                 g_surface, w,                                                     \
                                 wp, mask, ayi, byi, ayh, byh, axi, bxi, axh, bxh, dt, idy, idx,  \
                                 jlo, jhi);                                                        \
}                                                                                                  \
                                                                                                   \
/* dvy/dy = D-y vy (w0), dvx/dx = D-x vx (w1), dvx/dy = D+y vx (w2), dvy/dx = D+x vy (w3) */      \
static void stress_gather_rows_##sfx(long ny, long nx, long q0, long q1, real *lv, const real *w, \
                                     long wp, long mask)                                           \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX, WX = nx + 8;                                    \
    for (long q = q0; q < q1; q++)                                                                 \
        stress_gather_row_##sfx(NX, lv + q * NX, lv + plane + q * NX, WROW(w, 0, q + 1) + 2,       \
                                WROW(w, 0, q + 2) + 2, WROW(w, 0, q + 3) + 2,                      \
                                WROW(w, 0, q + 4) + 2, WROW(w, 1, q + 2) + 2,                      \
                                WROW(w, 2, q) + 2, WROW(w, 2, q + 1) + 2, WROW(w, 2, q + 2) + 2,   \
                                WROW(w, 2, q + 3) + 2, WROW(w, 3, q + 2) + 2);                     \
}                                                                                                  \
                                                                                                   \
static void velocity_adjoint_rows_at_##sfx(long ny, long nx, long r0, long r1, real *lv,          \
                                    real *lp, const real *buy, const real *bux,                   \
                                    const real *store, long sp, const real *vn, const real *vo,   \
                                    real *gr_y, real *gr_x, real *g_by, real *g_bx, real *w,      \
                                    long wp, long mask,                                           \
                                    const real *ayi, const real *byi, const real *ayh,            \
                                    const real *byh, const real *axi, const real *bxi,            \
                                    const real *axh, const real *bxh, real dt, real idy,          \
                                    real idx, long jlo, long jhi)                                 \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX, pp = ny * nx, WX = nx + 8;                      \
    real *lvy = lv, *lvx = lv + plane;                                                             \
    for (long i = r0; i < r1; i++) {                                                               \
        const int ypml = ayi[i] != 0 || ayh[i] != 0;                                               \
        real *w0 = WROW(w, 0, i + 4) + 4, *w1 = w0 + wp, *w2 = w0 + 2 * wp, *w3 = w0 + 3 * wp;     \
        const long ja = (ypml || jhi <= jlo) ? nx : jlo, jb = (ypml || jhi <= jlo) ? nx : jhi;    \
        if (jb > ja && vn) {                                                                       \
            const long R0 = (i + 2) * NX + 2 + ja, P0 = i * nx + ja;                               \
            velocity_adjoint_row_v_##sfx(jb - ja, lvy + R0, lvx + R0, vn + R0, vo + R0,            \
                                         vn + plane + R0, vo + plane + R0, buy + P0, bux + P0,     \
                                         gr_y + P0, gr_x + P0, w0 + ja, w1 + ja, w2 + ja, w3 + ja, \
                                         dt, idy, idx);                                            \
        } else if (jb > ja) {                                                                      \
            const long R0 = (i + 2) * NX + 2 + ja, P0 = i * nx + ja;                               \
            const long S0 = (i - r0) * nx + ja;                                                    \
            velocity_adjoint_row_##sfx(jb - ja, lvy + R0, lvx + R0, store + S0, store + sp + S0,   \
                                       buy + P0, bux + P0, g_by + P0, g_bx + P0, w0 + ja, w1 + ja, \
                                       w2 + ja, w3 + ja, dt, idy, idx);                             \
        }                                                                                          \
        for (long j = 0; j < nx; j++) {                                                            \
            if (j == ja && jb > ja) { j = jb - 1; continue; }                                      \
            const long R = (i + 2) * NX + 2 + j, P = i * nx + j;                                   \
            const real Ly = lvy[R], Lx = lvx[R];                                                   \
            const long S = (i - r0) * nx + j;                                                      \
            g_by[P] += dt * Ly * store[S];                                                         \
            g_bx[P] += dt * Lx * store[sp + S];                                                    \
            real e0 = (dt * buy[P]) * Ly, e1 = e0, e2 = (dt * bux[P]) * Lx, e3 = e2;               \
            CPML_ADJOINT(0, ayh[i], byh[i], e0);                                                   \
            CPML_ADJOINT(1, axi[j], bxi[j], e1);                                                   \
            CPML_ADJOINT(2, axh[j], bxh[j], e2);                                                   \
            CPML_ADJOINT(3, ayi[i], byi[i], e3);                                                   \
            w0[j] = e0 * idy; w1[j] = e1 * idx; w2[j] = e2 * idx; w3[j] = e3 * idy;                \
        }                                                                                          \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
static void velocity_adjoint_rows_##sfx(long ny, long nx, long r0, long r1, real *lv, real *lp,   \
        const real *buy, const real *bux, const real *store, real *g_by, real *g_bx, real *w,     \
        long wp, long mask, const real *ayi, const real *byi, const real *ayh, const real *byh,   \
        const real *axi, const real *bxi, const real *axh, const real *bxh, real dt, real idy,    \
        real idx, long jlo, long jhi)                                                              \
{                                                                                                  \
    velocity_adjoint_rows_at_##sfx(ny, nx, r0, r1, lv, lp, buy, bux, store + r0 * nx, ny * nx,    \
                                   NULL, NULL, NULL, NULL, g_by, g_bx, w, wp, mask, ayi, byi, ayh, byh, axi, bxi, axh,    \
                                   bxh, dt, idy, idx, jlo, jhi);                                   \
}                                                                                                  \
                                                                                                   \
/* dsyy/dy = D+y syy (w0), dsxy/dx = D-x sxy (w1), dsxx/dx = D+x sxx (w2), dsxy/dy = D-y sxy (w3) */ \
static void velocity_gather_rows_##sfx(long ny, long nx, long q0, long q1, real *ls,              \
                                       const real *w, long wp, long mask)                          \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX, WX = nx + 8;                                    \
    for (long q = q0; q < q1; q++)                                                                 \
        velocity_gather_row_##sfx(NX, ls + q * NX, ls + plane + q * NX, ls + 2 * plane + q * NX,   \
                                  WROW(w, 0, q) + 2, WROW(w, 0, q + 1) + 2, WROW(w, 0, q + 2) + 2, \
                                  WROW(w, 0, q + 3) + 2, WROW(w, 1, q + 2) + 2,                    \
                                  WROW(w, 2, q + 2) + 2, WROW(w, 3, q + 1) + 2,                    \
                                  WROW(w, 3, q + 2) + 2, WROW(w, 3, q + 3) + 2,                    \
                                  WROW(w, 3, q + 4) + 2);                                          \
}                                                                                                  \
                                                                                                   \
/* The kernels and gathers on w's full planes (ny + 8 rows each) */                               \
void elastic_stress_adjoint_##sfx(long ny, long nx, long r0, long r1, real *ls, real *lp,         \
        const real *lam2mu, const real *lam, const real *muxy, const real *surface,               \
        const real *store, real *g_lam2mu, real *g_lam, real *g_muxy, real *g_surface, real *w,   \
        const real *ayi, const real *byi, const real *ayh, const real *byh, const real *axi,      \
        const real *bxi, const real *axh, const real *bxh, real dt, real idy, real idx,           \
        long jlo, long jhi)                                                                        \
{                                                                                                  \
    stress_adjoint_rows_##sfx(ny, nx, r0, r1, ls, lp, lam2mu, lam, muxy, surface, store,          \
                              g_lam2mu, g_lam, g_muxy, g_surface, w, (ny + 8) * (nx + 8), -1,      \
                              ayi, byi, ayh, byh, axi, bxi, axh, bxh, dt, idy, idx, jlo, jhi);     \
}                                                                                                  \
void elastic_velocity_adjoint_##sfx(long ny, long nx, long r0, long r1, real *lv, real *lp,       \
        const real *buy, const real *bux, const real *store, real *g_by, real *g_bx, real *w,     \
        const real *ayi, const real *byi, const real *ayh, const real *byh, const real *axi,      \
        const real *bxi, const real *axh, const real *bxh, real dt, real idy, real idx,           \
        long jlo, long jhi)                                                                        \
{                                                                                                  \
    velocity_adjoint_rows_##sfx(ny, nx, r0, r1, lv, lp, buy, bux, store, g_by, g_bx, w,           \
                                (ny + 8) * (nx + 8), -1, ayi, byi, ayh, byh, axi, bxi, axh, bxh,   \
                                dt, idy, idx, jlo, jhi);                                           \
}                                                                                                  \
void elastic_stress_gather_##sfx(long ny, long nx, long q0, long q1, real *lv, const real *w)     \
{                                                                                                  \
    stress_gather_rows_##sfx(ny, nx, q0, q1, lv, w, (ny + 8) * (nx + 8), -1);                     \
}                                                                                                  \
void elastic_velocity_gather_##sfx(long ny, long nx, long q0, long q1, real *ls, const real *w)   \
{                                                                                                  \
    velocity_gather_rows_##sfx(ny, nx, q0, q1, ls, w, (ny + 8) * (nx + 8), -1);                   \
}

DEFINE_ADJOINT(double, f64)
DEFINE_ADJOINT(float, f32)

/* Both adjoint passes of one shot on one thread, the gathers two rows behind: the ringed row
 * q gathers w of rows q - 4 .. q (ring-4 coordinates), so it runs once row q of the first pass
 * is written.  w is here a ring of 8 rows per plane, (4, 8, nx + 8), zeroed here (rows past the
 * grid before a gather reads them), so it stays in cache (full planes were written to memory and
 * read back).  Same operations, same order per point: the same bits as the two calls. */
#define DEFINE_ADJOINT_SWEEP(real, sfx)                                                            \
static void zero_ring_##sfx(real *w, long nx)                                                     \
{                                                                                                  \
    for (long c = 0; c < 4 * 8 * (nx + 8); c++) w[c] = 0;                                          \
}                                                                                                  \
void elastic_stress_adjoint_sweep_##sfx(long ny, long nx, real *lv, real *ls, real *lp,           \
        const real *lam2mu, const real *lam, const real *muxy, const real *surface,               \
        const real *store, real *g_lam2mu, real *g_lam, real *g_muxy, real *g_surface, real *w,   \
        const real *ayi, const real *byi, const real *ayh, const real *byh, const real *axi,      \
        const real *bxi, const real *axh, const real *bxh, real dt, real idy, real idx,           \
        long jlo, long jhi)                                                                        \
{                                                                                                  \
    const long WX = nx + 8, wp = 8 * WX, mask = 7;                                                 \
    zero_ring_##sfx(w, nx);                                                                        \
    for (long i = 0; i < ny; i++) {                                                                \
        stress_adjoint_rows_##sfx(ny, nx, i, i + 1, ls, lp, lam2mu, lam, muxy, surface, store,    \
                                  g_lam2mu, g_lam, g_muxy, g_surface, w, wp, mask, ayi, byi, ayh,  \
                                  byh, axi, bxi, axh, bxh, dt, idy, idx, jlo, jhi);                \
        stress_gather_rows_##sfx(ny, nx, i, i + 1, lv, w, wp, mask);                               \
    }                                                                                              \
    for (long q = ny; q < ny + 4; q++) {                                                           \
        for (long p = 0; p < 4; p++)                                                               \
            for (long c = 0; c < WX; c++) WROW(w, p, q + 4)[c] = 0;                                \
        stress_gather_rows_##sfx(ny, nx, q, q + 1, lv, w, wp, mask);                               \
    }                                                                                              \
}                                                                                                  \
void elastic_velocity_adjoint_sweep_##sfx(long ny, long nx, real *ls, real *lv, real *lp,         \
        const real *buy, const real *bux, const real *store, real *g_by, real *g_bx, real *w,     \
        const real *ayi, const real *byi, const real *ayh, const real *byh, const real *axi,      \
        const real *bxi, const real *axh, const real *bxh, real dt, real idy, real idx,           \
        long jlo, long jhi)                                                                        \
{                                                                                                  \
    const long WX = nx + 8, wp = 8 * WX, mask = 7;                                                 \
    zero_ring_##sfx(w, nx);                                                                        \
    for (long i = 0; i < ny; i++) {                                                                \
        velocity_adjoint_rows_##sfx(ny, nx, i, i + 1, lv, lp, buy, bux, store, g_by, g_bx, w, wp,  \
                                    mask, ayi, byi, ayh, byh, axi, bxi, axh, bxh, dt, idy, idx,    \
                                    jlo, jhi);                                                     \
        velocity_gather_rows_##sfx(ny, nx, i, i + 1, ls, w, wp, mask);                             \
    }                                                                                              \
    for (long q = ny; q < ny + 4; q++) {                                                           \
        for (long p = 0; p < 4; p++)                                                               \
            for (long c = 0; c < WX; c++) WROW(w, p, q + 4)[c] = 0;                                \
        velocity_gather_rows_##sfx(ny, nx, q, q + 1, ls, w, wp, mask);                             \
    }                                                                                              \
}

DEFINE_ADJOINT_SWEEP(double, f64)
DEFINE_ADJOINT_SWEEP(float, f32)

/* A whole adjoint step of one shot in one sweep over the rows, for one rank without a free
 * surface (no exchange or image between its halves): stress adjoint row i (scratch ws), the
 * gather of ringed velocity-adjoint row i (its w rows are written), velocity adjoint row i - 2
 * (its adjoint velocities are now complete; scratch wv) and the gather of ringed stress-adjoint
 * row i - 2 (field row i - 4, which the stress adjoint has read).  A gather reads 5 rows of w,
 * so ws and wv are rings of 8 rows (4 planes each, (4, 8, nx + 8)), zeroed here, whose rows
 * past the grid are zeroed before a gather reads them: w never goes to memory (the full
 * planes, written and read back each half step, were 16 of about 50 array passes a step).
 * Same operations in the same order per point as the two passes: the same bits.  The rings of
 * lv and ls collect what the caller clears (as after the two passes). */
#define DEFINE_ADJOINT_STEP(real, sfx)                                                             \
static void zero_ring_rows_##sfx(real *w, long nx, long k)                                        \
{                                                                                                  \
    const long WX = nx + 8, wp = 8 * WX, mask = 7;                                                 \
    for (long p = 0; p < 4; p++) {                                                                 \
        real *row = WROW(w, p, k);                                                                 \
        for (long c = 0; c < WX; c++) row[c] = 0;                                                  \
    }                                                                                              \
}                                                                                                  \
void elastic_adjoint_step_##sfx(long ny, long nx, real *lv, real *ls, real *lp,                   \
        const real *buy, const real *bux, const real *lam2mu, const real *lam, const real *muxy,  \
        const real *store_v, const real *store_s, real *g_by, real *g_bx, real *g_lam2mu,         \
        real *g_lam, real *g_muxy, real *ws, real *wv,                                            \
        const real *ayi, const real *byi, const real *ayh, const real *byh, const real *axi,      \
        const real *bxi, const real *axh, const real *bxh, real dt, real idy, real idx,           \
        long jlo, long jhi)                                                                        \
{                                                                                                  \
    const long wp = 8 * (nx + 8), mask = 7;                                                        \
    for (long k = 0; k < 8; k++) { zero_ring_rows_##sfx(ws, nx, k); zero_ring_rows_##sfx(wv, nx, k); } \
    for (long i = 0; i < ny + 4; i++) {                                                            \
        if (i < ny)                                                                                \
            stress_adjoint_rows_##sfx(ny, nx, i, i + 1, ls, lp, lam2mu, lam, muxy, NULL, store_s,  \
                                      g_lam2mu, g_lam, g_muxy, NULL, ws, wp, mask, ayi, byi, ayh,  \
                                      byh, axi, bxi, axh, bxh, dt, idy, idx, jlo, jhi);            \
        if (i + 4 >= ny + 4) zero_ring_rows_##sfx(ws, nx, i + 4);                                 \
        stress_gather_rows_##sfx(ny, nx, i, i + 1, lv, ws, wp, mask);                              \
        if (i >= 2 && i - 2 < ny)                                                                  \
            velocity_adjoint_rows_##sfx(ny, nx, i - 2, i - 1, lv, lp, buy, bux, store_v, g_by,     \
                                        g_bx, wv, wp, mask, ayi, byi, ayh, byh, axi, bxi, axh,     \
                                        bxh, dt, idy, idx, jlo, jhi);                              \
        if (i >= 2) {                                                                              \
            if (i + 2 >= ny + 4) zero_ring_rows_##sfx(wv, nx, i + 2);                             \
            velocity_gather_rows_##sfx(ny, nx, i - 2, i - 1, ls, wv, wp, mask);                    \
        }                                                                                          \
    }                                                                                              \
    for (long q = ny + 2; q < ny + 4; q++) {                                                       \
        zero_ring_rows_##sfx(wv, nx, q + 4);                                                       \
        velocity_gather_rows_##sfx(ny, nx, q, q + 1, ls, wv, wp, mask);                            \
    }                                                                                              \
}

DEFINE_ADJOINT_STEP(double, f64)
DEFINE_ADJOINT_STEP(float, f32)

/* The adjoint step on two threads (one rank, no free surface), a piece of the rows each, then
 * the rows around the cut:
 * in field rows, SA(i) = stress adjoint row i (reads adjoint stress row i, writes ws row i),
 * GL(f) = gather of adjoint velocity row f (reads ws rows f - 2 .. f + 2), VA(f) = velocity
 * adjoint row f (reads the finished adjoint velocity row f, writes wv row f), GS(f) = gather of
 * adjoint stress row f (reads wv rows f - 2 .. f + 2; after SA(f) has read the row).  Around
 * the cut h the first piece runs SA [0, h - 4), GL and VA [0, h - 6), GS [0, h - 8) top down,
 * the second SA [h + 4, ny), GL and VA [h + 6, ny), GS [h + 8, ny) bottom up, at the same
 * time: nothing one touches the other reads.  Each keeps ws and wv in its own rings of 8 rows,
 * which end holding the rows next to the cut; then one thread copies those into rings of 16
 * and 32 rows and runs SA [h - 4, h + 4), GL and VA [h - 6, h + 6), GS [h - 8, h + 8).  The
 * gathers into the ghost rows (cleared by the caller on one rank) are skipped.  Every point's
 * operations are the one-thread step's: the same bits. */
#define DEFINE_ADJOINT_SPLIT(real, sfx)                                                            \
static void adjoint_rows_##sfx(long ny, long nx, real *lv, real *ls, real *lp,                    \
        const real *buy, const real *bux, const real *lam2mu, const real *lam, const real *muxy,  \
        const real *store_v, const real *store_s, real *g_by, real *g_bx, real *g_lam2mu,         \
        real *g_lam, real *g_muxy, real *ws, long wsm, real *wv, long wvm,                        \
        const real *ayi, const real *byi, const real *ayh, const real *byh, const real *axi,      \
        const real *bxi, const real *axh, const real *bxh, real dt, real idy, real idx,           \
        long jlo, long jhi, const long *r, int up)                                                \
{                                                                                                  \
    /* r: SA [r0, r1), GL [r2, r3), VA [r4, r5), GS [r6, r7); up: bottom up */                   \
    const long WX = nx + 8, wsp = (wsm + 1) * WX, wvp = (wvm + 1) * WX;                            \
    long lo = r[0], hi = r[1];                                                                     \
    if (r[2] - 2 < lo) lo = r[2] - 2;                                                              \
    if (r[4] - 2 < lo) lo = r[4] - 2;                                                              \
    if (r[6] - 4 < lo) lo = r[6] - 4;                                                              \
    if (r[3] + 2 > hi) hi = r[3] + 2;                                                              \
    if (r[5] + 2 > hi) hi = r[5] + 2;                                                              \
    if (r[7] + 4 > hi) hi = r[7] + 4;                                                              \
    for (long n = 0; n < hi - lo; n++) {                                                           \
        const long i = up ? hi - 1 - n : lo + n, f = up ? i + 2 : i - 2, g = up ? i + 4 : i - 4; \
        if (i >= r[0] && i < r[1])                                                                 \
            stress_adjoint_rows_##sfx(ny, nx, i, i + 1, ls, lp, lam2mu, lam, muxy, NULL, store_s,  \
                                      g_lam2mu, g_lam, g_muxy, NULL, ws, wsp, wsm, ayi, byi, ayh,  \
                                      byh, axi, bxi, axh, bxh, dt, idy, idx, jlo, jhi);            \
        if (f >= r[2] && f < r[3])                                                                 \
            stress_gather_rows_##sfx(ny, nx, f + 2, f + 3, lv, ws, wsp, wsm);                      \
        if (f >= r[4] && f < r[5])                                                                 \
            velocity_adjoint_rows_##sfx(ny, nx, f, f + 1, lv, lp, buy, bux, store_v, g_by, g_bx,   \
                                        wv, wvp, wvm, ayi, byi, ayh, byh, axi, bxi, axh, bxh, dt,  \
                                        idy, idx, jlo, jhi);                                       \
        if (g >= r[6] && g < r[7])                                                                 \
            velocity_gather_rows_##sfx(ny, nx, g + 2, g + 3, ls, wv, wvp, wvm);                    \
    }                                                                                              \
}                                                                                                  \
static void copy_ring_rows_##sfx(real *dst, long dm, const real *src, long sm, long nx, long k0,  \
                                 long k1)                                                          \
{                                                                                                  \
    const long WX = nx + 8;                                                                        \
    for (long p = 0; p < 4; p++)                                                                   \
        for (long k = k0; k < k1; k++) {                                                           \
            real *d = dst + p * (dm + 1) * WX + (k & dm) * WX;                                     \
            const real *s = src + p * (sm + 1) * WX + (k & sm) * WX;                               \
            for (long c = 0; c < WX; c++) d[c] = s[c];                                             \
        }                                                                                          \
}                                                                                                  \
/* part 0: the first piece, 1: the second, 2: the cut (after both); w: the rings, (4, 8, nx + 8) \
 * ws and wv of the first piece, then of the second, then ws (4, 16, nx + 8) and wv (4, 32,     \
 * nx + 8) of the cut */                                                                          \
void elastic_adjoint_split_##sfx(long ny, long nx, long h, int part, real *lv, real *ls,          \
        real *lp, const real *buy, const real *bux, const real *lam2mu, const real *lam,          \
        const real *muxy, const real *store_v, const real *store_s, real *g_by, real *g_bx,       \
        real *g_lam2mu, real *g_lam, real *g_muxy, real *w,                                        \
        const real *ayi, const real *byi, const real *ayh, const real *byh, const real *axi,      \
        const real *bxi, const real *axh, const real *bxh, real dt, real idy, real idx,           \
        long jlo, long jhi)                                                                        \
{                                                                                                  \
    const long ring = 4 * 8 * (nx + 8);                                                            \
    real *ws0 = w, *wv0 = w + ring, *ws1 = w + 2 * ring, *wv1 = w + 3 * ring;                      \
    real *wsc = w + 4 * ring, *wvc = wsc + 2 * ring;                                               \
    if (part < 2) {                                                                                \
        real *ws = part ? ws1 : ws0, *wv = part ? wv1 : wv0;                                       \
        for (long c = 0; c < ring; c++) { ws[c] = 0; wv[c] = 0; }                                  \
        const long r0[8] = {0, h - 4, 0, h - 6, 0, h - 6, 0, h - 8};                               \
        const long r1[8] = {h + 4, ny, h + 6, ny, h + 6, ny, h + 8, ny};                           \
        adjoint_rows_##sfx(ny, nx, lv, ls, lp, buy, bux, lam2mu, lam, muxy, store_v, store_s,      \
                           g_by, g_bx, g_lam2mu, g_lam, g_muxy, ws, 7, wv, 7, ayi, byi, ayh, byh,  \
                           axi, bxi, axh, bxh, dt, idy, idx, jlo, jhi, part ? r1 : r0, part);      \
        return;                                                                                    \
    }                                                                                              \
    /* zeroed first: the kernels write a row's inner columns only, the gathers read its ring  \
     * (the rows copied in bring their zero ring along) */                                        \
    for (long c = 0; c < 6 * ring; c++) wsc[c] = 0;                                                \
    /* ring-4 row coordinates: field row + 4 */                                                   \
    copy_ring_rows_##sfx(wsc, 15, ws0, 7, nx, h - 8 + 4, h - 4 + 4);                               \
    copy_ring_rows_##sfx(wsc, 15, ws1, 7, nx, h + 4 + 4, h + 8 + 4);                               \
    copy_ring_rows_##sfx(wvc, 31, wv0, 7, nx, h - 10 + 4, h - 6 + 4);                              \
    copy_ring_rows_##sfx(wvc, 31, wv1, 7, nx, h + 6 + 4, h + 10 + 4);                              \
    const long rc[8] = {h - 4, h + 4, h - 6, h + 6, h - 6, h + 6, h - 8, h + 8};                   \
    adjoint_rows_##sfx(ny, nx, lv, ls, lp, buy, bux, lam2mu, lam, muxy, store_v, store_s, g_by,    \
                       g_bx, g_lam2mu, g_lam, g_muxy, wsc, 15, wvc, 31, ayi, byi, ayh, byh, axi,   \
                       bxi, axh, bxh, dt, idy, idx, jlo, jhi, rc, 0);                              \
}

DEFINE_ADJOINT_SPLIT(double, f64)
DEFINE_ADJOINT_SPLIT(float, f32)

#include "elastic_adjoint_run.c"
