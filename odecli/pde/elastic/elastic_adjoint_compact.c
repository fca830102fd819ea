/* Rows of the adjoint (as stress_adjoint_row_* and velocity_adjoint_row_* in elastic_adjoint.c,
 * which includes this file) for compact stores (elastic_adjoint_run.c, forward_pass.CompactStores):
 * the stores derived from the velocities in place, in the row, where a row buffer cost a second
 * pass over them (the adjoint 0.35-0.45 s slower than with the five stored planes at 1040^2
 * float64, 100 steps; in the row: 0.1-0.15 s).  The stress update's derivatives of the new
 * velocities vy, vx (ringed, rows NX apart) by the forward's expressions (the same bits), the
 * velocity update's sums from the change vn - vo: dt L (vn - vo) / (dt b) is summed as L (vn - vo)
 * into gr_y, gr_x, which the caller divides by the buoyancy once a backward (a division per
 * point and step cost 0.1-0.15 s of the adjoint at 1040^2 float64, 100 steps); round-off apart. */
#define DEFINE_ADJOINT_ROWS_V(real, sfx)                                                           \
static __attribute__((noinline)) void stress_adjoint_row_v_##sfx(long n, long NX, const real *restrict lyy, const real *restrict lxx, \
        const real *restrict lxy, const real *restrict vy, const real *restrict vx,               \
        const real *restrict lam2mu, const real *restrict lam,                                     \
        const real *restrict muxy, real *restrict g_lam2mu, real *restrict g_lam,                 \
        real *restrict g_muxy, real *restrict w0, real *restrict w1, real *restrict w2,           \
        real *restrict w3, real dt, real idy, real idx)                                            \
{                                                                                                  \
    const real c1 = (real)C1, c2 = (real)C2;                                                       \
    for (long j = 0; j < n; j++) {                                                                 \
        const real dvy_dy = (c1 * (vy[j] - vy[j - NX]) + c2 * (vy[j + NX] - vy[j - 2 * NX])) * idy; \
        const real dvx_dx = (c1 * (vx[j] - vx[j - 1]) + c2 * (vx[j + 1] - vx[j - 2])) * idx;       \
        const real dvx_dy = (c1 * (vx[j + NX] - vx[j]) + c2 * (vx[j + 2 * NX] - vx[j - NX])) * idy; \
        const real dvy_dx = (c1 * (vy[j + 1] - vy[j]) + c2 * (vy[j + 2] - vy[j - 1])) * idx;       \
        const real st0 = dvx_dx, st1 = dvy_dy, st2 = dvx_dy + dvy_dx;                              \
        const real Lyy = lyy[j], Lxx = lxx[j], Lxy = lxy[j];                                       \
        const real e_xy = (dt * muxy[j]) * Lxy;                                                    \
        const real e_xx = dt * (lam[j] * Lyy + lam2mu[j] * Lxx);                                   \
        const real e_yy = dt * (lam2mu[j] * Lyy + lam[j] * Lxx);                                   \
        g_muxy[j] += dt * Lxy * st2;                                                               \
        g_lam[j] += dt * (Lyy * st0 + Lxx * st1);                                                  \
        g_lam2mu[j] += dt * (Lyy * st1 + Lxx * st0);                                               \
        w0[j] = e_yy * idy; w1[j] = e_xx * idx; w2[j] = e_xy * idy; w3[j] = e_xy * idx;            \
    }                                                                                              \
}                                                                                                  \
static __attribute__((noinline)) void velocity_adjoint_row_v_##sfx(long n, const real *restrict lvy, \
        const real *restrict lvx, const real *restrict vny, const real *restrict voy,             \
        const real *restrict vnx, const real *restrict vox,                                        \
        const real *restrict buy, const real *restrict bux, real *restrict gr_y,                  \
        real *restrict gr_x, real *restrict w0, real *restrict w1, real *restrict w2,             \
        real *restrict w3, real dt, real idy, real idx)                                            \
{                                                                                                  \
    for (long j = 0; j < n; j++) {                                                                 \
        const real Ly = lvy[j], Lx = lvx[j];                                                       \
        gr_y[j] += Ly * (vny[j] - voy[j]);                                                         \
        gr_x[j] += Lx * (vnx[j] - vox[j]);                                                         \
        const real e0 = (dt * buy[j]) * Ly, e2 = (dt * bux[j]) * Lx;                               \
        w0[j] = e0 * idy; w1[j] = e0 * idx; w2[j] = e2 * idx; w3[j] = e2 * idy;                    \
    }                                                                                              \
}

DEFINE_ADJOINT_ROWS_V(double, f64)
DEFINE_ADJOINT_ROWS_V(float, f32)
