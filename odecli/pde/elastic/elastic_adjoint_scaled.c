/* The adjoint steps in scaled variables (included at the end of elastic_adjoint_run.c, whose
 * derive_stress_row_* and ring helpers it uses; one rank, no free surface, compact stores).
 *
 * Why: with u = b lambda_v (buoyancy times the velocities' adjoint) and tau = C lambda_s (the
 * stiffness [[lam+2mu, lam], [lam, lam+2mu]], mu_xy, times the stresses' adjoint), the adjoint
 * step away from the CPML layers is the forward step run with -dt: u += -dt b D_s tau (the
 * forward's velocity row on tau), then tau += -dt C D_v u (its stress row on u), because the
 * staggered differences' transposes are minus each other (D+^T = -D-).  The unscaled adjoint
 * (elastic_adjoint_run.c) instead writes the four weighted derivative adjoints of every point
 * to a ring w and gathers them back with the transposed stencils, twice a step: ~70 row
 * streams a point against ~50 here; what is left is bound by memory bandwidth
 * (adjoint_pass.SCALED_STEPS_PER_THREAD says how two steps a pass share it).  In the layers the CPML's memory variables make the adjoint of a
 * corrected derivative e + a (lp + e) (lp <- b (lp + e)), so there the difference
 * Delta = a (lp + e) is written to the ring w and its transposed differences added as a
 * correction: rows within 2 of a y layer take every term, the other rows only the x terms of
 * the columns within 2 of an x layer (elsewhere Delta is 0).  Round-off apart, the same step.
 *
 * The gradients are summed in the scaled variables too and turned back once a backward by the
 * caller (adjoint_pass.finish_scaled): S1 = sum tau_yy e_yy + tau_xx e_xx, S2 = sum tau_yy e_xx
 * + tau_xx e_yy, S3 = sum tau_xy e_xy (e the forward's corrected strain rates: the stored ones
 * in the layers, the forward's expressions on the stored velocities elsewhere), into the
 * g_lam2mu, g_lam, g_muxy arrays, and gr = sum u (v_new - v_old - force) + the point forces'
 * own term src_val u b (the same step's two summed together) into gr_y, gr_x; then
 * g_lam2mu = dt (lam2mu S1 - lam S2) / det, g_lam = dt (lam2mu S2 - lam S1) / det
 * (det = lam2mu^2 - lam^2), g_muxy = dt S3 / mu_xy, g_b += gr / b^2.  C must be invertible
 * and well conditioned (mu > 0, vs < vp: adjoint_pass.scaled_ok), else the caller takes the
 * unscaled adjoint.  The adjoints enter and leave a segment unscaled (lambda): the segment's
 * first step scales each row where it first touches it (convert_in), its last unscales each
 * row once it is final (convert_out), so no extra pass over the planes.
 *
 * One step's sweep, iteration i (rows of the field):
 *   (0) first touch: u row i, tau row i + 2 (rows 0, 1 at i = 0): scaled (convert_in), then the
 *       receivers' residuals added (pre-scaled by the caller);
 *   (1) row i: S1..S3 (tau row i before its update), Delta of the stress half into ring ws,
 *       u row i += -dt b D_s tau (reads tau rows i - 2 .. i + 2, none updated yet);
 *   (2) row i - 2: u += b G_s(ws) (the correction; reads ws rows i - 4 .. i);
 *   (3) row i - 4: gr (the point forces' part taken out of the change first), Delta of the
 *       velocity half into ring wv, tau row i - 4 += -dt C D_v u (reads u rows i - 6 .. i - 2,
 *       all final); then the point forces' own term of g_b, src_val lambda_v, into gr;
 *   (4) row i - 6: tau += C G_v(wv) (reads wv rows i - 8 .. i - 4); unscaled (convert_out).
 * Several steps in one pass: step j + 1 (earlier in time) runs SCALED_LAG rows behind step j;
 * its iteration i reads tau rows up to i + 2, which step j finishes in its iteration i + 8
 * (SCALED_DEP), and writes only rows step j is done with.  Threads: as elastic_adjoint_run. */

#define SCALED_LAG 8 /* rows step j + 1 works behind step j (>= SCALED_DEP; 12 measured alike) */
#define SCALED_DEP 8  /* rows step j must be ahead (see above) */

/* The staggered 4th-order differences of f at j (rows NX apart), as elastic.c's rows spell them
 * out (the same expressions: the same bits): D- and D+ along y and x, unscaled. */
#define D_MY(f, j, NX) (c1 * ((f)[j] - (f)[(j) - (NX)]) + c2 * ((f)[(j) + (NX)] - (f)[(j) - 2 * (NX)]))
#define D_PY(f, j, NX) (c1 * ((f)[(j) + (NX)] - (f)[j]) + c2 * ((f)[(j) + 2 * (NX)] - (f)[(j) - (NX)]))
#define D_MX(f, j) (c1 * ((f)[j] - (f)[(j) - 1]) + c2 * ((f)[(j) + 1] - (f)[(j) - 2]))
#define D_PX(f, j) (c1 * ((f)[(j) + 1] - (f)[j]) + c2 * ((f)[(j) + 2] - (f)[(j) - 1]))

#define DEFINE_SCALED_ROWS(real, sfx)                                                              \
/* (1) off the layers: S1..S3 from the strain rates of the stored velocities vy, vx, then the    \
 * forward's velocity row with -dt on tau */                                                      \
static __attribute__((noinline)) void scaled_velocity_row_##sfx(long n, long NX,                   \
        real *restrict uy, real *restrict ux, const real *restrict tyy,                           \
        const real *restrict txx, const real *restrict txy, const real *restrict buy,             \
        const real *restrict bux, const real *restrict vy, const real *restrict vx,               \
        real *restrict s1, real *restrict s2, real *restrict s3, real mdt, real idy, real idx)    \
{                                                                                                  \
    const real c1 = (real)C1, c2 = (real)C2;                                                       \
    for (long j = 0; j < n; j++) {                                                                 \
        /* the forward's strain rates of the stored velocities (its stress row's) */             \
        const real dvy_dy = D_MY(vy, j, NX) * idy, dvx_dx = D_MX(vx, j) * idx;                     \
        const real shear = D_PY(vx, j, NX) * idy + D_PX(vy, j) * idx;                              \
        const real Tyy = tyy[j], Txx = txx[j];                                                     \
        s1[j] += Tyy * dvy_dy + Txx * dvx_dx;                                                      \
        s2[j] += Tyy * dvx_dx + Txx * dvy_dy;                                                      \
        s3[j] += txy[j] * shear;                                                                   \
        /* the forward's velocity row on tau */                                                   \
        const real a = D_PY(tyy, j, NX) * idy, b = D_MX(txy, j) * idx;                             \
        const real c = D_PX(txx, j) * idx, d = D_MY(txy, j, NX) * idy;                             \
        uy[j] = uy[j] + (mdt * buy[j]) * (a + b);                                                  \
        ux[j] = ux[j] + (mdt * bux[j]) * (c + d);                                                  \
    }                                                                                              \
}                                                                                                  \
/* (3) every column: gr, then the forward's stress row with -dt on u */                           \
static __attribute__((noinline)) void scaled_stress_row_##sfx(long n, long NX,                     \
        const real *restrict uy, const real *restrict ux, real *restrict tyy,                     \
        real *restrict txx, real *restrict txy, const real *restrict lam2mu,                      \
        const real *restrict lam, const real *restrict muxy, const real *restrict vny,            \
        const real *restrict voy, const real *restrict vnx, const real *restrict vox,             \
        real *restrict gry, real *restrict grx, real mdt, real idy, real idx)                     \
{                                                                                                  \
    const real c1 = (real)C1, c2 = (real)C2;                                                       \
    for (long j = 0; j < n; j++) {                                                                 \
        gry[j] += uy[j] * (vny[j] - voy[j]);                                                       \
        grx[j] += ux[j] * (vnx[j] - vox[j]);                                                       \
        const real dvy_dy = D_MY(uy, j, NX) * idy, dvx_dx = D_MX(ux, j) * idx;                     \
        const real dvx_dy = D_PY(ux, j, NX) * idy, dvy_dx = D_PX(uy, j) * idx;                     \
        tyy[j] = tyy[j] + mdt * (lam[j] * dvx_dx + lam2mu[j] * dvy_dy);                            \
        txx[j] = txx[j] + mdt * (lam2mu[j] * dvx_dx + lam[j] * dvy_dy);                            \
        txy[j] = txy[j] + (mdt * muxy[j]) * (dvx_dy + dvy_dx);                                     \
    }                                                                                              \
}                                                                                                  \
/* (2) u += b G_s(w): y terms (w0 rows f-1 .. f+2, w2 rows f-2 .. f+1) where y, x terms (w1, w3 \
 * of row f) always; pointers at column 0 of field row f */                                      \
static __attribute__((noinline)) void scaled_velocity_correct_##sfx(long n, real *restrict uy,     \
        real *restrict ux, const real *restrict buy, const real *restrict bux,                    \
        const real *restrict a_m1, const real *restrict a_0, const real *restrict a_p1,           \
        const real *restrict a_p2, const real *restrict w1, const real *restrict d_m2,            \
        const real *restrict d_m1, const real *restrict d_0, const real *restrict d_p1,           \
        const real *restrict w3, int y)                                                            \
{                                                                                                  \
    const real c1 = (real)C1, c2 = (real)C2;                                                       \
    if (y)                                                                                         \
        for (long c = 0; c < n; c++) {                                                             \
            uy[c] = uy[c] + buy[c] * (TY_MINUS(a_m1, a_0, a_p1, a_p2, c) + T_PLUS(w3, c, 1));      \
            ux[c] = ux[c] + bux[c] * (T_MINUS(w1, c, 1) + TY_PLUS(d_m2, d_m1, d_0, d_p1, c));      \
        }                                                                                          \
    else                                                                                           \
        for (long c = 0; c < n; c++) {                                                             \
            uy[c] = uy[c] + buy[c] * T_PLUS(w3, c, 1);                                             \
            ux[c] = ux[c] + bux[c] * T_MINUS(w1, c, 1);                                            \
        }                                                                                          \
}                                                                                                  \
/* (4) tau += C G_v(w): y terms (w0 rows f-2 .. f+1, w3 rows f-1 .. f+2) where y, x terms (w1, \
 * w2 of row f) always */                                                                         \
static __attribute__((noinline)) void scaled_stress_correct_##sfx(long n, real *restrict tyy,      \
        real *restrict txx, real *restrict txy, const real *restrict lam2mu,                      \
        const real *restrict lam, const real *restrict muxy, const real *restrict a_m2,           \
        const real *restrict a_m1, const real *restrict a_0, const real *restrict a_p1,           \
        const real *restrict w1, const real *restrict w2, const real *restrict d_m1,              \
        const real *restrict d_0, const real *restrict d_p1, const real *restrict d_p2, int y)    \
{                                                                                                  \
    const real c1 = (real)C1, c2 = (real)C2;                                                       \
    if (y)                                                                                         \
        for (long c = 0; c < n; c++) {                                                             \
            const real gyy = TY_PLUS(a_m2, a_m1, a_0, a_p1, c), gxx = T_PLUS(w2, c, 1);            \
            const real gxy = T_MINUS(w1, c, 1) + TY_MINUS(d_m1, d_0, d_p1, d_p2, c);               \
            tyy[c] = tyy[c] + (lam2mu[c] * gyy + lam[c] * gxx);                                    \
            txx[c] = txx[c] + (lam[c] * gyy + lam2mu[c] * gxx);                                    \
            txy[c] = txy[c] + muxy[c] * gxy;                                                       \
        }                                                                                          \
    else                                                                                           \
        for (long c = 0; c < n; c++) {                                                             \
            const real gxx = T_PLUS(w2, c, 1);                                                     \
            tyy[c] = tyy[c] + lam[c] * gxx;                                                        \
            txx[c] = txx[c] + lam2mu[c] * gxx;                                                     \
            txy[c] = txy[c] + muxy[c] * T_MINUS(w1, c, 1);                                         \
        }                                                                                          \
}

DEFINE_SCALED_ROWS(double, f64)
DEFINE_SCALED_ROWS(float, f32)

#define DEFINE_SCALED_RUN(real, sfx)                                                               \
/* whether a row within dist of field row i is in a y layer */                                    \
static int near_y_layer_##sfx(long ny, long i, long dist, const real *ayi, const real *ayh)        \
{                                                                                                  \
    for (long k = i - dist; k <= i + dist; k++)                                                    \
        if (k >= 0 && k < ny && (ayi[k] != 0 || ayh[k] != 0)) return 1;                           \
    return 0;                                                                                      \
}                                                                                                  \
/* lambda -> scaled (dir 1) or back (dir -1) on field row i of u (B's shot: ub) and tau (tb) */   \
static void scale_u_row_##sfx(long nx, long NX, long plane, long i, real *ub, const real *buy,    \
                              const real *bux, int dir)                                            \
{                                                                                                  \
    real *uy = ub + (i + 2) * NX + 2, *ux = uy + plane;                                            \
    const real *by = buy + i * nx, *bx = bux + i * nx;                                             \
    for (long j = 0; j < nx; j++) {                                                                \
        if (dir > 0) { uy[j] = uy[j] * by[j]; ux[j] = ux[j] * bx[j]; }                             \
        else { uy[j] = uy[j] / by[j]; ux[j] = ux[j] / bx[j]; }                                     \
    }                                                                                              \
}                                                                                                  \
static void scale_tau_row_##sfx(long nx, long NX, long plane, long i, real *tb,                   \
                                const real *lam2mu, const real *lam, const real *muxy, int dir)   \
{                                                                                                  \
    real *tyy = tb + (i + 2) * NX + 2, *txx = tyy + plane, *txy = txx + plane;                     \
    const long P = i * nx;                                                                         \
    for (long j = 0; j < nx; j++) {                                                                \
        const real p = lam2mu[P + j], l = lam[P + j], yy = tyy[j], xx = txx[j];                    \
        if (dir > 0) {                                                                             \
            tyy[j] = p * yy + l * xx; txx[j] = l * yy + p * xx; txy[j] = muxy[P + j] * txy[j];     \
        } else {                                                                                   \
            const real det = p * p - l * l;                                                        \
            tyy[j] = (p * yy - l * xx) / det; txx[j] = (p * xx - l * yy) / det;                    \
            txy[j] = txy[j] / muxy[P + j];                                                         \
        }                                                                                          \
    }                                                                                              \
}                                                                                                  \
/* (1)'s layer part on columns [j0, j1) of row i: S1..S3 from the stored derivatives d0..d2    \
 * (drow: dvx_dx, dvy_dy, shear), Delta of the stress half into ring rows w0..w3; branch-free  \
 * (lp where a = 0 written back unchanged) so that it vectorises */                              \
static __attribute__((noinline)) void scaled_stress_layer_row_##sfx(long n,                        \
        const real *restrict tyy, const real *restrict txx, const real *restrict txy,             \
        const real *restrict d0, const real *restrict d1, const real *restrict d2,                \
        real *restrict s1, real *restrict s2, real *restrict s3, real *restrict p4,               \
        real *restrict p5, real *restrict p6, real *restrict p7, real *restrict w0,               \
        real *restrict w1, real *restrict w2, real *restrict w3, const real *restrict axi,        \
        const real *restrict bxi, const real *restrict axh, const real *restrict bxh, real ayi,   \
        real byi, real ayh, real byh, real dt, real idy, real idx)                                 \
{                                                                                                  \
    for (long j = 0; j < n; j++) {                                                                 \
        const real Tyy = tyy[j], Txx = txx[j], Txy = txy[j];                                       \
        s1[j] += Tyy * d1[j] + Txx * d0[j];                                                        \
        s2[j] += Tyy * d0[j] + Txx * d1[j];                                                        \
        s3[j] += Txy * d2[j];                                                                      \
        const real e = dt * Txy;                                                                   \
        const real b4 = p4[j] + dt * Tyy, b5 = p5[j] + dt * Txx, b6 = p6[j] + e, b7 = p7[j] + e;   \
        p4[j] = ayi != 0 ? byi * b4 : p4[j];                                                       \
        p5[j] = axi[j] != 0 ? bxi[j] * b5 : p5[j];                                                 \
        p6[j] = ayh != 0 ? byh * b6 : p6[j];                                                       \
        p7[j] = axh[j] != 0 ? bxh[j] * b7 : p7[j];                                                 \
        w0[j] = (ayi * b4) * idy; w1[j] = (axi[j] * b5) * idx;                                     \
        w2[j] = (ayh * b6) * idy; w3[j] = (axh[j] * b7) * idx;                                     \
    }                                                                                              \
}                                                                                                  \
/* (3)'s layer part: Delta of the velocity half into ring rows w0..w3 (branch-free, as above) */ \
static __attribute__((noinline)) void scaled_velocity_layer_row_##sfx(long n,                      \
        const real *restrict uy, const real *restrict ux, real *restrict p0, real *restrict p1,   \
        real *restrict p2, real *restrict p3, real *restrict w0, real *restrict w1,               \
        real *restrict w2, real *restrict w3, const real *restrict axi, const real *restrict bxi, \
        const real *restrict axh, const real *restrict bxh, real ayi, real byi, real ayh,         \
        real byh, real dt, real idy, real idx)                                                     \
{                                                                                                  \
    for (long j = 0; j < n; j++) {                                                                 \
        const real e0 = dt * uy[j], e2 = dt * ux[j];                                               \
        const real b0 = p0[j] + e0, b1 = p1[j] + e0, b2 = p2[j] + e2, b3 = p3[j] + e2;             \
        p0[j] = ayh != 0 ? byh * b0 : p0[j];                                                       \
        p1[j] = axi[j] != 0 ? bxi[j] * b1 : p1[j];                                                 \
        p2[j] = axh[j] != 0 ? bxh[j] * b2 : p2[j];                                                 \
        p3[j] = ayi != 0 ? byi * b3 : p3[j];                                                       \
        w0[j] = (ayh * b0) * idy; w1[j] = (axi[j] * b1) * idx;                                     \
        w2[j] = (axh[j] * b2) * idx; w3[j] = (ayi * b3) * idy;                                     \
    }                                                                                              \
}                                                                                                  \
static void scaled_stress_layer_##sfx(long nx, long pp, long i, long j0, long j1,                  \
        const real *tyy, const real *txx, const real *txy, const real *d0, const real *d1,        \
        const real *d2, real *s1, real *s2, real *s3, real *lp, real *w0, real *w1, real *w2,     \
        real *w3, const real *ayi, const real *byi, const real *ayh, const real *byh,             \
        const real *axi, const real *bxi, const real *axh, const real *bxh, real dt, real idy,    \
        real idx)                                                                                  \
{                                                                                                  \
    if (j1 <= j0) return;                                                                          \
    real *p = lp + i * nx + j0;                                                                    \
    scaled_stress_layer_row_##sfx(j1 - j0, tyy + j0, txx + j0, txy + j0, d0 + j0, d1 + j0,         \
                                  d2 + j0, s1 + j0, s2 + j0, s3 + j0, p + 4 * pp, p + 5 * pp,      \
                                  p + 6 * pp, p + 7 * pp, w0 + j0, w1 + j0, w2 + j0, w3 + j0,      \
                                  axi + j0, bxi + j0, axh + j0, bxh + j0, ayi[i], byi[i], ayh[i],  \
                                  byh[i], dt, idy, idx);                                           \
}                                                                                                  \
static void scaled_velocity_layer_##sfx(long nx, long pp, long i, long j0, long j1,                \
        const real *uy, const real *ux, real *lp, real *w0, real *w1, real *w2, real *w3,         \
        const real *ayi, const real *byi, const real *ayh, const real *byh, const real *axi,      \
        const real *bxi, const real *axh, const real *bxh, real dt, real idy, real idx)           \
{                                                                                                  \
    if (j1 <= j0) return;                                                                          \
    real *p = lp + i * nx + j0;                                                                    \
    scaled_velocity_layer_row_##sfx(j1 - j0, uy + j0, ux + j0, p, p + pp, p + 2 * pp, p + 3 * pp,  \
                                    w0 + j0, w1 + j0, w2 + j0, w3 + j0, axi + j0, bxi + j0,        \
                                    axh + j0, bxh + j0, ayi[i], byi[i], ayh[i], byh[i], dt, idy,   \
                                    idx);                                                          \
}                                                                                                  \
static void zero_w_cols_##sfx(real *w0, long wp, long j0, long j1)                                \
{                                                                                                  \
    for (long p = 0; p < 4; p++)                                                                   \
        for (long j = j0; j < j1; j++) w0[p * wp + j] = 0;                                         \
}                                                                                                  \
/* elastic_adjoint_run_*'s parameters: the sums S1..S3 go into g_lam2mu, g_lam, g_muxy, the   \
 * buoyancies' (point forces' included) into gr_y, gr_x; g_by, g_bx, g_src are not used */       \
void elastic_adjoint_scaled_run_##sfx(ADJOINT_RUN_PARAMS(real), int convert_in, int convert_out)  \
{                                                                                                  \
    (void)g_by; (void)g_bx; (void)compact; (void)g_src;                                            \
    real *s1 = g_lam2mu, *s2 = g_lam, *s3 = g_muxy;                                                \
    const unsigned fp_mode = elastic_flush_subnormals(); /* subnormals.c */                       \
    const long NX = nx + 4, plane = (ny + 4) * NX, pp = ny * nx, WX = nx + 8;                      \
    const long cols = jlo + nx - jhi, cstride = 3 * (sy * nx + ny * cols);                         \
    const long ring = 4 * 8 * WX, wp = 8 * WX, mask = 7;                                           \
    const real mdt = -dt;                                                                          \
    /* the interior columns' run [ia, ib) (none: ia = ib = nx) and the columns the x terms of a \
     * correction reach: [0, ea) and [eb, nx) */                                                  \
    const int inner = jhi > jlo; /* as derive_stress_row's and the compact stores' */             \
    const long ia = inner ? jlo : nx, ib = inner ? jhi : nx;                                       \
    const long ea = inner && jlo + 2 < nx ? jlo + 2 : nx, eb = inner && jhi > 2 ? jhi - 2 : 0;     \
    for (long q = 0; q < ny + 6 + (n - 1) * SCALED_LAG; q++) {                                     \
        if (ahead) /* wait for the steps before this call's */                                     \
            for (long spins = 0;                                                                   \
                 __atomic_load_n(ahead, __ATOMIC_ACQUIRE) < q + SCALED_DEP - SCALED_LAG; ++spins)  \
                if (spins > 256) sched_yield();                                                    \
        for (long j = j0; j < j1; j++) {                                                           \
            const long i = q - j * SCALED_LAG;                                                     \
            if (i < 0 || i >= ny + 6) continue;                                                    \
            const int first = convert_in && j == 0, last = convert_out && j == n - 1;              \
            for (long b = 0; b < B; b++) {                                                         \
                real *ub = lv + b * 2 * plane, *tb = ls + b * 3 * plane, *lpb = lp + b * 8 * pp;   \
                real *ws = w + (j * B + b) * 2 * ring, *wv = ws + ring;                            \
                const real *vn = store_v[j] + b * 2 * plane, *vo = vprev[j] + b * 2 * plane;       \
                real *ds = drow + j * 5 * nx;                                                      \
                if (i == 0)                                                                        \
                    for (long c = 0; c < 2 * ring; c++) ws[c] = 0;                                 \
                if (i < ny) { /* (0) */                                                            \
                    const long t_lo = i == 0 ? 0 : i + 2, t_hi = i + 3 < ny ? i + 3 : ny;          \
                    if (first) {                                                                   \
                        scale_u_row_##sfx(nx, NX, plane, i, ub, buy, bux, 1);                      \
                        for (long t = t_lo; t < t_hi; t++)                                         \
                            scale_tau_row_##sfx(nx, NX, plane, t, tb, lam2mu, lam, muxy, 1);       \
                    }                                                                              \
                    for (long k = rv_ptr[i]; k < rv_ptr[i + 1]; k++)                               \
                        ub[rv_at[k]] += rv_val[(j * B + b) * rv_count + k];                        \
                    for (long t = t_lo; t < t_hi; t++)                                             \
                        for (long k = rs_ptr[t]; k < rs_ptr[t + 1]; k++)                           \
                            tb[rs_at[k]] += rs_val[(j * B + b) * rs_count + k];                    \
                }                                                                                  \
                if (i < ny) { /* (1) */                                                            \
                    const long R = (i + 2) * NX + 2, P = i * nx;                                   \
                    real *uy = ub + R, *ux = uy + plane;                                           \
                    const real *tyy = tb + R, *txx = tyy + plane, *txy = txx + plane;              \
                    const int ypml = ayi[i] != 0 || ayh[i] != 0;                                   \
                    const long la = ypml ? nx : ia, lb = ypml ? nx : ib;                           \
                    real *w0 = WROW(ws, 0, i + 4) + 4;                                             \
                    derive_stress_row_##sfx(ny, nx, i, vn, store_s[j] + b * cstride, smap, sy, ds, \
                                            ayi, ayh, idy, idx, jlo, jhi, 1);                      \
                    scaled_stress_layer_##sfx(nx, pp, i, 0, la, tyy, txx, txy, ds, ds + nx,        \
                                              ds + 2 * nx, s1 + P, s2 + P, s3 + P, lpb, w0,        \
                                              w0 + wp, w0 + 2 * wp, w0 + 3 * wp, ayi, byi, ayh,    \
                                              byh, axi, bxi, axh, bxh, dt, idy, idx);              \
                    scaled_stress_layer_##sfx(nx, pp, i, lb, nx, tyy, txx, txy, ds, ds + nx,       \
                                              ds + 2 * nx, s1 + P, s2 + P, s3 + P, lpb, w0,        \
                                              w0 + wp, w0 + 2 * wp, w0 + 3 * wp, ayi, byi, ayh,    \
                                              byh, axi, bxi, axh, bxh, dt, idy, idx);              \
                    if (lb > la) {                                                                 \
                        scaled_velocity_row_##sfx(lb - la, NX, uy + la, ux + la, tyy + la,         \
                                                  txx + la, txy + la, buy + P + la, bux + P + la,  \
                                                  vn + R + la, vn + plane + R + la, s1 + P + la,   \
                                                  s2 + P + la, s3 + P + la, mdt, idy, idx);        \
                        if (near_y_layer_##sfx(ny, i, 4, ayi, ayh))                                \
                            zero_w_cols_##sfx(w0, wp, la, lb);                                     \
                    }                                                                              \
                    if (la > 0)                                                                    \
                        velocity_row_##sfx(la, NX, uy, ux, tyy, txx, txy, buy + P, bux + P, NULL,  \
                                           NULL, mdt, idy, idx);                                   \
                    if (nx > lb)                                                                   \
                        velocity_row_##sfx(nx - lb, NX, uy + lb, ux + lb, tyy + lb, txx + lb,      \
                                           txy + lb, buy + P + lb, bux + P + lb, NULL, NULL, mdt,  \
                                           idy, idx);                                              \
                }                                                                                  \
                if (i >= ny && i < ny + 2) zero_ring_rows_##sfx(ws, nx, i + 4);                    \
                const long f = i - 2;                                                              \
                if (f >= 0 && f < ny) { /* (2) */                                                  \
                    const long R = (f + 2) * NX + 2, P = f * nx;                                   \
                    const int y = near_y_layer_##sfx(ny, f, 2, ayi, ayh);                          \
                    const real *a = WROW(ws, 0, f + 4) + 4, *d = WROW(ws, 2, f + 4) + 4;           \
                    for (int part = 0; part < 2; part++) {                                         \
                        const long e0 = y ? nx : ea, c0 = part == 0 ? 0 : (y || eb < e0 ? e0 : eb), c1 = part == 0 ? e0 : nx; \
                        if (c1 <= c0) continue;                                                    \
                        scaled_velocity_correct_##sfx(c1 - c0, ub + R + c0, ub + plane + R + c0,   \
                            buy + P + c0, bux + P + c0, WROW(ws, 0, f + 3) + 4 + c0, a + c0,       \
                            WROW(ws, 0, f + 5) + 4 + c0, WROW(ws, 0, f + 6) + 4 + c0,              \
                            WROW(ws, 1, f + 4) + 4 + c0, WROW(ws, 2, f + 2) + 4 + c0,              \
                            WROW(ws, 2, f + 3) + 4 + c0, d + c0, WROW(ws, 2, f + 5) + 4 + c0,      \
                            WROW(ws, 3, f + 4) + 4 + c0, y);                                       \
                    }                                                                              \
                }                                                                                  \
                const long r = i - 4;                                                              \
                if (r >= 0 && r < ny) { /* (3) */                                                  \
                    const long R = (r + 2) * NX + 2, P = r * nx;                                   \
                    const real *uy = ub + R, *ux = uy + plane;                                     \
                    real *tyy = tb + R, *txx = tyy + plane, *txy = txx + plane;                    \
                    const int ypml = ayi[r] != 0 || ayh[r] != 0;                                   \
                    const long la = ypml ? nx : ia, lb = ypml ? nx : ib;                           \
                    real *w0 = WROW(wv, 0, r + 4) + 4;                                             \
                    scaled_velocity_layer_##sfx(nx, pp, r, 0, la, uy, ux, lpb, w0, w0 + wp,        \
                                                w0 + 2 * wp, w0 + 3 * wp, ayi, byi, ayh, byh, axi, \
                                                bxi, axh, bxh, dt, idy, idx);                      \
                    scaled_velocity_layer_##sfx(nx, pp, r, lb, nx, uy, ux, lpb, w0, w0 + wp,       \
                                                w0 + 2 * wp, w0 + 3 * wp, ayi, byi, ayh, byh, axi, \
                                                bxi, axh, bxh, dt, idy, idx);                      \
                    if (lb > la && near_y_layer_##sfx(ny, r, 4, ayi, ayh))                         \
                        zero_w_cols_##sfx(w0, wp, la, lb);                                         \
                    /* a row with this shot's point forces: their part taken out of the      \
                     * change per step, (v_new - (v_old + force)) (summed apart, the two large     \
                     * sums at the source cancelled to 1e-5 of the buoyancy gradient, float32) */  \
                    const real *voy = vo + R, *vox = vo + plane + R;                               \
                    if (row_has_force_##sfx(ny, nx, r, b, src_ptr, src_at)) {                      \
                        real *oy = ds + 3 * nx, *ox = ds + 4 * nx;                                 \
                        for (long c = 0; c < nx; c++) { oy[c] = voy[c]; ox[c] = vox[c]; }          \
                        for (long k = src_ptr[r]; k < src_ptr[r + 1]; k++) {                       \
                            const long rest = src_at[k] - b * 2 * plane;                           \
                            if (rest < 0 || rest >= 2 * plane) continue; /* another shot's */     \
                            const long c = rest / plane, gk = src_g[k];                            \
                            (c ? ox : oy)[gk % nx] += src_val[j * src_count + k] * (c ? bux : buy)[gk]; \
                        }                                                                          \
                        voy = oy; vox = ox;                                                        \
                    }                                                                              \
                    scaled_stress_row_##sfx(nx, NX, uy, ux, tyy, txx, txy, lam2mu + P, lam + P,    \
                                            muxy + P, vn + R, voy, vn + plane + R, vox, gr_y + P,  \
                                            gr_x + P, mdt, idy, idx);                              \
                }                                                                                  \
                if (i - 4 >= ny && i - 4 < ny + 2) zero_ring_rows_##sfx(wv, nx, i);                \
                const long g = i - 6;                                                              \
                if (g >= 0 && g < ny) { /* (4) */                                                  \
                    const long R = (g + 2) * NX + 2, P = g * nx;                                   \
                    const int y = near_y_layer_##sfx(ny, g, 2, ayi, ayh);                          \
                    for (int part = 0; part < 2; part++) {                                         \
                        const long e0 = y ? nx : ea, c0 = part == 0 ? 0 : (y || eb < e0 ? e0 : eb), c1 = part == 0 ? e0 : nx; \
                        if (c1 <= c0) continue;                                                    \
                        scaled_stress_correct_##sfx(c1 - c0, tb + R + c0, tb + plane + R + c0,     \
                            tb + 2 * plane + R + c0, lam2mu + P + c0, lam + P + c0, muxy + P + c0, \
                            WROW(wv, 0, g + 2) + 4 + c0, WROW(wv, 0, g + 3) + 4 + c0,              \
                            WROW(wv, 0, g + 4) + 4 + c0, WROW(wv, 0, g + 5) + 4 + c0,              \
                            WROW(wv, 1, g + 4) + 4 + c0, WROW(wv, 2, g + 4) + 4 + c0,              \
                            WROW(wv, 3, g + 3) + 4 + c0, WROW(wv, 3, g + 4) + 4 + c0,              \
                            WROW(wv, 3, g + 5) + 4 + c0, WROW(wv, 3, g + 6) + 4 + c0, y);          \
                    }                                                                              \
                    if (last) {                                                                    \
                        scale_u_row_##sfx(nx, NX, plane, g, ub, buy, bux, -1);                     \
                        scale_tau_row_##sfx(nx, NX, plane, g, tb, lam2mu, lam, muxy, -1);          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            const long r = i - 4;                                                                  \
            /* the point forces of row r: their own part of g_b, src_val lambda_v, into the    \
             * sums gr too (times b^2), where it meets the change's part of the same step (the     \
             * two large and of opposite sign; summed apart and added at the end, they cancelled  \
             * to 2e-5 of the source point's gradient in float32) */                             \
            if (r >= 0 && r < ny)                                                                  \
                for (long k = src_ptr[r]; k < src_ptr[r + 1]; k++) {                               \
                    const long rest = src_at[k] % (2 * plane), c = rest / plane, gk = src_g[k];    \
                    const real bk = (c ? bux : buy)[gk];                                           \
                    (c ? gr_x : gr_y)[gk] += src_val[j * src_count + k] * (lv[src_at[k]] * bk);    \
                }                                                                                  \
        }                                                                                          \
        if (done)                                                                                  \
            __atomic_store_n(done, q, __ATOMIC_RELEASE);                                           \
    }                                                                                              \
    elastic_restore_fp_mode(fp_mode);                                                              \
}

DEFINE_SCALED_RUN(double, f64)
DEFINE_SCALED_RUN(float, f32)
