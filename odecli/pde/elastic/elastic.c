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
 * One pass over the grid per half step (or several steps per pass: elastic_run.c), against
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
#include "subnormals.c"

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
    const unsigned fp_mode = elastic_flush_subnormals();                                           \
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
    elastic_restore_fp_mode(fp_mode);                                                              \
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
    const unsigned fp_mode = elastic_flush_subnormals();                                           \
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
    elastic_restore_fp_mode(fp_mode);                                                              \
}

DEFINE_KERNELS(double, f64)
DEFINE_KERNELS(float, f32)

/* several steps in one pass over the rows */
#include "elastic_run.c"

/* the hand-written adjoint of these steps */
#include "elastic_adjoint.c"

/* the staggered parameters' adjoint (materials_grad.py) */
#include "materials_adjoint.c"
