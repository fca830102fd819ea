/* The adjoint of elastic_materials (elastic_run.c; reference.materials), included at the end
 * of elastic.c, for
 * odecli/pde/elastic/materials_grad.py: from the adjoints of the staggered parameters (ny, nx)
 * each (NULL: none) and of the free surface's row (nx), the gradient of (vp, vs, rho) with
 * their one-cell ring, (3, ny + 2, nx + 2), every entry written once.
 *
 * Each ringed node (I, J) gathers from the outputs that read it: output (i, j) reads the node
 * (i + 1 + oy, j + 1 + ox) with (oy, ox) = (0, 0) for all, (1, 0) for by and mu_xy, (0, 1) for
 * bx and mu_xy, (1, 1) for mu_xy.  With mu = rho vs^2, lam2mu = rho vp^2, b = 1 / rho,
 * lam = lam2mu - 2 mu, and on row 0 surface = lam2mu - lam^2 / lam2mu:
 *   g_l2m(i, j) = g_lam2mu + g_lam (+ on row 0: g_s (1 + r^2) - 2 r g_s, r = lam / lam2mu)
 *   g_mu(I, J)  = -2 g_lam(i, j) (+ on row 0: 4 r g_s) + mu_xy's four quarters
 *   g_b(I, J)   = by's and bx's two halves each
 *   g_vp = 2 rho vp g_l2m, g_vs = 2 rho vs g_mu, g_rho = vp^2 g_l2m + vs^2 g_mu - g_b / rho^2.
 * Why C: the same in torch took ~25 full-plane operations, 46-66 ms at 1040^2 float64 (this:
 * 20 ms with its output and the edges' fold). */

#include <stddef.h>

#define DEFINE_MATERIALS_ADJOINT(real, sfx)                                                        \
static inline real at_##sfx(const real *restrict g, long ny, long nx, long i, long j)            \
{                                                                                                  \
    return (g != NULL && i >= 0 && i < ny && j >= 0 && j < nx) ? g[i * nx + j] : (real)0;         \
}                                                                                                  \
                                                                                                   \
void elastic_materials_adjoint_##sfx(long ny, long nx, const real *restrict p,                    \
                                     const real *restrict g_by, const real *restrict g_bx,         \
                                     const real *restrict g_lam2mu, const real *restrict g_lam,    \
                                     const real *restrict g_muxy, const real *restrict g_surface,  \
                                     real *restrict out)                                           \
{                                                                                                  \
    const long W = nx + 2, P = (ny + 2) * W;                                                       \
    const real *restrict vp = p, *restrict vs = p + P, *restrict rho = p + 2 * P;                  \
    for (long I = 0; I < ny + 2; I++)                                                              \
        for (long J = 0; J < W; J++) {                                                             \
            const long c = I * W + J, i = I - 1, j = J - 1;                                        \
            const int inside = i >= 0 && i < ny && j >= 0 && j < nx;                               \
            real g_l2m = 0, g_mu = 0;                                                              \
            if (inside) {                                                                          \
                const real gl = at_##sfx(g_lam, ny, nx, i, j);                                     \
                g_l2m = at_##sfx(g_lam2mu, ny, nx, i, j) + gl;                                     \
                g_mu = (real)-2 * gl;                                                              \
                if (i == 0 && g_surface != NULL) {                                                 \
                    const real l2m = rho[c] * (vp[c] * vp[c]);                                     \
                    const real r = (l2m - (real)2 * (rho[c] * (vs[c] * vs[c]))) / l2m;             \
                    const real gs = g_surface[j], g_lam0 = gs * ((real)-2 * r);                    \
                    g_l2m += gs * ((real)1 + r * r) + g_lam0;                                      \
                    g_mu += (real)-2 * g_lam0;                                                     \
                }                                                                                  \
            }                                                                                      \
            g_mu += (real)0.25 * ((at_##sfx(g_muxy, ny, nx, i, j) + at_##sfx(g_muxy, ny, nx, i - 1, j)) \
                                  + (at_##sfx(g_muxy, ny, nx, i, j - 1)                            \
                                     + at_##sfx(g_muxy, ny, nx, i - 1, j - 1)));                  \
            const real g_b = (real)0.5 * ((at_##sfx(g_by, ny, nx, i, j) + at_##sfx(g_by, ny, nx, i - 1, j)) \
                                          + (at_##sfx(g_bx, ny, nx, i, j)                          \
                                             + at_##sfx(g_bx, ny, nx, i, j - 1)));                \
            const real r_ = rho[c];                                                                \
            out[c] = (real)2 * r_ * vp[c] * g_l2m;                                                 \
            out[P + c] = (real)2 * r_ * vs[c] * g_mu;                                              \
            out[2 * P + c] = vp[c] * vp[c] * g_l2m + vs[c] * vs[c] * g_mu - g_b / (r_ * r_);       \
        }                                                                                          \
}

DEFINE_MATERIALS_ADJOINT(double, f64)
DEFINE_MATERIALS_ADJOINT(float, f32)
