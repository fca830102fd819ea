/* Fused steps of the 2-D velocity-stress elastic equations (odecli.pde.elastic.reference), on
 * rows [r0, r1) of one shot's block.
 *
 * Velocities v are (2, ny+4, nx+4) (vy, vx) and stresses s (3, ny+4, nx+4) (syy, sxx, sxy), each
 * with a ghost ring of width 2 filled beforehand (halo exchange, free-surface image); the CPML
 * memory variables psi are (8, ny, nx) without a ring; the parameters (buoyancies by, bx,
 * lam + 2 mu, lam, mu at sxy) are (ny, nx); the CPML coefficients are per row (y, at integer
 * and half rows) and per column (x).  Every operation rounds on its own, in the order of the
 * reference's PyTorch expressions (built with -ffp-contract=off), so one step reproduces the
 * reference bit for bit.  Where a CPML coefficient a is 0 (outside the layers) the memory
 * variable stays 0 and d + 0 == d, so its update is skipped there without changing a bit.
 *
 * One pass over the grid per half step (or one per step: elastic_sweep, at the end), against
 * about forty full-size temporaries in eager PyTorch.  Every row runs as row functions with one
 * restrict pointer per array, which GCC vectorises (the same loop inline in the kernel, with
 * pointers derived from one restrict base, stayed scalar: -fopt-info-vec showed no vectorised
 * loop; so they are kept out of line, noinline: inlined into the kernels, GCC vectorised only
 * some of them): columns [jlo, jhi) of rows outside the y layers without memory variables, the
 * rest with the x ones and, in the y layers' rows, the y ones (branch-free); only a
 * free-surface row stays scalar.  Measured as CPU time
 * on one thread (wall time was mostly waiting on a loaded 2-core VM): the interior rows took a
 * 540^2, 50-step forward from 0.156 to 0.079 s (float32), 0.167 to 0.126 s (float64); the
 * layers' rows, 20 % of a 640^2 step when scalar, now cost about what their memory traffic does.
 */
#include <stddef.h>

#define C1 (9.0 / 8.0)
#define C2 (-1.0 / 24.0)


#define DEFINE_ROWS(real, sfx)                                                                     \
static __attribute__((noinline)) void velocity_row_##sfx(long n, long NX, real *restrict vy, real *restrict vx,             \
                               const real *restrict syy, const real *restrict sxx,                \
                               const real *restrict sxy, const real *restrict buy,                \
                               const real *restrict bux, real *restrict st0,                      \
                               real *restrict st1, real dt, real idy, real idx)                    \
{                                                                                                  \
    const real c1 = (real)C1, c2 = (real)C2;                                                       \
    for (long j = 0; j < n; j++) {                                                                 \
        real dsyy_dy = (c1 * (syy[j + NX] - syy[j]) + c2 * (syy[j + 2 * NX] - syy[j - NX])) * idy; \
        real dsxy_dx = (c1 * (sxy[j] - sxy[j - 1]) + c2 * (sxy[j + 1] - sxy[j - 2])) * idx;       \
        real dsxx_dx = (c1 * (sxx[j + 1] - sxx[j]) + c2 * (sxx[j + 2] - sxx[j - 1])) * idx;       \
        real dsxy_dy = (c1 * (sxy[j] - sxy[j - NX]) + c2 * (sxy[j + NX] - sxy[j - 2 * NX])) * idy; \
        vy[j] = vy[j] + (dt * buy[j]) * (dsyy_dy + dsxy_dx);                                       \
        vx[j] = vx[j] + (dt * bux[j]) * (dsxx_dx + dsxy_dy);                                       \
        if (st0) { st0[j] = dsyy_dy + dsxy_dx; st1[j] = dsxx_dx + dsxy_dy; }                       \
    }                                                                                              \
}                                                                                                  \
static __attribute__((noinline)) void stress_row_##sfx(long n, long NX, const real *restrict vy, const real *restrict vx,   \
                             real *restrict syy, real *restrict sxx, real *restrict sxy,          \
                             const real *restrict lam2mu, const real *restrict lam,               \
                             const real *restrict muxy, real *restrict st0, real *restrict st1,   \
                             real *restrict st2, real dt, real idy, real idx)                      \
{                                                                                                  \
    const real c1 = (real)C1, c2 = (real)C2;                                                       \
    for (long j = 0; j < n; j++) {                                                                 \
        real dvy_dy = (c1 * (vy[j] - vy[j - NX]) + c2 * (vy[j + NX] - vy[j - 2 * NX])) * idy;      \
        real dvx_dx = (c1 * (vx[j] - vx[j - 1]) + c2 * (vx[j + 1] - vx[j - 2])) * idx;            \
        real dvx_dy = (c1 * (vx[j + NX] - vx[j]) + c2 * (vx[j + 2 * NX] - vx[j - NX])) * idy;      \
        real dvy_dx = (c1 * (vy[j + 1] - vy[j]) + c2 * (vy[j + 2] - vy[j - 1])) * idx;            \
        syy[j] = syy[j] + dt * (lam[j] * dvx_dx + lam2mu[j] * dvy_dy);                             \
        sxx[j] = sxx[j] + dt * (lam2mu[j] * dvx_dx + lam[j] * dvy_dy);                             \
        sxy[j] = sxy[j] + (dt * muxy[j]) * (dvx_dy + dvy_dx);                                      \
        if (st0) { st0[j] = dvx_dx; st1[j] = dvy_dy; st2[j] = dvx_dy + dvy_dx; }                   \
    }                                                                                              \
}

DEFINE_ROWS(double, f64)
DEFINE_ROWS(float, f32)

/* The same rows inside the CPML layers: every memory variable updated, branch-free, so that GCC
 * vectorises them too.  Where a coefficient a is 0 (b is then 1) psi stays 0 (1 * 0 + 0 * d)
 * and d + 0 == d: the same numbers as skipping it, as the reference (which updates psi
 * everywhere) computes them.  py*: the row's y memory variables; ax*, bx*: the columns'. */
#define DEFINE_PML_ROWS(real, sfx)                                                                 \
static __attribute__((noinline)) void velocity_pml_row_##sfx(long n, long NX, real *restrict vy, real *restrict vx,         \
                                   const real *restrict syy, const real *restrict sxx,            \
                                   const real *restrict sxy, const real *restrict buy,            \
                                   const real *restrict bux, real *restrict st0,                  \
                                   real *restrict st1, real *restrict p0, real *restrict p1,      \
                                   real *restrict p2, real *restrict p3,                          \
                                   const real *restrict axi, const real *restrict bxi,            \
                                   const real *restrict axh, const real *restrict bxh,            \
                                   real ayh, real byh, real ayi, real byi, int yl,                        \
                                   real dt, real idy, real idx)                                   \
{                                                                                                  \
    const real c1 = (real)C1, c2 = (real)C2;                                                       \
    if (yl)                                                                                        \
        for (long j = 0; j < n; j++) {                                                             \
            real dsyy_dy = (c1 * (syy[j + NX] - syy[j]) + c2 * (syy[j + 2 * NX] - syy[j - NX])) * idy;\
            real dsxy_dx = (c1 * (sxy[j] - sxy[j - 1]) + c2 * (sxy[j + 1] - sxy[j - 2])) * idx;    \
            real dsxx_dx = (c1 * (sxx[j + 1] - sxx[j]) + c2 * (sxx[j + 2] - sxx[j - 1])) * idx;    \
            real dsxy_dy = (c1 * (sxy[j] - sxy[j - NX]) + c2 * (sxy[j + NX] - sxy[j - 2 * NX])) * idy;\
            real q1 = bxi[j] * p1[j] + axi[j] * dsxy_dx, q2 = bxh[j] * p2[j] + axh[j] * dsxx_dx;   \
            p1[j] = q1; p2[j] = q2;                                                                \
            dsxy_dx = dsxy_dx + q1; dsxx_dx = dsxx_dx + q2;                                        \
            real q0 = byh * p0[j] + ayh * dsyy_dy, q3 = byi * p3[j] + ayi * dsxy_dy;               \
            p0[j] = q0; p3[j] = q3;                                                                \
            dsyy_dy = dsyy_dy + q0; dsxy_dy = dsxy_dy + q3;                                        \
            vy[j] = vy[j] + (dt * buy[j]) * (dsyy_dy + dsxy_dx);                                   \
            vx[j] = vx[j] + (dt * bux[j]) * (dsxx_dx + dsxy_dy);                                   \
            if (st0) { st0[j] = dsyy_dy + dsxy_dx; st1[j] = dsxx_dx + dsxy_dy; }                   \
        }                                                                                          \
    else  /* rows without a y layer: the y memory variables stay 0 */                              \
        for (long j = 0; j < n; j++) {                                                             \
            real dsyy_dy = (c1 * (syy[j + NX] - syy[j]) + c2 * (syy[j + 2 * NX] - syy[j - NX])) * idy;\
            real dsxy_dx = (c1 * (sxy[j] - sxy[j - 1]) + c2 * (sxy[j + 1] - sxy[j - 2])) * idx;    \
            real dsxx_dx = (c1 * (sxx[j + 1] - sxx[j]) + c2 * (sxx[j + 2] - sxx[j - 1])) * idx;    \
            real dsxy_dy = (c1 * (sxy[j] - sxy[j - NX]) + c2 * (sxy[j + NX] - sxy[j - 2 * NX])) * idy;\
            real q1 = bxi[j] * p1[j] + axi[j] * dsxy_dx, q2 = bxh[j] * p2[j] + axh[j] * dsxx_dx;   \
            p1[j] = q1; p2[j] = q2;                                                                \
            dsxy_dx = dsxy_dx + q1; dsxx_dx = dsxx_dx + q2;                                        \
            vy[j] = vy[j] + (dt * buy[j]) * (dsyy_dy + dsxy_dx);                                   \
            vx[j] = vx[j] + (dt * bux[j]) * (dsxx_dx + dsxy_dy);                                   \
            if (st0) { st0[j] = dsyy_dy + dsxy_dx; st1[j] = dsxx_dx + dsxy_dy; }                   \
        }                                                                                          \
}                                                                                                  \
static __attribute__((noinline)) void stress_pml_row_##sfx(long n, long NX, const real *restrict vy,                        \
                                 const real *restrict vx, real *restrict syy,                     \
                                 real *restrict sxx, real *restrict sxy,                          \
                                 const real *restrict lam2mu, const real *restrict lam,           \
                                 const real *restrict muxy, real *restrict st0,                   \
                                 real *restrict st1, real *restrict st2, real *restrict p4,       \
                                 real *restrict p5, real *restrict p6, real *restrict p7,         \
                                 const real *restrict axi, const real *restrict bxi,              \
                                 const real *restrict axh, const real *restrict bxh,              \
                                 real ayh, real byh, real ayi, real byi, int yl,                          \
                                 real dt, real idy, real idx)                                     \
{                                                                                                  \
    const real c1 = (real)C1, c2 = (real)C2;                                                       \
    if (yl)                                                                                        \
        for (long j = 0; j < n; j++) {                                                             \
            real dvy_dy = (c1 * (vy[j] - vy[j - NX]) + c2 * (vy[j + NX] - vy[j - 2 * NX])) * idy;  \
            real dvx_dx = (c1 * (vx[j] - vx[j - 1]) + c2 * (vx[j + 1] - vx[j - 2])) * idx;         \
            real dvx_dy = (c1 * (vx[j + NX] - vx[j]) + c2 * (vx[j + 2 * NX] - vx[j - NX])) * idy;  \
            real dvy_dx = (c1 * (vy[j + 1] - vy[j]) + c2 * (vy[j + 2] - vy[j - 1])) * idx;         \
            real q5 = bxi[j] * p5[j] + axi[j] * dvx_dx, q7 = bxh[j] * p7[j] + axh[j] * dvy_dx;     \
            p5[j] = q5; p7[j] = q7;                                                                \
            dvx_dx = dvx_dx + q5; dvy_dx = dvy_dx + q7;                                            \
            real q4 = byi * p4[j] + ayi * dvy_dy, q6 = byh * p6[j] + ayh * dvx_dy;                 \
            p4[j] = q4; p6[j] = q6;                                                                \
            dvy_dy = dvy_dy + q4; dvx_dy = dvx_dy + q6;                                            \
            syy[j] = syy[j] + dt * (lam[j] * dvx_dx + lam2mu[j] * dvy_dy);                         \
            sxx[j] = sxx[j] + dt * (lam2mu[j] * dvx_dx + lam[j] * dvy_dy);                         \
            sxy[j] = sxy[j] + (dt * muxy[j]) * (dvx_dy + dvy_dx);                                  \
            if (st0) { st0[j] = dvx_dx; st1[j] = dvy_dy; st2[j] = dvx_dy + dvy_dx; }               \
        }                                                                                          \
    else  /* rows without a y layer: the y memory variables stay 0 */                              \
        for (long j = 0; j < n; j++) {                                                             \
            real dvy_dy = (c1 * (vy[j] - vy[j - NX]) + c2 * (vy[j + NX] - vy[j - 2 * NX])) * idy;  \
            real dvx_dx = (c1 * (vx[j] - vx[j - 1]) + c2 * (vx[j + 1] - vx[j - 2])) * idx;         \
            real dvx_dy = (c1 * (vx[j + NX] - vx[j]) + c2 * (vx[j + 2 * NX] - vx[j - NX])) * idy;  \
            real dvy_dx = (c1 * (vy[j + 1] - vy[j]) + c2 * (vy[j + 2] - vy[j - 1])) * idx;         \
            real q5 = bxi[j] * p5[j] + axi[j] * dvx_dx, q7 = bxh[j] * p7[j] + axh[j] * dvy_dx;     \
            p5[j] = q5; p7[j] = q7;                                                                \
            dvx_dx = dvx_dx + q5; dvy_dx = dvy_dx + q7;                                            \
            syy[j] = syy[j] + dt * (lam[j] * dvx_dx + lam2mu[j] * dvy_dy);                         \
            sxx[j] = sxx[j] + dt * (lam2mu[j] * dvx_dx + lam[j] * dvy_dy);                         \
            sxy[j] = sxy[j] + (dt * muxy[j]) * (dvx_dy + dvy_dx);                                  \
            if (st0) { st0[j] = dvx_dx; st1[j] = dvy_dy; st2[j] = dvx_dy + dvy_dx; }               \
        }                                                                                          \
}

DEFINE_PML_ROWS(double, f64)
DEFINE_PML_ROWS(float, f32)


#define DEFINE_KERNELS(real, sfx)                                                                  \
void elastic_velocity_##sfx(long ny, long nx, long r0, long r1, real *restrict v,                 \
                            const real *restrict s, real *restrict psi,                            \
                            const real *restrict buy, const real *restrict bux,                    \
                            real *restrict store,                                                  \
                            const real *ayi, const real *byi, const real *ayh, const real *byh,   \
                            const real *axi, const real *bxi, const real *axh, const real *bxh,   \
                            real dt, real idy, real idx, long jlo, long jhi)                       \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX, pp = ny * nx;                                   \
    real *vy = v, *vx = v + plane;                                                                 \
    const real *syy = s, *sxx = s + plane, *sxy = s + 2 * plane;                                   \
    real *p0 = psi, *p1 = psi + pp, *p2 = psi + 2 * pp, *p3 = psi + 3 * pp;                        \
    for (long i = r0; i < r1; i++) {                                                               \
        const long R0 = (i + 2) * NX + 2, P0 = i * nx;                                             \
        real *st0 = store ? store + P0 : NULL, *st1 = store ? store + pp + P0 : NULL;              \
        const int ypml = ayh[i] != 0 || ayi[i] != 0;                                               \
        /* the interior columns of a row outside the y layers: no memory variables */             \
        const long a = (ypml || jhi <= jlo) ? nx : jlo, b = (ypml || jhi <= jlo) ? nx : jhi;      \
        for (int part = 0; part < 3; part++) {                                                     \
            const long j0 = part == 0 ? 0 : part == 1 ? a : b, j1 = part == 0 ? a : part == 1 ? b : nx; \
            if (j1 <= j0) continue;                                                                \
            if (part == 1)                                                                         \
                velocity_row_##sfx(j1 - j0, NX, vy + R0 + j0, vx + R0 + j0, syy + R0 + j0,         \
                                   sxx + R0 + j0, sxy + R0 + j0, buy + P0 + j0, bux + P0 + j0,     \
                                   st0 ? st0 + j0 : NULL, st1 ? st1 + j0 : NULL, dt, idy, idx);   \
            else                                                                                   \
                velocity_pml_row_##sfx(j1 - j0, NX, vy + R0 + j0, vx + R0 + j0, syy + R0 + j0,     \
                                       sxx + R0 + j0, sxy + R0 + j0, buy + P0 + j0, bux + P0 + j0, \
                                       st0 ? st0 + j0 : NULL, st1 ? st1 + j0 : NULL,               \
                                       p0 + P0 + j0, p1 + P0 + j0, p2 + P0 + j0, p3 + P0 + j0,     \
                                       axi + j0, bxi + j0, axh + j0, bxh + j0,                     \
                                       ayh[i], byh[i], ayi[i], byi[i], ypml, dt, idy, idx);              \
        }                                                                                          \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
void elastic_stress_##sfx(long ny, long nx, long r0, long r1, const real *restrict v,             \
                          real *restrict s, real *restrict psi, const real *restrict lam2mu,       \
                          const real *restrict lam, const real *restrict muxy,                     \
                          real *restrict store,                                                    \
                          const real *surface,                                                     \
                          const real *ayi, const real *byi, const real *ayh, const real *byh,     \
                          const real *axi, const real *bxi, const real *axh, const real *bxh,     \
                          real dt, real idy, real idx, long jlo, long jhi)                         \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX, pp = ny * nx;                                   \
    const real c1 = (real)C1, c2 = (real)C2;                                                       \
    const real *vy = v, *vx = v + plane;                                                           \
    real *syy = s, *sxx = s + plane, *sxy = s + 2 * plane;                                         \
    real *p4 = psi + 4 * pp, *p5 = psi + 5 * pp, *p6 = psi + 6 * pp, *p7 = psi + 7 * pp;           \
    for (long i = r0; i < r1; i++) {                                                               \
        const long R0 = (i + 2) * NX + 2, P0 = i * nx;                                             \
        const real ayh_i = ayh[i], byh_i = byh[i], ayi_i = ayi[i], byi_i = byi[i];                 \
        if (surface != NULL && i == 0) {  /* the free surface: syy = 0, sxx from dvx/dx alone */  \
            for (long j = 0; j < nx; j++) {                                                        \
                const long R = R0 + j, P = P0 + j;                                                 \
                real dvy_dy = (c1 * (vy[R] - vy[R - NX]) + c2 * (vy[R + NX] - vy[R - 2 * NX])) * idy; \
                real dvx_dx = (c1 * (vx[R] - vx[R - 1]) + c2 * (vx[R + 1] - vx[R - 2])) * idx;    \
                real dvx_dy = (c1 * (vx[R + NX] - vx[R]) + c2 * (vx[R + 2 * NX] - vx[R - NX])) * idy; \
                real dvy_dx = (c1 * (vy[R + 1] - vy[R]) + c2 * (vy[R + 2] - vy[R - 1])) * idx;    \
                if (ayi_i != 0) { p4[P] = byi_i * p4[P] + ayi_i * dvy_dy; dvy_dy = dvy_dy + p4[P]; } \
                if (axi[j] != 0) { p5[P] = bxi[j] * p5[P] + axi[j] * dvx_dx; dvx_dx = dvx_dx + p5[P]; } \
                if (ayh_i != 0) { p6[P] = byh_i * p6[P] + ayh_i * dvx_dy; dvx_dy = dvx_dy + p6[P]; } \
                if (axh[j] != 0) { p7[P] = bxh[j] * p7[P] + axh[j] * dvy_dx; dvy_dx = dvy_dx + p7[P]; } \
                syy[R] = 0;                                                                        \
                sxx[R] = sxx[R] + dt * (surface[j] * dvx_dx);                                      \
                sxy[R] = sxy[R] + (dt * muxy[P]) * (dvx_dy + dvy_dx);                              \
                if (store) {                                                                       \
                    store[P] = dvx_dx; store[pp + P] = dvy_dy; store[2 * pp + P] = dvx_dy + dvy_dx; \
                }                                                                                  \
            }                                                                                      \
            continue;                                                                              \
        }                                                                                          \
        real *st0 = store ? store + P0 : NULL, *st1 = store ? store + pp + P0 : NULL;              \
        real *st2 = store ? store + 2 * pp + P0 : NULL;                                            \
        const int ypml = ayh_i != 0 || ayi_i != 0;                                                 \
        const long a = (ypml || jhi <= jlo) ? nx : jlo, b = (ypml || jhi <= jlo) ? nx : jhi;      \
        for (int part = 0; part < 3; part++) {                                                     \
            const long j0 = part == 0 ? 0 : part == 1 ? a : b, j1 = part == 0 ? a : part == 1 ? b : nx; \
            if (j1 <= j0) continue;                                                                \
            if (part == 1)                                                                         \
                stress_row_##sfx(j1 - j0, NX, vy + R0 + j0, vx + R0 + j0, syy + R0 + j0,           \
                                 sxx + R0 + j0, sxy + R0 + j0, lam2mu + P0 + j0, lam + P0 + j0,    \
                                 muxy + P0 + j0, st0 ? st0 + j0 : NULL, st1 ? st1 + j0 : NULL,     \
                                 st2 ? st2 + j0 : NULL, dt, idy, idx);                             \
            else                                                                                   \
                stress_pml_row_##sfx(j1 - j0, NX, vy + R0 + j0, vx + R0 + j0, syy + R0 + j0,       \
                                     sxx + R0 + j0, sxy + R0 + j0, lam2mu + P0 + j0,               \
                                     lam + P0 + j0, muxy + P0 + j0, st0 ? st0 + j0 : NULL,         \
                                     st1 ? st1 + j0 : NULL, st2 ? st2 + j0 : NULL,                 \
                                     p4 + P0 + j0, p5 + P0 + j0, p6 + P0 + j0, p7 + P0 + j0,       \
                                     axi + j0, bxi + j0, axh + j0, bxh + j0,                       \
                                     ayh_i, byh_i, ayi_i, byi_i, ypml, dt, idy, idx);                    \
        }                                                                                          \
    }                                                                                              \
}

DEFINE_KERNELS(double, f64)
DEFINE_KERNELS(float, f32)

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

#define DEFINE_ADJOINT(real, sfx)                                                                  \
static void stress_adjoint_rows_##sfx(long ny, long nx, long r0, long r1, real *ls,               \
                                  real *lp, const real *lam2mu, const real *lam,                  \
                                  const real *muxy, const real *surface, const real *store,       \
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
        if (jb > ja) {                                                                             \
            const long R0 = (i + 2) * NX + 2 + ja, P0 = i * nx + ja;                               \
            stress_adjoint_row_##sfx(jb - ja, lyy + R0, lxx + R0, lxy + R0, store + P0,            \
                                     store + pp + P0, store + 2 * pp + P0, lam2mu + P0, lam + P0,  \
                                     muxy + P0, g_lam2mu + P0, g_lam + P0, g_muxy + P0, w0 + ja,   \
                                     w1 + ja, w2 + ja, w3 + ja, dt, idy, idx);                      \
        }                                                                                          \
        for (long j = 0; j < nx; j++) {                                                            \
            if (j == ja && jb > ja) { j = jb - 1; continue; }                                      \
            const long R = (i + 2) * NX + 2 + j, P = i * nx + j;                                   \
            const real Lyy = lyy[R], Lxx = lxx[R], Lxy = lxy[R];                                   \
            const real dvx_dx = store[P], dvy_dy = store[pp + P], shear = store[2 * pp + P];       \
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
static void velocity_adjoint_rows_##sfx(long ny, long nx, long r0, long r1, real *lv,             \
                                    real *lp, const real *buy, const real *bux,                   \
                                    const real *store, real *g_by, real *g_bx, real *w,           \
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
        if (jb > ja) {                                                                             \
            const long R0 = (i + 2) * NX + 2 + ja, P0 = i * nx + ja;                               \
            velocity_adjoint_row_##sfx(jb - ja, lvy + R0, lvx + R0, store + P0, store + pp + P0,   \
                                       buy + P0, bux + P0, g_by + P0, g_bx + P0, w0 + ja, w1 + ja, \
                                       w2 + ja, w3 + ja, dt, idy, idx);                             \
        }                                                                                          \
        for (long j = 0; j < nx; j++) {                                                            \
            if (j == ja && jb > ja) { j = jb - 1; continue; }                                      \
            const long R = (i + 2) * NX + 2 + j, P = i * nx + j;                                   \
            const real Ly = lvy[R], Lx = lvx[R];                                                   \
            g_by[P] += dt * Ly * store[P];                                                         \
            g_bx[P] += dt * Lx * store[pp + P];                                                    \
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

/* One whole step of one shot in a single sweep over the rows, for one rank without a free
 * surface (no halo exchange or image between the half steps): velocity row i, the point forces
 * on that row (src_at: flat indices into v, src_val: the values the caller's index_put_ would
 * add), then stress row i - 2, whose stencil reads velocity rows up to i, while the velocity
 * rows still to come read stress rows from i - 1 on.  The stress rows are read by both half
 * steps while they are in cache: about 15 array passes per step instead of 20.  Every point's
 * operations are the half-step kernels', so the bits are theirs.
 *
 * elastic_sweep_rows runs velocity rows [v0, v1) and stress rows [s0, s1) in that order (a
 * stress row j once velocity row j + 2 is done, or, past v1, at the end: velocity row i reads
 * stress rows i - 2 .. i + 2 and stress row j velocity rows j - 2 .. j + 2).  Several threads
 * share a step with it (sweep_phases in fused.py): each piece [a, b) of the rows first sweeps
 * velocity rows [a, b - 2) and stress rows [a + 2, b - 4) (the first piece from 0, the last to
 * ny), which read and write nothing another piece touches in that phase; then, after all
 * pieces, one thread runs each cut h's velocity rows [h - 2, h) and stress rows
 * [h - 4, h + 2), whose stencils cross it.  So two threads also get the one-sweep traffic,
 * bit for bit the one-thread step. */
#define DEFINE_SWEEP(real, sfx)                                                                    \
void elastic_sweep_rows_##sfx(long ny, long nx, long v0, long v1, long s0, long s1, real *v,      \
                         real *s, real *psi, const real *buy,                                     \
                         const real *bux, const real *lam2mu, const real *lam, const real *muxy,  \
                         real *vstore, real *sstore,                                              \
                         const real *ayi, const real *byi, const real *ayh, const real *byh,      \
                         const real *axi, const real *bxi, const real *axh, const real *bxh,      \
                         real dt, real idy, real idx, long jlo, long jhi, long nsrc,              \
                         const long *src_at, const real *src_val)                                 \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX;                                                 \
    for (long j = s0; j < s1 && j < v0 - 2; j++)                                                   \
        elastic_stress_##sfx(ny, nx, j, j + 1, v, s, psi, lam2mu, lam, muxy, sstore, NULL,        \
                             ayi, byi, ayh, byh, axi, bxi, axh, bxh, dt, idy, idx, jlo, jhi);      \
    for (long i = v0; i < v1; i++) {                                                               \
        elastic_velocity_##sfx(ny, nx, i, i + 1, v, s, psi, buy, bux, vstore, ayi, byi, ayh,      \
                               byh, axi, bxi, axh, bxh, dt, idy, idx, jlo, jhi);                   \
        for (long k = 0; k < nsrc; k++)                                                            \
            if ((src_at[k] % plane) / NX - 2 == i) v[src_at[k]] = v[src_at[k]] + src_val[k];       \
        if (i - 2 >= s0 && i - 2 < s1)                                                             \
            elastic_stress_##sfx(ny, nx, i - 2, i - 1, v, s, psi, lam2mu, lam, muxy, sstore, NULL, \
                                 ayi, byi, ayh, byh, axi, bxi, axh, bxh, dt, idy, idx, jlo, jhi);  \
    }                                                                                              \
    for (long j = (v1 > v0 ? v1 : v0) - 2 > s0 ? (v1 > v0 ? v1 : v0) - 2 : s0; j < s1; j++)      \
        elastic_stress_##sfx(ny, nx, j, j + 1, v, s, psi, lam2mu, lam, muxy, sstore, NULL,        \
                             ayi, byi, ayh, byh, axi, bxi, axh, bxh, dt, idy, idx, jlo, jhi);      \
}

DEFINE_SWEEP(double, f64)
DEFINE_SWEEP(float, f32)

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

/* The adjoint step on two threads (one rank, no free surface), as the forward's sweep_phases:
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
