/* One thread's work in an elastic half step, and in its adjoint: the text both the CUDA kernels
 * (compiled by NVRTC, cuda_build.cuda_source) and their host build (the system C compiler,
 * cuda_build.host_source, which calls each once per (block, thread) in a loop) include, so the
 * arithmetic the tests run on the CPU is the GPU's.  The includer defines REAL (float or
 * double) and DEVICE (a function qualifier).
 *
 * Layouts as elastic.c's, with B shots one after another: velocities v (B, 2, ny+4, nx+4)
 * (vy, vx) and stresses s (B, 3, ny+4, nx+4) (syy, sxx, sxy) with a ghost ring of width 2 that
 * the caller fills between the half steps (free-surface image; zeros otherwise); CPML memory
 * variables psi (B, 8, ny, nx); the staggered parameters (ny, nx), the free-surface row's
 * coefficient (nx) or NULL; the CPML coefficients per row (y) and per column (x); the store of
 * a step's corrected derivative sums (B, 2, ny, nx) after the velocity half step and
 * (B, 3, ny, nx) after the stress one, or NULL.
 *
 * A thread makes point (i, j) of every shot in turn (one thread block is a tile of TILE_X x
 * TILE_Y points), with elastic.c's operations in elastic.c's order, each rounded on its own
 * (both builds turn contraction into fused multiply-adds off): a step is the PyTorch
 * reference's bit for bit, as elastic.c's is.  Where a CPML coefficient a is 0 the memory
 * variable stays 0 and is not touched (d + 0 == d).
 *
 * The adjoint is elastic_adjoint.c's gather form, one thread per point and no atomics: the
 * point kernels read the adjoints after the step, add the parameter gradients of their own
 * point (every shot in turn, in shot order, as the CPU's), run the memory variables' adjoints
 * and write the four weighted derivative adjoints of each point into w (B, 4, ny+8, nx+8),
 * whose ring of width 4 stays 0; the gather kernels then make each point of the ringed adjoint
 * fields (ny+4) x (nx+4) from w at the points whose differences read it (the transposes of the
 * forward's stencils).  Sums round as elastic_adjoint.c's two-pass kernels round them.
 */

typedef long long odecli_i64;

#define TILE_X 32
#define TILE_Y 8

#define EC1 (9.0 / 8.0)
#define EC2 (-1.0 / 24.0)

/* the point (i, j) thread `thread` of block `block` makes, on a grid of `rows` x `cols`
 * covered by tiles_x tiles per row; 0 if it lies outside */
DEVICE int elastic_point(odecli_i64 block, odecli_i64 thread, odecli_i64 rows, odecli_i64 cols,
                         odecli_i64 tiles_x, odecli_i64 *i, odecli_i64 *j)
{
    /* 32-bit division (a 64-bit one is a long instruction sequence on a GPU); blocks < 2^31 */
    const unsigned tile = (unsigned)block, across = (unsigned)tiles_x, lane = (unsigned)thread;
    *i = (odecli_i64)((tile / across) * TILE_Y + lane / TILE_X);
    *j = (odecli_i64)((tile % across) * TILE_X + lane % TILE_X);
    return *i < rows && *j < cols;
}

/* a derivative d corrected by its memory variable *p (psi <- b psi + a d; d + psi) */
#define CPML(p, a, b, d) do { if ((a) != 0) { *(p) = (b) * *(p) + (a) * (d); (d) = (d) + *(p); } } while (0)

DEVICE void elastic_velocity_thread(odecli_i64 block, odecli_i64 thread, odecli_i64 B,
                                    odecli_i64 ny, odecli_i64 nx, odecli_i64 tiles_x, REAL *v,
                                    const REAL *s, REAL *psi, const REAL *buy, const REAL *bux,
                                    REAL *store, const REAL *ayi, const REAL *byi,
                                    const REAL *ayh, const REAL *byh, const REAL *axi,
                                    const REAL *bxi, const REAL *axh, const REAL *bxh, REAL dt,
                                    REAL idy, REAL idx)
{
    odecli_i64 i, j;
    if (!elastic_point(block, thread, ny, nx, tiles_x, &i, &j))
        return;
    const REAL c1 = (REAL)EC1, c2 = (REAL)EC2;
    const odecli_i64 NX = nx + 4, plane = (ny + 4) * NX, pp = ny * nx;
    const odecli_i64 R = (i + 2) * NX + j + 2, P = i * nx + j;
    const REAL ay_h = ayh[i], by_h = byh[i], ay_i = ayi[i], by_i = byi[i];
    const REAL ax_i = axi[j], bx_i = bxi[j], ax_h = axh[j], bx_h = bxh[j];
    const REAL dby = dt * buy[P], dbx = dt * bux[P];
    for (odecli_i64 b = 0; b < B; ++b) {
        REAL *vy = v + 2 * b * plane, *vx = vy + plane;
        const REAL *syy = s + 3 * b * plane, *sxx = syy + plane, *sxy = syy + 2 * plane;
        REAL *p = psi + 8 * b * pp + P;
        REAL dsyy_dy = (c1 * (syy[R + NX] - syy[R]) + c2 * (syy[R + 2 * NX] - syy[R - NX])) * idy;
        REAL dsxy_dx = (c1 * (sxy[R] - sxy[R - 1]) + c2 * (sxy[R + 1] - sxy[R - 2])) * idx;
        REAL dsxx_dx = (c1 * (sxx[R + 1] - sxx[R]) + c2 * (sxx[R + 2] - sxx[R - 1])) * idx;
        REAL dsxy_dy = (c1 * (sxy[R] - sxy[R - NX]) + c2 * (sxy[R + NX] - sxy[R - 2 * NX])) * idy;
        CPML(p, ay_h, by_h, dsyy_dy);
        CPML(p + pp, ax_i, bx_i, dsxy_dx);
        CPML(p + 2 * pp, ax_h, bx_h, dsxx_dx);
        CPML(p + 3 * pp, ay_i, by_i, dsxy_dy);
        const REAL sum_y = dsyy_dy + dsxy_dx, sum_x = dsxx_dx + dsxy_dy;
        vy[R] = vy[R] + dby * sum_y;
        vx[R] = vx[R] + dbx * sum_x;
        if (store) {
            store[2 * b * pp + P] = sum_y;
            store[(2 * b + 1) * pp + P] = sum_x;
        }
    }
}

DEVICE void elastic_stress_thread(odecli_i64 block, odecli_i64 thread, odecli_i64 B,
                                  odecli_i64 ny, odecli_i64 nx, odecli_i64 tiles_x, const REAL *v,
                                  REAL *s, REAL *psi, const REAL *lam2mu, const REAL *lam,
                                  const REAL *muxy, REAL *store, const REAL *surface,
                                  const REAL *ayi, const REAL *byi, const REAL *ayh,
                                  const REAL *byh, const REAL *axi, const REAL *bxi,
                                  const REAL *axh, const REAL *bxh, REAL dt, REAL idy, REAL idx)
{
    odecli_i64 i, j;
    if (!elastic_point(block, thread, ny, nx, tiles_x, &i, &j))
        return;
    const REAL c1 = (REAL)EC1, c2 = (REAL)EC2;
    const odecli_i64 NX = nx + 4, plane = (ny + 4) * NX, pp = ny * nx;
    const odecli_i64 R = (i + 2) * NX + j + 2, P = i * nx + j;
    const REAL ay_h = ayh[i], by_h = byh[i], ay_i = ayi[i], by_i = byi[i];
    const REAL ax_i = axi[j], bx_i = bxi[j], ax_h = axh[j], bx_h = bxh[j];
    const REAL l2m = lam2mu[P], l = lam[P], dmu = dt * muxy[P];
    const int top = surface != 0 && i == 0;
    for (odecli_i64 b = 0; b < B; ++b) {
        const REAL *vy = v + 2 * b * plane, *vx = vy + plane;
        REAL *syy = s + 3 * b * plane, *sxx = syy + plane, *sxy = syy + 2 * plane;
        REAL *p = psi + (8 * b + 4) * pp + P;
        REAL dvy_dy = (c1 * (vy[R] - vy[R - NX]) + c2 * (vy[R + NX] - vy[R - 2 * NX])) * idy;
        REAL dvx_dx = (c1 * (vx[R] - vx[R - 1]) + c2 * (vx[R + 1] - vx[R - 2])) * idx;
        REAL dvx_dy = (c1 * (vx[R + NX] - vx[R]) + c2 * (vx[R + 2 * NX] - vx[R - NX])) * idy;
        REAL dvy_dx = (c1 * (vy[R + 1] - vy[R]) + c2 * (vy[R + 2] - vy[R - 1])) * idx;
        CPML(p, ay_i, by_i, dvy_dy);
        CPML(p + pp, ax_i, bx_i, dvx_dx);
        CPML(p + 2 * pp, ay_h, by_h, dvx_dy);
        CPML(p + 3 * pp, ax_h, bx_h, dvy_dx);
        const REAL shear = dvx_dy + dvy_dx;
        if (top) { /* the free surface: syy = 0, sxx from dvx/dx alone */
            syy[R] = 0;
            sxx[R] = sxx[R] + dt * (surface[j] * dvx_dx);
        } else {
            syy[R] = syy[R] + dt * (l * dvx_dx + l2m * dvy_dy);
            sxx[R] = sxx[R] + dt * (l2m * dvx_dx + l * dvy_dy);
        }
        sxy[R] = sxy[R] + dmu * shear;
        if (store) {
            REAL *st = store + 3 * b * pp + P;
            st[0] = dvx_dx;
            st[pp] = dvy_dy;
            st[2 * pp] = shear;
        }
    }
}

/* the memory variable's adjoint (elastic_adjoint.c's CPML_ADJOINT) on adjoint e */
#define CPML_T(lp, a, b, e) do { if ((a) != 0) { const REAL pb = *(lp) + (e); *(lp) = (b) * pb; (e) = (e) + (a) * pb; } } while (0)

DEVICE void elastic_stress_adjoint_thread(odecli_i64 block, odecli_i64 thread, odecli_i64 B,
                                          odecli_i64 ny, odecli_i64 nx, odecli_i64 tiles_x,
                                          REAL *ls, REAL *lp, const REAL *lam2mu,
                                          const REAL *lam, const REAL *muxy, const REAL *surface,
                                          const REAL *store, REAL *g_lam2mu, REAL *g_lam,
                                          REAL *g_muxy, REAL *g_surface, REAL *w,
                                          const REAL *ayi, const REAL *byi, const REAL *ayh,
                                          const REAL *byh, const REAL *axi, const REAL *bxi,
                                          const REAL *axh, const REAL *bxh, REAL dt, REAL idy,
                                          REAL idx)
{
    odecli_i64 i, j;
    if (!elastic_point(block, thread, ny, nx, tiles_x, &i, &j))
        return;
    const odecli_i64 NX = nx + 4, plane = (ny + 4) * NX, pp = ny * nx;
    const odecli_i64 WX = nx + 8, wp = (ny + 8) * WX;
    const odecli_i64 R = (i + 2) * NX + j + 2, P = i * nx + j, Q = (i + 4) * WX + j + 4;
    const int top = surface != 0 && i == 0;
    REAL gm = g_muxy[P], gl = top ? (REAL)0 : g_lam[P], g2 = top ? (REAL)0 : g_lam2mu[P];
    REAL gs = top ? g_surface[j] : (REAL)0;
    for (odecli_i64 b = 0; b < B; ++b) {
        REAL *lyy = ls + 3 * b * plane, *lxx = lyy + plane, *lxy = lyy + 2 * plane;
        const REAL *st = store + 3 * b * pp + P;
        REAL *q = lp + (8 * b + 4) * pp + P;
        REAL *wb = w + 4 * b * wp + Q;
        const REAL Lyy = lyy[R], Lxx = lxx[R], Lxy = lxy[R];
        const REAL dvx_dx = st[0], dvy_dy = st[pp], shear = st[2 * pp];
        REAL e_xx, e_yy, e_xy = (dt * muxy[P]) * Lxy, e_yx;
        gm += dt * Lxy * shear;
        if (top) {
            e_xx = dt * surface[j] * Lxx;
            e_yy = 0;
            gs += dt * Lxx * dvx_dx;
            lyy[R] = 0;
        } else {
            e_xx = dt * (lam[P] * Lyy + lam2mu[P] * Lxx);
            e_yy = dt * (lam2mu[P] * Lyy + lam[P] * Lxx);
            gl += dt * (Lyy * dvx_dx + Lxx * dvy_dy);
            g2 += dt * (Lyy * dvy_dy + Lxx * dvx_dx);
        }
        e_yx = e_xy;
        CPML_T(q, ayi[i], byi[i], e_yy);
        CPML_T(q + pp, axi[j], bxi[j], e_xx);
        CPML_T(q + 2 * pp, ayh[i], byh[i], e_xy);
        CPML_T(q + 3 * pp, axh[j], bxh[j], e_yx);
        wb[0] = e_yy * idy;
        wb[wp] = e_xx * idx;
        wb[2 * wp] = e_xy * idy;
        wb[3 * wp] = e_yx * idx;
    }
    g_muxy[P] = gm;
    if (top) {
        g_surface[j] = gs;
    } else {
        g_lam[P] = gl;
        g_lam2mu[P] = g2;
    }
}

DEVICE void elastic_velocity_adjoint_thread(odecli_i64 block, odecli_i64 thread, odecli_i64 B,
                                            odecli_i64 ny, odecli_i64 nx, odecli_i64 tiles_x,
                                            REAL *lv, REAL *lp, const REAL *buy, const REAL *bux,
                                            const REAL *store, REAL *g_by, REAL *g_bx, REAL *w,
                                            const REAL *ayi, const REAL *byi, const REAL *ayh,
                                            const REAL *byh, const REAL *axi, const REAL *bxi,
                                            const REAL *axh, const REAL *bxh, REAL dt, REAL idy,
                                            REAL idx)
{
    odecli_i64 i, j;
    if (!elastic_point(block, thread, ny, nx, tiles_x, &i, &j))
        return;
    const odecli_i64 NX = nx + 4, plane = (ny + 4) * NX, pp = ny * nx;
    const odecli_i64 WX = nx + 8, wp = (ny + 8) * WX;
    const odecli_i64 R = (i + 2) * NX + j + 2, P = i * nx + j, Q = (i + 4) * WX + j + 4;
    REAL gy = g_by[P], gx = g_bx[P];
    for (odecli_i64 b = 0; b < B; ++b) {
        const REAL *lvy = lv + 2 * b * plane, *lvx = lvy + plane;
        const REAL *st = store + 2 * b * pp + P;
        REAL *q = lp + 8 * b * pp + P;
        REAL *wb = w + 4 * b * wp + Q;
        const REAL Ly = lvy[R], Lx = lvx[R];
        gy += dt * Ly * st[0];
        gx += dt * Lx * st[pp];
        REAL e0 = (dt * buy[P]) * Ly, e1 = e0, e2 = (dt * bux[P]) * Lx, e3 = e2;
        CPML_T(q, ayh[i], byh[i], e0);
        CPML_T(q + pp, axi[j], bxi[j], e1);
        CPML_T(q + 2 * pp, axh[j], bxh[j], e2);
        CPML_T(q + 3 * pp, ayi[i], byi[i], e3);
        wb[0] = e0 * idy;
        wb[wp] = e1 * idx;
        wb[2 * wp] = e2 * idx;
        wb[3 * wp] = e3 * idy;
    }
    g_by[P] = gy;
    g_bx[P] = gx;
}

/* W(k, dr, dc): plane k of shot b's w at (dr, dc) from the gathered point */
#define W(k, dr, dc) wb[(k) * wp + (dr) * WX + (dc)]

/* the stress adjoint's gather: dvy/dy = D-y vy (w0), dvx/dx = D-x vx (w1), dvx/dy = D+y vx
 * (w2), dvy/dx = D+x vy (w3) transposed onto ringed point (q, c) of lv */
DEVICE void elastic_stress_gather_thread(odecli_i64 block, odecli_i64 thread, odecli_i64 B,
                                         odecli_i64 ny, odecli_i64 nx, odecli_i64 tiles_x,
                                         REAL *lv, const REAL *w)
{
    odecli_i64 q, c;
    if (!elastic_point(block, thread, ny + 4, nx + 4, tiles_x, &q, &c))
        return;
    const REAL c1 = (REAL)EC1, c2 = (REAL)EC2;
    const odecli_i64 NX = nx + 4, plane = (ny + 4) * NX, WX = nx + 8, wp = (ny + 8) * WX;
    const odecli_i64 R = q * NX + c, Q = (q + 2) * WX + c + 2;
    for (odecli_i64 b = 0; b < B; ++b) {
        const REAL *wb = w + 4 * b * wp + Q;
        REAL *lvy = lv + 2 * b * plane, *lvx = lvy + plane;
        lvy[R] = lvy[R] + ((c1 * (W(0, 0, 0) - W(0, 1, 0)) + c2 * (W(0, -1, 0) - W(0, 2, 0)))
                           + (c1 * (W(3, 0, -1) - W(3, 0, 0)) + c2 * (W(3, 0, -2) - W(3, 0, 1))));
        lvx[R] = lvx[R] + ((c1 * (W(1, 0, 0) - W(1, 0, 1)) + c2 * (W(1, 0, -1) - W(1, 0, 2)))
                           + (c1 * (W(2, -1, 0) - W(2, 0, 0)) + c2 * (W(2, -2, 0) - W(2, 1, 0))));
    }
}

/* the velocity adjoint's gather: dsyy/dy = D+y syy (w0), dsxy/dx = D-x sxy (w1), dsxx/dx =
 * D+x sxx (w2), dsxy/dy = D-y sxy (w3) transposed onto ringed point (q, c) of ls */
DEVICE void elastic_velocity_gather_thread(odecli_i64 block, odecli_i64 thread, odecli_i64 B,
                                           odecli_i64 ny, odecli_i64 nx, odecli_i64 tiles_x,
                                           REAL *ls, const REAL *w)
{
    odecli_i64 q, c;
    if (!elastic_point(block, thread, ny + 4, nx + 4, tiles_x, &q, &c))
        return;
    const REAL c1 = (REAL)EC1, c2 = (REAL)EC2;
    const odecli_i64 NX = nx + 4, plane = (ny + 4) * NX, WX = nx + 8, wp = (ny + 8) * WX;
    const odecli_i64 R = q * NX + c, Q = (q + 2) * WX + c + 2;
    for (odecli_i64 b = 0; b < B; ++b) {
        const REAL *wb = w + 4 * b * wp + Q;
        REAL *lyy = ls + 3 * b * plane, *lxx = lyy + plane, *lxy = lyy + 2 * plane;
        lyy[R] = lyy[R] + (c1 * (W(0, -1, 0) - W(0, 0, 0)) + c2 * (W(0, -2, 0) - W(0, 1, 0)));
        lxx[R] = lxx[R] + (c1 * (W(2, 0, -1) - W(2, 0, 0)) + c2 * (W(2, 0, -2) - W(2, 0, 1)));
        lxy[R] = lxy[R] + ((c1 * (W(1, 0, 0) - W(1, 0, 1)) + c2 * (W(1, 0, -1) - W(1, 0, 2)))
                           + (c1 * (W(3, 0, 0) - W(3, 1, 0)) + c2 * (W(3, -1, 0) - W(3, 2, 0))));
    }
}

/* What runs between the half steps, as small kernels rather than several torch operations a
 * step each (their launches cost the host about as much as a half step's kernel costs the GPU
 * at 2000^2).  Thread `t` of a launch is block * (TILE_X * TILE_Y) + thread. */
#define FLAT(block, thread) ((block) * (TILE_X * TILE_Y) + (thread))

/* The free-surface image of ringed f (B, C, ny+4, nx+4) (reference.mirror_top): ghost rows 0
 * and 1 of channel c become rows r_c0 and r_c1 times sign_c; a thread per (b, c, ghost row,
 * column).  No thread reads a row another writes (r_c0, r_c1 >= 2). */
DEVICE void elastic_image_thread(odecli_i64 block, odecli_i64 thread, odecli_i64 B, odecli_i64 C,
                                 odecli_i64 ny, odecli_i64 nx, REAL *f, odecli_i64 r00,
                                 odecli_i64 r01, odecli_i64 r10, odecli_i64 r11, odecli_i64 r20,
                                 odecli_i64 r21, REAL s0, REAL s1, REAL s2)
{
    const odecli_i64 NX = nx + 4, t = FLAT(block, thread);
    if (t >= B * C * 2 * NX)
        return;
    const odecli_i64 j = t % NX, g = (t / NX) % 2, c = (t / (2 * NX)) % C, b = t / (2 * C * NX);
    const odecli_i64 row = c == 0 ? (g ? r01 : r00) : c == 1 ? (g ? r11 : r10) : (g ? r21 : r20);
    const REAL sign = c == 0 ? s0 : c == 1 ? s1 : s2;
    REAL *plane = f + (b * C + c) * (ny + 4) * NX;
    plane[g * NX + j] = plane[row * NX + j] * sign;
}

/* The image's adjoint and the ring cleared, on ringed adjoint fields f (FusedLoop's
 * _exchange_adjoint, one rank): with a free surface (surface != 0) ghost rows 0 and 1 of
 * channel c are folded back onto rows r_c0 and r_c1 (times sign_c), then the ring is zeroed.
 * Threads per (b, c): one per column k < nx+4 (the fold in the inner columns, then the ring
 * rows 0, 1, ny+2, ny+3 of column k), then one per inner row (its ring columns), so no two
 * threads touch the same cell.  (Row r_c0's ring columns, which torch folds into and then
 * clears, are only cleared: the same result.) */
DEVICE void elastic_fold_thread(odecli_i64 block, odecli_i64 thread, odecli_i64 B, odecli_i64 C,
                                odecli_i64 ny, odecli_i64 nx, REAL *f, odecli_i64 surface,
                                odecli_i64 r00, odecli_i64 r01, odecli_i64 r10, odecli_i64 r11,
                                odecli_i64 r20, odecli_i64 r21, REAL s0, REAL s1, REAL s2)
{
    const odecli_i64 NX = nx + 4, per = NX + ny, t = FLAT(block, thread);
    if (t >= B * C * per)
        return;
    const odecli_i64 k = t % per, c = (t / per) % C, b = t / (C * per);
    REAL *plane = f + (b * C + c) * (ny + 4) * NX;
    if (k < NX) {
        if (surface && k >= 2 && k < nx + 2) {
            const odecli_i64 ra = c == 0 ? r00 : c == 1 ? r10 : r20;
            const odecli_i64 rb = c == 0 ? r01 : c == 1 ? r11 : r21;
            const REAL sign = c == 0 ? s0 : c == 1 ? s1 : s2;
            plane[ra * NX + k] = plane[ra * NX + k] + plane[k] * sign;
            plane[rb * NX + k] = plane[rb * NX + k] + plane[NX + k] * sign;
        }
        plane[k] = 0;
        plane[NX + k] = 0;
        plane[(ny + 2) * NX + k] = 0;
        plane[(ny + 3) * NX + k] = 0;
    } else {
        REAL *row = plane + (k - NX + 2) * NX;
        row[0] = 0;
        row[1] = 0;
        row[nx + 2] = 0;
        row[nx + 3] = 0;
    }
}

/* The point sources of one step: thread b adds, in the given order, values[k] at f[at[k]] for
 * shot b's entries ptr[b] .. ptr[b+1] (at: flat indices into the B-shot field), once per
 * channel ch < channels at f[at[k] + ch * plane] (an explosive source: syy, then sxx), as the
 * reference's index_put_ with accumulate does; shots never share a cell. */
DEVICE void elastic_source_thread(odecli_i64 block, odecli_i64 thread, odecli_i64 B,
                                  odecli_i64 plane, odecli_i64 channels, REAL *f,
                                  const odecli_i64 *ptr, const odecli_i64 *at, const REAL *values)
{
    const odecli_i64 b = FLAT(block, thread);
    if (b >= B)
        return;
    for (odecli_i64 ch = 0; ch < channels; ++ch)
        for (odecli_i64 k = ptr[b]; k < ptr[b + 1]; ++k)
            f[at[k] + ch * plane] = f[at[k] + ch * plane] + values[k];
}

/* The receivers of step `step`: entry e records v[at[e]] (kind 0) or the pressure
 * -(syy + sxx) / 2 at s[at[e]] (kind 1) into traces[slot[e] * steps + step], traces being
 * (shots, receivers, steps). */
DEVICE void elastic_receiver_thread(odecli_i64 block, odecli_i64 thread, odecli_i64 n,
                                    odecli_i64 plane, const REAL *v, const REAL *s,
                                    const odecli_i64 *at, const odecli_i64 *kind,
                                    const odecli_i64 *slot, REAL *traces, odecli_i64 steps,
                                    odecli_i64 step)
{
    const odecli_i64 e = FLAT(block, thread);
    if (e >= n)
        return;
    const REAL value = kind[e] ? (REAL)(-0.5) * (s[at[e]] + s[at[e] + plane]) : v[at[e]];
    traces[slot[e] * steps + step] = value;
}

/* The adjoint of the receivers at step `step`: each unique target cell u (in lv for target
 * kind 0, ls for 1, at flat index at[u]) adds, in the entries' order ptr[u] .. ptr[u+1],
 * g[src[e] * steps + step] * coef[e] (coef 1 for a velocity, -1/2 on each normal stress for a
 * pressure), g being the traces' adjoints (shots, receivers, steps): as index_add_ adds them,
 * and no two threads share a cell. */
DEVICE void elastic_receiver_adjoint_thread(odecli_i64 block, odecli_i64 thread, odecli_i64 n,
                                            REAL *lv, REAL *ls, const odecli_i64 *at,
                                            const odecli_i64 *which, const odecli_i64 *ptr,
                                            const odecli_i64 *src, const REAL *coef,
                                            const REAL *g, odecli_i64 steps, odecli_i64 step)
{
    const odecli_i64 u = FLAT(block, thread);
    if (u >= n)
        return;
    REAL *f = (which[u] ? ls : lv) + at[u];
    REAL value = *f;
    for (odecli_i64 e = ptr[u]; e < ptr[u + 1]; ++e)
        value = value + g[src[e] * steps + step] * coef[e];
    *f = value;
}

/* The point forces' part of a buoyancy gradient at step `step` (the force is dt b amp w /
 * (dy dx)): each unique source cell u (flat index at[u] into the (ny, nx) gradient) adds, in
 * the sources' order ptr[u] .. ptr[u+1], values[e] * lv[lam_at[e]] (values: the step's row of
 * amp * (w * dt / (dy dx)), lv the adjoint velocities after the step), as index_put_ with
 * accumulate does. */
DEVICE void elastic_source_gradient_thread(odecli_i64 block, odecli_i64 thread, odecli_i64 n,
                                           REAL *grad, const odecli_i64 *at,
                                           const odecli_i64 *ptr, const odecli_i64 *lam_at,
                                           const REAL *values, const REAL *lv)
{
    const odecli_i64 u = FLAT(block, thread);
    if (u >= n)
        return;
    REAL value = grad[at[u]];
    for (odecli_i64 e = ptr[u]; e < ptr[u + 1]; ++e)
        value = value + values[e] * lv[lam_at[e]];
    grad[at[u]] = value;
}
