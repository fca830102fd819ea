/* Several elastic steps of one shot in one pass over the rows (temporal blocking), for one rank
 * (no halo exchange), with or without a free surface.  Included from elastic.c: it runs its row
 * functions (velocity_row_*, stress_row_*, *_pml_row_*, through velocity_mapped_* and
 * stress_mapped_* below) and elastic_stress_* for the free-surface row, so every point's
 * operations, and therefore the bits, are the single steps'.
 *
 * Why: a step moves about 15 array passes through memory (v and s read and written, the five
 * parameters read); here each row of v, s, psi and the parameters is brought into cache once
 * per pass of n steps, and step j works RUN_LAG rows behind step j - 1, on rows that step j - 1
 * has just left in cache (the acoustic engine's leapfrog_forward_run).  The step then runs at
 * the speed of its arithmetic (forward_pass.py has the measurements).
 *
 * Row iteration q, step j (j ascending inside an iteration) takes row i = q - j * RUN_LAG:
 * velocity row i (if i < ny), the point forces on it, its vy/vx receivers; then stress row
 * i - 2 (if i >= 2), the explosive sources on it, its pressure receivers: stress row r once
 * velocity rows up to r + 2 are done, which its stencil reads.  Fields are updated in place.
 * Why RUN_LAG = 4 is enough: at iteration q step j - 1 has finished velocity rows <= q - (j-1) L and stress rows
 * <= q - (j-1) L - 2 (L = RUN_LAG).  Step j's velocity row i = q - j L reads stress rows
 * i - 2 .. i + 2 of step j - 1, all made if i + 2 <= q - (j-1) L - 2, i.e. L >= 4; and it
 * overwrites velocity row i, which step j - 1's stress rows i - 2 .. i + 2 read: also made by
 * then.  Step j's stress row i - 2 reads velocity rows i - 4 .. i of step j (made) and
 * overwrites stress row i - 2, which only step j's velocity rows i - 4 .. i read (made) and
 * which step j - 1 wrote long before.  Step j + 1 works further behind and reads what step j
 * has finished, by the same argument.  Memory variables and stores are per row and per step.
 * The ghost ring (width 2) is 0 and never written, but for the free surface's images below.
 *
 * Sources and receivers, per block row (CSR: ptr has ny + 1 offsets by block row, at the flat
 * indices into the shot's ringed fields, stable-sorted by row, idx the value's or trace's
 * column): the point forces (src_on_stress 0: at into v) get src_val[j * src_stride + idx]
 * right after their velocity row; the explosive sources (src_on_stress 1: at into s, the syy
 * point; sxx is one plane on) add it to syy and sxx after their stress row, as the per-step
 * path's index_put_ does after the half step, in source order.  Velocity receivers read
 * v[at] after the row's forces, pressure receivers -0.5 * (syy + sxx) after the row's sources,
 * into traces[j * rec_stride + slot]: the values the time loop reads after the whole step,
 * which no later row of step j changes.
 *
 * psi_y, ymap, ypl, psi_x, xpl, xs, xshift: where the memory variables lie (velocity_mapped_*);
 * with a free surface, the kernels' (8, ny, nx) layout.
 *
 * surface (else NULL, no free surface): the free-surface coefficient of elastic_stress_*, whose
 * top stress row it makes; the images (vimage, simage: two ringed rows per plane; vsign, ssign:
 * a sign per plane) are then written into the top ring rows: the velocities' once the step's
 * velocity rows they read (with their forces) are made, before its stress row 0 reads them;
 * the stresses' once its stress rows they read are made (row 2, at iteration 4 j + 4), before
 * the next step's velocity row 0 (same iteration, later in it), and by the call of the first
 * steps before its first iteration (from the stresses the pass starts from).  Ring rows of a
 * step's image are read by nothing of the step before, which finished its top rows RUN_LAG
 * iterations earlier.
 *
 * vstore, sstore (else NULL): n pointers to each step's stores, (2, ny, nx) and (3, ny, nx),
 * written by the row kernels as in the single steps.  compact (no free surface): the compact
 * stores instead (forward_pass.CompactStores): vstore[j] gets the step's new velocity rows,
 * ringed (2, ny + 4, nx + 4), once their forces are added; sstore[j] the stress rows' corrected
 * derivatives in the CPML layers only, where smap and sy (the y layers' rows) put them
 * (elastic_adjoint_run.c reads them back).
 *
 * Threads: a call makes steps j0 .. j1 - 1 of the n; calls for consecutive step ranges run at
 * once, each publishing in *done the last row iteration it has finished and waiting before
 * iteration q until the call for the steps before it (*ahead) has finished q.  The steps then
 * read and write every row in the one-thread order: bit for bit the one-thread result.  The
 * earlier call, running ahead, writes only rows past those the later one touches (rows at
 * least RUN_LAG - 1 = 3 beyond its own stencils, by the argument above).  done, ahead: NULL
 * for a call alone. */
#include <sched.h>
#include <stdint.h>
#include <string.h>

#define RUN_LAG 4 /* rows each step of elastic_run_rows runs behind the step before it */
/* The compact stores' velocity rows copied with streaming (non-temporal) writes, which skip
 * reading each destination line into cache first (the stores are read back by the adjoint,
 * after many other rows): a gradient at 1040^2, 100 steps, one thread, process CPU time, best
 * of 4 alternating runs, 1.497 -> 1.424 s (float32) and 2.909 -> 2.825 s (float64) with the
 * scaled adjoint.  The caller fences once at the end of its pass (_mm_sfence). */
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
static inline void stream_copy(void *dst, const void *src, long nbytes)
{
#if defined(__AVX512F__)
    char *d = dst; const char *s = src;
    long head = (64 - ((uintptr_t)d & 63)) & 63;
    if (head > nbytes) head = nbytes;
    memcpy(d, s, head); d += head; s += head; nbytes -= head;
    for (; nbytes >= 64; nbytes -= 64, d += 64, s += 64)
        _mm512_stream_si512((__m512i *)d, _mm512_loadu_si512((const void *)s));
    memcpy(d, s, nbytes);
#else
    memcpy(dst, src, nbytes);
#endif
}
#if defined(__AVX512F__)
#define STREAM_FENCE() _mm_sfence()
#else
#define STREAM_FENCE() ((void)0)
#endif

/* elastic_velocity_* and elastic_stress_* (without the free-surface row) on row i, with the
 * memory variables where psi_y / psi_x put them: plane k of a row of the y layers (ayh or ayi
 * not 0) at psi_y + k * ypl + ymap[i] * nx, of another row (x layers only) at
 * psi_x + k * xpl + i * xs, its columns [0, jlo) there from 0 and [jhi, nx) from jhi - xshift.
 * With psi_y = psi_x = psi, ymap[i] = i, ypl = xpl = ny nx, xs = nx and xshift = 0 that is
 * the kernels' (8, ny, nx) layout; a forward without a graph keeps only the layers' rows and
 * columns (forward_pass.py).  The same row functions on the same parts: the same bits. */
#define DEFINE_MAPPED(real, sfx)                                                                   \
static void velocity_mapped_##sfx(long ny, long nx, long i, real *v, const real *s, real *psi_y,  \
                                  const int64_t *ymap, long ypl, real *psi_x, long xpl, long xs,   \
                                  long xshift, const real *buy, const real *bux, real *store,      \
                                  const real *ayi, const real *byi, const real *ayh,              \
                                  const real *byh, const real *axi, const real *bxi,              \
                                  const real *axh, const real *bxh, real dt, real idy, real idx,  \
                                  long jlo, long jhi)                                              \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX, pp = ny * nx;                                   \
    real *vy = v, *vx = v + plane;                                                                 \
    const real *syy = s, *sxx = s + plane, *sxy = s + 2 * plane;                                   \
    const long R0 = (i + 2) * NX + 2, P0 = i * nx;                                                 \
    real *st0 = store ? store + P0 : NULL, *st1 = store ? store + pp + P0 : NULL;                  \
    const int ypml = ayh[i] != 0 || ayi[i] != 0;                                                   \
    const long a = (ypml || jhi <= jlo) ? nx : jlo, b = (ypml || jhi <= jlo) ? nx : jhi;          \
    const long kp = ypml ? ypl : xpl;                                                              \
    for (int part = 0; part < 3; part++) {                                                         \
        const long j0 = part == 0 ? 0 : part == 1 ? a : b, j1 = part == 0 ? a : part == 1 ? b : nx; \
        if (j1 <= j0) continue;                                                                    \
        if (part == 1) {                                                                           \
            velocity_row_##sfx(j1 - j0, NX, vy + R0 + j0, vx + R0 + j0, syy + R0 + j0,             \
                               sxx + R0 + j0, sxy + R0 + j0, buy + P0 + j0, bux + P0 + j0,         \
                               st0 ? st0 + j0 : NULL, st1 ? st1 + j0 : NULL, dt, idy, idx);       \
            continue;                                                                              \
        }                                                                                          \
        real *p = ypml ? psi_y + ymap[i] * nx + j0                                                 \
                       : psi_x + i * xs + (part == 0 ? j0 : j0 - xshift);                          \
        velocity_pml_row_##sfx(j1 - j0, NX, vy + R0 + j0, vx + R0 + j0, syy + R0 + j0,             \
                               sxx + R0 + j0, sxy + R0 + j0, buy + P0 + j0, bux + P0 + j0,         \
                               st0 ? st0 + j0 : NULL, st1 ? st1 + j0 : NULL,                       \
                               p, p + kp, p + 2 * kp, p + 3 * kp,                                  \
                               axi + j0, bxi + j0, axh + j0, bxh + j0,                             \
                               ayh[i], byh[i], ayi[i], byi[i], ypml, dt, idy, idx);                \
    }                                                                                              \
}                                                                                                  \
static void stress_mapped_##sfx(long ny, long nx, long i, const real *v, real *s, real *psi_y,    \
                                const int64_t *ymap, long ypl, real *psi_x, long xpl, long xs,     \
                                long xshift, const real *lam2mu, const real *lam,                  \
                                const real *muxy, real *store, const real *ayi, const real *byi,  \
                                const real *ayh, const real *byh, const real *axi,                \
                                const real *bxi, const real *axh, const real *bxh, real dt,       \
                                real idy, real idx, long jlo, long jhi, real *cstore,             \
                                const int64_t *smap, long sy)                                      \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX, pp = ny * nx;                                   \
    const real *vy = v, *vx = v + plane;                                                           \
    real *syy = s, *sxx = s + plane, *sxy = s + 2 * plane;                                         \
    const long R0 = (i + 2) * NX + 2, P0 = i * nx;                                                 \
    real *st0 = store ? store + P0 : NULL, *st1 = store ? store + pp + P0 : NULL;                  \
    real *st2 = store ? store + 2 * pp + P0 : NULL;                                                \
    const int ypml = ayh[i] != 0 || ayi[i] != 0;                                                   \
    const long a = (ypml || jhi <= jlo) ? nx : jlo, b = (ypml || jhi <= jlo) ? nx : jhi;          \
    const long kp = ypml ? ypl : xpl;                                                              \
    for (int part = 0; part < 3; part++) {                                                         \
        const long j0 = part == 0 ? 0 : part == 1 ? a : b, j1 = part == 0 ? a : part == 1 ? b : nx; \
        if (j1 <= j0) continue;                                                                    \
        if (part == 1) {                                                                           \
            stress_row_##sfx(j1 - j0, NX, vy + R0 + j0, vx + R0 + j0, syy + R0 + j0,               \
                             sxx + R0 + j0, sxy + R0 + j0, lam2mu + P0 + j0, lam + P0 + j0,        \
                             muxy + P0 + j0, st0 ? st0 + j0 : NULL, st1 ? st1 + j0 : NULL,         \
                             st2 ? st2 + j0 : NULL, dt, idy, idx);                                 \
            continue;                                                                              \
        }                                                                                          \
        real *p = (ypml ? psi_y + ymap[i] * nx + j0                                                \
                        : psi_x + i * xs + (part == 0 ? j0 : j0 - xshift)) + 4 * kp;               \
        real *cs0 = st0 ? st0 + j0 : NULL, *cs1 = st1 ? st1 + j0 : NULL;                          \
        real *cs2 = st2 ? st2 + j0 : NULL;                                                         \
        if (cstore) { /* the compact store: the layers' corrected derivatives only */             \
            const long cols = jlo + nx - jhi, ck = ypml ? sy * nx : ny * cols;                     \
            cs0 = ypml ? cstore + smap[i] * nx + j0                                                \
                       : cstore + 3 * sy * nx + i * cols + (part == 0 ? j0 : j0 - (jhi - jlo));    \
            cs1 = cs0 + ck; cs2 = cs0 + 2 * ck;                                                    \
        }                                                                                          \
        stress_pml_row_##sfx(j1 - j0, NX, vy + R0 + j0, vx + R0 + j0, syy + R0 + j0,               \
                             sxx + R0 + j0, sxy + R0 + j0, lam2mu + P0 + j0, lam + P0 + j0,        \
                             muxy + P0 + j0, cs0, cs1, cs2, p, p + kp, p + 2 * kp, p + 3 * kp,     \
                             axi + j0, bxi + j0, axh + j0, bxh + j0,                               \
                             ayh[i], byh[i], ayi[i], byi[i], ypml, dt, idy, idx);                  \
    }                                                                                              \
}

DEFINE_MAPPED(double, f64)
DEFINE_MAPPED(float, f32)

/* The free surface's image (reference.mirror_top): the two top ring rows of each of the C
 * planes of f, sign * (ringed rows image[2c], image[2c + 1]) of the plane, ring columns too. */
#define MIRROR_TOP(f, C, image, sign)                                                              \
    for (int c = 0; c < (C); c++)                                                                  \
        for (int g = 0; g < 2; g++) {                                                              \
            __typeof__((f)[0]) *to = (f) + c * plane + g * NX;                                     \
            const __typeof__((f)[0]) *from = (f) + c * plane + (image)[2 * c + g] * NX;            \
            for (long k = 0; k < NX; k++) to[k] = from[k] * (sign)[c];                             \
        }

#define DEFINE_RUN(real, sfx)                                                                      \
void elastic_run_rows_##sfx(long ny, long nx, long n, long j0, long j1, int64_t *done,           \
                            const int64_t *ahead, real *v, real *s, real *psi_y,                  \
                            const int64_t *ymap, long ypl, real *psi_x, long xpl, long xs,         \
                            long xshift,                                                           \
                            const real *buy, const real *bux, const real *lam2mu,                 \
                            const real *lam, const real *muxy, real *const *vstore,               \
                            real *const *sstore,                                                   \
                            const real *ayi, const real *byi, const real *ayh, const real *byh,   \
                            const real *axi, const real *bxi, const real *axh, const real *bxh,   \
                            real dt, real idy, real idx, long jlo, long jhi,                       \
                            const int64_t *src_ptr, const int64_t *src_at,                         \
                            const int64_t *src_idx, const real *src_val, long src_stride,          \
                            int src_on_stress,                                                     \
                            const int64_t *vrec_ptr, const int64_t *vrec_at,                       \
                            const int64_t *vrec_slot, const int64_t *prec_ptr,                     \
                            const int64_t *prec_at, const int64_t *prec_slot, real *traces,        \
                            long rec_stride, const real *surface, const int64_t *vimage,           \
                            const real *vsign, const int64_t *simage, const real *ssign,           \
                            int compact, const int64_t *smap, long sy)                             \
{                                                                                                  \
    const long NX = nx + 4, plane = (ny + 4) * NX;                                                 \
    long vlast = 0, slast = 0; /* the last block row each image reads */                          \
    for (int c = 0; surface && c < 6; c++) {                                                       \
        if (c < 4 && vimage[c] - 2 > vlast) vlast = vimage[c] - 2;                                 \
        if (simage[c] - 2 > slast) slast = simage[c] - 2;                                          \
    }                                                                                              \
    const unsigned fp_mode = elastic_flush_subnormals(); /* subnormals.c */                       \
    if (surface && j0 == 0) /* the stresses' image before the first step's velocity rows */       \
        MIRROR_TOP(s, 3, simage, ssign);                                                           \
    for (long q = 0; q < ny + 2 + (n - 1) * RUN_LAG; q++) {                                        \
        if (ahead) /* wait for the steps before this call's to finish row iteration q */          \
            for (long spins = 0; __atomic_load_n(ahead, __ATOMIC_ACQUIRE) < q; spins++)            \
                if (spins > 256) sched_yield();                                                    \
        for (long j = j0; j < j1; j++) {                                                           \
            const long i = q - j * RUN_LAG;                                                        \
            if (i < 0 || i >= ny + 2)                                                              \
                continue;                                                                          \
            const real *sv = src_val ? src_val + j * src_stride : NULL;                            \
            real *tr = traces ? traces + j * rec_stride : NULL;                                    \
            if (i < ny) {                                                                          \
                velocity_mapped_##sfx(ny, nx, i, v, s, psi_y, ymap, ypl, psi_x, xpl, xs, xshift,  \
                                      buy, bux, vstore && !compact ? vstore[j] : NULL, ayi, byi,  \
                                      ayh, byh,                                                    \
                                      axi, bxi, axh, bxh, dt, idy, idx, jlo, jhi);                 \
                if (src_ptr && !src_on_stress)                                                     \
                    for (long k = src_ptr[i]; k < src_ptr[i + 1]; k++)                             \
                        v[src_at[k]] = v[src_at[k]] + sv[src_idx[k]];                              \
                if (compact) /* the compact store: the new velocities' row, ringed layout */     \
                    for (int c = 0; c < 2; c++) {                                                  \
                        const long at = c * plane + (i + 2) * NX + 2;                              \
                        stream_copy(vstore[j] + at, v + at, nx * sizeof(real));                    \
                    }                                                                              \
                if (vrec_ptr)                                                                      \
                    for (long k = vrec_ptr[i]; k < vrec_ptr[i + 1]; k++)                           \
                        tr[vrec_slot[k]] = v[vrec_at[k]];                                          \
                if (surface && i == vlast) /* the rows the image reads are this step's */          \
                    MIRROR_TOP(v, 2, vimage, vsign);                                               \
            }                                                                                      \
            const long r = i - 2;                                                                  \
            if (r >= 0) {                                                                          \
                if (surface && r == 0) /* the free-surface row: psi in the kernels' layout */ \
                    elastic_stress_##sfx(ny, nx, 0, 1, v, s, psi_y, lam2mu, lam, muxy,            \
                                         sstore ? sstore[j] : NULL, surface, ayi, byi, ayh, byh,   \
                                         axi, bxi, axh, bxh, dt, idy, idx, jlo, jhi);              \
                else                                                                               \
                    stress_mapped_##sfx(ny, nx, r, v, s, psi_y, ymap, ypl, psi_x, xpl, xs, xshift, \
                                        lam2mu, lam, muxy, sstore && !compact ? sstore[j] : NULL,  \
                                        ayi, byi, ayh, byh, axi, bxi, axh, bxh, dt, idy, idx, jlo, \
                                        jhi, compact ? sstore[j] : NULL, smap, sy);                \
                if (src_ptr && src_on_stress) {                                                    \
                    for (long k = src_ptr[r]; k < src_ptr[r + 1]; k++)                             \
                        s[src_at[k]] = s[src_at[k]] + sv[src_idx[k]];                              \
                    for (long k = src_ptr[r]; k < src_ptr[r + 1]; k++)                             \
                        s[plane + src_at[k]] = s[plane + src_at[k]] + sv[src_idx[k]];              \
                }                                                                                  \
                if (prec_ptr)                                                                      \
                    for (long k = prec_ptr[r]; k < prec_ptr[r + 1]; k++)                           \
                        tr[prec_slot[k]] = (real)-0.5 * (s[prec_at[k]] + s[plane + prec_at[k]]);   \
                if (surface && r == slast)                                                         \
                    MIRROR_TOP(s, 3, simage, ssign);                                               \
            }                                                                                      \
        }                                                                                          \
        if (done)                                                                                  \
            __atomic_store_n(done, q, __ATOMIC_RELEASE);                                           \
    }                                                                                              \
    STREAM_FENCE();                                                                                \
    elastic_restore_fp_mode(fp_mode);                                                              \
}

DEFINE_RUN(double, f64)
DEFINE_RUN(float, f32)

/* reference.materials without its dozen full-size temporaries, for a forward without a graph:
 * from (vp, vs, rho) (3, ny + 2, nx + 2) with their one-cell ring, the staggered parameters
 * (ny, nx) each, every number by the same operations in the same order (so the same bits):
 * mu = rho (vs vs), lam2mu = rho (vp vp), b = 1 / rho, by = 0.5 (b + b below), bx = 0.5 (b + b
 * right), lam = lam2mu - 2 mu, mu_xy = 0.25 ((mu + mu below) + (mu right + mu below right)). */
#define DEFINE_MATERIALS(real, sfx)                                                                \
void elastic_materials_##sfx(long ny, long nx, const real *restrict p, real *restrict by,       \
                             real *restrict bx, real *restrict lam2mu, real *restrict lam,         \
                             real *restrict muxy)                                                  \
{                                                                                                  \
    const long W = nx + 2, P = (ny + 2) * W;                                                       \
    const real *restrict vp = p, *restrict vs = p + P, *restrict rho = p + 2 * P;                  \
    for (long i = 0; i < ny; i++)                                                                  \
        for (long j = 0; j < nx; j++) {                                                            \
            const long c = (i + 1) * W + j + 1, o = i * nx + j;                                    \
            const real mu = rho[c] * (vs[c] * vs[c]), mu_d = rho[c + W] * (vs[c + W] * vs[c + W]); \
            const real mu_r = rho[c + 1] * (vs[c + 1] * vs[c + 1]);                                \
            const real mu_dr = rho[c + W + 1] * (vs[c + W + 1] * vs[c + W + 1]);                   \
            const real l2m = rho[c] * (vp[c] * vp[c]), b = (real)1 / rho[c];                       \
            lam2mu[o] = l2m;                                                                       \
            lam[o] = l2m - (real)2 * mu;                                                           \
            by[o] = (real)0.5 * (b + (real)1 / rho[c + W]);                                        \
            bx[o] = (real)0.5 * (b + (real)1 / rho[c + 1]);                                        \
            muxy[o] = (real)0.25 * ((mu + mu_d) + (mu_r + mu_dr));                                 \
        }                                                                                          \
}

DEFINE_MATERIALS(double, f64)
DEFINE_MATERIALS(float, f32)
